/*
 * svc_run.h: the closed-loop driver of the service benchmark.
 *
 * svc_run starts n threads ("clients"); once all are ready they start together and each
 * calls op(ctx, tid, iter, &bytes) back to back until the run's duration has passed (the op in
 * progress at the deadline completes and counts). Every op's latency is recorded. The result
 * is ops, bytes, errors, the elapsed time from the common start to the last op's end (so
 * throughput = bytes / elapsed counts every byte moved) and latency percentiles (nearest rank)
 * over every op of every thread. A thread whose op fails stops; the first error is kept.
 */
#ifndef SVC_RUN_H
#define SVC_RUN_H

#include <stddef.h>
#include <stdint.h>

/* One operation of client tid (0..n-1), its iter-th (0, 1, ...). Adds the payload bytes moved
 * to *bytes. *lat_us is -1 on entry: an op that times only part of its work (e.g. Attach, not
 * the Release that follows it) writes that part's latency in microseconds there; otherwise the
 * whole call is timed. Returns 0 or a negative LKV_E* code. */
typedef int (*svc_op_fn)(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us);

typedef struct svc_result {
    uint64_t ops;    /* Completed operations (all threads). */
    uint64_t bytes;  /* Payload bytes of completed operations. */
    uint64_t errors; /* Failed operations (each stops its thread). */
    int first_error; /* LKV_E* code of the first failure, 0 if none. */
    double secs;     /* Common start to the end of the last operation. */
    double gbps;     /* bytes / secs / 1e9. */
    double ops_s;    /* ops / secs. */
    double p50_us;   /* Latency percentiles of one operation, microseconds. */
    double p99_us;
    double mean_us;
} svc_result;

/* Runs n_threads clients of op for seconds (> 0) and fills *out. ctx is borrowed. */
void svc_run(int n_threads, double seconds, svc_op_fn op, void *ctx, svc_result *out);

/* Monotonic time in seconds. */
double svc_now(void);

/* Median of v[0..n) (sorts v in place); 0 if n == 0. */
double svc_median(double *v, size_t n);

/* Reads the 1, 5, 15 minute load averages into la[3] (zeros if /proc/loadavg is unreadable). */
void svc_loadavg(double la[3]);

#endif
