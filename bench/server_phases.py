"""Where one request's time goes in aotc-server at concurrency 1: the in-process runtime (`aotc-run --bench`)
next to HTTP (aotc-load, one connection) for the same package and input, with the server's own statistics
taken after a warm-up (so CUDA-graph capture and first calls are left out), for a batching model that hands
every request to a runner (run_inline_when_idle false), the same with the default (a request that finds the
model idle runs on its HTTP thread), and an unbatched one; the configs take turns in rounds. Prints a markdown table; the difference
between the client's mean and the server's enqueue-to-answer mean is HTTP, parsing and encoding. The
in-process call is timed twice: back to back, and paced (`aotc-run --gap-us`, idle for as long as a request
spends outside the model call over HTTP), since a machine that idles between calls runs them slower. The floor of
any request (GET /v2/health/ready) comes last. Single-input packages; the input is the package's first sample, rows repeated to each batch size.
  python bench/server_phases.py --package PKG [--batch 1 64] [--seconds 3] [--intra-op-threads 1] [--out FILE]
      [--configs default,unbatched] [--server-log FILE]
--configs loads only the named configs (each config is one copy of the model in the server); --server-log keeps
the server's output (with AOTC_CUDA_TIMING=N in the environment, the per-phase means of its CUDA calls).
aotc-run, aotc-server and aotc-load: as bench/launch.py's find_binary looks for them. Not a test; asserts nothing.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from launch import Server, make_repository
from loadgen import aotc_run_p50_us, get_load, http_load, server_stats, stats_per_request

CONFIGS = {"batching, handed to a runner": {"max_batch_size": 64, "max_queue_delay_us": 200,
                                            "run_inline_when_idle": False},
           "batching, inline when idle (default)": {"max_batch_size": 64, "max_queue_delay_us": 200},
           "unbatched, inline when idle": {"max_batch_size": 0}}
SHORT = dict(zip(("runner", "default", "unbatched"), CONFIGS))  # --configs names


def first_sample(pkg: Path) -> tuple[str, np.ndarray]:
    from aotc.manifest import read

    m = read(str(pkg))
    if len(m.inputs) != 1:
        raise SystemExit(f"server_phases: {pkg} has {len(m.inputs)} inputs; this benchmark takes one")
    with zipfile.ZipFile(pkg) as zf:
        root = zf.namelist()[0].split("/")[0]
        x = np.load(io.BytesIO(zf.read(f"{root}/{m.samples[0].inputs[0]}")), allow_pickle=False)
    return m.inputs[0].name, x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", type=Path, required=True)
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--seconds", type=float, default=2.0, help="per cell and round")
    ap.add_argument("--rounds", type=int, default=3, help="the configs take turns this many times per batch size")
    ap.add_argument("--intra-op-threads", type=int, help="for aotc-server (and OMP_NUM_THREADS for aotc-run)")
    ap.add_argument("--out", type=Path, help="also write the table here")
    ap.add_argument("--configs", default=",".join(SHORT), help=f"comma-separated, of {', '.join(SHORT)}")
    ap.add_argument("--server-log", type=Path, help="copy the server's output here")
    ap.add_argument("--busy-poll-us", type=int, help="start aotc-server with --busy-poll-us N")
    args = ap.parse_args()
    unknown = [c for c in args.configs.split(",") if c not in SHORT]
    if unknown:
        ap.error(f"--configs: unknown {', '.join(unknown)}; expected some of {', '.join(SHORT)}")
    configs = {SHORT[c]: CONFIGS[SHORT[c]] for c in args.configs.split(",")}
    if args.intra_op_threads:
        os.environ["OMP_NUM_THREADS"] = str(args.intra_op_threads)
    pkg = args.package.resolve()
    name, sample = first_sample(pkg)
    flags = ("--intra-op-threads", str(args.intra_op_threads)) if args.intra_op_threads else ()
    if args.busy_poll_us:
        flags += ("--busy-poll-us", str(args.busy_poll_us))
    rows = ["| model config | batch | in-process p50 us | in-process paced p50 us | HTTP c1 p50 us (median of rounds) | "
            "HTTP mean us | server: enqueue to answer | queue | infer | HTTP, parsing, encoding |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        models = [f"m{i}" for i in range(len(configs))]
        repo = make_repository(tmp / "repo", {m: pkg for m in models}, dict(zip(models, configs.values())), link=True)
        srv = Server("cpp", repo, *flags, log_path=args.server_log)
        try:
            floor = statistics.median(get_load(srv.port, "/v2/health/ready", args.seconds)["p50_ms"]
                                      for _ in range(args.rounds)) * 1e3
            for b in args.batch:
                x = np.resize(sample, (b, *sample.shape[1:]))
                try:
                    ref = aotc_run_p50_us(pkg, x, tmp, calls=2000, warmup=200)
                except RuntimeError as e:
                    raise SystemExit(f"server_phases: {e}") from None
                before, runs = {}, {m: [] for m in models}
                for model in models:
                    http_load(srv.port, model, x, name, 1, 1.0)  # warm-up: graph capture, first calls
                    before[model] = server_stats(srv.port, model)
                for _ in range(args.rounds):  # the configs take turns, so drifting load falls on all alike
                    for model in models:
                        runs[model].append(http_load(srv.port, model, x, name, 1, args.seconds))
                # idle between paced calls: what a request of the default config (else the first) spends outside
                # the model call
                labels = list(configs)
                default = list(models)[labels.index(SHORT["default"]) if SHORT["default"] in labels else 0]
                gap = max(0, statistics.median(h["p50_ms"] for h in runs[default]) * 1e3 - ref)
                paced = aotc_run_p50_us(pkg, x, tmp, calls=2000, warmup=200, flags=["--gap-us", str(int(gap))])
                for label, model in zip(configs, models):
                    st = stats_per_request(before[model], server_stats(srv.port, model))
                    p50 = statistics.median(h["p50_ms"] for h in runs[model]) * 1e3
                    n = sum(h["requests"] for h in runs[model])
                    mean = sum(h["mean_ms"] * h["requests"] for h in runs[model]) / max(n, 1) * 1e3
                    rows.append(f"| {label} | {b} | {ref:.0f} | {paced:.0f} | {p50:.0f} | {mean:.0f} | "
                                f"{st['success']:.0f} | {st['queue']:.0f} | {st['compute_infer']:.0f} | "
                                f"{mean - st['success']:.0f} |")
        finally:
            srv.stop()
    text = (f"package {pkg.name}, input {name} {list(sample.shape[1:])}, {args.rounds} rounds of {args.seconds:g} s "
            "per config, the configs taking turns\n\n" + "\n".join(rows) +
            f"\n\nThe floor of any request, GET /v2/health/ready on one connection: p50 {floor:.0f} us.")
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
