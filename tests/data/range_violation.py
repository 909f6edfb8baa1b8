"""Export failure: the model only works for an even batch, but dynamic_shapes() declares 1..64."""
import torch
from torch import nn


class M(nn.Module):
    def forward(self, x):
        # x: [B, 4] -> [B/2, 8]: needs B even
        return x.reshape(x.shape[0] // 2, 8) if x.shape[0] % 2 == 0 else x.reshape(-1, 8)


def model():
    return M()


def example_inputs():
    return (torch.randn(4, 4),)


def dynamic_shapes():
    return {"x": {0: torch.export.Dim("batch", min=1, max=64)}}
