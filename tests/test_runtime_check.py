"""`aotc check PKG.pt2 MODEL.py`: eager vs the C++ runtime vs PyTorch's Python loader, run as the user runs it
(the CLI in a subprocess); and the failure when the model file is not the one exported."""

from __future__ import annotations

import re

from conftest import REPO, run_aotc


def test_check_passes_on_the_exported_model(pkg_simple):
    r = run_aotc("check", pkg_simple, "models/simple.py")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if re.match(r"(sample|fresh) ", line)]
    # 2 stored samples + min/max/odd batch, 2 outputs each, two backends per row
    assert len(rows) == 10, r.stdout
    assert all(line.count(" ok") == 2 for line in rows), r.stdout
    # each backend's cells: max abs, max rel, elements outside tolerance, verdict
    assert re.search(r"^fresh max \(batch=1024\) +OUTPUT0 +0 +0 +0/16384 +ok +0 +0 +0/16384 +ok$", r.stdout, re.M), \
        r.stdout
    assert any("batch=1024" in line for line in rows) and any("batch=1)" in line for line in rows)
    assert "parity ok: 5 cases" in r.stdout


def test_check_fails_with_another_model_file(pkg_mlp, tmp_path):
    other = tmp_path / "mlp_reseeded.py"
    other.write_text((REPO / "models" / "mlp.py").read_text().replace("torch.manual_seed(0)", "torch.manual_seed(1)"))
    r = run_aotc("check", pkg_mlp, "--model", other)  # --model: the model file, as the positional one
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.startswith("aotc: error: ") and "no longer produces the eager output" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_check_refuses_a_tampered_package(pkg_mlp, tmp_path):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(pkg_mlp.read_bytes()[:100000])
    r = run_aotc("check", bad, "models/mlp.py")
    assert r.returncode != 0 and "corrupt or truncated" in r.stderr


def test_check_names_what_its_arguments_mean(pkg_mlp, capsys):
    """--model is the model file in both forms; the server's model name is --name, only with --url."""
    import pytest

    from aotc.cli import main

    for argv, fragment in [
        (["check", str(pkg_mlp)], "check PKG.pt2 MODEL.py takes one model file MODEL.py[:NAME] (positional or "
                                  "--model), got 0: none"),
        (["check", str(pkg_mlp), "models/mlp.py", "--model", "models/mlp.py"], "got 2"),
        (["check", "models/mlp.py"], "check takes PKG.pt2 MODEL.py[:NAME] (or --url URL MODEL.py), got models/mlp.py"),
        (["check", str(pkg_mlp), "models/mlp.py", "--name", "mlp"], "--name is the model's name on a server"),
        (["check", "--url", "http://127.0.0.1:9", "--model", "mlp", "models/mlp.py"],
         "--model names the model file (MODEL.py[:NAME]); give the model's name on the server with --name mlp"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and fragment in err, (argv, err)
