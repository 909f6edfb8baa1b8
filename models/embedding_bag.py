"""A recommendation model: jagged bags of sparse ids pooled by nn.EmbeddingBag, dense features, an MLP head.

This is an aotc model file (model(), example_inputs(), dynamic_shapes(), output_names()); `large()` is the
same architecture with tables sized for benchmarks (`aotc export models/embedding_bag.py:large`). It is not a
trained model: weights are seeded so that every call to model() builds the same numbers.

Inputs, for a batch of B users:
  dense          [B, 13] float32   dense features
  user_ids       [N0] int64        ids of the users' histories, bags delimited by user_offsets
  user_offsets   [B] int64         start of each bag in user_ids (bags may be empty)
  item_ids       [N1] int64        ids of candidate items, bags delimited by item_offsets
  item_offsets   [B] int64
  tag_ids        [N2] int64        tag ids with a weight each (pooled by weighted sum)
  tag_offsets    [B] int64
  tag_weights    [N2] float32
Output: score [B, 1] float32 (a logit).
Each N is a dynamic dim of its own (the number of ids depends on the data), B is the dynamic batch.
The model holds no state between calls; it is as thread-safe as any nn.Module in eval mode.
"""

import torch
from torch import nn

DENSE_FEATURES = 13
# (name, rows, dim, mode) of each table; the "tag" table pools with per-sample weights.
SMALL_TABLES = (("user", 4000, 32, "mean"), ("item", 20000, 32, "mean"), ("tag", 500, 32, "sum"))
LARGE_TABLES = (("user", 1_000_000, 64, "mean"), ("item", 2_000_000, 64, "mean"), ("tag", 50_000, 64, "sum"))
MAX_BATCH = 1024
MAX_IDS = 1024 * 64  # per table: at most 64 ids per bag on average
EXAMPLE_BATCH = 8
EXAMPLE_MAX_BAG = 12


class RecommendationModel(nn.Module):
    def __init__(self, tables=SMALL_TABLES, hidden=64):
        super().__init__()
        torch.manual_seed(0)
        self.tables = nn.ModuleDict(
            {name: nn.EmbeddingBag(rows, dim, mode=mode) for name, rows, dim, mode in tables}
        )
        for table in self.tables.values():
            nn.init.normal_(table.weight, std=0.1)
        self.bottom = nn.Sequential(nn.Linear(DENSE_FEATURES, hidden), nn.ReLU())
        pooled_dim = sum(dim for _, _, dim, _ in tables)
        self.top = nn.Sequential(
            nn.Linear(pooled_dim + hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden // 2), nn.ReLU(),
            nn.Linear(hidden // 2, 1),
        )

    def forward(self, dense, user_ids, user_offsets, item_ids, item_offsets, tag_ids, tag_offsets, tag_weights):
        # each pooled: [B, dim]; dense: [B, 13] -> [B, hidden]
        user = self.tables["user"](user_ids, user_offsets)
        item = self.tables["item"](item_ids, item_offsets)
        tag = self.tables["tag"](tag_ids, tag_offsets, per_sample_weights=tag_weights)
        features = torch.cat([user, item, tag, self.bottom(dense)], dim=1)
        return self.top(features)


def model():
    return RecommendationModel(SMALL_TABLES).eval()


def large():
    return RecommendationModel(LARGE_TABLES, hidden=256).eval()


def jagged_ids(generator, batch, rows, max_bag, min_bag=0):
    """Random bags: ids [N] int64 in [0, rows), offsets [batch] int64 (start of each bag)."""
    lengths = torch.randint(min_bag, max_bag + 1, (batch,), generator=generator)
    offsets = torch.cumsum(lengths, 0) - lengths
    ids = torch.randint(0, rows, (int(lengths.sum()),), generator=generator)
    return ids, offsets


def make_inputs(batch=EXAMPLE_BATCH, max_bag=EXAMPLE_MAX_BAG, seed=0, tables=SMALL_TABLES):
    """Inputs for `batch` users; ids are drawn from the first rows of each table, so they fit every variant."""
    g = torch.Generator().manual_seed(seed)
    rows = {name: r for name, r, _, _ in SMALL_TABLES}
    dense = torch.randn(batch, DENSE_FEATURES, generator=g)
    user_ids, user_offsets = jagged_ids(g, batch, rows["user"], max_bag, min_bag=1)
    item_ids, item_offsets = jagged_ids(g, batch, rows["item"], max_bag)  # some bags are empty
    tag_ids, tag_offsets = jagged_ids(g, batch, rows["tag"], max_bag, min_bag=1)
    tag_weights = torch.rand(tag_ids.shape[0], generator=g)
    return (dense, user_ids, user_offsets, item_ids, item_offsets, tag_ids, tag_offsets, tag_weights)


def example_inputs():
    return make_inputs()


def dynamic_shapes():
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    n_user = torch.export.Dim("n_user_ids", min=0, max=MAX_IDS)
    n_item = torch.export.Dim("n_item_ids", min=0, max=MAX_IDS)
    n_tag = torch.export.Dim("n_tag_ids", min=0, max=MAX_IDS)
    return (
        {0: batch}, {0: n_user}, {0: batch}, {0: n_item}, {0: batch}, {0: n_tag}, {0: batch}, {0: n_tag},
    )


def output_names():
    return ["score"]
