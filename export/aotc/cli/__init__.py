"""The `aotc` command line. Each subcommand is one module of this package that owns its parser
(`add_parser(subparsers)`) and turns the parsed line into a call of the stage module that does the work
(`run(args) -> exit code`); stage modules never see argparse. Stage modules are imported on demand, so
`aotc --help` never imports torch.

`aotc serve` is the exception to parsing: it owns only REPO and `--python` and passes every other flag
straight to aotc-server, whose options.cpp owns them (cli/serve.py).

Errors: every AotcError is caught here once and printed as one line `aotc: error: <message>` (the
traceback only with --verbose); the exit code is the error's `exit_code`. Output cut short by a closed
pipe (`aotc inspect PKG | head`) ends quietly. Single-threaded.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS = ("export", "inspect", "check", "serve", "bench", "bundle", "tune")  # aotc.cli.<command>


def _command(name: str):
    return importlib.import_module(f"aotc.cli.{name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aotc", description="Export PyTorch model files to verified "
                                     "AOTInductor packages and serve them over the Open Inference Protocol.")
    parser.add_argument("--verbose", "-v", action="store_true", help="show tracebacks and library logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        _command(name).add_parser(sub)
    for name, p in sub.choices.items():  # main() takes --verbose anywhere; each command's --help says so
        if name not in ("serve", "export") and p.add_help:
            p.add_argument("--verbose", "-v", action="store_true", help="show tracebacks and library logs")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # --verbose is accepted anywhere on the line, as users type it after the subcommand
    verbose = any(a in ("--verbose", "-v") for a in argv)
    argv = [a for a in argv if a not in ("--verbose", "-v")]
    from aotc_client.errors import AotcError

    if not verbose:
        _quiet_libraries()
    try:
        if argv and argv[0] == "serve":  # its flags are aotc-server's: it parses its own line
            return int(_command("serve").main(argv[1:]) or 0)
        args = build_parser().parse_args(argv)
        args.verbose = verbose
        return int(_command(args.command).run(args) or 0)
    except AotcError as e:
        if verbose:
            raise
        print(f"aotc: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("aotc: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): what it wanted was written. Point stdout at /dev/null so the
        # interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _quiet_libraries() -> None:
    """torch's warnings are for torch developers; keep them out of the user's terminal."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("torch").setLevel(logging.ERROR)
