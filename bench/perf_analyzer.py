"""Triton's perf_analyzer against aotc-server, over HTTP (`-i http`) and gRPC (`-i grpc`), with and without
system shared memory (`--shared-memory system`), at concurrency 1 to 32, on `simple` and the MLP: a Markdown
table of throughput and p50/p99 latency per cell, then gRPC against HTTP (throughput at the highest
concurrency, p50 at concurrency 1) next to their targets, and the server's CPU time per inference (from
/proc, over each whole run) to tell the server's cost from the client's. docs/performance.md
("perf_analyzer: HTTP and gRPC") holds its output.

    .venv/bin/python bench/perf_analyzer.py [--concurrency 1,2,4,8,16,32] [--models simple,mlp]
        [--requests 1000] [--budget-s 600] [--server-flags "--intra-op-threads 1"] [--out FILE]

perf_analyzer is --perf-analyzer, else `perf_analyzer` on PATH, else /tmp/pa/perf_analyzer (the wheel
`perf-analyzer` 2.60.0 needs glibc 2.38; on Debian 12 it runs through a newer loader, docs/performance.md).
One aotc-server (bench/launch.py, with `--allow-shared-memory`) serves every cell; the packages are those
bench/serve.py uses. Each cell is one perf_analyzer run in count_windows mode (--requests a window, stability
30 %: the default 10 % rarely converges on 2 shared cores), read back from its CSV (-f); the HTTP and gRPC runs
of a cell follow each other, so drift of the machine hits both alike. A cell that does not fit in what is left
of --budget-s is skipped and listed. Not a test: it asserts nothing, and `make test` does not run it.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launch import Server, make_repository
from serve import package

TRANSPORTS = ("http", "grpc")
SHM = ("none", "system")
CELL_TIMEOUT_S = 120  # one perf_analyzer run; count_windows at 30 % settles in a few seconds here


def find_perf_analyzer(given: str | None) -> str:
    for c in (given, shutil.which("perf_analyzer"), "/tmp/pa/perf_analyzer"):
        if c and os.access(c, os.X_OK):
            return c
    sys.exit("perf_analyzer not found: pass --perf-analyzer PATH (see docs/performance.md, perf_analyzer: HTTP "
             "and gRPC)")


def pa_argv(pa: str, url: str, transport: str, shm: str, model: str, concurrency: int | str, requests: int,
            csv_path: str) -> list[str]:
    argv = [pa, "-m", model, "-u", url, "-i", transport, "--concurrency-range", f"{concurrency}:{concurrency}",
            "--measurement-mode", "count_windows", "--measurement-request-count", str(requests), "-s", "30",
            "-f", csv_path]
    return argv + (["--shared-memory", "system"] if shm == "system" else [])


def server_cpu_s(srv: Server) -> float:
    """The server process's user + system CPU seconds so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{srv.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def inference_count(srv: Server, model: str) -> int:
    _, st = srv.json("GET", f"/v2/models/{model}/stats")
    return sum(m["inference_count"] for m in st["model_stats"])


def run_cell(pa: str, srv: Server, transport: str, shm: str, model: str, concurrency: int, requests: int,
             timeout: float) -> dict | str:
    """-> {"throughput", "p50_us", "p99_us", "cpu_us"} from perf_analyzer's CSV and the server's CPU time per
    inference over the whole run (its warm-up and windows alike), or why there is none."""
    url = f"{srv.host}:{srv.port}" if transport == "http" else srv.grpc_url
    cpu0, n0 = server_cpu_s(srv), inference_count(srv, model)
    with tempfile.TemporaryDirectory(prefix="aotc-pa-") as tmp:
        out = Path(tmp) / "pa.csv"
        argv = pa_argv(pa, url, transport, shm, model, concurrency, requests, str(out))
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"no result within {timeout:.0f} s"
        if r.returncode != 0 or not out.exists():
            last = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
            return f"perf_analyzer exited {r.returncode}: {last[0][:200]}"
        with open(out, newline="") as f:
            row = next(csv.DictReader(f))
        n = inference_count(srv, model) - n0
        return {"throughput": float(row["Inferences/Second"]), "p50_us": float(row["p50 latency"]),
                "p99_us": float(row["p99 latency"]), "cpu_us": (server_cpu_s(srv) - cpu0) * 1e6 / max(n, 1)}


def table(cells: dict) -> list[str]:
    rows = ["| transport | shm | model | concurrency | infer/s | p50 us | p99 us | server CPU us/infer |",
            "|---|---|---|---|---|---|---|---|"]
    for (transport, shm, model, c), r in cells.items():
        rows.append(f"| {transport} | {shm} | {model} | {c} | {r['throughput']:.0f} | {r['p50_us']:.0f} | "
                    f"{r['p99_us']:.0f} | {r['cpu_us']:.1f} |")
    return rows


def comparison(cells: dict, models: list[str], concurrency: list[int]) -> list[str]:
    """gRPC against HTTP per model and shm: throughput at the highest concurrency (target: >= 1.0x) and p50 at
    the lowest (target: gRPC at most HTTP + 20 us)."""
    hi, lo = max(concurrency), min(concurrency)
    out = []
    for model in models:
        for shm in SHM:
            parts = []
            h, g = cells.get(("http", shm, model, hi)), cells.get(("grpc", shm, model, hi))
            if h and g:
                ratio = g["throughput"] / h["throughput"]
                parts.append(f"throughput at c={hi} {ratio:.2f}x HTTP's "
                             f"({'meets' if ratio >= 1 else 'misses'} >= 1.0x)")
            h, g = cells.get(("http", shm, model, lo)), cells.get(("grpc", shm, model, lo))
            if h and g:
                diff = g["p50_us"] - h["p50_us"]
                parts.append(f"p50 at c={lo} {diff:+.0f} us against HTTP's "
                             f"({'meets' if diff <= 20 else 'misses'} <= +20 us)")
            if parts:
                out.append(f"- {model}, shm {shm}: gRPC " + "; ".join(parts))
    return out


def machine() -> str:
    cores = len(os.sched_getaffinity(0))
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "?")
    gpu = "a GPU" if shutil.which("nvidia-smi") else "no GPU"
    return f"{cores} cores ({name}), {gpu}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--perf-analyzer", help="the perf_analyzer to run (default: PATH, else /tmp/pa/perf_analyzer)")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32", help="comma-separated (default 1,2,4,8,16,32)")
    ap.add_argument("--models", default="simple,mlp", help="comma-separated, of simple and mlp (default both)")
    ap.add_argument("--requests", type=int, default=1000,
                    help="perf_analyzer's --measurement-request-count: requests a window (default 1000)")
    ap.add_argument("--budget-s", type=float, default=600, help="the whole run's bound in seconds (default 600)")
    ap.add_argument("--server-flags", default="--intra-op-threads 1",
                    help="more aotc-server flags (default: --intra-op-threads 1, as the other CPU benchmarks)")
    ap.add_argument("--out", type=Path, help="also write the Markdown there")
    args = ap.parse_args()

    pa = find_perf_analyzer(args.perf_analyzer)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    models = args.models.split(",")
    t_end = time.monotonic() + args.budget_s
    v = subprocess.run([pa, "--version"], capture_output=True, text=True)
    version = (v.stdout + v.stderr).strip().splitlines()[:1]
    flags = ["--allow-shared-memory", *args.server_flags.split()]
    cells, skipped = {}, []
    with tempfile.TemporaryDirectory(prefix="aotc-pa-") as tmp:
        repo = make_repository(Path(tmp) / "repo", {m: package(m) for m in models}, link=True)
        with Server("cpp", repo, *flags) as srv:
            for model in models:
                for shm in SHM:
                    for c in concurrency:
                        for transport in TRANSPORTS:
                            left = t_end - time.monotonic()
                            key = (transport, shm, model, c)
                            if left < 5:
                                skipped.append(f"{key}: out of --budget-s")
                                continue
                            r = run_cell(pa, srv, transport, shm, model, c, args.requests,
                                         min(CELL_TIMEOUT_S, left))
                            if isinstance(r, str):
                                skipped.append(f"{key}: {r}")
                            else:
                                cells[key] = r
                            print(f"{transport:4} shm {shm:6} {model:6} c={c:<3} {r}", file=sys.stderr, flush=True)
                            if srv.proc.poll() is not None:
                                sys.exit(f"aotc-server exited {srv.proc.returncode}:\n{srv.log()[-2000:]}")
    cmd = " ".join(pa_argv("perf_analyzer", "127.0.0.1:PORT", "{http,grpc}", "none", "MODEL", "C", args.requests,
                           "F.csv"))
    lines = [f"Measured on {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}, "
             f"{version[0] if version else 'perf_analyzer'}; aotc-server {' '.join(flags)}.",
             f"Each cell: `{cmd} [--shared-memory system]`.", "", *table(cells), "",
             *comparison(cells, models, concurrency)]
    if skipped:
        lines += ["", "Not measured:", *[f"- {s}" for s in skipped]]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
