#!/usr/bin/env python3
"""sdpa_bench.py: PyTorch baselines for bench/kernels/run_gpu.sh (JSON lines to argv[1]).

Same shapes as bench_attn.cu (Llama-3.1-8B heads: 32 query / 8 kv heads, head_dim 128, bf16),
contiguous KV, random data, L2 flushed (256 MiB write) before each repetition, CUDA-event
timing, medians:
  decode   torch.nn.functional.scaled_dot_product_attention, q [b, 32, 1, 128],
           k/v [b, 8, ctx, 128], with each backend forced separately (FLASH_ATTENTION,
           EFFICIENT_ATTENTION, CUDNN_ATTENTION through torch.nn.attention.sdpa_kernel) and the
           default dispatcher. Each backend is tried with enable_gqa=True first; one that refuses
           it runs on K/V expanded to 32 heads (repeat_interleave, outside the timed region;
           mode "repeat": it reads 4x the bytes, the TB/s column still counts the 8-head bytes).
           Variants: sdpa_<backend> (one launch timed by events), sdpa_<backend>_graph (the same
           launch captured in a CUDA graph, graph replay timed), and at batch 1
           sdpa_<backend>_graph32 (32 layers, each its own K/V, one graph of 32 launches, the
           median replay divided by 32: the per-layer time of a decode step).
  prefill  q [1, 32, n_new, 128] against k/v [1, 8, ctx + n_new, 128] with a bottom-right
           causal mask (torch.nn.attention.bias.causal_lower_right), default dispatcher;
  gemm     torch.matmul bf16 8192 x 8192 x 8192: the tensor-core ceiling;
  copy     torch copy_ of 4 GiB (read + write bytes): the bandwidth ceiling.
Arguments after the output: "quick" skips batches above 16; "prefill" skips decode; "decode"
skips prefill.
"""
import json
import sys

import torch
import torch.nn.functional as F

try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # pragma: no cover
    SDPBackend = None

HQ, HKV, D = 32, 8, 128
LAYERS = 32
dev = "cuda"
flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)


def median(ts):
    ts = sorted(ts)
    n = len(ts)
    return ts[n // 2] if n % 2 else 0.5 * (ts[n // 2 - 1] + ts[n // 2])


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
    return median(ts)


def graph_of(fn):
    """Captures fn (already warmed up) in a CUDA graph; returns its replay function."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g.replay


def rnd(*shape):
    return torch.rand(*shape, device=dev, dtype=torch.bfloat16) * 2 - 1


BACKENDS = []
if SDPBackend is not None:
    BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                ("cudnn", SDPBackend.CUDNN_ATTENTION)]


def decode_fn(backend, q, k, v, scale):
    """Returns (fn, mode) for one backend, or (None, reason) if it refuses the shape."""
    def mk(kk, vv, gqa):
        if backend is None:
            return lambda: F.scaled_dot_product_attention(q, kk, vv, scale=scale, enable_gqa=gqa)

        def f():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, kk, vv, scale=scale, enable_gqa=gqa)
        return f
    err = ""
    try:
        fn = mk(k, v, True)
        fn()
        torch.cuda.synchronize()
        return fn, "enable_gqa", None
    except Exception as e:  # noqa: BLE001
        err = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
    try:
        k2 = k.repeat_interleave(HQ // HKV, dim=1)
        v2 = v.repeat_interleave(HQ // HKV, dim=1)
        fn = mk(k2, v2, False)
        fn()
        torch.cuda.synchronize()
        return fn, "repeat", (k2, v2)
    except Exception as e:  # noqa: BLE001
        torch.cuda.synchronize()
        return None, "refused: " + err + " / " + (str(e).splitlines()[0][:160] if str(e) else ""), None


def main():
    out = open(sys.argv[1] if len(sys.argv) > 1 else "sdpa.jsonl", "w")
    quick = "quick" in sys.argv[2:]
    prefill_only = "prefill" in sys.argv[2:]
    decode_only = "decode" in sys.argv[2:]

    def emit(rec):
        out.write(json.dumps(rec) + "\n")
        out.flush()

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"cudnn {torch.backends.cudnn.version()}")
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
    backends = BACKENDS + [("default", None)]
    for batch in (() if prefill_only else (1, 16, 64, 128)):
        for ctx in (4096, 8192, 32768):
            if quick and batch > 16:
                continue
            q = rnd(batch, HQ, 1, D)
            k = rnd(batch, HKV, ctx, D)
            v = rnd(batch, HKV, ctx, D)
            kv_bytes = 2 * k.numel() * 2
            reps = 15 if kv_bytes > 4e9 else 40
            for name, be in backends:
                fn, mode, keep = decode_fn(be, q, k, v, scale)
                if fn is None:
                    print(f"sdpa_{name} decode b={batch} ctx={ctx}: {mode}")
                    emit({"op": "decode", "batch": batch, "ctx": ctx, "variant": "sdpa_" + name,
                          "refused": mode})
                    continue
                if mode == "repeat" and batch * ctx > 16 * 32768:
                    pass  # Already allocated; fine on 141 GB.
                variants = [("", fn)]
                try:
                    variants.append(("_graph", graph_of(fn)))
                except Exception as e:  # noqa: BLE001
                    torch.cuda.synchronize()
                    print(f"sdpa_{name} graph capture refused: {str(e).splitlines()[0][:160]}")
                for suffix, f in variants:
                    us = time_us(f, reps)
                    tbps = kv_bytes / (us * 1e-6) / 1e12
                    print(f"sdpa_{name + suffix:16s} decode b={batch:3d} ctx={ctx:5d} {us:9.1f} us "
                          f"{tbps:6.2f} TB/s ({mode})")
                    emit({"op": "decode", "batch": batch, "ctx": ctx,
                          "variant": "sdpa_" + name + suffix, "median_us": us,
                          "kv_bytes": kv_bytes, "tbps": tbps, "mode": mode})
                del variants, fn, keep
            del q, k, v
            torch.cuda.empty_cache()
            if batch != 1:
                continue
            # 32 layers of one decode step in one graph, each layer its own K/V.
            qs = [rnd(1, HQ, 1, D) for _ in range(LAYERS)]
            ks = [rnd(1, HKV, ctx, D) for _ in range(LAYERS)]
            vs = [rnd(1, HKV, ctx, D) for _ in range(LAYERS)]
            for name, be in backends:
                fns = []
                for layer in range(LAYERS):
                    fn, mode, keep = decode_fn(be, qs[layer], ks[layer], vs[layer], scale)
                    if fn is None:
                        break
                    fns.append((fn, keep))
                if len(fns) < LAYERS:
                    continue

                def step():
                    for fn, _ in fns:
                        fn()
                try:
                    rep = graph_of(step)
                except Exception as e:  # noqa: BLE001
                    torch.cuda.synchronize()
                    print(f"sdpa_{name} graph32 refused: {str(e).splitlines()[0][:160]}")
                    continue
                us = time_us(rep, 20) / LAYERS
                tbps = kv_bytes / (us * 1e-6) / 1e12
                print(f"sdpa_{name + '_graph32':16s} decode b=  1 ctx={ctx:5d} {us:9.1f} us/layer "
                      f"{tbps:6.2f} TB/s ({mode})")
                emit({"op": "decode", "batch": 1, "ctx": ctx, "variant": "sdpa_" + name + "_graph32",
                      "median_us": us, "kv_bytes": kv_bytes, "tbps": tbps, "mode": mode})
                del fns, rep
            del qs, ks, vs
            torch.cuda.empty_cache()

    try:
        from torch.nn.attention.bias import causal_lower_right
    except ImportError:  # pragma: no cover
        causal_lower_right = None
    for ctx in (() if decode_only else (8192, 32768)):
        for n_new in (64, 512, 2048):
            q = rnd(1, HQ, n_new, D)
            k = rnd(1, HKV, ctx + n_new, D)
            v = rnd(1, HKV, ctx + n_new, D)
            flops = 4.0 * n_new * HQ * D * (ctx + (n_new + 1) / 2.0)
            mask = causal_lower_right(n_new, ctx + n_new) if causal_lower_right else None
            k2 = k.repeat_interleave(HQ // HKV, dim=1)
            v2 = v.repeat_interleave(HQ // HKV, dim=1)
            # Every backend separately (and the default dispatcher), GQA first, then repeated
            # heads; variant "sdpa" keeps the default dispatcher's number for older tables.
            for name, be in BACKENDS + [("default", None)]:
                fn, mode = None, None
                for gqa in (True, False):
                    kk, vv = (k, v) if gqa else (k2, v2)

                    def f(kk=kk, vv=vv, gqa=gqa, be=be):
                        if be is None:
                            return F.scaled_dot_product_attention(
                                q, kk, vv, attn_mask=mask, scale=scale, enable_gqa=gqa)
                        with sdpa_kernel(be):
                            return F.scaled_dot_product_attention(
                                q, kk, vv, attn_mask=mask, scale=scale, enable_gqa=gqa)
                    try:
                        f()
                        torch.cuda.synchronize()
                        fn, mode = f, "enable_gqa" if gqa else "repeat"
                        break
                    except Exception as e:  # noqa: BLE001
                        torch.cuda.synchronize()
                        err = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
                if fn is None:
                    print(f"sdpa_{name} prefill new={n_new} ctx={ctx} refused: {err}")
                    continue
                us = time_us(fn, 20)
                tf = flops / (us * 1e-6) / 1e12
                print(f"sdpa_{name:9s} prefill new={n_new:4d} ctx={ctx:5d} {us:9.1f} us "
                      f"{tf:6.1f} TFLOP/s ({mode})")
                for var in (["sdpa_" + name] + (["sdpa"] if name == "default" else [])):
                    emit({"op": "prefill", "n_new": n_new, "ctx": ctx, "variant": var,
                          "median_us": us, "flops": flops, "tflops": tf, "mode": mode})
            del k2, v2
            del q, k, v
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
