"""The measuring drivers of the benchmarks (and of tests/test_aotc_load.py): closed-loop HTTP load with
binary tensors (Open Inference Protocol) from `aotc-load`, the same over gRPC (`grpc_load`), the in-process
time of `aotc-run --bench`, and the server's own statistics (Triton's statistics extension) around them.
Servers come from bench/launch.py.

`http_load` replays one prebuilt request body on `concurrency` keep-alive connections, each waiting for its
answer before sending again, for `seconds` after a 1 s warm-up that is not counted, and returns aotc-load's
latency percentiles and throughput. aotc-load is a thread per connection that reads each answer with a few
big recv calls, so its own cost stays small next to the server's even for answers of megabytes. A non-2xx
answer counts as an error. Not a test; asserts nothing. Each call runs its own process: calls from several
threads do not share state, but they do share the machine.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from launch import find_binary


def aotc_run_stats(pkg: Path, npys: list, calls: int, warmup: int, flags: list[str] = (),
                   env: dict | None = None) -> dict[str, float]:
    """The numbers of `aotc-run PKG NPY... --bench calls`'s bench line ({"p50_us", "calls_per_s", ...}), with
    extra `flags` and environment. Raises RuntimeError with aotc-run's last words if it fails."""
    argv = [str(find_binary("aotc-run", "AOTC_RUN")), str(pkg), *map(str, npys), "--bench", str(calls),
            "--warmup", str(warmup), *flags]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                       env=None if env is None else {**os.environ, **env})
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("bench:")), "")
    stats = {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", line)}
    if r.returncode != 0 or "p50_us" not in stats:
        raise RuntimeError(f"aotc-run exit {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}")
    return stats


def aotc_run_p50_us(pkg: Path, x, tmp: Path, calls: int, warmup: int, flags: list[str] = ()) -> float:
    """Median us per call of `aotc-run PKG x.npy --bench calls` (x a numpy array), with extra `flags`
    (--no-cuda-graphs, --device-inputs). Raises RuntimeError with aotc-run's last words if it fails."""
    import numpy as np

    npy = tmp / f"in_{pkg.stem}_{x.shape[0]}.npy"
    np.save(npy, x)
    return aotc_run_stats(pkg, [npy], calls, warmup, flags)["p50_us"]


def infer_body(x, name: str | None, outputs: list[str] | None = None,
               shm_outputs: dict[str, tuple[str, int]] | None = None) -> tuple[bytes, dict]:
    """One binary-tensor request: a JSON header, then x's bytes (x a torch tensor or a numpy array, input
    `name`; or a dict {input name: array} for several inputs, `name` then unused). `outputs` names the outputs
    to return (each as binary data); None returns all of them. `shm_outputs` {output: (region, byte size)}
    asks for those outputs in registered shared memory regions instead."""
    import numpy as np

    named = x if isinstance(x, dict) else {name: x}
    arrays = {n: np.ascontiguousarray(v if isinstance(v, np.ndarray) else v.numpy()) for n, v in named.items()}
    dt = {"float32": "FP32", "int64": "INT64", "int32": "INT32", "float16": "FP16"}
    request = {"inputs": [{"name": n, "shape": list(arr.shape), "datatype": dt[str(arr.dtype)],
                           "parameters": {"binary_data_size": arr.nbytes}} for n, arr in arrays.items()],
               "parameters": {"binary_data_output": True}}
    if outputs is not None:
        request["outputs"] = [{"name": n, "parameters": {"binary_data": True}} for n in outputs]
    if shm_outputs:
        request["outputs"] = [{"name": n, "parameters": {"shared_memory_region": r, "shared_memory_byte_size": size}}
                              for n, (r, size) in shm_outputs.items()]
    header = json.dumps(request).encode()
    body = header + b"".join(arr.tobytes() for arr in arrays.values())
    return body, {"Inference-Header-Content-Length": str(len(header))}


def http_load(port, model, x, input_name, concurrency, seconds, *, outputs: list[str] | None = None,
              shm_outputs: dict[str, tuple[str, int]] | None = None, load_flags: list[str] = ()) -> dict:
    """Closed-loop load of `concurrency` connections for `seconds` after a 1 s warm-up (x, input_name: as
    infer_body) ->
    {"p50_ms", "p90_ms", "p99_ms", "mean_ms" (2xx answers), "req_per_s" (2xx answers only), "requests" (2xx
    answers), "errors" (total), "error_counts" (by kind: status = non-2xx, connect, read, write, timeout),
    "answer_bytes" (the body of a 2xx answer), "cpu_us" (aotc-load's CPU per request made, warm-up included),
    "responder_cpu_us" (its loopback responder's likewise; None without one)}.
    `outputs`: ask only for these outputs (None: all); `shm_outputs`: as infer_body (every connection writes
    the same regions, so only concurrency 1 leaves them meaningful); `load_flags`: more of aotc-load's flags
    (--busy-poll)."""
    body, headers = infer_body(x, input_name, outputs, shm_outputs)
    with tempfile.TemporaryDirectory(prefix="aotc-load-") as tmp:
        body_path = Path(tmp) / "body.bin"
        body_path.write_bytes(body)
        return _aotc_load(f"http://127.0.0.1:{port}/v2/models/{model}/infer", concurrency, seconds,
                          ["--body", str(body_path), "--header", "Content-Type: application/octet-stream",
                           *(a for k, v in headers.items() for a in ("--header", f"{k}: {v}")), *load_flags])


def infer_message(model: str, x, name: str | None, outputs: list[str] | None = None) -> bytes:
    """One serialized gRPC ModelInferRequest (tritonclient's protobuf, the wire contract) for `model`: the
    inputs as infer_body's (x an array, or {input name: array}), their bytes in raw_input_contents, as
    tritonclient sends them; `outputs` names the outputs to return (None: all)."""
    import numpy as np
    from tritonclient.grpc import service_pb2

    named = x if isinstance(x, dict) else {name: x}
    arrays = {n: np.ascontiguousarray(v if isinstance(v, np.ndarray) else v.numpy()) for n, v in named.items()}
    dt = {"float32": "FP32", "int64": "INT64", "int32": "INT32", "float16": "FP16"}
    req = service_pb2.ModelInferRequest(model_name=model)
    for n, arr in arrays.items():
        req.inputs.add(name=n, datatype=dt[str(arr.dtype)], shape=list(arr.shape))
        req.raw_input_contents.append(arr.tobytes())
    for n in outputs or ():
        req.outputs.add(name=n)
    return req.SerializeToString()


def grpc_load(port, model, x, input_name, concurrency, seconds, *, outputs: list[str] | None = None,
              metadata: dict[str, str] | None = None, load_flags: list[str] = ()) -> dict:
    """http_load over gRPC: `concurrency` channels of aotc-load, each a connection of its own making unary
    ModelInfer calls with infer_message's request (`metadata`: e.g. the API key), the answer taken as bytes.
    The same numbers as http_load; "status" errors count calls that ended with a gRPC status other than OK."""
    with tempfile.TemporaryDirectory(prefix="aotc-load-") as tmp:
        body_path = Path(tmp) / "request.pb"
        body_path.write_bytes(infer_message(model, x, input_name, outputs))
        return _aotc_load(f"grpc://127.0.0.1:{port}/inference.GRPCInferenceService/ModelInfer", concurrency,
                          seconds, ["--body", str(body_path),
                                    *(a for k, v in (metadata or {}).items() for a in ("--header", f"{k}: {v}")),
                                    *load_flags])


@contextlib.contextmanager
def shm_region(port: int, name: str, byte_size: int):
    """A fresh POSIX shared memory object of `byte_size` bytes, registered with the aotc-server on `port` as
    region `name` (system shared memory extension; the server needs --allow-shared-memory); yields the
    multiprocessing SharedMemory, and unregisters and unlinks it on exit."""
    from multiprocessing import shared_memory

    mem = shared_memory.SharedMemory(create=True, size=byte_size)

    def post(path: str, body: str):
        # a connection per call: the server closes a keep-alive connection idle for 5 s, and a region may be
        # held for longer than that
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            c.request("POST", path, body)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    try:
        status, body = post(f"/v2/systemsharedmemory/region/{name}/register",
                            json.dumps({"key": "/" + mem.name, "offset": 0, "byte_size": byte_size}))
        if status != 200:
            raise RuntimeError(f"registering shared memory region '{name}': {status} {body[:300]!r}")
        yield mem
    finally:
        try:
            post(f"/v2/systemsharedmemory/region/{name}/unregister", "")
        finally:
            mem.close()
            mem.unlink()


def bodies_load(port: int, model: str, files: list[Path], concurrency: int, seconds: float,
                content_type: str = "application/json") -> dict:
    """http_load's numbers for requests read from `files`, each connection sending them in turn (connection i
    starting at the i-th), so that requests of different shapes mix."""
    flags = [a for f in files for a in ("--body", str(f))] + ["--header", f"Content-Type: {content_type}"]
    return _aotc_load(f"http://127.0.0.1:{port}/v2/models/{model}/infer", concurrency, seconds, flags)


def loopback_load(answer_bytes: int, seconds: float, socket_buffer: int = 0, *, grpc: bool = False,
                  spin_us: int = 0, load_flags: list[str] = ()) -> dict:
    """http_load's numbers for aotc-load's own loopback responder (a process of its own) answering `answer_bytes`
    bytes to a GET on one connection: what an answer of that size costs on this host's loopback TCP with no
    server work at all. `socket_buffer` > 0 fixes SO_SNDBUF/SO_RCVBUF of both ends instead of the kernel's
    autotuning (HTTP only); `grpc`: a gRPC responder (one raw unary method on a completion queue) answering
    unary calls; `spin_us`: the responder spins that long before each answer, standing for a model call on the
    serving thread; `load_flags`: more of aotc-load's flags (--busy-poll)."""
    flags = ["--loopback-bytes", str(answer_bytes), "--loopback-spin-us", str(spin_us),
             *(["--loopback-grpc"] if grpc else []), *(["--socket-buffer", str(socket_buffer)] if socket_buffer else []),
             *load_flags]
    return _aotc_load(None, 1, seconds, flags)


def get_load(port, path: str, seconds: float) -> dict:
    """http_load's numbers for GET `path` on one connection (e.g. /v2/health/ready: what any request costs)."""
    return _aotc_load(f"http://127.0.0.1:{port}{path}", 1, seconds, [])


def _aotc_load(url: str | None, concurrency: int, seconds: float, flags: list[str]) -> dict:
    exe = str(find_binary("aotc-load", "AOTC_LOAD_BIN"))
    argv = [exe, *(["--url", url] if url else []), "--connections", str(concurrency), "--duration", f"{seconds:g}",
            "--warmup", "1", "--timeout", "30", *flags]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("AOTC_LOAD ")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {(r.stderr or r.stdout)[-400:]}")
    s = json.loads(lines[-1].split(" ", 1)[1])
    counts = {"status": sum(s["status"].values()), "connect": s["connect_errors"], "read": s["read_errors"],
              "write": s["write_errors"], "timeout": s["timeouts"]}
    return {"p50_ms": s["p50_us"] / 1e3, "p90_ms": s["p90_us"] / 1e3, "p99_ms": s["p99_us"] / 1e3,
            "mean_ms": s["mean_us"] / 1e3, "req_per_s": s["req_per_s"], "requests": s["requests"],
            "errors": s["errors"], "error_counts": counts, "answer_bytes": s["answer_bytes"],
            "cpu_us": s["cpu_us"], "responder_cpu_us": s["responder_cpu_us"]}


def model_stats(port: int, model: str) -> dict:
    """The model's entry of GET /v2/models/{model}/stats (Triton's statistics extension)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", f"/v2/models/{model}/stats")
    return json.loads(c.getresponse().read())["model_stats"][0]


def server_stats(port: int, model: str) -> dict:
    """The model's inference_stats (cumulative counts and nanoseconds per phase)."""
    return model_stats(port, model)["inference_stats"]


def stats_per_request(before: dict, after: dict) -> dict:
    """Mean microseconds per request of each phase between two /stats snapshots."""
    n = after["success"]["count"] - before["success"]["count"]
    return {k: (after[k]["ns"] - before[k]["ns"]) / max(n, 1) / 1e3
            for k in ("success", "queue", "compute_input", "compute_infer", "compute_output")} | {"requests": n}
