/*
 * test_worker_faults.c: integration.worker_faults. The decode worker under faults and bad
 * input, against a real lazykvd:
 *   - a worker killed with kill -9 while attached pins nothing past its lease TTL, and while it
 *     is attached its documents are never evicted (not by Evict, not by hot-tier pressure);
 *   - an unreachable daemon: a clear error naming it, fast; with local_fallback a local answer
 *     that says so and equals the local-only answer;
 *   - a hung daemon (SIGSTOP): the request ends by its deadline, never later;
 *   - a generation longer than the lease TTL renews the lease (and nothing expires);
 *   - Attach in ATTACH_MODE_PRESENT over the wire: present documents pinned (a cold one
 *     promoted), absent ones reported, no lease when nothing is present; and at the worker, a
 *     document deleted between Lookup and Attach costs one miss (same output), not the request;
 *   - a daemon killed mid-request (kill -9 during decode): the request completes from the
 *     mapped pages (bitwise the normal output) and says the Release failed; after a restart the
 *     same worker maps the new arena and serves again;
 *   - an unknown profile, a mismatched model identity (checkpoint hash; revision string not
 *     confirmed or different), a prompt past the model's maximum position, an empty document or
 *     question: each refused with a clear message, and nothing is stored for a refused model.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lkv_backend_cpu.h"
#include "lkv_client.h"
#include "lkv_daemon_harness.h"
#include "lkv_it_util.h"
#include "lkv_request.h"
#include "lkv_test.h"
#include "lkv_test_proc.h"
#include "lkv_worker.h"

#define MODEL LKV_TEST_MODEL_DIR "/stories260K.bin"
#define TOKP  LKV_TEST_MODEL_DIR "/tok512.bin"

static const char *DOCS[] = {
    "Lily went to the park with her mom. They saw a big tree with red apples.",
    "Tom had a red ball. He liked to throw it high in the sky and catch it.",
};
static const char *QUESTION = "One day, Lily and Tom";

/* Profiles of this test: a fine-tune whose checkpoint hash is not ours, and one named by a
 * revision string. */
#define FT_HASH "blake2b:00000000000000000000000000000000000000000000000000000000000000ff"
#define PROFILE_ARGS(name, id)                                                                     \
    "--set", "profile." name ".n_layers=5", "--set", "profile." name ".n_q_heads=8", "--set",      \
        "profile." name ".n_kv_heads=4", "--set", "profile." name ".head_dim=8", "--set",          \
        "profile." name ".dtype=f32", "--set", "profile." name ".vocab_size=512", "--set",         \
        "profile." name ".rope_pairing=interleaved", "--set", "profile." name ".model_id=" id

static lkv_daemon dm;
static const char *self_path; /* argv[0], re-executed as the attached worker. */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static lkv_worker *make_worker(const char *target, const char *profile, const char *model_id,
                               int fallback, int deadline_ms, uint32_t ttl_ms,
                               const lkv_backend *be)
{
    lkv_worker_opts o = {.target = target,
                         .profile = profile,
                         .model_path = MODEL,
                         .tokenizer_path = TOKP,
                         .model_id = model_id,
                         .local_fallback = fallback,
                         .deadline_ms = deadline_ms,
                         .lease_ttl_ms = ttl_ms,
                         .backend = be};
    lkv_worker *w;
    char err[512];
    if (lkv_worker_create(&o, &w, err, sizeof err) != 0) {
        LKV_FAIL("worker: %s", err);
    }
    return w;
}

static void make_request(lkv_worker *w, int n_docs, int max_tokens, lkv_request *rq)
{
    lkv_request_defaults def = {.max_tokens = max_tokens};
    char err[256];
    ASSERT_OK(lkv_request_from_text(DOCS, n_docs, QUESTION, lkv_worker_tokenizer(w), &def, "f", rq,
                                    err, sizeof err));
    rq->rag.stop_at_eos = 0;
}

/* Runs the two-document request; returns its status, res filled. */
static int run(lkv_worker *w, int max_tokens, lkv_rag_result *res)
{
    lkv_request rq;
    make_request(w, 2, max_tokens, &rq);
    int rc = lkv_worker_run(w, &rq.rag, res);
    lkv_request_free(&rq);
    return rc;
}

static double stat_of(lkv_client_t *c, const char *section, const char *key)
{
    lkv_stat_entry *e;
    size_t n;
    ASSERT_OK(lkv_client_stats_entries(c, section, 0, &e, &n));
    double v = -1;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(e[i].key, key) == 0) {
            v = e[i].value;
        }
    }
    free(e);
    return v;
}

/* Keys (store form = wire form: no tenants) of the request's documents, via Lookup. */
static void doc_keys(lkv_client_t *c, lkv_worker *w, uint8_t keys[2][32], int *tiers)
{
    lkv_request rq;
    make_request(w, 2, 1, &rq);
    lkv_docref refs[2];
    uint32_t ids[2][256];
    for (int d = 0; d < 2; d++) {
        for (int t = 0; t < rq.docs[d].n_tokens; t++) {
            ids[d][t] = (uint32_t)rq.docs[d].tokens[t];
        }
        refs[d] = (lkv_docref){
            .profile = "stories260k", .tokens = ids[d], .n_tokens = (size_t)rq.docs[d].n_tokens};
    }
    lkv_doc_status st[2];
    ASSERT_OK(lkv_client_lookup(c, refs, 2, 0, st));
    for (int d = 0; d < 2; d++) {
        memcpy(keys[d], st[d].key, 32);
        tiers[d] = st[d].tier;
    }
    lkv_request_free(&rq);
}

/* A backend whose decode is slow (a worker that stays attached for seconds). */
static lkv_backend slow;
static int slow_decode(void *ctx, const lkv_decode_args *a)
{
    if (a->layer == 0) {
        usleep(100 * 1000);
    }
    return lkv_attn_decode_cpu(a);
    (void)ctx;
}

static void test_kill9_attached(void)
{
    lkv_client_t *c = lkv_it_client(&dm);
    /* Cache the two documents first. */
    lkv_worker *w = make_worker(dm.addr, NULL, NULL, 0, 0, 0, NULL);
    lkv_rag_result res;
    ASSERT_OK(run(w, 4, &res));
    lkv_rag_result_free(&res);
    uint8_t keys[2][32];
    int tiers[2];
    doc_keys(c, w, keys, tiers);
    lkv_worker_destroy(w);
    ASSERT_EQ(tiers[0], LKV_WIRE_TIER_HOT);

    /* The attached worker: this binary re-executed (a fresh process: no gRPC state crosses a
     * fork), decoding slowly so that it holds its lease for seconds. */
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        execl(self_path, self_path, "--attached-child", dm.addr, (char *)NULL);
        _exit(127);
    }
    /* Wait until the child holds its lease. */
    double t0 = now_ms();
    while (stat_of(c, "leases", "live") < 1) {
        if (now_ms() - t0 > lkv_test_timeout_ms(20000)) {
            LKV_FAIL("the worker never attached");
        }
        usleep(20 * 1000);
    }
    ASSERT_EQ(stat_of(c, "leases", "docs_pinned"), 2);
    /* In use: Evict is refused, and hot-tier pressure evicts other documents, never these. */
    ASSERT_ERR(lkv_client_evict(c, keys[0], 0),
               LKV_EBUSY); /* FAILED_PRECONDITION, exact code from lkv-code */
    for (uint64_t i = 0; i < 80; i++) {
        it_doc d;
        lkv_it_doc_make(&lkv_it_itest, 1000 + i, 16, &d);
        int rc = lkv_client_put(c, "itest", d.tokens, d.n_tokens, d.blocks, d.n_blocks,
                                d.block_bytes, 0, NULL);
        ASSERT_TRUE(rc == 0 || rc == LKV_ENOSPC);
        lkv_it_doc_free(&d);
    }
    ASSERT_TRUE(stat_of(c, "leases", "live") == 1); /* still decoding */
    w = make_worker(dm.addr, NULL, NULL, 0, 0, 0, NULL);
    doc_keys(c, w, keys, tiers);
    ASSERT_EQ(tiers[0], LKV_WIRE_TIER_HOT);
    ASSERT_EQ(tiers[1], LKV_WIRE_TIER_HOT);
    fprintf(stderr, "   pinned documents stayed hot under 80 puts into a 64-page arena\n");
    /* kill -9 the attached worker: the lease ends by itself within its TTL. */
    double tk = now_ms();
    kill(pid, SIGKILL);
    int ws;
    waitpid(pid, &ws, 0);
    ASSERT_TRUE(WIFSIGNALED(ws));
    while (stat_of(c, "leases", "live") > 0) {
        if (now_ms() - tk > 1500 + lkv_test_timeout_ms(3000)) {
            LKV_FAIL("the killed worker's lease outlived its TTL");
        }
        usleep(50 * 1000);
    }
    fprintf(stderr, "   kill -9: lease gone %.0f ms after the kill (TTL 1500 ms)\n", now_ms() - tk);
    ASSERT_EQ(stat_of(c, "leases", "docs_pinned"), 0);
    ASSERT_EQ(stat_of(c, "leases", "expired"), 1);
    ASSERT_OK(lkv_client_evict(c, keys[0], 0)); /* No longer pinned. */
    lkv_worker_destroy(w);
    lkv_client_destroy(c);
}

static void test_unreachable(void)
{
    /* A port nothing listens on. */
    lkv_worker *w = make_worker("127.0.0.1:1", NULL, NULL, 0, 3000, 0, NULL);
    lkv_rag_result res;
    double t0 = now_ms();
    int rc = run(w, 8, &res);
    double el = now_ms() - t0;
    fprintf(stderr, "   unreachable: %s in %.0f ms (retry 2000 ms, deadline 3000 ms): %s\n",
            lkv_err_name(rc), el, res.error);
    ASSERT_TRUE(rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT);
    ASSERT_TRUE(strstr(res.error, "127.0.0.1:1") != NULL);
    ASSERT_TRUE(strstr(res.error, "--local-fallback") != NULL);
    ASSERT_TRUE(el >= 1900 && el < 3000 + 1000);
    lkv_rag_result_free(&res);
    lkv_worker_destroy(w);
    /* Local fallback: computed locally, said so, the local-only answer. */
    w = make_worker("127.0.0.1:1", NULL, NULL, 1, 3000, 0, NULL);
    ASSERT_OK(run(w, 8, &res));
    ASSERT_EQ(res.local_only, 1);
    ASSERT_EQ(res.miss_docs, 2);
    ASSERT_TRUE(strstr(res.note, "local fallback") != NULL);
    lkv_worker *lw = make_worker(NULL, NULL, NULL, 0, 0, 0, NULL);
    lkv_rag_result lr;
    ASSERT_OK(run(lw, 8, &lr));
    ASSERT_TRUE(strcmp(lr.text, res.text) == 0 && lr.n_out == res.n_out);
    lkv_rag_result_free(&lr);
    lkv_rag_result_free(&res);
    lkv_worker_destroy(lw);
    lkv_worker_destroy(w);
}

static void test_hung_daemon(void)
{
    lkv_worker *w = make_worker(dm.addr, NULL, NULL, 0, 1000, 0, NULL);
    lkv_rag_result res;
    ASSERT_OK(run(w, 4, &res)); /* Connected and warm. */
    lkv_rag_result_free(&res);
    kill(dm.pid, SIGSTOP);
    lkv_test_wait_stopped(dm.pid);
    double t0 = now_ms();
    int rc = run(w, 4, &res);
    double el = now_ms() - t0;
    fprintf(stderr, "   hung daemon: %s after %.0f ms (deadline 1000 ms): %s\n", lkv_err_name(rc),
            el, res.error);
    ASSERT_TRUE(rc == LKV_ETIMEDOUT || rc == LKV_EUNAVAIL);
    ASSERT_TRUE(el < 1000 + lkv_test_timeout_ms(1000));
    lkv_rag_result_free(&res);
    lkv_worker_destroy(w);
    w = make_worker(dm.addr, NULL, NULL, 1, 1000, 0, NULL);
    t0 = now_ms();
    ASSERT_OK(run(w, 4, &res));
    ASSERT_EQ(res.local_only, 1);
    ASSERT_TRUE(now_ms() - t0 < 1000 + lkv_test_timeout_ms(1000));
    lkv_rag_result_free(&res);
    lkv_worker_destroy(w);
    kill(dm.pid, SIGCONT);
}

/* A generation longer than the lease TTL: the worker renews the lease at half-life. */
static void test_lease_renewal(void)
{
    slow = *lkv_backend_cpu();
    slow.attn_decode = slow_decode;
    lkv_worker *w = make_worker(dm.addr, NULL, NULL, 0, 20000, 400, &slow);
    lkv_rag_result res;
    ASSERT_OK(run(w, 2, &res)); /* cached (again) */
    lkv_rag_result_free(&res);
    lkv_client_t *c = lkv_it_client(&dm);
    double renewals0 = stat_of(c, "leases", "renewals");
    ASSERT_OK(run(w, 12, &res)); /* ~1.1 s of decode under a 400 ms lease */
    ASSERT_EQ(res.hit_docs, 2);
    lkv_worker_stats st;
    lkv_worker_stats_get(w, &st);
    fprintf(stderr, "   lease renewal: %llu renewals in %.0f ms (TTL 400 ms)\n",
            (unsigned long long)st.renewals, res.total_ms);
    ASSERT_TRUE(st.renewals >= 3);
    ASSERT_TRUE(stat_of(c, "leases", "renewals") - renewals0 >= 3);
    ASSERT_EQ(stat_of(c, "leases", "expired"), 1); /* only the killed worker's */
    ASSERT_EQ(stat_of(c, "leases", "live"), 0);
    lkv_rag_result_free(&res);
    lkv_worker_destroy(w);
    /* The deadline bounds the daemon calls, not the generation: a miss is still stored after a
     * generation three times longer than deadline_ms. */
    w = make_worker(dm.addr, NULL, NULL, 0, 400, 400, &slow);
    const char *doc[1] = {"Ben had a kite. It flew very high over the hill."};
    lkv_request_defaults def = {.max_tokens = 12};
    lkv_request rq;
    char err[256];
    ASSERT_OK(lkv_request_from_text(doc, 1, QUESTION, lkv_worker_tokenizer(w), &def, "d", &rq, err,
                                    sizeof err));
    rq.rag.stop_at_eos = 0;
    ASSERT_OK(lkv_worker_run(w, &rq.rag, &res));
    ASSERT_EQ(res.miss_docs, 1);
    ASSERT_TRUE(res.total_ms > 1000);
    ASSERT_EQ(res.docs[0].stored, 1);
    lkv_rag_result_free(&res);
    lkv_request_free(&rq);
    lkv_client_destroy(c);
    lkv_worker_destroy(w);
}

/* ATTACH_MODE_PRESENT over the wire: what is present is pinned (a cold one promoted), the rest
 * is reported, and nothing present makes no lease. */
static void test_attach_present_rpc(void)
{
    lkv_client_t *c = lkv_it_client(&dm);
    it_doc a, b;
    lkv_it_doc_make(&lkv_it_itest, 500, 40, &a);
    lkv_it_doc_make(&lkv_it_itest, 501, 40, &b);
    lkv_put_reply pr;
    ASSERT_OK(lkv_client_put(c, "itest", a.tokens, a.n_tokens, a.blocks, a.n_blocks, a.block_bytes,
                             0, &pr));
    lkv_docref refs[2] = {lkv_it_ref(&lkv_it_itest, &a), lkv_it_ref(&lkv_it_itest, &b)};
    lkv_lease l;
    ASSERT_ERR(lkv_client_attach(c, refs, 2, NULL, 5000, 0, &l), LKV_ENOTFOUND); /* all mode */
    ASSERT_OK(lkv_client_attach_present(c, refs, 2, NULL, 5000, 0, &l));
    ASSERT_EQ(l.live, 1);
    ASSERT_EQ(l.lease_docs, 1);
    ASSERT_TRUE(l.docs[0].attached && l.docs[0].n_pages == a.n_blocks);
    ASSERT_EQ(l.docs[0].tier, LKV_WIRE_TIER_HOT);
    ASSERT_TRUE(!l.docs[1].attached && !l.docs[1].present && l.docs[1].n_pages == 0);
    ASSERT_EQ(l.docs[1].tier, LKV_WIRE_TIER_ABSENT);
    ASSERT_TRUE(strcmp(l.docs[1].profile, "itest") == 0);
    ASSERT_OK(lkv_client_release(c, l.id, 0, NULL));
    lkv_lease_free(&l);
    /* Nothing present: no lease. */
    ASSERT_OK(lkv_client_attach_present(c, &refs[1], 1, NULL, 5000, 0, &l));
    ASSERT_EQ(l.live, 0);
    ASSERT_EQ(l.docs[0].attached, 0);
    lkv_lease_free(&l);
    /* A document moved to the cold tier is promoted and pinned. */
    sleep(1); /* let the write-back writer persist it */
    int rc;
    for (int i = 0; i < 50 && (rc = lkv_client_evict(c, pr.key, 0)) != 0; i++) {
        usleep(100 * 1000);
    }
    ASSERT_OK(rc);
    ASSERT_OK(lkv_client_attach_present(c, refs, 1, NULL, 5000, 0, &l));
    ASSERT_TRUE(l.live && l.docs[0].attached && l.docs[0].n_pages == a.n_blocks);
    ASSERT_OK(lkv_client_release(c, l.id, 0, NULL));
    lkv_lease_free(&l);
    lkv_it_doc_free(&a);
    lkv_it_doc_free(&b);
    lkv_client_destroy(c);
}

/* A document evicted from every tier between the worker's Lookup and its Attach (the race
 * ATTACH_MODE_PRESENT exists for): one miss, computed and stored again; the output is the same
 * as a fully warm request's. */
static lkv_client_t *race_client;
static uint8_t race_key[32];
static int race_fired;
static void delete_after_lookup(void *arg)
{
    (void)arg;
    if (race_fired++ == 0) {
        ASSERT_OK(lkv_client_delete(race_client, &(lkv_docref){.key = race_key}, 0, NULL));
    }
}

static void test_evicted_between_lookup_and_attach(void)
{
    race_client = lkv_it_client(&dm);
    lkv_worker *w = make_worker(dm.addr, NULL, NULL, 0, 0, 0, NULL);
    lkv_rag_result warm, res;
    ASSERT_OK(run(w, 8, &warm));
    ASSERT_OK(run(w, 8, &res));
    ASSERT_EQ(res.hit_docs, 2);
    lkv_rag_result_free(&warm);
    warm = res;
    uint8_t keys[2][32];
    int tiers[2];
    doc_keys(race_client, w, keys, tiers);
    memcpy(race_key, keys[1], 32);
    lkv_worker_destroy(w);
    lkv_worker_opts o = {.target = dm.addr,
                         .model_path = MODEL,
                         .tokenizer_path = TOKP,
                         .after_lookup = delete_after_lookup};
    char err[256];
    ASSERT_OK(lkv_worker_create(&o, &w, err, sizeof err));
    race_fired = 0;
    ASSERT_OK(run(w, 8, &res));
    ASSERT_EQ(race_fired, 1);
    ASSERT_EQ(res.docs[0].hit, 1);
    ASSERT_EQ(res.docs[1].hit, 0);
    ASSERT_EQ(res.docs[1].tier, LKV_WIRE_TIER_HOT); /* what Lookup saw */
    ASSERT_EQ(res.docs[1].stored, 1);               /* computed again and stored */
    ASSERT_TRUE(memcmp(res.tokens, warm.tokens, (size_t)warm.n_out * sizeof(int)) == 0);
    fprintf(stderr, "   deleted between Lookup and Attach: 1 hit + 1 miss, same output\n");
    lkv_rag_result_free(&res);
    ASSERT_OK(run(w, 8, &res));
    ASSERT_EQ(res.hit_docs, 2);
    lkv_rag_result_free(&res);
    lkv_rag_result_free(&warm);
    lkv_worker_destroy(w);
    lkv_client_destroy(race_client);
}

/* Runs a request of the given documents and QUESTION (greedy, 8 tokens). */
static void run_docs(lkv_worker *w, const char **docs, int n, lkv_rag_result *res)
{
    lkv_request rq;
    lkv_request_defaults def = {.max_tokens = 8};
    char err[256];
    ASSERT_OK(lkv_request_from_text(docs, n, QUESTION, lkv_worker_tokenizer(w), &def, "f", &rq, err,
                                    sizeof err));
    rq.rag.stop_at_eos = 0;
    ASSERT_OK(lkv_worker_run(w, &rq.rag, res));
    lkv_request_free(&rq);
}

static void same_output(const lkv_rag_result *a, const lkv_rag_result *b)
{
    ASSERT_EQ(a->n_out, b->n_out);
    ASSERT_TRUE(memcmp(a->tokens, b->tokens, (size_t)a->n_out * sizeof(int)) == 0);
}

/* Put in place vs Put: a worker computes a miss into reserved pages and commits it (no Put); one
 * with no_inplace stores by Put. Each reads the other's document as a hit, with bitwise the
 * output of the worker that computed it: both ways store the same bytes. */
static void test_inplace_vs_put(void)
{
    static const char *A[] = {"Sue found a small blue box under her bed. Inside was a shiny key."};
    static const char *B[] = {"The dog ran after the cat until they both fell asleep in the sun."};
    lkv_worker *wi = make_worker(dm.addr, NULL, NULL, 0, 0, 0, NULL);
    lkv_worker_opts o = {
        .target = dm.addr, .model_path = MODEL, .tokenizer_path = TOKP, .no_inplace = 1};
    lkv_worker *wp;
    char err[256];
    ASSERT_OK(lkv_worker_create(&o, &wp, err, sizeof err));
    lkv_rag_result ci, cp, hi, hp;
    run_docs(wi, A, 1, &ci); /* A: computed in place */
    ASSERT_EQ(ci.miss_docs, 1);
    ASSERT_TRUE(ci.docs[0].stored == 1 && ci.docs[0].inplace == 1);
    run_docs(wp, B, 1, &cp); /* B: computed, Put */
    ASSERT_EQ(cp.miss_docs, 1);
    ASSERT_TRUE(cp.docs[0].stored == 1 && cp.docs[0].inplace == 0);
    lkv_worker_stats si, sp;
    lkv_worker_stats_get(wi, &si);
    lkv_worker_stats_get(wp, &sp);
    ASSERT_TRUE(si.inplace_docs == 1 && si.put_docs == 0);
    ASSERT_TRUE(sp.inplace_docs == 0 && sp.put_docs == 1);
    run_docs(wp, A, 1, &hp); /* the Put-only worker reads A (stored in place) */
    run_docs(wi, B, 1, &hi); /* the in-place worker reads B (stored by Put) */
    ASSERT_TRUE(hp.hit_docs == 1 && hi.hit_docs == 1);
    same_output(&hp, &ci);
    same_output(&hi, &cp);
    fprintf(stderr,
            "   in place and Put store the same bytes: hits give bitwise the cold output\n");
    lkv_rag_result_free(&ci);
    lkv_rag_result_free(&cp);
    lkv_rag_result_free(&hi);
    lkv_rag_result_free(&hp);
    lkv_worker_destroy(wi);
    lkv_worker_destroy(wp);
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

static void test_killed_mid_request(void)
{
    lkv_worker *w = make_worker(dm.addr, NULL, NULL, 0, 5000, 0, NULL);
    lkv_rag_result normal, res;
    ASSERT_OK(run(w, 10, &normal));
    ASSERT_OK(run(w, 10, &res)); /* warm */
    ASSERT_EQ(res.hit_docs, 2);
    lkv_rag_result_free(&normal);
    normal = res;
    lkv_worker_destroy(w);
    killer = *lkv_backend_cpu();
    killer.attn_decode = killer_decode;
    killer_calls = 0;
    char addr[128];
    snprintf(addr, sizeof addr, "%s", dm.addr);
    w = make_worker(addr, NULL, NULL, 0, 5000, 0, &killer);
    int rc = run(w, 10, &res);
    ASSERT_EQ(dm.pid, 0); /* killed */
    if (rc != 0) {
        LKV_FAIL("killed mid-request: %s: %s", lkv_err_name(rc), res.error);
    }
    ASSERT_EQ(res.hit_docs, 2);
    ASSERT_TRUE(memcmp(res.tokens, normal.tokens, (size_t)res.n_out * sizeof(int)) == 0);
    ASSERT_TRUE(strstr(res.note, "Release failed") != NULL);
    fprintf(stderr, "   daemon killed during decode: request completed; note: %s\n", res.note);
    lkv_rag_result_free(&res);
    /* The next request: a clear error while it is down, then served again after a restart. */
    rc = run(w, 4, &res);
    ASSERT_TRUE(rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT);
    lkv_rag_result_free(&res);
    const char *same_port[] = {"--listen", addr, NULL};
    ASSERT_OK(lkv_daemon_start_with(&dm, same_port));
    killer_calls = 100;
    rc = run(w, 10, &res); /* The worker retries while the channel reconnects. */
    if (rc != 0) {
        LKV_FAIL("after restart: %s: %s", lkv_err_name(rc), res.error);
    }
    lkv_worker_stats st;
    lkv_worker_stats_get(w, &st);
    ASSERT_EQ(st.arena_maps, 2); /* The restarted daemon's arena. */
    lkv_rag_result_free(&res);
    lkv_rag_result_free(&normal);
    lkv_worker_destroy(w);
}

static void test_bad_input(void)
{
    lkv_rag_result res;
    /* Unknown profile. */
    lkv_worker *w = make_worker(dm.addr, "nope", NULL, 0, 0, 0, NULL);
    ASSERT_ERR(run(w, 4, &res), LKV_EPROFILE);
    fprintf(stderr, "   unknown profile: %s\n", res.error);
    ASSERT_TRUE(strstr(res.error, "unknown profile 'nope'") != NULL);
    lkv_rag_result_free(&res);
    lkv_worker_destroy(w);
    /* A fine-tune's profile (another checkpoint hash): refused, nothing stored. */
    lkv_client_t *c = lkv_it_client(&dm);
    w = make_worker(dm.addr, "ft", NULL, 0, 0, 0, NULL);
    ASSERT_ERR(run(w, 4, &res), LKV_EPROFILE);
    fprintf(stderr, "   mismatched model: %s\n", res.error);
    ASSERT_TRUE(strstr(res.error, "model identity mismatch") != NULL);
    ASSERT_TRUE(strstr(res.error, FT_HASH) != NULL);
    ASSERT_TRUE(strstr(res.error, lkv_worker_model_hash(w)) != NULL);
    lkv_rag_result_free(&res);
    lkv_worker_destroy(w);
    lkv_list_filter f = {.profile = "ft"};
    lkv_doc_status *docs;
    size_t n;
    int more;
    ASSERT_OK(lkv_client_list(c, &f, 0, &docs, &n, NULL, &more));
    ASSERT_EQ(n, 0);
    free(docs);
    /* A revision string: refused unless confirmed, and only the same one is accepted. */
    w = make_worker(dm.addr, "rev", NULL, 0, 0, 0, NULL);
    ASSERT_ERR(run(w, 4, &res), LKV_EPROFILE);
    ASSERT_TRUE(strstr(res.error, "--model-id 'stories-ft@r1'") != NULL);
    lkv_rag_result_free(&res);
    lkv_worker_destroy(w);
    w = make_worker(dm.addr, "rev", "stories-ft@r2", 0, 0, 0, NULL);
    ASSERT_ERR(run(w, 4, &res), LKV_EPROFILE);
    lkv_rag_result_free(&res);
    lkv_worker_destroy(w);
    w = make_worker(dm.addr, "rev", "stories-ft@r1", 0, 0, 0, NULL);
    ASSERT_OK(run(w, 4, &res));
    ASSERT_EQ(res.docs[0].stored, 1);
    lkv_rag_result_free(&res);
    lkv_worker_destroy(w);
    lkv_client_destroy(c);

    /* Prompt past the model's maximum position (seq_len 512), empty document and question. */
    w = make_worker(dm.addr, NULL, NULL, 0, 0, 0, NULL);
    lkv_request rq;
    make_request(w, 2, 4, &rq);
    rq.rag.max_tokens = 512;
    ASSERT_ERR(lkv_worker_run(w, &rq.rag, &res), LKV_EINVAL);
    fprintf(stderr, "   past max position: %s\n", res.error);
    ASSERT_TRUE(strstr(res.error, "maximum position 511") != NULL);
    lkv_rag_result_free(&res);
    rq.rag.max_tokens = 4;
    rq.docs[1].n_tokens = 0;
    ASSERT_ERR(lkv_worker_run(w, &rq.rag, &res), LKV_EINVAL);
    ASSERT_TRUE(strstr(res.error, "document 1 is empty") != NULL);
    lkv_rag_result_free(&res);
    rq.docs[1].n_tokens = 3;
    rq.rag.n_question = 0;
    ASSERT_ERR(lkv_worker_run(w, &rq.rag, &res), LKV_EINVAL);
    ASSERT_TRUE(strstr(res.error, "question is empty") != NULL);
    lkv_rag_result_free(&res);
    rq.rag.n_question = 1;
    rq.docs[0].tokens = (const int[]){5, 512, 7};
    rq.docs[0].n_tokens = 3;
    ASSERT_ERR(lkv_worker_run(w, &rq.rag, &res), LKV_EINVAL);
    ASSERT_TRUE(strstr(res.error, "outside the vocabulary") != NULL);
    lkv_rag_result_free(&res);
    lkv_request_free(&rq);
    lkv_worker_stats st;
    lkv_worker_stats_get(w, &st);
    ASSERT_EQ(st.failed, 4);
    lkv_worker_destroy(w);
}

/* The child of test_kill9_attached: attaches (1.5 s TTL) and decodes ~40 s, until killed. */
static int attached_child(const char *addr)
{
    slow = *lkv_backend_cpu();
    slow.attn_decode = slow_decode;
    lkv_worker *cw = make_worker(addr, NULL, NULL, 0, 60000, 1500, &slow);
    lkv_rag_result r;
    run(cw, 400, &r);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--attached-child") == 0) {
        return attached_child(argv[2]);
    }
    self_path = argv[0];
    const char *args[] = {LKV_IT_PROFILE_ARGS, PROFILE_ARGS("ft", FT_HASH),
                          PROFILE_ARGS("rev", "stories-ft@r1"), NULL};
    lkv_daemon_init(&dm, args);
    lkv_it_start(&dm);
    LKV_RUN(test_bad_input);
    LKV_RUN(test_unreachable);
    LKV_RUN(test_kill9_attached);
    LKV_RUN(test_hung_daemon);
    LKV_RUN(test_lease_renewal);
    LKV_RUN(test_attach_present_rpc);
    LKV_RUN(test_evicted_between_lookup_and_attach);
    LKV_RUN(test_inplace_vs_put);
    LKV_RUN(test_killed_mid_request);
    lkv_daemon_cleanup(&dm);
    return 0;
}
