/*
 * test_hitrate.c: invariants of the hit-rate simulator (bench/hitrate) on small configurations,
 * run in CI (a few seconds). Each invariant is a property the models must have whatever the
 * workload, so a regression in the policy or in a model shows up as a violation:
 *   1. equal-size documents, LRU: a larger budget never hits less (LRU's inclusion property);
 *   2. LRU: position-agnostic never hits less than position-aware exact offset (the agnostic
 *      cache is the exact one with its offsets merged);
 *   3. the paper's analytic capacity ratio matches a static top-C simulation within 1%;
 *   4. hand-made traces give the hits worked out by hand for every model;
 *   5. trace files parse as the README documents and bad lines are refused.
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
    LKV_RUN(test_bad_config);
    return 0;
}
