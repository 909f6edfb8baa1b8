"""`aotc bundle`: the bundle runs where there is no Python and no torch.

The bundle of the test repository (mlp, simple) is moved to another folder, then started in a mount namespace
(unshare) where the source tree, the venv, the interpreter's installation and every python3 are hidden, with an
empty environment: once as `serve` from where it was moved to, once as its Containerfile says (the bundle at
/opt/aotc, user 1000, the ENTRYPOINT, the HEALTHCHECK command). From outside, tritonclient checks its answers
against the packages' stored eager outputs. Also: bundle.json against what is on disk, and the one-line refusals
(a broken package, one for another torch, an output folder that is not a bundle). Needs root for unshare.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, read_samples, run_aotc
from launch import free_port
from runtime_helpers import edit_manifest

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")]


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory, model_repository):
    built = tmp_path_factory.mktemp("bundle-built") / "bundle"
    r = run_aotc("bundle", model_repository, "-o", built, "--containerfile", timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{built}: 2 model version(s)"), r.stdout
    moved = tmp_path_factory.mktemp("bundle-moved") / "aotc"
    shutil.move(built, moved)
    return moved


def _hidden() -> list[str]:
    """What the namespace hides: this checkout (its venv too), the interpreter's installation, pyenv, every
    site of a system Python."""
    paths = {str(REPO), sys.prefix, sys.base_prefix, os.path.expanduser("~/.pyenv")}
    for base in ("/usr/lib", "/usr/local/lib"):
        paths |= {str(p) for p in Path(base).glob("python3*") if p.is_dir()}
    paths = sorted(os.path.realpath(p) for p in paths if os.path.isdir(p))
    # a folder inside one already hidden is hidden with it (and no longer there to mount on)
    return [p for p in paths if not any(p.startswith(q + "/") for q in paths)]


def _pythons() -> list[str]:
    found = {str(p) for d in ("/usr/bin", "/usr/local/bin", "/bin") for p in Path(d).glob("python3*")}
    return sorted(p for p in found if os.path.isfile(p) and not os.path.islink(p))


def start_hidden(argv: list[str], as_user: str | None, opt_aotc: Path | None = None, log: Path | None = None):
    """Runs `argv` in a new mount namespace with Python hidden and an empty environment (as uid:gid `as_user`,
    with `opt_aotc` bind-mounted at /opt/aotc); returns the Popen of unshare."""
    mounts = [f"mount -t tmpfs none {shlex.quote(p)}" for p in _hidden()]
    mounts += [f"mount --bind /dev/null {shlex.quote(p)}" for p in _pythons()]
    if opt_aotc is not None:
        mounts += ["mount -t tmpfs none /opt", "mkdir /opt/aotc", f"mount --bind {shlex.quote(str(opt_aotc))} /opt/aotc"]
    check = ("{ ! command -v python3 >/dev/null 2>&1 || ! python3 -c 0 2>/dev/null || "
             "{ echo 'python3 still runs in the namespace'; exit 97; }; }")
    user = ["setpriv", f"--reuid={as_user.split(':')[0]}", f"--regid={as_user.split(':')[1]}", "--clear-groups"] \
        if as_user else []
    script = " && ".join(mounts) + f" && {check} && exec {shlex.join(user + ['env', '-i', *argv])}"
    out = open(log, "wb") if log else subprocess.DEVNULL
    return subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            stdout=out, stderr=subprocess.STDOUT)


def wait_ready(proc, port: int, log: Path, timeout: float = 120.0) -> None:
    import http.client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the bundle exited {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/v2/health/ready")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"the bundle was not ready after {timeout:g} s:\n{log.read_text(errors='replace')[-3000:]}")


def check_parity(port: int, pkg_mlp: Path, pkg_simple: Path) -> None:
    """tritonclient against the packages' stored eager outputs (mlp within its tolerance, simple exactly)."""
    from aotc.manifest import read
    from aotc_client import Client
    from aotc_client.compare import assert_close

    with Client(f"http://127.0.0.1:{port}") as c:
        for name, pkg in (("mlp", pkg_mlp), ("simple", pkg_simple)):
            m = read(str(pkg))
            for ins, outs in read_samples(pkg):
                got = c.infer(name, dict(zip(m.input_names, ins)))
                assert_close(got, dict(zip(m.output_names, outs)), m.tolerance.atol, m.tolerance.rtol, what=name)


def stop(proc) -> int:
    proc.terminate()
    return proc.wait(timeout=60)


def test_bundle_json_describes_what_is_there(bundle_dir):
    info = json.loads((bundle_dir / "bundle.json").read_text())
    assert info["format"] == "aotc-bundle/1" and info["devices"] == ["cpu"]
    assert sorted((m["name"], m["version"]) for m in info["models"]) == [("mlp", "1"), ("simple", "1")]
    for m in info["models"]:
        data = (bundle_dir / m["package"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == m["sha256"] and len(data) == m["bytes"]
    libs = sorted(p.name for p in (bundle_dir / "lib").iterdir())
    assert libs == sorted(lib["name"] for lib in info["libraries"])
    assert {"libtorch_cpu.so", "libc10.so"} <= set(libs) and "libtorch_python.so" not in libs
    assert info["total_bytes"] == sum(f.stat().st_size for f in bundle_dir.rglob("*")
                                      if f.is_file() and f.name != "bundle.json")
    assert "libssl3" in info["requires_debian_packages"] and info["requires_driver"] == []
    for b in ("aotc-server", "aotc-run"):
        dyn = subprocess.run(["readelf", "-d", str(bundle_dir / "bin" / b)], capture_output=True, text=True).stdout
        assert "[$ORIGIN/../lib]" in dyn and str(REPO) not in dyn, dyn


def test_the_moved_bundle_serves_with_python_hidden(bundle_dir, pkg_mlp, pkg_simple, tmp_path):
    port, log = free_port(), tmp_path / "serve.log"
    proc = start_hidden([str(bundle_dir / "serve"), "--http-port", str(port), "--grpc-port", "0"], None, log=log)
    try:
        wait_ready(proc, port, log)
        check_parity(port, pkg_mlp, pkg_simple)
        r = subprocess.run(["unshare", "--mount", "sh", "-c", f"mount -t tmpfs none {shlex.quote(str(REPO))} && "
                            f"env -i {shlex.quote(str(bundle_dir / 'bin' / 'aotc-run'))} "
                            f"{shlex.quote(str(bundle_dir / 'models' / 'mlp' / '1' / 'model.pt2'))}"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and " ok " in r.stdout, r.stdout + r.stderr  # aotc-run's self-check
    finally:
        assert stop(proc) == 0, log.read_text(errors="replace")[-2000:]


def _containerfile(bundle_dir: Path) -> dict:
    """USER, ENTRYPOINT, HEALTHCHECK's CMD and EXPOSE of the bundle's Containerfile."""
    out = {}
    for line in (bundle_dir / "Containerfile").read_text().splitlines():
        word, _, rest = line.partition(" ")
        if word == "USER":
            out["user"] = rest
        elif word == "ENTRYPOINT":
            out["entrypoint"] = json.loads(rest)
        elif word == "HEALTHCHECK":
            out["health"] = json.loads(rest.partition(" CMD ")[2])
        elif word == "EXPOSE":
            out["ports"] = [int(p) for p in rest.split()]
        elif word == "FROM":
            out["base"] = rest
    return out


def test_the_container_layout_runs_as_user_1000(bundle_dir, pkg_mlp, pkg_simple, tmp_path):
    cf = _containerfile(bundle_dir)
    assert cf["base"] == "debian:12-slim" and cf["user"] == "1000:1000" and {8000, 8001} <= set(cf["ports"])
    assert cf["entrypoint"][0] == "/opt/aotc/serve" and "0.0.0.0" in cf["entrypoint"]
    port, log = free_port(), tmp_path / "container.log"
    # the ENTRYPOINT as written, then free ports for this machine instead of the image's 8000 and 8001 (the last
    # wins)
    proc = start_hidden([*cf["entrypoint"], "--http-port", str(port), "--grpc-port", "0"], cf["user"],
                        opt_aotc=bundle_dir, log=log)
    try:
        wait_ready(proc, port, log)
        health = [a.replace("/8000", f"/{port}") for a in cf["health"]]
        assert subprocess.run(health, timeout=10).returncode == 0, health
        check_parity(port, pkg_mlp, pkg_simple)
        # unshare, sh, setpriv, env and serve each exec the next: the process is aotc-server, as user 1000
        status = Path(f"/proc/{proc.pid}/status").read_text()
        assert "aotc-server" in Path(f"/proc/{proc.pid}/cmdline").read_text()
        assert next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:] == ["1000"] * 4
    finally:
        assert stop(proc) == 0, log.read_text(errors="replace")[-2000:]
    unready = [a.replace("/8000", f"/{free_port()}") for a in cf["health"]]
    assert subprocess.run(unready, timeout=10).returncode != 0  # nothing listens there: unhealthy


def _bundle_refused(repo, out) -> str:
    r = run_aotc("bundle", repo, "-o", out, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("aotc: error: "), r.stderr
    return lines[0]


def test_refusals_are_one_line(tmp_path, pkg_simple):
    broken = tmp_path / "broken"
    (broken / "simple" / "1").mkdir(parents=True)
    (broken / "simple" / "1" / "model.pt2").write_bytes(pkg_simple.read_bytes()[:50000])
    assert "simple/1:" in _bundle_refused(broken, tmp_path / "out1")

    old = tmp_path / "old"
    (old / "simple" / "1").mkdir(parents=True)
    edit_manifest(pkg_simple, old / "simple" / "1" / "model.pt2", lambda m: m.update(torch_version="2.1.0"))
    assert "compiled with torch 2.1.0, the bundle carries this torch" in _bundle_refused(old, tmp_path / "out2")

    good = tmp_path / "good"
    (good / "simple" / "1").mkdir(parents=True)
    shutil.copyfile(pkg_simple, good / "simple" / "1" / "model.pt2")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert "exists and is not an aotc bundle" in _bundle_refused(good, taken)
    assert (taken / "notes.txt").read_text() == "mine"
    assert "holds no packages" in _bundle_refused(tmp_path / "taken", tmp_path / "out3")
    assert not any(p.name.startswith(".aotc-bundle-") for p in tmp_path.iterdir())  # nothing half-built left
