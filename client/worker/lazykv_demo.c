/*
 * lazykv_demo.c: `lazykv-demo`, the RAG demo (cmake --build build --target demo).
 *
 * 1. Starts lazykvd in a temporary folder (port 0, host arena of 64 MiB: a small hot tier, so
 *    that less popular documents move to the cold tier and come back from it).
 * 2. Makes a corpus: n_docs short stories written by the tiny model itself (the worker with no
 *    documents, sampling with a seed per story), each then a document of the corpus.
 * 3. Runs a RAG workload through the decode worker: each request takes k distinct documents
 *    drawn from a Zipf distribution (hot documents recur) in a random order (so the same
 *    document comes back at different positions) and one of a few questions; prints the first
 *    requests' generated text and per-document hit/miss, then hit rates (documents and tokens,
 *    by tier) and TTFT of cold against warm requests, and the same prompt replayed warm.
 * 4. Stops the daemon with SIGTERM (it flushes and exits), checks its exit status and removes
 *    the folder.
 * Exit status: 0 on success, 1 if anything failed.
 */
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lkv_corpus.h"
#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_request.h"
#include "lkv_spawn.h"
#include "lkv_worker.h"

#ifndef LKV_DEFAULT_MODEL_DIR
#define LKV_DEFAULT_MODEL_DIR "tests/data/models"
#endif
#ifndef LKV_DAEMON_BIN
#define LKV_DAEMON_BIN "lazykvd"
#endif

#define MAX_DOCS 256
#define MAX_K    8

static lkv_spawn daemon_proc;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void cleanup(void)
{
    lkv_spawn_cleanup(&daemon_proc);
}

/* Zipf(s) over n ranks by inverse CDF; rng is xorshift64*. */
static int zipf(const double *cdf, int n, uint64_t *rng)
{
    double u = lkv_sampling_uniform(rng);
    for (int i = 0; i < n; i++) {
        if (u < cdf[i]) {
            return i;
        }
    }
    return n - 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    if (n == 0) {
        return NAN;
    }
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    const char *daemon_bin = LKV_DAEMON_BIN, *model_dir = LKV_DEFAULT_MODEL_DIR;
    int n_docs = 36, n_req = 60, k = 3, show = 3;
    static const struct option opts[] = {{"daemon-bin", required_argument, NULL, 'd'},
                                         {"model-dir", required_argument, NULL, 'm'},
                                         {"docs", required_argument, NULL, 'n'},
                                         {"requests", required_argument, NULL, 'r'},
                                         {"k", required_argument, NULL, 'k'},
                                         {"show", required_argument, NULL, 's'},
                                         {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'd':
            daemon_bin = optarg;
            break;
        case 'm':
            model_dir = optarg;
            break;
        case 'n':
            n_docs = atoi(optarg);
            break;
        case 'r':
            n_req = atoi(optarg);
            break;
        case 'k':
            k = atoi(optarg);
            break;
        case 's':
            show = atoi(optarg);
            break;
        default:
            fprintf(stderr, "usage: lazykv-demo [--daemon-bin P] [--model-dir D] [--docs N] "
                            "[--requests N] [--k K] [--show N]\n");
            return 2;
        }
    }
    if (n_docs < k || n_docs > MAX_DOCS || k < 1 || k > MAX_K || n_req < 1) {
        fprintf(stderr, "demo: need 1 <= k <= %d, k <= docs <= %d, requests >= 1\n", MAX_K,
                MAX_DOCS);
        return 2;
    }
    double t_start = now_ms();
    atexit(cleanup);
    signal(SIGPIPE, SIG_IGN);
    if (lkv_spawn_start(&daemon_proc, daemon_bin, "64MiB", NULL) != 0) {
        return 1;
    }
    const char *addr = daemon_proc.addr;
    printf("== lazykv demo: lazykvd at %s (folder %s, hot tier 64 MiB = 32 pages)\n", addr,
           daemon_proc.dir);

    char model[600], tokp[600], err[512];
    snprintf(model, sizeof(model), "%s/stories260K.bin", model_dir);
    snprintf(tokp, sizeof(tokp), "%s/tok512.bin", model_dir);
    lkv_worker_opts wo = {.target = addr, .model_path = model, .tokenizer_path = tokp};
    lkv_worker *w;
    if (lkv_worker_create(&wo, &w, err, sizeof(err)) != 0) {
        fprintf(stderr, "demo: %s\n", err);
        return 1;
    }
    const lkv_tokenizer *tok = lkv_worker_tokenizer(w);

    /* The corpus: stories the model writes itself (locally, no cache). */
    char **corpus;
    if (lkv_corpus_make(w, n_docs, 48, &corpus) != 0) {
        return 1;
    }
    uint64_t corpus_tokens = 0;
    for (int i = 0; i < n_docs; i++) {
        int ids[1024], n;
        if (lkv_tokenizer_encode(tok, corpus[i], 1, ids, 1024, &n) == 0) {
            corpus_tokens += (uint64_t)n;
        }
    }
    printf("== corpus: %d stories written by the model (%.0f tokens each on average); e.g.\n"
           "   doc 0: %.160s\n",
           n_docs, (double)corpus_tokens / n_docs, corpus[0]);

    /* The workload. */
    static const char *const questions[] = {"One day,", "Then", "The next day,", "After that,"};
    double cdf[MAX_DOCS], z = 0;
    for (int i = 0; i < n_docs; i++) {
        z += 1.0 / pow(i + 1, 1.0);
        cdf[i] = z;
    }
    for (int i = 0; i < n_docs; i++) {
        cdf[i] /= z;
    }
    uint64_t rng = lkv_sampling_seed(2026);
    double *ttft_cold = lkv_xcalloc((size_t)n_req, sizeof(double));
    double *ttft_warm = lkv_xcalloc((size_t)n_req, sizeof(double));
    double *ttft_mixed = lkv_xcalloc((size_t)n_req, sizeof(double));
    int n_cold = 0, n_warm = 0, n_mixed = 0, failed = 0;
    uint64_t docs_hot = 0, docs_cold = 0, docs_miss = 0, tok_hit = 0, tok_all = 0;
    double tpot_sum = 0;
    int first_prompt[MAX_K], first_q = 0;
    double first_ttft = 0;
    char *first_text = NULL;
    printf("== workload: %d requests of %d documents (Zipf 1.0 over %d) in random order\n", n_req,
           k, n_docs);
    for (int r = 0; r < n_req; r++) {
        int pick[MAX_K];
        for (int j = 0; j < k; j++) {
            int d, dup;
            do {
                d = zipf(cdf, n_docs, &rng);
                dup = 0;
                for (int x = 0; x < j; x++) {
                    dup |= pick[x] == d;
                }
            } while (dup);
            pick[j] = d;
        }
        int qi = (int)(lkv_sampling_uniform(&rng) * 4) & 3;
        if (r == 0) {
            memcpy(first_prompt, pick, sizeof(pick));
            first_q = qi;
        }
        const char *texts[MAX_K];
        for (int j = 0; j < k; j++) {
            texts[j] = corpus[pick[j]];
        }
        lkv_request_defaults def = {.max_tokens = 24};
        lkv_request rq;
        if (lkv_request_from_text(texts, k, questions[qi], tok, &def, "r", &rq, err, sizeof(err)) !=
            0) {
            fprintf(stderr, "demo: %s\n", err);
            return 1;
        }
        lkv_rag_result res;
        int rc = lkv_worker_run(w, &rq.rag, &res);
        if (rc != 0) {
            printf("   request %d failed: %s\n", r, res.error);
            failed++;
        } else {
            for (int j = 0; j < k; j++) {
                int t = res.docs[j].tier;
                docs_hot += res.docs[j].hit && t == 1;
                docs_cold += res.docs[j].hit && t == 2;
                docs_miss += !res.docs[j].hit;
            }
            tok_hit += res.hit_tokens;
            tok_all += res.hit_tokens + res.miss_tokens;
            tpot_sum += res.tpot_ms;
            if (res.hit_docs == 0) {
                ttft_cold[n_cold++] = res.ttft_ms;
            } else if (res.miss_docs == 0) {
                ttft_warm[n_warm++] = res.ttft_ms;
            } else {
                ttft_mixed[n_mixed++] = res.ttft_ms;
            }
            if (r == 0) {
                first_ttft = res.ttft_ms;
                first_text = lkv_xstrdup(res.text);
            }
            if (r < show) {
                printf("-- request %d: docs", r);
                for (int j = 0; j < k; j++) {
                    printf(" %d@%lld:%s%s%s", pick[j], (long long)res.docs[j].start,
                           res.docs[j].hit ? "hit(" : "miss",
                           res.docs[j].hit ? lkv_request_tier_name(res.docs[j].tier) : "",
                           res.docs[j].hit ? ")" : "");
                }
                printf(", question \"%s\", ttft %.2f ms\n   => %s%s\n", questions[qi], res.ttft_ms,
                       questions[qi], res.text);
            }
        }
        lkv_rag_result_free(&res);
        lkv_request_free(&rq);
    }
    /* The first prompt again: now warm. */
    const char *texts[MAX_K];
    for (int j = 0; j < k; j++) {
        texts[j] = corpus[first_prompt[j]];
    }
    lkv_request_defaults def = {.max_tokens = 24};
    lkv_request rq;
    lkv_rag_result again;
    lkv_request_from_text(texts, k, questions[first_q], tok, &def, "r0", &rq, err, sizeof(err));
    int rc = lkv_worker_run(w, &rq.rag, &again);
    if (rc != 0) {
        printf("   replay failed: %s\n", again.error);
        failed++;
    }
    uint64_t all = docs_hot + docs_cold + docs_miss;
    lkv_worker_stats st;
    lkv_worker_stats_get(w, &st);
    double mc = median(ttft_cold, n_cold), mw = median(ttft_warm, n_warm),
           mm = median(ttft_mixed, n_mixed);
    printf("== results over %d requests (%d failed)\n", n_req, failed);
    printf("   document hit rate %.1f%% (%llu hot + %llu cold of %llu), token hit rate %.1f%%\n",
           100.0 * (double)(docs_hot + docs_cold) / (double)(all ? all : 1),
           (unsigned long long)docs_hot, (unsigned long long)docs_cold, (unsigned long long)all,
           100.0 * (double)tok_hit / (double)(tok_all ? tok_all : 1));
    printf("   TTFT median: cold (every document computed) %.2f ms over %d requests; warm (every "
           "document from the cache) %.2f ms over %d; mixed %.2f ms over %d\n",
           mc, n_cold, mw, n_warm, mm, n_mixed);
    if (rc == 0) {
        printf("   the first prompt: TTFT %.2f ms cold, %.2f ms warm (%d/%d documents hit, %llu "
               "blocks read in place); same text: %s\n",
               first_ttft, again.ttft_ms, again.hit_docs, k,
               (unsigned long long)again.zero_copy_blocks,
               first_text != NULL && strcmp(first_text, again.text) == 0 ? "yes" : "NO");
        if (first_text == NULL || strcmp(first_text, again.text) != 0) {
            failed++;
        }
    }
    free(first_text);
    printf("   TPOT mean %.3f ms; arena mapped %llu time(s); leases %llu\n",
           tpot_sum / (double)(n_req - failed > 0 ? n_req - failed : 1),
           (unsigned long long)st.arena_maps, (unsigned long long)st.leases);
    lkv_rag_result_free(&again);
    lkv_request_free(&rq);
    lkv_worker_destroy(w);
    lkv_corpus_free(corpus, n_docs);
    free(ttft_cold);
    free(ttft_warm);
    free(ttft_mixed);

    /* Stop the daemon cleanly. */
    int clean = lkv_spawn_stop(&daemon_proc, 15000);
    printf("== lazykvd stopped (%s); demo took %.1f s\n",
           clean ? "SIGTERM, exit 0" : "abnormal exit", (now_ms() - t_start) / 1e3);
    return failed == 0 && clean && rc == 0 ? 0 : 1;
}
