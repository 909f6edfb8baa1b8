"""aotc-load (bench/load/aotc_load.cpp), the benchmarks' HTTP and gRPC load generator, black box: against the
real aotc-server on the exported MLP over both (counts checked against the server's own statistics), against a
400 (and over gRPC NOT_FOUND) on every request, against a stub that answers chunked, against its own loopback responder, with bad
arguments and with no server; its gRPC loopback responder; and bench/loadgen.py's http_load and grpc_load, which drive it. Checks counts and exit codes, never speed.
"""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import threading

import numpy as np
import pytest

import loadgen
from conftest import read_samples
from launch import Server, find_binary, free_port, make_repository


def load_exe() -> str:
    return str(find_binary("aotc-load", "AOTC_LOAD_BIN"))


def binary_body(x: np.ndarray, name: str) -> tuple[bytes, int]:
    header = json.dumps({"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return header + x.tobytes(), len(header)


def aotc_load(url: str, body_path, *flags: str, header_len: int | None = None):
    """-> (exit status, the AOTC_LOAD object or None, stderr)."""
    argv = [load_exe(), "--url", url, "--body", str(body_path), *flags]
    if header_len is not None:
        argv += ["--header", "Content-Type: application/octet-stream",
                 "--header", f"Inference-Header-Content-Length: {header_len}"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("AOTC_LOAD ")]
    assert len(lines) <= 1 and len(r.stdout.splitlines()) == len(lines), r.stdout
    return r.returncode, json.loads(lines[0].split(" ", 1)[1]) if lines else None, r.stderr


@pytest.fixture
def mlp_server(tmp_path, pkg_mlp):
    with Server("cpp", make_repository(tmp_path / "repo", {"mlp": pkg_mlp})) as s:
        yield s


@pytest.fixture
def mlp_input(pkg_mlp) -> np.ndarray:
    (xs,), _ = read_samples(pkg_mlp)[0]
    return np.ascontiguousarray(xs[:4], dtype=np.float32)  # [4, 512]


def test_counts_match_the_server(tmp_path, mlp_server, mlp_input):
    body, header_len = binary_body(mlp_input, "x")
    (tmp_path / "body.bin").write_bytes(body)
    rc, r, err = aotc_load(f"{mlp_server.url}/v2/models/mlp/infer", tmp_path / "body.bin", "--connections", "2",
                           "--duration", "1", "--warmup", "0", header_len=header_len)
    print(r)
    assert rc == 0, err
    assert r["requests"] > 0 and r["errors"] == 0 and r["status"] == {}
    assert 0 < r["p50_us"] <= r["p90_us"] <= r["p99_us"] <= r["max_us"]
    assert r["duration_s"] >= 1 and r["req_per_s"] == pytest.approx(r["requests"] / r["duration_s"], rel=0.01)
    # Without a warm-up every request sent is counted, and each was answered.
    _, st = mlp_server.json("GET", "/v2/models/mlp/stats")
    assert st["model_stats"][0]["inference_stats"]["success"]["count"] == r["requests"]
    # It read whole answers: as many bytes as the server sends.
    status, _, answer = mlp_server.request("POST", "/v2/models/mlp/infer", body,
                                           {"Inference-Header-Content-Length": str(header_len)})
    assert status == 200 and r["answer_bytes"] == len(answer)


def test_without_a_body_it_gets_the_path(mlp_server):
    """The floor of a request: GET /v2/health/ready, no body either way."""
    r = subprocess.run([load_exe(), "--url", f"{mlp_server.url}/v2/health/ready", "--duration", "0.5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.split(" ", 1)[1])
    assert s["requests"] > 0 and s["errors"] == 0 and s["status"] == {}
    r = subprocess.run([load_exe(), "--url", f"{mlp_server.url}/v2/models/mlp/infer", "--duration", "0.5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and set(json.loads(r.stdout.split(" ", 1)[1])["status"]) == {"405"}  # GET on /infer


def test_every_400_is_an_error_and_the_exit_status_is_1(tmp_path, mlp_server, mlp_input):
    body, header_len = binary_body(mlp_input, "not_an_input")
    (tmp_path / "body.bin").write_bytes(body)
    rc, r, err = aotc_load(f"{mlp_server.url}/v2/models/mlp/infer", tmp_path / "body.bin", "--connections", "2",
                           "--duration", "1", "--warmup", "0.2", header_len=header_len)
    assert rc == 1
    assert r["requests"] == 0 and r["errors"] > 0 and r["status"] == {"400": r["errors"]}
    assert r["connect_errors"] == r["read_errors"] == r["write_errors"] == r["timeouts"] == 0
    assert len(err.splitlines()) == 1 and "400" in err


def test_several_bodies_are_sent_in_turn_on_each_connection(tmp_path, mlp_server, mlp_input):
    # A valid body and one the server refuses with a 400, each connection alternating between them: about as
    # many answers of each, on every connection (connection i starts at body i).
    good = json.dumps({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32",
                                   "data": mlp_input[0].tolist()}]})
    (tmp_path / "good.json").write_text(good)
    (tmp_path / "bad.json").write_text(good.replace('"x"', '"not_an_input"'))
    argv = [load_exe(), "--url", f"{mlp_server.url}/v2/models/mlp/infer", "--body", str(tmp_path / "good.json"),
            "--body", str(tmp_path / "bad.json"), "--connections", "2", "--duration", "1",
            "--header", "Content-Type: application/json"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    s = json.loads(r.stdout.split(" ", 1)[1])
    assert r.returncode == 0 and s["requests"] > 10 and s["status"] == {"400": s["errors"]}, r.stdout + r.stderr
    assert abs(s["requests"] - s["errors"]) <= 2, s  # each connection alternates, so the counts differ by <= 1 each


class _ChunkedHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for chunk in (b"a" * 70000, b"{}"):  # a chunk larger than one recv, then a small one
            self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\nTrailer: x\r\n\r\n")  # the last chunk, a trailer, the end

    def log_message(self, *args):
        pass


def load_a_stub(tmp_path, handler):
    """aotc_load for 0.5 s against an http.server stub answering with `handler`, stopped afterwards."""
    stub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    try:
        (tmp_path / "body.bin").write_bytes(b"{}")
        return aotc_load(f"http://127.0.0.1:{stub.server_address[1]}/x", tmp_path / "body.bin", "--duration", "0.5")
    finally:
        stub.shutdown()
        stub.server_close()


def test_chunked_answers_are_read_whole(tmp_path):
    rc, r, err = load_a_stub(tmp_path, _ChunkedHandler)
    assert rc == 0, err
    assert r["requests"] > 0 and r["errors"] == 0 and r["answer_bytes"] == 70002


class _UnsizedHandler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.0, no Content-Length: the body runs to the close, and arrives in several writes."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()
        for _ in range(3):
            self.wfile.write(b"b" * 40000)
            self.wfile.flush()

    def log_message(self, *args):
        pass


def test_answers_without_a_length_are_read_to_the_close(tmp_path):
    rc, r, err = load_a_stub(tmp_path, _UnsizedHandler)
    assert rc == 0, err
    assert r["requests"] > 0 and r["errors"] == 0 and r["answer_bytes"] == 120000


@pytest.mark.parametrize("flags", [[], ["--socket-buffer", "65536"]])
def test_the_loopback_responder_sends_what_it_was_asked_for(tmp_path, flags):
    """--loopback-bytes: aotc-load answers itself, N bytes a request, on several connections, with a body
    larger than one recv to read first."""
    (tmp_path / "body.bin").write_bytes(b"x" * 300_000)
    r = subprocess.run([load_exe(), "--loopback-bytes", str(3 << 20), "--body", str(tmp_path / "body.bin"),
                        "--connections", "2", "--duration", "0.5", *flags], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.split(" ", 1)[1])
    assert s["requests"] > 0 and s["errors"] == 0 and s["answer_bytes"] == 3 << 20
    r = subprocess.run([load_exe(), "--loopback-bytes", "0", "--duration", "0.3"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.split(" ", 1)[1])
    assert s["requests"] > 0 and s["answer_bytes"] == 0


def test_the_grpc_loopback_responder_answers_unary_calls(tmp_path):
    """--loopback-grpc: a gRPC responder in a child process answers N bytes to every call, with an empty
    message (no --body) and with a large one, on several channels; the child is gone when aotc-load exits."""
    (tmp_path / "body.bin").write_bytes(b"x" * 300_000)
    for extra, size in (([], 198656), (["--body", str(tmp_path / "body.bin"), "--connections", "2"], 3 << 20),
                        ([], 0)):
        r = subprocess.run([load_exe(), "--loopback-bytes", str(size), "--loopback-grpc", "--duration", "0.5",
                            *extra], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        s = json.loads(r.stdout.split(" ", 1)[1])
        assert s["transport"] == "grpc" and s["requests"] > 0 and s["errors"] == 0
        # the serialized answer is the N bytes themselves: the raw method sends them as they are
        assert s["answer_bytes"] == size
    left = subprocess.run(["pgrep", "-f", "--", "--loopback-grpc"], capture_output=True, text=True)
    assert left.stdout.strip() == "", "a responder process outlived its aotc-load"


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_the_loopback_responder_spins_before_each_answer(transport):
    """--loopback-spin-us: each answer comes no sooner than the spin after its request."""
    flags = ["--loopback-grpc"] if transport == "grpc" else []
    r = subprocess.run([load_exe(), "--loopback-bytes", "100", "--loopback-spin-us", "20000", "--duration", "0.3",
                        *flags], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.split(" ", 1)[1])
    assert s["requests"] > 0 and s["errors"] == 0 and s["answer_bytes"] == 100
    assert 20000 <= s["p50_us"] and s["requests"] <= 0.3 / 0.02 + 1


@pytest.mark.parametrize("argv", [
    [],
    ["--body", "BODY"],
    ["--url"],
    ["--url", "https://127.0.0.1:1/x", "--body", "BODY"],
    ["--url", "http://127.0.0.1:99999/x", "--body", "BODY"],
    ["--url", "http://127.0.0.1:1/x", "--body", "BODY", "--connections", "0"],
    ["--url", "http://127.0.0.1:1/x", "--body", "BODY", "--duration", "-1"],
    ["--url", "http://127.0.0.1:1/x", "--body", "BODY", "--header", "no colon"],
    ["--url", "http://127.0.0.1:1/x", "--body", "BODY", "--warmup"],
    ["--url", "http://127.0.0.1:1/x", "--body", "BODY", "--bogus"],
    ["--url", "http://127.0.0.1:1/x", "--body", "MISSING"],
    ["--url", "http://127.0.0.1:1/x", "--loopback-bytes", "10"],
    ["--loopback-bytes", "-1"],
    ["--loopback-bytes", "10", "--socket-buffer", "12"],
    ["--loopback-bytes", "10", "--loopback-grpc", "--socket-buffer", "65536"],  # HTTP only
    ["--loopback-bytes", "10", "--loopback-spin-us", "-1"],
    ["--loopback-bytes", "10", "--loopback-spin-us", "1000001"],
    ["--loopback-bytes", "10", "--loopback-spin-us"],
    ["--url", "http://127.0.0.1:1/x", "--loopback-spin-us", "5"],  # shapes a responder not asked for
    ["--url", "grpc://127.0.0.1:1/a.B/C", "--body", "BODY", "--loopback-grpc"],
    ["--url", "grpc://127.0.0.1:1/inference.GRPCInferenceService/ModelInfer"],  # no message to send
    ["--url", "grpc://127.0.0.1:1/ModelInfer", "--body", "BODY"],  # not /package.Service/Method
    ["--url", "grpc://127.0.0.1/inference.GRPCInferenceService/ModelInfer", "--body", "BODY"],  # no port
    ["--url", "grpc://127.0.0.1:1/a.B/C", "--body", "BODY", "--socket-buffer", "65536"],
    ["--url", "https://127.0.0.1:1/x", "--body", "BODY"],
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, argv):
    (tmp_path / "BODY").write_bytes(b"{}")
    argv = [str(tmp_path / a) if a in ("BODY", "MISSING") else a for a in argv]
    r = subprocess.run([load_exe(), *argv], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1 and r.stderr.startswith("aotc-load: error: ")


def test_no_server_is_one_line_and_exit_1(tmp_path):
    (tmp_path / "body.bin").write_bytes(b"{}")
    rc, r, err = aotc_load(f"http://127.0.0.1:{free_port()}/x", tmp_path / "body.bin", "--duration", "0.5")
    assert rc == 1 and r is None
    assert len(err.splitlines()) == 1 and "cannot connect" in err


def test_http_load_drives_aotc_load(mlp_server, mlp_input):
    import torch

    x = torch.from_numpy(mlp_input)
    r = loadgen.http_load(mlp_server.port, "mlp", x, "x", 1, 2)
    print(f"http_load c1 2 s: {r}")
    assert set(r) == {"p50_ms", "p90_ms", "p99_ms", "mean_ms", "req_per_s", "requests", "errors", "error_counts",
                      "answer_bytes", "cpu_us", "responder_cpu_us"}
    assert r["cpu_us"] > 0 and r["responder_cpu_us"] is None  # no loopback responder
    assert r["requests"] > 0 and r["errors"] == 0 and sum(r["error_counts"].values()) == 0
    assert 0 < r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"]
    # One connection, closed loop: the throughput is the inverse of the mean latency, less the client's gaps.
    assert 0.5 < r["req_per_s"] * r["mean_ms"] / 1e3 <= 1.01
    only = loadgen.http_load(mlp_server.port, "mlp", x, "x", 1, 0.5, outputs=["output0"])
    assert only["requests"] > 0 and only["errors"] == 0
    floor = loadgen.loopback_load(only["answer_bytes"], 0.5)
    assert floor["requests"] > 0 and floor["answer_bytes"] == only["answer_bytes"]
    assert floor["cpu_us"] > 0 and floor["responder_cpu_us"] > 0
    spun = loadgen.loopback_load(only["answer_bytes"], 0.5, grpc=True, spin_us=5000, load_flags=["--busy-poll"])
    assert spun["requests"] > 0 and spun["answer_bytes"] == only["answer_bytes"] and spun["p50_ms"] >= 5
    with pytest.raises(RuntimeError, match="400"):
        loadgen.http_load(mlp_server.port, "mlp", x, "x", 1, 0.5, outputs=["no_such_output"])


GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


def test_grpc_counts_match_the_server(tmp_path, mlp_server, mlp_input):
    """Over gRPC: each connection a channel of its own, every call counted by the server, answers whole."""
    from tritonclient.grpc import service_pb2

    (tmp_path / "request.pb").write_bytes(loadgen.infer_message("mlp", mlp_input, "x"))
    rc, r, err = aotc_load(f"grpc://127.0.0.1:{mlp_server.grpc_port}{GRPC_INFER}", tmp_path / "request.pb",
                           "--connections", "2", "--duration", "1", "--warmup", "0")
    print(r)
    assert rc == 0, err
    assert r["transport"] == "grpc" and r["requests"] > 0 and r["errors"] == 0 and r["status"] == {}
    assert 0 < r["p50_us"] <= r["p90_us"] <= r["p99_us"] <= r["max_us"]
    _, st = mlp_server.json("GET", "/v2/models/mlp/stats")
    assert st["model_stats"][0]["inference_stats"]["success"]["count"] == r["requests"]
    # The answer it took is a whole ModelInferResponse: it parses, and holds the [4, 512] FP32 output.
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{mlp_server.grpc_port}") as ch:
        call = ch.unary_unary(GRPC_INFER, request_serializer=None, response_deserializer=None)
        answer = call((tmp_path / "request.pb").read_bytes(), timeout=30)
    reply = service_pb2.ModelInferResponse.FromString(answer)
    assert list(reply.outputs[0].shape) == [4, 512] and len(reply.raw_output_contents[0]) == 4 * 512 * 4
    assert r["answer_bytes"] == len(answer)


def test_grpc_status_other_than_ok_is_an_error(tmp_path, mlp_server, mlp_input):
    """An unknown model: every call ends NOT_FOUND (5), counted by code; none succeeds, so exit 1."""
    (tmp_path / "request.pb").write_bytes(loadgen.infer_message("no_such_model", mlp_input, "x"))
    rc, r, err = aotc_load(f"grpc://127.0.0.1:{mlp_server.grpc_port}{GRPC_INFER}", tmp_path / "request.pb",
                           "--duration", "0.5", "--warmup", "0")
    assert rc == 1 and r["requests"] == 0 and r["errors"] > 0
    assert r["status"] == {"5": r["errors"]}
    assert len(err.splitlines()) == 1 and "gRPC status 5" in err


def test_grpc_no_server_is_one_line_and_exit_1(tmp_path):
    (tmp_path / "request.pb").write_bytes(b"")
    rc, r, err = aotc_load(f"grpc://127.0.0.1:{free_port()}{GRPC_INFER}", tmp_path / "request.pb",
                           "--duration", "0.5", "--timeout", "1")
    assert rc == 1 and r is None
    assert len(err.splitlines()) == 1 and "cannot connect" in err


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_busy_poll_waits_without_sleeping_and_counts_alike(tmp_path, mlp_server, mlp_input, transport):
    """--busy-poll: every call is still counted by the server and read whole, and the client waits for its
    answers without sleeping: its connection thread blocks (`sleeps`, its voluntary context switches) under
    once per ten requests, against about once per request without it; switches, not CPU time, so that a busy
    machine does not change the verdict, and the connection thread's own, not gRPC's threads'."""
    if transport == "http":
        body, header_len = binary_body(mlp_input, "x")
        url, path = f"{mlp_server.url}/v2/models/mlp/infer", tmp_path / "body.bin"
    else:
        body, header_len = loadgen.infer_message("mlp", mlp_input, "x"), None
        url, path = f"grpc://127.0.0.1:{mlp_server.grpc_port}{GRPC_INFER}", tmp_path / "request.pb"
    path.write_bytes(body)

    def run(*flags):
        rc, r, err = aotc_load(url, path, "--duration", "1", "--warmup", "0", *flags, header_len=header_len)
        assert rc == 0 and r["requests"] > 0 and r["errors"] == 0, err
        return r, r["sleeps"] / r["requests"]

    _, st = mlp_server.json("GET", "/v2/models/mlp/stats")
    served = st["model_stats"][0]["inference_stats"]["success"]["count"]
    r, sleeps = run("--busy-poll")
    _, st = mlp_server.json("GET", "/v2/models/mlp/stats")
    assert st["model_stats"][0]["inference_stats"]["success"]["count"] - served == r["requests"]
    plain, plain_sleeps = run()
    assert r["answer_bytes"] == plain["answer_bytes"] > 4 * 512 * 4
    assert sleeps < 0.1 and plain_sleeps > 0.5, (sleeps, plain_sleeps)


def test_busy_poll_still_times_out(tmp_path):
    """A server that accepts and never answers: with --busy-poll the spinning read gives up at --timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # connections complete in the backlog; nothing is ever read or sent
        (tmp_path / "body.bin").write_bytes(b"{}")
        rc, r, err = aotc_load(f"http://127.0.0.1:{listener.getsockname()[1]}/x", tmp_path / "body.bin",
                               "--busy-poll", "--timeout", "0.5", "--duration", "1", "--warmup", "0")
    assert rc == 1 and r["requests"] == 0 and r["timeouts"] >= 1, r
    assert len(err.splitlines()) == 1 and "no answer within --timeout" in err, err


def test_grpc_load_drives_aotc_load(mlp_server, mlp_input):
    """loadgen.grpc_load: the same numbers as http_load, the API key passed as metadata where one is needed."""
    r = loadgen.grpc_load(mlp_server.grpc_port, "mlp", mlp_input, "x", 2, 1)
    print(f"grpc_load c2 1 s: {r}")
    assert r["requests"] > 0 and r["errors"] == 0 and 0 < r["p50_ms"] <= r["p99_ms"]
    only = loadgen.grpc_load(mlp_server.grpc_port, "mlp", mlp_input, "x", 1, 0.5, outputs=["output0"])
    assert only["requests"] > 0 and only["answer_bytes"] > 4 * 512 * 4
    with pytest.raises(RuntimeError, match="gRPC status 3"):  # INVALID_ARGUMENT
        loadgen.grpc_load(mlp_server.grpc_port, "mlp", mlp_input, "x", 1, 0.5, outputs=["no_such_output"])


def test_grpc_load_sends_the_api_key_as_metadata(tmp_path, pkg_mlp, mlp_input):
    repo = make_repository(tmp_path / "repo", {"mlp": pkg_mlp})
    with Server("cpp", repo, "--api-key", "sekrit") as s:
        with pytest.raises(RuntimeError, match="gRPC status 16"):  # UNAUTHENTICATED
            loadgen.grpc_load(s.grpc_port, "mlp", mlp_input, "x", 1, 0.5)
        r = loadgen.grpc_load(s.grpc_port, "mlp", mlp_input, "x", 1, 0.5, metadata={"authorization": "Bearer sekrit"})
        assert r["requests"] > 0 and r["errors"] == 0
