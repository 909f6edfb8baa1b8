"""Embedding-bag lowerings written in basic PyTorch ops, equal to ATen's `embedding_bag` forward.

Each function takes the arguments of `aten.embedding_bag.padding_idx` in canonical form (see `EbArgs`) and
returns the pooled bags [B, D] in the table's dtype. They are traced into the exported graph by the rewrite
pass (embedding_bag.py), so Inductor sees gathers and reductions it can fuse; they are also plain eager
functions, used by tests and benchmarks. This is not the pass itself and not the Triton kernel (kernels/).
Pure functions of their inputs: safe to call from any thread.

Modes follow ATen: 0 = sum, 1 = mean, 2 = max. Ids equal to `padding_idx` are skipped (and not counted by
mean); an empty bag pools to zeros; per-sample weights exist only for sum.
"""

from dataclasses import dataclass

import torch

MODE_SUM, MODE_MEAN, MODE_MAX = 0, 1, 2
MODE_NAMES = {MODE_SUM: "sum", MODE_MEAN: "mean", MODE_MAX: "max"}


@dataclass
class EbArgs:
    """One embedding bag call. indices is [N] with offsets, or [B, L] (fixed-length bags) with offsets None."""

    weight: torch.Tensor  # [R, D]
    indices: torch.Tensor  # [N] or [B, L], integer
    offsets: torch.Tensor | None  # [B] or [B + 1] (include_last_offset), integer
    mode: int = MODE_MEAN
    per_sample_weights: torch.Tensor | None = None  # same shape as indices
    include_last_offset: bool = False
    padding_idx: int = -1  # -1: none; otherwise a row index in [0, R)


def bag_bounds(offsets, num_ids, include_last_offset):
    """offsets [B] or [B+1] -> (starts [B], ends [B]) int64; ends are clamped to [starts, num_ids].

    Written with gathers rather than slices and cat, so that a symbolic B retraces without new guards.
    """
    offsets = offsets.to(torch.int64)
    num_bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    bags = torch.arange(num_bags, device=offsets.device, dtype=torch.int64)
    starts = offsets[bags]
    if include_last_offset:
        ends = offsets[bags + 1]
    else:
        is_last = bags == num_bags - 1
        ends = torch.where(is_last, torch.full_like(starts, num_ids), offsets[(bags + 1).clamp(max=num_bags - 1)])
    ends = torch.maximum(torch.minimum(ends, torch.full_like(ends, num_ids)), starts)
    return starts, ends


def no_bags(offsets, include_last_offset) -> bool:
    """True only when the number of bags is known to be 0 (a symbolic count is taken as non-zero)."""
    count = offsets.shape[0] - (1 if include_last_offset else 0)
    return isinstance(count, int) and count <= 0


def _row_mask(indices, padding_idx):
    # indices [...] -> mask [...] bool: which ids contribute to their bag
    if padding_idx is None or padding_idx < 0:
        return torch.ones_like(indices, dtype=torch.bool)
    return indices != padding_idx


def _finish(pooled, counts, mode, dtype):
    # pooled [B, D] fp32, counts [B] (ids that contributed) -> [B, D] dtype
    if mode == MODE_MEAN:
        pooled = pooled / counts.clamp(min=1).to(pooled.dtype).unsqueeze(1)
    elif mode == MODE_MAX:
        pooled = torch.where(counts.unsqueeze(1) > 0, pooled, torch.zeros_like(pooled))
    return pooled.to(dtype)


def padded_fixed(a: EbArgs):
    """Fixed-length bags: indices [B, L] -> gather [B, L, D] -> masked reduction over L (fuses into one loop)."""
    ids = a.indices
    mask = _row_mask(ids, a.padding_idx)  # [B, L]
    rows = a.weight[ids].float()  # [B, L, D]
    return _reduce_padded(rows, mask, a.per_sample_weights, a.mode, a.weight.dtype)


def _reduce_padded(rows, mask, psw, mode, dtype):
    # rows [B, L, D] fp32, mask [B, L] bool, psw [B, L] or None -> [B, D]
    counts = mask.sum(1)
    if mode == MODE_MAX:
        neg = torch.full_like(rows, float("-inf"))
        return _finish(torch.where(mask.unsqueeze(2), rows, neg).amax(1), counts, mode, dtype)
    scale = mask.to(rows.dtype)
    if psw is not None:
        scale = scale * psw.to(rows.dtype)
    return _finish((rows * scale.unsqueeze(2)).sum(1), counts, mode, dtype)


def padded_jagged(a: EbArgs):
    """Jagged bags padded to the longest bag: ids [N] -> [B, Lmax] (+ mask) -> the padded reduction.

    Lmax is read from the data (a data-dependent size), the price of the classic padded formulation.
    """
    n = a.indices.shape[0]
    starts, ends = bag_bounds(a.offsets, n, a.include_last_offset)
    lengths = ends - starts  # [B]
    # at least one column, so that max over an all-empty batch still has something (masked) to reduce
    max_len = 1 if no_bags(a.offsets, a.include_last_offset) else lengths.max().clamp(min=1).item()
    torch._check(max_len >= 1)
    torch._check(max_len <= n + 1)
    pos = starts.unsqueeze(1) + torch.arange(max_len, device=starts.device)  # [B, Lmax]
    inside = pos < ends.unsqueeze(1)
    pos = torch.where(inside, pos, torch.full_like(pos, n))  # position n: the padding id appended below
    ids = torch.nn.functional.pad(a.indices, (0, 1))[pos]  # [B, Lmax]
    mask = inside & _row_mask(ids, a.padding_idx)
    psw = None if a.per_sample_weights is None else torch.nn.functional.pad(a.per_sample_weights, (0, 1))[pos]
    rows = a.weight[ids].float()  # [B, Lmax, D]
    return _reduce_padded(rows, mask, psw, a.mode, a.weight.dtype)


def segment_ids(offsets, num_ids, include_last_offset):
    """offsets -> (bag [N] int64: the bag of each id position, inside [N] bool: position belongs to a bag)."""
    starts, ends = bag_bounds(offsets, num_ids, include_last_offset)
    pos = torch.arange(num_ids, device=offsets.device, dtype=torch.int64)
    bag = torch.searchsorted(starts, pos, right=True) - 1  # [N]
    bag_clamped = bag.clamp(min=0)
    if no_bags(offsets, include_last_offset):
        return bag_clamped, torch.zeros_like(pos, dtype=torch.bool)
    inside = (bag >= 0) & (pos < ends[bag_clamped])
    return bag_clamped, inside


def with_offsets(a: EbArgs) -> EbArgs:
    """Fixed-length bags (ids [B, L]) as ids [N = B*L] with offsets [B]; jagged bags as they are."""
    if a.indices.dim() != 2:
        return a
    b, length = a.indices.shape
    offsets = torch.arange(0, b * length, length, device=a.indices.device, dtype=torch.int64)
    psw = None if a.per_sample_weights is None else a.per_sample_weights.reshape(-1)
    return EbArgs(a.weight, a.indices.reshape(-1), offsets, a.mode, psw, False, a.padding_idx)


def jagged(a: EbArgs):
    """Touches only the useful rows: gather each id's row once, scatter-add it into its bag ([N] -> [B, D])."""
    a = with_offsets(a)
    n = a.indices.shape[0]
    num_bags = a.offsets.shape[0] - (1 if a.include_last_offset else 0)
    bag, inside = segment_ids(a.offsets, n, a.include_last_offset)
    mask = inside & _row_mask(a.indices, a.padding_idx)  # [N]
    rows = a.weight[a.indices].float()  # [N, D]
    d = a.weight.shape[1]
    counts = torch.zeros(num_bags, device=rows.device, dtype=torch.float32).index_add(0, bag, mask.float())
    if a.mode == MODE_MAX:
        neg = torch.full_like(rows, float("-inf"))
        rows = torch.where(mask.unsqueeze(1), rows, neg)
        init = torch.full((num_bags, d), float("-inf"), device=rows.device, dtype=torch.float32)
        pooled = init.scatter_reduce(0, bag.unsqueeze(1).expand(n, d), rows, "amax")
        return _finish(pooled, counts, a.mode, a.weight.dtype)
    scale = mask.float()
    if a.per_sample_weights is not None:
        scale = scale * a.per_sample_weights.float()
    pooled = torch.zeros(num_bags, d, device=rows.device, dtype=torch.float32)
    pooled = pooled.index_add(0, bag, rows * scale.unsqueeze(1))
    return _finish(pooled, counts, a.mode, a.weight.dtype)


def aten_sum_applies(mode: int, padding_idx: int) -> bool:
    """Whether `aten_sum` covers a bag: sum, and mean without padding_idx (the bag sizes are then the offsets'
    differences; with padding ids they would have to be counted)."""
    return mode == MODE_SUM or (mode == MODE_MEAN and padding_idx < 0)


def aten_sum(a: EbArgs):
    """ATen's kernel in sum mode, then a mean divided by the bag sizes in the graph.

    On CPU ATen's sum path (fbgemm) is about twice as fast as its mean path on the same ids; the division is
    an elementwise op Inductor fuses into whatever reads the pooled bags. Modes `aten_sum_applies` rejects go
    to ATen's kernel unchanged. (`_embedding_bag`, not the faster forward-only op: Inductor's fallback for
    that one fails on a weight that requires grad, which exported parameters do.)
    """
    if not aten_sum_applies(a.mode, a.padding_idx):
        return reference(a)
    a = with_offsets(a)  # the [N] ids with offsets ATen's op takes
    # weight [R, D], ids [N], offsets [B] or [B + 1] -> pooled sums [B, D]
    pooled = torch.ops.aten._embedding_bag(
        a.weight, a.indices, a.offsets, False, MODE_SUM, False, a.per_sample_weights, a.include_last_offset,
        a.padding_idx)[0]
    if a.mode == MODE_SUM:
        return pooled
    starts, ends = bag_bounds(a.offsets, a.indices.shape[0], a.include_last_offset)  # [B] each
    return (pooled / (ends - starts).clamp(min=1).to(pooled.dtype).unsqueeze(1)).to(a.weight.dtype)  # [B, D]


def decompose(a: EbArgs):
    """The padded masked reduction: static padding for fixed-length bags, longest-bag padding otherwise."""
    return padded_fixed(a) if a.indices.dim() == 2 else padded_jagged(a)


def reference(a: EbArgs):
    """ATen's own kernel on the same arguments (what AOTInductor runs as an opaque fallback)."""
    pad = None if a.padding_idx is None or a.padding_idx < 0 else a.padding_idx
    return torch.nn.functional.embedding_bag(
        a.indices, a.weight, a.offsets, mode=MODE_NAMES[a.mode], per_sample_weights=a.per_sample_weights,
        include_last_offset=a.include_last_offset, padding_idx=pad,
    )
