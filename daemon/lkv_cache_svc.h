/*
 * lkv_cache_svc.h: the lazykv.v1.Cache service (proto/lazykv/v1/cache.proto) over the block store.
 *
 * Put (client stream), Lookup (unary), Get (server stream), Delete, Attach and Release (unary:
 * zero-copy leases over lkv_lease.h; the reply carries the arena mapping, so only callers the
 * admission hook let in with the worker role reach them), and Reserve, Commit and Abort (put in
 * place, worker role: a co-located worker writes a miss straight into reserved arena pages; a
 * Reserve that waits for another worker's reservation is parked with lkv_rpc_defer and resumed
 * by the lease table's wake-up, never holding a polling thread). Every input is
 * validated before the store is touched, so a refused call changes nothing; a Put whose stream
 * fails or whose client goes away is aborted (lkv_store_put_abort: nothing becomes visible).
 * Error messages name what was expected and what was got. The service holds no gRPC state: it
 * talks to the engine only through lkv_server.h.
 */
#ifndef LKV_CACHE_SVC_H
#define LKV_CACHE_SVC_H

#include <stdatomic.h>
#include <stdint.h>

#include "lkv_lease.h"
#include "lkv_server.h"
#include "lkv_stage.h"
#include "lkv_store.h"
#include "lkv_wirekey.h"

#define LKV_CACHE_SVC_METHODS 9

/* One tenant's lookup counters (the "lookups" section of Stats as that tenant sees it). */
typedef struct lkv_tenant_lookups {
    _Atomic uint64_t hits_hot, hits_cold;              /* Documents. */
    _Atomic uint64_t hit_blocks_hot, hit_blocks_cold;  /* Blocks. */
    _Atomic uint64_t misses;                           /* Documents. */
    _Atomic uint64_t miss_blocks;                      /* Blocks (token lookups only). */
    _Atomic uint64_t misses_by_cause[LKV_MISS__COUNT]; /* Index: enum lkv_miss_cause. */
} lkv_tenant_lookups;

typedef struct lkv_cache_svc {
    lkv_store *store;             /* Borrowed; outlives the server. */
    uint8_t salt[LKV_SALT_BYTES]; /* Default tenant's salt (tenants: next issue). */
    int durability;               /* enum lkv_durability, reported in PutResponse. */
    uint64_t get_target_bytes;    /* Block payload per Get message (at least one block). */
    /* Get staging ring (storage/lkv_stage.h; borrowed, outlives the server), or NULL: hot
     * blocks that are not host-mapped (a CUDA arena) are copied into one of its slots
     * (cudaMemcpyAsync, the call parked meanwhile) and sent from it; with NULL they are read
     * with a blocking cudaMemcpy into a per-call buffer and packed (the copying path).
     * stage_always: stage host-arena reads too (tests and benchmarks of the ring without a
     * GPU); 0: a host arena is sent from its pinned pages. */
    lkv_stage *stage;
    int stage_always;
    uint32_t max_lookup_docs; /* Documents per Lookup. */
    /* Request size bounds (lkv_method.max_request_bytes): Lookup and Attach; Get and Delete
     * (one document). 0: the server's max_message_bytes. Put always gets the server's. */
    uint64_t max_request_bytes;
    uint64_t max_docref_bytes;
    /* Optional: the document-key salt of a call's principal (lkv_rpc_principal, attached by the
     * server's admit hook), e.g. its tenant's salt. NULL, or a NULL principal or result: the
     * default tenant's salt. The returned bytes must outlive the call. */
    const uint8_t *(*salt_of)(const void *principal);
    /* Leases (Attach/Release). NULL: both answer UNIMPLEMENTED. Borrowed. */
    lkv_lease_table *leases;
    /* Optional: the dense tenant index (0..n_tenants-1) of a principal, e.g. lkv_auth_index
     * with ctx = the tenant table. NULL, or a NULL principal: index 0. The index selects the
     * lease owner, the wire-key permutation and the per-tenant lookup counters. */
    int (*index_of)(const void *ctx, const void *principal);
    const void *index_ctx;
    int n_tenants;               /* Entries of wire and lookups (>= 1 when either is set). */
    const lkv_wirekey *wire;     /* n_tenants permutations (borrowed); NULL: identity for all. */
    lkv_tenant_lookups *lookups; /* n_tenants per-tenant counters (borrowed), or NULL. */
    /* Optional (NULL: every call is served here): where a Put, Lookup, Get, Delete or Attach
     * is served, asked with its request (the Put's first message) before the store is touched:
     * 0 here, LKV_EAGAIN the hook parked the call and finishes it (forwarded), < 0 refused
     * with that code (the hook set the message). daemon/cluster/lkv_cluster.h. */
    int (*route)(void *ctx, lkv_rpc *rpc, const ProtobufCMessage *req);
    void *route_ctx;
    /* Optional tenant limits (daemon/lkv_tenancy.h), ctx quota_ctx. check_put runs once per Put
     * before the store sees its header (so nothing is reserved or evicted for a put the quota
     * refuses), with the header's profile and tokens (borrowed for the call); charge_bytes once
     * per Put message with its block payload bytes. Either returns 0, or a negative code after
     * lkv_rpc_errorf (the Put then fails with it and stores nothing). */
    int (*check_put)(void *ctx, lkv_rpc *rpc, const char *profile, const uint32_t *tokens,
                     uint32_t n_tokens);
    int (*charge_bytes)(void *ctx, lkv_rpc *rpc, uint64_t n);
    void *quota_ctx;
} lkv_cache_svc;

/* Initialises *svc (caller-owned) for store (borrowed) and durability. */
void lkv_cache_svc_init(lkv_cache_svc *svc, lkv_store *store, int durability);

/* Writes the service's LKV_CACHE_SVC_METHODS methods into out[0..) (caller-owned array of at
 * least that many entries; entries borrow svc). Returns the count. */
int lkv_cache_svc_methods(lkv_cache_svc *svc, lkv_method *out);

#endif
