"""Bad model file: dynamic_shapes() keys an input that forward does not have."""
import torch
from torch import nn


def model():
    return nn.Linear(4, 4)


def example_inputs():
    return (torch.randn(2, 4),)


def dynamic_shapes():
    return {"inputs": {0: torch.export.Dim("batch", min=1, max=8)}}
