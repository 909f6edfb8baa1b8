"""Stage 2: run the model eagerly (the reference) and capture it with torch.export.

This module places the model and inputs on the device and dtype asked for, computes the eager outputs,
builds the dynamic_shapes (the file's own, or `--dynamic-batch` on dim 0 of every input), and turns
torch.export's failures into one ExportError that names the cause and the fix. It does not compile.
Pure functions of their arguments; torch.export itself is not thread-safe, so call from one thread.
"""

from __future__ import annotations

import contextlib
import re

from aotc.errors import ExportError, ModelFileError, NoAttentionKernel

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def prepare(mf, device: str, dtype: str):
    """Moves/casts the model and example inputs; returns (model, inputs). Float inputs take `dtype`."""
    import torch

    target = getattr(torch, DTYPES[dtype])
    model = mf.model.to(device=device)
    if dtype != "fp32":
        model = model.to(dtype=target)
    inputs = tuple(cast_input(x, device, target) for x in mf.example_inputs)
    return model, inputs


def cast_input(x, device: str, float_dtype):
    x = x.to(device=device)
    if x.is_floating_point() and float_dtype is not None and x.dtype != float_dtype:
        x = x.to(float_dtype)
    return x


def eager_outputs(model, inputs, mf) -> tuple:
    """Runs the model once with no grad; returns its outputs flattened to a tuple of tensors (names checked)."""
    return run_eager(model, inputs, mf)[1]


def run_eager(model, inputs, mf) -> tuple[list[str], tuple]:
    """(output names, flat output tensors) of one eager run on flat `inputs`: the names are the file's
    output_names(), else each leaf's key path in forward's output (output_leaves)."""
    import torch

    with torch.no_grad():
        try:
            out = mf.call(model, inputs)
        except Exception as e:
            bound = ", ".join(f"{n}=[{', '.join(map(str, x.shape))}] {str(x.dtype).removeprefix('torch.')}"
                              for n, x in zip(mf.input_names, inputs))
            # an input bound to the wrong parameter typically fails as an attribute or type error inside
            hint = ("; give inputs by name with example_kwargs() when a position is not the parameter meant"
                    if isinstance(e, (AttributeError, TypeError)) and mf.n_positional else "")
            raise ModelFileError(f"{mf.path}: running the model eagerly raised {type(e).__name__}: "
                                 f"{_first_line(e)} (forward got {bound}{hint})") from e
    names, outs = output_leaves(out, mf.path)
    if mf.output_names is not None:
        if len(mf.output_names) != len(outs):
            raise ModelFileError(f"{mf.path}: output_names() gives {len(mf.output_names)} names but the model "
                                 f"returns {len(outs)} outputs ({', '.join(names)})")
        names = list(mf.output_names)
    return names, outs


def flatten_outputs(out, path: str = "model") -> tuple:
    """forward's output (any pytree of tensors) as a flat tuple of tensors, in torch.export's order."""
    return output_leaves(out, path)[1]


def output_leaves(out, path: str = "model") -> tuple[list[str], tuple]:
    """(names, tensors) of the leaves of forward's output, flattened as torch.export flattens it: a tensor,
    tuples, lists, dicts, Hugging Face ModelOutputs, any registered pytree. Each leaf is named by its key path:
    `last_hidden_state` (a dict key or attribute), `encoder.0` (nested), `output0`, `output1` (the items of a
    top-level tuple, or a lone tensor). Raises ModelFileError for a leaf that is not a tensor."""
    import torch
    import torch.utils._pytree as pytree

    leaves, _ = pytree.tree_flatten_with_path(out)
    names, tensors = [], []
    for key_path, leaf in leaves:
        name = leaf_name(key_path)
        if leaf is None:  # torch.export keeps it as a constant output the compiled model has no tensor for
            raise ModelFileError(f"{path}: forward's output '{name}' is None, expected a tensor; leave it out of "
                                 f"what forward returns (a ModelOutput leaves its None fields out)")
        if not isinstance(leaf, torch.Tensor):
            raise ModelFileError(f"{path}: forward's output '{name}' is {type(leaf).__name__}, expected a tensor "
                                 f"(every leaf of the output -- a tensor, tuple, list, dict or ModelOutput -- must "
                                 f"be a tensor)")
        names.append(name)
        tensors.append(leaf)
    if not tensors:
        raise ModelFileError(f"{path}: forward returned {type(out).__name__} with no tensors in it, expected a "
                             f"tensor, or a tuple, list, dict or ModelOutput of tensors")
    if len(set(names)) != len(names):
        raise ModelFileError(f"{path}: forward's outputs {names} do not have distinct names; name them with "
                             f"output_names()")
    return names, tuple(tensors)


def leaf_name(key_path) -> str:
    """An output leaf's key path as a name: dict keys and attributes joined by '.', sequence items by their
    index; a top-level sequence's item i is `output<i>`."""
    from torch.utils._pytree import GetAttrKey, MappingKey, SequenceKey

    if not key_path:
        return "output0"
    parts = []
    for k in key_path:
        if isinstance(k, MappingKey):
            parts.append(str(k.key))
        elif isinstance(k, SequenceKey):
            parts.append(str(k.idx))
        elif isinstance(k, GetAttrKey):
            parts.append(k.name)
        else:
            parts.append(str(k))
    if isinstance(key_path[0], SequenceKey):
        parts[0] = f"output{parts[0]}"
    return ".".join(parts)


def dynamic_shapes_for(mf, inputs, dynamic_batch: tuple[int, int] | None):
    """The file's dynamic_shapes, with `--dynamic-batch MIN:MAX` (if given) put on dim 0 of every input;
    MIN == MAX makes dim 0 static."""
    import torch

    if dynamic_batch is None:
        return mf.dynamic_shapes
    lo, hi = dynamic_batch
    sizes = {x.shape[0] if x.dim() else None for x in inputs}
    if len(sizes) != 1 or None in sizes:
        raise ExportError(f"--dynamic-batch needs every input to have the same dim 0, got shapes "
                          f"{[list(x.shape) for x in inputs]}; declare dynamic_shapes() in the model file instead")
    size = sizes.pop()
    if not lo <= size <= hi:
        raise ExportError(f"--dynamic-batch {lo}:{hi} does not contain the example batch size {size}; "
                          f"widen the range or change example_inputs()")
    # MIN == MAX: a static batch of that size (torch.export.Dim refuses min == max)
    batch = torch.export.Dim("batch", min=lo, max=hi) if lo < hi else None
    base = mf.dynamic_shapes
    out = {}
    for i, name in enumerate(mf.input_names):
        spec = base.get(name) if isinstance(base, dict) else (base[i] if base is not None else None)
        spec = dict(enumerate(spec)) if isinstance(spec, (tuple, list)) else dict(spec or {})
        spec[0] = batch
        out[name] = spec
    return out


SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "math": "MATH"}


@contextlib.contextmanager
def attention_backend(name: str | None):
    """scaled_dot_product_attention limited to one kernel (a key of SDPA_BACKENDS) for what runs inside: the
    eager reference, torch.export, and the decompositions of the graph report and of AOTInductor, which is
    where the kernel is picked. None: PyTorch's choice. A kernel that cannot take the model's attention
    inputs is a NoAttentionKernel (an ExportError) that says so."""
    if not name:
        yield
        return
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[name])):
            yield
    except Exception as e:
        if "No viable backend" in str(e) or "No available kernel" in str(e):
            raise NoAttentionKernel(f"--sdpa-backend {name}: PyTorch has no {name} attention kernel for this "
                                    f"model's attention inputs here (device, dtype or head size; torch "
                                    f"{torch.__version__}); leave the option out or pick another of "
                                    f"{', '.join(SDPA_BACKENDS)}") from e
        raise


def export_model(model, inputs, dynamic_shapes, strict: bool, input_names: list[str], quiet: bool = True,
                 positional: int | None = None):
    """torch.export with the failure explained; returns the ExportedProgram. `inputs` are flat, the first
    `positional` by position (None: all), the rest by name (ModelFile.args_kwargs). quiet: swallow what torch
    prints while it fails (graph dumps); --verbose shows it."""
    import contextlib
    import io

    import torch

    n = len(inputs) if positional is None else positional
    args, kwargs = tuple(inputs[:n]), dict(zip(input_names[n:], inputs[n:]))
    ds = dynamic_shapes
    if isinstance(ds, (tuple, list)) and kwargs:
        ds = dict(zip(input_names, ds))
    if isinstance(ds, dict):
        # torch.export keys a dict by forward's parameter names; keep only those given
        ds = {n: ds.get(n) for n in input_names}
    sink = io.StringIO()
    muted = (contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink)) if quiet else ()
    try:
        with contextlib.ExitStack() as stack:
            for m in muted:
                stack.enter_context(m)
            return torch.export.export(model, args, kwargs or None, dynamic_shapes=ds, strict=strict)
    except Exception as e:
        raise ExportError(explain_export_failure(e)) from e


_LOG_NOISE = re.compile(r"\s+")


def explain_export_failure(e: BaseException) -> str:
    """One line: what torch.export objected to, and the usual fix."""
    text = str(e)
    name = type(e).__name__
    first = _first_line(e)
    if "data-dependent" in text or "GuardOnDataDependentSymNode" in name or "DataDependent" in name:
        where = _user_frame(text)
        return (f"export failed: data-dependent control flow{where} (a Python branch or shape on a tensor's "
                f"value); fix: use torch.cond for the branch, or torch._check(...) to state the assumption")
    if ("Constraints violated" in text or "specialized" in text or "ConstraintViolation" in name
            or "constraint" in first.lower()):
        fix = _suggested_fix(text)
        why = re.search(r"Not all values of (.+?) in the specified range (.+?) satisfy the generated guard (.+?)\.?\n",
                        text + "\n")
        cause = (f"{why.group(1)} in {why.group(2)} must satisfy {why.group(3).strip()}" if why
                 else _squash(first))
        remedy = (f"declare `{fix}` in dynamic_shapes(), or narrow the Dim range" if fix
                  else "narrow the Dim range, or mark the dim static")
        return f"export failed: the model does not work for every size in the declared dynamic range: {cause}; " \
               f"fix: {remedy}"
    if "Could not run" in text or "NotImplementedError" in name or "no fake" in text.lower() \
            or "meta" in first.lower():
        return (f"export failed: an operator cannot be traced ({_squash(first)}); fix: replace it with "
                f"supported torch ops, or register a fake/meta kernel for a custom op")
    if "Unsupported" in name or "dynamo" in type(e).__module__:
        return (f"export failed in strict mode: {_squash(first)}; fix: rerun without --strict, or rewrite "
                f"the unsupported Python construct")
    return f"export failed: {name}: {_squash(first)}; rerun with --verbose for the full trace"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _squash(s: str, limit: int = 240) -> str:
    s = _LOG_NOISE.sub(" ", s).strip()
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _suggested_fix(text: str) -> str:
    """torch's 'Suggested fixes:' block as one line ('a = Dim(...); b = 2*a')."""
    m = re.search(r"Suggested fixes:\s*\n((?:[ \t]+\S.*\n?)+)", text)
    return "; ".join(line.strip() for line in m.group(1).splitlines() if line.strip()) if m else ""


def _user_frame(text: str) -> str:
    m = re.search(r'File "([^"]+)", line (\d+)', text)
    return f" at {m.group(1)}:{m.group(2)}" if m else ""
