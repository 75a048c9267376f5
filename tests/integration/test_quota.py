"""test_quota.py: per-tenant capacity quotas and rates of the real lazykvd.

  1. Noisy neighbour, run twice in the same test: a "quiet" tenant stores a hot set, then a
     "flood" tenant puts far more than the hot tier holds, then quiet looks its set up again.
     Without a quota on flood, the global eviction policy demotes quiet's documents (its hot hit
     rate collapses: the baseline, which must show the problem or the test proves nothing); with
     max_hot_bytes on flood, flood evicts its own documents instead, every flood put succeeds,
     quiet keeps a 100% hot hit rate, and flood's hot usage stays within its quota.
  2. A document larger than the tenant's max_hot_bytes is refused with RESOURCE_EXHAUSTED,
     lkv-code LKV_EQUOTA and a message naming the quota; max_docs keeps the newest documents.
  3. rate_calls: a burst beyond the bucket is refused with RESOURCE_EXHAUSTED, lkv-code
     LKV_ERATE, a retry-after-ms trailing value and a message naming rate_calls, and no more
     calls pass than the bucket allows for the elapsed time; after waiting that long the tenant
     is served again; another tenant is never throttled meanwhile.
  4. rate_bytes: a Put beyond the byte bucket is refused the same way (naming rate_bytes).
"""
import hashlib
import sys
import time
import urllib.request

import lazykv
import harness as H

S = H.ITEST
failures = []
TOK = {n: "lkv_quota_%s_token_for_tests_%s" % (n, "0" * (12 - len(n))) for n in
       ("quiet", "flood", "small", "rated", "bytes")}


def check(cond, what):
    if not cond:
        failures.append(what)
        sys.stderr.write("FAIL: %s\n" % what)


def tenant(name, **limits):
    h = hashlib.blake2b(b"lazykv-token-v1:" + TOK[name].encode(), digest_size=32).hexdigest()
    out = ["--set", "tenant.%s.token_hash=blake2b:%s" % (name, h),
           "--set", "tenant.%s.roles=data,admin" % name]
    for k, v in limits.items():
        out += ["--set", "tenant.%s.%s=%s" % (name, k, v)]
    return out


def metric(d, name, **labels):
    with urllib.request.urlopen("http://%s/metrics" % d.metrics_addr, timeout=5) as r:
        text = r.read().decode()
    want = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            lab = line[len(name) + 1:line.index("}")]
            if ",".join(sorted(lab.split(","))) == want:
                return float(line.rsplit(" ", 1)[1])
    return None


# The arena's pages are as large as the largest profile's block (llama-3.1-8b: 2 MiB), so with
# hot_bytes = 64 MiB the hot tier holds 32 pages; an itest document of 20 tokens takes 2 pages.
# The policy is pinned to LRU so that the baseline (no quota) shows the eviction pressure the same
# way whatever the default policy is; with the quota the outcome does not depend on it.
HOT = ["--set", "hot_bytes=64MiB", "--set", "metrics_listen=127.0.0.1:0", "--set", "policy=lru"]
QUIET_DOCS, FLOOD_DOCS, N_TOK = 6, 40, 20


def noisy_neighbour(quota):
    limits = {"max_hot_bytes": "16MiB"} if quota else {}  # 8 pages = 4 documents.
    args = H.ITEST_ARGS + HOT + tenant("quiet") + tenant("flood", **limits)
    with H.Daemon(args) as d:
        d.start()
        quiet = lazykv.Client(d.addr, token=TOK["quiet"], timeout=20)
        flood = lazykv.Client(d.addr, token=TOK["flood"], timeout=20)
        qdocs = []
        for i in range(QUIET_DOCS):
            toks, blocks = H.make_doc(S, 1000 + i, N_TOK)
            quiet.put(S.profile, toks, blocks)
            qdocs.append(lazykv.Doc(S.profile, toks))
        before = quiet.lookup(qdocs)
        check(all(s.tier == "hot" for s in before), "quiet's set is hot at first")
        ok = 0
        for i in range(FLOOD_DOCS):
            toks, blocks = H.make_doc(S, 5000 + i, N_TOK)
            try:
                flood.put(S.profile, toks, blocks)
                ok += 1
            except lazykv.LazyKVError as e:
                sys.stderr.write("flood put %d: %s\n" % (i, e))
        after = quiet.lookup(qdocs)
        hot = sum(s.tier == "hot" for s in after) / len(after)
        present = all(s.present for s in after)
        flood_hot = metric(d, "lazykv_tenant_hits_total", tenant="flood", tier="hot")
        evictions = metric(d, "lazykv_tenant_quota_evictions_total", tenant="flood")
        used = metric(d, "lazykv_tenant_used_bytes", tenant="flood", tier="hot")
        quota_g = metric(d, "lazykv_tenant_quota_bytes", tenant="flood", tier="hot")
        qdocs_g = metric(d, "lazykv_tenant_docs", tenant="quiet")
        if quota:
            check(used is not None and 0 < used <= 16 << 20,
                  "flood's hot usage within its 16 MiB quota (%s)" % used)
            check(quota_g == 16 << 20, "quota gauge = 16 MiB (%s)" % quota_g)
        else:
            check(used is not None and used > 16 << 20, "baseline: flood holds more (%s)" % used)
            check(quota_g == 0, "no quota: gauge 0")
        check(qdocs_g == QUIET_DOCS, "quiet's document gauge (%s)" % qdocs_g)
        quiet.close()
        flood.close()
        return ok, hot, present, flood_hot, evictions


def part_noisy():
    t0 = time.monotonic()
    ok, hot_base, _, _, ev_base = noisy_neighbour(False)
    check(ok == FLOOD_DOCS, "baseline: every flood put succeeds")
    check(hot_base < 0.5, "baseline shows the problem: quiet's hot hit rate fell to %.2f "
          "without a quota" % hot_base)
    ok, hot_q, present, _, ev = noisy_neighbour(True)
    check(ok == FLOOD_DOCS, "with a quota every flood put still succeeds (%d/%d)"
          % (ok, FLOOD_DOCS))
    check(hot_q == 1.0, "with max_hot_bytes on flood, quiet keeps a 100%% hot hit rate (%.2f)"
          % hot_q)
    check(present, "quiet's documents all present")
    check(ev is not None and ev >= FLOOD_DOCS - 4,
          "flood evicted its own documents (%s quota evictions)" % ev)
    sys.stderr.write("noisy neighbour: quiet hot hit rate %.2f without quota, %.2f with "
                     "(%.1f s)\n" % (hot_base, hot_q, time.monotonic() - t0))


def part_quota_refusals():
    args = H.ITEST_ARGS + HOT + tenant("small", max_hot_bytes="4MiB", max_docs=3)
    with H.Daemon(args) as d:
        d.start()
        c = lazykv.Client(d.addr, token=TOK["small"], timeout=20)
        toks, blocks = H.make_doc(S, 77, 40)  # 3 blocks = 3 pages = 6 MiB > 4 MiB.
        try:
            c.put(S.profile, toks, blocks)
            err = None
        except lazykv.LazyKVError as e:
            err = e
        check(isinstance(err, lazykv.ResourceExhausted) and err.lkv_code == "LKV_EQUOTA"
              and "max_hot_bytes" in err.details,
              "a document larger than max_hot_bytes: RESOURCE_EXHAUSTED LKV_EQUOTA naming the "
              "quota (%r)" % (err,))
        docs = []
        for i in range(5):
            toks, blocks = H.make_doc(S, 300 + i, 10)  # 1 page each.
            c.put(S.profile, toks, blocks)
            docs.append(lazykv.Doc(S.profile, toks))
            time.sleep(0.002)  # Distinct creation times.
        st = c.lookup(docs)
        check([s.present for s in st] == [False, False, True, True, True],
              "max_docs = 3 keeps the 3 newest (%s)" % [s.present for s in st])
        c.close()


def part_rates():
    args = H.ITEST_ARGS + HOT + tenant("rated", rate_calls=2) + tenant("quiet") + tenant(
        "bytes", rate_bytes="1KiB")
    with H.Daemon(args) as d:
        d.start()
        rated = lazykv.Client(d.addr, token=TOK["rated"], timeout=10)
        quiet = lazykv.Client(d.addr, token=TOK["quiet"], timeout=10)
        doc = lazykv.Doc(S.profile, H.make_doc(S, 1, 10)[0])
        refused, served, quiet_refused = [], 0, 0
        t0 = time.monotonic()
        for _ in range(12):
            try:
                rated.lookup([doc])
                served += 1
            except lazykv.ResourceExhausted as e:
                refused.append(e)
            try:
                quiet.lookup([doc])
            except lazykv.LazyKVError:
                quiet_refused += 1
        elapsed = time.monotonic() - t0
        # A bucket of 2 refilled at 2/s: at most 2 + 2 * elapsed calls pass (+1 for rounding).
        check(2 <= served <= 3 + 2 * elapsed and len(refused) >= 1,
              "burst: %d served, %d refused in %.2f s (bucket 2, 2/s)"
              % (served, len(refused), elapsed))
        check(quiet_refused == 0, "the other tenant is never throttled")
        e = refused[0] if refused else None
        check(e is not None and e.lkv_code == "LKV_ERATE" and "rate_calls" in e.details
              and e.retry_after is not None and 0 < e.retry_after <= 1.0,
              "refusal: LKV_ERATE, names rate_calls, retry-after in (0, 1] s (%r, %s)"
              % (e, e.retry_after if e else None))
        if e is not None and e.retry_after:
            time.sleep(e.retry_after + 0.05)
            try:
                rated.lookup([doc])
                again = True
            except lazykv.LazyKVError:
                again = False
            check(again, "served again after waiting retry_after")
        thr = metric(d, "lazykv_tenant_throttled_total", tenant="rated")
        check(thr == len(refused), "lazykv_tenant_throttled_total counts the refusals (%s)" % thr)
        # Byte rate: 1 KiB/s; a 2-block document carries 4 KiB of payload, more than the whole
        # bucket: the first passes on a full bucket, the next must wait a full second.
        b = lazykv.Client(d.addr, token=TOK["bytes"], timeout=10)
        outcomes = []
        for i in range(2):
            toks, blocks = H.make_doc(S, 900 + i, 32)
            try:
                b.put(S.profile, toks, blocks)
                outcomes.append("ok")
            except lazykv.ResourceExhausted as e:
                outcomes.append(e)
        errs = [o for o in outcomes if o != "ok"]
        check(outcomes[0] == "ok" and errs and errs[0].lkv_code == "LKV_ERATE"
              and "rate_bytes" in errs[0].details and 0 < errs[0].retry_after <= 1.01,
              "rate_bytes: the first put drains the 1 KiB bucket, the next is refused naming "
              "rate_bytes with a retry within 1 s (%s)" % outcomes)
        for c in (rated, quiet, b):
            c.close()


def main():
    t0 = time.monotonic()
    part_noisy()
    part_quota_refusals()
    part_rates()
    sys.stderr.write("test_quota: %.1f s\n" % (time.monotonic() - t0))
    if failures:
        sys.stderr.write("%d check(s) failed\n" % len(failures))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
