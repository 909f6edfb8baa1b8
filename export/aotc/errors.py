"""aotc's error types. All derive from aotc_client.errors.AotcError (the single base).

Each message carries the numbers and the remedy, e.g.
"input 'x' has dtype int32, the package expects float32; cast with x.astype(np.float32)".
"""

from aotc_client.errors import AotcError, ParityError, ServerError  # noqa: F401  (re-exported)


class ModelFileError(AotcError):
    """The model file does not follow the convention (model(), example_inputs(), ...)."""


class ExportError(AotcError):
    """torch.export could not capture the model; the message names the cause and the fix."""


class NoAttentionKernel(ExportError):
    """--sdpa-backend names an attention kernel PyTorch has none of for the model's attention inputs."""


class CompileError(AotcError):
    """AOTInductor failed to compile the exported program."""


class PackageError(AotcError):
    """A package is corrupt, tampered with, or cannot run on this machine."""


class InputError(AotcError):
    """Inputs disagree with the package's manifest (count, name, dtype, rank, dim range)."""


class InconclusiveError(AotcError):
    """Parity could not tell: a reference output is near zero or constant in every case, so a package of
    zeros would pass (aotc export --allow-trivial-outputs accepts it)."""

    exit_code = 1
