#!/usr/bin/python3
"""smoke_daemon.py: end-to-end smoke test of the real lazykvd over Python grpcio.

Starts build/bin/lazykvd on a free loopback port with a temporary data dir, waits for its
"lazykvd listening on HOST:PORT" line, then checks: health, Put/Lookup/Get round trips
(stories260k, and llama-3.1-8b with 2 MiB blocks in messages over 4 MiB), every refusal status
and that refusals change nothing, a client vanishing mid-Put (never visible, aborted), a Put
over the hot budget, an oversize message, concurrent clients, Stats, SIGTERM (clean exit 0 with
the write-back queue flushed), and that documents survive a restart in the cold tier.

Usage: smoke_daemon.py --lazykvd build/bin/lazykvd --py build/proto/py [--keep]
Exit 77 (ctest: skipped) if /usr/bin/python3 has no grpc module.
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("--lazykvd", required=True)
ap.add_argument("--py", required=True, help="folder of the generated Python stubs")
ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
ap.add_argument("--seed", type=int, default=int(os.environ.get("LKV_SEED", "1234")))
args = ap.parse_args()

try:
    import grpc
except ImportError:
    print("no grpc module in this python: skipped")
    sys.exit(77)
sys.path[:0] = [args.py, os.path.join(args.py, "grpc", "health", "v1")]
import health_pb2  # noqa: E402
from lazykv.v1 import admin_pb2, admin_pb2_grpc  # noqa: E402
from lazykv.v1 import cache_pb2 as pb  # noqa: E402
from lazykv.v1 import cache_pb2_grpc  # noqa: E402

print(f"seed {args.seed} (set LKV_SEED to change)")
rng = random.Random(args.seed)
MAXMSG = 64 << 20
OPTS = [("grpc.max_receive_message_length", 128 << 20), ("grpc.max_send_message_length", 128 << 20)]
tmp = tempfile.mkdtemp(prefix="lkv-smoke-")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    else:
        print("ok:", what)


class Daemon:
    def __init__(self, *extra):
        self.log = open(os.path.join(tmp, "lazykvd.log"), "a")
        self.p = subprocess.Popen(
            [args.lazykvd, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(tmp, "data"),
             "--hot-bytes", "64MiB", "--hot-backend", "host", "--shutdown-grace", "2s", *extra],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.p.stdout.readline()
        m = re.match(r"lazykvd listening on (\S+):(\d+)$", line.strip())
        if not m:
            raise SystemExit(f"no listening line from lazykvd (got {line!r}); see {tmp}/lazykvd.log")
        self.addr = f"{m.group(1)}:{m.group(2)}"
        self.ch = grpc.insecure_channel(self.addr, options=OPTS)
        self.cache = cache_pb2_grpc.CacheStub(self.ch)
        self.admin = admin_pb2_grpc.AdminStub(self.ch)
        self.health = self.ch.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString)

    def stats(self):
        r = self.admin.Stats(admin_pb2.StatsRequest(), timeout=5)
        return {(e.section, e.key): e.value for e in r.entries}

    def stop(self):
        self.ch.close()
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(timeout=30)
        self.log.close()
        return rc


def shape(profile):
    if profile == "stories260k":
        return dict(L=5, H=4, B=16, D=8, E=4, vocab=512)
    return dict(L=32, H=8, B=16, D=128, E=2, vocab=128256)


def make_doc(profile, n_tokens):
    s = shape(profile)
    bb = s["L"] * 2 * s["H"] * s["B"] * s["D"] * s["E"]
    nb = (n_tokens + s["B"] - 1) // s["B"]
    toks = [rng.randrange(s["vocab"]) for _ in range(n_tokens)]
    blocks = []
    valid = n_tokens - (nb - 1) * s["B"]
    slab = s["B"] * s["D"] * s["E"]
    for i in range(nb):
        b = bytearray(rng.randbytes(bb))
        if i == nb - 1 and valid < s["B"]:
            for k in range(s["L"] * 2 * s["H"]):
                off = k * slab
                b[off + valid * s["D"] * s["E"]: off + slab] = bytes(slab - valid * s["D"] * s["E"])
        blocks.append(bytes(b))
    return toks, blocks, bb


def put_msgs(profile, toks, blocks, per_msg=1):
    yield pb.PutRequest(header=pb.PutHeader(profile=profile, token_ids=toks, n_blocks=len(blocks)))
    for i in range(0, len(blocks), per_msg):
        yield pb.PutRequest(blocks=[pb.Block(index=j, data=blocks[j])
                                    for j in range(i, min(i + per_msg, len(blocks)))])


def get_blocks(d, ref):
    msgs = list(d.cache.Get(pb.GetRequest(doc=ref), timeout=20))
    return msgs[0].header, [b.data for m in msgs[1:] for b in m.blocks]


def status_of(f):
    try:
        f()
        return ("OK", "")
    except grpc.RpcError as e:
        return (e.code().name, e.details() or "")
    except grpc.FutureCancelledError:
        return ("CANCELLED", "cancelled by this client")


def lookup1(d, ref):
    return d.cache.Lookup(pb.LookupRequest(docs=[ref]), timeout=5).docs[0]


try:
    d = Daemon()
    print("daemon at", d.addr)
    check(d.health(health_pb2.HealthCheckRequest(), timeout=5).status == 1, "health SERVING")
    check(d.health(health_pb2.HealthCheckRequest(service="lazykv.v1.Cache"), timeout=5).status == 1,
          "health SERVING for lazykv.v1.Cache")
    check(status_of(lambda: d.health(health_pb2.HealthCheckRequest(service="x"), timeout=5))[0]
          == "NOT_FOUND", "health of an unknown service is NOT_FOUND")

    # Round trip, stories260k, 40 tokens (partial last block), two blocks per message.
    toks, blocks, bb = make_doc("stories260k", 40)
    r = d.cache.Put(put_msgs("stories260k", toks, blocks, per_msg=2), timeout=10)
    check(len(r.key) == 32 and r.n_tokens == 40 and r.n_blocks == 3, "Put reply key/tokens/blocks")
    check(r.durability == pb.DURABILITY_HOT and not r.already_present, "Put write-back is HOT")
    r2 = d.cache.Put(put_msgs("stories260k", toks, blocks), timeout=10)
    check(r2.key == r.key and r2.already_present, "second Put of the same doc: already_present")
    lk = d.cache.Lookup(pb.LookupRequest(docs=[
        pb.DocRef(key=r.key),
        pb.DocRef(tokens=pb.TokenDoc(profile="stories260k", token_ids=toks)),
        pb.DocRef(tokens=pb.TokenDoc(profile="stories260k", token_ids=toks[:5]))]), timeout=5)
    check([x.present for x in lk.docs] == [True, True, False], "Lookup by key and by tokens")
    check(lk.docs[0].tier == pb.TIER_HOT and lk.docs[1].key == r.key, "Lookup tier HOT, same key")
    check(lk.docs[2].tier == pb.TIER_ABSENT and lk.docs[2].miss_cause == pb.MISS_CAUSE_UNKNOWN,
          "Lookup miss: ABSENT, cause UNKNOWN")
    hdr, got = get_blocks(d, pb.DocRef(key=r.key))
    check(hdr.n_blocks == 3 and hdr.block_bytes == bb and hdr.profile == "stories260k",
          "Get header")
    check(got == blocks, "Get returns the exact blocks")

    # Llama-3.1-8B: 2 MiB blocks, 3 per Put message (6 MiB > the 4 MiB gRPC default).
    ltoks, lblocks, lbb = make_doc("llama-3.1-8b", 70)
    lr = d.cache.Put(put_msgs("llama-3.1-8b", ltoks, lblocks, per_msg=3), timeout=30)
    check(lr.n_blocks == 5 and lbb == 2 << 20, "Put of 5 llama blocks (6 MiB messages)")
    hdr, got = get_blocks(d, pb.DocRef(tokens=pb.TokenDoc(profile="llama-3.1-8b", token_ids=ltoks)))
    check(got == lblocks, "Get of llama blocks by tokens round trips")

    # Refusals: right status, a useful message, nothing changed.
    before = d.stats()
    cases = [
        ("key of 3 bytes", lambda: lookup1(d, pb.DocRef(key=b"abc")), "INVALID_ARGUMENT", "32"),
        ("unknown profile", lambda: lookup1(d, pb.DocRef(tokens=pb.TokenDoc(profile="gpt-9", token_ids=[1]))),
         "INVALID_ARGUMENT", "stories260k"),
        ("token >= vocab", lambda: d.cache.Put(put_msgs("stories260k", [1, 512], [bytes(bb)]), timeout=5),
         "INVALID_ARGUMENT", "512"),
        ("wrong block size", lambda: d.cache.Put(iter([pb.PutRequest(header=pb.PutHeader(profile="stories260k", token_ids=[1])),
                                                       pb.PutRequest(blocks=[pb.Block(index=0, data=b"x" * 100)])]), timeout=5),
         "INVALID_ARGUMENT", "20480"),
        ("block out of order", lambda: d.cache.Put(iter([pb.PutRequest(header=pb.PutHeader(profile="stories260k", token_ids=list(range(32)))),
                                                         pb.PutRequest(blocks=[pb.Block(index=1, data=bytes(bb))])]), timeout=5),
         "INVALID_ARGUMENT", "expected index 0"),
        ("too few blocks", lambda: d.cache.Put(iter([pb.PutRequest(header=pb.PutHeader(profile="stories260k", token_ids=list(range(33))),
                                                     blocks=[pb.Block(index=0, data=bytes(bb)), pb.Block(index=1, data=bytes(bb))])]), timeout=5),
         "INVALID_ARGUMENT", "2 of 3 blocks"),
        ("n_blocks mismatch", lambda: d.cache.Put(iter([pb.PutRequest(header=pb.PutHeader(profile="stories260k", token_ids=[1], n_blocks=4))]), timeout=5),
         "INVALID_ARGUMENT", "n_blocks"),
        ("no header", lambda: d.cache.Put(iter([pb.PutRequest(blocks=[pb.Block(index=0, data=bytes(bb))])]), timeout=5),
         "INVALID_ARGUMENT", "header"),
        ("empty Put", lambda: d.cache.Put(iter([]), timeout=5), "INVALID_ARGUMENT", "header"),
        ("Get unknown doc", lambda: get_blocks(d, pb.DocRef(key=bytes(32))), "NOT_FOUND", "not cached"),
        ("Delete unknown doc", lambda: d.cache.Delete(pb.DeleteRequest(doc=pb.DocRef(key=bytes(32))), timeout=5),
         "NOT_FOUND", "not cached"),
        ("both key and tokens", lambda: lookup1(d, pb.DocRef(key=r.key, tokens=pb.TokenDoc(profile="stories260k", token_ids=[1]))),
         "INVALID_ARGUMENT", "exactly one"),
        ("over the hot budget", lambda: d.cache.Put(put_msgs("llama-3.1-8b", list(range(16 * 40)), []), timeout=5),
         "RESOURCE_EXHAUSTED", "hot"),
        ("malformed protobuf", lambda: d.ch.unary_unary("/lazykv.v1.Cache/Lookup")(b"\xff\xff\xff", timeout=5),
         "INVALID_ARGUMENT", "malformed"),
        ("unknown method", lambda: d.ch.unary_unary("/lazykv.v1.Cache/Nope")(b"", timeout=5),
         "UNIMPLEMENTED", "Nope"),
        ("message over the limit", lambda: d.ch.unary_unary("/lazykv.v1.Cache/Lookup")(b"\x0a" + bytes(MAXMSG + 10), timeout=20),
         "RESOURCE_EXHAUSTED", ""),
    ]
    for name, f, want, needle in cases:
        code, msg = status_of(f)
        check(code == want and needle in msg, f"{name}: {code} {msg!r}")
    after = d.stats()
    for k in [("hot", "docs"), ("lookups", "hits_hot"), ("lookups", "misses"), ("puts", "puts")]:
        check(after[k] == before[k], f"refusals changed nothing: {k} {before[k]} -> {after[k]}")
    check(after[("puts", "puts_inflight")] == 0, "no put left in flight")

    # A client that vanishes mid-Put (cancel) and one whose deadline expires mid-Put.
    ctoks, cblocks, _ = make_doc("stories260k", 64)
    for how in ["cancel", "deadline"]:
        gate = threading.Event()

        def gen():
            yield pb.PutRequest(header=pb.PutHeader(profile="stories260k", token_ids=ctoks))
            yield pb.PutRequest(blocks=[pb.Block(index=0, data=cblocks[0])])
            gate.wait(10)
        if how == "cancel":
            fut = d.cache.Put.future(gen(), timeout=30)
            time.sleep(0.3)
            fut.cancel()
        else:
            fut = d.cache.Put.future(gen(), timeout=0.5)
        code = status_of(fut.result)[0]
        gate.set()
        for _ in range(50):
            s = d.stats()
            if s[("puts", "puts_inflight")] == 0:
                break
            time.sleep(0.05)
        miss = lookup1(d, pb.DocRef(tokens=pb.TokenDoc(profile="stories260k", token_ids=ctoks)))
        check(code in ("CANCELLED", "DEADLINE_EXCEEDED") and not miss.present
              and s[("puts", "puts_inflight")] == 0,
              f"Put abandoned by {how} ({code}): not visible, no put in flight")
    check(d.stats()[("puts", "puts_aborted")] >= 2, "abandoned Puts counted as aborted")

    # Concurrent clients.
    errs = []

    def worker(k):
        try:
            wr = random.Random(args.seed * 100 + k)
            for _ in range(5):
                n = wr.randrange(1, 80)
                t = [wr.randrange(512) for _ in range(n)]
                s = shape("stories260k")
                nb = (n + 15) // 16
                bl = []
                for i in range(nb):
                    b = bytearray(wr.randbytes(bb))
                    v = n - i * 16
                    if v < 16:
                        for q in range(s["L"] * 2 * s["H"]):
                            off = q * 16 * 32
                            b[off + v * 32: off + 16 * 32] = bytes((16 - v) * 32)
                    bl.append(bytes(b))
                rr = d.cache.Put(put_msgs("stories260k", t, bl), timeout=20)
                _, g = get_blocks(d, pb.DocRef(key=rr.key))
                if g != bl:
                    errs.append(f"worker {k}: mismatch")
        except Exception as e:  # noqa: BLE001
            errs.append(f"worker {k}: {e}")
    ths = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    check(not errs, f"8 concurrent clients x 5 round trips {errs[:3]}")

    # Admin List (paged, in key order) and Evict (demote to the cold tier).
    st = d.stats()
    total = int(st[("hot", "docs")] + st[("cold", "docs")])
    seen, after, pages = [], b"", 0
    while True:
        lr2 = d.admin.List(admin_pb2.ListRequest(limit=7, after_key=after), timeout=5)
        seen += [x.key for x in lr2.docs]
        pages += 1
        if not lr2.next_after_key:
            break
        after = lr2.next_after_key
    check(seen == sorted(seen) and len(set(seen)) == len(seen) and r.key in seen and pages > 1,
          f"List pages through {len(seen)} documents in key order ({pages} pages; stats say hot+cold {total})")
    ll = d.admin.List(admin_pb2.ListRequest(profile="llama-3.1-8b"), timeout=5).docs
    check([x.key for x in ll] == [lr.key], f"List filters by profile ({len(ll)})")
    hot = d.admin.List(admin_pb2.ListRequest(tier=pb.TIER_HOT), timeout=5).docs
    cold = d.admin.List(admin_pb2.ListRequest(tier=pb.TIER_COLD), timeout=5).docs
    check(hot and all(x.tier == pb.TIER_HOT for x in hot) and all(x.tier == pb.TIER_COLD for x in cold)
          and len(hot) + len(cold) == len(seen), f"List filters by tier ({len(hot)} hot, {len(cold)} cold)")
    victim = hot[0]
    ev = d.admin.Evict(admin_pb2.EvictRequest(key=victim.key), timeout=5)
    x = lookup1(d, pb.DocRef(key=victim.key))
    check(ev.key == victim.key and x.present and x.tier == pb.TIER_COLD,
          f"Evict demotes to the cold tier ({x.tier})")
    _, got = get_blocks(d, pb.DocRef(key=victim.key))
    check(len(got) == victim.n_blocks, "an evicted document still reads back")
    code, msg = status_of(lambda: d.admin.Evict(admin_pb2.EvictRequest(key=bytes(32)), timeout=5))
    check(code == "NOT_FOUND", f"Evict of an unknown document: {code} {msg!r}")
    code, msg = status_of(lambda: d.admin.Evict(admin_pb2.EvictRequest(key=b"xy"), timeout=5))
    check(code == "INVALID_ARGUMENT", f"Evict with a 2-byte key: {code} {msg!r}")
    code, msg = status_of(lambda: d.admin.List(admin_pb2.ListRequest(profile="nope"), timeout=5))
    check(code == "INVALID_ARGUMENT", f"List of an unknown profile: {code} {msg!r}")

    # Delete, then the miss cause says so.
    d.cache.Delete(pb.DeleteRequest(doc=pb.DocRef(tokens=pb.TokenDoc(profile="llama-3.1-8b", token_ids=ltoks))), timeout=5)
    x = lookup1(d, pb.DocRef(key=lr.key))
    check(not x.present and x.miss_cause == pb.MISS_CAUSE_DELETED, "Delete, then Lookup: DELETED")

    info = d.admin.Stats(admin_pb2.StatsRequest(sections=["calls"]), timeout=5).info
    check("# Calls" in info and "Cache.Put.calls:" in info and "# Hot" not in info,
          "Stats section filter")

    # SIGTERM drains: a Put in flight that completes within the grace period succeeds.
    gtoks, gblocks, _ = make_doc("stories260k", 48)
    gate = threading.Event()

    def slow_put():
        yield pb.PutRequest(header=pb.PutHeader(profile="stories260k", token_ids=gtoks))
        yield pb.PutRequest(blocks=[pb.Block(index=0, data=gblocks[0])])
        gate.wait(10)
        yield pb.PutRequest(blocks=[pb.Block(index=i, data=gblocks[i]) for i in (1, 2)])
    fut = d.cache.Put.future(slow_put(), timeout=30)
    time.sleep(0.3)
    d.p.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    gate.set()
    code = status_of(fut.result)[0]
    check(code == "OK", f"SIGTERM: a Put in flight finishes within the grace period ({code})")
    t0 = time.time()
    rc = d.stop()
    log = open(os.path.join(tmp, "lazykvd.log")).read()
    check(rc == 0, f"SIGTERM: exit status {rc}")
    check("shutdown: store closed" in log, "SIGTERM: store closed cleanly")

    # Restart: the write-back document was flushed at SIGTERM and is served from the cold tier.
    d = Daemon()
    x = lookup1(d, pb.DocRef(key=r.key))
    check(x.present and x.tier == pb.TIER_COLD, f"after restart: present in the cold tier ({x.tier})")
    _, got = get_blocks(d, pb.DocRef(key=r.key))
    check(got == blocks, "after restart: Get returns the exact blocks")
    x = lookup1(d, pb.DocRef(tokens=pb.TokenDoc(profile="stories260k", token_ids=gtoks)))
    check(x.present, "the Put finished during the drain was persisted")

    # SIGTERM with a Put that never finishes: cancelled after the grace (2 s), nothing visible.
    gate = threading.Event()
    stoks, sblocks, _ = make_doc("stories260k", 20)

    def stuck_put():
        yield pb.PutRequest(header=pb.PutHeader(profile="stories260k", token_ids=stoks))
        gate.wait(20)
    fut = d.cache.Put.future(stuck_put(), timeout=30)
    time.sleep(0.3)
    t0 = time.time()
    d.p.send_signal(signal.SIGTERM)
    code = status_of(fut.result)[0]
    gate.set()
    rc = d.stop()
    dt = time.time() - t0
    check(rc == 0 and code != "OK" and 1.5 < dt < 10,
          f"SIGTERM with a stuck Put: cancelled after the grace ({code}, {dt:.1f}s), exit {rc}")
    d = Daemon()
    x = lookup1(d, pb.DocRef(tokens=pb.TokenDoc(profile="stories260k", token_ids=stoks)))
    check(not x.present, "the cancelled Put is not visible after restart")
    rc = d.stop()
    check(rc == 0, f"third SIGTERM: exit status {rc}")

    # Tenants: bearer tokens, roles, and per-tenant document keys (daemon/lkv_auth.h).
    import hashlib

    def token_hash(tok):
        return "blake2b:" + hashlib.blake2b(b"lazykv-token-v1:" + tok.encode(), digest_size=32).hexdigest()
    ta, tb = "lkv_alice-secret", "lkv_bob-secret"
    d = Daemon("--set", "loopback_roles=none",
               "--set", "tenant.alice.token_hash=" + token_hash(ta), "--set", "tenant.alice.roles=data",
               "--set", "tenant.bob.token_hash=" + token_hash(tb), "--set", "tenant.bob.roles=data,admin")
    A = [("authorization", "Bearer " + ta)]
    B = [("authorization", "Bearer " + tb)]
    ref = pb.DocRef(tokens=pb.TokenDoc(profile="stories260k", token_ids=toks))
    check(d.health(health_pb2.HealthCheckRequest(), timeout=5).status == 1, "tenants: health needs no token")
    code, msg = status_of(lambda: lookup1(d, ref))
    check(code == "UNAUTHENTICATED", f"tenants: no token -> {code} {msg!r}")
    code, msg = status_of(lambda: d.cache.Lookup(pb.LookupRequest(docs=[ref]), timeout=5,
                                                 metadata=[("authorization", "Bearer lkv_wrong")]))
    check(code == "UNAUTHENTICATED", f"tenants: wrong token -> {code} {msg!r}")
    code, msg = status_of(lambda: d.cache.Lookup(pb.LookupRequest(docs=[ref]), timeout=5, metadata=A + B))
    check(code == "UNAUTHENTICATED", f"tenants: two authorization headers -> {code} {msg!r}")
    ra = d.cache.Put(put_msgs("stories260k", toks, blocks), timeout=10, metadata=A)
    xa = d.cache.Lookup(pb.LookupRequest(docs=[ref]), timeout=5, metadata=A).docs[0]
    xb = d.cache.Lookup(pb.LookupRequest(docs=[ref]), timeout=5, metadata=B).docs[0]
    check(xa.present and not xb.present and xa.key != xb.key and ra.key != r.key,
          "tenants: same tokens, per-tenant keys; bob does not see alice's document")
    code, msg = status_of(lambda: d.admin.Stats(admin_pb2.StatsRequest(), timeout=5, metadata=A))
    check(code == "PERMISSION_DENIED", f"tenants: data role cannot Stats -> {code} {msg!r}")
    check("# Hot" in d.admin.Stats(admin_pb2.StatsRequest(), timeout=5, metadata=B).info,
          "tenants: admin role can Stats")
    rc = d.stop()
    check(rc == 0, f"tenants: SIGTERM exit status {rc}")

    # Bad configuration: exit 2 with the option named.
    p = subprocess.run([args.lazykvd, "--hot-bytes", "lots"], capture_output=True, text=True)
    check(p.returncode == 2 and "hot_bytes" in p.stderr, f"bad config exits 2: {p.stderr.strip()}")
finally:
    try:
        if d.p.poll() is None:
            d.p.kill()
            d.p.wait()
    except NameError:
        pass
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print("kept", tmp)

if failures:
    print(f"{len(failures)} FAILED:", *failures, sep="\n  ")
    sys.exit(1)
print("all ok")
