"""A client for any Open Inference Protocol server (aotc-server, Triton, KServe), built on tritonclient.http.

tritonclient speaks the protocol (binary tensors, JSON, compression); this adds what aotc users need:
inference with dicts of numpy arrays, input specs from model metadata, random valid inputs, errors as
aotc_client.errors types. It is not a load generator (see bench.py).
Concurrency: `Client` wraps the gevent-based sync client and is for one thread at a time; `AsyncClient`
wraps tritonclient.http.aio (aiohttp) and serves any number of concurrent coroutines on one event loop.
"""

import time

import numpy as np
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from . import dtypes, specs as specs_mod
from .errors import AotcError, ServerError


def host_port(url: str) -> str:
    """'http://127.0.0.1:8000/' -> '127.0.0.1:8000' (tritonclient takes no scheme)."""
    for scheme in ("http://", "https://"):
        if url.startswith(scheme):
            url = url[len(scheme):]
    url = url.rstrip("/")
    if not url or "/" in url:
        raise AotcError(f"server URL {url!r} is not HOST:PORT; expected e.g. http://127.0.0.1:8000")
    return url


def _server_error(url: str, e: Exception) -> ServerError:
    if isinstance(e, InferenceServerException):
        status = e.status()
        try:
            status = int(status) if status is not None else None
        except ValueError:
            status = None
        message = " ".join(str(e.message()).split())  # one line, whatever the server sent
        return ServerError(f"{url} answered {status or 'an error'}: {message[:500]}", status)
    return ServerError(f"cannot reach {url}: {e.__class__.__name__}: {e}; is the server running?")


def _make_inputs(inputs: dict, specs: dict | None, binary: bool) -> list:
    out = []
    for name, value in inputs.items():
        array = np.asarray(value)
        spec = specs.get(name) if specs else None
        if specs is not None and spec is None:
            raise AotcError(f"unknown input {name!r}; the model's inputs are {sorted(specs)}")
        if spec is not None and spec.datatype == "BF16" and array.dtype == np.float32:
            datatype = "BF16"  # tritonclient narrows float32 to bfloat16 itself
        elif array.dtype == object:
            datatype = "BYTES"
        else:
            datatype = dtypes.datatype_of(array)
        if spec is not None and datatype != spec.datatype:
            np_name = dtypes.name_from_datatype(spec.datatype) if spec.datatype != "BYTES" else "object"
            raise AotcError(f"input {name!r} has dtype {array.dtype}, the model expects {spec.datatype}; "
                            f"cast with {name}.astype(np.{np_name})")
        t = httpclient.InferInput(name, list(array.shape), datatype)
        t.set_data_from_numpy(array, binary_data=binary or datatype in ("FP16", "BF16"))
        out.append(t)
    return out


def _make_outputs(names, binary: bool):
    if names is None:
        return None
    return [httpclient.InferRequestedOutput(n, binary_data=binary) for n in names]


def _result_dict(result, names) -> dict:
    response = result.get_response()
    names = names or [o["name"] for o in response.get("outputs", [])]
    return {n: result.as_numpy(n) for n in names}


class Client:
    """Synchronous client. `binary` (default True) sends and asks for binary tensors; False uses JSON."""

    def __init__(self, url: str, binary: bool = True, timeout: float = 60.0):
        self.url = host_port(url)
        self.binary = binary
        self._client = httpclient.InferenceServerClient(
            self.url, connection_timeout=timeout, network_timeout=timeout)
        self._specs: dict[tuple[str, str], dict] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._client.close()

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (InferenceServerException, OSError) as e:
            raise _server_error(self.url, e) from None

    def live(self) -> bool:
        return self._call(self._client.is_server_live)

    def ready(self, model: str | None = None, version: str = "") -> bool:
        if model is None:
            return self._call(self._client.is_server_ready)
        return self._call(self._client.is_model_ready, model, version)

    def wait_ready(self, timeout: float = 30.0, model: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.ready(model):
                    return
            except ServerError:
                pass
            if time.monotonic() > deadline:
                raise ServerError(f"{self.url} was not ready after {timeout:g} s")
            time.sleep(0.05)

    def server_metadata(self) -> dict:
        return self._call(self._client.get_server_metadata)

    def metadata(self, model: str, version: str = "") -> dict:
        return self._call(self._client.get_model_metadata, model, version)

    def config(self, model: str, version: str = "") -> dict:
        return self._call(self._client.get_model_config, model, version)

    def input_specs(self, model: str, version: str = "") -> list[specs_mod.TensorSpec]:
        return specs_mod.specs_from_metadata(self.metadata(model, version), "inputs")

    def output_specs(self, model: str, version: str = "") -> list[specs_mod.TensorSpec]:
        return specs_mod.specs_from_metadata(self.metadata(model, version), "outputs")

    def random_inputs(self, model: str, sizes=None, seed: int | None = 0, version: str = "") -> dict:
        return specs_mod.random_inputs(self.input_specs(model, version), sizes, seed)

    def _input_spec_map(self, model: str, version: str) -> dict:
        key = (model, version)
        if key not in self._specs:
            self._specs[key] = {s.name: s for s in self.input_specs(model, version)}
        return self._specs[key]

    def infer(self, model: str, inputs: dict, outputs: list[str] | None = None, version: str = "",
              binary: bool | None = None, request_id: str = "", check: bool = True) -> dict[str, np.ndarray]:
        """Run `model` on a dict of numpy arrays; returns {output name: array}. With `check`, input names and
        dtypes are checked against the model metadata (fetched once) before anything is sent."""
        binary = self.binary if binary is None else binary
        spec_map = self._input_spec_map(model, version) if check else None
        result = self._call(self._client.infer, model, _make_inputs(inputs, spec_map, binary),
                            model_version=version, outputs=_make_outputs(outputs, binary), request_id=request_id)
        return _result_dict(result, outputs)


class AsyncClient:
    """asyncio client over tritonclient.http.aio; the same methods as Client, awaited."""

    def __init__(self, url: str, binary: bool = True, timeout: float = 60.0, connections: int = 100):
        self.url = host_port(url)
        self.binary = binary
        self._client = aioclient.InferenceServerClient(self.url, conn_limit=connections, conn_timeout=timeout)
        self._specs: dict[tuple[str, str], dict] = {}

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self):
        await self._client.close()

    async def _call(self, fn, *args, **kwargs):
        # aiohttp asks for gzip by default and tritonclient.aio does not inflate non-infer answers itself
        kwargs.setdefault("headers", {"Accept-Encoding": "identity"})
        try:
            return await fn(*args, **kwargs)
        except (InferenceServerException, OSError) as e:
            raise _server_error(self.url, e) from None
        except Exception as e:  # aiohttp's ClientError family
            if e.__class__.__module__.startswith("aiohttp"):
                raise _server_error(self.url, e) from None
            raise

    async def ready(self, model: str | None = None, version: str = "") -> bool:
        if model is None:
            return await self._call(self._client.is_server_ready)
        return await self._call(self._client.is_model_ready, model, version)

    async def metadata(self, model: str, version: str = "") -> dict:
        return await self._call(self._client.get_model_metadata, model, version)

    async def input_specs(self, model: str, version: str = "") -> list[specs_mod.TensorSpec]:
        return specs_mod.specs_from_metadata(await self.metadata(model, version), "inputs")

    async def infer(self, model: str, inputs: dict, outputs: list[str] | None = None, version: str = "",
                    binary: bool | None = None, request_id: str = "", check: bool = True) -> dict[str, np.ndarray]:
        binary = self.binary if binary is None else binary
        spec_map = None
        if check:
            key = (model, version)
            if key not in self._specs:
                self._specs[key] = {s.name: s for s in await self.input_specs(model, version)}
            spec_map = self._specs[key]
        result = await self._call(self._client.infer, model, _make_inputs(inputs, spec_map, binary),
                                  model_version=version, outputs=_make_outputs(outputs, binary),
                                  request_id=request_id)
        return _result_dict(result, outputs)
