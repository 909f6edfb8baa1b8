"""aotc-server (C++) with a CUDA package, black box, on a GPU machine: answers against the package's eager
samples, batches cut to the CUDA graph buckets, --no-cuda-graphs, config.json's device_index, answers that
hold only the outputs asked for, and inputs and outputs in shared memory regions.

Not for CPU CI: every test is marked `cuda` and the module skips itself when torch sees no CUDA device.
The packages are the MLP and BERT-base of tests/test_cuda.py (its `package` fixture: $AOTC_CUDA_PACKAGES
from bench/gpu.sh, else exported once). The server binary is $AOTC_SERVER_BIN, else `aotc-server` on PATH (bench/gpu.sh puts
it there). Each test starts its own server and sends requests from its own threads.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

pytestmark = pytest.mark.cuda
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the GPU machine: bash bench/gpu.sh)", allow_module_level=True)

from conftest import read_samples  # noqa: E402
from launch import Server, make_repository  # noqa: E402
from test_cuda import package  # noqa: E402, F401 (the session fixture that provides CUDA packages)
from test_server_batching import run_clients  # noqa: E402


@pytest.fixture(autouse=True)
def server_bin(monkeypatch):
    if not os.environ.get("AOTC_SERVER_BIN"):
        exe = shutil.which("aotc-server")
        if exe is None:
            pytest.skip("no aotc-server: set AOTC_SERVER_BIN or put it on PATH")
        monkeypatch.setenv("AOTC_SERVER_BIN", exe)


def buckets(max_batch: int) -> list[int]:
    """runtime_cpp/src/cuda_graphs.cpp batch_buckets(1, max): powers of two below max, then max."""
    from aotc.graphs import graph_buckets

    return graph_buckets(1, max_batch)


def send_rows(s, xs, ys, tol, n):
    """n batch-1 requests at once, rows 0..n-1 of the samples, each answer checked."""
    def client(i):
        j = i % len(xs)
        x = xs[j:j + 1].astype(np.float32)
        status, r = s.json("POST", "/v2/models/mlp/infer", {"inputs": [
            {"name": "x", "shape": [1, 512], "datatype": "FP32", "data": x.ravel().tolist()}]})
        assert status == 200, r
        got = np.array(r["outputs"][0]["data"], np.float32)
        assert np.allclose(got, ys[j], **tol), np.abs(got - ys[j]).max()

    assert run_clients(n, client) == []
    _, st = s.json("GET", "/v2/models/mlp/stats")
    st = st["model_stats"][0]
    assert st["inference_count"] == n
    return sorted(b["batch_size"] for b in st["batch_stats"])


def test_batches_land_on_graph_buckets(tmp_path, package):
    pkg = package("mlp")
    (xs,), (ys,) = read_samples(pkg)[0]
    tol = {"atol": 1e-3, "rtol": 1e-3}
    # 11 requests, at most 8 a batch, a long delay: a batcher that ignores the buckets sends 8 + 3.
    repo = make_repository(tmp_path / "repo", {"mlp": pkg},
                           {"mlp": {"max_batch_size": 8, "max_queue_delay_us": 300000, "device_index": 0}})
    with Server("cpp", repo) as s:
        _, cfg = s.json("GET", "/v2/models/mlp/config")
        assert cfg["instance_group"][0]["gpus"] == [0] and cfg["instance_group"][0]["kind"] == "KIND_GPU"
        assert cfg["optimization"]["cuda"] == {"graphs": True, "graph_batch_sizes": buckets(1024)}
        sizes = send_rows(s, xs, ys, tol, 11)
        assert set(sizes) <= {1, 2, 4, 8}, sizes
        assert "CUDA graphs at batch 1,2,4" in s.log()

    with Server("cpp", repo, "--no-cuda-graphs") as s:
        _, cfg = s.json("GET", "/v2/models/mlp/config")
        assert cfg["optimization"]["cuda"] == {"graphs": False, "graph_batch_sizes": []}
        send_rows(s, xs, ys, tol, 11)


def test_device_index_of_a_missing_gpu_is_refused(tmp_path, package):
    pkg = package("mlp")
    repo = make_repository(tmp_path / "repo", {"mlp": pkg, "far": pkg}, {"far": {"device_index": 99}})
    with Server("cpp", repo, "--device-index", "0", "--no-strict-readiness") as s:  # "far" never gets ready
        _, cfg = s.json("GET", "/v2/models/mlp/config")
        assert cfg["instance_group"][0]["gpus"] == [0]
        _, index = s.json("POST", "/v2/repository/index", {})
        far = next(e for e in index if e["name"] == "far")
        assert far["state"] == "UNAVAILABLE" and "CUDA device 99 does not exist" in far["reason"], far


def test_an_answer_holds_only_the_outputs_asked_for(tmp_path, package):
    """BERT (last_hidden_state and pooler_output) with CUDA graphs: the runtime copies back to the host only
    the outputs a batch's requests ask for. Requests for pooler_output alone, for both, and for the default
    (no "outputs": both), sent together so they share batches, each get exactly theirs, matching the
    package's eager sample."""
    import tritonclient.http as httpclient

    pkg = package("bert_base")
    (ids,), refs = read_samples(pkg)[0]
    names = ["last_hidden_state", "pooler_output"]
    repo = make_repository(tmp_path / "repo", {"bert_base": pkg},
                           {"bert_base": {"max_batch_size": 32, "max_queue_delay_us": 20000, "device_index": 0}})
    asks = [["pooler_output"], None, names, ["last_hidden_state"]]
    with Server("cpp", repo) as s:
        def client(i):
            ask = asks[i % len(asks)]
            c = httpclient.InferenceServerClient(f"127.0.0.1:{s.port}", network_timeout=60)
            x = httpclient.InferInput("input_ids", list(ids.shape), "INT64")
            x.set_data_from_numpy(ids, binary_data=True)
            outs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ask] if ask else None
            for _ in range(3):
                r = c.infer("bert_base", [x], outputs=outs)
                returned = [o["name"] for o in r.get_response()["outputs"]]
                assert sorted(returned) == sorted(ask or names), returned
                for name, ref in zip(names, refs):
                    if name in returned:
                        got, want = r.as_numpy(name).astype(np.float32), ref.astype(np.float32)
                        assert np.allclose(got, want, atol=2e-2, rtol=2e-2), \
                            f"{name}: max abs diff {np.abs(got - want).max()}"
            c.close()

        assert run_clients(16, client) == []
        _, st = s.json("GET", "/v2/models/bert_base/stats")
        batches = {b["batch_size"]: b["compute_infer"]["count"] for b in st["model_stats"][0]["batch_stats"]}
        assert max(batches) > ids.shape[0], f"no batch larger than one request was formed: {batches}"


@pytest.mark.parametrize("flags", [(), ("--no-cuda-graphs",)], ids=["graphs", "no-graphs"])
def test_outputs_in_shared_memory_come_straight_from_the_device(tmp_path, package, flags):
    """BERT's last_hidden_state asked into a shared memory region of each client's own, pooler_output in the
    answer, by clients sharing batches: the runtime copies each request's rows from the device into its region
    (page-locked at first use), with CUDA graphs and without; every region holds the eager sample's values."""
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    pkg = package("bert_base")
    (ids,), (hidden, pooled) = read_samples(pkg)[0]
    repo = make_repository(tmp_path / "repo", {"bert_base": pkg},
                           {"bert_base": {"max_batch_size": 32, "max_queue_delay_us": 20000, "device_index": 0}})
    n = 12
    handles = []
    with Server("cpp", repo, "--allow-shared-memory", *flags) as s:
        try:
            for i in range(n):
                key = f"/aotc_cuda_test_{os.getpid()}_{i}"
                handles.append(shm.create_shared_memory_region(f"h{i}", key, hidden.nbytes, create_only=True))
                status, body = s.json("POST", f"/v2/systemsharedmemory/region/h{i}/register",
                                      {"key": key, "offset": 0, "byte_size": hidden.nbytes})
                assert status == 200, body

            def client(i):
                c = httpclient.InferenceServerClient(f"127.0.0.1:{s.port}", network_timeout=60)
                x = httpclient.InferInput("input_ids", list(ids.shape), "INT64")
                x.set_data_from_numpy(ids, binary_data=True)
                out = httpclient.InferRequestedOutput("last_hidden_state")
                out.set_shared_memory(f"h{i}", hidden.nbytes)
                for _ in range(3):
                    shm.set_shared_memory_region(handles[i], [np.zeros_like(hidden)])
                    r = c.infer("bert_base", [x], outputs=[out, httpclient.InferRequestedOutput("pooler_output")])
                    got = shm.get_contents_as_numpy(handles[i], hidden.dtype, list(hidden.shape)).astype(np.float32)
                    assert np.allclose(got, hidden.astype(np.float32), atol=2e-2, rtol=2e-2), \
                        f"client {i}: max abs diff {np.abs(got - hidden.astype(np.float32)).max()}"
                    assert np.allclose(r.as_numpy("pooler_output").astype(np.float32), pooled.astype(np.float32),
                                       atol=2e-2, rtol=2e-2)
                c.close()

            assert run_clients(n, client) == []
            _, st = s.json("GET", "/v2/models/bert_base/stats")
            batches = {b["batch_size"]: b["compute_infer"]["count"] for b in st["model_stats"][0]["batch_stats"]}
            assert max(batches) > ids.shape[0], f"no batch larger than one request was formed: {batches}"
            assert "stays pageable" not in s.log(), s.log()[-2000:]
        finally:
            for h in handles:
                shm.destroy_shared_memory_region(h)


@pytest.mark.parametrize("flags", [(), ("--no-cuda-graphs",)], ids=["graphs", "no-graphs"])
def test_inputs_in_shared_memory_go_to_the_device_from_their_region(tmp_path, package, flags):
    """The MLP's input in a client's shared memory region: 64 rows, 128 KiB, large enough for the runtime to
    copy them to the device straight from the region once aotc-server has page-locked it. Other rows are
    written into the region before each request, and every answer matches the eager sample of the rows
    written, with CUDA graphs and without."""
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    pkg = package("mlp")
    (xs,), (ys,) = read_samples(pkg)[0]
    rows = 64
    nbytes = rows * xs.shape[1] * 4
    repo = make_repository(tmp_path / "repo", {"mlp": pkg}, {"mlp": {"device_index": 0}})
    key = f"/aotc_cuda_test_in_{os.getpid()}"
    handle = shm.create_shared_memory_region("x_in", key, nbytes, create_only=True)
    rng = np.random.default_rng(5)
    try:
        with Server("cpp", repo, "--allow-shared-memory", *flags) as s:
            status, body = s.json("POST", "/v2/systemsharedmemory/region/x_in/register",
                                  {"key": key, "offset": 0, "byte_size": nbytes})
            assert status == 200, body
            c = httpclient.InferenceServerClient(f"127.0.0.1:{s.port}", network_timeout=60)
            x = httpclient.InferInput("x", [rows, xs.shape[1]], "FP32")
            x.set_shared_memory("x_in", nbytes)
            out = c.get_model_metadata("mlp")["outputs"][0]["name"]
            for _ in range(4):
                pick = rng.integers(0, len(xs), rows)
                shm.set_shared_memory_region(handle, [np.ascontiguousarray(xs[pick], dtype=np.float32)])
                got = c.infer("mlp", [x]).as_numpy(out)
                assert np.allclose(got, ys[pick], atol=1e-3, rtol=1e-3), np.abs(got - ys[pick]).max()
            c.close()
            assert "stays pageable" not in s.log(), s.log()[-2000:]
    finally:
        shm.destroy_shared_memory_region(handle)


def test_warm_up_captures_every_bucket_on_every_runner_before_ready(tmp_path, package):
    """The default warm-up: the stored sample at each CUDA-graph bucket on each runner, twice (the capture,
    then a replay), before the version is READY; with model_warmup: [] none. The answers stay right."""
    import re

    pkg = package("mlp")
    (xs,), (ys,) = read_samples(pkg)[0]
    repo = make_repository(tmp_path / "repo", {"mlp": pkg, "cold": pkg},
                           {"mlp": {"num_runners": 2, "device_index": 0},
                            "cold": {"num_runners": 2, "device_index": 0, "model_warmup": []}})
    with Server("cpp", repo) as s:
        _, cfg = s.json("GET", "/v2/models/mlp/config")
        n_buckets = len(cfg["optimization"]["cuda"]["graph_batch_sizes"])
        calls = {m: int(re.search(rf"loaded model '{m}' version 1 .* \((\d+) warm-up calls\)", s.log()).group(1))
                 for m in ("mlp", "cold")}
        assert n_buckets > 1 and calls == {"mlp": 2 * n_buckets * 2, "cold": 0}, (calls, s.log()[-2000:])
        assert send_rows(s, xs, ys, {"atol": 1e-3, "rtol": 1e-3}, 5)
