"""Warm-up: the first requests a new version answers after a hot reload under load, with the server's warm-up
before READY (config.json without model_warmup: the package's first sample on every runner and CUDA-graph
bucket) and without it (model_warmup: []), side by side in one run.

    .venv/bin/python bench/warmup.py --package PKG [--clients 8] [--batches 1,2,4,8] [--seconds 4] [--rounds 3]

For each setting and round: aotc-server (bench/launch.py; AOTC_SERVER_BIN picks the binary) with
--poll-repository 1 serves version 1 of PKG to `--clients` closed-loop clients (raw HTTP, binary tensors,
each request's batch drawn from `--batches`, so every bucket is hit), for `--seconds`; then version 2 (the
same package) is renamed into the repository, and the clients go on until version 2 has answered 200
requests and `--seconds` more. Reported: the steady p50/p99 of version 1, the max and p99 of version 2's
first 200 answers, and their ratio to the steady p99 (the target: the first 200's max at most 2x). Not a
test: nothing is asserted. Threads; one server at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from launch import Server, make_repository
from soak import read_answer


def request_bytes(x: np.ndarray, name: str, dtype: str, host: str) -> bytes:
    header = json.dumps({"inputs": [{"name": name, "shape": list(x.shape), "datatype": dtype,
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    body = header + x.tobytes()
    return (f"POST /v2/models/m/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def client(server: Server, bodies: list[bytes], stop: threading.Event, out: list, seed: int) -> None:
    """A closed loop of requests on one keep-alive connection; appends (end time, ms, status, version)."""
    rng = random.Random(seed)
    sock = socket.create_connection((server.host, server.port), timeout=120)
    buf = bytearray()
    while not stop.is_set():
        t0 = time.perf_counter()
        sock.sendall(rng.choice(bodies))
        status, body = read_answer(sock, buf)
        t1 = time.perf_counter()
        version = re.search(rb'"model_version":\s*"([^"]*)"', body[:512])
        out.append((t1, (t1 - t0) * 1e3, status, version.group(1).decode() if version else "?"))
    sock.close()


def run_round(pkg: Path, config: dict, clients: int, batches: list[int], seconds: float, seed: int) -> dict:
    from aotc.manifest import read

    m = read(str(pkg))
    spec = m.inputs[0]
    dtype = {"float32": "FP32", "float16": "FP16", "int64": "INT64", "int32": "INT32"}[spec.dtype]
    rng = np.random.default_rng(seed)
    root = Path(tempfile.mkdtemp(prefix="aotc-warmup-"))
    repo = make_repository(root / "repo", {"m": pkg}, {"m": config})
    with Server("cpp", repo, "--poll-repository", "1") as server:
        bodies = []
        for b in batches:
            shape = [b] + [lo for lo, _ in spec.ranges[1:]]
            x = (rng.integers(0, 1000, shape) if dtype.startswith("INT") else rng.standard_normal(shape)).astype(
                {"FP32": np.float32, "FP16": np.float16, "INT64": np.int64, "INT32": np.int32}[dtype])
            bodies.append(request_bytes(x, spec.name, dtype, server.host))
        stop, results = threading.Event(), []
        threads = [threading.Thread(target=client, args=(server, bodies, stop, results, seed + i), daemon=True)
                   for i in range(clients)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        staged = root / "v2"
        staged.mkdir()
        shutil.copyfile(pkg, staged / "model.pt2")
        os.rename(staged, repo / "m" / "2")  # whole, as docs/server.md says to install a version
        deadline = time.monotonic() + 600
        while sum(1 for r in list(results) if r[3] == "2") < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join(60)
    v1 = [ms for _, ms, st, v in results if v == "1" and st == 200]
    v2 = [ms for _, ms, st, v in sorted(results) if v == "2" and st == 200]
    steady = float(np.percentile(v1[len(v1) // 5:], 99))  # the first fifth is the server's own start
    first = v2[:200]
    return {"v1_p50": statistics.median(v1), "v1_p99": steady, "first200_max": max(first),
            "first200_p99": float(np.percentile(first, 99)), "ratio": max(first) / steady,
            "errors": sum(1 for r in results if r[2] != 200)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--package", required=True, help="the package served as versions 1 and 2")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--batches", default="1,2,4,8", help="request batch sizes, drawn at random (default 1,2,4,8)")
    p.add_argument("--seconds", type=float, default=4.0, help="load before and after the reload (default 4)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="also write the table (markdown) here")
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    settings = {"warm-up (default)": {"max_batch_size": max(batches)},
                "no warm-up (model_warmup: [])": {"max_batch_size": max(batches), "model_warmup": []}}
    rows = []
    for r in range(args.rounds):
        for label, config in settings.items():  # in turns, so drift falls on both alike
            res = run_round(Path(args.package), config, args.clients, batches, args.seconds, 1000 * r)
            rows.append((label, r, res))
            print(f"{label:<32} round {r}: steady p50 {res['v1_p50']:.3f} p99 {res['v1_p99']:.3f} ms; first 200 "
                  f"after reload: max {res['first200_max']:.3f} p99 {res['first200_p99']:.3f} ms "
                  f"({res['ratio']:.2f}x steady p99), errors {res['errors']}", flush=True)
    lines = ["| setting | steady p50 ms | steady p99 ms | first 200: max ms | first 200: p99 ms | max / steady p99 |",
             "|---|---|---|---|---|---|"]
    for label in settings:
        mine = [res for lab, _, res in rows if lab == label]
        med = {k: statistics.median(x[k] for x in mine) for k in mine[0]}
        lines.append(f"| {label} | {med['v1_p50']:.3f} | {med['v1_p99']:.3f} | {med['first200_max']:.3f} | "
                     f"{med['first200_p99']:.3f} | {med['ratio']:.2f}x |")
    text = "\n".join([f"`{' '.join(sys.argv)}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                      f"{platform.node()}, {os.cpu_count()} cores (medians of {args.rounds} rounds)", "", *lines])
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
