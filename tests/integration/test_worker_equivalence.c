/*
 * test_worker_equivalence.c: integration.worker_equivalence. The decode worker against a real
 * lazykvd, with the tiny real model (stories260K):
 *   (1) the same documents in different orders and positions, served lazily from the cache
 *       (computed once, at position 0, by the first request), give the same logits and greedy
 *       tokens as (a) the Block-Attention baseline (a re-rotated copy of each document,
 *       lkv_materialise) and (b) a plain fp64 forward pass over the whole prompt with the
 *       block-attention mask (tests/kernels/kt_ref_model.h), for every generated token;
 *   (2) a warm cache gives exactly (bitwise) the output of a cold one;
 *   (3) hits are read in place: the block references the attention reads name the daemon's own
 *       arena pages (those an Attach reports) at the document's start, and the arena is mapped
 *       once per daemon;
 *   (4) after a clean restart the documents come back from the cold tier and give bitwise the
 *       same output again (and the new arena is mapped once more);
 *   (5) the same with a bf16 profile of 5-token blocks (KV converted on write and read, partial
 *       blocks everywhere): warm == cold bitwise, zero copy, lazy vs materialise within bf16.
 *
 * Tolerances. The cache holds fp32 KV (profile stories260k). (a) lazy vs materialise differ only
 * in where the RoPE rotation is rounded: the baseline rounds re-rotated keys to fp32 once, the
 * lazy path rotates the query instead; the CPU kernels measure <= 1e-6 on attention outputs
 * (tests/kernels/test_model.c), which five layers and the classifier grow to about 1e-5 on logits
 * of magnitude ~20; we allow 1e-4 (5e-6 relative). (b) against fp64 the fp32 runner accumulates
 * dot products of 64..172 terms in fp32 (~1e-6 relative each), measured ~1e-5 on the logits; we
 * allow 2e-4. Greedy tokens must be equal; the test prints the smallest top-1/top-2 logit gap so
 * a tie within tolerance (which would make a token flip legitimate) would be visible; with these
 * prompts the gap is far above the tolerance.
 */
#include <signal.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kt_ref_model.h"
#include "lkv_backend_cpu.h"
#include "lkv_client.h"
#include "lkv_daemon_harness.h"
#include "lkv_it_util.h"
#include "lkv_request.h"
#include "lkv_test.h"
#include "lkv_worker.h"

#define TOL_MATERIALISE 1e-4
#define TOL_REFERENCE   2e-4
#define N_OUT           12

static const char *DOCS[] = {
    "Lily went to the park with her mom. They saw a big tree with red apples.",
    "Tom had a red ball. He liked to throw it high in the sky and catch it.",
    "Once upon a time, there was a little dog named Max. Max loved to run and jump.",
    "Sue found a shiny key under her bed. She wondered what it could open.",
};
static const char *QUESTION = "One day, Lily and Tom";

static lkv_daemon dm;

/* Spy backend: the CPU backend, recording the references of the last prefill. */
static lkv_backend spy;
static uint64_t spy_refs[4096];
static int32_t spy_n_refs;
static int64_t spy_new_start;

static int spy_prefill(void *ctx, const lkv_prefill_args *a)
{
    if (a->layer == 0 && a->n_refs <= 4096) {
        memcpy(spy_refs, a->refs, (size_t)a->n_refs * sizeof(uint64_t));
        spy_n_refs = a->n_refs;
        spy_new_start = a->new_start;
    }
    return lkv_attn_prefill_cpu(a);
    (void)ctx;
}

static lkv_worker *make_worker_for(const char *profile, int dtype, int block_tokens)
{
    lkv_worker_opts o = {.target = dm.addr,
                         .profile = profile,
                         .dtype = dtype,
                         .block_tokens = block_tokens,
                         .model_path = LKV_TEST_MODEL_DIR "/stories260K.bin",
                         .tokenizer_path = LKV_TEST_MODEL_DIR "/tok512.bin",
                         .deadline_ms = lkv_test_timeout_ms(20000),
                         .backend = &spy};
    lkv_worker *w;
    char err[512];
    if (lkv_worker_create(&o, &w, err, sizeof err) != 0) {
        LKV_FAIL("worker: %s", err);
    }
    return w;
}

static lkv_worker *make_worker(void)
{
    return make_worker_for(NULL, LKV_DTYPE_F32, 16);
}

/* Builds the request of documents order[0..n) and runs it in mode. */
static void run(lkv_worker *w, const int *order, int n, int mode, lkv_request *rq,
                lkv_rag_result *res)
{
    const char *texts[8];
    for (int i = 0; i < n; i++) {
        texts[i] = DOCS[order[i]];
    }
    lkv_request_defaults def = {.max_tokens = N_OUT, .mode = mode};
    char err[256];
    ASSERT_OK(lkv_request_from_text(texts, n, QUESTION, lkv_worker_tokenizer(w), &def, "t", rq, err,
                                    sizeof err));
    rq->rag.stop_at_eos = 0;
    rq->rag.keep_logits = 1;
    int rc = lkv_worker_run(w, &rq->rag, res);
    if (rc != 0) {
        LKV_FAIL("request: %s: %s", lkv_err_name(rc), res->error);
    }
    ASSERT_EQ(res->n_out, N_OUT);
}

static double max_diff(const float *a, const double *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        m = e > m || isnan(e) ? e : m;
    }
    return m;
}

/* Smallest gap between the best and second-best logit over the output rows. */
static double min_gap(const lkv_rag_result *r)
{
    double g = INFINITY;
    for (int t = 0; t < r->n_out; t++) {
        const float *row = r->logits + (size_t)t * r->vocab;
        double b1 = -INFINITY, b2 = -INFINITY;
        for (int v = 0; v < r->vocab; v++) {
            if (row[v] > b1) {
                b2 = b1;
                b1 = row[v];
            } else if (row[v] > b2) {
                b2 = row[v];
            }
        }
        g = b1 - b2 < g ? b1 - b2 : g;
    }
    return g;
}

/* (b): the fp64 block-attention forward over the whole prompt plus the generated tokens. */
static void check_reference(lkv_worker *w, const lkv_request *rq, const lkv_rag_result *lazy)
{
    const lkv_model *m = lkv_worker_model(w);
    const int V = m->cfg.vocab_size, N = lazy->n_prompt + lazy->n_out - 1;
    int *toks = lkv_xmalloc((size_t)N * sizeof(int)), *grp = lkv_xmalloc((size_t)N * sizeof(int));
    int k = 0;
    for (int d = 0; d < rq->rag.n_docs; d++) {
        for (int t = 0; t < rq->rag.docs[d].n_tokens; t++, k++) {
            toks[k] = rq->rag.docs[d].tokens[t];
            grp[k] = d;
        }
    }
    for (int t = 0; t < rq->rag.n_question; t++, k++) {
        toks[k] = rq->rag.question[t];
        grp[k] = rq->rag.n_docs;
    }
    for (int t = 0; t < lazy->n_out - 1; t++, k++) {
        toks[k] = lazy->tokens[t];
        grp[k] = rq->rag.n_docs;
    }
    ASSERT_EQ(k, N);
    double *ref = lkv_xmalloc((size_t)N * V * sizeof(double));
    kt_ref_forward(m, toks, grp, N, rq->rag.n_docs, 1, ref);
    double worst = 0;
    for (int t = 0; t < lazy->n_out; t++) {
        const double *r = ref + (size_t)(lazy->n_prompt - 1 + t) * V;
        double e = max_diff(lazy->logits + (size_t)t * V, r, (size_t)V);
        worst = e > worst ? e : worst;
        int best = 0;
        for (int v = 1; v < V; v++) {
            best = r[v] > r[best] ? v : best;
        }
        if (best != lazy->tokens[t]) {
            LKV_FAIL("token %d: lazy %d, fp64 reference %d", t, lazy->tokens[t], best);
        }
    }
    fprintf(stderr, "   lazy vs fp64 masked full forward: max |logit diff| %.3g (tol %.0e)\n",
            worst, TOL_REFERENCE);
    ASSERT_TRUE(worst <= TOL_REFERENCE);
    free(toks);
    free(grp);
    free(ref);
}

/* (a): the Block-Attention baseline on the same worker. */
static void check_materialise(lkv_worker *w, const int *order, int n, const lkv_rag_result *lazy)
{
    lkv_request rq;
    lkv_rag_result mat;
    run(w, order, n, LKV_RAG_MATERIALISE, &rq, &mat);
    double worst = 0;
    for (size_t i = 0; i < (size_t)lazy->n_out * lazy->vocab; i++) {
        double e = fabs((double)mat.logits[i] - (double)lazy->logits[i]);
        worst = e > worst ? e : worst;
    }
    fprintf(stderr, "   lazy vs materialised (Block-Attention): max |logit diff| %.3g (tol %.0e)\n",
            worst, TOL_MATERIALISE);
    ASSERT_TRUE(worst <= TOL_MATERIALISE);
    ASSERT_TRUE(memcmp(mat.tokens, lazy->tokens, (size_t)lazy->n_out * sizeof(int)) == 0);
    lkv_rag_result_free(&mat);
    lkv_request_free(&rq);
}

static void expect_bitwise(const lkv_rag_result *a, const lkv_rag_result *b, const char *what)
{
    ASSERT_EQ(a->n_out, b->n_out);
    if (memcmp(a->tokens, b->tokens, (size_t)a->n_out * sizeof(int)) != 0 ||
        memcmp(a->logits, b->logits, (size_t)a->n_out * a->vocab * sizeof(float)) != 0) {
        LKV_FAIL("%s: outputs differ", what);
    }
}

/* (3): every hit's references name the daemon's pages for it, at its start. */
static void check_zero_copy(const lkv_rag_result *res, const lkv_request *rq, const char *profile)
{
    lkv_client_t *c = lkv_it_client(&dm);
    int off = 0;
    for (int d = 0; d < res->n_docs; d++) {
        ASSERT_TRUE(res->docs[d].hit);
        lkv_docref ref = {
            .profile = profile, .tokens = NULL, .n_tokens = (size_t)rq->rag.docs[d].n_tokens};
        uint32_t ids[512];
        for (int t = 0; t < rq->rag.docs[d].n_tokens; t++) {
            ids[t] = (uint32_t)rq->rag.docs[d].tokens[t];
        }
        ref.tokens = ids;
        lkv_lease l;
        ASSERT_OK(lkv_client_attach(c, &ref, 1, NULL, 5000, 0, &l));
        for (uint32_t b = 0; b < l.docs[0].n_pages; b++) {
            uint64_t r = spy_refs[off + (int)b];
            ASSERT_EQ(lkv_ref_page(r), l.docs[0].pages[b]);
            ASSERT_EQ(lkv_ref_start(r), res->docs[d].start);
            ASSERT_EQ(lkv_ref_block(r), b);
        }
        off += (int)l.docs[0].n_pages;
        ASSERT_OK(lkv_client_release(c, l.id, 0, NULL));
        lkv_lease_free(&l);
    }
    ASSERT_EQ(spy_n_refs, off);
    ASSERT_EQ(res->zero_copy_blocks, (uint64_t)off);
    lkv_client_destroy(c);
}

static void test_equivalence(void)
{
    spy = *lkv_backend_cpu();
    spy.attn_prefill = spy_prefill;
    lkv_worker *w = make_worker();
    static const int o1[] = {0, 1, 2}, o2[] = {2, 0, 1}, o3[] = {1, 3, 0, 2};
    lkv_request r1, r1w, r2, r3;
    lkv_rag_result cold, warm, res2, res3;

    /* Cold: every document is a miss, computed alone and stored. */
    run(w, o1, 3, LKV_RAG_LAZY, &r1, &cold);
    ASSERT_EQ(cold.miss_docs, 3);
    for (int d = 0; d < 3; d++) {
        ASSERT_EQ(cold.docs[d].stored, 1);
        ASSERT_EQ(cold.docs[d].tier, LKV_WIRE_TIER_ABSENT);
    }
    fprintf(stderr, "   cold: \"%s\" (ttft %.2f ms, smallest top-2 gap %.3g)\n", cold.text,
            cold.ttft_ms, min_gap(&cold));
    check_reference(w, &r1, &cold);
    check_materialise(w, o1, 3, &cold);

    /* Warm: the same request, every document a hit read in place: bitwise the cold output. */
    run(w, o1, 3, LKV_RAG_LAZY, &r1w, &warm);
    ASSERT_EQ(warm.hit_docs, 3);
    ASSERT_EQ(warm.docs[0].tier, LKV_WIRE_TIER_HOT);
    expect_bitwise(&cold, &warm, "warm vs cold");
    check_zero_copy(&warm, &r1w, "stories260k");
    fprintf(stderr, "   warm == cold bitwise (ttft %.2f ms vs %.2f ms cold)\n", warm.ttft_ms,
            cold.ttft_ms);

    /* Other orders and positions: the cached documents, placed elsewhere. */
    run(w, o2, 3, LKV_RAG_LAZY, &r2, &res2);
    ASSERT_EQ(res2.hit_docs, 3);
    check_zero_copy(&res2, &r2, "stories260k");
    check_reference(w, &r2, &res2);
    check_materialise(w, o2, 3, &res2);
    run(w, o3, 4, LKV_RAG_LAZY, &r3, &res3);
    ASSERT_EQ(res3.hit_docs, 3); /* doc 3 is new */
    ASSERT_EQ(res3.docs[1].hit, 0);
    check_reference(w, &r3, &res3);
    check_materialise(w, o3, 4, &res3);
    fprintf(stderr, "   orders: \"%s\" / \"%s\"\n", res2.text, res3.text);
    /* A different order is a different prompt: its output differs (the check can fail). */
    ASSERT_TRUE(memcmp(res2.logits, warm.logits, (size_t)warm.vocab * sizeof(float)) != 0);

    lkv_worker_stats st;
    lkv_worker_stats_get(w, &st);
    ASSERT_EQ(st.arena_maps, 1); /* Mapped once. */

    /* Restart: SIGTERM flushes to the cold tier; the documents come back from it. */
    char addr[128];
    snprintf(addr, sizeof addr, "%s", dm.addr);
    int ws = lkv_daemon_stop(&dm, SIGTERM, lkv_test_timeout_ms(20000));
    ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    const char *same_port[] = {"--listen", addr, NULL};
    ASSERT_OK(lkv_daemon_start_with(&dm, same_port)); /* The same worker reconnects. */
    lkv_request r2c;
    lkv_rag_result after;
    run(w, o2, 3, LKV_RAG_LAZY, &r2c, &after);
    for (int d = 0; d < 3; d++) {
        ASSERT_EQ(after.docs[d].tier, LKV_WIRE_TIER_COLD);
        ASSERT_EQ(after.docs[d].hit, 1);
    }
    expect_bitwise(&res2, &after, "after restart (cold tier) vs before");
    fprintf(stderr, "   after restart: cold-tier documents give bitwise the same output\n");
    lkv_worker_stats_get(w, &st);
    ASSERT_EQ(st.arena_maps, 2); /* The new daemon's arena, mapped once more. */

    lkv_rag_result_free(&cold);
    lkv_rag_result_free(&warm);
    lkv_rag_result_free(&res2);
    lkv_rag_result_free(&res3);
    lkv_rag_result_free(&after);
    lkv_request_free(&r1);
    lkv_request_free(&r1w);
    lkv_request_free(&r2);
    lkv_request_free(&r3);
    lkv_request_free(&r2c);
    lkv_worker_destroy(w);
}

/* The same through a bf16 profile with 5-token blocks (partial last blocks everywhere, KV
 * converted on write and read): warm == cold bitwise, the documents read in place, and lazy vs
 * the Block-Attention baseline within bf16's rounding. The baseline rounds re-rotated keys to
 * bf16 (relative 2^-8) where the lazy path rounds nothing more; propagated to logits of
 * magnitude ~20 that is about one bf16 step of a logit, 20 x 2^-8 = 0.08 (measured 0.08, the
 * result is deterministic); we allow 0.15, and greedy tokens must agree (their top-2 gap is
 * printed: above the tolerance here). */
#define TOL_BF16 0.15

static void test_bf16_small_blocks(void)
{
    lkv_worker *w = make_worker_for("stories-bf16-b5", LKV_DTYPE_BF16, 5);
    static const int o1[] = {3, 1, 2}, o2[] = {2, 3, 1};
    lkv_request r1, r1w, r2, r2m;
    lkv_rag_result cold, warm, lazy, mat;
    run(w, o1, 3, LKV_RAG_LAZY, &r1, &cold);
    ASSERT_EQ(cold.miss_docs, 3);
    run(w, o1, 3, LKV_RAG_LAZY, &r1w, &warm);
    ASSERT_EQ(warm.hit_docs, 3);
    expect_bitwise(&cold, &warm, "bf16 warm vs cold");
    check_zero_copy(&warm, &r1w, "stories-bf16-b5");
    run(w, o2, 3, LKV_RAG_LAZY, &r2, &lazy);
    run(w, o2, 3, LKV_RAG_MATERIALISE, &r2m, &mat);
    ASSERT_EQ(mat.hit_docs, 3);
    double worst = 0;
    for (size_t i = 0; i < (size_t)lazy.n_out * lazy.vocab; i++) {
        double e = fabs((double)mat.logits[i] - (double)lazy.logits[i]);
        worst = e > worst ? e : worst;
    }
    fprintf(stderr,
            "   bf16, 5-token blocks: warm == cold bitwise; lazy vs materialised max |logit "
            "diff| %.3g (tol %.0e), smallest top-2 gap %.3g\n",
            worst, TOL_BF16, min_gap(&lazy));
    ASSERT_TRUE(worst <= TOL_BF16);
    ASSERT_TRUE(memcmp(mat.tokens, lazy.tokens, (size_t)lazy.n_out * sizeof(int)) == 0);
    lkv_rag_result_free(&cold);
    lkv_rag_result_free(&warm);
    lkv_rag_result_free(&lazy);
    lkv_rag_result_free(&mat);
    lkv_request_free(&r1);
    lkv_request_free(&r1w);
    lkv_request_free(&r2);
    lkv_request_free(&r2m);
    lkv_worker_destroy(w);
}

#define BF16_PROFILE(f) "--set", "profile.stories-bf16-b5." f

int main(void)
{
    const char *args[] = {
        "--set",
        "hot_bytes=128MiB",
        BF16_PROFILE("n_layers=5"),
        BF16_PROFILE("n_q_heads=8"),
        BF16_PROFILE("n_kv_heads=4"),
        BF16_PROFILE("head_dim=8"),
        BF16_PROFILE("dtype=bf16"),
        BF16_PROFILE("block_tokens=5"),
        BF16_PROFILE("vocab_size=512"),
        BF16_PROFILE("rope_pairing=interleaved"),
        BF16_PROFILE("model_id=blake2b:"
                     "3e77c0b76962b86e8b60b343f705d70cc9e8573156925a0be325b349930dc37b"),
        NULL};
    lkv_daemon_init(&dm, args);
    lkv_it_start(&dm);
    LKV_RUN(test_equivalence);
    LKV_RUN(test_bf16_small_blocks);
    lkv_daemon_cleanup(&dm);
    return 0;
}
