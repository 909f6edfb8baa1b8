"""`aotc inspect PKG.pt2`: the parser; inspect_pkg.describe does the work."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="print a package's manifest and whether this machine can run it")
    p.add_argument("package", metavar="PKG.pt2")


def run(args) -> int:
    from aotc.inspect_pkg import describe

    print(describe(args.package))
    return 0
