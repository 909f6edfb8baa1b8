"""`aotc check --url`: parity over HTTP against both servers ("cpp": aotc-server, "python": `aotc serve
--python`), run as a user runs it. It must pass on a package exported from the model file and catch a
server whose package was exported from different weights. The eager Python server also stands in for
subtler wrong servers (a 1e-3 shift in one bias) and for a model with jagged inputs (make_inputs)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from launch import REPO, Server, make_repository

WRONG_MODELS = REPO / "build" / "test-models"  # generated files at stable paths, so their exports are cached


def _variant(name: str, old: str, new: str, source: str = "models/mlp.py") -> Path:
    text = (REPO / source).read_text()
    assert old in text, f"{source} no longer contains {old!r}; update this test"
    path = WRONG_MODELS / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text.replace(old, new):
        path.write_text(text.replace(old, new))
    return path


@pytest.fixture(scope="module")
def check_repository(tmp_path_factory, export_package, pkg_mlp, pkg_simple):
    wrong = _variant("mlp_wrong_weights", "torch.manual_seed(0)", "torch.manual_seed(1)")
    return make_repository(tmp_path_factory.mktemp("check_repo"), {
        "mlp": pkg_mlp, "simple": pkg_simple, "mlp_wrong": export_package(str(wrong))})


@pytest.fixture(scope="module", params=["cpp", "python"])
def server(request, check_repository):
    with Server(request.param, check_repository) as s:
        yield s


def _check(url: str, model: str, model_file: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aotc.cli", "check", "--url", url, "--name", model, model_file,
                           *extra], cwd=REPO, capture_output=True, text=True, timeout=300)


def _lines(stdout: str) -> list[str]:
    return re.findall(r"^\s+(\w+)\s+\[.*?\]\s+max abs (\S+)\s+max rel \S+.*\s(ok|MISMATCH)$", stdout, re.M)


def test_check_passes_on_the_exported_package(server):
    r = _check(server.url, "mlp", "models/mlp.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"example: x\[64, 512\]", r.stdout)
    for which, size in (("min", 1), ("max", 1024)):  # the ends of the package's dynamic batch range
        assert re.search(rf"fresh {which} \(batch={size}\): x\[{size}, 512\]", r.stdout), r.stdout
    assert len(_lines(r.stdout)) == 4 and all(v == "ok" for *_, v in _lines(r.stdout))
    assert "verdict: PASS" in r.stdout


def test_check_integer_model_with_two_inputs(server):
    r = _check(server.url, "simple", "models/simple.py")
    assert r.returncode == 0, r.stdout + r.stderr
    names = [n for n, _, _ in _lines(r.stdout)]
    assert names.count("OUTPUT0") == names.count("OUTPUT1") >= 3


def test_check_catches_a_package_with_other_weights(server):
    r = _check(server.url, "mlp_wrong", "models/mlp.py")
    assert r.returncode == 1, r.stdout + r.stderr
    assert all(v == "MISMATCH" for *_, v in _lines(r.stdout)) and _lines(r.stdout)
    assert "verdict: FAIL" in r.stdout
    err = r.stderr.strip()
    assert "disagrees with eager PyTorch" in err and "\n" not in err and "Traceback" not in err


def test_check_names_a_mismatched_model(server):
    r = _check(server.url, "simple", "models/mlp.py")
    assert r.returncode != 0 and "the model file has ['x']" in r.stderr and "Traceback" not in r.stderr
    r = _check(server.url, "nope", "models/mlp.py")
    assert r.returncode != 0 and "404" in r.stderr


def test_check_catches_a_small_weight_shift_on_the_eager_server():
    shifted = _variant("mlp_shifted_bias", "return SimpleMLP().eval()",
                       "m = SimpleMLP().eval()\n    m.fc2.bias.data[7] += 1e-3\n    return m")
    with Server("python-eager", shifted, "--name", "mlp") as eager:
        r = _check(eager.url, "mlp", "models/mlp.py")
    assert r.returncode == 1, r.stdout + r.stderr
    mism = [line for line in r.stdout.splitlines() if "MISMATCH" in line]
    assert len(mism) == 4 and all("max abs 0.001" in line for line in mism), r.stdout


def test_check_uses_make_inputs_for_jagged_models():
    with Server("python-eager", "models/embedding_bag.py", "--name", "recsys") as eager:
        r = _check(eager.url, "recsys", "models/embedding_bag.py", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fresh max (batch=1024): dense[1024, 13]" in r.stdout and "verdict: PASS" in r.stdout
    # the id counts follow from what make_inputs makes: never sized on their own
    assert "not varied: n_item_ids, n_tag_ids, n_user_ids" in r.stdout


def test_check_varies_every_dim_of_a_model_given_by_name():
    """GPT-2 from config: inputs by name, a ModelOutput back, batch and sequence both varied (the fresh-input
    generator the export uses); --name left out: the model file's name."""
    with Server("python-eager", "models/gpt2.py", "--name", "gpt2") as eager:
        r = subprocess.run([sys.executable, "-m", "aotc.cli", "check", "--url", eager.url, "models/gpt2.py"],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for line in ("fresh min (batch=1, seq=4): input_ids[1, 4] attention_mask[1, 4]",
                 "fresh seq max (batch=2, seq=128): input_ids[2, 128] attention_mask[2, 128]",
                 "fresh batch max (batch=8, seq=16): input_ids[8, 16] attention_mask[8, 16]"):
        assert line in r.stdout, r.stdout
    assert "verdict: PASS (10 output comparisons within tolerance)" in r.stdout
