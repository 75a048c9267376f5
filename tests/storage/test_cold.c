/*
 * test_cold.c: the RocksDB cold tier: round trip through blob files (checked on disk), record
 * and block checksums (a flipped byte written through the raw RocksDB API is LKV_ECORRUPT),
 * atomic batches (the record is what makes a document visible), delete, snapshots, scan after
 * reopen, injected write failures, data of the previous format (dropped as misses, never
 * corrupt), the tag on disk, blob garbage collection on demand (off while there is little
 * garbage; on once deletions leave more than half the blob bytes garbage, reclaiming it with
 * every surviving block intact; off again).
 */
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <rocksdb/c.h>
#include <sodium.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "lkv_cold.h"
#include "storage_util.h"

static lkv_cold_doc meta_of(const lkv_dockey *k, uint32_t n_tokens, uint32_t n_blocks, uint32_t bb)
{
    lkv_cold_doc m;
    memset(&m, 0, sizeof m);
    m.key = *k;
    for (int i = 0; i < 32; i++) {
        m.fingerprint[i] = (uint8_t)(0xa0 + i);
    }
    m.content_hash = 0x1234567890abcdefull;
    m.n_tokens = n_tokens;
    m.n_blocks = n_blocks;
    m.block_bytes = bb;
    m.created_ms = 1764000000000;
    return m;
}

static int count_blobs(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        n += l > 5 && strcmp(e->d_name + l - 5, ".blob") == 0;
    }
    closedir(d);
    return n;
}

static int scan_count(void *ctx, const lkv_cold_doc *m)
{
    (void)m;
    (*(int *)ctx)++;
    return 0;
}

static void write_doc_sync(lkv_cold *c, const lkv_dockey *k, uint32_t nb, uint32_t bb,
                           uint64_t seed, int sync);

static void write_doc(lkv_cold *c, const lkv_dockey *k, uint32_t nb, uint32_t bb, uint64_t seed)
{
    write_doc_sync(c, k, nb, bb, seed, 1);
}

static void write_doc_sync(lkv_cold *c, const lkv_dockey *k, uint32_t nb, uint32_t bb,
                           uint64_t seed, int sync)
{
    uint8_t *buf = malloc(bb);
    uint32_t tokens[5] = {1, 2, 3, 4, 5};
    lkv_cold_batch *b = lkv_cold_batch_create();
    for (uint32_t i = 0; i < nb; i++) {
        for (uint32_t j = 0; j < bb; j++) {
            buf[j] = (uint8_t)su_mix(seed + i * 7919u + j);
        }
        lkv_cold_batch_block(b, k, i, buf, bb);
    }
    lkv_cold_doc m = meta_of(k, 5, nb, bb);
    ASSERT_OK(lkv_cold_batch_commit(c, b, &m, tokens, sync));
    free(buf);
}

static void check_doc(lkv_cold *c, const lkv_dockey *k, uint32_t nb, uint32_t bb, uint64_t seed)
{
    uint8_t *buf = malloc(bb);
    lkv_cold_doc m;
    uint32_t *tokens = NULL;
    ASSERT_OK(lkv_cold_get_doc(c, NULL, k, &m, &tokens));
    ASSERT_EQ(m.n_blocks, nb);
    ASSERT_EQ(m.block_bytes, bb);
    ASSERT_EQ(m.n_tokens, 5);
    ASSERT_TRUE(m.content_hash == 0x1234567890abcdefull);
    ASSERT_TRUE(m.created_ms == 1764000000000);
    ASSERT_TRUE(memcmp(m.key.b, k->b, 32) == 0);
    ASSERT_EQ(tokens[4], 5);
    free(tokens);
    for (uint32_t i = 0; i < nb; i++) {
        ASSERT_OK(lkv_cold_get_block(c, NULL, k, i, buf, bb));
        for (uint32_t j = 0; j < bb; j++) {
            if (buf[j] != (uint8_t)su_mix(seed + i * 7919u + j)) {
                LKV_FAIL("block %u byte %u differs", i, j);
            }
        }
    }
    ASSERT_ERR(lkv_cold_get_block(c, NULL, k, nb, buf, bb), LKV_ENOTFOUND);
    ASSERT_ERR(lkv_cold_get_block(c, NULL, k, 0, buf, bb - 1), LKV_ECORRUPT);
    free(buf);
}

/* LKV_COLD_NO_WAL across kill -9: a batch written without the WAL is readable at once, on disk
 * once lkv_cold_flush returns, and lost whole (no block, no record) if the process dies before
 * a flush, while WAL writes on either side of it survive. Runs first, in forked children, so
 * that no RocksDB thread exists in this process when it forks. */
static void test_no_wal_kill9(void)
{
    char *dir = su_tmpdir();
    lkv_dockey k[4];
    for (int i = 0; i < 4; i++) {
        memset(&k[i], 0x40 + i, sizeof k[i]);
    }
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        lkv_cold *c;
        ASSERT_OK(lkv_cold_open(dir, 512, &c));
        write_doc_sync(c, &k[0], 3, 4096, 100, 0);               /* WAL, not synced. */
        write_doc_sync(c, &k[1], 3, 4096, 101, LKV_COLD_NO_WAL); /* Flushed below. */
        check_doc(c, &k[1], 3, 4096, 101);                       /* Readable at once. */
        ASSERT_OK(lkv_cold_flush(c));
        write_doc_sync(c, &k[2], 3, 4096, 102, LKV_COLD_NO_WAL); /* Never flushed: lost. */
        write_doc_sync(c, &k[3], 3, 4096, 103, 0);               /* WAL after it. */
        check_doc(c, &k[2], 3, 4096, 102);
        raise(SIGKILL);
        _exit(9);
    }
    int status;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        lkv_cold *c;
        lkv_cold_doc m;
        uint8_t buf[4096];
        ASSERT_OK(lkv_cold_open(dir, 512, &c));
        check_doc(c, &k[0], 3, 4096, 100);
        check_doc(c, &k[1], 3, 4096, 101);
        check_doc(c, &k[3], 3, 4096, 103);
        ASSERT_ERR(lkv_cold_get_doc(c, NULL, &k[2], &m, NULL), LKV_ENOTFOUND);
        for (uint32_t i = 0; i < 3; i++) {
            ASSERT_ERR(lkv_cold_get_block(c, NULL, &k[2], i, buf, sizeof buf), LKV_ENOTFOUND);
        }
        int n = 0;
        uint64_t corrupt = 0;
        ASSERT_OK(lkv_cold_scan(c, scan_count, &n, &corrupt));
        ASSERT_EQ(n, 3);
        ASSERT_EQ(corrupt, 0);
        lkv_cold_close(c);
        _exit(0);
    }
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    su_rmdir(dir);
}

static void test_roundtrip_blob(void)
{
    char *dir = su_tmpdir();
    lkv_cold *c;
    lkv_dockey k1, k2;
    memset(&k1, 1, sizeof k1);
    memset(&k2, 2, sizeof k2);
    ASSERT_OK(lkv_cold_open(dir, 0, &c)); /* Default min blob size: 64 KiB. */
    write_doc(c, &k1, 3, 128 << 10, 11);  /* 128 KiB blocks: blob files. */
    write_doc(c, &k2, 2, 1000, 22);       /* Small blocks: in the LSM tree. */
    check_doc(c, &k1, 3, 128 << 10, 11);
    check_doc(c, &k2, 2, 1000, 22);
    lkv_cold_close(c);
    ASSERT_TRUE(count_blobs(dir) >= 1);
    /* Reopen: everything is still there, the scan finds both records. */
    ASSERT_OK(lkv_cold_open(dir, 0, &c));
    check_doc(c, &k1, 3, 128 << 10, 11);
    check_doc(c, &k2, 2, 1000, 22);
    int n = 0;
    uint64_t bad = 9;
    ASSERT_OK(lkv_cold_scan(c, scan_count, &n, &bad));
    ASSERT_EQ(n, 2);
    ASSERT_EQ(bad, 0);
    /* Delete removes the record and every block. */
    ASSERT_OK(lkv_cold_delete(c, &k1, 1));
    lkv_cold_doc m;
    uint8_t small[16];
    ASSERT_ERR(lkv_cold_get_doc(c, NULL, &k1, &m, NULL), LKV_ENOTFOUND);
    ASSERT_ERR(lkv_cold_get_block(c, NULL, &k1, 0, small, sizeof small), LKV_ENOTFOUND);
    ASSERT_ERR(lkv_cold_get_block(c, NULL, &k1, 2, small, sizeof small), LKV_ENOTFOUND);
    ASSERT_OK(lkv_cold_delete(c, &k1, 0)); /* Idempotent. */
    check_doc(c, &k2, 2, 1000, 22);
    lkv_cold_close(c);
    su_rmdir(dir);
}

static void test_corrupt(void)
{
    char *dir = su_tmpdir();
    lkv_cold *c;
    lkv_dockey k;
    memset(&k, 7, sizeof k);
    ASSERT_OK(lkv_cold_open(dir, 512, &c));
    write_doc(c, &k, 2, 1000, 5);
    lkv_cold_close(c);

    /* Flip one payload byte of block 1 through the raw RocksDB API. */
    char *err = NULL;
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_options_set_enable_blob_files(o, 1);
    rocksdb_options_set_min_blob_size(o, 512);
    rocksdb_t *db = rocksdb_open(o, dir, &err);
    ASSERT_TRUE(err == NULL);
    uint8_t bk[37];
    lkv_cold_block_key(&k, 1, bk);
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    size_t vlen;
    char *v = rocksdb_get(db, ro, (const char *)bk, sizeof bk, &vlen, &err);
    ASSERT_TRUE(err == NULL && v != NULL && vlen == 1000 + LKV_COLD_BLOCK_HDR_BYTES);
    v[LKV_COLD_BLOCK_HDR_BYTES + 500] ^= 0x01;
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    rocksdb_put(db, wo, (const char *)bk, sizeof bk, v, vlen, &err);
    ASSERT_TRUE(err == NULL);
    rocksdb_free(v);
    /* And corrupt a second document's record. */
    lkv_dockey k2;
    memset(&k2, 8, sizeof k2);
    uint8_t dk[33] = {'D'};
    memcpy(dk + 1, k2.b, 32);
    rocksdb_put(db, wo, (const char *)dk, sizeof dk,
                "garbage-record-garbage-record-garbage-record-"
                "garbage-record-garbage-record-garbage-record",
                90, &err);
    ASSERT_TRUE(err == NULL);
    rocksdb_writeoptions_destroy(wo);
    rocksdb_readoptions_destroy(ro);
    rocksdb_close(db);
    rocksdb_options_destroy(o);

    ASSERT_OK(lkv_cold_open(dir, 512, &c));
    uint8_t buf[1000];
    ASSERT_OK(lkv_cold_get_block(c, NULL, &k, 0, buf, sizeof buf));
    ASSERT_ERR(lkv_cold_get_block(c, NULL, &k, 1, buf, sizeof buf), LKV_ECORRUPT);
    lkv_cold_doc m;
    ASSERT_ERR(lkv_cold_get_doc(c, NULL, &k2, &m, NULL), LKV_ECORRUPT);
    /* The scan drops the corrupt record and counts it. */
    int n = 0;
    uint64_t bad = 0;
    ASSERT_OK(lkv_cold_scan(c, scan_count, &n, &bad));
    ASSERT_EQ(n, 1);
    ASSERT_EQ(bad, 1);
    ASSERT_ERR(lkv_cold_get_doc(c, NULL, &k2, &m, NULL), LKV_ENOTFOUND);
    lkv_cold_close(c);
    su_rmdir(dir);
}

/* The previous on-disk format (1), written here byte by byte as it was: a block value is a
 * BLAKE2b-128 tag over (block key | payload) then the payload; a record is version 1, the
 * fields, the tokens, and a BLAKE2b-128 tag over (doc key | record). */
static void v1_tag(const uint8_t *k, size_t kl, const uint8_t *v, size_t vl, uint8_t out[16])
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 16);
    crypto_generichash_update(&st, k, kl);
    crypto_generichash_update(&st, v, vl);
    crypto_generichash_final(&st, out, 16);
}

static void put_v1_doc(rocksdb_t *db, const lkv_dockey *k, uint32_t nb, uint32_t bb, int bad_tag)
{
    char *err = NULL;
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    uint8_t *val = malloc(16 + bb);
    for (uint32_t i = 0; i < nb; i++) {
        uint8_t bk[37];
        lkv_cold_block_key(k, i, bk);
        memset(val + 16, (int)(i + 1), bb);
        v1_tag(bk, sizeof bk, val + 16, bb, val);
        rocksdb_put(db, wo, (const char *)bk, sizeof bk, (const char *)val, 16 + bb, &err);
        ASSERT_TRUE(err == NULL);
    }
    uint32_t n_tokens = 5;
    uint8_t rec[61 + 4 * 5 + 16];
    memset(rec, 0, sizeof rec);
    rec[0] = 1;
    rec[41] = (uint8_t)n_tokens;
    rec[45] = (uint8_t)nb;
    rec[49] = (uint8_t)bb;
    rec[50] = (uint8_t)(bb >> 8);
    for (uint32_t i = 0; i < n_tokens; i++) {
        rec[61 + 4 * i] = (uint8_t)(i + 1);
    }
    uint8_t dk[33] = {'D'};
    memcpy(dk + 1, k->b, 32);
    v1_tag(dk, sizeof dk, rec, 61 + 4 * n_tokens, rec + 61 + 4 * n_tokens);
    if (bad_tag) {
        rec[61 + 4 * n_tokens] ^= 1;
    }
    rocksdb_put(db, wo, (const char *)dk, sizeof dk, (const char *)rec, sizeof rec, &err);
    ASSERT_TRUE(err == NULL);
    rocksdb_writeoptions_destroy(wo);
    free(val);
}

/* Data of the previous format is dropped cleanly at open: not served, not counted corrupt,
 * deleted; a record of the old version whose old tag fails is corrupt. Documents of the
 * current format beside them are untouched. */
static void test_old_format(void)
{
    char *dir = su_tmpdir();
    lkv_cold *c;
    lkv_dockey k_new, k_old, k_bad;
    memset(&k_new, 1, sizeof k_new);
    memset(&k_old, 2, sizeof k_old);
    memset(&k_bad, 3, sizeof k_bad);
    ASSERT_OK(lkv_cold_open(dir, 512, &c));
    write_doc(c, &k_new, 2, 1000, 9);
    lkv_cold_close(c);
    char *err = NULL;
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_options_set_enable_blob_files(o, 1);
    rocksdb_options_set_min_blob_size(o, 512);
    rocksdb_t *db = rocksdb_open(o, dir, &err);
    ASSERT_TRUE(err == NULL);
    put_v1_doc(db, &k_old, 3, 1000, 0);
    put_v1_doc(db, &k_bad, 1, 1000, 1);
    rocksdb_close(db);

    ASSERT_OK(lkv_cold_open(dir, 512, &c));
    int n = 0;
    uint64_t bad = 0;
    ASSERT_OK(lkv_cold_scan(c, scan_count, &n, &bad));
    ASSERT_EQ(n, 1);   /* Only the current-format document. */
    ASSERT_EQ(bad, 1); /* The old record with a broken old tag; the valid old one is not. */
    lkv_cold_doc m;
    uint8_t buf[1000];
    ASSERT_ERR(lkv_cold_get_doc(c, NULL, &k_old, &m, NULL), LKV_ENOTFOUND);
    ASSERT_ERR(lkv_cold_get_block(c, NULL, &k_old, 0, buf, sizeof buf), LKV_ENOTFOUND);
    ASSERT_OK(lkv_cold_get_doc(c, NULL, &k_new, &m, NULL));
    ASSERT_OK(lkv_cold_get_block(c, NULL, &k_new, 1, buf, sizeof buf));
    lkv_cold_close(c);
    /* Deleted: raw RocksDB finds none of the old document's keys. */
    db = rocksdb_open(o, dir, &err);
    ASSERT_TRUE(err == NULL);
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    uint8_t bk[37];
    lkv_cold_block_key(&k_old, 2, bk);
    size_t vl = 0;
    char *v = rocksdb_get(db, ro, (const char *)bk, sizeof bk, &vl, &err);
    ASSERT_TRUE(v == NULL);
    rocksdb_readoptions_destroy(ro);
    rocksdb_close(db);
    rocksdb_options_destroy(o);
    su_rmdir(dir);
}

/* The stored tag is XXH3-128 as documented (lkv_cold_block_tag), checked on the raw bytes. */
static void test_tag_on_disk(void)
{
    char *dir = su_tmpdir();
    lkv_cold *c;
    lkv_dockey k;
    memset(&k, 4, sizeof k);
    ASSERT_OK(lkv_cold_open(dir, 512, &c));
    write_doc(c, &k, 1, 1000, 3);
    lkv_cold_close(c);
    char *err = NULL;
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_options_set_enable_blob_files(o, 1);
    rocksdb_t *db = rocksdb_open(o, dir, &err);
    ASSERT_TRUE(err == NULL);
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    uint8_t bk[37], t[16];
    lkv_cold_block_key(&k, 0, bk);
    size_t vl = 0;
    char *v = rocksdb_get(db, ro, (const char *)bk, sizeof bk, &vl, &err);
    ASSERT_TRUE(v != NULL && vl == 1000 + LKV_COLD_BLOCK_HDR_BYTES);
    ASSERT_EQ((uint8_t)v[0], 2); /* Format version. */
    lkv_cold_block_tag(bk, v + LKV_COLD_BLOCK_HDR_BYTES, 1000, t);
    ASSERT_TRUE(memcmp(t, v + 16, 16) == 0);
    rocksdb_free(v);
    rocksdb_readoptions_destroy(ro);
    rocksdb_close(db);
    rocksdb_options_destroy(o);
    su_rmdir(dir);
}

static void test_snapshot_and_faults(void)
{
    char *dir = su_tmpdir();
    lkv_cold *c;
    lkv_dockey k;
    memset(&k, 3, sizeof k);
    ASSERT_OK(lkv_cold_open(dir, 512, &c));
    write_doc(c, &k, 2, 1000, 9);
    lkv_cold_snap *snap = lkv_cold_snap_create(c);
    ASSERT_OK(lkv_cold_delete(c, &k, 0));
    uint8_t buf[1000];
    lkv_cold_doc m;
    ASSERT_ERR(lkv_cold_get_block(c, NULL, &k, 1, buf, sizeof buf), LKV_ENOTFOUND);
    ASSERT_OK(lkv_cold_get_block(c, snap, &k, 1, buf, sizeof buf)); /* Snapshot still sees it. */
    ASSERT_OK(lkv_cold_get_doc(c, snap, &k, &m, NULL));
    lkv_cold_snap_release(c, snap);

    /* Injected failures: nothing is written, then writes work again. */
    lkv_cold_fault_writes(c, 2);
    lkv_cold_batch *b = lkv_cold_batch_create();
    lkv_cold_batch_block(b, &k, 0, buf, sizeof buf);
    lkv_cold_doc md = meta_of(&k, 5, 1, 1000);
    uint32_t tokens[5] = {1, 2, 3, 4, 5};
    ASSERT_ERR(lkv_cold_batch_commit(c, b, &md, tokens, 1), LKV_EIO);
    ASSERT_ERR(lkv_cold_delete(c, &k, 1), LKV_EIO);
    ASSERT_ERR(lkv_cold_get_doc(c, NULL, &k, &m, NULL), LKV_ENOTFOUND);
    ASSERT_ERR(lkv_cold_get_block(c, NULL, &k, 0, buf, sizeof buf), LKV_ENOTFOUND);
    write_doc(c, &k, 1, 1000, 9);
    lkv_cold_close(c);
    su_rmdir(dir);
}

static void le_put(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

/* Records of format 2 (XXH3-128 tags, no residency fields: fixed part 61 bytes), written here
 * byte by byte, are still read, with tenant, priority and expiry 0; records written now
 * (version 3) carry the residency fields through a reopen. */
static void test_v2_record(void)
{
    char *dir = su_tmpdir();
    lkv_cold *c;
    lkv_dockey k2, k3;
    memset(&k2, 4, sizeof k2);
    memset(&k3, 5, sizeof k3);
    ASSERT_OK(lkv_cold_open(dir, 512, &c));
    write_doc(c, &k2, 3, 1000, 21);
    lkv_cold_batch *b = lkv_cold_batch_create();
    uint8_t blk[1000];
    memset(blk, 7, sizeof blk);
    lkv_cold_batch_block(b, &k3, 0, blk, sizeof blk);
    lkv_cold_doc m3 = meta_of(&k3, 5, 1, 1000);
    m3.tenant = 7;
    m3.prio = -1;
    m3.expires_ms = 1764000123456;
    uint32_t tokens[5] = {1, 2, 3, 4, 5};
    ASSERT_OK(lkv_cold_batch_commit(c, b, &m3, tokens, 1));
    lkv_cold_close(c);

    /* k2's record rewritten in format 2. */
    uint8_t rec[61 + 4 * 5 + 16];
    memset(rec, 0, sizeof rec);
    rec[0] = 2;
    for (int i = 0; i < 32; i++) {
        rec[1 + i] = (uint8_t)(0xa0 + i);
    }
    le_put(rec + 33, 0x1234567890abcdefull, 8);
    le_put(rec + 41, 5, 4);
    le_put(rec + 45, 3, 4);
    le_put(rec + 49, 1000, 4);
    le_put(rec + 53, 1764000000000ull, 8);
    for (uint32_t i = 0; i < 5; i++) {
        le_put(rec + 61 + 4 * i, i + 1, 4);
    }
    uint8_t dk[33] = {'D'};
    memcpy(dk + 1, k2.b, 32);
    XXH128_hash_t h = XXH3_128bits_withSeed(rec, 61 + 4 * 5, XXH3_64bits(dk, sizeof dk));
    le_put(rec + 81, h.low64, 8);
    le_put(rec + 89, h.high64, 8);
    char *err = NULL;
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_options_set_enable_blob_files(o, 1);
    rocksdb_options_set_min_blob_size(o, 512);
    rocksdb_t *db = rocksdb_open(o, dir, &err);
    ASSERT_TRUE(err == NULL);
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    rocksdb_put(db, wo, (const char *)dk, sizeof dk, (const char *)rec, sizeof rec, &err);
    ASSERT_TRUE(err == NULL);
    rocksdb_writeoptions_destroy(wo);
    rocksdb_close(db);
    rocksdb_options_destroy(o);

    ASSERT_OK(lkv_cold_open(dir, 512, &c));
    int n = 0;
    uint64_t bad = 0;
    ASSERT_OK(lkv_cold_scan(c, scan_count, &n, &bad));
    ASSERT_EQ(n, 2);
    ASSERT_EQ(bad, 0);
    check_doc(c, &k2, 3, 1000, 21); /* Blocks and fields as written, tokens at 61. */
    lkv_cold_doc m;
    ASSERT_OK(lkv_cold_get_doc(c, NULL, &k2, &m, NULL));
    ASSERT_EQ(m.tenant, 0);
    ASSERT_EQ(m.prio, 0);
    ASSERT_TRUE(m.expires_ms == 0);
    uint32_t *tk = NULL;
    ASSERT_OK(lkv_cold_get_doc(c, NULL, &k3, &m, &tk));
    ASSERT_EQ(m.tenant, 7);
    ASSERT_EQ(m.prio, -1);
    ASSERT_TRUE(m.expires_ms == 1764000123456);
    ASSERT_EQ(tk[4], 5);
    free(tk);
    lkv_cold_close(c);
    su_rmdir(dir);
}

static void test_gc_on_demand(void)
{
    char *dir = su_tmpdir();
    lkv_cold *c;
    lkv_cold_options o = {.min_blob_bytes = 1024, .gc_min_bytes = 1u << 20};
    ASSERT_OK(lkv_cold_open_ex(dir, &o, &c));
    enum { DOCS = 48, BLOCKS = 4, BB = 16 << 10 };
    lkv_dockey k[DOCS];
    for (int d = 0; d < DOCS; d++) {
        memset(&k[d], 0, sizeof k[d]);
        k[d].b[0] = (uint8_t)(d * 37 + 1); /* Spread over the key range. */
        k[d].b[1] = (uint8_t)d;
        write_doc(c, &k[d], BLOCKS, BB, (uint64_t)(100 + d));
    }
    ASSERT_OK(lkv_cold_compact(c)); /* Flushes: everything in blob files. */
    uint64_t total, garbage;
    lkv_cold_blob_bytes(c, &total, &garbage);
    ASSERT_TRUE(total >= (uint64_t)DOCS * BLOCKS * BB);
    ASSERT_EQ(garbage, 0);
    ASSERT_EQ(lkv_cold_gc_check(c), 0); /* No garbage: stays off. */
    /* Delete three in four: after a compaction their blobs are garbage (75%). */
    for (int d = 0; d < DOCS; d++) {
        if (d % 4 != 0) {
            ASSERT_OK(lkv_cold_delete(c, &k[d], 0));
        }
    }
    ASSERT_OK(lkv_cold_compact(c));
    uint64_t total2, garbage2;
    lkv_cold_blob_bytes(c, &total2, &garbage2);
    fprintf(stderr, "blob files %" PRIu64 " B, garbage %" PRIu64 " B after deleting 3/4\n", total2,
            garbage2);
    ASSERT_TRUE(garbage2 * 2 >= total2);
    ASSERT_EQ(lkv_cold_gc_check(c), 1); /* Over half garbage: on. */
    /* RocksDB's background work collects it (forced compactions of the files over half
     * garbage, scheduled at the next new version: a few more documents and their flush). */
    uint64_t total3 = total2, garbage3 = garbage2;
    for (int i = 0; i < 400 && total3 >= total2 / 2; i++) {
        if (i < 4) {
            lkv_dockey x;
            memset(&x, 0xee, sizeof x);
            x.b[0] = (uint8_t)i;
            write_doc(c, &x, 1, BB, 7);
            ASSERT_OK(lkv_cold_delete(c, &x, 0));
        }
        usleep(50 * 1000);
        lkv_cold_blob_bytes(c, &total3, &garbage3);
    }
    fprintf(stderr, "background: blob files %" PRIu64 " B, garbage %" PRIu64 " B\n", total3,
            garbage3);
    ASSERT_TRUE(total3 < total2 / 2);
    ASSERT_OK(lkv_cold_compact(c)); /* Whatever is left: relocated now. */
    lkv_cold_blob_bytes(c, &total3, &garbage3);
    fprintf(stderr, "blob files %" PRIu64 " B, garbage %" PRIu64 " B after collection\n", total3,
            garbage3);
    ASSERT_TRUE(total3 < total2 / 2);
    ASSERT_TRUE(garbage3 * 4 < total3 || total3 == 0);
    ASSERT_EQ(lkv_cold_gc_check(c), 0); /* Under a quarter: off again. */
    for (int d = 0; d < DOCS; d++) {
        if (d % 4 == 0) {
            check_doc(c, &k[d], BLOCKS, BB, (uint64_t)(100 + d));
        } else {
            lkv_cold_doc m;
            ASSERT_ERR(lkv_cold_get_doc(c, NULL, &k[d], &m, NULL), LKV_ENOTFOUND);
        }
    }
    lkv_cold_close(c);
    /* And after a reopen (collection starts off). */
    ASSERT_OK(lkv_cold_open_ex(dir, &o, &c));
    for (int d = 0; d < DOCS; d += 4) {
        check_doc(c, &k[d], BLOCKS, BB, (uint64_t)(100 + d));
    }
    lkv_cold_close(c);
    su_rmdir(dir);
}

int main(void)
{
    LKV_RUN(test_no_wal_kill9); /* First: it forks. */
    LKV_RUN(test_roundtrip_blob);
    LKV_RUN(test_corrupt);
    LKV_RUN(test_snapshot_and_faults);
    LKV_RUN(test_old_format);
    LKV_RUN(test_v2_record);
    LKV_RUN(test_tag_on_disk);
    LKV_RUN(test_gc_on_demand);
    return 0;
}
