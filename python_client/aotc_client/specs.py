"""Tensor specs read from a server's model metadata, random valid inputs generated from them, and the plan of
sizes every parity check tests a model's dynamic dims at.

A spec is what the Open Inference Protocol says about a tensor (name, datatype, shape with -1 for a
dynamic dim) plus, when known, each dim's inclusive [min, max] range and a symbol tying dynamic dims
that must agree (the batch dim of every input, say). A symbol is a name (`batch`, `seq`) or an expression
of names for a derived dim (`2*batch`, `seq + 1`), which `dim_size` evaluates. Metadata carries no ranges
or symbols; aotc servers add `ranges` per tensor, aotc manifests carry both, and the exporter's model files
supply both. `size_plan` (one dim) and `case_plan` (every dim, together and apart) are the sizes the
exporter, `aotc check` and `aotc check --url` all test. This file does no I/O and holds no state: safe to
use from any thread.
"""

import ast
from dataclasses import dataclass

import numpy as np

from . import dtypes
from .errors import AotcError

DEFAULT_DYNAMIC_RANGE = (1, 64)
FRESH_DIM_CAP = 4096  # parity checks take a dynamic dim no larger than this (its max when unbounded)
_ODD_OFFSET = 36      # lo + 36 (or 37): an odd size, neither a bound nor a power of two for the usual ranges


def size_plan(lo: int, hi: int) -> list[tuple[str, int]]:
    """The sizes every parity check tests a dynamic dim of range [lo, hi] at: ("min", lo), ("max", hi capped
    at FRESH_DIM_CAP) and, when one fits strictly between, ("odd", lo + 36 or lo + 37, else the odd size
    near the middle). The exporter, `aotc check` and `aotc check --url` all size their cases with this."""
    hi = min(hi, max(FRESH_DIM_CAP, lo))
    plan = [("min", lo), ("max", hi)]
    odd = lo + _ODD_OFFSET + (lo + 1) % 2
    if odd >= hi:
        odd = (lo + hi) // 2 | 1
    if lo < odd < hi:
        plan.append(("odd", odd))
    return plan


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str                                  # protocol datatype, e.g. "FP32"
    shape: tuple[int, ...]                         # -1 for a dynamic dim
    ranges: tuple[tuple[int, int], ...] | None = None   # inclusive [min, max] per dim
    symbols: tuple[str | None, ...] | None = None       # dynamic dims with one symbol share a size
    low: float | None = None                       # value range for generated data (inclusive low)
    high: float | None = None                      # exclusive high for ints, inclusive for floats

    def dim_range(self, i: int) -> tuple[int, int]:
        if self.shape[i] != -1:
            return (self.shape[i], self.shape[i])
        if self.ranges is not None and self.ranges[i][1] >= self.ranges[i][0] >= 0:
            return tuple(self.ranges[i])
        return DEFAULT_DYNAMIC_RANGE

    def symbol(self, i: int) -> str | None:
        if self.shape[i] != -1:
            return None
        if self.symbols is not None and self.symbols[i]:
            return self.symbols[i]
        # no symbol known: dynamic dims at one position are assumed to agree; dim 0 is taken for the batch
        return "batch" if i == 0 else f"dim{i}"


def specs_from_metadata(metadata: dict, which: str = "inputs") -> list[TensorSpec]:
    """`GET /v2/models/{m}` JSON -> specs of its inputs (or outputs)."""
    tensors = metadata.get(which)
    if not isinstance(tensors, list):
        raise AotcError(f"model metadata has no '{which}' list; got keys {sorted(metadata)}")
    specs = []
    for t in tensors:
        try:
            shape = tuple(int(d) for d in t["shape"])
            ranges = t.get("ranges")
            specs.append(TensorSpec(
                name=t["name"], datatype=t["datatype"], shape=shape,
                ranges=tuple((int(lo), int(hi)) for lo, hi in ranges) if ranges else None))
        except (KeyError, TypeError, ValueError) as e:
            raise AotcError(f"model metadata entry {t!r} is malformed ({e}); expected name, datatype, shape") from None
    return specs


def specs_from_manifest(tensors) -> list[TensorSpec]:
    """The inputs (or outputs) of an aotc manifest (docs/manifest.md: entries with name, dtype, shape, ranges
    and, for inputs, symbols, such as aotc.manifest.TensorEntry) -> specs."""
    return [TensorSpec(name=t.name, datatype=dtypes.datatype_from_name(t.dtype), shape=tuple(t.shape),
                       ranges=tuple(tuple(r) for r in t.ranges) or None,
                       symbols=tuple(t.symbols) if getattr(t, "symbols", None) else None)
            for t in tensors]


def is_name(symbol: str) -> bool:
    """A symbol that is a free size (`seq`), not an expression of others (`2*seq`)."""
    return symbol.isidentifier()


def dim_size(symbol: str, sizes: dict[str, int]) -> int:
    """The size of a dim whose symbol is a name or an expression of names (+ - * // %, whole numbers), e.g.
    `2*batch` with sizes {"batch": 3} -> 6. Raises AotcError naming what is missing or not understood."""
    if is_name(symbol):
        if symbol not in sizes:
            raise AotcError(f"no size was given for the dynamic dim '{symbol}'; pass sizes={{'{symbol}': N}}")
        return int(sizes[symbol])
    try:
        tree = ast.parse(symbol, mode="eval")
    except SyntaxError:
        raise AotcError(f"dim expression '{symbol}' is not understood; expected names, whole numbers and "
                        f"+ - * // %") from None
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return dim_size(node.id, sizes)
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise AotcError(f"dim expression '{symbol}' is not understood; expected names, whole numbers and "
                        f"+ - * // %")
    return int(ev(tree))


def symbol_ranges(specs: list[TensorSpec]) -> dict[str, tuple[int, int]]:
    """{symbol: (min, max)} of every free dynamic dim (a name, not an expression): the intersection of the
    ranges of the dims that carry it. Raises AotcError when no size fits them all."""
    bounds: dict[str, tuple[int, int]] = {}
    for s in specs:
        for i in range(len(s.shape)):
            sym = s.symbol(i)
            if sym is None or not is_name(sym):
                continue
            lo, hi = s.dim_range(i)
            old = bounds.get(sym, (lo, hi))
            bounds[sym] = (max(old[0], lo), min(old[1], hi))
    for sym, (lo, hi) in bounds.items():
        if lo > hi:
            raise AotcError(f"dynamic dim '{sym}' has no size that every input accepts (range [{lo}, {hi}])")
    return bounds


def pick_sizes(specs: list[TensorSpec], choose) -> dict[str, int]:
    """One size per dynamic symbol: `choose(lo, hi)` over the intersection of that symbol's ranges."""
    return {sym: int(choose(lo, hi)) for sym, (lo, hi) in symbol_ranges(specs).items()}


def range_sizes(specs: list[TensorSpec]) -> list[dict[str, int]]:
    """Sizes that cover the dynamic range (size_plan): every symbol at its min, at an odd size (its min when
    none fits) and at its max."""
    if not any(s.symbol(i) for s in specs for i in range(len(s.shape))):
        return [{}]
    out = []
    for label in ("min", "odd", "max"):
        sizes = pick_sizes(specs, lambda lo, hi: dict(size_plan(lo, hi)).get(label, lo))
        if sizes not in out:
            out.append(sizes)
    return out


def case_plan(ranges: dict[str, tuple[int, int]], example: dict[str, int] | None = None) -> list[tuple[str, dict]]:
    """The sizes a parity check runs, as [(label, {symbol: size})]: every dim at its min, at its max and at an
    odd size together ("min", "max", "odd"), then, with more than one dim, each dim alone at its min, max and
    odd size while the others keep their size in `example` ("seq max", ...; the dim's min where `example` lacks
    it). A size already planned is not planned twice; an odd size that does not fit a narrow range is left out."""
    plans = {sym: dict(size_plan(lo, hi)) for sym, (lo, hi) in ranges.items()}
    out: list[tuple[str, dict]] = []

    def add(label, sizes):
        if sizes and all(v is not None for v in sizes.values()) and all(sizes != s for _, s in out):
            out.append((label, sizes))

    for which in ("min", "max", "odd"):
        add(which, {sym: plan.get(which) for sym, plan in plans.items()})
    if len(plans) > 1:
        base = {sym: (example or {}).get(sym, ranges[sym][0]) for sym in plans}
        for sym, plan in plans.items():
            for which in ("min", "max", "odd"):
                if which in plan:
                    add(f"{sym} {which}", {**base, sym: plan[which]})
    return out


def shape_for(spec: TensorSpec, sizes: dict[str, int]) -> tuple[int, ...]:
    shape = []
    for i, d in enumerate(spec.shape):
        if d != -1:
            shape.append(d)
            continue
        sym = spec.symbol(i)
        try:
            shape.append(dim_size(sym, sizes))
        except AotcError as e:
            raise AotcError(f"input '{spec.name}' dim {i} is dynamic ('{sym}'): {e}") from None
    return tuple(shape)


def random_inputs(specs: list[TensorSpec], sizes: dict[str, int] | int | None = None,
                  seed: int | None = 0) -> dict[str, np.ndarray]:
    """Random arrays that satisfy `specs`. `sizes` maps dynamic symbols to sizes; an int sets every dynamic
    dim; None picks each symbol's minimum. Floats are standard normal; ints lie in [low, high), default
    [0, 10) so they stay valid as small indices; bools are fair coins."""
    if sizes is None:
        sizes = pick_sizes(specs, lambda lo, hi: lo)
    elif isinstance(sizes, int):
        sizes = {s.symbol(i): sizes for s in specs for i in range(len(s.shape)) if s.symbol(i)}
    rng = np.random.default_rng(seed)
    out = {}
    for s in specs:
        shape = shape_for(s, sizes)
        for i, n in enumerate(shape):
            lo, hi = s.dim_range(i)
            if not lo <= n <= hi:
                raise AotcError(f"input '{s.name}' dim {i} = {n} is outside its range [{lo}, {hi}]")
        out[s.name] = random_array(s.datatype, shape, rng, s.low, s.high)
    return out


def random_array(datatype: str, shape, rng: np.random.Generator, low=None, high=None) -> np.ndarray:
    if datatype == "BOOL":
        return rng.random(shape) < 0.5
    if datatype == "BYTES":
        return np.array([b"%d" % v for v in rng.integers(0, 1000, int(np.prod(shape)))], dtype=object).reshape(shape)
    npdt = dtypes.numpy_dtype(datatype)
    if dtypes.is_float(datatype):
        values = rng.standard_normal(shape, dtype=np.float32)
        if low is not None and high is not None:
            values = rng.uniform(low, high, shape).astype(np.float32)
        return dtypes.float32_to_bf16(values) if datatype == "BF16" else values.astype(npdt)
    lo = 0 if low is None else int(low)
    hi = 10 if high is None else int(high)
    info = np.iinfo(npdt)
    return rng.integers(max(lo, info.min), min(hi, int(info.max) + 1), shape, dtype=npdt)
