#!/usr/bin/env bash
# run_gpu.sh: on the GPU machine, from the repository root, in ONE device call: build the kernels
# (kernels-only CMake build), run the GPU check, time our kernels (bench_attn) and the PyTorch
# baselines (sdpa_bench.py: every SDPA backend, plain and in CUDA graphs) in the same run, merge
# everything into one table and one JSON, and optionally profile chosen launches with Nsight
# Compute. At most 8 files land in $OUT (the device tool brings back no more):
#   build.log check.log bench.log ours.jsonl sdpa.jsonl kernels_bench.json table.md ncu.txt
# Knobs (environment):
#   STEPS        words among: check bench sdpa merge ncu dev sass (default: check bench sdpa
#                merge); sass counts HGMMA / UTMALDG / setmaxnreg / local memory in the wgmma
#                prefill's machine code;
#                dev builds and runs the kernels/dev workshop programs (output in bench.log)
#   QUICK=1      skip batches above 16 (bench and sdpa)
#   BENCH_ONLY   LKV_BENCH_ONLY for bench_attn (e.g. "decode:1:4096,copy" or "prefill,copy")
#   VARIANTS     with STEPS word "variants": space-separated items of comma-separated
#                VAR=value knobs; each is checked and its prefill timed (bench.log)
#   SDPA_ARGS    extra words for sdpa_bench.py ("prefill": skip its decode cases)
#   CHECK_TIMEOUT, BENCH_TIMEOUT  seconds (default 240, 300): a hung kernel cannot eat the call
#   NCU          space-separated "kernel-regex|LKV_BENCH_ONLY[|set]" items (set: a ncu --set name,
#                default the sections listed below)
#   NCU_SRC      with STEPS word "ncusrc": space-separated "kernel-regex|LKV_BENCH_ONLY" items;
#                each gets ncu_source.sh's full report and SASS source page ($OUT/ncu_srcN.csv
#                and .txt: stall samples per instruction)
#   NOBUILD=1    use the programs already in $BUILD/bin (built on the dev machine and carried:
#                same nvcc 13.0, sm_90), no configure or build here
#   LKV_GPU_CHECK_CASES  scales the random cases of the GPU check (default 2)
# Usage: bash bench/kernels/run_gpu.sh
set -uo pipefail
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
STEPS=${STEPS:-check bench sdpa merge}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
log() { echo "== $* ($(date -u +%H:%M:%S))"; }
rc_all=0

log "configure + build ($BUILD)"
DEV=OFF; TARGETS="test_attn_gpu bench_attn"
if has dev; then DEV=ON; TARGETS="$TARGETS dev_decode_v1 dev_decode_v4 dev_decode_current"; fi
if [ "${NOBUILD:-0}" = 1 ]; then
  echo "prebuilt programs in $BUILD/bin" >"$OUT/build.log"
elif ! { cmake -S . -B "$BUILD" -G Ninja -DLAZYKV_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release \
         -DCMAKE_CUDA_ARCHITECTURES=90 -DLKV_KERNELS_DEV=$DEV >"$OUT/build.log" 2>&1 &&
       cmake --build "$BUILD" -j "$(nproc)" --target $TARGETS >>"$OUT/build.log" 2>&1; }; then
  tail -30 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
fi
if has sass; then
  # The Hopper prefill's machine code: wgmma (HGMMA), tensor copies (UTMALDG), setmaxnreg.
  o=$(find "$BUILD" -name 'lkv_prefill_wgmma.cu.o' | head -1)
  if command -v cuobjdump >/dev/null && [ -n "$o" ]; then
    cuobjdump --dump-sass "$o" >/tmp/wg.sass 2>&1
    echo "sass: $(grep -c HGMMA /tmp/wg.sass) HGMMA, $(grep -c UTMALDG /tmp/wg.sass) UTMALDG," \
      "$(grep -c USETMAXREG /tmp/wg.sass) USETMAXREG, $(grep -c -E 'LDL|STL' /tmp/wg.sass) LDL/STL" |
      tee -a "$OUT/build.log"
    # Where the local-memory accesses are (function and neighbourhood), into build.log.
    grep -n -E "Function :|LDL|STL" /tmp/wg.sass | head -60 >>"$OUT/build.log"
  else echo "sass: no cuobjdump or object"; fi
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv,noheader || true

if has check; then
  log "GPU check"
  LKV_GPU_CHECK_CASES=${LKV_GPU_CHECK_CASES:-2} timeout ${CHECK_TIMEOUT:-240} \
    "$BUILD/bin/test_attn_gpu" tests/data/models >"$OUT/check.log" 2>&1
  check_rc=$?
  grep -E "FAIL|graph|test_attn_gpu|rror" "$OUT/check.log" | tail -20
  echo "gpu_check rc=$check_rc"
  [ $check_rc -eq 0 ] || rc_all=1
fi

if has dev; then
  log "kernels/dev workshop"
  for v in decode_v1 decode_v4 decode_current; do
    "$BUILD/bin/dev_$v" 2>&1 | tee -a "$OUT/bench.log"
  done
fi

if has variants && [ -n "${VARIANTS:-}" ]; then
  # Kernel variants chosen by environment knobs (e.g. "LKV_ATTN_WG_BN=96,LKV_ATTN_WG_PP=1"):
  # for each, the GPU check's result line and the prefill timings (lazy rows), in bench.log.
  for v in $VARIANTS; do
    log "variant $v"
    envs=(${v//,/ })
    r=$(env "${envs[@]}" LKV_GPU_CHECK_CASES=1 timeout ${CHECK_TIMEOUT:-240} \
      "$BUILD/bin/test_attn_gpu" 2>&1 | grep -E "FAIL|test_attn_gpu:" | tail -4)
    echo "variant $v check: $r" | tee -a "$OUT/bench.log"
    env "${envs[@]}" LKV_BENCH_ONLY=prefill timeout ${BENCH_TIMEOUT:-300} "$BUILD/bin/bench_attn" \
      /tmp/variant.jsonl 2>&1 | grep -E " lazy " | sed "s|^|variant $v: |" | tee -a "$OUT/bench.log"
  done
fi

Q=${QUICK:+quick}
if has bench; then
  log "bench_attn (our kernels)"
  if [ -n "$Q" ]; then export LKV_BENCH_QUICK=1; fi
  LKV_BENCH_ONLY=${BENCH_ONLY:-} timeout ${BENCH_TIMEOUT:-300} "$BUILD/bin/bench_attn" \
    "$OUT/ours.jsonl" 2>&1 | tee -a "$OUT/bench.log" | tail -60
fi

if has sdpa; then
  log "PyTorch baselines"
  PYTHONUNBUFFERED=1 python3 bench/kernels/sdpa_bench.py "$OUT/sdpa.jsonl" $Q ${SDPA_ARGS:-} 2>&1 | tee -a "$OUT/bench.log" | tail -80
fi

if has merge && [ -f "$OUT/ours.jsonl" ] && [ -f "$OUT/sdpa.jsonl" ]; then
  log "merge"
  python3 bench/kernels/merge.py "$OUT/ours.jsonl" "$OUT/sdpa.jsonl" "$OUT/kernels_bench.json" \
    >"$OUT/table.md"
fi

if has ncu && [ -n "${NCU:-}" ]; then
  command -v ncu >/dev/null || { echo "ncu not found"; }
  : >"$OUT/ncu.txt"
  i=0
  for item in $NCU; do
    k=${item%%|*}; rest=${item#*|}; only=${rest%%|*}; set_=""
    [ "$rest" != "$only" ] && set_=${rest#*|}
    i=$((i + 1))
    if [ -n "$set_" ]; then secs=(--set "$set_"); else
      secs=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
            --section SchedulerStats --section MemoryWorkloadAnalysis); fi
    log "ncu $i: $k at $only ${set_}"
    echo "######## ncu $i: kernel $k, case $only, set ${set_:-default}" >>"$OUT/ncu.txt"
    LKV_BENCH_ONLY=$only LKV_BENCH_REPS=1 timeout 240 ncu --clock-control none -k "regex:$k" \
      --launch-skip 2 --launch-count 1 "${secs[@]}" "$BUILD/bin/bench_attn" /tmp/ncu.jsonl \
      >>"$OUT/ncu.txt" 2>&1
    echo "ncu rc=$?"
    tail -n +1 "$OUT/ncu.txt" | awk -v n="######## ncu $i:" 'index($0,n)==1{p=1} p' |
      grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Warp Cycles Per Issued|Issued Ipc|L2 Hit|Eligible Warps|No Eligible|Theoretical Occ|Waves Per|Dynamic Shared" | head -24
  done
fi

if has ncusrc && [ -n "${NCU_SRC:-}" ]; then
  i=0
  for item in $NCU_SRC; do
    k=${item%%|*}; only=${item#*|}; i=$((i + 1))
    log "ncu source page $i: $k at $only"
    LKV_BENCH_ONLY=$only LKV_BENCH_REPS=1 bash bench/kernels/ncu_source.sh "$OUT/ncu_src$i.csv" \
      "$k" 2 "$BUILD/bin/bench_attn" /tmp/ncu_src.jsonl
  done
fi

if [ -f "$OUT/table.md" ]; then cat "$OUT/table.md"; fi
exit $rc_all
