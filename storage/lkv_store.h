/*
 * lkv_store.h: the block store, a hot tier (arena) over a cold tier (RocksDB) (DESIGN.md 3, 4).
 *
 * Documents are the unit: a document (one model profile, n token ids, their KV as n_blocks
 * blocks in the layout of kernels/lkv_layout.h) is stored, looked up, read, evicted, promoted,
 * demoted and deleted whole. It is addressed by its document key (lkv_dockey.h).
 *
 * Tiers.
 *   hot   one arena allocated at open (host shared memory or CUDA HBM, lkv_arena.h), carved
 *         into one REGION per profile (DESIGN.md 4, the arena contract): region r holds pages
 *         of profile r's block size rounded up to 256 B, at its own 2 MiB-aligned offset, with
 *         its own eviction policy and budget (its share of hot_bytes, lkv_store_plan_regions).
 *         A document in the hot tier owns one page per block in its profile's region; the
 *         page numbers it is given (pins, reads, reservations) are indices within that region.
 *         Budgets count the bytes really held: n_blocks * the region's page size.
 *   cold  RocksDB with blob files under data_dir (lkv_cold.h), every block checksummed and
 *         verified on read; a document becomes visible there only whole (one atomic batch).
 *         Budget: cold_bytes (bytes of block payload; 0 = unlimited).
 * Each region of the hot tier, and the cold tier, has its own eviction policy instance
 * (storage/lkv_policy.h) over metadata only.
 *
 * Durability (config):
 *   write-back     put_commit returns once the document is in the hot tier; a background
 *                  writer persists it (RocksDB, sync=false; or without the WAL and then a
 *                  memtable flush: wb_no_wal); lkv_store_close flushes the queue.
 *                  A crash may lose documents not yet persisted (misses, never torn).
 *   write-through  put_commit returns only after the document is durable in RocksDB (sync=true);
 *                  a crash loses nothing acknowledged.
 *
 * Movement between tiers.
 *   - Hot eviction (to make room for a put or a promotion) demotes the victim: if it is already
 *     in the cold tier it just leaves the hot tier; otherwise its blocks are copied into a
 *     RocksDB batch (under the store lock, a memory copy) and written after the lock is let
 *     go (sync=false; readers of it wait for that write), and it is dropped if the cold tier
 *     cannot take it (cold budget, write error, full disk).
 *   - Cold eviction deletes the victim's RocksDB data; a victim that is also hot stays hot and
 *     is written again if it is later demoted.
 *   - lkv_store_get_begin / lkv_store_pin of a cold document promote it to the hot tier whole
 *     when the hot budget allows; otherwise a get streams it from a RocksDB snapshot.
 *   Evicted and deleted keys are remembered in a bounded set so that a later miss can be
 *   attributed (LKV_MISS_EVICTED / LKV_MISS_DELETED).
 *
 * Counting (DESIGN.md 4): lkv_store_lookup* counts hits (per tier, in documents and blocks) and
 * misses (by cause). get, pin and delete never count hits or misses; get and pin refresh
 * recency and promote.
 *
 * Puts are transactions: put_begin (or, when room must be made, the first valid block) reserves
 * hot pages for the whole document (evicting if needed; LKV_ENOSPC and nothing changes if the
 * budget is held by pinned or in-flight data or
 * the document is larger than the hot budget: also in write-through mode, which never bypasses
 * the hot tier), put_block stages blocks in order, put_commit makes the document visible
 * atomically, put_abort (or a failed commit) releases everything and nothing becomes visible.
 * Putting a document that already exists is idempotent: it succeeds and stores nothing new.
 *
 * Thread safety: every function may be called from any thread, concurrently, except that one
 * lkv_store_put / lkv_store_read handle is used by one thread at a time. Block copies into and
 * out of the arena and RocksDB reads of a get run without the store lock; the lock is held for
 * metadata and for demotion writes.
 *
 * Statistics: every counter below is also registered in a statistics registry (lkv_stats.h;
 * lkv_store_stats_registry), which is how Admin Stats and other consumers read them.
 *
 * Implementation: lkv_store.c (this API), lkv_store_index.c (the document index),
 * lkv_store_tier.c (tier engine and write-back writer); internals, invariants and which lock
 * guards what in lkv_store_int.h.
 */
#ifndef LKV_STORE_H
#define LKV_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "lkv_arena.h"
#include "lkv_dockey.h"
#include "lkv_profile.h"
#include "lkv_stats.h"

typedef struct lkv_store lkv_store;           /* Opaque. */
typedef struct lkv_store_put lkv_store_put;   /* Opaque put transaction. */
typedef struct lkv_store_read lkv_store_read; /* Opaque get (read) handle. */

/* Hot tier backends. */
enum lkv_hot_backend {
    LKV_HOT_AUTO = 0, /* CUDA if a device is present, else host shared memory. */
    LKV_HOT_HOST = 1, /* Host shared memory (shm_open, mode 0600). */
    LKV_HOT_CUDA = 2, /* cudaMalloc on cuda_device; LKV_ENOTSUP if built without CUDA. */
};

/* Durability modes (see the file comment). */
enum lkv_durability {
    LKV_DURABILITY_WRITE_BACK = 0,
    LKV_DURABILITY_WRITE_THROUGH = 1,
};

/* Hot admission of NEW documents (puts and reservations; lkv_store_config.hot_admission). */
enum lkv_hot_admission {
    LKV_HOT_ADMIT_ALWAYS = 0, /* Every new document is admitted to the hot tier (evicting). */
    LKV_HOT_ADMIT_DOOR = 1,   /* A new document that needs room made is admitted only if the hot
                               * policy's admission filter accepts it (lkv_policy_would_admit,
                               * the door bench/hitrate's simulator applies to a miss); else it
                               * is stored in the cold tier only, or declined (LKV_EADMIT). */
};

/* Parses "always", "door" into *out; LKV_EINVAL otherwise. */
int lkv_hot_admission_parse(const char *s, int *out);
/* Returns "always", "door" or "unknown". */
const char *lkv_hot_admission_name(int mode);

/* Tiers, as reported by lookups. */
enum lkv_tier {
    LKV_TIER_NONE = 0, /* Not present. */
    LKV_TIER_HOT = 1,  /* In the hot tier (it may also be persisted in the cold tier). */
    LKV_TIER_COLD = 2, /* In the cold tier only. */
};

/* Miss causes (lkv_doc_info.miss_cause). */
enum lkv_miss_cause {
    LKV_MISS_NONE = 0,    /* A hit. */
    LKV_MISS_NEVER = 1,   /* Never stored (or forgotten: the evicted-key memory is bounded). */
    LKV_MISS_EVICTED = 2, /* Evicted by a budget. */
    LKV_MISS_DELETED = 3, /* Deleted by a caller, or dropped as corrupt. */
    LKV_MISS_PROFILE = 4, /* The same tokens are stored under another profile (token lookups)
                           * or the document's profile is not configured any more. */
    LKV_MISS_CORRUPT = 5, /* Read back corrupt (our check or RocksDB's) and dropped. */
    LKV_MISS_LOST = 6,    /* Acknowledged (write-back) but lost in a crash before persisting. */
    LKV_MISS_EXPIRED = 7, /* Dropped when its TTL (put option ttl_ms) ran out. */
    LKV_MISS__COUNT
};

/* Parses "auto", "host", "cuda" into *out; LKV_EINVAL otherwise. */
int lkv_hot_backend_parse(const char *s, int *out);
/* Returns the static name of a backend ("auto", "host", "cuda") or "unknown". */
const char *lkv_hot_backend_name(int backend);
/* Parses "write-back", "write-through" into *out; LKV_EINVAL otherwise. */
int lkv_durability_parse(const char *s, int *out);
/* Returns "write-back", "write-through" or "unknown". */
const char *lkv_durability_name(int mode);
/* Returns "none", "never", "evicted", "deleted", "profile", "corrupt", "lost", "expired" or
 * "unknown". */
const char *lkv_miss_cause_name(int cause);

/* How hot_bytes is shared among profiles (one arena region each; DESIGN.md 4): a profile whose
 * hot_bytes is set gets that; what is left is shared by the others so that each can hold the
 * same number of blocks (shares in proportion to their page sizes: equal token capacity, so a
 * built-in toy profile beside a served 8B model takes a sliver, not half). Each region gets
 * floor(share / page_bytes) pages, at least one. Writes profiles[i]'s region into out[i]
 * (n entries, caller-owned). Returns 0, or LKV_ECONFIG with err (errlen bytes) naming the
 * profile and the fix (the explicit shares exceed hot_bytes, a region would have no page or
 * more than LKV_REF_MAX_PAGE + 1 pages). profiles need not be finished; borrowed. */
struct lkv_arena_region_cfg;
int lkv_store_plan_regions(const lkv_profile *profiles, int n, uint64_t hot_bytes,
                           struct lkv_arena_region_cfg *out, char *err, int errlen);

/* Store configuration. Zero-initialise, then set fields. All pointers are borrowed for the
 * duration of lkv_store_open only (the store copies what it keeps). */
typedef struct lkv_store_config {
    const char *data_dir;          /* Directory of the RocksDB cold tier (created if absent). */
    uint64_t hot_bytes;            /* Hot budget in bytes, shared by the profiles' regions (see
                                    * above). */
    int hot_backend;               /* enum lkv_hot_backend. */
    int cuda_device;               /* CUDA device ordinal for LKV_HOT_CUDA / AUTO. */
    uint64_t cold_bytes;           /* Cold budget in bytes of block payload; 0 = unlimited. */
    int policy_kind;               /* enum lkv_policy_kind, used for both tiers. */
    int policy_cost_bytes;         /* 0: GDSF cost 1 per document; 1: cost = bytes. */
    int durability;                /* enum lkv_durability. */
    const lkv_profile *profiles;   /* n_profiles profiles; lkv_store_open finishes copies. */
    int n_profiles;                /* >= 1. */
    uint32_t evicted_memory;       /* Recently evicted keys remembered; 0 = 65536. */
    uint64_t cold_min_blob_bytes;  /* RocksDB min_blob_size; 0 = 64 KiB. */
    uint64_t cold_min_free_bytes;  /* Disk headroom kept free under data_dir (lkv_cold.h); 0 =
                                    * 128 MiB. */
    int cold_on_corruption;        /* enum lkv_cold_on_corruption: refuse (0) or reset. */
    uint64_t wb_max_backlog_bytes; /* Write-back: bound of the unpersisted backlog (payload
                                    * bytes queued or being written); 0 = unbounded. */
    lkv_stats *stats;      /* Registry the store registers its stats in (borrowed: it must outlive
                            * the store; one store per registry); NULL: the store makes its own. */
    uint32_t maint_ms;     /* Period of the maintenance thread's TTL sweep; 0 = 1000 ms. */
    uint32_t sweep_batch;  /* Documents a bulk sweep (expiry, class eviction) does between two
                            * releases of the store lock; 0 = 64; UINT32_MAX = one hold. */
    int hot_admission;     /* enum lkv_hot_admission (0: always). See "Hot admission" above
                            * lkv_store_put_begin. */
    int cuda_read_streams; /* CUDA arena: streams of lkv_store_get_blocks_async (0 = 1). */
    int wb_no_wal;         /* Write-back: the writer writes without the WAL (LKV_COLD_NO_WAL)
                            * and a document counts as persisted only once the writer's memtable
                            * flush (lkv_cold_flush) has put it on disk: a flush when the queue
                            * empties (after a 20 ms linger), when the unflushed bytes reach half
                            * the backlog bound (64 MiB unbounded), at lkv_store_flush and close.
                            * Until then it stays unpersisted (persisted 0, in the backlog, in
                            * wb_pending). Each byte is written once (blob file), not twice (WAL
                            * and blob file). Deletes and demotion writes keep the WAL. */
} lkv_store_config;

/* Opens (or creates) the store. Validates cfg (LKV_ECONFIG with a log line naming the field:
 * no data_dir, no or bad profiles, duplicate profile names, hot_bytes below one page, bad
 * enums), allocates the arena (LKV_ECUDA / LKV_ENOTSUP / LKV_EIO if the backend fails), opens
 * RocksDB (LKV_EROCKSDB) and loads the metadata of every document already stored there into
 * the cold index, so they are served after a restart (documents over the cold budget are
 * evicted; documents of profiles no longer configured are indexed but miss with
 * LKV_MISS_PROFILE). Starts the write-back writer thread and registers the store's stats
 * (lkv_store_stats_registry; LKV_EEXIST if cfg->stats already holds another store's). *out is
 * owned by the caller and released with lkv_store_close. */
int lkv_store_open(const lkv_store_config *cfg, lkv_store **out);

/* Closes the store: unregisters its stats, persists every queued write-back document, joins
 * the writer, flushes and
 * closes RocksDB, unlinks the shared memory and frees everything. Callers must first finish
 * every put and read handle (closing with open handles is a bug: they are freed under them).
 * Returns 0, or LKV_EIO if a write-back write failed since the last flush (the store is freed
 * anyway). s may be NULL. */
int lkv_store_close(lkv_store *s);

/* Persists every queued write-back document now and waits for the queue to drain. Returns 0,
 * LKV_EIO if a write-back write failed since the previous flush (or open): the document stays
 * hot only and wb_failed counts it, or LKV_ENOSPC if the disk is full (the writer keeps the
 * queue and retries every 200 ms; wb_retries counts the attempts). The writer pins a document
 * in the hot tier only while it copies it into its batch, never during the RocksDB write; a
 * put or demote that needs that room or that document waits for the copy. */
int lkv_store_flush(lkv_store *s);

/* Profiles. The returned pointers are borrowed, valid until lkv_store_close. */
int lkv_store_profile_count(const lkv_store *s);
const lkv_profile *lkv_store_profile_at(const lkv_store *s, int index);
/* Returns the profile named name, or NULL. */
const lkv_profile *lkv_store_profile_find(const lkv_store *s, const char *name);
/* The checked form: 0 and *out (borrowed), or LKV_EPROFILE (*out = NULL) with lkv_store_why()
 * saying why: the name is empty, or it is unknown (the reason lists the known profiles). */
int lkv_store_profile_get(const lkv_store *s, const char *name, const lkv_profile **out);

/* Which check refused this thread's last call of lkv_store_profile_get, lkv_store_put_begin,
 * lkv_store_put_block or lkv_store_put_commit, and why, with the values involved (e.g. "block 1
 * is 2047 bytes, expected 2048 (profile 'itest': ...)"), for people (an RPC status message);
 * "" if that call succeeded or failed without a reason of its own (then lkv_strerror(rc) is
 * all there is). Each of those calls resets it first; other store calls leave it alone. The
 * string is per thread (like errno): read it on the thread that made the call, before that
 * thread's next one of those calls. Never NULL. */
const char *lkv_store_why(void);

/* What a lookup or get reports about one document. */
typedef struct lkv_doc_info {
    int present;                /* 1 if the document can be read now, else 0. */
    int tier;                   /* enum lkv_tier (LKV_TIER_NONE if absent). */
    int miss_cause;             /* enum lkv_miss_cause (LKV_MISS_NONE if present). */
    uint32_t n_tokens;          /* Tokens (0 if absent). */
    uint32_t n_blocks;          /* Blocks (0 if absent). */
    uint64_t block_bytes;       /* Bytes of each block (lkv_block_bytes of its profile). */
    const lkv_profile *profile; /* Borrowed until close; NULL if absent or not configured. */
    int persisted;              /* 1 if the document is in the cold tier. */
    uint32_t pins;              /* Caller pins (lkv_store_pin) held now. */
    int promoted;               /* get/pin: 1 if this call promoted it (then tier is COLD). */
    int region;                 /* Arena region of its pages (= its profile's index); -1 if the
                                 * profile is not configured. */
    uint64_t page_bytes;        /* Page size of that region (0 if none). */
    int held;                   /* 1 if held (lkv_store_hold or a class hold): never evicted. */
} lkv_doc_info;

/* Looks up n keys (borrowed array) and writes n infos into out (caller-owned). Counts one hit
 * or miss per key. Never fails for valid arguments: returns 0 (LKV_EINVAL if a pointer is NULL
 * while n > 0). */
int lkv_store_lookup(lkv_store *s, const lkv_dockey *keys, uint32_t n, lkv_doc_info *out);

/* Looks up the document of tokens[0..n_tokens) of profile (by name) under salt (32 bytes). Writes
 * the key into *key_out (may be NULL) and the info into *out. Counts a hit or a miss; a miss of
 * tokens that are stored under another profile is LKV_MISS_PROFILE; a hit or miss is also
 * counted in blocks. Returns LKV_EPROFILE for an unknown profile name (nothing counted). */
int lkv_store_lookup_tokens(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], const char *profile,
                            const uint32_t *tokens, uint32_t n_tokens, lkv_dockey *key_out,
                            lkv_doc_info *out);

/* The tier key is in now (enum lkv_tier; LKV_TIER_COLD also while it is being promoted), without
 * counting a hit or miss or touching recency: a hint for the daemon, which runs reads of cold
 * documents (promotions, RocksDB) on its worker pool. The answer may be stale at once. */
int lkv_store_tier(lkv_store *s, const lkv_dockey *key);

/* ---- Put transactions ----------------------------------------------------------------- */

/* Hot admission (cfg.hot_admission = LKV_HOT_ADMIT_DOOR). At put_begin of a NEW document that
 * does not fit its region's free room, the region's hot policy is asked whether it would admit
 * the document's committed id (lkv_policy_would_admit: for the sketch kinds, whether it was
 * looked up more often than the victims it would displace; lookups record every key, hit or
 * miss). A held document (put option hold, or a class hold covering it) and a scratch put
 * (option scratch) always pass. The
 * door only decides when evicting could make the room: a put that finds the region held by
 * pinned data is refused (LKV_ENOSPC) or deferred exactly as without the door. One the door
 * refuses (counted in hot_admit_refused) is:
 *   - stored in the cold tier only when the cold tier can take it (its budget and the disk):
 *     its blocks are staged in host memory and written to RocksDB by put_commit (synced in
 *     write-through mode, unsynced in write-back mode, but before put_commit returns in both;
 *     a crash in write-back mode may lose it, as any write-back put); put_finish reports tier
 *     LKV_TIER_COLD; a later get or pin promotes it as any cold document (puts_cold_only);
 *   - else declined: put_begin returns LKV_EADMIT and changes nothing (puts_declined), so the
 *     caller is never told a document is stored that is not.
 * A put to be filled in place (lkv_store_put_reserve) cannot be stored cold: reserve returns
 * LKV_EADMIT for it (the caller computes the document in its own memory and may Put it by copy,
 * which stores it cold). With LKV_HOT_ADMIT_ALWAYS (the default of a zeroed config) every new
 * document is admitted hot, evicting, as before. Promotions of cold documents by get keep their
 * own door (lkv__promote); pin always promotes. */

/* Begins putting the document tokens[0..n_tokens) of profile (name) under salt. Validates the
 * input (lkv_store_profile_get, lkv_profile_check_tokens) and changes nothing on error, saying
 * why in lkv_store_why(): LKV_EPROFILE unknown profile; LKV_EINVAL n_tokens == 0, n_tokens >
 * max_doc_tokens or a token >= vocab_size; LKV_ENOSPC the hot tier cannot
 * make room (budget held by pinned or in-flight data, or the document is larger than the hot
 * budget) or, in write-through mode with a cold budget, the document is larger than the cold
 * budget; LKV_EADMIT the hot admission door refused it and the cold tier cannot take it
 * (above); LKV_ESHUTDOWN the store is closing. On success reserves hot pages for every block if
 * they are free; if room must be made (evicting, which demotes documents), the reservation and
 * the evictions wait for the first block that passes its checks (lkv_store_put_block may then
 * say LKV_ENOSPC), or for lkv_store_put_reserve (a put filled in place), so a put refused
 * before that changes nothing. Writes the key into *key_out
 * (may be NULL) and *exists (may be
 * NULL: 1 if the document is already stored, in which case nothing is reserved and the blocks
 * are checked but discarded). *out is owned by the caller and must be finished with exactly one
 * of lkv_store_put_commit or lkv_store_put_abort. tokens and salt are borrowed (copied). */
int lkv_store_put_begin(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], const char *profile,
                        const uint32_t *tokens, uint32_t n_tokens, lkv_store_put **out,
                        lkv_dockey *key_out, int *exists);

/* 1 if the hot door refused the put and it is being staged for the cold tier only (its commit
 * writes RocksDB before it returns, also in write-back mode), else 0. */
int lkv_store_put_cold_only(const lkv_store_put *tx);

/* Number of blocks the put expects, and the exact byte size of each. */
uint32_t lkv_store_put_n_blocks(const lkv_store_put *tx);
uint64_t lkv_store_put_block_bytes(const lkv_store_put *tx);

/* Stages block index of the put: data (borrowed, len bytes, host memory) is copied into the
 * arena (the first block reserves the pages if put_begin deferred that: LKV_ENOSPC if there is
 * no room then, LKV_ESHUTDOWN if the store is closing). Blocks must come in order 0, 1, ...
 * (LKV_EINVAL otherwise), len must equal the block size (LKV_EINVAL), and in the last block the
 * token slots past the document's end must be zero (LKV_EINVAL); lkv_store_why() says which. An
 * error leaves the transaction open and unchanged (the caller usually aborts). */
int lkv_store_put_block(lkv_store_put *tx, uint32_t index, const void *data, size_t len);

/* lkv_store_put_block with the block's bytes in n pieces (borrowed iovecs of host memory, in
 * order; their lengths must add up to the block size): the same checks, and each byte is copied
 * once, from its piece into the arena (the Put stream hands the received gRPC slices here,
 * lkv_putwire.h). */
int lkv_store_put_blockv(lkv_store_put *tx, uint32_t index, const struct iovec *iov, size_t n);

/* Commits the put and frees tx (always, also on error). LKV_EINVAL if not every block was
 * staged (nothing becomes visible; lkv_store_why() says how many were). Write-back: the document is
 * visible in the hot tier and queued for persistence when this returns. Write-through: it is
 * durable in RocksDB (synced) and visible; a RocksDB failure returns LKV_EIO / LKV_EROCKSDB and
 * nothing becomes visible. If the same document was committed meanwhile, returns 0 and keeps the
 * existing one. */
int lkv_store_put_commit(lkv_store_put *tx);

/* What a finished put found and left (lkv_store_put_finish). */
typedef struct lkv_put_result {
    int existed;   /* 1 if the document was stored already (this put stored nothing new; also
                    * when a concurrent put of it committed first). */
    int tier;      /* enum lkv_tier where the document is now. */
    int persisted; /* 1 if it is in the cold tier at this moment (write-through: synced). */
} lkv_put_result;

/* lkv_store_put_commit that also reports the result into *res (may be NULL). Write-through: a
 * document that existed but is no longer persisted (evicted from the cold tier while hot) is
 * persisted again before this returns (its failure is this call's), so persisted is 1 on 0. */
int lkv_store_put_finish(lkv_store_put *tx, lkv_put_result *res);

/* Write-back backpressure (cfg.wb_max_backlog_bytes): call before committing a put. Returns 0
 * if the put may commit now (its bytes are reserved in the backlog until it commits or aborts),
 * or LKV_EAGAIN if the backlog is full: then, if fn is not NULL, fn(blob) is called once (on
 * the writer thread, without the store lock) when the backlog has room again, blob being a copy
 * of blob[0..len) (len <= 32); the caller then calls lkv_store_put_wait again. Waiters not yet
 * called at close are dropped without a call. Always 0 in write-through mode, for a put of a
 * document that exists, and while the backlog is empty. */
int lkv_store_put_wait(lkv_store_put *tx, void (*fn)(const void *blob), const void *blob,
                       size_t len);

/* Abandons the put (e.g. the client disconnected) and frees tx: releases its pages; nothing
 * becomes visible. tx may be NULL. */
void lkv_store_put_abort(lkv_store_put *tx);

/* ---- Put in place (DESIGN.md 4): a co-located worker writes the blocks itself ------------ */

/* A put opened with lkv_store_put_begin can instead be filled in place: the caller writes
 * block i straight into arena page pages[i] of region lkv_store_put_region (through its own
 * mapping: shared memory, or CUDA IPC), then commits with lkv_store_put_commit_written. Until
 * then the document is invisible to everyone (its pages are held and pinned).
 * lkv_store_put_pages returns the n_blocks pages in block order (borrowed until the put ends),
 * or NULL if the document already existed or nothing is reserved yet (lkv_store_put_reserve).
 * lkv_store_put_region returns the region (= the profile's index), with lkv_store_region_get
 * for its layout. */
const uint32_t *lkv_store_put_pages(const lkv_store_put *tx);
int lkv_store_put_region(const lkv_store_put *tx);

/* Reserves the put's hot pages now if lkv_store_put_begin deferred that (it does when room
 * must be made by evicting: a Put by copy reserves at its first valid block). A put filled in
 * place calls this right after lkv_store_put_begin, before lkv_store_put_pages. Returns 0
 * (also when the document existed: nothing to reserve), LKV_ENOSPC if no room can be made
 * (lkv_store_why says why), LKV_ESHUTDOWN if the store is closing, LKV_EINVAL if blocks were
 * staged by copy; on an error tx is still open and unchanged (abort it). */
int lkv_store_put_reserve(lkv_store_put *tx);

/* Checks what the store can of blocks written in place (the token slots past the document's
 * end in the last block must be zero, as lkv_store_put_block checks) and commits as
 * lkv_store_put_commit, taking one caller pin (lkv_store_pin) of the committed document in the
 * same step, so it cannot be evicted before the caller uses it: writes its hot pages into
 * pages[0..min(cap, n_blocks)) and *info (may be NULL). If the same document was made visible
 * meanwhile (a Put), that one is kept, pinned and described instead (info->promoted or other
 * pages: compare). Returns 0 with tx freed; LKV_EINVAL if the check fails (lkv_store_why says
 * which block and where): then NOTHING changed and tx is still open (write the tail, commit
 * again, or abort); other commit errors (LKV_EIO, LKV_EROCKSDB in write-through) free tx and
 * nothing becomes visible. Must not be called on a put whose blocks were staged with
 * lkv_store_put_block (LKV_EINVAL, tx still open). */
int lkv_store_put_commit_written(lkv_store_put *tx, uint32_t *pages, uint32_t cap,
                                 lkv_doc_info *info);

/* Convenience: begin + every block (blocks: n_blocks * block_bytes contiguous bytes, borrowed)
 * + commit, or abort on the first error. */
int lkv_store_put_all(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], const char *profile,
                      const uint32_t *tokens, uint32_t n_tokens, const void *blocks, size_t len,
                      lkv_dockey *key_out);

/* ---- Reads ---------------------------------------------------------------------------- */

/* Begins reading the document key: refreshes its recency in its tier and, if it is cold only,
 * promotes it to the hot tier whole when the hot budget allows (else it will be streamed from
 * a RocksDB snapshot). Does not count a hit or miss. info->tier is the tier the document was
 * found in (LKV_TIER_COLD when this call promoted it; info->promoted says so). While the handle is
 * open the document's data stays intact: a concurrent delete or eviction makes it invisible to new
 * lookups but this reader still reads every block (its pages are freed at lkv_store_get_end).
 * Returns LKV_ENOTFOUND if absent, LKV_ECORRUPT if it was found corrupt while promoting (by our
 * check or RocksDB's: it is then dropped, counted in corrupt_blocks, and later lookups miss it
 * with cause LKV_MISS_CORRUPT), LKV_EPROFILE if its profile is not configured. Writes *info (may
 * be NULL).
 * *out is owned by the caller and released with lkv_store_get_end. */
int lkv_store_get_begin(lkv_store *s, const lkv_dockey *key, lkv_store_read **out,
                        lkv_doc_info *info);

/* Copies block index (0..n_blocks-1, any order) into buf (caller-owned host memory, len >=
 * block_bytes). Does not take the store lock for the copy. Returns LKV_EINVAL for a bad index
 * or short buffer; for a cold (snapshot) read, LKV_ECORRUPT if the block fails its checksum
 * (the document is then deleted and counted; stop streaming). */
int lkv_store_get_block(lkv_store_read *rd, uint32_t index, void *buf, size_t len);

/* Where block index of a document read from the hot tier lies in host memory (the host arena,
 * mapped in this process), for sending it without a copy: the block_bytes bytes there stay
 * valid and unchanged until lkv_store_get_end(rd). NULL if the read streams from the cold tier,
 * the arena is not host-mapped (CUDA), or index is out of range. */
const void *lkv_store_get_block_ptr(const lkv_store_read *rd, uint32_t index);

/* Copies blocks first..first+n-1 of a document read from the hot tier into dst (caller-owned
 * host memory, n * block_bytes bytes, block i at dst + (i - first) * block_bytes), without the
 * store lock: lkv_arena_read_async (lkv_arena.h) over its pages. Host arena: done at once,
 * returns 0 (done unused). CUDA arena: returns LKV_EAGAIN and done->fn(done, rc) runs once, on
 * a CUDA callback thread, when the bytes are in dst; rd must not be ended before that. Errors
 * (done not called): LKV_EINVAL (a cold read, or a bad range), LKV_ECUDA. */
int lkv_store_get_blocks_async(lkv_store_read *rd, uint32_t first, uint32_t n, void *dst,
                               lkv_arena_done *done);

/* Info of the document being read (borrowed, valid until lkv_store_get_end). */
const lkv_doc_info *lkv_store_get_info(const lkv_store_read *rd);

/* Hot pages of the document being read, in block order (n_blocks entries, borrowed until
 * lkv_store_get_end), or NULL if it is being streamed from the cold tier. */
const uint32_t *lkv_store_get_pages(const lkv_store_read *rd);

/* Ends a read and frees rd. rd may be NULL. */
void lkv_store_get_end(lkv_store_read *rd);

/* Convenience: reads the whole document into buf (n_blocks * block_bytes bytes). */
int lkv_store_get_all(lkv_store *s, const lkv_dockey *key, void *buf, size_t len,
                      lkv_doc_info *info);

/* ---- Delete, pins, eviction ------------------------------------------------------------ */

/* Deletes key from both tiers (RocksDB delete through the WAL, sync in write-through mode).
 * LKV_ENOTFOUND if absent, LKV_EBUSY if pinned by lkv_store_pin, LKV_ENOSPC / LKV_EIO if the
 * RocksDB delete cannot be written (disk full): then nothing changed. Readers in progress
 * finish intact. */
int lkv_store_delete(lkv_store *s, const lkv_dockey *key);

/* Pins key in the hot tier (promoting it first if cold; LKV_ENOSPC if it cannot be made hot,
 * LKV_ECORRUPT if the promotion found it corrupt, as lkv_store_get_begin)
 * so it is never evicted until unpinned; pins count (n pins need n unpins). Writes the hot
 * pages into pages[0..min(pages_cap, n_blocks)) if pages is not NULL, and *info (may be NULL).
 * LKV_ENOTFOUND if absent. */
int lkv_store_pin(lkv_store *s, const lkv_dockey *key, uint32_t *pages, uint32_t pages_cap,
                  lkv_doc_info *info);
/* Drops one pin. LKV_ENOTFOUND if absent, LKV_EINVAL if not pinned. */
int lkv_store_unpin(lkv_store *s, const lkv_dockey *key);

/* ---- Per-tenant usage (storage/lkv_store_acct.c) ------------------------------------------ */

/* What the documents put under one salt hold now. */
typedef struct lkv_store_usage {
    uint64_t hot_bytes;  /* Arena bytes (pages x page_bytes) of its hot documents, including
                          * puts in progress and dead documents still pinned. */
    uint64_t cold_bytes; /* Payload bytes of its documents in the cold tier. */
    uint64_t docs;       /* Its visible documents (hot, cold or both). */
    uint64_t page_bytes; /* The largest region's page size (hot bytes of a document of n blocks:
                          * n x its own region's page_bytes, lkv_store_region_get). */
    int accounted;       /* 1 if the salt has an account (it put a document since open). */
} lkv_store_usage;

/* Usage of the documents put under salt since open (documents recovered from the cold tier at
 * open are not attributed to any salt: RocksDB records do not carry it). At most 1024 salts
 * are accounted; later ones read as zero. Thread-safe. */
void lkv_store_usage_get(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], lkv_store_usage *out);

/* The key of the least recently used visible, unpinned, unheld document put under salt (last read
 * by a Get, Attach or pin, else created; Lookups do not count): with tier LKV_TIER_HOT one in the
 * hot tier (to demote; already persisted ones first, so the demotion writes nothing), else any
 * (to delete). Returns 0 (*out
 * written), or LKV_ENOTFOUND if there is none. A hint: the document may be gone at once. */
int lkv_store_usage_oldest(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], int tier,
                           lkv_dockey *out);

/* Demotes key out of the hot tier now (persisting it first if needed), as an admin "evict".
 * LKV_ENOTFOUND if absent or not hot, LKV_EBUSY if pinned, held (lkv_store_hold) or being read. */
int lkv_store_demote(lkv_store *s, const lkv_dockey *key);

/* Calls fn(ctx, key, info) for every visible document (order unspecified), under the store lock:
 * fn must not call the store. Stops early and returns fn's value if fn returns non-zero. */
typedef int (*lkv_store_foreach_fn)(void *ctx, const lkv_dockey *key, const lkv_doc_info *info);
int lkv_store_foreach(lkv_store *s, lkv_store_foreach_fn fn, void *ctx);

/* ---- Introspection -------------------------------------------------------------------- */

typedef struct lkv_store_stats {
    /* Hot tier. */
    uint64_t hot_docs;         /* Visible documents in the hot tier. */
    uint64_t hot_blocks;       /* Their blocks. */
    uint64_t hot_bytes;        /* Arena bytes held (documents, in-flight puts, readers), all
                                * regions: pages held * their region's page size. */
    uint64_t hot_bytes_pinned; /* Of which pinned (pins, reads, in-flight puts). */
    uint64_t hot_budget;       /* Sum of the regions' budgets (pages * page_bytes). */
    uint64_t hot_page_bytes;   /* Bytes of one page of the largest region (per region:
                                * lkv_store_region_get). */
    uint64_t hot_pages_total;  /* Arena pages, all regions. */
    uint64_t hot_pages_free;   /* Arena pages free, all regions. */
    /* Cold tier. */
    uint64_t cold_docs;   /* Documents in RocksDB. */
    uint64_t cold_blocks; /* Their blocks. */
    uint64_t cold_bytes;  /* Their block payload bytes. */
    uint64_t cold_budget; /* Cold budget (UINT64_MAX = unlimited). */
    /* Lookups (DESIGN.md 4: counted at lookup only). */
    uint64_t hits_hot, hits_cold;              /* Documents. */
    uint64_t hit_blocks_hot, hit_blocks_cold;  /* Blocks. */
    uint64_t misses;                           /* Documents. */
    uint64_t miss_blocks;                      /* Blocks (token lookups only). */
    uint64_t misses_by_cause[LKV_MISS__COUNT]; /* Index: enum lkv_miss_cause. */
    /* Movement. */
    uint64_t evictions_hot;  /* Documents evicted from the hot tier (demoted or dropped). */
    uint64_t evictions_cold; /* Documents evicted from the cold tier. */
    uint64_t demotions;      /* Hot victims written to the cold tier. */
    uint64_t drops;          /* Hot victims lost (cold tier could not take them). */
    uint64_t promotions;     /* Cold documents copied into the hot tier. */
    /* Puts, deletes, persistence. */
    uint64_t puts;             /* Committed puts that stored a new document. */
    uint64_t puts_existing;    /* Puts of documents already stored (nothing new stored). */
    uint64_t puts_aborted;     /* Aborted or failed puts. */
    uint64_t puts_inflight;    /* Open put transactions. */
    uint64_t deletes;          /* Documents deleted by callers. */
    uint64_t wb_pending;       /* Write-back documents queued, not yet persisted. */
    uint64_t wb_persisted;     /* Documents persisted by the writer. */
    uint64_t wb_failed;        /* Writer failures (document stays hot only). */
    uint64_t wb_cold_declined; /* Of wb_failed: documents the cold tier's policy did not admit
                                * (no I/O failed: its budget held entries that won the contest,
                                * or were pinned). */
    uint64_t wb_retries;       /* Writer attempts put back for a full disk (retried later). */
    uint64_t wb_backlog_bytes; /* Unpersisted write-back payload bytes (queued, being written,
                                * reserved by committing puts). */
    uint64_t cold_readonly;    /* 1 while the cold tier is open read-only (disk full at open). */
    uint64_t disk_free_bytes;  /* Bytes free on data_dir's disk (statvfs). */
    uint64_t corrupt_blocks; /* Blocks or records failing their check, or missing (doc dropped). */
    uint64_t reads_inflight; /* Open read handles. */
    /* Residency controls. */
    uint64_t expired;         /* Documents dropped when their TTL ran out. */
    uint64_t class_evictions; /* Documents evicted or purged by lkv_store_evict_class. */
    uint64_t hot_bytes_held;  /* Hot bytes of held documents (gauge). */
    /* Hot admission (cfg.hot_admission = door; see above lkv_store_put_begin). */
    uint64_t hot_admit_refused; /* Door refusals of new documents (each put_begin refused: a
                                 * Reserve then a Put of one document count twice). */
    uint64_t puts_cold_only;    /* Of which committed to the cold tier only. */
    uint64_t puts_declined;     /* Of which declined (LKV_EADMIT: no room in the cold tier). */
} lkv_store_stats;

/* Fills *out (caller-owned) with a consistent snapshot of the counters, in constant time (the
 * tier sizes are counters too, never a walk over the documents). */
void lkv_store_stats_get(lkv_store *s, lkv_store_stats *out);

/* The registry holding the store's stats (cfg.stats, or the store's own; borrowed, valid until
 * close). Every field of lkv_store_stats is registered there as one group (read under the
 * store lock, so an iteration sees one consistent snapshot), with the Admin Stats section and
 * key it is shown under ("hot"/"docs", "lookups"/"hits_hot", ...) and a metric name with labels
 * (store_docs{tier="hot"}, store_hits{tier="hot"}, store_misses{cause="evicted"}, ...), plus
 * the hit ratios "lookups"/"hit_rate_docs" and "hit_rate_blocks". Other modules of the same
 * process may register theirs in it too. */
lkv_stats *lkv_store_stats_registry(lkv_store *s);

/* The hot arena, for zero-copy attach by a co-located process (borrowed, valid until close). */
typedef struct lkv_store_arena_info {
    int backend;          /* LKV_HOT_HOST or LKV_HOT_CUDA (never AUTO). */
    const char *shm_name; /* Host: the shm_open name ("/lazykv-..."); NULL for CUDA. */
    uint64_t arena_bytes; /* Bytes of the whole allocation (what a worker maps). */
    int n_regions;        /* Regions (= profiles); see lkv_store_region_get. */
    int cuda_device;      /* CUDA: device ordinal; -1 for host. */
    uint8_t cuda_ipc[64]; /* CUDA: cudaIpcMemHandle_t bytes of the arena base; zeros if host. */
} lkv_store_arena_info;

/* One arena region (the hot tier of one profile): its layout and what it holds now. Page i of
 * the region is at arena byte base_offset + i * page_bytes (DESIGN.md 4, the arena contract). */
typedef struct lkv_store_region {
    const lkv_profile *profile; /* Its profile (borrowed until close). */
    uint64_t base_offset;       /* Byte offset of its page 0 (a multiple of 2 MiB). */
    uint64_t page_bytes;        /* Bytes of one page: block_bytes rounded up to 256 B. */
    uint32_t n_pages;           /* Pages. */
    uint32_t pages_free;        /* Pages free now. */
    uint64_t bytes_used;        /* Bytes held (pages held * page_bytes). */
    uint64_t bytes_pinned;      /* Of which pinned. */
    uint64_t budget;            /* n_pages * page_bytes. */
} lkv_store_region;

/* Writes region r (0..lkv_store_profile_count-1; the region of profile r) into *out, a
 * consistent snapshot. LKV_EINVAL for a bad r. Each region's used, pinned and budget bytes are
 * also registered in the stats registry (section "regions", keys "<profile>.bytes_used", ...;
 * metrics store_region_bytes_*{profile="..."}). */
int lkv_store_region_get(lkv_store *s, int r, lkv_store_region *out);

void lkv_store_arena_info_get(lkv_store *s, lkv_store_arena_info *out);

/* ---- Residency controls (DESIGN.md 4; the policy side in lkv_policy.h) -------------------
 *
 * Every document has a class id, tenant << 32 | profile index, where tenant is the caller's
 * tenant index (the daemon's tenant slot, lkv_tenancy_index; 0 = the default tenant) given at put.
 * Holds pin documents in both tiers' policies (never evicted; they count in bytes_pinned, so a put
 * that finds the hot budget full of held documents gets LKV_ENOSPC); a priority orders
 * eviction (-1 first, +1 last); a TTL drops the document (both tiers, miss cause
 * LKV_MISS_EXPIRED) at the first maintenance sweep after it ran out (a thread of the store
 * sweeps every maint_ms, so a TTL is exact to that period; a held or pinned expired document
 * goes at the first sweep after its release). Tenant, priority and expiry are persisted with
 * the document (cold record version 3); holds are not: per-document holds are runtime state,
 * class holds are re-applied by whoever configures them (lazykvd: "hold = true" in a profile
 * or tenant section) after every open. */

#define LKV_PUT_TTL_MAX_MS 3155760000000ull /* 100 years. */

/* Put options (lkv_store_put_begin_ex). Zero-initialise: all zero is a plain put. */
typedef struct lkv_put_opts {
    uint32_t tenant; /* Tenant index (the class id's high half). */
    int prio;        /* -1 evict first, 0 normal, +1 evict last; else LKV_EINVAL. */
    uint64_t ttl_ms; /* Drop the document ttl_ms after the put; 0 = never. */
    int hold;        /* 1: hold the document from its commit (also one already stored). */
    int scratch;     /* 1: scratch room, never committed (a Block-Attention copy's placeholder
                      * reservation): it passes the hot admission door, as the hit-rate
                      * simulator admits a copy without asking its filter. */
} lkv_put_opts;

/* lkv_store_put_begin with options (o may be NULL: a plain put). A document already stored
 * keeps its class, priority and expiry (only hold applies to it). Same contract and errors,
 * plus LKV_EINVAL for a priority outside -1..1 or a ttl_ms above LKV_PUT_TTL_MAX_MS
 * (lkv_store_why says so). */
int lkv_store_put_begin_ex(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], const char *profile,
                           const uint32_t *tokens, uint32_t n_tokens, const lkv_put_opts *o,
                           lkv_store_put **out, lkv_dockey *key_out, int *exists);

/* Holds (on = 1) or releases (on = 0) the document key. Holding a cold-only document promotes
 * it first (LKV_ENOSPC if it cannot be made hot: nothing changes). Idempotent. LKV_ENOTFOUND
 * if absent. A release leaves the document held if a class hold covers it. */
int lkv_store_hold(lkv_store *s, const lkv_dockey *key, int on);

/* A class: every document of tenant index tenant (< 0: any tenant) and/or of the profile named
 * profile (NULL: any profile); at least one of the two must be given (else LKV_EINVAL). */

/* Holds (on = 1) every present and future document of the class, or releases that hold (on =
 * 0; LKV_ENOTFOUND if there is no such hold). Documents of the class in the cold tier only are
 * held there and held hot when a get promotes them (a hold does not promote). Writes the
 * number of documents of the class present into *n (may be NULL). LKV_EPROFILE for an unknown
 * profile (lkv_store_why says which exist), LKV_ENOSPC beyond 16 class holds. */
int lkv_store_hold_class(lkv_store *s, int64_t tenant, const char *profile, int on, uint64_t *n);

/* Evicts every document of the class from the hot tier (demoting it, as the budget does);
 * purge: drops them from both tiers instead (miss cause LKV_MISS_DELETED). Held and pinned
 * (leased, being read or written) documents stay, whole (their cold copy too). Like
 * lkv_store_expire it works in batches, letting the store lock go every sweep_batch documents.
 * Writes the documents evicted from the hot tier into *n_hot and those dropped from the cold tier
 * into *n_cold (both may be NULL). Errors as lkv_store_hold_class (no LKV_ENOSPC). */
int lkv_store_evict_class(lkv_store *s, int64_t tenant, const char *profile, int purge,
                          uint64_t *n_hot, uint64_t *n_cold);

/* Drops every unpinned, unheld document whose TTL ran out at now_ms (Unix ms; 0: the current
 * time), from both tiers; the maintenance thread calls it every maint_ms. It lets the store
 * lock go after every sweep_batch drops (each is a RocksDB delete), so a mass expiry does not
 * stall other callers. Writes the count into *n (may be NULL). Returns 0. */
int lkv_store_expire(lkv_store *s, int64_t now_ms, uint64_t *n);

/* Fault injection (tests): the next n RocksDB writes of this store fail with LKV_EIO, as a full
 * disk would. n = 0 clears. Also set at open from the environment variable
 * LKV_FAULT_COLD_WRITES=n. */
void lkv_store_fault_cold_writes(lkv_store *s, int n);

#endif
