/*
 * lkv_lease.c: the lease table (see lkv_lease.h).
 *
 * Layout: a fixed array of max_leases slots allocated at create (a slot is free when its
 * n_docs is 0 and in_use is 0); each live lease owns a growable array of (key, n_blocks)
 * entries. Lookups by id are a linear scan: max_leases is small (default 1024) and attach is
 * not on the per-token path. The reaper thread waits on a condition variable bound to the
 * monotonic clock until the earliest expiry (at most REAP_MAX_WAIT_MS), then releases every
 * expired lease; lkv_lease_table_destroy wakes it to stop.
 *
 * Reservations are lease entries whose tx is an open store put (attached entries have tx NULL
 * and hold one store pin). Waiters for a reserved key are a small array of (key, wake, arg);
 * every place that ends a reservation (commit, abort, lease end) moves the key's waiters onto
 * a local list under the lock and calls them after unlocking (wake_run), so a wake-up (which
 * resumes a parked RPC) never runs under the table lock.
 */
#include "lkv_lease.h"

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "lkv_err.h"
#include "lkv_log.h"

#define REAP_MAX_WAIT_MS 1000u
#define MAX_DOC_BLOCKS   4096u /* kernels/lkv_layout.h: documents up to 4096 blocks. */

typedef struct lease_doc {
    lkv_dockey key;      /* Pinned (or reserved) document. */
    uint32_t n_blocks;   /* Its blocks (for pinned_bytes). */
    uint64_t page_bytes; /* Its region's page size. */
    lkv_store_put *tx;   /* Reserved: the open put (owned); NULL once attached or committed. */
    int committing;      /* 1 while lkv_lease_commit runs tx's commit without the lock. */
    int scratch;         /* Reserved as scratch (passed the hot door): never committed. */
} lease_doc;

typedef struct waiter {
    lkv_dockey key;       /* The reserved key waited for. */
    lkv_lease_wake_fn fn; /* Called once when its reservation ends. */
    void *arg;            /* fn's. */
} waiter;

typedef struct lease {
    int in_use;                     /* 1 while live. */
    int owner;                      /* Tenant index. */
    uint8_t id[LKV_LEASE_ID_BYTES]; /* Random id. */
    uint64_t expires_mono_ms;       /* Monotonic expiry. */
    lease_doc *docs;                /* n_docs pinned documents (cap entries allocated). */
    uint32_t n_docs, cap;
    uint32_t committing; /* Commits running without the lock: not reaped, not
                          * released meanwhile (the slot and its entries stay). */
} lease;

struct lkv_lease_table {
    lkv_store *store;     /* Borrowed. */
    lkv_lease_limits lim; /* Limits. */
    pthread_mutex_t mu;   /* Guards everything below. */
    waiter *waiters;      /* n_waiters registered wake-ups (cap_waiters allocated). */
    uint32_t n_waiters, cap_waiters;
    pthread_cond_t cv;  /* Wakes the reaper (stop, or a nearer expiry). */
    lease *slots;       /* lim.max_leases slots. */
    lkv_lease_stats st; /* Counters (live, docs, pinned_bytes kept current). */
    int stop;           /* 1: the reaper exits. */
    pthread_t reaper;   /* The reaper thread. */

    lkv_stat_group *stats_group; /* Our stats in the store's registry. */
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A list of wake-ups taken out of the table, to run after unlocking. */
typedef struct wake_list {
    waiter *w;
    uint32_t n, cap;
} wake_list;

/* Moves the waiters of key into *wl. Lock held. */
static void wake_take(lkv_lease_table *t, const lkv_dockey *key, wake_list *wl)
{
    uint32_t j = 0;
    for (uint32_t i = 0; i < t->n_waiters; i++) {
        if (memcmp(t->waiters[i].key.b, key->b, LKV_DOCKEY_BYTES) == 0) {
            if (wl->n == wl->cap) {
                wl->cap = wl->cap ? wl->cap * 2 : 4;
                wl->w = lkv_xrealloc(wl->w, wl->cap * sizeof(*wl->w));
            }
            wl->w[wl->n++] = t->waiters[i];
        } else {
            t->waiters[j++] = t->waiters[i];
        }
    }
    t->st.waiting -= t->n_waiters - j;
    t->n_waiters = j;
}

/* Runs and frees the wake-ups of *wl (lock NOT held). */
static void wake_run(wake_list *wl)
{
    for (uint32_t i = 0; i < wl->n; i++) {
        wl->w[i].fn(wl->w[i].arg);
    }
    free(wl->w);
    wl->w = NULL;
    wl->n = wl->cap = 0;
}

/* Ends entry e of a lease: unpins an attached document, aborts a reservation (its waiters go
 * into wl). Lock held. */
static void entry_end(lkv_lease_table *t, lease_doc *e, wake_list *wl)
{
    uint64_t bytes = (uint64_t)e->n_blocks * e->page_bytes;
    if (e->tx != NULL) {
        lkv_store_put_abort(e->tx);
        e->tx = NULL;
        t->st.reserved--;
        t->st.reserved_bytes -= bytes;
        wake_take(t, &e->key, wl);
        return;
    }
    int rc = lkv_store_unpin(t->store, &e->key);
    if (rc != 0) {
        /* Pinned documents cannot be deleted or evicted: this is a bug. */
        LKV_LOGW("lease: unpin failed: %s", lkv_strerror(rc));
    }
    t->st.pinned_bytes -= bytes;
    t->st.docs--;
}

/* Unpins every document of l, aborts its reservations and frees the slot. Lock held. */
static uint32_t lease_end(lkv_lease_table *t, lease *l, wake_list *wl)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < l->n_docs; i++) {
        if (l->docs[i].tx != NULL) {
            t->st.resv_expired++;
        } else {
            n++;
        }
        entry_end(t, &l->docs[i], wl);
    }
    t->st.live--;
    free(l->docs);
    memset(l, 0, sizeof(*l));
    return n;
}

/* Finds the live lease id of owner, or NULL (unknown, expired or another owner's). Lock held. */
static lease *lease_find(lkv_lease_table *t, int owner, const uint8_t *id, uint64_t now)
{
    for (uint32_t i = 0; i < t->lim.max_leases; i++) {
        lease *l = &t->slots[i];
        if (l->in_use && sodium_memcmp(l->id, id, LKV_LEASE_ID_BYTES) == 0) {
            if (l->owner != owner || l->expires_mono_ms <= now) {
                return NULL;
            }
            return l;
        }
    }
    return NULL;
}

static int reap_locked(lkv_lease_table *t, uint64_t now, wake_list *wl)
{
    int n = 0;
    for (uint32_t i = 0; i < t->lim.max_leases; i++) {
        lease *l = &t->slots[i];
        if (l->in_use && l->expires_mono_ms <= now && l->committing == 0) {
            uint32_t docs = lease_end(t, l, wl);
            t->st.expired++;
            n++;
            LKV_LOGI("lease expired: %u document(s) unpinned", docs);
        }
    }
    return n;
}

static uint64_t next_expiry_locked(lkv_lease_table *t, uint64_t now)
{
    uint64_t next = now + REAP_MAX_WAIT_MS;
    for (uint32_t i = 0; i < t->lim.max_leases; i++) {
        if (t->slots[i].in_use && t->slots[i].expires_mono_ms < next) {
            next = t->slots[i].expires_mono_ms;
        }
    }
    return next;
}

static void *reaper_main(void *arg)
{
    lkv_lease_table *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        uint64_t now = mono_ms();
        wake_list wl = {0};
        reap_locked(t, now, &wl);
        if (wl.n > 0) {
            pthread_mutex_unlock(&t->mu);
            wake_run(&wl);
            pthread_mutex_lock(&t->mu);
            continue;
        }
        uint64_t next = next_expiry_locked(t, now);
        struct timespec ts = {.tv_sec = (time_t)(next / 1000u),
                              .tv_nsec = (long)(next % 1000u) * 1000000L};
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* The stats registered in the store's registry, in lkv_lease_stats order (section "leases"). */
static const lkv_stat_desc lease_stat_descs[] = {
    {"lease_live", NULL, LKV_STAT_GAUGE, "leases", "Live leases.", "leases", "live"},
    {"lease_docs_pinned", NULL, LKV_STAT_GAUGE, "docs", "Pins held by live leases.", "leases",
     "docs_pinned"},
    {"lease_bytes_pinned", NULL, LKV_STAT_GAUGE, "bytes", "Arena bytes of those documents.",
     "leases", "bytes_pinned"},
    {"lease_attaches", "result=new", LKV_STAT_COUNTER, "calls", "Attaches by result.", "leases",
     "attaches"},
    {"lease_attaches", "result=renewed", LKV_STAT_COUNTER, "calls", "Attaches by result.", "leases",
     "renewals"},
    {"lease_ends", "cause=released", LKV_STAT_COUNTER, "leases", "Leases ended, by cause.",
     "leases", "releases"},
    {"lease_ends", "cause=expired", LKV_STAT_COUNTER, "leases", "Leases ended, by cause.", "leases",
     "expired"},
    {"lease_attaches", "result=refused", LKV_STAT_COUNTER, "calls", "Attaches by result.", "leases",
     "refused"},
    {"lease_reserved", NULL, LKV_STAT_GAUGE, "docs", "Reservations (put in place) open now.",
     "leases", "reserved"},
    {"lease_reserved_bytes", NULL, LKV_STAT_GAUGE, "bytes", "Arena bytes reservations hold.",
     "leases", "reserved_bytes"},
    {"lease_reserves", "result=reserved", LKV_STAT_COUNTER, "calls", "Reserves by result.",
     "leases", "reserves"},
    {"lease_reservation_ends", "cause=committed", LKV_STAT_COUNTER, "docs",
     "Reservations ended, by cause.", "leases", "commits"},
    {"lease_reservation_ends", "cause=aborted", LKV_STAT_COUNTER, "docs",
     "Reservations ended, by cause.", "leases", "aborts"},
    {"lease_reservation_ends", "cause=expired", LKV_STAT_COUNTER, "docs",
     "Reservations ended, by cause.", "leases", "resv_expired"},
    {"lease_reserves", "result=busy", LKV_STAT_COUNTER, "calls", "Reserves by result.", "leases",
     "resv_busy"},
    {"lease_reserve_waiting", NULL, LKV_STAT_GAUGE, "calls",
     "Reserves waiting for another worker's reservation.", "leases", "waiting"},
};
#define N_LEASE_STATS ((int)(sizeof(lease_stat_descs) / sizeof(lease_stat_descs[0])))

static void lease_stats_read(void *ctx, double *vals, int n)
{
    lkv_lease_stats st;
    lkv_lease_stats_get(ctx, &st);
    const uint64_t v[N_LEASE_STATS] = {st.live,     st.docs,           st.pinned_bytes, st.attaches,
                                       st.renewals, st.releases,       st.expired,      st.refused,
                                       st.reserved, st.reserved_bytes, st.reserves,     st.commits,
                                       st.aborts,   st.resv_expired,   st.resv_busy,    st.waiting};
    for (int i = 0; i < n && i < N_LEASE_STATS; i++) {
        vals[i] = (double)v[i];
    }
}

int lkv_lease_table_create(lkv_store *store, const lkv_lease_limits *lim, lkv_lease_table **out)
{
    if (store == NULL || lim == NULL || out == NULL || lim->max_leases == 0 || lim->max_docs == 0 ||
        lim->max_ttl_ms == 0 || sodium_init() < 0) {
        return LKV_EINVAL;
    }
    lkv_lease_table *t = lkv_xcalloc(1, sizeof(*t));
    t->store = store;
    t->lim = *lim;
    t->slots = lkv_xcalloc(lim->max_leases, sizeof(*t->slots));
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = lkv_stats_register(lkv_store_stats_registry(store), lease_stat_descs, N_LEASE_STATS,
                                lease_stats_read, t, &t->stats_group);
    if (rc != 0) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        free(t->slots);
        free(t);
        return rc;
    }
    if (pthread_create(&t->reaper, NULL, reaper_main, t) != 0) {
        lkv_panic("lease: cannot start the reaper thread");
    }
    *out = t;
    return 0;
}

void lkv_lease_table_destroy(lkv_lease_table *t)
{
    if (t == NULL) {
        return;
    }
    lkv_stats_unregister(lkv_store_stats_registry(t->store), t->stats_group);
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->reaper, NULL);
    wake_list wl = {0};
    for (uint32_t i = 0; i < t->lim.max_leases; i++) {
        if (t->slots[i].in_use) {
            lease_end(t, &t->slots[i], &wl);
        }
    }
    wake_run(&wl);
    /* Waiters of reservations that never were (cannot happen: every waiter waits for a live
     * reservation) would be left here; run them too so nobody waits forever. */
    for (uint32_t i = 0; i < t->n_waiters; i++) {
        t->waiters[i].fn(t->waiters[i].arg);
    }
    free(t->waiters);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t->slots);
    free(t);
}

static int lease_has(const lease *l, uint32_t upto, const lkv_dockey *k)
{
    for (uint32_t i = 0; i < upto; i++) {
        if (memcmp(l->docs[i].key.b, k->b, LKV_DOCKEY_BYTES) == 0) {
            return 1;
        }
    }
    return 0;
}

/* The body of both attach calls. status == NULL: all-or-nothing (lkv_lease_attach). Else
 * partial (lkv_lease_attach_present): status[i] receives 0 (pinned), LKV_ENOTFOUND or LKV_ENOSPC
 * for a document that is skipped, and when nothing is pinned for a new lease no lease is made
 * (id_out zeroed, *lease_docs 0). */
static int attach_impl(lkv_lease_table *t, int owner, const uint8_t *id, uint32_t ttl_ms,
                       const lkv_dockey *keys, uint32_t n, uint8_t id_out[LKV_LEASE_ID_BYTES],
                       uint64_t *expires_unix_ms, uint32_t *lease_docs, lkv_lease_doc *out,
                       int *bad, int *status)
{
    int dummy;
    if (bad == NULL) {
        bad = &dummy;
    }
    *bad = -1;
    if (ttl_ms == 0 || ttl_ms > t->lim.max_ttl_ms || (id == NULL && n == 0) ||
        (n > 0 && (keys == NULL || out == NULL)) || n > t->lim.max_docs) {
        pthread_mutex_lock(&t->mu);
        t->st.refused++;
        pthread_mutex_unlock(&t->mu);
        return LKV_EINVAL;
    }
    memset(out, 0, n * sizeof(*out));
    int rc = 0;
    wake_list wl = {0};
    uint32_t *tmp = lkv_xmalloc(MAX_DOC_BLOCKS * sizeof(uint32_t));
    pthread_mutex_lock(&t->mu);
    uint64_t now = mono_ms();
    lease *l = NULL;
    lease fresh;
    memset(&fresh, 0, sizeof(fresh));
    if (id != NULL) {
        l = lease_find(t, owner, id, now);
        if (l == NULL) {
            rc = LKV_ENOTFOUND;
            goto out;
        }
    } else {
        if (t->st.live >= t->lim.max_leases) {
            reap_locked(t, now, &wl); /* Expired leases must not block new ones. */
        }
        if (t->st.live >= t->lim.max_leases) {
            rc = LKV_ENOSPC;
            goto out;
        }
        l = &fresh;
    }
    /* Count the documents the lease would hold (new, distinct keys). */
    uint32_t old_n = l->n_docs;
    uint32_t add = 0;
    for (uint32_t i = 0; i < n; i++) {
        int dup = lease_has(l, old_n, &keys[i]);
        for (uint32_t j = 0; j < i && !dup; j++) {
            dup = memcmp(keys[j].b, keys[i].b, LKV_DOCKEY_BYTES) == 0;
        }
        add += !dup;
    }
    if ((uint64_t)old_n + add > t->lim.max_docs) {
        rc = LKV_EINVAL;
        goto out;
    }
    if (old_n + add > l->cap) {
        l->cap = old_n + add;
        l->docs = lkv_xrealloc(l->docs, l->cap * sizeof(*l->docs));
    }
    /* Pin the new documents; read the pages of every document (a temporary extra pin for the
     * ones already held, dropped at once). On failure undo this call's pins. */
    uint32_t new_n = old_n;
    uint32_t i;
    uint32_t skipped = 0;
    for (i = 0; i < n; i++) {
        lkv_doc_info info;
        rc = lkv_store_pin(t->store, &keys[i], tmp, MAX_DOC_BLOCKS, &info);
        if (status != NULL) {
            status[i] = rc;
            if (rc == LKV_ENOTFOUND || rc == LKV_ENOSPC) {
                skipped++; /* Partial mode: a miss for the worker, not an error. */
                rc = 0;
                continue;
            }
        }
        if (rc != 0) {
            break;
        }
        if (info.n_blocks > MAX_DOC_BLOCKS || info.profile == NULL) {
            lkv_store_unpin(t->store, &keys[i]);
            rc = info.profile == NULL ? LKV_EPROFILE : LKV_EINTERNAL;
            break;
        }
        out[i].info = info;
        out[i].pages = lkv_xmalloc((info.n_blocks ? info.n_blocks : 1) * sizeof(uint32_t));
        memcpy(out[i].pages, tmp, info.n_blocks * sizeof(uint32_t));
        if (lease_has(l, new_n, &keys[i])) {
            lkv_store_unpin(t->store, &keys[i]); /* Already pinned once by this lease. */
        } else {
            l->docs[new_n].key = keys[i];
            l->docs[new_n].n_blocks = info.n_blocks;
            l->docs[new_n].page_bytes = info.page_bytes;
            l->docs[new_n].tx = NULL;
            new_n++;
        }
    }
    if (rc != 0) {
        *bad = (int)i;
        for (uint32_t j = old_n; j < new_n; j++) {
            lkv_store_unpin(t->store, &l->docs[j].key);
        }
        for (uint32_t j = 0; j < n; j++) {
            free(out[j].pages);
            out[j].pages = NULL;
        }
        if (l == &fresh) {
            free(fresh.docs);
        }
        goto out;
    }
    assert(new_n == old_n + add || status != NULL);
    if (status != NULL && l == &fresh && new_n == 0) {
        /* Partial mode, nothing present: no lease is made. */
        free(fresh.docs);
        memset(id_out, 0, LKV_LEASE_ID_BYTES);
        if (expires_unix_ms != NULL) {
            *expires_unix_ms = 0;
        }
        if (lease_docs != NULL) {
            *lease_docs = 0;
        }
        (void)skipped;
        goto out;
    }
    for (uint32_t j = old_n; j < new_n; j++) {
        t->st.pinned_bytes += (uint64_t)l->docs[j].n_blocks * l->docs[j].page_bytes;
    }
    t->st.docs += new_n - old_n;
    l->n_docs = new_n;
    l->expires_mono_ms = now + ttl_ms;
    if (l == &fresh) {
        lease *slot = NULL;
        for (uint32_t s = 0; s < t->lim.max_leases && slot == NULL; s++) {
            if (!t->slots[s].in_use) {
                slot = &t->slots[s];
            }
        }
        assert(slot != NULL);
        fresh.in_use = 1;
        fresh.owner = owner;
        randombytes_buf(fresh.id, sizeof(fresh.id));
        *slot = fresh;
        l = slot;
        t->st.live++;
        t->st.attaches++;
        pthread_cond_signal(&t->cv); /* The reaper may need to wake earlier. */
    } else {
        t->st.renewals++;
    }
    memcpy(id_out, l->id, LKV_LEASE_ID_BYTES);
    if (expires_unix_ms != NULL) {
        *expires_unix_ms = wall_ms() + ttl_ms;
    }
    if (lease_docs != NULL) {
        *lease_docs = l->n_docs;
    }
out:
    if (rc != 0) {
        t->st.refused++;
    }
    pthread_mutex_unlock(&t->mu);
    wake_run(&wl);
    free(tmp);
    return rc;
}

/* ---- reservations (put in place) ----------------------------------------------------------- */

/* The entry of key in l (reserved only if reserved), or NULL. */
static lease_doc *entry_find(lease *l, const lkv_dockey *key, int reserved)
{
    for (uint32_t i = 0; i < l->n_docs; i++) {
        if (memcmp(l->docs[i].key.b, key->b, LKV_DOCKEY_BYTES) == 0 &&
            (!reserved || l->docs[i].tx != NULL)) {
            return &l->docs[i];
        }
    }
    return NULL;
}

/* Removes entry e of l (already ended). */
static void entry_remove(lease *l, lease_doc *e)
{
    *e = l->docs[--l->n_docs];
}

/* The live reservation of key in any lease, or NULL. Lock held (expired leases reaped). */
static lease_doc *reservation_find(lkv_lease_table *t, const lkv_dockey *key, lease **owner)
{
    for (uint32_t i = 0; i < t->lim.max_leases; i++) {
        lease *l = &t->slots[i];
        lease_doc *e = l->in_use ? entry_find(l, key, 1) : NULL;
        if (e != NULL) {
            *owner = l;
            return e;
        }
    }
    return NULL;
}

/* Puts the new lease fresh into a free slot (there is one: checked by the caller). */
static lease *lease_install(lkv_lease_table *t, lease *fresh, int owner)
{
    lease *slot = NULL;
    for (uint32_t s = 0; s < t->lim.max_leases && slot == NULL; s++) {
        if (!t->slots[s].in_use) {
            slot = &t->slots[s];
        }
    }
    assert(slot != NULL);
    fresh->in_use = 1;
    fresh->owner = owner;
    randombytes_buf(fresh->id, sizeof(fresh->id));
    *slot = *fresh;
    t->st.live++;
    t->st.attaches++;
    pthread_cond_signal(&t->cv); /* The reaper may need to wake earlier. */
    return slot;
}

static void doc_out(lkv_lease_doc *out, const lkv_doc_info *info, const uint32_t *pages)
{
    out->info = *info;
    out->pages = lkv_xmalloc((info->n_blocks ? info->n_blocks : 1) * sizeof(uint32_t));
    memcpy(out->pages, pages, info->n_blocks * sizeof(uint32_t));
}

int lkv_lease_reserve(lkv_lease_table *t, int owner, const uint8_t *id, uint32_t ttl_ms,
                      const uint8_t *salt, const lkv_profile *profile, const uint32_t *tokens,
                      uint32_t n_tokens, lkv_lease_wake_fn wake, void *wake_arg,
                      uint8_t id_out[LKV_LEASE_ID_BYTES], uint64_t *expires_unix_ms,
                      uint32_t *lease_docs, lkv_dockey *key, int *present, lkv_lease_doc *out)
{
    return lkv_lease_reserve_ex(t, owner, id, ttl_ms, salt, profile, tokens, n_tokens, 0, wake,
                                wake_arg, id_out, expires_unix_ms, lease_docs, key, present, out);
}

int lkv_lease_reserve_ex(lkv_lease_table *t, int owner, const uint8_t *id, uint32_t ttl_ms,
                         const uint8_t *salt, const lkv_profile *profile, const uint32_t *tokens,
                         uint32_t n_tokens, int scratch, lkv_lease_wake_fn wake, void *wake_arg,
                         uint8_t id_out[LKV_LEASE_ID_BYTES], uint64_t *expires_unix_ms,
                         uint32_t *lease_docs, lkv_dockey *key, int *present, lkv_lease_doc *out)
{
    memset(out, 0, sizeof(*out));
    *present = 0;
    if (ttl_ms == 0 || ttl_ms > t->lim.max_ttl_ms || salt == NULL || profile == NULL ||
        tokens == NULL || n_tokens == 0) {
        return LKV_EINVAL;
    }
    lkv_dockey k;
    lkv_dockey_compute(salt, profile->fingerprint, tokens, n_tokens, &k);
    *key = k;
    int rc = 0;
    wake_list wl = {0};
    uint32_t *tmp = lkv_xmalloc(MAX_DOC_BLOCKS * sizeof(uint32_t));
    lease fresh;
    memset(&fresh, 0, sizeof(fresh));
    pthread_mutex_lock(&t->mu);
    uint64_t now = mono_ms();
    reap_locked(t, now, &wl); /* An expired reservation must not hold the key. */
    lease *l = NULL;
    if (id != NULL) {
        l = lease_find(t, owner, id, now);
        if (l == NULL) {
            rc = LKV_ENOTFOUND;
            goto out;
        }
    } else {
        if (t->st.live >= t->lim.max_leases) {
            rc = LKV_ENOSPC;
            goto out;
        }
        l = &fresh;
    }
    lease_doc *mine = entry_find(l, &k, 0);
    if (mine != NULL && mine->tx != NULL) {
        rc = LKV_EEXIST;
        goto out;
    }
    lease *other = NULL;
    if (mine == NULL && reservation_find(t, &k, &other) != NULL) {
        t->st.resv_busy++;
        if (wake != NULL) {
            if (t->n_waiters == t->cap_waiters) {
                t->cap_waiters = t->cap_waiters ? t->cap_waiters * 2 : 16;
                t->waiters = lkv_xrealloc(t->waiters, t->cap_waiters * sizeof(*t->waiters));
            }
            t->waiters[t->n_waiters++] = (waiter){.key = k, .fn = wake, .arg = wake_arg};
            t->st.waiting++;
        }
        rc = LKV_EINPROGRESS;
        goto out;
    }
    if (mine == NULL && l->n_docs + 1 > t->lim.max_docs) {
        rc = LKV_EINVAL;
        goto out;
    }
    lkv_doc_info info;
    lkv_store_put *tx = NULL;
    for (int attempt = 0;; attempt++) {
        rc = lkv_store_pin(t->store, &k, tmp, MAX_DOC_BLOCKS, &info);
        if (rc == 0) {
            break; /* Present: attach it. */
        }
        if (rc != LKV_ENOTFOUND || attempt == 3) {
            goto out;
        }
        int exists = 0;
        lkv_put_opts po = {.scratch = scratch != 0};
        rc = lkv_store_put_begin_ex(t->store, salt, profile->name, tokens, n_tokens, &po, &tx, NULL,
                                    &exists);
        if (rc != 0) {
            goto out;
        }
        if (!exists) {
            /* The pages now (a Put by copy may reserve at its first block): they are written
             * in place. */
            rc = lkv_store_put_reserve(tx);
            if (rc != 0) {
                lkv_store_put_abort(tx);
                tx = NULL;
                goto out;
            }
            break;
        }
        lkv_store_put_abort(tx); /* Stored meanwhile: attach it instead. */
        tx = NULL;
    }
    if (tx == NULL && (info.n_blocks > MAX_DOC_BLOCKS || info.profile == NULL)) {
        lkv_store_unpin(t->store, &k);
        rc = info.profile == NULL ? LKV_EPROFILE : LKV_EINTERNAL;
        goto out;
    }
    if (tx != NULL) {
        lkv_store_region rg;
        memset(&info, 0, sizeof(info));
        info.n_tokens = n_tokens;
        info.n_blocks = lkv_store_put_n_blocks(tx);
        info.block_bytes = lkv_store_put_block_bytes(tx);
        info.profile = profile;
        info.region = lkv_store_put_region(tx);
        if (lkv_store_region_get(t->store, info.region, &rg) != 0) {
            lkv_panic("lease: reservation in an unknown region");
        }
        info.page_bytes = rg.page_bytes;
        memcpy(tmp, lkv_store_put_pages(tx), info.n_blocks * sizeof(uint32_t));
    }
    doc_out(out, &info, tmp);
    *present = tx == NULL;
    if (mine != NULL) {
        lkv_store_unpin(t->store, &k); /* Already attached by this lease: one pin. */
    } else {
        if (l->n_docs + 1 > l->cap) {
            l->cap = l->cap ? l->cap * 2 : 4;
            l->docs = lkv_xrealloc(l->docs, l->cap * sizeof(*l->docs));
        }
        l->docs[l->n_docs++] = (lease_doc){.key = k,
                                           .n_blocks = info.n_blocks,
                                           .page_bytes = info.page_bytes,
                                           .tx = tx,
                                           .scratch = tx != NULL && scratch};
        uint64_t bytes = (uint64_t)info.n_blocks * info.page_bytes;
        if (tx != NULL) {
            t->st.reserved++;
            t->st.reserved_bytes += bytes;
            t->st.reserves++;
        } else {
            t->st.docs++;
            t->st.pinned_bytes += bytes;
        }
    }
    l->expires_mono_ms = now + ttl_ms;
    if (l == &fresh) {
        l = lease_install(t, &fresh, owner);
    } else {
        t->st.renewals++;
    }
    memcpy(id_out, l->id, LKV_LEASE_ID_BYTES);
    if (expires_unix_ms != NULL) {
        *expires_unix_ms = wall_ms() + ttl_ms;
    }
    if (lease_docs != NULL) {
        *lease_docs = l->n_docs;
    }
out:
    if (rc != 0 && l == &fresh) {
        free(fresh.docs);
    }
    pthread_mutex_unlock(&t->mu);
    wake_run(&wl);
    free(tmp);
    return rc;
}

int lkv_lease_commit(lkv_lease_table *t, int owner, const uint8_t *id, const lkv_dockey *key,
                     lkv_lease_doc *out, int *kept_other)
{
    int dummy;
    if (kept_other == NULL) {
        kept_other = &dummy;
    }
    *kept_other = 0;
    memset(out, 0, sizeof(*out));
    if (id == NULL || key == NULL) {
        return LKV_EINVAL;
    }
    wake_list wl = {0};
    uint32_t *tmp = lkv_xmalloc(MAX_DOC_BLOCKS * sizeof(uint32_t));
    pthread_mutex_lock(&t->mu);
    int rc = LKV_ENOTFOUND;
    lease *l = lease_find(t, owner, id, mono_ms());
    lease_doc *e = l != NULL ? entry_find(l, key, 1) : NULL;
    if (e == NULL) {
        goto out;
    }
    if (e->committing) {
        rc = LKV_EBUSY; /* Another Commit of it is running. */
        goto out;
    }
    if (e->scratch) {
        rc = LKV_EPERM; /* It passed the hot door as scratch: it must not become a document. */
        goto out;
    }
    /* The commit (a synced RocksDB write in write-through) runs without the table lock: the
     * lease is kept (not reaped, not released) and the key stays reserved meanwhile. */
    lkv_store_put *tx = e->tx;
    uint32_t first = lkv_store_put_pages(tx) != NULL ? lkv_store_put_pages(tx)[0] : 0;
    e->committing = 1;
    l->committing++;
    pthread_mutex_unlock(&t->mu);
    lkv_doc_info info;
    rc = lkv_store_put_commit_written(tx, tmp, MAX_DOC_BLOCKS, &info);
    pthread_mutex_lock(&t->mu);
    l->committing--;
    e = entry_find(l, key, 1); /* l->docs may have grown meanwhile. */
    assert(e != NULL && e->committing && e->tx == tx);
    e->committing = 0;
    if (rc == LKV_EINVAL) {
        goto out; /* The check failed: nothing changed, the reservation stays open. */
    }
    /* The put is finished either way (freed by the store). */
    e->tx = NULL;
    t->st.reserved--;
    t->st.reserved_bytes -= (uint64_t)e->n_blocks * e->page_bytes;
    wake_take(t, key, &wl);
    if (rc != 0) {
        t->st.aborts++;
        entry_remove(l, e);
        goto out;
    }
    /* Now an attached document of the lease, holding the pin the commit took. */
    e->n_blocks = info.n_blocks;
    e->page_bytes = info.page_bytes;
    t->st.docs++;
    t->st.pinned_bytes += (uint64_t)info.n_blocks * info.page_bytes;
    t->st.commits++;
    *kept_other = tmp[0] != first || info.promoted;
    doc_out(out, &info, tmp);
out:
    pthread_mutex_unlock(&t->mu);
    wake_run(&wl);
    free(tmp);
    return rc;
}

int lkv_lease_abort(lkv_lease_table *t, int owner, const uint8_t *id, const lkv_dockey *key)
{
    if (id == NULL || key == NULL) {
        return LKV_EINVAL;
    }
    wake_list wl = {0};
    pthread_mutex_lock(&t->mu);
    int rc = LKV_ENOTFOUND;
    lease *l = lease_find(t, owner, id, mono_ms());
    lease_doc *e = l != NULL ? entry_find(l, key, 1) : NULL;
    if (e != NULL && e->committing) {
        rc = LKV_EBUSY; /* Its Commit is running: it ends by itself. */
    } else if (e != NULL) {
        entry_end(t, e, &wl);
        entry_remove(l, e);
        t->st.aborts++;
        rc = 0;
    }
    pthread_mutex_unlock(&t->mu);
    wake_run(&wl);
    return rc;
}

int lkv_lease_attach(lkv_lease_table *t, int owner, const uint8_t *id, uint32_t ttl_ms,
                     const lkv_dockey *keys, uint32_t n, uint8_t id_out[LKV_LEASE_ID_BYTES],
                     uint64_t *expires_unix_ms, uint32_t *lease_docs, lkv_lease_doc *out, int *bad)
{
    return attach_impl(t, owner, id, ttl_ms, keys, n, id_out, expires_unix_ms, lease_docs, out, bad,
                       NULL);
}

int lkv_lease_attach_present(lkv_lease_table *t, int owner, const uint8_t *id, uint32_t ttl_ms,
                             const lkv_dockey *keys, uint32_t n, uint8_t id_out[LKV_LEASE_ID_BYTES],
                             uint64_t *expires_unix_ms, uint32_t *lease_docs, lkv_lease_doc *out,
                             int *status, int *bad)
{
    if (status == NULL) {
        return LKV_EINVAL;
    }
    for (uint32_t i = 0; i < n; i++) {
        status[i] = LKV_ENOTFOUND;
    }
    return attach_impl(t, owner, id, ttl_ms, keys, n, id_out, expires_unix_ms, lease_docs, out, bad,
                       status);
}

int lkv_lease_release(lkv_lease_table *t, int owner, const uint8_t *id, uint32_t *released)
{
    if (id == NULL) {
        return LKV_EINVAL;
    }
    pthread_mutex_lock(&t->mu);
    lease *l = lease_find(t, owner, id, mono_ms());
    int rc = LKV_ENOTFOUND;
    wake_list wl = {0};
    if (l != NULL && l->committing > 0) {
        rc = LKV_EBUSY; /* A Commit in it is running: release after it replies. */
    } else if (l != NULL) {
        uint32_t n = lease_end(t, l, &wl);
        t->st.releases++;
        if (released != NULL) {
            *released = n;
        }
        rc = 0;
    }
    pthread_mutex_unlock(&t->mu);
    wake_run(&wl);
    return rc;
}

int lkv_lease_reap(lkv_lease_table *t)
{
    wake_list wl = {0};
    pthread_mutex_lock(&t->mu);
    int n = reap_locked(t, mono_ms(), &wl);
    pthread_mutex_unlock(&t->mu);
    wake_run(&wl);
    return n;
}

void lkv_lease_stats_get(lkv_lease_table *t, lkv_lease_stats *out)
{
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    pthread_mutex_unlock(&t->mu);
}

const lkv_lease_limits *lkv_lease_limits_get(const lkv_lease_table *t)
{
    return &t->lim;
}
