"""Bad model file: forward takes one input, example_inputs() gives two."""
import torch
from torch import nn


def model():
    return nn.Linear(4, 4)


def example_inputs():
    return (torch.randn(2, 4), torch.randn(2, 4))
