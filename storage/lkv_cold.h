/*
 * lkv_cold.h: the cold tier, RocksDB with blob files (DESIGN.md 4).
 *
 * One RocksDB database under a directory. Blob files are enabled (values of at least
 * min_blob_bytes live in blob files, not in the LSM tree). Keys and values:
 *
 *   block   key   'B' | doc key (32) | block index (u32 big-endian: blocks sort in order)
 *           value tag (16) | payload (block_bytes)
 *           tag = BLAKE2b-128 over (the key's 37 bytes | payload)
 *   doc     key   'D' | doc key (32)
 *           value record (below) | tag (16), tag = BLAKE2b-128 over (key | record)
 *
 *   record  offset  size    field
 *           0       1       format version (2; 1 is still read)
 *           1       32      profile fingerprint
 *           33      8       content hash (lkv_dockey_content_hash), little-endian
 *           41      4       n_tokens, little-endian
 *           45      4       n_blocks
 *           49      4       block_bytes
 *           53      8       created, Unix milliseconds
 *           61      4       tenant index (residency class; version 2)
 *           65      1       priority, int8 -1..1 (version 2)
 *           66      8       expiry, Unix milliseconds, 0 = none (version 2)
 *           74      4 * n   token ids, little-endian uint32 (version 1: at 61, no 61..73)
 *
 * A document is written as one WriteBatch: its blocks first, its record LAST, so that (RocksDB
 * batches being atomic, also across WAL recovery) a document is visible only whole; a reader
 * looks for the record before trusting blocks. A delete removes the record and the block range
 * in one batch. Every read verifies the tag: a mismatch is LKV_ECORRUPT (the caller deletes).
 *
 * Thread safety: every function may be called concurrently (RocksDB is thread-safe); a write
 * batch handle is used by one thread at a time.
 */
#ifndef LKV_COLD_H
#define LKV_COLD_H

#include <stddef.h>
#include <stdint.h>

#include "lkv_dockey.h"

typedef struct lkv_cold lkv_cold;             /* Opaque. */
typedef struct lkv_cold_batch lkv_cold_batch; /* Opaque write batch. */
typedef struct lkv_cold_snap lkv_cold_snap;   /* Opaque read snapshot. */

#define LKV_COLD_TAG_BYTES       16
#define LKV_COLD_BLOCK_KEY_BYTES 37
#define LKV_COLD_DOC_KEY_BYTES   33

/* Metadata of a stored document (the record without its tokens). */
typedef struct lkv_cold_doc {
    lkv_dockey key;          /* Document key. */
    uint8_t fingerprint[32]; /* Profile fingerprint. */
    uint64_t content_hash;   /* lkv_dockey_content_hash of (salt, tokens). */
    uint32_t n_tokens;       /* Tokens. */
    uint32_t n_blocks;       /* Blocks. */
    uint32_t block_bytes;    /* Payload bytes of each block. */
    int64_t created_ms;      /* Unix milliseconds at first write. */
    uint32_t tenant;         /* Tenant index of the residency class (0 in version 1). */
    int prio;                /* Residency priority -1..1 (0 in version 1). */
    int64_t expires_ms;      /* Expiry, Unix milliseconds; 0 = none (and in version 1). */
} lkv_cold_doc;

/* Opens (creating if needed) the database in dir with blob files of values >= min_blob_bytes
 * (0: 64 KiB). LKV_EROCKSDB (logged with RocksDB's message) on failure. *out is owned by the
 * caller, closed with lkv_cold_close. */
int lkv_cold_open(const char *dir, uint64_t min_blob_bytes, lkv_cold **out);

/* Flushes memtables (so the WAL is not needed at next open) and closes. c may be NULL. */
void lkv_cold_close(lkv_cold *c);

/* Creates an empty write batch for one document (owned by the caller; freed by
 * lkv_cold_batch_commit or lkv_cold_batch_free). */
lkv_cold_batch *lkv_cold_batch_create(void);
void lkv_cold_batch_free(lkv_cold_batch *b);

/* Adds block index of doc key with payload data (borrowed, len bytes, copied into the batch). */
void lkv_cold_batch_block(lkv_cold_batch *b, const lkv_dockey *key, uint32_t index,
                          const void *data, size_t len);

/* Adds the document record of meta with tokens[0..meta->n_tokens) LAST, writes the batch
 * (sync: fsync the WAL before returning) and frees it. Returns 0, LKV_EIO for an injected
 * fault, LKV_EROCKSDB on a RocksDB error (nothing written: batches are atomic). */
int lkv_cold_batch_commit(lkv_cold *c, lkv_cold_batch *b, const lkv_cold_doc *meta,
                          const uint32_t *tokens, int sync);

/* Deletes a document (record and every block) in one batch. Idempotent (0 if absent). */
int lkv_cold_delete(lkv_cold *c, const lkv_dockey *key, int sync);

/* Reads and verifies the record of key into *meta and, if tokens is not NULL, its token ids
 * into a new array *tokens (lkv_xmalloc'ed, caller frees with free()). LKV_ENOTFOUND if absent,
 * LKV_ECORRUPT if the record fails its tag or format check. snap may be NULL (latest). */
int lkv_cold_get_doc(lkv_cold *c, lkv_cold_snap *snap, const lkv_dockey *key, lkv_cold_doc *meta,
                     uint32_t **tokens);

/* Reads block index of key into buf (caller-owned, len bytes: must equal the stored payload
 * size, else LKV_ECORRUPT) and verifies its tag. LKV_ENOTFOUND if absent, LKV_ECORRUPT on a
 * mismatch. snap may be NULL (latest). */
int lkv_cold_get_block(lkv_cold *c, lkv_cold_snap *snap, const lkv_dockey *key, uint32_t index,
                       void *buf, size_t len);

/* Takes / releases a consistent read snapshot (owned by the caller). */
lkv_cold_snap *lkv_cold_snap_create(lkv_cold *c);
void lkv_cold_snap_release(lkv_cold *c, lkv_cold_snap *snap);

/* Calls fn(ctx, meta) for every document record, in key order. A record that fails its check
 * is deleted with its blocks and counted in *n_corrupt (may be NULL). Stops early and returns
 * fn's value if fn returns non-zero. */
typedef int (*lkv_cold_scan_fn)(void *ctx, const lkv_cold_doc *meta);
int lkv_cold_scan(lkv_cold *c, lkv_cold_scan_fn fn, void *ctx, uint64_t *n_corrupt);

/* Fault injection: the next n writes (commits and deletes) fail with LKV_EIO. */
void lkv_cold_fault_writes(lkv_cold *c, int n);

/* Encodes the block key of (key, index) into out (37 bytes), for tests and tools. */
void lkv_cold_block_key(const lkv_dockey *key, uint32_t index, uint8_t out[37]);

#endif
