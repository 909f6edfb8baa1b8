"""Embedding-bag benchmark: ATen eager, AOTInductor with ATen's kernel, and each aotc lowering, on one device.

Part 1 (kernel): the reference shape of shared/BASELINES.md (CPU: 1,000,000 x 64 fp32 table, 2048 bags of
1..64 ids; CUDA: 2,000,000 x 128 fp16, 4096 bags of 1..64), mean pooling with offsets. Each lowering is
exported, rewritten by aotc's pass and compiled by AOTInductor, then timed from the package; the time is
shown next to the useful bandwidth (bytes of table rows the bags need / time) and the copy bandwidth
measured in the same run. Part 2 (model): models/embedding_bag.py end to end, eager vs plain AOTI (no
rewrite) vs the aotc package (`aotc export`, lowering chosen by auto).

    .venv/bin/python bench/embedding_bag.py --device cpu [--threads 1] [--json out.json] [--skip-model]
    python bench/embedding_bag.py --device cuda   # on the GPU machine

A benchmark, not a test: it asserts nothing and runs one thing at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
SHAPES = {"cpu": (1_000_000, 64, torch.float32, 2048), "cuda": (2_000_000, 128, torch.float16, 4096)}


def timer(fn, device: str, reps: int = 50) -> float:
    """Median milliseconds per call (CUDA: triton's do_bench, GPU time)."""
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=50, rep=300, return_mode="median")
    for _ in range(3):
        fn()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e3


def graph_timer(fn) -> float | None:
    """Median GPU milliseconds of fn() replayed from a CUDA graph (no launch overhead: what aotc's runtime does
    for a CUDA package with CUDA graphs on), or None when fn cannot be captured."""
    from triton.testing import do_bench

    from aotc.rewrite.eb_measure import cuda_graphed

    replay = cuda_graphed(fn, warmup=3)
    if replay is None:  # a host sync inside fn: report it, time the plain call only
        print("    (not capturable in a CUDA graph)", flush=True)
        return None
    return do_bench(replay, warmup=50, rep=300, return_mode="median")


def copy_gbs(device: str, nbytes: int = 256 << 20) -> float:
    """Copy bandwidth, GB/s counting read + write."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return 2 * nbytes / (timer(lambda: dst.copy_(src), device, reps=20) * 1e-3) / 1e9


class Bag(nn.Module):
    def __init__(self, rows, dim, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.bag = nn.EmbeddingBag(rows, dim, mode="mean").to(dtype)

    def forward(self, ids, offsets):  # ids [N], offsets [B] -> [B, D]
        return self.bag(ids, offsets)


def reference_inputs(rows, batch, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 65, (batch,), generator=g)
    offsets = torch.cumsum(lengths, 0) - lengths
    ids = torch.randint(0, rows, (int(lengths.sum()),), generator=g)
    return ids.to(device), offsets.to(device)


def compile_package(ep, path: str, device: str, freezing: bool | None = None) -> callable:
    """AOTInductor, loaded by PyTorch's Python runner. freezing None: on for CPU (for the kernel part, where it
    makes the ATen baseline as fast as AOTI gets), else as given; PyTorch's own default is off."""
    freezing = device == "cpu" if freezing is None else freezing
    configs = {"freezing": True} if freezing else {}
    torch._inductor.aoti_compile_and_package(ep, package_path=path, inductor_configs=configs)
    return torch._inductor.aoti_load_package(path)


def kernel_bench(device: str, lowerings: list[str], tmp: str) -> list[dict]:
    from aotc.rewrite import eb_lowerings as low
    from aotc.rewrite import embedding_bag as eb

    rows, dim, dtype, batch = SHAPES[device]
    model = Bag(rows, dim, dtype).to(device).eval()
    ids, offsets = reference_inputs(rows, batch, device)
    useful = ids.numel() * dim * model.bag.weight.element_size()
    with torch.no_grad():
        want = model(ids, offsets).float()
    shapes = ({0: torch.export.Dim("n", min=1, max=64 * batch)}, {0: torch.export.Dim("b", min=1, max=batch)})
    ep = torch.export.export(model, (ids, offsets), dynamic_shapes=shapes)
    results = []

    def record(name, fn, capturable=False):
        with torch.no_grad():
            err = (fn().float() - want).abs().max().item()
            ms = timer(fn, device)
            graph_ms = graph_timer(fn) if device == "cuda" and capturable else None
        results.append({"variant": name, "ms": ms, "useful_gbs": useful / (ms * 1e-3) / 1e9, "max_abs_err": err,
                        "graph_ms": graph_ms,
                        "graph_useful_gbs": useful / (graph_ms * 1e-3) / 1e9 if graph_ms else None})
        line = f"  {name:<28} {ms:8.3f} ms  {results[-1]['useful_gbs']:8.1f} GB/s useful"
        if graph_ms:
            line += f" | CUDA graph replay {graph_ms:8.4f} ms {results[-1]['graph_useful_gbs']:8.1f} GB/s useful"
        print(line + f"  (err {err:.1e})", flush=True)

    print(f"reference shape: {rows} x {dim} {dtype}, {batch} bags of 1..64 ids, mean; "
          f"{useful / 1e6:.1f} MB of useful rows", flush=True)
    # Only the eager single-kernel calls are replayed from a CUDA graph: PyTorch's Python AOTI runner refuses
    # capture, and a failed capture leaves the CUDA generator unusable for the compiles that follow.
    record("eager ATen embedding_bag", lambda: model(ids, offsets), capturable=True)
    a = low.EbArgs(model.bag.weight, ids, offsets, low.MODE_MEAN)
    for name in lowerings:
        if name == "triton":
            from aotc.kernels import embedding_bag as kernel

            record("eager aotc Triton kernel", lambda: kernel.pool(a.weight, ids, offsets, low.MODE_MEAN),
                   capturable=True)
            if device == "cuda":
                sweep = tile_sweep(kernel, a, useful)
        t = time.perf_counter()
        new_ep, report = eb.rewrite(ep, (ids, offsets), device, name)
        if name == "triton":
            tiles = report["details"][0].get("tiles")
            print(f"    (export-time tuning on these inputs chose {tiles})", flush=True)
        runner = compile_package(new_ep, os.path.join(tmp, f"eb_{name}.pt2"), device)
        print(f"    (AOTI compile of {name}: {time.perf_counter() - t:.0f} s)", flush=True)
        label = "AOTI, ATen kernel (fallback)" if name == "aten" else f"AOTI, aotc {name}"
        record(label, lambda: runner(ids, offsets))
    if device == "cuda" and "triton" in lowerings:
        results.append({"variant": "tile sweep", "tiles": sweep})
    return results


def tile_sweep(kernel, a, useful: int) -> list[dict]:
    """Times the Triton kernel at every tile export-time tuning may pick (`tile_candidates`): the call by
    do_bench and its CUDA-graph replay (GPU time only), to show what tuning chooses from."""
    default = kernel.tile_sizes(a.weight.shape[1], a.weight.element_size())
    rows = []
    for tiles in kernel.tile_candidates(a.weight.shape[1]):
        def call(tiles=tiles):
            return kernel.pool(a.weight, a.indices, a.offsets, a.mode, tiles=tiles)
        ms = timer(call, "cuda")
        graph_ms = graph_timer(call)
        rows.append({"tiles": list(tiles), "ms": ms, "graph_ms": graph_ms})
        mark = " (default)" if tiles == default else ""
        graph = f", replay {graph_ms * 1e3:.1f} us {useful / (graph_ms * 1e-3) / 1e9:.0f} GB/s" if graph_ms else ""
        print(f"    tiles BLOCK_L, BLOCK_D, warps = {tiles}: {ms * 1e3:.1f} us, "
              f"{useful / (ms * 1e-3) / 1e9:.0f} GB/s{graph}{mark}", flush=True)
    return rows


def round_robin_ms(fns: dict, device: str, rounds: int = 25, calls: int = 10) -> dict[str, float]:
    """Median over `rounds` of the wall-clock ms per call (`calls` calls, synchronized at the end) of each
    fn, the variants taking turns within every round, so that load from other processes falls on all alike."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    samples = {k: [] for k in fns}
    with torch.no_grad():
        for fn in fns.values():  # warm-up
            for _ in range(3):
                fn()
        sync()
        for _ in range(rounds):
            for label, fn in fns.items():
                t = time.perf_counter()
                for _ in range(calls):
                    fn()
                sync()
                samples[label].append((time.perf_counter() - t) / calls * 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}


def model_bench(device: str, spec: str, batch: int, tmp: str, with_decomposed: bool = True) -> list[dict]:
    """The recommendation model end to end: eager, plain AOTI (no rewrite; and with freezing on CUDA), the
    aotc package; optionally the hand-decomposed model eagerly and as an aotc package. Timed round-robin."""
    from aotc.load_model import import_file

    rec = import_file(str(REPO / "models" / "embedding_bag.py"))

    name = spec.partition(":")[2] or "model"
    model = getattr(rec, name)().to(device).eval()
    example = tuple(x.to(device) for x in rec.example_inputs())
    inputs = tuple(x.to(device) for x in rec.make_inputs(batch=batch, max_bag=64, seed=1))
    with torch.no_grad():
        want = model(*inputs)
    print(f"model {spec}, batch {batch}, bags of 0..64 ids", flush=True)
    fns = {"eager": lambda: model(*inputs)}
    ep = torch.export.export(model, example, dynamic_shapes=rec.dynamic_shapes())
    # plain AOTI as a user wires it by hand (PyTorch's defaults: no freezing), and with freezing
    plain = compile_package(ep, os.path.join(tmp, "plain.pt2"), device, freezing=False)
    fns["plain AOTI (ATen fallback kernels)"] = lambda: plain(*inputs)
    frozen = compile_package(ep, os.path.join(tmp, "plain_frozen.pt2"), device, freezing=True)
    fns["plain AOTI, freezing"] = lambda: frozen(*inputs)
    runner = aotc_export(spec, os.path.join(tmp, "aotc.pt2"), device)
    if runner:
        fns["aotc package (aotc export)"] = lambda: runner(*inputs)
    if with_decomposed:  # the same model, pooling written by hand from basic ops (padded ids + mask)
        dec = import_file(str(REPO / "models" / "embedding_bag_decomposed.py"))
        padded = tuple(x.to(device) for x in dec.from_jagged(tuple(x.cpu() for x in inputs)))
        dmodel = getattr(dec, name)().to(device).eval()
        fns["eager, hand-decomposed (padded+mask)"] = lambda: dmodel(*padded)
        dspec = spec.replace("embedding_bag.py", "embedding_bag_decomposed.py")
        drunner = aotc_export(dspec, os.path.join(tmp, "decomposed.pt2"), device)
        if drunner:
            fns["aotc package, hand-decomposed"] = lambda: drunner(*padded)
    times = round_robin_ms(fns, device)
    results = []
    for label, fn in fns.items():
        with torch.no_grad():
            err = (fn() - want).abs().max().item()
        results.append({"variant": label, "ms": times[label], "max_abs_err": err})
        print(f"  {label:<40} {times[label]:8.3f} ms  (err {err:.1e})", flush=True)
    if device == "cuda":
        profile_calls("plain AOTI", lambda: plain(*inputs))
        if runner:
            profile_calls("aotc package", lambda: runner(*inputs))
    return results


def profile_calls(label: str, fn, calls: int = 20) -> None:
    """Prints what `calls` calls of fn spend, per op and kernel (torch.profiler, CPU and CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"  profile of {label}: {len(kernels) / calls:.1f} GPU activities per call", flush=True)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=70),
          flush=True)


def aotc_export(spec: str, out: str, device: str, embedding_bag: str = "auto"):
    """Runs `aotc export` as a user would; returns the package loaded by AOTInductor's own loader, as plain
    AOTI is (aotc's Python Runner adds input validation that the C++ runtime does natively), or None."""
    # --static-batches none: this measures the lowering in the one graph AOTInductor's loader runs ("model");
    # CUDA exports would otherwise also compile a static graph per batching bucket
    r = subprocess.run([sys.executable, "-m", "aotc.cli", "export", spec, "-o", out, "--device", device,
                        "--embedding-bag", embedding_bag, "--static-batches", "none"],
                       cwd=REPO, capture_output=True, text=True)
    chosen = [line for line in r.stdout.splitlines() if line.startswith(("rewrite", "   "))]
    if r.returncode != 0 or chosen:
        print("   ", spec, "\n    ".join(chosen) if chosen else r.stderr[-2000:], flush=True)
    if r.returncode != 0:
        return None
    runner = torch._inductor.aoti_load_package(out)
    return lambda *xs: runner(*xs)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--lowerings", default=None, help="comma list; default: every lowering for the device")
    p.add_argument("--model", default="models/embedding_bag.py", help="model spec for part 2")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--skip-model", action="store_true")
    p.add_argument("--skip-kernel", action="store_true")
    p.add_argument("--skip-decomposed", action="store_true", help="leave out embedding_bag_decomposed.py")
    p.add_argument("--threads", type=int, help="torch CPU threads (1 gives steady numbers on a loaded machine)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from aotc.loader import ensure_libstdcxx_global
    from aotc.rewrite import embedding_bag as eb

    ensure_libstdcxx_global()  # before any package is loaded (shared/GPU.md)
    lowerings = args.lowerings.split(",") if args.lowerings else eb.candidates_for(args.device)
    info = {"device": torch.cuda.get_device_name() if args.device == "cuda" else f"cpu x{os.cpu_count()}",
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "load_avg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
    print(json.dumps(info), flush=True)
    info["copy_gbs"] = copy_gbs(args.device)
    print(f"copy bandwidth (read+write): {info['copy_gbs']:.1f} GB/s", flush=True)
    with tempfile.TemporaryDirectory(prefix="aotc-bench-") as tmp:
        if not args.skip_kernel:
            info["kernel"] = kernel_bench(args.device, lowerings, tmp)
        if not args.skip_model:
            info["model"] = model_bench(args.device, args.model, args.batch, tmp, not args.skip_decomposed)
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
