"""Bad model file: example_inputs() holds a list of floats, not tensors."""
import torch
from torch import nn


def model():
    return nn.Linear(4, 4)


def example_inputs():
    return (torch.randn(2, 4), [1.0, 2.0])
