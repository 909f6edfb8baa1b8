"""Load a model file (`path.py[:NAME]`) and check that it follows the model-file convention.

A model file exposes `model()` (or the function NAME) -> nn.Module, `example_inputs()` -> tuple of tensors
(by position) and/or `example_kwargs()` -> dict of tensors (by forward's parameter names), and optionally
`dynamic_shapes()` (torch.export's form), `output_names()`, `tolerance()`, `make_inputs(batch, seq, ...)`
(fresh inputs at the sizes of the dynamic dims its parameters are named after, for models whose inputs are
not independent random tensors, e.g. offsets, masks) and `pad_values()` ({input name: the value padding takes},
for --seq-buckets). Anything else is a ModelFileError whose one line names
what was expected.

The inputs are bound to forward's parameters once, here: every later stage sees them flat, in call order
(those given by position, then those given by name in forward's order), as torch.export flattens them, and
calls the model through `ModelFile.call`.

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
from aotc.model_dims import check_dynamic_shapes, dim_names, example_sizes

_OPTIONAL_HOOKS = ("example_kwargs", "dynamic_shapes", "output_names", "tolerance", "make_inputs", "pad_values")


@dataclasses.dataclass
class ModelFile:
    """What a model file provides, checked. `module` is the imported file."""

    path: str
    factory: str                         # "model" or the NAME of path.py:NAME
    module: types.ModuleType
    model: Any                           # torch.nn.Module
    example_inputs: tuple                # every input, flat in call order (example_inputs(), then example_kwargs())
    input_names: list[str]               # forward's parameter name of each
    dynamic_shapes: Any                  # None, dict keyed by input name, or tuple
    output_names: list[str] | None
    tolerance: dict[str, float] | None   # {"atol", "rtol"}
    positional: int | None = None        # how many inputs go by position (the rest by name); None: all
    pad_values: dict[str, float] | None = None  # pad_values(): {input name: the value its padding takes}

    @property
    def default_name(self) -> str:
        stem = os.path.splitext(os.path.basename(self.path))[0]
        return stem if self.factory == "model" else f"{stem}_{self.factory}"

    @property
    def n_positional(self) -> int:
        return len(self.input_names) if self.positional is None else self.positional

    def args_kwargs(self, inputs) -> tuple[tuple, dict]:
        """Flat inputs (in input_names order) as forward takes them: (args, kwargs)."""
        n = self.n_positional
        return tuple(inputs[:n]), dict(zip(self.input_names[n:], inputs[n:]))

    def call(self, model, inputs):
        """model(...) on flat inputs; returns what forward returns (any pytree)."""
        args, kwargs = self.args_kwargs(inputs)
        return model(*args, **kwargs)

    @property
    def size_params(self) -> dict[str, str] | None:
        """{make_inputs parameter: the dynamic dim it sizes}, None when the file has no make_inputs. A parameter
        is named after a dim (a Dim of dynamic_shapes(), or `batch`); a first parameter named otherwise takes
        the batch (the convention before keyword sizes)."""
        hook = getattr(self.module, "make_inputs", None)
        if hook is None:
            return None
        params = [p for p in inspect.signature(hook).parameters.values()
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.POSITIONAL_ONLY)]
        known = set(dim_names(self)) | {"batch"}
        out = {p.name: p.name for p in params if p.name in known}
        if not out and params and params[0].kind != params[0].KEYWORD_ONLY:
            out[params[0].name] = "batch"
        return out

    def make_inputs(self, batch: int | None = None, **sizes: int) -> tuple | None:
        """Fresh flat inputs from the file's make_inputs, or None when it has none. `sizes` are by dim name
        (`seq=128`); `batch` is the batch's. Only the dims make_inputs has a parameter for are passed."""
        hook = getattr(self.module, "make_inputs", None)
        if hook is None:
            return None
        sizes = {**example_sizes(self), **sizes, **({"batch": batch} if batch is not None else {})}
        kwargs = {p: sizes[dim] for p, dim in self.size_params.items() if dim in sizes}
        shown = "make_inputs(" + ", ".join(f"{k}={v}" for k, v in kwargs.items()) + ")"
        made = _call(self, shown, hook, **kwargs)
        if isinstance(made, dict):
            args, kw = (), made
        elif isinstance(made, tuple) and len(made) == 2 and isinstance(made[1], dict) \
                and isinstance(made[0], (tuple, list)):
            args, kw = tuple(made[0]), made[1]
        else:
            args, kw = _check_tensor_tuple(self.path, shown, made), {}
        names, flat, _ = bind_inputs(self.path, self.model, args, kw, shown)
        if names != self.input_names:
            raise ModelFileError(f"{self.path}: {shown} gives inputs {names}, the examples give "
                                 f"{self.input_names}; return the same inputs (a tuple by position, a dict by "
                                 f"name, or both as (tuple, dict))")
        return flat


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

    for hook in ("example_inputs",) + _OPTIONAL_HOOKS:
        if hasattr(module, hook) and not callable(getattr(module, hook)):
            raise ModelFileError(f"{path}: {hook} must be a function, got {type(getattr(module, hook)).__name__}")
    has_args, has_kwargs = hasattr(module, "example_inputs"), hasattr(module, "example_kwargs")
    if not has_args and not has_kwargs:
        raise ModelFileError(f"{path} has no function example_inputs(); expected one returning a tuple of tensors "
                             f"(or example_kwargs() returning a dict of tensors by forward's parameter names)")
    args = (_check_tensor_tuple(path, "example_inputs()", _call_raw(path, "example_inputs", module.example_inputs))
            if has_args else ())
    kwargs = (_check_tensor_dict(path, "example_kwargs()", _call_raw(path, "example_kwargs", module.example_kwargs))
              if has_kwargs else {})
    input_names, example, positional = bind_inputs(path, model, args, kwargs, "example_inputs()", "example_kwargs()")
    mf = ModelFile(path=path, factory=factory, module=module, model=model, example_inputs=example,
                   input_names=input_names, dynamic_shapes=None, output_names=None, tolerance=None,
                   positional=positional)
    if hasattr(module, "dynamic_shapes"):
        mf.dynamic_shapes = check_dynamic_shapes(mf, _call(mf, "dynamic_shapes", module.dynamic_shapes))
    if hasattr(module, "output_names"):
        mf.output_names = _check_output_names(path, _call(mf, "output_names", module.output_names))
    if hasattr(module, "tolerance"):
        mf.tolerance = _check_tolerance(path, _call(mf, "tolerance", module.tolerance))
    if hasattr(module, "pad_values"):
        mf.pad_values = _check_pad_values(path, _call(mf, "pad_values", module.pad_values), input_names)
    return mf


def with_example_batch(mf: ModelFile, batch: int) -> ModelFile:
    """mf with its example inputs at batch size `batch` (`aotc export --example-batch`): the file's
    make_inputs(batch) where it has one (its other dims at their example sizes), else the example rows repeated
    (every input must share dim 0).
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
        check_dynamic_shapes(out, out.dynamic_shapes)
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _call_raw(path: str, name: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        shown = name if name.endswith(")") else f"{name}()"
        raise ModelFileError(f"{path}: {shown} raised {type(e).__name__}: {_first_line(e)}") from e


def _call(mf: ModelFile, name: str, fn, *args, **kwargs):
    return _call_raw(mf.path, name, fn, *args, **kwargs)


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


def _check_tensor_dict(path: str, what: str, value) -> dict:
    import torch

    if not isinstance(value, dict):
        raise ModelFileError(f"{path}: {what} returned {type(value).__name__}, expected a dict of tensors keyed "
                             f"by forward's parameter names")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, torch.Tensor):
            raise ModelFileError(f"{path}: {what}[{k!r}] is {type(v).__name__}, expected a torch.Tensor under a "
                                 f"parameter name")
    return dict(value)


def _check_tensor_param(path: str, p, source: str) -> None:
    """A tensor given to a parameter annotated as something else (GPT-2's `cache: Cache | None`) is refused
    before the model runs on it and fails somewhere inside."""
    if p.annotation is p.empty:
        return
    text = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", str(p.annotation))
    if "Tensor" not in text and text not in ("Any", "typing.Any", "object"):
        raise ModelFileError(f"{path}: {source} goes to forward's parameter '{p.name}' (annotated {text}), not a "
                             f"tensor parameter; give the inputs by name with example_kwargs() "
                             f"({{'name': tensor}}) to skip it")


def bind_inputs(path: str, model, args: tuple, kwargs: dict, pos_what: str,
                kw_what: str | None = None) -> tuple[list[str], tuple, int]:
    """Binds inputs given by position (`args`, from `pos_what`) and by name (`kwargs`, from `kw_what`) to
    forward's parameters; returns (names, flat inputs, how many go by position). Flat order: the positional
    ones, then the named ones in forward's parameter order, as torch.export flattens them. Raises
    ModelFileError naming the parameter a wrong input went to."""
    kw_what = kw_what or pos_what
    signature = inspect.signature(model.forward)
    params = list(signature.parameters.values())
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as e:
        sig = ", ".join(p.name if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                        else ("*" if p.kind == p.VAR_POSITIONAL else "**") + p.name for p in params)
        given = " and ".join(dict.fromkeys(w for w, v in ((pos_what, args), (kw_what, kwargs)) if v))
        raise ModelFileError(f"{path}: forward({sig}) cannot take the inputs of {given or pos_what}: {e}") from None
    names, flat = [], []
    for p in params:  # by position first
        if p.name not in bound.arguments or p.name in kwargs or p.kind == p.VAR_KEYWORD:
            continue
        value = bound.arguments[p.name]
        if p.kind == p.VAR_POSITIONAL:
            names += [f"input{len(names) + i}" for i in range(len(value))]
            flat += list(value)
            continue
        _check_tensor_param(path, p, f"{pos_what}[{len(flat)}]")
        names.append(p.name)
        flat.append(value)
    n_pos = len(flat)
    for p in params:  # then by name, in forward's order
        if p.kind == p.VAR_KEYWORD:
            for k, v in bound.arguments.get(p.name, {}).items():
                names.append(k)
                flat.append(v)
        elif p.name in kwargs:
            _check_tensor_param(path, p, f"{kw_what}['{p.name}']")
            names.append(p.name)
            flat.append(kwargs[p.name])
    return names, tuple(flat), n_pos


def _check_output_names(path: str, names) -> list[str]:
    if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) and n for n in names):
        raise ModelFileError(f"{path}: output_names() returned {names!r}, expected a list of non-empty strings")
    if len(set(names)) != len(names):
        raise ModelFileError(f"{path}: output_names() returned duplicate names {list(names)}")
    return list(names)


def _check_pad_values(path: str, values, input_names: list[str]) -> dict[str, float]:
    if not isinstance(values, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                               for v in values.values()):
        raise ModelFileError(f"{path}: pad_values() returned {values!r}, expected {{input name: number}}")
    unknown = sorted(set(values) - set(input_names))
    if unknown:
        raise ModelFileError(f"{path}: pad_values() names {unknown}, which are not inputs; the inputs are "
                             f"{input_names}")
    return {k: float(v) for k, v in values.items()}


def _check_tolerance(path: str, tol) -> dict[str, float]:
    if isinstance(tol, (tuple, list)) and len(tol) == 2:
        tol = {"atol": tol[0], "rtol": tol[1]}
    if (not isinstance(tol, dict) or set(tol) != {"atol", "rtol"}
            or not all(isinstance(v, (int, float)) and v >= 0 for v in tol.values())):
        raise ModelFileError(f"{path}: tolerance() returned {tol!r}, expected {{'atol': float, 'rtol': float}} "
                             f"with non-negative values")
    return {"atol": float(tol["atol"]), "rtol": float(tol["rtol"])}
