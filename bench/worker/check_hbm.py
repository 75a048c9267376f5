#!/usr/bin/env python3
"""bench/worker/check_hbm.py: checks a worker run against lazykvd's arena (run_gpu.sh step 4).

    check_hbm.py LOCAL.jsonl DAEMON.jsonl WHAT [--stats STDERR] [--placement NAME] [--kvfile F KEY]

LOCAL.jsonl: the requests run locally (no daemon) with --hash-kv: the reference tokens and the
BLAKE2b-64 of each document's KV as computed. DAEMON.jsonl: the same requests TWICE in one worker
process against the daemon (--hash-kv): pass 1 computes the misses straight into reserved arena
pages and commits them, pass 2 reads every document in place. Checks:
  - every request's tokens equal the local ones, in both passes;
  - pass 2: every document is a hit;
  - every document seen in the arena (page0 >= 0) sits at ONE page list (page0, pages_hash) in
    every request that names it, and its KV read back through the mapping (kv_hash) equals the
    KV computed locally, bitwise;
  - at least one miss was written in place (inplace 1) and then read as a hit from the same pages;
  - --stats: the worker's totals line (placement, "arena mapped 1 time(s)");
  - --kvfile F KEY: a KV file written by `lazykv get KEY -o F` (the daemon's own read of its
    pages): its blocks hash to the kv_hash the worker saw for KEY.
Prints one summary line; exit 1 on any failure.
"""
import hashlib
import json
import re
import struct
import sys


def load(p):
    return [json.loads(l) for l in open(p) if l.strip()]


def main():
    a = sys.argv[1:]
    local, daemon, what = load(a[0]), load(a[1]), a[2]
    stats = placement = kvfile = kvkey = None
    i = 3
    while i < len(a):
        if a[i] == "--stats":
            stats = open(a[i + 1]).read(); i += 2
        elif a[i] == "--placement":
            placement = a[i + 1]; i += 2
        elif a[i] == "--kvfile":
            kvfile, kvkey = a[i + 1], a[i + 2]; i += 3
        else:
            raise SystemExit("check_hbm.py: unknown option " + a[i])
    n = len(local)
    bad = []
    if len(daemon) != 2 * n:
        bad.append("expected %d results, got %d" % (2 * n, len(daemon)))
    where = {}  # key -> (page0, pages_hash, kv_hash)
    inplace, rehit, hits2 = [], 0, 0
    for k, r in enumerate(daemon[:2 * n]):
        ref = local[k % n]
        if not r.get("ok") or r.get("tokens") != ref.get("tokens"):
            bad.append("%s pass %d: tokens differ from local (%s)" % (r.get("id"), k // n + 1, r.get("error", "")))
        for j, d in enumerate(r.get("docs", [])):
            key = d.get("key")
            lref = ref["docs"][j].get("kv_hash")
            if k >= n:
                hits2 += d.get("hit", 0)
                if not d.get("hit"):
                    bad.append("%s pass 2: document %d is not a hit" % (r.get("id"), j))
            if d.get("page0", -1) < 0:
                continue
            got = (d["page0"], d.get("pages_hash"), d.get("kv_hash"))
            if d.get("kv_hash") != lref:
                bad.append("%s doc %d: KV in the arena %s != local KV %s" % (r.get("id"), j, d.get("kv_hash"), lref))
            if key in where and where[key] != got:
                bad.append("%s doc %d: at pages %s, earlier %s" % (r.get("id"), j, got, where[key]))
            if key in where and d.get("hit") and key in inplace:
                rehit += 1
            where.setdefault(key, got)
            if d.get("inplace"):
                inplace.append(key)
    if not inplace:
        bad.append("no miss was computed in place")
    if inplace and rehit == 0:
        bad.append("no in-place miss was read again as a hit")
    msg = ""
    if stats is not None:
        m = re.search(r"arena mapped (\d+) time", stats)
        pm = re.search(r"worker pages (\S+)", stats)
        mapped = int(m.group(1)) if m else -1
        got_pl = pm.group(1) if pm else "?"
        msg = ", arena mapped %d time(s), worker pages %s" % (mapped, got_pl)
        if mapped != 1:
            bad.append("arena mapped %d times (want 1)" % mapped)
        if placement and got_pl not in placement.split(","):
            bad.append("placement %s, want one of %s" % (got_pl, placement))
    if kvfile:
        b = open(kvfile, "rb").read()
        nb, bb = struct.unpack_from("<I", b, 24)[0], struct.unpack_from("<Q", b, 32)[0]
        h = hashlib.blake2b(b[len(b) - nb * bb:], digest_size=8).hexdigest()
        want = where.get(kvkey, (None, None, None))[2]
        msg += ", lazykv get of %s..: %d blocks, BLAKE2b %s %s the worker's read" % (
            kvkey[:12], nb, h, "==" if h == want else "!=")
        if h != want:
            bad.append("the daemon's Get of %s hashes to %s, the worker read %s" % (kvkey, h, want))
    for x in bad[:20]:
        print("  " + x)
    print("%s: %d requests x 2 passes, tokens == local: %s; %d misses written in place, %d "
          "re-read as hits from the same pages; %d documents in the arena, KV == local "
          "bitwise: %s%s" % (what, n, "yes" if not any("tokens" in x for x in bad) else "NO",
                             len(inplace), rehit, len(where),
                             "yes" if not any("KV" in x for x in bad) else "NO", msg))
    print("%s: %s" % (what, "PASS" if not bad else "FAIL"))
    return 0 if not bad else 1


sys.exit(main())
