"""Two aotc-server builds side by side: p50, p99 and throughput of batch-1 MLP and simple requests (binary
tensors, closed loop from aotc-load) at each concurrency, the builds taking turns in every round on one host;
medians over the rounds. For a change to the server: keep a copy of the build from before it, e.g.
`cp .venv/bin/aotc-server /tmp/aotc-server-before`, then rebuild. Not a test: asserts nothing.

    .venv/bin/python bench/ab.py --a /tmp/aotc-server-before --b .venv/bin/aotc-server \
      [--concurrency 1,8,32] [--seconds 3] [--rounds 3] [--server-flags "--intra-op-threads 1"]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np

from launch import REPO, Server, make_repository
from loadgen import http_load


def newest(stem: str) -> Path:
    return max(REPO.glob(f"build/test-packages/*/{stem}.pt2"), key=os.path.getmtime)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="one aotc-server binary (the baseline)")
    ap.add_argument("--b", required=True, help="the other")
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated (default 1,8,32)")
    ap.add_argument("--seconds", type=float, default=3, help="measured seconds per cell and round (default 3)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; each runs both builds (default 3)")
    ap.add_argument("--server-flags", default="--intra-op-threads 1", help="flags of both servers")
    ap.add_argument("--mlp", type=Path, help="MLP package (default: the newest in build/test-packages)")
    ap.add_argument("--simple", type=Path, help="simple package (default: the newest in build/test-packages)")
    args = ap.parse_args()

    concurrencies = [int(c) for c in args.concurrency.split(",")]
    rng = np.random.default_rng(0)
    inputs = {"mlp": rng.standard_normal((1, 512)).astype(np.float32),
              "simple": {"INPUT0": rng.integers(-100, 100, (1, 16), dtype=np.int32),
                         "INPUT1": rng.integers(-100, 100, (1, 16), dtype=np.int32)}}
    cells: dict[tuple, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="aotc-ab-") as tmp:
        repo = make_repository(Path(tmp) / "repo", {"mlp": args.mlp or newest("mlp"),
                                                    "simple": args.simple or newest("simple")}, link=True)
        for rnd in range(args.rounds):
            for label, binary in (("a", args.a), ("b", args.b)):
                os.environ["AOTC_SERVER_BIN"] = binary
                with Server("cpp", repo, *args.server_flags.split()) as srv:
                    for model, x in inputs.items():
                        for c in concurrencies:
                            r = http_load(srv.port, model, x, "x", c, args.seconds)
                            cells.setdefault((model, c, label), []).append(r)
                            print(f"round {rnd + 1} {label} {model:6} c={c:<3} p50 {r['p50_ms'] * 1e3:8.1f} us  "
                                  f"p99 {r['p99_ms'] * 1e3:8.1f} us  {r['req_per_s']:7.0f} req/s  "
                                  f"errors {r['errors']}", flush=True)

    print(f"\na = {args.a}\nb = {args.b}\nmedians of {args.rounds} rounds, {args.seconds:g} s each, "
          f"flags: {args.server_flags}\n")
    print("| model | concurrency | p50 us a | p50 us b | p99 us a | p99 us b | req/s a | req/s b | b / a p50 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in inputs:
        for c in concurrencies:
            m = {lab: {k: statistics.median(r[k] for r in cells[(model, c, lab)])
                       for k in ("p50_ms", "p99_ms", "req_per_s")} for lab in "ab"}
            print(f"| {model} | {c} | {m['a']['p50_ms'] * 1e3:.1f} | {m['b']['p50_ms'] * 1e3:.1f} | "
                  f"{m['a']['p99_ms'] * 1e3:.1f} | {m['b']['p99_ms'] * 1e3:.1f} | {m['a']['req_per_s']:.0f} | "
                  f"{m['b']['req_per_s']:.0f} | {m['b']['p50_ms'] / m['a']['p50_ms']:.2f} |")


if __name__ == "__main__":
    main()
