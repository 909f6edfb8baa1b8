"""`aotc inspect PKG.pt2`: print a package's manifest and whether this machine can run it, and why not.

`why_cannot_run(manifest)` is the Python twin of the C++ runtime's check (torch major.minor, device, CUDA
arch, CPU ISA); the loader uses it too. Reads the package with zipfile and never loads its code.
Stateless; safe from any thread.
"""

from __future__ import annotations

import json

# Inductor's CPU ISAs, weakest first within a family; a CPU that supports one supports those before it.
_ISA_ORDER = {"avx2": 1, "avx512": 2, "amx": 3}


def _major_minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def why_cannot_run(manifest: dict) -> str | None:
    """None when the package can run on this machine, else the one-line reason."""
    import torch

    want, have = _major_minor(manifest.get("torch_version", "")), _major_minor(torch.__version__)
    if want != have:
        return f"compiled with torch {manifest.get('torch_version')}, this machine has torch {torch.__version__} " \
               f"(major.minor must match); re-export here"
    device = manifest.get("device")
    if device == "cuda":
        if not torch.cuda.is_available():
            return "it is a CUDA package and this machine has no usable CUDA device; export with --device cpu"
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
        if manifest.get("cuda_arch") and arch not in manifest["cuda_arch"]:
            return f"compiled for {manifest['cuda_arch']}, this GPU is {arch}; re-export on this GPU"
    elif device == "cpu":
        isa = manifest.get("cpu_isa") or ""
        if isa:
            from torch._inductor.cpu_vec_isa import valid_vec_isa_list

            supported = {str(v).lower() for v in valid_vec_isa_list()}
            if isa not in supported:
                return f"compiled for CPU ISA {isa}, this CPU supports {sorted(supported) or 'none'}; re-export here"
    else:
        return f"unknown device {device!r} in the manifest (expected 'cpu' or 'cuda')"
    return None


def describe(path: str) -> str:
    from aotc.loader import read_manifest

    m = read_manifest(path)
    lines = [json.dumps(m, indent=2)]
    try:
        reason = why_cannot_run(m)
    except Exception as e:  # a broken CUDA setup should not hide the manifest
        reason = f"could not check this machine: {type(e).__name__}: {e}"
    lines.append(f"runs here: yes (torch {m['torch_version']}, device {m['device']}"
                 + (f", cpu_isa {m['cpu_isa'] or 'none'})" if m["device"] == "cpu" else f", {m['cuda_arch']})")
                 if reason is None else f"runs here: no: {reason}")
    return "\n".join(lines)


def main(args) -> int:
    print(describe(args.package))
    return 0
