"""Parity of an exported package against eager PyTorch, on the example inputs and across the dynamic range.

`make_cases` builds the inputs to check and their eager outputs before compiling (so they can also be
stored as samples): the example inputs, then fresh inputs at the smallest, the largest and an odd size of
every dynamic dim. Fresh inputs come from the model file's `make_inputs(batch)` when it has one (inputs
that depend on each other, e.g. offsets), otherwise from random tensors shaped and scaled like the
examples. `check` loads the package through aotc.loader and compares within `abs(a-b) <= atol + rtol*|b|`.
Not a benchmark. Uses a private RNG; safe to call from one thread at a time (eager models may not be).
"""

from __future__ import annotations

from aotc import export as exp
from aotc_client.compare import Comparison, compare_array
from aotc_client.specs import size_plan


def _batch_range(specs_in: list[dict], ep) -> tuple[int, int] | None:
    """The range of the leading dim of the first output, else of the first input with a dynamic dim 0."""
    outs = [s for s in ep.graph_signature.output_specs]
    nodes = {n.name: n for n in ep.graph.nodes}
    import torch

    for spec in outs[:1]:
        val = nodes[spec.arg.name].meta.get("val") if hasattr(spec.arg, "name") else None
        if isinstance(val, torch.Tensor) and val.dim() and isinstance(val.shape[0], torch.SymInt):
            lo, hi = _sym_range(val.shape[0].node.expr, ep.range_constraints)
            if hi is not None:
                return lo, hi
    for s in specs_in:
        if s.shape and s.shape[0] == -1:
            return tuple(s.ranges[0])
    return None


def _sym_range(expr, rc):
    from torch.utils._sympy.value_ranges import bound_sympy

    vr = rc[expr] if expr in rc else bound_sympy(expr, rc)
    lo = int(vr.lower) if vr.lower.is_finite else 0
    return lo, (int(vr.upper) if vr.upper.is_finite else None)


def random_like(x, shape, gen):
    """Random values shaped `shape`, drawn like the tensor `x` (its integer range, its float mean and std)."""
    import torch

    if x.dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if x.is_floating_point():
        ref = x.detach().float().cpu()
        mean, std = (ref.mean().item(), ref.std().item()) if ref.numel() > 1 else (0.0, 1.0)
        return (torch.randn(shape, generator=gen) * (std or 1.0) + mean).to(x.dtype)
    lo, hi = (int(x.min()), int(x.max())) if x.numel() else (0, 1)
    return torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int64).to(x.dtype)


def _generic_inputs(ep, inputs, label: str, gen, names: dict):
    """Random inputs with every dynamic symbol at its min/max/odd size (derived dims follow), and the sizes
    picked as "batch=1, seq=8" (`names`: symbol -> the name a user knows it by, _dim_names)."""
    import torch

    nodes = {n.name: n for n in ep.graph.nodes}
    vals = [nodes[n].meta["val"] for n in ep.graph_signature.user_inputs]
    symbols = {}
    for v in vals:
        for d in v.shape:
            if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                symbols[d.node.expr] = None
    pick = {}
    for sym in symbols:
        lo, hi = _sym_range(sym, ep.range_constraints)
        plan = dict(size_plan(lo, hi if hi is not None else 2**63 - 1))
        pick[sym] = plan.get(label, plan["max"])
    out = []
    for v, x in zip(vals, inputs):
        shape = [int(d.node.expr.subs(pick)) if isinstance(d, torch.SymInt) else int(d) for d in v.shape]
        out.append(random_like(x, shape, gen).to(x.device))
    return tuple(out), ", ".join(f"{names.get(s, s)}={n}" for s, n in pick.items())


def _dim_names(mf, ep, batch: bool) -> dict:
    """{symbol: name} for the dynamic symbols of the program's inputs: "batch" for the shared dim 0 of a
    batched model, else the name of the model file's Dim (dynamic_shapes()), else "<input> dim <d>"."""
    import torch

    ds = mf.dynamic_shapes
    per_input = ds if isinstance(ds, dict) else dict(zip(mf.input_names, ds or ()))
    nodes = {n.name: n for n in ep.graph.nodes}
    names = {}
    for name, node in zip(mf.input_names, ep.graph_signature.user_inputs):
        dims = per_input.get(name)
        dims = dict(enumerate(dims)) if isinstance(dims, (tuple, list)) else dict(dims or {})
        for d, size in enumerate(nodes[node].meta["val"].shape):
            if not (isinstance(size, torch.SymInt) and size.node.expr.is_Symbol) or size.node.expr in names:
                continue
            dim = dims.get(d, dims.get(d - len(nodes[node].meta["val"].shape)))
            names[size.node.expr] = ("batch" if batch and d == 0 else getattr(dim, "__name__", None)
                                     or f"{name} dim {d}")
    return names


def make_cases(mf, ep, model, inputs, ref, specs_in, device: str, dtype: str, batched: bool) -> list[dict]:
    """[{"label", "inputs", "ref", "inputs_outputs", "sample"}]: the example first, then fresh sizes.
    `batched`: the manifest has a batch (dim 0 shared by every input and output)."""
    import torch

    cases = [_case("example inputs", inputs, ref, sample=True)]
    dynamic = any(-1 in s.shape for s in specs_in)
    float_dtype = getattr(torch, exp.DTYPES[dtype])
    gen = torch.Generator().manual_seed(1234)
    batch = _batch_range(specs_in, ep) if getattr(mf.module, "make_inputs", None) else None
    if batch is not None:
        for label, b in size_plan(*batch):
            fresh = tuple(exp.cast_input(x, device, float_dtype) for x in mf.make_inputs(b))
            cases.append(_case(f"fresh {label} (batch={b})", fresh, _eager(model, fresh, mf), label == "odd"))
    elif dynamic:
        names = _dim_names(mf, ep, batched)
        for label in ("min", "max", "odd"):
            fresh, sizes = _generic_inputs(ep, inputs, label, gen, names)
            if any(c["label"].endswith(f"({sizes})") for c in cases):
                continue  # e.g. no odd size fits a narrow range
            cases.append(_case(f"fresh {label} ({sizes})", fresh, _eager(model, fresh, mf), label == "odd"))
    else:
        fresh = tuple(random_like(x, list(x.shape), gen).to(x.device) for x in inputs)
        cases.append(_case("fresh inputs", fresh, _eager(model, fresh, mf), True))
    return cases


def _eager(model, inputs, mf):
    import torch

    with torch.no_grad():
        return exp.flatten_outputs(model(*inputs), mf.path)


def _case(label, inputs, ref, sample: bool) -> dict:
    cpu = lambda ts: tuple(t.detach().cpu() for t in ts)  # noqa: E731
    return {"label": label, "inputs": inputs, "ref": ref, "inputs_outputs": (cpu(inputs), cpu(ref)),
            "sample": sample}


def to_numpy(t):
    """A tensor as numpy for compare_array: on the host; bfloat16 (which numpy lacks) widened to float32."""
    import torch

    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def compare(name: str, got, want, tol) -> Comparison:
    """One output (a torch tensor) against eager's, by aotc's one parity rule (aotc_client.compare)."""
    return compare_array(name, to_numpy(got), to_numpy(want), tol.atol, tol.rtol)


def static_case(graph, inputs, ref) -> dict:
    """The parity case of a static graph (a manifest.StaticGraph): run through that graph, and kept as a
    sample for the runtime's self-check."""
    return dict(_case(f"static graph {graph.graph}", inputs, ref, sample=True), graph=graph.graph)


def check(path: str, cases: list[dict], tol, device: str, weights: dict | None = None) -> list[dict]:
    """Loads the package and compares it with eager on every case, each through its graph ("model" unless
    the case names a static graph). `weights` (by FQN, pipeline.weights_by_fqn of the main graph's program)
    are lent to the static graphs compiled without their own, as the runtime lends the main graph's."""
    from aotc.loader import load_package

    runners = {}
    results = []
    for case in cases:
        graph = case.get("graph", "model")
        if graph not in runners:
            runners[graph] = load_package(path, graph=graph, weights=weights)
        runner = runners[graph]
        outs = runner(*case["inputs"])
        errors = {name: compare(name, o, r, tol) for name, o, r in zip(runner.output_names, outs, case["ref"])}
        ok = len(outs) == len(case["ref"]) and all(e.ok for e in errors.values())
        results.append({"label": case["label"], "ok": ok, "errors": errors})
    return results
