/*
 * test_pool.c: integration.pool. The real lazykvd keeps answering while its worker pool runs
 * slow blocking work. The daemon runs in write-through mode with one pool thread and
 * LKV_FAULT_POOL_DELAY_MS (every pool job sleeps first, as a slow disk would), so a Put commit,
 * and after a restart a Get and an Attach of the then cold documents (their promotion reads
 * RocksDB) and a Delete, each take at least the delay; meanwhile Health (grpc.health.v1 Check) must
 * answer within 100 ms (500 under sanitizers; times $LKV_TEST_TIMEOUT_SCALE) and a Lookup must
 * proceed. Prints the measured latencies.
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

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LKV_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define LKV_SANITIZED 1
#endif
#endif
#ifdef LKV_SANITIZED
#define BOUND_MS 500.0
#else
#define BOUND_MS 100.0
#endif
#define DELAY_MS 800

static lkv_daemon dm;
static it_doc doc, doc2;
static atomic_int slow_done;
static double slow_ms;
static int slow_rc;
static int (*slow_op)(lkv_client_t *c);
static lkv_lease lease;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int check_block(void *ctx, const lkv_get_header *h, uint32_t index, const void *data,
                       size_t len)
{
    (void)h;
    it_doc *d = ctx;
    if (data != NULL && memcmp(data, d->blocks + (size_t)index * d->block_bytes, len) != 0) {
        return -1;
    }
    return 0;
}

static int op_put(lkv_client_t *c)
{
    return lkv_client_put(c, lkv_it_itest.profile, doc.tokens, doc.n_tokens, doc.blocks,
                          doc.n_blocks, doc.block_bytes, 0, NULL);
}

static int op_get(lkv_client_t *c)
{
    lkv_docref ref = lkv_it_ref(&lkv_it_itest, &doc);
    lkv_get_header h;
    return lkv_client_get(c, &ref, 0, &h, check_block, &doc);
}

static int op_delete(lkv_client_t *c)
{
    lkv_docref ref = lkv_it_ref(&lkv_it_itest, &doc);
    return lkv_client_delete(c, &ref, 0, NULL);
}

static int op_attach(lkv_client_t *c)
{
    lkv_docref ref = lkv_it_ref(&lkv_it_itest, &doc2);
    return lkv_client_attach(c, &ref, 1, NULL, 10000, 0, &lease);
}

static void *slow_main(void *arg)
{
    double t0 = now_ms();
    slow_rc = slow_op(arg);
    slow_ms = now_ms() - t0;
    atomic_store(&slow_done, 1);
    return NULL;
}

/* Runs op in a thread on its own client; probes Health and Lookup until it is done; checks the
 * worst Health and Lookup latencies, that op succeeded and that it waited for the pool. */
static void slow_while_probing(const char *what, int (*op)(lkv_client_t *c))
{
    lkv_client_t *sc = lkv_it_client(&dm);
    lkv_client_t *c = lkv_it_client(&dm);
    uint32_t tok[3] = {1, 2, 3};
    lkv_docref other = {.profile = lkv_it_itest.profile, .tokens = tok, .n_tokens = 3};
    lkv_doc_status st;
    double worst = 0, worst_lookup = 0;
    int n = 0;
    pthread_t th;
    slow_op = op;
    atomic_store(&slow_done, 0);
    ASSERT_EQ(pthread_create(&th, NULL, slow_main, sc), 0);
    usleep(100000); /* Let the slow call reach the pool. */
    while (!atomic_load(&slow_done)) {
        double t0 = now_ms();
        ASSERT_OK(lkv_client_ping(c, "", 5000));
        double ms = now_ms() - t0;
        worst = ms > worst ? ms : worst;
        t0 = now_ms();
        ASSERT_OK(lkv_client_lookup(c, &other, 1, 5000, &st));
        ms = now_ms() - t0;
        worst_lookup = ms > worst_lookup ? ms : worst_lookup;
        n++;
        usleep(20000);
    }
    pthread_join(th, NULL);
    fprintf(stderr,
            "   %s took %.0f ms (pool delay %d ms); meanwhile %d Health checks, worst %.1f ms "
            "(bound %.0f), worst Lookup %.1f ms\n",
            what, slow_ms, DELAY_MS, n, worst, (double)lkv_test_timeout_ms((int)BOUND_MS),
            worst_lookup);
    ASSERT_OK(slow_rc);
    ASSERT_TRUE(slow_ms >= DELAY_MS);
    ASSERT_TRUE(n >= 5);
    ASSERT_TRUE(worst < lkv_test_timeout_ms((int)BOUND_MS));
    ASSERT_TRUE(worst_lookup < lkv_test_timeout_ms((int)BOUND_MS));
    lkv_client_destroy(c);
    lkv_client_destroy(sc);
}

static void test_health_during_slow_jobs(void)
{
    lkv_it_doc_make(&lkv_it_itest, 4242, 40, &doc);
    lkv_it_doc_make(&lkv_it_itest, 4343, 20, &doc2);
    setenv("LKV_FAULT_POOL_DELAY_MS", "800", 1);
    lkv_it_start(&dm);
    slow_while_probing("write-through Put (commit on the pool)", op_put);
    lkv_client_t *c = lkv_it_client(&dm);
    ASSERT_OK(lkv_client_put(c, lkv_it_itest.profile, doc2.tokens, doc2.n_tokens, doc2.blocks,
                             doc2.n_blocks, doc2.block_bytes, 0, NULL));
    lkv_client_destroy(c);

    /* After a restart both documents are cold: Get and Attach promote them on the pool. */
    ASSERT_TRUE(WIFEXITED(lkv_daemon_stop(&dm, SIGTERM, 10000)));
    lkv_it_start(&dm);
    slow_while_probing("Get of a cold document (promotion on the pool)", op_get);
    c = lkv_it_client(&dm);
    double t0 = now_ms();
    ASSERT_OK(op_get(c)); /* Now hot: no pool. */
    double hot_ms = now_ms() - t0;
    fprintf(stderr, "   Get of the now hot document: %.1f ms\n", hot_ms);
    ASSERT_TRUE(hot_ms < DELAY_MS);
    slow_while_probing("Attach of a cold document (pin promotes on the pool)", op_attach);
    ASSERT_EQ(lease.n_docs, 1);
    ASSERT_OK(lkv_client_release(c, lease.id, 0, NULL));
    lkv_lease_free(&lease);
    slow_while_probing("write-through Delete (on the pool)", op_delete);
    lkv_docref ref = lkv_it_ref(&lkv_it_itest, &doc);
    lkv_doc_status st;
    ASSERT_OK(lkv_client_lookup(c, &ref, 1, 0, &st));
    ASSERT_TRUE(!st.present);
    lkv_client_destroy(c);
    lkv_daemon_stop(&dm, SIGTERM, 10000);
    unsetenv("LKV_FAULT_POOL_DELAY_MS");
    lkv_it_doc_free(&doc);
    lkv_it_doc_free(&doc2);
}

int main(void)
{
    const char *args[] = {LKV_IT_PROFILE_ARGS, "--set", "durability=write-through", "--set",
                          "pool_threads=1",    NULL};
    lkv_daemon_init(&dm, args);
    LKV_RUN(test_health_during_slow_jobs);
    lkv_daemon_cleanup(&dm);
    return 0;
}
