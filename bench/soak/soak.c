/*
 * soak.c: the soak benchmark (issue 12 item 7). Many closed-loop clients (default 64, each its
 * own lkv_client handle and its own connection, lkv_client_options.own_connection) hammer a running
 * lazykvd for minutes on a FIXED working set, and every second the benchmark records the daemon's
 * throughput, latency percentiles and errors of that second, and samples the daemon's resident
 * memory (/proc/PID/status VmRSS) and open descriptors (/proc/PID/fd). Flat is the target: a leak
 * shows as RSS or descriptors climbing over the run, a slowdown as throughput sinking.
 *
 * Workload per operation (uniform random document of the working set): 50% Lookup of 4
 * documents by key, 30% Get of one document, 15% Put of a document already cached (the daemon
 * verifies and keeps it), 5% Health Check. The working set (--docs, 256 documents of --tokens
 * 64 tokens in the harness's "itest" shape, 2 KiB blocks) is Put once before the clock starts.
 * A failed call counts as an error and the client goes on.
 *
 * Baseline in the same run: the first window (--window seconds, 30) against the last one:
 * throughput ratio, p99 ratio, RSS and descriptor change. Output: a table of windows on stdout
 * and JSON (--json) with every one-second sample.
 *
 * Latencies go into log2 histograms with 8 sub-buckets per octave (error under 9%) per second;
 * percentiles are read from them (nearest rank, bucket upper bound).
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lkv_client.h"
#include "lkv_err.h"

#define MAX_SECS 3600
#define NB       (64 * 8) /* Histogram buckets: 2^0 .. 2^64 us, 8 per octave. */
#define DEADLINE 10000

typedef struct second {
    atomic_ullong ops, errors;
    atomic_ullong hist[NB];
    uint64_t rss_kib; /* Sampled by the main thread. */
    int fds;
} second;

typedef struct opts {
    const char *target;
    int pid;
    int clients;
    int seconds;
    int window;
    int docs;
    int tokens;
    const char *profile;
    uint32_t block_bytes;
    uint32_t block_tokens;
    const char *json;
} opts;

static opts o = {.target = NULL,
                 .pid = 0,
                 .clients = 64,
                 .seconds = 180,
                 .window = 30,
                 .docs = 256,
                 .tokens = 64,
                 .profile = "itest",
                 .block_bytes = 2048,
                 .block_tokens = 16,
                 .json = NULL};
static second *secs;
static uint8_t (*keys)[LKV_KEY_BYTES];
static uint32_t **doc_tokens;
static uint8_t *doc_blocks; /* One payload shared by every document (content is not checked). */
static uint32_t n_blocks;
static double t_start;
static atomic_int stop;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int bucket(double us)
{
    if (us < 1.0) {
        return 0;
    }
    int e = 0;
    double v = us;
    while (v >= 2.0 && e < 63) {
        v /= 2.0;
        e++;
    }
    int sub = (int)((v - 1.0) * 8.0);
    return e * 8 + (sub > 7 ? 7 : sub);
}

static double bucket_hi(int b)
{
    double base = 1.0;
    for (int i = 0; i < b / 8; i++) {
        base *= 2.0;
    }
    return base * (1.0 + (double)(b % 8 + 1) / 8.0);
}

static double pct(const uint64_t *h, double q)
{
    uint64_t n = 0;
    for (int i = 0; i < NB; i++) {
        n += h[i];
    }
    if (n == 0) {
        return 0;
    }
    uint64_t rank = (uint64_t)(q * (double)n + 0.5);
    rank = rank < 1 ? 1 : rank;
    uint64_t c = 0;
    for (int i = 0; i < NB; i++) {
        c += h[i];
        if (c >= rank) {
            return bucket_hi(i);
        }
    }
    return bucket_hi(NB - 1);
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int get_cb(void *ctx, const lkv_get_header *h, uint32_t index, const void *data, size_t len)
{
    (void)h;
    (void)index;
    (void)data;
    *(uint64_t *)ctx += len;
    return 0;
}

static void *client_main(void *arg)
{
    int tid = (int)(intptr_t)arg;
    lkv_client_options co = {
        .max_message_bytes = 8u << 20, .default_deadline_ms = DEADLINE, .own_connection = 1};
    lkv_client_t *c = NULL;
    if (lkv_client_create(o.target, &co, &c) != 0) {
        fprintf(stderr, "soak: client %d: %s\n", tid, lkv_client_last_error());
        return NULL;
    }
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(tid + 1);
    while (!atomic_load(&stop)) {
        uint64_t r = xorshift(&s);
        int d = (int)(r % (uint64_t)o.docs);
        int kind = (int)((r >> 32) % 100);
        double t0 = now();
        int rc;
        if (kind < 50) {
            lkv_docref refs[4];
            lkv_doc_status st[4];
            for (int i = 0; i < 4; i++) {
                memset(&refs[i], 0, sizeof(refs[i]));
                refs[i].key = keys[(d + i * 61) % o.docs];
            }
            rc = lkv_client_lookup(c, refs, 4, DEADLINE, st);
            for (int i = 0; rc == 0 && i < 4; i++) {
                rc = st[i].present ? 0 : LKV_ENOTFOUND;
            }
        } else if (kind < 80) {
            lkv_docref ref = {.key = keys[d]};
            uint64_t got = 0;
            rc = lkv_client_get(c, &ref, DEADLINE, NULL, get_cb, &got);
            if (rc == 0 && got != (uint64_t)n_blocks * o.block_bytes) {
                rc = LKV_ECORRUPT;
            }
        } else if (kind < 95) {
            lkv_put_reply rep;
            rc = lkv_client_put(c, o.profile, doc_tokens[d], (size_t)o.tokens, doc_blocks, n_blocks,
                                o.block_bytes, DEADLINE, &rep);
            if (rc == 0 && memcmp(rep.key, keys[d], LKV_KEY_BYTES) != 0) {
                rc = LKV_ECORRUPT;
            }
        } else {
            rc = lkv_client_ping(c, "", DEADLINE);
        }
        double t1 = now();
        int sec = (int)(t1 - t_start);
        if (sec < 0 || sec >= MAX_SECS) {
            continue;
        }
        atomic_fetch_add(&secs[sec].ops, 1);
        if (rc != 0) {
            atomic_fetch_add(&secs[sec].errors, 1);
        }
        atomic_fetch_add(&secs[sec].hist[bucket((t1 - t0) * 1e6)], 1);
    }
    lkv_client_destroy(c);
    return NULL;
}

static uint64_t rss_kib(int pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    uint64_t v = 0;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            v = strtoull(line + 6, NULL, 10);
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return v;
}

static int fd_count(int pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", pid);
    DIR *d = opendir(path);
    int n = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        n += e->d_name[0] != '.';
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

typedef struct window {
    double ops_s, p50, p99, rss_mib, rss_max_mib;
    uint64_t errors;
    int fds, fds_max;
} window;

static window summarize(int from, int to)
{
    window w;
    memset(&w, 0, sizeof(w));
    static uint64_t h[NB];
    memset(h, 0, sizeof(h));
    uint64_t ops = 0;
    for (int s = from; s < to; s++) {
        ops += atomic_load(&secs[s].ops);
        w.errors += atomic_load(&secs[s].errors);
        for (int b = 0; b < NB; b++) {
            h[b] += atomic_load(&secs[s].hist[b]);
        }
        double r = (double)secs[s].rss_kib / 1024.0;
        w.rss_max_mib = r > w.rss_max_mib ? r : w.rss_max_mib;
        w.fds_max = secs[s].fds > w.fds_max ? secs[s].fds : w.fds_max;
    }
    w.ops_s = (double)ops / (double)(to - from);
    w.p50 = pct(h, 0.50);
    w.p99 = pct(h, 0.99);
    w.rss_mib = (double)secs[to - 1].rss_kib / 1024.0;
    w.fds = secs[to - 1].fds;
    return w;
}

static void usage(void)
{
    fprintf(stderr, "usage: soak --target HOST:PORT --pid PID [--clients 64] [--seconds 180]\n"
                    "            [--window 30] [--docs 256] [--tokens 64] [--json FILE]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) {
            usage();
        }
        if (strcmp(a, "--target") == 0) {
            o.target = v;
        } else if (strcmp(a, "--pid") == 0) {
            o.pid = atoi(v);
        } else if (strcmp(a, "--clients") == 0) {
            o.clients = atoi(v);
        } else if (strcmp(a, "--seconds") == 0) {
            o.seconds = atoi(v);
        } else if (strcmp(a, "--window") == 0) {
            o.window = atoi(v);
        } else if (strcmp(a, "--docs") == 0) {
            o.docs = atoi(v);
        } else if (strcmp(a, "--tokens") == 0) {
            o.tokens = atoi(v);
        } else if (strcmp(a, "--json") == 0) {
            o.json = v;
        } else {
            usage();
        }
        i++;
    }
    if (o.target == NULL || o.pid <= 0 || o.clients < 1 || o.seconds < 2 || o.seconds > MAX_SECS ||
        o.window < 1 || o.window > o.seconds || o.docs < 8 || o.tokens < 1) {
        usage();
    }
    secs = calloc(MAX_SECS, sizeof(second));
    keys = calloc((size_t)o.docs, LKV_KEY_BYTES);
    doc_tokens = calloc((size_t)o.docs, sizeof(uint32_t *));
    n_blocks = (uint32_t)((o.tokens + (int)o.block_tokens - 1) / (int)o.block_tokens);
    doc_blocks = calloc(n_blocks, o.block_bytes);
    for (size_t i = 0; i < (size_t)n_blocks * o.block_bytes; i++) {
        doc_blocks[i] = (uint8_t)(i * 7 + 1);
    }
    /* Unused token slots of the last block must be zero (the layout): keep tokens a multiple
     * of the block size, or zero the tail. Here every block is full when tokens % 16 == 0. */
    if (o.tokens % (int)o.block_tokens != 0) {
        fprintf(stderr, "soak: --tokens must be a multiple of %u\n", o.block_tokens);
        return 2;
    }
    lkv_client_options co = {.max_message_bytes = 8u << 20, .default_deadline_ms = DEADLINE};
    lkv_client_t *c = NULL;
    if (lkv_client_create(o.target, &co, &c) != 0) {
        fprintf(stderr, "soak: %s\n", lkv_client_last_error());
        return 1;
    }
    for (int d = 0; d < o.docs; d++) {
        doc_tokens[d] = malloc((size_t)o.tokens * sizeof(uint32_t));
        for (int t = 0; t < o.tokens; t++) {
            doc_tokens[d][t] = (uint32_t)((d * 7919 + t * 31 + (t == 0 ? d : 0)) % 1000);
        }
        doc_tokens[d][0] = (uint32_t)(d % 1000);
        doc_tokens[d][1] = (uint32_t)(d / 1000);
        lkv_put_reply rep;
        int rc = lkv_client_put(c, o.profile, doc_tokens[d], (size_t)o.tokens, doc_blocks, n_blocks,
                                o.block_bytes, DEADLINE, &rep);
        if (rc != 0) {
            fprintf(stderr, "soak: put of document %d: %s (%s)\n", d, lkv_err_name(rc),
                    lkv_client_last_error());
            return 1;
        }
        memcpy(keys[d], rep.key, LKV_KEY_BYTES);
    }
    lkv_client_destroy(c);
    fprintf(stderr,
            "soak: %d documents of %d tokens (%u blocks of %u B) cached; %d clients for "
            "%d s\n",
            o.docs, o.tokens, n_blocks, o.block_bytes, o.clients, o.seconds);

    pthread_t *th = calloc((size_t)o.clients, sizeof(pthread_t));
    t_start = now();
    for (int i = 0; i < o.clients; i++) {
        pthread_create(&th[i], NULL, client_main, (void *)(intptr_t)i);
    }
    for (int s = 0; s < o.seconds; s++) {
        double wake = t_start + s + 1;
        double d = wake - now();
        if (d > 0) {
            struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
            nanosleep(&ts, NULL);
        }
        secs[s].rss_kib = rss_kib(o.pid);
        secs[s].fds = fd_count(o.pid);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < o.clients; i++) {
        pthread_join(th[i], NULL);
    }

    int nw = o.seconds / o.window;
    printf("| window (s) | ops/s | p50 (ms) | p99 (ms) | errors | daemon RSS (MiB) | fds |\n");
    printf("|---|---|---|---|---|---|---|\n");
    window first = summarize(0, o.window), last = first, all = summarize(0, o.seconds);
    for (int w = 0; w < nw; w++) {
        window x = summarize(w * o.window, (w + 1) * o.window);
        printf("| %d-%d | %.0f | %.2f | %.2f | %" PRIu64 " | %.1f (max %.1f) | %d (max %d) |\n",
               w * o.window, (w + 1) * o.window, x.ops_s, x.p50 / 1e3, x.p99 / 1e3, x.errors,
               x.rss_mib, x.rss_max_mib, x.fds, x.fds_max);
        last = x;
    }
    printf("| all | %.0f | %.2f | %.2f | %" PRIu64 " | %.1f (max %.1f) | %d (max %d) |\n",
           all.ops_s, all.p50 / 1e3, all.p99 / 1e3, all.errors, all.rss_mib, all.rss_max_mib,
           all.fds, all.fds_max);
    printf("\nlast window vs first (the baseline): throughput x%.2f, p99 x%.2f, RSS %+.1f MiB, "
           "fds %+d\n",
           last.ops_s / (first.ops_s > 0 ? first.ops_s : 1),
           last.p99 / (first.p99 > 0 ? first.p99 : 1), last.rss_mib - first.rss_mib,
           last.fds - first.fds);
    if (o.json != NULL) {
        FILE *f = fopen(o.json, "w");
        if (f == NULL) {
            fprintf(stderr, "soak: %s: %s\n", o.json, strerror(errno));
            return 1;
        }
        fprintf(f, "{\n  \"clients\": %d, \"seconds\": %d, \"docs\": %d, \"tokens\": %d,\n",
                o.clients, o.seconds, o.docs, o.tokens);
        fprintf(f, "  \"mix\": \"50%% lookup4, 30%% get, 15%% put (present), 5%% health\",\n");
        fprintf(
            f,
            "  \"all\": {\"ops_s\": %.1f, \"p50_us\": %.1f, \"p99_us\": %.1f, \"errors\": %" PRIu64
            "},\n",
            all.ops_s, all.p50, all.p99, all.errors);
        fprintf(f,
                "  \"drift\": {\"throughput_ratio\": %.3f, \"p99_ratio\": %.3f, \"rss_mib\": %.1f, "
                "\"fds\": %d},\n",
                last.ops_s / (first.ops_s > 0 ? first.ops_s : 1),
                last.p99 / (first.p99 > 0 ? first.p99 : 1), last.rss_mib - first.rss_mib,
                last.fds - first.fds);
        fprintf(f, "  \"samples\": [\n");
        for (int s = 0; s < o.seconds; s++) {
            uint64_t h[NB];
            for (int b = 0; b < NB; b++) {
                h[b] = atomic_load(&secs[s].hist[b]);
            }
            fprintf(f,
                    "    {\"t\": %d, \"ops\": %llu, \"errors\": %llu, \"p50_us\": %.1f, "
                    "\"p99_us\": %.1f, "
                    "\"rss_kib\": %" PRIu64 ", \"fds\": %d}%s\n",
                    s, (unsigned long long)atomic_load(&secs[s].ops),
                    (unsigned long long)atomic_load(&secs[s].errors), pct(h, 0.5), pct(h, 0.99),
                    secs[s].rss_kib, secs[s].fds, s + 1 < o.seconds ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        fclose(f);
    }
    return all.errors == 0 ? 0 : 3;
}
