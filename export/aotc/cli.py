"""The `aotc` command line: parsing only. Each subcommand names the module and function that does the work,
imported on demand, so `aotc --help` never imports torch.

Errors: every AotcError is caught here once and printed as one line `aotc: error: <message>` (the
traceback only with --verbose); the exit code is the error's `exit_code`. Single-threaded.
"""

from __future__ import annotations

import argparse
import importlib
import sys

EMBEDDING_BAG_CHOICES = ("auto", "decompose", "jagged", "triton", "aten_sum", "aten")


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return n


def size_list(text: str) -> list[int]:
    return [positive_int(t) for t in text.split(",")]


def static_batches(text: str) -> list[int] | str:
    """`N,N,...`, or `buckets` / `buckets:N` (the runtime's CUDA-graph buckets in the batch range, up to N),
    expanded once the batch range is known (pipeline.static_graph_plan), or `none`."""
    if text == "none":
        return []
    if text == "buckets" or text.startswith("buckets:"):
        if text != "buckets":
            try:
                positive_int(text.split(":", 1)[1])
            except argparse.ArgumentTypeError:
                raise argparse.ArgumentTypeError(f"expected buckets:N with N a whole number >= 1, got {text!r}")
        return text
    return size_list(text)


def _add_export(sub) -> None:
    p = sub.add_parser("export", help="export a model file to a verified AOTInductor .pt2 package",
                       description="Run the model eagerly, torch.export it, compile it with AOTInductor, write "
                                   "a .pt2 package with a manifest and samples, and check it against eager.")
    p.add_argument("model", metavar="MODEL.py[:NAME]", help="model file; :NAME picks the function NAME() "
                   "instead of model()")
    p.add_argument("-o", "--output", metavar="OUT.pt2", help="package path (default .cache/pkgs/<name>.pt2)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
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
    p.add_argument("--example-batch", type=positive_int, metavar="N",
                   help="trace and tune at batch N: example inputs from the file's make_inputs(N), else its "
                        "example rows repeated (Inductor picks kernel launch configs for the example's sizes)")
    p.add_argument("--max-autotune", action="store_true", help="let Inductor benchmark kernel choices (slow)")
    p.add_argument("--freezing", choices=("on", "off"), help="fold the weights into the graph as constants "
                   "(default: on for cpu, off for cuda, as measured in docs/benchmarks.md)")
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
    p.add_argument("--embedding-bag", choices=EMBEDDING_BAG_CHOICES, default="auto",
                   help="how nn.EmbeddingBag is lowered (auto: measure and pick)")
    p.set_defaults(target="aotc.pipeline:main")


def _add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="print a package's manifest and whether this machine can run it")
    p.add_argument("package", metavar="PKG.pt2")
    p.set_defaults(target="aotc.inspect_pkg:main")


def _add_check(sub) -> None:
    p = sub.add_parser("check", help="check a package (or a server) against the eager model",
                       description="aotc check PKG.pt2 --model MODEL.py[:NAME]   |   "
                                   "aotc check --url URL --model NAME MODEL.py[:NAME]")
    p.add_argument("paths", nargs="*", metavar="PKG.pt2 | MODEL.py[:NAME]")
    p.add_argument("--model", required=True, help="with a package: the model file; with --url: the model "
                   "name on the server")
    p.add_argument("--url", help="a server speaking the Open Inference Protocol, e.g. http://127.0.0.1:8000")
    p.add_argument("--json", action="store_true", help="with --url: send JSON tensors instead of binary")
    p.add_argument("--atol", type=float, help="with --url: absolute tolerance (default: the model file's)")
    p.add_argument("--rtol", type=float, help="with --url: relative tolerance (default: the model file's)")
    p.set_defaults(target=None)


def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help="serve a model repository (C++ aotc-server, or --python for FastAPI)")
    p.add_argument("repository", nargs="?", metavar="DIR", help="model repository: DIR/<model>/<version>/model.pt2")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--api-key", help="require this key (header Authorization: Bearer KEY)")
    p.add_argument("--poll-repository", type=int, metavar="SECS", help="rescan DIR every SECS seconds")
    p.add_argument("--log-requests", action="store_true")
    p.add_argument("--python", action="store_true", help="serve with the FastAPI baseline instead of C++")
    p.add_argument("--eager", metavar="MODEL.py[:NAME]", help="with --python: serve the eager model file")
    p.add_argument("--name", help="with --eager: the model name to serve it under")
    p.add_argument("--max-body-bytes", type=int, help="refuse larger request bodies with 413 (default 64 MiB)")
    p.add_argument("--intra-op-threads", type=int, metavar="N", help="C++ server: threads per CPU model call")
    p.add_argument("--device-index", type=int, metavar="N", help="C++ server: GPU for CUDA packages")
    p.add_argument("--no-cuda-graphs", action="store_true", help="C++ server: run CUDA packages without graphs")
    p.add_argument("--allow-shared-memory", action="store_true",
                   help="let same-host clients pass tensors in POSIX shared memory (Triton's extension)")
    p.add_argument("--busy-poll-us", type=int, metavar="N",
                   help="C++ server: spin up to N us for a connection's next request before sleeping")
    p.set_defaults(target=None)


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="measure a server: latency and throughput per concurrency")
    p.add_argument("--url", help="the server to measure (or list several with --compare)")
    p.add_argument("--model", required=True)
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts")
    p.add_argument("--duration", type=float, default=10.0, metavar="S", help="seconds per concurrency level")
    enc = p.add_mutually_exclusive_group()
    enc.add_argument("--binary", dest="encoding", action="store_const", const="binary")
    enc.add_argument("--json", dest="encoding", action="store_const", const="json")
    p.set_defaults(encoding="binary")
    p.add_argument("--plot", metavar="OUT.png")
    p.add_argument("--compare", nargs="+", metavar="URL", default=[], help="other servers to measure the same way")
    p.add_argument("--batch", type=int, default=1, help="rows per request for a dynamic batch dim")
    p.add_argument("--allow-remote", action="store_true", help="allow a server that is not on loopback")
    p.set_defaults(target="aotc_client.bench:main")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aotc", description="Export PyTorch model files to verified "
                                     "AOTInductor packages and serve them over the Open Inference Protocol.")
    parser.add_argument("--verbose", "-v", action="store_true", help="show tracebacks and library logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in (_add_export, _add_inspect, _add_check, _add_serve, _add_bench):
        add(sub)
    return parser


def _target(args, parser) -> str:
    if args.command == "check":
        if args.url:
            if len(args.paths) != 1:
                parser.error("check --url URL --model NAME takes one MODEL.py[:NAME]")
            return "aotc.check_server:check_server"
        if len(args.paths) != 2 and len(args.paths) != 1:
            parser.error("check takes PKG.pt2 --model MODEL.py[:NAME]")
        args.package = args.paths[0]
        return "aotc.check:check_package"
    if args.command == "serve":
        if args.python:
            if not args.repository and not args.eager:
                parser.error("serve --python needs DIR or --eager MODEL.py --name NAME")
            return "aotc.serve_python:main"
        if not args.repository:
            parser.error("serve needs a model repository DIR")
        return "aotc.serve:serve"
    return args.target


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # --verbose is accepted anywhere on the line, as users type it after the subcommand
    verbose = any(a in ("--verbose", "-v") for a in argv)
    argv = [a for a in argv if a not in ("--verbose", "-v")]
    parser = build_parser()
    args = parser.parse_args(argv)
    args.verbose = verbose
    module_name, func_name = _target(args, parser).split(":")
    from aotc_client.errors import AotcError

    if not verbose:
        _quiet_libraries()
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        rc = func(args)
    except AotcError as e:
        if verbose:
            raise
        print(f"aotc: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("aotc: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


def _quiet_libraries() -> None:
    """torch's warnings are for torch developers; keep them out of the user's terminal."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("torch").setLevel(logging.ERROR)


if __name__ == "__main__":
    sys.exit(main())
