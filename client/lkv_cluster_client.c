/*
 * lkv_cluster_client.c: routing over lazykvd members (see lkv_cluster_client.h).
 *
 * State under mu: the last lkv_cluster_info read, and the member handles by address (never
 * freed before destroy, so a handle returned to a caller stays valid while the view changes).
 * Each routed call: compute the owner under mu, call it without the lock, and on LKV_ENOTOWNER or
 * LKV_EUNAVAIL wait a little, refresh and try again while the deadline allows.
 */
#include "lkv_cluster_client.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_route.h"

#define MAX_HANDLES 256
#define RETRY_MS    100

typedef struct handle {
    char addr[128];
    lkv_client_t *c;
} handle;

struct lkv_cluster_client {
    pthread_mutex_t mu;
    lkv_client_options opt;
    char token[600];
    char seeds[1024];
    lkv_cluster_info info;
    handle h[MAX_HANDLES];
    size_t n_h;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

lkv_client_t *lkv_cluster_client_member(lkv_cluster_client_t *r, const char *addr)
{
    pthread_mutex_lock(&r->mu);
    lkv_client_t *c = NULL;
    for (size_t i = 0; i < r->n_h; i++) {
        if (strcmp(r->h[i].addr, addr) == 0) {
            c = r->h[i].c;
        }
    }
    if (c == NULL && r->n_h < MAX_HANDLES && lkv_client_create(addr, &r->opt, &c) == 0) {
        snprintf(r->h[r->n_h].addr, sizeof(r->h[r->n_h].addr), "%s", addr);
        r->h[r->n_h++].c = c;
    }
    pthread_mutex_unlock(&r->mu);
    return c;
}

/* Asks addr for the cluster; on success replaces the view. */
static int read_from(lkv_cluster_client_t *r, const char *addr, int deadline_ms)
{
    lkv_client_t *c = lkv_cluster_client_member(r, addr);
    if (c == NULL) {
        return LKV_EINVAL;
    }
    lkv_cluster_info ci;
    int rc = lkv_client_cluster(c, deadline_ms, &ci);
    if (rc != 0) {
        return rc;
    }
    pthread_mutex_lock(&r->mu);
    lkv_cluster_info_free(&r->info);
    r->info = ci;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int lkv_cluster_client_refresh(lkv_cluster_client_t *r, int deadline_ms)
{
    char cand[MAX_HANDLES][128];
    size_t n = 0;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->info.n_members && n < MAX_HANDLES; i++) {
        if (strcmp(r->info.members[i].state, "up") == 0) {
            snprintf(cand[n++], sizeof(cand[0]), "%s", r->info.members[i].addr);
        }
    }
    pthread_mutex_unlock(&r->mu);
    char buf[sizeof(r->seeds)];
    snprintf(buf, sizeof(buf), "%s", r->seeds);
    char *save = NULL;
    for (char *t = strtok_r(buf, ", ", &save); t != NULL && n < MAX_HANDLES;
         t = strtok_r(NULL, ", ", &save)) {
        snprintf(cand[n++], sizeof(cand[0]), "%s", t);
    }
    int rc = LKV_EUNAVAIL;
    int64_t end = now_ms() + (deadline_ms > 0 ? deadline_ms : LKV_CLIENT_DEFAULT_DEADLINE_MS);
    /* Each candidate gets a short try: a stopped member must not eat the whole deadline. */
    for (size_t i = 0; i < n; i++) {
        int64_t left = end - now_ms();
        if (left <= 0) {
            return LKV_ETIMEDOUT;
        }
        int per = left > 500 ? 500 : (int)left;
        rc = read_from(r, cand[i], per);
        if (rc == 0) {
            return 0;
        }
    }
    return rc;
}

int lkv_cluster_client_create(const char *seeds, const lkv_client_options *opt, int deadline_ms,
                              lkv_cluster_client_t **out)
{
    *out = NULL;
    if (seeds == NULL || seeds[0] == '\0') {
        return LKV_EINVAL;
    }
    lkv_cluster_client_t *r = lkv_xcalloc(1, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    if (opt != NULL) {
        r->opt = *opt;
        if (opt->bearer_token != NULL) {
            snprintf(r->token, sizeof(r->token), "%s", opt->bearer_token);
            r->opt.bearer_token = r->token;
        }
    }
    snprintf(r->seeds, sizeof(r->seeds), "%s", seeds);
    int rc = lkv_cluster_client_refresh(r, deadline_ms);
    if (rc != 0) {
        lkv_cluster_client_destroy(r);
        return rc;
    }
    *out = r;
    return 0;
}

void lkv_cluster_client_destroy(lkv_cluster_client_t *r)
{
    if (r == NULL) {
        return;
    }
    for (size_t i = 0; i < r->n_h; i++) {
        lkv_client_destroy(r->h[i].c);
    }
    lkv_cluster_info_free(&r->info);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

void lkv_cluster_client_info(lkv_cluster_client_t *r, lkv_cluster_info *out)
{
    pthread_mutex_lock(&r->mu);
    *out = r->info;
    out->members = lkv_xcalloc(r->info.n_members + 1, sizeof(*out->members));
    memcpy(out->members, r->info.members, r->info.n_members * sizeof(*out->members));
    out->profiles = lkv_xcalloc(r->info.n_profiles + 1, sizeof(*out->profiles));
    memcpy(out->profiles, r->info.profiles, r->info.n_profiles * sizeof(*out->profiles));
    pthread_mutex_unlock(&r->mu);
}

static uint64_t route_of(lkv_cluster_client_t *r, const char *profile, const uint32_t *tokens,
                         size_t n)
{
    uint64_t route = 0;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; profile != NULL && i < r->info.n_profiles; i++) {
        if (strcmp(r->info.profiles[i].name, profile) == 0 && n > 0) {
            route = lkv_route_hash(r->info.profiles[i].fingerprint, tokens, n);
            if (route == 0) {
                route = 1; /* 0 means "none" on the wire. */
            }
        }
    }
    pthread_mutex_unlock(&r->mu);
    return route;
}

uint64_t lkv_cluster_client_route(lkv_cluster_client_t *r, const lkv_docref *ref)
{
    if (ref->key != NULL) {
        return 0; /* The key hides the tokens: name documents by content to route them. */
    }
    return route_of(r, ref->profile, ref->tokens, ref->n_tokens);
}

int lkv_cluster_client_owner(lkv_cluster_client_t *r, uint64_t route, char *addr, size_t len)
{
    lkv_route_member rm[MAX_HANDLES];
    size_t n = 0;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->info.n_members && n < MAX_HANDLES; i++) {
        const lkv_cluster_member *m = &r->info.members[i];
        if (strcmp(m->state, "up") == 0) {
            rm[n].id = m->id;
            rm[n].seed = lkv_route_seed(m->id);
            rm[n].weight = m->hot_bytes;
            n++;
        }
    }
    int k = lkv_route_pick(rm, n, route);
    int rc = LKV_EUNAVAIL;
    if (k >= 0) {
        for (size_t i = 0; i < r->info.n_members; i++) {
            if (&r->info.members[i].id[0] == rm[k].id) {
                snprintf(addr, len, "%s", r->info.members[i].addr);
                rc = 0;
            }
        }
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* One routed attempt's target: the owner of route, or (route 0) any up member. */
static lkv_client_t *target(lkv_cluster_client_t *r, uint64_t route)
{
    char addr[128];
    if (route != 0 && lkv_cluster_client_owner(r, route, addr, sizeof(addr)) == 0) {
        return lkv_cluster_client_member(r, addr);
    }
    pthread_mutex_lock(&r->mu);
    addr[0] = '\0';
    for (size_t i = 0; i < r->info.n_members && addr[0] == '\0'; i++) {
        if (strcmp(r->info.members[i].state, "up") == 0) {
            snprintf(addr, sizeof(addr), "%s", r->info.members[i].addr);
        }
    }
    pthread_mutex_unlock(&r->mu);
    return addr[0] ? lkv_cluster_client_member(r, addr) : NULL;
}

/* Whether rc is worth a refresh and another try. */
static int retryable(int rc)
{
    return rc == LKV_ENOTOWNER || rc == LKV_EUNAVAIL;
}

/* Waits before the next try and refreshes; 0 to try again, else the code to return. */
static int backoff(lkv_cluster_client_t *r, int64_t end, int rc)
{
    int64_t left = end - now_ms();
    if (left <= RETRY_MS) {
        return rc == LKV_EUNAVAIL ? LKV_ETIMEDOUT : rc;
    }
    sleep_ms(RETRY_MS);
    left = end - now_ms();
    lkv_cluster_client_refresh(r, (int)(left > 1000 ? 1000 : left));
    return 0;
}

static int64_t end_of(int deadline_ms)
{
    return now_ms() + (deadline_ms > 0 ? deadline_ms : LKV_CLIENT_DEFAULT_DEADLINE_MS);
}

static int left_ms(int64_t end)
{
    int64_t l = end - now_ms();
    return l < 1 ? 1 : (int)l;
}

int lkv_cluster_client_put(lkv_cluster_client_t *r, const char *profile, const uint32_t *tokens,
                           size_t n_tokens, const void *blocks, uint32_t n_blocks,
                           size_t block_bytes, int deadline_ms, lkv_put_reply *reply)
{
    int64_t end = end_of(deadline_ms);
    for (;;) {
        lkv_client_t *c = target(r, route_of(r, profile, tokens, n_tokens));
        int rc = c == NULL ? LKV_EUNAVAIL
                           : lkv_client_put(c, profile, tokens, n_tokens, blocks, n_blocks,
                                            block_bytes, left_ms(end), reply);
        if (!retryable(rc) || (rc = backoff(r, end, rc)) != 0) {
            return rc;
        }
    }
}

int lkv_cluster_client_get_buf(lkv_cluster_client_t *r, const lkv_docref *ref, int deadline_ms,
                               lkv_get_header *header, uint8_t **data, size_t *len)
{
    int64_t end = end_of(deadline_ms);
    for (;;) {
        lkv_client_t *c = target(r, lkv_cluster_client_route(r, ref));
        int rc =
            c == NULL ? LKV_EUNAVAIL : lkv_client_get_buf(c, ref, left_ms(end), header, data, len);
        if (!retryable(rc) || (rc = backoff(r, end, rc)) != 0) {
            return rc;
        }
    }
}

int lkv_cluster_client_delete(lkv_cluster_client_t *r, const lkv_docref *ref, int deadline_ms,
                              uint8_t *key_out)
{
    int64_t end = end_of(deadline_ms);
    for (;;) {
        lkv_client_t *c = target(r, lkv_cluster_client_route(r, ref));
        int rc = c == NULL ? LKV_EUNAVAIL : lkv_client_delete(c, ref, left_ms(end), key_out);
        if (!retryable(rc) || (rc = backoff(r, end, rc)) != 0) {
            return rc;
        }
    }
}

int lkv_cluster_client_lookup(lkv_cluster_client_t *r, const lkv_docref *refs, size_t n,
                              int deadline_ms, lkv_doc_status *out)
{
    if (n == 0) {
        return LKV_EINVAL;
    }
    int64_t end = end_of(deadline_ms);
    char(*owner)[128] = lkv_xcalloc(n, 128);
    lkv_docref *sub = lkv_xcalloc(n, sizeof(*sub));
    size_t *idx = lkv_xcalloc(n, sizeof(*idx));
    lkv_doc_status *res = lkv_xcalloc(n, sizeof(*res));
    uint8_t *done = lkv_xcalloc(n, 1);
    int rc = 0;
    for (;;) {
        for (size_t i = 0; i < n; i++) {
            uint64_t route = lkv_cluster_client_route(r, &refs[i]);
            if (route == 0 || lkv_cluster_client_owner(r, route, owner[i], 128) != 0) {
                owner[i][0] = '\0'; /* Any member: it serves what it cannot route. */
            }
        }
        rc = 0;
        /* One call per distinct owner, for the documents not answered yet. */
        for (size_t i = 0; i < n && rc == 0; i++) {
            if (done[i]) {
                continue;
            }
            size_t k = 0;
            for (size_t j = i; j < n; j++) {
                if (!done[j] && strcmp(owner[j], owner[i]) == 0) {
                    sub[k] = refs[j];
                    idx[k++] = j;
                }
            }
            lkv_client_t *c = owner[i][0] ? lkv_cluster_client_member(r, owner[i]) : target(r, 0);
            rc = c == NULL ? LKV_EUNAVAIL : lkv_client_lookup(c, sub, k, left_ms(end), res);
            if (rc == 0) {
                for (size_t q = 0; q < k; q++) {
                    out[idx[q]] = res[q];
                    done[idx[q]] = 1;
                }
            }
        }
        if (!retryable(rc) || (rc = backoff(r, end, rc)) != 0) {
            break;
        }
    }
    free(owner);
    free(sub);
    free(idx);
    free(res);
    free(done);
    return rc;
}
