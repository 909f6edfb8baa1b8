"""aotc's embedding-bag Triton kernel, registered as the custom op `aotc::embedding_bag` (torch.library.triton_op).

One program pools one bag (for one block of the embedding dim): it walks the bag's ids in tiles of BLOCK_L,
loads only those table rows, and accumulates in fp32. Because the op is a `triton_op` whose body calls the
kernel through `wrap_triton`, AOTInductor compiles the kernel into the package's .so: a package that uses
it needs no Python and no op registration at run time. This module is not the graph pass (rewrite/).

Importing it needs `triton`; it registers the op once per process (importing again is a no-op). The op is
a pure function of its inputs and may be called from any thread. On CPU tensors it runs only under
TRITON_INTERPRET=1 (used by the tests); packages that use it are CUDA packages.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

MODE_SUM, MODE_MEAN, MODE_MAX = 0, 1, 2

# Tile sizes are picked from the row size, not autotuned: autotuning inside AOTInductor would run the kernel
# on random ids. `TILE_OVERRIDE` = (BLOCK_L, BLOCK_D, num_warps) lets a benchmark sweep them.
TILE_OVERRIDE = None


@triton.jit
def _embedding_bag_kernel(
    weight_ptr, ids_ptr, offsets_ptr, psw_ptr, out_ptr,
    num_ids, num_offsets, dim, weight_stride, out_stride, padding_idx,
    MODE: tl.constexpr, HAS_PSW: tl.constexpr, HAS_PADDING: tl.constexpr, INCLUDE_LAST_OFFSET: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr,
):
    bag = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)  # [BLOCK_D]
    col_ok = cols < dim
    start = tl.load(offsets_ptr + bag).to(tl.int64)
    if INCLUDE_LAST_OFFSET:
        end = tl.load(offsets_ptr + bag + 1).to(tl.int64)
    else:
        has_next = bag + 1 < num_offsets
        end = tl.load(offsets_ptr + bag + 1, mask=has_next, other=num_ids).to(tl.int64)
    end = tl.minimum(end, num_ids)
    if MODE == 2:
        acc = tl.full((BLOCK_D,), float("-inf"), tl.float32)
    else:
        acc = tl.zeros((BLOCK_D,), tl.float32)
    count = tl.zeros((BLOCK_L,), tl.int32)
    for tile in range(start, end, BLOCK_L):
        pos = tile + tl.arange(0, BLOCK_L)  # [BLOCK_L]
        ok = pos < end
        ids = tl.load(ids_ptr + pos, mask=ok, other=0).to(tl.int64)
        if HAS_PADDING:
            ok = ok & (ids != padding_idx)
        count += ok.to(tl.int32)
        mask = ok[:, None] & col_ok[None, :]
        if MODE == 2:
            rows = tl.load(weight_ptr + ids[:, None] * weight_stride + cols[None, :], mask=mask,
                           other=float("-inf")).to(tl.float32)
            acc = tl.maximum(acc, tl.max(rows, axis=0))
        else:
            rows = tl.load(weight_ptr + ids[:, None] * weight_stride + cols[None, :], mask=mask,
                           other=0.0).to(tl.float32)
            if HAS_PSW:
                rows = rows * tl.load(psw_ptr + pos, mask=ok, other=0.0).to(tl.float32)[:, None]
            acc += tl.sum(rows, axis=0)
    n = tl.sum(count, axis=0)
    if MODE == 1:
        acc = acc / tl.maximum(n, 1).to(tl.float32)
    if MODE == 2:
        acc = tl.where(n > 0, acc, 0.0)
    tl.store(out_ptr + bag * out_stride + cols, acc.to(out_ptr.dtype.element_ty), mask=col_ok)


def tile_sizes(dim: int, element_size: int):
    """(BLOCK_L, BLOCK_D, num_warps) for rows of `dim` elements: about 8 KiB of rows in flight per tile."""
    if TILE_OVERRIDE is not None:
        return TILE_OVERRIDE
    block_d = min(triton.next_power_of_2(dim), 256)
    block_l = max(1, min(64, 8192 // (block_d * element_size)))
    return block_l, block_d, 4


@triton_op("aotc::embedding_bag", mutates_args={})
def embedding_bag(
    weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor,
    mode: int, include_last_offset: bool, padding_idx: int, has_per_sample_weights: bool,
) -> torch.Tensor:
    """weight [R, D], indices [N], offsets [B] or [B + 1] -> pooled [B, D] in weight's dtype.

    per_sample_weights is [N] when has_per_sample_weights, else any tensor (ignored); padding_idx -1: none.
    """
    weight, indices, offsets = weight.contiguous(), indices.contiguous(), offsets.contiguous()
    per_sample_weights = per_sample_weights.contiguous()
    num_bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    dim = weight.shape[1]
    out = torch.empty((num_bags, dim), dtype=weight.dtype, device=weight.device)
    block_l, block_d, num_warps = tile_sizes(dim, weight.element_size())
    grid = (num_bags, triton.cdiv(dim, block_d))
    wrap_triton(_embedding_bag_kernel)[grid](
        weight, indices, offsets, per_sample_weights, out,
        indices.shape[0], offsets.shape[0], dim, weight.stride(0), out.stride(0), padding_idx,
        MODE=mode, HAS_PSW=has_per_sample_weights, HAS_PADDING=padding_idx >= 0,
        INCLUDE_LAST_OFFSET=include_last_offset, BLOCK_L=block_l, BLOCK_D=block_d, num_warps=num_warps,
    )
    return out


def pool(weight, indices, offsets, mode, per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """Call the op with ATen-like arguments (1-D indices with offsets)."""
    psw = per_sample_weights if per_sample_weights is not None else indices
    return torch.ops.aotc.embedding_bag(
        weight, indices, offsets, psw, mode, include_last_offset,
        -1 if padding_idx is None else padding_idx, per_sample_weights is not None,
    )
