"""The client installs alone: `pip install python_client/` into a fresh venv with no torch and no aotc, then
that venv's Python checks a running aotc-server (the C++ binary on the exported packages): metadata, inference
with binary and JSON tensors checked against numpy, a refused request, and `aotc-bench`. The venv is built
once per test session (about 20 s, pip's cache makes later ones quicker)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO
from launch import Server

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def client_python(tmp_path_factory):
    root = tmp_path_factory.mktemp("client-alone")
    source = shutil.copytree(REPO / "python_client", root / "src")  # setuptools builds in the source folder
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
    py = root / "venv" / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(source)],
                       capture_output=True, text=True, timeout=480)
    assert r.returncode == 0, r.stdout + r.stderr
    return py


def test_the_fresh_venv_has_the_client_and_no_torch(client_python):
    r = subprocess.run([str(client_python), "-c", textwrap.dedent("""
        import importlib.util, aotc_client.client, aotc_client.bench
        print(importlib.util.find_spec("torch"), importlib.util.find_spec("aotc"), aotc_client.__file__)
    """)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    torch_spec, aotc_spec, where = r.stdout.split()
    assert torch_spec == aotc_spec == "None" and "site-packages" in where, r.stdout


CHECK = textwrap.dedent("""
    import sys
    import numpy as np
    from aotc_client import Client
    from aotc_client.compare import assert_close
    from aotc_client.errors import AotcError

    url = sys.argv[1]
    for binary in (True, False):
        with Client(url, binary=binary) as c:
            assert c.live() and c.ready("simple")
            meta = c.metadata("simple")
            assert [t["name"] for t in meta["inputs"]] == ["INPUT0", "INPUT1"], meta
            x = c.random_inputs("simple", sizes=5, seed=3)
            a, b = x["INPUT0"], x["INPUT1"]
            got = c.infer("simple", x)
            # int32 outputs: exact
            assert_close(got, {"OUTPUT0": a + b, "OUTPUT1": a - b}, what=f"simple, binary={binary}")
            try:
                c.infer("simple", {"INPUT0": a.astype(np.float32), "INPUT1": b})
            except AotcError as e:
                assert "INT32" in str(e), e
            else:
                raise AssertionError("a float32 INPUT0 was accepted")
    print("client checks passed")
""")


def test_the_client_alone_checks_a_running_aotc_server(client_python, model_repository):
    with Server("cpp", model_repository) as server:
        r = subprocess.run([str(client_python), "-c", CHECK, server.url], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0 and "client checks passed" in r.stdout, r.stdout + r.stderr
        bench = client_python.parent / "aotc-bench"
        r = subprocess.run([str(bench), "--url", server.url, "--model", "simple", "--concurrency", "1,2",
                            "--duration", "0.5", "--warmup", "0.1"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        rows = [line.split() for line in r.stdout.splitlines() if line.startswith(server.url)]
        assert [row[1] for row in rows] == ["1", "2"] and all(int(row[-1]) == 0 and float(row[2]) > 0
                                                              for row in rows), r.stdout
        r = subprocess.run([str(bench), "--url", server.url, "--model", "simple", "--concurrency", "0"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.strip() == ("aotc-bench: error: --concurrency 0 is out of range; "
                                                          "expected 1..1024"), r.stderr
