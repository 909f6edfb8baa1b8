"""The shape of the code, checked: no import cycle inside export/aotc or python_client/aotc_client (imports
inside functions count: a lazy import is still a dependency), the client never imports aotc or torch, and
no source file outside the tests is over about 400 lines. Reads the sources with ast; imports nothing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"aotc": REPO / "export" / "aotc", "aotc_client": REPO / "python_client" / "aotc_client"}
MAX_LINES = 400


def _modules(package: str) -> dict[str, Path]:
    root = PACKAGES[package]
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = [package, *f.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that module `name` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # `from pkg import mod` names a submodule when there is one, else something of pkg itself
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {**_modules("aotc"), **_modules("aotc_client")}
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_client_needs_neither_aotc_nor_torch():
    for name, path in _modules("aotc_client").items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad = [n for n in names if n.split(".")[0] in ("aotc", "torch")]
            assert not bad, f"{path.relative_to(REPO)}:{node.lineno} imports {bad[0]}"


def _sources() -> list[Path]:
    out = []
    for root, patterns in ((REPO / "export", ("*.py",)), (REPO / "python_client", ("*.py",)),
                           (REPO / "runtime_cpp", ("*.cpp", "*.h"))):
        for pattern in patterns:
            out += [p for p in root.rglob(pattern) if "tests" not in p.relative_to(root).parts]
    return sorted(out)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_source_files_stay_short(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(REPO)} has {n} lines; split it along a seam (at most {MAX_LINES})"
