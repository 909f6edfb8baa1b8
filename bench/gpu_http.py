"""HTTP load for bench/gpu_models.py: aotc-server on a repository of packages, and a closed-loop client for
the Open Inference Protocol with binary tensors (one prebuilt body, replayed).

`http_load` runs 1 connection in one process, or 32 connections in 8 spawned processes of 4 threads, so the
Python client does not cap the server's throughput; each connection waits for its answer before sending
again. Requests started in the first 2 s (process start-up) are not counted. Not a test; asserts nothing.
`Server` starts aotc-server on a free port and stops it on close(); not thread-safe.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path


def infer_body(x, name: str) -> tuple[bytes, dict]:
    import numpy as np

    arr = np.ascontiguousarray(x.numpy())
    dt = {"float32": "FP32", "int64": "INT64", "float16": "FP16"}[str(arr.dtype)]
    header = json.dumps({"inputs": [{"name": name, "shape": list(arr.shape), "datatype": dt,
                                     "parameters": {"binary_data_size": arr.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return header + arr.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def _client(port, path, body, headers, t_from, deadline, out_q, n_threads):
    """One client process: n_threads keep-alive connections posting `body` until `deadline` (time.time());
    requests that start before `t_from` warm up and are not counted."""
    lat, errors = [], []

    def connect():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def loop():
        conn = connect()
        while time.time() < deadline:
            t0 = time.perf_counter()
            try:
                conn.request("POST", path, body, headers)
                resp = conn.getresponse()
                resp.read()
                if resp.status != 200:
                    errors.append(resp.status)
                    continue
            except (http.client.HTTPException, OSError) as e:
                errors.append(type(e).__name__)
                conn.close()
                conn = connect()
                continue
            if time.time() - (time.perf_counter() - t0) >= t_from:
                lat.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=loop) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out_q.put((lat, errors[:5], len(errors)))


def http_load(port, model, x, input_name, concurrency, seconds) -> dict:
    body, headers = infer_body(x, input_name)
    path = f"/v2/models/{model}/infer"
    procs_n = 1 if concurrency == 1 else 8
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    t_from = time.time() + 2.0  # the processes need about a second to start
    deadline = t_from + seconds
    procs = [ctx.Process(target=_client, args=(port, path, body, headers, t_from, deadline, q, concurrency // procs_n))
             for _ in range(procs_n)]
    for p in procs:
        p.start()
    results = [q.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    lat = sorted(v for r in results for v in r[0])
    n_err = sum(r[2] for r in results)
    if not lat:
        raise RuntimeError(f"no successful request; errors {[r[1] for r in results]}")
    return {"p50_ms": statistics.median(lat) * 1e3, "req_per_s": len(lat) / seconds, "errors": n_err}


class Server:
    """aotc-server on a repository of symlinked packages; stopped on exit."""

    def __init__(self, models: dict[str, tuple[Path, dict]], tmp: Path):
        exe = shutil.which("aotc-server")
        if exe is None:
            raise RuntimeError("aotc-server is not on PATH")
        repo = tmp / "repo"
        for name, (pkg, config) in models.items():
            (repo / name / "1").mkdir(parents=True, exist_ok=True)
            os.symlink(pkg, repo / name / "1" / "model.pt2")
            (repo / name / "config.json").write_text(json.dumps(config))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = open(tmp / "server.log", "w")
        self.proc = subprocess.Popen([exe, "--model-repository", str(repo), "--http-port", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"aotc-server exited with {self.proc.returncode}: "
                                   f"{(tmp / 'server.log').read_text()[-400:]}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/v2/health/ready")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.25)
        self.close()
        raise RuntimeError("aotc-server was not ready within 60 s")

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
