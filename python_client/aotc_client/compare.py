"""The one definition of parity in aotc: how far outputs are from a reference, and the default tolerances.

Parity means, elementwise, that a value equals its reference (NaN matches NaN, an infinity matches the same
infinity) or that both are finite and abs(a - b) <= atol + rtol * abs(b), b being the reference. Shapes
and dtypes must agree; bool and integer outputs must be equal. max_rel is reported only over elements
whose reference is significant (abs(b) > atol). The C++ runtime's aotc::compare (aotc-run's self-check)
follows the same rule, and tests/test_compare_rule.py holds the two to each other.

A comparison passes vacuously when its reference is trivial at the tolerance (`trivial`): float values all
within atol of zero, or constant to within the tolerance, so that a package of zeros (or of that constant)
would pass too. Such a comparison is `ok` under the rule but its verdict is "trivial"; the checks built on
it (aotc export, aotc check) call a run whose every comparison of an output is trivial INCONCLUSIVE.
Pure functions, no state.
"""

from dataclasses import dataclass

import numpy as np

from .errors import ParityError

# (atol, rtol) by dtype when neither the manifest nor the model file gives a tolerance; the exporter's
# defaults for --dtype fp32/fp16/bf16 are these too. Bool and integer dtypes compare exactly.
DEFAULT_TOLERANCE = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}


def default_tolerance(dtype) -> tuple[float, float]:
    """(atol, rtol) for a numpy dtype or a manifest dtype name; integers and bools: exact."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return DEFAULT_TOLERANCE.get(name, (0.0, 0.0))


@dataclass
class Comparison:
    name: str
    shape: tuple
    max_abs: float
    max_rel: float
    mismatched: int      # elements outside tolerance (or shape/dtype disagreement: all)
    total: int
    atol: float
    rtol: float
    problem: str = ""    # set when shapes or dtypes disagree
    trivial: str = ""    # set when the reference tests nothing at this tolerance (trivial())

    @property
    def ok(self) -> bool:
        return self.mismatched == 0 and not self.problem

    @property
    def verdict(self) -> str:
        """"ok", "MISMATCH", or "trivial" (within tolerance, of a reference that tests nothing)."""
        return "MISMATCH" if not self.ok else ("trivial" if self.trivial else "ok")

    def line(self) -> str:
        detail = self.problem or (f"max abs {self.max_abs:.3g}  max rel {self.max_rel:.3g}  "
                                  f"(atol {self.atol:g}, rtol {self.rtol:g}; {self.mismatched}/{self.total} outside)")
        why = f" (reference {self.trivial})" if self.trivial and self.ok else ""
        return f"{self.name:<12} {str(list(self.shape)):<16} {detail}  {self.verdict}{why}"


def trivial(expected: np.ndarray, atol: float, rtol: float) -> str:
    """Why a float reference tests nothing at (atol, rtol), '' when it does: every finite value within atol of
    zero, or all values within the tolerance of one constant (a package answering that constant would pass).
    Integer and bool references (compared exactly) and empty or one-value ones are never trivial by spread."""
    b = np.asarray(expected)
    if b.dtype.kind != "f" or b.size == 0:
        return ""
    finite = b[np.isfinite(b)].astype(np.float64)
    if finite.size == 0:
        return ""
    scale = float(np.abs(finite).max())
    if scale <= atol:
        return f"is within atol {atol:g} of zero everywhere (max |value| {scale:.3g})"
    spread = float(finite.max() - finite.min())
    if b.size > 1 and spread <= atol + rtol * scale:
        return f"is constant to within the tolerance (values {float(finite.min()):.4g}..{float(finite.max()):.4g})"
    return ""


def compare_array(name: str, actual: np.ndarray, expected: np.ndarray,
                  atol: float | None = None, rtol: float | None = None) -> Comparison:
    """`actual` against the reference `expected` under the rule in the module docstring. atol/rtol None:
    default_tolerance of the reference's dtype. bfloat16 has no numpy dtype: widen both sides to float32."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    d_atol, d_rtol = default_tolerance(expected.dtype)
    atol = d_atol if atol is None else float(atol)
    rtol = d_rtol if rtol is None else float(rtol)
    problem = ""
    if actual.shape != expected.shape:
        problem = f"shape {list(actual.shape)}, expected {list(expected.shape)}"
    elif actual.dtype != expected.dtype:
        problem = f"dtype {actual.dtype}, expected {expected.dtype}"
    if problem:
        return Comparison(name, actual.shape, float("inf"), float("inf"), expected.size, expected.size, atol, rtol,
                          problem=problem)
    exact = expected.dtype.kind in "biu"
    if exact:
        atol = rtol = 0.0
    why_trivial = trivial(expected, atol, rtol)
    if expected.size == 0:
        return Comparison(name, actual.shape, 0.0, 0.0, 0, 0, atol, rtol)
    a = actual.astype(np.float64)
    b = expected.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # integers in their own dtype: as doubles, int64 values past 2**53 that differ can compare equal
        same = (actual == expected) if exact else (a == b) | (np.isnan(a) & np.isnan(b))
        diff = np.where(same, 0.0, np.abs(a - b))
        diff = np.where(np.isnan(diff), np.inf, diff)
        within = same if exact else same | (np.isfinite(a) & np.isfinite(b) & (diff <= atol + rtol * np.abs(b)))
        significant = ~same & (np.abs(b) > atol)
        rel = diff[significant] / np.abs(b[significant])
        rel = np.where(np.isnan(rel), np.inf, rel)
    return Comparison(name, actual.shape, float(diff.max()), float(rel.max()) if rel.size else 0.0,
                      int((~within).sum()), expected.size, atol, rtol, trivial=why_trivial)


def compare_outputs(actual: dict, expected: dict, atol: float | None = None,
                    rtol: float | None = None) -> list[Comparison]:
    """Compare every expected output; a missing one is a mismatch."""
    out = []
    for name, ref in expected.items():
        if name not in actual:
            ref = np.asarray(ref)
            out.append(Comparison(name, ref.shape, float("inf"), float("inf"), ref.size, ref.size,
                                  atol or 0.0, rtol or 0.0, problem=f"missing; got {sorted(actual)}"))
            continue
        out.append(compare_array(name, actual[name], ref, atol, rtol))
    return out


def assert_close(actual: dict, expected: dict, atol: float | None = None, rtol: float | None = None,
                 what: str = "outputs") -> list[Comparison]:
    """compare_outputs, raising ParityError naming every output that differs."""
    results = compare_outputs(actual, expected, atol, rtol)
    bad = [r for r in results if not r.ok]
    if bad:
        raise ParityError(f"{what} differ from the reference: " + "; ".join(r.line() for r in bad))
    return results
