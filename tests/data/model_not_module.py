"""Bad model file: model() returns a function, not an nn.Module."""
import torch


def model():
    return torch.relu


def example_inputs():
    return (torch.randn(2, 4),)
