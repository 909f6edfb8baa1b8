"""`aotc serve --python`: the FastAPI + uvicorn baseline server, speaking the same protocol as aotc-server.

It serves a model repository DIR/<model>/<version>/model.pt2 through PyTorch's in-process AOTI loader
(aotc.loader), or one model file run eagerly (`--eager MODEL.py --name NAME`): the way most teams serve
PyTorch today, and what aotc-server is measured against. It is not the production server: no dynamic
batching, no repository polling. This file loads models and starts uvicorn; the routes are in
serve_python_app.py. Requests are validated against the manifest (aotc.wire) before the model runs.
Concurrency: one asyncio event loop parses and answers; the model runs in Starlette's thread pool, one
call at a time per model (a lock), so torch's own intra-op threads are not oversubscribed.
"""

from __future__ import annotations

import glob
import os
import sys
import threading
import time

from aotc_client.errors import AotcError
from aotc_client.specs import TensorSpec, specs_from_manifest

DEFAULT_BODY_LIMIT = 64 << 20


class Model:
    """One servable model version: specs, a runner (dict of numpy -> dict of numpy) and its statistics."""

    def __init__(self, name, version, inputs, outputs, runner, platform, manifest=None):
        self.name, self.version, self.platform = name, version, platform
        self.inputs: list[TensorSpec] = inputs
        self.outputs: list[TensorSpec] = outputs
        self.manifest = manifest
        self._runner = runner
        self._lock = threading.Lock()
        self.stats = {k: [0, 0] for k in ("success", "fail", "queue", "compute_input", "compute_infer",
                                          "compute_output")}
        self.inference_count = self.execution_count = self.last_inference = 0

    def run(self, arrays: dict) -> dict:
        t0 = time.perf_counter_ns()
        with self._lock:
            t1 = time.perf_counter_ns()
            result = self._runner(arrays)
            self._add("queue", t1 - t0)
            self._add("compute_infer", time.perf_counter_ns() - t1)
        return result

    def _add(self, key, ns):
        self.stats[key][0] += 1
        self.stats[key][1] += ns


def _torch_runner(fn, inputs: list[TensorSpec], output_names: list[str]):
    import numpy as np
    import torch

    def run(arrays: dict) -> dict:
        tensors = []
        for s in inputs:
            a = np.array(arrays[s.name])  # writable copy: torch refuses read-only request buffers
            t = torch.from_numpy(a)
            tensors.append(t.view(torch.bfloat16) if s.datatype == "BF16" else t)
        with torch.inference_mode():
            out = fn(*tensors)
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        if len(outs) != len(output_names):
            raise RuntimeError(f"model returned {len(outs)} outputs, expected {len(output_names)}")
        return {n: (o.view(torch.int16) if o.dtype == torch.bfloat16 else o).detach().cpu().numpy()
                for n, o in zip(output_names, outs)}
    return run


def load_repository(root: str) -> tuple[dict[str, dict[str, Model]], dict[str, str]]:
    """Loads every DIR/<model>/<version>/model.pt2; returns (models, {name/version: reason it failed})."""
    from aotc import loader

    if not os.path.isdir(root):
        raise AotcError(f"model repository '{root}' is not a directory; expected DIR/<model>/<version>/model.pt2")
    models: dict[str, dict[str, Model]] = {}
    failed: dict[str, str] = {}
    for path in sorted(glob.glob(os.path.join(root, "*", "*", "model.pt2"))):
        version_dir = os.path.dirname(path)
        name, version = os.path.basename(os.path.dirname(version_dir)), os.path.basename(version_dir)
        if not version.isdigit():
            continue
        try:
            compiled = loader.load_package(path)
            manifest = compiled.manifest
            if manifest.seq_pack:
                raise AotcError("a --seq-pack package: aotc-server packs its requests into the graph's rows; this "
                                "baseline runs a graph as it is")
            inputs, outputs = specs_from_manifest(manifest.inputs), specs_from_manifest(manifest.outputs)
            runner = _torch_runner(compiled, inputs, [s.name for s in outputs])
            models.setdefault(name, {})[version] = Model(name, version, inputs, outputs, runner,
                                                         "torch_aoti", manifest)
        except Exception as e:  # a bad package is reported in the index while the others serve
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            failed[f"{name}/{version}"] = reason
            print(f"aotc serve --python: cannot load {path}: {reason}", file=sys.stderr)
    if not models and not failed:
        raise AotcError(f"no packages in '{root}'; expected DIR/<model>/<version>/model.pt2")
    return models, failed


def model_file_specs(mf) -> list[TensorSpec]:
    """Input specs of a loaded model file: dtypes and shapes of its example inputs, dynamic dims (with their
    Dim's name as symbol and its range) from dynamic_shapes(), and integer value ranges from the examples."""
    import torch

    dims = _dynamic_dims(mf)
    specs = []
    for n, x in zip(mf.input_names, mf.example_inputs):
        d = dims.get(n, {})
        shape = tuple(-1 if j in d else s for j, s in enumerate(x.shape))
        ranges = tuple(d[j][1:] if j in d else (s, s) for j, s in enumerate(x.shape))
        symbols = tuple(d[j][0] if j in d else None for j in range(x.dim()))
        low = high = None
        if not x.is_floating_point() and x.dtype != torch.bool and x.numel():
            low, high = int(x.min()), int(x.max()) + 1
        specs.append(TensorSpec(n, _datatype(x.dtype), shape, ranges, symbols, low, high))
    return specs


def eager_model(spec: str, name: str | None) -> Model:
    """A model file run eagerly; specs come from its example inputs and dynamic_shapes()."""
    import torch

    from aotc.load_model import load_model_file

    from aotc import export as exp

    mf = load_model_file(spec)
    inputs = model_file_specs(mf)
    with torch.inference_mode():
        names, outs = exp.run_eager(mf.model, mf.example_inputs, mf)
    batch = {x.shape[0] for s, x in zip(inputs, mf.example_inputs) if s.shape and s.shape[0] == -1}
    outputs = []
    for n, o in zip(names, outs):  # an output whose dim 0 equals the dynamic batch follows it
        shape = tuple(-1 if j == 0 and s in batch else s for j, s in enumerate(o.shape))
        outputs.append(TensorSpec(n, _datatype(o.dtype), shape))
    # forward's output pytree (a dict, a ModelOutput) flattened to the named leaves, inputs bound as the file binds
    run = lambda *xs: exp.eager_outputs(mf.model, xs, mf)  # noqa: E731
    return Model(name or mf.default_name, "1", inputs, outputs, _torch_runner(run, inputs, names), "pytorch_eager")


def _dynamic_dims(mf) -> dict[str, dict[int, tuple]]:
    """{input: {dim: (symbol, min, max)}} from the file's dynamic_shapes()."""
    ds = mf.dynamic_shapes
    if ds is None:
        return {}
    per_input = ds if isinstance(ds, dict) else dict(zip(mf.input_names, ds))
    out = {}
    for name, spec in per_input.items():
        if isinstance(spec, (tuple, list)):
            spec = dict(enumerate(spec))
        for j, d in (spec or {}).items():
            if d is None or isinstance(d, int):
                continue
            lo, hi = getattr(d, "min", None), getattr(d, "max", None)
            lo = lo if isinstance(lo, int) else 1
            hi = hi if isinstance(hi, int) and hi < 2**31 else 2**31 - 1
            rank = mf.example_inputs[mf.input_names.index(name)].dim()
            out.setdefault(name, {})[j if j >= 0 else j + rank] = (getattr(d, "__name__", f"{name}_{j}"), lo, hi)
    return out


def _datatype(torch_dtype) -> str:
    from aotc_client.dtypes import datatype_from_name
    return datatype_from_name(str(torch_dtype).removeprefix("torch."))


def serve_python(repository: str | None = None, eager: str | None = None, name: str | None = None,
                 host: str = "127.0.0.1", http_port: int = 8000, max_body_bytes: int = DEFAULT_BODY_LIMIT,
                 api_key: str | None = None, allow_shared_memory: bool = False) -> int:
    """`aotc serve --python`: serves a repository or (eager) one model file until interrupted."""
    if bool(eager) == bool(repository):
        raise AotcError("aotc serve --python needs a model repository DIR or --eager MODEL.py (one of them)")
    if not 0 <= http_port <= 65535:
        raise AotcError(f"--http-port {http_port} is not a port; expected 0..65535")
    import uvicorn

    from aotc.serve_python_app import make_app
    if eager:
        model = eager_model(eager, name)
        models, failed = {model.name: {model.version: model}}, {}
    else:
        models, failed = load_repository(repository)
    app = make_app(models, failed, max_body_bytes or DEFAULT_BODY_LIMIT,
                   reload=None if eager else lambda: load_repository(repository),
                   api_key=api_key, allow_shared_memory=allow_shared_memory)
    print(f"aotc serve --python: serving {sorted(models)} on http://{host}:{http_port}", flush=True)
    uvicorn.run(app, host=host, port=http_port, log_level="warning", access_log=False)
    return 0
