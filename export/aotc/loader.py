"""The one place Python code of aotc loads an AOTInductor package.

`load_package(path)` verifies the manifest and the sha256 of every compiled .so, makes libstdc++'s symbols
global first (without it, loading an AOTI .so in a Python process segfaults on some machines, in
std::regex while the model container is created; see ../shared/GPU.md), and returns a `Runner` that
checks inputs against the manifest before they reach the .so. `read_manifest(path)` needs only zipfile.
Not a server and not the C++ runtime. No torch import at module level. A Runner may be called from
several threads: AOTInductor's model container serialises calls internally.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import threading
import zipfile

from aotc.errors import InputError, PackageError

_MANIFEST_KEY = "aotc.manifest"
_FORMAT = "aotc/1"
_libstdcxx_lock = threading.Lock()
_libstdcxx_handle = None


def ensure_libstdcxx_global() -> None:
    """Loads libstdc++ with RTLD_GLOBAL once per process; call before any AOTI .so is loaded."""
    global _libstdcxx_handle
    with _libstdcxx_lock:
        if _libstdcxx_handle is None:
            try:
                _libstdcxx_handle = ctypes.CDLL("libstdc++.so.6", mode=os.RTLD_GLOBAL)
            except OSError:  # not glibc/libstdc++ (e.g. macOS): nothing to guard against
                _libstdcxx_handle = False


def _metadata_records(zf: zipfile.ZipFile) -> list[str]:
    return [n for n in zf.namelist() if "/data/aotinductor/" in n and n.endswith("_metadata.json")]


def read_manifest(path: str) -> dict:
    """The aotc manifest of a package, read with zipfile only. Raises PackageError saying what is wrong."""
    if not os.path.isfile(path):
        raise PackageError(f"package '{path}' not found")
    try:
        with zipfile.ZipFile(path) as zf:
            records = _metadata_records(zf)
            if not records:
                raise PackageError(f"{path} is not an AOTInductor package (no data/aotinductor/*_metadata.json)")
            meta = json.loads(zf.read(sorted(records)[0]))
    except zipfile.BadZipFile as e:
        raise PackageError(f"{path} is not a readable .pt2 archive ({e}); re-export it") from e
    except (ValueError, KeyError, OSError) as e:
        raise PackageError(f"{path}: cannot read its metadata ({e}); re-export it") from e
    if _MANIFEST_KEY not in meta:
        raise PackageError(f"{path} has no aotc manifest (metadata key '{_MANIFEST_KEY}'); export it with aotc")
    try:
        manifest = json.loads(meta[_MANIFEST_KEY])
    except ValueError as e:
        raise PackageError(f"{path}: the aotc manifest is not valid JSON ({e})") from e
    if manifest.get("format") != _FORMAT:
        raise PackageError(f"{path}: manifest format is {manifest.get('format')!r}, this aotc reads {_FORMAT!r}")
    return manifest


def verify_hashes(path: str, manifest: dict) -> None:
    """Refuses the package when a .so is missing from files_sha256 or its sha256 differs."""
    expected = manifest.get("files_sha256") or {}
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            root, _, rel = name.partition("/")
            if not rel.endswith(".so"):
                continue
            want = expected.get(rel)
            if want is None:
                raise PackageError(f"{path}: {rel} is not listed in the manifest's files_sha256; the package "
                                   f"was altered after export")
            got = hashlib.sha256(zf.read(name)).hexdigest()
            if got != want:
                raise PackageError(f"{path}: sha256 of {rel} is {got[:12]}..., the manifest says {want[:12]}...; "
                                   f"the package is corrupt or was altered")


class Runner:
    """A loaded package. Call it with the inputs in manifest order; returns a list of output tensors."""

    def __init__(self, path: str, manifest: dict, compiled):
        self.path, self.manifest, self._compiled = path, manifest, compiled
        self.input_names = [t["name"] for t in manifest["inputs"]]
        self.output_names = [t["name"] for t in manifest["outputs"]]
        self._lent = {}  # weights lent to a graph compiled without its own: it reads them in place

    def lend_weights(self, graph: str, weights: dict | None) -> None:
        """Gives a graph compiled without weights the model's, by fully qualified name, without a copy."""
        if weights is None:
            raise PackageError(f"{self.path}: graph '{graph}' holds no weights of its own (it runs on the main "
                               f"graph's); pass weights= (the model's tensors by name), or run the package "
                               f"with aotc.runtime.Session or aotc-run, which lend them")
        needed = self._compiled.get_constant_fqns()
        missing = sorted(fqn for fqn in needed if fqn not in weights)
        if missing:
            raise PackageError(f"{self.path}: graph '{graph}' needs weights {missing[:5]} that weights= lacks")
        self._lent = {fqn: weights[fqn] for fqn in needed}
        self._compiled.load_constants(self._lent, check_full_update=True, user_managed=True)

    def validate(self, inputs) -> None:
        """Raises InputError with the numbers when inputs disagree with the manifest."""
        import torch

        specs = self.manifest["inputs"]
        if len(inputs) != len(specs):
            raise InputError(f"{self.manifest['name']} takes {len(specs)} inputs {self.input_names}, got "
                             f"{len(inputs)}")
        for spec, x in zip(specs, inputs):
            name = spec["name"]
            if not isinstance(x, torch.Tensor):
                raise InputError(f"input '{name}' is {type(x).__name__}, expected a torch.Tensor")
            got = str(x.dtype).removeprefix("torch.")
            if got != spec["dtype"]:
                raise InputError(f"input '{name}' has dtype {got}, the package expects {spec['dtype']}; cast "
                                 f"with x.to(torch.{spec['dtype']})")
            if x.device.type != self.manifest["device"]:
                raise InputError(f"input '{name}' is on {x.device.type}, the package runs on "
                                 f"{self.manifest['device']}; move it with x.to('{self.manifest['device']}')")
            if x.dim() != len(spec["shape"]):
                raise InputError(f"input '{name}' has {x.dim()} dims {list(x.shape)}, the package expects "
                                 f"{len(spec['shape'])} dims {spec['shape']}")
            for i, (size, (lo, hi)) in enumerate(zip(x.shape, spec["ranges"])):
                if not lo <= size <= hi:
                    want = f"exactly {lo}" if lo == hi else f"{lo}..{hi}"
                    raise InputError(f"input '{name}' dim {i} is {size}, the package accepts {want} (shape "
                                     f"{spec['shape']}); re-export with a wider range to run this size")

    def __call__(self, *inputs):
        self.validate(inputs)
        out = self._compiled(*[x.contiguous() for x in inputs])
        return list(out) if isinstance(out, (list, tuple)) else [out]


def load_package(path: str, device_index: int | None = None, verify: bool = True, graph: str = "model",
                 weights: dict | None = None) -> Runner:
    """Verifies and loads an aotc package; returns a Runner of one of its graphs ("model", the one with the
    dynamic batch, or a name from the manifest's static_graphs). A static graph compiled without weights
    (static_graphs[].weights "model") runs on `weights`, the model's tensors by fully qualified name, lent
    without a copy (the C++ runtime lends it the main graph's itself). Raises PackageError when it cannot
    run here."""
    manifest = read_manifest(path)
    if verify:
        verify_hashes(path, manifest)
    from aotc.inspect_pkg import why_cannot_run

    reason = why_cannot_run(manifest)
    if reason:
        raise PackageError(f"{path} cannot run here: {reason}")
    ensure_libstdcxx_global()
    import torch

    try:
        from torch._inductor.package import load_package as load_aoti

        compiled = load_aoti(path, model_name=graph, device_index=-1 if device_index is None else device_index)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PackageError(f"{path}: loading the compiled model failed: {first[:300]}") from e
    runner = Runner(path, manifest, compiled)
    if any(g["graph"] == graph and g.get("weights") for g in manifest.get("static_graphs") or ()):
        runner.lend_weights(graph, weights)
    return runner

