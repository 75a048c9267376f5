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
 *   adaptive  W-TinyLFU with a hill-climbing window (after the design of the Caffeine cache):
 *         a small LRU admission window in front of a segmented LRU main region (probation,
 *         protected = 90% of main). A new id that fits in the window's share enters the
 *         window; a larger one (every id while the share is 0) bypasses it: it must win the
 *         contest below at the door (lkv_policy_would_admit) against the entries its admission
 *         evicts (probation LRU, then protected, then window) and joins probation. When the
 *         window is over its share and room is needed, its LRU entry (the candidate) competes
 *         with the main region's LRU entries that would free as many bytes: it moves into main
 *         only if its density, sketch estimate x cost / bytes, exceeds each of theirs (size-
 *         aware: cost = bytes is a frequency contest, cost = 1 favours small documents as GDSF
 *         does), else it is the one evicted. One hill climber on the hit rate (lkv_policy_record
 *         counts requests, lkv_policy_touch hits) moves a position x in [0, 1] that sets two
 *         things: on [0, 0.05] the window is empty and the sketch's history (records between
 *         halvings) shrinks geometrically from TinyLFU's (10 x sketch width) to the cache's
 *         own turnover (40 x entries present, at least 1024), so drifting popularity is
 *         followed; beyond 0.05 the history stays short and the window's share grows linearly
 *         to 1 (LRU). x starts at 0 (TinyLFU on an SLRU). Every sample (40 x entries present,
 *         at least 16384 requests: one short history, so a move shows within the sample) x
 *         steps in the current direction. Towards recency the direction is kept only if the
 *         hit rate rose by more than one standard error of the difference of two samples;
 *         back towards TinyLFU it is kept unless the rate fell by more than one; else it is
 *         reversed (TinyLFU is the prior: noise walks x back to 0). The step (5%) decays by
 *         0.98 a sample to a floor of 0.5% and restarts on a jump of 5 points. O(1) per
 *         operation (a contest looks at most at 8 rivals).
 *   (more kinds may be added; lkv_policy_names lists them all)
 *
 * Pinned entries (leases) are never chosen as victims. Not thread-safe: the caller serialises.
 *
 * Residency controls (every kind honours them; see lkv_policy_admit_ex and below):
 *   hold      an operator pin of an id (lkv_policy_hold) or of every present and future id of a
 *             class (lkv_policy_hold_class); held entries are pinned (one pin, whatever the
 *             lease pins) and counted in bytes_pinned.
 *   class     a 64-bit class id given at admit (the store packs tenant << 32 | profile); a
 *             value/mask pair selects a tenant, a profile or both, for holds and for bulk
 *             eviction (lkv_policy_evict_class).
 *   priority  -1 (evicted before any normal entry), 0 (the kind's order), +1 (evicted only when
 *             no other unpinned entry is left); LRU order within the -1 and +1 tiers.
 *   ttl       an expiry time in the caller's clock (0: none); lkv_policy_expire evicts what
 *             expired (a sweep over the entries, O(n): call it periodically, not per request).
 *
 * Store integration (wired: storage/lkv_store_resid.c; it differs from this sketch: holds apply
 * to both tiers, and class eviction, purge and TTL expiry are a batched sweep of the store's
 * documents, with a thread of its own for the TTLs, rather than lkv_policy_evict_class /
 * lkv_policy_expire, to bound how long they hold the store lock): class id = tenant <<
 * 32 | profile index. Put with options {prio, ttl_ms, hold} calls lkv_policy_admit_ex on both tiers
 * with expires = now_ms + ttl_ms, then lkv_policy_hold if asked. Admin Hold(key | tenant | profile,
 * on) maps to lkv_policy_hold (promoting a cold document first) or lkv_policy_hold_class with mask
 * 0xffffffff00000000 (tenant), 0x00000000ffffffff (profile) or ~0 (both), on the hot policy;
 * Admin Evict(tenant | profile) to lkv_policy_evict_class on the hot policy with the store's
 * usual eviction callback (demote to cold) and, for a purge, on the cold policy (delete). The
 * maintenance thread calls lkv_policy_expire(hot, now_ms, ...) and (cold, ...) every second.
 * Holds are policy state, not persisted (in the store: a document hold ends with the process;
 * class holds are re-applied from lazykvd's config, hold_profiles / hold_tenants, at each start).
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
    LKV_POLICY_ADAPTIVE = 5,
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

/* ---- residency controls ---- */

/* Per-entry attributes given at admit. */
typedef struct lkv_policy_attrs {
    uint64_t cls;     /* Class id (tenant << 32 | profile in the store); 0 = none. */
    int prio;         /* -1 evict first, 0 normal, +1 evict last (clamped to -1..1). */
    uint64_t expires; /* Expiry in the caller's clock (lkv_policy_expire), 0 = never. */
} lkv_policy_attrs;

/* lkv_policy_admit with attributes (a may be NULL: cls 0, prio 0, no expiry). An id whose
 * class matches a class hold is held from its admission. Same errors as lkv_policy_admit. */
int lkv_policy_admit_ex(lkv_policy *p, uint64_t id, uint64_t bytes, double cost,
                        const lkv_policy_attrs *a, lkv_policy_evict_fn evict, void *ctx);

/* Holds (on = 1) or releases (on = 0) a present id: an operator pin, not counted (a second
 * hold is a no-op), independent of lease pins and of class holds. LKV_ENOTFOUND if absent. */
int lkv_policy_hold(lkv_policy *p, uint64_t id, int on);

/* Holds (on = 1) every present and future entry with (cls & mask) == value, or releases such
 * a hold (on = 0: entries stay held if another class hold or an id hold covers them). At most
 * 16 class holds at once (LKV_ENOSPC beyond); releasing a hold that is not there is
 * LKV_ENOTFOUND. O(n) in the entries present. */
int lkv_policy_hold_class(lkv_policy *p, uint64_t value, uint64_t mask, int on);

/* Evicts, through evict (may be NULL), every unpinned entry with (cls & mask) == value
 * (counted as evictions); pinned ones stay. Writes the number evicted to *n (may be NULL).
 * O(n) in the entries present. */
int lkv_policy_evict_class(lkv_policy *p, uint64_t value, uint64_t mask, lkv_policy_evict_fn evict,
                           void *ctx, uint64_t *n);

/* Evicts every unpinned entry whose expiry is set and <= now (counted as evictions); a pinned
 * expired entry goes at the first sweep after its last unpin. Writes the count to *n (may be
 * NULL). O(n). */
int lkv_policy_expire(lkv_policy *p, uint64_t now, lkv_policy_evict_fn evict, void *ctx,
                      uint64_t *n);

/* Window share of the budget (adaptive kind; 0 for the others), in [0, 1]. */
double lkv_policy_window(const lkv_policy *p);

/* Bytes of memory the policy holds for each tracked entry (entry + hash slots), excluding
 * the sketch, whose size lkv_policy_sketch_bytes gives. */
uint64_t lkv_policy_entry_bytes(void);
uint64_t lkv_policy_sketch_bytes(const lkv_policy *p);

/* Writes into names (size n, NUL-terminated, truncated) the kind names separated by ", ".
 * Returns the length it needed. */
int lkv_policy_names(char *names, int n);

#endif
