"""aotc-server (C++) operations, black box: auth, body limits, graceful shutdown with requests in flight,
a corrupt package next to good ones, hundreds of concurrent keep-alive connections, request logs, flags.

The protocol itself is tests/test_protocol.py (shared with the Python server); batching, repository control
and metrics are tests/test_server_batching.py. Each test starts its own server (bench/launch.py).
"""

from __future__ import annotations

import gzip
import json
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from launch import VENV_BIN, Server, make_repository, server_binary


def simple_body(rows=1, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, (rows, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (rows, 16), dtype=np.int32)
    body = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [rows, 16], "datatype": "INT32", "data": a.ravel().tolist()},
        {"name": "INPUT1", "shape": [rows, 16], "datatype": "INT32", "data": b.ravel().tolist()}]})
    return body, a, b


def metric(text: str, name: str, model: str, **labels) -> float:
    total = None
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total = (total or 0) + float(line.rsplit(" ", 1)[1])
    assert total is not None, f"{name} for {model} not in /metrics"
    return total


def test_api_key_guards_everything_but_health(model_repository):
    with Server("cpp", model_repository, "--api-key", "s3cret") as s:
        assert s.json("GET", "/v2/health/ready")[0] == 200
        assert s.json("GET", "/v2/health/live")[0] == 200
        for method, path in (("GET", "/v2"), ("GET", "/v2/models/simple"), ("POST", "/v2/models/simple/infer"),
                             ("GET", "/metrics"), ("POST", "/v2/repository/index")):
            status, body = s.json(method, path, {} if method == "POST" else None)
            assert status == 401 and "Bearer" in body["error"], path
        assert s.json("GET", "/v2/models/simple", headers={"Authorization": "Bearer wrong"})[0] == 401
        body, a, b = simple_body()
        status, r = s.json("POST", "/v2/models/simple/infer", json.loads(body),
                           headers={"Authorization": "Bearer s3cret"})
        assert status == 200 and r["outputs"][0]["data"] == (a + b).ravel().tolist()


def test_unknown_models_and_versions_in_tritons_words(tmp_path, pkg_simple):
    """Triton's examples string-match these: "Request for unknown model: 'X' is not found", and its version
    forms; a version that failed to load says so after Triton's words."""
    (tmp_path / "broken.pt2").write_bytes(b"not a package")
    repo = make_repository(tmp_path / "repo", {"simple": pkg_simple, "broken": {1: tmp_path / "broken.pt2"}})
    with Server("cpp", repo, "--no-strict-readiness") as s:
        for path, status, words in (
                ("/v2/models/nope", 404, "Request for unknown model: 'nope' is not found"),
                ("/v2/models/simple/versions/7", 404, "Request for unknown model: 'simple' version 7 is not found"),
                ("/v2/models/broken", 503, "Request for unknown model: 'broken' has no available versions ("),
                ("/v2/models/broken/versions/1", 503,
                 "Request for unknown model: 'broken' version 1 is not at ready state (")):
            got, body = s.json("GET", path)
            assert got == status and body["error"].startswith(words), (path, body)
            got, body = s.json("POST", path + "/infer", {"inputs": []})
            assert got == status and body["error"].startswith(words), (path, body)


def test_body_limit_and_inflation_limit(model_repository):
    with Server("cpp", model_repository, "--max-body-bytes", "65536") as s:
        big = json.dumps({"inputs": [{"name": "x", "shape": [40, 512], "datatype": "FP32",
                                      "data": [0.5] * (40 * 512)}]})
        assert len(big) > 65536
        status, _, data = s.request("POST", "/v2/models/mlp/infer", big)
        assert status == 413 and json.loads(data)["error"], data
        bomb = gzip.compress(b" " * (8 << 20))  # 8 MiB of JSON whitespace in ~8 KiB
        status, _, data = s.request("POST", "/v2/models/mlp/infer", bomb, {"Content-Encoding": "gzip"})
        assert status == 413 and json.loads(data)["error"]
        body, a, b = simple_body()
        status, _, data = s.request("POST", "/v2/models/simple/infer", body)
        assert status == 200 and json.loads(data)["outputs"][0]["data"] == (a + b).ravel().tolist()


def test_sigterm_answers_every_accepted_request(tmp_path, pkg_mlp):
    repo = make_repository(tmp_path / "repo", {"mlp": pkg_mlp}, {"mlp": {"max_batch_size": 0, "num_runners": 1}})
    n = 24
    x = np.random.default_rng(0).standard_normal((1024, 512)).astype(np.float32)
    header = json.dumps({"inputs": [{"name": "x", "shape": [1024, 512], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    results: list = [None] * n
    with Server("cpp", repo) as s:
        def send(i):
            try:
                st, h, data = s.request("POST", "/v2/models/mlp/infer", header + x.tobytes(),
                                        {"Inference-Header-Content-Length": str(len(header))}, timeout=120)
                results[i] = (st, len(data) - int(h.get("inference-header-content-length", 0)))
            except OSError as e:
                results[i] = e

        threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while True:  # every request inside the server (queued or answered), and some still waiting
            text = s.request("GET", "/metrics")[2].decode()
            pending = metric(text, "nv_inference_pending_request_count", "mlp")
            done = metric(text, "nv_inference_request_success", "mlp")
            if pending + done >= n:
                break
            assert time.monotonic() < deadline, "requests never reached the server"
            time.sleep(0.005)
        assert pending > 0, "the model answered everything before SIGTERM; nothing was in flight"
        code = s.stop(signal.SIGTERM, timeout=120)
        for t in threads:
            t.join(120)
        assert code == 0, s.log()
        assert all(r == (200, 1024 * 512 * 4) for r in results), results
        assert "SIGTERM" in s.log()


def test_corrupt_package_next_to_good_ones(tmp_path, pkg_mlp, pkg_simple):
    repo = make_repository(tmp_path / "repo", {"mlp": pkg_mlp, "simple": pkg_simple})
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.pt2").write_bytes(pkg_mlp.read_bytes()[: 1 << 16])
    (repo / "empty").mkdir()
    # Strict readiness would hold /v2/health/ready at 503 for the broken ones (test_server_hostile.py)
    with Server("cpp", repo, "--no-strict-readiness") as s:
        status, index = s.json("POST", "/v2/repository/index", {})
        states = {(e["name"], e["version"]): e for e in index}
        assert states[("mlp", "1")]["state"] == "READY" and states[("simple", "1")]["state"] == "READY"
        broken = states[("broken", "1")]
        assert broken["state"] == "UNAVAILABLE" and broken["reason"]
        assert states[("empty", "")]["state"] == "UNAVAILABLE" and "model.pt2" in states[("empty", "")]["reason"]
        assert "broken" in s.log() and "failed to load" in s.log()
        status, body = s.json("GET", "/v2/models/broken/ready")
        assert status == 503
        status, body = s.json("POST", "/v2/models/broken/infer", {"inputs": []})
        assert status == 503 and body["error"]
        body, a, b = simple_body()
        assert s.json("POST", "/v2/models/simple/infer", json.loads(body))[0] == 200


def test_300_concurrent_keep_alive_connections(model_repository):
    n, per_conn = 300, 3
    barrier = threading.Barrier(n, timeout=120)
    ok = [0] * n
    errors: list = []
    body, a, b = simple_body()
    expected = (a + b).ravel().tolist()
    with Server("cpp", model_repository) as s:
        def client(i):
            try:
                conn = s.connect(timeout=60)
                for k in range(per_conn):
                    st, h, data = s.request("POST", "/v2/models/simple/infer", body, conn=conn)
                    assert st == 200 and json.loads(data)["outputs"][0]["data"] == expected
                    assert h.get("connection", "").lower() != "close"
                    ok[i] += 1
                    if k == 0:
                        barrier.wait()  # all n connections are open and have been answered once
                conn.close()
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(repr(e))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert not errors, errors[:5]
        assert sum(ok) == n * per_conn


def test_log_requests_and_default_host(model_repository):
    with Server("cpp", model_repository, "--log-requests") as s:
        s.json("GET", "/v2/models/simple")
        s.json("GET", "/v2/models/nope")
        time.sleep(0.2)
        log = s.log()
        assert "listening on http://127.0.0.1:" in log
        assert re.search(r"GET /v2/models/simple 200", log) and re.search(r"GET /v2/models/nope 404", log)
    grpcclient = pytest.importorskip("tritonclient.grpc")
    with Server("cpp", model_repository, "--log-requests") as s:  # gRPC: a line per RPC, with its code
        c = grpcclient.InferenceServerClient(s.grpc_url)
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(np.ones((1, 16), np.int32))
        assert (c.infer("simple", inputs, client_timeout=10).as_numpy("OUTPUT0") == 2).all()
        with pytest.raises(grpcclient.InferenceServerException):
            c.get_model_metadata("nope", client_timeout=10)
        time.sleep(0.2)
        log = s.log()
        assert re.search(r"GRPC ModelInfer simple OK in=\d+ out=\d+ [0-9.]+ ms", log), log
        assert re.search(r"GRPC ModelMetadata NOT_FOUND", log), log
    with Server("cpp", model_repository) as s:
        s.json("GET", "/v2/models/simple")
        time.sleep(0.2)
        assert "GET /v2/models/simple" not in s.log()


@pytest.mark.parametrize("argv, message", [
    ([], "--model-repository"),
    (["--model-repository", "/no/such/dir"], "is neither a directory nor a .pt2 package"),
    (["--model-repository", ".", "--http-port", "70000"], "--http-port"),
    (["--model-repository", ".", "--bogus"], "unknown option"),
])
def test_bad_flags_exit_with_one_line(argv, message):
    r = subprocess.run([str(server_binary()), *argv], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.skipif(not (VENV_BIN / "aotc-server").exists(), reason="aotc-server is not installed in .venv (make build)")
def test_aotc_serve_execs_the_server_with_its_flags(model_repository):
    with Server("cli", model_repository, "--api-key", "k", "--max-body-bytes", "4096", "--log-requests") as s:
        auth = {"Authorization": "Bearer k"}
        assert s.json("GET", "/v2/models/simple")[0] == 401
        assert s.json("GET", "/v2/models/simple", headers=auth)[0] == 200
        status, _, _ = s.request("POST", "/v2/models/mlp/infer", b"{" + b" " * 5000 + b"}", auth)
        assert status == 413
        assert s.stop() == 0
        assert "GET /v2/models/simple 200" in s.log()
