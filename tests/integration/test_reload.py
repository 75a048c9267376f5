"""test_reload.py: SIGHUP re-reads the config of the real lazykvd without a restart.

Each step rewrites the --config file, sends SIGHUP, waits for the log's verdict and checks the
daemon's behaviour through the lazykv Python package (the process id never changes):
  1. a changed token: the old token is refused (UNAUTHENTICATED), the new one accepted, and the
     tenant's documents are still its own (same salt: a Lookup by the new token hits);
  2. tenants added and removed: the new tenant is served, the removed one's token refused;
     roles changed live (admin taken away: Stats PERMISSION_DENIED);
  3. an option that cannot change live (hot_bytes) is named in the log with "restart", and the
     rest of the reload still applies;
  4. a config that does not parse, and one that changes a tenant's salt, are refused with a log
     line naming the problem, and nothing changes (the current tokens keep working);
  5. log_level changes live.
"""
import hashlib
import os
import signal
import sys
import time
import urllib.request

import lazykv
import harness as H

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        sys.stderr.write("FAIL: %s\n" % what)


def section(name, token, roles="data,admin", salt=None):
    h = hashlib.blake2b(b"lazykv-token-v1:" + token.encode(), digest_size=32).hexdigest()
    s = "[tenant %s]\ntoken_hash = blake2b:%s\nroles = %s\n" % (name, h, roles)
    if salt:
        s += "salt = %s\n" % salt
    return s


def write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


class Log:
    def __init__(self, d):
        self.d, self.off = d, 0

    def wait(self, *needles, secs=10):
        """Waits for a new log line holding any needle; returns it (or None)."""
        end = time.monotonic() + H.timeout(secs)
        while time.monotonic() < end:
            with open(self.d.log_path, "rb") as f:
                f.seek(self.off)
                data = f.read().decode("utf-8", "replace")
            for i, line in enumerate(data.splitlines(True)):
                if any(n in line for n in needles) and line.endswith("\n"):
                    self.off += len("".join(data.splitlines(True)[:i + 1]).encode())
                    return line
            time.sleep(0.05)
        return None

    def since(self):
        with open(self.d.log_path, "rb") as f:
            f.seek(self.off)
            return f.read().decode("utf-8", "replace")


def hup(d, log):
    """SIGHUP; returns the verdict line; log.last holds every line the reload logged."""
    start = log.off
    os.kill(d.proc.pid, signal.SIGHUP)
    line = log.wait("reload done", "reload refused")
    with open(d.log_path, "rb") as f:
        f.seek(start)
        log.last = f.read(log.off - start).decode("utf-8", "replace")
    return line


def outcome(fn):
    try:
        fn()
        return "ok"
    except lazykv.LazyKVError as e:
        return type(e).__name__


def main():
    t0 = time.monotonic()
    S = H.ITEST
    tok_a1, tok_a2, tok_b, tok_c = ("lkv_reload_alice_one_000000000001", "lkv_reload_alice_two_00000000002",
                                    "lkv_reload_bob_000000000000000003", "lkv_reload_carol_0000000000000004")
    d = H.Daemon(H.ITEST_ARGS)
    cfg = os.path.join(d.dir, "lazykvd.conf")
    base = "log_level = info\nthreads = 2\n"
    write(cfg, base + section("alice", tok_a1) + section("bob", tok_b))
    with d:
        d.start(["--config", cfg] + H.ITEST_ARGS + ["--set", "metrics_listen=127.0.0.1:0"])
        pid = d.proc.pid
        log = Log(d)
        toks, blocks = H.make_doc(S, 7, 40)
        doc = lazykv.Doc(S.profile, toks)
        with lazykv.Client(d.addr, token=tok_a1, timeout=10) as c:
            c.put(S.profile, toks, blocks)

        def lookup(tok):
            with lazykv.Client(d.addr, token=tok, timeout=10) as c:
                return c.lookup([doc])[0].present

        def stats(tok):
            with lazykv.Client(d.addr, token=tok, timeout=10) as c:
                c.stats()

        check(lookup(tok_a1), "alice (token 1) sees her document")
        # 1. Token changed.
        write(cfg, base + section("alice", tok_a2) + section("bob", tok_b))
        line = hup(d, log)
        check(line is not None and "reload done" in line, "reload 1 applied (%r)" % line)
        check(outcome(lambda: lookup(tok_a1)) == "Unauthenticated", "old token refused")
        check(outcome(lambda: lookup(tok_a2)) == "ok" and lookup(tok_a2),
              "new token accepted and alice's document is still hers")
        # 2. Tenants added / removed, roles changed.
        write(cfg, base + section("alice", tok_a2, roles="data") + section("carol", tok_c))
        line = hup(d, log)
        check(line is not None and "reload done" in line, "reload 2 applied")
        check(outcome(lambda: lookup(tok_c)) == "ok", "new tenant carol served")
        check(outcome(lambda: lookup(tok_b)) == "Unauthenticated", "removed tenant bob refused")
        check(outcome(lambda: stats(tok_a2)) == "PermissionDenied", "alice lost admin live")
        check("tenant bob removed" in log.last and "tenant carol added" in log.last,
              "log names the removal and the addition")
        with lazykv.Client(d.addr, timeout=10) as op:  # The operator: anonymous on loopback.
            entries = op.stats().entries
        check(("tenants", "carol.hits") in entries and ("tenants", "alice.misses") in entries,
              "the operator's Stats lists the tenant added live (%s)"
              % sorted(k for k in entries if k[0] == "tenants"))
        # 3. A restart-only option.
        write(cfg, base.replace("threads = 2", "threads = 3")
              + section("alice", tok_a2, roles="data,admin") + section("carol", tok_c))
        line = hup(d, log)
        text = log.last
        check(line is not None and "reload done" in line, "reload 3 applied")
        check("'threads'" in text and "restart" in text,
              "log names threads as needing a restart (%r)" % text[-600:])
        check(outcome(lambda: stats(tok_a2)) == "ok", "alice's admin role is back (same reload)")
        # 4a. A config that does not parse: refused, nothing changes.
        write(cfg, base + "no_such_option = 1\n" + section("alice", tok_a1))
        line = hup(d, log)
        check(line is not None and "reload refused" in line and "no_such_option" in line,
              "unparseable config refused, naming the option (%r)" % line)
        check(outcome(lambda: lookup(tok_a2)) == "ok", "tokens unchanged after a refused reload")
        check(outcome(lambda: lookup(tok_a1)) == "Unauthenticated", "... old token still out")
        # 4b. A changed salt: refused.
        write(cfg, base + section("alice", tok_a2, salt="ab" * 32) + section("carol", tok_c))
        line = hup(d, log)
        check(line is not None and "reload refused" in line and "salt" in line,
              "salt change refused, naming it (%r)" % line)
        check(outcome(lambda: lookup(tok_c)) == "ok", "carol still served after refusal")
        # 5. log_level live: at warn, a refused call (logged at info) leaves no line; back at
        # info, the same refusal is logged again.
        full = base + section("alice", tok_a2, roles="data,admin") + section("carol", tok_c)
        write(cfg, full.replace("log_level = info", "log_level = warn"))
        start = log.off
        os.kill(d.proc.pid, signal.SIGHUP)
        time.sleep(0.3 * H.SCALE)  # The reload logs nothing at warn; give it time to apply.
        check(outcome(lambda: lookup("lkv_wrong_token_at_warn_level_0001")) == "Unauthenticated",
              "wrong token refused at warn")
        write(cfg, full)
        line = hup(d, log)
        check(line is not None and "reload done" in line, "back to info")
        with open(d.log_path, "rb") as f:
            f.seek(start)
            quiet = f.read().decode("utf-8", "replace")
        check("reload done" in quiet and
              "refused /lazykv.v1.Cache/Lookup" not in quiet.split("reload done")[0],
              "at log_level = warn the info-level refusal was not logged")
        check(outcome(lambda: lookup("lkv_wrong_token_at_info_level_0002")) == "Unauthenticated",
              "wrong token refused at info")
        check(log.wait("refused /lazykv.v1.Cache/Lookup", secs=5) is not None,
              "at info the refusal is logged again")
        check(d.proc.pid == pid and d.proc.poll() is None, "same process throughout")
        m = {}
        with urllib.request.urlopen("http://%s/metrics" % d.metrics_addr, timeout=5) as r:
            for ln in r.read().decode().splitlines():
                if ln and not ln.startswith("#"):
                    m[ln.rsplit(" ", 1)[0]] = float(ln.rsplit(" ", 1)[1])
        check(m.get('lazykv_config_reloads_total{result="applied"}') == 5
              and m.get('lazykv_config_reloads_total{result="refused"}') == 2
              and m.get("lazykv_config_last_reload_successful") == 1,
              "reload metrics: 5 applied, 2 refused, last one applied (%s)"
              % {k: v for k, v in m.items() if "reload" in k})
    sys.stderr.write("test_reload: %.1f s\n" % (time.monotonic() - t0))
    if failures:
        sys.stderr.write("%d check(s) failed\n" % len(failures))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
