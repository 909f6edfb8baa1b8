"""Parity of every embedding-bag lowering with eager nn.EmbeddingBag, for every mode and option.

The basic-op lowerings run eagerly and (a few) through torch.compile; aotc's Triton kernel runs in Triton's
interpreter on CPU (TRITON_INTERPRET=1, set here before the kernel is imported) and natively on CUDA
(tests marked cuda). Hypothesis draws random bag lengths (empty bags included) and table sizes.
"""

import itertools
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aotc.rewrite import eb_lowerings as low

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    from aotc.kernels import embedding_bag as kernel
except ImportError:  # no triton: the kernel's tests skip
    kernel = None

MODES = (low.MODE_SUM, low.MODE_MEAN, low.MODE_MAX)


def make_case(g, rows, dim, lengths, mode, padding_idx, include_last_offset, with_psw, fixed=False,
              dtype=torch.float32, device="cpu"):
    """EbArgs for bags of the given lengths (fixed: lengths all equal, as a [B, L] input)."""
    weight = torch.randn(rows, dim, generator=g).to(dtype).to(device)
    n = int(sum(lengths))
    ids = torch.randint(0, rows, (n,), generator=g)
    if padding_idx >= 0 and n:
        ids[torch.rand(n, generator=g) < 0.3] = padding_idx  # plenty of padding, whole bags of it too
    psw = torch.rand(n, generator=g).to(dtype).to(device) if with_psw else None
    ids = ids.to(device)
    if fixed:
        b, length = len(lengths), lengths[0]
        return low.EbArgs(weight, ids.reshape(b, length), None, mode,
                          None if psw is None else psw.reshape(b, length), False, padding_idx)
    lengths_t = torch.tensor(lengths, dtype=torch.int64)
    offsets = torch.cumsum(lengths_t, 0) - lengths_t
    if include_last_offset:
        offsets = torch.cat([offsets, torch.tensor([n])])
    return low.EbArgs(weight, ids, offsets.to(device), mode, psw, include_last_offset, padding_idx)


def combos():
    for mode, pad, ilo, psw in itertools.product(MODES, (-1, 2), (False, True), (False, True)):
        if psw and mode != low.MODE_SUM:
            continue  # ATen allows per-sample weights only with sum
        yield mode, pad, ilo, psw


COMBOS = list(combos())
JAGGED_LENGTHS = [3, 0, 1, 7, 0, 2, 5]  # empty bags first, last and in between
LOWERINGS = {"decompose": low.decompose, "jagged": low.jagged, "padded_jagged": low.padded_jagged,
             "aten_sum": low.aten_sum}


def assert_matches_aten(out, a, atol=1e-5, rtol=1e-5):
    ref = low.reference(a)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("lowering", sorted(LOWERINGS))
@pytest.mark.parametrize("mode,padding_idx,include_last_offset,with_psw", COMBOS)
def test_jagged_bags_match_aten(lowering, mode, padding_idx, include_last_offset, with_psw):
    g = torch.Generator().manual_seed(mode * 7 + padding_idx)
    for lengths in (JAGGED_LENGTHS, [0, 0], [4]):
        a = make_case(g, 20, 6, lengths, mode, padding_idx, include_last_offset, with_psw)
        assert_matches_aten(LOWERINGS[lowering](a), a)


@pytest.mark.parametrize("lowering", ["decompose", "jagged", "aten_sum"])
@pytest.mark.parametrize("mode,padding_idx,with_psw", [(m, p, w) for m, p, i, w in COMBOS if not i])
def test_fixed_length_bags_match_aten(lowering, mode, padding_idx, with_psw):
    g = torch.Generator().manual_seed(11)
    a = make_case(g, 30, 5, [4] * 6, mode, padding_idx, False, with_psw, fixed=True)
    assert_matches_aten(LOWERINGS[lowering](a), a)


def test_bag_of_padding_only_pools_to_zero():
    w = torch.randn(5, 3)
    a = low.EbArgs(w, torch.tensor([2, 2, 1]), torch.tensor([0, 2]), low.MODE_MEAN, None, False, 2)
    for fn in LOWERINGS.values():
        out = fn(a)
        assert torch.equal(out[0], torch.zeros(3)) and torch.allclose(out[1], w[1])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=12),
    rows=st.integers(1, 300), dim=st.integers(1, 40), mode=st.sampled_from(MODES),
    pad=st.booleans(), include_last_offset=st.booleans(), seed=st.integers(0, 2**16),
)
def test_property_random_bags(lengths, rows, dim, mode, pad, include_last_offset, seed):
    g = torch.Generator().manual_seed(seed)
    padding_idx = (seed % rows) if pad else -1
    a = make_case(g, rows, dim, lengths, mode, padding_idx, include_last_offset, mode == low.MODE_SUM and seed % 2)
    for fn in LOWERINGS.values():
        assert_matches_aten(fn(a), a, atol=1e-4, rtol=1e-4)
    if kernel is not None and not HAS_CUDA:
        out = kernel.pool(a.weight, a.indices, a.offsets, a.mode, a.per_sample_weights, a.include_last_offset,
                          a.padding_idx)
        assert_matches_aten(out, a, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("lowering", ["decompose", "jagged", "aten_sum"])
def test_compiled_lowering_matches_aten_across_shapes(lowering):
    """One dynamic-shape compile per lowering, then inputs of other sizes: what Inductor fuses stays exact."""
    fn = torch.compile(lambda w, i, o, p: LOWERINGS[lowering](low.EbArgs(w, i, o, low.MODE_SUM, p, False, 1)),
                       dynamic=True)
    g = torch.Generator().manual_seed(5)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        for lengths in ([3, 0, 5, 2], [1, 9, 0, 0, 4, 6, 2], [2, 2, 2, 8, 1, 0, 3, 3, 5]):
            a = make_case(g, 50, 16, lengths, low.MODE_SUM, 1, False, True)
            assert_matches_aten(fn(a.weight, a.indices, a.offsets, a.per_sample_weights), a, atol=1e-4, rtol=1e-4)


def test_compiled_aten_sum_mean_divides_by_each_bag_size():
    """aten_sum's mean is ATen's sum divided by the bag sizes from the offsets, fused by Inductor: exact across
    batch sizes of one dynamic compile, empty bags pooling to zeros."""
    fn = torch.compile(lambda w, i, o: low.aten_sum(low.EbArgs(w, i, o, low.MODE_MEAN)), dynamic=True)
    g = torch.Generator().manual_seed(6)
    for lengths in ([3, 0, 5, 2], [1, 9, 0, 0, 4, 6, 2], [0]):
        a = make_case(g, 50, 16, lengths, low.MODE_MEAN, -1, False, False)
        out = fn(a.weight, a.indices, a.offsets)
        assert_matches_aten(out, a, atol=1e-5, rtol=1e-5)
        assert all(out[i].abs().sum() == 0 for i, n in enumerate(lengths) if n == 0)


triton_kernel = pytest.mark.skipif(kernel is None, reason="triton is not installed")


@triton_kernel
@pytest.mark.skipif(HAS_CUDA, reason="the interpreter run is the CPU stand-in for the CUDA tests")
@pytest.mark.parametrize("mode,padding_idx,include_last_offset,with_psw", COMBOS)
def test_triton_kernel_interpreted_matches_aten(mode, padding_idx, include_last_offset, with_psw):
    g = torch.Generator().manual_seed(3)
    a = make_case(g, 40, 300, JAGGED_LENGTHS, mode, padding_idx, include_last_offset, with_psw)  # 2 blocks of D
    out = kernel.pool(a.weight, a.indices, a.offsets, mode, a.per_sample_weights, include_last_offset, padding_idx)
    assert_matches_aten(out, a)


@triton_kernel
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("mode,padding_idx,include_last_offset,with_psw", COMBOS)
def test_triton_kernel_cuda_matches_aten(dtype, mode, padding_idx, include_last_offset, with_psw):
    g = torch.Generator().manual_seed(4)
    lengths = [int(x) for x in torch.randint(0, 70, (300,), generator=g)] + [0]
    a = make_case(g, 5000, 128, lengths, mode, padding_idx, include_last_offset, with_psw, dtype=dtype,
                  device="cuda")
    out = kernel.pool(a.weight, a.indices, a.offsets, mode, a.per_sample_weights, include_last_offset, padding_idx)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    assert_matches_aten(out, a, atol=tol, rtol=tol)
    for name, fn in LOWERINGS.items():
        assert_matches_aten(fn(a), a, atol=tol, rtol=tol)


def check_every_tile(device, dtype, tol):
    """Every tile export-time tuning may pick pools like ATen (row sizes below, at and above one block)."""
    g = torch.Generator().manual_seed(6)
    lengths = [int(x) for x in torch.randint(0, 70, (24,), generator=g)] + [0]
    for dim in (20, 128, 300):
        a = make_case(g, 500, dim, lengths, low.MODE_MEAN, 3, False, False, dtype=dtype, device=device)
        for tiles in kernel.tile_candidates(dim):
            out = kernel.pool(a.weight, a.indices, a.offsets, a.mode, padding_idx=3, tiles=tiles)
            assert_matches_aten(out, a, atol=tol, rtol=tol)


@triton_kernel
@pytest.mark.skipif(HAS_CUDA, reason="the interpreter run is the CPU stand-in for the CUDA tests")
def test_triton_kernel_interpreted_every_tile_matches_aten():
    check_every_tile("cpu", torch.float32, 1e-4)


@triton_kernel
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_triton_kernel_cuda_every_tile_matches_aten():
    check_every_tile("cuda", torch.float16, 1e-2)


def test_hand_decomposed_model_file_equals_the_embedding_bag_model():
    """models/embedding_bag_decomposed.py (padded ids + mask) answers like models/embedding_bag.py."""
    import importlib.util
    from pathlib import Path

    models = Path(__file__).resolve().parents[1] / "models"
    spec = importlib.util.spec_from_file_location("eb_decomposed_model", models / "embedding_bag_decomposed.py")
    dec = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dec)
    jagged_model, padded_model = dec.jagged.model(), dec.model()
    for batch, seed in ((1, 0), (33, 1), (200, 2)):
        inputs = dec.jagged.make_inputs(batch, max_bag=40, seed=seed)
        with torch.no_grad():
            torch.testing.assert_close(padded_model(*dec.from_jagged(inputs)), jagged_model(*inputs),
                                       atol=1e-5, rtol=1e-5)
