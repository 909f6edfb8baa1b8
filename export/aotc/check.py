"""`aotc check PKG.pt2 --model MODEL.py[:NAME]`: three-way parity of a package against its model file.

For the samples stored in the package and for fresh inputs at the smallest, largest and an odd size of
every dynamic dim, it runs the eager model (rebuilt from MODEL.py), the C++ runtime (aotc.runtime, the
code aotc-run and aotc-server use) and PyTorch's Python loader (aotc.loader), prints one table row per
case and output, and raises ParityError when any backend leaves the manifest's tolerance, or when the
model file no longer produces the eager outputs stored in the package. Not a benchmark; single-threaded.
"""

from __future__ import annotations

import sys

from aotc.errors import InputError, ParityError
from aotc_client.specs import size_plan


def fresh_cases(mf, manifest, examples: tuple, cast) -> list[tuple[str, tuple]]:
    """[(label, inputs)] across the dynamic range (size_plan). Dims at the same position with the same range
    take the same size (the manifest does not name shared symbols; [B, L] inputs share B and L this way). A
    model file's make_inputs(batch) is used for batch-only models, whose inputs may depend on each other."""
    import torch

    from aotc.parity import random_like

    specs = manifest.inputs
    dynamic = sorted({(d, tuple(s.ranges[d])) for s in specs for d, n in enumerate(s.shape) if n == -1})
    if not dynamic:
        return []
    batch = manifest.batch
    only_batch = all(d == 0 for d, _ in dynamic)
    gen = torch.Generator().manual_seed(1234)
    cases = []
    for label in ("min", "max", "odd"):
        pick = {}
        for d, (lo, hi) in dynamic:
            plan = dict(size_plan(lo, hi))
            pick[(d, (lo, hi))] = plan.get(label)
        if any(v is None for v in pick.values()):
            continue
        if batch and only_batch and mf.make_inputs(pick[next(iter(pick))]) is not None:
            b = pick[next(iter(pick))]
            inputs = tuple(cast(x) for x in mf.make_inputs(b))
            cases.append((f"fresh {label} (batch={b})", inputs))
            continue
        inputs = []
        for s, ex in zip(specs, examples):
            shape = [pick[(d, tuple(s.ranges[d]))] if n == -1 else n for d, n in enumerate(s.shape)]
            inputs.append(random_like(ex, shape, gen).to(ex.device))
        sizes = ", ".join(f"{'batch' if batch and d == 0 else f'dim{d}'}={n}" for (d, _), n in pick.items())
        cases.append((f"fresh {label} ({sizes})", tuple(inputs)))
    return cases


def _row(case: str, output: str, errs: list[dict]) -> str:
    cells = [f"{e.max_abs:10.3g} {e.max_rel:10.3g} {'ok' if e.ok else 'FAIL':>4}" for e in errs]
    return f"{case[:34]:34} {output[:20]:20} " + "   ".join(cells)


def check_package(package: str, model_file: str) -> int:
    """`aotc check PKG.pt2 --model MODEL.py[:NAME]`: the table described in the module docstring; returns 0,
    raises ParityError."""
    import numpy as np
    import torch

    from aotc import export as exp
    from aotc.load_model import load_model_file
    from aotc.loader import load_package
    from aotc.parity import compare
    from aotc.runtime import Session

    session = Session(package)  # verifies the package before anything else loads its code
    manifest = session.manifest
    tol = manifest.tolerance
    device = manifest.device
    mf = load_model_file(model_file)
    model, examples = exp.prepare(mf, device, manifest.dtype)
    float_dtype = getattr(torch, exp.DTYPES[manifest.dtype])
    cast = lambda x: exp.cast_input(x, device, float_dtype)  # noqa: E731
    python_runner = load_package(package)

    def eager(inputs):
        with torch.no_grad():
            return exp.flatten_outputs(model(*inputs), mf.path)

    cases = []
    for i, (ins, stored) in enumerate(session.samples()):
        inputs = tuple(torch.from_numpy(np.ascontiguousarray(x)).to(device) for x in ins)
        ref = eager(inputs)
        for name, r, s in zip(session.output_names, ref, stored):
            if not compare(name, torch.from_numpy(s), r, tol).ok:
                raise ParityError(f"{model_file} no longer produces the eager output '{name}' stored in sample {i} "
                                  f"of {package}: was the package exported from another version of the file?")
        cases.append((f"sample {i}", inputs, ref))
    for label, inputs in fresh_cases(mf, manifest, examples, cast):
        cases.append((label, inputs, eager(inputs)))

    print(f"{package}: {manifest.name} vs {model_file}  (atol {tol.atol:g}, rtol {tol.rtol:g})")
    cols = f"{'max_abs':>10} {'max_rel':>10} {'ok':>4}"
    print(f"{'':34} {'':20} {'C++ runtime':^26}   {'Python loader':^26}")
    print(f"{'case':34} {'output':20} {cols}   {cols}")
    failed = []
    for label, inputs, ref in cases:
        try:
            cpp = session.run([x.detach().cpu().numpy() for x in inputs])
        except InputError as e:
            raise InputError(f"case '{label}': {e}") from None
        py = python_runner(*inputs)
        for name, c, p, r in zip(session.output_names, cpp, py, ref):
            errs = [compare(name, torch.from_numpy(c), r, tol), compare(name, p, r, tol)]
            print(_row(label, name, errs))
            if not all(e.ok for e in errs):
                failed.append(f"{label} / {name}")
    sys.stdout.flush()
    if failed:
        raise ParityError(f"{len(failed)} of the checks above are outside tolerance: {', '.join(failed[:5])}")
    print(f"parity ok: {len(cases)} cases, eager == C++ runtime == Python loader within tolerance")
    return 0
