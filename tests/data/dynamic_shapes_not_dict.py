"""Bad model file: dynamic_shapes() returns a string."""
import torch
from torch import nn


def model():
    return nn.Linear(4, 4)


def example_inputs():
    return (torch.randn(2, 4),)


def dynamic_shapes():
    return "batch"
