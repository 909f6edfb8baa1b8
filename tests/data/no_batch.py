"""A model with no dynamic dim at all (every input static): --static-batches has no batch to specialize, so
`aotc tune` drops that variant with the reason. (Not broken as a file.)"""
import torch
from torch import nn


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), nn.Tanh()).eval()


def example_inputs():
    return (torch.randn(2, 16, generator=torch.Generator().manual_seed(0)),)
