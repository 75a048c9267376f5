"""test_edge_ready.py: integration.edge_ready. Issue 12, item 3, readiness apart from liveness:
  - while the store opens (the cold index loads; made slow with LKV_FAULT_OPEN_DELAY_MS=2500)
    the daemon already accepts connections (a TCP liveness probe passes), Health answers
    NOT_SERVING and every other call UNAVAILABLE ("starting");
  - once the store is open: SERVING, and calls work (a Put, then a Lookup finds it); the
    connections of the loading phase were dropped at the hand-over (clients reconnect);
  - while it drains (SIGTERM with a Put stream held open, grace 3 s): Health is not SERVING
    (NOT_SERVING, or UNAVAILABLE once the core refuses new calls), then the daemon exits 0.
"""
import os
import re
import signal
import socket
import sys
import threading
import time

import harness as h  # first: it exits 77 (skip) without grpc

import grpc  # noqa: E402
from harness import cache_pb2, cache_pb2_grpc, health_pb2  # noqa: E402

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def health(ch):
    hc = ch.unary_unary("/grpc.health.v1.Health/Check",
                        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                        response_deserializer=health_pb2.HealthCheckResponse.FromString)
    try:
        return hc(health_pb2.HealthCheckRequest(), timeout=h.timeout(5)).status
    except grpc.RpcError as e:
        return e.code().name


def main():
    os.environ["LKV_FAULT_OPEN_DELAY_MS"] = "2500"
    with h.Daemon(h.ITEST_ARGS + ["--set", "shutdown_grace=3s"]) as d:
        started = threading.Event()
        errors = []

        def start():
            try:
                d.start()
            except Exception as e:  # noqa: BLE001
                errors.append(e)
            started.set()

        th = threading.Thread(target=start)
        t0 = time.monotonic()
        th.start()
        addr = None
        while addr is None and time.monotonic() - t0 < h.timeout(20):
            if os.path.exists(d.log_path):
                m = re.search(r"health: NOT_SERVING on (\S+) until", open(d.log_path).read())
                if m:
                    addr = m.group(1)
            time.sleep(0.02)
        del os.environ["LKV_FAULT_OPEN_DELAY_MS"]
        h.check(addr is not None, "no early Health line in the log")
        host, port = addr.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()  # Liveness: TCP accepts.
        ch = grpc.insecure_channel(addr)
        seen = []
        while not started.is_set():
            seen.append(health(ch))
            time.sleep(0.05)
            if len(seen) == 3:
                try:
                    cache_pb2_grpc.CacheStub(ch).Lookup(
                        cache_pb2.LookupRequest(docs=[cache_pb2.DocRef(key=b"k" * 32)]),
                        timeout=h.timeout(5))
                    raise AssertionError("Lookup served while loading")
                except grpc.RpcError as e:
                    h.check(e.code() == grpc.StatusCode.UNAVAILABLE and "starting" in e.details(),
                            "Lookup while loading: %s %s" % (e.code(), e.details()))
        th.join()
        h.check(not errors, "start: %s" % errors)
        ready_after = time.monotonic() - t0
        h.check(len(seen) >= 5 and all(s == NOT_SERVING for s in seen[:-1]),
                "Health while loading: %s" % seen)
        # The starting server handed the address over: its connections were dropped (a client's
        # channel reconnects on its own; a probe connects anew each time). A new channel:
        ch.close()
        ch = grpc.insecure_channel(addr)
        h.check(health(ch) == SERVING, "not SERVING once ready")
        print("  loading: %d Health answers NOT_SERVING, Lookup UNAVAILABLE; SERVING after %.2f s"
              % (len(seen) - 1, ready_after))

        toks, blocks = h.make_doc(h.ITEST, 3, 20)
        stub = cache_pb2_grpc.CacheStub(ch)
        stub.Put(iter(h.put_requests(h.ITEST, toks, blocks)), timeout=h.timeout(20))
        r = stub.Lookup(cache_pb2.LookupRequest(docs=[h.token_ref(h.ITEST, toks)]),
                        timeout=h.timeout(20))
        h.check(r.docs[0].present, "the document Put once ready is not found")

        # Drain: a Put stream stays open (header sent, blocks never), SIGTERM, ask Health.
        hold = threading.Event()

        def slow_put():
            def msgs():
                yield h.put_requests(h.ITEST, toks[:5] + [7, 7], blocks[:1])[0]
                hold.wait(h.timeout(10))
            try:
                stub.Put(msgs(), timeout=h.timeout(20))
            except grpc.RpcError:
                pass

        pt = threading.Thread(target=slow_put)
        pt.start()
        time.sleep(0.3)
        d.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        during = health(ch)
        h.check(during != SERVING, "Health says SERVING while draining")
        hold.set()
        pt.join()
        rc = d.stop(signal.SIGTERM, wait=15)
        h.check(rc == 0, "exit status %s after the drain" % rc)
        print("  draining: Health %s; exit %s" % (during if isinstance(during, str)
                                                  else "NOT_SERVING", rc))
    print("edge_ready: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
