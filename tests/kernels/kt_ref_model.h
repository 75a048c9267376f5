/*
 * kt_ref_model.h: the plain reference forward pass of a llama2.c model, in fp64, over a whole
 * prompt at absolute positions, with an optional block-attention mask (each document attends
 * only to itself, the question and everything after it to everything). No paging, no caching,
 * no LazyAttention: the oracle that the model runner (tests/kernels/test_model.c) and the decode
 * worker (tests/integration/test_worker_equivalence.c) are checked against. Uses kt_ref.h for
 * the rotations (long double angle reduction).
 */
#ifndef KT_REF_MODEL_H
#define KT_REF_MODEL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kt_ref.h"
#include "lkv_log.h"
#include "lkv_model.h"

/* Independent fp64 forward pass of model m over toks[0..N) at absolute positions 0..N-1. grp[i] is
 * the token's group: with block_mask, token i attends to j <= i only when grp[j] == grp[i] or
 * grp[i] is the question (last group); otherwise plain causal. logits: [N][V]. */
static inline void kt_ref_forward(const lkv_model *m, const int *toks, const int *grp, int N,
                                  int qgrp, int block_mask, double *logits)
{
    const lkv_model_cfg *c = &m->cfg;
    const int D = c->dim, HD = c->head_dim, KVD = c->n_kv_heads * HD, HID = c->hidden_dim;
    const int G = c->n_heads / c->n_kv_heads, V = c->vocab_size;
    double *x = lkv_xmalloc((size_t)N * D * sizeof(double));
    double *xb = lkv_xmalloc((size_t)D * sizeof(double));
    double *q = lkv_xmalloc((size_t)N * D * sizeof(double));
    double *k = lkv_xmalloc((size_t)N * KVD * sizeof(double));
    double *v = lkv_xmalloc((size_t)N * KVD * sizeof(double));
    double *att = lkv_xmalloc((size_t)N * D * sizeof(double));
    double *h1 = lkv_xmalloc((size_t)HID * sizeof(double)),
           *h3 = lkv_xmalloc((size_t)HID * sizeof(double));
    double *w = lkv_xmalloc((size_t)N * sizeof(double));
    double cs[LKV_MAX_HEAD_DIM];
    for (int i = 0; i < N; i++) {
        for (int d = 0; d < D; d++) {
            x[(size_t)i * D + d] = m->tok_emb[(size_t)toks[i] * D + d];
        }
    }
#define MV(out, W, in, rows, cols)                                                                 \
    for (int r_ = 0; r_ < (rows); r_++) {                                                          \
        double s_ = 0;                                                                             \
        for (int c_ = 0; c_ < (cols); c_++) {                                                      \
            s_ += (double)(W)[(size_t)r_ * (cols) + c_] * (in)[c_];                                \
        }                                                                                          \
        (out)[r_] = s_;                                                                            \
    }
#define RMS(out, in, W)                                                                            \
    do {                                                                                           \
        double ss_ = 0;                                                                            \
        for (int d_ = 0; d_ < D; d_++) {                                                           \
            ss_ += (in)[d_] * (in)[d_];                                                            \
        }                                                                                          \
        ss_ = 1.0 / sqrt(ss_ / D + 1e-5);                                                          \
        for (int d_ = 0; d_ < D; d_++) {                                                           \
            (out)[d_] = (double)(W)[d_] * (ss_ * (in)[d_]);                                        \
        }                                                                                          \
    } while (0)
    for (int l = 0; l < c->n_layers; l++) {
        for (int i = 0; i < N; i++) {
            RMS(xb, x + (size_t)i * D, m->rms_att + (size_t)l * D);
            MV(q + (size_t)i * D, m->wq + (size_t)l * D * D, xb, D, D);
            MV(k + (size_t)i * KVD, m->wk + (size_t)l * KVD * D, xb, KVD, D);
            MV(v + (size_t)i * KVD, m->wv + (size_t)l * KVD * D, xb, KVD, D);
            kt_ref_table(&m->pe_cfg, HD, i, cs);
            for (int h = 0; h < c->n_heads; h++) {
                kt_ref_rotate(&m->pe_cfg, HD, cs, q + (size_t)i * D + (size_t)h * HD);
            }
            for (int h = 0; h < c->n_kv_heads; h++) {
                kt_ref_rotate(&m->pe_cfg, HD, cs, k + (size_t)i * KVD + (size_t)h * HD);
            }
        }
        for (int i = 0; i < N; i++) {
            for (int h = 0; h < c->n_heads; h++) {
                const double *qh = q + (size_t)i * D + (size_t)h * HD;
                int kvh = h / G;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    w[j] = -INFINITY;
                    if (block_mask && grp[i] != qgrp && grp[j] != grp[i]) {
                        continue;
                    }
                    double s = 0;
                    for (int d = 0; d < HD; d++) {
                        s += qh[d] * k[(size_t)j * KVD + (size_t)kvh * HD + d];
                    }
                    w[j] = s / sqrt((double)HD);
                    mx = w[j] > mx ? w[j] : mx;
                }
                double *o = att + (size_t)i * D + (size_t)h * HD;
                memset(o, 0, (size_t)HD * sizeof(double));
                for (int j = 0; j <= i; j++) {
                    if (w[j] == -INFINITY) {
                        continue;
                    }
                    double e = exp(w[j] - mx);
                    sum += e;
                    for (int d = 0; d < HD; d++) {
                        o[d] += e * v[(size_t)j * KVD + (size_t)kvh * HD + d];
                    }
                }
                for (int d = 0; d < HD; d++) {
                    o[d] /= sum;
                }
            }
        }
        for (int i = 0; i < N; i++) {
            double *xi = x + (size_t)i * D, tmp[LKV_MAX_HEAD_DIM * 8];
            MV(tmp, m->wo + (size_t)l * D * D, att + (size_t)i * D, D, D);
            for (int d = 0; d < D; d++) {
                xi[d] += tmp[d];
            }
            RMS(xb, xi, m->rms_ffn + (size_t)l * D);
            MV(h1, m->w1 + (size_t)l * HID * D, xb, HID, D);
            MV(h3, m->w3 + (size_t)l * HID * D, xb, HID, D);
            for (int j = 0; j < HID; j++) {
                h1[j] = h1[j] / (1.0 + exp(-h1[j])) * h3[j];
            }
            MV(tmp, m->w2 + (size_t)l * D * HID, h1, D, HID);
            for (int d = 0; d < D; d++) {
                xi[d] += tmp[d];
            }
        }
    }
    for (int i = 0; i < N; i++) {
        RMS(xb, x + (size_t)i * D, m->rms_final);
        MV(logits + (size_t)i * V, m->wcls, xb, V, D);
    }
#undef MV
#undef RMS
    free(x);
    free(xb);
    free(q);
    free(k);
    free(v);
    free(att);
    free(h1);
    free(h3);
    free(w);
}

#endif
