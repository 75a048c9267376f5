/*
 * lkv_cluster_client.h: a lazykv client for a cluster of lazykvd (DESIGN.md section 5): it
 * learns the members from lazykv.v1.Cache/Cluster and sends every call to the document's owner,
 * computed as the daemons do (proto/lkv_route.h: weighted rendezvous over the live members on
 * the routing hash of the profile fingerprint and the token ids). Built on lkv_client.h (one
 * handle per member, created on first use and kept until destroy): no gRPC core calls here.
 *
 * Failures and the deadline. A call that a member refuses as not its own (LKV_ENOTOWNER: the
 * views differ for a moment) or that cannot reach its owner (LKV_EUNAVAIL: the owner died and
 * is not yet marked down) re-reads the cluster and is sent again, every 100 ms, until it
 * succeeds, fails otherwise, or its deadline passes (LKV_ETIMEDOUT, or the last error): no call
 * outlives its deadline. Once the members mark the dead owner down its documents have a new
 * owner, where they are misses (LKV_ENOTFOUND / absent) until re-put.
 *
 * Thread-safe: the member table is guarded by a mutex; calls run on per-member handles, which
 * are thread-safe themselves.
 */
#ifndef LKV_CLUSTER_CLIENT_H
#define LKV_CLUSTER_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "lkv_client.h"

typedef struct lkv_cluster_client lkv_cluster_client_t; /* Opaque, thread-safe. */

/* Creates a routing client. seeds: "host:port[,host:port]" (borrowed), any members; opt as for
 * lkv_client_create (copied; NULL: defaults), used for every member. Reads the cluster from the
 * first seed that answers within deadline_ms. *out owned by the caller. Returns 0, LKV_EINVAL,
 * or the error of the last seed tried. */
int lkv_cluster_client_create(const char *seeds, const lkv_client_options *opt, int deadline_ms,
                              lkv_cluster_client_t **out);

/* Destroys r and every member handle (no call may be running). NULL allowed. */
void lkv_cluster_client_destroy(lkv_cluster_client_t *r);

/* Re-reads the cluster from a live member (else a seed). Returns 0 or the last error. */
int lkv_cluster_client_refresh(lkv_cluster_client_t *r, int deadline_ms);

/* The routing hash of ref (from its profile's fingerprint and its tokens), or 0 if it cannot be
 * computed (unknown profile, or a ref by key: a key hides the tokens, so such a ref goes to any
 * up member, which forwards a Lookup or Delete only if given DocRef.route on the wire; name
 * documents by content to route them here). */
uint64_t lkv_cluster_client_route(lkv_cluster_client_t *r, const lkv_docref *ref);

/* The owner of a routing hash now: its address into addr (len bytes). Returns 0, or
 * LKV_EUNAVAIL if no member is up. */
int lkv_cluster_client_owner(lkv_cluster_client_t *r, uint64_t route, char *addr, size_t len);

/* The handle of member addr (borrowed until destroy; created on first use). */
lkv_client_t *lkv_cluster_client_member(lkv_cluster_client_t *r, const char *addr);

/* The last cluster view read (copied into *out: free with lkv_cluster_info_free). */
void lkv_cluster_client_info(lkv_cluster_client_t *r, lkv_cluster_info *out);

/* As lkv_client_put, lkv_client_lookup (one call per owner, merged in order), lkv_client_get_buf
 * and lkv_client_delete, sent to the owner (see the file comment for retries). */
int lkv_cluster_client_put(lkv_cluster_client_t *r, const char *profile, const uint32_t *tokens,
                           size_t n_tokens, const void *blocks, uint32_t n_blocks,
                           size_t block_bytes, int deadline_ms, lkv_put_reply *reply);
int lkv_cluster_client_lookup(lkv_cluster_client_t *r, const lkv_docref *refs, size_t n,
                              int deadline_ms, lkv_doc_status *out);
int lkv_cluster_client_get_buf(lkv_cluster_client_t *r, const lkv_docref *ref, int deadline_ms,
                               lkv_get_header *header, uint8_t **data, size_t *len);
int lkv_cluster_client_delete(lkv_cluster_client_t *r, const lkv_docref *ref, int deadline_ms,
                              uint8_t *key_out);

#endif
