"""The aotc manifest (docs/manifest.md) as a dataclass: the one place Python code of aotc reads, checks and
writes it.

`read(path)` takes it from a package with zipfile alone (no code loaded, no torch); `Manifest.from_dict`
checks a parsed document field by field and `to_dict` gives back the JSON form the exporter writes;
`verify_hashes` checks every compiled .so against `files_sha256`; `why_cannot_run` is the Python twin of
the C++ runtime's platform check (runtime_cpp/src/platform.cpp). Not the loader (loader.py) and not the
writer of archives (package.py). Values are plain data; functions keep no state and are thread-safe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import zipfile

from aotc.errors import PackageError

FORMAT = "aotc/1"
METADATA_KEY = "aotc.manifest"  # the package-metadata key (aot_inductor.metadata) that holds the manifest


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str                              # "float32", "int64", ... (docs/manifest.md)
    shape: tuple[int, ...]                  # -1 for a dynamic dim
    ranges: tuple[tuple[int, int], ...]     # inclusive [min, max] per dim; outputs: [0, -1] when unbounded
    # inputs: each dynamic dim's name (a key of Manifest.dims) or expression of names ("2*batch"); None static
    symbols: tuple[str | None, ...] | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                "ranges": [list(r) for r in self.ranges],
                **({"symbols": list(self.symbols)} if self.symbols is not None else {})}


@dataclasses.dataclass(frozen=True)
class Batch:
    """dim 0 of every input and output is one shared dynamic dim in [min, max]."""
    min: int
    max: int


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


@dataclasses.dataclass(frozen=True)
class StaticGraph:
    batch: int
    graph: str                    # the AOTInductor model name in the archive, e.g. "batch8_static"
    weights: str | None = None    # "model": compiled without weights, runs on the main graph's
    seq: int | None = None        # a package with seq_buckets: the sequence bucket it is static at too

    def to_dict(self) -> dict:
        return {"batch": self.batch, "graph": self.graph, **({"weights": self.weights} if self.weights else {}),
                **({"seq": self.seq} if self.seq is not None else {})}


@dataclasses.dataclass(frozen=True)
class SeqBuckets:
    """`aotc export --seq-buckets`: a graph with the sequence dim static at each size. A call of length l runs
    in the smallest size >= l, its inputs padded along the dim with their pad values and its per-token outputs
    cut back to l (aotc.seq_buckets; the C++ runtime and server do the same)."""
    dim: str                   # the free dim's name (a key of Manifest.dims), e.g. "seq"
    sizes: tuple[int, ...]     # ascending; the largest is the most the package takes
    inputs: dict               # input name -> the axis that is the dim
    outputs: dict              # output name -> the axis that is the dim (outputs without it are not listed)
    pad_values: dict           # input name -> the value its padding takes
    graphs: dict               # size -> the AOTInductor model name (the largest size's is "model")
    weights: tuple[str, ...] = ()  # the graphs compiled without weights, which run on "model"'s

    def to_dict(self) -> dict:
        return {"dim": self.dim, "sizes": list(self.sizes), "inputs": dict(self.inputs),
                "outputs": dict(self.outputs), "pad_values": dict(self.pad_values),
                "graphs": {str(k): v for k, v in self.graphs.items()}, "weights": list(self.weights)}

    @classmethod
    def from_dict(cls, d: dict) -> SeqBuckets:
        return cls(str(d["dim"]), tuple(int(n) for n in d["sizes"]), {str(k): int(v) for k, v in d["inputs"].items()},
                   {str(k): int(v) for k, v in d["outputs"].items()},
                   {str(k): float(v) for k, v in d["pad_values"].items()},
                   {int(k): str(v) for k, v in d["graphs"].items()}, tuple(str(g) for g in d.get("weights", ())))

    def bucket(self, length: int) -> int | None:
        """The size a call of `length` runs at; None beyond the largest."""
        return next((n for n in self.sizes if n >= length), None)


@dataclasses.dataclass(frozen=True)
class SeqPack:
    """`aotc export --seq-pack`: the graph runs rows of `size` tokens, each holding several requests' sequences
    one after the other (aotc.seq_pack). A request carries `request_inputs` ([b, n], n within its range: up to
    `size`, or less where a row is longer than the model's longest sequence) and gets `request_outputs`; the
    graph's own inputs are the packed ones, `segment_input` and `position_input`."""
    size: int                  # the row length
    dim: str                   # the sequence dim's name
    inputs: dict               # packed input name -> its sequence axis (1)
    pad_values: dict           # packed input name -> what the rest of a row holds
    segment_input: str         # [R, size] int64: 1, 2, ... per segment of a row, 0 for the rest
    position_input: str        # [R, size] int64: each token's position in its segment
    outputs: dict              # output name -> "tokens" (a segment's tokens) or "first" (its first token)
    request_inputs: tuple[TensorEntry, ...]
    request_outputs: tuple[TensorEntry, ...]

    def to_dict(self) -> dict:
        return {"size": self.size, "dim": self.dim, "inputs": dict(self.inputs), "pad_values": dict(self.pad_values),
                "segment_input": self.segment_input, "position_input": self.position_input,
                "outputs": dict(self.outputs), "request_inputs": [t.to_dict() for t in self.request_inputs],
                "request_outputs": [t.to_dict() for t in self.request_outputs]}

    @classmethod
    def from_dict(cls, d: dict) -> SeqPack:
        kinds = {str(k): str(v) for k, v in d["outputs"].items()}
        if set(kinds.values()) - {"tokens", "first"}:
            raise ValueError(f"seq_pack outputs are {kinds}, each must be 'tokens' or 'first'")
        return cls(int(d["size"]), str(d["dim"]), {str(k): int(v) for k, v in d["inputs"].items()},
                   {str(k): float(v) for k, v in d["pad_values"].items()}, str(d["segment_input"]),
                   str(d["position_input"]), kinds, tuple(_tensor(t) for t in d["request_inputs"]),
                   tuple(_tensor(t) for t in d["request_outputs"]))


@dataclasses.dataclass(frozen=True)
class Sample:
    inputs: tuple[str, ...]       # archive paths of .npy files, relative to the archive's root folder
    outputs: tuple[str, ...]
    case: str = ""                # the parity case it is, e.g. "example inputs", "fresh odd (batch=37)"
    bytes: int = 0                # its .npy files together

    def to_dict(self) -> dict:
        return {"inputs": list(self.inputs), "outputs": list(self.outputs),
                **({"case": self.case} if self.case else {}), **({"bytes": self.bytes} if self.bytes else {})}


@dataclasses.dataclass(frozen=True)
class Manifest:
    name: str
    device: str                   # "cpu" or "cuda"
    torch_version: str
    inputs: tuple[TensorEntry, ...]
    outputs: tuple[TensorEntry, ...]
    tolerance: Tolerance
    samples: tuple[Sample, ...]
    batch: Batch | None = None
    cpu_isa: str = ""
    cuda_arch: tuple[str, ...] | None = None
    compile: dict = dataclasses.field(default_factory=dict)      # free-form: the options compiled with
    rewrites: dict = dataclasses.field(default_factory=dict)     # free-form: what graph rewrites did
    fallback_ops: tuple[str, ...] = ()
    files_sha256: dict = dataclasses.field(default_factory=dict)  # archive path of each .so -> sha256
    static_graphs: tuple[StaticGraph, ...] = ()
    # the free dynamic dims of the inputs by name, each its inclusive [min, max] (TensorEntry.symbols use them)
    dims: dict = dataclasses.field(default_factory=dict)
    # what the sample cap kept: {"max_bytes": N or None (no cap), "bytes": kept, "left_out": [{"case", "bytes"}]}
    samples_cap: dict = dataclasses.field(default_factory=dict)
    seq_buckets: SeqBuckets | None = None
    seq_pack: SeqPack | None = None
    format: str = FORMAT
    aotc_version: str = ""
    created: str = ""

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    @property
    def dtype(self) -> str:
        """The --dtype it was exported with (fp32, fp16, bf16)."""
        return self.compile.get("dtype", "fp32")

    def static_graph(self, graph: str) -> StaticGraph | None:
        return next((g for g in self.static_graphs if g.graph == graph), None)

    def to_dict(self) -> dict:
        """The JSON form, as docs/manifest.md shows it."""
        return {
            "format": self.format, "aotc_version": self.aotc_version, "name": self.name, "created": self.created,
            "torch_version": self.torch_version, "device": self.device, "cpu_isa": self.cpu_isa,
            "cuda_arch": None if self.cuda_arch is None else list(self.cuda_arch),
            "inputs": [t.to_dict() for t in self.inputs], "outputs": [t.to_dict() for t in self.outputs],
            "batch": None if self.batch is None else {"min": self.batch.min, "max": self.batch.max},
            "compile": self.compile, "rewrites": self.rewrites, "fallback_ops": list(self.fallback_ops),
            "tolerance": {"atol": self.tolerance.atol, "rtol": self.tolerance.rtol},
            "files_sha256": dict(self.files_sha256),
            "samples": [s.to_dict() for s in self.samples],
            "static_graphs": [g.to_dict() for g in self.static_graphs],
            **({"dims": {k: list(v) for k, v in self.dims.items()}} if self.dims else {}),
            **({"samples_cap": self.samples_cap} if self.samples_cap else {}),
            **({"seq_buckets": self.seq_buckets.to_dict()} if self.seq_buckets else {}),
            **({"seq_pack": self.seq_pack.to_dict()} if self.seq_pack else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d, where: str = "the manifest") -> Manifest:
        """Checks a parsed manifest; raises PackageError naming the first missing or mistyped field."""
        if not isinstance(d, dict):
            raise PackageError(f"{where}: the aotc manifest is {type(d).__name__}, expected a JSON object")
        if d.get("format") != FORMAT:
            raise PackageError(f"{where}: manifest format is {d.get('format')!r}, this aotc reads {FORMAT!r}")
        try:
            batch = d.get("batch")
            arch = d.get("cuda_arch")
            return cls(
                name=_str(d, "name"), device=_str(d, "device"), torch_version=_str(d, "torch_version"),
                inputs=tuple(_tensor(t) for t in _list(d, "inputs")),
                outputs=tuple(_tensor(t) for t in _list(d, "outputs")),
                tolerance=Tolerance(float(d["tolerance"]["atol"]), float(d["tolerance"]["rtol"])),
                samples=tuple(Sample(tuple(s["inputs"]), tuple(s["outputs"]), str(s.get("case", "")),
                                     int(s.get("bytes", 0))) for s in _list(d, "samples")),
                batch=None if batch is None else Batch(int(batch["min"]), int(batch["max"])),
                cpu_isa=d.get("cpu_isa") or "", cuda_arch=None if arch is None else tuple(arch),
                compile=dict(d.get("compile") or {}), rewrites=dict(d.get("rewrites") or {}),
                fallback_ops=tuple(d.get("fallback_ops") or ()), files_sha256=dict(d.get("files_sha256") or {}),
                static_graphs=tuple(StaticGraph(int(g["batch"]), str(g["graph"]), g.get("weights"),
                                                None if g.get("seq") is None else int(g["seq"]))
                                    for g in d.get("static_graphs") or ()),
                dims={str(k): (int(v[0]), int(v[1])) for k, v in (d.get("dims") or {}).items()},
                samples_cap=dict(d.get("samples_cap") or {}),
                seq_buckets=SeqBuckets.from_dict(d["seq_buckets"]) if d.get("seq_buckets") else None,
                seq_pack=SeqPack.from_dict(d["seq_pack"]) if d.get("seq_pack") else None,
                format=d["format"], aotc_version=str(d.get("aotc_version", "")), created=str(d.get("created", "")))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PackageError(f"{where}: the aotc manifest is malformed ({type(e).__name__}: {e}); re-export "
                               f"the package") from None


def _str(d: dict, key: str) -> str:
    v = d.get(key)
    if not isinstance(v, str):
        raise ValueError(f"'{key}' is {v!r}, expected a string")
    return v


def _list(d: dict, key: str) -> list:
    v = d.get(key)
    if not isinstance(v, list):
        raise ValueError(f"'{key}' is {v!r}, expected a list")
    return v


def _tensor(t: dict) -> TensorEntry:
    symbols = t.get("symbols")
    return TensorEntry(str(t["name"]), str(t["dtype"]), tuple(int(n) for n in t["shape"]),
                       tuple((int(lo), int(hi)) for lo, hi in t["ranges"]),
                       None if symbols is None else tuple(None if x is None else str(x) for x in symbols))


def _metadata_records(zf: zipfile.ZipFile) -> list[str]:
    return [n for n in zf.namelist() if "/data/aotinductor/" in n and n.endswith("_metadata.json")]


def read(path: str) -> Manifest:
    """The manifest of a package, read with zipfile only. Raises PackageError saying what is wrong."""
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
    if METADATA_KEY not in meta:
        raise PackageError(f"{path} has no aotc manifest (metadata key '{METADATA_KEY}'); export it with aotc")
    try:
        parsed = json.loads(meta[METADATA_KEY])
    except ValueError as e:
        raise PackageError(f"{path}: the aotc manifest is not valid JSON ({e})") from e
    return Manifest.from_dict(parsed, path)


def read_samples(path: str, manifest: Manifest | None = None) -> list[tuple[list, list]]:
    """The samples stored in a package as numpy arrays, [(inputs, outputs), ...] in manifest order, read with
    zipfile (no code loaded). bfloat16 comes back as its uint16 bits, as stored."""
    import io

    import numpy as np

    manifest = manifest or read(path)
    with zipfile.ZipFile(path) as zf:
        root = zf.namelist()[0].split("/")[0]
        load = lambda p: np.load(io.BytesIO(zf.read(f"{root}/{p}")), allow_pickle=False)  # noqa: E731
        return [([load(p) for p in s.inputs], [load(p) for p in s.outputs]) for s in manifest.samples]


def verify_hashes(path: str, manifest: Manifest) -> None:
    """Refuses the package when a .so is missing from files_sha256 or its sha256 differs."""
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            root, _, rel = name.partition("/")
            if not rel.endswith(".so"):
                continue
            want = manifest.files_sha256.get(rel)
            if want is None:
                raise PackageError(f"{path}: {rel} is not listed in the manifest's files_sha256; the package "
                                   f"was altered after export")
            got = hashlib.sha256(zf.read(name)).hexdigest()
            if got != want:
                raise PackageError(f"{path}: sha256 of {rel} is {got[:12]}..., the manifest says {want[:12]}...; "
                                   f"the package is corrupt or was altered")


def _major_minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def why_cannot_run(manifest: Manifest) -> str | None:
    """None when the package can run on this machine (torch major.minor, device, CUDA arch, CPU ISA), else
    the one-line reason."""
    import torch

    want, have = _major_minor(manifest.torch_version), _major_minor(torch.__version__)
    if want != have:
        return f"compiled with torch {manifest.torch_version}, this machine has torch {torch.__version__} " \
               f"(major.minor must match); re-export here"
    if manifest.device == "cuda":
        if not torch.cuda.is_available():
            return "it is a CUDA package and this machine has no usable CUDA device; export with --device cpu"
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
        if manifest.cuda_arch and arch not in manifest.cuda_arch:
            return f"compiled for {list(manifest.cuda_arch)}, this GPU is {arch}; re-export on this GPU"
    elif manifest.device == "cpu":
        if manifest.cpu_isa:
            from torch._inductor.cpu_vec_isa import valid_vec_isa_list

            supported = {str(v).lower() for v in valid_vec_isa_list()}
            if manifest.cpu_isa not in supported:
                return (f"compiled for CPU ISA {manifest.cpu_isa}, this CPU supports {sorted(supported) or 'none'}; "
                        f"re-export here")
    else:
        return f"unknown device {manifest.device!r} in the manifest (expected 'cpu' or 'cuda')"
    return None
