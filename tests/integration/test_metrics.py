"""test_metrics.py: the Prometheus endpoint of the real lazykvd (metrics_listen), checked three
ways:

  1. the numbers: after a known sequence of calls by two tenants (puts, hits, misses), the
     scraped text holds exactly those counts, per tenant (lazykv_tenant_hits_total{tenant=...}),
     per tier and per method (lazykv_rpc_calls_total), and each method's latency histogram is
     well formed (cumulative buckets, +Inf == _count, _sum > 0); metrics are off by default;
     /other paths answer 404 and POST 405;
  2. the format: `promtool check metrics` (Debian's prometheus package) accepts the text with no
     lint complaint;
  3. who may read them: with tenants a scrape is an Admin call: no token from a loopback
     peer is fine while loopback_roles include admin; with loopback_roles = none it gets 401
     (WWW-Authenticate: Bearer), a data-only tenant's token 403, an admin token 200; with
     metrics_tls the endpoint speaks HTTPS only (the daemon's certificate), plain HTTP fails;
     from a non-loopback peer a token over plain HTTP is refused (401) and accepted over HTTPS
     (skipped, noted, when the host has no non-loopback address).
Step 2 is skipped (noted) when promtool is absent. A real Prometheus server scraping the daemon
is integration.prometheus (test_prometheus.py).
"""
import hashlib
import os
import socket
import ssl
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import lazykv
import certs
import harness as H

TOKENS = {"alice": "lkv_metrics_alice_token_for_tests_01",
          "bob": "lkv_metrics_bob_token_for_tests_0002"}
CAROL = "lkv_metrics_carol_data_only_token_003"
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        sys.stderr.write("FAIL: %s\n" % what)


def tenant_args():
    out = []
    for name, tok in TOKENS.items():
        h = hashlib.blake2b(b"lazykv-token-v1:" + tok.encode(), digest_size=32).hexdigest()
        out += ["--set", "tenant.%s.token_hash=blake2b:%s" % (name, h),
                "--set", "tenant.%s.roles=data,admin" % name]
    return out


def scrape(addr, path="/metrics", method="GET", token=None, https_ca=None, host=None):
    """(status, content type, body); with https_ca (a CA file) over HTTPS. The 401 body and
    its WWW-Authenticate header come back as (401, header, body)."""
    scheme = "https" if https_ca else "http"
    if host is not None:
        addr = "%s:%s" % (host, addr.rsplit(":", 1)[1])
    req = urllib.request.Request("%s://%s%s" % (scheme, addr, path), method=method)
    if token is not None:
        req.add_header("Authorization", "Bearer " + token)
    ctx = ssl.create_default_context(cafile=https_ca) if https_ca else None
    try:
        with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("WWW-Authenticate", ""), e.read().decode()


def non_loopback_ip():
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("192.0.2.1", 9))  # No packet is sent (UDP connect only picks a route).
        ip = s.getsockname()[0]
        s.close()
        return None if ip.startswith("127.") else ip
    except OSError:
        return None


def part_auth(tmp):
    """Who may scrape (docstring item 3)."""
    args = tenant_args() + ["--set", "tenant.carol.token_hash=blake2b:%s" % hashlib.blake2b(
        b"lazykv-token-v1:" + CAROL.encode(), digest_size=32).hexdigest(),
        "--set", "tenant.carol.roles=data"]
    with H.Daemon(H.ITEST_ARGS + args + ["--set", "metrics_listen=127.0.0.1:0",
                                         "--set", "loopback_roles=none"]) as d:
        d.start()
        code, hdr, body = scrape(d.metrics_addr)
        check(code == 401 and hdr.startswith("Bearer") and "missing credentials" in body,
              "loopback_roles=none: no token gets 401 + WWW-Authenticate (%s %r %r)"
              % (code, hdr, body[:200]))
        code, _, body = scrape(d.metrics_addr, token=CAROL)
        check(code == 403 and "admin" in body, "a data-only token gets 403 (%s %r)" % (code, body[:200]))
        code, _, body = scrape(d.metrics_addr, token="lkv_not_a_real_token_at_all_000000")
        check(code == 401 and "invalid bearer token" in body, "a wrong token gets 401 (%s)" % code)
        code, _, body = scrape(d.metrics_addr, token=TOKENS["alice"])
        check(code == 200 and "lazykv_rpc_calls_total" in body, "an admin token gets 200")
        check(scrape(d.metrics_addr, "/nope", token=None)[0] == 404, "404 needs no token")
    # Option checks: metrics_tls without a certificate; non-loopback allowed with tenants.
    bin_ = os.environ.get("LKV_DAEMON_BIN", "lazykvd")
    r = subprocess.run([bin_, "--check-config", "--set", "metrics_listen=127.0.0.1:0", "--set",
                        "metrics_tls=true"], capture_output=True)
    check(r.returncode == 2 and b"metrics_tls" in r.stderr,
          "metrics_tls without tls_cert_file: exit 2 naming the option")
    r = subprocess.run([bin_, "--check-config", "--set", "metrics_listen=0.0.0.0:9464"] + args,
                       capture_output=True)
    check(r.returncode == 0, "a non-loopback metrics_listen with tenants is accepted (%s)"
          % r.stderr.decode()[-300:])
    # HTTPS, and the plain-text token rule from a non-loopback peer.
    ip = non_loopback_ip()
    ca, _ = certs.make_ca(tmp, "mca")
    pem, key = certs.make_cert(tmp, "msrv", "mca", sans=["IP:" + ip] if ip else [])
    tls = ["--set", "tls_cert_file=" + pem, "--set", "tls_key_file=" + key]
    listen = "0.0.0.0:0" if ip else "127.0.0.1:0"
    with H.Daemon(args + tls + ["--set", "metrics_listen=" + listen, "--set",
                                "metrics_tls=true"]) as d:
        d.start()
        code, _, body = scrape(d.metrics_addr, https_ca=ca, host="127.0.0.1")
        check(code == 200 and "lazykv_" in body, "HTTPS scrape from loopback: 200 (%s)" % code)
        try:
            scrape(d.metrics_addr, host="127.0.0.1")
            check(False, "plain HTTP to the HTTPS endpoint fails")
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if ip is None:
            sys.stderr.write("NOTE: no non-loopback address; remote scrape checks skipped\n")
            return
        code, _, _ = scrape(d.metrics_addr, https_ca=ca, host=ip)
        check(code == 401, "HTTPS from a non-loopback peer without a token: 401 (%s)" % code)
        code, _, body = scrape(d.metrics_addr, https_ca=ca, host=ip, token=TOKENS["bob"])
        check(code == 200 and "lazykv_" in body, "HTTPS + admin token from %s: 200 (%s)"
              % (ip, code))
    with H.Daemon(args + ["--set", "metrics_listen=0.0.0.0:0"]) as d:
        d.start()
        code, _, body = scrape(d.metrics_addr, host=ip, token=TOKENS["bob"])
        check(code == 401 and "clear text" in body,
              "a token over plain HTTP from a non-loopback peer: 401 (%s %r)" % (code, body[:200]))
        code, _, _ = scrape(d.metrics_addr, host="127.0.0.1")
        check(code == 200, "the same daemon from loopback without a token: 200 (%s)" % code)


def parse(text):
    """{(name, frozenset(labels)): value} of every sample line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        if "{" in name_labels:
            name, rest = name_labels.split("{", 1)
            labels = frozenset(tuple(kv.split("=", 1)) for kv in rest[:-1].split(",")
                               if kv)
            labels = frozenset((k, v.strip('"')) for k, v in labels)
        else:
            name, labels = name_labels, frozenset()
        out[(name, labels)] = float(value)
    return out


def val(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))


def main():
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="lkv-metrics-")
    S = H.ITEST
    # Off by default: no metrics line.
    with H.Daemon(H.ITEST_ARGS) as d:
        d.start()
        check(d.metrics_addr is None, "metrics are off by default")
    # Non-loopback refused without allow_insecure_bind.
    r = subprocess.run([os.environ.get("LKV_DAEMON_BIN", "lazykvd"), "--check-config", "--set",
                        "metrics_listen=0.0.0.0:9464"], capture_output=True)
    check(r.returncode == 2 and b"metrics_listen" in r.stderr,
          "a non-loopback metrics_listen is refused (exit 2 naming the option)")
    with H.Daemon(H.ITEST_ARGS + tenant_args() + ["--set", "metrics_listen=127.0.0.1:0"]) as d:
        d.start()
        check(d.metrics_addr is not None, "metrics address printed")
        alice = lazykv.Client(d.addr, token=TOKENS["alice"], timeout=10)
        bob = lazykv.Client(d.addr, token=TOKENS["bob"], timeout=10)
        docs = []
        for seed in range(3):
            toks, blocks = H.make_doc(S, 100 + seed, 40)
            alice.put(S.profile, toks, blocks)
            docs.append(lazykv.Doc(S.profile, toks))
        missing = lazykv.Doc(S.profile, H.make_doc(S, 999, 20)[0])
        st = alice.lookup(docs + [missing])  # 3 hits, 1 miss
        check([s.present for s in st] == [True, True, True, False], "alice's lookups")
        alice.lookup(docs[:2])  # 2 more hits
        bob.lookup(docs)  # Bob's salt differs: 3 misses.
        for _ in range(4):
            alice.ping()
        code, ctype, text = scrape(d.metrics_addr)
        check(code == 200 and ctype.startswith("text/plain; version=0.0.4"),
              "GET /metrics: 200 text/plain version 0.0.4 (%s %s)" % (code, ctype))
        with open(os.path.join(tmp, "metrics.txt"), "w") as f:
            f.write(text)
        m = parse(text)
        check(val(m, "lazykv_tenant_hits_total", tenant="alice", tier="hot") == 5,
              "alice: 5 hot hits (%s)" % val(m, "lazykv_tenant_hits_total", tenant="alice",
                                               tier="hot"))
        check(val(m, "lazykv_tenant_misses_total", tenant="alice") == 1, "alice: 1 miss")
        check(val(m, "lazykv_tenant_hits_total", tenant="bob", tier="hot") == 0, "bob: 0 hits")
        check(val(m, "lazykv_tenant_misses_total", tenant="bob") == 3, "bob: 3 misses")
        check(val(m, "lazykv_store_hits_total", tier="hot") == 5, "store: 5 hot hits")
        check(val(m, "lazykv_store_lookup_misses_total") == 4, "store: 4 misses")
        check(abs(val(m, "lazykv_store_tier_hit_ratio", tier="hot") - 5 / 9) < 1e-6,
              "hot-tier hit ratio 5/9")
        check(val(m, "lazykv_store_docs", tier="hot") == 3, "3 hot documents (gauge)")
        check(val(m, "lazykv_store_wb_pending") is not None, "write-back gauge present")
        check(val(m, "lazykv_lease_live") == 0, "lease gauge present")
        lk = dict(service="lazykv.v1.Cache", method="Lookup")
        check(val(m, "lazykv_rpc_calls_total", **lk) == 3, "3 Lookup calls")
        check(val(m, "lazykv_rpc_calls_total", service="lazykv.v1.Cache", method="Put") == 3,
              "3 Put calls")
        # The Lookup histogram: cumulative, +Inf == count == calls, sum > 0.
        buckets = sorted((float(dict(k[1])["le"]) if dict(k[1])["le"] != "+Inf"
                          else float("inf"), v) for k, v in m.items()
                         if k[0] == "lazykv_rpc_duration_seconds_bucket"
                         and ("method", "Lookup") in k[1])
        counts = [v for _, v in buckets]
        check(len(buckets) >= 10 and counts == sorted(counts), "Lookup buckets cumulative")
        check(buckets and buckets[-1][0] == float("inf") and buckets[-1][1] == 3,
              "+Inf bucket = 3")
        check(val(m, "lazykv_rpc_duration_seconds_count", **lk) == 3, "_count = 3")
        check((val(m, "lazykv_rpc_duration_seconds_sum", **lk) or 0) > 0, "_sum > 0")
        hc = dict(service="grpc.health.v1.Health", method="Check")
        check(val(m, "lazykv_rpc_duration_seconds_count", **hc) == 4, "4 Health checks")
        # HELP/TYPE once per family.
        types = [ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE ")]
        check(len(types) == len(set(types)), "one TYPE line per metric family")
        check(scrape(d.metrics_addr, "/nope")[0] == 404, "unknown path: 404")
        check(scrape(d.metrics_addr, "/metrics", "POST")[0] == 405, "POST: 405")
        promtool = shutil.which("promtool")
        if promtool:
            t1 = time.monotonic()
            r = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                               capture_output=True)
            check(r.returncode == 0, "promtool check metrics: %s" % (r.stdout + r.stderr)
                  .decode()[-2000:])
            sys.stderr.write("promtool: %.2f s\n" % (time.monotonic() - t1))
        else:
            sys.stderr.write("NOTE: no promtool; the format check is skipped\n")
        alice.close()
        bob.close()
    part_auth(tmp)
    sys.stderr.write("test_metrics: %.1f s\n" % (time.monotonic() - t0))
    if not os.environ.get("LKV_KEEP_TMP"):
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        sys.stderr.write("%d check(s) failed\n" % len(failures))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
