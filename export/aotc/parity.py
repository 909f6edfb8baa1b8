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

_ODD_OFFSET = 36  # lo + 36 is odd when lo is odd: a size that is neither a power of two nor a bound
_CAP = 4096       # dims with no finite upper bound are checked up to here


def _odd_between(lo: int, hi: int) -> int | None:
    """An odd size strictly inside (lo, hi): lo+36 or lo+37 when it fits, else the odd one near the middle."""
    v = lo + _ODD_OFFSET + (lo + 1) % 2
    if v >= hi:
        v = (lo + hi) // 2
        v -= 1 - v % 2
    return v if lo < v < hi else None


def _size_plan(lo: int, hi: int) -> list[tuple[str, int]]:
    hi = min(hi, max(_CAP, lo))
    plan = [("min", lo), ("max", hi)]
    odd = _odd_between(lo, hi)
    if odd is not None:
        plan.append(("odd", odd))
    return plan


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
        if s["shape"] and s["shape"][0] == -1:
            return tuple(s["ranges"][0])
    return None


def _sym_range(expr, rc):
    from torch.utils._sympy.value_ranges import bound_sympy

    vr = rc[expr] if expr in rc else bound_sympy(expr, rc)
    lo = int(vr.lower) if vr.lower.is_finite else 0
    return lo, (int(vr.upper) if vr.upper.is_finite else None)


def _random_like(x, shape, gen):
    import torch

    if x.dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if x.is_floating_point():
        ref = x.detach().float().cpu()
        mean, std = (ref.mean().item(), ref.std().item()) if ref.numel() > 1 else (0.0, 1.0)
        return (torch.randn(shape, generator=gen) * (std or 1.0) + mean).to(x.dtype)
    lo, hi = (int(x.min()), int(x.max())) if x.numel() else (0, 1)
    return torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int64).to(x.dtype)


def _generic_inputs(ep, inputs, label: str, gen):
    """Random inputs with every dynamic symbol at its min/max/odd size (derived dims follow)."""
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
        plan = dict(_size_plan(lo, hi if hi is not None else _CAP))
        pick[sym] = plan.get(label, plan["max"])
    out = []
    for v, x in zip(vals, inputs):
        shape = [int(d.node.expr.subs(pick)) if isinstance(d, torch.SymInt) else int(d) for d in v.shape]
        out.append(_random_like(x, shape, gen).to(x.device))
    return tuple(out), ", ".join(f"{s}={n}" for s, n in pick.items())


def make_cases(mf, ep, model, inputs, ref, specs_in, device: str, dtype: str) -> list[dict]:
    """[{"label", "inputs", "ref", "inputs_outputs", "sample"}]: the example first, then fresh sizes."""
    import torch

    cases = [_case("example inputs", inputs, ref, sample=True)]
    dynamic = any(-1 in s["shape"] for s in specs_in)
    float_dtype = getattr(torch, exp.DTYPES[dtype])
    gen = torch.Generator().manual_seed(1234)
    batch = _batch_range(specs_in, ep) if getattr(mf.module, "make_inputs", None) else None
    if batch is not None:
        for label, b in _size_plan(*batch):
            fresh = tuple(exp.cast_input(x, device, float_dtype) for x in mf.make_inputs(b))
            cases.append(_case(f"fresh batch {b} ({label})", fresh, _eager(model, fresh, mf), label == "odd"))
    elif dynamic:
        for label in ("min", "max", "odd"):
            fresh, sizes = _generic_inputs(ep, inputs, label, gen)
            if any(c["label"].endswith(f"({sizes})") for c in cases):
                continue  # e.g. no odd size fits a narrow range
            cases.append(_case(f"fresh {label} ({sizes})", fresh, _eager(model, fresh, mf), label == "odd"))
    else:
        fresh = tuple(_random_like(x, list(x.shape), gen).to(x.device) for x in inputs)
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


def compare(got, want, tol: dict) -> dict:
    """{"max_abs", "max_rel", "ok"} for one output; NaN matches NaN, shapes must agree."""
    import torch

    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return {"max_abs": float("inf"), "max_rel": float("inf"), "ok": False,
                "note": f"got {got.dtype}{list(got.shape)}, eager gave {want.dtype}{list(want.shape)}"}
    a, b = got.detach().cpu().double(), want.detach().cpu().double()
    both_nan = torch.isnan(a) & torch.isnan(b)
    diff = torch.where(both_nan | (a == b), torch.zeros_like(a), (a - b).abs())
    diff = torch.nan_to_num(diff, nan=float("inf"))
    within = (diff <= tol["atol"] + tol["rtol"] * b.abs()) | both_nan | (a == b)  # a == b: same infinities
    ok = bool(within.all()) if diff.numel() else True
    max_abs = float(diff.max()) if diff.numel() else 0.0
    rel = diff / b.abs().clamp_min(1e-12)
    significant = (b.abs() > tol["atol"]) & ~both_nan
    max_rel = float(rel[significant].max()) if bool(significant.any()) else 0.0
    return {"max_abs": max_abs, "max_rel": max_rel, "ok": ok}


def static_case(graph: dict, inputs, ref) -> dict:
    """The parity case of a static graph ({"batch", "graph"} of the manifest's static_graphs): run through
    that graph, and kept as a sample for the runtime's self-check."""
    return dict(_case(f"static graph {graph['graph']}", inputs, ref, sample=True), graph=graph["graph"])


def check(path: str, cases: list[dict], tol: dict, device: str, weights: dict | None = None) -> list[dict]:
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
        errors = {name: compare(o, r, tol) for name, o, r in zip(runner.output_names, outs, case["ref"])}
        ok = len(outs) == len(case["ref"]) and all(e["ok"] for e in errors.values())
        results.append({"label": case["label"], "ok": ok, "errors": errors})
    return results
