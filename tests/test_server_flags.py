"""aotc-server (C++) device and thread flags, black box: --intra-op-threads, --device-index, --no-cuda-graphs,
--busy-poll-us and config.json's device_index, on CPU packages (the CUDA paths run on the GPU machine, bench/gpu.sh).

A CPU package must serve the same answers whatever these flags say; bad values are refused with one line.
Each test starts its own server (bench/launch.py).
"""

from __future__ import annotations

import re
import subprocess
import sys

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
                "--busy-poll-us", "300", "--no-strict-readiness") as s:  # "bad" never gets ready
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


def test_aotc_serve_passes_every_flag_to_aotc_server(tmp_path):
    from aotc.serve import server_argv

    argv = server_argv([str(tmp_path), "--intra-op-threads", "2", "--device-index", "1", "--no-cuda-graphs",
                        "--allow-shared-memory", "--busy-poll-us", "500", "--http-threads=8"])
    assert argv[1:] == ["--model-repository", str(tmp_path), "--intra-op-threads", "2", "--device-index", "1",
                        "--no-cuda-graphs", "--allow-shared-memory", "--busy-poll-us", "500", "--http-threads=8"]
    assert server_argv([str(tmp_path)])[1:] == ["--model-repository", str(tmp_path)]
    assert server_argv(["--model-repository", str(tmp_path)])[1:] == ["--model-repository", str(tmp_path)]


def test_aotc_serve_help_is_aotc_server_help():
    r = subprocess.run([sys.executable, "-m", "aotc.cli", "serve", "--help"], capture_output=True, text=True,
                       timeout=60)
    own = subprocess.run([str(server_binary()), "--help"], capture_output=True, text=True, timeout=30).stdout
    flags = set(re.findall(r"^\s+(--[a-z-]+)", own, re.M))
    assert r.returncode == 0 and len(flags) >= 14, (r.stderr, own)
    assert flags <= set(re.findall(r"--[a-z-]+", r.stdout)) and own in r.stdout, r.stdout


@pytest.mark.parametrize("argv, message", [
    (["serve"], "aotc: error: aotc serve needs a model repository first"),
    (["serve", "--http-port", "0"], "aotc: error: aotc serve needs a model repository first"),
    (["serve", "no/such/dir"], "aotc: error: model repository 'no/such/dir' is not a directory"),
    (["serve", ".", "--bogus"], "aotc-server: error: unknown option '--bogus'; see --help"),
    (["serve", ".", "--http-port", "x"], "aotc-server: error: --http-port expects an integer in 0..65535, got 'x'"),
])
def test_aotc_serve_refuses_with_one_line(argv, message):
    r = subprocess.run([sys.executable, "-m", "aotc.cli", *argv], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith(message), r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
