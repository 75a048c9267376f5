/*
 * lkv_cuda_posenc.cuh: position encoding on the device: lkv__dev_pe, the part of lkv_posenc the
 * kernels read (passed BY VALUE as a kernel parameter, about 1.1 KB), the ALiBi slopes
 * (lkv__dev_slopes), exact-angle sincos from an integer offset (DESIGN.md 10.5: the offset times
 * the frequency in turns as an fp32 hi/lo pair, reduced in turns with an FMA error term, then
 * sincospif; about 1e-7 rad at any offset), the pairing of head elements, and the log2 constants of
 * the softmax.
 */
#ifndef LKV_CUDA_POSENC_CUH
#define LKV_CUDA_POSENC_CUH

#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "lkv_attn.h"
#include "lkv_err.h"
}

#define LKV__LOG2E 1.4426950408889634f
#define LKV__LN2   0.6931471805599453f

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

/* The same on the special-function unit: after the reduction |2 pi r| <= pi (+ a rounding),
 * where __sincosf is accurate to about 2^-21.4 absolute (CUDA Programming Guide), so the
 * angle error stays near 5e-7 rad, far below the 16-bit rounding of the rotated query it
 * feeds. Used by the tensor-core decode, where the sincos sits on the batch-1 critical path. */
static __device__ __forceinline__ void lkv__turn_sincos_fast(float delta, float fhi, float flo,
                                                             float *s, float *c)
{
    float p = delta * fhi;
    float e = fmaf(delta, fhi, -p) + delta * flo;
    float r = (p - rintf(p)) + e;
    __sincosf(6.28318530717958648f * r, s, c);
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

#endif
