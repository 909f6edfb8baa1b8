"""Bad model file: make_inputs() builds inputs other than the examples' (a different parameter)."""
import torch
from torch import nn


class M(nn.Module):
    def forward(self, x, y=None):
        return x if y is None else x + y


def model():
    return M()


def example_inputs():
    return (torch.randn(2, 4), torch.randn(2, 4))


def make_inputs(batch):
    return (torch.randn(batch, 4),)


def dynamic_shapes():
    b = torch.export.Dim("batch", min=1, max=8)
    return {"x": {0: b}, "y": {0: b}}
