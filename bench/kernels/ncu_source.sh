#!/usr/bin/env bash
# ncu_source.sh OUT_CSV KERNEL_REGEX SKIP PROGRAM [ARGS...]: one Nsight Compute report
# (--set full) of launch SKIP+1 of KERNEL_REGEX in PROGRAM, exported as the per-SASS-instruction
# source page (CSV: stall samples, executed instructions, L2 sectors per instruction), for
# finding where a kernel's warps wait. For bench_attn set LKV_BENCH_ONLY and LKV_BENCH_REPS=1
# (SKIP 2 = the first timed launch). Run on the GPU machine after run_gpu.sh built the programs.
set -uo pipefail
out=$1; k=$2; skip=$3; shift 3
timeout 300 ncu --clock-control none -k "regex:$k" --launch-skip "$skip" --launch-count 1 \
  --set full --import-source no -f -o /tmp/lkv_src "$@" >/tmp/ncu_src.log 2>&1
echo "ncu rc=$? ($*)"; grep -E "==PROF==|error" /tmp/ncu_src.log | tail -2
ncu -i /tmp/lkv_src.ncu-rep --page details >"${out%.csv}.txt" 2>&1
ncu -i /tmp/lkv_src.ncu-rep --page source --csv --print-source sass >"$out" 2>&1
echo "source page rc=$? ($(wc -l <"$out") lines)"
grep -E "Duration|DRAM Throughput|L2 Hit Rate|Registers Per" "${out%.csv}.txt" | head -6
