"""Bad model file: no model() function."""
import torch


def example_inputs():
    return (torch.randn(2, 4),)
