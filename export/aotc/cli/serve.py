"""`aotc serve`: the C++ aotc-server on a model repository, or with --python the FastAPI baseline.

`aotc serve REPO [FLAGS...]` owns only REPO (and --python): every other flag goes to aotc-server as given,
so aotc-server's options.cpp is the one owner of its flags, and `aotc serve --help` shows its own help.
`aotc serve --python (REPO | --eager MODEL.py [--name NAME]) [FLAGS...]` parses the FastAPI server's flags
here (its one parser).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

USAGE = ("usage: aotc serve REPO [aotc-server flags...]          serve REPO with the C++ aotc-server\n"
         "       aotc serve --python (REPO | --eager MODEL.py) [flags]  the FastAPI baseline (--python --help)\n"
         "REPO: a model repository, DIR/<model>/<version>/model.pt2. aotc-server's flags, from its --help:\n\n")


def add_parser(sub) -> None:
    """For `aotc --help`'s list of commands; `aotc serve ...` lines are parsed by main()."""
    sub.add_parser("serve", add_help=False, help="serve a model repository (C++ aotc-server, or --python for "
                   "FastAPI); every flag but REPO goes to aotc-server (aotc serve --help)")


def main(argv: list[str]) -> int:
    if "--python" in argv:
        args = _python_parser().parse_args([a for a in argv if a != "--python"])
        from aotc.serve_python import serve_python

        return serve_python(repository=args.repository, eager=args.eager, name=args.name, host=args.host,
                            http_port=args.http_port, max_body_bytes=args.max_body_bytes, api_key=args.api_key,
                            allow_shared_memory=args.allow_shared_memory)
    from aotc import serve

    if any(a in ("--help", "-h") for a in argv):
        help_text = subprocess.run([serve.installed_binary("aotc-server"), "--help"], capture_output=True, text=True).stdout
        sys.stdout.write(USAGE + help_text)
        return 0
    return serve.exec_server(serve.server_argv(argv))


def _python_parser() -> argparse.ArgumentParser:
    from aotc.serve_python import DEFAULT_BODY_LIMIT

    p = argparse.ArgumentParser(prog="aotc serve --python", description="The FastAPI + uvicorn baseline server: "
                                "a repository through PyTorch's Python AOTI loader, or one model file eagerly.")
    p.add_argument("repository", nargs="?", metavar="REPO", help="model repository DIR/<model>/<version>/model.pt2")
    p.add_argument("--eager", metavar="MODEL.py[:NAME]", help="serve this model file eagerly instead of a repository")
    p.add_argument("--name", help="with --eager: the model name (default: the file's name)")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_BODY_LIMIT,
                   help="refuse larger request bodies with 413 (default %(default)s)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on everything but health")
    p.add_argument("--allow-shared-memory", action="store_true",
                   help="let same-host clients pass tensors in POSIX shared memory (Triton's extension)")
    return p
