/*
 * lkv_cluster.h: lazykvd as a member of a cluster (DESIGN.md section 5): membership
 * (lkv_membership.h), ownership (lkv_router.h), the routing of cache calls (forward or redirect,
 * documented in proto/lazykv/v1/cache.proto) and the lazykv.v1.Cache/Cluster method. The
 * single-node daemon uses it too (mode none): Cluster then lists the daemon alone and every call
 * is served locally.
 *
 * Routing hook. lkv_cluster_route is the cache service's route hook (lkv_cache_svc.route): it
 * runs before the service touches the store and returns 0 (serve here), LKV_EAGAIN (the call was
 * parked with lkv_rpc_defer and is being forwarded: the answer of the owner finishes it from the
 * peer engine's thread, never holding a polling thread) or LKV_ENOTOWNER (Put, Get: redirect).
 *
 * Cluster-internal credential. Members call each other (forwarded Lookup/Delete, and later peer
 * transfer) with "authorization: Bearer <cluster token>" (the contents of cluster_token_file,
 * the same on every member: a Kubernetes Secret) and "lkv-tenant: <name>", the tenant the call is
 * made for. lkv_cluster_admit recognises that token (constant-time compare) before the tenant
 * table is consulted: such a call acts as the named tenant and is always served where it arrives
 * (no second hop). Tenants do not know the token, so they cannot make internal calls; the token
 * is not a tenant token (a tenant whose token_hash matched it would be refused at start).
 *
 * Shared secrets. Wire keys (daemon/lkv_wirekey.h) must decode alike on every member, so a
 * cluster with tenants reads the wire-key secret from wirekey_secret_file (the same Secret on
 * every pod). A data dir that already has its own DATA_DIR/wirekey.secret keeps the file, but the
 * shared secret wins: wire keys handed out under the old secret no longer name their documents
 * (NOT_FOUND / absent), while documents named by tokens are unaffected (store keys never depend
 * on the secret); lazykvd logs a warning when the two differ. Token hashes and auth_key come from
 * the config, which every member reads from the same ConfigMap/Secret.
 *
 * Order at shutdown: lkv_cluster_leave (revoke the etcd lease: peers re-home our share now),
 * lkv_server_shutdown, lkv_cluster_destroy (cancels forwarded calls still running; their parked
 * calls were already ended by the drain), lkv_server_destroy.
 */
#ifndef LKV_CLUSTER_H
#define LKV_CLUSTER_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

#include "lkv_auth.h"
#include "lkv_config.h"
#include "lkv_server.h"
#include "lkv_store.h"

#define LKV_CLUSTER_METHODS   1
#define LKV_CLUSTER_TENANT_MD "lkv-tenant"

typedef struct lkv_cluster lkv_cluster; /* Opaque. */

/* Creates the cluster state from cfg's cluster_* options (cfg, store, auth borrowed until
 * destroy; version copied). Reads cluster_token_file. Starts nothing yet. *out owned by the
 * caller. Returns 0 or LKV_ECONFIG (err names the option). */
int lkv_cluster_create(const lkv_config *cfg, lkv_store *store, const lkv_auth *auth,
                       const char *version, lkv_cluster **out, char *err, size_t errlen);

/* Joins: starts the peer engine and membership, advertising cluster_advertise or bound (the
 * server's bound address). Call once the server listens. 0 or LKV_ECONFIG (err). */
int lkv_cluster_start(lkv_cluster *c, const char *bound, char *err, size_t errlen);

/* Leaves the cluster (stops membership; revokes the etcd lease). Idempotent. */
void lkv_cluster_leave(lkv_cluster *c);

/* Cancels forwarded calls still running, stops the peer engine, frees c. NULL allowed. */
void lkv_cluster_destroy(lkv_cluster *c);

/* 1 if the cluster runs (mode other than none). */
int lkv_cluster_enabled(const lkv_cluster *c);

/* Replaces the tenant table cluster-internal calls name their tenant in (auth borrowed: it must
 * outlive c; the tenancy keeps every table it published until exit), after a SIGHUP reload, so a
 * tenant added live is known to forwarded calls too. c may be NULL. Thread-safe. */
void lkv_cluster_set_auth(lkv_cluster *c, const lkv_auth *auth);

/* Admission of cluster-internal calls (call first in the admit hook). authz is the
 * authorization header value (NUL-terminated) or NULL. Returns 1 if authz is the cluster
 * token: then the call is admitted acting as the tenant named in "lkv-tenant" (absent: the
 * default tenant), whose pointer goes to *out; 0 if it is not (go on with the tenant table);
 * LKV_EPERM (message set) for an internal call of a method members do not call, LKV_EUNAUTH for
 * an unknown tenant name. */
int lkv_cluster_admit(lkv_cluster *c, lkv_rpc *rpc, const char *authz, const lkv_tenant **out);

/* The cache service's route hook (ctx = the cluster); see the file comment. */
int lkv_cluster_route(void *ctx, lkv_rpc *rpc, const ProtobufCMessage *req);

/* The cache service's Get method (borrowed until destroy). Moved documents: a Get by tokens
 * that this member owns and misses, within 2 minutes of a change of the live set, first asks
 * the member that would own it without us (where a document came from when we joined), with
 * an internal Get streamed over gRPC (lkv_transfer.h); what arrives is stored here and the
 * parked call continues with this method's start (so it is served, or a plain miss if the
 * other member had nothing). NULL (default): no transfers. */
void lkv_cluster_set_get(lkv_cluster *c, const lkv_method *get);

/* The cache service's Attach method (borrowed until destroy). Local replicas: an Attach (by
 * tokens) of documents that other members own and this one lacks fetches them from their owners
 * first (the same transfer as moved documents), stores them here as replicas, then runs this
 * method as the parked call's continuation, so the co-located worker maps them from its own
 * daemon's arena. A replica is an ordinary document of the local store (same budget, same
 * eviction policy: not evicted first, the store has no priority hint yet) and is dropped when
 * its replica TTL (cluster_replica_ttl) expires, not when the owner deletes the document; one
 * pinned by a lease is dropped once released. Attach again within the TTL uses it as is. NULL
 * or TTL 0: no replicas (an Attach of a remote document is NOT_FOUND, as before). */
void lkv_cluster_set_attach(lkv_cluster *c, const lkv_method *attach);

/* Replicas made, dropped at their TTL, and held now. */
void lkv_cluster_replica_counts(lkv_cluster *c, uint64_t *made, uint64_t *dropped, size_t *held);

/* Documents fetched from a previous owner so far, and fetches that failed. */
void lkv_cluster_transfer_counts(const lkv_cluster *c, uint64_t *ok, uint64_t *failed);

/* Writes the Cluster method into out[0] (entries borrow c). Returns LKV_CLUSTER_METHODS. */
int lkv_cluster_methods(lkv_cluster *c, lkv_method *out);

#endif
