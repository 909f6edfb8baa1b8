"""Static graphs beside the dynamic one (`aotc export --static-batches`): the export merges them into one
package and checks each against eager, the C++ runtime runs the one matching a call's batch and the dynamic
graph for every other batch, aotc-run's self-check covers them, a package that lists a graph it lacks is
refused at load naming the graph, and so is one whose main graph cannot lend a static graph its weights (held
with another dtype, or not at all)."""

from __future__ import annotations

import re
import zipfile

import pytest
import torch

from aotc.errors import PackageError
from aotc.manifest import Batch, StaticGraph
from aotc.graphs import static_graph_plan
from aotc.errors import ExportError
from aotc.runtime import Session
from conftest import REPO, eager_reference
from runtime_helpers import assert_close, edit_manifest, graft_static_graphs, one_line_error, run_aotc_run


@pytest.fixture(scope="module")
def pkg_static(export_package):
    # freezing off, as CUDA exports have it: the static graphs then run on the main graph's weights
    return export_package("models/mlp.py", "--static-batches", "16,1", "--freezing", "off")


@pytest.fixture(scope="module")
def pkg_static_frozen(export_package):
    # freezing on, the CPU default: the weights are folded into each graph for its batch, so each keeps its own
    return export_package("models/mlp.py", "--static-batches", "16")


def test_package_holds_one_graph_per_static_batch(pkg_static):
    s = Session(pkg_static)
    assert s.manifest.static_graphs == (StaticGraph(1, "batch1_static", "model"),
                                        StaticGraph(16, "batch16_static", "model"))
    with zipfile.ZipFile(pkg_static) as zf:
        sos = sorted(n.split("/")[3] for n in zf.namelist() if n.endswith(".so"))
    assert sos == ["batch16_static", "batch1_static", "model"]
    assert len(s.manifest.files_sha256) == 3  # every graph's .so is hashed and checked at load
    log = (pkg_static.parent / "export.log").read_text()  # the export's summary, kept beside the cached package
    assert ("static    batch 1 (batch1_static, weights of model), batch 16 (batch16_static, weights of model)"
            in log)
    assert re.search(r"^  ok +static graph batch1_static ", log, re.M) and \
        re.search(r"^  ok +static graph batch16_static ", log, re.M), log


def test_the_weights_are_in_the_package_once(pkg_static):
    # the static graphs are compiled without weights: each .so is smaller than the main graph's by more than
    # the model's weights (fc1 and fc2 of the MLP, 4.2 MB in fp32)
    weights = sum(p.numel() * p.element_size() for p in _mlp().parameters())
    with zipfile.ZipFile(pkg_static) as zf:
        so = {n.split("/")[3]: zf.getinfo(n).file_size for n in zf.namelist() if n.endswith(".so")}
    for graph in ("batch1_static", "batch16_static"):
        assert so["model"] - so[graph] > weights, so


def _mlp():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mlp_model", REPO / "models" / "mlp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.model()


def test_python_loader_lends_the_static_graph_its_weights(pkg_static):
    from aotc.loader import load_package

    with pytest.raises(PackageError, match="graph 'batch1_static' holds no weights of its own"):
        load_package(str(pkg_static), graph="batch1_static")
    with pytest.raises(PackageError, match=r"needs weights \['fc1.bias', 'fc1.weight'"):
        load_package(str(pkg_static), graph="batch1_static", weights={})
    model = _mlp()
    weights = {k: v.detach() for k, v in model.state_dict().items()}
    runner = load_package(str(pkg_static), graph="batch16_static", weights=weights)
    x = torch.randn(16, 512, generator=torch.Generator().manual_seed(3))
    (got,) = runner(x)
    with torch.no_grad():
        assert_close(got.numpy(), model(x).numpy(), runner.manifest.tolerance, "batch16_static, lent weights")


def test_frozen_static_graphs_keep_their_own_weights(pkg_static_frozen):
    s = Session(pkg_static_frozen)
    assert s.manifest.static_graphs == (StaticGraph(16, "batch16_static"),)
    r = run_aotc_run(pkg_static_frozen)
    assert r.returncode == 0, r.stderr
    assert "(graph batch16_static)" in r.stdout and "MISMATCH" not in r.stdout


def test_each_batch_runs_its_graph_and_matches_eager(pkg_static):
    s = Session(pkg_static)
    assert [s.graph_for_batch(n) for n in (1, 2, 15, 16, 64)] == \
        ["batch1_static", "model", "model", "batch16_static", "model"]
    gen = torch.Generator().manual_seed(7)
    for n in (1, 7, 16):
        x = torch.randn(n, 512, generator=gen)
        _, _, (ref,) = eager_reference("models/mlp.py", inputs=(x,))
        (got,) = s.run([x.numpy()])
        assert_close(got, ref.numpy(), s.manifest.tolerance, f"batch {n} through {s.graph_for_batch(n)}")


def test_aotc_run_self_check_covers_the_static_graphs(pkg_static):
    r = run_aotc_run(pkg_static)
    assert r.returncode == 0, r.stderr
    # batch 1 and 16 are the static graphs' own samples; the example (64) and the odd fresh batch run "model"
    assert "(graph batch16_static)" in r.stdout and "(graph batch1_static)" in r.stdout
    assert "(graph model)" in r.stdout
    assert "MISMATCH" not in r.stdout


def test_a_listed_graph_the_archive_lacks_is_refused(pkg_static, tmp_path):
    bad = edit_manifest(pkg_static, tmp_path / "bad.pt2",
                        lambda m: m["static_graphs"].append({"batch": 8, "graph": "batch8_static"}))
    with pytest.raises(PackageError, match="graph 'batch8_static'"):
        Session(bad, verify_hashes=False)
    r = run_aotc_run(bad)
    assert r.returncode != 0 and "graph 'batch8_static'" in one_line_error(r.stderr)


@pytest.mark.parametrize("change, words", [
    (lambda m: m["static_graphs"].append({"batch": 2000, "graph": "batch2000"}), "outside the package's batch range"),
    (lambda m: m["static_graphs"].append({"batch": 16, "graph": "again"}), "listed twice"),
    (lambda m: m["static_graphs"].append({"batch": 5, "graph": "batch1_static_x"}), "begins"),
    (lambda m: m["static_graphs"].append({"batch": 5, "graph": "model2"}), "begins"),
    (lambda m: m["static_graphs"].append({"batch": 5, "graph": "model"}), "other than 'model'"),
    (lambda m: m["static_graphs"].append({"batch": 5, "graph": "../x"}), "lower-case letters"),
    (lambda m: m.update(static_graphs={"batch": 5}), "must be an array"),
    (lambda m: m["static_graphs"][0].update(weights="own"), "'weights' must be \"model\""),
    # a graph compiled without weights, said to carry its own, would read null pointers
    (lambda m: m["static_graphs"][0].pop("weights") and None, "graph 'batch1_static' holds no weights, and the manifest"),
])
def test_bad_static_graph_entries_are_refused(pkg_static, tmp_path, change, words):
    bad = edit_manifest(pkg_static, tmp_path / "bad.pt2", change)
    with pytest.raises(PackageError, match=words):
        Session(bad, verify_hashes=False)


@pytest.mark.parametrize("main, words", [
    # the same model in fp16: every weight is there, as Half
    ("mlp_fp16", r"graph 'batch1?6?_static' needs weight '[\w.]+' as Float, graph 'model' holds it as Half"),
    # a model without the MLP's weights
    ("simple", r"graph 'batch1?6?_static' needs weight '[\w.]+', which graph 'model' does not hold"),
])
def test_a_static_graph_the_main_graph_cannot_lend_weights_to_is_refused(pkg_static, export_package, pkg_simple,
                                                                         tmp_path, main, words):
    """Static graphs compiled without weights, grafted (hashes and all) into a package whose main graph holds
    their weights with another dtype, or not at all: refused at load naming the graph and the weight."""
    main_pkg = pkg_simple if main == "simple" else export_package("models/mlp.py", "--dtype", "fp16", "--freezing", "off")
    bad = graft_static_graphs(main_pkg, pkg_static, tmp_path / f"graft_{main}.pt2")
    with pytest.raises(PackageError, match=words):
        Session(bad)
    r = run_aotc_run(bad)
    assert r.returncode == 2 and re.search(words, one_line_error(r.stderr)), r.stderr


def test_static_graph_plan():
    assert static_graph_plan((16, 1, 16), Batch(1, 64)) == [StaticGraph(1, "batch1_static"),
                                                            StaticGraph(16, "batch16_static")]
    assert static_graph_plan((), None) == []
    with pytest.raises(ExportError, match="no dynamic batch dim"):
        static_graph_plan((8,), None)
    with pytest.raises(ExportError, match=r"\[128\] outside the batch range \[1, 64\]"):
        static_graph_plan((8, 128), Batch(1, 64))


def test_static_graph_plan_for_the_buckets():
    """`--static-batches buckets[:N]`: the runtime's CUDA-graph buckets of the batch range (up to N)."""
    def batches(sizes, lo, hi):
        return [g.batch for g in static_graph_plan(sizes, Batch(lo, hi))]

    assert batches("buckets", 1, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert batches("buckets:32", 1, 64) == [1, 2, 4, 8, 16, 32]
    assert batches("buckets:40", 1, 64) == [1, 2, 4, 8, 16, 32]
    assert batches("buckets", 3, 20) == [4, 8, 16, 20]  # a batch of 3 pads to 4
    assert batches("buckets", 8, 8) == [8]
    with pytest.raises(ExportError, match=r"no bucket of the batch range \[3, 20\] is at most 2"):
        static_graph_plan("buckets:2", Batch(3, 20))
    with pytest.raises(ExportError, match="--static-batches buckets: the model has no dynamic batch dim"):
        static_graph_plan("buckets", None)


def test_a_file_both_graphs_compiled_alike_is_kept_in_each_graph(pkg_static, tmp_path):
    # A kernel two graphs compile identically (the same .cubin) is loaded by each .so from its own folder; the
    # merge once dropped the static graph's copy as a duplicate, and gpt2 failed on the H200 ("CUDA driver
    # error: file not found").
    from torch.export.pt2_archive import PT2ArchiveWriter

    from aotc import package
    from aotc.manifest import read

    def archive(path, extra: bytes):
        reader = torch._C.PyTorchFileReader(str(pkg_static))
        with PT2ArchiveWriter(str(path)) as w:
            for r in reader.get_all_records():
                if r.startswith("data/aotinductor/model/") and r not in package._SYSTEM_RECORDS:
                    w.write_bytes(r, reader.get_record(r))
            w.write_bytes("data/aotinductor/model/kernel.cubin", b"the same kernel")
            w.write_bytes("data/aotinductor/model/other.cubin", extra)

    main, static = tmp_path / "main.pt2", tmp_path / "static.pt2"
    archive(main, b"main's own")
    archive(static, b"the static graph's own")
    out = tmp_path / "out.pt2"
    package.finalize(str(main), str(out), read(str(pkg_static)), {}, {"batch4_static": str(static)})
    with zipfile.ZipFile(out) as zf:
        names = {n.split("/", 1)[1]: zf.read(n) for n in zf.namelist()}
    assert names["data/aotinductor/batch4_static/kernel.cubin"] == b"the same kernel"
    assert names["data/aotinductor/model/kernel.cubin"] == b"the same kernel"
    assert names["data/aotinductor/batch4_static/other.cubin"] == b"the static graph's own"
