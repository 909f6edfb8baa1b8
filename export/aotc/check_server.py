"""`aotc check --url URL MODEL.py[:NAME] [--name NAME]`: is what a running server answers what eager PyTorch
computes from the model file?

Sends the file's example inputs, then fresh inputs across the dynamic range from aotc.fresh, the generator
the export's parity uses (every dim at its min, max and an odd size, together and apart, through the
file's make_inputs where it has one; ranges from the server's metadata when it gives them, else from the
file's dynamic_shapes()), runs the same inputs through the eager model here, and compares each output with
aotc's one parity rule. Prints per-output max abs/rel error, the elements outside tolerance and a verdict;
raises ParityError on a mismatch, InconclusiveError when an output's reference is trivial (near zero or
constant) in every case. It does not start servers. Single-threaded; one request at a time.
"""

from __future__ import annotations

import numpy as np

from aotc_client.compare import compare_outputs, default_tolerance
from aotc_client.errors import AotcError, ParityError
from aotc_client.specs import TensorSpec, specs_from_metadata


def _merge_specs(server: list[TensorSpec], local: list[TensorSpec], where: str) -> list[TensorSpec]:
    """The server's names and dtypes, with ranges from the server when given, else from the model file; the
    file's symbols (its Dim names) tie the dims together."""
    if [s.name for s in server] != [s.name for s in local]:
        raise AotcError(f"{where} has inputs {[s.name for s in server]}, the model file has "
                        f"{[s.name for s in local]}; is it the model exported from this file?")
    merged = []
    for s, f in zip(server, local):
        if len(s.shape) != len(f.shape):
            raise AotcError(f"input '{s.name}' has shape {list(s.shape)} on the server, {list(f.shape)} in the "
                            f"model file; is it the model exported from this file?")
        ranges = s.ranges or f.ranges
        merged.append(TensorSpec(s.name, s.datatype, s.shape, ranges, f.symbols, f.low, f.high))
    return merged


def _input_sets(mf, specs: list[TensorSpec], seed: int) -> tuple[list[tuple[str, dict]], list[str]]:
    """((label, {name: array}) for the example inputs and the fresh ones, the dims not varied)."""
    from aotc.fresh import fresh_cases

    to_np = lambda xs: {s.name: x.detach().cpu().numpy() for s, x in zip(specs, xs)}  # noqa: E731
    fresh, unvaried = fresh_cases(mf, specs, None, mf.example_inputs, seed=seed)
    return [("example", to_np(mf.example_inputs))] + [(label, to_np(xs)) for label, xs in fresh], unvaried


def _cast_for_server(arrays: dict, specs: list[TensorSpec]) -> dict:
    from aotc_client.dtypes import numpy_dtype
    out = {}
    for s in specs:
        a = arrays[s.name]
        out[s.name] = a.astype(np.float32) if s.datatype == "BF16" else a.astype(numpy_dtype(s.datatype), copy=False)
    return out


def _eager(mf, arrays: dict, specs: list[TensorSpec], output_names: list[str]) -> dict:
    import torch

    from aotc import export as exp

    tensors = []
    for s in specs:
        t = torch.from_numpy(np.array(arrays[s.name]))
        tensors.append(t.to(torch.bfloat16) if s.datatype == "BF16" else t)
    with torch.inference_mode():
        outs = exp.eager_outputs(mf.model, tuple(tensors), mf)
    if len(outs) != len(output_names):
        raise AotcError(f"the eager model returns {len(outs)} outputs, the server's model has {len(output_names)} "
                        f"{output_names}; is it the model exported from this file?")
    return {n: o.detach().float().numpy() if o.dtype == torch.bfloat16 else o.detach().numpy()
            for n, o in zip(output_names, outs)}


def check_server(url: str, model: str | None, model_file: str, version: str = "", binary: bool = True,
                 atol: float | None = None, rtol: float | None = None, seed: int = 0,
                 timeout: float = 60.0, allow_trivial: bool = False) -> list:
    """The check described in the module docstring; returns the comparisons, raises ParityError or (unless
    `allow_trivial`) InconclusiveError. `model`: the model's name on the server (None: the file's default name,
    as `aotc export` names it). atol/rtol None: the model file's tolerance(), else the default for the output's
    dtype."""
    import torch

    from aotc.errors import InconclusiveError
    from aotc.load_model import load_model_file
    from aotc.serve_python import model_file_specs
    from aotc_client.client import Client

    mf = load_model_file(model_file)
    model = model or mf.default_name
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
        sets, unvaried = _input_sets(mf, specs, seed)
        results, failed, trivial = [], 0, {n: [] for n in output_names}
        for label, arrays in sets:
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
                if c.total and c.name in trivial:
                    trivial[c.name].append(c.trivial)
    if unvaried:
        print(f"  not varied: {', '.join(unvaried)} (make_inputs() has no parameter for them)")
    if failed:
        print(f"verdict: FAIL ({failed} of {len(results)} output comparisons outside tolerance)")
        raise ParityError(f"{where} disagrees with eager PyTorch on {failed} of {len(results)} output comparisons")
    vacuous = {n: whys[0] for n, whys in trivial.items() if whys and all(whys)}
    if vacuous:
        text = "; ".join(f"output '{n}' {why}" for n, why in vacuous.items())
        print(f"verdict: INCONCLUSIVE ({text} in every case)")
        if not allow_trivial:
            raise InconclusiveError(f"{where}: parity is INCONCLUSIVE: {text} in every case, so any server "
                                    f"answering zeros would pass; pass --allow-trivial-outputs to accept it")
        return results
    print(f"verdict: PASS ({len(results)} output comparisons within tolerance)")
    return results
