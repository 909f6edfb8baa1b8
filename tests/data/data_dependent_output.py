"""A model whose first output is data-dependent: torch.nonzero's row count is decided by the values, so its dim 0
has no range to take a batch from (aotc once took the fresh batch sizes from it and tried batch 0). Exports
with AOTInductor; parity varies the batch of the input. (Not broken; tests/data holds it beside those that are.)"""
import torch
from torch import nn


class M(nn.Module):
    def forward(self, x):
        # x: [B, 4] -> positive: [N, 2] int64 (indices of x > 0, N decided by the data), doubled: [B, 4]
        return torch.nonzero(x > 0), x * 2


def model():
    return M().eval()


def make_inputs(batch):
    return (torch.randn(batch, 4, generator=torch.Generator().manual_seed(batch)),)


def example_inputs():
    return make_inputs(4)


def dynamic_shapes():
    return {"x": {0: torch.export.Dim("batch", min=1, max=32)}}


def output_names():
    return ["positive", "doubled"]
