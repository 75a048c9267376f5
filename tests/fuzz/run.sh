#!/usr/bin/env bash
# tests/fuzz/run.sh BUILD_DIR [SECONDS] [PARALLEL]: runs every libFuzzer target of BUILD_DIR/bin
# (built with -DLKV_FUZZ=ON) for SECONDS (default 30) each, PARALLEL (default 1) at a time, on a
# scratch copy of its seed corpus tests/fuzz/corpus/<target> (the checked-in corpus stays
# small; new inputs are dropped). Exits non-zero if any target crashed, leaked, hung (-timeout)
# or blew its memory (-rss_limit_mb); the reproducer is kept under BUILD_DIR/fuzz-out/<target>/
# and printed in hex. Reproduce: BUILD_DIR/bin/<target> BUILD_DIR/fuzz-out/<target>/crash-*.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: tests/fuzz/run.sh BUILD_DIR [SECONDS] [PARALLEL]}
secs=${2:-30}
par=${3:-1}
targets=()
for t in fuzz_requests fuzz_config fuzz_kvfile fuzz_trace fuzz_worker_request; do
    [ -x "$build/bin/$t" ] && targets+=("$t")
done
out="$build/fuzz-out"
rm -rf "$out"
mkdir -p "$out"
run_one() {
    local t=$1 dir="$out/$1"
    mkdir -p "$dir/corpus"
    cp tests/fuzz/corpus/"$t"/* "$dir/corpus/"
    "$build/bin/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$dir/" "$dir/corpus" >"$dir/log" 2>&1
    local rc=$?
    local line
    line=$(grep -E "^#[0-9]+.*DONE" "$dir/log" | tail -1)
    echo "$rc" >"$dir/rc"
    echo "fuzz: $t rc=$rc ${line:-(no DONE line)}"
}
pids=()
for t in "${targets[@]}"; do
    run_one "$t" &
    pids+=($!)
    while [ "$(jobs -rp | wc -l)" -ge "$par" ]; do
        wait -n
    done
done
wait
fail=0
for t in "${targets[@]}"; do
    if [ "$(cat "$out/$t/rc" 2>/dev/null || echo 1)" != 0 ]; then
        fail=1
        echo "fuzz: $t FAILED; the end of its log:"
        tail -40 "$out/$t/log"
        for a in "$out/$t"/crash-* "$out/$t"/leak-* "$out/$t"/timeout-* "$out/$t"/oom-*; do
            [ -f "$a" ] && { echo "reproducer $a:"; xxd "$a" | head -20; }
        done
    fi
done
exit $fail
