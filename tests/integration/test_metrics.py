"""test_metrics.py: the Prometheus endpoint of the real lazykvd (metrics_listen), checked three
ways:

  1. the numbers: after a known sequence of calls by two tenants (puts, hits, misses), the
     scraped text holds exactly those counts, per tenant (lazykv_tenant_hits_total{tenant=...}),
     per tier and per method (lazykv_rpc_calls_total), and each method's latency histogram is
     well formed (cumulative buckets, +Inf == _count, _sum > 0); metrics are off by default;
     /other paths answer 404 and POST 405;
  2. the format: `promtool check metrics` (Debian's prometheus package) accepts the text with no
     lint complaint;
  3. a real Prometheus server (1 s scrape interval, its own TSDB in a temporary folder, on
     loopback) scrapes the daemon and answers an instant query with the tenant's hit count.
Steps 2 and 3 are skipped (noted) when promtool / prometheus are absent; the whole test exits
77 only if neither the daemon's stubs nor grpc are importable.
"""
import hashlib
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
import json

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


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def run_prometheus(tmp, target, query, want):
    prom = shutil.which("prometheus")
    if prom is None:
        sys.stderr.write("NOTE: no prometheus binary; the real-scrape check is skipped\n")
        return
    port = free_port()
    cfg = os.path.join(tmp, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: lazykv\n    static_configs:\n"
                "      - targets: ['%s']\n" % target)
    log = open(os.path.join(tmp, "prometheus.log"), "wb")
    t0 = time.monotonic()
    p = subprocess.Popen([prom, "--config.file=" + cfg,
                          "--storage.tsdb.path=" + os.path.join(tmp, "tsdb"),
                          "--web.listen-address=127.0.0.1:%d" % port],
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    got = None
    try:
        deadline = time.monotonic() + H.timeout(20)
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (port, urllib.parse.urlencode(
            {"query": query}))
        while time.monotonic() < deadline and got is None:
            time.sleep(0.3)
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    body = json.loads(r.read().decode())
                res = body.get("data", {}).get("result", [])
                if body.get("status") == "success" and res:
                    got = float(res[0]["value"][1])
            except (urllib.error.URLError, ConnectionError, OSError, ValueError):
                pass
            if p.poll() is not None:
                break
        check(got == want, "Prometheus answered %s = %s (want %s)" % (query, got, want))
        sys.stderr.write("prometheus: first answer after %.1f s\n" % (time.monotonic() - t0))
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()
        if got != want:
            with open(os.path.join(tmp, "prometheus.log"), "rb") as f:
                sys.stderr.write(f.read()[-3000:].decode("utf-8", "replace"))


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
        run_prometheus(tmp, d.metrics_addr,
                       'lazykv_tenant_hits_total{tenant="alice",tier="hot"}', 5.0)
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
