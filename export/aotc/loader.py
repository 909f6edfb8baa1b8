"""The one place Python code of aotc loads an AOTInductor package.

`load_package(path)` verifies the manifest and the sha256 of every compiled .so (aotc.manifest), makes
libstdc++'s symbols global first (without it, loading an AOTI .so in a Python process segfaults on some
machines, in std::regex while the model container is created: seen with torch 2.11), and returns a `Runner`
that checks inputs against the manifest before they reach the .so. Not a server and not the C++ runtime.
No torch import at module level. A Runner may be called from several threads: AOTInductor's model
container serialises calls internally.
"""

from __future__ import annotations

import ctypes
import os
import threading

from aotc import manifest as manifest_mod
from aotc.errors import InputError, PackageError
from aotc.manifest import Manifest

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


class Runner:
    """A loaded package. Call it with the inputs in manifest order (flat, as the manifest lists them); returns
    a list of output tensors in manifest order."""

    def __init__(self, path: str, manifest: Manifest, compiled):
        self.path, self.manifest, self._compiled = path, manifest, compiled
        self.input_names = manifest.input_names
        self.output_names = manifest.output_names
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

        specs = self.manifest.inputs
        device = self.manifest.device
        if len(inputs) != len(specs):
            raise InputError(f"{self.manifest.name} takes {len(specs)} inputs {self.input_names}, got "
                             f"{len(inputs)}")
        for spec, x in zip(specs, inputs):
            name = spec.name
            if not isinstance(x, torch.Tensor):
                raise InputError(f"input '{name}' is {type(x).__name__}, expected a torch.Tensor")
            got = str(x.dtype).removeprefix("torch.")
            if got != spec.dtype:
                raise InputError(f"input '{name}' has dtype {got}, the package expects {spec.dtype}; cast "
                                 f"with x.to(torch.{spec.dtype})")
            if x.device.type != device:
                raise InputError(f"input '{name}' is on {x.device.type}, the package runs on {device}; move it "
                                 f"with x.to('{device}')")
            if x.dim() != len(spec.shape):
                raise InputError(f"input '{name}' has {x.dim()} dims {list(x.shape)}, the package expects "
                                 f"{len(spec.shape)} dims {list(spec.shape)}")
            for i, (size, (lo, hi)) in enumerate(zip(x.shape, spec.ranges)):
                if not lo <= size <= hi:
                    want = f"exactly {lo}" if lo == hi else f"{lo}..{hi}"
                    raise InputError(f"input '{name}' dim {i} is {size}, the package accepts {want} (shape "
                                     f"{list(spec.shape)}); re-export with a wider range to run this size")

    def __call__(self, *inputs):
        """Outputs as a flat list in manifest order, whatever pytree forward returned (a dict, a ModelOutput):
        the compiled model is called on the flat tensors, so nothing here needs the output's Python types."""
        self.validate(inputs)
        return list(self._compiled.loader.boxed_run([x.contiguous() for x in inputs]))


def load_package(path: str, device_index: int | None = None, verify: bool = True, graph: str = "model",
                 weights: dict | None = None) -> Runner:
    """Verifies and loads an aotc package; returns a Runner of one of its graphs ("model", the one with the
    dynamic batch, or a name from the manifest's static_graphs). A static graph compiled without weights
    (static_graphs[].weights "model") runs on `weights`, the model's tensors by fully qualified name, lent
    without a copy (the C++ runtime lends it the main graph's itself). Raises PackageError when it cannot
    run here."""
    manifest = manifest_mod.read(path)
    if verify:
        manifest_mod.verify_hashes(path, manifest)
    reason = manifest_mod.why_cannot_run(manifest)
    if reason:
        raise PackageError(f"{path} cannot run here: {reason}")
    ensure_libstdcxx_global()
    try:
        from torch._inductor.package import load_package as load_aoti

        compiled = load_aoti(path, model_name=graph, device_index=-1 if device_index is None else device_index)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PackageError(f"{path}: loading the compiled model failed: {first[:300]}") from e
    runner = Runner(path, manifest, compiled)
    static = manifest.static_graph(graph)
    if static is not None and static.weights:
        runner.lend_weights(graph, weights)
    return runner

