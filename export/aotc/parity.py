"""Parity of an exported package against eager PyTorch, on the example inputs and across the dynamic range.

`make_cases` builds the inputs to check and their eager outputs before compiling (so they can also be
stored as samples): the example inputs, then fresh inputs from aotc.fresh (every dynamic dim at its min,
max and an odd size, together and apart; the file's `make_inputs` where it has one). `trivial_outputs`
names the outputs whose reference tests nothing at the tolerance (near zero or constant in every case), which
makes the verdict INCONCLUSIVE. With sequence buckets, `seq_bucket_cases` adds a case at a padded length in
every bucket and `padding_changes_answer` refuses a model whose answer depends on the padding. `shrink_sample` makes the example smaller when it does not fit the sample
cap. `check` loads the package through aotc.loader and compares by aotc's one parity rule
(aotc_client.compare). Not a benchmark. Uses a private RNG; safe to call from one thread at a time (eager
models may not be).
"""

from __future__ import annotations

import math

from aotc import export as exp
from aotc import fresh
from aotc.fresh import random_like  # noqa: F401  (re-exported: check.py and tests draw like the examples)
from aotc_client.compare import Comparison, compare_array, trivial
from aotc_client.specs import specs_from_manifest


def make_cases(mf, model, inputs, ref, specs_in, dims: dict, device: str, dtype: str,
               quick: bool = False) -> tuple[list[dict], list[str]]:
    """([{"label", "inputs", "ref", "inputs_outputs", "sample"}], the dims not varied): the example first, then
    the fresh cases (none with `quick`). `specs_in`: the manifest's inputs (with symbols); `dims`: its dims.
    The fresh case with every dim at an odd size is also a stored sample."""
    cases = [_case("example inputs", inputs, ref, sample=True)]
    if quick:
        return cases, []
    fresh_inputs, unvaried = fresh.fresh_cases(mf, specs_from_manifest(specs_in), dims, inputs,
                                               cast=_caster(device, dtype))
    for label, ins in fresh_inputs:
        cases.append(_case(label, ins, _eager(model, ins, mf), sample=label.startswith("fresh odd (")))
    return cases, unvaried


def shrink_sample(mf, model, example: dict, specs_in, dims: dict, device: str, dtype: str,
                  max_bytes: int) -> dict | None:
    """A case like the example with its dynamic dims made smaller (each halved in turn, the relatively largest
    first, never below its min) until its inputs and outputs fit `max_bytes`, as a sample; None when the model
    has no dim to shrink. Outputs are assumed to grow with the product of the dims (an estimate; the case is
    then made and run for real)."""
    from aotc.package import case_bytes

    specs = specs_from_manifest(specs_in)
    cases, _ = fresh.plan(mf, specs, dims)
    choosable = {k for _, sizes in cases for k in sizes}
    start = {k: v for k, v in fresh.example_sizes(specs, example["inputs"]).items() if k in choosable}
    if "batch" in choosable and "batch" not in start and example["inputs"] and example["inputs"][0].dim():
        start["batch"] = int(example["inputs"][0].shape[0])
    ranges = dims or {}
    sizes = dict(start)
    estimate = lambda: case_bytes(example) * math.prod(sizes[k] / start[k] for k in sizes)  # noqa: E731
    while estimate() > max_bytes:
        shrinkable = [k for k in sizes if sizes[k] > ranges.get(k, (1, 0))[0] and sizes[k] > 1]
        if not shrinkable:
            break
        k = max(shrinkable, key=lambda k: sizes[k] / max(ranges.get(k, (1, 0))[0], 1))
        sizes[k] = max(sizes[k] // 2, ranges.get(k, (1, 0))[0], 1)
    if sizes == start:
        return None
    cast = _caster(device, dtype)
    if mf.size_params is not None:
        ins = tuple(cast(x) for x in mf.make_inputs(**sizes))
    else:
        import torch

        from aotc_client.specs import shape_for

        gen = torch.Generator().manual_seed(4321)
        full = {**fresh.example_sizes(specs, example["inputs"]), **sizes}
        ins = tuple(fresh.random_like(x, shape_for(s, full), gen).to(x.device) for s, x in zip(specs,
                                                                                             example["inputs"]))
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
    return _case(f"sample ({shown})", ins, _eager(model, ins, mf), sample=True)


def trivial_outputs(cases: list[dict], output_names: list[str], tol) -> dict[str, str]:
    """{output name: why} for every float output whose reference is trivial (aotc_client.compare.trivial: within
    atol of zero, or constant) in every case where it has values: parity on it would pass a package of zeros."""
    out = {}
    for i, name in enumerate(output_names):
        whys = [trivial(to_numpy(c["ref"][i]), tol.atol, tol.rtol) for c in cases if c["ref"][i].numel()]
        if whys and all(whys):
            out[name] = whys[0]
    return out


def samples_within(mf, model, cases: list[dict], specs_in, dims: dict, max_mb: float | None, device: str,
                   dtype: str):
    """(manifest samples, their files, the manifest's samples_cap) within `max_mb` (aotc export --samples; None:
    no cap): the example (made smaller when it alone exceeds the cap, shrink_sample), the static graphs' cases,
    then the fresh odd case, each while the total fits."""
    from aotc import package

    cap = None if max_mb is None else int(max_mb * 1e6)
    replaced = []
    if cap is not None and package.case_bytes(cases[0]) > cap:
        smaller = shrink_sample(mf, model, cases[0], specs_in, dims, device, dtype, cap)
        if smaller is not None:
            cases[0]["sample"] = False
            replaced.append(cases[0])
            cases.insert(1, smaller)
    kept, left = package.pick_samples(cases, cap)
    left = replaced + left
    entries, files = package.sample_files([c["inputs_outputs"] for c in kept], [c["label"] for c in kept])
    return entries, files, {"max_bytes": cap, "bytes": sum(e.bytes for e in entries),
                            "left_out": [{"case": c["label"], "bytes": package.case_bytes(c)} for c in left]}


def inconclusive_message(trivial: dict, n_cases: int, tol) -> str:
    """The one line an export stops with when trivial_outputs found outputs that test nothing."""
    name, why = next(iter(trivial.items()))
    more = f" (and {', '.join(repr(n) for n in list(trivial)[1:])})" if len(trivial) > 1 else ""
    return (f"parity is INCONCLUSIVE: output '{name}'{more} {why} in all {n_cases} cases, so a package answering "
            f"zeros (or that constant) would pass at atol={tol.atol:g} rtol={tol.rtol:g}; give the model weights "
            f"or inputs whose outputs are not trivial (calibrate it), or pass --allow-trivial-outputs")


def _caster(device: str, dtype: str):
    import torch

    float_dtype = getattr(torch, exp.DTYPES[dtype])
    return lambda x: exp.cast_input(x, device, float_dtype)


def _eager(model, inputs, mf):
    return exp.eager_outputs(model, inputs, mf)


def _case(label, inputs, ref, sample: bool) -> dict:
    cpu = lambda ts: tuple(t.detach().cpu() for t in ts)  # noqa: E731
    return {"label": label, "inputs": inputs, "ref": ref, "inputs_outputs": (cpu(inputs), cpu(ref)),
            "sample": sample}


def to_numpy(t):
    """A tensor as numpy for compare_array: on the host; bfloat16 (which numpy lacks) widened to float32."""
    import torch

    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def compare(name: str, got, want, tol) -> Comparison:
    """One output (a torch tensor) against eager's, by aotc's one parity rule (aotc_client.compare)."""
    return compare_array(name, to_numpy(got), to_numpy(want), tol.atol, tol.rtol)


def static_case(graph, inputs, ref) -> dict:
    """The parity case of a static graph (a manifest.StaticGraph): run through that graph, and kept as a
    sample for the runtime's self-check."""
    return dict(_case(f"static graph {graph.graph}", inputs, ref, sample=True), graph=graph.graph)


def check(path: str, cases: list[dict], tol, device: str, weights: dict | None = None) -> list[dict]:
    """Loads the package and compares it with eager on every case, each through its graph ("model" unless
    the case names a static graph). `weights` (by FQN, pipeline.weights_by_fqn of the main graph's program)
    are lent to the static graphs compiled without their own, as the runtime lends the main graph's."""
    from aotc.loader import load_package

    runners = {}
    results = []
    for case in cases:
        graph = case.get("graph", "model")
        if graph not in runners:
            runners[graph] = load_package(path, graph=graph, weights=weights)
        runner = runners[graph]
        outs = runner(*case["inputs"])
        errors = {name: compare(name, o, r, tol) for name, o, r in zip(runner.output_names, outs, case["ref"])}
        ok = len(outs) == len(case["ref"]) and all(e.ok for e in errors.values())
        results.append({"label": case["label"], "ok": ok, "errors": errors})
    return results


def seq_bucket_cases(mf, model, examples, specs_in, dims: dict, seq, device: str,
                     dtype: str) -> list[dict]:
    """Parity cases at a padded length in every bucket (seq_buckets.bucket_lengths; `seq` a manifest.SeqBuckets,
    `specs_in` the manifest's inputs), the other dims at the example's sizes, each with eager's answer on the
    unpadded inputs."""
    import torch

    from aotc.seq_buckets import bucket_lengths

    specs, cast = specs_from_manifest(specs_in), _caster(device, dtype)
    gen = torch.Generator().manual_seed(4242)
    base = fresh.example_sizes(specs, examples)
    if mf.size_params is not None and "batch" in mf.size_params.values() and examples and examples[0].dim():
        base.setdefault("batch", int(examples[0].shape[0]))
    cases = []
    for size, length in bucket_lengths(seq, dims[seq.dim][0]):
        sizes = {**base, seq.dim: length}
        ins = fresh.inputs_at(mf, specs, examples, base, sizes, cast, gen)
        cases.append(_case(f"seq bucket {size} ({seq.dim}={length})", ins, exp.eager_outputs(model, ins, mf),
                           sample=False))
    return cases


def padding_changes_answer(model, mf, cases: list[dict], seq, output_names: list[str], tol):
    """None when eager gives the same answer on every case padded to its bucket as unpadded (its reference),
    else the one line saying where it does not: a model whose answer depends on the padding cannot be
    bucketed."""
    from aotc import seq_buckets

    for case in cases:
        length = seq_buckets.length_of(case["inputs"], mf.input_names, seq)
        size = seq.bucket(length)
        if size is None or size == length:
            continue
        padded = exp.eager_outputs(model, seq_buckets.pad(case["inputs"], mf.input_names, seq, size), mf)
        for name, got, want in zip(output_names, seq_buckets.cut(padded, output_names, seq, length), case["ref"]):
            c = compare(name, got, want, tol)
            if not c.ok:
                return (f"--seq-buckets: the model's answer changes with padding: output '{name}' of case "
                        f"'{case['label']}' (length {length}) padded to {size} differs from the unpadded answer "
                        f"by max abs {c.max_abs:.3g} ({c.mismatched} elements beyond atol={tol.atol:g} "
                        f"rtol={tol.rtol:g}); bucketing needs a model that ignores its padding, e.g. through an "
                        f"attention mask padded with 0 (pad_values() sets the values)")
    return None
