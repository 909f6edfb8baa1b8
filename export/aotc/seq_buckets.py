"""Sequence-length buckets: `aotc export MODEL.py --seq-buckets INPUT:AXIS[,INPUT:AXIS...]=N,N,...`.

The package holds a graph with the sequence dim static at each size N (static shapes run faster than a
dynamic dim, and on CUDA they let every graph be captured). A call of length l runs in the smallest size >= l:
its inputs padded along the dim with their pad values (0 unless the model file's `pad_values()` says), its
per-token outputs cut back to l. `parse` reads the flag, `plan` checks it against the exported program and
finds which outputs carry the dim, `narrow` limits the package's range to the largest size, and `pad`,
`length_of` and `cut` are the rule every runner follows (aotc.loader here; runtime_cpp/src/seq_buckets.cpp in
the C++ runtime and server). The parity cases at padded lengths, and the refusal of a model whose answer
depends on the padding, are aotc.parity's. No state; thread-safe.
"""

from __future__ import annotations

import dataclasses

from aotc.errors import ExportError, InputError
from aotc.manifest import SeqBuckets, TensorEntry


@dataclasses.dataclass(frozen=True)
class SeqRequest:
    """What --seq-buckets asks for: the inputs (name -> axis) that carry the sequence dim, and the sizes."""
    inputs: dict
    sizes: tuple[int, ...]

    def shown(self) -> str:
        return ",".join(f"{k}:{v}" for k, v in self.inputs.items()) + "=" + ",".join(map(str, self.sizes))


def parse(text: str) -> SeqRequest:
    """`input_ids:1,attention_mask:1=32,64,128` -> SeqRequest. Raises ExportError saying what was expected."""
    expected = ("expected INPUT:AXIS[,INPUT:AXIS...]=N,N,... with AXIS the sequence dim of each input and "
                "N the bucket sizes, e.g. input_ids:1,attention_mask:1=32,64,128")
    left, sep, right = text.partition("=")
    inputs = {}
    for item in left.split(",") if sep else ():
        name, colon, axis = item.strip().rpartition(":")
        if not colon or not name or not axis.strip().lstrip("-").isdigit():
            raise ExportError(f"--seq-buckets {text!r}: {item.strip()!r} is not INPUT:AXIS; {expected}")
        if name in inputs:
            raise ExportError(f"--seq-buckets {text!r}: input '{name}' is named twice")
        inputs[name] = int(axis)
    try:
        sizes = tuple(sorted({int(n) for n in right.split(",")}))
    except ValueError:
        sizes = ()
    if not inputs or not sizes or sizes[0] < 1:
        raise ExportError(f"--seq-buckets {text!r}: {expected}")
    return SeqRequest(inputs, sizes)


def plan(req: SeqRequest, ep, input_names: list[str], output_names: list[str], specs_in: list[TensorEntry],
         dims: dict, pad_values: dict | None) -> SeqBuckets:
    """The manifest's seq_buckets (which graphs run on "model"'s weights not yet known) for `req`, checked against the exported program: each
    named input exists and its axis is one free dynamic dim shared by all of them and by no other input, every
    size lies in the dim's range, and an output carries the dim at most at one axis, as the dim itself (not an
    expression of it). Raises ExportError naming what is wrong."""
    import torch
    from torch.export.graph_signature import OutputKind

    flag = f"--seq-buckets {req.shown()}"
    by_name = {s.name: s for s in specs_in}
    symbol, axes = None, {}
    for name, axis in req.inputs.items():
        spec = by_name.get(name)
        if spec is None:
            raise ExportError(f"{flag}: the model has no input '{name}'; its inputs are {input_names}")
        rank = len(spec.shape)
        if not -rank <= axis < rank:
            raise ExportError(f"{flag}: input '{name}' has {rank} dims {list(spec.shape)}, no axis {axis}")
        axis %= rank
        sym = (spec.symbols or (None,) * rank)[axis]
        if sym is None:
            raise ExportError(f"{flag}: input '{name}' dim {axis} is static ({spec.shape[axis]}) in the export; "
                              f"declare it dynamic in dynamic_shapes() (a Dim whose range holds the buckets)")
        if sym not in dims:
            raise ExportError(f"{flag}: input '{name}' dim {axis} is '{sym}', derived from other dims; bucket "
                              f"the dim it is derived from")
        if symbol is not None and sym != symbol:
            raise ExportError(f"{flag}: input '{name}' dim {axis} is '{sym}', but the other inputs named have "
                              f"'{symbol}'; the inputs of one --seq-buckets share one dim")
        symbol, axes[name] = sym, axis
    for spec in specs_in:
        if spec.name not in axes and symbol in (spec.symbols or ()):
            raise ExportError(f"{flag}: input '{spec.name}' dim {list(spec.symbols).index(symbol)} is '{symbol}' "
                              f"too; name it as well ({spec.name}:{list(spec.symbols).index(symbol)}), so that "
                              f"it is padded with the others")
    lo, hi = dims[symbol]
    outside = [n for n in req.sizes if not lo <= n <= hi]
    if outside:
        raise ExportError(f"{flag}: sizes {outside} lie outside dim '{symbol}''s range [{lo}, {hi}]")

    # the program's own symbol for the dim, to find it among the outputs' sizes
    nodes = {n.name: n for n in ep.graph.nodes}
    first = next(iter(axes))
    sym_expr = nodes[ep.graph_signature.user_inputs[input_names.index(first)]].meta["val"].shape[axes[first]].node.expr
    out_nodes = [s.arg.name for s in ep.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    outputs = {}
    for name, node in zip(output_names, out_nodes):
        val = nodes[node].meta["val"]
        found = []
        for d, size in enumerate(val.shape):
            if isinstance(size, torch.SymInt) and sym_expr in size.node.expr.free_symbols:
                if size.node.expr != sym_expr:
                    raise ExportError(f"{flag}: output '{name}' dim {d} is {size.node.expr}, an expression of the "
                                      f"sequence dim; only an output whose dim is the sequence length itself can "
                                      f"be cut back to a request's length")
                found.append(d)
        if len(found) > 1:
            raise ExportError(f"{flag}: output '{name}' has the sequence dim at axes {found}; cutting it back "
                              f"is defined for one axis only")
        if found:
            outputs[name] = found[0]
    pads = {name: float((pad_values or {}).get(name, 0)) for name in axes}
    return SeqBuckets(dim=symbol, sizes=req.sizes, inputs=axes, outputs=outputs, pad_values=pads,
                      graphs={n: graph_name(req.sizes, n) for n in req.sizes})


def graph_name(sizes: tuple[int, ...], size: int, batch: int | None = None) -> str:
    """The AOTInductor model name of the graph static at `size` of the buckets `sizes` (and at `batch`): the
    largest size's graph with a dynamic batch is the package's main one, "model". AOTInductor's loader takes a
    graph's files by name prefix; the "_static" suffix keeps every name from being a prefix of another."""
    if batch is None:
        return "model" if size == sizes[-1] else f"seq{size}_static"
    return f"seq{size}_batch{batch}_static"


def narrow(entries: list[TensorEntry], axes: dict, seq: SeqBuckets) -> list[TensorEntry]:
    """The manifest entries with the sequence axis ranging up to the largest size only."""
    out = []
    for e in entries:
        if e.name in axes:
            ranges = list(e.ranges)
            lo, _ = ranges[axes[e.name]]
            ranges[axes[e.name]] = (lo, seq.sizes[-1])
            e = dataclasses.replace(e, ranges=tuple(ranges))
        out.append(e)
    return out


def static_shapes(ds, inputs, input_names: list[str], seq: SeqBuckets):
    """torch.export dynamic_shapes (the file's form: by name or by position) for flat `inputs`, with the
    sequence axis of every bucketed input made static."""
    per_input = ds if isinstance(ds, dict) else dict(zip(input_names, ds or ()))
    out = {}
    for name, x in zip(input_names, inputs):
        spec = per_input.get(name)
        spec = dict(enumerate(spec)) if isinstance(spec, (tuple, list)) else dict(spec or {})
        if name in seq.inputs:
            spec = {d: v for d, v in spec.items() if d % x.dim() != seq.inputs[name]}
        out[name] = spec or None
    return out


def length_of(inputs, input_names: list[str], seq: SeqBuckets) -> int:
    """The sequence length of flat `inputs` (manifest order). Raises InputError when the bucketed inputs
    disagree."""
    lengths = {n: int(x.shape[seq.inputs[n]]) for n, x in zip(input_names, inputs) if n in seq.inputs}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"'{n}' {v}" for n, v in lengths.items())
        raise InputError(f"inputs disagree on the sequence length (dim '{seq.dim}'): {shown}; they must be equal")
    return next(iter(lengths.values()))


def pad(inputs, input_names: list[str], seq: SeqBuckets, size: int) -> tuple:
    """`inputs` with each bucketed input padded at the end of its sequence axis up to `size`."""
    import torch

    out = []
    for name, x in zip(input_names, inputs):
        axis = seq.inputs.get(name)
        if axis is not None and x.shape[axis] < size:
            shape = list(x.shape)
            shape[axis] = size - x.shape[axis]
            x = torch.cat([x, torch.full(shape, seq.pad_values.get(name, 0), dtype=x.dtype, device=x.device)], axis)
        out.append(x)
    return tuple(out)


def resize(inputs, input_names: list[str], seq: SeqBuckets, size: int) -> tuple:
    """`inputs` at sequence length `size`: padded (pad) or cut to its first `size` positions."""
    inputs = pad(inputs, input_names, seq, size)
    return tuple(x.narrow(seq.inputs[n], 0, size).contiguous() if n in seq.inputs else x
                 for n, x in zip(input_names, inputs))


def cut(outputs, output_names: list[str], seq: SeqBuckets, length: int) -> list:
    """Each per-token output cut back to the first `length` positions of its sequence axis."""
    return [o.narrow(seq.outputs[n], 0, length) if n in seq.outputs else o for n, o in zip(output_names, outputs)]


def bucket_lengths(seq: SeqBuckets, lo: int) -> list[tuple[int, int]]:
    """[(size, a length that pads to it)] for every bucket with room below it: an odd length halfway between
    the bucket below (or the dim's min) and it, so that parity runs every bucket's graph on a padded call."""
    out, below = [], lo - 1
    for size in seq.sizes:
        if size - below >= 2:
            out.append((size, min(size - 1, (below + size) // 2 | 1)))
        below = size
    return out
