/*
 * lkv_stats.c: the statistics registry (contract in lkv_stats.h).
 *
 * A registry is a mutex and a doubly linked list of groups in registration order. A group
 * holds its own copies of the descriptors (one malloc'ed string block per stat) and either an
 * array of cache-line-aligned cells or a read fn. Registration checks the new group against
 * every registered stat (O(registered) string compares: registration happens at start-up,
 * iteration a few times a second, increments never touch the registry).
 *
 * Invariants (under mu): name+labels and section+key are unique over all groups; stats that
 * share a name share kind and unit; a group is in the list exactly while registered.
 */
#include "lkv_stats.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_err.h"
#include "lkv_log.h"

struct lkv_stat_hist {
    int nb;                 /* Finite bounds. */
    const uint64_t *bounds; /* The group's nb bounds. */
    lkv_stat_cell *cells;   /* nb + 1 bucket counts (not cumulative; last: above every bound),
                             * then the sum: nb + 2 cells of the group's array. */
};

struct lkv_stat_group {
    struct lkv_stat_group *prev, *next; /* Registry list links. */
    int n;                              /* Stats. */
    lkv_stat_desc *descs;               /* n copies; strings point into strs[i]. */
    char **strs;                        /* n owned string blocks. */
    lkv_stat_cell *cells;               /* n owned cells (aligned_alloc), or NULL with read. */
    lkv_stats_read_fn read;             /* Or NULL. */
    lkv_stat_hist *hists;               /* n histograms (their cells in `cells`), or NULL. */
    uint64_t *bounds;                   /* Their shared bounds (owned), or NULL. */
    void *ctx;                          /* Passed to read (borrowed). */
};

struct lkv_stats {
    pthread_mutex_t mu;          /* Guards the list and every group in it. */
    lkv_stat_group *head, *tail; /* Groups in registration order. */
    int count;                   /* Stats registered. */
};

int lkv_stats_create(lkv_stats **out)
{
    lkv_stats *r = lkv_xcalloc(1, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    *out = r;
    return 0;
}

static void group_free(lkv_stat_group *g)
{
    for (int i = 0; i < g->n; i++) {
        free(g->strs[i]);
    }
    free(g->strs);
    free(g->descs);
    free(g->cells);
    free(g->hists);
    free(g->bounds);
    free(g);
}

void lkv_stats_destroy(lkv_stats *r)
{
    if (r == NULL) {
        return;
    }
    for (lkv_stat_group *g = r->head, *nx; g != NULL; g = nx) {
        nx = g->next;
        group_free(g);
    }
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static const char *nz(const char *s)
{
    return s != NULL ? s : "";
}

static int name_ok(const char *s, size_t len)
{
    if (len == 0 || len > LKV_STAT_NAME_MAX || !((s[0] >= 'a' && s[0] <= 'z') || s[0] == '_')) {
        return 0;
    }
    for (size_t i = 1; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) {
            return 0;
        }
    }
    return 1;
}

/* "k=v,k2=v2": keys are names; values are non-empty without , = " \ or control bytes. */
static int labels_ok(const char *s)
{
    if (*s == '\0') {
        return 1;
    }
    if (strlen(s) > LKV_STAT_TEXT_MAX) {
        return 0;
    }
    for (;;) {
        const char *eq = strchr(s, '=');
        if (eq == NULL || !name_ok(s, (size_t)(eq - s))) {
            return 0;
        }
        const char *v = eq + 1, *p = v;
        while (*p != '\0' && *p != ',') {
            unsigned char c = (unsigned char)*p;
            if (c < 0x20 || c == 0x7f || c == '=' || c == '"' || c == '\\') {
                return 0;
            }
            p++;
        }
        if (p == v) {
            return 0;
        }
        if (*p == '\0') {
            return 1;
        }
        s = p + 1;
    }
}

static int text_ok(const char *s)
{
    for (const char *p = s; *p != '\0'; p++) {
        if ((unsigned char)*p < 0x20) {
            return 0;
        }
    }
    return strlen(s) <= LKV_STAT_TEXT_MAX;
}

/* Checks one descriptor alone (hist: 1 for a histogram group); writes why into *why. */
static int desc_ok(const lkv_stat_desc *d, int hist, const char **why)
{
    if (d->name == NULL || !name_ok(d->name, strlen(d->name))) {
        *why = "the name is not [a-z_][a-z0-9_]* of at most 63 bytes";
        return 0;
    }
    if (!labels_ok(nz(d->labels))) {
        *why = "the labels are not k=v[,k=v...] with name keys and plain values";
        return 0;
    }
    if (hist ? d->kind != LKV_STAT_HISTOGRAM
             : (d->kind != LKV_STAT_COUNTER && d->kind != LKV_STAT_GAUGE)) {
        *why = hist ? "a histogram group holds histograms only"
                    : "the kind is neither counter nor gauge";
        return 0;
    }
    if (!text_ok(nz(d->unit)) || !text_ok(nz(d->help)) || !text_ok(nz(d->section)) ||
        !text_ok(nz(d->key))) {
        *why = "the unit, help, section or key is too long or holds control bytes";
        return 0;
    }
    if (d->section != NULL && d->section[0] == '\0') {
        *why = "the section is empty (NULL leaves a stat out of INFO)";
        return 0;
    }
    return 1;
}

static const char *key_of(const lkv_stat_desc *d)
{
    return d->key != NULL ? d->key : d->name;
}

/* 0 if a and b may coexist; else LKV_EEXIST / LKV_EINVAL with *why set. */
static int clash(const lkv_stat_desc *a, const lkv_stat_desc *b, const char **why)
{
    if (strcmp(a->name, b->name) == 0) {
        if (strcmp(nz(a->labels), nz(b->labels)) == 0) {
            *why = "it is already registered";
            return LKV_EEXIST;
        }
        if (a->kind != b->kind || strcmp(nz(a->unit), nz(b->unit)) != 0) {
            *why = "the name is already registered with another kind or unit";
            return LKV_EINVAL;
        }
    }
    if (a->section != NULL && b->section != NULL && strcmp(a->section, b->section) == 0 &&
        strcmp(key_of(a), key_of(b)) == 0) {
        *why = "its INFO section and key are already taken";
        return LKV_EEXIST;
    }
    return 0;
}

/* Copies d's strings into one block; returns the block and fixes *out's pointers into it. */
static char *desc_copy(const lkv_stat_desc *d, lkv_stat_desc *out)
{
    const char *src[6] = {d->name, d->labels, d->unit, d->help, d->section, d->key};
    size_t len = 0;
    for (int i = 0; i < 6; i++) {
        len += src[i] != NULL ? strlen(src[i]) + 1 : 0;
    }
    char *blk = lkv_xmalloc(len + 1), *p = blk;
    const char *dst[6];
    for (int i = 0; i < 6; i++) {
        dst[i] = NULL;
        if (src[i] != NULL) {
            size_t n = strlen(src[i]) + 1;
            memcpy(p, src[i], n);
            dst[i] = p;
            p += n;
        }
    }
    *out = *d;
    out->name = dst[0];
    out->labels = dst[1] != NULL ? dst[1] : "";
    out->unit = dst[2] != NULL ? dst[2] : "";
    out->help = dst[3] != NULL ? dst[3] : "";
    out->section = dst[4];
    out->key = dst[5] != NULL ? dst[5] : dst[0];
    return blk;
}

/* Registers a group: read fn / owned cells (bounds NULL) or histograms (bounds, nb). */
static int group_register(lkv_stats *r, const lkv_stat_desc *descs, int n, lkv_stats_read_fn read,
                          void *ctx, const uint64_t *bounds, int nb, lkv_stat_group **out)
{
    int hist = bounds != NULL;
    const char *why = NULL;
    int rc = 0, bad = -1;
    if (out != NULL) {
        *out = NULL;
    }
    if (r == NULL || descs == NULL || n < 1) {
        return LKV_EINVAL;
    }
    for (int i = 0; i < n && rc == 0; i++) {
        if (!desc_ok(&descs[i], hist, &why)) {
            rc = LKV_EINVAL;
            bad = i;
        }
        for (int j = 0; j < i && rc == 0; j++) {
            rc = clash(&descs[j], &descs[i], &why);
            bad = rc != 0 ? i : bad;
        }
    }
    pthread_mutex_lock(&r->mu);
    for (lkv_stat_group *g = r->head; g != NULL && rc == 0; g = g->next) {
        for (int j = 0; j < g->n && rc == 0; j++) {
            for (int i = 0; i < n && rc == 0; i++) {
                rc = clash(&g->descs[j], &descs[i], &why);
                bad = rc != 0 ? i : bad;
            }
        }
    }
    if (rc != 0) {
        pthread_mutex_unlock(&r->mu);
        LKV_LOGE("stats: cannot register %s{%s} (section %s, key %s): %s",
                 descs[bad].name != NULL ? descs[bad].name : "(null)", nz(descs[bad].labels),
                 descs[bad].section != NULL ? descs[bad].section : "-",
                 descs[bad].name != NULL ? key_of(&descs[bad]) : "-", why);
        return rc;
    }
    lkv_stat_group *g = lkv_xcalloc(1, sizeof(*g));
    g->n = n;
    g->descs = lkv_xcalloc((size_t)n, sizeof(*g->descs));
    g->strs = lkv_xcalloc((size_t)n, sizeof(*g->strs));
    for (int i = 0; i < n; i++) {
        g->strs[i] = desc_copy(&descs[i], &g->descs[i]);
    }
    g->read = read;
    g->ctx = ctx;
    if (read == NULL) {
        size_t nc = hist ? (size_t)n * (size_t)(nb + 2) : (size_t)n;
        g->cells = aligned_alloc(_Alignof(lkv_stat_cell), sizeof(lkv_stat_cell) * nc);
        if (g->cells == NULL) {
            lkv_panic("out of memory (stat cells)");
        }
        for (size_t i = 0; i < nc; i++) {
            atomic_init(&g->cells[i].v, 0);
        }
    }
    if (hist) {
        g->bounds = lkv_xcalloc((size_t)nb, sizeof(*g->bounds));
        memcpy(g->bounds, bounds, sizeof(*bounds) * (size_t)nb);
        g->hists = lkv_xcalloc((size_t)n, sizeof(*g->hists));
        for (int i = 0; i < n; i++) {
            g->hists[i].nb = nb;
            g->hists[i].bounds = g->bounds;
            g->hists[i].cells = &g->cells[(size_t)i * (size_t)(nb + 2)];
        }
    }
    g->prev = r->tail;
    if (r->tail != NULL) {
        r->tail->next = g;
    } else {
        r->head = g;
    }
    r->tail = g;
    r->count += n;
    pthread_mutex_unlock(&r->mu);
    if (out != NULL) {
        *out = g;
    }
    return 0;
}

int lkv_stats_register(lkv_stats *r, const lkv_stat_desc *descs, int n, lkv_stats_read_fn read,
                       void *ctx, lkv_stat_group **out)
{
    return group_register(r, descs, n, read, ctx, NULL, 0, out);
}

int lkv_stats_register_hist(lkv_stats *r, const lkv_stat_desc *descs, int n, const uint64_t *bounds,
                            int nb, lkv_stat_group **out)
{
    if (out != NULL) {
        *out = NULL;
    }
    if (bounds == NULL || nb < 1 || nb > LKV_STAT_HIST_MAX_BUCKETS) {
        LKV_LOGE("stats: cannot register histogram %s: %d bounds (1..%d needed)",
                 descs != NULL && n > 0 && descs[0].name != NULL ? descs[0].name : "(null)", nb,
                 LKV_STAT_HIST_MAX_BUCKETS);
        return LKV_EINVAL;
    }
    for (int i = 1; i < nb; i++) {
        if (bounds[i] <= bounds[i - 1]) {
            LKV_LOGE("stats: cannot register histogram %s: bounds not strictly increasing",
                     descs != NULL && n > 0 && descs[0].name != NULL ? descs[0].name : "(null)");
            return LKV_EINVAL;
        }
    }
    return group_register(r, descs, n, NULL, NULL, bounds, nb, out);
}

lkv_stat_hist *lkv_stat_group_hist(lkv_stat_group *g, int i)
{
    if (g == NULL || g->hists == NULL || i < 0 || i >= g->n) {
        return NULL;
    }
    return &g->hists[i];
}

void lkv_stat_hist_observe(lkv_stat_hist *h, uint64_t v)
{
    int b = 0;
    while (b < h->nb && v > h->bounds[b]) {
        b++;
    }
    lkv_stat_add(&h->cells[b], 1);
    lkv_stat_add(&h->cells[h->nb + 1], v);
}

int lkv_stats_foreach_hist(lkv_stats *r, lkv_stats_hist_visit_fn fn, void *ctx)
{
    int rc = 0;
    uint64_t cum[LKV_STAT_HIST_MAX_BUCKETS + 1];
    pthread_mutex_lock(&r->mu);
    for (lkv_stat_group *g = r->head; g != NULL && rc == 0; g = g->next) {
        for (int i = 0; g->hists != NULL && i < g->n && rc == 0; i++) {
            const lkv_stat_hist *h = &g->hists[i];
            uint64_t run = 0;
            for (int b = 0; b <= h->nb; b++) {
                run += lkv_stat_load(&h->cells[b]);
                cum[b] = run;
            }
            rc = fn(ctx, &g->descs[i], h->bounds, cum, h->nb, lkv_stat_load(&h->cells[h->nb + 1]));
        }
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void lkv_stats_unregister(lkv_stats *r, lkv_stat_group *g)
{
    if (r == NULL || g == NULL) {
        return;
    }
    pthread_mutex_lock(&r->mu);
    if (g->prev != NULL) {
        g->prev->next = g->next;
    } else {
        r->head = g->next;
    }
    if (g->next != NULL) {
        g->next->prev = g->prev;
    } else {
        r->tail = g->prev;
    }
    r->count -= g->n;
    pthread_mutex_unlock(&r->mu);
    group_free(g);
}

lkv_stat_cell *lkv_stat_group_cell(lkv_stat_group *g, int i)
{
    if (g == NULL || g->cells == NULL || g->hists != NULL || i < 0 || i >= g->n) {
        return NULL;
    }
    return &g->cells[i];
}

int lkv_stats_foreach(lkv_stats *r, const char *section, lkv_stats_visit_fn fn, void *ctx)
{
    int rc = 0;
    double *vals = NULL;
    int cap = 0;
    pthread_mutex_lock(&r->mu);
    for (lkv_stat_group *g = r->head; g != NULL && rc == 0; g = g->next) {
        if (g->hists != NULL) {
            continue; /* Histograms: lkv_stats_foreach_hist. */
        }
        int any = section == NULL;
        for (int i = 0; i < g->n && !any; i++) {
            any = g->descs[i].section != NULL && strcmp(g->descs[i].section, section) == 0;
        }
        if (!any) {
            continue;
        }
        if (g->read != NULL) {
            if (g->n > cap) {
                cap = g->n;
                free(vals);
                vals = lkv_xcalloc((size_t)cap, sizeof(*vals));
            }
            memset(vals, 0, sizeof(*vals) * (size_t)g->n);
            g->read(g->ctx, vals, g->n);
        }
        for (int i = 0; i < g->n && rc == 0; i++) {
            const lkv_stat_desc *d = &g->descs[i];
            if (section != NULL && (d->section == NULL || strcmp(d->section, section) != 0)) {
                continue;
            }
            double v = g->read != NULL ? vals[i] : (double)lkv_stat_load(&g->cells[i]);
            rc = fn(ctx, d, v);
        }
    }
    pthread_mutex_unlock(&r->mu);
    free(vals);
    return rc;
}

int lkv_stats_count(lkv_stats *r)
{
    pthread_mutex_lock(&r->mu);
    int n = r->count;
    pthread_mutex_unlock(&r->mu);
    return n;
}
