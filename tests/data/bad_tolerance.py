"""Bad model file: tolerance() returns a negative atol."""
import torch
from torch import nn


def model():
    return nn.Linear(4, 4)


def example_inputs():
    return (torch.randn(2, 4),)


def tolerance():
    return {"atol": -1.0, "rtol": 1e-4}
