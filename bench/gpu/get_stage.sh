#!/usr/bin/env bash
# bench/gpu/get_stage.sh: issue 11 item 4 on a GPU host: Get of a CUDA arena through the
# pinned staging ring (storage/lkv_stage.h). Runs tests/integration/test_get_stage.c with
# LKV_IT_STAGE_CUDA=1: lazykvd with hot_backend=cuda, get_staging=auto (pinned ring of 2
# slots: 8 concurrent C clients, every byte of 24 documents compared twice each; 2 clients
# that stop reading while a third reads everything), then its bench mode: Get throughput of
# the ring against get_staging=off (the old path: a blocking cudaMemcpy into a per-call
# buffer, packed by protobuf-c) and a host arena sent from its pages, same run, 1/8/32
# clients, median of 3 x 1 s.
#
# Built here (no GPU needed), carried under D (default .gpu/store): lazykvd, it_get_stage and
# their libraries (bundle-libs D/lib ...). On the device, from the repository root:
#     OUT=/tmp/out bash D/get_stage.sh
set -uo pipefail
D=${D:-.gpu/store}
OUT=${OUT:-/tmp/get_stage_out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$D/lib:$(bash "$D/lib/nccl-path" 2>/dev/null):/usr/local/cuda/lib64
export LKV_DAEMON_BIN=$PWD/$D/lazykvd
export LKV_IT_STAGE_CUDA=1
export LKV_KEEP_TMP=1 # the daemons' logs, for the grep below
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
nproc
rc=0
timeout 120 "$D/it_get_stage" >"$OUT/check.log" 2>&1 || rc=$?
grep -v '^20..-..-' "$OUT/check.log" | tail -20
grep -h "get staging ring\|arena: cuda\|ERROR" /tmp/lkv-it-*/lazykvd.log 2>/dev/null | sort | uniq -c | head -8
echo "check rc=$rc"
timeout 150 "$D/it_get_stage" bench "$OUT/get_stage.json" >"$OUT/bench.log" 2>&1 || rc=$((rc | 2))
grep -v '^20..-..-' "$OUT/bench.log" | tail -14
echo "bench rc=$rc"
exit $rc
