"""Start aotc's servers as black boxes, for the tests and the benchmarks alike (the pattern of llama.cpp's
tests/utils.py); find aotc's binaries; lay out model repositories.

`Server(kind, repository, *flags)` starts the real process on a free port:
  "cpp"           aotc-server --model-repository REPOSITORY
  "cli"           `aotc serve REPOSITORY`, which execs the installed aotc-server with the same flags
  "python"        `aotc serve --python REPOSITORY`, the FastAPI baseline
  "python-eager"  `aotc serve --python --eager MODEL_FILE` (REPOSITORY is a model file, run eagerly)
or, with `command=lambda port: argv`, any other server that speaks the protocol (`kind` is then its label).
The C++ kinds ("cpp", "cli") also serve gRPC: the launcher picks a second free port and passes `--grpc-port
PORT` unless the flags already hold `--grpc-port` (0: any port; -1: none); `grpc_port` and `grpc_url`
("127.0.0.1:PORT", for tritonclient.grpc) say where, as the server's log line `listening on grpc://H:P` has
it. They are None for -1, for a build without gRPC (AOTC_GRPC=OFF, whose log says so), for the Python kinds
and for `command=` servers.
It waits for `ready_path` (/v2/health/ready), fails fast with the server's log if the process dies first,
puts a timeout on every request and stops the process on `stop()` or context exit. The server's output goes
to a log file (no pipe to fill up); `log()` reads it.

Not a client library: `request()` speaks plain HTTP (http.client), so tests see exactly what went over the
wire; gRPC tests bring their own client (tritonclient.grpc) to `grpc_url`. Not a package either: the tests
get bench/ on sys.path from pytest's `pythonpath` (pyproject.toml), a benchmark run as `python bench/x.py`
has it already. bench/loadgen.py drives aotc-load and aotc-run --bench.

Concurrency: one Server may be shared by threads; `request()` opens a connection per call unless a `conn`
is passed. Starting and stopping are for one thread.
"""

from __future__ import annotations

import atexit
import gzip
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
KINDS = ("cpp", "cli", "python", "python-eager")
GRPC_KINDS = ("cpp", "cli")  # aotc-server, directly or through `aotc serve`


class LaunchError(RuntimeError):
    """A binary that is not there, or a server that died or never got ready (the message carries its log)."""


def find_binary(name: str, env: str | None = None) -> Path:
    """$env when set (a build of your own), else `name` next to this Python or in .venv/bin (where `make build`
    installs aotc-run, aotc-server and aotc-load), else on PATH, else anywhere in a local CMake build (build/*/)."""
    if env and os.environ.get(env):
        return Path(os.environ[env])
    for c in (Path(sys.executable).parent / name, VENV_BIN / name):
        if c.is_file() and os.access(c, os.X_OK):
            return c
    if shutil.which(name):
        return Path(shutil.which(name))
    for c in sorted(REPO.glob(f"build/*/**/{name}")):
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise LaunchError(f"{name} not found (next to {sys.executable}, .venv/bin, PATH, build/); build it with "
                      f"`make build`{f' or set {env}' if env else ''}")


def server_binary() -> Path:
    """aotc-server: $AOTC_SERVER_BIN, else as find_binary looks."""
    return find_binary("aotc-server", "AOTC_SERVER_BIN")


def free_port(*taken: int) -> int:
    """A port nothing listens on now, none of `taken`."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken:
            return port


def flag_value(flags: tuple[str, ...] | list[str], name: str) -> str | None:
    """The value of `name` in a command line (`--name V` or `--name=V`; the last one wins), else None."""
    value = None
    for i, f in enumerate(flags):
        if f == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif f.startswith(name + "="):
            value = f[len(name) + 1:]
    return value


def make_repository(root: Path, models: dict, configs: dict | None = None, *, link: bool = False) -> Path:
    """models: {name: package path, or {version: package path}} -> root/<name>/<version>/model.pt2, copies, or
    with `link` symlinks (for packages of hundreds of MB that nothing rewrites); configs: {name: config.json
    object}. Returns root."""
    root.mkdir(parents=True, exist_ok=True)
    for name, spec in models.items():
        versions = spec if isinstance(spec, dict) else {1: spec}
        for version, pkg in versions.items():
            dest = root / name / str(version)
            dest.mkdir(parents=True, exist_ok=True)
            if link:
                os.symlink(Path(pkg).resolve(), dest / "model.pt2")
            else:
                shutil.copyfile(pkg, dest / "model.pt2")
    for name, cfg in (configs or {}).items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "config.json").write_text(json.dumps(cfg))
    return root


def _aotc_cli() -> Path:
    try:
        return find_binary("aotc")
    except LaunchError:
        return Path("aotc")


def server_argv(kind: str, repository: Path | str, port: int, *flags: str) -> list[str]:
    """The command line of a server of `kind` (see the module docstring) on `port`."""
    if kind == "cpp":
        return [str(server_binary()), "--model-repository", str(repository), "--http-port", str(port), *flags]
    if kind in ("python", "python-eager"):
        source = [str(repository)] if kind == "python" else ["--eager", str(repository)]
        return [str(_aotc_cli()), "serve", "--python", *source, "--http-port", str(port), *flags]
    if kind == "cli":
        return [str(_aotc_cli()), "serve", str(repository), "--http-port", str(port), *flags]
    raise ValueError(f"server kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")


class Server:
    def __init__(self, kind: str, repository: Path | str | None = None, *flags: str, ready_timeout: float = 180.0,
                 request_timeout: float = 60.0, ready_path: str = "/v2/health/ready", env: dict | None = None,
                 log_path: Path | None = None, command: Callable[[int], list[str]] | None = None):
        """env: the server's whole environment (None: this process's); log_path: where its output goes (None:
        a temporary file, removed when this process exits unless AOTC_KEEP_SERVER_LOGS=1). `ready_s`: seconds
        from the start of the process to ready."""
        self.kind = kind
        self.host = "127.0.0.1"
        self.port = free_port()
        self.url = f"http://{self.host}:{self.port}"
        self.request_timeout = request_timeout
        self.grpc_port: int | None = None
        grpc_given = None
        if command is None and kind in GRPC_KINDS:
            grpc_given = flag_value(flags, "--grpc-port")
            if grpc_given is None:
                self.grpc_port = free_port(self.port)
                flags = (*flags, "--grpc-port", str(self.grpc_port))
            elif grpc_given.lstrip("-").isdigit() and int(grpc_given) > 0:
                self.grpc_port = int(grpc_given)
        argv = command(self.port) if command else server_argv(kind, repository, self.port, *flags)
        if log_path is None:
            with tempfile.NamedTemporaryFile(prefix=f"aotc-{kind}-server-", suffix=".log", delete=False) as f:
                log_path = Path(f.name)
            if os.environ.get("AOTC_KEEP_SERVER_LOGS") != "1":
                atexit.register(log_path.unlink, missing_ok=True)
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "wb")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                self._log.close()
                raise LaunchError(f"{argv[0]} exited {self.proc.returncode} before ready:\n{self.log()[-4000:]}")
            try:
                if self.request("GET", ready_path, timeout=2)[0] == 200:
                    self.ready_s = time.perf_counter() - t0
                    if self.grpc_port is not None or grpc_given == "0":
                        self.grpc_port = self._logged_grpc_port(deadline)
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise LaunchError(f"{kind} server not ready after {ready_timeout:g} s:\n{self.log()[-4000:]}")
            time.sleep(0.02)

    @property
    def grpc_url(self) -> str | None:
        """host:port of the gRPC endpoint (tritonclient.grpc's form), None without one."""
        return None if self.grpc_port is None else f"{self.host}:{self.grpc_port}"

    def _logged_grpc_port(self, deadline: float) -> int | None:
        """The port of the log's `listening on grpc://HOST:PORT` (what --grpc-port 0 picked), or None where the
        server says it has no gRPC endpoint (a build with AOTC_GRPC=OFF takes the flag and says so)."""
        while True:
            log = self.log()
            m = re.search(r"listening on grpc://\S+:(\d+)", log)
            if m:
                return int(m.group(1))
            if "no gRPC endpoint" in log:
                return None
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise LaunchError(f"no 'listening on grpc://' in the log:\n{self.log()[-4000:]}")
            time.sleep(0.02)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def connect(self, timeout: float | None = None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.request_timeout)

    def request(self, method: str, path: str, body: bytes | str | None = None, headers: dict | None = None,
                timeout: float | None = None, conn: http.client.HTTPConnection | None = None):
        """-> (status, headers as a lower-case dict, body bytes, decompressed). Never raises on an HTTP status."""
        own = conn is None
        conn = conn or self.connect(timeout)
        try:
            if isinstance(body, str):
                body = body.encode()
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            data = r.read()
            hdrs = {k.lower(): v for k, v in r.getheaders()}
            if hdrs.get("content-encoding") == "gzip":
                data = gzip.decompress(data)
            elif hdrs.get("content-encoding") == "deflate":
                data = zlib.decompress(data)
            return r.status, hdrs, data
        finally:
            if own:
                conn.close()

    def json(self, method: str, path: str, obj=None, headers: dict | None = None, **kw):
        """-> (status, parsed JSON body)."""
        body = None if obj is None else json.dumps(obj)
        h = {"Content-Type": "application/json", **(headers or {})}
        status, _, data = self.request(method, path, body, h, **kw)
        return status, json.loads(data) if data else None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signals the server and waits for it to exit; returns its exit code (kills it after `timeout`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
