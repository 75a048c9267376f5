"""synth_ref.py: PyTorch reference of the worker's random-weight models (client/worker/lkv_synth.h).

Makes the SAME weights bit for bit (the counter-based generator of lkv_synth.h in int64 torch
arithmetic on the GPU), rounds them to bf16 as the worker's CUDA backend stores them, and runs a
plain fp32 forward of the prompt [doc_0][doc_1]...[question][generated tokens] with the
block-attention mask (each document's tokens attend causally within that document only, at
their absolute positions; question and generated tokens attend to everything before them),
Llama-3.1 RoPE (llama3 scaling, half-split pairs, angles in fp64). It compares, row by row, the
logits that chose each generated token with the worker's (--dump-logits, fp32 [n_out][vocab]).

    python3 synth_ref.py --preset llama3-8b --seed 1 --request REQ.json --result RES.json \
        --logits L.bin [--tol 0.05] [--json OUT.json]

REQ.json: the worker request line (token-id documents and question); RES.json: its result line.
Exit status 0 when every row's relative L2 error is within --tol.
"""
import argparse
import json
import math
import sys

import torch

M32 = 0xFFFFFFFF


def mul32(a, c):
    lo, hi = c & 0xFFFF, c >> 16
    return (a * lo + (((a * hi) & 0xFFFF) << 16)) & M32


def fmix32_t(h):
    h = h ^ (h >> 16)
    h = mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def fmix32_i(h):
    h &= M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def tensor_weights(seed, t, n, scale, dev, chunk=1 << 26):
    key = fmix32_i(seed ^ fmix32_i((t * 0x9E3779B9 + 0x7F4A7C15) & M32))
    out = torch.empty(n, dtype=torch.float32, device=dev)
    sc = torch.tensor(scale, dtype=torch.float32, device=dev)
    for o in range(0, n, chunk):
        k = min(chunk, n - o)
        i = torch.arange(o, o + k, dtype=torch.int64, device=dev)
        h = fmix32_t(i ^ key)
        u = (h >> 8).to(torch.float32) * (1.0 / 8388608.0) - 1.0
        out[o:o + k] = sc * u
    return out


PRESETS = {
    "llama3-8b": dict(dim=4096, hidden=14336, layers=32, heads=32, kv_heads=8, vocab=128256),
    "llama3-mini": dict(dim=256, hidden=512, layers=2, heads=4, kv_heads=2, vocab=512),
}


def llama3_inv_freq(hd, theta=500000.0, factor=8.0, low=1.0, high=4.0, orig=8192.0):
    inv = [1.0 / theta ** (2 * j / hd) for j in range(hd // 2)]
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < orig / high:
            out.append(f)
        elif wavelen > orig / low:
            out.append(f / factor)
        else:
            s = (orig / wavelen - low) / (high - low)
            out.append((1 - s) * f / factor + s * f)
    return torch.tensor(out, dtype=torch.float64)


def rope(x, pos, inv):  # x [T, H, hd] fp32; half-split pairs; angles fp64
    hd = x.shape[-1]
    ang = pos.to(torch.float64)[:, None] * inv.to(x.device)[None, :]
    c, s = torch.cos(ang).float()[:, None, :], torch.sin(ang).float()[:, None, :]
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--request", required=True)
    ap.add_argument("--result", required=True)
    ap.add_argument("--logits", required=True)
    ap.add_argument("--tol", type=float, default=0.05)
    ap.add_argument("--json")
    a = ap.parse_args()
    p = PRESETS[a.preset]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    D, Hd, L, H, KVH, V = p["dim"], p["hidden"], p["layers"], p["heads"], p["kv_heads"], p["vocab"]
    hd = D // H
    KV = KVH * hd
    sizes = [V * D, L * D, L * D * D, L * KV * D, L * KV * D, L * D * D, L * D, L * Hd * D,
             L * D * Hd, L * Hd * D, D, V * D]
    fan = [0, 0, D, D, D, D, 0, D, Hd, D, 0, D]
    W = []
    for t in range(12):
        if t in (1, 6, 10):
            W.append(torch.ones(sizes[t], dtype=torch.float32, device=dev))
            continue
        scale = 1.0 if t == 0 else float(torch.tensor(math.sqrt(3.0 / fan[t]),
                                                      dtype=torch.float32))
        W.append(tensor_weights(a.seed, t, sizes[t], scale, dev).to(torch.bfloat16).float())
    emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_f, wcls = W
    wq, wo = wq.view(L, D, D), wo.view(L, D, D)
    wk, wv = wk.view(L, KV, D), wv.view(L, KV, D)
    w1, w3, w2 = w1.view(L, Hd, D), w3.view(L, Hd, D), w2.view(L, D, Hd)
    emb, wcls = emb.view(V, D), wcls.view(V, D)

    req = json.loads(open(a.request).read())
    res = json.loads(open(a.result).read())
    docs = [d["tokens"] for d in req["docs"]]
    q = req["question"]["tokens"]
    gen = res["tokens"]
    toks = sum(docs, []) + q + gen[:-1]
    T = len(toks)
    seg = []  # segment id per token: doc index, or -1 for question/generated
    for i, d in enumerate(docs):
        seg += [i] * len(d)
    seg += [-1] * (T - len(seg))
    seg = torch.tensor(seg, device=dev)
    pos = torch.arange(T, device=dev)
    causal = pos[None, :] <= pos[:, None]
    same = (seg[:, None] == seg[None, :]) | (seg[:, None] < 0)
    mask = causal & same
    inv = llama3_inv_freq(hd)

    def rms(x, w):
        return w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5))

    x = emb[torch.tensor(toks, device=dev)]
    for l in range(L):
        xb = rms(x, rms_att[l * D:(l + 1) * D])
        qq = (xb @ wq[l].T).view(T, H, hd)
        kk = (xb @ wk[l].T).view(T, KVH, hd)
        vv = (xb @ wv[l].T).view(T, KVH, hd)
        qq, kk = rope(qq, pos, inv), rope(kk, pos, inv)
        kk = kk.repeat_interleave(H // KVH, dim=1)
        vv = vv.repeat_interleave(H // KVH, dim=1)
        sc = torch.einsum("thd,shd->hts", qq, kk) / math.sqrt(hd)
        sc = sc.masked_fill(~mask[None], float("-inf"))
        att = torch.einsum("hts,shd->thd", torch.softmax(sc, dim=-1), vv).reshape(T, D)
        x = x + att @ wo[l].T
        xb = rms(x, rms_ffn[l * D:(l + 1) * D])
        h1, h3 = xb @ w1[l].T, xb @ w3[l].T
        x = x + (torch.nn.functional.silu(h1) * h3) @ w2[l].T
    logits = rms(x, rms_f) @ wcls.T
    n_out = len(gen)
    first = T - n_out  # row of the last question token
    ref = logits[first:first + n_out].double().cpu()
    got = torch.frombuffer(bytearray(open(a.logits, "rb").read()), dtype=torch.float32)
    got = got.view(-1, V)[:n_out].double()
    rows = []
    ok = True
    for i in range(n_out):
        rel = float((got[i] - ref[i]).norm() / ref[i].norm())
        mad = float((got[i] - ref[i]).abs().max())
        top = int(ref[i].argmax()) == int(got[i].argmax())
        rows.append(dict(row=i, rel_l2=rel, max_abs=mad, ref_std=float(ref[i].std()),
                         same_argmax=top, finite=bool(torch.isfinite(got[i]).all())))
        ok &= rel <= a.tol and rows[-1]["finite"]
        print("row %d: rel L2 %.4g, max |diff| %.4g (ref std %.3g), same argmax %s"
              % (i, rel, mad, rows[-1]["ref_std"], top))
    out = dict(preset=a.preset, seed=a.seed, prompt_tokens=T - n_out + 1, rows=rows,
               tol=a.tol, ok=ok, device=torch.cuda.get_device_name() if dev == "cuda" else dev)
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)
    print("8B-shape logits vs PyTorch block-attention forward: %s (tol rel L2 %.3g)"
          % ("PASS" if ok else "FAIL", a.tol))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
