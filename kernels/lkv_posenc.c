/*
 * lkv_posenc.c: builds the position-encoding tables of a model (RoPE frequencies in turns,
 * with linear or Llama-3.1 scaling and partial rotary dims; ALiBi slopes) and the exact-angle
 * rotation helpers declared in lkv_posenc.h.
 *
 * Frequencies: theta_j = base^(-2j/R) for j < R/2 (R = rotary_dim), then scaled:
 *   linear: theta_j / factor;
 *   llama3: wavelen = 2 pi / theta_j; wavelen < orig/high: unchanged; wavelen > orig/low:
 *           theta_j / factor; otherwise smooth = (orig/wavelen - low) / (high - low) and
 *           theta_j' = (1 - smooth) theta_j / factor + smooth theta_j (HF/vLLM "llama3").
 * Stored as turns f_j = theta_j / (2 pi) in fp64, plus f_hi = (float)f_j and
 * f_lo = (float)(f_j - f_hi) for device code (fp32 hi/lo products, DESIGN.md 10.5).
 */
#include <math.h>
#include <string.h>

#include "lkv_attn.h"
#include "lkv_err.h"
#include "lkv_posenc.h"

#define TWO_PI 6.283185307179586476925286766559

double lkv_alibi_slope(int n_heads, int h)
{
    int p = 1;
    while (p * 2 <= n_heads) {
        p *= 2;
    }
    if (h < p) {
        return exp2(-8.0 * (double)(h + 1) / (double)p);
    }
    int i = h - p;
    return exp2(-4.0 * (double)(2 * i + 1) / (double)p);
}

int lkv_posenc_init(lkv_posenc *pe, const lkv_posenc_cfg *cfg, int head_dim, int n_q_heads)
{
    if (pe == NULL || cfg == NULL || head_dim < 8 || head_dim > LKV_MAX_HEAD_DIM ||
        head_dim % 8 != 0 || n_q_heads < 1 || n_q_heads > LKV_MAX_Q_HEADS) {
        return LKV_EINVAL;
    }
    memset(pe, 0, sizeof *pe);
    pe->kind = cfg->kind;
    pe->pairing = LKV_ROPE_HALF;
    pe->head_dim = head_dim;
    pe->n_q_heads = n_q_heads;
    switch (cfg->kind) {
    case LKV_POSENC_NONE:
        return 0;
    case LKV_POSENC_ALIBI:
        for (int h = 0; h < n_q_heads; h++) {
            pe->alibi_slope[h] = (float)lkv_alibi_slope(n_q_heads, h);
        }
        return 0;
    case LKV_POSENC_ROPE:
        break;
    default:
        return LKV_EINVAL;
    }
    int rot = cfg->rotary_dim == 0 ? head_dim : cfg->rotary_dim;
    if (rot < 2 || rot > head_dim || rot % 2 != 0 || !(cfg->rope_theta > 0.0) ||
        !isfinite(cfg->rope_theta) ||
        (cfg->rope_pairing != LKV_ROPE_HALF && cfg->rope_pairing != LKV_ROPE_INTERLEAVED)) {
        return LKV_EINVAL;
    }
    double factor = cfg->scaling_factor, lo = cfg->low_freq_factor, hi = cfg->high_freq_factor;
    double orig = cfg->original_max_pos;
    switch (cfg->rope_scaling) {
    case LKV_ROPE_SCALING_NONE:
        break;
    case LKV_ROPE_SCALING_LINEAR:
        if (!(factor > 0.0) || !isfinite(factor)) {
            return LKV_EINVAL;
        }
        break;
    case LKV_ROPE_SCALING_LLAMA3:
        if (!(factor > 0.0) || !isfinite(factor) || !(lo > 0.0) || !(hi > lo) || !isfinite(hi) ||
            !(orig > 0.0) || !isfinite(orig)) {
            return LKV_EINVAL;
        }
        break;
    default:
        return LKV_EINVAL;
    }
    pe->pairing = cfg->rope_pairing;
    pe->n_pairs = rot / 2;
    for (int j = 0; j < pe->n_pairs; j++) {
        double theta = pow(cfg->rope_theta, -2.0 * (double)j / (double)rot);
        if (cfg->rope_scaling == LKV_ROPE_SCALING_LINEAR) {
            theta /= factor;
        } else if (cfg->rope_scaling == LKV_ROPE_SCALING_LLAMA3) {
            double wavelen = TWO_PI / theta;
            if (wavelen > orig / lo) {
                theta /= factor;
            } else if (wavelen >= orig / hi) {
                double smooth = (orig / wavelen - lo) / (hi - lo);
                theta = (1.0 - smooth) * theta / factor + smooth * theta;
            }
        }
        double f = theta / TWO_PI;
        pe->freq_turns[j] = f;
        pe->freq_hi[j] = (float)f;
        pe->freq_lo[j] = (float)(f - (double)pe->freq_hi[j]);
    }
    return 0;
}

double lkv_rope_turns(double freq_turns, int64_t offset)
{
    /* offset is exact in fp64 (|offset| < 2^53); p + e == offset * f exactly. */
    double x = (double)offset;
    double p = x * freq_turns;
    double e = fma(x, freq_turns, -p);
    double r = p - nearbyint(p); /* exact (Sterbenz) */
    r += e;
    return r - nearbyint(r);
}

void lkv_rope_cossin(const lkv_posenc *pe, int j, int64_t offset, double *c, double *s)
{
    double a = TWO_PI * lkv_rope_turns(pe->freq_turns[j], offset);
    *c = cos(a);
    *s = sin(a);
}

void lkv_rope_table(const lkv_posenc *pe, int64_t offset, double *cs)
{
    for (int j = 0; j < pe->n_pairs; j++) {
        lkv_rope_cossin(pe, j, offset, &cs[2 * j], &cs[2 * j + 1]);
    }
}

void lkv_rope_apply_f32(const lkv_posenc *pe, const double *cs, const float *x, float *out)
{
    if (out != x) {
        memmove(out, x, (size_t)pe->head_dim * sizeof *out);
    }
    if (pe->kind != LKV_POSENC_ROPE) {
        return;
    }
    for (int j = 0; j < pe->n_pairs; j++) {
        int i0, i1;
        lkv_rope_pair_dims(pe, j, &i0, &i1);
        double x0 = out[i0], x1 = out[i1], c = cs[2 * j], s = cs[2 * j + 1];
        out[i0] = (float)(x0 * c - x1 * s);
        out[i1] = (float)(x0 * s + x1 * c);
    }
}

void lkv_rope_rotate_f32(const lkv_posenc *pe, const float *x, float *out, int64_t offset)
{
    double cs[LKV_MAX_HEAD_DIM];
    lkv_rope_table(pe, offset, cs);
    lkv_rope_apply_f32(pe, cs, x, out);
}
