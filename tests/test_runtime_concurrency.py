"""Concurrency of one C++ Session shared by many Python threads: N threads x M calls with distinct inputs
(different batch sizes and values) give the same answers as the same calls made one at a time."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from aotc.runtime import Session

THREADS, CALLS = 8, 12


@pytest.mark.parametrize("num_runners", [1, 3])
def test_threads_get_the_single_threaded_answers(pkg_mlp, num_runners):
    session = Session(pkg_mlp, num_runners=num_runners)
    rng = np.random.default_rng(7)
    inputs = [[rng.standard_normal((1 + (t * CALLS + i) % 17, 512)).astype(np.float32) for i in range(CALLS)]
              for t in range(THREADS)]
    expected = [[session.run([x])[0] for x in row] for row in inputs]

    results = [[None] * CALLS for _ in range(THREADS)]
    errors = []
    barrier = threading.Barrier(THREADS)

    def worker(t):
        try:
            barrier.wait()
            for i, x in enumerate(inputs[t]):
                results[t][i] = session.run([x])[0]
        except Exception as e:  # reported below with the thread that raised it
            errors.append((t, e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors
    tol = session.manifest.tolerance
    for t in range(THREADS):
        for i in range(CALLS):
            got, want = results[t][i], expected[t][i]
            assert got is not None and got.shape == want.shape, (t, i)
            np.testing.assert_allclose(got, want, atol=tol.atol, rtol=tol.rtol, err_msg=f"thread {t} call {i}")
