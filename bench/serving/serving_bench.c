/*
 * serving_bench.c: the serving benchmark of issue 18: TTFT and throughput of RAG traffic under
 * four cache modes in ONE worker process (one model, one backend, one set of requests), the
 * mode chosen per run point by the --modes flag:
 *
 *   none    every document and the question prefilled in full (no cache);
 *   prefix  vLLM-style automatic prefix caching: 16-token blocks named by a hash chain from
 *           position 0 in a worker-local pool of worker pages (HBM on a GPU) under the same
 *           budget and the daemon's policy code (client/worker/lkv_prefix.h); only the longest
 *           cached prefix is reused, the rest recomputed;
 *   block   Block-Attention: documents in lazykvd, each hit copied and re-rotated to its offset
 *           (lkv_materialise) into pages Reserved in the daemon's budget while the request runs
 *           (opts.copy_budget); a copy that finds no room is recomputed (a miss);
 *   lazy    lazykv: documents attended in place in lazykvd's hot tier (misses computed in place
 *           into reserved pages and committed).
 * Same budget in every mode: lazykvd's region of the profile (block, lazy) or the prefix pool
 * (prefix); each point starts from an empty cache (a fresh lazykvd, a fresh pool).
 *
 * Workloads: "paper" (a pool of --pool documents of --doc-tokens tokens, --docs a request,
 * distinct, random order, drawn Zipf(alpha) for each --alpha; bench/hitrate's generator, so the
 * same trace the hit-rate study simulates), "short" (lognormal lengths, median --short-median,
 * sigma --short-sigma, --short-docs a request) and "trace:FILE" (bench/hitrate's trace format).
 * Token ids are random (timing does not depend on them); each request has a --question-token
 * question and generates --out-tokens tokens greedily (no stop token).
 *
 * Per point (workload, alpha, budget, mode, policy): --warmup requests run and not counted, then
 * --requests counted ones at one request at a time (TTFT p50/p99, the per-phase breakdown, hit
 * rates, throughput at B = 1), then --tput-requests more through the serving engine for each
 * batch limit of --batches above 1 (all submitted at t = 0, max_batch B: requests/s and output
 * tokens/s; with --prefill-chunk N the engine prefills in chunks of N tokens at B > 1, a step's
 * token budget --prefill-tokens, default N + B), continuing the same trace on the same warm
 * cache. The simulator's prediction for the
 * same trace and budget (bench/hitrate lkv_sim, model agnostic / copy / prefix) is printed next
 * to the measured hit rate. Correctness (--check N): the first N requests in every mode,
 * each run twice (cold, then warm), greedy tokens compared with the no-cache run; lazy warm ==
 * lazy cold compared bitwise (tokens and logits).
 *
 * Output: a table on stdout, OUT/serving.json (every number), OUT/serving.tsv (plot input).
 */
#include <math.h>
#include <strings.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lkv_backend_cpu.h"
#include "lkv_client.h"
#include "lkv_engine.h"
#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_policy.h"
#include "lkv_prefix.h"
#include "lkv_request.h"
#include "lkv_sim.h"
#include "lkv_spawn.h"
#include "lkv_worker.h"
#ifdef LKV_WORKER_HAVE_CUDA
#include "lkv_backend_cuda.h"
#endif

#ifndef LKV_DEFAULT_MODEL_DIR
#define LKV_DEFAULT_MODEL_DIR "tests/data/models"
#endif
#ifndef LKV_DAEMON_BIN
#define LKV_DAEMON_BIN "lazykvd"
#endif

enum { M_NONE = 0, M_PREFIX, M_BLOCK, M_LAZY, M__COUNT };
static const char *const mode_names[M__COUNT] = {"none", "prefix", "block", "lazy"};

#define MAXL 8

typedef struct cfg {
    const char *backend, *model, *synth, *daemon_bin, *out, *profile, *hot_backend;
    const char *workloads[MAXL];
    int n_workloads;
    double alphas[MAXL];
    int n_alphas;
    uint64_t budgets[MAXL];
    int n_budgets;
    int modes[M__COUNT];
    int lru;    /* 1: LRU rows for prefix and block too (the paper's setting). */
    int policy; /* The daemon's default (adaptive). */
    uint32_t pool, doc_tokens, k, short_median, short_k, trace_tokens;
    double short_sigma;
    int question, out_tokens, warmup, requests, tput_requests, check;
    int ttft_tokens; /* Tokens generated in the TTFT phase (TTFT needs 1); B = 1 throughput is
                        then measured by the engine at max_batch 1 with out_tokens. */
    const char *cold_bytes;    /* lazykvd's cold tier (default 4KiB: nothing fits, an evicted
                                  document is gone; this measures the hot tier). */
    const char *hot_admission; /* lazykvd's hot_admission (always / door; default door, the
                                  daemon's default). */
    int prefill_chunk;         /* The worker's prefill_chunk (tokens; 0: whole segments) in the
                                  throughput phases at B > 1 (the TTFT phase and B = 1 prefill
                                  whole segments: one request has nothing to interleave). */
    int prefill_tokens;        /* The engine's step token budget (0: prefill_chunk + B when
                                  chunking, else one unit a step). */
    int ab_modes[M__COUNT];    /* Modes that run the chunking A/B at a point marked "ab"
                                  (--ab-modes; default none and lazy). */
    int fuse_decode;           /* --fuse-decode: the engine's decode rows ride along its
                                  prefill passes (lkv_engine_opts.fuse_decode) at B > 1. */
    double deadline_s;         /* Points not started after this many seconds are skipped. */
    const char *plan; /* --plan: the points to run (see usage), or NULL: the full product. */
    int batches[MAXL], n_batches;
    uint64_t seed;
    uint32_t local_pages;
    int dtype, quick;
} cfg;

typedef struct workload {
    char name[96];
    double alpha;      /* Zipf exponent (paper, short); -1 for a trace file. */
    lkv_sim_trace t;   /* Documents and requests (bench/hitrate). */
    int **doc;         /* [t.ndocs] token ids. */
    uint64_t next_req; /* Next request of the trace to serve. */
} workload;

typedef struct ctx {
    cfg c;
    lkv_worker *w;
    int vocab;
    uint64_t page_bytes, bytes_per_token;
    lkv_spawn d;      /* The running lazykvd, if any. */
    lkv_client_t *cl; /* Client to it (stats). */
    FILE *json;       /* OUT/serving.json. */
    FILE *tsv;        /* OUT/serving.tsv. */
    int n_points;
} ctx;

/* ---- small helpers ------------------------------------------------------------------------ */

static double now_ms(void)
{
    return lkv_worker_now_ms();
}

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A p99 is reported only from at least this many samples (issue 18); below it the table prints
 * "-" and the JSON null. */
#define P99_MIN 100

/* Percentile p (0..100) of v[0..n) (sorted in place), nearest rank. */
static double pct(double *v, int n, double p)
{
    if (n == 0) {
        return 0;
    }
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    int i = (int)ceil(p / 100.0 * n) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static uint64_t parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    uint64_t m = 1;
    if (strncasecmp(end, "k", 1) == 0) {
        m = 1ull << 10;
    } else if (strncasecmp(end, "m", 1) == 0) {
        m = 1ull << 20;
    } else if (strncasecmp(end, "g", 1) == 0) {
        m = 1ull << 30;
    }
    return (uint64_t)(v * (double)m);
}

static void fmt_bytes(uint64_t b, char *out, size_t n)
{
    if (b >= (1ull << 30) && b % (1ull << 30) == 0) {
        snprintf(out, n, "%lluGiB", (unsigned long long)(b >> 30));
    } else if (b >= (1ull << 20) && b % (1ull << 20) == 0) {
        snprintf(out, n, "%lluMiB", (unsigned long long)(b >> 20));
    } else {
        snprintf(out, n, "%lluKiB", (unsigned long long)(b >> 10));
    }
}

/* Copies made by split (freed at exit by free_splits). */
static char *split_copies[16];
static int n_split_copies;

static void free_splits(void)
{
    while (n_split_copies > 0) {
        free(split_copies[--n_split_copies]);
    }
}

/* Splits a comma list into at most MAXL parts (pointers into a copy freed by free_splits). */
static int split(const char *s, const char **out)
{
    char *c = lkv_xstrdup(s);
    if (n_split_copies == 16) {
        lkv_panic("serving_bench: too many lists");
    }
    split_copies[n_split_copies++] = c;
    int n = 0;
    for (char *tok = strtok(c, ","); tok != NULL && n < MAXL; tok = strtok(NULL, ",")) {
        out[n++] = tok;
    }
    return n;
}

/* ---- workloads ---------------------------------------------------------------------------- */

static int make_workload(ctx *x, const char *spec, double alpha, uint64_t nreq, workload *wl)
{
    const cfg *c = &x->c;
    memset(wl, 0, sizeof(*wl));
    wl->alpha = alpha;
    int rc;
    if (strncmp(spec, "trace:", 6) == 0) {
        char err[256];
        rc = lkv_sim_trace_load(spec + 6, c->trace_tokens, &wl->t, err, sizeof(err));
        if (rc != 0) {
            fprintf(stderr, "serving_bench: %s\n", err);
            return rc;
        }
        const char *base = strrchr(spec + 6, '/');
        snprintf(wl->name, sizeof(wl->name), "trace:%s", base != NULL ? base + 1 : spec + 6);
        wl->alpha = -1;
    } else {
        lkv_sim_gen g;
        lkv_sim_gen_default(&g);
        g.ndocs = c->pool;
        g.alpha = alpha;
        g.nreq = nreq;
        g.seed = c->seed;
        if (strcmp(spec, "paper") == 0) {
            g.len_kind = LKV_SIM_LEN_FIXED;
            g.len_a = c->doc_tokens;
            g.k = c->k;
        } else if (strcmp(spec, "short") == 0) {
            g.len_kind = LKV_SIM_LEN_LOGNORMAL;
            g.len_a = c->short_median;
            g.len_b = c->short_sigma;
            g.max_tokens = c->doc_tokens;
            g.k = c->short_k;
        } else {
            fprintf(stderr, "serving_bench: unknown workload '%s' (paper, short, trace:FILE)\n",
                    spec);
            return LKV_EINVAL;
        }
        rc = lkv_sim_trace_generate(&g, &wl->t);
        if (rc != 0) {
            fprintf(stderr, "serving_bench: cannot generate workload %s\n", spec);
            return rc;
        }
        snprintf(wl->name, sizeof(wl->name), "%s", spec);
    }
    /* Every document's tokens: random ids from (seed, document). */
    wl->doc = lkv_xcalloc(wl->t.ndocs, sizeof(int *));
    for (uint32_t d = 0; d < wl->t.ndocs; d++) {
        uint32_t n = wl->t.doc_tokens[d];
        wl->doc[d] = lkv_xmalloc((size_t)n * sizeof(int));
        for (uint32_t i = 0; i < n; i++) {
            uint64_t z = mix64(c->seed * 0x100000001b3ull ^ ((uint64_t)d << 32 | i));
            wl->doc[d][i] = 3 + (int)(z % (uint64_t)(x->vocab - 3));
        }
    }
    return 0;
}

static void free_workload(workload *wl)
{
    for (uint32_t d = 0; wl->doc != NULL && d < wl->t.ndocs; d++) {
        free(wl->doc[d]);
    }
    free(wl->doc);
    lkv_sim_trace_free(&wl->t);
}

/* Request r of the trace (wrapping around) as an engine request (owned arrays). */
static lkv_request *make_request(const ctx *x, const workload *wl, uint64_t r, int mode,
                                 int max_tokens)
{
    const lkv_sim_trace *t = &wl->t;
    uint64_t q = r % t->nreq;
    int nd = (int)(t->req_off[q + 1] - t->req_off[q]);
    lkv_request *req = lkv_xcalloc(1, sizeof(*req));
    snprintf(req->id, sizeof(req->id), "r%llu", (unsigned long long)r);
    req->docs = lkv_xcalloc((size_t)(nd ? nd : 1), sizeof(*req->docs));
    req->doc_tokens = lkv_xcalloc((size_t)(nd ? nd : 1), sizeof(int *));
    for (int i = 0; i < nd; i++) {
        uint32_t d = t->docs[t->req_off[q] + (uint64_t)i];
        uint32_t n = t->doc_tokens[d];
        req->doc_tokens[i] = lkv_xmalloc((size_t)n * sizeof(int));
        memcpy(req->doc_tokens[i], wl->doc[d], (size_t)n * sizeof(int));
        req->docs[i] = (lkv_rag_doc){.tokens = req->doc_tokens[i], .n_tokens = (int)n};
    }
    req->question = lkv_xmalloc((size_t)x->c.question * sizeof(int));
    for (int i = 0; i < x->c.question; i++) {
        req->question[i] =
            3 + (int)(mix64(r * 7919 + (uint64_t)i + 0x51u) % (uint64_t)(x->vocab - 3));
    }
    lkv_rag_request *g = &req->rag;
    g->n_docs = nd;
    g->docs = req->docs;
    g->question = req->question;
    g->n_question = x->c.question;
    g->max_tokens = max_tokens;
    g->stop_at_eos = 0;
    g->mode = mode == M_BLOCK    ? LKV_RAG_MATERIALISE
              : mode == M_PREFIX ? LKV_RAG_PREFIX
                                 : LKV_RAG_LAZY;
    g->no_cache = mode == M_NONE;
    return req;
}

static void free_request(lkv_request *r)
{
    lkv_request_free(r);
    free(r);
}

/* ---- the cache of a point ----------------------------------------------------------------- */

static void stop_daemon(ctx *x)
{
    lkv_client_destroy(x->cl);
    x->cl = NULL;
    if (x->d.pid > 0 || x->d.dir[0]) {
        lkv_worker_retarget(x->w, NULL);
        /* Close the worker's import of the daemon's arena before the daemon goes: a CUDA IPC
         * import keeps the allocation alive after its exporter exits, and the next daemon of a
         * 32 GiB point needs that memory (the 2026-12-02 01:26 run lost its 32 GiB block and
         * short-document points to it). No prefix pool is set up here (reset_cache). */
        int rc = lkv_worker_unmap(x->w);
        if (rc != 0) {
            fprintf(stderr, "serving_bench: cannot unmap the daemon's arena: %s\n",
                    lkv_strerror(rc));
        }
        lkv_spawn_stop(&x->d, 20000);
        lkv_spawn_cleanup(&x->d);
    }
    memset(&x->d, 0, sizeof(x->d));
}

/* A fresh lazykvd whose region of the profile is budget bytes, no cold tier to speak of (an
 * evicted document is gone: this measures the hot tier), policy kind. */
static int start_daemon(ctx *x, uint64_t budget, int policy)
{
    stop_daemon(x);
    char hot[64], region[64], key[128], pol[32];
    /* The other built-in profile gets a small share beside the benchmark's region. */
    snprintf(hot, sizeof(hot), "%lluKiB", (unsigned long long)((budget >> 10) + 8192));
    snprintf(region, sizeof(region), "%lluKiB", (unsigned long long)(budget >> 10));
    snprintf(key, sizeof(key), "--profile.%s.hot_bytes", x->c.profile);
    snprintf(pol, sizeof(pol), "%s", lkv_policy_name(policy));
    const char *extra[] = {key,
                           region,
                           "--cold_bytes",
                           x->c.cold_bytes,
                           "--policy",
                           pol,
                           "--hot_backend",
                           x->c.hot_backend,
                           "--max_lease_ttl",
                           "600s",
                           "--wb_max_backlog_bytes",
                           "0",
                           "--hot_admission",
                           x->c.hot_admission,
                           NULL};
    if (lkv_spawn_start(&x->d, x->c.daemon_bin, hot, extra) != 0) {
        return LKV_EIO;
    }
    lkv_client_options co = {.default_deadline_ms = 10000};
    int rc = lkv_client_create(x->d.addr, &co, &x->cl);
    if (rc == 0) {
        rc = lkv_worker_retarget(x->w, x->d.addr);
    }
    return rc;
}

/* Bytes the daemon's hot tier holds now (0 if unknown). */
static uint64_t daemon_hot_bytes(ctx *x)
{
    if (x->cl == NULL) {
        return 0;
    }
    lkv_stat_entry *e = NULL;
    size_t n = 0;
    uint64_t v = 0;
    if (lkv_client_stats_entries(x->cl, "hot", 5000, &e, &n) == 0) {
        for (size_t i = 0; i < n; i++) {
            if (strcmp(e[i].key, "bytes_used") == 0) {
                v = (uint64_t)e[i].value;
            }
        }
    }
    free(e);
    return v;
}

static int reset_cache(ctx *x, int mode, uint64_t budget, int policy)
{
    lkv_worker_prefix_setup(x->w, 0, 0);
    if (mode == M_BLOCK || mode == M_LAZY) {
        return start_daemon(x, budget, policy);
    }
    stop_daemon(x);
    if (mode == M_PREFIX) {
        int rc = lkv_worker_prefix_setup(x->w, (uint32_t)(budget / x->page_bytes), policy);
        if (rc != 0) {
            fprintf(stderr,
                    "serving_bench: prefix pool of %llu pages does not fit in %u worker "
                    "pages (raise --local-pages)\n",
                    (unsigned long long)(budget / x->page_bytes), x->c.local_pages);
        }
        return rc;
    }
    return 0;
}

static uint64_t cache_bytes(ctx *x, int mode)
{
    if (mode == M_PREFIX) {
        lkv_prefix_stats st;
        lkv_worker_prefix_stats(x->w, &st);
        return st.bytes_used;
    }
    return mode == M_NONE ? 0 : daemon_hot_bytes(x);
}

/* ---- one point ---------------------------------------------------------------------------- */

typedef struct tput {
    int batch;
    int chunk; /* The worker's prefill_chunk in this phase (0: whole segments). */
    int ab;    /* 1: the A/B run (prefill_chunk 0) beside the point's chunked run at this B. */
    int n, failed;
    double wall_ms, rps, tok_s, ttft_p50, ttft_p99;
    uint64_t worker_kv_bytes; /* High-water of pages granted to in-flight requests. */
    int max_batch_seen;
    double hit;             /* Hit rate of its requests, % of document tokens. */
    uint64_t reserve_busy;  /* Reserves answered "being computed" (another request in
                               flight computes the document: computed twice). */
    uint64_t prefill_units; /* Engine prefill units (chunks) and decode steps. */
    uint64_t decode_steps;
    uint64_t max_step_tokens; /* Largest step (decode rows + prefilled tokens). */
    uint64_t fused_steps;     /* Decode steps that rode along a prefill pass. */
} tput;

typedef struct point {
    const char *workload;
    double alpha;
    uint64_t budget;
    int mode, policy;
    int warmup; /* Warm-up requests run before the counted ones. */
    int n, failed;
    double ttft_p50, ttft_p99, ttft_mean, spread; /* spread: |p50 of halves| difference. */
    int n_all_hit;                                /* Counted requests whose documents all hit. */
    double all_hit_p50;                           /* Their TTFT p50. */
    double tpot_mean, wall_ms;
    double rps1, tok_s1;
    uint64_t doc_tokens, hit_tokens, docs, hit_docs;
    int copies, copies_refused;
    double sim_hit;           /* The simulator's block hit rate for this trace and budget. */
    uint64_t cache_bytes_max; /* Daemon hot tier or prefix pool. */
    /* Breakdown: means over the counted requests, ms. */
    double lookup, attach, reserve, miss, copy, question, decode, other;
    tput tp[MAXL];
    int n_tp;
    int b1_from_ttft; /* 1: the TTFT phase generated out_tokens, so it is the B = 1 run. */
} point;

static double sim_prediction(const ctx *x, const workload *wl, int mode, uint64_t budget,
                             int policy, int n_req, int warmup)
{
    if (mode == M_NONE) {
        return 0;
    }
    lkv_sim_trace t = wl->t;
    uint64_t upto = wl->next_req + (uint64_t)warmup + (uint64_t)n_req;
    if (upto > t.nreq) {
        return -1;
    }
    lkv_sim_cfg sc;
    lkv_sim_cfg_default(&sc);
    sc.model = mode == M_PREFIX  ? LKV_SIM_PREFIX
               : mode == M_BLOCK ? LKV_SIM_COPY
                                 : LKV_SIM_AGNOSTIC;
    sc.policy = policy;
    sc.budget = budget;
    sc.bytes_per_token = x->bytes_per_token;
    sc.question_tokens = (uint32_t)x->c.question;
    sc.warmup = wl->next_req + (uint64_t)warmup;
    t.nreq = upto;
    lkv_sim_result r;
    if (lkv_sim_run(&t, &sc, &r) != 0 || r.tokens == 0) {
        return -1;
    }
    return 100.0 * (double)r.hit_tokens / (double)r.tokens;
}

static int run_ttft(ctx *x, workload *wl, point *p, int n, int warmup)
{
    const cfg *c = &x->c;
    double *tt = lkv_xcalloc((size_t)n + 1, sizeof(double));
    double *h1 = lkv_xcalloc((size_t)n + 1, sizeof(double));
    double *h2 = lkv_xcalloc((size_t)n + 1, sizeof(double));
    double *ah = lkv_xcalloc((size_t)n + 1, sizeof(double));
    int n1 = 0, n2 = 0, k = 0;
    uint64_t out_tokens = 0;
    double t_start = 0;
    for (int i = 0; i < warmup + n; i++) {
        int counted = i >= warmup;
        if (i == warmup) {
            t_start = now_ms();
        }
        lkv_request *rq = make_request(x, wl, wl->next_req++, p->mode, c->ttft_tokens);
        lkv_rag_result res;
        int rc = lkv_worker_run(x->w, &rq->rag, &res);
        if (rc != 0) {
            fprintf(stderr, "serving_bench: %s %s request %s failed: %s\n", wl->name,
                    mode_names[p->mode], rq->id, res.error);
            p->failed++;
        } else if (counted) {
            tt[k++] = res.ttft_ms;
            if (res.miss_docs == 0 && res.hit_docs > 0) {
                ah[p->n_all_hit++] = res.ttft_ms;
            }
            if (k % 2) {
                h1[n1++] = res.ttft_ms;
            } else {
                h2[n2++] = res.ttft_ms;
            }
            p->ttft_mean += res.ttft_ms;
            p->tpot_mean += res.tpot_ms;
            out_tokens += (uint64_t)res.n_out;
            p->doc_tokens += res.hit_tokens + res.miss_tokens;
            p->hit_tokens += res.hit_tokens;
            p->docs += (uint64_t)(res.hit_docs + res.miss_docs);
            p->hit_docs += (uint64_t)res.hit_docs;
            p->copies += res.copies;
            p->copies_refused += res.copies_refused;
            p->lookup += res.lookup_ms;
            p->attach += res.attach_ms;
            p->reserve += res.reserve_ms;
            p->miss += res.miss_ms;
            p->copy += res.copy_ms;
            p->question += res.question_ms;
            p->decode += res.tpot_ms * (res.n_out > 1 ? res.n_out - 1 : 0);
            double known = res.lookup_ms + res.attach_ms + res.reserve_ms + res.miss_ms +
                           res.copy_ms + res.question_ms;
            p->other += res.ttft_ms - known;
            uint64_t cb = cache_bytes(x, p->mode);
            p->cache_bytes_max = cb > p->cache_bytes_max ? cb : p->cache_bytes_max;
        }
        lkv_rag_result_free(&res);
        free_request(rq);
    }
    p->wall_ms = now_ms() - t_start;
    p->n = k;
    if (k > 0) {
        p->ttft_mean /= k;
        p->tpot_mean /= k;
        p->lookup /= k;
        p->attach /= k;
        p->reserve /= k;
        p->miss /= k;
        p->copy /= k;
        p->question /= k;
        p->decode /= k;
        p->other /= k;
        p->ttft_p50 = pct(tt, k, 50);
        p->ttft_p99 = pct(tt, k, 99);
        p->spread = fabs(pct(h1, n1, 50) - pct(h2, n2, 50));
        p->all_hit_p50 = pct(ah, p->n_all_hit, 50);
        p->rps1 = 1000.0 * k / p->wall_ms;
        p->tok_s1 = 1000.0 * (double)out_tokens / p->wall_ms;
    }
    free(tt);
    free(h1);
    free(h2);
    free(ah);
    return 0;
}

/* One throughput phase at batch limit batch, n requests, prefill chunks of chunk tokens (0:
 * whole segments). */
static void run_tput(ctx *x, workload *wl, point *p, int batch, int n, int chunk, tput *tp)
{
    const cfg *c = &x->c;
    memset(tp, 0, sizeof(*tp));
    tp->batch = batch;
    tp->chunk = chunk;
    uint32_t kv_pages = c->local_pages;
    if (p->mode == M_PREFIX) {
        kv_pages -= (uint32_t)(p->budget / x->page_bytes);
    }
    lkv_worker_set_prefill_chunk(x->w, chunk);
    lkv_engine_opts eo = {.max_batch = batch,
                          .kv_pages = kv_pages,
                          .max_queue = n + 1,
                          .prefill_units = 1,
                          .fuse_decode = batch > 1 && c->fuse_decode,
                          .prefill_tokens = chunk <= 0              ? 0
                                            : c->prefill_tokens > 0 ? c->prefill_tokens
                                                                    : chunk + batch};
    lkv_engine *e;
    if (lkv_engine_create(x->w, &eo, &e) != 0) {
        tp->failed = n;
        return;
    }
    lkv_engine_req **rs = lkv_xcalloc((size_t)n, sizeof(*rs));
    double *tt = lkv_xcalloc((size_t)n, sizeof(double));
    lkv_worker_stats ws0;
    lkv_worker_stats_get(x->w, &ws0);
    uint64_t hit_tok = 0, doc_tok = 0;
    double t0 = now_ms();
    for (int i = 0; i < n; i++) {
        char msg[256];
        lkv_request *rq = make_request(x, wl, wl->next_req++, p->mode, c->out_tokens);
        if (lkv_engine_submit(e, rq, 0, NULL, NULL, &rs[i], msg, sizeof(msg)) != 0) {
            fprintf(stderr, "serving_bench: submit refused: %s\n", msg);
            rs[i] = NULL;
        }
    }
    uint64_t out_tokens = 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (rs[i] == NULL) {
            tp->failed++;
            continue;
        }
        lkv_engine_event ev;
        while (lkv_engine_wait(rs[i], &ev, -1) == 1 && ev.kind != LKV_ENGINE_END) {
        }
        lkv_engine_result er;
        lkv_engine_result_get(rs[i], &er);
        if (ev.rc != 0) {
            fprintf(stderr, "serving_bench: %s B=%d request failed: %s\n", mode_names[p->mode],
                    batch, er.res->error);
            tp->failed++;
        } else {
            out_tokens += (uint64_t)er.res->n_out;
            tt[k++] = er.res->ttft_ms;
            hit_tok += er.res->hit_tokens;
            doc_tok += er.res->hit_tokens + er.res->miss_tokens;
        }
    }
    tp->wall_ms = now_ms() - t0;
    lkv_engine_stats st;
    lkv_engine_stats_get(e, &st);
    tp->worker_kv_bytes = (uint64_t)st.max_pages_used * x->page_bytes;
    tp->max_batch_seen = st.max_batch_seen;
    tp->prefill_units = st.prefill_units;
    tp->decode_steps = st.decode_steps;
    tp->max_step_tokens = st.max_step_tokens;
    tp->fused_steps = st.fused_steps;
    lkv_worker_stats ws1;
    lkv_worker_stats_get(x->w, &ws1);
    tp->reserve_busy = ws1.reserve_busy - ws0.reserve_busy;
    tp->hit = doc_tok ? 100.0 * (double)hit_tok / (double)doc_tok : 0;
    for (int i = 0; i < n; i++) {
        lkv_engine_release(rs[i]);
    }
    lkv_engine_destroy(e);
    lkv_worker_set_prefill_chunk(x->w, 0);
    tp->n = k;
    tp->rps = 1000.0 * k / tp->wall_ms;
    tp->tok_s = 1000.0 * (double)out_tokens / tp->wall_ms;
    tp->ttft_p50 = pct(tt, k, 50);
    tp->ttft_p99 = pct(tt, k, 99);
    free(tt);
    free(rs);
}

static void print_point(ctx *x, const point *p)
{
    char b[32];
    fmt_bytes(p->budget, b, sizeof(b));
    double hit = p->doc_tokens ? 100.0 * (double)p->hit_tokens / (double)p->doc_tokens : 0;
    char p99[32], p99j[32];
    if (p->n >= P99_MIN) {
        snprintf(p99, sizeof(p99), "%9.1f", p->ttft_p99);
        snprintf(p99j, sizeof(p99j), "%.3f", p->ttft_p99);
    } else {
        snprintf(p99, sizeof(p99), "%9s", "-");
        snprintf(p99j, sizeof(p99j), "null");
    }
    printf("%-10s %5.1f %6s %-6s %-8s %4d %9.1f %s %7.1f %6.2f %6.1f %6.1f %5d", p->workload,
           p->alpha, b, mode_names[p->mode], lkv_policy_name(p->policy), p->n, p->ttft_p50, p99,
           p->spread, p->b1_from_ttft ? p->rps1 : 0.0, hit, p->sim_hit, p->copies_refused);
    for (int i = 0; i < p->n_tp; i++) {
        printf("  B%d%s %.2f r/s %.0f tok/s hit %.0f%% busy %llu", p->tp[i].batch,
               p->tp[i].ab ? "(chunk 0)" : "", p->tp[i].rps, p->tp[i].tok_s, p->tp[i].hit,
               (unsigned long long)p->tp[i].reserve_busy);
    }
    printf("\n");
    fflush(stdout);
    /* JSON: one object per point. */
    FILE *j = x->json;
    fprintf(j,
            "%s\n    {\"workload\": \"%s\", \"alpha\": %g, \"budget_bytes\": %llu, \"mode\": "
            "\"%s\", \"policy\": \"%s\", \"warmup\": %d, \"requests\": %d, \"failed\": %d, "
            "\"ttft_p50_ms\": %.3f, \"ttft_p99_ms\": %s, \"ttft_mean_ms\": %.3f, "
            "\"ttft_split_half_ms\": %.3f, "
            "\"tpot_mean_ms\": %.3f, \"rps_b1\": %.4f, \"tok_s_b1\": %.2f, \"hit_rate_tokens\": "
            "%.3f, \"hit_rate_docs\": %.3f, \"sim_hit_rate_tokens\": %.3f, \"copies\": %d, "
            "\"copies_refused\": %d, \"cache_bytes_max\": %llu, \"all_hit_requests\": %d, "
            "\"all_hit_ttft_p50_ms\": %.3f,\n     \"breakdown_ms\": "
            "{\"lookup\": %.3f, \"attach\": %.3f, \"reserve\": %.3f, \"miss_prefill\": %.3f, "
            "\"copy\": %.3f, \"question_prefill\": %.3f, \"other\": %.3f, \"decode\": %.3f},\n"
            "     \"throughput\": [",
            x->n_points ? "," : "", p->workload, p->alpha, (unsigned long long)p->budget,
            mode_names[p->mode], lkv_policy_name(p->policy), p->warmup, p->n, p->failed,
            p->ttft_p50, p99j, p->ttft_mean, p->spread, p->tpot_mean, p->rps1, p->tok_s1, hit,
            p->docs ? 100.0 * (double)p->hit_docs / (double)p->docs : 0.0, p->sim_hit, p->copies,
            p->copies_refused, (unsigned long long)p->cache_bytes_max, p->n_all_hit, p->all_hit_p50,
            p->lookup, p->attach, p->reserve, p->miss, p->copy, p->question, p->other, p->decode);
    if (p->b1_from_ttft) {
        fprintf(j, "{\"batch\": 1, \"requests\": %d, \"rps\": %.4f, \"tok_s\": %.2f}", p->n,
                p->rps1, p->tok_s1);
    }
    for (int i = 0; i < p->n_tp; i++) {
        const tput *t = &p->tp[i];
        char tp99[32];
        if (t->n >= P99_MIN) {
            snprintf(tp99, sizeof(tp99), "%.2f", t->ttft_p99);
        } else {
            snprintf(tp99, sizeof(tp99), "null");
        }
        fprintf(j,
                "%s{\"batch\": %d, \"prefill_chunk\": %d, \"ab\": %d, \"requests\": %d, "
                "\"failed\": %d, \"wall_ms\": %.1f, \"rps\": "
                "%.4f, \"tok_s\": %.2f, \"ttft_p50_ms\": %.2f, \"ttft_p99_ms\": %s, "
                "\"worker_kv_bytes_max\": %llu, \"max_batch_seen\": %d, \"hit_rate_tokens\": %.3f, "
                "\"reserve_busy\": %llu, \"prefill_units\": %llu, \"decode_steps\": %llu, "
                "\"max_step_tokens\": %llu, \"fused_steps\": %llu}",
                p->b1_from_ttft || i > 0 ? ", " : "", t->batch, t->chunk, t->ab, t->n, t->failed,
                t->wall_ms, t->rps, t->tok_s, t->ttft_p50, tp99,
                (unsigned long long)t->worker_kv_bytes, t->max_batch_seen, t->hit,
                (unsigned long long)t->reserve_busy, (unsigned long long)t->prefill_units,
                (unsigned long long)t->decode_steps, (unsigned long long)t->max_step_tokens,
                (unsigned long long)t->fused_steps);
    }
    fprintf(j, "]}");
    fflush(j);
    fprintf(x->tsv, "%s\t%g\t%s\t%s\t%s\t%.3f\t%.3f\t%.4f", p->workload, p->alpha, b,
            mode_names[p->mode], lkv_policy_name(p->policy), p->ttft_p50, p->ttft_p99, p->rps1);
    for (int i = 0; i < p->n_tp; i++) {
        fprintf(x->tsv, "\t%d%s:%.4f", p->tp[i].batch, p->tp[i].ab ? "u" : "", p->tp[i].rps);
    }
    fprintf(x->tsv, "\t%.3f\n", hit);
    fflush(x->tsv);
    x->n_points++;
}

/* One point: warmup + n_req requests one at a time, then the throughput phases of batches
 * (n_tput requests each); ab: at each B > 1 the same phase again with prefill_chunk 0 right
 * after the chunked one (the chunking A/B), when --prefill-chunk is set. */
static int run_point(ctx *x, workload *wl, uint64_t budget, int mode, int policy, int n_req,
                     int warmup, int n_tput, const int *batches, int n_batches, int ab, point *p)
{
    memset(p, 0, sizeof(*p));
    p->workload = wl->name;
    p->alpha = wl->alpha;
    p->budget = budget;
    p->mode = mode;
    p->policy = policy;
    p->warmup = warmup;
    wl->next_req = 0; /* Every point serves the same requests from an empty cache. */
    p->sim_hit = sim_prediction(x, wl, mode, budget, policy, n_req, warmup);
    int rc = reset_cache(x, mode, budget, policy);
    if (rc != 0) {
        fprintf(stderr, "serving_bench: cannot set up the %s cache (%s)\n", mode_names[mode],
                lkv_strerror(rc));
        return rc;
    }
    run_ttft(x, wl, p, n_req, warmup);
    p->b1_from_ttft = x->c.ttft_tokens == x->c.out_tokens;
    for (int i = 0; i < n_batches && p->n_tp < MAXL; i++) {
        int b = batches[i];
        if ((b > 1 || !p->b1_from_ttft) && n_tput > 0) {
            int n = b == 1 && n_tput > 8 ? 8 : n_tput < b ? b : n_tput; /* >= B in flight. */
            int chunk = b > 1 ? x->c.prefill_chunk : 0;
            run_tput(x, wl, p, b, n, chunk, &p->tp[p->n_tp++]);
            if (ab && chunk > 0 && p->n_tp < MAXL) {
                run_tput(x, wl, p, b, n, 0, &p->tp[p->n_tp]);
                p->tp[p->n_tp++].ab = 1;
            }
        }
    }
    print_point(x, p);
    int failed = p->failed;
    for (int i = 0; i < p->n_tp; i++) {
        failed += p->tp[i].failed;
    }
    return failed ? LKV_EIO : 0;
}

/* ---- correctness ---------------------------------------------------------------------------- */

typedef struct run_out {
    int n_out;
    int tokens[512];
    float *logits; /* [n_out][vocab] (owned). */
    int hits;
} run_out;

static int run_one(ctx *x, const workload *wl, uint64_t r, int mode, run_out *o)
{
    lkv_request *rq = make_request(x, wl, r, mode, x->c.out_tokens);
    rq->rag.keep_logits = 1;
    lkv_rag_result res;
    int rc = lkv_worker_run(x->w, &rq->rag, &res);
    memset(o, 0, sizeof(*o));
    if (rc == 0) {
        o->n_out = res.n_out < 512 ? res.n_out : 512;
        memcpy(o->tokens, res.tokens, (size_t)o->n_out * sizeof(int));
        o->logits = lkv_xmalloc((size_t)o->n_out * x->vocab * sizeof(float));
        memcpy(o->logits, res.logits, (size_t)o->n_out * x->vocab * sizeof(float));
        o->hits = res.hit_docs;
    } else {
        fprintf(stderr, "serving_bench: check %s request %llu: %s\n", mode_names[mode],
                (unsigned long long)r, res.error);
    }
    lkv_rag_result_free(&res);
    free_request(rq);
    return rc;
}

/* Relative L2 distance of a's first-token logits from b's (the same prompt in both). */
static double rel_l2(const run_out *a, const run_out *b, int vocab)
{
    if (a->n_out < 1 || b->n_out < 1) {
        return 1;
    }
    double d = 0, n = 0;
    for (int i = 0; i < vocab; i++) {
        double e = (double)a->logits[i] - (double)b->logits[i];
        d += e * e;
        n += (double)b->logits[i] * b->logits[i];
    }
    return n > 0 ? sqrt(d / n) : sqrt(d);
}

/* Tokens of a agreeing with b up to the first difference. */
static int agree(const run_out *a, const run_out *b)
{
    int n = 0;
    while (n < a->n_out && n < b->n_out && a->tokens[n] == b->tokens[n]) {
        n++;
    }
    return n;
}

static int run_check(ctx *x, workload *wl)
{
    int K = x->c.check, fail = 0;
    if (K <= 0) {
        return 0;
    }
    uint64_t need = 0;
    for (int r = 0; r < K; r++) {
        uint64_t q = (uint64_t)r % wl->t.nreq;
        for (uint64_t i = wl->t.req_off[q]; i < wl->t.req_off[q + 1]; i++) {
            uint64_t nb = (wl->t.doc_tokens[wl->t.docs[i]] + 15) / 16;
            need += nb * x->page_bytes * 2; /* Documents and copies. */
        }
    }
    need += 64 * x->page_bytes;
    run_out *base = lkv_xcalloc((size_t)K, sizeof(run_out));
    run_out o;
    int total = 0, agree_tok[M__COUNT][2] = {{0}}, same_req[M__COUNT][2] = {{0}};
    int lazy_bitwise = 0, lazy_pairs = 0, warm_hits = 0;
    double l2[M__COUNT][2] = {{0}}; /* Largest first-token logits rel L2 vs no cache. */
    for (int r = 0; r < K; r++) {
        if (run_one(x, wl, (uint64_t)r, M_NONE, &base[r]) != 0) {
            fail = 1;
        }
        total += base[r].n_out;
    }
    for (int mode = M_PREFIX; mode < M__COUNT && !fail; mode++) {
        if (reset_cache(x, mode, need, x->c.policy) != 0) {
            fail = 1;
            break;
        }
        run_out *cold = lkv_xcalloc((size_t)K, sizeof(run_out));
        for (int pass = 0; pass < 2; pass++) { /* 0: cold, 1: warm (the same requests again). */
            for (int r = 0; r < K; r++) {
                if (run_one(x, wl, (uint64_t)r, mode, &o) != 0) {
                    fail = 1;
                    continue;
                }
                int a = agree(&o, &base[r]);
                double e = rel_l2(&o, &base[r], x->vocab);
                l2[mode][pass] = e > l2[mode][pass] ? e : l2[mode][pass];
                agree_tok[mode][pass] += a;
                same_req[mode][pass] += a == base[r].n_out && o.n_out == base[r].n_out;
                if (pass == 0) {
                    cold[r] = o;
                    continue;
                }
                warm_hits += mode == M_LAZY ? o.hits : 0;
                if (mode == M_LAZY) {
                    lazy_pairs++;
                    lazy_bitwise +=
                        o.n_out == cold[r].n_out &&
                        memcmp(o.tokens, cold[r].tokens, (size_t)o.n_out * sizeof(int)) == 0 &&
                        memcmp(o.logits, cold[r].logits,
                               (size_t)o.n_out * x->vocab * sizeof(float)) == 0;
                }
                free(o.logits);
            }
        }
        for (int r = 0; r < K; r++) {
            free(cold[r].logits);
        }
        free(cold);
    }
    printf("\ncorrectness: first %d requests of %s, greedy tokens vs no cache (cold run / warm "
           "run):\n",
           K, wl->name);
    fprintf(x->json, "  \"check\": {\"requests\": %d, \"workload\": \"%s\", \"tokens\": %d", K,
            wl->name, total);
    for (int mode = M_PREFIX; mode < M__COUNT; mode++) {
        printf("  %-6s cold: %d/%d requests identical, %.2f%% tokens agree; warm: %d/%d, %.2f%%; "
               "first-token logits rel L2 <= %.2e cold, %.2e warm\n",
               mode_names[mode], same_req[mode][0], K,
               total ? 100.0 * agree_tok[mode][0] / total : 0, same_req[mode][1], K,
               total ? 100.0 * agree_tok[mode][1] / total : 0, l2[mode][0], l2[mode][1]);
        fprintf(x->json,
                ", \"%s\": {\"cold_same_requests\": %d, \"cold_token_agreement\": %.4f, "
                "\"warm_same_requests\": %d, \"warm_token_agreement\": %.4f, "
                "\"cold_first_logits_rel_l2\": %.3e, \"warm_first_logits_rel_l2\": %.3e}",
                mode_names[mode], same_req[mode][0], total ? (double)agree_tok[mode][0] / total : 0,
                same_req[mode][1], total ? (double)agree_tok[mode][1] / total : 0, l2[mode][0],
                l2[mode][1]);
    }
    printf("  lazy warm == lazy cold (tokens and logits bitwise): %d/%d (warm run: %d document "
           "hits)\n",
           lazy_bitwise, lazy_pairs, warm_hits);
    fprintf(x->json,
            ", \"lazy_warm_eq_cold\": %d, \"lazy_pairs\": %d, \"lazy_warm_hits\": %d},\n  "
            "\"points\": [",
            lazy_bitwise, lazy_pairs, warm_hits);
    for (int r = 0; r < K; r++) {
        free(base[r].logits);
    }
    free(base);
    if (lazy_bitwise != lazy_pairs || warm_hits == 0) {
        fail = 1;
    }
    /* Prefix and lazy attend exactly what no cache computes (measured bitwise on the CPU and
     * the H200): any differing request is a bug. Block-Attention differs by the rounding of
     * its re-rotated copies: its first-token logits must stay within issue 16's 5e-2. */
    for (int pass = 0; pass < 2; pass++) {
        if (same_req[M_PREFIX][pass] != K || same_req[M_LAZY][pass] != K ||
            l2[M_BLOCK][pass] > 5e-2) {
            fprintf(stderr,
                    "serving_bench: correctness check failed (%s run): prefix %d/%d and lazy "
                    "%d/%d requests identical to no cache (want all), block logits rel L2 %.2e "
                    "(want <= 5e-2)\n",
                    pass ? "warm" : "cold", same_req[M_PREFIX][pass], K, same_req[M_LAZY][pass], K,
                    l2[M_BLOCK][pass]);
            fail = 1;
        }
    }
    return fail;
}

/* ---- main ----------------------------------------------------------------------------------- */

/* One point of the run: a workload at a budget, for some modes. */
typedef struct entry {
    char workload[400];
    double alpha;
    uint64_t budget;
    int n_req, n_tput;
    int warmup; /* Warm-up requests before each mode's counted ones. */
    int modes[M__COUNT];
    int lru; /* LRU rows for prefix and block (n_req / 3 requests, no throughput). */
    int ab;  /* The chunking A/B at each B > 1 for the --ab-modes among its modes. */
    int order[M__COUNT], n_order; /* The modes in the order given (--plan), else none..lazy. */
    int batches[MAXL], n_batches;
} entry;

/* --plan "W:ALPHA:BUDGET[:REQUESTS[:TPUT[:MODE+MODE...[:B+B...[:WARMUP]]]]];...": W is paper,
 * short or trace=FILE; a MODE "lru" adds LRU rows for prefix and block, "ab" the chunking A/B
 * (prefill_chunk 0 beside --prefill-chunk at each B > 1) for the --ab-modes among the point's
 * modes. Missing fields take the flags' values. Returns the count, or -1. */
static int parse_plan(const cfg *c, entry *out, int cap)
{
    char *dup = lkv_xstrdup(c->plan), *save = NULL;
    int n = 0;
    for (char *it = strtok_r(dup, ";", &save); it != NULL && n < cap;
         it = strtok_r(NULL, ";", &save)) {
        char *f[8] = {0}, *s2 = NULL;
        int nf = 0;
        for (char *t = strtok_r(it, ":", &s2); t != NULL && nf < 8; t = strtok_r(NULL, ":", &s2)) {
            f[nf++] = t;
        }
        if (nf < 3) {
            free(dup);
            return -1;
        }
        entry *e = &out[n++];
        memset(e, 0, sizeof(*e));
        if (strncmp(f[0], "trace=", 6) == 0) {
            snprintf(e->workload, sizeof(e->workload), "trace:%s", f[0] + 6);
        } else {
            snprintf(e->workload, sizeof(e->workload), "%s", f[0]);
        }
        e->alpha = atof(f[1]);
        e->budget = parse_bytes(f[2]);
        e->n_req = nf > 3 ? atoi(f[3]) : c->requests;
        e->n_tput = nf > 4 ? atoi(f[4]) : c->tput_requests;
        if (nf > 5) {
            char *s3 = NULL;
            for (char *t = strtok_r(f[5], "+", &s3); t != NULL; t = strtok_r(NULL, "+", &s3)) {
                for (int m = 0; m < M__COUNT; m++) {
                    if (strcmp(t, mode_names[m]) == 0 && !e->modes[m]) {
                        e->modes[m] = 1;
                        e->order[e->n_order++] = m;
                    }
                }
                e->lru |= strcmp(t, "lru") == 0;
                e->ab |= strcmp(t, "ab") == 0;
            }
        } else {
            memcpy(e->modes, c->modes, sizeof(e->modes));
            e->lru = c->lru;
        }
        if (nf > 6) {
            char *s3 = NULL;
            for (char *t = strtok_r(f[6], "+", &s3); t != NULL && e->n_batches < MAXL;
                 t = strtok_r(NULL, "+", &s3)) {
                e->batches[e->n_batches++] = atoi(t);
            }
        } else {
            memcpy(e->batches, c->batches, sizeof(e->batches));
            e->n_batches = c->n_batches;
        }
        e->warmup = nf > 7 ? atoi(f[7]) : c->warmup;
    }
    free(dup);
    return n;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: serving_bench [--quick] [--backend cpu|cuda] [--model F | --synth P:S]\n"
            "  [--workloads paper,short,trace:F] [--alpha 1.1,2.1] [--budget 1GiB,32GiB]\n"
            "  [--modes none,prefix,block,lazy] [--lru] [--pool N] [--doc-tokens N] [--docs K]\n"
            "  [--short-median N] [--short-sigma S] [--short-docs K] [--question N]\n"
            "  [--out-tokens N] [--warmup N] [--requests N] [--batches 1,8,32]\n"
            "  [--tput-requests N] [--check N] [--local-pages N] [--dtype f32|bf16]\n"
            "  [--daemon-bin F] [--hot-backend host|cuda] [--out DIR] [--seed S]\n"
            "  [--ttft-tokens N]\n"
            "  [--plan 'W:ALPHA:BUDGET[:REQ[:TPUT[:MODE+...[:B+...[:WARMUP]]]]];...']\n"
            "  [--cold-bytes B] [--hot-admission always|door] [--prefill-chunk N]\n"
            "  [--prefill-tokens N] [--ab-modes none,lazy] [--fuse-decode] [--deadline-s S]\n");
}

int main(int argc, char **argv)
{
    ctx x;
    memset(&x, 0, sizeof(x));
    cfg *c = &x.c;
    c->backend = "cpu";
    c->daemon_bin = LKV_DAEMON_BIN;
    c->out = "bench/out";
    c->hot_backend = "host";
    c->cold_bytes = "4KiB";
    c->hot_admission = "door";
    c->pool = 100;
    c->doc_tokens = 2048;
    c->k = 5;
    c->short_median = 256;
    c->short_sigma = 0.6;
    c->short_k = 6;
    c->trace_tokens = 2048;
    c->question = 64;
    c->out_tokens = 32;
    c->warmup = 20;
    c->requests = 100;
    c->tput_requests = 64;
    c->check = 2;
    c->seed = 1;
    c->dtype = -1;
    c->policy = LKV_POLICY_ADAPTIVE;
    const char *workloads = "paper,short", *alphas = "1.1,2.1", *budgets = "1GiB,32GiB",
               *modes = "none,prefix,block,lazy", *batches = "1,8,32", *ab_modes = "none,lazy";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            /* QUICK: the headline point only, few requests (flags given still override). */
            workloads = "paper";
            alphas = "2.1";
            budgets = "1GiB";
            batches = "8";
            c->warmup = 2;
            c->requests = 6;
            c->tput_requests = 8;
            c->ttft_tokens = 1;
            c->check = 1;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && v != NULL && ++i)
        if (strcmp(a, "--quick") == 0) {
            c->quick = 1;
        } else if (strcmp(a, "--lru") == 0) {
            c->lru = 1;
        } else if (ARG("--backend")) {
            c->backend = v;
        } else if (ARG("--model")) {
            c->model = v;
        } else if (ARG("--synth")) {
            c->synth = v;
        } else if (ARG("--workloads")) {
            workloads = v;
        } else if (ARG("--alpha")) {
            alphas = v;
        } else if (ARG("--budget")) {
            budgets = v;
        } else if (ARG("--modes")) {
            modes = v;
        } else if (ARG("--batches")) {
            batches = v;
        } else if (ARG("--pool")) {
            c->pool = (uint32_t)atoi(v);
        } else if (ARG("--doc-tokens")) {
            c->doc_tokens = c->trace_tokens = (uint32_t)atoi(v);
        } else if (ARG("--docs")) {
            c->k = (uint32_t)atoi(v);
        } else if (ARG("--short-median")) {
            c->short_median = (uint32_t)atoi(v);
        } else if (ARG("--short-sigma")) {
            c->short_sigma = atof(v);
        } else if (ARG("--short-docs")) {
            c->short_k = (uint32_t)atoi(v);
        } else if (ARG("--question")) {
            c->question = atoi(v);
        } else if (ARG("--out-tokens")) {
            c->out_tokens = atoi(v);
        } else if (ARG("--warmup")) {
            c->warmup = atoi(v);
        } else if (ARG("--requests")) {
            c->requests = atoi(v);
        } else if (ARG("--tput-requests")) {
            c->tput_requests = atoi(v);
        } else if (ARG("--check")) {
            c->check = atoi(v);
        } else if (ARG("--local-pages")) {
            c->local_pages = (uint32_t)strtoul(v, NULL, 10);
        } else if (ARG("--dtype")) {
            c->dtype = strcmp(v, "bf16") == 0 ? LKV_DTYPE_BF16 : LKV_DTYPE_F32;
        } else if (ARG("--daemon-bin")) {
            c->daemon_bin = v;
        } else if (ARG("--hot-backend")) {
            c->hot_backend = v;
        } else if (ARG("--out")) {
            c->out = v;
        } else if (ARG("--ttft-tokens")) {
            c->ttft_tokens = atoi(v);
        } else if (ARG("--cold-bytes")) {
            c->cold_bytes = v;
        } else if (ARG("--hot-admission")) {
            c->hot_admission = v;
        } else if (ARG("--prefill-chunk")) {
            c->prefill_chunk = atoi(v);
        } else if (ARG("--prefill-tokens")) {
            c->prefill_tokens = atoi(v);
        } else if (ARG("--deadline-s")) {
            c->deadline_s = atof(v);
        } else if (strcmp(a, "--fuse-decode") == 0) {
            c->fuse_decode = 1;
        } else if (ARG("--ab-modes")) {
            ab_modes = v;
        } else if (ARG("--plan")) {
            c->plan = v;
        } else if (ARG("--seed")) {
            c->seed = strtoull(v, NULL, 10);
        } else {
            usage();
            return 2;
        }
#undef ARG
    }
    c->n_workloads = split(workloads, c->workloads);
    const char *parts[MAXL];
    c->n_alphas = split(alphas, parts);
    for (int i = 0; i < c->n_alphas; i++) {
        c->alphas[i] = atof(parts[i]);
    }
    c->n_budgets = split(budgets, parts);
    for (int i = 0; i < c->n_budgets; i++) {
        c->budgets[i] = parse_bytes(parts[i]);
    }
    int nm = split(modes, parts);
    for (int i = 0; i < nm; i++) {
        for (int m = 0; m < M__COUNT; m++) {
            c->modes[m] |= strcmp(parts[i], mode_names[m]) == 0;
        }
    }
    nm = split(ab_modes, parts);
    for (int i = 0; i < nm; i++) {
        for (int m = 0; m < M__COUNT; m++) {
            c->ab_modes[m] |= strcmp(parts[i], mode_names[m]) == 0;
        }
    }
    c->n_batches = split(batches, parts);
    for (int i = 0; i < c->n_batches; i++) {
        c->batches[i] = atoi(parts[i]);
    }
    if (c->ttft_tokens <= 0 || c->ttft_tokens > c->out_tokens) {
        c->ttft_tokens = c->out_tokens;
    }
    int gpu = strcmp(c->backend, "cuda") == 0;
    if (c->model == NULL && c->synth == NULL) {
        c->model = LKV_DEFAULT_MODEL_DIR "/stories260K.bin";
    }
    c->profile = c->synth != NULL ? "llama-3.1-8b" : "stories260k";
    if (c->dtype < 0) {
        c->dtype = c->synth != NULL ? LKV_DTYPE_BF16 : LKV_DTYPE_F32;
    }
    const lkv_backend *be = lkv_backend_cpu();
#ifdef LKV_WORKER_HAVE_CUDA
    const lkv_backend *cb = NULL;
    if (gpu) {
        if (lkv_backend_cuda_create(LKV_CUDA_WEIGHTS_BF16, &cb) != 0) {
            fprintf(stderr, "serving_bench: no usable GPU for --backend cuda\n");
            return 1;
        }
        be = cb;
    }
#else
    if (gpu) {
        fprintf(stderr, "serving_bench: built without CUDA\n");
        return 2;
    }
#endif
    /* Worker pages: the prefix pool of the largest budget plus the in-flight KV of the largest
     * batch (every document a miss), unless given. */
    /* Block bytes (the profile layout): computed once the model is loaded. */
    lkv_worker_opts wo = {.model_path = c->synth != NULL ? NULL : c->model,
                          .synth = c->synth,
                          .profile = c->profile,
                          .dtype = c->dtype,
                          .block_tokens = 16,
                          .backend = be,
                          .deadline_ms = 60000,
                          .lease_ttl_ms = 600000,
                          .copy_budget = 1,
                          .no_put_when_full = 1,
                          .sync_phases = 1,
                          .local_pages = 1};
    /* A first worker to learn the layout is cheap for the tiny model only; compute it here. */
    uint64_t max_doc = c->doc_tokens;
    {
        lkv_worker *probe;
        char err[512];
        if (!gpu) {
            if (lkv_worker_create(&wo, &probe, err, sizeof(err)) != 0) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
            x.page_bytes = lkv_worker_page_bytes(probe);
            lkv_worker_destroy(probe);
        } else {
            x.page_bytes = 16ull * 32 * 8 * 128 * 2 * 2; /* llama-3.1-8b bf16: 2 MiB. */
        }
    }
    x.bytes_per_token = x.page_bytes / 16;
    if (c->local_pages == 0) {
        uint64_t maxb = 0;
        int maxbatch = 1;
        for (int i = 0; i < c->n_budgets; i++) {
            maxb = c->budgets[i] > maxb ? c->budgets[i] : maxb;
        }
        for (int i = 0; i < c->n_batches; i++) {
            maxbatch = c->batches[i] > maxbatch ? c->batches[i] : maxbatch;
        }
        uint64_t per_req =
            (uint64_t)(c->k > c->short_k ? c->k : c->short_k) * ((max_doc + 15) / 16) * 2 +
            (uint64_t)(c->question + c->out_tokens + 15) / 16 + 2;
        c->local_pages = (uint32_t)(maxb / x.page_bytes + per_req * (uint64_t)maxbatch + 64);
    }
    wo.local_pages = c->local_pages;
    char err[512];
    double t_load = now_ms(), t_run = t_load;
    if (lkv_worker_create(&wo, &x.w, err, sizeof(err)) != 0) {
        fprintf(stderr, "serving_bench: %s\n", err);
        return 1;
    }
    x.vocab = lkv_worker_model(x.w)->cfg.vocab_size;
    x.page_bytes = lkv_worker_page_bytes(x.w);
    x.bytes_per_token = x.page_bytes / 16;
    char pb[32];
    fmt_bytes(x.page_bytes, pb, sizeof(pb));
    printf("serving_bench: backend %s, model %s, %s KV blocks of 16 tokens, %u worker pages "
           "(%.1f GiB), loaded in %.1f s\n",
           c->backend, c->synth != NULL ? c->synth : c->model, pb, c->local_pages,
           (double)c->local_pages * (double)x.page_bytes / (double)(1ull << 30),
           (now_ms() - t_load) / 1000);
    char path[512];
    snprintf(path, sizeof(path), "mkdir -p '%s'", c->out);
    if (system(path) != 0) {
        return 1;
    }
    snprintf(path, sizeof(path), "%s/serving.json", c->out);
    x.json = fopen(path, "w");
    snprintf(path, sizeof(path), "%s/serving.tsv", c->out);
    x.tsv = fopen(path, "w");
    if (x.json == NULL || x.tsv == NULL) {
        fprintf(stderr, "serving_bench: cannot write into %s\n", c->out);
        return 1;
    }
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    fprintf(x.json,
            "{\"date\": \"%s\", \"backend\": \"%s\", \"model\": \"%s\", \"page_bytes\": %llu, "
            "\"warmup\": %d, \"requests\": %d, \"tput_requests\": %d, \"question_tokens\": %d, "
            "\"output_tokens\": %d, \"pool\": %u, \"doc_tokens\": %u, \"docs\": %u, "
            "\"short_median\": %u, \"short_sigma\": %g, \"short_docs\": %u, \"seed\": %llu, "
            "\"cold_bytes\": \"%s\", \"hot_admission\": \"%s\", \"prefill_chunk\": %d, "
            "\"prefill_tokens\": %d, \"fuse_decode\": %d,\n",
            date, c->backend, c->synth != NULL ? c->synth : c->model,
            (unsigned long long)x.page_bytes, c->warmup, c->requests, c->tput_requests, c->question,
            c->out_tokens, c->pool, c->doc_tokens, c->k, c->short_median, c->short_sigma,
            c->short_k, (unsigned long long)c->seed, c->cold_bytes, c->hot_admission,
            c->prefill_chunk, c->prefill_tokens, c->fuse_decode);
    fprintf(x.tsv,
            "workload\talpha\tbudget\tmode\tpolicy\tttft_p50\tttft_p99\trps_b1\ttput...\thit\n");
    /* The points: the product of the lists, or --plan. */
    entry ents[64];
    int ne = 0;
    if (c->plan != NULL) {
        ne = parse_plan(c, ents, 64);
        if (ne <= 0) {
            fprintf(stderr, "serving_bench: bad --plan '%s'\n", c->plan);
            return 2;
        }
    } else {
        for (int wi = 0; wi < c->n_workloads; wi++) {
            int na = strncmp(c->workloads[wi], "trace:", 6) == 0 ? 1 : c->n_alphas;
            for (int ai = 0; ai < na; ai++) {
                for (int bi = 0; bi < c->n_budgets && ne < 64; bi++) {
                    entry *e = &ents[ne++];
                    snprintf(e->workload, sizeof(e->workload), "%s", c->workloads[wi]);
                    e->alpha = c->alphas[ai];
                    e->budget = c->budgets[bi];
                    e->n_req = c->requests;
                    e->n_tput = c->tput_requests;
                    memcpy(e->modes, c->modes, sizeof(e->modes));
                    e->modes[M_NONE] &= bi == 0; /* No cache: the budget does not matter. */
                    e->lru = c->lru;
                    e->warmup = c->warmup;
                    memcpy(e->batches, c->batches, sizeof(e->batches));
                    e->n_batches = c->n_batches;
                }
            }
        }
    }
    int fail = 0;
    /* The correctness check first (cheap, and kept if a deadline cuts the points short). */
    workload first;
    if (ne > 0 && c->check > 0 &&
        make_workload(&x, ents[0].workload, ents[0].alpha, (uint64_t)c->check + 1, &first) == 0) {
        fail |= run_check(&x, &first);
        free_workload(&first);
    } else {
        fprintf(x.json, "  \"check\": null,\n  \"points\": [");
    }
    printf("\n%-10s %5s %6s %-6s %-8s %4s %9s %9s %7s %6s %6s %6s %5s  throughput\n", "workload",
           "alpha", "budget", "mode", "policy", "n", "TTFT p50", "TTFT p99", "spread", "r/s B1",
           "hit%", "sim%", "nocpy");
    for (int i = 0; i < ne; i++) {
        const entry *e = &ents[i];
        uint64_t nreq = (uint64_t)e->warmup + (uint64_t)e->n_req + 1;
        for (int b = 0; b < e->n_batches; b++) {
            nreq += (uint64_t)(e->n_tput > e->batches[b] ? e->n_tput : e->batches[b]) *
                    (e->ab ? 2u : 1u);
        }
        workload wl;
        if (make_workload(&x, e->workload, e->alpha, nreq, &wl) != 0) {
            fail = 1;
            continue;
        }
        int order[M__COUNT], n_order = e->n_order;
        memcpy(order, e->order, sizeof(order));
        if (n_order == 0) {
            for (int m = 0; m < M__COUNT; m++) {
                order[n_order++] = m;
            }
        }
        for (int k = 0; k < n_order; k++) {
            int m = order[k];
            if (!e->modes[m]) {
                continue;
            }
            if (c->deadline_s > 0 && (now_ms() - t_run) / 1000 > c->deadline_s) {
                printf("(deadline: %s %s alpha %g skipped)\n", e->workload, mode_names[m],
                       e->alpha);
                continue;
            }
            point p;
            fail |= run_point(&x, &wl, e->budget, m, c->policy, e->n_req, e->warmup, e->n_tput,
                              e->batches, e->n_batches, e->ab && c->ab_modes[m], &p) != 0;
            if (e->lru && (m == M_PREFIX || m == M_BLOCK) && c->policy != LKV_POLICY_LRU) {
                int nl = e->n_req / 3 > 10 ? e->n_req / 3 : 10;
                fail |= run_point(&x, &wl, e->budget, m, LKV_POLICY_LRU, nl, e->warmup, 0,
                                  e->batches, e->n_batches, 0, &p) != 0;
            }
        }
        free_workload(&wl);
    }
    fprintf(x.json, "\n  ]");
    fprintf(x.json, "\n}\n");
    fclose(x.json);
    fclose(x.tsv);
    stop_daemon(&x);
    lkv_worker_destroy(x.w);
#ifdef LKV_WORKER_HAVE_CUDA
    lkv_backend_cuda_destroy(cb);
#endif
    free_splits();
    printf("serving_bench: %s (JSON %s/serving.json)\n", fail ? "FAILED" : "done", c->out);
    return fail;
}
