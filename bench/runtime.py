"""Per-call latency of one model four ways on CPU: eager PyTorch, torch.compile, PyTorch's Python AOTI
runner (torch._inductor.aoti_load_package) and the aotc C++ runtime (in-process through aotc._runtime, and
`aotc-run --bench`), side by side.

    .venv/bin/python bench/runtime.py [--models mlp,simple,bert] [--batches 1,64] [--out FILE]

Packages are taken from .cache/pkgs/<model>.pt2 (exported with `aotc export models/<model>.py` when
missing). Inputs for a batch come from the model file's make_inputs(batch), else its example inputs tiled
or cut along dim 0. Every backend runs the same inputs, one caller, the same intra-op threads (default 1: on a shared
machine a second thread mostly measures the scheduler);
each timing is one call, after warm-up; backends take turns (--rounds) so that
background load falls on all alike. Prints a markdown table with its command, date and machine (and writes
it to --out), as docs/performance.md shows it. A measurement, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launch import REPO, LaunchError, find_binary

BACKENDS = ("eager", "torch.compile", "AOTI Python runner", "aotc C++ runtime, in-process", "aotc C++ runtime")
BUDGET_S = 0.5  # per backend and round; calls = clamp(BUDGET_S / eager latency, MIN_CALLS, max_calls)
MIN_CALLS = 10


def _aotc_run() -> Path:
    try:
        return find_binary("aotc-run", "AOTC_RUN")
    except LaunchError as e:
        sys.exit(f"bench/runtime.py: {e}")


def _package(name: str) -> Path:
    pkg = REPO / ".cache" / "pkgs" / f"{name}.pt2"
    if not pkg.exists():
        subprocess.run([sys.executable, "-m", "aotc.cli", "export", f"models/{name}.py", "-o", str(pkg)],
                       cwd=REPO, check=True)
    return pkg


def _inputs(mf, batch: int) -> tuple:
    import torch

    made = mf.make_inputs(batch)
    if made is not None:
        return tuple(made)
    out = []
    for x in mf.example_inputs:
        reps = -(-batch // x.shape[0])
        out.append(x.repeat(reps, *([1] * (x.dim() - 1)))[:batch].contiguous() if x.dim() else x)
    return tuple(torch.as_tensor(x) for x in out)


def _time_calls(fn, calls: int, warmup: int = 10) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return times


def _stats(us: list[float]) -> tuple[float, float]:
    us = sorted(us)
    return statistics.median(us), us[min(len(us) - 1, round(0.9 * (len(us) - 1)))]


def _cpp(pkg: Path, inputs: tuple, calls: int) -> tuple[float, float]:
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, x in enumerate(inputs):
            files.append(os.path.join(tmp, f"in{i}.npy"))
            np.save(files[-1], x.numpy())
        r = subprocess.run([str(_aotc_run()), str(pkg), *files, "--bench", str(calls), "--warmup", "10"],
                           capture_output=True, text=True, env={"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]})
    m = re.search(r"p50_us=([\d.]+) p90_us=([\d.]+)", r.stdout)
    if r.returncode != 0 or not m:
        sys.exit(f"aotc-run failed on {pkg}: {r.stderr.strip() or r.stdout}")
    return float(m.group(1)), float(m.group(2))


def measure(name: str, batch: int, max_calls: int, rounds: int) -> dict:
    import torch

    from aotc.load_model import load_model_file
    from aotc.loader import ensure_libstdcxx_global

    pkg = _package(name)
    mf = load_model_file(str(REPO / "models" / f"{name}.py"))
    model = mf.model.eval()
    inputs = _inputs(mf, batch)
    with torch.no_grad():
        eager = _time_calls(lambda: model(*inputs), 20)
        calls = int(min(max_calls, max(MIN_CALLS, BUDGET_S / (statistics.median(eager) / 1e6))))
        compiled = torch.compile(model)
        compiled(*inputs)  # compile outside the timing
        ensure_libstdcxx_global()
        runner = torch._inductor.aoti_load_package(str(pkg))
        # The same C++ runtime in this process through aotc._runtime (numpy in and out), so that it takes
        # turns with the other in-process backends under the same conditions as they do.
        from aotc.runtime import Session

        session = Session(str(pkg))
        arrays = [x.numpy() for x in inputs]
        python_backends = {"eager": model, "torch.compile": compiled, "AOTI Python runner": runner,
                           "aotc C++ runtime, in-process": lambda *_: session.run(arrays)}
        # Backends take turns, `rounds` times, so that load from other processes falls on all of them alike;
        # each reports the median over rounds of its per-round median and p90.
        per_round = {b: [] for b in BACKENDS}
        for _ in range(rounds):
            for b, fn in python_backends.items():
                per_round[b].append(_stats(_time_calls(lambda: fn(*inputs), calls)))
            per_round["aotc C++ runtime"].append(_cpp(pkg, inputs, calls))
    row = {"model": name, "batch": batch, "calls": calls * rounds}
    for b, stats in per_round.items():
        row[b] = (statistics.median(s[0] for s in stats), statistics.median(s[1] for s in stats))
    return row



def table(rows: list[dict]) -> str:
    head = "| model | batch | " + " | ".join(BACKENDS) + " | fastest |"
    lines = [head, "|" + "---|" * (len(BACKENDS) + 3)]
    for r in rows:
        cells = [f"{r[b][0]:.0f} / {r[b][1]:.0f}" for b in BACKENDS]
        fastest = min(BACKENDS, key=lambda b: r[b][0])
        lines.append(f"| {r['model']} | {r['batch']} | " + " | ".join(cells) + f" | {fastest} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,simple,bert")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--max-calls", type=int, default=200, help="timed calls per backend and round")
    ap.add_argument("--rounds", type=int, default=6, help="times each backend is measured, in turns")
    ap.add_argument("--out", type=Path, help="also write the table here")
    ap.add_argument("--intra-op-threads", type=int, default=1,
                    help="threads one call may use, in every backend (OMP_NUM_THREADS / torch.set_num_threads)")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.intra_op_threads)
    import torch

    torch.set_num_threads(args.intra_op_threads)

    load_before = os.getloadavg()[0]
    rows = []
    for name in args.models.split(","):
        for batch in map(int, args.batches.split(",")):
            rows.append(measure(name, batch, args.max_calls, args.rounds))
            print(f"{name} batch {batch}: " + ", ".join(f"{b} {rows[-1][b][0]:.0f} us" for b in BACKENDS),
                  file=sys.stderr)
    cmd = "python bench/runtime.py " + " ".join(sys.argv[1:])
    text = ("Per-call latency in microseconds, median / p90, one caller, CPU "
            f"(torch {torch.__version__}, {os.cpu_count()} cores, {torch.get_num_threads()} intra-op threads, "
            f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f} from other processes), "
            f"{time.strftime('%Y-%m-%d', time.gmtime())}. Command: `{cmd.strip()}`.\n"
            "eager and torch.compile run the model file's module; the AOTI Python runner is "
            "`torch._inductor.aoti_load_package`; the C++ runtime is `aotc-run PKG in.npy --bench N` "
            "(validation included, no Python, its own process), and in-process through `aotc._runtime` "
            "(numpy in and out), taking turns with the other in-process backends.\n\n" + table(rows) + "\n")
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
