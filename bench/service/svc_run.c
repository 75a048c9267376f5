/*
 * svc_run.c: the closed-loop driver (see svc_run.h).
 *
 * Each thread keeps its own growable array of latencies; they are merged and sorted once at
 * the end of a run, outside the timed region. Threads line up on a barrier, then read the
 * common start time, so thread creation is not timed.
 */
#include "svc_run.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lkv_log.h"

typedef struct worker {
    int tid;                    /* Client index. */
    svc_op_fn op;               /* Operation. */
    void *ctx;                  /* Its context (borrowed). */
    pthread_barrier_t *barrier; /* Start line. */
    const double *start;        /* Common start time (written before the second barrier). */
    double seconds;             /* Duration. */
    double *lat;                /* Latencies in microseconds (owned). */
    size_t n_lat, cap_lat;      /* Used, allocated. */
    uint64_t bytes;             /* Payload bytes of completed ops. */
    int error;                  /* First error, 0 if none. */
    double end;                 /* Time the last op ended. */
} worker;

double svc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    pthread_barrier_wait(w->barrier);
    pthread_barrier_wait(w->barrier); /* The main thread sets the start in between. */
    double deadline = *w->start + w->seconds;
    double t = svc_now();
    w->end = t;
    for (uint64_t iter = 0; t < deadline; iter++) {
        uint64_t b = 0;
        double lat = -1;
        int rc = w->op(w->ctx, w->tid, iter, &b, &lat);
        double t2 = svc_now();
        if (rc != 0) {
            w->error = rc;
            break;
        }
        if (w->n_lat == w->cap_lat) {
            w->cap_lat = w->cap_lat ? 2 * w->cap_lat : 1024;
            w->lat = lkv_xrealloc(w->lat, w->cap_lat * sizeof(double));
        }
        w->lat[w->n_lat++] = lat >= 0 ? lat : (t2 - t) * 1e6;
        w->bytes += b;
        w->end = t2;
        t = t2;
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n). */
static double pct(const double *v, size_t n, double p)
{
    if (n == 0) {
        return 0.0;
    }
    size_t r = (size_t)(p / 100.0 * (double)n + 0.999999);
    if (r < 1) {
        r = 1;
    }
    if (r > n) {
        r = n;
    }
    return v[r - 1];
}

void svc_run(int n_threads, double seconds, svc_op_fn op, void *ctx, svc_result *out)
{
    worker *ws = lkv_xcalloc((size_t)n_threads, sizeof(*ws));
    pthread_t *th = lkv_xcalloc((size_t)n_threads, sizeof(*th));
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)n_threads + 1);
    double start = 0;
    for (int i = 0; i < n_threads; i++) {
        ws[i].tid = i;
        ws[i].op = op;
        ws[i].ctx = ctx;
        ws[i].barrier = &barrier;
        ws[i].start = &start;
        ws[i].seconds = seconds;
        if (pthread_create(&th[i], NULL, worker_main, &ws[i]) != 0) {
            lkv_panic("pthread_create failed");
        }
    }
    pthread_barrier_wait(&barrier);
    start = svc_now();
    pthread_barrier_wait(&barrier);
    memset(out, 0, sizeof(*out));
    size_t n_lat = 0;
    double end = start;
    for (int i = 0; i < n_threads; i++) {
        pthread_join(th[i], NULL);
        n_lat += ws[i].n_lat;
        out->bytes += ws[i].bytes;
        if (ws[i].error != 0) {
            out->errors++;
            if (out->first_error == 0) {
                out->first_error = ws[i].error;
            }
        }
        if (ws[i].end > end) {
            end = ws[i].end;
        }
    }
    double *lat = lkv_xmalloc((n_lat ? n_lat : 1) * sizeof(double));
    size_t k = 0;
    double sum = 0;
    for (int i = 0; i < n_threads; i++) {
        memcpy(lat + k, ws[i].lat, ws[i].n_lat * sizeof(double));
        k += ws[i].n_lat;
        free(ws[i].lat);
    }
    qsort(lat, n_lat, sizeof(double), cmp_double);
    for (size_t i = 0; i < n_lat; i++) {
        sum += lat[i];
    }
    out->ops = n_lat;
    out->secs = end - start;
    if (out->secs > 0) {
        out->gbps = (double)out->bytes / out->secs / 1e9;
        out->ops_s = (double)out->ops / out->secs;
    }
    out->p50_us = pct(lat, n_lat, 50);
    out->p99_us = pct(lat, n_lat, 99);
    out->mean_us = n_lat ? sum / (double)n_lat : 0;
    free(lat);
    free(th);
    free(ws);
    pthread_barrier_destroy(&barrier);
}

double svc_median(double *v, size_t n)
{
    if (n == 0) {
        return 0.0;
    }
    qsort(v, n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void svc_loadavg(double la[3])
{
    la[0] = la[1] = la[2] = 0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f == NULL) {
        return;
    }
    if (fscanf(f, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3) {
        la[0] = la[1] = la[2] = 0;
    }
    fclose(f);
}
