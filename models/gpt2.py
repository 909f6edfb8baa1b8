"""A Hugging Face GPT-2 language-model head (transformers' GPT2LMHeadModel), its inputs given by name.

An aotc model file. GPT-2's forward takes (input_ids, cache, attention_mask, ...): its second parameter is
the key/value cache, so the mask cannot go by position; example_kwargs() and make_inputs() give both inputs
by name. forward returns CausalLMOutputWithCrossAttentions, whose one tensor leaf is `logits` [B, L, V]
(use_cache=False: no cache comes back). Batch and sequence length are dynamic; make_inputs(batch, seq) pads
rows on the right. Built from a small GPT2Config (2 layers x 64 wide, a 1000-token vocabulary) with random
weights from a fixed seed, nothing downloaded; GPT-2's init gives logits of std ~0.16, not near zero.
Needs the transformers package. No state between calls.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB = 1000
MAX_BATCH = 8
MIN_SEQ, MAX_SEQ = 4, 128


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=MAX_SEQ, n_embd=64, n_layer=2, n_head=2, use_cache=False,
                     bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg).eval()


def make_inputs(batch: int = 2, seq: int = 16) -> dict:
    """{'input_ids': [B, L] int64, 'attention_mask': [B, L] int64 (1 for tokens, 0 for right padding)}."""
    g = torch.Generator().manual_seed(batch * 1000 + seq)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    lengths = torch.randint(max(1, seq // 2), seq + 1, (batch,), generator=g)
    mask = (torch.arange(seq).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)
    return {"input_ids": ids, "attention_mask": mask}


def example_kwargs() -> dict:
    return make_inputs(2, 16)


def dynamic_shapes():
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    seq = torch.export.Dim("seq", min=MIN_SEQ, max=MAX_SEQ)
    return {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}


def tolerance():
    return {"atol": 1e-4, "rtol": 1e-3}
