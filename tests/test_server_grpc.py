"""aotc-server's gRPC endpoint beside its HTTP one, black box: system shared memory over gRPC (inputs and
outputs in regions, a region registered over one transport serving the other, PERMISSION_DENIED without
--allow-shared-memory), CUDA shared memory without a GPU, HTTP and gRPC clients at once, repository control
(load with a config override, unload) over gRPC, and the flags: --api-key as `authorization` metadata,
--max-body-bytes as the largest message, gzip and deflate requests and --grpc-infer-response-compression-level
(bytes on the wire counted by a TCP relay in the test, so compression is seen, not assumed), the keep-alive
flags, --grpc-port 0 and -1, and bad values of each; SIGTERM with calls in flight and a stream open.

The protocol itself is tests/test_protocol_grpc.py, whose helpers this uses. Every call has a client timeout.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

from launch import Server, flag_value, make_repository, server_binary
from perf_analyzer import server_cpu_s
from test_protocol import close, simple_inputs
from test_protocol import mlp_sample  # noqa: F401 (fixture: 4 rows of the MLP's sample, eager outputs)
from test_protocol_grpc import (T, assert_good_grpc, decode, failure, grpc, grpc_request, grpcclient, normal,
                                pb, rpc_failure, service_pb2_grpc, simple_specs, triton_inputs)
from test_server import metric
from test_server_shm import region  # noqa: F401 (fixture: fresh POSIX shared memory objects)

shm = pytest.importorskip("tritonclient.utils.shared_memory")
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def srv(model_repository):
    with Server("cpp", model_repository, "--allow-shared-memory") as s:
        if s.grpc_url is None and "AOTC_GRPC=OFF" in s.log():
            pytest.skip("this aotc-server was built without its gRPC endpoint (AOTC_GRPC=OFF)")
        yield s


@pytest.fixture(scope="module")
def client(srv):
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    yield c
    c.close()


@pytest.fixture
def no_regions(srv):
    yield
    assert srv.json("POST", "/v2/systemsharedmemory/unregister", {})[0] == 200


@pytest.fixture(scope="module")
def simple_repo(tmp_path_factory, pkg_simple):
    return make_repository(tmp_path_factory.mktemp("simple_repo"), {"simple": pkg_simple})


# ---- answers: the raw contents the server serializes itself -----------------------------------------------
def test_large_and_small_answers_parse_as_the_message(client, srv, mlp_sample):  # noqa: F811
    """ModelInfer's answer is serialized by the server (tensor bytes as views, small ones inline): a 64-row MLP
    answer (128 KiB), a 1-row one (2 KiB), and simple's two 64-byte outputs in one answer all come back as
    tritonclient parses them, equal to eager and to the HTTP answer."""
    x, ref = mlp_sample
    for rows in (64, 1):
        xs, want = np.resize(x, (rows, x.shape[1])), np.resize(ref, (rows, ref.shape[1]))
        inp = grpcclient.InferInput("x", list(xs.shape), "FP32")
        inp.set_data_from_numpy(xs.astype(np.float32))
        r = client.infer("mlp", [inp], client_timeout=T)
        got = r.as_numpy("output0")
        assert got.shape == want.shape and close(got, want), rows
        resp = r.get_response()
        assert len(resp.raw_output_contents) == 1 and len(resp.raw_output_contents[0]) == want.nbytes
    a, b = np.arange(32, dtype=np.int32).reshape(2, 16), np.full((2, 16), 3, np.int32)
    inputs = []
    for name, v in (("INPUT0", a), ("INPUT1", b)):
        i = grpcclient.InferInput(name, [2, 16], "INT32")
        i.set_data_from_numpy(v)
        inputs.append(i)
    r = client.infer("simple", inputs, request_id="q7", client_timeout=T)
    assert r.get_response().id == "q7" and r.get_response().model_name == "simple"
    assert (r.as_numpy("OUTPUT0") == a + b).all() and (r.as_numpy("OUTPUT1") == a - b).all()


# ---- shared memory, shared with HTTP ------------------------------------------------------------------------

def test_inputs_and_outputs_in_system_shared_memory(client, srv, region, mlp_sample, no_regions):  # noqa: F811
    x, ref = mlp_sample
    h_in, key_in = region("g_in", x.nbytes)
    h_out, key_out = region("g_out", ref.nbytes)
    shm.set_shared_memory_region(h_in, [x])
    client.register_system_shared_memory("g_in", key_in, x.nbytes, client_timeout=T)
    client.register_system_shared_memory("g_out", key_out, ref.nbytes, client_timeout=T)
    http = srv.json("GET", "/v2/systemsharedmemory/status")[1]
    assert {r["name"]: r for r in http}["g_in"] == {"name": "g_in", "key": key_in, "offset": 0, "byte_size": x.nbytes}
    got = client.get_system_shared_memory_status(as_json=True, client_timeout=T)
    assert normal(pb.SystemSharedMemoryStatusResponse, got) == normal(
        pb.SystemSharedMemoryStatusResponse, {"regions": {r["name"]: r for r in http}})
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_shared_memory("g_in", x.nbytes)
    out = grpcclient.InferRequestedOutput("output0")
    out.set_shared_memory("g_out", ref.nbytes)
    resp = client.infer("mlp", [inp], outputs=[out], client_timeout=T).get_response()
    (o,) = resp.outputs
    assert (o.name, o.datatype, list(o.shape), len(o.parameters)) == ("output0", "FP32", list(ref.shape), 0), o
    assert list(resp.raw_output_contents) == [b""]
    assert close(shm.get_contents_as_numpy(h_out, np.float32, list(ref.shape)), ref)
    client.unregister_system_shared_memory("g_in", client_timeout=T)
    assert [r["name"] for r in srv.json("GET", "/v2/systemsharedmemory/status")[1]] == ["g_out"]


def test_a_region_registered_over_one_transport_serves_the_other(client, srv, region, no_regions):  # noqa: F811
    a, b = simple_inputs(2, seed=6)
    h, key = region("in_http", a.nbytes + b.nbytes)
    shm.set_shared_memory_region(h, [a, b])
    status, body = srv.json("POST", "/v2/systemsharedmemory/region/in_http/register",
                            {"key": key, "offset": 0, "byte_size": a.nbytes + b.nbytes})
    assert status == 200, body
    i0, i1 = grpcclient.InferInput("INPUT0", [2, 16], "INT32"), grpcclient.InferInput("INPUT1", [2, 16], "INT32")
    i0.set_shared_memory("in_http", a.nbytes)
    i1.set_shared_memory("in_http", b.nbytes, offset=a.nbytes)
    r = client.infer("simple", [i0, i1], client_timeout=T)
    assert np.array_equal(r.as_numpy("OUTPUT0"), a + b) and np.array_equal(r.as_numpy("OUTPUT1"), a - b)

    h2, key2 = region("out_grpc", a.nbytes)
    client.register_system_shared_memory("out_grpc", key2, a.nbytes, client_timeout=T)
    status, r = srv.json("POST", "/v2/models/simple/infer", {
        "inputs": [{"name": n, "shape": [2, 16], "datatype": "INT32", "data": x.ravel().tolist()}
                   for n, x in (("INPUT0", a), ("INPUT1", b))],
        "outputs": [{"name": "OUTPUT1", "parameters": {"shared_memory_region": "out_grpc",
                                                       "shared_memory_byte_size": a.nbytes}}]})
    assert status == 200, r
    assert np.array_equal(shm.get_contents_as_numpy(h2, np.int32, [2, 16]), a - b)
    client.unregister_system_shared_memory(client_timeout=T)  # all, over gRPC: HTTP sees none left
    assert srv.json("GET", "/v2/systemsharedmemory/status") == (200, [])


def test_cuda_shared_memory_answers_as_tritons_cpu_build(client, srv):
    if "cuda_shared_memory" in client.get_server_metadata(client_timeout=T).extensions:
        pytest.skip("this server has a GPU (tests/test_server_cuda.py covers CUDA shared memory there)")
    assert len(client.get_cuda_shared_memory_status(client_timeout=T).regions) == 0
    client.unregister_cuda_shared_memory(client_timeout=T)
    client.unregister_cuda_shared_memory("never_registered", client_timeout=T)
    handle = base64.b64encode(bytes(64))
    status, body = srv.json("POST", "/v2/cudasharedmemory/region/gpu0/register",
                            {"raw_handle": {"b64": handle.decode()}, "device_id": 0, "byte_size": 1024})
    assert status == 400 and "GPUs not supported" in body["error"], body
    e = failure(client.register_cuda_shared_memory, "gpu0", handle, 0, 1024, client_timeout=T)
    assert (e.status(), e.message()) == ("StatusCode.INVALID_ARGUMENT", body["error"])


def test_shared_memory_off_is_permission_denied(simple_repo, region):  # noqa: F811
    h, key = region("off", 64)
    with Server("cpp", simple_repo) as s:
        c = grpcclient.InferenceServerClient(s.grpc_url)
        status, body = s.json("POST", "/v2/systemsharedmemory/region/off/register", {"key": key, "byte_size": 64})
        assert status == 403 and "--allow-shared-memory" in body["error"], body
        for call in (lambda: c.register_system_shared_memory("off", key, 64, client_timeout=T),
                     lambda: c.get_system_shared_memory_status(client_timeout=T)):
            e = failure(call)
            assert (e.status(), e.message()) == ("StatusCode.PERMISSION_DENIED", body["error"])
        c.close()


def test_http_keeps_serving_alongside(srv, mlp_sample):
    """Two gRPC and two HTTP clients at once, twenty requests each: every answer right."""
    x, ref = mlp_sample
    failures = []

    def over_grpc(seed):
        c = grpcclient.InferenceServerClient(srv.grpc_url)
        try:
            for i in range(20):
                a, b = simple_inputs(1 + i % 4, seed=seed * 100 + i)
                if not np.array_equal(c.infer("simple", triton_inputs(a, b), client_timeout=T).as_numpy("OUTPUT1"),
                                      a - b):
                    failures.append(("grpc", seed, i))
        except Exception as e:  # noqa: BLE001 (reported below, with the others)
            failures.append(("grpc", seed, repr(e)))
        finally:
            c.close()

    def over_http(seed):
        try:
            for i in range(20):
                status, r = srv.json("POST", "/v2/models/mlp/infer", {"inputs": [
                    {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]})
                if status != 200 or not close(np.array(r["outputs"][0]["data"], np.float32).reshape(ref.shape), ref):
                    failures.append(("http", seed, i, status))
        except Exception as e:  # noqa: BLE001
            failures.append(("http", seed, repr(e)))

    threads = [threading.Thread(target=f, args=(seed,))
               for seed, f in enumerate((over_grpc, over_grpc, over_http, over_http))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert failures == [] and not any(t.is_alive() for t in threads)


# ---- repository control ----------------------------------------------------------------------------------------

def test_load_unload_and_a_config_override(simple_repo):
    a, b = simple_inputs(2, seed=8)
    with Server("cpp", simple_repo) as s:
        c = grpcclient.InferenceServerClient(s.grpc_url)
        c.unload_model("simple", client_timeout=T)
        assert c.is_model_ready("simple", client_timeout=T) is False  # not ready is an answer, not an error
        status, body = s.json("POST", "/v2/models/simple/infer", {"inputs": [
            {"name": n, "shape": [2, 16], "datatype": "INT32", "data": x.ravel().tolist()}
            for n, x in (("INPUT0", a), ("INPUT1", b))]})
        assert status == 503
        e = failure(c.infer, "simple", triton_inputs(a, b), client_timeout=T)
        assert (e.status(), e.message()) == ("StatusCode.UNAVAILABLE", body["error"])
        assert normal(pb.RepositoryIndexResponse, c.get_model_repository_index(as_json=True, client_timeout=T)) == \
            normal(pb.RepositoryIndexResponse, {"models": s.json("POST", "/v2/repository/index", {})[1]})
        c.load_model("simple", client_timeout=T)
        assert c.is_model_ready("simple", client_timeout=T) is True
        for config in ("{not json", json.dumps({"nope": 1}), json.dumps({"max_batch_size": -1})):
            status, body = s.json("POST", "/v2/repository/models/simple/load", {"parameters": {"config": config}})
            assert status == 400, body
            e = failure(c.load_model, "simple", config=config, client_timeout=T)
            assert (e.status(), e.message()) == ("StatusCode.INVALID_ARGUMENT", body["error"]), config
        assert c.get_model_config("simple", client_timeout=T).config.max_batch_size == 64  # junk changed nothing
        c.load_model("simple", config=json.dumps({"max_batch_size": 4, "max_queue_delay_us": 50}), client_timeout=T)
        cfg = c.get_model_config("simple", client_timeout=T).config
        assert cfg.max_batch_size == 4 and cfg.dynamic_batching.max_queue_delay_microseconds == 50
        assert s.json("GET", "/v2/models/simple/config")[1]["max_batch_size"] == 4
        assert np.array_equal(c.infer("simple", triton_inputs(a, b), client_timeout=T).as_numpy("OUTPUT0"), a + b)
        c.load_model("simple", client_timeout=T)
        assert c.get_model_config("simple", client_timeout=T).config.max_batch_size == 64
        status, body = s.json("POST", "/v2/repository/models/nope/load", {})
        e = failure(c.load_model, "nope", client_timeout=T)
        assert status == 404 and (e.status(), e.message()) == ("StatusCode.NOT_FOUND", body["error"])
        c.close()


# ---- the API key ------------------------------------------------------------------------------------------------

def test_api_key_in_metadata(simple_repo):
    a, b = simple_inputs(1, seed=9)
    with Server("cpp", simple_repo, "--api-key", "k3y", "--allow-shared-memory") as s:
        c = grpcclient.InferenceServerClient(s.grpc_url)
        # the health RPCs need no key, as /v2/health/* over HTTP
        assert c.is_server_live(client_timeout=T) and c.is_server_ready(client_timeout=T)
        assert c.is_model_ready("simple", client_timeout=T)
        calls = {"metadata": lambda h: c.get_server_metadata(headers=h, client_timeout=T),
                 "model metadata": lambda h: c.get_model_metadata("simple", headers=h, client_timeout=T),
                 "config": lambda h: c.get_model_config("simple", headers=h, client_timeout=T),
                 "index": lambda h: c.get_model_repository_index(headers=h, client_timeout=T),
                 "statistics": lambda h: c.get_inference_statistics("simple", headers=h, client_timeout=T),
                 "shm status": lambda h: c.get_system_shared_memory_status(headers=h, client_timeout=T),
                 "infer": lambda h: c.infer("simple", triton_inputs(a, b), headers=h, client_timeout=T)}
        for value in (None, "Bearer wrong", "Bearer k3", "Basic k3y", "k3y"):
            status, _, data = s.request("GET", "/v2/models/simple", headers={"Authorization": value} if value else {})
            assert status == 401
            text = json.loads(data)["error"]
            for what, call in calls.items():
                e = failure(call, {"authorization": value} if value else None)
                assert (e.status(), e.message()) == ("StatusCode.UNAUTHENTICATED", text), (value, what)
        for scheme in ("Bearer", "bearer", "BEARER"):
            for what, call in calls.items():
                call({"authorization": f"{scheme} k3y"})
        r = calls["infer"]({"authorization": "Bearer k3y"})
        assert np.array_equal(r.as_numpy("OUTPUT0"), a + b)
        with grpc.insecure_channel(s.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = grpc_request("simple", simple_specs(a, b))
            with pytest.raises(grpc.RpcError) as e:
                list(stub.ModelStreamInfer(iter([request]), timeout=T))
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            (answer,) = stub.ModelStreamInfer(iter([request]), timeout=T, metadata=[("authorization", "Bearer k3y")])
            assert answer.error_message == "" and np.array_equal(decode(answer.infer_response)["OUTPUT1"], a - b)
            assert_good_grpc(stub, metadata=[("authorization", "bearer k3y")])
        c.close()


# ---- message size, compression ---------------------------------------------------------------------------------

def test_a_message_over_max_body_bytes(model_repository, mlp_sample):  # noqa: F811
    x, ref = mlp_sample  # [4, 512] FP32: 8 KiB of raw contents
    with Server("cpp", model_repository, "--max-body-bytes", "8192") as s:
        with grpc.insecure_channel(s.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for rows in (4, 16):
                big = grpc_request("mlp", [{"name": "x", "datatype": "FP32", "shape": [rows, 512],
                                            "raw": np.resize(x, (rows, 512)).tobytes()}])
                e = rpc_failure(stub.ModelInfer, big)
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.code(), e.details())
                small = grpc_request("mlp", [{"name": "x", "datatype": "FP32", "shape": [1, 512],
                                              "raw": x[:1].tobytes()}])
                assert close(decode(stub.ModelInfer(small, timeout=T))["output0"], ref[:1])
                assert_good_grpc(stub)
        assert s.proc.poll() is None and s.json("GET", "/v2/health/ready") == (200, {"ready": True})


class Relay:
    """127.0.0.1:port -> 127.0.0.1:target over TCP, counting the bytes each way (up: client to server)."""

    def __init__(self, target: int):
        self.target, self.up, self.down, self.lock = target, 0, 0, threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(conn, server, "up"), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, conn, "down"), daemon=True).start()

    def _pipe(self, src, dst, direction):
        try:
            while data := src.recv(65536):
                with self.lock:
                    setattr(self, direction, getattr(self, direction) + len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def bytes_of(self, fn) -> tuple[int, int]:
        """(up, down) bytes while fn() ran."""
        with self.lock:
            up0, down0 = self.up, self.down
        fn()
        with self.lock:
            return self.up - up0, self.down - down0


def compressible(rows=64):
    a = np.tile(np.arange(16, dtype=np.int32) * 1000, (rows, 1))  # 4 KiB a tensor, mostly repeats
    return a, 3 * a


def test_request_compression(srv):
    a, b = compressible()
    relay = Relay(srv.grpc_port)
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{relay.port}")
    try:
        assert c.is_server_ready(client_timeout=T)
        sizes = {}
        for algorithm in (None, "gzip", "deflate"):
            def call():
                r = c.infer("simple", triton_inputs(a, b), compression_algorithm=algorithm, client_timeout=T)
                assert np.array_equal(r.as_numpy("OUTPUT0"), a + b) and np.array_equal(r.as_numpy("OUTPUT1"), a - b)
            sizes[algorithm] = relay.bytes_of(call)
        up = {k: v[0] for k, v in sizes.items()}
        assert up[None] > a.nbytes + b.nbytes and up["gzip"] < up[None] / 4 and up["deflate"] < up[None] / 4, sizes
        assert all(down > 2 * a.nbytes for _, down in sizes.values()), sizes  # answers: by default uncompressed
    finally:
        c.close()
        relay.sock.close()


@pytest.mark.parametrize("level", ["none", "low", "medium", "high"])
def test_response_compression_level(simple_repo, level):
    a, b = compressible()
    with Server("cpp", simple_repo, "--grpc-infer-response-compression-level", level) as s:
        relay = Relay(s.grpc_port)
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{relay.port}")
        try:
            assert c.is_server_ready(client_timeout=T)

            def call():
                r = c.infer("simple", triton_inputs(a, b), client_timeout=T)
                assert np.array_equal(r.as_numpy("OUTPUT0"), a + b) and np.array_equal(r.as_numpy("OUTPUT1"), a - b)
            down = relay.bytes_of(call)[1]
        finally:
            c.close()
            relay.sock.close()
    outputs = 2 * a.nbytes
    assert down > outputs if level == "none" else down < outputs / 4, (level, down)


# ---- flags ----------------------------------------------------------------------------------------------------

def test_keepalive_flags_are_accepted(simple_repo):
    flags = ["--grpc-keepalive-time", "20000", "--grpc-keepalive-timeout", "5000",
             "--grpc-keepalive-permit-without-calls", "--grpc-http2-max-pings-without-data", "0",
             "--grpc-http2-min-recv-ping-interval-without-data", "1000", "--grpc-http2-max-ping-strikes", "3"]
    with Server("cpp", simple_repo, *flags) as s, grpc.insecure_channel(s.grpc_url) as channel:
        assert_good_grpc(service_pb2_grpc.GRPCInferenceServiceStub(channel))


def test_busy_poll_spins_between_calls_and_sleeps_when_idle(simple_repo):
    """--busy-poll-us holds the gRPC poller awake between calls, then lets it sleep: calls 3 ms apart keep a
    core busy for most of the gaps (the poller looks for the next event without sleeping), answers and a
    stream stay right, and once the calls stop the server's CPU falls to nothing (no endless spin)."""
    a, b = simple_inputs(1, seed=5)
    request = grpc_request("simple", simple_specs(a, b))
    with Server("cpp", simple_repo, "--busy-poll-us", "20000") as s, grpc.insecure_channel(s.grpc_url) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        assert_good_grpc(stub)
        cpu0, t0 = server_cpu_s(s), time.monotonic()
        for _ in range(100):
            out = decode(stub.ModelInfer(request, timeout=T))
            assert (out["OUTPUT0"] == a + b).all() and (out["OUTPUT1"] == a - b).all()
            time.sleep(0.003)
        busy, wall = server_cpu_s(s) - cpu0, time.monotonic() - t0
        assert busy > 0.5 * 0.3, (busy, wall)  # the 100 gaps of 3 ms, mostly spent spinning
        answers = list(stub.ModelStreamInfer(iter([request] * 5), timeout=T))
        assert len(answers) == 5 and all(not r.error_message for r in answers), answers
        time.sleep(0.1)  # past the last spin
        cpu0 = server_cpu_s(s)
        time.sleep(1.0)
        assert server_cpu_s(s) - cpu0 < 0.2
        assert s.stop() == 0
    with Server("cpp", simple_repo) as s, grpc.insecure_channel(s.grpc_url) as ch:  # without it: no spin
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        assert_good_grpc(stub)
        cpu0 = server_cpu_s(s)
        for _ in range(100):
            stub.ModelInfer(request, timeout=T)
            time.sleep(0.003)
        assert server_cpu_s(s) - cpu0 < 0.5 * 0.3


@pytest.mark.parametrize("flag, value", [
    ("--grpc-port", "x"), ("--grpc-port", "70000"), ("--grpc-port", "-2"), ("--grpc-infer-thread-count", "0"),
    ("--grpc-keepalive-time", "x"), ("--grpc-keepalive-timeout", "soon"),
    ("--grpc-http2-max-pings-without-data", "x"), ("--grpc-http2-min-recv-ping-interval-without-data", "x"),
    ("--grpc-http2-max-ping-strikes", "x"), ("--grpc-infer-response-compression-level", "max"),
    ("--grpc-max-connections", "0"), ("--grpc-max-connections", "many"), ("--grpc-max-connection-idle", "-1"),
    ("--grpc-max-connection-age", "soon"),
])
def test_bad_grpc_flag_values_exit_with_one_line(flag, value):
    r = subprocess.run([str(server_binary()), "--model-repository", ".", flag, value], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and flag in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_grpc_port_zero_and_minus_one(simple_repo):
    with Server("cpp", simple_repo, "--grpc-port", "0") as s:
        assert s.grpc_port not in (None, 0, s.port) and f"listening on grpc://127.0.0.1:{s.grpc_port}" in s.log()
        with grpc.insecure_channel(s.grpc_url) as channel:
            assert_good_grpc(service_pb2_grpc.GRPCInferenceServiceStub(channel))
    with Server("cpp", simple_repo, "--grpc-port", "-1") as s:
        assert s.grpc_url is None and "listening on grpc://" not in s.log()
        assert f"listening on http://127.0.0.1:{s.port}" in s.log() and s.json("GET", "/v2/health/ready")[0] == 200
    help_text = subprocess.run([str(server_binary()), "--help"], capture_output=True, text=True, timeout=30).stdout
    entry = re.search(r"^  --grpc-port .*?(?=^  --)", help_text, re.M | re.S)  # the flag and its continuation lines
    assert entry and "default 8001" in " ".join(entry.group(0).split()), help_text


def test_the_launcher_reads_flags_as_the_server_does():
    assert flag_value(("--grpc-port", "0"), "--grpc-port") == "0"
    assert flag_value(("--grpc-port=5", "--x", "--grpc-port", "7"), "--grpc-port") == "7"
    assert flag_value(("--grpc-port-other", "1", "--grpc-port"), "--grpc-port") is None


def test_sigterm_answers_every_accepted_grpc_call(tmp_path, pkg_mlp):
    """SIGTERM with ModelInfer calls in flight (one runner, no batching: most are still queued) and a stream
    open with requests answered: every accepted call gets its answer, the open stream is ended at
    --exit-timeout-secs, and the server exits 0."""
    repo = make_repository(tmp_path / "repo", {"mlp": pkg_mlp}, {"mlp": {"max_batch_size": 0, "num_runners": 1}})
    n = 16
    x = np.random.default_rng(0).standard_normal((1024, 512)).astype(np.float32)
    request = grpc_request("mlp", [{"name": "x", "datatype": "FP32", "shape": [1024, 512], "raw": x.tobytes()}])
    results: list = [None] * n
    with Server("cpp", repo, "--exit-timeout-secs", "5") as s:
        channel = grpc.insecure_channel(s.grpc_url, options=[("grpc.max_receive_message_length", 8 << 20)])
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
        c = grpcclient.InferenceServerClient(s.grpc_url)
        answers: list = []
        c.start_stream(callback=lambda result, error: answers.append((result, error)), stream_timeout=60)
        inp = grpcclient.InferInput("x", [1, 512], "FP32")
        inp.set_data_from_numpy(x[:1])
        c.async_stream_infer("mlp", [inp], request_id="open")

        def send(i):
            try:
                results[i] = decode(call(request, timeout=120))["output0"].shape
            except grpc.RpcError as e:
                results[i] = e

        threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while True:  # every call inside the server (queued or answered), some still waiting
            text = s.request("GET", "/metrics")[2].decode()
            pending = metric(text, "nv_inference_pending_request_count", "mlp")
            if pending + metric(text, "nv_inference_request_success", "mlp") >= n + 1:
                break
            assert time.monotonic() < deadline, "calls never reached the server"
            time.sleep(0.005)
        assert pending > 0, "the model answered everything before SIGTERM; nothing was in flight"
        started = time.monotonic()
        code = s.stop(signal.SIGTERM, timeout=120)
        for t in threads:
            t.join(120)
        c.stop_stream()
        channel.close()
        assert code == 0, s.log()
        assert time.monotonic() - started < 5 + 10, s.log()
        assert all(r == (1024, 512) for r in results), results
        assert answers and answers[0][1] is None and answers[0][0].get_response().id == "open", answers
        # ... and the stream, still open at the exit timeout, was ended by the server, not left hanging
        assert [(r, e.status()) for r, e in answers[1:]] == [(None, "StatusCode.UNAVAILABLE")], answers
