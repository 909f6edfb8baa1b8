"""`aotc serve --python` (the FastAPI baseline) as a black box: started as users start it, on the eager MLP
model file and on a repository of exported packages, then asked over HTTP. The protocol suite shared with
aotc-server is tests/test_protocol.py; this file covers what is particular to the Python server (eager
mode, body limit, compression, statistics, a corrupt package next to a good one)."""

import gzip
import json
import subprocess

import numpy as np
import pytest

from aotc_client import Client
from aotc_client.errors import ServerError
from launch import REPO, VENV_BIN, Server, make_repository

AOTC = str(VENV_BIN / "aotc")


@pytest.fixture(scope="module")
def eager_server():
    with Server("python-eager", "models/mlp.py", "--name", "mlp", "--max-body-bytes", "1000000") as s:
        yield s


def test_eager_metadata_has_dynamic_dims(eager_server):
    status, _, body = eager_server.request("GET", "/v2/models/mlp")
    meta = json.loads(body)
    assert status == 200 and meta["platform"] == "pytorch_eager" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 512]}]
    assert meta["outputs"] == [{"name": "output0", "datatype": "FP32", "shape": [-1, 512]}]


def test_eager_answers_match_the_model_file(eager_server):
    import torch

    from aotc.load_model import load_model_file

    model = load_model_file("models/mlp.py").model
    with Client(eager_server.url) as client:
        x = client.random_inputs("mlp", sizes=3, seed=4)
        for binary in (True, False):
            got = client.infer("mlp", x, binary=binary, request_id="r1")["output0"]
            with torch.inference_mode():
                want = model(torch.from_numpy(x["x"])).numpy()
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_body_limit_gzip_and_bad_encoding(eager_server):
    x = np.zeros((1000, 512), np.float32)  # 2 MB as binary: over the 1 MB limit
    head = json.dumps({"inputs": [{"name": "x", "shape": [1000, 512], "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    status, _, body = eager_server.request("POST", "/v2/models/mlp/infer", head + x.tobytes(),
                                           {"Inference-Header-Content-Length": str(len(head))})
    assert status == 413 and "limit" in json.loads(body)["error"]
    small = json.dumps({"id": "g", "inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32",
                                               "data": [0.25] * 512}]}).encode()
    status, headers, body = eager_server.request("POST", "/v2/models/mlp/infer", gzip.compress(small),
                                                 {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"  # Server.request inflated it
    assert json.loads(body)["id"] == "g"
    status, _, body = eager_server.request("POST", "/v2/models/mlp/infer", small, {"Content-Encoding": "br"})
    assert status == 501 and "br" in json.loads(body)["error"]
    bomb = gzip.compress(b" " * 3_000_000)  # inflates past the limit
    status, _, _ = eager_server.request("POST", "/v2/models/mlp/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 413


def test_errors_are_one_line_json_and_the_server_keeps_serving(eager_server):
    cases = [("GET", "/v2/models/nope", None, 404), ("POST", "/v2/models/mlp/infer", b"{bad", 400),
             ("GET", "/v2/models/mlp/infer", None, 405), ("GET", "/v2/models/mlp/versions/9", None, 404),
             ("POST", "/v2/models/mlp/infer", b'{"inputs":[{"name":"x","shape":[1,512],"datatype":"FP32",'
                                              b'"data":[[1,2]]}]}', 400)]
    for method, path, body, want in cases:
        status, _, answer = eager_server.request(method, path, body)
        error = json.loads(answer)["error"]
        assert status == want and error and "\n" not in error, (path, status, error)
    with Client(eager_server.url) as client:
        assert client.infer("mlp", {"x": np.ones((2, 512), np.float32)})["output0"].shape == (2, 512)
        with pytest.raises(ServerError, match="dim 1 is 3") as e:
            client.infer("mlp", {"x": np.ones((2, 3), np.float32)})
        assert e.value.status == 400


def test_statistics_count_successes_and_failures(eager_server):
    def stats():
        _, _, body = eager_server.request("GET", "/v2/models/mlp/stats")
        return json.loads(body)["model_stats"][0]
    before = stats()
    with Client(eager_server.url) as client:
        client.infer("mlp", {"x": np.ones((4, 512), np.float32)})
        with pytest.raises(ServerError):
            client.infer("mlp", {"x": np.ones((4, 3), np.float32)})
    after = stats()
    assert after["inference_count"] - before["inference_count"] == 4
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 1


def test_bad_command_lines_are_one_line_errors(tmp_path):
    for args, message in ((["--eager", "models/nope.py"], "not found"),
                          ([str(tmp_path)], "no packages")):
        r = subprocess.run([AOTC, "serve", "--python", *args], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_repository_serves_good_packages_next_to_a_corrupt_one(tmp_path, pkg_mlp, pkg_simple):
    corrupt = tmp_path / "corrupt.pt2"
    corrupt.write_bytes(pkg_mlp.read_bytes()[: pkg_mlp.stat().st_size // 2])  # truncated archive
    repo = make_repository(tmp_path / "repo", {"mlp": {1: pkg_simple, 2: pkg_mlp}, "broken": corrupt})
    with Server("python", repo) as server:
        status, index = server.json("POST", "/v2/repository/index", {})
        states = {(e["name"], e["version"]): (e["state"], e["reason"]) for e in index}
        assert states[("mlp", "2")] == ("READY", "") and states[("broken", "1")][0] == "UNAVAILABLE"
        reason = states[("broken", "1")][1]
        assert "not a readable .pt2 archive" in reason and "\n" not in reason
        status, meta = server.json("GET", "/v2/models/mlp")  # no version: the highest
        assert status == 200 and meta["versions"] == ["1", "2"] and meta["inputs"][0]["name"] == "x"
        status, meta = server.json("GET", "/v2/models/mlp/versions/1")
        assert meta["inputs"][0]["name"] == "INPUT0"
        assert server.json("GET", "/v2/models/broken")[0] == 404
        assert server.json("POST", "/v2/repository/models/mlp/unload", {})[0] == 200
        assert server.json("GET", "/v2/models/mlp/ready")[0] == 404
        assert server.json("POST", "/v2/repository/models/mlp/load", {})[0] == 200
        with Client(server.url) as client:
            out = client.infer("mlp", {"x": np.ones((2, 512), np.float32)})
        assert out["output0"].shape == (2, 512)
