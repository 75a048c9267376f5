/*
 * bench_worker.c: time to first token of the decode worker against a private lazykvd, tiny model
 * (stories260K) on the CPU, by number of documents per prompt, for four ways of serving them:
 *
 *   recompute    no cache: every document is prefilled in the request (the baseline)
 *   cold         through the cache, first sight: Lookup misses, documents computed, Put after
 *   lazy         through the cache, warm: hits read in place, LazyAttention (the product)
 *   materialise  through the cache, warm: hits copied and re-rotated per prompt (Block-Attention)
 *
 * Each cell is the median TTFT over reps requests (cold uses fresh documents each time); lazy
 * also reports the median TPOT of a 32-token generation. Prints a table and writes JSON.
 *
 *   bench_worker [--daemon-bin P] [--model-dir D] [--reps N] [--out FILE]
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

#define MAX_REPS 64
#define N_K      4

static const int KS[N_K] = {1, 2, 3, 6}; /* 6 x ~62 tokens + 33: under 512 positions */
static lkv_spawn sp;

static void cleanup(void)
{
    lkv_spawn_cleanup(&sp);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Runs docs texts[0..k) + question; returns TTFT (and TPOT) or exits on failure. */
static void one(lkv_worker *w, char **texts, int k, int mode, int no_cache, int max_tokens,
                double *ttft, double *tpot, int *hits)
{
    lkv_request_defaults def = {.max_tokens = max_tokens, .mode = mode};
    lkv_request rq;
    char err[256];
    if (lkv_request_from_text((const char *const *)texts, k, "One day,", lkv_worker_tokenizer(w),
                              &def, "b", &rq, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench: %s\n", err);
        exit(1);
    }
    rq.rag.no_cache = no_cache;
    rq.rag.stop_at_eos = 0;
    lkv_rag_result res;
    if (lkv_worker_run(w, &rq.rag, &res) != 0) {
        fprintf(stderr, "bench: %s\n", res.error);
        exit(1);
    }
    *ttft = res.ttft_ms;
    if (tpot != NULL) {
        *tpot = res.tpot_ms;
    }
    *hits = res.hit_docs;
    lkv_rag_result_free(&res);
    lkv_request_free(&rq);
}

int main(int argc, char **argv)
{
    const char *daemon_bin = LKV_DAEMON_BIN, *model_dir = LKV_DEFAULT_MODEL_DIR;
    const char *out = "bench/out/worker.json";
    int reps = 11;
    static const struct option opts[] = {{"daemon-bin", required_argument, NULL, 'd'},
                                         {"model-dir", required_argument, NULL, 'm'},
                                         {"reps", required_argument, NULL, 'r'},
                                         {"out", required_argument, NULL, 'o'},
                                         {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'd') {
            daemon_bin = optarg;
        } else if (c == 'm') {
            model_dir = optarg;
        } else if (c == 'r') {
            reps = atoi(optarg);
        } else if (c == 'o') {
            out = optarg;
        } else {
            fprintf(stderr, "usage: bench_worker [--daemon-bin P] [--model-dir D] [--reps N] "
                            "[--out FILE]\n");
            return 2;
        }
    }
    if (reps < 3 || reps > MAX_REPS) {
        fprintf(stderr, "bench: --reps must be 3..%d\n", MAX_REPS);
        return 2;
    }
    atexit(cleanup);
    signal(SIGPIPE, SIG_IGN);
    if (lkv_spawn_start(&sp, daemon_bin, "256MiB", NULL) != 0) {
        return 1;
    }
    char model[600], tokp[600], err[512];
    snprintf(model, sizeof(model), "%s/stories260K.bin", model_dir);
    snprintf(tokp, sizeof(tokp), "%s/tok512.bin", model_dir);
    lkv_worker_opts wo = {.target = sp.addr, .model_path = model, .tokenizer_path = tokp};
    lkv_worker *w;
    if (lkv_worker_create(&wo, &w, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench: %s\n", err);
        return 1;
    }
    /* Documents: 6 warm ones, then fresh ones for every cold repetition. */
    const int n_docs = 8 + (1 + 2 + 3 + 6) * reps;
    char **docs;
    if (lkv_corpus_make(w, n_docs, 56, &docs) != 0) {
        return 1;
    }
    int ids[2048], n, total = 0;
    for (int i = 0; i < 8; i++) {
        lkv_tokenizer_encode(lkv_worker_tokenizer(w), docs[i], 1, ids, 2048, &n);
        total += n;
    }
    double avg_doc = total / 8.0;
    double med[N_K][4], tpot_lazy[N_K];
    int fresh = 8, h;
    for (int ki = 0; ki < N_K; ki++) {
        int k = KS[ki];
        double t[4][MAX_REPS], tp[MAX_REPS];
        one(w, docs, k, LKV_RAG_LAZY, 0, 1, &t[0][0], NULL, &h); /* cache the warm ones */
        for (int r = 0; r < reps; r++) {
            one(w, docs, k, LKV_RAG_LAZY, 1, 1, &t[0][r], NULL, &h);
            one(w, docs + fresh, k, LKV_RAG_LAZY, 0, 1, &t[1][r], NULL, &h);
            if (h != 0) {
                fprintf(stderr, "bench: cold request hit %d documents\n", h);
                return 1;
            }
            fresh += k;
            one(w, docs, k, LKV_RAG_LAZY, 0, 32, &t[2][r], &tp[r], &h);
            if (h != k) {
                fprintf(stderr, "bench: warm request hit %d of %d\n", h, k);
                return 1;
            }
            one(w, docs, k, LKV_RAG_MATERIALISE, 0, 1, &t[3][r], NULL, &h);
        }
        for (int m = 0; m < 4; m++) {
            med[ki][m] = median(t[m], reps);
        }
        tpot_lazy[ki] = median(tp, reps);
    }
    printf("decode worker TTFT, stories260K on the CPU, %.0f-token documents, question 4 tokens, "
           "median of %d\n",
           avg_doc, reps);
    printf("%5s %13s %13s %13s %13s %11s %12s\n", "docs", "recompute_ms", "cold_ms", "lazy_ms",
           "materialise_ms", "lazy_tpot", "lazy_speedup");
    for (int ki = 0; ki < N_K; ki++) {
        printf("%5d %13.3f %13.3f %13.3f %13.3f %11.3f %11.1fx\n", KS[ki], med[ki][0], med[ki][1],
               med[ki][2], med[ki][3], tpot_lazy[ki], med[ki][0] / med[ki][2]);
    }
    FILE *f = fopen(out, "w");
    if (f == NULL) {
        fprintf(stderr, "bench: cannot write %s\n", out);
        return 1;
    }
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    fprintf(f,
            "{\"bench\": \"worker_ttft\", \"date\": \"%s\", \"model\": \"stories260K\", "
            "\"backend\": \"cpu\", \"reps\": %d, \"doc_tokens\": %.1f, \"rows\": [",
            when, reps, avg_doc);
    for (int ki = 0; ki < N_K; ki++) {
        fprintf(f,
                "%s{\"docs\": %d, \"recompute_ms\": %.4f, \"cold_ms\": %.4f, \"lazy_ms\": %.4f, "
                "\"materialise_ms\": %.4f, \"lazy_tpot_ms\": %.4f}",
                ki ? ", " : "", KS[ki], med[ki][0], med[ki][1], med[ki][2], med[ki][3],
                tpot_lazy[ki]);
    }
    fprintf(f, "]}\n");
    fclose(f);
    printf("wrote %s\n", out);
    lkv_corpus_free(docs, n_docs);
    lkv_worker_destroy(w);
    return lkv_spawn_stop(&sp, 15000) ? 0 : 1;
}
