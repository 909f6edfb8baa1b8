"""`aotc serve REPO [FLAGS...]`: replace this process with the C++ `aotc-server` installed next to the Python
interpreter.

Not a server itself (that is runtime_cpp/server, or serve_python.py for `--python`) and no parser of
aotc-server's flags (runtime_cpp/server/options.cpp owns them): it finds the executable, puts REPO in
front as --model-repository and execs it, so flags, signals and the exit code are the server's own.
"""

from __future__ import annotations

import os
import shutil
import sys

from aotc.errors import AotcError


def installed_binary(name: str) -> str:
    """One of aotc's executables (aotc-server, aotc-run) next to sys.executable (the venv's bin/), else on PATH."""
    candidate = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which(name)
    if found:
        return found
    raise AotcError(f"{name} not found next to {sys.executable} or on PATH; build it with `make build`")



def server_argv(argv: list[str]) -> list[str]:
    """`REPO [FLAGS...]` -> aotc-server's argv: `--model-repository REPO FLAGS...`. A line that already names
    --model-repository goes as it is. Raises AotcError when REPO is missing or not a directory."""
    if any(a == "--model-repository" or a.startswith("--model-repository=") for a in argv):
        return [installed_binary("aotc-server"), *argv]
    if not argv or argv[0].startswith("-"):
        raise AotcError("aotc serve needs a model repository first: aotc serve REPO [aotc-server flags...] "
                        "(aotc serve --help lists the flags)")
    repository, flags = argv[0], argv[1:]
    if not os.path.isdir(repository):
        raise AotcError(f"model repository '{repository}' is not a directory; expected DIR/<model>/<version>/"
                        f"model.pt2")
    return [installed_binary("aotc-server"), "--model-repository", repository, *flags]


def exec_server(argv: list[str]) -> int:
    """Replaces this process with `argv` (never returns)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
    return 0  # not reached
