"""aotc_client: a client for Open Inference Protocol servers. Needs numpy and tritonclient, never torch.

  client.py   Client / AsyncClient: infer with dicts of numpy arrays, specs from model metadata
  specs.py    TensorSpec, random valid inputs across a model's dynamic range
  compare.py  dtype-aware parity: abs(a-b) <= atol + rtol*abs(b)
  dtypes.py   manifest dtype names <-> protocol datatypes <-> numpy
  bench.py    `aotc bench`: closed-loop async load generator
  cli.py      the parser of `aotc bench` (also the `aotc-bench` command of the client alone)
"""

from .errors import AotcError, ParityError, ServerError  # noqa: F401

_LAZY = {
    "Client": "client", "AsyncClient": "client",
    "TensorSpec": "specs", "random_inputs": "specs", "specs_from_metadata": "specs", "range_sizes": "specs",
    "compare_outputs": "compare", "assert_close": "compare", "default_tolerance": "compare",
}


def __getattr__(name):  # tritonclient is imported only when a client is used
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'aotc_client' has no attribute {name!r}")
