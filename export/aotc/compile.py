"""Stage 4: compile an ExportedProgram with AOTInductor into a .pt2 package, with aotc's defaults.

Defaults per device were measured on the development machine (2-core x86 CPU, torch 2.13) for the seed
MLP; see docs/performance.md and `bench/compile_options.py`. Freezing (constant-folding the weights into
the graph and letting Inductor pre-pack them for its GEMMs) is what made AOTI beat eager on CPU.
This module only compiles; the manifest is handed in as a string and embedded as package metadata.
AOTInductor compiles in this process and uses the global Inductor config: one compile at a time.
"""

from __future__ import annotations

import os
import time

from aotc.errors import CompileError
from aotc.manifest import METADATA_KEY

# Inductor options that are not per-call choices of the user. Freezing is on for CPU (it is what made AOTI beat
# eager there) and off for CUDA, where it measured neutral on the H200 (BERT-base and the recommendation
# model, docs/performance.md) and the CUDA numbers there are without it; `aotc export --freezing on|off`
# overrides either.
DEVICE_DEFAULTS: dict[str, dict] = {
    "cpu": {"freezing": True},
    "cuda": {"freezing": False},
}


def inductor_configs(device: str, max_autotune: bool, manifest_json: str, freezing: bool | None = None,
                     extra: dict | None = None) -> dict:
    """The inductor_configs passed to aoti_compile_and_package (freezing None: the device's default; `extra`,
    the user's --inductor-config items, applied last)."""
    configs = dict(DEVICE_DEFAULTS[device])
    if freezing is not None:
        configs["freezing"] = freezing
    if max_autotune:
        configs["max_autotune"] = True
        if device == "cpu":
            configs["max_autotune_gemm_backends"] = "CPP,ATEN"
    configs.update(extra or {})
    configs["aot_inductor.metadata"] = {METADATA_KEY: manifest_json}
    return configs


def compile_package(ep, package_path: str, configs: dict) -> float:
    """Compiles `ep` into `package_path`; returns the seconds it took. Raises CompileError."""
    import torch

    os.makedirs(os.path.dirname(os.path.abspath(package_path)), exist_ok=True)
    t0 = time.perf_counter()
    try:
        torch._inductor.aoti_compile_and_package(ep, package_path=package_path, inductor_configs=configs)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CompileError(f"AOTInductor compile failed: {type(e).__name__}: {first[:300]}; rerun with "
                           f"--verbose for the full trace") from e
    return time.perf_counter() - t0


def cpu_isa() -> str:
    """The vector ISA Inductor compiles CPU kernels for, lower case ('avx512', 'avx2', ...), '' for none."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    isa = pick_vec_isa()
    return str(isa).lower() if isa else ""


def cuda_arch(device_index: int | None = None) -> list[str]:
    import torch

    major, minor = torch.cuda.get_device_capability(device_index)
    return [f"sm_{major}{minor}"]
