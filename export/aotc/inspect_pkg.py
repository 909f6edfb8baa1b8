"""`aotc inspect PKG.pt2`: a package's manifest for humans (or as JSON with --json), and whether this machine
can run it, and why not.

Reads the package with zipfile (aotc.manifest) and never loads its code. Stateless; safe from any thread.
"""

from __future__ import annotations

import json
import os

from aotc import manifest as manifest_mod


def describe(path: str, raw: bool = False) -> str:
    """A summary of the manifest (report.manifest_lines: model, inputs, outputs, dims, batch, graphs, samples,
    compile options, tolerance), or with `raw` the manifest as JSON; then one line: "runs here: yes (...)" or
    "runs here: no: <reason>"."""
    m = manifest_mod.read(path)
    if raw:
        lines = [json.dumps(m.to_dict(), indent=2)]
    else:
        from aotc import report

        lines = [f"package   {path}  ({os.path.getsize(path) / 1e6:.1f} MB, {len(m.files_sha256)} compiled "
                 f"file(s), aotc {m.aotc_version or '?'}, created {m.created or '?'})"]
        lines += report.manifest_lines(m)
        lines.append(report.samples_line(m))
        lines.append(f"compile   {m.compile}")
        lines.append(f"tolerance atol={m.tolerance.atol:g} rtol={m.tolerance.rtol:g}")
    try:
        reason = manifest_mod.why_cannot_run(m)
    except Exception as e:  # a broken CUDA setup should not hide the manifest
        reason = f"could not check this machine: {type(e).__name__}: {e}"
    where = f", cpu_isa {m.cpu_isa or 'none'})" if m.device == "cpu" else f", {list(m.cuda_arch or [])})"
    lines.append(f"runs here: yes (torch {m.torch_version}, device {m.device}{where}" if reason is None
                 else f"runs here: no: {reason}")
    return "\n".join(lines)
