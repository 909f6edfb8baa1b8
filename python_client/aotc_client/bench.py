"""`aotc bench`: a closed-loop load generator for Open Inference Protocol servers.

Each of C connections sends one request, waits for its answer, and sends the next, for a fixed time;
the report gives throughput, p50/p90/p99/max latency and errors per concurrency level, and with several
servers (`--compare`) the ratios to the first. The request body is built once by tritonclient (so it is
exactly what tritonclient sends) and replayed with aiohttp, keeping the client's own cost per request low.
Bounded: at most MAX_CONCURRENCY connections and MAX_DURATION seconds per level; only loopback
addresses unless --allow-remote. It is not a correctness check (see `aotc check`). One asyncio loop.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import sys
import time
import urllib.parse
from dataclasses import dataclass, field

import numpy as np

from .errors import AotcError

MAX_CONCURRENCY = 1024
MAX_DURATION = 600.0


@dataclass
class Level:
    url: str
    concurrency: int
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies_ms: list = field(default_factory=list)
    first_error: str = ""

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    def row(self) -> dict:
        return {"url": self.url, "concurrency": self.concurrency, "requests": self.requests,
                "throughput": self.throughput, "p50_ms": self.pct(50), "p90_ms": self.pct(90),
                "p99_ms": self.pct(99), "max_ms": max(self.latencies_ms, default=float("nan")),
                "errors": self.errors}


def check_loopback(url: str, allow_remote: bool) -> str:
    """Returns 'http://host:port'; refuses a host that is not loopback unless allow_remote."""
    parsed = urllib.parse.urlparse(url if "://" in url else f"http://{url}")
    if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
        raise AotcError(f"URL {url!r} is not http://HOST:PORT")
    if not allow_remote:
        try:
            addrs = {a[4][0] for a in socket.getaddrinfo(parsed.hostname, parsed.port)}
        except socket.gaierror as e:
            raise AotcError(f"cannot resolve {parsed.hostname!r}: {e}") from None
        remote = [a for a in addrs if not ipaddress.ip_address(a.split("%")[0]).is_loopback]
        if remote:
            raise AotcError(f"{url} resolves to {remote[0]}, not a loopback address; aotc bench loads only "
                            f"local servers unless --allow-remote is given")
    return f"http://{parsed.hostname}:{parsed.port}"


def build_request(url: str, model: str, batch: int, binary: bool, seed: int = 0) -> tuple[bytes, dict]:
    """Body and headers of one inference request of `batch` rows of random valid inputs."""
    import tritonclient.http as httpclient

    from .client import Client

    with Client(url) as client:
        specs = client.input_specs(model)
        inputs = client.random_inputs(model, sizes=batch, seed=seed) if any(
            -1 in s.shape for s in specs) else client.random_inputs(model, seed=seed)
        outputs = [o["name"] for o in client.metadata(model)["outputs"]]
    tensors = []
    for s in specs:
        t = httpclient.InferInput(s.name, list(inputs[s.name].shape), s.datatype)
        t.set_data_from_numpy(inputs[s.name], binary_data=binary)
        tensors.append(t)
    requested = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in outputs]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(tensors, requested)
    # identity: as tritonclient, ask for no response compression (aiohttp would ask for gzip by default)
    headers = {"Content-Type": "application/octet-stream" if json_size is not None else "application/json",
               "Accept-Encoding": "identity"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    return body, headers


async def run_level(url: str, model: str, body: bytes, headers: dict, concurrency: int, duration: float,
                    warmup: float = 0.5, timeout: float = 30.0, max_requests: int | None = None) -> Level:
    """C closed-loop connections for `warmup` + `duration` seconds; only answers after warm-up count."""
    import aiohttp

    level = Level(url, concurrency)
    endpoint = f"{url}/v2/models/{model}/infer"
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(connector=conn, timeout=client_timeout) as session:
        start = time.perf_counter()
        begin, end = start + warmup, start + warmup + duration

        async def worker():
            while True:
                t0 = time.perf_counter()
                if t0 >= end or (max_requests and level.requests + level.errors >= max_requests):
                    return
                ok, err = False, ""
                try:
                    async with session.post(endpoint, data=body, headers=headers) as r:
                        await r.read()
                        ok = r.status == 200
                        err = "" if ok else f"HTTP {r.status}: {(await r.text())[:200]}"
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    err = f"{type(e).__name__}: {e}"
                t1 = time.perf_counter()
                if t0 < begin:
                    continue
                if ok:
                    level.requests += 1
                    level.latencies_ms.append((t1 - t0) * 1e3)
                else:
                    level.errors += 1
                    level.first_error = level.first_error or err
                    if level.errors >= 100 and level.requests == 0:
                        return  # the server refuses everything; do not spin for the whole duration

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        level.seconds = max(min(time.perf_counter(), end) - begin, 1e-9)
    return level


def run(urls: list[str], model: str, concurrency: list[int], duration: float, binary: bool = True,
        batch: int = 1, warmup: float = 0.5, allow_remote: bool = False, max_requests: int | None = None,
        out=sys.stdout, seed: int = 0, timeout: float = 30.0) -> list[Level]:
    """The whole benchmark; returns every level (servers interleaved per concurrency level)."""
    if not 0 < duration <= MAX_DURATION:
        raise AotcError(f"--duration {duration:g} is out of range; expected 0 < S <= {MAX_DURATION:g}")
    for c in concurrency:
        if not 1 <= c <= MAX_CONCURRENCY:
            raise AotcError(f"--concurrency {c} is out of range; expected 1..{MAX_CONCURRENCY}")
    urls = [check_loopback(u, allow_remote) for u in urls]
    requests = {u: build_request(u, model, batch, binary, seed) for u in urls}
    levels = []
    print(f"{'server':<26} {'conc':>4} {'req/s':>9} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'errors':>6}", file=out)
    for c in concurrency:
        for u in urls:
            lv = asyncio.run(run_level(u, model, *requests[u], c, duration, warmup, timeout, max_requests))
            levels.append(lv)
            r = lv.row()
            print(f"{u:<26} {c:>4} {r['throughput']:>9.1f} {r['p50_ms']:>8.3f} {r['p90_ms']:>8.3f} "
                  f"{r['p99_ms']:>8.3f} {r['max_ms']:>8.3f} {r['errors']:>6}", file=out, flush=True)
            if lv.first_error:
                print(f"  first error: {lv.first_error}", file=out)
    if len(urls) > 1:
        print_ratios(levels, urls, out)
    return levels


def print_ratios(levels: list[Level], urls: list[str], out=sys.stdout) -> None:
    base = {lv.concurrency: lv for lv in levels if lv.url == urls[0]}
    print(f"ratios to {urls[0]} (throughput x, p99 latency x):", file=out)
    for lv in levels:
        if lv.url == urls[0] or lv.concurrency not in base:
            continue
        b = base[lv.concurrency]
        tput = lv.throughput / b.throughput if b.throughput else float("nan")
        p99 = lv.pct(99) / b.pct(99) if b.latencies_ms else float("nan")
        print(f"  {lv.url:<26} c={lv.concurrency:<4} throughput {tput:6.2f}x  p99 {p99:6.2f}x", file=out)


def plot(levels: list[Level], path: str) -> None:
    """PNG of p50 and p99 latency against throughput, one line per server, points labelled by concurrency."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for url in dict.fromkeys(lv.url for lv in levels):
        mine = [lv for lv in levels if lv.url == url]
        x = [lv.throughput for lv in mine]
        for q, style in ((50, "o-"), (99, "s--")):
            ax.plot(x, [lv.pct(q) for lv in mine], style, label=f"{url} p{q}")
        for lv in mine:
            ax.annotate(f"c={lv.concurrency}", (lv.throughput, lv.pct(99)), fontsize=7)
    ax.set_xlabel("throughput (requests/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_concurrency(text: str) -> list[int]:
    try:
        return [int(c) for c in str(text).split(",") if c.strip()]
    except ValueError:
        raise AotcError(f"--concurrency {text!r} is not a list of integers; expected e.g. 1,8,32") from None


@dataclass
class BenchOptions:
    """What `aotc bench` measures; the defaults are the command line's (cli.py reads them from here)."""
    model: str
    urls: list[str]                 # measured in turn, ratios to the first
    concurrency: str = "1,8,32"     # comma-separated connection counts
    duration: float = 10.0          # seconds per level, counted
    warmup: float = 0.5             # seconds per level before counting
    batch: int = 1                  # rows per request for a dynamic batch dim
    binary: bool = True             # binary tensors (else JSON)
    max_requests: int | None = None  # stop a level after this many requests
    seed: int = 0                   # of the random request
    timeout: float = 30.0           # seconds per request
    plot: str | None = None         # write latency against throughput as a PNG here
    allow_remote: bool = False      # allow servers that are not on loopback


def measure(opts: BenchOptions, out=sys.stdout) -> list[Level]:
    """`aotc bench`: every level of every server, printed as it is measured; the plot when asked for."""
    urls = list(dict.fromkeys(opts.urls))
    if not urls:
        raise AotcError("aotc bench needs --url URL or --compare URL1 URL2 ...")
    levels = run(urls, opts.model, parse_concurrency(opts.concurrency), opts.duration, opts.binary, opts.batch,
                 opts.warmup, opts.allow_remote, opts.max_requests, out=out, seed=opts.seed, timeout=opts.timeout)
    if opts.plot:
        plot(levels, opts.plot)
        print(f"wrote {opts.plot}", file=out)
    return levels
