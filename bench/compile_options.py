"""Which AOTInductor options should `aotc export` use by default? Eager vs AOTI packages compiled with each
candidate set of Inductor options, per-call latency measured in one process, one thing at a time.

    .venv/bin/python bench/compile_options.py [--model models/mlp.py] [--batches 1,64] [--iters 2000]
    python bench/compile_options.py --device cuda   # on the GPU machine

Each candidate is compiled once (AOTI: tens of seconds on a CPU; `--keep DIR` reuses packages across runs).
Then all variants are timed in interleaved rounds, so load from other processes hits them alike: each
round times `--calls` calls per variant and batch (inputs already on the device; CUDA: synchronized after
every call); the table shows the lowest per-round median, and the median over rounds. Prints markdown. A benchmark, not a test: it asserts nothing. The winner goes into
export/aotc/compile.py:DEVICE_DEFAULTS.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

from aotc import export as exp
from aotc.load_model import load_model_file
from aotc.loader import ensure_libstdcxx_global

CANDIDATES = {
    "aoti default": {},
    "aoti freezing": {"freezing": True},
    "aoti freezing, no weight prepack": {"freezing": True, "cpp.weight_prepack": False},
    "aoti max-autotune": {"max_autotune": True},
    "aoti freezing + max-autotune": {"freezing": True, "max_autotune": True},
}


def round_median_us(fn, x, calls: int, device: str) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(*x)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/mlp.py")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--calls", type=int, default=50, help="calls per variant, batch and round")
    ap.add_argument("--keep", help="directory for the compiled packages (reused when present)")
    ap.add_argument("--only", help="comma-separated candidate names to run (default: all)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    mf = load_model_file(args.model)
    model, inputs = exp.prepare(mf, args.device, "fp32")
    make = mf.make_inputs if getattr(mf.module, "make_inputs", None) else None

    def inputs_for(b):
        fresh = make(b) if make else tuple(torch.randn(b, *x.shape[1:]) for x in inputs)
        return tuple(x.to(args.device) for x in fresh)

    ep = exp.export_model(model, inputs, mf.dynamic_shapes, False, mf.input_names)
    ensure_libstdcxx_global()
    names = args.only.split(",") if args.only else list(CANDIDATES)
    runners, compile_s = {"eager": model}, {"eager": 0.0}
    tmp = tempfile.TemporaryDirectory()
    keep = args.keep or tmp.name
    os.makedirs(keep, exist_ok=True)
    for i, name in enumerate(names):
        path = os.path.join(keep, f"{os.path.basename(args.model)[:-3]}_{args.device}_{i}.pt2")
        compile_s[name] = None  # reused from --keep
        if not os.path.exists(path):
            t0 = time.perf_counter()
            torch._inductor.aoti_compile_and_package(ep, package_path=path, inductor_configs=CANDIDATES[name])
            compile_s[name] = time.perf_counter() - t0
        runners[name] = torch._inductor.aoti_load_package(path)
        print(f"  {name}: {path} ({compile_s[name] or 0:.0f} s)", file=sys.stderr, flush=True)
    data = {b: inputs_for(b) for b in batches}
    samples = {(n, b): [] for n in runners for b in batches}
    with torch.no_grad():
        for n, fn in runners.items():  # warm-up
            for b in batches:
                round_median_us(fn, data[b], args.calls, args.device)
        for _ in range(args.rounds):
            for n, fn in runners.items():
                for b in batches:
                    samples[n, b].append(round_median_us(fn, data[b], args.calls, args.device))
    tmp.cleanup()
    print(f"\n{args.model} on {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"us per call: best round median (median of {args.rounds} rounds of {args.calls} calls)\n")
    print("| variant | " + " | ".join(f"batch {b}" for b in batches) + " | compile s |")
    print("|---|" + "---|" * len(batches) + "---|")
    for n in runners:
        cells = [f"{min(samples[n, b]):.0f} ({statistics.median(samples[n, b]):.0f})" for b in batches]
        print(f"| {n} | " + " | ".join(cells) + f" | {'-' if compile_s[n] is None else round(compile_s[n])} |")


if __name__ == "__main__":
    main()
