/*
 * lkv_route.h: the routing hash and weighted rendezvous choice of a document's owner in a
 * lazykv cluster (DESIGN.md section 5). Part of the wire contract: the daemon and every client
 * (client/lkv_client.c, client/python/lazykv/cluster.py) compute exactly this, so a client can
 * send each call to the owner itself.
 *
 * Routing hash of a document (free of the tenant's salt, so a client computes it from what it
 * holds; documents of every tenant with the same profile and tokens share an owner):
 *     route = LE64(BLAKE2b-128("lazykv-route-v1" || fingerprint[32] || LE32(token_0) || ...)[0..8))
 * where fingerprint is the profile's (lkv_profile.fingerprint; the Cluster RPC lists them).
 *
 * Owner: weighted rendezvous hashing (the logarithmic method) over the live members: member i
 * with id_i and weight w_i (its hot capacity in bytes; 0 counts as 1) scores
 *     seed_i = LE64(BLAKE2b-128("lazykv-member-v1" || id_i)[0..8))
 *     x      = splitmix64(seed_i XOR route)
 *     u      = ((x >> 11) + 0.5) / 2^53                  (uniform in (0, 1))
 *     score  = w_i / -ln(u)
 * and the highest score owns the document (ties: the smaller id). Each member's expected share is
 * w_i / sum(w); a member joining or leaving moves only documents whose owner it is or becomes.
 */
#ifndef LKV_ROUTE_H
#define LKV_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#define LKV_ROUTE_FP_BYTES 32

/* The routing hash of (fingerprint, tokens[0..n)). */
uint64_t lkv_route_hash(const uint8_t fp[LKV_ROUTE_FP_BYTES], const uint32_t *tokens, size_t n);

/* The seed of a member id (NUL-terminated, borrowed). */
uint64_t lkv_route_seed(const char *id);

/* The rendezvous score of a member (seed, weight) for route. */
double lkv_route_score(uint64_t seed, uint64_t weight, uint64_t route);

/* One candidate of lkv_route_pick (borrowed id). */
typedef struct lkv_route_member {
    const char *id;
    uint64_t seed; /* lkv_route_seed(id). */
    uint64_t weight;
} lkv_route_member;

/* Index of the owner of route among m[0..n), or -1 if n == 0. */
int lkv_route_pick(const lkv_route_member *m, size_t n, uint64_t route);

#endif
