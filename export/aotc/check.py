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

_ODD_OFFSET = 37  # (lo + 37) | 1: odd, neither a power of two nor a bound for the usual ranges


def _sizes(lo: int, hi: int) -> list[tuple[str, int]]:
    """min, max and an odd size strictly inside the range (when one fits)."""
    plan = [("min", lo), ("max", hi)]
    odd = (lo + _ODD_OFFSET) | 1 if (lo + _ODD_OFFSET) | 1 < hi else (lo + hi) // 2 | 1
    if lo < odd < hi:
        plan.append(("odd", odd))
    return plan


def _random_like(example, shape, gen):
    """Random values shaped `shape`, drawn like the example input (its integer range, its float scale)."""
    import torch

    if example.dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if example.is_floating_point():
        ref = example.detach().float()
        std = ref.std().item() if ref.numel() > 1 else 1.0
        mean = ref.mean().item() if ref.numel() else 0.0
        return (torch.randn(shape, generator=gen) * (std or 1.0) + mean).to(example.dtype)
    lo, hi = (int(example.min()), int(example.max())) if example.numel() else (0, 1)
    return torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int64).to(example.dtype)


def fresh_cases(mf, manifest: dict, examples: tuple, cast) -> list[tuple[str, tuple]]:
    """[(label, inputs)] across the dynamic range. Dims at the same position with the same range take the
    same size (the manifest does not name shared symbols; [B, L] inputs share B and L this way). A model
    file's make_inputs(batch) is used for batch-only models, whose inputs may depend on each other."""
    import torch

    specs = manifest["inputs"]
    dynamic = sorted({(d, tuple(s["ranges"][d])) for s in specs for d, n in enumerate(s["shape"]) if n == -1})
    if not dynamic:
        return []
    batch = manifest.get("batch")
    only_batch = all(d == 0 for d, _ in dynamic)
    gen = torch.Generator().manual_seed(1234)
    cases = []
    for label in ("min", "max", "odd"):
        pick = {}
        for d, (lo, hi) in dynamic:
            plan = dict(_sizes(lo, hi))
            pick[(d, (lo, hi))] = plan.get(label)
        if any(v is None for v in pick.values()):
            continue
        if batch and only_batch and mf.make_inputs(pick[next(iter(pick))]) is not None:
            b = pick[next(iter(pick))]
            inputs = tuple(cast(x) for x in mf.make_inputs(b))
            cases.append((f"fresh batch {b} ({label})", inputs))
            continue
        inputs = []
        for s, ex in zip(specs, examples):
            shape = [pick[(d, tuple(s["ranges"][d]))] if n == -1 else n for d, n in enumerate(s["shape"])]
            inputs.append(_random_like(ex, shape, gen))
        sizes = ", ".join(f"dim{d}={n}" for (d, _), n in pick.items())
        cases.append((f"fresh {label} ({sizes})", tuple(inputs)))
    return cases


def _row(case: str, output: str, errs: list[dict]) -> str:
    cells = [f"{e['max_abs']:10.3g} {e['max_rel']:10.3g} {'ok' if e['ok'] else 'FAIL':>4}" for e in errs]
    return f"{case[:34]:34} {output[:20]:20} " + "   ".join(cells)


def check_package(args) -> int:
    """Entry point of `aotc check PKG.pt2 --model MODEL.py[:NAME]` (args.package, args.model)."""
    import numpy as np
    import torch

    from aotc import export as exp
    from aotc.load_model import load_model_file
    from aotc.loader import load_package
    from aotc.parity import compare
    from aotc.runtime import Session

    session = Session(args.package)  # verifies the package before anything else loads its code
    manifest = session.manifest
    tol = manifest["tolerance"]
    device = manifest["device"]
    dtype = (manifest.get("compile") or {}).get("dtype", "fp32")
    mf = load_model_file(args.model)
    model, examples = exp.prepare(mf, device, dtype)
    float_dtype = getattr(torch, exp.DTYPES[dtype])
    cast = lambda x: exp.cast_input(x, device, float_dtype)  # noqa: E731
    python_runner = load_package(args.package)

    def eager(inputs):
        with torch.no_grad():
            return exp.flatten_outputs(model(*inputs), mf.path)

    cases = []
    for i, (ins, stored) in enumerate(session.samples()):
        inputs = tuple(torch.from_numpy(np.ascontiguousarray(x)).to(device) for x in ins)
        ref = eager(inputs)
        for name, r, s in zip(session.output_names, ref, stored):
            if not compare(torch.from_numpy(s), r.cpu(), tol)["ok"]:
                raise ParityError(f"{args.model} no longer produces the eager output '{name}' stored in sample {i} "
                                  f"of {args.package}: was the package exported from another version of the file?")
        cases.append((f"sample {i}", inputs, ref))
    for label, inputs in fresh_cases(mf, manifest, examples, cast):
        cases.append((label, inputs, eager(inputs)))

    print(f"{args.package}: {manifest['name']} vs {args.model}  (atol {tol['atol']:g}, rtol {tol['rtol']:g})")
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
            errs = [compare(torch.from_numpy(c), r.cpu(), tol), compare(p.cpu(), r.cpu(), tol)]
            print(_row(label, name, errs))
            if not all(e["ok"] for e in errs):
                failed.append(f"{label} / {name}")
    sys.stdout.flush()
    if failed:
        raise ParityError(f"{len(failed)} of the checks above are outside tolerance: {', '.join(failed[:5])}")
    print(f"parity ok: {len(cases)} cases, eager == C++ runtime == Python loader within tolerance")
    return 0
