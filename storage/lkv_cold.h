/*
 * lkv_cold.h: the cold tier, RocksDB with blob files (DESIGN.md 4).
 *
 * One RocksDB database under a directory. Blob files are enabled (values of at least
 * min_blob_bytes live in blob files, not in the LSM tree). Keys and values (format 2; records
 * of version 3 add the residency fields):
 *
 *   block   key   'B' | doc key (32) | block index (u32 big-endian: blocks sort in order)
 *           value header (32) | payload (block_bytes)
 *           header: byte 0 block format version (2), bytes 1..15 zero, bytes 16..31 tag
 *           tag = XXH3-128 of the payload seeded by XXH3-64 of the key's 37 bytes (low then
 *           high 64 bits, little-endian)
 *   doc     key   'D' | doc key (32)
 *           value record (below) | tag (16), tag = XXH3-128 of the record seeded by XXH3-64
 *           of the key's 33 bytes
 *
 *   record  offset  size    field
 *           0       1       format version (3; 2 is still read)
 *           1       32      profile fingerprint
 *           33      8       content hash (lkv_dockey_content_hash), little-endian
 *           41      4       n_tokens, little-endian
 *           45      4       n_blocks
 *           49      4       block_bytes
 *           53      8       created, Unix milliseconds
 *           61      4       tenant index (residency class; version 3)
 *           65      1       priority, int8 -1..1 (version 3)
 *           66      8       expiry, Unix milliseconds, 0 = none (version 3)
 *           74      4 * n   token ids, little-endian uint32 (version 2: at 61, no 61..73)
 *
 * Integrity. Every block read is checked by its XXH3-128 tag (about 20 GB/s); RocksDB's own
 * checksums stay on for records, scans and the LSM's blocks, but are off for block values:
 * Debian's librocksdb 7.8 computes CRC32c in software (about 1.5 GB/s: 90% of a 2 MiB read,
 * bench/RESULTS.md), and the tag covers the same bytes and more (it is bound to the key).
 * Format 1 (the previous one: a 16-byte BLAKE2b-128 tag before the payload, BLAKE2b-128
 * record tags, version byte 1) is recognised by its record's version and valid old tag and
 * dropped at open with one log line: such documents become misses, never "corrupt".
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
#define LKV_COLD_BLOCK_HDR_BYTES 32
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
    uint32_t tenant;         /* Tenant index of the residency class (0 in version 2). */
    int prio;                /* Residency priority -1..1 (0 in version 2). */
    int64_t expires_ms;      /* Expiry, Unix milliseconds; 0 = none (and in version 2). */
} lkv_cold_doc;

/* What to do with a database found damaged at open. */
enum lkv_cold_on_corruption {
    LKV_COLD_REFUSE = 0, /* Refuse to open (LKV_ECORRUPT), logging the file and the fix. */
    LKV_COLD_RESET = 1,  /* A damaged WAL: point-in-time recovery (what precedes the damage is
                          * kept; the documents after it are counted in the log line). Any
                          * other damage: move the files aside into dir/corrupt-<UTC time>/
                          * and start empty, with one loud log line. */
};

#define LKV_COLD_DEFAULT_MIN_FREE (128ull << 20)

/* Open options. Zero-initialise, then set fields. */
typedef struct lkv_cold_options {
    uint64_t min_blob_bytes; /* RocksDB min_blob_size; 0 = 64 KiB. */
    uint64_t min_free_bytes; /* Headroom kept free on the disk; 0 = 128 MiB (see below). */
    int on_corruption;       /* enum lkv_cold_on_corruption. */
    uint64_t gc_min_bytes;   /* Blob garbage collection only above this many bytes of blob
                              * files; 0 = 256 MiB (see lkv_cold_gc_check). */
} lkv_cold_options;

/* Opens (creating if needed) the database in dir (which must exist).
 *
 * Disk space. RocksDB 7.8 aborts on an assertion after a failed sync when the disk fills, so
 * that path is never reached: every write first checks the free space of dir's file system
 * (statvfs) and is refused with LKV_ENOSPC unless min_free_bytes plus twice its size stay free
 * (a write lands in the WAL and later in a blob file); memtables are sized to a quarter of the
 * headroom so a flush always fits. If the disk is already below the headroom at open, the
 * database is opened read-only (stored documents can be read; every write is LKV_ENOSPC) and
 * reopened read-write by the first write (or lkv_cold_try_reopen) that finds room again.
 *
 * Refusals, each logged with the file and the fix: a dir that cannot be written (read-only
 * mount, permissions): LKV_EIO; a full disk with no database yet: LKV_ENOSPC; a damaged
 * database (CURRENT missing beside MANIFEST or table files, a missing MANIFEST, a table or
 * blob file RocksDB finds corrupt, a WAL record corrupt before its tail): LKV_ECORRUPT, or
 * with on_corruption = LKV_COLD_RESET what that says. A torn last WAL record (a crash in the
 * middle of a write) is not damage: it is dropped, as RocksDB does. Other RocksDB failures
 * (another process holds the lock): LKV_EROCKSDB / LKV_EIO. o may be NULL (defaults). *out is
 * owned by the caller, closed with lkv_cold_close. */
int lkv_cold_open_ex(const char *dir, const lkv_cold_options *o, lkv_cold **out);

/* lkv_cold_open_ex with min_blob_bytes and every other option at its default. */
int lkv_cold_open(const char *dir, uint64_t min_blob_bytes, lkv_cold **out);

/* The disk: bytes free now on dir's file system (UINT64_MAX if unknown), the headroom, the
 * directory (borrowed), and 1 while the database is open read-only (disk full at open). */
uint64_t lkv_cold_free_bytes(const lkv_cold *c);
uint64_t lkv_cold_min_free(const lkv_cold *c);
const char *lkv_cold_dir(const lkv_cold *c);
int lkv_cold_readonly(const lkv_cold *c);

/* 0 if a write of about bytes would be let through now (reopening read-write if the disk has
 * room again), else LKV_ENOSPC: the check every write makes first, for callers that can skip
 * building a batch. */
int lkv_cold_can_write(lkv_cold *c, uint64_t bytes);

/* If open read-only and the disk has room again, reopens read-write: 0 (also when it was not
 * read-only), LKV_ENOSPC (still full), LKV_EAGAIN (readers or snapshots are out: try later). */
int lkv_cold_try_reopen(lkv_cold *c);

/* A database found damaged after open (a scan met corruption): with LKV_COLD_RESET, moves it
 * aside as lkv_cold_open_ex does and reopens empty (0, or LKV_EIO / LKV_EROCKSDB if that fails:
 * then only lkv_cold_close is valid); with LKV_COLD_REFUSE logs the refusal and returns
 * LKV_ECORRUPT, changing nothing. why names the damage. No other call may run concurrently. */
int lkv_cold_reset(lkv_cold *c, const char *why);

/* Flushes memtables (so the WAL is not needed at next open) and closes. c may be NULL. */
void lkv_cold_close(lkv_cold *c);

/* Blob garbage collection, on demand. RocksDB's own (enable_blob_garbage_collection, always on)
 * relocates every blob of the oldest quarter of the blob files whenever a compaction meets its
 * key, garbage or not: for a write-once store whose block keys are spread over the whole key
 * range, that rewrote a quarter of the live data every few flushes (the writer persisted
 * 1.5-1.8x less; bench/RESULTS.md). So it is off, and this check turns it on (with a forced
 * compaction of files over half garbage, blob_garbage_collection_force_threshold 0.5) only
 * while garbage (blobs of deleted documents still in live blob files) is at least half of the
 * blob-file bytes and those are over gc_min_bytes, and off again once garbage is under a
 * quarter: disk use stays within about 2x of the live blobs, and live data is rewritten only
 * to reclaim at least as much garbage. lkv_cold_batch_write and lkv_cold_delete run it at most
 * once a second; call it directly to check now. Returns 1 if collection is on after the check,
 * 0 if off (also read-only or on a failed property read). */
int lkv_cold_gc_check(lkv_cold *c);

/* Blob-file bytes and the garbage among them (RocksDB properties live-blob-file-size and
 * live-blob-file-garbage-size); 0 each when unknown. */
void lkv_cold_blob_bytes(lkv_cold *c, uint64_t *total, uint64_t *garbage);

/* Compacts the whole key range now, every level (bottommost too), blocking (tests: makes
 * deletions count as garbage, and,
 * with collection on, relocates blobs). Returns 0. */
int lkv_cold_compact(lkv_cold *c);

/* Creates an empty write batch for one document (owned by the caller; freed by
 * lkv_cold_batch_commit or lkv_cold_batch_free). */
lkv_cold_batch *lkv_cold_batch_create(void);
void lkv_cold_batch_free(lkv_cold_batch *b);

/* Adds block index of doc key with payload data (borrowed, len bytes, copied into the batch). */
void lkv_cold_batch_block(lkv_cold_batch *b, const lkv_dockey *key, uint32_t index,
                          const void *data, size_t len);

/* Adds the document record of meta with tokens[0..meta->n_tokens) (borrowed) to the batch; after
 * it, only lkv_cold_batch_write or lkv_cold_batch_free. */
void lkv_cold_batch_finish(lkv_cold_batch *b, const lkv_cold_doc *meta, const uint32_t *tokens);

/* sync argument of lkv_cold_batch_write: no WAL record at all. The batch lives in the memtable
 * only, readable at once, and reaches the disk when the memtable is flushed (lkv_cold_flush, or
 * RocksDB's own flush of a full memtable); a crash before that loses it whole (never torn: it
 * is one batch). The write-back writer's wb_wal = false mode. */
#define LKV_COLD_NO_WAL 2

/* Writes a finished batch (sync: 1 fsync the WAL first, 0 WAL not synced, LKV_COLD_NO_WAL)
 * and frees it; returns as lkv_cold_batch_commit. */
int lkv_cold_batch_write(lkv_cold *c, lkv_cold_batch *b, int sync);

/* Flushes the memtables and waits until they are on disk (SST and blob files synced, in the
 * MANIFEST): every write before this call is then durable, LKV_COLD_NO_WAL ones included.
 * LKV_ENOSPC without trying when less than half of min_free_bytes is free or the database is
 * read-only (a failed flush on a full disk aborts RocksDB 7.8), LKV_EROCKSDB if it fails. */
int lkv_cold_flush(lkv_cold *c);

/* Adds the document record of meta with tokens[0..meta->n_tokens) LAST, writes the batch
 * (sync: fsync the WAL before returning) and frees it. Returns 0, LKV_EIO for an injected
 * fault, LKV_ENOSPC if the disk lacks room (see lkv_cold_open_ex), LKV_EIO / LKV_ECORRUPT /
 * LKV_EROCKSDB on a RocksDB error (nothing written: batches are atomic). */
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

/* Pending markers: the write ledger, dir/lkv-pending.ledger, an append-only file of 33-byte
 * records (op 'P' or 'U' | doc key) kept outside RocksDB so that marking never waits behind
 * the writer's multi-MiB batches (one write(2) with O_APPEND, no fsync: it survives a process
 * crash, as the WAL the writer uses does). mark records a write-back document acknowledged and
 * not yet persisted; unmark one dropped or deleted before it was persisted (not "lost"). A
 * persisted document needs no record: at open its 'D' record is there. Both are best effort
 * (LKV_EIO from mark if the ledger could not be opened or written). */
int lkv_cold_mark_pending(lkv_cold *c, const lkv_dockey *key);
void lkv_cold_unmark_pending(lkv_cold *c, const lkv_dockey *key);

/* At open: calls fn(ctx, key, has_doc) for every key whose latest ledger record is 'P'
 * (has_doc: it was persisted after all), then empties the ledger (unless read-only). The
 * ledger grows by 33 bytes per write-back put until the next open. Returns 0. */
typedef void (*lkv_cold_pending_fn)(void *ctx, const lkv_dockey *key, int has_doc);
int lkv_cold_scan_pending(lkv_cold *c, lkv_cold_pending_fn fn, void *ctx);

/* Fault injection: the next n writes (commits and deletes) fail with LKV_EIO. */
void lkv_cold_fault_writes(lkv_cold *c, int n);

/* The tag of a block's payload under block key key (37 bytes), as stored in its header: for
 * tests and benchmarks that check bytes the way the cold tier does. */
void lkv_cold_block_tag(const uint8_t key[LKV_COLD_BLOCK_KEY_BYTES], const void *data, size_t len,
                        uint8_t out[LKV_COLD_TAG_BYTES]);

/* Encodes the block key of (key, index) into out (37 bytes), for tests and tools. */
void lkv_cold_block_key(const lkv_dockey *key, uint32_t index, uint8_t out[37]);

#endif
