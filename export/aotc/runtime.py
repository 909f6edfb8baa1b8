"""aotc's C++ runtime from Python: `Session` over the pybind11 module `aotc._runtime` (runtime_cpp/python/).

The same code path as `aotc-run` and `aotc-server` (the `aotc_runtime` library): the package is verified
(manifest, torch version, CPU ISA/GPU, sha256 of every .so) before its code is loaded, inputs are checked
against the manifest with the numbers in the message, outputs come back as numpy arrays without a copy.
Errors from C++ are raised as aotc's own types: InputError, PackageError, RunError. Not PyTorch's Python
loader (that is aotc.loader) and not a server. Never imports torch: it works in a process that has no torch
Python module loaded. A Session may be used from many threads at once; the GIL is released while the model
runs and at most `num_runners` calls execute in the model together, the rest wait.
"""

from __future__ import annotations

import json
from typing import Mapping, Sequence

from aotc.errors import AotcError, InputError, PackageError
from aotc.manifest import Manifest


class RunError(AotcError):
    """The model failed while running on inputs that passed validation: a bug in the package or runtime."""


_ERRORS = {"invalid_input": InputError, "package_refused": PackageError, "not_found": PackageError,
           "internal": RunError}


_loaded = None


def _module():
    """aotc._runtime, loaded once, after libstdc++ is made global (see aotc.loader.ensure_libstdcxx_global)."""
    global _loaded
    if _loaded is None:
        from aotc.loader import ensure_libstdcxx_global

        ensure_libstdcxx_global()
        try:
            from aotc import _runtime
        except ImportError as e:
            raise AotcError(f"the C++ runtime module aotc._runtime is not available ({e}); build it with "
                            "`make build`") from e
        _loaded = _runtime
    return _loaded


def _call(fn, *args, **kwargs):
    """Runs a _runtime call, re-raising its Error(kind, message) as the aotc error type for `kind`."""
    try:
        return fn(*args, **kwargs)
    except _module().Error as e:
        kind, message = e.args if len(e.args) == 2 else ("internal", str(e))
        raise _ERRORS.get(kind, RunError)(message) from None


class Session:
    """An opened, verified package. `run(inputs)` takes numpy arrays in manifest order (or a dict by input
    name) and returns the outputs as a list of numpy arrays, in manifest order."""

    def __init__(self, path: str, num_runners: int = 1, device_index: int = -1, verify_hashes: bool = True):
        if num_runners < 1:
            raise InputError(f"num_runners is {num_runners}, expected at least 1")
        rt = _module()
        self._impl = _call(rt.Session, str(path), num_runners, device_index, verify_hashes)
        self.path = str(path)
        # as the C++ runtime read it (aotc.manifest.read reads the same document with zipfile)
        self.manifest = Manifest.from_dict(json.loads(self._impl.manifest_json), self.path)
        self.input_names = self.manifest.input_names
        self.output_names = self.manifest.output_names

    def _ordered(self, inputs) -> list:
        if isinstance(inputs, Mapping):
            unknown = sorted(set(inputs) - set(self.input_names))
            missing = [n for n in self.input_names if n not in inputs]
            if unknown or missing:
                raise InputError(f"inputs {sorted(inputs)} do not match the package's {self.input_names}"
                                 + (f": unknown {unknown}" if unknown else "")
                                 + (f": missing {missing}" if missing else ""))
            return [inputs[n] for n in self.input_names]
        if not isinstance(inputs, Sequence):
            raise InputError(f"inputs must be a list of numpy arrays (or a dict by name), got {type(inputs).__name__}")
        return list(inputs)

    def run(self, inputs: Sequence | Mapping) -> list:
        """Validates and runs; returns a list of numpy arrays. Raises InputError with the numbers."""
        return _call(self._impl.run, self._ordered(inputs))

    def validate(self, inputs: Sequence | Mapping) -> None:
        """The checks run() makes, without running. Raises InputError."""
        _call(self._impl.validate, self._ordered(inputs))

    def graph_for_batch(self, batch: int, length: int = -1) -> str:
        """The package graph a call of `batch` rows (of sequence length `length`, with `aotc export
        --seq-buckets`) runs: a static graph's name (`--static-batches`) where one matches, else the sequence
        bucket's main graph, else "model"."""
        return _call(self._impl.graph_for_batch, batch, length)

    def cuda_graph_buckets(self) -> list[int]:
        """The batch sizes this session replays as captured CUDA graphs; empty on CPU or with graphs off."""
        return list(_call(self._impl.cuda_graph_buckets))

    def samples(self) -> list[tuple[list, list]]:
        """The package's stored samples: [(inputs, eager_outputs), ...] as numpy arrays."""
        return [(list(i), list(o)) for i, o in _call(self._impl.load_samples)]


def libtorch_version() -> str:
    """The libtorch version the C++ runtime was built against, e.g. '2.13.0'."""
    return _module().LIBTORCH_VERSION
