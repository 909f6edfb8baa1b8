"""Triton's perf_analyzer against aotc-server, over HTTP (`-i http`) and gRPC (`-i grpc`), with and without
system shared memory (`--shared-memory system`), at concurrency 1 to 32, on `simple` and the MLP: a Markdown
table of throughput and p50/p99 latency per cell, then gRPC against HTTP (throughput at the highest
concurrency, p50 at concurrency 1) next to their targets, and the CPU time per inference of the server (from
/proc) and of perf_analyzer (its rusage), over each whole run, to tell the server's cost from the client's.
docs/performance.md ("perf_analyzer: HTTP and gRPC") holds its output.

    .venv/bin/python bench/perf_analyzer.py [--concurrency 1,2,4,8,16,32] [--models simple,mlp]
        [--requests 1000] [--rounds 1] [--budget-s 600] [--server-flags "--intra-op-threads 1"] [--async]
        [--aotc-load S] [--in-process] [--out FILE]

perf_analyzer is --perf-analyzer, else `perf_analyzer` on PATH, else /tmp/pa/perf_analyzer (the wheel
`perf-analyzer` 2.60.0 needs glibc 2.38; on Debian 12 it runs through a newer loader, docs/performance.md).
One aotc-server (bench/launch.py, with `--allow-shared-memory`) serves every cell; the packages are those
bench/serve.py uses. Each cell is one perf_analyzer run in count_windows mode (--requests a window, stability
30 %: the default 10 % rarely converges on 2 shared cores), read back from its CSV (-f); the HTTP and gRPC runs
of a cell follow each other, so drift of the machine hits both alike. With --rounds N every cell runs N times,
the cells taking turns, and the table holds medians (one run of a cell on 2 shared cores can be 25% off the
next). A cell that does not fit in what is left of --budget-s is skipped and listed. Not a test: it asserts nothing, and `make test` does not run it.

On the GPU machine (bench/gpu.sh, stage `pa`), a CUDA package given by --package NAME=PATH, at --batch N, with
--shm cuda too (inputs and outputs in CUDA shared memory regions perf_analyzer allocates), and --in-process: the
package's aotc-run p50 at that batch (host to host, the same process) beside the concurrency-1 cells, so that
what the transport adds over a call in the process shows.

--aotc-load S also loads every model over each transport with aotc-load (bench/load/), in the same rounds and
against the same server: a C++ client that takes each answer as bytes, so that its numbers are the server's
with little of the client's cost (perf_analyzer parses every answer, and its gRPC client costs more than its
HTTP one); the tensors in the body, the package's stored example at --batch rows.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launch import Server, make_repository
from serve import package

TRANSPORTS = ("http", "grpc")
SHM = ("none", "system", "cuda")
CELL_TIMEOUT_S = 120  # one perf_analyzer run; count_windows at 30 % settles in a few seconds here


def find_perf_analyzer(given: str | None) -> str:
    for c in (given, shutil.which("perf_analyzer"), "/tmp/pa/perf_analyzer"):
        if c and os.access(c, os.X_OK):
            return c
    sys.exit("perf_analyzer not found: pass --perf-analyzer PATH (see docs/performance.md, perf_analyzer: HTTP "
             "and gRPC)")


def pa_argv(pa: str, url: str, transport: str, shm: str, model: str, concurrency: int | str, requests: int,
            csv_path: str, batch: int = 1, input_data: str = "random", output_shm_bytes: int = 0,
            asynchronous: bool = False) -> list[str]:
    argv = [pa, "-m", model, "-u", url, "-i", transport, "--concurrency-range", f"{concurrency}:{concurrency}",
            "--measurement-mode", "count_windows", "--measurement-request-count", str(requests), "-s", "30",
            "-f", csv_path]
    if asynchronous:  # the client's asynchronous API: one thread drives every outstanding request
        argv.append("--async")
    if batch != 1:
        argv += ["-b", str(batch)]
    if input_data != "random":
        argv += ["--input-data", input_data]
    if shm != "none":
        argv += ["--shared-memory", shm]
        if output_shm_bytes:  # perf_analyzer's default region for each output is 100 KiB
            argv += ["--output-shared-memory-size", str(output_shm_bytes)]
    return argv


def server_cpu_s(srv: Server) -> float:
    """The server process's user + system CPU seconds so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{srv.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's waited-for children so far (perf_analyzer's runs)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def inference_count(srv: Server, model: str) -> int:
    _, st = srv.json("GET", f"/v2/models/{model}/stats")
    return sum(m["inference_count"] for m in st["model_stats"])


def run_cell(pa: str, srv: Server, transport: str, shm: str, model: str, concurrency: int, requests: int,
             timeout: float, **shape) -> dict | str:
    """-> {"throughput", "p50_us", "p99_us", "cpu_us", "client_cpu_us"} from perf_analyzer's CSV, and the
    server's and perf_analyzer's CPU time per inference over the whole run (its warm-up and windows alike), or
    why there is none. `shape`: pa_argv's batch, input_data, output_shm_bytes and asynchronous."""
    url = f"{srv.host}:{srv.port}" if transport == "http" else srv.grpc_url
    if url is None:
        return "this aotc-server has no gRPC endpoint"
    cpu0, client0, n0 = server_cpu_s(srv), children_cpu_s(), inference_count(srv, model)
    with tempfile.TemporaryDirectory(prefix="aotc-pa-") as tmp:
        out = Path(tmp) / "pa.csv"
        argv = pa_argv(pa, url, transport, shm, model, concurrency, requests, str(out), **shape)
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
                "p99_us": float(row["p99 latency"]), "cpu_us": (server_cpu_s(srv) - cpu0) * 1e6 / max(n, 1),
                "client_cpu_us": (children_cpu_s() - client0) * 1e6 / max(n, 1)}


def lean_inputs(pkg: Path, batch: int, input_data: str) -> dict:
    """{input name: array} for aotc-load: the package's stored example at `batch` rows (repeated or cut),
    zeros where `input_data` is zero, as perf_analyzer sends."""
    import numpy as np
    from aotc.manifest import read as read_manifest
    from aotc.manifest import read_samples

    xs, _ = read_samples(pkg)[0]
    out = {}
    for spec, x in zip(read_manifest(str(pkg)).inputs, xs):
        x = np.ascontiguousarray(np.resize(x, (batch, *x.shape[1:])))
        out[spec.name] = np.zeros_like(x) if input_data == "zero" else x
    return out


def run_lean(srv: Server, transport: str, model: str, inputs: dict, concurrency: int, seconds: float) -> dict | str:
    """aotc-load (bench/loadgen.py) on one cell: closed loop for `seconds` after a 1 s warm-up, the answer taken
    as bytes -> {"throughput", "p50_us", "p99_us", "cpu_us"} (the server's CPU per inference), or why none."""
    import loadgen

    if transport == "grpc" and srv.grpc_port is None:
        return "this aotc-server has no gRPC endpoint"
    cpu0, n0 = server_cpu_s(srv), inference_count(srv, model)
    try:
        if transport == "http":
            r = loadgen.http_load(srv.port, model, inputs, None, concurrency, seconds)
        else:
            r = loadgen.grpc_load(srv.grpc_port, model, inputs, None, concurrency, seconds)
    except RuntimeError as e:
        return f"aotc-load: {str(e)[-200:]}"
    if r["errors"]:
        return f"aotc-load: {r['errors']} errors ({r['error_counts']})"
    n = inference_count(srv, model) - n0
    return {"throughput": r["req_per_s"], "p50_us": r["p50_ms"] * 1e3, "p99_us": r["p99_ms"] * 1e3,
            "cpu_us": (server_cpu_s(srv) - cpu0) * 1e6 / max(n, 1)}


def lean_table(cells: dict) -> list[str]:
    rows = ["| transport | model | concurrency | infer/s | p50 us | p99 us | server CPU us/infer |",
            "|---|---|---|---|---|---|---|"]
    for (transport, model, c), r in cells.items():
        rows.append(f"| {transport} | {model} | {c} | {r['throughput']:.0f} | {r['p50_us']:.0f} | {r['p99_us']:.0f} | "
                    f"{r['cpu_us']:.1f} |")
    return rows


def table(cells: dict) -> list[str]:
    rows = ["| transport | shm | model | concurrency | infer/s | p50 us | p99 us | server CPU us/infer | "
            "perf_analyzer CPU us/infer |", "|---|---|---|---|---|---|---|---|---|"]
    for (transport, shm, model, c), r in cells.items():
        rows.append(f"| {transport} | {shm} | {model} | {c} | {r['throughput']:.0f} | {r['p50_us']:.0f} | "
                    f"{r['p99_us']:.0f} | {r['cpu_us']:.1f} | {r['client_cpu_us']:.1f} |")
    return rows


def comparison(cells: dict, models: list[str], concurrency: list[int], shms=SHM) -> list[str]:
    """gRPC against HTTP per model and shm: throughput at the highest concurrency (target: >= 1.0x) and p50 at
    the lowest (target: gRPC at most HTTP + 20 us)."""
    hi, lo = max(concurrency), min(concurrency)
    out = []
    for model in models:
        for shm in shms:
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


def output_bytes(pkg: Path, batch: int) -> tuple[int, int]:
    """(largest, total) bytes of the package's outputs at `batch` rows, from its manifest."""
    import numpy as np
    from aotc.manifest import read as read_manifest

    sizes = []
    for o in read_manifest(str(pkg)).outputs:
        dims = list(o.shape[1:])
        if any(d < 0 for d in dims):
            raise SystemExit(f"{pkg}: output {o.name} has a dynamic dim past the batch; give shapes to perf_analyzer")
        n = batch
        for d in dims:
            n *= d
        sizes.append(n * np.dtype(o.dtype).itemsize)
    return max(sizes), sum(sizes)


def in_process(cells: dict, inproc: dict, answers: dict, lo: int, limit_us: float = 150,
               limit_bytes: int = 256 << 10) -> list[str]:
    """Each transport's concurrency-1 p50 (every shm) against the call in the process (aotc-run), with the
    GPU target: at most +150 us where the answer is at most 256 KiB."""
    out = []
    for (transport, shm, model, c), r in cells.items():
        if c != lo or model not in inproc:
            continue
        diff = r["p50_us"] - inproc[model]
        target = ""
        if answers[model] <= limit_bytes and shm == "none":
            target = f" ({'meets' if diff <= limit_us else 'misses'} <= +{limit_us:.0f} us for an answer of " \
                     f"{answers[model] / 1024:.0f} KiB)"
        out.append(f"- {model}, {transport}, shm {shm}: p50 {r['p50_us']:.0f} us, {diff:+.0f} us over the call in "
                   f"the process ({inproc[model]:.0f} us){target}")
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
    ap.add_argument("--package", action="append", default=[], metavar="NAME=PATH",
                    help="serve this package as model NAME instead of --models (repeatable)")
    ap.add_argument("--shm", default="none,system", help="comma-separated, of none, system, cuda (default "
                    "none,system)")
    ap.add_argument("--transports", default="http,grpc", help="comma-separated (default http,grpc)")
    ap.add_argument("--batch", type=int, default=1, help="perf_analyzer's -b (default 1)")
    ap.add_argument("--input-data", default="random", help="perf_analyzer's --input-data (default random; "
                    "zero for token ids)")
    ap.add_argument("--async", dest="asynchronous", action="store_true",
                    help="perf_analyzer's --async, for both transports (default: its synchronous API, a thread "
                    "per outstanding request)")
    ap.add_argument("--in-process", action="store_true",
                    help="also time each package's call in the process (aotc-run --bench) at --batch")
    ap.add_argument("--aotc-load", type=float, default=0, metavar="S",
                    help="also load each model over each transport for S seconds with aotc-load, a client that "
                    "takes the answer as bytes (tensors in the body, --batch rows of the package's stored "
                    "example), in the same rounds: what the server adds, with little of the client's cost "
                    "(default 0: not run)")
    ap.add_argument("--requests", type=int, default=1000,
                    help="perf_analyzer's --measurement-request-count: requests a window (default 1000)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every cell this many times, the cells taking turns in each round; the table holds "
                    "each column's median over the rounds (default 1)")
    ap.add_argument("--budget-s", type=float, default=600, help="the whole run's bound in seconds (default 600)")
    ap.add_argument("--server-flags", default="--intra-op-threads 1",
                    help="more aotc-server flags (default: --intra-op-threads 1, as the other CPU benchmarks; "
                    "'' for none)")
    ap.add_argument("--out", type=Path, help="also write the Markdown there")
    args = ap.parse_args()

    pa = find_perf_analyzer(args.perf_analyzer)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    given = {}
    for p in args.package:
        name, sep, path = p.partition("=")
        if not sep or not name or not Path(path).is_file():
            sys.exit(f"--package takes NAME=PATH of a package file, got '{p}'")
        given[name] = Path(path)
    models = list(given) or args.models.split(",")
    shms = args.shm.split(",")
    transports = args.transports.split(",")
    for what, vals, allowed in (("--shm", shms, SHM), ("--transports", transports, TRANSPORTS)):
        if not set(vals) <= set(allowed):
            sys.exit(f"{what} takes a comma-separated list of {', '.join(allowed)}, got '{','.join(vals)}'")
    packages = given or {m: package(m) for m in models}
    answers = {m: output_bytes(p, args.batch) for m, p in packages.items()}
    inproc = {}
    if args.in_process:
        import numpy as np
        from aotc.manifest import read_samples
        from loadgen import aotc_run_p50_us

        with tempfile.TemporaryDirectory(prefix="aotc-pa-") as tmp:
            for m, p in packages.items():
                (x, *rest), _ = read_samples(p)[0]
                if rest:
                    sys.exit(f"--in-process times one-input packages; {m} takes {1 + len(rest)}")
                x = np.ascontiguousarray(np.resize(x, (args.batch, *x.shape[1:])))
                inproc[m] = aotc_run_p50_us(p, x, Path(tmp), 2000, 100)
                print(f"in process: {m} batch {args.batch} p50 {inproc[m]:.0f} us", file=sys.stderr, flush=True)
    t_end = time.monotonic() + args.budget_s
    v = subprocess.run([pa, "--version"], capture_output=True, text=True)
    version = (v.stdout + v.stderr).strip().splitlines()[:1]
    flags = ["--allow-shared-memory", *args.server_flags.split()]
    if args.rounds < 1:
        sys.exit(f"--rounds takes a count of at least 1, got {args.rounds}")
    lean_in = {m: lean_inputs(p, args.batch, args.input_data) for m, p in packages.items()} if args.aotc_load else {}
    runs, lean_runs, skipped = {}, {}, []
    with tempfile.TemporaryDirectory(prefix="aotc-pa-") as tmp:
        repo = make_repository(Path(tmp) / "repo", packages, link=True)
        with Server("cpp", repo, *flags) as srv:
            for rnd in range(args.rounds):
                for model in models:
                    for shm in shms:
                        for c in concurrency:
                            for transport in transports:
                                left = t_end - time.monotonic()
                                key = (transport, shm, model, c)
                                if left < 5:
                                    skipped.append(f"{key} round {rnd + 1}: out of --budget-s")
                                    continue
                                r = run_cell(pa, srv, transport, shm, model, c, args.requests,
                                             min(CELL_TIMEOUT_S, left), batch=args.batch,
                                             input_data=args.input_data, output_shm_bytes=answers[model][0],
                                             asynchronous=args.asynchronous)
                                if isinstance(r, str):
                                    skipped.append(f"{key} round {rnd + 1}: {r}")
                                else:
                                    runs.setdefault(key, []).append(r)
                                print(f"round {rnd + 1} {transport:4} shm {shm:6} {model:6} c={c:<3} {r}",
                                      file=sys.stderr, flush=True)
                                if srv.proc.poll() is not None:
                                    sys.exit(f"aotc-server exited {srv.proc.returncode}:\n{srv.log()[-2000:]}")
                    for c in concurrency if args.aotc_load else ():
                        for transport in transports:
                            key = (transport, model, c)
                            if t_end - time.monotonic() < args.aotc_load + 10:
                                skipped.append(f"aotc-load {key} round {rnd + 1}: out of --budget-s")
                                continue
                            r = run_lean(srv, transport, model, lean_in[model], c, args.aotc_load)
                            if isinstance(r, str):
                                skipped.append(f"aotc-load {key} round {rnd + 1}: {r}")
                            else:
                                lean_runs.setdefault(key, []).append(r)
                            print(f"round {rnd + 1} {transport:4} aotc-load   {model:6} c={c:<3} {r}",
                                  file=sys.stderr, flush=True)
    cells = {key: {col: statistics.median(r[col] for r in rs) for col in rs[0]} for key, rs in runs.items()}
    cmd = " ".join(pa_argv("perf_analyzer", "127.0.0.1:PORT", "{http,grpc}", "none", "MODEL", "C", args.requests,
                           "F.csv", args.batch, args.input_data, asynchronous=args.asynchronous))
    lines = [f"Measured on {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}, "
             f"{version[0] if version else 'perf_analyzer'}; aotc-server {' '.join(flags)}.",
             f"Each cell: `{cmd} [--shared-memory {{{','.join(s for s in shms if s != 'none')}}} "
             f"--output-shared-memory-size BYTES]`."
             + (f" Medians of {args.rounds} rounds, the cells taking turns in each." if args.rounds > 1 else ""),
             "", *table(cells), "",
             *comparison(cells, models, concurrency, shms)]
    if inproc:
        lines += ["", f"In the process: aotc-run --bench 2000 at batch {args.batch}, host to host, p50 "
                  + ", ".join(f"{m} {us:.0f} us" for m, us in inproc.items()) + ".",
                  *in_process(cells, inproc, {m: a[1] for m, a in answers.items()}, min(concurrency))]
    if lean_runs:
        lean = {key: {col: statistics.median(r[col] for r in rs) for col in rs[0]} for key, rs in lean_runs.items()}
        as_cells = {(t, "none", m, c): r for (t, m, c), r in lean.items()}
        lines += ["", f"aotc-load, the tensors in the body, {args.aotc_load:g} s a cell after a 1 s warm-up "
                  "(bench/loadgen.py's http_load and grpc_load), in the same rounds:", "", *lean_table(lean), "",
                  *comparison(as_cells, models, concurrency, ("none",))]
        if inproc:
            lines += in_process(as_cells, inproc, {m: a[1] for m, a in answers.items()}, min(concurrency))
    if skipped:
        lines += ["", "Not measured:", *[f"- {s}" for s in skipped]]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
