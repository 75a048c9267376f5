"""Typed errors of the lazykv client.

Every failed call raises a subclass of LazyKVError chosen from the gRPC status code, so a RAG
pipeline can write ``except lazykv.NotFound`` instead of inspecting status codes. The daemon's
message (what was expected, what was got) is kept in ``details``. Arguments that the client can
reject before sending (a key of the wrong length, neither key nor tokens, ...) raise
InvalidArgument too, with ``code`` set to ``grpc.StatusCode.INVALID_ARGUMENT``.
"""

import grpc

__all__ = [
    "LazyKVError",
    "NotFound",
    "InvalidArgument",
    "ResourceExhausted",
    "Unauthenticated",
    "PermissionDenied",
    "Unavailable",
    "DeadlineExceeded",
    "Cancelled",
    "from_rpc_error",
]


class LazyKVError(Exception):
    """Base of every lazykv client error.

    Attributes:
        code: the grpc.StatusCode of the failed call (or the one a local check stands for).
        details: the daemon's (or the local check's) message.
    """

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, details="", code=None):
        if code is not None:
            self.code = code
        self.details = details
        super().__init__(f"{self.code.name}: {details}" if details else self.code.name)


class NotFound(LazyKVError, LookupError):
    """The document is not cached (Get, Delete)."""

    code = grpc.StatusCode.NOT_FOUND


class InvalidArgument(LazyKVError, ValueError):
    """Malformed request: wrong block size or count, unknown profile, bad key, ..."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class ResourceExhausted(LazyKVError):
    """A message over the daemon's size limit, or the budgets cannot take the document."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unauthenticated(LazyKVError):
    """Missing, malformed or wrong bearer token."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(LazyKVError):
    """The token is valid but its tenant lacks the role the method needs."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unavailable(LazyKVError, ConnectionError):
    """The daemon cannot be reached, is shutting down, or reports NOT_SERVING."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(LazyKVError, TimeoutError):
    """The call's deadline passed before the work was done."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(LazyKVError):
    """The call was cancelled (by this process, or the daemon went away mid-call)."""

    code = grpc.StatusCode.CANCELLED


_BY_CODE = {
    cls.code: cls
    for cls in (
        NotFound,
        InvalidArgument,
        ResourceExhausted,
        Unauthenticated,
        PermissionDenied,
        Unavailable,
        DeadlineExceeded,
        Cancelled,
    )
}


def from_rpc_error(err):
    """Returns the typed LazyKVError for a grpc.RpcError (or anything with code()/details()).

    Codes without a dedicated class (INTERNAL, UNIMPLEMENTED, UNKNOWN, ...) give a plain
    LazyKVError whose ``code`` says which one it was.
    """
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    if code is None:
        code = grpc.StatusCode.UNKNOWN
    cls = _BY_CODE.get(code)
    if cls is None:
        return LazyKVError(details or "", code=code)
    return cls(details or "")
