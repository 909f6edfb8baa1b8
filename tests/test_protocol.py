"""The Open Inference Protocol suite, run against both servers: "cpp" (aotc-server) and "python"
(`aotc serve --python`). Black box: real processes on real exported packages (tests/conftest.py), spoken to
with tritonclient (sync and aio, default options = binary tensors) and with plain HTTP (JSON, binary, mixed,
compressed, and every kind of malformed request). After each malformed request a good one must succeed.

Server-specific behaviour (auth, shutdown, corrupt packages, connections, batching, reload, metrics) is in
tests/test_server*.py. One server per kind per module; requests carry timeouts (bench/launch.py).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib

import numpy as np
import pytest

from conftest import read_samples


tritonclient_http = pytest.importorskip("tritonclient.http")


@pytest.fixture(scope="module")
def mlp_sample(pkg_mlp):
    inputs, outputs = read_samples(pkg_mlp)[0]
    return inputs[0][:4].astype(np.float32), outputs[0][:4]


def close(a, b):
    return np.allclose(a, b, atol=1e-4, rtol=1e-4)


def infer_json(server, model, body, headers=None, **kw):
    return server.json("POST", f"/v2/models/{model}/infer", body, headers=headers, **kw)


def simple_inputs(rows=2, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, (rows, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (rows, 16), dtype=np.int32)
    return a, b


def binary_body(header: dict, *blobs: bytes) -> tuple[bytes, dict]:
    j = json.dumps(header).encode()
    return j + b"".join(blobs), {"Inference-Header-Content-Length": str(len(j))}


def split_binary(headers: dict, data: bytes) -> tuple[dict, dict]:
    """A response with binary outputs -> (JSON header, {output name: raw bytes})."""
    n = int(headers["inference-header-content-length"])
    header = json.loads(data[:n])
    blobs, offset = {}, n
    for o in header["outputs"]:
        size = o.get("parameters", {}).get("binary_data_size")
        if size is not None:
            blobs[o["name"]] = data[offset:offset + size]
            offset += size
    assert offset == len(data), "binary outputs do not account for the whole body"
    return header, blobs


def assert_good_request_works(server):
    a, b = simple_inputs(1, seed=99)
    status, r = infer_json(server, "simple", {"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a.ravel().tolist()},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b.ravel().tolist()}]})
    assert status == 200, r
    out = {o["name"]: np.array(o["data"]) for o in r["outputs"]}
    assert (out["OUTPUT0"] == (a + b).ravel()).all() and (out["OUTPUT1"] == (a - b).ravel()).all()


# ---- health, metadata, config -------------------------------------------------------------------------------

def test_health(server):
    assert server.json("GET", "/v2/health/live") == (200, {"live": True})
    assert server.json("GET", "/v2/health/ready") == (200, {"ready": True})


def test_server_metadata(server):
    status, meta = server.json("GET", "/v2")
    assert status == 200 and isinstance(meta["name"], str) and isinstance(meta["version"], str)
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata_has_dynamic_dims(server):
    status, meta = server.json("GET", "/v2/models/mlp")
    assert status == 200
    assert meta["name"] == "mlp" and "1" in meta["versions"]
    (x,) = meta["inputs"]
    assert (x["name"], x["datatype"], x["shape"]) == ("x", "FP32", [-1, 512])
    assert meta["outputs"][0]["datatype"] == "FP32" and meta["outputs"][0]["shape"] == [-1, 512]
    status, meta = server.json("GET", "/v2/models/simple/versions/1")
    assert status == 200
    assert [i["name"] for i in meta["inputs"]] == ["INPUT0", "INPUT1"]
    assert [o["name"] for o in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_model_ready(server):
    assert server.json("GET", "/v2/models/mlp/ready")[0] == 200
    assert server.json("GET", "/v2/models/mlp/versions/1/ready")[0] == 200
    status, body = server.json("GET", "/v2/models/nope/ready")
    assert status == 404 and body["error"]


def test_model_config_is_triton_style(server):
    status, cfg = server.json("GET", "/v2/models/simple/config")
    assert status == 200 and cfg["name"] == "simple"
    assert {"max_batch_size", "input", "output"} <= cfg.keys()
    assert [i["data_type"] for i in cfg["input"]] == ["TYPE_INT32", "TYPE_INT32"]
    assert cfg["input"][0]["dims"][-1] == 16


def test_repository_index_lists_models(server):
    status, index = server.json("POST", "/v2/repository/index", {})
    assert status == 200
    ready = {(e["name"], e["state"]) for e in index}
    assert ("mlp", "READY") in ready and ("simple", "READY") in ready


# ---- inference through tritonclient -------------------------------------------------------------------------

def test_tritonclient_binary_defaults(server, mlp_sample):
    x, ref = mlp_sample
    c = tritonclient_http.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=60)
    assert c.is_server_ready() and c.is_model_ready("mlp")
    inp = tritonclient_http.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    r = c.infer("mlp", [inp], request_id="req-7")
    assert r.get_response()["id"] == "req-7"
    assert close(r.as_numpy("output0"), ref)
    assert c.get_model_metadata("mlp")["inputs"][0]["shape"] == [-1, 512]
    c.close()


def test_tritonclient_json(server, mlp_sample):
    x, ref = mlp_sample
    c = tritonclient_http.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=60)
    inp = tritonclient_http.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=False)
    out = tritonclient_http.InferRequestedOutput("output0", binary_data=False)
    r = c.infer("mlp", [inp], outputs=[out])
    assert "data" in r.get_response()["outputs"][0]
    assert close(r.as_numpy("output0"), ref)
    c.close()


def test_tritonclient_mixed_binary_and_json(server):
    a, b = simple_inputs(3)
    c = tritonclient_http.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=60)
    i0 = tritonclient_http.InferInput("INPUT0", [3, 16], "INT32")
    i0.set_data_from_numpy(a, binary_data=True)
    i1 = tritonclient_http.InferInput("INPUT1", [3, 16], "INT32")
    i1.set_data_from_numpy(b, binary_data=False)
    outs = [tritonclient_http.InferRequestedOutput("OUTPUT0", binary_data=False),
            tritonclient_http.InferRequestedOutput("OUTPUT1", binary_data=True)]
    r = c.infer("simple", [i0, i1], outputs=outs)
    assert (r.as_numpy("OUTPUT0") == a + b).all() and (r.as_numpy("OUTPUT1") == a - b).all()
    by_name = {o["name"]: o for o in r.get_response()["outputs"]}
    assert "data" in by_name["OUTPUT0"] and "binary_data_size" in by_name["OUTPUT1"]["parameters"]
    c.close()


def test_tritonclient_aio(server, mlp_sample):
    import tritonclient.http.aio as aio

    x, ref = mlp_sample

    async def run():
        c = aio.InferenceServerClient(f"127.0.0.1:{server.port}")
        try:
            assert await c.is_server_ready()
            # aiohttp offers gzip; tritonclient's aio client parses metadata without inflating it
            meta = await c.get_model_metadata("mlp")
            assert meta["name"] == "mlp"
            inp = aio.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            rs = await asyncio.gather(*[c.infer("mlp", [inp]) for _ in range(4)])
            return [r.as_numpy("output0") for r in rs]
        finally:
            await c.close()

    for out in asyncio.run(run()):
        assert close(out, ref)


# ---- inference over plain HTTP ------------------------------------------------------------------------------

def test_json_flat_and_nested_with_id(server, mlp_sample):
    x, ref = mlp_sample
    for data in (x.ravel().tolist(), x.tolist()):
        status, r = infer_json(server, "mlp", {"id": "abc", "inputs": [
            {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": data}]})
        assert status == 200, r
        assert r["id"] == "abc" and r["model_name"] == "mlp" and r["model_version"] == "1"
        (o,) = r["outputs"]
        assert o["name"] == "output0" and o["shape"] == [4, 512] and o["datatype"] == "FP32"
        assert close(np.array(o["data"], dtype=np.float32).reshape(4, 512), ref)


def test_binary_data_output_parameter(server):
    a, b = simple_inputs(2)
    body, h = binary_body({"parameters": {"binary_data_output": True}, "inputs": [
        {"name": "INPUT0", "shape": [2, 16], "datatype": "INT32", "parameters": {"binary_data_size": a.nbytes}},
        {"name": "INPUT1", "shape": [2, 16], "datatype": "INT32", "parameters": {"binary_data_size": b.nbytes}}]},
        a.tobytes(), b.tobytes())
    status, headers, data = server.request("POST", "/v2/models/simple/infer", body, h)
    assert status == 200, data
    header, blobs = split_binary(headers, data)
    assert np.array_equal(np.frombuffer(blobs["OUTPUT0"], np.int32).reshape(2, 16), a + b)
    assert np.array_equal(np.frombuffer(blobs["OUTPUT1"], np.int32).reshape(2, 16), a - b)


def test_selected_output_only(server):
    a, b = simple_inputs(1)
    status, r = infer_json(server, "simple", {"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a.ravel().tolist()},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b.ravel().tolist()}],
        "outputs": [{"name": "OUTPUT1"}]})
    assert status == 200 and [o["name"] for o in r["outputs"]] == ["OUTPUT1"]
    assert r["outputs"][0]["data"] == (a - b).ravel().tolist()


def test_gzip_and_deflate_request_and_response(server):
    a, b = simple_inputs(32)  # a response of several KiB: large enough that any server compresses it
    req = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [32, 16], "datatype": "INT32", "data": a.ravel().tolist()},
        {"name": "INPUT1", "shape": [32, 16], "datatype": "INT32", "data": b.ravel().tolist()}]}).encode()
    for coding, packed in (("gzip", gzip.compress(req)), ("deflate", zlib.compress(req))):
        status, headers, data = server.request("POST", "/v2/models/simple/infer", packed, {
            "Content-Encoding": coding, "Accept-Encoding": "gzip", "Content-Type": "application/json"})
        assert status == 200, data
        assert headers.get("content-encoding") == "gzip"  # launch.Server.request inflated it
        assert json.loads(data)["outputs"][0]["data"] == (a + b).ravel().tolist()


def test_only_inference_responses_are_compressed(server):
    status, headers, body = server.request("GET", "/v2/models/mlp", headers={"Accept-Encoding": "gzip, deflate"})
    assert status == 200 and "content-encoding" not in headers, headers
    assert json.loads(body)["name"] == "mlp"


def test_unknown_content_encoding_is_501(server):
    status, headers, data = server.request("POST", "/v2/models/simple/infer", b"xxxx",
                                           {"Content-Encoding": "zstd"})
    assert status == 501 and json.loads(data)["error"]
    assert_good_request_works(server)


def test_wrong_method_and_unknown_path(server):
    status, body = server.json("GET", "/v2/models/simple/infer")
    assert status == 405 and body["error"]
    status, body = server.json("GET", "/v2/no/such/path")
    assert status == 404 and body["error"]


def test_statistics(server):
    assert_good_request_works(server)
    status, st = server.json("GET", "/v2/models/simple/stats")
    assert status == 200
    (m,) = [m for m in st["model_stats"] if m["name"] == "simple"]
    assert m["inference_stats"]["success"]["count"] >= 1 and m["execution_count"] >= 1
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
        assert {"count", "ns"} <= m["inference_stats"][key].keys()


# ---- malformed requests: each gets its 4xx and a one-line error, and the server keeps serving ---------------

A = list(range(16))


def _inp(name="INPUT0", shape=(1, 16), datatype="INT32", data=A, **extra):
    d = {"name": name, "shape": list(shape), "datatype": datatype, **extra}
    if data is not None:
        d["data"] = data
    return d


def _good_pair(**over):
    return [_inp("INPUT0", **over), _inp("INPUT1")]


BAD_JSON_REQUESTS = {
    "not json": (b"{not json", 400),
    "not an object": (b"[1, 2, 3]", 400),
    "no inputs": (json.dumps({"id": "x"}).encode(), 400),
    "inputs not a list": (json.dumps({"inputs": 5}).encode(), 400),
    "input without name": (json.dumps({"inputs": [{"shape": [1, 16], "datatype": "INT32", "data": A}]}).encode(), 400),
    "input without shape": (json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "data": A}]}).encode(), 400),
    "unknown datatype": (json.dumps({"inputs": _good_pair(datatype="INT33")}).encode(), 400),
    "wrong datatype": (json.dumps({"inputs": _good_pair(datatype="FP32")}).encode(), 400),
    "shape and data disagree": (json.dumps({"inputs": _good_pair(shape=(2, 16))}).encode(), 400),
    "negative dim": (json.dumps({"inputs": _good_pair(shape=(-1, 16))}).encode(), 400),
    "absurd dims": (json.dumps({"inputs": _good_pair(shape=(1 << 40, 1 << 40))}).encode(), 400),
    "wrong rank": (json.dumps({"inputs": _good_pair(shape=(16,))}).encode(), 400),
    "dim outside the manifest": (json.dumps({"inputs": [_inp("INPUT0", shape=(1, 8), data=A[:8]),
                                                        _inp("INPUT1", shape=(1, 8), data=A[:8])]}).encode(), 400),
    "unknown input": (json.dumps({"inputs": _good_pair() + [_inp("INPUT9")]}).encode(), 400),
    "duplicate input": (json.dumps({"inputs": _good_pair() + [_inp("INPUT1")]}).encode(), 400),
    "missing input": (json.dumps({"inputs": [_inp("INPUT0")]}).encode(), 400),
    "unknown output": (json.dumps({"inputs": _good_pair(), "outputs": [{"name": "OUTPUT7"}]}).encode(), 400),
    "value out of range for INT32": (json.dumps({"inputs": _good_pair(data=[2 ** 40] + A[1:])}).encode(), 400),
    "float for INT32": (json.dumps({"inputs": _good_pair(data=[0.5] + A[1:])}).encode(), 400),
    "string for INT32": (json.dumps({"inputs": _good_pair(data=["a"] + A[1:])}).encode(), 400),
    "nested JSON bomb": (b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": '
                         + b"[" * 100000 + b"]" * 100000 + b"}]}", 400),
}


@pytest.mark.parametrize("case", list(BAD_JSON_REQUESTS))
def test_malformed_json_request(server, case):
    body, expected = BAD_JSON_REQUESTS[case]
    status, _, data = server.request("POST", "/v2/models/simple/infer", body, {"Content-Type": "application/json"})
    assert status == expected, (case, status, data[:300])
    err = json.loads(data)["error"]
    assert isinstance(err, str) and err and "\n" not in err
    assert_good_request_works(server)


def test_fp32_out_of_range_value(server):
    status, _, data = server.request("POST", "/v2/models/mlp/infer", json.dumps({"inputs": [
        {"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [1e300] + [0.0] * 511}]}))
    assert status == 400 and json.loads(data)["error"]
    assert_good_request_works(server)


def _binary_case(sizes, blobs, header_len_delta=0):
    header = {"inputs": [
        {"name": n, "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": s}}
        for n, s in zip(("INPUT0", "INPUT1"), sizes)]}
    j = json.dumps(header).encode()
    return j + blobs, {"Inference-Header-Content-Length": str(len(j) + header_len_delta)}


BAD_BINARY_REQUESTS = {
    "binary size larger than the body": _binary_case((64, 1 << 30), b"\0" * 128),
    "binary size disagrees with shape": _binary_case((60, 68), b"\0" * 128),
    "bytes left over after the blobs": _binary_case((64, 64), b"\0" * 130),
    "header length beyond the body": _binary_case((64, 64), b"\0" * 128, header_len_delta=1000),
    "header length cuts the JSON": _binary_case((64, 64), b"\0" * 128, header_len_delta=-5),
    "header length not a number": (b"{}", {"Inference-Header-Content-Length": "abc"}),
    "negative binary size": _binary_case((-64, 64), b"\0" * 128),
}


@pytest.mark.parametrize("case", list(BAD_BINARY_REQUESTS))
def test_malformed_binary_request(server, case):
    body, headers = BAD_BINARY_REQUESTS[case]
    status, _, data = server.request("POST", "/v2/models/simple/infer", body, headers)
    assert status == 400, (case, status, data[:300])
    assert json.loads(data)["error"]
    assert_good_request_works(server)


def test_unknown_model_and_version_are_404(server):
    body = json.dumps({"inputs": _good_pair()})
    for path in ("/v2/models/nope/infer", "/v2/models/simple/versions/7/infer"):
        status, _, data = server.request("POST", path, body)
        assert status == 404 and json.loads(data)["error"], path
    assert_good_request_works(server)


def test_truncated_body_gets_an_answer(server):
    """A Content-Length longer than what is sent: the server must answer or close, not hang forever."""
    import socket

    with socket.create_connection((server.host, server.port), timeout=30) as s:
        s.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"inputs\"")
        s.shutdown(socket.SHUT_WR)
        data = s.recv(65536)
    assert data == b"" or data.startswith(b"HTTP/1.1 4")
    assert_good_request_works(server)


def test_raw_binary_body_for_single_input_model(server, mlp_sample):
    x, ref = mlp_sample
    status, headers, data = server.request("POST", "/v2/models/mlp/infer", x.tobytes(),
                                           {"Inference-Header-Content-Length": "0"})
    assert status == 200, data[:300]
    if "inference-header-content-length" in headers:
        header, blobs = split_binary(headers, data)
        out = np.frombuffer(blobs["output0"], np.float32)
    else:
        out = np.array(json.loads(data)["outputs"][0]["data"], np.float32)
    assert close(out.reshape(4, 512), ref)


def test_post_without_a_body(server):
    """`curl -X POST .../repository/index` sends neither Content-Length nor a body: answered at once."""
    import socket

    with socket.create_connection((server.host, server.port), timeout=10) as s:
        s.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n")
        data = s.recv(65536)
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
