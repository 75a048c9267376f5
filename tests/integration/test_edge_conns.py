"""test_edge_conns.py: integration.edge_conns. Issue 12, item 2, against the real lazykvd:
  - descriptor exhaustion: the daemon runs with RLIMIT_NOFILE 192 (soft = hard, set in the child)
    and no connection cap; 400 idle TCP connections exhaust its descriptors (the accept loop
    sheds what it cannot take and backs off); once they close, Health answers again. The same
    run against gRPC's own listener (--set grpc_listener=true) is printed as the baseline
    (gRPC 1.51 may stop accepting for good; not asserted either way);
  - the per-peer cap: max_connections_per_peer=5, 12 connections: 5 stay, 7 are closed at once;
  - the total cap: max_connections=4;
  - SIGTERM with idle open connections (gRPC channels that made a call, and raw TCP ones) exits
    in well under the grace period (20 s here); the time is printed.
"""
import os
import select
import signal
import socket
import sys
import time

import harness as h  # first: it exits 77 (skip) without grpc

import grpc  # noqa: E402
from harness import health_pb2  # noqa: E402

NOFILE = 192


def low_nofile_bin(d):
    """Points d at a wrapper that lowers RLIMIT_NOFILE (soft and hard) and execs lazykvd. Not
    preexec_fn: grpcio's fork handlers hang a fork once its threads run."""
    path = os.path.join(d.dir, "lazykvd-nofile")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nulimit -n %d || exit 99\nexec '%s' \"$@\"\n" % (NOFILE, d.bin))
    os.chmod(path, 0o755)
    d.bin = path


def health_call(ch, timeout):
    hc = ch.unary_unary("/grpc.health.v1.Health/Check",
                        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                        response_deserializer=health_pb2.HealthCheckResponse.FromString)
    return hc(health_pb2.HealthCheckRequest(), timeout=timeout)


def health_ok_within(d, seconds):
    """Fresh channel each try; returns the seconds it took until Health answered, or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        ch = d.channel()
        try:
            health_call(ch, 1.0)
            return time.monotonic() - t0
        except grpc.RpcError:
            time.sleep(0.1)
        finally:
            ch.close()
    return None


def dial(addr):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.setblocking(False)
    return s


def closed_by_server(s, wait):
    r, _, _ = select.select([s], [], [], wait)
    if not r:
        return False
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BlockingIOError):
        return True


def exhaust(d, n=400):
    """Opens n idle TCP connections; returns (sockets, how many the daemon closed at once)."""
    socks = []
    for _ in range(n):
        try:
            socks.append(dial(d.addr))
        except OSError:
            break
    time.sleep(1.0)
    shed = sum(1 for s in socks if closed_by_server(s, 0))
    return socks, shed


def fd_case(extra, label, patience):
    with h.Daemon(h.ITEST_ARGS + ["--set", "max_connections=100000"] + extra) as d:
        low_nofile_bin(d)
        d.start()
        with open("/proc/%d/limits" % d.proc.pid) as f:
            lim = [x for x in f if x.startswith("Max open files")][0].split()[3]
        h.check(lim == str(NOFILE), "daemon descriptor limit %s, want %d" % (lim, NOFILE))
        h.check(health_ok_within(d, h.timeout(10)) is not None, "%s: no Health at start" % label)
        socks, shed = exhaust(d)
        during = health_ok_within(d, 1.0)
        for s in socks:
            s.close()
        after = health_ok_within(d, h.timeout(patience))
        log = open(d.log_path, encoding="utf-8", errors="replace").read()
        print("  %s: %d connections opened, %d shed at once; Health while exhausted: %s; "
              "after closing them: %s" % (label, len(socks), shed,
                                          "ok" if during is not None else "no",
                                          "ok in %.2f s" % after if after is not None
                                          else "NEVER (within %.0f s)" % h.timeout(patience)))
        if d.stop(signal.SIGKILL if after is None else signal.SIGTERM) not in (0, -9):
            pass
        return len(socks), shed, after, log


def host_ipv4():
    """A non-loopback IPv4 address of this host, or None."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("192.0.2.1", 9))  # No packet is sent: it only picks the source address.
        ip = s.getsockname()[0]
        s.close()
        return None if ip.startswith("127.") else ip
    except OSError:
        return None


def peers_keep_their_class():
    """The core names handed-over connections "fd:N"; the engine translates N back to the peer,
    and the admission hook's loopback rule must see the truth: anonymous Stats (admin role,
    loopback only) works from 127.0.0.1 and is refused from the host's own non-loopback
    address, alternately, so descriptor numbers are reused between the two classes."""
    ip = host_ipv4()
    if ip is None:
        print("  (no non-loopback IPv4 address: the peer-class case is skipped)")
        return
    with h.Daemon(h.ITEST_ARGS + ["--set", "allow_insecure_bind=true"]) as d:
        d.start(more=["--set", "listen=0.0.0.0:0"])
        port = d.addr.rsplit(":", 1)[1]
        from harness import admin_pb2
        results = []
        for i in range(6):
            for host in ("127.0.0.1", ip):
                ch = grpc.insecure_channel("%s:%s" % (host, port))
                stats = ch.unary_unary("/lazykv.v1.Admin/Stats",
                                       request_serializer=admin_pb2.StatsRequest.SerializeToString,
                                       response_deserializer=admin_pb2.StatsResponse.FromString)
                try:
                    stats(admin_pb2.StatsRequest(sections=["server"]), timeout=h.timeout(10))
                    results.append((host, "OK"))
                except grpc.RpcError as e:
                    results.append((host, e.code().name))
                ch.close()
        lo = [r for h_, r in results if h_ == "127.0.0.1"]
        remote = [r for h_, r in results if h_ != "127.0.0.1"]
        h.check(all(r == "OK" for r in lo), "loopback anonymous Stats refused: %s" % lo)
        h.check(all(r in ("UNAUTHENTICATED", "PERMISSION_DENIED") for r in remote),
                "anonymous Stats from %s: %s" % (ip, remote))
        log = open(d.log_path, encoding="utf-8", errors="replace").read()
        h.check(("ipv4:%s:" % ip) in log, "the refusals do not name the peer %s" % ip)
        print("  peer class: anonymous Stats from 127.0.0.1 %s, from %s %s (6 each, interleaved)"
              % (lo[0], ip, remote[0]))


def main():
    n, shed, after, log = fd_case([], "lazykvd's accept loop", 15)
    h.check(n > NOFILE, "only %d connections could be opened" % n)
    h.check(shed > 0, "no connection was shed while out of descriptors")
    h.check("out of descriptors" in log, "no EMFILE warning in the log")
    h.check(after is not None, "the daemon does not accept again after descriptor exhaustion")
    h.check("descriptors available again" in log, "no recovery line in the log")
    fd_case(["--set", "grpc_listener=true"], "baseline, gRPC's own listener", 4)
    peers_keep_their_class()

    with h.Daemon(h.ITEST_ARGS + ["--set", "max_connections_per_peer=5"]) as d:
        d.start()
        socks = [dial(d.addr) for _ in range(12)]
        time.sleep(0.3)
        closed = [closed_by_server(s, 0.5) for s in socks]
        h.check(sum(closed) == 7 and not any(closed[:5]),
                "per-peer cap 5 of 12: closed %s" % closed)
        for s in socks:
            s.close()
        h.check(health_ok_within(d, h.timeout(10)) is not None, "Health after the per-peer cap")
        # Admin Stats, section "connections", counts them.
        from harness import admin_pb2, admin_pb2_grpc
        ch = d.channel()
        r = admin_pb2_grpc.AdminStub(ch).Stats(admin_pb2.StatsRequest(sections=["connections"]),
                                               timeout=h.timeout(10))
        ch.close()
        conn = {e.key: e.value for e in r.entries if e.section == "connections"}
        h.check(conn.get("refused_peer_cap", 0) >= 7 and conn.get("accepted", 0) >= 6,
                "Stats connections: %s (info: %s)" % (conn, r.info))
        h.check("# Connections" in r.info or "connections" in r.info.lower(), r.info)
        print("  per-peer cap 5: 12 connections, 7 closed at once; Health fine after; Stats: %s"
              % {k: int(v) for k, v in sorted(conn.items())})
    with h.Daemon(h.ITEST_ARGS + ["--set", "max_connections=4"]) as d:
        d.start()
        socks = [dial(d.addr) for _ in range(6)]
        time.sleep(0.3)
        closed = [closed_by_server(s, 0.5) for s in socks]
        h.check(sum(closed) == 2, "total cap 4 of 6: closed %s" % closed)
        for s in socks:
            s.close()
        h.check(health_ok_within(d, h.timeout(10)) is not None, "Health after the total cap")
        print("  total cap 4: 6 connections, 2 closed at once")

    with h.Daemon(h.ITEST_ARGS + ["--set", "shutdown_grace=20s"]) as d:
        d.start()
        chans = [d.channel() for _ in range(3)]
        for ch in chans:
            health_call(ch, h.timeout(10))
        raw = [dial(d.addr) for _ in range(20)]
        t0 = time.monotonic()
        rc = d.stop(signal.SIGTERM, wait=30)
        dt = time.monotonic() - t0
        print("  SIGTERM with 3 idle gRPC channels and 20 idle TCP connections: exit %s in "
              "%.2f s (grace 20 s)" % (rc, dt))
        h.check(rc == 0, "exit status %s" % rc)
        h.check(dt < 2.0 * h.SCALE, "SIGTERM took %.2f s with idle connections" % dt)
        for s in raw:
            s.close()
    print("edge_conns: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
