"""Bad model file: output_names() gives two names for a model with one output."""
import torch
from torch import nn


def model():
    return nn.Linear(4, 4)


def example_inputs():
    return (torch.randn(2, 4),)


def output_names():
    return ["a", "b"]
