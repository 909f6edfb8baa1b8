"""A model whose output is about 1e-10 everywhere (as eval-mode BatchNorm at random init makes of logits):
parity within atol=1e-4 of such a reference tests nothing, so aotc calls it INCONCLUSIVE. The second output
is constant. (Not broken as a file; its outputs are trivial.)"""
import torch
from torch import nn


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        # x: [B, 8] -> logits [B, 4] (scaled to ~1e-10), probs [B, 4] (uniform: 0.25 everywhere)
        logits = self.fc(x) * 1e-10
        return {"logits": logits, "probs": torch.softmax(logits, dim=-1)}


def model():
    torch.manual_seed(0)
    return M().eval()


def example_inputs():
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),)


def dynamic_shapes():
    return {"x": {0: torch.export.Dim("batch", min=1, max=16)}}
