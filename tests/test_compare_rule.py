"""The parity rule, held to one definition: the C++ runtime's aotc::compare (aotc-run's self-check, bound as
aotc._runtime.compare) and the client's aotc_client.compare.compare_array must agree on every case here
(ok, mismatched, max_abs, max_rel). The cases sit on the rule's edges: the tolerance boundary, NaN and the
infinities, zeros in the reference with and without atol, exact integers and bools, shape and dtype
disagreements, empty arrays. Pure computation; no package, no server.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from aotc_client.compare import compare_array

NAN, INF = float("nan"), float("inf")


def f32(*v):
    return np.array(v, dtype=np.float32)


def f64(*v):
    return np.array(v, dtype=np.float64)


def f16(*v):
    return np.array(v, dtype=np.float16)


# (id, actual, expected, atol, rtol)
CASES = [
    ("f32-exact", f32(1, 2, 3), f32(1, 2, 3), 1e-4, 1e-4),
    ("f32-small-difference", f32(1, 2.00005), f32(1, 2), 1e-4, 1e-4),
    ("f32-large-difference", f32(1, 10, -3), f32(1, 2, 3), 1e-4, 1e-4),
    ("f64-on-the-boundary", f64(1.5, -0.5), f64(1.0, 0.0), 0.25, 0.25),  # 0.5 <= 0.25 + 0.25 * 1; 0.5 > 0.25
    ("f64-just-past-the-boundary", f64(1.5000000001), f64(1.0), 0.25, 0.25),
    ("f32-on-the-boundary", f32(3.0), f32(2.0), 0.5, 0.25),  # 1.0 <= 0.5 + 0.25 * 2
    ("f16-within", f16(1, 2.001, 3), f16(1, 2, 3), 1e-3, 1e-3),
    ("f16-mismatch", f16(1, 2.5, -4), f16(1, 2, 4), 1e-2, 1e-2),
    ("nan-vs-nan", f32(NAN, 1), f32(NAN, 1), 1e-4, 1e-4),
    ("nan-vs-number", f32(NAN, 1), f32(1, 1), 1e-4, 1e-4),
    ("number-vs-nan", f64(1, 2), f64(NAN, 2), 1e3, 1e3),
    ("inf-vs-inf", f32(INF, -INF), f32(INF, -INF), 0, 0),
    ("inf-vs-minus-inf", f32(INF), f32(-INF), 1e-4, 1e-4),
    ("finite-vs-inf", f64(1e300), f64(INF), 1e9, 1e9),
    ("inf-vs-finite", f32(INF, 1), f32(3e38, 1), 1e-4, 1e-4),
    ("zero-reference-atol-0", f32(2**-10, 0, 2), f32(0, 0, 2), 0, 1e-3),
    ("zero-reference-atol", f32(1e-3, 0.5, 0), f32(0, 0.25, 0), 1e-2, 0.1),
    ("mixed", f64(NAN, INF, 1, 2, 0.1), f64(NAN, INF, 1.5, 2, 0), 1e-1, 1e-1),
    ("int64-off-by-one", np.array([1, 2, 3], np.int64), np.array([1, 2, 4], np.int64), 1, 1),
    ("int64-beyond-float64", np.array([2**60, 7], np.int64), np.array([2**60 + 1, 7], np.int64), 1, 1),
    ("int32-off-by-one", np.array([[0, -5], [9, 9]], np.int32), np.array([[0, -4], [9, 8]], np.int32), 0.5, 0.5),
    ("int32-exact", np.array([1, 2], np.int32), np.array([1, 2], np.int32), 0, 0),
    ("bool-off-by-one", np.array([True, False, True]), np.array([True, True, True]), 1, 1),
    ("shape-mismatch", np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32), 1, 1),
    ("dtype-mismatch", np.zeros(3, np.float32), np.zeros(3, np.float64), 1, 1),
    ("int-dtype-mismatch", np.zeros(3, np.int32), np.zeros(3, np.int64), 1, 1),
    ("empty", np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32), 0, 0),
    ("empty-int", np.zeros(0, np.int64), np.zeros(0, np.int64), 0, 0),
]


@pytest.fixture(scope="module")
def cpp_compare():
    from aotc.runtime import _module  # makes libstdc++ global before aotc._runtime loads

    return _module().compare


def _same_float(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("actual,expected,atol,rtol", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_cpp_and_python_agree(cpp_compare, actual, expected, atol, rtol):
    c = cpp_compare(actual, expected, atol, rtol)
    p = compare_array("out", actual, expected, atol, rtol)
    got = {"ok": p.ok, "mismatched": p.mismatched, "max_abs": p.max_abs, "max_rel": p.max_rel}
    want = {k: c[k] for k in got}
    assert p.ok == c["ok"] and p.mismatched == c["mismatched"], f"python {got}, C++ {want}"
    assert _same_float(p.max_abs, c["max_abs"]) and _same_float(p.max_rel, c["max_rel"]), f"python {got}, C++ {want}"
    assert bool(p.problem) == bool(c["mismatch"]), f"python problem {p.problem!r}, C++ {c['mismatch']!r}"


# What the rule says, case by case, so that the two cannot agree on a wrong answer.
EXPECTED = {  # id: (ok, mismatched, max_abs, max_rel)
    "f32-exact": (True, 0, 0.0, 0.0),
    "f32-large-difference": (False, 2, 8.0, 4.0),
    "f64-on-the-boundary": (False, 1, 0.5, 0.5),
    "f64-just-past-the-boundary": (False, 1, 0.5000000001, 0.5000000001),
    "f32-on-the-boundary": (True, 0, 1.0, 0.5),
    "nan-vs-nan": (True, 0, 0.0, 0.0),
    "nan-vs-number": (False, 1, INF, INF),
    "number-vs-nan": (False, 1, INF, 0.0),  # NaN reference: |b| > atol is false, no max_rel term
    "inf-vs-inf": (True, 0, 0.0, 0.0),
    "inf-vs-minus-inf": (False, 1, INF, INF),
    "finite-vs-inf": (False, 1, INF, INF),
    "inf-vs-finite": (False, 1, INF, INF),
    "zero-reference-atol-0": (False, 1, 2**-10, 0.0),
    "zero-reference-atol": (False, 1, 0.25, 1.0),
    "mixed": (False, 1, 0.5, 1 / 3),  # 0.1 against 0 with atol 0.1 is on the boundary
    "int64-off-by-one": (False, 1, 1.0, 0.25),
    "int64-beyond-float64": (False, 1, 0.0, 0.0),  # exact: 2**60 and 2**60 + 1 differ, as doubles they do not
    "int32-off-by-one": (False, 2, 1.0, 0.25),
    "bool-off-by-one": (False, 1, 1.0, 1.0),
    "shape-mismatch": (False, 6, INF, INF),
    "dtype-mismatch": (False, 3, INF, INF),
    "empty": (True, 0, 0.0, 0.0),
}


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in EXPECTED], ids=lambda c: c[0])
def test_cpp_follows_the_rule(cpp_compare, case):
    name, actual, expected, atol, rtol = case
    c = cpp_compare(actual, expected, atol, rtol)
    ok, mismatched, max_abs, max_rel = EXPECTED[name]
    assert (c["ok"], c["mismatched"]) == (ok, mismatched), c
    assert _same_float(c["max_abs"], max_abs) and _same_float(c["max_rel"], max_rel), c
