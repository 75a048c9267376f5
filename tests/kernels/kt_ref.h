/*
 * kt_ref.h: THE reference of LazyAttention: the plain fp64 / long double definition that the
 * fast CPU path (kernels/lkv_attn_cpu.c, tests/kernels/test_attn.c) is tested against, and
 * through it the CUDA kernels (tests/kernels/test_attn_gpu.c, kernels/dev/dev_harness.cu). It
 * shares no code with kernels/: RoPE frequencies (Llama-3.1 scaling in FlashInfer's clamp form
 * rather than lkv_posenc.c's branches), ALiBi slopes (HF get_alibi_slopes), rotation of a vector
 * to an absolute position with long double angles, and kt_ref_attend: attention as written in
 * a textbook, over keys already placed at their absolute positions, two-pass softmax.
 */
#ifndef KT_REF_H
#define KT_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* One attention problem in fp64, every key already at its absolute position.
 *   K, V     [n_kv_heads][n_keys][head_dim]: keys as stored, rotated at position rot_from[k]
 *            short of their absolute one (lazy storage: rot_from = document start; keys
 *            already rotated to their absolute position: 0); values as stored.
 *   key_pos  [n_keys] absolute position of each key.
 *   q        [n_tok][n_q_heads][head_dim] unrotated queries at positions q_pos[t].
 * Every key is rotated by rot_from (R(a) R(b) = R(a + b)), every query by its position; score =
 * <q, k> * sm_scale + ALiBi slope_h * (key_pos - q_pos); keys after the query are masked
 * (causal); softmax in two passes. out [n_tok][n_q_heads][head_dim], lse (optional) natural log
 * (-inf and out 0 for a query with no visible key). GQA: kv head = q head / (Hq / Hkv). All
 * pointers borrowed; out and lse written. */
typedef struct kt_ref_problem {
    const lkv_posenc_cfg *cfg; /* Position encoding. */
    int n_q_heads, n_kv_heads, head_dim;
    float sm_scale;
    int n_keys;
    const double *K, *V;
    const int64_t *key_pos, *rot_from;
    int n_tok;
    const float *q;
    const int64_t *q_pos;
} kt_ref_problem;

static inline void kt_ref_attend(const kt_ref_problem *p, double *out, double *lse)
{
    const int D = p->head_dim, Hq = p->n_q_heads, Hkv = p->n_kv_heads, g = Hq / Hkv;
    const int n = p->n_keys;
    double *Kr = (double *)malloc(((size_t)Hkv * n * D + 1) * sizeof(double));
    double *sc = (double *)malloc(((size_t)n + 1) * sizeof(double));
    double cs[LKV_MAX_HEAD_DIM], qr[LKV_MAX_HEAD_DIM];
    if (Kr == NULL || sc == NULL) {
        abort();
    }
    memcpy(Kr, p->K, (size_t)Hkv * n * D * sizeof(double));
    for (int k = 0; k < n; k++) {
        kt_ref_table(p->cfg, D, p->rot_from[k], cs);
        for (int h = 0; h < Hkv; h++) {
            kt_ref_rotate(p->cfg, D, cs, Kr + ((size_t)h * n + k) * D);
        }
    }
    for (int t = 0; t < p->n_tok; t++) {
        const int64_t pos = p->q_pos[t];
        kt_ref_table(p->cfg, D, pos, cs);
        for (int h = 0; h < Hq; h++) {
            const int kvh = h / g;
            for (int e = 0; e < D; e++) {
                qr[e] = p->q[((size_t)t * Hq + h) * D + e];
            }
            kt_ref_rotate(p->cfg, D, cs, qr);
            const double slope = p->cfg->kind == LKV_POSENC_ALIBI ? kt_ref_slope(Hq, h) : 0.0;
            double mx = -INFINITY;
            for (int j = 0; j < n; j++) {
                sc[j] = -INFINITY;
                if (p->key_pos[j] > pos) {
                    continue;
                }
                const double *kk = Kr + ((size_t)kvh * n + j) * D;
                double s = 0;
                for (int e = 0; e < D; e++) {
                    s += qr[e] * kk[e];
                }
                sc[j] = s * p->sm_scale + slope * (double)(p->key_pos[j] - pos);
                mx = sc[j] > mx ? sc[j] : mx;
            }
            double sum = 0, *o = out + ((size_t)t * Hq + h) * D;
            memset(o, 0, (size_t)D * sizeof(double));
            for (int j = 0; j < n; j++) {
                if (sc[j] == -INFINITY) {
                    continue;
                }
                const double wgt = exp(sc[j] - mx);
                sum += wgt;
                const double *vv = p->V + ((size_t)kvh * n + j) * D;
                for (int e = 0; e < D; e++) {
                    o[e] += wgt * vv[e];
                }
            }
            for (int e = 0; e < D; e++) {
                o[e] = sum > 0 ? o[e] / sum : 0.0;
            }
            if (lse != NULL) {
                lse[(size_t)t * Hq + h] = sum > 0 ? mx + log(sum) : -INFINITY;
            }
        }
    }
    free(Kr);
    free(sc);
}

#endif
