"""Bad model file: example_kwargs() names a parameter forward does not have."""
import torch
from torch import nn


class M(nn.Module):
    def forward(self, x):
        return x + 1


def model():
    return M()


def example_kwargs():
    return {"x": torch.randn(2, 4), "mask": torch.ones(2, 4)}
