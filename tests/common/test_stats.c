/*
 * test_stats.c: the statistics registry (common/lkv_stats.h): register and iterate in order
 * with copied descriptors, owned cells bumped from many threads at once (exact totals, and a
 * concurrent reader that never sees a counter go back), read-fn groups (one call per
 * iteration, section filtering), labels, every malformed or duplicate registration refused
 * with a log line naming the stat and nothing registered, unregistration racing iteration
 * (no read fn runs after unregister returns), and destroy with groups still registered;
 * histograms: observations land in the right bucket at the bounds (le is inclusive), the counts
 * come out cumulative with the +Inf bucket equal to the total, the sum is exact under
 * concurrent observers, INFO iteration skips them, and bad bounds or kinds are refused.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "lkv_log.h"
#include "lkv_stats.h"
#include "lkv_test.h"

typedef struct seen {
    char names[32][160]; /* "section|key|name{labels}|kind|unit". */
    double vals[32];
    int n;
} seen;

static int collect(void *ctx, const lkv_stat_desc *d, double v)
{
    seen *s = ctx;
    if (s->n < 32) {
        snprintf(s->names[s->n], sizeof(s->names[0]), "%s|%s|%s{%s}|%d|%s",
                 d->section ? d->section : "-", d->key, d->name, d->labels, d->kind, d->unit);
        s->vals[s->n++] = v;
    }
    return 0;
}

static void test_register_iterate(void)
{
    lkv_stats *r;
    ASSERT_OK(lkv_stats_create(&r));
    char name[32], labels[32];
    snprintf(name, sizeof(name), "store_hits");
    snprintf(labels, sizeof(labels), "tier=hot");
    lkv_stat_desc d[3] = {
        {.name = name,
         .labels = labels,
         .kind = LKV_STAT_COUNTER,
         .unit = "docs",
         .help = "Lookups that hit.",
         .section = "lookups",
         .key = "hits_hot"},
        {.name = "store_hits",
         .labels = "tier=cold",
         .kind = LKV_STAT_COUNTER,
         .unit = "docs",
         .section = "lookups",
         .key = "hits_cold"},
        {.name = "queue_depth", .kind = LKV_STAT_GAUGE}, /* No section, no key, no unit. */
    };
    lkv_stat_group *g;
    ASSERT_OK(lkv_stats_register(r, d, 3, NULL, NULL, &g));
    /* The registry copied every string: scribble over the originals. */
    memset(name, 'X', sizeof(name) - 1);
    memset(labels, 'Y', sizeof(labels) - 1);
    ASSERT_EQ(lkv_stats_count(r), 3);
    lkv_stat_add(lkv_stat_group_cell(g, 0), 5);
    lkv_stat_add(lkv_stat_group_cell(g, 0), 2);
    lkv_stat_add(lkv_stat_group_cell(g, 1), 1);
    lkv_stat_set(lkv_stat_group_cell(g, 2), 40);
    lkv_stat_sub(lkv_stat_group_cell(g, 2), 1);
    ASSERT_TRUE(lkv_stat_group_cell(g, 3) == NULL);
    ASSERT_TRUE(lkv_stat_group_cell(g, -1) == NULL);
    /* Cells are on separate cache lines. */
    ASSERT_TRUE((uintptr_t)lkv_stat_group_cell(g, 1) - (uintptr_t)lkv_stat_group_cell(g, 0) >= 64);
    ASSERT_EQ((uintptr_t)lkv_stat_group_cell(g, 1) % 64, 0);

    seen s = {0};
    ASSERT_OK(lkv_stats_foreach(r, NULL, collect, &s));
    ASSERT_EQ(s.n, 3);
    ASSERT_TRUE(strcmp(s.names[0], "lookups|hits_hot|store_hits{tier=hot}|0|docs") == 0);
    ASSERT_TRUE(strcmp(s.names[1], "lookups|hits_cold|store_hits{tier=cold}|0|docs") == 0);
    ASSERT_TRUE(strcmp(s.names[2], "-|queue_depth|queue_depth{}|1|") == 0);
    ASSERT_EQ(s.vals[0], 7);
    ASSERT_EQ(s.vals[1], 1);
    ASSERT_EQ(s.vals[2], 39);

    /* Section filter: the stat without a section is left out. */
    memset(&s, 0, sizeof(s));
    ASSERT_OK(lkv_stats_foreach(r, "lookups", collect, &s));
    ASSERT_EQ(s.n, 2);
    memset(&s, 0, sizeof(s));
    ASSERT_OK(lkv_stats_foreach(r, "nothing", collect, &s));
    ASSERT_EQ(s.n, 0);
    lkv_stats_destroy(r); /* With the group still registered: freed too (ASan checks). */
}

static int stop_at_second(void *ctx, const lkv_stat_desc *d, double v)
{
    int *n = ctx;
    (void)d;
    (void)v;
    return ++*n == 2 ? 42 : 0;
}

/* ---- concurrency ------------------------------------------------------------------------ */

#define THREADS 8
#define BUMPS   200000

typedef struct bump_arg {
    lkv_stat_cell *a, *b; /* Shared cells. */
    lkv_stat_cell *own;   /* This thread's cell. */
} bump_arg;

static void *bumper(void *p)
{
    bump_arg *a = p;
    for (int i = 0; i < BUMPS; i++) {
        lkv_stat_add(a->a, 1);
        lkv_stat_add(a->b, 3);
        lkv_stat_add(a->own, 1);
    }
    return NULL;
}

typedef struct watch {
    lkv_stats *r;
    atomic_int stop;
    double last; /* Last value of "a" seen. */
    int went_back;
    long rounds;
} watch;

static int watch_visit(void *ctx, const lkv_stat_desc *d, double v)
{
    watch *w = ctx;
    if (strcmp(d->name, "bumps") == 0 && strcmp(d->labels, "cell=a") == 0) {
        if (v < w->last) {
            w->went_back = 1;
        }
        w->last = v;
    }
    return 0;
}

static void *watcher(void *p)
{
    watch *w = p;
    while (!atomic_load(&w->stop)) {
        lkv_stats_foreach(w->r, NULL, watch_visit, w);
        w->rounds++;
    }
    return NULL;
}

static void test_concurrent(void)
{
    lkv_stats *r;
    ASSERT_OK(lkv_stats_create(&r));
    lkv_stat_desc d[2 + THREADS];
    char labels[THREADS][16];
    d[0] = (lkv_stat_desc){.name = "bumps", .labels = "cell=a", .kind = LKV_STAT_COUNTER};
    d[1] = (lkv_stat_desc){.name = "bumps", .labels = "cell=b", .kind = LKV_STAT_COUNTER};
    for (int i = 0; i < THREADS; i++) {
        snprintf(labels[i], sizeof(labels[i]), "thread=%d", i);
        d[2 + i] = (lkv_stat_desc){.name = "bumps", .labels = labels[i], .kind = LKV_STAT_COUNTER};
    }
    lkv_stat_group *g;
    ASSERT_OK(lkv_stats_register(r, d, 2 + THREADS, NULL, NULL, &g));
    watch w = {.r = r};
    atomic_init(&w.stop, 0);
    pthread_t wt, th[THREADS];
    bump_arg args[THREADS];
    ASSERT_EQ(pthread_create(&wt, NULL, watcher, &w), 0);
    for (int i = 0; i < THREADS; i++) {
        args[i].a = lkv_stat_group_cell(g, 0);
        args[i].b = lkv_stat_group_cell(g, 1);
        args[i].own = lkv_stat_group_cell(g, 2 + i);
        ASSERT_EQ(pthread_create(&th[i], NULL, bumper, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
    }
    atomic_store(&w.stop, 1);
    pthread_join(wt, NULL);
    ASSERT_EQ(w.went_back, 0);
    ASSERT_TRUE(w.rounds > 0);
    seen s = {0};
    ASSERT_OK(lkv_stats_foreach(r, NULL, collect, &s));
    ASSERT_EQ(s.n, 2 + THREADS);
    ASSERT_EQ(s.vals[0], (double)THREADS * BUMPS);
    ASSERT_EQ(s.vals[1], 3.0 * THREADS * BUMPS);
    for (int i = 0; i < THREADS; i++) {
        ASSERT_EQ(s.vals[2 + i], BUMPS);
    }
    int n = 0;
    ASSERT_EQ(lkv_stats_foreach(r, NULL, stop_at_second, &n), 42);
    ASSERT_EQ(n, 2);
    lkv_stats_unregister(r, g);
    ASSERT_EQ(lkv_stats_count(r), 0);
    lkv_stats_destroy(r);
}

/* ---- read fns --------------------------------------------------------------------------- */

typedef struct src {
    int calls;        /* Read fn calls. */
    atomic_int alive; /* 0 once unregistered: a read must never see it. */
    int bad;          /* A read ran after unregister. */
    double base;
} src;

static void src_read(void *ctx, double *vals, int n)
{
    src *s = ctx;
    if (!atomic_load(&s->alive)) {
        s->bad = 1;
    }
    s->calls++;
    for (int i = 0; i < n; i++) {
        vals[i] = s->base + i;
    }
}

static void test_read_fn(void)
{
    lkv_stats *r;
    ASSERT_OK(lkv_stats_create(&r));
    src a = {.base = 10}, b = {.base = 0.25};
    atomic_init(&a.alive, 1);
    atomic_init(&b.alive, 1);
    lkv_stat_desc da[2] = {
        {.name = "hot_docs",
         .kind = LKV_STAT_GAUGE,
         .unit = "docs",
         .section = "hot",
         .key = "docs"},
        {.name = "hot_blocks",
         .kind = LKV_STAT_GAUGE,
         .unit = "blocks",
         .section = "hot",
         .key = "blocks"},
    };
    lkv_stat_desc db[1] = {
        {.name = "hit_ratio",
         .kind = LKV_STAT_GAUGE,
         .unit = "ratio",
         .section = "lookups",
         .key = "hit_rate_docs"},
    };
    lkv_stat_group *ga, *gb;
    ASSERT_OK(lkv_stats_register(r, da, 2, src_read, &a, &ga));
    ASSERT_OK(lkv_stats_register(r, db, 1, src_read, &b, &gb));
    ASSERT_TRUE(lkv_stat_group_cell(ga, 0) == NULL); /* No cells with a read fn. */
    seen s = {0};
    ASSERT_OK(lkv_stats_foreach(r, NULL, collect, &s));
    ASSERT_EQ(a.calls, 1); /* Once per iteration, not once per stat. */
    ASSERT_EQ(b.calls, 1);
    ASSERT_EQ(s.n, 3);
    ASSERT_EQ(s.vals[0], 10);
    ASSERT_EQ(s.vals[1], 11);
    ASSERT_NEAR(s.vals[2], 0.25, 0);
    memset(&s, 0, sizeof(s));
    ASSERT_OK(lkv_stats_foreach(r, "lookups", collect, &s));
    ASSERT_EQ(a.calls, 1); /* Not asked: none of its stats is in "lookups". */
    ASSERT_EQ(b.calls, 2);
    ASSERT_EQ(s.n, 1);
    lkv_stats_unregister(r, ga);
    atomic_store(&a.alive, 0);
    memset(&s, 0, sizeof(s));
    ASSERT_OK(lkv_stats_foreach(r, NULL, collect, &s));
    ASSERT_EQ(s.n, 1);
    ASSERT_EQ(a.calls, 1);
    ASSERT_EQ(a.bad, 0);
    /* The names are free again. */
    ASSERT_OK(lkv_stats_register(r, da, 2, src_read, &b, &ga));
    ASSERT_EQ(lkv_stats_count(r), 3);
    lkv_stats_destroy(r);
}

/* ---- refusals --------------------------------------------------------------------------- */

/* Runs register with stderr captured; returns the rc and the log text in log. */
static int register_logged(lkv_stats *r, const lkv_stat_desc *d, int n, char *log, size_t len)
{
    char path[] = "/tmp/lkv_stats_logXXXXXX";
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    int rc = lkv_stats_register(r, d, n, NULL, NULL, NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ssize_t got = pread(fd, log, len - 1, 0);
    log[got > 0 ? got : 0] = '\0';
    close(fd);
    unlink(path);
    return rc;
}

static void test_refusals(void)
{
    lkv_stats *r;
    char log[1024];
    ASSERT_OK(lkv_stats_create(&r));
    lkv_stat_desc base[2] = {
        {.name = "store_hits",
         .labels = "tier=hot",
         .kind = LKV_STAT_COUNTER,
         .unit = "docs",
         .section = "lookups",
         .key = "hits_hot"},
        {.name = "store_misses",
         .kind = LKV_STAT_COUNTER,
         .unit = "docs",
         .section = "lookups",
         .key = "misses"},
    };
    ASSERT_OK(lkv_stats_register(r, base, 2, NULL, NULL, NULL));

    /* Same name and labels in a later group: refused whole, with the stat named. */
    lkv_stat_desc dup[2] = {
        {.name = "fresh_one", .kind = LKV_STAT_COUNTER},
        {.name = "store_hits", .labels = "tier=hot", .kind = LKV_STAT_COUNTER, .unit = "docs"},
    };
    ASSERT_ERR(register_logged(r, dup, 2, log, sizeof(log)), LKV_EEXIST);
    ASSERT_TRUE(strstr(log, "store_hits{tier=hot}") != NULL);
    ASSERT_TRUE(strstr(log, "already registered") != NULL);
    ASSERT_EQ(lkv_stats_count(r), 2); /* fresh_one was not registered either. */
    seen s = {0};
    ASSERT_OK(lkv_stats_foreach(r, NULL, collect, &s));
    ASSERT_EQ(s.n, 2);

    /* Same name, other labels: fine; other kind or unit under a name: refused. */
    lkv_stat_desc ok = {
        .name = "store_hits", .labels = "tier=cold", .kind = LKV_STAT_COUNTER, .unit = "docs"};
    ASSERT_OK(lkv_stats_register(r, &ok, 1, NULL, NULL, NULL));
    lkv_stat_desc kind = {
        .name = "store_hits", .labels = "tier=x", .kind = LKV_STAT_GAUGE, .unit = "docs"};
    ASSERT_ERR(register_logged(r, &kind, 1, log, sizeof(log)), LKV_EINVAL);
    ASSERT_TRUE(strstr(log, "another kind or unit") != NULL);
    lkv_stat_desc unit = {
        .name = "store_hits", .labels = "tier=y", .kind = LKV_STAT_COUNTER, .unit = "bytes"};
    ASSERT_ERR(register_logged(r, &unit, 1, log, sizeof(log)), LKV_EINVAL);

    /* Another name in a taken INFO slot. */
    lkv_stat_desc slot = {
        .name = "other", .kind = LKV_STAT_COUNTER, .section = "lookups", .key = "misses"};
    ASSERT_ERR(register_logged(r, &slot, 1, log, sizeof(log)), LKV_EEXIST);
    ASSERT_TRUE(strstr(log, "section and key") != NULL);
    /* A duplicate inside one group. */
    lkv_stat_desc twice[2] = {{.name = "twice", .kind = LKV_STAT_COUNTER},
                              {.name = "twice", .kind = LKV_STAT_COUNTER}};
    ASSERT_ERR(register_logged(r, twice, 2, log, sizeof(log)), LKV_EEXIST);
    ASSERT_TRUE(strstr(log, "twice{}") != NULL);

    /* Malformed descriptors. */
    static const char *const bad_names[] = {"", "Caps", "9lives", "has-dash", "sp ace", NULL};
    for (int i = 0; bad_names[i] != NULL; i++) {
        lkv_stat_desc b = {.name = bad_names[i], .kind = LKV_STAT_COUNTER};
        ASSERT_ERR(register_logged(r, &b, 1, log, sizeof(log)), LKV_EINVAL);
    }
    lkv_stat_desc null_name = {.kind = LKV_STAT_COUNTER};
    ASSERT_ERR(register_logged(r, &null_name, 1, log, sizeof(log)), LKV_EINVAL);
    static const char *const bad_labels[] = {"tier",   "=hot",   "tier=", "tier=a,",  "Tier=a",
                                             "t=a\"b", "t=a\\b", "t=a=b", "t=a,,u=b", NULL};
    for (int i = 0; bad_labels[i] != NULL; i++) {
        lkv_stat_desc b = {.name = "lab", .labels = bad_labels[i], .kind = LKV_STAT_COUNTER};
        ASSERT_ERR(register_logged(r, &b, 1, log, sizeof(log)), LKV_EINVAL);
    }
    lkv_stat_desc good_labels = {
        .name = "lab", .labels = "method=Cache.Put,tenant=team-a_1", .kind = LKV_STAT_COUNTER};
    ASSERT_OK(lkv_stats_register(r, &good_labels, 1, NULL, NULL, NULL));
    lkv_stat_desc bad_kind = {.name = "k", .kind = 7};
    ASSERT_ERR(register_logged(r, &bad_kind, 1, log, sizeof(log)), LKV_EINVAL);
    lkv_stat_desc empty_section = {.name = "k", .kind = LKV_STAT_GAUGE, .section = ""};
    ASSERT_ERR(register_logged(r, &empty_section, 1, log, sizeof(log)), LKV_EINVAL);
    lkv_stat_desc ctl = {.name = "k", .kind = LKV_STAT_GAUGE, .help = "two\nlines"};
    ASSERT_ERR(register_logged(r, &ctl, 1, log, sizeof(log)), LKV_EINVAL);
    char longname[80];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    lkv_stat_desc lng = {.name = longname, .kind = LKV_STAT_GAUGE};
    ASSERT_ERR(register_logged(r, &lng, 1, log, sizeof(log)), LKV_EINVAL);
    ASSERT_ERR(lkv_stats_register(r, &ok, 0, NULL, NULL, NULL), LKV_EINVAL);
    ASSERT_ERR(lkv_stats_register(r, NULL, 1, NULL, NULL, NULL), LKV_EINVAL);
    ASSERT_EQ(lkv_stats_count(r), 4);
    lkv_stats_unregister(r, NULL); /* No-op. */
    lkv_stats_destroy(r);
    lkv_stats_destroy(NULL);
}

/* ---- unregister racing iteration --------------------------------------------------------- */

typedef struct iter_arg {
    lkv_stats *r;
    atomic_int stop;
} iter_arg;

static int count_visit(void *ctx, const lkv_stat_desc *d, double v)
{
    (void)d;
    (void)v;
    (*(long *)ctx)++;
    return 0;
}

static void *iterator(void *p)
{
    iter_arg *a = p;
    long n = 0;
    while (!atomic_load(&a->stop)) {
        lkv_stats_foreach(a->r, NULL, count_visit, &n);
    }
    return NULL;
}

static void test_unregister_race(void)
{
    lkv_stats *r;
    ASSERT_OK(lkv_stats_create(&r));
    iter_arg ia = {.r = r};
    atomic_init(&ia.stop, 0);
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(pthread_create(&t[i], NULL, iterator, &ia), 0);
    }
    lkv_stat_desc d[2] = {{.name = "racy_a", .kind = LKV_STAT_GAUGE, .section = "racy"},
                          {.name = "racy_b", .kind = LKV_STAT_COUNTER, .section = "racy"}};
    int bad = 0;
    for (int round = 0; round < 2000; round++) {
        src *s = calloc(1, sizeof(*s));
        atomic_init(&s->alive, 1);
        lkv_stat_group *g, *c;
        ASSERT_OK(lkv_stats_register(r, d, 2, src_read, s, &g));
        lkv_stat_desc cd = {.name = "racy_cell", .kind = LKV_STAT_COUNTER};
        ASSERT_OK(lkv_stats_register(r, &cd, 1, NULL, NULL, &c));
        lkv_stat_add(lkv_stat_group_cell(c, 0), 1);
        lkv_stats_unregister(r, g);
        atomic_store(&s->alive, 0); /* A read fn running now would flag it. */
        lkv_stats_unregister(r, c);
        bad |= s->bad;
        free(s); /* ASan: a read after unregister would be a use after free. */
    }
    atomic_store(&ia.stop, 1);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
    }
    ASSERT_EQ(bad, 0);
    ASSERT_EQ(lkv_stats_count(r), 0);
    lkv_stats_destroy(r);
}

typedef struct hist_seen {
    const char *want; /* Labels of the histogram to copy. */
    char name[64];
    uint64_t cum[LKV_STAT_HIST_MAX_BUCKETS + 1];
    int nb;
    uint64_t sum;
    int n;
} hist_seen;

static int hist_collect(void *ctx, const lkv_stat_desc *d, const uint64_t *bounds,
                        const uint64_t *cum, int nb, uint64_t sum)
{
    hist_seen *h = ctx;
    (void)bounds;
    if (strcmp(d->labels, h->want) == 0) {
        snprintf(h->name, sizeof(h->name), "%s{%s}", d->name, d->labels);
        memcpy(h->cum, cum, sizeof(uint64_t) * (size_t)(nb + 1));
        h->nb = nb;
        h->sum = sum;
    }
    h->n++;
    return 0;
}

typedef struct hist_arg {
    lkv_stat_hist *h;
    int id;
} hist_arg;

static void *hist_bumper(void *p)
{
    hist_arg *a = p;
    for (int i = 0; i < 100000; i++) {
        lkv_stat_hist_observe(a->h, (uint64_t)((i + a->id) % 7) * 50); /* 0, 50, ... 300. */
    }
    return NULL;
}

static void test_histograms(void)
{
    lkv_stats *r;
    ASSERT_OK(lkv_stats_create(&r));
    static const uint64_t bounds[3] = {100, 200, 250};
    lkv_stat_desc d[2] = {
        {.name = "rpc_duration", .labels = "m=a", .kind = LKV_STAT_HISTOGRAM, .unit = "us"},
        {.name = "rpc_duration", .labels = "m=b", .kind = LKV_STAT_HISTOGRAM, .unit = "us"},
    };
    lkv_stat_group *g;
    ASSERT_OK(lkv_stats_register_hist(r, d, 2, bounds, 3, &g));
    ASSERT_TRUE(lkv_stat_group_cell(g, 0) == NULL);
    ASSERT_TRUE(lkv_stat_group_hist(g, 2) == NULL);
    lkv_stat_hist *h = lkv_stat_group_hist(g, 1);
    ASSERT_TRUE(h != NULL);
    /* Boundaries: 100 is <= 100 (first bucket), 101 is not; 251 only in +Inf. */
    uint64_t obs[] = {0, 100, 101, 200, 201, 250, 251, 100000};
    for (size_t i = 0; i < sizeof(obs) / sizeof(obs[0]); i++) {
        lkv_stat_hist_observe(h, obs[i]);
    }
    hist_seen hs = {.want = "m=b"};
    ASSERT_OK(lkv_stats_foreach_hist(r, hist_collect, &hs));
    ASSERT_EQ(hs.n, 2);
    ASSERT_EQ(strcmp(hs.name, "rpc_duration{m=b}"), 0);
    ASSERT_EQ(hs.nb, 3);
    ASSERT_EQ(hs.cum[0], 2);
    ASSERT_EQ(hs.cum[1], 4);
    ASSERT_EQ(hs.cum[2], 6);
    ASSERT_EQ(hs.cum[3], 8);
    ASSERT_EQ(hs.sum, 0 + 100 + 101 + 200 + 201 + 250 + 251 + 100000);
    /* INFO iteration never sees a histogram. */
    seen s = {0};
    ASSERT_OK(lkv_stats_foreach(r, NULL, collect, &s));
    ASSERT_EQ(s.n, 0);
    /* Concurrent observers: exact totals. */
    pthread_t t[4];
    hist_arg ha[4];
    for (int i = 0; i < 4; i++) {
        ha[i] = (hist_arg){lkv_stat_group_hist(g, 0), i};
        pthread_create(&t[i], NULL, hist_bumper, &ha[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
    }
    uint64_t want_sum = 0, want_le100 = 0;
    for (int id = 0; id < 4; id++) {
        for (int i = 0; i < 100000; i++) {
            uint64_t v = (uint64_t)((i + id) % 7) * 50;
            want_sum += v;
            want_le100 += v <= 100;
        }
    }
    hist_seen h0 = {.want = "m=a"};
    ASSERT_OK(lkv_stats_foreach_hist(r, hist_collect, &h0));
    ASSERT_EQ(h0.cum[0], want_le100);
    ASSERT_EQ(h0.cum[3], 400000);
    ASSERT_EQ(h0.sum, want_sum);
    ASSERT_OK(lkv_stats_foreach_hist(r, hist_collect, &hs)); /* m=b untouched. */
    ASSERT_EQ(hs.cum[3], 8);
    /* Registering name+labels again is refused. */
    lkv_stat_desc dup = {
        .name = "rpc_duration", .labels = "m=a", .kind = LKV_STAT_HISTOGRAM, .unit = "us"};
    ASSERT_ERR(lkv_stats_register_hist(r, &dup, 1, bounds, 3, NULL), LKV_EEXIST);
    /* A counter with a histogram's name and another kind: refused. */
    lkv_stat_desc ctr = {
        .name = "rpc_duration", .labels = "m=c", .kind = LKV_STAT_COUNTER, .unit = "us"};
    ASSERT_ERR(lkv_stats_register(r, &ctr, 1, NULL, NULL, NULL), LKV_EINVAL);
    /* A histogram kind through the plain call, a counter through the histogram call, and bad
     * bounds: refused. */
    lkv_stat_desc hd = {.name = "other", .kind = LKV_STAT_HISTOGRAM};
    ASSERT_ERR(lkv_stats_register(r, &hd, 1, NULL, NULL, NULL), LKV_EINVAL);
    lkv_stat_desc cd = {.name = "other", .kind = LKV_STAT_COUNTER};
    ASSERT_ERR(lkv_stats_register_hist(r, &cd, 1, bounds, 3, NULL), LKV_EINVAL);
    static const uint64_t flat[2] = {5, 5};
    ASSERT_ERR(lkv_stats_register_hist(r, &hd, 1, flat, 2, NULL), LKV_EINVAL);
    ASSERT_ERR(lkv_stats_register_hist(r, &hd, 1, bounds, 0, NULL), LKV_EINVAL);
    ASSERT_ERR(lkv_stats_register_hist(r, &hd, 1, bounds, LKV_STAT_HIST_MAX_BUCKETS + 1, NULL),
               LKV_EINVAL);
    ASSERT_EQ(lkv_stats_count(r), 2);
    lkv_stats_unregister(r, g);
    ASSERT_EQ(lkv_stats_count(r), 0);
    lkv_stats_destroy(r);
}

int main(void)
{
    LKV_RUN(test_register_iterate);
    LKV_RUN(test_concurrent);
    LKV_RUN(test_read_fn);
    LKV_RUN(test_refusals);
    LKV_RUN(test_unregister_race);
    LKV_RUN(test_histograms);
    return 0;
}
