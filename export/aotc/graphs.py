"""The graphs a package holds beside its main one, and how each is exported: static batch graphs
(`--static-batches`) and sequence-bucket graphs (`--seq-buckets`, crossed with the static batches).

`static_plan` picks the static batches (the device's default or the flag's), `plan` lists every graph to
export with the shapes it is static at, `export_graph` exports the model again at those shapes, and
`borrows_weights` says whether a graph can run on the main graph's weights. Not the compile (compile.py) and
not the archive (package.py). No state; AOTInductor's global config makes an export one at a time.
"""

from __future__ import annotations

import dataclasses

from aotc.errors import ExportError
from aotc.manifest import Batch, SeqBuckets, StaticGraph

# --static-batches when not given, for a model with a dynamic batch. On the H200, static graphs at the
# buckets up to 32 made BERT-base's batch-8 call 19% shorter than the dynamic graph's (and ahead of
# torch.compile's reduce-overhead, which the dynamic graph is not) and dynamic batching 4.4x instead of
# 3.8x, for about 80 s more compile, 13% more package and no more device memory (they run on the main graph's
# weights): docs/performance.md. On the CPU, freezing folds the weights into each graph, so each would
# carry its own copy: none by default.
DEFAULT_STATIC_BATCHES = {"cpu": (), "cuda": "buckets:32"}


def graph_buckets(lo: int, hi: int) -> list[int]:
    """The C++ runtime's CUDA-graph buckets for a batch range (runtime_cpp/src/cuda_graphs.cpp batch_buckets):
    every power of two in [lo, hi), then hi."""
    out, b = [], 1
    while b < hi:
        if b >= lo:
            out.append(b)
        b *= 2
    return out + [hi]


def static_plan(opts, batch: Batch | None) -> list[StaticGraph]:
    """The static graphs to compile (static_graph_plan): those --static-batches asks for, else the device's
    default where the model has a dynamic batch with a bucket in it (a default asks for nothing it cannot
    have, so it never fails the export)."""
    if opts.static_batches is not None:
        return static_graph_plan(opts.static_batches, batch)
    default = DEFAULT_STATIC_BATCHES[opts.device]
    if not default or batch is None:
        return []
    cap = int(default.split(":", 1)[1])
    return static_graph_plan(default, batch) if batch.min <= cap else []


def static_graph_plan(sizes, batch: Batch | None) -> list[StaticGraph]:
    """The manifest's 'static_graphs' (each a batch size and its AOTI model name) for `--static-batches`.
    `sizes`: batch sizes, or "buckets" (every CUDA-graph bucket of the batch range) / "buckets:N" (those up to
    N). Raises ExportError when the package has no batch dim or a size is outside it."""
    if not sizes:
        return []
    if batch is None:
        shown = sizes if isinstance(sizes, str) else ",".join(map(str, sizes))
        raise ExportError(f"--static-batches {shown}: the model has no dynamic batch dim to "
                          f"specialize; give it one (dynamic_shapes() or --dynamic-batch) or drop the flag")
    if isinstance(sizes, str):
        cap = int(sizes.split(":", 1)[1]) if ":" in sizes else batch.max
        sizes = [b for b in graph_buckets(batch.min, batch.max) if b <= cap]
        if not sizes:
            raise ExportError(f"--static-batches buckets:{cap}: no bucket of the batch range "
                              f"[{batch.min}, {batch.max}] is at most {cap}")
    outside = [n for n in sizes if not batch.min <= n <= batch.max]
    if outside:
        raise ExportError(f"--static-batches: {outside} outside the batch range [{batch.min}, {batch.max}]")
    # AOTInductor's loader takes a graph's files by name prefix (data/aotinductor/<name>...): "batch1" would
    # also take batch16's. The "_static" suffix keeps every name from being a prefix of another.
    return [StaticGraph(n, f"batch{n}_static") for n in sorted(set(sizes))]


def export_graph(mf, model, inputs: tuple, rewrites: dict, opts, batch_static: bool, seq=None):
    """The model exported again at `inputs` with dim 0 static (`batch_static`) and/or the sequence dim of
    `seq` (a manifest.SeqBuckets) static, rewritten as the main graph was (the same embedding-bag lowering,
    not measured again)."""
    from aotc import export as exp
    from aotc import seq_buckets

    size = inputs[0].shape[0]
    ds = exp.dynamic_shapes_for(mf, inputs, (size, size) if batch_static else opts.dynamic_batch)
    if seq is not None:
        ds = seq_buckets.static_shapes(ds, inputs, mf.input_names, seq)
    ep = exp.export_model(model, inputs, ds, opts.strict, mf.input_names, quiet=not opts.verbose,
                          positional=mf.positional)
    lowering = rewrites.get("embedding_bag", {}).get("lowering", opts.embedding_bag)
    ep, _ = rewrite(ep, inputs, dataclasses.replace(opts, embedding_bag=lowering, quick=True))
    return ep


def rewrite(ep, inputs, opts):
    from aotc.rewrite import run_rewrites

    return run_rewrites(ep, inputs, opts.device, {"embedding_bag": opts.embedding_bag, "measure": not opts.quick})


def weights_by_fqn(ep) -> dict:
    """The exported program's parameters, buffers and tensor constants by fully qualified name: the names
    AOTInductor's loaders take weights by (get_constant_fqns, load_constants)."""
    import torch

    return {k: v for k, v in {**ep.state_dict, **ep.constants}.items() if isinstance(v, torch.Tensor)}


def borrows_weights(ep_static, main_weights: dict) -> bool:
    """Whether a static graph can run on the main graph's weights: every weight it holds the main graph holds
    too, by the same name, shape, dtype and value (the same model, exported again; a rewrite that made
    batch-dependent constants would differ)."""
    import torch

    for fqn, t in weights_by_fqn(ep_static).items():
        m = main_weights.get(fqn)
        if m is None or m.shape != t.shape or m.dtype != t.dtype or not torch.equal(m, t):
            return False
    return True


@dataclasses.dataclass(frozen=True)
class Graph:
    """One graph to export and compile: its AOTInductor name, the batch it is static at (None: dynamic), the
    sequence bucket it is static at (None: no buckets)."""
    name: str
    batch: int | None = None
    seq: int | None = None

    @property
    def shown(self) -> str:
        """What it is static at, for the progress lines: "seq 64, batch 8"."""
        return ", ".join(f"{k} {v}" for k, v in (("seq", self.seq), ("batch", self.batch)) if v is not None)


def plan(static: list[StaticGraph], seq: SeqBuckets | None) -> list[Graph]:
    """Every graph beside the main dynamic one: the static batches; with sequence buckets, a graph per size
    (the largest is the main graph, "model", which then has its sequence dim static too) crossed with them."""
    from aotc import seq_buckets

    if seq is None:
        return [Graph(g.graph, g.batch) for g in static]
    out = [Graph(seq.graphs[n], None, n) for n in reversed(seq.sizes)]  # "model" first
    return out + [Graph(seq_buckets.graph_name(seq.sizes, n, g.batch), g.batch, n) for n in seq.sizes for g in static]
