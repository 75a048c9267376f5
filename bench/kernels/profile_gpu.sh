#!/usr/bin/env bash
# profile_gpu.sh: development helper for the GPU machine: build, GPU check, a subset of the
# benchmark (BENCH_ONLY list) and Nsight Compute reports of chosen launches (NCU list of
# "kernel-regex|LKV_BENCH_ONLY" items). Outputs under $OUT.
set -uo pipefail
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
B=${BUILD:-build-gpu}
cmake -S . -B "$B" -G Ninja -DLAZYKV_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/build.log" 2>&1 &&
  cmake --build "$B" -j "$(nproc)" --target test_attn_gpu bench_attn >>"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
"$B/bin/test_attn_gpu" >"$OUT/check.log" 2>&1
echo "gpu_check rc=$?"; grep FAIL "$OUT/check.log" | head; tail -1 "$OUT/check.log"
for only in ${BENCH_ONLY:-decode}; do
  LKV_BENCH_ONLY=$only "$B/bin/bench_attn" "$OUT/bench_$$.jsonl" | grep -v "^copy"
done | tee "$OUT/bench.log"
i=0
for item in ${NCU:-}; do
  k=${item%%|*}; only=${item#*|}; i=$((i+1))
  LKV_BENCH_ONLY=$only LKV_BENCH_REPS=1 ncu --clock-control none -k "regex:$k" --launch-skip 2 \
    --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    "$B/bin/bench_attn" /tmp/ncu.jsonl >"$OUT/ncu_$i.txt" 2>&1
  echo "ncu $item rc=$?"
  grep -E "Duration|Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issued Ipc|L2 Hit|Block Limit|Eligible" "$OUT/ncu_$i.txt" | head -40
done
