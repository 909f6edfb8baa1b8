"""`aotc serve --python` (the FastAPI baseline) as a black box: started as users start it, on the eager MLP
model file and on a repository of exported packages, then asked over HTTP. The protocol suite shared with
aotc-server is tests/test_protocol.py; this file covers what is particular to the Python server (eager
mode, body limit, compression, statistics, a corrupt package next to a good one)."""

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from aotc_client import Client
from aotc_client.errors import ServerError

ROOT = Path(__file__).resolve().parents[1]
AOTC = str(ROOT / ".venv" / "bin" / "aotc") if (ROOT / ".venv" / "bin" / "aotc").exists() else shutil.which("aotc")


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PythonServer:
    """`aotc serve --python ...` on a free port; waits for readiness, fails fast if the process dies."""

    def __init__(self, *args: str, timeout: float = 180.0):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([AOTC, "serve", "--python", *args, "--http-port", str(self.port)],
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"aotc serve --python exited {self.proc.returncode}:\n{self.proc.stdout.read()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"aotc serve --python not ready after {timeout:g} s")
                time.sleep(0.1)

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        """-> (status, headers, body bytes); never raises for an HTTP error status."""
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def eager_server():
    server = PythonServer("--eager", "models/mlp.py", "--name", "mlp", "--max-body-bytes", "1000000")
    yield server
    server.stop()


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
    assert status == 200 and headers.get("content-encoding", headers.get("Content-Encoding")) == "gzip"
    assert json.loads(gzip.decompress(body))["id"] == "g"
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
        r = subprocess.run([AOTC, "serve", "--python", *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
