#!/usr/bin/env bash
# bench/gpu/ipc_check.sh: the zero-copy lease check (issue 4, item 2). Starts lazykvd with its
# hot tier in HBM (hot_backend = cuda), puts documents through the real CLI, attaches them
# (Cache/Attach, a worker lease), and has a SECOND process (lkv_ipc_reader) open the arena
# through the CUDA IPC handle of the Attach reply and read every attached block in place,
# byte for byte against what was put. Then it releases the lease and checks that a released
# lease is gone. Prints PASS or FAIL and exits non-zero on failure.
#
# Run from the repository root. Binaries come from BIN (default build/bin): lazykvd, lazykv and
# lkv_ipc_reader (built when nvcc is found). On the lent H200 they travel with their libraries
# (see bench/gpu/daemon_hbm_check.sh and DESIGN.md 11.2):
#     export LD_LIBRARY_PATH=$PWD/.gpu/lib:$(bash .gpu/lib/nccl-path):/usr/local/cuda/lib64
#     bash bench/gpu/ipc_check.sh
# BACKEND=host runs the same flow with a shared-memory arena and lkv_shm_reader (any machine).
# PYTHON (default python3) needs only grpcio (bench/gpu/ipc_attach.py encodes by hand).
set -euo pipefail
BIN=${BIN:-build/bin}
BACKEND=${BACKEND:-cuda}
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/lkv-ipc.XXXXXX)
log=$work/lazykvd.log
pid=""
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; true; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "---- lazykvd log ----"; tail -30 "$log"; exit 1; }

hot=4GiB
[ "$BACKEND" = host ] && hot=256MiB
"$BIN/lazykvd" --listen 127.0.0.1:0 --set hot_backend="$BACKEND" --set hot_bytes=$hot \
    --set data_dir="$work/data" >"$work/stdout" 2>>"$log" &
pid=$!
addr=""
for _ in $(seq 1 300); do
    addr=$(sed -n 's/^lazykvd listening on //p' "$work/stdout" | head -1)
    [ -n "$addr" ] && break
    kill -0 "$pid" 2>/dev/null || fail "lazykvd died at start"
    sleep 0.1
done
[ -n "$addr" ] || fail "lazykvd did not start"
grep -i "arena" "$log" | head -3 || true

# Deterministic documents: KV files for the CLI, raw blocks for the reader, tokens for Attach.
"$PYTHON" - "$work" <<'PY'
import random, struct, sys
work = sys.argv[1]
profiles = {"llama-3.1-8b": (32, 8, 128, 2, 16), "stories260k": (5, 4, 8, 4, 16)}
docs = [("llama-3.1-8b", 37), ("llama-3.1-8b", 128), ("llama-3.1-8b", 200),
        ("stories260k", 100), ("stories260k", 16)]
for i, (prof, n) in enumerate(docs):
    L, H, D, es, B = profiles[prof]
    rng = random.Random(4000 + i)
    tokens = [rng.randrange(0, 500) for _ in range(n)]
    nb = (n + B - 1) // B
    blocks = bytearray()
    for b in range(nb):
        valid = min(B, n - b * B)
        for _ in range(L * 2 * H):
            blocks += rng.randbytes(valid * D * es) + bytes((B - valid) * D * es)
    bb = L * 2 * H * B * D * es
    name = prof.encode()
    pad = lambda x: b"\0" * ((-len(x)) % 8)
    hdr = b"LKVKV1\0\0" + struct.pack("<IIIIII", 1, 1, len(name), n, nb, 0) + struct.pack("<Q", bb)
    toks = struct.pack("<%dI" % n, *tokens)
    with open(f"{work}/doc{i}.kv", "wb") as f:
        f.write(hdr + name + pad(name) + toks + pad(toks) + bytes(blocks))
    with open(f"{work}/doc{i}.blocks", "wb") as f:
        f.write(bytes(blocks))
    with open(f"{work}/doc{i}.spec", "w") as f:
        f.write(f"{prof}:{','.join(map(str, tokens))}\n")
print(f"wrote {len(docs)} documents")
PY
for f in "$work"/doc*.kv; do "$BIN/lazykv" --addr "$addr" put "$f" >/dev/null || fail "put $f"; done

specs=()
for s in "$work"/doc*.spec; do specs+=("$(cat "$s")"); done
"$PYTHON" "$HERE/ipc_attach.py" attach "$addr" 60000 "${specs[@]}" >"$work/attach.json" ||
    fail "Attach"
"$PYTHON" - "$work/attach.json" "$BACKEND" <<'PY' >"$work/readers.sh"
import json, shlex, sys
r = json.load(open(sys.argv[1]))
a = r["arena"]
assert a["backend"] == sys.argv[2], ("arena backend", a["backend"])
print("# lease %s: %d documents, arena %d bytes" % (
    r["lease_id"], len(r["docs"]), a["arena_bytes"]), file=sys.stderr)
for i, d in enumerate(r["docs"]):
    pages = ",".join(map(str, d["pages"]))
    if a["backend"] == "cuda":
        assert len(a["cuda_ipc_handle"]) == 128, "no IPC handle"
        args = ["lkv_ipc_reader", a["cuda_ipc_handle"], str(a["cuda_device"])]
    else:
        args = ["lkv_shm_reader", a["shm_name"], str(a["arena_bytes"])]
    # The document's region (the arena contract): base offset, page size, pages.
    args += [str(d["region_base"]), str(d["page_bytes"]), str(d["n_pages"]), str(d["block_bytes"]),
             pages]
    print('"$BIN"/' + " ".join(shlex.quote(x) for x in args) + ' "$work/doc%d.blocks"' % i)
print("LEASE=" + r["lease_id"])
PY
ok=0
bad=0
while read -r line; do
    case "$line" in
    LEASE=*) lease=${line#LEASE=} ;;
    *) if eval "$line"; then ok=$((ok + 1)); else bad=$((bad + 1)); fi ;;
    esac
done <"$work/readers.sh"
echo "in-place reads: $ok documents equal, $bad not"
released=$("$PYTHON" "$HERE/ipc_attach.py" release "$addr" "$lease") || fail "Release"
echo "released $released documents"
if "$PYTHON" "$HERE/ipc_attach.py" release "$addr" "$lease" 2>/dev/null; then
    fail "a released lease could be released again"
fi
"$BIN/lazykv" --addr "$addr" stats 2>/dev/null | grep -A9 "^# Leases" || true
kill -TERM "$pid"
wait "$pid" || fail "lazykvd exited non-zero"
pid=""
[ "$bad" -eq 0 ] && [ "$ok" -eq 5 ] && [ "$released" -eq 5 ] || fail "$bad mismatched"
echo "PASS: a second process read every attached block in place through the $BACKEND arena"
