"""Packed sequences (`aotc export --seq-pack`), through the real exporter, the C++ runtime and aotc-server: the
manifest records what a request carries, the export checks the packed model's answers against the model's
and refuses a pack_model that mixes its segments, aotc-run checks the packed samples, and the server packs
requests of different lengths into shared rows and answers each one at its own length (HTTP, gRPC, shared
memory, requests of several rows), with bad requests refused as for any model."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
import torch

from aotc.errors import ExportError
from aotc.manifest import read
from aotc.seq_pack import pack, parse, place, unpack
from conftest import REPO, eager_reference, run_aotc
from launch import Server, find_binary, make_repository
from test_seq_buckets import _body, _inputs, grpc_and_shm_answers_are_eagers
from test_server_batching import run_clients

FLAG = "input_ids:1,attention_mask:1=128"


@pytest.fixture(scope="module")
def pkg(export_package):
    return export_package("models/hf_bert.py", "--seq-pack", FLAG)


def test_parse_takes_one_row_length_and_refuses_junk():
    r = parse(FLAG)
    assert r.inputs == {"input_ids": 1, "attention_mask": 1} and r.sizes == (128,)
    with pytest.raises(ExportError, match=r"--seq-pack .*one row length is expected after '=', got \[64, 128\]"):
        parse("input_ids:1=64,128")
    for bad in ("input_ids:1", "=32", "input_ids:a=32", "input_ids:1=0", "a:1,a:1=8"):
        with pytest.raises(ExportError, match="--seq-pack"):
            parse(bad)


def test_placement_is_first_fit_decreasing():
    # the longest first, each into the first row with room, after what the row holds
    assert place([5, 3, 4], 8) == [(0, 0), (0, 5), (1, 0)]  # 5, then 4 (no room in row 0), then 3
    assert place([8, 8, 1], 8) == [(0, 0), (1, 0), (2, 0)]
    assert place([2, 2, 2, 2], 8) == [(0, 0), (0, 2), (0, 4), (0, 6)]


def test_the_python_packing_rule_round_trips():
    a = (torch.tensor([[1, 2, 3]]), torch.tensor([[1, 1, 0]]))
    b = (torch.tensor([[4, 5], [6, 7]]), torch.tensor([[1, 1], [1, 1]]))
    (ids, mask, seg, pos), where = pack([a, b], 4, [9.0, 0.0])
    # segments: a (3), b row 0 (2), b row 1 (2) -> a in row 0, b's rows share row 1
    assert ids.tolist() == [[1, 2, 3, 9], [4, 5, 6, 7]]
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert seg.tolist() == [[1, 1, 1, 0], [1, 1, 2, 2]] and pos.tolist() == [[0, 1, 2, 0], [0, 1, 0, 1]]
    tokens = torch.arange(2 * 4 * 2).reshape(2, 4, 2)  # [rows, size, 2]
    (ta, fa), (tb, fb) = unpack([tokens, tokens], [False, True], [a, b], where)
    assert ta.tolist() == [tokens[0, :3].tolist()] and fa.tolist() == [tokens[0, 0].tolist()]
    assert tb.tolist() == [tokens[1, :2].tolist(), tokens[1, 2:].tolist()]
    assert fb.tolist() == [tokens[1, 0].tolist(), tokens[1, 2].tolist()]


def test_the_manifest_says_what_a_request_carries(pkg):
    m = read(str(pkg))
    p = m.seq_pack
    assert p.size == 128 and p.inputs == {"input_ids": 1, "attention_mask": 1}
    assert p.outputs == {"last_hidden_state": "tokens", "pooler_output": "first"}
    assert m.input_names == ["input_ids", "attention_mask", "segment_ids", "position_ids"]
    assert [(t.name, t.shape, t.ranges) for t in p.request_inputs] == [
        ("input_ids", (-1, -1), ((1, 16), (8, 128))), ("attention_mask", (-1, -1), ((1, 16), (8, 128)))]
    assert [(t.name, t.shape) for t in p.request_outputs] == [("last_hidden_state", (-1, -1, 64)),
                                                              ("pooler_output", (-1, 64))]
    inspect = run_aotc("inspect", str(pkg))
    assert "packed    rows of 128 tokens" in inspect.stdout and "request   input_ids: int64[1..16,8..128]" in inspect.stdout


def test_aotc_run_checks_the_packed_samples(pkg):
    r = subprocess.run([str(find_binary("aotc-run", "AOTC_RUN")), str(pkg)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "4 input(s)" in r.stdout, r.stdout + r.stderr
    assert "MISMATCH" not in r.stdout and r.stdout.count(": ok ") == 4, r.stdout


def test_the_server_packs_lengths_together_and_answers_each_at_its_own(tmp_path, pkg):
    repo = make_repository(tmp_path / "repo", {"bert": pkg},
                           {"bert": {"max_queue_delay_us": 200000, "run_inline_when_idle": False}})
    lengths = [100, 9, 60, 27, 128, 8, 45, 70, 33, 12]
    cases = [_inputs(1 + (i % 3 == 2), n, 200 + i) for i, n in enumerate(lengths)]
    refs = [eager_reference("models/hf_bert.py", inputs=c)[2] for c in cases]
    with Server("cpp", repo) as s:
        _, meta = s.json("GET", "/v2/models/bert")
        assert [(t["name"], t["shape"]) for t in meta["inputs"]] == [("input_ids", [-1, -1]),
                                                                      ("attention_mask", [-1, -1])]
        assert [(t["name"], t["shape"]) for t in meta["outputs"]] == [("last_hidden_state", [-1, -1, 64]),
                                                                       ("pooler_output", [-1, 64])]

        def client(i):
            status, r = s.json("POST", "/v2/models/bert/infer", _body(*cases[i]))
            assert status == 200, r
            out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in r["outputs"]}
            rows = cases[i][0].shape[0]
            assert out["last_hidden_state"].shape == (rows, lengths[i], 64)
            assert out["pooler_output"].shape == (rows, 64)
            np.testing.assert_allclose(out["last_hidden_state"], refs[i][0].numpy(), atol=1e-4, rtol=1e-3)
            np.testing.assert_allclose(out["pooler_output"], refs[i][1].numpy(), atol=1e-4, rtol=1e-3)

        assert run_clients(len(cases), client) == []
        _, st = s.json("GET", "/v2/models/bert/stats")
        stats = st["model_stats"][0]
        assert stats["execution_count"] < len(cases), f"no two lengths were packed together: {stats}"
        assert stats["inference_count"] == sum(c[0].shape[0] for c in cases)
        # one output asked for, in binary; bad requests are refused as for any model, and the server serves on
        status, r = s.json("POST", "/v2/models/bert/infer", _body(*cases[1], outputs=[{"name": "pooler_output"}]))
        assert status == 200 and [o["name"] for o in r["outputs"]] == ["pooler_output"], r
        np.testing.assert_allclose(np.array(r["outputs"][0]["data"], np.float32).reshape(1, 64), refs[1][1].numpy(),
                                   atol=1e-4, rtol=1e-3)
        status, r = s.json("POST", "/v2/models/bert/infer", _body(_inputs(1, 20, 0)[0], _inputs(1, 21, 0)[1]))
        assert status == 400 and "disagree on the sequence length" in r["error"], r
        status, r = s.json("POST", "/v2/models/bert/infer", _body(*_inputs(1, 129, 0)))
        assert status == 400 and "dim 1 is 129" in r["error"] and "8..128" in r["error"], r
        status, r = s.json("POST", "/v2/models/bert/infer", _body(*_inputs(17, 20, 0)))
        assert status == 400 and "dim 0 is 17" in r["error"], r
        status, r = s.json("POST", "/v2/models/bert/infer",
                           {"inputs": [{"name": "segment_ids", "shape": [1, 8], "datatype": "INT64", "data": [0] * 8}]})
        assert status == 400 and "unknown input 'segment_ids'" in r["error"], r
        status, _ = s.json("GET", "/v2/health/ready")
        assert status == 200


def test_grpc_and_shared_memory_answers_come_at_the_request_length(tmp_path, pkg):
    grpc_and_shm_answers_are_eagers(tmp_path, pkg, "pack_out")


def test_rows_longer_than_the_longest_request_hold_several_of_them(tmp_path, export_package):
    # rows of 256 tokens for a model whose sequences reach 128: a request's two rows of 128 fit one graph row
    # (max_batch_size 1) and answer as eager, and a request is still held to the model's 128
    pkg = export_package("models/hf_bert.py", "--seq-pack", "input_ids:1,attention_mask:1=256", "--quick")
    p = read(str(pkg)).seq_pack
    assert p.size == 256 and [t.ranges for t in p.request_inputs] == [((1, 16), (8, 128))] * 2
    repo = make_repository(tmp_path / "repo", {"bert": pkg}, {"bert": {"max_batch_size": 1}})
    case = _inputs(2, 128, 300)
    ref = eager_reference("models/hf_bert.py", inputs=case)[2]
    with Server("cpp", repo) as s:
        status, r = s.json("POST", "/v2/models/bert/infer", _body(*case))
        assert status == 200, r
        out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in r["outputs"]}
        np.testing.assert_allclose(out["last_hidden_state"], ref[0].numpy(), atol=1e-4, rtol=1e-3)
        np.testing.assert_allclose(out["pooler_output"], ref[1].numpy(), atol=1e-4, rtol=1e-3)
        _, st = s.json("GET", "/v2/models/bert/stats")
        assert [b["batch_size"] for b in st["model_stats"][0]["batch_stats"]] == [2], st
        status, r = s.json("POST", "/v2/models/bert/infer", _body(*_inputs(1, 129, 0)))
        assert status == 400 and "dim 1 is 129" in r["error"] and "8..128" in r["error"], r


@pytest.mark.parametrize("flag, message", [
    ("nope:1=128", r"the model has no input 'nope'; its inputs are \['input_ids', 'attention_mask'\]"),
    ("input_ids:1=128", r"input 'attention_mask' is not named; packing puts every input's sequences in rows"),
    ("input_ids:1,attention_mask:1=4", r"the row length 4 is shorter than dim 'seq''s shortest sequence 8"),
    ("input_ids:0,attention_mask:1=128", r"input 'input_ids' is \[4, 32\] with the sequence at axis 0"),
])
def test_a_flag_the_model_does_not_fit_is_one_line(flag, message):
    r = run_aotc("export", "models/hf_bert.py", "--seq-pack", flag, "--no-cache", "-o", "/tmp/never.pt2", "--quick")
    assert r.returncode != 0 and re.search(message, r.stderr), r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_a_pack_model_that_mixes_segments_is_refused(tmp_path):
    src = (REPO / "models" / "hf_bert.py").read_text()
    # attention across the whole row: each segment sees the others
    f = tmp_path / "mixes.py"
    f.write_text(src.replace("keep = same & (attention_mask[:, None, :] > 0)",
                             "keep = (segment_ids[:, :, None] >= 0) & (attention_mask[:, None, :] > 0)"))
    out = tmp_path / "never.pt2"
    r = run_aotc("export", str(f), "--seq-pack", FLAG, "--no-cache", "-o", str(out))
    assert r.returncode != 0 and not out.exists(), r.stdout + r.stderr
    assert re.search(r"the answer changes when requests are packed: output '(last_hidden_state|pooler_output)' of "
                     r"a request of length \d+ packed with others", r.stderr), r.stderr[-2000:]
    assert "keep segments apart" in r.stderr and "Traceback" not in r.stderr


def test_a_sequence_dim_without_a_maximum_is_one_line(tmp_path):
    # rows may be longer than any request, so the request's own bound must come from the dim
    f = tmp_path / "unbounded.py"
    f.write_text((REPO / "models" / "hf_bert.py").read_text().replace(
        'Dim("seq", min=MIN_SEQ, max=MAX_SEQ)', 'Dim("seq", min=MIN_SEQ)'))
    r = run_aotc("export", str(f), "--seq-pack", FLAG, "--no-cache", "-o", "/tmp/never.pt2", "--quick")
    assert r.returncode != 0 and "dim 'seq' has no maximum; packing needs the longest a request may be" in r.stderr, \
        r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_a_model_file_without_pack_model_or_with_both_flags_is_one_line(tmp_path):
    r = run_aotc("export", "models/bert.py", "--seq-pack", "ids:1=128", "--no-cache", "-o", "/tmp/never.pt2")
    assert r.returncode != 0 and "has no function pack_model(model); --seq-pack needs one" in r.stderr, r.stderr
    r = run_aotc("export", "models/hf_bert.py", "--seq-pack", FLAG, "--seq-buckets", FLAG, "--no-cache",
                 "-o", "/tmp/never.pt2")
    assert r.returncode != 0 and "--seq-pack and --seq-buckets: give one" in r.stderr, r.stderr
    src = (REPO / "models" / "hf_bert.py").read_text()
    f = tmp_path / "renamed.py"
    f.write_text(src.replace("def forward(self, input_ids, attention_mask, segment_ids, position_ids):",
                             "def forward(self, input_ids, attention_mask, segments, positions):")
                 .replace("segment_ids", "segments").replace("position_ids=position_ids", "position_ids=positions"))
    r = run_aotc("export", str(f), "--seq-pack", FLAG, "--no-cache", "-o", "/tmp/never.pt2")
    assert r.returncode != 0 and "expected (input_ids, attention_mask, segment_ids, position_ids)" in r.stderr, r.stderr
    f = tmp_path / "pooled_per_row.py"  # the pooler on each row's first token: no token axis to read segments from
    f.write_text(src.replace("pooled = self.bert.pooler.activation(self.bert.pooler.dense(h))",
                             "pooled = self.bert.pooler.activation(self.bert.pooler.dense(h[:, 0]))"))
    r = run_aotc("export", str(f), "--seq-pack", FLAG, "--no-cache", "-o", "/tmp/never.pt2")
    assert r.returncode != 0 and re.search(r"pack_model\(\)'s output 'pooler_output' is \[1, 64\] for 1 row, expected "
                                           r"\[1, 128, 64\]", r.stderr), r.stderr[-2000:]
    bad = run_aotc("export", "models/hf_bert.py", "--seq-pack", "input_ids:1=64,128", "-o", "/tmp/never.pt2")
    assert bad.returncode == 2 and "one row length is expected" in bad.stderr


def test_aotc_check_runs_the_packed_graph_against_pack_model_and_the_python_baseline_refuses_it(tmp_path, pkg):
    r = run_aotc("check", str(pkg), "models/hf_bert.py")
    assert r.returncode == 0 and "parity ok" in r.stdout, r.stdout + r.stderr
    repo = make_repository(tmp_path / "repo", {"bert": pkg})
    with Server("python", repo, ready_path="/v2/health/live") as server:
        _, index = server.json("POST", "/v2/repository/index", {})
        assert [(e["name"], e["state"]) for e in index] == [("bert", "UNAVAILABLE")], index
        assert "a --seq-pack package: aotc-server packs its requests" in index[0]["reason"], index
