"""The most any serving configuration could reach on this machine, measured, for bench/tune_targets.py.

Two ceilings, each measured here and now:
- **The model alone**: aotc-run on each export variant's package (no server, no client, no sockets) at batches
  8, 16, 32 and 64 (as far as the package's batch range goes), with one runner and with several (on CPU one
  per core, each of one intra-op thread; on CUDA two): the best rows per second. No server can turn rows
  faster than the model alone does on the same machine. A closed loop of C clients has at most C requests'
  rows in flight (`in_flight`), so settings whose runners together hold more rows than that are not measured:
  at concurrency 32 two runners hold at most 16 rows each.
- **The requests alone** (CPU): the CPU time per request, server and client together, of a model with no
  compute (`--floor-model`, models/simple.py) served with the server's defaults at the same concurrency by the
  same load generator. Every request of the real model costs at least that, plus the model's own CPU time per
  row (aotc-run's at each variant's best setting, the load of the package taken out by timing N and 2N
  calls). With every core busy all the time, a request then takes at least (floor + compute) / cores of the
  machine: the bound on CPU is cores / (floor + compute). On CUDA the model runs on the device: the bound is
  the lower of the two ceilings.

Not a benchmark on its own; asserts nothing.
"""

from __future__ import annotations

import os

import numpy as np

from aotc import manifest as manifest_mod
from aotc.tune import _Server, load, sample_body
from loadgen import aotc_run_stats, server_stats
from perf_analyzer import children_cpu_s, server_cpu_s


def _aotc_run(pkg: str, files: list[str], calls: int, runners: int, env: dict) -> tuple[float, float]:
    """(calls per second, the process's CPU seconds) of one `aotc-run --bench` on `runners` threads."""
    before = children_cpu_s()
    stats = aotc_run_stats(pkg, files, calls, 3, ["--threads", str(runners)], env)
    return stats["calls_per_s"], children_cpu_s() - before


def _batches(m, runners: int, in_flight: int | None) -> list[int]:
    """The batches measured with `runners` runners: 8, 16, 32 and 64, none above the package's largest batch or
    above the rows each runner can hold when `in_flight` rows are outstanding in all; [0] (the sample as it is)
    for a package without a batch dim."""
    if not m.batch:
        return [0]
    top = m.batch.max if in_flight is None else min(m.batch.max, max(in_flight // runners, 1))
    return sorted({min(b, top) for b in (8, 16, 32, 64)})


def model_alone(pkgs: dict[str, str], device: str, tmp: str, seconds: float = 1.5, say=print,
                in_flight: int | None = None) -> dict:
    """{"rows_per_s", "label", "cpu_us_per_row"} over the packages {variant: path}: the best throughput in
    aotc-run, and (CPU) the CPU time a row took at each variant's best setting, the least of them. in_flight:
    the most rows outstanding at once (concurrency x request batch); None: no limit."""
    cores = os.cpu_count() or 1
    splits = [(1, {})] + ([(cores, {"OMP_NUM_THREADS": "1"})] if device == "cpu" else [(2, {})])
    best = {"rows_per_s": 0.0, "label": "", "cpu_us_per_row": float("inf")}
    for variant, pkg in pkgs.items():
        m = manifest_mod.read(pkg)
        ins, _ = manifest_mod.read_samples(pkg, m)[0]
        top = (0.0, None)  # this variant's best rate: (rows/s, (files, calls, runners, env, rows))
        inputs: dict[int, list[str]] = {}  # batch -> the .npy files, written once for every runner count
        for runners, env in splits:
            for b in _batches(m, runners, in_flight):
                if b not in inputs:
                    inputs[b] = [os.path.join(tmp, f"alone_{variant}_b{b}_{i}.npy") for i in range(len(ins))]
                    for f, x in zip(inputs[b], ins):
                        np.save(f, np.ascontiguousarray(np.resize(x, (b, *x.shape[1:])) if b else x))
                files = inputs[b]
                rows = b or 1  # a package without a batch dim: one request per call
                rate, _ = _aotc_run(pkg, files, 5, runners, env)  # calibration: how many calls fill `seconds`
                n = max(10, int(rate * seconds))
                rate, cpu_n = _aotc_run(pkg, files, n, runners, env)
                label = f"{variant}, batch {rows}, {runners} runner(s)" + (", 1 thread each" if env else "")
                say(f"  model alone, {label}: {rate * rows:.0f} rows/s")
                if rate * rows > top[0]:
                    top = (rate * rows, (files, n, runners, env, rows, cpu_n, label))
        files, n, runners, env, rows, cpu_n, label = top[1]
        if top[0] > best["rows_per_s"]:
            best.update(rows_per_s=top[0], label=label)
        if device == "cpu":  # N more calls at its best setting: their CPU time, without the package's load
            _, cpu_2n = _aotc_run(pkg, files, 2 * n, runners, env)
            best["cpu_us_per_row"] = min(best["cpu_us_per_row"], max(cpu_2n - cpu_n, 0.0) / (n * rows) * 1e6)
    return best


def requests_alone(pkg: str, concurrency: int, tmp: str, seconds: float = 4.0) -> dict:
    """{"req_per_s", "cpu_us_per_req"}: `pkg` (a model with no compute) served with the server's defaults at
    `concurrency` by aotc-load; the CPU time of the server and of aotc-load per request."""
    body = os.path.join(tmp, "floor_body")
    headers = sample_body(pkg, 1, body)
    server = _Server(os.path.join(tmp, "floor_repo"), {"m": (pkg, None)}, [])
    try:
        load(server.port, "m", body, headers, concurrency, 1.0)  # connections made, first calls done
        s0, c0, n0 = server_cpu_s(server), children_cpu_s(), server_stats(server.port, "m")["success"]["count"]
        r = load(server.port, "m", body, headers, concurrency, seconds)
        cpu = server_cpu_s(server) - s0 + children_cpu_s() - c0
        # every request the server answered, aotc-load's warm-up among them, against the CPU they took
        requests = server_stats(server.port, "m")["success"]["count"] - n0
    finally:
        server.stop()
    return {"req_per_s": r["req_per_s"], "cpu_us_per_req": cpu / max(requests, 1) * 1e6}


def bound(device: str, alone: dict, floor: dict | None) -> float:
    """Requests per second that no configuration can pass (batch-1 requests)."""
    cores = os.cpu_count() or 1
    if device == "cpu" and floor:
        return min(alone["rows_per_s"], cores * 1e6 / (floor["cpu_us_per_req"] + alone["cpu_us_per_row"]))
    return min(alone["rows_per_s"], cores * 1e6 / floor["cpu_us_per_req"]) if floor else alone["rows_per_s"]
