"""Helpers shared by tests/test_runtime*.py: tampered copies of packages and the aotc-run binary.

Not fixtures of their own: they take the session-cached packages from conftest.py and write copies into
a test's tmp_path, so no test mutates a cached package. No torch import.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import numpy as np

from launch import find_binary


def aotc_run_binary() -> Path:
    """$AOTC_RUN if set (a developer's own build), else as bench/launch.py's find_binary looks."""
    return find_binary("aotc-run", "AOTC_RUN")


def run_aotc_run(*args, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs aotc-run; env=None runs it with an empty environment (as `env -i` does)."""
    return subprocess.run([str(aotc_run_binary()), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={} if env is None else env)


def rewrite(src: Path, dst: Path, edit) -> Path:
    """Copies the zip `src` to `dst`, passing every (relative name, bytes) through edit(name, data), which
    returns new bytes, or None to drop the record. Names are relative to the archive's root folder."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            root, _, rel = info.filename.partition("/")
            data = edit(rel, zin.read(info))
            if data is not None:
                zout.writestr(zipfile.ZipInfo(info.filename, date_time=info.date_time), data)
    return dst


def edit_manifest(src: Path, dst: Path, change, only_first: bool = False) -> Path:
    """Copy of `src` whose aotc manifest is replaced by change(manifest) (in every metadata file, or only
    in the first one when only_first)."""
    done = []

    def edit(name, data):
        if name.startswith("data/aotinductor/") and name.endswith("_metadata.json") and not (only_first and done):
            meta = json.loads(data)
            manifest = json.loads(meta["aotc.manifest"])
            new = change(manifest)
            meta["aotc.manifest"] = json.dumps(manifest if new is None else new)
            done.append(name)
            return json.dumps(meta).encode()
        return data

    return rewrite(src, dst, edit)


def graft_static_graphs(main_pkg: Path, static_pkg: Path, dst: Path) -> Path:
    """A package of main_pkg's graphs plus static_pkg's static graphs, with main_pkg's manifest listing those
    graphs (static_graphs, and their files' hashes from static_pkg): valid in every check up to the weights the
    static graphs take from main_pkg's graph, which need not fit them."""
    with zipfile.ZipFile(static_pkg) as zs:
        static_files = {}
        static_manifest = None
        for n in zs.namelist():
            rel = n.partition("/")[2]
            graph = rel.split("/")[2] if rel.startswith("data/aotinductor/") else None
            if graph and graph != "model":
                static_files[rel] = zs.read(n)
            elif graph == "model" and rel.endswith("_metadata.json") and static_manifest is None:
                static_manifest = json.loads(json.loads(zs.read(n))["aotc.manifest"])
    with zipfile.ZipFile(main_pkg) as zm:
        root = zm.namelist()[0].partition("/")[0]
        main_files = {n.partition("/")[2]: zm.read(n) for n in zm.namelist()}
    manifest = next(json.loads(json.loads(data)["aotc.manifest"]) for rel, data in main_files.items()
                    if rel.startswith("data/aotinductor/model/") and rel.endswith("_metadata.json"))
    manifest["static_graphs"] = static_manifest["static_graphs"]
    manifest["files_sha256"].update({k: v for k, v in static_manifest["files_sha256"].items() if k in static_files})
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as out:
        for rel, data in {**main_files, **static_files}.items():
            if rel.startswith("data/aotinductor/") and rel.endswith("_metadata.json"):
                meta = json.loads(data)
                meta["aotc.manifest"] = json.dumps(manifest)
                data = json.dumps(meta).encode()
            out.writestr(f"{root}/{rel}", data)
    return dst


def so_name(pkg: Path) -> str:
    with zipfile.ZipFile(pkg) as zf:
        return next(n.partition("/")[2] for n in zf.namelist() if n.endswith(".so"))


def assert_close(got: np.ndarray, want: np.ndarray, tol, what: str) -> None:
    """`got` within the manifest's tolerance (an aotc.manifest.Tolerance) of `want`, by aotc's parity rule."""
    from aotc_client.compare import compare_array

    c = compare_array(what, got, want, tol.atol, tol.rtol)
    assert c.ok, c.line()


def one_line_error(stderr: str, prefix: str = "aotc-run: error: ") -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prefix), f"expected one '{prefix}...' line, got:\n{stderr}"
    return lines[0][len(prefix):]


