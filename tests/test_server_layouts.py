"""aotc-server on every layout KServe's storage initializer can leave at /mnt/models (repository.h): a
repository, one model's directory of versions, a directory holding one .pt2 (or several), and the .pt2 file
itself; with and without --model-name. Each is checked by an inference against the package's stored sample."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from conftest import read_samples
from launch import Server, make_repository, server_binary


def infer_ok(server: Server, name: str, pkg) -> None:
    (x,), (y,) = read_samples(pkg)[0]
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    status, r = server.json("POST", f"/v2/models/{name}/infer", body)
    assert status == 200, r
    assert np.allclose(np.array(r["outputs"][0]["data"], np.float32).reshape(y.shape), y, atol=1e-4, rtol=1e-4)


def models(server: Server) -> list[tuple[str, str, str]]:
    _, index = server.json("POST", "/v2/repository/index", {})
    return sorted((e["name"], e["version"], e["state"]) for e in index)


def test_one_models_directory_of_versions(tmp_path, pkg_mlp):
    root = tmp_path / "mnt" / "models"
    for v in ("1", "2"):
        (root / v).mkdir(parents=True)
        shutil.copyfile(pkg_mlp, root / v / "model.pt2")
    (root / "config.json").write_text(json.dumps({"max_batch_size": 8}))
    with Server("cpp", root) as s:  # named after the directory
        assert models(s) == [("models", "1", "READY"), ("models", "2", "READY")]
        infer_ok(s, "models", pkg_mlp)
        assert s.json("GET", "/v2/models/models/config")[1]["max_batch_size"] == 8
    with Server("cpp", root, "--model-name", "mlp") as s:
        assert [m[0] for m in models(s)] == ["mlp", "mlp"]
        infer_ok(s, "mlp", pkg_mlp)


def test_a_lone_package_in_a_directory_or_given_itself(tmp_path, pkg_mlp, pkg_simple):
    root = tmp_path / "models"
    root.mkdir()
    shutil.copyfile(pkg_mlp, root / "downloaded.pt2")
    with Server("cpp", root, "--model-name", "mlp") as s:
        assert models(s) == [("mlp", "1", "READY")]
        infer_ok(s, "mlp", pkg_mlp)
    with Server("cpp", root / "downloaded.pt2") as s:  # the file itself: named after it
        assert models(s) == [("downloaded", "1", "READY")]
        infer_ok(s, "downloaded", pkg_mlp)
    shutil.copyfile(pkg_simple, root / "simple.pt2")
    with Server("cpp", root, "--model-name", "ignored") as s:  # several: each under its stem
        assert models(s) == [("downloaded", "1", "READY"), ("simple", "1", "READY")]


def test_a_repository_ignores_model_name(tmp_path, pkg_mlp):
    repo = make_repository(tmp_path / "repo", {"mlp": pkg_mlp})
    with Server("cpp", repo, "--model-name", "other") as s:
        assert models(s) == [("mlp", "1", "READY")]
        infer_ok(s, "mlp", pkg_mlp)


@pytest.mark.parametrize("flags, message", [
    (["--model-name", "a/b"], "--model-name expects a model name (no '/'), got 'a/b'"),
    (["--model-name", ".."], "--model-name expects a model name (no '/'), got '..'"),
])
def test_bad_model_names_are_refused(flags, message):
    r = subprocess.run([str(server_binary()), "--model-repository", ".", *flags], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and r.stderr.strip() == f"aotc-server: error: {message}", r.stderr


def test_a_repository_that_is_neither_directory_nor_package(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    r = subprocess.run([str(server_binary()), "--model-repository", str(f)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "is neither a directory nor a .pt2 package" in r.stderr, r.stderr
