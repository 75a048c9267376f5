#!/usr/bin/env bash
# ncu_source.sh KERNEL_REGEX LKV_BENCH_ONLY OUT_CSV: one Nsight Compute report (--set full) of
# the third launch of KERNEL_REGEX in bench_attn restricted to LKV_BENCH_ONLY, exported as the
# per-SASS-instruction source page (CSV: stall samples, executed instructions per line), for
# finding where a kernel's warps wait. Run on the GPU machine after run_gpu.sh built $BUILD.
set -uo pipefail
B=${BUILD:-build-gpu}
k=$1; only=$2; out=$3
LKV_BENCH_ONLY=$only LKV_BENCH_REPS=1 timeout 300 ncu --clock-control none -k "regex:$k" \
  --launch-skip 2 --launch-count 1 --set full --import-source no -f -o /tmp/lkv_src \
  "$B/bin/bench_attn" /tmp/ncu_src.jsonl >/tmp/ncu_src.log 2>&1
echo "ncu rc=$?"; tail -3 /tmp/ncu_src.log
ncu -i /tmp/lkv_src.ncu-rep --page source --csv --print-source sass >"$out" 2>&1
echo "source page rc=$? ($(wc -l <"$out") lines)"
