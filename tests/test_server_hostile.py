"""aotc-server (C++) under hostile clients, black box over raw sockets: request lines and headers past their
limits, clients that drip bytes or sit idle by the thousand, more connections than the cap, SIGTERM while
clients drip, readiness with a broken model, --exit-on-error, the API key from a file or the environment,
and a %00 in a path. Each case is one that crashed, locked out or misled the server before (issue 20); after
each the server must keep serving. Timeouts are set small by flags so the module stays short; nothing here
measures speed (bench/hostile.py does)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from launch import Server, make_repository, server_binary
from test_server import simple_body
from test_server_http import assert_serving, error_of, exchange, read_response

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def srv(model_repository):
    with Server("cpp", model_repository, "--allow-shared-memory") as s:
        yield s


def connect(s, timeout: float = 10) -> socket.socket:
    return socket.create_connection((s.host, s.port), timeout=timeout)


def complete(data: bytes) -> bool:
    """Whether `data` holds a whole answer (headers and the Content-Length of body)."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    length = [ln.split(b":", 1)[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
    return len(body) >= int(length[0]) if length else True


class Drippers:
    """`n` connections that each send the start of a request one byte at a time, every `every` seconds, from
    one thread, until stop() (a connection the server closes is dropped)."""

    def __init__(self, s, n: int, every: float = 0.25,
                 request: bytes = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10000):
        self.socks = [connect(s) for _ in range(n)]
        self.request, self.every = request, every
        self.closed: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drip, daemon=True)
        self._thread.start()

    def _drip(self):
        for i in range(len(self.request)):
            for k, c in enumerate(self.socks):
                if k not in self.closed:
                    try:
                        c.send(self.request[i:i + 1])
                    except OSError:
                        self.closed.add(k)
            if self._stop.wait(self.every):
                return

    def stop(self):
        self._stop.set()
        self._thread.join(10)

    def answers(self, timeout: float) -> list[bytes]:
        """What each connection got back: one whole answer, or what came before the server closed it (b"" when
        it closed without an answer)."""
        out = []
        for c in self.socks:
            c.settimeout(timeout)
            data = b""
            try:
                while not complete(data) and (chunk := c.recv(65536)):
                    data += chunk
            except ConnectionResetError:
                pass
            out.append(data)
        return out

    def close(self):
        self.stop()
        for c in self.socks:
            c.close()


# ---- limits on the request line and the headers ----

@pytest.mark.parametrize("method, path, n", [
    ("GET", "/v2/models/{}", 30000),
    ("POST", "/v2/models/{}/infer", 30000),
    ("GET", "/v2/systemsharedmemory/region/{}/status", 30000),
    ("POST", "/v2/repository/models/{}/load", 60000),
])
def test_a_long_path_gets_414_and_the_server_keeps_serving(srv, method, path, n):
    """A path of 30k-60k characters crashed the server (std::regex recursing until the stack overflowed)."""
    target = path.format("a" * n)
    raw = exchange(srv, f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
    status, message = error_of(raw)
    assert status == 414 and "8192 bytes" in message, message
    assert b"connection: close" in raw.lower()
    assert_serving(srv)


def test_a_path_just_under_the_limit_is_routed(srv):
    status, _, body = srv.request("GET", "/v2/models/" + "b" * 8000)
    assert status == 404 and "unknown model" in json.loads(body)["error"]
    status, _, body = srv.request("GET", "/v2/models/" + "/x" * 3000)  # thousands of segments
    assert status == 404 and "no route" in json.loads(body)["error"]
    assert_serving(srv)


def header_request(total: int) -> bytes:
    """A GET whose request line and headers, CRLFs and the blank line included, are exactly `total` bytes."""
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Fill: "
    return head + b"f" * (total - len(head) - 4) + b"\r\n\r\n"


def test_headers_over_64_kib_get_431_exactly(srv):
    """Two 60 KB headers got 200: the 64 KiB limit now holds for the request line and headers together."""
    two = b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 60000 + b"\r\nX-B: " + b"b" * 60000 + b"\r\n\r\n"
    status, message = error_of(exchange(srv, two))
    assert status == 431 and "65536 bytes" in message, message
    many = b"GET /v2 HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%05d: %s\r\n" % (i, b"v" * 90) for i in range(800)) + b"\r\n"
    assert error_of(exchange(srv, many))[0] == 431
    assert exchange(srv, header_request(64 << 10)).startswith(b"HTTP/1.1 200")
    assert error_of(exchange(srv, header_request((64 << 10) + 1)))[0] == 431
    assert_serving(srv)


def test_a_nul_in_a_model_name_is_kept_in_the_error(srv):
    """%00 cut the error text short at the NUL; the message now keeps every byte, escaped in the JSON."""
    status, _, body = srv.request("GET", "/v2/models/ab%00cd")
    assert status == 404 and json.loads(body)["error"] == "Request for unknown model: 'ab\x00cd' is not found", body
    assert b"\\u0000" in body


# ---- slow and idle clients ----

def test_slow_clients_do_not_lock_others_out(model_repository):
    """More clients dripping header bytes than --http-threads: they hold no thread, a normal request and the
    health probe are still answered."""
    with Server("cpp", model_repository, "--http-threads", "16") as s:
        drippers = Drippers(s, 64)
        try:
            time.sleep(0.5)
            assert s.request("GET", "/v2/health/ready", timeout=10)[0] == 200
            assert_serving(s)
        finally:
            drippers.close()


def test_a_dripped_header_gets_408_at_the_header_deadline(model_repository):
    """The header deadline counts from the header's first byte and is not restarted by later bytes."""
    with Server("cpp", model_repository, "--header-timeout", "1", "--body-timeout", "1") as s:
        drippers = Drippers(s, 40, every=0.2)
        try:
            t0 = time.monotonic()
            answers = drippers.answers(timeout=15)
            assert time.monotonic() - t0 < 10
        finally:
            drippers.close()
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers), {a[:40] for a in answers}
        assert "--header-timeout 1 s" in error_of(answers[0])[1]
        # a body that stops coming: 408 at the body deadline
        with connect(s) as c:
            c.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            status, _, body = read_response(c, "POST")
        assert status == 408 and "--body-timeout 1 s" in json.loads(body)["error"]
        assert_serving(s)


def test_2000_idle_connections_do_not_delay_a_request(model_repository):
    """2,000 idle keep-alive connections held every connection thread and delayed others for more than 10 s."""
    with Server("cpp", model_repository, "--keep-alive-timeout", "60") as s:
        idle = []
        try:
            for _ in range(2000):
                idle.append(connect(s))
            idle[-1].sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(idle[-1])[0] == 200  # the last one opened is served: all 2,000 are accepted
            body, a, b = simple_body(seed=9)
            status, _, data = s.request("POST", "/v2/models/simple/infer", body, timeout=10)
            assert status == 200 and json.loads(data)["outputs"][0]["data"] == (a + b).ravel().tolist()
        finally:
            for c in idle:
                c.close()


def test_connections_beyond_the_cap_get_503(model_repository):
    with Server("cpp", model_repository, "--max-connections", "8") as s:
        held = []
        try:
            # All eight are served. The harness's own readiness probes close just before this; until the server
            # has seen those closes they still count, so a connection answered 503 here is tried again.
            deadline = time.monotonic() + 10
            while len(held) < 8:
                c = connect(s)
                c.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                status = read_response(c)[0]
                if status == 200:
                    held.append(c)
                    continue
                c.close()
                assert status == 503 and time.monotonic() < deadline, status
                time.sleep(0.05)
            with connect(s) as extra:
                status, headers, body = read_response(extra)
                assert extra.recv(1) == b""  # closed after the answer
            assert status == 503 and headers["connection"] == "close"
            assert "--max-connections" in json.loads(body)["error"]
        finally:
            for c in held:
                c.close()
        deadline = time.monotonic() + 10  # the closes reach the server; a new connection is served again
        while s.request("GET", "/v2/health/live", timeout=10)[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)


# ---- shutdown ----

def test_sigterm_with_slow_clients_exits_within_the_deadline(model_repository):
    """Clients dripping headers held a SIGTERMed server for as long as they dripped. Now: the request whose body
    was arriving is answered, the drippers get 503 (or are closed) within the deadline, the exit code is 0."""
    with Server("cpp", model_repository, "--exit-timeout-secs", "2") as s:
        drippers = Drippers(s, 20)
        body, a, b = simple_body(seed=3)
        data = body.encode()
        c = connect(s, timeout=30)
        c.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(data)
                  + data[:50])
        time.sleep(0.3)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        c.sendall(data[50:])  # the rest of a request that was accepted before the signal
        status, headers, answer = read_response(c, "POST")
        c.close()
        assert status == 200 and headers["connection"] == "close"
        assert json.loads(answer)["outputs"][0]["data"] == (a + b).ravel().tolist()
        code = s.proc.wait(15)
        elapsed = time.monotonic() - t0
        answers = drippers.answers(timeout=5)
        drippers.close()
        assert code == 0 and elapsed < 5, (code, elapsed, s.log()[-2000:])
        assert all(a == b"" or a.startswith(b"HTTP/1.1 503") for a in answers), {a[:40] for a in answers}
        assert any(a.startswith(b"HTTP/1.1 503") and b"shutting down" in a for a in answers)


# ---- readiness and start-up ----

@pytest.fixture
def broken_repository(tmp_path, pkg_mlp):
    repo = make_repository(tmp_path / "repo", {"mlp": pkg_mlp})
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.pt2").write_bytes(pkg_mlp.read_bytes()[: 1 << 16])
    return repo


def test_strict_readiness_waits_for_every_model(broken_repository, pkg_mlp):
    """/v2/health/ready answered 200 with a model that failed to load; 503 now, until it loads."""
    with Server("cpp", broken_repository, ready_path="/v2/models/mlp/ready") as s:
        assert s.json("GET", "/v2/health/ready") == (503, {"ready": False})
        assert s.json("GET", "/v2/health/live")[0] == 200
        deadline = time.monotonic() + 10
        while "not ready while 1 model(s) are not" not in s.log():  # logged once the initial load is done
            assert time.monotonic() < deadline, s.log()
            time.sleep(0.05)
        (broken_repository / "broken" / "1" / "model.pt2").write_bytes(pkg_mlp.read_bytes())
        assert s.json("POST", "/v2/repository/models/broken/load", {})[0] == 200
        assert s.json("GET", "/v2/health/ready") == (200, {"ready": True})
        assert s.json("POST", "/v2/repository/models/mlp/unload", {})[0] == 200  # unloaded on purpose: ready
        assert s.json("GET", "/v2/health/ready") == (200, {"ready": True})


def test_no_strict_readiness_is_ready_with_a_broken_model(broken_repository):
    with Server("cpp", broken_repository, "--no-strict-readiness") as s:
        assert s.json("GET", "/v2/health/ready") == (200, {"ready": True})
        assert s.json("GET", "/v2/models/broken/ready")[0] == 503


def test_exit_on_error_names_the_broken_model(broken_repository):
    r = subprocess.run([str(server_binary()), "--model-repository", str(broken_repository), "--http-port", "0",
                        "--grpc-port", "-1", "--exit-on-error"], capture_output=True, text=True, timeout=120)
    errors = [line for line in r.stderr.splitlines() if line.startswith("aotc-server: error:")]
    assert r.returncode == 1 and len(errors) == 1, r.stderr
    assert "--exit-on-error" in errors[0] and "model 'broken'" in errors[0] and "corrupt" in errors[0]


# ---- the API key ----

def authorized(s, value: str) -> int:
    return s.json("GET", "/v2/models/simple", headers={"Authorization": value})[0]


def test_api_key_from_a_file_or_the_environment(model_repository, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("fr0m-file\n")
    with Server("cpp", model_repository, "--api-key-file", str(key_file)) as s:
        assert authorized(s, "Bearer fr0m-file") == 200 and authorized(s, "Bearer fr0m-fil") == 401
        assert authorized(s, "Bearer fr0m-file!") == 401 and authorized(s, "Basic fr0m-file") == 401
        assert b"fr0m-file" not in open(f"/proc/{s.proc.pid}/cmdline", "rb").read()
    with Server("cpp", model_repository, env={**os.environ, "AOTC_API_KEY": "fr0m-env"}) as s:
        assert authorized(s, "Bearer fr0m-env") == 200 and s.json("GET", "/v2/models/simple")[0] == 401
    # a flag wins over the environment
    with Server("cpp", model_repository, "--api-key-file", str(key_file), env={**os.environ, "AOTC_API_KEY": "e"}) as s:
        assert authorized(s, "Bearer fr0m-file") == 200 and authorized(s, "Bearer e") == 401


def test_the_bearer_scheme_is_case_insensitive(model_repository):
    with Server("cpp", model_repository, "--api-key", "k3y") as s:
        for scheme in ("Bearer", "bearer", "BEARER"):
            assert authorized(s, f"{scheme} k3y") == 200, scheme
        assert authorized(s, "bearer k3") == 401


@pytest.mark.parametrize("flags, message", [
    (["--api-key", "a", "--api-key-file", "/etc/hostname"], "give --api-key or --api-key-file, not both"),
    (["--api-key-file", "/no/such/key"], "cannot read --api-key-file '/no/such/key'"),
    (["--api-key-file", "/dev/null"], "--api-key-file '/dev/null' is empty"),
    (["--max-connections", "0"], "--max-connections expects an integer in 1..1000000, got '0'"),
    (["--header-timeout", "0"], "--header-timeout expects an integer in 1..3600, got '0'"),
    (["--exit-timeout-secs", "x"], "--exit-timeout-secs expects an integer in 0..3600, got 'x'"),
    (["--no-strict-readiness=1"], "--no-strict-readiness takes no value"),
])
def test_bad_key_and_limit_flags_exit_with_one_line(flags, message):
    r = subprocess.run([str(server_binary()), "--model-repository", ".", *flags],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr
