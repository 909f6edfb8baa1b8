"""aotc-server's HTTP/1.1 layer on the wire: raw bytes over a socket, so the tests see exactly what the server
answers to requests a client library would never send (a garbage request line, a bad Content-Length, headers
too large, a broken %-escape), to Expect: 100-continue, HEAD, pipelining and chunked bodies, and how it closes
idle connections (keep-alive timeout, SIGTERM). After every bad request the server must keep serving."""

from __future__ import annotations

import http.client
import io
import json
import signal
import socket
import time

import pytest

from launch import Server
from test_server import simple_body

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def srv(model_repository):
    with Server("cpp", model_repository, "--keep-alive-timeout", "1", "--max-body-bytes", "65536") as s:
        yield s


def exchange(srv, data: bytes, timeout: float = 10) -> bytes:
    """Sends `data` on a fresh connection, half-closes it and returns everything the server sent back."""
    with socket.create_connection((srv.host, srv.port), timeout=timeout) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


class Reader:
    """One buffered reader per socket, shared by the responses read from it (pipelining, keep-alive): a reader
    per response would swallow the bytes of the next one into its buffer."""

    class _File(io.BufferedReader):
        def close(self):  # HTTPResponse closes its file after the body; the next response needs it open
            pass

    def __init__(self, sock: socket.socket):
        self.file = self._File(socket.SocketIO(sock, "rb"))

    def makefile(self, mode):
        return self.file


def read_response(sock: socket.socket | Reader, method: str = "GET") -> tuple[int, dict, bytes]:
    """One response from a socket (or a Reader of one, where more responses follow on it)."""
    r = http.client.HTTPResponse(sock, method=method)
    r.begin()
    body = r.read()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, body


def error_of(raw: bytes) -> tuple[int, str]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["error"]


def assert_serving(srv):
    body, a, b = simple_body(seed=5)
    status, _, data = srv.request("POST", "/v2/models/simple/infer", body)
    assert status == 200 and json.loads(data)["outputs"][0]["data"] == (a + b).ravel().tolist()


@pytest.mark.parametrize("raw, status, words", [
    (b"GARBAGE\r\n\r\n", 400, "malformed HTTP request"),
    (b"GET /v2 HTTP/9.9\r\nHost: x\r\n\r\n", 400, "malformed HTTP request"),
    (b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n", 400, "malformed HTTP request"),
    (b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (70 << 10) + b"\r\n\r\n", 431, "request line and headers"),
    (b"GET /v2/models/%zz HTTP/1.1\r\nHost: x\r\n\r\n", 400, "%-escape"),
    (b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n{", 400, "ended before its body"),
])
def test_bad_requests_get_a_4xx_naming_the_fault(srv, raw, status, words):
    got_status, message = error_of(exchange(srv, raw))
    assert got_status == status and words in message, message
    assert_serving(srv)


def test_declared_body_over_the_limit_is_refused_before_it_is_sent(srv):
    """Expect: 100-continue with a Content-Length over --max-body-bytes: 413 at once, never 100 Continue."""
    with socket.create_connection((srv.host, srv.port), timeout=10) as s:
        s.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        status, headers, body = read_response(s, "POST")
    assert status == 413 and "--max-body-bytes 65536" in json.loads(body)["error"]
    assert headers["connection"] == "close"
    assert_serving(srv)


def test_expect_100_continue(srv):
    """curl sends Expect: 100-continue for large bodies and waits for the interim answer before sending."""
    body, a, b = simple_body(seed=1)
    with socket.create_connection((srv.host, srv.port), timeout=10) as s:
        s.sendall(f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                  f"Expect: 100-continue\r\n\r\n".encode())
        interim = s.recv(64)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body.encode())
        status, _, data = read_response(s, "POST")
    assert status == 200 and json.loads(data)["outputs"][0]["data"] == (a + b).ravel().tolist()


def test_chunked_request_body(srv):
    body, a, b = simple_body(seed=2)
    data = body.encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (data[:100], data[100:]))
    raw = (b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
           b"Connection: close\r\n\r\n" + chunks + b"0\r\n\r\n")
    head, _, answer = exchange(srv, raw).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert json.loads(answer)["outputs"][0]["data"] == (a + b).ravel().tolist()


def test_head_has_the_length_and_no_body(srv):
    get_status, _, get_body = srv.request("GET", "/v2/models/simple")
    with socket.create_connection((srv.host, srv.port), timeout=10) as s:
        s.sendall(b"HEAD /v2/models/simple HTTP/1.1\r\nHost: x\r\n\r\nGET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        reader = Reader(s)
        status, headers, body = read_response(reader, "HEAD")
        assert status == get_status == 200 and body == b""
        assert int(headers["content-length"]) == len(get_body)
        # the next response on the connection starts right after the HEAD's headers: no body bytes were sent
        status, _, body = read_response(reader)
        assert status == 200 and json.loads(body) == {"live": True}


def test_pipelined_requests_are_answered_in_order(srv):
    paths = ["/v2/models/simple", "/v2/models/mlp", "/v2/models/nope", "/v2/models/simple/ready"]
    raw = b"".join(f"GET {p} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for p in paths)
    with socket.create_connection((srv.host, srv.port), timeout=10) as s:
        s.sendall(raw)
        reader = Reader(s)
        answers = [read_response(reader) for _ in paths]
    assert [a[0] for a in answers] == [200, 200, 404, 200]
    assert json.loads(answers[0][2])["name"] == "simple" and json.loads(answers[1][2])["name"] == "mlp"


def test_percent_escaped_path_is_decoded(srv):
    status, _, body = srv.request("GET", "/v2/models/sim%70le?verbose=1")
    assert status == 200 and json.loads(body)["name"] == "simple"


def test_http_1_0_closes_after_the_answer(srv):
    raw = exchange(srv, b"GET /v2/health/live HTTP/1.0\r\n\r\n")
    assert raw.startswith(b"HTTP/1.0 200") and raw.endswith(b'{"live":true}')


def test_idle_keep_alive_connection_is_closed_after_the_timeout(srv):
    with socket.create_connection((srv.host, srv.port), timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = read_response(s)
        assert status == 200 and headers.get("connection", "keep-alive").lower() != "close"
        t0 = time.monotonic()
        assert s.recv(1) == b""  # closed by the server after --keep-alive-timeout 1
        assert 0.5 < time.monotonic() - t0 < 5


def test_sigterm_closes_idle_connections_at_once(model_repository):
    with Server("cpp", model_repository) as s:
        conns = [socket.create_connection((s.host, s.port), timeout=10) for _ in range(4)]
        for c in conns:
            c.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(c)[0] == 200
        t0 = time.monotonic()
        assert s.stop(signal.SIGTERM, timeout=30) == 0, s.log()
        # idle keep-alive connections do not hold the exit for the keep-alive timeout (5 s)
        assert time.monotonic() - t0 < 3, s.log()
        for c in conns:
            assert c.recv(1) == b""
            c.close()
