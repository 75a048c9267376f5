#!/usr/bin/python3
"""Unit tests of the lazykv Python package that need no daemon.

1. Error mapping: every gRPC status code gives the right typed error; the exact code comes from
   the lkv-code trailing metadata (never from the message).
2. Request building: document references, the Put stream (header first, block indices, message
   packing under the size budget), local argument checks.
3. Token hashing: the same known-answer vectors as tests/daemon/test_auth.c (C and Python agree).
4. The client end to end against an in-process fake of lazykv.v1.Cache/Admin and
   grpc.health.v1 (grpcio server on a loopback port): streaming Put and Get, the bearer token
   in the metadata, server errors arriving as typed errors.

Run: PYTHONPATH=<build>/python /usr/bin/python3 tests/client/python/test_client_unit.py
"""

import hashlib
import os
import tempfile
import threading
import time
import unittest
from concurrent import futures

import grpc

import lazykv
from lazykv import errors
from lazykv.client import doc_ref, put_requests
from lazykv.v1 import admin_pb2, admin_pb2_grpc, cache_pb2, cache_pb2_grpc
from lazykv._health.v1 import health_pb2, health_pb2_grpc


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details, trailing=None):
        super().__init__()
        self._code, self._details, self._trailing = code, details, trailing

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailing


class ErrorMappingTest(unittest.TestCase):
    def test_typed(self):
        want = {
            grpc.StatusCode.NOT_FOUND: lazykv.NotFound,
            grpc.StatusCode.INVALID_ARGUMENT: lazykv.InvalidArgument,
            grpc.StatusCode.RESOURCE_EXHAUSTED: lazykv.ResourceExhausted,
            grpc.StatusCode.UNAUTHENTICATED: lazykv.Unauthenticated,
            grpc.StatusCode.PERMISSION_DENIED: lazykv.PermissionDenied,
            grpc.StatusCode.UNAVAILABLE: lazykv.Unavailable,
            grpc.StatusCode.DEADLINE_EXCEEDED: lazykv.DeadlineExceeded,
            grpc.StatusCode.CANCELLED: lazykv.Cancelled,
        }
        for code, cls in want.items():
            e = errors.from_rpc_error(FakeRpcError(code, f"msg {code.name}"))
            self.assertIs(type(e), cls)
            self.assertIsInstance(e, lazykv.LazyKVError)
            self.assertEqual(e.code, code)
            self.assertEqual(e.details, f"msg {code.name}")
            self.assertIn(code.name, str(e))

    def test_untyped_codes_keep_their_code(self):
        for code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNIMPLEMENTED,
                     grpc.StatusCode.UNKNOWN, grpc.StatusCode.ABORTED):
            e = errors.from_rpc_error(FakeRpcError(code, "x"))
            self.assertIs(type(e), lazykv.LazyKVError)
            self.assertEqual(e.code, code)

    def test_exact_code_from_metadata(self):
        RE = grpc.StatusCode.RESOURCE_EXHAUSTED
        # The message says one thing, the code another: the code wins, the message is kept.
        e = errors.from_rpc_error(FakeRpcError(RE, "Received message larger than max",
                                               (("x-other", "1"), ("lkv-code", "LKV_ENOSPC"))))
        self.assertIs(type(e), lazykv.ResourceExhausted)
        self.assertEqual(e.lkv_code, "LKV_ENOSPC")
        self.assertEqual(e.details, "Received message larger than max")
        e = errors.from_rpc_error(FakeRpcError(RE, "hot budget exhausted",
                                               (("lkv-code", b"LKV_ETOOBIG"),)))
        self.assertEqual(e.lkv_code, "LKV_ETOOBIG")
        # No metadata (gRPC core itself, a proxy, an old daemon) or a malformed value: None.
        for md in (None, (), (("lkv-code", ""),), (("lkv-code", "-1005"),),
                   (("lkv-code", "LKV_E NOSPC"),), (("lkv-codes", "LKV_ENOSPC"),)):
            e = errors.from_rpc_error(FakeRpcError(RE, "x", md))
            self.assertIs(type(e), lazykv.ResourceExhausted)
            self.assertIsNone(e.lkv_code, md)
        # Objects without trailing_metadata (or one that raises) still map.
        class Bare:
            def code(self):
                return grpc.StatusCode.NOT_FOUND

        class Raising(FakeRpcError):
            def trailing_metadata(self):
                raise RuntimeError("no status yet")

        self.assertIsNone(errors.from_rpc_error(Bare()).lkv_code)
        e = errors.from_rpc_error(Raising(grpc.StatusCode.INTERNAL, "x"))
        self.assertIs(type(e), lazykv.LazyKVError)
        self.assertIsNone(e.lkv_code)
        self.assertIsNone(lazykv.NotFound("local").lkv_code)

    def test_retry_after(self):
        RE = grpc.StatusCode.RESOURCE_EXHAUSTED
        e = errors.from_rpc_error(FakeRpcError(RE, "over rate_calls: retry in 250 ms",
                                               (("lkv-code", "LKV_ERATE"),
                                                ("retry-after-ms", "250"))))
        self.assertIs(type(e), lazykv.ResourceExhausted)
        self.assertEqual(e.lkv_code, "LKV_ERATE")
        self.assertEqual(e.retry_after, 0.25)
        e = errors.from_rpc_error(FakeRpcError(RE, "x", (("retry-after-ms", b"1500"),)))
        self.assertEqual(e.retry_after, 1.5)
        for md in (None, (), (("retry-after-ms", ""),), (("retry-after-ms", "-5"),),
                   (("retry-after-ms", "1e3"),), (("retry-after", "100"),)):
            self.assertIsNone(errors.from_rpc_error(FakeRpcError(RE, "x", md)).retry_after, md)
        self.assertIsNone(lazykv.NotFound("local").retry_after)

    def test_tls_options(self):
        with tempfile.TemporaryDirectory() as d:
            ca = os.path.join(d, "ca.pem")
            with open(ca, "wb") as f:
                f.write(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
            # A client certificate needs its key, and TLS (a CA).
            with self.assertRaises(lazykv.InvalidArgument):
                lazykv.Client("127.0.0.1:1", tls_ca=ca, tls_cert=ca)
            with self.assertRaises(lazykv.InvalidArgument):
                lazykv.Client("127.0.0.1:1", tls_cert=ca, tls_key=ca)
            with self.assertRaises(lazykv.InvalidArgument) as cm:
                lazykv.Client("127.0.0.1:1", tls_ca=os.path.join(d, "missing.pem"))
            self.assertIn("missing.pem", cm.exception.details)
            # From the environment, as the CLI reads it.
            old = os.environ.get("LAZYKV_TLS_CA")
            os.environ["LAZYKV_TLS_CA"] = os.path.join(d, "missing-env.pem")
            try:
                with self.assertRaises(lazykv.InvalidArgument) as cm:
                    lazykv.Client("127.0.0.1:1")
                self.assertIn("missing-env.pem", cm.exception.details)
                lazykv.Client("127.0.0.1:1", tls_ca="").close()  # "" = plaintext, env ignored
            finally:
                if old is None:
                    del os.environ["LAZYKV_TLS_CA"]
                else:
                    os.environ["LAZYKV_TLS_CA"] = old
            lazykv.Client("127.0.0.1:1", tls_ca=ca).close()  # PEM from a path
            lazykv.Client("127.0.0.1:1", tls_ca=open(ca, "rb").read()).close()  # PEM bytes

    def test_builtin_bases(self):
        self.assertIsInstance(lazykv.NotFound("x"), LookupError)
        self.assertIsInstance(lazykv.InvalidArgument("x"), ValueError)
        self.assertIsInstance(lazykv.DeadlineExceeded("x"), TimeoutError)
        self.assertIsInstance(lazykv.Unavailable("x"), ConnectionError)
        self.assertNotIsInstance(lazykv.PermissionDenied("x"), lazykv.Unauthenticated)


class RequestBuildingTest(unittest.TestCase):
    def test_doc_ref_forms(self):
        key = bytes(range(32))
        self.assertEqual(doc_ref(key).key, key)
        self.assertEqual(doc_ref(bytearray(key)).key, key)
        self.assertEqual(doc_ref(key.hex()).key, key)
        self.assertEqual(doc_ref(key.hex().upper()).key, key)
        for r in (doc_ref(("p", [1, 2])), doc_ref(lazykv.Doc("p", (1, 2))),
                  doc_ref(profile="p", tokens=[1, 2])):
            self.assertFalse(r.key)
            self.assertEqual(r.tokens.profile, "p")
            self.assertEqual(list(r.tokens.token_ids), [1, 2])

    def test_doc_ref_errors(self):
        bad = [
            ((b"short",), {}, "32 bytes"),
            (("zz" * 32,), {}, "hex"),
            (("ab" * 31,), {}, "32 bytes"),
            ((), {}, "by key"),
            ((), {"profile": "p"}, "both profile and tokens"),
            ((bytes(32),), {"profile": "p", "tokens": [1]}, "not both"),
            ((("p", []),), {}, "at least one token"),
            ((("p", [-1]),), {}, "outside"),
            ((("p", [1 << 32]),), {}, "outside"),
            ((("p", ["a"]),), {}, "integers"),
            ((("", [1]),), {}, "profile name"),
            ((12,), {}, "cannot name a document with int"),
        ]
        for args, kw, msg in bad:
            with self.assertRaises(lazykv.InvalidArgument, msg=repr((args, kw))) as cm:
                doc_ref(*args, **kw)
            self.assertIn(msg, str(cm.exception))
            self.assertEqual(cm.exception.code, grpc.StatusCode.INVALID_ARGUMENT)

    def test_put_stream_packing(self):
        blocks = [bytes([i]) * 100_000 for i in range(7)]
        # A budget of 300 kB (plus framing) fits 3 blocks per message.
        msgs = list(put_requests("p", [1, 2, 3], iter(blocks), 300_000 + 64 * 1024, n_blocks=7))
        self.assertEqual([len(m.blocks) for m in msgs], [3, 3, 1])
        self.assertTrue(msgs[0].HasField("header"))
        self.assertFalse(any(m.HasField("header") for m in msgs[1:]))
        self.assertEqual(msgs[0].header.profile, "p")
        self.assertEqual(list(msgs[0].header.token_ids), [1, 2, 3])
        self.assertEqual(msgs[0].header.n_blocks, 7)
        got = [b for m in msgs for b in m.blocks]
        self.assertEqual([b.index for b in got], list(range(7)))
        self.assertEqual([b.data for b in got], blocks)
        for m in msgs:
            self.assertLessEqual(m.ByteSize(), 300_000 + 64 * 1024)

    def test_put_stream_big_block_alone(self):
        # A block larger than the budget still travels, one per message.
        msgs = list(put_requests("p", [1], [b"a" * 10, b"b" * 200_000, b"c"], 100_000))
        self.assertEqual([len(m.blocks) for m in msgs], [1, 1, 1])
        # No blocks: the header alone.
        msgs = list(put_requests("p", [1], []))
        self.assertEqual(len(msgs), 1)
        self.assertEqual(len(msgs[0].blocks), 0)

    def test_put_stream_error_is_reported(self):
        def gen():
            yield b"x"
            raise RuntimeError("model crashed")

        seen = []
        msgs = list(put_requests("p", [1], gen(), on_error=seen.append))
        self.assertEqual(len(msgs), 0)  # The stream ends early; nothing is committed.
        self.assertEqual(str(seen[0]), "model crashed")
        with self.assertRaises(RuntimeError):
            list(put_requests("p", [1], gen()))

    def test_token_argument(self):
        with self.assertRaises(lazykv.InvalidArgument):
            lazykv.Client("127.0.0.1:1", token="")
        c = lazykv.Client("127.0.0.1:1", token="abc")
        self.assertEqual(c._metadata, (("authorization", "Bearer abc"),))
        c.close()
        c = lazykv.Client("127.0.0.1:1")
        self.assertIsNone(c._metadata)
        c.close()


class AuthTest(unittest.TestCase):
    def test_known_answers(self):
        # The same vectors as tests/daemon/test_auth.c.
        self.assertEqual(
            lazykv.hash_token("secret-alice"),
            "blake2b:383935774b5e80e9b9fdfbe8ec970d01ec360e7a071b83f1b825c141e8117d61")
        self.assertEqual(
            lazykv.hash_token(b"secret-alice", key=bytes(range(32))),
            "blake2b:6f39d92a8075e368175ac870c8d06ad9f4a4dd47a3d1079400de96e54320aaa0")

    def test_new_token_and_section(self):
        a, b = lazykv.new_token(), lazykv.new_token()
        self.assertNotEqual(a, b)
        self.assertEqual(len(a), 47)
        self.assertTrue(a.startswith("lkv_"))
        s = lazykv.tenant_section("alice", a, ("data", "worker"))
        self.assertEqual(s.splitlines(), ["[tenant alice]",
                                          f"token_hash = {lazykv.hash_token(a)}",
                                          "roles = data,worker"])
        with self.assertRaises(ValueError):
            lazykv.tenant_section("alice", a, ("root",))
        s = lazykv.tenant_section("bob", a, ("data",), max_hot_bytes="1GiB", rate_calls=500)
        self.assertEqual(s.splitlines()[3:], ["max_hot_bytes = 1GiB", "rate_calls = 500"])
        with self.assertRaises(ValueError):
            lazykv.tenant_section("bob", a, ("data",), max_ram="1GiB")

    def test_cli(self):
        import contextlib
        import io
        from lazykv import auth
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(auth.main(["new", "bob", "--roles", "data,admin"]), 0)
        lines = out.getvalue().splitlines()
        token = lines[1][2:]
        self.assertTrue(token.startswith("lkv_"))
        self.assertEqual(lines[2:], lazykv.tenant_section("bob", token,
                                                          ("data", "admin")).splitlines())
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(auth.main(["new", "carol", "--max-docs", "100",
                                        "--rate-bytes", "64MiB"]), 0)
        self.assertEqual(out.getvalue().splitlines()[-2:], ["max_docs = 100", "rate_bytes = 64MiB"])
        with self.assertRaises(ValueError):
            lazykv.hash_token("")
        with self.assertRaises(ValueError):
            lazykv.hash_token("x", key=b"short")


# ---- an in-process fake daemon ------------------------------------------------------------

BLOCK = 64  # Fake profile "p": 4 tokens per block, 64 bytes per block.
TOKENS_PER_BLOCK = 4


def fake_key(profile, tokens):
    h = hashlib.blake2b(digest_size=32)
    h.update(profile.encode() + b"\0" + b"".join(t.to_bytes(4, "little") for t in tokens))
    return h.digest()


class FakeCache(cache_pb2_grpc.CacheServicer):
    """Keeps documents in a dict; enough of the contract to exercise the client."""

    def __init__(self, token=None):
        self.docs = {}
        self.token = token
        self.seen_auth = []
        self.lock = threading.Lock()

    def _auth(self, context):
        md = dict(context.invocation_metadata())
        self.seen_auth.append(md.get("authorization"))
        if self.token is not None and md.get("authorization") != f"Bearer {self.token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token")

    def _key(self, ref, context):
        if ref.key:
            return bytes(ref.key)
        return fake_key(ref.tokens.profile, list(ref.tokens.token_ids))

    def Put(self, request_iterator, context):
        self._auth(context)
        header, blocks = None, []
        for i, req in enumerate(request_iterator):
            if i == 0:
                if not req.HasField("header"):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first message needs header")
                header = req.header
                if header.profile.startswith("abort-"):
                    context.abort(getattr(grpc.StatusCode, header.profile[6:]), "as asked")
                if header.profile.startswith("lkv-"):  # lkv-<STATUS>-<LKV code name>
                    status, name = header.profile[4:].split("-", 1)
                    context.set_trailing_metadata(((errors.LKV_CODE_KEY, name),))
                    context.abort(getattr(grpc.StatusCode, status), "message larger than max")
            for b in req.blocks:
                if b.index != len(blocks) or len(b.data) != BLOCK:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"block {b.index}: want index {len(blocks)}, {BLOCK} bytes")
                blocks.append(bytes(b.data))
        need = -(-len(header.token_ids) // TOKENS_PER_BLOCK)
        if len(blocks) != need:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"got {len(blocks)} blocks of {need}")
        key = fake_key(header.profile, list(header.token_ids))
        with self.lock:
            present = key in self.docs
            self.docs.setdefault(key, (header.profile, len(header.token_ids), blocks))
        return cache_pb2.PutResponse(key=key, n_tokens=len(header.token_ids), n_blocks=need,
                                     durability=cache_pb2.DURABILITY_HOT,
                                     already_present=present, tier=cache_pb2.TIER_HOT)

    lookup_delay = 0.0  # Seconds Lookup sleeps first (a slow server, for deadline tests).

    def Lookup(self, request, context):
        self._auth(context)
        if self.lookup_delay:
            time.sleep(self.lookup_delay)
        out = []
        for ref in request.docs:
            key = self._key(ref, context)
            d = self.docs.get(key)
            if d:
                out.append(cache_pb2.DocStatus(present=True, tier=cache_pb2.TIER_HOT,
                                               n_tokens=d[1], n_blocks=len(d[2]), key=key,
                                               profile=d[0]))
            else:
                out.append(cache_pb2.DocStatus(present=False, tier=cache_pb2.TIER_ABSENT,
                                               key=key, miss_cause=cache_pb2.MISS_CAUSE_UNKNOWN))
        return cache_pb2.LookupResponse(docs=out)

    def Get(self, request, context):
        self._auth(context)
        key = self._key(request.doc, context)
        d = self.docs.get(key)
        if d is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "document not cached")
        yield cache_pb2.GetResponse(header=cache_pb2.GetHeader(
            key=key, profile=d[0], n_tokens=d[1], n_blocks=len(d[2]), block_bytes=BLOCK,
            block_tokens=TOKENS_PER_BLOCK, tier=cache_pb2.TIER_HOT))
        for i in range(0, len(d[2]), 2):  # Two blocks per message.
            yield cache_pb2.GetResponse(blocks=[cache_pb2.Block(index=j, data=d[2][j])
                                                for j in range(i, min(i + 2, len(d[2])))])

    def Delete(self, request, context):
        self._auth(context)
        key = self._key(request.doc, context)
        with self.lock:
            if self.docs.pop(key, None) is None:
                context.abort(grpc.StatusCode.NOT_FOUND, "document not cached")
        return cache_pb2.DeleteResponse(key=key)


class FakeAdmin(admin_pb2_grpc.AdminServicer):
    def Stats(self, request, context):
        return admin_pb2.StatsResponse(info="# server\nversion:fake\n", entries=[
            admin_pb2.StatEntry(section="server", key="version", text="fake"),
            admin_pb2.StatEntry(section="hot", key="docs", value=3)])


class FakeHealth(health_pb2_grpc.HealthServicer):
    status = health_pb2.HealthCheckResponse.SERVING

    def Check(self, request, context):
        return health_pb2.HealthCheckResponse(status=self.status)


class FakeServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cache = FakeCache(token="tok-1")
        cls.health = FakeHealth()
        cls.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        cache_pb2_grpc.add_CacheServicer_to_server(cls.cache, cls.server)
        admin_pb2_grpc.add_AdminServicer_to_server(FakeAdmin(), cls.server)
        health_pb2_grpc.add_HealthServicer_to_server(cls.health, cls.server)
        cls.port = cls.server.add_insecure_port("127.0.0.1:0")
        cls.server.start()
        cls.target = f"127.0.0.1:{cls.port}"

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(None)

    def client(self, token="tok-1", **kw):
        return lazykv.Client(self.target, token=token, timeout=10, **kw)

    def test_round_trip(self):
        tokens = list(range(10))  # 3 blocks of 4 tokens (the last partial).
        blocks = [bytes([i]) * BLOCK for i in range(3)]
        with self.client(max_message_bytes=BLOCK + 64 * 1024) as kv:  # One block per message.
            self.assertTrue(kv.ping())
            st = kv.lookup([("p", tokens)])
            self.assertEqual(len(st), 1)
            self.assertFalse(st[0].present)
            self.assertEqual(st[0].tier, "absent")
            self.assertEqual(st[0].miss_cause, "unknown")
            r = kv.put("p", tokens, (b for b in blocks))  # A generator: n_blocks unknown.
            self.assertEqual(r.key, fake_key("p", tokens))
            self.assertEqual((r.n_tokens, r.n_blocks, r.durability, r.tier), (10, 3, "hot", "hot"))
            self.assertFalse(r.already_present)
            self.assertTrue(kv.put("p", tokens, blocks).already_present)
            st = kv.lookup([r.key, lazykv.Doc("p", tokens), r.key.hex(), ("p", [99])])
            self.assertEqual([s.present for s in st], [True, True, True, False])
            self.assertEqual(st[0].miss_cause, None)
            for doc in (kv.get(r.key), kv.get(profile="p", tokens=tokens), kv.get(r.key.hex())):
                self.assertEqual(doc.blocks, blocks)
                self.assertEqual((doc.n_blocks, doc.block_bytes, doc.profile), (3, BLOCK, "p"))
            self.assertEqual(kv.delete(r.key), r.key)
            with self.assertRaises(lazykv.NotFound):
                kv.get(r.key)
            with self.assertRaises(lazykv.NotFound):
                kv.delete(profile="p", tokens=tokens)
            self.assertEqual(kv.lookup([]), [])
        self.assertIn("Bearer tok-1", self.cache.seen_auth)

    def test_server_errors_are_typed(self):
        with self.client() as kv:
            with self.assertRaises(lazykv.InvalidArgument) as cm:
                kv.put("p", [1, 2, 3, 4, 5], [b"x" * BLOCK])  # 2 blocks needed.
            self.assertIn("got 1 blocks of 2", cm.exception.details)
            with self.assertRaises(lazykv.InvalidArgument):
                kv.put("p", [1], [b"short"])
            for code, cls in (("RESOURCE_EXHAUSTED", lazykv.ResourceExhausted),
                              ("PERMISSION_DENIED", lazykv.PermissionDenied),
                              ("UNAVAILABLE", lazykv.Unavailable)):
                with self.assertRaises(cls) as cm:
                    kv.put("abort-" + code, [1], [b"x" * BLOCK])
                self.assertIsNone(cm.exception.lkv_code)  # No metadata: status only.
            # Through a real grpcio call: the trailing metadata reaches lkv_code.
            for code, cls, name in (("RESOURCE_EXHAUSTED", lazykv.ResourceExhausted, "LKV_ENOSPC"),
                                    ("INVALID_ARGUMENT", lazykv.InvalidArgument, "LKV_EPROFILE"),
                                    ("UNAVAILABLE", lazykv.Unavailable, "LKV_ESHUTDOWN")):
                with self.assertRaises(cls) as cm:
                    kv.put(f"lkv-{code}-{name}", [1], [b"x" * BLOCK])
                self.assertEqual(cm.exception.lkv_code, name)
                self.assertEqual(cm.exception.details, "message larger than max")

    def test_wrong_token(self):
        for token in ("nope", None):
            with self.client(token=token) as kv:
                with self.assertRaises(lazykv.Unauthenticated) as cm:
                    kv.lookup([bytes(32)])
                self.assertIn("invalid bearer token", str(cm.exception))
                with self.assertRaises(lazykv.Unauthenticated):
                    kv.get(bytes(32))
                with self.assertRaises(lazykv.Unauthenticated):
                    kv.put("p", [1], [b"x" * BLOCK])
                self.assertTrue(kv.ping())  # Health needs no token.

    def test_block_generator_failure(self):
        def blocks():
            yield b"x" * BLOCK
            raise RuntimeError("model crashed")

        with self.client() as kv:
            with self.assertRaises(RuntimeError):
                kv.put("p", list(range(8)), blocks())
            self.assertFalse(kv.lookup([("p", list(range(8)))])[0].present)

    def test_stats_and_health(self):
        with self.client() as kv:
            s = kv.stats()
            self.assertIn("# server", s.info)
            self.assertEqual(s.entries[("server", "version")], "fake")
            self.assertEqual(s.entries[("hot", "docs")], 3)
            self.health.status = health_pb2.HealthCheckResponse.NOT_SERVING
            try:
                with self.assertRaises(lazykv.Unavailable) as cm:
                    kv.ping()
                self.assertIn("NOT_SERVING", str(cm.exception))
            finally:
                self.health.status = health_pb2.HealthCheckResponse.SERVING

    def test_deadline_and_unreachable(self):
        with lazykv.Client("127.0.0.1:1", timeout=2) as kv:
            with self.assertRaises(lazykv.Unavailable):
                kv.lookup([bytes(32)])
        # A deadline shorter than the server takes: raised by the client whatever the load (a
        # 1 us deadline on an idle in-process server can be met, which made this flaky).
        self.cache.lookup_delay = 0.5
        try:
            with self.client() as kv:
                t0 = time.monotonic()
                with self.assertRaises(lazykv.DeadlineExceeded):
                    kv.lookup([bytes(32)], timeout=0.1)
                self.assertLess(time.monotonic() - t0, 0.45)
        finally:
            self.cache.lookup_delay = 0.0


if __name__ == "__main__":
    unittest.main(verbosity=2)
