"""Shared pytest fixtures: packages from our own exporter, built once and cached, and eager references.

`export_package(spec, *cli_args)` runs the real `aotc export` (a subprocess, as a user would) once per
(model file content, spec, args, exporter source, torch version) and caches the .pt2 under
build/test-packages/<key>/<stem>.pt2, so reruns, other test files and other test sessions reuse it.
A file lock per key makes concurrent pytest processes wait for one export instead of compiling twice.
`eager_reference(spec)` rebuilds the eager model and inputs from a model file, the parity reference.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# aotc export's own cache (aotc.cache): a private one per test session, never the user's ~/.cache/aotc
os.environ["AOTC_CACHE_DIR"] = tempfile.mkdtemp(prefix="aotc-test-cache-")
atexit.register(shutil.rmtree, os.environ["AOTC_CACHE_DIR"], ignore_errors=True)
PKG_CACHE = REPO / "build" / "test-packages"
DATA = Path(__file__).resolve().parent / "data"
# The sources whose change changes what `aotc export` writes. The embedding-bag rewrite only matters to
# model files that use nn.EmbeddingBag, so editing it does not re-export every other package.
_EXPORTER_SOURCES = ("load_model.py", "export.py", "compile.py", "package.py", "parity.py", "fresh.py", "pipeline.py", "graphs.py", "seq_buckets.py", "seq_pack.py",
                     "report.py", "loader.py", "manifest.py", "cli", "rewrite/__init__.py",
                     "../../python_client/aotc_client/compare.py", "../../python_client/aotc_client/specs.py")
_REWRITE_SOURCES = ("rewrite", "kernels")


def _exporter_digest(names=_EXPORTER_SOURCES) -> str:
    h = hashlib.sha256()
    base = REPO / "export" / "aotc"
    for name in names:
        p = base / name
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            if f.is_file():
                h.update(str(f.relative_to(base)).encode())
                h.update(f.read_bytes())
    import torch

    h.update(torch.__version__.encode())
    return h.hexdigest()


def run_aotc(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs the `aotc` CLI in a fresh Python process (cwd: the repository) and captures its output."""
    return subprocess.run([sys.executable, "-m", "aotc.cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def package_key(spec: str, cli_args: tuple[str, ...], digest: str, rewrite_digest: str = "") -> str:
    path = spec.rpartition(":")[0] if ":" in Path(spec).name else spec
    content = (REPO / path).read_bytes()
    if b"EmbeddingBag" in content or b"embedding_bag" in content:
        digest += rewrite_digest
    h = hashlib.sha256()
    for part in (content, spec.encode(), json.dumps(list(cli_args)).encode(), digest.encode()):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def export_package():
    """export_package("models/mlp.py", "--dtype", "fp16") -> Path of a cached, exported .pt2."""
    digest, rewrite_digest = _exporter_digest(), _exporter_digest(_REWRITE_SOURCES)
    seen: dict[tuple, Path] = {}

    def build(spec: str, *cli_args: str) -> Path:
        key = (spec, cli_args)
        if key in seen:
            return seen[key]
        k = package_key(spec, cli_args, digest, rewrite_digest)
        stem = Path(spec.split(":")[0]).stem + ("_" + spec.split(":")[1] if ":" in Path(spec).name else "")
        out_dir = PKG_CACHE / k
        out = out_dir / f"{stem}.pt2"
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not out.exists():
                # --no-cache: this cache of packages is the tests' own; aotc's (tests/test_export_cache.py)
                # would turn a second export of the same model into a hit without the progress lines tests read
                r = run_aotc("export", spec, "-o", out, "--no-cache", *cli_args)
                if r.returncode != 0 or not out.exists():
                    (out_dir / "export.log").write_text(r.stdout + r.stderr)
                    pytest.fail(f"aotc export {spec} {' '.join(cli_args)} failed (exit {r.returncode}):\n"
                                f"{r.stderr[-3000:]}", pytrace=False)
                (out_dir / "export.log").write_text(r.stdout + r.stderr)
        seen[key] = out
        return out

    return build


@pytest.fixture(scope="session")
def pkg_mlp(export_package) -> Path:
    return export_package("models/mlp.py")


@pytest.fixture(scope="session")
def pkg_simple(export_package) -> Path:
    return export_package("models/simple.py")


@pytest.fixture(scope="session")
def pkg_bert(export_package) -> Path:
    return export_package("models/bert.py")


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory, pkg_mlp, pkg_simple) -> Path:
    """DIR/<model>/1/model.pt2 for mlp and simple (a fresh copy per session; do not mutate it)."""
    root = tmp_path_factory.mktemp("model_repository")
    for name, pkg in (("mlp", pkg_mlp), ("simple", pkg_simple)):
        dest = root / name / "1"
        dest.mkdir(parents=True)
        shutil.copyfile(pkg, dest / "model.pt2")
    return root


@pytest.fixture(scope="module", params=["cpp", "python"])
def server(request, model_repository):
    """aotc-server, then the FastAPI baseline, on model_repository: a test module's tests run against both
    (one server per module; a module may define its own `server`, as test_check_server.py does)."""
    from launch import Server

    with Server(request.param, model_repository) as s:
        yield s


def eager_reference(spec: str, device: str = "cpu", dtype: str = "fp32", inputs: tuple | None = None):
    """(model, inputs, outputs) of a model file run eagerly: the reference a package must match.
    `inputs` replaces the example inputs (they are cast like the exporter casts them)."""
    import torch

    from aotc import export as exp
    from aotc.load_model import load_model_file

    mf = load_model_file(str(REPO / spec) if not os.path.isabs(spec.split(":")[0]) else spec)
    model, example = exp.prepare(mf, device, dtype)
    if inputs is not None:
        float_dtype = getattr(torch, exp.DTYPES[dtype])
        example = tuple(exp.cast_input(torch.as_tensor(x), device, float_dtype) for x in inputs)
    return model, example, exp.eager_outputs(model, example, mf)


def read_samples(package: Path) -> list[tuple[list, list]]:
    """The samples stored in a package, as numpy arrays: [(inputs, outputs), ...] in manifest order."""
    from aotc.manifest import read_samples as read

    return read(str(package))
