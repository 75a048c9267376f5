/*
 * lkv_cache_svc.c: lazykv.v1.Cache handlers (see lkv_cache_svc.h and cache.proto).
 *
 * Put: a per-call put_state holds the store transaction. The first message must carry the
 * header; it is validated (profile known, 1..max tokens, every id < vocab, n_blocks as implied
 * by the tokens) before lkv_store_put_begin reserves anything. Blocks must come in index order
 * with exactly block_bytes bytes each. The half-close commits; any failure, cancellation or
 * shutdown aborts in cleanup (the transaction is still open there only if it never committed).
 *
 * Get: a per-call get_state holds the store read handle and one staging buffer of
 * blocks_per_msg blocks (allocated once per call). The header goes out first, then block
 * messages of up to get_target_bytes of payload; the engine sends one at a time.
 *
 * Lookup validates every document reference first (so an invalid batch counts nothing), then
 * looks key references up in one store call and token references one by one, in order.
 *
 * Keys on the wire are the caller's wire keys (lkv_wirekey.h): resolve_ref decodes a key
 * reference with the caller's permutation, and every key in a reply or an error message is
 * encoded back, so a tenant never sees or names a store key.
 *
 * Attach validates everything (lease id length, TTL against max_lease_ttl, document count,
 * every reference) before lkv_lease_attach pins anything; the lease table pins all-or-nothing.
 * The reply carries the arena mapping (lkv_store_arena_info_get) and each document's layout and
 * pages. If the reply of a new lease cannot be sent, the lease is released at once. In
 * ATTACH_MODE_PRESENT (the RAG request) lkv_lease_attach_present pins what is present and
 * attach_fill_skipped reports the rest; nothing present makes no lease (empty lease_id).
 * Lookup and Attach replies carry each profile's model_id (the weights identity).
 *
 * Blocking work runs on the engine's worker pool (lkv_rpc_offload), so polling threads only
 * move bytes: a Get or Attach of a document lkv_store_tier reports cold (the promotion reads the
 * whole document from RocksDB), the block reads of a Get streamed from the cold tier, and in
 * write-through mode the Put commit and the Delete (synced RocksDB writes). Each splits into a
 * work function (the store call, on a pool thread, touching only its job) and a done function
 * (the reply, on the call's thread). The engine runs cleanup only after done, so a job never
 * races the call's cleanup. Hot reads, write-back commits and lookups stay inline. The tier
 * check is a hint: a document demoted between it and the read is promoted inline.
 */
#include "lkv_cache_svc.h"

#include <assert.h>
#include <inttypes.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "lazykv/v1/cache.pb-c.h"
#include "lkv_config.h"
#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_putwire.h"
#include "lkv_wire.h"

#define GET_TARGET_BYTES    (1u << 20) /* Block payload per Get message (>= 1 block). */
#define MAX_LOOKUP_DOCS     65536u
#define SMALL_REQUEST_BYTES (4u << 20)  /* Default request bound of the calls other than Put. */
#define TINY_REQUEST_BYTES  (64u << 10) /* Release: a 16-byte lease id. */

/* ---- Shared helpers ------------------------------------------------------------------- */

/* The salt that keys this call's documents: its principal's (tenant's), else the default. */
static const uint8_t *call_salt(const lkv_cache_svc *svc, const lkv_rpc *rpc)
{
    const void *p = lkv_rpc_principal(rpc);
    const uint8_t *salt = svc->salt_of != NULL && p != NULL ? svc->salt_of(p) : NULL;
    return salt != NULL ? salt : svc->salt;
}

/* The caller's dense tenant index (0 without tenants). */
static int call_index(const lkv_cache_svc *svc, const lkv_rpc *rpc)
{
    const void *p = lkv_rpc_principal(rpc);
    int i = svc->index_of != NULL && p != NULL ? svc->index_of(svc->index_ctx, p) : 0;
    return i >= 0 && i < (svc->n_tenants > 0 ? svc->n_tenants : 1) ? i : 0;
}

/* The caller's wire-key permutation (lkv_wirekey.h). */
static const lkv_wirekey *call_wire(const lkv_cache_svc *svc, const lkv_rpc *rpc)
{
    static const lkv_wirekey identity = {.identity = 1};
    return svc->wire != NULL ? &svc->wire[call_index(svc, rpc)] : &identity;
}

/* Writes the wire form of stored key k for this caller into out. */
static void wire_of(const lkv_cache_svc *svc, const lkv_rpc *rpc, const lkv_dockey *k,
                    lkv_dockey *out)
{
    lkv_wirekey_encode(call_wire(svc, rpc), k, out->b);
}

/* Fails the call with rc and the store's reason for it (lkv_store_why), prefixed by what. */
static int store_refused(lkv_rpc *rpc, int rc, const char *what)
{
    const char *why = lkv_store_why();
    return lkv_rpc_errorf(rpc, rc, "%s: %s", what, why[0] ? why : lkv_strerror(rc));
}

/* Finds the profile or fails the call with the store's reason (it names the known ones). */
static int find_profile(lkv_cache_svc *svc, lkv_rpc *rpc, const char *what, const char *name,
                        const lkv_profile **out)
{
    int rc = lkv_store_profile_get(svc->store, name, out);
    return rc != 0 ? store_refused(rpc, rc, what) : 0;
}

/* Validates tokens of profile p (the one token check, lkv_profile_check_tokens). */
static int check_tokens(lkv_rpc *rpc, const char *what, const lkv_profile *p,
                        const uint32_t *tokens, size_t n)
{
    char why[256];
    int rc = lkv_profile_check_tokens(p, tokens, n, why, (int)sizeof(why));
    return rc != 0 ? lkv_rpc_errorf(rpc, rc, "%s: %s", what, why) : 0;
}

/* Resolves a DocRef to a key. Fails the call on a bad reference. what names it in messages. */
static int resolve_ref(lkv_cache_svc *svc, lkv_rpc *rpc, const char *what,
                       const Lazykv__V1__DocRef *ref, lkv_dockey *key,
                       const lkv_profile **profile_out)
{
    if (ref == NULL) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL,
                              "%s: missing document reference (set key or "
                              "tokens)",
                              what);
    }
    int has_key = ref->key.len > 0;
    int has_tokens = ref->tokens != NULL;
    if (has_key == has_tokens) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "%s: set exactly one of key and tokens (got %s)",
                              what, has_key ? "both" : "neither");
    }
    if (profile_out != NULL) {
        *profile_out = NULL;
    }
    if (has_key) {
        if (ref->key.len != LKV_DOCKEY_BYTES) {
            return lkv_rpc_errorf(rpc, LKV_EINVAL, "%s: key is %zu bytes, expected %d", what,
                                  ref->key.len, LKV_DOCKEY_BYTES);
        }
        /* The caller's wire key: decoded with its own permutation, so another tenant's key
         * (wire or store form) decodes to a key that is not stored. */
        lkv_wirekey_decode(call_wire(svc, rpc), ref->key.data, key);
        return 0;
    }
    const lkv_profile *p = NULL;
    int rc = find_profile(svc, rpc, what, ref->tokens->profile, &p);
    if (rc == 0) {
        rc = check_tokens(rpc, what, p, ref->tokens->token_ids, ref->tokens->n_token_ids);
    }
    if (rc != 0) {
        return rc;
    }
    lkv_dockey_compute(call_salt(svc, rpc), p->fingerprint, ref->tokens->token_ids,
                       (uint32_t)ref->tokens->n_token_ids, key);
    if (profile_out != NULL) {
        *profile_out = p;
    }
    return 0;
}

/* The weights identity of profile p for replies ("" when p is NULL or declares none). */
static char *model_id_pb(const lkv_profile *p)
{
    return p != NULL ? (char *)p->model_id : (char *)protobuf_c_empty_string;
}

static Lazykv__V1__Tier tier_pb(int tier)
{
    switch (tier) {
    case LKV_TIER_HOT:
        return LAZYKV__V1__TIER__TIER_HOT;
    case LKV_TIER_COLD:
        return LAZYKV__V1__TIER__TIER_COLD;
    default:
        return LAZYKV__V1__TIER__TIER_ABSENT;
    }
}

static Lazykv__V1__MissCause miss_pb(int cause)
{
    switch (cause) {
    case LKV_MISS_NONE:
        return LAZYKV__V1__MISS_CAUSE__MISS_CAUSE_NONE;
    case LKV_MISS_EVICTED:
        return LAZYKV__V1__MISS_CAUSE__MISS_CAUSE_EVICTED;
    case LKV_MISS_DELETED:
        return LAZYKV__V1__MISS_CAUSE__MISS_CAUSE_DELETED;
    case LKV_MISS_PROFILE:
        return LAZYKV__V1__MISS_CAUSE__MISS_CAUSE_PROFILE;
    case LKV_MISS_CORRUPT:
        return LAZYKV__V1__MISS_CAUSE__MISS_CAUSE_CORRUPT;
    case LKV_MISS_LOST:
        return LAZYKV__V1__MISS_CAUSE__MISS_CAUSE_LOST;
    case LKV_MISS_EXPIRED:
        return LAZYKV__V1__MISS_CAUSE__MISS_CAUSE_EXPIRED;
    default:
        return LAZYKV__V1__MISS_CAUSE__MISS_CAUSE_UNKNOWN;
    }
}

/* The hex of stored key k as this caller knows it (its wire form), for messages. */
#define key_hex(k, out) key_hex_wire(svc, rpc, (k), (out))
static const char *key_hex_wire(const lkv_cache_svc *svc, const lkv_rpc *rpc, const lkv_dockey *k,
                                char out[LKV_DOCKEY_HEX_LEN + 1])
{
    lkv_dockey w;
    wire_of(svc, rpc, k, &w);
    lkv_dockey_to_hex(&w, out);
    return out;
}

/* ---- Put ------------------------------------------------------------------------------ */

typedef struct put_state {
    lkv_store_put *tx;       /* Open transaction, NULL once committed. */
    const lkv_profile *prof; /* Borrowed from the store. */
    lkv_dockey key;          /* Document key. */
    int exists;              /* The document was stored already. */
    uint32_t n_tokens;       /* Tokens of the document. */
    uint32_t n_blocks;       /* Blocks expected. */
    lkv_store_put *commit;   /* Write-through: the transaction the pool commits. */
    int commit_rc;           /* Its result. */
    char commit_why[256];    /* lkv_store_why() of a failed pool commit (per thread). */
    lkv_put_result res;      /* What the commit found and left. */
} put_state;

/* What the store keeps for a Put parked on the write-back backlog (lkv_store_put_wait). */
typedef struct put_waiter {
    lkv_rpc_ticket t; /* The parked call. */
    put_state *st;    /* Its state (touched only by the continuation, on the call's thread). */
} put_waiter;

/* The header's residency options for the store: the caller's tenant index is the class. */
static lkv_put_opts put_opts(const lkv_cache_svc *svc, lkv_rpc *rpc, const Lazykv__V1__PutHeader *h)
{
    lkv_put_opts o = {.tenant = (uint32_t)call_index(svc, rpc),
                      .prio = h->priority,
                      .ttl_ms = h->ttl_ms,
                      .hold = h->hold ? 1 : 0};
    return o;
}

/* Opens the put: the store checks the profile, the tokens, the options and the room, and says
 * why it refuses (lkv_store_why); only the header's own n_blocks field is checked here. */
static int put_header(lkv_cache_svc *svc, lkv_rpc *rpc, const Lazykv__V1__PutHeader *h)
{
    int rc = lkv_rpc_check_deadline(rpc);
    if (rc != 0) {
        return rc;
    }
    if (svc->check_put != NULL) {
        rc =
            svc->check_put(svc->quota_ctx, rpc, h->profile, h->token_ids, (uint32_t)h->n_token_ids);
        if (rc != 0) {
            return rc;
        }
    }
    put_state *st = lkv_xcalloc(1, sizeof(*st));
    lkv_rpc_set_state(rpc, st);
    lkv_put_opts o = put_opts(svc, rpc, h);
    rc = lkv_store_put_begin_ex(svc->store, call_salt(svc, rpc), h->profile, h->token_ids,
                                (uint32_t)h->n_token_ids, &o, &st->tx, &st->key, &st->exists);
    if (rc != 0) {
        st->tx = NULL;
        return store_refused(rpc, rc, "Put header");
    }
    st->prof = lkv_store_profile_find(svc->store, h->profile);
    st->n_tokens = (uint32_t)h->n_token_ids;
    st->n_blocks = lkv_store_put_n_blocks(st->tx);
    assert(st->prof != NULL);
    if (h->n_blocks != 0 && h->n_blocks != st->n_blocks) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL,
                              "Put header: n_blocks = %" PRIu32 " but %" PRIu32
                              " tokens in blocks of %d make %" PRIu32,
                              h->n_blocks, st->n_tokens, st->prof->shape.block_tokens,
                              st->n_blocks);
    }
    return 0;
}

/* The cluster's say on where a call is served (lkv_cache_svc.route): 0 = here. */
static int routed(const lkv_cache_svc *svc, lkv_rpc *rpc, const ProtobufCMessage *req)
{
    return svc->route != NULL ? svc->route(svc->route_ctx, rpc, req) : 0;
}

/* The header part of a Put stream message (both decoders): the first message must carry it,
 * later ones must not. m is the request (or a PutRequest holding only the header) for the
 * cluster's routing. */
static int put_message_header(lkv_cache_svc *svc, lkv_rpc *rpc, const ProtobufCMessage *m,
                              const Lazykv__V1__PutHeader *hdr, put_state **out)
{
    put_state *st = lkv_rpc_state(rpc);
    int rc;
    if (st == NULL) {
        if (hdr == NULL) {
            return lkv_rpc_errorf(rpc, LKV_EINVAL,
                                  "the first Put message must carry the header "
                                  "(profile, token_ids)");
        }
        rc = routed(svc, rpc, m);
        if (rc != 0) {
            return rc;
        }
        rc = put_header(svc, rpc, hdr);
        if (rc != 0) {
            return rc;
        }
        st = lkv_rpc_state(rpc);
    } else if (hdr != NULL) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL,
                              "Put header sent twice (only the first message "
                              "carries it)");
    }
    *out = st;
    return 0;
}

/* Put messages decoded by protobuf-c (kept for the engine's generic path; lazykvd registers
 * put_on_raw). */
static int put_on_message(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_cache_svc *svc = arg;
    const Lazykv__V1__PutRequest *req = (const Lazykv__V1__PutRequest *)m;
    put_state *st;
    int rc = put_message_header(svc, rpc, m, req->header, &st);
    if (rc != 0) {
        return rc;
    }
    if (svc->charge_bytes != NULL) {
        uint64_t bytes = 0;
        for (size_t i = 0; i < req->n_blocks; i++) {
            bytes += req->blocks[i]->data.len;
        }
        rc = svc->charge_bytes(svc->quota_ctx, rpc, bytes);
        if (rc != 0) {
            return rc;
        }
    }
    for (size_t i = 0; i < req->n_blocks; i++) {
        const Lazykv__V1__Block *b = req->blocks[i];
        /* The store checks the index, the order, the size and the zero tail. */
        rc = lkv_store_put_block(st->tx, b->index, b->data.data, b->data.len);
        if (rc != 0) {
            return store_refused(rpc, rc, "Put");
        }
    }
    return 0;
}

/* Put messages as received (lkv_method.on_raw): lkv_putwire finds each block's payload in the
 * received slices and the store copies it once, into the arena. The whole message is checked
 * (lkv_putwire_decode) before any block is staged, as protobuf-c's decode was. */
static int put_on_raw(void *arg, lkv_rpc *rpc, const struct iovec *iov, size_t n)
{
    lkv_cache_svc *svc = arg;
    lkv_putwire w;
    char err[256];
    int rc = lkv_putwire_decode(iov, n, &w, err, sizeof err);
    if (rc != 0) {
        return lkv_rpc_errorf(rpc, rc, "%s", err);
    }
    Lazykv__V1__PutRequest route = LAZYKV__V1__PUT_REQUEST__INIT;
    route.header = w.header;
    put_state *st;
    rc = put_message_header(svc, rpc, &route.base, w.header, &st);
    if (rc != 0) {
        goto out;
    }
    if (svc->charge_bytes != NULL) {
        uint64_t bytes = 0;
        for (size_t i = 0; i < w.n_blocks; i++) {
            bytes += w.blocks[i].len;
        }
        rc = svc->charge_bytes(svc->quota_ctx, rpc, bytes);
        if (rc != 0) {
            goto out;
        }
    }
    struct iovec stack[64], *parts = stack;
    size_t cap = sizeof stack / sizeof stack[0];
    for (size_t i = 0; i < w.n_blocks && rc == 0; i++) {
        const lkv_putwire_block *b = &w.blocks[i];
        size_t np = lkv_putwire_iov(iov, n, b->off, b->len, parts, cap);
        if (np > cap) {
            if (parts != stack) {
                free(parts);
            }
            cap = np;
            parts = lkv_xmalloc(cap * sizeof *parts);
            lkv_putwire_iov(iov, n, b->off, b->len, parts, cap);
        }
        /* The store checks the index, the order, the size and the zero tail. */
        rc = lkv_store_put_blockv(st->tx, b->index, parts, np);
        if (rc != 0) {
            rc = store_refused(rpc, rc, "Put");
        }
    }
    if (parts != stack) {
        free(parts);
    }
out:
    lkv_putwire_free(&w);
    return rc;
}

static void put_commit_work(void *arg, void *job);
static int put_commit_done(void *arg, lkv_rpc *rpc, void *job);
static void put_room(const void *blob);
static int put_resumed(void *arg, lkv_rpc *rpc, void *p);
static int put_reply(lkv_cache_svc *svc, lkv_rpc *rpc, put_state *st, int rc);

static int put_on_end(void *arg, lkv_rpc *rpc)
{
    lkv_cache_svc *svc = arg;
    put_state *st = lkv_rpc_state(rpc);
    if (st == NULL) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "empty Put stream: no header was sent");
    }
    int rc = lkv_rpc_check_deadline(rpc);
    if (rc != 0) {
        return rc;
    }
    lkv_store_put *tx = st->tx;
    if (svc->durability == LKV_DURABILITY_WRITE_THROUGH || lkv_store_put_cold_only(tx)) {
        st->tx = NULL;   /* put_finish frees it, also on error; it checks every block came. */
        st->commit = tx; /* A RocksDB write (synced, or of a cold-only put): on the pool. */
        return lkv_rpc_offload(rpc, put_commit_work, put_commit_done, st);
    }
    /* Write-back: wait for room in the unpersisted backlog first (parked, not holding this
     * polling thread; the deadline or a cancel ends the wait and cleanup aborts tx). */
    if (lkv_store_put_wait(tx, NULL, NULL, 0) == LKV_EAGAIN) {
        put_waiter w;
        lkv_rpc_defer(rpc, &w.t);
        w.st = st;
        if (lkv_store_put_wait(tx, put_room, &w, sizeof w) == LKV_EAGAIN) {
            return LKV_EAGAIN; /* The writer resumes it (put_room). */
        }
        /* Room came meanwhile: resume at once (the continuation runs after this returns). */
        if (lkv_rpc_resume(w.t, put_resumed, st) != 0) {
            return LKV_ECANCELLED;
        }
        return LKV_EAGAIN;
    }
    st->tx = NULL;
    return put_reply(svc, rpc, st, lkv_store_put_finish(tx, &st->res));
}

/* On the writer thread: the backlog has room; the parked Put continues on its own thread (or,
 * if it ended meanwhile, nothing happens: its ticket is stale). */
static void put_room(const void *blob)
{
    put_waiter w;
    memcpy(&w, blob, sizeof w);
    (void)lkv_rpc_resume(w.t, put_resumed, w.st);
}

static int put_resumed(void *arg, lkv_rpc *rpc, void *p)
{
    (void)p;
    return put_on_end(arg, rpc); /* Checks the deadline and the room again. */
}

static void put_commit_work(void *arg, void *job)
{
    (void)arg;
    put_state *st = job;
    st->commit_rc = lkv_store_put_finish(st->commit, &st->res);
    st->commit = NULL;
    /* The store's reason is per thread: copy it here, on the pool thread that failed. */
    snprintf(st->commit_why, sizeof(st->commit_why), "%s", st->commit_rc ? lkv_store_why() : "");
}

static int put_commit_done(void *arg, lkv_rpc *rpc, void *job)
{
    put_state *st = job;
    if (st->commit_rc != 0) {
        const char *why = st->commit_why;
        return lkv_rpc_errorf(rpc, st->commit_rc, "Put: %s",
                              why[0] ? why : lkv_strerror(st->commit_rc));
    }
    return put_reply(arg, rpc, st, 0);
}

/* Replies to a Put whose commit returned rc. */
static int put_reply(lkv_cache_svc *svc, lkv_rpc *rpc, put_state *st, int rc)
{
    if (rc != 0) {
        return store_refused(rpc, rc, "Put");
    }
    Lazykv__V1__PutResponse resp = LAZYKV__V1__PUT_RESPONSE__INIT;
    lkv_dockey wire;
    wire_of(svc, rpc, &st->key, &wire);
    resp.key.data = wire.b;
    resp.key.len = LKV_DOCKEY_BYTES;
    resp.n_tokens = st->n_tokens;
    resp.n_blocks = st->n_blocks;
    /* The truth at this moment: DURABLE only if the document is on disk now. */
    resp.durability = st->res.persisted ? LAZYKV__V1__DURABILITY__DURABILITY_DURABLE
                                        : LAZYKV__V1__DURABILITY__DURABILITY_HOT;
    resp.already_present = st->res.existed != 0;
    resp.tier = tier_pb(st->res.tier);
    char hex[LKV_DOCKEY_HEX_LEN + 1];
    LKV_LOGD("put %s: %" PRIu32 " tokens, %" PRIu32 " blocks of '%s'%s", key_hex(&st->key, hex),
             st->n_tokens, st->n_blocks, st->prof->name,
             st->res.existed ? " (already present)" : "");
    return lkv_rpc_reply(rpc, &resp.base);
}

static void put_cleanup(void *arg, lkv_rpc *rpc)
{
    (void)arg;
    put_state *st = lkv_rpc_state(rpc);
    if (st == NULL) {
        return;
    }
    if (st->tx != NULL) {
        lkv_store_put_abort(st->tx); /* Nothing becomes visible. */
    }
    free(st);
    lkv_rpc_set_state(rpc, NULL);
}

/* ---- Lookup --------------------------------------------------------------------------- */

/* Counts one looked-up document in its tenant's counters, as the store counts it overall:
 * documents by tier, blocks of hits, blocks of misses for token references only. */
static void count_lookup(lkv_tenant_lookups *tl, const lkv_doc_info *in,
                         const Lazykv__V1__TokenDoc *t, lkv_store *st)
{
    if (in->present) {
        int hot = in->tier == LKV_TIER_HOT;
        atomic_fetch_add(hot ? &tl->hits_hot : &tl->hits_cold, 1);
        atomic_fetch_add(hot ? &tl->hit_blocks_hot : &tl->hit_blocks_cold, in->n_blocks);
        return;
    }
    atomic_fetch_add(&tl->misses, 1);
    int c =
        in->miss_cause > 0 && in->miss_cause < LKV_MISS__COUNT ? in->miss_cause : LKV_MISS_NEVER;
    atomic_fetch_add(&tl->misses_by_cause[c], 1);
    if (t != NULL) {
        const lkv_profile *p = lkv_store_profile_find(st, t->profile);
        if (p != NULL) {
            atomic_fetch_add(&tl->miss_blocks,
                             lkv_blocks_for_tokens(&p->shape, (uint64_t)t->n_token_ids));
        }
    }
}

static int lookup(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_cache_svc *svc = arg;
    const Lazykv__V1__LookupRequest *req = (const Lazykv__V1__LookupRequest *)m;
    int rrc = routed(svc, rpc, m);
    if (rrc != 0) {
        return rrc;
    }
    size_t n = req->n_docs;
    if (n == 0) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "Lookup: docs is empty");
    }
    if (n > svc->max_lookup_docs) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL,
                              "Lookup: %zu documents, at most %" PRIu32 " per call", n,
                              svc->max_lookup_docs);
    }
    lkv_dockey *keys = lkv_xmalloc(n * sizeof(*keys));
    lkv_dockey *bykey = lkv_xmalloc(n * sizeof(*bykey));
    uint32_t *bykey_idx = lkv_xmalloc(n * sizeof(*bykey_idx));
    lkv_doc_info *infos = lkv_xcalloc(n, sizeof(*infos));
    lkv_doc_info *kinfos = lkv_xcalloc(n, sizeof(*kinfos));
    Lazykv__V1__DocStatus *ds = lkv_xcalloc(n, sizeof(*ds));
    Lazykv__V1__DocStatus **dsp = lkv_xmalloc(n * sizeof(*dsp));
    uint32_t nk = 0;
    int rc = 0;
    /* 1. Validate everything (nothing is counted if any reference is bad). */
    for (size_t i = 0; i < n && rc == 0; i++) {
        char what[48];
        snprintf(what, sizeof(what), "docs[%zu]", i);
        rc = resolve_ref(svc, rpc, what, req->docs[i], &keys[i], NULL);
    }
    if (rc == 0) {
        rc = lkv_rpc_check_deadline(rpc);
    }
    if (rc != 0) {
        goto out;
    }
    /* 2. Key references in one store call; token references one by one (they count blocks
     * and detect profile mismatches). */
    for (size_t i = 0; i < n; i++) {
        if (req->docs[i]->tokens == NULL) {
            bykey[nk] = keys[i];
            bykey_idx[nk++] = (uint32_t)i;
        }
    }
    if (nk > 0) {
        rc = lkv_store_lookup(svc->store, bykey, nk, kinfos);
        if (rc != 0) {
            rc = lkv_rpc_errorf(rpc, rc, "Lookup failed in the store: %s", lkv_strerror(rc));
            goto out;
        }
        for (uint32_t j = 0; j < nk; j++) {
            infos[bykey_idx[j]] = kinfos[j];
        }
    }
    for (size_t i = 0; i < n; i++) {
        const Lazykv__V1__TokenDoc *t = req->docs[i]->tokens;
        if (t == NULL) {
            continue;
        }
        rc = lkv_store_lookup_tokens(svc->store, call_salt(svc, rpc), t->profile, t->token_ids,
                                     (uint32_t)t->n_token_ids, &keys[i], &infos[i]);
        if (rc != 0) {
            rc = lkv_rpc_errorf(rpc, rc, "Lookup of docs[%zu] failed: %s", i, lkv_strerror(rc));
            goto out;
        }
    }
    lkv_tenant_lookups *tl = svc->lookups != NULL ? &svc->lookups[call_index(svc, rpc)] : NULL;
    for (size_t i = 0; i < n; i++) {
        if (tl != NULL) {
            count_lookup(tl, &infos[i], req->docs[i]->tokens, svc->store);
        }
        wire_of(svc, rpc, &keys[i], &keys[i]); /* From here on keys are wire keys. */
        Lazykv__V1__DocStatus init = LAZYKV__V1__DOC_STATUS__INIT;
        ds[i] = init;
        ds[i].present = infos[i].present != 0;
        ds[i].tier = tier_pb(infos[i].present ? infos[i].tier : LKV_TIER_NONE);
        ds[i].n_tokens = infos[i].n_tokens;
        ds[i].n_blocks = infos[i].n_blocks;
        ds[i].key.data = keys[i].b;
        ds[i].key.len = LKV_DOCKEY_BYTES;
        ds[i].miss_cause = infos[i].present ? LAZYKV__V1__MISS_CAUSE__MISS_CAUSE_NONE
                                            : miss_pb(infos[i].miss_cause);
        ds[i].profile = infos[i].profile != NULL ? (char *)infos[i].profile->name
                                                 : (char *)protobuf_c_empty_string;
        ds[i].model_id =
            model_id_pb(infos[i].profile != NULL ? infos[i].profile
                        : req->docs[i]->tokens != NULL
                            ? lkv_store_profile_find(svc->store, req->docs[i]->tokens->profile)
                            : NULL);
        dsp[i] = &ds[i];
    }
    Lazykv__V1__LookupResponse resp = LAZYKV__V1__LOOKUP_RESPONSE__INIT;
    resp.n_docs = n;
    resp.docs = dsp;
    rc = lkv_rpc_reply(rpc, &resp.base);
out:
    free(keys);
    free(bykey);
    free(bykey_idx);
    free(infos);
    free(kinfos);
    free(ds);
    free(dsp);
    return rc;
}

/* ---- Get ------------------------------------------------------------------------------ */

/* A hot read shared by the call and the messages gRPC still holds (zero-copy Get): the read
 * handle (it pins the pages) ends when the last of them lets go. */
typedef struct get_hold {
    atomic_int refs;    /* The call, plus one per message whose slices are alive. */
    lkv_store_read *rd; /* Owned. */
} get_hold;

static void get_hold_unref(void *p)
{
    get_hold *h = p;
    if (atomic_fetch_sub(&h->refs, 1) == 1) {
        lkv_store_get_end(h->rd); /* Any thread: gRPC's, after the send. */
        free(h);
    }
}

typedef struct get_state {
    get_hold *hold;     /* Zero copy (hot, host arena): owns rd; NULL otherwise. */
    lkv_store_read *rd; /* Open read handle. */
    lkv_doc_info info;  /* Copy of the document's info. */
    lkv_dockey key;     /* Document key. */
    uint32_t next;      /* Next block to send. */
    uint32_t per_msg;   /* Blocks per message. */
    uint8_t *buf;       /* per_msg * block_bytes staging bytes. */
    int cold;           /* Streamed from a RocksDB snapshot: reads go to the pool. */
    int job_rc;         /* Pool job result (begin or the reads of one message). */
    uint32_t job_k;     /* Blocks the read job covers. */
    uint32_t job_bad;   /* The block it failed at. */
    /* Staged (hot, not host-mapped: a CUDA arena; or stage_always): each message's blocks are
     * copied into a slot of svc->stage and sent from it (get_stage_next). */
    int staged;
    lkv_stage_slot *slot;    /* The slot being filled, owned by the call; NULL otherwise. */
    lkv_stage_waiter waiter; /* Queued while the ring is full. */
    lkv_arena_done copy;     /* Completion of the asynchronous copy into slot. */
    atomic_int copying;      /* 1 while that copy is in flight: cleanup waits for it. */
    lkv_rpc_ticket ticket;   /* The call, parked for a slot or a copy. */
} get_state;

static int get_started(lkv_cache_svc *svc, lkv_rpc *rpc, get_state *st, int rc);
static int get_send(const lkv_cache_svc *svc, lkv_rpc *rpc, get_state *st);
static int get_send_pinned(lkv_rpc *rpc, get_state *st);
static int get_stage_next(lkv_cache_svc *svc, lkv_rpc *rpc, get_state *st);
static int send_framed(lkv_rpc *rpc, get_state *st, const uint8_t *staged, void (*release)(void *),
                       void *arg);

/* Pool jobs of a Get: begin (a cold document is promoted: whole-document RocksDB reads) and the
 * reads of one message of a document streamed from the cold tier. */
static void get_begin_work(void *arg, void *job)
{
    lkv_cache_svc *svc = arg;
    get_state *st = job;
    st->job_rc = lkv_store_get_begin(svc->store, &st->key, &st->rd, &st->info);
}

static int get_begin_done(void *arg, lkv_rpc *rpc, void *job)
{
    return get_started(arg, rpc, job, ((get_state *)job)->job_rc);
}

static void get_read(get_state *st)
{
    uint64_t bb = st->info.block_bytes;
    st->job_rc = 0;
    for (uint32_t i = 0; i < st->job_k && st->job_rc == 0; i++) {
        st->job_bad = st->next + i;
        st->job_rc = lkv_store_get_block(st->rd, st->next + i, st->buf + (size_t)i * bb, bb);
    }
}

static void get_read_work(void *arg, void *job)
{
    (void)arg;
    get_read(job);
}

static int get_read_done(void *arg, lkv_rpc *rpc, void *job)
{
    return get_send(arg, rpc, job);
}

static int get_start(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_cache_svc *svc = arg;
    const Lazykv__V1__GetRequest *req = (const Lazykv__V1__GetRequest *)m;
    lkv_dockey key;
    int rc = routed(svc, rpc, m);
    if (rc != 0) {
        return rc;
    }
    rc = resolve_ref(svc, rpc, "Get doc", req->doc, &key, NULL);
    if (rc != 0) {
        return rc;
    }
    get_state *st = lkv_xcalloc(1, sizeof(*st));
    lkv_rpc_set_state(rpc, st);
    st->key = key;
    if (lkv_store_tier(svc->store, &key) == LKV_TIER_COLD) {
        return lkv_rpc_offload(rpc, get_begin_work, get_begin_done, st); /* Promotion. */
    }
    return get_started(svc, rpc, st, lkv_store_get_begin(svc->store, &key, &st->rd, &st->info));
}

/* The rest of get_start, once lkv_store_get_begin returned rc. */
static int get_started(lkv_cache_svc *svc, lkv_rpc *rpc, get_state *st, int rc)
{
    lkv_dockey key = st->key;
    char hex[LKV_DOCKEY_HEX_LEN + 1];
    if (rc == LKV_ENOTFOUND) {
        st->rd = NULL;
        return lkv_rpc_errorf(rpc, rc, "document %s is not cached", key_hex(&key, hex));
    }
    if (rc == LKV_EPROFILE) {
        st->rd = NULL;
        return lkv_rpc_errorf(rpc, rc, "document %s belongs to a profile that is not configured",
                              key_hex(&key, hex));
    }
    if (rc == LKV_ECORRUPT) {
        st->rd = NULL;
        return lkv_rpc_errorf(rpc, rc,
                              "document %s failed its checksum in the cold tier; it was "
                              "dropped (re-put it)",
                              key_hex(&key, hex));
    }
    if (rc != 0) {
        st->rd = NULL;
        return lkv_rpc_errorf(rpc, rc, "Get of %s failed: %s", key_hex(&key, hex),
                              lkv_strerror(rc));
    }
    uint64_t bb = st->info.block_bytes;
    uint64_t room = lkv_rpc_max_message_bytes(rpc) - 1024; /* framing headroom */
    uint64_t per = svc->get_target_bytes / (bb + 16);
    if (per * (bb + 16) > room) {
        per = room / (bb + 16);
    }
    if (per == 0) {
        if (bb + 16 > room) {
            return lkv_rpc_errorf(rpc, LKV_ETOOBIG,
                                  "a block (%" PRIu64 " bytes) does not fit in "
                                  "max_message_bytes",
                                  bb);
        }
        per = 1;
    }
    if (per > st->info.n_blocks) {
        per = st->info.n_blocks;
    }
    st->per_msg = (uint32_t)(per > 0 ? per : 1);
    st->cold = lkv_store_get_pages(st->rd) == NULL;
    int host_mapped = !st->cold && lkv_store_get_block_ptr(st->rd, 0) != NULL;
    if (!st->cold && svc->stage != NULL && (!host_mapped || svc->stage_always) &&
        bb <= lkv_stage_slot_bytes(svc->stage)) {
        /* Through the staging ring: one slot per message, so no more blocks than fit. */
        uint64_t fit = lkv_stage_slot_bytes(svc->stage) / bb;
        st->staged = 1;
        if (st->per_msg > fit) {
            st->per_msg = (uint32_t)fit;
        }
    } else if (host_mapped) {
        /* Hot in host memory: blocks go on the wire from the pinned arena pages. */
        st->hold = lkv_xmalloc(sizeof(*st->hold));
        atomic_init(&st->hold->refs, 1);
        st->hold->rd = st->rd;
    } else {
        st->buf = lkv_xmalloc((size_t)st->per_msg * bb);
    }

    Lazykv__V1__GetHeader h = LAZYKV__V1__GET_HEADER__INIT;
    lkv_dockey wire;
    wire_of(svc, rpc, &st->key, &wire);
    h.key.data = wire.b;
    h.key.len = LKV_DOCKEY_BYTES;
    h.profile =
        st->info.profile != NULL ? (char *)st->info.profile->name : (char *)protobuf_c_empty_string;
    h.n_tokens = st->info.n_tokens;
    h.n_blocks = st->info.n_blocks;
    h.block_bytes = bb;
    h.block_tokens = st->info.profile != NULL ? (uint32_t)st->info.profile->shape.block_tokens : 0;
    h.tier = tier_pb(st->info.tier);
    Lazykv__V1__GetResponse resp = LAZYKV__V1__GET_RESPONSE__INIT;
    resp.header = &h;
    return lkv_rpc_send(rpc, &resp.base);
}

static int get_next(void *arg, lkv_rpc *rpc)
{
    get_state *st = lkv_rpc_state(rpc);
    if (st->next >= st->info.n_blocks) {
        return 0; /* Done. */
    }
    uint32_t k = st->info.n_blocks - st->next;
    st->job_k = k > st->per_msg ? st->per_msg : k;
    if (st->cold) {
        return lkv_rpc_offload(rpc, get_read_work, get_read_done, st); /* RocksDB reads. */
    }
    if (st->hold != NULL) {
        return get_send_pinned(rpc, st);
    }
    if (st->staged) {
        return get_stage_next(arg, rpc, st);
    }
    get_read(st); /* Copies out of the hot arena (not host-mapped: CUDA). */
    return get_send(arg, rpc, st);
}

/* ---- Get through the staging ring (a CUDA arena) ----------------------------------------
 *
 * Per message: take a slot (or park the call as a ring waiter: the release that frees one
 * hands it over, stage_granted), park the call, queue the copy of the message's blocks from
 * the arena into the slot (cudaMemcpyAsync, lkv_store_get_blocks_async), and when it lands
 * (copy_landed, a CUDA callback thread) resume the call to send the blocks as slices over the
 * slot; gRPC's release of the message returns the slot. A host arena copies at once and the
 * call resumes itself, so the same parked path runs without a GPU (stage_always). A wait that
 * runs out (the ring's get_stage_wait) sends that message by the copying path instead, and so
 * does every message while the ring stays starved (lkv_stage.h), so clients that stop reading
 * while holding slots cannot stall the others beyond one wait. Cleanup
 * of a call that ends while parked: unqueue its waiter (a grant already under way finds the
 * ticket stale and returns the slot itself), wait for a copy in flight (the DMA writes into
 * the slot and reads pages the read handle pins), then return the slot. */

static int stage_fill(lkv_cache_svc *svc, lkv_rpc *rpc, get_state *st);

static int stage_copied(void *arg, lkv_rpc *rpc, void *unused)
{
    (void)unused;
    get_state *st = lkv_rpc_state(rpc);
    lkv_stage_slot *sl = st->slot;
    st->slot = NULL;
    if (st->job_rc != 0) {
        lkv_stage_release(sl);
        return get_send(arg, rpc, st); /* Fails the call as job_rc says. */
    }
    return send_framed(rpc, st, lkv_stage_slot_ptr(sl), lkv_stage_release_cb, sl);
}

static int stage_have_slot(void *arg, lkv_rpc *rpc, void *slot)
{
    get_state *st = lkv_rpc_state(rpc);
    st->slot = slot;
    return stage_fill(arg, rpc, st);
}

static int stage_fallback(void *arg, lkv_rpc *rpc, void *unused)
{
    (void)unused;
    get_state *st = lkv_rpc_state(rpc);
    if (st->buf == NULL) {
        st->buf = lkv_xmalloc((size_t)st->per_msg * st->info.block_bytes);
    }
    get_read(st); /* The copying path, for this message (counted: get_stage timed_out). */
    return get_send(arg, rpc, st);
}

/* A ring waiter served (any thread): ctx/tag are the parked call's ticket. */
static void stage_granted(void *ctx, uint64_t tag, lkv_stage_slot *slot)
{
    lkv_rpc_ticket t = {ctx, tag};
    if (slot == NULL) {
        (void)lkv_rpc_resume(t, stage_fallback, NULL); /* Refused: the call ended. */
        return;
    }
    if (lkv_rpc_resume(t, stage_have_slot, slot) != 0) {
        lkv_stage_release(slot); /* The call ended while it waited. */
    }
}

/* The copy into st->slot landed (a CUDA callback thread: no CUDA calls here). */
static void copy_landed(lkv_arena_done *d, int rc)
{
    get_state *st = (get_state *)((char *)d - offsetof(get_state, copy));
    st->job_rc = rc;
    st->job_bad = st->next;
    lkv_rpc_ticket t = st->ticket;
    /* From here on cleanup may free st (if the call ended): only t is used. */
    atomic_store_explicit(&st->copying, 0, memory_order_release);
    (void)lkv_rpc_resume(t, stage_copied, NULL);
}

static int stage_fill(lkv_cache_svc *svc, lkv_rpc *rpc, get_state *st)
{
    (void)svc;
    lkv_rpc_defer(rpc, &st->ticket);
    st->copy.fn = copy_landed;
    atomic_store_explicit(&st->copying, 1, memory_order_relaxed);
    int rc = lkv_store_get_blocks_async(st->rd, st->next, st->job_k, lkv_stage_slot_ptr(st->slot),
                                        &st->copy);
    if (rc != LKV_EAGAIN) {
        /* Copied at once (a host arena) or failed: resume ourselves (this thread, parked). */
        atomic_store_explicit(&st->copying, 0, memory_order_relaxed);
        st->job_rc = rc;
        st->job_bad = st->next;
        if (lkv_rpc_resume(st->ticket, stage_copied, NULL) != 0) {
            /* Cannot happen (the call is parked by us, on its own thread); cleanup frees. */
            LKV_LOGE("Get: could not resume a call it parked");
        }
    }
    return LKV_EAGAIN;
}

static int get_stage_next(lkv_cache_svc *svc, lkv_rpc *rpc, get_state *st)
{
    lkv_stage_slot *sl = lkv_stage_try_acquire(svc->stage);
    if (sl != NULL) {
        st->slot = sl;
        return stage_fill(svc, rpc, st);
    }
    lkv_rpc_defer(rpc, &st->ticket); /* The ring is full: wait for a release. */
    int rc = lkv_stage_acquire(svc->stage, &st->waiter, stage_granted, st->ticket.srv,
                               st->ticket.id, &sl);
    if (rc == 0 && lkv_rpc_resume(st->ticket, stage_have_slot, sl) != 0) {
        lkv_stage_release(sl); /* Freed meanwhile; unreachable refusal as in stage_fill. */
    } else if (rc == LKV_EBUSY) {
        (void)lkv_rpc_resume(st->ticket, stage_fallback, NULL); /* Starved: copy at once. */
    }
    return LKV_EAGAIN;
}

/* Sends the next job_k blocks straight from the pinned arena pages: the GetResponse framing
 * (field 2 "blocks", each a Block {index = 1, data = 2}) is written here and copied; the
 * payloads are slices over the arena, released (one reference on the read) when gRPC is done. */
static int get_send_pinned(lkv_rpc *rpc, get_state *st)
{
    atomic_fetch_add(&st->hold->refs, 1); /* This message's; released by the engine. */
    return send_framed(rpc, st, NULL, get_hold_unref, st->hold);
}

/* Sends blocks next..next+job_k-1 as one GetResponse whose framing is copied and whose
 * payloads are borrowed: from the arena pages (staged NULL) or from staged + i * block_bytes
 * (a staging slot). release(arg) runs once gRPC has let go of them (or at once on failure). */
static int send_framed(lkv_rpc *rpc, get_state *st, const uint8_t *staged, void (*release)(void *),
                       void *arg)
{
    uint32_t k = st->job_k;
    uint64_t bb = st->info.block_bytes;
    assert(k > 0);
    lkv_rpc_piece stack_p[2 * 16] = {{0}};
    uint8_t stack_h[16 * 32];
    lkv_rpc_piece *pc = k <= 16 ? stack_p : lkv_xmalloc(sizeof(*pc) * 2 * k);
    uint8_t *hdr = k <= 16 ? stack_h : lkv_xmalloc(32u * k);
    for (uint32_t i = 0; i < k; i++) {
        uint32_t idx = st->next + i;
        uint8_t *h = hdr + 32u * i;
        size_t inner = 1 + lkv_wire_varint_len(idx) + 1 + lkv_wire_varint_len(bb) + bb;
        size_t n = 0;
        h[n++] = 0x12; /* GetResponse.blocks, length-delimited. */
        n += lkv_wire_varint_put(h + n, inner);
        h[n++] = 0x08; /* Block.index, varint. */
        n += lkv_wire_varint_put(h + n, idx);
        h[n++] = 0x12; /* Block.data, length-delimited. */
        n += lkv_wire_varint_put(h + n, bb);
        pc[2 * i] = (lkv_rpc_piece){h, n, 0};
        const void *data = staged != NULL ? (const void *)(staged + (size_t)i * bb)
                                          : lkv_store_get_block_ptr(st->rd, idx);
        pc[2 * i + 1] = (lkv_rpc_piece){data, bb, 1};
    }
    int rc = lkv_rpc_send_pieces(rpc, pc, (int)(2 * k), release, arg);
    if (pc != stack_p) {
        free(pc);
        free(hdr);
    }
    if (rc == 0) {
        st->next += k;
    }
    return rc;
}

/* Sends the job_k blocks get_read read (or fails the call as it says). */
static int get_send(const lkv_cache_svc *svc, lkv_rpc *rpc, get_state *st)
{
    uint32_t k = st->job_k;
    uint64_t bb = st->info.block_bytes;
    Lazykv__V1__Block blocks[64];
    Lazykv__V1__Block *bp[64];
    Lazykv__V1__Block *heap = NULL;
    Lazykv__V1__Block **heapp = NULL;
    Lazykv__V1__Block *b = blocks;
    Lazykv__V1__Block **p = bp;
    if (k > 64) {
        heap = lkv_xmalloc(k * sizeof(*heap));
        heapp = lkv_xmalloc(k * sizeof(*heapp));
        b = heap;
        p = heapp;
    }
    int rc = st->job_rc;
    if (rc != 0) {
        uint32_t idx = st->job_bad;
        char hex[LKV_DOCKEY_HEX_LEN + 1];
        if (rc == LKV_ECORRUPT) {
            rc = lkv_rpc_errorf(rpc, rc,
                                "block %" PRIu32 " of document %s failed its "
                                "checksum; the document was dropped (re-put it)",
                                idx, key_hex(&st->key, hex));
        } else {
            rc = lkv_rpc_errorf(rpc, rc, "reading block %" PRIu32 " of %s: %s", idx,
                                key_hex(&st->key, hex), lkv_strerror(rc));
        }
        goto out;
    }
    for (uint32_t i = 0; i < k; i++) {
        Lazykv__V1__Block init = LAZYKV__V1__BLOCK__INIT;
        b[i] = init;
        b[i].index = st->next + i;
        b[i].data.data = st->buf + (size_t)i * bb;
        b[i].data.len = bb;
        p[i] = &b[i];
    }
    Lazykv__V1__GetResponse resp = LAZYKV__V1__GET_RESPONSE__INIT;
    resp.n_blocks = k;
    resp.blocks = p;
    rc = lkv_rpc_send(rpc, &resp.base);
    if (rc == 0) {
        st->next += k;
    }
out:
    free(heap);
    free(heapp);
    return rc;
}

static void get_cleanup(void *arg, lkv_rpc *rpc)
{
    get_state *st = lkv_rpc_state(rpc);
    if (st == NULL) {
        return;
    }
    if (st->staged) {
        lkv_cache_svc *svc = arg;
        (void)lkv_stage_cancel(svc->stage, &st->waiter); /* A grant under way finds it stale. */
        while (atomic_load_explicit(&st->copying, memory_order_acquire)) {
            sched_yield(); /* One message's DMA at most. */
        }
        if (st->slot != NULL) {
            lkv_stage_release(st->slot);
        }
    }
    if (st->hold != NULL) {
        get_hold_unref(st->hold); /* The read ends once gRPC has let go of every block too. */
    } else {
        lkv_store_get_end(st->rd);
    }
    free(st->buf);
    free(st);
    lkv_rpc_set_state(rpc, NULL);
}

/* ---- Delete --------------------------------------------------------------------------- */

typedef struct delete_job {
    lkv_dockey key; /* The document (the request is gone by the time the job runs). */
    int rc;         /* lkv_store_delete's result. */
} delete_job;

static void delete_work(void *arg, void *job);
static int delete_done(void *arg, lkv_rpc *rpc, void *job);
static int delete_reply(lkv_cache_svc *svc, lkv_rpc *rpc, const lkv_dockey *kp, int rc);

static int delete_doc(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_cache_svc *svc = arg;
    const Lazykv__V1__DeleteRequest *req = (const Lazykv__V1__DeleteRequest *)m;
    lkv_dockey key;
    int rc = routed(svc, rpc, m);
    if (rc != 0) {
        return rc;
    }
    rc = resolve_ref(svc, rpc, "Delete doc", req->doc, &key, NULL);
    if (rc == 0) {
        rc = lkv_rpc_check_deadline(rpc);
    }
    if (rc != 0) {
        return rc;
    }
    if (svc->durability == LKV_DURABILITY_WRITE_THROUGH) {
        delete_job *j = lkv_xcalloc(1, sizeof(*j)); /* Freed by delete_done. */
        j->key = key;
        return lkv_rpc_offload(rpc, delete_work, delete_done, j); /* A synced RocksDB delete. */
    }
    return delete_reply(svc, rpc, &key, lkv_store_delete(svc->store, &key));
}

static void delete_work(void *arg, void *job)
{
    lkv_cache_svc *svc = arg;
    delete_job *j = job;
    j->rc = lkv_store_delete(svc->store, &j->key);
}

static int delete_done(void *arg, lkv_rpc *rpc, void *job)
{
    delete_job *j = job;
    int rc = delete_reply(arg, rpc, &j->key, j->rc);
    free(j);
    return rc;
}

/* Replies to a Delete of key whose store call returned rc. */
static int delete_reply(lkv_cache_svc *svc, lkv_rpc *rpc, const lkv_dockey *kp, int rc)
{
    lkv_dockey key = *kp;
    char hex[LKV_DOCKEY_HEX_LEN + 1];
    if (rc == LKV_ENOTFOUND) {
        return lkv_rpc_errorf(rpc, rc, "document %s is not cached", key_hex(&key, hex));
    }
    if (rc == LKV_EBUSY) {
        return lkv_rpc_errorf(rpc, rc, "document %s is pinned by a lease; release it first",
                              key_hex(&key, hex));
    }
    if (rc == LKV_ENOSPC) {
        return lkv_rpc_errorf(rpc, rc,
                              "Delete of %s failed: the disk of the cold tier is full, so the "
                              "delete cannot be made durable; nothing was deleted (free space "
                              "and retry)",
                              key_hex(&key, hex));
    }
    if (rc != 0) {
        return lkv_rpc_errorf(rpc, rc, "Delete of %s failed: %s", key_hex(&key, hex),
                              lkv_strerror(rc));
    }
    Lazykv__V1__DeleteResponse resp = LAZYKV__V1__DELETE_RESPONSE__INIT;
    lkv_dockey wire;
    wire_of(svc, rpc, &key, &wire);
    resp.key.data = wire.b;
    resp.key.len = LKV_DOCKEY_BYTES;
    return lkv_rpc_reply(rpc, &resp.base);
}

/* ---- Attach / Release (zero-copy leases) ---------------------------------------------- */

/* The ArenaInfo of a reply and the regions it points at (filled by arena_pb_init). */
typedef struct arena_pb {
    lkv_store_arena_info ai;
    Lazykv__V1__ArenaInfo info;
    Lazykv__V1__ArenaRegion *regs;  /* One per region (owned). */
    Lazykv__V1__ArenaRegion **regp; /* Pointers to them (owned). */
    int n;                          /* Regions. */
} arena_pb;

/* Describes the arena and every region (the arena contract, cache.proto). */
static void arena_pb_init(lkv_cache_svc *svc, arena_pb *a)
{
    static const uint8_t zero_ipc[sizeof(a->ai.cuda_ipc)];
    lkv_store_arena_info_get(svc->store, &a->ai);
    Lazykv__V1__ArenaInfo init = LAZYKV__V1__ARENA_INFO__INIT;
    a->info = init;
    a->info.backend = a->ai.backend == LKV_HOT_CUDA ? "cuda" : "host";
    a->info.shm_name =
        a->ai.shm_name != NULL ? (char *)a->ai.shm_name : (char *)protobuf_c_empty_string;
    a->info.cuda_device = a->ai.backend == LKV_HOT_CUDA ? a->ai.cuda_device : -1;
    if (a->ai.backend == LKV_HOT_CUDA && memcmp(a->ai.cuda_ipc, zero_ipc, sizeof(zero_ipc)) != 0) {
        /* Empty when the arena could not be exported (cudaIpcGetMemHandle failed). */
        a->info.cuda_ipc_handle.data = a->ai.cuda_ipc;
        a->info.cuda_ipc_handle.len = sizeof(a->ai.cuda_ipc);
    }
    a->info.arena_bytes = a->ai.arena_bytes;
    a->n = a->ai.n_regions;
    a->regs = lkv_xcalloc((size_t)a->n, sizeof(*a->regs));
    a->regp = lkv_xcalloc((size_t)a->n, sizeof(*a->regp));
    for (int r = 0; r < a->n; r++) {
        lkv_store_region rg;
        Lazykv__V1__ArenaRegion rinit = LAZYKV__V1__ARENA_REGION__INIT;
        a->regs[r] = rinit;
        if (lkv_store_region_get(svc->store, r, &rg) == 0) {
            a->regs[r].profile = (char *)rg.profile->name;
            a->regs[r].base_offset = rg.base_offset;
            a->regs[r].page_bytes = rg.page_bytes;
            a->regs[r].n_pages = rg.n_pages;
        }
        a->regs[r].index = (uint32_t)r;
        a->regp[r] = &a->regs[r];
    }
    a->info.n_regions = (size_t)a->n;
    a->info.regions = a->regp;
}

static void arena_pb_free(arena_pb *a)
{
    free(a->regs);
    free(a->regp);
}

/* The region message of a document's region, or NULL. */
static Lazykv__V1__ArenaRegion *arena_pb_region(arena_pb *a, int r)
{
    return r >= 0 && r < a->n ? &a->regs[r] : NULL;
}

static const char *dtype_name(int dtype)
{
    switch (dtype) {
    case LKV_DTYPE_F32:
        return "f32";
    case LKV_DTYPE_F16:
        return "f16";
    case LKV_DTYPE_BF16:
        return "bf16";
    default:
        return "unknown";
    }
}

static int check_lease_id(lkv_rpc *rpc, const char *what, const ProtobufCBinaryData *id,
                          int allow_empty)
{
    if (id->len == 0 && allow_empty) {
        return 0;
    }
    if (id->len != LKV_LEASE_ID_BYTES) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "%s: lease_id is %zu bytes, expected %d%s", what,
                              id->len, LKV_LEASE_ID_BYTES,
                              allow_empty ? " (or empty for a new lease)" : "");
    }
    return 0;
}

/* ATTACH_MODE_PRESENT: the reply entries of a document that was not pinned (status from
 * lkv_lease_attach_present: LKV_ENOTFOUND not cached, LKV_ENOSPC cached but no hot room). p is
 * the profile when the reference named one (tokens), else NULL. wire is the document's wire key
 * (kept alive by the caller until the reply is sent). */
static void attach_fill_skipped(int status, const lkv_profile *p, const lkv_dockey *wire,
                                Lazykv__V1__DocStatus *ds, Lazykv__V1__AttachedDoc *ad)
{
    Lazykv__V1__DocStatus dinit = LAZYKV__V1__DOC_STATUS__INIT;
    *ds = dinit;
    ds->present = status == LKV_ENOSPC;
    ds->tier = status == LKV_ENOSPC ? LAZYKV__V1__TIER__TIER_COLD : LAZYKV__V1__TIER__TIER_ABSENT;
    ds->miss_cause = status == LKV_ENOSPC ? LAZYKV__V1__MISS_CAUSE__MISS_CAUSE_NONE
                                          : LAZYKV__V1__MISS_CAUSE__MISS_CAUSE_UNKNOWN;
    ds->key.data = (uint8_t *)wire->b;
    ds->key.len = LKV_DOCKEY_BYTES;
    ds->profile = p != NULL ? (char *)p->name : (char *)protobuf_c_empty_string;
    ds->model_id = model_id_pb(p);
    Lazykv__V1__AttachedDoc ainit = LAZYKV__V1__ATTACHED_DOC__INIT;
    *ad = ainit;
    ad->key.data = (uint8_t *)wire->b;
    ad->key.len = LKV_DOCKEY_BYTES;
    ad->profile = ds->profile;
    ad->model_id = ds->model_id;
}

/* An Attach between validation and reply (attach_work may run on the pool). */
typedef struct attach_job {
    size_t n;                             /* Documents. */
    int renew;                            /* 1: renew lease_id. */
    uint64_t ttl;                         /* Asked TTL, ms. */
    int owner;                            /* The caller's tenant index. */
    uint8_t lease_id[LKV_LEASE_ID_BYTES]; /* Renew: the lease (copied from the request). */
    lkv_dockey *keys;                     /* n store keys. */
    lkv_lease_doc *docs;                  /* n results (pages malloc'ed by the lease table). */
    uint8_t id[LKV_LEASE_ID_BYTES];       /* The lease. */
    uint64_t expires;                     /* Its expiry, Unix ms. */
    uint32_t lease_docs;                  /* Documents in it. */
    int bad;                              /* The failing document, or -1. */
    int rc;                               /* lkv_lease_attach's result. */
    int partial;                          /* ATTACH_MODE_PRESENT: pin what is present. */
    int *status;                          /* partial: n per-document results. */
    const lkv_profile **rprof;            /* partial: n profiles named by the refs. */
} attach_job;

static void attach_job_free(attach_job *j)
{
    for (size_t i = 0; i < j->n; i++) {
        free(j->docs[i].pages);
    }
    free(j->keys);
    free(j->docs);
    free(j->status);
    free(j->rprof);
    free(j);
}

static void attach_work(void *arg, void *job);
static int attach_done(void *arg, lkv_rpc *rpc, void *job);

static int attach(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_cache_svc *svc = arg;
    const Lazykv__V1__AttachRequest *req = (const Lazykv__V1__AttachRequest *)m;
    if (svc->leases == NULL) {
        return lkv_rpc_errorf(rpc, LKV_ENOTSUP, "leases are not enabled on this daemon");
    }
    int rrc = routed(svc, rpc, m); /* Cluster: local replicas of remote documents. */
    if (rrc != 0) {
        return rrc;
    }
    const lkv_lease_limits *lim = lkv_lease_limits_get(svc->leases);
    int rc = check_lease_id(rpc, "Attach", &req->lease_id, 1);
    if (rc != 0) {
        return rc;
    }
    int renew = req->lease_id.len > 0;
    uint64_t ttl = req->ttl_ms != 0 ? req->ttl_ms : (uint64_t)req->lease_seconds * 1000u;
    if (ttl == 0) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL,
                              "Attach: ttl_ms is 0 (ask for 1..%" PRIu32 " ms; max_lease_ttl)",
                              lim->max_ttl_ms);
    }
    if (ttl > lim->max_ttl_ms) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL,
                              "Attach: ttl %" PRIu64 " ms is above max_lease_ttl = %" PRIu32
                              " ms (renew by attaching again with the lease id)",
                              ttl, lim->max_ttl_ms);
    }
    size_t n = req->n_docs;
    if (n == 0 && !renew) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL,
                              "Attach: docs is empty (a new lease needs at "
                              "least one document)");
    }
    if (n > lim->max_docs) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL,
                              "Attach: %zu documents, a lease holds at most %" PRIu32
                              " (max_lease_docs)",
                              n, lim->max_docs);
    }
    attach_job *j = lkv_xcalloc(1, sizeof(*j)); /* Freed by attach_done. */
    j->n = n;
    j->renew = renew;
    j->ttl = ttl;
    j->owner = call_index(svc, rpc);
    if (renew) {
        memcpy(j->lease_id, req->lease_id.data, LKV_LEASE_ID_BYTES);
    }
    j->keys = lkv_xmalloc((n ? n : 1) * sizeof(*j->keys));
    j->docs = lkv_xcalloc(n ? n : 1, sizeof(*j->docs));
    j->partial = req->mode == LAZYKV__V1__ATTACH_MODE__ATTACH_MODE_PRESENT;
    j->status = lkv_xcalloc(n ? n : 1, sizeof(*j->status));
    j->rprof = lkv_xcalloc(n ? n : 1, sizeof(*j->rprof));
    for (size_t i = 0; i < n && rc == 0; i++) {
        char what[48];
        snprintf(what, sizeof(what), "Attach docs[%zu]", i);
        rc = resolve_ref(svc, rpc, what, req->docs[i], &j->keys[i], &j->rprof[i]);
    }
    if (rc == 0) {
        rc = lkv_rpc_check_deadline(rpc);
    }
    if (rc != 0) {
        j->n = 0; /* Nothing attached: nothing to free per document. */
        attach_job_free(j);
        return rc;
    }
    int cold = 0;
    for (size_t i = 0; i < n && !cold; i++) {
        cold = lkv_store_tier(svc->store, &j->keys[i]) == LKV_TIER_COLD;
    }
    if (cold) {
        return lkv_rpc_offload(rpc, attach_work, attach_done, j); /* Pins promote: RocksDB. */
    }
    attach_work(svc, j);
    return attach_done(svc, rpc, j);
}

static void attach_work(void *arg, void *job)
{
    lkv_cache_svc *svc = arg;
    attach_job *j = job;
    j->bad = -1;
    const uint8_t *renew_id = j->renew ? j->lease_id : NULL;
    j->rc = j->partial ? lkv_lease_attach_present(svc->leases, j->owner, renew_id, (uint32_t)j->ttl,
                                                  j->keys, (uint32_t)j->n, j->id, &j->expires,
                                                  &j->lease_docs, j->docs, j->status, &j->bad)
                       : lkv_lease_attach(svc->leases, j->owner, renew_id, (uint32_t)j->ttl,
                                          j->keys, (uint32_t)j->n, j->id, &j->expires,
                                          &j->lease_docs, j->docs, &j->bad);
}

/* Replies to an Attach once lkv_lease_attach ran (attach_work), and frees the job. */
static int attach_done(void *arg, lkv_rpc *rpc, void *job)
{
    lkv_cache_svc *svc = arg;
    attach_job *j = job;
    const lkv_lease_limits *lim = lkv_lease_limits_get(svc->leases);
    size_t n = j->n;
    int renew = j->renew;
    uint64_t ttl = j->ttl;
    int owner = j->owner;
    lkv_dockey *keys = j->keys;
    lkv_lease_doc *docs = j->docs;
    uint8_t *id = j->id;
    int bad = j->bad;
    int rc = j->rc;
    Lazykv__V1__DocStatus *ds = lkv_xcalloc(n ? n : 1, sizeof(*ds));
    Lazykv__V1__DocStatus **dsp = lkv_xmalloc((n ? n : 1) * sizeof(*dsp));
    Lazykv__V1__AttachedDoc *ad = lkv_xcalloc(n ? n : 1, sizeof(*ad));
    Lazykv__V1__AttachedDoc **adp = lkv_xmalloc((n ? n : 1) * sizeof(*adp));
    Lazykv__V1__BlockLayout *lay = lkv_xcalloc(n ? n : 1, sizeof(*lay));
    lkv_dockey *wires = lkv_xmalloc((n ? n : 1) * sizeof(*wires));
    const int partial = j->partial;
    int *status = j->status;
    const lkv_profile **rprof = j->rprof;
    uint32_t lease_docs = j->lease_docs;
    if (rc != 0) {
        char hex[LKV_DOCKEY_HEX_LEN + 1];
        if (bad >= 0) {
            key_hex(&keys[bad], hex);
        }
        switch (rc) {
        case LKV_ENOTFOUND:
            rc = bad < 0 ? lkv_rpc_errorf(rpc, rc,
                                          "Attach: lease not found (unknown, released or "
                                          "expired: attach without lease_id for a new one)")
                         : lkv_rpc_errorf(rpc, rc,
                                          "Attach: docs[%d] (%s) is not cached; nothing was "
                                          "pinned",
                                          bad, hex);
            break;
        case LKV_ENOSPC:
            rc = bad < 0 ? lkv_rpc_errorf(rpc, rc,
                                          "Attach: %" PRIu32 " leases are live (max_leases); "
                                          "release one or retry later",
                                          lim->max_leases)
                         : lkv_rpc_errorf(rpc, rc,
                                          "Attach: docs[%d] (%s) cannot be made hot: the hot "
                                          "tier is held by pinned or in-flight data; nothing "
                                          "was pinned",
                                          bad, hex);
            break;
        case LKV_EINVAL:
            rc = lkv_rpc_errorf(rpc, rc,
                                "Attach: the lease would hold more than %" PRIu32
                                " documents (max_lease_docs)",
                                lim->max_docs);
            break;
        case LKV_EPROFILE:
            rc = lkv_rpc_errorf(rpc, rc,
                                "Attach: docs[%d] (%s) belongs to a profile that is not "
                                "configured",
                                bad, hex);
            break;
        case LKV_ECORRUPT:
            rc = lkv_rpc_errorf(rpc, rc,
                                "Attach: docs[%d] (%s) failed its checksum in the cold tier and "
                                "was dropped (re-put it); nothing was pinned",
                                bad, hex);
            break;
        default:
            rc = lkv_rpc_errorf(rpc, rc, "Attach failed%s%s: %s", bad >= 0 ? " at " : "",
                                bad >= 0 ? hex : "", lkv_strerror(rc));
        }
        goto out;
    }
    arena_pb apb;
    arena_pb_init(svc, &apb);
    uint32_t n_pinned = 0;
    for (size_t i = 0; i < n; i++) {
        const lkv_doc_info *inf = &docs[i].info;
        const lkv_profile *p = inf->profile;
        wire_of(svc, rpc, &keys[i], &wires[i]);
        if (partial && status[i] != 0) {
            attach_fill_skipped(status[i], rprof[i], &wires[i], &ds[i], &ad[i]);
            dsp[i] = &ds[i];
            adp[i] = &ad[i];
            continue;
        }
        n_pinned++;
        Lazykv__V1__DocStatus dinit = LAZYKV__V1__DOC_STATUS__INIT;
        ds[i] = dinit;
        ds[i].present = 1;
        ds[i].tier = LAZYKV__V1__TIER__TIER_HOT;
        ds[i].n_tokens = inf->n_tokens;
        ds[i].n_blocks = inf->n_blocks;
        ds[i].key.data = wires[i].b;
        ds[i].key.len = LKV_DOCKEY_BYTES;
        ds[i].profile = (char *)p->name;
        ds[i].model_id = model_id_pb(p);
        dsp[i] = &ds[i];
        Lazykv__V1__BlockLayout linit = LAZYKV__V1__BLOCK_LAYOUT__INIT;
        lay[i] = linit;
        lay[i].n_layers = (uint32_t)p->shape.n_layers;
        lay[i].n_kv_heads = (uint32_t)p->shape.n_kv_heads;
        lay[i].head_dim = (uint32_t)p->shape.head_dim;
        lay[i].dtype = (char *)dtype_name(p->shape.dtype);
        lay[i].block_tokens = (uint32_t)p->shape.block_tokens;
        lay[i].block_bytes = inf->block_bytes;
        Lazykv__V1__AttachedDoc ainit = LAZYKV__V1__ATTACHED_DOC__INIT;
        ad[i] = ainit;
        ad[i].key.data = wires[i].b;
        ad[i].key.len = LKV_DOCKEY_BYTES;
        ad[i].profile = (char *)p->name;
        ad[i].layout = &lay[i];
        ad[i].n_tokens = inf->n_tokens;
        ad[i].n_pages = inf->n_blocks;
        ad[i].pages = docs[i].pages;
        ad[i].model_id = model_id_pb(p);
        ad[i].region = arena_pb_region(&apb, inf->region);
        adp[i] = &ad[i];
    }
    Lazykv__V1__AttachResponse resp = LAZYKV__V1__ATTACH_RESPONSE__INIT;
    resp.lease_id.data = id;
    resp.lease_id.len = partial && !renew && lease_docs == 0 ? 0 : LKV_LEASE_ID_BYTES;
    resp.expires_unix_ms = j->expires;
    resp.n_docs = n;
    resp.docs = dsp;
    resp.arena = &apb.info;
    resp.n_attached = n;
    resp.attached = adp;
    resp.ttl_ms = (uint32_t)ttl;
    resp.lease_docs = j->lease_docs;
    rc = lkv_rpc_reply(rpc, &resp.base);
    if (rc != 0 && !renew && resp.lease_id.len > 0) {
        /* The worker never learns the id: end the lease now rather than at expiry. */
        lkv_lease_release(svc->leases, owner, id, NULL);
    }
    LKV_LOGD("attach: %s lease, %zu document(s) (%u pinned%s), %u in the lease, ttl %" PRIu64 " ms",
             renew ? "renewed" : "new", n, n_pinned, partial ? ", mode present" : "", lease_docs,
             ttl);
    arena_pb_free(&apb);
out:
    attach_job_free(j);
    free(ds);
    free(dsp);
    free(ad);
    free(adp);
    free(lay);
    free(wires);
    return rc;
}

static int release(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_cache_svc *svc = arg;
    const Lazykv__V1__ReleaseRequest *req = (const Lazykv__V1__ReleaseRequest *)m;
    if (svc->leases == NULL) {
        return lkv_rpc_errorf(rpc, LKV_ENOTSUP, "leases are not enabled on this daemon");
    }
    int rc = check_lease_id(rpc, "Release", &req->lease_id, 0);
    if (rc != 0) {
        return rc;
    }
    uint32_t released = 0;
    rc = lkv_lease_release(svc->leases, call_index(svc, rpc), req->lease_id.data, &released);
    if (rc == LKV_ENOTFOUND) {
        return lkv_rpc_errorf(rpc, rc, "Release: lease not found (unknown, released or expired)");
    }
    if (rc != 0) {
        return lkv_rpc_errorf(rpc, rc, "Release failed: %s", lkv_strerror(rc));
    }
    Lazykv__V1__ReleaseResponse resp = LAZYKV__V1__RELEASE_RESPONSE__INIT;
    resp.released_docs = released;
    return lkv_rpc_reply(rpc, &resp.base);
}

/* ---- Put in place: Reserve / Commit / Abort -------------------------------------------- */

/* An AttachedDoc (and its layout and wire key, caller's storage) for a reserved or committed
 * document. */
static void doc_pb(lkv_cache_svc *svc, lkv_rpc *rpc, const lkv_dockey *key, const lkv_lease_doc *d,
                   arena_pb *apb, Lazykv__V1__AttachedDoc *ad, Lazykv__V1__BlockLayout *lay,
                   lkv_dockey *wire)
{
    const lkv_profile *p = d->info.profile;
    Lazykv__V1__BlockLayout linit = LAZYKV__V1__BLOCK_LAYOUT__INIT;
    Lazykv__V1__AttachedDoc ainit = LAZYKV__V1__ATTACHED_DOC__INIT;
    wire_of(svc, rpc, key, wire);
    *lay = linit;
    lay->n_layers = (uint32_t)p->shape.n_layers;
    lay->n_kv_heads = (uint32_t)p->shape.n_kv_heads;
    lay->head_dim = (uint32_t)p->shape.head_dim;
    lay->dtype = (char *)dtype_name(p->shape.dtype);
    lay->block_tokens = (uint32_t)p->shape.block_tokens;
    lay->block_bytes = d->info.block_bytes;
    *ad = ainit;
    ad->key.data = wire->b;
    ad->key.len = LKV_DOCKEY_BYTES;
    ad->profile = (char *)p->name;
    ad->layout = lay;
    ad->n_tokens = d->info.n_tokens;
    ad->n_pages = d->info.n_blocks;
    ad->pages = d->pages;
    ad->model_id = model_id_pb(p);
    ad->region = arena_pb_region(apb, d->info.region);
}

/* A Reserve between its checks and its reply (the call's state; freed by reserve_cleanup). */
typedef struct resv_job {
    const lkv_profile *prof;              /* Borrowed from the store. */
    uint32_t *tokens;                     /* n_tokens (owned copy). */
    uint32_t n_tokens;                    /* Tokens. */
    int renew;                            /* 1: lease_id names the lease. */
    uint8_t lease_id[LKV_LEASE_ID_BYTES]; /* The lease to use (set once one exists). */
    uint32_t ttl;                         /* Asked TTL, ms. */
    int wait;                             /* Wait for another worker's reservation. */
    int scratch;                          /* A placeholder, never committed (passes the door). */
    int waited;                           /* 1 once the call was parked for one. */
    int owner;                            /* The caller's tenant index. */
    const uint8_t *salt;                  /* The caller's tenant salt (outlives the call). */
    /* One attempt (reserve_work, inline or on the pool) and its results: */
    struct resv_wake *w;            /* Wake-up offered (wait), or NULL. */
    int rc;                         /* lkv_lease_reserve's result. */
    char why[256];                  /* lkv_store_why() of a refusal (per thread). */
    uint8_t id[LKV_LEASE_ID_BYTES]; /* The lease. */
    uint64_t expires;               /* Its expiry, Unix ms. */
    uint32_t lease_docs;            /* Documents in it. */
    lkv_dockey key;                 /* The document's store key. */
    int present;                    /* 1: attached, not reserved. */
    lkv_lease_doc d;                /* Its pages (malloc'ed) and info. */
} resv_job;

/* A registered wake-up of a waiting Reserve. state: 0 registering, 1 parked (ticket valid), 2
 * woken before the call could park. Whoever loses the race frees it (see reserve_try). */
typedef struct resv_wake resv_wake;
struct resv_wake {
    _Atomic int state;
    lkv_rpc_ticket ticket;
};

static int reserve_try(lkv_cache_svc *svc, lkv_rpc *rpc, resv_job *j);

static int reserve_resume(void *arg, lkv_rpc *rpc, void *unused)
{
    (void)unused;
    resv_job *j = lkv_rpc_state(rpc);
    j->waited = 1;
    return reserve_try(arg, rpc, j);
}

/* The lease table's wake-up (outside its lock, any thread): resume the parked Reserve. */
static void reserve_wake(void *arg)
{
    resv_wake *w = arg;
    int expect = 0;
    if (atomic_compare_exchange_strong(&w->state, &expect, 2)) {
        return; /* Not parked yet: reserve_try sees 2, retries at once and frees w. */
    }
    /* Parked: a call that ended meanwhile (deadline, cancel, shutdown) refuses this. */
    lkv_rpc_resume(w->ticket, reserve_resume, NULL);
    free(w);
}

static void reserve_cleanup(void *arg, lkv_rpc *rpc)
{
    (void)arg;
    resv_job *j = lkv_rpc_state(rpc);
    if (j != NULL) {
        free(j->tokens);
        free(j);
        lkv_rpc_set_state(rpc, NULL);
    }
}

static int reserve(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_cache_svc *svc = arg;
    const Lazykv__V1__ReserveRequest *req = (const Lazykv__V1__ReserveRequest *)m;
    if (svc->leases == NULL) {
        return lkv_rpc_errorf(rpc, LKV_ENOTSUP, "leases are not enabled on this daemon");
    }
    const lkv_lease_limits *lim = lkv_lease_limits_get(svc->leases);
    int rc = check_lease_id(rpc, "Reserve", &req->lease_id, 1);
    if (rc != 0) {
        return rc;
    }
    if (req->ttl_ms == 0 || req->ttl_ms > lim->max_ttl_ms) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL,
                              "Reserve: ttl_ms = %" PRIu32 " (ask for 1..%" PRIu32
                              " ms; max_lease_ttl)",
                              req->ttl_ms, lim->max_ttl_ms);
    }
    const Lazykv__V1__PutHeader *h = req->header;
    if (h == NULL) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "Reserve: header (profile, token_ids) is missing");
    }
    const lkv_profile *p = NULL;
    rc = find_profile(svc, rpc, "Reserve header", h->profile, &p);
    if (rc == 0) {
        rc = check_tokens(rpc, "Reserve header", p, h->token_ids, h->n_token_ids);
    }
    if (rc != 0) {
        return rc;
    }
    uint32_t nb = lkv_blocks_for_tokens(&p->shape, h->n_token_ids);
    if (h->n_blocks != 0 && h->n_blocks != nb) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL,
                              "Reserve header: n_blocks = %" PRIu32 " but %zu tokens in blocks "
                              "of %d make %" PRIu32,
                              h->n_blocks, h->n_token_ids, p->shape.block_tokens, nb);
    }
    resv_job *j = lkv_xcalloc(1, sizeof(*j));
    j->prof = p;
    j->n_tokens = (uint32_t)h->n_token_ids;
    j->tokens = lkv_xmalloc(sizeof(uint32_t) * j->n_tokens);
    memcpy(j->tokens, h->token_ids, sizeof(uint32_t) * j->n_tokens);
    j->renew = req->lease_id.len > 0;
    if (j->renew) {
        memcpy(j->lease_id, req->lease_id.data, LKV_LEASE_ID_BYTES);
    }
    j->ttl = req->ttl_ms;
    j->wait = req->wait;
    j->scratch = req->scratch;
    j->owner = call_index(svc, rpc);
    j->salt = call_salt(svc, rpc);
    lkv_rpc_set_state(rpc, j);
    return reserve_try(svc, rpc, j);
}

/* Fails a Reserve that lkv_lease_reserve refused with rc. */
static int reserve_refused(lkv_cache_svc *svc, lkv_rpc *rpc, const resv_job *j, int rc,
                           const lkv_dockey *key)
{
    char hex[LKV_DOCKEY_HEX_LEN + 1];
    key_hex(key, hex);
    const lkv_lease_limits *lim = lkv_lease_limits_get(svc->leases);
    switch (rc) {
    case LKV_EINPROGRESS:
        return lkv_rpc_errorf(rpc, rc,
                              "Reserve: document %s is being computed by another worker (ask "
                              "with wait to attach it once committed)",
                              hex);
    case LKV_EEXIST:
        return lkv_rpc_errorf(rpc, rc, "Reserve: this lease already reserved document %s", hex);
    case LKV_ENOTFOUND:
        return lkv_rpc_errorf(rpc, rc,
                              "Reserve: lease not found (unknown, released or expired: reserve "
                              "without lease_id for a new one)");
    case LKV_EINVAL:
        return lkv_rpc_errorf(rpc, rc,
                              "Reserve: the lease would hold more than %" PRIu32
                              " documents (max_lease_docs)",
                              lim->max_docs);
    case LKV_EADMIT:
        return lkv_rpc_errorf(rpc, rc,
                              "Reserve: document %s is not admitted to the hot tier "
                              "(hot_admission = door): compute it in your own pages (a Put "
                              "stores it in the cold tier if it has room)",
                              hex);
    case LKV_ENOSPC:
        return lkv_rpc_errorf(rpc, rc,
                              "Reserve: %s%" PRIu32 " leases are live (max_leases), or document "
                              "%s is cached cold and cannot be made hot now; retry later",
                              j->renew ? "" : "", lim->max_leases, hex);
    default:
        return lkv_rpc_errorf(rpc, rc, "Reserve of %s failed: %s", hex, lkv_strerror(rc));
    }
}

/* Replies to a Reserve that succeeded (reserved, or attached because present). */
static int reserve_reply(lkv_cache_svc *svc, lkv_rpc *rpc, resv_job *j, const uint8_t *id,
                         uint64_t expires, uint32_t lease_docs, const lkv_dockey *key, int present,
                         lkv_lease_doc *d)
{
    arena_pb apb;
    Lazykv__V1__AttachedDoc ad;
    Lazykv__V1__BlockLayout lay;
    lkv_dockey wire;
    arena_pb_init(svc, &apb);
    doc_pb(svc, rpc, key, d, &apb, &ad, &lay, &wire);
    Lazykv__V1__ReserveResponse resp = LAZYKV__V1__RESERVE_RESPONSE__INIT;
    resp.lease_id.data = (uint8_t *)id;
    resp.lease_id.len = LKV_LEASE_ID_BYTES;
    resp.expires_unix_ms = expires;
    resp.ttl_ms = j->ttl;
    resp.lease_docs = lease_docs;
    resp.already_present = present != 0;
    resp.arena = &apb.info;
    resp.doc = &ad;
    resp.n_blocks = d->info.n_blocks;
    resp.waited = j->waited != 0;
    int rc = lkv_rpc_reply(rpc, &resp.base);
    if (rc != 0) {
        /* The worker never learns the pages: give them back now rather than at expiry. */
        if (!j->renew) {
            lkv_lease_release(svc->leases, j->owner, id, NULL);
        } else if (!present) {
            lkv_lease_abort(svc->leases, j->owner, id, key);
        }
    }
    char hex[LKV_DOCKEY_HEX_LEN + 1];
    LKV_LOGD("reserve %s: %" PRIu32 " blocks of '%s'%s%s", key_hex(key, hex), d->info.n_blocks,
             j->prof->name, present ? " (present: attached)" : "",
             j->waited ? " after waiting" : "");
    free(d->pages);
    arena_pb_free(&apb);
    return rc;
}

/* One attempt at the reservation (the call's thread, or a pool thread when the document may
 * need a promotion from RocksDB): touches only the job. */
static void reserve_work(void *arg, void *job)
{
    lkv_cache_svc *svc = arg;
    resv_job *j = job;
    const lkv_profile *p;
    lkv_store_profile_get(svc->store, j->prof->name, &p); /* Resets this thread's why. */
    j->rc = lkv_lease_reserve_ex(svc->leases, j->owner, j->renew ? j->lease_id : NULL, j->ttl,
                                 j->salt, j->prof, j->tokens, j->n_tokens, j->scratch,
                                 j->w != NULL ? reserve_wake : NULL, j->w, j->id, &j->expires,
                                 &j->lease_docs, &j->key, &j->present, &j->d);
    snprintf(j->why, sizeof(j->why), "%s", j->rc ? lkv_store_why() : "");
}

/* After an attempt: replies, fails, or parks the call until the reservation it waits for ends
 * (then reserve_resume tries again). */
static int reserve_done(void *arg, lkv_rpc *rpc, void *job)
{
    lkv_cache_svc *svc = arg;
    resv_job *j = job;
    resv_wake *w = j->w;
    j->w = NULL;
    if (j->rc == LKV_EINPROGRESS && w != NULL) {
        /* w is registered: park, unless it already fired (then resume ourselves at once). */
        int ret = lkv_rpc_defer(rpc, &w->ticket);
        int expect = 0;
        if (!atomic_compare_exchange_strong(&w->state, &expect, 1)) {
            lkv_rpc_resume(w->ticket, reserve_resume, NULL);
            free(w);
        }
        return ret;
    }
    free(w); /* Not registered. */
    if (j->rc != 0) {
        if (j->why[0] != '\0' && j->rc != LKV_EINPROGRESS && j->rc != LKV_EEXIST) {
            char hex[LKV_DOCKEY_HEX_LEN + 1];
            return lkv_rpc_errorf(rpc, j->rc, "Reserve of %s: %s", key_hex(&j->key, hex), j->why);
        }
        return reserve_refused(svc, rpc, j, j->rc, &j->key);
    }
    return reserve_reply(svc, rpc, j, j->id, j->expires, j->lease_docs, &j->key, j->present, &j->d);
}

/* Tries the reservation: inline, or on the pool when the document is cold (a Reserve of a
 * cached document attaches it, and pinning a cold one promotes it from RocksDB). */
static int reserve_try(lkv_cache_svc *svc, lkv_rpc *rpc, resv_job *j)
{
    int rc = lkv_rpc_check_deadline(rpc);
    if (rc != 0) {
        return rc;
    }
    j->w = j->wait ? lkv_xcalloc(1, sizeof(*j->w)) : NULL;
    lkv_dockey key;
    lkv_dockey_compute(j->salt, j->prof->fingerprint, j->tokens, j->n_tokens, &key);
    if (lkv_store_tier(svc->store, &key) == LKV_TIER_COLD) {
        return lkv_rpc_offload(rpc, reserve_work, reserve_done, j);
    }
    reserve_work(svc, j);
    return reserve_done(svc, rpc, j);
}

/* A Commit between its checks and its reply (commit_work may run on the pool). */
typedef struct commit_job {
    int owner;                            /* The caller's tenant index. */
    uint8_t lease_id[LKV_LEASE_ID_BYTES]; /* The lease. */
    lkv_dockey key;                       /* Store key. */
    lkv_lease_doc doc;                    /* The result (pages malloc'ed). */
    int kept_other;                       /* A Put's copy was kept. */
    int rc;                               /* lkv_lease_commit's result. */
    char why[256];                        /* lkv_store_why() of a failure (per thread). */
} commit_job;

/* Decodes and checks the (lease_id, key) pair of a Commit or Abort. */
static int check_resv_ref(lkv_cache_svc *svc, lkv_rpc *rpc, const char *what,
                          const ProtobufCBinaryData *id, const ProtobufCBinaryData *key,
                          lkv_dockey *out)
{
    if (svc->leases == NULL) {
        return lkv_rpc_errorf(rpc, LKV_ENOTSUP, "leases are not enabled on this daemon");
    }
    int rc = check_lease_id(rpc, what, id, 0);
    if (rc != 0) {
        return rc;
    }
    if (key->len != LKV_DOCKEY_BYTES) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "%s: key is %zu bytes, expected %d", what, key->len,
                              LKV_DOCKEY_BYTES);
    }
    lkv_wirekey_decode(call_wire(svc, rpc), key->data, out);
    return 0;
}

static void commit_work(void *arg, void *job)
{
    lkv_cache_svc *svc = arg;
    commit_job *c = job;
    c->rc = lkv_lease_commit(svc->leases, c->owner, c->lease_id, &c->key, &c->doc, &c->kept_other);
    snprintf(c->why, sizeof(c->why), "%s", c->rc ? lkv_store_why() : "");
}

static int commit_done(void *arg, lkv_rpc *rpc, void *job)
{
    lkv_cache_svc *svc = arg;
    commit_job *c = job;
    int rc = c->rc;
    char hex[LKV_DOCKEY_HEX_LEN + 1];
    if (rc != 0) {
        key_hex(&c->key, hex);
        if (rc == LKV_ENOTFOUND) {
            rc = lkv_rpc_errorf(rpc, rc,
                                "Commit: no reservation of %s in this lease (never reserved, "
                                "already committed or aborted, or the lease expired)",
                                hex);
        } else if (rc == LKV_EPERM) {
            rc = lkv_rpc_errorf(rpc, rc,
                                "Commit of %s refused: it was reserved as scratch "
                                "(ReserveRequest.scratch), which is never committed; nothing "
                                "changed: Abort or Release it",
                                hex);
        } else {
            rc = lkv_rpc_errorf(rpc, rc, "Commit of %s refused%s: %s", hex,
                                rc == LKV_EINVAL ? " (nothing visible; the reservation is still "
                                                   "open: fix the pages and commit again, or "
                                                   "abort)"
                                                 : " (nothing visible)",
                                c->why[0] ? c->why : lkv_strerror(rc));
        }
        free(c);
        return rc;
    }
    arena_pb apb;
    Lazykv__V1__AttachedDoc ad;
    Lazykv__V1__BlockLayout lay;
    lkv_dockey wire;
    arena_pb_init(svc, &apb);
    doc_pb(svc, rpc, &c->key, &c->doc, &apb, &ad, &lay, &wire);
    Lazykv__V1__CommitResponse resp = LAZYKV__V1__COMMIT_RESPONSE__INIT;
    resp.doc = &ad;
    resp.durability = svc->durability == LKV_DURABILITY_WRITE_THROUGH
                          ? LAZYKV__V1__DURABILITY__DURABILITY_DURABLE
                          : LAZYKV__V1__DURABILITY__DURABILITY_HOT;
    resp.tier = LAZYKV__V1__TIER__TIER_HOT;
    resp.already_present = c->kept_other != 0;
    rc = lkv_rpc_reply(rpc, &resp.base);
    LKV_LOGD("commit %s: %" PRIu32 " blocks%s", key_hex(&c->key, hex), c->doc.info.n_blocks,
             c->kept_other ? " (a Put's copy was kept)" : "");
    arena_pb_free(&apb);
    free(c->doc.pages);
    free(c);
    return rc;
}

static int commit(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_cache_svc *svc = arg;
    const Lazykv__V1__CommitRequest *req = (const Lazykv__V1__CommitRequest *)m;
    lkv_dockey key;
    int rc = check_resv_ref(svc, rpc, "Commit", &req->lease_id, &req->key, &key);
    if (rc != 0) {
        return rc;
    }
    commit_job *c = lkv_xcalloc(1, sizeof(*c)); /* Freed by commit_done. */
    c->owner = call_index(svc, rpc);
    memcpy(c->lease_id, req->lease_id.data, LKV_LEASE_ID_BYTES);
    c->key = key;
    if (svc->durability == LKV_DURABILITY_WRITE_THROUGH) {
        return lkv_rpc_offload(rpc, commit_work, commit_done, c); /* A synced RocksDB write. */
    }
    commit_work(svc, c);
    return commit_done(svc, rpc, c);
}

static int abort_resv(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_cache_svc *svc = arg;
    const Lazykv__V1__AbortRequest *req = (const Lazykv__V1__AbortRequest *)m;
    lkv_dockey key;
    int rc = check_resv_ref(svc, rpc, "Abort", &req->lease_id, &req->key, &key);
    if (rc != 0) {
        return rc;
    }
    rc = lkv_lease_abort(svc->leases, call_index(svc, rpc), req->lease_id.data, &key);
    if (rc == LKV_ENOTFOUND) {
        char hex[LKV_DOCKEY_HEX_LEN + 1];
        return lkv_rpc_errorf(rpc, rc,
                              "Abort: no reservation of %s in this lease (never reserved, "
                              "already committed or aborted, or the lease expired)",
                              key_hex(&key, hex));
    }
    if (rc != 0) {
        return lkv_rpc_errorf(rpc, rc, "Abort failed: %s", lkv_strerror(rc));
    }
    Lazykv__V1__AbortResponse resp = LAZYKV__V1__ABORT_RESPONSE__INIT;
    return lkv_rpc_reply(rpc, &resp.base);
}

/* ---- Registration --------------------------------------------------------------------- */

void lkv_cache_svc_init(lkv_cache_svc *svc, lkv_store *store, int durability)
{
    memset(svc, 0, sizeof(*svc));
    svc->store = store;
    lkv_tenant_salt_default(svc->salt);
    svc->durability = durability;
    svc->get_target_bytes = GET_TARGET_BYTES;
    svc->max_lookup_docs = MAX_LOOKUP_DOCS;
    svc->max_request_bytes = SMALL_REQUEST_BYTES;
    svc->max_docref_bytes = SMALL_REQUEST_BYTES;
}

int lkv_cache_svc_methods(lkv_cache_svc *svc, lkv_method *out)
{
    lkv_method ms[LKV_CACHE_SVC_METHODS] = {
        {.path = "/lazykv.v1.Cache/Put",
         .kind = LKV_RPC_CLIENT_STREAM,
         .req_desc = &lazykv__v1__put_request__descriptor,
         .svc = svc,
         .on_message = put_on_message,
         .on_raw = put_on_raw,
         .on_end = put_on_end,
         .cleanup = put_cleanup},
        {.path = "/lazykv.v1.Cache/Lookup",
         .kind = LKV_RPC_UNARY,
         .req_desc = &lazykv__v1__lookup_request__descriptor,
         .svc = svc,
         .unary = lookup,
         .max_request_bytes = svc->max_request_bytes},
        {.path = "/lazykv.v1.Cache/Get",
         .kind = LKV_RPC_SERVER_STREAM,
         .req_desc = &lazykv__v1__get_request__descriptor,
         .svc = svc,
         .start = get_start,
         .next = get_next,
         .cleanup = get_cleanup,
         .max_request_bytes = svc->max_docref_bytes},
        {.path = "/lazykv.v1.Cache/Delete",
         .kind = LKV_RPC_UNARY,
         .req_desc = &lazykv__v1__delete_request__descriptor,
         .svc = svc,
         .unary = delete_doc,
         .max_request_bytes = svc->max_docref_bytes},
        {.path = "/lazykv.v1.Cache/Attach",
         .kind = LKV_RPC_UNARY,
         .req_desc = &lazykv__v1__attach_request__descriptor,
         .svc = svc,
         .unary = attach,
         .max_request_bytes = svc->max_request_bytes},
        {.path = "/lazykv.v1.Cache/Release",
         .kind = LKV_RPC_UNARY,
         .req_desc = &lazykv__v1__release_request__descriptor,
         .svc = svc,
         .unary = release,
         .max_request_bytes = TINY_REQUEST_BYTES},
        {.path = "/lazykv.v1.Cache/Reserve",
         .kind = LKV_RPC_UNARY,
         .req_desc = &lazykv__v1__reserve_request__descriptor,
         .svc = svc,
         .unary = reserve,
         .cleanup = reserve_cleanup,
         .max_request_bytes = svc->max_docref_bytes},
        {.path = "/lazykv.v1.Cache/Commit",
         .kind = LKV_RPC_UNARY,
         .req_desc = &lazykv__v1__commit_request__descriptor,
         .svc = svc,
         .unary = commit,
         .max_request_bytes = TINY_REQUEST_BYTES},
        {.path = "/lazykv.v1.Cache/Abort",
         .kind = LKV_RPC_UNARY,
         .req_desc = &lazykv__v1__abort_request__descriptor,
         .svc = svc,
         .unary = abort_resv,
         .max_request_bytes = TINY_REQUEST_BYTES},
    };
    memcpy(out, ms, sizeof(ms));
    return LKV_CACHE_SVC_METHODS;
}
