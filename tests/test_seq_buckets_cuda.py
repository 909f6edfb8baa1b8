"""Sequence-length buckets on CUDA, on a GPU machine: every bucket's graph (and the static batch graph crossed
with it) captured as CUDA graphs, the C++ runtime padding and cutting at any length against eager PyTorch on
the device, and aotc-server batching lengths of one bucket. Marked `cuda` (`make test` deselects it); skips
itself when torch sees no CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.cuda
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the GPU machine: bash bench/gpu.sh)", allow_module_level=True)

from conftest import eager_reference, run_aotc  # noqa: E402
from launch import Server, make_repository  # noqa: E402
from test_seq_buckets import _body, _inputs  # noqa: E402
from test_server_batching import run_clients  # noqa: E402


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    out = tmp_path_factory.mktemp("seq") / "hf_bert_seq.pt2"
    r = run_aotc("export", "models/hf_bert.py", "--device", "cuda", "-o", out, "--no-cache", "--seq-buckets",
                 "input_ids:1,attention_mask:1=16,64,128", "--static-batches", "4", timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "seq bucket 64 (seq=" in r.stdout and "result    PASS" in r.stdout, r.stdout[-3000:]
    return out


def test_every_bucket_runs_as_a_cuda_graph_and_matches_eager(pkg):
    from aotc.runtime import Session

    s = Session(str(pkg))
    assert s.cuda_graph_buckets(), "the buckets' graphs have static shapes but CUDA graphs are off"
    # with CUDA graphs a call runs at the batch bucket it pads to: 3 rows at 4, so in the static batch-4 graph
    for rows, length, graph in ((3, 9, "seq16_batch4_static"), (4, 40, "seq64_batch4_static"),
                                (5, 100, "model"), (4, 128, "seq128_batch4_static"), (1, 64, "seq64_static")):
        ids, mask = _inputs(rows, length, rows * length)
        _, _, eager = eager_reference("models/hf_bert.py", device="cuda", inputs=(ids, mask))
        got = s.run([ids.numpy(), mask.numpy()])
        assert got[0].shape == (rows, length, 64), got[0].shape
        for g, e in zip(got, eager):
            np.testing.assert_allclose(g, e.cpu().numpy(), atol=1e-3, rtol=1e-3)
        assert s.graph_for_batch(rows, length) == graph


def test_the_server_batches_lengths_of_one_bucket_on_the_gpu(tmp_path, pkg):
    repo = make_repository(tmp_path / "repo", {"bert": pkg}, {"bert": {"max_batch_size": 16,
                                                                       "max_queue_delay_us": 100000}})
    lengths = [33, 40, 47, 64, 50, 35, 9, 16]
    cases = [_inputs(1 + i % 2, n, 200 + i) for i, n in enumerate(lengths)]
    refs = [eager_reference("models/hf_bert.py", device="cuda", inputs=c)[2] for c in cases]
    with Server("cpp", repo) as s:
        def client(i):
            status, r = s.json("POST", "/v2/models/bert/infer", _body(*cases[i]))
            assert status == 200, r
            out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in r["outputs"]}
            np.testing.assert_allclose(out["last_hidden_state"], refs[i][0].cpu().numpy(), atol=1e-3, rtol=1e-3)
            np.testing.assert_allclose(out["pooler_output"], refs[i][1].cpu().numpy(), atol=1e-3, rtol=1e-3)

        assert run_clients(len(cases), client) == []
