/*
 * store_util.h: helpers for the store tests: open a store over a temp dir with the tiny
 * profiles, put a document derived from a seed, check one reads back intact.
 */
#ifndef STORE_UTIL_H
#define STORE_UTIL_H

#include "lkv_store.h"
#include "storage_util.h"

#define TINY_BB 1024u /* Block bytes of "tiny". */

static lkv_profile su_profiles[2];
static int su_policy_kind;     /* enum lkv_policy_kind used by su_open (0: lru). */
static lkv_stats *su_registry; /* Registry su_open passes (NULL: the store's own). */
static int su_no_wal;          /* lkv_store_config.wb_no_wal used by su_open. */

/* The config su_open uses (c caller-owned; it points at su_profiles). */
static inline void su_config(lkv_store_config *out, const char *dir, uint32_t hot_pages,
                             uint64_t cold_bytes, int durability)
{
    lkv_store_config c;
    su_profiles[0] = tiny_profile("tiny");
    su_profiles[1] = tiny_profile("tiny3"); /* 3 layers: another fingerprint, 1536-byte blocks. */
    su_profiles[1].shape.n_layers = 3;
    memset(&c, 0, sizeof c);
    c.data_dir = dir;
    /* One arena region per profile (DESIGN.md 4): each gets hot_pages pages of its own block
     * size (tiny: 1 KiB, tiny3: 1.5 KiB), so a test's page budget holds the same blocks as when
     * every page was 4 KiB. */
    su_profiles[0].hot_bytes = (uint64_t)hot_pages * TINY_BB;
    su_profiles[1].hot_bytes = (uint64_t)hot_pages * (TINY_BB / 2 * 3);
    c.hot_bytes = su_profiles[0].hot_bytes + su_profiles[1].hot_bytes;
    c.hot_backend = LKV_HOT_HOST;
    const char *be = getenv("LKV_TEST_HOT_BACKEND"); /* "cuda" runs the store on HBM. */
    if (be != NULL && lkv_hot_backend_parse(be, &c.hot_backend) != 0) {
        LKV_FAIL("LKV_TEST_HOT_BACKEND=%s is not auto, host or cuda", be);
    }
    c.cold_bytes = cold_bytes;
    c.policy_kind = su_policy_kind;
    c.durability = durability;
    c.profiles = su_profiles;
    c.n_profiles = 2;
    c.cold_min_blob_bytes = 512;
    c.stats = su_registry;
    /* LKV_TEST_NO_WAL=1 (ctest storage.store_nowal) runs a whole test file without the WAL. */
    const char *nw = getenv("LKV_TEST_NO_WAL");
    c.wb_no_wal = su_no_wal || (nw != NULL && strcmp(nw, "1") == 0);
    *out = c;
}

/* Opens a store in dir with hot_pages pages per profile, cold_bytes, durability. */
static inline lkv_store *su_open(const char *dir, uint32_t hot_pages, uint64_t cold_bytes,
                                 int durability)
{
    lkv_store_config c;
    lkv_store *s = NULL;
    su_config(&c, dir, hot_pages, cold_bytes, durability);
    ASSERT_OK(lkv_store_open(&c, &s));
    return s;
}

/* Free pages of the "tiny" region (region 0). */
static inline uint32_t su_tiny_free(lkv_store *s)
{
    lkv_store_region rg;
    ASSERT_OK(lkv_store_region_get(s, 0, &rg));
    return rg.pages_free;
}

/* Tokens of document seed: n tokens. */
static inline void su_doc_tokens(uint64_t seed, uint32_t n, uint32_t *t)
{
    su_tokens(t, n, seed, 512);
}

/* Puts document seed (n tokens) of "tiny" under the default salt. Returns the rc. */
static inline int su_put(lkv_store *s, uint64_t seed, uint32_t n, lkv_dockey *key)
{
    uint8_t salt[32];
    uint32_t t[256];
    lkv_kv_shape sh = tiny_profile("x").shape;
    uint32_t nb = lkv_blocks_for_tokens(&sh, n);
    uint8_t *kv = malloc((size_t)nb * TINY_BB);
    lkv_tenant_salt_default(salt);
    su_doc_tokens(seed, n, t);
    su_fill_doc(&sh, n, seed, kv);
    int rc = lkv_store_put_all(s, salt, "tiny", t, n, kv, (size_t)nb * TINY_BB, key);
    free(kv);
    return rc;
}

/* The key of document seed without putting it. */
static inline void su_key(lkv_store *s, uint64_t seed, uint32_t n, lkv_dockey *key)
{
    uint8_t salt[32];
    uint32_t t[256];
    lkv_tenant_salt_default(salt);
    su_doc_tokens(seed, n, t);
    lkv_dockey_compute(salt, lkv_store_profile_find(s, "tiny")->fingerprint, t, n, key);
}

/* Reads key and compares with document seed (n tokens); returns the get's rc (0 = intact). */
static inline int su_check(lkv_store *s, const lkv_dockey *key, uint64_t seed, uint32_t n)
{
    lkv_kv_shape sh = tiny_profile("x").shape;
    uint32_t nb = lkv_blocks_for_tokens(&sh, n);
    uint8_t *want = malloc((size_t)nb * TINY_BB), *got = malloc((size_t)nb * TINY_BB);
    lkv_doc_info in;
    su_fill_doc(&sh, n, seed, want);
    int rc = lkv_store_get_all(s, key, got, (size_t)nb * TINY_BB, &in);
    if (rc == 0) {
        ASSERT_EQ(in.n_tokens, n);
        ASSERT_EQ(in.n_blocks, nb);
        if (memcmp(want, got, (size_t)nb * TINY_BB) != 0) {
            LKV_FAIL("document %llu reads back different bytes", (unsigned long long)seed);
        }
    }
    free(want);
    free(got);
    return rc;
}

static inline lkv_store_stats su_stats(lkv_store *s)
{
    lkv_store_stats st;
    lkv_store_stats_get(s, &st);
    return st;
}

#endif
