/*
 * lkv_lease.h: zero-copy leases (DESIGN.md section 4): documents pinned in the hot tier for a
 * co-located worker, until Release or expiry.
 *
 * A lease is a random 16-byte id (libsodium randombytes_buf), the index of the tenant that owns
 * it, a set of document keys each holding exactly one store pin (lkv_store_pin), and an expiry
 * on the monotonic clock. Attaching again with the id renews it: the TTL starts again and new
 * documents join the set (a document already in it keeps its one pin). Release unpins every
 * document and forgets the lease. A reaper thread wakes at the earliest expiry (at least every
 * second, and at once when a shorter lease is made) and releases expired leases, so a worker
 * that dies while holding a lease pins memory for at most its TTL.
 *
 * Reservations (put in place, DESIGN.md 4): a lease may also hold RESERVED documents: an open
 * store put (lkv_store_put_begin) whose pages the worker writes through its mapping, invisible
 * to everyone, until lkv_lease_commit makes the document visible (and pins it under the lease
 * like an attached one) or lkv_lease_abort, Release, expiry or destroy gives the pages back
 * (nothing ever becomes visible then). One key has at most one reservation at a time, across
 * all leases: a second reserver gets LKV_EINPROGRESS at once and may register a wake-up that the
 * table calls exactly once when that reservation ends (committed, aborted, expired, released,
 * or the table is destroyed), so a daemon can park the caller (lkv_rpc_defer) and retry.
 *
 * Invariants (under the table lock): every attached key of a live lease holds one store pin
 * taken by this table, every reserved key one open store put; a lease past its expiry is treated as
 * absent by every call (attach, release) even before the reaper has freed it; leases of other
 * tenants are indistinguishable from absent ones (LKV_ENOTFOUND), so an id cannot be probed across
 * tenants.
 *
 * All-or-nothing: an attach that fails for any document unpins what it pinned in that call and
 * leaves the lease as it was (its expiry too).
 *
 * Thread safety: every function may be called from any thread. The table lock is held across
 * store pin/unpin calls (pins may promote from RocksDB), never across anything else slow.
 */
#ifndef LKV_LEASE_H
#define LKV_LEASE_H

#include <stdint.h>

#include "lkv_store.h"

#define LKV_LEASE_ID_BYTES 16

/* Limits (config options max_leases, max_lease_docs, max_lease_ttl). */
typedef struct lkv_lease_limits {
    uint32_t max_leases; /* Live leases at once, all tenants; >= 1. */
    uint32_t max_docs;   /* Documents in one lease; >= 1. */
    uint32_t max_ttl_ms; /* Longest TTL an attach may ask for, ms; >= 1. */
} lkv_lease_limits;

typedef struct lkv_lease_table lkv_lease_table; /* Opaque. */

/* One attached document, written by lkv_lease_attach. */
typedef struct lkv_lease_doc {
    lkv_doc_info info; /* The document's info (profile borrowed from the store; info.region and
                        * info.page_bytes say where its pages are: lkv_store_region_get). */
    uint32_t *pages;   /* info.n_blocks arena pages in block order; owned by the caller (free). */
} lkv_lease_doc;

/* Called once, outside the table's lock, when the reservation a refused reserver waits for ends
 * (or at lkv_lease_table_destroy). arg is the one registered. */
typedef void (*lkv_lease_wake_fn)(void *arg);

/* Lease statistics (a consistent snapshot). */
typedef struct lkv_lease_stats {
    uint64_t live;           /* Live leases (not yet released or reaped). */
    uint64_t docs;           /* Pins held by live leases. */
    uint64_t pinned_bytes;   /* Arena bytes of those documents (n_blocks * their page_bytes). */
    uint64_t attaches;       /* Successful attaches that made a new lease. */
    uint64_t renewals;       /* Successful attaches that renewed a lease. */
    uint64_t releases;       /* Leases ended by Release. */
    uint64_t expired;        /* Leases ended by expiry. */
    uint64_t refused;        /* Attaches refused (any reason). */
    uint64_t reserved;       /* Reservations open now. */
    uint64_t reserved_bytes; /* Arena bytes they hold. */
    uint64_t reserves;       /* Reservations made. */
    uint64_t commits;        /* Reservations committed (visible). */
    uint64_t aborts;         /* Reservations aborted by their worker. */
    uint64_t resv_expired;   /* Reservations freed by expiry or Release (never visible). */
    uint64_t resv_busy;      /* Reserves refused: being computed by another worker. */
    uint64_t waiting;        /* Reservers waiting for another's reservation now. */
} lkv_lease_stats;

/* Creates the table over store (borrowed; must outlive the table) and starts the reaper.
 * Registers the lkv_lease_stats counters in the store's registry (lkv_store_stats_registry;
 * section "leases", lease_* metrics), unregistered by destroy. LKV_EINVAL for a zero limit,
 * LKV_EEXIST if another table's stats are in that registry. *out is owned by the caller
 * (lkv_lease_table_destroy). */
int lkv_lease_table_create(lkv_store *store, const lkv_lease_limits *lim, lkv_lease_table **out);

/* Stops the reaper, releases every live lease (unpinning its documents) and frees t. Call after
 * the RPC server has stopped and before lkv_store_close. t may be NULL. */
void lkv_lease_table_destroy(lkv_lease_table *t);

/* Attaches keys[0..n) (borrowed) for tenant owner (lkv_auth_index).
 *   id: NULL for a new lease, else the 16-byte id to renew (borrowed).
 *   ttl_ms: 1..max_ttl_ms.
 * On success: writes the lease id into id_out (16 bytes), its expiry (wall clock, Unix ms) into
 * *expires_unix_ms, the documents in the lease into *lease_docs, and out[0..n) (caller-owned
 * array; each out[i].pages is malloc'ed and owned by the caller, free it) for each key in order
 * (a key may repeat; it is pinned once). Errors, after which nothing changed:
 *   LKV_EINVAL   ttl 0 or above max_ttl_ms, n == 0 for a new lease, or the lease would hold
 *                more than max_docs documents (*bad = -1);
 *   LKV_ENOTFOUND id unknown, expired or another owner's (*bad = -1); or keys[*bad] is not
 *                cached;
 *   LKV_ENOSPC   max_leases live leases (*bad = -1), or keys[*bad] cannot be made hot;
 *   LKV_EPROFILE keys[*bad] belongs to a profile that is not configured;
 *   other store errors for keys[*bad].
 * bad may be NULL. */
int lkv_lease_attach(lkv_lease_table *t, int owner, const uint8_t *id, uint32_t ttl_ms,
                     const lkv_dockey *keys, uint32_t n, uint8_t id_out[LKV_LEASE_ID_BYTES],
                     uint64_t *expires_unix_ms, uint32_t *lease_docs, lkv_lease_doc *out, int *bad);

/* Reserves, for tenant owner, the document tokens[0..n_tokens) of profile (checked by the caller:
 * lkv_store_profile_get, lkv_profile_check_tokens) under salt, in lease id (NULL: a new lease;
 * else renews it) with ttl_ms as lkv_lease_attach. On 0 writes id_out, *expires_unix_ms,
 * *lease_docs, *key and out (out->pages malloc'ed, the caller's) and *present:
 *   0  reserved: out->pages are the document's pages in its region (out->info.region), held
 *      for the caller alone, not visible; write the blocks there, then lkv_lease_commit;
 *   1  the document is already cached: it was attached (pinned) under the lease instead and
 *      out describes it (as lkv_lease_attach): read it, do not write it.
 * Errors (nothing changed): LKV_EINVAL (ttl, or max_docs would be exceeded), LKV_ENOTFOUND
 * (lease unknown, expired or another owner's), LKV_ENOSPC (max_leases live, or the hot tier of
 * the profile cannot make room: lkv_store_why says why), LKV_EEXIST (this lease already
 * reserved it), LKV_EINPROGRESS (another lease's reservation holds it: if wake is not NULL it
 * is registered and called once when that reservation ends), store errors. */
int lkv_lease_reserve(lkv_lease_table *t, int owner, const uint8_t *id, uint32_t ttl_ms,
                      const uint8_t *salt, const lkv_profile *profile, const uint32_t *tokens,
                      uint32_t n_tokens, lkv_lease_wake_fn wake, void *wake_arg,
                      uint8_t id_out[LKV_LEASE_ID_BYTES], uint64_t *expires_unix_ms,
                      uint32_t *lease_docs, lkv_dockey *key, int *present, lkv_lease_doc *out);
/* lkv_lease_reserve with scratch: 1 for room that is never committed (a Block-Attention copy's
 * placeholder: lkv_put_opts.scratch, it passes the hot admission door). Plus the error
 * LKV_EADMIT: the hot admission door (hot_admission = door) refused a new document. */
int lkv_lease_reserve_ex(lkv_lease_table *t, int owner, const uint8_t *id, uint32_t ttl_ms,
                         const uint8_t *salt, const lkv_profile *profile, const uint32_t *tokens,
                         uint32_t n_tokens, int scratch, lkv_lease_wake_fn wake, void *wake_arg,
                         uint8_t id_out[LKV_LEASE_ID_BYTES], uint64_t *expires_unix_ms,
                         uint32_t *lease_docs, lkv_dockey *key, int *present, lkv_lease_doc *out);

/* Commits the reservation of key (borrowed) in lease id of owner: the store checks the zero
 * tail and makes the document visible whole (lkv_store_put_commit_written; write-through: synced
 * first, so call it where blocking is allowed); it then stays pinned under the lease like an
 * attached document and out (pages malloc'ed, the caller's) describes it: the same pages,
 * unless a Put stored the same document meanwhile (then that one's, and *kept_other = 1; may be
 * NULL). Waiters are woken.
 * Errors: LKV_ENOTFOUND (no such lease, or it holds no reservation of key); LKV_EINVAL (the
 * check failed: nothing visible, the reservation stays open: fix and commit again, or abort);
 * LKV_EIO / LKV_EROCKSDB (write-through could not persist: the reservation is gone, nothing
 * visible); LKV_EBUSY (another commit of it is running); LKV_EPERM (it was reserved as scratch,
 * which passed the hot admission door and is never committed: nothing changes, the reservation
 * stays open for Abort or Release). The commit itself runs without the
 * table's lock (a write-through sync does not hold up other leases); meanwhile the key stays
 * reserved and the lease is neither reaped nor released. */
int lkv_lease_commit(lkv_lease_table *t, int owner, const uint8_t *id, const lkv_dockey *key,
                     lkv_lease_doc *out, int *kept_other);

/* Aborts the reservation of key in lease id of owner: its pages go back, nothing becomes
 * visible, waiters are woken. LKV_ENOTFOUND as for commit; LKV_EBUSY while its commit runs. */
int lkv_lease_abort(lkv_lease_table *t, int owner, const uint8_t *id, const lkv_dockey *key);

/* Partial attach (the RAG request's ATTACH_MODE_PRESENT): as lkv_lease_attach, but a document
 * that is not cached (status[i] = LKV_ENOTFOUND) or cannot be made hot (LKV_ENOSPC) is skipped,
 * not an error: it is not pinned and out[i] stays zeroed (pages NULL). status (caller-owned, n
 * entries) receives 0 for each pinned document. When no lease id is given and nothing could be
 * pinned, no lease is made: returns 0 with id_out zeroed and *lease_docs 0. Every other error is
 * as lkv_lease_attach's (all-or-nothing for this call's pins). */
int lkv_lease_attach_present(lkv_lease_table *t, int owner, const uint8_t *id, uint32_t ttl_ms,
                             const lkv_dockey *keys, uint32_t n, uint8_t id_out[LKV_LEASE_ID_BYTES],
                             uint64_t *expires_unix_ms, uint32_t *lease_docs, lkv_lease_doc *out,
                             int *status, int *bad);

/* Releases lease id (16 bytes, borrowed) of owner: unpins its documents (and aborts its
 * reservations); LKV_EBUSY while a commit in it runs. Writes how many into
 * *released (may be NULL). LKV_ENOTFOUND if unknown, expired or another owner's. */
int lkv_lease_release(lkv_lease_table *t, int owner, const uint8_t *id, uint32_t *released);

/* Releases every expired lease now (the reaper calls this; tests may too). Returns how many. */
int lkv_lease_reap(lkv_lease_table *t);

/* Fills *out. */
void lkv_lease_stats_get(lkv_lease_table *t, lkv_lease_stats *out);

/* The table's limits (borrowed, valid until destroy). */
const lkv_lease_limits *lkv_lease_limits_get(const lkv_lease_table *t);

#endif
