"""test_leases.py: zero-copy leases (Cache/Attach, Release) and tenant isolation against the
real lazykvd (issue 4, items 1 and 2).

Run by ctest (tests/leases/CMakeLists.txt) with /usr/bin/python3 and
  LKV_DAEMON_BIN, LKV_PROTO_PY   as for tests/integration/harness.py (reused: PYTHONPATH)
  LKV_SHM_READER                 the shm_reader program (a second process mapping the arena)
  LKV_LEASE_TESTS                optional comma list of test names to run (default: all)

Each test starts its own daemon on 127.0.0.1:0 with a host (shared-memory) arena. The built-in
llama profile is shrunk to one layer so that arena pages are 64 KiB and a small hot budget has
few pages (pressure is easy to make); the itest profile's blocks are 1 KiB.
"""
import hashlib
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time

import harness as H
from harness import cache_pb2, cache_pb2_grpc, admin_pb2, admin_pb2_grpc, check, soft_fail
import grpc

SHM_READER = os.environ.get("LKV_SHM_READER", "")
# Shrinks the built-in llama profile (its name has dots, so a config file, not --set) so that
# arena pages are 64 KiB.
_CONF = tempfile.NamedTemporaryFile(prefix="lkv-leases-", suffix=".conf", mode="w", delete=False)
_CONF.write("[profile llama-3.1-8b]\nn_layers = 1\n")
_CONF.close()
SMALL = ["--config", _CONF.name]
S = H.ITEST
OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
PRECOND = grpc.StatusCode.FAILED_PRECONDITION
DENIED = grpc.StatusCode.PERMISSION_DENIED
UNAUTH = grpc.StatusCode.UNAUTHENTICATED


ITEST_PAGE = 2048  # itest blocks: 2 x 2 x 2 x 16 x 8 x 2 B; its region's pages are that size.


def daemon(hot_pages=64, more=()):
    """The itest profile gets a region of hot_pages pages (the arena contract: one region per
    profile, pages of the profile's own block size); the other profiles share 2 MiB."""
    args = H.ITEST_ARGS + SMALL + [
        "--set", "profile.itest.hot_bytes=%d" % (ITEST_PAGE * hot_pages),
        "--set", "hot_bytes=%d" % (ITEST_PAGE * hot_pages + (2 << 20))] + list(more)
    return H.Daemon(args).start()


def region_of(arena, ad):
    """The arena region an attached document's pages are in (checked against ArenaInfo)."""
    check(ad.HasField("region"), "no region in AttachedDoc")
    g = arena.regions[ad.region.index]
    check(g == ad.region, "AttachedDoc.region %s != ArenaInfo.regions[%d] %s" %
          (ad.region, ad.region.index, g))
    return g


def stubs(d):
    ch = d.channel()
    return cache_pb2_grpc.CacheStub(ch), admin_pb2_grpc.AdminStub(ch)


def put(cache, seed, n_tokens, md=None):
    toks, blocks = H.make_doc(S, seed, n_tokens)
    r = cache.Put(iter(H.put_requests(S, toks, blocks)), timeout=H.timeout(20), metadata=md)
    return toks, blocks, r.key


def stats(admin, section, md=None):
    r = admin.Stats(admin_pb2.StatsRequest(sections=[section]), timeout=H.timeout(10),
                    metadata=md)
    return {e.key: (e.value if not e.text else e.text) for e in r.entries if e.section == section}


def quiesce(admin):
    """Waits until the write-back writer is idle (it pins a document while persisting it)."""
    deadline = time.monotonic() + H.timeout(10)
    while stats(admin, "persistence")["wb_pending"] != 0 and time.monotonic() < deadline:
        time.sleep(0.01)


def evict(admin, key):
    """Admin Evict that must succeed (after the writer has let go of the document)."""
    quiesce(admin)
    admin.Evict(admin_pb2.EvictRequest(key=key), timeout=H.timeout(10))


def snapshot(admin):
    """What a refused call must not change: lease counts and pinned hot bytes."""
    quiesce(admin)
    ls = stats(admin, "leases")
    hot = stats(admin, "hot")
    return (ls["live"], ls["docs_pinned"], ls["bytes_pinned"], hot["bytes_pinned"], hot["docs"])


def attach(cache, refs, ttl_ms=10000, lease_id=b"", md=None):
    return cache.Attach(cache_pb2.AttachRequest(docs=refs, ttl_ms=ttl_ms, lease_id=lease_id),
                        timeout=H.timeout(10), metadata=md)


def key_ref(key):
    return cache_pb2.DocRef(key=key)


def read_in_place(arena, att_docs, blocks_of):
    """Runs shm_reader (a second process) over the attached documents; returns its status."""
    pages, want = [], b""
    bb = att_docs[0].layout.block_bytes
    g = region_of(arena, att_docs[0])
    for a, blocks in zip(att_docs, blocks_of):
        check(a.region == g, "documents of one profile share one region")
        check(len(a.pages) == len(blocks), "pages %d != blocks %d" % (len(a.pages), len(blocks)))
        pages += list(a.pages)
        want += b"".join(blocks)
    with tempfile.NamedTemporaryFile(prefix="lkv-lease-want-") as f:
        f.write(want)
        f.flush()
        p = subprocess.run([SHM_READER, arena.shm_name, str(arena.arena_bytes),
                            str(g.base_offset), str(g.page_bytes), str(g.n_pages), str(bb),
                            ",".join(map(str, pages)), f.name],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=H.timeout(20))
    sys.stderr.write("   shm_reader: %s" % p.stdout.decode())
    return p.returncode


# ---- Tests --------------------------------------------------------------------------------


def test_attach_maps_arena():
    """Attach returns the layout, the pages and the shm name; a second process maps the arena
    read-only and finds every block byte for byte."""
    with daemon() as d:
        cache, admin = stubs(d)
        docs = [put(cache, 100 + i, n) for i, n in enumerate((40, 16, 1, 33))]
        refs = [H.token_ref(S, docs[0][0]), key_ref(docs[1][2]), H.token_ref(S, docs[2][0]),
                key_ref(docs[3][2])]
        r = attach(cache, refs)
        check(len(r.lease_id) == 16, "lease id is %d bytes" % len(r.lease_id))
        now_ms = time.time() * 1000
        check(now_ms + 5000 < r.expires_unix_ms < now_ms + 15000, "expiry %d" % r.expires_unix_ms)
        check(r.ttl_ms == 10000 and r.lease_docs == 4, "ttl %d docs %d" % (r.ttl_ms, r.lease_docs))
        a = r.arena
        check(a.backend == "host" and a.shm_name.startswith("/"), "arena %s" % a)
        g = region_of(a, r.attached[0])
        check(g.profile == "itest" and g.page_bytes == ITEST_PAGE and g.n_pages == 64,
              "itest region %s" % g)
        check(g.base_offset % (2 << 20) == 0, "region base %d not 2 MiB aligned" % g.base_offset)
        check(len(a.regions) == 3 and a.arena_bytes >= g.base_offset + 64 * ITEST_PAGE,
              "arena %d bytes, %d regions" % (a.arena_bytes, len(a.regions)))
        check(a.cuda_device == -1 and len(a.cuda_ipc_handle) == 0, "cuda fields on a host")
        mode = stat.S_IMODE(os.stat("/dev/shm" + a.shm_name).st_mode)
        check(mode == 0o600, "shm mode %o, want 600" % mode)
        check(len(r.attached) == 4 and len(r.docs) == 4, "per-document answers")
        seen = set()
        for i, (ad, (toks, blocks, key)) in enumerate(zip(r.attached, docs)):
            check(ad.key == key and r.docs[i].key == key, "doc %d key" % i)
            check(ad.profile == "itest" and ad.n_tokens == len(toks), "doc %d profile/n" % i)
            L = ad.layout
            check((L.n_layers, L.n_kv_heads, L.head_dim, L.dtype, L.block_tokens, L.block_bytes)
                  == (2, 2, 8, "f16", 16, S.block_bytes), "layout %s" % L)
            check(len(ad.pages) == len(blocks), "doc %d: %d pages" % (i, len(ad.pages)))
            check(all(p < g.n_pages for p in ad.pages), "page out of range")
            check(not (set(ad.pages) & seen), "a page shared by two documents")
            seen |= set(ad.pages)
            check(r.docs[i].present and r.docs[i].tier == cache_pb2.TIER_HOT, "status %d" % i)
        check(read_in_place(a, r.attached, [b for _, b, _ in docs]) == 0,
              "in-place read differs from what was put")
        ls = stats(admin, "leases")
        check(ls["live"] == 1 and ls["docs_pinned"] == 4, "stats %s" % ls)
        check(ls["bytes_pinned"] == (3 + 1 + 1 + 3) * ITEST_PAGE, "bytes_pinned %s" % ls)
        # A document attached twice in one call is pinned once.
        r2 = attach(cache, [key_ref(docs[1][2]), key_ref(docs[1][2])])
        check(r2.lease_docs == 1 and list(r2.attached[0].pages) == list(r2.attached[1].pages),
              "duplicate in one attach")
        check(stats(admin, "leases")["docs_pinned"] == 5, "duplicate pinned twice")
        H.expect_rpc_error(lambda: admin.Evict(admin_pb2.EvictRequest(key=docs[2][2])), PRECOND,
                           what="Evict of an attached doc")
        lk = cache.Lookup(cache_pb2.LookupRequest(docs=[key_ref(docs[2][2])]))
        check(lk.docs[0].tier == cache_pb2.TIER_HOT, "pinned doc left the hot tier")
        # A cold document is promoted by Attach.
        cache.Release(cache_pb2.ReleaseRequest(lease_id=r.lease_id))
        cache.Release(cache_pb2.ReleaseRequest(lease_id=r2.lease_id))
        cold = put(cache, 200, 20)
        evict(admin, cold[2])
        lk = cache.Lookup(cache_pb2.LookupRequest(docs=[key_ref(cold[2])]))
        check(lk.docs[0].tier == cache_pb2.TIER_COLD, "evict did not demote")
        r3 = attach(cache, [key_ref(cold[2])])
        check(read_in_place(r3.arena, r3.attached, [cold[1]]) == 0, "promoted doc differs")


def test_pinned_never_evicted():
    """With 8 pages: attached documents stay hot and intact while puts churn through the rest;
    once every page is pinned, a put is RESOURCE_EXHAUSTED and evict/delete are refused.
    hot_admission=always: the churn is puts of new documents, which must go hot (evicting)."""
    with daemon(hot_pages=8, more=["--set", "hot_admission=always"]) as d:
        cache, admin = stubs(d)
        a = put(cache, 1, 32)  # 2 pages
        r = attach(cache, [key_ref(a[2])])
        for i in range(20):    # 20 x 3 pages through the 6 free pages
            put(cache, 1000 + i, 40)
        lk = cache.Lookup(cache_pb2.LookupRequest(docs=[key_ref(a[2])]))
        check(lk.docs[0].present and lk.docs[0].tier == cache_pb2.TIER_HOT, "pinned doc evicted")
        check(read_in_place(r.arena, r.attached, [a[1]]) == 0, "pinned doc's pages changed")
        mv = stats(admin, "movement")
        check(mv["evictions_hot"] > 0, "no eviction happened: the test made no pressure")
        H.expect_rpc_error(lambda: admin.Evict(admin_pb2.EvictRequest(key=a[2])), PRECOND,
                           what="Evict of a pinned doc")
        H.expect_rpc_error(lambda: cache.Delete(cache_pb2.DeleteRequest(doc=key_ref(a[2]))),
                           PRECOND, ["pinned"], what="Delete of a pinned doc")
        # Pin the remaining 6 pages.
        b = put(cache, 2, 48)  # 3 pages
        c = put(cache, 3, 48)  # 3 pages
        attach(cache, [key_ref(b[2]), key_ref(c[2])], lease_id=r.lease_id)
        before = snapshot(admin)
        H.expect_rpc_error(lambda: put(cache, 4, 16), EXHAUSTED, what="Put with every page pinned")
        check(snapshot(admin) == before, "refused put changed the pins")
        cache.Release(cache_pb2.ReleaseRequest(lease_id=r.lease_id))
        put(cache, 4, 16)  # room again


def test_cannot_make_hot():
    """A cold document that cannot be made hot (the arena is pinned full): RESOURCE_EXHAUSTED,
    all-or-nothing (the hot document of the same call stays unpinned)."""
    with daemon(hot_pages=4) as d:
        cache, admin = stubs(d)
        cold = put(cache, 50, 32)
        evict(admin, cold[2])
        x = put(cache, 51, 32)
        y = put(cache, 52, 32)
        r = attach(cache, [key_ref(x[2]), key_ref(y[2])])  # all 4 pages pinned
        before = snapshot(admin)
        H.expect_rpc_error(lambda: attach(cache, [key_ref(x[2]), key_ref(cold[2])]), EXHAUSTED,
                           ["docs[1]", "hot"], what="Attach of a cold doc with no room")
        check(snapshot(admin) == before, "refused attach changed the pins")
        cache.Release(cache_pb2.ReleaseRequest(lease_id=r.lease_id))
        r = attach(cache, [key_ref(cold[2])])
        check(read_in_place(r.arena, r.attached, [cold[1]]) == 0, "promoted doc differs")


def test_renew_and_release():
    """Renewal refreshes the TTL and adds documents; Release unpins; a released id is gone."""
    with daemon() as d:
        cache, admin = stubs(d)
        docs = [put(cache, 300 + i, 20) for i in range(3)]
        r = attach(cache, [key_ref(docs[0][2])], ttl_ms=800)
        lid = r.lease_id
        t_end = time.monotonic() + 2.0  # 2.5 TTLs
        i = 0
        while time.monotonic() < t_end:
            time.sleep(0.25)
            rr = attach(cache, [key_ref(docs[i % 3][2])], ttl_ms=800, lease_id=lid)
            check(rr.lease_id == lid, "renewal changed the lease id")
            i += 1
        check(rr.lease_docs == 3, "lease holds %d docs, want 3" % rr.lease_docs)
        # Renewal with no documents only refreshes the TTL.
        rr = attach(cache, [], ttl_ms=800, lease_id=lid)
        check(rr.lease_docs == 3 and len(rr.attached) == 0, "empty renewal")
        ls = stats(admin, "leases")
        check(ls["live"] == 1 and ls["docs_pinned"] == 3 and ls["renewals"] >= 5, "stats %s" % ls)
        rel = cache.Release(cache_pb2.ReleaseRequest(lease_id=lid))
        check(rel.released_docs == 3, "released %d" % rel.released_docs)
        ls = stats(admin, "leases")
        check(ls["live"] == 0 and ls["docs_pinned"] == 0 and ls["bytes_pinned"] == 0,
              "after release %s" % ls)
        check(stats(admin, "hot")["bytes_pinned"] == 0, "hot pins left after release")
        H.expect_rpc_error(lambda: cache.Release(cache_pb2.ReleaseRequest(lease_id=lid)),
                           NOT_FOUND, what="Release twice")
        H.expect_rpc_error(lambda: attach(cache, [key_ref(docs[0][2])], lease_id=lid), NOT_FOUND,
                           what="renew a released lease")
        for _, _, k in docs:  # unpinned: evictable, deletable
            evict(admin, k)
        cache.Delete(cache_pb2.DeleteRequest(doc=key_ref(docs[0][2])))


HOLDER = r"""
import sys, time
sys.path[:0] = [sys.argv[1]]
import grpc
from lazykv.v1 import cache_pb2, cache_pb2_grpc
ch = grpc.insecure_channel(sys.argv[2])
c = cache_pb2_grpc.CacheStub(ch)
r = c.Attach(cache_pb2.AttachRequest(docs=[cache_pb2.DocRef(key=bytes.fromhex(sys.argv[3]))],
                                     ttl_ms=int(sys.argv[4])), timeout=10)
print(r.lease_id.hex(), flush=True)
time.sleep(3600)
"""


def test_expiry_and_killed_holder():
    """A lease expires by itself; a worker killed with SIGKILL while holding one pins nothing
    after the TTL (its documents can then be evicted)."""
    with daemon() as d:
        cache, admin = stubs(d)
        a = put(cache, 400, 32)
        r = attach(cache, [key_ref(a[2])], ttl_ms=300)
        time.sleep(1.0)
        H.expect_rpc_error(lambda: cache.Release(cache_pb2.ReleaseRequest(lease_id=r.lease_id)),
                           NOT_FOUND, what="Release of an expired lease")
        ls = stats(admin, "leases")
        check(ls["live"] == 0 and ls["expired"] == 1, "after expiry %s" % ls)

        b = put(cache, 401, 32)
        p = subprocess.Popen([sys.executable, "-c", HOLDER, os.environ["LKV_PROTO_PY"], d.addr,
                              b[2].hex(), "1500"], stdout=subprocess.PIPE)
        line = p.stdout.readline().decode().strip()
        check(len(line) == 32, "holder printed %r" % line)
        p.send_signal(signal.SIGKILL)
        p.wait()
        t_killed = time.monotonic()
        ls = stats(admin, "leases")
        check(ls["live"] == 1 and ls["docs_pinned"] == 1, "holder's lease not live: %s" % ls)
        H.expect_rpc_error(lambda: admin.Evict(admin_pb2.EvictRequest(key=b[2])), PRECOND,
                           what="Evict while the dead holder's lease lives")
        deadline = t_killed + H.timeout(5)
        while time.monotonic() < deadline and stats(admin, "leases")["live"] != 0:
            time.sleep(0.1)
        ls = stats(admin, "leases")
        check(ls["live"] == 0 and ls["docs_pinned"] == 0 and ls["expired"] == 2,
              "dead holder's lease still pins: %s" % ls)
        check(stats(admin, "hot")["bytes_pinned"] == 0, "hot pins left after expiry")
        evict(admin, b[2])
        H.expect_rpc_error(lambda: attach(cache, [], lease_id=bytes.fromhex(line)), NOT_FOUND,
                           what="renew the dead holder's lease")


TOKENS = {"alice": "lkv_alice_token_for_tests_only_0001",
          "bob": "lkv_bob_token_for_tests_only_00002",
          "reader": "lkv_reader_token_for_tests_only_003",
          "ops": "lkv_ops_token_for_tests_only_000004"}
ROLES = {"alice": "data,worker", "bob": "data,worker", "reader": "data", "ops": "data,admin"}


def tenant_args():
    out = []
    for name, tok in TOKENS.items():
        h = hashlib.blake2b(b"lazykv-token-v1:" + tok.encode(), digest_size=32).hexdigest()
        out += ["--set", "tenant.%s.token_hash=blake2b:%s" % (name, h),
                "--set", "tenant.%s.roles=%s" % (name, ROLES[name])]
    return out


def md(name):
    return [("authorization", "Bearer " + TOKENS[name])]


def test_bad_input():
    """Every bad Attach/Release gets the right status and changes nothing."""
    with daemon(more=["--set", "max_lease_docs=4", "--set", "max_leases=2",
                      "--set", "max_lease_ttl=20s"] + tenant_args()) as d:
        cache, admin = stubs(d)
        docs = [put(cache, 500 + i, 20) for i in range(5)]
        keys = [k for _, _, k in docs]
        live = attach(cache, [key_ref(keys[0])])
        before = snapshot(admin)
        ch = d.channel()
        raw_attach = ch.unary_unary("/lazykv.v1.Cache/Attach")
        raw_release = ch.unary_unary("/lazykv.v1.Cache/Release")
        cases = [
            ("malformed Attach", lambda: raw_attach(b"\xff\xff\xff", timeout=5), INVALID, []),
            ("malformed Release", lambda: raw_release(b"\x0a\x05ab", timeout=5), INVALID, []),
            ("ttl 0", lambda: attach(cache, [key_ref(keys[1])], ttl_ms=0), INVALID, ["ttl"]),
            ("ttl too big", lambda: attach(cache, [key_ref(keys[1])], ttl_ms=20001), INVALID,
             ["max_lease_ttl"]),
            ("no docs", lambda: attach(cache, []), INVALID, ["docs"]),
            ("too many docs", lambda: attach(cache, [key_ref(k) for k in keys]), INVALID,
             ["max_lease_docs"]),
            ("renewal over max docs", lambda: attach(cache, [key_ref(k) for k in keys[1:]],
                                                     lease_id=live.lease_id), INVALID,
             ["max_lease_docs"]),
            ("short key", lambda: attach(cache, [cache_pb2.DocRef(key=b"abc")]), INVALID,
             ["32"]),
            ("both key and tokens", lambda: attach(cache, [cache_pb2.DocRef(
                key=keys[1], tokens=cache_pb2.TokenDoc(profile="itest", token_ids=[1]))]),
             INVALID, ["exactly one"]),
            ("unknown profile", lambda: attach(cache, [cache_pb2.DocRef(
                tokens=cache_pb2.TokenDoc(profile="nope", token_ids=[1]))]), INVALID,
             ["unknown profile"]),
            ("token >= vocab", lambda: attach(cache, [cache_pb2.DocRef(
                tokens=cache_pb2.TokenDoc(profile="itest", token_ids=[5000]))]), INVALID,
             ["vocab"]),
            ("unknown doc among known ones", lambda: attach(cache, [
                key_ref(keys[1]), key_ref(keys[2]), key_ref(b"\x01" * 32)]), NOT_FOUND,
             ["docs[2]", "nothing was pinned"]),
            ("unknown doc in a renewal", lambda: attach(cache, [
                key_ref(keys[1]), key_ref(b"\x01" * 32)], lease_id=live.lease_id), NOT_FOUND,
             ["docs[1]"]),
            ("unknown lease id", lambda: attach(cache, [key_ref(keys[1])],
                                                lease_id=b"\x07" * 16), NOT_FOUND, ["lease"]),
            ("lease id of 5 bytes", lambda: attach(cache, [key_ref(keys[1])],
                                                   lease_id=b"12345"), INVALID, ["16"]),
            ("Release of an unknown lease", lambda: cache.Release(
                cache_pb2.ReleaseRequest(lease_id=b"\x07" * 16)), NOT_FOUND, ["lease"]),
            ("Release without an id", lambda: cache.Release(cache_pb2.ReleaseRequest()),
             INVALID, ["16"]),
            ("Release of a 17-byte id", lambda: cache.Release(
                cache_pb2.ReleaseRequest(lease_id=b"\x07" * 17)), INVALID, ["16"]),
            ("wrong role (data only)", lambda: attach(cache, [H.token_ref(S, docs[1][0])],
                                                      md=md("reader")), DENIED, []),
            ("wrong role Release", lambda: cache.Release(cache_pb2.ReleaseRequest(
                lease_id=live.lease_id), metadata=md("reader")), DENIED, []),
            ("wrong credentials", lambda: attach(cache, [key_ref(keys[1])],
                                                 md=[("authorization", "Bearer lkv_wrong")]),
             UNAUTH, []),
            ("wrong credentials Release", lambda: cache.Release(cache_pb2.ReleaseRequest(
                lease_id=live.lease_id), metadata=[("authorization", "Bearer nope")]), UNAUTH, []),
            ("another tenant's lease", lambda: attach(cache, [], lease_id=live.lease_id,
                                                      md=md("alice")), NOT_FOUND, ["lease"]),
            ("another tenant's Release", lambda: cache.Release(cache_pb2.ReleaseRequest(
                lease_id=live.lease_id), metadata=md("alice")), NOT_FOUND, ["lease"]),
        ]
        for what, fn, code, words in cases:
            H.expect_rpc_error(fn, code, words, what=what)
            after = snapshot(admin)
            if after != before:
                soft_fail("%s changed state: %s -> %s" % (what, before, after))
        # max_leases = 2: one live, a second is fine, a third is RESOURCE_EXHAUSTED.
        second = attach(cache, [key_ref(keys[1])])
        before = snapshot(admin)
        H.expect_rpc_error(lambda: attach(cache, [key_ref(keys[2])]), EXHAUSTED, ["max_leases"],
                           what="third lease")
        check(snapshot(admin) == before, "refused third lease changed state")
        cache.Release(cache_pb2.ReleaseRequest(lease_id=second.lease_id))
        # The live lease survived every refusal, intact.
        rr = attach(cache, [], lease_id=live.lease_id)
        check(rr.lease_docs == 1, "live lease changed: %d docs" % rr.lease_docs)


def test_tenant_isolation():
    """Tenant B can neither see nor probe tenant A's documents: by tokens or by key (A's key,
    or the store key an admin sees), Lookup says absent and Get/Delete/Attach say NOT_FOUND;
    A's counters are not B's."""
    with daemon(more=tenant_args()) as d:
        cache, admin = stubs(d)
        ops_before = stats(admin, "lookups", md("ops"))
        toks, blocks, ka = put(cache, 600, 40, md=md("alice"))
        lst = admin.List(admin_pb2.ListRequest(), timeout=H.timeout(10))
        check(len(lst.docs) == 1, "list has %d docs" % len(lst.docs))
        ks = lst.docs[0].key  # the store key (admin view)
        check(ks != ka, "with tenants, wire keys must differ from store keys")
        # Alice sees it, by tokens and by her key.
        lk = cache.Lookup(cache_pb2.LookupRequest(docs=[H.token_ref(S, toks), key_ref(ka)]),
                          metadata=md("alice"))
        check(all(x.present for x in lk.docs) and lk.docs[0].key == ka, "alice cannot see hers")
        got = []
        for m in cache.Get(cache_pb2.GetRequest(doc=key_ref(ka)), metadata=md("alice")):
            got += [b.data for b in m.blocks]
        check(got == blocks, "alice's Get differs")
        # Bob: absent by tokens, by alice's key, by the store key.
        for who in ("bob", None):
            m = md(who) if who else None
            lk = cache.Lookup(cache_pb2.LookupRequest(docs=[
                H.token_ref(S, toks), key_ref(ka), key_ref(ks)]), metadata=m)
            check(not any(x.present for x in lk.docs), "%s sees alice's doc: %s" % (who, lk))
            check(lk.docs[1].key == ka and lk.docs[2].key == ks, "keys echoed")
            for k in (ka, ks):
                H.expect_rpc_error(lambda: list(cache.Get(cache_pb2.GetRequest(doc=key_ref(k)),
                                                          metadata=m)),
                                   NOT_FOUND, what="%s Get" % who)
                H.expect_rpc_error(lambda: cache.Delete(cache_pb2.DeleteRequest(doc=key_ref(k)),
                                                        metadata=m),
                                   NOT_FOUND, what="%s Delete" % who)
                H.expect_rpc_error(lambda: attach(cache, [key_ref(k)], md=m), NOT_FOUND,
                                   what="%s Attach by key" % who)
            H.expect_rpc_error(lambda: attach(cache, [H.token_ref(S, toks)], md=m), NOT_FOUND,
                               what="%s Attach by tokens" % who)
            H.expect_rpc_error(lambda: list(cache.Get(cache_pb2.GetRequest(
                doc=H.token_ref(S, toks)), metadata=m)), NOT_FOUND, what="%s Get tokens" % who)
        # Still there for alice; attach works for her.
        r = attach(cache, [key_ref(ka)], md=md("alice"))
        check(r.attached[0].key == ka, "alice's attach key")
        check(read_in_place(r.arena, r.attached, [blocks]) == 0, "alice's in-place read")
        # Bob putting the same tokens makes his own document.
        _, _, kb = put(cache, 600, 40, md=md("bob"))
        check(kb != ka, "bob got alice's key")
        # Per-tenant counters: bob's misses are his, alice's hits are hers.
        t = stats(admin, "tenants")
        check(t["alice.hits"] == 2 and t["alice.misses"] == 0, "alice counters %s" % t)
        check(t["bob.hits"] == 0 and t["bob.misses"] == 3, "bob counters %s" % t)
        check(t["default.misses"] == 3, "default counters %s" % t)
        # A tenant with the admin role sees only its own lookup counters, and no "tenants".
        check(stats(admin, "lookups", md("ops")) == ops_before, "ops sees other tenants' counts")
        check(stats(admin, "tenants", md("ops")) == {}, "ops sees the tenants section")
        cache.Lookup(cache_pb2.LookupRequest(docs=[H.token_ref(S, toks)]), metadata=md("ops"))
        mine = stats(admin, "lookups", md("ops"))
        check(mine["misses"] == 1 and mine["misses_never"] == 1 and mine["miss_blocks"] == 3,
              "ops's own counters %s" % mine)
        # A data-only tenant cannot read anyone's counters.
        H.expect_rpc_error(lambda: admin.Stats(admin_pb2.StatsRequest(), metadata=md("reader")),
                           DENIED, what="Stats by a data tenant")
        # Keys stay valid across a restart (the wire-key secret persists).
        d.stop()
        d.start()
        cache, admin = stubs(d)
        lk = cache.Lookup(cache_pb2.LookupRequest(docs=[key_ref(ka)]), metadata=md("alice"))
        check(lk.docs[0].present, "alice's key is not valid after a restart")


def test_single_tenant_keys_unchanged():
    """Without tenants, wire keys are store keys (List keys work with Get)."""
    with daemon() as d:
        cache, admin = stubs(d)
        _, _, k = put(cache, 700, 20)
        lst = admin.List(admin_pb2.ListRequest(), timeout=H.timeout(10))
        check([x.key for x in lst.docs] == [k], "list keys differ from put keys")


ALL = [test_attach_maps_arena, test_pinned_never_evicted, test_cannot_make_hot,
       test_renew_and_release, test_expiry_and_killed_holder, test_bad_input,
       test_tenant_isolation, test_single_tenant_keys_unchanged]

if __name__ == "__main__":
    if not SHM_READER or not os.path.exists(SHM_READER):
        sys.stderr.write("LKV_SHM_READER is not set to the shm_reader program\n")
        sys.exit(2)
    only = [x for x in os.environ.get("LKV_LEASE_TESTS", "").split(",") if x]
    try:
        H.run_tests([t for t in ALL if not only or t.__name__ in only])
    finally:
        os.unlink(_CONF.name)
