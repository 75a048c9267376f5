#!/usr/bin/env bash
# bench/service/run.sh: builds lazykvd and svcbench if needed, starts a real lazykvd on a temp
# data dir on 127.0.0.1 port 0, runs the service benchmark against it (plus the in-process cold
# read comparison in the same temp dir), stops the daemon with SIGTERM and removes the temp dir.
#
#   bench/service/run.sh [svcbench options...]     e.g. --clients 1,8 --seconds 1 --reps 1
#
# Environment:
#   BUILD_DIR   build folder (default: <repo>/build; configured if it has no CMakeCache.txt)
#   JSON        output path (default: <repo>/bench/out/service.json)
#   HOT_BYTES   daemon hot tier (default 4GiB; the 64-client put holds ~1.5 GiB in flight)
#   COLD_BYTES  daemon cold budget (default 8GiB)
#   THREADS     daemon gRPC polling threads (default: the daemon's default)
#   SETS_EXTRA  more daemon options, space-separated key=value (e.g. wb_max_backlog_bytes=0)
#   TMPDIR      where the temp dir goes (default /tmp)
# The table goes to stdout; the daemon's log is kept beside the JSON (<json>-lazykvd.log).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
JSON=${JSON:-$ROOT/bench/out/service.json}
HOT_BYTES=${HOT_BYTES:-4GiB}
COLD_BYTES=${COLD_BYTES:-8GiB}

if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$BUILD_DIR" -j2 --target lazykvd svcbench >/dev/null

TMP=$(mktemp -d "${TMPDIR:-/tmp}/lkv-svcbench.XXXXXX")
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

# hot_admission=always: the benchmark measures the data path. With the default door, a Put of a
# document nobody looked up is refused hot once the tier is full and stored cold only (a synced
# RocksDB write before the reply), and the get phase's working set would then come from cold.
SETS=(--set hot_backend=host --set "hot_bytes=$HOT_BYTES" --set "cold_bytes=$COLD_BYTES"
    --set hot_admission=always)
if [ -n "${THREADS:-}" ]; then
    SETS+=(--set "threads=$THREADS")
fi
for kv in ${SETS_EXTRA:-}; do
    SETS+=(--set "$kv")
done
"$BUILD_DIR/bin/lazykvd" --listen 127.0.0.1:0 --data-dir "$TMP/lazykvd" "${SETS[@]}" \
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
if [ -z "$ADDR" ]; then
    echo "run.sh: lazykvd did not report its address within 30 s" >&2
    exit 1
fi
echo "run.sh: lazykvd (pid $DPID) on $ADDR, data $TMP/lazykvd, ${SETS[*]}" >&2

rc=0
"$BUILD_DIR/bin/svcbench" --target "$ADDR" --work-dir "$TMP/cold" --json "$JSON" "$@" || rc=$?

kill -TERM "$DPID"
drc=0
wait "$DPID" || drc=$?
DPID=
if [ "$drc" -ne 0 ]; then
    echo "run.sh: lazykvd exited with status $drc (log: $LOG)" >&2
    [ "$rc" -eq 0 ] && rc=1
fi
exit "$rc"
