"""Bad model file: example_kwargs() returns a tuple (it must be a dict of tensors by parameter name)."""
import torch
from torch import nn


class M(nn.Module):
    def forward(self, x):
        return x + 1


def model():
    return M()


def example_kwargs():
    return (torch.randn(2, 4),)
