"""`aotc bundle REPO -o DIR`: a model repository and the C++ server that serves it, as one directory that runs
on a machine with no Python and no torch.

DIR holds bin/aotc-server and bin/aotc-run with an RPATH of $ORIGIN/../lib; lib/ with exactly the shared
libraries of the torch wheel they load (their ldd closure outside the system's folders, stripped unless
asked not to); models/, the repository, every package checked against its manifest's hashes after the copy;
bundle.json, what is inside (versions, devices, each model's package hash and size, each library, the Debian
packages the rest of the closure comes from, the total size); `serve`, which execs bin/aotc-server on
models/ with the flags it is given; and with `containerfile=True` a Containerfile for a Debian 12 slim
image. Refusals are AotcErrors of one line: a broken package, one for another torch or a device this torch
cannot run, an output directory that exists and is not a bundle. Runs ldd, strip, patchelf and dpkg-query;
not thread-safe (one bundle at a time per DIR).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile

import aotc
from aotc import manifest as manifest_mod
from aotc.errors import AotcError, PackageError
from aotc.serve import installed_binary

FORMAT = "aotc-bundle/1"
BINARIES = ("aotc-server", "aotc-run")
SYSTEM_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/")
# the NVIDIA driver's own libraries: a CUDA bundle states the driver it needs instead of carrying them
DRIVER_LIBS = re.compile(r"^lib(cuda|nvidia-[\w-]+)\.so")
PORTS = {"http": 8000, "grpc": 8001}  # metrics are served on the HTTP port, at /metrics


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    version: str
    path: str                        # the package in the repository
    manifest: manifest_mod.Manifest


class BundleError(AotcError):
    """The repository or the output directory cannot make a bundle; the message says which and why."""


def find_packages(repository: str) -> list[Model]:
    """REPO/<model>/<version>/model.pt2, each read and checked against its hashes. Raises BundleError."""
    if not os.path.isdir(repository):
        raise BundleError(f"model repository '{repository}' is not a directory; expected DIR/<model>/<version>/"
                          f"model.pt2")
    models = []
    for name in sorted(os.listdir(repository)):
        versions = os.path.join(repository, name)
        if not os.path.isdir(versions):
            continue
        for version in sorted((v for v in os.listdir(versions) if v.isdigit()), key=int):
            path = os.path.join(versions, version, "model.pt2")
            if not os.path.isfile(path):
                continue
            try:
                m = manifest_mod.read(path)
                manifest_mod.verify_hashes(path, m)
            except PackageError as e:
                raise BundleError(f"{name}/{version}: {e}") from None
            models.append(Model(name, version, path, m))
    if not models:
        raise BundleError(f"'{repository}' holds no packages; expected DIR/<model>/<version>/model.pt2")
    return models


def check_runs_with_this_torch(models: list[Model]) -> None:
    """The bundle carries this machine's libtorch: every package must be for its torch major.minor, and a CUDA
    package needs a CUDA build of torch (the GPU itself may be elsewhere)."""
    import torch

    have = _major_minor(torch.__version__)
    for m in models:
        if _major_minor(m.manifest.torch_version) != have:
            raise BundleError(f"{m.name}/{m.version}: compiled with torch {m.manifest.torch_version}, the bundle "
                              f"carries this torch {torch.__version__} (major.minor must match); re-export it "
                              f"with this torch")
        if m.manifest.device == "cuda" and not torch.version.cuda:
            raise BundleError(f"{m.name}/{m.version}: a CUDA package, and this torch {torch.__version__} has no "
                              f"CUDA; bundle it where torch is a CUDA build")
        if m.manifest.device not in ("cpu", "cuda"):
            raise BundleError(f"{m.name}/{m.version}: unknown device {m.manifest.device!r}")


def _major_minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def library_closure(binaries: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """({soname: path} to carry, {soname: path} the system provides) of what `binaries` load (ldd)."""
    carry, system = {}, {}
    for binary in binaries:
        r = subprocess.run(["ldd", binary], capture_output=True, text=True)
        if r.returncode != 0:
            raise BundleError(f"ldd {binary} failed: {(r.stderr or r.stdout).strip()[:200]}")
        for line in r.stdout.splitlines():
            m = re.match(r"\s*(\S+) => (\S+) \(0x", line)
            if not m:
                if "not found" in line:
                    raise BundleError(f"{binary} needs {line.split()[0]}, which this machine does not have")
                continue
            soname, path = m.groups()
            system_lib = path.startswith(SYSTEM_DIRS) or DRIVER_LIBS.match(soname)
            (system if system_lib else carry)[soname] = path
    return carry, system


def debian_packages(paths: dict[str, str]) -> tuple[list[str], list[str]]:
    """(Debian packages providing the system libraries, those no package provides: the NVIDIA driver's)."""
    packages, unowned = set(), []
    for soname, path in sorted(paths.items()):
        if DRIVER_LIBS.match(soname):
            unowned.append(soname)
            continue
        candidates = {path, os.path.realpath(path)}
        candidates |= {p.replace("/lib/", "/usr/lib/", 1) for p in candidates if p.startswith("/lib/")}
        for p in candidates:
            r = subprocess.run(["dpkg-query", "-S", p], capture_output=True, text=True)
            if r.returncode == 0:
                packages.add(r.stdout.split(":", 1)[0])
                break
        else:
            unowned.append(soname)
    return sorted(packages), unowned


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _run(argv: list[str]) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise BundleError(f"{' '.join(argv[:2])} failed: {(r.stderr or r.stdout).strip()[:200]}")


def _prepare_output(out: str) -> None:
    """Refuses an existing DIR that is not an empty folder or a bundle (a bundle there is replaced)."""
    if not os.path.lexists(out):
        return
    if not os.path.isdir(out):
        raise BundleError(f"output '{out}' exists and is not a directory; give a new directory")
    if os.listdir(out) and not os.path.isfile(os.path.join(out, "bundle.json")):
        raise BundleError(f"output '{out}' exists and is not an aotc bundle (no bundle.json); give a new directory "
                          f"or remove it")


SERVE = """#!/bin/sh
# aotc bundle: serve models/ with bin/aotc-server; every flag is aotc-server's (serve --help).
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/bin/aotc-server" --model-repository "$here/models" "$@"
"""


def containerfile(requires: list[str], driver: list[str]) -> str:
    """A Containerfile for the bundle's directory (the build context): Debian 12 slim, the run-time packages
    the bundle's system libraries come from, user 1000, the ports, a readiness HEALTHCHECK (bash's /dev/tcp:
    no curl in the image), `serve` as the entrypoint."""
    packages = " ".join(requires)
    note = (f"# CUDA: run with the NVIDIA container runtime; the driver provides {', '.join(driver)}.\n"
            if driver else "")
    probe = ("exec 3<>/dev/tcp/127.0.0.1/{http} && printf 'GET /v2/health/ready HTTP/1.0\\r\\n\\r\\n' >&3 "
             "&& head -n 1 <&3 | grep -q ' 200 '").format(**PORTS)
    return f"""# aotc-server and its models, from `aotc bundle`. Build in the bundle's directory:
#   podman build -t aotc-models -f Containerfile .    (or docker build)
# Run: podman run -p {PORTS['http']}:{PORTS['http']} aotc-models [aotc-server flags...]
FROM debian:12-slim
RUN apt-get update && apt-get install -y --no-install-recommends {packages} && rm -rf /var/lib/apt/lists/*
RUN useradd --uid 1000 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin aotc
COPY --chown=0:0 . /opt/aotc
{note}USER 1000:1000
# HTTP (and /metrics), gRPC
EXPOSE {PORTS['http']} {PORTS['grpc']}
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s CMD ["bash", "-c", "{probe}"]
ENTRYPOINT ["/opt/aotc/serve", "--host", "0.0.0.0", "--http-port", "{PORTS['http']}"]
"""


def bundle(repository: str, out: str, tar: bool = False, write_containerfile: bool = False,
           strip: bool = True) -> dict:
    """Makes the bundle (module docstring) and, with `tar`, DIR.tar beside it; returns its bundle.json.
    Built in a folder beside DIR and moved into place, so a failed build leaves DIR as it was. Raises
    BundleError with one line."""
    models = find_packages(repository)
    check_runs_with_this_torch(models)
    _prepare_output(out)
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".aotc-bundle-")
    try:
        info = _assemble(tmp, repository, models, write_containerfile, strip)
        _check_it_starts(tmp)
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if tar:
        with tarfile.open(out.rstrip("/") + ".tar", "w") as t:
            t.add(out, arcname=os.path.basename(out.rstrip("/")))
    return info


def _assemble(root: str, repository: str, models: list[Model], write_containerfile: bool, strip: bool) -> dict:
    import torch

    os.chmod(root, 0o755)  # mkdtemp's 0700 would keep the container's user 1000 out
    binaries = [installed_binary(b) for b in BINARIES]
    carry, system = library_closure(binaries)
    requires, driver = debian_packages(system)
    for sub in ("bin", "lib", "models"):
        os.makedirs(os.path.join(root, sub))
    libraries = []
    for soname, path in sorted(carry.items()):
        libraries.append({"name": soname,
                          "bytes": _copy_elf(path, os.path.join(root, "lib", soname), "$ORIGIN", strip)})
    for b in binaries:
        _copy_elf(b, os.path.join(root, "bin", os.path.basename(b)), "$ORIGIN/../lib", strip)
    entries = [_copy_package(root, repository, m) for m in models]
    _write(os.path.join(root, "serve"), SERVE, executable=True)
    if write_containerfile:
        _write(os.path.join(root, "Containerfile"), containerfile(requires, driver))
    info = {"format": FORMAT, "aotc_version": aotc.__version__, "torch_version": torch.__version__,
            "devices": sorted({m.manifest.device for m in models}), "models": entries, "libraries": libraries,
            "requires_debian_packages": requires, "requires_driver": driver, "stripped": strip}
    # every file but bundle.json itself
    info["total_bytes"] = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
    _write(os.path.join(root, "bundle.json"), json.dumps(info, indent=2) + "\n")
    return info


def _copy_elf(src: str, dest: str, rpath: str, strip: bool) -> int:
    """Copies a binary or library, strips it (unless not `strip`) and sets its RPATH; returns its size."""
    shutil.copyfile(src, dest)
    os.chmod(dest, 0o755)
    if strip:
        _run(["strip", "--strip-unneeded", dest])
    _run(["patchelf", "--set-rpath", rpath, dest])
    return os.path.getsize(dest)


def _copy_package(root: str, repository: str, m: Model) -> dict:
    """models/<name>/<version>/model.pt2 (and the model's config.json), the copy checked against its hashes."""
    dest = os.path.join(root, "models", m.name, m.version, "model.pt2")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copyfile(m.path, dest)
    try:
        manifest_mod.verify_hashes(dest, m.manifest)
    except PackageError as e:
        raise BundleError(f"{m.name}/{m.version}: the copy does not match its manifest: {e}") from None
    config = os.path.join(repository, m.name, "config.json")
    if os.path.isfile(config):
        shutil.copyfile(config, os.path.join(root, "models", m.name, "config.json"))
    return {"name": m.name, "version": m.version, "device": m.manifest.device,
            "package": os.path.relpath(dest, root), "sha256": _sha256(dest), "bytes": os.path.getsize(dest)}


def _write(path: str, text: str, executable: bool = False) -> None:
    with open(path, "w") as f:
        f.write(text)
    if executable:
        os.chmod(path, 0o755)


def _check_it_starts(root: str) -> None:
    """bin/aotc-server --help and bin/aotc-run --help with an empty environment: the bundle's own libraries
    load (a missing one is refused here, not at deploy time)."""
    for b in BINARIES:
        r = subprocess.run([os.path.join(root, "bin", b), "--help"], capture_output=True, text=True, env={})
        if r.returncode != 0:
            raise BundleError(f"bin/{b} of the bundle does not start: {(r.stderr or r.stdout).strip()[:300]}")
