"""Which AOTInductor options should `aotc export` use by default? Eager vs AOTI packages compiled with each
candidate set of Inductor options, per-call latency measured in one process, one thing at a time.

    .venv/bin/python bench/compile_options.py [--model models/mlp.py] [--batches 1,64] [--iters 2000]
    python bench/compile_options.py --device cuda   # on the GPU machine

Each candidate is compiled once (AOTI: tens of seconds on a CPU); latency is the median of `--iters`
calls after a warm-up, inputs already on the device (CUDA: synchronized after every call). Prints a
markdown table. A benchmark, not a test: it asserts nothing. The winner goes into
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "export"))

from aotc import export as exp  # noqa: E402
from aotc.load_model import load_model_file  # noqa: E402
from aotc.loader import ensure_libstdcxx_global  # noqa: E402

CANDIDATES = {
    "aoti default": {},
    "aoti freezing": {"freezing": True},
    "aoti freezing, no weight prepack": {"freezing": True, "cpp.weight_prepack": False},
    "aoti max-autotune": {"max_autotune": True},
    "aoti freezing + max-autotune": {"freezing": True, "max_autotune": True},
}


def median_us(fn, x, iters: int, device: str) -> float:
    for _ in range(max(10, iters // 20)):
        fn(*x)
    times = []
    for _ in range(iters):
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
    ap.add_argument("--iters", type=int, default=2000)
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
    rows = {}
    with torch.no_grad():
        rows["eager"] = ([median_us(model, inputs_for(b), args.iters, args.device) for b in batches], 0.0)
    ensure_libstdcxx_global()
    names = args.only.split(",") if args.only else list(CANDIDATES)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = os.path.join(tmp, f"c{len(rows)}.pt2")
            t0 = time.perf_counter()
            torch._inductor.aoti_compile_and_package(ep, package_path=path, inductor_configs=CANDIDATES[name])
            compile_s = time.perf_counter() - t0
            compiled = torch._inductor.aoti_load_package(path)
            rows[name] = ([median_us(compiled, inputs_for(b), args.iters, args.device) for b in batches], compile_s)
            print(f"  {name}: {rows[name][0]} us, compile {compile_s:.0f} s", file=sys.stderr, flush=True)
    print(f"\n{args.model} on {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"median us per call over {args.iters} calls\n")
    print("| variant | " + " | ".join(f"batch {b}" for b in batches) + " | compile s |")
    print("|---|" + "---|" * len(batches) + "---|")
    for name, (times, compile_s) in rows.items():
        print(f"| {name} | " + " | ".join(f"{t:.0f}" for t in times) + f" | {compile_s:.0f} |")


if __name__ == "__main__":
    main()
