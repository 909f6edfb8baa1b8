"""Bad model file: no example_inputs()."""
from torch import nn


def model():
    return nn.Linear(4, 4)
