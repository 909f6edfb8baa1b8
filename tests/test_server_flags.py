"""aotc-server (C++) device and thread flags, black box: --intra-op-threads, --device-index, --no-cuda-graphs,
--busy-poll-us and config.json's device_index, on CPU packages (the CUDA paths run on the GPU machine, bench/gpu.sh).

A CPU package must serve the same answers whatever these flags say; bad values are refused with one line.
Each test starts its own server (bench/launch.py).
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from conftest import read_samples
from launch import Server, make_repository, server_binary
from test_server_batching import run_clients


def mlp_request(x):
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


def test_thread_and_device_flags_serve_the_same_answers(tmp_path, pkg_mlp, pkg_simple):
    (xs,), (ys,) = read_samples(pkg_mlp)[0]
    repo = make_repository(tmp_path / "repo", {"mlp": pkg_mlp, "simple": pkg_simple, "bad": pkg_simple},
                           {"mlp": {"num_runners": 2, "max_queue_delay_us": 2000, "device_index": 0},
                            "bad": {"device_index": -2}})
    with Server("cpp", repo, "--intra-op-threads", "1", "--device-index", "0", "--no-cuda-graphs",
                "--busy-poll-us", "300") as s:
        assert "intra-op threads: 1" in s.log()

        def client(i):  # batch-1 calls from several threads, on both runners, each answer checked
            for k in range(3):
                j = (i + k) % len(xs)
                status, r = s.json("POST", "/v2/models/mlp/infer", mlp_request(xs[j:j + 1].astype(np.float32)))
                assert status == 200, r
                got = np.array(r["outputs"][0]["data"], np.float32)
                assert np.allclose(got, ys[j], atol=1e-4, rtol=1e-4), np.abs(got - ys[j]).max()

        assert run_clients(8, client) == []
        status, r = s.json("POST", "/v2/models/mlp/infer", mlp_request(xs.astype(np.float32)))
        assert status == 200, r
        got = np.array(r["outputs"][0]["data"], np.float32).reshape(ys.shape)
        assert np.allclose(got, ys, atol=1e-4, rtol=1e-4)

        # A CPU package ignores device_index and has no CUDA section in its configuration.
        status, cfg = s.json("GET", "/v2/models/mlp/config")
        assert status == 200 and cfg["instance_group"][0] == {"count": 2, "kind": "KIND_CPU"}
        assert "optimization" not in cfg

        _, index = s.json("POST", "/v2/repository/index", {})
        bad = next(e for e in index if e["name"] == "bad")
        assert bad["state"] == "UNAVAILABLE" and "'device_index' must be an integer in -1..127" in bad["reason"], bad
        assert s.stop() == 0


@pytest.mark.parametrize("flags, message", [
    (["--intra-op-threads", "0"], "--intra-op-threads expects an integer in 1..1024, got '0'"),
    (["--intra-op-threads", "two"], "--intra-op-threads expects an integer in 1..1024, got 'two'"),
    (["--intra-op-threads"], "--intra-op-threads needs a value"),
    (["--device-index", "-2"], "--device-index expects an integer in -1..127, got '-2'"),
    (["--device-index", "128"], "--device-index expects an integer in -1..127, got '128'"),
    (["--no-cuda-graphs=0"], "--no-cuda-graphs takes no value"),
    (["--allow-shared-memory=yes"], "--allow-shared-memory takes no value"),
    (["--busy-poll-us", "-1"], "--busy-poll-us expects an integer in 0..1000000, got '-1'"),
    (["--busy-poll-us=fast"], "--busy-poll-us expects an integer in 0..1000000, got 'fast'"),
])
def test_bad_device_and_thread_flags_exit_with_one_line(flags, message):
    r = subprocess.run([str(server_binary()), "--model-repository", ".", *flags],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_aotc_serve_passes_the_device_and_thread_flags():
    from aotc.cli import build_parser
    from aotc.serve import server_argv

    argv = server_argv(build_parser().parse_args(
        ["serve", "repo", "--intra-op-threads", "2", "--device-index", "1", "--no-cuda-graphs",
         "--allow-shared-memory", "--busy-poll-us", "500"]))
    assert argv[argv.index("--intra-op-threads") + 1] == "2" and argv[argv.index("--device-index") + 1] == "1"
    assert "--no-cuda-graphs" in argv and "--allow-shared-memory" in argv
    assert argv[argv.index("--busy-poll-us") + 1] == "500"
    argv = server_argv(build_parser().parse_args(["serve", "repo"]))
    assert not {"--intra-op-threads", "--device-index", "--no-cuda-graphs", "--allow-shared-memory",
                "--busy-poll-us"} & set(argv)

