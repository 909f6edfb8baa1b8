"""A TorchRec EmbeddingBagCollection over jagged features given as (values, lengths), returning a dict.

An aotc model file. Two features, "user" (sum-pooled) and "item" (mean-pooled), each with its own table;
forward builds the KeyedJaggedTensor from values [N] int64 (every feature's ids, feature-major) and lengths
[2*B] int64 (each bag's length: the B user bags, then the B item bags), pools it with the collection and
returns KeyedTensor.to_dict(): {"user": [B, 16], "item": [B, 16]}, outputs aotc names `user` and `item`.
N is its own dynamic dim; lengths is a derived dim (2*batch). The values and lengths must agree (N is the
sum of the lengths), so fresh inputs come from make_inputs(batch). Built from EmbeddingBagConfigs with the
tables drawn from a fixed seed (normal, std 0.1, so that pooled bags are well away from zero). Needs
torchrec (installed without its dependencies, with fbgemm-gpu-cpu). No state between calls.
"""

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType

FEATURES = ("user", "item")
TABLES = (("user", 1000, PoolingType.SUM), ("item", 2000, PoolingType.MEAN))
DIM = 16
MAX_BATCH = 64
MAX_BAG = 8


class Pooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name=f"t_{f}", embedding_dim=DIM, num_embeddings=rows, feature_names=[f],
                               pooling=pooling) for f, rows, pooling in TABLES], device=torch.device("cpu"))

    def forward(self, values: torch.Tensor, lengths: torch.Tensor) -> dict:
        # values: [N] int64, lengths: [2*B] int64 -> {"user": [B, 16], "item": [B, 16]}
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=list(FEATURES), values=values, lengths=lengths)
        return self.ebc(kjt).to_dict()


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    m = Pooled()
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.1)
    return m.eval()


def make_inputs(batch: int = 4) -> tuple:
    """Bags of 0..MAX_BAG ids per feature and row; ids below the smallest table's row count."""
    g = torch.Generator().manual_seed(batch)
    lengths = torch.randint(0, MAX_BAG + 1, (len(FEATURES) * batch,), generator=g)
    values = torch.randint(0, min(rows for _, rows, _ in TABLES), (int(lengths.sum()),), generator=g)
    return values, lengths


def example_inputs() -> tuple:
    return make_inputs(4)


def dynamic_shapes():
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    n_ids = torch.export.Dim("n_ids", min=0, max=len(FEATURES) * MAX_BATCH * MAX_BAG)
    return {"values": {0: n_ids}, "lengths": {0: 2 * batch}}
