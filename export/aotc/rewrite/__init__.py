"""Graph rewrites applied between torch.export and AOTInductor: what Inductor cannot fuse well.

`run_rewrites` finds the patterns a rewrite handles and hands the ExportedProgram to it. Today that is
nn.EmbeddingBag (aten._embedding_bag*), rewritten by `aotc.rewrite.embedding_bag.rewrite(ep, example_inputs,
device, choice) -> (ep, report)`; when that module is absent the graph is left as is (lowering "aten").
Pure: returns a new program and a report dict (it goes into manifest["rewrites"]); one caller at a time.
"""

from __future__ import annotations

import importlib.util

EMBEDDING_BAG_OPS = ("_embedding_bag", "_embedding_bag_forward_only", "embedding_bag")


def has_embedding_bag(ep) -> bool:
    import torch

    for node in ep.graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
            if target.namespace == "aten" and target._schema.name.split("::")[-1] in EMBEDDING_BAG_OPS:
                return True
    return False


def run_rewrites(ep, example_inputs, device: str, options: dict) -> tuple[object, dict]:
    """Applies the rewrites the graph needs. options: {"embedding_bag": "auto|decompose|jagged|triton|aten",
    "measure": False to make auto pick by rule (embedding_bag.heuristic) instead of timing (aotc export --quick)}."""
    report: dict = {}
    if has_embedding_bag(ep):
        choice = options.get("embedding_bag", "auto")
        if importlib.util.find_spec("aotc.rewrite.embedding_bag") is None:
            report["embedding_bag"] = {"lowering": "aten", "candidates_ms": {},
                                       "note": "no embedding-bag rewrite installed; ATen fallback kernel"}
        else:
            from aotc.rewrite import embedding_bag

            ep, report["embedding_bag"] = embedding_bag.rewrite(ep, example_inputs, device, choice,
                                                                measure=options.get("measure", True))
    return ep, report
