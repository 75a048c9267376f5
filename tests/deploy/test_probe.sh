#!/usr/bin/env bash
# tests/deploy/test_probe.sh LAZYKVD LAZYKV: deploy.probe. The exec probe of
# deploy/k8s/lazykv.yaml (lazykv --addr 127.0.0.1:PORT ... ping, its TLS options from the
# LAZYKV_TLS_* environment) against a real lazykvd configured as a hardened pod would be: TLS
# only, client certificates required (tls_client_ca_file), a tenant table and loopback_roles =
# none (tokens required on loopback too). The probe with the pod's CA, client certificate and
# server name, and no token, passes; without TLS options, or without the client certificate, it
# fails (exit 4: no connection); a data call (stats) with the same TLS options but no token is refused (exit 5), so the
# probe passing is not tokens being off. Skips (77) without openssl.
set -uo pipefail
lazykvd=${1:?usage: test_probe.sh LAZYKVD LAZYKV}
lazykv=${2:?usage: test_probe.sh LAZYKVD LAZYKV}
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v openssl >/dev/null || { echo "SKIP: no openssl"; exit 77; }
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
cd "$tmp" || exit 1
kg="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
openssl req -x509 $kg -keyout ca.key -out ca.crt -days 2 -subj /CN=lazykv-ca 2>/dev/null || exit 1
# The pod's certificate: names of the Services, usable for server and client auth.
openssl req $kg -keyout tls.key -out tls.csr -subj /CN=lazykv 2>/dev/null || exit 1
printf 'subjectAltName=DNS:lazykv,DNS:lazykv-peers\nextendedKeyUsage=serverAuth,clientAuth\n' > ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tls.crt -days 1 \
    -extfile ext 2>/dev/null || exit 1
chmod 600 ./*.key
mkdir -m 700 data
cat > lazykvd.conf <<CONF
listen = 127.0.0.1:0
data_dir = $tmp/data
hot_bytes = 16MiB
tls_cert_file = $tmp/tls.crt
tls_key_file = $tmp/tls.key
tls_client_ca_file = $tmp/ca.crt
loopback_roles = none
[tenant rag]
token_hash = blake2b:0000000000000000000000000000000000000000000000000000000000000000
roles = data
CONF
"$lazykvd" --config lazykvd.conf > out 2> err &
pid=$!
for _ in $(seq 100); do grep -q 'listening on' out && break; sleep 0.1; done
addr=$(sed -n 's/^lazykvd listening on //p' out)
[ -n "$addr" ] || { echo "FAIL: lazykvd did not start"; cat err; exit 1; }
port=${addr##*:}
# The probe's command line, as in the manifest (but the port).
probe=$(grep -m1 -o '"/opt/lazykv/bin/lazykv", "--addr", "127.0.0.1:7070", "--timeout", "[0-9]*", "ping"' \
    "$root/deploy/k8s/lazykv.yaml")
[ -n "$probe" ] || { echo "FAIL: no exec probe of lazykv ping on 127.0.0.1:7070 in lazykv.yaml"; exit 1; }
run_probe() { # ENV... : runs the probe with only ENV in its environment; prints its exit code
    env -i "$@" "$lazykv" --addr "127.0.0.1:$port" --timeout 2000 ping > /dev/null 2>&1
    echo $?
}
tls=(LAZYKV_TLS_CA="$tmp/ca.crt" LAZYKV_TLS_CERT="$tmp/tls.crt" LAZYKV_TLS_KEY="$tmp/tls.key"
     LAZYKV_TLS_SERVER_NAME=lazykv)
fail=0
check() { # WHAT WANT GOT
    if [ "$2" = "$3" ]; then echo "ok: $1 (exit $3)"; else echo "FAIL: $1: exit $3, want $2"; fail=1; fi
}
check "probe with the pod's TLS options, no token" 0 "$(run_probe "${tls[@]}")"
# The ConfigMap's defaults (empty values) mean plaintext: refused by a TLS-only listener.
check "probe with empty LAZYKV_TLS_* (plaintext)" 4 \
    "$(run_probe LAZYKV_TLS_CA= LAZYKV_TLS_CERT= LAZYKV_TLS_KEY= LAZYKV_TLS_SERVER_NAME=)"
check "probe without the client certificate" 4 \
    "$(run_probe LAZYKV_TLS_CA="$tmp/ca.crt" LAZYKV_TLS_SERVER_NAME=lazykv)"
env -i "${tls[@]}" "$lazykv" --addr "127.0.0.1:$port" --timeout 2000 stats > /dev/null 2>&1
check "stats over TLS without a token" 5 $?
exit $fail
