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
 * Invariants (under the table lock): every key of a live lease holds one store pin taken by
 * this table; a lease past its expiry is treated as absent by every call (attach, release) even
 * before the reaper has freed it; leases of other tenants are indistinguishable from absent
 * ones (LKV_ENOTFOUND), so an id cannot be probed across tenants.
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
    lkv_doc_info info; /* The document's info (profile borrowed from the store). */
    uint32_t *pages;   /* info.n_blocks arena pages in block order; owned by the caller (free). */
} lkv_lease_doc;

/* Lease statistics (a consistent snapshot). */
typedef struct lkv_lease_stats {
    uint64_t live;         /* Live leases (not yet released or reaped). */
    uint64_t docs;         /* Pins held by live leases. */
    uint64_t pinned_bytes; /* Arena bytes of those documents (n_blocks * page_bytes each). */
    uint64_t attaches;     /* Successful attaches that made a new lease. */
    uint64_t renewals;     /* Successful attaches that renewed a lease. */
    uint64_t releases;     /* Leases ended by Release. */
    uint64_t expired;      /* Leases ended by expiry. */
    uint64_t refused;      /* Attaches refused (any reason). */
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

/* Releases lease id (16 bytes, borrowed) of owner: unpins its documents. Writes how many into
 * *released (may be NULL). LKV_ENOTFOUND if unknown, expired or another owner's. */
int lkv_lease_release(lkv_lease_table *t, int owner, const uint8_t *id, uint32_t *released);

/* Releases every expired lease now (the reaper calls this; tests may too). Returns how many. */
int lkv_lease_reap(lkv_lease_table *t);

/* Fills *out. */
void lkv_lease_stats_get(lkv_lease_table *t, lkv_lease_stats *out);

/* The table's limits (borrowed, valid until destroy). */
const lkv_lease_limits *lkv_lease_limits_get(const lkv_lease_table *t);

#endif
