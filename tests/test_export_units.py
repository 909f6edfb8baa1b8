"""Unit tests of the export stages that need no compile: graph report, parity arithmetic, tolerances,
size plans, sample encoding, option parsing. Fast; run in-process."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from torch import nn

from aotc import export as exp
from aotc import package, parity, report
from aotc.errors import ExportError, ModelFileError, NoAttentionKernel
from aotc.load_model import load_model_file, with_example_batch
from aotc.manifest import Batch, TensorEntry, Tolerance
from aotc.pipeline import parse_dynamic_batch, tolerance_for
from aotc_client.specs import size_plan
from conftest import REPO


class Bags(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(100, 8, mode="mean")
        self.fc = nn.Linear(8, 4)

    def forward(self, ids, offsets):
        # ids: [N] int64, offsets: [B] int64 -> [B, 4]
        return torch.relu(self.fc(self.bag(ids, offsets)))


def test_graph_report_finds_the_embedding_bag_fallback():
    ep = torch.export.export(Bags(), (torch.randint(0, 100, (10,)), torch.tensor([0, 3, 7])))
    g = report.graph_report(ep)
    assert g["fallback_ops"] == ["aten._embedding_bag.default"]
    assert g["python_ops"] == [] and g["ops"]["aten._embedding_bag.default"] == 1
    assert g["ops"]["aten.addmm.default"] == 1 and g["nodes"] == sum(g["ops"].values())


def test_graph_report_of_the_mlp_has_no_fallback():
    mf = load_model_file(str(REPO / "models/mlp.py"))
    ep = exp.export_model(mf.model, mf.example_inputs, mf.dynamic_shapes, False, mf.input_names)
    g = report.graph_report(ep)
    assert g["fallback_ops"] == [] and g["ops"] == {"aten.permute.default": 2, "aten.addmm.default": 2,
                                                    "aten.relu.default": 1}


class Attention(nn.Module):
    def forward(self, q, k, v):
        # [B, heads, L, head_dim] each -> [B, heads, L, head_dim]
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_sdpa_backend_picks_the_kernel_the_decompositions_record():
    """torch.export keeps scaled_dot_product_attention whole; the kernel is picked when it is decomposed (the
    graph report, AOTInductor), so the backend holds around all of it."""
    qkv = tuple(torch.randn(2, 4, 16, 8) for _ in range(3))
    ep = exp.export_model(Attention(), qkv, None, False, ["q", "k", "v"])
    with exp.attention_backend(None):
        default = report.graph_report(ep)
    with exp.attention_backend("math"):
        math = report.graph_report(ep)
    assert default["fallback_ops"] == ["aten._scaled_dot_product_flash_attention_for_cpu.default"]
    assert math["fallback_ops"] == []  # the math backend is matmuls and a softmax, for Inductor to fuse
    assert math["ops"]["aten.bmm.default"] == 2 and math["ops"]["aten.exp.default"] == 1, math["ops"]


def test_sdpa_backend_without_a_kernel_here_is_refused_with_the_reason():
    qkv = tuple(torch.randn(2, 4, 16, 8) for _ in range(3))
    with pytest.raises(NoAttentionKernel, match="--sdpa-backend cudnn: PyTorch has no cudnn attention kernel"):
        with exp.attention_backend("cudnn"):
            Attention()(*qkv)


def test_strict_export_of_the_mlp():
    mf = load_model_file(str(REPO / "models/mlp.py"))
    ep = exp.export_model(mf.model, mf.example_inputs, mf.dynamic_shapes, True, mf.input_names)
    ins, outs, batch = package.tensor_specs(ep, ["x"], ["y"])
    assert ins == [TensorEntry("x", "float32", (-1, 512), ((1, 1024), (512, 512)))]
    assert outs[0].shape == (-1, 512) and batch == Batch(1, 1024)


def test_tensor_specs_without_a_shared_batch():
    ep = torch.export.export(Bags(), (torch.randint(0, 100, (10,)), torch.tensor([0, 3, 7])), dynamic_shapes={
        "ids": {0: torch.export.Dim("n", min=1, max=500)}, "offsets": {0: torch.export.Dim("b", max=64)}})
    ins, outs, batch = package.tensor_specs(ep, ["ids", "offsets"], ["out"])
    assert ins[0].ranges == ((1, 500),) and ins[1].shape == (-1,)
    assert outs[0].shape == (-1, 4) and batch is None


def test_compare_uses_atol_plus_rtol_and_matches_nans():
    tol = Tolerance(1e-4, 1e-4)
    want = torch.tensor([1.0, 100.0, float("nan")])
    assert parity.compare("y", want + torch.tensor([5e-5, 5e-3, 0.0]), want, tol).ok
    bad = parity.compare("y", want + torch.tensor([0.0, 0.1, 0.0]), want, tol)
    assert not bad.ok and bad.max_abs == pytest.approx(0.1, rel=1e-3)
    assert not parity.compare("y", torch.zeros(2, 3), torch.zeros(3, 2), Tolerance(1, 1)).ok
    assert not parity.compare("y", torch.zeros(2), torch.zeros(2, dtype=torch.float64), Tolerance(1, 1)).ok
    # bfloat16, which numpy lacks, is compared widened to float32
    assert parity.compare("y", want.bfloat16(), want.bfloat16(), tol).ok


def test_size_plan_covers_min_max_and_an_odd_size():
    assert size_plan(1, 1024) == [("min", 1), ("max", 1024), ("odd", 37)]
    assert size_plan(2, 8) == [("min", 2), ("max", 8), ("odd", 5)]
    assert size_plan(4, 4) == [("min", 4), ("max", 4)]
    assert size_plan(0, 2**63 - 1)[1] == ("max", 4096)


def test_tolerance_defaults_and_overrides():
    mf = load_model_file(str(REPO / "models/mlp.py"))
    assert tolerance_for(mf, "fp32") == Tolerance(1e-4, 1e-4)
    assert tolerance_for(mf, "bf16") == Tolerance(5e-2, 5e-2)
    mf.tolerance = {"atol": 1e-3, "rtol": 0.2}
    assert tolerance_for(mf, "fp32") == Tolerance(1e-3, 0.2)
    assert tolerance_for(mf, "fp16") == Tolerance(1e-2, 0.2)


def test_npy_samples_are_v1_little_endian_and_bf16_keeps_its_bits():
    x = torch.randn(3, 5)
    arr = np.load(io.BytesIO(package.npy_bytes(x)))
    assert arr.dtype == np.dtype("<f4") and np.array_equal(arr, x.numpy())
    b = x.to(torch.bfloat16)
    bits = np.load(io.BytesIO(package.npy_bytes(b)))
    assert bits.dtype == np.dtype("<u2")
    assert torch.equal(torch.from_numpy(bits.astype(np.int32)).to(torch.int16).view(torch.bfloat16), b)


@pytest.mark.parametrize("text, expected", [("1:1024", (1, 1024)), ("8:8", (8, 8))])
def test_parse_dynamic_batch(text, expected):
    assert parse_dynamic_batch(text) == expected


def test_dynamic_batch_min_equal_max_makes_dim_0_static():
    mf = load_model_file(str(REPO / "models" / "mlp.py"))
    inputs = mf.example_inputs  # batch 64
    assert exp.dynamic_shapes_for(mf, inputs, (64, 64)) == {"x": {0: None}}
    ds = exp.dynamic_shapes_for(mf, inputs, (1, 128))
    assert (ds["x"][0].min, ds["x"][0].max) == (1, 128)
    with pytest.raises(ExportError, match="does not contain the example batch size 64"):
        exp.dynamic_shapes_for(mf, inputs, (8, 8))


def test_example_batch_repeats_rows_or_asks_the_file():
    mlp = load_model_file(str(REPO / "models" / "mlp.py"))  # no make_inputs(): the 64 example rows repeated
    (x,) = with_example_batch(mlp, 150).example_inputs
    assert x.shape == (150, 512)
    assert torch.equal(x[:64], mlp.example_inputs[0]) and torch.equal(x[64:128], mlp.example_inputs[0])
    assert torch.equal(x[128:], mlp.example_inputs[0][:22])
    bert = load_model_file(str(REPO / "models" / "bert.py"))  # has make_inputs(batch)
    assert [tuple(t.shape) for t in with_example_batch(bert, 8).example_inputs] == \
        [tuple(t.shape) for t in bert.make_inputs(8)]
    assert bert.example_inputs[0].shape[0] == 4  # the original is left alone


def test_example_batch_refusals(tmp_path):
    mlp = load_model_file(str(REPO / "models" / "mlp.py"))
    with pytest.raises(ModelFileError, match=r"outside its Dim range \[1, 1024\]"):
        with_example_batch(mlp, 2000)
    f = tmp_path / "two.py"
    f.write_text("import torch\n"
                 "class M(torch.nn.Module):\n"
                 "    def forward(self, a, b):\n"
                 "        return a.sum() + b.sum()\n"
                 "def model():\n    return M()\n"
                 "def example_inputs():\n    return (torch.ones(2, 3), torch.ones(5, 3))\n")
    with pytest.raises(ModelFileError, match="make_inputs"):
        with_example_batch(load_model_file(str(f)), 8)


@pytest.mark.parametrize("text", ["8", "0:4", "9:3", "a:b", ":"])
def test_parse_dynamic_batch_refuses(text):
    with pytest.raises(ExportError, match="expected MIN:MAX"):
        parse_dynamic_batch(text)


def test_progress_counts_without_a_total_until_it_is_known():
    # a CUDA export's static graphs are counted once torch.export has found the batch range
    buf = io.StringIO()
    prog = report.Progress(None, stream=buf)
    with prog.stage("torch.export"):
        pass
    prog.total = 9
    with prog.stage("AOTInductor compile"):
        pass
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("[1] torch.export ... done (") and lines[1].startswith("[2/9] AOTInductor compile")


def test_fresh_cases_name_each_dynamic_dim_as_the_user_does(tmp_path):
    """Labels say "batch=1, seq=2" (the batch, then the model file's Dim names), not Inductor's symbols."""
    f = tmp_path / "seq.py"
    f.write_text("import torch\n"
                 "from torch.export import Dim\n"
                 "class M(torch.nn.Module):\n"
                 "    def forward(self, x, y):\n"
                 "        return x.sum(1) + y.sum(1)\n"
                 "def model():\n    return M()\n"
                 "def example_inputs():\n    return (torch.ones(4, 8), torch.ones(4, 3))\n"
                 "def dynamic_shapes():\n"
                 "    b = Dim('b', min=1, max=16)\n"
                 "    return {'x': {0: b, 1: Dim('seq', min=2, max=64)}, 'y': {0: b, 1: None}}\n")
    mf = load_model_file(str(f))
    ep = exp.export_model(mf.model, mf.example_inputs, mf.dynamic_shapes, False, mf.input_names)
    ins, outs, batch = package.tensor_specs(ep, mf.input_names, ["out"])
    assert batch == Batch(1, 16)
    ins, dims = package.name_dims(ep, mf, ins, batch is not None)
    assert dims == {"batch": (1, 16), "seq": (2, 64)} and [t.symbols for t in ins] == [("batch", "seq"), ("batch", None)]
    ref = exp.eager_outputs(mf.model, mf.example_inputs, mf)
    cases, unvaried = parity.make_cases(mf, mf.model, mf.example_inputs, ref, ins, dims, "cpu", "fp32")
    assert unvaried == []
    # together, then each dim apart with the other at its example size (batch 4, seq 8)
    assert [c["label"] for c in cases] == [
        "example inputs", "fresh min (batch=1, seq=2)", "fresh max (batch=16, seq=64)", "fresh odd (batch=9, seq=39)",
        "fresh batch min (batch=1, seq=8)", "fresh batch max (batch=16, seq=8)", "fresh batch odd (batch=9, seq=8)",
        "fresh seq min (batch=4, seq=2)", "fresh seq max (batch=4, seq=64)", "fresh seq odd (batch=4, seq=39)"]
    assert [tuple(c["inputs"][0].shape) for c in cases[1:4]] == [(1, 2), (16, 64), (9, 39)]
    assert [tuple(c["inputs"][1].shape) for c in cases[7:]] == [(4, 3)] * 3
    assert [c["sample"] for c in cases] == [True, False, False, True] + [False] * 6


def test_cuda_attention_falls_back_to_math_when_its_kernel_constrains_the_range(monkeypatch, capsys):
    # On the H200, PyTorch's pick for a masked attention (memory-efficient) pads the mask to a multiple of 8, a
    # guard torch.export cannot prove for a dynamic sequence dim: the export then takes the math kernel. Other
    # failures are not retried.
    from aotc import pipeline

    seen = []

    def fake(fail_with):
        def run(spec, opts, mf=None):
            seen.append(opts.sdpa_backend)
            if opts.sdpa_backend == "flash":
                raise NoAttentionKernel("--sdpa-backend flash: no kernel")
            if opts.sdpa_backend is None:
                raise ExportError(fail_with)
            return {"sdpa_backend": opts.sdpa_backend}
        return run

    monkeypatch.setattr(pipeline, "_export_model_file", fake(
        "export failed: the model does not work for every size in the declared dynamic range: seq ..."))
    assert pipeline.export_model_file("m.py", pipeline.ExportOptions(device="cuda")) == {"sdpa_backend": "math"}
    assert seen == ["flash", None, "math"]
    # each attempt's progress lines end in "failed": a line after each says the export goes on, and why
    said = capsys.readouterr().err.splitlines()
    assert said == ["    not a failure: flash attention takes no part of this model's attention; exporting again "
                    "with PyTorch's own pick",
                    "    not a failure: PyTorch's pick of attention kernel does not export for every size of the "
                    "dynamic dims; exporting again with math attention"], said
    seen.clear()
    pipeline.export_model_file("m.py", pipeline.ExportOptions(device="cuda", quiet=True))
    assert seen == ["flash", None, "math"] and capsys.readouterr().err == ""
    seen.clear()
    monkeypatch.setattr(pipeline, "_export_model_file", fake("export failed: an operator cannot be traced"))
    with pytest.raises(ExportError, match="cannot be traced"):
        pipeline.export_model_file("m.py", pipeline.ExportOptions(device="cuda"))
    assert seen == ["flash", None]
