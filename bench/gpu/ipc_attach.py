"""ipc_attach.py: Attach / Release against a running lazykvd with nothing but grpcio.

Used by bench/gpu/ipc_check.sh on the GPU host, whose Python has grpcio but a protobuf runtime
that may not load this project's generated stubs; so the few messages needed are encoded and
decoded here by hand (protobuf wire format: varints, length-delimited fields, packed uint32),
following proto/lazykv/v1/cache.proto field numbers.

    ipc_attach.py attach ADDR TTL_MS PROFILE:TOKENS_CSV [PROFILE:TOKENS_CSV ...]
        prints one JSON object: lease_id (hex), expires_unix_ms, arena {backend, shm_name,
        arena_bytes, cuda_device, cuda_ipc_handle (hex)}, docs [{key (hex), profile, region_base,
        page_bytes, n_pages,
        n_tokens, block_bytes, pages}]
    ipc_attach.py release ADDR LEASE_HEX
        prints the number of documents released.
Exit status 0, or 1 with the gRPC status on stderr.
"""
import json
import sys

import grpc


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(num, data):
    return varint(num << 3 | 2) + varint(len(data)) + data


def field_varint(num, v):
    return varint(num << 3) + varint(v)


def parse(buf):
    """Returns {field number: [values]}: ints for varints, bytes for length-delimited."""
    out, i = {}, 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(buf, i)
        elif wt == 2:
            n, i = read_varint(buf, i)
            v, i = bytes(buf[i:i + n]), i + n
        elif wt == 1:
            v, i = int.from_bytes(buf[i:i + 8], "little"), i + 8
        elif wt == 5:
            v, i = int.from_bytes(buf[i:i + 4], "little"), i + 4
        else:
            raise ValueError("wire type %d" % wt)
        out.setdefault(num, []).append(v)
    return out


def read_varint(buf, i):
    n, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def packed(vals):
    out = []
    for v in vals:
        if isinstance(v, int):
            out.append(v)
        else:
            i = 0
            while i < len(v):
                x, i = read_varint(v, i)
                out.append(x)
    return out


def one(d, k, default):
    return d.get(k, [default])[0]


def signed32(v):
    v &= 0xFFFFFFFFFFFFFFFF
    return v - (1 << 64) if v >= 1 << 63 else v


def call(addr, method, req):
    ch = grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 64 << 20)])
    try:
        return ch.unary_unary("/lazykv.v1.Cache/" + method)(req, timeout=30)
    except grpc.RpcError as e:
        sys.stderr.write("%s: %s: %s\n" % (method, e.code().name, e.details()))
        sys.exit(1)


def attach(addr, ttl_ms, specs):
    req = b""
    for spec in specs:
        prof, toks = spec.split(":", 1)
        ids = b"".join(varint(int(t)) for t in toks.split(","))
        tokdoc = field_bytes(1, prof.encode()) + field_bytes(2, ids)
        req += field_bytes(1, field_bytes(2, tokdoc))  # AttachRequest.docs[].tokens
    req += field_varint(4, ttl_ms)
    r = parse(call(addr, "Attach", req))
    a = parse(one(r, 4, b""))
    out = {
        "lease_id": one(r, 1, b"").hex(),
        "expires_unix_ms": one(r, 2, 0),
        "arena": {
            "backend": one(a, 1, b"").decode(),
            "shm_name": one(a, 2, b"").decode(),
            "arena_bytes": one(a, 7, 0),
            "cuda_device": signed32(one(a, 5, 0)),
            "cuda_ipc_handle": one(a, 6, b"").hex(),
        },
        "docs": [],
    }
    for raw in r.get(5, []):
        d = parse(raw)
        lay = parse(one(d, 3, b""))
        reg = parse(one(d, 7, b""))  # AttachedDoc.region (the arena contract)
        out["docs"].append({
            "region_base": one(reg, 2, 0),
            "page_bytes": one(reg, 3, 0),
            "n_pages": one(reg, 4, 0),
            "key": one(d, 1, b"").hex(),
            "profile": one(d, 2, b"").decode(),
            "n_tokens": one(d, 4, 0),
            "block_bytes": one(lay, 6, 0),
            "pages": packed(d.get(5, [])),
        })
    print(json.dumps(out))


def release(addr, lease_hex):
    r = parse(call(addr, "Release", field_bytes(1, bytes.fromhex(lease_hex))))
    print(one(r, 1, 0))


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "attach":
        attach(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    elif len(sys.argv) == 4 and sys.argv[1] == "release":
        release(sys.argv[2], sys.argv[3])
    else:
        sys.stderr.write(__doc__)
        sys.exit(2)
