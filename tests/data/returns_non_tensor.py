"""Bad model file: forward returns a dict with a leaf that is not a tensor (every output leaf must be one)."""
import torch
from torch import nn


class M(nn.Module):
    def forward(self, x):
        return {"y": x + 1, "stats": {"count": 3}}


def model():
    return M()


def example_inputs():
    return (torch.randn(2, 4),)
