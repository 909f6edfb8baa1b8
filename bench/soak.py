"""Soak: aotc-server under mixed load for a long time, watching its memory and threads.

    .venv/bin/python bench/soak.py [--package PKG] [--duration 600] [--report-s 60] [--clients 8]
        [--grpc-clients 0] [--out FILE]

Starts aotc-server (bench/launch.py; AOTC_SERVER_BIN picks the binary) on a repository holding the MLP
(exported to .cache/pkgs/mlp.pt2 when no --package is given) and runs `--clients` threads, each a
closed loop of raw HTTP/1.1 requests on its own keep-alive connection, drawn at random:
  - small valid requests (batch 1..8, binary tensors),                                      80 %
  - malformed ones (broken JSON, a wrong datatype, a shape the body does not hold),          5 %
  - large valid ones (1024 x 512 FP32, 2 MiB each way),                                     10 %
  - large ones whose client resets the connection (RST) after the first bytes of the answer. 5 %
`--grpc-clients` more threads do the same over gRPC, each on a channel of its own, the messages built with
tritonclient's protobuf modules and sent as bytes, so that malformed ones reach the server as they are:
  - small valid ModelInfer calls (batch 1..8, raw_input_contents),                          70 %
  - a message that does not parse (truncated) or names an unknown model or a wrong shape:
    INVALID_ARGUMENT or NOT_FOUND expected,                                                 10 %
  - large valid ones (1024 x 512 FP32),                                                     10 %
  - large ones the client cancels 1 ms after sending,                                        5 %
  - a ModelStreamInfer of a valid, a truncated, an unknown-model and a valid request: four
    answers expected (in any order, matched by id), the middle two with error_message,       5 %
Every `--report-s` seconds it prints the requests and errors so far and the server's RSS and thread count
(/proc/PID/status); at the end, the growth after the first report (the warm-up) per 10,000 requests. An
answer other than 200 to a valid request, or other than 4xx to a malformed one, counts as an error. Not a
test: nothing is asserted. One process; the clients are threads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from launch import REPO, Server, make_repository

SMALL, MALFORMED, LARGE, RESET = "small", "malformed", "large", "reset"
MIX = ((SMALL, 0.80), (MALFORMED, 0.05), (LARGE, 0.10), (RESET, 0.05))
G_SMALL, G_BAD, G_LARGE, G_CANCEL, G_STREAM = "grpc small", "grpc bad", "grpc large", "grpc cancel", "grpc stream"
GRPC_MIX = ((G_SMALL, 0.70), (G_BAD, 0.10), (G_LARGE, 0.10), (G_CANCEL, 0.05), (G_STREAM, 0.05))
SERVICE = "/inference.GRPCInferenceService/"


def infer_request(x: np.ndarray, host: str) -> bytes:
    header = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    body = header + x.tobytes()
    return (f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def malformed_requests(host: str) -> list[bytes]:
    def post(body: bytes) -> bytes:
        return (f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    return [post(b'{"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [1, 2'),
            post(b'{"inputs": [{"name": "x", "shape": [1, 512], "datatype": "INT8", "data": [1]}]}'),
            post(b'{"inputs": [{"name": "x", "shape": [4, 512], "datatype": "FP32", "data": [0.5]}]}'),
            post(b'{"inputs": [{"name": "nope", "shape": [1, 512], "datatype": "FP32", "data": []}]}'),
            post(b"[" * 5000)]


def read_answer(sock: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    """Reads one answer (Content-Length framed) from `sock`; returns its status and body. `buf` keeps what
    follows."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the answer's header")
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = next(int(v) for k, _, v in (line.partition(b":") for line in lines[1:]) if k.lower() == b"content-length")
    while len(rest) < length:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed inside the answer's body")
        rest += chunk
    buf[:] = rest[length:]
    return status, rest[:length]


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.done = {k: 0 for k, _ in MIX + GRPC_MIX}
        self.errors = 0
        self.first_error = ""

    def add(self, kind: str, error: str = "") -> None:
        with self.lock:
            self.done[kind] += 1
            if error:
                self.errors += 1
                self.first_error = self.first_error or f"{kind}: {error}"

    def total(self) -> int:
        with self.lock:
            return sum(self.done.values())


def client(host: str, port: int, stop: threading.Event, counts: Counts, seed: int) -> None:
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    large = infer_request(nrng.standard_normal((1024, 512), dtype=np.float32), host)
    small = [infer_request(nrng.standard_normal((b, 512), dtype=np.float32), host) for b in range(1, 9)]
    bad = malformed_requests(host)
    kinds, weights = zip(*MIX)
    sock, buf = None, bytearray()
    while not stop.is_set():
        kind = rng.choices(kinds, weights)[0]
        try:
            if sock is None:
                sock = socket.create_connection((host, port), timeout=60)
                buf = bytearray()
            if kind == RESET:
                sock.sendall(large)
                sock.recv(1024)  # the first bytes of the answer, then a reset instead of reading on
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
                sock = None
                counts.add(kind)
                continue
            sock.sendall({SMALL: lambda: rng.choice(small), LARGE: lambda: large,
                          MALFORMED: lambda: rng.choice(bad)}[kind]())
            status, _ = read_answer(sock, buf)
            ok = 400 <= status < 500 if kind == MALFORMED else status == 200
            counts.add(kind, "" if ok else f"HTTP {status}")
            if kind == MALFORMED:  # the server may close after a request it could not frame; start afresh
                sock.close()
                sock = None
        except (OSError, ValueError, StopIteration) as e:
            counts.add(kind, f"{type(e).__name__}: {e}")
            if sock is not None:
                sock.close()
            sock = None
    if sock is not None:
        sock.close()


def grpc_client(url: str, stop: threading.Event, counts: Counts, seed: int) -> None:
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    def request(x: np.ndarray, model: str = "mlp", id: str = "") -> bytes:
        return pb.ModelInferRequest(model_name=model, id=id, inputs=[pb.ModelInferRequest.InferInputTensor(
            name="x", datatype="FP32", shape=list(x.shape))], raw_input_contents=[x.tobytes()]).SerializeToString()

    def check_answer(data: bytes, rows: int) -> str:
        r = pb.ModelInferResponse.FromString(data)
        got = len(r.raw_output_contents[0]) if r.raw_output_contents else -1
        return "" if got == rows * 512 * 4 else f"answer of {got} bytes for {rows} rows"

    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    small = [(b, request(nrng.standard_normal((b, 512), dtype=np.float32))) for b in range(1, 9)]
    large = request(nrng.standard_normal((1024, 512), dtype=np.float32))
    bad = [(small[0][1][:len(small[0][1]) // 2], grpc.StatusCode.INVALID_ARGUMENT),
           (request(np.zeros((1, 512), np.float32), "nope"), grpc.StatusCode.NOT_FOUND),
           (request(np.zeros((1, 500), np.float32)), grpc.StatusCode.INVALID_ARGUMENT)]
    # answered in the order they are ready, matched by id (the truncated one's answer has none)
    stream_msgs = [request(np.ones((1, 512), np.float32), id="a"), bad[0][0],
                   request(np.zeros((1, 512), np.float32), "nope", id="c"), request(np.ones((2, 512), np.float32), id="d")]
    kinds, weights = zip(*GRPC_MIX)
    opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(url, options=opts) as ch:
        infer = ch.unary_unary(SERVICE + "ModelInfer")  # bytes in, bytes out: no serializers
        stream = ch.stream_stream(SERVICE + "ModelStreamInfer")
        while not stop.is_set():
            kind = rng.choices(kinds, weights)[0]
            try:
                if kind == G_SMALL:
                    rows, msg = rng.choice(small)
                    counts.add(kind, check_answer(infer(msg, timeout=60), rows))
                elif kind == G_LARGE:
                    counts.add(kind, check_answer(infer(large, timeout=60), 1024))
                elif kind == G_BAD:
                    msg, want = rng.choice(bad)
                    try:
                        infer(msg, timeout=60)
                        counts.add(kind, "a bad request was answered OK")
                    except grpc.RpcError as e:
                        counts.add(kind, "" if e.code() == want else f"{e.code()} (want {want}): {e.details()}")
                elif kind == G_CANCEL:
                    f = infer.future(large, timeout=60)
                    time.sleep(0.001)
                    f.cancel()
                    try:
                        err = check_answer(f.result(), 1024)
                    except grpc.FutureCancelledError:
                        err = ""
                    counts.add(kind, err)
                else:
                    answers = [pb.ModelStreamInferResponse.FromString(a)
                               for a in stream(iter(stream_msgs), timeout=60)]
                    got = sorted((a.infer_response.id, bool(a.error_message)) for a in answers)
                    want = [("", True), ("a", False), ("c", True), ("d", False)]
                    counts.add(kind, "" if got == want else f"answers (id, error) {got}, want {want}")
            except grpc.RpcError as e:
                counts.add(kind, f"{e.code()}: {e.details()}")


def proc_status(pid: int) -> tuple[float, int]:
    """(RSS in MB, threads) of a process, from /proc/PID/status."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


def package(path: str | None) -> Path:
    if path:
        return Path(path)
    out = REPO / ".cache" / "pkgs" / "mlp.pt2"
    if not out.exists():
        subprocess.run([sys.executable, "-m", "aotc.cli", "export", "models/mlp.py", "-o", str(out)], cwd=REPO,
                       check=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--package", help="the MLP package (default: export models/mlp.py to .cache/pkgs/mlp.pt2)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    p.add_argument("--report-s", type=float, default=60.0, help="seconds between reports (default 60)")
    p.add_argument("--clients", type=int, default=8, help="client threads, a connection each (default 8)")
    p.add_argument("--grpc-clients", type=int, default=0,
                   help="client threads over gRPC, a channel each, beside the HTTP ones (default 0)")
    p.add_argument("--server-flag", action="append", default=[], metavar="FLAG",
                   help="a flag for aotc-server (repeatable), e.g. --server-flag=--http-threads=64")
    p.add_argument("--out", help="also write the table (markdown) here")
    args = p.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="aotc-soak-")  # removed when this process exits
    repo = make_repository(Path(tmp.name), {"mlp": package(args.package)})
    rows = []
    with Server("cpp", repo, *args.server_flag) as server:
        pid = server.proc.pid
        stop, counts = threading.Event(), Counts()
        threads = [threading.Thread(target=client, args=(server.host, server.port, stop, counts, i), daemon=True)
                   for i in range(args.clients)]
        if args.grpc_clients and server.grpc_url is None:
            print("--grpc-clients: this aotc-server has no gRPC endpoint", file=sys.stderr)
            return 2
        threads += [threading.Thread(target=grpc_client, args=(server.grpc_url, stop, counts, 1000 + i), daemon=True)
                    for i in range(args.grpc_clients)]
        rss0, th0 = proc_status(pid)
        rows.append((0.0, 0, 0, rss0, th0))
        print(f"{'s':>6} {'requests':>9} {'errors':>6} {'RSS MB':>8} {'threads':>7}", flush=True)
        print(f"{0:6.0f} {0:9d} {0:6d} {rss0:8.1f} {th0:7d}", flush=True)
        t0 = time.monotonic()
        for t in threads:
            t.start()
        while (elapsed := time.monotonic() - t0) < args.duration:
            time.sleep(min(args.report_s, args.duration - elapsed))
            if server.proc.poll() is not None:
                print(f"aotc-server exited {server.proc.returncode}:\n{server.log()[-2000:]}", file=sys.stderr)
                return 1
            rss, th = proc_status(pid)
            rows.append((time.monotonic() - t0, counts.total(), counts.errors, rss, th))
            print(f"{rows[-1][0]:6.0f} {rows[-1][1]:9d} {rows[-1][2]:6d} {rss:8.1f} {th:7d}", flush=True)
        stop.set()
        for t in threads:
            t.join(60)
    warm, last = rows[1] if len(rows) > 2 else rows[0], rows[-1]
    per_10k = (last[3] - warm[3]) / max(last[1] - warm[1], 1) * 10_000
    lines = ["| s | requests | errors | RSS MB | threads |", "|---|---|---|---|---|"]
    lines += [f"| {s:.0f} | {n} | {e} | {r:.1f} | {t} |" for s, n, e, r, t in rows]
    summary = (f"after warm-up ({warm[0]:.0f} s): RSS {warm[3]:.1f} -> {last[3]:.1f} MB over {last[1] - warm[1]} "
               f"requests = {per_10k:+.2f} MB per 10,000 requests; threads {warm[4]} -> {last[4]}; "
               f"errors {last[2]}" + (f" (first: {counts.first_error})" if counts.first_error else "") +
               f"; mix {counts.done}")
    machine = f"{platform.node()}, {os.cpu_count()} cores, {platform.platform()}"
    text = "\n".join([f"`{' '.join(sys.argv)}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {machine}",
                      "", *lines, "", summary])
    print(summary)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
