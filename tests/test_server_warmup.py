"""Warm-up before READY (Model::warm_up): by default the package's first sample runs on every runner (and at
every CUDA-graph bucket, tests/test_server_cuda.py); config.json's model_warmup (Triton's form) replaces it;
an empty list turns it off; a bad entry keeps the version from loading, with the entry named. CPU packages,
black box; the calls are counted from the server's log line and its statistics."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from launch import Server, make_repository


def warm_calls(server: Server, model: str) -> int:
    m = re.search(rf"loaded model '{model}' version 1 .* \((\d+) warm-up calls\)", server.log())
    assert m, server.log()
    return int(m.group(1))


def test_default_warm_up_runs_the_stored_sample_on_every_runner(tmp_path, pkg_mlp):
    repo = make_repository(tmp_path / "r", {"mlp": pkg_mlp}, {"mlp": {"num_runners": 3}})
    with Server("cpp", repo) as s:
        assert warm_calls(s, "mlp") == 3 * 2  # two calls on each of the three runners
        _, st = s.json("GET", "/v2/models/mlp/stats")
        assert st["model_stats"][0]["inference_stats"]["success"]["count"] == 0  # not counted as requests


WARMUP = [{"name": "zeros", "batch_size": 4, "count": 2,
           "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [512], "zero_data": True}}},
          {"name": "from a file", "batch_size": 2, "count": 1,
           "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [512], "input_data_file": "x.bin"}}},
          {"batch_size": 1, "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [512], "random_data": True}}}]


def test_model_warmup_runs_each_entry_and_is_in_the_config(tmp_path, pkg_mlp):
    repo = make_repository(tmp_path / "r", {"mlp": pkg_mlp, "off": pkg_mlp},
                           {"mlp": {"num_runners": 2, "model_warmup": WARMUP}, "off": {"model_warmup": []}})
    np.ones((2, 512), np.float32).tofile(repo / "mlp" / "x.bin")
    with Server("cpp", repo) as s:
        assert warm_calls(s, "mlp") == 2 * (2 + 1 + 1) and warm_calls(s, "off") == 0
        _, cfg = s.json("GET", "/v2/models/mlp/config")
        assert cfg["model_warmup"][1] == {"name": "from a file", "batch_size": 2, "count": 1, "inputs": {
            "x": {"data_type": "TYPE_FP32", "dims": [512], "input_data_file": "x.bin"}}}
        assert s.json("GET", "/v2/models/mlp")[0] == 200


@pytest.mark.parametrize("entry, message", [
    ({"inputs": {"y": {"data_type": "TYPE_FP32", "dims": [512], "zero_data": True}}}, "names input 'y', which the package lacks"),
    ({"inputs": {"x": {"data_type": "TYPE_INT32", "dims": [512], "zero_data": True}}}, "gives input 'x' as TYPE_INT32, the package takes TYPE_FP32"),
    ({"inputs": {"x": {"data_type": "TYPE_FP32", "dims": [511], "zero_data": True}}}, "input 'x' dim 1 is 511"),
    ({"batch_size": 2, "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [512], "input_data_file": "x.bin"}}},
     "holds 2048 bytes, input 'x' of shape [2, 512] needs 4096"),
    ({"inputs": {"x": {"data_type": "TYPE_FP32", "dims": [512], "input_data_file": "none.bin"}}}, "cannot read input_data_file"),
])
def test_a_bad_entry_keeps_the_version_from_loading(tmp_path, pkg_mlp, entry, message):
    repo = make_repository(tmp_path / "r", {"mlp": pkg_mlp}, {"mlp": {"model_warmup": [entry]}})
    np.ones(512, np.float32).tofile(repo / "mlp" / "x.bin")
    with Server("cpp", repo, "--no-strict-readiness") as s:
        _, index = s.json("POST", "/v2/repository/index", {})
        (v,) = index
        assert v["state"] == "UNAVAILABLE" and "config.json: model_warmup[0]" in v["reason"], v
        assert message in v["reason"], v["reason"]


@pytest.mark.parametrize("warmup, message", [
    ({}, "'model_warmup' must be a list of"),
    ([{"inputs": {"x": {"data_type": "TYPE_FP32", "dims": [512]}}}], "needs one of zero_data, random_data, input_data_file"),
    ([{"inputs": {"x": {"data_type": "TYPE_FP32", "dims": [512], "zero_data": True, "random_data": True}}}], "gives two data sources"),
    ([{"count": 0, "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [512], "zero_data": True}}}], ".count must be an integer in 1..1000"),
    ([{"inputs": {"x": {"data_type": "TYPE_FP32", "dims": [512], "input_data_file": "../x"}}}], "a file name beside config.json"),
    ([{"inputs": {}}], ".inputs must be a non-empty object"),
    ([{"shape": [1], "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [512], "zero_data": True}}}], "unknown key 'shape'"),
])
def test_a_malformed_model_warmup_is_refused_naming_the_field(tmp_path, pkg_mlp, warmup, message):
    repo = make_repository(tmp_path / "r", {"mlp": pkg_mlp})
    (repo / "mlp" / "config.json").write_text(json.dumps({"model_warmup": warmup}))
    with Server("cpp", repo, "--no-strict-readiness") as s:
        _, (v,) = s.json("POST", "/v2/repository/index", {})
        assert v["state"] == "UNAVAILABLE" and message in v["reason"], v
