/*
 * test_c_concurrency.c: integration.c_concurrency. Races a real lazykvd must get right:
 *   - several clients put the same document at once: every Put succeeds, the stored document is
 *     intact, and at least one reply says it stored it (already_present == 0). (Each Put in
 *     flight reserves hot pages for the whole document, even for the same key, so the writers
 *     together stay within the hot budget: more would be a legitimate RESOURCE_EXHAUSTED.)
 *   - readers Get a document while writers delete and re-put it: every Get returns either the
 *     whole document byte-identical or NOT_FOUND, never a short, torn or mixed stream (the client
 *     checks block order, sizes and count; the test checks every byte);
 *   - the hot tier under pressure (documents evicted to the cold tier while being read); a Put
 *     refused with RESOURCE_EXHAUSTED because pages are pinned or in flight is allowed there
 *     (counted and printed), since the store's contract says so.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "lkv_client.h"
#include "lkv_daemon_harness.h"
#include "lkv_it_util.h"
#include "lkv_test.h"

static lkv_daemon dm;
static lkv_client_t *cl;
static const it_shape *S = &lkv_it_itest;

/* ---- same document, many writers ---- */

typedef struct same_arg {
    const it_doc *doc;      /* Shared document. */
    lkv_client_t *c;        /* Own handle (own connection) or the shared one. */
    lkv_put_reply reply;    /* Result. */
    int rc;                 /* Result code. */
    pthread_barrier_t *bar; /* Start line. */
} same_arg;

static void *same_writer(void *p)
{
    same_arg *a = p;
    pthread_barrier_wait(a->bar);
    a->rc = lkv_client_put(a->c, S->profile, a->doc->tokens, a->doc->n_tokens, a->doc->blocks,
                           a->doc->n_blocks, a->doc->block_bytes, 0, &a->reply);
    return NULL;
}

static void test_same_document(void)
{
    enum { W = 6 };
    for (int round = 0; round < 5; round++) {
        it_doc d;
        lkv_it_doc_make(S, 7000 + (uint64_t)round, 40, &d); /* 3 pages x 6 writers fit */
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, W);
        same_arg a[W];
        pthread_t th[W];
        for (int i = 0; i < W; i++) {
            memset(&a[i], 0, sizeof(a[i]));
            a[i].doc = &d;
            a[i].bar = &bar;
            a[i].c = i % 2 ? cl : lkv_it_client(&dm);
            ASSERT_EQ(pthread_create(&th[i], NULL, same_writer, &a[i]), 0);
        }
        int stored = 0;
        for (int i = 0; i < W; i++) {
            pthread_join(th[i], NULL);
            if (a[i].rc != 0) {
                LKV_FAIL("concurrent put %d: %s", i, lkv_err_name(a[i].rc));
            }
            stored += !a[i].reply.already_present;
            ASSERT_TRUE(memcmp(a[i].reply.key, a[0].reply.key, LKV_KEY_BYTES) == 0);
            if (i % 2 == 0) {
                lkv_client_destroy(a[i].c);
            }
        }
        pthread_barrier_destroy(&bar);
        ASSERT_TRUE(stored >= 1);
        lkv_docref ref = lkv_it_ref(S, &d);
        lkv_get_header h;
        uint8_t *data = NULL;
        size_t len = 0;
        ASSERT_OK(lkv_client_get_buf(cl, &ref, 0, &h, &data, &len));
        ASSERT_EQ(len, d.n_blocks * d.block_bytes);
        ASSERT_TRUE(memcmp(data, d.blocks, len) == 0);
        free(data);
        ASSERT_OK(lkv_client_delete(cl, &ref, 0, NULL));
        lkv_it_doc_free(&d);
    }
}

/* ---- readers against delete + re-put ---- */

static atomic_int stop_flag;
static atomic_int n_whole, n_missing, n_nospc;
static it_doc churn_doc[3];

static void *reader(void *p)
{
    lkv_client_t *c = p;
    for (int i = 0; !atomic_load(&stop_flag); i++) {
        const it_doc *d = &churn_doc[i % 3];
        lkv_docref ref = lkv_it_ref(S, d);
        lkv_get_header h;
        uint8_t *data = NULL;
        size_t len = 0;
        int rc = lkv_client_get_buf(c, &ref, 0, &h, &data, &len);
        if (rc == 0) {
            if (len != d->n_blocks * d->block_bytes || memcmp(data, d->blocks, len) != 0) {
                LKV_FAIL("Get during churn returned different bytes");
            }
            atomic_fetch_add(&n_whole, 1);
        } else if (rc == LKV_ENOTFOUND) {
            atomic_fetch_add(&n_missing, 1);
        } else {
            LKV_FAIL("Get during churn: %s: %s", lkv_err_name(rc), lkv_client_last_error());
        }
        free(data);
    }
    return NULL;
}

static void *churner(void *p)
{
    lkv_client_t *c = p;
    for (int i = 0; !atomic_load(&stop_flag); i++) {
        const it_doc *d = &churn_doc[i % 3];
        lkv_docref ref = lkv_it_ref(S, d);
        int rc = lkv_client_delete(c, &ref, 0, NULL);
        ASSERT_TRUE(rc == 0 || rc == LKV_ENOTFOUND);
        rc = lkv_client_put(c, S->profile, d->tokens, d->n_tokens, d->blocks, d->n_blocks,
                            d->block_bytes, 0, NULL);
        if (rc == LKV_ENOSPC) {
            atomic_fetch_add(&n_nospc, 1);
        } else if (rc != 0) {
            LKV_FAIL("put during churn: %s: %s", lkv_err_name(rc), lkv_client_last_error());
        }
    }
    return NULL;
}

/* Filler: puts many other documents so that the churned ones move between tiers. */
static void *filler(void *p)
{
    lkv_client_t *c = p;
    for (int i = 0; !atomic_load(&stop_flag); i++) {
        it_doc d;
        lkv_it_doc_make(S, 90000 + (uint64_t)i, 64, &d);
        int rc = lkv_client_put(c, S->profile, d.tokens, d.n_tokens, d.blocks, d.n_blocks,
                                d.block_bytes, 0, NULL);
        if (rc == LKV_ENOSPC) {
            atomic_fetch_add(&n_nospc, 1);
        } else if (rc != 0) {
            LKV_FAIL("filler put: %s: %s", lkv_err_name(rc), lkv_client_last_error());
        }
        lkv_it_doc_free(&d);
    }
    return NULL;
}

static void test_churn(void)
{
    for (int i = 0; i < 3; i++) {
        lkv_it_doc_make(S, 8000 + (uint64_t)i, 60 + 30 * (uint32_t)i, &churn_doc[i]);
        ASSERT_OK(lkv_client_put(cl, S->profile, churn_doc[i].tokens, churn_doc[i].n_tokens,
                                 churn_doc[i].blocks, churn_doc[i].n_blocks,
                                 churn_doc[i].block_bytes, 0, NULL));
    }
    lkv_client_t *c2 = lkv_it_client(&dm), *c3 = lkv_it_client(&dm);
    pthread_t th[5];
    ASSERT_EQ(pthread_create(&th[0], NULL, reader, cl), 0);
    ASSERT_EQ(pthread_create(&th[1], NULL, reader, c2), 0);
    ASSERT_EQ(pthread_create(&th[2], NULL, churner, c3), 0);
    ASSERT_EQ(pthread_create(&th[3], NULL, churner, cl), 0);
    ASSERT_EQ(pthread_create(&th[4], NULL, filler, c2), 0);
    struct timespec ts = {2, 500000000};
    nanosleep(&ts, NULL);
    atomic_store(&stop_flag, 1);
    for (int i = 0; i < 5; i++) {
        pthread_join(th[i], NULL);
    }
    fprintf(stderr, "   %d whole gets, %d not found, %d puts refused for space\n",
            atomic_load(&n_whole), atomic_load(&n_missing), atomic_load(&n_nospc));
    ASSERT_TRUE(atomic_load(&n_whole) > 0);
    lkv_client_destroy(c2);
    lkv_client_destroy(c3);
    for (int i = 0; i < 3; i++) {
        lkv_it_doc_free(&churn_doc[i]);
    }
}

int main(void)
{
    /* 32 pages of hot tier: the filler pushes documents to the cold tier. */
    const char *args[] = {LKV_IT_PROFILE_ARGS, "--set", "hot_bytes=64MiB", NULL};
    lkv_daemon_init(&dm, args);
    lkv_it_start(&dm);
    cl = lkv_it_client(&dm);
    LKV_RUN(test_same_document);
    LKV_RUN(test_churn);
    ASSERT_OK(lkv_client_ping(cl, "", 0));
    lkv_client_destroy(cl);
    int st = lkv_daemon_stop(&dm, SIGTERM, 20000);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    lkv_daemon_cleanup(&dm);
    return 0;
}
