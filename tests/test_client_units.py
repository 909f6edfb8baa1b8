"""aotc_client's pure parts (parity comparison, specs and random inputs) and the FastAPI server's wire codec.
No server and no torch: these run in milliseconds."""

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest

from aotc import wire
from aotc_client import dtypes
from aotc_client.compare import assert_close, compare_array, trivial
from aotc_client.errors import AotcError, ParityError, RequestError
from aotc_client.specs import (TensorSpec, case_plan, dim_size, random_inputs, range_sizes, shape_for,
                               specs_from_metadata, symbol_ranges)

X = TensorSpec("x", "FP32", (-1, 4), ((1, 8), (4, 4)))
IDS = TensorSpec("ids", "INT64", (-1, 3), ((1, 8), (3, 3)), low=0, high=5)
OUT = TensorSpec("y", "FP32", (-1, 4))


def test_compare_uses_atol_plus_rtol_times_reference():
    ref = np.array([1.0, 100.0], dtype=np.float32)
    # |a-b| <= 1e-4 + 1e-4*|b|: 100 allows 0.0101, 1 allows 0.0002
    assert compare_array("y", ref + np.array([0.0, 0.01], np.float32), ref).ok
    bad = compare_array("y", ref + np.array([0.001, 0.0], np.float32), ref)
    assert not bad.ok and bad.mismatched == 1 and bad.max_abs == pytest.approx(0.001, rel=1e-3)


def test_compare_nan_inf_shape_and_integers():
    assert compare_array("y", np.array([np.nan, np.inf]), np.array([np.nan, np.inf])).ok
    assert not compare_array("y", np.array([np.nan, 1.0]), np.array([1.0, 1.0])).ok
    assert not compare_array("y", np.array([-np.inf]), np.array([np.inf])).ok
    assert "shape" in compare_array("y", np.zeros((2, 3)), np.zeros((3, 2))).problem
    assert not compare_array("i", np.array([1, 2]), np.array([1, 3])).ok  # integers: exact
    with pytest.raises(ParityError, match="y"):
        assert_close({"y": np.ones(3)}, {"y": np.zeros(3)})
    with pytest.raises(ParityError, match="missing"):
        assert_close({}, {"y": np.zeros(3)})


def test_random_inputs_respect_dtype_ranges_and_shared_dims():
    inputs = random_inputs([X, IDS], sizes=5, seed=1)
    assert inputs["x"].shape == (5, 4) and inputs["x"].dtype == np.float32
    assert inputs["ids"].shape == (5, 3) and inputs["ids"].dtype == np.int64
    assert inputs["ids"].min() >= 0 and inputs["ids"].max() < 5
    with pytest.raises(AotcError, match=r"dim 0 = 9 is outside its range \[1, 8\]"):
        random_inputs([X], sizes=9)
    # no symbols known: dims at one position agree, dim 0 taken for the batch
    assert [s["batch"] for s in range_sizes([X, IDS])] == [1, 5, 8]


def test_case_plan_varies_every_dim_together_and_apart():
    plan = case_plan({"batch": (1, 16), "seq": (8, 128)}, {"batch": 4, "seq": 32})
    assert plan[:3] == [("min", {"batch": 1, "seq": 8}), ("max", {"batch": 16, "seq": 128}),
                        ("odd", {"batch": 9, "seq": 45})]
    apart = dict(plan[3:])
    assert apart["seq max"] == {"batch": 4, "seq": 128} and apart["batch min"] == {"batch": 1, "seq": 32}
    assert apart["seq odd"] == {"batch": 4, "seq": 45}
    assert len({tuple(s.items()) for _, s in plan}) == len(plan) == 9  # nothing planned twice
    assert case_plan({"batch": (1, 64)}) == [("min", {"batch": 1}), ("max", {"batch": 64}), ("odd", {"batch": 37})]
    assert case_plan({"n": (2, 3)}) == [("min", {"n": 2}), ("max", {"n": 3})]  # no odd size between
    assert case_plan({}) == []


def test_derived_dims_follow_their_root():
    lengths = TensorSpec("lengths", "INT64", (-1,), ((2, 128),), symbols=("2*batch",))
    x = TensorSpec("x", "FP32", (-1, -1), ((1, 64), (1, 9)), symbols=("batch", "seq + 1"))
    assert symbol_ranges([lengths, x]) == {"batch": (1, 64)}  # an expression is no free dim
    assert shape_for(lengths, {"batch": 3}) == (6,)
    assert random_inputs([lengths, x], {"batch": 3, "seq": 4})["x"].shape == (3, 5)
    assert dim_size("(batch//2) - 1", {"batch": 9}) == 3
    with pytest.raises(AotcError, match=r"input 'lengths' dim 0 is dynamic \('2\*batch'\): no size was given for "
                                        r"the dynamic dim 'batch'"):
        shape_for(lengths, {})
    with pytest.raises(AotcError, match=r"dim expression 'Mod\(batch, 2\)' is not understood"):
        dim_size("Mod(batch, 2)", {"batch": 3})


def test_a_trivial_reference_is_named_but_passes_the_rule():
    tiny = np.full((4, 10), 1e-10, np.float32)
    c = compare_array("logits", np.zeros_like(tiny), tiny)
    assert c.ok and c.verdict == "trivial" and "within atol 0.0001 of zero" in c.trivial
    assert "trivial (reference is within atol" in c.line()
    const = np.full((3, 3), 0.25, np.float32)
    assert "constant" in trivial(const, 1e-4, 1e-4) and compare_array("p", const, const).verdict == "trivial"
    assert trivial(np.array([0.5], np.float32), 1e-4, 1e-4) == ""  # one value: no spread to speak of
    assert trivial(np.zeros(5, np.int64), 0, 0) == ""  # integers compare exactly: never trivial
    assert compare_array("y", np.arange(4.0), np.arange(4.0)).verdict == "ok"
    bad = compare_array("y", np.ones(4), tiny.ravel()[:4].astype(np.float64))
    assert bad.verdict == "MISMATCH"


def test_specs_from_metadata_and_bad_metadata():
    meta = {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}], "outputs": []}
    (spec,) = specs_from_metadata(meta)
    assert spec.shape == (-1, 4) and spec.ranges is None
    assert random_inputs([spec], sizes=2)["x"].shape == (2, 4)
    with pytest.raises(AotcError, match="malformed"):
        specs_from_metadata({"inputs": [{"name": "x"}]})


def test_bf16_round_trip():
    v = np.array([1.0, -2.5, 3.140625], dtype=np.float32)
    assert np.array_equal(dtypes.bf16_to_float32(dtypes.float32_to_bf16(v)), v)


def _binary_body(header: dict, *blobs: bytes) -> tuple[bytes, int]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), len(head)


def test_decode_json_and_binary_and_encode():
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    req = wire.decode_request(json.dumps({"id": "7", "inputs": [
        {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.tolist()}]}).encode(), None, [X], [OUT])
    assert np.array_equal(req.inputs["x"], x) and req.id == "7" and req.outputs == [("y", False)]
    body, n = _binary_body({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                                        "parameters": {"binary_data_size": 32}}],
                            "parameters": {"binary_data_output": True}}, x.tobytes())
    req = wire.decode_request(body, n, [X], [OUT])
    assert np.array_equal(req.inputs["x"], x) and req.outputs == [("y", True)]
    out, hlen = wire.encode_response("m", "1", req, {"y": x * 2}, [OUT])
    head = json.loads(out[:hlen])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 32
    assert np.array_equal(np.frombuffer(out[hlen:], np.float32).reshape(2, 4), x * 2)


@pytest.mark.parametrize("header, blob, message", [
    ({"inputs": [{"name": "z", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}]}, b"", "unknown input 'z'"),
    ({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "INT32", "data": [0] * 4}]}, b"", "expects FP32"),
    ({"inputs": [{"name": "x", "shape": [1, 5], "datatype": "FP32", "data": [0] * 5}]}, b"", "dim 1 is 5"),
    ({"inputs": [{"name": "x", "shape": [9, 4], "datatype": "FP32", "data": [0] * 36}]}, b"", r"in \[1, 8\]"),
    ({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0] * 3}]}, b"", "3 values"),
    ({"inputs": [{"name": "x", "shape": [-1, 4], "datatype": "FP32", "data": []}]}, b"", "non-negative"),
    ({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                  "parameters": {"binary_data_size": 16}}]}, b"\0" * 8, "needs 16 bytes"),
    ({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                  "parameters": {"binary_data_size": 12}}]}, b"\0" * 12, "needs 16 bytes"),
    ({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}]}, b"\0", "no input claims"),
    ({"inputs": []}, b"", "non-empty 'inputs'"),
    ({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}] * 2}, b"", "twice"),
    ({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}],
      "outputs": [{"name": "nope"}]}, b"", "unknown output"),
    ({"id": 5, "inputs": []}, b"", "'id' must be a string"),
])
def test_decode_rejects_bad_requests(header, blob, message):
    body, n = _binary_body(header, blob)
    with pytest.raises(RequestError, match=message) as e:
        wire.decode_request(body, n, [X], [OUT])
    assert e.value.status == 400


def test_decode_rejects_bad_json_bombs_and_out_of_range_ints():
    with pytest.raises(RequestError, match="not valid JSON"):
        wire.decode_request(b"{nope", None, [X], [OUT])
    with pytest.raises(RequestError, match="not valid JSON"):
        wire.decode_request(b"[" * 100000 + b"]" * 100000, None, [X], [OUT])
    i32 = TensorSpec("i", "INT32", (2,))
    with pytest.raises(RequestError, match="outside the INT32 range"):
        wire.decode_request(json.dumps({"inputs": [{"name": "i", "shape": [2], "datatype": "INT32",
                                                    "data": [1, 2**40]}]}).encode(), None, [i32], [])
    with pytest.raises(RequestError, match="expects integers"):
        wire.decode_request(json.dumps({"inputs": [{"name": "i", "shape": [2], "datatype": "INT32",
                                                    "data": [1.5, 2]}]}).encode(), None, [i32], [])


def test_decompress_limits_and_encodings():
    assert wire.decompress(gzip.compress(b"abc"), "gzip", 10) == b"abc"
    with pytest.raises(RequestError) as e:
        wire.decompress(gzip.compress(b"\0" * 1000), "gzip", 100)
    assert e.value.status == 413
    with pytest.raises(RequestError) as e:
        wire.decompress(b"x", "br", 100)
    assert e.value.status == 501
    with pytest.raises(RequestError, match="truncated|not valid"):
        wire.decompress(gzip.compress(b"abc" * 100)[:-12], "gzip", 1000)


def test_client_package_needs_no_torch_and_no_aotc():
    code = ("import sys, aotc_client, aotc_client.client, aotc_client.bench, aotc_client.cli, aotc_client.compare;"
            "bad = [m for m in sys.modules if m == 'torch' or m == 'aotc' or m.startswith(('torch.', 'aotc.'))];"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
