"""bench/gpu.sh's command line, without a GPU: --help, and the refusals (unknown option or stage, a missing or
malformed value, a choice left in the environment), each one line on stderr and exit 2 before any stage runs
($OUT is never created). Every option and stage that --help names is one the parser knows."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from conftest import REPO

SCRIPT = REPO / "bench" / "gpu.sh"


def gpu_sh(tmp_path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AOTC_")}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30,
                          env={**clean, "OUT": str(tmp_path / "out"), **(env or {})})


def help_text(tmp_path) -> str:
    r = gpu_sh(tmp_path, "--help")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return r.stdout


def test_help_names_the_stages_and_options(tmp_path):
    text = help_text(tmp_path)
    assert text.startswith("usage: bash bench/gpu.sh [OPTION ...] [STAGE ...]")
    for stage in ("deps", "build", "export", "test", "bench", "probe", "loopback"):
        assert re.search(rf"^  {stage} ", text, re.M), stage
    assert "--budget-s" in text and "--extra-export" in text
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unknown option --bogus"),
    (["--bogus=1"], "unknown option --bogus"),
    (["-x"], "unknown option -x"),
    (["bogus"], "unknown stage 'bogus'"),
    (["test", "bogus"], "unknown stage 'bogus'"),
    (["--budget-s"], "--budget-s needs a value"),
    (["--budget-s", "ten"], "--budget-s takes a whole number, got 'ten'"),
    (["--test-gpu=x"], "--test-gpu takes a whole number, got 'x'"),
    (["--probe-batches", "1,8"], "--probe-batches takes whole numbers separated by spaces, got '1,8'"),
    (["--extra-export", "freezing"], "--extra-export takes LABEL=FLAGS, got 'freezing'"),
])
def test_refusals_are_one_line_and_exit_2(tmp_path, args, message):
    r = gpu_sh(tmp_path, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1 and message in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_a_choice_left_in_the_environment_is_refused(tmp_path):
    r = gpu_sh(tmp_path, "test", env={"AOTC_GPU_STAGES": "bench"})
    assert r.returncode == 2 and "AOTC_GPU_STAGES is set" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_every_documented_option_and_stage_is_parsed(tmp_path):
    """Each option of --help, given without its value, is known (it asks for the value); each stage of --help,
    followed by a bad option, is accepted (the bad option, parsed after it, is what stops the run)."""
    text = help_text(tmp_path)
    options = re.findall(r"^  (--[a-z0-9-]+) ", text, re.M)
    assert len(options) >= 17, options
    for opt in options:
        r = gpu_sh(tmp_path, opt)
        assert r.returncode == 2 and f"{opt} needs a value" in r.stderr, (opt, r.stderr)
    stages = re.findall(r"^  ([a-z]+) {2,}", text, re.M)
    assert {"deps", "build", "export", "check", "test", "multi", "bench", "memory"} <= set(stages), stages
    for stage in stages:
        r = gpu_sh(tmp_path, stage, "--bogus")
        assert r.returncode == 2 and "unknown option --bogus" in r.stderr, (stage, r.stderr)
    assert not (tmp_path / "out").exists()
