"""A Hugging Face BERT (transformers' BertModel) with an attention mask, returning its ModelOutput as it is.

An aotc model file, to show what a Hugging Face model needs: nothing but this file. forward takes
(input_ids, attention_mask) by position and returns BaseModelOutputWithPoolingAndCrossAttentions, whose
leaves aotc names by key: `last_hidden_state` [B, L, H] and `pooler_output` [B, H]. Both the batch B and
the sequence length L are dynamic, and make_inputs(batch, seq) builds masks with right padding, so parity
tests every (batch, seq) corner. pack_model(model) is the same BERT on packed rows, for `aotc export
--seq-pack input_ids:1,attention_mask:1=128` (aotc.seq_pack). Built from a small BertConfig (2 layers x 64 wide) with random weights from
a fixed seed: nothing is downloaded, and BERT's own init (normal, std 0.02; LayerNorm at the end of each
layer) keeps the outputs of unit scale, not near zero. `base()` is BERT-base's shape. Needs the
transformers package. No state between calls.
"""

import torch
from transformers import BertConfig, BertModel

VOCAB = 1000
MAX_BATCH = 16
MIN_SEQ, MAX_SEQ = 8, 128


def _build(max_seq: int = MAX_SEQ, **config) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, max_position_embeddings=max_seq, attn_implementation="sdpa", **config)
    return BertModel(cfg).eval()


SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)


def model() -> torch.nn.Module:
    return _build(**SMALL)


def base() -> torch.nn.Module:
    return _build(**BASE)


class Packed(torch.nn.Module):
    """A BertModel on rows that each hold several sequences one after the other (aotc.seq_pack): a token attends
    to the unmasked tokens of its own segment only and takes its position within it, so each segment's answer
    is the one BertModel gives that sequence alone, so a row may be longer than the longest sequence. The pooler
    runs on every token; the answer for a sequence is at its first."""

    def __init__(self, bert: BertModel):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask, segment_ids, position_ids):
        # each [R, P] int64 -> last_hidden_state [R, P, H], pooler_output [R, P, H]
        same = segment_ids[:, :, None] == segment_ids[:, None, :]  # [R, P, P]
        keep = same & (attention_mask[:, None, :] > 0)
        # the filler after a row's segments (segment 0) attends to itself, so no row of the softmax is empty
        eye = torch.eye(input_ids.shape[1], dtype=torch.bool, device=input_ids.device)
        keep = keep | ((segment_ids == 0)[:, :, None] & eye)
        # token types given, not taken from BertModel's buffer of max_position_embeddings: a row may be longer
        h = self.bert(input_ids, attention_mask=keep[:, None], token_type_ids=torch.zeros_like(input_ids),
                      position_ids=position_ids).last_hidden_state
        pooled = self.bert.pooler.activation(self.bert.pooler.dense(h))
        return {"last_hidden_state": h, "pooler_output": pooled}


def pack_model(model: BertModel) -> torch.nn.Module:
    return Packed(model)


def make_inputs(batch: int = 4, seq: int = 32) -> tuple:
    """ids [B, L] int64; attention_mask [B, L] int64, 1 for the first tokens of each row, 0 for its padding."""
    g = torch.Generator().manual_seed(batch * 1000 + seq)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    lengths = torch.randint(max(1, seq // 2), seq + 1, (batch,), generator=g)
    mask = (torch.arange(seq).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)
    return ids, mask


def example_inputs() -> tuple:
    return make_inputs(4, 32)


def dynamic_shapes():
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    seq = torch.export.Dim("seq", min=MIN_SEQ, max=MAX_SEQ)
    return {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}


def tolerance():
    # fp32 through attention and LayerNorm: reordered sums differ by ~1e-6 at unit scale
    return {"atol": 1e-4, "rtol": 1e-3}
