"""Typed errors of the lazykv client.

Every failed call raises a subclass of LazyKVError chosen from the gRPC status code, so a RAG
pipeline can write ``except lazykv.NotFound`` instead of inspecting status codes. The daemon's
exact lazykv code travels in the call's trailing metadata under ``lkv-code`` (its name from
common/lkv_err.h, e.g. "LKV_ENOSPC"; see proto/lazykv/v1/cache.proto) and is kept in
``lkv_code``, so a caller tells "budget exhausted" (LKV_ENOSPC) from "message too large"
(LKV_ETOOBIG) under the same RESOURCE_EXHAUSTED without reading the message. ``lkv_code`` is None
when the status came without it (gRPC itself, a proxy, an old daemon, a local check). The
daemon's message (what was expected, what was got) is kept in ``details`` for people: this
package never parses it. Arguments that the client can reject before sending (a key of the wrong
length, neither key nor tokens, ...) raise InvalidArgument too, with ``code`` set to
``grpc.StatusCode.INVALID_ARGUMENT``.
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
    "LKV_CODE_KEY",
    "RETRY_AFTER_KEY",
]

# Trailing-metadata key of the exact lazykv code (proto/lkv_status.h, LKV_STATUS_MD_KEY).
LKV_CODE_KEY = "lkv-code"


class LazyKVError(Exception):
    """Base of every lazykv client error.

    Attributes:
        code: the grpc.StatusCode of the failed call (or the one a local check stands for).
        lkv_code: the daemon's exact code name ("LKV_EPROFILE", "LKV_ENOSPC", ...) from the
            call's lkv-code trailing metadata, or None if the status came without one.
        details: the daemon's (or the local check's) message, for people.
        retry_after: seconds to wait before retrying (a float) when the daemon said so in the
            ``retry-after-ms`` trailing metadata (a tenant over its rate: lkv_code LKV_ERATE),
            else None.
    """

    code = grpc.StatusCode.UNKNOWN

    retry_after = None

    def __init__(self, details="", code=None, lkv_code=None, retry_after=None):
        if code is not None:
            self.code = code
        self.lkv_code = lkv_code
        self.retry_after = retry_after
        self.details = details
        super().__init__(f"{self.code.name}: {details}" if details else self.code.name)


class NotFound(LazyKVError, LookupError):
    """The document is not cached (Get, Delete)."""

    code = grpc.StatusCode.NOT_FOUND


class InvalidArgument(LazyKVError, ValueError):
    """Malformed request: wrong block size or count, unknown profile, bad key, ..."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class ResourceExhausted(LazyKVError):
    """A message over the daemon's size limit, the budgets cannot take the document, the
    tenant is over a quota (LKV_EQUOTA) or over its rate (LKV_ERATE: see retry_after), or the
    hot admission door declined a new document that the cold tier cannot take (LKV_EADMIT:
    nothing was stored; daemon option hot_admission)."""

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


class BeingComputed(LazyKVError):
    """Reserve: another worker is computing this document right now (ABORTED, lkv_code
    LKV_EINPROGRESS). Reserve again with wait=True to attach it once committed."""

    code = grpc.StatusCode.ABORTED


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
        BeingComputed,
    )
}


# Trailing-metadata key of a retry delay in milliseconds (daemon/lkv_server.h).
RETRY_AFTER_KEY = "retry-after-ms"


def retry_after_of(err):
    """Returns the retry delay in seconds a grpc.RpcError carries (retry-after-ms), or None."""
    md_fn = getattr(err, "trailing_metadata", None)
    if not callable(md_fn):
        return None
    try:
        md = md_fn() or ()
    except Exception:
        return None
    for key, value in md:
        if key == RETRY_AFTER_KEY:
            if isinstance(value, bytes):
                value = value.decode("ascii", "replace")
            return int(value) / 1000.0 if value.isdigit() else None
    return None


def lkv_code_of(err):
    """Returns the lkv-code trailing metadata value of a grpc.RpcError (a str such as
    "LKV_ENOSPC"), or None if it has none or it is not an LKV_E* name."""
    md_fn = getattr(err, "trailing_metadata", None)
    if not callable(md_fn):
        return None
    try:
        md = md_fn() or ()
    except Exception:  # a future that never got a status
        return None
    for key, value in md:
        if key == LKV_CODE_KEY:
            if isinstance(value, bytes):
                value = value.decode("ascii", "replace")
            return value if value.startswith("LKV_E") and value[5:].isalnum() else None
    return None


def from_rpc_error(err):
    """Returns the typed LazyKVError for a grpc.RpcError (or anything with code()/details()).

    The class comes from the status code (which the daemon derived from its exact code through
    the one table, proto/lkv_status.c); the exact code is ``lkv_code``. Codes without a dedicated
    class (INTERNAL, UNIMPLEMENTED, UNKNOWN, ...) give a plain LazyKVError whose ``code`` says
    which one it was.
    """
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    if code is None:
        code = grpc.StatusCode.UNKNOWN
    lkv_code = lkv_code_of(err)
    retry = retry_after_of(err)
    cls = _BY_CODE.get(code)
    if cls is None:
        return LazyKVError(details or "", code=code, lkv_code=lkv_code, retry_after=retry)
    return cls(details or "", lkv_code=lkv_code, retry_after=retry)
