/*
 * test_transfer.c: lkv_transfer's store sink (daemon/cluster/lkv_transfer.c) over a real store
 * (host arena + RocksDB): a document written through the sink with priority -1 (a local
 * replica, DESIGN.md 5) is the first victim of hot pressure although it is the newest, while
 * one written with priority 0 (a document moved to this member) is evicted in LRU order like
 * any owned document; the bytes arrive intact; a shape that does not match the profile is
 * refused and stores nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "../../storage/store_util.h"
#include "lkv_transfer.h"

#define WB LKV_DURABILITY_WRITE_BACK

static int sink_rc = 1;

static void on_done(void *arg, int rc)
{
    (void)arg;
    sink_rc = rc;
}

/* Writes document seed (4 tokens of "tiny": one block) through the store sink with prio;
 * n_blocks is what the "sender" announces. Returns the sink's final rc; key gets the key. */
static int sink_put(lkv_store *s, uint64_t seed, int prio, uint32_t n_blocks, lkv_dockey *key)
{
    uint8_t salt[32];
    uint32_t t[4];
    lkv_kv_shape sh = tiny_profile("x").shape;
    uint8_t *kv = malloc(TINY_BB);
    lkv_tenant_salt_default(salt);
    su_doc_tokens(seed, 4, t);
    su_fill_doc(&sh, 4, seed, kv);
    sink_rc = 1;
    void *k = lkv_transfer_store_sink(s, salt, "tiny", t, 4, prio, on_done, NULL);
    int rc = lkv_transfer_store_sink_ops.begin(k, n_blocks, TINY_BB);
    if (rc == 0) {
        rc = lkv_transfer_store_sink_ops.block(k, 0, kv, TINY_BB);
    }
    lkv_transfer_store_sink_ops.end(k, rc);
    free(kv);
    if (key != NULL) {
        su_key(s, seed, 4, key);
    }
    return sink_rc;
}

static int tier_of(lkv_store *s, const lkv_dockey *k)
{
    lkv_doc_info in;
    ASSERT_OK(lkv_store_lookup(s, k, 1, &in));
    return in.tier;
}

static void test_replica_evicted_first(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 4, 0, WB);
    lkv_dockey m1, m2, m3, rep;
    ASSERT_OK(su_put(s, 1, 4, &m1)); /* Oldest owned document. */
    ASSERT_OK(su_put(s, 2, 4, &m2));
    ASSERT_OK(su_put(s, 3, 4, &m3));
    ASSERT_OK(sink_put(s, 4, -1, 1, &rep)); /* The replica: the newest. */
    ASSERT_OK(su_check(s, &rep, 4, 4));     /* Byte for byte. */
    ASSERT_OK(lkv_store_flush(s));
    ASSERT_OK(su_put(s, 5, 4, NULL)); /* Hot is full: one victim. */
    ASSERT_EQ(tier_of(s, &rep), LKV_TIER_COLD);
    ASSERT_EQ(tier_of(s, &m1), LKV_TIER_HOT); /* Though least recently used. */
    ASSERT_EQ(tier_of(s, &m2), LKV_TIER_HOT);
    ASSERT_EQ(tier_of(s, &m3), LKV_TIER_HOT);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_moved_doc_normal(void)
{
    /* The control: through the same sink with priority 0, the newest document stays and the
     * least recently used owned one goes. */
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 4, 0, WB);
    lkv_dockey m1, mv;
    ASSERT_OK(su_put(s, 11, 4, &m1));
    ASSERT_OK(su_put(s, 12, 4, NULL));
    ASSERT_OK(su_put(s, 13, 4, NULL));
    ASSERT_OK(sink_put(s, 14, 0, 1, &mv));
    ASSERT_OK(lkv_store_flush(s));
    ASSERT_OK(su_put(s, 15, 4, NULL));
    ASSERT_EQ(tier_of(s, &mv), LKV_TIER_HOT);
    ASSERT_EQ(tier_of(s, &m1), LKV_TIER_COLD);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_shape_mismatch(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 4, 0, WB);
    lkv_dockey k;
    ASSERT_EQ(sink_put(s, 21, -1, 2, &k), LKV_ECORRUPT); /* Sender says 2 blocks; we need 1. */
    ASSERT_EQ(tier_of(s, &k), LKV_TIER_NONE);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

int main(void)
{
    LKV_RUN(test_replica_evicted_first);
    LKV_RUN(test_moved_doc_normal);
    LKV_RUN(test_shape_mismatch);
    return 0;
}
