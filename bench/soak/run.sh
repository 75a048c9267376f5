#!/usr/bin/env bash
# bench/soak/run.sh [soak args...]: builds lazykvd and soak (BUILD_DIR, default build/), starts
# lazykvd on 127.0.0.1:0 in a temp dir with the "itest" shape as profile itest, runs soak
# against it (default 64 clients, 180 s), stops it with SIGTERM. JSON: bench/out/soak.json,
# daemon log: bench/out/soak-lazykvd.log. Example: bench/soak/run.sh --seconds 60 --window 10
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build}
cmake --build "$build" -j2 --target lazykvd soak >/dev/null
mkdir -p bench/out
dir=$(mktemp -d /tmp/lkv-soak-XXXXXX)
log=bench/out/soak-lazykvd.log
"$build/bin/lazykvd" --set listen=127.0.0.1:0 --set data_dir="$dir/data" --set hot_backend=host \
    --set hot_bytes=256MiB --set threads="${THREADS:-2}" \
    --set profile.itest.n_layers=2 --set profile.itest.n_q_heads=4 \
    --set profile.itest.n_kv_heads=2 --set profile.itest.head_dim=8 \
    --set profile.itest.dtype=f16 --set profile.itest.block_tokens=16 \
    --set profile.itest.vocab_size=1000 >"$dir/out" 2>"$log" &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 200); do
    grep -q "lazykvd listening on" "$dir/out" 2>/dev/null && break
    sleep 0.05
done
addr=$(sed -n 's/^lazykvd listening on //p' "$dir/out")
[ -n "$addr" ] || { echo "lazykvd did not start"; tail "$log"; exit 1; }
echo "soak: lazykvd pid $pid on $addr; $(date -u +%FT%TZ); load $(cut -d' ' -f1-3 /proc/loadavg)"
rc=0
"$build/bin/soak" --target "$addr" --pid "$pid" --json bench/out/soak.json "$@" || rc=$?
kill -TERM $pid
wait $pid || true
echo "soak: done, exit $rc; load $(cut -d' ' -f1-3 /proc/loadavg)"
exit $rc
