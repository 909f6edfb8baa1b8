"""`aotc inspect PKG.pt2 [--json]`: the parser; inspect_pkg.describe does the work."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="summarize a package's manifest and whether this machine can run it")
    p.add_argument("package", metavar="PKG.pt2")
    p.add_argument("--json", action="store_true", help="print the raw manifest as JSON instead of the summary")


def run(args) -> int:
    from aotc.inspect_pkg import describe

    print(describe(args.package, raw=args.json))
    return 0
