"""What `aotc export` says when the model file or the model is wrong: one line, no traceback, exit != 0.

Bad model files are checked in-process (fast, every kind); a few run through the real CLI to check what
the user sees; export failures (torch.export refusing the model) always run through the CLI."""

from __future__ import annotations

import pytest

from aotc.errors import ModelFileError
from aotc.load_model import load_model_file, split_spec
from conftest import DATA, REPO, run_aotc

BAD_FILES = {
    "no_model": "has no function model()",
    "model_not_module": "model() returned builtin_function_or_method, expected a torch.nn.Module",
    "no_example_inputs": "has no function example_inputs()",
    "example_not_tuple": "example_inputs() returned a single tensor, expected a tuple of tensors",
    "example_not_tensors": "example_inputs()[1] is list, expected a torch.Tensor",
    "wrong_input_count": "forward(input) cannot take the inputs of example_inputs(): too many positional arguments",
    "dynamic_shapes_bad_name": "dynamic_shapes() names input 'inputs', but forward's inputs are ['input']",
    "dynamic_shapes_bad_dim": "names dim 3, but the input has 2 dims",
    "dynamic_shapes_not_dict": "dynamic_shapes() returned str, expected a dict keyed by input name",
    "example_outside_range": "has size 16 in dim 0, outside its Dim range [1, 8]",
    "syntax_error": "syntax_error.py:5: syntax error",
    "import_error": "raised ModuleNotFoundError: No module named 'no_such_module_for_aotc_tests'",
    "bad_output_names": "output_names() gives 2 names but the model returns 1 outputs",
    "bad_tolerance": "tolerance() returned {'atol': -1.0",
    "returns_non_tensor": "forward's output 'stats.count' is int, expected a tensor",
    "positional_to_non_tensor": "example_inputs()[1] goes to forward's parameter 'cache' (annotated Cache | None), "
                                "not a tensor parameter; give the inputs by name with example_kwargs()",
    "kwargs_unknown_name": "forward(x) cannot take the inputs of example_kwargs(): got an unexpected keyword "
                           "argument 'mask'",
    "kwargs_not_dict": "example_kwargs() returned tuple, expected a dict of tensors keyed by forward's parameter names",
}


def _load_and_run(path: str):
    """What the exporter does before torch.export: load the file, build the model, run it eagerly."""
    from aotc import export as exp

    mf = load_model_file(path)
    model, inputs = exp.prepare(mf, "cpu", "fp32")
    exp.eager_outputs(model, inputs, mf)


def _one_line_error(r, fragment: str) -> str:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    errors = [line for line in r.stderr.splitlines() if "aotc: error:" in line]
    assert len(errors) == 1, r.stderr
    assert fragment in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_model_file_gets_one_line(name):
    with pytest.raises(ModelFileError) as err:
        _load_and_run(str(DATA / f"{name}.py"))
    msg = str(err.value)
    assert BAD_FILES[name] in msg and "\n" not in msg


def test_missing_name_lists_the_functions_there():
    with pytest.raises(ModelFileError, match=r"has no function nosuch\(\).*functions defined: .*model"):
        load_model_file(str(REPO / "models/mlp.py:nosuch"))


def test_missing_file():
    with pytest.raises(ModelFileError, match="model file '.*nothere.py' not found"):
        load_model_file("nothere.py")


def test_split_spec():
    assert split_spec("models/bert.py:bert_base") == ("models/bert.py", "bert_base")
    assert split_spec("models/bert.py") == ("models/bert.py", "model")
    assert split_spec("C:/x.py") == ("C:/x.py", "model")


@pytest.mark.parametrize("args, fragment", [
    (["tests/data/example_not_tuple.py"], "expected a tuple of tensors"),
    (["tests/data/syntax_error.py"], "syntax error"),
    (["models/mlp.py:nosuch"], "has no function nosuch()"),
    (["models/mlp.py", "--dynamic-batch", "1:8"], "--dynamic-batch 1:8 does not contain the example batch size 64"),
    (["models/mlp.py", "--dynamic-batch", "8"], "expected MIN:MAX"),
    (["models/mlp.py", "-o", "out.zip"], "must end in .pt2"),
    (["models/mlp.py", "--static-batches", "8,2000"], "[2000] outside the batch range [1, 1024]"),
    (["models/mlp.py", "--example-batch", "2000"], "outside its Dim range [1, 1024]"),
])
def test_cli_prints_one_line_for_a_bad_model_file(args, fragment, capsys, monkeypatch, tmp_path):
    """The CLI's own entry point, in-process (a subprocess per case would mostly time torch's import)."""
    from aotc.cli import main

    monkeypatch.chdir(REPO)
    if "-o" not in args:
        args = [*args, "-o", str(tmp_path / "never_written.pt2")]
    rc = main(["export", *args])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "aotc: error:" in line]
    assert rc == 2 and len(lines) == 1 and fragment in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("value", ["buckets:0", "buckets:x", "buckets:"])
def test_cli_refuses_bad_bucket_caps(value, capsys):
    from aotc.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["export", "models/mlp.py", "--static-batches", value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "expected buckets:N with N a whole number >= 1" in err, err


def test_cli_takes_buckets():
    from aotc.cli import build_parser

    for value in ("buckets", "buckets:32"):
        args = build_parser().parse_args(["export", "models/mlp.py", "--static-batches", value])
        assert args.static_batches == value
    args = build_parser().parse_args(["export", "models/mlp.py", "--static-batches", "8,1"])
    assert args.static_batches == (8, 1)
    args = build_parser().parse_args(["export", "models/mlp.py", "--static-batches", "none"])
    assert args.static_batches == ()
    args = build_parser().parse_args(["export", "models/mlp.py"])
    assert args.static_batches is None


def test_static_batches_default_by_device():
    """Not given: the buckets up to 32 on CUDA where the model has a dynamic batch; none on the CPU, and none
    without a batch dim or without a bucket up to 32 in it (no error: the default asks for nothing it cannot
    have). Given, as asked, errors included."""
    from aotc.errors import ExportError
    from aotc.manifest import Batch
    from aotc.graphs import static_plan as _static_plan
    from aotc.pipeline import ExportOptions

    def sizes(opts, batch):
        return [g.batch for g in _static_plan(opts, batch)]

    cuda, cpu = ExportOptions(device="cuda"), ExportOptions(device="cpu")
    assert sizes(cuda, Batch(1, 1024)) == [1, 2, 4, 8, 16, 32]
    assert sizes(cuda, Batch(3, 20)) == [4, 8, 16, 20]
    assert sizes(cuda, None) == [] and sizes(cuda, Batch(64, 128)) == []
    assert sizes(cpu, Batch(1, 1024)) == []
    assert sizes(ExportOptions(device="cuda", static_batches=()), Batch(1, 64)) == []
    assert sizes(ExportOptions(device="cpu", static_batches=(4,)), Batch(1, 64)) == [4]
    with pytest.raises(ExportError, match="no bucket of the batch range"):
        _static_plan(ExportOptions(device="cuda", static_batches="buckets:32"), Batch(64, 128))


@pytest.mark.parametrize("args", [["--static-batches", "8,x"], ["--static-batches", "0"], ["--static-batches", ""],
                                  ["--example-batch", "0"], ["--example-batch", "many"]])
def test_cli_refuses_bad_batch_sizes(args, capsys):
    """argparse refuses them before anything loads, naming the option and what it expects."""
    from aotc.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["export", "models/mlp.py", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {args[0]}: expected a whole number >= 1" in err, err
    assert "Traceback" not in err


EXPORT_FAILURES = {
    "data_dependent": "data-dependent control flow at",
    "range_violation": "does not work for every size in the declared dynamic range: batch = L['x'].size()[0] "
                       "in batch <= 64 must satisfy (L['x'].size()[0] % 2) == 0; fix: declare `_batch = "
                       "Dim('_batch', min=1, max=32); batch = 2*_batch` in dynamic_shapes()",
    "no_fake_kernel": "an operator cannot be traced",
    "python_op": "ops with no C shim that would call back into Python at run time (aotc_test.twice.default)",
}


@pytest.mark.parametrize("name", ["data_dependent", "python_op"])
def test_export_failure_prints_no_traceback(name, tmp_path):
    """As the user runs it: a fresh process, nothing but the progress lines and the one error line."""
    r = run_aotc("export", f"tests/data/{name}.py", "-o", tmp_path / "x.pt2")
    line = _one_line_error(r, EXPORT_FAILURES[name])
    assert "fix:" in line or "pass --allow-python-ops" in line
    assert all(ln.startswith("[") or ln.startswith("aotc: error:") for ln in r.stderr.splitlines()), r.stderr
    assert not (tmp_path / "x.pt2").exists()


@pytest.mark.parametrize("name", sorted(EXPORT_FAILURES))
def test_export_failure_names_cause_and_fix(name, tmp_path, capsys, monkeypatch):
    from aotc.cli import main

    monkeypatch.chdir(REPO)
    rc = main(["export", f"tests/data/{name}.py", "-o", str(tmp_path / "x.pt2")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "aotc: error:" in line]
    assert rc == 2 and len(lines) == 1 and EXPORT_FAILURES[name] in lines[0], err
    assert "fix:" in lines[0] or "pass --allow-python-ops" in lines[0]


def test_verbose_shows_the_traceback(tmp_path):
    r = run_aotc("export", "tests/data/data_dependent.py", "-o", tmp_path / "x.pt2", "--verbose")
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_parity_failure_exits_nonzero_and_says_so(tmp_path):
    out = tmp_path / "noisy.pt2"
    r = run_aotc("export", "tests/data/nondeterministic.py", "-o", out)
    assert r.returncode == 1, r.stderr
    assert "FAIL" in r.stdout and "Traceback" not in r.stderr
    assert "aotc: error: parity failed for example inputs" in r.stderr
    assert out.exists()  # kept for inspection
