"""aotc's embedding-bag Triton kernel, registered as the custom op `aotc::embedding_bag` (torch.library.triton_op).

One program pools one bag (for one block of the embedding dim): it walks the bag's ids in tiles of BLOCK_L,
loads only those table rows, and accumulates in fp32. The tile is an argument of the op: export-time
tuning (rewrite/eb_measure.py) times `tile_candidates` on the model's example inputs and bakes the fastest
into the graph, so nothing is autotuned inside AOTInductor (which would run the kernel on random ids).
Because the op is a `triton_op` whose body calls the kernel through `wrap_triton`, AOTInductor compiles the
kernel into the package's .so: a package that uses it needs no Python and no op registration at run time.
This module is not the graph pass (rewrite/).

Importing it needs `triton`; it registers the op once per process (importing again is a no-op). The op is
a pure function of its inputs and may be called from any thread. On CPU tensors it runs only under
TRITON_INTERPRET=1 (used by the tests); packages that use it are CUDA packages.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

MODE_SUM, MODE_MEAN, MODE_MAX = 0, 1, 2


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
    # The tile accumulates in place and is reduced over the bag axis once, after the loop: a reduction per
    # tile would put a cross-warp exchange (shared memory and a barrier) between every two row loads.
    if MODE == 2:
        acc = tl.full((BLOCK_L, BLOCK_D), float("-inf"), tl.float32)
    else:
        acc = tl.zeros((BLOCK_L, BLOCK_D), tl.float32)
    count = tl.zeros((BLOCK_L,), tl.int32)
    for tile in range(start, end, BLOCK_L):
        pos = tile + tl.arange(0, BLOCK_L)  # [BLOCK_L]
        ok = pos < end
        ids = tl.load(ids_ptr + pos, mask=ok, other=0).to(tl.int64)
        if HAS_PADDING:
            ok = ok & (ids != padding_idx)
        count += ok.to(tl.int32)
        mask = ok[:, None] & col_ok[None, :]
        # Each table row is read once per bag: stream it past the cache.
        if MODE == 2:
            rows = tl.load(weight_ptr + ids[:, None] * weight_stride + cols[None, :], mask=mask,
                           other=float("-inf"), eviction_policy="evict_first").to(tl.float32)
            acc = tl.maximum(acc, rows)
        else:
            rows = tl.load(weight_ptr + ids[:, None] * weight_stride + cols[None, :], mask=mask,
                           other=0.0, eviction_policy="evict_first").to(tl.float32)
            if HAS_PSW:
                rows = rows * tl.load(psw_ptr + pos, mask=ok, other=0.0).to(tl.float32)[:, None]
            acc += rows
    n = tl.sum(count, axis=0)
    if MODE == 2:
        pooled = tl.max(acc, axis=0)
        pooled = tl.where(n > 0, pooled, 0.0)
    else:
        pooled = tl.sum(acc, axis=0)
    if MODE == 1:
        pooled = pooled / tl.maximum(n, 1).to(tl.float32)
    tl.store(out_ptr + bag * out_stride + cols, pooled.to(out_ptr.dtype.element_ty), mask=col_ok)


def block_d_for(dim: int) -> int:
    return min(triton.next_power_of_2(dim), 256)


def tile_sizes(dim: int, element_size: int) -> tuple[int, int, int]:
    """Default (BLOCK_L, BLOCK_D, num_warps) for rows of `dim` elements, when no measured tiles are given:
    about 4 KiB of rows per tile on one warp, which keeps every bag of a few thousand resident at once."""
    block_d = block_d_for(dim)
    block_l = max(1, min(64, 4096 // (block_d * element_size)))
    return block_l, block_d, 1


def tile_candidates(dim: int) -> list[tuple[int, int, int]]:
    """The (BLOCK_L, BLOCK_D, num_warps) that export-time tuning tries for rows of `dim` elements: every
    warp count from 1 to 8 with 16 to 64 fp32 accumulators per thread (fewer starves the loads, more spills)."""
    block_d = block_d_for(dim)
    out = []
    for warps in (1, 2, 4, 8):
        for block_l in (2, 4, 8, 16, 32, 64):
            per_thread = block_l * block_d // (32 * warps)
            if 16 <= per_thread <= 64:
                out.append((block_l, block_d, warps))
    return out or [tile_sizes(dim, 4)]


@triton_op("aotc::embedding_bag", mutates_args={})
def embedding_bag(
    weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor,
    mode: int, include_last_offset: bool, padding_idx: int, has_per_sample_weights: bool,
    block_l: int = 0, block_d: int = 0, num_warps: int = 0,
) -> torch.Tensor:
    """weight [R, D], indices [N], offsets [B] or [B + 1] -> pooled [B, D] in weight's dtype.

    per_sample_weights is [N] when has_per_sample_weights, else any tensor (ignored); padding_idx -1: none.
    block_l, block_d, num_warps: the tile (0: `tile_sizes`' default), chosen by export-time tuning.
    """
    weight, indices, offsets = weight.contiguous(), indices.contiguous(), offsets.contiguous()
    per_sample_weights = per_sample_weights.contiguous()
    num_bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    dim = weight.shape[1]
    out = torch.empty((num_bags, dim), dtype=weight.dtype, device=weight.device)
    if block_l <= 0 or block_d <= 0 or num_warps <= 0:
        block_l, block_d, num_warps = tile_sizes(dim, weight.element_size())
    grid = (num_bags, triton.cdiv(dim, block_d))
    wrap_triton(_embedding_bag_kernel)[grid](
        weight, indices, offsets, per_sample_weights, out,
        indices.shape[0], offsets.shape[0], dim, weight.stride(0), out.stride(0), padding_idx,
        MODE=mode, HAS_PSW=has_per_sample_weights, HAS_PADDING=padding_idx >= 0,
        INCLUDE_LAST_OFFSET=include_last_offset, BLOCK_L=block_l, BLOCK_D=block_d, num_warps=num_warps,
    )
    return out


def pool(weight, indices, offsets, mode, per_sample_weights=None, include_last_offset=False, padding_idx=-1,
         tiles=None):
    """Call the op with ATen-like arguments (1-D indices with offsets); tiles = (BLOCK_L, BLOCK_D, num_warps)
    or None for the default."""
    psw = per_sample_weights if per_sample_weights is not None else indices
    block_l, block_d, num_warps = tiles or (0, 0, 0)
    return torch.ops.aotc.embedding_bag(
        weight, indices, offsets, psw, mode, include_last_offset,
        -1 if padding_idx is None else padding_idx, per_sample_weights is not None, block_l, block_d, num_warps,
    )
