#!/usr/bin/env bash
# bench/inplace/run.sh: builds lazykvd and inplace_bench if needed, starts a real lazykvd (host
# arena) on a temp data dir on 127.0.0.1 port 0, runs inplace_bench against it, stops the daemon
# with SIGTERM and removes the temp dir.
#
#   bench/inplace/run.sh [inplace_bench options...]   e.g. --tokens 512 --docs 8 --reps 5
#
# Environment: BUILD_DIR (default <repo>/build), JSON (default <repo>/bench/out/inplace.json),
# HOT_BYTES (default 1GiB, all of it for the llama-3.1-8b region unless --profile says else),
# TMPDIR. The table goes to stdout; the daemon's log is kept beside the JSON.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
JSON=${JSON:-$ROOT/bench/out/inplace.json}
HOT_BYTES=${HOT_BYTES:-1GiB}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$BUILD_DIR" -j2 --target lazykvd inplace_bench >/dev/null
TMP=$(mktemp -d "${TMPDIR:-/tmp}/lkv-inplace.XXXXXX")
mkdir -p "$(dirname "$JSON")"
LOG=${JSON%.json}-lazykvd.log
DPID=
cleanup() {
    if [ -n "$DPID" ] && kill -0 "$DPID" 2>/dev/null; then
        kill -TERM "$DPID" 2>/dev/null || true
        wait "$DPID" 2>/dev/null || true
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT
# The toy profile gets a sliver; the served model the rest.
"$BUILD_DIR/bin/lazykvd" --listen 127.0.0.1:0 --data-dir "$TMP/lazykvd" --set hot_backend=host \
    --set "hot_bytes=$HOT_BYTES" --set profile.stories260k.hot_bytes=16MiB \
    >"$TMP/lazykvd.out" 2>"$LOG" &
DPID=$!
ADDR=
for _ in $(seq 1 300); do
    ADDR=$(sed -n 's/^lazykvd listening on //p' "$TMP/lazykvd.out" 2>/dev/null | head -n1)
    [ -n "$ADDR" ] && break
    if ! kill -0 "$DPID" 2>/dev/null; then
        echo "run.sh: lazykvd exited; log:" >&2
        cat "$LOG" >&2
        exit 1
    fi
    sleep 0.1
done
[ -n "$ADDR" ] || { echo "run.sh: lazykvd did not start" >&2; exit 1; }
echo "run.sh: lazykvd (pid $DPID) on $ADDR, hot_bytes $HOT_BYTES" >&2
rc=0
"$BUILD_DIR/bin/inplace_bench" --target "$ADDR" --json "$JSON" "$@" || rc=$?
kill -TERM "$DPID"
wait "$DPID" || rc=1
DPID=
exit "$rc"
