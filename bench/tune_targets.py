"""`aotc tune`'s targets, side by side: for each model, the unbatched p50 of the default export at the given
concurrency, then `aotc tune` with a p99 budget of 2x that p50, whose last round measures the winner and the
default configuration (the default export with the server's defaults) together, and the most any configuration
could reach on this machine (bench/serving_bound.py: the model alone in aotc-run, and on CPU the CPU time that
requests to a model with no compute cost). Prints a markdown table of these and their ratios to the default.
`--budget-min 0` skips the search: the default configuration (served alone, 5 s) against the bound.
  python bench/tune_targets.py [--model models/mlp.py --model models/bert.py] [--device cpu] [--concurrency 32]
      [--budget-min 6] [--floor-model models/simple.py] [--no-bound] [--out FILE]
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
from aotc.tune import TuneOptions, _Server, export_variants, load, sample_body, tune, variants
from serving_bound import bound, model_alone, requests_alone


def export_default(spec: str, device: str, dtype: str, tmp: str, name: str = "default") -> str:
    pkg = os.path.join(tmp, f"{name}.pt2")
    pipeline.run_export(spec, pipeline.ExportOptions(device=device, dtype=dtype, out=pkg, quiet=True))
    return pkg


def serve_default(pkg: str, config: dict | None, concurrency: int, tmp: str, name: str, seconds: float = 5.0) -> dict:
    """aotc-load's numbers for the default export served alone with `config` (None: the server's defaults, as
    tune's default candidate) at `concurrency`, from a repository tmp/repo_<name>."""
    body = os.path.join(tmp, "body")
    headers = sample_body(pkg, 1, body)
    server = _Server(os.path.join(tmp, f"repo_{name}"), {"m": (pkg, config)}, [])
    try:
        return load(server.port, "m", body, headers, concurrency, seconds)
    finally:
        server.stop()


def search(spec: str, budget: float, args, tmp: str) -> tuple[dict | None, dict, dict | None]:
    """`aotc tune` within `budget` ms: (the winner's candidate or None, the default's, `aotc serve`'s)."""
    out = os.path.join(tmp, "tuned")
    rc = tune(TuneOptions(spec=spec, p99_ms=budget, concurrency=(args.concurrency,), device=args.device,
                          dtype=args.dtype, budget_min=args.budget_min, out=out,
                          variants=args.variants.split(",") if args.variants else None),
              lambda line: print("  " + line, flush=True))
    info = json.loads(Path(out, "tune.json").read_text())
    last = max(c["round"] for c in info["candidates"])
    final = [c for c in info["candidates"] if c["round"] == last]
    winner = next((c for c in final if c["label"] == info["winner"]), None) if rc == 0 else None
    default = next(c for c in info["candidates"] if c["variant"] == "default" and c["config"] is None)
    return winner, default, info.get("served")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--budget-min", type=float, default=6.0,
                    help="aotc tune's search time per model; 0: no search, the default configuration and the bound")
    ap.add_argument("--variants", help="aotc tune --variants (default: all)")
    ap.add_argument("--floor-model", default="models/simple.py",
                    help="the model with no compute whose requests' CPU time bounds the throughput on CPU")
    ap.add_argument("--no-bound", action="store_true", help="skip the ceilings (serving_bound.py)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.budget_min < 0:
        ap.error(f"--budget-min takes minutes (0: no search), got {args.budget_min:g}")
    models = args.model or ["models/mlp.py", "models/bert.py"]
    rows = []
    floor = None
    if not args.no_bound:
        with tempfile.TemporaryDirectory() as tmp:
            floor_pkg = export_default(args.floor_model, args.device, "fp32", tmp, "floor")
            floor = requests_alone(floor_pkg, args.concurrency, tmp)
        print(f"{args.floor_model} with the server's defaults at concurrency {args.concurrency}: "
              f"{floor['req_per_s']:.0f} req/s, {floor['cpu_us_per_req']:.1f} us of CPU per request", flush=True)
    for spec in models:
        with tempfile.TemporaryDirectory() as tmp:
            pkg = export_default(spec, args.device, args.dtype, tmp)
            p50 = serve_default(pkg, {"max_batch_size": 0}, args.concurrency, tmp, "unbatched")["p50_ms"]
            budget = 2 * p50
            print(f"{spec}: unbatched p50 {p50:.2f} ms at concurrency {args.concurrency}; budget {budget:.2f} ms",
                  flush=True)
            if args.budget_min > 0:
                winner, default, served = search(spec, budget, args, tmp)
            else:  # no search: the default configuration alone, beside the bound
                r = serve_default(pkg, None, args.concurrency, tmp, "default")
                winner, served, default = None, None, {"per_concurrency": {str(args.concurrency): r}}
            alone = None
            if not args.no_bound:  # every variant tune exported, again through the export cache
                names = variants(args.device, None, args.variants.split(",") if args.variants else None)
                pkgs, _ = export_variants(spec, args.device, names, args.dtype, tmp, lambda line: None)
                alone = model_alone(pkgs, args.device, tmp, in_flight=args.concurrency)  # batch-1 requests
            ceiling = None if alone is None else bound(args.device, alone, floor)
            rows.append((spec, p50, budget, winner, default, served, alone, ceiling))
    n = str(args.concurrency)
    no_winner = "none met the budget" if args.budget_min > 0 else "not searched"
    lines = [f"`python bench/tune_targets.py {' '.join('--model ' + m for m in models)} --device {args.device} "
             f"--dtype {args.dtype} --concurrency {n} --budget-min {args.budget_min:g}"
             + (f" --variants {args.variants}" if args.variants else "") + "`",
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
             f"{os.cpu_count()} CPUs", "",
             "| model | unbatched p50 ms | budget ms | default req/s | default p99 ms | winner | winner req/s | "
             "winner p99 ms | winner / default | `aotc serve` of the entry req/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for spec, p50, budget, w, d, served, _, _ in rows:
        dr, wr = d["per_concurrency"][n], (w or {}).get("per_concurrency", {}).get(n)
        sv = (served or {}).get("per_concurrency", {}).get(n)
        lines.append(f"| {spec} | {p50:.2f} | {budget:.2f} | {dr['req_per_s']:.1f} | {dr['p99_ms']:.2f} | "
                     + (f"{w['label']} | {wr['req_per_s']:.1f} | {wr['p99_ms']:.2f} | "
                        f"{wr['req_per_s'] / dr['req_per_s']:.2f}x | "
                        + (f"{sv['req_per_s']:.1f} ({sv['req_per_s'] / wr['req_per_s']:.2f}x the winner's) |" if sv
                           else "not served |") if w
                        else no_winner + " | | | | |"))
    if floor:
        lines += ["", f"The most any configuration could reach here (bench/serving_bound.py): {args.floor_model} "
                  f"served at concurrency {n} took {floor['cpu_us_per_req']:.1f} us of CPU per request (server and "
                  f"client; {floor['req_per_s']:.0f} req/s).", "",
                  "| model | default req/s | model alone rows/s | model alone CPU us/row | bound req/s | "
                  "bound / default | winner / default |", "|---|---|---|---|---|---|---|"]
        for spec, _, _, w, d, _, alone, ceiling in rows:
            dr = d["per_concurrency"][n]["req_per_s"]
            wr = (w or {}).get("per_concurrency", {}).get(n, {}).get("req_per_s")
            cpu = alone["cpu_us_per_row"]
            lines.append(f"| {spec} | {dr:.1f} | {alone['rows_per_s']:.0f} ({alone['label']}) | "
                         + (f"{cpu:.1f}" if cpu != float("inf") else "") + f" | {ceiling:.0f} | {ceiling / dr:.2f}x | "
                         + (f"{wr / dr:.2f}x |" if wr else no_winner + " |"))
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
