"""Servers, CPU: aotc-server vs FastAPI+eager vs FastAPI+AOTI (vs KServe's Python model server when given)
on the MLP with batch-1 requests at concurrency 1, 8, 32 in one run, plus each server's process-start-to-
ready time. Prints a markdown table with its command, date and machine (and writes it to --out), as
docs/performance.md shows it.

    .venv/bin/python bench/servers.py [--package .cache/pkgs/mlp.pt2] [--duration 10] [--out FILE]

Servers run one at a time during start-up timing and side by side (idle) during the load, which is sent
to one server at a time by aotc_client.bench. Not a unit test: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.join(ROOT, ".venv", "bin")
sys.path.insert(0, os.path.join(ROOT, "python_client"))

from aotc_client import bench  # noqa: E402

KSERVE_MODEL = '''
# KServe's Python model server on the eager MLP, written as its docs show (kserve.Model + ModelServer).
import sys, torch, kserve
sys.path.insert(0, {root!r} + "/export"); sys.path.insert(0, {root!r} + "/python_client")
from aotc.load_model import load_model_file
class MLP(kserve.Model):
    def __init__(self):
        super().__init__("mlp"); self.model = load_model_file({root!r} + "/models/mlp.py").model; self.ready = True
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300.0) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/v2/models/mlp/ready", timeout=2) as r:
                if r.status == 200:
                    return time.perf_counter() - start
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url} not ready after {timeout:g} s")


def server_commands(repo: str, model_file: str, aotc_server: str | None, kserve_python: str | None) -> dict:
    aotc = os.path.join(VENV_BIN, "aotc")
    cmds = {}
    if aotc_server:
        cmds["aotc-server"] = lambda p: [aotc_server, "--model-repository", repo, "--http-port", str(p)]
    cmds["FastAPI+eager"] = lambda p: [aotc, "serve", "--python", "--eager", model_file, "--name", "mlp",
                                       "--http-port", str(p)]
    cmds["FastAPI+AOTI"] = lambda p: [aotc, "serve", "--python", repo, "--http-port", str(p)]
    if kserve_python:
        script = os.path.join(repo, "kserve_mlp.py")
        with open(script, "w") as f:
            f.write(KSERVE_MODEL.format(root=ROOT))
        cmds["KServe"] = lambda p: [kserve_python, script, "--http_port", str(p), "--enable_grpc", "false",
                                    "--configure_logging", "false", "--enable_latency_logging", "false"]
    return cmds


def start(cmd: list[str], env: dict) -> tuple[subprocess.Popen, str, float]:
    port = free_port()
    argv = cmd(port)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        return proc, url, wait_ready(url, proc)
    except RuntimeError as e:
        stop(proc)
        err = proc.stderr.read().decode(errors="replace")[-800:] if proc.stderr else ""
        raise RuntimeError(f"{' '.join(argv)}: {e}\n{err}") from None


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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


def measure(cmds: dict, env: dict, concurrency: list[int], duration: float) -> tuple[dict, dict, list]:
    """Starts every server (one at a time, so each start-up has the machine to itself), loads them, stops them."""
    procs, names, ready = [], {}, {}
    try:
        for name, cmd in cmds.items():
            try:
                proc, url, seconds = start(cmd, env)
            except RuntimeError as e:
                print(f"{name}: skipped: {e}")
                continue
            procs.append(proc)
            names[url], ready[name] = name, seconds
            print(f"{name}: ready in {seconds:.2f} s at {url}", flush=True)
        levels = bench.run(list(names), "mlp", concurrency, duration)
    finally:
        for proc in procs:
            stop(proc)
    return names, ready, levels


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--package", default=os.path.join(ROOT, ".cache", "pkgs", "mlp.pt2"))
    p.add_argument("--model-file", default=os.path.join(ROOT, "models", "mlp.py"))
    p.add_argument("--aotc-server", default=shutil.which("aotc-server", path=VENV_BIN))
    p.add_argument("--kserve-python", help="a Python with kserve installed (skipped when not given)")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--omp-threads", default="unset", help="comma-separated OMP_NUM_THREADS settings to run, "
                   "each for every server, e.g. unset,1 (default: unset)")
    p.add_argument("--out", help="also write the table here")
    args = p.parse_args()
    if not os.path.exists(args.package):
        sys.exit(f"{args.package} not found; export it first: .venv/bin/aotc export models/mlp.py -o {args.package}")
    if not args.aotc_server:
        print("aotc-server not found (build it with `make build`, or pass --aotc-server); measuring the rest")
    repo = tempfile.mkdtemp(prefix="aotc-bench-repo-")
    os.makedirs(os.path.join(repo, "mlp", "1"))
    shutil.copy(args.package, os.path.join(repo, "mlp", "1", "model.pt2"))
    cmds = server_commands(repo, args.model_file, args.aotc_server, args.kserve_python)
    lines = []
    try:
        for threads in args.omp_threads.split(","):
            env = dict(os.environ)
            env.pop("OMP_NUM_THREADS", None)
            if threads != "unset":  # AOTI's OpenMP kernels suffer most when the cores are oversubscribed
                env["OMP_NUM_THREADS"] = threads
            names, ready, levels = measure(cmds, env, bench.parse_concurrency(args.concurrency), args.duration)
            lines += [f"OMP_NUM_THREADS {threads}, every server:", "", table(names, ready, levels), ""]
            first = next(iter(ready))
            for other in ready:
                if other != first:
                    lines += ratios(names, ready, levels, first, other)
            lines.append("")
    finally:
        shutil.rmtree(repo, ignore_errors=True)
    cpu = platform.processor() or platform.machine()
    load = os.getloadavg()[1]  # a shared machine's other work shows up here, and in every number above
    lines += [f"{time.strftime('%Y-%m-%d', time.gmtime())}, {platform.node()}: {os.cpu_count()} cores ({cpu}), "
              f"{args.duration:g} s per level after 0.5 s warm-up, batch-1 binary requests, load from one "
              f"aotc_client.bench process on the same machine; 5-minute load average at the end: {load:.1f}.",
              f"Command: `{' '.join(['.venv/bin/python bench/servers.py', *sys.argv[1:]])}`"]
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
