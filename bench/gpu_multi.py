"""Several GPUs: the BERT-base encoder (fp16, seq 128) served by one aotc-server with its instances on one GPU
vs on two, batch-1 requests at concurrency 64, in one run. Prints a markdown table (and writes it with --out):
requests/s, p50, the executions each GPU made (from /v2/models/{m}/stats), and the two-GPU speed-up, with
answers carrying every output and with pooler_output alone.
  python bench/gpu_multi.py --packages DIR [--instances 2] [--seconds 15] [--out gpu_multi.md]
DIR holds bert_base.pt2 from `aotc export models/bert.py:bert_base --device cuda --dtype fp16` (bench/gpu.sh
exports it); aotc-server must be on PATH. Not a test: it asserts nothing, and when fewer than two GPUs are
visible it prints why and exits 0. Load: bench/loadgen.py (aotc-load, 64 keep-alive connections).
Both models live in one server, so both placements are measured under the same process and flags.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from launch import Server, make_repository
from loadgen import http_load, model_stats


def per_device_executions(port: int, model: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in model_stats(port, model)["instance_stats"]:
        out[i["device"]] = out.get(i["device"], 0) + i["execution_count"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packages", type=Path, required=True, help="directory holding bert_base.pt2 (CUDA)")
    ap.add_argument("--instances", type=int, default=2, help="instances per GPU (default 2)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per placement and answer")
    ap.add_argument("--max-batch-size", type=int, default=64)
    ap.add_argument("--out", type=Path, help="also write the table here")
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        print("gpu_multi: skipped: torch is not installed, so the visible GPUs cannot be counted")
        return 0
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n_gpus < 2:
        print(f"gpu_multi: skipped: needs 2 GPUs, {n_gpus} visible")
        return 0
    pkg = args.packages / "bert_base.pt2"
    if not pkg.is_file():
        print(f"gpu_multi: skipped: no {pkg} (export it with --device cuda --dtype fp16)")
        return 0

    from aotc.manifest import read

    input_name = read(str(pkg)).inputs[0].name
    x = torch.randint(0, 30522, (1, 128), generator=torch.Generator().manual_seed(1))
    batching = {"max_batch_size": args.max_batch_size, "max_queue_delay_us": 200}
    k = args.instances
    placements = {  # model name -> (label, config)
        "bert_1gpu": ("1 GPU (cuda:0)", {**batching, "instance_group": [{"count": k, "kind": "KIND_GPU", "gpus": [0]}]}),
        "bert_2gpu": ("2 GPUs (cuda:0, cuda:1)",
                      {**batching, "instance_group": [{"count": k, "kind": "KIND_GPU", "gpus": [0, 1]}]}),
    }
    # Each placement twice: answers with every output (the 196 KiB hidden state of each request crosses
    # the socket) and with pooler_output alone (what a classifier asks for), where the GPUs set the pace.
    answers = {"all outputs": None, "pooler_output only": ["pooler_output"]}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        srv = Server("cpp", make_repository(Path(tmp) / "repo", {name: pkg for name in placements},
                                            {name: cfg for name, (_, cfg) in placements.items()}, link=True))
        try:
            for what, outputs in answers.items():
                for name in placements:
                    before = per_device_executions(srv.port, name)
                    r = http_load(srv.port, name, x, input_name, args.concurrency, args.seconds, outputs=outputs)
                    after = per_device_executions(srv.port, name)
                    r["executions"] = {d: n - before.get(d, 0) for d, n in after.items()}
                    results[(what, name)] = r
        finally:
            srv.stop()

    lines = [f"BERT-base fp16, seq 128, batch-1 requests, concurrency {args.concurrency}, {k} instance(s) per GPU, "
             f"max_batch_size {args.max_batch_size}, max_queue_delay_us 200, {args.seconds:g} s each; "
             f"torch {torch.__version__}, {torch.cuda.get_device_name(0)} x{n_gpus}",
             "", "| answer | placement | req/s | p50 ms | errors | executions per GPU |", "|---|---|---|---|---|---|"]
    for what in answers:
        for name, (label, _) in placements.items():
            r = results[(what, name)]
            ex = ", ".join(f"{d}: {n}" for d, n in sorted(r["executions"].items()))
            kinds = ", ".join(f"{k} {n}" for k, n in r["error_counts"].items() if n)  # which kind of failure
            errors = f"{r['errors']} ({kinds})" if r["errors"] else "0"
            lines.append(f"| {what} | {label} | {r['req_per_s']:.0f} | {r['p50_ms']:.2f} | {errors} | {ex} |")
    lines.append("")
    for what in answers:
        speedup = results[(what, "bert_2gpu")]["req_per_s"] / results[(what, "bert_1gpu")]["req_per_s"]
        lines.append(f"two GPUs / one GPU, {what}: {speedup:.2f}x the throughput")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
