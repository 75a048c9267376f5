"""lazykv.Client: the Python client of lazykvd, for RAG pipelines, on grpcio.

One Client holds one gRPC channel (thread-safe, share it). Every method takes an optional
``timeout`` in seconds (default: the client's) and raises a typed lazykv.errors.LazyKVError on
failure. Documents are named either by their 32-byte key (bytes, or 64 hex characters) or by
(profile, token ids); Put returns the key.

Blocks are bytes-like objects of exactly the profile's block size in the layout of
kernels/lkv_layout.h ([layer][K then V][kv_head][token][head_dim], little-endian); the last block
of a document may be partial, its unused token slots zero. The daemon checks sizes and counts.

The wire contract is proto/lazykv/v1/*.proto; the stubs are generated at build time by the
CMake target ``lazykv_python`` into <build>/python/lazykv/ (see client/python/README.md).
"""

import dataclasses
import os
from collections.abc import Sized

import grpc

from . import errors
from .errors import InvalidArgument, from_rpc_error

try:
    from lazykv.v1 import admin_pb2, admin_pb2_grpc, cache_pb2, cache_pb2_grpc
    from lazykv._health.v1 import health_pb2, health_pb2_grpc
except ImportError as e:  # pragma: no cover - a packaging problem, not a runtime one
    raise ImportError(
        "lazykv: the generated gRPC stubs are missing; build them with "
        "`cmake --build BUILD --target lazykv_python` and put BUILD/python on PYTHONPATH "
        f"({e})") from e

__all__ = ["Client", "Doc", "PutResult", "DocStatus", "Document", "Stats", "KEY_BYTES"]

KEY_BYTES = 32
DEFAULT_MAX_MESSAGE = 64 << 20  # lazykvd's default max_message_bytes.
_FRAMING = 64 << 10  # Room left in a Put message for the header and protobuf framing.

_TIER = {
    cache_pb2.TIER_UNSPECIFIED: "unspecified",
    cache_pb2.TIER_HOT: "hot",
    cache_pb2.TIER_COLD: "cold",
    cache_pb2.TIER_ABSENT: "absent",
}
_MISS = {
    cache_pb2.MISS_CAUSE_NONE: None,
    cache_pb2.MISS_CAUSE_UNKNOWN: "unknown",
    cache_pb2.MISS_CAUSE_EVICTED: "evicted",
    cache_pb2.MISS_CAUSE_CORRUPT: "corrupt",
    cache_pb2.MISS_CAUSE_DELETED: "deleted",
    cache_pb2.MISS_CAUSE_LOST: "lost",
    cache_pb2.MISS_CAUSE_PROFILE: "profile",
    cache_pb2.MISS_CAUSE_OWNER_DOWN: "owner_down",
}
_DURABILITY = {
    cache_pb2.DURABILITY_UNSPECIFIED: "unspecified",
    cache_pb2.DURABILITY_HOT: "hot",
    cache_pb2.DURABILITY_DURABLE: "durable",
}


@dataclasses.dataclass(frozen=True)
class Doc:
    """A document named by its content: a model profile name and its token ids."""

    profile: str
    tokens: tuple

    def __init__(self, profile, tokens):
        object.__setattr__(self, "profile", profile)
        object.__setattr__(self, "tokens", tuple(tokens))


@dataclasses.dataclass(frozen=True)
class PutResult:
    key: bytes  # The 32-byte document key.
    n_tokens: int
    n_blocks: int
    durability: str  # "hot" (write-back) or "durable" (in the cold tier).
    already_present: bool  # The document was cached already; its KV was kept.
    tier: str  # "hot" or "cold".


@dataclasses.dataclass(frozen=True)
class DocStatus:
    present: bool
    tier: str  # "hot", "cold" or "absent".
    n_tokens: int
    n_blocks: int
    key: bytes  # The 32-byte key (also for absent documents).
    miss_cause: object  # None when present, else "unknown", "evicted", "deleted", ...
    profile: str
    model_id: str = ""  # The profile's weights identity ("blake2b:<hex>" or a revision; "" none).


@dataclasses.dataclass(frozen=True)
class Document:
    key: bytes
    profile: str
    n_tokens: int
    n_blocks: int
    block_bytes: int
    block_tokens: int
    tier: str  # Where it was found, before any promotion.
    blocks: list  # n_blocks bytes objects of block_bytes each, in index order.


@dataclasses.dataclass(frozen=True)
class Stats:
    info: str  # INFO-style text ("# Section" then "key:value" lines).
    entries: dict  # {(section, key): float or str}


def _as_key(v):
    """Returns v as 32 key bytes (from bytes-like or 64 hex characters) or raises."""
    if isinstance(v, str):
        try:
            b = bytes.fromhex(v)
        except ValueError:
            raise InvalidArgument(f"a key string must be 64 hex digits, got {v[:80]!r}") from None
    else:
        b = bytes(v)
    if len(b) != KEY_BYTES:
        raise InvalidArgument(f"a document key is {KEY_BYTES} bytes, got {len(b)}")
    return b


def _tokens(tokens):
    try:
        ids = [int(t) for t in tokens]
    except (TypeError, ValueError):
        raise InvalidArgument("token ids must be an iterable of integers") from None
    if not ids:
        raise InvalidArgument("a document needs at least one token id")
    for t in ids:
        if not 0 <= t < 1 << 32:
            raise InvalidArgument(f"token id {t} is outside 0..2^32-1")
    return ids


def doc_ref(doc=None, *, profile=None, tokens=None):
    """Builds a cache_pb2.DocRef from a key, a Doc, a (profile, tokens) pair, or keywords."""
    if doc is not None and (profile is not None or tokens is not None):
        raise InvalidArgument("name a document by key or by profile and tokens, not both")
    if doc is None:
        if profile is None or tokens is None:
            raise InvalidArgument("name a document by key, or by both profile and tokens")
        doc = Doc(profile, tokens)
    if isinstance(doc, tuple) and not isinstance(doc, Doc) and len(doc) == 2 and \
            isinstance(doc[0], str) and not isinstance(doc[1], (str, bytes)):
        doc = Doc(doc[0], doc[1])
    if isinstance(doc, Doc):
        if not isinstance(doc.profile, str) or not doc.profile:
            raise InvalidArgument("a profile name must be a non-empty string")
        return cache_pb2.DocRef(
            tokens=cache_pb2.TokenDoc(profile=doc.profile, token_ids=_tokens(doc.tokens)))
    if isinstance(doc, (bytes, bytearray, memoryview, str)):
        return cache_pb2.DocRef(key=_as_key(doc))
    raise InvalidArgument(
        f"cannot name a document with {type(doc).__name__}: use a 32-byte key, 64 hex digits, "
        "lazykv.Doc(profile, tokens) or a (profile, tokens) tuple")


def put_requests(profile, tokens, blocks, max_message_bytes=DEFAULT_MAX_MESSAGE, n_blocks=0,
                 on_error=None):
    """Yields the PutRequest stream: the header first, then blocks in index order, packed
    into messages of at most max_message_bytes (at least one block per message).

    blocks: an iterable of bytes-like objects, consumed lazily (a generator is fine).
    on_error: called with the exception if iterating blocks fails (grpc would otherwise turn
    it into an anonymous CANCELLED); the stream then ends early, and the daemon discards the
    partial document.
    """
    budget = max(1, max_message_bytes - _FRAMING)
    header = cache_pb2.PutHeader(profile=profile, token_ids=tokens, n_blocks=n_blocks)
    msg = cache_pb2.PutRequest(header=header)
    size = 0
    index = 0
    try:
        for b in blocks:
            data = bytes(b)
            if size and size + len(data) > budget:
                yield msg
                msg = cache_pb2.PutRequest()
                size = 0
            msg.blocks.add(index=index, data=data)
            size += len(data)
            index += 1
    except Exception as e:  # noqa: BLE001 - handed to the caller, re-raised there
        if on_error is None:
            raise
        on_error(e)
        return
    yield msg


def _pem(value, what):
    """PEM bytes from bytes (as given) or a path (read), or None."""
    if value is None or value == "":
        return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    try:
        with open(value, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidArgument(f"TLS: cannot read {what} {value}: {e.strerror}") from None


def _tls_credentials(ca, cert, key):
    """grpc.ChannelCredentials for the TLS options (or their LAZYKV_TLS_* defaults), or None
    for plaintext."""
    ca = ca if ca is not None else os.environ.get("LAZYKV_TLS_CA")
    cert = cert if cert is not None else os.environ.get("LAZYKV_TLS_CERT")
    key = key if key is not None else os.environ.get("LAZYKV_TLS_KEY")
    ca_pem, cert_pem, key_pem = _pem(ca, "tls_ca"), _pem(cert, "tls_cert"), _pem(key, "tls_key")
    if (cert_pem is None) != (key_pem is None):
        raise InvalidArgument("TLS: a client certificate needs both tls_cert and tls_key")
    if ca_pem is None:
        if cert_pem is not None:
            raise InvalidArgument("TLS: a client certificate needs tls_ca (the daemon's CA)")
        return None
    return grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key_pem,
                                        certificate_chain=cert_pem)


class Client:
    """A connection to one lazykvd.

    target: "host:port" (or any gRPC target). token: the tenant's bearer token, or None
    (anonymous: allowed on loopback by default). timeout: default per-call deadline in seconds
    (None: no deadline). max_message_bytes: largest message sent or received; keep it at or
    below the daemon's max_message_bytes. channel: use this grpc.Channel instead of making one
    (the Client then does not close it).

    TLS: tls_ca (a path, or PEM bytes) switches the channel to TLS and verifies the daemon's
    certificate against that CA; tls_cert and tls_key (paths or PEM bytes, both or neither) are
    the client certificate for a daemon that requires one (its tls_client_ca_file);
    tls_server_name checks the certificate against this name instead of the target's host.
    Without them the environment variables LAZYKV_TLS_CA, LAZYKV_TLS_CERT, LAZYKV_TLS_KEY and
    LAZYKV_TLS_SERVER_NAME are used, as by the lazykv CLI. A daemon refuses bearer tokens sent
    in clear text from another host unless it is configured to accept them.
    """

    def __init__(self, target="127.0.0.1:7070", token=None, timeout=30.0,
                 max_message_bytes=DEFAULT_MAX_MESSAGE, channel=None, *, tls_ca=None,
                 tls_cert=None, tls_key=None, tls_server_name=None):
        self.target = target
        self.timeout = timeout
        self.max_message_bytes = max_message_bytes
        if token is not None and (not isinstance(token, str) or not token):
            raise InvalidArgument("token must be a non-empty string or None")
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._own_channel = channel is None
        if channel is None:
            opts = [("grpc.max_receive_message_length", max_message_bytes),
                    ("grpc.max_send_message_length", max_message_bytes)]
            creds = _tls_credentials(tls_ca, tls_cert, tls_key)
            name = tls_server_name or os.environ.get("LAZYKV_TLS_SERVER_NAME") or None
            if creds is None:
                channel = grpc.insecure_channel(target, options=opts)
            else:
                if name:
                    opts.append(("grpc.ssl_target_name_override", name))
                channel = grpc.secure_channel(target, creds, options=opts)
        self._channel = channel
        self._cache = cache_pb2_grpc.CacheStub(channel)
        self._admin = admin_pb2_grpc.AdminStub(channel)
        self._health = health_pb2_grpc.HealthStub(channel)

    # -- lifetime ---------------------------------------------------------------------------

    def close(self):
        """Closes the channel (if the Client made it). Calls after close fail."""
        if self._own_channel:
            self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _t(self, timeout):
        return self.timeout if timeout is None else timeout

    # -- data plane -------------------------------------------------------------------------

    def put(self, profile, tokens, blocks, *, timeout=None):
        """Stores one document's KV; returns a PutResult (its key among others).

        blocks: an iterable of bytes-like blocks (a list, or a generator that computes them).
        """
        ids = _tokens(tokens)
        if not isinstance(profile, str) or not profile:
            raise InvalidArgument("a profile name must be a non-empty string")
        n = len(blocks) if isinstance(blocks, Sized) else 0
        failure = []
        call = None

        def on_error(e):
            # Cancel (not half-close) so the daemon drops the partial document.
            failure.append(e)
            if call is not None:
                call.cancel()

        reqs = put_requests(profile, ids, blocks, self.max_message_bytes, n, on_error)
        try:
            call = self._cache.Put.future(reqs, timeout=self._t(timeout),
                                          metadata=self._metadata)
            if failure:  # Failed before call was assigned.
                call.cancel()
            r = call.result()
        except (grpc.RpcError, grpc.FutureCancelledError) as e:
            if failure:
                raise failure[0] from None
            if isinstance(e, grpc.FutureCancelledError):
                raise errors.Cancelled("Put was cancelled") from None
            raise from_rpc_error(e) from None
        if failure:  # The daemon answered before the stream broke; still report the cause.
            raise failure[0]
        return PutResult(key=bytes(r.key), n_tokens=r.n_tokens, n_blocks=r.n_blocks,
                         durability=_DURABILITY.get(r.durability, str(r.durability)),
                         already_present=r.already_present, tier=_TIER.get(r.tier, str(r.tier)))

    def lookup(self, docs, *, timeout=None):
        """Reports for each document (key, Doc or (profile, tokens)) whether it is cached.

        Returns a list of DocStatus in the order of docs. Counts hits and misses.
        """
        refs = [doc_ref(d) for d in docs]
        if not refs:
            return []
        try:
            r = self._cache.Lookup(cache_pb2.LookupRequest(docs=refs), timeout=self._t(timeout),
                                   metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return [DocStatus(present=s.present, tier=_TIER.get(s.tier, str(s.tier)),
                          n_tokens=s.n_tokens, n_blocks=s.n_blocks, key=bytes(s.key),
                          miss_cause=_MISS.get(s.miss_cause, str(s.miss_cause)),
                          profile=s.profile, model_id=s.model_id) for s in r.docs]

    def get(self, key=None, *, profile=None, tokens=None, timeout=None):
        """Fetches a document's blocks; returns a Document. NotFound if it is not cached."""
        req = cache_pb2.GetRequest(doc=doc_ref(key, profile=profile, tokens=tokens))
        header = None
        blocks = []
        try:
            for msg in self._cache.Get(req, timeout=self._t(timeout), metadata=self._metadata):
                if msg.HasField("header"):
                    if header is not None:
                        raise errors.LazyKVError("Get stream carried two headers",
                                                 code=grpc.StatusCode.INTERNAL)
                    header = msg.header
                for b in msg.blocks:
                    if b.index != len(blocks):
                        raise errors.LazyKVError(
                            f"Get stream: block {b.index} arrived, expected {len(blocks)}",
                            code=grpc.StatusCode.INTERNAL)
                    blocks.append(bytes(b.data))
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        if header is None or len(blocks) != header.n_blocks:
            raise errors.LazyKVError(
                f"Get stream ended after {len(blocks)} blocks"
                + ("" if header is None else f" of {header.n_blocks}"),
                code=grpc.StatusCode.INTERNAL)
        return Document(key=bytes(header.key), profile=header.profile, n_tokens=header.n_tokens,
                        n_blocks=header.n_blocks, block_bytes=header.block_bytes,
                        block_tokens=header.block_tokens,
                        tier=_TIER.get(header.tier, str(header.tier)), blocks=blocks)

    def delete(self, key=None, *, profile=None, tokens=None, timeout=None):
        """Removes a document from every tier; returns its key. NotFound if not cached."""
        req = cache_pb2.DeleteRequest(doc=doc_ref(key, profile=profile, tokens=tokens))
        try:
            r = self._cache.Delete(req, timeout=self._t(timeout), metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return bytes(r.key)

    def cluster(self, *, timeout=None):
        """lazykv.v1.Cache/Cluster (data role): the ClusterResponse message (members with
        id, addr, state, version, hot_bytes, share, self and, for self, its tiers; profiles
        with their fingerprints; mode). lazykv.cluster.ClusterClient routes with it."""
        try:
            return self._cache.Cluster(cache_pb2.ClusterRequest(), timeout=self._t(timeout),
                                       metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    # -- admin and health -------------------------------------------------------------------

    def stats(self, sections=(), *, timeout=None):
        """Returns the daemon's Stats (admin role): INFO text and {(section, key): value}."""
        try:
            r = self._admin.Stats(admin_pb2.StatsRequest(sections=list(sections)),
                                  timeout=self._t(timeout), metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        entries = {(e.section, e.key): (e.text if e.text else e.value) for e in r.entries}
        return Stats(info=r.info, entries=entries)

    def ping(self, service="", *, timeout=None):
        """Checks grpc.health.v1 (no token needed). Returns True when SERVING; raises
        Unavailable when the daemon is unreachable or reports another status."""
        try:
            r = self._health.Check(health_pb2.HealthCheckRequest(service=service),
                                   timeout=self._t(timeout), metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        if r.status != health_pb2.HealthCheckResponse.SERVING:
            name = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
            raise errors.Unavailable(f"health status {name}")
        return True
