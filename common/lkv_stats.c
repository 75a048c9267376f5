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

struct lkv_stat_group {
    struct lkv_stat_group *prev, *next; /* Registry list links. */
    int n;                              /* Stats. */
    lkv_stat_desc *descs;               /* n copies; strings point into strs[i]. */
    char **strs;                        /* n owned string blocks. */
    lkv_stat_cell *cells;               /* n owned cells (aligned_alloc), or NULL with read. */
    lkv_stats_read_fn read;             /* Or NULL. */
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

/* Checks one descriptor alone; writes why into *why. */
static int desc_ok(const lkv_stat_desc *d, const char **why)
{
    if (d->name == NULL || !name_ok(d->name, strlen(d->name))) {
        *why = "the name is not [a-z_][a-z0-9_]* of at most 63 bytes";
        return 0;
    }
    if (!labels_ok(nz(d->labels))) {
        *why = "the labels are not k=v[,k=v...] with name keys and plain values";
        return 0;
    }
    if (d->kind != LKV_STAT_COUNTER && d->kind != LKV_STAT_GAUGE) {
        *why = "the kind is neither counter nor gauge";
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

int lkv_stats_register(lkv_stats *r, const lkv_stat_desc *descs, int n, lkv_stats_read_fn read,
                       void *ctx, lkv_stat_group **out)
{
    const char *why = NULL;
    int rc = 0, bad = -1;
    if (out != NULL) {
        *out = NULL;
    }
    if (r == NULL || descs == NULL || n < 1) {
        return LKV_EINVAL;
    }
    for (int i = 0; i < n && rc == 0; i++) {
        if (!desc_ok(&descs[i], &why)) {
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
        g->cells = aligned_alloc(_Alignof(lkv_stat_cell), sizeof(lkv_stat_cell) * (size_t)n);
        if (g->cells == NULL) {
            lkv_panic("out of memory (stat cells)");
        }
        for (int i = 0; i < n; i++) {
            atomic_init(&g->cells[i].v, 0);
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
    if (g == NULL || g->cells == NULL || i < 0 || i >= g->n) {
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
