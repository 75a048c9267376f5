#!/usr/bin/env bash
# bench/worker/run_gpu.sh: every GPU check of the decode worker, in one call on the GPU machine.
#
#   bash bench/worker/run_gpu.sh build [DEST]
#                                          here: CUDA build (sm_90, Release) of lazykv-worker,
#                                          lazykvd, lazykv and inplace_bench into build-cuda/,
#                                          copied with their libraries into DEST/.gpu/ (DEST: this
#                                          tree; or e.g. /work/main/.gpu/gpuio, which then also gets
#                                          this tree's committed sources: carry it and cd there)
#   bash bench/worker/run_gpu.sh run       there (the H200): the checks below; logs and JSON in
#                                          $OUT (or /tmp/worker-gpu)
# STEPS (default "worker hbm inplace") picks the checks; BACKEND=cpu HOT=host runs step 4 on a
# CPU host (the same script, the host arena) as a dry run, with SYNTH=llama3-mini:1 PROF8=mini
# VOCAB8=512 DAEMON_EXTRA="--set profile.mini...." in place of the 8B shape.
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
#   4. (hbm) lazykvd with hot_backend=cuda on this GPU; the worker on the CUDA backend against
#      it (tiny model and 8B shape): the requests twice in one process: misses computed straight
#      into reserved HBM pages and committed, then every document read in place from the SAME
#      pages (page numbers from the Reserve / Attach replies), its bytes read back through the
#      IPC mapping equal to the locally computed KV (BLAKE2b), and to the daemon's own Get;
#      tokens equal to local mode (bench/worker/check_hbm.py); the engine against the daemon too.
#   5. (inplace) bench/inplace on the H200 (KV in device memory): a miss stored in place (D2D
#      into the HBM pages through the IPC mapping + Commit) vs Put of the same document (D2H +
#      gRPC), same run, 64 MiB and 256 MiB documents.
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-run}
if [ "$mode" = build ]; then
  dest=${2:-$PWD}
  cmake -S . -B build-cuda -DLKV_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    >/dev/null && cmake --build build-cuda -j2 --target lazykv-worker lazykvd lazykv inplace_bench \
    || exit 1
  if [ "$dest" != "$PWD" ]; then
    rm -rf "$dest" && mkdir -p "$dest"
    git archive HEAD | tar -x -C "$dest"
  fi
  rm -rf "$dest/.gpu" && mkdir -p "$dest/.gpu/bin"
  for b in lazykv-worker lazykvd lazykv inplace_bench; do
    cp build-cuda/bin/$b "$dest/.gpu/bin/" && strip "$dest/.gpu/bin/$b"
  done
  bash /work/shared/tools/bundle-libs "$dest/.gpu/lib" "$dest"/.gpu/bin/*
  du -sh "$dest" "$dest/.gpu"
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
STEPS=${STEPS:-worker hbm inplace}
BACKEND=${BACKEND:-cuda}
HOT=${HOT:-cuda}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
R8=$OUT/r8.jsonl
VOCAB8=${VOCAB8:-128256}
SYNTH=${SYNTH:-llama3-8b:1}
PROF8=${PROF8:-llama-3.1-8b}
python3 - $VOCAB8 > "$R8" <<'P'
import json, random, sys
rnd = random.Random(7)
V = int(sys.argv[1])
def toks(n): return [rnd.randrange(1, V) for _ in range(n)]
reqs = [dict(id="p0", docs=[{"tokens": toks(40)}, {"tokens": toks(23)}], question={"tokens": toks(9)}, max_tokens=6, stop=False)]
for i in range(1, 8):
    reqs.append(dict(id="p%d" % i, docs=[{"tokens": toks(16 + 7 * i)} for _ in range(1 + i % 3)], question={"tokens": toks(5 + i)}, max_tokens=16, stop=False))
for r in reqs: print(json.dumps(r))
P
T="--model $M/stories260K.bin --tokenizer $M/tok512.bin --dtype bf16 --json --requests $tiny"
S="--synth llama3-8b:1 --dtype bf16 --local-pages 256 --backend cuda --json"
if has worker; then
$W $T > $OUT/tiny_cpu.jsonl
$W $T --bf16-weights > $OUT/tiny_cpu_bf16w.jsonl
$W $T --backend cuda --cuda-weights f32 > $OUT/tiny_gpu_f32w.jsonl
$W $T --backend cuda --cuda-weights bf16 > $OUT/tiny_gpu_bf16w.jsonl
$W $T --backend cuda --cuda-weights f32 --engine --max-batch 8 > $OUT/tiny_gpu_engine.jsonl
cmp_tokens $OUT/tiny_cpu.jsonl $OUT/tiny_gpu_f32w.jsonl "1a tiny greedy GPU (fp32 weights) == CPU" || fail=1
cmp_tokens $OUT/tiny_cpu_bf16w.jsonl $OUT/tiny_gpu_bf16w.jsonl "1b tiny GPU (bf16 weights) == CPU (bf16-rounded weights)" || fail=1
cmp_tokens $OUT/tiny_gpu_f32w.jsonl $OUT/tiny_gpu_engine.jsonl "2a tiny GPU batch (engine) == GPU solo" || fail=1
# 3. The 8B shape.
head -1 "$R8" > $OUT/r8_first.json
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
fi
# 4. The daemon's HBM arena: misses written in place, hits read in place from the same pages.
DPID=
stop_daemon() {
  if [ -n "$DPID" ] && kill -0 "$DPID" 2>/dev/null; then
    kill -TERM "$DPID"; wait "$DPID" 2>/dev/null
  fi
  DPID=
}
trap stop_daemon EXIT
ADDR=
if has hbm || has inplace; then
  DD=$(mktemp -d /tmp/lkv-hbm.XXXXXX)
  .gpu/bin/lazykvd --listen 127.0.0.1:0 --data-dir "$DD/d" --set hot_backend=$HOT \
    --set hot_bytes=${HBM_BYTES:-12GiB} --set profile.stories260k.dtype=bf16 \
    --set profile.stories260k.hot_bytes=256MiB ${DAEMON_EXTRA:-} > "$DD/out" \
    2> $OUT/lazykvd_hbm.log &
  DPID=$!
  for _ in $(seq 1 300); do
    ADDR=$(sed -n 's/^lazykvd listening on //p' "$DD/out" 2>/dev/null | head -n1)
    [ -n "$ADDR" ] && break
    kill -0 "$DPID" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$ADDR" ]; then echo "4: lazykvd did not start"; tail -20 $OUT/lazykvd_hbm.log; fail=1; fi
  grep -m1 -i "arena" $OUT/lazykvd_hbm.log
fi
if has hbm && [ -n "$ADDR" ]; then
  PL=host; [ "$BACKEND" = cuda ] && PL=dev-after,dev-below,dev-offset
  WB="--backend $BACKEND"; [ "$BACKEND" = cuda ] && WB="$WB --cuda-weights f32"
  TT="--model $M/stories260K.bin --tokenizer $M/tok512.bin --dtype bf16 --json --hash-kv $WB"
  cat "$tiny" "$tiny" > $OUT/tiny2.jsonl
  $W $TT --requests "$tiny" > $OUT/tiny_local_kv.jsonl || fail=1
  $W $TT --requests $OUT/tiny2.jsonl --daemon "$ADDR" --stats > $OUT/tiny_hbm.jsonl \
    2> $OUT/tiny_hbm.err || fail=1
  KEY=$(python3 -c "
import json
for l in open('$OUT/tiny_hbm.jsonl'):
    for d in json.loads(l).get('docs', []):
        if d.get('inplace'): print(d['key']); raise SystemExit" )
  .gpu/bin/lazykv --addr "$ADDR" get "$KEY" -o $OUT/tiny_doc.kv > /dev/null || fail=1
  python3 bench/worker/check_hbm.py $OUT/tiny_local_kv.jsonl $OUT/tiny_hbm.jsonl \
    "4a tiny, HBM arena" --stats $OUT/tiny_hbm.err --placement $PL \
    --kvfile $OUT/tiny_doc.kv "$KEY" || fail=1
  tail -1 $OUT/tiny_hbm.err
  # The engine (client-call thread) against the daemon: every document now a hit.
  $W $TT --requests "$tiny" --daemon "$ADDR" --engine --max-batch 8 > $OUT/tiny_hbm_engine.jsonl \
    || fail=1
  cmp_tokens $OUT/tiny_local_kv.jsonl $OUT/tiny_hbm_engine.jsonl \
    "4b tiny engine against the HBM arena == local" || fail=1
  # The 8B shape: its first three requests, twice.
  head -3 "$R8" > $OUT/r8s.jsonl; cat $OUT/r8s.jsonl $OUT/r8s.jsonl > $OUT/r8x2.jsonl
  S8="--synth $SYNTH --dtype bf16 --local-pages 256 --json --hash-kv --backend $BACKEND"
  t0=$SECONDS
  $W $S8 --requests $OUT/r8s.jsonl > $OUT/8b_local_kv.jsonl || fail=1
  $W $S8 --requests $OUT/r8x2.jsonl --daemon "$ADDR" --profile $PROF8 --stats \
    > $OUT/8b_hbm.jsonl 2> $OUT/8b_hbm.err || fail=1
  echo "  8B local + HBM processes: $((SECONDS - t0)) s"
  KEY8=$(python3 -c "
import json
for l in open('$OUT/8b_hbm.jsonl'):
    for d in json.loads(l).get('docs', []):
        if d.get('inplace'): print(d['key']); raise SystemExit" )
  .gpu/bin/lazykv --addr "$ADDR" get "$KEY8" -o $OUT/8b_doc.kv > /dev/null || fail=1
  python3 bench/worker/check_hbm.py $OUT/8b_local_kv.jsonl $OUT/8b_hbm.jsonl \
    "4c 8B shape, HBM arena" --stats $OUT/8b_hbm.err --placement $PL \
    --kvfile $OUT/8b_doc.kv "$KEY8" || fail=1
  rm -f $OUT/8b_doc.kv
  python3 -c "
import json
for l in open('$OUT/8b_hbm.jsonl'):
    r=json.loads(l); print('  8B %s: hits %d/%d, in place %d, TTFT %.1f ms (lookup %.1f, attach %.1f, misses %.1f), TPOT %.2f ms, total %.1f ms' % (r['id'], sum(d['hit'] for d in r['docs']), len(r['docs']), sum(d['inplace'] for d in r['docs']), r.get('ttft_ms',0), r.get('lookup_ms',0), r.get('attach_ms',0), r.get('miss_ms',0), r.get('tpot_ms',0), r.get('total_ms',0)))"
fi
# 5. Put in place vs Put on the H200.
if has inplace && [ -n "$ADDR" ]; then
  DEV=--device; [ "$HOT" = cuda ] || DEV=
  for tk in 512 2048; do
    timeout 120 .gpu/bin/inplace_bench --target "$ADDR" $DEV --tokens $tk --docs 3 --reps 3 \
      --json $OUT/inplace_${tk}.json || fail=1
  done
fi
stop_daemon
echo "run_gpu.sh: $([ $fail = 0 ] && echo ALL PASS || echo SOME CHECKS FAILED)"
# At most a few files come back from the device: keep the log and the reference JSON, pack the rest.
(cd "$OUT" && tar czf rest.tgz --remove-files $(ls | grep -v -e '^worker_gpu.log$' -e '^synth_ref.json$' -e '^inplace_.*json$' -e '^rest.tgz$' -e '^lazykvd_hbm.log$') 2>/dev/null)
exit $fail
