"""aotc-server's error bodies stay JSON whatever bytes the client sent, black box: names that are not UTF-8
(stray bytes, a truncated sequence, an overlong form, an encoded surrogate) in a JSON request, in a binary
tensor request's header, in an output's name and in a shared memory region's name come back in a 400 or 404
whose body parses as JSON (strict UTF-8) and quotes the name recognisably: each byte that is not part of
well-formed UTF-8 as the text \\xNN, as Python's "backslashreplace" writes it. Well-formed UTF-8 comes back as
sent, and a name with an escaped NUL is the whole name, not its part before the NUL. After each, a good
request is answered. The baseline server is not covered here (it decodes with Python's own rules)."""

from __future__ import annotations

import json

import pytest

from launch import Server

pytestmark = pytest.mark.timeout(120)

BAD_NAMES = [b"in\xffput", b"cut\xc3", b"\xc0\xafslash", b"sur\xed\xa0\x80rogate", b"\xf5\xbf\xbf\xbf"]


@pytest.fixture(scope="module")
def srv(model_repository):
    with Server("cpp", model_repository, "--allow-shared-memory") as s:
        yield s


def shown(name: bytes) -> str:
    return name.decode("utf-8", "backslashreplace")


def answer(srv, method, path, body: bytes, headers=None):
    status, _, data = srv.request(method, path, body, {"Content-Type": "application/json", **(headers or {})})
    return status, json.loads(data.decode("utf-8"))  # strict: json.loads(bytes) would let surrogates pass


def input_json(name: bytes, extra: bytes = b'"data": [1, 2]') -> bytes:
    return b'{"name": "' + name + b'", "shape": [1, 2], "datatype": "INT32", ' + extra + b"}"


def assert_still_serving(srv):
    status, body = srv.json("POST", "/v2/models/simple/infer", {"inputs": [
        {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))} for n in ("INPUT0", "INPUT1")]})
    assert status == 200, body


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_input_name_not_utf8_in_json_request(srv, name):
    status, body = answer(srv, "POST", "/v2/models/simple/infer", b'{"inputs": [' + input_json(name) + b"]}")
    assert status == 400
    assert f"unknown input '{shown(name)}'" in body["error"], body
    assert_still_serving(srv)


def test_input_name_not_utf8_in_binary_request(srv):
    header = b'{"inputs": [' + input_json(BAD_NAMES[0], b'"parameters": {"binary_data_size": 8}') + b"]}"
    status, body = answer(srv, "POST", "/v2/models/simple/infer", header + b"\0" * 8,
                          {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and f"'{shown(BAD_NAMES[0])}'" in body["error"], body
    # and a datatype that is not UTF-8, quoted by the parser itself
    header = b'{"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT\xfe32", "data": [1]}]}'
    status, body = answer(srv, "POST", "/v2/models/simple/infer", header)
    assert status == 400 and "unknown datatype 'INT\\xfe32'" in body["error"], body
    assert_still_serving(srv)


def test_output_and_region_names_not_utf8(srv):
    good = b",".join(input_json(n.encode(), b'"data": ' + json.dumps(list(range(16))).encode()).replace(
        b"[1, 2]", b"[1, 16]") for n in ("INPUT0", "INPUT1"))
    status, body = answer(srv, "POST", "/v2/models/simple/infer",
                          b'{"inputs": [' + good + b'], "outputs": [{"name": "OUT\x80"}]}')
    assert status == 400 and "unknown output 'OUT\\x80'" in body["error"], body
    status, body = answer(srv, "POST", "/v2/models/simple/infer", b'{"inputs": [' + good + b'], "outputs": [{"name": '
                          b'"OUTPUT0", "parameters": {"shared_memory_region": "r\xff", "shared_memory_byte_size": 64}}]}')
    assert status == 400 and "no shared memory region 'r\\xff'" in body["error"], body
    status, body = answer(srv, "POST", "/v2/systemsharedmemory/region/reg%FF/register",
                          b'{"key": "/aotc_no_such_\xfe", "byte_size": 16}')
    assert status == 400 and "'reg\\xff'" in body["error"] and "'/aotc_no_such_\\xfe'" in body["error"], body
    assert_still_serving(srv)


def test_utf8_names_come_back_as_sent(srv):
    name = "größe-模型-🙂"
    status, body = answer(srv, "POST", "/v2/models/simple/infer",
                          b'{"inputs": [' + input_json(name.encode()) + b"]}")
    assert status == 400 and f"unknown input '{name}'" in body["error"], body


def test_request_id_not_utf8_is_answered_as_json(srv):
    inputs = [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))} for n in ("INPUT0", "INPUT1")]
    body = b'{"id": "req\xff", ' + json.dumps({"inputs": inputs}).encode()[1:]
    status, r = answer(srv, "POST", "/v2/models/simple/infer", body)
    assert status == 200 and r["id"] == "req\\xff", r


def test_a_name_with_an_escaped_nul_is_not_cut_short(srv):
    """"INPUT0\\u0000junk" is not INPUT0 (the parser once kept only the bytes before the NUL, and served it)."""
    inputs = [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
              for n in ("INPUT0\u0000junk", "INPUT1")]
    status, body = answer(srv, "POST", "/v2/models/simple/infer", json.dumps({"inputs": inputs}).encode())
    assert status == 400 and "unknown input 'INPUT0" in body["error"], body
    assert_still_serving(srv)
