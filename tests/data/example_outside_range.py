"""Bad model file: the example batch (16) lies outside its own Dim range [1, 8]."""
import torch
from torch import nn


def model():
    return nn.Linear(4, 4)


def example_inputs():
    return (torch.randn(16, 4),)


def dynamic_shapes():
    return {"input": {0: torch.export.Dim("batch", min=1, max=8)}}
