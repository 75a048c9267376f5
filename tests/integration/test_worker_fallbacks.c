/*
 * test_worker_fallbacks.c: integration.worker_fallbacks. The decode worker's fallback paths of
 * put in place, each forced against a real lazykvd (host shm arena), each answering with the
 * local-only answer's tokens, bitwise, and the counters saying what happened:
 *   - Reserve refused (the lease's document limit, max_lease_docs=1): that miss is computed in
 *     worker pages and stored by Put, the other in place;
 *   - Reserve declined by the daemon's hot admission door (hot_admission = door, LKV_EADMIT):
 *     computed in worker pages, stored cold by Put (or not at all with no_put_when_full);
 *   - Reserve answered "being computed by another worker" (LKV_EINPROGRESS: another client holds
 *     the reservation): computed here too, never waited for;
 *   - the lease lost mid-request (a question prefill longer than the TTL: the renewal finds it
 *     expired): the request goes on locally, its tokens fed again, nothing stored from pages it
 *     no longer owns;
 *   - the daemon gone between Reserve and Commit (kill -9 during decode): the answer completes
 *     from the mapped pages, the Commit fails, nothing is stored;
 * and the serving engine's daemon calls off the engine thread:
 *   - a stopped daemon (SIGSTOP) while a new request waits for its Lookup does not stall the
 *     decode of a request already running (its tokens keep coming, gaps far below the
 *     Lookup's deadline), and both end once the daemon runs again;
 *   - lease renewals made by the client-call thread keep a long generation's lease alive (no
 *     local restart, the solo tokens).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lkv_backend_cpu.h"
#include "lkv_client.h"
#include "lkv_daemon_harness.h"
#include "lkv_engine.h"
#include "lkv_err.h"
#include "lkv_it_util.h"
#include "lkv_log.h"
#include "lkv_request.h"
#include "lkv_test.h"
#include "lkv_test_proc.h"
#include "lkv_worker.h"

#define MODEL LKV_TEST_MODEL_DIR "/stories260K.bin"
#define TOKP  LKV_TEST_MODEL_DIR "/tok512.bin"

static lkv_daemon dm;
static const char *QUESTION = "One day, Lily and Tom";

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static lkv_worker *make_worker(const char *target, uint32_t ttl_ms, const lkv_backend *be)
{
    lkv_worker_opts o = {.target = target,
                         .model_path = MODEL,
                         .tokenizer_path = TOKP,
                         .deadline_ms = 1500,
                         .lease_ttl_ms = ttl_ms,
                         .local_pages = 512,
                         .backend = be};
    lkv_worker *w;
    char err[512];
    if (lkv_worker_create(&o, &w, err, sizeof err) != 0) {
        LKV_FAIL("worker: %s", err);
    }
    return w;
}

static lkv_request *make(lkv_worker *w, const char **docs, int n, int max_tokens)
{
    lkv_request *rq = lkv_xcalloc(1, sizeof(*rq));
    lkv_request_defaults def = {.max_tokens = max_tokens};
    char err[256];
    ASSERT_OK(lkv_request_from_text(docs, n, QUESTION, lkv_worker_tokenizer(w), &def, "f", rq, err,
                                    sizeof err));
    rq->rag.stop_at_eos = 0;
    return rq;
}

static int run(lkv_worker *w, const char **docs, int n, int max_tokens, lkv_rag_result *res)
{
    lkv_request *rq = make(w, docs, n, max_tokens);
    int rc = lkv_worker_run(w, &rq->rag, res);
    lkv_request_free(rq);
    free(rq);
    return rc;
}

/* The local-only answer (no daemon). */
static void local_answer(const char **docs, int n, int max_tokens, lkv_rag_result *res)
{
    lkv_worker *w = make_worker(NULL, 0, NULL);
    ASSERT_OK(run(w, docs, n, max_tokens, res));
    lkv_worker_destroy(w);
}

static void same_tokens(const lkv_rag_result *a, const lkv_rag_result *b)
{
    ASSERT_EQ(a->n_out, b->n_out);
    ASSERT_TRUE(memcmp(a->tokens, b->tokens, (size_t)a->n_out * sizeof(int)) == 0);
}

static lkv_worker_stats stats(lkv_worker *w)
{
    lkv_worker_stats st;
    lkv_worker_stats_get(w, &st);
    return st;
}

static void test_reserve_refused(void)
{
    lkv_daemon d2;
    const char *args[] = {LKV_IT_PROFILE_ARGS, "--set", "max_lease_docs=1", NULL};
    lkv_daemon_init(&d2, args);
    lkv_it_start(&d2);
    static const char *D[] = {"Lily went to the park with her mom. They saw a big tree.",
                              "Tom had a red ball. He liked to throw it high in the sky."};
    lkv_rag_result ref, res, warm;
    local_answer(D, 2, 10, &ref);
    lkv_worker *w = make_worker(d2.addr, 0, NULL);
    ASSERT_OK(run(w, D, 2, 10, &res));
    lkv_worker_stats st = stats(w);
    fprintf(stderr, "   Reserve refused: %s\n", res.note);
    same_tokens(&res, &ref);
    ASSERT_TRUE(res.docs[0].inplace == 1 && res.docs[0].stored == 1);
    ASSERT_TRUE(res.docs[1].inplace == 0 && res.docs[1].stored == 1);
    ASSERT_TRUE(st.reserve_refused == 1 && st.inplace_docs == 1 && st.put_docs == 1);
    ASSERT_TRUE(strstr(res.note, "stored by Put") != NULL);
    for (int i = 0; i < 2; i++) { /* Both stored (a lease holds one document here). */
        ASSERT_OK(run(w, &D[i], 1, 10, &warm));
        ASSERT_EQ(warm.hit_docs, 1);
        lkv_rag_result_free(&warm);
    }
    lkv_rag_result_free(&ref);
    lkv_rag_result_free(&res);
    lkv_worker_destroy(w);
    lkv_daemon_cleanup(&d2);
}

/* A stat of the daemon's Admin Stats (section.key), or -1 if absent. */
static double admin_stat(const char *addr, const char *section, const char *key)
{
    lkv_client_t *c;
    lkv_stat_entry *e = NULL;
    size_t n = 0;
    double v = -1;
    ASSERT_OK(lkv_client_create(addr, NULL, &c));
    ASSERT_OK(lkv_client_stats_entries(c, section, 5000, &e, &n));
    for (size_t i = 0; i < n; i++) {
        if (strcmp(e[i].key, key) == 0) {
            v = e[i].value;
        }
    }
    free(e);
    lkv_client_destroy(c);
    return v;
}

/* hot_admission = door: the region full of a frequently used document, a one-off document's
 * Reserve is declined by the hot door (LKV_EADMIT): the worker computes it in its own pages
 * (the local answer's tokens), then Puts it, which the daemon stores in the cold tier; with
 * no_put_when_full it is not stored at all (the simulator's rule). The frequent document stays
 * hot and the daemon counts the refusals (Admin Stats puts.hot_admit_refused). */
static void test_reserve_declined_by_door(void)
{
    static const char *D[] = {
        "Lily went to the park with her mom. They saw a big tree and a small red bird on it.",
        "Tom had a red ball. He liked to throw it high.", "The cat sat on the warm mat."};
    lkv_rag_result ref[3], res, warm;
    uint32_t nb[3];
    for (int i = 0; i < 3; i++) {
        local_answer(&D[i], 1, 10, &ref[i]);
        nb[i] = (uint32_t)ref[i].docs[0].n_blocks;
    }
    ASSERT_TRUE(nb[1] <= nb[0] && nb[2] <= nb[0]);
    /* The stories260k region holds exactly document 0 (pages of 20 KiB). */
    char region[96];
    snprintf(region, sizeof region, "profile.stories260k.hot_bytes=%u", nb[0] * 20480u);
    lkv_daemon d2;
    const char *args[] = {
        LKV_IT_PROFILE_ARGS, "--set", "hot_admission=door", "--set", region, NULL};
    lkv_daemon_init(&d2, args);
    lkv_it_start(&d2);
    lkv_worker *w = make_worker(d2.addr, 0, NULL);
    for (int k = 0; k < 3; k++) { /* Document 0: computed in place once, then hits. */
        ASSERT_OK(run(w, &D[0], 1, 10, &res));
        same_tokens(&res, &ref[0]);
        ASSERT_EQ(res.hit_docs, k > 0);
        lkv_rag_result_free(&res);
    }
    ASSERT_EQ(stats(w).inplace_docs, 1);
    ASSERT_EQ(admin_stat(d2.addr, "puts", "hot_admit_refused"), 0);

    /* Document 1, once: declined hot, computed here, stored cold by Put. */
    ASSERT_OK(run(w, &D[1], 1, 10, &res));
    fprintf(stderr, "   declined: %s\n", res.note);
    same_tokens(&res, &ref[1]);
    lkv_worker_stats st = stats(w);
    ASSERT_EQ(st.reserve_declined, 1);
    ASSERT_EQ(st.inplace_docs, 1);
    ASSERT_EQ(st.put_docs, 1);
    ASSERT_TRUE(res.docs[0].inplace == 0 && res.docs[0].stored == 1);
    ASSERT_TRUE(strstr(res.note, "hot admission filter") != NULL);
    lkv_rag_result_free(&res);
    ASSERT_TRUE(admin_stat(d2.addr, "puts", "hot_admit_refused") >= 2); /* Reserve and Put. */
    ASSERT_EQ(admin_stat(d2.addr, "puts", "puts_cold_only"), 1);
    ASSERT_EQ(admin_stat(d2.addr, "cold", "docs") >= 1, 1);
    /* A Put by hand of another one-off document: OK, the reply says where it went (COLD). */
    {
        lkv_client_t *c;
        uint32_t tok[20];
        for (int k = 0; k < 20; k++) {
            tok[k] = (uint32_t)(7 + 13 * k) % 512;
        }
        void *kv = lkv_xcalloc(2, 20480); /* 2 blocks of 16 tokens, zeros (a valid tail). */
        lkv_put_reply pr;
        ASSERT_OK(lkv_client_create(d2.addr, NULL, &c));
        ASSERT_OK(lkv_client_put(c, "stories260k", tok, 20, kv, 2, 20480, 5000, &pr));
        ASSERT_EQ(pr.tier, LKV_WIRE_TIER_COLD);
        ASSERT_EQ(pr.already_present, 0);
        ASSERT_EQ(pr.durability, LKV_WIRE_DURABILITY_DURABLE);
        lkv_client_destroy(c);
        free(kv);
    }
    ASSERT_EQ(admin_stat(d2.addr, "puts", "puts_cold_only"), 2);
    ASSERT_OK(run(w, &D[0], 1, 10, &res)); /* Still hot: a hit. */
    ASSERT_EQ(res.hit_docs, 1);
    ASSERT_EQ(res.docs[0].tier, LKV_WIRE_TIER_HOT);
    lkv_rag_result_free(&res);

    /* Document 2 with no_put_when_full: declined, computed here, not stored. */
    lkv_worker_opts o = {.target = d2.addr,
                         .model_path = MODEL,
                         .tokenizer_path = TOKP,
                         .deadline_ms = 1500,
                         .local_pages = 512,
                         .no_put_when_full = 1};
    lkv_worker *w2;
    char err[512];
    if (lkv_worker_create(&o, &w2, err, sizeof err) != 0) {
        LKV_FAIL("worker: %s", err);
    }
    ASSERT_OK(run(w2, &D[2], 1, 10, &res));
    same_tokens(&res, &ref[2]);
    st = stats(w2);
    ASSERT_EQ(st.reserve_declined, 1);
    ASSERT_EQ(st.put_docs, 0);
    ASSERT_EQ(st.inplace_docs, 0);
    ASSERT_TRUE(res.docs[0].stored != 1);
    ASSERT_TRUE(strstr(res.note, "not stored") != NULL);
    lkv_rag_result_free(&res);
    ASSERT_OK(run(w2, &D[2], 1, 10, &warm)); /* Not cached: a miss again. */
    ASSERT_EQ(warm.hit_docs, 0);
    same_tokens(&warm, &ref[2]);
    lkv_rag_result_free(&warm);
    ASSERT_EQ(admin_stat(d2.addr, "puts", "puts_cold_only"), 2);

    /* Document 1 again: found in the cold tier, attached (promoted), a hit. */
    ASSERT_OK(run(w, &D[1], 1, 10, &warm));
    ASSERT_EQ(warm.hit_docs, 1);
    same_tokens(&warm, &ref[1]);
    lkv_rag_result_free(&warm);
    for (int i = 0; i < 3; i++) {
        lkv_rag_result_free(&ref[i]);
    }
    lkv_worker_destroy(w2);
    lkv_worker_destroy(w);
    lkv_daemon_cleanup(&d2);
}

static void test_in_progress(void)
{
    static const char *D[] = {"Sue found a small blue box under her bed. Inside was a key.",
                              "The dog ran after the cat until they fell asleep in the sun."};
    lkv_rag_result ref, res;
    local_answer(D, 2, 10, &ref);
    lkv_worker *w = make_worker(dm.addr, 0, NULL);
    /* Another "worker" reserves document 0 first and holds it. */
    lkv_request *rq = make(w, D, 2, 10);
    uint32_t *ids = lkv_xmalloc((size_t)rq->rag.docs[0].n_tokens * sizeof(uint32_t));
    for (int t = 0; t < rq->rag.docs[0].n_tokens; t++) {
        ids[t] = (uint32_t)rq->rag.docs[0].tokens[t];
    }
    lkv_client_t *c = lkv_it_client(&dm);
    lkv_reservation other;
    ASSERT_OK(lkv_client_reserve(c, "stories260k", ids, (size_t)rq->rag.docs[0].n_tokens, NULL,
                                 30000, 0, NULL, 5000, &other));
    double t0 = now_ms();
    ASSERT_OK(lkv_worker_run(w, &rq->rag, &res));
    double el = now_ms() - t0;
    lkv_worker_stats st = stats(w);
    fprintf(stderr, "   in progress elsewhere (%.0f ms): %s\n", el, res.note);
    same_tokens(&res, &ref);
    ASSERT_EQ(st.reserve_busy, 1);
    ASSERT_EQ(res.docs[0].inplace, 0);
    ASSERT_TRUE(res.docs[1].inplace == 1 && res.docs[1].stored == 1);
    ASSERT_TRUE(strstr(res.note, "another worker") != NULL);
    ASSERT_TRUE(el < 1500); /* Not waited for. */
    ASSERT_OK(lkv_client_abort(c, other.lease_id, other.doc.key, 5000));
    lkv_reservation_free(&other);
    lkv_rag_result_free(&res);
    ASSERT_OK(lkv_worker_run(w, &rq->rag, &res)); /* Again: the same answer. */
    same_tokens(&res, &ref);
    lkv_rag_result_free(&res);
    lkv_rag_result_free(&ref);
    free(ids);
    lkv_request_free(rq);
    free(rq);
    lkv_client_destroy(c);
    lkv_worker_destroy(w);
}

/* A backend whose question prefill (new tokens after position 0) sleeps once, past the TTL. */
static lkv_backend sleepy;
static int sleepy_armed;
static int sleepy_prefill(void *ctx, const lkv_prefill_args *a)
{
    if (a->layer == 0 && a->new_start > 0 && sleepy_armed) {
        sleepy_armed = 0;
        usleep(1300 * 1000);
    }
    return lkv_attn_prefill_cpu(a);
    (void)ctx;
}

static void test_lease_lost(void)
{
    static const char *D[] = {"Ben had a kite. It flew very high over the green hill.",
                              "Mia baked a cake with her dad. It was sweet and warm."};
    lkv_rag_result ref, res;
    local_answer(D, 2, 12, &ref);
    sleepy = *lkv_backend_cpu();
    sleepy.attn_prefill = sleepy_prefill;
    sleepy_armed = 1;
    lkv_worker *w = make_worker(dm.addr, 300, &sleepy);
    ASSERT_OK(run(w, D, 2, 12, &res));
    lkv_worker_stats st = stats(w);
    fprintf(stderr, "   lease lost: %s\n", res.note);
    same_tokens(&res, &ref);
    ASSERT_EQ(st.local_restarts, 1);
    ASSERT_EQ(st.inplace_docs, 0);
    ASSERT_EQ(st.put_docs, 0);
    ASSERT_TRUE(res.local_only == 1 && res.docs[0].stored == 0 && res.docs[1].stored == 0);
    ASSERT_TRUE(strstr(res.note, "lease could not be renewed") != NULL);
    lkv_rag_result_free(&res);
    /* Nothing was stored: the next request computes (in place, now) and answers the same. */
    ASSERT_OK(run(w, D, 2, 12, &res));
    ASSERT_EQ(res.miss_docs, 2);
    same_tokens(&res, &ref);
    ASSERT_EQ(stats(w).inplace_docs, 2);
    lkv_rag_result_free(&res);
    lkv_rag_result_free(&ref);
    lkv_worker_destroy(w);
}

/* A backend that kills the daemon during the third decode step. */
static lkv_backend killer;
static int killer_calls;
static int killer_decode(void *ctx, const lkv_decode_args *a)
{
    if (a->layer == 0 && ++killer_calls == 3) {
        lkv_daemon_stop(&dm, SIGKILL, 5000);
    }
    return lkv_attn_decode_cpu(a);
    (void)ctx;
}

static void test_daemon_gone_before_commit(void)
{
    static const char *D[] = {"The little bird sang a song every morning by the window.",
                              "A big fish jumped out of the water and splashed the boat."};
    lkv_rag_result ref, res;
    local_answer(D, 2, 10, &ref);
    killer = *lkv_backend_cpu();
    killer.attn_decode = killer_decode;
    killer_calls = 0;
    char addr[128];
    snprintf(addr, sizeof addr, "%s", dm.addr);
    lkv_worker *w = make_worker(addr, 0, &killer);
    int rc = run(w, D, 2, 10, &res);
    if (rc != 0) {
        LKV_FAIL("daemon gone before commit: %s: %s", lkv_err_name(rc), res.error);
    }
    ASSERT_EQ(dm.pid, 0); /* killed */
    lkv_worker_stats st = stats(w);
    fprintf(stderr, "   daemon gone before Commit: %s\n", res.note);
    same_tokens(&res, &ref);
    ASSERT_EQ(res.miss_docs, 2);
    ASSERT_TRUE(res.docs[0].stored < 0 && res.docs[0].inplace == 0);
    ASSERT_TRUE(st.commit_failed == 1 && st.inplace_docs == 0 && st.put_docs == 0);
    ASSERT_TRUE(strstr(res.note, "Commit of document 0 failed") != NULL);
    lkv_rag_result_free(&res);
    lkv_rag_result_free(&ref);
    lkv_worker_destroy(w);
    const char *same_port[] = {"--listen", addr, NULL};
    ASSERT_OK(lkv_daemon_start_with(&dm, same_port));
}

/* A decode step of about 15 ms (layer 0 sleeps). */
static lkv_backend slow;
static int slow_decode(void *ctx, const lkv_decode_args *a)
{
    if (a->layer == 0) {
        usleep(15 * 1000);
    }
    return lkv_attn_decode_cpu(a);
    (void)ctx;
}

static void test_stopped_daemon_does_not_stall_decode(void)
{
    static const char *A[] = {"Tom went to the park with his dog. The dog ran fast."};
    static const char *B[] = {"Sue and Ben built a tower of blocks. It fell down."};
    slow = *lkv_backend_cpu();
    slow.attn_decode = slow_decode;
    lkv_worker *w = make_worker(dm.addr, 0, &slow);
    lkv_rag_result solo;
    ASSERT_OK(run(w, A, 1, 60, &solo)); /* A cached; its solo answer. */
    lkv_engine *e;
    lkv_engine_opts eo = {.max_batch = 4};
    ASSERT_OK(lkv_engine_create(w, &eo, &e));
    lkv_engine_req *ra, *rb;
    ASSERT_OK(lkv_engine_submit(e, make(w, A, 1, 60), 0, NULL, NULL, &ra, NULL, 0));
    lkv_engine_event ev;
    int n = 0;
    while (n < 3 && lkv_engine_wait(ra, &ev, 10000) && ev.kind == LKV_ENGINE_TOKEN) {
        n++;
    }
    ASSERT_EQ(n, 3);
    kill(dm.pid, SIGSTOP);
    lkv_test_wait_stopped(dm.pid);
    ASSERT_OK(lkv_engine_submit(e, make(w, B, 1, 8), 0, NULL, NULL, &rb, NULL, 0));
    /* B's Lookup now hangs (deadline 1500 ms); A's decode must go on. */
    double t_stop = now_ms(), last = t_stop, gap = 0;
    int during = 0;
    while (now_ms() - t_stop < 700 && lkv_engine_wait(ra, &ev, 2000) &&
           ev.kind == LKV_ENGINE_TOKEN) {
        double t = now_ms();
        gap = t - last > gap ? t - last : gap;
        last = t;
        during++;
        n++;
    }
    fprintf(stderr,
            "   daemon stopped: %d tokens of the running request in %.0f ms, largest gap %.0f ms "
            "(the waiting Lookup's deadline: 1500 ms)\n",
            during, now_ms() - t_stop, gap);
    kill(dm.pid, SIGCONT);
    ASSERT_TRUE(during >= 10);
    ASSERT_TRUE(gap < 400);
    while (lkv_engine_wait(ra, &ev, 20000) && ev.kind == LKV_ENGINE_TOKEN) {
        n++;
    }
    ASSERT_EQ(ev.kind, LKV_ENGINE_END);
    ASSERT_EQ(ev.rc, 0);
    ASSERT_EQ(n, 60);
    lkv_engine_result er;
    lkv_engine_result_get(ra, &er);
    same_tokens(er.res, &solo);
    int rcb = -1;
    while (lkv_engine_wait(rb, &ev, 20000)) {
        if (ev.kind == LKV_ENGINE_END) {
            rcb = ev.rc;
            break;
        }
    }
    fprintf(stderr, "   the waiting request ended with %s\n", lkv_err_name(rcb));
    ASSERT_TRUE(rcb == 0 || rcb == LKV_ETIMEDOUT || rcb == LKV_EUNAVAIL);
    lkv_engine_release(ra);
    lkv_engine_release(rb);
    lkv_engine_destroy(e);
    lkv_rag_result_free(&solo);
    lkv_worker_destroy(w);
}

/* Lease renewals from the client-call thread: a ~1 s generation under a 300 ms lease. */
static void test_engine_renewals(void)
{
    static const char *A[] = {"Lily had a big red ball. She liked to throw it high."};
    slow = *lkv_backend_cpu();
    slow.attn_decode = slow_decode;
    lkv_worker *w = make_worker(dm.addr, 300, &slow);
    lkv_rag_result solo;
    ASSERT_OK(run(w, A, 1, 5, &solo)); /* Cached. */
    lkv_rag_result_free(&solo);
    ASSERT_OK(run(w, A, 1, 60, &solo));
    ASSERT_EQ(solo.hit_docs, 1);
    uint64_t r0 = stats(w).renewals;
    lkv_engine *e;
    ASSERT_OK(lkv_engine_create(w, NULL, &e));
    lkv_engine_req *r;
    ASSERT_OK(lkv_engine_submit(e, make(w, A, 1, 60), 0, NULL, NULL, &r, NULL, 0));
    lkv_engine_event ev;
    while (lkv_engine_wait(r, &ev, 20000) && ev.kind == LKV_ENGINE_TOKEN) {
    }
    ASSERT_EQ(ev.kind, LKV_ENGINE_END);
    ASSERT_EQ(ev.rc, 0);
    lkv_engine_result er;
    lkv_engine_result_get(r, &er);
    same_tokens(er.res, &solo);
    ASSERT_EQ(er.res->hit_docs, 1);
    lkv_engine_release(r);
    lkv_engine_destroy(e);
    lkv_worker_stats st = stats(w);
    fprintf(stderr, "   engine: %llu renewals (300 ms lease), %llu local restarts\n",
            (unsigned long long)(st.renewals - r0), (unsigned long long)st.local_restarts);
    ASSERT_TRUE(st.renewals - r0 >= 2);
    ASSERT_EQ(st.local_restarts, 0);
    lkv_rag_result_free(&solo);
    lkv_worker_destroy(w);
}

int main(void)
{
    const char *args[] = {LKV_IT_PROFILE_ARGS, NULL};
    lkv_daemon_init(&dm, args);
    lkv_it_start(&dm);
    LKV_RUN(test_reserve_refused);
    LKV_RUN(test_reserve_declined_by_door);
    LKV_RUN(test_in_progress);
    LKV_RUN(test_lease_lost);
    LKV_RUN(test_stopped_daemon_does_not_stall_decode);
    LKV_RUN(test_engine_renewals);
    LKV_RUN(test_daemon_gone_before_commit);
    lkv_daemon_cleanup(&dm);
    return 0;
}
