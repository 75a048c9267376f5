#!/usr/bin/python3
"""integration.cluster_py: the Python package's lazykv.cluster.ClusterClient against three real
lazykvd and a real etcd 3.4 (all started here on loopback ports; skipped, 77, without etcd).

Checks that Python computes the same owners as the daemons (every document put through the
ClusterClient sits exactly on the member Python says owns it: Admin List of each member), that
Get returns every byte, that a Put sent straight to a non-owner is redirected (LKV_ENOTOWNER,
FAILED_PRECONDITION), that Lookup through one member is forwarded (OWNER_DOWN once an owner is
killed), and that after kill -9 of a member its documents become NotFound within the call's
timeout while the others are still served.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import harness
from harness import ITEST_ARGS, Shape, check, make_doc, run_tests

import grpc  # noqa: E402
import lazykv  # noqa: E402
from lazykv import cluster as lkc  # noqa: E402
from lazykv.v1 import admin_pb2, admin_pb2_grpc  # noqa: E402

ETCD = "/usr/bin/etcd"
ITEST = Shape("itest", 2, 2, 8, 2, 16, 1000)
N = 3


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Etcd:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="lkv-etcd-py-")
        c, p = free_port(), free_port()
        self.endpoint = "127.0.0.1:%d" % c
        cu, pu = "http://127.0.0.1:%d" % c, "http://127.0.0.1:%d" % p
        self.proc = subprocess.Popen(
            [ETCD, "--name", "t", "--data-dir", self.dir + "/data", "--listen-client-urls", cu,
             "--advertise-client-urls", cu, "--listen-peer-urls", pu,
             "--initial-advertise-peer-urls", pu, "--initial-cluster", "t=" + pu],
            stdout=subprocess.DEVNULL, stderr=open(self.dir + "/etcd.log", "wb"))

    def close(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


etcd = None
members = []
docs = []  # (tokens, blocks)


def wait_up(n, timeout_s=10):
    end = time.monotonic() + harness.timeout(timeout_s)
    while time.monotonic() < end:
        ok = True
        for d in members:
            if d.proc is None:
                continue
            try:
                with lazykv.Client(d.addr, timeout=1) as c:
                    r = c.cluster()
                ok &= sum(m.state == "up" for m in r.members) == n
            except lazykv.LazyKVError:
                ok = False
        if ok:
            return
        time.sleep(0.05)
    raise AssertionError("the cluster did not reach %d up members" % n)


def test_owners_agree_with_daemons():
    with lkc.ClusterClient(members[0].addr, timeout=5) as kv:
        check(kv.mode == "etcd", kv.mode)
        want = {}
        for i in range(24):
            toks, blocks = make_doc(ITEST, 9100 + i, 20 + 7 * (i % 4))
            docs.append((toks, blocks))
            r = kv.put("itest", toks, blocks)
            check(r.durability == "durable", r.durability)
            owner = kv.owner("itest", toks)
            want.setdefault(owner, set()).add(bytes(r.key))
        for d in members:
            with d.channel() as ch:
                ls = admin_pb2_grpc.AdminStub(ch).List(admin_pb2.ListRequest(), timeout=5)
            got = {bytes(s.key) for s in ls.docs}
            check(got == want.get(d.addr, set()),
                  "member %s holds %d documents, Python expects %d there"
                  % (d.addr, len(got), len(want.get(d.addr, set()))))
        check(len(want) >= 2, "24 documents all on one member")
        for toks, blocks in docs:
            g = kv.get(profile="itest", tokens=toks)
            check(g.blocks == blocks, "a document came back different")


def test_non_owner_redirects_put():
    with lkc.ClusterClient(members[0].addr, timeout=5) as kv:
        toks, blocks = docs[0]
        owner = kv.owner("itest", toks)
        other = next(d.addr for d in members if d.addr != owner)
        with lazykv.Client(other, timeout=5) as c:
            try:
                c.put("itest", toks, blocks)
                check(False, "a non-owner accepted a Put")
            except lazykv.LazyKVError as e:
                check(e.lkv_code == "LKV_ENOTOWNER", e.lkv_code)
                check(e.code == grpc.StatusCode.FAILED_PRECONDITION, e.code)
            # Lookup is forwarded: the non-owner answers for the owner.
            st = c.lookup([lazykv.Doc("itest", t) for t, _ in docs])
            check(all(s.present for s in st), "a forwarded Lookup missed")


def test_kill9_owner():
    with lkc.ClusterClient(members[1].addr, timeout=5) as kv:
        owners = [kv.owner("itest", t) for t, _ in docs]
        victim = members[2]
        victim.stop(signal.SIGKILL)
        t0 = time.monotonic()
        for (toks, blocks), owner in zip(docs, owners):
            t1 = time.monotonic()
            try:
                g = kv.get(profile="itest", tokens=toks, timeout=3)
                check(owner != victim.addr, "a dead member's document was served")
                check(g.blocks == blocks, "a document came back different")
            except lazykv.NotFound:
                check(owner == victim.addr, "a live member's document went missing")
            check(time.monotonic() - t1 < 3.5, "a call outlived its timeout")
        sys.stderr.write("   kill -9: every document answered %.2f s after the kill\n"
                         % (time.monotonic() - t0))
        st = kv.lookup([lazykv.Doc("itest", t) for t, _ in docs])
        for s, owner in zip(st, owners):
            check(s.present == (owner != victim.addr), "lookup after the kill")


def main():
    global etcd
    if not os.access(ETCD, os.X_OK):
        sys.stderr.write("SKIP: etcd not installed (apt-get install etcd-server)\n")
        return 77
    etcd = Etcd()
    tmp = tempfile.mkdtemp(prefix="lkv-cl-py-")
    tok = os.path.join(tmp, "cluster.token")
    with open(tok, "w") as f:
        f.write(lazykv.new_token() + "\n")
    try:
        time.sleep(0.5)
        for i in range(N):
            d = harness.Daemon(ITEST_ARGS + [
                "--set", "durability=write-through", "--set", "cluster_mode=etcd",
                "--set", "cluster_etcd=" + etcd.endpoint, "--set", "cluster_id=p%d" % i,
                "--set", "cluster_token_file=" + tok, "--set", "cluster_lease_ttl=2s",
                "--set", "cluster_health_interval=100ms", "--set", "cluster_down_after=1s"])
            members.append(d.start())
        wait_up(N)
        run_tests([test_owners_agree_with_daemons, test_non_owner_redirects_put,
                   test_kill9_owner])
    finally:
        for d in members:
            d.cleanup()
        etcd.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
