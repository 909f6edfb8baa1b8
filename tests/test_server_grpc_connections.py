"""aotc-server's gRPC connections, black box, as raw sockets speaking HTTP/2 frames and as Triton's gRPC client:
--grpc-max-connections (a connection beyond the cap gets a GOAWAY saying so, gRPC serves again once one
closes), a flood of connections under a low descriptor limit (HTTP keeps serving: gRPC's own listener took
connections until the process ran out of descriptors, and both endpoints stopped answering), a connection
without HTTP/2's preface closed at --header-timeout (HTTP/1.1 on the gRPC port told which port speaks what),
--grpc-max-connection-idle (an idle connection, and one dripping a HEADERS frame, closed; a client's next
call reconnects), and --grpc-max-connection-age (a call whose message drips in, closed with its connection). Every socket has a timeout; the server runs on the `simple` model alone.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from launch import Server, free_port, make_repository, server_argv
from test_protocol_grpc import T, assert_good_grpc, grpc, grpcclient, service_pb2_grpc
from test_server_http import assert_serving

pytestmark = pytest.mark.timeout(120)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame
HELLO = PREFACE + SETTINGS  # what a gRPC client sends first
GOAWAY, PROTOCOL_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x1, 0xb


def frame(kind: int, flags: int, stream: int, payload: bytes, length: int | None = None) -> bytes:
    n = len(payload) if length is None else length
    return n.to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def literal(name: bytes, value: bytes) -> bytes:
    """An HPACK header field, literal without indexing, neither string Huffman-coded (RFC 7541, 6.2.2)."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


# A ModelInfer call whose HEADERS are whole and whose DATA frame announces 1,000 bytes, of which the gRPC message
# prefix (uncompressed, 995 bytes) comes first; the client then drips the rest.
DRIPPED_CALL = HELLO + frame(0x1, 0x4, 1, b"".join(literal(n, v) for n, v in [
    (b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b":authority", b"x"), (b"content-type", b"application/grpc"), (b"te", b"trailers")])) + \
    frame(0x0, 0x0, 1, b"", length=1000) + b"\x00" + (995).to_bytes(4, "big")


@pytest.fixture(scope="module")
def simple_repo(tmp_path_factory, pkg_simple):
    return make_repository(tmp_path_factory.mktemp("simple_repo"), {"simple": pkg_simple})


def dial(port: int, send: bytes = b"", timeout: float = 10) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if send:
        s.sendall(send)
    return s


def frames(data: bytes) -> list[tuple[int, bytes]]:
    """The (type, payload) of each whole HTTP/2 frame in `data`."""
    out = []
    while len(data) >= 9:
        n = int.from_bytes(data[:3], "big")
        if len(data) < 9 + n:
            break
        out.append((data[3], data[9:9 + n]))
        data = data[9 + n:]
    return out


def read_until_closed(s: socket.socket, limit: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and the seconds that took."""
    t0, got = time.monotonic(), b""
    s.settimeout(limit)
    try:
        while chunk := s.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    except socket.timeout:
        pytest.fail(f"the server kept the connection open for {limit} s; it sent {got[:200]!r}")
    return got, time.monotonic() - t0


def greeted(s: socket.socket) -> bool:
    """Whether the server answered a gRPC client's hello with its SETTINGS frame (the connection is gRPC's)."""
    s.settimeout(10)
    try:
        return s.recv(4096)[3:4] == b"\x04"
    except OSError:
        return False


def goaway_of(data: bytes) -> tuple[int, str]:
    """The error code and debug text of the GOAWAY in `data`."""
    found = [p for t, p in frames(data) if t == GOAWAY]
    assert found, f"no GOAWAY frame in {data[:200]!r}"
    return struct.unpack(">I", found[0][4:8])[0], found[0][8:].decode()


def own_client(s: Server) -> grpcclient.InferenceServerClient:
    """Triton's gRPC client on a connection of its own (channels of one process otherwise share one)."""
    return grpcclient.InferenceServerClient(s.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)])


def served_again(s: Server, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while True:
        with grpc.insecure_channel(s.grpc_url, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            try:
                assert_good_grpc(service_pb2_grpc.GRPCInferenceServiceStub(channel))
                return
            except grpc.RpcError:
                assert time.monotonic() < deadline, "gRPC did not serve again after the connections closed"
        time.sleep(0.2)


def test_connections_beyond_the_cap_get_a_goaway(simple_repo):
    with Server("cpp", simple_repo, "--grpc-max-connections", "4") as s:
        held = [dial(s.grpc_port, HELLO) for _ in range(4)]
        try:
            assert all(greeted(c) for c in held)
            with dial(s.grpc_port, HELLO) as extra:
                data, _ = read_until_closed(extra, 10)
            code, text = goaway_of(data)
            assert code == ENHANCE_YOUR_CALM and "4 gRPC connections open (--grpc-max-connections)" in text, text
            client = own_client(s)
            t0 = time.monotonic()
            with pytest.raises(Exception, match="UNAVAILABLE"):
                client.is_server_live(client_timeout=T)
            assert time.monotonic() - t0 < 5, "a client turned away waited instead of failing"
            client.close()
            assert_serving(s)  # HTTP is not capped by gRPC's connections
            assert "gRPC: turned away" in s.log() and "--grpc-max-connections" in s.log()
        finally:
            for c in held:
                c.close()
        served_again(s)  # the closes are seen (a sweep every second) and the cap has room again


def test_a_flood_under_a_low_descriptor_limit_leaves_http_serving(simple_repo):
    """600 gRPC connections against a process allowed 350 descriptors, fewer than the caps of 64 and 64 need
    with 256 spare: the server lowers both caps to fit, and says so; gRPC holds at most its share, HTTP keeps
    answering, and gRPC serves again once the flood is gone."""
    grpc_port = free_port()
    flags = ("--grpc-port", str(grpc_port), "--max-connections", "64", "--grpc-max-connections", "64")
    command = lambda port: ["prlimit", "--nofile=350:350", "--", *server_argv("cpp", simple_repo, port, *flags)]  # noqa: E731
    with Server("cpp", simple_repo, command=command) as s:
        s.grpc_port = grpc_port
        assert ("the descriptor limit is 350, below the 384 that --max-connections 64 and --grpc-max-connections 64 "
                "need with 256 to spare: serving at most 47 HTTP and 47 gRPC connections") in s.log(), s.log()
        flood = []
        try:
            for _ in range(600):
                flood.append(dial(grpc_port, HELLO))
            greeted_count = sum(greeted(c) for c in flood)
            assert 0 < greeted_count <= 47, greeted_count
            for _ in range(3):
                assert_serving(s)
                assert s.request("GET", "/v2/health/ready", timeout=10)[0] == 200
        finally:
            for c in flood:
                c.close()
        served_again(s)


def test_a_connection_without_the_preface_is_closed_at_the_header_timeout(simple_repo):
    with Server("cpp", simple_repo, "--header-timeout", "1") as s:
        for opening in (b"", PREFACE[:10]):  # nothing at all; a part of the preface
            with dial(s.grpc_port, opening) as c:
                data, took = read_until_closed(c, 10)
            assert data == b"" and 0.8 < took < 3, (opening, data, took)
        with dial(s.grpc_port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n") as c:
            data, _ = read_until_closed(c, 10)
        assert data.startswith(b"HTTP/1.1 400 ") and b"this port serves gRPC" in data, data
        with dial(s.grpc_port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03") as c:  # a TLS ClientHello
            data, _ = read_until_closed(c, 10)
        code, text = goaway_of(data)
        assert code == PROTOCOL_ERROR and "client connection preface" in text, text
        with grpc.insecure_channel(s.grpc_url) as channel:  # gRPC clients are served all the while
            assert_good_grpc(service_pb2_grpc.GRPCInferenceServiceStub(channel))


def test_idle_connections_are_closed_and_a_client_reconnects(simple_repo):
    with Server("cpp", simple_repo, "--grpc-max-connection-idle", "1000") as s:
        with dial(s.grpc_port, HELLO) as idle:
            assert greeted(idle)
            data, took = read_until_closed(idle, 10)
        assert any(t == GOAWAY for t, _ in frames(data)) and 0.8 < took < 4, (data, took)
        # A HEADERS frame on stream 1 announcing 16 KiB, then dripped a byte at a time: no call yet, so idle.
        assert drip_until_closed(s.grpc_port, HELLO + frame(0x1, 0x0, 1, b"", length=16384), 10) < 4
        client = grpcclient.InferenceServerClient(s.grpc_url)
        assert client.is_server_live(client_timeout=T)
        # The connection is closed as idle (within 4 s, as the raw ones above; under ASan a GOAWAY has come 2 s
        # after the last call, racing a call sent then); the next call makes a new one.
        time.sleep(5)
        assert client.is_server_live(client_timeout=T) and client.is_model_ready("simple", client_timeout=T)
        client.close()


def drip_until_closed(port: int, opening: bytes, limit: float) -> float:
    """Seconds until the server closed a connection that sent `opening` and then a byte every 0.1 s."""
    with dial(port, opening) as c:
        stop = threading.Event()

        def drip():
            while not stop.wait(0.1):
                try:
                    c.send(b"a")
                except OSError:
                    return

        dripper = threading.Thread(target=drip)
        dripper.start()
        try:
            return read_until_closed(c, limit)[1]
        finally:
            stop.set()
            dripper.join()


def test_a_dripped_message_is_closed_at_the_connection_age(simple_repo):
    """A call whose message drips in never reaches the server's code (gRPC hands over a call once its message
    is whole): --grpc-max-connection-age, then --body-timeout, is what closes it."""
    with Server("cpp", simple_repo, "--grpc-max-connection-age", "1000", "--body-timeout", "1") as s:
        took = drip_until_closed(s.grpc_port, DRIPPED_CALL, 10)
        assert 1.5 < took < 5, took  # the age (jittered by 10 %) and the grace
        with grpc.insecure_channel(s.grpc_url) as channel:
            assert_good_grpc(service_pb2_grpc.GRPCInferenceServiceStub(channel))
