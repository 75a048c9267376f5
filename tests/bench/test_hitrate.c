/*
 * test_hitrate.c: invariants of the hit-rate simulator (bench/hitrate) on small configurations,
 * run in CI (a few seconds). Each invariant is a property the models must have whatever the
 * workload, so a regression in the policy or in a model shows up as a violation:
 *   1. equal-size documents, LRU: a larger budget never hits less (LRU's inclusion property);
 *   2. LRU: position-agnostic never hits less than position-aware exact offset (the agnostic
 *      cache is the exact one with its offsets merged);
 *   3. the paper's analytic capacity ratio matches a static top-C simulation within 1%;
 *   4. hand-made traces give the hits worked out by hand for every model;
 *   5. trace files parse as the README documents and bad lines are refused;
 *   6. Belady (the size-aware heuristic) gives the hits worked out by hand on hand-made traces,
 *      ranks by time to next use x size / cost, and with equal sizes and one document a
 *      request (classic paging with bypass, where farthest-next-use is optimal) never hits
 *      less than any policy;
 *   7. the drift generators are seeded and do what README.md says (shift replaces the hot
 *      set, a burst puts a cold document on top, sessions reuse documents, "zipf" is the
 *      stationary trace itself);
 *   8. residency directives in trace files parse and replay: a hold keeps a document, class
 *      eviction and TTL remove it, a low priority goes first;
 *   9. a generated trace written as a trace file loads back as the same requests.
 * Seed printed; LKV_TEST_SEED overrides.
 */
#include <stdint.h>
#include <unistd.h>

#include "lkv_log.h"
#include "lkv_policy.h"
#include "lkv_sim.h"
#include "lkv_test.h"

#define GIB (1ull << 30)

static uint64_t g_seed;

static double hit_rate(const lkv_sim_trace *t, int model, int policy, uint64_t budget,
                       double *doc_rate)
{
    lkv_sim_cfg c;
    lkv_sim_cfg_default(&c);
    c.model = model;
    c.policy = policy;
    c.budget = budget;
    lkv_sim_result r;
    ASSERT_OK(lkv_sim_run(t, &c, &r));
    ASSERT_TRUE(r.hit_tokens <= r.tokens && r.doc_hits <= r.docs);
    if (doc_rate != NULL) {
        *doc_rate = (double)r.doc_hits / (double)r.docs;
    }
    return (double)r.hit_tokens / (double)r.tokens;
}

static void small_trace(double alpha, uint32_t ndocs, uint64_t nreq, uint64_t seed,
                        lkv_sim_trace *t)
{
    lkv_sim_gen g;
    lkv_sim_gen_default(&g);
    g.ndocs = ndocs;
    g.alpha = alpha;
    g.nreq = nreq;
    g.seed = seed;
    ASSERT_OK(lkv_sim_trace_generate(&g, t));
}

static void test_lru_monotone_in_budget(void)
{
    static const double alphas[] = {0, 0.8, 1.2, 2.1};
    for (int a = 0; a < 4; a++) {
        lkv_sim_trace t;
        small_trace(alphas[a], 500, 4000, g_seed + (uint64_t)a, &t);
        for (int model = LKV_SIM_EXACT; model <= LKV_SIM_AGNOSTIC; model += 2) {
            double prev = -1;
            for (uint64_t quarter = 1; quarter <= 64; quarter++) { /* 0.25 .. 16 GiB */
                double h = hit_rate(&t, model, LKV_POLICY_LRU, quarter * GIB / 4, NULL);
                if (h < prev) {
                    LKV_FAIL("alpha %.1f %s: %.3f GiB hits %.5f < %.5f at the budget below",
                             alphas[a], lkv_sim_model_name(model), (double)quarter / 4, h, prev);
                }
                prev = h;
            }
        }
        lkv_sim_trace_free(&t);
    }
}

static void test_agnostic_beats_exact_under_lru(void)
{
    static const double alphas[] = {0, 0.8, 1.1, 1.5, 2.1};
    static const double gibs[] = {0.5, 1, 2, 5, 10, 50, 1e9};
    for (int a = 0; a < 5; a++) {
        lkv_sim_trace t;
        small_trace(alphas[a], 300, 3000, g_seed + 10 + (uint64_t)a, &t);
        for (int b = 0; b < 7; b++) {
            uint64_t budget = gibs[b] > 1e6 ? UINT64_MAX : (uint64_t)(gibs[b] * (double)GIB);
            double de, da;
            double e = hit_rate(&t, LKV_SIM_EXACT, LKV_POLICY_LRU, budget, &de);
            double ag = hit_rate(&t, LKV_SIM_AGNOSTIC, LKV_POLICY_LRU, budget, &da);
            if (ag < e || da < de) {
                LKV_FAIL("alpha %.1f budget %g GiB: agnostic %.5f < exact %.5f", alphas[a], gibs[b],
                         ag, e);
            }
        }
        lkv_sim_trace_free(&t);
    }
}

static void test_analytic_ratio(void)
{
    double r = lkv_sim_capacity_ratio(20, 100, 0.85);
    ASSERT_NEAR(r, 2.87, 0.01); /* The paper quotes 2.86 at alpha ~0.85. */
    ASSERT_NEAR(lkv_sim_capacity_ratio(20, 100, 1.1), 1.99, 0.01);
    static const double alphas[] = {0.85, 1.1, 1.5};
    for (int i = 0; i < 3; i++) {
        double ha, hw;
        ASSERT_OK(lkv_sim_static_topc(20, 100, alphas[i], 1000, 1000000, g_seed, &ha, &hw));
        double want = lkv_sim_capacity_ratio(20, 100, alphas[i]);
        double got = ha / hw;
        if (fabs(got / want - 1) > 0.01) {
            LKV_FAIL("alpha %.2f: simulated ratio %.4f vs analytic %.4f", alphas[i], got, want);
        }
        /* The hit rates themselves are the Zipf masses of the top C and top C/D. */
        double total = lkv_sim_zipf_sum(1000, alphas[i]);
        ASSERT_NEAR(ha, lkv_sim_zipf_sum(100, alphas[i]) / total, 0.005);
        ASSERT_NEAR(hw, lkv_sim_zipf_sum(5, alphas[i]) / total, 0.005);
    }
    ASSERT_ERR(lkv_sim_static_topc(0, 100, 1, 1000, 10, 1, &(double){0}, &(double){0}), LKV_EINVAL);
}

/* A hand-made trace: docs 0..3 of 32 tokens (2 blocks), requests given as rows of 3. */
static void hand_trace(lkv_sim_trace *t, const uint32_t *docs, uint64_t nreq)
{
    memset(t, 0, sizeof(*t));
    t->ndocs = 4;
    t->doc_tokens = lkv_xmalloc(4 * sizeof(uint32_t));
    for (int i = 0; i < 4; i++) {
        t->doc_tokens[i] = 32;
    }
    t->nreq = nreq;
    t->req_off = lkv_xmalloc((nreq + 1) * sizeof(uint64_t));
    t->docs = lkv_xmalloc(nreq * 3 * sizeof(uint32_t));
    for (uint64_t q = 0; q <= nreq; q++) {
        t->req_off[q] = q * 3;
    }
    memcpy(t->docs, docs, nreq * 3 * sizeof(uint32_t));
}

static void test_hand_made(void)
{
    /* Same three documents, three orders. Unlimited budget:
     *   prefix:   request 2 repeats request 1 (all 3 hit); request 3 starts with another
     *             document (0 hits)                                  -> 3 of 9 documents;
     *   exact:    r2 all 3; r3 = (2,1,0) vs offsets 0,32,64: only doc 1 at 32 was seen -> 4;
     *   agnostic: r2 and r3 all hit                                   -> 6;
     *   copy:     as agnostic with room for the copies                -> 6;
     *   oracle:   all three pinned from the start                     -> 9. */
    static const uint32_t docs[] = {0, 1, 2, 0, 1, 2, 2, 1, 0};
    lkv_sim_trace t;
    hand_trace(&t, docs, 3);
    static const int want[LKV_SIM__COUNT] = {3, 4, 6, 6, 9, 6}; /* belady: no limit, as agnostic. */
    for (int m = 0; m < LKV_SIM__COUNT; m++) {
        double dr;
        double br = hit_rate(&t, m, LKV_POLICY_LRU, UINT64_MAX, &dr);
        ASSERT_NEAR(dr * 9, want[m], 1e-9);
        ASSERT_NEAR(br, dr, 1e-9); /* Equal lengths, whole blocks. */
    }
    /* Copy per use, budget 4 documents (32 tokens x 128 KiB = 4 MiB each), 1 in flight.
     * r2: 0 hits (copy fits), 1 hits (its copy evicts 2), 2 misses; r3: 2 and 1 hit, 0
     * misses: 4 hits where agnostic has 6. Budget 1 document: r2's hit on 0 cannot get room
     * for its copy (0 itself is the only other entry and is the copy's source): dropped. */
    static const uint64_t budget_docs[] = {4, 1};
    static const uint64_t want_copy[] = {4, 0}, want_agn[] = {6, 1}, want_drop[] = {0, 1};
    for (int i = 0; i < 2; i++) {
        lkv_sim_cfg c;
        lkv_sim_cfg_default(&c);
        c.budget = budget_docs[i] * 32 * 131072;
        lkv_sim_result r;
        c.model = LKV_SIM_COPY;
        ASSERT_OK(lkv_sim_run(&t, &c, &r));
        ASSERT_EQ(r.doc_hits, want_copy[i]);
        ASSERT_EQ(r.dropped, want_drop[i]);
        c.model = LKV_SIM_AGNOSTIC;
        ASSERT_OK(lkv_sim_run(&t, &c, &r));
        ASSERT_EQ(r.doc_hits, want_agn[i]);
    }
    lkv_sim_trace_free(&t);
}

static void test_trace_file(void)
{
    char path[] = "/tmp/lkv_trace_XXXXXX";
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "# a comment line\n"
               "docA:100 docB docC:48\n"
               "\n"
               "docB:999, docA  # B keeps its first given length (999), A keeps 100\n"
               "42\n");
    fclose(f);
    lkv_sim_trace t;
    char err[256];
    ASSERT_OK(lkv_sim_trace_load(path, 2048, &t, err, sizeof(err)));
    ASSERT_EQ(t.nreq, 3);
    ASSERT_EQ(t.ndocs, 4);
    ASSERT_EQ(t.req_off[1], 3);
    ASSERT_EQ(t.req_off[3], 6);
    ASSERT_EQ(t.docs[3], t.docs[1]);          /* docB */
    ASSERT_EQ(t.doc_tokens[t.docs[0]], 100);  /* docA */
    ASSERT_EQ(t.doc_tokens[t.docs[1]], 999);  /* docB: first given count */
    ASSERT_EQ(t.doc_tokens[t.docs[2]], 48);   /* docC */
    ASSERT_EQ(t.doc_tokens[t.docs[5]], 2048); /* 42: default */
    lkv_sim_trace_free(&t);

    f = fopen(path, "w");
    fprintf(f, "a b\nc:x\n");
    fclose(f);
    ASSERT_ERR(lkv_sim_trace_load(path, 2048, &t, err, sizeof(err)), LKV_EINVAL);
    ASSERT_TRUE(strstr(err, ":2:") != NULL);
    f = fopen(path, "w");
    fprintf(f, "# nothing\n\n");
    fclose(f);
    ASSERT_ERR(lkv_sim_trace_load(path, 2048, &t, err, sizeof(err)), LKV_EINVAL);
    unlink(path);
    ASSERT_ERR(lkv_sim_trace_load(path, 2048, &t, err, sizeof(err)), LKV_EIO);
}

/* lkv_sim_trace_write: a generated trace (lognormal lengths, sessions) written and loaded back
 * gives the same requests: same lengths in the same order, and two uses name the same document
 * after loading exactly when they did before (a bijection of ids); the hit rates of every model
 * agree; a trace with residency events is refused, an unwritable path is EIO. */
static void test_trace_write(void)
{
    lkv_sim_gen g;
    lkv_sim_gen_default(&g);
    g.ndocs = 300;
    g.alpha = 1.1;
    g.nreq = 400;
    g.k = 4;
    g.len_kind = LKV_SIM_LEN_LOGNORMAL;
    g.len_a = 300;
    g.len_b = 0.7;
    g.max_tokens = 4096;
    g.seed = g_seed;
    ASSERT_OK(lkv_sim_workload("session", &g));
    lkv_sim_trace t, u;
    ASSERT_OK(lkv_sim_trace_generate(&g, &t));
    char path[] = "/tmp/lkv_trace_w_XXXXXX";
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    close(fd);
    char err[256];
    ASSERT_OK(lkv_sim_trace_write(&t, path, err, sizeof(err)));
    ASSERT_OK(lkv_sim_trace_load(path, 7, &u, err, sizeof(err)));
    ASSERT_EQ(u.nreq, t.nreq);
    ASSERT_TRUE(u.ndocs <= t.ndocs);
    uint32_t *fwd = lkv_xmalloc(t.ndocs * sizeof(uint32_t)), *back = lkv_xmalloc(u.ndocs * 4);
    memset(fwd, 0xff, t.ndocs * sizeof(uint32_t));
    memset(back, 0xff, u.ndocs * sizeof(uint32_t));
    for (uint64_t q = 0; q <= t.nreq; q++) {
        ASSERT_EQ(u.req_off[q], t.req_off[q]);
    }
    for (uint64_t i = 0; i < t.req_off[t.nreq]; i++) {
        uint32_t a = t.docs[i], b = u.docs[i];
        ASSERT_EQ(u.doc_tokens[b], t.doc_tokens[a]);
        if (fwd[a] == UINT32_MAX && back[b] == UINT32_MAX) {
            fwd[a] = b;
            back[b] = a;
        }
        ASSERT_EQ(fwd[a], b);
        ASSERT_EQ(back[b], a);
    }
    free(fwd);
    free(back);
    for (int model = 0; model < LKV_SIM__COUNT; model++) {
        double x = hit_rate(&t, model, LKV_POLICY_ADAPTIVE, GIB / 4, NULL);
        double y = hit_rate(&u, model, LKV_POLICY_ADAPTIVE, GIB / 4, NULL);
        if (x != y) {
            LKV_FAIL("%s: %.6f before writing, %.6f after loading", lkv_sim_model_name(model), x,
                     y);
        }
    }
    lkv_sim_trace_free(&u);
    lkv_sim_event ev = {.before = 0, .op = LKV_SIM_EV_HOLD, .doc = 0, .arg = 0};
    t.ev = lkv_xmalloc(sizeof(ev));
    t.ev[0] = ev;
    t.nev = 1;
    ASSERT_ERR(lkv_sim_trace_write(&t, path, err, sizeof(err)), LKV_EINVAL);
    t.nev = 0;
    ASSERT_ERR(lkv_sim_trace_write(&t, "/nonexistent-dir/x.trace", err, sizeof(err)), LKV_EIO);
    lkv_sim_trace_free(&t);
    unlink(path);
}

/* A trace of one document a request: uses[i] is request i's document; tokens[d] its length. */
static void seq_trace(lkv_sim_trace *t, const uint32_t *tokens, uint32_t ndocs,
                      const uint32_t *uses, uint64_t n)
{
    memset(t, 0, sizeof(*t));
    t->ndocs = ndocs;
    t->doc_tokens = lkv_xmalloc(ndocs * sizeof(uint32_t));
    memcpy(t->doc_tokens, tokens, ndocs * sizeof(uint32_t));
    t->nreq = n;
    t->req_off = lkv_xmalloc((n + 1) * sizeof(uint64_t));
    t->docs = lkv_xmalloc(n * sizeof(uint32_t));
    for (uint64_t q = 0; q <= n; q++) {
        t->req_off[q] = q;
    }
    memcpy(t->docs, uses, n * sizeof(uint32_t));
}

static void run_cfg(const lkv_sim_trace *t, int model, int policy, uint64_t budget, int cost_bytes,
                    lkv_sim_result *r)
{
    lkv_sim_cfg c;
    lkv_sim_cfg_default(&c);
    c.model = model;
    c.policy = policy;
    c.budget = budget;
    c.cost_bytes = cost_bytes;
    ASSERT_OK(lkv_sim_run(t, &c, r));
}

#define DOC_MIB (4ull << 20) /* A 32-token document at 128 KiB a token. */

static void test_belady_hand_made(void)
{
    /* A B C A B C A B C, room for 2: LRU never hits. Belady caches A and B, and on every C
     * sees that C's next use is farther than both (bypass): A and B hit twice -> 4 of 9. */
    static const uint32_t tok3[] = {32, 32, 32};
    static const uint32_t cyc[] = {0, 1, 2, 0, 1, 2, 0, 1, 2};
    lkv_sim_trace t;
    seq_trace(&t, tok3, 3, cyc, 9);
    lkv_sim_result r;
    run_cfg(&t, LKV_SIM_BELADY, LKV_POLICY_LRU, 2 * DOC_MIB, 0, &r);
    ASSERT_EQ(r.doc_hits, 4);
    ASSERT_EQ(r.evictions, 0);
    run_cfg(&t, LKV_SIM_AGNOSTIC, LKV_POLICY_LRU, 2 * DOC_MIB, 0, &r);
    ASSERT_EQ(r.doc_hits, 0);
    run_cfg(&t, LKV_SIM_BELADY, LKV_POLICY_LRU, 1 * DOC_MIB, 0, &r); /* Keeps A: hits 2. */
    ASSERT_EQ(r.doc_hits, 2);
    lkv_sim_trace_free(&t);

    /* Sizes: B = 64 tokens (8 MiB), s1, s2 = 32 tokens; room for 12 MiB. Uses B s1 s2 s2 B s1.
     * At s2 (use 2) the cache is full with B (next use 4) and s1 (next use 5):
     *   cost = 1 (documents): scores 2 x 8 MiB > 3 x 4 MiB, so B goes; then s2 hits, B
     *     misses and is bypassed (never used again), s1 hits: 2 hits, 64 of 256 tokens;
     *   cost = bytes: scores 2 < 3, so s1 goes; s2 hits, B hits, s1 misses: 2 hits, 96 of
     *     256 tokens. Each metric's Belady wins its own metric. */
    static const uint32_t tokb[] = {64, 32, 32};
    static const uint32_t uses[] = {0, 1, 2, 2, 0, 1};
    seq_trace(&t, tokb, 3, uses, 6);
    run_cfg(&t, LKV_SIM_BELADY, LKV_POLICY_LRU, 3 * DOC_MIB, 0, &r);
    ASSERT_EQ(r.doc_hits, 2);
    ASSERT_EQ(r.tokens, 256);
    ASSERT_EQ(r.hit_tokens, 64);
    ASSERT_EQ(r.evictions, 1);
    run_cfg(&t, LKV_SIM_BELADY, LKV_POLICY_LRU, 3 * DOC_MIB, 1, &r);
    ASSERT_EQ(r.doc_hits, 2);
    ASSERT_EQ(r.hit_tokens, 96);
    /* A document larger than the budget is never cached. */
    run_cfg(&t, LKV_SIM_BELADY, LKV_POLICY_LRU, DOC_MIB, 0, &r);
    ASSERT_EQ(r.hit_tokens, 32); /* Only s2's reuse. */
    lkv_sim_trace_free(&t);
}

static void test_belady_bounds_policies(void)
{
    for (int a = 0; a < 3; a++) {
        lkv_sim_gen g;
        lkv_sim_gen_default(&g);
        g.ndocs = 200;
        g.k = 1;
        g.nreq = 3000;
        g.alpha = 0.6 + 0.4 * a;
        g.seed = g_seed + 100 + (uint64_t)a;
        if (a == 2) {
            (void)lkv_sim_workload("mix", &g);
        }
        lkv_sim_trace t;
        ASSERT_OK(lkv_sim_trace_generate(&g, &t));
        for (uint64_t docs = 1; docs <= 64; docs *= 4) {
            uint64_t budget = docs * 256ull * (1 << 20); /* 2048 tokens = 256 MiB. */
            lkv_sim_result b, r;
            run_cfg(&t, LKV_SIM_BELADY, LKV_POLICY_LRU, budget, 0, &b);
            for (int k = 0; k < LKV_POLICY__COUNT; k++) {
                run_cfg(&t, LKV_SIM_AGNOSTIC, k, budget, 0, &r);
                if (r.doc_hits > b.doc_hits) {
                    LKV_FAIL("alpha %.1f, %llu docs: %s hits %llu > belady %llu", g.alpha,
                             (unsigned long long)docs, lkv_policy_name(k),
                             (unsigned long long)r.doc_hits, (unsigned long long)b.doc_hits);
                }
            }
        }
        lkv_sim_trace_free(&t);
    }
}

static int same_trace(const lkv_sim_trace *a, const lkv_sim_trace *b)
{
    return a->nreq == b->nreq && a->ndocs == b->ndocs &&
           memcmp(a->docs, b->docs, a->req_off[a->nreq] * sizeof(uint32_t)) == 0 &&
           memcmp(a->doc_tokens, b->doc_tokens, a->ndocs * sizeof(uint32_t)) == 0;
}

/* Number of documents among the `top` most used of requests [from, to) of t that are also
 * among the `top` most used of [from2, to2). */
static int top_overlap(const lkv_sim_trace *t, uint64_t from, uint64_t to, uint64_t from2,
                       uint64_t to2, int top)
{
    uint32_t *c1 = lkv_xcalloc(t->ndocs, sizeof(uint32_t));
    uint32_t *c2 = lkv_xcalloc(t->ndocs, sizeof(uint32_t));
    for (uint64_t i = t->req_off[from]; i < t->req_off[to]; i++) {
        c1[t->docs[i]]++;
    }
    for (uint64_t i = t->req_off[from2]; i < t->req_off[to2]; i++) {
        c2[t->docs[i]]++;
    }
    int n = 0;
    for (int k = 0; k < top; k++) { /* Take the max of c1 top times, check it in c2's top. */
        uint32_t d1 = 0;
        for (uint32_t d = 0; d < t->ndocs; d++) {
            d1 = c1[d] > c1[d1] ? d : d1;
        }
        uint32_t rank = 0;
        for (uint32_t d = 0; d < t->ndocs; d++) {
            rank += c2[d] > c2[d1];
        }
        n += rank < (uint32_t)top;
        c1[d1] = 0;
    }
    free(c1);
    free(c2);
    return n;
}

static void test_drift_generators(void)
{
    lkv_sim_gen g0;
    lkv_sim_gen_default(&g0);
    g0.nreq = 20000;
    g0.alpha = 1.1;
    lkv_sim_trace base, t, u;
    ASSERT_OK(lkv_sim_trace_generate(&g0, &base));
    lkv_sim_gen g = g0;
    ASSERT_OK(lkv_sim_workload("zipf", &g)); /* Stationary: the very same trace. */
    ASSERT_OK(lkv_sim_trace_generate(&g, &t));
    ASSERT_TRUE(same_trace(&base, &t));
    lkv_sim_trace_free(&t);
    ASSERT_ERR(lkv_sim_workload("weekly", &g), LKV_EINVAL);
    static const char *const names[] = {"shift", "burst", "session", "mix"};
    for (int i = 0; i < 4; i++) { /* Seeded: same seed, same trace; another seed differs. */
        g = g0;
        ASSERT_OK(lkv_sim_workload(names[i], &g));
        ASSERT_OK(lkv_sim_trace_generate(&g, &t));
        ASSERT_OK(lkv_sim_trace_generate(&g, &u));
        ASSERT_TRUE(same_trace(&t, &u));
        ASSERT_TRUE(!same_trace(&t, &base));
        lkv_sim_trace_free(&u);
        g.seed++;
        ASSERT_OK(lkv_sim_trace_generate(&g, &u));
        ASSERT_TRUE(!same_trace(&t, &u));
        for (uint64_t q = 0; q < t.nreq; q++) { /* Still k distinct documents a request. */
            ASSERT_EQ(t.req_off[q + 1] - t.req_off[q], g.k);
            for (uint64_t a = t.req_off[q]; a < t.req_off[q + 1]; a++) {
                for (uint64_t b = a + 1; b < t.req_off[q + 1]; b++) {
                    ASSERT_TRUE(t.docs[a] != t.docs[b]);
                }
            }
        }
        lkv_sim_trace_free(&u);
        lkv_sim_trace_free(&t);
    }
    /* Shift: the top 20 of the first 1,000 requests mostly left the top 20 by requests
     * 15,000-16,000 (15 shifts of a quarter of the hot 100); stationary keeps most. */
    g = g0;
    ASSERT_OK(lkv_sim_workload("shift", &g));
    ASSERT_OK(lkv_sim_trace_generate(&g, &t));
    int ov_shift = top_overlap(&t, 0, 1000, 15000, 16000, 20);
    int ov_base = top_overlap(&base, 0, 1000, 15000, 16000, 20);
    ASSERT_TRUE(ov_base >= 15);
    ASSERT_TRUE(ov_shift <= 8);
    lkv_sim_trace_free(&t);
    /* Burst: during the first 250 requests a document outside the top 100 (identity ranking
     * at the start) is the most used, with about rank 1's share; after it, document 0. */
    g = g0;
    ASSERT_OK(lkv_sim_workload("burst", &g));
    ASSERT_OK(lkv_sim_trace_generate(&g, &t));
    uint32_t *c = lkv_xcalloc(t.ndocs, sizeof(uint32_t));
    for (uint64_t i = t.req_off[0]; i < t.req_off[250]; i++) {
        c[t.docs[i]]++;
    }
    uint32_t top = 0;
    for (uint32_t d = 0; d < t.ndocs; d++) {
        top = c[d] > c[top] ? d : top;
    }
    ASSERT_TRUE(top >= 100);
    ASSERT_TRUE(c[top] > 100); /* Rank 1 of Zipf(1.1) over 10,000: ~0.15 a draw, 5 draws. */
    memset(c, 0, t.ndocs * sizeof(uint32_t));
    for (uint64_t i = t.req_off[250]; i < t.req_off[500]; i++) {
        c[t.docs[i]]++;
    }
    ASSERT_TRUE(c[top] < 10);
    free(c);
    lkv_sim_trace_free(&t);
    /* Sessions over a uniform pool: a request shares documents with one of the previous 64
     * requests far more often than chance (~0.04%). */
    for (int sess = 0; sess < 2; sess++) {
        g = g0;
        g.alpha = 0;
        if (sess) {
            ASSERT_OK(lkv_sim_workload("session", &g));
        }
        ASSERT_OK(lkv_sim_trace_generate(&g, &t));
        uint64_t shared = 0;
        for (uint64_t q = 64; q < t.nreq; q++) {
            int any = 0;
            for (uint64_t a = t.req_off[q]; a < t.req_off[q + 1] && !any; a++) {
                for (uint64_t b = t.req_off[q - 64]; b < t.req_off[q] && !any; b++) {
                    any = t.docs[a] == t.docs[b];
                }
            }
            shared += (uint64_t)any;
        }
        double frac = (double)shared / (double)(t.nreq - 64);
        ASSERT_TRUE(sess ? frac > 0.4 : frac < 0.2);
        lkv_sim_trace_free(&t);
    }
    lkv_sim_trace_free(&base);
}

static double replay(const char *text, int policy, uint64_t budget, lkv_sim_result *r)
{
    char path[] = "/tmp/lkv_trace_XXXXXX";
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs(text, f);
    fclose(f);
    lkv_sim_trace t;
    char err[256];
    ASSERT_OK(lkv_sim_trace_load(path, 32, &t, err, sizeof(err)));
    unlink(path);
    run_cfg(&t, LKV_SIM_AGNOSTIC, policy, budget, 0, r);
    lkv_sim_trace_free(&t);
    return (double)r->doc_hits;
}

static void test_residency_trace(void)
{
    /* Parsing: events keep their position and arguments; bad directives name their line. */
    char path[] = "/tmp/lkv_trace_XXXXXX";
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "!hold sys  # before request 0\n"
               "sys q1\n"
               "!class q1 7\n"
               "!prio q2 -1\n"
               "  !ttl q1 3\n"
               "q1 q2\n"
               "!evict-class 7\n");
    fclose(f);
    lkv_sim_trace t;
    char err[256];
    ASSERT_OK(lkv_sim_trace_load(path, 32, &t, err, sizeof(err)));
    ASSERT_EQ(t.nreq, 2);
    ASSERT_EQ(t.nev, 5);
    ASSERT_EQ(t.ev[0].op, LKV_SIM_EV_HOLD);
    ASSERT_EQ(t.ev[0].before, 0);
    ASSERT_EQ(t.ev[0].doc, t.docs[0]);
    ASSERT_EQ(t.ev[1].op, LKV_SIM_EV_CLASS);
    ASSERT_EQ(t.ev[1].before, 1);
    ASSERT_EQ(t.ev[1].doc, t.docs[1]);
    ASSERT_EQ(t.ev[1].arg, 7);
    ASSERT_EQ(t.ev[2].op, LKV_SIM_EV_PRIO);
    ASSERT_EQ(t.ev[2].arg, -1);
    ASSERT_EQ(t.ev[2].doc, t.docs[3]);
    ASSERT_EQ(t.ev[3].op, LKV_SIM_EV_TTL);
    ASSERT_EQ(t.ev[4].op, LKV_SIM_EV_EVICT_CLASS);
    ASSERT_EQ(t.ev[4].before, 2);
    lkv_sim_trace_free(&t);
    static const char *const bad[] = {"a\n!hold\n",    "a\n!prio a 2\n",  "a\n!pin a\n",
                                      "a\n!ttl a 0\n", "a\n!class a x\n", "a\n!hold a b\n"};
    for (int i = 0; i < 6; i++) {
        f = fopen(path, "w");
        fputs(bad[i], f);
        fclose(f);
        ASSERT_ERR(lkv_sim_trace_load(path, 32, &t, err, sizeof(err)), LKV_EINVAL);
        ASSERT_TRUE(strstr(err, ":2:") != NULL);
    }
    unlink(path);

    /* Replay, budget one 32-token document (4 MiB), one document a request. */
    lkv_sim_result r;
    for (int k = 0; k < LKV_POLICY__COUNT; k++) {
        int filter =
            k == LKV_POLICY_TINYLFU || k == LKV_POLICY_TLFU_GDSF || k == LKV_POLICY_ADAPTIVE;
        /* Without a hold A is displaced by B (filters refuse B, as warm as A: A hits twice);
         * with it, B can never get room and A hits both times under every kind. */
        ASSERT_EQ(replay("A\nB\nA\nB\nA\n", k, DOC_MIB, &r), filter ? 2 : 0);
        ASSERT_EQ(replay("!hold A\nA\nB\nA\nB\nA\n", k, DOC_MIB, &r), 2);
        /* Released before the second B: it gets room at once (B then hits) unless a filter
         * still finds it no warmer than A (B recorded 2 times, A 2: refused). */
        ASSERT_EQ(replay("!hold A\nA\nB\nA\n!release A\nB\nB\n", k, DOC_MIB, &r), filter ? 1 : 2);
        /* Class eviction drops A between its uses; TTL 1 expires it before the next request. */
        ASSERT_EQ(replay("!class A 5\nA\n!evict-class 5\nA\n", k, 2 * DOC_MIB, &r), 0);
        ASSERT_EQ(r.bulk, 1);
        ASSERT_EQ(replay("!ttl A 1\nA\nA\nA\n", k, 2 * DOC_MIB, &r), 0);
        ASSERT_EQ(r.bulk, 2);
        ASSERT_EQ(replay("!ttl A 2\nA\nA\nA\n", k, 2 * DOC_MIB, &r), 1);
        /* Hold a class: the held document survives everything; evict-class skips it. */
        ASSERT_EQ(replay("!hold-class 3\n!class A 3\nA\nB\nC\n!evict-class 3\nA\n", k, DOC_MIB, &r),
                  1);
        ASSERT_EQ(r.bulk, 0);
        /* Priority: room for 2; A low, B normal: C takes A's room (every kind, filters
         * included: a low entry gives room unopposed), so B hits and A misses. */
        ASSERT_EQ(replay("!prio A -1\nA\nB\nC\nB\nA\n", k, 2 * DOC_MIB, &r), 1);
        ASSERT_EQ(replay("A\nB\nC\nB\nA\n", k, 2 * DOC_MIB, &r), filter ? 2 : 1);
    }
}

static void test_bad_config(void)
{
    lkv_sim_gen g;
    lkv_sim_gen_default(&g);
    lkv_sim_trace t;
    g.k = g.ndocs + 1;
    ASSERT_ERR(lkv_sim_trace_generate(&g, &t), LKV_EINVAL);
    small_trace(1.0, 50, 10, 1, &t);
    lkv_sim_cfg c;
    lkv_sim_cfg_default(&c);
    c.inflight = 0;
    lkv_sim_result r;
    ASSERT_ERR(lkv_sim_run(&t, &c, &r), LKV_EINVAL);
    lkv_sim_trace_free(&t);
}

int main(void)
{
    const char *env = getenv("LKV_TEST_SEED");
    g_seed = env != NULL ? strtoull(env, NULL, 10) : 7;
    fprintf(stderr, "seed %llu (LKV_TEST_SEED overrides)\n", (unsigned long long)g_seed);
    LKV_RUN(test_lru_monotone_in_budget);
    LKV_RUN(test_agnostic_beats_exact_under_lru);
    LKV_RUN(test_analytic_ratio);
    LKV_RUN(test_hand_made);
    LKV_RUN(test_trace_file);
    LKV_RUN(test_trace_write);
    LKV_RUN(test_bad_config);
    LKV_RUN(test_belady_hand_made);
    LKV_RUN(test_belady_bounds_policies);
    LKV_RUN(test_drift_generators);
    LKV_RUN(test_residency_trace);
    return 0;
}
