"""aotc-server's CUDA shared memory on a GPU machine, black box, with Triton's own client utilities
(tritonclient.utils.cuda_shared_memory: device memory exported as a CUDA IPC handle): inputs read from a
client's device memory and outputs written there, for a CUDA package (no host copy; requests batched from
several clients' regions) and a CPU package (copied through the host), over HTTP and gRPC; and the refusals:
a handle the driver rejects, a name a system region has, a range past a region's end, an output region too
small, a region unregistered. Every answer is checked against the package's eager sample.

Not for CPU CI (tests/test_server_shm.py covers the routes' behaviour without a GPU): every test is marked
`cuda` and the module skips itself when torch sees no CUDA device or cuda-python is missing. Packages as in
tests/test_server_cuda.py.
"""

from __future__ import annotations

import base64
import os

import numpy as np
import pytest

pytestmark = pytest.mark.cuda
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the GPU machine: bash bench/gpu.sh)", allow_module_level=True)
cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory", reason="needs cuda-python")

from conftest import read_samples  # noqa: E402
from launch import Server, make_repository  # noqa: E402
from test_cuda import package  # noqa: E402, F401 (the session fixture that provides CUDA packages)
from test_server_batching import run_clients  # noqa: E402
from test_server_cuda import server_bin  # noqa: E402, F401 (autouse: AOTC_SERVER_BIN, else aotc-server on PATH)

TOL = {"atol": 2e-2, "rtol": 2e-2}


def client_for(s: Server, transport: str):
    """(tritonclient module, client) of `transport` for server `s`; skips where it has no gRPC endpoint."""
    if transport == "grpc":
        import tritonclient.grpc as grpcclient

        if s.grpc_url is None:
            pytest.skip("this aotc-server has no gRPC endpoint (built with AOTC_GRPC=OFF)")
        return grpcclient, grpcclient.InferenceServerClient(s.grpc_url)
    import tritonclient.http as httpclient

    return httpclient, httpclient.InferenceServerClient(f"127.0.0.1:{s.port}", network_timeout=60)


class Regions:
    """CUDA regions on GPU 0 made by tritonclient and registered with the server; all destroyed on exit."""

    def __init__(self, client):
        self.client, self.handles = client, {}

    def add(self, name: str, nbytes: int):
        h = cudashm.create_shared_memory_region(name, nbytes, 0)
        self.handles[name] = h
        self.client.register_cuda_shared_memory(name, cudashm.get_raw_handle(h), 0, nbytes)
        return h

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.client.unregister_cuda_shared_memory()
        finally:
            for h in self.handles.values():
                cudashm.destroy_shared_memory_region(h)


@pytest.mark.parametrize("transport, flags", [("http", ()), ("http", ("--no-cuda-graphs",)), ("grpc", ())],
                         ids=["http-graphs", "http-no-graphs", "grpc-graphs"])
def test_bert_reads_and_writes_cuda_shared_memory(tmp_path, package, transport, flags):
    """Clients each with input_ids and last_hidden_state in CUDA regions of their own, pooler_output in the
    answer, sharing batches (the server joins their inputs on the device): each region gets the eager sample's
    rows for the rows its client wrote, freshly zeroed before every request."""
    pkg = package("bert_base")
    (ids,), (hidden, pooled) = read_samples(pkg)[0]
    # no inline runs: a request finding the model idle would run at once instead of waiting for the others
    repo = make_repository(tmp_path / "repo", {"bert_base": pkg},
                           {"bert_base": {"max_batch_size": 32, "max_queue_delay_us": 20000, "device_index": 0,
                                          "run_inline_when_idle": False}})
    n = 8
    with Server("cpp", repo, "--allow-shared-memory", *flags) as s:
        mod, admin = client_for(s, transport)
        assert "cuda_shared_memory" in (admin.get_server_metadata()["extensions"] if transport == "http"
                                        else admin.get_server_metadata().extensions)
        with Regions(admin) as regions:
            ins = [regions.add(f"ids{i}", ids.nbytes) for i in range(n)]
            outs = [regions.add(f"hid{i}", hidden.nbytes) for i in range(n)]
            status = admin.get_cuda_shared_memory_status()
            listed = status if transport == "http" else [
                {"name": r.name, "byte_size": r.byte_size} for r in status.regions.values()]
            assert sorted(r["name"] for r in listed) == sorted([f"ids{i}" for i in range(n)] +
                                                               [f"hid{i}" for i in range(n)])

            # tritonclient's cuda_shared_memory creates its stream for a device at the first copy, unguarded:
            # concurrent first copies made two, one destroyed while the other thread used it, and the client
            # process crashed. The first copy is made here, before the threads.
            cudashm.set_shared_memory_region(ins[0], [np.zeros(1, np.int8)])

            def client(i):
                _, c = client_for(s, transport)
                rng = np.random.default_rng(i)
                x = mod.InferInput("input_ids", list(ids.shape), "INT64")
                x.set_shared_memory(f"ids{i}", ids.nbytes)
                out = mod.InferRequestedOutput("last_hidden_state")
                out.set_shared_memory(f"hid{i}", hidden.nbytes)
                for _ in range(3):
                    pick = rng.permutation(len(ids))  # rows in another order each time: read from the region
                    cudashm.set_shared_memory_region(ins[i], [np.ascontiguousarray(ids[pick])])
                    cudashm.set_shared_memory_region(outs[i], [np.zeros_like(hidden)])
                    r = c.infer("bert_base", [x], outputs=[out, mod.InferRequestedOutput("pooler_output")])
                    got = cudashm.get_contents_as_numpy(outs[i], hidden.dtype, list(hidden.shape))
                    want = hidden[pick].astype(np.float32)
                    assert np.abs(want).max() > 0.1  # the sample is no all-zero answer
                    assert np.allclose(got.astype(np.float32), want, **TOL), \
                        f"client {i}: max abs diff {np.abs(got.astype(np.float32) - want).max()}"
                    assert np.allclose(r.as_numpy("pooler_output").astype(np.float32),
                                       pooled[pick].astype(np.float32), **TOL)
                c.close()

            assert run_clients(n, client) == []
        _, st = s.json("GET", "/v2/models/bert_base/stats")
        batches = {b["batch_size"]: b["compute_infer"]["count"] for b in st["model_stats"][0]["batch_stats"]}
        assert max(batches) > ids.shape[0], f"no batch larger than one request was formed: {batches}"


def test_a_cpu_package_goes_through_the_host(tmp_path, pkg_mlp):
    """A CPU package's input in a CUDA region is copied to the host for the call, and its output copied into
    the client's CUDA region after it."""
    (xs,), (ys,) = read_samples(pkg_mlp)[0]
    x_np = np.ascontiguousarray(xs.astype(np.float32))
    repo = make_repository(tmp_path / "repo", {"mlp": pkg_mlp})
    with Server("cpp", repo, "--allow-shared-memory") as s:
        mod, c = client_for(s, "http")
        out_name = c.get_model_metadata("mlp")["outputs"][0]["name"]
        with Regions(c) as regions:
            h_in = regions.add("x", x_np.nbytes)
            h_out = regions.add("y", ys.nbytes)
            cudashm.set_shared_memory_region(h_in, [x_np])
            cudashm.set_shared_memory_region(h_out, [np.zeros_like(ys)])
            x = mod.InferInput("x", list(x_np.shape), "FP32")
            x.set_shared_memory("x", x_np.nbytes)
            out = mod.InferRequestedOutput(out_name)
            out.set_shared_memory("y", ys.nbytes)
            r = c.infer("mlp", [x], outputs=[out])
            assert "data" not in r.get_output(out_name)  # the answer names the output only, as Triton's does
            got = cudashm.get_contents_as_numpy(h_out, ys.dtype, list(ys.shape))
            assert np.abs(ys).max() > 0
            assert np.allclose(got, ys, atol=1e-4, rtol=1e-4), np.abs(got - ys).max()
        c.close()


def test_refusals_name_the_fault_and_the_server_keeps_serving(tmp_path, package):
    """Each bad use of a CUDA region gets a 400 saying what was wrong; the good request after each works."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    pkg = package("mlp")
    (xs,), (ys,) = read_samples(pkg)[0]
    x_np = np.ascontiguousarray(xs[:4].astype(np.float32))
    y_bytes = ys[:4].nbytes
    repo = make_repository(tmp_path / "repo", {"mlp": pkg}, {"mlp": {"device_index": 0}})
    with Server("cpp", repo, "--allow-shared-memory") as s:
        c = httpclient.InferenceServerClient(f"127.0.0.1:{s.port}", network_timeout=60)
        out_name = c.get_model_metadata("mlp")["outputs"][0]["name"]

        def infer(x_region, x_bytes, y_region, y_size):
            x = httpclient.InferInput("x", list(x_np.shape), "FP32")
            x.set_shared_memory(x_region, x_bytes)
            out = httpclient.InferRequestedOutput(out_name)
            out.set_shared_memory(y_region, y_size)
            return c.infer("mlp", [x], outputs=[out])

        def refused(fn, *words):
            with pytest.raises(InferenceServerException) as e:
                fn()
            for w in words:
                assert w in str(e.value), str(e.value)

        with Regions(c) as regions:
            h_in, h_out = regions.add("x", x_np.nbytes), regions.add("y", y_bytes)
            small = regions.add("small", 16)

            def good():
                cudashm.set_shared_memory_region(h_in, [x_np])
                cudashm.set_shared_memory_region(h_out, [np.zeros_like(ys[:4])])
                infer("x", x_np.nbytes, "y", y_bytes)
                got = cudashm.get_contents_as_numpy(h_out, ys.dtype, list(ys[:4].shape))
                assert np.allclose(got, ys[:4], atol=1e-3, rtol=1e-3), np.abs(got - ys[:4]).max()

            good()
            # 64 bytes that are no handle this driver made
            refused(lambda: c.register_cuda_shared_memory("bogus", base64.b64encode(b"\x01" * 64), 0, 64),
                    "failed to register CUDA shared memory region 'bogus'", "cudaIpcOpenMemHandle")
            refused(lambda: c.register_cuda_shared_memory("x", cudashm.get_raw_handle(h_in), 0, x_np.nbytes),
                    "already registered")
            key = f"/aotc_cuda_shm_test_{os.getpid()}"
            import tritonclient.utils.shared_memory as sysshm

            sys_h = sysshm.create_shared_memory_region("sys", key, 64, create_only=True)
            try:
                c.register_system_shared_memory("dup", key, 64)
                refused(lambda: c.register_cuda_shared_memory("dup", cudashm.get_raw_handle(small), 0, 16),
                        "share one namespace")
                refused(lambda: c.register_system_shared_memory("x", key, 64), "share one namespace")
                c.unregister_system_shared_memory("dup")
            finally:
                sysshm.destroy_shared_memory_region(sys_h)
            good()
            # the input's bytes run past the region ("small" holds 16 of the 8 KiB)
            refused(lambda: infer("small", x_np.nbytes, "y", y_bytes), "exceeds CUDA region 'small' (16 bytes)")
            # the output does not fit its region
            refused(lambda: infer("x", x_np.nbytes, "small", 16), "shared_memory_byte_size gives it 16",
                    "region 'small'")
            good()
            c.unregister_cuda_shared_memory("x")
            refused(lambda: infer("x", x_np.nbytes, "y", y_bytes), "no shared memory region 'x' is registered")
            regions.handles.pop("x")
            cudashm.destroy_shared_memory_region(h_in)
            status = c.get_cuda_shared_memory_status()
            assert sorted(r["name"] for r in status) == ["small", "y"]
            assert {r["name"]: int(r["byte_size"]) for r in status}["small"] == 16
        assert s.proc.poll() is None
        c.close()
