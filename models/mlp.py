"""SimpleMLP: 512 -> 1024 -> ReLU -> 512 with a dynamic batch of 1..1024. An aotc model file.

Not a trained model: weights come from a fixed seed so every call to model() builds the same network
(parity checks in the runtime and over HTTP rebuild it from this file). No shared state; safe to import
from several processes.
"""

import torch
from torch import nn


class SimpleMLP(nn.Module):
    def __init__(self, d_in: int = 512, d_hidden: int = 1024, d_out: int = 512):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, 512] -> [B, 1024] -> [B, 512]
        return self.fc2(torch.relu(self.fc1(x)))


def model() -> nn.Module:
    torch.manual_seed(0)
    return SimpleMLP().eval()


def example_inputs() -> tuple:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(64, 512, generator=g),)


def dynamic_shapes():
    batch = torch.export.Dim("batch", min=1, max=1024)
    return {"x": {0: batch}}
