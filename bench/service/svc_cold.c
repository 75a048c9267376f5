/*
 * svc_cold.c: RocksDB cold-tier reads beside plain file reads (see svc_cold.h).
 *
 * Document keys are synthetic (byte i of key d is a simple function of d and i); the cold tier
 * does not care how keys were made. Block b of every document holds payload block b,
 * so a reader knows the expected first bytes of each block without any table.
 */
#include "svc_cold.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lkv_cold.h"
#include "lkv_err.h"
#include "lkv_log.h"

struct svc_cold {
    lkv_cold *db;           /* The RocksDB cold tier. */
    int n_docs;             /* Documents. */
    uint32_t *doc_blocks;   /* Blocks of each document (owned). */
    lkv_dockey *keys;       /* Key of each document (owned). */
    int *fds;               /* Plain file of each document, O_RDONLY (owned). */
    size_t block_bytes;     /* Bytes of one block. */
    const uint8_t *payload; /* Expected bytes (borrowed). */
    uint8_t **bufs;         /* One block buffer per client (owned). */
    int max_clients;        /* Entries of bufs. */
    uint64_t bytes;         /* Payload bytes of all documents. */
};

static void make_key(int d, lkv_dockey *k)
{
    for (int i = 0; i < LKV_DOCKEY_BYTES; i++) {
        k->b[i] = (uint8_t)(0xc0 ^ (d * 131 + i * 7) ^ (d >> 8));
    }
}

static int mkdir_p(const char *dir)
{
    char tmp[4096];
    size_t n = strlen(dir);
    if (n >= sizeof(tmp)) {
        return LKV_EINVAL;
    }
    memcpy(tmp, dir, n + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            (void)mkdir(tmp, 0700);
            *p = '/';
        }
    }
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST) {
        return LKV_EIO;
    }
    return 0;
}

static int write_docs_rocksdb(svc_cold *c, const char *dbdir)
{
    int rc = lkv_cold_open(dbdir, 0, &c->db);
    if (rc != 0) {
        return rc;
    }
    for (int d = 0; d < c->n_docs && rc == 0; d++) {
        lkv_cold_batch *b = lkv_cold_batch_create();
        for (uint32_t i = 0; i < c->doc_blocks[d]; i++) {
            lkv_cold_batch_block(b, &c->keys[d], i, c->payload + (size_t)i * c->block_bytes,
                                 c->block_bytes);
        }
        lkv_cold_doc meta;
        memset(&meta, 0, sizeof(meta));
        meta.key = c->keys[d];
        meta.n_blocks = c->doc_blocks[d];
        meta.n_tokens = 16 * c->doc_blocks[d];
        meta.block_bytes = (uint32_t)c->block_bytes;
        uint32_t *tokens = lkv_xcalloc(meta.n_tokens, sizeof(uint32_t));
        rc = lkv_cold_batch_commit(c->db, b, &meta, tokens, 0);
        free(tokens);
    }
    /* Close (flushing memtables into SST and blob files) and reopen: reads then come from
     * the blob files, as they do in a daemon that has run for a while. */
    lkv_cold_close(c->db);
    c->db = NULL;
    if (rc != 0) {
        return rc;
    }
    return lkv_cold_open(dbdir, 0, &c->db);
}

static int write_docs_files(svc_cold *c, const char *fdir)
{
    for (int d = 0; d < c->n_docs; d++) {
        char path[4300];
        snprintf(path, sizeof(path), "%s/doc-%d", fdir, d);
        int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
        if (fd < 0) {
            LKV_LOGE("cold: cannot create %s: %s", path, strerror(errno));
            return LKV_EIO;
        }
        size_t len = (size_t)c->doc_blocks[d] * c->block_bytes;
        size_t off = 0;
        while (off < len) {
            ssize_t n = pwrite(fd, c->payload + off, len - off, (off_t)off);
            if (n <= 0) {
                close(fd);
                return LKV_EIO;
            }
            off += (size_t)n;
        }
        c->fds[d] = fd;
    }
    return 0;
}

int svc_cold_open(const char *dir, int n_docs, const uint32_t *doc_blocks, size_t block_bytes,
                  const void *payload, int max_clients, svc_cold **out)
{
    svc_cold *c = lkv_xcalloc(1, sizeof(*c));
    c->n_docs = n_docs;
    c->doc_blocks = lkv_xcalloc((size_t)n_docs, sizeof(uint32_t));
    memcpy(c->doc_blocks, doc_blocks, (size_t)n_docs * sizeof(uint32_t));
    c->keys = lkv_xcalloc((size_t)n_docs, sizeof(lkv_dockey));
    c->fds = lkv_xcalloc((size_t)n_docs, sizeof(int));
    for (int d = 0; d < n_docs; d++) {
        make_key(d, &c->keys[d]);
        c->fds[d] = -1;
        c->bytes += (uint64_t)doc_blocks[d] * block_bytes;
    }
    c->block_bytes = block_bytes;
    c->payload = payload;
    c->max_clients = max_clients;
    c->bufs = lkv_xcalloc((size_t)max_clients, sizeof(uint8_t *));
    for (int i = 0; i < max_clients; i++) {
        c->bufs[i] = lkv_xmalloc(block_bytes);
    }
    char dbdir[4200], fdir[4200];
    snprintf(dbdir, sizeof(dbdir), "%s/cold-rocksdb", dir);
    snprintf(fdir, sizeof(fdir), "%s/cold-files", dir);
    int rc = mkdir_p(dir);
    if (rc == 0) {
        rc = mkdir_p(fdir);
    }
    if (rc == 0) {
        rc = write_docs_rocksdb(c, dbdir);
    }
    if (rc == 0) {
        rc = write_docs_files(c, fdir);
    }
    /* Warm-up: read every document once through both paths, comparing every byte. */
    for (int d = 0; d < n_docs && rc == 0; d++) {
        for (uint32_t i = 0; i < doc_blocks[d] && rc == 0; i++) {
            const uint8_t *want = c->payload + (size_t)i * block_bytes;
            rc = lkv_cold_get_block(c->db, NULL, &c->keys[d], i, c->bufs[0], block_bytes);
            if (rc == 0 && memcmp(c->bufs[0], want, block_bytes) != 0) {
                rc = LKV_ECORRUPT;
            }
            if (rc == 0 && pread(c->fds[d], c->bufs[0], block_bytes,
                                 (off_t)((size_t)i * block_bytes)) != (ssize_t)block_bytes) {
                rc = LKV_EIO;
            }
            if (rc == 0 && memcmp(c->bufs[0], want, block_bytes) != 0) {
                rc = LKV_ECORRUPT;
            }
        }
    }
    if (rc != 0) {
        LKV_LOGE("cold: setup under %s failed: %s", dir, lkv_strerror(rc));
        svc_cold_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void svc_cold_close(svc_cold *c)
{
    if (c == NULL) {
        return;
    }
    lkv_cold_close(c->db);
    for (int d = 0; d < c->n_docs; d++) {
        if (c->fds[d] >= 0) {
            close(c->fds[d]);
        }
    }
    for (int i = 0; i < c->max_clients; i++) {
        free(c->bufs[i]);
    }
    free(c->bufs);
    free(c->fds);
    free(c->keys);
    free(c->doc_blocks);
    free(c);
}

static int check_block(const svc_cold *c, int tid, uint32_t i)
{
    return memcmp(c->bufs[tid], c->payload + (size_t)i * c->block_bytes, 8) == 0 ? 0 : LKV_ECORRUPT;
}

int svc_cold_read_rocksdb(svc_cold *c, int tid, int doc, uint64_t *bytes)
{
    for (uint32_t i = 0; i < c->doc_blocks[doc]; i++) {
        int rc = lkv_cold_get_block(c->db, NULL, &c->keys[doc], i, c->bufs[tid], c->block_bytes);
        if (rc == 0) {
            rc = check_block(c, tid, i);
        }
        if (rc != 0) {
            return rc;
        }
    }
    *bytes += (uint64_t)c->doc_blocks[doc] * c->block_bytes;
    return 0;
}

int svc_cold_read_pread(svc_cold *c, int tid, int doc, uint64_t *bytes)
{
    for (uint32_t i = 0; i < c->doc_blocks[doc]; i++) {
        ssize_t n =
            pread(c->fds[doc], c->bufs[tid], c->block_bytes, (off_t)((size_t)i * c->block_bytes));
        if (n != (ssize_t)c->block_bytes) {
            return LKV_EIO;
        }
        int rc = check_block(c, tid, i);
        if (rc != 0) {
            return rc;
        }
    }
    *bytes += (uint64_t)c->doc_blocks[doc] * c->block_bytes;
    return 0;
}

int svc_cold_read_pread_tag(svc_cold *c, int tid, int doc, uint64_t *bytes)
{
    for (uint32_t i = 0; i < c->doc_blocks[doc]; i++) {
        ssize_t n =
            pread(c->fds[doc], c->bufs[tid], c->block_bytes, (off_t)((size_t)i * c->block_bytes));
        if (n != (ssize_t)c->block_bytes) {
            return LKV_EIO;
        }
        uint8_t k[LKV_COLD_BLOCK_KEY_BYTES], tag[LKV_COLD_TAG_BYTES];
        lkv_cold_block_key(&c->keys[doc], i, k);
        lkv_cold_block_tag(k, c->bufs[tid], c->block_bytes, tag); /* The cold tier's check. */
        int rc = check_block(c, tid, i);
        if (rc != 0) {
            return rc;
        }
    }
    *bytes += (uint64_t)c->doc_blocks[doc] * c->block_bytes;
    return 0;
}

uint64_t svc_cold_bytes(const svc_cold *c)
{
    return c->bytes;
}
