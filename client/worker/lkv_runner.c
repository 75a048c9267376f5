/*
 * lkv_runner.c: the model runner (see lkv_runner.h). The body of lkv_model_forward moved here
 * behind the backend table; lkv_model_forward is now this runner on the CPU backend.
 *
 * Scratch: the activation buffers grow to the largest call seen (cap tokens) and are reused,
 * so a decode loop allocates nothing per token. Block references are built on the host.
 */
#include "lkv_runner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_err.h"
#include "lkv_log.h"

/* Offset of one tensor pointer of m in the weights blob. */
static const float *rebase(const lkv_runner *r, const float *p)
{
    return r->w + (p - r->m->data);
}

/* Total floats of the model's tensors (what lkv_model_load read). */
static size_t weights_floats(const lkv_model *m)
{
    const lkv_model_cfg *c = &m->cfg;
    const float *end = m->rms_final + c->dim;
    if (m->wcls != m->tok_emb) {
        end = m->wcls + (size_t)c->vocab_size * c->dim;
    }
    return (size_t)(end - m->data);
}

int lkv_runner_init(lkv_runner *r, const lkv_model *m, const lkv_backend *be)
{
    memset(r, 0, sizeof(*r));
    if (m == NULL || be == NULL) {
        return LKV_EINVAL;
    }
    r->m = m;
    r->be = be;
    r->w = be->map_weights(be->ctx, m->data, weights_floats(m) * sizeof(float));
    r->tok_emb = rebase(r, m->tok_emb);
    r->rms_att = rebase(r, m->rms_att);
    r->wq = rebase(r, m->wq);
    r->wk = rebase(r, m->wk);
    r->wv = rebase(r, m->wv);
    r->wo = rebase(r, m->wo);
    r->rms_ffn = rebase(r, m->rms_ffn);
    r->w1 = rebase(r, m->w1);
    r->w2 = rebase(r, m->w2);
    r->w3 = rebase(r, m->w3);
    r->rms_final = rebase(r, m->rms_final);
    r->wcls = rebase(r, m->wcls);
    return 0;
}

static void scratch_free(lkv_runner *r)
{
    const lkv_backend *be = r->be;
    float **bufs[] = {&r->x,   &r->xb,  &r->q,  &r->k,  &r->ks,    &r->v,
                      &r->att, &r->tmp, &r->h1, &r->h3, &r->logits};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        be->release(be->ctx, *bufs[i]);
        *bufs[i] = NULL;
    }
    r->cap = 0;
}

void lkv_runner_free(lkv_runner *r)
{
    if (r->be != NULL) {
        scratch_free(r);
        r->be->release_weights(r->be->ctx, r->w);
    }
    memset(r, 0, sizeof(*r));
}

static void scratch_reserve(lkv_runner *r, int n)
{
    if (n <= r->cap) {
        return;
    }
    scratch_free(r);
    const lkv_model_cfg *c = &r->m->cfg;
    const lkv_backend *be = r->be;
    size_t D = (size_t)c->dim, KVD = (size_t)c->n_kv_heads * c->head_dim;
    size_t N = (size_t)n, F = sizeof(float);
    r->x = be->alloc(be->ctx, N * D * F);
    r->xb = be->alloc(be->ctx, N * D * F);
    r->q = be->alloc(be->ctx, N * D * F);
    r->k = be->alloc(be->ctx, N * KVD * F);
    r->ks = be->alloc(be->ctx, N * KVD * F);
    r->v = be->alloc(be->ctx, N * KVD * F);
    r->att = be->alloc(be->ctx, N * D * F);
    r->tmp = be->alloc(be->ctx, N * D * F);
    r->h1 = be->alloc(be->ctx, N * (size_t)c->hidden_dim * F);
    r->h3 = be->alloc(be->ctx, N * (size_t)c->hidden_dim * F);
    r->logits = be->alloc(be->ctx, N * (size_t)c->vocab_size * F);
    r->cap = n;
}

typedef struct dprep dprep;
static int decode_prep(lkv_runner *r, lkv_runner_seq *seqs, int n, const lkv_model_kv *kv0,
                       dprep *d);
static void dprep_free(dprep *d);
static int decode_attn(lkv_runner *r, lkv_runner_seq *seqs, int n, const dprep *d, int l, int row0);

/* A decode step's inputs for n sequences: validated, pages taken, references built. */
struct dprep {
    uint64_t *refs;
    int32_t *off;
    int64_t *qpos;
    int *tokens;
};

/* The rest of layer l for n rows after attention (r->att): the output projection and its
 * residual, then the feed-forward block (RMSNorm, SwiGLU) and its residual, into r->x. */
static void layer_out(lkv_runner *r, int l, int n)
{
    const lkv_backend *be = r->be;
    const int D = r->m->cfg.dim, HID = r->m->cfg.hidden_dim;
    be->matmul(be->ctx, r->tmp, r->att, r->wo + (size_t)l * D * D, n, D, D);
    be->add(be->ctx, r->x, r->tmp, (size_t)n * D);
    be->rmsnorm(be->ctx, r->xb, r->x, r->rms_ffn + (size_t)l * D, n, D);
    be->matmul(be->ctx, r->h1, r->xb, r->w1 + (size_t)l * HID * D, n, HID, D);
    be->matmul(be->ctx, r->h3, r->xb, r->w3 + (size_t)l * HID * D, n, HID, D);
    be->swiglu(be->ctx, r->h1, r->h3, (size_t)n * HID);
    be->matmul(be->ctx, r->tmp, r->h1, r->w2 + (size_t)l * D * HID, n, D, HID);
    be->add(be->ctx, r->x, r->tmp, (size_t)n * D);
}

int lkv_runner_forward(lkv_runner *r, lkv_model_kv *kv, const lkv_model_seg *ctx, int n_ctx,
                       lkv_model_seg *seg, const int *tokens, int n, float *logits,
                       lkv_model_trace *trace)
{
    const lkv_model *m = r->m;
    const lkv_backend *be = r->be;
    const lkv_model_cfg *c = &m->cfg;
    const int D = c->dim, HD = c->head_dim, KVD = c->n_kv_heads * c->head_dim;
    const int B = kv->shape.block_tokens, n0 = seg->n_tokens, L = c->n_layers;
    const size_t F = sizeof(float);
    lkv_runner_ride *ride = r->ride; /* Consumed by this call, run or not. */
    r->ride = NULL;
    dprep dp = {0};
    int nd = 0; /* Ridden decode rows (rows n .. n + nd of the pass). */
    int rc = 0;
    if (n < 1 || n_ctx < 0 || seg->start < 0 || tokens == NULL) {
        return LKV_EINVAL;
    }
    if (seg->start + n0 + n - 1 > (int64_t)LKV_MAX_POSITION) {
        return LKV_EINVAL;
    }
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size) {
            return LKV_EINVAL;
        }
    }
    /* Pages for the new tokens, up front, zeroed (unused slots stay zero). */
    int need = (n0 + n + B - 1) / B;
    if (need > LKV_MODEL_SEG_MAX_BLOCKS ||
        (need > seg->n_blocks && (uint32_t)(need - seg->n_blocks) > lkv_model_kv_room(kv))) {
        return LKV_ENOSPC;
    }
    while (seg->n_blocks < need) {
        uint32_t pg = lkv_model_kv_take(kv);
        be->fill_zero(be->ctx, kv->base + (uint64_t)pg * kv->page_bytes,
                      lkv_block_bytes(&kv->shape));
        seg->pages[seg->n_blocks++] = pg;
    }
    const int decode = n == 1 && n0 > 0;
    /* References: the context segments, then seg's earlier tokens (decode: and the new one). */
    int32_t max_refs = need;
    for (int s = 0; s < n_ctx; s++) {
        max_refs += (ctx[s].n_tokens + B - 1) / B;
    }
    uint64_t *refs = lkv_xmalloc(((size_t)max_refs + 1) * sizeof(uint64_t));
    int32_t n_refs = 0;
    lkv_model_seg *segs = lkv_xmalloc(((size_t)n_ctx + 1) * sizeof(lkv_model_seg));
    if (n_ctx > 0) {
        memcpy(segs, ctx, (size_t)n_ctx * sizeof *segs);
    }
    segs[n_ctx] = *seg;
    segs[n_ctx].n_tokens = decode ? n0 + 1 : n0;
    rc = lkv_model_refs(kv, segs, n_ctx + 1, refs, &n_refs);
    free(segs);
    if (rc != 0) {
        goto out;
    }
    if (ride != NULL && ride->n > 0 && !decode && trace == NULL &&
        decode_prep(r, ride->seqs, ride->n, kv, &dp) == 0) {
        nd = ride->n;
    }
    const int N = n + nd; /* Rows of the dense ops. */
    scratch_reserve(r, N);
    r->n_forward++;
    if (trace != NULL) {
        lkv_model_trace_free(trace);
        trace->n_tok = n;
        trace->decode = decode;
        trace->new_start = seg->start + n0;
        trace->q = lkv_xmalloc((size_t)L * n * D * F);
        trace->k = lkv_xmalloc((size_t)L * n * KVD * F);
        trace->v = lkv_xmalloc((size_t)L * n * KVD * F);
        trace->att = lkv_xmalloc((size_t)L * n * D * F);
    }
    be->embed(be->ctx, r->x, r->tok_emb, tokens, n, D);
    if (nd > 0) {
        be->embed(be->ctx, r->x + (size_t)n * D, r->tok_emb, dp.tokens, nd, D);
    }
    for (int l = 0; l < L; l++) {
        be->rmsnorm(be->ctx, r->xb, r->x, r->rms_att + (size_t)l * D, N, D);
        be->matmul(be->ctx, r->q, r->xb, r->wq + (size_t)l * D * D, N, D, D);
        be->matmul(be->ctx, r->k, r->xb, r->wk + (size_t)l * KVD * D, N, KVD, D);
        be->matmul(be->ctx, r->v, r->xb, r->wv + (size_t)l * KVD * D, N, KVD, D);
        /* Stored keys: rotated local to seg. Prefill keys: local to the first new token. */
        be->rope(be->ctx, &m->pe, r->k, r->ks, n, c->n_kv_heads, n0);
        if (!decode) {
            be->rope(be->ctx, &m->pe, r->k, r->k, n, c->n_kv_heads, 0);
        }
        be->kv_write(be->ctx, &kv->shape, kv->base, kv->page_bytes, seg->pages, l, n0, n, r->ks,
                     r->v);
        if (decode) {
            int64_t qpos = seg->start + n0;
            int32_t off[2] = {0, n_refs};
            lkv_decode_args a = {.shape = kv->shape,
                                 .pe = &m->pe,
                                 .layer = l,
                                 .batch = 1,
                                 .q = r->q,
                                 .q_pos = &qpos,
                                 .arena = kv->base,
                                 .page_bytes = kv->page_bytes,
                                 .refs = refs,
                                 .ref_offset = off,
                                 .sm_scale = 1.0f / sqrtf((float)HD),
                                 .out = r->att};
            rc = be->attn_decode(be->ctx, &a);
        } else {
            lkv_prefill_args a = {.shape = kv->shape,
                                  .pe = &m->pe,
                                  .layer = l,
                                  .n_new = n,
                                  .new_start = seg->start + n0,
                                  .q = r->q,
                                  .k_new = r->k,
                                  .v_new = r->v,
                                  .arena = kv->base,
                                  .page_bytes = kv->page_bytes,
                                  .refs = refs,
                                  .n_refs = n_refs,
                                  .sm_scale = 1.0f / sqrtf((float)HD),
                                  .out = r->att};
            rc = be->attn_prefill(be->ctx, &a);
        }
        if (rc == 0 && nd > 0) {
            rc = decode_attn(r, ride->seqs, nd, &dp, l, n);
        }
        if (rc != 0) {
            goto out;
        }
        if (trace != NULL) {
            be->to_host(be->ctx, trace->q + (size_t)l * n * D, r->q, (size_t)n * D * F);
            be->to_host(be->ctx, trace->k + (size_t)l * n * KVD, decode ? r->ks : r->k,
                        (size_t)n * KVD * F);
            be->to_host(be->ctx, trace->v + (size_t)l * n * KVD, r->v, (size_t)n * KVD * F);
            be->to_host(be->ctx, trace->att + (size_t)l * n * D, r->att, (size_t)n * D * F);
        }
        layer_out(r, l, N);
    }
    seg->n_tokens = n0 + n;
    for (int b = 0; b < nd; b++) {
        ride->seqs[b].seg->n_tokens++;
    }
    if (logits != NULL || nd > 0) {
        /* Rows wanted: the prefill's (its last with last_logits, none without logits), then the
         * ridden rows, contiguous: one classifier pass. */
        const int r0 = logits == NULL ? n : r->last_logits ? n - 1 : 0, nr = N - r0;
        const size_t V = (size_t)c->vocab_size;
        be->rmsnorm(be->ctx, r->xb, r->x + (size_t)r0 * D, r->rms_final, nr, D);
        be->matmul(be->ctx, r->logits, r->xb, r->wcls, nr, c->vocab_size, D);
        if (logits != NULL) {
            be->to_host(be->ctx, logits, r->logits, (size_t)(n - r0) * V * F);
        }
        if (nd > 0) {
            be->to_host(be->ctx, ride->logits, r->logits + (size_t)(n - r0) * V,
                        (size_t)nd * V * F);
        }
    }
    if (nd > 0) {
        ride->done = 1;
        r->n_rides++;
    }
out:
    free(refs);
    dprep_free(&dp);
    return rc;
}

static void dprep_free(dprep *d)
{
    free(d->refs);
    free(d->off);
    free(d->qpos);
    free(d->tokens);
    memset(d, 0, sizeof(*d));
}

/* Validates seqs (all on the arena of base/page_bytes/shape of seqs[0], or of kv0 if given),
 * takes the pages their new token needs, builds their references. 0, or LKV_EINVAL /
 * LKV_ENOSPC before anything is written (then *d holds nothing). */
static int decode_prep(lkv_runner *r, lkv_runner_seq *seqs, int n, const lkv_model_kv *kv0,
                       dprep *d)
{
    const lkv_backend *be = r->be;
    const lkv_model_cfg *c = &r->m->cfg;
    memset(d, 0, sizeof(*d));
    if (n < 1 || seqs == NULL) {
        return LKV_EINVAL;
    }
    if (kv0 == NULL) {
        kv0 = seqs[0].kv;
    }
    /* Validate everything and take the pages before any write, so a refused batch changes
     * nothing but the pages taken (which stay in their segments, as forward does). */
    int32_t total = 0;
    for (int b = 0; b < n; b++) {
        lkv_runner_seq *q = &seqs[b];
        const lkv_model_kv *kv = q->kv;
        const lkv_model_seg *seg = q->seg;
        if (kv == NULL || seg == NULL || q->n_ctx < 0 || seg->n_tokens < 1 ||
            kv->base != kv0->base || kv->page_bytes != kv0->page_bytes ||
            kv->shape.block_tokens != kv0->shape.block_tokens ||
            kv->shape.dtype != kv0->shape.dtype || q->token < 0 || q->token >= c->vocab_size ||
            seg->start + seg->n_tokens > (int64_t)LKV_MAX_POSITION) {
            return LKV_EINVAL;
        }
        const int B = kv->shape.block_tokens;
        int need = (seg->n_tokens + 1 + B - 1) / B;
        total += need;
        for (int s = 0; s < q->n_ctx; s++) {
            total += (q->ctx[s].n_tokens + B - 1) / B;
        }
        if (need > LKV_MODEL_SEG_MAX_BLOCKS ||
            (need > seg->n_blocks && (uint32_t)(need - seg->n_blocks) > lkv_model_kv_room(kv))) {
            return LKV_ENOSPC;
        }
    }
    d->refs = lkv_xmalloc(((size_t)total + 1) * sizeof(uint64_t));
    d->off = lkv_xmalloc(((size_t)n + 1) * sizeof(int32_t));
    d->qpos = lkv_xmalloc((size_t)n * sizeof(int64_t));
    d->tokens = lkv_xmalloc((size_t)n * sizeof(int));
    d->off[0] = 0;
    for (int b = 0; b < n; b++) {
        lkv_runner_seq *q = &seqs[b];
        lkv_model_seg *seg = q->seg;
        const int B = q->kv->shape.block_tokens;
        int need = (seg->n_tokens + 1 + B - 1) / B;
        while (seg->n_blocks < need) {
            uint32_t pg = lkv_model_kv_take(q->kv);
            be->fill_zero(be->ctx, q->kv->base + (uint64_t)pg * q->kv->page_bytes,
                          lkv_block_bytes(&q->kv->shape));
            seg->pages[seg->n_blocks++] = pg;
        }
        lkv_model_seg *segs = lkv_xmalloc(((size_t)q->n_ctx + 1) * sizeof(lkv_model_seg));
        if (q->n_ctx > 0) {
            memcpy(segs, q->ctx, (size_t)q->n_ctx * sizeof *segs);
        }
        segs[q->n_ctx] = *seg;
        segs[q->n_ctx].n_tokens = seg->n_tokens + 1;
        int32_t nr = 0;
        int rc = lkv_model_refs(q->kv, segs, q->n_ctx + 1, d->refs + d->off[b], &nr);
        free(segs);
        if (rc != 0) {
            dprep_free(d);
            return rc;
        }
        d->off[b + 1] = d->off[b] + nr;
        d->qpos[b] = seg->start + seg->n_tokens;
        d->tokens[b] = q->token;
    }
    return 0;
}

/* Layer l of a decode step for the n sequences at rows row0.. of the scratch (q, k, v computed
 * there): their keys rotated and written, then one attention call of batch n into att. */
static int decode_attn(lkv_runner *r, lkv_runner_seq *seqs, int n, const dprep *d, int l, int row0)
{
    const lkv_model *m = r->m;
    const lkv_backend *be = r->be;
    const lkv_model_cfg *c = &m->cfg;
    const int D = c->dim, HD = c->head_dim, KVD = c->n_kv_heads * c->head_dim;
    const lkv_model_kv *kv0 = seqs[0].kv;
    for (int b = 0; b < n; b++) {
        const lkv_runner_seq *q = &seqs[b];
        size_t o = (size_t)(row0 + b) * KVD;
        be->rope(be->ctx, &m->pe, r->k + o, r->ks + o, 1, c->n_kv_heads, q->seg->n_tokens);
        be->kv_write(be->ctx, &q->kv->shape, q->kv->base, q->kv->page_bytes, q->seg->pages, l,
                     q->seg->n_tokens, 1, r->ks + o, r->v + o);
    }
    lkv_decode_args a = {.shape = kv0->shape,
                         .pe = &m->pe,
                         .layer = l,
                         .batch = n,
                         .q = r->q + (size_t)row0 * D,
                         .q_pos = d->qpos,
                         .arena = kv0->base,
                         .page_bytes = kv0->page_bytes,
                         .refs = d->refs,
                         .ref_offset = d->off,
                         .sm_scale = 1.0f / sqrtf((float)HD),
                         .out = r->att + (size_t)row0 * D};
    return be->attn_decode(be->ctx, &a);
}

int lkv_runner_decode_batch(lkv_runner *r, lkv_runner_seq *seqs, int n, float *logits)
{
    const lkv_model *m = r->m;
    const lkv_backend *be = r->be;
    const lkv_model_cfg *c = &m->cfg;
    const int D = c->dim, KVD = c->n_kv_heads * c->head_dim;
    const int L = c->n_layers;
    if (n < 1 || seqs == NULL || logits == NULL) {
        return LKV_EINVAL;
    }
    dprep d;
    int rc = decode_prep(r, seqs, n, NULL, &d);
    if (rc != 0) {
        return rc;
    }
    scratch_reserve(r, n);
    r->n_forward++;
    be->embed(be->ctx, r->x, r->tok_emb, d.tokens, n, D);
    for (int l = 0; l < L; l++) {
        be->rmsnorm(be->ctx, r->xb, r->x, r->rms_att + (size_t)l * D, n, D);
        be->matmul(be->ctx, r->q, r->xb, r->wq + (size_t)l * D * D, n, D, D);
        be->matmul(be->ctx, r->k, r->xb, r->wk + (size_t)l * KVD * D, n, KVD, D);
        be->matmul(be->ctx, r->v, r->xb, r->wv + (size_t)l * KVD * D, n, KVD, D);
        rc = decode_attn(r, seqs, n, &d, l, 0);
        if (rc != 0) {
            goto out;
        }
        layer_out(r, l, n);
    }
    for (int b = 0; b < n; b++) {
        seqs[b].seg->n_tokens++;
    }
    be->rmsnorm(be->ctx, r->xb, r->x, r->rms_final, n, D);
    be->matmul(be->ctx, r->logits, r->xb, r->wcls, n, c->vocab_size, D);
    be->to_host(be->ctx, logits, r->logits, (size_t)n * c->vocab_size * sizeof(float));
out:
    dprep_free(&d);
    return rc;
}
