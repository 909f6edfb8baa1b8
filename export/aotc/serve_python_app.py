"""The routes of `aotc serve --python` (FastAPI): the Open Inference Protocol over a dict of loaded models.

serve_python.py loads the models and starts uvicorn; this file maps HTTP to them and nothing else. Every
error leaves as `{"error": "<one line>"}` with the protocol's status (400, 404, 405, 413, 501, 503, 500).
Concurrency: handlers are coroutines on one event loop; model calls go to the thread pool (Model.run
serializes calls per model). The model table is replaced whole on load/unload, never mutated in place.
"""

from __future__ import annotations

import json
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from aotc import wire
from aotc_client.errors import RequestError

from aotc.shm_regions import SharedMemoryRegions

_CONFIG_TYPES = {"BOOL": "TYPE_BOOL", "FP16": "TYPE_FP16", "BF16": "TYPE_BF16", "FP32": "TYPE_FP32",
                 "FP64": "TYPE_FP64", "BYTES": "TYPE_STRING"}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def make_app(models: dict, failed: dict, body_limit: int, reload=None, api_key: str | None = None,
             allow_shared_memory: bool = False) -> FastAPI:
    app = FastAPI(title="aotc serve --python", docs_url=None, redoc_url=None, openapi_url=None)
    state = {"models": models, "failed": failed, "unloaded": set()}
    regions = SharedMemoryRegions(allow_shared_memory)

    if api_key:
        @app.middleware("http")
        async def _auth(request: Request, call_next):
            if request.url.path.startswith("/v2/health/") or \
                    request.headers.get("authorization") == f"Bearer {api_key}":
                return await call_next(request)
            return _error(401, "missing or wrong API key; send the header 'Authorization: Bearer KEY'")

    @app.exception_handler(RequestError)
    async def _request_error(_, e: RequestError):
        return _error(e.status, str(e))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        if e.status_code == 404:
            return _error(404, f"no endpoint {request.method} {request.url.path}; see the Open Inference Protocol")
        if e.status_code == 405:
            return _error(405, f"{request.method} is not allowed on {request.url.path}")
        return _error(e.status_code, str(e.detail))

    @app.exception_handler(Exception)
    async def _bug(_, e: Exception):
        return _error(500, f"internal error: {type(e).__name__}: {e}")

    def find(name: str, version: str | None = None):
        versions = state["models"].get(name)
        if versions is None or name in state["unloaded"]:
            raise RequestError(f"unknown model '{name}'; serving {sorted(set(state['models']) - state['unloaded'])}",
                               404)
        if version in (None, ""):
            return versions[max(versions, key=int)]
        if version not in versions:
            raise RequestError(f"model '{name}' has no version '{version}'; it has {sorted(versions, key=int)}", 404)
        return versions[version]

    def tensor_meta(specs):
        return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs]

    @app.get("/v2/health/live")
    async def live():
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready():
        return {"ready": True}

    @app.get("/v2")
    async def server_metadata():
        return {"name": "aotc-python", "version": "0.1.0",
                "extensions": ["binary_tensor_data", "statistics", "model_repository", "model_configuration"] +
                (["system_shared_memory"] if allow_shared_memory else [])}

    # Triton's system shared memory extension (aotc/shm_regions.py); 403 unless --allow-shared-memory
    @app.get("/v2/systemsharedmemory/status")
    @app.get("/v2/systemsharedmemory/region/{region}/status")
    async def shm_status(region: str = ""):
        return JSONResponse(regions.status(region))

    @app.post("/v2/systemsharedmemory/region/{region}/register")
    async def shm_register(region: str, request: Request):
        try:
            body = json.loads(await _read_body(request, body_limit) or b"null")
        except ValueError as e:
            raise RequestError(f"the shared memory registration is not valid JSON: {e}") from None
        regions.register(region, body)
        return {}

    @app.post("/v2/systemsharedmemory/unregister")
    @app.post("/v2/systemsharedmemory/region/{region}/unregister")
    async def shm_unregister(region: str = ""):
        regions.unregister(region)
        return {}

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None):
        m = find(name, version)
        return {"name": m.name, "versions": sorted(state["models"][name], key=int), "platform": m.platform,
                "inputs": tensor_meta(m.inputs), "outputs": tensor_meta(m.outputs)}

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None):
        m = find(name, version)
        return {"name": m.name, "ready": True}

    @app.get("/v2/models/{name}/config")
    @app.get("/v2/models/{name}/versions/{version}/config")
    async def model_config(name: str, version: str | None = None):
        m = find(name, version)
        conf = lambda specs: [{"name": s.name, "data_type": _CONFIG_TYPES.get(s.datatype, "TYPE_" + s.datatype),  # noqa: E731
                               "dims": list(s.shape)} for s in specs]
        return {"name": m.name, "platform": m.platform, "backend": "pytorch", "max_batch_size": 0,
                "input": conf(m.inputs), "output": conf(m.outputs)}

    @app.get("/v2/models/stats")
    @app.get("/v2/models/{name}/stats")
    @app.get("/v2/models/{name}/versions/{version}/stats")
    async def stats(name: str | None = None, version: str | None = None):
        chosen = [find(name, version)] if name else [m for vs in state["models"].values() for m in vs.values()]
        return {"model_stats": [{
            "name": m.name, "version": m.version, "last_inference": m.last_inference,
            "inference_count": m.inference_count, "execution_count": m.execution_count,
            "inference_stats": {k: {"count": c, "ns": ns} for k, (c, ns) in m.stats.items()},
            "batch_stats": []} for m in chosen]}

    @app.post("/v2/repository/index")
    async def repository_index():
        index = [{"name": n, "version": v, "state": "UNAVAILABLE" if n in state["unloaded"] else "READY",
                  "reason": "unloaded" if n in state["unloaded"] else ""}
                 for n, vs in sorted(state["models"].items()) for v in sorted(vs, key=int)]
        index += [{"name": k.split("/")[0], "version": k.split("/")[1], "state": "UNAVAILABLE", "reason": r}
                  for k, r in sorted(state["failed"].items())]
        return index

    @app.post("/v2/repository/models/{name}/load")
    async def load(name: str):
        if reload is not None:
            models, failed = await run_in_threadpool(reload)
            state["models"], state["failed"] = models, failed
        state["unloaded"] = state["unloaded"] - {name}
        find(name)
        return {}

    @app.post("/v2/repository/models/{name}/unload")
    async def unload(name: str):
        find(name)
        state["unloaded"] = state["unloaded"] | {name}
        return {}

    @app.get("/metrics")
    async def metrics():
        lines = ["# TYPE nv_inference_request_success counter", "# TYPE nv_inference_request_failure counter"]
        for vs in state["models"].values():
            for m in vs.values():
                label = f'{{model="{m.name}",version="{m.version}"}}'
                lines.append(f"nv_inference_request_success{label} {m.stats['success'][0]}")
                lines.append(f"nv_inference_request_failure{label} {m.stats['fail'][0]}")
        return PlainTextResponse("\n".join(lines) + "\n")

    @app.post("/v2/models/{name}/infer")
    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer(name: str, request: Request, version: str | None = None):
        m = find(name, version)
        t0 = time.perf_counter_ns()
        try:
            body = await _read_body(request, body_limit)
            body = wire.decompress(body, request.headers.get("content-encoding"), body_limit)
            req = wire.decode_request(body, _header_length(request), m.inputs, m.outputs, regions)
            t1 = time.perf_counter_ns()
            try:
                results = await run_in_threadpool(m.run, req.inputs)
            except Exception as e:
                raise RequestError(f"model '{name}' failed on these inputs: {type(e).__name__}: "
                                   f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}", 500) from None
            t2 = time.perf_counter_ns()
            out, header_length = wire.encode_response(m.name, m.version, req, results, m.outputs, regions)
        except RequestError:
            m._add("fail", time.perf_counter_ns() - t0)
            raise
        headers = {}
        if header_length is not None:
            headers["Inference-Header-Content-Length"] = str(header_length)
        out, encoding = wire.compress(out, request.headers.get("accept-encoding"))
        if encoding:
            headers["Content-Encoding"] = encoding
        m._add("compute_input", t1 - t0)
        m._add("compute_output", time.perf_counter_ns() - t2)
        m._add("success", time.perf_counter_ns() - t0)
        first = next(iter(req.inputs.values()))
        m.inference_count += first.shape[0] if first.ndim else 1  # batch size, as Triton counts
        m.execution_count += 1
        m.last_inference = int(time.time() * 1000)
        media = "application/octet-stream" if header_length is not None else "application/json"
        return Response(out, media_type=media, headers=headers)

    return app


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise RequestError(f"Content-Length {declared!r} is not a number")
        if int(declared) > limit:
            raise RequestError(f"request body of {int(declared)} bytes exceeds the {limit}-byte limit", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(f"request body exceeds the {limit}-byte limit", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def _header_length(request: Request) -> int | None:
    value = request.headers.get("inference-header-content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise RequestError(f"Inference-Header-Content-Length {value!r} is not a number") from None

