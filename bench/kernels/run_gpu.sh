#!/usr/bin/env bash
# run_gpu.sh: on the GPU machine, from the repository root: build the kernels (kernels-only
# CMake build), run the GPU check, time our kernels (bench_attn) and the PyTorch baselines
# (sdpa_bench.py) in the same run, and merge everything into one table and one JSON.
# Output folder: $OUT (the device tool's) or bench/out. QUICK=1 skips the large batches.
# Usage: bash bench/kernels/run_gpu.sh
set -uo pipefail
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
log() { echo "== $* ($(date -u +%H:%M:%S))"; }

log "configure + build ($BUILD)"
if ! { cmake -S . -B "$BUILD" -G Ninja -DLAZYKV_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release \
         -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/build.log" 2>&1 &&
       cmake --build "$BUILD" -j "$(nproc)" --target test_attn_gpu bench_attn >>"$OUT/build.log" 2>&1; }; then
  tail -30 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true

log "GPU check"
LKV_GPU_CHECK_CASES=${LKV_GPU_CHECK_CASES:-2} "$BUILD/bin/test_attn_gpu" >"$OUT/gpu_check.log" 2>&1
check_rc=$?
grep -E "FAIL|test_attn_gpu" "$OUT/gpu_check.log" | tail -20
echo "gpu_check rc=$check_rc"

log "bench_attn (our kernels)"
Q=${QUICK:+quick}
if [ -n "$Q" ]; then export LKV_BENCH_QUICK=1; fi
"$BUILD/bin/bench_attn" "$OUT/ours.jsonl" 2>&1 | tee "$OUT/bench_ours.log" | tail -5

log "PyTorch baselines"
PYTHONUNBUFFERED=1 python3 bench/kernels/sdpa_bench.py "$OUT/sdpa.jsonl" $Q 2>&1 | tee "$OUT/bench_sdpa.log" | tail -3

log "merge"
python3 bench/kernels/merge.py "$OUT/ours.jsonl" "$OUT/sdpa.jsonl" "$OUT/kernels_bench.json" \
  | tee "$OUT/kernels_table.md"
exit $check_rc
