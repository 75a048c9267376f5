/*
 * resid_bench.c: what the residency controls cost in the real store (storage/lkv_store_resid.c):
 * host arena, RocksDB cold tier (write-back), a tiny profile (1 KiB blocks, one 4 KiB page a
 * document). For each store size N it measures, in one run:
 *   put        puts a second of N one-block documents, plain (the baseline) and with options
 *              (tenant, priority, TTL): the options must cost nothing measurable;
 *   expire     lkv_store_expire when nothing expired (the maintenance thread's idle sweep,
 *              every second, under the store lock) and when all N expired (then it drops them);
 *   hold_class lkv_store_hold_class on / off of a tenant holding half the documents;
 *   evict      lkv_store_evict_class of that tenant (demotion to the cold tier);
 *   max lookup the longest lookup of a concurrent reader thread during the mass expiry (how
 *              long the sweep holds the store lock at a stretch, as a caller sees it), against
 *              the baseline: the same run on a store with sweep_batch = UINT32_MAX (the whole
 *              sweep in one lock hold, as the policies' own lkv_policy_expire would do it);
 *   purge      lkv_store_evict_class(purge) of the plain documents, with the same reader.
 * All times in ms except the puts (us per put, the median of chunks of 250).
 * Prints a table and writes JSON (argv[1], default resid_bench.json). Usage:
 *   resid_bench [OUT.json] [N...]   (default N: 1000 10000 50000)
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "lkv_dockey.h"
#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_store.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static lkv_profile tiny(void)
{
    lkv_profile p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "tiny");
    p.shape.n_layers = 2;
    p.shape.n_q_heads = 4;
    p.shape.n_kv_heads = 2;
    p.shape.head_dim = 8;
    p.shape.dtype = LKV_DTYPE_F32;
    p.shape.block_tokens = 4;
    p.posenc.kind = LKV_POSENC_ROPE;
    p.posenc.rope_theta = 10000.0;
    p.posenc.rope_pairing = LKV_ROPE_INTERLEAVED;
    p.vocab_size = 65536;
    p.max_doc_tokens = 256;
    return p;
}

static void must(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "resid_bench: %s: %s\n", what, lkv_strerror(rc));
        exit(1);
    }
}

static lkv_store *open_store(const char *dir, uint32_t pages, lkv_profile *prof, uint32_t batch)
{
    lkv_store_config c;
    memset(&c, 0, sizeof c);
    c.data_dir = dir;
    c.hot_bytes = (uint64_t)pages * 4096;
    c.hot_backend = LKV_HOT_HOST;
    c.policy_kind = getenv("RB_POLICY") ? atoi(getenv("RB_POLICY")) : 5; /* adaptive (default). */
    c.durability = LKV_DURABILITY_WRITE_BACK;
    c.profiles = prof;
    c.n_profiles = 1;
    c.maint_ms = 3600000; /* The sweeps below are the only ones. */
    c.sweep_batch = batch;
    lkv_store *s = NULL;
    must(lkv_store_open(&c, &s), "open");
    return s;
}

/* Puts docs [first, first + n) of set tag with options o (NULL: plain). Returns seconds. */
static double put_docs(lkv_store *s, uint32_t tag, uint32_t first, uint32_t n,
                       const lkv_put_opts *o)
{
    uint8_t salt[32], block[1024];
    memset(block, 7, sizeof block);
    lkv_tenant_salt_default(salt);
    double t0 = now_s();
    for (uint32_t i = first; i < first + n; i++) {
        uint32_t tok[4] = {tag, i & 0xffff, i >> 16, 3};
        lkv_store_put *tx = NULL;
        must(lkv_store_put_begin_ex(s, salt, "tiny", tok, 4, o, &tx, NULL, NULL), "put_begin");
        must(lkv_store_put_block(tx, 0, block, sizeof block), "put_block");
        must(lkv_store_put_commit(tx), "put_commit");
    }
    return now_s() - t0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, uint32_t n)
{
    qsort(v, n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* A reader looping lookups while a sweep runs: the longest one is how long the sweep kept the
 * store lock at a stretch (as a caller sees it). */
typedef struct prober {
    lkv_store *s;
    atomic_int stop;
    double max_s;
    uint64_t n;
} prober;

static void *probe_main(void *arg)
{
    prober *p = arg;
    lkv_dockey k;
    memset(&k, 0x5a, sizeof k);
    while (!atomic_load(&p->stop)) {
        lkv_doc_info in;
        double t0 = now_s();
        lkv_store_lookup(p->s, &k, 1, &in);
        double t = now_s() - t0;
        p->max_s = t > p->max_s ? t : p->max_s;
        p->n++;
    }
    return NULL;
}

static pthread_t probe_thread;

static void probe_start(prober *p, lkv_store *s)
{
    memset(p, 0, sizeof *p);
    p->s = s;
    pthread_create(&probe_thread, NULL, probe_main, p);
    while (p->n < 100) {
        sched_yield();
    }
    p->max_s = 0;
}

/* Stops the prober; returns its longest lookup in ms. */
static double probe_stop(prober *p)
{
    atomic_store(&p->stop, 1);
    pthread_join(probe_thread, NULL);
    return p->max_s * 1e3;
}

typedef struct row {
    uint32_t n;
    double put_plain_us, put_opts_us;     /* Per put. */
    double expire_idle_ms, expire_all_ms; /* Per sweep. */
    double hold_on_ms, hold_off_ms, evict_ms;
    double lookup_max_ms; /* Longest lookup of a concurrent reader during the mass expiry. */
    double purge_ms, purge_lookup_max_ms; /* Purge of the plain documents. */
} row;

static row measure(uint32_t n, uint32_t batch)
{
    char dir[] = "/tmp/lkv-resid-bench-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        exit(1);
    }
    lkv_profile prof = tiny();
    row r = {.n = n};
    /* Room for both sets of N (the baseline set and the one with options). */
    lkv_store *s = open_store(dir, 2 * n + 16, &prof, batch);
    /* Plain and optioned puts interleaved in chunks of 250 (alternating which goes first), so
     * both see the same writer backlog and cache state; the per-put time of each is the median
     * over its chunks (the machine is shared: medians resist the neighbours' bursts). Tenant 1
     * gets the first half of the optioned ones, 2 the rest. */
    uint32_t half = n / 2;
    uint32_t nch = (n + 249) / 250;
    double *tp = malloc(sizeof(double) * nch), *to = malloc(sizeof(double) * nch);
    for (uint32_t k = 0, i = 0; i < n; i += 250, k++) {
        uint32_t c = n - i < 250 ? n - i : 250;
        lkv_put_opts o = {.tenant = i < half ? 1 : 2, .prio = 1, .ttl_ms = 600000};
        if (k % 2 == 0) {
            tp[k] = put_docs(s, 0, i, c, NULL) / c;
            to[k] = put_docs(s, 1, i, c, &o) / c;
        } else {
            to[k] = put_docs(s, 1, i, c, &o) / c;
            tp[k] = put_docs(s, 0, i, c, NULL) / c;
        }
    }
    r.put_plain_us = median(tp, nch) * 1e6;
    r.put_opts_us = median(to, nch) * 1e6;
    free(tp);
    free(to);
    uint32_t t1 = 0; /* Tenant 1's share. */
    for (uint32_t i = 0; i < n; i += 250) {
        t1 += i < half ? (n - i < 250 ? n - i : 250) : 0;
    }
    half = t1;
    must(lkv_store_flush(s), "flush");

    uint64_t k = 0;
    const int reps = 20;
    double t0 = now_s();
    for (int i = 0; i < reps; i++) {
        must(lkv_store_expire(s, 0, &k), "expire");
    }
    r.expire_idle_ms = (now_s() - t0) * 1e3 / reps;
    if (k != 0) {
        fprintf(stderr, "resid_bench: %llu expired early\n", (unsigned long long)k);
        exit(1);
    }
    t0 = now_s();
    must(lkv_store_hold_class(s, 1, NULL, 1, NULL), "hold on");
    r.hold_on_ms = (now_s() - t0) * 1e3;
    t0 = now_s();
    must(lkv_store_hold_class(s, 1, NULL, 0, NULL), "hold off");
    r.hold_off_ms = (now_s() - t0) * 1e3;
    uint64_t nh = 0;
    t0 = now_s();
    must(lkv_store_evict_class(s, 2, NULL, 0, &nh, NULL), "evict");
    r.evict_ms = (now_s() - t0) * 1e3;
    if (nh != n - half) {
        fprintf(stderr, "resid_bench: evicted %llu, expected %u\n", (unsigned long long)nh,
                n - half);
        exit(1);
    }
    prober pr;
    probe_start(&pr, s);
    t0 = now_s();
    must(lkv_store_expire(s, wall_ms() + 700000, &k), "expire all");
    r.expire_all_ms = (now_s() - t0) * 1e3;
    r.lookup_max_ms = probe_stop(&pr);
    /* A purge of the n plain documents (both tiers), with the same reader. */
    uint64_t ph = 0, pc = 0;
    probe_start(&pr, s);
    t0 = now_s();
    must(lkv_store_evict_class(s, 0, NULL, 1, &ph, &pc), "purge");
    r.purge_ms = (now_s() - t0) * 1e3;
    r.purge_lookup_max_ms = probe_stop(&pr);
    if (ph + pc != n) {
        fprintf(stderr, "resid_bench: purged %llu, expected %u\n", (unsigned long long)(ph + pc),
                n);
        exit(1);
    }
    if (k != n) {
        fprintf(stderr, "resid_bench: expired %llu, expected %u\n", (unsigned long long)k, n);
        exit(1);
    }
    must(lkv_store_close(s), "close");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "resid_bench: could not remove %s\n", dir);
    }
    return r;
}

int main(int argc, char **argv)
{
    const char *out = argc > 1 ? argv[1] : "resid_bench.json";
    uint32_t ns[16] = {1000, 10000, 50000};
    int nn = 3;
    if (argc > 2) {
        nn = 0;
        for (int i = 2; i < argc && nn < 16; i++) {
            ns[nn++] = (uint32_t)strtoul(argv[i], NULL, 10);
        }
    }
    lkv_log_set_level(LKV_LOG_WARN);
    row rows[16], base[16];
    printf("%6s %6s %7s %7s | %8s %7s | %8s %7s | %7s %7s | %7s %7s %6s\n", "docs", "put", "+opt",
           "idle", "expire", "lookup", "expire", "lookup", "purge", "lookup", "hold", "release",
           "evict");
    printf("%6s %6s %7s %7s | %16s | %16s | %15s | %22s\n", "", "us", "us", "ms",
           "batched: ms, max", "one hold: ms, max", "batched: ms, max", "tenant: ms");
    for (int i = 0; i < nn; i++) {
        rows[i] = measure(ns[i], 0);
        base[i] = measure(ns[i], UINT32_MAX);
        row *r = &rows[i], *b = &base[i];
        printf("%6u %6.2f %7.2f %7.3f | %8.1f %7.2f | %8.1f %7.2f | %7.1f %7.2f | %7.3f %7.3f "
               "%6.2f\n",
               r->n, r->put_plain_us, r->put_opts_us, r->expire_idle_ms, r->expire_all_ms,
               r->lookup_max_ms, b->expire_all_ms, b->lookup_max_ms, r->purge_ms,
               r->purge_lookup_max_ms, r->hold_on_ms, r->hold_off_ms, r->evict_ms);
    }
    FILE *f = fopen(out, "w");
    if (f == NULL) {
        perror(out);
        return 1;
    }
    fprintf(f, "{\"bench\": \"resid_bench\", \"rows\": [");
    for (int i = 0; i < nn; i++) {
        row *r = &rows[i];
        fprintf(
            f,
            "%s{\"docs\": %u, \"put_us\": %.3f, \"put_opts_us\": %.3f, \"expire_idle_ms\": "
            "%.4f, \"expire_all_ms\": %.3f, \"hold_on_ms\": %.4f, \"hold_off_ms\": %.4f, "
            "\"evict_class_ms\": %.3f, \"lookup_max_during_expiry_ms\": %.3f, \"purge_ms\": %.3f, "
            "\"lookup_max_during_purge_ms\": %.3f, \"one_hold_expire_all_ms\": %.3f, "
            "\"one_hold_lookup_max_ms\": %.3f}",
            i ? ", " : "", r->n, r->put_plain_us, r->put_opts_us, r->expire_idle_ms,
            r->expire_all_ms, r->hold_on_ms, r->hold_off_ms, r->evict_ms, r->lookup_max_ms,
            r->purge_ms, r->purge_lookup_max_ms, base[i].expire_all_ms, base[i].lookup_max_ms);
    }
    fprintf(f, "]}\n");
    fclose(f);
    printf("wrote %s\n", out);
    return 0;
}
