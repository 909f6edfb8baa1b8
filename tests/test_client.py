"""aotc_client against both servers ("cpp": aotc-server, "python": `aotc serve --python`), started as black
boxes on packages from our exporter: sync and async inference with dicts of numpy arrays (binary and JSON),
specs and random inputs from metadata, errors as aotc_client.errors types; and `aotc bench`, bounded and
error-free against each server and side by side. One server per kind per module."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import numpy as np
import pytest

from aotc_client import AsyncClient, Client
from aotc_client.errors import AotcError, ServerError
from conftest import read_samples
from launch import REPO, Server


@pytest.fixture(scope="module")
def mlp_sample(pkg_mlp):
    inputs, outputs = read_samples(pkg_mlp)[0]
    return inputs[0][:5].astype(np.float32), outputs[0][:5]


@pytest.mark.parametrize("binary", [True, False])
def test_infer_with_numpy_dicts(server, mlp_sample, binary):
    x, ref = mlp_sample
    with Client(server.url, binary=binary) as client:
        got = client.infer("mlp", {"x": x})
        np.testing.assert_allclose(got["output0"], ref, atol=1e-4, rtol=1e-4)
        a = np.arange(-16, 16, dtype=np.int32).reshape(2, 16)
        b = np.full((2, 16), 7, np.int32)
        out = client.infer("simple", {"INPUT0": a, "INPUT1": b}, outputs=["OUTPUT1"])
        assert list(out) == ["OUTPUT1"] and np.array_equal(out["OUTPUT1"], a - b)


def test_specs_and_random_inputs_from_metadata(server):
    with Client(server.url) as client:
        specs = client.input_specs("simple")
        assert [(s.name, s.datatype, s.shape) for s in specs] == [("INPUT0", "INT32", (-1, 16)),
                                                                  ("INPUT1", "INT32", (-1, 16))]
        inputs = client.random_inputs("simple", sizes=7, seed=3)
        assert inputs["INPUT0"].shape == (7, 16) and inputs["INPUT0"].dtype == np.int32
        out = client.infer("simple", inputs)
        assert np.array_equal(out["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"])


def test_async_client_many_concurrent_requests(server, mlp_sample):
    x, ref = mlp_sample

    async def go():
        async with AsyncClient(server.url) as client:
            rows = await asyncio.gather(*(client.infer("mlp", {"x": x[i:i + 1]}) for i in range(5) for _ in range(4)))
            return [r["output0"] for r in rows]
    outs = asyncio.run(go())
    for k, out in enumerate(outs):
        np.testing.assert_allclose(out, ref[k // 4: k // 4 + 1], atol=1e-4, rtol=1e-4)


def test_errors_name_what_was_wrong(server):
    with Client(server.url) as client:
        with pytest.raises(AotcError, match=r"input 'x' has dtype float64, the model expects FP32; cast with"):
            client.infer("mlp", {"x": np.zeros((1, 512))})
        with pytest.raises(AotcError, match="unknown input 'y'"):
            client.infer("mlp", {"y": np.zeros((1, 512), np.float32)})
        with pytest.raises(ServerError) as e:  # unchecked: the server's 400 comes back as one line
            client.infer("mlp", {"x": np.zeros((1, 3), np.float32)}, check=False)
        assert e.value.status == 400 and "\n" not in str(e.value)
        with pytest.raises(ServerError) as e:
            client.metadata("nope")
        assert e.value.status == 404
    with pytest.raises(ServerError, match="cannot reach"):
        Client("http://127.0.0.1:9").metadata("mlp")


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aotc.cli", "bench", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=180)


def _rows(stdout: str) -> list[tuple[str, int, float, int]]:
    """(url, concurrency, req/s, errors) of each table row `aotc bench` printed."""
    rows = re.findall(r"^(http://\S+)\s+(\d+)\s+([\d.]+)(?:\s+\S+){4}\s+(\d+)$", stdout, re.M)
    return [(u, int(c), float(t), int(e)) for u, c, t, e in rows]


def test_bench_is_bounded_and_error_free(server, tmp_path):
    png = tmp_path / "lat.png"
    for encoding in ("--binary", "--json"):
        r = _bench("--url", server.url, "--model", "mlp", "--concurrency", "1,4", "--duration", "1",
                   encoding, "--plot", str(png))
        assert r.returncode == 0, r.stderr
        rows = _rows(r.stdout)
        assert [c for _, c, _, _ in rows] == [1, 4], r.stdout
        assert all(t > 0 and e == 0 for _, _, t, e in rows), r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_compare_runs_servers_side_by_side(model_repository):
    with Server("cpp", model_repository) as cpp, Server("python", model_repository) as py:
        r = _bench("--url", cpp.url, "--compare", py.url, "--model", "simple", "--concurrency", "2",
                   "--duration", "1")
    assert r.returncode == 0, r.stderr
    rows = _rows(r.stdout)
    assert {u for u, _, _, _ in rows} == {cpp.url, py.url} and all(e == 0 for *_, e in rows), r.stdout
    assert re.search(rf"{re.escape(py.url)}\s+c=2\s+throughput\s+[\d.]+x\s+p99\s+[\d.]+x", r.stdout), r.stdout


@pytest.mark.parametrize("args, message", [
    (["--url", "http://10.255.255.1:8000"], "not a loopback address"),
    (["--url", "http://127.0.0.1:9", "--concurrency", "0"], "out of range"),
    (["--url", "http://127.0.0.1:9", "--duration", "100000"], "out of range"),
    (["--url", "http://127.0.0.1:9", "--concurrency", "a,b"], "not a list of integers"),
])
def test_bench_refuses_bad_arguments(args, message):
    r = _bench(*args, "--model", "mlp")
    assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
