"""`aotc check`: the parser of both forms, a package against its model file (check.py) or a running server
against it (check_server.py). In both, the model file is the positional MODEL.py (or --model MODEL.py);
the model's name on a server is --name."""

from __future__ import annotations

USAGE = ("aotc check PKG.pt2 MODEL.py[:NAME]   |   aotc check --url URL MODEL.py[:NAME] [--name MODEL_NAME]\n"
         "(--model MODEL.py[:NAME] may stand for the positional MODEL.py in either form)")


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="check a package (or a server) against the eager model", description=USAGE)
    p.add_argument("paths", nargs="*", metavar="PKG.pt2 MODEL.py[:NAME]",
                   help="the package and its model file; with --url, the model file alone")
    p.add_argument("--model", metavar="MODEL.py[:NAME]", help="the model file (instead of the positional one)")
    p.add_argument("--allow-trivial-outputs", action="store_true",
                   help="exit 0 when parity is inconclusive (an output near zero or constant in every case)")
    url = p.add_argument_group("with --url")
    url.add_argument("--url", help="a server speaking the Open Inference Protocol, e.g. http://127.0.0.1:8000")
    url.add_argument("--name", metavar="MODEL_NAME", help="the model's name on the server (default: the model "
                     "file's name, as aotc export names it)")
    url.add_argument("--model-version", default="", help="the model version (default: the server's choice)")
    url.add_argument("--json", action="store_true", help="send JSON tensors instead of binary")
    url.add_argument("--atol", type=float, help="absolute tolerance (default: the model file's, else by dtype)")
    url.add_argument("--rtol", type=float, help="relative tolerance (default: the model file's, else by dtype)")
    url.add_argument("--seed", type=int, default=0, help="seed of the random fresh inputs (default 0)")
    url.add_argument("--timeout", type=float, default=60.0, help="seconds per request (default 60)")
    p.set_defaults(parser=p)


def _model_file(args, positional: list[str], form: str) -> str:
    if args.model and not args.model.split(":")[0].endswith(".py"):
        args.parser.error(f"--model {args.model}: --model names the model file (MODEL.py[:NAME]); give the "
                          f"model's name on the server with --name {args.model}")
    files = positional + ([args.model] if args.model else [])
    if len(files) != 1:
        args.parser.error(f"{form} takes one model file MODEL.py[:NAME] (positional or --model), got "
                          f"{len(files)}: {' '.join(files) or 'none'}")
    return files[0]


def run(args) -> int:
    if args.url:
        model_file = _model_file(args, args.paths, "check --url URL MODEL.py")
        from aotc.check_server import check_server

        check_server(args.url, args.name, model_file, version=args.model_version, binary=not args.json,
                     atol=args.atol, rtol=args.rtol, seed=args.seed, timeout=args.timeout,
                     allow_trivial=args.allow_trivial_outputs)
        return 0
    if args.name:
        args.parser.error("--name is the model's name on a server: it goes with --url")
    if not args.paths or not args.paths[0].endswith(".pt2"):
        args.parser.error(f"check takes PKG.pt2 MODEL.py[:NAME] (or --url URL MODEL.py), got "
                          f"{' '.join(args.paths) or 'nothing'}")
    model_file = _model_file(args, args.paths[1:], "check PKG.pt2 MODEL.py")
    from aotc.check import check_package

    return check_package(args.paths[0], model_file, allow_trivial=args.allow_trivial_outputs)
