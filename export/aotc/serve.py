"""`aotc serve DIR`: replace this process with the C++ `aotc-server` installed next to the Python interpreter.

Not a server itself (that is runtime_cpp/server, or serve_python.py for `--python`): it only finds the
executable, translates the flags and execs it, so signals and the exit code are the server's own.
"""

from __future__ import annotations

import os
import shutil
import sys

from aotc.errors import AotcError


def server_executable() -> str:
    """aotc-server next to sys.executable (the venv's bin/), else on PATH."""
    candidate = os.path.join(os.path.dirname(sys.executable), "aotc-server")
    if os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("aotc-server")
    if found:
        return found
    raise AotcError(f"aotc-server not found next to {sys.executable} or on PATH; build it with `make build` "
                    f"(or serve with `aotc serve --python DIR`)")


def server_argv(args) -> list[str]:
    argv = [server_executable(), "--model-repository", args.repository, "--http-port", str(args.http_port),
            "--host", args.host]
    if args.api_key:
        argv += ["--api-key", args.api_key]
    if args.poll_repository is not None:
        argv += ["--poll-repository", str(args.poll_repository)]
    if args.log_requests:
        argv.append("--log-requests")
    if getattr(args, "max_body_bytes", None):
        argv += ["--max-body-bytes", str(args.max_body_bytes)]
    if getattr(args, "intra_op_threads", None) is not None:
        argv += ["--intra-op-threads", str(args.intra_op_threads)]
    if getattr(args, "device_index", None) is not None:
        argv += ["--device-index", str(args.device_index)]
    if getattr(args, "no_cuda_graphs", False):
        argv.append("--no-cuda-graphs")
    if getattr(args, "allow_shared_memory", False):
        argv.append("--allow-shared-memory")
    if getattr(args, "busy_poll_us", None) is not None:
        argv += ["--busy-poll-us", str(args.busy_poll_us)]
    return argv


def serve(args) -> int:
    if not os.path.isdir(args.repository):
        raise AotcError(f"model repository '{args.repository}' is not a directory; expected DIR/<model>/<version>/"
                        f"model.pt2")
    argv = server_argv(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
    return 0  # not reached
