"""The C++ runtime through its Python module (aotc.runtime over aotc._runtime): parity with the eager
outputs stored in every example package, input validation with numbers, zero-copy and non-contiguous
inputs, and a process that never imports torch. Packages come from the session-cached fixtures."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from aotc.errors import InputError
from aotc.manifest import read
from aotc.runtime import Session
from runtime_helpers import assert_close

MODELS = ["pkg_mlp", "pkg_simple", "pkg_bert"]


@pytest.fixture(scope="module")
def mlp(pkg_mlp):
    return Session(pkg_mlp)


@pytest.mark.parametrize("fixture", MODELS)
def test_parity_with_stored_eager_outputs(fixture, request):
    pkg = request.getfixturevalue(fixture)
    session = Session(pkg)
    samples = session.samples()
    assert samples, "package has no samples"
    for i, (inputs, want) in enumerate(samples):
        got = session.run(inputs)
        assert len(got) == len(want) == len(session.output_names)
        for name, g, w in zip(session.output_names, got, want):
            assert_close(g, w, session.manifest.tolerance, f"{fixture} sample {i} output {name}")


def test_parity_with_fresh_eager_inputs(pkg_simple):
    # simple: INPUT0 + INPUT1, INPUT0 - INPUT1 on int32 [B, 16]; checked against numpy, not the exporter.
    session = Session(pkg_simple)
    rng = np.random.default_rng(0)
    for batch in (1, 7, 1024):
        a = rng.integers(-1000, 1000, (batch, 16), dtype=np.int32)
        b = rng.integers(-1000, 1000, (batch, 16), dtype=np.int32)
        out0, out1 = session.run({"INPUT0": a, "INPUT1": b})
        np.testing.assert_array_equal(out0, a + b)
        np.testing.assert_array_equal(out1, a - b)


def test_manifest_matches_archive(pkg_mlp, mlp):
    m = read(str(pkg_mlp))  # zipfile, against the C++ runtime's reading behind Session
    assert m == mlp.manifest
    assert m.format == "aotc/1" and mlp.input_names == ["x"]


def test_outputs_are_owned_arrays_without_copy(mlp):
    x = mlp.samples()[0][0][0]
    (out,) = mlp.run([x])
    assert out.base is not None and not out.flags["OWNDATA"]  # a view of the runtime's tensor
    assert out.flags["C_CONTIGUOUS"] and out.dtype == np.float32
    del x
    out2 = out.copy()
    np.testing.assert_array_equal(out, out2)  # the tensor lives as long as the array


@pytest.mark.parametrize("case, message", [
    ("count", "expected 1 input(s) (x), got 2"),
    ("dtype", "input 'x' has dtype float64, the package expects float32"),
    ("rank", "input 'x' has 3 dims [1, 4, 512], the package expects 2 dims [-1, 512]"),
    ("static dim", "input 'x' dim 1 is 511, the package expects 512"),
    ("too big", "input 'x' dim 0 is 2000, the package accepts 1..1024"),
    ("empty", "input 'x' dim 0 is 0, the package accepts 1..1024"),
    ("not array", "input 0 is a list, expected a numpy.ndarray"),
    ("complex", "numpy dtype 'complex64' is not supported"),
    ("dict", "unknown ['y']"),
])
def test_invalid_inputs_are_refused_with_numbers(mlp, case, message):
    x = np.zeros((4, 512), np.float32)
    inputs = {
        "count": [x, x],
        "dtype": [x.astype(np.float64)],
        "rank": [x[None]],
        "static dim": [np.zeros((4, 511), np.float32)],
        "too big": [np.zeros((2000, 512), np.float32)],
        "empty": [np.zeros((0, 512), np.float32)],
        "not array": [[[0.0] * 512]],
        "complex": [x.astype(np.complex64)],
        "dict": {"x": x, "y": x},
    }[case]
    with pytest.raises(InputError) as e:
        mlp.run(inputs)
    assert message in str(e.value)
    with pytest.raises(InputError):
        mlp.validate(inputs)


def test_batch_dim_must_agree_across_inputs(pkg_simple):
    session = Session(pkg_simple)
    with pytest.raises(InputError, match=r"input 'INPUT1' has batch \(dim 0\) 3, input 'INPUT0' has 2"):
        session.run([np.zeros((2, 16), np.int32), np.zeros((3, 16), np.int32)])


@pytest.mark.parametrize("layout", ["transposed", "strided rows", "negative strides", "fortran", "unaligned"])
def test_non_contiguous_inputs_give_the_contiguous_answer(mlp, layout):
    rng = np.random.default_rng(1)
    base = rng.standard_normal((64, 1024)).astype(np.float32)
    if layout == "transposed":
        big = rng.standard_normal((512, 64)).astype(np.float32)
        x = big[:, :5].T  # [5, 512] view, strides (4, 256)
    elif layout == "strided rows":
        x = base[::3, ::2]
    elif layout == "negative strides":
        x = base[::-1, :512]
    elif layout == "fortran":
        x = np.asfortranarray(base[:7, :512])
    else:
        raw = np.zeros(5 * 512 * 4 + 1, np.uint8)
        x = raw[1:].view(np.float32).reshape(5, 512)
        x[:] = base[:5, :512]
        assert x.ctypes.data % 4 != 0
    assert not x.flags["C_CONTIGUOUS"] or layout == "unaligned"
    (got,) = mlp.run([x])
    (want,) = mlp.run([np.ascontiguousarray(x)])
    np.testing.assert_array_equal(got, want)


def test_read_only_input_is_accepted(mlp):
    x = np.ones((3, 512), np.float32)
    x.setflags(write=False)
    assert mlp.run([x])[0].shape == (3, 512)


def test_works_in_a_process_that_never_imports_torch(pkg_mlp):
    code = textwrap.dedent(f"""
        import sys
        import numpy as np
        from aotc.runtime import Session
        s = Session({str(pkg_mlp)!r})
        (x,), (want,) = s.samples()[0]
        (got,) = s.run([x])
        assert np.allclose(got, want, atol=1e-4, rtol=1e-4)
        assert "torch" not in sys.modules, "torch was imported"
        print("ok", got.shape)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")
