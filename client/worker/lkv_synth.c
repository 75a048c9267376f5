/*
 * lkv_synth.c: random-weight models (see lkv_synth.h). Generation is split over threads by
 * contiguous ranges of each tensor; every weight depends only on (seed, tensor, index), so the
 * result does not depend on the thread count.
 */
#include "lkv_synth.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_posenc.h"

typedef struct span {
    float *dst;
    uint32_t seed, tensor;
    uint64_t i0, i1;
    float scale;
} span;

static void *fill(void *arg)
{
    const span *s = arg;
    for (uint64_t i = s->i0; i < s->i1; i++) {
        s->dst[i] = lkv_synth_weight(s->seed, s->tensor, (uint32_t)i, s->scale);
    }
    return NULL;
}

static void gen(float *dst, uint64_t n, uint32_t seed, uint32_t tensor, float scale, int threads)
{
    if (scale == 0.0f) { /* RMSNorm weights: 1. */
        for (uint64_t i = 0; i < n; i++) {
            dst[i] = 1.0f;
        }
        return;
    }
    int nt = threads;
    if (n < (1u << 20)) {
        nt = 1;
    }
    pthread_t tid[64];
    span sp[64];
    for (int k = 0; k < nt; k++) {
        sp[k] = (span){dst, seed, tensor, n * k / nt, n * (k + 1) / nt, scale};
    }
    int started = 0;
    for (int k = 1; k < nt; k++, started++) {
        if (pthread_create(&tid[k], NULL, fill, &sp[k]) != 0) {
            fill(&sp[k]);
            tid[k] = 0;
        }
    }
    fill(&sp[0]);
    for (int k = 1; k < nt; k++) {
        if (tid[k] != 0) {
            pthread_join(tid[k], NULL);
        }
    }
    (void)started;
}

int lkv_synth_model(const char *preset, uint32_t seed, int threads, lkv_model **out)
{
    *out = NULL;
    lkv_model_cfg c;
    if (strcmp(preset, "llama3-8b") == 0) {
        c = (lkv_model_cfg){.dim = 4096,
                            .hidden_dim = 14336,
                            .n_layers = 32,
                            .n_heads = 32,
                            .n_kv_heads = 8,
                            .vocab_size = 128256,
                            .seq_len = 131072};
    } else if (strcmp(preset, "llama3-mini") == 0) {
        c = (lkv_model_cfg){.dim = 256,
                            .hidden_dim = 512,
                            .n_layers = 2,
                            .n_heads = 4,
                            .n_kv_heads = 2,
                            .vocab_size = 512,
                            .seq_len = 4096};
    } else {
        return LKV_EINVAL;
    }
    c.head_dim = c.dim / c.n_heads;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    if (threads > 64) {
        threads = 64;
    }
    const uint64_t D = (uint64_t)c.dim, H = (uint64_t)c.hidden_dim, L = (uint64_t)c.n_layers;
    const uint64_t V = (uint64_t)c.vocab_size, KV = (uint64_t)c.n_kv_heads * c.head_dim;
    const uint64_t sizes[12] = {V * D, L * D,     L * D * D, L * KV * D, L * KV * D, L * D * D,
                                L * D, L * H * D, L * D * H, L * H * D,  D,          V * D};
    const double fan_in[12] = {0, 0,         (double)D, (double)D, (double)D, (double)D,
                               0, (double)D, (double)H, (double)D, 0,         (double)D};
    uint64_t total = 0;
    for (int t = 0; t < 12; t++) {
        total += sizes[t];
    }
    lkv_model *m = lkv_xcalloc(1, sizeof(*m));
    m->cfg = c;
    m->data = lkv_xmalloc(total * sizeof(float));
    const float **ptr[12] = {&m->tok_emb, &m->rms_att, &m->wq, &m->wk, &m->wv,        &m->wo,
                             &m->rms_ffn, &m->w1,      &m->w2, &m->w3, &m->rms_final, &m->wcls};
    float *p = m->data;
    for (int t = 0; t < 12; t++) {
        float scale = t == 0 ? 1.0f : fan_in[t] > 0 ? (float)sqrt(3.0 / fan_in[t]) : 0.0f;
        gen(p, sizes[t], seed, (uint32_t)t, scale, threads);
        *ptr[t] = p;
        p += sizes[t];
    }
    m->pe_cfg = (lkv_posenc_cfg){.kind = LKV_POSENC_ROPE,
                                 .rope_theta = 500000.0,
                                 .rope_pairing = LKV_ROPE_HALF,
                                 .rope_scaling = LKV_ROPE_SCALING_LLAMA3,
                                 .scaling_factor = 8.0,
                                 .low_freq_factor = 1.0,
                                 .high_freq_factor = 4.0,
                                 .original_max_pos = 8192.0};
    int rc = lkv_posenc_init(&m->pe, &m->pe_cfg, c.head_dim, c.n_heads);
    if (rc != 0) {
        lkv_model_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}
