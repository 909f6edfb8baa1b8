"""The one error base of aotc, and the client's own errors.

It lives on the client side, the lower layer, so that `aotc_client` needs nothing from `aotc` and `aotc`
(the exporter, the servers' Python side) can subclass it. The CLI catches AotcError once and prints its
message as one line; a message says what was wrong and what was expected.
"""


class AotcError(Exception):
    """Base of every error aotc reports to a user. `exit_code` is what the CLI exits with."""

    exit_code = 2


class ServerError(AotcError):
    """A server answered with an error status, or not at all."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class ParityError(AotcError):
    """Outputs differ from the reference beyond tolerance."""

    exit_code = 1


class RequestError(AotcError):
    """A request breaks the protocol or disagrees with the model's specs. `status` is the HTTP status a
    server answers it with (400 bad request, 404 unknown model, 413 too large, 501 unsupported encoding)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status
