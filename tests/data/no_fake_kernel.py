"""Export failure: a custom op with no fake (meta) kernel cannot be traced."""
import torch
from torch import nn


@torch.library.custom_op("aotc_test::twice_nofake", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class M(nn.Module):
    def forward(self, x):
        return twice(x) + 1


def model():
    return M()


def example_inputs():
    return (torch.randn(2, 4),)
