"""Servers, CPU: aotc-server vs FastAPI+eager vs FastAPI+AOTI (vs KServe's Python model server when given)
on the MLP with batch-1 requests at concurrency 1, 8, 32 in one run, plus each server's process-start-to-
ready time. Prints a markdown table with its command, date and machine (and writes it to --out), as
docs/performance.md shows it.

    .venv/bin/python bench/servers.py [--package .cache/pkgs/mlp.pt2] [--duration 10] [--out FILE]

bench/launch.py starts the servers (aotc-server: $AOTC_SERVER_BIN, else where its find_binary finds it; a
server that cannot start is skipped with the reason). They start one at a time, so that each start-up has
the machine to itself, and stay up side by side (idle) during the load, which aotc_client.bench sends to
one server at a time. Not a unit test: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from aotc_client import bench
from launch import REPO, LaunchError, Server, make_repository

KSERVE_MODEL = '''
# KServe's Python model server on the eager MLP, written as its docs show (kserve.Model + ModelServer). It
# imports the model file itself, so the KServe Python needs torch and kserve, not aotc.
import importlib.util, torch, kserve
spec = importlib.util.spec_from_file_location("mlp_model", {model_file!r})
mlp = importlib.util.module_from_spec(spec); spec.loader.exec_module(mlp)
class MLP(kserve.Model):
    def __init__(self):
        super().__init__("mlp"); self.model = mlp.model().eval(); self.ready = True
    def get_input_types(self):
        return [{{"name": "x", "datatype": "FP32", "shape": [-1, 512]}}]
    def get_output_types(self):
        return [{{"name": "output0", "datatype": "FP32", "shape": [-1, 512]}}]
    def predict(self, payload, headers=None):
        x = torch.from_numpy(payload.inputs[0].as_numpy().copy())
        with torch.inference_mode():
            y = self.model(x).numpy()
        out = kserve.InferOutput("output0", list(y.shape), "FP32"); out.set_data_from_numpy(y, binary_data=True)
        return kserve.InferResponse(model_name="mlp", infer_outputs=[out], response_id=payload.id or "")
kserve.ModelServer().start([MLP()])
'''


def server_specs(repo: Path, model_file: str, kserve_python: str | None) -> dict[str, tuple]:
    """name -> (kind, repository, flags, command) for bench/launch.py's Server."""
    specs = {"aotc-server": ("cpp", repo, (), None),
             "FastAPI+eager": ("python-eager", model_file, ("--name", "mlp"), None),
             "FastAPI+AOTI": ("python", repo, (), None)}
    if kserve_python:
        script = repo.parent / "kserve_mlp.py"
        script.write_text(KSERVE_MODEL.format(model_file=os.path.abspath(model_file)))
        specs["KServe"] = ("kserve", None, (), lambda port: [
            kserve_python, str(script), "--http_port", str(port), "--enable_grpc", "false",
            "--configure_logging", "false", "--enable_latency_logging", "false"])
    return specs


def table(names: dict, ready: dict, levels: list) -> str:
    rows = ["| server | ready (s) | concurrency | req/s | p50 ms | p90 ms | p99 ms | max ms | errors |",
            "|---|---|---|---|---|---|---|---|---|"]
    for lv in levels:
        r = lv.row()
        name = names[lv.url]
        rows.append(f"| {name} | {ready[name]:.2f} | {lv.concurrency} | {r['throughput']:.0f} | {r['p50_ms']:.2f} | "
                    f"{r['p90_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.2f} | {r['errors']} |")
    return "\n".join(rows)


def ratios(names: dict, ready: dict, levels: list, base: str, other: str) -> list[str]:
    by = {(names[lv.url], lv.concurrency): lv for lv in levels}
    out = []
    for c in sorted({lv.concurrency for lv in levels}):
        a, b = by.get((base, c)), by.get((other, c))
        if a and b and b.throughput and a.latencies_ms:
            out.append(f"- concurrency {c}: {base} {a.throughput / b.throughput:.1f}x the throughput of {other}, "
                       f"p99 {a.pct(99) / b.pct(99):.2f}x")
    if base in ready and other in ready:
        out.append(f"- ready: {base} {ready[base]:.2f} s, {other} {ready[other]:.2f} s "
                   f"({ready[other] / ready[base]:.1f}x sooner)")
    return out


def measure(specs: dict, env: dict, concurrency: list[int], duration: float) -> tuple[dict, dict, list]:
    """Starts every server (one at a time, so each start-up has the machine to itself), loads them, stops them."""
    servers, names, ready = [], {}, {}
    try:
        for name, (kind, repository, flags, command) in specs.items():
            try:
                srv = Server(kind, repository, *flags, ready_timeout=300, ready_path="/v2/models/mlp/ready",
                             env=env, command=command)
            except LaunchError as e:
                print(f"{name}: skipped: {e}")
                continue
            servers.append(srv)
            names[srv.url], ready[name] = name, srv.ready_s
            print(f"{name}: ready in {srv.ready_s:.2f} s at {srv.url}", flush=True)
        levels = bench.run(list(names), "mlp", concurrency, duration)
    finally:
        for srv in servers:
            srv.stop()
    return names, ready, levels


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--package", default=str(REPO / ".cache" / "pkgs" / "mlp.pt2"))
    p.add_argument("--model-file", default=str(REPO / "models" / "mlp.py"))
    p.add_argument("--kserve-python", help="a Python with kserve installed (skipped when not given)")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--omp-threads", default="unset", help="comma-separated OMP_NUM_THREADS settings to run, "
                   "each for every server, e.g. unset,1 (default: unset)")
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args()
    if not os.path.exists(args.package):
        sys.exit(f"{args.package} not found; export it first: .venv/bin/aotc export models/mlp.py -o {args.package}")
    tmp = Path(tempfile.mkdtemp(prefix="aotc-bench-repo-"))
    specs = server_specs(make_repository(tmp / "repo", {"mlp": args.package}), args.model_file, args.kserve_python)
    lines = []
    try:
        for threads in args.omp_threads.split(","):
            env = dict(os.environ)
            env.pop("OMP_NUM_THREADS", None)
            if threads != "unset":  # AOTI's OpenMP kernels suffer most when the cores are oversubscribed
                env["OMP_NUM_THREADS"] = threads
            names, ready, levels = measure(specs, env, bench.parse_concurrency(args.concurrency), args.duration)
            lines += [f"OMP_NUM_THREADS {threads}, every server:", "", table(names, ready, levels), ""]
            first = next(iter(ready))
            for other in ready:
                if other != first:
                    lines += ratios(names, ready, levels, first, other)
            lines.append("")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cpu = platform.processor() or platform.machine()
    load = os.getloadavg()[1]  # a shared machine's other work shows up here, and in every number above
    lines += [f"{time.strftime('%Y-%m-%d', time.gmtime())}, {platform.node()}: {os.cpu_count()} cores ({cpu}), "
              f"{args.duration:g} s per level after 0.5 s warm-up, batch-1 binary requests, load from one "
              f"aotc_client.bench process on the same machine; 5-minute load average at the end: {load:.1f}.",
              f"Command: `{' '.join(['.venv/bin/python bench/servers.py', *sys.argv[1:]])}`"]
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
