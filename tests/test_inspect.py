"""`aotc inspect` and the checks that decide whether a package can run here (shared with the loader):
torch version, device, CPU ISA, tampered or foreign archives."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import zipfile

import pytest
import torch

from aotc.errors import PackageError
from aotc.loader import load_package
from aotc.manifest import read, why_cannot_run
from conftest import REPO, run_aotc


def _rewrite(src, dst, edit_manifest=None, edit_so=None):
    """A copy of package `src` with its manifest and/or .so bytes changed."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if edit_manifest and info.filename.endswith("_metadata.json"):
                meta = json.loads(data)
                m = json.loads(meta["aotc.manifest"])
                edit_manifest(m)
                meta["aotc.manifest"] = json.dumps(m)
                data = json.dumps(meta).encode()
            if edit_so and info.filename.endswith(".so"):
                data = edit_so(data)
            zout.writestr(info, data)
    return dst


def test_inspect_prints_the_manifest_and_runs_here(pkg_mlp):
    r = run_aotc("inspect", pkg_mlp, "--json")
    assert r.returncode == 0, r.stderr
    text, _, verdict = r.stdout.rpartition("runs here:")
    assert json.loads(text) == read(str(pkg_mlp)).to_dict()
    assert verdict.strip().startswith("yes") and torch.__version__ in verdict


def test_inspect_summarizes_by_default(pkg_mlp):
    r = run_aotc("inspect", pkg_mlp)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) < 20 and not r.stdout.lstrip().startswith("{"), r.stdout
    assert lines[0].startswith(f"package   {pkg_mlp}") and "model     mlp  device=cpu" in r.stdout
    for line in ("input     x: float32[1..1024,512]", "output    output0: float32[1..1024,512]", "dims      batch 1..1024",
                 "batch     1..1024", "fallback  none", "tolerance atol=0.0001 rtol=0.0001"):
        assert line in lines, r.stdout
    assert re.search(r"^samples   2 \(0\.\d+ MB of a 16 MB cap\): example inputs, fresh odd \(batch=37\)$", r.stdout,
                     re.M), r.stdout
    assert lines[-1].startswith("runs here: yes")


def test_inspect_says_why_a_package_cannot_run(pkg_simple, tmp_path):
    old = _rewrite(pkg_simple, tmp_path / "old.pt2", edit_manifest=lambda m: m.update(torch_version="2.1.0"))
    r = run_aotc("inspect", old)
    assert r.returncode == 0
    assert f"runs here: no: compiled with torch 2.1.0, this machine has torch {torch.__version__}" in r.stdout
    with pytest.raises(PackageError, match="cannot run here: compiled with torch 2.1.0"):
        load_package(str(old))


def test_inspect_of_a_file_that_is_no_package(tmp_path):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip")
    r = run_aotc("inspect", bad)
    assert r.returncode == 2 and r.stderr.strip() == f"aotc: error: {bad} is not a readable .pt2 archive " \
                                                      f"(File is not a zip file); re-export it"


def test_tampered_so_is_refused_before_loading(pkg_simple, tmp_path):
    bad = _rewrite(pkg_simple, tmp_path / "tampered.pt2", edit_so=lambda b: b[:-1] + bytes([b[-1] ^ 1]))
    with pytest.raises(PackageError, match=r"sha256 of data/aotinductor/model/.*\.so is .*the manifest says"):
        load_package(str(bad))


def test_unlisted_so_is_refused(pkg_simple, tmp_path):
    bad = _rewrite(pkg_simple, tmp_path / "unlisted.pt2", edit_manifest=lambda m: m.update(files_sha256={}))
    with pytest.raises(PackageError, match="is not listed in the manifest's files_sha256"):
        load_package(str(bad))


def test_foreign_format_is_refused(pkg_simple, tmp_path):
    bad = _rewrite(pkg_simple, tmp_path / "v2.pt2", edit_manifest=lambda m: m.update(format="aotc/2"))
    with pytest.raises(PackageError, match="manifest format is 'aotc/2', this aotc reads 'aotc/1'"):
        read(str(bad))


@pytest.fixture
def manifest(pkg_mlp):
    return read(str(pkg_mlp))


def test_why_cannot_run_accepts_this_machine(manifest):
    assert why_cannot_run(manifest) is None


def test_why_cannot_run_checks_the_isa(manifest):
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    have = {str(v).lower() for v in valid_vec_isa_list()}
    missing = next((isa for isa in ("avx512", "avx2", "neon", "sve") if isa not in have), None)
    if missing is None:
        pytest.skip("this CPU supports every ISA we could ask for")
    assert f"compiled for CPU ISA {missing}" in why_cannot_run(dataclasses.replace(manifest, cpu_isa=missing))


def test_why_cannot_run_checks_device(manifest):
    assert "unknown device 'tpu'" in why_cannot_run(dataclasses.replace(manifest, device="tpu"))
    if not torch.cuda.is_available():
        assert "no usable CUDA device" in why_cannot_run(dataclasses.replace(manifest, device="cuda"))


def test_inspect_into_a_closed_pipe_ends_quietly(pkg_mlp):
    """`aotc inspect PKG | head`: the reader goes away before aotc writes; no traceback, exit 0."""
    p = subprocess.Popen([sys.executable, "-m", "aotc.cli", "inspect", str(pkg_mlp)], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and err == "", err
