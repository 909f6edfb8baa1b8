"""Inputs and outputs as the model has them, without compiling: output pytrees named by key path, inputs given
by name (example_kwargs), binding errors that name the parameter, make_inputs with keyword sizes, the one
fresh-input generator's plan, the inconclusive verdict on trivial references, and the sample cap."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from torch import nn

from aotc import cache, fresh, package, parity
from aotc import export as exp
from aotc.errors import ModelFileError
from aotc.load_model import load_model_file
from aotc.manifest import Tolerance
from aotc_client.specs import TensorSpec
from conftest import DATA, REPO, run_aotc

Pair = collections.namedtuple("Pair", "first second")


@pytest.mark.parametrize("out, names", [
    (torch.ones(2), ["output0"]),
    ((torch.ones(2), torch.ones(3)), ["output0", "output1"]),
    ({"pooled": torch.ones(2), "encoder": [torch.ones(1), torch.ones(1)]}, ["pooled", "encoder.0", "encoder.1"]),
    ((torch.ones(1), {"a": torch.ones(1)}), ["output0", "output1.a"]),
    (Pair(torch.ones(1), torch.ones(2)), ["first", "second"]),
])
def test_output_leaves_are_named_by_key_path(out, names):
    got, tensors = exp.output_leaves(out)
    assert got == names and all(isinstance(t, torch.Tensor) for t in tensors)


def test_a_model_output_is_named_by_its_keys():
    transformers = pytest.importorskip("transformers")
    out = transformers.modeling_outputs.BaseModelOutputWithPooling(last_hidden_state=torch.ones(2, 3, 4),
                                                                   pooler_output=torch.ones(2, 4))
    assert exp.output_leaves(out)[0] == ["last_hidden_state", "pooler_output"]


def test_output_leaves_refuse_what_is_not_a_tensor():
    with pytest.raises(ModelFileError, match=r"forward's output 'stats.count' is int, expected a tensor"):
        exp.output_leaves({"y": torch.ones(1), "stats": {"count": 3}}, "m.py")
    with pytest.raises(ModelFileError, match=r"forward's output 'output1' is None, expected a tensor; leave it out"):
        exp.output_leaves((torch.ones(1), None), "m.py")
    with pytest.raises(ModelFileError, match="forward returned dict with no tensors in it"):
        exp.output_leaves({}, "m.py")
    with pytest.raises(ModelFileError, match=r"do not have distinct names"):
        exp.output_leaves({"a.b": torch.ones(1), "a": {"b": torch.ones(1)}}, "m.py")


def _file(tmp_path, body: str, name: str = "m.py"):
    f = tmp_path / name
    f.write_text("import torch\nfrom torch import nn\n" + body)
    return f


MIXED = """
class M(nn.Module):
    def forward(self, ids, cache=None, mask=None, scale=None):
        out = ids.float() * (1 if mask is None else mask) * (1 if scale is None else scale)
        return {"out": out, "twice": [out * 2]}
def model():
    return M()
def example_inputs():
    return (torch.ones(2, 3, dtype=torch.int64),)
def example_kwargs():
    return {"scale": torch.full((2, 3), 2.0), "mask": torch.ones(2, 3)}
"""


def test_inputs_by_name_are_flat_in_forwards_order(tmp_path):
    mf = load_model_file(str(_file(tmp_path, MIXED)))
    # by position first, then by name in forward's order (not the dict's): as torch.export flattens them
    assert mf.input_names == ["ids", "mask", "scale"] and mf.positional == 1
    args, kwargs = mf.args_kwargs(mf.example_inputs)
    assert len(args) == 1 and list(kwargs) == ["mask", "scale"]
    names, outs = exp.run_eager(mf.model, mf.example_inputs, mf)
    assert names == ["out", "twice.0"] and torch.equal(outs[0], torch.full((2, 3), 2.0))
    ep = exp.export_model(mf.model, mf.example_inputs, None, False, mf.input_names, positional=mf.positional)
    assert list(ep.graph_signature.user_inputs) == ["ids", "mask", "scale"]


def test_the_cache_key_says_how_each_input_is_given(tmp_path):
    by_name = load_model_file(str(_file(tmp_path, MIXED)))
    by_position = dataclasses.replace(by_name, positional=None)
    a, b = cache.key_parts(by_name, _opts()), cache.key_parts(by_position, _opts())
    assert [k for k in a if a[k] != b[k]] == ["example_inputs"]
    assert a["example_inputs"][0] == ["ids", [2, 3], "torch.int64", "positional"]
    assert a["example_inputs"][1][3] == "keyword"


def _opts():
    from aotc.pipeline import ExportOptions

    return ExportOptions()


def test_a_wrong_binding_names_the_parameter_and_what_forward_got(tmp_path):
    f = _file(tmp_path, """
class M(nn.Module):
    def forward(self, x, past=None, mask=None):
        return x + past.get_seq_length()
def model():
    return M()
def example_inputs():
    return (torch.ones(2, 4), torch.ones(2, 4))
""")
    mf = load_model_file(str(f))
    with pytest.raises(ModelFileError) as err:
        exp.run_eager(mf.model, mf.example_inputs, mf)
    msg = str(err.value)
    assert "raised AttributeError: 'Tensor' object has no attribute 'get_seq_length'" in msg
    assert "(forward got x=[2, 4] float32, past=[2, 4] float32; give inputs by name with example_kwargs()" in msg
    assert "\n" not in msg


def test_the_cli_says_which_parameter_a_positional_input_went_to(capsys, monkeypatch, tmp_path):
    from aotc.cli import main

    monkeypatch.chdir(REPO)
    rc = main(["export", str(DATA / "positional_to_non_tensor.py"), "-o", str(tmp_path / "x.pt2"), "--no-cache"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("aotc: error:") == 1 and "Traceback" not in err
    assert "example_inputs()[1] goes to forward's parameter 'cache' (annotated Cache | None)" in err


def test_make_inputs_takes_keyword_sizes_and_may_give_inputs_by_name():
    bert = load_model_file(str(REPO / "models/hf_bert.py"))
    assert bert.size_params == {"batch": "batch", "seq": "seq"}
    assert [tuple(x.shape) for x in bert.make_inputs(batch=3, seq=9)] == [(3, 9), (3, 9)]
    assert [tuple(x.shape) for x in bert.make_inputs(3)] == [(3, 32), (3, 32)]  # seq at its example size
    gpt2 = load_model_file(str(REPO / "models/gpt2.py"))
    assert gpt2.input_names == ["input_ids", "attention_mask"] and gpt2.positional == 0
    assert [tuple(x.shape) for x in gpt2.make_inputs(batch=2, seq=5)] == [(2, 5), (2, 5)]  # a dict, by name
    other = load_model_file(str(DATA / "make_inputs_other_inputs.py"))
    with pytest.raises(ModelFileError, match=r"make_inputs\(batch=3\) gives inputs \['x'\], the examples give "
                                             r"\['x', 'y'\]"):
        other.make_inputs(3)


SEQ_MODEL = """
from torch.export import Dim
class M(nn.Module):
    def forward(self, x):
        return x.cumsum(1)
def model():
    return M()
def make_inputs(batch):
    return (torch.randn(batch, 16),)
def example_inputs():
    return (torch.randn(4, 16),)
def dynamic_shapes():
    return {"x": {0: Dim("batch", min=1, max=8), 1: Dim("seq", min=2, max=64)}}
"""


def test_a_dim_make_inputs_cannot_size_is_said_not_varied(tmp_path):
    mf = load_model_file(str(_file(tmp_path, SEQ_MODEL)))
    spec = TensorSpec("x", "FP32", (-1, -1), ((1, 8), (2, 64)), ("batch", "seq"))
    cases, unvaried = fresh.plan(mf, [spec], {"batch": (1, 8), "seq": (2, 64)})
    assert unvaried == ["seq"] and [s for _, s in cases] == [{"batch": 1}, {"batch": 8}, {"batch": 5}]
    # without make_inputs every dim is varied, random inputs sized by name
    del mf.module.make_inputs
    cases, unvaried = fresh.plan(mf, [spec], {"batch": (1, 8), "seq": (2, 64)})
    assert unvaried == [] and len(cases) == 9


def test_fresh_inputs_follow_derived_dims_and_never_a_data_dependent_output():
    mf = load_model_file(str(REPO / "models/torchrec_ebc.py"))
    specs = [TensorSpec("values", "INT64", (-1,), ((0, 1024),), ("n_ids",)),
             TensorSpec("lengths", "INT64", (-1,), ((2, 128),), ("2*batch",))]
    cases, unvaried = fresh.fresh_cases(mf, specs, {"n_ids": (0, 1024), "batch": (2, 64)}, mf.example_inputs)
    assert unvaried == ["n_ids"] and [label for label, _ in cases] == [
        "fresh min (batch=2)", "fresh max (batch=64)", "fresh odd (batch=39)"]
    for _, (values, lengths) in cases:  # jagged: the values are as many as the lengths say
        assert int(lengths.sum()) == values.shape[0]
    dd = load_model_file(str(DATA / "data_dependent_output.py"))
    spec = TensorSpec("x", "FP32", (-1, 4), ((1, 32), (4, 4)), ("batch", None))
    assert [s for _, s in fresh.plan(dd, [spec], {"batch": (1, 32)})[0]] == [{"batch": 1}, {"batch": 32},
                                                                              {"batch": 17}]


def test_trivial_references_make_the_outputs_inconclusive():
    mf = load_model_file(str(DATA / "trivial_output.py"))
    model, inputs = exp.prepare(mf, "cpu", "fp32")
    names, ref = exp.run_eager(model, inputs, mf)
    cases = [parity._case("example inputs", inputs, ref, True)]
    for b in (1, 16):
        x = torch.randn(b, 8)
        cases.append(parity._case(f"b{b}", (x,), exp.eager_outputs(model, (x,), mf), False))
    why = parity.trivial_outputs(cases, names, Tolerance(1e-4, 1e-4))
    assert list(why) == ["logits", "probs"]
    assert "within atol 0.0001 of zero everywhere" in why["logits"] and "constant" in why["probs"]
    # an output that is trivial in one case only still tests something
    cases[1]["ref"] = (torch.tensor([[0.1, 0.5, 1.0, 2.0]]), torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    assert list(parity.trivial_outputs(cases, names, Tolerance(1e-4, 1e-4))) == []


def test_export_of_trivial_outputs_stops_before_compiling(tmp_path):
    r = run_aotc("export", DATA / "trivial_output.py", "-o", tmp_path / "t.pt2", "--no-cache")
    assert r.returncode == 1, r.stderr
    errors = [line for line in r.stderr.splitlines() if "aotc: error:" in line]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert ("parity is INCONCLUSIVE: output 'logits' (and 'probs') is within atol 0.0001 of zero everywhere "
            "(max |value| ") in errors[0]
    assert "in all 4 cases" in errors[0] and errors[0].endswith("or pass --allow-trivial-outputs")
    assert "AOTInductor compile" not in r.stderr and not (tmp_path / "t.pt2").exists()


def test_the_sample_cap_keeps_the_first_and_what_fits():
    def case(label, n, sample=True):
        t = torch.zeros(n, dtype=torch.uint8)
        return {"label": label, "inputs_outputs": ((t,), (t,)), "sample": sample}

    cases = [case("example", 600), case("fresh min", 10, sample=False), case("odd", 200),
             {**case("static", 300), "graph": "b8"}]  # a static graph's sample comes before the fresh ones
    kept, left = package.pick_samples(cases, 1000)
    assert [c["label"] for c in kept] == ["example"] and [c["label"] for c in left] == ["static", "odd"]
    kept, left = package.pick_samples(cases, None)
    assert [c["label"] for c in kept] == ["example", "static", "odd"] and left == []
    kept, _ = package.pick_samples(cases, 0)  # at least one sample, whatever the cap
    assert [c["label"] for c in kept] == ["example"]


def test_an_example_over_the_cap_is_made_smaller():
    mf = load_model_file(str(REPO / "models/mlp.py"))  # example: x [64, 512] -> [64, 512] float32, 256 KiB
    model, inputs = exp.prepare(mf, "cpu", "fp32")
    example = parity._case("example inputs", inputs, exp.eager_outputs(model, inputs, mf), True)
    specs = [package.TensorEntry("x", "float32", (-1, 512), ((1, 1024), (512, 512)), ("batch", None))]
    smaller = parity.shrink_sample(mf, model, example, specs, {"batch": (1, 1024)}, "cpu", "fp32", 100_000)
    assert smaller["label"] == "sample (batch=16)" and smaller["sample"]
    assert package.case_bytes(smaller) <= 100_000 < package.case_bytes(example)
    static = dataclasses.replace(specs[0], shape=(64, 512), ranges=((64, 64), (512, 512)), symbols=None)
    assert parity.shrink_sample(mf, model, example, [static], {}, "cpu", "fp32", 100_000) is None


def test_samples_option_parses_megabytes_or_none(capsys):
    from aotc.cli import build_parser, main

    assert build_parser().parse_args(["export", "m.py"]).samples == 16
    assert build_parser().parse_args(["export", "m.py", "--samples", "0.5"]).samples == 0.5
    assert build_parser().parse_args(["export", "m.py", "--samples", "none"]).samples is None
    for bad in ("-1", "lots"):
        with pytest.raises(SystemExit):
            main(["export", "m.py", "--samples", bad])
        assert "expected a size in MB (a number >= 0) or 'none'" in capsys.readouterr().err


def test_export_help_lists_verbose_and_the_new_options():
    r = run_aotc("export", "--help")
    for flag in ("--verbose", "--quick", "--samples MB|none", "--allow-trivial-outputs"):
        assert flag in r.stdout, r.stdout
