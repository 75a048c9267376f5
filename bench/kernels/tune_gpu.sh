#!/usr/bin/env bash
# tune_gpu.sh: development helper for the GPU machine (one call): build, GPU check, the prefill
# benchmark, and batch-1 decode at several forced split counts (LKV_ATTN_DECODE_SPLITS; 0 = the
# launcher's plan) and without programmatic dependent launch (LKV_ATTN_NO_PDL=1). Outputs
# under $OUT. Usage: bash bench/kernels/tune_gpu.sh
set -uo pipefail
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
B=${BUILD:-build-gpu}
echo "== build $(date -u +%T)"
cmake -S . -B "$B" -G Ninja -DLAZYKV_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/build.log" 2>&1 &&
  cmake --build "$B" -j "$(nproc)" --target test_attn_gpu bench_attn >>"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
echo "== check $(date -u +%T)"
LKV_GPU_CHECK_CASES=${LKV_GPU_CHECK_CASES:-1} "$B/bin/test_attn_gpu" >"$OUT/check.log" 2>&1
echo "gpu_check rc=$?"; grep FAIL "$OUT/check.log" | head; tail -2 "$OUT/check.log"
echo "== prefill $(date -u +%T)"
LKV_BENCH_ONLY=${PF_ONLY:-prefill} "$B/bin/bench_attn" "$OUT/pf.jsonl" | tee "$OUT/pf.log"
D1=decode:1:4096,decode:1:8192,decode:1:32768
for s in ${SPLITS:-0 16 32 64 128}; do
  echo "== decode splits=$s $(date -u +%T)"
  LKV_ATTN_DECODE_SPLITS=$s LKV_BENCH_ONLY=$D1 "$B/bin/bench_attn" "$OUT/dec_$s.jsonl" | grep -v norot
done
echo "== decode no PDL"
LKV_ATTN_NO_PDL=1 LKV_BENCH_ONLY=$D1 "$B/bin/bench_attn" "$OUT/dec_nopdl.jsonl" | grep -v norot
echo "== decode larger batches"
LKV_BENCH_ONLY=${DEC_MORE:-decode:16:4096,decode:16:8192,decode:128:32768} \
  "$B/bin/bench_attn" "$OUT/dec_more.jsonl" | grep -v norot
echo "== done $(date -u +%T)"
