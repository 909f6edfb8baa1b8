"""The example models of the libraries people use (models/hf_bert.py, gpt2.py, torchrec_ebc.py) and the edge
cases that used to fool the exporter, through the real `aotc export`: Hugging Face ModelOutputs as they are,
inputs by name, a sequence dim varied by parity, a jagged TorchRec model through `aotc check PKG`, a
data-dependent first output, an inconclusive (trivial) reference allowed, the sample cap, and --quick
(its embedding-bag pick in-process)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from aotc.loader import load_package
from aotc.manifest import read
from aotc.runtime import Session
from conftest import DATA, eager_reference, run_aotc


def _log(pkg) -> str:
    return (pkg.parent / "export.log").read_text()


def _rows(log: str) -> dict[str, str]:
    """{case label: status} of the summary's parity table."""
    return {m.group(2): m.group(1) for m in re.finditer(r"^  (ok|FAIL|trivial) +(\S.*?\)|example inputs) +\S+: abs",
                                                        log, re.M)}


def test_hf_bert_returns_its_model_output_and_parity_varies_the_sequence(export_package):
    pkg = export_package("models/hf_bert.py")
    m = read(str(pkg))
    assert [t.name for t in m.outputs] == ["last_hidden_state", "pooler_output"]
    assert [t.symbols for t in m.inputs] == [("batch", "seq")] * 2 and m.dims == {"batch": (1, 16), "seq": (8, 128)}
    rows = _rows(_log(pkg))
    for label in ("fresh min (batch=1, seq=8)", "fresh max (batch=16, seq=128)", "fresh odd (batch=9, seq=45)",
                  "fresh seq max (batch=4, seq=128)", "fresh seq min (batch=4, seq=8)",
                  "fresh batch max (batch=16, seq=32)"):
        assert rows.get(label) == "ok", (label, rows)
    assert "result    PASS" in _log(pkg)
    # the C++ runtime and the Python loader see the flat named leaves
    session = Session(str(pkg))
    assert session.output_names == ["last_hidden_state", "pooler_output"]
    (ins, stored), *_ = session.samples()
    for got, want in zip(session.run(ins), stored):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)
    ids, mask = torch.randint(0, 1000, (3, 17)), torch.ones(3, 17, dtype=torch.int64)
    _, _, eager = eager_reference("models/hf_bert.py", inputs=(ids, mask))
    for got, want in zip(load_package(str(pkg))(ids, mask), eager):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3)


def test_gpt2_takes_its_inputs_by_name(export_package):
    pkg = export_package("models/gpt2.py")
    m = read(str(pkg))
    assert [t.name for t in m.inputs] == ["input_ids", "attention_mask"] and [t.name for t in m.outputs] == ["logits"]
    assert m.outputs[0].shape == (-1, -1, 1000) and m.batch is not None
    log = _log(pkg)
    assert _rows(log).get("fresh seq max (batch=2, seq=128)") == "ok" and "result    PASS" in log


def test_a_jagged_torchrec_model_passes_aotc_check(export_package):
    pkg = export_package("models/torchrec_ebc.py", "--embedding-bag", "aten_sum")
    m = read(str(pkg))
    assert [t.name for t in m.outputs] == ["user", "item"]  # the dict's keys
    assert [t.symbols for t in m.inputs] == [("n_ids",), ("2*batch",)] and set(m.dims) == {"n_ids", "batch"}
    r = run_aotc("check", pkg, "models/torchrec_ebc.py")
    assert r.returncode == 0, r.stdout + r.stderr
    lo, hi = m.dims["batch"]
    for label in (f"fresh min (batch={lo})", f"fresh max (batch={hi})"):
        assert re.search(rf"^{re.escape(label)} +user .* ok +.* ok$", r.stdout, re.M), r.stdout
    assert "not varied: n_ids" in r.stdout and "parity ok: " in r.stdout


def test_a_data_dependent_first_output_exports(export_package):
    pkg = export_package(str(DATA / "data_dependent_output.py"))
    m = read(str(pkg))
    assert [t.name for t in m.outputs] == ["positive", "doubled"] and m.outputs[0].ranges[0][0] == 0
    assert m.batch is None and m.dims == {"batch": (1, 32)}  # no shared batch with a nonzero output
    rows = _rows(_log(pkg))
    # the batch is the input's, 1..32: never a range read off the nonzero output
    assert rows.get("fresh min (batch=1)") == "ok" and rows.get("fresh max (batch=32)") == "ok", rows


def test_quick_with_trivial_outputs_allowed_says_inconclusive(export_package):
    """--allow-trivial-outputs writes the package and the result says INCONCLUSIVE; --quick checks the example
    inputs only and reports the graph undecomposed."""
    pkg = export_package(str(DATA / "trivial_output.py"), "--allow-trivial-outputs", "--quick")
    log = _log(pkg)
    assert _rows(log) == {"example inputs": "trivial"}, log
    assert re.search(r"^result    INCONCLUSIVE: output 'logits' is within atol 0.0001 of zero everywhere .*; output "
                     r"'probs' is constant .*\(allowed by --allow-trivial-outputs\)$", log, re.M), log
    assert "(not decomposed: --quick)" in log and "eager runs of the parity cases (quick: the examples only)" in log


def test_the_sample_cap_makes_the_example_smaller(export_package):
    pkg = export_package("models/simple.py", "--samples", "0.001")  # 1000 bytes: the example is 1024
    m = read(str(pkg))
    assert [s.case for s in m.samples] == ["sample (batch=2)"]
    assert m.samples_cap["max_bytes"] == 1000 and [c["case"] for c in m.samples_cap["left_out"]] == [
        "example inputs", "fresh odd (batch=37)"]
    assert m.samples_cap["bytes"] == sum(s.bytes for s in m.samples) < 1000 + 4 * 128  # + the .npy headers
    r = run_aotc("inspect", pkg)
    assert ("samples   1 (0.00 MB of a 0.001 MB cap): sample (batch=2); left out: example inputs (0.00 MB), "
            "fresh odd (batch=37) (0.01 MB)") in r.stdout, r.stdout
    assert len(Session(str(pkg)).samples()) == 1  # aotc-run's self-check still has one


def test_quick_picks_the_embedding_bag_lowering_without_measuring():
    from torch import nn

    from aotc.rewrite import embedding_bag

    class Bags(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(50, 4, mode="mean")

        def forward(self, ids, offsets):
            return self.bag(ids, offsets)

    inputs = (torch.randint(0, 50, (9,)), torch.tensor([0, 4, 6]))
    ep = torch.export.export(Bags(), inputs)
    _, report = embedding_bag.rewrite(ep, inputs, "cpu", "auto", measure=False)
    assert report["lowering"] == "aten_sum" == embedding_bag.heuristic("cpu")
    assert report["candidates_ms"] == {} and "measure_s" not in report and "--quick" in report["note"]
