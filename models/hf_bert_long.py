"""models/hf_bert.py with sequences up to 512 tokens (BERT's own maximum) instead of 128.

The same BertModel, inputs and tolerance; only the position table and the dynamic sequence dim reach 512.
`base()` is BERT-base's shape, for measuring sequence buckets where a batch of the longest sequences keeps
a GPU busy computing (bench/seq_buckets.py --lengths 8:512). Needs the transformers package. No state
between calls.
"""

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("aotc_model_hf_bert", Path(__file__).with_name("hf_bert.py"))
_bert = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bert)

MAX_SEQ = 512
make_inputs = _bert.make_inputs
example_inputs = _bert.example_inputs
tolerance = _bert.tolerance


def model() -> torch.nn.Module:
    return _bert._build(MAX_SEQ, **_bert.SMALL)


def base() -> torch.nn.Module:
    return _bert._build(MAX_SEQ, **_bert.BASE)


def dynamic_shapes():
    batch = torch.export.Dim("batch", min=1, max=_bert.MAX_BATCH)
    seq = torch.export.Dim("seq", min=_bert.MIN_SEQ, max=MAX_SEQ)
    return {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
