/*
 * lkv_cuda_common.cuh: device helpers shared by the LazyAttention CUDA kernels.
 *
 * - lkv__dev_pe: the part of lkv_posenc the kernels read, passed BY VALUE as a kernel
 *   parameter (about 1.1 KB; well under the 4 KB classic parameter limit). ALiBi slopes are
 *   passed per launch as a separate pointer-free array only where needed (lkv__dev_slopes).
 * - Exact-angle sincos (kernels.md 5.5): an integer offset delta (|delta| < 2^23, exact in fp32)
 *   times the frequency in turns, held as an fp32 hi/lo pair; the product is reduced in turns
 *   (keep the fraction) with an FMA error term, then sincospif. About 1e-7 rad at any offset.
 * - 16-bit element helpers for bf16 and fp16 (type traits over __nv_bfloat16 / __half).
 * - LKV__CUDA_CHECK: logs #expr, the CUDA error string and file:line, returns LKV_ECUDA.
 */
#ifndef LKV_CUDA_COMMON_CUH
#define LKV_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "lkv_attn.h"
#include "lkv_err.h"
#include "lkv_log.h"
}

#define LKV__CUDA_CHECK(expr)                                                                      \
    do {                                                                                           \
        cudaError_t lkv__ce = (expr);                                                              \
        if (lkv__ce != cudaSuccess) {                                                              \
            LKV_LOGE("%s: %s (%s)", #expr, cudaGetErrorString(lkv__ce),                            \
                     cudaGetErrorName(lkv__ce));                                                   \
            return LKV_ECUDA;                                                                      \
        }                                                                                          \
    } while (0)

/* Checks the launch just made (configuration errors surface here). */
#define LKV__CUDA_CHECK_LAUNCH() LKV__CUDA_CHECK(cudaGetLastError())

/* Position encoding as the kernels see it. */
struct lkv__dev_pe {
    int kind;                            /* enum lkv_posenc_kind. */
    int pairing;                         /* enum lkv_rope_pairing. */
    int n_pairs;                         /* Rotated pairs (rotary_dim / 2); 0 unless ROPE. */
    float freq_hi[LKV_MAX_HEAD_DIM / 2]; /* Frequency in turns, fp32 high part. */
    float freq_lo[LKV_MAX_HEAD_DIM / 2]; /* Low part. */
};

/* ALiBi slopes of up to LKV_MAX_Q_HEADS heads (only read when kind == ALIBI). */
struct lkv__dev_slopes {
    float s[LKV_MAX_Q_HEADS];
};

/* Fills the device view of pe; flags LKV_ATTN_NO_ROTATE turns RoPE off (benchmark only). */
static inline int lkv__dev_pe_fill(lkv__dev_pe *d, const lkv_posenc *pe, int head_dim,
                                   unsigned flags)
{
    if (pe == NULL) {
        return LKV_EINVAL;
    }
    d->kind = pe->kind;
    d->pairing = pe->pairing;
    d->n_pairs = 0;
    if (pe->kind == LKV_POSENC_ROPE) {
        if (pe->head_dim != head_dim || pe->n_pairs < 0 || 2 * pe->n_pairs > head_dim ||
            (pe->pairing != LKV_ROPE_HALF && pe->pairing != LKV_ROPE_INTERLEAVED)) {
            return LKV_EINVAL;
        }
        d->n_pairs = (flags & LKV_ATTN_NO_ROTATE) ? 0 : pe->n_pairs;
    } else if (pe->kind != LKV_POSENC_NONE && pe->kind != LKV_POSENC_ALIBI) {
        return LKV_EINVAL;
    }
    for (int j = 0; j < LKV_MAX_HEAD_DIM / 2; j++) {
        int on = j < d->n_pairs;
        d->freq_hi[j] = on ? pe->freq_hi[j] : 0.0f;
        d->freq_lo[j] = on ? pe->freq_lo[j] : 0.0f;
    }
    return 0;
}

/* sin and cos of 2 pi * delta * (fhi + flo), delta an exact integer in fp32 (|delta| < 2^24). */
static __device__ __forceinline__ void lkv__turn_sincos(float delta, float fhi, float flo, float *s,
                                                        float *c)
{
    float p = delta * fhi;
    float e = fmaf(delta, fhi, -p) + delta * flo;
    float r = (p - rintf(p)) + e;
    sincospif(2.0f * r, s, c);
}

/* For element i of a head of a posenc with n_pairs rotated pairs: sets *pair and *partner and
 * returns +1 if i is the first element of its pair, -1 if the second, 0 if not rotated.
 * Rotation by angle a: first' = first*c - second*s, second' = second*c + first*s. */
static __device__ __forceinline__ int lkv__pair_of(int i, int pairing, int n_pairs, int *pair,
                                                   int *partner)
{
    if (pairing == LKV_ROPE_HALF) {
        if (i < n_pairs) {
            *pair = i;
            *partner = i + n_pairs;
            return 1;
        }
        if (i < 2 * n_pairs) {
            *pair = i - n_pairs;
            *partner = i - n_pairs;
            return -1;
        }
        return 0;
    }
    if (i < 2 * n_pairs) {
        *pair = i >> 1;
        *partner = i ^ 1;
        return (i & 1) ? -1 : 1;
    }
    return 0;
}

/* cp.async (16 bytes, L2 only; zero-fills the destination when !valid, src is not read). */
static __device__ __forceinline__ void lkv__cp_async16(void *dst, const void *src, bool valid)
{
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
}
static __device__ __forceinline__ void lkv__cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> static __device__ __forceinline__ void lkv__cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

static __device__ __forceinline__ uint32_t lkv__smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* ldmatrix x4 (optionally transposed): four 8x8 16-bit matrices, row addresses from lanes
 * 8m..8m+7 for matrix m. */
static __device__ __forceinline__ void lkv__ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                                    uint32_t &r3, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(lkv__smem_u32(p)));
}
static __device__ __forceinline__ void lkv__ldsm_x4_t(uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                                      uint32_t &r3, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(lkv__smem_u32(p)));
}

/* Transposes an 8x8 16-bit matrix held in the standard fragment layout. */
static __device__ __forceinline__ uint32_t lkv__movmatrix_t(uint32_t a)
{
    uint32_t d;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
    return d;
}

/* Programmatic dependent launch (sm_90): trigger lets the next kernel of the stream launch
 * early; wait blocks until the previous kernel has completed and its writes are visible. Both
 * are no-ops for a kernel launched without the programmatic-serialization attribute. */
static __device__ __forceinline__ void lkv__pdl_trigger()
{
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
static __device__ __forceinline__ void lkv__pdl_wait()
{
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

/* 2^x on the special-function unit (flushes denormals; 2^-inf = 0). */
static __device__ __forceinline__ float lkv__ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* mma.sync m16n8k16, fp32 accumulate: c += a * b (a row-major 16x16, b col-major 16x8). */
template <typename T> struct lkv__mma;
template <> struct lkv__mma<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct lkv__mma<__half> {
    static __device__ __forceinline__ void run(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

/* 16-bit element traits. */
template <typename T> struct lkv__elem;
template <> struct lkv__elem<__nv_bfloat16> {
    static __device__ __forceinline__ float to_f(__nv_bfloat16 x)
    {
        return __bfloat162float(x);
    }
    static __device__ __forceinline__ __nv_bfloat16 from_f(float x)
    {
        return __float2bfloat16_rn(x);
    }
    /* Two fp32 from one packed pair (low half first). */
    static __device__ __forceinline__ float2 to_f2(uint32_t u)
    {
        return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
    }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
};
template <> struct lkv__elem<__half> {
    static __device__ __forceinline__ float to_f(__half x)
    {
        return __half2float(x);
    }
    static __device__ __forceinline__ __half from_f(float x)
    {
        return __float2half_rn(x);
    }
    static __device__ __forceinline__ float2 to_f2(uint32_t u)
    {
        __half2 h = *reinterpret_cast<__half2 *>(&u);
        return __half22float2(h);
    }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
    {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
};

/* Host-side internal helpers (lkv_attn_util.cu). */
extern "C" {
/* Returns a cached device buffer of at least bytes (grow-only), or NULL with a log line. */
void *lkv__cuda_ws_get(size_t bytes);
/* Multiprocessor count of the current device (cached), at least 1. */
int lkv__cuda_sm_count(void);
}

#define LKV__LOG2E 1.4426950408889634f
#define LKV__LN2   0.6931471805599453f

/* Merges split partials: part_o [rows][n_splits][d] fp32 (each normalised), part_lse
 * [rows][n_splits] (log2 domain, -inf = empty) into out [rows][d] in dtype and the optional lse
 * [rows] (natural log; -inf and out = 0 for a row with no keys). Asynchronous on stream. */
int lkv__merge_launch(int dtype, const float *part_o, const float *part_lse, int rows, int n_splits,
                      int d, void *out, float *lse, cudaStream_t stream);

#endif
