"""The command line of `aotc bench` (mounted by aotc.cli.bench) and of `aotc-bench`, the same command where
the client is installed alone: the one parser of it. Parsing only; bench.py does the work."""

from __future__ import annotations

import argparse
import sys

from .bench import BenchOptions, measure
from .errors import AotcError


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    d = BenchOptions(model="", urls=[])
    p.add_argument("--url", help="the server to measure, e.g. http://127.0.0.1:8000")
    p.add_argument("--compare", nargs="+", metavar="URL", default=[],
                   help="more servers measured the same way, in turns; ratios to the first")
    p.add_argument("--model", required=True)
    p.add_argument("--concurrency", default=d.concurrency, help="comma-separated connection counts (default "
                   "%(default)s)")
    p.add_argument("--duration", type=float, default=d.duration, metavar="S",
                   help="seconds per level, counted (default %(default)s)")
    p.add_argument("--warmup", type=float, default=d.warmup, metavar="S",
                   help="seconds per level before counting (default %(default)s)")
    p.add_argument("--batch", type=int, default=d.batch, help="rows per request for a dynamic batch dim "
                   "(default %(default)s)")
    p.add_argument("--max-requests", type=int, default=d.max_requests, metavar="N",
                   help="stop a level after N requests")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the random request (default %(default)s)")
    p.add_argument("--timeout", type=float, default=d.timeout, metavar="S",
                   help="seconds per request (default %(default)s)")
    enc = p.add_mutually_exclusive_group()
    enc.add_argument("--binary", dest="binary", action="store_true", default=d.binary, help="binary tensors "
                     "(default)")
    enc.add_argument("--json", dest="binary", action="store_false", help="JSON tensors")
    p.add_argument("--plot", metavar="OUT.png", help="write latency against throughput as a PNG")
    p.add_argument("--allow-remote", action="store_true", help="allow a server that is not on loopback")


def bench_options(args) -> BenchOptions:
    """The parsed line as BenchOptions: `--url A --compare B C` and `--compare A B C` both measure A, B, C."""
    return BenchOptions(model=args.model, urls=([args.url] if args.url else []) + list(args.compare),
                        concurrency=args.concurrency, duration=args.duration, warmup=args.warmup,
                        batch=args.batch, binary=args.binary, max_requests=args.max_requests, seed=args.seed,
                        timeout=args.timeout, plot=args.plot, allow_remote=args.allow_remote)


def main(argv: list[str] | None = None) -> int:
    """`aotc-bench ...`: as `aotc bench ...`."""
    p = argparse.ArgumentParser(prog="aotc-bench", description="Measure Open Inference Protocol servers: "
                                "latency and throughput per concurrency.")
    add_bench_arguments(p)
    try:
        measure(bench_options(p.parse_args(argv)))
    except AotcError as e:
        print(f"aotc-bench: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
