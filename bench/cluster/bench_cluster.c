/*
 * bench_cluster.c: lazykv cluster numbers on one machine (issue 17, item 8), all measured in one
 * run against real daemons and a real etcd started here (the integration harness):
 *   1. aggregate Get throughput through the routing client (lkv_cluster_client) with 1, 2 and 3
 *      daemons (the documents re-put at each size, so every Get hits its owner);
 *   2. Lookup latency of one document sent to its owner vs. to a non-owner (forwarded);
 *   3. time from kill -9 of a member to a survivor showing it down.
 * No scaling target: on a 2-core machine the daemons and the client threads share the cores, so
 * the table shows what contention does. Prints a table; writes JSON to argv[1] (default
 * bench/out/cluster.json). Usage: bench_cluster [OUT.json] [SECONDS per point]
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "etcd_harness.h"
#include "lkv_client.h"
#include "lkv_cluster_client.h"
#include "lkv_daemon_harness.h"
#include "lkv_it_util.h"

#define MAX_D   3
#define N_DOCS  64
#define THREADS 4

static lkv_etcd etcd;
static lkv_daemon dm[MAX_D];
static it_doc docs[N_DOCS];
static char tokfile[600];
static double seconds = 3.0;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void start_member(int i)
{
    static char idarg[MAX_D][32], etcdarg[128], tokarg[700];
    snprintf(idarg[i], sizeof(idarg[i]), "cluster_id=b%d", i);
    snprintf(etcdarg, sizeof(etcdarg), "cluster_etcd=%s", etcd.endpoint);
    snprintf(tokarg, sizeof(tokarg), "cluster_token_file=%s", tokfile);
    const char *extra[] = {LKV_IT_PROFILE_ARGS,
                           "--set",
                           "cluster_mode=etcd",
                           "--set",
                           etcdarg,
                           "--set",
                           idarg[i],
                           "--set",
                           tokarg,
                           "--set",
                           "cluster_lease_ttl=2s",
                           "--set",
                           "cluster_health_interval=100ms",
                           "--set",
                           "cluster_down_after=1s",
                           NULL};
    lkv_daemon_init(&dm[i], extra);
    lkv_it_start(&dm[i]);
}

static int up_count(int i)
{
    lkv_client_t *c = lkv_it_client(&dm[i]);
    lkv_cluster_info ci;
    int n = -1;
    if (lkv_client_cluster(c, 1000, &ci) == 0) {
        n = 0;
        for (size_t k = 0; k < ci.n_members; k++) {
            n += strcmp(ci.members[k].state, "up") == 0;
        }
        lkv_cluster_info_free(&ci);
    }
    lkv_client_destroy(c);
    return n;
}

static void wait_up(int n_members)
{
    for (int tries = 0; tries < 400; tries++) {
        int ok = 1;
        for (int i = 0; i < n_members; i++) {
            ok &= up_count(i) == n_members;
        }
        if (ok) {
            return;
        }
        struct timespec ts = {0, 25000000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "cluster of %d did not form\n", n_members);
    exit(1);
}

typedef struct worker {
    lkv_cluster_client_t *r;
    int id;
    double end;
    long gets, errors;
    uint64_t bytes;
} worker;

static void *get_loop(void *arg)
{
    worker *w = arg;
    uint64_t x = (uint64_t)w->id * 7919 + 1;
    while (now_s() < w->end) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const it_doc *d = &docs[(x >> 33) % N_DOCS];
        lkv_docref ref = lkv_it_ref(&lkv_it_itest, d);
        lkv_get_header h;
        uint8_t *data = NULL;
        size_t len = 0;
        if (lkv_cluster_client_get_buf(w->r, &ref, 5000, &h, &data, &len) == 0) {
            w->gets++;
            w->bytes += len;
            free(data);
        } else {
            w->errors++;
        }
    }
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *out = argc > 1 ? argv[1] : "bench/out/cluster.json";
    if (argc > 2) {
        seconds = atof(argv[2]);
    }
    if (!lkv_etcd_available() || lkv_etcd_start(&etcd) != 0) {
        fprintf(stderr, "etcd needed (apt-get install etcd-server etcd-client)\n");
        return 77;
    }
    snprintf(tokfile, sizeof(tokfile), "%s/token", etcd.dir);
    FILE *tf = fopen(tokfile, "w");
    fprintf(tf, "lkv_bench_cluster_token_0123456789\n");
    fclose(tf);
    for (int i = 0; i < N_DOCS; i++) {
        lkv_it_doc_make(&lkv_it_itest, 500 + (uint64_t)i, 64, &docs[i]);
    }
    double gets_per_s[MAX_D + 1] = {0}, mib_per_s[MAX_D + 1] = {0};
    long errors[MAX_D + 1] = {0};
    for (int n = 1; n <= MAX_D; n++) {
        start_member(n - 1);
        wait_up(n);
        lkv_cluster_client_t *r = NULL;
        if (lkv_cluster_client_create(dm[0].addr, NULL, 5000, &r) != 0) {
            return 1;
        }
        for (int i = 0; i < N_DOCS; i++) {
            lkv_cluster_client_put(r, "itest", docs[i].tokens, docs[i].n_tokens, docs[i].blocks,
                                   docs[i].n_blocks, docs[i].block_bytes, 5000, NULL);
        }
        worker w[THREADS];
        pthread_t th[THREADS];
        double t0 = now_s();
        for (int k = 0; k < THREADS; k++) {
            w[k] = (worker){.r = r, .id = k, .end = t0 + seconds};
            pthread_create(&th[k], NULL, get_loop, &w[k]);
        }
        long g = 0;
        uint64_t b = 0;
        for (int k = 0; k < THREADS; k++) {
            pthread_join(th[k], NULL);
            g += w[k].gets;
            b += w[k].bytes;
            errors[n] += w[k].errors;
        }
        double dt = now_s() - t0;
        gets_per_s[n] = (double)g / dt;
        mib_per_s[n] = (double)b / dt / (1 << 20);
        lkv_cluster_client_destroy(r);
    }
    /* Lookup latency: owner vs. non-owner (forwarded), one document, 400 calls each. */
    lkv_cluster_client_t *r = NULL;
    lkv_cluster_client_create(dm[0].addr, NULL, 5000, &r);
    lkv_docref ref = lkv_it_ref(&lkv_it_itest, &docs[0]);
    char owner[128], other[128] = "";
    lkv_cluster_client_owner(r, lkv_cluster_client_route(r, &ref), owner, sizeof(owner));
    for (int i = 0; i < MAX_D; i++) {
        if (strcmp(dm[i].addr, owner) != 0) {
            snprintf(other, sizeof(other), "%s", dm[i].addr);
            break;
        }
    }
    enum { CALLS = 400 };
    static double lat[2][CALLS];
    const char *targets[2] = {owner, other};
    for (int t = 0; t < 2; t++) {
        lkv_client_t *c = lkv_cluster_client_member(r, targets[t]);
        for (int k = 0; k < CALLS; k++) {
            lkv_doc_status st;
            double a = now_s();
            lkv_client_lookup(c, &ref, 1, 2000, &st);
            lat[t][k] = (now_s() - a) * 1e6;
        }
        qsort(lat[t], CALLS, sizeof(double), cmp_d);
    }
    lkv_cluster_client_destroy(r);
    /* kill -9 -> marked down at a survivor (down_after 1 s, probes every 100 ms). */
    double t_kill = now_s();
    lkv_daemon_stop(&dm[MAX_D - 1], SIGKILL, 5000);
    double down_ms = -1;
    while (now_s() - t_kill < 10) {
        if (up_count(0) == MAX_D - 1) {
            down_ms = (now_s() - t_kill) * 1000;
            break;
        }
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    printf("lazykv cluster on one machine (%ld cores online), itest profile, %d documents of 8 "
           "KiB, %d client threads, %.1f s per point\n",
           sysconf(_SC_NPROCESSORS_ONLN), N_DOCS, THREADS, seconds);
    printf("%-34s %12s %10s %8s\n", "daemons", "gets/s", "MiB/s", "errors");
    for (int n = 1; n <= MAX_D; n++) {
        printf("%-34d %12.0f %10.1f %8ld\n", n, gets_per_s[n], mib_per_s[n], errors[n]);
    }
    printf("%-34s %12s %10s\n", "Lookup of one document", "p50 us", "p99 us");
    printf("%-34s %12.0f %10.0f\n", "  at its owner", lat[0][CALLS / 2], lat[0][CALLS * 99 / 100]);
    printf("%-34s %12.0f %10.0f\n", "  at a non-owner (forwarded)", lat[1][CALLS / 2],
           lat[1][CALLS * 99 / 100]);
    printf("%-34s %12.0f ms (down_after 1000 ms, probe every 100 ms)\n", "kill -9 -> marked down",
           down_ms);
    mkdir("bench/out", 0755);
    FILE *f = fopen(out, "w");
    if (f != NULL) {
        fprintf(f,
                "{\"bench\": \"cluster\", \"cores\": %ld, \"docs\": %d, \"threads\": %d, "
                "\"seconds\": %.1f, \"get_throughput\": [",
                sysconf(_SC_NPROCESSORS_ONLN), N_DOCS, THREADS, seconds);
        for (int n = 1; n <= MAX_D; n++) {
            fprintf(f,
                    "%s{\"daemons\": %d, \"gets_per_s\": %.1f, \"mib_per_s\": %.2f, "
                    "\"errors\": %ld}",
                    n > 1 ? ", " : "", n, gets_per_s[n], mib_per_s[n], errors[n]);
        }
        fprintf(f,
                "], \"lookup_us\": {\"owner_p50\": %.1f, \"owner_p99\": %.1f, "
                "\"forwarded_p50\": %.1f, \"forwarded_p99\": %.1f}, \"kill9_to_down_ms\": %.1f}\n",
                lat[0][CALLS / 2], lat[0][CALLS * 99 / 100], lat[1][CALLS / 2],
                lat[1][CALLS * 99 / 100], down_ms);
        fclose(f);
    }
    for (int i = 0; i < MAX_D; i++) {
        lkv_daemon_stop(&dm[i], SIGTERM, 10000);
        lkv_daemon_cleanup(&dm[i]);
    }
    lkv_etcd_destroy(&etcd);
    return 0;
}
