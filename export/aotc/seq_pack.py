"""Packed sequences: `aotc export MODEL.py --seq-pack INPUT:AXIS[,INPUT:AXIS...]=P`.

Sequence buckets (aotc.seq_buckets) pad every request up to its bucket; where a batch's cost follows its
tokens, that padding is computed for nothing. A packed package instead runs rows of P tokens, each holding the
sequences of several requests one after the other ("segments"), the rest of a row filled with pad values. The
model file says how its model runs so, with `pack_model(model)`: an nn.Module whose forward takes each input
named in the flag as [R, P], then `segment_ids` [R, P] int64 (1, 2, ... for the segments of a row in order,
0 for the filler) and `position_ids` [R, P] int64 (each token's position in its own segment, 0 for the
filler), keeps the segments apart (attention within a segment only), and returns the model's outputs by the
same names, each with the row's tokens on axis 1: [R, P, ...]. A per-token output of the model ([B, L, ...])
is read back as each segment's tokens; an output without the sequence axis ([B, ...]) at the segment's first
token.

`parse` reads the flag; `packed_model_file` checks it against the model file and gives the model file the
export runs (the packed module, its example and fresh inputs packed, the batch dim counting rows);
`answer_changes` refuses a pack_model whose answers differ from the model's; `request_specs` gives the
tensors a request carries, for the manifest. `place`, `pack` and `unpack` are the rule (the server's twin is
runtime_cpp/server/pack.cpp): segments go longest first into the first row with room. Functions keep no
state; thread-safe.
"""

from __future__ import annotations

import dataclasses
import inspect
import types

from aotc.errors import ExportError, ModelFileError
from aotc.manifest import SeqPack, TensorEntry
from aotc.seq_buckets import SeqRequest
from aotc.seq_buckets import parse as parse_spec

SEGMENT, POSITION = "segment_ids", "position_ids"


def parse(text: str) -> SeqRequest:
    """`input_ids:1,attention_mask:1=128` -> SeqRequest with one size, the row length."""
    try:
        req = parse_spec(text)
    except ExportError as e:
        raise ExportError(str(e).replace("--seq-buckets", "--seq-pack").replace("N the bucket sizes",
                                                                                 "N the row length")) from None
    if len(req.sizes) != 1:
        raise ExportError(f"--seq-pack {text!r}: one row length is expected after '=', got {list(req.sizes)}; "
                          f"e.g. input_ids:1,attention_mask:1=128")
    return req


def place(lengths: list[int], size: int) -> list[tuple[int, int]]:
    """(row, offset) of each segment of `lengths` (each <= size) in rows of `size` tokens: the longest first,
    each into the first row with room, after what that row holds (first-fit decreasing)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    used: list[int] = []
    out: list[tuple[int, int]] = [(0, 0)] * len(lengths)
    for i in order:
        row = next((r for r, u in enumerate(used) if u + lengths[i] <= size), None)
        if row is None:
            row = len(used)
            used.append(0)
        out[i] = (row, used[row])
        used[row] += lengths[i]
    return out


def segments_of(requests: list[tuple]) -> list[tuple[int, int, int]]:
    """(request, row of it, length) of every segment: each row of each request is one, of the request's
    length (axis 1 of its first input)."""
    return [(q, b, int(ins[0].shape[1])) for q, ins in enumerate(requests) for b in range(int(ins[0].shape[0]))]


def pack(requests: list[tuple], size: int, pad_values: list[float]) -> tuple[tuple, list[tuple[int, int]]]:
    """The packed inputs of `requests` (each a tuple of [b, n] tensors, the packed inputs in order) -- those
    tensors as [R, size] rows, then segment_ids and position_ids -- and where each segment went (place)."""
    import torch

    segs = segments_of(requests)
    where = place([n for _, _, n in segs], size)
    rows = 1 + max(r for r, _ in where)
    first = requests[0]
    out = [torch.full((rows, size), pad, dtype=x.dtype, device=x.device) for x, pad in zip(first, pad_values)]
    segment = torch.zeros((rows, size), dtype=torch.int64, device=first[0].device)
    position = torch.zeros_like(segment)
    for (q, b, n), (row, off) in sorted(zip(segs, where), key=lambda s: s[1]):
        for t, x in zip(out, requests[q]):
            t[row, off:off + n] = x[b]
        segment[row, off:off + n] = int(segment[row].max()) + 1
        position[row, off:off + n] = torch.arange(n, device=position.device)
    return (*out, segment, position), where


def unpack(outputs, first: list[bool], requests: list[tuple], where: list[tuple[int, int]]) -> list[tuple]:
    """Each request's outputs from the packed ones ([R, P, ...]): its segments' tokens ([b, n, ...]) for a
    per-token output, their first tokens ([b, ...]) where `first` says so."""
    import torch

    segs = segments_of(requests)
    answers = []
    for q, ins in enumerate(requests):
        mine = [(b, n, w) for (r, b, n), w in zip(segs, where) if r == q]
        outs = []
        for o, at_first in zip(outputs, first):
            rows = [o[row, off] if at_first else o[row, off:off + n] for b, n, (row, off) in mine]
            outs.append(torch.stack(rows))
        answers.append(tuple(outs))
    return answers


def _seq_dims(mf, req: SeqRequest) -> tuple[str, tuple[int, int], tuple[int, int]]:
    """(the sequence dim's name, its range, the batch dim's range) from the model file's dynamic_shapes(),
    checked against the flag: every input named, each [B, L] with the sequence at axis 1."""
    from aotc.model_dims import per_input

    flag = f"--seq-pack {req.shown()}"
    missing = [n for n in mf.input_names if n not in req.inputs]
    unknown = [n for n in req.inputs if n not in mf.input_names]
    if unknown:
        raise ExportError(f"{flag}: the model has no input '{unknown[0]}'; its inputs are {mf.input_names}")
    if missing:
        raise ExportError(f"{flag}: input '{missing[0]}' is not named; packing puts every input's sequences in "
                          f"rows, so every input must carry the sequence dim and be named")
    dims = per_input(mf)
    seq = batch = None
    for name, x in zip(mf.input_names, mf.example_inputs):
        if x.dim() != 2 or req.inputs[name] % 2 != 1:  # axis 1 (or -1) of [B, L]
            raise ExportError(f"{flag}: input '{name}' is {list(x.shape)} with the sequence at axis "
                              f"{req.inputs[name]}; packing takes inputs of shape [batch, sequence]")
        d0, d1 = dims.get(name, {}).get(0), dims.get(name, {}).get(1)
        if d1 is None or d0 is None:
            raise ExportError(f"{flag}: input '{name}' needs dims 0 and 1 dynamic in dynamic_shapes() (Dims for "
                              f"the batch and the sequence), so that requests of any length and rows can come")
        seq, batch = (d1, d0) if seq is None else (seq, batch)
        if getattr(d1, "__name__", None) != getattr(seq, "__name__", None):
            raise ExportError(f"{flag}: input '{name}' dim 1 is '{getattr(d1, '__name__', d1)}', the other "
                              f"inputs' is '{seq.__name__}'; the inputs of one --seq-pack share one dim")
    lo, hi = getattr(seq, "min", 1), getattr(seq, "max", None)
    size = req.sizes[0]
    if not isinstance(hi, int):
        raise ExportError(f"{flag}: dim '{seq.__name__}' has no maximum; packing needs the longest a request may be")
    if size < lo:
        raise ExportError(f"{flag}: the row length {size} is shorter than dim '{seq.__name__}''s shortest sequence "
                          f"{lo}; a row must hold at least one request")
    # a request is at most as long as the dim allows and as a row; a row may be longer than any request
    return seq.__name__, (lo, min(size, hi)), (getattr(batch, "min", 1), getattr(batch, "max", 1))


@dataclasses.dataclass
class PackedModel:
    """A model file's pack_model and what packing its requests needs (packed_model_file)."""
    original: object          # the ModelFile as given
    mf: object                # the ModelFile the export runs
    req: SeqRequest
    seq_dim: str
    seq_range: tuple[int, int]     # what a request's length may be
    batch_range: tuple[int, int]   # the rows a call of the graph takes, and a request may have
    pad_values: list[float]        # per packed input

    @property
    def size(self) -> int:
        return self.req.sizes[0]

    def requests(self, lengths: list[int], rows: int = 1) -> list[tuple]:
        """Requests of the original model file at `lengths` (each of `rows` rows), from its make_inputs."""
        return [tuple(self.original.make_inputs(batch=rows, **{self.seq_dim: n})) for n in lengths]


def packed_model_file(mf, req: SeqRequest) -> PackedModel:
    """The model file the export runs for `--seq-pack`: mf's pack_model(model), its examples and fresh inputs
    packed from requests that mf's make_inputs makes, its batch dim the rows. Raises ExportError or
    ModelFileError saying what is missing."""
    import torch

    from aotc.load_model import bind_inputs

    hook = getattr(mf.module, "pack_model", None)
    if not callable(hook):
        raise ModelFileError(f"{mf.path} has no function pack_model(model); --seq-pack needs one returning the "
                             f"model as it runs packed (aotc.seq_pack: inputs [R, P] plus {SEGMENT} and "
                             f"{POSITION})")
    if mf.size_params is None:
        raise ModelFileError(f"{mf.path} has no make_inputs(batch, <sequence dim>); --seq-pack makes requests of "
                             f"every length with it")
    seq_dim, seq_range, batch_range = _seq_dims(mf, req)
    if seq_dim not in mf.size_params.values():
        raise ModelFileError(f"{mf.path}: make_inputs has no parameter named '{seq_dim}'; --seq-pack makes requests "
                             f"of every length with it")
    packed = hook(mf.model)
    if not isinstance(packed, torch.nn.Module):
        raise ModelFileError(f"{mf.path}: pack_model() returned {type(packed).__name__}, expected a torch.nn.Module")
    want = [*mf.input_names, SEGMENT, POSITION]
    got = [p.name for p in inspect.signature(packed.forward).parameters.values()]
    if got[:len(want)] != want:
        raise ModelFileError(f"{mf.path}: pack_model()'s forward takes ({', '.join(got)}), expected "
                             f"({', '.join(want)}): the model's inputs packed, then {SEGMENT} and {POSITION}")
    pads = [float((mf.pad_values or {}).get(n, 0)) for n in mf.input_names]
    pm = PackedModel(mf, None, req, seq_dim, seq_range, batch_range, pads)

    def make_inputs(batch: int = 2):
        # requests of lengths spread over the range, until they fill `batch` rows
        g = torch.Generator().manual_seed(7000 + batch)
        lo, hi = seq_range
        lengths = []
        while True:
            n = int(torch.randint(lo, hi + 1, (1,), generator=g))
            rows = 1 + max(r for r, _ in place(lengths + [n], pm.size))
            if rows > batch:
                break
            lengths.append(n)
        while 1 + max((r for r, _ in place(lengths, pm.size)), default=-1) < batch:  # a row of one short segment
            lengths.append(lo)
        ins, _ = pack(pm.requests(lengths), pm.size, pads)
        return ins

    module = types.SimpleNamespace(make_inputs=make_inputs)
    examples = make_inputs(max(2, min(4, batch_range[1])))
    names, flat, positional = bind_inputs(mf.path, packed, examples, {}, "the packed example inputs")
    rows = torch.export.Dim("batch", min=batch_range[0], max=batch_range[1])
    pm.mf = dataclasses.replace(mf, module=module, model=packed, example_inputs=flat, input_names=names,
                                positional=positional, dynamic_shapes={n: {0: rows} for n in names},
                                pad_values=None)
    return pm


def output_kinds(pm: PackedModel, model, packed, output_names: list[str], device: str, dtype: str) -> dict:
    """{output name: "tokens" or "first"}: an output of the model whose axis 1 follows the request's length is
    read per token, one without that axis at the segment's first token. Raises ExportError when the packed
    outputs do not have the rows' tokens on axis 1."""
    from aotc import export as exp
    from aotc.parity import _caster

    cast = _caster(device, dtype)
    lo, hi = pm.seq_range
    short, long_ = (tuple(cast(x) for x in r) for r in pm.requests([max(lo, min(hi, 3)), hi]))
    if short[0].shape[1] == long_[0].shape[1]:
        raise ExportError(f"--seq-pack: the sequence dim's range [{lo}, {hi}] holds one length only")
    names, a = exp.run_eager(model, short, pm.original)
    b = exp.eager_outputs(model, long_, pm.original)
    if names != output_names:
        raise ExportError(f"--seq-pack: pack_model() returns outputs {output_names}, the model {names}; return the "
                          f"same outputs by the same names")
    ins, _ = pack([short], pm.size, pm.pad_values)
    p = exp.eager_outputs(packed, ins, pm.mf)
    if len(p) != len(a):
        raise ExportError(f"--seq-pack: pack_model() returns {len(p)} outputs, the model {len(a)}")
    kinds = {}
    for name, x, y, z in zip(output_names, a, b, p):
        tokens = x.dim() >= 2 and x.shape[1] == short[0].shape[1] and y.shape[1] == long_[0].shape[1]
        want = [z.shape[0], pm.size, *(x.shape[2:] if tokens else x.shape[1:])]
        if list(z.shape) != want:
            raise ExportError(f"--seq-pack: pack_model()'s output '{name}' is {list(z.shape)} for 1 row, expected "
                              f"{want} (the row's tokens on axis 1 of what the model returns"
                              f"{'' if tokens else ' per request'})")
        kinds[name] = "tokens" if tokens else "first"
    return kinds


def answer_changes(pm: PackedModel, model, packed, kinds: dict, output_names: list[str], device: str, dtype: str,
                   tol) -> str | None:
    """None when the packed model's answers, unpacked, equal the model's on every request of a few mixes of
    lengths (one full row; the shortest; several short ones sharing a row with filler; requests of two rows),
    else the one line saying where they do not."""
    from aotc import export as exp
    from aotc.parity import _caster, compare

    cast = _caster(device, dtype)
    lo, hi = pm.seq_range
    mid = max(lo, hi // 2 - 1)
    mixes = [[hi], [lo], [mid, max(lo, hi // 4 + 1), lo, max(lo, min(hi, 3))], [hi, lo, mid]]
    first = [kinds[n] == "first" for n in output_names]
    for i, lengths in enumerate(mixes):
        rows = 2 if i == len(mixes) - 1 else 1
        reqs = [tuple(cast(x) for x in r) for r in pm.requests(lengths, rows=rows)]
        ins, where = pack(reqs, pm.size, pm.pad_values)
        answers = unpack(exp.eager_outputs(packed, ins, pm.mf), first, reqs, where)
        for q, got in zip(reqs, answers):
            want = exp.eager_outputs(model, q, pm.original)
            for name, g, w in zip(output_names, got, want):
                c = compare(name, g, w, tol)
                if not c.ok:
                    return (f"--seq-pack: the answer changes when requests are packed: output '{name}' of a request "
                            f"of length {q[0].shape[1]} packed with others of lengths {lengths} differs from the "
                            f"model's by max abs {c.max_abs:.3g} ({c.mismatched} elements beyond atol="
                            f"{tol.atol:g} rtol={tol.rtol:g}); pack_model must keep segments apart (attention "
                            f"within a segment, positions from 0 in each)")
    return None


def request_specs(pm: PackedModel, graph_in: list[TensorEntry], graph_out: list[TensorEntry],
                  kinds: dict) -> tuple[list[TensorEntry], list[TensorEntry]]:
    """The tensors a request carries: each packed input [b, n] and each output [b, n, ...] per token or
    [b, ...], b within the rows a call takes and n within the sequence dim's range."""
    rows, seq = pm.batch_range, pm.seq_range
    ins = [TensorEntry(e.name, e.dtype, (-1, -1), (rows, seq), ("batch", pm.seq_dim))
           for e in graph_in if e.name in pm.req.inputs]
    outs = []
    for e in graph_out:
        rest_shape, rest_ranges = e.shape[2:], e.ranges[2:]
        if kinds[e.name] == "tokens":
            outs.append(TensorEntry(e.name, e.dtype, (-1, -1, *rest_shape), (rows, seq, *rest_ranges)))
        else:
            outs.append(TensorEntry(e.name, e.dtype, (-1, *rest_shape), (rows, *rest_ranges)))
    return ins, outs


def manifest_entry(pm: PackedModel, graph_in: list[TensorEntry], graph_out: list[TensorEntry],
                   kinds: dict) -> SeqPack:
    ins, outs = request_specs(pm, graph_in, graph_out, kinds)
    return SeqPack(size=pm.size, dim=pm.seq_dim, inputs={n: 1 for n in pm.original.input_names},
                   pad_values=dict(zip(pm.original.input_names, pm.pad_values)), segment_input=SEGMENT,
                   position_input=POSITION, outputs=dict(kinds), request_inputs=tuple(ins),
                   request_outputs=tuple(outs))
