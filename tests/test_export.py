"""End-to-end export: each example model file through the real `aotc export`, then the package checked
against the manifest format (docs/manifest.md) and against eager PyTorch rebuilt from the model file."""

from __future__ import annotations

import hashlib
import json
import re
import zipfile

import numpy as np
import pytest
import torch

from aotc.compile import cpu_isa
from aotc.errors import InputError
from aotc import manifest
from aotc.loader import load_package
from conftest import eager_reference, read_samples

EXPECTED = {
    "mlp": ("models/mlp.py",
            [("x", "float32", [-1, 512], [[1, 1024], [512, 512]])],
            [("output0", "float32", [-1, 512], [[1, 1024], [512, 512]])],
            {"min": 1, "max": 1024}),
    "simple": ("models/simple.py",
               [("INPUT0", "int32", [-1, 16], [[1, 1024], [16, 16]]),
                ("INPUT1", "int32", [-1, 16], [[1, 1024], [16, 16]])],
               [("OUTPUT0", "int32", [-1, 16], [[1, 1024], [16, 16]]),
                ("OUTPUT1", "int32", [-1, 16], [[1, 1024], [16, 16]])],
               {"min": 1, "max": 1024}),
    "bert": ("models/bert.py",
             [("input_ids", "int64", [-1, 128], [[1, 64], [128, 128]])],
             [("last_hidden_state", "float32", [-1, 128, 128], [[1, 64], [128, 128], [128, 128]]),
              ("pooler_output", "float32", [-1, 128], [[1, 64], [128, 128]])],
             {"min": 1, "max": 64}),
}


@pytest.fixture(params=sorted(EXPECTED))
def example(request):
    name = request.param
    return name, request.getfixturevalue(f"pkg_{name}")


def manifest_json(path: str) -> dict:
    """The manifest as aotc.manifest reads it, in its JSON form (docs/manifest.md)."""
    return manifest.read(path).to_dict()


def _specs(entries):
    return [(t["name"], t["dtype"], t["shape"], t["ranges"]) for t in entries]


def test_manifest_describes_the_model(example):
    name, pkg = example
    _, inputs, outputs, batch = EXPECTED[name]
    m = manifest_json(str(pkg))
    assert m["format"] == "aotc/1" and m["name"] == name
    assert m["torch_version"] == torch.__version__
    assert m["device"] == "cpu" and m["cpu_isa"] == cpu_isa() and m["cuda_arch"] is None
    assert _specs(m["inputs"]) == inputs
    assert _specs(m["outputs"]) == outputs
    assert m["batch"] == batch
    assert m["compile"]["dtype"] == "fp32" and m["compile"]["freezing"] is True
    assert m["tolerance"]["atol"] > 0 and m["tolerance"]["rtol"] > 0


def test_every_metadata_file_carries_the_final_manifest_with_so_hashes(example):
    _, pkg = example
    m = manifest_json(str(pkg))
    with zipfile.ZipFile(pkg) as zf:
        names = zf.namelist()
        root = names[0].split("/")[0]
        assert all(n.startswith(root + "/") for n in names), "one top-level folder"
        sos = {n[len(root) + 1:]: hashlib.sha256(zf.read(n)).hexdigest() for n in names if n.endswith(".so")}
        assert sos and m["files_sha256"] == sos
        metas = [n for n in names if n.endswith("_metadata.json")]
        assert metas
        for n in metas:
            assert json.loads(json.loads(zf.read(n))["aotc.manifest"]) == m


def test_samples_are_npy_v1_and_match_eager(example):
    name, pkg = example
    spec = EXPECTED[name][0]
    m = manifest_json(str(pkg))
    with zipfile.ZipFile(pkg) as zf:
        root = zf.namelist()[0].split("/")[0]
        for s in m["samples"]:
            for p in s["inputs"] + s["outputs"]:
                assert zf.read(f"{root}/{p}")[:8] == b"\x93NUMPY\x01\x00"
    samples = read_samples(pkg)
    assert len(samples) >= 1
    tol = m["tolerance"]
    for inputs, outputs in samples:
        assert [a.dtype.name for a in inputs] == [t["dtype"] for t in m["inputs"]]
        _, _, eager = eager_reference(spec, inputs=tuple(torch.from_numpy(a) for a in inputs))
        assert len(eager) == len(outputs)
        for want, got in zip(eager, outputs):
            np.testing.assert_allclose(got, want.numpy(), atol=tol["atol"], rtol=tol["rtol"])


def test_package_matches_eager_on_a_fresh_batch(example):
    name, pkg = example
    spec = EXPECTED[name][0]
    runner = load_package(str(pkg))
    _, inputs, eager = eager_reference(spec)
    g = torch.Generator().manual_seed(7)
    fresh = tuple(torch.randint(0, 1000, (3, *x.shape[1:]), generator=g, dtype=x.dtype)
                  if not x.is_floating_point() else torch.randn(3, *x.shape[1:], generator=g) for x in inputs)
    _, _, eager = eager_reference(spec, inputs=fresh)
    got = runner(*fresh)
    tol = runner.manifest.tolerance
    for o, e in zip(got, eager):
        torch.testing.assert_close(o, e, atol=tol.atol, rtol=tol.rtol)


def test_torch_own_loader_opens_the_package(pkg_mlp):
    compiled = torch._inductor.aoti_load_package(str(pkg_mlp))
    assert json.loads(compiled.get_metadata()["aotc.manifest"]) == manifest_json(str(pkg_mlp))
    _, inputs, eager = eager_reference("models/mlp.py")
    out = compiled(*inputs)
    out = out[0] if isinstance(out, (list, tuple)) else out  # torch unflattens a single output
    torch.testing.assert_close(out, eager[0], atol=1e-4, rtol=1e-4)


def test_export_prints_a_summary_with_parity(pkg_mlp):
    log = (pkg_mlp.parent / "export.log").read_text()
    for stage in ("[1/8] loading", "[5/8] eager runs of the parity cases", "[6/8] AOTInductor compile",
                  "[8/8] parity"):
        assert stage in log
    assert "compile " in log and "fallback  none" in log and "MB)" in log
    assert re.search(r"ok +fresh max \(batch=1024\) +output0: abs \S+ rel \S+ out 0/524288", log), log
    assert "samples   2 (" in log and "of a 16 MB cap): example inputs, fresh odd (batch=37)" in log
    assert "PASS" in log


@pytest.mark.parametrize("shape, dtype, message", [
    ((1025, 512), torch.float32, "input 'x' dim 0 is 1025, the package accepts 1..1024"),
    ((4, 511), torch.float32, "input 'x' dim 1 is 511, the package accepts exactly 512"),
    ((4, 512), torch.float64, "input 'x' has dtype float64, the package expects float32"),
    ((512,), torch.float32, "input 'x' has 1 dims [512], the package expects 2 dims"),
])
def test_loader_refuses_inputs_outside_the_manifest(pkg_mlp, shape, dtype, message):
    runner = load_package(str(pkg_mlp))
    with pytest.raises(InputError) as err:
        runner(torch.zeros(shape, dtype=dtype))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_loader_runs_the_bounds_of_the_range(pkg_mlp):
    runner = load_package(str(pkg_mlp))
    for batch in (1, 1024):
        x = torch.randn(batch, 512)
        _, _, eager = eager_reference("models/mlp.py", inputs=(x,))
        torch.testing.assert_close(runner(x)[0], eager[0], atol=1e-4, rtol=1e-4)


def test_fp16_with_dynamic_batch_flag(export_package):
    pkg = export_package("models/mlp.py", "--dtype", "fp16", "--dynamic-batch", "2:256", "--name", "mlp_fp16",
                         "--freezing", "off", "--inductor-config", "coordinate_descent_tuning=True")
    m = manifest_json(str(pkg))
    assert m["name"] == "mlp_fp16" and m["compile"]["dtype"] == "fp16" and m["compile"]["freezing"] is False
    assert m["compile"]["inductor"]["coordinate_descent_tuning"] is True
    assert m["inputs"][0]["dtype"] == "float16" and m["outputs"][0]["dtype"] == "float16"
    assert m["inputs"][0]["ranges"][0] == [2, 256] and m["batch"] == {"min": 2, "max": 256}
    assert m["tolerance"]["atol"] >= 1e-2
    x = torch.randn(5, 512)
    _, _, eager = eager_reference("models/mlp.py", dtype="fp16", inputs=(x,))
    got = load_package(str(pkg))(x.half())[0]
    torch.testing.assert_close(got, eager[0], atol=m["tolerance"]["atol"], rtol=m["tolerance"]["rtol"])
    with pytest.raises(InputError, match="dim 0 is 1, the package accepts 2..256"):
        load_package(str(pkg))(torch.randn(1, 512).half())


def test_freezing_defaults_per_device_and_the_override():
    from aotc.compile import inductor_configs

    assert inductor_configs("cpu", False, "")["freezing"] is True
    assert inductor_configs("cuda", False, "")["freezing"] is False
    assert inductor_configs("cuda", True, "", freezing=True)["freezing"] is True
    assert inductor_configs("cpu", False, "", freezing=False)["freezing"] is False


@pytest.mark.parametrize("item,message", [
    ("nope=1", "not an Inductor config"),
    ("coordinate_descent_tuning", "expected KEY=VALUE"),
    ("coordinate_descent_tuning=yes please", "must be a Python literal"),
])
def test_inductor_config_flag_refuses_bad_items(item, message):
    from aotc.errors import ExportError
    from aotc.pipeline import parse_inductor_configs

    assert parse_inductor_configs(["coordinate_descent_tuning=True"]) == {"coordinate_descent_tuning": True}
    with pytest.raises(ExportError, match=message):
        parse_inductor_configs([item])


def test_embedding_bag_model_exports_with_its_rewrite_report(export_package):
    pkg = export_package("models/embedding_bag.py")
    m = manifest_json(str(pkg))
    assert [t["name"] for t in m["inputs"]][:3] == ["dense", "user_ids", "user_offsets"]
    assert m["outputs"][0]["name"] == "score"
    assert m["batch"] is None  # the id inputs have their own dynamic lengths
    assert "embedding_bag" in m["rewrites"] and m["rewrites"]["embedding_bag"]["lowering"]
    # the summary shows the measured choice: every candidate on the example and at a serving-sized batch
    rw, log = m["rewrites"]["embedding_bag"], (pkg.parent / "export.log").read_text()
    assert f"rewrite   embedding_bag: lowering {rw['lowering']} (measured: aten " in log, log
    assert f"at {rw['scaled_bags']} bags (example bags {rw['scaled_longer']}x as long, repeated): aten " in log, log
    if m["rewrites"]["embedding_bag"]["lowering"] == "aten":
        assert "aten._embedding_bag.default" in m["fallback_ops"]


def test_sdpa_backend_is_held_through_the_compile_and_recorded(export_package):
    """--sdpa-backend math: no attention kernel left for AOTInductor to call (the math version is matmuls and a
    softmax it compiles), recorded in the manifest, and the package matches eager."""
    pkg = export_package("models/bert.py", "--sdpa-backend", "math")
    m = manifest_json(str(pkg))
    assert m["compile"]["sdpa_backend"] == "math"
    assert not any("scaled_dot_product" in op for op in m["fallback_ops"]), m["fallback_ops"]
    assert "PASS" in (pkg.parent / "export.log").read_text()
    default = manifest_json(str(export_package("models/bert.py")))
    assert "sdpa_backend" not in default["compile"]  # CPU: PyTorch's choice, nothing recorded
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in default["fallback_ops"]
