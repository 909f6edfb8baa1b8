"""aotc-run end to end, in an empty environment (as `env -i` runs it): the self-check on stored samples,
explicit .npy inputs and -o, --bench, a sample whose stored output disagrees (exit 1), bad arguments."""

from __future__ import annotations

import io
import re
import resource
import time
import zipfile

import numpy as np
import pytest

from aotc.runtime import Session
from runtime_helpers import one_line_error, rewrite, run_aotc_run


@pytest.mark.parametrize("fixture", ["pkg_mlp", "pkg_simple", "pkg_bert"])
def test_self_check_in_empty_environment(fixture, request):
    pkg = request.getfixturevalue(fixture)
    r = run_aotc_run(pkg)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("sample ")]
    n = len(Session(pkg).manifest.samples) * len(Session(pkg).output_names)
    assert len(lines) == n and all(" ok " in line for line in lines), r.stdout
    assert all(re.search(r"max_abs \S+\s+max_rel \S+", line) for line in lines)


def test_inputs_and_output_dir(pkg_simple, tmp_path):
    a = np.arange(48, dtype=np.int32).reshape(3, 16)
    b = np.full((3, 16), 5, np.int32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", np.asfortranarray(b))
    r = run_aotc_run(pkg_simple, tmp_path / "a.npy", tmp_path / "b.npy", "-o", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "OUTPUT0.npy"), a + b)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "OUTPUT1.npy"), a - b)


def test_bad_input_file_is_one_line(pkg_simple, tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((3, 16), np.float32))
    r = run_aotc_run(pkg_simple, tmp_path / "a.npy", tmp_path / "a.npy")
    assert r.returncode == 2
    assert one_line_error(r.stderr) == "input 'INPUT0' has dtype float32, the package expects int32; cast it to int32"
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    r = run_aotc_run(pkg_simple, tmp_path / "bad.npy", tmp_path / "bad.npy")
    assert r.returncode == 2 and "not a readable .npy file" in one_line_error(r.stderr)


def test_bench_prints_percentiles(pkg_mlp):
    r = run_aotc_run(pkg_mlp, "--bench", "40", "--threads", "2", "--warmup", "2")
    assert r.returncode == 0, r.stderr
    m = re.search(r"bench: calls=40 threads=2 p50_us=([\d.]+) p90_us=([\d.]+) p99_us=([\d.]+)", r.stdout)
    assert m, r.stdout
    p50, p90, p99 = map(float, m.groups())
    assert 0 < p50 <= p90 <= p99


def test_a_gap_is_slept_through_or_with_gap_spin_spun_through(pkg_simple):
    # 200 gaps of 10 ms: two seconds of wall time either way; spinning spends them on the CPU, sleeping does
    # not (the bound leaves room for a core shared with other tests)
    def cpu_and_wall(*flags):
        before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        r = run_aotc_run(pkg_simple, "--bench", "200", "--warmup", "0", "--gap-us", "10000", *flags)
        after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic() - t0
        assert r.returncode == 0 and "bench: calls=200" in r.stdout, r.stderr
        return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall

    slept, slept_wall = cpu_and_wall()
    spun, spun_wall = cpu_and_wall("--gap-spin")
    assert slept_wall >= 2.0 and spun_wall >= 2.0
    assert spun - slept >= 0.5, (spun, slept)


def test_mismatching_stored_output_exits_1(pkg_mlp, tmp_path):
    # Samples are not hashed (they are data, not code): a wrong stored output must fail the self-check.
    def edit(name, data):
        if name == "aotc/sample0_output0.npy":
            arr = np.load(io.BytesIO(data))
            arr[0, 0] += 1.0
            buf = io.BytesIO()
            np.save(buf, arr)
            return buf.getvalue()
        return data

    bad = rewrite(pkg_mlp, tmp_path / "bad.pt2", edit)
    r = run_aotc_run(bad)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "MISMATCH" in r.stdout
    assert one_line_error(r.stderr).startswith("outputs differ")


@pytest.mark.parametrize("args, reason", [
    ([], "no package given"),
    (["--bench"], "--bench needs a number"),
    (["PKG", "--bench", "x"], "--bench is 'x'"),
    (["PKG", "--threads", "0"], "--threads is '0'"),
    (["PKG", "--bench", "3", "--gap-us", "-1"], "--gap-us is '-1'"),
    (["PKG", "--bench", "3", "--gap-spin"], "--gap-spin spins through --gap-us; give --gap-us G (G > 0) too"),
    (["PKG", "--frobnicate"], "unknown option '--frobnicate'"),
    (["PKG", "--bench", "3", "--device-inputs"], "--device-inputs needs a CUDA package; this one is for cpu"),
])
def test_bad_arguments(pkg_mlp, args, reason):
    r = run_aotc_run(*[pkg_mlp if a == "PKG" else a for a in args])
    assert r.returncode == 2
    assert reason in one_line_error(r.stderr)


def test_help():
    r = run_aotc_run("--help")
    assert r.returncode == 0 and "usage: aotc-run" in r.stdout


def test_zip_is_not_modified_by_a_run(pkg_mlp):
    before = pkg_mlp.read_bytes()
    assert run_aotc_run(pkg_mlp).returncode == 0
    assert pkg_mlp.read_bytes() == before
    with zipfile.ZipFile(pkg_mlp) as zf:
        assert zf.testzip() is None
