"""`aotc check --url URL --model NAME MODEL.py[:NAME]`: is what a running server answers what eager PyTorch
computes from the model file?

Sends the file's example inputs, then fresh inputs at the minimum, an odd size and the maximum of the
dynamic range (ranges from the server's metadata when it gives them, else from the file's
dynamic_shapes()), runs the same inputs through the eager model here, and compares each output with
abs(a-b) <= atol + rtol*abs(b). Prints per-output max abs/rel error and a verdict; raises ParityError on
a mismatch. It does not start servers. Single-threaded; one request at a time.
"""

from __future__ import annotations

import numpy as np

from aotc_client.compare import compare_outputs, default_tolerance
from aotc_client.errors import AotcError, ParityError
from aotc_client.specs import TensorSpec, random_inputs, range_sizes, specs_from_metadata


def _merge_specs(server: list[TensorSpec], local: list[TensorSpec], where: str) -> list[TensorSpec]:
    """The server's names and dtypes, with ranges from the server when given, else from the model file."""
    if [s.name for s in server] != [s.name for s in local]:
        raise AotcError(f"{where} has inputs {[s.name for s in server]}, the model file has "
                        f"{[s.name for s in local]}; is --model the model exported from this file?")
    merged = []
    for s, f in zip(server, local):
        if len(s.shape) != len(f.shape):
            raise AotcError(f"input '{s.name}' has shape {list(s.shape)} on the server, {list(f.shape)} in the "
                            f"model file; is --model the model exported from this file?")
        ranges = s.ranges or f.ranges
        merged.append(TensorSpec(s.name, s.datatype, s.shape, ranges, f.symbols, f.low, f.high))
    return merged


def _input_sets(mf, specs: list[TensorSpec], seed: int) -> list[tuple[str, dict]]:
    """(label, {name: array}) for the example inputs and fresh ones across the dynamic range."""
    sets = [("example", {s.name: x.detach().cpu().numpy() for s, x in zip(specs, mf.example_inputs)})]
    for i, sizes in enumerate(range_sizes(specs)):
        if not sizes:
            continue
        label = "fresh " + " ".join(f"{k}={v}" for k, v in sizes.items())
        batch = sizes.get(specs[0].symbol(0)) if specs[0].shape and specs[0].shape[0] == -1 else None
        made = mf.make_inputs(batch) if batch is not None else None
        if made is not None:  # the file knows how to build valid inputs (offsets, ids) for a batch
            sets.append((f"fresh batch={batch} (make_inputs)",
                         {s.name: x.detach().cpu().numpy() for s, x in zip(specs, made)}))
        else:
            sets.append((label, random_inputs(specs, sizes, seed=seed + i)))
    return sets


def _cast_for_server(arrays: dict, specs: list[TensorSpec]) -> dict:
    from aotc_client.dtypes import numpy_dtype
    out = {}
    for s in specs:
        a = arrays[s.name]
        out[s.name] = a.astype(np.float32) if s.datatype == "BF16" else a.astype(numpy_dtype(s.datatype), copy=False)
    return out


def _eager(mf, arrays: dict, specs: list[TensorSpec], output_names: list[str]) -> dict:
    import torch

    tensors = []
    for s in specs:
        t = torch.from_numpy(np.array(arrays[s.name]))
        tensors.append(t.to(torch.bfloat16) if s.datatype == "BF16" else t)
    with torch.inference_mode():
        out = mf.model(*tensors)
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    if len(outs) != len(output_names):
        raise AotcError(f"the eager model returns {len(outs)} outputs, the server's model has {len(output_names)} "
                        f"{output_names}; is --model the model exported from this file?")
    return {n: o.detach().float().numpy() if o.dtype == torch.bfloat16 else o.detach().numpy()
            for n, o in zip(output_names, outs)}


def check_server(url: str, model: str, model_file: str, version: str = "", binary: bool = True,
                 atol: float | None = None, rtol: float | None = None, seed: int = 0,
                 timeout: float = 60.0) -> list:
    """The check described in the module docstring; returns the comparisons, raises ParityError.
    atol/rtol None: the model file's tolerance(), else the default for the output's dtype."""
    import torch

    from aotc.load_model import load_model_file
    from aotc.serve_python import model_file_specs
    from aotc_client.client import Client

    mf = load_model_file(model_file)
    with Client(url, binary=binary, timeout=timeout) as client:
        metadata = client.metadata(model, version)
        where = f"model '{model}' at {client.url}"
        specs = _merge_specs(specs_from_metadata(metadata, "inputs"), model_file_specs(mf), where)
        output_names = [o["name"] for o in metadata["outputs"]]
        float_types = {s.datatype for s in specs if s.datatype in ("FP16", "BF16", "FP64")}
        if float_types:  # exported with --dtype: run the eager reference in the package's precision
            mf.model = mf.model.to({"FP16": torch.float16, "BF16": torch.bfloat16, "FP64": torch.float64}[
                float_types.pop()])
        tol = mf.tolerance or {}
        print(f"aotc check: {where} against {model_file} (eager PyTorch), "
              f"{'binary' if binary else 'JSON'} tensors")
        results, failed = [], 0
        for label, arrays in _input_sets(mf, specs, seed):
            arrays = _cast_for_server(arrays, specs)
            shapes = " ".join(f"{k}{list(v.shape)}" for k, v in arrays.items())
            print(f"  {label}: {shapes}")
            got = client.infer(model, arrays, version=version)
            want = _eager(mf, arrays, specs, output_names)
            first = next(iter(want.values()))
            d_atol, d_rtol = default_tolerance(first.dtype)
            for c in compare_outputs(got, want, tol.get("atol", d_atol) if atol is None else atol,
                                     tol.get("rtol", d_rtol) if rtol is None else rtol):
                print(f"    {c.line()}")
                results.append(c)
                failed += not c.ok
    if failed:
        print(f"verdict: FAIL ({failed} of {len(results)} output comparisons outside tolerance)")
        raise ParityError(f"{where} disagrees with eager PyTorch on {failed} of {len(results)} output comparisons")
    print(f"verdict: PASS ({len(results)} output comparisons within tolerance)")
    return results
