"""Export-time measurement behind `--embedding-bag auto`: times each lowering on the model's example inputs.

`measure(ep, example_inputs, plans, candidates, device) -> {times, scaled_times, skipped, choice}` runs the
exported program once to capture the real arguments of every embedding-bag node, then times all nodes
together per candidate, on those arguments and on the same bags, made longer, repeated to a serving-sized batch:
ATen's kernel and the Triton kernel eagerly (they are already single kernels), the basic-op lowerings
through torch.compile (what Inductor makes of them is what the package runs). Each time is the best of
several calls, taken in turns across the candidates (on one thread on CPU, see below). A candidate that fails
to compile or disagrees with ATen is left out. `choose` keeps a lowering only if it beats ATen by a margin
on both workloads. Not the pass itself (embedding_bag.py). One caller at a time:
torch.compile state is process-wide.
"""

from __future__ import annotations

import functools
import time

import torch

from aotc.rewrite import eb_nodes as eb

COMPILED = ("decompose", "jagged", "aten_sum")  # timed as Inductor compiles them: their small ops fuse
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
                dt = _replay_ms(replay, calls=10, rounds=1) / 1e3
            else:
                t = time.perf_counter()
                fn()
                sync()
                dt = time.perf_counter() - t
            best[name] = min(best[name], dt)
            spent += dt
        rounds += 1
    return {name: t * 1e3 for name, t in best.items()}


def _replay_ms(replay, calls: int = 20, rounds: int = 3) -> float:
    """Best over `rounds` of the mean GPU milliseconds of `calls` replays, by CUDA events."""
    best = float("inf")
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / calls)
    return best


def tune_tiles(pairs) -> None:
    """Sets plan.tiles for each (plan, captured args) to the fastest of the kernel's `tile_candidates` on
    those arguments (CUDA-graph replays: GPU time), and plan.tile_note to what was measured. A tile that
    cannot be compiled or captured here is skipped; if none can, the plan keeps the default tile."""
    from aotc.kernels import embedding_bag as kernel

    for plan, (weight, indices, offsets, psw) in pairs:
        times = {}
        for tiles in kernel.tile_candidates(int(weight.shape[1])):
            def call(tiles=tiles):
                return kernel.pool(weight, indices, offsets, plan.mode, psw, plan.include_last_offset,
                                   plan.padding_idx, tiles=tiles)
            with torch.no_grad():
                replay = cuda_graphed(call, warmup=2)
                if replay is not None:
                    times[tiles] = _replay_ms(replay)
        if not times:
            continue
        plan.tiles = min(times, key=times.get)
        default = kernel.tile_sizes(int(weight.shape[1]), weight.element_size())
        plan.tile_note = (f"{len(times)} tiles timed: best {times[plan.tiles] * 1e3:.1f} us"
                          + (f", default {default} {times[default] * 1e3:.1f} us" if default in times else ""))


def tune_for(ep, example_inputs, plans) -> None:
    """tune_tiles for every node not kept on ATen, on the arguments it gets from the example inputs."""
    captured = capture(ep, example_inputs)
    tune_tiles([(p, args) for p, args in zip(plans, captured) if not p.note])


SCALED_BAGS = 512  # the second workload: the example's bags, LONGER_BAGS times as long, repeated up to a
LONGER_BAGS = 4    # serving-sized batch (padded lowerings pay for the longest bag: examples are often short)
MARGIN = 0.95  # a lowering replaces ATen's kernel only if at most this fraction of ATen's time everywhere


def scale_args(args: tuple, plan, bags: int, longer: int = LONGER_BAGS) -> tuple | None:
    """The node's captured (weight, indices, offsets, psw) with each bag's ids repeated `longer` times (each
    bag `longer` times as long, empty bags stay empty) and the bags then repeated until there are at least
    `bags` of them, or None when there are already that many or the offsets are not the usual consecutive
    bags starting at 0."""
    weight, indices, offsets, psw = args
    num_bags = offsets.shape[0] - 1 if plan.include_last_offset else offsets.shape[0]
    if num_bags == 0 or num_bags >= bags or indices.dim() != 1 or int(offsets[0]) != 0:
        return None
    used = int(offsets[-1]) if plan.include_last_offset else indices.shape[0]
    if used != indices.shape[0]:
        return None
    starts = offsets[:num_bags].to(torch.int64)
    lengths = torch.diff(starts, append=starts.new_tensor([used]))
    new_lengths = lengths * longer
    new_starts = torch.cumsum(new_lengths, 0) - new_lengths
    bag = torch.repeat_interleave(torch.arange(num_bags, device=starts.device), new_lengths)
    within = torch.arange(bag.shape[0], device=starts.device) - new_starts[bag]
    source = starts[bag] + within % lengths[bag]  # a bag's ids, again and again
    indices, psw = indices[source], None if psw is None else psw[source]
    offsets, used = new_starts.to(offsets.dtype), int(bag.shape[0])
    reps = -(-bags // num_bags)
    new_offsets = torch.cat([offsets + k * used for k in range(reps)])
    if plan.include_last_offset:
        new_offsets = torch.cat([new_offsets, new_offsets.new_tensor([reps * used])])
    return (weight, indices.repeat(reps), new_offsets, None if psw is None else psw.repeat(reps))


def choose(workloads: list[dict[str, float]]) -> str:
    """The lowering to keep, given {lowering: ms} per workload measured (each with "aten"): the one whose worst
    ratio to ATen over the workloads is lowest, if that ratio is at most MARGIN; else ATen. Being faster on
    the small example inputs alone is not enough: padding-based lowerings grow with the longest bag."""
    names = set.intersection(*(set(w) for w in workloads))
    worst = {n: max(w[n] / max(w["aten"], 1e-12) for w in workloads) for n in names}
    best = min(worst, key=worst.get)
    return best if best == "aten" or worst[best] <= MARGIN else "aten"


def measure(ep, example_inputs, plans, candidates, device: str) -> dict:
    """Times each candidate lowering on every node's real arguments (nodes kept on ATen are left out), on the
    example inputs and on their bags made LONGER_BAGS times as long and repeated to SCALED_BAGS; the Triton kernel runs with the tile
    `tune_tiles` picked for each node (on the example inputs).

    Returns {"times": {lowering: ms}, "scaled_times": {lowering: ms} (absent when the example is already
    that large), "scaled_bags": n, "skipped": {lowering: why}, "choice": lowering}."""
    captured = capture(ep, example_inputs)
    pairs = [(p, args) for p, args in zip(plans, captured) if not p.note]
    if not pairs:
        return {"times": {"aten": 0.0}, "skipped": {}, "choice": "aten"}
    if "triton" in candidates and device.startswith("cuda"):
        import aotc.kernels.embedding_bag  # noqa: F401  (registers the op)

        tune_tiles(pairs)
    result = {"skipped": {}}
    result["times"] = _measure_workload(pairs, candidates, device, result["skipped"])
    workloads = [result["times"]]
    scaled = [scale_args(args, plan, SCALED_BAGS) for plan, args in pairs]
    if all(s is not None for s in scaled):
        ok = [n for n in candidates if n in result["times"]]
        result["scaled_times"] = _measure_workload([(p, s) for (p, _), s in zip(pairs, scaled)], ok, device,
                                                   result["skipped"])
        result["scaled_bags"], result["scaled_longer"] = SCALED_BAGS, LONGER_BAGS
        workloads.append(result["scaled_times"])
    result["choice"] = choose(workloads)
    return result


def _measure_workload(pairs, candidates, device: str, skipped: dict) -> dict[str, float]:
    """{lowering: ms} for all nodes together on these arguments; a candidate that fails or disagrees with
    ATen goes to `skipped` with the reason instead."""

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
    # On CPU ATen's kernel goes through torch.compile too, so that every candidate pays the same Python call
    # overhead (a compiled call costs more than an eager one); on CUDA it is timed as a CUDA graph replay.
    compiled = COMPILED + (("aten",) if device == "cpu" else ())
    for name in candidates:
        fn = run_all(name)
        if name in compiled:
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
    return times


def _close(out, ref) -> bool:
    tol = 1e-4 if ref.dtype == torch.float32 else 2e-2
    return out.shape == ref.shape and torch.allclose(out.float(), ref.float(), atol=tol, rtol=tol)
