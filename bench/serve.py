"""Serving benchmark: throughput and p50/p99 latency of batch-1 requests at several concurrencies, for JSON
and binary tensors, with dynamic batching on and off, in one run against one server process.

    .venv/bin/python bench/serve.py [--models mlp,bert] [--concurrency 1,8,32,64] [--seconds 3] [--kind cpp]

Packages come from .cache/pkgs/<model>.pt2 when present, else `aotc export models/<model>.py` (cached like
the tests' fixtures). The server gets a repository with <model> (default config: batching on) and
<model>_nobatch (config max_batch_size 0). The load generator is asyncio speaking raw HTTP/1.1
keep-alive (one connection per concurrent client, prebuilt request bytes, spread over --client-procs
processes) so that the client costs little;
it shares the machine's cores with the server, as a co-located client would. Prints a Markdown table.
Not a test: it asserts nothing about speed, only that every answer was 200.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from launch import REPO, Server, make_repository


def package(model: str) -> Path:
    cached = REPO / ".cache" / "pkgs" / f"{model}.pt2"
    if cached.exists():
        return cached
    import subprocess

    out = REPO / "build" / "bench-packages" / f"{model}.pt2"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "aotc.cli", "export", f"models/{model}.py", "-o", str(out)],
                       cwd=REPO, check=True)
    return out


def build_request(model: str, meta: dict, binary: bool, seed: int) -> bytes:
    """One batch-1 request for `model` (metadata from the server), as the bytes that go on the wire."""
    rng = np.random.default_rng(seed)
    inputs, blobs = [], []
    for spec in meta["inputs"]:
        shape = [1 if d == -1 else d for d in spec["shape"]]
        if spec["datatype"] == "FP32":
            x = rng.standard_normal(shape).astype(np.float32)
        else:
            x = rng.integers(0, 1000, shape).astype({"INT64": np.int64, "INT32": np.int32}[spec["datatype"]])
        t = {"name": spec["name"], "shape": shape, "datatype": spec["datatype"]}
        if binary:
            t["parameters"] = {"binary_data_size": x.nbytes}
            blobs.append(x.tobytes())
        else:
            t["data"] = x.ravel().tolist()
        inputs.append(t)
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": binary}}).encode()
    body = header + b"".join(blobs)
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n")
    if binary:
        head += f"Inference-Header-Content-Length: {len(header)}\r\n"
    return head.encode() + b"\r\n" + body


async def client(host, port, requests, t_start, t_end, latencies, errors):
    reader, writer = await asyncio.open_connection(host, port)
    i = 0
    while True:
        t0 = time.perf_counter()
        if t0 >= t_end:
            break
        writer.write(requests[i % len(requests)])
        i += 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head).group(1))
        await reader.readexactly(length)
        t1 = time.perf_counter()
        if head[9:12] != b"200":
            errors.append(head[:12])
        if t0 >= t_start:
            latencies.append(t1 - t0)
        if re.search(rb"(?i)\r\nconnection:\s*close", head):
            writer.close()
            reader, writer = await asyncio.open_connection(host, port)
    writer.close()


async def _load(host, port, requests, concurrency, t_start, t_end):
    latencies, errors = [], []
    await asyncio.gather(*[client(host, port, requests, t_start, t_end, latencies, errors)
                           for _ in range(concurrency)])
    return latencies, len(errors)


def _load_process(args):
    host, port, requests, concurrency, start_wall, seconds = args
    # Each process maps the shared wall-clock start onto its own perf_counter.
    t_start = time.perf_counter() + (start_wall - time.time())
    return asyncio.run(_load(host, port, requests, concurrency, t_start, t_start + seconds))


def measure(pool, procs, host, port, requests, concurrency, seconds, warmup=0.5):
    """`concurrency` keep-alive clients spread over `procs` processes, so one Python process is not the limit."""
    start_wall = time.time() + warmup + 0.2
    shares = [concurrency // procs + (i < concurrency % procs) for i in range(procs)]
    parts = pool.map(_load_process, [(host, port, requests, n, start_wall, seconds) for n in shares if n])
    lat = np.array([x for latencies, _ in parts for x in latencies]) * 1e3
    return {"rps": len(lat) / seconds, "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "n": len(lat), "errors": sum(e for _, e in parts)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,bert")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--kind", default="cpp", choices=["cpp", "python"])
    ap.add_argument("--max-queue-delay-us", type=int, default=0, help="batching config for <model>")
    ap.add_argument("--inline", choices=["on", "off"], default="on",
                    help="run_inline_when_idle for <model> (cpp server)")
    ap.add_argument("--client-procs", type=int, default=2, help="load-generator processes")
    ap.add_argument("--server-flags", default="", help="extra server flags, e.g. '--intra-op-threads 1'")
    args = ap.parse_args()
    models = args.models.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        pkgs = {m: package(m) for m in models}
        repo = make_repository(Path(tmp) / "repo", {**pkgs, **{f"{m}_nobatch": p for m, p in pkgs.items()}},
                               {**{m: {"max_queue_delay_us": args.max_queue_delay_us,
                                       "run_inline_when_idle": args.inline == "on"} for m in models},
                                **{f"{m}_nobatch": {"max_batch_size": 0} for m in models}})
        rows = []
        with Server(args.kind, repo, *args.server_flags.split()) as s, \
                multiprocessing.Pool(args.client_procs) as pool:
            for m in models:
                meta = s.json("GET", f"/v2/models/{m}")[1]
                for name in (f"{m}_nobatch", m):  # warm-up, not recorded
                    measure(pool, args.client_procs, s.host, s.port, [build_request(name, meta, True, 0)], 8, 1.0)
                for binary in (False, True):
                    for c in levels:
                        # on and off back to back, so both see the same load from anything else on the machine
                        for batching in (False, True):
                            name = m if batching else f"{m}_nobatch"
                            reqs = [build_request(name, meta, binary, seed) for seed in range(8)]
                            r = measure(pool, args.client_procs, s.host, s.port, reqs, c, args.seconds)
                            row = (m, "binary" if binary else "JSON", "on" if batching else "off", c, r)
                            rows.append(row)
                            print(f"{m:6} {row[1]:6} batching {row[2]:3} c={c:3}: {r['rps']:8.0f} req/s  "
                                  f"p50 {r['p50']:7.2f} ms  p99 {r['p99']:7.2f} ms  errors {r['errors']}",
                                  file=sys.stderr, flush=True)
                st = s.json("GET", f"/v2/models/{m}/stats")[1]["model_stats"][0]
                sizes = sorted(((b["batch_size"], b["compute_infer"]["count"]) for b in st["batch_stats"]),
                               key=lambda t: -t[1])[:6]
                print(f"{m}: most frequent batch sizes formed (size, count): {sizes}", file=sys.stderr)
    print(f"load average (1, 5, 15 min) at the end: {tuple(round(x, 1) for x in os.getloadavg())}; "
          f"{os.cpu_count()} CPUs; {args.seconds:g} s per cell; batch-1 requests; "
          f"server flags: {args.server_flags or '(none)'}")
    print()
    print("| model | tensors | concurrency | off: req/s | off: p50 ms | off: p99 ms | on: req/s | on: p50 ms "
          "| on: p99 ms | throughput on/off |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    cells = {(m, enc, b, c): r for m, enc, b, c, r in rows}
    for m, enc, b, c, _ in rows:
        if b != "off":
            continue
        off, on = cells[(m, enc, "off", c)], cells[(m, enc, "on", c)]
        print(f"| {m} | {enc} | {c} | {off['rps']:.0f} | {off['p50']:.2f} | {off['p99']:.2f} | {on['rps']:.0f} "
              f"| {on['p50']:.2f} | {on['p99']:.2f} | {on['rps'] / off['rps']:.2f}x |")
    return 1 if any(r["errors"] for *_, r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
