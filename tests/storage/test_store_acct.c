/*
 * test_store_acct.c: the store's per-tenant usage accounts (storage/lkv_store_acct.c,
 * lkv_store_usage_get / lkv_store_usage_oldest).
 *
 *   - Random worlds (replayable seed, LKV_TEST_SEED): three salts put, delete, demote, pin and
 *     read documents of 1..6 blocks into a store whose hot and cold budgets are both far too
 *     small, so the policies evict and demote on their own, in both durability modes. After
 *     every step (write-back: after a flush) each salt's usage must equal a reference summed
 *     from lkv_store_foreach over the keys that salt put: hot bytes = hot docs' blocks x
 *     page_bytes, cold bytes = persisted docs' payload, docs = visible docs.
 *   - An aborted put leaves no usage; usage during a put counts its pages.
 *   - lkv_store_usage_oldest: the least recently used (read, else created; Lookups do not
 *     count) unpinned document of the salt, persisted ones first in the hot tier, never another
 *     salt's, ENOTFOUND when all are pinned.
 *   - After a reopen, recovered documents belong to no account (documented limitation), and
 *     deleting them never underflows another account.
 */
#include <stdlib.h>
#include <time.h>

#include "lkv_dockey.h"
#include "lkv_test.h"
#include "store_util.h"

#define MAXK 512

typedef struct world {
    lkv_dockey keys[MAXK];
    int salt_of[MAXK]; /* Index into salts. */
    int n;
} world;

static uint8_t salts[3][32];

static void make_salts(void)
{
    lkv_tenant_salt_default(salts[0]);
    lkv_tenant_salt_derive("alice", salts[1]);
    lkv_tenant_salt_derive("bob", salts[2]);
}

static int put_salt(lkv_store *s, int si, uint64_t seed, uint32_t n, lkv_dockey *key)
{
    uint32_t t[256];
    lkv_kv_shape sh = tiny_profile("x").shape;
    uint32_t nb = lkv_blocks_for_tokens(&sh, n);
    uint8_t *kv = malloc((size_t)nb * TINY_BB);
    su_doc_tokens(seed, n, t);
    su_fill_doc(&sh, n, seed, kv);
    int rc = lkv_store_put_all(s, salts[si], "tiny", t, n, kv, (size_t)nb * TINY_BB, key);
    free(kv);
    return rc;
}

typedef struct ref_ctx {
    const world *w;
    lkv_store_usage want[3];
    uint64_t page_bytes;
} ref_ctx;

static int ref_visit(void *ctx, const lkv_dockey *key, const lkv_doc_info *in)
{
    ref_ctx *r = ctx;
    for (int i = 0; i < r->w->n; i++) {
        if (memcmp(&r->w->keys[i], key, sizeof(*key)) == 0) {
            lkv_store_usage *u = &r->want[r->w->salt_of[i]];
            u->docs++;
            if (in->tier == LKV_TIER_HOT) {
                u->hot_bytes += (uint64_t)in->n_blocks * r->page_bytes;
            }
            if (in->persisted) {
                u->cold_bytes += (uint64_t)in->n_blocks * in->block_bytes;
            }
            return 0;
        }
    }
    return 0;
}

static void compare(lkv_store *s, const world *w, int step)
{
    ref_ctx r;
    memset(&r, 0, sizeof(r));
    r.w = w;
    lkv_store_usage u0;
    lkv_store_usage_get(s, salts[0], &u0);
    r.page_bytes = u0.page_bytes;
    ASSERT_OK(lkv_store_foreach(s, ref_visit, &r));
    for (int si = 0; si < 3; si++) {
        lkv_store_usage got;
        lkv_store_usage_get(s, salts[si], &got);
        if (got.hot_bytes != r.want[si].hot_bytes || got.cold_bytes != r.want[si].cold_bytes ||
            got.docs != r.want[si].docs) {
            LKV_FAIL(
                "step %d salt %d: usage hot %llu cold %llu docs %llu, reference hot %llu "
                "cold %llu docs %llu",
                step, si, (unsigned long long)got.hot_bytes, (unsigned long long)got.cold_bytes,
                (unsigned long long)got.docs, (unsigned long long)r.want[si].hot_bytes,
                (unsigned long long)r.want[si].cold_bytes, (unsigned long long)r.want[si].docs);
        }
    }
}

static void random_world(int durability, unsigned seed)
{
    char *dir = su_tmpdir();
    /* 24 hot pages of 4 KiB and 40 KiB of cold payload: documents of 1..6 KiB overflow both. */
    lkv_store *s = su_open(dir, 24, 40 * 1024, durability);
    world *w = calloc(1, sizeof(*w));
    srand(seed);
    int pinned[MAXK] = {0};
    for (int step = 0; step < 400; step++) {
        int op = rand() % 10;
        if (op < 5 && w->n < MAXK) {
            int si = rand() % 3;
            uint32_t n = 1 + (uint32_t)(rand() % 24); /* 1..6 blocks of 4 tokens. */
            lkv_dockey k;
            int rc = put_salt(s, si, (uint64_t)step * 7919u + seed, n, &k);
            if (rc == 0) {
                w->keys[w->n] = k;
                w->salt_of[w->n++] = si;
            }
        } else if (op == 5 && w->n > 0) {
            int i = rand() % w->n;
            if (!pinned[i]) {
                lkv_store_delete(s, &w->keys[i]);
            }
        } else if (op == 6 && w->n > 0) {
            lkv_store_demote(s, &w->keys[rand() % w->n]);
        } else if (op == 7 && w->n > 0) {
            int i = rand() % w->n;
            if (!pinned[i] && lkv_store_pin(s, &w->keys[i], NULL, 0, NULL) == 0) {
                pinned[i] = 1;
            } else if (pinned[i]) {
                ASSERT_OK(lkv_store_unpin(s, &w->keys[i]));
                pinned[i] = 0;
            }
        } else if (op == 8 && w->n > 0) {
            /* A read promotes a cold document. */
            uint8_t buf[6 * TINY_BB];
            lkv_doc_info in;
            lkv_store_get_all(s, &w->keys[rand() % w->n], buf, sizeof(buf), &in);
        }
        ASSERT_OK(lkv_store_flush(s));
        compare(s, w, step);
    }
    for (int i = 0; i < w->n; i++) {
        if (pinned[i]) {
            ASSERT_OK(lkv_store_unpin(s, &w->keys[i]));
        }
    }
    lkv_store_stats st = su_stats(s);
    ASSERT_TRUE(st.evictions_hot > 0); /* The world did exercise the policies. */
    ASSERT_TRUE(st.evictions_cold > 0);
    ASSERT_OK(lkv_store_close(s));
    free(w);
    su_rmdir(dir);
}

static void test_random_write_back(void)
{
    const char *e = getenv("LKV_TEST_SEED");
    unsigned seed = e != NULL ? (unsigned)atoi(e) : 1234u;
    printf("  seed %u (LKV_TEST_SEED)\n", seed);
    random_world(LKV_DURABILITY_WRITE_BACK, seed);
}

static void test_random_write_through(void)
{
    const char *e = getenv("LKV_TEST_SEED");
    random_world(LKV_DURABILITY_WRITE_THROUGH, e != NULL ? (unsigned)atoi(e) + 1 : 4321u);
}

static void test_abort_and_inflight(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 64, 0, LKV_DURABILITY_WRITE_BACK);
    uint32_t t[64];
    su_doc_tokens(9, 12, t); /* 3 blocks. */
    lkv_store_put *tx;
    lkv_dockey k;
    int exists;
    ASSERT_OK(lkv_store_put_begin(s, salts[1], "tiny", t, 12, &tx, &k, &exists));
    lkv_store_usage u;
    lkv_store_usage_get(s, salts[1], &u);
    ASSERT_EQ(u.hot_bytes, 3 * u.page_bytes); /* An open put holds its pages. */
    ASSERT_EQ(u.docs, 0);                     /* ... but is no document yet. */
    lkv_store_put_abort(tx);
    lkv_store_usage_get(s, salts[1], &u);
    ASSERT_EQ(u.hot_bytes, 0);
    ASSERT_EQ(u.docs, 0);
    ASSERT_EQ(u.accounted, 1);
    lkv_store_usage_get(s, salts[2], &u);
    ASSERT_EQ(u.accounted, 0);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_oldest(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 64, 0, LKV_DURABILITY_WRITE_THROUGH);
    lkv_dockey a[3], b;
    for (int i = 0; i < 3; i++) {
        ASSERT_OK(put_salt(s, 1, 100 + (uint64_t)i, 20, &a[i]));
        struct timespec ts = {0, 3000000};
        nanosleep(&ts, NULL); /* Distinct creation times (ms). */
    }
    ASSERT_OK(put_salt(s, 2, 200, 20, &b));
    lkv_dockey got;
    ASSERT_OK(lkv_store_usage_oldest(s, salts[1], LKV_TIER_COLD, &got));
    ASSERT_EQ(memcmp(&got, &a[0], sizeof(got)), 0);
    /* A read makes a[0] the most recently used: a[1] is next. A Lookup does not count. */
    uint8_t buf[5 * TINY_BB];
    lkv_doc_info in;
    struct timespec ts2 = {0, 3000000};
    nanosleep(&ts2, NULL);
    ASSERT_OK(lkv_store_get_all(s, &a[0], buf, sizeof(buf), &in));
    ASSERT_OK(lkv_store_lookup(s, &a[1], 1, &in));
    ASSERT_OK(lkv_store_usage_oldest(s, salts[1], LKV_TIER_COLD, &got));
    ASSERT_EQ(memcmp(&got, &a[1], sizeof(got)), 0);
    ASSERT_OK(lkv_store_usage_oldest(s, salts[2], LKV_TIER_HOT, &got));
    ASSERT_EQ(memcmp(&got, &b, sizeof(got)), 0); /* Never another salt's. */
    ASSERT_OK(lkv_store_pin(s, &a[1], NULL, 0, NULL));
    ASSERT_OK(lkv_store_usage_oldest(s, salts[1], LKV_TIER_HOT, &got));
    ASSERT_EQ(memcmp(&got, &a[2], sizeof(got)), 0); /* Pinned: skipped. */
    ASSERT_OK(lkv_store_pin(s, &a[0], NULL, 0, NULL));
    ASSERT_OK(lkv_store_pin(s, &a[2], NULL, 0, NULL));
    ASSERT_ERR(lkv_store_usage_oldest(s, salts[1], LKV_TIER_HOT, &got), LKV_ENOTFOUND);
    ASSERT_ERR(lkv_store_usage_oldest(s, salts[0], LKV_TIER_HOT, &got), LKV_ENOTFOUND);
    for (int i = 0; i < 3; i++) {
        ASSERT_OK(lkv_store_unpin(s, &a[i]));
    }
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_oldest_prefers_persisted(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 64, 0, LKV_DURABILITY_WRITE_BACK);
    lkv_dockey old, young;
    lkv_store_fault_cold_writes(s, 1000); /* The writer fails: old stays unpersisted. */
    ASSERT_OK(put_salt(s, 1, 1, 20, &old));
    ASSERT_TRUE(lkv_store_flush(s) != 0);
    lkv_store_fault_cold_writes(s, 0);
    struct timespec ts = {0, 3000000};
    nanosleep(&ts, NULL);
    ASSERT_OK(put_salt(s, 1, 2, 20, &young));
    ASSERT_OK(lkv_store_flush(s)); /* young persisted. */
    lkv_doc_info in[2];
    lkv_dockey both[2] = {old, young};
    ASSERT_OK(lkv_store_lookup(s, both, 2, in));
    ASSERT_TRUE(!in[0].persisted && in[1].persisted);
    lkv_dockey got;
    ASSERT_OK(lkv_store_usage_oldest(s, salts[1], LKV_TIER_HOT, &got));
    ASSERT_EQ(memcmp(&got, &young, sizeof(got)), 0); /* Persisted first, though younger. */
    ASSERT_OK(lkv_store_usage_oldest(s, salts[1], LKV_TIER_COLD, &got));
    ASSERT_EQ(memcmp(&got, &old, sizeof(got)), 0); /* For deletion: the oldest. */
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_reopen_unaccounted(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 64, 0, LKV_DURABILITY_WRITE_THROUGH);
    lkv_dockey k;
    ASSERT_OK(put_salt(s, 1, 5, 12, &k)); /* 3 blocks. */
    ASSERT_OK(lkv_store_close(s));
    s = su_open(dir, 64, 0, LKV_DURABILITY_WRITE_THROUGH);
    lkv_store_usage u;
    lkv_store_usage_get(s, salts[1], &u);
    ASSERT_EQ(u.docs, 0); /* Recovered documents carry no salt. */
    ASSERT_EQ(u.cold_bytes, 0);
    lkv_dockey k2;
    ASSERT_OK(put_salt(s, 1, 6, 8, &k2)); /* 2 blocks. */
    uint8_t buf[3 * TINY_BB];
    lkv_doc_info in;
    ASSERT_OK(lkv_store_get_all(s, &k, buf, sizeof(buf), &in)); /* Promote the old one. */
    ASSERT_OK(lkv_store_delete(s, &k));
    lkv_store_usage_get(s, salts[1], &u);
    ASSERT_EQ(u.docs, 1); /* Only k2: deleting the unaccounted one took nothing away. */
    ASSERT_EQ(u.cold_bytes, 2 * TINY_BB);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

int main(void)
{
    make_salts();
    LKV_RUN(test_random_write_back);
    LKV_RUN(test_random_write_through);
    LKV_RUN(test_abort_and_inflight);
    LKV_RUN(test_oldest);
    LKV_RUN(test_oldest_prefers_persisted);
    LKV_RUN(test_reopen_unaccounted);
    return 0;
}
