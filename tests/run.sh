#!/usr/bin/env bash
# tests/run.sh: set up, build and run every test, twice: a normal build (CUDA code compiled
# when nvcc is present) and an ASan+UBSan build. This is the README's test command and what
# CI runs (.ci/run). Build folders: build/ and build-asan/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup-debian.sh
[ -x /usr/local/cuda/bin/nvcc ] && export CUDACXX=${CUDACXX:-/usr/local/cuda/bin/nvcc}
jobs=$(nproc)

echo "== build (RelWithDebInfo) =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs"
echo "== tests =="
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 300

echo "== build (ASan + UBSan, no CUDA) =="
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DLKV_ASAN=ON -DLKV_UBSAN=ON -DLKV_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
echo "== tests under sanitizers =="
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" --timeout 600
