"""The example model files in models/ follow the convention: they load, build the same weights every time,
run on their example inputs, and declare names and dynamic dims that fit those inputs."""

from __future__ import annotations

import pytest
import torch

from aotc import export as exp
from aotc.load_model import load_model_file
from conftest import REPO

MODEL_FILES = sorted(str(p.relative_to(REPO)) for p in (REPO / "models").glob("*.py"))


@pytest.mark.parametrize("spec", MODEL_FILES)
def test_model_file_follows_the_convention(spec):
    mf = load_model_file(str(REPO / spec))
    model, inputs = exp.prepare(mf, "cpu", "fp32")
    outputs = exp.eager_outputs(model, inputs, mf)
    if mf.output_names is not None:
        assert len(mf.output_names) == len(outputs)
    # the same weights every time: a second build gives the same outputs, bit for bit
    again = load_model_file(str(REPO / spec))
    second = exp.eager_outputs(again.model, inputs, again)
    for a, b in zip(outputs, second):
        assert torch.equal(a, b), f"{spec}: model() is not deterministic"


@pytest.mark.parametrize("spec", MODEL_FILES)
def test_model_file_make_inputs_fit_the_inputs(spec):
    mf = load_model_file(str(REPO / spec))
    fresh = mf.make_inputs(3)
    if fresh is None:
        pytest.skip(f"{spec} has no make_inputs()")
    assert [x.dtype for x in fresh] == [x.dtype for x in mf.example_inputs]
    assert [x.dim() for x in fresh] == [x.dim() for x in mf.example_inputs]
    exp.eager_outputs(mf.model, fresh, mf)


def test_simple_is_tritons_example():
    mf = load_model_file(str(REPO / "models/simple.py"))
    assert mf.input_names == ["INPUT0", "INPUT1"] and mf.output_names == ["OUTPUT0", "OUTPUT1"]
    a, b = mf.example_inputs
    assert a.dtype == torch.int32 and a.shape[1] == 16
    s, d = mf.model(a, b)
    assert torch.equal(s, a + b) and torch.equal(d, a - b)


def test_mlp_shape():
    mf = load_model_file(str(REPO / "models/mlp.py"))
    shapes = [tuple(p.shape) for p in mf.model.parameters()]
    assert shapes == [(1024, 512), (1024,), (512, 1024), (512,)]


def test_library_models_are_built_from_config_and_not_trivial():
    """The Hugging Face and TorchRec examples: random weights from a seed (nothing downloaded), outputs whose
    parity means something (not near zero, not constant: aotc_client.compare.trivial)."""
    from aotc_client.compare import trivial

    for spec, names in (("models/hf_bert.py", ["last_hidden_state", "pooler_output"]), ("models/gpt2.py", ["logits"]),
                        ("models/torchrec_ebc.py", ["user", "item"])):
        mf = load_model_file(str(REPO / spec))
        got, outs = exp.run_eager(mf.model, mf.example_inputs, mf)
        assert got == names, spec
        for name, o in zip(names, outs):
            assert trivial(o.numpy(), 1e-4, 1e-4) == "" and o.abs().max() > 0.1, (spec, name)


def test_bert_base_variant_is_12_by_768():
    mf = load_model_file(str(REPO / "models/bert.py:bert_base"))
    assert mf.factory == "bert_base" and mf.default_name == "bert_bert_base"
    assert len(mf.model.encoder.layers) == 12 and mf.model.tokens.embedding_dim == 768
    small = load_model_file(str(REPO / "models/bert.py"))
    assert sum(p.numel() for p in small.model.parameters()) < 10_000_000
