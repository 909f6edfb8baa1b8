"""Sequence-length buckets against one padded shape, a dynamic sequence dim and packed rows, side by side: the
same model exported up to four ways (`--seq-buckets INPUTS=SIZES`; `--seq-buckets INPUTS=MAX`, every request
padded to the longest; no buckets, the sequence dim dynamic; `--seq-pack INPUTS=MAX`, several requests per row
of MAX tokens, the "packed" variant, or of N tokens, "packedN"), each served by aotc-server with dynamic
batching (max_batch_size counts the graph's rows of MAX tokens, so every variant's batches hold the same tokens
at most: packedN's max_batch_size is scaled by MAX / N), loaded by
`aotc-load` at one concurrency with requests whose lengths are drawn uniformly from a range (each connection
sends a fixed list of them in turn, starting at its own place). The cells take turns in rounds, so drifting
load falls on all alike. "buckets" serves the buckets' package with `seq_bucket_promotion` true,
"unpromoted" with it false (each bucket batches alone) and "auto" with "auto" (trials of both decide;
docs/server.md, Batching). Prints a markdown table of requests/s, p50 and p99 (medians
of rounds) and the buckets' ratios, then the batches each server formed and how many requests ran padded to
a longer bucket than their own (and, for "auto", how many trials promotion won).
  python bench/seq_buckets.py [--model models/hf_bert.py:base] [--device cpu|cuda] [--dtype fp32]
      [--inputs input_ids:1,attention_mask:1] [--sizes 32,64,128] [--lengths 8:128] [--concurrency 32]
      [--request-batch 1] [--seconds 20] [--rounds 3] [--outputs binary|json] [--runners 1]
      [--preferred-batch-sizes 16] [--variants buckets,unpromoted,auto,padded,dynamic,packed,packed256]
      [--export-arg=--static-batches=none]... [--server-arg=--intra-op-threads=1]... [--out FILE]
Exports go through `aotc export` and its cache. Not a test; asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

from launch import Server, make_repository
from loadgen import bodies_load, model_stats

REPO = Path(__file__).resolve().parents[1]


def export(model: str, out: Path, device: str, dtype: str, extra: list[str]) -> float:
    """`aotc export` of `model` to `out`; returns its wall seconds (a cache hit: about none)."""
    import time

    t0 = time.perf_counter()
    argv = [sys.executable, "-m", "aotc.cli", "export", model, "-o", str(out), "--device", device, "--dtype", dtype,
            *extra]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{(r.stderr or r.stdout)[-2000:]}")
    return time.perf_counter() - t0


def bodies(inputs: list[str], lengths: list[int], rows: int, tmp: Path, binary_outputs: bool) -> list[Path]:
    """A JSON request per length: `rows` rows of random token ids, a mask of ones (a request is as long as
    its own tokens), every input of `inputs` at that length; `binary_outputs` asks for the outputs as binary
    data after the JSON header (`binary_data_output`, what tritonclient asks for by default) instead of as
    JSON numbers."""
    rng = np.random.default_rng(7)
    out = []
    for i, n in enumerate(lengths):
        ids = rng.integers(1, 1000, (rows, n))
        tensors = [{"name": name, "shape": [rows, n], "datatype": "INT64",
                    "data": (ids if k == 0 else np.ones_like(ids)).ravel().tolist()} for k, name in enumerate(inputs)]
        path = tmp / f"body{i}.json"
        body = {"inputs": tensors, **({"parameters": {"binary_data_output": True}} if binary_outputs else {})}
        path.write_text(json.dumps(body))
        out.append(path)
    return out


def batch_sizes(text: str) -> list[int]:
    """--preferred-batch-sizes: positive whole numbers, comma-separated."""
    try:
        sizes = [int(v) for v in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"takes positive whole numbers separated by commas, e.g. 4,8; got {text!r}")
    return sizes


def counts(port: int, model: str, families: tuple[str, ...]) -> dict[str, int]:
    """The value of each of `families` for `model` from /metrics (absent: no series for the model)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in families and f'model="{model}"' in line:
            found[name] = int(float(line.rsplit(" ", 1)[1]))
    return found


PROMOTION = ("aotc_seq_promoted_count", "aotc_seq_promotion_trials_count", "aotc_seq_promotion_trials_won_count")


def promotion_note(found: dict[str, int]) -> str:
    """What a server's promotion counters say, for the batches' line."""
    note = ""
    if "aotc_seq_promoted_count" in found:
        note += f"; {found['aotc_seq_promoted_count']} requests promoted"
    if found.get("aotc_seq_promotion_trials_count"):
        note += (f"; promotion won {found.get('aotc_seq_promotion_trials_won_count', 0)} of "
                 f"{found['aotc_seq_promotion_trials_count']} trials")
    return note


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/hf_bert.py:base")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--inputs", default="input_ids:1,attention_mask:1")
    ap.add_argument("--sizes", default="32,64,128")
    ap.add_argument("--lengths", default="8:128", help="request lengths, uniform in MIN:MAX")
    ap.add_argument("--requests", type=int, default=64, help="distinct requests (lengths) in the list")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--request-batch", type=int, default=1)
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--max-queue-delay-us", type=int, default=2000)
    ap.add_argument("--runners", type=int, default=1)
    ap.add_argument("--preferred-batch-sizes", type=batch_sizes, default=[],
                    help="the config's preferred_batch_sizes, comma-separated (none: batches are cut to the "
                         "largest CUDA-graph bucket they fill)")
    ap.add_argument("--variants", default="buckets,unpromoted,padded,dynamic", help="which packages to measure")
    ap.add_argument("--seconds", type=float, default=20.0, help="per cell and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--outputs", choices=("binary", "json"), default="binary",
                    help="how answers carry the outputs (binary_data_output, or JSON numbers)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="passed to every aotc-server, e.g. --server-arg=--intra-op-threads=1")
    ap.add_argument("--export-arg", action="append", default=[], help="passed to every aotc export")
    ap.add_argument("--pkg-dir", type=Path, default=REPO / ".cache" / "bench-seq")
    ap.add_argument("--out", type=Path, help="also write the report here")
    args = ap.parse_args()
    lo, hi = (int(v) for v in args.lengths.split(":"))
    names = [item.split(":")[0] for item in args.inputs.split(",")]
    largest = args.sizes.split(",")[-1]
    variants = {"buckets": ["--seq-buckets", f"{args.inputs}={args.sizes}"],
                "unpromoted": None, "auto": None, "padded": ["--seq-buckets", f"{args.inputs}={largest}"], "dynamic": [],
                "packed": ["--seq-pack", f"{args.inputs}={largest}"]}
    wanted = args.variants.split(",")
    row_tokens = {v: int(v[6:]) for v in wanted if re.fullmatch(r"packed[1-9][0-9]*", v)}
    variants.update({v: ["--seq-pack", f"{args.inputs}={n}"] for v, n in row_tokens.items()})
    if any(v not in variants for v in wanted) or ({"unpromoted", "auto"} & set(wanted) and "buckets" not in wanted):
        ap.error(f"--variants takes any of buckets, unpromoted, auto, padded, dynamic, packed, packedN (rows of N "
                 f"tokens; unpromoted and auto with buckets); got {args.variants!r}")
    variants = {k: v for k, v in variants.items() if k in wanted}
    args.pkg_dir.mkdir(parents=True, exist_ok=True)
    pkgs, export_s = {}, {}
    for label, flags in variants.items():
        if flags is None:  # unpromoted, auto: the buckets' package
            pkgs[label], export_s[label] = pkgs["buckets"], export_s["buckets"]
            continue
        pkgs[label] = args.pkg_dir / f"{label}_{args.device}_{args.dtype}.pt2"
        export_s[label] = export(args.model, pkgs[label], args.device, args.dtype, flags + args.export_arg)
        print(f"exported {label}: {export_s[label]:.0f} s, {pkgs[label].stat().st_size / 1e6:.0f} MB", flush=True)
    lengths = [int(n) for n in np.random.default_rng(3).integers(lo, hi + 1, args.requests)]
    config = {"max_batch_size": args.max_batch_size, "max_queue_delay_us": args.max_queue_delay_us,
              "num_runners": args.runners}
    if args.preferred_batch_sizes:
        config["preferred_batch_sizes"] = args.preferred_batch_sizes
    promotion = {"buckets": True, "unpromoted": False, "auto": "auto", "padded": True}
    configs = {label: dict(config, seq_bucket_promotion=promotion[label]) if label in promotion else config
               for label in variants}
    for label, n in row_tokens.items():  # as many tokens a batch as the others'
        configs[label] = dict(config, max_batch_size=max(1, args.max_batch_size * int(largest) // n))
    runs: dict[str, list[dict]] = {label: [] for label in variants}
    stats, promoted = {}, {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        files = bodies(names, lengths, args.request_batch, tmp, args.outputs == "binary")
        for r in range(args.rounds):
            for label in variants:  # one server at a time: each has the machine to itself
                repo = make_repository(tmp / f"repo_{label}_{r}", {label: pkgs[label]}, {label: configs[label]}, link=True)
                with Server("cpp", repo, *args.server_arg) as srv:
                    res = bodies_load(srv.port, label, files, args.concurrency, args.seconds)
                    if res["errors"]:
                        raise SystemExit(f"{label}: {res['errors']} errors: {res['error_counts']}")
                    runs[label].append(res)
                    stats[label] = model_stats(srv.port, label)
                    promoted[label] = counts(srv.port, label, PROMOTION)
                print(f"round {r} {label}: {res['req_per_s']:.2f} req/s p50 {res['p50_ms']:.1f} ms "
                      f"p99 {res['p99_ms']:.1f} ms (the largest answer {res['answer_bytes'] / 1e3:.1f} KB)", flush=True)
    med = {label: {k: statistics.median(x[k] for x in rs) for k in ("req_per_s", "p50_ms", "p99_ms")}
           for label, rs in runs.items()}
    lines = [f"`python bench/seq_buckets.py --model {args.model} --device {args.device} --dtype {args.dtype} "
             f"--sizes {args.sizes} --lengths {args.lengths} --concurrency {args.concurrency} --request-batch "
             f"{args.request_batch} --seconds {args.seconds:g} --rounds {args.rounds} --outputs {args.outputs} "
             f"--runners {args.runners} --max-batch-size {args.max_batch_size} --max-queue-delay-us "
             f"{args.max_queue_delay_us} --variants {args.variants}"
             + (f" --preferred-batch-sizes {','.join(map(str, args.preferred_batch_sizes))}"
                if args.preferred_batch_sizes else "")
             + "".join(f" --export-arg={a}" for a in args.export_arg)
             + "".join(f" --server-arg={a}" for a in args.server_arg) + "`",
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
             f"{os.cpu_count()} CPUs; {args.requests} requests of lengths {lo}..{hi} (uniform), "
             f"max_batch_size {args.max_batch_size}, max_queue_delay_us {args.max_queue_delay_us}, "
             f"{args.runners} runner(s); medians of {args.rounds} rounds of {args.seconds:g} s", "",
             "| package | req/s | p50 ms | p99 ms | export s | MB |", "|---|---|---|---|---|---|"]
    for label in variants:
        m = med[label]
        lines.append(f"| {label} | {m['req_per_s']:.2f} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} | "
                     f"{export_s[label]:.0f} | {pkgs[label].stat().st_size / 1e6:.0f} |")
    tops = (*row_tokens, "packed", "buckets", "auto")
    ratios = [f"{top} / {label}: throughput {med[top]['req_per_s'] / m['req_per_s']:.2f}x, "
              f"p99 {med[top]['p99_ms'] / m['p99_ms']:.2f}x"
              for i, top in enumerate(tops) if top in med for label, m in med.items()
              if label != top and label not in tops[:i]]
    lines += ["", "; ".join(ratios), "",
              "batches formed (last round: batch size x executions, mean compute ms per execution):"]
    for label, st in stats.items():
        formed = sorted((s["batch_size"], s["compute_infer"]["count"], s["compute_infer"]["ns"])
                        for s in st["batch_stats"])
        lines.append(f"- {label}: " + ", ".join(f"{n}x{c} ({ns / max(c, 1) / 1e6:.2f})" for n, c, ns in formed)
                     + promotion_note(promoted[label]))
        lines[-1] += f"; max_batch_size {configs[label]['max_batch_size']}" if label in row_tokens else ""
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
