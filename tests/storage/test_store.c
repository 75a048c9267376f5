/*
 * test_store.c: the block store: put/lookup/get/delete, put validation and transactions
 * (partial puts never visible), budget exhaustion (LKV_ENOSPC changes nothing), eviction,
 * demotion and promotion between tiers, miss causes, pins, reads racing deletes, corrupt
 * blocks in RocksDB, write-back flush on close and restart, injected RocksDB failures, and a
 * multi-threaded mix. Seed for the threaded test: LKV_TEST_SEED (default 1).
 */
#include <pthread.h>
#include <rocksdb/c.h>

#include "lkv_cold.h"
#include "lkv_policy.h"
#include "store_util.h"

#define WB LKV_DURABILITY_WRITE_BACK
#define WT LKV_DURABILITY_WRITE_THROUGH

static void test_basic(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 16, 0, WB);
    lkv_dockey k, k2, never;
    lkv_doc_info in;

    ASSERT_OK(su_put(s, 1, 10, &k)); /* 3 blocks, the last one partial. */
    ASSERT_OK(lkv_store_lookup(s, &k, 1, &in));
    ASSERT_EQ(in.present, 1);
    ASSERT_EQ(in.tier, LKV_TIER_HOT);
    ASSERT_EQ(in.n_tokens, 10);
    ASSERT_EQ(in.n_blocks, 3);
    ASSERT_EQ(in.block_bytes, TINY_BB);
    ASSERT_TRUE(in.profile == lkv_store_profile_find(s, "tiny"));
    ASSERT_OK(su_check(s, &k, 1, 10));

    /* The token lookup finds the same key. */
    uint8_t salt[32];
    uint32_t t[10];
    lkv_tenant_salt_default(salt);
    su_doc_tokens(1, 10, t);
    ASSERT_OK(lkv_store_lookup_tokens(s, salt, "tiny", t, 10, &k2, &in));
    ASSERT_TRUE(memcmp(&k, &k2, sizeof k) == 0);
    ASSERT_EQ(in.present, 1);
    ASSERT_ERR(lkv_store_lookup_tokens(s, salt, "nope", t, 10, &k2, &in), LKV_EPROFILE);
    /* Another tenant does not see it. */
    uint8_t other[32];
    lkv_tenant_salt_derive("other", other);
    ASSERT_OK(lkv_store_lookup_tokens(s, other, "tiny", t, 10, NULL, &in));
    ASSERT_EQ(in.present, 0);
    ASSERT_EQ(in.miss_cause, LKV_MISS_NEVER);

    su_key(s, 99, 10, &never);
    ASSERT_OK(lkv_store_lookup(s, &never, 1, &in));
    ASSERT_EQ(in.present, 0);
    ASSERT_EQ(in.miss_cause, LKV_MISS_NEVER);

    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(st.hits_hot, 2);
    ASSERT_EQ(st.hit_blocks_hot, 6);
    ASSERT_EQ(st.misses, 2);
    ASSERT_EQ(st.miss_blocks, 3); /* Only the token lookup knows the size of a miss. */
    ASSERT_EQ(st.misses_by_cause[LKV_MISS_NEVER], 2);
    ASSERT_EQ(st.hot_docs, 1);
    ASSERT_EQ(st.hot_blocks, 3);
    ASSERT_EQ(st.puts, 1);
    ASSERT_EQ(su_tiny_free(s), 13);

    /* Idempotent put. */
    lkv_store_put *tx;
    int exists = -1;
    ASSERT_OK(lkv_store_put_begin(s, salt, "tiny", t, 10, &tx, &k2, &exists));
    ASSERT_EQ(exists, 1);
    lkv_store_put_abort(tx);
    ASSERT_OK(su_put(s, 1, 10, &k2));
    st = su_stats(s);
    ASSERT_EQ(st.puts, 1);
    ASSERT_EQ(st.puts_existing, 1);
    ASSERT_EQ(st.hot_docs, 1);
    ASSERT_EQ(su_tiny_free(s), 13);
    /* get does not count. */
    ASSERT_EQ(st.hits_hot + st.hits_cold + st.misses, 4);

    ASSERT_OK(lkv_store_flush(s));
    ASSERT_OK(lkv_store_lookup(s, &k, 1, &in));
    ASSERT_EQ(in.persisted, 1);
    ASSERT_OK(lkv_store_delete(s, &k));
    ASSERT_ERR(lkv_store_delete(s, &k), LKV_ENOTFOUND);
    ASSERT_OK(lkv_store_lookup(s, &k, 1, &in));
    ASSERT_EQ(in.present, 0);
    ASSERT_EQ(in.miss_cause, LKV_MISS_DELETED);
    ASSERT_ERR(su_check(s, &k, 1, 10), LKV_ENOTFOUND);
    st = su_stats(s);
    ASSERT_EQ(st.hot_docs, 0);
    ASSERT_EQ(st.cold_docs, 0);
    ASSERT_EQ(su_tiny_free(s), 16);
    ASSERT_EQ(st.deletes, 1);
    ASSERT_OK(lkv_store_close(s));

    /* Deleted from RocksDB too. */
    s = su_open(dir, 16, 0, WB);
    ASSERT_EQ(su_stats(s).cold_docs, 0);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_put_validation(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 16, 0, WB);
    uint8_t salt[32];
    uint32_t t[300];
    lkv_store_put *tx;
    lkv_dockey k;
    lkv_doc_info in;
    uint8_t blk[TINY_BB];

    lkv_tenant_salt_default(salt);
    su_doc_tokens(5, 300, t);
    /* Each refusal says which check failed, with the values (lkv_store_why). */
    ASSERT_ERR(lkv_store_put_begin(s, salt, "nope", t, 10, &tx, NULL, NULL), LKV_EPROFILE);
    ASSERT_TRUE(strstr(lkv_store_why(), "unknown profile 'nope'") != NULL);
    ASSERT_TRUE(strstr(lkv_store_why(), "tiny") != NULL); /* The known profiles. */
    ASSERT_ERR(lkv_store_put_begin(s, salt, "", t, 10, &tx, NULL, NULL), LKV_EPROFILE);
    ASSERT_TRUE(strstr(lkv_store_why(), "profile is empty") != NULL);
    ASSERT_ERR(lkv_store_put_begin(s, salt, "tiny", t, 0, &tx, NULL, NULL), LKV_EINVAL);
    ASSERT_TRUE(strstr(lkv_store_why(), "token_ids is empty") != NULL);
    /* Over max_doc_tokens: LKV_EINVAL (INVALID_ARGUMENT on the wire, as the daemon always said). */
    ASSERT_ERR(lkv_store_put_begin(s, salt, "tiny", t, 257, &tx, NULL, NULL), LKV_EINVAL);
    ASSERT_TRUE(strstr(lkv_store_why(), "257 tokens, more than the 256") != NULL);
    t[3] = 512;
    ASSERT_ERR(lkv_store_put_begin(s, salt, "tiny", t, 10, &tx, NULL, NULL), LKV_EINVAL);
    ASSERT_TRUE(strstr(lkv_store_why(), "token_ids[3] = 512 is not below vocab_size") != NULL);
    t[3] = 511;

    /* Blocks: order, size, zero tail. */
    lkv_kv_shape sh = tiny_profile("x").shape;
    uint8_t kv[3 * TINY_BB];
    su_fill_doc(&sh, 10, 5, kv);
    ASSERT_OK(lkv_store_put_begin(s, salt, "tiny", t, 10, &tx, &k, NULL));
    ASSERT_EQ(lkv_store_put_n_blocks(tx), 3);
    ASSERT_EQ(lkv_store_put_block_bytes(tx), TINY_BB);
    ASSERT_EQ(su_stats(s).puts_inflight, 1);
    ASSERT_ERR(lkv_store_put_block(tx, 1, kv + TINY_BB, TINY_BB), LKV_EINVAL);
    ASSERT_TRUE(strstr(lkv_store_why(), "block index 1 out of order: expected index 0") != NULL);
    ASSERT_ERR(lkv_store_put_block(tx, 3, kv, TINY_BB), LKV_EINVAL);
    ASSERT_TRUE(strstr(lkv_store_why(), "block index 3 out of range") != NULL);
    ASSERT_ERR(lkv_store_put_block(tx, 0, kv, TINY_BB - 1), LKV_EINVAL);
    ASSERT_TRUE(strstr(lkv_store_why(), "is 1023 bytes, expected 1024") != NULL);
    ASSERT_OK(lkv_store_put_block(tx, 0, kv, TINY_BB));
    ASSERT_TRUE(lkv_store_why()[0] == '\0'); /* A success resets the reason. */
    ASSERT_ERR(lkv_store_put_block(tx, 0, kv, TINY_BB), LKV_EINVAL);
    ASSERT_OK(lkv_store_put_block(tx, 1, kv + TINY_BB, TINY_BB));
    memcpy(blk, kv + 2 * TINY_BB, TINY_BB);
    blk[2 * 32 + 3] = 1; /* Token slot 2 of the first slab: past the 2 valid tokens. */
    ASSERT_ERR(lkv_store_put_block(tx, 2, blk, TINY_BB), LKV_EINVAL);
    blk[2 * 32 + 3] = 0;
    blk[TINY_BB - 1] = 1; /* Last slab's last token slot. */
    ASSERT_ERR(lkv_store_put_block(tx, 2, blk, TINY_BB), LKV_EINVAL);
    ASSERT_TRUE(strstr(lkv_store_why(), "past the document's end (token 10 on) must be zero") !=
                NULL);
    /* Not visible before commit. */
    ASSERT_OK(lkv_store_lookup(s, &k, 1, &in));
    ASSERT_EQ(in.present, 0);
    /* Commit with a block missing: nothing becomes visible, pages come back. */
    ASSERT_ERR(lkv_store_put_commit(tx), LKV_EINVAL);
    ASSERT_TRUE(strstr(lkv_store_why(), "after 2 of 3 blocks") != NULL);
    ASSERT_OK(lkv_store_lookup(s, &k, 1, &in));
    ASSERT_EQ(in.present, 0);
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(su_tiny_free(s), 16);
    ASSERT_EQ(st.hot_bytes, 0);
    ASSERT_EQ(st.puts_aborted, 1);
    ASSERT_EQ(st.puts_inflight, 0);

    /* Abort after every block: nothing visible either. */
    ASSERT_OK(lkv_store_put_begin(s, salt, "tiny", t, 10, &tx, &k, NULL));
    for (uint32_t i = 0; i < 3; i++) {
        ASSERT_OK(lkv_store_put_block(tx, i, kv + i * TINY_BB, TINY_BB));
    }
    lkv_store_put_abort(tx);
    ASSERT_OK(lkv_store_lookup(s, &k, 1, &in));
    ASSERT_EQ(in.present, 0);
    ASSERT_EQ(su_tiny_free(s), 16);

    /* And a full put works. */
    ASSERT_OK(lkv_store_put_begin(s, salt, "tiny", t, 10, &tx, &k, NULL));
    for (uint32_t i = 0; i < 3; i++) {
        ASSERT_OK(lkv_store_put_block(tx, i, kv + i * TINY_BB, TINY_BB));
    }
    ASSERT_OK(lkv_store_put_commit(tx));
    ASSERT_OK(su_check(s, &k, 5, 10));
    /* A bad whole-buffer length for the convenience put. */
    ASSERT_ERR(lkv_store_put_all(s, salt, "tiny", t, 12, kv, 2 * TINY_BB, NULL), LKV_EINVAL);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_enospc(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 4, 0, WB);
    uint8_t salt[32];
    uint32_t t[20];
    lkv_store_put *tx, *tx2;
    lkv_dockey k;

    lkv_tenant_salt_default(salt);
    /* Larger than the whole hot budget. */
    su_doc_tokens(1, 20, t);
    ASSERT_ERR(lkv_store_put_begin(s, salt, "tiny", t, 17, &tx, NULL, NULL), LKV_ENOSPC);
    /* Budget held by an in-flight put. */
    ASSERT_OK(lkv_store_put_begin(s, salt, "tiny", t, 12, &tx, NULL, NULL)); /* 3 pages */
    su_doc_tokens(2, 20, t);
    lkv_store_stats before = su_stats(s);
    ASSERT_ERR(lkv_store_put_begin(s, salt, "tiny", t, 8, &tx2, NULL, NULL), LKV_ENOSPC);
    lkv_store_stats after = su_stats(s);
    before.disk_free_bytes = after.disk_free_bytes = 0; /* Other processes write too. */
    ASSERT_TRUE(memcmp(&before, &after, sizeof before) == 0);
    lkv_store_put_abort(tx);
    ASSERT_OK(lkv_store_put_begin(s, salt, "tiny", t, 8, &tx2, NULL, NULL));
    lkv_store_put_abort(tx2);

    /* Budget held by a pinned document. Flushes: the writer pins what it persists. */
    ASSERT_OK(su_put(s, 3, 16, &k)); /* 4 pages: the whole arena. */
    ASSERT_OK(lkv_store_flush(s));
    ASSERT_OK(lkv_store_pin(s, &k, NULL, 0, NULL));
    before = su_stats(s);
    ASSERT_ERR(su_put(s, 4, 4, NULL), LKV_ENOSPC);
    after = su_stats(s);
    before.disk_free_bytes = after.disk_free_bytes = 0; /* Other processes write too. */
    ASSERT_TRUE(memcmp(&before, &after, sizeof before) == 0);
    ASSERT_ERR(lkv_store_delete(s, &k), LKV_EBUSY);
    ASSERT_ERR(lkv_store_demote(s, &k), LKV_EBUSY);
    ASSERT_OK(lkv_store_unpin(s, &k));
    ASSERT_ERR(lkv_store_unpin(s, &k), LKV_EINVAL);
    ASSERT_OK(su_put(s, 4, 4, NULL));  /* Now the pinned doc can be evicted (demoted). */
    ASSERT_OK(su_check(s, &k, 3, 16)); /* Still readable from the cold tier. */
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_tiers(void)
{
    char *dir = su_tmpdir();
    /* Hot: 4 pages = two 2-block docs. Cold: three 2-block docs of payload. */
    lkv_store *s = su_open(dir, 4, 3 * 2 * TINY_BB, WB);
    lkv_dockey k[5];
    lkv_doc_info in;

    /* Flushes keep the writer from pinning a document while a put picks its victim. */
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(su_put(s, 10 + (uint64_t)i, 8, &k[i]));
        ASSERT_OK(lkv_store_flush(s));
    }
    /* Third put evicts doc 0 (LRU) from hot; it is already persisted. */
    ASSERT_OK(su_put(s, 12, 8, &k[2]));
    ASSERT_OK(lkv_store_flush(s));
    ASSERT_OK(lkv_store_lookup(s, &k[0], 1, &in));
    ASSERT_EQ(in.present, 1);
    ASSERT_EQ(in.tier, LKV_TIER_COLD);
    ASSERT_EQ(in.persisted, 1);
    ASSERT_OK(lkv_store_lookup(s, &k[2], 1, &in));
    ASSERT_EQ(in.tier, LKV_TIER_HOT);
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(st.evictions_hot, 1);
    ASSERT_EQ(st.hits_cold, 1);
    ASSERT_EQ(st.hot_docs, 2);

    /* A get of the cold doc promotes it (evicting doc 1 from hot); its info says where it was
     * found. */
    lkv_store_read *rd;
    ASSERT_OK(lkv_store_get_begin(s, &k[0], &rd, &in));
    ASSERT_EQ(in.tier, LKV_TIER_COLD);
    ASSERT_EQ(in.promoted, 1);
    ASSERT_TRUE(lkv_store_get_pages(rd) != NULL);
    lkv_store_get_end(rd);
    ASSERT_OK(lkv_store_get_begin(s, &k[0], &rd, &in));
    ASSERT_EQ(in.tier, LKV_TIER_HOT);
    ASSERT_EQ(in.promoted, 0);
    lkv_store_get_end(rd);
    ASSERT_OK(su_check(s, &k[0], 10, 8));
    ASSERT_OK(lkv_store_lookup(s, &k[0], 1, &in));
    ASSERT_EQ(in.tier, LKV_TIER_HOT);
    ASSERT_OK(lkv_store_lookup(s, &k[1], 1, &in));
    ASSERT_EQ(in.tier, LKV_TIER_COLD);
    st = su_stats(s);
    ASSERT_EQ(st.promotions, 1);
    ASSERT_EQ(st.evictions_hot, 2);
    ASSERT_OK(su_check(s, &k[1], 11, 8)); /* Promote it back. */

    /* Fill the cold tier past its budget: the least recently used cold doc leaves entirely. */
    ASSERT_OK(lkv_store_flush(s));
    ASSERT_OK(su_put(s, 13, 8, &k[3]));
    ASSERT_OK(lkv_store_flush(s));
    ASSERT_OK(su_put(s, 14, 8, &k[4]));
    ASSERT_OK(lkv_store_flush(s));
    st = su_stats(s);
    ASSERT_TRUE(st.cold_bytes <= 3 * 2 * TINY_BB);
    ASSERT_TRUE(st.evictions_cold >= 1);
    int present = 0, evicted = 0;
    for (int i = 0; i < 5; i++) {
        ASSERT_OK(lkv_store_lookup(s, &k[i], 1, &in));
        if (in.present) {
            present++;
            ASSERT_OK(su_check(s, &k[i], 10 + (uint64_t)i, 8));
        } else {
            ASSERT_EQ(in.miss_cause, LKV_MISS_EVICTED);
            evicted++;
        }
    }
    ASSERT_TRUE(evicted >= 1);
    ASSERT_TRUE(present >= 3);
    st = su_stats(s);
    ASSERT_EQ(st.misses_by_cause[LKV_MISS_EVICTED], evicted);

    /* Admin demotion. */
    ASSERT_OK(lkv_store_lookup(s, &k[4], 1, &in));
    if (in.present && in.tier == LKV_TIER_HOT) {
        ASSERT_OK(lkv_store_demote(s, &k[4]));
        ASSERT_OK(lkv_store_lookup(s, &k[4], 1, &in));
        ASSERT_TRUE(!in.present || in.tier == LKV_TIER_COLD);
    }
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_profile_mismatch(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 16, 0, WB);
    uint8_t salt[32];
    uint32_t t[8];
    lkv_doc_info in;
    lkv_tenant_salt_default(salt);
    ASSERT_OK(su_put(s, 20, 8, NULL));
    su_doc_tokens(20, 8, t);
    ASSERT_OK(lkv_store_lookup_tokens(s, salt, "tiny3", t, 8, NULL, &in));
    ASSERT_EQ(in.present, 0);
    ASSERT_EQ(in.miss_cause, LKV_MISS_PROFILE);
    ASSERT_EQ(su_stats(s).misses_by_cause[LKV_MISS_PROFILE], 1);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_profile_removed(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 16, 0, WT);
    uint8_t salt[32];
    uint32_t t[8];
    lkv_dockey k;
    lkv_doc_info in;
    lkv_kv_shape sh3 = su_profiles[1].shape;
    uint8_t kv[2 * 1536];

    lkv_tenant_salt_default(salt);
    su_doc_tokens(70, 8, t);
    su_fill_doc(&sh3, 8, 70, kv);
    ASSERT_OK(lkv_store_put_all(s, salt, "tiny3", t, 8, kv, sizeof kv, &k));
    ASSERT_OK(lkv_store_close(s));

    /* Reopen without "tiny3": its document is kept (and counted) but never served. */
    lkv_store_config c;
    lkv_profile only = tiny_profile("tiny");
    memset(&c, 0, sizeof c);
    c.data_dir = dir;
    c.hot_bytes = 16 * 4096;
    c.hot_backend = LKV_HOT_HOST;
    c.profiles = &only;
    c.n_profiles = 1;
    ASSERT_OK(lkv_store_open(&c, &s));
    ASSERT_OK(lkv_store_lookup(s, &k, 1, &in));
    ASSERT_EQ(in.present, 0);
    ASSERT_EQ(in.miss_cause, LKV_MISS_PROFILE);
    ASSERT_OK(lkv_store_lookup_tokens(s, salt, "tiny", t, 8, NULL, &in));
    ASSERT_EQ(in.miss_cause, LKV_MISS_PROFILE);
    lkv_store_read *rd;
    ASSERT_ERR(lkv_store_get_begin(s, &k, &rd, &in), LKV_EPROFILE);
    ASSERT_EQ(su_stats(s).cold_docs, 1);
    ASSERT_OK(lkv_store_close(s));

    /* With the profile back (under another name: the fingerprint is what counts) it is served. */
    lkv_profile both[2] = {tiny_profile("tiny"), su_profiles[1]};
    snprintf(both[1].name, sizeof both[1].name, "renamed");
    both[1].hot_bytes = 0; /* Shares the 64 KiB with "tiny". */
    c.profiles = both;
    c.n_profiles = 2;
    ASSERT_OK(lkv_store_open(&c, &s));
    uint8_t got[sizeof kv];
    ASSERT_OK(lkv_store_get_all(s, &k, got, sizeof got, &in));
    ASSERT_TRUE(memcmp(got, kv, sizeof kv) == 0);
    ASSERT_TRUE(strcmp(in.profile->name, "renamed") == 0);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_restart(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 64, 0, WB);
    lkv_dockey k[20];
    for (int i = 0; i < 20; i++) {
        ASSERT_OK(su_put(s, 100 + (uint64_t)i, 1 + (uint32_t)i * 3, &k[i]));
    }
    /* No flush: close must persist every queued document. */
    ASSERT_OK(lkv_store_close(s));
    s = su_open(dir, 64, 0, WB);
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(st.cold_docs, 20);
    ASSERT_EQ(st.hot_docs, 0);
    for (int i = 0; i < 20; i++) {
        lkv_doc_info in;
        ASSERT_OK(lkv_store_lookup(s, &k[i], 1, &in));
        ASSERT_EQ(in.present, 1);
        ASSERT_EQ(in.tier, LKV_TIER_COLD);
        ASSERT_OK(su_check(s, &k[i], 100 + (uint64_t)i, 1 + (uint32_t)i * 3));
    }
    ASSERT_OK(lkv_store_close(s));
    /* A smaller cold budget at restart evicts down to it. */
    s = su_open(dir, 64, 10 * TINY_BB, WB);
    st = su_stats(s);
    ASSERT_TRUE(st.cold_bytes <= 10 * TINY_BB);
    ASSERT_TRUE(st.cold_docs < 20);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

/* Overwrites block index of key in the closed store at dir with a flipped payload byte. */
static void corrupt_block(const char *dir, const lkv_dockey *key, uint32_t index)
{
    char *err = NULL;
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_options_set_enable_blob_files(o, 1);
    rocksdb_options_set_min_blob_size(o, 512);
    rocksdb_t *db = rocksdb_open(o, dir, &err);
    ASSERT_TRUE(err == NULL);
    uint8_t bk[LKV_COLD_BLOCK_KEY_BYTES];
    lkv_cold_block_key(key, index, bk);
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    size_t vlen;
    char *v = rocksdb_get(db, ro, (const char *)bk, sizeof bk, &vlen, &err);
    ASSERT_TRUE(err == NULL && v != NULL && vlen == TINY_BB + LKV_COLD_BLOCK_HDR_BYTES);
    v[LKV_COLD_BLOCK_HDR_BYTES + 100] ^= 0x40;
    rocksdb_put(db, wo, (const char *)bk, sizeof bk, v, vlen, &err);
    ASSERT_TRUE(err == NULL);
    rocksdb_free(v);
    rocksdb_readoptions_destroy(ro);
    rocksdb_writeoptions_destroy(wo);
    rocksdb_close(db);
    rocksdb_options_destroy(o);
}

static void test_corrupt(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 8, 0, WT);
    lkv_dockey k1, k2, big;
    lkv_doc_info in;
    ASSERT_OK(su_put(s, 30, 12, &k1));
    ASSERT_OK(su_put(s, 31, 12, &k2));
    ASSERT_OK(su_put(s, 32, 32, &big)); /* 8 pages: the whole arena. */
    ASSERT_OK(lkv_store_close(s));
    corrupt_block(dir, &k1, 1);
    corrupt_block(dir, &k2, 2);

    s = su_open(dir, 8, 0, WT);
    /* Promotion path: the corrupt block is found while promoting; a miss, deleted, counted. */
    ASSERT_OK(lkv_store_lookup(s, &k1, 1, &in));
    ASSERT_EQ(in.present, 1); /* Lookups read metadata only. */
    ASSERT_ERR(su_check(s, &k1, 30, 12), LKV_ECORRUPT);
    ASSERT_OK(lkv_store_lookup(s, &k1, 1, &in));
    ASSERT_EQ(in.present, 0);
    ASSERT_EQ(in.miss_cause, LKV_MISS_CORRUPT);
    ASSERT_EQ(su_stats(s).corrupt_blocks, 1);

    /* Streaming path: the hot tier is held by a pinned doc, so the get streams from RocksDB and
     * the corrupt block fails the stream at block 2. */
    ASSERT_OK(lkv_store_pin(s, &big, NULL, 0, NULL));
    lkv_store_read *rd;
    uint8_t buf[TINY_BB];
    ASSERT_OK(lkv_store_get_begin(s, &k2, &rd, &in));
    ASSERT_TRUE(lkv_store_get_pages(rd) == NULL);
    ASSERT_OK(lkv_store_get_block(rd, 0, buf, sizeof buf));
    ASSERT_OK(lkv_store_get_block(rd, 1, buf, sizeof buf));
    ASSERT_ERR(lkv_store_get_block(rd, 2, buf, sizeof buf), LKV_ECORRUPT);
    lkv_store_get_end(rd);
    ASSERT_OK(lkv_store_lookup(s, &k2, 1, &in));
    ASSERT_EQ(in.present, 0);
    ASSERT_EQ(in.miss_cause, LKV_MISS_CORRUPT);
    ASSERT_EQ(su_stats(s).corrupt_blocks, 2);
    ASSERT_OK(lkv_store_unpin(s, &big));
    ASSERT_OK(su_check(s, &big, 32, 32));
    ASSERT_OK(lkv_store_close(s));

    /* Both were deleted from RocksDB. */
    s = su_open(dir, 8, 0, WT);
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(st.cold_docs, 1);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_read_vs_delete(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 8, 0, WB);
    lkv_dockey k;
    lkv_store_read *rd;
    lkv_doc_info in;
    uint8_t want[2 * TINY_BB], got[TINY_BB];
    lkv_kv_shape sh = tiny_profile("x").shape;

    ASSERT_OK(su_put(s, 40, 8, &k));
    su_fill_doc(&sh, 8, 40, want);
    ASSERT_OK(lkv_store_get_begin(s, &k, &rd, &in));
    ASSERT_TRUE(lkv_store_get_pages(rd) != NULL);
    ASSERT_EQ(lkv_store_get_info(rd)->n_blocks, 2);
    ASSERT_OK(lkv_store_get_block(rd, 0, got, sizeof got));
    ASSERT_TRUE(memcmp(got, want, TINY_BB) == 0);
    ASSERT_OK(lkv_store_delete(s, &k));
    ASSERT_OK(lkv_store_lookup(s, &k, 1, &in));
    ASSERT_EQ(in.present, 0);
    /* A new document of the same key can be put while the old one is still being read. */
    ASSERT_OK(su_put(s, 40, 8, &k));
    ASSERT_OK(lkv_store_delete(s, &k));
    /* The reader still reads the intact block 1. */
    ASSERT_OK(lkv_store_get_block(rd, 1, got, sizeof got));
    ASSERT_TRUE(memcmp(got, want + TINY_BB, TINY_BB) == 0);
    ASSERT_ERR(lkv_store_get_block(rd, 2, got, sizeof got), LKV_EINVAL);
    ASSERT_TRUE(su_tiny_free(s) < 8);
    lkv_store_get_end(rd);
    ASSERT_OK(lkv_store_flush(s)); /* The writer may still hold the second copy. */
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(su_tiny_free(s), 8);
    ASSERT_EQ(st.hot_bytes, 0);
    ASSERT_EQ(st.reads_inflight, 0);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_faults(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 8, 0, WT);
    lkv_dockey k;
    lkv_doc_info in;
    /* Write-through: a failed RocksDB write fails the put, nothing becomes visible. */
    lkv_store_fault_cold_writes(s, 1);
    ASSERT_ERR(su_put(s, 50, 8, &k), LKV_EIO);
    ASSERT_OK(lkv_store_lookup(s, &k, 1, &in));
    ASSERT_EQ(in.present, 0);
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(su_tiny_free(s), 8);
    ASSERT_EQ(st.cold_docs, 0);
    ASSERT_EQ(st.cold_budget, UINT64_MAX);
    ASSERT_OK(su_put(s, 50, 8, &k));
    ASSERT_OK(lkv_store_close(s));

    /* Write-back: the writer's failure leaves the document hot only, and is counted. */
    s = su_open(dir, 8, 0, WB);
    lkv_store_fault_cold_writes(s, 1);
    ASSERT_OK(su_put(s, 51, 8, &k));
    ASSERT_ERR(lkv_store_flush(s), LKV_EIO);
    ASSERT_OK(lkv_store_lookup(s, &k, 1, &in));
    ASSERT_EQ(in.present, 1);
    ASSERT_EQ(in.persisted, 0);
    ASSERT_EQ(su_stats(s).wb_failed, 1);
    ASSERT_OK(su_check(s, &k, 51, 8));
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

/* ---- threads ------------------------------------------------------------------------------ */

#define T_KEYS    24
#define T_THREADS 4
#define T_OPS     300

/* Walks the visible documents (lkv_store_foreach) and compares the tier sizes with the
 * store's counters (kept incrementally, never walked). */
typedef struct recount {
    uint64_t hot_docs, hot_blocks, cold_docs, cold_blocks, cold_bytes;
} recount;

static int recount_cb(void *ctx, const lkv_dockey *k, const lkv_doc_info *in)
{
    recount *r = ctx;
    (void)k;
    if (in->tier == LKV_TIER_HOT) {
        r->hot_docs++;
        r->hot_blocks += in->n_blocks;
    }
    if (in->persisted) {
        r->cold_docs++;
        r->cold_blocks += in->n_blocks;
        r->cold_bytes += (uint64_t)in->n_blocks * in->block_bytes;
    }
    return 0;
}

static void recount_check(lkv_store *s)
{
    recount r;
    memset(&r, 0, sizeof r);
    ASSERT_OK(lkv_store_foreach(s, recount_cb, &r));
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(st.hot_docs, r.hot_docs);
    ASSERT_EQ(st.hot_blocks, r.hot_blocks);
    ASSERT_EQ(st.cold_docs, r.cold_docs);
    ASSERT_EQ(st.cold_blocks, r.cold_blocks);
    ASSERT_EQ(st.cold_bytes, r.cold_bytes);
}

typedef struct targ {
    lkv_store *s;
    uint64_t seed;
    int fails;
} targ;

static void *worker(void *arg)
{
    targ *a = arg;
    uint64_t r = a->seed;
    for (int op = 0; op < T_OPS; op++) {
        r = su_mix(r + 1);
        uint64_t doc = r % T_KEYS;
        uint32_t n = 1 + (uint32_t)(doc % 9) * 2; /* 1..17 tokens: 1..5 blocks */
        lkv_dockey k;
        lkv_doc_info in;
        switch ((r >> 20) % 6) {
        case 0:
        case 1: {
            int rc = su_put(a->s, doc, n, &k);
            if (rc != 0 && rc != LKV_ENOSPC) {
                fprintf(stderr, "   put: %s\n", lkv_err_name(rc));
                a->fails++;
            }
            break;
        }
        case 2:
        case 3: {
            su_key(a->s, doc, n, &k);
            /* Absent is fine; su_check fails the test on different bytes. */
            int rc = su_check(a->s, &k, doc, n);
            if (rc != 0 && rc != LKV_ENOTFOUND) {
                fprintf(stderr, "   get: %s\n", lkv_err_name(rc));
                a->fails++;
            }
            break;
        }
        case 4:
            su_key(a->s, doc, n, &k);
            lkv_store_lookup(a->s, &k, 1, &in);
            break;
        case 5: {
            su_key(a->s, doc, n, &k);
            int rc = lkv_store_delete(a->s, &k);
            if (rc != 0 && rc != LKV_ENOTFOUND && rc != LKV_EBUSY) {
                fprintf(stderr, "   delete: %s\n", lkv_err_name(rc));
                a->fails++;
            }
            break;
        }
        }
    }
    return NULL;
}

static void test_threads(void)
{
    const char *env = getenv("LKV_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : 1;
    fprintf(stderr, "   seed %llu (LKV_TEST_SEED)\n", (unsigned long long)seed);
    for (int run = 0; run < 2 * LKV_POLICY__COUNT; run++) {
        int mode = run % 2;
        su_policy_kind = run / 2;
        if (mode == 1 && su_policy_kind > 1) {
            continue; /* Write-through (fsync-bound) with lru and gdsf only. */
        }
        fprintf(stderr, "   %s, %s\n", lkv_durability_name(mode ? WT : WB),
                lkv_policy_name(su_policy_kind));
        char *dir = su_tmpdir();
        lkv_store *s = su_open(dir, 12, 20 * TINY_BB, mode ? WT : WB);
        pthread_t th[T_THREADS];
        targ a[T_THREADS];
        for (int i = 0; i < T_THREADS; i++) {
            a[i] = (targ){s, seed * 100 + (uint64_t)i, 0};
            pthread_create(&th[i], NULL, worker, &a[i]);
        }
        for (int i = 0; i < T_THREADS; i++) {
            pthread_join(th[i], NULL);
            ASSERT_EQ(a[i].fails, 0);
        }
        /* A cold policy with an admission contest (TinyLFU kinds) may decline a write-back
         * document under this churn: flush then says EIO, and every such failure must be a
         * decline (no write failed). */
        int frc = lkv_store_flush(s);
        lkv_store_stats st = su_stats(s);
        if (frc != 0) {
            ASSERT_ERR(frc, LKV_EIO);
            ASSERT_EQ(st.wb_cold_declined, st.wb_failed);
        }
        ASSERT_EQ(st.puts_inflight, 0);
        ASSERT_EQ(st.reads_inflight, 0);
        ASSERT_TRUE(st.hot_bytes <= st.hot_budget);
        /* Bytes really held: pages held times their region's page size, in every region. */
        uint64_t held = 0;
        for (int r = 0; r < lkv_store_profile_count(s); r++) {
            lkv_store_region rg;
            ASSERT_OK(lkv_store_region_get(s, r, &rg));
            ASSERT_EQ(rg.bytes_used, rg.page_bytes * (rg.n_pages - rg.pages_free));
            held += rg.bytes_used;
        }
        ASSERT_EQ(st.hot_bytes, held);
        ASSERT_EQ(st.hot_bytes_pinned, 0);
        ASSERT_EQ(st.corrupt_blocks, 0); /* Also counts visible documents with missing data. */
        recount_check(s);                /* The O(1) tier counters agree with a walk. */
        ASSERT_OK(lkv_store_close(s));
        /* Everything that survived a restart reads back intact. */
        s = su_open(dir, 12, 20 * TINY_BB, mode ? WT : WB);
        for (uint64_t d = 0; d < T_KEYS; d++) {
            lkv_dockey k;
            uint32_t n = 1 + (uint32_t)(d % 9) * 2;
            su_key(s, d, n, &k);
            int rc = su_check(s, &k, d, n);
            ASSERT_TRUE(rc == 0 || rc == LKV_ENOTFOUND);
        }
        ASSERT_TRUE(su_stats(s).cold_bytes <= 20 * TINY_BB);
        ASSERT_OK(lkv_store_close(s));
        su_rmdir(dir);
    }
    su_policy_kind = 0;
}

static int count_cb(void *ctx, const lkv_dockey *k, const lkv_doc_info *in)
{
    (void)k;
    ASSERT_EQ(in->present, 1);
    (*(int *)ctx)++;
    return 0;
}

static void test_misc(void)
{
    int v;
    ASSERT_OK(lkv_hot_backend_parse("cuda", &v));
    ASSERT_EQ(v, LKV_HOT_CUDA);
    ASSERT_ERR(lkv_hot_backend_parse("gpu", &v), LKV_EINVAL);
    ASSERT_OK(lkv_durability_parse("write-through", &v));
    ASSERT_EQ(v, WT);
    ASSERT_ERR(lkv_durability_parse("sometimes", &v), LKV_EINVAL);
    ASSERT_TRUE(strcmp(lkv_miss_cause_name(LKV_MISS_EVICTED), "evicted") == 0);

    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 8, 0, WB);
    ASSERT_OK(su_put(s, 60, 5, NULL));
    ASSERT_OK(su_put(s, 61, 5, NULL));
    int n = 0;
    ASSERT_OK(lkv_store_foreach(s, count_cb, &n));
    ASSERT_EQ(n, 2);
    lkv_store_arena_info ai;
    lkv_store_arena_info_get(s, &ai);
    if (ai.backend == LKV_HOT_HOST) {
        ASSERT_TRUE(ai.shm_name != NULL && ai.shm_name[0] == '/');
        ASSERT_EQ(ai.cuda_device, -1);
    } else {
        ASSERT_EQ(ai.backend, LKV_HOT_CUDA);
        ASSERT_TRUE(ai.shm_name == NULL);
        ASSERT_EQ(ai.cuda_device, 0);
    }
    /* One region per profile, each with pages of its own block size (no 4 KiB rounding). */
    ASSERT_EQ(ai.n_regions, 2);
    lkv_store_region rg0, rg1;
    ASSERT_OK(lkv_store_region_get(s, 0, &rg0));
    ASSERT_OK(lkv_store_region_get(s, 1, &rg1));
    ASSERT_ERR(lkv_store_region_get(s, 2, &rg1), LKV_EINVAL);
    ASSERT_TRUE(rg0.profile == lkv_store_profile_find(s, "tiny"));
    ASSERT_EQ(rg0.page_bytes, TINY_BB);
    ASSERT_EQ(rg1.page_bytes, TINY_BB / 2 * 3);
    ASSERT_EQ(rg0.n_pages, 8);
    ASSERT_EQ(rg1.n_pages, 8);
    ASSERT_EQ(rg0.base_offset, 0);
    ASSERT_EQ(rg1.base_offset, 2u << 20);
    ASSERT_EQ(ai.arena_bytes, (2u << 20) + 8 * 1536);
    ASSERT_EQ(lkv_store_profile_count(s), 2);
    ASSERT_TRUE(lkv_store_profile_at(s, 1) == lkv_store_profile_find(s, "tiny3"));
    ASSERT_TRUE(lkv_store_profile_at(s, 2) == NULL);
    ASSERT_OK(lkv_store_close(s));

    /* Config errors. */
    lkv_store_config c;
    lkv_store *bad;
    lkv_profile ps[2] = {tiny_profile("a"), tiny_profile("a")};
    memset(&c, 0, sizeof c);
    c.data_dir = dir;
    c.hot_bytes = 1 << 20;
    c.profiles = ps;
    c.n_profiles = 2;
    ASSERT_ERR(lkv_store_open(&c, &bad), LKV_ECONFIG); /* Duplicate names. */
    c.n_profiles = 1;
    c.hot_bytes = 100;
    ASSERT_ERR(lkv_store_open(&c, &bad), LKV_ECONFIG); /* Less than a page. */
    c.hot_bytes = 1 << 20;
    ps[0].shape.head_dim = 7;
    ASSERT_ERR(lkv_store_open(&c, &bad), LKV_ECONFIG); /* Bad profile. */
    ps[0].shape.head_dim = 8;
    c.data_dir = NULL;
    ASSERT_ERR(lkv_store_open(&c, &bad), LKV_ECONFIG);
    ASSERT_OK(lkv_store_close(NULL));
    su_rmdir(dir);
}

/* Pins are counted once, in the store: user pins and readers stack, the policy entry stays
 * pinned until the last one goes, also across a delete (the entry moves to a private id while
 * a new document of the same key is stored). */
static void test_pin_counts(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 16, 0, WB);
    lkv_dockey k;
    lkv_doc_info in;
    lkv_store_read *rd1, *rd2;
    uint8_t want[3 * TINY_BB], got[TINY_BB];
    lkv_kv_shape sh = tiny_profile("x").shape;

    ASSERT_OK(su_put(s, 77, 10, &k)); /* 3 blocks. */
    su_fill_doc(&sh, 10, 77, want);
    ASSERT_OK(lkv_store_flush(s));
    ASSERT_EQ(su_stats(s).hot_bytes_pinned, 0);
    for (uint32_t i = 1; i <= 3; i++) {
        ASSERT_OK(lkv_store_pin(s, &k, NULL, 0, &in));
        ASSERT_EQ(in.pins, i);
        ASSERT_EQ(su_stats(s).hot_bytes_pinned, 3 * TINY_BB);
    }
    ASSERT_OK(lkv_store_get_begin(s, &k, &rd1, NULL));
    ASSERT_OK(lkv_store_get_begin(s, &k, &rd2, NULL));
    ASSERT_ERR(lkv_store_delete(s, &k), LKV_EBUSY);
    ASSERT_ERR(lkv_store_demote(s, &k), LKV_EBUSY);
    for (int i = 0; i < 3; i++) {
        ASSERT_OK(lkv_store_unpin(s, &k));
    }
    ASSERT_ERR(lkv_store_unpin(s, &k), LKV_EINVAL);
    ASSERT_OK(lkv_store_lookup(s, &k, 1, &in));
    ASSERT_EQ(in.pins, 0);
    ASSERT_EQ(su_stats(s).hot_bytes_pinned, 3 * TINY_BB); /* The two readers. */
    ASSERT_OK(lkv_store_delete(s, &k));
    ASSERT_OK(su_put(s, 77, 10, &k)); /* Same key, a new document. */
    ASSERT_OK(lkv_store_flush(s));
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(st.hot_bytes, 6 * TINY_BB);
    ASSERT_EQ(st.hot_bytes_pinned, 3 * TINY_BB);
    ASSERT_OK(lkv_store_get_block(rd1, 2, got, sizeof got));
    ASSERT_TRUE(memcmp(got, want + 2 * TINY_BB, TINY_BB) == 0);
    lkv_store_get_end(rd1);
    ASSERT_EQ(su_stats(s).hot_bytes_pinned, 3 * TINY_BB); /* One reader left. */
    ASSERT_EQ(su_tiny_free(s), 10);
    ASSERT_OK(lkv_store_get_block(rd2, 0, got, sizeof got));
    ASSERT_TRUE(memcmp(got, want, TINY_BB) == 0);
    lkv_store_get_end(rd2);
    st = su_stats(s);
    ASSERT_EQ(st.hot_bytes_pinned, 0);
    ASSERT_EQ(st.hot_bytes, 3 * TINY_BB);
    ASSERT_EQ(su_tiny_free(s), 13);
    /* The new document is unpinned: it can be demoted now, and pinned and unpinned again. */
    ASSERT_OK(lkv_store_pin(s, &k, NULL, 0, &in));
    ASSERT_OK(lkv_store_unpin(s, &k));
    ASSERT_OK(lkv_store_demote(s, &k));
    ASSERT_EQ(su_stats(s).hot_bytes, 0);
    ASSERT_OK(su_check(s, &k, 77, 10));
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

typedef struct kv_seen {
    char keys[96][48]; /* "section.key". */
    double vals[96];
    int n;
} kv_seen;

static int kv_collect(void *ctx, const lkv_stat_desc *d, double v)
{
    kv_seen *s = ctx;
    ASSERT_TRUE(s->n < 96);
    snprintf(s->keys[s->n], sizeof(s->keys[0]), "%s.%s", d->section, d->key);
    s->vals[s->n++] = v;
    return 0;
}

static double kv_get(const kv_seen *s, const char *key)
{
    for (int i = 0; i < s->n; i++) {
        if (strcmp(s->keys[i], key) == 0) {
            return s->vals[i];
        }
    }
    LKV_FAIL("stat %s is not registered", key);
}

/* The store's stats in a registry: every field, with the values of lkv_store_stats_get; one
 * store per registry; unregistered on close. */
static void test_stats_registry(void)
{
    char *dir = su_tmpdir(), *dir2 = su_tmpdir();
    lkv_stats *reg;
    lkv_dockey k, never;
    lkv_doc_info in;
    ASSERT_OK(lkv_stats_create(&reg));
    su_registry = reg;
    lkv_store *s = su_open(dir, 16, 0, WB);
    ASSERT_TRUE(lkv_store_stats_registry(s) == reg);
    int n = lkv_stats_count(reg);
    ASSERT_TRUE(n >= 39);
    ASSERT_OK(su_put(s, 5, 10, &k));
    su_key(s, 6, 10, &never);
    ASSERT_OK(lkv_store_lookup(s, &k, 1, &in));
    ASSERT_OK(lkv_store_lookup(s, &never, 1, &in));
    ASSERT_OK(lkv_store_flush(s));

    kv_seen v = {0};
    ASSERT_OK(lkv_stats_foreach(reg, NULL, kv_collect, &v));
    ASSERT_EQ(v.n, n);
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(kv_get(&v, "hot.docs"), st.hot_docs);
    ASSERT_EQ(kv_get(&v, "hot.docs"), 1);
    ASSERT_EQ(kv_get(&v, "hot.blocks"), 3);
    ASSERT_EQ(kv_get(&v, "hot.pages_free"), st.hot_pages_free);
    ASSERT_EQ(kv_get(&v, "hot.bytes_budget"), 16 * (TINY_BB + TINY_BB / 2 * 3));
    ASSERT_EQ(kv_get(&v, "regions.tiny.bytes_used"), 3 * TINY_BB);
    ASSERT_EQ(kv_get(&v, "regions.tiny.bytes_budget"), 16 * TINY_BB);
    ASSERT_EQ(kv_get(&v, "regions.tiny3.bytes_used"), 0);
    ASSERT_EQ(kv_get(&v, "regions.tiny3.pages_free"), 16);
    ASSERT_EQ(kv_get(&v, "cold.docs"), 1);
    ASSERT_EQ(kv_get(&v, "cold.bytes_budget"), 0); /* Unlimited. */
    ASSERT_EQ(kv_get(&v, "lookups.hits_hot"), 1);
    ASSERT_EQ(kv_get(&v, "lookups.misses"), 1);
    ASSERT_EQ(kv_get(&v, "lookups.misses_never"), 1);
    ASSERT_EQ(kv_get(&v, "lookups.misses_evicted"), 0);
    ASSERT_NEAR(kv_get(&v, "lookups.hit_rate_docs"), 0.5, 1e-12);
    ASSERT_EQ(kv_get(&v, "puts.puts"), 1);
    ASSERT_EQ(kv_get(&v, "persistence.wb_persisted"), st.wb_persisted);
    ASSERT_EQ(kv_get(&v, "persistence.wb_persisted"), 1);

    /* A second store in the same registry is refused, and leaves nothing behind. */
    lkv_store_config c;
    lkv_store *s2 = NULL;
    su_config(&c, dir2, 16, 0, WB);
    ASSERT_ERR(lkv_store_open(&c, &s2), LKV_EEXIST);
    ASSERT_TRUE(s2 == NULL);
    ASSERT_EQ(lkv_stats_count(reg), n);
    ASSERT_OK(lkv_store_close(s));
    ASSERT_EQ(lkv_stats_count(reg), 0);
    ASSERT_OK(lkv_store_open(&c, &s2)); /* Free again. */
    ASSERT_EQ(lkv_stats_count(reg), n);
    /* Stores without a registry each get their own: no clash. */
    su_registry = NULL;
    s = su_open(dir, 16, 0, WB);
    ASSERT_TRUE(lkv_store_stats_registry(s) != reg);
    ASSERT_EQ(lkv_stats_count(lkv_store_stats_registry(s)), n);
    ASSERT_EQ(su_stats(s).cold_docs, 1); /* Reopened: the document persisted. */
    ASSERT_OK(lkv_store_close(s));
    ASSERT_OK(lkv_store_close(s2));
    lkv_stats_destroy(reg);
    su_rmdir(dir);
    su_rmdir(dir2);
}

/* Concurrent puts of the same new document: one stores it, the other reports it existed. */
static void test_same_doc_puts(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 16, 0, WB);
    uint8_t salt[32];
    uint32_t t[20];
    lkv_kv_shape sh = tiny_profile("x").shape;
    uint8_t kv[3 * TINY_BB];
    lkv_store_put *a, *b;
    int ea, eb;
    lkv_tenant_salt_default(salt);
    su_doc_tokens(5, 10, t);
    su_fill_doc(&sh, 10, 5, kv);
    ASSERT_OK(lkv_store_put_begin(s, salt, "tiny", t, 10, &a, NULL, &ea));
    ASSERT_OK(lkv_store_put_begin(s, salt, "tiny", t, 10, &b, NULL, &eb));
    ASSERT_EQ(ea, 0);
    ASSERT_EQ(eb, 0); /* Neither is stored yet: both stage. */
    for (uint32_t i = 0; i < 3; i++) {
        ASSERT_OK(lkv_store_put_block(a, i, kv + i * TINY_BB, TINY_BB));
        ASSERT_OK(lkv_store_put_block(b, i, kv + i * TINY_BB, TINY_BB));
    }
    lkv_put_result ra, rb;
    ASSERT_OK(lkv_store_put_finish(a, &ra));
    ASSERT_OK(lkv_store_put_finish(b, &rb));
    ASSERT_EQ(ra.existed, 0);
    ASSERT_EQ(rb.existed, 1);
    ASSERT_EQ(rb.tier, LKV_TIER_HOT);
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(st.puts, 1);
    ASSERT_EQ(st.puts_existing, 1);
    ASSERT_EQ(st.hot_docs, 1);
    ASSERT_EQ(st.hot_bytes, 3 * TINY_BB); /* The loser's pages went back. */
    recount_check(s);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

/* The writer never blocks callers: with a hot tier of exactly one document, every put of a new
 * document right after the previous one succeeds (the writer persisting the previous one holds
 * it only while it copies it), and evicting a document nothing pins never says busy. */
static void test_writer_never_blocks(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 4, 0, WB);
    lkv_dockey k[40];
    for (int i = 0; i < 40; i++) {
        ASSERT_OK(su_put(s, 100 + (uint64_t)i, 16, &k[i])); /* 4 blocks: the whole arena. */
        if (i % 2 == 1) {
            ASSERT_OK(lkv_store_demote(s, &k[i])); /* Never EBUSY: nothing pins it. */
        }
    }
    ASSERT_OK(lkv_store_flush(s));
    for (int i = 0; i < 40; i++) {
        ASSERT_OK(su_check(s, &k[i], 100 + (uint64_t)i, 16)); /* All demoted, none dropped. */
    }
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(st.drops, 0);
    ASSERT_EQ(st.corrupt_blocks, 0);
    recount_check(s);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

/* Write-through: re-putting a document the cold budget evicted while it stayed hot persists it
 * again, so the result's "persisted" (the reply's DURABLE) is the truth. */
static void test_put_result_persisted(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 32, 2 * 3 * TINY_BB, WT); /* Cold: two 3-block documents. */
    lkv_dockey k1, k2, k3;
    ASSERT_OK(su_put(s, 1, 10, &k1));
    ASSERT_OK(su_put(s, 2, 10, &k2));
    ASSERT_OK(su_put(s, 3, 10, &k3)); /* Evicts doc 1 from the cold tier; it stays hot. */
    lkv_doc_info in;
    ASSERT_OK(lkv_store_lookup(s, &k1, 1, &in));
    ASSERT_EQ(in.present, 1);
    ASSERT_EQ(in.persisted, 0);
    uint8_t salt[32];
    uint32_t t[20];
    lkv_kv_shape sh = tiny_profile("x").shape;
    uint8_t kv[3 * TINY_BB];
    lkv_store_put *tx;
    int exists;
    lkv_tenant_salt_default(salt);
    su_doc_tokens(1, 10, t);
    su_fill_doc(&sh, 10, 1, kv);
    ASSERT_OK(lkv_store_put_begin(s, salt, "tiny", t, 10, &tx, NULL, &exists));
    ASSERT_EQ(exists, 1);
    for (uint32_t i = 0; i < 3; i++) {
        ASSERT_OK(lkv_store_put_block(tx, i, kv + i * TINY_BB, TINY_BB));
    }
    lkv_put_result r;
    ASSERT_OK(lkv_store_put_finish(tx, &r));
    ASSERT_EQ(r.existed, 1);
    ASSERT_EQ(r.persisted, 1);
    ASSERT_OK(lkv_store_lookup(s, &k1, 1, &in));
    ASSERT_EQ(in.persisted, 1);
    ASSERT_OK(lkv_store_close(s));
    s = su_open(dir, 32, 2 * 3 * TINY_BB, WT);
    ASSERT_OK(su_check(s, &k1, 1, 10)); /* On disk indeed. */
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

/* A put refused at its first block changes nothing: the room it needs (evicting, hence
 * demoting, a hot document) is only made once a block passed its checks. */
static void test_refused_put_changes_nothing(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 4, 0, WB);
    lkv_dockey ka;
    ASSERT_OK(su_put(s, 1, 16, &ka)); /* 4 pages: the whole arena. */
    uint8_t salt[32];
    uint32_t t[20];
    lkv_store_put *tx;
    lkv_tenant_salt_default(salt);
    su_doc_tokens(2, 20, t);
    lkv_store_stats before = su_stats(s);
    ASSERT_OK(lkv_store_put_begin(s, salt, "tiny", t, 3, &tx, NULL, NULL)); /* 1 page. */
    uint8_t bad[TINY_BB];
    memset(bad, 0x11, sizeof bad); /* Nonzero token slots past the document's end. */
    ASSERT_ERR(lkv_store_put_block(tx, 0, bad, sizeof bad), LKV_EINVAL);
    ASSERT_ERR(lkv_store_put_block(tx, 0, bad, 100), LKV_EINVAL);
    lkv_store_put_abort(tx);
    lkv_store_stats after = su_stats(s);
    ASSERT_EQ(after.evictions_hot, before.evictions_hot);
    ASSERT_EQ(after.demotions, before.demotions);
    ASSERT_EQ(after.hot_docs, 1);
    lkv_doc_info in;
    ASSERT_OK(lkv_store_lookup(s, &ka, 1, &in));
    ASSERT_EQ(in.tier, LKV_TIER_HOT);
    /* A valid put makes the room then (doc 1 is demoted, not lost). */
    lkv_dockey kb;
    ASSERT_OK(su_put(s, 2, 3, &kb));
    ASSERT_OK(lkv_store_lookup(s, &ka, 1, &in));
    ASSERT_EQ(in.present, 1);
    ASSERT_EQ(in.tier, LKV_TIER_COLD);
    ASSERT_OK(su_check(s, &ka, 1, 16));
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

int main(void)
{
    LKV_RUN(test_basic);
    LKV_RUN(test_put_validation);
    LKV_RUN(test_enospc);
    LKV_RUN(test_tiers);
    LKV_RUN(test_profile_mismatch);
    LKV_RUN(test_profile_removed);
    LKV_RUN(test_restart);
    LKV_RUN(test_corrupt);
    LKV_RUN(test_read_vs_delete);
    LKV_RUN(test_faults);
    LKV_RUN(test_threads);
    LKV_RUN(test_misc);
    LKV_RUN(test_pin_counts);
    LKV_RUN(test_stats_registry);
    LKV_RUN(test_same_doc_puts);
    LKV_RUN(test_writer_never_blocks);
    LKV_RUN(test_put_result_persisted);
    LKV_RUN(test_refused_put_changes_nothing);
    return 0;
}
