"""`aotc check PKG.pt2 MODEL.py[:NAME]`: three-way parity of a package against its model file.

For the samples stored in the package and for fresh inputs across the dynamic range (aotc.fresh, the
generator the export's parity uses: every dim at its min, max and an odd size, together and apart, through
the file's make_inputs where it has one, sized by the dims the manifest names), it runs the eager model
(rebuilt from MODEL.py), the C++ runtime (aotc.runtime, the code aotc-run and aotc-server use) and PyTorch's
Python loader (aotc.loader), prints one table row per case and output (max abs, max rel, elements outside
tolerance, verdict), and raises ParityError when any backend leaves the manifest's tolerance or the model
file no longer produces the eager outputs stored in the package, InconclusiveError when an output's
reference is trivial (near zero or constant) in every case. Not a benchmark; single-threaded.
"""

from __future__ import annotations

import sys

from aotc.errors import InconclusiveError, InputError, ParityError


def _row(case: str, output: str, errs: list) -> str:
    cells = [f"{e.max_abs:10.3g} {e.max_rel:10.3g} {f'{e.mismatched}/{e.total}':>11} {e.verdict:>8}" for e in errs]
    return f"{case[:40]:40} {output[:24]:24} " + "   ".join(cells)


def check_package(package: str, model_file: str, allow_trivial: bool = False) -> int:
    """`aotc check PKG.pt2 MODEL.py[:NAME]`: the table described in the module docstring; returns 0, raises
    ParityError or (unless `allow_trivial`) InconclusiveError."""
    import numpy as np
    import torch

    from aotc import export as exp
    from aotc.fresh import fresh_cases
    from aotc.load_model import load_model_file
    from aotc.loader import load_package
    from aotc.parity import compare
    from aotc.runtime import Session
    from aotc_client.specs import specs_from_manifest

    session = Session(package)  # verifies the package before anything else loads its code
    manifest = session.manifest
    tol = manifest.tolerance
    device = manifest.device
    mf = load_model_file(model_file)
    if manifest.seq_pack:  # the packed graph against the file's pack_model, on inputs packed from its requests
        from aotc.seq_buckets import SeqRequest
        from aotc.seq_pack import packed_model_file

        mf = packed_model_file(mf, SeqRequest(dict(manifest.seq_pack.inputs), (manifest.seq_pack.size,))).mf
    model, examples = exp.prepare(mf, device, manifest.dtype)
    float_dtype = getattr(torch, exp.DTYPES[manifest.dtype])
    cast = lambda x: exp.cast_input(x, device, float_dtype)  # noqa: E731
    python_runner = load_package(package)

    if mf.input_names != manifest.input_names:
        raise InputError(f"{model_file} takes inputs {mf.input_names}, {package} has {manifest.input_names}; "
                         f"was the package exported from this file?")

    def eager(inputs):
        return exp.eager_outputs(model, inputs, mf)

    cases = []
    for i, (ins, stored) in enumerate(session.samples()):
        inputs = tuple(torch.from_numpy(np.ascontiguousarray(x)).to(device) for x in ins)
        ref = eager(inputs)
        for name, r, s in zip(session.output_names, ref, stored):
            if not compare(name, torch.from_numpy(s), r, tol).ok:
                raise ParityError(f"{model_file} no longer produces the eager output '{name}' stored in sample {i} "
                                  f"of {package}: was the package exported from another version of the file?")
        case = manifest.samples[i].case if i < len(manifest.samples) else ""
        cases.append((f"sample {i}" + (f" ({case})" if case else ""), inputs, ref))
    fresh, unvaried = fresh_cases(mf, specs_from_manifest(manifest.inputs), manifest.dims, examples, cast)
    for label, inputs in fresh:
        cases.append((label, inputs, eager(inputs)))

    print(f"{package}: {manifest.name} vs {model_file}  (atol {tol.atol:g}, rtol {tol.rtol:g})")
    cols = f"{'max_abs':>10} {'max_rel':>10} {'outside':>11} {'verdict':>8}"
    print(f"{'':40} {'':24} {'C++ runtime':^41}   {'Python loader':^41}")
    print(f"{'case':40} {'output':24} {cols}   {cols}")
    failed, trivial = [], {n: [] for n in session.output_names}
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
            if r.numel():
                trivial[name].append(errs[0].trivial)
    if unvaried:
        print(f"not varied: {', '.join(unvaried)} (make_inputs() has no parameter for them; they follow from what "
              f"it makes)")
    sys.stdout.flush()
    if failed:
        raise ParityError(f"{len(failed)} of the checks above are outside tolerance: {', '.join(failed[:5])}")
    vacuous = {n: whys[0] for n, whys in trivial.items() if whys and all(whys)}
    if vacuous:
        text = "; ".join(f"output '{n}' {why}" for n, why in vacuous.items())
        if not allow_trivial:
            raise InconclusiveError(f"parity is INCONCLUSIVE: {text} in every case, so any package answering "
                                    f"zeros would pass; pass --allow-trivial-outputs to accept it")
        print(f"parity INCONCLUSIVE (allowed): {text}")
        return 0
    print(f"parity ok: {len(cases)} cases, eager == C++ runtime == Python loader within tolerance")
    return 0
