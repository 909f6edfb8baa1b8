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
from aotc import seq_buckets
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
    a list of output tensors in manifest order. A graph static at a sequence bucket (`seq_size`) takes any
    length up to it: the inputs are padded to it and the per-token outputs cut back (aotc.seq_buckets)."""

    def __init__(self, path: str, manifest: Manifest, compiled, seq_size: int | None = None):
        self.path, self.manifest, self._compiled = path, manifest, compiled
        self.input_names = manifest.input_names
        self.output_names = manifest.output_names
        self.seq_size = seq_size
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
        seq = self.manifest.seq_buckets
        if self.seq_size is None:
            return list(self._compiled.loader.boxed_run([x.contiguous() for x in inputs]))
        length = seq_buckets.length_of(inputs, self.input_names, seq)
        if length > self.seq_size:
            raise InputError(f"sequence length {length} is beyond this graph's bucket {self.seq_size}")
        padded = seq_buckets.pad(inputs, self.input_names, seq, self.seq_size)
        outs = self._compiled.loader.boxed_run([x.contiguous() for x in padded])
        return [o.contiguous() for o in seq_buckets.cut(outs, self.output_names, seq, length)]


class BucketRunner:
    """A package with sequence buckets as one Runner: each call runs in the graph of its bucket (each loaded
    at its first call), padded there."""

    def __init__(self, first: Runner, load):
        self.path, self.manifest = first.path, first.manifest
        self.input_names, self.output_names = first.input_names, first.output_names
        self._runners = {first.seq_size: first}
        self._load = load  # graph name -> Runner
        self._lock = threading.Lock()

    def validate(self, inputs) -> None:
        next(iter(self._runners.values())).validate(inputs)

    def __call__(self, *inputs):
        self.validate(inputs)
        seq = self.manifest.seq_buckets
        size = seq.bucket(seq_buckets.length_of(inputs, self.input_names, seq))
        with self._lock:
            if size not in self._runners:
                self._runners[size] = self._load(seq.graphs[size])
            runner = self._runners[size]
        return runner(*inputs)


def load_package(path: str, device_index: int | None = None, verify: bool = True, graph: str = "model",
                 weights: dict | None = None) -> Runner | BucketRunner:
    """Verifies and loads an aotc package; returns a Runner of one of its graphs ("model", the one with the
    dynamic batch, or a name from the manifest's static_graphs or seq_buckets). A graph compiled without weights
    (static_graphs[].weights "model", seq_buckets.weights) runs on `weights`, the model's tensors by fully
    qualified name, lent without a copy (the C++ runtime lends it the main graph's itself). "model" of a
    package with sequence buckets is every bucket's graph (BucketRunner). Raises PackageError when it cannot
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
    seq = manifest.seq_buckets
    static = manifest.static_graph(graph)
    size = None if seq is None else (static.seq if static else next((n for n, g in seq.graphs.items() if g == graph), None))
    runner = Runner(path, manifest, compiled, size)
    if (static is not None and static.weights) or (seq is not None and graph in seq.weights):
        runner.lend_weights(graph, weights)
    if seq is not None and graph == "model":
        return BucketRunner(runner, lambda name: load_package(path, device_index, False, name, weights))
    return runner

