"""The dynamic dims of a model file: its dynamic_shapes() checked against the example inputs, the names of its
Dims (a derived dim's root among them) and their sizes in the examples, which make_inputs(batch, seq, ...) is
called with. Functions of a loaded model file (load_model.ModelFile); no state, safe from any thread.
"""

from __future__ import annotations

from aotc.errors import ModelFileError


def dim_names(mf) -> dict[str, tuple[int, int] | None]:
    """{name: (min, max) or None} of the Dims in the file's dynamic_shapes() (a derived dim's root included)."""
    out = {}
    for spec in per_input(mf).values():
        for d in spec.values():
            d = getattr(d, "root", d)  # a derived dim (2*batch): its root
            n = getattr(d, "__name__", None)
            if n and n.isidentifier():
                lo, hi = getattr(d, "min", None), getattr(d, "max", None)
                out[n] = (lo, hi) if isinstance(lo, int) and isinstance(hi, int) else None
    return out


def example_sizes(mf) -> dict[str, int]:
    """{dim name: its size in the example inputs} for the Dims of dynamic_shapes() (a derived dim's root solved
    from it), and `batch` (dim 0 of the first input) when no Dim has that name."""
    out = {}
    for name, x in zip(mf.input_names, mf.example_inputs):
        for d, dim in per_input(mf).get(name, {}).items():
            if not -x.dim() <= d < x.dim():
                continue
            size = int(x.shape[d])
            root = getattr(dim, "root", None)
            if root is not None and getattr(root, "__name__", "").isidentifier():
                solved = _solve(dim.fn, size, getattr(root, "min", 0), getattr(root, "max", size))
                if solved is not None:
                    out.setdefault(root.__name__, solved)
            elif getattr(dim, "__name__", "").isidentifier():
                out.setdefault(dim.__name__, size)
    if "batch" not in out and mf.example_inputs and mf.example_inputs[0].dim():
        out["batch"] = int(mf.example_inputs[0].shape[0])
    return out


def _solve(fn, size: int, lo, hi) -> int | None:
    """The root value v in [lo, hi] with fn(v) == size, for an increasing fn (torch's derived dims are)."""
    lo = lo if isinstance(lo, int) else 0
    hi = hi if isinstance(hi, int) and hi < 2**31 else max(size, lo)
    while lo < hi:
        mid = (lo + hi) // 2
        if fn(mid) < size:
            lo = mid + 1
        else:
            hi = mid
    return lo if fn(lo) == size else None


def per_input(mf) -> dict[str, dict]:
    ds = mf.dynamic_shapes
    given = ds if isinstance(ds, dict) else dict(zip(mf.input_names, ds or ()))
    out = {}
    for name, spec in given.items():
        spec = dict(enumerate(spec)) if isinstance(spec, (tuple, list)) else dict(spec or {})
        out[name] = {d: v for d, v in spec.items() if v is not None and not isinstance(v, int)}
    return out


def check_dynamic_shapes(mf, ds):
    """Checks torch.export's dynamic_shapes form against the inputs; returns it unchanged."""
    if ds is None:
        return None
    names = mf.input_names
    if isinstance(ds, dict):
        unknown = [k for k in ds if k not in names]
        if unknown:
            raise ModelFileError(f"{mf.path}: dynamic_shapes() names input '{unknown[0]}', but forward's inputs "
                                 f"are {names}; key it by those names")
        given = [ds.get(n) for n in names]
    elif isinstance(ds, (tuple, list)):
        if len(ds) != len(names):
            raise ModelFileError(f"{mf.path}: dynamic_shapes() has {len(ds)} entries for {len(names)} inputs "
                                 f"{names}; give one per input (None for a static input)")
        given = list(ds)
    else:
        raise ModelFileError(f"{mf.path}: dynamic_shapes() returned {type(ds).__name__}, expected a dict keyed "
                             f"by input name, e.g. {{'x': {{0: Dim('batch', min=1, max=1024)}}}}")
    for name, spec, x in zip(names, given, mf.example_inputs):
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
