"""The export cache: `aotc export` hands back the package of an earlier export whose key matches, instead of
compiling again.

The key is a sha256 over every input of an export: the model file's source and the sources of the local modules
it imports (found from its import statements, followed through local modules; a module of the standard library
or of an installed package is not local), a hash of the model's weights (its state_dict), the example inputs'
names, shapes, dtypes and whether each is given by position or by name, the dynamic shapes, every export option,
the torch version, aotc's version and the digest of its own sources, the device, and the CPU ISA or GPU
architecture. `key_parts` lists them by name, so a test (or a user) can see which part moved.

Entries live in `<AOTC_CACHE_DIR, default ~/.cache/aotc>/exports/<key>/`: model.pt2, the summary the export
printed, and entry.json (the package's sha256 and size, when it was made and last used). A lookup checks the
package against entry.json and its manifest's hashes; a corrupt entry is removed and the export runs again.
After each store, entries least recently used go until the cache fits its cap. A file lock serialises stores
and evictions between processes; lookups read only.
"""

from __future__ import annotations

import ast
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time

import aotc
from aotc import manifest as manifest_mod
from aotc.errors import PackageError

DEFAULT_MAX_BYTES = 20 << 30
_IGNORED_OPTIONS = ("out", "quiet", "verbose")  # where the package goes and how much is printed: not its content


def cache_dir() -> str:
    return os.environ.get("AOTC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "aotc")


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def local_sources(path: str) -> dict[str, str]:
    """{file: sha256} of the model file and the local modules it imports, transitively. A module is local when
    its file lies outside the interpreter's installation (stdlib, site-packages) and outside aotc itself (whose
    sources are a key part of their own)."""
    outside = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}
                    | {os.path.dirname(os.path.dirname(aotc.__file__))})
    seen, todo = {}, [os.path.realpath(path)]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        with open(f, "rb") as fh:
            source = fh.read()
        seen[f] = hashlib.sha256(source).hexdigest()
        search = [os.path.dirname(f)] + sys.path
        for name in _imported_names(source, f):
            found = _find(name, search)
            if found and not found.startswith(outside):
                todo.append(found)
    return {os.path.relpath(f, os.path.dirname(os.path.realpath(path))): h for f, h in sorted(seen.items())}


def _imported_names(source: bytes, path: str) -> list[str]:
    try:
        tree = ast.parse(source, path)
    except SyntaxError:
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def _find(name: str, search: list[str]) -> str | None:
    """The file of module `name` when it is a plain .py (or a package's __init__.py) on `search`."""
    parts = name.split(".")
    for base in search:
        stem = os.path.join(base or ".", *parts)
        for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
            if os.path.isfile(candidate):
                return os.path.realpath(candidate)
    spec = importlib.util.find_spec(parts[0]) if parts[0] not in sys.builtin_module_names else None
    if spec and spec.origin and spec.origin.endswith(".py") and len(parts) == 1:
        return os.path.realpath(spec.origin)
    return None


def weights_digest(model) -> str:
    """sha256 over the state_dict: every tensor's name, dtype, shape and bytes."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def aotc_sources_digest() -> str:
    root = os.path.dirname(aotc.__file__)
    h = hashlib.sha256()
    for d, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            if f.endswith(".py"):
                with open(os.path.join(d, f), "rb") as fh:
                    h.update(os.path.relpath(os.path.join(d, f), root).encode() + b"\0" + fh.read())
    return h.hexdigest()


def key_parts(mf, opts) -> dict:
    """What the key covers, by name (module docstring). `mf`: the loaded model file (example inputs already at
    --example-batch); `opts`: pipeline.ExportOptions."""
    import torch

    from aotc import compile as aoti

    options = {k: v for k, v in dataclasses.asdict(opts).items() if k not in _IGNORED_OPTIONS}
    return {
        "sources": local_sources(mf.path),
        "factory": mf.factory,
        "weights": weights_digest(mf.model),
        # by name and how each is given (example_inputs() by position, example_kwargs() by name)
        "example_inputs": [[n, list(x.shape), str(x.dtype), "positional" if i < mf.n_positional else "keyword"]
                           for i, (n, x) in enumerate(zip(mf.input_names, mf.example_inputs))],
        "dynamic_shapes": repr(mf.dynamic_shapes),
        "options": json.loads(json.dumps(options, default=repr)),
        "torch": torch.__version__,
        "aotc": [aotc.__version__, aotc_sources_digest()],
        "device": opts.device,
        "target": cpu_isa() if opts.device == "cpu" else aoti.cuda_arch(),
    }


def cpu_isa() -> str:
    """Inductor's CPU ISA (compile.cpu_isa), remembered in the cache folder per torch version and CPU flags:
    Inductor finds it by compiling test programs, which takes seconds, and a cache hit should not."""
    import torch

    from aotc import compile as aoti

    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return aoti.cpu_isa()
    key = f"{torch.__version__}|{hashlib.sha256(flags.encode()).hexdigest()[:16]}"
    path = os.path.join(cache_dir(), "cpu_isa.json")
    try:
        with open(path) as f:
            known = json.load(f)
    except (OSError, ValueError):
        known = {}
    if key not in known:
        known[key] = aoti.cpu_isa()
        os.makedirs(cache_dir(), exist_ok=True)
        _write_json(path, known)
    return known[key]


def key_of(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


class ExportCache:
    """One cache folder. `lookup(key)` -> (package path, summary) or None; `store(key, package, summary)`."""

    def __init__(self, root: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = os.path.join(root or cache_dir(), "exports")
        self.max_bytes = max_bytes

    def _entry(self, key: str) -> str:
        return os.path.join(self.root, key)

    def lookup(self, key: str) -> tuple[str, str] | None:
        """The entry's package and summary when it is whole; a corrupt entry is removed (and None returned)."""
        entry = self._entry(key)
        pkg, meta_path = os.path.join(entry, "model.pt2"), os.path.join(entry, "entry.json")
        if not os.path.isfile(meta_path):
            return None
        try:
            with open(meta_path) as f:
                meta = json.load(f)
            if not os.path.isfile(pkg) or os.path.getsize(pkg) != meta["bytes"] or _sha256_file(pkg) != meta["sha256"]:
                raise PackageError("the package differs from its entry")
            manifest_mod.verify_hashes(pkg, manifest_mod.read(pkg))
            with open(os.path.join(entry, "summary.txt")) as f:
                summary = f.read()
        except (OSError, ValueError, KeyError, PackageError):
            with self._locked():
                shutil.rmtree(entry, ignore_errors=True)
            return None
        meta["used"] = time.time()
        _write_json(meta_path, meta)
        return pkg, summary

    def store(self, key: str, package: str, summary: str, parts: dict) -> None:
        os.makedirs(self.root, exist_ok=True)
        with self._locked():
            tmp = tempfile.mkdtemp(dir=self.root, prefix=".new-")
            shutil.copyfile(package, os.path.join(tmp, "model.pt2"))
            with open(os.path.join(tmp, "summary.txt"), "w") as f:
                f.write(summary)
            now = time.time()
            _write_json(os.path.join(tmp, "entry.json"), {"key": key, "sha256": _sha256_file(package),
                                                          "bytes": os.path.getsize(package), "made": now,
                                                          "used": now, "parts": parts})
            shutil.rmtree(self._entry(key), ignore_errors=True)
            os.replace(tmp, self._entry(key))
            self._evict()

    def _evict(self) -> None:
        """Removes least recently used entries until the cache fits max_bytes (with the lock held)."""
        entries = []
        for key in os.listdir(self.root):
            meta = os.path.join(self.root, key, "entry.json")
            try:
                with open(meta) as f:
                    m = json.load(f)
                entries.append((m["used"], m["bytes"], key))
            except (OSError, ValueError, KeyError):
                if not key.startswith(".") and key != "lock":
                    shutil.rmtree(os.path.join(self.root, key), ignore_errors=True)
        total = sum(b for _, b, _ in entries)
        for used, size, key in sorted(entries):
            if total <= self.max_bytes:
                break
            shutil.rmtree(os.path.join(self.root, key), ignore_errors=True)
            total -= size

    def _locked(self):
        os.makedirs(self.root, exist_ok=True)
        return _Lock(os.path.join(self.root, "lock"))


class _Lock:
    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        self.f = open(self.path, "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def _write_json(path: str, obj) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)
