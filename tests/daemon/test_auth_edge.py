#!/usr/bin/python3
"""lkv_auth at a real gRPC edge: tests/daemon/auth_edge_server (the daemon's RPC engine plus
lkv_auth, wired as daemon/lkv_auth.h describes) driven by the lazykv Python client.

Checks what clients see over real gRPC: missing / malformed / wrong tokens give
UNAUTHENTICATED, a missing role PERMISSION_DENIED, the right token the right tenant (with its
own salt), anonymous loopback callers the default tenant (zero salt) unless the server requires
tokens, and health needs no token. Also that gRPC core's loopback peer strings (IPv4 here) are
recognised.

Usage: test_auth_edge.py PATH_TO_auth_edge_server
"""

import re
import subprocess
import sys
import unittest

import grpc

import lazykv
from lazykv.v1 import cache_pb2, cache_pb2_grpc

SERVER = sys.argv.pop(1) if len(sys.argv) > 1 else "auth_edge_server"
ALICE, BOB = "lkv_edge-alice-token", "lkv_edge-bob-token"


class Server:
    def __init__(self, loopback_roles=None):
        args = [SERVER] + ([loopback_roles] if loopback_roles else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (\S+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"auth_edge_server did not start: {line!r}")
        self.target = m.group(1)

    def stop(self):
        self.proc.stdin.close()
        rc = self.proc.wait(20)
        self.proc.stdout.close()
        return rc


def whoami(kv):
    st = kv.lookup([bytes(32)])[0]
    return st.profile, st.key


class EdgeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Server()

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0

    def client(self, token=None):
        return lazykv.Client(self.s.target, token=token, timeout=10)

    def test_tenants(self):
        with self.client(ALICE) as a, self.client(BOB) as b, self.client() as anon:
            na, sa = whoami(a)
            nb, sb = whoami(b)
            nd, sd = whoami(anon)
        self.assertEqual((na, nb, nd), ("alice", "bob", "default"))
        self.assertEqual(sd, bytes(32))  # The store's default tenant salt.
        self.assertEqual(len({sa, sb, sd}), 3)

    def test_roles(self):
        with self.client(ALICE) as a:
            with self.assertRaises(lazykv.PermissionDenied) as cm:
                a.stats()
            self.assertIn('tenant "alice" lacks role admin', cm.exception.details)
        with self.client(BOB) as b:
            self.assertEqual(b.stats().info, "tenant:bob\n")
        with self.client() as anon:  # Anonymous loopback: every role by default.
            self.assertEqual(anon.stats().info, "tenant:default\n")

    def test_bad_credentials(self):
        with self.client("lkv_edge-alice-tokem") as kv:
            with self.assertRaises(lazykv.Unauthenticated) as cm:
                kv.lookup([bytes(32)])
            self.assertIn("invalid bearer token", cm.exception.details)
            self.assertTrue(kv.ping())  # Health: no token needed, a bad one ignored.
        stub = cache_pb2_grpc.CacheStub(grpc.insecure_channel(self.s.target))
        req = cache_pb2.LookupRequest(docs=[cache_pb2.DocRef(key=bytes(32))])
        for value in ("Basic YWxpY2U6cHc=", "Bearer", "Bearer a b", "Bearer " + "x" * 600):
            with self.assertRaises(grpc.RpcError) as cm:
                stub.Lookup(req, metadata=(("authorization", value),), timeout=10)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAUTHENTICATED, value[:20])
            self.assertIn("malformed", cm.exception.details())


class TokensOnLoopbackTest(unittest.TestCase):
    def test_anonymous_refused(self):
        s = Server("none")
        try:
            with lazykv.Client(s.target, timeout=10) as kv:
                with self.assertRaises(lazykv.Unauthenticated) as cm:
                    kv.lookup([bytes(32)])
                self.assertIn("missing credentials", cm.exception.details)
                self.assertTrue(kv.ping())
            with lazykv.Client(s.target, token=ALICE, timeout=10) as kv:
                self.assertEqual(whoami(kv)[0], "alice")
        finally:
            self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
