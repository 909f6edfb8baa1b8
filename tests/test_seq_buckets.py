"""Sequence-length buckets (`aotc export --seq-buckets`), through the real exporter, the C++ runtime and
aotc-server: the manifest records the buckets, parity runs every bucket's graph on padded calls against eager
on the unpadded input, the runtime pads and cuts at any length, the server batches requests of different
lengths in one bucket and answers each at its own length (HTTP, gRPC, shared memory), and bad flags, a model
whose answer changes with padding and mismatched lengths are refused with what was wrong."""

from __future__ import annotations

import re
import subprocess
import threading
import time

import numpy as np
import pytest
import torch

from aotc.errors import ExportError, InputError
from aotc.manifest import read
from aotc.runtime import Session
from aotc.seq_buckets import bucket_lengths, parse
from conftest import DATA, eager_reference, run_aotc
from launch import Server, find_binary, make_repository
from test_server import metric
from test_server_batching import run_clients

FLAG = "input_ids:1,attention_mask:1=16,32,64,128"


@pytest.fixture(scope="module")
def pkg(export_package):
    return export_package("models/hf_bert.py", "--seq-buckets", FLAG)


def _inputs(batch: int, length: int, seed: int):
    """ids and a right-padded mask (some rows shorter than `length`), as models/hf_bert.py makes them."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (batch, length), generator=g)
    lengths = torch.randint(max(1, length // 2), length + 1, (batch,), generator=g)
    return ids, (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)


def test_parse_takes_the_flag_and_refuses_junk():
    r = parse(FLAG)
    assert r.inputs == {"input_ids": 1, "attention_mask": 1} and r.sizes == (16, 32, 64, 128)
    assert parse("x:-1=64,8,8").sizes == (8, 64)
    for bad in ("input_ids:1", "=32", "input_ids=32", "input_ids:a=32", "input_ids:1=", "input_ids:1=0,8",
                "input_ids:1=x", "a:1,a:1=8"):
        with pytest.raises(ExportError, match="--seq-buckets"):
            parse(bad)


def test_pad_values_must_name_inputs_and_give_numbers(tmp_path):
    from aotc.errors import ModelFileError
    from aotc.load_model import load_model_file

    src = (DATA / "pads_change_answer.py").read_text()
    for body, words in (('{"ids": "zero"}', "expected {input name: number}"),
                        ('{"nope": 1}', "names ['nope'], which are not inputs")):
        f = tmp_path / "m.py"
        f.write_text(src + f"\n\ndef pad_values():\n    return {body}\n")
        with pytest.raises(ModelFileError, match=re.escape(words)):
            load_model_file(str(f))
    f.write_text(src + '\n\ndef pad_values():\n    return {"ids": 3}\n')
    assert load_model_file(str(f)).pad_values == {"ids": 3.0}


def test_the_python_padding_rule():
    from aotc.manifest import SeqBuckets
    from aotc.seq_buckets import cut, length_of, pad, resize

    seq = SeqBuckets("seq", (4, 8), {"ids": 1, "mask": 1}, {"tokens": 1}, {"ids": 7.0, "mask": 0.0}, {})
    ids, mask, other = torch.ones(2, 3, dtype=torch.int64), torch.ones(2, 3, dtype=torch.int64), torch.zeros(2)
    names = ["ids", "mask", "other"]
    assert length_of((ids, mask, other), names, seq) == 3
    p_ids, p_mask, p_other = pad((ids, mask, other), names, seq, 4)
    assert p_ids.tolist() == [[1, 1, 1, 7]] * 2 and p_mask.tolist() == [[1, 1, 1, 0]] * 2 and p_other is other
    assert resize((ids, mask, other), names, seq, 2)[0].shape == (2, 2)
    tokens, pooled = cut([torch.zeros(2, 4, 5), torch.zeros(2, 5)], ["tokens", "pooled"], seq, 3)
    assert tokens.shape == (2, 3, 5) and pooled.shape == (2, 5)
    with pytest.raises(InputError, match="'ids' 3, 'mask' 4"):
        length_of((ids, torch.ones(2, 4)), ["ids", "mask"], seq)


def test_bucket_lengths_pad_into_every_bucket():
    from aotc.manifest import SeqBuckets

    seq = SeqBuckets("seq", (16, 32, 64, 128), {"x": 1}, {}, {"x": 0.0}, {})
    assert bucket_lengths(seq, 8) == [(16, 11), (32, 25), (64, 49), (128, 97)]
    assert [seq.bucket(n) for n in (1, 16, 17, 128, 129)] == [16, 16, 32, 128, None]


def test_the_manifest_records_the_buckets_and_parity_pads_into_each(pkg):
    m = read(str(pkg))
    seq = m.seq_buckets
    assert seq.dim == "seq" and seq.sizes == (16, 32, 64, 128)
    assert seq.inputs == {"input_ids": 1, "attention_mask": 1} and seq.pad_values == {"input_ids": 0, "attention_mask": 0}
    assert seq.outputs == {"last_hidden_state": 1}  # pooler_output has no sequence dim
    assert seq.graphs == {16: "seq16_static", 32: "seq32_static", 64: "seq64_static", 128: "model"}
    # the package takes lengths up to the largest bucket, every input and output a dynamic sequence dim
    assert m.inputs[0].shape == (-1, -1) and m.inputs[0].ranges[1] == (8, 128) and m.dims["seq"] == (8, 128)
    log = (pkg.parent / "export.log").read_text()
    for size, length in ((16, 11), (32, 25), (64, 49), (128, 97)):
        assert re.search(rf"^  ok +seq bucket {size} \(seq={length}\)", log, re.M), log[-3000:]
    assert "fresh min (batch=1, seq=8)" in log and "result    PASS" in log


def test_the_runtime_pads_and_cuts_at_every_length(pkg):
    s = Session(str(pkg))
    for length, graph in ((8, "seq16_static"), (16, "seq16_static"), (17, "seq32_static"), (45, "seq64_static"),
                          (127, "model"), (128, "model")):
        ids, mask = _inputs(3, length, length)
        _, _, eager = eager_reference("models/hf_bert.py", inputs=(ids, mask))
        got = s.run([ids.numpy(), mask.numpy()])
        assert got[0].shape == (3, length, 64) and got[1].shape == (3, 64)
        assert np.abs(eager[0].numpy()).max() > 0.5  # not a vacuous comparison
        for g, e in zip(got, eager):
            np.testing.assert_allclose(g, e.numpy(), atol=1e-4, rtol=1e-3)
        assert s.graph_for_batch(3, length) == graph
    ids, mask = _inputs(2, 129, 0)
    with pytest.raises(InputError, match=r"dim 1 is 129, the package accepts 8\.\.128"):
        s.run([ids.numpy(), mask.numpy()])
    with pytest.raises(InputError, match=r"disagree on the sequence length .*'input_ids' 20, 'attention_mask' 21"):
        s.run([_inputs(2, 20, 0)[0].numpy(), _inputs(2, 21, 0)[1].numpy()])


def test_aotc_run_checks_every_sample_through_its_bucket(pkg):
    r = subprocess.run([str(find_binary("aotc-run", "AOTC_RUN")), str(pkg)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "MISMATCH" not in r.stdout and re.search(r"\(graph seq\d+_static\)", r.stdout), r.stdout


def _body(ids, mask, **extra):
    return {"inputs": [{"name": n, "shape": list(x.shape), "datatype": "INT64", "data": x.ravel().tolist()}
                       for n, x in (("input_ids", ids), ("attention_mask", mask))], **extra}


def test_the_server_batches_lengths_of_one_bucket_and_answers_each_at_its_own(tmp_path, pkg):
    repo = make_repository(tmp_path / "repo", {"bert": pkg},
                           {"bert": {"max_batch_size": 16, "max_queue_delay_us": 200000,
                                     "run_inline_when_idle": False}})
    lengths = [33, 40, 47, 64, 50, 35, 9, 16]  # six in bucket 64, two in bucket 16
    cases = [_inputs(1 + i % 2, n, 100 + i) for i, n in enumerate(lengths)]
    refs = [eager_reference("models/hf_bert.py", inputs=c)[2] for c in cases]
    with Server("cpp", repo) as s:
        def client(i):
            status, r = s.json("POST", "/v2/models/bert/infer", _body(*cases[i]))
            assert status == 200, r
            out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in r["outputs"]}
            assert out["last_hidden_state"].shape == (cases[i][0].shape[0], lengths[i], 64)
            np.testing.assert_allclose(out["last_hidden_state"], refs[i][0].numpy(), atol=1e-4, rtol=1e-3)
            np.testing.assert_allclose(out["pooler_output"], refs[i][1].numpy(), atol=1e-4, rtol=1e-3)

        assert run_clients(len(cases), client) == []
        _, st = s.json("GET", "/v2/models/bert/stats")
        stats = st["model_stats"][0]
        assert stats["execution_count"] < len(cases), f"no two lengths batched together: {stats}"
        # Promotion is "auto" by default, and off until a trial (hundreds of calls) has measured both modes.
        _, cfg = s.json("GET", "/v2/models/bert/config")
        assert cfg["seq_bucket_promotion"] == "auto", cfg
        text = s.request("GET", "/metrics")[2].decode()
        assert metric(text, "aotc_seq_promotion_active", "bert") == 0
        assert metric(text, "aotc_seq_promotion_trials_count", "bert") == 0
        assert metric(text, "aotc_seq_promoted_count", "bert") == 0
        status, r = s.json("POST", "/v2/models/bert/infer", _body(_inputs(1, 20, 0)[0], _inputs(1, 21, 0)[1]))
        assert status == 400 and "disagree on the sequence length" in r["error"], r
        status, r = s.json("POST", "/v2/models/bert/infer", _body(*_inputs(1, 129, 0)))
        assert status == 400 and "dim 1 is 129" in r["error"], r
        status, _ = s.json("GET", "/v2/health/ready")
        assert status == 200


def test_promotion_pads_shorter_buckets_into_a_longer_batch_and_answers_each_at_its_own(tmp_path, pkg):
    """seq_bucket_promotion: requests of bucket 16 run in bucket 64's batches where the measured calls say so;
    every answer still equals eager at its own length. The tiny model's calls cost about the same at 16 and 64
    tokens a row (its fixed cost dominates), so promotion is what the cost fit chooses here."""
    repo = make_repository(tmp_path / "repo", {"bert": pkg},
                           {"bert": {"max_batch_size": 16, "max_queue_delay_us": 200000,
                                     "run_inline_when_idle": False, "seq_bucket_promotion": True}})
    lengths = [9, 50, 12, 64, 16, 40, 10, 33] * 2  # bucket 16 and bucket 64 taking turns
    cases = [_inputs(1, n, 300 + i) for i, n in enumerate(lengths)]
    refs = [eager_reference("models/hf_bert.py", inputs=c)[2] for c in cases]
    with Server("cpp", repo) as s:
        _, cfg = s.json("GET", "/v2/models/bert/config")
        assert cfg["seq_bucket_promotion"] is True, cfg
        for c in cases[:4]:  # one at a time: calls at both lengths for the cost fit
            assert s.json("POST", "/v2/models/bert/infer", _body(*c))[0] == 200

        def client(i):
            status, r = s.json("POST", "/v2/models/bert/infer", _body(*cases[i]))
            assert status == 200, r
            out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in r["outputs"]}
            assert out["last_hidden_state"].shape == (1, lengths[i], 64)
            np.testing.assert_allclose(out["last_hidden_state"], refs[i][0].numpy(), atol=1e-4, rtol=1e-3)
            np.testing.assert_allclose(out["pooler_output"], refs[i][1].numpy(), atol=1e-4, rtol=1e-3)

        promoted = 0
        for _ in range(3):  # rounds of concurrent clients, until one promotes
            assert run_clients(len(cases), client) == []
            status, _, text = s.request("GET", "/metrics")
            assert status == 200
            promoted = metric(text.decode(), "aotc_seq_promoted_count", "bert")
            if promoted:
                break
        assert promoted > 0, "no request of bucket 16 ran in a bucket-64 batch"


def test_auto_promotion_runs_trials_under_load_and_every_answer_stays_right(tmp_path, pkg):
    """seq_bucket_promotion "auto" (the default): under steady load the server serves a trial of a few hundred
    calls with promotion off, then on, and holds the one that served more (with rates alike, the one with less
    model time per row); through the switch every answer still equals eager at its own length. Which mode wins
    is the machine's timing; the test asserts only that a trial ended and what the counters say of it."""
    repo = make_repository(tmp_path / "repo", {"bert": pkg},
                           {"bert": {"max_batch_size": 16, "max_queue_delay_us": 2000, "run_inline_when_idle": False}})
    lengths = [9, 50, 12, 64, 16, 40, 10, 33]  # buckets 16, 32 and 64
    cases = [_inputs(1, n, 500 + i) for i, n in enumerate(lengths)]
    refs = [eager_reference("models/hf_bert.py", inputs=c)[2] for c in cases]
    stop = threading.Event()
    with Server("cpp", repo) as s:
        def client(i):
            k = i
            while not stop.is_set():
                c = k % len(cases)
                k += 1
                status, r = s.json("POST", "/v2/models/bert/infer", _body(*cases[c]))
                assert status == 200, r
                out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in r["outputs"]}
                assert out["last_hidden_state"].shape == (1, lengths[c], 64)
                np.testing.assert_allclose(out["last_hidden_state"], refs[c][0].numpy(), atol=1e-4, rtol=1e-3)

        def counters():
            text = s.request("GET", "/metrics")[2].decode()
            return {name: metric(text, f"aotc_seq_promotion_{name}", "bert")
                    for name in ("trials_count", "trials_won_count", "active")}

        def watch():  # stops the clients once a trial has ended (or after the guard)
            try:
                until = time.monotonic() + 180
                while time.monotonic() < until and counters()["trials_count"] < 1:
                    time.sleep(0.2)
            finally:
                stop.set()

        watcher = threading.Thread(target=watch)
        watcher.start()
        errors = run_clients(16, client)
        stop.set()
        watcher.join()
        assert errors == [], errors[:3]
        got = counters()
        assert got["trials_count"] >= 1, f"no promotion trial ended under 180 s of load: {got}"
        assert 0 <= got["trials_won_count"] <= got["trials_count"] and got["active"] in (0, 1), got
        status, _ = s.json("GET", "/v2/health/ready")
        assert status == 200


def grpc_and_shm_answers_are_eagers(tmp_path, pkg, region: str):
    """A package of models/hf_bert.py answers 2 rows of 21 tokens as eager does over gRPC, and writes the
    per-token output into a system shared memory region sized for the request's own length."""
    import tritonclient.grpc as grpcclient
    import tritonclient.utils.shared_memory as shm

    repo = make_repository(tmp_path / "repo", {"bert": pkg})
    ids, mask = _inputs(2, 21, 7)
    ref = eager_reference("models/hf_bert.py", inputs=(ids, mask))[2]
    with Server("cpp", repo, "--allow-shared-memory") as s:
        c = grpcclient.InferenceServerClient(s.grpc_url)
        ins = [grpcclient.InferInput("input_ids", [2, 21], "INT64"), grpcclient.InferInput("attention_mask", [2, 21], "INT64")]
        ins[0].set_data_from_numpy(ids.numpy())
        ins[1].set_data_from_numpy(mask.numpy())
        r = c.infer("bert", ins)
        np.testing.assert_allclose(r.as_numpy("last_hidden_state"), ref[0].numpy(), atol=1e-4, rtol=1e-3)
        np.testing.assert_allclose(r.as_numpy("pooler_output"), ref[1].numpy(), atol=1e-4, rtol=1e-3)
        size = ref[0].numel() * 4
        handle = shm.create_shared_memory_region(region, f"/aotc_{region}", size)
        try:
            c.register_system_shared_memory(region, f"/aotc_{region}", size)
            out = grpcclient.InferRequestedOutput("last_hidden_state")
            out.set_shared_memory(region, size)
            r = c.infer("bert", ins, outputs=[out])
            assert r.get_output("last_hidden_state").shape == [2, 21, 64]
            got = shm.get_contents_as_numpy(handle, np.float32, [2, 21, 64])
            np.testing.assert_allclose(got, ref[0].numpy(), atol=1e-4, rtol=1e-3)
            c.unregister_system_shared_memory(region)
        finally:
            shm.destroy_shared_memory_region(handle)


def test_grpc_and_shared_memory_answers_are_cut_to_the_request(tmp_path, pkg):
    grpc_and_shm_answers_are_eagers(tmp_path, pkg, "seq_out")


@pytest.mark.parametrize("flag, message", [
    ("nope:1=32", r"the model has no input 'nope'; its inputs are \['input_ids', 'attention_mask'\]"),
    ("input_ids:1=32", r"input 'attention_mask' dim 1 is 'seq' too; name it as well \(attention_mask:1\)"),
    ("input_ids:1,attention_mask:1=32,256", r"sizes \[256\] lie outside dim 'seq''s range \[8, 128\]"),
    ("input_ids:5,attention_mask:1=32", r"input 'input_ids' has 2 dims \[-1, -1\], no axis 5"),
])
def test_a_flag_the_model_does_not_fit_is_one_line(flag, message):
    r = run_aotc("export", "models/hf_bert.py", "--seq-buckets", flag, "--no-cache", "-o", "/tmp/never.pt2",
                 "--quick")
    assert r.returncode != 0 and re.search(message, r.stderr), r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_a_model_whose_answer_changes_with_padding_is_refused(tmp_path):
    out = tmp_path / "never.pt2"
    r = run_aotc("export", str(DATA / "pads_change_answer.py"), "--seq-buckets", "ids:1=16,64", "--no-cache",
                 "-o", str(out))
    assert r.returncode != 0 and not out.exists(), r.stdout + r.stderr
    assert re.search(r"the model's answer changes with padding: output '(tokens|pooled)'", r.stderr), r.stderr[-2000:]
    assert "attention mask" in r.stderr and "Traceback" not in r.stderr
    bad = run_aotc("export", "models/hf_bert.py", "--seq-buckets", "input_ids:1=x", "-o", str(out))
    assert bad.returncode == 2 and "--seq-buckets" in bad.stderr and "INPUT:AXIS" in bad.stderr
