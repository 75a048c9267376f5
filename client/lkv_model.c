/*
 * lkv_model.c: the CPU model runner and the QKV dump (see lkv_model.h).
 *
 * The forward pass is the decode worker's runner (client/worker/lkv_runner.h, one code path
 * over a backend) on the CPU backend (client/worker/lkv_backend_cpu.h): fp32 math, RoPE angles
 * in fp64 from exact integer offsets (lkv_posenc.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_err.h"
#include "lkv_half.h"
#include "lkv_log.h"
#include "lkv_model.h"
#include "lkv_posenc.h"
#include "lkv_runner.h"
#include "lkv_backend_cpu.h"

int lkv_model_load(const char *path, lkv_model **out)
{
    int rc = 0;
    lkv_model *m = NULL;
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return LKV_EIO;
    }
    int32_t h[7];
    if (fread(h, sizeof h, 1, f) != 1) {
        rc = LKV_EIO;
        goto out;
    }
    int shared = h[5] > 0;
    lkv_model_cfg c = {.dim = h[0],
                       .hidden_dim = h[1],
                       .n_layers = h[2],
                       .n_heads = h[3],
                       .n_kv_heads = h[4],
                       .vocab_size = shared ? h[5] : -h[5],
                       .seq_len = h[6]};
    if (c.dim <= 0 || c.hidden_dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 ||
        c.vocab_size <= 0 || c.seq_len <= 0 || c.dim % c.n_heads != 0 ||
        c.n_heads % c.n_kv_heads != 0 || c.dim > (1 << 16) || c.hidden_dim > (1 << 18) ||
        c.n_layers > 1024 || c.vocab_size > (1 << 20) || c.seq_len > (1 << 22)) {
        rc = LKV_ECORRUPT;
        goto out;
    }
    c.head_dim = c.dim / c.n_heads;
    if (c.head_dim < 8 || c.head_dim > LKV_MAX_HEAD_DIM || c.head_dim % 8 != 0 ||
        c.n_heads > LKV_MAX_Q_HEADS) {
        rc = LKV_ENOTSUP;
        goto out;
    }
    size_t L = (size_t)c.n_layers, D = (size_t)c.dim, H = (size_t)c.hidden_dim;
    size_t KV = (size_t)c.n_kv_heads * (size_t)c.head_dim, V = (size_t)c.vocab_size;
    size_t n = V * D + L * D + L * D * D + 2 * L * KV * D + L * D * D + L * D + 3 * L * H * D + D +
               (size_t)c.seq_len * (size_t)c.head_dim; /* + freq_cis real and imag */
    if (!shared) {
        n += V * D;
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        rc = LKV_EIO;
        goto out;
    }
    long sz = ftell(f);
    if (sz < 0 || (size_t)sz != sizeof h + n * sizeof(float)) {
        rc = LKV_ECORRUPT;
        goto out;
    }
    m = lkv_xcalloc(1, sizeof *m);
    m->cfg = c;
    m->data = lkv_xmalloc(n * sizeof(float));
    if (fseek(f, (long)sizeof h, SEEK_SET) != 0 || fread(m->data, sizeof(float), n, f) != n) {
        rc = LKV_EIO;
        goto out;
    }
    const float *p = m->data;
    m->tok_emb = p, p += V * D;
    m->rms_att = p, p += L * D;
    m->wq = p, p += L * D * D;
    m->wk = p, p += L * KV * D;
    m->wv = p, p += L * KV * D;
    m->wo = p, p += L * D * D;
    m->rms_ffn = p, p += L * D;
    m->w1 = p, p += L * H * D;
    m->w2 = p, p += L * D * H;
    m->w3 = p, p += L * H * D;
    m->rms_final = p, p += D;
    p += (size_t)c.seq_len * (size_t)c.head_dim; /* legacy freq_cis tables, unused */
    m->wcls = shared ? m->tok_emb : p;
    m->pe_cfg = (lkv_posenc_cfg){
        .kind = LKV_POSENC_ROPE, .rope_theta = 10000.0, .rope_pairing = LKV_ROPE_INTERLEAVED};
    rc = lkv_posenc_init(&m->pe, &m->pe_cfg, c.head_dim, c.n_heads);
out:
    fclose(f);
    if (rc != 0) {
        lkv_model_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

void lkv_model_destroy(lkv_model *m)
{
    if (m != NULL) {
        free(m->data);
        free(m);
    }
}

int lkv_model_kv_init(lkv_model_kv *kv, const lkv_model *m, int block_tokens, int dtype,
                      uint32_t n_pages)
{
    memset(kv, 0, sizeof *kv);
    if (block_tokens < 1 || block_tokens > LKV_MAX_BLOCK_TOKENS || lkv_dtype_size(dtype) == 0 ||
        n_pages == 0 || n_pages > LKV_REF_MAX_PAGE + 1u) {
        return LKV_EINVAL;
    }
    kv->shape = (lkv_kv_shape){.n_layers = m->cfg.n_layers,
                               .n_q_heads = m->cfg.n_heads,
                               .n_kv_heads = m->cfg.n_kv_heads,
                               .head_dim = m->cfg.head_dim,
                               .dtype = dtype,
                               .block_tokens = block_tokens};
    kv->page_bytes = lkv_block_bytes(&kv->shape);
    kv->n_pages = n_pages;
    kv->base = lkv_xcalloc(n_pages, kv->page_bytes);
    kv->owned = 1;
    return 0;
}

void lkv_model_kv_free(lkv_model_kv *kv)
{
    if (kv->owned) {
        free(kv->base);
    }
    memset(kv, 0, sizeof *kv);
}

int lkv_model_refs(const lkv_model_kv *kv, const lkv_model_seg *segs, int n, uint64_t *refs,
                   int32_t *n_refs)
{
    const int B = kv->shape.block_tokens;
    int32_t k = 0;
    for (int s = 0; s < n; s++) {
        const lkv_model_seg *g = &segs[s];
        for (int b = 0; b * B < g->n_tokens; b++) {
            int valid = g->n_tokens - b * B < B ? g->n_tokens - b * B : B;
            if (g->start < 0 || lkv_ref_pack_checked(g->pages[b], (uint64_t)g->start, (uint32_t)b,
                                                     (uint32_t)valid, &refs[k]) != 0) {
                return LKV_EINVAL;
            }
            k++;
        }
    }
    *n_refs = k;
    return 0;
}

void lkv_model_trace_free(lkv_model_trace *t)
{
    free(t->q);
    free(t->k);
    free(t->v);
    free(t->att);
    memset(t, 0, sizeof *t);
}

int lkv_model_argmax(const float *logits, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

int lkv_model_forward(const lkv_model *m, lkv_model_kv *kv, const lkv_model_seg *ctx, int n_ctx,
                      lkv_model_seg *seg, const int *tokens, int n, float *logits,
                      lkv_model_trace *trace)
{
    lkv_runner r;
    int rc = lkv_runner_init(&r, m, lkv_backend_cpu());
    if (rc == 0) {
        rc = lkv_runner_forward(&r, kv, ctx, n_ctx, seg, tokens, n, logits, trace);
    }
    lkv_runner_free(&r);
    return rc;
}

void lkv_qkv_dump_free(lkv_qkv_dump *d)
{
    free(d->arena);
    free(d->refs);
    free(d->dec_refs);
    free(d->q);
    free(d->k_new);
    free(d->v_new);
    free(d->out);
    free(d->dq);
    free(d->dout);
    free(d->dlse);
    memset(d, 0, sizeof *d);
}

int lkv_qkv_dump_make(const lkv_model *m, const int *doc_a, int na, const int *doc_b, int nb,
                      const int *question, int nq, int block_tokens, int dtype, lkv_qkv_dump *d)
{
    memset(d, 0, sizeof *d);
    const lkv_model_cfg *c = &m->cfg;
    lkv_model_kv kv;
    int B = block_tokens;
    uint32_t pages = (uint32_t)((na + B - 1) / B + (nb + B - 1) / B + (nq + 1 + B - 1) / B + 1);
    int rc = lkv_model_kv_init(&kv, m, block_tokens, dtype, pages);
    if (rc != 0) {
        return rc;
    }
    lkv_model_seg *segs = lkv_xcalloc(3, sizeof(lkv_model_seg));
    lkv_model_trace tr = {0};
    float *logits = lkv_xmalloc((size_t)nq * c->vocab_size * sizeof(float));
    const size_t L = (size_t)c->n_layers, D = (size_t)c->dim;
    const size_t KVD = (size_t)c->n_kv_heads * c->head_dim;
    rc = lkv_model_forward(m, &kv, NULL, 0, &segs[0], doc_a, na, NULL, NULL);
    if (rc == 0) {
        rc = lkv_model_forward(m, &kv, NULL, 0, &segs[1], doc_b, nb, NULL, NULL);
    }
    segs[1].start = na;
    segs[2].start = na + nb;
    if (rc == 0) {
        rc = lkv_model_forward(m, &kv, segs, 2, &segs[2], question, nq, logits, &tr);
    }
    if (rc != 0) {
        goto out;
    }
    d->shape = kv.shape;
    d->pe_cfg = m->pe_cfg;
    d->sm_scale = 1.0f / sqrtf((float)c->head_dim);
    d->n_new = nq;
    d->new_start = na + nb;
    d->refs = lkv_xmalloc(pages * sizeof(uint64_t));
    rc = lkv_model_refs(&kv, segs, 2, d->refs, &d->n_refs);
    if (rc != 0) {
        goto out;
    }
    d->q = lkv_xmalloc(L * nq * D * sizeof(float));
    d->out = lkv_xmalloc(L * nq * D * sizeof(float));
    d->k_new = lkv_xmalloc(L * nq * KVD * sizeof(float));
    d->v_new = lkv_xmalloc(L * nq * KVD * sizeof(float));
    memcpy(d->q, tr.q, L * nq * D * sizeof(float));
    memcpy(d->out, tr.att, L * nq * D * sizeof(float));
    memcpy(d->k_new, tr.k, L * nq * KVD * sizeof(float));
    memcpy(d->v_new, tr.v, L * nq * KVD * sizeof(float));
    /* Decode one greedy token. */
    int next = lkv_model_argmax(logits + (size_t)(nq - 1) * c->vocab_size, c->vocab_size);
    d->dec_pos = segs[2].start + segs[2].n_tokens;
    rc = lkv_model_forward(m, &kv, segs, 2, &segs[2], &next, 1, NULL, &tr);
    if (rc != 0) {
        goto out;
    }
    d->dec_refs = lkv_xmalloc(pages * sizeof(uint64_t));
    rc = lkv_model_refs(&kv, segs, 3, d->dec_refs, &d->n_dec_refs);
    if (rc != 0) {
        goto out;
    }
    d->dq = lkv_xmalloc(L * D * sizeof(float));
    d->dout = lkv_xmalloc(L * D * sizeof(float));
    d->dlse = lkv_xmalloc(L * c->n_heads * sizeof(float));
    memcpy(d->dq, tr.q, L * D * sizeof(float));
    for (size_t l = 0; l < L; l++) {
        int32_t off[2] = {0, d->n_dec_refs};
        lkv_decode_args a = {.shape = kv.shape,
                             .pe = &m->pe,
                             .layer = (int)l,
                             .batch = 1,
                             .q = d->dq + l * D,
                             .q_pos = &d->dec_pos,
                             .arena = kv.base,
                             .page_bytes = kv.page_bytes,
                             .refs = d->dec_refs,
                             .ref_offset = off,
                             .sm_scale = d->sm_scale,
                             .out = d->dout + l * D,
                             .lse = d->dlse + l * c->n_heads};
        rc = lkv_attn_decode_cpu(&a);
        if (rc != 0) {
            goto out;
        }
    }
    d->n_pages = kv.n_used;
    d->page_bytes = kv.page_bytes;
    d->arena = kv.base; /* take ownership */
    kv.base = NULL;
out:
    lkv_model_kv_free(&kv);
    lkv_model_trace_free(&tr);
    free(logits);
    free(segs);
    if (rc != 0) {
        lkv_qkv_dump_free(d);
    }
    return rc;
}

/* Sizes of the per-layer arrays of a dump, in floats. */
static void dump_sizes(const lkv_qkv_dump *d, size_t *nq, size_t *nk, size_t *hq)
{
    *nq = (size_t)d->n_new * d->shape.n_q_heads * d->shape.head_dim;
    *nk = (size_t)d->n_new * d->shape.n_kv_heads * d->shape.head_dim;
    *hq = (size_t)d->shape.n_q_heads * d->shape.head_dim;
}

#define W(ptr, size)                                                                               \
    do {                                                                                           \
        if ((size) > 0 && fwrite((ptr), (size), 1, f) != 1) {                                      \
            rc = LKV_EIO;                                                                          \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

int lkv_qkv_dump_write(const char *path, const lkv_qkv_dump *d)
{
    int rc = 0;
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        return LKV_EIO;
    }
    const lkv_kv_shape *s = &d->shape;
    const lkv_posenc_cfg *p = &d->pe_cfg;
    int32_t hdr[10] = {s->n_layers,   s->n_q_heads,    s->n_kv_heads, s->head_dim,
                       s->dtype,      s->block_tokens, p->kind,       p->rope_pairing,
                       p->rotary_dim, p->rope_scaling};
    double dd[5] = {p->rope_theta, p->scaling_factor, p->low_freq_factor, p->high_freq_factor,
                    p->original_max_pos};
    size_t nq, nk, hq;
    dump_sizes(d, &nq, &nk, &hq);
    W("LKVQKV01", 8);
    W(hdr, sizeof hdr);
    W(dd, sizeof dd);
    W(&d->sm_scale, 4);
    W(&d->n_pages, 4);
    W(&d->page_bytes, 8);
    W(&d->n_new, 4);
    W(&d->new_start, 8);
    W(&d->n_refs, 4);
    W(&d->dec_pos, 8);
    W(&d->n_dec_refs, 4);
    W(d->arena, (size_t)d->n_pages * d->page_bytes);
    W(d->refs, (size_t)d->n_refs * 8);
    W(d->dec_refs, (size_t)d->n_dec_refs * 8);
    for (int l = 0; l < s->n_layers; l++) {
        W(d->q + l * nq, nq * 4);
        W(d->k_new + l * nk, nk * 4);
        W(d->v_new + l * nk, nk * 4);
        W(d->out + l * nq, nq * 4);
        W(d->dq + l * hq, hq * 4);
        W(d->dout + l * hq, hq * 4);
        W(d->dlse + (size_t)l * s->n_q_heads, (size_t)s->n_q_heads * 4);
    }
out:
    if (fclose(f) != 0 && rc == 0) {
        rc = LKV_EIO;
    }
    return rc;
}

#define R(ptr, size)                                                                               \
    do {                                                                                           \
        if ((size) > 0 && fread((ptr), (size), 1, f) != 1) {                                       \
            rc = LKV_EIO;                                                                          \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

int lkv_qkv_dump_read(const char *path, lkv_qkv_dump *d)
{
    int rc = 0;
    memset(d, 0, sizeof *d);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return LKV_EIO;
    }
    char magic[8];
    int32_t hdr[10];
    double dd[5];
    R(magic, 8);
    R(hdr, sizeof hdr);
    R(dd, sizeof dd);
    R(&d->sm_scale, 4);
    R(&d->n_pages, 4);
    R(&d->page_bytes, 8);
    R(&d->n_new, 4);
    R(&d->new_start, 8);
    R(&d->n_refs, 4);
    R(&d->dec_pos, 8);
    R(&d->n_dec_refs, 4);
    lkv_kv_shape *s = &d->shape;
    *s = (lkv_kv_shape){.n_layers = hdr[0],
                        .n_q_heads = hdr[1],
                        .n_kv_heads = hdr[2],
                        .head_dim = hdr[3],
                        .dtype = hdr[4],
                        .block_tokens = hdr[5]};
    d->pe_cfg = (lkv_posenc_cfg){.kind = hdr[6],
                                 .rope_pairing = hdr[7],
                                 .rotary_dim = hdr[8],
                                 .rope_scaling = hdr[9],
                                 .rope_theta = dd[0],
                                 .scaling_factor = dd[1],
                                 .low_freq_factor = dd[2],
                                 .high_freq_factor = dd[3],
                                 .original_max_pos = dd[4]};
    if (memcmp(magic, "LKVQKV01", 8) != 0 || s->n_layers < 1 || s->n_layers > 1024 ||
        s->n_q_heads < 1 || s->n_q_heads > LKV_MAX_Q_HEADS || s->n_kv_heads < 1 ||
        s->head_dim < 8 || s->head_dim > LKV_MAX_HEAD_DIM || lkv_dtype_size(s->dtype) == 0 ||
        s->block_tokens < 1 || s->block_tokens > LKV_MAX_BLOCK_TOKENS ||
        d->page_bytes < lkv_block_bytes(s) || d->page_bytes > (1ull << 32) ||
        d->n_pages > (1u << 20) || d->n_new < 1 || d->n_new > (1 << 20) || d->n_refs < 0 ||
        d->n_refs > (1 << 24) || d->n_dec_refs < 0 || d->n_dec_refs > (1 << 24)) {
        rc = LKV_ECORRUPT;
        goto out;
    }
    size_t nq, nk, hq, L = (size_t)s->n_layers;
    dump_sizes(d, &nq, &nk, &hq);
    d->arena = lkv_xmalloc((size_t)d->n_pages * d->page_bytes + 1);
    d->refs = lkv_xmalloc((size_t)d->n_refs * 8 + 8);
    d->dec_refs = lkv_xmalloc((size_t)d->n_dec_refs * 8 + 8);
    d->q = lkv_xmalloc(L * nq * 4);
    d->k_new = lkv_xmalloc(L * nk * 4);
    d->v_new = lkv_xmalloc(L * nk * 4);
    d->out = lkv_xmalloc(L * nq * 4);
    d->dq = lkv_xmalloc(L * hq * 4);
    d->dout = lkv_xmalloc(L * hq * 4);
    d->dlse = lkv_xmalloc(L * (size_t)s->n_q_heads * 4);
    R(d->arena, (size_t)d->n_pages * d->page_bytes);
    R(d->refs, (size_t)d->n_refs * 8);
    R(d->dec_refs, (size_t)d->n_dec_refs * 8);
    for (size_t l = 0; l < L; l++) {
        R(d->q + l * nq, nq * 4);
        R(d->k_new + l * nk, nk * 4);
        R(d->v_new + l * nk, nk * 4);
        R(d->out + l * nq, nq * 4);
        R(d->dq + l * hq, hq * 4);
        R(d->dout + l * hq, hq * 4);
        R(d->dlse + l * s->n_q_heads, (size_t)s->n_q_heads * 4);
    }
    if (fgetc(f) != EOF) {
        rc = LKV_ECORRUPT;
    }
out:
    fclose(f);
    if (rc != 0) {
        lkv_qkv_dump_free(d);
    }
    return rc;
}
