/*
 * test_worker_devmap.c: integration.worker_devmap. The worker's device-arena path (a CUDA
 * backend's: the daemon's arena opened whole, the worker pages placed next to it, one base and
 * one stride for the kernels; lkv_pagespace.h "Device arenas") run on the CPU against a real
 * lazykvd: the CPU backend with host-memory device ops (tests/client/worker/lkv_test_devmap.h)
 * over the daemon's shm arena. For each placement (after the arena, below it, a plain
 * allocation at a page offset above or below it):
 *   - a cold request computes its misses straight into the reserved pages of the daemon's
 *     region and commits them (no Put), with the local-only answer's tokens, bitwise;
 *   - a warm request reads the same documents in place, from the SAME region pages (page list
 *     hash) holding the SAME bytes (hash of the KV read back through the mapping, and the bytes
 *     the daemon returns for a Get), again with the local answer's tokens;
 *   - the arena is opened once, and the placement is the one forced;
 * and lkv_worker_unmap closes the arena and frees the worker pages, the next request remapping.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "lkv_backend_cpu.h"
#include "lkv_client.h"
#include "lkv_daemon_harness.h"
#include "lkv_it_util.h"
#include "lkv_request.h"
#include "lkv_test.h"
#include "lkv_test_devmap.h"
#include "lkv_worker.h"

#define MODEL LKV_TEST_MODEL_DIR "/stories260K.bin"
#define TOKP  LKV_TEST_MODEL_DIR "/tok512.bin"

static lkv_daemon dm;
static const char *QUESTION = "One day, Lily and Tom";

static lkv_worker *make_worker(const char *target, const lkv_backend *be)
{
    lkv_worker_opts o = {.target = target,
                         .model_path = MODEL,
                         .tokenizer_path = TOKP,
                         .local_pages = 256,
                         .hash_kv = 1,
                         .backend = be};
    lkv_worker *w;
    char err[512];
    if (lkv_worker_create(&o, &w, err, sizeof err) != 0) {
        LKV_FAIL("worker: %s", err);
    }
    return w;
}

static void run_docs(lkv_worker *w, const char **docs, int n, lkv_rag_result *res)
{
    lkv_request rq;
    lkv_request_defaults def = {.max_tokens = 12};
    char err[256];
    ASSERT_OK(lkv_request_from_text(docs, n, QUESTION, lkv_worker_tokenizer(w), &def, "d", &rq, err,
                                    sizeof err));
    rq.rag.stop_at_eos = 0;
    int rc = lkv_worker_run(w, &rq.rag, res);
    if (rc != 0) {
        LKV_FAIL("request: %s: %s", lkv_err_name(rc), res->error);
    }
    lkv_request_free(&rq);
}

static void same_tokens(const lkv_rag_result *a, const lkv_rag_result *b)
{
    ASSERT_EQ(a->n_out, b->n_out);
    ASSERT_TRUE(memcmp(a->tokens, b->tokens, (size_t)a->n_out * sizeof(int)) == 0);
}

static int hash_block(void *ctx, const lkv_get_header *h, uint32_t index, const void *data,
                      size_t len)
{
    if (data != NULL) {
        crypto_generichash_update(ctx, data, len);
    }
    return 0;
    (void)h;
    (void)index;
}

/* BLAKE2b-64 of the blocks a Get of document key returns (the daemon's own read of its pages),
 * as the worker's kv_hash. */
static uint64_t get_hash(lkv_client_t *c, const char *key_hex)
{
    uint8_t key[32];
    ASSERT_OK(lkv_key_from_hex(key_hex, key));
    lkv_docref ref = {.key = key};
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 8);
    ASSERT_OK(lkv_client_get(c, &ref, 5000, NULL, hash_block, &st));
    uint8_t d[8];
    crypto_generichash_final(&st, d, sizeof(d));
    uint64_t h;
    memcpy(&h, d, sizeof(h));
    return h;
}

static void check_placement(const char *name, int placement, int no_vmm, int refuse_after,
                            int64_t plain_at, const char **docs)
{
    tdm t;
    tdm_init(&t, 0);
    t.profile = "stories260k";
    t.no_vmm = no_vmm;
    t.refuse_after = refuse_after;
    t.plain_at = plain_at;
    lkv_backend be = *lkv_backend_cpu();
    be.devmap = &t.ops;
    lkv_worker *local = make_worker(NULL, NULL);
    lkv_worker *w = make_worker(dm.addr, &be);
    lkv_rag_result ref, cold, warm;
    run_docs(local, docs, 2, &ref);
    run_docs(w, docs, 2, &cold);
    run_docs(w, docs, 2, &warm);
    lkv_worker_stats st;
    lkv_worker_stats_get(w, &st);
    fprintf(stderr, "   %s: placement %s, %d/%d in place cold, %d hits warm, %llu zero-copy\n",
            name, lkv_ps_placement_name(st.placement), cold.docs[0].inplace + cold.docs[1].inplace,
            cold.miss_docs, warm.hit_docs, (unsigned long long)warm.zero_copy_blocks);
    ASSERT_EQ(st.placement, placement);
    ASSERT_EQ(st.arena_maps, 1);
    ASSERT_EQ(t.n_open, 1);
    ASSERT_EQ(cold.miss_docs, 2);
    ASSERT_EQ(warm.hit_docs, 2);
    ASSERT_EQ(st.inplace_docs, 2);
    ASSERT_EQ(st.put_docs, 0);
    same_tokens(&cold, &ref);
    same_tokens(&warm, &ref);
    lkv_client_t *c = lkv_it_client(&dm);
    for (int i = 0; i < 2; i++) {
        ASSERT_TRUE(cold.docs[i].inplace == 1 && cold.docs[i].stored == 1);
        ASSERT_TRUE(cold.docs[i].page0 >= 0 && warm.docs[i].page0 == cold.docs[i].page0);
        ASSERT_TRUE(warm.docs[i].pages_hash == cold.docs[i].pages_hash);
        ASSERT_TRUE(cold.docs[i].kv_hash != 0 && warm.docs[i].kv_hash == cold.docs[i].kv_hash);
        ASSERT_TRUE(ref.docs[i].page0 == -1 && ref.docs[i].kv_hash == cold.docs[i].kv_hash);
        ASSERT_TRUE(get_hash(c, cold.docs[i].key_hex) == cold.docs[i].kv_hash);
    }
    ASSERT_EQ(warm.zero_copy_blocks, (uint64_t)(warm.docs[0].n_blocks + warm.docs[1].n_blocks));
    lkv_client_destroy(c);
    lkv_rag_result_free(&ref);
    lkv_rag_result_free(&cold);
    lkv_rag_result_free(&warm);
    lkv_worker_destroy(w);
    lkv_worker_destroy(local);
    ASSERT_EQ(t.n_close, 1);
    ASSERT_EQ(t.n_free, t.n_alloc);
}

static void test_placements(void)
{
    static const char *A[] = {"Lily went to the park with her mom. They saw a big tree.",
                              "Tom had a red ball. He liked to throw it high in the sky."};
    static const char *B[] = {"Sue found a small blue box under her bed. Inside was a key.",
                              "The dog ran after the cat until they fell asleep in the sun."};
    static const char *C[] = {"Ben had a kite. It flew very high over the green hill.",
                              "Mia baked a cake with her dad. It was sweet and warm."};
    static const char *D[] = {"The little bird sang a song every morning by the window.",
                              "A big fish jumped out of the water and splashed the boat."};
    check_placement("after the arena (VMM)", LKV_PS_DEV_AFTER, 0, 0, 0, A);
    check_placement("below the arena (VMM)", LKV_PS_DEV_BELOW, 0, 1, 0, B);
    check_placement("plain, above", LKV_PS_DEV_OFFSET, 1, 0, (int64_t)(160u << 20) + 4096, C);
    check_placement("plain, below", LKV_PS_DEV_OFFSET, 1, 0, -(int64_t)(48u << 20) - 4096, D);
}

/* lkv_worker_unmap closes the imported arena and frees the worker pages (as the benchmark does
 * before replacing a daemon whose HBM the next one needs); the next request maps again and reads
 * the same documents in place with the same tokens; with a prefix pool set up it is refused. */
static void test_unmap(void)
{
    static const char *E[] = {"Max built a tower of blocks. It fell down with a loud crash.",
                              "The moon was round and bright over the quiet little town."};
    tdm t;
    tdm_init(&t, 0);
    t.profile = "stories260k";
    lkv_backend be = *lkv_backend_cpu();
    be.devmap = &t.ops;
    lkv_worker *local = make_worker(NULL, NULL);
    lkv_worker *w = make_worker(dm.addr, &be);
    lkv_rag_result ref, cold, warm;
    run_docs(local, E, 2, &ref);
    run_docs(w, E, 2, &cold);
    ASSERT_EQ(t.n_open, 1);
    ASSERT_EQ(t.n_close, 0);
    ASSERT_TRUE(t.n_alloc >= 1 && t.n_free == 0);
    ASSERT_OK(lkv_worker_unmap(w));
    ASSERT_EQ(t.n_close, 1);
    ASSERT_EQ(t.n_free, t.n_alloc);
    ASSERT_OK(lkv_worker_unmap(w)); /* Nothing mapped: nothing more to close. */
    ASSERT_EQ(t.n_close, 1);
    run_docs(w, E, 2, &warm);
    ASSERT_EQ(t.n_open, 2);
    ASSERT_EQ(warm.hit_docs, 2);
    same_tokens(&cold, &ref);
    same_tokens(&warm, &ref);
    for (int i = 0; i < 2; i++) {
        ASSERT_TRUE(warm.docs[i].kv_hash == cold.docs[i].kv_hash);
    }
    lkv_worker_stats st;
    lkv_worker_stats_get(w, &st);
    ASSERT_EQ(st.arena_maps, 2);
    ASSERT_OK(lkv_worker_prefix_setup(w, 8, 0));
    ASSERT_ERR(lkv_worker_unmap(w), LKV_EBUSY);
    ASSERT_EQ(t.n_close, 1);
    ASSERT_OK(lkv_worker_prefix_setup(w, 0, 0));
    lkv_rag_result_free(&ref);
    lkv_rag_result_free(&cold);
    lkv_rag_result_free(&warm);
    lkv_worker_destroy(w);
    lkv_worker_destroy(local);
    ASSERT_EQ(t.n_close, 2);
    ASSERT_EQ(t.n_free, t.n_alloc);
}

int main(void)
{
    const char *args[] = {LKV_IT_PROFILE_ARGS, "--set", "hot_backend=host", NULL};
    lkv_daemon_init(&dm, args);
    lkv_it_start(&dm);
    LKV_RUN(test_placements);
    LKV_RUN(test_unmap);
    lkv_daemon_cleanup(&dm);
    return 0;
}
