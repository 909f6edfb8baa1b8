"""`aotc export MODEL.py[:NAME]`: the parser, and the line turned into pipeline.ExportOptions (whose field
defaults are the defaults shown here)."""

from __future__ import annotations

import argparse

EMBEDDING_BAG_CHOICES = ("auto", "decompose", "jagged", "triton", "aten_sum", "aten")


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return n


def static_batches(text: str) -> tuple[int, ...] | str:
    """`N,N,...`, or `buckets` / `buckets:N` (the runtime's CUDA-graph buckets in the batch range, up to N),
    expanded once the batch range is known (graphs.static_graph_plan), or `none`."""
    if text == "none":
        return ()
    if text == "buckets" or text.startswith("buckets:"):
        if text != "buckets":
            try:
                positive_int(text.split(":", 1)[1])
            except argparse.ArgumentTypeError:
                raise argparse.ArgumentTypeError(f"expected buckets:N with N a whole number >= 1, got {text!r}")
        return text
    return tuple(positive_int(t) for t in text.split(","))


def _checked(module: str):
    """An argparse type for a flag that `aotc.<module>.parse` checks (its ExportError becomes argparse's
    message); the text is kept as given."""
    def check(text: str) -> str:
        import importlib

        from aotc.errors import ExportError

        try:
            importlib.import_module(f"aotc.{module}").parse(text)
        except ExportError as e:
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[-1]) from None
        return text
    return check


seq_buckets = _checked("seq_buckets")  # INPUT:AXIS[,INPUT:AXIS...]=N,N,...
seq_pack = _checked("seq_pack")        # INPUT:AXIS[,INPUT:AXIS...]=P


def samples_mb(text: str) -> float | None:
    """`--samples MB` (a cap in MB, >= 0) or `none` (no cap)."""
    if text == "none":
        return None
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if not mb >= 0:
        raise argparse.ArgumentTypeError(f"expected a size in MB (a number >= 0) or 'none', got {text!r}")
    return mb


def add_parser(sub) -> None:
    from aotc.pipeline import ExportOptions

    d = ExportOptions()
    p = sub.add_parser("export", help="export a model file to a verified AOTInductor .pt2 package",
                       description="Run the model eagerly, torch.export it, compile it with AOTInductor, write "
                                   "a .pt2 package with a manifest and samples, and check it against eager.")
    p.add_argument("model", metavar="MODEL.py[:NAME]", help="model file; :NAME picks the function NAME() "
                   "instead of model()")
    p.add_argument("-o", "--output", metavar="OUT.pt2", help="package path (default .cache/pkgs/<name>.pt2)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=d.device)
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default=d.dtype,
                   help="cast the model and its float inputs to this dtype")
    p.add_argument("--dynamic-batch", metavar="MIN:MAX", help="make dim 0 of every input a batch dim in "
                   "[MIN, MAX] (overrides the file's dynamic_shapes() for dim 0)")
    p.add_argument("--static-batches", type=static_batches, metavar="N,N,...|buckets[:N]|none",
                   help="also compile a graph with a static batch of each size into the package; the C++ "
                        "runtime runs it for calls of that batch (with CUDA graphs: for that bucket). "
                        "'buckets' takes every CUDA-graph bucket of the batch range (powers of two, and the "
                        "maximum), 'buckets:N' those up to N. They run on the main graph's weights, unless "
                        "freezing folds the weights into each graph. Default: buckets:32 for --device cuda "
                        "when the model has a dynamic batch, none for cpu")
    p.add_argument("--seq-buckets", type=seq_buckets, metavar="INPUT:AXIS[,INPUT:AXIS...]=N,N,...",
                   help="compile a graph with the sequence dim static at each size N (e.g. input_ids:1,"
                        "attention_mask:1=32,64,128): a call of length l runs in the smallest N >= l, its inputs "
                        "padded (with 0, or the file's pad_values()) and its per-token outputs cut back to l. "
                        "Every input with the dim must be named; lengths above the largest N are refused. Crossed "
                        "with --static-batches. A model whose answer changes with padding is refused")
    p.add_argument("--seq-pack", type=seq_pack, metavar="INPUT:AXIS[,INPUT:AXIS...]=P",
                   help="compile the model as it runs packed (the model file's pack_model(model)): rows of P tokens, "
                        "each holding the sequences of several requests one after the other, so that no request "
                        "is padded to a bucket (e.g. input_ids:1,attention_mask:1=128). aotc-server packs the "
                        "requests it batches and reads each one's answer back. Every input must carry the dim; "
                        "a pack_model whose answers differ from the model's is refused")
    p.add_argument("--example-batch", type=positive_int, metavar="N",
                   help="trace and tune at batch N: example inputs from the file's make_inputs(N), else its "
                        "example rows repeated (Inductor picks kernel launch configs for the example's sizes)")
    p.add_argument("--max-autotune", action="store_true", help="let Inductor benchmark kernel choices (slow)")
    p.add_argument("--freezing", choices=("on", "off"), help="fold the weights into the graph as constants "
                   "(default: on for cpu, off for cuda, as measured in docs/performance.md)")
    p.add_argument("--inductor-config", action="append", default=[], metavar="KEY=VALUE",
                   help="an Inductor config for the compile, e.g. coordinate_descent_tuning=True (repeatable; "
                        "VALUE is a Python literal)")
    p.add_argument("--sdpa-backend", choices=("flash", "efficient", "cudnn", "math"),
                   help="the attention kernel scaled_dot_product_attention records in the graph (default: "
                        "flash on cuda where the model's attention has a flash kernel, else PyTorch's choice)")
    p.add_argument("--strict", action="store_true", help="torch.export in strict mode (TorchDynamo)")
    p.add_argument("--name", help="model name in the manifest (default: the file's stem)")
    p.add_argument("--allow-python-ops", action="store_true",
                   help="accept ops that would call back into Python at run time (proxy executor)")
    p.add_argument("--embedding-bag", choices=EMBEDDING_BAG_CHOICES, default=d.embedding_bag,
                   help="how nn.EmbeddingBag is lowered (auto: measure and pick)")
    p.add_argument("--allow-trivial-outputs", action="store_true",
                   help="export even when parity is inconclusive: an output whose eager values are all within "
                        "atol of zero, or constant, in every case (a package of zeros would pass)")
    p.add_argument("--samples", type=samples_mb, default=d.samples, metavar="MB|none",
                   help="cap the samples stored in the package (inputs and eager outputs for aotc-run's "
                        "self-check) at MB megabytes, the example made smaller if it alone does not fit (at "
                        "least one sample is kept); none: no cap (default %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="iterate quickly: a graph report without decomposition, parity on the example inputs "
                        "only, the embedding-bag lowering by rule instead of measured")
    p.add_argument("--verbose", "-v", action="store_true", help="show tracebacks, torch's logs and what it prints "
                   "while an export fails")
    p.set_defaults(parser=p)
    p.add_argument("--no-cache", dest="cache", action="store_false",
                   help="export even when the export cache ($AOTC_CACHE_DIR, default ~/.cache/aotc) holds this "
                        "export's package, and do not store it there")
    p.add_argument("--cache-max-gb", type=float, default=20.0, metavar="GB",
                   help="the cache's size cap; least recently used entries go first (default %(default)s)")


def options(args):
    """The parsed line as pipeline.ExportOptions. Raises ExportError for a bad --dynamic-batch or
    --inductor-config."""
    from aotc import pipeline

    return pipeline.ExportOptions(
        out=args.output, device=args.device, dtype=args.dtype,
        dynamic_batch=pipeline.parse_dynamic_batch(args.dynamic_batch), example_batch=args.example_batch,
        static_batches=args.static_batches, seq_buckets=args.seq_buckets, seq_pack=args.seq_pack,
        max_autotune=args.max_autotune,
        freezing={"on": True, "off": False}.get(args.freezing),
        inductor_extra=pipeline.parse_inductor_configs(args.inductor_config), strict=args.strict,
        sdpa_backend=args.sdpa_backend, name=args.name, allow_python_ops=args.allow_python_ops,
        embedding_bag=args.embedding_bag, allow_trivial_outputs=args.allow_trivial_outputs, samples=args.samples,
        quick=args.quick, verbose=args.verbose)


def run(args) -> int:
    from aotc import pipeline

    if not args.cache_max_gb > 0:
        args.parser.error(f"--cache-max-gb {args.cache_max_gb:g}: expected a size above 0")
    return pipeline.run_export(args.model, options(args), use_cache=args.cache,
                               cache_max_bytes=int(args.cache_max_gb * (1 << 30)))
