/*
 * test_attn.c: the LazyAttention CPU reference (decode, prefill, materialise, merge) against an
 * independent fp64 reference, on fresh random worlds each run (seed printed, LKV_TEST_SEED
 * replays one).
 *
 * A world: a random model shape (MHA/GQA/MQA, head dim 8..256, 1..3 layers, f32/f16/bf16
 * arena, 1..64 tokens per block, padded page stride), a random position encoding (RoPE
 * half/interleaved, partial rotary, linear and llama3 scaling, several bases, ALiBi, none), and
 * a pool of documents of random lengths (rarely a multiple of the block size) stored once, in
 * blocks, at document-local positions. The unused slots of partial blocks hold NaN, so reading
 * one poisons the result. Prompts place documents (a document may appear twice, or in several
 * sequences at different starts) at random offsets, sometimes just under LKV_MAX_POSITION; the
 * block references are sometimes shuffled (softmax is order-free; the query must be re-rotated
 * at each change of start).
 *
 * The fp64 reference (kt_ref_attend, tests/kernels/kt_ref.h: the one reference of the kernels)
 * places every key at its absolute position (stored key, widened exactly, rotated by its
 * document start with long double angles), rotates the query to its absolute position, adds
 * ALiBi biases, and runs a plain two-pass softmax.
 *
 * Checked per world: lazy decode and prefill == reference; materialise-then-attend (starts 0)
 * == reference; lazy == materialised; split-KV decode merged with lkv_attn_merge_cpu == whole
 * decode. The tolerances (below) are on attention outputs of unit-variance values, and on lse.
 */
#include "kt_ref.h"
#include "kt_rng.h"
#include "lkv_attn.h"
#include "lkv_half.h"
#include "lkv_log.h"
#include "lkv_posenc.h"
#include "lkv_test.h"

/* Tolerances (absolute, on attention outputs of unit-variance values; lse relative to 1+|lse|).
 * Both paths are checked tightly against an fp64 reference of exactly their own inputs: lazy
 * against the stored keys rotated in fp64, materialised against the materialised (already
 * rounded) keys. Only fp32 rounding separates them from fp64 (the rotated query, dot products of
 * up to 256 terms, accumulation over up to ~900 keys): measured max 6e-6 over 3600 worlds, so
 * TOL_LAZY = 3e-5 (5x). Lazy vs materialised additionally differ by the rounding of the
 * re-rotated keys to the arena dtype (f16: 2^-11, bf16: 2^-8 relative) times |score| (up to
 * ~12 here): measured max 5e-3 (f16) and 3.4e-2 (bf16), so the bounds below are 3x those and
 * are sanity bounds, not the precision claim. Split-KV merge vs whole: measured 3e-6. */
#define TOL_LAZY 3e-5
static const double TOL_MAT[3] = {3e-5, 1.5e-2, 1e-1};
#define TOL_MERGE 1e-5

#define MAX_DOCS  5
#define MAX_PLACE 6

typedef struct doc {
    int len;
    int n_blocks;
    uint32_t page0; /* Pages page0 .. page0 + n_blocks - 1. */
} doc;

typedef struct place {
    int doc;
    int64_t start;
} place;

typedef struct world {
    lkv_posenc_cfg cfg;
    lkv_posenc pe;
    lkv_kv_shape s;
    int layer;
    float sm_scale;
    double qscale; /* Query std: sets how peaked the softmax is. */
    uint64_t page_bytes;
    uint32_t n_pages;
    uint8_t *arena;
    int n_docs;
    doc docs[MAX_DOCS];
    const char *enc_name;
} world;

/* Measured maxima, reported at the end. */
static double max_lazy, max_lazy_lse, max_mat_ref, max_mat[3], max_merge;
static int n_worlds[3];

static void make_cfg(world *w, int enc)
{
    lkv_posenc_cfg c = {.kind = LKV_POSENC_ROPE, .rope_theta = 10000};
    int D = w->s.head_dim;
    switch (enc) {
    case 0:
        w->enc_name = "rope-half";
        break;
    case 1:
        w->enc_name = "rope-interleaved";
        c.rope_pairing = LKV_ROPE_INTERLEAVED;
        break;
    case 2:
        w->enc_name = "rope-half-partial";
        c.rotary_dim = 2 * (int)kt_int(1, D / 2);
        c.rope_theta = 1e6;
        break;
    case 3:
        w->enc_name = "rope-interleaved-partial";
        c.rope_pairing = LKV_ROPE_INTERLEAVED;
        c.rotary_dim = 2 * (int)kt_int(1, D / 2);
        c.rope_theta = 100;
        break;
    case 4:
        w->enc_name = "rope-linear";
        c.rope_theta = 500000;
        c.rope_scaling = LKV_ROPE_SCALING_LINEAR;
        c.scaling_factor = 4;
        break;
    case 5:
        w->enc_name = "rope-llama3";
        c.rope_theta = 500000;
        c.rope_scaling = LKV_ROPE_SCALING_LLAMA3;
        c.scaling_factor = 8;
        c.low_freq_factor = 1;
        c.high_freq_factor = 4;
        c.original_max_pos = 8192;
        break;
    case 6:
        w->enc_name = "rope-interleaved-llama3-partial";
        c.rope_pairing = LKV_ROPE_INTERLEAVED;
        c.rope_theta = 1e4 * (double)kt_int(1, 100);
        c.rotary_dim = D >= 16 ? D / 2 : 0;
        c.rope_scaling = LKV_ROPE_SCALING_LLAMA3;
        c.scaling_factor = 16;
        c.low_freq_factor = 2;
        c.high_freq_factor = 8;
        c.original_max_pos = 1024;
        break;
    case 7:
        w->enc_name = "alibi";
        c.kind = LKV_POSENC_ALIBI;
        break;
    case 8:
        w->enc_name = "none";
        c.kind = LKV_POSENC_NONE;
        break;
    default:
        w->enc_name = "rope-half-theta1";
        c.rope_theta = 1.0 + kt_unif(); /* every pair spins fast: the hardest angles */
        break;
    }
    w->cfg = c;
}

#define N_ENC 10

static void world_make(world *w, int idx)
{
    memset(w, 0, sizeof *w);
    int mode = idx % 3;
    if (mode == 0) { /* MHA */
        w->s.n_kv_heads = (int)kt_int(1, 6);
        w->s.n_q_heads = w->s.n_kv_heads;
    } else if (mode == 1) { /* GQA */
        w->s.n_kv_heads = (int)kt_int(2, 4);
        w->s.n_q_heads = w->s.n_kv_heads * (int)kt_int(2, 4);
    } else { /* MQA */
        w->s.n_kv_heads = 1;
        w->s.n_q_heads = (int)kt_int(2, 12);
    }
    static const int dims[] = {8, 16, 24, 64, 72, 128, 256};
    w->s.head_dim = idx % 4 == 0 ? 8 * (int)kt_int(1, 32) : dims[kt_int(0, 6)];
    w->s.dtype = idx % 3 == 0 ? (int)kt_int(0, 2) : (idx / 3) % 3;
    static const int bts[] = {1, 2, 3, 7, 16, 16, 31, 64};
    w->s.block_tokens = kt_int(0, 3) == 0 ? (int)kt_int(1, 64) : bts[kt_int(0, 7)];
    w->s.n_layers = (int)kt_int(1, 3);
    w->layer = (int)kt_int(0, w->s.n_layers - 1);
    w->sm_scale = (float)(1.0 / sqrt((double)w->s.head_dim));
    w->qscale = 0.5 + 2.5 * kt_unif();
    make_cfg(w, idx % N_ENC);
    ASSERT_OK(lkv_posenc_init(&w->pe, &w->cfg, w->s.head_dim, w->s.n_q_heads));
    w->page_bytes = lkv_block_bytes(&w->s) + 2 * (uint64_t)kt_int(0, 5);

    const int B = w->s.block_tokens, D = w->s.head_dim;
    w->n_docs = (int)kt_int(1, MAX_DOCS);
    int max_len = B == 1 ? 60 : 150;
    for (int i = 0; i < w->n_docs; i++) {
        doc *d = &w->docs[i];
        d->len = (int)kt_int(1, max_len);
        d->n_blocks = (d->len + B - 1) / B;
        d->page0 = w->n_pages;
        w->n_pages += (uint32_t)d->n_blocks + (uint32_t)kt_int(0, 2); /* holes */
    }
    w->arena = lkv_xcalloc(w->n_pages, w->page_bytes);
    for (int i = 0; i < w->n_docs; i++) {
        doc *d = &w->docs[i];
        for (int b = 0; b < d->n_blocks; b++) {
            uint8_t *blk = w->arena + (d->page0 + b) * w->page_bytes;
            int valid = d->len - b * B < B ? d->len - b * B : B;
            for (int l = 0; l < w->s.n_layers; l++) {
                for (int kv = 0; kv < 2; kv++) {
                    for (int h = 0; h < w->s.n_kv_heads; h++) {
                        uint8_t *slab = blk + lkv_slab_offset(&w->s, l, kv, h);
                        for (int t = 0; t < B; t++) {
                            for (int e = 0; e < D; e++) {
                                float x = t < valid ? (float)kt_normal() : NAN;
                                lkv_store_elem(slab, w->s.dtype, (size_t)t * D + e, x);
                            }
                        }
                    }
                }
            }
        }
    }
}

static void world_free(world *w)
{
    free(w->arena);
}

/* Places n_pl documents (random choice, order, repeats) consecutively with small gaps; returns
 * the position after the last key. */
static int64_t place_docs(const world *w, place *pl, int n_pl, int64_t room)
{
    int64_t total = 0;
    for (int i = 0; i < n_pl; i++) {
        pl[i].doc = (int)kt_int(0, w->n_docs - 1);
        total += w->docs[pl[i].doc].len + 3;
    }
    int64_t hi = LKV_MAX_POSITION - total - room;
    int r = (int)kt_int(0, 2);
    int64_t pos = r == 0 ? hi - kt_int(0, 50) : r == 1 ? kt_int(0, 3000) : kt_int(0, hi);
    for (int i = 0; i < n_pl; i++) {
        pos += kt_int(0, 3) == 0 ? kt_int(1, 3) : 0;
        pl[i].start = pos;
        pos += w->docs[pl[i].doc].len;
    }
    return pos;
}

/* Appends the references of the placed documents to refs; shuffles them sometimes. When
 * mat_pages is not NULL, references point at materialised copies instead: page numbers from
 * *mat_next on, and (RoPE) start 0. Returns the count. */
static int make_refs(const world *w, const place *pl, int n_pl, uint64_t *refs, int shuffle,
                     uint32_t *mat_next)
{
    int n = 0;
    const int B = w->s.block_tokens;
    for (int i = 0; i < n_pl; i++) {
        const doc *d = &w->docs[pl[i].doc];
        for (int b = 0; b < d->n_blocks; b++) {
            int valid = d->len - b * B < B ? d->len - b * B : B;
            uint32_t page = d->page0 + (uint32_t)b;
            uint32_t start = (uint32_t)pl[i].start;
            if (mat_next != NULL) {
                page = (*mat_next)++;
                if (w->cfg.kind == LKV_POSENC_ROPE) {
                    start = 0;
                }
            }
            ASSERT_OK(lkv_ref_pack_checked(page, start, (uint32_t)b, (uint32_t)valid, &refs[n]));
            n++;
        }
    }
    if (shuffle) {
        for (int i = n - 1; i > 0; i--) {
            int j = (int)kt_int(0, i);
            uint64_t t = refs[i];
            refs[i] = refs[j];
            refs[j] = t;
        }
    }
    return n;
}

/* Pages of each placement's block 0: in the world's arena, or (mat) in the materialised copy
 * (consecutive, in placement order, from *next on). */
static void page_starts(const world *w, const place *pl, int n_pl, int mat, uint32_t *next,
                        uint32_t *page0)
{
    for (int i = 0; i < n_pl; i++) {
        if (mat) {
            page0[i] = *next;
            *next += (uint32_t)w->docs[pl[i].doc].n_blocks;
        } else {
            page0[i] = w->docs[pl[i].doc].page0;
        }
    }
}

/* Materialises the placed documents into dst (pages from *next on, same order as make_refs
 * with mat_next). */
static void materialise(const world *w, const place *pl, int n_pl, uint8_t *dst, uint32_t *next)
{
    for (int i = 0; i < n_pl; i++) {
        const doc *d = &w->docs[pl[i].doc];
        uint32_t src_pages[4096], dst_pages[4096];
        for (int b = 0; b < d->n_blocks; b++) {
            src_pages[b] = d->page0 + (uint32_t)b;
            dst_pages[b] = (*next)++;
        }
        lkv_materialise_args m = {.shape = w->s,
                                  .pe = &w->pe,
                                  .src_arena = w->arena,
                                  .dst_arena = dst,
                                  .page_bytes = w->page_bytes,
                                  .src_pages = src_pages,
                                  .dst_pages = dst_pages,
                                  .n_blocks = d->n_blocks,
                                  .delta = pl[i].start};
        ASSERT_OK(lkv_materialise_cpu(&m));
    }
}

/* The fp64 reference (kt_ref_attend in kt_ref.h) of n_tok query tokens at pos0 + t over the
 * placed documents, plus (n_new > 0) new tokens at pos0 .. (k_new rotated at local positions,
 * causal). out [n_tok][Hq][D]. This function only gathers the keys: placement i's blocks are
 * pages page0[i] .. of arena, each key widened exactly from the arena dtype; keys_absolute:
 * they were materialised (already rotated to their absolute positions), else they are stored at
 * local positions and kt_ref_attend rotates them by their document start. */
static void reference(const world *w, const place *pl, int n_pl, const uint8_t *arena,
                      const uint32_t *page0, int keys_absolute, const float *q, int n_tok,
                      int64_t pos0, const float *k_new, const float *v_new, int n_new, double *out,
                      double *lse)
{
    const int D = w->s.head_dim, Hkv = w->s.n_kv_heads, B = w->s.block_tokens;
    int n_keys = n_new;
    for (int i = 0; i < n_pl; i++) {
        n_keys += w->docs[pl[i].doc].len;
    }
    double *K = lkv_xmalloc(((size_t)Hkv * n_keys * D + 1) * sizeof(double));
    double *V = lkv_xmalloc(((size_t)Hkv * n_keys * D + 1) * sizeof(double));
    int64_t *P = lkv_xmalloc(((size_t)n_keys + 1) * sizeof(int64_t));
    int64_t *R = lkv_xmalloc(((size_t)n_keys + 1) * sizeof(int64_t));
    int64_t *qp = lkv_xmalloc(((size_t)n_tok + 1) * sizeof(int64_t));
    int k = 0;
    for (int i = 0; i <= n_pl; i++) {
        int len = i < n_pl ? w->docs[pl[i].doc].len : n_new;
        int64_t start = i < n_pl ? pl[i].start : pos0;
        for (int j = 0; j < len; j++, k++) {
            P[k] = start + j;
            R[k] = keys_absolute && i < n_pl ? 0 : start;
            for (int h = 0; h < Hkv; h++) {
                double *kk = K + ((size_t)h * n_keys + k) * D,
                       *vv = V + ((size_t)h * n_keys + k) * D;
                if (i < n_pl) {
                    const uint8_t *blk = arena + (page0[i] + (uint32_t)(j / B)) * w->page_bytes;
                    const uint8_t *ks = blk + lkv_slab_offset(&w->s, w->layer, 0, h);
                    const uint8_t *vs = blk + lkv_slab_offset(&w->s, w->layer, 1, h);
                    for (int e = 0; e < D; e++) {
                        kk[e] = lkv_load_elem(ks, w->s.dtype, (size_t)(j % B) * D + e);
                        vv[e] = lkv_load_elem(vs, w->s.dtype, (size_t)(j % B) * D + e);
                    }
                } else {
                    for (int e = 0; e < D; e++) {
                        kk[e] = k_new[((size_t)j * Hkv + h) * D + e];
                        vv[e] = v_new[((size_t)j * Hkv + h) * D + e];
                    }
                }
            }
        }
    }
    for (int t = 0; t < n_tok; t++) {
        qp[t] = pos0 + t;
    }
    kt_ref_problem pr = {&w->cfg, w->s.n_q_heads, Hkv, D, w->sm_scale, n_keys, K, V, P,
                         R,       n_tok,          q,   qp};
    kt_ref_attend(&pr, out, lse);
    free(K);
    free(V);
    free(P);
    free(R);
    free(qp);
}

static double max_err_f(const float *a, const double *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= m)) { /* NaN propagates as infinity */
            m = isnan(e) ? INFINITY : e;
        }
    }
    return m;
}

static double max_err_ff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= m)) {
            m = isnan(e) ? INFINITY : e;
        }
    }
    return m;
}

static void check(const char *what, const world *w, double err, double tol, double *maxv)
{
    if (err > *maxv) {
        *maxv = err;
    }
    if (!(err <= tol)) {
        LKV_FAIL("%s: error %.3g > tol %.3g (%s, Hq %d Hkv %d D %d dtype %d B %d layers %d)", what,
                 err, tol, w->enc_name, w->s.n_q_heads, w->s.n_kv_heads, w->s.head_dim, w->s.dtype,
                 w->s.block_tokens, w->s.n_layers);
    }
}

/* Materialised RoPE keys carry one extra rounding to the arena dtype; for ALiBi and none,
 * materialise is a copy and only fp32 rounding differs. */
static double mat_tol(const world *w)
{
    return w->cfg.kind == LKV_POSENC_ROPE ? TOL_MAT[w->s.dtype] : TOL_LAZY;
}

static void fill_normal(float *x, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(scale * kt_normal());
    }
}

/* Decode: a batch of sequences over shared documents at their own offsets. */
static void run_decode(world *w)
{
    const int D = w->s.head_dim, Hq = w->s.n_q_heads;
    int batch = (int)kt_int(1, 3);
    place pl[3][MAX_PLACE];
    int n_pl[3];
    int64_t qpos[3];
    int32_t off[4] = {0}, moff[4] = {0};
    uint64_t *refs = lkv_xmalloc(3 * MAX_PLACE * 4096 * sizeof(uint64_t));
    uint64_t *mrefs = lkv_xmalloc(3 * MAX_PLACE * 4096 * sizeof(uint64_t));
    uint32_t mat_pages = 0;
    for (int b = 0; b < batch; b++) {
        n_pl[b] = (int)kt_int(b == 0 ? 1 : 0, MAX_PLACE); /* an empty sequence sometimes */
        int64_t end = place_docs(w, pl[b], n_pl[b], 10);
        qpos[b] = end - 1 + kt_int(n_pl[b] == 0 ? 1 : 0, 5);
        off[b + 1] = off[b] + make_refs(w, pl[b], n_pl[b], refs + off[b], 0, NULL);
        for (int i = 0; i < n_pl[b]; i++) {
            mat_pages += (uint32_t)w->docs[pl[b][i].doc].n_blocks;
        }
    }
    uint8_t *dst = lkv_xcalloc(mat_pages + 1, w->page_bytes);
    uint32_t next = 0, next2 = 0;
    for (int b = 0; b < batch; b++) {
        materialise(w, pl[b], n_pl[b], dst, &next);
        moff[b + 1] =
            moff[b] + make_refs(w, pl[b], n_pl[b], mrefs + moff[b], kt_int(0, 2) == 0, &next2);
        if (kt_int(0, 2) == 0) { /* shuffle the lazy refs of this sequence */
            for (int i = off[b + 1] - 1; i > off[b]; i--) {
                int j = (int)kt_int(off[b], i);
                uint64_t t = refs[i];
                refs[i] = refs[j];
                refs[j] = t;
            }
        }
    }
    size_t nq = (size_t)batch * Hq * D;
    float *q = lkv_xmalloc(nq * sizeof(float)), *out = lkv_xmalloc(nq * sizeof(float));
    float *mout = lkv_xmalloc(nq * sizeof(float)), *lse = lkv_xmalloc(batch * Hq * sizeof(float));
    float *mlse = lkv_xmalloc(batch * Hq * sizeof(float));
    double *ref = lkv_xmalloc(nq * sizeof(double)),
           *rlse = lkv_xmalloc(batch * Hq * sizeof(double));
    double *mref = lkv_xmalloc(nq * sizeof(double));
    fill_normal(q, nq, w->qscale);
    lkv_decode_args a = {.shape = w->s,
                         .pe = &w->pe,
                         .layer = w->layer,
                         .batch = batch,
                         .q = q,
                         .q_pos = qpos,
                         .arena = w->arena,
                         .page_bytes = w->page_bytes,
                         .refs = refs,
                         .ref_offset = off,
                         .sm_scale = w->sm_scale,
                         .out = out,
                         .lse = lse};
    ASSERT_OK(lkv_attn_decode_cpu(&a));
    lkv_decode_args m = a;
    m.arena = dst;
    m.refs = mrefs;
    m.ref_offset = moff;
    m.out = mout;
    m.lse = mlse;
    ASSERT_OK(lkv_attn_decode_cpu(&m));
    uint32_t pg[MAX_PLACE], mnext = 0;
    for (int b = 0; b < batch; b++) {
        page_starts(w, pl[b], n_pl[b], 1, &mnext, pg);
        reference(w, pl[b], n_pl[b], dst, pg, 1, q + (size_t)b * Hq * D, 1, qpos[b], NULL, NULL, 0,
                  mref + (size_t)b * Hq * D, NULL);
        page_starts(w, pl[b], n_pl[b], 0, NULL, pg);
        reference(w, pl[b], n_pl[b], w->arena, pg, 0, q + (size_t)b * Hq * D, 1, qpos[b], NULL,
                  NULL, 0, ref + (size_t)b * Hq * D, rlse + (size_t)b * Hq);
        if (n_pl[b] == 0) {
            for (int h = 0; h < Hq; h++) {
                ASSERT_TRUE(lse[b * Hq + h] == -INFINITY);
                rlse[b * Hq + h] = -INFINITY;
            }
        }
    }
    check("decode lazy vs fp64", w, max_err_f(out, ref, nq), TOL_LAZY, &max_lazy);
    for (int i = 0; i < batch * Hq; i++) {
        double e =
            rlse[i] == -INFINITY ? (lse[i] == -INFINITY ? 0 : INFINITY) : fabs(lse[i] - rlse[i]);
        check("decode lse vs fp64", w, e, TOL_LAZY * (1 + fabs(rlse[i])), &max_lazy_lse);
    }
    check("decode materialised vs fp64", w, max_err_f(mout, mref, nq), TOL_LAZY, &max_mat_ref);
    check("decode lazy vs materialised", w, max_err_ff(out, mout, nq), mat_tol(w),
          &max_mat[w->s.dtype]);

    /* Split-KV: each sequence's refs in two parts, merged by lse == whole. */
    int32_t o1[4] = {0}, o2[4] = {0};
    uint64_t *r1 = lkv_xmalloc(((size_t)off[batch] + 1) * sizeof(uint64_t));
    uint64_t *r2 = lkv_xmalloc(((size_t)off[batch] + 1) * sizeof(uint64_t));
    for (int b = 0; b < batch; b++) {
        int n = off[b + 1] - off[b], cut = n ? (int)kt_int(0, n) : 0;
        memcpy(r1 + o1[b], refs + off[b], (size_t)cut * sizeof(uint64_t));
        memcpy(r2 + o2[b], refs + off[b] + cut, (size_t)(n - cut) * sizeof(uint64_t));
        o1[b + 1] = o1[b] + cut;
        o2[b + 1] = o2[b] + n - cut;
    }
    float *out1 = lkv_xmalloc(nq * sizeof(float)), *lse1 = lkv_xmalloc(batch * Hq * sizeof(float));
    a.refs = r1;
    a.ref_offset = o1;
    a.lse = lse1;
    a.out = out1;
    ASSERT_OK(lkv_attn_decode_cpu(&a));
    a.refs = r2;
    a.ref_offset = o2;
    a.lse = mlse;
    a.out = mout;
    ASSERT_OK(lkv_attn_decode_cpu(&a));
    lkv_attn_merge_cpu(batch * Hq, D, out1, lse1, mout, mlse, out1, lse1);
    check("decode split+merge vs whole", w, max_err_ff(out1, out, nq), TOL_MERGE, &max_merge);
    for (int i = 0; i < batch * Hq; i++) {
        ASSERT_TRUE(lse1[i] == lse[i] || fabs(lse1[i] - lse[i]) <= 1e-5 * (1 + fabs(lse[i])));
    }
    free(r1);
    free(r2);
    free(out1);
    free(lse1);
    free(q);
    free(out);
    free(mout);
    free(lse);
    free(mlse);
    free(ref);
    free(mref);
    free(rlse);
    free(refs);
    free(mrefs);
    free(dst);
}

/* Prefill: new tokens after placed documents. */
static void run_prefill(world *w)
{
    const int D = w->s.head_dim, Hq = w->s.n_q_heads, Hkv = w->s.n_kv_heads;
    place pl[MAX_PLACE];
    int n_pl = (int)kt_int(0, MAX_PLACE);
    /* Mostly short; sometimes several PREFILL_CHUNKs (64 tokens) of new tokens. */
    int n_new = kt_int(0, 7) == 0 ? (int)kt_int(65, 140) : (int)kt_int(1, 24);
    int64_t end = place_docs(w, pl, n_pl, n_new + 10);
    int64_t new_start = end + (kt_int(0, 3) == 0 ? kt_int(1, 5) : 0);
    uint64_t *refs = lkv_xmalloc(MAX_PLACE * 4096 * sizeof(uint64_t));
    uint64_t *mrefs = lkv_xmalloc(MAX_PLACE * 4096 * sizeof(uint64_t));
    int n_refs = make_refs(w, pl, n_pl, refs, kt_int(0, 2) == 0, NULL);
    uint32_t mat_pages = 0, next = 0, next2 = 0;
    for (int i = 0; i < n_pl; i++) {
        mat_pages += (uint32_t)w->docs[pl[i].doc].n_blocks;
    }
    uint8_t *dst = lkv_xcalloc(mat_pages + 1, w->page_bytes);
    materialise(w, pl, n_pl, dst, &next);
    int n_mrefs = make_refs(w, pl, n_pl, mrefs, kt_int(0, 2) == 0, &next2);
    size_t nq = (size_t)n_new * Hq * D, nk = (size_t)n_new * Hkv * D;
    float *q = lkv_xmalloc(nq * sizeof(float)), *kn = lkv_xmalloc(nk * sizeof(float));
    float *vn = lkv_xmalloc(nk * sizeof(float)), *out = lkv_xmalloc(nq * sizeof(float));
    float *mout = lkv_xmalloc(nq * sizeof(float));
    double *ref = lkv_xmalloc(nq * sizeof(double));
    fill_normal(q, nq, w->qscale);
    fill_normal(kn, nk, 1.0);
    fill_normal(vn, nk, 1.0);
    lkv_prefill_args a = {.shape = w->s,
                          .pe = &w->pe,
                          .layer = w->layer,
                          .n_new = n_new,
                          .new_start = new_start,
                          .q = q,
                          .k_new = kn,
                          .v_new = vn,
                          .arena = w->arena,
                          .page_bytes = w->page_bytes,
                          .refs = refs,
                          .n_refs = n_refs,
                          .sm_scale = w->sm_scale,
                          .out = out};
    ASSERT_OK(lkv_attn_prefill_cpu(&a));
    lkv_prefill_args m = a;
    m.arena = dst;
    m.refs = mrefs;
    m.n_refs = n_mrefs;
    m.out = mout;
    ASSERT_OK(lkv_attn_prefill_cpu(&m));
    uint32_t pg[MAX_PLACE], mnext = 0;
    page_starts(w, pl, n_pl, 0, NULL, pg);
    reference(w, pl, n_pl, w->arena, pg, 0, q, n_new, new_start, kn, vn, n_new, ref, NULL);
    check("prefill lazy vs fp64", w, max_err_f(out, ref, nq), TOL_LAZY, &max_lazy);
    page_starts(w, pl, n_pl, 1, &mnext, pg);
    reference(w, pl, n_pl, dst, pg, 1, q, n_new, new_start, kn, vn, n_new, ref, NULL);
    check("prefill materialised vs fp64", w, max_err_f(mout, ref, nq), TOL_LAZY, &max_mat_ref);
    check("prefill lazy vs materialised", w, max_err_ff(out, mout, nq), mat_tol(w),
          &max_mat[w->s.dtype]);
    free(q);
    free(kn);
    free(vn);
    free(out);
    free(mout);
    free(ref);
    free(refs);
    free(mrefs);
    free(dst);
}

static void test_random_worlds(void)
{
    /* ~2 s of CPU when optimised; sanitizer and -O0 builds run fewer worlds (override with
     * LKV_TEST_WORLDS). */
#if defined(__SANITIZE_ADDRESS__) || !defined(__OPTIMIZE__)
    int n = 16;
#else
    int n = 64;
#endif
    const char *env = getenv("LKV_TEST_WORLDS");
    if (env != NULL) {
        n = atoi(env);
    }
    for (int i = 0; i < n; i++) {
        world w;
        world_make(&w, i);
        n_worlds[w.s.dtype]++;
        run_decode(&w);
        run_prefill(&w);
        world_free(&w);
    }
    fprintf(stderr,
            "   %d worlds (f32 %d, f16 %d, bf16 %d); max errors vs fp64: lazy %.3g, lazy lse %.3g, "
            "materialised %.3g (tol %.2g); lazy vs materialised: f32 %.3g f16 %.3g bf16 %.3g "
            "(tol %.2g %.2g %.2g); split+merge vs whole %.3g (tol %.2g)\n",
            n, n_worlds[0], n_worlds[1], n_worlds[2], max_lazy, max_lazy_lse, max_mat_ref, TOL_LAZY,
            max_mat[0], max_mat[1], max_mat[2], TOL_MAT[0], TOL_MAT[1], TOL_MAT[2], max_merge,
            TOL_MERGE);
}

/* A small valid setup for the rejection tests: 2 layers, 4/2 heads, D 16, B 4, f16; one
 * document of 10 tokens (3 blocks) at start 100. */
typedef struct small {
    lkv_kv_shape s;
    lkv_posenc pe;
    uint8_t *arena;
    uint64_t refs[3];
    int32_t off[2];
    int64_t qpos[1];
    float q[4 * 16 * 8], k[2 * 16 * 8], v[2 * 16 * 8], out[4 * 16 * 8], lse[4 * 8];
} small;

static void small_make(small *x)
{
    memset(x, 0, sizeof *x);
    x->s = (lkv_kv_shape){.n_layers = 2,
                          .n_q_heads = 4,
                          .n_kv_heads = 2,
                          .head_dim = 16,
                          .dtype = LKV_DTYPE_F16,
                          .block_tokens = 4};
    lkv_posenc_cfg c = {.kind = LKV_POSENC_ROPE, .rope_theta = 10000};
    ASSERT_OK(lkv_posenc_init(&x->pe, &c, 16, 4));
    x->arena = lkv_xcalloc(3, lkv_block_bytes(&x->s));
    for (int b = 0; b < 3; b++) {
        x->refs[b] = lkv_ref_pack((uint32_t)b, 100, (uint32_t)b, b == 2 ? 2 : 4);
    }
    x->off[1] = 3;
    x->qpos[0] = 110;
    fill_normal(x->q, 4 * 16 * 8, 1.0);
    fill_normal(x->k, 2 * 16 * 8, 1.0);
    fill_normal(x->v, 2 * 16 * 8, 1.0);
}

static lkv_decode_args small_decode(small *x)
{
    return (lkv_decode_args){.shape = x->s,
                             .pe = &x->pe,
                             .layer = 1,
                             .batch = 1,
                             .q = x->q,
                             .q_pos = x->qpos,
                             .arena = x->arena,
                             .page_bytes = lkv_block_bytes(&x->s),
                             .refs = x->refs,
                             .ref_offset = x->off,
                             .sm_scale = 0.25f,
                             .out = x->out,
                             .lse = x->lse};
}

static lkv_prefill_args small_prefill(small *x)
{
    return (lkv_prefill_args){.shape = x->s,
                              .pe = &x->pe,
                              .layer = 1,
                              .n_new = 8,
                              .new_start = 110,
                              .q = x->q,
                              .k_new = x->k,
                              .v_new = x->v,
                              .arena = x->arena,
                              .page_bytes = lkv_block_bytes(&x->s),
                              .refs = x->refs,
                              .n_refs = 3,
                              .sm_scale = 0.25f,
                              .out = x->out};
}

static void test_invalid(void)
{
    small x;
    small_make(&x);
    lkv_decode_args d = small_decode(&x);
    ASSERT_OK(lkv_attn_decode_cpu(&d));
    lkv_prefill_args p = small_prefill(&x);
    ASSERT_OK(lkv_attn_prefill_cpu(&p));
    ASSERT_ERR(lkv_attn_decode_cpu(NULL), LKV_EINVAL);
    ASSERT_ERR(lkv_attn_prefill_cpu(NULL), LKV_EINVAL);
    ASSERT_ERR(lkv_materialise_cpu(NULL), LKV_EINVAL);

    /* Bad shapes, for all three calls. */
    for (int k = 0; k < 12; k++) {
        lkv_kv_shape s = x.s;
        switch (k) {
        case 0:
            s.n_layers = 0;
            break;
        case 1:
            s.n_q_heads = 3;
            break; /* not a multiple of n_kv_heads */
        case 2:
            s.n_kv_heads = 0;
            break;
        case 3:
            s.head_dim = 12;
            break;
        case 4:
            s.head_dim = 264;
            break;
        case 5:
            s.dtype = 3;
            break;
        case 6:
            s.block_tokens = 0;
            break;
        case 7:
            s.block_tokens = 65;
            break;
        case 8:
            s.n_q_heads = LKV_MAX_Q_HEADS * 2;
            s.n_kv_heads = 2;
            break;
        case 9:
            s.head_dim = 0;
            break;
        case 10:
            s.n_q_heads = 0;
            break;
        default:
            s.dtype = -1;
            break;
        }
        d = small_decode(&x);
        d.shape = s;
        ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
        p = small_prefill(&x);
        p.shape = s;
        ASSERT_ERR(lkv_attn_prefill_cpu(&p), LKV_EINVAL);
        uint32_t pg = 0;
        lkv_materialise_args m = {.shape = s,
                                  .pe = &x.pe,
                                  .src_arena = x.arena,
                                  .dst_arena = x.arena,
                                  .page_bytes = lkv_block_bytes(&x.s),
                                  .src_pages = &pg,
                                  .dst_pages = &pg,
                                  .n_blocks = 1,
                                  .delta = 5};
        ASSERT_ERR(lkv_materialise_cpu(&m), LKV_EINVAL);
    }

    /* Decode: bad arguments. */
    d = small_decode(&x);
    d.layer = 2;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    d = small_decode(&x);
    d.layer = -1;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    d = small_decode(&x);
    d.page_bytes = lkv_block_bytes(&x.s) - 1;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    d = small_decode(&x);
    d.flags = 2;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    d = small_decode(&x);
    d.pe = NULL;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    lkv_posenc other;
    lkv_posenc_cfg oc = {.kind = LKV_POSENC_ROPE, .rope_theta = 10000};
    ASSERT_OK(lkv_posenc_init(&other, &oc, 32, 4)); /* built for another head dim */
    d.pe = &other;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    lkv_posenc_cfg ac = {.kind = LKV_POSENC_ALIBI};
    ASSERT_OK(lkv_posenc_init(&other, &ac, 16, 2)); /* ALiBi slopes for too few heads */
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    d = small_decode(&x);
    d.batch = -1;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    d = small_decode(&x);
    d.q = NULL;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    d = small_decode(&x);
    d.sm_scale = NAN;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    /* Positions: the query at or past the last key is fine; before it, or past the maximum,
     * or negative, is not. */
    d = small_decode(&x);
    x.qpos[0] = 109; /* last key at 100 + 2*4 + 1 = 109 */
    ASSERT_OK(lkv_attn_decode_cpu(&d));
    x.qpos[0] = 108;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    x.qpos[0] = (int64_t)LKV_MAX_POSITION + 1;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    x.qpos[0] = -1;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    x.qpos[0] = LKV_MAX_POSITION;
    ASSERT_OK(lkv_attn_decode_cpu(&d));
    x.qpos[0] = 110;
    /* A reference with more valid tokens than the block holds. */
    uint64_t saved = x.refs[2];
    x.refs[2] = lkv_ref_pack(2, 100, 2, 5);
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    x.refs[2] = saved;
    /* Bad ref_offset: decreasing, or negative. */
    x.off[0] = 2;
    x.off[1] = 1;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    x.off[0] = -1;
    x.off[1] = 3;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    x.off[0] = 0;
    d.refs = NULL;
    ASSERT_ERR(lkv_attn_decode_cpu(&d), LKV_EINVAL);
    d = small_decode(&x);
    d.batch = 0; /* nothing to do */
    d.q = NULL;
    ASSERT_OK(lkv_attn_decode_cpu(&d));

    /* Prefill: bad arguments. */
    p = small_prefill(&x);
    p.n_new = 0;
    ASSERT_ERR(lkv_attn_prefill_cpu(&p), LKV_EINVAL);
    p = small_prefill(&x);
    p.new_start = 109; /* the document's last key is at 109: not before the new tokens */
    ASSERT_ERR(lkv_attn_prefill_cpu(&p), LKV_EINVAL);
    p = small_prefill(&x);
    p.new_start = LKV_MAX_POSITION - 6; /* last new token past the maximum */
    ASSERT_ERR(lkv_attn_prefill_cpu(&p), LKV_EINVAL);
    p.new_start = LKV_MAX_POSITION - 7;
    ASSERT_OK(lkv_attn_prefill_cpu(&p));
    p = small_prefill(&x);
    p.k_new = NULL;
    ASSERT_ERR(lkv_attn_prefill_cpu(&p), LKV_EINVAL);
    p = small_prefill(&x);
    p.n_refs = -1;
    ASSERT_ERR(lkv_attn_prefill_cpu(&p), LKV_EINVAL);
    p = small_prefill(&x);
    p.refs = NULL;
    ASSERT_ERR(lkv_attn_prefill_cpu(&p), LKV_EINVAL);
    p = small_prefill(&x);
    p.flags = 0x80;
    ASSERT_ERR(lkv_attn_prefill_cpu(&p), LKV_EINVAL);
    p = small_prefill(&x);
    p.layer = 5;
    ASSERT_ERR(lkv_attn_prefill_cpu(&p), LKV_EINVAL);

    /* Materialise: bad delta, count, pointers. */
    uint32_t src = 0, dst = 1;
    lkv_materialise_args m = {.shape = x.s,
                              .pe = &x.pe,
                              .src_arena = x.arena,
                              .dst_arena = x.arena,
                              .page_bytes = lkv_block_bytes(&x.s),
                              .src_pages = &src,
                              .dst_pages = &dst,
                              .n_blocks = 1,
                              .delta = 5};
    ASSERT_OK(lkv_materialise_cpu(&m));
    m.delta = -1;
    ASSERT_ERR(lkv_materialise_cpu(&m), LKV_EINVAL);
    m.delta = (int64_t)LKV_MAX_POSITION + 1;
    ASSERT_ERR(lkv_materialise_cpu(&m), LKV_EINVAL);
    m.delta = 5;
    m.n_blocks = -1;
    ASSERT_ERR(lkv_materialise_cpu(&m), LKV_EINVAL);
    m.n_blocks = 1;
    m.dst_pages = NULL;
    ASSERT_ERR(lkv_materialise_cpu(&m), LKV_EINVAL);
    m.dst_pages = &dst;
    m.page_bytes = 8;
    ASSERT_ERR(lkv_materialise_cpu(&m), LKV_EINVAL);
    free(x.arena);
}

/* NO_ROTATE skips only the query rotation: with RoPE it equals the same call with no position
 * encoding at all, and differs from the rotated result. */
static void test_no_rotate(void)
{
    small x;
    small_make(&x);
    for (size_t i = 0; i < 3 * lkv_block_bytes(&x.s) / 2; i++) {
        ((uint16_t *)x.arena)[i] = lkv_f32_to_f16((float)kt_normal());
    }
    float out1[4 * 16], out2[4 * 16], out3[4 * 16];
    lkv_decode_args d = small_decode(&x);
    d.flags = LKV_ATTN_NO_ROTATE;
    d.out = out1;
    ASSERT_OK(lkv_attn_decode_cpu(&d));
    lkv_posenc none;
    lkv_posenc_cfg c = {.kind = LKV_POSENC_NONE};
    ASSERT_OK(lkv_posenc_init(&none, &c, 16, 4));
    d.flags = 0;
    d.pe = &none;
    d.out = out2;
    ASSERT_OK(lkv_attn_decode_cpu(&d));
    d.pe = &x.pe;
    d.out = out3;
    ASSERT_OK(lkv_attn_decode_cpu(&d));
    ASSERT_TRUE(memcmp(out1, out2, sizeof out1) == 0);
    ASSERT_TRUE(max_err_ff(out1, out3, 4 * 16) > 1e-3);
    free(x.arena);
}

/* Thread counts: 1, 3 and all CPUs give bitwise identical results, on calls big enough to be
 * split (two documents of 100 blocks of 16 tokens, 8/2 heads, D 64, bf16; half that in slow
 * builds). */
static void test_threads(void)
{
    lkv_kv_shape s = {.n_layers = 1,
                      .n_q_heads = 8,
                      .n_kv_heads = 2,
                      .head_dim = 64,
                      .dtype = LKV_DTYPE_BF16,
                      .block_tokens = 16};
    lkv_posenc pe;
    lkv_posenc_cfg c = {.kind = LKV_POSENC_ROPE, .rope_theta = 10000};
    ASSERT_OK(lkv_posenc_init(&pe, &c, 64, 8));
#if defined(__SANITIZE_ADDRESS__) || !defined(__OPTIMIZE__)
    const int nbd = 50, nn = 70;
#else
    const int nbd = 100, nn = 130;
#endif
    const int nb = 2 * nbd, HD = 8 * 64;
    size_t bb = lkv_block_bytes(&s);
    uint8_t *arena = lkv_xmalloc(nb * bb);
    for (size_t i = 0; i < nb * bb / 2; i++) {
        uint16_t h = lkv_f32_to_bf16((float)kt_normal());
        memcpy(arena + 2 * i, &h, 2);
    }
    uint64_t refs[200];
    for (int b = 0; b < nb; b++) { /* two documents */
        refs[b] =
            lkv_ref_pack((uint32_t)b, b < nbd ? 0 : (uint32_t)nbd * 16, (uint32_t)(b % nbd), 16);
    }
    float *q = lkv_xmalloc((size_t)nn * HD * sizeof(float));
    float *k = lkv_xmalloc((size_t)nn * 2 * 64 * sizeof(float));
    float *v = lkv_xmalloc((size_t)nn * 2 * 64 * sizeof(float));
    float *out[3], lse[3][4 * 8];
    fill_normal(q, (size_t)nn * HD, 1.0);
    fill_normal(k, (size_t)nn * 128, 1.0);
    fill_normal(v, (size_t)nn * 128, 1.0);
    int64_t qpos[4] = {nb * 16, nb * 16 + 100, nb * 16 + 800, nb * 16 + 1800};
    int32_t off[5] = {0, nb, nb, nb + nb / 2, 2 * nb};
    uint64_t drefs[400];
    memcpy(drefs, refs, (size_t)nb * sizeof(uint64_t));
    memcpy(drefs + nb, refs, (size_t)nb * sizeof(uint64_t));
    static const int threads[3] = {1, 3, 0};
    for (int pass = 0; pass < 2; pass++) {
        for (int t = 0; t < 3; t++) {
            lkv_attn_cpu_set_threads(threads[t]);
            out[t] = lkv_xmalloc((size_t)nn * HD * sizeof(float));
            if (pass == 0) {
                lkv_decode_args a = {.shape = s,
                                     .pe = &pe,
                                     .batch = 4,
                                     .q = q,
                                     .q_pos = qpos,
                                     .arena = arena,
                                     .page_bytes = bb,
                                     .refs = drefs,
                                     .ref_offset = off,
                                     .sm_scale = 0.125f,
                                     .out = out[t],
                                     .lse = lse[t]};
                ASSERT_OK(lkv_attn_decode_cpu(&a));
            } else {
                lkv_prefill_args a = {.shape = s,
                                      .pe = &pe,
                                      .n_new = nn,
                                      .new_start = nb * 16,
                                      .q = q,
                                      .k_new = k,
                                      .v_new = v,
                                      .arena = arena,
                                      .page_bytes = bb,
                                      .refs = refs,
                                      .n_refs = nb,
                                      .sm_scale = 0.125f,
                                      .out = out[t]};
                ASSERT_OK(lkv_attn_prefill_cpu(&a));
            }
        }
        size_t n = pass == 0 ? 4 * (size_t)HD : (size_t)nn * HD;
        ASSERT_TRUE(memcmp(out[0], out[1], n * sizeof(float)) == 0);
        ASSERT_TRUE(memcmp(out[0], out[2], n * sizeof(float)) == 0);
        if (pass == 0) {
            ASSERT_TRUE(memcmp(lse[0], lse[1], sizeof lse[0]) == 0);
        }
        for (int t = 0; t < 3; t++) {
            free(out[t]);
        }
    }
    lkv_attn_cpu_set_threads(0);
    free(arena);
    free(q);
    free(k);
    free(v);
}

/* Merge edge cases: an empty side, two empty sides, in place. */
static void test_merge(void)
{
    float a[2 * 8], b[2 * 8], o[2 * 8];
    float la[2] = {1.5f, -INFINITY}, lb[2] = {-INFINITY, -INFINITY}, lo[2];
    fill_normal(a, 16, 1.0);
    fill_normal(b, 16, 1.0);
    lkv_attn_merge_cpu(2, 8, a, la, b, lb, o, lo);
    ASSERT_TRUE(memcmp(o, a, 8 * sizeof(float)) == 0);
    ASSERT_TRUE(lo[0] == 1.5f);
    for (int d = 0; d < 8; d++) {
        ASSERT_TRUE(o[8 + d] == 0.0f);
    }
    ASSERT_TRUE(lo[1] == -INFINITY);
    /* Equal lse: the mean; in place into b. */
    float lc[1] = {0.25f}, ld[1] = {0.25f};
    float c0[8], d0[8];
    memcpy(c0, a, sizeof c0);
    memcpy(d0, b, sizeof d0);
    lkv_attn_merge_cpu(1, 8, c0, lc, d0, ld, d0, ld);
    for (int d = 0; d < 8; d++) {
        ASSERT_NEAR(d0[d], 0.5 * (a[d] + b[d]), 1e-6);
    }
    ASSERT_NEAR(ld[0], 0.25 + log(2.0), 1e-6);
}

int main(void)
{
    kt_seed("test_attn");
    LKV_RUN(test_invalid);
    LKV_RUN(test_no_rotate);
    LKV_RUN(test_merge);
    LKV_RUN(test_threads);
    LKV_RUN(test_random_worlds);
    return 0;
}
