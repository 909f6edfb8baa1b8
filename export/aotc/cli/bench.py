"""`aotc bench`: the client's command (aotc_client/cli.py owns its parser; aotc_client/bench.py does the work)."""

from __future__ import annotations


def add_parser(sub) -> None:
    from aotc_client.cli import add_bench_arguments

    p = sub.add_parser("bench", help="measure a server: latency and throughput per concurrency")
    add_bench_arguments(p)


def run(args) -> int:
    from aotc_client.bench import measure
    from aotc_client.cli import bench_options

    measure(bench_options(args))
    return 0
