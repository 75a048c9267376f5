"""test_metrics.py: the Prometheus endpoint of the real lazykvd (metrics_listen), checked three
ways:

  1. the numbers: after a known sequence of calls by two tenants (puts, hits, misses), the
     scraped text holds exactly those counts, per tenant (lazykv_tenant_hits_total{tenant=...}),
     per tier and per method (lazykv_rpc_calls_total), and each method's latency histogram is
     well formed (cumulative buckets, +Inf == _count, _sum > 0); metrics are off by default;
     /other paths answer 404 and POST 405;
  2. the format: `promtool check metrics` (Debian's prometheus package) accepts the text with no
     lint complaint;
Step 2 is skipped (noted) when promtool is absent. A real Prometheus server scraping the daemon
is integration.prometheus (test_prometheus.py).
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import lazykv
import harness as H

TOKENS = {"alice": "lkv_metrics_alice_token_for_tests_01",
          "bob": "lkv_metrics_bob_token_for_tests_0002"}
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


def scrape(addr, path="/metrics", method="GET"):
    req = urllib.request.Request("http://%s%s" % (addr, path), method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, "", ""


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
