"""Bad model file: dynamic_shapes() names dim 3 of a 2-D input."""
import torch
from torch import nn


def model():
    return nn.Linear(4, 4)


def example_inputs():
    return (torch.randn(2, 4),)


def dynamic_shapes():
    return {"input": {3: torch.export.Dim("batch", min=1, max=8)}}
