"""Dynamic batching against unbatched serving, side by side for one or more packages of the same model:
batch-1 requests (the package's first sample, first row) from `aotc-load` at one concurrency, each package
served twice by one aotc-server, batched (`max_batch_size` 64, `max_queue_delay_us` 200, `num_runners` 2, as
bench/gpu_models.py) and unbatched (`max_batch_size` 0, `num_runners` 2). The cells take turns in rounds, so
drifting load falls on all alike. Prints a markdown table of requests/s (median of rounds) and their ratio,
then, per batched package, the batches the scheduler formed (from the server's batch_stats: executions per
batch size and the mean model call at that size), which is where a ratio comes from.
  python bench/batching.py --package default=PKG --package buckets=PKG2 [--concurrency 32] [--seconds 4]
      [--rounds 2] [--out FILE]
aotc-server and aotc-load: as bench/launch.py's find_binary looks for them. Not a test;
asserts nothing. Single-input packages.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from launch import Server, make_repository
from loadgen import http_load, model_stats
from server_phases import first_sample

BATCHED = {"max_batch_size": 64, "max_queue_delay_us": 200, "num_runners": 2}
UNBATCHED = {"max_batch_size": 0, "num_runners": 2}


def label_and_path(text: str) -> tuple[str, Path]:
    label, sep, path = text.partition("=")
    if not sep or not label.isidentifier() or not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"expected LABEL=PACKAGE with LABEL a plain word and PACKAGE a file, "
                                         f"got '{text}'")
    return label, Path(path).resolve()


def batches(stats: dict) -> dict[int, tuple[int, float]]:
    """batch size -> (executions, total ns in the model call) from one /stats entry."""
    return {b["batch_size"]: (b["compute_infer"]["count"], b["compute_infer"]["ns"]) for b in stats["batch_stats"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", type=label_and_path, action="append", required=True, metavar="LABEL=PKG")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=4.0, help="per cell and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, help="also write the report here")
    args = ap.parse_args()
    pkgs = dict(args.package)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        samples = {label: first_sample(pkg) for label, pkg in pkgs.items()}
        models, configs = {}, {}
        for label, pkg in pkgs.items():
            for suffix, cfg in (("batched", BATCHED), ("unbatched", UNBATCHED)):
                models[f"{label}_{suffix}"], configs[f"{label}_{suffix}"] = pkg, cfg
        srv = Server("cpp", make_repository(tmp / "repo", models, configs, link=True))
        runs = {m: [] for m in models}
        try:
            before = {}
            for model in models:  # warm-up: graph capture at the sizes this load forms, first calls
                name, x = samples[model.rsplit("_", 1)[0]]
                http_load(srv.port, model, x[:1], name, args.concurrency, 1.0)
                before[model] = batches(model_stats(srv.port, model))
            for _ in range(args.rounds):
                for model in models:
                    name, x = samples[model.rsplit("_", 1)[0]]
                    runs[model].append(http_load(srv.port, model, x[:1], name, args.concurrency, args.seconds))
            after = {m: batches(model_stats(srv.port, m)) for m in models}
        finally:
            srv.stop()
    def each(rs):
        return ", ".join(f"{r['req_per_s']:.0f}" for r in rs)

    rows = ["| package | batched req/s | unbatched req/s | ratio | batched p50 ms | unbatched p50 ms | errors |",
            "|---|---|---|---|---|---|---|"]
    for label in pkgs:
        b, u = runs[f"{label}_batched"], runs[f"{label}_unbatched"]
        rb = statistics.median(r["req_per_s"] for r in b)
        ru = statistics.median(r["req_per_s"] for r in u)
        errors = sum(r["errors"] for r in b + u)
        rows.append(f"| {label} | {rb:.0f} ({each(b)}) | {ru:.0f} ({each(u)}) | **{rb / ru:.2f}x** | "
                    f"{statistics.median(r['p50_ms'] for r in b):.2f} | {statistics.median(r['p50_ms'] for r in u):.2f} | "
                    f"{errors} |")
    text = (f"Batch-1 requests at concurrency {args.concurrency}, {args.rounds} rounds of {args.seconds:g} s per cell "
            "(requests/s: median (each round))\n\n" + "\n".join(rows))
    for label in pkgs:
        model = f"{label}_batched"
        diff = {s: (n - before[model].get(s, (0, 0))[0], ns - before[model].get(s, (0, 0))[1])
                for s, (n, ns) in after[model].items()}
        diff = {s: v for s, v in diff.items() if v[0] > 0}
        total = sum(n for n, _ in diff.values())
        cells = ", ".join(f"{s}: {n} ({100 * n / total:.0f}%, {ns / n / 1e3:.0f} us)" for s, (n, ns) in sorted(diff.items()))
        mean = sum(s * n for s, (n, _) in diff.items()) / max(total, 1)
        text += (f"\n\n{label}, batched: {total} executions, {mean:.1f} requests each; by batch size (share of "
                 f"executions, mean model call): {cells}")
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
