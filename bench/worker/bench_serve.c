/*
 * bench_serve.c: throughput and latency of the serving engine (client/worker/lkv_engine.h) by
 * decode batch limit, the baseline (max_batch 1: one request at a time, as lazykv-worker
 * without --engine) measured in the same run. Local mode (no daemon: every document is
 * computed), so the numbers isolate the scheduler and batched decode.
 *
 *   bench_serve [--model-dir D] [--requests N] [--out FILE] [--synth PRESET]
 *
 * N requests (default 32), each 2 documents of 24-40 tokens and a 4-token question, 64 output
 * tokens (no early stop), all submitted at t = 0. Per max_batch in 1, 2, 4, 8, 16: wall time,
 * output tokens/s, mean and p50/p99 TTFT (queueing included), mean TPOT, decode passes. The
 * configurations run in turn, 3 rounds, and each keeps its fastest round (a shared machine's
 * load changes between runs; the round-robin order gives each the same chances). Prints a
 * table and writes JSON (default bench/out/serve.json).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_engine.h"
#include "lkv_err.h"
#include "lkv_log.h"

#ifndef LKV_DEFAULT_MODEL_DIR
#define LKV_DEFAULT_MODEL_DIR "tests/data/models"
#endif

#define MAX_REQ 512

static lkv_request *make(int i, int vocab)
{
    lkv_request *r = lkv_xcalloc(1, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "%d", i);
    r->docs = lkv_xcalloc(2, sizeof(*r->docs));
    r->doc_tokens = lkv_xcalloc(2, sizeof(int *));
    uint32_t x = (uint32_t)i * 2654435761u + 7;
    for (int d = 0; d < 2; d++) {
        int n = 24 + (int)(x % 17);
        r->doc_tokens[d] = lkv_xmalloc((size_t)n * sizeof(int));
        for (int t = 0; t < n; t++) {
            x = x * 1664525u + 1013904223u;
            r->doc_tokens[d][t] = t == 0 ? 1 : 3 + (int)((x >> 8) % (uint32_t)(vocab - 3));
        }
        r->docs[d] = (lkv_rag_doc){.tokens = r->doc_tokens[d], .n_tokens = n};
    }
    r->question = lkv_xmalloc(4 * sizeof(int));
    for (int t = 0; t < 4; t++) {
        x = x * 1664525u + 1013904223u;
        r->question[t] = 3 + (int)((x >> 8) % (uint32_t)(vocab - 3));
    }
    r->rag = (lkv_rag_request){.n_docs = 2,
                               .docs = r->docs,
                               .question = r->question,
                               .n_question = 4,
                               .max_tokens = 64,
                               .stop_at_eos = 0};
    return r;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *dir = LKV_DEFAULT_MODEL_DIR, *out = "bench/out/serve.json", *synth = NULL;
    int n = 32;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model-dir") == 0 && i + 1 < argc) {
            dir = argv[++i];
        } else if (strcmp(argv[i], "--requests") == 0 && i + 1 < argc) {
            n = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            out = argv[++i];
        } else if (strcmp(argv[i], "--synth") == 0 && i + 1 < argc) {
            synth = argv[++i];
        } else {
            fprintf(stderr, "usage: bench_serve [--model-dir D] [--requests N] [--out FILE] "
                            "[--synth PRESET]\n");
            return 2;
        }
    }
    if (n < 1 || n > MAX_REQ) {
        fprintf(stderr, "bench_serve: --requests must be 1..%d\n", MAX_REQ);
        return 2;
    }
    char model[4096];
    snprintf(model, sizeof(model), "%s/stories260K.bin", dir);
    lkv_worker_opts wo = {
        .model_path = synth ? NULL : model, .synth = synth, .threads = 1, .local_pages = 4096};
    lkv_worker *w;
    char err[512];
    if (lkv_worker_create(&wo, &w, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench_serve: %s\n", err);
        return 1;
    }
    const int V = lkv_worker_model(w)->cfg.vocab_size;
    static const int BATCH[] = {1, 2, 4, 8, 16};
    const int NB = (int)(sizeof(BATCH) / sizeof(BATCH[0]));
    double wall[8], tps[8], ttft_mean[8], ttft_p50[8], ttft_p99[8], tpot[8];
    uint64_t passes[8];
    int maxb[8];
    int *ref = NULL; /* Tokens of the baseline, to check every run gives the same output. */
    for (int bi = 0; bi < NB; bi++) {
        wall[bi] = 1e300;
    }
    for (int round = 0; round < 3 * NB; round++) {
        int bi = round % NB;
        lkv_engine_opts eo = {.max_batch = BATCH[bi], .max_queue = MAX_REQ};
        lkv_engine *e;
        if (lkv_engine_create(w, &eo, &e) != 0) {
            return 1;
        }
        lkv_engine_req *h[MAX_REQ];
        double t0 = lkv_worker_now_ms();
        for (int i = 0; i < n; i++) {
            if (lkv_engine_submit(e, make(i, V), 0, NULL, NULL, &h[i], err, sizeof(err)) != 0) {
                fprintf(stderr, "bench_serve: %s\n", err);
                return 1;
            }
        }
        double ttft[MAX_REQ], tp = 0;
        long toks = 0;
        for (int i = 0; i < n; i++) {
            lkv_engine_event ev;
            int rc = 0;
            while (lkv_engine_wait(h[i], &ev, -1)) {
                if (ev.kind == LKV_ENGINE_END) {
                    rc = ev.rc;
                    break;
                }
            }
            lkv_engine_result er;
            lkv_engine_result_get(h[i], &er);
            if (rc != 0) {
                fprintf(stderr, "bench_serve: request %d: %s\n", i, er.res->error);
                return 1;
            }
            ttft[i] = er.res->ttft_ms;
            tp += er.res->tpot_ms;
            toks += er.res->n_out;
            if (round == 0) {
                ref = lkv_xrealloc(ref, (size_t)(i + 1) * 64 * sizeof(int));
                memcpy(ref + (size_t)i * 64, er.res->tokens, 64 * sizeof(int));
            } else if (memcmp(ref + (size_t)i * 64, er.res->tokens, 64 * sizeof(int)) != 0) {
                fprintf(stderr, "bench_serve: request %d's tokens changed at max_batch %d\n", i,
                        BATCH[bi]);
                return 1;
            }
            lkv_engine_release(h[i]);
        }
        double wall_now = lkv_worker_now_ms() - t0;
        if (wall_now >= wall[bi]) {
            lkv_engine_destroy(e);
            continue;
        }
        wall[bi] = wall_now;
        lkv_engine_stats st;
        lkv_engine_stats_get(e, &st);
        lkv_engine_destroy(e);
        double sum = 0;
        for (int i = 0; i < n; i++) {
            sum += ttft[i];
        }
        qsort(ttft, (size_t)n, sizeof(double), cmp_d);
        tps[bi] = (double)toks / (wall[bi] / 1e3);
        ttft_mean[bi] = sum / n;
        ttft_p50[bi] = ttft[n / 2];
        ttft_p99[bi] = ttft[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1];
        tpot[bi] = tp / n;
        passes[bi] = st.decode_steps;
        maxb[bi] = st.max_batch_seen;
    }
    printf("serving engine, %s on the CPU (1 attention thread), %d requests x (2 docs of 24-40 "
           "tokens + 4-token question), 64 output tokens each, all at t=0; baseline max_batch 1; "
           "best of 3 rounds\n",
           synth ? synth : "stories260K", n);
    printf("%9s %9s %9s %10s %12s %10s %10s %9s %8s %9s\n", "max_batch", "wall_ms", "tok/s",
           "vs_base", "ttft_mean_ms", "ttft_p50", "ttft_p99", "tpot_ms", "passes", "batch_max");
    for (int bi = 0; bi < NB; bi++) {
        printf("%9d %9.1f %9.0f %9.2fx %12.1f %10.1f %10.1f %9.3f %8llu %9d\n", BATCH[bi], wall[bi],
               tps[bi], tps[bi] / tps[0], ttft_mean[bi], ttft_p50[bi], ttft_p99[bi], tpot[bi],
               (unsigned long long)passes[bi], maxb[bi]);
    }
    printf("every run gave every request the baseline's tokens\n");
    FILE *f = fopen(out, "w");
    if (f == NULL) {
        fprintf(stderr, "bench_serve: cannot write %s\n", out);
        return 1;
    }
    fprintf(f, "{\"model\":\"%s\",\"requests\":%d,\"out_tokens\":64,\"rows\":[",
            synth ? synth : "stories260K", n);
    for (int bi = 0; bi < NB; bi++) {
        fprintf(f,
                "%s{\"max_batch\":%d,\"wall_ms\":%.3f,\"tokens_per_s\":%.1f,\"ttft_mean_ms\":%.3f,"
                "\"ttft_p50_ms\":%.3f,\"ttft_p99_ms\":%.3f,\"tpot_ms\":%.4f,\"decode_passes\":%llu,"
                "\"max_batch_seen\":%d}",
                bi ? "," : "", BATCH[bi], wall[bi], tps[bi], ttft_mean[bi], ttft_p50[bi],
                ttft_p99[bi], tpot[bi], (unsigned long long)passes[bi], maxb[bi]);
    }
    fprintf(f, "]}\n");
    fclose(f);
    printf("wrote %s\n", out);
    free(ref);
    lkv_worker_destroy(w);
    return 0;
}
