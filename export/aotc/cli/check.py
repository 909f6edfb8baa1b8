"""`aotc check`: the parser of both forms, a package against its model file (check.py) or a running server
against it (check_server.py)."""

from __future__ import annotations

USAGE = "aotc check PKG.pt2 --model MODEL.py[:NAME]   |   aotc check --url URL --model NAME MODEL.py[:NAME]"


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="check a package (or a server) against the eager model", description=USAGE)
    p.add_argument("paths", nargs="+", metavar="PKG.pt2 | MODEL.py[:NAME]")
    p.add_argument("--model", required=True, help="with a package: the model file; with --url: the model "
                   "name on the server")
    url = p.add_argument_group("with --url")
    url.add_argument("--url", help="a server speaking the Open Inference Protocol, e.g. http://127.0.0.1:8000")
    url.add_argument("--model-version", default="", help="the model version (default: the server's choice)")
    url.add_argument("--json", action="store_true", help="send JSON tensors instead of binary")
    url.add_argument("--atol", type=float, help="absolute tolerance (default: the model file's, else by dtype)")
    url.add_argument("--rtol", type=float, help="relative tolerance (default: the model file's, else by dtype)")
    url.add_argument("--seed", type=int, default=0, help="seed of the random fresh inputs (default 0)")
    url.add_argument("--timeout", type=float, default=60.0, help="seconds per request (default 60)")
    p.set_defaults(parser=p)


def run(args) -> int:
    if args.url:
        if len(args.paths) != 1:
            args.parser.error("check --url URL --model NAME takes one MODEL.py[:NAME]")
        from aotc.check_server import check_server

        check_server(args.url, args.model, args.paths[0], version=args.model_version, binary=not args.json,
                     atol=args.atol, rtol=args.rtol, seed=args.seed, timeout=args.timeout)
        return 0
    if len(args.paths) != 1:
        args.parser.error("check takes PKG.pt2 --model MODEL.py[:NAME]")
    from aotc.check import check_package

    return check_package(args.paths[0], args.model)
