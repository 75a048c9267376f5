/*
 * lkv_router.h: which member owns a document (DESIGN.md section 5): weighted rendezvous hashing
 * (proto/lkv_route.h) over the live members of lkv_membership (UP ones and self), rebuilt on
 * every membership change.
 *
 * Thread-safe: lookups take a read lock on the current view; lkv_router_refresh (the
 * membership's on_change) swaps in a new view. The previous view is kept (one generation) so a
 * new owner can find where a moved document lived (lkv_router_prev_owner).
 */
#ifndef LKV_ROUTER_H
#define LKV_ROUTER_H

#include <stddef.h>
#include <stdint.h>

#include "lkv_membership.h"

typedef struct lkv_router lkv_router; /* Opaque. */

/* Creates a router over m (borrowed until destroy). *out owned by the caller. */
int lkv_router_create(lkv_membership *m, lkv_router **out);
void lkv_router_destroy(lkv_router *r);

/* Rebuilds the view from the membership (thread-safe; the membership's on_change calls it with
 * ctx = the router). Logs the new live set when it differs. */
void lkv_router_refresh(void *router);

/* The owner of route: its address into addr (len bytes) and id into id (may be NULL). Returns 1
 * if the owner is this daemon, 0 if another member, LKV_EUNAVAIL if no member is live. */
int lkv_router_owner(lkv_router *r, uint64_t route, char *addr, size_t len, char *id, size_t idlen);

/* As lkv_router_owner over the view before the last change that altered the live set: 1 self,
 * 0 other (addr), LKV_ENOTFOUND if there was none or the owner was the same as now. */
int lkv_router_prev_owner(lkv_router *r, uint64_t route, char *addr, size_t len);

/* The owner of route among the live members other than this daemon (its address into addr):
 * where a document that moved here when this member joined came from. 0, or LKV_ENOTFOUND if
 * self is the only live member. */
int lkv_router_owner_without_self(lkv_router *r, uint64_t route, char *addr, size_t len);

/* Milliseconds since the live set last changed (INT64_MAX before any change). */
int64_t lkv_router_changed_ms_ago(lkv_router *r);

/* 1 if a member with address addr is live in the current view, else 0. */
int lkv_router_is_live(lkv_router *r, const char *addr);

/* Live members now and this router's epoch (bumped when the live set changes). */
size_t lkv_router_live(lkv_router *r, uint64_t *epoch);

/* Share of route space of member id in the current view: w / sum(w) (0 if not live). */
double lkv_router_share(lkv_router *r, const char *id);

#endif
