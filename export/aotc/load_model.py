"""Load a model file (`path.py[:NAME]`) and check that it follows the model-file convention.

A model file exposes `model()` (or the function NAME) -> nn.Module, `example_inputs()` -> tuple of tensors,
and optionally `dynamic_shapes()` (torch.export's form), `output_names()`, `tolerance()` and
`make_inputs(batch)` (fresh inputs for a given batch size, for models whose inputs are not independent
random tensors, e.g. offsets). Anything else is a ModelFileError whose one line names what was expected.

This module does not export or run the model beyond building it. Each call imports the file afresh under
its own module name; nothing is shared between calls, so it is safe from several threads only if the model
file itself is (most seed torch's global RNG, which is not).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import inspect
import os
import sys
import types
from typing import Any

from aotc.errors import ModelFileError

_OPTIONAL_HOOKS = ("dynamic_shapes", "output_names", "tolerance", "make_inputs")


@dataclasses.dataclass
class ModelFile:
    """What a model file provides, checked. `module` is the imported file."""

    path: str
    factory: str                         # "model" or the NAME of path.py:NAME
    module: types.ModuleType
    model: Any                           # torch.nn.Module
    example_inputs: tuple
    input_names: list[str]
    dynamic_shapes: Any                  # None, dict keyed by input name, or tuple
    output_names: list[str] | None
    tolerance: dict[str, float] | None   # {"atol", "rtol"}

    @property
    def default_name(self) -> str:
        stem = os.path.splitext(os.path.basename(self.path))[0]
        return stem if self.factory == "model" else f"{stem}_{self.factory}"

    def make_inputs(self, batch: int) -> tuple | None:
        """Fresh inputs for `batch` from the file's make_inputs(batch), or None when it has none."""
        hook = getattr(self.module, "make_inputs", None)
        if hook is None:
            return None
        inputs = _call(self, "make_inputs", hook, batch)
        return _check_tensor_tuple(self.path, f"make_inputs({batch})", inputs)


def split_spec(spec: str) -> tuple[str, str]:
    """'models/bert.py:bert_base' -> ('models/bert.py', 'bert_base'); no ':NAME' -> (path, 'model')."""
    path, sep, name = spec.rpartition(":")
    if sep and name.isidentifier() and path:
        return path, name
    return spec, "model"


def import_file(path: str) -> types.ModuleType:
    """Imports a Python file under a private module name; errors become one-line ModelFileErrors."""
    if not os.path.isfile(path):
        raise ModelFileError(f"model file '{path}' not found; expected a path to a .py file")
    if not path.endswith(".py"):
        raise ModelFileError(f"model file '{path}' is not a .py file; expected a Python model file")
    digest = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:10]
    mod_name = f"aotc_model_{os.path.splitext(os.path.basename(path))[0]}_{digest}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        del sys.modules[mod_name]
        raise ModelFileError(f"{path}:{e.lineno}: syntax error: {e.msg}; fix the model file") from e
    except Exception as e:
        del sys.modules[mod_name]
        raise ModelFileError(f"importing {path} raised {type(e).__name__}: {_first_line(e)}") from e
    return module


def load_model_file(spec: str) -> ModelFile:
    """Imports `path.py[:NAME]`, builds the model and its example inputs, and checks every hook."""
    import torch

    path, factory = split_spec(spec)
    module = import_file(path)
    fn = getattr(module, factory, None)
    if not callable(fn):
        defined = sorted(n for n, v in vars(module).items()
                         if inspect.isfunction(v) and v.__module__ == module.__name__ and not n.startswith("_"))
        what = f"no function {factory}()" if factory != "model" else "no function model()"
        raise ModelFileError(
            f"{path} has {what}; expected a function returning an nn.Module "
            f"(functions defined: {', '.join(defined) or 'none'})")
    model = _call_raw(path, factory, fn)
    if not isinstance(model, torch.nn.Module):
        raise ModelFileError(f"{path}: {factory}() returned {type(model).__name__}, expected a torch.nn.Module")

    if not callable(getattr(module, "example_inputs", None)):
        raise ModelFileError(f"{path} has no function example_inputs(); expected one returning a tuple of tensors")
    example = _check_tensor_tuple(path, "example_inputs()", _call_raw(path, "example_inputs", module.example_inputs))

    input_names = _input_names(path, model, len(example))
    mf = ModelFile(path=path, factory=factory, module=module, model=model, example_inputs=example,
                   input_names=input_names, dynamic_shapes=None, output_names=None, tolerance=None)
    for hook in _OPTIONAL_HOOKS:
        if hasattr(module, hook) and not callable(getattr(module, hook)):
            raise ModelFileError(f"{path}: {hook} must be a function, got {type(getattr(module, hook)).__name__}")
    if hasattr(module, "dynamic_shapes"):
        mf.dynamic_shapes = _check_dynamic_shapes(mf, _call(mf, "dynamic_shapes", module.dynamic_shapes))
    if hasattr(module, "output_names"):
        mf.output_names = _check_output_names(path, _call(mf, "output_names", module.output_names))
    if hasattr(module, "tolerance"):
        mf.tolerance = _check_tolerance(path, _call(mf, "tolerance", module.tolerance))
    return mf


def with_example_batch(mf: ModelFile, batch: int) -> ModelFile:
    """mf with its example inputs at batch size `batch` (`aotc export --example-batch`): the file's
    make_inputs(batch) where it has one, else the example rows repeated (every input must share dim 0).
    torch.export traces and Inductor tunes for the example's sizes, so this is the batch the package is
    tuned for. Raises ModelFileError when the inputs cannot be resized or fall outside dynamic_shapes()."""
    inputs = mf.make_inputs(batch)
    if inputs is None:
        sizes = {x.shape[0] if x.dim() else None for x in mf.example_inputs}
        if len(sizes) != 1 or None in sizes:
            raise ModelFileError(f"{mf.path}: --example-batch needs a make_inputs(batch) function or inputs that "
                                 f"share dim 0, got shapes {[list(x.shape) for x in mf.example_inputs]}")
        rows = sizes.pop()
        reps = -(-batch // rows)
        inputs = tuple(x.repeat(reps, *[1] * (x.dim() - 1))[:batch].clone() for x in mf.example_inputs)
    if len(inputs) != len(mf.example_inputs):
        raise ModelFileError(f"{mf.path}: make_inputs({batch}) returned {len(inputs)} inputs, example_inputs() "
                             f"{len(mf.example_inputs)}")
    out = dataclasses.replace(mf, example_inputs=inputs)
    if out.dynamic_shapes is not None:
        _check_dynamic_shapes(out, out.dynamic_shapes)
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _call_raw(path: str, name: str, fn, *args):
    try:
        return fn(*args)
    except Exception as e:
        raise ModelFileError(f"{path}: {name}() raised {type(e).__name__}: {_first_line(e)}") from e


def _call(mf: ModelFile, name: str, fn, *args):
    return _call_raw(mf.path, name, fn, *args)


def _check_tensor_tuple(path: str, what: str, value) -> tuple:
    import torch

    if isinstance(value, torch.Tensor):
        raise ModelFileError(f"{path}: {what} returned a single tensor, expected a tuple of tensors: (x,)")
    if not isinstance(value, (tuple, list)):
        raise ModelFileError(f"{path}: {what} returned {type(value).__name__}, expected a tuple of tensors")
    if not value:
        raise ModelFileError(f"{path}: {what} returned an empty tuple, expected at least one tensor")
    for i, v in enumerate(value):
        if not isinstance(v, torch.Tensor):
            raise ModelFileError(f"{path}: {what}[{i}] is {type(v).__name__}, expected a torch.Tensor")
    return tuple(value)


def _input_names(path: str, model, n_inputs: int) -> list[str]:
    params = list(inspect.signature(model.forward).parameters.values())
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return [f"input{i}" for i in range(n_inputs)]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not len(required) <= n_inputs <= len(positional):
        sig = ", ".join(p.name for p in positional)
        takes = (str(len(positional)) if len(required) == len(positional)
                 else f"{len(required)} to {len(positional)}")
        raise ModelFileError(f"{path}: forward({sig}) takes {takes} input(s) but example_inputs() returned "
                             f"{n_inputs} tensors; make them agree")
    return [p.name for p in positional[:n_inputs]]


def _check_dynamic_shapes(mf: ModelFile, ds):
    """Checks torch.export's dynamic_shapes form against the inputs; returns it unchanged."""
    if ds is None:
        return None
    names = mf.input_names
    if isinstance(ds, dict):
        unknown = [k for k in ds if k not in names]
        if unknown:
            raise ModelFileError(f"{mf.path}: dynamic_shapes() names input '{unknown[0]}', but forward's inputs "
                                 f"are {names}; key it by those names")
        per_input = [ds.get(n) for n in names]
    elif isinstance(ds, (tuple, list)):
        if len(ds) != len(names):
            raise ModelFileError(f"{mf.path}: dynamic_shapes() has {len(ds)} entries for {len(names)} inputs "
                                 f"{names}; give one per input (None for a static input)")
        per_input = list(ds)
    else:
        raise ModelFileError(f"{mf.path}: dynamic_shapes() returned {type(ds).__name__}, expected a dict keyed "
                             f"by input name, e.g. {{'x': {{0: Dim('batch', min=1, max=1024)}}}}")
    for name, spec, x in zip(names, per_input, mf.example_inputs):
        _check_input_dims(mf.path, name, spec, x)
    return ds


def _check_input_dims(path: str, name: str, spec, x) -> None:
    if spec is None:
        return
    if isinstance(spec, (tuple, list)):
        if len(spec) != x.dim():
            raise ModelFileError(f"{path}: dynamic_shapes() for '{name}' has {len(spec)} entries but the input "
                                 f"has {x.dim()} dims")
        spec = dict(enumerate(spec))
    if not isinstance(spec, dict):
        raise ModelFileError(f"{path}: dynamic_shapes() for '{name}' is {type(spec).__name__}, expected a dict "
                             f"{{dim_index: Dim(...)}} or None")
    for dim, d in spec.items():
        if not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
            raise ModelFileError(f"{path}: dynamic_shapes() for '{name}' names dim {dim!r}, but the input has "
                                 f"{x.dim()} dims (shape {list(x.shape)})")
        if d is None or isinstance(d, int):
            continue
        lo, hi = getattr(d, "min", None), getattr(d, "max", None)
        if lo is None and hi is None and not hasattr(d, "__name__") and type(d).__name__ != "_DimHint":
            raise ModelFileError(f"{path}: dynamic_shapes() for '{name}' dim {dim} is {type(d).__name__}, "
                                 f"expected torch.export.Dim(...), Dim.AUTO/STATIC, an int or None")
        size = x.shape[dim]
        if isinstance(lo, int) and isinstance(hi, int) and not lo <= size <= hi:
            raise ModelFileError(f"{path}: example input '{name}' has size {size} in dim {dim}, outside its Dim "
                                 f"range [{lo}, {hi}]; change example_inputs() or the Dim range")


def _check_output_names(path: str, names) -> list[str]:
    if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) and n for n in names):
        raise ModelFileError(f"{path}: output_names() returned {names!r}, expected a list of non-empty strings")
    if len(set(names)) != len(names):
        raise ModelFileError(f"{path}: output_names() returned duplicate names {list(names)}")
    return list(names)


def _check_tolerance(path: str, tol) -> dict[str, float]:
    if isinstance(tol, (tuple, list)) and len(tol) == 2:
        tol = {"atol": tol[0], "rtol": tol[1]}
    if (not isinstance(tol, dict) or set(tol) != {"atol", "rtol"}
            or not all(isinstance(v, (int, float)) and v >= 0 for v in tol.values())):
        raise ModelFileError(f"{path}: tolerance() returned {tol!r}, expected {{'atol': float, 'rtol': float}} "
                             f"with non-negative values")
    return {"atol": float(tol["atol"]), "rtol": float(tol["rtol"])}
