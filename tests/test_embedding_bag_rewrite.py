"""The embedding-bag graph pass on real exported programs: every lowering keeps the model's answers.

A small module holds one embedding bag of each kind (jagged mean; weighted sum with include_last_offset and
padding_idx; max over a 2-D fixed-length input), exported with dynamic batch and id counts, rewritten,
and run on fresh inputs of other sizes (empty bags, batch 1). The AOTInductor path runs through the real
`aotc export` on models/embedding_bag.py (cached packages from conftest's export_package).
"""

import numpy as np
import pytest
import torch
from torch import nn

from aotc.errors import AotcError
from aotc.rewrite import embedding_bag as eb
from aotc.rewrite import eb_lowerings as low
from aotc.rewrite import eb_measure

torch.manual_seed(0)


class Bags(nn.Module):
    def __init__(self):
        super().__init__()
        self.mean = nn.EmbeddingBag(50, 8, mode="mean")
        self.weighted = nn.EmbeddingBag(40, 8, mode="sum", include_last_offset=True, padding_idx=0)
        self.max = nn.EmbeddingBag(30, 8, mode="max", padding_idx=3)

    def forward(self, ids, offsets, ids2, offsets2, weights2, ids2d):
        # ids [N], offsets [B]; ids2 [N2], offsets2 [B + 1], weights2 [N2]; ids2d [B, 4] -> 3 x [B, 8]
        return (self.mean(ids, offsets), self.weighted(ids2, offsets2, per_sample_weights=weights2),
                self.max(ids2d))


def bag_inputs(seed, lengths):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    b, n = len(lengths), int(lengths.sum())
    offsets = torch.cumsum(lengths, 0) - lengths
    ids = torch.randint(0, 50, (n,), generator=g)
    ids2 = torch.randint(0, 4, (n,), generator=g)  # ids 0 (padding) and 3 are frequent
    offsets2 = torch.cat([offsets, torch.tensor([n])])
    ids2d = torch.randint(0, 5, (b, 4), generator=g)
    return ids, offsets, ids2, offsets2, torch.rand(n, generator=g), ids2d


EXAMPLE = bag_inputs(0, [2, 0, 3, 1, 4])
# batch 1 is left out: torch.export itself adds a guard "batch != 1" for include_last_offset (ATen's meta)
FRESH = [bag_inputs(1, [0, 7, 1, 0, 0, 2, 9, 3]), bag_inputs(2, [1, 0]), bag_inputs(3, [0, 0, 5])]


@pytest.fixture(scope="module")
def exported():
    batch, n = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("n", min=0, max=1024)
    shapes = ({0: n}, {0: batch}, {0: n}, {0: batch + 1}, {0: n}, {0: batch})
    model = Bags().eval()
    return model, torch.export.export(model, EXAMPLE, dynamic_shapes=shapes)


def eb_nodes(ep):
    return [n for n in ep.graph.nodes if n.op == "call_function" and n.target in eb.EB_OPS]


def assert_same_answers(model, ep):
    for inputs in [EXAMPLE, *FRESH]:
        with torch.no_grad():
            for got, want in zip(ep.module()(*inputs), model(*inputs)):
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("choice", ["decompose", "jagged"])
def test_lowering_replaces_every_node_and_keeps_answers(exported, choice):
    model, ep = exported
    new_ep, report = eb.rewrite(ep, EXAMPLE, "cpu", choice)
    assert report["lowering"] == choice and report["nodes"] == 3
    assert [d["lowering"] for d in report["details"]] == [choice] * 3
    assert [d["bags"] for d in report["details"]] == ["jagged", "jagged", "fixed[4]"]
    assert eb_nodes(new_ep) == []
    assert_same_answers(model, new_ep)
    assert len(eb_nodes(ep)) == 3  # the caller's program is left as it was
    assert_same_answers(model, ep)


def test_aten_sum_takes_sum_and_mean_and_leaves_max_on_aten(exported):
    model, ep = exported
    new_ep, report = eb.rewrite(ep, EXAMPLE, "cpu", "aten_sum")
    assert report["lowering"] == "aten_sum"
    assert [d["lowering"] for d in report["details"]] == ["aten_sum", "aten_sum", "aten"]
    # mean and weighted sum become ATen's kernel in sum mode (a mean then divided); max keeps its node
    modes = sorted((n.target.__name__, int(eb.node_args(n)["mode"])) for n in eb_nodes(new_ep))
    assert modes == [("_embedding_bag.default", 0), ("_embedding_bag.default", 0),
                     ("_embedding_bag.default", 2)], modes
    assert_same_answers(model, new_ep)


def test_aten_leaves_the_graph_alone(exported):
    model, ep = exported
    new_ep, report = eb.rewrite(ep, EXAMPLE, "cpu", "aten")
    assert new_ep is ep and report["lowering"] == "aten" and report["candidates_ms"] == {}


def test_auto_measures_candidates_and_keeps_the_fastest(exported):
    model, ep = exported
    new_ep, report = eb.rewrite(ep, EXAMPLE, "cpu", "auto")
    times = report["candidates_ms"]
    assert set(times) | set(report.get("skipped", {})) == {"aten", "aten_sum", "decompose", "jagged"}
    assert "aten" in times and all(t > 0 for t in times.values())
    workloads = [times] + ([report["candidates_ms_scaled"]] if "candidates_ms_scaled" in report else [])
    assert report["lowering"] == eb_measure.choose(workloads)
    assert_same_answers(model, new_ep)


def test_choose_needs_a_margin_over_aten_on_every_workload():
    assert eb_measure.choose([{"aten": 1.0, "jagged": 0.97}]) == "aten"  # within the margin: ATen stays
    assert eb_measure.choose([{"aten": 1.0, "jagged": 0.5, "triton": 0.4}]) == "triton"
    # fastest on the small example, slower at the serving-sized batch: ATen stays
    assert eb_measure.choose([{"aten": 1.0, "decompose": 0.5}, {"aten": 1.0, "decompose": 4.0}]) == "aten"
    # the lowest worst-case ratio wins, not the lowest time on one workload
    both = [{"aten": 1.0, "decompose": 0.3, "triton": 0.5}, {"aten": 1.0, "decompose": 0.9, "triton": 0.6}]
    assert eb_measure.choose(both) == "triton"


@pytest.mark.parametrize("include_last_offset", [False, True])
def test_scaled_workload_repeats_the_bags(include_last_offset):
    torch.manual_seed(3)
    weight = torch.randn(20, 4)
    ids, offsets = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0, 2, 2])
    if include_last_offset:
        offsets = torch.cat([offsets, torch.tensor([5])])
    psw = torch.rand(5)
    plan = eb.NodePlan("n", low.MODE_SUM, True, include_last_offset, -1, None, 20, 4, "float32")
    w, ids2, off2, psw2 = eb_measure.scale_args((weight, ids, offsets, psw), plan, 7, longer=1)
    assert ids2.shape[0] == 15 and torch.equal(psw2[5:10], psw)
    want = [0, 2, 2, 5, 7, 7, 10, 12, 12] + ([15] if include_last_offset else [])
    assert off2.tolist() == want
    big = torch.nn.functional.embedding_bag(ids2, w, off2, mode="sum", per_sample_weights=psw2,
                                            include_last_offset=include_last_offset)
    small = torch.nn.functional.embedding_bag(ids, weight, offsets, mode="sum", per_sample_weights=psw,
                                              include_last_offset=include_last_offset)
    assert torch.allclose(big[:3], small) and torch.allclose(big[3:6], small)
    assert eb_measure.scale_args((weight, ids, offsets, psw), plan, 3) is None  # already 3 bags

    # Each bag 3x as long (its ids and weights again and again; the empty bag stays empty): sums triple.
    w, ids3, off3, psw3 = eb_measure.scale_args((weight, ids, offsets, psw), plan, 7, longer=3)
    assert ids3[:6].tolist() == [1, 2, 1, 2, 1, 2] and ids3[6:15].tolist() == [3, 4, 5] * 3
    assert off3.tolist()[:4] == [0, 6, 6, 15] and ids3.shape[0] == 45
    long = torch.nn.functional.embedding_bag(ids3, w, off3, mode="sum", per_sample_weights=psw3,
                                             include_last_offset=include_last_offset)
    # atol: a bag's sum of products that cancels to near 0 differs in its last bits when summed in another order
    assert long.shape[0] == 9
    torch.testing.assert_close(long[:3], 3 * small, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(long[6:], 3 * small, rtol=1e-5, atol=1e-5)


def test_node_whose_extra_outputs_are_used_stays_on_aten():
    class BagSizes(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(20, 4))

        def forward(self, ids, offsets):
            pooled, _, bag_size, _ = torch.ops.aten._embedding_bag(self.weight, ids, offsets, False, 1)
            return pooled, bag_size

    inputs = (torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1]))
    ep = torch.export.export(BagSizes(), inputs)
    new_ep, report = eb.rewrite(ep, inputs, "cpu", "jagged")
    assert report["details"][0]["lowering"] == "aten" and "kept on ATen" in report["details"][0]["note"]
    for got, want in zip(new_ep.module()(*inputs), BagSizes.forward(ep.module(), *inputs)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("choice,device,expected", [
    ("fastest", "cpu", "expected one of auto, decompose, jagged, triton, aten_sum, aten"),
    ("triton", "cpu", "needs --device cuda"),
])
def test_bad_choice_is_one_clear_error(exported, choice, device, expected):
    with pytest.raises(AotcError, match=expected) as err:
        eb.rewrite(exported[1], EXAMPLE, device, choice)
    assert "\n" not in str(err.value)


def _run_package(path, inputs):
    from aotc.loader import load_package

    runner = load_package(str(path))
    out = runner(*inputs)
    return out[0] if isinstance(out, (list, tuple)) else out


@pytest.mark.parametrize("args", [(), ("--embedding-bag", "decompose"), ("--embedding-bag", "aten_sum")],
                         ids=["auto", "decompose", "aten_sum"])
def test_recommendation_model_package(export_package, args):
    """Through AOTInductor: the manifest records the choice, and the package matches eager on fresh inputs."""
    from aotc.load_model import import_file
    from aotc.manifest import read

    rec = import_file(str(__import__("pathlib").Path(__file__).resolve().parents[1] / "models" / "embedding_bag.py"))

    path = export_package("models/embedding_bag.py", *args)
    rewrites = read(str(path)).rewrites["embedding_bag"]
    if args:
        assert rewrites["lowering"] == args[1]
    else:
        assert "aten" in rewrites["candidates_ms"] and "aten" in rewrites["candidates_ms_scaled"]
        assert rewrites["lowering"] == eb_measure.choose([rewrites["candidates_ms"],
                                                          rewrites["candidates_ms_scaled"]])
    model = rec.model()
    for batch, seed in ((1, 7), (200, 8), (37, 9)):
        inputs = rec.make_inputs(batch=batch, max_bag=30, seed=seed)
        with torch.no_grad():
            want = model(*inputs)
        np.testing.assert_allclose(_run_package(path, inputs).numpy(), want.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("choice", ["triton", "decompose", "jagged", "aten_sum", "auto"])
def test_lowerings_through_aoti_on_cuda(choice, tmp_path):
    """Each lowering compiled by AOTInductor for CUDA (the Triton kernel inside the .so) matches eager."""
    from aotc.loader import ensure_libstdcxx_global

    ensure_libstdcxx_global()
    model = Bags().cuda().eval()
    to_cuda = lambda xs: tuple(x.cuda() for x in xs)  # noqa: E731
    batch, n = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("n", min=0, max=1024)
    shapes = ({0: n}, {0: batch}, {0: n}, {0: batch + 1}, {0: n}, {0: batch})
    ep = torch.export.export(model, to_cuda(EXAMPLE), dynamic_shapes=shapes)
    new_ep, report = eb.rewrite(ep, to_cuda(EXAMPLE), "cuda", choice)
    if choice == "auto":
        assert {"aten", "triton"} <= set(report["candidates_ms"]) | set(report.get("skipped", {}))
    path = torch._inductor.aoti_compile_and_package(new_ep, package_path=str(tmp_path / f"{choice}.pt2"))
    runner = torch._inductor.aoti_load_package(path)
    for inputs in [EXAMPLE, *FRESH]:
        with torch.no_grad():
            for got, want in zip(runner(*to_cuda(inputs)), model(*to_cuda(inputs))):
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_recommendation_model_cuda_triton_package(export_package):
    """`aotc export --device cuda --embedding-bag triton`: accepted (no Python ops) and equal to eager."""
    from aotc.load_model import import_file
    from aotc.manifest import read

    rec = import_file(str(__import__("pathlib").Path(__file__).resolve().parents[1] / "models" / "embedding_bag.py"))

    path = export_package("models/embedding_bag.py", "--device", "cuda", "--embedding-bag", "triton")
    assert read(str(path)).rewrites["embedding_bag"]["lowering"] == "triton"
    model = rec.model().cuda()
    for batch, seed in ((1, 7), (200, 8)):
        inputs = tuple(x.cuda() for x in rec.make_inputs(batch=batch, max_bag=30, seed=seed))
        with torch.no_grad():
            want = model(*inputs)
        from aotc.loader import load_package

        got = load_package(str(path))(*inputs)[0]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
