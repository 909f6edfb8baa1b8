"""A token embedding lookup whose answer is the size of BERT-base's at batch 1: ids [B, 128] int64 -> [B, 128, 768].

An aotc model file for measuring what a transport adds to a large answer without a model's compute in the way:
exported in fp16 (`--dtype fp16`), its answer at batch 1 is 192 KiB, last_hidden_state's size for BERT-base
(models/bert.py) at batch 1. bench/perf_analyzer.py serves it beside BERT (bench/gpu.sh, stage pa). Weights
come from a fixed seed; every token id in [0, 1000) gives a distinct non-zero row.
"""

import torch
from torch import nn

SEQ, HIDDEN, VOCAB = 128, 768, 1000


class EmbeddingAnswer(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, HIDDEN)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.emb(input_ids) * 0.5


def model() -> nn.Module:
    torch.manual_seed(0)
    return EmbeddingAnswer().eval()


def example_inputs() -> tuple:
    g = torch.Generator().manual_seed(1)
    return (torch.randint(0, VOCAB, (2, SEQ), generator=g),)


def dynamic_shapes():
    return {"input_ids": {0: torch.export.Dim("batch", min=1, max=64)}}
