/*
 * lkv_admin_svc.h: the lazykv.v1.Admin service (proto/lazykv/v1/admin.proto): Stats, List,
 * Evict.
 *
 * Stats reports Redis INFO-style sections (server, hot, cold, lookups, movement, puts,
 * persistence, leases, tenants, calls, then any other registered section) as text and as
 * (section, key, value) entries, read from the statistics registry (lkv_stats.h) the store,
 * the lease table and the RPC engine register in. List pages through every visible
 * document in key order (a bounded max-heap keeps the page's smallest keys, so a page costs one
 * pass over the index and O(limit) memory). Evict demotes one document to the cold tier.
 */
#ifndef LKV_ADMIN_SVC_H
#define LKV_ADMIN_SVC_H

#include <stdatomic.h>
#include <time.h>

#include "lkv_cache_svc.h"
#include "lkv_lease.h"
#include "lkv_server.h"
#include "lkv_store.h"

#define LKV_ADMIN_SVC_METHODS 3

typedef struct lkv_admin_svc {
    lkv_store *store;             /* Borrowed; outlives the server. */
    _Atomic(lkv_server *) server; /* Set once the server exists (NULL before). */
    const char *durability;       /* Static name, for the server section. */
    int threads;                  /* Polling threads, for the server section. */
    struct timespec started;      /* Monotonic start time. */
    lkv_stats *stats;             /* Registry to show (borrowed); NULL: the store's registry. */
    /* Optional per-tenant lookup counters. With isolate set (tenants configured), a configured
     * tenant's Stats shows its own counters in the "lookups" section and nothing of other
     * tenants; the anonymous loopback caller (index 0, the host's operator) sees the store's
     * totals and a "tenants" section with every tenant's hits and misses. Without isolate
     * (one tenant), "lookups" is the store's totals. Arrays of n_tenants entries, borrowed. */
    int n_tenants;
    int isolate;
    int (*index_of)(const void *ctx, const void *principal); /* As lkv_cache_svc.index_of. */
    const void *index_ctx;
    const char *const *tenant_names;          /* NULL entries are skipped. */
    const lkv_tenant_lookups *tenant_lookups; /* Counters by tenant index. */
    /* Optional: the entries of tenant_names that are published now (index_ctx; thread-safe),
     * when tenants are added while the daemon runs (lkv_tenancy_named); NULL: n_tenants. */
    int (*n_named)(const void *ctx);
} lkv_admin_svc;

/* Initialises *a (caller-owned); store is borrowed. Call lkv_admin_svc_set_server once the
 * server exists (calls arriving before see no "calls" section). */
void lkv_admin_svc_init(lkv_admin_svc *a, lkv_store *store, const char *durability, int threads);
void lkv_admin_svc_set_server(lkv_admin_svc *a, lkv_server *srv);

/* Writes LKV_ADMIN_SVC_METHODS methods into out (entries borrow a); returns the count. */
int lkv_admin_svc_methods(lkv_admin_svc *a, lkv_method *out);

#endif
