"""The Open Inference Protocol over gRPC (KServe v2 / Triton's inference.GRPCInferenceService) against
aotc-server, black box: a real process on real exported packages (tests/conftest.py), spoken to with
tritonclient.grpc (sync, aio, streaming) and with raw ModelInferRequests through grpc's own stub (typed
contents, every kind of malformed request, each followed by a good one that must succeed). Metadata, config,
index and statistics over gRPC carry what HTTP answers; a request counted over gRPC shows in HTTP's /stats and
/metrics; an error has the contract's status for HTTP's and the text of HTTP's {"error": ...} for the same
request. Shared memory, repository control, HTTP beside gRPC and the gRPC flags: tests/test_server_grpc.py.
One server per module; every call has a client timeout.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading

import numpy as np
import pytest

from launch import Server
from test_protocol import binary_body, close, simple_inputs
from test_protocol import mlp_sample  # noqa: F401 (fixture: 4 rows of the MLP's sample, eager outputs)
from test_server import metric

grpc = pytest.importorskip("grpc")
grpcclient = pytest.importorskip("tritonclient.grpc")
from google.protobuf import json_format  # noqa: E402
from tritonclient.grpc import model_config_pb2 as mc  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.timeout(120)
T = 30  # seconds: the client timeout of every call
DATATYPE = {np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32"}
NUMPY = {v: k for k, v in DATATYPE.items()}


@pytest.fixture(scope="module")
def srv(model_repository):
    with Server("cpp", model_repository, "--allow-shared-memory") as s:
        if s.grpc_url is None and "AOTC_GRPC=OFF" in s.log():
            pytest.skip("this aotc-server was built without its gRPC endpoint (AOTC_GRPC=OFF)")
        assert s.grpc_url and f"listening on grpc://127.0.0.1:{s.grpc_port}" in s.log(), s.log()
        yield s


@pytest.fixture(scope="module")
def client(srv):
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(srv):
    with grpc.insecure_channel(srv.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


# ---- helpers shared with tests/test_server_grpc.py ------------------------------------------------------------

def failure(fn, *args, **kw) -> InferenceServerException:
    """The InferenceServerException a tritonclient call raises (status() is e.g. 'StatusCode.NOT_FOUND')."""
    with pytest.raises(InferenceServerException) as e:
        fn(*args, **kw)
    return e.value


def rpc_failure(call, request, **kw) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=T, **kw)
    return e.value


def spec(name, x, datatype=None, shape=None) -> dict:
    return {"name": name, "datatype": datatype or DATATYPE[x.dtype], "shape": list(shape or x.shape),
            "raw": x.tobytes()}


def grpc_request(model, specs, outputs=(), version="") -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name=model, model_version=version)
    for s in specs:
        r.inputs.add(name=s["name"], datatype=s["datatype"], shape=s["shape"])
        r.raw_input_contents.append(s["raw"])
    for o in outputs:
        r.outputs.add(name=o)
    return r


def http_error(srv, model, specs, outputs=(), version="") -> tuple[int, str]:
    """The same request over HTTP, binary tensors -> (status, the text of its {"error": ...})."""
    header = {"inputs": [{"name": s["name"], "datatype": s["datatype"], "shape": s["shape"],
                          "parameters": {"binary_data_size": len(s["raw"])}} for s in specs]}
    if outputs:
        header["outputs"] = [{"name": o} for o in outputs]
    body, headers = binary_body(header, *(s["raw"] for s in specs))
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    status, _, data = srv.request("POST", path, body, headers)
    return status, json.loads(data).get("error")


def decode(resp: pb.ModelInferResponse) -> dict:
    """{output name: array} from raw_output_contents, which must be index-aligned with outputs."""
    assert len(resp.raw_output_contents) == len(resp.outputs), resp
    return {o.name: np.frombuffer(raw, NUMPY[o.datatype]).reshape(list(o.shape))
            for o, raw in zip(resp.outputs, resp.raw_output_contents)}


def simple_specs(a, b):
    return [spec("INPUT0", a), spec("INPUT1", b)]


def triton_inputs(a, b):
    out = []
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        i = grpcclient.InferInput(name, list(x.shape), "INT32")
        i.set_data_from_numpy(x)
        out.append(i)
    return out


def assert_good_grpc(stub, metadata=None):
    a, b = simple_inputs(1, seed=99)
    out = decode(stub.ModelInfer(grpc_request("simple", simple_specs(a, b)), timeout=T, metadata=metadata))
    assert (out["OUTPUT0"] == a + b).all() and (out["OUTPUT1"] == a - b).all()


def normal(message_type, d) -> dict:
    """A JSON answer as protobuf's JSON writes that message (int64 as strings, zero values left out)."""
    return json_format.MessageToDict(json_format.ParseDict(d, message_type(), ignore_unknown_fields=True),
                                     preserving_proto_field_name=True)


# ---- health, metadata, config, index --------------------------------------------------------------------------

def test_health_and_readiness(client, srv):
    assert client.is_server_live(client_timeout=T) and client.is_server_ready(client_timeout=T)
    for model, version in (("mlp", ""), ("simple", "1")):
        assert client.is_model_ready(model, version, client_timeout=T) is True
    for model, version, path in (("nope", "", "/v2/models/nope/ready"),
                                 ("simple", "7", "/v2/models/simple/versions/7/ready")):
        e = failure(client.is_model_ready, model, version, client_timeout=T)
        status, body = srv.json("GET", path)
        assert status == 404 and (e.status(), e.message()) == ("StatusCode.NOT_FOUND", body["error"])


def test_metadata_config_and_index_carry_what_http_answers(client, srv):
    meta = client.get_server_metadata(client_timeout=T)
    assert meta.name == "aotc-server" and "system_shared_memory" in meta.extensions
    pairs = [(pb.ServerMetadataResponse, client.get_server_metadata(as_json=True, client_timeout=T),
              srv.json("GET", "/v2")[1]),
             (pb.RepositoryIndexResponse, client.get_model_repository_index(as_json=True, client_timeout=T),
              {"models": srv.json("POST", "/v2/repository/index", {})[1]})]
    for model, version in (("mlp", ""), ("simple", ""), ("simple", "1")):
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
        pairs.append((pb.ModelMetadataResponse, client.get_model_metadata(model, version, as_json=True,
                                                                          client_timeout=T),
                      srv.json("GET", path)[1]))
        pairs.append((pb.ModelConfigResponse, client.get_model_config(model, version, as_json=True, client_timeout=T),
                      {"config": srv.json("GET", f"{path}/config")[1]}))
    for message_type, got, http in pairs:
        assert normal(message_type, got) == normal(message_type, http), message_type.__name__
    mlp = client.get_model_metadata("mlp", client_timeout=T)
    assert (mlp.inputs[0].name, mlp.inputs[0].datatype, list(mlp.inputs[0].shape)) == ("x", "FP32", [-1, 512])
    cfg = client.get_model_config("simple", client_timeout=T).config
    assert [i.data_type for i in cfg.input] == [mc.TYPE_INT32] * 2 and list(cfg.input[0].dims) == [16]
    index = {(m.name, m.version, m.state) for m in client.get_model_repository_index(client_timeout=T).models}
    assert {("mlp", "1", "READY"), ("simple", "1", "READY")} <= index


# ---- inference ----------------------------------------------------------------------------------------------

def test_tritonclient_raw_contents(client, mlp_sample):
    a, b = simple_inputs(3)
    r = client.infer("simple", triton_inputs(a, b), request_id="req-7", client_timeout=T)
    resp = r.get_response()
    assert (resp.id, resp.model_name, resp.model_version) == ("req-7", "simple", "1")
    assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [("OUTPUT0", "INT32", [3, 16]),
                                                                          ("OUTPUT1", "INT32", [3, 16])]
    assert np.array_equal(r.as_numpy("OUTPUT0"), a + b) and np.array_equal(r.as_numpy("OUTPUT1"), a - b)
    x, ref = mlp_sample
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    assert close(client.infer("mlp", [inp], client_timeout=T).as_numpy("output0"), ref)


def test_typed_contents(stub, mlp_sample):
    a, b = simple_inputs(2, seed=3)
    req = pb.ModelInferRequest(model_name="simple", id="typed")
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        req.inputs.add(name=name, datatype="INT32", shape=x.shape, contents=pb.InferTensorContents(
            int_contents=x.ravel().tolist()))
    req.parameters["timeout"].int64_param = 10_000_000  # us: generous, must not get in the way
    req.parameters["binary_data_output"].bool_param = False  # ignored: outputs are raw over gRPC
    resp = stub.ModelInfer(req, timeout=T)
    out = decode(resp)
    assert resp.id == "typed" and np.array_equal(out["OUTPUT0"], a + b) and np.array_equal(out["OUTPUT1"], a - b)
    assert all(len(o.contents.int_contents) == 0 for o in resp.outputs)
    x, ref = mlp_sample
    req = pb.ModelInferRequest(model_name="mlp")
    req.inputs.add(name="x", datatype="FP32", shape=x.shape, contents=pb.InferTensorContents(
        fp32_contents=x.ravel().tolist()))
    assert close(decode(stub.ModelInfer(req, timeout=T))["output0"], ref)


def test_selected_outputs_only(client, stub):
    a, b = simple_inputs(2, seed=4)
    r = client.infer("simple", triton_inputs(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")],
                     client_timeout=T)
    assert [o.name for o in r.get_response().outputs] == ["OUTPUT1"] and r.as_numpy("OUTPUT0") is None
    assert np.array_equal(r.as_numpy("OUTPUT1"), a - b)
    out = decode(stub.ModelInfer(grpc_request("simple", simple_specs(a, b), outputs=["OUTPUT0"]), timeout=T))
    assert list(out) == ["OUTPUT0"] and np.array_equal(out["OUTPUT0"], a + b)


def test_tritonclient_aio_infer_and_stream(srv, mlp_sample):
    import tritonclient.grpc.aio as aio

    x, ref = mlp_sample
    a, b = simple_inputs(2, seed=5)

    async def run():
        c = aio.InferenceServerClient(srv.grpc_url)
        try:
            assert await c.is_server_ready(client_timeout=T)
            assert (await c.get_model_metadata("mlp", client_timeout=T)).name == "mlp"
            inp = aio.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            rs = await asyncio.gather(*[c.infer("mlp", [inp], client_timeout=T) for _ in range(4)])

            async def requests():
                for i in range(3):
                    yield {"model_name": "simple", "inputs": triton_inputs(a, b), "request_id": f"aio-{i}"}

            streamed = []
            async for result, error in c.stream_infer(requests(), stream_timeout=T):
                assert error is None, error
                streamed.append(result)
                if len(streamed) == 3:
                    break
            return [r.as_numpy("output0") for r in rs], streamed
        finally:
            await c.close()

    outs, streamed = asyncio.run(run())
    assert len(outs) == 4 and all(close(o, ref) for o in outs)
    assert sorted(r.get_response().id for r in streamed) == ["aio-0", "aio-1", "aio-2"]
    assert all(np.array_equal(r.as_numpy("OUTPUT0"), a + b) for r in streamed)


def test_stream_with_requests_in_flight_and_a_bad_one(client, srv, mlp_sample):
    """Eight requests sent at once on one stream, the fourth with the wrong datatype: seven answers matched by id,
    one error_message with HTTP's text for that request, and the requests after it answered too."""
    x, ref = mlp_sample
    bad_a, bad_b = simple_inputs(1, seed=33)
    status, expected = http_error(srv, "simple", [spec("INPUT0", bad_a, datatype="FP32"), spec("INPUT1", bad_b)])
    assert status == 400 and expected
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), stream_timeout=60)
    want = {}
    try:
        for i in range(8):
            if i == 3:
                i0 = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
                i0.set_data_from_numpy(bad_a.view(np.float32))
                i1 = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
                i1.set_data_from_numpy(bad_b)
                client.async_stream_infer("simple", [i0, i1], request_id="bad")
            elif i % 3 == 2:
                inp = grpcclient.InferInput("x", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                client.async_stream_infer("mlp", [inp], request_id=f"m{i}")
                want[f"m{i}"] = ref
            else:
                a, b = simple_inputs(1 + i % 3, seed=i)
                client.async_stream_infer("simple", triton_inputs(a, b), request_id=f"s{i}")
                want[f"s{i}"] = (a + b, a - b)
        got = [answers.get(timeout=T) for _ in range(8)]
    finally:
        client.stop_stream()
    errors = [e for r, e in got if e is not None]
    assert [e.message() for e in errors] == [expected]
    by_id = {r.get_response().id: r for r, e in got if e is None}
    assert set(by_id) == set(want)
    for rid, w in want.items():
        if rid.startswith("m"):
            assert close(by_id[rid].as_numpy("output0"), w), rid
        else:
            assert np.array_equal(by_id[rid].as_numpy("OUTPUT0"), w[0]), rid
            assert np.array_equal(by_id[rid].as_numpy("OUTPUT1"), w[1]), rid


def test_a_stream_past_its_in_flight_bound_is_answered_whole(client):
    """200 requests sent on one stream without waiting, over six times the 32 the server keeps unanswered: it
    stops reading at the bound and goes on as answers are written, and every request gets its own answer."""
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), stream_timeout=60)
    want = {}
    try:
        for i in range(200):
            a, b = simple_inputs(1, seed=1000 + i)
            client.async_stream_infer("simple", triton_inputs(a, b), request_id=f"r{i}")
            want[f"r{i}"] = a + b
        got = [answers.get(timeout=T) for _ in range(200)]
    finally:
        client.stop_stream()
    assert [e for _, e in got if e is not None] == []
    by_id = {r.get_response().id: r.as_numpy("OUTPUT0") for r, _ in got}
    assert set(by_id) == set(want)
    assert all(np.array_equal(by_id[k], w) for k, w in want.items())


def test_concurrent_calls_are_batched(srv, mlp_sample):
    """16 clients, each on its own connection, sending ModelInfer calls in a closed loop: the model runs fewer
    batches than it answers requests. The poller runs an idle model's request itself only when nothing else has
    come in with it; a burst is queued, and batched by the runners (were every request run on the poller as it
    is read, each would run alone)."""
    x, ref = mlp_sample
    x1, ref1 = x[:1], ref[:1]

    def counts():
        m = srv.json("GET", "/v2/models/mlp/stats")[1]["model_stats"][0]
        return m["inference_count"], m["execution_count"]

    def client_loop(errors):
        with grpc.insecure_channel(srv.grpc_url) as channel:
            call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
            for _ in range(25):
                out = decode(call(grpc_request("mlp", [spec("x", x1)]), timeout=T))["output0"]
                if not close(out, ref1):
                    errors.append(out)

    inferences0, executions0 = counts()
    errors: list = []
    threads = [threading.Thread(target=client_loop, args=(errors,)) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    inferences, executions = counts()
    assert errors == [] and inferences - inferences0 == 16 * 25
    assert executions - executions0 < inferences - inferences0, (inferences - inferences0, executions - executions0)


def test_statistics_of_grpc_requests_show_over_http(client, srv):
    def http_counts():
        m = srv.json("GET", "/v2/models/simple/stats")[1]["model_stats"][0]
        text = srv.request("GET", "/metrics")[2].decode()
        return (m["inference_stats"]["success"]["count"], m["inference_count"],
                metric(text, "nv_inference_request_success", "simple", version="1"))

    before = http_counts()
    for rows in (1, 2, 3):
        a, b = simple_inputs(rows, seed=rows)
        assert np.array_equal(client.infer("simple", triton_inputs(a, b), client_timeout=T).as_numpy("OUTPUT0"), a + b)
    assert http_counts() == (before[0] + 3, before[1] + 6, before[2] + 3)
    got = client.get_inference_statistics("simple", as_json=True, client_timeout=T)
    http = srv.json("GET", "/v2/models/simple/stats")[1]
    assert normal(pb.ModelStatisticsResponse, got) == normal(pb.ModelStatisticsResponse, http)
    assert int(got["model_stats"][0]["inference_stats"]["success"]["count"]) == before[0] + 3


# ---- refusals: the contract's status, HTTP's text, and the server keeps serving ---------------------------------

def test_unknown_model_and_version(client, stub, srv):
    """NOT_FOUND, with the text of the same question's 404 over HTTP, for each RPC that names a model."""
    a, b = simple_inputs(1)
    for model, version in (("nope", ""), ("simple", "7")):
        status, text = http_error(srv, model, simple_specs(a, b), version=version)
        assert status == 404
        e = rpc_failure(stub.ModelInfer, grpc_request(model, simple_specs(a, b), version=version))
        assert (e.code(), e.details()) == (grpc.StatusCode.NOT_FOUND, text)
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
        for call, route in ((client.get_model_metadata, ""), (client.get_model_config, "/config"),
                            (client.get_inference_statistics, "/stats")):
            status, body = srv.json("GET", path + route)
            e = failure(call, model, version, client_timeout=T)
            assert status == 404 and (e.status(), e.message()) == ("StatusCode.NOT_FOUND", body["error"]), route
    assert http_error(srv, "nope", simple_specs(a, b))[1] == "Request for unknown model: 'nope' is not found"
    assert text == "Request for unknown model: 'simple' version 7 is not found"
    assert_good_grpc(stub)


A, B = simple_inputs(1, seed=7)
SAME_AS_HTTP = {  # malformed requests that HTTP's binary tensors can say too: same text both ways
    "wrong datatype": ([spec("INPUT0", A, datatype="FP32"), spec("INPUT1", B)], ()),
    "wrong rank": ([spec("INPUT0", A, shape=[16]), spec("INPUT1", B, shape=[16])], ()),
    "dim outside the manifest": ([spec("INPUT0", A[:, :8]), spec("INPUT1", B[:, :8])], ()),
    "unknown input": ([spec("INPUT0", A), spec("INPUT1", B), spec("INPUT9", A)], ()),
    "missing input": ([spec("INPUT0", A)], ()),
    "unknown output": ([spec("INPUT0", A), spec("INPUT1", B)], ("OUTPUT7",)),
}


@pytest.mark.parametrize("case", list(SAME_AS_HTTP))
def test_malformed_request_as_http_says_it(stub, srv, case):
    specs, outputs = SAME_AS_HTTP[case]
    status, text = http_error(srv, "simple", specs, outputs)
    assert status == 400 and text, (case, status, text)
    e = rpc_failure(stub.ModelInfer, grpc_request("simple", specs, outputs))
    assert (e.code(), e.details()) == (grpc.StatusCode.INVALID_ARGUMENT, text), case
    assert_good_grpc(stub)


def _raw_and_typed():
    r = grpc_request("simple", simple_specs(A, B))
    r.inputs[0].contents.int_contents.extend(A.ravel().tolist())
    return r


def _typed(model, name, datatype, shape, **contents):
    r = pb.ModelInferRequest(model_name=model)
    r.inputs.add(name=name, datatype=datatype, shape=shape, contents=pb.InferTensorContents(**contents))
    return r


def _raw_count(n):
    r = grpc_request("simple", simple_specs(A, B))
    del r.raw_input_contents[:]
    r.raw_input_contents.extend([A.tobytes()] * n)
    return r


GRPC_ONLY = {  # what only a ModelInferRequest can get wrong
    "raw bytes disagree with the shape": lambda: grpc_request("simple", [spec("INPUT0", A[:, :15], shape=[1, 16]),
                                                                         spec("INPUT1", B)]),
    "raw and typed contents together": _raw_and_typed,
    "too few raw contents": lambda: _raw_count(1),
    "too many raw contents": lambda: _raw_count(3),
    "typed count disagrees with the shape": lambda: _typed("mlp", "x", "FP32", [1, 512], fp32_contents=[1.0] * 511),
    "typed contents of another type": lambda: _typed("mlp", "x", "FP32", [1, 512], int_contents=[1] * 512),
    "no contents at all": lambda: _typed("mlp", "x", "FP32", [1, 512]),
}


@pytest.mark.parametrize("case", list(GRPC_ONLY))
def test_malformed_grpc_request(stub, case):
    e = rpc_failure(stub.ModelInfer, GRPC_ONLY[case]())
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (case, e.code(), e.details())
    assert e.details() and "\n" not in e.details(), case
    assert_good_grpc(stub)


# Bytes that are not the RPC's message: a string field 1 that is not UTF-8 (proto3 refuses it) and a field 1
# that claims 5 bytes where 2 follow. The server parses every message itself (raw methods): gRPC's own parsing
# would answer INTERNAL "Unable to parse request" and end a stream with OK, the rest of it unanswered.
SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
NOT_UTF8, TRUNCATED = b"\x0a\x03m\xff\xfe", b"\x0a\x05ab"


def _string_field_1(message):
    f = message.fields_by_number.get(1)
    return f if f is not None and f.type == f.TYPE_STRING else None


def _unparsable():
    for m in SERVICE.methods:
        if m.client_streaming:
            continue
        yield pytest.param(m, TRUNCATED, id=f"{m.name}-truncated")
        if _string_field_1(m.input_type):
            yield pytest.param(m, NOT_UTF8, id=f"{m.name}-not-utf8")


def _why(message, raw) -> str:
    what = f"the {message.name} does not parse as the protobuf message it must be"
    if raw == TRUNCATED:
        return what + " (truncated, or not that message's wire format)"
    return what + f": string field '{_string_field_1(message).full_name}' is not valid UTF-8 (proto3 strings must be)"


@pytest.mark.parametrize("method,raw", list(_unparsable()))
def test_a_message_that_does_not_parse_is_invalid_argument_saying_why(srv, stub, method, raw):
    with grpc.insecure_channel(srv.grpc_url) as channel:
        call = channel.unary_unary(f"/{SERVICE.full_name}/{method.name}")  # bytes in, bytes out
        e = rpc_failure(call, raw)
    assert (e.code(), e.details()) == (grpc.StatusCode.INVALID_ARGUMENT, _why(method.input_type, raw))
    assert "libprotobuf" not in srv.log()  # the reason went to the client, not into the server's log
    assert_good_grpc(stub)


def test_a_stream_answers_a_message_that_does_not_parse_and_goes_on(srv):
    """Good, not UTF-8, truncated, good on one raw stream: four answers, the two bad ones an error_message each
    saying why (nothing of the bad message echoed), the good ones right, and the stream ends OK."""
    a, b = simple_inputs(1, seed=5)
    good = [grpc_request("simple", simple_specs(a, b)) for _ in range(2)]
    for i, g in enumerate(good):
        g.id = f"g{i}"
    sent = [good[0].SerializeToString(), NOT_UTF8, TRUNCATED, good[1].SerializeToString()]
    with grpc.insecure_channel(srv.grpc_url) as channel:
        stream = channel.stream_stream(f"/{SERVICE.full_name}/ModelStreamInfer")
        got = [pb.ModelStreamInferResponse.FromString(r) for r in stream(iter(sent), timeout=T)]
    request = pb.ModelInferRequest.DESCRIPTOR
    errors = sorted(r.error_message for r in got if r.error_message)
    assert errors == sorted([_why(request, NOT_UTF8), _why(request, TRUNCATED)]), got
    assert all(r.infer_response.model_name == "" and r.infer_response.id == "" for r in got if r.error_message)
    answers = {r.infer_response.id: decode(r.infer_response) for r in got if not r.error_message}
    assert sorted(answers) == ["g0", "g1"], got
    for out in answers.values():
        assert (out["OUTPUT0"] == a + b).all() and (out["OUTPUT1"] == a - b).all()
    assert "libprotobuf" not in srv.log()


def test_trace_and_log_settings_are_unimplemented(client):
    for call in (lambda: client.get_trace_settings(client_timeout=T),
                 lambda: client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]}, client_timeout=T),
                 lambda: client.get_log_settings(client_timeout=T),
                 lambda: client.update_log_settings({"log_info": True}, client_timeout=T)):
        e = failure(call)
        assert e.status() == "StatusCode.UNIMPLEMENTED" and e.message(), (e.status(), e.message())
    assert client.is_server_live(client_timeout=T)
