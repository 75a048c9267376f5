/*
 * lkv_router.c: owners by weighted rendezvous hashing over the live members (see
 * lkv_router.h). A view is an immutable array of candidates; refresh builds a new one from a
 * membership snapshot and swaps it in under the write lock, keeping the previous one.
 */
#include "lkv_router.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_route.h"

typedef struct cand {
    char id[LKV_MEMBER_ID_MAX];
    char addr[LKV_MEMBER_ADDR_MAX];
    int self;
} cand;

typedef struct view {
    size_t n;
    cand *c;
    lkv_route_member *rm; /* rm[i].id points into c[i].id. */
    double total_w;
} view;

struct lkv_router {
    lkv_membership *m;
    pthread_rwlock_t lk;
    pthread_mutex_t refresh_mu; /* One refresh at a time. */
    view cur, prev;
    uint64_t epoch;
    int64_t changed_ms; /* Monotonic ms of the last live-set change (0: none). */
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void view_free(view *v)
{
    free(v->c);
    free(v->rm);
    memset(v, 0, sizeof(*v));
}

int lkv_router_create(lkv_membership *m, lkv_router **out)
{
    lkv_router *r = lkv_xcalloc(1, sizeof(*r));
    r->m = m;
    pthread_rwlock_init(&r->lk, NULL);
    pthread_mutex_init(&r->refresh_mu, NULL);
    *out = r;
    lkv_router_refresh(r);
    return 0;
}

void lkv_router_destroy(lkv_router *r)
{
    if (r == NULL) {
        return;
    }
    view_free(&r->cur);
    view_free(&r->prev);
    pthread_rwlock_destroy(&r->lk);
    pthread_mutex_destroy(&r->refresh_mu);
    free(r);
}

static int same_set(const view *a, const view *b)
{
    if (a->n != b->n) {
        return 0;
    }
    for (size_t i = 0; i < a->n; i++) {
        if (strcmp(a->c[i].id, b->c[i].id) != 0 || strcmp(a->c[i].addr, b->c[i].addr) != 0 ||
            a->rm[i].weight != b->rm[i].weight) {
            return 0;
        }
    }
    return 1;
}

void lkv_router_refresh(void *router)
{
    lkv_router *r = router;
    pthread_mutex_lock(&r->refresh_mu);
    lkv_member *mb = lkv_xcalloc(LKV_MEMBERS_MAX, sizeof(*mb));
    size_t n = lkv_membership_snapshot(r->m, mb, LKV_MEMBERS_MAX, NULL);
    if (n > LKV_MEMBERS_MAX) {
        n = LKV_MEMBERS_MAX;
    }
    view v = {0};
    v.c = lkv_xcalloc(n + 1, sizeof(*v.c));
    v.rm = lkv_xcalloc(n + 1, sizeof(*v.rm));
    for (size_t i = 0; i < n; i++) {
        if (mb[i].state != LKV_MEMBER_UP) {
            continue;
        }
        cand *c = &v.c[v.n];
        snprintf(c->id, sizeof(c->id), "%s", mb[i].id);
        snprintf(c->addr, sizeof(c->addr), "%s", mb[i].addr);
        c->self = mb[i].self;
        v.rm[v.n].id = c->id;
        v.rm[v.n].seed = lkv_route_seed(c->id);
        v.rm[v.n].weight = mb[i].hot_bytes == 0 ? 1 : mb[i].hot_bytes;
        v.total_w += (double)v.rm[v.n].weight;
        v.n++;
    }
    free(mb);
    pthread_rwlock_wrlock(&r->lk);
    if (same_set(&v, &r->cur)) {
        pthread_rwlock_unlock(&r->lk);
        view_free(&v);
        pthread_mutex_unlock(&r->refresh_mu);
        return;
    }
    view_free(&r->prev);
    r->prev = r->cur;
    r->cur = v;
    r->epoch++;
    r->changed_ms = mono_ms();
    char list[1024];
    size_t k = 0;
    list[0] = '\0';
    for (size_t i = 0; i < v.n && k < sizeof(list); i++) {
        int w = snprintf(list + k, sizeof(list) - k, "%s%s", i ? " " : "", v.c[i].id);
        k += w > 0 ? (size_t)w : 0;
    }
    uint64_t ep = r->epoch;
    pthread_rwlock_unlock(&r->lk);
    LKV_LOGI("cluster: routing over %zu live member(s) (view %" PRIu64 "): %s", v.n, ep, list);
    pthread_mutex_unlock(&r->refresh_mu);
}

static int pick(const view *v, uint64_t route, char *addr, size_t len, char *id, size_t idlen)
{
    int i = lkv_route_pick(v->rm, v->n, route);
    if (i < 0) {
        return LKV_EUNAVAIL;
    }
    if (addr != NULL) {
        snprintf(addr, len, "%s", v->c[i].addr);
    }
    if (id != NULL) {
        snprintf(id, idlen, "%s", v->c[i].id);
    }
    return v->c[i].self ? 1 : 0;
}

int lkv_router_owner(lkv_router *r, uint64_t route, char *addr, size_t len, char *id, size_t idlen)
{
    pthread_rwlock_rdlock(&r->lk);
    int rc = pick(&r->cur, route, addr, len, id, idlen);
    pthread_rwlock_unlock(&r->lk);
    return rc;
}

int lkv_router_prev_owner(lkv_router *r, uint64_t route, char *addr, size_t len)
{
    char now_id[LKV_MEMBER_ID_MAX], prev_id[LKV_MEMBER_ID_MAX];
    pthread_rwlock_rdlock(&r->lk);
    int a = pick(&r->cur, route, NULL, 0, now_id, sizeof(now_id));
    int b = pick(&r->prev, route, addr, len, prev_id, sizeof(prev_id));
    pthread_rwlock_unlock(&r->lk);
    if (b < 0 || (a >= 0 && strcmp(now_id, prev_id) == 0)) {
        return LKV_ENOTFOUND;
    }
    return b;
}

size_t lkv_router_live(lkv_router *r, uint64_t *epoch)
{
    pthread_rwlock_rdlock(&r->lk);
    size_t n = r->cur.n;
    if (epoch != NULL) {
        *epoch = r->epoch;
    }
    pthread_rwlock_unlock(&r->lk);
    return n;
}

double lkv_router_share(lkv_router *r, const char *id)
{
    double s = 0;
    pthread_rwlock_rdlock(&r->lk);
    for (size_t i = 0; i < r->cur.n; i++) {
        if (strcmp(r->cur.c[i].id, id) == 0 && r->cur.total_w > 0) {
            s = (double)r->cur.rm[i].weight / r->cur.total_w;
        }
    }
    pthread_rwlock_unlock(&r->lk);
    return s;
}

int lkv_router_is_live(lkv_router *r, const char *addr)
{
    int live = 0;
    pthread_rwlock_rdlock(&r->lk);
    for (size_t i = 0; i < r->cur.n && !live; i++) {
        live = strcmp(r->cur.c[i].addr, addr) == 0;
    }
    pthread_rwlock_unlock(&r->lk);
    return live;
}

int lkv_router_owner_without_self(lkv_router *r, uint64_t route, char *addr, size_t len)
{
    int rc = LKV_ENOTFOUND;
    pthread_rwlock_rdlock(&r->lk);
    lkv_route_member *rm = lkv_xcalloc(r->cur.n + 1, sizeof(*rm));
    size_t *idx = lkv_xcalloc(r->cur.n + 1, sizeof(*idx));
    size_t n = 0;
    for (size_t i = 0; i < r->cur.n; i++) {
        if (!r->cur.c[i].self) {
            rm[n] = r->cur.rm[i];
            idx[n++] = i;
        }
    }
    int k = lkv_route_pick(rm, n, route);
    if (k >= 0) {
        snprintf(addr, len, "%s", r->cur.c[idx[k]].addr);
        rc = 0;
    }
    pthread_rwlock_unlock(&r->lk);
    free(rm);
    free(idx);
    return rc;
}

int64_t lkv_router_changed_ms_ago(lkv_router *r)
{
    pthread_rwlock_rdlock(&r->lk);
    int64_t t = r->changed_ms;
    pthread_rwlock_unlock(&r->lk);
    return t == 0 ? INT64_MAX : mono_ms() - t;
}
