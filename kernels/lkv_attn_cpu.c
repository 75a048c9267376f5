/*
 * lkv_attn_cpu.c: the CPU reference of LazyAttention (decode, prefill) and of materialisation
 * (the Block-Attention baseline), per lkv_attn.h. It is the oracle the CUDA kernels are checked
 * against, so it favours clarity and accuracy over speed, while staying fast enough for tests
 * and for the tiny model on two cores.
 *
 * Numerics: K and V are read from the arena (f32, f16 or bf16) and widened to fp32 once per
 * block. The query is rotated once per document segment (a run of references with the same
 * start; the walk re-rotates whenever the start changes), from the unrotated fp32 query, with
 * fp64 angles from the exact integer offset p - s and one rounding to fp32 (the softmax scale
 * is folded in at the same time). Dot products and the value accumulation are fp32 (eight
 * partial sums). Scores, the running max and sum, and ALiBi biases are fp64, so that large
 * ALiBi biases far from the query (|bias| up to slope * 4M) lose no precision; the weights are
 * expf of (score - max) <= 0. It is a numerically stable online softmax: per block of keys,
 * new max, one rescale of the accumulator, then weights <= 1 for every key. The file is built
 * with -O3 -fno-math-errno (kernels/CMakeLists.txt) so that these loops vectorise.
 *
 * Loop order: per kv head, every query head of its GQA group (and, in prefill, every new
 * token) is carried together, so each K/V block is widened once per kv head.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "lkv_attn.h"
#include "lkv_err.h"
#include "lkv_half.h"
#include "lkv_log.h"
#include "lkv_posenc.h"

/* Running state of n_tok query tokens x g query heads of one kv head. */
typedef struct attn_state {
    const lkv_kv_shape *shape;
    const lkv_posenc *pe;
    float sm_scale;
    int rotate;     /* Rotate the query (RoPE and no LKV_ATTN_NO_ROTATE). */
    int alibi;      /* Add ALiBi biases. */
    int D, g, kvh;  /* Head dim, group size, kv head. */
    int n_tok;      /* Query tokens carried. */
    int64_t pos0;   /* Absolute position of token 0; token t is at pos0 + t. */
    const float *q; /* [n_tok][n_q_heads][D], unrotated. Borrowed. */
    float *qr;      /* [n_tok][g][D] rotated and scaled queries. */
    double *m, *l;  /* [n_tok][g] running max and sum. */
    float *acc;     /* [n_tok][g][D] unnormalised output. */
    double *sc;     /* Scores scratch, one per key of the largest block. */
    float *kbuf;    /* Widened K of one block or segment: [keys][D]. */
    float *vbuf;    /* Widened V. */
} attn_state;

static int shape_valid(const lkv_kv_shape *s)
{
    return s->n_layers >= 1 && s->n_q_heads >= 1 && s->n_q_heads <= LKV_MAX_Q_HEADS &&
           s->n_kv_heads >= 1 && s->n_q_heads % s->n_kv_heads == 0 && s->head_dim >= 8 &&
           s->head_dim <= LKV_MAX_HEAD_DIM && s->head_dim % 8 == 0 &&
           lkv_dtype_size(s->dtype) != 0 && s->block_tokens >= 1 &&
           s->block_tokens <= LKV_MAX_BLOCK_TOKENS;
}

static int pe_valid(const lkv_posenc *pe, const lkv_kv_shape *s)
{
    if (pe == NULL || pe->head_dim != s->head_dim) {
        return 0;
    }
    switch (pe->kind) {
    case LKV_POSENC_NONE:
        return 1;
    case LKV_POSENC_ALIBI:
        return pe->n_q_heads >= s->n_q_heads;
    case LKV_POSENC_ROPE:
        return pe->n_pairs >= 1 && 2 * pe->n_pairs <= s->head_dim &&
               (pe->pairing == LKV_ROPE_HALF || pe->pairing == LKV_ROPE_INTERLEAVED);
    default:
        return 0;
    }
}

/* Checks one reference against the shape; *last is the absolute position of its last key. */
static int ref_valid(const lkv_kv_shape *s, uint64_t r, int64_t *last)
{
    uint32_t valid = lkv_ref_valid(r);
    if ((int)valid > s->block_tokens) {
        return 0;
    }
    *last = (int64_t)lkv_ref_start(r) + (int64_t)lkv_ref_block(r) * s->block_tokens + valid - 1;
    return 1;
}

/* Allocates a state for up to max_tok tokens and blocks (or segments) of up to max_keys keys. */
static void state_init(attn_state *st, const lkv_kv_shape *shape, const lkv_posenc *pe,
                       float sm_scale, unsigned flags, int max_tok, int max_keys)
{
    memset(st, 0, sizeof *st);
    st->shape = shape;
    st->pe = pe;
    st->sm_scale = sm_scale;
    st->rotate = pe->kind == LKV_POSENC_ROPE && !(flags & LKV_ATTN_NO_ROTATE);
    st->alibi = pe->kind == LKV_POSENC_ALIBI;
    st->D = shape->head_dim;
    st->g = shape->n_q_heads / shape->n_kv_heads;
    size_t rows = (size_t)max_tok * (size_t)st->g;
    st->qr = lkv_xmalloc(rows * (size_t)st->D * sizeof(float));
    st->acc = lkv_xmalloc(rows * (size_t)st->D * sizeof(float));
    st->m = lkv_xmalloc(rows * sizeof(double));
    st->l = lkv_xmalloc(rows * sizeof(double));
    st->sc = lkv_xmalloc((size_t)max_keys * sizeof(double));
    st->kbuf = lkv_xmalloc((size_t)max_keys * (size_t)st->D * sizeof(float));
    st->vbuf = lkv_xmalloc((size_t)max_keys * (size_t)st->D * sizeof(float));
}

static void state_free(attn_state *st)
{
    free(st->qr);
    free(st->acc);
    free(st->m);
    free(st->l);
    free(st->sc);
    free(st->kbuf);
    free(st->vbuf);
}

/* Starts n_tok tokens (q: [n_tok][n_q_heads][D], token t at pos0 + t) of kv head kvh: empty
 * softmax state for every carried row. */
static void state_reset(attn_state *st, int kvh, const float *q, int64_t pos0, int n_tok)
{
    size_t rows = (size_t)n_tok * (size_t)st->g;
    st->n_tok = n_tok;
    st->kvh = kvh;
    st->q = q;
    st->pos0 = pos0;
    for (size_t r = 0; r < rows; r++) {
        st->m[r] = -INFINITY;
        st->l[r] = 0.0;
    }
    memset(st->acc, 0, rows * (size_t)st->D * sizeof(float));
}

/* Enters a segment that starts at absolute position seg_start: rotates every carried query
 * by (its position - seg_start) and folds in the softmax scale. */
static void rotate_queries(attn_state *st, int64_t seg_start)
{
    const int D = st->D, Hq = st->shape->n_q_heads;
    double cs[LKV_MAX_HEAD_DIM];
    for (int t = 0; t < st->n_tok; t++) {
        if (st->rotate) {
            lkv_rope_table(st->pe, st->pos0 + t - seg_start, cs);
        }
        for (int hh = 0; hh < st->g; hh++) {
            const float *x = st->q + ((size_t)t * Hq + (size_t)st->kvh * st->g + hh) * D;
            float *o = st->qr + ((size_t)t * st->g + hh) * D;
            double sc = st->sm_scale;
            for (int d = 0; d < D; d++) {
                o[d] = (float)(sc * x[d]);
            }
            if (!st->rotate) {
                continue;
            }
            for (int j = 0; j < st->pe->n_pairs; j++) {
                int i0, i1;
                lkv_rope_pair_dims(st->pe, j, &i0, &i1);
                double x0 = x[i0], x1 = x[i1], c = cs[2 * j], s = cs[2 * j + 1];
                o[i0] = (float)(sc * (x0 * c - x1 * s));
                o[i1] = (float)(sc * (x0 * s + x1 * c));
            }
        }
    }
}

static float dot_f32(const float *a, const float *b, int n)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < n; i += 8) { /* n is a multiple of 8 */
        for (int k = 0; k < 8; k++) {
            s[k] += a[i + k] * b[i + k];
        }
    }
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* Attends every carried row to n keys K/V ([n][D] fp32) at absolute positions key_pos0 + j.
 * causal: row t sees only keys at positions <= its own (otherwise all keys, validated). */
static void attend(attn_state *st, const float *K, const float *V, int n, int64_t key_pos0,
                   int causal)
{
    const int D = st->D;
    for (int t = 0; t < st->n_tok; t++) {
        int64_t p = st->pos0 + t;
        int n_eff = n;
        if (causal && p - key_pos0 + 1 < n) {
            n_eff = (int)(p - key_pos0 + 1);
        }
        if (n_eff <= 0) {
            continue;
        }
        for (int hh = 0; hh < st->g; hh++) {
            size_t row = (size_t)t * st->g + hh;
            const float *qv = st->qr + row * D;
            float *acc = st->acc + row * D;
            double slope = st->alibi ? st->pe->alibi_slope[st->kvh * st->g + hh] : 0.0;
            double mx = -INFINITY;
            for (int j = 0; j < n_eff; j++) {
                double s = dot_f32(qv, K + (size_t)j * D, D);
                if (st->alibi) {
                    s += slope * (double)(key_pos0 + j - p);
                }
                st->sc[j] = s;
                mx = s > mx ? s : mx;
            }
            if (mx > st->m[row]) {
                float scale = (float)exp(st->m[row] - mx); /* 0 on the first block */
                st->l[row] *= scale;
                for (int d = 0; d < D; d++) {
                    acc[d] *= scale;
                }
                st->m[row] = mx;
            }
            double l = st->l[row];
            for (int j = 0; j < n_eff; j++) {
                float wf = expf((float)(st->sc[j] - st->m[row])); /* <= 1 */
                const float *v = V + (size_t)j * D;
                l += wf;
                for (int d = 0; d < D; d++) {
                    acc[d] += wf * v[d];
                }
            }
            st->l[row] = l;
        }
    }
}

/* Widens the first n tokens of one block's K and V slabs (layer, kv head) into kbuf/vbuf. */
static void load_block(attn_state *st, const void *arena, uint64_t page_bytes, uint32_t page,
                       int layer, int n)
{
    const lkv_kv_shape *s = st->shape;
    const char *blk = (const char *)arena + (uint64_t)page * page_bytes;
    const char *k = blk + lkv_slab_offset(s, layer, 0, st->kvh);
    const char *v = blk + lkv_slab_offset(s, layer, 1, st->kvh);
    size_t cnt = (size_t)n * (size_t)st->D;
    if (s->dtype == LKV_DTYPE_F32) {
        memcpy(st->kbuf, k, cnt * sizeof(float));
        memcpy(st->vbuf, v, cnt * sizeof(float));
        return;
    }
    uint16_t hk, hv; /* memcpy: pages need not be 2-byte aligned */
    if (s->dtype == LKV_DTYPE_BF16) {
        for (size_t i = 0; i < cnt; i++) {
            memcpy(&hk, k + 2 * i, 2);
            memcpy(&hv, v + 2 * i, 2);
            st->kbuf[i] = lkv_bf16_to_f32(hk);
            st->vbuf[i] = lkv_bf16_to_f32(hv);
        }
    } else {
        for (size_t i = 0; i < cnt; i++) {
            memcpy(&hk, k + 2 * i, 2);
            memcpy(&hv, v + 2 * i, 2);
            st->kbuf[i] = lkv_f16_to_f32(hk);
            st->vbuf[i] = lkv_f16_to_f32(hv);
        }
    }
}

/* Walks cached blocks refs[0..n): re-rotates the queries whenever a reference's start differs
 * from the previous one, then attends the block's valid keys. */
static void attend_refs(attn_state *st, const void *arena, uint64_t page_bytes, int layer,
                        const uint64_t *refs, int32_t n_refs)
{
    int64_t cur = -1;
    for (int32_t i = 0; i < n_refs; i++) {
        uint64_t r = refs[i];
        int64_t start = lkv_ref_start(r);
        int n = (int)lkv_ref_valid(r);
        if (start != cur) {
            rotate_queries(st, start);
            cur = start;
        }
        load_block(st, arena, page_bytes, lkv_ref_page(r), layer, n);
        attend(st, st->kbuf, st->vbuf, n,
               start + (int64_t)lkv_ref_block(r) * st->shape->block_tokens, 0);
    }
}

/* Writes out (fp32, [n_tok][n_q_heads][D]) and optionally lse ([n_tok][n_q_heads]) of the
 * carried rows. */
static void finish(const attn_state *st, float *out, float *lse)
{
    const int D = st->D, Hq = st->shape->n_q_heads;
    for (int t = 0; t < st->n_tok; t++) {
        for (int hh = 0; hh < st->g; hh++) {
            size_t row = (size_t)t * st->g + hh;
            size_t h = (size_t)t * Hq + (size_t)st->kvh * st->g + hh;
            double l = st->l[row];
            float inv = l > 0.0 ? (float)(1.0 / l) : 0.0f;
            for (int d = 0; d < D; d++) {
                out[h * D + d] = st->acc[row * D + d] * inv;
            }
            if (lse != NULL) {
                lse[h] = l > 0.0 ? (float)(st->m[row] + log(l)) : -INFINITY;
            }
        }
    }
}

/* Parallel execution. The work is split into independent items, each computed by exactly one
 * thread with its own attn_state, writing disjoint rows of out/lse: decode items are (sequence,
 * kv head), prefill items (kv head, chunk of PREFILL_CHUNK new tokens). Results do not depend on
 * the thread count (bitwise). */
#define PREFILL_CHUNK   64
#define MAX_THREADS     64
#define WORK_PER_THREAD 4000000 /* FLOPs below which another thread does not pay off. */

static atomic_int cpu_threads; /* 0: all online CPUs. */

void lkv_attn_cpu_set_threads(int n)
{
    atomic_store(&cpu_threads, n < 0 ? 0 : n);
}

typedef struct item_run {
    const lkv_decode_args *d;  /* Decode call, or NULL. */
    const lkv_prefill_args *p; /* Prefill call, or NULL. */
    int n_items;
    atomic_int next; /* Next item to take. */
} item_run;

static void decode_item(attn_state *st, const lkv_decode_args *a, int item)
{
    const lkv_kv_shape *s = &a->shape;
    const int D = s->head_dim, Hq = s->n_q_heads;
    const int b = item / s->n_kv_heads, kvh = item % s->n_kv_heads;
    const int32_t r0 = a->ref_offset[b], r1 = a->ref_offset[b + 1];
    state_reset(st, kvh, (const float *)a->q + (size_t)b * Hq * D, a->q_pos[b], 1);
    attend_refs(st, a->arena, a->page_bytes, a->layer, a->refs + r0, r1 - r0);
    finish(st, (float *)a->out + (size_t)b * Hq * D,
           a->lse != NULL ? a->lse + (size_t)b * Hq : NULL);
}

static void prefill_item(attn_state *st, const lkv_prefill_args *a, int item)
{
    const lkv_kv_shape *s = &a->shape;
    const int D = s->head_dim, Hq = s->n_q_heads, Hkv = s->n_kv_heads;
    const int kvh = item % Hkv, t0 = (item / Hkv) * PREFILL_CHUNK;
    const int nt = a->n_new - t0 < PREFILL_CHUNK ? a->n_new - t0 : PREFILL_CHUNK;
    const float *kn = a->k_new, *vn = a->v_new;
    state_reset(st, kvh, (const float *)a->q + (size_t)t0 * Hq * D, a->new_start + t0, nt);
    attend_refs(st, a->arena, a->page_bytes, a->layer, a->refs, a->n_refs);
    /* The new tokens: their own segment starting at new_start, causal. */
    int nk = t0 + nt;
    for (int t = 0; t < nk; t++) {
        memcpy(st->kbuf + (size_t)t * D, kn + ((size_t)t * Hkv + kvh) * D, D * sizeof(float));
        memcpy(st->vbuf + (size_t)t * D, vn + ((size_t)t * Hkv + kvh) * D, D * sizeof(float));
    }
    rotate_queries(st, a->new_start);
    attend(st, st->kbuf, st->vbuf, nk, a->new_start, 1);
    finish(st, (float *)a->out + (size_t)t0 * Hq * D, NULL);
}

static void *item_worker(void *arg)
{
    item_run *r = arg;
    const lkv_kv_shape *s = r->d != NULL ? &r->d->shape : &r->p->shape;
    attn_state st;
    if (r->d != NULL) {
        state_init(&st, s, r->d->pe, r->d->sm_scale, r->d->flags, 1, s->block_tokens);
    } else {
        int max_keys = r->p->n_new > s->block_tokens ? r->p->n_new : s->block_tokens;
        state_init(&st, s, r->p->pe, r->p->sm_scale, r->p->flags, PREFILL_CHUNK, max_keys);
    }
    for (;;) {
        int i = atomic_fetch_add(&r->next, 1);
        if (i >= r->n_items) {
            break;
        }
        if (r->d != NULL) {
            decode_item(&st, r->d, i);
        } else {
            prefill_item(&st, r->p, i);
        }
    }
    state_free(&st);
    return NULL;
}

/* Runs n_items items of a validated call on up to lkv_attn_cpu_set_threads threads (the caller
 * is one of them); work (FLOPs, roughly) limits the threads for small calls. */
static void run_items(const lkv_decode_args *d, const lkv_prefill_args *p, int n_items,
                      int64_t work)
{
    item_run r = {.d = d, .p = p, .n_items = n_items};
    atomic_init(&r.next, 0);
    int n = atomic_load(&cpu_threads);
    if (n == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus > 0 ? (int)(cpus < MAX_THREADS ? cpus : MAX_THREADS) : 1;
    }
    n = n < MAX_THREADS ? n : MAX_THREADS;
    n = n < n_items ? n : n_items;
    if (work / WORK_PER_THREAD + 1 < n) {
        n = (int)(work / WORK_PER_THREAD + 1);
    }
    pthread_t tid[MAX_THREADS];
    int started = 0;
    for (int i = 1; i < n; i++) {
        if (pthread_create(&tid[started], NULL, item_worker, &r) != 0) {
            break; /* the threads that did start (and this one) take every item */
        }
        started++;
    }
    item_worker(&r);
    for (int i = 0; i < started; i++) {
        pthread_join(tid[i], NULL);
    }
}

int lkv_attn_decode_cpu(const lkv_decode_args *a)
{
    if (a == NULL || !shape_valid(&a->shape) || !pe_valid(a->pe, &a->shape) || a->layer < 0 ||
        a->layer >= a->shape.n_layers || a->batch < 0 || (a->flags & ~LKV_ATTN_NO_ROTATE) ||
        a->page_bytes < lkv_block_bytes(&a->shape) || !isfinite(a->sm_scale)) {
        return LKV_EINVAL;
    }
    if (a->batch == 0) {
        return 0;
    }
    if (a->q == NULL || a->q_pos == NULL || a->out == NULL || a->ref_offset == NULL ||
        a->ref_offset[0] < 0) {
        return LKV_EINVAL;
    }
    for (int b = 0; b < a->batch; b++) {
        int64_t p = a->q_pos[b];
        int32_t r0 = a->ref_offset[b], r1 = a->ref_offset[b + 1];
        if (p < 0 || p > LKV_MAX_POSITION || r1 < r0 ||
            (r1 > r0 && (a->refs == NULL || a->arena == NULL))) {
            return LKV_EINVAL;
        }
        for (int32_t i = r0; i < r1; i++) {
            int64_t last;
            if (!ref_valid(&a->shape, a->refs[i], &last) || last > p) {
                return LKV_EINVAL;
            }
        }
    }
    int64_t work = 0;
    for (int b = 0; b < a->batch; b++) {
        work += (int64_t)(a->ref_offset[b + 1] - a->ref_offset[b]) * a->shape.block_tokens;
    }
    work *= 4 * (int64_t)a->shape.n_q_heads * a->shape.head_dim;
    run_items(a, NULL, a->batch * a->shape.n_kv_heads, work);
    return 0;
}

int lkv_attn_prefill_cpu(const lkv_prefill_args *a)
{
    if (a == NULL || !shape_valid(&a->shape) || !pe_valid(a->pe, &a->shape) || a->layer < 0 ||
        a->layer >= a->shape.n_layers || a->n_new < 1 || a->new_start < 0 ||
        a->new_start + a->n_new - 1 > LKV_MAX_POSITION || a->q == NULL || a->k_new == NULL ||
        a->v_new == NULL || a->out == NULL || a->n_refs < 0 ||
        (a->n_refs > 0 && (a->refs == NULL || a->arena == NULL)) ||
        (a->flags & ~LKV_ATTN_NO_ROTATE) || a->page_bytes < lkv_block_bytes(&a->shape) ||
        !isfinite(a->sm_scale)) {
        return LKV_EINVAL;
    }
    for (int32_t i = 0; i < a->n_refs; i++) {
        int64_t last;
        if (!ref_valid(&a->shape, a->refs[i], &last) || last >= a->new_start) {
            return LKV_EINVAL;
        }
    }
    int chunks = (a->n_new + PREFILL_CHUNK - 1) / PREFILL_CHUNK;
    int64_t work = 4 * (int64_t)a->n_new * a->shape.n_q_heads * a->shape.head_dim *
                   ((int64_t)a->n_refs * a->shape.block_tokens + a->n_new);
    run_items(NULL, a, chunks * a->shape.n_kv_heads, work);
    return 0;
}

int lkv_materialise_cpu(const lkv_materialise_args *a)
{
    if (a == NULL || !shape_valid(&a->shape) || !pe_valid(a->pe, &a->shape) || a->n_blocks < 0 ||
        a->delta < 0 || a->delta > LKV_MAX_POSITION || a->page_bytes < lkv_block_bytes(&a->shape)) {
        return LKV_EINVAL;
    }
    if (a->n_blocks == 0) {
        return 0;
    }
    if (a->src_arena == NULL || a->dst_arena == NULL || a->src_pages == NULL ||
        a->dst_pages == NULL) {
        return LKV_EINVAL;
    }
    const lkv_kv_shape *s = &a->shape;
    const int D = s->head_dim, B = s->block_tokens;
    const size_t slab = lkv_slab_bytes(s);
    const int rotate = a->pe->kind == LKV_POSENC_ROPE;
    double cs[LKV_MAX_HEAD_DIM];
    float row[LKV_MAX_HEAD_DIM];
    if (rotate) {
        lkv_rope_table(a->pe, a->delta, cs);
    }
    for (int32_t i = 0; i < a->n_blocks; i++) {
        const char *src = (const char *)a->src_arena + (uint64_t)a->src_pages[i] * a->page_bytes;
        char *dst = (char *)a->dst_arena + (uint64_t)a->dst_pages[i] * a->page_bytes;
        for (int l = 0; l < s->n_layers; l++) {
            for (int h = 0; h < s->n_kv_heads; h++) {
                const char *ks = src + lkv_slab_offset(s, l, 0, h);
                char *kd = dst + lkv_slab_offset(s, l, 0, h);
                if (!rotate) {
                    memmove(kd, ks, slab);
                } else {
                    for (int t = 0; t < B; t++) {
                        for (int d = 0; d < D; d++) {
                            row[d] = lkv_load_elem(ks, s->dtype, (size_t)t * D + d);
                        }
                        lkv_rope_apply_f32(a->pe, cs, row, row);
                        for (int d = 0; d < D; d++) {
                            lkv_store_elem(kd, s->dtype, (size_t)t * D + d, row[d]);
                        }
                    }
                }
                memmove(dst + lkv_slab_offset(s, l, 1, h), src + lkv_slab_offset(s, l, 1, h), slab);
            }
        }
    }
    return 0;
}

void lkv_attn_merge_cpu(int n_rows, int head_dim, const float *out_a, const float *lse_a,
                        const float *out_b, const float *lse_b, float *out, float *lse)
{
    for (int r = 0; r < n_rows; r++) {
        double la = lse_a[r], lb = lse_b[r];
        double mx = la > lb ? la : lb;
        const float *oa = out_a + (size_t)r * head_dim, *ob = out_b + (size_t)r * head_dim;
        float *o = out + (size_t)r * head_dim;
        if (mx == -INFINITY) {
            memset(o, 0, (size_t)head_dim * sizeof(float));
            lse[r] = -INFINITY;
            continue;
        }
        double wa = exp(la - mx), wb = exp(lb - mx), sum = wa + wb;
        float fa = (float)(wa / sum), fb = (float)(wb / sum);
        for (int d = 0; d < head_dim; d++) {
            o[d] = fa * oa[d] + fb * ob[d];
        }
        lse[r] = (float)(mx + log(sum));
    }
}
