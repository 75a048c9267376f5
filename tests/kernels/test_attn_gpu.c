/*
 * test_attn_gpu.c: the GPU check of the LazyAttention CUDA kernels (kernels/lkv_attn_cuda.h)
 * against the CPU reference (kernels/lkv_attn_cpu.c).
 *
 * For many random configurations (position encodings: RoPE half / interleaved / partial /
 * llama3 / linear scaling, ALiBi, none; bf16 and fp16; head dims 8..256; MHA, GQA, MQA; block
 * sizes 1..64 with partial last blocks whose unused slots hold NaN; several documents per
 * sequence at random offsets, some near position 4,194,303; batches of several sequences, one
 * of them possibly empty) it builds a page arena with documents at permuted pages, runs the
 * CUDA kernel into NaN-poisoned outputs (so every element must be written) and the CPU
 * reference on the same 16-bit data widened to fp32, and prints max abs error, relative L2
 * error and PASS/FAIL per case. Decode also checks the lse output and the NO_ROTATE flag.
 * Then it replays the tiny model's real attention (stories260K, client/lkv_model.h QKV dump made
 * in process: prefill of a question over two cached documents, decode of the next token) for
 * every layer against the CPU reference. Model folder: argv[1], LKV_MODEL_DIR, or the source
 * tree's tests/data/models.
 *
 * Exit status: 0 all passed (or "skipped: no GPU" when no CUDA device is usable), 1 otherwise.
 * Seed: LKV_TEST_SEED (printed first); LKV_GPU_CHECK_CASES scales the number of random cases.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kt_rng.h"
#include "lkv_attn.h"
#include "lkv_attn_cuda.h"
#include "lkv_err.h"
#include "lkv_half.h"
#include "lkv_log.h"
#include "lkv_model.h"
#include "lkv_posenc.h"

static int n_fail;
static int n_pass;

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t ce_ = (x);                                                                     \
        if (ce_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(ce_));   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int rnd(int lo, int hi) /* inclusive */
{
    return lo + (int)(kt_next() % (uint64_t)(hi - lo + 1));
}

static float frnd(void)
{
    return (float)((double)(kt_next() >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

static const char *dtype_name(int dt)
{
    return dt == LKV_DTYPE_BF16 ? "bf16" : "f16";
}

/* Rounds x to dtype and back (the value the GPU sees). */
static float round_dt(float x, int dt)
{
    return dt == LKV_DTYPE_BF16 ? lkv_bf16_to_f32(lkv_f32_to_bf16(x))
                                : lkv_f16_to_f32(lkv_f32_to_f16(x));
}

/* Random 16-bit tensor: host fp32 copy (rounded values) and 16-bit bytes. */
static void rand_tensor(size_t n, int dt, float scale, float *f32, uint16_t *h16)
{
    for (size_t i = 0; i < n; i++) {
        float x = round_dt(frnd() * scale, dt);
        f32[i] = x;
        h16[i] = dt == LKV_DTYPE_BF16 ? lkv_f32_to_bf16(x) : lkv_f32_to_f16(x);
    }
}

/* A posenc configuration by index; name written to *name. */
static void make_pe(lkv_posenc *pe, int which, int d, int hq, const char **name)
{
    lkv_posenc_cfg c;
    memset(&c, 0, sizeof c);
    c.kind = LKV_POSENC_ROPE;
    c.rope_theta = 10000.0;
    switch (which) {
    case 0:
        *name = "rope-half";
        c.rope_theta = 500000.0;
        break;
    case 1:
        *name = "rope-interleaved";
        c.rope_pairing = LKV_ROPE_INTERLEAVED;
        break;
    case 2:
        *name = "rope-half-partial";
        c.rotary_dim = d / 2 >= 2 ? (d / 2) & ~1 : 2;
        break;
    case 3:
        *name = "rope-llama3";
        c.rope_theta = 500000.0;
        c.rope_scaling = LKV_ROPE_SCALING_LLAMA3;
        c.scaling_factor = 8.0;
        c.low_freq_factor = 1.0;
        c.high_freq_factor = 4.0;
        c.original_max_pos = 8192.0;
        break;
    case 4:
        *name = "rope-linear-interleaved-partial";
        c.rope_pairing = LKV_ROPE_INTERLEAVED;
        c.rope_scaling = LKV_ROPE_SCALING_LINEAR;
        c.scaling_factor = 4.0;
        c.rotary_dim = d >= 16 ? d - 8 : d;
        break;
    case 5:
        *name = "alibi";
        c.kind = LKV_POSENC_ALIBI;
        break;
    default:
        *name = "none";
        c.kind = LKV_POSENC_NONE;
        break;
    }
    int rc = lkv_posenc_init(pe, &c, d, hq);
    if (rc != 0) {
        fprintf(stderr, "lkv_posenc_init(%s, d=%d): %s\n", *name, d, lkv_err_name(rc));
        exit(1);
    }
}

/* Documents of one sequence laid out in an arena. */
typedef struct docset {
    int n_refs;
    uint64_t *refs;
    int64_t last_pos; /* Absolute position of the last key (-1 if none). */
} docset;

typedef struct arena {
    lkv_kv_shape shape;
    uint64_t page_bytes;
    int n_pages, used;
    uint32_t *perm; /* Page of the i-th allocated block. */
    uint8_t *host;
} arena;

static void arena_init(arena *a, const lkv_kv_shape *s, int n_pages)
{
    a->shape = *s;
    a->page_bytes = (lkv_block_bytes(s) + 15) / 16 * 16 + 16 * (uint64_t)rnd(0, 2);
    a->n_pages = n_pages;
    a->used = 0;
    a->perm = lkv_xmalloc(sizeof(uint32_t) * (size_t)n_pages);
    for (int i = 0; i < n_pages; i++) {
        a->perm[i] = (uint32_t)i;
    }
    for (int i = n_pages - 1; i > 0; i--) {
        int j = rnd(0, i);
        uint32_t t = a->perm[i];
        a->perm[i] = a->perm[j];
        a->perm[j] = t;
    }
    size_t bytes = (size_t)a->page_bytes * (size_t)n_pages;
    a->host = lkv_xmalloc(bytes);
    memset(a->host, 0xA5, bytes); /* Garbage between slabs and pages. */
}

static void arena_free(arena *a)
{
    free(a->perm);
    free(a->host);
}

/* Adds one document of n tokens starting at absolute position start (keys random, stored as
 * if rotated at local positions: for the check any values do); unused slots of the last block
 * are NaN. Appends its references to ds. */
static void add_doc(arena *a, docset *ds, int n, int64_t start)
{
    const lkv_kv_shape *s = &a->shape;
    const int B = s->block_tokens, D = s->head_dim;
    int nb = (n + B - 1) / B;
    ds->refs = lkv_xrealloc(ds->refs, sizeof(uint64_t) * (size_t)(ds->n_refs + nb));
    for (int b = 0; b < nb; b++) {
        if (a->used >= a->n_pages) {
            fprintf(stderr, "arena too small\n");
            exit(1);
        }
        uint32_t page = a->perm[a->used++];
        int valid = (b == nb - 1) ? n - b * B : B;
        uint8_t *blk = a->host + (size_t)page * a->page_bytes;
        for (int l = 0; l < s->n_layers; l++) {
            for (int kv = 0; kv < 2; kv++) {
                for (int h = 0; h < s->n_kv_heads; h++) {
                    uint16_t *slab = (uint16_t *)(blk + lkv_slab_offset(s, l, kv, h));
                    for (int t = 0; t < B; t++) {
                        for (int i = 0; i < D; i++) {
                            uint16_t v;
                            if (t < valid) {
                                float x = frnd() * (kv == 0 ? 1.5f : 1.0f);
                                v = s->dtype == LKV_DTYPE_BF16 ? lkv_f32_to_bf16(x)
                                                               : lkv_f32_to_f16(x);
                            } else {
                                v = 0x7fff; /* NaN in both types: must never be attended. */
                            }
                            slab[(size_t)t * D + i] = v;
                        }
                    }
                }
            }
        }
        ds->refs[ds->n_refs++] = lkv_ref_pack(page, (uint32_t)start, (uint32_t)b, (uint32_t)valid);
    }
    ds->last_pos = start + n - 1;
}

/* Places n_docs documents with random lengths and gaps from base; returns the docset. */
static docset make_docs(arena *a, int n_docs, int max_len, int64_t base)
{
    docset ds = {0, NULL, -1};
    int64_t pos = base;
    for (int i = 0; i < n_docs; i++) {
        int n = rnd(1, max_len);
        pos += rnd(0, 40);
        add_doc(a, &ds, n, pos);
        pos += n;
    }
    return ds;
}

/* Compares n GPU values (16-bit) with the CPU reference; NaN anywhere fails. */
static int compare(const char *what, const uint16_t *gpu, int dt, const float *ref, size_t n,
                   double tol_abs, double tol_rel)
{
    double max_abs = 0.0, se = 0.0, sr = 0.0;
    size_t nan_at = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        float g = dt == LKV_DTYPE_BF16 ? lkv_bf16_to_f32(gpu[i]) : lkv_f16_to_f32(gpu[i]);
        if (isnan(g) || isnan(ref[i])) {
            if (nan_at == (size_t)-1) {
                nan_at = i;
            }
            continue;
        }
        double e = fabs((double)g - ref[i]);
        max_abs = e > max_abs ? e : max_abs;
        se += e * e;
        sr += (double)ref[i] * ref[i];
    }
    double rel = sr > 0 ? sqrt(se / sr) : sqrt(se);
    int ok = nan_at == (size_t)-1 && max_abs <= tol_abs && rel <= tol_rel;
    printf("  %-8s max_abs=%.3e rel_l2=%.3e%s %s\n", what, max_abs, rel,
           nan_at != (size_t)-1 ? " NaN/unwritten" : "", ok ? "PASS" : "FAIL");
    return ok;
}

static void tolerances(int dt, double *ta, double *tr)
{
    *ta = dt == LKV_DTYPE_BF16 ? 3e-2 : 6e-3;
    *tr = dt == LKV_DTYPE_BF16 ? 1.5e-2 : 3e-3;
}

static void *dev_copy(const void *h, size_t n)
{
    void *d = NULL;
    CK(cudaMalloc(&d, n > 0 ? n : 16));
    if (n > 0) {
        CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    }
    return d;
}

/* ---------------------------------------------------------------- decode */

typedef struct dec_cfg {
    int dt, d, hq, hkv, pe, B, batch, n_docs, max_len, near_max, flags, empty_seq;
    int splits; /* Forced split factor of the plan path (0: the planner's). */
} dec_cfg;

static void run_decode(int idx, const dec_cfg *c)
{
    lkv_kv_shape s = {2, c->hq, c->hkv, c->d, c->dt, c->B};
    lkv_posenc pe;
    const char *pen;
    make_pe(&pe, c->pe, c->d, c->hq, &pen);
    int pages = 0;
    for (int b = 0; b < c->batch; b++) {
        pages += c->n_docs * ((c->max_len + c->B - 1) / c->B);
    }
    arena ar;
    arena_init(&ar, &s, pages + 1);
    uint64_t *refs = NULL;
    int32_t *off = lkv_xmalloc(sizeof(int32_t) * (size_t)(c->batch + 1));
    int64_t *qpos = lkv_xmalloc(sizeof(int64_t) * (size_t)c->batch);
    int total = 0, max_refs = 0;
    off[0] = 0;
    for (int b = 0; b < c->batch; b++) {
        int64_t span = (int64_t)c->n_docs * (c->max_len + 40) + 8;
        int64_t base = c->near_max ? LKV_MAX_POSITION - span : rnd(0, 5000);
        docset ds = {0, NULL, -1};
        if (!(c->empty_seq && b == c->batch / 2)) {
            ds = make_docs(&ar, c->n_docs, c->max_len, base);
        }
        refs = lkv_xrealloc(refs, sizeof(uint64_t) * (size_t)(total + ds.n_refs + 1));
        memcpy(refs + total, ds.refs, sizeof(uint64_t) * (size_t)ds.n_refs);
        total += ds.n_refs;
        max_refs = ds.n_refs > max_refs ? ds.n_refs : max_refs;
        off[b + 1] = total;
        int64_t p = (ds.last_pos < 0 ? base : ds.last_pos) + rnd(0, 3);
        qpos[b] = p > LKV_MAX_POSITION ? LKV_MAX_POSITION : p;
        free(ds.refs);
    }
    size_t nq = (size_t)c->batch * c->hq * c->d;
    float *qf = lkv_xmalloc(nq * sizeof(float));
    uint16_t *qh = lkv_xmalloc(nq * 2);
    rand_tensor(nq, c->dt, 1.5f, qf, qh);
    float *out_ref = lkv_xmalloc(nq * sizeof(float));
    float *lse_ref = lkv_xmalloc(sizeof(float) * (size_t)c->batch * c->hq);
    lkv_decode_args a;
    memset(&a, 0, sizeof a);
    a.shape = s;
    a.pe = &pe;
    a.layer = 1;
    a.batch = c->batch;
    a.q = qf;
    a.q_pos = qpos;
    a.arena = ar.host;
    a.page_bytes = ar.page_bytes;
    a.refs = refs;
    a.ref_offset = off;
    a.sm_scale = 1.0f / sqrtf((float)c->d);
    a.flags = (unsigned)c->flags;
    a.out = out_ref;
    a.lse = lse_ref;
    int rc = lkv_attn_decode_cpu(&a);
    if (rc != 0) {
        fprintf(stderr, "cpu decode: %s\n", lkv_err_name(rc));
        exit(1);
    }
    /* GPU. */
    size_t abytes = (size_t)ar.page_bytes * (size_t)ar.n_pages;
    void *d_arena = dev_copy(ar.host, abytes);
    void *d_refs = dev_copy(refs, sizeof(uint64_t) * (size_t)(total > 0 ? total : 1));
    void *d_off = dev_copy(off, sizeof(int32_t) * (size_t)(c->batch + 1));
    void *d_pos = dev_copy(qpos, sizeof(int64_t) * (size_t)c->batch);
    void *d_q = dev_copy(qh, nq * 2);
    void *d_out, *d_lse;
    CK(cudaMalloc(&d_out, nq * 2));
    CK(cudaMalloc(&d_lse, sizeof(float) * (size_t)c->batch * c->hq));
    CK(cudaMemset(d_out, 0xff, nq * 2));
    CK(cudaMemset(d_lse, 0xff, sizeof(float) * (size_t)c->batch * c->hq));
    lkv_decode_args g = a;
    g.q = d_q;
    g.q_pos = d_pos;
    g.arena = d_arena;
    g.refs = d_refs;
    g.ref_offset = d_off;
    g.out = d_out;
    g.lse = d_lse;
    /* Three launch paths by case: 0 the one-shot launcher with the cached workspace, 1 the
     * one-shot launcher with a caller workspace, 2 a plan (own workspace, forced splits where
     * the case asks) run twice into re-poisoned outputs: the second run checks that the folded
     * merge left its counters ready for the next launch. */
    const int path = c->splits > 0 ? 2 : idx % 3;
    size_t ws_bytes = lkv_attn_decode_cuda_workspace(&s, c->batch, max_refs);
    void *ws = NULL;
    lkv_decode_plan *plan = NULL;
    int splits = 0, runs = 1;
    if (path == 1 && ws_bytes > 0) {
        CK(cudaMalloc(&ws, ws_bytes));
    }
    if (path == 2) {
        lkv_decode_plan_cfg pc;
        memset(&pc, 0, sizeof pc);
        pc.shape = s;
        pc.pe = &pe;
        pc.batch = c->batch;
        pc.max_refs_per_seq = max_refs;
        pc.sm_scale = a.sm_scale;
        pc.flags = a.flags;
        pc.splits = c->splits;
        pc.pdl = (idx / 9) % 2; /* And programmatic dependent launch on and off. */
        ws_bytes = lkv_decode_plan_workspace_bytes(&pc);
        rc = lkv_decode_plan_create(&pc, &plan);
        if (rc != 0) {
            fprintf(stderr, "decode plan: %s\n", lkv_err_name(rc));
            exit(1);
        }
        splits = lkv_decode_plan_splits(plan);
        runs = 2;
    }
    uint16_t *out_gpu = lkv_xmalloc(nq * 2);
    float *lse_gpu = lkv_xmalloc(sizeof(float) * (size_t)c->batch * c->hq);
    printf("decode #%d %s d=%d hq=%d hkv=%d %s B=%d batch=%d docs=%d max_len=%d%s%s%s "
           "refs=%d ws=%zu %s",
           idx, dtype_name(c->dt), c->d, c->hq, c->hkv, pen, c->B, c->batch, c->n_docs, c->max_len,
           c->near_max ? " near-4M" : "", c->flags ? " NO_ROTATE" : "",
           c->empty_seq ? " empty-seq" : "", total, ws_bytes,
           path == 2   ? "plan"
           : path == 1 ? "one-shot+ws"
                       : "one-shot");
    if (path == 2) {
        printf(" splits=%d pdl=%d", splits, (idx / 9) % 2);
    }
    printf("\n");
    double ta, tr;
    tolerances(c->dt, &ta, &tr);
    int ok = 1;
    for (int run = 0; run < runs; run++) {
        if (run > 0) {
            CK(cudaMemset(d_out, 0xff, nq * 2));
            CK(cudaMemset(d_lse, 0xff, sizeof(float) * (size_t)c->batch * c->hq));
        }
        if (path == 2) {
            lkv_decode_run_args ra = {g.layer, g.q,          g.q_pos, g.arena, g.page_bytes,
                                      g.refs,  g.ref_offset, g.out,   g.lse};
            rc = lkv_decode_plan_run(plan, &ra, NULL);
        } else {
            rc = lkv_attn_decode_cuda(&g, max_refs, ws, ws_bytes, NULL);
        }
        if (rc != 0) {
            fprintf(stderr, "cuda decode: %s\n", lkv_err_name(rc));
            exit(1);
        }
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(out_gpu, d_out, nq * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lse_gpu, d_lse, sizeof(float) * (size_t)c->batch * c->hq,
                      cudaMemcpyDeviceToHost));
        ok = compare(run == 0 ? "out" : "out(2nd)", out_gpu, c->dt, out_ref, nq, ta, tr) && ok;
    }
    lkv_decode_plan_destroy(plan);
    /* lse: natural log, compare absolutely (both -inf for an empty sequence). */
    double lmax = 0.0;
    int lok = 1;
    for (int i = 0; i < c->batch * c->hq; i++) {
        if (isinf(lse_ref[i]) && isinf(lse_gpu[i]) && lse_ref[i] < 0 && lse_gpu[i] < 0) {
            continue;
        }
        double e = fabs((double)lse_gpu[i] - lse_ref[i]);
        if (!(e == e)) {
            lok = 0;
            continue;
        }
        lmax = e > lmax ? e : lmax;
    }
    lok = lok && lmax <= (c->dt == LKV_DTYPE_BF16 ? 3e-2 : 5e-3) * (1.0 + 0.0);
    printf("  %-8s max_abs=%.3e %s\n", "lse", lmax, lok ? "PASS" : "FAIL");
    ok = ok && lok;
    ok ? n_pass++ : n_fail++;
    cudaFree(d_arena);
    cudaFree(d_refs);
    cudaFree(d_off);
    cudaFree(d_pos);
    cudaFree(d_q);
    cudaFree(d_out);
    cudaFree(d_lse);
    if (ws != NULL) {
        cudaFree(ws);
    }
    free(out_gpu);
    free(lse_gpu);
    free(qf);
    free(qh);
    free(out_ref);
    free(lse_ref);
    free(refs);
    free(off);
    free(qpos);
    arena_free(&ar);
}

/* ---------------------------------------------------------------- decode in a CUDA graph */

/* The 32 layers of one decode step captured in a CUDA graph (one plan, one stream) and replayed
 * over several steps; between replays the host rewrites the device buffers (positions move,
 * sequences grow by references, new queries). Each replay's output (NaN-poisoned first) must be
 * bitwise equal to uncaptured launches of the same plan, and three layers per step are checked
 * against the CPU reference. */
static void run_graph(int dt, int d, int hq, int hkv, int pe_which, int B, int pdl)
{
    enum { LAYERS = 32, BATCH = 2, STEPS = 4, DOCS = 3 };
    lkv_kv_shape s = {LAYERS, hq, hkv, d, dt, B};
    lkv_posenc pe;
    const char *pen;
    make_pe(&pe, pe_which, d, hq, &pen);
    const int max_len = 300;
    arena ar;
    arena_init(&ar, &s, BATCH * DOCS * ((max_len + B - 1) / B) + 1);
    docset ds[BATCH];
    int max_refs = 0;
    for (int b = 0; b < BATCH; b++) {
        ds[b] = make_docs(&ar, DOCS, max_len, rnd(0, 3000));
        max_refs = ds[b].n_refs > max_refs ? ds[b].n_refs : max_refs;
    }
    lkv_decode_plan_cfg pc;
    memset(&pc, 0, sizeof pc);
    pc.shape = s;
    pc.pe = &pe;
    pc.batch = BATCH;
    pc.max_refs_per_seq = max_refs;
    pc.sm_scale = 1.0f / sqrtf((float)d);
    pc.pdl = pdl;
    lkv_decode_plan *plan = NULL;
    int rc = lkv_decode_plan_create(&pc, &plan);
    if (rc != 0) {
        fprintf(stderr, "graph: plan: %s\n", lkv_err_name(rc));
        exit(1);
    }
    size_t abytes = (size_t)ar.page_bytes * (size_t)ar.n_pages;
    void *d_arena = dev_copy(ar.host, abytes);
    const size_t per_layer = (size_t)BATCH * hq * d;
    const size_t nq = per_layer * LAYERS;
    void *d_q, *d_out, *d_lse, *d_refs, *d_off, *d_pos;
    CK(cudaMalloc(&d_q, nq * 2));
    CK(cudaMalloc(&d_out, nq * 2));
    CK(cudaMalloc(&d_lse, sizeof(float) * LAYERS * BATCH * hq));
    CK(cudaMalloc(&d_refs, sizeof(uint64_t) * (size_t)(BATCH * max_refs)));
    CK(cudaMalloc(&d_off, sizeof(int32_t) * (BATCH + 1)));
    CK(cudaMalloc(&d_pos, sizeof(int64_t) * BATCH));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    lkv_decode_run_args ra[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        lkv_decode_run_args r = {l,
                                 (const uint16_t *)d_q + (size_t)l * per_layer,
                                 (const int64_t *)d_pos,
                                 d_arena,
                                 ar.page_bytes,
                                 (const uint64_t *)d_refs,
                                 (const int32_t *)d_off,
                                 (uint16_t *)d_out + (size_t)l * per_layer,
                                 (float *)d_lse + (size_t)l * BATCH * hq};
        ra[l] = r;
    }
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < LAYERS; l++) {
        rc = lkv_decode_plan_run(plan, &ra[l], st);
        if (rc != 0) {
            fprintf(stderr, "graph: run during capture: %s\n", lkv_err_name(rc));
            exit(1);
        }
    }
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    float *qf = lkv_xmalloc(nq * sizeof(float));
    uint16_t *qh = lkv_xmalloc(nq * 2);
    uint16_t *og = lkv_xmalloc(nq * 2), *oe = lkv_xmalloc(nq * 2);
    float *ref_out = lkv_xmalloc(per_layer * sizeof(float));
    uint64_t *refs = lkv_xmalloc(sizeof(uint64_t) * (size_t)(BATCH * max_refs));
    int ok = 1;
    double ta, tr;
    tolerances(dt, &ta, &tr);
    for (int step = 0; step < STEPS; step++) {
        /* Sequence b attends to a growing prefix of its references; positions move on. */
        int32_t off[BATCH + 1];
        int64_t qpos[BATCH];
        off[0] = 0;
        for (int b = 0; b < BATCH; b++) {
            int n = ds[b].n_refs - (STEPS - 1 - step) * (ds[b].n_refs / 5);
            n = n < 1 ? 1 : n;
            memcpy(refs + off[b], ds[b].refs, sizeof(uint64_t) * (size_t)n);
            off[b + 1] = off[b] + n;
            qpos[b] = ds[b].last_pos + 1 + step * 13 + rnd(0, 5);
        }
        rand_tensor(nq, dt, 1.5f, qf, qh);
        CK(cudaMemcpy(d_refs, refs, sizeof(uint64_t) * (size_t)off[BATCH], cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_off, off, sizeof off, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_pos, qpos, sizeof qpos, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_q, qh, nq * 2, cudaMemcpyHostToDevice));
        CK(cudaMemset(d_out, 0xff, nq * 2));
        CK(cudaGraphLaunch(exec, st));
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(og, d_out, nq * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemset(d_out, 0xff, nq * 2));
        for (int l = 0; l < LAYERS; l++) {
            rc = lkv_decode_plan_run(plan, &ra[l], st);
            if (rc != 0) {
                fprintf(stderr, "graph: eager run: %s\n", lkv_err_name(rc));
                exit(1);
            }
        }
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(oe, d_out, nq * 2, cudaMemcpyDeviceToHost));
        size_t diff = 0;
        for (size_t i = 0; i < nq; i++) {
            diff += og[i] != oe[i];
        }
        printf("graph %s d=%d hq=%d hkv=%d %s B=%d layers=%d batch=%d pdl %d step %d "
               "splits=%d "
               "refs=%d/%d: replay vs eager %zu differing elements %s\n",
               dtype_name(dt), d, hq, hkv, pen, B, LAYERS, BATCH, pdl, step,
               lkv_decode_plan_splits(plan), off[1], off[2] - off[1], diff,
               diff == 0 ? "PASS" : "FAIL");
        ok = ok && diff == 0;
        const int check_layers[] = {0, 17, LAYERS - 1};
        for (int k = 0; k < 3; k++) {
            const int l = check_layers[k];
            lkv_decode_args a;
            memset(&a, 0, sizeof a);
            a.shape = s;
            a.pe = &pe;
            a.layer = l;
            a.batch = BATCH;
            a.q = qf + (size_t)l * per_layer;
            a.q_pos = qpos;
            a.arena = ar.host;
            a.page_bytes = ar.page_bytes;
            a.refs = refs;
            a.ref_offset = off;
            a.sm_scale = pc.sm_scale;
            a.out = ref_out;
            rc = lkv_attn_decode_cpu(&a);
            if (rc != 0) {
                fprintf(stderr, "graph: cpu decode: %s\n", lkv_err_name(rc));
                exit(1);
            }
            char what[32];
            snprintf(what, sizeof what, "layer %d", l);
            ok = compare(what, og + (size_t)l * per_layer, dt, ref_out, per_layer, ta, tr) && ok;
        }
    }
    ok ? n_pass++ : n_fail++;
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(st));
    lkv_decode_plan_destroy(plan);
    cudaFree(d_arena);
    cudaFree(d_q);
    cudaFree(d_out);
    cudaFree(d_lse);
    cudaFree(d_refs);
    cudaFree(d_off);
    cudaFree(d_pos);
    for (int b = 0; b < BATCH; b++) {
        free(ds[b].refs);
    }
    free(qf);
    free(qh);
    free(og);
    free(oe);
    free(ref_out);
    free(refs);
    arena_free(&ar);
}

/* ---------------------------------------------------------------- plan argument checks */

/* The plan API refuses what it must: bad configurations at create, bad run arguments (NULL
 * pointers, misaligned q/out, layer out of range, short pages) with LKV_EINVAL, f32 with
 * LKV_ENOTSUP, a too small borrowed workspace; and a valid run still launches afterwards. */
static void run_plan_checks(void)
{
    lkv_kv_shape s = {2, 32, 8, 128, LKV_DTYPE_BF16, 16};
    lkv_posenc pe;
    const char *pen;
    make_pe(&pe, 0, 128, 32, &pen);
    lkv_decode_plan_cfg c;
    memset(&c, 0, sizeof c);
    c.shape = s;
    c.pe = &pe;
    c.batch = 1;
    c.max_refs_per_seq = 256;
    c.sm_scale = 0.088f;
    lkv_decode_plan *pl = NULL;
    int ok = 1;
    lkv_decode_plan_cfg bad = c;
    bad.batch = 0;
    ok = ok && lkv_decode_plan_create(&bad, &pl) == LKV_EINVAL && pl == NULL;
    bad = c;
    bad.shape.dtype = LKV_DTYPE_F32;
    ok = ok && lkv_decode_plan_create(&bad, &pl) == LKV_ENOTSUP;
    bad = c;
    bad.flags = 0x80;
    ok = ok && lkv_decode_plan_create(&bad, &pl) == LKV_EINVAL;
    bad = c;
    bad.sm_scale = NAN;
    ok = ok && lkv_decode_plan_create(&bad, &pl) == LKV_EINVAL;
    bad = c;
    bad.shape.n_q_heads = 12; /* not a multiple of 8 kv heads */
    ok = ok && lkv_decode_plan_create(&bad, &pl) == LKV_EINVAL;
    const size_t need = lkv_decode_plan_workspace_bytes(&c);
    void *ws = NULL;
    CK(cudaMalloc(&ws, need + 16));
    bad = c;
    bad.workspace = ws;
    bad.workspace_bytes = need - 1;
    ok = ok && need > 0 && lkv_decode_plan_create(&bad, &pl) == LKV_EINVAL;
    bad.workspace_bytes = need;
    ok = ok && lkv_decode_plan_create(&bad, &pl) == 0 && lkv_decode_plan_splits(pl) > 1;
    void *q, *out, *refs, *off, *pos, *ar;
    const uint64_t pb = lkv_block_bytes(&s);
    CK(cudaMalloc(&q, 32 * 128 * 2 + 16));
    CK(cudaMalloc(&out, 32 * 128 * 2 + 16));
    CK(cudaMalloc(&ar, pb));
    CK(cudaMemset(ar, 0, pb));
    uint64_t ref = lkv_ref_pack(0, 0, 0, 16);
    int32_t offs[2] = {0, 1};
    int64_t qp = 20;
    refs = dev_copy(&ref, sizeof ref);
    off = dev_copy(offs, sizeof offs);
    pos = dev_copy(&qp, sizeof qp);
    CK(cudaMemset(q, 0, 32 * 128 * 2 + 16));
    lkv_decode_run_args r = {1, q, pos, ar, pb, refs, off, out, NULL};
    lkv_decode_run_args b = r;
    b.q = (const char *)q + 2;
    ok = ok && lkv_decode_plan_run(pl, &b, NULL) == LKV_EINVAL;
    b = r;
    b.out = (char *)out + 8;
    ok = ok && lkv_decode_plan_run(pl, &b, NULL) == LKV_EINVAL;
    b = r;
    b.layer = 2;
    ok = ok && lkv_decode_plan_run(pl, &b, NULL) == LKV_EINVAL;
    b = r;
    b.page_bytes = pb - 16;
    ok = ok && lkv_decode_plan_run(pl, &b, NULL) == LKV_EINVAL;
    b = r;
    b.q_pos = NULL;
    ok = ok && lkv_decode_plan_run(pl, &b, NULL) == LKV_EINVAL;
    ok = ok && lkv_decode_plan_run(NULL, &r, NULL) == LKV_EINVAL;
    CK(cudaMemset(out, 0xff, 32 * 128 * 2)); /* NaN: every element must be written */
    ok = ok && lkv_decode_plan_run(pl, &r, NULL) == 0;
    CK(cudaDeviceSynchronize());
    uint16_t o[32 * 128];
    CK(cudaMemcpy(o, out, sizeof o, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 32 * 128; i++) {
        ok = ok && o[i] == 0; /* zero keys and values: out 0, every element written */
    }
    printf("plan checks (invalid configs, runs, workspace) %s\n", ok ? "PASS" : "FAIL");
    ok ? n_pass++ : n_fail++;
    lkv_decode_plan_destroy(pl);
    lkv_decode_plan_destroy(NULL);
    cudaFree(ws);
    cudaFree(q);
    cudaFree(out);
    cudaFree(ar);
    cudaFree(refs);
    cudaFree(off);
    cudaFree(pos);
}

/* ---------------------------------------------------------------- prefill */

typedef struct pf_cfg {
    int dt, d, hq, hkv, pe, B, n_new, n_docs, max_len, near_max;
} pf_cfg;

static void run_prefill(int idx, const pf_cfg *c)
{
    lkv_kv_shape s = {2, c->hq, c->hkv, c->d, c->dt, c->B};
    lkv_posenc pe;
    const char *pen;
    make_pe(&pe, c->pe, c->d, c->hq, &pen);
    arena ar;
    arena_init(&ar, &s, c->n_docs * ((c->max_len + c->B - 1) / c->B) + 1);
    int64_t span = (int64_t)c->n_docs * (c->max_len + 40) + c->n_new + 64;
    int64_t base = c->near_max ? LKV_MAX_POSITION - span : rnd(0, 3000);
    docset ds = make_docs(&ar, c->n_docs, c->max_len, base);
    int64_t new_start = (ds.last_pos < 0 ? base : ds.last_pos + 1) + rnd(0, 20);
    size_t nq = (size_t)c->n_new * c->hq * c->d, nk = (size_t)c->n_new * c->hkv * c->d;
    float *qf = lkv_xmalloc(nq * 4), *kf = lkv_xmalloc(nk * 4), *vf = lkv_xmalloc(nk * 4);
    uint16_t *qh = lkv_xmalloc(nq * 2), *kh = lkv_xmalloc(nk * 2), *vh = lkv_xmalloc(nk * 2);
    rand_tensor(nq, c->dt, 1.5f, qf, qh);
    rand_tensor(nk, c->dt, 1.5f, kf, kh);
    rand_tensor(nk, c->dt, 1.0f, vf, vh);
    float *out_ref = lkv_xmalloc(nq * 4);
    lkv_prefill_args a;
    memset(&a, 0, sizeof a);
    a.shape = s;
    a.pe = &pe;
    a.layer = 1;
    a.n_new = c->n_new;
    a.new_start = new_start;
    a.q = qf;
    a.k_new = kf;
    a.v_new = vf;
    a.arena = ar.host;
    a.page_bytes = ar.page_bytes;
    a.refs = ds.refs;
    a.n_refs = ds.n_refs;
    a.sm_scale = 1.0f / sqrtf((float)c->d);
    a.out = out_ref;
    int rc = lkv_attn_prefill_cpu(&a);
    if (rc != 0) {
        fprintf(stderr, "cpu prefill: %s\n", lkv_err_name(rc));
        exit(1);
    }
    size_t abytes = (size_t)ar.page_bytes * (size_t)ar.n_pages;
    lkv_prefill_args g = a;
    void *d_arena = dev_copy(ar.host, abytes);
    void *d_refs = dev_copy(ds.refs, sizeof(uint64_t) * (size_t)ds.n_refs);
    void *d_q = dev_copy(qh, nq * 2), *d_k = dev_copy(kh, nk * 2), *d_v = dev_copy(vh, nk * 2);
    void *d_out;
    CK(cudaMalloc(&d_out, nq * 2));
    CK(cudaMemset(d_out, 0xff, nq * 2));
    g.arena = d_arena;
    g.refs = d_refs;
    g.q = d_q;
    g.k_new = d_k;
    g.v_new = d_v;
    g.out = d_out;
    rc = lkv_attn_prefill_cuda(&g, NULL, 0, NULL);
    if (rc != 0) {
        fprintf(stderr, "cuda prefill: %s\n", lkv_err_name(rc));
        exit(1);
    }
    CK(cudaDeviceSynchronize());
    uint16_t *out_gpu = lkv_xmalloc(nq * 2);
    CK(cudaMemcpy(out_gpu, d_out, nq * 2, cudaMemcpyDeviceToHost));
    const char *kern = getenv("LKV_ATTN_PREFILL_KERNEL");
    printf("prefill #%d %s d=%d hq=%d hkv=%d %s B=%d n_new=%d docs=%d max_len=%d refs=%d%s "
           "start=%lld kernel=%s ws=%zu\n",
           idx, dtype_name(c->dt), c->d, c->hq, c->hkv, pen, c->B, c->n_new, c->n_docs, c->max_len,
           ds.n_refs, c->near_max ? " near-4M" : "", (long long)new_start,
           kern != NULL ? kern : "auto", lkv_attn_prefill_cuda_workspace(&a));
    double ta, tr;
    tolerances(c->dt, &ta, &tr);
    /* The tensor-core path rounds the rotated query and P to 16 bits: a little looser. */
    int ok = compare("out", out_gpu, c->dt, out_ref, nq, ta * 1.5, tr * 1.5);
    ok ? n_pass++ : n_fail++;
    cudaFree(d_arena);
    cudaFree(d_refs);
    cudaFree(d_q);
    cudaFree(d_k);
    cudaFree(d_v);
    cudaFree(d_out);
    free(out_gpu);
    free(qf);
    free(kf);
    free(vf);
    free(qh);
    free(kh);
    free(vh);
    free(out_ref);
    free(ds.refs);
    arena_free(&ar);
}

/* ---------------------------------------------------------------- materialise */

static void run_materialise(int idx, int dt, int d, int hkv, int pe_kind, int B, int n_blocks,
                            int64_t delta)
{
    lkv_kv_shape s = {3, hkv * 2, hkv, d, dt, B};
    lkv_posenc pe;
    const char *pen;
    make_pe(&pe, pe_kind, d, s.n_q_heads, &pen);
    arena ar;
    arena_init(&ar, &s, 2 * n_blocks);
    docset ds = {0, NULL, -1};
    add_doc(&ar, &ds, n_blocks * B - (B > 1 ? 1 : 0), 0);
    uint32_t *src = lkv_xmalloc(sizeof(uint32_t) * (size_t)n_blocks);
    uint32_t *dst = lkv_xmalloc(sizeof(uint32_t) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) {
        src[i] = lkv_ref_page(ds.refs[i]);
        dst[i] = (idx % 3 == 2) ? src[i] : ar.perm[n_blocks + i]; /* every third: in place */
    }
    size_t abytes = (size_t)ar.page_bytes * (size_t)ar.n_pages;
    uint8_t *ref_arena = lkv_xmalloc(abytes);
    memcpy(ref_arena, ar.host, abytes);
    lkv_materialise_args a;
    memset(&a, 0, sizeof a);
    a.shape = s;
    a.pe = &pe;
    a.src_arena = ref_arena;
    a.dst_arena = ref_arena;
    a.page_bytes = ar.page_bytes;
    a.src_pages = src;
    a.dst_pages = dst;
    a.n_blocks = n_blocks;
    a.delta = delta;
    int rc = lkv_materialise_cpu(&a);
    if (rc != 0) {
        fprintf(stderr, "cpu materialise: %s\n", lkv_err_name(rc));
        exit(1);
    }
    void *d_arena = dev_copy(ar.host, abytes);
    void *d_src = dev_copy(src, sizeof(uint32_t) * (size_t)n_blocks);
    void *d_dst = dev_copy(dst, sizeof(uint32_t) * (size_t)n_blocks);
    lkv_materialise_args g = a;
    g.src_arena = d_arena;
    g.dst_arena = d_arena;
    g.src_pages = d_src;
    g.dst_pages = d_dst;
    rc = lkv_materialise_cuda(&g, NULL);
    if (rc != 0) {
        fprintf(stderr, "cuda materialise: %s\n", lkv_err_name(rc));
        exit(1);
    }
    CK(cudaDeviceSynchronize());
    uint8_t *out = lkv_xmalloc(abytes);
    CK(cudaMemcpy(out, d_arena, abytes, cudaMemcpyDeviceToHost));
    /* Compare the destination blocks element by element (NaN slots must stay NaN). */
    double max_rel = 0.0;
    long bad = 0;
    size_t per = lkv_block_bytes(&s) / 2;
    for (int i = 0; i < n_blocks; i++) {
        const uint16_t *x = (const uint16_t *)(out + (size_t)dst[i] * ar.page_bytes);
        const uint16_t *y = (const uint16_t *)(ref_arena + (size_t)dst[i] * ar.page_bytes);
        for (size_t e = 0; e < per; e++) {
            float fx = dt == LKV_DTYPE_BF16 ? lkv_bf16_to_f32(x[e]) : lkv_f16_to_f32(x[e]);
            float fy = dt == LKV_DTYPE_BF16 ? lkv_bf16_to_f32(y[e]) : lkv_f16_to_f32(y[e]);
            if (isnan(fx) || isnan(fy)) {
                bad += isnan(fx) != isnan(fy);
                continue;
            }
            double err = fabs((double)fx - fy) / (fabs(fy) + 1e-2);
            max_rel = err > max_rel ? err : max_rel;
        }
    }
    /* One 16-bit ulp of rounding difference is allowed (fp64 vs fp32 math). */
    double tol = dt == LKV_DTYPE_BF16 ? 8e-3 : 1.1e-3;
    int ok = bad == 0 && max_rel <= tol;
    printf("materialise #%d %s d=%d hkv=%d %s B=%d blocks=%d delta=%lld%s\n  %-8s "
           "max_rel=%.3e nan_mismatch=%ld %s\n",
           idx, dtype_name(dt), d, hkv, pen, B, n_blocks, (long long)delta,
           idx % 3 == 2 ? " in-place" : "", "dst", max_rel, bad, ok ? "PASS" : "FAIL");
    ok ? n_pass++ : n_fail++;
    cudaFree(d_arena);
    cudaFree(d_src);
    cudaFree(d_dst);
    free(out);
    free(ref_arena);
    free(src);
    free(dst);
    free(ds.refs);
    arena_free(&ar);
}

/* ---------------------------------------------------------------- tiny model */

/* Converts n fp32 values to dtype bytes on the device; r (n floats) receives the rounded
 * values, the CPU reference's input. */
static void *dev_from_f32(const float *x, size_t n, int dt, float *r)
{
    uint16_t *h = lkv_xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        h[i] = dt == LKV_DTYPE_BF16 ? lkv_f32_to_bf16(x[i]) : lkv_f32_to_f16(x[i]);
        r[i] = dt == LKV_DTYPE_BF16 ? lkv_bf16_to_f32(h[i]) : lkv_f16_to_f32(h[i]);
    }
    void *d = dev_copy(h, n * 2);
    free(h);
    return d;
}

/* Replays the tiny model's attention (stories260K: head_dim 8, 8/4 heads, real activations of
 * a [doc_a][doc_b][question] prompt with the documents cached position-free) layer by layer:
 * prefill of the question and decode of the next token, against the CPU reference run on the
 * same 16-bit-rounded inputs (the dump's own outputs came from fp32 inputs). Skipped (no
 * failure) when the model file is missing. */
static void run_model(const char *dir, int dt, int bt)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/stories260K.bin", dir);
    lkv_model *m;
    if (lkv_model_load(path, &m) != 0) {
        printf("model: %s not loadable: skipped\n", path);
        return;
    }
    int a[40], b[33], q[12];
    for (int i = 0; i < 40; i++) {
        a[i] = 1 + (i * 37 + 11) % (m->cfg.vocab_size - 1);
    }
    for (int i = 0; i < 33; i++) {
        b[i] = 1 + (i * 53 + 5) % (m->cfg.vocab_size - 1);
    }
    for (int i = 0; i < 12; i++) {
        q[i] = 1 + (i * 71 + 3) % (m->cfg.vocab_size - 1);
    }
    lkv_qkv_dump d;
    int rc = lkv_qkv_dump_make(m, a, 40, b, 33, q, 12, bt, dt, &d);
    if (rc != 0) {
        fprintf(stderr, "lkv_qkv_dump_make: %s\n", lkv_err_name(rc));
        exit(1);
    }
    const lkv_kv_shape *s = &d.shape;
    lkv_posenc pe;
    rc = lkv_posenc_init(&pe, &d.pe_cfg, s->head_dim, s->n_q_heads);
    if (rc != 0) {
        fprintf(stderr, "posenc: %s\n", lkv_err_name(rc));
        exit(1);
    }
    const int Hq = s->n_q_heads, Hkv = s->n_kv_heads, D = s->head_dim, n = d.n_new;
    void *d_arena = dev_copy(d.arena, (size_t)d.n_pages * d.page_bytes);
    void *d_refs = dev_copy(d.refs, sizeof(uint64_t) * (size_t)d.n_refs);
    void *d_drefs = dev_copy(d.dec_refs, sizeof(uint64_t) * (size_t)d.n_dec_refs);
    int32_t off[2] = {0, d.n_dec_refs};
    void *d_off = dev_copy(off, sizeof off);
    void *d_pos = dev_copy(&d.dec_pos, sizeof d.dec_pos);
    void *d_out, *d_dout, *d_lse;
    CK(cudaMalloc(&d_out, (size_t)n * Hq * D * 2));
    CK(cudaMalloc(&d_dout, (size_t)Hq * D * 2));
    CK(cudaMalloc(&d_lse, (size_t)Hq * sizeof(float)));
    uint16_t *out = lkv_xmalloc((size_t)n * Hq * D * 2);
    float *lse = lkv_xmalloc((size_t)Hq * sizeof(float));
    int ok = 1;
    double ta, tr;
    tolerances(dt, &ta, &tr);
    printf("model %s B=%d layers=%d heads=%d/%d d=%d prefill n_new=%d refs=%d, decode refs=%d\n",
           dtype_name(dt), bt, s->n_layers, Hq, Hkv, D, n, d.n_refs, d.n_dec_refs);
    for (int l = 0; l < s->n_layers; l++) {
        const size_t nq = (size_t)n * Hq * D, nk = (size_t)n * Hkv * D;
        float *rq = lkv_xmalloc(nq * 4), *rk = lkv_xmalloc(nk * 4), *rv = lkv_xmalloc(nk * 4);
        float *rdq = lkv_xmalloc((size_t)Hq * D * 4), *ref = lkv_xmalloc(nq * 4);
        float *dref = lkv_xmalloc((size_t)Hq * D * 4), *lref = lkv_xmalloc((size_t)Hq * 4);
        void *dq = dev_from_f32(d.q + l * nq, nq, dt, rq);
        void *dk = dev_from_f32(d.k_new + l * nk, nk, dt, rk);
        void *dv = dev_from_f32(d.v_new + l * nk, nk, dt, rv);
        void *ddq = dev_from_f32(d.dq + (size_t)l * Hq * D, (size_t)Hq * D, dt, rdq);
        lkv_prefill_args pa;
        memset(&pa, 0, sizeof pa);
        pa.shape = *s;
        pa.pe = &pe;
        pa.layer = l;
        pa.n_new = n;
        pa.new_start = d.new_start;
        pa.q = dq;
        pa.k_new = dk;
        pa.v_new = dv;
        pa.arena = d_arena;
        pa.page_bytes = d.page_bytes;
        pa.refs = d_refs;
        pa.n_refs = d.n_refs;
        pa.sm_scale = d.sm_scale;
        pa.out = d_out;
        CK(cudaMemset(d_out, 0xff, nq * 2));
        rc = lkv_attn_prefill_cuda(&pa, NULL, 0, NULL);
        lkv_decode_args da;
        memset(&da, 0, sizeof da);
        da.shape = *s;
        da.pe = &pe;
        da.layer = l;
        da.batch = 1;
        da.q = ddq;
        da.q_pos = d_pos;
        da.arena = d_arena;
        da.page_bytes = d.page_bytes;
        da.refs = d_drefs;
        da.ref_offset = d_off;
        da.sm_scale = d.sm_scale;
        da.out = d_dout;
        da.lse = d_lse;
        CK(cudaMemset(d_dout, 0xff, (size_t)Hq * D * 2));
        CK(cudaMemset(d_lse, 0xff, (size_t)Hq * sizeof(float)));
        int rc2 = lkv_attn_decode_cuda(&da, d.n_dec_refs, NULL, 0, NULL);
        if (rc != 0 || rc2 != 0) {
            fprintf(stderr, "model launches: %s %s\n", lkv_err_name(rc), lkv_err_name(rc2));
            exit(1);
        }
        CK(cudaDeviceSynchronize());
        /* CPU reference on the rounded inputs. */
        lkv_prefill_args pc = pa;
        pc.q = rq;
        pc.k_new = rk;
        pc.v_new = rv;
        pc.arena = d.arena;
        pc.refs = d.refs;
        pc.out = ref;
        lkv_decode_args dc = da;
        dc.q = rdq;
        dc.q_pos = &d.dec_pos;
        dc.arena = d.arena;
        dc.refs = d.dec_refs;
        dc.ref_offset = off;
        dc.out = dref;
        dc.lse = lref;
        if (lkv_attn_prefill_cpu(&pc) != 0 || lkv_attn_decode_cpu(&dc) != 0) {
            fprintf(stderr, "model: CPU reference failed\n");
            exit(1);
        }
        CK(cudaMemcpy(out, d_out, nq * 2, cudaMemcpyDeviceToHost));
        char what[32];
        snprintf(what, sizeof what, "L%d pre", l);
        ok &= compare(what, out, dt, ref, nq, ta * 1.5, tr * 1.5);
        CK(cudaMemcpy(out, d_dout, (size_t)Hq * D * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lse, d_lse, (size_t)Hq * sizeof(float), cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "L%d dec", l);
        ok &= compare(what, out, dt, dref, (size_t)Hq * D, ta, tr);
        double lmax = 0.0;
        for (int h = 0; h < Hq; h++) {
            double e = fabs((double)lse[h] - lref[h]);
            lmax = (e > lmax || e != e) ? e : lmax;
        }
        int lok = lmax <= 3e-2;
        printf("  L%d lse   max_abs=%.3e %s\n", l, lmax, lok ? "PASS" : "FAIL");
        ok &= lok;
        free(rq);
        free(rk);
        free(rv);
        free(rdq);
        free(ref);
        free(dref);
        free(lref);
        cudaFree(dq);
        cudaFree(dk);
        cudaFree(dv);
        cudaFree(ddq);
    }
    ok ? n_pass++ : n_fail++;
    cudaFree(d_arena);
    cudaFree(d_refs);
    cudaFree(d_drefs);
    cudaFree(d_off);
    cudaFree(d_pos);
    cudaFree(d_out);
    cudaFree(d_dout);
    cudaFree(d_lse);
    free(out);
    free(lse);
    lkv_qkv_dump_free(&d);
    lkv_model_destroy(m);
}

/* ---------------------------------------------------------------- main */

static const int dims[] = {8, 16, 32, 64, 128, 96, 256, 72, 128, 64};
static const int heads[][2] = {{8, 8},  {8, 2},  {8, 1},  {32, 8}, {6, 2},
                               {12, 4}, {16, 1}, {32, 4}, {4, 4},  {40, 8}};

int main(int argc, char **argv)
{
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0) {
        printf("test_attn_gpu: skipped: no GPU (%s)\n",
               ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
        return 0;
    }
    kt_seed("test_attn_gpu");
    int scale = 1;
    const char *env = getenv("LKV_GPU_CHECK_CASES");
    if (env != NULL) {
        scale = atoi(env) > 0 ? atoi(env) : 1;
    }
    const char *model_dir = argc > 1 ? argv[1] : getenv("LKV_MODEL_DIR");
#ifdef LKV_TEST_MODEL_DIR
    if (model_dir == NULL) {
        model_dir = LKV_TEST_MODEL_DIR;
    }
#endif
    int idx = 0;
    /* Fixed cases first: the Llama-3.1-8B head shape and the tiny-model shape. */
    const dec_cfg fixed_dec[] = {
        {LKV_DTYPE_BF16, 128, 32, 8, 3, 16, 1, 5, 900, 0, 0, 0, 0},
        {LKV_DTYPE_BF16, 128, 32, 8, 3, 16, 4, 3, 300, 1, 0, 1, 0},
        {LKV_DTYPE_F16, 128, 32, 8, 0, 16, 2, 2, 500, 0, LKV_ATTN_NO_ROTATE, 0, 0},
        {LKV_DTYPE_F16, 64, 8, 8, 1, 16, 3, 4, 200, 1, 0, 0, 0},
        {LKV_DTYPE_BF16, 8, 8, 4, 1, 16, 2, 3, 100, 0, 0, 0, 0},
        {LKV_DTYPE_BF16, 128, 32, 1, 5, 64, 2, 3, 200, 0, 0, 0, 0},
        /* Many short documents (1-2 blocks): a warp meets a new start at almost every step,
         * so the tensor-core kernel's rotation ahead (qb2) and its fallback (a second new
         * start while qb2 is still pending) both run; every RoPE fast path and the partial
         * one, near the maximum position too. */
        {LKV_DTYPE_BF16, 128, 32, 8, 3, 16, 2, 12, 24, 0, 0, 0, 0},
        {LKV_DTYPE_F16, 64, 16, 4, 1, 16, 3, 9, 20, 1, 0, 0, 0},
        {LKV_DTYPE_BF16, 128, 8, 8, 2, 5, 2, 10, 12, 0, 0, 0, 0},
        {LKV_DTYPE_F16, 128, 32, 8, 0, 16, 1, 40, 30, 1, 0, 0, 0},
        /* Batch 16 with Llama-3.1-8B heads (128 (sequence, kv head) pairs: about one CTA per SM,
         * the shape class of the batch-16 benchmark), llama3 RoPE; and ALiBi near the maximum
         * position with an empty sequence. */
        {LKV_DTYPE_BF16, 128, 32, 8, 3, 16, 16, 5, 300, 0, 0, 0, 0},
        {LKV_DTYPE_BF16, 128, 32, 8, 5, 16, 16, 3, 200, 1, 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof fixed_dec / sizeof fixed_dec[0]; i++) {
        run_decode(idx++, &fixed_dec[i]);
    }
    for (int i = 0; i < 24 * scale; i++) {
        int h = rnd(0, 9);
        dec_cfg c = {rnd(0, 1) ? LKV_DTYPE_BF16 : LKV_DTYPE_F16,
                     dims[rnd(0, 9)],
                     heads[h][0],
                     heads[h][1],
                     rnd(0, 6),
                     (int[]){16, 1, 5, 32, 64, 16}[rnd(0, 5)],
                     rnd(1, 6),
                     rnd(1, 5),
                     rnd(1, 300),
                     rnd(0, 3) == 0,
                     rnd(0, 9) == 0 ? (int)LKV_ATTN_NO_ROTATE : 0,
                     rnd(0, 5) == 0,
                     rnd(0, 3) == 0 ? rnd(1, 40) : 0};
        run_decode(idx++, &c);
    }
    /* As many splits as a plan allows (one reference per warp per split): many partials per
     * row through the folded merge; and a few split factors between. */
    const int forced[] = {100000, 100000, 100000, 3, 7};
    const int forced_case[] = {0, 1, 4, 0, 5};
    for (int i = 0; i < 5; i++) {
        dec_cfg c = fixed_dec[forced_case[i]];
        c.splits = forced[i];
        run_decode(idx++, &c);
    }
    run_plan_checks();
    run_graph(LKV_DTYPE_BF16, 128, 32, 8, 3, 16, 0);
    run_graph(LKV_DTYPE_BF16, 128, 32, 8, 3, 16, 1);
    run_graph(LKV_DTYPE_BF16, 128, 32, 8, 1, 16, 1);
    run_graph(LKV_DTYPE_F16, 64, 16, 2, 5, 5, 1);
    run_graph(LKV_DTYPE_BF16, 8, 8, 4, 1, 16, 0);
    /* LKV_GPU_CHECK_ONLY=decode: the decode and graph cases alone (a decode kernel variant
     * forced by the environment, checked in a short device call). */
    const char *only = getenv("LKV_GPU_CHECK_ONLY");
    if (only != NULL && strcmp(only, "decode") == 0) {
        printf("test_attn_gpu: %d passed, %d failed: %s (decode only)\n", n_pass, n_fail,
               n_fail == 0 ? "PASS" : "FAIL");
        return n_fail == 0 ? 0 : 1;
    }
    idx = 0;
    const pf_cfg fixed_pf[] = {
        {LKV_DTYPE_BF16, 128, 32, 8, 3, 16, 64, 5, 400, 0},
        {LKV_DTYPE_BF16, 128, 32, 8, 0, 16, 130, 2, 300, 1},
        {LKV_DTYPE_F16, 64, 8, 2, 1, 16, 77, 3, 200, 0},
        {LKV_DTYPE_BF16, 8, 8, 4, 1, 16, 20, 3, 50, 0},
        {LKV_DTYPE_F16, 128, 16, 16, 5, 32, 40, 2, 100, 0},
        {LKV_DTYPE_BF16, 128, 8, 8, 0, 16, 50, 0, 1, 0},
        /* Blocks larger than a key tile (B > 32): several tiles per block, partial last. */
        {LKV_DTYPE_BF16, 128, 32, 8, 3, 64, 70, 3, 300, 0},
        {LKV_DTYPE_F16, 64, 8, 2, 5, 48, 45, 3, 200, 0},
        {LKV_DTYPE_BF16, 128, 16, 4, 0, 40, 33, 4, 150, 0},
    };
    /* The tensor-core shape classes, each through both kernels: the Hopper wgmma kernel
     * (LKV_ATTN_PREFILL_KERNEL=wgmma: a launch it cannot take fails the check instead of falling
     * back; blocks of a multiple of 8 tokens) and the mma.sync kernel. Many new tokens (several
     * row tiles and causal key tiles of 128), GQA/MQA/MHA, partial blocks, 1-8 blocks per key
     * tile, starts past 65,535 and near the maximum position, every encoding, bf16 and fp16. */
    const pf_cfg hopper_pf[] = {
        {LKV_DTYPE_BF16, 128, 32, 8, 3, 16, 300, 5, 700, 1},
        {LKV_DTYPE_BF16, 128, 32, 8, 0, 16, 64, 5, 900, 0},
        {LKV_DTYPE_F16, 128, 32, 8, 1, 16, 257, 3, 500, 0},
        {LKV_DTYPE_F16, 64, 8, 8, 2, 32, 200, 4, 300, 1},
        {LKV_DTYPE_BF16, 64, 16, 1, 4, 8, 130, 3, 400, 0},
        {LKV_DTYPE_BF16, 128, 16, 1, 5, 64, 150, 3, 500, 1},
        {LKV_DTYPE_F16, 128, 8, 2, 6, 48, 100, 4, 350, 0},
        {LKV_DTYPE_BF16, 64, 32, 8, 0, 40, 77, 3, 260, 1},
        {LKV_DTYPE_BF16, 128, 32, 8, 3, 16, 1, 2, 100, 0},
        {LKV_DTYPE_F16, 128, 32, 4, 0, 16, 129, 0, 1, 0},
        {LKV_DTYPE_BF16, 128, 8, 8, 3, 24, 520, 2, 600, 1},
    };
    const char *kernels[] = {"wgmma", "mma"};
    for (int kk = 0; kk < 2; kk++) {
        setenv("LKV_ATTN_PREFILL_KERNEL", kernels[kk], 1);
        for (size_t i = 0; i < sizeof hopper_pf / sizeof hopper_pf[0]; i++) {
            run_prefill(idx++, &hopper_pf[i]);
        }
        /* Forced split factors (partials through the merge: the wgmma kernel's folded merge,
         * the mma.sync kernel's merge kernel; 36 splits: more than a warp's 32 lanes in the
         * folded merge), the short-question shape (64 new tokens, Llama-3-8B heads) and one
         * split over many references (the producer's reference window slides). */
        const char *splits[] = {"3", "7", "40", "8", "1"};
        const pf_cfg split_pf[] = {
            {LKV_DTYPE_BF16, 128, 32, 8, 0, 16, 70, 5, 800, 1},
            {LKV_DTYPE_F16, 64, 8, 2, 3, 8, 90, 4, 500, 0},
            {LKV_DTYPE_BF16, 128, 32, 8, 0, 8, 64, 5, 3000, 0},
            {LKV_DTYPE_F16, 128, 32, 8, 1, 16, 64, 5, 1200, 1},
            {LKV_DTYPE_BF16, 128, 8, 2, 1, 8, 40, 4, 1500, 0},
        };
        for (int i = 0; i < 5; i++) {
            setenv("LKV_ATTN_PREFILL_SPLITS", splits[i], 1);
            run_prefill(idx++, &split_pf[i]);
        }
        unsetenv("LKV_ATTN_PREFILL_SPLITS");
    }
    unsetenv("LKV_ATTN_PREFILL_KERNEL");
    for (size_t i = 0; i < sizeof fixed_pf / sizeof fixed_pf[0]; i++) {
        run_prefill(idx++, &fixed_pf[i]);
    }
    /* Long reference lists in few splits: the shared-memory window of references slides. */
    setenv("LKV_ATTN_PREFILL_SPLITS", "1", 1);
    const pf_cfg slide_pf[] = {
        {LKV_DTYPE_BF16, 128, 8, 2, 0, 1, 40, 3, 300, 0}, /* ~450 refs in one split */
        {LKV_DTYPE_F16, 64, 4, 4, 5, 2, 33, 4, 400, 1},
    };
    for (size_t i = 0; i < sizeof slide_pf / sizeof slide_pf[0]; i++) {
        run_prefill(idx++, &slide_pf[i]);
    }
    unsetenv("LKV_ATTN_PREFILL_SPLITS");
    for (int i = 0; i < 16 * scale; i++) {
        int h = rnd(0, 9);
        pf_cfg c = {rnd(0, 1) ? LKV_DTYPE_BF16 : LKV_DTYPE_F16,
                    (int[]){64, 128, 8, 96, 128, 64}[rnd(0, 5)],
                    heads[h][0],
                    heads[h][1],
                    rnd(0, 6),
                    (int[]){16, 1, 5, 32, 64, 16}[rnd(0, 5)],
                    rnd(1, 150),
                    rnd(0, 4),
                    rnd(1, 250),
                    rnd(0, 3) == 0};
        run_prefill(idx++, &c);
    }
    idx = 0;
    run_materialise(idx++, LKV_DTYPE_BF16, 128, 8, 3, 16, 40, 4000000);
    run_materialise(idx++, LKV_DTYPE_F16, 64, 2, 1, 16, 9, 12345);
    run_materialise(idx++, LKV_DTYPE_BF16, 128, 2, 0, 16, 6, 3000000); /* in place, half */
    run_materialise(idx++, LKV_DTYPE_BF16, 8, 4, 1, 16, 5, 77);
    run_materialise(idx++, LKV_DTYPE_F16, 128, 2, 4, 16, 7, 999);
    run_materialise(idx++, LKV_DTYPE_BF16, 72, 2, 2, 5, 7, LKV_MAX_POSITION); /* in place, row */
    run_materialise(idx++, LKV_DTYPE_BF16, 64, 2, 5, 16, 3, 5);
    for (int i = 0; i < 6 * scale; i++) {
        run_materialise(idx++, rnd(0, 1) ? LKV_DTYPE_BF16 : LKV_DTYPE_F16, dims[rnd(0, 9)],
                        rnd(1, 4), rnd(0, 6), (int[]){16, 1, 5, 32, 64, 16}[rnd(0, 5)], rnd(1, 20),
                        rnd(0, LKV_MAX_POSITION));
    }
    if (model_dir != NULL) {
        run_model(model_dir, LKV_DTYPE_BF16, 16);
        run_model(model_dir, LKV_DTYPE_F16, 5);
    }
    lkv_attn_cuda_release();
    printf("test_attn_gpu: %d passed, %d failed: %s\n", n_pass, n_fail,
           n_fail == 0 ? "PASS" : "FAIL");
    return n_fail == 0 ? 0 : 1;
}
