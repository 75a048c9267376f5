#!/usr/bin/env bash
# bench/gpu/daemon_hbm_check.sh: on a GPU host, start lazykvd with its hot tier in HBM
# (hot_backend = cuda), put documents through the real CLI, get them back and compare byte for
# byte; restart the daemon on the same data dir and check again (cold tier -> HBM promotion).
# Prints PASS or FAIL and exits non-zero on failure.
#
# Run from the repository root. Binaries come from BIN (default build/bin), built on a machine
# with the service libraries; on the lent H200 they travel with their libraries (see
# bench/gpu/run_on_device.md):  LD_LIBRARY_PATH=$PWD/.gpu/lib:... bash bench/gpu/daemon_hbm_check.sh
set -euo pipefail
BIN=${BIN:-build/bin}
work=$(mktemp -d /tmp/lkv-hbm.XXXXXX)
log=$work/lazykvd.log
pid=""
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; true; }
trap cleanup EXIT

start() {
    "$BIN/lazykvd" --listen 127.0.0.1:0 --set hot_backend=cuda --set hot_bytes=4GiB \
        --set data_dir="$work/data" --set durability=write-back >"$work/stdout" 2>>"$log" &
    pid=$!
    for _ in $(seq 1 300); do
        addr=$(sed -n 's/^lazykvd listening on //p' "$work/stdout" | head -1)
        [ -n "$addr" ] && return 0
        kill -0 "$pid" 2>/dev/null || { echo "lazykvd died:"; cat "$log"; exit 1; }
        sleep 0.1
    done
    echo "lazykvd did not start"; cat "$log"; exit 1
}

stop() {
    kill -TERM "$pid"
    wait "$pid" || { echo "lazykvd exited non-zero"; cat "$log"; exit 1; }
    pid=""
}

# Deterministic KV files: llama-3.1-8b (bf16, 2 MiB blocks) and stories260k (f32), with
# lengths that end in partial blocks (unused token slots zero, as the layout requires).
python3 - "$work" <<'PY'
import os, random, struct, sys
work = sys.argv[1]
profiles = {  # name: (layers, kv_heads, head_dim, elem_size, block_tokens)
    "llama-3.1-8b": (32, 8, 128, 2, 16),
    "stories260k": (5, 4, 8, 4, 16),
}
docs = [("llama-3.1-8b", 37), ("llama-3.1-8b", 128), ("llama-3.1-8b", 200),
        ("stories260k", 100), ("stories260k", 16)]
for i, (prof, n) in enumerate(docs):
    L, H, D, es, B = profiles[prof]
    rng = random.Random(1000 + i)
    tokens = [rng.randrange(0, 500) for _ in range(n)]
    nb = (n + B - 1) // B
    blocks = bytearray()
    for b in range(nb):
        valid = min(B, n - b * B)
        for _slab in range(L * 2 * H):
            blocks += rng.randbytes(valid * D * es) + bytes((B - valid) * D * es)
    bb = L * 2 * H * B * D * es
    name = prof.encode()
    hdr = b"LKVKV1\0\0" + struct.pack("<IIIIII", 1, 1, len(name), n, nb, 0) + struct.pack("<Q", bb)
    pad = lambda x: b"\0" * ((-len(x)) % 8)
    body = name + pad(name)
    toks = struct.pack("<%dI" % n, *tokens)
    with open(f"{work}/doc{i}.kv", "wb") as f:
        f.write(hdr + body + toks + pad(toks) + bytes(blocks))
    with open(f"{work}/doc{i}.meta", "w") as f:
        f.write(f"{prof} {','.join(map(str, tokens))}\n")
print(f"wrote {len(docs)} KV files")
PY

check_all() {
    local round=$1 ok=0 fail=0
    for f in "$work"/doc*.kv; do
        read -r prof toks <"${f%.kv}.meta"
        "$BIN/lazykv" --addr "$addr" get --profile "$prof" --tokens "$toks" -o "$f.back" >/dev/null
        if cmp -s "$f" "$f.back"; then ok=$((ok + 1)); else fail=$((fail + 1)); echo "MISMATCH $f ($round)"; fi
    done
    echo "$round: $ok intact, $fail mismatched"
    [ "$fail" -eq 0 ]
}

start
grep -i "cuda\|arena\|hot tier" "$log" | head -5 || true
for f in "$work"/doc*.kv; do "$BIN/lazykv" --addr "$addr" put "$f"; done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null || true
check_all "after put (HBM hot tier)"
"$BIN/lazykv" --addr "$addr" stats | head -40
stop
start
check_all "after restart (RocksDB -> HBM promotion)"
"$BIN/lazykv" --addr "$addr" stats | grep -i "promot\|hit\|backend" | head -10 || true
stop
echo "PASS: lazykvd with hot_backend=cuda served every document intact"
