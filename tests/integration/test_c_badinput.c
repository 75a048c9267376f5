/*
 * test_c_badinput.c: integration.c_badinput. Every kind of bad Put/Get/Delete input sent
 * through the C client to a real lazykvd gets the right gRPC status, a message naming the
 * problem, and changes nothing (the document stays absent, the daemon keeps serving): wrong
 * block size, missing / extra / out-of-order / duplicate blocks, a header block count that
 * disagrees with the tokens, token ids out of vocabulary, an unknown profile, no tokens, an
 * unknown document, a message over the daemon's max_message_bytes, the hot budget exhausted,
 * a Put cancelled mid-stream, a client process that dies mid-stream, and a deadline that
 * passes mid-stream. (Malformed protobuf bytes are sent by the Python test, which can send
 * raw bytes.)
 *
 * The daemon runs with max_message_bytes=5MiB and hot_bytes=16MiB (8 pages of 2 MiB, the
 * llama-3.1-8b block size, which sets the page size of the arena).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lkv_client.h"
#include "lkv_daemon_harness.h"
#include "lkv_it_util.h"
#include "lkv_log.h"
#include "lkv_test.h"

#define ST_INVALID_ARGUMENT   3
#define ST_DEADLINE_EXCEEDED  4
#define ST_NOT_FOUND          5
#define ST_RESOURCE_EXHAUSTED 8

static lkv_daemon dm;
static lkv_client_t *cl;
static const it_shape *S = &lkv_it_itest;

static int n_failed; /* Failed expectations (each is reported; the test fails at the end). */

/* Checks that the last call failed with rc want, gRPC status st, and that its message
 * contains every word of words (NULL-terminated; case-insensitive). A mismatch is reported
 * and counted, and the test goes on, so that one run lists every wrong answer. */
static void expect(int rc, int want, int st, const char *const *words, const char *what)
{
    const char *msg = lkv_client_last_error();
    fprintf(stderr, "   %s -> %s, status %d: %s\n", what, lkv_err_name(rc),
            lkv_client_last_status(), msg);
    if (rc != want) {
        fprintf(stderr, "FAIL: %s: got %s, want %s\n", what, lkv_err_name(rc), lkv_err_name(want));
        n_failed++;
        return;
    }
    if (lkv_client_last_status() != st) {
        fprintf(stderr, "FAIL: %s: gRPC status %d, want %d\n", what, lkv_client_last_status(), st);
        n_failed++;
        return;
    }
    for (int i = 0; words != NULL && words[i] != NULL; i++) {
        if (!lkv_it_contains(msg, words[i])) {
            fprintf(stderr, "FAIL: %s: the message does not mention \"%s\"\n", what, words[i]);
            n_failed++;
        }
    }
}

/* Asserts that d (named by tokens under profile) is absent. */
static void expect_absent(const char *profile, const it_doc *d)
{
    lkv_docref r = {NULL, profile, d->tokens, d->n_tokens};
    lkv_doc_status st;
    int rc = lkv_client_lookup(cl, &r, 1, 0, &st);
    if (rc == LKV_EINVAL) {
        return; /* The reference itself is invalid (bad profile or token): cannot be present. */
    }
    ASSERT_OK(rc);
    ASSERT_EQ(st.present, 0);
}

/* Puts d's blocks in the order given by idx (n entries; size override for one block). */
static int put_seq(const char *profile, const it_doc *d, uint32_t hdr_blocks, const int *idx, int n,
                   int bad_at, size_t bad_len)
{
    lkv_put_t *p = NULL;
    ASSERT_OK(lkv_client_put_begin(cl, profile, d->tokens, d->n_tokens, hdr_blocks, 0, &p));
    for (int i = 0; i < n; i++) {
        uint32_t b = (uint32_t)idx[i];
        const uint8_t *data = d->blocks + (size_t)(b % d->n_blocks) * d->block_bytes;
        size_t len = i == bad_at ? bad_len : d->block_bytes;
        uint8_t *tmp = NULL;
        if (len > d->block_bytes) { /* An oversize block: the real one, then more bytes. */
            tmp = lkv_xcalloc(len, 1);
            memcpy(tmp, data, d->block_bytes);
            memset(tmp + d->block_bytes, 0x11, len - d->block_bytes);
            data = tmp;
        }
        int rc = lkv_put_block(p, b, data, len);
        free(tmp);
        if (rc != 0) {
            /* The daemon refused early; finish returns the same error. */
            ASSERT_ERR(lkv_put_finish(p, NULL), rc);
            return rc;
        }
    }
    return lkv_put_finish(p, NULL);
}

static void test_block_errors(void)
{
    it_doc d;
    lkv_it_doc_make(S, 1, 37, &d); /* 3 blocks of 2048 bytes. */
    ASSERT_EQ(d.n_blocks, 3);
    static const int ok3[] = {0, 1, 2}, miss[] = {0, 1}, extra[] = {0, 1, 2, 3},
                     order[] = {0, 2, 1}, dup[] = {0, 1, 1}, start1[] = {1, 2, 3};
    const char *w_size[] = {"2048", "2047", NULL};
    const char *w_block[] = {"block", NULL};
    const char *w_index[] = {"index", NULL};

    expect(put_seq(S->profile, &d, 3, ok3, 3, 1, 2047), LKV_EINVAL, ST_INVALID_ARGUMENT, w_size,
           "block 1 of 2047 bytes");
    expect_absent(S->profile, &d);
    expect(put_seq(S->profile, &d, 3, ok3, 3, 2, 4096), LKV_EINVAL, ST_INVALID_ARGUMENT,
           (const char *[]){"2048", "4096", NULL}, "block 2 of 4096 bytes");
    expect_absent(S->profile, &d);
    expect(put_seq(S->profile, &d, 3, ok3, 3, 0, 0), LKV_EINVAL, ST_INVALID_ARGUMENT,
           (const char *[]){"2048", NULL}, "empty block 0");
    expect_absent(S->profile, &d);
    expect(put_seq(S->profile, &d, 3, miss, 2, -1, 0), LKV_EINVAL, ST_INVALID_ARGUMENT, w_block,
           "2 of 3 blocks then close");
    expect_absent(S->profile, &d);
    expect(put_seq(S->profile, &d, 0, miss, 0, -1, 0), LKV_EINVAL, ST_INVALID_ARGUMENT, w_block,
           "header only then close");
    expect_absent(S->profile, &d);
    expect(put_seq(S->profile, &d, 3, extra, 4, -1, 0), LKV_EINVAL, ST_INVALID_ARGUMENT, w_index,
           "4 blocks for a 3-block document");
    expect_absent(S->profile, &d);
    expect(put_seq(S->profile, &d, 3, order, 3, -1, 0), LKV_EINVAL, ST_INVALID_ARGUMENT, w_index,
           "blocks 0,2,1");
    expect_absent(S->profile, &d);
    expect(put_seq(S->profile, &d, 3, dup, 3, -1, 0), LKV_EINVAL, ST_INVALID_ARGUMENT, w_index,
           "blocks 0,1,1");
    expect_absent(S->profile, &d);
    expect(put_seq(S->profile, &d, 3, start1, 3, -1, 0), LKV_EINVAL, ST_INVALID_ARGUMENT, w_index,
           "blocks 1,2,3");
    expect_absent(S->profile, &d);
    expect(put_seq(S->profile, &d, 5, ok3, 3, -1, 0), LKV_EINVAL, ST_INVALID_ARGUMENT,
           (const char *[]){"5", "3", NULL}, "header says 5 blocks, tokens need 3");
    expect_absent(S->profile, &d);
    /* The refusal reaches the client before its next send (a ping on the same channel reads
     * it): the next send fails and the client must report the daemon's status at once, not
     * hang until the deadline (regression: RECV_STATUS_ON_CLIENT alone waited for the
     * deadline when the initial metadata had not been asked for). */
    {
        lkv_put_t *p = NULL;
        ASSERT_OK(lkv_client_put_begin(cl, S->profile, d.tokens, d.n_tokens, 3, 0, &p));
        ASSERT_OK(lkv_put_block(p, 0, d.blocks, d.block_bytes));
        ASSERT_OK(lkv_put_block(p, 1, d.blocks + d.block_bytes, d.block_bytes - 1));
        ASSERT_OK(lkv_client_ping(cl, "", 0));
        usleep(50000);
        ASSERT_OK(lkv_client_ping(cl, "", 0));
        time_t t0 = time(NULL);
        int rc = lkv_put_block(p, 2, d.blocks + 2 * d.block_bytes, d.block_bytes);
        int rc2 = lkv_put_finish(p, NULL);
        ASSERT_TRUE(rc == 0 || rc == rc2);
        expect(rc2, LKV_EINVAL, ST_INVALID_ARGUMENT, w_size, "refusal read before the next send");
        ASSERT_TRUE(time(NULL) - t0 < 5);
        expect_absent(S->profile, &d);
    }
    /* The same document, sent correctly, is accepted afterwards (nothing half-stored). */
    lkv_put_reply r;
    ASSERT_OK(put_seq(S->profile, &d, 3, ok3, 3, -1, 0));
    ASSERT_OK(lkv_client_put(cl, S->profile, d.tokens, d.n_tokens, d.blocks, d.n_blocks,
                             d.block_bytes, 0, &r));
    ASSERT_EQ(r.already_present, 1);
    lkv_docref ref = lkv_it_ref(S, &d);
    ASSERT_OK(lkv_client_delete(cl, &ref, 0, NULL));
    lkv_it_doc_free(&d);
}

static void test_header_errors(void)
{
    it_doc d;
    lkv_it_doc_make(S, 2, 20, &d);
    static const int ok2[] = {0, 1};
    /* Token id out of vocabulary (1000 for a vocab of 1000). */
    d.tokens[7] = 1000;
    expect(put_seq(S->profile, &d, 2, ok2, 2, -1, 0), LKV_EINVAL, ST_INVALID_ARGUMENT,
           (const char *[]){"1000", "vocab", NULL}, "token id 1000 >= vocab 1000");
    expect_absent(S->profile, &d);
    d.tokens[7] = 0xffffffffu;
    expect(put_seq(S->profile, &d, 2, ok2, 2, -1, 0), LKV_EINVAL, ST_INVALID_ARGUMENT,
           (const char *[]){"4294967295", NULL}, "token id 2^32-1");
    d.tokens[7] = 5;
    /* Unknown profile: the message names it and lists the known ones. */
    /* The exact code (lkv-code metadata) under the INVALID_ARGUMENT status. */
    expect(put_seq("nosuch-model", &d, 2, ok2, 2, -1, 0), LKV_EPROFILE, ST_INVALID_ARGUMENT,
           (const char *[]){"nosuch-model", "itest", NULL}, "unknown profile");
    expect_absent(S->profile, &d);
    /* No tokens at all. */
    lkv_put_t *p = NULL;
    ASSERT_OK(lkv_client_put_begin(cl, S->profile, d.tokens, 0, 0, 0, &p));
    expect(lkv_put_finish(p, NULL), LKV_EINVAL, ST_INVALID_ARGUMENT,
           (const char *[]){"token", NULL}, "no tokens");
    /* Lookup / get / delete with an unknown profile or a bad token: INVALID_ARGUMENT. */
    lkv_docref bad = {NULL, "nosuch-model", d.tokens, d.n_tokens};
    lkv_doc_status st;
    expect(lkv_client_lookup(cl, &bad, 1, 0, &st), LKV_EPROFILE, ST_INVALID_ARGUMENT,
           (const char *[]){"nosuch-model", NULL}, "lookup with unknown profile");
    uint8_t *data = NULL;
    size_t len = 0;
    lkv_get_header h;
    expect(lkv_client_get_buf(cl, &bad, 0, &h, &data, &len), LKV_EPROFILE, ST_INVALID_ARGUMENT,
           (const char *[]){"nosuch-model", NULL}, "get with unknown profile");
    lkv_it_doc_free(&d);
}

static void test_unknown_document(void)
{
    it_doc d;
    lkv_it_doc_make(S, 3, 50, &d);
    lkv_docref by_tokens = lkv_it_ref(S, &d);
    uint8_t key[LKV_KEY_BYTES];
    memset(key, 0x5a, sizeof(key));
    lkv_docref by_key = {key, NULL, NULL, 0};
    uint8_t *data = NULL;
    size_t len = 0;
    lkv_get_header h;
    expect(lkv_client_get_buf(cl, &by_tokens, 0, &h, &data, &len), LKV_ENOTFOUND, ST_NOT_FOUND,
           NULL, "get unknown document by tokens");
    expect(lkv_client_get_buf(cl, &by_key, 0, &h, &data, &len), LKV_ENOTFOUND, ST_NOT_FOUND, NULL,
           "get unknown key");
    expect(lkv_client_delete(cl, &by_key, 0, NULL), LKV_ENOTFOUND, ST_NOT_FOUND, NULL,
           "delete unknown key");
    expect(lkv_client_delete(cl, &by_tokens, 0, NULL), LKV_ENOTFOUND, ST_NOT_FOUND, NULL,
           "delete unknown document");
    lkv_doc_status st[2];
    lkv_docref refs[2] = {by_tokens, by_key};
    ASSERT_OK(lkv_client_lookup(cl, refs, 2, 0, st));
    ASSERT_EQ(st[0].present, 0);
    ASSERT_EQ(st[1].present, 0);
    ASSERT_EQ(st[0].miss_cause, 1 /* MISS_CAUSE_UNKNOWN */);
    lkv_it_doc_free(&d);
}

/* A 6 MiB message (3 llama blocks) over the daemon's 5 MiB max. */
static void test_oversize(void)
{
    it_doc d;
    lkv_it_doc_make(&lkv_it_llama, 4, 48, &d);
    ASSERT_EQ(d.n_blocks, 3);
    lkv_put_t *p = NULL;
    ASSERT_OK(lkv_client_put_begin(cl, lkv_it_llama.profile, d.tokens, d.n_tokens, 3, 0, &p));
    int rc = lkv_put_blocks(p, 0, 3, d.blocks, d.block_bytes);
    int rc2 = lkv_put_finish(p, NULL);
    if (rc != 0) {
        ASSERT_EQ(rc2, rc);
    }
    expect(rc2, LKV_ETOOBIG, ST_RESOURCE_EXHAUSTED, (const char *[]){"larger than max", NULL},
           "6 MiB message, daemon max 5 MiB");
    expect_absent(lkv_it_llama.profile, &d);
    /* The same document in 2 MiB messages is fine. */
    lkv_put_reply r;
    ASSERT_OK(lkv_client_put(cl, lkv_it_llama.profile, d.tokens, d.n_tokens, d.blocks, d.n_blocks,
                             d.block_bytes, 0, &r));
    lkv_docref ref = lkv_it_ref(&lkv_it_llama, &d);
    ASSERT_OK(lkv_client_delete(cl, &ref, 0, NULL));
    lkv_it_doc_free(&d);
}

/* A document larger than the whole hot budget (9 pages > 8). */
static void test_budget(void)
{
    it_doc d;
    lkv_it_doc_make(S, 5, 9 * 16, &d);
    ASSERT_EQ(d.n_blocks, 9);
    int rc = lkv_client_put(cl, S->profile, d.tokens, d.n_tokens, d.blocks, d.n_blocks,
                            d.block_bytes, 0, NULL);
    /* It needs 9 pages of 2 MiB (the arena's page size) = 18 MiB: the message should say so. */
    expect(rc, LKV_ENOSPC, ST_RESOURCE_EXHAUSTED, (const char *[]){"hot", "18", NULL},
           "9-block document (18 MiB of pages), 8-page hot tier");
    expect_absent(S->profile, &d);
    /* Fill the tier, then one more: older documents are evicted (LRU), never a failure. */
    it_doc f[5];
    for (int i = 0; i < 5; i++) {
        lkv_it_doc_make(S, 50 + (uint64_t)i, 40, &f[i]); /* 3 pages each */
        ASSERT_OK(lkv_client_put(cl, S->profile, f[i].tokens, f[i].n_tokens, f[i].blocks,
                                 f[i].n_blocks, f[i].block_bytes, 0, NULL));
    }
    lkv_docref last = lkv_it_ref(S, &f[4]);
    lkv_doc_status st;
    ASSERT_OK(lkv_client_lookup(cl, &last, 1, 0, &st));
    ASSERT_EQ(st.present, 1);
    for (int i = 0; i < 5; i++) {
        lkv_docref r = lkv_it_ref(S, &f[i]);
        lkv_client_delete(cl, &r, 0, NULL);
        lkv_it_doc_free(&f[i]);
    }
    lkv_it_doc_free(&d);
}

/* lkv_put_abort mid-stream: nothing becomes visible; the document can be put afterwards. */
static void test_abort(void)
{
    it_doc d;
    lkv_it_doc_make(S, 6, 37, &d);
    lkv_put_t *p = NULL;
    ASSERT_OK(lkv_client_put_begin(cl, S->profile, d.tokens, d.n_tokens, 3, 0, &p));
    ASSERT_OK(lkv_put_block(p, 0, d.blocks, d.block_bytes));
    ASSERT_OK(lkv_put_block(p, 1, d.blocks + d.block_bytes, d.block_bytes));
    lkv_put_abort(p);
    expect_absent(S->profile, &d);
    lkv_put_reply r;
    ASSERT_OK(lkv_client_put(cl, S->profile, d.tokens, d.n_tokens, d.blocks, d.n_blocks,
                             d.block_bytes, 0, &r));
    ASSERT_EQ(r.already_present, 0);
    lkv_docref ref = lkv_it_ref(S, &d);
    ASSERT_OK(lkv_client_delete(cl, &ref, 0, NULL));
    lkv_it_doc_free(&d);
}

/* Child mode: start a Put of document seed 7, send 2 of its 3 blocks, and die. */
static int child_partial_put(const char *addr)
{
    lkv_client_options o = {0};
    lkv_client_t *c = NULL;
    if (lkv_client_create(addr, &o, &c) != 0) {
        return 3;
    }
    it_doc d;
    lkv_it_doc_make(S, 7, 37, &d);
    lkv_put_t *p = NULL;
    if (lkv_client_put_begin(c, S->profile, d.tokens, d.n_tokens, 3, 0, &p) != 0 ||
        lkv_put_block(p, 0, d.blocks, d.block_bytes) != 0 ||
        lkv_put_block(p, 1, d.blocks + d.block_bytes, d.block_bytes) != 0) {
        return 4;
    }
    /* The lookup below (made by this process) completes only after both messages were
     * sent on the same connection, so the daemon has the partial document in flight. */
    lkv_docref r = lkv_it_ref(S, &d);
    lkv_doc_status st;
    if (lkv_client_lookup(c, &r, 1, 0, &st) != 0) {
        return 5;
    }
    printf("partial put in flight\n");
    fflush(stdout);
    _exit(0); /* No finish, no cancel: the connection just goes away. */
}

static void test_client_dies(void)
{
    it_doc d;
    lkv_it_doc_make(S, 7, 37, &d);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        execl("/proc/self/exe", "it_c_badinput", "--child-partial-put", dm.addr, (char *)NULL);
        _exit(127);
    }
    int st;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* Whenever the daemon notices, the partial document must never become visible. */
    for (int i = 0; i < 10; i++) {
        expect_absent(S->profile, &d);
        usleep(100000);
    }
    ASSERT_OK(lkv_client_ping(cl, "", 0));
    /* And the daemon released whatever the dead put held: the document can be put whole. */
    lkv_put_reply r;
    ASSERT_OK(lkv_client_put(cl, S->profile, d.tokens, d.n_tokens, d.blocks, d.n_blocks,
                             d.block_bytes, 0, &r));
    ASSERT_EQ(r.already_present, 0);
    lkv_docref ref = lkv_it_ref(S, &d);
    ASSERT_OK(lkv_client_delete(cl, &ref, 0, NULL));
    lkv_it_doc_free(&d);
}

/* The deadline passes mid-stream: DEADLINE_EXCEEDED and nothing visible. */
static void test_deadline(void)
{
    it_doc d;
    lkv_it_doc_make(S, 8, 37, &d);
    lkv_put_t *p = NULL;
    ASSERT_OK(lkv_client_put_begin(cl, S->profile, d.tokens, d.n_tokens, 3, 500, &p));
    ASSERT_OK(lkv_put_block(p, 0, d.blocks, d.block_bytes));
    usleep(1200000);
    int rc = lkv_put_block(p, 1, d.blocks + d.block_bytes, d.block_bytes);
    int rc2 = lkv_put_finish(p, NULL);
    ASSERT_TRUE(rc == 0 || rc == rc2);
    expect(rc2, LKV_ETIMEDOUT, ST_DEADLINE_EXCEEDED, NULL, "deadline passed mid-stream");
    expect_absent(S->profile, &d);
    lkv_it_doc_free(&d);
}

/* Returns the value of stat section.key (exits the test if missing). */
static double stat_value(const char *section, const char *key)
{
    lkv_stat_entry *e = NULL;
    size_t n = 0;
    ASSERT_OK(lkv_client_stats_entries(cl, NULL, 0, &e, &n));
    for (size_t i = 0; i < n; i++) {
        if (strcmp(e[i].section, section) == 0 && strcmp(e[i].key, key) == 0) {
            double v = e[i].value;
            free(e);
            return v;
        }
    }
    free(e);
    LKV_FAIL("Stats has no %s.%s", section, key);
}

/* Refused, aborted and abandoned Puts hold no hot pages afterwards: 40 rounds of each kind
 * (3 pages each, 8 pages in all: a leak would exhaust the tier within 3 rounds), then the
 * tier is empty again and a full-size document still fits. */
static void test_no_leaked_pages(void)
{
    it_doc d;
    lkv_it_doc_make(S, 9, 37, &d);
    static const int ok3[] = {0, 1, 2}, miss[] = {0, 1}, order[] = {0, 2, 1};
    for (int i = 0; i < 40; i++) {
        ASSERT_ERR(put_seq(S->profile, &d, 3, ok3, 3, 1, 100), LKV_EINVAL);
        ASSERT_ERR(put_seq(S->profile, &d, 3, miss, 2, -1, 0), LKV_EINVAL);
        ASSERT_ERR(put_seq(S->profile, &d, 3, order, 3, -1, 0), LKV_EINVAL);
        lkv_put_t *p = NULL;
        ASSERT_OK(lkv_client_put_begin(cl, S->profile, d.tokens, d.n_tokens, 3, 0, &p));
        ASSERT_OK(lkv_put_block(p, 0, d.blocks, d.block_bytes));
        lkv_put_abort(p);
    }
    expect_absent(S->profile, &d);
    /* Aborted calls are released asynchronously: give the daemon a moment. */
    double total = stat_value("hot", "pages_total"), free_pages = 0;
    for (int i = 0; i < 50; i++) {
        free_pages = stat_value("hot", "pages_free");
        if (free_pages == total) {
            break;
        }
        usleep(100000);
    }
    ASSERT_EQ(stat_value("hot", "docs"), 0);
    if (free_pages != total) {
        LKV_FAIL("hot pages leaked: %.0f of %.0f free after refused/aborted puts", free_pages,
                 total);
    }
    it_doc big;
    lkv_it_doc_make(S, 10, 8 * 16, &big); /* exactly the 8 pages */
    ASSERT_OK(lkv_client_put(cl, S->profile, big.tokens, big.n_tokens, big.blocks, big.n_blocks,
                             big.block_bytes, 0, NULL));
    lkv_docref ref = lkv_it_ref(S, &big);
    ASSERT_OK(lkv_client_delete(cl, &ref, 0, NULL));
    lkv_it_doc_free(&big);
    lkv_it_doc_free(&d);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--child-partial-put") == 0) {
        return child_partial_put(argv[2]);
    }
    const char *args[] = {LKV_IT_PROFILE_ARGS,      "--set", "hot_bytes=16MiB", "--set",
                          "max_message_bytes=5MiB", NULL};
    lkv_daemon_init(&dm, args);
    lkv_it_start(&dm);
    cl = lkv_it_client(&dm);
    LKV_RUN(test_block_errors);
    LKV_RUN(test_header_errors);
    LKV_RUN(test_unknown_document);
    LKV_RUN(test_oversize);
    LKV_RUN(test_budget);
    LKV_RUN(test_abort);
    LKV_RUN(test_client_dies);
    LKV_RUN(test_deadline);
    LKV_RUN(test_no_leaked_pages);
    ASSERT_OK(lkv_client_ping(cl, "", 0));
    lkv_client_destroy(cl);
    int st = lkv_daemon_stop(&dm, SIGTERM, 15000);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    lkv_daemon_cleanup(&dm);
    if (n_failed > 0) {
        fprintf(stderr, "%d expectation(s) failed\n", n_failed);
        return 1;
    }
    return 0;
}
