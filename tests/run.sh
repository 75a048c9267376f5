#!/usr/bin/env bash
# tests/run.sh: set up, build and run every test, twice: a normal build (CUDA code compiled
# when nvcc is present) and an ASan+UBSan build; then the storage, lease and RPC-engine tests
# under ThreadSanitizer; then build the libFuzzer targets with clang and run each for 30 s
# (LKV_FUZZ_SECONDS), failing on any crash (tests/fuzz/run.sh). This is the README's test command and what
# CI runs (.ci/run). Build folders: build/ and build-asan/. Each stage prints its wall time
# ("== stage NAME: N s"); tests/README.md records them and the 30-minute budget.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
t_all=$(date +%s)
t0=$t_all
stage() { # stage NAME: prints the wall time since the previous stage ended.
    local now
    now=$(date +%s)
    echo "== stage $1: $((now - t0)) s"
    t0=$now
}

bash deploy/setup-debian.sh
[ -x /usr/local/cuda/bin/nvcc ] && export CUDACXX=${CUDACXX:-/usr/local/cuda/bin/nvcc}
stage setup

echo "== build (RelWithDebInfo) =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs"
stage build
echo "== tests =="
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 300
stage tests

echo "== build (ASan + UBSan, no CUDA) =="
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DLKV_ASAN=ON -DLKV_UBSAN=ON -DLKV_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
stage build-asan
echo "== tests under sanitizers =="
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" --timeout 600
stage tests-asan

echo "== build (ThreadSanitizer: storage, leases, the RPC engine, the accept loop) =="
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLKV_TSAN=ON -DLKV_CUDA=OFF >/dev/null
cmake --build build-tsan -j"$jobs" --target lkv_tsan_tests
stage build-tsan
echo "== tests under ThreadSanitizer =="
# storage.cold_faults (disk faults injected into forked children) runs in the ASan stage only.
ctest --test-dir build-tsan -R '^(storage\.|daemon\.(lease|server|listener)$)' \
    -E '^storage\.cold_faults$' --output-on-failure -j"$jobs" --timeout 600
stage tests-tsan

echo "== build (clang: libFuzzer + ASan + UBSan, tests/fuzz) =="
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLKV_FUZZ=ON -DLKV_CUDA=OFF >/dev/null
cmake --build build-fuzz -j"$jobs" --target lkv_fuzzers
stage build-fuzz
echo "== fuzzing: every target ${LKV_FUZZ_SECONDS:-30} s, $jobs at a time =="
bash tests/fuzz/run.sh build-fuzz "${LKV_FUZZ_SECONDS:-30}" "$jobs"
stage fuzz
echo "== all stages: $(($(date +%s) - t_all)) s"
