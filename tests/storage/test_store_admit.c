/*
 * test_store_admit.c: the store's hot admission door (lkv_store_config.hot_admission = door;
 * lkv_store.h, "Hot admission"). A hot tier full of frequently looked-up documents: a one-off
 * new document is refused the hot tier and stored cold only (the put's tier says COLD, it reads
 * back intact, the frequent documents stay hot, hot_admit_refused / puts_cold_only count it, in
 * the stats registry too); a document looked up often enough wins the door and is admitted hot
 * (evicting); with no room in the cold tier a refused put is declined (LKV_EADMIT, nothing
 * changes); a reservation (put in place) of a refused document gets LKV_EADMIT; held documents
 * and scratch reservations (a copy's placeholder) pass; a region held full by pins answers
 * LKV_ENOSPC as before; write-through cold-only puts are durable across a restart; "always" admits
 * everything as before. Policies tinylfu and adaptive (the daemon's default).
 */
#include "lkv_policy.h"
#include "store_util.h"

#define WB  LKV_DURABILITY_WRITE_BACK
#define WT  LKV_DURABILITY_WRITE_THROUGH
#define TOK 8u /* Tokens of a document: 2 blocks of "tiny". */

static lkv_store *open_admit(const char *dir, uint32_t pages, uint64_t cold, int dur, int adm,
                             lkv_stats *reg)
{
    lkv_store_config c;
    lkv_store *s = NULL;
    su_config(&c, dir, pages, cold, dur);
    c.hot_admission = adm;
    c.stats = reg;
    ASSERT_OK(lkv_store_open(&c, &s));
    return s;
}

/* Looks document seed up n times by its tokens (each lookup records it in the sketch). */
static void look(lkv_store *s, uint64_t seed, int n, lkv_doc_info *in)
{
    uint8_t salt[32];
    uint32_t t[TOK];
    lkv_tenant_salt_default(salt);
    su_doc_tokens(seed, TOK, t);
    for (int i = 0; i < n; i++) {
        ASSERT_OK(lkv_store_lookup_tokens(s, salt, "tiny", t, TOK, NULL, in));
    }
}

/* Puts document seed with put_finish (blocks in two pieces each, when split), reporting *res.
 * Returns put_begin's, put_blockv's (then aborted) or put_finish's rc. */
static int put_doc(lkv_store *s, uint64_t seed, const lkv_put_opts *o, int split,
                   lkv_put_result *res)
{
    uint8_t salt[32];
    uint32_t t[TOK];
    lkv_kv_shape sh = tiny_profile("x").shape;
    uint32_t nb = lkv_blocks_for_tokens(&sh, TOK);
    uint8_t *kv = malloc((size_t)nb * TINY_BB);
    lkv_store_put *tx;
    lkv_tenant_salt_default(salt);
    su_doc_tokens(seed, TOK, t);
    su_fill_doc(&sh, TOK, seed, kv);
    memset(res, 0, sizeof *res);
    int rc = lkv_store_put_begin_ex(s, salt, "tiny", t, TOK, o, &tx, NULL, NULL);
    if (rc != 0) {
        free(kv);
        return rc;
    }
    for (uint32_t i = 0; i < nb; i++) {
        uint8_t *b = kv + (size_t)i * TINY_BB;
        struct iovec iov[2] = {{b, 100}, {b + 100, TINY_BB - 100}};
        struct iovec one = {b, TINY_BB};
        rc = lkv_store_put_blockv(tx, i, split ? iov : &one, split ? 2 : 1);
        if (rc != 0) { /* ENOSPC here when put_begin deferred the reservation. */
            lkv_store_put_abort(tx);
            free(kv);
            return rc;
        }
    }
    rc = lkv_store_put_finish(tx, res);
    free(kv);
    return rc;
}

static int tier_of(lkv_store *s, uint64_t seed)
{
    lkv_dockey k;
    su_key(s, seed, TOK, &k);
    return lkv_store_tier(s, &k);
}

/* Four frequent documents fill the hot tier (8 pages, 2 each); each looked up 3 times. */
static void fill_frequent(lkv_store *s)
{
    lkv_doc_info in;
    lkv_put_result r;
    for (uint64_t d = 1; d <= 4; d++) {
        look(s, d, 1, &in);
        ASSERT_EQ(in.present, 0);
        ASSERT_OK(put_doc(s, d, NULL, 0, &r)); /* Fits without evicting: the door is open. */
        ASSERT_EQ(r.tier, LKV_TIER_HOT);
        look(s, d, 2, &in);
        ASSERT_EQ(in.tier, LKV_TIER_HOT);
    }
    ASSERT_EQ(su_tiny_free(s), 0);
}

typedef struct kv_one {
    const char *key;
    double v;
    int found;
} kv_one;

static int kv_find(void *ctx, const lkv_stat_desc *d, double v)
{
    kv_one *o = ctx;
    char name[96];
    snprintf(name, sizeof name, "%s.%s", d->section, d->key);
    if (strcmp(name, o->key) == 0) {
        o->v = v;
        o->found = 1;
    }
    return 0;
}

static double reg_get(lkv_stats *reg, const char *key)
{
    kv_one o = {key, 0, 0};
    ASSERT_OK(lkv_stats_foreach(reg, NULL, kv_find, &o));
    if (!o.found) {
        LKV_FAIL("stat %s is not registered", key);
    }
    return o.v;
}

/* The scenario: a one-off document is stored cold only, a frequent one wins the door. */
static void test_door(int kind)
{
    char *dir = su_tmpdir();
    lkv_stats *reg;
    lkv_doc_info in;
    lkv_put_result r;
    ASSERT_OK(lkv_stats_create(&reg));
    su_policy_kind = kind;
    lkv_store *s = open_admit(dir, 8, 0, WB, LKV_HOT_ADMIT_DOOR, reg);
    fill_frequent(s);

    /* One-off document 10: looked up once (a miss, recorded), then put: refused hot. */
    look(s, 10, 1, &in);
    ASSERT_EQ(in.present, 0);
    ASSERT_OK(put_doc(s, 10, NULL, 1, &r));
    ASSERT_EQ(r.existed, 0);
    ASSERT_EQ(r.tier, LKV_TIER_COLD);
    ASSERT_EQ(r.persisted, 1);
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(st.hot_admit_refused, 1);
    ASSERT_EQ(st.puts_cold_only, 1);
    ASSERT_EQ(st.puts_declined, 0);
    ASSERT_EQ(st.puts, 5);
    ASSERT_EQ(st.cold_docs, 1 + st.wb_persisted); /* Document 10 plus what the writer did. */
    ASSERT_EQ(st.evictions_hot, 0);
    ASSERT_EQ(reg_get(reg, "puts.hot_admit_refused"), 1);
    ASSERT_EQ(reg_get(reg, "puts.puts_cold_only"), 1);
    ASSERT_EQ(su_tiny_free(s), 0); /* Nothing evicted for it. */
    for (uint64_t d = 1; d <= 4; d++) {
        ASSERT_EQ(tier_of(s, d), LKV_TIER_HOT);
    }
    look(s, 10, 1, &in);
    ASSERT_EQ(in.present, 1);
    ASSERT_EQ(in.tier, LKV_TIER_COLD);
    ASSERT_EQ(in.persisted, 1);
    lkv_dockey k10;
    su_key(s, 10, TOK, &k10);
    ASSERT_OK(su_check(s, &k10, 10, TOK)); /* The bytes, gathered from two pieces a block. */
    /* A get of it keeps the door too (it was looked up twice, less than every resident). */
    for (uint64_t d = 1; d <= 4; d++) {
        ASSERT_EQ(tier_of(s, d), LKV_TIER_HOT);
    }
    /* Putting it again stores nothing new and reports where it is. */
    ASSERT_OK(put_doc(s, 10, NULL, 0, &r));
    ASSERT_EQ(r.existed, 1);
    ASSERT_EQ(r.tier, LKV_TIER_COLD);

    /* Frequent new document 20: looked up 8 times before its put, more than any resident. */
    look(s, 20, 8, &in);
    ASSERT_EQ(in.present, 0);
    ASSERT_OK(put_doc(s, 20, NULL, 0, &r));
    ASSERT_EQ(r.tier, LKV_TIER_HOT);
    st = su_stats(s);
    ASSERT_EQ(st.hot_admit_refused, 1);
    ASSERT_EQ(st.evictions_hot, 1);
    ASSERT_EQ(tier_of(s, 20), LKV_TIER_HOT);
    lkv_dockey k20;
    su_key(s, 20, TOK, &k20);
    ASSERT_OK(su_check(s, &k20, 20, TOK));

    /* A held put passes the door whatever its history. */
    lkv_put_opts o = {.hold = 1};
    ASSERT_OK(put_doc(s, 30, &o, 0, &r));
    ASSERT_EQ(r.tier, LKV_TIER_HOT);
    ASSERT_EQ(su_stats(s).hot_admit_refused, 1);

    /* A reservation (put in place) of a one-off document: LKV_EADMIT, nothing changes. */
    uint8_t salt[32];
    uint32_t t[TOK];
    lkv_tenant_salt_default(salt);
    su_doc_tokens(40, TOK, t);
    lkv_store_put *tx;
    int exists = -1;
    uint32_t before = su_tiny_free(s);
    ASSERT_OK(lkv_store_put_begin(s, salt, "tiny", t, TOK, &tx, NULL, &exists));
    ASSERT_EQ(exists, 0);
    ASSERT_EQ(lkv_store_put_cold_only(tx), 1);
    ASSERT_ERR(lkv_store_put_reserve(tx), LKV_EADMIT);
    ASSERT_TRUE(strstr(lkv_store_why(), "admission") != NULL);
    ASSERT_TRUE(lkv_store_put_pages(tx) == NULL);
    lkv_store_put_abort(tx);
    ASSERT_EQ(su_tiny_free(s), before);
    ASSERT_EQ(tier_of(s, 40), LKV_TIER_NONE);
    ASSERT_EQ(su_stats(s).hot_admit_refused, 2);
    ASSERT_EQ(su_stats(s).puts_inflight, 0);
    /* The same as scratch room (a copy's placeholder, never committed): it passes the door and
     * gets hot pages, evicting. */
    lkv_put_opts so = {.scratch = 1};
    ASSERT_OK(lkv_store_put_begin_ex(s, salt, "tiny", t, TOK, &so, &tx, NULL, &exists));
    ASSERT_EQ(lkv_store_put_cold_only(tx), 0);
    ASSERT_OK(lkv_store_put_reserve(tx));
    ASSERT_TRUE(lkv_store_put_pages(tx) != NULL);
    ASSERT_EQ(su_stats(s).hot_admit_refused, 2);
    lkv_store_put_abort(tx);
    ASSERT_EQ(tier_of(s, 40), LKV_TIER_NONE);

    ASSERT_OK(lkv_store_close(s));
    lkv_stats_destroy(reg);
    su_policy_kind = 0;
    su_rmdir(dir);
}

/* No room in the cold tier: a refused put is declined before any block, nothing changes. */
static void test_declined(void)
{
    char *dir = su_tmpdir();
    lkv_doc_info in;
    lkv_put_result r;
    su_policy_kind = LKV_POLICY_TINYLFU;
    /* Cold budget 1 KiB: no 2-block document fits (hot victims are dropped). */
    lkv_store *s = open_admit(dir, 8, 1024, WB, LKV_HOT_ADMIT_DOOR, NULL);
    fill_frequent(s);
    look(s, 10, 1, &in);
    lkv_store_stats st0 = su_stats(s);
    ASSERT_ERR(put_doc(s, 10, NULL, 0, &r), LKV_EADMIT);
    ASSERT_TRUE(strstr(lkv_store_why(), "nothing was stored") != NULL);
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(st.hot_admit_refused, 1);
    ASSERT_EQ(st.puts_declined, 1);
    ASSERT_EQ(st.puts_cold_only, 0);
    ASSERT_EQ(st.puts, st0.puts);
    ASSERT_EQ(st.puts_inflight, 0);
    ASSERT_EQ(st.evictions_hot, 0);
    ASSERT_EQ(su_tiny_free(s), 0);
    for (uint64_t d = 1; d <= 4; d++) {
        ASSERT_EQ(tier_of(s, d), LKV_TIER_HOT);
    }
    look(s, 10, 1, &in);
    ASSERT_EQ(in.present, 0);
    ASSERT_EQ(in.miss_cause, LKV_MISS_NEVER);
    /* Once looked up often enough it is admitted hot (the victim is dropped: no cold room). */
    look(s, 10, 6, &in);
    ASSERT_OK(put_doc(s, 10, NULL, 0, &r));
    ASSERT_EQ(r.tier, LKV_TIER_HOT);
    ASSERT_EQ(su_stats(s).drops, 1);
    /* The writer could not persist the hot documents either (1 KiB): close says so, and the
     * failures are the cold policy's refusals, not I/O errors. (Wait for the writer to take
     * every queued document first: it runs on its own thread; a flush would consume the error
     * close must report.) */
    for (int i = 0; i < 10000 && su_stats(s).wb_pending > 0; i++) {
        usleep(1000);
    }
    st = su_stats(s);
    ASSERT_EQ(st.wb_pending, 0);
    ASSERT_TRUE(st.wb_failed > 0);
    ASSERT_EQ(st.wb_cold_declined, st.wb_failed);
    ASSERT_ERR(lkv_store_close(s), LKV_EIO);
    su_policy_kind = 0;
    su_rmdir(dir);
}

/* Write-through: a cold-only put is synced before put_finish returns and survives a restart. */
static void test_write_through(void)
{
    char *dir = su_tmpdir();
    lkv_doc_info in;
    lkv_put_result r;
    su_policy_kind = LKV_POLICY_TINYLFU;
    lkv_store *s = open_admit(dir, 8, 0, WT, LKV_HOT_ADMIT_DOOR, NULL);
    fill_frequent(s);
    ASSERT_OK(put_doc(s, 10, NULL, 0, &r));
    ASSERT_EQ(r.tier, LKV_TIER_COLD);
    ASSERT_EQ(r.persisted, 1);
    ASSERT_EQ(su_stats(s).puts_cold_only, 1);
    ASSERT_OK(lkv_store_close(s));
    s = open_admit(dir, 8, 0, WT, LKV_HOT_ADMIT_DOOR, NULL);
    lkv_dockey k;
    su_key(s, 10, TOK, &k);
    ASSERT_OK(lkv_store_lookup(s, &k, 1, &in));
    ASSERT_EQ(in.present, 1);
    ASSERT_EQ(in.tier, LKV_TIER_COLD);
    ASSERT_OK(su_check(s, &k, 10, TOK));
    ASSERT_OK(lkv_store_close(s));
    su_policy_kind = 0;
    su_rmdir(dir);
}

/* A region held full by pins: the door does not decide (nothing could be evicted); the put is
 * refused with LKV_ENOSPC as without it, and nothing is stored cold. */
static void test_pinned_full(void)
{
    char *dir = su_tmpdir();
    lkv_put_result r;
    su_policy_kind = LKV_POLICY_TINYLFU;
    lkv_store *s = open_admit(dir, 8, 0, WB, LKV_HOT_ADMIT_DOOR, NULL);
    fill_frequent(s);
    lkv_dockey k[4];
    for (uint64_t d = 1; d <= 4; d++) {
        su_key(s, d, TOK, &k[d - 1]);
        ASSERT_OK(lkv_store_pin(s, &k[d - 1], NULL, 0, NULL));
    }
    ASSERT_ERR(put_doc(s, 10, NULL, 0, &r), LKV_ENOSPC);
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(st.hot_admit_refused, 0);
    ASSERT_EQ(st.puts_cold_only, 0);
    ASSERT_EQ(tier_of(s, 10), LKV_TIER_NONE);
    ASSERT_OK(lkv_store_unpin(s, &k[0]));
    /* One unpinned victim: now the door decides, and refuses the one-off document. */
    ASSERT_OK(put_doc(s, 10, NULL, 0, &r));
    ASSERT_EQ(r.tier, LKV_TIER_COLD);
    ASSERT_EQ(su_stats(s).hot_admit_refused, 1);
    for (int i = 1; i < 4; i++) {
        ASSERT_OK(lkv_store_unpin(s, &k[i]));
    }
    ASSERT_OK(lkv_store_close(s));
    su_policy_kind = 0;
    su_rmdir(dir);
}

/* always (and a zeroed config): the one-off document is admitted hot, evicting. A bad value is
 * refused at open. */
static void test_always(void)
{
    char *dir = su_tmpdir();
    lkv_put_result r;
    su_policy_kind = LKV_POLICY_TINYLFU;
    lkv_store *s = open_admit(dir, 8, 0, WB, LKV_HOT_ADMIT_ALWAYS, NULL);
    fill_frequent(s);
    ASSERT_OK(put_doc(s, 10, NULL, 0, &r));
    ASSERT_EQ(r.tier, LKV_TIER_HOT);
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(st.hot_admit_refused, 0);
    ASSERT_EQ(st.evictions_hot, 1);
    ASSERT_OK(lkv_store_close(s));
    lkv_store_config c;
    su_config(&c, dir, 8, 0, WB);
    c.hot_admission = 2;
    ASSERT_ERR(lkv_store_open(&c, &s), LKV_ECONFIG);
    int m = -1;
    ASSERT_OK(lkv_hot_admission_parse("door", &m));
    ASSERT_EQ(m, LKV_HOT_ADMIT_DOOR);
    ASSERT_OK(lkv_hot_admission_parse("always", &m));
    ASSERT_EQ(m, LKV_HOT_ADMIT_ALWAYS);
    ASSERT_ERR(lkv_hot_admission_parse("sometimes", &m), LKV_EINVAL);
    ASSERT_TRUE(strcmp(lkv_hot_admission_name(LKV_HOT_ADMIT_DOOR), "door") == 0);
    su_policy_kind = 0;
    su_rmdir(dir);
}

static void test_door_tinylfu(void)
{
    test_door(LKV_POLICY_TINYLFU);
}

static void test_door_adaptive(void)
{
    test_door(LKV_POLICY_ADAPTIVE);
}

int main(void)
{
    LKV_RUN(test_door_tinylfu);
    LKV_RUN(test_door_adaptive);
    LKV_RUN(test_declined);
    LKV_RUN(test_write_through);
    LKV_RUN(test_pinned_full);
    LKV_RUN(test_always);
    return 0;
}
