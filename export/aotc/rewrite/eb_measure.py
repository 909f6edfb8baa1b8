"""Export-time measurement behind `--embedding-bag auto`: times each lowering on the model's example inputs.

`measure(ep, example_inputs, plans, candidates, device) -> ({lowering: ms}, {lowering: why left out})` runs the exported program once
to capture the real arguments of every embedding-bag node, then times all nodes together per candidate:
ATen's kernel and the Triton kernel eagerly (they are already single kernels), the basic-op lowerings
through torch.compile (what Inductor makes of them is what the package runs). Each time is the best of
several calls, taken in turns across the candidates (on one thread on CPU, see below). A candidate that fails to
compile or disagrees with ATen is left out. Not the pass itself (embedding_bag.py). One caller at a time:
torch.compile state is process-wide.
"""

from __future__ import annotations

import functools
import time

import torch

from aotc.rewrite import embedding_bag as eb

COMPILED = ("decompose", "jagged")
_BUDGET_S = 0.5  # timing budget for all candidates together, after warm-up


def capture(ep, example_inputs) -> list[tuple]:
    """(weight, indices, offsets, per_sample_weights) of each embedding-bag node, in graph order."""
    gm = ep.module()
    found = []

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            if n.op == "call_function" and n.target in eb.EB_OPS:
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                names = [a.name for a in n.target._schema.arguments]
                bound = dict(zip(names, args)) | kwargs
                found.append((bound["weight"], bound["indices"], bound["offsets"], bound.get("per_sample_weights")))
            return super().run_node(n)

    with torch.no_grad():
        Recorder(gm).run(*example_inputs)
    return found


_CAPTURABLE = ("aten", "triton")  # one kernel launch each, no host sync


def cuda_graphed(fn, warmup: int = 1):
    """fn captured in a CUDA graph (its replay), or None when it cannot be (a host sync, e.g. a length read
    from data). `warmup` calls on a side stream come first, as capture requires.

    A CUDA package runs its kernels from C++ and, with a dynamic batch, replays them as a CUDA graph: timing
    the Python call would rank the candidates by their Python launch cost, which the package does not pay."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay
    except Exception:  # noqa: BLE001  (any capture failure means: time it as a plain call)
        torch.cuda.synchronize()
        return None


def _time_all(fns: dict, device: str) -> dict[str, float]:
    """Best-of-N milliseconds per call of each fn(), timed round-robin so that load from other processes
    falls on every candidate alike (the minimum is the estimate least disturbed by it). On CUDA a candidate
    that can be captured in a CUDA graph is timed by CUDA events around replays of it (GPU time)."""
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    # Only single-kernel candidates are captured: a failed capture (a host sync inside a compiled candidate)
    # can leave the CUDA generator in capture state and break the compile that follows the measurement.
    graphs = {name: cuda_graphed(fn) for name, fn in fns.items() if name in _CAPTURABLE} if cuda else {}
    best = {name: float("inf") for name in fns}
    spent, rounds = 0.0, 0
    while (spent < _BUDGET_S and rounds < 100) or rounds < 5:
        for name, fn in fns.items():
            replay = graphs.get(name)
            if replay is not None:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(10):
                    replay()
                end.record()
                end.synchronize()
                dt = start.elapsed_time(end) / 10 / 1e3
            else:
                t = time.perf_counter()
                fn()
                sync()
                dt = time.perf_counter() - t
            best[name] = min(best[name], dt)
            spent += dt
        rounds += 1
    return {name: t * 1e3 for name, t in best.items()}


def measure(ep, example_inputs, plans, candidates, device: str) -> tuple[dict[str, float], dict[str, str]]:
    """Times each candidate lowering on every node's real arguments (nodes kept on ATen are left out)."""
    captured = capture(ep, example_inputs)
    pairs = [(p, args) for p, args in zip(plans, captured) if not p.note]
    if not pairs:
        return {"aten": 0.0}, {}

    def run_all(name):
        def call(*flat):
            outs = []
            for i, (plan, _) in enumerate(pairs):
                weight, indices, offsets, psw = flat[4 * i: 4 * i + 4]
                outs.append(eb.lower(name, plan, weight, indices, offsets, psw))
            return outs
        return call

    flat = [t for _, args in pairs for t in args]
    with torch.no_grad():
        reference = run_all("aten")(*flat)
    ready: dict = {}
    skipped: dict[str, str] = {}
    for name in candidates:
        fn = run_all(name)
        if name in COMPILED:
            fn = torch.compile(fn, dynamic=False)
        try:
            if name == "triton":
                import aotc.kernels.embedding_bag  # noqa: F401  (registers the op)
            with torch.no_grad(), torch._dynamo.config.patch(capture_scalar_outputs=True):
                outs = fn(*flat)  # compiles, and warms up
                fn(*flat)
            if not all(_close(o, r) for o, r in zip(outs, reference)):
                skipped[name] = "differs from ATen on the example inputs"
                continue
            ready[name] = functools.partial(fn, *flat)
        except Exception as err:  # a candidate that cannot run here is not a candidate; say why
            skipped[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
    # On CPU the timing runs on one thread: on a loaded machine ATen's OpenMP loops stall on descheduled
    # threads (x100 on this 2-core box), which would rank the candidates by the load, not by their code.
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    try:
        with torch.no_grad(), torch._dynamo.config.patch(capture_scalar_outputs=True):
            times = _time_all(ready, device)
    finally:
        torch.set_num_threads(threads)
    torch._dynamo.reset()
    return times, skipped


def _close(out, ref) -> bool:
    tol = 1e-4 if ref.dtype == torch.float32 else 2e-2
    return out.shape == ref.shape and torch.allclose(out.float(), ref.float(), atol=tol, rtol=tol)
