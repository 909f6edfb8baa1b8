"""Every way a package is refused by the C++ runtime, through the Python module (PackageError) and through
`aotc-run` (exit 2, one line `aotc-run: error: ...`, never a crash). Tampered packages are copies of the
cached mlp package rewritten with zipfile in tmp_path."""

from __future__ import annotations

import json
import zipfile

import pytest

from aotc.errors import PackageError
from aotc.runtime import Session
from runtime_helpers import edit_manifest, one_line_error, rewrite, run_aotc_run, so_name


def _flip_so_byte(pkg, dst):
    so = so_name(pkg)

    def edit(name, data):
        if name != so:
            return data
        b = bytearray(data)
        b[len(b) // 2] ^= 0x01
        return bytes(b)

    return rewrite(pkg, dst, edit)


def _extra_so(pkg, dst):
    with zipfile.ZipFile(pkg) as zf:
        root = zf.namelist()[0].split("/")[0]
    rewrite(pkg, dst, lambda n, d: d)
    with zipfile.ZipFile(dst, "a") as zf:
        zf.writestr(f"{root}/data/aotinductor/model/extra.so", b"\x7fELF not listed")
    return dst


def _truncate(pkg, dst):
    data = pkg.read_bytes()
    dst.write_bytes(data[: len(data) // 2])
    return dst


def _no_manifest(pkg, dst):
    def edit(name, data):
        if name.endswith("_metadata.json"):
            meta = json.loads(data)
            meta.pop("aotc.manifest")
            return json.dumps(meta).encode()
        return data

    return rewrite(pkg, dst, edit)


def _drop_hash(m):
    m["files_sha256"] = {}


def _wrong_hash(m):
    m["files_sha256"] = {k: "0" * 64 for k in m["files_sha256"]}


CASES = {
    # name: (make tampered copy, words the one-line reason must contain; a tuple: one of them)
    "flipped .so byte": (_flip_so_byte, ["sha256 of", "modified after export"]),
    "wrong hash in manifest": (lambda p, d: edit_manifest(p, d, _wrong_hash), ["sha256 of", "the manifest says 0000"]),
    ".so not listed": (lambda p, d: edit_manifest(p, d, _drop_hash), ["does not list in files_sha256"]),
    "extra unlisted .so": (_extra_so, ["extra.so", "does not list"]),
    "truncated archive": (_truncate, ["corrupt or truncated"]),
    "not a zip": (lambda p, d: (d.write_bytes(b"PK\x03\x04 garbage" * 100), d)[1], ["corrupt or truncated"]),
    "missing manifest": (_no_manifest, ["has no aotc manifest"]),
    "manifests disagree": (lambda p, d: edit_manifest(p, d, lambda m: {**m, "name": "other"}, only_first=True),
                           ["differ"]),
    "other torch version": (lambda p, d: edit_manifest(p, d, lambda m: {**m, "torch_version": "2.1.0+cpu"}),
                            ["compiled with torch 2.1.0+cpu", "re-export"]),
    "unknown format": (lambda p, d: edit_manifest(p, d, lambda m: {**m, "format": "aotc/9"}), ["'aotc/9'"]),
    "malformed manifest": (lambda p, d: edit_manifest(p, d, lambda m: {**m, "inputs": "x"}), ["'inputs' must be a list"]),
    "missing CPU ISA": (lambda p, d: edit_manifest(p, d, lambda m: {**m, "cpu_isa": "avx9000"}), ["avx9000"]),
    # No GPU: "package runs on CUDA, but ..."; a GPU: no GPU is sm_10.
    "CUDA package": (lambda p, d: edit_manifest(p, d, lambda m: {**m, "device": "cuda", "cuda_arch": ["sm_10"]}),
                     [("runs on CUDA", "built for sm_10")]),
}


def _assert_words(message: str, words: list) -> None:
    for word in words:
        alternatives = word if isinstance(word, tuple) else (word,)
        assert any(w in message for w in alternatives), message


@pytest.fixture(scope="module")
def tampered(pkg_mlp, tmp_path_factory):
    out = tmp_path_factory.mktemp("tampered")
    return {name: make(pkg_mlp, out / f"{i}.pt2") for i, (name, (make, _)) in enumerate(CASES.items())}


@pytest.mark.parametrize("case", list(CASES))
def test_python_module_refuses(tampered, case):
    with pytest.raises(PackageError) as e:
        Session(tampered[case])
    message = str(e.value)
    assert "\n" not in message
    _assert_words(message, CASES[case][1])


@pytest.mark.parametrize("case", list(CASES))
def test_aotc_run_refuses_with_one_line(tampered, case):
    r = run_aotc_run(tampered[case])
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    _assert_words(one_line_error(r.stderr), CASES[case][1])


def test_missing_package(tmp_path):
    with pytest.raises(PackageError, match="does not exist"):
        Session(tmp_path / "nope.pt2")
    r = run_aotc_run(tmp_path / "nope.pt2")
    assert r.returncode == 2 and "does not exist" in one_line_error(r.stderr)


def test_untampered_copy_is_accepted(pkg_mlp, tmp_path):
    # The rewrite itself (zipfile, stored) must not be what the refusals above detect.
    copy = rewrite(pkg_mlp, tmp_path / "copy.pt2", lambda n, d: d)
    r = run_aotc_run(copy)
    assert r.returncode == 0, r.stderr


def test_hash_check_can_be_turned_off_and_is_on_by_default(tampered):
    # The .so is intact, only its recorded hash is wrong: loads when asked not to verify, refused otherwise.
    pkg = tampered["wrong hash in manifest"]
    session = Session(pkg, verify_hashes=False)
    (x,), (want,) = session.samples()[0]
    assert session.run([x])[0].shape == want.shape
    with pytest.raises(PackageError):
        Session(pkg)


def test_num_runners_must_be_positive(pkg_mlp):
    from aotc.errors import InputError

    with pytest.raises(InputError, match="num_runners is 0"):
        Session(pkg_mlp, num_runners=0)
