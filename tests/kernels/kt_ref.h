/*
 * kt_ref.h: independent fp64 / long double references for the kernels tests: RoPE frequencies
 * (Llama-3.1 scaling in FlashInfer's clamp form rather than lkv_posenc.c's branches), ALiBi
 * slopes (HF get_alibi_slopes), and rotation of a vector to an absolute position.
 */
#ifndef KT_REF_H
#define KT_REF_H

#include <math.h>

#include "lkv_attn.h"

#define KT_PI_L 3.141592653589793238462643383279502884L

/* theta_j in radians per position for cfg with rotary dim rot. */
static inline long double kt_ref_theta(const lkv_posenc_cfg *c, int rot, int j)
{
    long double inv = powl((long double)c->rope_theta, -(long double)(2 * j) / rot);
    if (c->rope_scaling == LKV_ROPE_SCALING_LINEAR) {
        inv /= c->scaling_factor;
    } else if (c->rope_scaling == LKV_ROPE_SCALING_LLAMA3) {
        long double hi = c->high_freq_factor, lo = c->low_freq_factor;
        long double a = c->original_max_pos / (2 * KT_PI_L * (hi - lo)),
                    b = -1.0L / (hi / lo - 1.0L);
        long double smooth = inv * a + b;
        smooth = smooth < 0 ? 0 : smooth > 1 ? 1 : smooth;
        inv = (1 - smooth) * inv / c->scaling_factor + smooth * inv;
    }
    return inv;
}

/* HF get_alibi_slopes, written as in the ALiBi paper's reference code. */
static inline double kt_ref_slope(int n, int h)
{
    int closest = 1 << (int)floor(log2((double)n));
    double base = pow(2.0, -pow(2.0, -(log2((double)closest) - 3)));
    if (h < closest) {
        return pow(base, h + 1);
    }
    double extra = pow(2.0, -pow(2.0, -(log2(2.0 * closest) - 3)));
    return pow(extra, 2 * (h - closest) + 1);
}

/* Per-position rotation table: cs[2j], cs[2j+1] = cos, sin of pos * theta_j (long double
 * reduction modulo one turn). */
static inline void kt_ref_table(const lkv_posenc_cfg *c, int head_dim, int64_t pos, double *cs)
{
    int rot = c->rotary_dim ? c->rotary_dim : head_dim;
    for (int j = 0; j < rot / 2; j++) {
        long double t = (long double)pos * (kt_ref_theta(c, rot, j) / (2 * KT_PI_L));
        long double a = 2 * KT_PI_L * (t - roundl(t));
        cs[2 * j] = (double)cosl(a);
        cs[2 * j + 1] = (double)sinl(a);
    }
}

/* Rotates x[0..head_dim) in place with a table from kt_ref_table (RoPE configs only). */
static inline void kt_ref_rotate(const lkv_posenc_cfg *c, int head_dim, const double *cs, double *x)
{
    if (c->kind != LKV_POSENC_ROPE) {
        return;
    }
    int rot = c->rotary_dim ? c->rotary_dim : head_dim;
    for (int j = 0; j < rot / 2; j++) {
        int i0 = c->rope_pairing == LKV_ROPE_INTERLEAVED ? 2 * j : j;
        int i1 = c->rope_pairing == LKV_ROPE_INTERLEAVED ? 2 * j + 1 : j + rot / 2;
        double x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * cs[2 * j] - x1 * cs[2 * j + 1];
        x[i1] = x0 * cs[2 * j + 1] + x1 * cs[2 * j];
    }
}

#endif
