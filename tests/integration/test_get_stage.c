/*
 * test_get_stage.c: integration.get_stage. Get through the staging ring (storage/lkv_stage.h,
 * daemon/lkv_cache_svc.c "Get through the staging ring") of a real lazykvd, driven by the C
 * client. Without a GPU the daemon runs get_staging=always over its host arena, so the ring's
 * parked path (slot wait, copy, resume, slices over the slot, release by gRPC) is the one a
 * CUDA arena takes, minus the DMA; with LKV_IT_STAGE_CUDA=1 (bench/gpu/get_stage.sh, on a GPU
 * host) it runs hot_backend=cuda with get_staging=auto: pinned slots, cudaMemcpyAsync.
 *   - roundtrip: documents of 1..40 blocks of 256 KiB (3 blocks per message, a partial last
 *     message) put, then read by 8 clients at once, twice each, over a ring of 2 slots: every
 *     byte compared; the ring was used (acquired >= messages) and waited (8 readers, 2 slots);
 *     every slot comes back (in_use 0).
 *   - stalled readers: 2 clients begin Gets of 30 MiB documents and stop reading (holding what
 *     slots their messages took); a third client's Gets of every document still complete, byte
 *     for byte, within 10 s (a full ring is served by releases or, past get_stage_wait, by the
 *     copying path, at once while the ring stays starved: never a deadlock, one wait); once
 *     the stalled Gets are cancelled every slot returns and the ring serves again.
 *   - a host arena under get_staging=auto has no ring (Stats has no get_stage section) and
 *     still serves the same bytes from its pages.
 * `it_get_stage bench [OUT.json]` (not a ctest case) measures Get throughput of the ring (one
 * CUDA stream, and spread over 4: get_stage_streams) against get_staging=off (and, for
 * reference, a host arena sent from its pages) in one run:
 * 1, 8 and 32 clients, median of 3 rounds of each; prints a table and writes JSON.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lkv_client.h"
#include "lkv_daemon_harness.h"
#include "lkv_it_util.h"
#include "lkv_test.h"

/* 4 layers x 2 x 4 kv heads x 32 tokens x 128 dims x f16 = 256 KiB blocks. */
static const it_shape S = {"stg", 4, 4, 128, 2, 32, 1000};
#define STG_PROFILE_ARGS                                                                           \
    "--set", "profile.stg.n_layers=4", "--set", "profile.stg.n_q_heads=8", "--set",                \
        "profile.stg.n_kv_heads=4", "--set", "profile.stg.head_dim=128", "--set",                  \
        "profile.stg.dtype=f16", "--set", "profile.stg.block_tokens=32", "--set",                  \
        "profile.stg.vocab_size=1000"

static int g_cuda;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double stat_or(lkv_client_t *c, const char *section, const char *key, double dflt)
{
    lkv_stat_entry *e = NULL;
    size_t n = 0;
    ASSERT_OK(lkv_client_stats_entries(c, section, 0, &e, &n));
    double v = dflt;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(e[i].section, section) == 0 && strcmp(e[i].key, key) == 0) {
            v = e[i].value;
        }
    }
    free(e);
    return v;
}

static double stat_of(lkv_client_t *c, const char *section, const char *key)
{
    double v = stat_or(c, section, key, -1);
    if (v < 0) {
        LKV_FAIL("stat %s.%s not found", section, key);
    }
    return v;
}

/* Waits (up to 5 s) for every slot to come back: gRPC drops the last slices a little after
 * the client has read them. */
static void expect_ring_idle(lkv_client_t *c)
{
    double in_use = 0;
    for (int i = 0; i < 500; i++) {
        in_use = stat_of(c, "get_stage", "in_use");
        if (in_use == 0) {
            return;
        }
        usleep(10 * 1000);
    }
    LKV_FAIL("get_stage in_use stays %.0f after every Get ended", in_use);
}

/* hot: the arena, MiB; all of it but 48 MiB is the stg profile's region (the others share the
 * rest), so every document put stays hot. */
static void start_daemon_x(lkv_daemon *dm, const char *staging, const char *slots,
                           const char *backend, int hot_mib, const char *extra)
{
    char a_stage[64], a_slots[64], a_be[64], a_hot[64], a_region[64];
    snprintf(a_stage, sizeof a_stage, "get_staging=%s", staging);
    snprintf(a_slots, sizeof a_slots, "get_stage_slots=%s", slots);
    snprintf(a_be, sizeof a_be, "hot_backend=%s", backend);
    snprintf(a_hot, sizeof a_hot, "hot_bytes=%dMiB", hot_mib);
    snprintf(a_region, sizeof a_region, "profile.stg.hot_bytes=%dMiB", hot_mib - 48);
    const char *args[] = {STG_PROFILE_ARGS,
                          "--set",
                          a_stage,
                          "--set",
                          a_slots,
                          "--set",
                          "get_stage_wait=300ms",
                          "--set",
                          a_be,
                          "--set",
                          a_hot,
                          "--set",
                          a_region,
                          "--set",
                          "hot_admission=always",
                          "--set",
                          "threads=2",
                          "--set",
                          extra != NULL ? extra : "log_level=info",
                          NULL};
    lkv_daemon_init(dm, args);
    lkv_it_start(dm);
}

static void start_daemon(lkv_daemon *dm, const char *staging, const char *slots,
                         const char *backend, int hot_mib)
{
    start_daemon_x(dm, staging, slots, backend, hot_mib, NULL);
}

/* ---- documents ---- */

#define N_DOCS 24
static it_doc docs[N_DOCS];
static uint32_t n_msgs_per_read; /* Messages one read of every document takes. */

static void make_docs(void)
{
    n_msgs_per_read = 0;
    for (int i = 0; i < N_DOCS; i++) {
        /* 1..40 blocks, some with a partial last block. */
        uint32_t blocks = 1 + (uint32_t)(i * 7 % 40);
        uint32_t tokens = blocks * 32 - (i % 3 == 0 ? 5 : 0);
        lkv_it_doc_make(&S, 9100 + (uint64_t)i, tokens, &docs[i]);
        ASSERT_EQ(docs[i].n_blocks, blocks);
        n_msgs_per_read += (blocks + 2) / 3; /* 3 blocks of 256 KiB per 1 MiB message. */
    }
}

static void put_docs(lkv_client_t *c)
{
    for (int i = 0; i < N_DOCS; i++) {
        lkv_put_reply r;
        ASSERT_OK(lkv_client_put(c, S.profile, docs[i].tokens, docs[i].n_tokens, docs[i].blocks,
                                 docs[i].n_blocks, docs[i].block_bytes, 0, &r));
    }
}

/* Gets docs[i] and compares every byte; returns 0 or the client's error. */
static int get_check(lkv_client_t *c, int i)
{
    lkv_docref ref = lkv_it_ref(&S, &docs[i]);
    lkv_get_header h;
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = lkv_client_get_buf(c, &ref, 0, &h, &data, &len);
    if (rc != 0) {
        return rc;
    }
    ASSERT_EQ(h.n_blocks, docs[i].n_blocks);
    ASSERT_EQ(len, (size_t)docs[i].n_blocks * docs[i].block_bytes);
    if (memcmp(data, docs[i].blocks, len) != 0) {
        size_t at = 0;
        while (at < len && data[at] == docs[i].blocks[at]) {
            at++;
        }
        LKV_FAIL("document %d: byte %zu (block %zu) differs", i, at, at / docs[i].block_bytes);
    }
    free(data);
    return 0;
}

typedef struct reader {
    lkv_daemon *dm;
    int id;
    int rounds;
    int failed;
    double secs;
} reader;

static void *reader_main(void *p)
{
    reader *r = p;
    lkv_client_t *c = lkv_it_client(r->dm);
    double t0 = now_s();
    for (int round = 0; round < r->rounds; round++) {
        for (int k = 0; k < N_DOCS; k++) {
            int i = (k + r->id * 5) % N_DOCS;
            int rc = get_check(c, i);
            if (rc != 0) {
                fprintf(stderr, "reader %d: Get of document %d: %s (%s)\n", r->id, i,
                        lkv_strerror(rc), lkv_client_last_error());
                r->failed++;
            }
        }
    }
    r->secs = now_s() - t0;
    lkv_client_destroy(c);
    return NULL;
}

static void test_roundtrip(void)
{
    lkv_daemon dm;
    /* 3 CUDA streams: successive messages of one Get land on different streams. */
    start_daemon_x(&dm, g_cuda ? "auto" : "always", "2", g_cuda ? "cuda" : "host", 256,
                   "get_stage_streams=3");
    lkv_client_t *c = lkv_it_client(&dm);
    ASSERT_EQ(stat_of(c, "get_stage", "slots"), 2);
    /* A slot holds one message: max(the 1 MiB target, the largest block: llama's 2 MiB). */
    ASSERT_EQ(stat_of(c, "get_stage", "slot_bytes"), 2 << 20);
    put_docs(c);
    enum { R = 8 };
    reader rd[R];
    pthread_t th[R];
    for (int i = 0; i < R; i++) {
        rd[i] = (reader){&dm, i, 2, 0, 0};
        pthread_create(&th[i], NULL, reader_main, &rd[i]);
    }
    for (int i = 0; i < R; i++) {
        pthread_join(th[i], NULL);
        ASSERT_EQ(rd[i].failed, 0);
    }
    double acquired = stat_of(c, "get_stage", "acquired");
    double waited = stat_of(c, "get_stage", "waited");
    double timed_out = stat_of(c, "get_stage", "timed_out");
    printf("roundtrip: %d readers x 2 rounds x %d docs (%u messages a round): acquired %.0f, "
           "waited %.0f, timed out %.0f\n",
           R, N_DOCS, n_msgs_per_read, acquired, waited, timed_out);
    /* Every message took a slot, except those a timed-out wait sent by the copying path. */
    ASSERT_EQ(acquired + timed_out, (double)R * 2 * n_msgs_per_read);
    ASSERT_TRUE(waited > 0);
    expect_ring_idle(c);
    lkv_client_destroy(c);
    ASSERT_EQ(WEXITSTATUS(lkv_daemon_stop(&dm, SIGTERM, 20000)), 0);
    lkv_daemon_cleanup(&dm);
}

static void test_stalled_readers(void)
{
    lkv_daemon dm;
    start_daemon(&dm, g_cuda ? "auto" : "always", "2", g_cuda ? "cuda" : "host", 256);
    lkv_client_t *c = lkv_it_client(&dm);
    put_docs(c);
    it_doc big[2];
    lkv_get_t *g[2];
    lkv_client_t *sc[2];
    for (int i = 0; i < 2; i++) {
        lkv_it_doc_make(&S, 9900 + (uint64_t)i, 120 * 32, &big[i]); /* 30 MiB */
        lkv_put_reply r;
        ASSERT_OK(lkv_client_put(c, S.profile, big[i].tokens, big[i].n_tokens, big[i].blocks,
                                 big[i].n_blocks, big[i].block_bytes, 0, &r));
        sc[i] = lkv_it_client(&dm);
        lkv_docref ref = lkv_it_ref(&S, &big[i]);
        lkv_get_header h;
        ASSERT_OK(lkv_client_get_begin(sc[i], &ref, 60000, &h, &g[i]));
        uint32_t idx;
        const void *data;
        size_t len;
        ASSERT_OK(lkv_get_next(g[i], &idx, &data, &len)); /* One block, then it stops. */
        ASSERT_EQ(idx, 0);
        ASSERT_TRUE(memcmp(data, big[i].blocks, len) == 0);
    }
    usleep(300 * 1000);
    double in_use = stat_of(c, "get_stage", "in_use");
    double t0 = now_s();
    reader r = {&dm, 3, 1, 0, 0};
    reader_main(&r);
    double secs = now_s() - t0;
    double timed_out = stat_of(c, "get_stage", "timed_out");
    double bypassed = stat_of(c, "get_stage", "bypassed");
    printf("stalled: 2 readers stopped holding %.0f of 2 slots; another read %d docs in %.2f s "
           "(timed out waits %.0f, bypassed %.0f)\n",
           in_use, N_DOCS, secs, timed_out, bypassed);
    ASSERT_EQ(r.failed, 0);
    /* One 300 ms wait, then the starved ring is bypassed: not 0.3 s per message. */
    ASSERT_TRUE(secs < lkv_test_timeout_ms(10000) / 1000.0);
    if (in_use == 2) {
        ASSERT_TRUE(timed_out >= 1);
        ASSERT_TRUE(bypassed >= 1);
    }
    for (int i = 0; i < 2; i++) {
        lkv_get_end(g[i]); /* Cancels: gRPC drops the slices, the slots come back. */
        lkv_client_destroy(sc[i]);
        lkv_it_doc_free(&big[i]);
    }
    expect_ring_idle(c);
    for (int i = 0; i < N_DOCS; i += 5) {
        ASSERT_OK(get_check(c, i)); /* And the ring serves again. */
    }
    expect_ring_idle(c);
    lkv_client_destroy(c);
    ASSERT_EQ(WEXITSTATUS(lkv_daemon_stop(&dm, SIGTERM, 20000)), 0);
    lkv_daemon_cleanup(&dm);
}

static void test_host_auto_has_no_ring(void)
{
    lkv_daemon dm;
    start_daemon(&dm, "auto", "2", "host", 256);
    lkv_client_t *c = lkv_it_client(&dm);
    ASSERT_EQ(stat_or(c, "get_stage", "slots", -1), -1);
    put_docs(c);
    for (int i = 0; i < N_DOCS; i++) {
        ASSERT_OK(get_check(c, i));
    }
    lkv_client_destroy(c);
    ASSERT_EQ(WEXITSTATUS(lkv_daemon_stop(&dm, SIGTERM, 20000)), 0);
    lkv_daemon_cleanup(&dm);
}

/* ---- bench: ring vs the copying path, same run ---- */

typedef struct bench_reader {
    lkv_daemon *dm;
    int id;
    double until;
    uint64_t bytes;
    int failed;
    pthread_barrier_t *bar;
} bench_reader;

static int count_block(void *ctx, const lkv_get_header *h, uint32_t index, const void *data,
                       size_t len)
{
    (void)h;
    (void)index;
    (void)data;
    *(uint64_t *)ctx += len;
    return 0;
}

static void *bench_main(void *p)
{
    bench_reader *b = p;
    lkv_client_t *c = lkv_it_client(b->dm);
    pthread_barrier_wait(b->bar);
    for (int k = 0; now_s() < b->until; k++) {
        int i = (k + b->id * 7) % N_DOCS;
        lkv_docref ref = lkv_it_ref(&S, &docs[i]);
        lkv_get_header h;
        if (lkv_client_get(c, &ref, 0, &h, count_block, &b->bytes) != 0) {
            b->failed++;
        }
    }
    lkv_client_destroy(c);
    return NULL;
}

static double bench_gbs(lkv_daemon *dm, int clients, double secs)
{
    bench_reader br[64];
    pthread_t th[64];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)clients + 1);
    for (int i = 0; i < clients; i++) {
        br[i] = (bench_reader){dm, i, 0, 0, 0, &bar};
        pthread_create(&th[i], NULL, bench_main, &br[i]);
    }
    double t0 = now_s();
    for (int i = 0; i < clients; i++) {
        br[i].until = t0 + secs;
    }
    pthread_barrier_wait(&bar);
    t0 = now_s();
    uint64_t bytes = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
        bytes += br[i].bytes;
        ASSERT_EQ(br[i].failed, 0);
    }
    pthread_barrier_destroy(&bar);
    return (double)bytes / (now_s() - t0) / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int bench(const char *json_path)
{
    /* name, get_staging, hot_backend, extra option */
    static const char *const cfgs[][4] = {{"ring", "auto", "cuda", NULL},
                                          {"ring-4st", "auto", "cuda", "get_stage_streams=4"},
                                          {"copy", "off", "cuda", NULL},
                                          {"host-pages", "auto", "host", NULL}};
    static const int clients[] = {1, 8, 32};
    double gbs[4][3];
    int n_cfg = g_cuda ? 4 : 1;
    for (int k = 0; k < n_cfg; k++) {
        const char *be = g_cuda ? cfgs[k][2] : "host";
        const char *stg = g_cuda ? cfgs[k][1] : "always";
        lkv_daemon dm;
        start_daemon_x(&dm, stg, "64", be, 1024, g_cuda ? cfgs[k][3] : NULL);
        lkv_client_t *c = lkv_it_client(&dm);
        put_docs(c);
        for (int i = 0; i < N_DOCS; i++) {
            ASSERT_OK(get_check(c, i)); /* Byte for byte before timing it. */
        }
        for (int j = 0; j < 3; j++) {
            double r[3];
            for (int round = 0; round < 3; round++) {
                r[round] = bench_gbs(&dm, clients[j], 1.0);
            }
            qsort(r, 3, sizeof(double), cmp_d);
            gbs[k][j] = r[1];
        }
        printf("%-10s get_staging=%-6s hot_backend=%-4s waited %.0f timed_out %.0f\n",
               g_cuda ? cfgs[k][0] : "ring-host", stg, be, stat_or(c, "get_stage", "waited", 0),
               stat_or(c, "get_stage", "timed_out", 0));
        lkv_client_destroy(c);
        lkv_daemon_stop(&dm, SIGTERM, 20000);
        lkv_daemon_cleanup(&dm);
    }
    printf("\nGet throughput, GB/s of block payload (median of 3 x 1 s), 256 KiB blocks, "
           "1..40-block documents\n");
    printf("%-8s", "clients");
    for (int k = 0; k < n_cfg; k++) {
        printf(" %12s", g_cuda ? cfgs[k][0] : "ring-host");
    }
    printf(g_cuda ? "   ring/copy  ring-4st/copy\n" : "\n");
    for (int j = 0; j < 3; j++) {
        printf("%-8d", clients[j]);
        for (int k = 0; k < n_cfg; k++) {
            printf(" %12.2f", gbs[k][j]);
        }
        if (g_cuda) {
            printf("   %9.2fx  %12.2fx", gbs[0][j] / gbs[2][j], gbs[1][j] / gbs[2][j]);
        }
        printf("\n");
    }
    if (json_path != NULL) {
        FILE *f = fopen(json_path, "w");
        if (f == NULL) {
            perror(json_path);
            return 1;
        }
        fprintf(f, "{\"bench\": \"get_stage\", \"cuda\": %d, \"block_bytes\": 262144, \"rows\": [",
                g_cuda);
        for (int j = 0; j < 3; j++) {
            for (int k = 0; k < n_cfg; k++) {
                fprintf(f, "%s{\"config\": \"%s\", \"clients\": %d, \"gbs\": %.4f}",
                        j + k ? ", " : "", g_cuda ? cfgs[k][0] : "ring-host", clients[j],
                        gbs[k][j]);
            }
        }
        fprintf(f, "]}\n");
        fclose(f);
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *e = getenv("LKV_IT_STAGE_CUDA");
    g_cuda = e != NULL && strcmp(e, "1") == 0;
    make_docs();
    if (argc > 1 && strcmp(argv[1], "bench") == 0) {
        return bench(argc > 2 ? argv[2] : NULL);
    }
    LKV_RUN(test_roundtrip);
    LKV_RUN(test_stalled_readers);
    if (!g_cuda) {
        LKV_RUN(test_host_auto_has_no_ring);
    }
    for (int i = 0; i < N_DOCS; i++) {
        lkv_it_doc_free(&docs[i]);
    }
    return 0;
}
