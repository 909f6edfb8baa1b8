"""A token model without an attention mask: it mean-pools over the whole sequence, so padding a request
changes its answer and `aotc export --seq-buckets` must refuse it. (Not broken as a file.)"""
import torch
from torch import nn


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 16)

    def forward(self, ids):
        # ids: [B, L] int64 -> per-token [B, L, 16], pooled [B, 16] (the mean over every position, padding too)
        h = self.emb(ids)
        return {"tokens": h, "pooled": h.mean(dim=1)}


def model():
    torch.manual_seed(0)
    return M().eval()


def example_inputs():
    return (torch.randint(1, 100, (4, 24), generator=torch.Generator().manual_seed(0)),)


def dynamic_shapes():
    return {"ids": {0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("seq", min=4, max=64)}}
