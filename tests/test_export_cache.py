"""aotc export's cache (aotc.cache): every part of the key moves the key, a hit hands back the same package,
a corrupt entry is rebuilt, --no-cache skips it, and least recently used entries go first. The key tests run
in-process on a model file of their own; the rest runs `aotc export` as a user does, on models/simple.py."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import time
import zipfile

import pytest
import torch

import aotc
from aotc import cache
from aotc import compile as aoti
from aotc.load_model import load_model_file, with_example_batch
from aotc.manifest import read
from aotc.pipeline import ExportOptions
from conftest import REPO, run_aotc

MODEL = """import torch
from helper import WIDTH
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(WIDTH, 3)
    def forward(self, x):
        return self.fc(x)
def model():
    torch.manual_seed(0)
    return M()
def example_inputs():
    return (torch.ones(2, WIDTH),)
"""


@pytest.fixture
def model_file(tmp_path, monkeypatch):
    (tmp_path / "helper.py").write_text("WIDTH = 4\n")
    (tmp_path / "m.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))  # as the model file's folder is when it is imported
    return tmp_path / "m.py"


def parts_of(path, opts=ExportOptions(), edit=None):
    mf = load_model_file(str(path))
    if edit:
        mf = edit(mf)
    return cache.key_parts(mf, opts)


def moved(base: dict, other: dict) -> list[str]:
    assert cache.key_of(base) != cache.key_of(other) or base == other
    return sorted(k for k in base if base[k] != other[k])


def test_the_remembered_cpu_isa_is_inductors():
    assert cache.cpu_isa() == aoti.cpu_isa()  # the second call reads it from the cache folder
    assert cache.cpu_isa() == aoti.cpu_isa()


def test_the_sources_are_the_file_and_its_local_imports(model_file):
    assert sorted(parts_of(model_file)["sources"]) == ["helper.py", "m.py"]


def test_each_part_of_the_key_moves_it(model_file, monkeypatch):
    base = parts_of(model_file)
    assert parts_of(model_file) == base  # the same export, the same key

    model_file.write_text(MODEL + "# a comment\n")
    assert moved(base, parts_of(model_file)) == ["sources"]
    model_file.write_text(MODEL)
    (model_file.parent / "helper.py").write_text("WIDTH = 4  # the same value, another source\n")
    assert moved(base, parts_of(model_file)) == ["sources"]
    (model_file.parent / "helper.py").write_text("WIDTH = 4\n")

    def reweighted(mf):
        with torch.no_grad():
            mf.model.fc.bias[0] += 1
        return mf
    assert moved(base, parts_of(model_file, edit=reweighted)) == ["weights"]
    assert moved(base, parts_of(model_file, edit=lambda mf: with_example_batch(mf, 3))) == ["example_inputs"]
    ds = {"x": {0: torch.export.Dim("batch", min=1, max=8)}}
    assert moved(base, parts_of(model_file, edit=lambda mf: dataclasses.replace(mf, dynamic_shapes=ds))) == \
        ["dynamic_shapes"]

    monkeypatch.setattr(torch, "__version__", "2.99.0")
    assert moved(base, parts_of(model_file)) == ["torch"]
    monkeypatch.undo()
    monkeypatch.syspath_prepend(str(model_file.parent))
    monkeypatch.setattr(aotc, "__version__", "9.9.9")
    assert moved(base, parts_of(model_file)) == ["aotc"]
    monkeypatch.setattr(aotc, "__version__", base["aotc"][0])
    monkeypatch.setattr(cache, "cpu_isa", lambda: "some_other_isa")
    assert moved(base, parts_of(model_file)) == ["target"]
    monkeypatch.setattr(aoti, "cuda_arch", lambda: ["sm_90"])
    assert moved(base, parts_of(model_file, ExportOptions(device="cuda"))) == ["device", "options", "target"]


CHANGED = {"dtype": "fp16", "dynamic_batch": (1, 8), "example_batch": 3, "static_batches": (2,),
           "max_autotune": True, "freezing": False, "inductor_extra": {"coordinate_descent_tuning": True},
           "strict": True, "sdpa_backend": "math", "name": "other", "allow_python_ops": True,
           "embedding_bag": "aten", "allow_trivial_outputs": True, "samples": None, "quick": True,
           "seq_buckets": "x:1=8,16", "seq_pack": "x:1=16"}


@pytest.mark.parametrize("option", sorted(CHANGED))
def test_every_export_option_moves_the_key(model_file, option):
    assert moved(parts_of(model_file), parts_of(model_file, ExportOptions(**{option: CHANGED[option]}))) == \
        ["options"]


def test_every_option_is_in_the_key_or_said_not_to_be():
    fields = {f.name for f in dataclasses.fields(ExportOptions)}
    assert fields == set(CHANGED) | {"device"} | set(cache._IGNORED_OPTIONS)


@pytest.mark.parametrize("option, value", [("out", "elsewhere.pt2"), ("quiet", True), ("verbose", True)])
def test_where_and_how_loudly_do_not(model_file, option, value):
    assert parts_of(model_file, ExportOptions(**{option: value})) == parts_of(model_file)


def test_least_recently_used_entries_go_first(tmp_path, pkg_simple):
    size = pkg_simple.stat().st_size
    c = cache.ExportCache(str(tmp_path), max_bytes=int(2.5 * size))
    c.store("k1", str(pkg_simple), "summary 1", {})
    time.sleep(0.01)
    c.store("k2", str(pkg_simple), "summary 2", {})
    time.sleep(0.01)
    assert c.lookup("k1")[1] == "summary 1"  # k1 is now the more recently used
    time.sleep(0.01)
    c.store("k3", str(pkg_simple), "summary 3", {})
    assert c.lookup("k2") is None and c.lookup("k1") is not None and c.lookup("k3") is not None


def export(*args, cache_dir):
    t0 = time.perf_counter()
    r = run_aotc("export", "models/simple.py", *args, env={"AOTC_CACHE_DIR": str(cache_dir)}, timeout=900)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr, time.perf_counter() - t0


def test_a_hit_hands_back_the_same_package_and_a_corrupt_entry_is_rebuilt(tmp_path):
    first, _ = export("-o", tmp_path / "a.pt2", cache_dir=tmp_path / "c")
    key = re.search(r"^cache miss ([0-9a-f]{32})$", first, re.M).group(1)
    second, seconds = export("-o", tmp_path / "b.pt2", cache_dir=tmp_path / "c")
    assert re.search(rf"^cache hit {key} ", second, re.M), second
    assert f"package   {tmp_path / 'b.pt2'}" in second and "PASS" in second
    a, b = read(str(tmp_path / "a.pt2")), read(str(tmp_path / "b.pt2"))
    assert a == b and a.files_sha256 == b.files_sha256
    with zipfile.ZipFile(tmp_path / "a.pt2") as za, zipfile.ZipFile(tmp_path / "b.pt2") as zb:
        sos = [n for n in za.namelist() if n.endswith(".so")]
        assert sos and all(za.read(n) == zb.read(n) for n in sos)
    print(f"cache hit in {seconds:.2f} s")  # the time a hit takes is measured in docs/export.md, not asserted

    entry = tmp_path / "c" / "exports" / key
    data = (entry / "model.pt2").read_bytes()
    (entry / "model.pt2").write_bytes(data[: len(data) // 2])
    third, _ = export("-o", tmp_path / "c.pt2", cache_dir=tmp_path / "c")
    assert f"cache miss {key}" in third and "[1/8] loading" in third, third
    assert json.loads((entry / "entry.json").read_text())["bytes"] == (entry / "model.pt2").stat().st_size

    fourth, _ = export("-o", tmp_path / "d.pt2", "--no-cache", cache_dir=tmp_path / "c")
    assert "cache " not in fourth and "[1/8] loading" in fourth
    shutil.rmtree(tmp_path / "c")
