"""The recommendation model of embedding_bag.py with its pooling written by hand from basic ops.

What a user writes to make embedding bags "fusable": bags padded to a [B, L] id matrix plus a mask (or
per-id weights, zero on padding), gathered with plain indexing and reduced with a masked mean / weighted
sum. It is an aotc model file (model(), example_inputs(), dynamic_shapes(), output_names()), built from
the very weights of embedding_bag.py, so both files answer alike on the same bags (`to_padded` converts
the jagged inputs). `large()` mirrors embedding_bag.large(). Stateless at call time, like any nn.Module.

Inputs: dense [B, 13] float32; user_ids, user_mask [B, Lu]; item_ids, item_mask [B, Li] (int64 ids,
float32 masks of 0/1); tag_ids, tag_weights [B, Lt] (weights 0 on padding). Output: score [B, 1].
"""

import importlib.util
from pathlib import Path

import torch
from torch import nn

_spec = importlib.util.spec_from_file_location("aotc_models_embedding_bag", Path(__file__).with_name("embedding_bag.py"))
jagged = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jagged)

MAX_BAG = 256


class DecomposedRecommendationModel(nn.Module):
    def __init__(self, source: nn.Module):
        super().__init__()
        self.user = nn.Parameter(source.tables["user"].weight.detach().clone())
        self.item = nn.Parameter(source.tables["item"].weight.detach().clone())
        self.tag = nn.Parameter(source.tables["tag"].weight.detach().clone())
        self.bottom, self.top = source.bottom, source.top

    @staticmethod
    def masked_mean(table, ids, mask):
        # table [R, D], ids [B, L], mask [B, L] -> [B, D]; an empty bag pools to zeros
        rows = table[ids] * mask.unsqueeze(2)
        return rows.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)

    def forward(self, dense, user_ids, user_mask, item_ids, item_mask, tag_ids, tag_weights):
        user = self.masked_mean(self.user, user_ids, user_mask)
        item = self.masked_mean(self.item, item_ids, item_mask)
        tag = (self.tag[tag_ids] * tag_weights.unsqueeze(2)).sum(1)  # weighted sum: [B, D]
        features = torch.cat([user, item, tag, self.bottom(dense)], dim=1)
        return self.top(features)


def model():
    return DecomposedRecommendationModel(jagged.model()).eval()


def large():
    return DecomposedRecommendationModel(jagged.large()).eval()


def to_padded(ids, offsets, weights=None):
    """Jagged ids [N] + offsets [B] -> (ids [B, L] with 0 as filler, mask or weights [B, L] with 0 there)."""
    n, b = ids.shape[0], offsets.shape[0]
    lengths = torch.diff(offsets, append=torch.tensor([n]))
    width = max(int(lengths.max()), 1) if b else 1
    pos = offsets.unsqueeze(1) + torch.arange(width)  # [B, L]
    inside = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    pos = torch.where(inside, pos, torch.zeros_like(pos)).clamp(max=max(n - 1, 0))
    padded = torch.where(inside, ids[pos] if n else torch.zeros_like(pos), torch.zeros_like(pos))
    values = inside.float() if weights is None else torch.where(inside, weights[pos], torch.zeros(()))
    return padded, values


def from_jagged(inputs):
    """embedding_bag.py's inputs -> this file's inputs (the same bags, padded)."""
    dense, user_ids, user_offsets, item_ids, item_offsets, tag_ids, tag_offsets, tag_weights = inputs
    return (dense, *to_padded(user_ids, user_offsets), *to_padded(item_ids, item_offsets),
            *to_padded(tag_ids, tag_offsets, tag_weights))


def make_inputs(batch=jagged.EXAMPLE_BATCH, **kwargs):
    """Fresh inputs for `batch` users (the model-file hook aotc uses to check parity across the batch range)."""
    return from_jagged(jagged.make_inputs(batch, **kwargs))


def example_inputs():
    return from_jagged(jagged.example_inputs())


def dynamic_shapes():
    batch = torch.export.Dim("batch", min=1, max=jagged.MAX_BATCH)
    lu, li, lt = (torch.export.Dim(f"{t}_bag_len", min=1, max=MAX_BAG) for t in ("user", "item", "tag"))
    return ({0: batch}, {0: batch, 1: lu}, {0: batch, 1: lu}, {0: batch, 1: li}, {0: batch, 1: li},
            {0: batch, 1: lt}, {0: batch, 1: lt})


def output_names():
    return ["score"]
