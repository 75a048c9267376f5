/*
 * test_runner.c: client.worker.runner. The model runner (client/worker/lkv_runner.c) has one code
 * path and every numeric operation goes through the backend table: a counting backend (the CPU ops,
 * each call counted) gives bitwise the CPU backend's logits with exactly the expected calls per
 * layer, and no op is reached any other way. Also: scratch buffers reused across calls of
 * different sizes leak nothing (bitwise equal to fresh runners), stale bytes in reused pages
 * never leak (unused slots come out zero, results equal a clean arena's), and bad calls fail;
 * decode rows riding along a prefill pass (lkv_runner_ride) give what the two calls give.
 */
#include "lkv_backend_cpu.h"
#include "lkv_log.h"
#include "lkv_runner.h"
#include "lkv_test.h"

static lkv_model *model;

enum { OP_MATMUL, OP_RMSNORM, OP_EMBED, OP_ADD, OP_SWIGLU, OP_ROPE, OP_KVW, OP_PRE, OP_DEC, N_OPS };
static long calls[N_OPS];
static const lkv_backend *cpu;

static void c_matmul(void *ctx, float *o, const float *x, const float *w, int n, int r, int c)
{
    calls[OP_MATMUL]++;
    cpu->matmul(ctx, o, x, w, n, r, c);
}
static void c_rmsnorm(void *ctx, float *o, const float *x, const float *w, int n, int d)
{
    calls[OP_RMSNORM]++;
    cpu->rmsnorm(ctx, o, x, w, n, d);
}
static void c_embed(void *ctx, float *x, const float *t, const int *k, int n, int d)
{
    calls[OP_EMBED]++;
    cpu->embed(ctx, x, t, k, n, d);
}
static void c_add(void *ctx, float *x, const float *y, size_t n)
{
    calls[OP_ADD]++;
    cpu->add(ctx, x, y, n);
}
static void c_swiglu(void *ctx, float *a, const float *b, size_t n)
{
    calls[OP_SWIGLU]++;
    cpu->swiglu(ctx, a, b, n);
}
static void c_rope(void *ctx, const lkv_posenc *pe, const float *x, float *o, int t, int h,
                   int64_t p)
{
    calls[OP_ROPE]++;
    cpu->rope(ctx, pe, x, o, t, h, p);
}
static void c_kvw(void *ctx, const lkv_kv_shape *s, void *a, uint64_t pb, const uint32_t *pg, int l,
                  int l0, int n, const float *k, const float *v)
{
    calls[OP_KVW]++;
    cpu->kv_write(ctx, s, a, pb, pg, l, l0, n, k, v);
}
static int c_pre(void *ctx, const lkv_prefill_args *a)
{
    calls[OP_PRE]++;
    return cpu->attn_prefill(ctx, a);
}
static int c_dec(void *ctx, const lkv_decode_args *a)
{
    calls[OP_DEC]++;
    return cpu->attn_decode(ctx, a);
}

static void test_one_code_path(void)
{
    cpu = lkv_backend_cpu();
    lkv_backend cnt = *cpu;
    cnt.name = "counting";
    cnt.matmul = c_matmul;
    cnt.rmsnorm = c_rmsnorm;
    cnt.embed = c_embed;
    cnt.add = c_add;
    cnt.swiglu = c_swiglu;
    cnt.rope = c_rope;
    cnt.kv_write = c_kvw;
    cnt.attn_prefill = c_pre;
    cnt.attn_decode = c_dec;
    const int L = model->cfg.n_layers, V = model->cfg.vocab_size;
    lkv_runner a, b;
    ASSERT_OK(lkv_runner_init(&a, model, cpu));
    ASSERT_OK(lkv_runner_init(&b, model, &cnt));
    lkv_model_kv ka, kb;
    ASSERT_OK(lkv_model_kv_init(&ka, model, 16, LKV_DTYPE_F32, 16));
    ASSERT_OK(lkv_model_kv_init(&kb, model, 16, LKV_DTYPE_F32, 16));
    lkv_model_seg sa = {0}, sb = {0};
    const int toks[7] = {1, 403, 378, 261, 280, 290, 300};
    float la[7 * 512], lb[7 * 512];
    ASSERT_OK(lkv_runner_forward(&a, &ka, NULL, 0, &sa, toks, 7, la, NULL));
    ASSERT_OK(lkv_runner_forward(&b, &kb, NULL, 0, &sb, toks, 7, lb, NULL));
    ASSERT_TRUE(memcmp(la, lb, 7 * (size_t)V * sizeof(float)) == 0);
    /* Per layer: q, k, v, wo, w1, w3, w2 matmuls, 2 norms, 2 residual adds, 1 SwiGLU, 2 RoPE
     * (stored and prefill keys), 1 KV write, 1 prefill; then 1 norm and 1 matmul for logits. */
    ASSERT_EQ(calls[OP_MATMUL], 7 * L + 1);
    ASSERT_EQ(calls[OP_RMSNORM], 2 * L + 1);
    ASSERT_EQ(calls[OP_EMBED], 1);
    ASSERT_EQ(calls[OP_ADD], 2 * L);
    ASSERT_EQ(calls[OP_SWIGLU], L);
    ASSERT_EQ(calls[OP_ROPE], 2 * L);
    ASSERT_EQ(calls[OP_KVW], L);
    ASSERT_EQ(calls[OP_PRE], L);
    ASSERT_EQ(calls[OP_DEC], 0);
    /* A decode step: one RoPE (stored key), the decode kernel, no prefill. */
    memset(calls, 0, sizeof calls);
    int next = 290;
    ASSERT_OK(lkv_runner_forward(&a, &ka, NULL, 0, &sa, &next, 1, la, NULL));
    ASSERT_OK(lkv_runner_forward(&b, &kb, NULL, 0, &sb, &next, 1, lb, NULL));
    ASSERT_TRUE(memcmp(la, lb, (size_t)V * sizeof(float)) == 0);
    ASSERT_EQ(calls[OP_DEC], L);
    ASSERT_EQ(calls[OP_PRE], 0);
    ASSERT_EQ(calls[OP_ROPE], L);
    ASSERT_TRUE(memcmp(ka.base, kb.base, ka.page_bytes) == 0); /* the same KV */
    lkv_runner_free(&a);
    lkv_runner_free(&b);
    lkv_model_kv_free(&ka);
    lkv_model_kv_free(&kb);
}

/* Runs the call sequence 9 tokens, 1, 5, 1 on runner r (shared) or on a fresh runner per call. */
static void sequence(lkv_runner *shared, lkv_model_kv *kv, float *logits)
{
    static const int toks[16] = {1,   403, 378, 261, 280, 290, 300, 310,
                                 320, 330, 340, 350, 360, 370, 380, 390};
    static const int sizes[4] = {9, 1, 5, 1};
    lkv_model_seg seg = {0};
    int off = 0;
    for (int c = 0; c < 4; c++) {
        lkv_runner fresh;
        lkv_runner *r = shared;
        if (r == NULL) {
            ASSERT_OK(lkv_runner_init(&fresh, model, lkv_backend_cpu()));
            r = &fresh;
        }
        ASSERT_OK(lkv_runner_forward(r, kv, NULL, 0, &seg, toks + off, sizes[c],
                                     logits + (size_t)off * 512, NULL));
        off += sizes[c];
        if (r == &fresh) {
            lkv_runner_free(&fresh);
        }
    }
}

static void test_scratch_and_stale_pages(void)
{
    lkv_runner r;
    ASSERT_OK(lkv_runner_init(&r, model, lkv_backend_cpu()));
    lkv_model_kv k1, k2;
    ASSERT_OK(lkv_model_kv_init(&k1, model, 4, LKV_DTYPE_F32, 16));
    ASSERT_OK(lkv_model_kv_init(&k2, model, 4, LKV_DTYPE_F32, 16));
    memset(k2.base, 0x7f, (size_t)k2.n_pages * k2.page_bytes); /* stale garbage (NaN-like) */
    float *l1 = lkv_xmalloc(16 * 512 * sizeof(float)), *l2 = lkv_xmalloc(16 * 512 * sizeof(float));
    sequence(&r, &k1, l1);
    sequence(NULL, &k2, l2);
    ASSERT_TRUE(memcmp(l1, l2, 16 * 512 * sizeof(float)) == 0);
    /* 16 tokens in blocks of 4: 4 pages used, identical, and nothing else written. */
    ASSERT_EQ(k2.n_used, 4);
    ASSERT_TRUE(memcmp(k1.base, k2.base, 4 * k1.page_bytes) == 0);
    ASSERT_EQ(k2.base[4 * k2.page_bytes], 0x7f);
    /* A partial last block: its unused slots are zero despite the stale bytes. */
    lkv_model_seg seg = {0};
    const int three[3] = {1, 403, 378};
    ASSERT_OK(lkv_runner_forward(&r, &k2, NULL, 0, &seg, three, 3, NULL, NULL));
    const uint8_t *blk = k2.base + (uint64_t)seg.pages[0] * k2.page_bytes;
    for (int l = 0; l < model->cfg.n_layers; l++) {
        for (int kv = 0; kv < 2; kv++) {
            for (int h = 0; h < model->cfg.n_kv_heads; h++) {
                const float *slab = (const float *)(blk + lkv_slab_offset(&k2.shape, l, kv, h));
                for (int d = 0; d < model->cfg.head_dim; d++) {
                    ASSERT_TRUE(slab[3 * model->cfg.head_dim + d] == 0.0f);
                    ASSERT_TRUE(slab[2 * model->cfg.head_dim + d] != 0.0f);
                }
            }
        }
    }
    free(l1);
    free(l2);
    lkv_model_kv_free(&k1);
    lkv_model_kv_free(&k2);
    lkv_runner_free(&r);
}

static void test_errors(void)
{
    lkv_runner r;
    ASSERT_OK(lkv_runner_init(&r, model, lkv_backend_cpu()));
    ASSERT_ERR(lkv_runner_init(&r, model, NULL), LKV_EINVAL);
    ASSERT_OK(lkv_runner_init(&r, model, lkv_backend_cpu()));
    lkv_model_kv kv;
    ASSERT_OK(lkv_model_kv_init(&kv, model, 16, LKV_DTYPE_F32, 1));
    lkv_model_seg seg = {0};
    int bad[2] = {1, 512};
    ASSERT_ERR(lkv_runner_forward(&r, &kv, NULL, 0, &seg, bad, 2, NULL, NULL), LKV_EINVAL);
    bad[1] = -1;
    ASSERT_ERR(lkv_runner_forward(&r, &kv, NULL, 0, &seg, bad, 2, NULL, NULL), LKV_EINVAL);
    ASSERT_ERR(lkv_runner_forward(&r, &kv, NULL, 0, &seg, bad, 0, NULL, NULL), LKV_EINVAL);
    int toks[20];
    for (int i = 0; i < 20; i++) {
        toks[i] = 300 + i;
    }
    ASSERT_ERR(lkv_runner_forward(&r, &kv, NULL, 0, &seg, toks, 20, NULL, NULL), LKV_ENOSPC);
    seg.start = LKV_MAX_POSITION - 1; /* tokens at MAX-1, MAX, MAX+1 */
    ASSERT_ERR(lkv_runner_forward(&r, &kv, NULL, 0, &seg, toks, 3, NULL, NULL), LKV_EINVAL);
    ASSERT_OK(lkv_runner_forward(&r, &kv, NULL, 0, &seg, toks, 2, NULL, NULL)); /* fits */
    lkv_model_kv_free(&kv);
    lkv_runner_free(&r);
}

/* Builds, in kv, a decode sequence a (one segment of 5 tokens) and b (a 6-token context
 * segment at 0, a 3-token question after it), ready for a decode step; and returns them. */
static void two_seqs(lkv_runner *r, lkv_model_kv *kv, lkv_model_seg sg[3], lkv_runner_seq q[2])
{
    static const int ta[5] = {1, 300, 301, 302, 303}, tc[6] = {1, 310, 311, 312, 313, 314},
                     tq[3] = {320, 321, 322};
    memset(sg, 0, 3 * sizeof(*sg));
    sg[1].start = 0;
    sg[2].start = 6;
    ASSERT_OK(lkv_runner_forward(r, kv, NULL, 0, &sg[0], ta, 5, NULL, NULL));
    ASSERT_OK(lkv_runner_forward(r, kv, NULL, 0, &sg[1], tc, 6, NULL, NULL));
    ASSERT_OK(lkv_runner_forward(r, kv, &sg[1], 1, &sg[2], tq, 3, NULL, NULL));
    q[0] = (lkv_runner_seq){.kv = kv, .ctx = NULL, .n_ctx = 0, .seg = &sg[0], .token = 404};
    q[1] = (lkv_runner_seq){.kv = kv, .ctx = &sg[1], .n_ctx = 1, .seg = &sg[2], .token = 405};
}

/* A ride (decode rows in a prefill pass) gives bitwise what the prefill and then the decode step
 * give (logits of both, the KV written, the pages taken), with the prefill's last row or every
 * row of logits; it is not run (the sequences untouched) on the one-token decode path, with a
 * trace, or over another arena. */
static void test_ride(void)
{
    static const int tp[7] = {1, 330, 331, 332, 333, 334, 335};
    const int V = model->cfg.vocab_size;
    for (int last = 0; last < 2; last++) {
        lkv_runner r1, r2;
        ASSERT_OK(lkv_runner_init(&r1, model, lkv_backend_cpu()));
        ASSERT_OK(lkv_runner_init(&r2, model, lkv_backend_cpu()));
        r1.last_logits = r2.last_logits = last;
        lkv_model_kv k1, k2;
        ASSERT_OK(lkv_model_kv_init(&k1, model, 32, LKV_DTYPE_F32, 4));
        ASSERT_OK(lkv_model_kv_init(&k2, model, 32, LKV_DTYPE_F32, 4));
        lkv_model_seg s1[3], s2[3], p1 = {.start = 40}, p2 = {.start = 40};
        lkv_runner_seq q1[2], q2[2];
        two_seqs(&r1, &k1, s1, q1);
        two_seqs(&r2, &k2, s2, q2);
        const int np = last ? 1 : 7;
        float *pl1 = lkv_xmalloc((size_t)np * V * 4), *pl2 = lkv_xmalloc((size_t)np * V * 4);
        float *dl1 = lkv_xmalloc(2 * (size_t)V * 4), *dl2 = lkv_xmalloc(2 * (size_t)V * 4);
        ASSERT_OK(lkv_runner_forward(&r1, &k1, NULL, 0, &p1, tp, 7, pl1, NULL));
        ASSERT_OK(lkv_runner_decode_batch(&r1, q1, 2, dl1));
        lkv_runner_ride ride = {.seqs = q2, .n = 2, .logits = dl2};
        r2.ride = &ride;
        ASSERT_OK(lkv_runner_forward(&r2, &k2, NULL, 0, &p2, tp, 7, pl2, NULL));
        ASSERT_TRUE(ride.done == 1 && r2.ride == NULL && r2.n_rides == 1);
        ASSERT_TRUE(memcmp(pl1, pl2, (size_t)np * V * 4) == 0);
        ASSERT_TRUE(memcmp(dl1, dl2, 2 * (size_t)V * 4) == 0);
        ASSERT_EQ(k2.n_used, k1.n_used);
        ASSERT_TRUE(memcmp(k1.base, k2.base, (size_t)k1.n_used * k1.page_bytes) == 0);
        ASSERT_EQ(s2[0].n_tokens, 6);
        ASSERT_EQ(s2[2].n_tokens, 4);
        ASSERT_EQ(p2.n_tokens, 7);
        /* Not run: the decode path (one token appended), a trace, another arena. */
        lkv_model_kv k3;
        ASSERT_OK(lkv_model_kv_init(&k3, model, 8, LKV_DTYPE_F32, 4));
        lkv_model_seg p3 = {.start = 60};
        lkv_model_trace tr = {0};
        for (int c = 0; c < 3; c++) {
            lkv_runner_ride no = {.seqs = q2, .n = 2, .logits = dl2};
            r2.ride = &no;
            if (c == 0) {
                ASSERT_OK(lkv_runner_forward(&r2, &k2, NULL, 0, &p2, tp, 1, NULL, NULL));
            } else if (c == 1) {
                ASSERT_OK(lkv_runner_forward(&r2, &k2, NULL, 0, &p2, tp, 3, NULL, &tr));
            } else {
                ASSERT_OK(lkv_runner_forward(&r2, &k3, NULL, 0, &p3, tp, 3, NULL, NULL));
            }
            ASSERT_TRUE(no.done == 0 && r2.ride == NULL);
            ASSERT_EQ(s2[0].n_tokens, 6);
            ASSERT_EQ(s2[2].n_tokens, 4);
        }
        ASSERT_EQ(r2.n_rides, 1);
        lkv_model_trace_free(&tr);
        free(pl1);
        free(pl2);
        free(dl1);
        free(dl2);
        lkv_model_kv_free(&k1);
        lkv_model_kv_free(&k2);
        lkv_model_kv_free(&k3);
        lkv_runner_free(&r1);
        lkv_runner_free(&r2);
    }
}

int main(void)
{
    ASSERT_OK(lkv_model_load(LKV_TEST_MODEL_DIR "/stories260K.bin", &model));
    LKV_RUN(test_one_code_path);
    LKV_RUN(test_scratch_and_stale_pages);
    LKV_RUN(test_errors);
    LKV_RUN(test_ride);
    lkv_model_destroy(model);
    return 0;
}
