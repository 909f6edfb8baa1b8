"""Per-call latency on one GPU of the seed MLP (batch 64, fp32) and BERT-base (12x768, seq 128, fp16, batch 1
and 8): eager; torch.compile default, reduce-overhead, max-autotune; PyTorch's Python AOTI runner; the aotc C++
runtime (aotc-run --bench) with and without CUDA graphs; aotc-server over HTTP at concurrency 1 and 32 (each
model on a server of its own; BERT at concurrency 1 also with pooler_output only, and with every output written
to a shared memory region); BERT batch-1 requests at concurrency 32 with and without dynamic batching (one
server holding both configs). Writes a markdown table (and a .json
beside it). Run by bench/gpu.sh on the GPU machine:
  python bench/gpu_models.py --packages DIR [--budget-s S] [--out gpu_bench.md]
DIR holds mlp.pt2 and bert_base.pt2 from `aotc export --device cuda`, and optionally bert_base_ma.pt2 (the
same export with --max-autotune: its own aotc-run column). Not a test: it asserts nothing, and a part that
cannot run (no package, no aotc-server, no time left) is skipped with the reason printed.
In-process numbers are medians of CUDA-event times, one synchronized call at a time, inputs already on the
GPU ("device") or copied in from pinned host memory and out again ("host"), and the latter again by wall
clock ("wall", like aotc-run); aotc-run numbers are wall-clock
medians, host to host or (`--device-inputs`) device-resident; HTTP numbers are wall-clock medians. HTTP load comes from aotc-load (bench/loadgen.py), keep-alive connections. Each
concurrency-1 cell comes with the floor of its answer, measured in the same round: aotc-load's own loopback
responder sending the same number of bytes, with no server work (--loopback-bytes).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from launch import Server, make_repository
from loadgen import aotc_run_p50_us, http_load, loopback_load, server_stats, shm_region, stats_per_request

ROOT = Path(__file__).resolve().parents[1]
CASES = [("mlp", 64), ("bert_base", 1), ("bert_base", 8)]
COST_S = {"compile": 45, "compile-reduce-overhead": 50, "compile-max-autotune": 100}  # per (model, batch)


def load_model(name: str, torch):
    path, fn, dtype = {"mlp": ("models/mlp.py", "model", torch.float32),
                       "bert_base": ("models/bert.py", "bert_base", torch.float16)}[name]
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, fn)().to("cuda", dtype).eval()


def make_input(name: str, batch: int, torch):
    g = torch.Generator().manual_seed(batch)
    if name == "mlp":
        return torch.randn(batch, 512, generator=g)
    return torch.randint(0, 30522, (batch, 128), generator=g)


def time_events(fn, iters: int, warmup: int, torch) -> float:
    """Median ms per call, CUDA events around each call, synchronized after each."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_wall(fn, iters: int, warmup: int, torch) -> float:
    """Median wall-clock ms per call, synchronized after each: what aotc-run measures, so the two compare
    like for like (CUDA events leave out the host's work before the first kernel and the wake-up after the
    last)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def measure(fn, x_host, iters, torch) -> dict:
    """{'device': ms, 'host': ms, 'wall': ms} for fn(x): x on the GPU, and with pinned host copies in and out
    (by CUDA events, and by wall clock)."""
    x_dev = x_host.cuda()
    pinned = x_host.pin_memory()

    def host_to_host():
        out = fn(pinned.cuda(non_blocking=True))
        out = out if isinstance(out, (tuple, list)) else (out,)
        return [o.to("cpu", non_blocking=True) for o in out]

    with torch.inference_mode():
        return {"device": time_events(lambda: fn(x_dev), iters, 20, torch),
                "host": time_events(host_to_host, iters, 20, torch),
                "wall": time_wall(host_to_host, iters, 20, torch)}


# ---- aotc-run ----------------------------------------------------------------------------------------------
def aotc_run_bench(pkg: Path, x_host, graphs: bool, iters: int, tmp: Path, device_inputs: bool = False) -> float:
    """Median ms per call of aotc-run on the torch tensor x_host."""
    flags = ([] if graphs else ["--no-cuda-graphs"]) + (["--device-inputs"] if device_inputs else [])
    return aotc_run_p50_us(pkg, x_host.numpy(), tmp, iters, 50, flags) / 1e3


# ---- the run -----------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packages", type=Path, required=True, help="folder with mlp.pt2 and bert_base.pt2")
    ap.add_argument("--budget-s", type=float, default=480, help="stop starting new parts after this long")
    ap.add_argument("--out", type=Path, default=Path("gpu_bench.md"))
    ap.add_argument("--http-seconds", type=float, default=3.0, help="seconds per HTTP load level")
    ap.add_argument("--busy-poll-us", type=int, default=0, help="also measure concurrency 1 on servers started "
                    "with --busy-poll-us N, taking turns with the default (default 0: not)")
    ap.add_argument("--server-rounds", type=int, default=1, help="rounds of the concurrency-1 HTTP cells")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out, e.g. compile-max-autotune")
    ap.add_argument("--only", default="", help="comma-separated parts to run, nothing else (e.g. "
                    "compile-max-autotune,aotc-run-extra; a part's label prefix, compile-reduce-overhead:bert_base:b8, "
                    "picks one case)")
    ap.add_argument("--extra", action="append", default=[], metavar="LABEL=PKG",
                    help="another CUDA export of bert_base, timed by aotc-run with CUDA graphs as its own column")
    args = ap.parse_args()
    t_start = time.time()
    skip = set(filter(None, args.skip.split(",")))
    only = set(filter(None, args.only.split(",")))
    extras = {k: Path(v) for k, v in (e.split("=", 1) for e in args.extra)}

    import torch

    from aotc.loader import ensure_libstdcxx_global
    from aotc.manifest import read as read_manifest

    ensure_libstdcxx_global()  # before any AOTI .so is loaded in this process (../shared/GPU.md)
    torch._dynamo.config.automatic_dynamic_shapes = False  # one static graph per batch size, like the baseline
    torch._dynamo.config.cache_size_limit = 64
    res: dict[tuple, dict] = {}
    notes: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="aotc-gpu-bench-"))

    def left() -> float:
        return args.budget_s - (time.time() - t_start)

    def named(label, names):  # "aotc-run" names every aotc-run part, "aotc-run:mlp" only the MLP's
        return any(label == n or label.startswith(n + ":") for n in names)

    def part(label, cost_s, fn):
        if named(label, skip) or (only and not named(label, only)):
            if not only:
                notes.append(f"{label}: skipped (--skip)")
            return
        if left() < cost_s:
            notes.append(f"{label}: skipped, {left():.0f} s of budget left, needs about {cost_s} s")
        else:
            t0 = time.time()
            try:
                fn()
                print(f"{label}: done in {time.time() - t0:.1f} s", flush=True)
                write_report(args.out, res, notes, torch, time.time() - t_start, quiet=True)  # kept if killed
                return
            except Exception as e:  # a benchmark part that fails is reported, the rest still runs
                first = (str(e).strip().splitlines() or [""])[0][:300]
                notes.append(f"{label}: failed: {type(e).__name__}: {first}")
        print(notes[-1], flush=True)

    def iters(name):
        return 300 if name == "mlp" else 100

    models = {}
    for name in ("mlp", "bert_base"):
        models[name] = load_model(name, torch)

    for name, b in CASES:
        x = make_input(name, b, torch)

        def eager(name=name, b=b, x=x):
            res[(name, b)]["eager"] = measure(models[name], x, iters(name), torch)

        res[(name, b)] = {}
        part(f"eager:{name}:b{b}", 5, eager)

    for name in ("mlp", "bert_base"):
        pkg = args.packages / f"{name}.pt2"
        if not pkg.is_file():
            notes.append(f"{name}: no package at {pkg}: AOTI and aotc parts skipped")
            continue

        def aoti(name=name, pkg=pkg):
            runner = torch._inductor.aoti_load_package(str(pkg))
            for n, b in CASES:
                if n == name:
                    res[(n, b)]["aoti-python"] = measure(lambda x: runner(x), make_input(n, b, torch), iters(n), torch)

        part(f"aoti-python:{name}", 10, aoti)
        for graphs in (False, True):
            def cpp(name=name, pkg=pkg, graphs=graphs):
                for n, b in CASES:
                    if n == name:
                        x = make_input(n, b, torch)
                        host = aotc_run_bench(pkg, x, graphs, 5 * iters(n), tmp)
                        res[(n, b)]["aotc-run" + (" graphs" if graphs else "")] = {
                            "host": host, "wall": host,  # aotc-run times by wall clock
                            "device": aotc_run_bench(pkg, x, graphs, 5 * iters(n), tmp, device_inputs=True)}

            part(f"aotc-run:{name}:{'graphs' if graphs else 'no-graphs'}", 10, cpp)

    for label, path in extras.items():  # other exports of bert_base (max-autotune, freezing on)
        def cpp_extra(label=label, path=path):
            for b in (1, 8):
                x = make_input("bert_base", b, torch)
                try:  # an export for one batch size (e.g. --dynamic-batch 8:8) refuses the other
                    ms = aotc_run_bench(path, x, True, 5 * iters("bert_base"), tmp)
                    dev = aotc_run_bench(path, x, True, 5 * iters("bert_base"), tmp, device_inputs=True)
                except RuntimeError as e:
                    notes.append(f"aotc-run-extra:{label}:b{b}: {str(e)[:200]}")
                    continue
                res[("bert_base", b)][f"aotc-run graphs, {label}"] = {"host": ms, "wall": ms, "device": dev}

        if path.is_file():
            part(f"aotc-run-extra:{label}", 10, cpp_extra)
        else:
            notes.append(f"aotc-run-extra:{label}: no package at {path}")

    def server():
        bert = args.packages / "bert_base.pt2"
        manifests = {n: read_manifest(str(args.packages / f"{n}.pt2")) for n in ("mlp", "bert_base")}
        input_name = {n: m.inputs[0].name for n, m in manifests.items()}
        cfg = {"max_batch_size": 64, "max_queue_delay_us": 200, "num_runners": 2}
        # Each model on a server of its own for what the server adds: with three copies of BERT loaded in one
        # process, the same graph ran about 10% slower on the device (measured on the H200), which a shared
        # server would charge to HTTP.
        # With --busy-poll-us, a second server of the model, started with that flag, runs beside the first: the
        # concurrency-1 cells take turns between the two for --server-rounds rounds (each cell: the median of its
        # rounds' p50s), so that both see the same machine.
        variants = [("", ())] + ([(" busy-poll", ("--busy-poll-us", str(args.busy_poll_us)))]
                                 if args.busy_poll_us else [])
        for n, model_cfg in (("mlp", {**cfg, "max_batch_size": 1024}), ("bert_base", cfg)):
            with contextlib.ExitStack() as stack:
                servers = {}
                for suffix, flags in variants:
                    repo = make_repository(tmp / f"server_{n}{suffix.strip()}", {n: args.packages / f"{n}.pt2"},
                                           {n: model_cfg}, link=True)
                    servers[suffix] = Server("cpp", repo, "--allow-shared-memory", *flags)
                    stack.callback(servers[suffix].stop)
                for b in (b for m, b in CASES if m == n):
                    x = make_input(n, b, torch)
                    cells = {"http c1": {}}
                    if n == "bert_base":
                        # what a classifier client asks for: the pooled output, not 196 KiB a row
                        cells["http c1 pooler_output"] = {"outputs": ["pooler_output"]}
                        # every output into shared memory (a client on the same host): no tensor bytes in the answer
                        sizes = {o.name: b * math.prod(o.shape[1:]) * np.dtype(o.dtype).itemsize
                                 for o in manifests[n].outputs}
                        for srv in servers.values():
                            for name, size in sizes.items():
                                stack.enter_context(shm_region(srv.port, f"out_{name}_b{b}", size))
                        cells["http c1 shared memory"] = {
                            "shm_outputs": {name: (f"out_{name}_b{b}", size) for name, size in sizes.items()}}
                    for srv in servers.values():  # first capture this batch size's CUDA graphs
                        http_load(srv.port, n, x, input_name[n], 1, 1.0)
                    rounds: dict = {}
                    for r in range(args.server_rounds):
                        for suffix, srv in servers.items():
                            for key, kw in cells.items():
                                before = server_stats(srv.port, n)
                                rounds.setdefault(key + suffix, []).append(
                                    http_load(srv.port, n, x, input_name[n], 1, args.http_seconds, **kw))
                                if key == "http c1" and r == 0:  # where a request's time goes inside the server
                                    res[(n, b)]["server c1" + suffix] = stats_per_request(before,
                                                                                          server_stats(srv.port, n))
                        # the floor of each answer: the same number of bytes from a responder that does nothing
                        # else (aotc-load --loopback-bytes), in the same round
                        for key in cells:
                            rounds.setdefault("floor " + key, []).append(
                                loopback_load(rounds[key][-1]["answer_bytes"], args.http_seconds))
                    for key, loads in rounds.items():
                        res[(n, b)][key] = {**loads[0], "p50_ms": statistics.median(d["p50_ms"] for d in loads),
                                            "mean_ms": statistics.mean(d["mean_ms"] for d in loads),
                                            "p50_rounds_ms": [d["p50_ms"] for d in loads]}
                    res[(n, b)]["http c32"] = http_load(servers[""].port, n, x, input_name[n], 32, args.http_seconds)
        # Batching against unbatched serving: one server holding both, measured one after the other, so each
        # sees the same process
        configs = {"bert_base": cfg,
                   # everything queued goes at once, padded up to its CUDA-graph bucket, instead of being
                   # cut to the largest bucket it fills (docs/server.md, CUDA graphs)
                   "bert_base_padded": {**cfg, "preferred_batch_sizes": [64]},
                   "bert_base_unbatched": {"max_batch_size": 0, "num_runners": 2}}
        srv = Server("cpp", make_repository(tmp / "server_batching", {m: bert for m in configs}, configs, link=True))
        try:
            x1 = make_input("bert_base", 1, torch)
            for key, model in (("http c32 batching", "bert_base"), ("http c32 unbatched", "bert_base_unbatched"),
                               ("http c32 padded", "bert_base_padded")):
                res[("bert_base", 1)][key] = http_load(srv.port, model, x1, input_name["bert_base"], 32,
                                                       args.http_seconds)
        finally:
            srv.stop()

    n_servers = 2 if args.busy_poll_us else 1
    # loads of (1 s warm-up + --http-seconds): per server one warm-up and the rounds of each batch size's cells
    # (MLP: 1 cell; BERT, two batch sizes: 3), each cell's loopback floor per round, a concurrency-32 load per
    # batch size, the 3 batching loads; and
    # about 40 s of model loading
    loads = n_servers * (3 + 7 * args.server_rounds) + 7 * args.server_rounds + 6
    part("aotc-server", (1 + args.http_seconds) * loads + 40, server)

    for mode in ("default", "reduce-overhead", "max-autotune"):
        key = "compile" if mode == "default" else f"compile-{mode}"
        for name, b in reversed(CASES):  # BERT batch 8 first: the closest race
            def comp(name=name, b=b, mode=mode, key=key):
                torch._dynamo.reset()
                fn = torch.compile(models[name], mode=None if mode == "default" else mode)
                res[(name, b)][key] = measure(fn, make_input(name, b, torch), iters(name), torch)

            part(f"{key}:{name}:b{b}", COST_S[key] * (2 if name == "bert_base" else 1), comp)

    write_report(args.out, res, notes, torch, time.time() - t_start)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def write_report(out: Path, res: dict, notes: list[str], torch, seconds: float, quiet: bool = False) -> None:
    cols = ["eager", "compile", "compile-max-autotune", "compile-reduce-overhead", "aoti-python", "aotc-run",
            "aotc-run graphs"]
    cols += sorted({k for d in res.values() for k in d if k.startswith("aotc-run graphs,")}) + ["http c1", "http c32"]

    def cell(d, kind):
        if d is None:
            return "-"
        if "p50_ms" in d:
            if kind == "device":
                return "-"
            return f"{d['p50_ms']:.3f} ({d['req_per_s']:.0f}/s)"
        return f"{d[kind]:.3f}" if kind in d else "-"

    dev = torch.cuda.get_device_name(0)
    lines = [f"# GPU benchmark: {dev}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             "", f"Command: `bash bench/gpu.sh` (bench/gpu_models.py, {seconds:.0f} s). Median ms per call; "
             "in-process columns by CUDA events (device-resident inputs, then `host`: pinned copies in and "
             "out), and in `wall` by wall clock, host to host, synchronized after each call; aotc-run is wall "
             "clock in every table (device: `--device-inputs`); HTTP is wall clock, host to host; HTTP cells: "
             "p50 ms (requests/s).", ""]
    for kind in ("device", "host", "wall"):
        lines += [f"## {kind}", "", "| model | batch | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 2)]
        for (name, b), d in res.items():
            lines.append(f"| {name} | {b} | " + " | ".join(cell(d.get(c), kind) for c in cols) + " |")
        lines.append("")
    for (name, b), d in res.items():
        for suffix, how in (("", ""), (" busy-poll", ", server with --busy-poll-us")):
            for key, what in (("http c1", "all outputs"), ("http c1 pooler_output", "pooler_output only"),
                              ("http c1 shared memory", "all outputs into shared memory")):
                cell, floor = d.get(key + suffix), d.get("floor " + key)
                floor_text = (f" A responder that only sends the answer's {floor['answer_bytes']} bytes takes "
                              f"{floor['p50_ms']:.3f} ms at p50 on this host (aotc-load --loopback-bytes)."
                              if floor else "")
                if cell and d.get("aotc-run graphs"):
                    lines.append(f"aotc-server at concurrency 1 adds {cell['p50_ms'] - d['aotc-run graphs']['host']:.3f}"
                                 f" ms at p50 over in-process aotc-run with CUDA graphs ({name}, batch {b}, {what}"
                                 f"{how}; HTTP p50 {cell['p50_ms']:.3f} ms).{floor_text if not suffix else ''}")
                elif cell:  # aotc-run not measured in this run
                    lines.append(f"aotc-server at concurrency 1 ({name}, batch {b}, {what}{how}): HTTP p50 "
                                 f"{cell['p50_ms']:.3f} ms.{floor_text if not suffix else ''}")
    for (name, b), d in res.items():
        for suffix in ("", " busy-poll"):
            if d.get("server c1" + suffix):
                st = d["server c1" + suffix]
                lines.append(f"Inside aotc-server{' with --busy-poll-us' if suffix else ''} at concurrency 1 ({name}, "
                             f"batch {b}), mean us per request: {st['success']:.0f} from enqueue to answer = queue "
                             f"{st['queue']:.0f} + compute input {st['compute_input']:.0f} + infer "
                             f"{st['compute_infer']:.0f} + output {st['compute_output']:.0f}; the client's mean is "
                             f"{d['http c1' + suffix]['mean_ms'] * 1e3:.0f} us (HTTP, parsing and encoding: the "
                             f"difference).")
    lines.append("")
    unb = res.get(("bert_base", 1), {}).get("http c32 unbatched")
    bat = res.get(("bert_base", 1), {}).get("http c32 batching")
    if unb and bat:
        lines += [f"BERT batch-1 requests at concurrency 32, one server holding both configs: dynamic batching "
                  f"{bat['req_per_s']:.0f} req/s, unbatched {unb['req_per_s']:.0f} req/s "
                  f"({bat['req_per_s'] / unb['req_per_s']:.2f}x).", ""]
        pad = res[("bert_base", 1)].get("http c32 padded")
        if pad:
            lines += [f"Batches sent whole, padded to their CUDA-graph bucket (preferred_batch_sizes [64]): "
                      f"{pad['req_per_s']:.0f} req/s ({pad['req_per_s'] / unb['req_per_s']:.2f}x unbatched), "
                      f"p50 {pad['p50_ms']:.3f} ms.", ""]
    if notes:
        lines += ["Not measured:", ""] + [f"- {n}" for n in notes] + [""]
    text = "\n".join(lines)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(
        {"device": dev, "torch": torch.__version__, "results": {f"{n}/b{b}": d for (n, b), d in res.items()},
         "notes": notes}, indent=1))
    if not quiet:
        print(text)


if __name__ == "__main__":
    sys.exit(main())
