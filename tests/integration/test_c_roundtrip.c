/*
 * test_c_roundtrip.c: integration.c_roundtrip. A real lazykvd driven by the C client: put
 * multi-block documents (partial last block) by streaming and one-shot, look many up in one
 * call, get them back byte-identical (by key and by tokens, callback, buffer, and into the
 * caller's buffer, lkv_client_get_into: exact fit, a byte short), delete, and
 * messages over 4 MiB (three 2 MiB llama-3.1-8b blocks in one Put message); the same handle
 * used by several threads at once.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "lkv_client.h"
#include "lkv_daemon_harness.h"
#include "lkv_it_util.h"
#include "lkv_log.h"
#include "lkv_test.h"

static lkv_daemon dm;
static lkv_client_t *cl;

/* Gets d by ref and checks the header and every byte. */
static void check_get(const it_shape *s, const it_doc *d, const lkv_docref *ref, const uint8_t *key)
{
    lkv_get_header h;
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = lkv_client_get_buf(cl, ref, 0, &h, &data, &len);
    if (rc != 0) {
        LKV_FAIL("get: %s: %s", lkv_err_name(rc), lkv_client_last_error());
    }
    ASSERT_EQ(h.n_tokens, d->n_tokens);
    ASSERT_EQ(h.n_blocks, d->n_blocks);
    ASSERT_EQ(h.block_bytes, d->block_bytes);
    ASSERT_EQ(h.block_tokens, s->block_tokens);
    ASSERT_TRUE(strcmp(h.profile, s->profile) == 0);
    ASSERT_TRUE(memcmp(h.key, key, LKV_KEY_BYTES) == 0);
    ASSERT_EQ(len, d->n_blocks * d->block_bytes);
    ASSERT_TRUE(memcmp(data, d->blocks, len) == 0);
    free(data);

    /* Into the caller's buffer: poisoned first, so every byte must have been written; a byte
     * short is LKV_ETOOBIG with the header filled in and nothing written. */
    size_t need = (size_t)d->n_blocks * d->block_bytes;
    uint8_t *buf = malloc(need + 64);
    memset(buf, 0xEE, need + 64);
    lkv_get_header h2;
    memset(&h2, 0, sizeof(h2));
    size_t got = 1;
    ASSERT_ERR(lkv_client_get_into(cl, ref, 0, &h2, buf, need - 1, &got), LKV_ETOOBIG);
    ASSERT_EQ(got, 0);
    ASSERT_EQ(h2.n_blocks, d->n_blocks);
    ASSERT_EQ(h2.block_bytes, d->block_bytes);
    ASSERT_TRUE(lkv_client_last_error()[0] != '\0');
    ASSERT_EQ(buf[0], 0xEE);
    rc = lkv_client_get_into(cl, ref, 0, &h2, buf, need + 64, &got);
    if (rc != 0) {
        LKV_FAIL("get_into: %s: %s", lkv_err_name(rc), lkv_client_last_error());
    }
    ASSERT_EQ(got, need);
    ASSERT_TRUE(memcmp(h2.key, key, LKV_KEY_BYTES) == 0);
    ASSERT_TRUE(memcmp(buf, d->blocks, need) == 0);
    ASSERT_EQ(buf[need], 0xEE); /* Not a byte past the document. */
    ASSERT_EQ(buf[need + 63], 0xEE);
    free(buf);
}

static void test_ping(void)
{
    ASSERT_OK(lkv_client_ping(cl, "", 0));
    ASSERT_OK(lkv_client_ping(cl, NULL, 0));
}

typedef struct count_ctx {
    uint32_t blocks;   /* Blocks seen. */
    int headers;       /* Header callbacks seen. */
    const it_doc *doc; /* Expected content. */
    int stop_after;    /* Return 1 after this many blocks (0: never). */
} count_ctx;

static int count_cb(void *ctx, const lkv_get_header *h, uint32_t index, const void *data,
                    size_t len)
{
    count_ctx *c = ctx;
    if (data == NULL) {
        c->headers++;
        ASSERT_EQ(h->n_blocks, c->doc->n_blocks);
        return 0;
    }
    ASSERT_EQ(index, c->blocks);
    ASSERT_EQ(len, c->doc->block_bytes);
    ASSERT_TRUE(memcmp(data, c->doc->blocks + (size_t)index * len, len) == 0);
    c->blocks++;
    return c->stop_after > 0 && (int)c->blocks >= c->stop_after;
}

static void test_roundtrip_itest(void)
{
    const it_shape *s = &lkv_it_itest;
    enum { N = 7 };
    static const uint32_t lens[N] = {1, 15, 16, 17, 37, 100, 250};
    it_doc docs[N];
    lkv_put_reply rep[N];
    for (int i = 0; i < N; i++) {
        lkv_it_doc_make(s, 100 + (uint64_t)i, lens[i], &docs[i]);
        it_doc *d = &docs[i];
        if (i % 2 == 0) {
            lkv_put_t *p = NULL;
            ASSERT_OK(
                lkv_client_put_begin(cl, s->profile, d->tokens, d->n_tokens, d->n_blocks, 0, &p));
            for (uint32_t b = 0; b < d->n_blocks; b++) {
                ASSERT_OK(lkv_put_block(p, b, d->blocks + b * d->block_bytes, d->block_bytes));
            }
            int rc = lkv_put_finish(p, &rep[i]);
            if (rc != 0) {
                LKV_FAIL("put %d: %s: %s", i, lkv_err_name(rc), lkv_client_last_error());
            }
        } else {
            int rc = lkv_client_put(cl, s->profile, d->tokens, d->n_tokens, d->blocks, d->n_blocks,
                                    d->block_bytes, 0, &rep[i]);
            if (rc != 0) {
                LKV_FAIL("put %d: %s: %s", i, lkv_err_name(rc), lkv_client_last_error());
            }
        }
        ASSERT_EQ(rep[i].n_tokens, d->n_tokens);
        ASSERT_EQ(rep[i].n_blocks, d->n_blocks);
        ASSERT_EQ(rep[i].already_present, 0);
        ASSERT_EQ(rep[i].durability, LKV_WIRE_DURABILITY_HOT); /* write-back default */
    }
    /* Keys are distinct and stable: the same tokens give the same key. */
    for (int i = 0; i < N; i++) {
        for (int j = i + 1; j < N; j++) {
            ASSERT_TRUE(memcmp(rep[i].key, rep[j].key, LKV_KEY_BYTES) != 0);
        }
    }
    lkv_put_reply again;
    ASSERT_OK(lkv_client_put(cl, s->profile, docs[4].tokens, docs[4].n_tokens, docs[4].blocks,
                             docs[4].n_blocks, docs[4].block_bytes, 0, &again));
    ASSERT_EQ(again.already_present, 1);
    ASSERT_TRUE(memcmp(again.key, rep[4].key, LKV_KEY_BYTES) == 0);

    /* Lookup many in one call: all N by alternating key / tokens, plus two absent ones. */
    it_doc absent;
    lkv_it_doc_make(s, 999, 20, &absent);
    uint8_t absent_key[LKV_KEY_BYTES];
    memset(absent_key, 0xab, sizeof(absent_key));
    lkv_docref refs[N + 2];
    for (int i = 0; i < N; i++) {
        refs[i] = lkv_it_ref(s, &docs[i]);
        if (i % 2 == 1) {
            refs[i].key = rep[i].key;
        }
    }
    refs[N] = lkv_it_ref(s, &absent);
    refs[N + 1] = (lkv_docref){absent_key, NULL, NULL, 0};
    lkv_doc_status st[N + 2];
    ASSERT_OK(lkv_client_lookup(cl, refs, N + 2, 0, st));
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(st[i].present, 1);
        ASSERT_EQ(st[i].tier, LKV_WIRE_TIER_HOT);
        ASSERT_EQ(st[i].n_tokens, docs[i].n_tokens);
        ASSERT_EQ(st[i].n_blocks, docs[i].n_blocks);
        ASSERT_TRUE(memcmp(st[i].key, rep[i].key, LKV_KEY_BYTES) == 0);
        ASSERT_EQ(st[i].miss_cause, 0);
    }
    ASSERT_EQ(st[N].present, 0);
    ASSERT_EQ(st[N].tier, LKV_WIRE_TIER_ABSENT);
    ASSERT_EQ(st[N + 1].present, 0);
    ASSERT_TRUE(memcmp(st[N + 1].key, absent_key, LKV_KEY_BYTES) == 0);

    /* Get every document back, by key and by tokens; and through the callback API. */
    for (int i = 0; i < N; i++) {
        lkv_docref by_tokens = lkv_it_ref(s, &docs[i]);
        lkv_docref by_key = {rep[i].key, NULL, NULL, 0};
        check_get(s, &docs[i], &by_tokens, rep[i].key);
        check_get(s, &docs[i], &by_key, rep[i].key);
        count_ctx cc = {0, 0, &docs[i], 0};
        lkv_get_header h;
        ASSERT_OK(lkv_client_get(cl, &by_key, 0, &h, count_cb, &cc));
        ASSERT_EQ(cc.headers, 1);
        ASSERT_EQ(cc.blocks, docs[i].n_blocks);
    }
    /* Pull-style: lkv_client_get_begin / lkv_get_next / lkv_get_end, whole and stopped early. */
    for (int stop = 0; stop < 2; stop++) {
        lkv_docref by_key = {rep[6].key, NULL, NULL, 0};
        lkv_get_t *g = NULL;
        lkv_get_header h;
        ASSERT_OK(lkv_client_get_begin(cl, &by_key, 0, &h, &g));
        ASSERT_EQ(h.n_blocks, docs[6].n_blocks);
        uint32_t seen = 0;
        for (;;) {
            uint32_t index = 0;
            const void *data = NULL;
            size_t len = 0;
            ASSERT_OK(lkv_get_next(g, &index, &data, &len));
            if (data == NULL) {
                break;
            }
            ASSERT_EQ(index, seen);
            ASSERT_EQ(len, docs[6].block_bytes);
            ASSERT_TRUE(memcmp(data, docs[6].blocks + (size_t)index * len, len) == 0);
            seen++;
            if (stop && seen == 3) {
                break;
            }
        }
        ASSERT_EQ(seen, stop ? 3 : docs[6].n_blocks);
        lkv_get_end(g);
    }
    {
        it_doc nope;
        lkv_it_doc_make(s, 31337, 9, &nope);
        lkv_docref r = lkv_it_ref(s, &nope);
        lkv_get_t *g = (lkv_get_t *)1;
        ASSERT_ERR(lkv_client_get_begin(cl, &r, 0, NULL, &g), LKV_ENOTFOUND);
        ASSERT_TRUE(g == NULL);
        lkv_it_doc_free(&nope);
    }
    /* A caller that stops early cancels the stream; the daemon carries on. */
    {
        count_ctx cc = {0, 0, &docs[6], 2};
        lkv_docref by_key = {rep[6].key, NULL, NULL, 0};
        ASSERT_ERR(lkv_client_get(cl, &by_key, 0, NULL, count_cb, &cc), LKV_ECANCELLED);
        ASSERT_EQ(cc.blocks, 2);
        ASSERT_OK(lkv_client_ping(cl, "", 0));
    }

    /* Delete three (by key, by tokens, by key); they become misses, the rest stay intact. */
    uint8_t k[LKV_KEY_BYTES];
    lkv_docref del0 = {rep[0].key, NULL, NULL, 0};
    ASSERT_OK(lkv_client_delete(cl, &del0, 0, k));
    ASSERT_TRUE(memcmp(k, rep[0].key, LKV_KEY_BYTES) == 0);
    lkv_docref del3 = lkv_it_ref(s, &docs[3]);
    ASSERT_OK(lkv_client_delete(cl, &del3, 0, k));
    ASSERT_TRUE(memcmp(k, rep[3].key, LKV_KEY_BYTES) == 0);
    lkv_docref del6 = {rep[6].key, NULL, NULL, 0};
    ASSERT_OK(lkv_client_delete(cl, &del6, 0, NULL));
    ASSERT_ERR(lkv_client_delete(cl, &del0, 0, NULL), LKV_ENOTFOUND);
    ASSERT_EQ(lkv_client_last_status(), 5 /* NOT_FOUND */);
    ASSERT_TRUE(lkv_client_last_error()[0] != '\0');
    ASSERT_ERR(
        lkv_client_get_buf(cl, &del3, 0, &(lkv_get_header){0}, &(uint8_t *){NULL}, &(size_t){0}),
        LKV_ENOTFOUND);
    ASSERT_OK(lkv_client_lookup(cl, refs, N, 0, st));
    for (int i = 0; i < N; i++) {
        int gone = i == 0 || i == 3 || i == 6;
        ASSERT_EQ(st[i].present, !gone);
        if (gone) {
            ASSERT_EQ(st[i].miss_cause, 4 /* MISS_CAUSE_DELETED */);
        } else {
            lkv_docref r = {rep[i].key, NULL, NULL, 0};
            check_get(s, &docs[i], &r, rep[i].key);
        }
    }
    for (int i = 0; i < N; i++) {
        lkv_it_doc_free(&docs[i]);
    }
    lkv_it_doc_free(&absent);
}

/* Three 2 MiB blocks in one Put message (6 MiB > gRPC's 4 MiB default), and a one-shot put of
 * a 5-block llama document; both read back intact. */
static void test_big_messages(void)
{
    const it_shape *s = &lkv_it_llama;
    it_doc d;
    lkv_it_doc_make(s, 7, 40, &d);
    ASSERT_EQ(d.n_blocks, 3);
    ASSERT_EQ(d.block_bytes, 2u << 20);
    lkv_put_t *p = NULL;
    ASSERT_OK(lkv_client_put_begin(cl, s->profile, d.tokens, d.n_tokens, 0, 0, &p));
    ASSERT_OK(lkv_put_blocks(p, 0, 3, d.blocks, d.block_bytes));
    lkv_put_reply r;
    int rc = lkv_put_finish(p, &r);
    if (rc != 0) {
        LKV_FAIL("6 MiB put: %s: %s", lkv_err_name(rc), lkv_client_last_error());
    }
    ASSERT_EQ(r.n_blocks, 3);
    lkv_docref ref = {r.key, NULL, NULL, 0};
    check_get(s, &d, &ref, r.key);

    it_doc d2;
    lkv_it_doc_make(s, 8, 70, &d2);
    lkv_put_reply r2;
    ASSERT_OK(lkv_client_put(cl, s->profile, d2.tokens, d2.n_tokens, d2.blocks, d2.n_blocks,
                             d2.block_bytes, 0, &r2));
    lkv_docref ref2 = lkv_it_ref(s, &d2);
    check_get(s, &d2, &ref2, r2.key);
    /* A client whose max message is below one block cannot receive it: LKV_ETOOBIG, with the
     * reason, and the handle stays usable. */
    lkv_client_options o = {0};
    o.max_message_bytes = 1u << 20;
    lkv_client_t *small = NULL;
    ASSERT_OK(lkv_client_create(dm.addr, &o, &small));
    uint8_t *data = NULL;
    size_t len = 0;
    lkv_get_header h;
    ASSERT_ERR(lkv_client_get_buf(small, &ref, 0, &h, &data, &len), LKV_ETOOBIG);
    ASSERT_TRUE(lkv_client_last_error()[0] != '\0');
    ASSERT_ERR(lkv_client_put(small, s->profile, d.tokens, d.n_tokens, d.blocks, d.n_blocks,
                              d.block_bytes, 0, NULL),
               LKV_ETOOBIG);
    ASSERT_OK(lkv_client_ping(small, "", 0));
    lkv_client_destroy(small);
    ASSERT_OK(lkv_client_delete(cl, &ref, 0, NULL));
    ASSERT_OK(lkv_client_delete(cl, &ref2, 0, NULL));
    lkv_it_doc_free(&d);
    lkv_it_doc_free(&d2);
}

/* Several threads share one handle: put, lookup, get, delete their own documents. */
static void *thread_main(void *arg)
{
    uint64_t t = (uint64_t)(uintptr_t)arg;
    const it_shape *s = &lkv_it_itest;
    for (int i = 0; i < 12; i++) {
        it_doc d;
        lkv_it_doc_make(s, 10000 + t * 100 + (uint64_t)i, 5 + (uint32_t)(i * 13 % 70), &d);
        lkv_put_reply r;
        int rc = lkv_client_put(cl, s->profile, d.tokens, d.n_tokens, d.blocks, d.n_blocks,
                                d.block_bytes, 0, &r);
        if (rc != 0) {
            LKV_FAIL("thread %d put: %s: %s", (int)t, lkv_err_name(rc), lkv_client_last_error());
        }
        lkv_docref ref = lkv_it_ref(s, &d);
        lkv_doc_status st;
        ASSERT_OK(lkv_client_lookup(cl, &ref, 1, 0, &st));
        ASSERT_EQ(st.present, 1);
        check_get(s, &d, &ref, r.key);
        if (i % 3 == 0) {
            ASSERT_OK(lkv_client_delete(cl, &ref, 0, NULL));
        }
        lkv_it_doc_free(&d);
    }
    return NULL;
}

/* Two Put streams open at once on one thread, blocks interleaved; and one Lookup of 600
 * documents (200 present, 400 absent) in a single call. */
static void test_interleaved_and_many(void)
{
    const it_shape *s = &lkv_it_itest;
    it_doc a, b;
    lkv_it_doc_make(s, 300, 50, &a);
    lkv_it_doc_make(s, 301, 70, &b);
    lkv_put_t *pa = NULL, *pb = NULL;
    ASSERT_OK(lkv_client_put_begin(cl, s->profile, a.tokens, a.n_tokens, 0, 0, &pa));
    ASSERT_OK(lkv_client_put_begin(cl, s->profile, b.tokens, b.n_tokens, 0, 0, &pb));
    for (uint32_t i = 0; i < b.n_blocks; i++) {
        if (i < a.n_blocks) {
            ASSERT_OK(lkv_put_block(pa, i, a.blocks + i * a.block_bytes, a.block_bytes));
        }
        ASSERT_OK(lkv_put_block(pb, i, b.blocks + i * b.block_bytes, b.block_bytes));
    }
    lkv_put_reply ra, rb;
    ASSERT_OK(lkv_put_finish(pb, &rb));
    ASSERT_OK(lkv_put_finish(pa, &ra));
    lkv_docref refa = lkv_it_ref(s, &a), refb = lkv_it_ref(s, &b);
    check_get(s, &a, &refa, ra.key);
    check_get(s, &b, &refb, rb.key);

    enum { M = 600 };
    it_doc *docs = lkv_xcalloc(M, sizeof(*docs));
    lkv_docref *refs = lkv_xcalloc(M, sizeof(*refs));
    lkv_doc_status *st = lkv_xcalloc(M, sizeof(*st));
    for (int i = 0; i < M; i++) {
        lkv_it_doc_make(s, 5000 + (uint64_t)i, 3 + (uint32_t)(i % 20), &docs[i]);
        refs[i] = lkv_it_ref(s, &docs[i]);
        if (i % 3 == 0) {
            ASSERT_OK(lkv_client_put(cl, s->profile, docs[i].tokens, docs[i].n_tokens,
                                     docs[i].blocks, docs[i].n_blocks, docs[i].block_bytes, 0,
                                     NULL));
        }
    }
    ASSERT_OK(lkv_client_lookup(cl, refs, M, 0, st));
    for (int i = 0; i < M; i++) {
        ASSERT_EQ(st[i].present, i % 3 == 0);
        ASSERT_EQ(st[i].n_tokens, i % 3 == 0 ? docs[i].n_tokens : 0);
    }
    for (int i = 0; i < M; i++) {
        if (i % 3 == 0) {
            ASSERT_OK(lkv_client_delete(cl, &refs[i], 0, NULL));
        }
        lkv_it_doc_free(&docs[i]);
    }
    free(st);
    free(refs);
    free(docs);
    lkv_it_doc_free(&a);
    lkv_it_doc_free(&b);
}

static void test_threads(void)
{
    pthread_t th[4];
    for (uintptr_t i = 0; i < 4; i++) {
        ASSERT_EQ(pthread_create(&th[i], NULL, thread_main, (void *)i), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
    }
}

/* A deadline that has passed is reported as LKV_ETIMEDOUT, with the status kept. */
static void test_unreachable(void)
{
    lkv_client_options o = {0};
    o.default_deadline_ms = 2000;
    lkv_client_t *c2 = NULL;
    ASSERT_OK(lkv_client_create("127.0.0.1:1", &o, &c2));
    int rc = lkv_client_ping(c2, "", 0);
    ASSERT_TRUE(rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT);
    ASSERT_TRUE(lkv_client_last_error()[0] != '\0');
    lkv_client_destroy(c2);
}

int main(void)
{
    const char *args[] = {LKV_IT_PROFILE_ARGS, NULL};
    lkv_daemon_init(&dm, args);
    lkv_it_start(&dm);
    cl = lkv_it_client(&dm);
    LKV_RUN(test_ping);
    LKV_RUN(test_roundtrip_itest);
    LKV_RUN(test_big_messages);
    LKV_RUN(test_interleaved_and_many);
    LKV_RUN(test_threads);
    LKV_RUN(test_unreachable);
    lkv_client_destroy(cl);
    int st = lkv_daemon_stop(&dm, SIGTERM, 15000);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    lkv_daemon_cleanup(&dm);
    return 0;
}
