"""Launch aotc servers as black boxes for tests and benchmarks (the pattern of llama.cpp's tests/utils.py).

`Server(kind, repository, *flags)` starts the real process ("cpp": aotc-server; "cli": `aotc serve`, which
execs the installed aotc-server; "python": `aotc serve --python`) on a free port, waits for /v2/health/ready, fails fast with the server's log if the process dies,
puts a timeout on every request and stops the process on `stop()` / context exit. Not a client library: it
speaks plain HTTP (http.client) so tests see exactly what went over the wire.

Concurrency: one Server object may be shared by threads; `request()` opens a connection per call unless a
`conn` is passed. The server's output goes to a log file (no pipe to fill up).
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"


def server_binary() -> Path:
    """AOTC_SERVER_BIN, else .venv/bin/aotc-server, else a local CMake build (build/py, build/server)."""
    env = os.environ.get("AOTC_SERVER_BIN")
    if env:
        return Path(env)
    candidates = [VENV_BIN / "aotc-server"]
    candidates += sorted(REPO.glob("build/py/**/aotc-server")) + sorted(REPO.glob("build/server/**/aotc-server"))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError("aotc-server not found (.venv/bin, build/py, build/server); build it with `make build` "
                            "or set AOTC_SERVER_BIN")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_repository(root: Path, models: dict, configs: dict | None = None) -> Path:
    """models: {name: package path, or {version: package path}} -> root/<name>/<version>/model.pt2 (copies)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, spec in models.items():
        versions = spec if isinstance(spec, dict) else {1: spec}
        for version, pkg in versions.items():
            dest = root / name / str(version)
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(pkg, dest / "model.pt2")
    for name, cfg in (configs or {}).items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "config.json").write_text(json.dumps(cfg))
    return root


class Server:
    def __init__(self, kind: str, repository: Path | str, *flags: str, ready_timeout: float = 180.0,
                 request_timeout: float = 60.0):
        self.kind = kind
        self.host = "127.0.0.1"
        self.port = free_port()
        self.url = f"http://{self.host}:{self.port}"
        self.request_timeout = request_timeout
        if kind == "cpp":
            argv = [str(server_binary()), "--model-repository", str(repository), "--http-port", str(self.port), *flags]
        elif kind in ("python", "python-eager"):  # python-eager: `repository` is a model file, run eagerly
            aotc = VENV_BIN / "aotc" if (VENV_BIN / "aotc").exists() else Path(shutil.which("aotc") or "aotc")
            source = [str(repository)] if kind == "python" else ["--eager", str(repository)]
            argv = [str(aotc), "serve", "--python", *source, "--http-port", str(self.port), *flags]
        elif kind == "cli":  # `aotc serve DIR`, which execs the installed aotc-server with the same flags
            aotc = VENV_BIN / "aotc" if (VENV_BIN / "aotc").exists() else Path(shutil.which("aotc") or "aotc")
            argv = [str(aotc), "serve", str(repository), "--http-port", str(self.port), *flags]
        else:
            raise ValueError(f"server kind must be 'cpp', 'cli', 'python' or 'python-eager', got {kind!r}")
        self._log = tempfile.NamedTemporaryFile(prefix=f"aotc-{kind}-server-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"{argv[0]} exited {self.proc.returncode} before ready:\n{self.log()}")
            try:
                if self.request("GET", "/v2/health/ready", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"{kind} server not ready after {ready_timeout:g} s:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

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
                import zlib
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
