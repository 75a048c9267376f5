#!/usr/bin/python3
"""Integration test: the lazykv Python package against the real lazykvd.

Starts build/bin/lazykvd on 127.0.0.1:0 with a temporary data directory, reads its
"lazykvd listening on HOST:PORT" line, and drives it through lazykv.Client:
  - Put / Lookup / Get / Delete round trip of a stories260k document (KV from a deterministic
    stand-in, not a model), miss causes, Stats, health;
  - error types: unknown profile, wrong block size, token id >= vocab, unknown document;
  - tenants: tokens, roles, the isolation of one tenant's documents and counters from
    another's, and the rule that a non-loopback listener needs tenants.

Usage: test_integration.py [PATH_TO_LAZYKVD]   (default: $LAZYKVD, else build/bin/lazykvd)
Exit status 77 (ctest: skipped) when the binary does not exist.
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import lazykv

# stories260k (built-in profile): 5 layers, 4 KV heads, head_dim 8, f32, 16 tokens per block.
PROFILE = "stories260k"
BLOCK_TOKENS = 16
BLOCK_BYTES = 5 * 2 * 4 * BLOCK_TOKENS * 8 * 4  # 20480
VOCAB = 512
LISTEN_RE = re.compile(r"lazykvd listening on (\S+):(\d+)")


def fake_blocks(tokens, seed=0):
    """Deterministic stand-in KV (NOT a model): one BLOCK_BYTES block per 16 tokens, the
    unused slots of a partial last block zero, as the layout requires."""
    n_blocks = -(-len(tokens) // BLOCK_TOKENS)
    out = []
    for b in range(n_blocks):
        data = bytearray(BLOCK_BYTES)
        valid = min(BLOCK_TOKENS, len(tokens) - b * BLOCK_TOKENS)
        slab = BLOCK_TOKENS * 8 * 4  # One (layer, K|V, head) slab: 16 tokens x 8 dims x f32.
        for s in range(BLOCK_BYTES // slab):
            for t in range(valid):
                v = (tokens[b * BLOCK_TOKENS + t] * 131 + s * 7 + seed) & 0xFF
                off = s * slab + t * 32
                data[off:off + 32] = bytes([v]) * 32
        out.append(bytes(data))
    return out


def find_daemon():
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        return sys.argv.pop(1)
    if os.environ.get("LAZYKVD"):
        return os.environ["LAZYKVD"]
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "..", "build", "bin", "lazykvd")


LAZYKVD = find_daemon()


class Daemon:
    """One lazykvd process with its own data directory, stopped with SIGTERM."""

    def __init__(self, config_text="", extra=(), listen="127.0.0.1:0"):
        self.dir = tempfile.TemporaryDirectory(prefix="lazykv-pytest-")
        conf = os.path.join(self.dir.name, "lazykvd.conf")
        with open(conf, "w") as f:
            f.write(config_text)
        args = [LAZYKVD, "--config", conf, "--listen", listen,
                "--data_dir", os.path.join(self.dir.name, "data"), "--hot_backend", "host",
                "--hot_bytes", "32MiB", "--cold_bytes", "128MiB", *extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace")
        self.lines = []
        self.ready = threading.Event()
        self.target = None
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 20
        while not self.ready.is_set() and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                time.sleep(0.1)  # Let the reader catch the last lines.
                break
            self.ready.wait(0.05)
        if self.target is None:
            self.stop()
            raise RuntimeError(f"lazykvd did not start (exit {self.proc.returncode}):\n"
                               + "".join(self.lines[-20:]))

    def _read(self):
        try:
            for line in self.proc.stdout:
                self.lines.append(line)
                m = LISTEN_RE.search(line)
                if m and self.target is None:
                    self.target = f"{m.group(1)}:{m.group(2)}"
                    self.ready.set()
        except (ValueError, OSError):  # stdout closed by stop().
            pass

    def log(self):
        return "".join(self.lines)

    def stop(self):
        rc = self.proc.poll()
        if rc is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.dir.cleanup()
        return rc


class AnonymousTest(unittest.TestCase):
    """No tenants: loopback callers are the default tenant with every role."""

    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.kv = lazykv.Client(cls.d.target, timeout=20)

    @classmethod
    def tearDownClass(cls):
        cls.kv.close()
        rc = cls.d.stop()
        if rc != 0:
            raise AssertionError(f"lazykvd exited {rc} after SIGTERM:\n{cls.d.log()[-3000:]}")

    def test_ping(self):
        self.assertTrue(self.kv.ping())

    def test_round_trip(self):
        kv = self.kv
        tokens = [(7 * i + 3) % VOCAB for i in range(40)]  # 3 blocks, the last one partial.
        blocks = fake_blocks(tokens)
        st = kv.lookup([(PROFILE, tokens)])[0]
        self.assertFalse(st.present)
        self.assertEqual(st.tier, "absent")
        self.assertEqual(len(st.key), 32)
        # The profile's weights identity: the BLAKE2b-256 of the shipped checkpoint.
        self.assertTrue(st.model_id.startswith("blake2b:3e77c0b7"), st.model_id)

        r = kv.put(PROFILE, tokens, blocks)
        self.assertEqual(len(r.key), 32)
        self.assertEqual(r.key, st.key)  # Lookup of absent docs reports the same key.
        self.assertEqual((r.n_tokens, r.n_blocks), (40, 3))
        self.assertIn(r.durability, ("hot", "durable"))
        self.assertFalse(r.already_present)
        self.assertTrue(kv.put(PROFILE, tokens, iter(blocks)).already_present)

        st = kv.lookup([r.key, lazykv.Doc(PROFILE, tokens), (PROFILE, tokens[:-1])])
        self.assertEqual([s.present for s in st], [True, True, False])
        self.assertIn(st[0].tier, ("hot", "cold"))
        self.assertEqual((st[0].n_tokens, st[0].n_blocks), (40, 3))
        self.assertEqual(st[0].miss_cause, None)

        for doc in (kv.get(r.key), kv.get(profile=PROFILE, tokens=tokens)):
            self.assertEqual(doc.key, r.key)
            self.assertEqual(doc.profile, PROFILE)
            self.assertEqual((doc.n_tokens, doc.n_blocks), (40, 3))
            self.assertEqual((doc.block_bytes, doc.block_tokens), (BLOCK_BYTES, BLOCK_TOKENS))
            self.assertEqual(doc.blocks, blocks)

        self.assertEqual(kv.delete(r.key), r.key)
        st = kv.lookup([r.key])[0]
        self.assertFalse(st.present)
        self.assertEqual(st.miss_cause, "deleted")
        with self.assertRaises(lazykv.NotFound):
            kv.get(r.key)
        with self.assertRaises(lazykv.NotFound):
            kv.delete(r.key)

    def test_errors(self):
        kv = self.kv
        tokens = list(range(20))
        with self.assertRaises(lazykv.InvalidArgument) as cm:
            kv.put("no-such-profile", tokens, fake_blocks(tokens))
        self.assertIn(PROFILE, cm.exception.details)  # The message lists the known profiles.
        # The exact code comes from the lkv-code trailing metadata, not from the message.
        self.assertEqual(cm.exception.lkv_code, "LKV_EPROFILE")
        with self.assertRaises(lazykv.InvalidArgument) as cm:
            kv.put(PROFILE, tokens, [b"\0" * (BLOCK_BYTES - 1), b"\0" * BLOCK_BYTES])
        self.assertEqual(cm.exception.lkv_code, "LKV_EINVAL")
        with self.assertRaises(lazykv.InvalidArgument):
            kv.put(PROFILE, tokens, fake_blocks(tokens)[:1])  # One block short.
        with self.assertRaises(lazykv.InvalidArgument):
            kv.put(PROFILE, [1, 2, VOCAB], fake_blocks([1, 2, 3]))
        with self.assertRaises(lazykv.InvalidArgument) as cm:
            kv.lookup([("no-such-profile", tokens)])
        self.assertEqual(cm.exception.lkv_code, "LKV_EPROFILE")
        with self.assertRaises(lazykv.NotFound) as cm:
            kv.get(bytes(32))
        self.assertEqual(cm.exception.lkv_code, "LKV_ENOTFOUND")
        with self.assertRaises(lazykv.NotFound) as cm:
            kv.delete(bytes(32))
        self.assertEqual(cm.exception.lkv_code, "LKV_ENOTFOUND")
        # A refused Put changed nothing.
        self.assertFalse(kv.lookup([(PROFILE, tokens)])[0].present)

    def test_rag_example(self):
        import importlib.util
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.path.join(here, "..", "..", "..", "client", "python", "examples", "rag_pipeline.py")
        spec = importlib.util.spec_from_file_location("rag_pipeline", path)
        rag = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(rag)
        self.assertEqual(rag.BLOCK_BYTES, BLOCK_BYTES)
        first = [rag.answer(self.kv, q, 2, log=lambda *_: None) for q in rag.QUESTIONS]
        # Question 3 shares "lily" with question 1: a hit the first time round already.
        self.assertGreater(sum(m for _, m, _ in first), 0)
        self.assertGreater(sum(h for h, _, _ in first), 0)
        for q in rag.QUESTIONS:  # Second pass: everything is cached.
            hits, misses, kvs = rag.answer(self.kv, q, 2, log=lambda *_: None)
            self.assertEqual((hits, misses), (2, 0))
            for doc_id, doc in kvs.items():
                self.assertEqual(doc.blocks, rag.compute_kv(rag.tokenize(rag.CORPUS[doc_id])))

    def test_stats(self):
        s = self.kv.stats()
        self.assertTrue(s.info.startswith("#"))
        self.assertTrue(s.entries)


TOKENS = {"alice": "lkv_alice-token-for-the-integration-test-000000",
          "bob": "lkv_bob-token-for-the-integration-test-1111111111"}


class TenantTest(unittest.TestCase):
    """Tenants alice (data) and bob (data, admin)."""

    @classmethod
    def setUpClass(cls):
        conf = (lazykv.tenant_section("alice", TOKENS["alice"], ("data",)) +
                lazykv.tenant_section("bob", TOKENS["bob"], ("data", "admin")))
        cls.d = Daemon(conf)

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()

    def client(self, who):
        return lazykv.Client(self.d.target, token=TOKENS.get(who, who), timeout=20)

    def test_credentials(self):
        with self.client("lkv_wrong") as kv:
            with self.assertRaises(lazykv.Unauthenticated) as cm:
                kv.lookup([bytes(32)])
            self.assertEqual(cm.exception.lkv_code, "LKV_EUNAUTH")
            self.assertTrue(kv.ping())  # Health needs no token.
        with self.client("alice") as kv:
            self.assertEqual(len(kv.lookup([bytes(32)])), 1)
            with self.assertRaises(lazykv.PermissionDenied) as cm:
                kv.stats()
            self.assertEqual(cm.exception.lkv_code, "LKV_EPERM")
        with self.client("bob") as kv:
            self.assertTrue(kv.stats().info)

    def test_counters_isolated(self):
        # Issue 4: one tenant's hit/miss counters are not visible to another.
        with self.client("alice") as alice, self.client("bob") as bob:
            before = {k: v for k, v in bob.stats(["lookups"]).entries.items()
                      if k[0] == "lookups"}
            alice.lookup([(PROFILE, [1, 2, 3]), (PROFILE, [4, 5, 6])])
            after = {k: v for k, v in bob.stats(["lookups"]).entries.items()
                     if k[0] == "lookups"}
        self.assertEqual(before, after, "bob (admin) sees alice's lookup counters: hit/miss "
                         "counters must be kept and shown per tenant")

    def test_isolation(self):
        tokens = [11 * i % VOCAB for i in range(33)]
        with self.client("alice") as alice, self.client("bob") as bob:
            r = alice.put(PROFILE, tokens, fake_blocks(tokens))
            self.assertTrue(alice.lookup([r.key])[0].present)
            # Bob names the same tokens: a different key, absent.
            st = bob.lookup([(PROFILE, tokens), r.key])
            self.assertFalse(st[0].present)
            self.assertNotEqual(st[0].key, r.key)
            # Bob names alice's key: absent, and cannot read or delete it.
            why = "bob reaches alice's document by its key: a key must be checked against " \
                  "the caller's tenant"
            self.assertFalse(st[1].present, why)
            with self.assertRaises(lazykv.NotFound, msg=why):
                bob.get(r.key)
            with self.assertRaises(lazykv.NotFound, msg=why):
                bob.delete(r.key)
            self.assertEqual(alice.get(r.key).blocks, fake_blocks(tokens))


class BindTest(unittest.TestCase):
    """A non-loopback listener needs tenants, unless explicitly allowed."""

    def test_refused_without_tenants(self):
        with self.assertRaises(RuntimeError) as cm:
            Daemon(listen="0.0.0.0:0")
        self.assertIn("exit 2", str(cm.exception))
        self.assertIn("allow_insecure_bind", str(cm.exception))

    def test_allowed(self):
        for conf, extra in (("", ("--allow_insecure_bind", "true")),
                            (lazykv.tenant_section("alice", TOKENS["alice"], ("data",)), ())):
            d = Daemon(conf, extra, listen="0.0.0.0:0")
            try:
                port = d.target.rsplit(":", 1)[1]
                with lazykv.Client(f"127.0.0.1:{port}", timeout=20) as kv:
                    self.assertTrue(kv.ping())
            finally:
                self.assertEqual(d.stop(), 0)


if __name__ == "__main__":
    if not os.path.exists(LAZYKVD):
        print(f"SKIP: lazykvd not found at {LAZYKVD} (build the lazykvd target first)")
        sys.exit(77)
    unittest.main(verbosity=2)
