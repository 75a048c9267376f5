/*
 * lkv_backend_cpu.c: the CPU backend (see lkv_backend_cpu.h).
 *
 * The dense ops are the loops of llama2.c run.c (fp32, one accumulator per output, left to
 * right), so the runner on this backend reproduces llama2.c's greedy text. The sampler works in
 * fp64: softmax with the max subtracted, the nucleus found on a copy sorted by probability
 * (descending, ties by index so the order is total), one uniform draw per token.
 */
#include "lkv_backend_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_err.h"
#include "lkv_half.h"
#include "lkv_log.h"
#include "lkv_posenc.h"

static void *cpu_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    return lkv_xcalloc(1, bytes ? bytes : 1);
}

static void cpu_release(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static const void *cpu_map_weights(void *ctx, const void *host, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    return host;
}

static void cpu_release_weights(void *ctx, const void *mapped)
{
    (void)ctx;
    (void)mapped;
}

static void cpu_to_host(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    if (bytes > 0 && dst != src) {
        memcpy(dst, src, bytes);
    }
}

static void cpu_fill_zero(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    memset(p, 0, bytes);
}

static void cpu_embed(void *ctx, float *x, const float *table, const int *tokens, int n, int dim)
{
    (void)ctx;
    for (int i = 0; i < n; i++) {
        memcpy(x + (size_t)i * dim, table + (size_t)tokens[i] * dim, (size_t)dim * sizeof(float));
    }
}

static void cpu_rmsnorm(void *ctx, float *out, const float *x, const float *w, int n, int dim)
{
    (void)ctx;
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * dim;
        float *o = out + (size_t)r * dim;
        float ss = 0.0f;
        for (int i = 0; i < dim; i++) {
            ss += xr[i] * xr[i];
        }
        ss = 1.0f / sqrtf(ss / (float)dim + 1e-5f);
        for (int i = 0; i < dim; i++) {
            o[i] = w[i] * (ss * xr[i]);
        }
    }
}

static void cpu_matmul(void *ctx, float *out, const float *x, const float *w, int n, int rows,
                       int cols)
{
    (void)ctx;
    /* Weight row outer, batch rows inner: a batch (several requests' tokens) reads each weight
     * row once while it is in cache. Each output is still one accumulator, left to right, so a
     * row's result does not depend on n (bitwise: batched decode == solo, llama2.c's text). */
    for (int r = 0; r < rows; r++) {
        const float *wr = w + (size_t)r * cols;
        for (int i = 0; i < n; i++) {
            const float *xi = x + (size_t)i * cols;
            float s = 0.0f;
            for (int c = 0; c < cols; c++) {
                s += wr[c] * xi[c];
            }
            out[(size_t)i * rows + r] = s;
        }
    }
}

static void cpu_add(void *ctx, float *x, const float *y, size_t n)
{
    (void)ctx;
    for (size_t j = 0; j < n; j++) {
        x[j] += y[j];
    }
}

static void cpu_swiglu(void *ctx, float *h1, const float *h3, size_t n)
{
    (void)ctx;
    for (size_t j = 0; j < n; j++) {
        h1[j] = h1[j] / (1.0f + expf(-h1[j])) * h3[j];
    }
}

static void cpu_rope(void *ctx, const lkv_posenc *pe, const float *x, float *out, int n_tok,
                     int n_heads, int64_t pos0)
{
    (void)ctx;
    const int HD = pe->head_dim;
    for (int i = 0; i < n_tok; i++) {
        for (int h = 0; h < n_heads; h++) {
            size_t o = ((size_t)i * n_heads + h) * HD;
            lkv_rope_rotate_f32(pe, x + o, out + o, pos0 + i);
        }
    }
}

static void cpu_kv_write(void *ctx, const lkv_kv_shape *s, void *arena, uint64_t page_bytes,
                         const uint32_t *pages, int layer, int local0, int n, const float *k,
                         const float *v)
{
    (void)ctx;
    const int B = s->block_tokens, D = s->head_dim, KVD = s->n_kv_heads * s->head_dim;
    for (int i = 0; i < n; i++) {
        int local = local0 + i;
        uint8_t *blk = (uint8_t *)arena + (uint64_t)pages[local / B] * page_bytes;
        for (int h = 0; h < s->n_kv_heads; h++) {
            uint8_t *ks = blk + lkv_slab_offset(s, layer, 0, h);
            uint8_t *vs = blk + lkv_slab_offset(s, layer, 1, h);
            for (int d = 0; d < D; d++) {
                size_t e = (size_t)(local % B) * D + d;
                lkv_store_elem(ks, s->dtype, e, k[(size_t)i * KVD + h * D + d]);
                lkv_store_elem(vs, s->dtype, e, v[(size_t)i * KVD + h * D + d]);
            }
        }
    }
}

static int cpu_attn_prefill(void *ctx, const lkv_prefill_args *a)
{
    (void)ctx;
    return lkv_attn_prefill_cpu(a);
}

static int cpu_attn_decode(void *ctx, const lkv_decode_args *a)
{
    (void)ctx;
    return lkv_attn_decode_cpu(a);
}

static int cpu_materialise(void *ctx, const lkv_materialise_args *a)
{
    (void)ctx;
    return lkv_materialise_cpu(a);
}

typedef struct cand {
    double p; /* Probability. */
    int id;   /* Token. */
} cand;

static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->p != y->p) {
        return x->p > y->p ? -1 : 1;
    }
    return x->id - y->id;
}

static int cpu_sample(void *ctx, const float *logits, int vocab, const lkv_sampling *s,
                      uint64_t *rng, int *token)
{
    (void)ctx;
    if (vocab < 1 || s == NULL || token == NULL) {
        return LKV_EINVAL;
    }
    int best = 0;
    for (int i = 0; i < vocab; i++) {
        if (isnan(logits[i])) {
            return LKV_EINVAL;
        }
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    if (!(s->temperature > 0.0f)) {
        *token = best;
        return 0;
    }
    cand *c = lkv_xmalloc((size_t)vocab * sizeof(*c));
    double mx = logits[best], sum = 0.0;
    for (int i = 0; i < vocab; i++) {
        c[i].p = exp(((double)logits[i] - mx) / (double)s->temperature);
        c[i].id = i;
        sum += c[i].p;
    }
    int n = vocab;
    double mass = 1.0;
    if (s->top_p > 0.0f && s->top_p < 1.0f) {
        qsort(c, (size_t)vocab, sizeof(*c), cand_cmp);
        double cum = 0.0;
        for (n = 0; n < vocab;) {
            cum += c[n++].p / sum;
            if (cum >= (double)s->top_p) {
                break;
            }
        }
        mass = cum;
    }
    double u = lkv_sampling_uniform(rng) * mass, acc = 0.0;
    *token = c[n - 1].id;
    for (int i = 0; i < n; i++) {
        acc += c[i].p / sum;
        if (u < acc) {
            *token = c[i].id;
            break;
        }
    }
    free(c);
    return 0;
}

static const lkv_backend cpu_backend = {
    .name = "cpu",
    .ctx = NULL,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .map_weights = cpu_map_weights,
    .release_weights = cpu_release_weights,
    .to_host = cpu_to_host,
    .fill_zero = cpu_fill_zero,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .add = cpu_add,
    .swiglu = cpu_swiglu,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .attn_prefill = cpu_attn_prefill,
    .attn_decode = cpu_attn_decode,
    .materialise = cpu_materialise,
    .sample = cpu_sample,
};

const lkv_backend *lkv_backend_cpu(void)
{
    return &cpu_backend;
}
