"""Export failure: a Python branch on a tensor's value (data-dependent control flow)."""
import torch
from torch import nn


class M(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


def model():
    return M()


def example_inputs():
    return (torch.randn(2, 4),)
