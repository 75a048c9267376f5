/*
 * lkv_lease.c: the lease table (see lkv_lease.h).
 *
 * Layout: a fixed array of max_leases slots allocated at create (a slot is free when its
 * n_docs is 0 and in_use is 0); each live lease owns a growable array of (key, n_blocks)
 * entries. Lookups by id are a linear scan: max_leases is small (default 1024) and attach is
 * not on the per-token path. The reaper thread waits on a condition variable bound to the
 * monotonic clock until the earliest expiry (at most REAP_MAX_WAIT_MS), then releases every
 * expired lease; lkv_lease_table_destroy wakes it to stop.
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
    lkv_dockey key;    /* Pinned document. */
    uint32_t n_blocks; /* Its blocks (for pinned_bytes). */
} lease_doc;

typedef struct lease {
    int in_use;                     /* 1 while live. */
    int owner;                      /* Tenant index. */
    uint8_t id[LKV_LEASE_ID_BYTES]; /* Random id. */
    uint64_t expires_mono_ms;       /* Monotonic expiry. */
    lease_doc *docs;                /* n_docs pinned documents (cap entries allocated). */
    uint32_t n_docs, cap;
} lease;

struct lkv_lease_table {
    lkv_store *store;     /* Borrowed. */
    lkv_lease_limits lim; /* Limits. */
    uint64_t page_bytes;  /* Arena page size (for pinned_bytes). */
    pthread_mutex_t mu;   /* Guards everything below. */
    pthread_cond_t cv;    /* Wakes the reaper (stop, or a nearer expiry). */
    lease *slots;         /* lim.max_leases slots. */
    lkv_lease_stats st;   /* Counters (live, docs, pinned_bytes kept current). */
    int stop;             /* 1: the reaper exits. */
    pthread_t reaper;     /* The reaper thread. */

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

/* Unpins every document of l and frees the slot. Lock held. */
static uint32_t lease_end(lkv_lease_table *t, lease *l)
{
    uint32_t n = l->n_docs;
    for (uint32_t i = 0; i < l->n_docs; i++) {
        int rc = lkv_store_unpin(t->store, &l->docs[i].key);
        if (rc != 0) {
            /* Pinned documents cannot be deleted or evicted: this is a bug. */
            LKV_LOGW("lease: unpin failed: %s", lkv_strerror(rc));
        }
        t->st.pinned_bytes -= (uint64_t)l->docs[i].n_blocks * t->page_bytes;
    }
    t->st.docs -= n;
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

static int reap_locked(lkv_lease_table *t, uint64_t now)
{
    int n = 0;
    for (uint32_t i = 0; i < t->lim.max_leases; i++) {
        lease *l = &t->slots[i];
        if (l->in_use && l->expires_mono_ms <= now) {
            uint32_t docs = lease_end(t, l);
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
        reap_locked(t, now);
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
};

static void lease_stats_read(void *ctx, double *vals, int n)
{
    lkv_lease_stats st;
    lkv_lease_stats_get(ctx, &st);
    const uint64_t v[8] = {st.live,     st.docs,     st.pinned_bytes, st.attaches,
                           st.renewals, st.releases, st.expired,      st.refused};
    for (int i = 0; i < n && i < 8; i++) {
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
    lkv_store_arena_info ai;
    lkv_store_arena_info_get(store, &ai);
    t->page_bytes = ai.page_bytes;
    t->slots = lkv_xcalloc(lim->max_leases, sizeof(*t->slots));
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = lkv_stats_register(lkv_store_stats_registry(store), lease_stat_descs,
                                (int)(sizeof(lease_stat_descs) / sizeof(lease_stat_descs[0])),
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
    for (uint32_t i = 0; i < t->lim.max_leases; i++) {
        if (t->slots[i].in_use) {
            lease_end(t, &t->slots[i]);
        }
    }
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
            reap_locked(t, now); /* Expired leases must not block new ones. */
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
        t->st.pinned_bytes += (uint64_t)l->docs[j].n_blocks * t->page_bytes;
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
    free(tmp);
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
    if (l != NULL) {
        uint32_t n = lease_end(t, l);
        t->st.releases++;
        if (released != NULL) {
            *released = n;
        }
        rc = 0;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int lkv_lease_reap(lkv_lease_table *t)
{
    pthread_mutex_lock(&t->mu);
    int n = reap_locked(t, mono_ms());
    pthread_mutex_unlock(&t->mu);
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
