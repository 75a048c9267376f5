/*
 * test_durable.c: integration.durable. What a Put reply claims about durability holds across
 * kill -9, and the write-back backlog is bounded, on the real lazykvd:
 *   claim       write-through with a cold budget of two documents: A is put (DURABLE), then
 *               B and C evict A from the cold tier while it stays hot; putting A again must
 *               say DURABLE only because it is on disk again: kill -9 right after that reply,
 *               restart, A is there, byte-identical. Write-back: a Put says HOT until the
 *               writer persisted the document, and a re-put that says DURABLE survives kill -9.
 *   backlog     write-back with wb_max_backlog_bytes = one document, on a 64 MiB tmpfs this
 *               test mounts over the data dir (skipped, exit 77, where mount is refused) and
 *               fills: the writer cannot persist (the disk is full, it retries); the next Put
 *               waits parked and ends DEADLINE_EXCEEDED at its deadline while the one polling
 *               thread (threads=1) still answers Lookup and Get of stored documents; a Put
 *               waiting when space is freed completes, and after a restart everything
 *               acknowledged is present.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "lkv_client.h"
#include "lkv_daemon_harness.h"
#include "lkv_it_util.h"
#include "lkv_test.h"

static const it_shape *S = &lkv_it_itest;
/* "wb_wal=false" when LKV_IT_WB_WAL=false (ctest integration.durable_nowal): the write-back
 * cases then run with the writer's memtable flushes instead of the WAL. */
static const char *g_wal = "wb_wal=true";

static int put_doc(lkv_client_t *c, uint64_t seed, int deadline_ms, lkv_put_reply *r)
{
    it_doc d;
    lkv_it_doc_make(S, seed, 32, &d); /* 2 blocks of 2 KiB: 4 KiB of payload. */
    int rc = lkv_client_put(c, S->profile, d.tokens, d.n_tokens, d.blocks, d.n_blocks,
                            d.block_bytes, deadline_ms, r);
    lkv_it_doc_free(&d);
    return rc;
}

/* 0 if doc seed reads back byte-identical, else the get's rc (or -1 for different bytes). */
static int check_doc(lkv_client_t *c, uint64_t seed)
{
    it_doc d;
    lkv_it_doc_make(S, seed, 32, &d);
    lkv_docref ref = lkv_it_ref(S, &d);
    lkv_get_header h;
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = lkv_client_get_buf(c, &ref, 0, &h, &data, &len);
    if (rc == 0 && (len != d.n_blocks * d.block_bytes || memcmp(data, d.blocks, len) != 0)) {
        rc = -1;
    }
    free(data);
    lkv_it_doc_free(&d);
    return rc;
}

static lkv_doc_status lookup_doc(lkv_client_t *c, uint64_t seed)
{
    it_doc d;
    lkv_it_doc_make(S, seed, 32, &d);
    lkv_docref ref = lkv_it_ref(S, &d);
    lkv_doc_status st;
    ASSERT_OK(lkv_client_lookup(c, &ref, 1, 0, &st));
    lkv_it_doc_free(&d);
    return st;
}

static void crash_and_restart(lkv_daemon *dm, lkv_client_t **c)
{
    lkv_client_destroy(*c);
    lkv_daemon_stop(dm, SIGKILL, 5000);
    lkv_it_start(dm);
    *c = lkv_it_client(dm);
}

static void test_claim_write_through(void)
{
    lkv_daemon dm;
    const char *args[] = {LKV_IT_PROFILE_ARGS, "--set", "durability=write-through", "--set",
                          "cold_bytes=8KiB",   NULL};
    lkv_daemon_init(&dm, args);
    lkv_it_start(&dm);
    lkv_client_t *c = lkv_it_client(&dm);
    lkv_put_reply r;
    ASSERT_OK(put_doc(c, 1, 0, &r));
    ASSERT_EQ(r.durability, LKV_WIRE_DURABILITY_DURABLE);
    ASSERT_EQ(r.already_present, 0);
    ASSERT_OK(put_doc(c, 2, 0, &r));
    ASSERT_OK(put_doc(c, 3, 0, &r)); /* The cold budget (2 documents) evicts doc 1 from cold. */
    lkv_doc_status st = lookup_doc(c, 1);
    ASSERT_EQ(st.present, 1);
    ASSERT_EQ(st.tier, LKV_WIRE_TIER_HOT);
    ASSERT_OK(put_doc(c, 1, 0, &r)); /* Hot only now: the reply must not just say DURABLE. */
    ASSERT_EQ(r.already_present, 1);
    ASSERT_EQ(r.durability, LKV_WIRE_DURABILITY_DURABLE);
    ASSERT_EQ(r.tier, LKV_WIRE_TIER_HOT);
    crash_and_restart(&dm, &c); /* At once after the reply. */
    if (check_doc(c, 1) != 0) {
        LKV_FAIL("doc 1 was acknowledged DURABLE and is gone after kill -9");
    }
    lkv_client_destroy(c);
    lkv_daemon_cleanup(&dm);
}

static void test_claim_write_back(void)
{
    lkv_daemon dm;
    const char *args[] = {LKV_IT_PROFILE_ARGS, "--set", g_wal, NULL};
    lkv_daemon_init(&dm, args);
    lkv_it_start(&dm);
    lkv_client_t *c = lkv_it_client(&dm);
    lkv_put_reply r;
    ASSERT_OK(put_doc(c, 10, 0, &r));
    ASSERT_EQ(r.already_present, 0);
    ASSERT_EQ(r.durability, LKV_WIRE_DURABILITY_HOT);
    int durable = 0;
    for (int i = 0; i < 500 && !durable; i++) {
        ASSERT_OK(put_doc(c, 10, 0, &r));
        ASSERT_EQ(r.already_present, 1);
        durable = r.durability == LKV_WIRE_DURABILITY_DURABLE;
        if (!durable) {
            usleep(10000);
        }
    }
    ASSERT_TRUE(durable); /* The writer persisted it, and the reply says so. */
    crash_and_restart(&dm, &c);
    ASSERT_OK(check_doc(c, 10));
    lkv_client_destroy(c);
    lkv_daemon_cleanup(&dm);
}

/* ---- the backlog bound on a full disk -------------------------------------------------- */

typedef struct bg_put {
    lkv_daemon *dm;
    uint64_t seed;
    int deadline_ms;
    int rc;
    int status;
    double secs;
} bg_put;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *bg_put_main(void *arg)
{
    bg_put *b = arg;
    lkv_client_t *c = lkv_it_client(b->dm);
    double t0 = now_s();
    b->rc = put_doc(c, b->seed, b->deadline_ms, NULL);
    b->status = lkv_client_last_status();
    b->secs = now_s() - t0;
    lkv_client_destroy(c);
    return NULL;
}

static void fill(const char *dir, int on)
{
    char p[700];
    snprintf(p, sizeof p, "%s/filler", dir);
    if (!on) {
        unlink(p);
        return;
    }
    struct statvfs v;
    ASSERT_OK(statvfs(dir, &v));
    int fd = open(p, O_CREAT | O_WRONLY, 0600);
    ASSERT_TRUE(fd >= 0);
    ASSERT_OK(posix_fallocate(fd, 0, (off_t)((uint64_t)v.f_bavail * v.f_frsize - (8u << 20))));
    close(fd);
}

static int test_backlog(void)
{
    lkv_daemon dm;
    const char *args[] = {LKV_IT_PROFILE_ARGS,
                          "--set",
                          "wb_max_backlog_bytes=4KiB",
                          "--set",
                          "cold_min_free_bytes=16MiB",
                          "--set",
                          "threads=1",
                          "--set",
                          g_wal,
                          NULL};
    lkv_daemon_init(&dm, args);
    mkdir(dm.data_dir, 0700);
    if (mount("tmpfs", dm.data_dir, "tmpfs", 0, "size=64m") != 0) {
        fprintf(stderr, "SKIP: cannot mount a tmpfs on %s (%m): the backlog case needs root\n",
                dm.data_dir);
        lkv_daemon_cleanup(&dm);
        return 77;
    }
    lkv_it_start(&dm);
    lkv_client_t *c = lkv_it_client(&dm);
    lkv_put_reply r;
    ASSERT_OK(put_doc(c, 20, 0, &r)); /* Persisted before the disk fills. */
    for (int i = 0; i < 500 && r.durability != LKV_WIRE_DURABILITY_DURABLE; i++) {
        usleep(10000);
        ASSERT_OK(put_doc(c, 20, 0, &r));
    }
    ASSERT_EQ(r.durability, LKV_WIRE_DURABILITY_DURABLE);
    fill(dm.data_dir, 1);
    ASSERT_OK(put_doc(c, 21, 0, &r)); /* The backlog was empty: accepted, hot. */
    ASSERT_EQ(r.durability, LKV_WIRE_DURABILITY_HOT);

    /* The backlog is full and cannot drain: this put waits until its deadline... */
    bg_put b = {&dm, 22, lkv_test_timeout_ms(2000), 0, 0, 0};
    pthread_t th;
    ASSERT_OK(pthread_create(&th, NULL, bg_put_main, &b));
    usleep(300000);
    /* ... without holding the only polling thread: lookups and gets are served meanwhile. */
    double t0 = now_s();
    ASSERT_EQ(lookup_doc(c, 20).present, 1);
    ASSERT_OK(check_doc(c, 20));
    ASSERT_OK(check_doc(c, 21));
    double served = now_s() - t0;
    pthread_join(th, NULL);
    if (served > 1.0) {
        LKV_FAIL("lookups took %.2f s while a put waited for the backlog", served);
    }
    ASSERT_TRUE(b.rc != 0);
    ASSERT_EQ(b.status, 4); /* DEADLINE_EXCEEDED */
    ASSERT_TRUE(b.secs >= 1.5);
    ASSERT_EQ(lookup_doc(c, 22).present,
              0); /* A put that waited out its deadline changed nothing. */

    /* A put waiting when space comes back completes, and everything acknowledged survives. */
    bg_put b2 = {&dm, 23, lkv_test_timeout_ms(20000), 0, 0, 0};
    ASSERT_OK(pthread_create(&th, NULL, bg_put_main, &b2));
    usleep(500000);
    fill(dm.data_dir, 0);
    pthread_join(th, NULL);
    ASSERT_OK(b2.rc);
    for (int i = 0; i < 500; i++) {
        ASSERT_OK(put_doc(c, 23, 0, &r));
        if (r.durability == LKV_WIRE_DURABILITY_DURABLE) {
            break;
        }
        usleep(10000);
    }
    ASSERT_EQ(r.durability, LKV_WIRE_DURABILITY_DURABLE);
    ASSERT_OK(put_doc(c, 21, 0, &r));
    ASSERT_EQ(r.durability, LKV_WIRE_DURABILITY_DURABLE);
    crash_and_restart(&dm, &c);
    ASSERT_OK(check_doc(c, 20));
    ASSERT_OK(check_doc(c, 21));
    ASSERT_OK(check_doc(c, 23));
    lkv_client_destroy(c);
    lkv_daemon_stop(&dm, SIGTERM, 10000);
    umount2(dm.data_dir, MNT_DETACH);
    lkv_daemon_cleanup(&dm);
    return 0;
}

int main(void)
{
    const char *w = getenv("LKV_IT_WB_WAL");
    if (w != NULL && strcmp(w, "false") == 0) {
        g_wal = "wb_wal=false";
    }
    LKV_RUN(test_claim_write_through);
    LKV_RUN(test_claim_write_back);
    fprintf(stderr, "-- test_backlog\n");
    return test_backlog();
}
