/*
 * lkv_cold.c: the cold tier on RocksDB (key/value format in lkv_cold.h).
 *
 * RocksDB options: create_if_missing, blob files on (min_blob_size, 256 MiB blob files, blob
 * GC on), LZ4-free (KV is incompressible noise to a general-purpose compressor). Writes go
 * through rocksdb_write with a WriteBatch; reads use rocksdb_get_pinned (no extra copy inside
 * RocksDB) and verify the BLAKE2b-128 tag before copying the payload out.
 */
#include "lkv_cold.h"

#include <rocksdb/c.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "lkv_log.h"

#define RECORD_VERSION   2  /* Written; version 1 (no residency fields) is still read. */
#define RECORD_FIXED     74 /* Version 2; version 1: 61. */
#define RECORD_FIXED_V1  61
#define DEFAULT_MIN_BLOB (64u << 10)

struct lkv_cold {
    rocksdb_t *db;                  /* The database. */
    rocksdb_options_t *opts;        /* Open options (kept until close). */
    rocksdb_writeoptions_t *wsync;  /* sync = true. */
    rocksdb_writeoptions_t *wasync; /* sync = false. */
    rocksdb_readoptions_t *ropts;   /* Default read options (verify_checksums on). */
    int fault_writes;               /* Injected failures left (atomic). */
};

struct lkv_cold_batch {
    rocksdb_writebatch_t *wb; /* Blocks added so far; the record is added at commit. */
};

struct lkv_cold_snap {
    const rocksdb_snapshot_t *snap; /* RocksDB snapshot. */
    rocksdb_readoptions_t *ropts;   /* Read options pointing at it. */
};

static void put_le32(uint8_t *o, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        o[i] = (uint8_t)(v >> (8 * i));
    }
}

static void put_le64(uint8_t *o, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        o[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_le64(const uint8_t *p)
{
    return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

void lkv_cold_block_key(const lkv_dockey *key, uint32_t index, uint8_t out[37])
{
    out[0] = 'B';
    memcpy(out + 1, key->b, LKV_DOCKEY_BYTES);
    out[33] = (uint8_t)(index >> 24);
    out[34] = (uint8_t)(index >> 16);
    out[35] = (uint8_t)(index >> 8);
    out[36] = (uint8_t)index;
}

static void doc_key(const lkv_dockey *key, uint8_t out[33])
{
    out[0] = 'D';
    memcpy(out + 1, key->b, LKV_DOCKEY_BYTES);
}

static void tag(const uint8_t *k, size_t klen, const void *v, size_t vlen, uint8_t out[16])
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, LKV_COLD_TAG_BYTES);
    crypto_generichash_update(&st, k, klen);
    crypto_generichash_update(&st, v, vlen);
    crypto_generichash_final(&st, out, LKV_COLD_TAG_BYTES);
}

static int rerr(const char *what, char *err)
{
    LKV_LOGE("rocksdb %s: %s", what, err);
    rocksdb_free(err);
    return LKV_EROCKSDB;
}

static int take_fault(lkv_cold *c)
{
    int n = __atomic_load_n(&c->fault_writes, __ATOMIC_ACQUIRE);
    while (n > 0) {
        if (__atomic_compare_exchange_n(&c->fault_writes, &n, n - 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            LKV_LOGW("cold: injected write failure");
            return 1;
        }
    }
    return 0;
}

void lkv_cold_fault_writes(lkv_cold *c, int n)
{
    __atomic_store_n(&c->fault_writes, n < 0 ? 0 : n, __ATOMIC_RELEASE);
}

int lkv_cold_open(const char *dir, uint64_t min_blob_bytes, lkv_cold **out)
{
    char *err = NULL;
    lkv_cold *c;

    *out = NULL;
    if (sodium_init() < 0) {
        return LKV_EINTERNAL;
    }
    c = lkv_xcalloc(1, sizeof *c);
    c->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(c->opts, 1);
    rocksdb_options_set_enable_blob_files(c->opts, 1);
    rocksdb_options_set_min_blob_size(c->opts, min_blob_bytes ? min_blob_bytes : DEFAULT_MIN_BLOB);
    rocksdb_options_set_blob_file_size(c->opts, 256ull << 20);
    rocksdb_options_set_enable_blob_gc(c->opts, 1);
    rocksdb_options_set_compression(c->opts, rocksdb_no_compression);
    rocksdb_options_set_blob_compression_type(c->opts, rocksdb_no_compression);
    c->db = rocksdb_open(c->opts, dir, &err);
    if (err != NULL) {
        int rc = rerr("open", err);
        rocksdb_options_destroy(c->opts);
        free(c);
        return rc;
    }
    c->wsync = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(c->wsync, 1);
    c->wasync = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(c->wasync, 0);
    c->ropts = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(c->ropts, 1);
    *out = c;
    return 0;
}

void lkv_cold_close(lkv_cold *c)
{
    char *err = NULL;
    if (c == NULL) {
        return;
    }
    rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
    rocksdb_flushoptions_set_wait(fo, 1);
    rocksdb_flush(c->db, fo, &err);
    if (err != NULL) {
        rerr("flush at close", err);
    }
    rocksdb_flushoptions_destroy(fo);
    rocksdb_close(c->db);
    rocksdb_writeoptions_destroy(c->wsync);
    rocksdb_writeoptions_destroy(c->wasync);
    rocksdb_readoptions_destroy(c->ropts);
    rocksdb_options_destroy(c->opts);
    free(c);
}

lkv_cold_batch *lkv_cold_batch_create(void)
{
    lkv_cold_batch *b = lkv_xmalloc(sizeof *b);
    b->wb = rocksdb_writebatch_create();
    return b;
}

void lkv_cold_batch_free(lkv_cold_batch *b)
{
    if (b == NULL) {
        return;
    }
    rocksdb_writebatch_destroy(b->wb);
    free(b);
}

void lkv_cold_batch_block(lkv_cold_batch *b, const lkv_dockey *key, uint32_t index,
                          const void *data, size_t len)
{
    uint8_t k[LKV_COLD_BLOCK_KEY_BYTES];
    uint8_t t[LKV_COLD_TAG_BYTES];
    const char *parts[2];
    size_t sizes[2];

    lkv_cold_block_key(key, index, k);
    tag(k, sizeof k, data, len, t);
    parts[0] = (const char *)t;
    sizes[0] = sizeof t;
    parts[1] = data;
    sizes[1] = len;
    const char *kp = (const char *)k;
    size_t ks = sizeof k;
    rocksdb_writebatch_putv(b->wb, 1, &kp, &ks, 2, parts, sizes);
}

int lkv_cold_batch_commit(lkv_cold *c, lkv_cold_batch *b, const lkv_cold_doc *meta,
                          const uint32_t *tokens, int sync)
{
    uint8_t k[LKV_COLD_DOC_KEY_BYTES];
    size_t rlen = RECORD_FIXED + 4ull * meta->n_tokens;
    uint8_t *rec = lkv_xmalloc(rlen + LKV_COLD_TAG_BYTES);
    char *err = NULL;
    int rc = 0;

    doc_key(&meta->key, k);
    rec[0] = RECORD_VERSION;
    memcpy(rec + 1, meta->fingerprint, 32);
    put_le64(rec + 33, meta->content_hash);
    put_le32(rec + 41, meta->n_tokens);
    put_le32(rec + 45, meta->n_blocks);
    put_le32(rec + 49, meta->block_bytes);
    put_le64(rec + 53, (uint64_t)meta->created_ms);
    put_le32(rec + 61, meta->tenant);
    rec[65] = (uint8_t)(int8_t)meta->prio;
    put_le64(rec + 66, (uint64_t)meta->expires_ms);
    for (uint32_t i = 0; i < meta->n_tokens; i++) {
        put_le32(rec + RECORD_FIXED + 4ull * i, tokens[i]);
    }
    tag(k, sizeof k, rec, rlen, rec + rlen);
    rocksdb_writebatch_put(b->wb, (const char *)k, sizeof k, (const char *)rec,
                           rlen + LKV_COLD_TAG_BYTES);
    free(rec);
    if (take_fault(c)) {
        rc = LKV_EIO;
        goto out;
    }
    rocksdb_write(c->db, sync ? c->wsync : c->wasync, b->wb, &err);
    if (err != NULL) {
        rc = rerr("write", err);
    }
out:
    lkv_cold_batch_free(b);
    return rc;
}

int lkv_cold_delete(lkv_cold *c, const lkv_dockey *key, int sync)
{
    uint8_t dk[LKV_COLD_DOC_KEY_BYTES];
    uint8_t lo[LKV_COLD_BLOCK_KEY_BYTES], hi[LKV_COLD_BLOCK_KEY_BYTES + 1];
    char *err = NULL;
    int rc = 0;

    doc_key(key, dk);
    lkv_cold_block_key(key, 0, lo);
    /* Upper bound: 'B' | key | 0xffffffff | 0x00 sorts after every block of key. */
    lkv_cold_block_key(key, UINT32_MAX, hi);
    hi[LKV_COLD_BLOCK_KEY_BYTES] = 0;
    if (take_fault(c)) {
        return LKV_EIO;
    }
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    rocksdb_writebatch_delete(wb, (const char *)dk, sizeof dk);
    rocksdb_writebatch_delete_range(wb, (const char *)lo, sizeof lo, (const char *)hi, sizeof hi);
    rocksdb_write(c->db, sync ? c->wsync : c->wasync, wb, &err);
    if (err != NULL) {
        rc = rerr("delete", err);
    }
    rocksdb_writebatch_destroy(wb);
    return rc;
}

/* Parses and verifies a record value. tokens may be NULL. */
static int parse_record(const uint8_t *k, const uint8_t *v, size_t vlen, lkv_cold_doc *meta,
                        uint32_t **tokens)
{
    uint8_t t[LKV_COLD_TAG_BYTES];
    if (vlen < RECORD_FIXED_V1 + LKV_COLD_TAG_BYTES) {
        return LKV_ECORRUPT;
    }
    size_t rlen = vlen - LKV_COLD_TAG_BYTES;
    tag(k, LKV_COLD_DOC_KEY_BYTES, v, rlen, t);
    if (sodium_memcmp(t, v + rlen, sizeof t) != 0 || (v[0] != 1 && v[0] != RECORD_VERSION)) {
        return LKV_ECORRUPT;
    }
    size_t fixed = v[0] == 1 ? RECORD_FIXED_V1 : RECORD_FIXED;
    if (rlen < fixed) {
        return LKV_ECORRUPT;
    }
    memset(meta, 0, sizeof *meta);
    memcpy(meta->key.b, k + 1, LKV_DOCKEY_BYTES);
    memcpy(meta->fingerprint, v + 1, 32);
    meta->content_hash = get_le64(v + 33);
    meta->n_tokens = get_le32(v + 41);
    meta->n_blocks = get_le32(v + 45);
    meta->block_bytes = get_le32(v + 49);
    meta->created_ms = (int64_t)get_le64(v + 53);
    if (v[0] == RECORD_VERSION) {
        meta->tenant = get_le32(v + 61);
        meta->prio = (int8_t)v[65];
        meta->expires_ms = (int64_t)get_le64(v + 66);
        if (meta->prio < -1 || meta->prio > 1) {
            return LKV_ECORRUPT;
        }
    }
    if (rlen != fixed + 4ull * meta->n_tokens || meta->n_blocks == 0 || meta->n_tokens == 0) {
        return LKV_ECORRUPT;
    }
    if (tokens != NULL) {
        uint32_t *tk = lkv_xmalloc(4ull * meta->n_tokens);
        for (uint32_t i = 0; i < meta->n_tokens; i++) {
            tk[i] = get_le32(v + fixed + 4ull * i);
        }
        *tokens = tk;
    }
    return 0;
}

int lkv_cold_get_doc(lkv_cold *c, lkv_cold_snap *snap, const lkv_dockey *key, lkv_cold_doc *meta,
                     uint32_t **tokens)
{
    uint8_t k[LKV_COLD_DOC_KEY_BYTES];
    char *err = NULL;
    size_t vlen = 0;
    int rc;

    doc_key(key, k);
    rocksdb_pinnableslice_t *ps =
        rocksdb_get_pinned(c->db, snap ? snap->ropts : c->ropts, (const char *)k, sizeof k, &err);
    if (err != NULL) {
        return rerr("get record", err);
    }
    if (ps == NULL) {
        return LKV_ENOTFOUND;
    }
    const uint8_t *v = (const uint8_t *)rocksdb_pinnableslice_value(ps, &vlen);
    rc = parse_record(k, v, vlen, meta, tokens);
    rocksdb_pinnableslice_destroy(ps);
    return rc;
}

int lkv_cold_get_block(lkv_cold *c, lkv_cold_snap *snap, const lkv_dockey *key, uint32_t index,
                       void *buf, size_t len)
{
    uint8_t k[LKV_COLD_BLOCK_KEY_BYTES];
    uint8_t t[LKV_COLD_TAG_BYTES];
    char *err = NULL;
    size_t vlen = 0;
    int rc = 0;

    lkv_cold_block_key(key, index, k);
    rocksdb_pinnableslice_t *ps =
        rocksdb_get_pinned(c->db, snap ? snap->ropts : c->ropts, (const char *)k, sizeof k, &err);
    if (err != NULL) {
        return rerr("get block", err);
    }
    if (ps == NULL) {
        return LKV_ENOTFOUND;
    }
    const uint8_t *v = (const uint8_t *)rocksdb_pinnableslice_value(ps, &vlen);
    if (vlen != len + LKV_COLD_TAG_BYTES) {
        rc = LKV_ECORRUPT;
        goto out;
    }
    tag(k, sizeof k, v + LKV_COLD_TAG_BYTES, len, t);
    if (sodium_memcmp(t, v, sizeof t) != 0) {
        rc = LKV_ECORRUPT;
        goto out;
    }
    memcpy(buf, v + LKV_COLD_TAG_BYTES, len);
out:
    rocksdb_pinnableslice_destroy(ps);
    return rc;
}

lkv_cold_snap *lkv_cold_snap_create(lkv_cold *c)
{
    lkv_cold_snap *s = lkv_xmalloc(sizeof *s);
    s->snap = rocksdb_create_snapshot(c->db);
    s->ropts = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(s->ropts, 1);
    rocksdb_readoptions_set_snapshot(s->ropts, s->snap);
    return s;
}

void lkv_cold_snap_release(lkv_cold *c, lkv_cold_snap *s)
{
    if (s == NULL) {
        return;
    }
    rocksdb_readoptions_destroy(s->ropts);
    rocksdb_release_snapshot(c->db, s->snap);
    free(s);
}

int lkv_cold_scan(lkv_cold *c, lkv_cold_scan_fn fn, void *ctx, uint64_t *n_corrupt)
{
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    const uint8_t lo[1] = {'D'}, hi[1] = {'E'};
    char *err = NULL;
    int rc = 0;

    if (n_corrupt != NULL) {
        *n_corrupt = 0;
    }
    rocksdb_readoptions_set_iterate_upper_bound(ro, (const char *)hi, 1);
    rocksdb_readoptions_set_verify_checksums(ro, 1);
    rocksdb_iterator_t *it = rocksdb_create_iterator(c->db, ro);
    for (rocksdb_iter_seek(it, (const char *)lo, 1); rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        lkv_cold_doc meta;
        if (klen != LKV_COLD_DOC_KEY_BYTES || parse_record(k, v, vlen, &meta, NULL) != 0) {
            LKV_LOGW("cold: dropping a corrupt document record (%zu-byte key)", klen);
            if (klen == LKV_COLD_DOC_KEY_BYTES) {
                lkv_dockey dk;
                memcpy(dk.b, k + 1, LKV_DOCKEY_BYTES);
                lkv_cold_delete(c, &dk, 0);
            } else {
                rocksdb_delete(c->db, c->wasync, (const char *)k, klen, &err);
                if (err != NULL) {
                    rerr("delete bad record", err);
                    err = NULL;
                }
            }
            if (n_corrupt != NULL) {
                (*n_corrupt)++;
            }
            continue;
        }
        rc = fn(ctx, &meta);
        if (rc != 0) {
            break;
        }
    }
    if (rc == 0) {
        rocksdb_iter_get_error(it, &err);
        if (err != NULL) {
            rc = rerr("scan", err);
        }
    }
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return rc;
}
