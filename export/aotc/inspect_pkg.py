"""`aotc inspect PKG.pt2`: a package's manifest and whether this machine can run it, and why not.

Reads the package with zipfile (aotc.manifest) and never loads its code. Stateless; safe from any thread.
"""

from __future__ import annotations

import json

from aotc import manifest as manifest_mod


def describe(path: str) -> str:
    """The manifest as JSON, then one line: "runs here: yes (...)" or "runs here: no: <reason>"."""
    m = manifest_mod.read(path)
    lines = [json.dumps(m.to_dict(), indent=2)]
    try:
        reason = manifest_mod.why_cannot_run(m)
    except Exception as e:  # a broken CUDA setup should not hide the manifest
        reason = f"could not check this machine: {type(e).__name__}: {e}"
    where = f", cpu_isa {m.cpu_isa or 'none'})" if m.device == "cpu" else f", {list(m.cuda_arch or [])})"
    lines.append(f"runs here: yes (torch {m.torch_version}, device {m.device}{where}" if reason is None
                 else f"runs here: no: {reason}")
    return "\n".join(lines)
