"""The Open Inference Protocol's inference bodies, server side: parse and validate a request (JSON and
Triton's binary tensor extension) into numpy arrays, and encode a response.

Used by aotc's FastAPI server; numpy only, no HTTP framework. Every check happens here, against the
model's specs, before a byte is allocated from a client's claim; each failure is a RequestError whose
message says what was wrong and what was expected. Pure functions: safe from any thread.
"""

import gzip
import json
import math
import zlib
from dataclasses import dataclass, field

import numpy as np

from aotc_client import dtypes
from aotc_client.errors import RequestError
from aotc_client.specs import TensorSpec

MAX_DIMS = 16


@dataclass
class InferRequest:
    inputs: dict[str, np.ndarray]
    outputs: list[tuple[str, bool]]          # (name, binary) in response order
    id: str | None = None
    parameters: dict = field(default_factory=dict)
    # outputs to write into shared memory: name -> (region, offset, byte size) (Triton's extension)
    shm_outputs: dict[str, tuple[str, int, int]] = field(default_factory=dict)


def _shm_param(params: dict, where: str) -> tuple[str, int, int] | None:
    """Triton's shared-memory parameters: (region, offset, byte size), or None when absent."""
    region, size = params.get("shared_memory_region"), params.get("shared_memory_byte_size")
    offset = params.get("shared_memory_offset")
    if region is None and size is None and offset is None:
        return None
    if region is None or size is None:
        raise RequestError(f"{where}: shared memory needs both parameters 'shared_memory_region' and "
                           f"'shared_memory_byte_size' (and optionally 'shared_memory_offset')")
    if not isinstance(region, str) or not region:
        raise RequestError(f"{where}: parameter 'shared_memory_region' must be a region name")
    offset = 0 if offset is None else offset
    for v in (size, offset):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise RequestError(f"{where}: shared_memory_byte_size and shared_memory_offset must not be negative "
                               f"integers")
    return region, offset, size


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo Content-Encoding; the result may not exceed `limit` bytes (413)."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise RequestError(f"Content-Encoding {encoding!r} is not supported; use gzip, deflate or none", 501)
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    try:
        d = zlib.decompressobj(wbits)
        out = d.decompress(body, limit + 1)
        if len(out) > limit:
            raise RequestError(f"request body inflates past the {limit}-byte limit", 413)
        if not d.eof:
            raise RequestError(f"{encoding} request body is truncated")
        return out
    except zlib.error as e:
        raise RequestError(f"request body is not valid {encoding}: {e}") from None


def compress(body: bytes, accept_encoding: str | None) -> tuple[bytes, str | None]:
    """Compress a response as the client accepts (gzip preferred); returns (body, Content-Encoding)."""
    accepted = {p.split(";")[0].strip().lower() for p in (accept_encoding or "").split(",")}
    if "gzip" in accepted:
        return gzip.compress(body, 1), "gzip"
    if "deflate" in accepted:
        return zlib.compress(body, 1), "deflate"
    return body, None


def _shape(name: str, raw) -> tuple[int, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_DIMS:
        raise RequestError(f"input '{name}' shape must be a list of at most {MAX_DIMS} dims; got {raw!r}"[:300])
    for d in raw:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0 or d > 2**40:
            raise RequestError(f"input '{name}' shape {raw} has dim {d!r}; expected non-negative integers")
    return tuple(raw)


def _check_dims(spec: TensorSpec, shape: tuple[int, ...]) -> None:
    if len(shape) != len(spec.shape):
        raise RequestError(f"input '{spec.name}' has rank {len(shape)} (shape {list(shape)}), "
                           f"the model expects rank {len(spec.shape)} (shape {list(spec.shape)})")
    for i, n in enumerate(shape):
        lo, hi = spec.dim_range(i)
        if not lo <= n <= hi:
            want = f"{spec.shape[i]}" if spec.shape[i] != -1 else f"in [{lo}, {hi}]"
            raise RequestError(f"input '{spec.name}' dim {i} is {n}, the model expects {want} "
                               f"(shape {list(spec.shape)})")


def _from_json(spec: TensorSpec, shape, data) -> np.ndarray:
    count = math.prod(shape)
    try:
        array = np.asarray(data)
    except (ValueError, OverflowError, TypeError) as e:
        raise RequestError(f"input '{spec.name}' data is not a regular array of numbers: {e}") from None
    if array.size != count:
        raise RequestError(f"input '{spec.name}' has {array.size} values in 'data', its shape {list(shape)} "
                           f"needs {count}")
    kind = array.dtype.kind
    dt = spec.datatype
    if dt in ("FP16", "BF16"):
        raise RequestError(f"input '{spec.name}' is {dt}, which travels only as binary data; "
                           f"send it with parameters.binary_data_size")
    ok = kind == "b" if dt == "BOOL" else kind in "iu" if not dtypes.is_float(dt) else kind in "iuf"
    if count and not ok:
        raise RequestError(f"input '{spec.name}' data holds {array.dtype} values, datatype {dt} expects "
                           f"{'booleans' if dt == 'BOOL' else 'integers' if not dtypes.is_float(dt) else 'numbers'}")
    npdt = dtypes.numpy_dtype(dt)
    if count and dt == "FP32" and kind == "f":
        finite = array[np.isfinite(array)]
        limit = float(np.finfo(npdt).max)
        if finite.size and np.abs(finite).max() > limit:
            raise RequestError(f"input '{spec.name}' has values outside the {dt} range [-{limit:.4g}, {limit:.4g}]")
    if count and kind in "iu":
        info = np.iinfo(npdt) if npdt.kind in "iu" else None
        if info is not None and (array.min() < info.min or array.max() > info.max):
            raise RequestError(f"input '{spec.name}' has values outside the {dt} range [{info.min}, {info.max}]")
    return array.astype(npdt).reshape(shape)


def _header(body: bytes, header_length: int | None) -> tuple[dict, int]:
    if header_length is None:
        header_length = len(body)
    if header_length < 0 or header_length > len(body):
        raise RequestError(f"Inference-Header-Content-Length is {header_length}, the body has {len(body)} bytes")
    try:
        header = json.loads(body[:header_length])
    except (ValueError, RecursionError) as e:
        raise RequestError(f"request header is not valid JSON: {str(e)[:120]}") from None
    if not isinstance(header, dict):
        raise RequestError("request body must be a JSON object with an 'inputs' list")
    return header, header_length


def _raw_single_input(body: bytes, specs: list[TensorSpec]) -> dict:
    if len(specs) != 1:
        raise RequestError(f"Inference-Header-Content-Length: 0 sends one raw input, the model has {len(specs)}")
    spec = specs[0]
    size = dtypes.element_size(spec.datatype) if spec.datatype != "BYTES" else 0
    dynamic = [i for i, d in enumerate(spec.shape) if d == -1]
    fixed = math.prod(d for d in spec.shape if d != -1)
    if not size or len(dynamic) > 1 or len(body) % (size * max(fixed, 1)):
        raise RequestError(f"a raw body of {len(body)} bytes does not determine the shape of input "
                           f"'{spec.name}' {list(spec.shape)} {spec.datatype}; send a JSON header")
    shape = [d if d != -1 else len(body) // (size * max(fixed, 1)) for d in spec.shape]
    return {"inputs": [{"name": spec.name, "shape": shape, "datatype": spec.datatype,
                        "parameters": {"binary_data_size": len(body)}}],
            "parameters": {"binary_data_output": True}}  # raw in, raw out


def decode_request(body: bytes, header_length: int | None, inputs: list[TensorSpec],
                   outputs: list[TensorSpec], regions=None) -> InferRequest:
    """Parse and validate one inference request against the model's input and output specs. `regions`
    (an object with read(ref, what) -> bytes, e.g. aotc's SharedMemoryRegions) serves inputs that name a
    shared memory region; without it such inputs are refused."""
    if header_length == 0:
        header, header_length = _raw_single_input(body, inputs), 0
    else:
        header, header_length = _header(body, header_length)
    req_id = header.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise RequestError(f"'id' must be a string; got {type(req_id).__name__}")
    params = header.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError("'parameters' must be a JSON object")
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise RequestError("request needs a non-empty 'inputs' list")
    by_name = {s.name: s for s in inputs}
    arrays: dict[str, np.ndarray] = {}
    offset = header_length
    for t in raw_inputs:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise RequestError("each input must be an object with 'name', 'shape', 'datatype'")
        name = t["name"]
        spec = by_name.get(name)
        if spec is None:
            raise RequestError(f"unknown input '{name}'; the model's inputs are {sorted(by_name)}")
        if name in arrays:
            raise RequestError(f"input '{name}' appears twice")
        if t.get("datatype") != spec.datatype:
            raise RequestError(f"input '{name}' has datatype {t.get('datatype')!r}, the model expects {spec.datatype}")
        shape = _shape(name, t.get("shape"))
        _check_dims(spec, shape)
        tparams = t.get("parameters") or {}
        if not isinstance(tparams, dict):
            raise RequestError(f"input '{name}' parameters must be a JSON object")
        nbytes = math.prod(shape) * dtypes.element_size(spec.datatype)
        shm = _shm_param(tparams, f"input '{name}'")
        if shm:
            if "data" in t or "binary_data_size" in tparams:
                also = "'data'" if "data" in t else "binary_data_size"
                raise RequestError(f"input '{name}': has shared memory and also {also}; send one")
            if shm[2] != nbytes:
                raise RequestError(f"input '{name}': shape {list(shape)} of {spec.datatype} needs {nbytes} bytes, "
                                   f"shared_memory_byte_size is {shm[2]}")
            if regions is None:
                raise RequestError("this server has no shared memory regions", 403)
            arrays[name] = np.frombuffer(regions.read(shm, f"input '{name}'"),
                                         dtypes.numpy_dtype(spec.datatype), math.prod(shape)).reshape(shape)
            continue
        if "binary_data_size" in tparams:
            size = tparams["binary_data_size"]
            if isinstance(size, bool) or not isinstance(size, int) or size != nbytes:
                raise RequestError(f"input '{name}' binary_data_size is {size!r}, shape {list(shape)} "
                                   f"{spec.datatype} needs {nbytes} bytes")
            if offset + size > len(body):
                raise RequestError(f"input '{name}' needs {size} bytes at offset {offset}, "
                                   f"the body has {len(body)}")
            arrays[name] = np.frombuffer(body, dtypes.numpy_dtype(spec.datatype), math.prod(shape),
                                         offset).reshape(shape)
            offset += size
        elif "data" in t:
            arrays[name] = _from_json(spec, shape, t["data"])
        else:
            raise RequestError(f"input '{name}' has neither 'data' nor parameters.binary_data_size")
    if offset != len(body):
        raise RequestError(f"body has {len(body) - offset} bytes after the JSON header and binary inputs "
                           f"that no input claims")
    missing = [s.name for s in inputs if s.name not in arrays]
    if missing:
        raise RequestError(f"missing inputs {missing}; the model's inputs are {[s.name for s in inputs]}")
    requested, shm_outputs = _requested_outputs(header, params, outputs)
    return InferRequest(arrays, requested, req_id, params, shm_outputs)


def _requested_outputs(header: dict, params: dict, outputs: list[TensorSpec]):
    """-> ([(name, binary)], {name: shared memory ref}) in response order."""
    all_binary = params.get("binary_data_output") is True
    requested = header.get("outputs")
    if requested is None:
        return [(s.name, all_binary) for s in outputs], {}
    if not isinstance(requested, list):
        raise RequestError("'outputs' must be a list of objects with a 'name'")
    names = {s.name for s in outputs}
    result, shm = [], {}
    for i, o in enumerate(requested):
        if not isinstance(o, dict) or o.get("name") not in names:
            got = o.get("name") if isinstance(o, dict) else o
            raise RequestError(f"unknown output {got!r}; the model's outputs are {sorted(names)}")
        p = o.get("parameters") or {}
        if isinstance(p, dict) and (ref := _shm_param(p, f"outputs[{i}]")):
            if p.get("binary_data") is True:
                raise RequestError(f"outputs[{i}]: binary_data true and shared memory exclude each other; ask for one")
            shm[o["name"]] = ref
        result.append((o["name"], bool(p.get("binary_data", all_binary)) if isinstance(p, dict) else all_binary))
    return result, shm


def encode_response(model: str, version: str, request: InferRequest, results: dict[str, np.ndarray],
                    specs: list[TensorSpec], regions=None) -> tuple[bytes, int | None]:
    """-> (body, Inference-Header-Content-Length or None for a pure JSON body). Outputs asked for in shared
    memory are written through `regions` (write(ref, data, what)) and named, not sent."""
    by_name = {s.name: s for s in specs}
    entries, blobs = [], []
    for name, binary in request.outputs:
        array = np.ascontiguousarray(results[name])
        datatype = by_name[name].datatype
        entry = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        ref = request.shm_outputs.get(name)
        if ref:
            data = array.astype(dtypes.numpy_dtype(datatype), copy=False).tobytes()
            if len(data) > ref[2]:
                raise RequestError(f"output '{name}' {list(array.shape)} is {len(data)} bytes, "
                                   f"shared_memory_byte_size gives it {ref[2]} in region '{ref[0]}'")
            if regions is None:
                raise RequestError("this server has no shared memory regions", 403)
            regions.write(ref, data, f"output '{name}'")  # answered with name, datatype and shape only (Triton)
        elif binary or datatype in ("FP16", "BF16"):
            blob = array.astype(dtypes.numpy_dtype(datatype), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.ravel().tolist()
        entries.append(entry)
    response = {"model_name": model, "model_version": version, "outputs": entries}
    if request.id is not None:
        response["id"] = request.id
    head = json.dumps(response, separators=(",", ":")).encode()
    if not blobs:
        return head, None
    return b"".join([head, *blobs]), len(head)
