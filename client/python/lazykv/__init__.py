"""lazykv: Python client of the lazykv position-agnostic KV cache, for RAG pipelines.

    import lazykv
    with lazykv.Client("127.0.0.1:7070", token=None) as kv:
        status = kv.lookup([lazykv.Doc("stories260k", doc_tokens)])
        ...
    with lazykv.WorkerClient("127.0.0.1:7080") as w:      # lazykv-worker --serve
        print(w.run(["a document"], "A question?").text)

See client/python/README.md. Errors are typed (lazykv.NotFound, lazykv.InvalidArgument, ...,
all subclasses of lazykv.LazyKVError). lazykv.auth (and `python3 -m lazykv.tenant`) makes
bearer tokens and tenant sections.
"""

from .errors import (Cancelled, DeadlineExceeded, InvalidArgument, LazyKVError, NotFound,
                     PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable,
                     from_rpc_error)
from .auth import hash_token, new_token, tenant_section

try:
    from .client import KEY_BYTES, Client, Doc, Document, DocStatus, PutResult, Stats
    from .worker import Generation, GenerationStream, Summary, Token, WorkerClient
except ImportError as _stub_error:  # Stubs not built: errors and auth still work.
    _missing = _stub_error

    def __getattr__(name):
        if name in ("KEY_BYTES", "Client", "Doc", "Document", "DocStatus", "PutResult", "Stats",
                    "WorkerClient", "Generation", "GenerationStream", "Summary", "Token"):
            raise _missing
        raise AttributeError(f"module 'lazykv' has no attribute {name!r}")

__version__ = "0.1.0"

__all__ = [
    "Client", "Doc", "Document", "DocStatus", "PutResult", "Stats", "KEY_BYTES",
    "WorkerClient", "Generation", "GenerationStream", "Summary", "Token",
    "LazyKVError", "NotFound", "InvalidArgument", "ResourceExhausted", "Unauthenticated",
    "PermissionDenied", "Unavailable", "DeadlineExceeded", "Cancelled", "from_rpc_error",
    "hash_token", "new_token", "tenant_section",
]
