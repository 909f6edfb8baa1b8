"""What the embedding-bag pass knows about each embedding-bag node of a graph, and the lowering it becomes.

`plan_node(node)` reads one node (mode, options, table shape, whether its bags come from a fixed-length
[B, L] input) into a NodePlan; `lower(lowering, plan, ...)` computes the pooled bags by one lowering, and is
what both the pass (embedding_bag.py) and the measurement behind --embedding-bag auto (eb_measure.py) run.
Pure functions of their arguments; no state.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from aotc.rewrite import eb_lowerings as low

_aten = torch.ops.aten
# ops torch.export emits for nn.EmbeddingBag (before and after core-ATen decomposition), in schema order
# (weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset, padding_idx)
EB_OPS = (_aten.embedding_bag.default, _aten.embedding_bag.padding_idx, _aten._embedding_bag.default,
          _aten._embedding_bag_forward_only.default)


@dataclass
class NodePlan:
    """What the pass knows about one embedding-bag node and how it lowers it."""

    name: str
    mode: int
    has_psw: bool
    include_last_offset: bool
    padding_idx: int
    fixed_length: int | None  # L when the bags come from a 2-D [B, L] input, else None (jagged, with offsets)
    rows: int
    dim: int
    dtype: str
    lowering: str = "aten"
    note: str = ""
    tiles: tuple[int, int, int] | None = None  # the Triton kernel's (BLOCK_L, BLOCK_D, num_warps), tuned
    tile_note: str = ""

    def describe(self) -> dict:
        return {"node": self.name, "mode": low.MODE_NAMES[self.mode], "per_sample_weights": self.has_psw,
                "include_last_offset": self.include_last_offset,
                "padding_idx": None if self.padding_idx < 0 else self.padding_idx,
                "bags": f"fixed[{self.fixed_length}]" if self.fixed_length else "jagged",
                "table": [self.rows, self.dim], "dtype": self.dtype, "lowering": self.lowering,
                **({"tiles": {"block_l": self.tiles[0], "block_d": self.tiles[1], "num_warps": self.tiles[2],
                              "tuning": self.tile_note}}
                   if self.lowering == "triton" and self.tiles else {}),
                **({"note": self.note} if self.note else {})}


def find_nodes(graph) -> list:
    return [n for n in graph.nodes if n.op == "call_function" and n.target in EB_OPS]


def node_args(node) -> dict:
    """The node's arguments by schema name, defaults filled in."""
    schema = node.target._schema
    out = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            out[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        else:
            out[arg.name] = arg.default_value if arg.has_default_value() else None
    return out


def _fixed_length(indices, offsets) -> int | None:
    """L when indices = view/reshape(x [B, L], -1) and offsets = arange(0, B*L, L): nn.EmbeddingBag's 2-D input."""
    if not (isinstance(indices, torch.fx.Node) and isinstance(offsets, torch.fx.Node)):
        return None
    if offsets.target not in (_aten.arange.start_step, _aten.arange.start_out):
        return None
    step = offsets.args[2] if len(offsets.args) > 2 else None
    if not isinstance(step, int) or step < 1 or offsets.args[0] != 0:
        return None
    if indices.target not in (_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default):
        return None
    source = indices.args[0].meta.get("val") if isinstance(indices.args[0], torch.fx.Node) else None
    if source is None or source.dim() != 2 or source.shape[1] != step:
        return None
    return step


def plan_node(node) -> NodePlan:
    a = node_args(node)
    weight = a["weight"].meta["val"]
    pad = a.get("padding_idx")
    pad = -1 if pad is None else int(pad)
    if pad < 0 and pad != -1:
        pad = weight.shape[0] + pad  # ATen accepts negative padding_idx counted from the end
    plan = NodePlan(
        name=node.name, mode=int(a["mode"]), has_psw=a["per_sample_weights"] is not None,
        include_last_offset=bool(a["include_last_offset"]), padding_idx=pad,
        fixed_length=_fixed_length(a["indices"], a["offsets"]), rows=int(weight.shape[0]),
        dim=int(weight.shape[1]), dtype=str(weight.dtype).replace("torch.", ""),
    )
    # torch.export keeps getitem nodes for all four outputs; only those with users of their own matter
    extra_used = [u for u in node.users if u.target is not operator.getitem or (u.args[1] != 0 and u.users)]
    if extra_used:
        plan.note = "uses offset2bag/bag_size/max_indices outputs; kept on ATen"
    return plan


def eb_args(plan: NodePlan, weight, indices, offsets, psw) -> low.EbArgs:
    """Canonical arguments for the lowerings; fixed-length bags get their [B, L] shape back."""
    if plan.fixed_length:
        length = plan.fixed_length
        indices = indices.reshape(-1, length)
        psw = None if psw is None else psw.reshape(-1, length)
        return low.EbArgs(weight, indices, None, plan.mode, psw, False, plan.padding_idx)
    return low.EbArgs(weight, indices, offsets, plan.mode, psw, plan.include_last_offset, plan.padding_idx)


def lower(lowering: str, plan: NodePlan, weight, indices, offsets, psw) -> torch.Tensor:
    """The pooled bags [B, D] computed by `lowering` (any of CHOICES but auto)."""
    if lowering == "triton":
        from aotc.kernels import embedding_bag as kernel

        return kernel.pool(weight, indices, offsets, plan.mode, psw, plan.include_last_offset, plan.padding_idx,
                           tiles=plan.tiles)
    a = eb_args(plan, weight, indices, offsets, psw)
    if lowering == "decompose":
        return low.decompose(a)
    if lowering == "jagged":
        return low.jagged(a)
    if lowering in ("aten", "aten_sum"):
        a = low.EbArgs(weight, indices, offsets, plan.mode, psw, plan.include_last_offset, plan.padding_idx)
        return low.reference(a) if lowering == "aten" else low.aten_sum(a)
    raise AssertionError(f"unknown lowering {lowering}")


