"""What a request costs each side, thread by thread: aotc-server serves each --package, aotc-load loads each at
concurrency 1 over HTTP and over gRPC, and the tables give, per request, the p50, the CPU time (user + system,
from /proc/PID/task/TID/stat) and the context switches (voluntary + involuntary, from .../status) of each of
the server's threads, grouped by thread name, and aotc-load's own CPU and switches (its rusage). What it is
for: telling which end, and which thread, a transport's extra latency lies on (docs/performance.md, What a
gRPC call costs each side, and busy polling).

    .venv/bin/python bench/thread_cpu.py --package NAME=PKG|MODEL [--package ...] [--batch 1] [--seconds 3]
        [--rounds 2] [--server-flags "..." ...] [--load-flags "..." ...] [--layout apart] [--in-process]
        [--floor] [--out FILE]

Each --server-flags is a server setting; in every round each setting starts one server per package in turn,
which is loaded over both transports with each --load-flags (aotc-load's own, e.g. --busy-poll) and stopped,
so that drift of the machine hits all alike (medians over the rounds). A package has a server to itself
because a CUDA model's graph ran 10% longer on the device with other packages loaded beside it
(docs/performance.md, Inside the server); --layout together serves them all from one server, to measure that
(both: each layout in turn, side by side in the tables). The server's threads are read just before and just
after each load (aotc-load's 1 s warm-up runs before the first read). A thread started by another carries its
name: OpenMP's workers (a team per thread that calls the model) are counted with the thread that started them.
--in-process adds the package's `aotc-run --bench` p50 at the same batch (one-input packages), the floor the
transports add to. --floor (with --in-process) adds, per round and package, aotc-load against its own loopback
responder over each transport (bench/loopback.py: a process of its own; over gRPC one raw unary method on a
completion queue, as aotc-server serves ModelInfer), answering as many bytes as the server did after spinning
for the in-process time: what each transport's library alone adds to a call that long, with no server work,
so that the rest of a transport's gap over in-process is the server's own. With AOTC_CUDA_TIMING=N in the environment (the CUDA runtime's phase means every N replayed
calls, docs/runtime.md) a last table gives, per transport, the means the server logged during each load:
whether the model's call itself takes longer when the transport leaves the GPU idle longer between calls. Not
a test: it asserts nothing, and `make test` does not run it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import resource
import shlex
import statistics
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import loadgen
from launch import Server, make_repository
from perf_analyzer import inference_count, lean_inputs, machine
from serve import package

TICK = os.sysconf("SC_CLK_TCK")
FLOOR = "floor: aotc-load's responder"  # --floor's rows, in the server flags column


def threads(pid: int) -> dict[int, tuple[str, float, int]]:
    """{tid: (name, CPU seconds, context switches)} of every live thread of `pid`."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except OSError:  # the thread ended between the listing and the read
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        switches = sum(int(m) for m in re.findall(r"^(?:non)?voluntary_ctxt_switches:\s+(\d+)", status, re.M))
        out[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / TICK, switches)
    return out


def by_name(before: dict, after: dict, n: int) -> dict[str, tuple[float, float]]:
    """{thread name: (CPU us per request, switches per request)} over the threads alive at the end."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for tid, (name, cpu, sw) in after.items():
        _, cpu0, sw0 = before.get(tid, (name, 0.0, 0))
        sums[name][0] += (cpu - cpu0) * 1e6 / n
        sums[name][1] += (sw - sw0) / n
    return {k: (v[0], v[1]) for k, v in sums.items()}


CUDA_TIMING = re.compile(r"aotc cuda timing: (\d+) calls, .*\(call ([\d.]+)\), idle before ([\d.]+); "
                         r"on the device: copy-in [\d.]+, graph ([\d.]+)")


def cuda_timing(log: str) -> dict | None:
    """The call-weighted means of the AOTC_CUDA_TIMING lines in `log`: {"call", "idle", "graph"} us (host call,
    host idle before the call, the graph on the device), or None where there are none."""
    rows = [(int(m[1]), float(m[2]), float(m[3]), float(m[4])) for m in CUDA_TIMING.finditer(log)]
    n = sum(r[0] for r in rows)
    if not n:
        return None
    return {k: sum(r[0] * r[i] for r in rows) / n for i, k in ((1, "call"), (2, "idle"), (3, "graph"))}


def load_once(srv: Server, transport: str, model: str, x: dict, seconds: float, load_flags: str) -> dict:
    """One aotc-load run at concurrency 1 (bench/loadgen.py, 1 s of warm-up) with the server's threads read
    around its measured part (and the server's log, for AOTC_CUDA_TIMING's lines)."""
    load = loadgen.http_load if transport == "http" else loadgen.grpc_load
    port = srv.port if transport == "http" else srv.grpc_port
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(load, port, model, x, None, 1, seconds, load_flags=shlex.split(load_flags))
        time.sleep(1.0)  # aotc-load's warm-up
        before, n0 = threads(srv.proc.pid), inference_count(srv, model)
        logged = srv.log_path.stat().st_size
        r = running.result(timeout=seconds + 180)
    after, n1 = threads(srv.proc.pid), inference_count(srv, model)
    with open(srv.log_path, "rb") as f:
        f.seek(logged)
        timing = cuda_timing(f.read().decode(errors="replace"))
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    n = max(n1 - n0, 1)
    # aotc-load's whole run, warm-up included, over its requests (warm-up ones counted by the server too)
    client_s = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    client_switches = (ru1.ru_nvcsw + ru1.ru_nivcsw) - (ru0.ru_nvcsw + ru0.ru_nivcsw)
    made = max(r["requests"] * (seconds + 1) / seconds, 1)
    return {"p50_us": r["p50_ms"] * 1e3, "req_per_s": r["req_per_s"], "answer_bytes": r["answer_bytes"],
            "threads": by_name(before, after, n),
            "client_us": client_s * 1e6 / made, "client_switches": client_switches / made, "cuda": timing}


def floor_once(transport: str, answer_bytes: int, spin_us: float, seconds: float, load_flags: str) -> dict:
    """aotc-load against its own loopback responder (bench/loopback.py) over `transport`, answering
    `answer_bytes` after spinning `spin_us`: what the transport's library alone adds to a call of that length."""
    r = loadgen.loopback_load(answer_bytes, seconds, grpc=transport == "grpc", spin_us=round(spin_us),
                              load_flags=shlex.split(load_flags))
    return {"p50_us": r["p50_ms"] * 1e3}


def in_process_us(pkgs: dict[str, Path], inputs: dict[str, dict], tmp: Path) -> dict[str, float]:
    """{model: aotc-run's p50 us on its `inputs`} for the one-input packages."""
    out = {}
    for name, pkg in pkgs.items():
        x, *rest = inputs[name].values()
        if not rest:
            out[name] = loadgen.aotc_run_p50_us(pkg, x, tmp, 2000, 100)
    return out


def report(name: str, runs: dict, configs: list[tuple[str, str]], inproc: float | None) -> list[str]:
    """One model's section: a row per configuration and transport (and per --floor run: server flags
    FLOOR), then each configuration's threads."""
    def med(rs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rs)

    over = "" if inproc is None else f" (in the process, aotc-run: {inproc:.0f} us)"
    lines = [f"## {name}", "", f"p50 and CPU per request{over}:", "",
             "| server flags | aotc-load flags | transport | p50 us | over in-process | server CPU us | client CPU us "
             "| client switches |", "|---|---|---|---|---|---|---|---|"]
    for c in configs:
        for t in ("http", "grpc"):
            rs = runs[name, c, t]
            server = statistics.median(sum(v[0] for v in r["threads"].values()) for r in rs)
            gap = "" if inproc is None else f"{med(rs, 'p50_us') - inproc:+.0f} us"
            lines.append(f"| {c[0] or '(none)'} | {c[1] or '(none)'} | {t} | {med(rs, 'p50_us'):.0f} | {gap} | "
                         f"{server:.1f} | {med(rs, 'client_us'):.1f} | {med(rs, 'client_switches'):.2f} |")
    for lf in dict.fromkeys(c[1] for c in configs):
        for t in ("http", "grpc"):
            if rs := runs.get((name, (FLOOR, lf), t)):
                lines.append(f"| {FLOOR} | {lf or '(none)'} | {t} | {med(rs, 'p50_us'):.0f} | "
                             f"{med(rs, 'p50_us') - round(inproc):+.0f} us | | | |")
    for c in configs:
        names = sorted({k for t in ("http", "grpc") for r in runs[name, c, t] for k in r["threads"]})
        rows = []
        for k in names:
            cells = [(statistics.median(r["threads"].get(k, (0.0, 0.0))[0] for r in runs[name, c, t]),
                      statistics.median(r["threads"].get(k, (0.0, 0.0))[1] for r in runs[name, c, t]))
                     for t in ("http", "grpc")]
            if max(x[0] for x in cells) >= 0.5 or max(x[1] for x in cells) >= 0.05:
                rows.append(f"| {k} | {cells[0][0]:.1f} | {cells[0][1]:.2f} | {cells[1][0]:.1f} | {cells[1][1]:.2f} |")
        lines += ["", f"Server threads, server flags {c[0] or '(none)'}, aotc-load flags {c[1] or '(none)'}:", "",
                  "| thread | HTTP CPU us/req | HTTP switches/req | gRPC CPU us/req | gRPC switches/req |",
                  "|---|---|---|---|---|", *rows]
    timed = [(c, t, [r["cuda"] for r in runs[name, c, t] if r["cuda"]]) for c in configs for t in ("http", "grpc")]
    if any(ts for _, _, ts in timed):
        lines += ["", "The model's call in the server (AOTC_CUDA_TIMING means; medians over the rounds):", "",
                  "| server flags | aotc-load flags | transport | host call us | idle before us | graph on the device us |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {c[0] or '(none)'} | {c[1] or '(none)'} | {t} | "
                  + " | ".join(f"{statistics.median(x[k] for x in ts):.1f}" for k in ("call", "idle", "graph")) + " |"
                  for c, t, ts in timed if ts]
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", action="append", required=True, metavar="NAME=PKG or MODEL")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--server-flags", action="append", metavar="FLAGS",
                    help="aotc-server's flags; several: one server each, taking turns in every round")
    ap.add_argument("--load-flags", action="append", metavar="FLAGS",
                    help="more aotc-load flags (--busy-poll); several: each in turn against every server")
    ap.add_argument("--layout", choices=("apart", "together", "both"), default="apart",
                    help="a server per package (apart), one for all (together), or each in turn (both)")
    ap.add_argument("--in-process", action="store_true")
    ap.add_argument("--floor", action="store_true",
                    help="with --in-process: also aotc-load's loopback responder over each transport, answering as "
                         "many bytes as the server after spinning for the in-process time")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    layouts = ("apart", "together") if a.layout == "both" else (a.layout,)
    if a.floor and not a.in_process:
        ap.error("--floor spins for the in-process time: give --in-process too")

    def label(sf: str, layout: str) -> str:  # a server setting as the tables name it
        return f"{sf} [{layout}]".strip() if a.layout == "both" else sf

    configs = [(label(sf, lay), lf) for sf in a.server_flags or [""] for lay in layouts for lf in a.load_flags or [""]]
    # NAME=PKG, or a model of models/ by name (bench/serve.py exports it once)
    pkgs = {p.split("=", 1)[0]: Path(p.split("=", 1)[1]) if "=" in p else package(p) for p in a.package}
    lines = [f"# What a request costs each side, concurrency 1, batch {a.batch}",
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, {machine()}; "
             f"medians of {a.rounds} rounds of {a.seconds:g} s; "
             + {"apart": "each package in a server of its own", "together": "every package in one server",
                "both": "each package in a server of its own [apart] and every package in one [together], in turn"}
             [a.layout], ""]
    with tempfile.TemporaryDirectory(prefix="thread-cpu-") as tmp:
        groups = {"apart": [[name] for name in pkgs], "together": [list(pkgs)]}  # the packages of each server
        repos = {lay: [(g, make_repository(Path(tmp) / f"{lay}{i}", {n: pkgs[n] for n in g}))
                       for i, g in enumerate(groups[lay])] for lay in layouts}
        inputs = {name: lean_inputs(pkg, a.batch, "zero") for name, pkg in pkgs.items()}
        inproc = in_process_us(pkgs, inputs, Path(tmp)) if a.in_process else {}
        # the servers of a round, in turn: (their flags, the setting's label in the tables, packages, repository)
        servers = [(sf, label(sf, lay), group, repo)
                   for sf in a.server_flags or [""] for lay in layouts for group, repo in repos[lay]]
        runs: dict[tuple, list[dict]] = defaultdict(list)  # (model, (server setting, load flags), transport)
        for _ in range(a.rounds):
            for server_flags, setting, group, repo in servers:
                with Server("cpp", repo, *shlex.split(server_flags)) as srv:
                    for c in (c for c in configs if c[0] == setting):
                        for name in group:
                            for t in ("http", "grpc"):
                                runs[name, c, t].append(load_once(srv, t, name, inputs[name], a.seconds, c[1]))
            for name, us in inproc.items() if a.floor else ():
                for lf in dict.fromkeys(c[1] for c in configs):
                    for t in ("http", "grpc"):
                        answer = runs[name, configs[0], t][-1]["answer_bytes"]
                        runs[name, (FLOOR, lf), t].append(floor_once(t, answer, us, a.seconds, lf))
        for name in pkgs:
            lines += report(name, runs, configs, inproc.get(name))
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
