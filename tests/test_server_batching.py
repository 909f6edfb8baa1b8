"""aotc-server (C++) dynamic batching, repository control and metrics, black box.

Batching correctness uses distinct inputs per client, each answer checked: the simple model exactly
(sum/difference of int32), the MLP against the eager outputs stored in its package. Hot reload runs under
continuous load and must not fail a single request. Metric values are checked after a known sequence.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import numpy as np
import pytest

from conftest import read_samples
from launch import Server, make_repository
from test_server import metric


def simple_request(a, b):
    return {"inputs": [
        {"name": "INPUT0", "shape": list(a.shape), "datatype": "INT32", "data": a.ravel().tolist()},
        {"name": "INPUT1", "shape": list(b.shape), "datatype": "INT32", "data": b.ravel().tolist()}]}


def run_clients(n, fn):
    """Runs fn(i) in n threads started together; returns the exceptions raised."""
    barrier = threading.Barrier(n, timeout=60)
    errors: list = []

    def wrap(i):
        try:
            barrier.wait()
            fn(i)
        except Exception as e:  # noqa: BLE001 (returned to the test)
            errors.append(f"client {i}: {e!r}")

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return errors


def run_until_batched(s, n, client, rows_over: int, min_rounds: int = 1):
    """Runs run_clients(n, client) against `simple` in rounds, every answer checked by `client`, until its stats
    show a batch of more than `rows_over` rows (more than one request's), after at least `min_rounds`, at most
    6: a batch waits only while another executes, and a loaded machine may start the clients further apart
    than a call of `simple` takes. Returns (rounds, the model's stats, {batch size: executions})."""
    for rounds in range(1, 7):
        assert run_clients(n, client) == []
        _, st = s.json("GET", "/v2/models/simple/stats")
        m = st["model_stats"][0]
        batches = {b["batch_size"]: b["compute_infer"]["count"] for b in m["batch_stats"]}
        if rounds >= min_rounds and max(batches) > rows_over:
            break
    return rounds, m, batches


def test_batched_requests_asking_different_outputs_each_get_theirs(tmp_path, pkg_simple):
    # A batch returns the outputs any of its requests asks for (a CUDA package copies no others to the host);
    # each answer holds exactly the outputs its request named, with its own rows.
    repo = make_repository(tmp_path / "repo", {"simple": pkg_simple},
                           {"simple": {"max_batch_size": 32, "max_queue_delay_us": 20000,
                                       "run_inline_when_idle": False}})
    rng = np.random.default_rng(11)
    asks = [["OUTPUT0"], ["OUTPUT1"], ["OUTPUT1", "OUTPUT0"], None]  # None: no "outputs" field, so both
    inputs = [(rng.integers(-10**6, 10**6, (1 + i % 2, 16), dtype=np.int32),
               rng.integers(-10**6, 10**6, (1 + i % 2, 16), dtype=np.int32)) for i in range(32)]
    with Server("cpp", repo) as s:
        def client(i):
            a, b = inputs[i]
            ask = asks[i % len(asks)]
            body = simple_request(a, b)
            if ask is not None:
                body["outputs"] = [{"name": n} for n in ask]
            for _ in range(2):
                status, r = s.json("POST", "/v2/models/simple/infer", body)
                assert status == 200, r
                out = {o["name"]: np.array(o["data"], np.int64).reshape(o["shape"]) for o in r["outputs"]}
                assert sorted(out) == sorted(ask or ["OUTPUT0", "OUTPUT1"]), r["outputs"]
                if "OUTPUT0" in out:
                    assert (out["OUTPUT0"] == a.astype(np.int64) + b).all()
                if "OUTPUT1" in out:
                    assert (out["OUTPUT1"] == a.astype(np.int64) - b).all()

        rounds, _, batches = run_until_batched(s, 32, client, rows_over=2)
        assert max(batches) > 2, f"no batch larger than one request was formed in {rounds} rounds: {batches}"


def test_batching_64_clients_distinct_inputs(tmp_path, pkg_simple):
    # The hand-off to a runner is kept (run_inline_when_idle false): the simple model runs in microseconds,
    # so run on the HTTP thread a request is done before the next arrives, and batches would rarely form.
    repo = make_repository(tmp_path / "repo", {"simple": pkg_simple},
                           {"simple": {"max_batch_size": 32, "max_queue_delay_us": 20000,
                                       "run_inline_when_idle": False}})
    rng = np.random.default_rng(7)
    rows = [1 + i % 3 for i in range(64)]
    inputs = [(rng.integers(-10**6, 10**6, (r, 16), dtype=np.int32),
               rng.integers(-10**6, 10**6, (r, 16), dtype=np.int32)) for r in rows]
    with Server("cpp", repo) as s:
        def client(i):
            a, b = inputs[i]
            for _ in range(3):
                status, r = s.json("POST", "/v2/models/simple/infer", simple_request(a, b))
                assert status == 200, r
                out = {o["name"]: np.array(o["data"], np.int64).reshape(o["shape"]) for o in r["outputs"]}
                assert out["OUTPUT0"].shape == a.shape
                assert (out["OUTPUT0"] == a + b).all() and (out["OUTPUT1"] == a - b).all()

        rounds, m, batches = run_until_batched(s, 64, client, rows_over=3)
        assert m["inference_stats"]["success"]["count"] == 64 * 3 * rounds
        assert m["inference_count"] == 3 * sum(rows) * rounds
        assert sum(size * count for size, count in batches.items()) == m["inference_count"]
        assert sum(batches.values()) == m["execution_count"] < 64 * 3 * rounds
        assert max(batches) > 3, f"no batch larger than one request was formed in {rounds} rounds: {batches}"
        assert max(batches) <= 32

        # Larger than max_batch_size but within the package's range: runs alone. Beyond the range: 400.
        a = np.ones((40, 16), np.int32)
        status, r = s.json("POST", "/v2/models/simple/infer", simple_request(a, a))
        assert status == 200 and r["outputs"][0]["shape"] == [40, 16]
        a = np.ones((1025, 16), np.int32)
        status, r = s.json("POST", "/v2/models/simple/infer", simple_request(a, a))
        assert status == 400 and "1024" in r["error"]


def test_batched_mlp_matches_eager(tmp_path, pkg_mlp):
    (xs,), (ys,) = read_samples(pkg_mlp)[0]
    repo = make_repository(tmp_path / "repo", {"mlp": pkg_mlp},  # hand-offs kept, as above
                           {"mlp": {"max_queue_delay_us": 5000, "num_runners": 2, "run_inline_when_idle": False}})
    with Server("cpp", repo) as s:
        def client(i):
            x = xs[i:i + 1].astype(np.float32)
            status, r = s.json("POST", "/v2/models/mlp/infer", {"inputs": [
                {"name": "x", "shape": [1, 512], "datatype": "FP32", "data": x.ravel().tolist()}]})
            assert status == 200, r
            got = np.array(r["outputs"][0]["data"], np.float32)
            assert np.allclose(got, ys[i], atol=1e-4, rtol=1e-4), np.abs(got - ys[i]).max()

        assert run_clients(len(xs), client) == []
        _, st = s.json("GET", "/v2/models/mlp/stats")
        assert max(b["batch_size"] for b in st["model_stats"][0]["batch_stats"]) > 1


def _install_version(repo, model, version, pkg_bytes):
    """Writes the package beside the repository, then renames it in: the poller never sees half a file."""
    staging = repo.parent / f"staging-{model}-{version}"
    staging.mkdir()
    (staging / "model.pt2").write_bytes(pkg_bytes)
    os.rename(staging, repo / model / str(version))


def test_hot_reload_under_load(tmp_path, pkg_simple):
    repo = make_repository(tmp_path / "repo", {"simple": pkg_simple})
    stop = threading.Event()
    failures: list = []
    versions_seen: list = []
    with Server("cpp", repo, "--poll-repository", "1") as s:
        def load(i):
            rng = np.random.default_rng(i)
            conn = s.connect()
            while not stop.is_set():
                a = rng.integers(-1000, 1000, (1, 16), dtype=np.int32)
                try:
                    status, _, data = s.request("POST", "/v2/models/simple/infer",
                                                json.dumps(simple_request(a, a)), conn=conn)
                    r = json.loads(data)
                    if status != 200 or r["outputs"][0]["data"] != (2 * a).ravel().tolist():
                        failures.append((status, r))
                    else:
                        versions_seen.append(r["model_version"])
                except Exception as e:  # noqa: BLE001
                    failures.append(repr(e))
                    conn = s.connect()

        threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()

        def wait_for(cond, what, timeout=90):
            deadline = time.monotonic() + timeout
            while not cond():
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                time.sleep(0.1)

        def index():
            return {(e["name"], e["version"]): e for e in s.json("POST", "/v2/repository/index", {})[1]}

        try:
            time.sleep(0.5)
            _install_version(repo, "simple", 2, pkg_simple.read_bytes())
            wait_for(lambda: versions_seen and versions_seen[-1] == "2", "version 2 to serve")
            assert s.json("GET", "/v2/models/simple/versions/1/ready")[0] == 200

            _install_version(repo, "simple", 3, pkg_simple.read_bytes()[:50000])  # broken
            wait_for(lambda: ("simple", "3") in index(), "version 3 to be tried")
            v3 = index()[("simple", "3")]
            assert v3["state"] == "UNAVAILABLE" and v3["reason"]
            n = len(versions_seen)
            wait_for(lambda: len(versions_seen) > n + 20, "more answers")
            assert set(versions_seen[n:]) == {"2"}

            shutil.rmtree(repo / "simple" / "1")
            wait_for(lambda: ("simple", "1") not in index(), "version 1 to be unloaded")
            assert s.json("GET", "/v2/models/simple/versions/1/ready")[0] == 404
            n = len(versions_seen)
            wait_for(lambda: len(versions_seen) > n + 20, "more answers")
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        assert failures == []
        assert "loaded model 'simple' version 2" in s.log() and "version 3" in s.log()


def test_load_and_unload_through_the_api(model_repository):
    with Server("cpp", model_repository) as s:
        body = simple_request(np.ones((1, 16), np.int32), np.ones((1, 16), np.int32))
        assert s.json("POST", "/v2/repository/models/simple/unload", {})[0] == 200
        assert s.json("GET", "/v2/models/simple/ready")[0] == 503
        status, r = s.json("POST", "/v2/models/simple/infer", body)
        assert status == 503 and r["error"]
        index = {(e["name"], e["version"]): e for e in s.json("POST", "/v2/repository/index", {})[1]}
        assert index[("simple", "1")]["state"] == "UNAVAILABLE" and index[("mlp", "1")]["state"] == "READY"
        assert s.json("POST", "/v2/repository/models/simple/load", {})[0] == 200
        assert s.json("GET", "/v2/models/simple/ready")[0] == 200
        assert s.json("POST", "/v2/models/simple/infer", body)[0] == 200
        status, r = s.json("POST", "/v2/repository/models/nope/load", {})
        assert status == 404 and r["error"]


def test_load_with_a_config_is_validated_then_applied(model_repository):
    """tritonclient's load_model(config=...): junk and unknown keys get 400 and change nothing; a valid config
    is what the model then runs with, until a load without one brings config.json back."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    with Server("cpp", model_repository) as s:
        c = httpclient.InferenceServerClient(f"127.0.0.1:{s.port}", network_timeout=120)
        path = "/v2/repository/models/simple/load"
        for body, message in (
                ({"parameters": {"config": "{not json"}}, "load parameter 'config' is not valid JSON"),
                ({"parameters": {"config": json.dumps({"max_batch_sise": 4})}}, "unknown key 'max_batch_sise'"),
                ({"parameters": {"config": json.dumps({"max_batch_size": -1})}}, "'max_batch_size' must be"),
                ({"parameters": {"config": {"max_batch_size": 4}}}, "'config' must be a string"),
                ({"parameters": {"conf": "{}"}}, "unknown load parameter 'conf'"),
                ({"parameters": {"file:1/model.pt2": "AAAA"}}, "model files in the request are not supported"),
                ({"parameters": 5}, "'parameters' must be a JSON object")):
            status, r = s.json("POST", path, body)
            assert status == 400 and message in r["error"], (body, r)
        with pytest.raises(InferenceServerException, match="unknown key 'nope'"):
            c.load_model("simple", config=json.dumps({"nope": 1}))
        assert c.get_model_config("simple")["max_batch_size"] == 64 and c.is_model_ready("simple")
        c.load_model("simple", config=json.dumps({"max_batch_size": 4, "max_queue_delay_us": 50}))
        cfg = c.get_model_config("simple")
        assert cfg["max_batch_size"] == 4 and cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 50
        body = simple_request(np.ones((1, 16), np.int32), np.ones((1, 16), np.int32))
        assert s.json("POST", "/v2/models/simple/infer", body)[0] == 200
        c.load_model("simple")
        assert c.get_model_config("simple")["max_batch_size"] == 64
        c.close()


def test_metrics_after_a_known_sequence(tmp_path, pkg_simple):
    repo = make_repository(tmp_path / "repo", {"simple": pkg_simple}, {"simple": {"max_batch_size": 0}})
    with Server("cpp", repo) as s:
        a = np.arange(32, dtype=np.int32).reshape(2, 16)
        for _ in range(5):
            assert s.json("POST", "/v2/models/simple/infer", simple_request(a, a))[0] == 200
        bad = simple_request(a, a)
        bad["inputs"][0]["datatype"] = "FP32"
        for _ in range(3):
            assert s.json("POST", "/v2/models/simple/infer", bad)[0] == 400
        status, _, data = s.request("GET", "/metrics")
        assert status == 200
        text = data.decode()
        v = dict(version="1")
        assert metric(text, "nv_inference_request_success", "simple", **v) == 5
        assert metric(text, "nv_inference_request_failure", "simple", reason="REJECTED", **v) == 3
        assert metric(text, "nv_inference_request_failure", "simple", reason="BACKEND", **v) == 0
        assert metric(text, "nv_inference_count", "simple", **v) == 10
        assert metric(text, "nv_inference_exec_count", "simple", **v) == 5
        assert metric(text, "nv_inference_pending_request_count", "simple", **v) == 0
        for name in ("nv_inference_request_duration_us", "nv_inference_compute_infer_duration_us"):
            assert metric(text, name, "simple", **v) > 0
        for name in ("nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
                     "nv_inference_compute_output_duration_us"):
            assert metric(text, name, "simple", **v) >= 0
        assert metric(text, "nv_model_load_duration_secs", "simple", **v) > 0
        cpu = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
               if line.startswith("nv_cpu_")}
        assert 0 <= cpu["nv_cpu_utilization"] <= 1, cpu
        assert 0 < cpu["nv_cpu_memory_used_bytes"] < cpu["nv_cpu_memory_total_bytes"], cpu
        assert "# TYPE nv_cpu_utilization gauge" in text and "# TYPE nv_cpu_memory_used_bytes gauge" in text
        assert "# TYPE nv_inference_request_success counter" in text
        status, headers, data = s.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        # Like Triton, only inference responses are compressed (http.cpp): /metrics comes back as plain text.
        same = lambda t: [line for line in t.splitlines() if not line.startswith("nv_cpu_")]  # noqa: E731
        assert "content-encoding" not in headers and same(data.decode()) == same(text)
        _, st = s.json("GET", "/v2/models/simple/versions/1/stats")
        m = st["model_stats"][0]
        assert m["inference_stats"]["success"]["count"] == 5 and m["inference_stats"]["fail"]["count"] == 3
        assert m["batch_stats"] == [{**m["batch_stats"][0], "batch_size": 2}]


def test_queue_limit_and_timeout_answer_503(tmp_path, pkg_mlp):
    repo = make_repository(tmp_path / "repo", {"mlp": pkg_mlp},
                           {"mlp": {"max_batch_size": 0, "max_queue_size": 2, "num_runners": 1}})
    x = np.zeros((1024, 512), np.float32)
    header = json.dumps({"inputs": [{"name": "x", "shape": [1024, 512], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    statuses: list = []
    with Server("cpp", repo) as s:
        def client(i):
            st, _, data = s.request("POST", "/v2/models/mlp/infer", header + x.tobytes(),
                                    {"Inference-Header-Content-Length": str(len(header))})
            statuses.append(st)
            if st == 503:
                assert "max_queue_size" in json.loads(data)["error"]

        assert run_clients(16, client) == []
        assert sorted(set(statuses)) == [200, 503], statuses
        text = s.request("GET", "/metrics")[2].decode()
        assert metric(text, "nv_inference_request_failure", "mlp", reason="REJECTED") == statuses.count(503)

        # A request whose timeout (us) passes while it waits behind busy runners is answered 503.
        small = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.0] * 512}],
                 "parameters": {"timeout": 1}}
        big = [threading.Thread(target=s.request, args=("POST", "/v2/models/mlp/infer", header + x.tobytes(),
                                                        {"Inference-Header-Content-Length": str(len(header))}))
               for _ in range(2)]
        for t in big:
            t.start()
        deadline = time.monotonic() + 30
        while metric(s.request("GET", "/metrics")[2].decode(), "nv_inference_pending_request_count", "mlp") < 2:
            assert time.monotonic() < deadline
        status, r = s.json("POST", "/v2/models/mlp/infer", small)
        assert status == 503 and "timeout" in r["error"], r
        for t in big:
            t.join(60)
        text = s.request("GET", "/metrics")[2].decode()
        assert metric(text, "nv_inference_request_failure", "mlp", reason="CANCELED") == 1


def _big_mlp_request(s, rows=1024):
    """Posts one [rows, 512] request with binary data, larger than max_batch_size so it runs alone."""
    x = np.zeros((rows, 512), np.float32)
    header = json.dumps({"inputs": [{"name": "x", "shape": [rows, 512], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return s.request("POST", "/v2/models/mlp/infer", header + x.tobytes(),
                     {"Inference-Header-Content-Length": str(len(header))})


def _wait_pending(s, model, n, timeout=30, while_alive=None):
    """Polls /metrics until `model` has `n` requests pending: True. With `while_alive` (a thread), False once
    that thread has ended without them being seen."""
    deadline = time.monotonic() + timeout
    while metric(s.request("GET", "/metrics")[2].decode(), "nv_inference_pending_request_count", model) < n:
        if while_alive is not None and not while_alive.is_alive():
            return False
        assert time.monotonic() < deadline, f"{model} never had {n} request(s) pending"
    return True


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "hand-off"])
def test_lone_request_does_not_wait_for_the_delay(tmp_path, pkg_simple, pkg_mlp, inline):
    # A 60 s queue delay and a 10 s client timeout: with no batch of the model executing, a request is
    # taken at once (scheduler.cpp), so requests one at a time never pay the delay: run on its HTTP thread
    # (the default) or handed to a runner.
    delay = {"max_batch_size": 16, "max_queue_delay_us": 60_000_000, **({} if inline else {"run_inline_when_idle": False})}
    repo = make_repository(tmp_path / "repo", {"simple": pkg_simple, "mlp": pkg_mlp},
                           {"simple": delay, "mlp": {**delay, "num_runners": 2}})
    with Server("cpp", repo, request_timeout=10) as s:
        _, cfg = s.json("GET", "/v2/models/simple/config")
        assert cfg["run_inline_when_idle"] is inline, cfg
        for i in range(3):
            a = np.full((1, 16), i, np.int32)
            status, r = s.json("POST", "/v2/models/simple/infer", simple_request(a, a))
            assert status == 200 and r["outputs"][0]["data"] == [2 * i] * 16, r

        # A request that arrives while another instance runs a batch may wait for company, but no longer
        # than that batch runs: the runner holding it re-checks when the model goes idle.
        # On a busy machine the big request can be answered before a /metrics poll sees it pending: then it
        # is sent again, so that the small one really arrives while an instance runs a batch.
        for bigs in range(1, 6):
            big = threading.Thread(target=_big_mlp_request, args=(s,))
            big.start()
            if _wait_pending(s, "mlp", 1, while_alive=big):
                break
            big.join(60)
        else:
            pytest.fail("five 1024-row requests were each answered before /metrics saw one pending")
        small = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.0] * 512}]}
        status, r = s.json("POST", "/v2/models/mlp/infer", small)
        assert status == 200 and r["outputs"][0]["shape"] == [1, 512], r
        big.join(60)
        _, st = s.json("GET", "/v2/models/mlp/stats")
        assert st["model_stats"][0]["inference_stats"]["success"]["count"] == bigs + 1


def test_preferred_batch_size_goes_without_waiting_for_the_delay(tmp_path, pkg_mlp):
    # A 60 s queue delay: the delay only applies while another batch of the model executes, so a 1024-row
    # request (over max_batch_size: it runs alone, ~30 ms) keeps one of two instances busy. The four small
    # requests that arrive meanwhile wait on the other; they go as one batch only because 4 is preferred.
    # On a loaded machine the big request may end before the small ones have all arrived; the model then
    # idles and the partial batch rightly goes at once. Such a round proves nothing and runs again.
    repo = make_repository(tmp_path / "repo", {"mlp": pkg_mlp}, {"mlp": {
        "max_batch_size": 16, "max_queue_delay_us": 60_000_000, "preferred_batch_sizes": [4], "num_runners": 2}})
    for _ in range(3):
        with Server("cpp", repo, request_timeout=30) as s:
            conns = [s.connect() for _ in range(4)]
            for c in conns:
                c.connect()
            big_done = []
            big = threading.Thread(target=lambda: (_big_mlp_request(s), big_done.append(time.monotonic())))
            big.start()
            _wait_pending(s, "mlp", 1)
            sent = [0.0] * 4

            def client(i):
                x = np.full((1, 512), i, np.float32)
                header = json.dumps({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32",
                                                 "parameters": {"binary_data_size": x.nbytes}}]}).encode()
                sent[i] = time.monotonic()
                status, _, data = s.request("POST", "/v2/models/mlp/infer", header + x.tobytes(),
                                            {"Inference-Header-Content-Length": str(len(header))}, conn=conns[i])
                assert status == 200 and json.loads(data)["outputs"][0]["shape"] == [1, 512], data

            assert run_clients(4, client) == []
            big.join(60)
            _, st = s.json("GET", "/v2/models/mlp/stats")
            sizes = sorted(b["batch_size"] for b in st["model_stats"][0]["batch_stats"])
            # the last small request needs a moment after being sent to reach the queue
            if sizes != [4, 1024] and big_done and big_done[0] < max(sent) + 0.05:
                continue
            assert sizes == [4, 1024]
            _, cfg = s.json("GET", "/v2/models/mlp/config")
            assert cfg["dynamic_batching"]["preferred_batch_size"] == [4] and cfg["max_batch_size"] == 16
            return
    pytest.fail("in three rounds the 1024-row request never outlasted the sending of four small ones")
