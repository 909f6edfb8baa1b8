"""The embedding-bag graph pass: replaces each embedding-bag node of an ExportedProgram with a chosen lowering.

`rewrite(ep, example_inputs, device, choice) -> (ep, report)` is called by `aotc.rewrite.run_rewrites`
between torch.export and AOTInductor. Lowerings: "decompose" (padded masked reduction from basic ops, fused
by Inductor), "jagged" (gather + scatter-add over the useful rows only), "triton" (aotc's Triton kernel,
CUDA only, compiled into the package) and "aten" (ATen's kernel, an opaque fallback, graph left as is).
"auto" times the candidates for the device on the example inputs and on their bags, made longer, repeated to a
serving-sized batch (eb_measure.py), and keeps a lowering only if it beats ATen's kernel by a margin on
both, so it is never slower than ATen on what it measured.

The replacement is done by `ExportedProgram.run_decompositions` with a table holding only the embedding-bag
ops, so shapes, dynamic dims and metadata are retraced by torch itself. Not thread-safe: the decomposition
table reads the per-node plans of the one rewrite in progress.
"""

from __future__ import annotations

import time

import torch

from aotc.errors import ExportError
from aotc.rewrite import eb_lowerings as low
from aotc.rewrite.eb_nodes import EB_OPS, NodePlan, find_nodes, lower, node_args, plan_node  # noqa: F401

CHOICES = ("auto", "decompose", "jagged", "triton", "aten_sum", "aten")
_aten = torch.ops.aten


class _Decomposer:
    """Decomposition for the embedding-bag ops: called once per node, in graph order, during the retrace."""

    def __init__(self, plans: list[NodePlan]):
        self.plans, self.calls, self.lowering = plans, 0, False

    def __call__(self, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                 per_sample_weights=None, include_last_offset=False, padding_idx=-1):
        if self.lowering:  # a lowering's own call of ATen's kernel (aten_sum): kept as it is
            return NotImplemented
        plan = self.plans[self.calls]
        self.calls += 1
        assert plan.mode == mode and plan.include_last_offset == include_last_offset, "retrace order changed"
        if plan.lowering == "aten":
            return NotImplemented
        self.lowering = True
        try:
            pooled = lower(plan.lowering, plan, weight, indices, offsets, per_sample_weights)
        finally:
            self.lowering = False
        empty = indices.new_empty((0,), dtype=torch.int64)
        return pooled, empty, empty, empty  # offset2bag, bag_size, max_indices: unused (checked by plan_node)


def _normalize(ep) -> list:
    """Make every embedding-bag node `aten._embedding_bag.default` (same arguments, same outputs), so the
    retrace calls the decomposition once per node (embedding_bag.* would decompose into _embedding_bag).
    Returns what `_restore` needs to put the caller's graph back."""
    saved = [(n, n.target, n.args, n.kwargs) for n in find_nodes(ep.graph)]
    for node in find_nodes(ep.graph):
        if node.target is _aten._embedding_bag.default:
            continue
        a = node_args(node)
        pad = a.get("padding_idx")
        node.target = _aten._embedding_bag.default
        node.args = (a["weight"], a["indices"], a["offsets"], bool(a["scale_grad_by_freq"]), int(a["mode"]),
                     bool(a["sparse"]), a["per_sample_weights"], bool(a["include_last_offset"]),
                     -1 if pad is None else int(pad))
        node.kwargs = {}
    ep.graph_module.recompile()
    return saved


def _restore(ep, saved) -> None:
    for node, target, args, kwargs in saved:
        node.target, node.args, node.kwargs = target, args, kwargs
    ep.graph_module.recompile()


def candidates_for(device: str) -> list[str]:
    names = ["aten", "aten_sum", "decompose", "jagged"]
    if device.startswith("cuda") and triton_available():
        names.append("triton")
    return names


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _check_choice(choice: str, device: str) -> None:
    if choice not in CHOICES:
        raise ExportError(f"--embedding-bag {choice!r} is not a lowering; expected one of {', '.join(CHOICES)}")
    if choice == "triton" and not device.startswith("cuda"):
        raise ExportError("--embedding-bag triton needs --device cuda (aotc's Triton kernel runs on GPUs); "
                          "on cpu use auto, decompose, jagged or aten")
    if choice == "triton" and not triton_available():
        raise ExportError("--embedding-bag triton needs the triton package; install it with pip install triton")


def heuristic(device: str) -> str:
    """auto's pick without measuring (aotc export --quick): what measuring picks most often (docs/export.md,
    Embedding bags): aotc's Triton kernel on CUDA, ATen's sum path (the mean divided after) on the CPU."""
    return "triton" if device.startswith("cuda") and triton_available() else "aten_sum"


def rewrite(ep, example_inputs: tuple, device: str, choice: str, measure: bool = True):
    """Replaces every embedding-bag node of `ep` by the lowering `choice` (or the measured one, for auto;
    with `measure` False, auto takes `heuristic(device)` and times nothing).

    Returns (new ExportedProgram, report): report = {"lowering", "candidates_ms", "nodes", "details": [per
    node]}, plus "measure_s", "skipped" ({candidate: why}) and, when the example inputs have fewer bags than
    eb_measure.SCALED_BAGS, "candidates_ms_scaled" and "scaled_bags" for auto. The caller's `ep` is left as it was
    (returned as is when every node stays on ATen). Raises ExportError for an unknown or impossible choice.
    """
    _check_choice(choice, device)
    nodes = find_nodes(ep.graph)
    plans = [plan_node(n) for n in nodes]
    report = {"lowering": "aten", "candidates_ms": {}, "nodes": len(nodes)}
    lowering, t0 = choice, time.perf_counter()
    if choice == "auto" and nodes and not measure:
        lowering = heuristic(device)
        report["note"] = "not measured: --quick takes the heuristic choice"
    elif choice == "auto" and nodes:
        from aotc.rewrite import eb_measure

        try:
            measured = eb_measure.measure(ep, example_inputs, plans, candidates_for(device), device)
        except Exception as err:  # measuring is an optimisation: never fail an export over it
            why = (str(err).splitlines() or [""])[0][:200]
            measured = {"times": {"aten": 0.0}, "choice": "aten",
                        "skipped": {"all": f"measurement failed ({type(err).__name__}: {why}); kept ATen"}}
        report["candidates_ms"] = {k: round(v, 4) for k, v in measured["times"].items()}
        if "scaled_times" in measured:
            report["candidates_ms_scaled"] = {k: round(v, 4) for k, v in measured["scaled_times"].items()}
            report["scaled_bags"], report["scaled_longer"] = measured["scaled_bags"], measured["scaled_longer"]
        if measured["skipped"]:
            report["skipped"] = measured["skipped"]
        lowering = measured["choice"]
        report["measure_s"] = round(time.perf_counter() - t0, 2)
    elif choice == "auto":
        lowering = "aten"
    report["lowering"] = lowering
    if choice == "triton" and nodes:  # auto tuned the tiles while measuring
        from aotc.rewrite import eb_measure

        try:
            import aotc.kernels.embedding_bag  # noqa: F401  (registers aotc::embedding_bag)

            eb_measure.tune_for(ep, example_inputs, plans)
        except Exception as err:  # tuning is an optimisation: the default tile is correct too
            report["skipped"] = {"tile tuning": f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"}
    for plan in plans:
        plan.lowering = "aten" if plan.note else lowering
        if plan.lowering == "aten_sum" and not low.aten_sum_applies(plan.mode, plan.padding_idx):
            plan.lowering = "aten"  # what aten_sum runs for this node anyway
    report["details"] = [p.describe() for p in plans]
    if all(p.lowering == "aten" for p in plans):
        return ep, report
    if lowering == "triton":
        import aotc.kernels.embedding_bag  # noqa: F401  (registers aotc::embedding_bag)
    saved = _normalize(ep)
    decomposer = _Decomposer(plans)
    try:
        new_ep = ep.run_decompositions({_aten._embedding_bag.default: decomposer})
    finally:
        _restore(ep, saved)
    assert decomposer.calls == len(plans), f"decomposed {decomposer.calls} of {len(plans)} embedding-bag nodes"
    return new_ep, report

