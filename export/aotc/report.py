"""The graph report and the export summary: what Inductor will see, and what the pipeline measured.

`graph_report(ep, example)` decomposes the ExportedProgram with Inductor's own decomposition table (the graph
AOTInductor lowers) and classifies each operator: lowered by Inductor, run as an opaque fallback kernel
(an ATen kernel called through a C shim, e.g. aten._embedding_bag), or needing the proxy executor (an op
with no C shim: the .so would call back into Python's dispatcher at run time). Which ops a graph decomposes
to does not depend on whether its sizes are symbolic, but retracing with symbolic sizes is what made the
report slow (sympy reasoning over every node: 6.1 s of HF BERT-base's, docs/export.md), so the graph is first
exported again with its sizes fixed at the example's, then decomposed. `decompose=False` (aotc export
--quick) classifies the exported graph's own ops without decomposing. `Progress` prints one line per
pipeline stage; `format_summary` and `manifest_lines` the export summary and `aotc inspect`'s. Printing goes
to one stream; not meant to be shared between threads.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import Counter

_BUILTIN_NAMESPACES = {"aten", "prims", "_quantized", "quantized", "mkldnn", "onednn", "_inductor_test"}


def graph_report(ep, example: tuple[tuple, dict] | None = None, decompose: bool = True) -> dict:
    """{'ops': {op: count}, 'fallback_ops', 'python_ops' (custom ops with no lowering: need the proxy
    executor), 'aten_without_c_shim' (fallbacks that would need it too), 'nodes': n, 'decomposed': bool} of
    Inductor's graph. `example`: (args, kwargs) the program was exported with; the graph is exported again at
    their sizes (static) before it is decomposed, the dynamic program itself where that fails or none is
    given. decompose=False: the exported graph's ops as they are (a decomposable op counts as lowered)."""
    import torch
    from torch._inductor.decomposition import select_decomp_table

    if decompose:
        table = select_decomp_table()
        graph = None
        if example is not None:
            try:
                static = torch.export.export(ep.module(), example[0], example[1] or None, strict=False)
                graph = static.run_decompositions(table).graph
            except Exception:  # a graph that will not re-export static: decompose the dynamic one
                graph = None
        if graph is None:
            graph = ep.run_decompositions(table).graph
    else:
        graph = ep.graph
    return {**classify(graph, decomposed=decompose), "decomposed": decompose}


def classify(graph, decomposed: bool = True) -> dict:
    """The ops of an FX graph counted and classified (graph_report's keys but 'decomposed'). Not decomposed:
    an op Inductor would decompose counts as lowered."""
    import torch
    from torch._inductor import lowering
    from torch._inductor.decomposition import select_decomp_table

    try:
        from torchgen.aoti.fallback_ops import inductor_fallback_ops
    except ImportError:  # torchgen ships with torch; be safe on stripped installs
        inductor_fallback_ops = {}
    table = {} if decomposed else select_decomp_table()
    counts: Counter[str] = Counter()
    fallback: set[str] = set()
    python_ops: set[str] = set()
    no_shim: set[str] = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if not isinstance(target, torch._ops.OpOverload):
            if isinstance(target, torch._ops.HigherOrderOperator):
                counts[f"hop.{target.name()}"] += 1
            continue  # operator.getitem and friends
        name = str(target)
        counts[name] += 1
        lowered = target in lowering.lowerings and target not in lowering.fallbacks
        if lowered or target in table or (not decomposed and _decomposes_itself(target)):
            continue
        if target.namespace in _BUILTIN_NAMESPACES:
            fallback.add(name)
            if target.namespace == "aten" and inductor_fallback_ops and name not in inductor_fallback_ops:
                no_shim.add(name)  # Inductor may still lower it; the compiled wrapper tells for sure
        elif target.namespace not in _c_shim_namespaces() and not _is_triton_op(target):
            python_ops.add(name)
    return {
        "nodes": sum(counts.values()),
        "ops": dict(counts.most_common()),
        "fallback_ops": sorted(fallback),
        "python_ops": sorted(python_ops),
        "aten_without_c_shim": sorted(no_shim),
    }


def _decomposes_itself(target) -> bool:
    """An op with a CompositeImplicitAutograd kernel: decomposed into others before Inductor sees it."""
    import torch

    return torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd")


def _is_triton_op(target) -> bool:
    """A torch.library.triton_op (e.g. aotc::embedding_bag): AOTInductor compiles its kernels into the .so.
    Every op in the `aotc` namespace is one (export/aotc/kernels/)."""
    from torch._library import triton as lib_triton

    return target.namespace == "aotc" or target._schema.name in getattr(lib_triton, "triton_ops_to_kernels", {})


def _c_shim_namespaces() -> set[str]:
    """Namespaces whose custom ops Inductor calls through user-registered C shims (none by default)."""
    from torch._inductor import config

    shims = getattr(getattr(config, "aot_inductor", None), "custom_ops_to_c_shims", {}) or {}
    return {str(op).split(".")[0] for op in shims}


def python_ops_in_wrapper(wrapper_sources: list[str]) -> bool:
    """True when generated wrapper code calls back through the proxy executor (Python at run time)."""
    return any("aoti_torch_proxy_executor_call_function(" in src for src in wrapper_sources)


def wrapper_sources(path: str) -> list[str]:
    """The generated wrapper code (*.wrapper.cpp) of a compiled package."""
    import zipfile

    with zipfile.ZipFile(path) as zf:
        return [zf.read(n).decode(errors="replace") for n in zf.namelist() if n.endswith(".wrapper.cpp")]


def python_ops_message(ops: list[str]) -> str:
    return (f"the graph has ops with no C shim that would call back into Python at run time "
            f"({', '.join(ops)}); replace them, or pass --allow-python-ops (the package then cannot run "
            f"in aotc-server)")


class Progress:
    """Prints `[i/n] stage ... done (1.2 s)` lines (`[i]` while the total is None: not known yet); quiet=True
    prints nothing."""

    def __init__(self, total: int | None, stream=None, quiet: bool = False):
        self.total, self.i, self.stream, self.quiet = total, 0, stream or sys.stderr, quiet
        self._t0 = 0.0

    def start(self, what: str) -> None:
        self.i += 1
        self._t0 = time.perf_counter()
        if not self.quiet:
            count = f"{self.i}/{self.total}" if self.total is not None else f"{self.i}"
            print(f"[{count}] {what} ...", end="", file=self.stream, flush=True)

    def done(self, note: str = "") -> float:
        dt = time.perf_counter() - self._t0
        if not self.quiet:
            extra = f", {note}" if note else ""
            print(f" done ({dt:.1f} s{extra})", file=self.stream, flush=True)
        return dt

    def fail(self) -> None:
        if not self.quiet:
            print(" failed", file=self.stream, flush=True)

    @contextlib.contextmanager
    def stage(self, what: str):
        """`with progress.stage("x") as note:` prints the stage, then done/failed; set note["text"]."""
        note = {"text": ""}
        self.start(what)
        try:
            yield note
        except BaseException:
            self.fail()
            raise
        note["seconds"] = self.done(note["text"])


def _tensor_lines(groups) -> list[str]:
    """`kind name: dtype[ranges]` per tensor of each (kind, tensors) group."""
    return [f"{kind:<9} {t.name}: {t.dtype}[" + ",".join(f"{lo}..{hi}" if lo != hi else str(lo) for lo, hi in t.ranges)
            + "]" for kind, tensors in groups for t in tensors]


def manifest_lines(m) -> list[str]:
    """A manifest (aotc.manifest.Manifest) for humans: model, inputs and outputs with their ranges, dims, batch,
    static graphs, fallback ops and rewrites; the lines the export summary and `aotc inspect` share."""
    lines = [f"model     {m.name}  device={m.device}"
             + (f" isa={m.cpu_isa or 'none'}" if m.device == "cpu" else f" arch={list(m.cuda_arch or [])}")
             + f"  dtype={m.dtype}  torch={m.torch_version}"]
    lines += _tensor_lines((("input", m.inputs), ("output", m.outputs)))
    if m.dims:
        lines.append("dims      " + ", ".join(f"{k} {lo}..{hi}" for k, (lo, hi) in m.dims.items()))
    if m.batch:
        lines.append(f"batch     {m.batch.min}..{m.batch.max}")
    if m.seq_buckets:
        seq = m.seq_buckets
        lines.append(f"seq       {seq.dim} buckets {','.join(map(str, seq.sizes))} (padded: "
                     + ", ".join(f"{n}:{a} with {seq.pad_values.get(n, 0):g}" for n, a in seq.inputs.items())
                     + f"; cut back: {', '.join(f'{n}:{a}' for n, a in seq.outputs.items()) or 'none'})")
    if m.seq_pack:
        pk = m.seq_pack
        lines.append(f"packed    rows of {pk.size} tokens of {', '.join(pk.inputs)} (filler "
                     + ", ".join(f"{pk.pad_values.get(n, 0):g}" for n in pk.inputs)
                     + f"); answers: " + ", ".join(f"{n} {'per token' if k == 'tokens' else 'at the first token'}"
                                                   for n, k in pk.outputs.items()))
        lines += _tensor_lines((("request", pk.request_inputs), ("answer", pk.request_outputs)))
    if m.static_graphs:
        lines.append("static    " + ", ".join(f"{f'seq {g.seq} ' if g.seq else ''}batch {g.batch} "
                                            f"({g.graph}{', weights of model' if g.weights else ''})"
                                            for g in m.static_graphs))
    lines.append(f"fallback  {', '.join(m.fallback_ops) or 'none'}")
    for key, rw in m.rewrites.items():
        cands = ", ".join(f"{k} {v:.3g} ms" for k, v in (rw.get("candidates_ms") or {}).items())
        lines.append(f"rewrite   {key}: lowering {rw.get('lowering')}" + (f" (measured: {cands})" if cands else "")
                     + (f" ({rw['note']})" if rw.get("note") else ""))
        if rw.get("candidates_ms_scaled"):
            scaled = ", ".join(f"{k} {v:.3g} ms" for k, v in rw["candidates_ms_scaled"].items())
            lines.append(f"          at {rw['scaled_bags']} bags (example bags {rw.get('scaled_longer', 1)}x as long, "
                         f"repeated): {scaled}")
        for d in rw.get("details") or []:
            if d.get("tiles"):
                t = d["tiles"]
                lines.append(f"          {d['node']}: tile BLOCK_L={t['block_l']} BLOCK_D={t['block_d']} "
                             f"warps={t['num_warps']} ({t['tuning']})")
    return lines


def samples_line(m) -> str:
    """What the manifest's samples hold and what the cap left out."""
    cap = m.samples_cap or {}
    total = cap.get("bytes", sum(s.bytes for s in m.samples))
    limit = cap.get("max_bytes")
    text = f"samples   {len(m.samples)}"
    if cap or total:  # a package of an older aotc records neither
        text += (f" ({total / 1e6:.2f} MB" + (f" of a {limit / 1e6:g} MB cap" if limit is not None and cap
                                              else (", no cap" if cap else "")) + ")")
    if any(s.case for s in m.samples):
        text += ": " + ", ".join(s.case for s in m.samples)
    if cap.get("left_out"):
        text += "; left out: " + ", ".join(f"{c['case']} ({c['bytes'] / 1e6:.2f} MB)" for c in cap["left_out"])
    return text


def format_summary(result: dict, allow_trivial: bool = False) -> str:
    """The human summary printed at the end of `aotc export` (result: pipeline.export_model_file's)."""
    m = result["manifest"]
    lines = [f"package   {result['path']}  ({result['size_bytes'] / 1e6:.1f} MB)"]
    lines += manifest_lines(m)
    g = result["graph"]
    top = ", ".join(f"{k} x{v}" for k, v in list(g["ops"].items())[:6])
    at = next(i for i, line in enumerate(lines) if line.startswith("fallback  "))
    lines.insert(at, f"graph     {g['nodes']} ops ({top})"
                 + ("" if g.get("decomposed", True) else " (not decomposed: --quick)"))
    lines.append(samples_line(m))
    lines.append(f"compile   {result['compile_s']:.1f} s  options {m.compile}")
    lines.append(f"parity    atol={m.tolerance.atol:g} rtol={m.tolerance.rtol:g}; per output: max abs, max rel, "
                 f"elements outside tolerance")
    for case in result["parity"]:
        errs = "  ".join(f"{name}: abs {e.max_abs:.2e} rel {e.max_rel:.2e} out {e.mismatched}/{e.total}"
                         for name, e in case["errors"].items())
        status = "FAIL" if not case["ok"] else ("trivial" if any(e.trivial for e in case["errors"].values())
                                                else "ok")
        lines.append(f"  {status:<7} {case['label']:<36} {errs}")
    if result.get("unvaried"):
        lines.append(f"          not varied: {', '.join(result['unvaried'])} (make_inputs() has no parameter for "
                     f"them; they follow from what it makes)")
    ok = all(c["ok"] for c in result["parity"])
    trivial = result.get("trivial") or {}
    if not ok:
        verdict = "FAIL: parity check failed"
    elif trivial:
        verdict = ("INCONCLUSIVE: " + "; ".join(f"output '{n}' {why}" for n, why in trivial.items())
                   + (" (allowed by --allow-trivial-outputs)" if allow_trivial else ""))
    else:
        verdict = "PASS: the package matches eager PyTorch" + (" (--quick: on the example inputs only)"
                                                              if result.get("quick") else "")
    lines.append("result    " + verdict)
    return "\n".join(lines)
