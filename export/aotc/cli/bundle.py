"""`aotc bundle REPO -o DIR`: the parser; bundle.py does the work."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("bundle", help="a repository and aotc-server as one directory that runs without Python",
                       description="Copy aotc-server, aotc-run, the torch libraries they load and the repository "
                                   "into DIR, which runs on a machine with no Python and no torch (DIR/serve).")
    p.add_argument("repository", metavar="REPO", help="model repository DIR/<model>/<version>/model.pt2")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the bundle's directory (new, empty, "
                   "or an earlier bundle, which is replaced)")
    p.add_argument("--tar", action="store_true", help="also write DIR.tar")
    p.add_argument("--containerfile", action="store_true", help="also write DIR/Containerfile (Debian 12 slim, "
                   "user 1000, readiness HEALTHCHECK, serve as entrypoint)")
    p.add_argument("--no-strip", dest="strip", action="store_false",
                   help="keep the libraries' symbol tables (strip --strip-unneeded by default)")


def run(args) -> int:
    from aotc.bundle import bundle

    info = bundle(args.repository, args.output, tar=args.tar, write_containerfile=args.containerfile,
                  strip=args.strip)
    libs = sum(lib["bytes"] for lib in info["libraries"])
    print(f"{args.output}: {len(info['models'])} model version(s), {info['total_bytes'] / 1e6:.1f} MB "
          f"(libraries {libs / 1e6:.1f} MB); needs {', '.join(info['requires_debian_packages']) or 'nothing'}"
          + (f" and the NVIDIA driver ({', '.join(info['requires_driver'])})" if info["requires_driver"] else ""))
    return 0
