"""test_edge_decode.py: integration.edge_decode. Issue 12, item 1: hostile messages sent as raw
bytes (grpcio's generic API, no serializer) to the real lazykvd with its default two polling
threads, from three attacker threads, while the main thread keeps asking Health. (gRPC 1.51 reads
a message on the polling thread that serves it, so a thread receiving a 5 MB message is busy for
the transfer, linear in its size but tens of ms on a loaded machine; with ONE thread Health
waits behind those reads: p50 6-8 ms, p99 20-190 ms measured. What the fix removes is a thread
held for ~40 s by one 2.6 MB message, which with two attackers would stop Health altogether.) Every hostile call must be refused with the right status and
a message naming the problem, and Health must answer within the bound all along (p99 under 100
ms, the worst call under 250 ms; under sanitizers the CMake test sets LKV_HEALTH_BOUND_MS
higher; both scale with LKV_TEST_TIMEOUT_SCALE). The measured latencies are printed.

The messages:
  - issue 12's DeleteRequest: 2.6 MB, `doc` repeated 80,000 times: over Delete's own size bound
    (one document's worth), RESOURCE_EXHAUSTED before decoding;
  - the same attack within the bound (300 KB, 9,000 repeats): the wire scanner refuses it,
    INVALID_ARGUMENT "occurs more than once" (protobuf-c alone would merge them, quadratically);
  - a 1.4 MB LookupRequest whose one DocRef repeats `tokens` 100,000 times: INVALID_ARGUMENT;
  - a 5 MB LookupRequest: over max_request_bytes (4 MiB), RESOURCE_EXHAUSTED;
  - a PutRequest with its header twice; a profile "itest\\0x" (embedded NUL); invalid UTF-8.
Then, alone, valid but large: a Lookup of 60,000 documents by key is answered (linear), and one
of max_lookup_docs + 1 is refused with INVALID_ARGUMENT.
"""
import os
import sys
import threading
import time

import harness as h  # first: it exits 77 (skip) without grpc

import grpc  # noqa: E402
from harness import cache_pb2, health_pb2  # noqa: E402

# The bound, scaled like every timeout of the harness (LKV_TEST_TIMEOUT_SCALE: slow or shared
# machines). p99 must stay under it and the single worst call under 2.5x it: on the shared
# 2-core CI machine a parallel test can steal the CPU for a scheduler slice or two, which no
# daemon design prevents; what this test exists to catch (one hostile message holding the one
# polling thread, 40 s for issue 12's DeleteRequest under protobuf-c) blows both by orders of
# magnitude.
BOUND_MS = float(os.environ.get("LKV_HEALTH_BOUND_MS", "100")) * h.SCALE


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_len(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def token_doc(profile, ids):
    return field_len(1, profile) + field_len(2, b"".join(varint(i) for i in ids))


def docref_tokens(profile, ids):
    return field_len(2, token_doc(profile, ids))


def raw(ch, path):
    return ch.unary_unary(path, request_serializer=None, response_deserializer=None)


def expect(ch, path, body, code, words, what):
    try:
        raw(ch, path)(body, timeout=h.timeout(20))
    except grpc.RpcError as e:
        h.check(e.code() == code, "%s: got %s (%s), want %s" % (what, e.code(), e.details(), code))
        for w in words:
            h.check(w in (e.details() or ""), "%s: message %r lacks %r" % (what, e.details(), w))
        return e.details()
    raise AssertionError("%s: accepted" % what)


def main():
    with h.Daemon(h.ITEST_ARGS + ["--set", "threads=2"]) as d:
        d.start()
        ch = d.channel()
        health = ch.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                response_deserializer=health_pb2.HealthCheckResponse.FromString)
        health(health_pb2.HealthCheckRequest(), timeout=h.timeout(20))

        one = field_len(1, docref_tokens(b"stories260k", range(1, 15)))  # DeleteRequest.doc, 33 B
        big_delete = one * 80000
        small_delete = one * 9000
        h.check(len(big_delete) >= 2_600_000, "attack message is %d bytes" % len(big_delete))
        dup_tokens = field_len(1, field_len(2, token_doc(b"itest", [1, 2, 3])) * 100000)
        huge_lookup = field_len(1, field_len(1, b"k" * 32)) * ((5 << 20) // 36 + 1)
        dup_header = field_len(1, token_doc(b"itest", [1])) * 2
        nul_profile = field_len(1, docref_tokens(b"itest\0x", [1, 2]))
        bad_utf8 = field_len(1, docref_tokens(b"it\xc0\x80est", [1, 2]))
        RE = grpc.StatusCode.RESOURCE_EXHAUSTED
        INV = grpc.StatusCode.INVALID_ARGUMENT
        attacks = [
            ("/lazykv.v1.Cache/Delete", big_delete, RE, ["DeleteRequest", "limit"], "2.6 MB"),
            ("/lazykv.v1.Cache/Delete", small_delete, INV, ["doc", "more than once"], "300 KB"),
            ("/lazykv.v1.Cache/Lookup", dup_tokens, INV, ["tokens", "more than once"], "dup"),
            ("/lazykv.v1.Cache/Lookup", huge_lookup, RE, ["LookupRequest", "limit"], "5 MB"),
            ("/lazykv.v1.Cache/Lookup", nul_profile, INV, ["profile", "UTF-8"], "NUL"),
            ("/lazykv.v1.Cache/Get", field_len(1, docref_tokens(b"it\xc0\x80est", [1])), INV,
             ["profile", "UTF-8"], "utf8 get"),
            ("/lazykv.v1.Cache/Lookup", bad_utf8, INV, ["UTF-8"], "utf8"),
        ]
        # Each once, checked, with its round-trip time.
        for path, body, code, words, what in attacks:
            t0 = time.monotonic()
            msg = expect(ch, path, body, code, words, what)
            print("  %-8s %-26s %8d B -> %s in %.1f ms: %s"
                  % (what, path, len(body), code.name, (time.monotonic() - t0) * 1e3, msg))
        # A Put whose first message has its header twice (client stream).
        put = ch.stream_unary("/lazykv.v1.Cache/Put", request_serializer=None,
                              response_deserializer=None)
        try:
            put(iter([dup_header]), timeout=h.timeout(20))
            raise AssertionError("Put with two headers accepted")
        except grpc.RpcError as e:
            h.check(e.code() == INV and "header" in e.details() and "more than once"
                    in e.details(), "Put dup header: %s %s" % (e.code(), e.details()))

        # Now all of them at once from 3 threads, for ~3 s, while Health is timed.
        stop = threading.Event()
        sent = [0]
        errors = []

        def attacker(k):
            c = d.channel()
            while not stop.is_set():
                path, body, code, words, what = attacks[(sent[0] + k) % len(attacks)]
                try:
                    expect(c, path, body, code, words, what)
                except AssertionError as e:
                    errors.append(str(e))
                    return
                sent[0] += 1
            c.close()

        threads = [threading.Thread(target=attacker, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        lat = []
        t_end = time.monotonic() + 3.0
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            r = health(health_pb2.HealthCheckRequest(), timeout=h.timeout(20))
            lat.append((time.monotonic() - t0) * 1e3)
            h.check(r.status == health_pb2.HealthCheckResponse.SERVING, "Health: %s" % r)
            time.sleep(0.005)
        stop.set()
        for t in threads:
            t.join()
        h.check(not errors, "attacker: %s" % errors[:1])
        lat.sort()
        p50, p99, mx = lat[len(lat) // 2], lat[int(len(lat) * 0.99)], lat[-1]
        print("  Health under attack: %d calls, p50 %.2f ms, p99 %.2f ms, max %.2f ms "
              "(bound %.0f ms); %d hostile calls refused meanwhile"
              % (len(lat), p50, p99, mx, BOUND_MS, sent[0]))
        h.check(sent[0] >= 20, "only %d hostile calls went through" % sent[0])
        h.check(p99 < BOUND_MS, "Health p99 %.1f ms under attack (bound %.0f)" % (p99, BOUND_MS))
        h.check(mx < 2.5 * BOUND_MS, "Health took %.1f ms under attack (bound 2.5 x %.0f)"
                % (mx, BOUND_MS))

        # Valid and large: 60,000 documents by key, answered; 65,537 refused.
        lookup = ch.unary_unary("/lazykv.v1.Cache/Lookup",
                                request_serializer=cache_pb2.LookupRequest.SerializeToString,
                                response_deserializer=cache_pb2.LookupResponse.FromString)
        refs = [cache_pb2.DocRef(key=(i.to_bytes(4, "little") * 8)) for i in range(60000)]
        t0 = time.monotonic()
        r = lookup(cache_pb2.LookupRequest(docs=refs), timeout=h.timeout(60))
        h.check(len(r.docs) == 60000 and not any(x.present for x in r.docs), "big lookup")
        print("  Lookup of 60000 absent documents: %.1f ms" % ((time.monotonic() - t0) * 1e3))
        refs += refs[:5537]
        try:
            lookup(cache_pb2.LookupRequest(docs=refs), timeout=h.timeout(60))
            raise AssertionError("Lookup of 65537 documents accepted")
        except grpc.RpcError as e:
            h.check(e.code() == INV and "65536" in e.details(), "%s %s" % (e.code(), e.details()))
        health(health_pb2.HealthCheckRequest(), timeout=h.timeout(20))
        h.check(d.stop() == 0, "lazykvd did not exit cleanly")
    print("edge_decode: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
