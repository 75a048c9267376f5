"""test_py_badinput.py: integration.py_badinput. Bad input sent with Python grpcio, including
what the C client cannot send: raw garbage bytes in place of protobuf messages (grpcio's generic
API with no serializer), a first Put message without a header, a header sent twice, an empty
Put stream, DocRefs with a short key or with both or neither of key and tokens, an empty Lookup,
an unknown method; plus wrong block sizes and counts, out-of-order and duplicate indices, token
ids out of vocabulary, an unknown profile, unknown documents, a message over the daemon's max,
the hot budget exhausted, and a Put cancelled mid-stream.

Every case checks the gRPC status code (and for many the exact code in the lkv-code trailing
metadata, absent on gRPC core's own refusals), that the message names the problem, and that nothing
changed: the document stays absent and the hot/cold document and block counts in Stats are as
before. The daemon runs with max_message_bytes=5MiB and hot_bytes=16MiB (8 pages of 2 MiB).
"""
import sys
import threading
import time

import harness as h  # first: it exits 77 (skip) without grpc

import grpc  # noqa: E402
from harness import admin_pb2, admin_pb2_grpc, cache_pb2, cache_pb2_grpc

D = None
CH = None
INV = grpc.StatusCode.INVALID_ARGUMENT
GARBAGE = [b"\xff\xff\xff\xff\xff", b"\x0a\x05ab", b"\x12\x80"]


def stub():
    return cache_pb2_grpc.CacheStub(CH)


def counts():
    """Document/block counts of the storage tiers, from Stats."""
    a = admin_pb2_grpc.AdminStub(CH)
    r = a.Stats(admin_pb2.StatsRequest(), timeout=h.timeout(20))
    out = {}
    for e in r.entries:
        if e.section.lower() in ("hot", "cold") and e.key in ("docs", "blocks", "bytes_used"):
            out[(e.section, e.key)] = e.value
    h.check(out, "Stats has no hot/cold docs entries: %s" % r.info)
    return out


def absent(shape, toks):
    lr = stub().Lookup(cache_pb2.LookupRequest(docs=[h.token_ref(shape, toks)]),
                       timeout=h.timeout(20))
    h.check(not lr.docs[0].present, "refused document is present")


def unchanged(before):
    after = counts()
    h.check(after == before, "Stats changed: %s -> %s" % (before, after))


def test_garbage():
    before = counts()
    raw_unary = {m: CH.unary_unary(m) for m in ("/lazykv.v1.Cache/Lookup",
                                                "/lazykv.v1.Cache/Delete",
                                                "/lazykv.v1.Admin/Stats")}
    for m, call in raw_unary.items():
        for g in GARBAGE:
            h.expect_rpc_error(lambda: call(g, timeout=h.timeout(20)), INV,
                               what="garbage %r to %s" % (g, m), lkv_code="LKV_EPROTO")
    get = CH.unary_stream("/lazykv.v1.Cache/Get")
    for g in GARBAGE:
        h.expect_rpc_error(lambda: list(get(g, timeout=h.timeout(20))), INV,
                           what="garbage %r to Get" % g, lkv_code="LKV_EPROTO")
    put = CH.stream_unary("/lazykv.v1.Cache/Put")
    for g in GARBAGE:
        h.expect_rpc_error(lambda: put(iter([g]), timeout=h.timeout(20)), INV,
                           what="garbage %r as first Put message" % g)
    # A valid header, then garbage: the partial document must not appear.
    toks, blocks = h.make_doc(h.ITEST, 11, 37)
    first = h.put_requests(h.ITEST, toks, blocks)[0].SerializeToString()
    for g in GARBAGE:
        h.expect_rpc_error(lambda: put(iter([first, g]), timeout=h.timeout(20)), INV,
                           what="garbage %r as second Put message" % g)
    absent(h.ITEST, toks)
    unchanged(before)


def test_messages():
    s = stub()
    before = counts()
    toks, blocks = h.make_doc(h.ITEST, 12, 37)
    reqs = h.put_requests(h.ITEST, toks, blocks)
    no_hdr = cache_pb2.PutRequest(blocks=reqs[0].blocks)
    h.expect_rpc_error(lambda: s.Put(iter([no_hdr] + reqs[1:]), timeout=h.timeout(20)), INV,
                       ["header"], "first Put message without header")
    twice = cache_pb2.PutRequest(header=reqs[0].header, blocks=reqs[1].blocks)
    h.expect_rpc_error(lambda: s.Put(iter([reqs[0], twice, reqs[2]]), timeout=h.timeout(20)),
                       INV, ["header"], "header sent twice")
    h.expect_rpc_error(lambda: s.Put(iter([]), timeout=h.timeout(20)), INV, ["header"],
                       "empty Put stream")
    short = cache_pb2.DocRef(key=b"abc")
    both = cache_pb2.DocRef(key=b"k" * 32, tokens=cache_pb2.TokenDoc(profile="itest",
                                                                       token_ids=toks))
    neither = cache_pb2.DocRef()
    for ref, what, words in ((short, "3-byte key", ["32"]), (both, "key and tokens", []),
                             (neither, "empty DocRef", [])):
        h.expect_rpc_error(lambda: s.Lookup(cache_pb2.LookupRequest(docs=[ref]),
                                            timeout=h.timeout(20)), INV, words,
                           "Lookup with " + what)
        h.expect_rpc_error(lambda: h.get_doc(s, ref), INV, words, "Get with " + what)
        h.expect_rpc_error(lambda: s.Delete(cache_pb2.DeleteRequest(doc=ref),
                                            timeout=h.timeout(20)), INV, words,
                           "Delete with " + what)
    h.expect_rpc_error(lambda: s.Lookup(cache_pb2.LookupRequest(), timeout=h.timeout(20)), INV,
                       [], "Lookup of no documents")
    h.expect_rpc_error(lambda: next(s.Get(cache_pb2.GetRequest(), timeout=h.timeout(20))),
                       INV, [], "Get without a document")
    nope = CH.unary_unary("/lazykv.v1.Cache/NoSuchMethod")
    h.expect_rpc_error(lambda: nope(b"", timeout=h.timeout(20)), grpc.StatusCode.UNIMPLEMENTED,
                       [], "unknown method", lkv_code="LKV_ENOTSUP")
    absent(h.ITEST, toks)
    unchanged(before)


def test_blocks():
    s = stub()
    before = counts()
    toks, blocks = h.make_doc(h.ITEST, 13, 37)
    hdr = cache_pb2.PutHeader(profile="itest", token_ids=toks)

    def put(seq, size_override=None, hdr_blocks=0):
        msgs = []
        for n, i in enumerate(seq):
            data = blocks[i % 3]
            if size_override and n in size_override:
                data = (data * 2)[:size_override[n]]
            m = cache_pb2.PutRequest(blocks=[cache_pb2.Block(index=i, data=data)])
            msgs.append(m)
        hh = cache_pb2.PutHeader()
        hh.CopyFrom(hdr)
        hh.n_blocks = hdr_blocks
        if msgs:
            msgs[0].header.CopyFrom(hh)
        else:
            msgs = [cache_pb2.PutRequest(header=hh)]
        return lambda: s.Put(iter(msgs), timeout=h.timeout(20))

    bb = str(h.ITEST.block_bytes)
    h.expect_rpc_error(put([0, 1, 2], {1: 2047}), INV, [bb, "2047"], "block of 2047 bytes")
    h.expect_rpc_error(put([0, 1, 2], {2: 4096}), INV, [bb, "4096"], "block of 4096 bytes")
    h.expect_rpc_error(put([0, 1]), INV, ["2 of 3"], "missing last block", lkv_code="LKV_EINVAL")
    h.expect_rpc_error(put([]), INV, ["0 of 3"], "no blocks")
    h.expect_rpc_error(put([0, 1, 2, 3]), INV, ["index"], "extra block")
    h.expect_rpc_error(put([0, 2, 1]), INV, ["index"], "out of order")
    h.expect_rpc_error(put([0, 0, 1, 2]), INV, ["index"], "duplicate index")
    h.expect_rpc_error(put([0, 1, 2], hdr_blocks=4), INV, ["4", "3"], "header n_blocks 4")
    absent(h.ITEST, toks)

    bad = list(toks)
    bad[5] = 1000
    h.expect_rpc_error(lambda: s.Put(iter(h.put_requests(h.ITEST, bad, blocks)),
                                     timeout=h.timeout(20)), INV, ["1000", "vocab"],
                       "token id out of vocabulary")
    absent(h.ITEST, toks)
    other = h.Shape("no-such-model", 2, 2, 8, 2, 16, 1000)
    h.expect_rpc_error(lambda: s.Put(iter(h.put_requests(other, toks, blocks)),
                                     timeout=h.timeout(20)), INV, ["no-such-model", "itest"],
                       "unknown profile", lkv_code="LKV_EPROFILE")
    h.expect_rpc_error(lambda: s.Lookup(cache_pb2.LookupRequest(docs=[h.token_ref(other, toks)]),
                                        timeout=h.timeout(20)), INV, ["no-such-model"],
                       "Lookup with unknown profile", lkv_code="LKV_EPROFILE")
    unchanged(before)


def test_not_found():
    s = stub()
    before = counts()
    toks, _ = h.make_doc(h.ITEST, 14, 30)
    for ref in (h.token_ref(h.ITEST, toks), cache_pb2.DocRef(key=b"\x07" * 32)):
        h.expect_rpc_error(lambda: h.get_doc(s, ref), grpc.StatusCode.NOT_FOUND, [],
                           "Get of an unknown document", lkv_code="LKV_ENOTFOUND")
        h.expect_rpc_error(lambda: s.Delete(cache_pb2.DeleteRequest(doc=ref),
                                            timeout=h.timeout(20)),
                           grpc.StatusCode.NOT_FOUND, [], "Delete of an unknown document")
    unchanged(before)


def test_oversize_and_budget():
    s = stub()
    before = counts()
    toks, blocks = h.make_doc(h.LLAMA, 15, 40)
    h.expect_rpc_error(lambda: s.Put(iter(h.put_requests(h.LLAMA, toks, blocks, per_msg=3)),
                                     timeout=h.timeout(30)),
                       grpc.StatusCode.RESOURCE_EXHAUSTED, ["larger than max"],
                       "6 MiB message, daemon max 5 MiB", lkv_code=None)  # gRPC core's own.
    absent(h.LLAMA, toks)
    unchanged(before)
    toks, blocks = h.make_doc(h.ITEST, 16, 9 * 16)
    h.expect_rpc_error(lambda: s.Put(iter(h.put_requests(h.ITEST, toks, blocks)),
                                     timeout=h.timeout(20)),
                       grpc.StatusCode.RESOURCE_EXHAUSTED, ["hot", "18"],
                       "9-page document (18 MiB of 2 MiB pages), 8-page hot tier",
                       lkv_code="LKV_ENOSPC")
    absent(h.ITEST, toks)
    unchanged(before)


def test_cancel_mid_stream():
    s = stub()
    before = counts()
    toks, blocks = h.make_doc(h.ITEST, 17, 37)
    reqs = h.put_requests(h.ITEST, toks, blocks)
    sent_two = threading.Event()
    release = threading.Event()

    def gen():
        yield reqs[0]
        yield reqs[1]
        sent_two.set()
        release.wait(h.timeout(20))
        yield reqs[2]

    fut = s.Put.future(gen(), timeout=h.timeout(20))
    h.check(sent_two.wait(h.timeout(10)), "generator stalled")
    time.sleep(0.3)
    fut.cancel()
    release.set()
    try:
        fut.result()
        raise AssertionError("cancelled Put succeeded")
    except grpc.FutureCancelledError:
        pass
    for _ in range(5):
        absent(h.ITEST, toks)
        time.sleep(0.1)
    unchanged(before)
    r = s.Put(iter(reqs), timeout=h.timeout(20))
    h.check(not r.already_present, "cancelled document was stored")
    s.Delete(cache_pb2.DeleteRequest(doc=cache_pb2.DocRef(key=r.key)), timeout=h.timeout(20))


def main():
    global D, CH
    with h.Daemon(h.ITEST_ARGS + ["--set", "hot_bytes=16MiB",
                                  "--set", "max_message_bytes=5MiB"]) as d:
        D = d
        d.start()
        CH = d.channel()
        sys.stderr.write("lazykvd at %s (%s)\n" % (d.addr, d.dir))
        h.run_tests([test_garbage, test_messages, test_blocks, test_not_found,
                     test_oversize_and_budget, test_cancel_mid_stream])
        h.check(d.stop() == 0, "lazykvd did not exit 0")


if __name__ == "__main__":
    main()
