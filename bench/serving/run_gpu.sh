#!/usr/bin/env bash
# bench/serving/run_gpu.sh: the serving benchmark on the H200, in ONE device call.
#
#   bash bench/serving/run_gpu.sh build   here: CUDA build (sm_90, Release) of serving_bench and
#                                         lazykvd into build-cuda/, copied with their libraries
#                                         and this folder's scripts into $GPU_DIR
#                                         (default /work/main/.gpu/serving; carry .gpu/serving)
#   MODE=quick|full OUT=... bash run_gpu.sh run    there, from $GPU_DIR: the benchmark (8B shape,
#                                         random weights, lazykvd with its hot tier in HBM), its
#                                         table and JSON in $OUT, the PNG (matplotlib)
# Extra flags for serving_bench: ARGS="...".
set -uo pipefail
mode=${1:-run}
if [ "$mode" = build ]; then
  cd "$(dirname "$0")/../.."
  GPU_DIR=${GPU_DIR:-/work/main/.gpu/serving}
  # -Wno-error=format-truncation: daemon/cluster/lkv_membership.c:290 warns at -O3 (Release only).
  cmake -S . -B build-cuda -DLKV_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS=-Wno-error=format-truncation \
    >/dev/null && cmake --build build-cuda -j2 --target serving_bench lazykvd || exit 1
  rm -rf "$GPU_DIR" && mkdir -p "$GPU_DIR/bin"
  cp build-cuda/bin/serving_bench build-cuda/bin/lazykvd "$GPU_DIR/bin/"
  cp bench/serving/run_gpu.sh bench/serving/plot.py "$GPU_DIR/"
  bash /work/shared/tools/bundle-libs "$GPU_DIR/lib" "$GPU_DIR"/bin/*
  du -sh "$GPU_DIR"
  exit 0
fi
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/serving-gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/lib:$(bash lib/nccl-path):/usr/local/cuda/lib64
exec > >(tee "$OUT/serving_gpu.log") 2>&1
date -u
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
COMMON="--backend cuda --synth llama3-8b:1 --hot-backend cuda --daemon-bin bin/lazykvd --out $OUT"
case "${MODE:-quick}" in
  quick) FLAGS="--quick" ;;
  # The full grid in ONE call (issue 18 item 3; about 440 s: the headline point measured 252 s
  # at 23:08, the rest estimated at ~190 s from the 19:56 run's per-request times): the headline point (paper, alpha 2.1, 1 GiB) with 100
  # counted requests in every mode (p99 from 100 samples), LRU rows for the baselines, B = 1, 8,
  # 32; every other point of the grid (paper and short, alpha 1.1 and 2.1, 1 and 32 GiB) with
  # 30 requests and B = 8 in prefix, block and lazy; no cache once per shape (its TTFT depends
  # on neither alpha nor budget: paper and short at the headline alpha and budget). Chunked
  # prefill in the engine at B > 1 (PREFILL_CHUNK tokens, budget chunk + B). Points not started
  # by DEADLINE seconds are skipped (printed), so the call ends in time whatever happens.
  full) FLAGS="--warmup 5 --ttft-tokens 1 --check 2 --local-pages 38000 --deadline-s ${DEADLINE:-330}"
        FLAGS="$FLAGS --prefill-chunk ${PREFILL_CHUNK:-512}"
        PLAN="paper:2.1:1GiB:100:16:none+prefix+block+lazy+lru:1+8+32"
        PLAN="$PLAN;short:2.1:1GiB:30:16:none+prefix+block+lazy:8"
        PLAN="$PLAN;paper:2.1:32GiB:30:16:prefix+block+lazy:8"
        PLAN="$PLAN;paper:1.1:1GiB:30:16:prefix+block+lazy:8"
        PLAN="$PLAN;short:1.1:1GiB:30:16:prefix+block+lazy:8"
        PLAN="$PLAN;short:2.1:32GiB:30:16:prefix+block+lazy:8"
        PLAN="$PLAN;paper:1.1:32GiB:30:16:prefix+block+lazy:8"
        PLAN="$PLAN;short:1.1:32GiB:30:16:prefix+block+lazy:8" ;;
  *) echo "MODE is quick or full"; exit 2 ;;
esac
t0=$SECONDS
if [ -n "${PLAN:-}" ]; then
  ./bin/serving_bench $COMMON $FLAGS --plan "$PLAN" ${ARGS:-}
else
  ./bin/serving_bench $COMMON $FLAGS ${ARGS:-}
fi
rc=$?
echo "serving_bench: rc $rc, $((SECONDS - t0)) s"
nvidia-smi --query-gpu=memory.used --format=csv,noheader
python3 plot.py "$OUT/serving.json" "$OUT/serving.png" || echo "plot failed"
exit $rc
