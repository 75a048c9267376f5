/*
 * test_synth.c: client.worker.synth: the random-weight models (lkv_synth.h) and the batched
 * decode on a Llama-3.1-structured model (GQA 4/2, head_dim 64, half-split pairs, llama3 RoPE
 * scaling), on the CPU:
 *   - every weight of "llama3-mini" equals a second implementation of the generator written the
 *     way bench/worker/synth_ref.py computes it (64-bit integers, 32-bit products split in
 *     16-bit halves and masked), so the C and PyTorch sides agree bit for bit;
 *   - the weights do not depend on the thread count, do depend on the seed, and have the stated
 *     distribution (|w| <= scale, mean 0, variance scale^2 / 3; RMSNorm weights 1);
 *   - lkv_runner_decode_batch of 3 sequences gives each exactly (bitwise) the logits of its own
 *     lkv_runner_forward, several steps long, and they are finite.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_backend_cpu.h"
#include "lkv_log.h"
#include "lkv_runner.h"
#include "lkv_synth.h"
#include "lkv_test.h"

static uint64_t mul32(uint64_t a, uint64_t c)
{
    uint64_t lo = c & 0xffff, hi = c >> 16;
    return (a * lo + (((a * hi) & 0xffff) << 16)) & 0xffffffffu;
}

static uint64_t fmix(uint64_t h)
{
    h ^= h >> 16;
    h = mul32(h, 0x85ebca6b);
    h ^= h >> 13;
    h = mul32(h, 0xc2b2ae35);
    return h ^ (h >> 16);
}

static float ref_weight(uint64_t seed, uint64_t t, uint64_t i, double scale)
{
    uint64_t key = fmix(seed ^ fmix((t * 0x9e3779b9u + 0x7f4a7c15u) & 0xffffffffu));
    uint64_t h = fmix(i ^ key);
    volatile float u = (float)(h >> 8) / 8388608.0f - 1.0f;
    volatile float s = (float)scale;
    return s * u;
}

static void test_weights(void)
{
    lkv_model *a, *b, *c;
    ASSERT_OK(lkv_synth_model("llama3-mini", 3, 1, &a));
    ASSERT_OK(lkv_synth_model("llama3-mini", 3, 5, &b));
    ASSERT_OK(lkv_synth_model("llama3-mini", 4, 2, &c));
    lkv_model *none;
    ASSERT_ERR(lkv_synth_model("llama3-70b", 3, 1, &none), LKV_EINVAL);
    const lkv_model_cfg *k = &a->cfg;
    ASSERT_EQ(k->head_dim, 64);
    ASSERT_EQ(a->pe.pairing, LKV_ROPE_HALF);
    const size_t D = (size_t)k->dim, H = (size_t)k->hidden_dim, L = (size_t)k->n_layers;
    const size_t V = (size_t)k->vocab_size, KV = (size_t)k->n_kv_heads * k->head_dim;
    const size_t n[12] = {V * D, L * D,     L * D * D, L * KV * D, L * KV * D, L * D * D,
                          L * D, L * H * D, L * D * H, L * H * D,  D,          V * D};
    const double fan[12] = {0, 0,         (double)D, (double)D, (double)D, (double)D,
                            0, (double)D, (double)H, (double)D, 0,         (double)D};
    const float *p = a->data, *q = b->data, *r = c->data;
    size_t total = 0;
    for (int t = 0; t < 12; t++) {
        double scale = t == 0 ? 1.0 : fan[t] > 0 ? sqrt(3.0 / fan[t]) : 0.0;
        double sum = 0, sq = 0;
        size_t diff = 0;
        for (size_t i = 0; i < n[t]; i++) {
            float w = p[i];
            if (scale == 0.0) {
                ASSERT_TRUE(w == 1.0f);
                continue;
            }
            float want = ref_weight(3, (uint64_t)t, i, scale);
            if (memcmp(&w, &want, sizeof w) != 0) {
                LKV_FAIL("tensor %d weight %zu: %.9g, the reference gives %.9g", t, i, w, want);
            }
            ASSERT_TRUE(fabsf(w) <= (float)scale);
            sum += w;
            sq += (double)w * w;
            diff += r[i] != w;
        }
        ASSERT_TRUE(memcmp(p, q, n[t] * sizeof(float)) == 0); /* Threads do not matter. */
        if (scale > 0.0) {
            double mean = sum / (double)n[t], var = sq / (double)n[t] - mean * mean;
            ASSERT_TRUE(fabs(mean) < 0.02 * scale);
            ASSERT_NEAR(var / (scale * scale / 3.0), 1.0, 0.03);
            ASSERT_TRUE(diff > n[t] * 9 / 10); /* Another seed, other weights. */
        }
        p += n[t];
        q += n[t];
        r += n[t];
        total += n[t];
    }
    ASSERT_TRUE(a->wcls != a->tok_emb && a->wcls == a->data + total - V * D);
    lkv_model_destroy(a);
    lkv_model_destroy(b);
    lkv_model_destroy(c);
}

static void test_decode_batch(void)
{
    lkv_model *m;
    ASSERT_OK(lkv_synth_model("llama3-mini", 9, 0, &m));
    lkv_runner r;
    ASSERT_OK(lkv_runner_init(&r, m, lkv_backend_cpu()));
    enum { S = 3, STEPS = 5 };
    const int V = m->cfg.vocab_size;
    lkv_model_kv kv[2]; /* Pass 0: solo steps; pass 1: batched steps. One arena per pass. */
    lkv_model_seg *doc[2][S], *seg[2][S];
    int doc_tok[40], q_tok[8];
    float *solo = lkv_xmalloc((size_t)STEPS * S * V * sizeof(float));
    float *batch = lkv_xmalloc((size_t)S * V * sizeof(float));
    float *lg = lkv_xmalloc((size_t)8 * V * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        ASSERT_OK(lkv_model_kv_init(&kv[pass], m, 16, LKV_DTYPE_BF16, 64));
        for (int s = 0; s < S; s++) {
            int nd = 10 + 9 * s, nq = 3 + s;
            for (int i = 0; i < nd; i++) {
                doc_tok[i] = (i * 37 + s * 11 + 1) % V;
            }
            for (int i = 0; i < nq; i++) {
                q_tok[i] = (i * 53 + s * 7 + 5) % V;
            }
            doc[pass][s] = lkv_xcalloc(1, sizeof(lkv_model_seg));
            seg[pass][s] = lkv_xcalloc(1, sizeof(lkv_model_seg));
            ASSERT_OK(
                lkv_runner_forward(&r, &kv[pass], NULL, 0, doc[pass][s], doc_tok, nd, NULL, NULL));
            seg[pass][s]->start = nd;
            ASSERT_OK(lkv_runner_forward(&r, &kv[pass], doc[pass][s], 1, seg[pass][s], q_tok, nq,
                                         lg, NULL));
        }
    }
    for (int step = 0; step < STEPS; step++) {
        lkv_runner_seq sq[S];
        for (int s = 0; s < S; s++) {
            int tok = (step * 31 + s * 3 + 2) % V;
            ASSERT_OK(lkv_runner_forward(&r, &kv[0], doc[0][s], 1, seg[0][s], &tok, 1,
                                         solo + ((size_t)step * S + s) * V, NULL));
            sq[s] = (lkv_runner_seq){
                .kv = &kv[1], .ctx = doc[1][s], .n_ctx = 1, .seg = seg[1][s], .token = tok};
        }
        if (step == 0) { /* Sequences of two arenas cannot share a batch: refused, unchanged. */
            lkv_runner_seq mixed[2] = {sq[0], sq[1]};
            mixed[1].kv = &kv[0];
            int32_t before = seg[1][0]->n_tokens;
            ASSERT_ERR(lkv_runner_decode_batch(&r, mixed, 2, batch), LKV_EINVAL);
            ASSERT_EQ(seg[1][0]->n_tokens, before);
        }
        ASSERT_OK(lkv_runner_decode_batch(&r, sq, S, batch));
        if (memcmp(batch, solo + (size_t)step * S * V, (size_t)S * V * sizeof(float)) != 0) {
            LKV_FAIL("step %d: batched logits differ from the solo ones", step);
        }
    }
    for (size_t i = 0; i < (size_t)STEPS * S * V; i++) {
        ASSERT_TRUE(isfinite(solo[i]));
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int s = 0; s < S; s++) {
            free(doc[pass][s]);
            free(seg[pass][s]);
        }
        lkv_model_kv_free(&kv[pass]);
    }
    free(solo);
    free(batch);
    free(lg);
    lkv_runner_free(&r);
    lkv_model_destroy(m);
}

int main(void)
{
    LKV_RUN(test_weights);
    LKV_RUN(test_decode_batch);
    return 0;
}
