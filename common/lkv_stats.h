/*
 * lkv_stats.h: the statistics registry. Every module registers its counters and gauges here
 * once; every consumer (Admin Stats and `lazykv stats` today, a Prometheus metrics endpoint
 * later) reads them by iterating the registry, so a new counter reaches all of them without
 * being written again. Dependency-free (C11 atomics and pthreads only).
 *
 * A stat is described by an lkv_stat_desc: a metric name and optional labels (Prometheus
 * style: store_hits{tier="hot"}), a kind (counter: only grows; gauge: goes up and down), a
 * unit, one line of help, and where Admin Stats shows it (an INFO section and key; a stat
 * without a section is left out of INFO, e.g. a raw total whose ratio is shown instead).
 *
 * Stats are registered in groups (lkv_stats_register), each with one source of values:
 *   owned cells   the registry allocates one atomic 64-bit cell per stat (cache-line aligned,
 *                 so threads that bump different cells do not share a line); the module bumps
 *                 them with lkv_stat_add / lkv_stat_set: one relaxed atomic, no lock, no call
 *                 into the registry on the hot path.
 *   a read fn     read(ctx, vals, n) fills every value of the group at once when the registry
 *                 is iterated: one consistent snapshot of a module that keeps its counters under
 *                 its own lock (the store), or values derived from other values (ratios).
 *
 * Instances, not globals: a registry is a handle (lkv_stats_create). A process may hold
 * several (tests open several stores in one process, each with its own registry); one daemon
 * shares one between its modules, and a name+labels pair may be registered once per registry.
 *
 * Histograms (lkv_stats_register_hist): a group of n histograms sharing one list of bucket
 * upper bounds (in the desc's unit, e.g. "us"), each observed on the hot path with
 * lkv_stat_hist_observe (one relaxed atomic add into its bucket and one into its sum, no lock).
 * They are read with lkv_stats_foreach_hist, which hands out cumulative counts (Prometheus
 * convention: count[i] = observations <= bounds[i], the last entry +Inf = the total), so the
 * total always equals the +Inf bucket. lkv_stats_foreach (Admin Stats' INFO) skips them.
 *
 * Thread safety: every function is thread-safe. Registration, unregistration and iteration
 * take the registry's mutex; read fns and visit callbacks run under it, so they must not call
 * the registry, and a module must not register or unregister while holding a lock that its
 * read fn takes (lock order: registry, then module). After lkv_stats_unregister returns no read
 * fn of that group runs any more, so a module unregisters first when it closes.
 */
#ifndef LKV_STATS_H
#define LKV_STATS_H

#include <stdatomic.h>
#include <stdint.h>

typedef struct lkv_stats lkv_stats;           /* Opaque registry. */
typedef struct lkv_stat_group lkv_stat_group; /* Opaque: one registration. */

enum lkv_stat_kind {
    LKV_STAT_COUNTER = 0,   /* Monotonic total (Prometheus counter). */
    LKV_STAT_GAUGE = 1,     /* Current level or ratio (Prometheus gauge). */
    LKV_STAT_HISTOGRAM = 2, /* Bucketed observations (lkv_stats_register_hist only). */
};

/* Most buckets of one histogram (finite bounds; +Inf is implicit). */
#define LKV_STAT_HIST_MAX_BUCKETS 32

/* Longest name, label string, unit, section or key accepted (bytes, without the NUL). */
#define LKV_STAT_NAME_MAX 63
#define LKV_STAT_TEXT_MAX 191

/* One stat. Every string is copied at registration. */
typedef struct lkv_stat_desc {
    const char *name;    /* Metric name, [a-z_][a-z0-9_]*, e.g. "store_hits". */
    const char *labels;  /* "k=v" pairs separated by ',' ("tier=hot,cause=evicted"), keys as
                          * names, values without ',' '=' '"' '\\' or control bytes; NULL or
                          * "" for none. Compared as written. */
    int kind;            /* enum lkv_stat_kind. */
    const char *unit;    /* "docs", "blocks", "bytes", "pages", "calls", "us", "ratio"... or
                          * NULL / "" for a plain number. */
    const char *help;    /* One line (NULL: none). */
    const char *section; /* Admin Stats section ("lookups"), or NULL: not shown in INFO. */
    const char *key;     /* Admin Stats key within the section ("hits_hot"); NULL: name. */
} lkv_stat_desc;

/* Fills vals[0..n) with the current values of a group of n stats (see the file comment). */
typedef void (*lkv_stats_read_fn)(void *ctx, double *vals, int n);

/* An owned cell (hot-path counter or gauge). */
typedef struct lkv_stat_cell {
    _Alignas(64) atomic_uint_fast64_t v; /* The value. */
} lkv_stat_cell;

/* Creates an empty registry. *out is owned by the caller, freed with lkv_stats_destroy.
 * Returns 0 (allocation failure is fatal). */
int lkv_stats_create(lkv_stats **out);

/* Frees the registry and every group still registered (their cells too). r may be NULL. */
void lkv_stats_destroy(lkv_stats *r);

/* Registers descs[0..n) (n >= 1; borrowed, copied) as one group. read NULL: the registry owns
 * one zeroed cell per stat (lkv_stat_group_cell); else read(ctx, vals, n) supplies the values
 * (ctx borrowed until the group is unregistered). Refuses the whole group, registering
 * nothing, and logs one line naming the stat: LKV_EINVAL for a malformed name, label string,
 * kind or over-long text, or a name already registered with another kind or unit; LKV_EEXIST
 * if name+labels, or section+key, is already registered (also within descs). *out (may be
 * NULL) is owned by the registry: release it with lkv_stats_unregister. */
int lkv_stats_register(lkv_stats *r, const lkv_stat_desc *descs, int n, lkv_stats_read_fn read,
                       void *ctx, lkv_stat_group **out);

/* Removes group g and frees its cells (the module must not touch them any more). Waits for a
 * running iteration. g may be NULL. */
void lkv_stats_unregister(lkv_stats *r, lkv_stat_group *g);

/* Cell i (0..n-1) of a group registered without a read fn (NULL otherwise, or for a bad i).
 * Borrowed: valid until the group is unregistered. */
lkv_stat_cell *lkv_stat_group_cell(lkv_stat_group *g, int i);

/* Hot path: add n to a cell, set it, read it. Relaxed atomics, never a lock. */
static inline void lkv_stat_add(lkv_stat_cell *c, uint64_t n)
{
    atomic_fetch_add_explicit(&c->v, n, memory_order_relaxed);
}
static inline void lkv_stat_sub(lkv_stat_cell *c, uint64_t n)
{
    atomic_fetch_sub_explicit(&c->v, n, memory_order_relaxed);
}
static inline void lkv_stat_set(lkv_stat_cell *c, uint64_t v)
{
    atomic_store_explicit(&c->v, v, memory_order_relaxed);
}
static inline uint64_t lkv_stat_load(const lkv_stat_cell *c)
{
    return atomic_load_explicit(&((lkv_stat_cell *)c)->v, memory_order_relaxed);
}

/* Calls fn(ctx, desc, value) for every registered counter and gauge in registration order (groups
 * in the order they were registered, stats in their group's order) whose section is section (NULL:
 * every stat, with or without a section). desc is the registry's copy, borrowed for the call.
 * Each group's read fn runs once per call (only if one of its stats is visited). Stops and
 * returns fn's value when it returns non-zero; else returns 0. */
typedef int (*lkv_stats_visit_fn)(void *ctx, const lkv_stat_desc *desc, double value);
int lkv_stats_foreach(lkv_stats *r, const char *section, lkv_stats_visit_fn fn, void *ctx);

/* ---- Histograms ---------------------------------------------------------------------- */

typedef struct lkv_stat_hist lkv_stat_hist; /* Opaque: one histogram of a group. */

/* Registers descs[0..n) (kind LKV_STAT_HISTOGRAM; borrowed, copied) as one group of n
 * histograms over the same nb (1..LKV_STAT_HIST_MAX_BUCKETS) strictly increasing finite upper
 * bounds (borrowed, copied; in the descs' unit). Refuses as lkv_stats_register (a histogram
 * name may not also be a counter or gauge); also LKV_EINVAL for bad bounds. *out (may be NULL)
 * is owned by the registry: release it with lkv_stats_unregister. */
int lkv_stats_register_hist(lkv_stats *r, const lkv_stat_desc *descs, int n, const uint64_t *bounds,
                            int nb, lkv_stat_group **out);

/* Histogram i (0..n-1) of a group registered with lkv_stats_register_hist (NULL otherwise, or
 * for a bad i). Borrowed: valid until the group is unregistered. */
lkv_stat_hist *lkv_stat_group_hist(lkv_stat_group *g, int i);

/* Hot path: records one observation v (in the desc's unit). Lock-free, thread-safe. */
void lkv_stat_hist_observe(lkv_stat_hist *h, uint64_t v);

/* Calls fn for every registered histogram in registration order: desc (borrowed), the nb
 * bounds, nb + 1 cumulative counts (the last is +Inf, the total), and the sum of the
 * observations (desc's unit). Arrays are borrowed for the call. Stops and returns fn's value
 * when it returns non-zero; else returns 0. */
typedef int (*lkv_stats_hist_visit_fn)(void *ctx, const lkv_stat_desc *desc, const uint64_t *bounds,
                                       const uint64_t *cumulative, int nb, uint64_t sum);
int lkv_stats_foreach_hist(lkv_stats *r, lkv_stats_hist_visit_fn fn, void *ctx);

/* Number of stats registered now (a histogram counts once). */
int lkv_stats_count(lkv_stats *r);

#endif
