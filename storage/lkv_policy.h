/*
 * lkv_policy.h: eviction policy and byte budget of one tier, as metadata only.
 *
 * A policy tracks documents by a 64-bit id (the store's slot id, or a simulator's document
 * number) with their size in bytes, against a byte budget. It never touches the arena or
 * RocksDB: the caller moves the data when the policy names a victim. The same code runs in
 * lazykvd and in bench/hitrate at millions of requests a minute, so every operation is O(1)
 * or O(log n) and allocates only when the table grows.
 *
 * Kinds:
 *   lru   least recently used.
 *   gdsf  Greedy-Dual-Size-Frequency: priority = clock + freq * cost / size, evict the lowest,
 *         clock = priority of the last victim (aging). cost is given per admit (bytes for a
 *         byte hit rate; 1 for a document hit rate).
 *   lfuda LFU with Dynamic Aging: priority = clock + freq (size-blind; a byte hit rate policy).
 *   tinylfu  LRU eviction behind a TinyLFU admission filter: a count-min sketch (4 rows of
 *         16-bit counters, halved every 10 x width records) remembers how often each id was
 *         asked for, present or not; a new id is admitted only if it was asked for more often
 *         than every victim it would displace (lkv_policy_would_admit).
 *   tlfu-gdsf  GDSF whose frequency is the sketch's estimate (history survives eviction),
 *         behind the same admission filter comparing freq * cost / size instead of freq.
 *   (more kinds may be added; lkv_policy_names lists them all)
 *
 * Pinned entries (leases) are never chosen as victims. Not thread-safe: the caller serialises.
 */
#ifndef LKV_POLICY_H
#define LKV_POLICY_H

#include <stdint.h>

typedef struct lkv_policy lkv_policy; /* Opaque. */

enum lkv_policy_kind {
    LKV_POLICY_LRU = 0,
    LKV_POLICY_GDSF = 1,
    LKV_POLICY_LFUDA = 2,
    LKV_POLICY_TINYLFU = 3,
    LKV_POLICY_TLFU_GDSF = 4,
    LKV_POLICY__COUNT
};

/* Parses a policy name ("lru", "gdsf", ...) into *kind; LKV_EINVAL on an unknown name. */
int lkv_policy_parse(const char *name, int *kind);

/* Returns the static name of kind, or "unknown". */
const char *lkv_policy_name(int kind);

/* Creates a policy of kind with budget bytes (UINT64_MAX: no limit). *out is owned by the
 * caller and freed with lkv_policy_destroy. */
int lkv_policy_create(int kind, uint64_t budget, lkv_policy **out);
void lkv_policy_destroy(lkv_policy *p);

/* Called once per victim, before the victim is dropped from the policy. */
typedef void (*lkv_policy_evict_fn)(void *ctx, uint64_t id, uint64_t bytes);

/* Admits id (not present) of size bytes and cost (see kinds). Evicts unpinned victims, in the
 * policy's order, through evict (may be NULL) until it fits. Returns LKV_ENOSPC and changes
 * nothing if it cannot fit (bytes > budget, or too much of the budget is pinned), LKV_EEXIST
 * if id is present. */
int lkv_policy_admit(lkv_policy *p, uint64_t id, uint64_t bytes, double cost,
                     lkv_policy_evict_fn evict, void *ctx);

/* Records an access to a present id (recency, frequency). LKV_ENOTFOUND if absent. */
int lkv_policy_touch(lkv_policy *p, uint64_t id);

/* Drops id without counting an eviction. LKV_ENOTFOUND if absent. */
int lkv_policy_remove(lkv_policy *p, uint64_t id);

/* Pins / unpins id (counted: n pins need n unpins). LKV_ENOTFOUND if absent; unpin of an
 * unpinned id is LKV_EINVAL. */
int lkv_policy_pin(lkv_policy *p, uint64_t id);
int lkv_policy_unpin(lkv_policy *p, uint64_t id);

/* Evicts unpinned victims until at least bytes are free; LKV_ENOSPC if impossible (nothing
 * evicted then). Used to make room ahead of an admit and to shrink a budget. */
int lkv_policy_make_room(lkv_policy *p, uint64_t bytes, lkv_policy_evict_fn evict, void *ctx);

/* Returns 1 if id is present, else 0. */
int lkv_policy_contains(const lkv_policy *p, uint64_t id);

uint64_t lkv_policy_bytes_used(const lkv_policy *p);   /* Sum of admitted sizes. */
uint64_t lkv_policy_bytes_pinned(const lkv_policy *p); /* Sum of pinned sizes. */
uint64_t lkv_policy_budget(const lkv_policy *p);
uint64_t lkv_policy_count(const lkv_policy *p); /* Entries present. */

/* Returns the number of victims chosen so far (lkv_policy_remove does not count). */
uint64_t lkv_policy_evictions(const lkv_policy *p);

/* Records one request for id, present or not, in the policy's frequency history. Kinds with a
 * sketch (tinylfu, tlfu-gdsf) need it on every lookup, before touch or admit; the others
 * ignore it. Never fails. */
void lkv_policy_record(lkv_policy *p, uint64_t id);

/* Sizes the frequency sketch for about ids distinct ids (default 4096, rounded up to a power
 * of two) and forgets its history. No effect for kinds without a sketch. */
int lkv_policy_sketch_size(lkv_policy *p, uint64_t ids);

/* Returns 1 if the admission filter accepts id (absent) of size bytes and cost now, else 0:
 * always 1 for kinds without a filter, or when it fits without evicting. Changes nothing; the
 * caller that gets 0 serves the document without caching it (or keeps it in a lower tier). */
int lkv_policy_would_admit(const lkv_policy *p, uint64_t id, uint64_t bytes, double cost);

/* Writes into names (size n, NUL-terminated, truncated) the kind names separated by ", ".
 * Returns the length it needed. */
int lkv_policy_names(char *names, int n);

#endif
