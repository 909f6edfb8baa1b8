"""Bad model file: forward returns a dict (outputs must be a tensor or a tuple of tensors)."""
import torch
from torch import nn


class M(nn.Module):
    def forward(self, x):
        return {"y": x + 1}


def model():
    return M()


def example_inputs():
    return (torch.randn(2, 4),)
