"""Bad model file: example_inputs() returns a bare tensor instead of a tuple."""
import torch
from torch import nn


def model():
    return nn.Linear(4, 4)


def example_inputs():
    return torch.randn(2, 4)
