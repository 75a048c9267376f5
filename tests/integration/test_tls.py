"""test_tls.py: gRPC TLS of the real lazykvd, with certificates this test makes with openssl.

  1. A TLS daemon serves a client that trusts its CA (Health, and Stats with a tenant token, over
     the lazykv Python package's tls_ca option); a plaintext client and a client trusting
     another CA both fail to connect (UNAVAILABLE), and nothing is served in clear text.
  2. Certificate reload without a restart: the certificate and key files are replaced in place
     by ones from a second CA (write + rename, as certbot and cert-manager do). The next new
     connection presents the new certificate (a client trusting only the new CA connects, one
     trusting only the old CA no longer does), while a channel opened before keeps working.
     A half-written (garbage) certificate, an expired one, and a key that does not match are
     each logged and the current certificate stays in service; a SIGHUP then reports the next
     good file at once. A daemon given an expired certificate at start exits 2 naming it.
  3. Client certificates: with tls_client_ca_file set, a client without a certificate, or with
     one from another CA, is refused at the handshake; one with a certificate from that CA is
     served; the lazykv CLI does the same with --tls-ca/--tls-cert/--tls-key, and so does the
     decode worker (lazykv-worker --tls-*, or LAZYKV_TLS_* as the Kubernetes sidecar sets
     them): a miss it stores over TLS is a hit on the next run, and without TLS options it
     fails with a clear error.
  4. Bearer tokens over plaintext from a non-loopback peer are refused (UNAUTHENTICATED, and the
     message says to use TLS) unless allow_plaintext_tokens is set; over TLS from the same peer
     they are accepted. Skipped (reported) if the host has no non-loopback address.
  5. gRPC's limits on a TLS port (issue 12): with tls_handshake_timeout=1s a connection that
     never starts its handshake is closed by the daemon after about 1 s (gRPC's default would
     hold it 120 s), and a real TLS client is still served.
"""
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import certs

import lazykv  # noqa: E402  (<build>/python on PYTHONPATH: the package and its stubs)
import harness as H  # noqa: E402
from harness import grpc, health_pb2  # noqa: E402

TOKEN = "lkv_tls_tenant_token_for_tests_0001"
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        sys.stderr.write("FAIL: %s\n" % what)


def tenant_args(name="alice", token=TOKEN, roles="data,admin"):
    h = hashlib.blake2b(b"lazykv-token-v1:" + token.encode(), digest_size=32).hexdigest()
    return ["--set", "tenant.%s.token_hash=blake2b:%s" % (name, h),
            "--set", "tenant.%s.roles=%s" % (name, roles)]


def health_raw(channel, wait=5.0):
    """True if Health answers SERVING on channel within wait seconds (scaled on slow hosts)."""
    wait = H.timeout(wait)
    stub = channel.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                               response_deserializer=health_pb2.HealthCheckResponse.FromString)
    try:
        return stub(health_pb2.HealthCheckRequest(service=""), timeout=wait).status == 1
    except grpc.RpcError:
        return False


def tls_channel(addr, ca_pem, cert_pem=None, key_pem=None):
    creds = grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key_pem,
                                         certificate_chain=cert_pem)
    return grpc.secure_channel(addr, creds)


def metrics(d):
    """{name: value} of the unlabelled samples of d's /metrics."""
    with urllib.request.urlopen("http://%s/metrics" % d.metrics_addr, timeout=5) as r:
        text = r.read().decode()
    return {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines()
            if ln and not ln.startswith("#") and "{" not in ln}


def wait_log(d, text, deadline_s=5.0):
    end = time.monotonic() + H.timeout(deadline_s)
    while time.monotonic() < end:
        with open(d.log_path, "rb") as f:
            if text.encode() in f.read():
                return True
        time.sleep(0.05)
    return False


def part_basic_and_reload(tmp):
    ca1, _ = certs.make_ca(tmp, "ca1")
    ca2, _ = certs.make_ca(tmp, "ca2")
    a_pem, a_key = certs.make_cert(tmp, "server-a", "ca1")
    b_pem, b_key = certs.make_cert(tmp, "server-b", "ca2")
    x_pem, x_key = certs.make_cert(tmp, "server-x", "ca1", expired=True)
    live_pem, live_key = os.path.join(tmp, "live.pem"), os.path.join(tmp, "live.key")
    certs.replace(a_pem, live_pem)
    certs.replace(a_key, live_key)
    # Expired at start: exit 2 with the reason.
    with H.Daemon(["--set", "tls_cert_file=" + x_pem, "--set", "tls_key_file=" + x_key]) as d:
        try:
            d.start()
            check(False, "an expired certificate at start is refused")
        except RuntimeError:
            with open(d.log_path, "rb") as f:
                log = f.read().decode("utf-8", "replace")
            check("status 2" in str(sys.exc_info()[1]) and "has expired" in log,
                  "expired certificate at start: exit 2 naming the reason")
    args = ["--set", "tls_cert_file=" + live_pem, "--set", "tls_key_file=" + live_key,
            "--set", "metrics_listen=127.0.0.1:0"]
    with H.Daemon(args + tenant_args()) as d:
        d.start()
        check(wait_log(d, "TLS, "), "log names the TLS listener")
        check(health_raw(tls_channel(d.addr, certs.read(ca1))), "TLS client trusting ca1 served")
        check(not health_raw(d.channel(), 2.0), "plaintext client refused by a TLS listener")
        check(not health_raw(tls_channel(d.addr, certs.read(ca2)), 2.0),
              "client trusting another CA refused")
        # The Python package: TLS + token, Stats over it.
        with lazykv.Client(d.addr, token=TOKEN, tls_ca=ca1, timeout=5) as c:
            st = c.stats()
            check(st is not None, "Stats over TLS with a token")
        old = tls_channel(d.addr, certs.read(ca1))
        check(health_raw(old), "long-lived channel up before the rotation")
        # Half-written certificate: logged, the old one stays.
        with open(live_pem, "wb") as f:
            f.write(b"-----BEGIN CERTIFICATE-----\ngarbage\n")
        check(health_raw(tls_channel(d.addr, certs.read(ca1))),
              "garbage certificate file: the current certificate still serves new connections")
        check(wait_log(d, "no certificate could be parsed"), "garbage certificate is logged")
        # An expired certificate (same CA): refused, logged, the old one stays.
        certs.replace(x_key, live_key)
        certs.replace(x_pem, live_pem)
        check(health_raw(tls_channel(d.addr, certs.read(ca1))),
              "expired certificate: the current certificate still serves new connections")
        check(wait_log(d, "the certificate has expired"), "expired certificate is logged")
        # A certificate with another certificate's key: refused.
        certs.replace(a_pem, live_pem)
        check(health_raw(tls_channel(d.addr, certs.read(ca1))), "mismatched key: still served")
        check(wait_log(d, "does not match"), "mismatched key is logged")
        # Rotation: key first, then the certificate (both renamed over).
        certs.replace(b_key, live_key)
        certs.replace(b_pem, live_pem)
        os.kill(d.proc.pid, signal.SIGHUP)
        check(wait_log(d, "new TLS certificate loaded"), "SIGHUP reports the new certificate")
        check(health_raw(tls_channel(d.addr, certs.read(ca2))),
              "after rotation a client trusting only ca2 is served (new cert on new connections)")
        check(not health_raw(tls_channel(d.addr, certs.read(ca1)), 2.0),
              "after rotation a client trusting only ca1 is refused")
        check(health_raw(old), "the channel opened before the rotation keeps working")
        m = metrics(d)
        check(m.get("lazykv_tls_cert_loads_total") == 2.0,
              "metrics: 2 certificates loaded (%s)" % m.get("lazykv_tls_cert_loads_total"))
        check(m.get("lazykv_tls_cert_load_failures_total") == 3.0,
              "metrics: 3 unusable files counted (garbage, expired, wrong key) (%s)"
              % m.get("lazykv_tls_cert_load_failures_total"))
        exp = m.get("lazykv_tls_cert_not_after_timestamp_seconds", 0)
        check(time.time() + 3600 < exp < time.time() + 2 * 86400,
              "metrics: the new certificate's expiry (in about a day: %s)" % exp)
        # Without SIGHUP: rotate back; the next handshake picks it up.
        certs.replace(a_key, live_key)
        certs.replace(a_pem, live_pem)
        check(health_raw(tls_channel(d.addr, certs.read(ca1))),
              "rotation picked up at the next handshake without SIGHUP")
        old.close()


def part_client_certs(tmp):
    ca1, _ = certs.make_ca(tmp, "cca")
    other, _ = certs.make_ca(tmp, "other")
    s_pem, s_key = certs.make_cert(tmp, "srv", "cca")
    c_pem, c_key = certs.make_cert(tmp, "worker-1", "cca", client=True)
    o_pem, o_key = certs.make_cert(tmp, "intruder", "other", client=True)
    args = ["--set", "tls_cert_file=" + s_pem, "--set", "tls_key_file=" + s_key,
            "--set", "tls_client_ca_file=" + ca1]
    with H.Daemon(args) as d:
        d.start()
        ca = certs.read(ca1)
        check(not health_raw(tls_channel(d.addr, ca), 2.0), "no client certificate: refused")
        check(not health_raw(tls_channel(d.addr, ca, certs.read(o_pem), certs.read(o_key)), 2.0),
              "client certificate of another CA: refused")
        check(health_raw(tls_channel(d.addr, ca, certs.read(c_pem), certs.read(c_key))),
              "client certificate of the configured CA: served")
        cli = os.environ.get("LKV_CLI_BIN")
        if cli:
            base = [cli, "--addr", d.addr, "--timeout", "5000"]
            ok = subprocess.run(base + ["--tls-ca", ca1, "--tls-cert", c_pem, "--tls-key", c_key,
                                        "stats"], capture_output=True)
            check(ok.returncode == 0, "CLI with --tls-ca/--tls-cert/--tls-key: stats works "
                  "(rc %d: %s)" % (ok.returncode, ok.stderr.decode()[-300:]))
            env = dict(os.environ, LAZYKV_TLS_CA=ca1, LAZYKV_TLS_CERT=c_pem, LAZYKV_TLS_KEY=c_key)
            ok = subprocess.run(base + ["stats"], capture_output=True, env=env)
            check(ok.returncode == 0, "CLI with LAZYKV_TLS_* from the environment")
            bad = subprocess.run(base + ["--tls-ca", ca1, "stats"], capture_output=True)
            check(bad.returncode != 0, "CLI without a client certificate fails")
        worker = os.environ.get("LKV_WORKER_BIN")
        if worker:
            md = os.environ["LKV_MODEL_DIR"]
            wbase = [worker, "--daemon", d.addr, "--model", md + "/stories260K.bin",
                     "--tokenizer", md + "/tok512.bin", "--doc", "Lily had a big red ball.",
                     "--question", "Once upon a time", "--max-tokens", "8", "--json",
                     "--deadline-ms", "5000", "--threads", "1"]
            runs = []
            for k in range(2):
                env = dict(os.environ)
                tls_args = ["--tls-ca", ca1, "--tls-cert", c_pem, "--tls-key", c_key]
                if k == 1:  # The sidecar's way: the environment.
                    tls_args = []
                    env.update(LAZYKV_TLS_CA=ca1, LAZYKV_TLS_CERT=c_pem, LAZYKV_TLS_KEY=c_key)
                r = subprocess.run(wbase + tls_args, capture_output=True, env=env, timeout=60)
                out = [json.loads(ln) for ln in r.stdout.decode().splitlines() if ln.strip()]
                runs.append(out[0] if r.returncode == 0 and out else {})
                check(r.returncode == 0 and out and out[0].get("ok"),
                      "worker over TLS, run %d (rc %d: %s)"
                      % (k, r.returncode, r.stderr.decode()[-300:]))
            check(runs[0].get("miss_docs") == 1 and runs[1].get("hit_docs") == 1 and
                  not runs[0].get("local_only") and runs[0].get("tokens") == runs[1].get("tokens"),
                  "worker over TLS: the miss it stored is a hit next time, same tokens (%s / %s)"
                  % ({k: runs[0].get(k) for k in ("miss_docs", "local_only")},
                     {k: runs[1].get(k) for k in ("hit_docs", "local_only")}))
            r = subprocess.run(wbase, capture_output=True, timeout=60,
                               env={k: v for k, v in os.environ.items()
                                    if not k.startswith("LAZYKV_")})
            check(r.returncode != 0 and b"needs --tls-ca" in r.stderr + r.stdout,
                  "worker without TLS options against a TLS daemon fails clearly (rc %d: %s)"
                  % (r.returncode, (r.stderr + r.stdout).decode()[-300:]))


def non_loopback_ip():
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("192.0.2.1", 9))  # No packet is sent (UDP connect only picks a route).
        ip = s.getsockname()[0]
        s.close()
        return None if ip.startswith("127.") else ip
    except OSError:
        return None


def part_plaintext_tokens(tmp):
    ip = non_loopback_ip()
    if ip is None:
        sys.stderr.write("NOTE: no non-loopback address; plaintext-token checks skipped\n")
        return
    ca, _ = certs.make_ca(tmp, "pca")
    s_pem, s_key = certs.make_cert(tmp, "psrv", "pca", sans=["IP:" + ip])
    for allow in (False, True):
        args = ["--set", "listen=0.0.0.0:0"] + tenant_args() + [
            "--set", "allow_plaintext_tokens=%s" % ("true" if allow else "false")]
        with H.Daemon(args) as d:
            d.start()
            port = d.addr.rsplit(":", 1)[1]
            with lazykv.Client("%s:%s" % (ip, port), token=TOKEN, timeout=5) as c:
                try:
                    c.stats()
                    got = None
                except lazykv.LazyKVError as e:
                    got = e
            if allow:
                check(got is None, "allow_plaintext_tokens=true: token accepted in clear text "
                      "(%s)" % got)
            else:
                check(isinstance(got, lazykv.errors.Unauthenticated) and "TLS" in got.details,
                      "token over plaintext from %s refused with a message naming TLS (%r)"
                      % (ip, got))
    args = ["--set", "listen=0.0.0.0:0", "--set", "tls_cert_file=" + s_pem,
            "--set", "tls_key_file=" + s_key] + tenant_args()
    with H.Daemon(args) as d:
        d.start()
        port = d.addr.rsplit(":", 1)[1]
        with lazykv.Client("%s:%s" % (ip, port), token=TOKEN, tls_ca=ca, timeout=5) as c:
            try:
                c.stats()
                ok = True
            except lazykv.LazyKVError as e:
                ok = False
                sys.stderr.write("stats over TLS from %s: %s\n" % (ip, e))
            check(ok, "the same token over TLS from a non-loopback peer is accepted")


def part_handshake_timeout(tmp):
    ca, _ = certs.make_ca(tmp, "hca")
    pem, key = certs.make_cert(tmp, "server-h", "hca")
    args = ["--set", "tls_cert_file=" + pem, "--set", "tls_key_file=" + key,
            "--set", "tls_handshake_timeout=1s"]
    with H.Daemon(args) as d:
        d.start()
        host, port = d.addr.rsplit(":", 1)
        silent = [socket.create_connection((host.strip("[]"), int(port)), timeout=H.timeout(10))
                  for _ in range(3)]
        t0 = time.monotonic()
        closed = 0
        for s in silent:
            try:
                closed += s.recv(1) == b""
            except (ConnectionResetError, socket.timeout):
                pass
            s.close()
        took = time.monotonic() - t0
        check(closed == 3, "silent connections closed by the daemon (%d of 3)" % closed)
        check(0.7 <= took <= H.timeout(6.0),
              "closed at the handshake timeout (1 s), after %.2f s" % took)
        check(health_raw(tls_channel(d.addr, certs.read(ca))),
              "a TLS client is served with tls_handshake_timeout set")


def main():
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="lkv-tls-")
    for part in (part_basic_and_reload, part_client_certs, part_plaintext_tokens,
                 part_handshake_timeout):
        t1 = time.monotonic()
        part(tmp)
        sys.stderr.write("%s: %.1f s\n" % (part.__name__, time.monotonic() - t1))
    sys.stderr.write("test_tls: %.1f s\n" % (time.monotonic() - t0))
    if failures:
        sys.stderr.write("%d check(s) failed\n" % len(failures))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
