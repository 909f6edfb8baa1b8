"""`aotc tune MODEL.py --p99-ms B --concurrency C[,C...]`: the parser; aotc/tune.py does the work."""

from __future__ import annotations

import argparse


def _concurrencies(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(t) for t in text.split(","))
    except ValueError:
        out = ()
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected C[,C...] with each C a whole number >= 1, got {text!r}")
    return out


def _positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            v = 0
        if not v > 0:
            raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
        return v
    return parse


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="find the fastest serving configuration within a p99 latency budget",
                       description="Export the model in several variants (through the export cache), serve each "
                                   "with several sets of serving knobs on aotc-server, measure them at the given "
                                   "concurrencies (successive halving within --budget-min), and write the table, a "
                                   "Pareto plot and the winner as a repository entry.")
    p.add_argument("model", metavar="MODEL.py[:NAME]")
    p.add_argument("--p99-ms", type=_positive(float), required=True, metavar="B", help="the p99 latency budget")
    p.add_argument("--concurrency", type=_concurrencies, required=True, metavar="C[,C...]",
                   help="closed-loop clients to measure at; the budget holds at each")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32")
    p.add_argument("--request-batch", type=_positive(int), default=1, metavar="N", help="rows per request [1]")
    p.add_argument("--budget-min", type=_positive(float), default=10.0, metavar="M",
                   help="minutes the search may take, exports aside [10]")
    p.add_argument("-o", "--output", default="tuned", metavar="REPO_DIR",
                   help="where the winner's repository entry and the reports go [tuned]")
    p.add_argument("--variants", metavar="V,V,...", help="only these export variants (default: all of default, "
                   "max-autotune, freezing-off|freezing-on, static-batches|no-static-batches, seq-buckets)")
    p.add_argument("--seq-buckets", metavar="INPUT:AXIS[,...]=N,N,...", help="also try this --seq-buckets export")
    p.add_argument("--first-seconds", type=_positive(float), default=1.0, metavar="S",
                   help="seconds per candidate and concurrency in the first round; each round doubles it [1]")


def run(args) -> int:
    from aotc.tune import TuneOptions, tune

    return tune(TuneOptions(spec=args.model, p99_ms=args.p99_ms, concurrency=args.concurrency, device=args.device,
                            dtype=args.dtype, request_batch=args.request_batch, budget_min=args.budget_min,
                            out=args.output, variants=args.variants.split(",") if args.variants else None,
                            seq_buckets=args.seq_buckets, first_seconds=args.first_seconds),
                lambda line: print(line, flush=True))
