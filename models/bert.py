"""A BERT-shaped encoder: token + position embeddings, nn.TransformerEncoder, LayerNorm, a tanh pooler.

An aotc model file. `model()` is a small configuration (2 layers x 128 wide) that compiles quickly on a CPU;
`aotc export models/bert.py:bert_base` builds BERT-base's shape (12 layers x 768, 12 heads, FFN 3072).
Both take token ids [B, 128] with a dynamic batch of 1..64. Not a trained model: weights come from a fixed
seed so every call builds the same network. No state between calls.
"""

import torch
from torch import nn

SEQ_LEN = 128
VOCAB = 30522
MAX_BATCH = 64


class BertEncoder(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, ffn: int, vocab: int = VOCAB, seq_len: int = SEQ_LEN):
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(seq_len, hidden)
        self.norm = nn.LayerNorm(hidden)
        layer = nn.TransformerEncoderLayer(hidden, heads, ffn, dropout=0.0, activation="gelu", batch_first=True)
        # enable_nested_tensor=False: the nested-tensor fast path is an eager-only shortcut export cannot trace
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, input_ids: torch.Tensor):
        # input_ids: [B, L] int64 -> hidden: [B, L, H] -> pooled: [B, H] (tanh of the first token)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.norm(self.tokens(input_ids) + self.positions(positions))
        h = self.encoder(h)
        return h, torch.tanh(self.pooler(h[:, 0]))


def _build(layers: int, hidden: int, heads: int, ffn: int) -> nn.Module:
    torch.manual_seed(0)
    return BertEncoder(layers, hidden, heads, ffn).eval()


def model() -> nn.Module:
    return _build(layers=2, hidden=128, heads=4, ffn=512)


def bert_base() -> nn.Module:
    return _build(layers=12, hidden=768, heads=12, ffn=3072)


def make_inputs(batch: int) -> tuple:
    g = torch.Generator().manual_seed(batch)
    return (torch.randint(0, VOCAB, (batch, SEQ_LEN), generator=g),)


def example_inputs() -> tuple:
    return make_inputs(4)


def dynamic_shapes():
    return {"input_ids": {0: torch.export.Dim("batch", min=1, max=MAX_BATCH)}}


def output_names():
    return ["last_hidden_state", "pooler_output"]


def tolerance():
    # fp32 through a dozen layers of attention and LayerNorm: reordered sums differ by ~1e-5
    return {"atol": 1e-4, "rtol": 1e-3}
