"""A custom op with a fake kernel but no C shim: the package would call back into Python at run time."""
import torch
from torch import nn


@torch.library.custom_op("aotc_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


class M(nn.Module):
    def forward(self, x):
        return twice(x) + 1


def model():
    return M()


def example_inputs():
    return (torch.randn(2, 4),)
