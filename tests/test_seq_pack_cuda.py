"""Packed sequences on CUDA, on a GPU machine: the packed graph replayed as a CUDA graph at every row count,
and aotc-server answering requests of different lengths on the GPU as eager PyTorch answers them on the
device, a request of three rows of 40 tokens packed into one row. Which concurrent requests share a batch
depends on timing here; that they pack together right is tests/test_seq_pack.py's, on the CPU with a model
slow enough to queue behind. Marked `cuda` (`make test` deselects it); skips itself when torch sees no CUDA
device."""

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
    out = tmp_path_factory.mktemp("pack") / "hf_bert_pack.pt2"
    r = run_aotc("export", "models/hf_bert.py", "--device", "cuda", "-o", out, "--no-cache", "--seq-pack",
                 "input_ids:1,attention_mask:1=128", "--static-batches", "none", timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "result    PASS" in r.stdout, r.stdout[-3000:]
    return out


def test_every_row_count_is_a_cuda_graph(pkg):
    from aotc.runtime import Session

    assert Session(str(pkg)).cuda_graph_buckets() == list(range(1, 17))


def test_the_server_answers_packed_requests_on_the_gpu(tmp_path, pkg):
    repo = make_repository(tmp_path / "repo", {"bert": pkg}, {"bert": {"max_queue_delay_us": 100000}})
    lengths = [100, 9, 60, 27, 128, 8, 45, 70, 40]
    cases = [_inputs(3 if n == 40 else 1 + (i % 3 == 2), n, 300 + i) for i, n in enumerate(lengths)]
    refs = [eager_reference("models/hf_bert.py", device="cuda", inputs=c)[2] for c in cases]
    with Server("cpp", repo) as s:
        def client(i):
            status, r = s.json("POST", "/v2/models/bert/infer", _body(*cases[i]))
            assert status == 200, r
            out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in r["outputs"]}
            np.testing.assert_allclose(out["last_hidden_state"], refs[i][0].cpu().numpy(), atol=1e-3, rtol=1e-3)
            np.testing.assert_allclose(out["pooler_output"], refs[i][1].cpu().numpy(), atol=1e-3, rtol=1e-3)

        assert run_clients(len(cases), client) == []
