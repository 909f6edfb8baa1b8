"""Datatype names: the manifest's (numpy-style), the protocol's (KServe v2) and numpy dtypes.

This file is a table and lookups, nothing else; it is pure and safe to use from any thread.
BF16 has no numpy dtype: it travels as raw 2-byte words and is widened to float32 for comparison.
"""

import numpy as np

from .errors import AotcError

# protocol datatype -> (manifest dtype name, numpy dtype, bytes per element)
_TABLE = {
    "BOOL": ("bool", np.dtype(np.bool_), 1),
    "UINT8": ("uint8", np.dtype(np.uint8), 1),
    "UINT16": ("uint16", np.dtype("<u2"), 2),
    "UINT32": ("uint32", np.dtype("<u4"), 4),
    "UINT64": ("uint64", np.dtype("<u8"), 8),
    "INT8": ("int8", np.dtype(np.int8), 1),
    "INT16": ("int16", np.dtype("<i2"), 2),
    "INT32": ("int32", np.dtype("<i4"), 4),
    "INT64": ("int64", np.dtype("<i8"), 8),
    "FP16": ("float16", np.dtype("<f2"), 2),
    "BF16": ("bfloat16", np.dtype("<u2"), 2),  # raw words; see bf16_to_float32
    "FP32": ("float32", np.dtype("<f4"), 4),
    "FP64": ("float64", np.dtype("<f8"), 8),
}
_FROM_NAME = {name: dt for dt, (name, _, _) in _TABLE.items()}
_FROM_NUMPY = {npdt: dt for dt, (_, npdt, _) in _TABLE.items() if dt != "BF16"}

DATATYPES = tuple(_TABLE) + ("BYTES",)


def _unknown(what: str, value) -> AotcError:
    return AotcError(f"unknown {what} {value!r}; expected one of {', '.join(sorted(_TABLE))}")


def datatype_from_name(name: str) -> str:
    """Manifest dtype name ('float32') -> protocol datatype ('FP32')."""
    try:
        return _FROM_NAME[name]
    except KeyError:
        raise AotcError(f"unknown dtype name {name!r}; expected one of {', '.join(sorted(_FROM_NAME))}") from None


def name_from_datatype(datatype: str) -> str:
    """Protocol datatype ('FP32') -> manifest dtype name ('float32')."""
    try:
        return _TABLE[datatype][0]
    except KeyError:
        raise _unknown("datatype", datatype) from None


def numpy_dtype(datatype: str) -> np.dtype:
    """Protocol datatype -> the numpy dtype its bytes are stored as (BF16: uint16 words)."""
    try:
        return _TABLE[datatype][1]
    except KeyError:
        raise _unknown("datatype", datatype) from None


def datatype_of(array: np.ndarray) -> str:
    """numpy array -> protocol datatype."""
    try:
        return _FROM_NUMPY[array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype]
    except KeyError:
        raise AotcError(f"numpy dtype {array.dtype} has no protocol datatype; "
                        f"use one of {', '.join(str(d) for d in _FROM_NUMPY)}") from None


def element_size(datatype: str) -> int:
    try:
        return _TABLE[datatype][2]
    except KeyError:
        raise _unknown("datatype", datatype) from None


def is_float(datatype: str) -> bool:
    return datatype in ("FP16", "BF16", "FP32", "FP64")


def bf16_to_float32(words: np.ndarray) -> np.ndarray:
    """BF16 words (uint16) -> float32 values (exact)."""
    return (words.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> BF16 words, round to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)
