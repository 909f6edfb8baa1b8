"""Fresh inputs across a model's dynamic range: the one generator behind the export's parity, `aotc check PKG`
and `aotc check --url`.

The dynamic dims come as tensor specs (aotc_client.specs.TensorSpec: each dynamic dim's symbol, a name such
as `seq` or an expression such as `2*batch` for a derived dim) and the free dims' ranges; the sizes to run
are aotc_client.specs.case_plan's (every dim at its min, max and an odd size, together and apart). A model
file with `make_inputs` builds each case itself from the sizes of the dims its parameters are named after
(`make_inputs(batch, seq)`); the other dims follow from what it makes (jagged ids, derived lengths), so they
are not varied on their own. Without `make_inputs`, inputs are random tensors drawn like the examples, every
dim sized by its symbol. Ranges come from the inputs only, never from an output (whose size the data may
decide). Not a comparer (aotc_client.compare) and not a runner. Uses a private RNG; no state between calls.
"""

from __future__ import annotations

from aotc_client.specs import TensorSpec, case_plan, is_name, shape_for, symbol_ranges


def example_sizes(specs: list[TensorSpec], examples) -> dict[str, int]:
    """{symbol: size} of the free dims in the example inputs."""
    out = {}
    for s, x in zip(specs, examples):
        for i in range(len(s.shape)):
            sym = s.symbol(i)
            if sym and is_name(sym) and i < len(x.shape):
                out.setdefault(sym, int(x.shape[i]))
    return out


def plan(mf, specs: list[TensorSpec], dims: dict | None = None) -> tuple[list[tuple[str, dict]], list[str]]:
    """(case_plan's [(label, {dim: size})] over the dims the generator can choose, the dims it cannot vary).
    `dims`: {name: (min, max)} of the free dims (a manifest's), else taken from the specs' ranges."""
    ranges = dict(dims) if dims else symbol_ranges(specs)
    params = mf.size_params
    if params is None:
        chosen = ranges
    else:
        wanted = set(params.values())
        if "batch" in wanted and "batch" not in ranges:
            # make_inputs(batch) of a model whose batch Dim has another name: dim 0 of every input, if one dim
            first = {s.symbol(0) for s in specs if s.shape and s.shape[0] == -1}
            if len(first) == 1 and all(s.shape and s.shape[0] == -1 for s in specs) and first <= set(ranges):
                ranges = {("batch" if k in first else k): v for k, v in ranges.items()}
        chosen = {k: v for k, v in ranges.items() if k in wanted}
    example = example_sizes(specs, mf.example_inputs)
    if "batch" in ranges and "batch" not in example and mf.example_inputs and mf.example_inputs[0].dim():
        example["batch"] = int(mf.example_inputs[0].shape[0])
    return case_plan(chosen, example), sorted(set(ranges) - set(chosen))


def fresh_cases(mf, specs: list[TensorSpec], dims: dict | None, examples, cast=lambda x: x,
                seed: int = 1234) -> tuple[list[tuple[str, tuple]], list[str]]:
    """([(label, flat inputs)], the dims not varied): the inputs of every case of `plan`, labelled with their
    sizes by name, e.g. "fresh min (batch=1, seq=8)", "fresh seq max (batch=4, seq=512)". `examples`: the
    example inputs as the model takes them (cast), which random inputs are drawn like; `cast` is applied to
    what make_inputs makes."""
    import torch

    cases, unvaried = plan(mf, specs, dims)
    gen = torch.Generator().manual_seed(seed)
    base = example_sizes(specs, examples)
    out = []
    for label, sizes in cases:
        shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
        out.append((f"fresh {label} ({shown})", inputs_at(mf, specs, examples, base, sizes, cast, gen)))
    return out, unvaried


def inputs_at(mf, specs: list[TensorSpec], examples, base: dict, sizes: dict, cast, gen) -> tuple:
    """Flat inputs with the dims of `sizes` at those sizes (by name), the others at `base`'s (example_sizes):
    from the file's make_inputs where it has one, else random like `examples`."""
    if mf.size_params is not None:
        return tuple(cast(x) for x in mf.make_inputs(**sizes))
    full = {**base, **sizes}
    return tuple(random_like(x, shape_for(s, full), gen).to(x.device) for s, x in zip(specs, examples))


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
