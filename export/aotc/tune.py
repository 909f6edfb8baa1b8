"""`aotc tune MODEL.py --p99-ms B --concurrency C`: the serving configuration with the highest throughput whose
p99 latency stays under B, over export variants and serving knobs, measured on aotc-server itself.

Each export variant (default, max-autotune, freezing flipped, static batch graphs, and sequence buckets when
asked) comes from `aotc export` and its cache; a variant that fails to export or fails parity is dropped with
its reason. Each candidate (a variant with one set of knobs: max_batch_size, max_queue_delay_us, runners,
intra-op threads on CPU, CUDA graphs on CUDA) is a model entry of a repository that a real aotc-server serves,
loaded by `aotc-load` with the package's stored sample cut to --request-batch rows, after a warm-up that is
not counted. The search is successive halving: every candidate is measured briefly, the best third is
measured again for twice as long, and so on while the time budget lasts; the default configuration is
measured in every round for comparison. It writes, under -o: the winner as a repository entry (its package
and config.json), tune.md (the table, the winner, the command that serves it), tune.json and tune_pareto.svg
(throughput against p99, with the budget). Not a benchmark of other servers. One tune per process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings

from aotc.errors import AotcError
from aotc.tune_report import add_served, score, write_outputs


@dataclasses.dataclass(frozen=True)
class Candidate:
    variant: str
    max_batch_size: int | None = None  # None: the server's default (no config.json)
    max_queue_delay_us: int = 0
    num_runners: int = 1
    threads: int | None = None          # aotc-server --intra-op-threads (CPU); None: torch's default
    cuda_graphs: bool = True            # CUDA only: off is aotc-server --no-cuda-graphs

    @property
    def label(self) -> str:
        if self.max_batch_size is None:
            return f"{self.variant} (server defaults)"
        parts = [self.variant, "unbatched" if self.max_batch_size == 0 else
                 f"batch<={self.max_batch_size} delay {self.max_queue_delay_us}us", f"{self.num_runners} runner(s)"]
        parts += [f"{self.threads} thread(s)"] if self.threads else []
        parts += [] if self.cuda_graphs else ["no CUDA graphs"]
        return ", ".join(parts)

    def config(self) -> dict | None:
        if self.max_batch_size is None:
            return None
        return {"max_batch_size": self.max_batch_size, "num_runners": self.num_runners,
                **({"max_queue_delay_us": self.max_queue_delay_us} if self.max_batch_size else {})}

    def server_flags(self) -> list[str]:
        return ([f"--intra-op-threads={self.threads}"] if self.threads else []) + \
            ([] if self.cuda_graphs else ["--no-cuda-graphs"])


def variants(device: str, seq_buckets: str | None, only: list[str] | None) -> dict[str, dict]:
    """Export variants by name -> the pipeline.ExportOptions fields they change."""
    out = {"default": {}, "max-autotune": {"max_autotune": True},
           "freezing-off" if device == "cpu" else "freezing-on": {"freezing": device != "cpu"},
           "static-batches" if device == "cpu" else "no-static-batches":
               {"static_batches": "buckets:32" if device == "cpu" else ()}}
    if seq_buckets:
        out["seq-buckets"] = {"seq_buckets": seq_buckets}
    if only:
        unknown = sorted(set(only) - set(out))
        if unknown:
            raise AotcError(f"--variants {','.join(unknown)}: not a variant here; the variants are {', '.join(out)}")
        out = {k: v for k, v in out.items() if k in only}
    return out


def knobs(device: str, batch_max: int | None, request_batch: int, cores: int) -> list[dict]:
    """Every set of serving knobs to try, for a package whose batch dim takes up to `batch_max` rows."""
    sizes = [0] + sorted({min(b, batch_max) for b in (8, 32, 64)} - {0}) if batch_max else [0]
    sizes = [b for b in sizes if b == 0 or b >= request_batch]
    threads = [None] if device == "cuda" else sorted({1, cores})
    graphs = [True, False] if device == "cuda" else [True]
    out = []
    for size, runners, thr, g in itertools.product(sizes, (1, 2), threads, graphs):
        for delay in ((0,) if size == 0 else (200, 2000)):
            out.append({"max_batch_size": size, "max_queue_delay_us": delay, "num_runners": runners, "threads": thr,
                        "cuda_graphs": g})
    return out


def export_variants(spec: str, device: str, names: dict[str, dict], dtype: str, pkg_dir: str, say) -> tuple[dict, dict]:
    """({variant: package path}, {variant: why it was dropped}); each through `aotc export`'s cache."""
    from aotc import pipeline

    pkgs, dropped = {}, {}
    for name, change in names.items():
        t0 = time.perf_counter()
        opts = dataclasses.replace(pipeline.ExportOptions(device=device, dtype=dtype, quiet=True,
                                                          out=os.path.join(pkg_dir, f"{name}.pt2")), **change)
        log = io.StringIO()
        try:
            # the summaries and torch's warnings go to the log: the line below says what matters
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pipeline.run_export(spec, opts)
            pkgs[name] = opts.out
            say(f"export {name}: ok in {time.perf_counter() - t0:.0f} s"
                + (" (cache hit)" if "cache hit" in log.getvalue() else ""))
        except AotcError as e:
            dropped[name] = str(e).splitlines()[0]
            say(f"export {name}: dropped: {dropped[name]}")
    return pkgs, dropped


def sample_body(pkg: str, rows: int, path: str) -> dict:
    """Writes the package's first stored sample (read from the archive, no code loaded), cut or repeated to
    `rows` rows, as one binary-tensor request; returns its headers."""
    import numpy as np

    from aotc import manifest as manifest_mod
    from aotc_client.dtypes import datatype_from_name

    m = manifest_mod.read(pkg)
    ins, _ = manifest_mod.read_samples(pkg, m)[0]
    arrays = [np.ascontiguousarray(np.resize(x, (rows, *x.shape[1:])) if m.batch else x) for x in ins]
    header = json.dumps({"inputs": [{"name": t.name, "shape": list(a.shape), "datatype": datatype_from_name(t.dtype),
                                     "parameters": {"binary_data_size": a.nbytes}}
                                    for t, a in zip(m.inputs, arrays)],
                         "parameters": {"binary_data_output": True}}).encode()
    with open(path, "wb") as f:
        f.write(header + b"".join(a.tobytes() for a in arrays))
    return {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}


class _Server:
    """aotc-server on a repository of candidates (each a model named c<index>), its flags the group's."""

    def __init__(self, root: str, entries: dict[str, tuple[str, dict | None]], flags: list[str]):
        from aotc.serve import installed_binary

        for name, (pkg, config) in entries.items():
            os.makedirs(os.path.join(root, name, "1"))
            os.symlink(os.path.abspath(pkg), os.path.join(root, name, "1", "model.pt2"))
            if config is not None:
                with open(os.path.join(root, name, "config.json"), "w") as f:
                    json.dump(config, f)
        self.port = _free_port()
        self.log = open(os.path.join(root, "server.log"), "w")
        self.proc = subprocess.Popen([installed_binary("aotc-server"), "--model-repository", root, "--http-port",
                                      str(self.port), "--grpc-port", "-1", *flags], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        try:
            _wait_ready(self.proc, self.port, "loading the candidates", os.path.join(root, "server.log"))
        except AotcError:
            self.stop()
            raise

    def stop(self) -> None:
        _stop(self.proc)
        self.log.close()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(proc: subprocess.Popen, port: int, doing: str, log_path: str) -> None:
    """Returns once the server on `port` answers ready; AotcError when `proc` exits first or 600 s pass."""
    import http.client

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AotcError(f"aotc-server exited {proc.returncode} while {doing}; its log: {log_path}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/v2/health/ready")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AotcError(f"aotc-server did not become ready within 600 s while {doing}; its log: {log_path}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def load(port: int, model: str, body: str, headers: dict, concurrency: int, seconds: float) -> dict:
    """aotc-load's closed-loop numbers for one model entry: {"req_per_s", "p50_ms", "p99_ms", "errors"}."""
    from aotc.serve import installed_binary

    argv = [installed_binary("aotc-load"), "--url", f"http://127.0.0.1:{port}/v2/models/{model}/infer", "--body",
            body, "--connections", str(concurrency), "--duration", f"{seconds:g}", "--warmup",
            f"{min(1.0, seconds / 2):g}", "--timeout", "60", *(a for k, v in headers.items()
                                                               for a in ("--header", f"{k}: {v}"))]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 180)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("AOTC_LOAD ")), None)
    if line is None:
        return {"req_per_s": 0.0, "p50_ms": math.inf, "p99_ms": math.inf, "errors": -1,
                "why": (r.stderr or r.stdout).strip()[-200:]}
    s = json.loads(line.split(" ", 1)[1])
    return {"req_per_s": s["req_per_s"], "p50_ms": s["p50_us"] / 1e3, "p99_ms": s["p99_us"] / 1e3,
            "errors": s["errors"]}


@dataclasses.dataclass
class TuneOptions:
    spec: str
    p99_ms: float
    concurrency: tuple[int, ...]
    device: str = "cpu"
    dtype: str = "fp32"
    request_batch: int = 1
    budget_min: float = 10.0
    out: str = "tuned"
    variants: list[str] | None = None
    seq_buckets: str | None = None
    first_seconds: float = 1.0  # the first round's measurement per candidate and concurrency


def tune(o: TuneOptions, say=print) -> int:
    """Runs the search and writes what it found under o.out. Returns 0 when a configuration met the budget,
    1 when none did (tune.md then says the best p99 reached and with what)."""
    start = time.monotonic()
    os.makedirs(o.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="aotc-tune-") as tmp:
        # the packages live here for the search (a next tune takes them from the export cache again)
        pkgs, dropped = export_variants(o.spec, o.device, variants(o.device, o.seq_buckets, o.variants), o.dtype,
                                        tmp, say)
        return _search(o, pkgs, dropped, tmp, say, start)


def _search(o: TuneOptions, pkgs: dict, dropped: dict, tmp: str, say, start: float) -> int:
    from aotc import manifest as manifest_mod

    deadline = time.monotonic() + o.budget_min * 60  # the budget is the search's: exports aside
    if not pkgs:
        raise AotcError(f"no export variant of {o.spec} exported: " + "; ".join(f"{k}: {v}" for k, v in dropped.items()))
    cores = os.cpu_count() or 1
    cands = [Candidate("default")] if "default" in pkgs else []
    for name, pkg in pkgs.items():
        m = manifest_mod.read(pkg)
        if m.batch is None and o.request_batch != 1:
            raise AotcError(f"--request-batch {o.request_batch}: the model has no batch dim, so a request is one call")
        if m.batch is not None and not m.batch.min <= o.request_batch <= m.batch.max:
            raise AotcError(f"--request-batch {o.request_batch} is outside the package's batch range "
                            f"[{m.batch.min}, {m.batch.max}]")
        cands += [Candidate(name, **k) for k in knobs(o.device, m.batch.max if m.batch else None, o.request_batch, cores)]
    bodies, results = {}, {}
    for name, pkg in pkgs.items():
        path = os.path.join(tmp, f"{name}.body")
        bodies[name] = (path, sample_body(pkg, o.request_batch, path))
    # the first round fits 40% of the budget, at no less than 0.3 s a measurement
    fit = 0.4 * o.budget_min * 60 / (len(cands) * len(o.concurrency)) - 1.1
    alive, seconds, rnd = list(cands), max(0.3, min(o.first_seconds, fit)), 0
    while alive:
        rnd += 1
        per_call = seconds + min(1.0, seconds / 2) + 0.6
        estimate = len(alive) * len(o.concurrency) * per_call
        if rnd > 1 and time.monotonic() + estimate > deadline:
            say(f"round {rnd}: {len(alive)} candidates would take ~{estimate:.0f} s, past the budget; stopping")
            break
        say(f"round {rnd}: {len(alive)} candidates x {len(o.concurrency)} concurrencies, {seconds:g} s each, "
            f"~{estimate / 60:.1f} min")
        _measure_round(alive, pkgs, bodies, o, seconds, tmp, rnd, results, say, start)
        ranked = sorted(alive, key=lambda c: score(results[c], o.p99_ms), reverse=True)
        keep = max(1, math.ceil(len(ranked) / 3))
        if len(alive) == 1 or keep == len(alive) or (keep == 1 and len(alive) <= 2):
            break  # nothing left to halve: the last round measured the finalist (beside the default)
        alive = ranked[:keep] + ([Candidate("default")] if Candidate("default") in cands and
                                 Candidate("default") not in ranked[:keep] else [])
        seconds *= 2
    rc = write_outputs(o, cands, results, dropped, pkgs, say, time.monotonic() - start)
    if rc == 0:
        check_served(o, pkgs, bodies, tmp, say)
    return rc


def check_served(o: TuneOptions, pkgs: dict, bodies: dict, tmp: str, say) -> None:
    """Serves the written entry as a user would (`aotc serve OUT FLAGS`, a process of its own), loads it as the
    search did, for as long as the winner's last round, and adds what it served beside what was measured to
    tune.md and tune.json ("served")."""
    from aotc import manifest as manifest_mod

    out = os.path.abspath(o.out)
    with open(os.path.join(out, "tune.json")) as f:
        info = json.load(f)
    winner = next(c for c in info["candidates"] if c["label"] == info["winner"])
    # the entry write_outputs named after the winner's package (OUT may hold other entries, from earlier tunes)
    name = manifest_mod.read(pkgs[winner["variant"]]).name
    port = _free_port()
    log_path = os.path.join(tmp, "served.log")
    argv = [sys.executable, "-c", "import sys; from aotc.cli import main; sys.exit(main())", "serve", out,
            *winner["server_flags"], "--http-port", str(port), "--grpc-port", "-1"]
    say(f"serving the entry as `aotc serve {o.out}` for {winner['seconds']:g} s at each concurrency")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(proc, port, "serving the winner's entry", log_path)
            body, headers = bodies[winner["variant"]]
            per = {str(n): load(port, name, body, headers, n, winner["seconds"]) for n in o.concurrency}
        finally:
            _stop(proc)
    add_served(o, " ".join(["aotc serve", o.out, *winner["server_flags"]]), winner, per, say)


def _measure_round(alive, pkgs, bodies, o, seconds, tmp, rnd, results, say, start) -> None:
    """Measures every candidate of `alive`, one server per set of server flags, a few entries at a time."""
    groups: dict[tuple, list[Candidate]] = {}
    for c in alive:
        groups.setdefault(tuple(c.server_flags()), []).append(c)
    done, t0 = 0, time.monotonic()
    for flags, members in groups.items():
        for chunk_at in range(0, len(members), 8):  # a few loaded at once: a big model's copies add up
            chunk = members[chunk_at:chunk_at + 8]
            root = os.path.join(tmp, f"r{rnd}_{len(results)}_{done}")
            entries = {f"c{i}": (pkgs[c.variant], c.config()) for i, c in enumerate(chunk)}
            server = _Server(root, entries, list(flags))
            try:
                for i, c in enumerate(chunk):
                    body, headers = bodies[c.variant]
                    per = {n: load(server.port, f"c{i}", body, headers, n, seconds) for n in o.concurrency}
                    results[c] = {"per_concurrency": per, "seconds": seconds, "round": rnd}
                    done += 1
            finally:
                server.stop()
            left = (time.monotonic() - t0) / done * (len(alive) - done)
            say(f"  {done}/{len(alive)} measured, ~{left:.0f} s left in this round "
                f"({time.monotonic() - start:.0f} s so far)")
