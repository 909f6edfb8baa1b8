"""`aotc export`: model file -> eager reference -> torch.export -> rewrites -> AOTInductor -> package -> parity.

`export_model_file(spec, options)` runs every stage with a progress line each and returns the result
(manifest, graph report, compile time, parity per case); `run_export(spec, options)` does that and prints
the summary. It is not the CLI parser (cli/export.py) and does not serve. AOTInductor uses process-global config:
run one export per process at a time.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile

from aotc import compile as aoti
from aotc import export as exp
from aotc import graphs, package, parity, report, seq_buckets, seq_pack
from aotc.errors import ExportError, InconclusiveError, NoAttentionKernel, ParityError
from aotc.graphs import DEFAULT_STATIC_BATCHES
from aotc.manifest import Batch, StaticGraph, Tolerance
from aotc.load_model import load_model_file, with_example_batch
from aotc_client.compare import default_tolerance

@dataclasses.dataclass
class ExportOptions:
    out: str | None = None
    device: str = "cpu"
    dtype: str = "fp32"
    dynamic_batch: tuple[int, int] | None = None
    example_batch: int | None = None  # trace and tune at this batch size (load_model.with_example_batch)
    # also compile a graph with dim 0 static at each of these sizes; or "buckets" / "buckets:N"
    # (graphs.static_graph_plan);
    # None: DEFAULT_STATIC_BATCHES for the device, where the model has a dynamic batch
    static_batches: tuple[int, ...] | str | None = None
    # --seq-buckets INPUT:AXIS[,...]=N,N,...: a graph with the sequence dim static at each size (seq_buckets)
    seq_buckets: str | None = None
    # --seq-pack INPUT:AXIS[,...]=P: the graph runs rows of P tokens holding several requests each (seq_pack)
    seq_pack: str | None = None
    max_autotune: bool = False
    freezing: bool | None = None  # None: compile.DEVICE_DEFAULTS
    inductor_extra: dict = dataclasses.field(default_factory=dict)  # --inductor-config KEY=VALUE, applied last
    strict: bool = False
    sdpa_backend: str | None = None  # export.SDPA_BACKENDS key; None: PyTorch's choice
    name: str | None = None
    allow_python_ops: bool = False
    embedding_bag: str = "auto"
    # a reference output near zero or constant in every parity case is INCONCLUSIVE, an error unless allowed
    allow_trivial_outputs: bool = False
    samples: float | None = package.DEFAULT_SAMPLES_MB  # cap on stored samples in MB; None: no cap
    # iterate quickly: no decomposition in the graph report, parity at the example inputs only, the
    # embedding-bag lowering by rule instead of measured
    quick: bool = False
    quiet: bool = False
    verbose: bool = False


def tolerance_for(mf, dtype: str) -> Tolerance:
    """The model's tolerance(); at fp16/bf16 never tighter than the dtype's default."""
    atol, rtol = default_tolerance(exp.DTYPES[dtype])
    if mf.tolerance is None:
        return Tolerance(atol, rtol)
    if dtype == "fp32":
        return Tolerance(mf.tolerance["atol"], mf.tolerance["rtol"])
    return Tolerance(max(atol, mf.tolerance["atol"]), max(rtol, mf.tolerance["rtol"]))


def load_for_export(spec: str, opts: ExportOptions):
    """The model file as the export sees it: loaded, its example inputs at --example-batch."""
    mf = load_model_file(spec)
    return with_example_batch(mf, opts.example_batch) if opts.example_batch is not None else mf


def export_model_file(spec: str, opts: ExportOptions, mf=None) -> dict:
    """Every stage; `mf`: the model file already loaded by load_for_export (else it is loaded here)."""
    from aotc.export import attention_backend

    if opts.sdpa_backend is None and opts.device == "cuda":
        # On CUDA, flash attention unless the model's attention has no flash kernel (fp32, say): on the H200
        # it ran BERT-base 7% (batch 1) and 3% (batch 8) faster than PyTorch's own pick, cuDNN attention
        # (docs/performance.md). A model without attention is not affected.
        try:
            with attention_backend("flash"):
                return _export_model_file(spec, dataclasses.replace(opts, sdpa_backend="flash"), mf)
        except NoAttentionKernel:
            _retrying(opts, "flash attention takes no part of this model's attention; exporting again with "
                            "PyTorch's own pick")
        try:
            return _export_model_file(spec, opts, mf)
        except ExportError as e:
            if "declared dynamic range" not in str(e):
                raise
            _retrying(opts, "PyTorch's pick of attention kernel does not export for every size of the dynamic "
                            "dims; exporting again with math attention")
        # PyTorch's pick for attention with a mask (memory-efficient attention) pads the mask to a multiple of
        # 8, a guard torch.export cannot prove for every size of a dynamic sequence dim (a Hugging Face BERT
        # fails so on the H200); the math kernel has no such guard. A failure of another kind fails again.
        with attention_backend("math"):
            return _export_model_file(spec, dataclasses.replace(opts, sdpa_backend="math"), mf)
    with attention_backend(opts.sdpa_backend):
        return _export_model_file(spec, opts, mf)


def _retrying(opts: ExportOptions, why: str) -> None:
    """Says, after the progress lines of an attempt that failed, why the export runs again (those lines end in
    "failed", and the export has not)."""
    if not opts.quiet:
        print(f"    not a failure: {why}", file=sys.stderr, flush=True)


def _check_device(opts: ExportOptions) -> None:
    import torch

    if opts.device == "cuda" and not torch.cuda.is_available():
        raise ExportError("--device cuda asked for, but this machine has no usable CUDA device; use --device cpu")


def _output_path(opts: ExportOptions, mf) -> str:
    out = opts.out or os.path.join(".cache", "pkgs", f"{opts.name or mf.default_name}.pt2")
    if not out.endswith(".pt2"):
        raise ExportError(f"output '{out}' must end in .pt2 (AOTInductor's package extension)")
    return out


STAGES = 8  # the progress lines of an export with no other graph (each static graph adds two, a bucket's too)


def _export_model_file(spec: str, opts: ExportOptions, mf=None) -> dict:
    _check_device(opts)
    # the static graphs, counted now with --dynamic-batch, a list of sizes or no default; else (the buckets of a
    # batch range torch.export has yet to find) the stage count goes without a total until it does
    if opts.seq_buckets:
        planned = None
    elif opts.dynamic_batch:
        planned = len(graphs.static_plan(opts, Batch(*opts.dynamic_batch)))
    elif isinstance(opts.static_batches, tuple):
        planned = len(set(opts.static_batches))
    elif opts.static_batches is None and not DEFAULT_STATIC_BATCHES[opts.device]:
        planned = 0
    else:
        planned = None
    prog = report.Progress(None if planned is None else STAGES + 2 * planned, quiet=opts.quiet)

    if opts.seq_pack and opts.seq_buckets:
        raise ExportError("--seq-pack and --seq-buckets: give one (packing puts requests of any length in rows of "
                          "one length, buckets pad each to its bucket)")
    packed = None
    with prog.stage(f"loading {spec}") as note:
        mf = mf or load_for_export(spec, opts)
        name = opts.name or mf.default_name
        out = _output_path(opts, mf)
        if opts.seq_pack:  # from here on the export runs the packed model, its batch dim counting rows
            packed = seq_pack.packed_model_file(mf, seq_pack.parse(opts.seq_pack))
            mf = packed.mf
        note["text"] = f"inputs {mf.input_names}"

    with prog.stage("eager reference run") as note:
        model, inputs = exp.prepare(mf, opts.device, opts.dtype)
        output_names, ref = exp.run_eager(model, inputs, mf)
        note["text"] = f"{len(ref)} outputs: {', '.join(output_names)}"

    with prog.stage("torch.export" + (" (strict)" if opts.strict else "")):
        ds = exp.dynamic_shapes_for(mf, inputs, opts.dynamic_batch)
        ep = exp.export_model(model, inputs, ds, opts.strict, mf.input_names, quiet=not opts.verbose,
                              positional=mf.positional)
        attention = any("scaled_dot_product" in str(n.target) for n in ep.graph.nodes if n.op == "call_function")

    with prog.stage("graph report and rewrites" + (" (quick)" if opts.quick else "")) as note:
        ep, rewrites = graphs.rewrite(ep, inputs, opts)
        graph = report.graph_report(ep, mf.args_kwargs(inputs), decompose=not opts.quick)
        if graph["python_ops"] and not opts.allow_python_ops:
            raise ExportError(report.python_ops_message(graph["python_ops"]))
        specs_in, specs_out, batch = package.tensor_specs(ep, mf.input_names, output_names)
        specs_in, dims = package.name_dims(ep, mf, specs_in, batch is not None)
        seq = None
        if opts.seq_buckets:
            seq = seq_buckets.plan(seq_buckets.parse(opts.seq_buckets), ep, mf.input_names, output_names, specs_in,
                                   dims, mf.pad_values)
            specs_in = seq_buckets.narrow(specs_in, seq.inputs, seq)
            specs_out = seq_buckets.narrow(specs_out, seq.outputs, seq)
            dims = {**dims, seq.dim: (dims[seq.dim][0], seq.sizes[-1])}
        note["text"] = f"{graph['nodes']} ops, fallback: {', '.join(graph['fallback_ops']) or 'none'}"

    tol = tolerance_for(mf, opts.dtype)
    with prog.stage("eager runs of the parity cases" + (" (quick: the examples only)" if opts.quick else "")) as note:
        cases, unvaried = parity.make_cases(mf, model, inputs, ref, specs_in, dims, opts.device, opts.dtype,
                                            quick=opts.quick)
        if seq is not None:
            if not opts.quick:
                cases += parity.seq_bucket_cases(mf, model, inputs, specs_in, dims, seq, opts.device, opts.dtype)
            why = parity.padding_changes_answer(model, mf, cases, seq, output_names, tol)
            if why:
                raise ExportError(why)
        pack_entry = None
        if packed is not None:
            original = exp.prepare(packed.original, opts.device, opts.dtype)[0]
            kinds = seq_pack.output_kinds(packed, original, model, output_names, opts.device, opts.dtype)
            why = seq_pack.answer_changes(packed, original, model, kinds, output_names, opts.device, opts.dtype, tol)
            if why:
                raise ExportError(why)
            pack_entry = seq_pack.manifest_entry(packed, specs_in, specs_out, kinds)
        trivial = parity.trivial_outputs(cases, output_names, tol)
        if trivial and not opts.allow_trivial_outputs:
            raise InconclusiveError(parity.inconclusive_message(trivial, len(cases), tol))
        note["text"] = f"{len(cases)} cases" + (f"; not varied: {', '.join(unvaried)}" if unvaried else "")
    extra = graphs.plan(graphs.static_plan(opts, batch), seq)
    prog.total = STAGES + 2 * len(extra) - (1 if seq else 0)  # with buckets, "model" is one of them
    inductor = aoti.inductor_configs(opts.device, opts.max_autotune, "", opts.freezing, opts.inductor_extra)
    inductor.pop("aot_inductor.metadata")
    programs, static, borrowing = {}, [], set()  # graph name -> its exported program; static_graphs; no weights
    main_weights = graphs.weights_by_fqn(ep)
    for g in extra:  # each static batch graph's parity case is also a sample, for aotc-run's self-check
        with prog.stage(f"torch.export, static {g.shown}"):
            _, ins = exp.prepare(with_example_batch(mf, g.batch) if g.batch else mf, opts.device, opts.dtype)
            ins = seq_buckets.resize(ins, mf.input_names, seq, g.seq) if seq else ins
            programs[g.name] = graphs.export_graph(mf, model, ins, rewrites, opts, g.batch is not None, seq)
            if g.name == "model":  # the largest bucket's: the main graph, whose weights the others may take
                ep = programs.pop("model")
                main_weights = graphs.weights_by_fqn(ep)
                continue
            if not inductor.get("freezing") and graphs.borrows_weights(programs[g.name], main_weights):
                borrowing.add(g.name)  # compiled without weights: the runtime lends it the main graph's
            if g.batch is not None:
                static.append(StaticGraph(g.batch, g.name, "model" if g.name in borrowing else None, g.seq))
                if seq:  # its case at a length the graph pads
                    ins = seq_buckets.resize(ins, mf.input_names, seq,
                                             dict(seq_buckets.bucket_lengths(seq, dims[seq.dim][0])).get(g.seq, g.seq))
                cases.append(parity.static_case(static[-1], ins, exp.eager_outputs(model, ins, mf)))
    if seq:
        seq = dataclasses.replace(seq, weights=tuple(g.name for g in extra if g.batch is None and g.name in borrowing))

    sample_entries, sample_bytes, samples_cap = parity.samples_within(mf, model, cases, specs_in, dims, opts.samples,
                                                                       opts.device, opts.dtype)
    compile_options = {"dtype": opts.dtype, "max_autotune": opts.max_autotune,
                       "freezing": bool(inductor.get("freezing")), "strict": opts.strict, "inductor": inductor,
                       # the attention kernel, where the model has attention for it to choose
                       **({"sdpa_backend": opts.sdpa_backend} if opts.sdpa_backend and attention else {})}
    manifest = package.build_manifest(
        name=name, device=opts.device, cpu_isa=aoti.cpu_isa() if opts.device == "cpu" else "",
        cuda_arch=aoti.cuda_arch() if opts.device == "cuda" else None, inputs=specs_in, outputs=specs_out,
        batch=batch, compile_options=compile_options, rewrites=rewrites, fallback_ops=graph["fallback_ops"],
        tolerance=tol, samples=sample_entries, static_graphs=static, dims=dims, samples_cap=samples_cap,
        seq_buckets=seq, seq_pack=pack_entry)

    out_dir = os.path.dirname(os.path.abspath(out))
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".aotc-compile-") as tmp:
        compiled = os.path.join(tmp, os.path.basename(out))
        with prog.stage(f"AOTInductor compile ({opts.device}{', max-autotune' if opts.max_autotune else ''})"):
            configs = aoti.inductor_configs(opts.device, opts.max_autotune, manifest.to_json(), opts.freezing,
                                            opts.inductor_extra)
            compile_s = aoti.compile_package(ep, compiled, configs)
        static_compiled = {}
        for g in extra:
            if g.name == "model":
                continue
            with prog.stage(f"AOTInductor compile, static {g.shown}"):
                static_compiled[g.name] = os.path.join(tmp, f"{g.name}.pt2")
                without_weights = {"aot_inductor.package_constants_in_so": False} if g.name in borrowing else {}
                compile_s += aoti.compile_package(programs.pop(g.name), static_compiled[g.name],
                                                  {**configs, **without_weights})

        with prog.stage("packaging (manifest, hashes, samples)") as note:
            if report.python_ops_in_wrapper(report.wrapper_sources(compiled)) and not opts.allow_python_ops:
                raise ExportError(report.python_ops_message(graph["python_ops"] + graph["aten_without_c_shim"]
                                                     or ["an op without a C shim"]))
            manifest = package.finalize(compiled, out, manifest, sample_bytes, static_compiled)
            size = os.path.getsize(out)
            note["text"] = f"{size / 1e6:.1f} MB"

    with prog.stage("parity against eager (package loaded back)") as note:
        results = parity.check(out, cases, tol, opts.device, main_weights)
        note["text"] = f"{sum(r['ok'] for r in results)}/{len(results)} cases within tolerance"
    return {"path": out, "manifest": manifest, "graph": graph, "compile_s": compile_s, "size_bytes": size,
            "parity": results, "unvaried": unvaried, "trivial": trivial, "quick": opts.quick}


def parse_dynamic_batch(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    lo, sep, hi = text.partition(":")
    try:
        lo_i, hi_i = int(lo), int(hi)
    except ValueError:
        lo_i = hi_i = -1
    if not sep or lo_i < 1 or hi_i < lo_i:
        raise ExportError(f"--dynamic-batch {text!r}: expected MIN:MAX with 1 <= MIN <= MAX, e.g. 1:1024")
    return lo_i, hi_i


def parse_inductor_configs(items: list[str]) -> dict:
    """["coordinate_descent_tuning=True", ...] -> {key: value}; raises ExportError for an unknown key or a
    value that is not a Python literal."""
    if not items:
        return {}  # importing Inductor's config costs seconds (it imports dynamo): only when asked
    import ast

    from torch._inductor import config as inductor_config

    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ExportError(f"--inductor-config {item!r}: expected KEY=VALUE, e.g. coordinate_descent_tuning=True")
        try:
            getattr(inductor_config, key)
        except AttributeError:
            raise ExportError(f"--inductor-config {key!r}: not an Inductor config (see torch._inductor.config)") from None
        try:
            out[key] = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            raise ExportError(f"--inductor-config {item!r}: VALUE must be a Python literal (True, 3, 'x', ...)") from None
    return out


def run_export(spec: str, opts: ExportOptions, use_cache: bool = True, cache_max_bytes: int | None = None) -> int:
    """`aotc export`: exports and prints the summary, or with `use_cache` hands back the package of an earlier
    export with the same key (aotc.cache), saying `cache hit KEY`. Raises ParityError (the package kept, not
    cached) when a case failed."""
    if not opts.verbose:
        import logging

        import torch

        torch._logging.set_logs(all=logging.ERROR)  # dynamo/inductor warnings are for torch developers
    mf = store = None
    if use_cache:
        from aotc import cache

        _check_device(opts)
        mf = load_for_export(spec, opts)
        parts = cache.key_parts(mf, opts)
        key = cache.key_of(parts)
        store = cache.ExportCache(max_bytes=cache_max_bytes or cache.DEFAULT_MAX_BYTES)
        hit = store.lookup(key)
        if hit is not None:
            out = _output_path(opts, mf)
            _copy_into_place(hit[0], out)
            print(f"cache hit {key} ({store.root}; --no-cache exports again)")
            print(f"package   {out}  ({os.path.getsize(out) / 1e6:.1f} MB)\n{hit[1]}")
            return 0
        print(f"cache miss {key}", flush=True)
    result = export_model_file(spec, opts, mf)
    summary = report.format_summary(result, opts.allow_trivial_outputs)
    print(summary)
    bad = [c["label"] for c in result["parity"] if not c["ok"]]
    if bad:
        tol = result["manifest"].tolerance
        raise ParityError(f"parity failed for {', '.join(bad)}: the package differs from eager beyond "
                          f"atol={tol.atol:g} rtol={tol.rtol:g} (package kept at {result['path']})")
    if store is not None:  # the summary without its first line, which names where this export wrote it
        store.store(key, result["path"], summary.split("\n", 1)[1], parts)
    return 0


def _copy_into_place(src: str, out: str) -> None:
    import shutil

    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(os.path.abspath(out)), prefix=".aotc-", delete=False) as f:
        tmp = f.name
    shutil.copyfile(src, tmp)
    os.replace(tmp, out)
