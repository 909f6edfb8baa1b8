"""What hostile clients cost a normal request: p50/p99 of batch-1 MLP requests (binary tensors, concurrency 1,
closed loop from aotc-load) on an idle aotc-server, beside N idle keep-alive connections, and beside M clients
that each send one header byte per second, measured in turns on one server, with the ratios to the idle
server. The target of issue 20: no more than twice the idle time beside 2,000 idle connections or 600 slow
clients.

Idle connections each get one answer first (they are kept-alive connections, not just opened sockets) and
stay open (the server runs with --keep-alive-timeout 3600). Slow clients send an endless header, a byte per
second each, and reconnect when the server closes them (at its --header-timeout), so their number holds.
`--transport grpc` does the same on the gRPC port: the idle connections send HTTP/2's client preface and an empty
SETTINGS frame and stay open, the slow clients send the preface and then a HEADERS frame of 16 KiB a byte a
second, and the requests measured are ModelInfer calls from Python's grpc (a closed loop; its own cost is in
the times, alike in every phase). `--server-bin` measures another build (the thread-per-connection server before issue 20, say); a phase whose
requests fail or time out reports its errors. Not a test: asserts nothing.

    .venv/bin/python bench/hostile.py [--seconds 5] [--rounds 3] [--idle 2000] [--slow 600] [--transport http]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from launch import REPO, Server, make_repository
from loadgen import http_load

SLOW_REQUEST = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: "
# HTTP/2: the client preface and an empty SETTINGS frame (what a gRPC client sends first), and the head of a
# HEADERS frame on stream 1 announcing 16 KiB that a slow client then sends a byte at a time.
H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
H2_SLOW = H2_HELLO + b"\x00\x40\x00\x01\x04\x00\x00\x00\x01"


class IdleConnections:
    """`n` keep-alive connections, each answered once, then left idle (over gRPC: each sends the HTTP/2
    preface and SETTINGS, and counts as answered when the server's SETTINGS frame comes back)."""

    def __init__(self, port: int, n: int, grpc: bool = False):
        self.socks = []
        hello, answer = (H2_HELLO, b"\x04") if grpc else (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n",
                                                         b"HTTP/1.1 200")
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(hello)
            self.socks.append(s)
        self.answered = 0
        deadline = time.monotonic() + 10  # a server with fewer threads than connections answers only some
        for s in self.socks:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                got = s.recv(4096)
                self.answered += got[3:4] == answer if grpc else got.startswith(answer)
            except OSError:
                pass

    def close(self):
        for s in self.socks:
            s.close()


class SlowClients:
    """`n` connections each sending one byte of an endless header per second, reconnecting when closed."""

    def __init__(self, port: int, n: int, grpc: bool = False):
        self.port, self.n = port, n
        self.request = H2_SLOW if grpc else SLOW_REQUEST
        self.socks = [self._connect() for _ in range(n)]
        self.sent = [0] * n
        self.reconnects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _connect(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        s.setblocking(False)
        return s

    def _run(self):
        while not self._stop.wait(1.0):
            for i in range(self.n):
                k = self.sent[i]
                byte = self.request[k:k + 1] or b"a"
                try:
                    if self.socks[i].recv(4096) == b"":  # a close (after a 408, say): start again
                        raise ConnectionResetError
                except BlockingIOError:
                    pass
                except OSError:
                    self.socks[i].close()
                    self.socks[i], self.sent[i] = self._connect(), 0
                    self.reconnects += 1
                    continue
                try:
                    self.socks[i].send(byte)
                    self.sent[i] += 1
                except OSError:
                    pass

    def close(self):
        self._stop.set()
        self._thread.join(30)
        for s in self.socks:
            s.close()


def grpc_load(url: str, x: np.ndarray, seconds: float) -> dict:
    """ModelInfer calls of `x` to model mlp, one at a time for `seconds`: p50/p99 (ms), requests, errors."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    msg = pb.ModelInferRequest(model_name="mlp", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=list(x.shape))], raw_input_contents=[x.tobytes()]).SerializeToString()
    times, errors = [], 0
    with grpc.insecure_channel(url) as ch:
        infer = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                infer(msg, timeout=10)
            except grpc.RpcError:
                errors += 1
                continue
            times.append((time.perf_counter() - t0) * 1e3)
    if not times:
        raise RuntimeError(f"aotc-load: error: no ModelInfer call answered ({errors} failed)")
    return {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)),
            "requests": len(times), "errors": errors}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5, help="measured seconds per phase and round (default 5)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the three phases; medians reported (default 3)")
    ap.add_argument("--idle", type=int, default=2000, help="idle keep-alive connections (default 2000)")
    ap.add_argument("--slow", type=int, default=600, help="clients sending a header byte a second (default 600)")
    ap.add_argument("--transport", choices=("http", "grpc"), default="http",
                    help="where the hostile clients connect and the measured requests go (default http)")
    ap.add_argument("--server-bin", help="the aotc-server to measure (default: as bench/launch.py finds it)")
    ap.add_argument("--package", default=None, help="the MLP package (default: the newest in build/test-packages)")
    args = ap.parse_args()

    pkg = args.package or max(REPO.glob("build/test-packages/*/mlp.pt2"), key=os.path.getmtime)
    if args.server_bin:
        os.environ["AOTC_SERVER_BIN"] = args.server_bin
    x = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32)
    results: dict[str, list[dict]] = {"idle server": [], f"{args.idle} idle connections": [],
                                      f"{args.slow} slow clients": []}
    with tempfile.TemporaryDirectory(prefix="aotc-hostile-") as tmp:
        repo = make_repository(Path(tmp) / "repo", {"mlp": pkg}, link=True)
        with Server("cpp", repo, "--intra-op-threads", "1", "--keep-alive-timeout", "3600") as srv:
            grpc = args.transport == "grpc"
            port = srv.grpc_port if grpc else srv.port
            if port is None:
                raise SystemExit("--transport grpc: this aotc-server has no gRPC endpoint")
            print(f"server: {os.environ.get('AOTC_SERVER_BIN') or 'default'}; {args.transport}, MLP batch 1, concurrency 1, "
                  f"{args.seconds:g} s per phase, {args.rounds} rounds", flush=True)
            for rnd in range(args.rounds):
                for phase in results:
                    load = None
                    if phase.endswith("idle connections"):
                        load = IdleConnections(port, args.idle, grpc)
                        note = f"{load.answered} of {args.idle} answered before idling"
                    elif phase.endswith("slow clients"):
                        load = SlowClients(port, args.slow, grpc)
                        time.sleep(2)
                        note = f"{args.slow} dripping"
                    else:
                        note = ""
                    try:
                        r = (grpc_load(srv.grpc_url, x, args.seconds) if grpc
                             else http_load(srv.port, "mlp", x, "x", 1, args.seconds))
                    except RuntimeError as e:  # aotc-load exits 1 when no request at all succeeded
                        r = {"failed": str(e).splitlines()[-1].partition("aotc-load: error: ")[2][:100]}
                    if isinstance(load, SlowClients):
                        note += f", {load.reconnects} reconnects"
                    results[phase].append(r)
                    line = (f"p50 {r['p50_ms'] * 1e3:8.1f} us  p99 {r['p99_ms'] * 1e3:8.1f} us  requests "
                            f"{r['requests']:6d}  errors {r['errors']}" if "failed" not in r
                            else f"no answer: {r['failed']}")
                    print(f"  round {rnd + 1} {phase:>24}: {line}{'  (' + note + ')' if note else ''}", flush=True)
                    if load:
                        load.close()
                        time.sleep(1)  # the server sees the closes before the next phase

    print("\n| beside | p50 us | p99 us | p50 / idle | p99 / idle | errors |\n|---|---|---|---|---|---|")
    base = None
    for phase, rs in results.items():
        ok = [r for r in rs if "failed" not in r]
        if len(ok) < len(rs):
            print(f"| {phase} | - | - | - | - | no answer in {len(rs) - len(ok)} of {len(rs)} rounds |")
            continue
        p50, p99 = (statistics.median(r[k] for r in ok) * 1e3 for k in ("p50_ms", "p99_ms"))
        base = base or (p50, p99)
        print(f"| {phase} | {p50:.1f} | {p99:.1f} | {p50 / base[0]:.2f} | {p99 / base[1]:.2f} | "
              f"{sum(r['errors'] for r in ok)} |")


if __name__ == "__main__":
    main()
