/*
 * test_crash.c: integration.crash. kill -9 during a stream of puts, then restart on the same
 * data dir:
 *   write-through: every acknowledged document is present and byte-identical;
 *   either mode:   every document that is present reads back byte-identical to what was put
 *                  (no torn or corrupt block is ever served); a document may be absent
 *                  (write-back: not yet persisted; or detected corrupt and dropped).
 * A putter thread puts documents seed 0, 1, 2, ... (payload derived from the seed, so the
 * check needs only the seed) and records which were acknowledged; the main thread kills the
 * daemon after a while. Two kill rounds per mode, each on top of the previous data.
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

#define MAX_DOCS 100000

static lkv_daemon dm;
static unsigned char acked[MAX_DOCS];
static atomic_int attempted; /* Documents whose Put was started (seed < attempted). */
static atomic_int n_acked;   /* Acknowledged count. */
static atomic_int stop_flag; /* Set by main to stop putting. */
static uint64_t seed_base;   /* Seeds of this round: seed_base + i. */
static lkv_client_t *putter_client;

static uint32_t doc_len(int i)
{
    return 3 + (uint32_t)((i * 37) % 88); /* 3..90 tokens (unique ids): 1..6 blocks. */
}

static void *putter(void *arg)
{
    (void)arg;
    const it_shape *s = &lkv_it_itest;
    for (int i = 0; i < MAX_DOCS && !atomic_load(&stop_flag); i++) {
        it_doc d;
        lkv_it_doc_make(s, seed_base + (uint64_t)i, doc_len(i), &d);
        atomic_store(&attempted, i + 1);
        int rc = lkv_client_put(putter_client, s->profile, d.tokens, d.n_tokens, d.blocks,
                                d.n_blocks, d.block_bytes, 0, NULL);
        lkv_it_doc_free(&d);
        if (rc != 0) {
            break; /* The daemon died under us. */
        }
        acked[i] = 1;
        atomic_fetch_add(&n_acked, 1);
    }
    return NULL;
}

/* Checks every attempted document after the restart. Returns the number present. */
static int check_round(lkv_client_t *c, int write_through)
{
    const it_shape *s = &lkv_it_itest;
    int n = atomic_load(&attempted), present = 0, lost_acked = 0;
    for (int i = 0; i < n; i++) {
        it_doc d;
        lkv_it_doc_make(s, seed_base + (uint64_t)i, doc_len(i), &d);
        lkv_docref ref = lkv_it_ref(s, &d);
        lkv_get_header h;
        uint8_t *data = NULL;
        size_t len = 0;
        int rc = lkv_client_get_buf(c, &ref, 0, &h, &data, &len);
        if (rc == 0) {
            present++;
            if (len != d.n_blocks * d.block_bytes || memcmp(data, d.blocks, len) != 0) {
                LKV_FAIL("doc seed %llu served with different bytes after kill -9",
                         (unsigned long long)(seed_base + (uint64_t)i));
            }
            ASSERT_EQ(h.n_tokens, d.n_tokens);
        } else if (rc == LKV_ENOTFOUND) {
            if (acked[i]) {
                lost_acked++;
                if (write_through) {
                    LKV_FAIL("acknowledged write-through doc %d (seed %llu) lost after kill -9", i,
                             (unsigned long long)(seed_base + (uint64_t)i));
                }
            }
        } else {
            LKV_FAIL("get doc %d after restart: %s: %s", i, lkv_err_name(rc),
                     lkv_client_last_error());
        }
        free(data);
        lkv_it_doc_free(&d);
    }
    fprintf(stderr, "   %s: %d attempted, %d acked, %d present, %d acked but lost\n",
            write_through ? "write-through" : "write-back", n, atomic_load(&n_acked), present,
            lost_acked);
    return present;
}

static void crash_round(int write_through, uint64_t base, int kill_after_ms)
{
    const char *wt[] = {"--set", "durability=write-through", NULL};
    const char *wb[] = {"--set", "durability=write-back", NULL};
    ASSERT_OK(lkv_daemon_start_with(&dm, write_through ? wt : wb));
    memset(acked, 0, sizeof(acked));
    atomic_store(&attempted, 0);
    atomic_store(&n_acked, 0);
    atomic_store(&stop_flag, 0);
    seed_base = base;
    putter_client = lkv_it_client(&dm);
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, putter, NULL), 0);
    /* Let a few puts through, then kill at a time that is not a put boundary. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        usleep(10000);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
        if ((ms >= kill_after_ms && atomic_load(&n_acked) >= 5) ||
            ms >= lkv_test_timeout_ms(10000)) {
            break;
        }
    }
    int st = lkv_daemon_stop(&dm, SIGKILL, 5000);
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    atomic_store(&stop_flag, 1);
    pthread_join(th, NULL);
    lkv_client_destroy(putter_client);
    ASSERT_TRUE(atomic_load(&n_acked) >= 1);

    lkv_it_start(&dm);
    lkv_client_t *c = lkv_it_client(&dm);
    check_round(c, write_through);
    lkv_client_destroy(c);
    st = lkv_daemon_stop(&dm, SIGTERM, 20000);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_write_through(void)
{
    crash_round(1, 1000000, 700);
    crash_round(1, 2000000, 1100);
}

static void test_write_back(void)
{
    crash_round(0, 3000000, 700);
    crash_round(0, 4000000, 1100);
}

int main(void)
{
    const char *args[] = {LKV_IT_PROFILE_ARGS, NULL};
    lkv_daemon_init(&dm, args);
    LKV_RUN(test_write_through);
    LKV_RUN(test_write_back);
    lkv_daemon_cleanup(&dm);
    return 0;
}
