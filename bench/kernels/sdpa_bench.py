#!/usr/bin/env python3
"""sdpa_bench.py: PyTorch baselines for bench/kernels/run_gpu.sh (JSON lines to argv[1]).

Same shapes as bench_attn.cu (Llama-3.1-8B heads: 32 query / 8 kv heads, head_dim 128, bf16),
contiguous KV, random data, L2 flushed (256 MiB write) before each repetition, CUDA-event
timing, medians:
  decode   torch.nn.functional.scaled_dot_product_attention, q [b, 32, 1, 128],
           k/v [b, 8, ctx, 128], enable_gqa=True (falls back to repeat_interleave outside the
           timed region if the build refuses GQA);
  prefill  q [1, 32, n_new, 128] against k/v [1, 8, ctx + n_new, 128] with a bottom-right
           causal mask (torch.nn.attention.bias.causal_lower_right), so new token i sees the
           whole cache and new tokens <= i;
  gemm     torch.matmul bf16 8192 x 8192 x 8192: the tensor-core ceiling.
"""
import json
import sys

import torch
import torch.nn.functional as F

HQ, HKV, D = 32, 8, 128
dev = "cuda"
flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)


def time_us(fn, reps):
    fn()
    fn()
    torch.cuda.synchronize()
    ts = []
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    for i in range(reps):
        flush.fill_(i & 0xFF)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000.0)
    ts.sort()
    n = len(ts)
    return ts[n // 2] if n % 2 else 0.5 * (ts[n // 2 - 1] + ts[n // 2])


def rnd(*shape):
    return torch.rand(*shape, device=dev, dtype=torch.bfloat16) * 2 - 1


def main():
    out = open(sys.argv[1] if len(sys.argv) > 1 else "sdpa.jsonl", "w")
    quick = len(sys.argv) > 2 and sys.argv[2] == "quick"

    def emit(rec):
        out.write(json.dumps(rec) + "\n")
        out.flush()

    # GEMM ceiling.
    n = 8192
    x, y = rnd(n, n), rnd(n, n)
    us = time_us(lambda: torch.matmul(x, y), 10)
    tf = 2.0 * n ** 3 / (us * 1e-6) / 1e12
    print(f"gemm {n}^3 bf16: {us:.1f} us {tf:.1f} TFLOP/s")
    emit({"op": "gemm", "n": n, "median_us": us, "tflops": tf})
    del x, y

    # Copy ceiling through torch too (cross-check of the C one).
    src = torch.empty(4 << 30, dtype=torch.uint8, device=dev)
    src.fill_(3)
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), 10)
    emit({"op": "copy_torch", "bytes": src.numel(), "median_us": us,
          "tbps": 2.0 * src.numel() / (us * 1e-6) / 1e12})
    print(f"torch copy 4 GiB: {us:.1f} us {2.0 * src.numel() / (us * 1e-6) / 1e12:.2f} TB/s")
    del src, dst

    scale = 1.0 / D ** 0.5
    for batch in (1, 16, 64, 128):
        for ctx in (4096, 8192, 32768):
            if quick and batch > 16:
                continue
            q = rnd(batch, HQ, 1, D)
            k = rnd(batch, HKV, ctx, D)
            v = rnd(batch, HKV, ctx, D)
            kv_bytes = 2 * k.numel() * 2
            mode = "enable_gqa"
            try:
                fn = lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
                fn()
            except Exception as e:  # noqa: BLE001
                print("enable_gqa refused:", e)
                mode = "repeat"
                k2 = k.repeat_interleave(HQ // HKV, dim=1)
                v2 = v.repeat_interleave(HQ // HKV, dim=1)
                fn = lambda: F.scaled_dot_product_attention(q, k2, v2, scale=scale)
            reps = 15 if kv_bytes > 4e9 else 40
            us = time_us(fn, reps)
            tbps = kv_bytes / (us * 1e-6) / 1e12
            print(f"sdpa decode b={batch:3d} ctx={ctx:5d} {us:9.1f} us {tbps:6.2f} TB/s ({mode})")
            emit({"op": "decode", "batch": batch, "ctx": ctx, "variant": "sdpa",
                  "median_us": us, "kv_bytes": kv_bytes, "tbps": tbps, "mode": mode})
            del q, k, v
            torch.cuda.empty_cache()

    try:
        from torch.nn.attention.bias import causal_lower_right
    except ImportError:  # pragma: no cover
        causal_lower_right = None
    for ctx in (8192, 32768):
        for n_new in (64, 512, 2048):
            q = rnd(1, HQ, n_new, D)
            k = rnd(1, HKV, ctx + n_new, D)
            v = rnd(1, HKV, ctx + n_new, D)
            flops = 4.0 * n_new * HQ * D * (ctx + (n_new + 1) / 2.0)
            mask = causal_lower_right(n_new, ctx + n_new) if causal_lower_right else None
            mode = "enable_gqa"
            try:
                fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                            enable_gqa=True)
                fn()
            except Exception as e:  # noqa: BLE001
                print("prefill enable_gqa refused:", str(e).splitlines()[0])
                mode = "repeat"
                k2 = k.repeat_interleave(HQ // HKV, dim=1)
                v2 = v.repeat_interleave(HQ // HKV, dim=1)
                fn = lambda: F.scaled_dot_product_attention(q, k2, v2, attn_mask=mask, scale=scale)
            us = time_us(fn, 20)
            tf = flops / (us * 1e-6) / 1e12
            print(f"sdpa prefill new={n_new:4d} ctx={ctx:5d} {us:9.1f} us {tf:6.1f} TFLOP/s ({mode})")
            emit({"op": "prefill", "n_new": n_new, "ctx": ctx, "variant": "sdpa",
                  "median_us": us, "flops": flops, "tflops": tf, "mode": mode})
            del q, k, v
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
