"""`aotc tune`'s targets, side by side: for each model, the unbatched p50 of the default export at the given
concurrency, then `aotc tune` with a p99 budget of 2x that p50, whose last round measures the winner and the
default configuration (the default export with the server's defaults) together. Prints a markdown table of
both and their ratio.
  python bench/tune_targets.py [--model models/mlp.py --model models/bert.py] [--device cpu] [--concurrency 32]
      [--budget-min 6] [--out FILE]
Exports go through `aotc export`'s cache. Not a test; asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

from aotc import pipeline
from aotc.tune import TuneOptions, _Server, load, sample_body, tune


def unbatched_p50(spec: str, device: str, dtype: str, concurrency: int, tmp: str) -> float:
    pkg = os.path.join(tmp, "default.pt2")
    pipeline.run_export(spec, pipeline.ExportOptions(device=device, dtype=dtype, out=pkg, quiet=True))
    body = os.path.join(tmp, "body")
    headers = sample_body(pkg, 1, body)
    server = _Server(os.path.join(tmp, "repo"), {"m": (pkg, {"max_batch_size": 0})}, [])
    try:
        return load(server.port, "m", body, headers, concurrency, 5.0)["p50_ms"]
    finally:
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--budget-min", type=float, default=6.0)
    ap.add_argument("--variants", help="aotc tune --variants (default: all)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    models = args.model or ["models/mlp.py", "models/bert.py"]
    rows = []
    for spec in models:
        with tempfile.TemporaryDirectory() as tmp:
            p50 = unbatched_p50(spec, args.device, args.dtype, args.concurrency, tmp)
            budget = 2 * p50
            print(f"{spec}: unbatched p50 {p50:.2f} ms at concurrency {args.concurrency}; budget {budget:.2f} ms",
                  flush=True)
            out = os.path.join(tmp, "tuned")
            rc = tune(TuneOptions(spec=spec, p99_ms=budget, concurrency=(args.concurrency,), device=args.device,
                                  dtype=args.dtype, budget_min=args.budget_min, out=out,
                                  variants=args.variants.split(",") if args.variants else None), lambda line: print("  " + line, flush=True))
            info = json.loads(Path(out, "tune.json").read_text())
            last = max(c["round"] for c in info["candidates"])
            final = [c for c in info["candidates"] if c["round"] == last]
            winner = next((c for c in final if c["label"] == info["winner"]), None) if rc == 0 else None
            default = next(c for c in info["candidates"] if c["variant"] == "default" and c["config"] is None)
            rows.append((spec, p50, budget, winner, default, info.get("served"), len(info["candidates"]), last))
    n = str(args.concurrency)
    lines = [f"`python bench/tune_targets.py {' '.join('--model ' + m for m in models)} --device {args.device} "
             f"--dtype {args.dtype} --concurrency {n} --budget-min {args.budget_min:g}"
             + (f" --variants {args.variants}" if args.variants else "") + "`",
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
             f"{os.cpu_count()} CPUs", "",
             "| model | unbatched p50 ms | budget ms | default req/s | default p99 ms | winner | winner req/s | "
             "winner p99 ms | winner / default | `aotc serve` of the entry req/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for spec, p50, budget, w, d, served, count, last in rows:
        dr, wr = d["per_concurrency"][n], (w or {}).get("per_concurrency", {}).get(n)
        sv = (served or {}).get("per_concurrency", {}).get(n)
        lines.append(f"| {spec} | {p50:.2f} | {budget:.2f} | {dr['req_per_s']:.1f} | {dr['p99_ms']:.2f} | "
                     + (f"{w['label']} | {wr['req_per_s']:.1f} | {wr['p99_ms']:.2f} | "
                        f"{wr['req_per_s'] / dr['req_per_s']:.2f}x | "
                        + (f"{sv['req_per_s']:.1f} ({sv['req_per_s'] / wr['req_per_s']:.2f}x the winner's) |" if sv
                           else "not served |") if w else "none met the budget | | | | |"))
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
