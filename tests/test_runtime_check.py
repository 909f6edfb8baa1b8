"""`aotc check PKG.pt2 --model MODEL.py`: eager vs the C++ runtime vs PyTorch's Python loader, run as the
user runs it (the CLI in a subprocess); and the failure when the model file is not the one exported."""

from __future__ import annotations

import re

from conftest import REPO, run_aotc


def test_check_passes_on_the_exported_model(pkg_simple):
    r = run_aotc("check", pkg_simple, "--model", "models/simple.py")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if re.match(r"(sample|fresh) ", line)]
    # 2 stored samples + min/max/odd batch, 2 outputs each, two backends per row
    assert len(rows) == 10, r.stdout
    assert all(line.count(" ok") == 2 for line in rows), r.stdout
    assert any("batch=1024" in line for line in rows) and any("batch=1)" in line for line in rows)
    assert "parity ok: 5 cases" in r.stdout


def test_check_fails_with_another_model_file(pkg_mlp, tmp_path):
    other = tmp_path / "mlp_reseeded.py"
    other.write_text((REPO / "models" / "mlp.py").read_text().replace("torch.manual_seed(0)", "torch.manual_seed(1)"))
    r = run_aotc("check", pkg_mlp, "--model", other)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.startswith("aotc: error: ") and "no longer produces the eager output" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_check_refuses_a_tampered_package(pkg_mlp, tmp_path):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(pkg_mlp.read_bytes()[:100000])
    r = run_aotc("check", bad, "--model", "models/mlp.py")
    assert r.returncode != 0 and "corrupt or truncated" in r.stderr
