/*
 * lkv_cluster.c: membership + router + the routing of cache calls + the Cluster method (see
 * lkv_cluster.h).
 *
 * Forwarding a Lookup: the refs are grouped by owner (a ref that cannot be routed, a key
 * without route or an unknown profile, goes with this member's group); if every ref is ours the
 * call is served here. Otherwise the call parks (lkv_rpc_defer) and one LookupRequest per group
 * goes out on the peer engine (our own group too, to our own address: it is then an internal
 * call, served locally, so the merge is uniform), each with the time left of the caller's
 * deadline less a margin, so an owner that does not answer (SIGSTOP) still leaves time to say
 * so. The last answer merges the groups in request order and finishes the parked call
 * (lkv_rpc_finish_deferred) from the engine thread. A group whose owner failed with
 * UNAVAILABLE or DEADLINE_EXCEEDED is reported absent, MISS_CAUSE_OWNER_DOWN; another error fails
 * the call with it.
 */
#include "lkv_cluster.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "lazykv/v1/cache.pb-c.h"
#include "lkv_dockey.h"
#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_membership.h"
#include "lkv_peer.h"
#include "lkv_route.h"
#include "lkv_router.h"
#include "lkv_transfer.h"

#define TOKEN_MAX  512
#define MAX_GROUPS 16
#define MARGIN_MS  30
/* A Get that misses here fetches from the member that owned the document before this one
 * joined, during this long after the live set changed. */
#define TRANSFER_WINDOW_MS 120000

typedef struct prof_fp {
    char name[64];
    uint8_t fp[LKV_ROUTE_FP_BYTES];
} prof_fp;

struct lkv_cluster {
    int mode; /* enum lkv_cluster_mode. */
    const lkv_config *cfg;
    lkv_store *store;
    _Atomic(const lkv_auth *)
        auth; /* The tenant table (replaced on reload, lkv_cluster_set_auth). */
    char version[32];
    char self_addr[LKV_MEMBER_ADDR_MAX];
    char token[TOKEN_MAX]; /* The cluster token ("" in mode none). */
    char bearer[TOKEN_MAX + 8];
    uint8_t token_hash[32]; /* BLAKE2b of "Bearer <token>": compared in constant time. */
    int n_prof;
    prof_fp prof[LKV_CONFIG_MAX_PROFILES];
    lkv_peer_engine *eng;
    lkv_membership *mem;
    lkv_router *router;
    pthread_mutex_t mu;         /* Guards mem (leave). */
    const lkv_method *get_m;    /* The cache service's Get (transfers), or NULL. */
    const lkv_method *attach_m; /* The cache service's Attach (replicas), or NULL. */
    /* Local replicas (lkv_cluster_set_attach): keys and expiry, under rmu; the sweeper drops
     * them at their TTL. */
    pthread_mutex_t rmu;
    pthread_cond_t rcv;
    struct replica *reps;
    size_t n_reps, cap_reps;
    int sweep_stop, sweeping;
    pthread_t sweeper;
    _Atomic uint64_t reps_made, reps_dropped;
    lkv_transport xport; /* How moved documents are fetched (gRPC streaming). */
    _Atomic uint64_t xfer_ok, xfer_failed;
};

static int mode_of(const char *s)
{
    if (strcmp(s, "etcd") == 0) {
        return LKV_CLUSTER_ETCD;
    }
    if (strcmp(s, "static") == 0) {
        return LKV_CLUSTER_STATIC;
    }
    if (strcmp(s, "dns") == 0) {
        return LKV_CLUSTER_DNS;
    }
    return LKV_CLUSTER_NONE;
}

static const char *mode_name(int mode)
{
    static const char *const n[] = {"none", "etcd", "static", "dns"};
    return mode >= 0 && mode <= 3 ? n[mode] : "none";
}

static int read_token(const char *path, char *out, size_t len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "option 'cluster_token_file': cannot read %s", path);
        return LKV_ECONFIG;
    }
    size_t n = fread(out, 1, len - 1, f);
    fclose(f);
    out[n] = '\0';
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' ')) {
        out[--n] = '\0';
    }
    if (n < 16 || strpbrk(out, "\r\n ") != NULL) {
        snprintf(err, errlen,
                 "option 'cluster_token_file': %s must hold one token of at least 16 characters "
                 "(e.g. python3 -m lazykv.tenant new cluster)",
                 path);
        return LKV_ECONFIG;
    }
    return 0;
}

int lkv_cluster_create(const lkv_config *cfg, lkv_store *store, const lkv_auth *auth,
                       const char *version, lkv_cluster **out, char *err, size_t errlen)
{
    *out = NULL;
    lkv_cluster *c = lkv_xcalloc(1, sizeof(*c));
    c->cfg = cfg;
    c->store = store;
    atomic_store(&c->auth, auth);
    c->mode = mode_of(cfg->cluster_mode);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->rmu, NULL);
    pthread_cond_init(&c->rcv, NULL);
    snprintf(c->version, sizeof(c->version), "%s", version);
    for (int i = 0; i < cfg->n_profiles && i < LKV_CONFIG_MAX_PROFILES; i++) {
        snprintf(c->prof[i].name, sizeof(c->prof[i].name), "%s", cfg->profiles[i].name);
        memcpy(c->prof[i].fp, cfg->profiles[i].fingerprint, LKV_ROUTE_FP_BYTES);
        c->n_prof++;
    }
    if (c->mode != LKV_CLUSTER_NONE) {
        if (read_token(cfg->cluster_token_file, c->token, sizeof(c->token), err, errlen) != 0) {
            free(c);
            return LKV_ECONFIG;
        }
        snprintf(c->bearer, sizeof(c->bearer), "Bearer %s", c->token);
        crypto_generichash(c->token_hash, sizeof(c->token_hash), (const uint8_t *)c->bearer,
                           strlen(c->bearer), NULL, 0);
        /* The cluster token must not also be a tenant's token. */
        const lkv_tenant *t = NULL;
        char msg[256];
        int arc = lkv_auth_check(auth, c->bearer, strlen(c->bearer), 0, LKV_ROLE_DATA, &t, msg,
                                 (int)sizeof(msg));
        if ((arc == 0 || arc == LKV_EPERM) && t != NULL) {
            snprintf(err, errlen,
                     "option 'cluster_token_file': the cluster token is tenant \"%s\"'s token",
                     t->name);
            free(c);
            return LKV_ECONFIG;
        }
    }
    *out = c;
    return 0;
}

int lkv_cluster_enabled(const lkv_cluster *c)
{
    return c != NULL && c->mode != LKV_CLUSTER_NONE;
}

typedef struct replica {
    lkv_dockey key;
    int64_t expires_ms; /* CLOCK_MONOTONIC ms. */
} replica;

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Drops replicas whose TTL passed (a pinned one is retried on the next round). */
static void *sweep_main(void *arg)
{
    lkv_cluster *c = arg;
    pthread_mutex_lock(&c->rmu);
    while (!c->sweep_stop) {
        int64_t now = mono_ms();
        for (size_t i = 0; i < c->n_reps;) {
            if (c->reps[i].expires_ms > now) {
                i++;
                continue;
            }
            lkv_dockey k = c->reps[i].key;
            pthread_mutex_unlock(&c->rmu);
            int rc = lkv_store_delete(c->store, &k); /* May block (write-through): own thread. */
            pthread_mutex_lock(&c->rmu);
            if (rc == LKV_EBUSY) { /* Pinned by a lease: once released. */
                i++;
                continue;
            }
            if (rc == 0) {
                atomic_fetch_add(&c->reps_dropped, 1);
            }
            /* The table may have changed while unlocked: find the key again. */
            for (size_t j = 0; j < c->n_reps; j++) {
                if (memcmp(&c->reps[j].key, &k, sizeof(k)) == 0) {
                    c->reps[j] = c->reps[--c->n_reps];
                    break;
                }
            }
            i = 0;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000;
        ts.tv_sec += ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        pthread_cond_timedwait(&c->rcv, &c->rmu, &ts);
    }
    pthread_mutex_unlock(&c->rmu);
    return NULL;
}

static lkv_peer_chan *chan_of(void *ctx, const char *addr)
{
    return lkv_membership_chan(ctx, addr);
}

int lkv_cluster_start(lkv_cluster *c, const char *bound, char *err, size_t errlen)
{
    const lkv_config *cfg = c->cfg;
    const char *adv = cfg->cluster_advertise[0] ? cfg->cluster_advertise : bound;
    snprintf(c->self_addr, sizeof(c->self_addr), "%s", adv);
    if (c->mode == LKV_CLUSTER_NONE) {
        return 0;
    }
    if (strncmp(adv, "0.0.0.0:", 8) == 0 || strncmp(adv, "[::]:", 5) == 0) {
        snprintf(err, errlen,
                 "option 'cluster_advertise': required when listening on %s (the address peers "
                 "and clients reach this member at, e.g. the pod IP)",
                 adv);
        return LKV_ECONFIG;
    }
    if (lkv_peer_engine_create(&c->eng) != 0) {
        snprintf(err, errlen, "cluster: cannot start the peer engine");
        return LKV_ECONFIG;
    }
    lkv_membership_config mc = {.mode = c->mode,
                                .self_id = cfg->cluster_id,
                                .self_addr = c->self_addr,
                                .version = c->version,
                                .hot_bytes = cfg->hot_bytes,
                                .etcd = cfg->cluster_etcd,
                                .prefix = cfg->cluster_prefix,
                                .lease_ttl_s = (int)((cfg->cluster_lease_ttl_ms + 999) / 1000),
                                .members = cfg->cluster_members,
                                .dns = cfg->cluster_dns,
                                .dns_refresh_ms = cfg->cluster_dns_refresh_ms,
                                .health_interval_ms = cfg->cluster_health_interval_ms,
                                .down_after_ms = cfg->cluster_down_after_ms,
                                .engine = c->eng};
    /* The router needs the membership and the membership's on_change the router: start the
     * membership with no hook, then create the router and set the hook. */
    lkv_membership *m = NULL;
    if (lkv_membership_start(&mc, &m, err, errlen) != 0) {
        return LKV_ECONFIG;
    }
    lkv_router_create(m, &c->router);
    lkv_transfer_grpc(&c->xport, chan_of, m);
    if (cfg->cluster_replica_ttl_ms > 0 && pthread_create(&c->sweeper, NULL, sweep_main, c) == 0) {
        c->sweeping = 1;
    }
    lkv_membership_set_hook(m, lkv_router_refresh, c->router);
    lkv_router_refresh(c->router);
    pthread_mutex_lock(&c->mu);
    c->mem = m;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

void lkv_cluster_leave(lkv_cluster *c)
{
    if (c == NULL) {
        return;
    }
    pthread_mutex_lock(&c->mu);
    lkv_membership *m = c->mem;
    c->mem = NULL;
    pthread_mutex_unlock(&c->mu);
    if (c->sweeping) {
        pthread_mutex_lock(&c->rmu);
        c->sweep_stop = 1;
        pthread_cond_broadcast(&c->rcv);
        pthread_mutex_unlock(&c->rmu);
        pthread_join(c->sweeper, NULL);
        c->sweeping = 0;
    }
    if (m != NULL) {
        lkv_membership_set_hook(m, NULL, NULL);
        lkv_membership_stop(m);
        lkv_router_destroy(c->router);
        c->router = NULL;
    }
}

void lkv_cluster_destroy(lkv_cluster *c)
{
    if (c == NULL) {
        return;
    }
    lkv_cluster_leave(c);
    lkv_peer_engine_destroy(c->eng); /* Transfers still running end here (their calls too). */
    lkv_transport_free(&c->xport);
    free(c->reps);
    pthread_mutex_destroy(&c->rmu);
    pthread_cond_destroy(&c->rcv);
    pthread_mutex_destroy(&c->mu);
    sodium_memzero(c->token, sizeof(c->token));
    sodium_memzero(c->bearer, sizeof(c->bearer));
    free(c);
}

/* ---- admission --------------------------------------------------------------------------- */

static int is_cluster_token(const lkv_cluster *c, const char *authz)
{
    if (c->mode == LKV_CLUSTER_NONE || authz == NULL) {
        return 0;
    }
    uint8_t h[32];
    crypto_generichash(h, sizeof(h), (const uint8_t *)authz, strlen(authz), NULL, 0);
    return sodium_memcmp(h, c->token_hash, sizeof(h)) == 0;
}

/* 1 if rpc carries the cluster credential (so lkv_cluster_admit admitted it as internal). */
static int is_internal(const lkv_cluster *c, lkv_rpc *rpc)
{
    char buf[TOKEN_MAX + 16];
    if (c->mode == LKV_CLUSTER_NONE ||
        lkv_rpc_metadata(rpc, "authorization", buf, sizeof(buf)) < 0) {
        return 0;
    }
    return is_cluster_token(c, buf);
}

int lkv_cluster_admit(lkv_cluster *c, lkv_rpc *rpc, const char *authz, const lkv_tenant **out)
{
    if (c == NULL || !is_cluster_token(c, authz)) {
        return 0;
    }
    static const char *const allowed[] = {"/lazykv.v1.Cache/Put",     "/lazykv.v1.Cache/Lookup",
                                          "/lazykv.v1.Cache/Get",     "/lazykv.v1.Cache/Delete",
                                          "/lazykv.v1.Cache/Cluster", NULL};
    const char *path = lkv_rpc_method(rpc);
    int ok = strncmp(path, "/grpc.health.v1.Health/", 23) == 0;
    for (int i = 0; !ok && allowed[i] != NULL; i++) {
        ok = strcmp(path, allowed[i]) == 0;
    }
    if (!ok) {
        return lkv_rpc_errorf(rpc, LKV_EPERM, "the cluster credential does not grant %s", path);
    }
    char name[LKV_TENANT_NAME_MAX];
    const lkv_tenant *t;
    const lkv_auth *auth = atomic_load(&c->auth);
    if (lkv_rpc_metadata(rpc, LKV_CLUSTER_TENANT_MD, name, sizeof(name)) < 0) {
        t = lkv_auth_default_tenant(auth);
    } else if (strcmp(name, LKV_AUTH_DEFAULT_TENANT) == 0) {
        t = lkv_auth_default_tenant(auth);
    } else {
        t = lkv_auth_find(auth, name);
    }
    if (t == NULL) {
        return lkv_rpc_errorf(rpc, LKV_EUNAUTH, "cluster call for unknown tenant \"%.64s\"", name);
    }
    *out = t;
    return 1;
}

/* ---- routing ----------------------------------------------------------------------------- */

static const prof_fp *prof_find(const lkv_cluster *c, const char *name)
{
    for (int i = 0; name != NULL && i < c->n_prof; i++) {
        if (strcmp(c->prof[i].name, name) == 0) {
            return &c->prof[i];
        }
    }
    return NULL;
}

/* The routing hash of a ref: 1 and *route, or 0 if it cannot be routed. */
static int ref_route(const lkv_cluster *c, const Lazykv__V1__DocRef *d, uint64_t *route)
{
    if (d == NULL) {
        return 0;
    }
    if (d->tokens != NULL) {
        const prof_fp *p = prof_find(c, d->tokens->profile);
        if (p == NULL || d->tokens->n_token_ids == 0) {
            return 0;
        }
        *route = lkv_route_hash(p->fp, d->tokens->token_ids, d->tokens->n_token_ids);
        return 1;
    }
    if (d->route != 0) {
        *route = d->route;
        return 1;
    }
    return 0;
}

/* Owner of route: 1 self (or unroutable), 0 other (addr, id filled). */
static int owner_of(lkv_cluster *c, uint64_t route, char *addr, size_t len, char *id, size_t idl)
{
    if (c->router == NULL) {
        return 1;
    }
    int rc = lkv_router_owner(c->router, route, addr, len, id, idl);
    return rc == 0 ? 0 : 1;
}

struct fwd;

typedef struct group {
    struct fwd *f;
    char addr[LKV_MEMBER_ADDR_MAX];
    size_t n;
    size_t *idx;               /* Indices into the original request. */
    Lazykv__V1__DocRef **refs; /* Borrowed from the original request while it lives. */
    Lazykv__V1__LookupResponse *resp;
    int rc;
    char msg[256];
} group;

typedef struct fwd {
    lkv_cluster *c;
    lkv_rpc_ticket t;
    pthread_mutex_t mu;
    int pending;
    size_t n;
    int n_groups;
    group g[MAX_GROUPS];
    /* Of the original refs, kept for OWNER_DOWN answers: the key (if the ref had one). */
    uint8_t (*keys)[32];
    uint8_t *has_key;
    Lazykv__V1__DeleteResponse *del;
    int del_rc;
} fwd;

static void fwd_free(fwd *f)
{
    for (int i = 0; i < f->n_groups; i++) {
        free(f->g[i].idx);
        free(f->g[i].refs);
        if (f->g[i].resp != NULL) {
            protobuf_c_message_free_unpacked(&f->g[i].resp->base, NULL);
        }
    }
    free(f->keys);
    free(f->has_key);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

static void lookup_merge(fwd *f)
{
    Lazykv__V1__DocStatus **docs = lkv_xcalloc(f->n, sizeof(*docs));
    Lazykv__V1__DocStatus *down = lkv_xcalloc(f->n, sizeof(*down));
    for (int gi = 0; gi < f->n_groups; gi++) {
        group *g = &f->g[gi];
        if (g->rc != 0 && g->rc != LKV_EUNAVAIL && g->rc != LKV_ETIMEDOUT) {
            lkv_rpc_finish_deferred(f->t, g->rc, NULL, "forwarded to %s: %s", g->addr, g->msg);
            free(docs);
            free(down);
            return;
        }
        if (g->rc == 0 && (g->resp == NULL || g->resp->n_docs != g->n)) {
            lkv_rpc_finish_deferred(f->t, LKV_EPROTO, NULL,
                                    "forwarded to %s: the owner answered %zu documents, not %zu",
                                    g->addr, g->resp ? g->resp->n_docs : 0, g->n);
            free(docs);
            free(down);
            return;
        }
        for (size_t j = 0; j < g->n; j++) {
            size_t i = g->idx[j];
            if (g->rc == 0) {
                docs[i] = g->resp->docs[j];
            } else {
                lazykv__v1__doc_status__init(&down[i]);
                down[i].present = 0;
                down[i].tier = LAZYKV__V1__TIER__TIER_ABSENT;
                down[i].miss_cause = LAZYKV__V1__MISS_CAUSE__MISS_CAUSE_OWNER_DOWN;
                if (f->has_key[i]) {
                    down[i].key.data = f->keys[i];
                    down[i].key.len = 32;
                }
                docs[i] = &down[i];
            }
        }
    }
    Lazykv__V1__LookupResponse out = LAZYKV__V1__LOOKUP_RESPONSE__INIT;
    out.n_docs = f->n;
    out.docs = docs;
    lkv_rpc_finish_deferred(f->t, 0, &out.base, NULL);
    free(docs);
    free(down);
}

static void lookup_part_done(void *arg, int rc, const char *msg, ProtobufCMessage *resp)
{
    group *g = arg;
    fwd *f = g->f;
    g->rc = rc;
    g->resp = (Lazykv__V1__LookupResponse *)resp;
    snprintf(g->msg, sizeof(g->msg), "%s", msg != NULL ? msg : "");
    if (rc != 0) {
        LKV_LOGI("cluster: forwarded Lookup to %s failed: %s (%s)", g->addr, g->msg,
                 lkv_err_name(rc));
    }
    pthread_mutex_lock(&f->mu);
    int last = --f->pending == 0;
    pthread_mutex_unlock(&f->mu);
    if (last) {
        lookup_merge(f);
        fwd_free(f);
    }
}

/* Forwarded calls' metadata: the cluster credential and the caller's tenant. */
static size_t fwd_md(const lkv_cluster *c, lkv_rpc *rpc, lkv_peer_md md[2])
{
    const lkv_tenant *t = lkv_rpc_principal(rpc);
    md[0].key = "authorization";
    md[0].value = c->bearer;
    md[1].key = LKV_CLUSTER_TENANT_MD;
    md[1].value = t != NULL ? t->name : LKV_AUTH_DEFAULT_TENANT;
    return 2;
}

/* The deadline a forwarded call gets: what the caller has left, less a margin to answer. */
static int64_t fwd_deadline(lkv_rpc *rpc)
{
    int64_t left = lkv_rpc_deadline_left_ms(rpc);
    if (left == INT64_MAX) {
        return 30000;
    }
    /* Keep a fifth of what is left (30..500 ms) to answer for an owner that stays silent. */
    int64_t margin = left / 5;
    margin = margin < MARGIN_MS ? MARGIN_MS : margin > 500 ? 500 : margin;
    if (left > 2 * margin) {
        return left - margin;
    }
    return left > 2 ? left / 2 : 1;
}

static int route_lookup(lkv_cluster *c, lkv_rpc *rpc, const Lazykv__V1__LookupRequest *req)
{
    size_t n = req->n_docs;
    if (n == 0 || n > 100000) {
        return 0; /* The service refuses it. */
    }
    char addr[LKV_MEMBER_ADDR_MAX], id[LKV_MEMBER_ID_MAX];
    int *owner = lkv_xcalloc(n, sizeof(*owner)); /* Group index. */
    fwd *f = lkv_xcalloc(1, sizeof(*f));
    f->c = c;
    f->n = n;
    pthread_mutex_init(&f->mu, NULL);
    int remote = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t route = 0;
        const char *a = c->self_addr;
        if (ref_route(c, req->docs[i], &route) &&
            owner_of(c, route, addr, sizeof(addr), id, sizeof(id)) == 0) {
            a = addr;
            remote = 1;
        }
        int gi = -1;
        for (int k = 0; k < f->n_groups && gi < 0; k++) {
            if (strcmp(f->g[k].addr, a) == 0) {
                gi = k;
            }
        }
        if (gi < 0) {
            if (f->n_groups == MAX_GROUPS) {
                gi = 0; /* More owners than groups (huge clusters): fold into the first. */
            } else {
                gi = f->n_groups++;
                f->g[gi].f = f;
                snprintf(f->g[gi].addr, sizeof(f->g[gi].addr), "%s", a);
            }
        }
        owner[i] = gi;
        f->g[gi].n++;
    }
    if (!remote) {
        free(owner);
        fwd_free(f);
        return 0;
    }
    f->keys = lkv_xcalloc(n, 32);
    f->has_key = lkv_xcalloc(n, 1);
    for (int k = 0; k < f->n_groups; k++) {
        f->g[k].idx = lkv_xcalloc(f->g[k].n, sizeof(size_t));
        f->g[k].refs = lkv_xcalloc(f->g[k].n, sizeof(*f->g[k].refs));
        f->g[k].n = 0;
    }
    for (size_t i = 0; i < n; i++) {
        group *g = &f->g[owner[i]];
        g->idx[g->n] = i;
        g->refs[g->n] = req->docs[i];
        g->n++;
        const Lazykv__V1__DocRef *d = req->docs[i];
        if (d != NULL && d->key.len == 32) {
            memcpy(f->keys[i], d->key.data, 32);
            f->has_key[i] = 1;
        }
    }
    free(owner);
    int rc = lkv_rpc_defer(rpc, &f->t);
    lkv_peer_md md[2];
    size_t n_md = fwd_md(c, rpc, md);
    int64_t dl = fwd_deadline(rpc);
    f->pending = f->n_groups + 1; /* + 1: this loop, so no answer frees f under it. */
    int started = 0;
    for (int k = 0; k < f->n_groups; k++) {
        group *g = &f->g[k];
        Lazykv__V1__LookupRequest sub = LAZYKV__V1__LOOKUP_REQUEST__INIT;
        sub.n_docs = g->n;
        sub.docs = g->refs;
        lkv_peer_chan *ch = lkv_membership_chan(c->mem, g->addr);
        int src = lkv_peer_unary(ch, "/lazykv.v1.Cache/Lookup", &sub.base,
                                 &lazykv__v1__lookup_response__descriptor, md, n_md, dl,
                                 lookup_part_done, g);
        if (src != 0) {
            /* Not started: count it as an unreachable owner at once. */
            g->rc = LKV_EUNAVAIL;
            snprintf(g->msg, sizeof(g->msg), "cannot start the call: %s", lkv_strerror(src));
            pthread_mutex_lock(&f->mu);
            int last = --f->pending == 0;
            pthread_mutex_unlock(&f->mu);
            if (last) {
                lookup_merge(f);
                fwd_free(f);
                return rc;
            }
        } else {
            started++;
        }
    }
    (void)started; /* refs borrowed the request: every call above packed its copy already. */
    pthread_mutex_lock(&f->mu);
    int last = --f->pending == 0;
    pthread_mutex_unlock(&f->mu);
    if (last) {
        lookup_merge(f);
        fwd_free(f);
    }
    return rc;
}

typedef struct del_fwd {
    lkv_rpc_ticket t;
    char addr[LKV_MEMBER_ADDR_MAX];
} del_fwd;

static void delete_done(void *arg, int rc, const char *msg, ProtobufCMessage *resp)
{
    del_fwd *d = arg;
    if (rc == 0) {
        lkv_rpc_finish_deferred(d->t, 0, resp, NULL);
        protobuf_c_message_free_unpacked(resp, NULL);
    } else {
        lkv_rpc_finish_deferred(d->t, rc, NULL, "forwarded to the owner %s: %s", d->addr, msg);
    }
    free(d);
}

static int route_delete(lkv_cluster *c, lkv_rpc *rpc, const Lazykv__V1__DeleteRequest *req)
{
    uint64_t route;
    char addr[LKV_MEMBER_ADDR_MAX], id[LKV_MEMBER_ID_MAX];
    if (!ref_route(c, req->doc, &route) ||
        owner_of(c, route, addr, sizeof(addr), id, sizeof(id)) != 0) {
        return 0;
    }
    del_fwd *d = lkv_xcalloc(1, sizeof(*d));
    snprintf(d->addr, sizeof(d->addr), "%s", addr);
    int rc = lkv_rpc_defer(rpc, &d->t);
    lkv_peer_md md[2];
    size_t n_md = fwd_md(c, rpc, md);
    int src = lkv_peer_unary(lkv_membership_chan(c->mem, addr), "/lazykv.v1.Cache/Delete",
                             &req->base, &lazykv__v1__delete_response__descriptor, md, n_md,
                             fwd_deadline(rpc), delete_done, d);
    if (src != 0) {
        lkv_rpc_finish_deferred(d->t, LKV_EUNAVAIL, NULL, "cannot forward to %s: %s", addr,
                                lkv_strerror(src));
        free(d);
    }
    return rc;
}

static int redirect(lkv_cluster *c, lkv_rpc *rpc, const char *what, uint64_t route)
{
    char addr[LKV_MEMBER_ADDR_MAX], id[LKV_MEMBER_ID_MAX];
    if (owner_of(c, route, addr, sizeof(addr), id, sizeof(id)) != 0) {
        return 0;
    }
    uint64_t epoch = 0;
    lkv_router_live(c->router, &epoch);
    return lkv_rpc_errorf(rpc, LKV_ENOTOWNER,
                          "%s: this member does not own the document; member %s at %s does "
                          "(cluster view %" PRIu64 "): send the call there (see Cache/Cluster)",
                          what, id, addr, epoch);
}

/* ---- transfer of moved documents (pull on a miss) --------------------------------------- */

static _Thread_local int tl_bypass; /* Set while a resumed Get re-runs the service's start. */

void lkv_cluster_set_get(lkv_cluster *c, const lkv_method *get)
{
    c->get_m = get;
}

void lkv_cluster_transfer_counts(const lkv_cluster *c, uint64_t *ok, uint64_t *failed)
{
    *ok = atomic_load(&c->xfer_ok);
    *failed = atomic_load(&c->xfer_failed);
}

typedef struct pull {
    lkv_cluster *c;
    lkv_rpc_ticket t;
    char *profile;
    uint32_t *tokens;
    size_t n;
} pull;

static void pull_free(pull *p)
{
    free(p->profile);
    free(p->tokens);
    free(p);
}

/* The parked Get's continuation: the service's own start, now that the document is here (or
 * not: then it is a plain miss). */
static int resume_get(void *svc, lkv_rpc *rpc, void *arg)
{
    pull *p = arg;
    Lazykv__V1__TokenDoc td = LAZYKV__V1__TOKEN_DOC__INIT;
    td.profile = p->profile;
    td.n_token_ids = p->n;
    td.token_ids = p->tokens;
    Lazykv__V1__DocRef ref = LAZYKV__V1__DOC_REF__INIT;
    ref.tokens = &td;
    Lazykv__V1__GetRequest req = LAZYKV__V1__GET_REQUEST__INIT;
    req.doc = &ref;
    tl_bypass = 1;
    int rc = p->c->get_m->start(svc, rpc, &req.base);
    tl_bypass = 0;
    pull_free(p);
    return rc;
}

static void pull_done(void *arg, int rc)
{
    pull *p = arg;
    atomic_fetch_add(rc == 0 ? &p->c->xfer_ok : &p->c->xfer_failed, 1);
    if (rc == 0) {
        LKV_LOGD("cluster: fetched a moved document (%zu tokens) from its previous owner", p->n);
    }
    if (lkv_rpc_resume(p->t, resume_get, p) != 0) {
        pull_free(p); /* The call ended meanwhile (deadline, cancel). */
    }
}

/* A Get by tokens that we own and miss, whose previous owner is live: park, fetch, resume. */
static int try_pull(lkv_cluster *c, lkv_rpc *rpc, const Lazykv__V1__GetRequest *g, uint64_t route)
{
    const Lazykv__V1__TokenDoc *td = g->doc != NULL ? g->doc->tokens : NULL;
    char prev[LKV_MEMBER_ADDR_MAX];
    /* Where it came from: the owner among the others (a document moves to a member when that
     * member joins). Only for a while after the live set changed, so that steady-state misses
     * do not pay a round trip each. */
    if (c->get_m == NULL || td == NULL || td->n_token_ids == 0 ||
        lkv_router_changed_ms_ago(c->router) > TRANSFER_WINDOW_MS ||
        lkv_router_owner_without_self(c->router, route, prev, sizeof(prev)) != 0) {
        return 0;
    }
    const prof_fp *pf = prof_find(c, td->profile);
    const lkv_tenant *t = lkv_rpc_principal(rpc);
    if (pf == NULL || t == NULL) {
        return 0;
    }
    lkv_dockey key;
    lkv_dockey_compute(t->salt, pf->fp, td->token_ids, (uint32_t)td->n_token_ids, &key);
    if (lkv_store_tier(c->store, &key) != LKV_TIER_NONE) {
        return 0;
    }
    pull *p = lkv_xcalloc(1, sizeof(*p));
    p->c = c;
    p->profile = lkv_xstrdup(td->profile);
    p->n = td->n_token_ids;
    p->tokens = lkv_xmalloc(p->n * sizeof(*p->tokens));
    memcpy(p->tokens, td->token_ids, p->n * sizeof(*p->tokens));
    int rc = lkv_rpc_defer(rpc, &p->t);
    void *sink =
        lkv_transfer_store_sink(c->store, t->salt, p->profile, p->tokens, p->n, 0, pull_done, p);
    lkv_transfer_doc d = {.profile = p->profile,
                          .tokens = p->tokens,
                          .n_tokens = p->n,
                          .tenant = t->name,
                          .bearer = c->bearer,
                          .deadline_ms = fwd_deadline(rpc)};
    int frc = c->xport.fetch(c->xport.impl, prev, &d, &lkv_transfer_store_sink_ops, sink);
    if (frc != 0) {
        lkv_transfer_store_sink_ops.end(sink, frc); /* -> pull_done: resumes as a plain miss. */
    }
    return rc;
}

/* ---- local replicas (Attach of remote documents) ---------------------------------------- */

void lkv_cluster_set_attach(lkv_cluster *c, const lkv_method *attach)
{
    c->attach_m = attach;
}

void lkv_cluster_replica_counts(lkv_cluster *c, uint64_t *made, uint64_t *dropped, size_t *held)
{
    *made = atomic_load(&c->reps_made);
    *dropped = atomic_load(&c->reps_dropped);
    pthread_mutex_lock(&c->rmu);
    *held = c->n_reps;
    pthread_mutex_unlock(&c->rmu);
}

typedef struct rpull {
    lkv_cluster *c;
    lkv_rpc_ticket t;
    uint8_t *req; /* The packed AttachRequest (the continuation's copy). */
    size_t req_len;
    pthread_mutex_t mu;
    int pending;
    size_t n;
    lkv_dockey *keys;
    int *ok;
} rpull;

typedef struct rslot {
    rpull *rp;
    size_t i;
} rslot;

static void rpull_free(rpull *rp)
{
    free(rp->req);
    free(rp->keys);
    free(rp->ok);
    pthread_mutex_destroy(&rp->mu);
    free(rp);
}

static int resume_attach(void *svc, lkv_rpc *rpc, void *arg)
{
    rpull *rp = arg;
    ProtobufCMessage *req = protobuf_c_message_unpack(&lazykv__v1__attach_request__descriptor, NULL,
                                                      rp->req_len, rp->req);
    int rc = LKV_EINTERNAL;
    if (req != NULL) {
        tl_bypass = 1;
        rc = rp->c->attach_m->unary(svc, rpc, req);
        tl_bypass = 0;
        protobuf_c_message_free_unpacked(req, NULL);
    }
    rpull_free(rp);
    return rc;
}

static void rpull_finish(rpull *rp)
{
    lkv_cluster *c = rp->c;
    int64_t exp = mono_ms() + (int64_t)c->cfg->cluster_replica_ttl_ms;
    pthread_mutex_lock(&c->rmu);
    for (size_t i = 0; i < rp->n; i++) {
        if (!rp->ok[i]) {
            continue;
        }
        if (c->n_reps == c->cap_reps) {
            c->cap_reps = c->cap_reps ? 2 * c->cap_reps : 64;
            c->reps = lkv_xrealloc(c->reps, c->cap_reps * sizeof(*c->reps));
        }
        c->reps[c->n_reps].key = rp->keys[i];
        c->reps[c->n_reps++].expires_ms = exp;
        atomic_fetch_add(&c->reps_made, 1);
    }
    pthread_mutex_unlock(&c->rmu);
    if (lkv_rpc_resume(rp->t, resume_attach, rp) != 0) {
        rpull_free(rp);
    }
}

static void rslot_done(void *arg, int rc)
{
    rslot *sl = arg;
    rpull *rp = sl->rp;
    rp->ok[sl->i] = rc == 0;
    free(sl);
    pthread_mutex_lock(&rp->mu);
    int last = --rp->pending == 0;
    pthread_mutex_unlock(&rp->mu);
    if (last) {
        rpull_finish(rp);
    }
}

/* Attach by tokens of documents owned elsewhere and missing here: fetch them first. */
static int route_attach(lkv_cluster *c, lkv_rpc *rpc, const Lazykv__V1__AttachRequest *req)
{
    const lkv_tenant *t = lkv_rpc_principal(rpc);
    if (c->attach_m == NULL || c->cfg->cluster_replica_ttl_ms == 0 || t == NULL ||
        req->n_docs == 0 || req->n_docs > 4096) {
        return 0;
    }
    size_t n = req->n_docs, k = 0;
    size_t *want = lkv_xcalloc(n, sizeof(*want));
    char(*owner)[LKV_MEMBER_ADDR_MAX] = lkv_xcalloc(n, LKV_MEMBER_ADDR_MAX);
    lkv_dockey *keys = lkv_xcalloc(n, sizeof(*keys));
    for (size_t i = 0; i < n; i++) {
        const Lazykv__V1__DocRef *d = req->docs[i];
        uint64_t route;
        char id[LKV_MEMBER_ID_MAX];
        const prof_fp *pf =
            d != NULL && d->tokens != NULL ? prof_find(c, d->tokens->profile) : NULL;
        if (pf == NULL || !ref_route(c, d, &route) ||
            owner_of(c, route, owner[k], sizeof(owner[k]), id, sizeof(id)) != 0) {
            continue;
        }
        lkv_dockey_compute(t->salt, pf->fp, d->tokens->token_ids, (uint32_t)d->tokens->n_token_ids,
                           &keys[k]);
        if (lkv_store_tier(c->store, &keys[k]) != LKV_TIER_NONE) {
            continue; /* A replica already (or a stray copy): attach it as it is. */
        }
        want[k++] = i;
    }
    if (k == 0) {
        free(want);
        free(owner);
        free(keys);
        return 0;
    }
    rpull *rp = lkv_xcalloc(1, sizeof(*rp));
    rp->c = c;
    pthread_mutex_init(&rp->mu, NULL);
    rp->n = k;
    rp->keys = keys;
    rp->ok = lkv_xcalloc(k, sizeof(*rp->ok));
    rp->req_len = protobuf_c_message_get_packed_size(&req->base);
    rp->req = lkv_xmalloc(rp->req_len + 1);
    protobuf_c_message_pack(&req->base, rp->req);
    rp->pending = (int)k + 1;
    int rc = lkv_rpc_defer(rpc, &rp->t);
    for (size_t j = 0; j < k; j++) {
        const Lazykv__V1__TokenDoc *td = req->docs[want[j]]->tokens;
        rslot *sl = lkv_xcalloc(1, sizeof(*sl));
        sl->rp = rp;
        sl->i = j;
        void *sink =
            lkv_transfer_store_sink(c->store, t->salt, td->profile, td->token_ids, td->n_token_ids,
                                    -1, rslot_done, sl); /* A replica: evicted first. */
        lkv_transfer_doc doc = {.profile = td->profile,
                                .tokens = td->token_ids,
                                .n_tokens = td->n_token_ids,
                                .tenant = t->name,
                                .bearer = c->bearer,
                                .deadline_ms = fwd_deadline(rpc)};
        int frc = c->xport.fetch(c->xport.impl, owner[j], &doc, &lkv_transfer_store_sink_ops, sink);
        if (frc != 0) {
            lkv_transfer_store_sink_ops.end(sink, frc);
        }
    }
    free(want);
    free(owner);
    pthread_mutex_lock(&rp->mu);
    int last = --rp->pending == 0;
    pthread_mutex_unlock(&rp->mu);
    if (last) {
        rpull_finish(rp);
    }
    return rc;
}

int lkv_cluster_route(void *ctx, lkv_rpc *rpc, const ProtobufCMessage *req)
{
    lkv_cluster *c = ctx;
    if (tl_bypass) {
        return 0;
    }
    if (c == NULL || c->mode == LKV_CLUSTER_NONE || c->router == NULL || req == NULL ||
        is_internal(c, rpc)) {
        return 0;
    }
    const ProtobufCMessageDescriptor *d = req->descriptor;
    uint64_t route;
    if (d == &lazykv__v1__lookup_request__descriptor) {
        return route_lookup(c, rpc, (const Lazykv__V1__LookupRequest *)req);
    }
    if (d == &lazykv__v1__attach_request__descriptor) {
        return route_attach(c, rpc, (const Lazykv__V1__AttachRequest *)req);
    }
    if (d == &lazykv__v1__delete_request__descriptor) {
        return route_delete(c, rpc, (const Lazykv__V1__DeleteRequest *)req);
    }
    if (d == &lazykv__v1__get_request__descriptor) {
        const Lazykv__V1__GetRequest *g = (const Lazykv__V1__GetRequest *)req;
        if (!ref_route(c, g->doc, &route)) {
            return 0;
        }
        int rc = redirect(c, rpc, "Get", route);
        return rc != 0 ? rc : try_pull(c, rpc, g, route);
    }
    if (d == &lazykv__v1__put_request__descriptor) {
        const Lazykv__V1__PutRequest *p = (const Lazykv__V1__PutRequest *)req;
        if (p->header == NULL) {
            return 0;
        }
        const prof_fp *pf = prof_find(c, p->header->profile);
        if (pf == NULL || p->header->n_token_ids == 0) {
            return 0;
        }
        route = lkv_route_hash(pf->fp, p->header->token_ids, p->header->n_token_ids);
        return redirect(c, rpc, "Put", route);
    }
    return 0;
}

/* ---- the Cluster method ------------------------------------------------------------------ */

static int cluster_rpc(void *svc, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_cluster *c = svc;
    (void)m;
    lkv_store_stats st;
    lkv_store_stats_get(c->store, &st);
    size_t cap = LKV_MEMBERS_MAX;
    lkv_member *mb = lkv_xcalloc(cap, sizeof(*mb));
    size_t n = 0;
    uint64_t epoch = 0;
    pthread_mutex_lock(&c->mu);
    if (c->mem != NULL) {
        n = lkv_membership_snapshot(c->mem, mb, cap, NULL);
        if (n > cap) {
            n = cap;
        }
        lkv_router_live(c->router, &epoch);
    }
    if (n == 0) {
        n = 1;
        snprintf(mb[0].id, sizeof(mb[0].id), "%s", c->self_addr);
        snprintf(mb[0].addr, sizeof(mb[0].addr), "%s", c->self_addr);
        snprintf(mb[0].version, sizeof(mb[0].version), "%s", c->version);
        mb[0].hot_bytes = c->cfg->hot_bytes;
        mb[0].state = LKV_MEMBER_UP;
        mb[0].self = 1;
    }
    Lazykv__V1__ClusterMember *cm = lkv_xcalloc(n, sizeof(*cm));
    Lazykv__V1__ClusterMember **cmp = lkv_xcalloc(n, sizeof(*cmp));
    for (size_t i = 0; i < n; i++) {
        lazykv__v1__cluster_member__init(&cm[i]);
        cm[i].id = mb[i].id;
        cm[i].addr = mb[i].addr;
        cm[i].version = mb[i].version;
        cm[i].hot_bytes = mb[i].hot_bytes;
        cm[i].state = (char *)lkv_member_state_name(mb[i].state);
        cm[i].self = mb[i].self;
        cm[i].share = c->router != NULL ? lkv_router_share(c->router, mb[i].id) : 1.0;
        if (mb[i].self) {
            cm[i].hot_used_bytes = st.hot_bytes;
            cm[i].cold_used_bytes = st.cold_bytes;
            cm[i].hot_docs = st.hot_docs;
            cm[i].cold_docs = st.cold_docs;
        }
        cmp[i] = &cm[i];
    }
    int etcd_up = c->mem != NULL && c->mode == LKV_CLUSTER_ETCD && lkv_membership_etcd_up(c->mem);
    pthread_mutex_unlock(&c->mu);
    Lazykv__V1__ClusterProfile *cp = lkv_xcalloc((size_t)c->n_prof + 1, sizeof(*cp));
    Lazykv__V1__ClusterProfile **cpp = lkv_xcalloc((size_t)c->n_prof + 1, sizeof(*cpp));
    for (int i = 0; i < c->n_prof; i++) {
        lazykv__v1__cluster_profile__init(&cp[i]);
        cp[i].name = c->prof[i].name;
        cp[i].fingerprint.data = c->prof[i].fp;
        cp[i].fingerprint.len = LKV_ROUTE_FP_BYTES;
        cpp[i] = &cp[i];
    }
    Lazykv__V1__ClusterResponse r = LAZYKV__V1__CLUSTER_RESPONSE__INIT;
    r.mode = (char *)mode_name(c->mode);
    r.epoch = epoch;
    r.n_members = n;
    r.members = cmp;
    r.n_profiles = (size_t)c->n_prof;
    r.profiles = cpp;
    r.etcd_up = etcd_up;
    int rc = lkv_rpc_reply(rpc, &r.base);
    free(cm);
    free(cmp);
    free(cp);
    free(cpp);
    free(mb);
    return rc;
}

int lkv_cluster_methods(lkv_cluster *c, lkv_method *out)
{
    lkv_method m = {.path = "/lazykv.v1.Cache/Cluster",
                    .kind = LKV_RPC_UNARY,
                    .req_desc = &lazykv__v1__cluster_request__descriptor,
                    .svc = c,
                    .unary = cluster_rpc};
    out[0] = m;
    return LKV_CLUSTER_METHODS;
}

void lkv_cluster_set_auth(lkv_cluster *c, const lkv_auth *auth)
{
    if (c != NULL) {
        atomic_store(&c->auth, auth);
    }
}
