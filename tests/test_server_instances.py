"""aotc-server (C++) instance groups, black box: config.json's `instance_group` (Triton's form) places a
model's instances; the batcher spreads batches over them; stats and /metrics count each instance.

CPU tests run everywhere on the exported MLP; the two-GPU test is marked `cuda` and skips unless torch sees
at least two GPUs (run it on the x2 machine with `pytest -m cuda`). Each test starts its own server
(bench/launch.py) and sends requests from its own threads.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import read_samples
from launch import Server, make_repository
from test_server_batching import run_clients

TOL = {"atol": 1e-4, "rtol": 1e-4}


def infer_rows(s: Server, model: str, xs: np.ndarray, ys: np.ndarray, rows: list[int], tol: dict) -> None:
    """Sends xs[rows] as one request to `model` and checks every answered row against ys[rows]."""
    x = xs[rows].astype(np.float32)
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    status, r = s.json("POST", f"/v2/models/{model}/infer", body)
    assert status == 200, r
    got = np.array(r["outputs"][0]["data"], np.float32).reshape(ys[rows].shape)
    assert np.allclose(got, ys[rows], **tol), (rows, np.abs(got - ys[rows]).max())


def distinct_requests(n_rows: int, n: int) -> list[list[int]]:
    """n different row selections (sizes 1..3, varying order) from n_rows sample rows (n_rows >= 4)."""
    rng = np.random.default_rng(0)
    seen, out = set(), []
    while len(out) < n:
        rows = tuple(int(i) for i in rng.choice(n_rows, size=1 + len(out) % min(3, n_rows), replace=False))
        if rows not in seen:
            seen.add(rows)
            out.append(list(rows))
    return out


def metric(text: str, name: str, **labels: str) -> dict[str, float]:
    """{label line: value} of the series of `name` whose labels include `labels`."""
    out = {}
    for line in text.splitlines():
        m = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            out[m.group(1)] = float(m.group(2))
    return out


def check_instance_counts(s: Server, model: str) -> list[dict]:
    """Checks that per-instance counts add up in stats and /metrics; returns the stats' instance list."""
    status, stats = s.json("GET", f"/v2/models/{model}/stats")
    assert status == 200, stats
    st = stats["model_stats"][0]
    inst = st["instance_stats"]
    assert sum(i["execution_count"] for i in inst) == st["execution_count"] > 0, st
    assert sum(i["inference_count"] for i in inst) == st["inference_count"], st
    _, _, body = s.request("GET", "/metrics")
    text = body.decode()
    per = metric(text, "aotc_instance_exec_count", model=model)
    (total,) = metric(text, "nv_inference_exec_count", model=model).values()
    assert len(per) == len(inst) and sum(per.values()) == total == st["execution_count"], (per, total)
    return inst


def test_cpu_instances_share_the_batches(tmp_path, pkg_mlp):
    (xs,), (ys,) = read_samples(pkg_mlp)[0]
    repo = make_repository(tmp_path / "repo", {"mlp": pkg_mlp},
                           {"mlp": {"instance_group": [{"count": 3, "kind": "KIND_CPU"}], "max_batch_size": 4}})
    requests = distinct_requests(len(xs), 64)
    with Server("cpp", repo, "--intra-op-threads", "1") as s:
        assert "on cpu x3" in s.log()
        status, cfg = s.json("GET", "/v2/models/mlp/config")
        assert status == 200 and cfg["instance_group"] == [{"count": 3, "kind": "KIND_CPU"}], cfg

        assert run_clients(64, lambda i: infer_rows(s, "mlp", xs, ys, requests[i], TOL)) == []
        inst = check_instance_counts(s, "mlp")
        assert [i["device"] for i in inst] == ["cpu"] * 3, inst
        assert len({i["name"] for i in inst}) == 3, inst
        assert sum(i["inference_count"] for i in inst) == sum(len(r) for r in requests), inst
        assert sum(i["execution_count"] > 0 for i in inst) >= 2, inst  # more than one instance took batches
        assert s.stop() == 0


BAD_GROUPS = {
    "negative": ({"instance_group": [{"count": -1, "kind": "KIND_CPU"}]},
                 "instance_group[0].count must be an integer in 1..256, got -1"),
    "tpu": ({"instance_group": [{"count": 1, "kind": "KIND_TPU"}]},
            'instance_group[0].kind must be "KIND_GPU" or "KIND_CPU", got "KIND_TPU"'),
    "gpu_kind": ({"instance_group": [{"count": 1, "kind": "KIND_CPU"}, {"count": 2, "kind": "KIND_GPU"}]},
                 "instance_group[1] is KIND_GPU, but the package was exported for CPU; use KIND_CPU"),
    "gpu_index": ({"instance_group": [{"count": 1, "kind": "KIND_GPU", "gpus": [7]}]},
                  "instance_group[0] is KIND_GPU, but the package was exported for CPU"),
    "bad_index": ({"instance_group": [{"count": 1, "kind": "KIND_GPU", "gpus": [-1]}]},
                  "instance_group[0].gpus must be a non-empty list of GPU indices 0..127, got -1"),
    "cpu_gpus": ({"instance_group": [{"count": 1, "kind": "KIND_CPU", "gpus": [0]}]},
                 "instance_group[0] is KIND_CPU but lists gpus"),
    "no_kind": ({"instance_group": [{"count": 2}]}, 'instance_group[0] needs "kind": "KIND_GPU" or "KIND_CPU"'),
    "unknown_key": ({"instance_group": [{"count": 1, "kind": "KIND_CPU", "host_policy": "x"}]},
                    "instance_group[0] has an unknown key 'host_policy' (expected count, kind, gpus, name)"),
    "not_list": ({"instance_group": {"count": 1, "kind": "KIND_CPU"}}, "'instance_group' must be a non-empty list"),
    "empty": ({"instance_group": []}, "'instance_group' must be a non-empty list"),
    "both": ({"instance_group": [{"count": 1, "kind": "KIND_CPU"}], "num_runners": 2},
             "give 'instance_group' or 'num_runners'/'device_index', not both"),
    "inline_not_bool": ({"run_inline_when_idle": "yes"}, "'run_inline_when_idle' must be true or false"),
    "promotion_not_bool": ({"seq_bucket_promotion": 1},
                           "'seq_bucket_promotion' must be true, false or \"auto\", got 1"),
    "promotion_junk": ({"seq_bucket_promotion": "sometimes"},
                       "'seq_bucket_promotion' must be true, false or \"auto\", got \"sometimes\""),
}


def test_bad_instance_groups_are_refused_while_others_serve(tmp_path, pkg_mlp):
    (xs,), (ys,) = read_samples(pkg_mlp)[0]
    models = {"mlp": pkg_mlp, "runners": pkg_mlp, **{name: pkg_mlp for name in BAD_GROUPS}}
    configs = {"runners": {"num_runners": 2}, **{name: cfg for name, (cfg, _) in BAD_GROUPS.items()}}
    with Server("cpp", make_repository(tmp_path / "repo", models, configs), "--no-strict-readiness") as s:
        _, index = s.json("POST", "/v2/repository/index", {})
        by_name = {e["name"]: e for e in index}
        log = s.log()
        for name, (_, reason) in BAD_GROUPS.items():
            e = by_name[name]
            assert e["state"] == "UNAVAILABLE" and reason in e["reason"] and "\n" not in e["reason"], e
            assert re.search(rf"failed to load model '{name}' version 1 from .*: .*{re.escape(reason)}", log), name
            status, r = s.json("POST", f"/v2/models/{name}/infer", {"inputs": []})
            assert status == 503 and reason in r["error"], r
        for model in ("mlp", "runners"):
            assert by_name[model]["state"] == "READY", by_name[model]
            infer_rows(s, model, xs, ys, list(range(len(xs))), TOL)
        # num_runners keeps its meaning: that many CPU instances, reported as one KIND_CPU group.
        _, cfg = s.json("GET", "/v2/models/runners/config")
        assert cfg["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}], cfg
        assert [i["device"] for i in check_instance_counts(s, "runners")] == ["cpu", "cpu"]
        assert s.stop() == 0


@pytest.fixture(scope="session")
def cuda_mlp(tmp_path_factory) -> Path:
    """The MLP exported for CUDA ($AOTC_CUDA_PACKAGES/mlp.pt2 when given); skips with fewer than 2 GPUs."""
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, torch sees {torch.cuda.device_count()}")
    given = Path(os.environ.get("AOTC_CUDA_PACKAGES", "/nonexistent")) / "mlp.pt2"
    if given.is_file():
        return given
    from test_cuda import _export  # importable only where CUDA is available

    out = tmp_path_factory.mktemp("cuda_pkgs") / "mlp.pt2"
    _export("mlp", out)
    return out


@pytest.mark.cuda
def test_instances_on_two_gpus(tmp_path, cuda_mlp):
    import torch

    (xs,), (ys,) = read_samples(cuda_mlp)[0]
    tol = {"atol": 1e-3, "rtol": 1e-3}
    n_gpus = torch.cuda.device_count()
    repo = make_repository(tmp_path / "repo", {"both": cuda_mlp, "gpu1": cuda_mlp, "far": cuda_mlp, "cpu": cuda_mlp}, {
        "both": {"instance_group": [{"count": 2, "kind": "KIND_GPU"}], "max_batch_size": 8},
        "gpu1": {"instance_group": [{"count": 1, "kind": "KIND_GPU", "gpus": [1]}]},
        "far": {"instance_group": [{"count": 1, "kind": "KIND_GPU", "gpus": [0, n_gpus]}]},
        "cpu": {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]},
    })
    requests = distinct_requests(len(xs), 64)
    with Server("cpp", repo, "--no-strict-readiness") as s:  # "far" and "cpu" never get ready
        _, cfg = s.json("GET", "/v2/models/both/config")
        assert cfg["instance_group"] == [{"count": 2, "kind": "KIND_GPU"}], cfg
        _, cfg = s.json("GET", "/v2/models/gpu1/config")
        assert cfg["instance_group"] == [{"count": 1, "kind": "KIND_GPU", "gpus": [1]}], cfg
        _, index = s.json("POST", "/v2/repository/index", {})
        by_name = {e["name"]: e for e in index}
        assert f"instance_group[0].gpus names GPU {n_gpus}, but {n_gpus} GPU(s) are visible" in by_name["far"]["reason"]
        assert "is KIND_CPU, but the package was exported for CUDA" in by_name["cpu"]["reason"]

        infer_rows(s, "gpu1", xs, ys, list(range(len(xs))), tol)  # parity on GPU 1 alone
        assert [i["device"] for i in check_instance_counts(s, "gpu1")] == ["cuda:1"]
        assert run_clients(64, lambda i: infer_rows(s, "both", xs, ys, requests[i], tol)) == []
        inst = check_instance_counts(s, "both")
        per_gpu = {d: sum(i["execution_count"] for i in inst if i["device"] == d) for d in {i["device"] for i in inst}}
        assert sorted(per_gpu) == [f"cuda:{d}" for d in range(n_gpus)] and len(inst) == 2 * n_gpus, inst
        assert all(n > 0 for n in per_gpu.values()), per_gpu  # every GPU took batches
        assert s.stop() == 0
