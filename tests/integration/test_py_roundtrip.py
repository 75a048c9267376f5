"""test_py_roundtrip.py: integration.py_roundtrip. The real lazykvd driven by Python grpcio and
the generated stubs: health check, streaming put of multi-block documents (partial last
block), lookup of many, get back byte-identical (by key and by tokens), delete, Stats, and a
6 MiB Put message (three 2 MiB llama-3.1-8b blocks in one message) read back intact.
"""
import sys

import harness as h  # first: it exits 77 (skip) without grpc

import grpc  # noqa: E402
from harness import cache_pb2, cache_pb2_grpc, admin_pb2, admin_pb2_grpc, health_pb2

D = None


def stub():
    return cache_pb2_grpc.CacheStub(D.channel())


def test_health():
    ch = D.channel()
    check = ch.unary_unary("/grpc.health.v1.Health/Check",
                           request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                           response_deserializer=health_pb2.HealthCheckResponse.FromString)
    r = check(health_pb2.HealthCheckRequest(service=""), timeout=h.timeout(10))
    h.check(r.status == health_pb2.HealthCheckResponse.SERVING, "not SERVING: %s" % r)
    r = check(health_pb2.HealthCheckRequest(service="lazykv.v1.Cache"), timeout=h.timeout(10))
    h.check(r.status == health_pb2.HealthCheckResponse.SERVING, "Cache not SERVING")
    h.expect_rpc_error(lambda: check(health_pb2.HealthCheckRequest(service="no.such.Service"),
                                     timeout=h.timeout(10)),
                       grpc.StatusCode.NOT_FOUND, what="health of an unknown service")


def test_roundtrip():
    s = stub()
    lens = [1, 15, 16, 17, 37, 100]
    docs = [h.make_doc(h.ITEST, 200 + i, n) for i, n in enumerate(lens)]
    keys = []
    for i, (toks, blocks) in enumerate(docs):
        r = s.Put(iter(h.put_requests(h.ITEST, toks, blocks, per_msg=1 + i % 3,
                                      n_blocks_hdr=len(blocks) if i % 2 else 0)),
                  timeout=h.timeout(20))
        h.check(len(r.key) == 32 and r.n_tokens == len(toks) and r.n_blocks == len(blocks))
        h.check(not r.already_present)
        h.check(r.durability == cache_pb2.DURABILITY_HOT)
        keys.append(r.key)
    h.check(len(set(keys)) == len(keys), "keys not distinct")
    r = s.Put(iter(h.put_requests(h.ITEST, *docs[3])), timeout=h.timeout(20))
    h.check(r.already_present and r.key == keys[3], "second put not already_present")

    absent_toks, _ = h.make_doc(h.ITEST, 999, 20)
    refs = [cache_pb2.DocRef(key=k) if i % 2 else h.token_ref(h.ITEST, docs[i][0])
            for i, k in enumerate(keys)]
    refs += [h.token_ref(h.ITEST, absent_toks), cache_pb2.DocRef(key=b"\x01" * 32)]
    lr = s.Lookup(cache_pb2.LookupRequest(docs=refs), timeout=h.timeout(20))
    h.check(len(lr.docs) == len(refs))
    for i, st in enumerate(lr.docs[:len(docs)]):
        h.check(st.present and st.tier == cache_pb2.TIER_HOT and st.key == keys[i])
        h.check(st.n_tokens == len(docs[i][0]) and st.n_blocks == len(docs[i][1]))
        h.check(st.profile == "itest" and st.miss_cause == cache_pb2.MISS_CAUSE_NONE)
    for st in lr.docs[len(docs):]:
        h.check(not st.present and st.tier == cache_pb2.TIER_ABSENT, "absent doc present")
        h.check(st.miss_cause == cache_pb2.MISS_CAUSE_UNKNOWN, "miss cause %d" % st.miss_cause)

    for i, (toks, blocks) in enumerate(docs):
        for ref in (cache_pb2.DocRef(key=keys[i]), h.token_ref(h.ITEST, toks)):
            hdr, got = h.get_doc(s, ref)
            h.check(hdr.key == keys[i] and hdr.profile == "itest")
            h.check(hdr.n_tokens == len(toks) and hdr.n_blocks == len(blocks))
            h.check(hdr.block_bytes == h.ITEST.block_bytes and hdr.block_tokens == 16)
            h.check(got == blocks, "doc %d: blocks differ" % i)

    dr = s.Delete(cache_pb2.DeleteRequest(doc=cache_pb2.DocRef(key=keys[0])),
                  timeout=h.timeout(20))
    h.check(dr.key == keys[0])
    s.Delete(cache_pb2.DeleteRequest(doc=h.token_ref(h.ITEST, docs[2][0])), timeout=h.timeout(20))
    lr = s.Lookup(cache_pb2.LookupRequest(docs=refs[:len(docs)]), timeout=h.timeout(20))
    for i, st in enumerate(lr.docs):
        gone = i in (0, 2)
        h.check(st.present != gone, "doc %d present=%s" % (i, st.present))
        if gone:
            h.check(st.miss_cause == cache_pb2.MISS_CAUSE_DELETED, "cause %d" % st.miss_cause)
    h.expect_rpc_error(lambda: h.get_doc(s, cache_pb2.DocRef(key=keys[0])),
                       grpc.StatusCode.NOT_FOUND, what="get deleted")


def test_big_message():
    s = stub()
    toks, blocks = h.make_doc(h.LLAMA, 7, 40)
    h.check(len(blocks) == 3 and len(blocks[0]) == 2 << 20)
    r = s.Put(iter(h.put_requests(h.LLAMA, toks, blocks, per_msg=3)), timeout=h.timeout(30))
    h.check(r.n_blocks == 3)
    hdr, got = h.get_doc(s, cache_pb2.DocRef(key=r.key), deadline=h.timeout(30))
    h.check(got == blocks, "llama blocks differ")
    s.Delete(cache_pb2.DeleteRequest(doc=cache_pb2.DocRef(key=r.key)), timeout=h.timeout(20))


def test_stats():
    a = admin_pb2_grpc.AdminStub(D.channel())
    r = a.Stats(admin_pb2.StatsRequest(), timeout=h.timeout(20))
    h.check("# " in r.info and len(r.entries) > 0, "empty stats")
    sections = {e.section for e in r.entries}
    h.check(len(sections) >= 2, "few sections: %s" % sections)


def main():
    global D
    with h.Daemon(h.ITEST_ARGS) as d:
        D = d
        d.start()
        sys.stderr.write("lazykvd at %s (%s)\n" % (d.addr, d.dir))
        h.run_tests([test_health, test_roundtrip, test_big_message, test_stats])
        rc = d.stop()
        h.check(rc == 0, "lazykvd exit status %s on SIGTERM" % rc)


if __name__ == "__main__":
    main()
