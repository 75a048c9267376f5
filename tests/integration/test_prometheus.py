"""test_prometheus.py: a real Prometheus server scrapes the real lazykvd and answers a query.

The daemon serves metrics on loopback (metrics_listen = 127.0.0.1:0) the way an operator who
locks it down would: HTTPS only (metrics_tls, the daemon's certificate), loopback_roles = none,
so every scrape needs an admin-role token; Prometheus scrapes with scheme https, the test CA and
authorization.credentials_file. A tenant makes a known number of hot hits. Prometheus (Debian's prometheus package) is started with a prometheus.yml
written here (1 s scrape interval, one static target), its TSDB in a temporary folder and its web
API on a free loopback port; the test polls /api/v1/query until the query
lazykv_tenant_hits_total{tenant="alice",tier="hot"} answers the exact count (and up == 1), within
20 s. Exits 77 (skip) when the prometheus binary is absent.
"""
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

PROM = shutil.which("prometheus")
if PROM is None:
    sys.stderr.write("SKIP: no prometheus (Debian: apt-get install prometheus)\n")
    sys.exit(77)

import lazykv  # noqa: E402
import certs  # noqa: E402
import harness as H  # noqa: E402

TOKEN = "lkv_prometheus_alice_token_for_tests"
OPS_TOKEN = "lkv_prometheus_ops_admin_token_00001"
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        sys.stderr.write("FAIL: %s\n" % what)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def query(port, q):
    url = "http://127.0.0.1:%d/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": q}))
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            body = json.loads(r.read().decode())
    except (urllib.error.URLError, ConnectionError, OSError, ValueError):
        return None
    res = body.get("data", {}).get("result", [])
    return float(res[0]["value"][1]) if body.get("status") == "success" and res else None


def main():
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="lkv-prom-")
    h = hashlib.blake2b(b"lazykv-token-v1:" + TOKEN.encode(), digest_size=32).hexdigest()
    ho = hashlib.blake2b(b"lazykv-token-v1:" + OPS_TOKEN.encode(), digest_size=32).hexdigest()
    ca, _ = certs.make_ca(tmp, "promca")
    pem, key = certs.make_cert(tmp, "promsrv", "promca")
    args = H.ITEST_ARGS + ["--set", "metrics_listen=127.0.0.1:0", "--set", "metrics_tls=true",
                           "--set", "tls_cert_file=" + pem, "--set", "tls_key_file=" + key,
                           "--set", "loopback_roles=none",
                           "--set", "tenant.alice.token_hash=blake2b:" + h,
                           "--set", "tenant.alice.roles=data",
                           "--set", "tenant.ops.token_hash=blake2b:" + ho,
                           "--set", "tenant.ops.roles=admin"]
    with H.Daemon(args) as d:
        d.start()
        with lazykv.Client(d.addr, token=TOKEN, timeout=10, tls_ca=ca) as c:
            toks, blocks = H.make_doc(H.ITEST, 42, 40)
            c.put(H.ITEST.profile, toks, blocks)
            for _ in range(7):
                c.lookup([lazykv.Doc(H.ITEST.profile, toks)])
        port = free_port()
        cfg = os.path.join(tmp, "prometheus.yml")
        cred = os.path.join(tmp, "ops.token")
        with open(cred, "w") as f:
            f.write(OPS_TOKEN + "\n")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: lazykv\n    scheme: https\n"
                    "    tls_config:\n      ca_file: %s\n"
                    "    authorization:\n      credentials_file: %s\n"
                    "    static_configs:\n"
                    "      - targets: ['%s']\n" % (ca, cred, d.metrics_addr))
        log = open(os.path.join(tmp, "prometheus.log"), "wb")
        t1 = time.monotonic()
        p = subprocess.Popen([PROM, "--config.file=" + cfg,
                              "--storage.tsdb.path=" + os.path.join(tmp, "tsdb"),
                              "--web.listen-address=127.0.0.1:%d" % port],
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        got = up = None
        try:
            deadline = time.monotonic() + H.timeout(20)
            while time.monotonic() < deadline and (got is None or up is None):
                time.sleep(0.25)
                got = query(port, 'lazykv_tenant_hits_total{tenant="alice",tier="hot"}')
                up = query(port, 'up{job="lazykv"}')
                if p.poll() is not None:
                    break
            sys.stderr.write("prometheus: answered %.1f s after its start\n"
                             % (time.monotonic() - t1))
            check(got == 7.0, "Prometheus answered alice's hot hits = %s (want 7)" % got)
            check(up == 1.0, "Prometheus sees the target up (%s)" % up)
        finally:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            log.close()
            if failures:
                with open(os.path.join(tmp, "prometheus.log"), "rb") as f:
                    sys.stderr.write(f.read()[-3000:].decode("utf-8", "replace"))
    shutil.rmtree(tmp, ignore_errors=True)
    sys.stderr.write("test_prometheus: %.1f s\n" % (time.monotonic() - t0))
    if failures:
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
