/*
 * lkv_tenancy.c: the live tenant view (contract in lkv_tenancy.h).
 *
 * The current table is one atomic pointer (cur); every table ever published stays in `tables`
 * until destroy, so a tenant pointer a call holds never dangles. Per-slot state lives in fixed
 * arrays of LKV_TENANCY_SLOTS entries: the services get the arrays once, at start. A slot's
 * name is written once, before any table naming the slot is published, then published with a
 * release store of n_named (readers of names[] acquire it: lkv_tenancy_named), and never
 * changes. Slots are assigned only on the main thread (create, reload).
 *
 * Token buckets: one per slot, under the slot's mutex (a few arithmetic operations per call);
 * capacity = rate (one second's worth), refilled continuously from CLOCK_MONOTONIC. The rates
 * themselves are read from the caller's tenant entry, so a reload changes them at once.
 */
#include "lkv_tenancy.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lkv_err.h"
#include "lkv_dockey.h"
#include "lkv_log.h"

typedef struct bucket {
    pthread_mutex_t mu; /* Guards the fields below. */
    double calls;       /* Tokens of the call bucket. */
    double bytes;       /* Tokens of the byte bucket. */
    int64_t t_calls;    /* Last refill of each (monotonic ns); 0 = never (starts full). */
    int64_t t_bytes;
} bucket;

typedef struct slot_stats {
    lkv_stat_group *g;           /* This slot's registration, or NULL. */
    _Atomic uint64_t throttled;  /* Calls refused by rate_calls or rate_bytes. */
    _Atomic uint64_t over_quota; /* Puts refused by a capacity quota. */
    _Atomic uint64_t evicted;    /* Own documents evicted or demoted to make room. */
} slot_stats;

typedef struct table_node {
    lkv_auth *auth;
    struct table_node *next;
} table_node;

struct lkv_tenancy {
    _Atomic(lkv_auth *) cur;       /* The table calls are admitted with. */
    atomic_int n_named;            /* Slots whose names are published (release/acquire). */
    table_node *tables;            /* Every table published (owned), newest first. */
    atomic_int allow_plain_tokens; /* allow_plaintext_tokens. */
    int isolate;                   /* Tenants configured at start. */
    int n_slots;                   /* Slots in use (1 + names seen). */
    char names_buf[LKV_TENANCY_SLOTS][LKV_TENANT_NAME_MAX]; /* Slot names. */
    const char *names[LKV_TENANCY_SLOTS];                   /* Pointers into names_buf. */
    uint8_t salts[LKV_TENANCY_SLOTS][LKV_AUTH_SALT_BYTES];  /* Salt each slot was made with. */
    lkv_wirekey wire[LKV_TENANCY_SLOTS];
    lkv_tenant_lookups lookups[LKV_TENANCY_SLOTS];
    bucket buckets[LKV_TENANCY_SLOTS];
    slot_stats sst[LKV_TENANCY_SLOTS];
    uint8_t secret[LKV_WIREKEY_SECRET_BYTES]; /* Wire-key secret (wiped at destroy). */
    lkv_stats *stats;                         /* Borrowed, or NULL. */
    lkv_stat_group *reload_group;             /* Reload counters (owned cells), or NULL. */
    lkv_store *store;                         /* Borrowed, or NULL. */
    lkv_config started;                       /* The config at create: what runs. */
    lkv_config last;                          /* The config last applied (tenant diffs). */
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- Per-tenant stats --------------------------------------------------------------------- */

enum {
    TS_HITS_HOT,
    TS_HITS_COLD,
    TS_MISSES,
    TS_HIT_BLOCKS_HOT,
    TS_HIT_BLOCKS_COLD,
    TS_MISS_BLOCKS,
    TS_THROTTLED,
    TS_OVER_QUOTA,
    TS_EVICTED,
    TS_USED_HOT,
    TS_USED_COLD,
    TS_DOCS,
    TS_QUOTA_HOT,
    TS_QUOTA_COLD,
    TS_QUOTA_DOCS,
    TS__N
};

typedef struct slot_ref {
    lkv_tenancy *t;
    int slot;
} slot_ref;

static void slot_read(void *ctx, double *v, int n)
{
    const slot_ref *r = ctx;
    const lkv_tenant_lookups *l = &r->t->lookups[r->slot];
    const slot_stats *ss = &r->t->sst[r->slot];
    if (n < TS__N) {
        return;
    }
    v[TS_HITS_HOT] = (double)atomic_load(&l->hits_hot);
    v[TS_HITS_COLD] = (double)atomic_load(&l->hits_cold);
    v[TS_MISSES] = (double)atomic_load(&l->misses);
    v[TS_HIT_BLOCKS_HOT] = (double)atomic_load(&l->hit_blocks_hot);
    v[TS_HIT_BLOCKS_COLD] = (double)atomic_load(&l->hit_blocks_cold);
    v[TS_MISS_BLOCKS] = (double)atomic_load(&l->miss_blocks);
    v[TS_THROTTLED] = (double)atomic_load(&ss->throttled);
    v[TS_OVER_QUOTA] = (double)atomic_load(&ss->over_quota);
    v[TS_EVICTED] = (double)atomic_load(&ss->evicted);
    if (r->t->store != NULL) {
        lkv_store_usage u;
        lkv_store_usage_get(r->t->store, r->t->salts[r->slot], &u);
        v[TS_USED_HOT] = (double)u.hot_bytes;
        v[TS_USED_COLD] = (double)u.cold_bytes;
        v[TS_DOCS] = (double)u.docs;
    }
    const lkv_auth *a = atomic_load(&r->t->cur);
    const lkv_tenant *tn = r->slot == 0 ? NULL : lkv_auth_find(a, r->t->names_buf[r->slot]);
    v[TS_QUOTA_HOT] = tn != NULL ? (double)tn->max_hot_bytes : 0.0;
    v[TS_QUOTA_COLD] = tn != NULL ? (double)tn->max_cold_bytes : 0.0;
    v[TS_QUOTA_DOCS] = tn != NULL ? (double)tn->max_docs : 0.0;
}

/* Registers slot i's counters (labels tenant=NAME). */
static void slot_register(lkv_tenancy *t, slot_ref *ref)
{
    if (t->stats == NULL) {
        return;
    }
    int i = ref->slot;
    char l[TS__N][LKV_STAT_TEXT_MAX + 1];
    static const char *const tier[TS__N] = {"hot",  "cold", NULL,  "hot",  "cold",
                                            NULL,   NULL,   NULL,  NULL,   "hot",
                                            "cold", NULL,   "hot", "cold", NULL};
    for (int k = 0; k < TS__N; k++) {
        if (tier[k] != NULL) {
            snprintf(l[k], sizeof(l[k]), "tenant=%s,tier=%s", t->names[i], tier[k]);
        } else {
            snprintf(l[k], sizeof(l[k]), "tenant=%s", t->names[i]);
        }
    }
    lkv_stat_desc d[TS__N] = {
        {"tenant_hits", l[0], LKV_STAT_COUNTER, "docs",
         "Lookups of the tenant that found the document, by tier.", NULL, NULL},
        {"tenant_hits", l[1], LKV_STAT_COUNTER, "docs",
         "Lookups of the tenant that found the document, by tier.", NULL, NULL},
        {"tenant_misses", l[2], LKV_STAT_COUNTER, "docs",
         "Lookups of the tenant that did not find the document.", NULL, NULL},
        {"tenant_hit_blocks", l[3], LKV_STAT_COUNTER, "blocks",
         "Blocks of the documents the tenant's lookups found, by tier.", NULL, NULL},
        {"tenant_hit_blocks", l[4], LKV_STAT_COUNTER, "blocks",
         "Blocks of the documents the tenant's lookups found, by tier.", NULL, NULL},
        {"tenant_miss_blocks", l[5], LKV_STAT_COUNTER, "blocks",
         "Blocks of the documents the tenant's token lookups did not find.", NULL, NULL},
        {"tenant_throttled", l[6], LKV_STAT_COUNTER, "calls",
         "Calls refused by the tenant's rate_calls or rate_bytes (RESOURCE_EXHAUSTED).", NULL,
         NULL},
        {"tenant_over_quota", l[7], LKV_STAT_COUNTER, "calls",
         "Puts refused by the tenant's capacity quotas (RESOURCE_EXHAUSTED).", NULL, NULL},
        {"tenant_quota_evictions", l[8], LKV_STAT_COUNTER, "docs",
         "The tenant's own documents evicted or demoted to keep it within its quotas.", NULL, NULL},
        {"tenant_bytes_used", l[9], LKV_STAT_GAUGE, "bytes",
         "Bytes the tenant's documents hold, by tier (documents put since start).", NULL, NULL},
        {"tenant_bytes_used", l[10], LKV_STAT_GAUGE, "bytes",
         "Bytes the tenant's documents hold, by tier (documents put since start).", NULL, NULL},
        {"tenant_docs", l[11], LKV_STAT_GAUGE, "docs",
         "Visible documents of the tenant (put since start).", NULL, NULL},
        {"tenant_quota_bytes", l[12], LKV_STAT_GAUGE, "bytes",
         "The tenant's max_hot_bytes / max_cold_bytes (0: unlimited).", NULL, NULL},
        {"tenant_quota_bytes", l[13], LKV_STAT_GAUGE, "bytes",
         "The tenant's max_hot_bytes / max_cold_bytes (0: unlimited).", NULL, NULL},
        {"tenant_quota_docs", l[14], LKV_STAT_GAUGE, "docs",
         "The tenant's max_docs (0: unlimited).", NULL, NULL},
    };
    if (lkv_stats_register(t->stats, d, TS__N, slot_read, ref, &t->sst[i].g) != 0) {
        LKV_LOGW("tenancy: tenant %s has no statistics (registration refused)", t->names[i]);
    }
}

/* ---- Tables and slots --------------------------------------------------------------------- */

static slot_ref *refs_of(lkv_tenancy *t);

/* Finds or assigns the slot of name (salt: the salt it comes with). -1 if none is free. */
static int slot_of(lkv_tenancy *t, const char *name, const uint8_t *salt, int *is_new)
{
    *is_new = 0;
    for (int i = 1; i < t->n_slots; i++) {
        if (strcmp(t->names_buf[i], name) == 0) {
            return i;
        }
    }
    if (t->n_slots == LKV_TENANCY_SLOTS) {
        return -1;
    }
    /* A slot past the published ones: no call can reach it until publish() names it. */
    int i = t->n_slots;
    snprintf(t->names_buf[i], sizeof(t->names_buf[i]), "%s", name);
    memcpy(t->salts[i], salt, LKV_AUTH_SALT_BYTES);
    lkv_wirekey_init(&t->wire[i], t->secret, salt, !t->isolate);
    *is_new = 1;
    return i;
}

/* Builds a table from c with slots assigned (new names get slots; their stats registered once
 * the table is published by the caller: *first_new..n_slots). */
static int build(lkv_tenancy *t, const lkv_config *c, lkv_auth **out, int *first_new, char *err,
                 size_t errlen)
{
    lkv_auth *a = NULL;
    *first_new = t->n_slots;
    if (lkv_auth_create(c->have_auth_key ? c->auth_key : NULL, c->loopback_roles, &a) != 0) {
        snprintf(err, errlen, "tenants: cannot create the tenant table (libsodium)");
        return LKV_ECONFIG;
    }
    int n_slots = t->n_slots;
    for (int i = 0; i < c->n_tenants; i++) {
        lkv_tenant tn = c->tenants[i];
        int fresh = 0;
        for (int k = 1; k < t->n_slots; k++) {
            if (strcmp(t->names_buf[k], tn.name) == 0 &&
                memcmp(t->salts[k], tn.salt, LKV_AUTH_SALT_BYTES) != 0) {
                lkv_auth_destroy(a);
                t->n_slots = n_slots;
                snprintf(err, errlen,
                         "tenant \"%s\": salt: cannot change while the daemon runs (its "
                         "documents are keyed with it): restart lazykvd to change it",
                         tn.name);
                return LKV_ECONFIG;
            }
        }
        int s = slot_of(t, tn.name, tn.salt, &fresh);
        if (s < 0) {
            lkv_auth_destroy(a);
            t->n_slots = n_slots;
            snprintf(err, errlen, "tenants: more than %d distinct tenant names since start",
                     LKV_TENANCY_SLOTS - 1);
            return LKV_ECONFIG;
        }
        if (fresh) {
            t->n_slots++;
        }
        tn.t_slot = s;
        char msg[LKV_CONFIG_ERR_MAX];
        if (lkv_auth_add(a, &tn, msg, (int)sizeof(msg)) != 0) {
            lkv_auth_destroy(a);
            t->n_slots = n_slots; /* Names written past n_slots are dead text. */
            snprintf(err, errlen, "%s", msg);
            return LKV_ECONFIG;
        }
    }
    *out = a;
    return 0;
}

static void publish(lkv_tenancy *t, lkv_auth *a, int first_new)
{
    table_node *n = lkv_xcalloc(1, sizeof(*n));
    n->auth = a;
    n->next = t->tables;
    t->tables = n;
    for (int i = first_new; i < t->n_slots; i++) {
        t->names[i] = t->names_buf[i]; /* Before the table naming the slot is published. */
    }
    atomic_store_explicit(&t->n_named, t->n_slots, memory_order_release);
    atomic_store(&t->cur, a);
    slot_ref *refs = refs_of(t);
    for (int i = first_new; i < t->n_slots; i++) {
        refs[i].t = t;
        refs[i].slot = i;
        slot_register(t, &refs[i]);
    }
}

/* The slot refs live after the struct (one allocation). */
static slot_ref *refs_of(lkv_tenancy *t)
{
    return (slot_ref *)(t + 1);
}

int lkv_tenancy_create(const lkv_config *c, lkv_stats *stats, lkv_store *store, lkv_tenancy **out,
                       char *err, size_t errlen)
{
    lkv_tenancy *t = lkv_xcalloc(1, sizeof(*t) + sizeof(slot_ref) * LKV_TENANCY_SLOTS);
    t->stats = stats;
    t->store = store;
    t->isolate = c->n_tenants > 0;
    atomic_init(&t->allow_plain_tokens, c->allow_plaintext_tokens);
    for (int i = 0; i < LKV_TENANCY_SLOTS; i++) {
        pthread_mutex_init(&t->buckets[i].mu, NULL);
    }
    /* The wire-key secret: the cluster's shared one (wirekey_secret_file, the same on every
     * member) or this data dir's own. */
    if (t->isolate &&
        (c->wirekey_secret_file[0]
             ? lkv_wirekey_secret_load_shared(c->wirekey_secret_file, c->data_dir, t->secret)
             : lkv_wirekey_secret_load(c->data_dir, t->secret)) != 0) {
        snprintf(err, errlen, "option 'data_dir': cannot load the wire-key secret in %s",
                 c->data_dir);
        lkv_tenancy_destroy(t);
        return LKV_EIO;
    }
    /* Slot 0: the default tenant. */
    snprintf(t->names_buf[0], sizeof(t->names_buf[0]), "%s", LKV_AUTH_DEFAULT_TENANT);
    t->names[0] = t->names_buf[0];
    lkv_tenant_salt_default(t->salts[0]);
    lkv_wirekey_init(&t->wire[0], t->secret, t->salts[0], !t->isolate);
    t->n_slots = 1;
    lkv_auth *a = NULL;
    int first_new = 0;
    int rc = build(t, c, &a, &first_new, err, errlen);
    if (rc != 0) {
        lkv_tenancy_destroy(t);
        return rc;
    }
    publish(t, a, 0);
    if (stats != NULL) {
        static const lkv_stat_desc rd[4] = {
            {"config_reloads", "result=applied", LKV_STAT_COUNTER, "reloads",
             "SIGHUP reloads by result.", "reloads", "applied"},
            {"config_reloads", "result=refused", LKV_STAT_COUNTER, "reloads",
             "SIGHUP reloads by result.", "reloads", "refused"},
            {"config_last_reload_successful", NULL, LKV_STAT_GAUGE, NULL,
             "1 if the last reload was applied, 0 if it was refused (1 before any).", "reloads",
             "last_successful"},
            {"config_last_reload_timestamp_seconds", NULL, LKV_STAT_GAUGE, NULL,
             "Time (Unix) of the last reload, applied or refused (0: none yet).", "reloads",
             "last_time"},
        };
        if (lkv_stats_register(stats, rd, 4, NULL, NULL, &t->reload_group) == 0) {
            lkv_stat_set(lkv_stat_group_cell(t->reload_group, 2), 1);
        }
    }
    t->started = *c;
    t->last = *c;
    *out = t;
    return 0;
}

void lkv_tenancy_destroy(lkv_tenancy *t)
{
    if (t == NULL) {
        return;
    }
    if (t->stats != NULL) {
        lkv_stats_unregister(t->stats, t->reload_group);
    }
    for (int i = 0; i < LKV_TENANCY_SLOTS; i++) {
        if (t->stats != NULL && t->sst[i].g != NULL) {
            lkv_stats_unregister(t->stats, t->sst[i].g);
        }
        pthread_mutex_destroy(&t->buckets[i].mu);
    }
    for (table_node *n = t->tables, *nx; n != NULL; n = nx) {
        nx = n->next;
        lkv_auth_destroy(n->auth);
        free(n);
    }
    memset(t->secret, 0, sizeof(t->secret));
    free(t);
}

/* ---- Reload ------------------------------------------------------------------------------- */

/* Logs every option that differs between a and b and cannot change live. */
static void log_restart_only(const lkv_config *a, const lkv_config *b)
{
#define SAME_STR(f) (strcmp(a->f, b->f) == 0)
#define SAME(f)     (memcmp(&a->f, &b->f, sizeof(a->f)) == 0)
    static const char *const fmt = "reload: option '%s' changed: it cannot change while the "
                                   "daemon runs; restart lazykvd to apply it (still %s)";
    char v[64];
    if (!SAME_STR(listen)) {
        LKV_LOGW(fmt, "listen", a->listen);
    }
    if (!SAME_STR(data_dir)) {
        LKV_LOGW(fmt, "data_dir", a->data_dir);
    }
    if (!SAME_STR(metrics_listen)) {
        LKV_LOGW(fmt, "metrics_listen", a->metrics_listen[0] ? a->metrics_listen : "none");
    }
    if (!SAME(metrics_tls)) {
        LKV_LOGW(fmt, "metrics_tls", a->metrics_tls ? "true" : "false");
    }
    /* Residency class holds are applied at start (an Admin Hold changes them live). */
    if (!SAME_STR(hold_profiles)) {
        LKV_LOGW(fmt, "hold_profiles", a->hold_profiles[0] ? a->hold_profiles : "\"\"");
    }
    if (!SAME_STR(hold_tenants)) {
        LKV_LOGW(fmt, "hold_tenants", a->hold_tenants[0] ? a->hold_tenants : "\"\"");
    }
    if ((a->tls_cert_file[0] != '\0') != (b->tls_cert_file[0] != '\0') ||
        (a->tls_client_ca_file[0] != '\0') != (b->tls_client_ca_file[0] != '\0')) {
        LKV_LOGW(fmt,
                 "tls_cert_file / tls_client_ca_file (turning TLS or client certificates on "
                 "or off)",
                 a->tls_cert_file[0] ? "on" : "off");
    }
    struct {
        const char *name;
        int same;
        uint64_t val;
    } nums[] = {
        {"hot_backend", SAME(hot_backend), (uint64_t)a->hot_backend},
        {"cuda_device", SAME(cuda_device), (uint64_t)a->cuda_device},
        {"hot_bytes", SAME(hot_bytes), a->hot_bytes},
        {"cold_bytes", SAME(cold_bytes), a->cold_bytes},
        {"policy", SAME(policy_kind), (uint64_t)a->policy_kind},
        {"policy_cost", SAME(policy_cost_bytes), (uint64_t)a->policy_cost_bytes},
        {"durability", SAME(durability), (uint64_t)a->durability},
        {"threads", SAME(threads), (uint64_t)a->threads},
        {"pool_threads", SAME(pool_threads), (uint64_t)a->pool_threads},
        {"max_message_bytes", SAME(max_message_bytes), a->max_message_bytes},
        {"shutdown_grace", SAME(shutdown_grace_ms), a->shutdown_grace_ms},
        {"evicted_memory", SAME(evicted_memory), a->evicted_memory},
        {"cold_min_blob_bytes", SAME(cold_min_blob_bytes), a->cold_min_blob_bytes},
        {"allow_insecure_bind", SAME(allow_insecure_bind), (uint64_t)a->allow_insecure_bind},
        {"max_leases", SAME(max_leases), a->max_leases},
        {"max_lease_docs", SAME(max_lease_docs), a->max_lease_docs},
        {"max_lease_ttl", SAME(max_lease_ttl_ms), a->max_lease_ttl_ms},
        {"profiles ([profile NAME] sections)",
         a->n_profiles == b->n_profiles &&
             memcmp(a->profiles, b->profiles, sizeof(a->profiles[0]) * (size_t)a->n_profiles) == 0,
         (uint64_t)a->n_profiles},
    };
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        if (!nums[i].same) {
            snprintf(v, sizeof(v), "%" PRIu64, nums[i].val);
            LKV_LOGW(fmt, nums[i].name, v);
        }
    }
#undef SAME
#undef SAME_STR
}

/* Reload counters: cells 0 applied, 1 refused, 2 last result (1 ok), 3 its time (Unix s). */
static void reload_note(lkv_tenancy *t, int ok)
{
    if (t->reload_group == NULL) {
        return;
    }
    lkv_stat_add(lkv_stat_group_cell(t->reload_group, ok ? 0 : 1), 1);
    lkv_stat_set(lkv_stat_group_cell(t->reload_group, 2), ok ? 1 : 0);
    lkv_stat_set(lkv_stat_group_cell(t->reload_group, 3), (uint64_t)time(NULL));
}

void lkv_tenancy_reload_refused(lkv_tenancy *t)
{
    reload_note(t, 0);
}

static int reload(lkv_tenancy *t, const lkv_config *c, char *err, size_t errlen);

int lkv_tenancy_reload(lkv_tenancy *t, const lkv_config *c, char *err, size_t errlen)
{
    int rc = reload(t, c, err, errlen);
    reload_note(t, rc == 0);
    return rc;
}

static int reload(lkv_tenancy *t, const lkv_config *c, char *err, size_t errlen)
{
    if ((c->n_tenants > 0) != t->isolate) {
        snprintf(err, errlen,
                 "tenants: the daemon started %s [tenant NAME] sections; turning tenants %s "
                 "needs a restart (wire-key isolation is chosen at start)",
                 t->isolate ? "with" : "without", t->isolate ? "off" : "on");
        return LKV_ECONFIG;
    }
    lkv_auth *a = NULL;
    int first_new = 0;
    int rc = build(t, c, &a, &first_new, err, errlen);
    if (rc != 0) {
        return rc;
    }
    const lkv_auth *old = atomic_load(&t->cur);
    int added = 0, removed = 0, changed = 0;
    for (int i = 0; i < c->n_tenants; i++) {
        const lkv_tenant *o = lkv_auth_find(old, c->tenants[i].name);
        const lkv_tenant *n = lkv_auth_find(a, c->tenants[i].name);
        if (o == NULL) {
            added++;
            LKV_LOGI("reload: tenant %s added", n->name);
        } else if (memcmp(o->token_hash, n->token_hash, sizeof(o->token_hash)) != 0 ||
                   o->roles != n->roles || o->max_hot_bytes != n->max_hot_bytes ||
                   o->max_cold_bytes != n->max_cold_bytes || o->max_docs != n->max_docs ||
                   o->rate_calls != n->rate_calls || o->rate_bytes != n->rate_bytes) {
            changed++;
            LKV_LOGI("reload: tenant %s changed (token, roles, quotas or rates)", n->name);
        }
    }
    for (int i = 0; i < t->last.n_tenants; i++) {
        if (lkv_auth_find(a, t->last.tenants[i].name) == NULL) {
            removed++;
            LKV_LOGI("reload: tenant %s removed: its token is refused from now on",
                     t->last.tenants[i].name);
        }
    }
    log_restart_only(&t->started, c); /* Still named on every reload until a restart. */
    publish(t, a, first_new);
    atomic_store(&t->allow_plain_tokens, c->allow_plaintext_tokens);
    LKV_LOGI("reload: %d tenant(s) now (%d added, %d removed, %d changed)", lkv_auth_count(a),
             added, removed, changed);
    t->last = *c;
    return 0;
}

/* ---- Admission and rates ------------------------------------------------------------------ */

/* Takes one unit of cost from a bucket of rate per second (capacity: rate). Returns 0, or the
 * milliseconds until cost is available. */
static uint64_t take(double *tokens, int64_t *last, uint64_t rate, double cost)
{
    int64_t now = now_ns();
    double cap = (double)rate;
    if (*last == 0) {
        *tokens = cap;
    } else {
        *tokens += (double)(now - *last) * 1e-9 * (double)rate;
        if (*tokens > cap) {
            *tokens = cap;
        }
    }
    *last = now;
    if (cost > cap) {
        cost = cap; /* A request larger than the burst waits for a full bucket, then passes. */
    }
    if (*tokens >= cost) {
        *tokens -= cost;
        return 0;
    }
    double wait_s = (cost - *tokens) / (double)rate;
    uint64_t ms = (uint64_t)(wait_s * 1000.0) + 1;
    return ms;
}

static int throttled(lkv_tenancy *t, lkv_rpc *rpc, const lkv_tenant *tn, const char *what,
                     uint64_t limit, const char *unit, uint64_t ms)
{
    atomic_fetch_add(&t->sst[tn->t_slot].throttled, 1);
    lkv_rpc_set_retry_after(rpc, ms);
    return lkv_rpc_errorf(rpc, LKV_ERATE,
                          "tenant %s is over its %s limit (%" PRIu64 " %s per second): retry in "
                          "%" PRIu64 " ms (trailing metadata retry-after-ms)",
                          tn->name, what, limit, unit, ms);
}

int lkv_tenancy_check(const lkv_tenancy *t, const char *authz, int loopback, int secure,
                      uint32_t need, const lkv_tenant **out, char *err, size_t errlen)
{
    const lkv_auth *auth = atomic_load(&t->cur);
    const lkv_tenant *tn = NULL;
    if (out != NULL) {
        *out = NULL;
    }
    if (authz != NULL && !loopback && !secure && !atomic_load(&t->allow_plain_tokens)) {
        snprintf(err, errlen,
                 "bearer token refused: it was sent in clear text from a "
                 "non-loopback peer; connect with TLS (the daemon's tls_cert_file) "
                 "or set allow_plaintext_tokens = true on a trusted network; "
                 "treat this token as exposed and rotate it");
        return LKV_EUNAUTH;
    }
    int rc = lkv_auth_check(auth, authz, authz != NULL ? strlen(authz) : 0, loopback, need, &tn,
                            err, (int)errlen);
    if (out != NULL) {
        *out = tn;
    }
    return rc;
}

int lkv_tenancy_admit(void *ctx, lkv_rpc *rpc)
{
    lkv_tenancy *t = ctx;
    /* gRPC's default metadata limit is 8 KiB, so a header that is present always fits and is
     * never mistaken for an absent one. */
    char buf[8192 + 1], msg[256];
    const char *path = lkv_rpc_method(rpc);
    const lkv_tenant *tn = NULL;
    int count = lkv_rpc_metadata_count(rpc, "authorization");
    int n = lkv_rpc_metadata(rpc, "authorization", buf, sizeof(buf));
    if (count > 1 || (count == 1 && n < 0)) {
        /* Never fall back to anonymous for a header that is present but unusable. */
        return lkv_rpc_errorf(rpc, LKV_EUNAUTH, "malformed credentials: %s",
                              count > 1 ? "the authorization header was sent more than once"
                                        : "the authorization header is too long");
    }
    if (n >= 0 && memchr(buf, '\0', (size_t)n) != NULL) {
        return lkv_rpc_errorf(rpc, LKV_EUNAUTH, "malformed authorization metadata: a NUL byte");
    }
    int loopback = lkv_auth_peer_is_loopback(lkv_rpc_peer(rpc));
    uint32_t need = lkv_auth_method_roles(path, strlen(path));
    int rc = lkv_tenancy_check(t, n >= 0 ? buf : NULL, loopback, lkv_rpc_transport_secure(rpc),
                               need, &tn, msg, sizeof(msg));
    if (rc < 0) {
        return lkv_rpc_errorf(rpc, rc, "%s", msg);
    }
    if (need != 0 && tn->rate_calls > 0) {
        bucket *b = &t->buckets[tn->t_slot];
        pthread_mutex_lock(&b->mu);
        uint64_t ms = take(&b->calls, &b->t_calls, tn->rate_calls, 1.0);
        pthread_mutex_unlock(&b->mu);
        if (ms > 0) {
            return throttled(t, rpc, tn, "rate_calls", tn->rate_calls, "calls", ms);
        }
    }
    lkv_rpc_set_principal(rpc, tn);
    return 0;
}

int lkv_tenancy_charge_bytes(void *ctx, lkv_rpc *rpc, uint64_t n)
{
    lkv_tenancy *t = ctx;
    const lkv_tenant *tn = lkv_rpc_principal(rpc);
    if (tn == NULL || tn->rate_bytes == 0 || n == 0) {
        return 0;
    }
    bucket *b = &t->buckets[tn->t_slot];
    pthread_mutex_lock(&b->mu);
    uint64_t ms = take(&b->bytes, &b->t_bytes, tn->rate_bytes, (double)n);
    pthread_mutex_unlock(&b->mu);
    return ms > 0 ? throttled(t, rpc, tn, "rate_bytes", tn->rate_bytes, "bytes", ms) : 0;
}

/* ---- Accessors ---------------------------------------------------------------------------- */

int lkv_tenancy_index(const void *ctx, const void *principal)
{
    (void)ctx;
    return principal != NULL ? ((const lkv_tenant *)principal)->t_slot : 0;
}

static const uint8_t *salt_of(const void *principal)
{
    return ((const lkv_tenant *)principal)->salt;
}

void lkv_tenancy_wire_cache(lkv_tenancy *t, lkv_cache_svc *cache)
{
    cache->salt_of = salt_of;
    cache->index_of = lkv_tenancy_index;
    cache->index_ctx = t;
    cache->n_tenants = LKV_TENANCY_SLOTS;
    cache->wire = t->wire;
    cache->lookups = t->lookups;
    cache->quota_ctx = t;
    cache->charge_bytes = lkv_tenancy_charge_bytes;
    cache->check_put = lkv_tenancy_check_put;
}

lkv_tenant_lookups *lkv_tenancy_lookups(lkv_tenancy *t)
{
    return t->lookups;
}

int lkv_tenancy_named(const void *t)
{
    return atomic_load_explicit(&((lkv_tenancy *)t)->n_named, memory_order_acquire);
}

const char **lkv_tenancy_names(lkv_tenancy *t)
{
    return t->names;
}

int lkv_tenancy_isolated(const lkv_tenancy *t)
{
    return t->isolate;
}

const lkv_auth *lkv_tenancy_auth(const lkv_tenancy *t)
{
    return atomic_load(&((lkv_tenancy *)t)->cur);
}

int lkv_tenancy_count(const lkv_tenancy *t)
{
    return lkv_auth_count(atomic_load(&((lkv_tenancy *)t)->cur));
}

/* Refuses a put over quota what (value limit, need bytes or documents). */
static int over_quota(lkv_tenancy *t, lkv_rpc *rpc, const lkv_tenant *tn, const char *what,
                      uint64_t limit, uint64_t used, uint64_t need, const char *why)
{
    atomic_fetch_add(&t->sst[tn->t_slot].over_quota, 1);
    return lkv_rpc_errorf(rpc, LKV_EQUOTA,
                          "tenant %s: the put needs %" PRIu64
                          " more (%s) and the tenant holds %" PRIu64 " of its %s = %" PRIu64 ": %s",
                          tn->name, need, strcmp(what, "max_docs") == 0 ? "documents" : "bytes",
                          used, what, limit, why);
}

int lkv_tenancy_check_put(void *ctx, lkv_rpc *rpc, const char *profile, const uint32_t *tokens,
                          uint32_t n_tokens)
{
    lkv_tenancy *t = ctx;
    const lkv_tenant *tn = lkv_rpc_principal(rpc);
    if (t->store == NULL || tn == NULL ||
        (tn->max_hot_bytes == 0 && tn->max_cold_bytes == 0 && tn->max_docs == 0)) {
        return 0;
    }
    const lkv_profile *p = lkv_store_profile_find(t->store, profile != NULL ? profile : "");
    if (p == NULL || n_tokens == 0 || tokens == NULL) {
        return 0; /* The store refuses it, with its reason. */
    }
    lkv_dockey key;
    lkv_dockey_compute(tn->salt, p->fingerprint, tokens, n_tokens, &key);
    if (lkv_store_tier(t->store, &key) != LKV_TIER_NONE) {
        return 0; /* Already stored: the put adds nothing. */
    }
    uint64_t n_blocks = (n_tokens + (uint64_t)p->shape.block_tokens - 1) / p->shape.block_tokens;
    lkv_store_usage u;
    lkv_store_usage_get(t->store, tn->salt, &u);
    /* Hot bytes are the pages of the profile's own arena region (DESIGN.md 4). */
    uint64_t page_bytes = u.page_bytes;
    lkv_store_region rg;
    for (int r = 0; lkv_store_region_get(t->store, r, &rg) == 0; r++) {
        if (rg.profile == p) {
            page_bytes = rg.page_bytes;
            break;
        }
    }
    uint64_t hot_need = n_blocks * page_bytes;
    uint64_t cold_need = n_blocks * lkv_block_bytes(&p->shape);
    if (tn->max_hot_bytes != 0 && hot_need > tn->max_hot_bytes) {
        return over_quota(t, rpc, tn, "max_hot_bytes", tn->max_hot_bytes, u.hot_bytes, hot_need,
                          "the document alone is larger than the quota");
    }
    if (tn->max_cold_bytes != 0 && cold_need > tn->max_cold_bytes) {
        return over_quota(t, rpc, tn, "max_cold_bytes", tn->max_cold_bytes, u.cold_bytes, cold_need,
                          "the document alone is larger than the quota");
    }
    /* Make room among the tenant's own documents, oldest first (bounded: each step frees one). */
    for (int step = 0; step < 4096; step++) {
        lkv_store_usage_get(t->store, tn->salt, &u);
        int hot_over = tn->max_hot_bytes != 0 && u.hot_bytes + hot_need > tn->max_hot_bytes;
        int cold_over = tn->max_cold_bytes != 0 && u.cold_bytes + cold_need > tn->max_cold_bytes;
        int docs_over = tn->max_docs != 0 && u.docs + 1 > tn->max_docs;
        if (!hot_over && !cold_over && !docs_over) {
            return 0;
        }
        lkv_dockey victim;
        int rc;
        if (hot_over) {
            rc = lkv_store_usage_oldest(t->store, tn->salt, LKV_TIER_HOT, &victim);
            if (rc == 0) {
                rc = lkv_store_demote(t->store, &victim);
            }
        } else {
            rc = lkv_store_usage_oldest(t->store, tn->salt, LKV_TIER_COLD, &victim);
            if (rc == 0) {
                rc = lkv_store_delete(t->store, &victim);
            }
        }
        if (rc == 0) {
            atomic_fetch_add(&t->sst[tn->t_slot].evicted, 1);
            continue;
        }
        if (rc == LKV_ENOTFOUND &&
            lkv_store_usage_oldest(t->store, tn->salt, hot_over ? LKV_TIER_HOT : LKV_TIER_COLD,
                                   &victim) == 0) {
            continue; /* That one went meanwhile; another is there. */
        }
        if (hot_over) {
            return over_quota(t, rpc, tn, "max_hot_bytes", tn->max_hot_bytes, u.hot_bytes, hot_need,
                              "its hot documents are pinned, held or being read");
        }
        if (cold_over) {
            return over_quota(t, rpc, tn, "max_cold_bytes", tn->max_cold_bytes, u.cold_bytes,
                              cold_need, "its documents are pinned, held or being written");
        }
        return over_quota(t, rpc, tn, "max_docs", tn->max_docs, u.docs, 1,
                          "its documents are pinned, held or being written");
    }
    return over_quota(t, rpc, tn, "max_docs", tn->max_docs, u.docs, 1, "no room could be made");
}
