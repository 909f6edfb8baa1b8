"""Bad model file: example_inputs() gives the mask by position, where forward's second parameter is a cache
(as GPT-2's is); the mask must go by name (example_kwargs())."""
import torch
from torch import nn


class Cache:
    pass


class M(nn.Module):
    def forward(self, input_ids: torch.Tensor, cache: "Cache | None" = None, attention_mask=None):
        return input_ids * (1 if attention_mask is None else attention_mask)


def model():
    return M()


def example_inputs():
    return (torch.ones(2, 4, dtype=torch.int64), torch.ones(2, 4, dtype=torch.int64))
