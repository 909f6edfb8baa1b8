"""Dtype-aware comparison of outputs against a reference: the one definition of parity in aotc.

Parity means abs(a - b) <= atol + rtol * abs(b) elementwise (b is the reference), with NaN matching NaN
and infinities matching exactly. Integer and bool outputs must be equal. Pure functions, no state.
"""

from dataclasses import dataclass

import numpy as np

from .errors import ParityError

# Defaults by dtype when neither the manifest nor the model file gives a tolerance.
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
    problem: str = ""    # set when shapes or kinds disagree

    @property
    def ok(self) -> bool:
        return self.mismatched == 0 and not self.problem

    def line(self) -> str:
        verdict = "ok" if self.ok else "MISMATCH"
        detail = self.problem or (f"max abs {self.max_abs:.3g}  max rel {self.max_rel:.3g}  "
                                  f"(atol {self.atol:g}, rtol {self.rtol:g}; {self.mismatched}/{self.total} outside)")
        return f"{self.name:<12} {str(list(self.shape)):<16} {detail}  {verdict}"


def compare_array(name: str, actual: np.ndarray, expected: np.ndarray,
                  atol: float | None = None, rtol: float | None = None) -> Comparison:
    actual, expected = np.asarray(actual), np.asarray(expected)
    d_atol, d_rtol = default_tolerance(expected.dtype)
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    if actual.shape != expected.shape:
        return Comparison(name, actual.shape, float("inf"), float("inf"), expected.size, expected.size, atol, rtol,
                          problem=f"shape {list(actual.shape)}, expected {list(expected.shape)}")
    if expected.size == 0:
        return Comparison(name, actual.shape, 0.0, 0.0, 0, 0, atol, rtol)
    exact = expected.dtype.kind in "biu" and actual.dtype.kind in "biu"
    a = actual.astype(np.float64)
    b = expected.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a - b)
        same_special = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
        diff = np.where(same_special, 0.0, diff)
        diff = np.where(np.isnan(diff), np.inf, diff)
        rel = diff / np.maximum(np.abs(b), np.finfo(np.float64).tiny)
        rel = np.where(diff == 0, 0.0, rel)
        bad = diff > (0.0 if exact else atol + rtol * np.abs(np.nan_to_num(b)))
    return Comparison(name, actual.shape, float(diff.max()), float(rel.max()), int(bad.sum()), expected.size,
                      0.0 if exact else atol, 0.0 if exact else rtol)


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

