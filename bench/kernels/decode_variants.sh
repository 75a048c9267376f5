#!/usr/bin/env bash
# decode_variants.sh: on the GPU machine, in ONE device call, the decode kernel variants of
# kernels/dev/README.md round 7 (issue 14): each variant (environment knobs read at plan
# creation) is checked against the CPU reference (test_attn_gpu, decode and graph cases only:
# LKV_GPU_CHECK_ONLY=decode) and timed (bench_attn on the chosen decode shapes), and the
# benchmark of an older binary can run beside them (OLD_BENCH). Programs built on the dev machine
# and carried (same nvcc 13.0, sm_90):
#   BUILD       build folder with bin/test_attn_gpu and bin/bench_attn (default build-k)
#   OLD_BENCH   an older bench_attn to time first and last (optional)
#   VARIANTS    space-separated items NAME:VAR=v,VAR=v (NAME:- for the defaults)
#   CHECK       space-separated variant names to check (default: every variant)
#   ONLY        LKV_BENCH_ONLY for every timing run
#   REPS        LKV_BENCH_REPS (default 30)
# Output in $VOUT (default $OUT): variants.jsonl (one bench_attn record per line, with
# "vname"), table.txt (lazy / norot / graph medians per case and variant); the check and
# benchmark logs stay in /tmp (dv_check.log, dv_bench.log); the checks' result lines go to
# stdout and to the end of table.txt.
set -uo pipefail
OUT=${OUT:-bench/out}
VOUT=${VOUT:-$OUT}
mkdir -p "$VOUT"
BUILD=${BUILD:-build-k}
ONLY=${ONLY:-decode:1:4096,decode:16:4096,decode:16:8192,decode:16:32768,decode:64:4096}
REPS=${REPS:-30}
log() { echo "== $* ($(date -u +%H:%M:%S))"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader || true
: >"$VOUT/variants.jsonl"
: >/tmp/dv_checks.txt

bench_one() { # name prog envs...
  local name=$1 prog=$2; shift 2
  log "bench $name"
  rm -f /tmp/v.jsonl
  env "$@" LKV_BENCH_ONLY="$ONLY" LKV_BENCH_REPS="$REPS" timeout 120 "$prog" /tmp/v.jsonl \
    >>/tmp/dv_bench.log 2>&1
  echo "bench $name rc=$?"
  [ -f /tmp/v.jsonl ] && sed "s/^{/{\"vname\":\"$name\",/" /tmp/v.jsonl >>"$VOUT/variants.jsonl"
}

[ -n "${OLD_BENCH:-}" ] && bench_one old "$OLD_BENCH"
for item in ${VARIANTS:-base:-}; do
  name=${item%%:*}; envs=${item#*:}; [ "$envs" = "-" ] && envs=""
  bench_one "$name" "$BUILD/bin/bench_attn" ${envs//,/ }
done
[ -n "${OLD_BENCH:-}" ] && bench_one old2 "$OLD_BENCH"

for item in ${VARIANTS:-base:-}; do
  name=${item%%:*}; envs=${item#*:}; [ "$envs" = "-" ] && envs=""
  case " ${CHECK:-$name} " in *" $name "*) ;; *) continue ;; esac
  log "check $name"
  echo "######## check $name ($envs)" >>/tmp/dv_check.log
  env ${envs//,/ } LKV_GPU_CHECK_ONLY=decode LKV_GPU_CHECK_CASES=1 timeout 120 \
    "$BUILD/bin/test_attn_gpu" >>/tmp/dv_check.log 2>&1
  echo "check $name rc=$?: $(grep -E 'test_attn_gpu:' /tmp/dv_check.log | tail -1)" |
    tee -a /tmp/dv_checks.txt
  grep -E "FAIL" /tmp/dv_check.log | tail -5 | tee -a /tmp/dv_checks.txt
done

python3 - "$VOUT/variants.jsonl" <<'EOF' | tee "$VOUT/table.txt"
import json, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("op") != "decode":
        continue
    rows.setdefault((r["batch"], r["ctx"]), {}).setdefault(r["vname"], {})[r["variant"]] = r
names = []
for line in open(sys.argv[1]):
    n = json.loads(line)["vname"]
    if n not in names:
        names.append(n)
for (b, c), byv in sorted(rows.items()):
    print(f"b={b} ctx={c}")
    for n in names:
        if n not in byv:
            continue
        v = byv[n]
        f = lambda k: f"{v[k]['median_us']:9.2f}" if k in v else "        -"
        t = v.get("lazy", v.get("lazy_graph32", {})).get("tbps", 0)
        sp = next(iter(v.values()))["splits"]
        print(f"  {n:10s} lazy {f('lazy')} again {f('lazy_again')} norot {f('norot')} graph {f('lazy_graph')}"
              f" g32 {f('lazy_graph32')} g32n {f('norot_graph32')} g32a {f('lazy_graph32_again')}"
              f"  {t:.3f} TB/s splits {sp}")
EOF
cat /tmp/dv_checks.txt >>"$VOUT/table.txt"
