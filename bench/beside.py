"""Whether what else a process holds slows a model's calls (docs/performance.md, The second package: BERT's
graph ran 10-12% longer in a server that also held a second model). For each --beside companion, in a fresh
process each round (what a companion does to the process can outlast it), the process times --package alone,
then with the companion loaded beside it (its graphs not captured yet), after the companion has run once at
each of its batch sizes (its graphs captured, as a server's warm-up does), and after the companion is gone
again. A companion is a package (NAME=PKG; it may be the measured package itself), or NAME=torch-graphs:N, N
trivial CUDA graphs (one kernel each) captured with torch.cuda.graph on a stream of their own, with no package.

Every phase is the p50 of --calls back-to-back calls of the package on its stored example at batch 1
(aotc.runtime.Session: numpy in, numpy out) and, for a CUDA package, the runtime's own means over those calls
(AOTC_CUDA_TIMING, docs/runtime.md; --calls / 2 unless the environment sets it): the call on the host, the
graph's launch on the host, and the graph on the device. One row per round and phase.

    python bench/beside.py --package PKG --beside NAME=PKG|NAME=torch-graphs:N [--beside ...] [--calls 2000]
        [--rounds 2] [--out FILE]

Not a test: it asserts nothing, and `make test` does not run it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perf_analyzer import lean_inputs, machine

PHASES = ("alone", "loaded", "captured", "gone")
TIMING = re.compile(r"replay ([0-9.]+),.*\(call ([0-9.]+)\).*graph ([0-9.]+)")
TORCH_GRAPHS = re.compile(r"torch-graphs:([1-9][0-9]*)$")


@contextlib.contextmanager
def stderr_into(path: Path):
    """The process's fd 2 (where the C++ runtime writes its timing lines) into `path` for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def timed(session, x: dict, calls: int, log: Path) -> dict:
    """p50 us of `calls` back-to-back calls, and the means of the runtime's timing lines written meanwhile."""
    us = []
    with stderr_into(log):
        for _ in range(calls):
            t0 = time.perf_counter()
            session.run(x)
            us.append((time.perf_counter() - t0) * 1e6)
    lines = [TIMING.search(ln) for ln in log.read_text(errors="replace").splitlines()]
    got = [tuple(float(v) for v in m.groups()) for m in lines if m]
    mean = {k: statistics.mean(g[i] for g in got) if got else None for i, k in enumerate(("replay", "call", "graph"))}
    return {"p50": statistics.median(us), **mean}


class TorchGraphs:
    """N trivial CUDA graphs (an in-place add of 1024 floats each), captured by torch on a stream of their own."""

    def __init__(self, n: int):
        self.n, self.graphs = n, []

    def run_everything(self) -> None:
        import torch

        stream = torch.cuda.Stream()
        for _ in range(self.n):
            t = torch.zeros(1024, device="cuda")
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                t.add_(1)  # warm-up outside the capture
                with torch.cuda.graph(g, stream=stream):
                    t.add_(1)
            g.replay()
            torch.cuda.synchronize()
            self.graphs.append((g, t))


class PackageCompanion:
    """A package in a Session of its own; run_everything runs it once at batch 1 and at each static graph's batch."""

    def __init__(self, pkg: Path):
        from aotc.runtime import Session

        self.session, self.x = Session(str(pkg)), lean_inputs(pkg, 1, "given")

    def run_everything(self) -> None:
        for b in sorted({1, *(g.batch for g in self.session.manifest.static_graphs)}):
            self.session.run({k: v.repeat(b, axis=0) for k, v in self.x.items()})


def one_process(package: Path, spec: str, calls: int) -> dict:
    """The four phases for one companion, in this process: {phase: timed()}."""
    os.environ.setdefault("AOTC_CUDA_TIMING", str(calls // 2))  # read when a CUDA session is made
    from aotc.runtime import Session

    session, x = Session(str(package)), lean_inputs(package, 1, "given")
    out = {}
    with tempfile.TemporaryDirectory(prefix="beside-") as tmp:
        log = Path(tmp) / "stderr.log"
        timed(session, x, calls, log)  # warm-up: the graph's capture, first calls
        out["alone"] = timed(session, x, calls, log)
        m = TORCH_GRAPHS.match(spec)
        companion = TorchGraphs(int(m.group(1))) if m else PackageCompanion(Path(spec))
        out["loaded"] = timed(session, x, calls, log)
        with stderr_into(log):
            companion.run_everything()
        out["captured"] = timed(session, x, calls, log)
        del companion
        out["gone"] = timed(session, x, calls, log)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", type=Path, required=True)
    ap.add_argument("--beside", action="append", required=True, metavar="NAME=PKG|NAME=torch-graphs:N")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", metavar="SPEC", help=argparse.SUPPRESS)  # one process's phases, as JSON
    a = ap.parse_args()
    if a.calls < 10 or a.rounds < 1:
        ap.error("--calls takes at least 10 and --rounds at least 1")
    if a.child:
        print("BESIDE " + json.dumps(one_process(a.package, a.child, a.calls)), flush=True)
        return
    bad = [b for b in a.beside if "=" not in b or not (TORCH_GRAPHS.match(b.split("=", 1)[1])
                                                       or Path(b.split("=", 1)[1]).is_file())]
    if bad:
        ap.error(f"--beside takes NAME=PKG (an existing file) or NAME=torch-graphs:N (N >= 1); got {bad}")
    lines = [f"# {a.package.name} with other things in its process",
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, {machine()}; "
             f"{a.calls} calls at batch 1 per phase; a fresh process per companion and round", "",
             "| beside | round | phase | p50 us (Python) | the call on the host us | graph launch on the host us "
             "| the graph on the device us |", "|---|---|---|---|---|---|---|"]
    for r in range(1, a.rounds + 1):
        for b in a.beside:
            name, spec = b.split("=", 1)
            got = subprocess.run([sys.executable, __file__, "--package", str(a.package), "--beside", b,
                                  "--calls", str(a.calls), "--child", spec], capture_output=True, text=True)
            rows = [ln for ln in got.stdout.splitlines() if ln.startswith("BESIDE ")]
            if got.returncode != 0 or not rows:
                sys.exit(f"beside.py: the process for {b} failed ({got.returncode}): {got.stderr[-2000:]}")
            phases = json.loads(rows[-1].split(" ", 1)[1])
            for phase in PHASES:
                cells = [phases[phase][k] for k in ("p50", "call", "replay", "graph")]
                lines.append(f"| {name} | {r} | {phase} | "
                             + " | ".join("" if v is None else f"{v:.1f}" for v in cells) + " |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
