"""opsbench.py: what issue 13's operations features cost on the request path, against a
baseline measured in the same run.

Each configuration is its own real lazykvd (tests/integration/harness.py) on loopback; one
lazykv.Client (grpcio, one channel) makes N sequential Lookup calls of one stored document as
a tenant with a token, after a warm-up. Configurations:
  plain          plaintext, tenant without rates             (the baseline)
  rate           plaintext, tenant with rate_calls = 10^9     (a token bucket charged per call)
  quota          plaintext, tenant with max_hot_bytes          (Puts only: measured on Put)
  tls            TLS listener (EC P-256 certificate), same tenant
  tls_client     TLS with a required client certificate
plus the cost of one GET /metrics of the baseline daemon (median of 50 scrapes) and of a new
connection (connect, handshake, first call). All daemons run at once and the rounds interleave
the configurations, so the shared machine's drift hits all alike; the table shows each
configuration's best round (the JSON also has the medians).
Prints a table and writes JSON (bench/out/opsbench.json, or the path given as argv[1]).
Run: PYTHONPATH=build/python:tests/integration LKV_DAEMON_BIN=build/bin/lazykvd \\
     /usr/bin/python3 bench/ops/opsbench.py
"""
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "integration"))
import certs  # noqa: E402
import lazykv  # noqa: E402
import harness as H  # noqa: E402

N = int(os.environ.get("OPSBENCH_N", "6000"))
ROUNDS = int(os.environ.get("OPSBENCH_ROUNDS", "12"))
TOKEN = "lkv_opsbench_tenant_token_000000001"
S = H.ITEST


def tenant(**limits):
    h = hashlib.blake2b(b"lazykv-token-v1:" + TOKEN.encode(), digest_size=32).hexdigest()
    out = ["--set", "tenant.t.token_hash=blake2b:%s" % h, "--set", "tenant.t.roles=data,admin"]
    for k, v in limits.items():
        out += ["--set", "tenant.t.%s=%s" % (k, v)]
    return out


def lookups(client, doc, n):
    for _ in range(200):
        client.lookup([doc])
    t = time.perf_counter()
    for _ in range(n):
        client.lookup([doc])
    return (time.perf_counter() - t) / n * 1e6


def puts(client, n, base):
    t = time.perf_counter()
    for i in range(n):
        toks, blocks = H.make_doc(S, base + i, 16)
        client.put(S.profile, toks, blocks)
    return (time.perf_counter() - t) / n * 1e6


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join("bench", "out", "opsbench.json")
    tmp = tempfile.mkdtemp(prefix="lkv-opsbench-")
    ca, _ = certs.make_ca(tmp, "ca")
    s_pem, s_key = certs.make_cert(tmp, "srv", "ca")
    c_pem, c_key = certs.make_cert(tmp, "cli", "ca", client=True)
    tls = ["--set", "tls_cert_file=" + s_pem, "--set", "tls_key_file=" + s_key]
    configs = [
        ("plain", tenant(), {}),
        ("rate", tenant(rate_calls=10 ** 9), {}),
        ("quota", tenant(max_hot_bytes="1GiB"), {}),
        ("tls", tenant() + tls, {"tls_ca": ca}),
        ("tls_client", tenant() + tls + ["--set", "tls_client_ca_file=" + ca],
         {"tls_ca": ca, "tls_cert": c_pem, "tls_key": c_key}),
    ]
    rows, extra, daemons = [], {}, []
    try:
        for name, args, copts in configs:
            more = ["--set", "metrics_listen=127.0.0.1:0"] if name == "plain" else []
            d = H.Daemon(H.ITEST_ARGS + args + more)
            daemons.append(d)
            d.start()
            c = lazykv.Client(d.addr, token=TOKEN, timeout=30, **copts)
            toks, blocks = H.make_doc(S, 1, 40)
            c.put(S.profile, toks, blocks)
            rows.append({"config": name, "d": d, "c": c, "copts": copts,
                         "doc": lazykv.Doc(S.profile, toks), "l": [], "p": [], "n": []})
        # Rounds interleave the configurations, so drift of the shared machine hits all alike;
        # each figure is the median over the rounds.
        for rnd in range(ROUNDS):
            for r in rows:
                r["l"].append(lookups(r["c"], r["doc"], N // ROUNDS))
                r["p"].append(puts(r["c"], 40, 10000 + 1000 * rnd))
                t = time.perf_counter()
                with lazykv.Client(r["d"].addr, token=TOKEN, timeout=30, **r["copts"]) as c2:
                    c2.lookup([r["doc"]])
                r["n"].append((time.perf_counter() - t) * 1e3)
        d = rows[0]["d"]
        lat = []
        for _ in range(50):
            t = time.perf_counter()
            with urllib.request.urlopen("http://%s/metrics" % d.metrics_addr) as resp:
                body = resp.read()
            lat.append((time.perf_counter() - t) * 1e3)
        extra = {"scrape_ms_median": statistics.median(lat), "scrape_bytes": len(body),
                 "scrape_samples": sum(1 for ln in body.decode().splitlines()
                                       if ln and not ln.startswith("#"))}
    finally:
        for r in rows:
            r["c"].close()
        for d in daemons:
            d.cleanup()
    # The best round estimates the cost on a quiet machine (the shared host adds only delays);
    # the median is kept in the JSON too.
    rows = [{"config": r["config"], "lookup_us": min(r["l"]), "put_us": min(r["p"]),
             "new_connection_ms": min(r["n"]), "lookup_us_median": statistics.median(r["l"]),
             "put_us_median": statistics.median(r["p"]),
             "new_connection_ms_median": statistics.median(r["n"]), "rounds": ROUNDS}
            for r in rows]
    base = rows[0]
    print("opsbench: %d sequential Lookups and %d Puts per config in %d interleaved rounds; best "
          "round (median in the JSON); Python grpcio client, loopback" % (N, 40 * ROUNDS, ROUNDS))
    print("%-11s %10s %8s %10s %8s %14s" % ("config", "lookup us", "vs plain", "put us",
                                          "vs plain", "new conn ms"))
    for r in rows:
        print("%-11s %10.1f %+7.1f%% %10.1f %+7.1f%% %14.2f" % (
            r["config"], r["lookup_us"], 100 * (r["lookup_us"] / base["lookup_us"] - 1),
            r["put_us"], 100 * (r["put_us"] / base["put_us"] - 1), r["new_connection_ms"]))
    print("GET /metrics: %.2f ms median, %d bytes, %d samples" % (
        extra["scrape_ms_median"], extra["scrape_bytes"], extra["scrape_samples"]))
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    with open(out_path, "w") as f:
        json.dump({"n": N, "rows": rows, "metrics": extra,
                   "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, f, indent=1)
    print("wrote", out_path)


if __name__ == "__main__":
    main()
