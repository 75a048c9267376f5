#!/usr/bin/env bash
# bench/worker/run_gpu.sh: every GPU check of the decode worker, in one call on the GPU machine.
#
#   bash bench/worker/run_gpu.sh build     here: CUDA build (sm_90, Release) of lazykv-worker into
#                                          build-cuda/, copied with its libraries into .gpu/
#                                          (ignored in git; carry it: run(carry=[".gpu"]))
#   bash bench/worker/run_gpu.sh run       there (the H200): the checks below; logs and JSON in
#                                          $OUT (or /tmp/worker-gpu)
# Checks:
#   1. tiny model (stories260K), greedy, bf16 KV: GPU tokens == CPU tokens, with fp32 weights on
#      the GPU (cublasSgemm, no TF32) and with bf16 weights (GPU) vs the CPU on the same
#      bf16-rounded weights (--bf16-weights);
#   2. a batch (the serving engine, --engine, all requests in flight) gives each request its
#      solo tokens on the GPU (tiny model; and the 8B shape);
#   3. the Llama-3.1-8B-shaped random model (--synth llama3-8b:1): the worker's logits of the
#      first generated tokens vs a PyTorch fp32 forward of the same weights (bf16-rounded) with
#      the block-attention mask (bench/worker/synth_ref.py), tolerance rel L2 <= 0.05 per row;
#      plus its TTFT / TPOT.
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-run}
if [ "$mode" = build ]; then
  cmake -S . -B build-cuda -DLKV_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    >/dev/null && cmake --build build-cuda -j2 --target lazykv-worker || exit 1
  rm -rf .gpu && mkdir -p .gpu/bin
  cp build-cuda/bin/lazykv-worker .gpu/bin/
  bash /work/shared/tools/bundle-libs .gpu/lib .gpu/bin/lazykv-worker
  du -sh .gpu
  exit 0
fi
OUT=${OUT:-/tmp/worker-gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.gpu/lib:$(bash .gpu/lib/nccl-path):/usr/local/cuda/lib64
W=.gpu/bin/lazykv-worker
M=tests/data/models
log=$OUT/worker_gpu.log
exec > >(tee "$log") 2>&1
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
fail=0
tiny=$OUT/tiny.jsonl
cat > "$tiny" <<'J'
{"id":"a","docs":["Lily had a big red ball. She liked to throw it high.","The sun was hot."],"question":"Once upon a time","max_tokens":40,"stop":false}
{"id":"b","docs":["Tom went to the park with his dog. The dog ran fast."],"question":"One day,","max_tokens":48,"stop":false}
{"id":"c","docs":["Sue found a little box under the tree.","Ben and Mia built a tower.","The cat sat."],"question":"Lily said","max_tokens":32,"stop":false}
{"id":"d","docs":[],"question":"The dog","max_tokens":40,"stop":false}
{"id":"e","docs":["The sun was hot.","Lily had a big red ball. She liked to throw it high."],"question":"She","max_tokens":36,"stop":false,"mode":"materialise"}
{"id":"f","docs":["Tom went to the park with his dog. The dog ran fast."],"question":"Then","max_tokens":30,"stop":false,"temperature":0.9,"seed":5}
J
cmp_tokens() { # A.jsonl B.jsonl what
  python3 - "$1" "$2" "$3" <<'P'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
b = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
same = sum(x.get("tokens") == y.get("tokens") and x.get("ok") and y.get("ok") for x, y in zip(a, b))
for x, y in zip(a, b):
    if x.get("tokens") != y.get("tokens"):
        t1, t2 = x.get("tokens") or [], y.get("tokens") or []
        k = next((i for i, (p, q) in enumerate(zip(t1, t2)) if p != q), min(len(t1), len(t2)))
        print("  %s differs from token %d (%s / %s)" % (x.get("id"), k, x.get("error", ""), y.get("error", "")))
print("%s: %d/%d requests identical" % (sys.argv[3], same, len(a)))
sys.exit(0 if same == len(a) and len(a) == len(b) else 1)
P
}
T="--model $M/stories260K.bin --tokenizer $M/tok512.bin --dtype bf16 --json --requests $tiny"
$W $T > $OUT/tiny_cpu.jsonl
$W $T --bf16-weights > $OUT/tiny_cpu_bf16w.jsonl
$W $T --backend cuda --cuda-weights f32 > $OUT/tiny_gpu_f32w.jsonl
$W $T --backend cuda --cuda-weights bf16 > $OUT/tiny_gpu_bf16w.jsonl
$W $T --backend cuda --cuda-weights f32 --engine --max-batch 8 > $OUT/tiny_gpu_engine.jsonl
cmp_tokens $OUT/tiny_cpu.jsonl $OUT/tiny_gpu_f32w.jsonl "1a tiny greedy GPU (fp32 weights) == CPU" || fail=1
cmp_tokens $OUT/tiny_cpu_bf16w.jsonl $OUT/tiny_gpu_bf16w.jsonl "1b tiny GPU (bf16 weights) == CPU (bf16-rounded weights)" || fail=1
cmp_tokens $OUT/tiny_gpu_f32w.jsonl $OUT/tiny_gpu_engine.jsonl "2a tiny GPU batch (engine) == GPU solo" || fail=1
# 3. The 8B shape.
R8=$OUT/r8.jsonl
python3 - > "$R8" <<'P'
import json, random
rnd = random.Random(7)
def toks(n): return [rnd.randrange(1, 128256) for _ in range(n)]
reqs = [dict(id="p0", docs=[{"tokens": toks(40)}, {"tokens": toks(23)}], question={"tokens": toks(9)}, max_tokens=6, stop=False)]
for i in range(1, 8):
    reqs.append(dict(id="p%d" % i, docs=[{"tokens": toks(16 + 7 * i)} for _ in range(1 + i % 3)], question={"tokens": toks(5 + i)}, max_tokens=16, stop=False))
for r in reqs: print(json.dumps(r))
P
head -1 "$R8" > $OUT/r8_first.json
S="--synth llama3-8b:1 --dtype bf16 --local-pages 256 --backend cuda --json"
t0=$SECONDS
$W $S --requests "$R8" --dump-logits $OUT/l8b.bin > $OUT/8b_solo.jsonl || fail=1
echo "  8B process (random weights made on the host, copied as bf16): $((SECONDS - t0)) s"
head -1 $OUT/8b_solo.jsonl > $OUT/r8_first_result.json
python3 -c "
import json,sys
for l in open('$OUT/8b_solo.jsonl'):
    r=json.loads(l); print('  8B %s: ok %s, %d prompt tokens, TTFT %.1f ms (misses %.1f ms), TPOT %.2f ms' % (r['id'], r['ok'], r.get('n_prompt',0), r.get('ttft_ms',0), r.get('miss_ms',0), r.get('tpot_ms',0)))"
python3 bench/worker/synth_ref.py --preset llama3-8b --seed 1 --request $OUT/r8_first.json \
  --result $OUT/r8_first_result.json --logits $OUT/l8b.bin --tol 0.05 --json $OUT/synth_ref.json || fail=1
rm -f $OUT/l8b.bin
$W $S --requests "$R8" --engine --max-batch 8 > $OUT/8b_engine.jsonl || fail=1
cmp_tokens $OUT/8b_solo.jsonl $OUT/8b_engine.jsonl "2b 8B-shape GPU batch (engine, bf16 GEMMs) == GPU solo" || fail=1
echo "run_gpu.sh: $([ $fail = 0 ] && echo ALL PASS || echo SOME CHECKS FAILED)"
# At most a few files come back from the device: keep the log and the reference JSON, pack the rest.
(cd "$OUT" && tar czf rest.tgz $(ls | grep -v -e '^worker_gpu.log$' -e '^synth_ref.json$' -e '^rest.tgz$') 2>/dev/null)
exit $fail
