/*
 * lkv_store.c: the block store's public API (contract in lkv_store.h; internals, invariants
 * and locking in lkv_store_int.h).
 *
 * This file validates arguments, takes the store lock and strings the index
 * (lkv_store_index.c) and the tier engine (lkv_store_tier.c) together for each call: open
 * and close, lookups (the only place hits and misses are counted), put transactions, reads,
 * delete, pins, demote, foreach and the counters. Block copies of puts and gets run here
 * without the lock, on docs the caller's transaction or read handle pins.
 */
#include "lkv_store.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "lkv_arena.h"
#include "lkv_store_int.h"

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int lkv_hot_backend_parse(const char *s, int *out)
{
    static const char *const names[] = {"auto", "host", "cuda"};
    for (int i = 0; i < 3; i++) {
        if (s != NULL && strcmp(s, names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return LKV_EINVAL;
}

const char *lkv_hot_backend_name(int b)
{
    return b == LKV_HOT_AUTO   ? "auto"
           : b == LKV_HOT_HOST ? "host"
           : b == LKV_HOT_CUDA ? "cuda"
                               : "unknown";
}

int lkv_durability_parse(const char *s, int *out)
{
    if (s != NULL && strcmp(s, "write-back") == 0) {
        *out = LKV_DURABILITY_WRITE_BACK;
        return 0;
    }
    if (s != NULL && strcmp(s, "write-through") == 0) {
        *out = LKV_DURABILITY_WRITE_THROUGH;
        return 0;
    }
    return LKV_EINVAL;
}

const char *lkv_durability_name(int m)
{
    return m == LKV_DURABILITY_WRITE_BACK      ? "write-back"
           : m == LKV_DURABILITY_WRITE_THROUGH ? "write-through"
                                               : "unknown";
}

int lkv_hot_admission_parse(const char *s, int *out)
{
    if (s != NULL && strcmp(s, "always") == 0) {
        *out = LKV_HOT_ADMIT_ALWAYS;
        return 0;
    }
    if (s != NULL && strcmp(s, "door") == 0) {
        *out = LKV_HOT_ADMIT_DOOR;
        return 0;
    }
    return LKV_EINVAL;
}

const char *lkv_hot_admission_name(int m)
{
    return m == LKV_HOT_ADMIT_ALWAYS ? "always" : m == LKV_HOT_ADMIT_DOOR ? "door" : "unknown";
}

const char *lkv_miss_cause_name(int c)
{
    static const char *const names[LKV_MISS__COUNT] = {"none",    "never",   "evicted", "deleted",
                                                       "profile", "corrupt", "lost",    "expired"};
    return c >= 0 && c < LKV_MISS__COUNT ? names[c] : "unknown";
}

/* ---- the stats registration ------------------------------------------------------------- */

/* Values that are not a field of lkv_store_stats. */
enum { V_FIELD, V_BUDGET, V_RATIO_DOCS, V_RATIO_BLOCKS };

/* One registered stat: where its value comes from, and its description. Admin Stats shows them
 * in this order. */
typedef struct store_stat {
    int src;         /* V_*. */
    size_t off;      /* V_FIELD, V_BUDGET: offset of the uint64_t in lkv_store_stats. */
    lkv_stat_desc d; /* Name, labels, kind, unit, help, section, key. */
} store_stat;

#define FLD(f)   V_FIELD, offsetof(lkv_store_stats, f)
#define CAUSE(c) V_FIELD, offsetof(lkv_store_stats, misses_by_cause) + sizeof(uint64_t) * (c)
#define D(nm, lb, kd, un, hl, sc, ky)                                                              \
    {                                                                                              \
        .name = nm, .labels = lb, .kind = kd, .unit = un, .help = hl, .section = sc, .key = ky     \
    }

static const store_stat store_stats[] = {
    {FLD(hot_docs), D("store_docs", "tier=hot", LKV_STAT_GAUGE, "docs",
                      "Visible documents in the tier.", "hot", "docs")},
    {FLD(hot_blocks), D("store_blocks", "tier=hot", LKV_STAT_GAUGE, "blocks",
                        "Blocks of the visible documents in the tier.", "hot", "blocks")},
    {FLD(hot_bytes),
     D("store_bytes_used", "tier=hot", LKV_STAT_GAUGE, "bytes",
       "Bytes held in the tier (hot: documents, in-flight puts, readers).", "hot", "bytes_used")},
    {FLD(hot_bytes_pinned),
     D("store_bytes_pinned", "tier=hot", LKV_STAT_GAUGE, "bytes",
       "Hot bytes pinned (pins, reads, in-flight puts).", "hot", "bytes_pinned")},
    {FLD(hot_budget), D("store_bytes_budget", "tier=hot", LKV_STAT_GAUGE, "bytes",
                        "Budget of the tier (0: unlimited).", "hot", "bytes_budget")},
    {FLD(hot_page_bytes), D("store_page_bytes", NULL, LKV_STAT_GAUGE, "bytes",
                            "Bytes of one arena page.", "hot", "page_bytes")},
    {FLD(hot_pages_total),
     D("store_pages_total", NULL, LKV_STAT_GAUGE, "pages", "Arena pages.", "hot", "pages_total")},
    {FLD(hot_pages_free), D("store_pages_free", NULL, LKV_STAT_GAUGE, "pages", "Arena pages free.",
                            "hot", "pages_free")},
    {FLD(cold_docs), D("store_docs", "tier=cold", LKV_STAT_GAUGE, "docs",
                       "Visible documents in the tier.", "cold", "docs")},
    {FLD(cold_blocks), D("store_blocks", "tier=cold", LKV_STAT_GAUGE, "blocks",
                         "Blocks of the visible documents in the tier.", "cold", "blocks")},
    {FLD(cold_bytes), D("store_bytes_used", "tier=cold", LKV_STAT_GAUGE, "bytes",
                        "Bytes held in the tier (cold: block payload).", "cold", "bytes_used")},
    {V_BUDGET, offsetof(lkv_store_stats, cold_budget),
     D("store_bytes_budget", "tier=cold", LKV_STAT_GAUGE, "bytes",
       "Budget of the tier (0: unlimited).", "cold", "bytes_budget")},
    {FLD(hits_hot),
     D("store_hits", "tier=hot", LKV_STAT_COUNTER, "docs",
       "Lookups that found the document, by the tier it was in.", "lookups", "hits_hot")},
    {FLD(hits_cold),
     D("store_hits", "tier=cold", LKV_STAT_COUNTER, "docs",
       "Lookups that found the document, by the tier it was in.", "lookups", "hits_cold")},
    {FLD(misses), D("store_lookup_misses", NULL, LKV_STAT_COUNTER, "docs",
                    "Lookups that did not find the document.", "lookups", "misses")},
    {FLD(hit_blocks_hot), D("store_hit_blocks", "tier=hot", LKV_STAT_COUNTER, "blocks",
                            "Blocks of the documents lookups found.", "lookups", "hit_blocks_hot")},
    {FLD(hit_blocks_cold),
     D("store_hit_blocks", "tier=cold", LKV_STAT_COUNTER, "blocks",
       "Blocks of the documents lookups found.", "lookups", "hit_blocks_cold")},
    {FLD(miss_blocks),
     D("store_miss_blocks", NULL, LKV_STAT_COUNTER, "blocks",
       "Blocks of the documents token lookups did not find.", "lookups", "miss_blocks")},
    {CAUSE(LKV_MISS_NEVER), D("store_misses", "cause=never", LKV_STAT_COUNTER, "docs",
                              "Lookup misses by cause.", "lookups", "misses_never")},
    {CAUSE(LKV_MISS_EVICTED), D("store_misses", "cause=evicted", LKV_STAT_COUNTER, "docs",
                                "Lookup misses by cause.", "lookups", "misses_evicted")},
    {CAUSE(LKV_MISS_DELETED), D("store_misses", "cause=deleted", LKV_STAT_COUNTER, "docs",
                                "Lookup misses by cause.", "lookups", "misses_deleted")},
    {CAUSE(LKV_MISS_PROFILE), D("store_misses", "cause=profile", LKV_STAT_COUNTER, "docs",
                                "Lookup misses by cause.", "lookups", "misses_profile")},
    {CAUSE(LKV_MISS_CORRUPT), D("store_misses", "cause=corrupt", LKV_STAT_COUNTER, "docs",
                                "Lookup misses by cause.", "lookups", "misses_corrupt")},
    {CAUSE(LKV_MISS_LOST), D("store_misses", "cause=lost", LKV_STAT_COUNTER, "docs",
                             "Lookup misses by cause.", "lookups", "misses_lost")},
    {CAUSE(LKV_MISS_EXPIRED), D("store_misses", "cause=expired", LKV_STAT_COUNTER, "docs",
                                "Lookup misses by cause.", "lookups", "misses_expired")},
    {V_RATIO_DOCS, 0,
     D("store_hit_ratio", "by=docs", LKV_STAT_GAUGE, "ratio",
       "Hits / lookups since start (0 before the first).", "lookups", "hit_rate_docs")},
    {V_RATIO_BLOCKS, 0,
     D("store_hit_ratio", "by=blocks", LKV_STAT_GAUGE, "ratio",
       "Hit blocks / looked-up blocks since start.", "lookups", "hit_rate_blocks")},
    {FLD(evictions_hot),
     D("store_evictions", "tier=hot", LKV_STAT_COUNTER, "docs",
       "Documents evicted from the tier by its budget.", "movement", "evictions_hot")},
    {FLD(evictions_cold),
     D("store_evictions", "tier=cold", LKV_STAT_COUNTER, "docs",
       "Documents evicted from the tier by its budget.", "movement", "evictions_cold")},
    {FLD(demotions), D("store_demotions", NULL, LKV_STAT_COUNTER, "docs",
                       "Hot victims written to the cold tier.", "movement", "demotions")},
    {FLD(drops), D("store_drops", NULL, LKV_STAT_COUNTER, "docs",
                   "Hot victims lost (the cold tier could not take them).", "movement", "drops")},
    {FLD(promotions), D("store_promotions", NULL, LKV_STAT_COUNTER, "docs",
                        "Cold documents copied into the hot tier.", "movement", "promotions")},
    {FLD(expired), D("store_expired", NULL, LKV_STAT_COUNTER, "docs",
                     "Documents dropped when their TTL ran out.", "movement", "expired")},
    {FLD(class_evictions), D("store_class_evictions", NULL, LKV_STAT_COUNTER, "docs",
                             "Documents evicted or purged by tenant or profile (Admin EvictClass).",
                             "movement", "class_evictions")},
    {FLD(hot_bytes_held), D("store_bytes_held", "tier=hot", LKV_STAT_GAUGE, "bytes",
                            "Hot bytes of held documents (Admin Hold).", "hot", "bytes_held")},
    {FLD(puts), D("store_puts", "result=stored", LKV_STAT_COUNTER, "docs",
                  "Finished puts by result.", "puts", "puts")},
    {FLD(puts_existing), D("store_puts", "result=existing", LKV_STAT_COUNTER, "docs",
                           "Finished puts by result.", "puts", "puts_existing")},
    {FLD(puts_aborted), D("store_puts", "result=aborted", LKV_STAT_COUNTER, "docs",
                          "Finished puts by result.", "puts", "puts_aborted")},
    {FLD(hot_admit_refused),
     D("store_hot_admit_refused", NULL, LKV_STAT_COUNTER, "docs",
       "Door refusals of new documents, puts and reservations (hot_admission = door).", "puts",
       "hot_admit_refused")},
    {FLD(puts_cold_only), D("store_puts_cold_only", NULL, LKV_STAT_COUNTER, "docs",
                            "Puts the hot door refused that were stored in the cold tier only.",
                            "puts", "puts_cold_only")},
    {FLD(puts_declined),
     D("store_puts_declined", NULL, LKV_STAT_COUNTER, "docs",
       "Puts the hot door refused that the cold tier could not take (declined).", "puts",
       "puts_declined")},
    {FLD(puts_inflight), D("store_puts_inflight", NULL, LKV_STAT_GAUGE, "docs",
                           "Open put transactions.", "puts", "puts_inflight")},
    {FLD(deletes), D("store_deletes", NULL, LKV_STAT_COUNTER, "docs",
                     "Documents deleted by callers.", "puts", "deletes")},
    {FLD(reads_inflight), D("store_reads_inflight", NULL, LKV_STAT_GAUGE, "docs",
                            "Open read handles.", "puts", "reads_inflight")},
    {FLD(wb_pending),
     D("store_wb_pending", NULL, LKV_STAT_GAUGE, "docs",
       "Write-back documents queued, not yet persisted.", "persistence", "wb_pending")},
    {FLD(wb_persisted),
     D("store_wb_persisted", NULL, LKV_STAT_COUNTER, "docs",
       "Documents persisted by the write-back writer.", "persistence", "wb_persisted")},
    {FLD(wb_failed),
     D("store_wb_failed", NULL, LKV_STAT_COUNTER, "docs",
       "Write-back failures (the document stays hot only).", "persistence", "wb_failed")},
    {FLD(wb_cold_declined),
     D("store_wb_cold_declined", NULL, LKV_STAT_COUNTER, "docs",
       "Write-back failures where the cold tier's policy did not admit the document (no I/O "
       "error; it stays hot only).",
       "persistence", "wb_cold_declined")},
    {FLD(wb_retries), D("store_wb_retries", NULL, LKV_STAT_COUNTER, "docs",
                        "Write-back attempts put back for a full disk (retried later).",
                        "persistence", "wb_retries")},
    {FLD(wb_backlog_bytes), D("store_wb_backlog_bytes", NULL, LKV_STAT_GAUGE, "bytes",
                              "Unpersisted write-back bytes (bounded by wb_max_backlog_bytes).",
                              "persistence", "wb_backlog_bytes")},
    {FLD(cold_readonly), D("store_cold_readonly", NULL, LKV_STAT_GAUGE, "bool",
                           "1 while the cold tier is read-only (the disk was full at start).",
                           "persistence", "cold_readonly")},
    {FLD(disk_free_bytes),
     D("store_disk_free_bytes", NULL, LKV_STAT_GAUGE, "bytes",
       "Bytes free on the disk of data_dir.", "persistence", "disk_free_bytes")},
    {FLD(corrupt_blocks), D("store_corrupt_blocks", NULL, LKV_STAT_COUNTER, "blocks",
                            "Blocks or records failing their check, or missing (document dropped).",
                            "persistence", "corrupt_blocks")},
};
#define N_STORE_STATS ((int)(sizeof(store_stats) / sizeof(store_stats[0])))
#undef FLD
#undef CAUSE
#undef D

static double ratio(uint64_t a, uint64_t b)
{
    return a + b ? (double)a / (double)(a + b) : 0.0;
}

/* The group's read fn: one snapshot under the store lock (registry lock held by the caller). */
static void stats_read(void *ctx, double *vals, int n)
{
    lkv_store_stats st;
    lkv_store_stats_get(ctx, &st);
    for (int i = 0; i < n && i < N_STORE_STATS; i++) {
        const store_stat *e = &store_stats[i];
        uint64_t v = 0;
        if (e->src == V_FIELD || e->src == V_BUDGET) {
            memcpy(&v, (const char *)&st + e->off, sizeof(v));
        }
        switch (e->src) {
        case V_BUDGET:
            vals[i] = v == UINT64_MAX ? 0.0 : (double)v;
            break;
        case V_RATIO_DOCS:
            vals[i] = ratio(st.hits_hot + st.hits_cold, st.misses);
            break;
        case V_RATIO_BLOCKS:
            vals[i] = ratio(st.hit_blocks_hot + st.hit_blocks_cold, st.miss_blocks);
            break;
        default:
            vals[i] = (double)v;
        }
    }
}

static int stats_register(lkv_store *s)
{
    lkv_stat_desc d[N_STORE_STATS];
    for (int i = 0; i < N_STORE_STATS; i++) {
        d[i] = store_stats[i].d;
    }
    return lkv_stats_register(s->stats, d, N_STORE_STATS, stats_read, s, &s->stats_group);
}

/* Per region: used, pinned, budget bytes and free pages (REGION_STATS values each). */
#define REGION_STATS 4

static void region_stats_read(void *ctx, double *vals, int n)
{
    lkv_store *s = ctx;
    pthread_mutex_lock(&s->mu);
    for (int r = 0; r < s->n_profiles && (r + 1) * REGION_STATS <= n; r++) {
        lkv_arena_region_info ri;
        lkv_arena_region(s->arena, r, &ri);
        vals[r * REGION_STATS + 0] = (double)lkv_policy_bytes_used(s->reg[r].hotp);
        vals[r * REGION_STATS + 1] = (double)lkv_policy_bytes_pinned(s->reg[r].hotp);
        vals[r * REGION_STATS + 2] = (double)lkv_policy_budget(s->reg[r].hotp);
        vals[r * REGION_STATS + 3] = (double)ri.n_free;
    }
    pthread_mutex_unlock(&s->mu);
}

/* Registers every region's bytes held, pinned, budget and free pages (labels profile=NAME). */
static int region_stats_register(lkv_store *s)
{
    int n = s->n_profiles * REGION_STATS;
    lkv_stat_desc *d = lkv_xcalloc((size_t)n, sizeof(*d));
    char(*labels)[96] = lkv_xcalloc((size_t)s->n_profiles, sizeof(*labels));
    char(*keys)[96] = lkv_xcalloc((size_t)n, sizeof(*keys));
    static const char *const names[REGION_STATS] = {
        "store_region_bytes_used", "store_region_bytes_pinned", "store_region_bytes_budget",
        "store_region_pages_free"};
    static const char *const sfx[REGION_STATS] = {"bytes_used", "bytes_pinned", "bytes_budget",
                                                  "pages_free"};
    static const char *const help[REGION_STATS] = {
        "Hot bytes held in the profile's arena region (pages held * its page size).",
        "Of those, pinned (leases, reads, in-flight puts and reservations).",
        "The region's budget (its pages * its page size).", "Free pages of the region."};
    for (int r = 0; r < s->n_profiles; r++) {
        snprintf(labels[r], sizeof(labels[r]), "profile=%s", s->profiles[r].name);
        for (int k = 0; k < REGION_STATS; k++) {
            lkv_stat_desc *e = &d[r * REGION_STATS + k];
            snprintf(keys[r * REGION_STATS + k], sizeof(keys[0]), "%s.%s", s->profiles[r].name,
                     sfx[k]);
            e->name = names[k];
            e->labels = labels[r];
            e->kind = LKV_STAT_GAUGE;
            e->unit = k == 3 ? "pages" : "bytes";
            e->help = help[k];
            e->section = "regions";
            e->key = keys[r * REGION_STATS + k];
        }
    }
    int rc = lkv_stats_register(s->stats, d, n, region_stats_read, s, &s->region_group);
    free(d);
    free(labels);
    free(keys);
    return rc;
}

int lkv_store_region_get(lkv_store *s, int r, lkv_store_region *out)
{
    if (r < 0 || r >= s->n_profiles || out == NULL) {
        return LKV_EINVAL;
    }
    lkv_arena_region_info ri;
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&s->mu);
    lkv_arena_region(s->arena, r, &ri);
    out->profile = &s->profiles[r];
    out->base_offset = ri.base_offset;
    out->page_bytes = ri.page_bytes;
    out->n_pages = ri.n_pages;
    out->pages_free = ri.n_free;
    out->bytes_used = lkv_policy_bytes_used(s->reg[r].hotp);
    out->bytes_pinned = lkv_policy_bytes_pinned(s->reg[r].hotp);
    out->budget = lkv_policy_budget(s->reg[r].hotp);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

lkv_stats *lkv_store_stats_registry(lkv_store *s)
{
    return s->stats;
}

/* ---- open / close ------------------------------------------------------------------------- */

static int scan_cb(void *ctx, const lkv_cold_doc *m)
{
    lkv_store *s = ctx;
    if (lkv__kidx_find(s, &m->key) != NULL) {
        return 0;
    }
    doc *d = lkv__slot_new(s);
    d->key = m->key;
    d->pid = lkv__live_pid(&m->key);
    d->content_hash = m->content_hash;
    memcpy(d->fp, m->fingerprint, 32);
    d->profile = lkv_profile_find_fp(s->profiles, s->n_profiles, m->fingerprint);
    if (d->profile >= 0 && lkv_block_bytes(&s->profiles[d->profile].shape) != m->block_bytes) {
        d->profile = -1;
    }
    d->n_tokens = m->n_tokens;
    d->n_blocks = m->n_blocks;
    d->block_bytes = m->block_bytes;
    d->created_ms = m->created_ms;
    d->tenant = m->tenant;
    d->prio = (int8_t)m->prio;
    d->expires_ms = m->expires_ms;
    d->state = ST_VISIBLE;
    lkv__sizes_sync(s, d);
    lkv__kidx_insert(s, d);
    lkv__cidx_insert(s, d);
    if (lkv__cold_admit(s, d) != 0) {
        /* Larger than the whole cold budget: delete it. */
        s->st.evictions_cold++;
        lkv_cold_delete(s->cold, &d->key, 0);
        lkv__kill(s, d, LKV_MISS_EVICTED, 0);
        lkv__settle(s, d);
    }
    return 0;
}

/* A pending marker found at open: a document acknowledged and not persisted is lost. */
static void pending_cb(void *ctx, const lkv_dockey *key, int has_doc)
{
    void **a = ctx;
    lkv_store *s = a[0];
    if (!has_doc && lkv__kidx_find(s, key) == NULL) {
        lkv__gone_add(s, key, LKV_MISS_LOST);
        (*(uint64_t *)a[1])++;
    }
}

int lkv_store_plan_regions(const lkv_profile *profiles, int n, uint64_t hot_bytes,
                           lkv_arena_region_cfg *out, char *err, int errlen)
{
    uint64_t explicit_sum = 0, default_pages = 0;
    int n_default = 0;
    char dummy[8];
    if (err == NULL) {
        err = dummy;
        errlen = (int)sizeof(dummy);
    }
    err[0] = '\0';
    if (n < 1 || n > LKV_ARENA_MAX_REGIONS) {
        snprintf(err, (size_t)errlen, "%d profiles: 1..%d are allowed", n, LKV_ARENA_MAX_REGIONS);
        return LKV_ECONFIG;
    }
    for (int i = 0; i < n; i++) {
        out[i].page_bytes = lkv_arena_page_size(lkv_block_bytes(&profiles[i].shape));
        if (out[i].page_bytes == 0) {
            snprintf(err, (size_t)errlen, "profile '%.64s': empty block", profiles[i].name);
            return LKV_ECONFIG;
        }
        if (profiles[i].hot_bytes > 0) {
            explicit_sum += profiles[i].hot_bytes;
        } else {
            default_pages += out[i].page_bytes;
            n_default++;
        }
    }
    if (explicit_sum > hot_bytes || (n_default > 0 && explicit_sum == hot_bytes)) {
        snprintf(err, (size_t)errlen,
                 "the profiles' hot_bytes add up to %" PRIu64 " bytes, %s hot_bytes (%" PRIu64
                 ")%s: lower them or raise hot_bytes",
                 explicit_sum, explicit_sum > hot_bytes ? "more than" : "all of", hot_bytes,
                 n_default > 0 ? ", leaving nothing for the profiles without one" : "");
        return LKV_ECONFIG;
    }
    /* Equal token capacity: every default profile gets the same number of pages. */
    uint64_t each = n_default > 0 ? (hot_bytes - explicit_sum) / default_pages : 0;
    for (int i = 0; i < n; i++) {
        uint64_t pages =
            profiles[i].hot_bytes > 0 ? profiles[i].hot_bytes / out[i].page_bytes : each;
        if (pages < 1 || pages > LKV_REF_MAX_PAGE + 1ull) {
            snprintf(err, (size_t)errlen,
                     "profile '%.64s' gets %" PRIu64 " arena pages of %" PRIu64
                     " bytes (1..%u allowed) from %s: set profile.%.64s.hot_bytes or change "
                     "hot_bytes (%" PRIu64 ")",
                     profiles[i].name, pages, out[i].page_bytes, LKV_REF_MAX_PAGE + 1u,
                     profiles[i].hot_bytes > 0 ? "its hot_bytes" : "its share of hot_bytes",
                     profiles[i].name, hot_bytes);
            return LKV_ECONFIG;
        }
        out[i].n_pages = (uint32_t)pages;
    }
    return 0;
}

static int bad_config(const char *what)
{
    LKV_LOGE("store config: %s", what);
    return LKV_ECONFIG;
}

int lkv_store_open(const lkv_store_config *cfg, lkv_store **out)
{
    lkv_store *s;
    char err[400];
    int rc;
    uint64_t max_block = 0;
    lkv_arena_region_cfg *plan = NULL;

    *out = NULL;
    if (cfg == NULL || cfg->data_dir == NULL || cfg->data_dir[0] == '\0') {
        return bad_config("data_dir is not set");
    }
    if (cfg->profiles == NULL || cfg->n_profiles < 1) {
        return bad_config("no model profiles");
    }
    if (cfg->hot_backend < LKV_HOT_AUTO || cfg->hot_backend > LKV_HOT_CUDA) {
        return bad_config("hot_backend is not auto, host or cuda");
    }
    if (cfg->durability != LKV_DURABILITY_WRITE_BACK &&
        cfg->durability != LKV_DURABILITY_WRITE_THROUGH) {
        return bad_config("durability is not write-back or write-through");
    }
    if (cfg->policy_kind < 0 || cfg->policy_kind >= LKV_POLICY__COUNT) {
        return bad_config("policy_kind is unknown");
    }
    if (cfg->hot_admission != LKV_HOT_ADMIT_ALWAYS && cfg->hot_admission != LKV_HOT_ADMIT_DOOR) {
        return bad_config("hot_admission is not always or door");
    }
    s = lkv_xcalloc(1, sizeof *s);
    s->cfg = *cfg;
    s->cfg.data_dir = NULL;
    s->cfg.profiles = NULL;
    s->n_profiles = cfg->n_profiles;
    s->profiles = lkv_xmalloc(sizeof(lkv_profile) * (size_t)cfg->n_profiles);
    memcpy(s->profiles, cfg->profiles, sizeof(lkv_profile) * (size_t)cfg->n_profiles);
    for (int i = 0; i < s->n_profiles; i++) {
        if (lkv_profile_finish(&s->profiles[i], err, sizeof err) != 0) {
            LKV_LOGE("store config: profile %d (%.*s): %s", i, LKV_PROFILE_NAME_MAX,
                     s->profiles[i].name, err);
            rc = LKV_ECONFIG;
            goto fail_early;
        }
        if (lkv_profile_find(s->profiles, i, s->profiles[i].name) >= 0) {
            LKV_LOGE("store config: duplicate profile name %s", s->profiles[i].name);
            rc = LKV_ECONFIG;
            goto fail_early;
        }
        uint64_t bb = lkv_block_bytes(&s->profiles[i].shape);
        max_block = bb > max_block ? bb : max_block;
    }
    s->page_bytes = lkv_arena_page_size(max_block);
    plan = lkv_xcalloc((size_t)s->n_profiles, sizeof(*plan));
    if (lkv_store_plan_regions(s->profiles, s->n_profiles, cfg->hot_bytes, plan, err,
                               (int)sizeof err) != 0) {
        LKV_LOGE("store config: %s", err);
        rc = LKV_ECONFIG;
        goto fail_early;
    }
    uint64_t n_pages = 0;
    for (int i = 0; i < s->n_profiles; i++) {
        n_pages += plan[i].n_pages;
    }
    if (mkdir(cfg->data_dir, 0700) != 0 && errno != EEXIST) {
        LKV_LOGE("store: mkdir %s: %s", cfg->data_dir, strerror(errno));
        rc = LKV_EIO;
        goto fail_early;
    }
    rc = lkv_arena_create_regions(cfg->hot_backend, cfg->cuda_device, plan, s->n_profiles,
                                  &s->arena);
    if (rc != 0) {
        goto fail_early;
    }
    rc = lkv_arena_set_read_streams(s->arena,
                                    cfg->cuda_read_streams > 0 ? cfg->cuda_read_streams : 1);
    if (rc != 0) {
        LKV_LOGE("store: cuda_read_streams %d: %s", cfg->cuda_read_streams, lkv_strerror(rc));
        lkv_arena_destroy(s->arena);
        rc = rc == LKV_EINVAL ? LKV_ECONFIG : rc;
        goto fail_early;
    }
    lkv_cold_options co;
    memset(&co, 0, sizeof co);
    co.min_blob_bytes = cfg->cold_min_blob_bytes;
    co.min_free_bytes = cfg->cold_min_free_bytes;
    co.on_corruption = cfg->cold_on_corruption;
    rc = lkv_cold_open_ex(cfg->data_dir, &co, &s->cold);
    if (rc != 0) {
        lkv_arena_destroy(s->arena);
        goto fail_early;
    }
    const char *fault = getenv("LKV_FAULT_COLD_WRITES");
    if (fault != NULL) {
        lkv_cold_fault_writes(s->cold, atoi(fault));
    }
    s->reg = lkv_xcalloc((size_t)s->n_profiles, sizeof(*s->reg));
    for (int i = 0; i < s->n_profiles; i++) {
        lkv_arena_region_info ri;
        MUST_OK(lkv_arena_region(s->arena, i, &ri));
        s->reg[i].page_bytes = ri.page_bytes;
        s->reg[i].base_offset = ri.base_offset;
        s->reg[i].n_pages = ri.n_pages;
        MUST_OK(lkv_policy_create(cfg->policy_kind, (uint64_t)ri.n_pages * ri.page_bytes,
                                  &s->reg[i].hotp));
    }
    free(plan);
    plan = NULL;
    MUST_OK(lkv_policy_create(cfg->policy_kind, cfg->cold_bytes ? cfg->cold_bytes : UINT64_MAX,
                              &s->coldp));
    if (lkv_arena_backend(s->arena) != LKV_ARENA_HOST) {
        s->scratch = lkv_xmalloc(s->page_bytes);
    }
    lkv__index_init(s, cfg->evicted_memory ? cfg->evicted_memory : DEFAULT_EVICTED_MEMORY);
    s->q_head = s->q_tail = NIL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->wcv, NULL);

    uint64_t n_corrupt = 0;
    pthread_mutex_lock(&s->mu);
    rc = lkv_cold_scan(s->cold, scan_cb, s, &n_corrupt);
    if (rc == LKV_ECORRUPT) {
        /* RocksDB found a table damaged under the document records. */
        rc = lkv_cold_reset(s->cold, "reading the document records failed a checksum (see the "
                                     "RocksDB error above for the file)");
        if (rc == 0) {
            lkv__index_free(s);
            s->slots = NULL;
            s->free_slots = NULL;
            s->n_slots = s->cap_slots = s->n_free_slots = s->cap_free_slots = 0;
            s->kcount = s->ccount = s->gone_pos = 0;
            s->st.hot_docs = s->st.hot_blocks = 0;
            s->st.cold_docs = s->st.cold_blocks = s->st.cold_bytes = 0;
            lkv__index_init(s, cfg->evicted_memory ? cfg->evicted_memory : DEFAULT_EVICTED_MEMORY);
            lkv_policy_destroy(s->coldp);
            MUST_OK(lkv_policy_create(cfg->policy_kind,
                                      cfg->cold_bytes ? cfg->cold_bytes : UINT64_MAX, &s->coldp));
            rc = lkv_cold_scan(s->cold, scan_cb, s, &n_corrupt);
        }
    }
    s->st.corrupt_blocks += n_corrupt;
    if (rc == 0) {
        uint64_t n_lost = 0;
        void *lctx[2] = {s, &n_lost};
        rc = lkv_cold_scan_pending(s->cold, pending_cb, lctx);
        if (n_lost > 0) {
            LKV_LOGW("store: %llu write-back documents acknowledged before a crash were not "
                     "persisted: they are misses (cause lost)",
                     (unsigned long long)n_lost);
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (rc != 0) {
        lkv_store_close(s);
        return rc;
    }
    if (cfg->stats != NULL) {
        s->stats = cfg->stats;
    } else {
        lkv_stats_create(&s->own_stats);
        s->stats = s->own_stats;
    }
    rc = stats_register(s);
    if (rc == 0) {
        rc = region_stats_register(s);
    }
    if (rc != 0) {
        lkv_store_close(s);
        return rc;
    }
    lkv__writer_start(s);
    lkv__maint_start(s);
    LKV_LOGI("store: open %s: hot %s %llu pages in %d regions (%llu B), cold %llu docs (budget "
             "%llu B), %s, %s, hot admission %s, %d profiles",
             cfg->data_dir, lkv_arena_backend(s->arena) == LKV_ARENA_HOST ? "host" : "cuda",
             (unsigned long long)n_pages, s->n_profiles,
             (unsigned long long)lkv_arena_bytes(s->arena),
             (unsigned long long)lkv_policy_count(s->coldp), (unsigned long long)cfg->cold_bytes,
             lkv_durability_name(cfg->durability), lkv_policy_name(cfg->policy_kind),
             lkv_hot_admission_name(cfg->hot_admission), s->n_profiles);
    *out = s;
    return 0;

fail_early:
    free(plan);
    free(s->profiles);
    free(s);
    return rc;
}

int lkv_store_close(lkv_store *s)
{
    int rc = 0;
    if (s == NULL) {
        return 0;
    }
    lkv_stats_unregister(s->stats, s->stats_group); /* No stats_read runs after this. */
    lkv_stats_unregister(s->stats, s->region_group);
    lkv__writer_stop(s);
    lkv__maint_stop(s);
    if (s->st.wb_failed != s->wb_failed_seen) {
        rc = LKV_EIO;
    }
    if (s->st.puts_inflight || s->st.reads_inflight) {
        LKV_LOGW("store: closing with %llu puts and %llu reads still open",
                 (unsigned long long)s->st.puts_inflight, (unsigned long long)s->st.reads_inflight);
    }
    for (wb_waiter *w = s->waiters; w != NULL;) {
        wb_waiter *n = w->next;
        free(w); /* Dropped without a call (lkv_store_put_wait). */
        w = n;
    }
    lkv__index_free(s);
    lkv__acct_free(s);
    lkv_cold_close(s->cold);
    lkv_arena_destroy(s->arena);
    for (int i = 0; s->reg != NULL && i < s->n_profiles; i++) {
        lkv_policy_destroy(s->reg[i].hotp);
    }
    free(s->reg);
    lkv_policy_destroy(s->coldp);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->wcv);
    pthread_mutex_destroy(&s->mu);
    lkv_stats_destroy(s->own_stats);
    free(s->scratch);
    free(s->profiles);
    free(s);
    return rc;
}

int lkv_store_flush(lkv_store *s)
{
    pthread_mutex_lock(&s->mu);
    pthread_cond_broadcast(&s->wcv);
    s->flush_now = 1;
    while (((s->q_head != NIL || s->n_unflushed > 0) && !s->wb_stalled) || s->writer_busy) {
        pthread_cond_wait(&s->cv, &s->mu);
    }
    int rc = s->st.wb_failed != s->wb_failed_seen ? LKV_EIO : 0;
    if (rc == 0 && (s->q_head != NIL || s->n_unflushed > 0)) {
        rc = LKV_ENOSPC; /* The disk is full: the queue waits for room. */
    }
    s->wb_failed_seen = s->st.wb_failed;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- profiles, info, lookups -------------------------------------------------------------- */

int lkv_store_profile_count(const lkv_store *s)
{
    return s->n_profiles;
}

const lkv_profile *lkv_store_profile_at(const lkv_store *s, int i)
{
    return i >= 0 && i < s->n_profiles ? &s->profiles[i] : NULL;
}

const lkv_profile *lkv_store_profile_find(const lkv_store *s, const char *name)
{
    int i = name ? lkv_profile_find(s->profiles, s->n_profiles, name) : -1;
    return i >= 0 ? &s->profiles[i] : NULL;
}

/* ---- refusal reasons (lkv_store_why) ------------------------------------------------------ */

static _Thread_local char tl_why[512]; /* This thread's last refusal reason ("" if none). */

const char *lkv_store_why(void)
{
    return tl_why;
}

static int why(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Records which check refused the call and why, and returns rc. */
static int why(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_why, sizeof(tl_why), fmt, ap);
    va_end(ap);
    return rc;
}

/* n bytes as "18 MiB" when a whole number of MiB, else "N bytes" (into buf, returned). */
static const char *fmt_bytes(uint64_t n, char *buf, size_t len)
{
    if (n >= (1u << 20) && n % (1u << 20) == 0) {
        snprintf(buf, len, "%" PRIu64 " MiB", n >> 20);
    } else {
        snprintf(buf, len, "%" PRIu64 " bytes", n);
    }
    return buf;
}

int lkv_store_profile_get(const lkv_store *s, const char *name, const lkv_profile **out)
{
    tl_why[0] = '\0';
    *out = NULL;
    if (name == NULL || name[0] == '\0') {
        return why(LKV_EPROFILE, "profile is empty (a model profile name is required)");
    }
    const lkv_profile *p = lkv_store_profile_find(s, name);
    if (p == NULL) {
        char known[384];
        size_t n = 0;
        known[0] = '\0';
        for (int i = 0; i < s->n_profiles && n < sizeof(known); i++) {
            int w =
                snprintf(known + n, sizeof(known) - n, "%s%s", i ? ", " : "", s->profiles[i].name);
            n += w > 0 ? (size_t)w : 0;
        }
        return why(LKV_EPROFILE, "unknown profile '%.64s' (known: %s)", name, known);
    }
    *out = p;
    return 0;
}

static void fill_info(lkv_store *s, const doc *d, lkv_doc_info *o)
{
    memset(o, 0, sizeof *o);
    o->present = 1;
    o->tier = d->hot && !d->promoting ? LKV_TIER_HOT : LKV_TIER_COLD;
    o->miss_cause = LKV_MISS_NONE;
    o->n_tokens = d->n_tokens;
    o->n_blocks = d->n_blocks;
    o->block_bytes = d->block_bytes;
    o->profile = d->profile >= 0 ? &s->profiles[d->profile] : NULL;
    o->persisted = d->cold && !d->cold_busy;
    o->pins = d->user_pins;
    o->region = d->profile;
    o->page_bytes = d->profile >= 0 ? s->reg[d->profile].page_bytes : 0;
    o->held = lkv__held(s, d);
}

static void miss_info(lkv_doc_info *o, int cause)
{
    memset(o, 0, sizeof *o);
    o->miss_cause = cause;
}

/* Looks key up, counts, fills *o. mismatch_hash: content hash to test for a profile mismatch,
 * or 0 for none; miss_blocks: blocks to count on a miss. */
static void lookup_locked(lkv_store *s, const lkv_dockey *k, uint64_t content, uint32_t mblocks,
                          int region, lkv_doc_info *o)
{
    doc *d = lkv__kidx_find(s, k);
    uint64_t pid = lkv__live_pid(k);
    if (d != NULL && d->profile >= 0) {
        region = d->profile;
    }
    /* The request goes into the history of the region the document belongs in (all of them
     * when a key lookup misses: the key does not say its profile). */
    for (int r = 0; r < s->n_profiles; r++) {
        if (region < 0 || r == region) {
            lkv_policy_record(s->reg[r].hotp, pid);
        }
    }
    lkv_policy_record(s->coldp, pid);
    if (d != NULL && d->state == ST_VISIBLE && d->profile >= 0) {
        fill_info(s, d, o);
        if (o->tier == LKV_TIER_HOT) {
            s->st.hits_hot++;
            s->st.hit_blocks_hot += d->n_blocks;
        } else {
            s->st.hits_cold++;
            s->st.hit_blocks_cold += d->n_blocks;
        }
        return;
    }
    int cause;
    if (d != NULL && d->state == ST_VISIBLE) {
        cause = LKV_MISS_PROFILE;
    } else {
        cause = lkv__gone_find(s, k);
        if (cause == LKV_MISS_NEVER && content != 0 && lkv__cidx_has(s, content)) {
            cause = LKV_MISS_PROFILE;
        }
    }
    miss_info(o, cause);
    s->st.misses++;
    s->st.miss_blocks += mblocks;
    s->st.misses_by_cause[cause]++;
}

int lkv_store_lookup(lkv_store *s, const lkv_dockey *keys, uint32_t n, lkv_doc_info *out)
{
    if (n > 0 && (keys == NULL || out == NULL)) {
        return LKV_EINVAL;
    }
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < n; i++) {
        lookup_locked(s, &keys[i], 0, 0, -1, &out[i]);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int lkv_store_lookup_tokens(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], const char *profile,
                            const uint32_t *tokens, uint32_t n_tokens, lkv_dockey *key_out,
                            lkv_doc_info *out)
{
    const lkv_profile *p = lkv_store_profile_find(s, profile);
    lkv_dockey k;
    if (p == NULL) {
        return LKV_EPROFILE;
    }
    if (salt == NULL || out == NULL || (tokens == NULL && n_tokens > 0)) {
        return LKV_EINVAL;
    }
    lkv_dockey_compute(salt, p->fingerprint, tokens, n_tokens, &k);
    uint64_t content = lkv_dockey_content_hash(salt, tokens, n_tokens);
    uint32_t blocks = lkv_blocks_for_tokens(&p->shape, n_tokens);
    pthread_mutex_lock(&s->mu);
    lookup_locked(s, &k, content ? content : 1, blocks, (int)(p - s->profiles), out);
    pthread_mutex_unlock(&s->mu);
    if (key_out != NULL) {
        *key_out = k;
    }
    return 0;
}

int lkv_store_tier(lkv_store *s, const lkv_dockey *key)
{
    lkv_doc_info info;
    int tier = LKV_TIER_NONE;
    pthread_mutex_lock(&s->mu);
    doc *d = lkv__kidx_find(s, key);
    if (d != NULL && d->state == ST_VISIBLE && d->profile >= 0) {
        fill_info(s, d, &info);
        tier = d->promoting ? LKV_TIER_COLD : info.tier;
    }
    pthread_mutex_unlock(&s->mu);
    return tier;
}

/* ---- puts --------------------------------------------------------------------------------- */

/* The reason a put of n_blocks blocks of profile p finds no room in its region of the hot tier. */
static int why_no_room(lkv_store *s, const lkv_profile *p, uint32_t n_blocks)
{
    char b1[32], b2[32], b3[32];
    const hot_region *reg = &s->reg[p - s->profiles];
    return why(LKV_ENOSPC,
               "no room for the document: it needs %" PRIu32 " hot pages of %s (%s) and what "
               "is not free of profile '%s''s %" PRIu64 " pages (%s) is pinned or being "
               "written (retry later, or raise hot_bytes)",
               n_blocks, fmt_bytes(reg->page_bytes, b1, sizeof(b1)),
               fmt_bytes((uint64_t)n_blocks * reg->page_bytes, b2, sizeof(b2)), p->name,
               lkv_policy_budget(reg->hotp) / reg->page_bytes,
               fmt_bytes(lkv_policy_budget(reg->hotp), b3, sizeof(b3)));
}

/* Reserves the hot pages of staging d (lock held; may drop it to write demotions): admits it
 * (evicting victims), waits for the writer's copy if only that holds the room, pins it. */
static int tx_admit(lkv_store *s, doc *d)
{
    int rc = lkv__hot_admit(s, d);
    while (rc == LKV_ENOSPC && s->wbuild != NULL) {
        /* The writer's pin holds the room only while it copies a document: wait for that. */
        lkv__demote_flush(s);
        if (s->wbuild != NULL) {
            pthread_cond_wait(&s->cv, &s->mu);
        }
        rc = lkv__hot_admit(s, d);
    }
    if (rc != 0) {
        lkv__demote_flush(s);
        return rc == LKV_ENOSPC ? why_no_room(s, &s->profiles[d->profile], d->n_blocks) : rc;
    }
    lkv__hot_pin(s, d);
    lkv__demote_flush(s); /* The victims that made room, written without the lock. */
    return 0;
}

int lkv_store_put_begin(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], const char *profile,
                        const uint32_t *tokens, uint32_t n_tokens, lkv_store_put **out,
                        lkv_dockey *key_out, int *exists)
{
    return lkv_store_put_begin_ex(s, salt, profile, tokens, n_tokens, NULL, out, key_out, exists);
}

int lkv_store_put_begin_ex(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], const char *profile,
                           const uint32_t *tokens, uint32_t n_tokens, const lkv_put_opts *o,
                           lkv_store_put **out, lkv_dockey *key_out, int *exists)
{
    const lkv_profile *p;
    lkv_dockey k;
    int rc;

    *out = NULL;
    rc = lkv_store_profile_get(s, profile, &p);
    if (rc != 0) {
        return rc;
    }
    if (salt == NULL) {
        return why(LKV_EINVAL, "no tenant salt");
    }
    if (o != NULL && (o->prio < -1 || o->prio > 1)) {
        return why(LKV_EINVAL, "priority %d is not -1, 0 or +1", o->prio);
    }
    if (o != NULL && o->ttl_ms > LKV_PUT_TTL_MAX_MS) {
        return why(LKV_EINVAL, "ttl_ms %" PRIu64 " is more than 100 years", o->ttl_ms);
    }
    rc = lkv_profile_check_tokens(p, tokens, n_tokens, tl_why, (int)sizeof(tl_why));
    if (rc != 0) {
        return rc;
    }
    lkv_dockey_compute(salt, p->fingerprint, tokens, n_tokens, &k);
    uint32_t n_blocks = lkv_blocks_for_tokens(&p->shape, n_tokens);
    uint64_t block_bytes = lkv_block_bytes(&p->shape);

    lkv_store_put *tx = lkv_xcalloc(1, sizeof *tx);
    tx->s = s;
    tx->key = k;
    tx->n_blocks = n_blocks;
    tx->n_tokens = n_tokens;
    tx->block_bytes = block_bytes;
    tx->profile = p;

    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        rc = why(LKV_ESHUTDOWN, "the store is closing (the daemon is shutting down)");
        goto fail;
    }
    doc *e = lkv__kidx_find(s, &k);
    if (e != NULL && e->state == ST_VISIBLE) {
        if (o != NULL && o->hold) {
            lkv__hold_doc(s, e);
        }
        s->st.puts_inflight++;
        pthread_mutex_unlock(&s->mu);
        if (exists != NULL) {
            *exists = 1;
        }
        if (key_out != NULL) {
            *key_out = k;
        }
        *out = tx;
        return 0;
    }
    char b1[32], b2[32], b3[32];
    const hot_region *reg = &s->reg[p - s->profiles];
    if ((uint64_t)n_blocks * reg->page_bytes > lkv_policy_budget(reg->hotp)) {
        rc = why(LKV_ENOSPC,
                 "the document needs %" PRIu32 " hot pages of %s (%s), more than the whole hot "
                 "budget of profile '%s', %" PRIu64 " pages (%s): raise hot_bytes or "
                 "profile.%s.hot_bytes",
                 n_blocks, fmt_bytes(reg->page_bytes, b1, sizeof(b1)),
                 fmt_bytes((uint64_t)n_blocks * reg->page_bytes, b2, sizeof(b2)), p->name,
                 lkv_policy_budget(reg->hotp) / reg->page_bytes,
                 fmt_bytes(lkv_policy_budget(reg->hotp), b3, sizeof(b3)), p->name);
        goto fail;
    }
    if (s->cfg.durability == LKV_DURABILITY_WRITE_THROUGH &&
        (uint64_t)n_blocks * block_bytes > lkv_policy_budget(s->coldp)) {
        rc = why(LKV_ENOSPC,
                 "the document is %s, more than the whole cold budget of %s (write-through "
                 "puts must fit the cold tier): raise cold_bytes",
                 fmt_bytes((uint64_t)n_blocks * block_bytes, b1, sizeof(b1)),
                 fmt_bytes(lkv_policy_budget(s->coldp), b2, sizeof(b2)));
        goto fail;
    }
    doc *d = lkv__slot_new(s);
    d->key = k;
    d->pid = STAGE_BIT | d->slot;
    d->content_hash = lkv_dockey_content_hash(salt, tokens, n_tokens);
    memcpy(d->fp, p->fingerprint, 32);
    d->profile = (int)(p - s->profiles);
    d->state = ST_STAGING;
    d->n_tokens = n_tokens;
    d->n_blocks = n_blocks;
    d->block_bytes = block_bytes;
    d->created_ms = now_ms();
    lkv__doc_opts(d, o, d->created_ms);
    d->acct = lkv__acct_of(s, salt);
    /* Pages are reserved now if they are free. If room must be made (evicting, which demotes
     * documents), the reservation waits for the first valid block (lkv_store_put_block), so a
     * put refused before that changes nothing; hopeless cases are refused here. */
    uint64_t need = (uint64_t)n_blocks * reg->page_bytes;
    uint64_t budget = lkv_policy_budget(reg->hotp);
    /* Pinned bytes for the door, less the writer's pin of the doc it is copying (transient). */
    uint64_t pinned = lkv_policy_bytes_pinned(reg->hotp);
    const doc *wb = s->wbuild;
    if (wb != NULL && wb->profile == d->profile && wb->hot_pins == 1 && !lkv__held(s, wb)) {
        pinned -= lkv__hot_bytes(s, wb);
    }
    if (s->cfg.hot_admission == LKV_HOT_ADMIT_DOOR &&
        lkv_policy_bytes_used(reg->hotp) + need > budget && budget - pinned >= need &&
        !lkv__held(s, d) && !(o != NULL && o->scratch) &&
        !lkv_policy_would_admit(reg->hotp, lkv__live_pid(&k), need, lkv__cost(s, need))) {
        /* The door (lkv_store.h, "Hot admission"): cold only, or declined. */
        uint64_t cb = (uint64_t)n_blocks * block_bytes;
        s->st.hot_admit_refused++;
        if (cb > lkv_policy_budget(s->coldp) || lkv_cold_readonly(s->cold) ||
            lkv_cold_can_write(s->cold, cb) != 0) {
            s->st.puts_declined++;
            rc = why(LKV_EADMIT,
                     "not cached: the hot tier's admission filter (hot_admission = door) "
                     "declined the document (looked up less often than what it would evict) "
                     "and the cold tier cannot take its %s (cold_bytes %s, or the disk is full); "
                     "nothing was stored",
                     fmt_bytes(cb, b1, sizeof(b1)),
                     fmt_bytes(lkv_policy_budget(s->coldp), b2, sizeof(b2)));
        } else {
            tx->cold_only = 1;
            tx->cbatch = lkv_cold_batch_create();
            rc = 0;
        }
    } else if (lkv_policy_bytes_used(reg->hotp) + need <= budget) {
        rc = tx_admit(s, d);
    } else if (budget - lkv_policy_bytes_pinned(reg->hotp) < need && s->wbuild == NULL) {
        rc = why_no_room(s, p, n_blocks);
    } else {
        rc = 0; /* Deferred. */
    }
    if (rc != 0) {
        lkv__slot_free(s, d);
        goto fail;
    }
    d->tokens = lkv_xmalloc(sizeof(uint32_t) * n_tokens);
    memcpy(d->tokens, tokens, sizeof(uint32_t) * n_tokens);
    s->st.puts_inflight++;
    pthread_mutex_unlock(&s->mu);
    tx->d = d;
    if (exists != NULL) {
        *exists = 0;
    }
    if (key_out != NULL) {
        *key_out = k;
    }
    *out = tx;
    return 0;

fail:
    pthread_mutex_unlock(&s->mu);
    free(tx);
    return rc;
}

int lkv_store_put_cold_only(const lkv_store_put *tx)
{
    return tx->cold_only;
}

uint32_t lkv_store_put_n_blocks(const lkv_store_put *tx)
{
    return tx->n_blocks;
}

uint64_t lkv_store_put_block_bytes(const lkv_store_put *tx)
{
    return tx->block_bytes;
}

/* 1 if the bytes [off, off + len) of the run iov[0..n) are all zero. */
static int iov_range_zero(const struct iovec *iov, size_t n, size_t off, size_t len)
{
    size_t base = 0;
    for (size_t i = 0; i < n && len > 0; i++) {
        size_t sl = iov[i].iov_len;
        if (off >= base + sl) {
            base += sl;
            continue;
        }
        const uint8_t *p = (const uint8_t *)iov[i].iov_base + (off - base);
        size_t k = base + sl - off < len ? base + sl - off : len;
        if (p[0] != 0 || (k > 1 && memcmp(p, p + 1, k - 1) != 0)) {
            return 0;
        }
        off += k;
        len -= k;
        base += sl;
    }
    return 1;
}

/* Returns 1 if the token slots past valid in every slab of the block (the run iov[0..n)) are
 * zero. */
static int tail_is_zero(const lkv_kv_shape *sh, const struct iovec *iov, size_t n, uint32_t valid)
{
    size_t row = (size_t)sh->head_dim * lkv_dtype_size(sh->dtype);
    size_t slab = lkv_slab_bytes(sh);
    size_t n_slabs = (size_t)sh->n_layers * 2u * (size_t)sh->n_kv_heads;
    for (size_t i = 0; i < n_slabs; i++) {
        size_t len = slab - (size_t)valid * row;
        if (len > 0 && !iov_range_zero(iov, n, i * slab + (size_t)valid * row, len)) {
            return 0;
        }
    }
    return 1;
}

int lkv_store_put_block(lkv_store_put *tx, uint32_t index, const void *data, size_t len)
{
    struct iovec one = {(void *)data, len};
    return lkv_store_put_blockv(tx, index, &one, 1);
}

int lkv_store_put_blockv(lkv_store_put *tx, uint32_t index, const struct iovec *iov, size_t n)
{
    tl_why[0] = '\0';
    if (tx == NULL) {
        return why(LKV_EINVAL, "block %" PRIu32 ": no put", index);
    }
    if (index >= tx->n_blocks) {
        return why(LKV_EINVAL,
                   "block index %" PRIu32 " out of range: the document has %" PRIu32
                   " blocks (index 0..%" PRIu32 ")",
                   index, tx->n_blocks, tx->n_blocks - 1);
    }
    if (index != tx->next) {
        return why(LKV_EINVAL,
                   "block index %" PRIu32 " out of order: expected index %" PRIu32
                   " (blocks go in order, each once)",
                   index, tx->next);
    }
    size_t len = 0;
    int no_data = iov == NULL;
    for (size_t i = 0; i < n && iov != NULL; i++) {
        no_data |= iov[i].iov_base == NULL;
        len += iov[i].iov_len;
    }
    if (len != tx->block_bytes) {
        const lkv_kv_shape *sh = &tx->profile->shape;
        return why(LKV_EINVAL,
                   "block %" PRIu32 " is %zu bytes, expected %" PRIu64
                   " (profile '%s': %d layers x 2 x %d kv heads x %d tokens x %d dims x %zu "
                   "bytes)",
                   index, len, tx->block_bytes, tx->profile->name, sh->n_layers, sh->n_kv_heads,
                   sh->block_tokens, sh->head_dim, lkv_dtype_size(sh->dtype));
    }
    if (no_data) {
        return why(LKV_EINVAL, "block %" PRIu32 ": no data", index);
    }
    if (index == tx->n_blocks - 1) {
        uint32_t bt = (uint32_t)tx->profile->shape.block_tokens;
        uint32_t valid = tx->n_tokens - index * bt;
        if (valid < bt && !tail_is_zero(&tx->profile->shape, iov, n, valid)) {
            return why(LKV_EINVAL,
                       "block %" PRIu32 ": the token slots past the document's end (token %" PRIu32
                       " on) must be zero",
                       index, tx->n_tokens);
        }
    }
    if (tx->cold_only) {
        const void *p = iov[0].iov_base;
        if (n != 1) {
            if (tx->cbuf == NULL) {
                tx->cbuf = lkv_xmalloc(tx->block_bytes);
            }
            size_t off = 0;
            for (size_t i = 0; i < n; i++) {
                memcpy(tx->cbuf + off, iov[i].iov_base, iov[i].iov_len);
                off += iov[i].iov_len;
            }
            p = tx->cbuf;
        }
        lkv_cold_batch_block(tx->cbatch, &tx->key, index, p, tx->block_bytes);
        tx->next++;
        return 0;
    }
    if (tx->d != NULL && !tx->d->hot) {
        /* The first valid block: now the pages are reserved (lkv_store_put_begin). */
        lkv_store *s = tx->s;
        pthread_mutex_lock(&s->mu);
        int rc = s->stopping ? why(LKV_ESHUTDOWN, "the store is closing") : tx_admit(s, tx->d);
        pthread_mutex_unlock(&s->mu);
        if (rc != 0) {
            return rc;
        }
    }
    if (tx->d != NULL) {
        int rc = lkv_arena_writev(tx->s->arena, tx->d->profile, tx->d->pages[index], iov, n);
        if (rc != 0) {
            return rc;
        }
    }
    tx->next++;
    return 0;
}

static wb_waiter *unreserve_locked(lkv_store *s, lkv_store_put *tx);

/* Frees tx and what a cold-only put still owns. */
static void tx_free(lkv_store_put *tx)
{
    if (tx->cbatch != NULL) {
        lkv_cold_batch_free(tx->cbatch);
    }
    free(tx->cbuf);
    free(tx);
}

/* Drops a staging (or committing) doc of a put that does not become visible. Lock held. */
static void discard_locked(lkv_store *s, doc *d)
{
    if (d->indexed) {
        lkv__kidx_remove(s, d);
    }
    d->state = ST_DEAD;
    lkv__acct_sync(s, d);
    lkv__sizes_sync(s, d);
    if (d->hot_pins > 0) {
        lkv__hot_unpin(s, d); /* The stager's pin (none if the reservation was deferred). */
    }
    lkv__rekey(s, d, STAGE_BIT | d->slot);
    lkv__settle(s, d);
    pthread_cond_broadcast(&s->cv);
}

void lkv_store_put_abort(lkv_store_put *tx)
{
    if (tx == NULL) {
        return;
    }
    lkv_store *s = tx->s;
    pthread_mutex_lock(&s->mu);
    if (tx->d != NULL) {
        discard_locked(s, tx->d);
    }
    s->st.puts_aborted++;
    s->st.puts_inflight--;
    wb_waiter *wake = unreserve_locked(s, tx);
    pthread_mutex_unlock(&s->mu);
    lkv__wb_call(wake);
    tx_free(tx);
}

/* Makes the staged doc d visible (lock held). */
static void publish_locked(lkv_store *s, doc *d)
{
    d->state = ST_VISIBLE;
    lkv__acct_sync(s, d);
    lkv__sizes_sync(s, d);
    if (!d->indexed) {
        lkv__kidx_insert(s, d);
    }
    lkv__cidx_insert(s, d);
    if (d->hot_pins > 0) {
        lkv__hot_unpin(s, d); /* The stager's pin (a cold-only put has none). */
    }
    s->st.puts++;
    pthread_cond_broadcast(&s->cv);
}

/* Gives back tx's backlog reservation (lock held); returns waiters to call after unlocking. */
static wb_waiter *unreserve_locked(lkv_store *s, lkv_store_put *tx)
{
    if (tx->wb_reserved == 0) {
        return NULL;
    }
    s->wb_backlog -= tx->wb_reserved <= s->wb_backlog ? tx->wb_reserved : s->wb_backlog;
    tx->wb_reserved = 0;
    return lkv__wb_take_waiters(s);
}

int lkv_store_put_wait(lkv_store_put *tx, void (*fn)(const void *blob), const void *blob,
                       size_t len)
{
    lkv_store *s = tx->s;
    uint64_t bound = s->cfg.wb_max_backlog_bytes;
    uint64_t b = (uint64_t)tx->n_blocks * tx->block_bytes;
    if (s->cfg.durability != LKV_DURABILITY_WRITE_BACK || tx->d == NULL || bound == 0 ||
        tx->wb_reserved != 0 || tx->cold_only) {
        return 0;
    }
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (s->wb_backlog == 0 || s->wb_backlog + b <= bound) {
        s->wb_backlog += b;
        tx->wb_reserved = b;
    } else {
        rc = LKV_EAGAIN;
        if (fn != NULL) {
            wb_waiter *w = lkv_xcalloc(1, sizeof *w);
            w->fn = fn;
            memcpy(w->blob, blob, len < sizeof w->blob ? len : sizeof w->blob);
            if (s->waiters_tail == NULL) {
                s->waiters = w;
            } else {
                s->waiters_tail->next = w;
            }
            s->waiters_tail = w;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Fills *res for the document d now is (lock held). */
static void put_result(lkv_store *s, const doc *d, int existed, lkv_put_result *res)
{
    (void)s;
    if (res == NULL) {
        return;
    }
    res->existed = existed;
    res->tier = d == NULL || d->state != ST_VISIBLE ? LKV_TIER_NONE
                : d->hot && !d->promoting           ? LKV_TIER_HOT
                                                    : LKV_TIER_COLD;
    res->persisted = d != NULL && d->state == ST_VISIBLE && d->cold && !d->cold_busy;
}

/* The reason of a write-through failure rc of doc d (lock held). */
static void why_cold(lkv_store *s, const doc *d, int rc)
{
    char b1[32], b2[32];
    uint64_t fb = lkv_cold_free_bytes(s->cold);
    if (rc == LKV_ENOSPC &&
        (lkv_cold_readonly(s->cold) ||
         (fb != UINT64_MAX && fb < lkv_cold_min_free(s->cold) + 2 * lkv__cold_bytes(d)))) {
        why(rc,
            "the disk of data_dir %s is full (%s free, cold_min_free_bytes keeps %s free): the "
            "document cannot be made durable; free space on that disk (puts work again at once)",
            lkv_cold_dir(s->cold), fmt_bytes(fb == UINT64_MAX ? 0 : fb, b1, sizeof b1),
            fmt_bytes(lkv_cold_min_free(s->cold), b2, sizeof b2));
    } else if (rc == LKV_ENOSPC) {
        why(rc, "the cold tier budget (cold_bytes) is held by documents being written or read: "
                "retry later, or raise cold_bytes");
    } else {
        why(rc, "writing the document to the cold tier in %s failed: %s (see the daemon log)",
            lkv_cold_dir(s->cold), lkv_strerror(rc));
    }
}

/* Write-through: persists existing hot-only e again (evicted from the cold tier meanwhile), so
 * that an acknowledgement of it says the truth (lock held; dropped during the write). */
static int repersist_locked(lkv_store *s, doc *e)
{
    e->refs++; /* Before the wait: the lock is dropped there and e may be evicted meanwhile. */
    while (e->state == ST_VISIBLE && e->cold_busy) {
        pthread_cond_wait(&s->cv, &s->mu); /* Someone else is writing it: wait for the end. */
    }
    if (e->state != ST_VISIBLE || e->cold || !e->hot || e->promoting) {
        lkv__unref(s, e);
        return 0;
    }
    lkv__hot_pin(s, e);
    int rc = lkv__write_through(s, e);
    if (rc != 0) {
        why_cold(s, e, rc);
    }
    lkv__hot_unpin(s, e);
    lkv__unref(s, e);
    pthread_cond_broadcast(&s->cv);
    return rc;
}

/* Pins visible doc d for the caller (as lkv_store_pin) and describes it. Lock held. */
static void pin_out_locked(lkv_store *s, doc *d, uint32_t *pages, uint32_t cap, lkv_doc_info *info)
{
    d->user_pins++;
    lkv__hot_pin(s, d);
    if (pages != NULL) {
        memcpy(pages, d->pages, sizeof(uint32_t) * (d->n_blocks < cap ? d->n_blocks : cap));
    }
    if (info != NULL) {
        fill_info(s, d, info);
    }
}

static int commit_tx(lkv_store_put *tx, lkv_put_result *res, int pin, uint32_t *pages, uint32_t cap,
                     lkv_doc_info *info, int *pin_later);

int lkv_store_put_commit(lkv_store_put *tx)
{
    return lkv_store_put_finish(tx, NULL);
}

int lkv_store_put_finish(lkv_store_put *tx, lkv_put_result *res)
{
    int later = 0;
    return commit_tx(tx, res, 0, NULL, 0, NULL, &later);
}

/* Commits tx and reports into *res (may be NULL); with pin, pins the visible result for the
 * caller (*pin_later = 1 when the result is another doc that was not hot: the caller then pins
 * it with lkv_store_pin after). */
static int commit_tx(lkv_store_put *tx, lkv_put_result *res, int pin, uint32_t *pages, uint32_t cap,
                     lkv_doc_info *info, int *pin_later)
{
    lkv_store *s = tx->s;
    doc *d = tx->d;
    int rc = 0;
    int wt = s->cfg.durability == LKV_DURABILITY_WRITE_THROUGH;
    wb_waiter *wake = NULL;

    tl_why[0] = '\0';
    if (res != NULL) {
        memset(res, 0, sizeof *res);
    }
    if (tx->next != tx->n_blocks) {
        why(LKV_EINVAL,
            "Put ended after %" PRIu32 " of %" PRIu32 " blocks (%" PRIu32
            " tokens in blocks of %d)",
            tx->next, tx->n_blocks, tx->n_tokens, tx->profile->shape.block_tokens);
        lkv_store_put_abort(tx);
        return LKV_EINVAL;
    }
    if (d != NULL && !wt && !tx->cold_only) {
        /* Write-back: a pending marker first (no lock), so that a crash before the writer
         * persists the document makes it a miss of cause "lost" at the next start. */
        (void)lkv_cold_mark_pending(s->cold, &d->key);
    }
    pthread_mutex_lock(&s->mu);
    s->st.puts_inflight--;
    if (d == NULL) {
        doc *e = lkv__kidx_find(s, &tx->key);
        s->st.puts_existing++;
        int held = e != NULL && wt;
        if (held) {
            e->refs++; /* repersist_locked may drop the lock: e must outlive put_result. */
            rc = repersist_locked(s, e);
        }
        put_result(s, e, 1, res);
        *pin_later = pin && rc == 0;
        if (held) {
            lkv__unref(s, e);
        }
        goto out;
    }
    for (;;) {
        doc *e = lkv__kidx_find(s, &d->key);
        if (e == NULL) {
            break;
        }
        if (e->state == ST_VISIBLE) {
            /* Committed by someone else meanwhile: keep theirs. */
            discard_locked(s, d);
            s->st.puts_existing++;
            wake = unreserve_locked(s, tx);
            e->refs++; /* repersist_locked may drop the lock: e must outlive what follows. */
            if (wt) {
                rc = repersist_locked(s, e);
            }
            if (pin && rc == 0 && e->state == ST_VISIBLE && e->hot && !e->promoting) {
                pin_out_locked(s, e, pages, cap, info);
            } else {
                *pin_later = pin && rc == 0;
            }
            put_result(s, e, 1, res);
            lkv__unref(s, e);
            goto out;
        }
        /* Another write-through commit of the same key is syncing: wait for its outcome. */
        pthread_cond_wait(&s->cv, &s->mu);
    }
    rc = lkv_policy_contains(lkv__hotp(s, d), lkv__live_pid(&d->key)) ? LKV_EINTERNAL : 0;
    if (rc != 0) {
        LKV_LOGE("store: policy id collision at commit");
        discard_locked(s, d);
        s->st.puts_aborted++;
        wake = unreserve_locked(s, tx);
        goto out;
    }
    lkv__rekey(s, d, lkv__live_pid(&d->key));
    if (tx->cold_only) {
        /* Refused hot by the door: reserve the key, write the staged batch, then publish. */
        lkv_cold_batch *b = tx->cbatch;
        tx->cbatch = NULL;
        d->state = ST_COMMITTING;
        lkv__kidx_insert(s, d);
        rc = lkv__cold_write_staged(s, d, b, wt);
        if (rc != 0) {
            why_cold(s, d, rc);
            discard_locked(s, d);
            s->st.puts_aborted++;
            goto out;
        }
        free(d->tokens); /* Present while hot only. */
        d->tokens = NULL;
        publish_locked(s, d);
        s->st.puts_cold_only++;
        put_result(s, d, 0, res);
        goto out;
    }
    if (!wt) {
        /* The reservation (if any) becomes the queued document's share of the backlog. */
        s->wb_backlog -= tx->wb_reserved <= s->wb_backlog ? tx->wb_reserved : s->wb_backlog;
        tx->wb_reserved = 0;
        publish_locked(s, d);
        lkv__wb_enqueue(s, d);
        if (pin) {
            pin_out_locked(s, d, pages, cap, info);
        }
        put_result(s, d, 0, res);
        goto out;
    }
    /* Write-through: reserve the key, sync the batch without the lock, then publish. */
    d->state = ST_COMMITTING;
    lkv__kidx_insert(s, d);
    rc = lkv__write_through(s, d);
    if (rc != 0) {
        why_cold(s, d, rc);
        discard_locked(s, d);
        s->st.puts_aborted++;
        goto out;
    }
    publish_locked(s, d);
    if (pin) {
        pin_out_locked(s, d, pages, cap, info);
    }
    put_result(s, d, 0, res);
out:
    pthread_mutex_unlock(&s->mu);
    lkv__wb_call(wake);
    tx_free(tx);
    return rc;
}

/* ---- put in place ------------------------------------------------------------------------- */

const uint32_t *lkv_store_put_pages(const lkv_store_put *tx)
{
    return tx->d != NULL ? tx->d->pages : NULL;
}

int lkv_store_put_region(const lkv_store_put *tx)
{
    return (int)(tx->profile - tx->s->profiles);
}

int lkv_store_put_reserve(lkv_store_put *tx)
{
    tl_why[0] = '\0';
    if (tx->cold_only) {
        return why(LKV_EADMIT,
                   "the hot tier's admission filter (hot_admission = door) declined the "
                   "document: compute it in your own memory (a Put by copy stores it in the "
                   "cold tier)");
    }
    if (tx->d == NULL || tx->d->hot) {
        return 0; /* Nothing to reserve, or reserved by lkv_store_put_begin. */
    }
    if (tx->next != 0) {
        return why(LKV_EINVAL, "blocks of this put were staged by copy already");
    }
    lkv_store *s = tx->s;
    pthread_mutex_lock(&s->mu);
    int rc = s->stopping ? why(LKV_ESHUTDOWN, "the store is closing") : tx_admit(s, tx->d);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int lkv_store_put_commit_written(lkv_store_put *tx, uint32_t *pages, uint32_t cap,
                                 lkv_doc_info *info)
{
    lkv_store *s = tx->s;
    tl_why[0] = '\0';
    if (tx->next != 0) {
        return why(LKV_EINVAL, "blocks of this put were staged by copy: commit with put_commit");
    }
    if (tx->d == NULL) {
        return why(LKV_EINVAL, "nothing was reserved: the document was already stored");
    }
    if (!tx->d->hot) {
        return why(LKV_EINVAL, "no pages were reserved: call lkv_store_put_reserve first");
    }
    uint32_t last = tx->n_blocks - 1;
    uint32_t bt = (uint32_t)tx->profile->shape.block_tokens;
    uint32_t valid = tx->n_tokens - last * bt;
    if (valid < bt) {
        /* The one check the store can make of data it did not copy: the zero tail. */
        int region = tx->d->profile;
        const uint8_t *p = lkv_arena_host_ptr(s->arena, region, tx->d->pages[last]);
        uint8_t *buf = NULL;
        if (p == NULL) {
            buf = lkv_xmalloc(tx->block_bytes);
            int rc = lkv_arena_read(s->arena, region, tx->d->pages[last], buf, tx->block_bytes);
            if (rc != 0) {
                free(buf);
                return why(rc, "reading block %" PRIu32 " back from the arena failed", last);
            }
            p = buf;
        }
        struct iovec whole = {(void *)p, tx->block_bytes};
        int ok = tail_is_zero(&tx->profile->shape, &whole, 1, valid);
        free(buf);
        if (!ok) {
            return why(LKV_EINVAL,
                       "block %" PRIu32 " (page %" PRIu32 "): the token slots past the "
                       "document's end (token %" PRIu32 " on, slot %" PRIu32
                       " of the block) must be zero in every layer, K and V and head",
                       last, tx->d->pages[last], tx->n_tokens, valid);
        }
    }
    tx->next = tx->n_blocks;
    lkv_dockey key = tx->d->key;
    int later = 0;
    int rc = commit_tx(tx, NULL, 1, pages, cap, info, &later);
    if (rc == 0 && later) {
        /* A Put made it visible meanwhile and it is not hot now: pin it as Attach would. */
        rc = lkv_store_pin(s, &key, pages, cap, info);
    }
    return rc;
}

int lkv_store_put_all(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], const char *profile,
                      const uint32_t *tokens, uint32_t n_tokens, const void *blocks, size_t len,
                      lkv_dockey *key_out)
{
    lkv_store_put *tx;
    int rc = lkv_store_put_begin(s, salt, profile, tokens, n_tokens, &tx, key_out, NULL);
    if (rc != 0) {
        return rc;
    }
    uint64_t bb = tx->block_bytes;
    if (blocks == NULL || len != (uint64_t)tx->n_blocks * bb) {
        lkv_store_put_abort(tx);
        return LKV_EINVAL;
    }
    for (uint32_t i = 0; i < tx->n_blocks; i++) {
        rc = lkv_store_put_block(tx, i, (const uint8_t *)blocks + i * bb, bb);
        if (rc != 0) {
            lkv_store_put_abort(tx);
            return rc;
        }
    }
    return lkv_store_put_commit(tx);
}

static int acquire(lkv_store *s, const lkv_dockey *key, int must_hot, lkv_store_read *rd)
{
    pthread_mutex_lock(&s->mu);
    doc *d;
    for (;;) {
        d = lkv__kidx_find(s, key);
        if (d == NULL || d->state != ST_VISIBLE) {
            pthread_mutex_unlock(&s->mu);
            return LKV_ENOTFOUND;
        }
        if (d->profile < 0) {
            pthread_mutex_unlock(&s->mu);
            return LKV_EPROFILE;
        }
        if (!d->promoting && !(d->cold_busy && !d->hot)) {
            break; /* Not being filled, nor written out by a demotion or the writer. */
        }
        pthread_cond_wait(&s->cv, &s->mu);
    }
    int promoted = 0;
    rd->s = s;
    rd->d = d;
    d->refs++;
    d->used_ms = now_ms();
    if (d->hot) {
        lkv_policy_touch(lkv__hotp(s, d), d->pid);
        lkv__hot_pin(s, d);
        goto hot;
    }
    assert(d->cold);
    lkv_policy_touch(s->coldp, d->pid);
    int rc = lkv__promote(s, d, must_hot);
    if (rc == LKV_ENOTFOUND || rc == LKV_ECORRUPT) {
        lkv__unref(s, d); /* DEAD now: settling releases its pages, its RocksDB data and slot. */
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    if (rc != 0) {
        if (must_hot || d->state != ST_VISIBLE) {
            /* (The promotion attempt may have dropped the lock to write demotions: d may have
             * been deleted meanwhile.) */
            int out = must_hot && d->state == ST_VISIBLE ? rc : LKV_ENOTFOUND;
            lkv__unref(s, d);
            pthread_mutex_unlock(&s->mu);
            return out;
        }
        rd->snap = lkv_cold_snap_create(s->cold);
        fill_info(s, d, &rd->info);
        s->st.reads_inflight++;
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    promoted = 1;
hot:
    rd->pages = lkv_xmalloc(sizeof(uint32_t) * d->n_blocks);
    memcpy(rd->pages, d->pages, sizeof(uint32_t) * d->n_blocks);
    fill_info(s, d, &rd->info);
    if (promoted) {
        rd->info.tier = LKV_TIER_COLD; /* Where it was found. */
        rd->info.promoted = 1;
    }
    s->st.reads_inflight++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static void release(lkv_store_read *rd)
{
    lkv_store *s = rd->s;
    pthread_mutex_lock(&s->mu);
    if (rd->snap != NULL) {
        lkv_cold_snap_release(s->cold, rd->snap);
    } else {
        lkv__hot_unpin(s, rd->d);
    }
    s->st.reads_inflight--;
    lkv__unref(s, rd->d);
    pthread_mutex_unlock(&s->mu);
    free(rd->pages);
}

int lkv_store_get_begin(lkv_store *s, const lkv_dockey *key, lkv_store_read **out,
                        lkv_doc_info *info)
{
    lkv_store_read *rd = lkv_xcalloc(1, sizeof *rd);
    *out = NULL;
    int rc = acquire(s, key, 0, rd);
    if (rc != 0) {
        free(rd);
        return rc;
    }
    if (info != NULL) {
        *info = rd->info;
    }
    *out = rd;
    return 0;
}

int lkv_store_get_block(lkv_store_read *rd, uint32_t index, void *buf, size_t len)
{
    doc *d = rd->d;
    if (index >= rd->info.n_blocks || buf == NULL || len < rd->info.block_bytes) {
        return LKV_EINVAL;
    }
    if (rd->snap == NULL) {
        return lkv_arena_read(rd->s->arena, d->profile, rd->pages[index], buf,
                              rd->info.block_bytes);
    }
    int rc = lkv_cold_get_block(rd->s->cold, rd->snap, &d->key, index, buf, rd->info.block_bytes);
    if (rc == LKV_ECORRUPT || rc == LKV_ENOTFOUND) {
        pthread_mutex_lock(&rd->s->mu);
        if (rc == LKV_ENOTFOUND) {
            LKV_LOGW("store: a block of a visible document is missing from RocksDB");
        }
        lkv__corrupt(rd->s, d); /* Counted and dropped either way. */
        pthread_mutex_unlock(&rd->s->mu);
        return LKV_ECORRUPT;
    }
    return rc;
}

const void *lkv_store_get_block_ptr(const lkv_store_read *rd, uint32_t index)
{
    if (rd->snap != NULL || index >= rd->info.n_blocks) {
        return NULL;
    }
    return lkv_arena_host_ptr(rd->s->arena, rd->d->profile, rd->pages[index]);
}

int lkv_store_get_blocks_async(lkv_store_read *rd, uint32_t first, uint32_t n, void *dst,
                               lkv_arena_done *done)
{
    if (rd->snap != NULL || n == 0 || first >= rd->info.n_blocks || n > rd->info.n_blocks - first ||
        dst == NULL || done == NULL) {
        return LKV_EINVAL;
    }
    return lkv_arena_read_async(rd->s->arena, rd->d->profile, rd->pages + first, n,
                                rd->info.block_bytes, dst, done);
}

const lkv_doc_info *lkv_store_get_info(const lkv_store_read *rd)
{
    return &rd->info;
}

const uint32_t *lkv_store_get_pages(const lkv_store_read *rd)
{
    return rd->snap == NULL ? rd->pages : NULL;
}

void lkv_store_get_end(lkv_store_read *rd)
{
    if (rd == NULL) {
        return;
    }
    release(rd);
    free(rd);
}

int lkv_store_get_all(lkv_store *s, const lkv_dockey *key, void *buf, size_t len,
                      lkv_doc_info *info)
{
    lkv_store_read *rd;
    lkv_doc_info in;
    int rc = lkv_store_get_begin(s, key, &rd, &in);
    if (rc != 0) {
        return rc;
    }
    if (info != NULL) {
        *info = in;
    }
    if (buf == NULL || len < (uint64_t)in.n_blocks * in.block_bytes) {
        lkv_store_get_end(rd);
        return LKV_EINVAL;
    }
    for (uint32_t i = 0; i < in.n_blocks && rc == 0; i++) {
        rc = lkv_store_get_block(rd, i, (uint8_t *)buf + (uint64_t)i * in.block_bytes,
                                 in.block_bytes);
    }
    lkv_store_get_end(rd);
    return rc;
}

/* ---- delete, pins, demote, foreach -------------------------------------------------------- */

int lkv_store_delete(lkv_store *s, const lkv_dockey *key)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    doc *d = lkv__kidx_find(s, key);
    if (d == NULL || d->state != ST_VISIBLE) {
        rc = LKV_ENOTFOUND;
    } else if (d->user_pins > 0) {
        rc = LKV_EBUSY;
    } else {
        int sync = s->cfg.durability == LKV_DURABILITY_WRITE_THROUGH;
        if (d->cold && d->cold_pins == 0) {
            /* The RocksDB delete first (through the WAL): if it cannot be written (a full
             * disk), the delete fails and changes nothing, rather than come back to life at
             * the next start. (A doc being read or written is deleted when that ends.) */
            rc = lkv_cold_delete(s->cold, &d->key, sync);
        }
        if (rc == 0) {
            lkv__kill(s, d, LKV_MISS_DELETED, sync);
            lkv__settle(s, d);
            s->st.deletes++;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int lkv_store_pin(lkv_store *s, const lkv_dockey *key, uint32_t *pages, uint32_t pages_cap,
                  lkv_doc_info *info)
{
    lkv_store_read rd;
    memset(&rd, 0, sizeof rd);
    int rc = acquire(s, key, 1, &rd);
    if (rc != 0) {
        return rc;
    }
    pthread_mutex_lock(&s->mu);
    if (rd.d->state != ST_VISIBLE) {
        pthread_mutex_unlock(&s->mu);
        release(&rd);
        return LKV_ENOTFOUND;
    }
    rd.d->user_pins++;
    lkv__hot_pin(s, rd.d);
    rd.info.pins = rd.d->user_pins;
    pthread_mutex_unlock(&s->mu);
    if (pages != NULL) {
        uint32_t n = rd.info.n_blocks < pages_cap ? rd.info.n_blocks : pages_cap;
        memcpy(pages, rd.pages, sizeof(uint32_t) * n);
    }
    if (info != NULL) {
        *info = rd.info;
    }
    release(&rd);
    return 0;
}

int lkv_store_unpin(lkv_store *s, const lkv_dockey *key)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    doc *d = lkv__kidx_find(s, key);
    if (d == NULL || d->state != ST_VISIBLE) {
        rc = LKV_ENOTFOUND;
    } else if (d->user_pins == 0) {
        rc = LKV_EINVAL;
    } else {
        d->user_pins--;
        lkv__hot_unpin(s, d);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int lkv_store_demote(lkv_store *s, const lkv_dockey *key)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    doc *d = lkv__kidx_find(s, key);
    while (d != NULL && d == s->wbuild) {
        pthread_cond_wait(&s->cv, &s->mu); /* The writer copies it: a moment. */
        d = lkv__kidx_find(s, key);
    }
    if (d == NULL || d->state != ST_VISIBLE || !d->hot) {
        rc = LKV_ENOTFOUND;
    } else if (d->hot_pins > 0 || d->promoting || lkv__held(s, d)) {
        rc = LKV_EBUSY;
    } else {
        lkv__demote(s, d);
        lkv__demote_flush(s);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int lkv_store_foreach(lkv_store *s, lkv_store_foreach_fn fn, void *ctx)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < s->n_slots && rc == 0; i++) {
        doc *d = s->slots[i];
        if (d != NULL && d->state == ST_VISIBLE) {
            lkv_doc_info in;
            fill_info(s, d, &in);
            rc = fn(ctx, &d->key, &in);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- introspection ------------------------------------------------------------------------ */

void lkv_store_stats_get(lkv_store *s, lkv_store_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->st; /* Tier sizes and hot_bytes_held included: kept by lkv__sizes_sync, no walk. */
    out->hot_bytes = out->hot_bytes_pinned = out->hot_budget = 0;
    for (int r = 0; r < s->n_profiles; r++) {
        out->hot_bytes += lkv_policy_bytes_used(s->reg[r].hotp);
        out->hot_bytes_pinned += lkv_policy_bytes_pinned(s->reg[r].hotp);
        out->hot_budget += lkv_policy_budget(s->reg[r].hotp);
    }
    out->hot_page_bytes = s->page_bytes;
    out->hot_pages_total = lkv_arena_pages_total(s->arena);
    out->hot_pages_free = lkv_arena_pages_free(s->arena);
    out->cold_budget = lkv_policy_budget(s->coldp);
    out->wb_backlog_bytes = s->wb_backlog;
    out->cold_readonly = (uint64_t)lkv_cold_readonly(s->cold);
    pthread_mutex_unlock(&s->mu);
    uint64_t fb = lkv_cold_free_bytes(s->cold);
    out->disk_free_bytes = fb == UINT64_MAX ? 0 : fb;
}

void lkv_store_arena_info_get(lkv_store *s, lkv_store_arena_info *out)
{
    memset(out, 0, sizeof *out);
    out->backend = lkv_arena_backend(s->arena) == LKV_ARENA_HOST ? LKV_HOT_HOST : LKV_HOT_CUDA;
    out->shm_name = lkv_arena_shm_name(s->arena);
    out->arena_bytes = lkv_arena_bytes(s->arena);
    out->n_regions = lkv_arena_n_regions(s->arena);
    out->cuda_device = lkv_arena_cuda_device(s->arena);
    lkv_arena_cuda_ipc_handle(s->arena, out->cuda_ipc);
}

void lkv_store_fault_cold_writes(lkv_store *s, int n)
{
    lkv_cold_fault_writes(s->cold, n);
}
