"""Triton Inference Server's example model "simple": two INT32 [-1, 16] inputs -> their sum and difference.

An aotc model file. The point of this model is the protocol, not the math: clients written for Triton's
example (INPUT0, INPUT1 -> OUTPUT0, OUTPUT1) work against aotc servers unchanged. No weights, no state.
"""

import torch
from torch import nn


class Simple(nn.Module):
    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor):
        # INPUT0, INPUT1: [B, 16] int32 -> OUTPUT0 = sum, OUTPUT1 = difference: [B, 16] int32
        return INPUT0 + INPUT1, INPUT0 - INPUT1


def model() -> nn.Module:
    return Simple().eval()


def example_inputs() -> tuple:
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-1000, 1000, (4, 16), generator=g, dtype=torch.int32)
    b = torch.randint(-1000, 1000, (4, 16), generator=g, dtype=torch.int32)
    return (a, b)


def dynamic_shapes():
    batch = torch.export.Dim("batch", min=1, max=1024)
    return {"INPUT0": {0: batch}, "INPUT1": {0: batch}}


def output_names():
    return ["OUTPUT0", "OUTPUT1"]
