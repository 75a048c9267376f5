#!/usr/bin/env bash
# prefill_variants.sh: on the GPU machine, from the repository root, in ONE device call: the GPU
# check and the prefill timings (bench_attn) of several wgmma-prefill knob settings, then every
# SDPA backend once, and one merged table per setting (all in the same run). Programs prebuilt
# and carried (BIN). At most 8 files land in $OUT: check.log bench.log table<i>.md (one per
# setting, at most 5) jsonl.tgz (the raw JSONL and merged JSON).
# Knobs: BIN (default build-gpu/bin), VARIANTS (space-separated items of comma-separated
# VAR=value; default the round-8 set below).
# Usage: BIN=build-x/bin bash bench/kernels/prefill_variants.sh
set -uo pipefail
B=${BIN:-build-gpu/bin}
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
VARIANTS=${VARIANTS:-"LKV_ATTN_WG_VB=0 LKV_ATTN_WG_VB=1 LKV_ATTN_WG_VB=1,LKV_ATTN_WG_PF=1"}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
: >"$OUT/check.log"
for v in $VARIANTS; do
  envs=(${v//,/ })
  env "${envs[@]}" LKV_GPU_CHECK_CASES=1 timeout 150 "$B/test_attn_gpu" tests/data/models >/tmp/c.log 2>&1
  echo "check $v rc=$? $(tail -1 /tmp/c.log)" | tee -a "$OUT/check.log"
  grep -E "FAIL" /tmp/c.log | head -5 >>"$OUT/check.log"
done
i=0
for v in $VARIANTS; do
  envs=(${v//,/ })
  echo "== bench $v" | tee -a "$OUT/bench.log"
  env "${envs[@]}" LKV_BENCH_ONLY=prefill,copy timeout 200 "$B/bench_attn" /tmp/ours$i.jsonl 2>&1 |
    tee -a "$OUT/bench.log" | grep -E " lazy |block_attn"
  i=$((i + 1))
done
echo "== sdpa" | tee -a "$OUT/bench.log"
PYTHONUNBUFFERED=1 python3 bench/kernels/sdpa_bench.py /tmp/sdpa.jsonl prefill 2>&1 |
  grep -v -i warn | grep -v "return F" >>"$OUT/bench.log"
for j in $(seq 0 $((i - 1))); do
  python3 bench/kernels/merge.py /tmp/ours$j.jsonl /tmp/sdpa.jsonl /tmp/kernels_bench$j.json \
    >"$OUT/table$j.md"
  grep -E "^\| (64|512|2048) " "$OUT/table$j.md"
done
(cd /tmp && tar czf "$OUT/jsonl.tgz" ours?.jsonl sdpa.jsonl kernels_bench?.json)
ls -la "$OUT"
