/*
 * lkv_posenc.h: host helpers on the position-encoding tables (struct lkv_posenc, built by
 * lkv_posenc_init in lkv_attn.h). Shared by the CPU reference, the CUDA launchers' host code,
 * the model runner and the tests.
 *
 * Angles. Pair j rotates by offset * theta_j radians, theta_j = 2 pi * pe->freq_turns[j]. The
 * offset is an exact integer (a relative position such as p - s). The angle is reduced modulo
 * one turn before any trigonometry: t = offset * f is split into its rounded product and the
 * exact rounding error (fma), the integer part is dropped, and cos/sin are taken of 2 pi r with
 * |r| <= 1/2. Given freq_turns, the angle is exact to a few ulps of |r| (~1e-15 rad) for
 * every |offset| below 2^31 (tests/kernels/test_posenc.c measures < 2e-13 rad at 4,194,303, the
 * precision of its long double reference); the fp64 rounding of freq_turns itself moves angles
 * by at most ~5e-10 rad at LKV_MAX_POSITION. Plain fp32 pos * inv_freq is off by ~1e-2 rad.
 *
 * Pairs. With rotary_dim R = 2 * n_pairs (<= head_dim), pair j (j < R/2) is
 *   LKV_ROPE_HALF:        dims (j, j + R/2)      (HF Llama / NeoX rotate-half, partial: R < d)
 *   LKV_ROPE_INTERLEAVED: dims (2j, 2j + 1)      (GPT-J, llama2.c)
 * and dims R .. head_dim-1 are never rotated. Rotation by angle a maps (x0, x1) to
 * (x0 cos a - x1 sin a, x0 sin a + x1 cos a).
 *
 * ALiBi slopes follow the ALiBi paper / HF get_alibi_slopes: for n heads, with P the largest
 * power of two <= n, heads 0..P-1 get 2^(-8(h+1)/P) and the remaining n - P heads get the odd
 * terms 2^(-4(2i+1)/P), i = 0..n-P-1 (the even terms of the 2P sequence).
 */
#ifndef LKV_POSENC_H
#define LKV_POSENC_H

#include <stdint.h>

#include "lkv_attn.h"

/* Writes the dims (*i0, *i1) that pair j (0 <= j < pe->n_pairs) rotates. */
static inline void lkv_rope_pair_dims(const lkv_posenc *pe, int j, int *i0, int *i1)
{
    if (pe->pairing == LKV_ROPE_INTERLEAVED) {
        *i0 = 2 * j;
        *i1 = 2 * j + 1;
    } else {
        *i0 = j;
        *i1 = j + pe->n_pairs;
    }
}

/* Reduces offset * freq_turns modulo 1 exactly; returns r in [-1/2, 1/2] (turns). */
double lkv_rope_turns(double freq_turns, int64_t offset);

/* Writes cos and sin of the angle of pair j (0 <= j < pe->n_pairs) at an integer offset, in
 * fp64. pe is borrowed. */
void lkv_rope_cossin(const lkv_posenc *pe, int j, int64_t offset, double *c, double *s);

/* Fills cs[2 j] = cos, cs[2 j + 1] = sin for every pair of pe at offset (fp64). cs holds at
 * least 2 * pe->n_pairs doubles (caller-owned). */
void lkv_rope_table(const lkv_posenc *pe, int64_t offset, double *cs);

/* Rotates one head vector x[0 .. pe->head_dim) by offset positions using a table made by
 * lkv_rope_table for that offset; out may equal x. Math in fp64, one rounding to fp32. Does
 * nothing but copy when pe->kind is not LKV_POSENC_ROPE. */
void lkv_rope_apply_f32(const lkv_posenc *pe, const double *cs, const float *x, float *out);

/* Rotates one head vector (pe->head_dim floats) by an integer offset: out = R(offset) x.
 * out may equal x (in place). Negative offsets rotate backwards. Copies x for kinds other than
 * LKV_POSENC_ROPE. Both pointers are borrowed. */
void lkv_rope_rotate_f32(const lkv_posenc *pe, const float *x, float *out, int64_t offset);

/* ALiBi slope of query head h for n_heads heads (the formula in the file comment). */
double lkv_alibi_slope(int n_heads, int h);

#endif
