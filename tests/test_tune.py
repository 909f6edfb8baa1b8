"""`aotc tune` end to end on tiny models with a short budget: the table, the Pareto plot, tune.json and a
winner's repository entry that aotc-server serves; an impossible budget says the best p99 it reached and with
what; an export variant that fails is dropped with its reason; bad flags are one line."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np

from conftest import DATA, run_aotc
from launch import Server

TUNE = ("--budget-min", "0.4", "--first-seconds", "0.3")


def test_tune_writes_the_table_the_plot_and_a_winner_that_serves(tmp_path, pkg_mlp):
    out = tmp_path / "tuned"
    # an entry an earlier tune left in the same folder: served beside the winner, and not measured for it
    (out / "aaa_earlier" / "1").mkdir(parents=True)
    shutil.copyfile(pkg_mlp, out / "aaa_earlier" / "1" / "model.pt2")
    r = run_aotc("tune", "models/simple.py", "--p99-ms", "50", "--concurrency", "2,4", "--variants", "default",
                 "-o", str(out), *TUNE, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"^round 1: \d+ candidates x 2 concurrencies", r.stdout, re.M) and "left in this round" in r.stdout
    md = (out / "tune.md").read_text()
    assert "| configuration | round | c=2 req/s |" in md and "p99 < 50 ms" in md and "- winner: " in md
    assert re.search(r"the winner has [0-9.]+x its throughput", md), md
    # the entry served as a user serves it, measured as the search measured
    assert re.search(r"`aotc serve \S+ ?.*` served [0-9.]+ req/s, p99 [0-9.]+ ms: [0-9.]+x the throughput measured",
                     md), md
    assert "serving the entry as `aotc serve" in r.stdout
    info = json.loads((out / "tune.json").read_text())
    assert info["winner"] and len(info["candidates"]) > 5
    served = info["served"]
    assert served["command"].startswith(f"aotc serve {out}") and set(served["per_concurrency"]) == {"2", "4"}
    assert all(v["req_per_s"] > 0 and v["errors"] == 0 for v in served["per_concurrency"].values()), served
    assert all(c["per_concurrency"]["2"]["req_per_s"] > 0 for c in info["candidates"])
    svg = (out / "tune_pareto.svg").read_text()
    assert svg.startswith("<svg") and "budget 50 ms" in svg and svg.count("<circle") == len(info["candidates"])
    winner = next(c for c in info["candidates"] if c["label"] == info["winner"])
    assert (out / "simple" / "1" / "model.pt2").is_file()
    if winner["config"] is not None:
        assert json.loads((out / "simple" / "config.json").read_text()) == winner["config"]
    with Server("cpp", out, *winner["server_flags"]) as s:
        a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.ones((1, 16), np.int32)
        status, body = s.json("POST", "/v2/models/simple/infer", {"inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a.ravel().tolist()},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b.ravel().tolist()}]})
        assert status == 200 and body["outputs"][0]["data"] == (a + b).ravel().tolist(), body


def test_an_impossible_budget_says_the_best_p99_and_a_failed_variant_is_dropped(tmp_path):
    out = tmp_path / "tuned"
    r = run_aotc("tune", str(DATA / "no_batch.py"), "--p99-ms", "0.0001", "--concurrency", "2", "--variants",
                 "default,static-batches", "-o", str(out), *TUNE, timeout=900)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"no configuration met p99 < 0.0001 ms; the best p99 reached was [0-9.]+ ms, with default",
                     r.stdout), r.stdout[-2000:]
    assert re.search(r"export static-batches: dropped: .*no dynamic batch dim", r.stdout), r.stdout
    md = (out / "tune.md").read_text()
    assert "No configuration met p99 < 0.0001 ms" in md and "- static-batches: " in md
    assert not (out / "no_batch").exists()  # no winner, no entry


def test_bad_flags_are_one_line(tmp_path):
    for args, words in ((["--concurrency", "0"], "expected C[,C...]"), (["--p99-ms", "-1"], "above 0"),
                        (["--variants", "nope"], "--variants nope: not a variant here")):
        base = ["tune", "models/simple.py", "--p99-ms", "5", "--concurrency", "2", "-o", str(tmp_path / "t")]
        for flag in args[::2]:
            i = base.index(flag) if flag in base else None
            if i is not None:
                del base[i:i + 2]
        r = run_aotc(*base, *args, timeout=300)
        assert r.returncode != 0 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
