"""Stage 5: the aotc manifest (docs/manifest.md) and the final package archive.

`tensor_specs` reads names, dtypes, shapes and each dynamic dim's range from an ExportedProgram;
`build_manifest` assembles the manifest; `finalize` rewrites the compiled archive with torch's own archive
writer so that every `*_metadata.json` carries the final manifest (with `files_sha256` of every .so) and
the samples lie under `<root>/aotc/`. The result still loads with torch's `aoti_load_package`.
Not the loader (see loader.py). Functions touch only the paths they are given; the output is written to a
temporary file and renamed into place, so a reader never sees a half-written package.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import io
import json
import os
import tempfile

import aotc
from aotc.errors import PackageError
from aotc.manifest import METADATA_KEY, Batch, Manifest, Sample, TensorEntry, Tolerance

INT64_MAX = 2**63 - 1
SAMPLE_DIR = "aotc"  # not extra/: torch's Python loader decodes every extra/ file as UTF-8 text
_SYSTEM_RECORDS = {".data/version", ".data/serialization_id"}  # the writer adds its own
_MODEL_DIR = "data/aotinductor/model/"  # where AOTInductor puts the one model it compiles


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dim_range(expr, rc, unknown_hi: int) -> tuple[int, int]:
    """Inclusive [lo, hi] of a symbolic size under the program's range constraints."""
    from torch.utils._sympy.value_ranges import bound_sympy

    vr = rc.get(expr) if expr in rc else bound_sympy(expr, rc)
    lo = int(vr.lower) if vr.lower.is_finite else 0
    hi = int(vr.upper) if vr.upper.is_finite else unknown_hi
    return lo, hi


def _spec(name: str, val, rc, is_output: bool) -> tuple[TensorEntry, object]:
    """(the manifest's entry, the symbol of dim 0 or None) for one fake tensor."""
    import torch

    shape, ranges, dim0 = [], [], None
    for i, d in enumerate(val.shape):
        if isinstance(d, torch.SymInt) and not d.node.expr.is_number:
            expr = d.node.expr
            lo, hi = _dim_range(expr, rc, -1 if is_output else INT64_MAX)
            if is_output and hi == -1:
                lo = 0
            shape.append(-1)
            ranges.append((lo, hi))
            if i == 0 and expr.is_Symbol:
                dim0 = expr
        else:
            shape.append(int(d))
            ranges.append((int(d), int(d)))
    return TensorEntry(name, dtype_name(val.dtype), tuple(shape), tuple(ranges)), dim0


def tensor_specs(ep, input_names: list[str],
                 output_names: list[str]) -> tuple[list[TensorEntry], list[TensorEntry], Batch | None]:
    """(inputs, outputs, batch) for the manifest, from the ExportedProgram's user inputs and outputs."""
    from torch.export.graph_signature import OutputKind

    nodes = {n.name: n for n in ep.graph.nodes}
    rc = ep.range_constraints
    user_inputs = ep.graph_signature.user_inputs
    out_nodes = [s.arg.name for s in ep.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    inputs, outputs, dims0 = [], [], []
    for name, node_name in zip(input_names, user_inputs):
        spec, d0 = _spec(name, nodes[node_name].meta["val"], rc, False)
        inputs.append(spec)
        dims0.append(d0)
    for name, node_name in zip(output_names, out_nodes):
        spec, d0 = _spec(name, nodes[node_name].meta["val"], rc, True)
        outputs.append(spec)
        dims0.append(d0)
    batch = None
    if dims0 and dims0[0] is not None and all(d == dims0[0] for d in dims0):
        batch = Batch(*inputs[0].ranges[0])
    return inputs, outputs, batch


def name_dims(ep, mf, inputs: list[TensorEntry], batched: bool) -> tuple[list[TensorEntry], dict]:
    """(the inputs with `symbols`, the manifest's `dims`): each dynamic dim of an input named as the user knows
    it -- "batch" for the shared dim 0 of a batched model, else the name of the model file's Dim
    (dynamic_shapes()), else "<input>_dim<d>" -- and a derived dim as the expression of those names ("2*batch").
    `dims` gives each free dim's range."""
    import sympy
    import torch

    per_input = mf.dynamic_shapes if isinstance(mf.dynamic_shapes, dict) else dict(
        zip(mf.input_names, mf.dynamic_shapes or ()))
    nodes = {n.name: n for n in ep.graph.nodes}
    rc = ep.range_constraints
    vals = [nodes[n].meta["val"] for n in ep.graph_signature.user_inputs]
    names: dict = {}
    for name, val in zip(mf.input_names, vals):
        declared = per_input.get(name)
        declared = dict(enumerate(declared)) if isinstance(declared, (tuple, list)) else dict(declared or {})
        for d, size in enumerate(val.shape):
            if not (isinstance(size, torch.SymInt) and size.node.expr.is_Symbol) or size.node.expr in names:
                continue
            dim = declared.get(d, declared.get(d - val.dim()))
            dim = getattr(dim, "root", None) if type(dim).__name__ == "_DerivedDim" else dim
            want = "batch" if batched and d == 0 else getattr(dim, "__name__", None) or f"{name}_dim{d}"
            want = want if want.isidentifier() else f"{name}_dim{d}"
            while want in names.values():
                want += "_"
            names[size.node.expr] = want
    for name, val in zip(mf.input_names, vals):  # the roots of derived dims (2*batch) that no dim has plainly
        declared = per_input.get(name)
        declared = dict(enumerate(declared)) if isinstance(declared, (tuple, list)) else dict(declared or {})
        for d, size in enumerate(val.shape):
            if not isinstance(size, torch.SymInt) or size.node.expr.is_number:
                continue
            for sym in sorted(size.node.expr.free_symbols - set(names), key=str):
                root = getattr(declared.get(d, declared.get(d - val.dim())), "root", None)
                want = getattr(root, "__name__", "") if len(size.node.expr.free_symbols) == 1 else ""
                want = want if want.isidentifier() else f"{name}_dim{d}_{sym}"
                while want in names.values():
                    want += "_"
                names[sym] = want
    rename = {sym: sympy.Symbol(n, integer=True, positive=True) for sym, n in names.items()}
    out = []
    for entry, val in zip(inputs, vals):
        symbols = tuple(None if not isinstance(size, torch.SymInt) or size.node.expr.is_number
                        else str(size.node.expr.xreplace(rename)) for size in val.shape)
        out.append(dataclasses.replace(entry, symbols=symbols))
    dims = {n: _dim_range(sym, rc, INT64_MAX) for sym, n in names.items()}
    return out, dims


def npy_bytes(t) -> bytes:
    """NumPy format 1.0, little-endian, C order. bfloat16 (which NumPy lacks) is stored as its uint16 bits."""
    import numpy as np
    import torch

    t = t.detach().cpu().contiguous()
    arr = t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
    arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(arr), version=(1, 0), allow_pickle=False)
    return buf.getvalue()


DEFAULT_SAMPLES_MB = 16  # aotc export --samples: the cap on stored samples, in MB (1e6 bytes)


def case_bytes(case: dict) -> int:
    """What a parity case's inputs and eager outputs take as stored samples (their tensors' bytes)."""
    ins, outs = case["inputs_outputs"]
    return sum(t.numel() * t.element_size() for t in (*ins, *outs))


def pick_samples(cases: list[dict], max_bytes: int | None) -> tuple[list[dict], list[dict]]:
    """(kept, left out) of the cases marked as samples, in order (the example first, then static graphs', then
    fresh ones), each kept while the total stays within `max_bytes` (None: no cap). The first is kept whatever
    its size: a package carries at least one sample (shrink it first: parity.shrink_to)."""
    kept, left, total = [], [], 0
    marked = [c for c in cases if c.get("sample")]
    # the first (the example), then the static graphs' (aotc-run's self-check of each graph), then the rest
    marked = marked[:1] + sorted(marked[1:], key=lambda c: 0 if c.get("graph") else 1)
    for case in marked:
        size = case_bytes(case)
        if not kept or max_bytes is None or total + size <= max_bytes:
            kept.append(case)
            total += size
        else:
            left.append(case)
    return kept, left


def sample_files(samples: list[tuple[tuple, tuple]], cases: list[str] | None = None) -> tuple[list[Sample],
                                                                                              dict[str, bytes]]:
    """(manifest 'samples' entries, {archive path: npy bytes}) for [(inputs, outputs), ...]; `cases` names the
    parity case each sample is."""
    entries, files = [], {}
    for k, (ins, outs) in enumerate(samples):
        paths, size = {}, 0
        for kind, tensors in (("input", ins), ("output", outs)):
            paths[kind] = tuple(f"{SAMPLE_DIR}/sample{k}_{kind}{i}.npy" for i in range(len(tensors)))
            for path, t in zip(paths[kind], tensors):
                files[path] = npy_bytes(t)
                size += len(files[path])
        entries.append(Sample(paths["input"], paths["output"], cases[k] if cases else "", size))
    return entries, files


def build_manifest(*, name: str, device: str, cpu_isa: str, cuda_arch, inputs, outputs, batch: Batch | None,
                   compile_options: dict, rewrites: dict, fallback_ops, tolerance: Tolerance, samples,
                   static_graphs=(), dims=None, samples_cap=None, seq_buckets=None, seq_pack=None) -> Manifest:
    """The manifest before the archive exists (files_sha256 is filled in by finalize)."""
    import torch

    return Manifest(
        name=name, device=device, torch_version=torch.__version__, inputs=tuple(inputs), outputs=tuple(outputs),
        tolerance=tolerance, samples=tuple(samples), batch=batch, cpu_isa=cpu_isa,
        cuda_arch=None if cuda_arch is None else tuple(cuda_arch), compile=compile_options, rewrites=rewrites,
        fallback_ops=tuple(fallback_ops), static_graphs=tuple(static_graphs), dims=dict(dims or {}),
        samples_cap=dict(samples_cap or {}), seq_buckets=seq_buckets, seq_pack=seq_pack, aotc_version=aotc.__version__,
        created=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))


def finalize(compiled_path: str, out_path: str, manifest: Manifest, extra_files: dict[str, bytes],
             static_compiled: dict[str, str] | None = None) -> Manifest:
    """Writes `out_path`: the compiled archive + samples, every *_metadata.json carrying the final manifest
    (files_sha256 filled in). `static_compiled` ({graph name: compiled archive}) adds more graphs, each
    archive's model moved to data/aotinductor/<graph name>/. Returns that manifest."""
    import torch
    from torch.export.pt2_archive import PT2ArchiveWriter

    reader = torch._C.PyTorchFileReader(compiled_path)
    records = [r for r in reader.get_all_records() if r not in _SYSTEM_RECORDS]
    contents = {r: reader.get_record(r) for r in records}
    for graph, path in (static_compiled or {}).items():
        other = torch._C.PyTorchFileReader(path)
        for r in other.get_all_records():
            if r in _SYSTEM_RECORDS or (not r.startswith(_MODEL_DIR) and r in contents
                                        and contents[r] == other.get_record(r)):
                # the writer's own records, and the archive's format records both archives share; never a file
                # of the graph itself: a kernel both graphs compiled alike must be in the graph's own folder too,
                # where its .so loads it from (dropping it failed gpt2 on the H200: "CUDA driver error: file
                # not found")
                continue
            if not r.startswith(_MODEL_DIR):
                raise PackageError(f"{path}: record '{r}' is outside {_MODEL_DIR}; cannot merge it as graph '{graph}'")
            contents[f"data/aotinductor/{graph}/{r[len(_MODEL_DIR):]}"] = other.get_record(r)
    records = list(contents)
    manifest = dataclasses.replace(manifest, files_sha256={r: hashlib.sha256(b).hexdigest()
                                                           for r, b in sorted(contents.items()) if r.endswith(".so")})
    text = manifest.to_json()
    for r in records:
        if r.endswith("_metadata.json"):
            meta = json.loads(contents[r])
            meta[METADATA_KEY] = text
            contents[r] = json.dumps(meta).encode()
    contents.update(extra_files)

    out_dir = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(out_dir, exist_ok=True)
    # The archive's top folder is named after the file, so write under the final name in a private dir.
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".aotc-") as tmp:
        tmp_path = os.path.join(tmp, os.path.basename(out_path))
        with PT2ArchiveWriter(tmp_path) as writer:
            for r, data in contents.items():
                writer.write_bytes(r, data)
        os.replace(tmp_path, out_path)
    return manifest
