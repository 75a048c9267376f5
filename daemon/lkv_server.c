/*
 * lkv_server.c: the RPC engine over gRPC C core 1.51 (see lkv_server.h; DESIGN.md 9).
 *
 * Threads and queues. `threads` workers, each with one completion queue (created for next) that
 * only it polls. Every method is registered once; each worker keeps ARMED requests outstanding
 * per method on its own queue, plus ARMED generic requests that answer unknown methods with
 * UNIMPLEMENTED. A new-call event re-arms a fresh request at once (unless draining), so calls
 * never queue behind a busy one. A call's batches all complete on the queue it was requested
 * on, so one call is only ever touched by one thread: no per-call lock is needed (except the
 * few park fields a resumer writes, under park_mu; see "Parked calls").
 *
 * Call context (struct lkv_rpc). Tags are (rpc, step) pairs embedded in the context:
 *   STEP_NEW     the request completed (success 0: shutting down, free the context).
 *   STEP_RECV    a RECV_MESSAGE batch of a client stream completed (NULL buffer: half-close).
 *   STEP_SEND    a SEND_MESSAGE batch of a server stream completed: produce the next message.
 *   STEP_CLOSE   RECV_CLOSE_ON_SERVER completed (streams start it first; `cancelled` tells
 *                whether the client went away).
 *   STEP_FINAL   the status batch completed.
 * Invariants: at most one SEND_MESSAGE and one RECV_MESSAGE batch in flight; exactly one final
 * status batch per call (finish()); `pending` counts batches in flight; the context is freed
 * only when the final batch was started and pending is 0; the service's cleanup runs once, in
 * finish(), before the final batch starts. Byte buffers handed to SEND_MESSAGE are destroyed
 * only after their batch completes.
 *
 * Parked calls (lkv_rpc_defer / lkv_rpc_offload). A parked call has no callback running and
 * waits for its STEP_WAKE tag, which a resume (any thread) or a finished pool job posts on the
 * call's own queue, so the continuation runs on the call's thread like any other event and the
 * one-thread rule holds. How to post a tag on a queue from outside, in the C core of 1.51: the
 * grpc_alarm of older cores is C++ only now, grpc_cq_end_op is internal (C++ mangled, absl
 * types), and a per-thread eventfd cannot be polled by grpc_completion_queue_next; polling with a
 * short timeout and an inbox would cost either latency or CPU on every idle thread. What the
 * public C API does offer is grpc_channel_watch_connectivity_state(channel, state, deadline, cq,
 * tag): on a lame channel (grpc_lame_client_channel_create) it starts no watch, only a timer,
 * and a deadline in the past fires it at once, so the tag completes on cq (success 0, ignored)
 * within microseconds (test_server's wake-latency case prints it). One lame channel serves the
 * server. A parked unary call starts RECV_CLOSE_ON_SERVER when it parks, so a client cancel, the
 * deadline (the core cancels the call then) and grpc_server_cancel_all_calls at shutdown all
 * reach a parked call as STEP_CLOSE with cancelled set.
 *   State (under park_mu): NONE -> PARKED (defer/offload) -> RESUMED (resume/job done, wake
 *   posted) -> NONE (STEP_WAKE, continuation runs). Tickets are (slot, generation) in a table
 *   under the same lock; freeing a slot bumps its generation, so a stale ticket finds nothing.
 *   Invariant: a context is freed only in state NONE, and a context in PARKED-by-defer state
 *   is always reachable from exactly one live slot. Races, each decided under park_mu: resume
 *   first (RESUMED) = the cancel is only noted and the call ends after the continuation; cancel
 *   first = the slot is freed (PARKED -> NONE), finish runs the cleanup once, a later resume
 *   gets LKV_ECANCELLED. Pool jobs (mode HOLD) are never abandoned: work may use the call's
 *   state, so cleanup waits for done. A parked call counts in n_ctx, so shutdown drains it.
 *   Pool: pool_threads threads over one FIFO (the call itself is the queue node: a parked call
 *   has at most one job); stopped once no context is left, before the queues shut down.
 *
 * Connections. For plaintext listeners the engine owns the accept loop (lkv_listener.h: caps
 * in total and per peer, EMFILE shedding and back-off; gRPC 1.51's own loop can stop accepting
 * for good after an EMFILE) and hands each socket to the core with
 * grpc_server_add_channel_from_fd. The core then names the connection "fd:N", so the engine
 * keeps the peer string of each descriptor number it handed out (peers[N], written by the
 * accept thread under peer_mu) and lkv_rpc_peer translates. A number is reused once the core
 * closes it, so an entry may name a later connection; the listener puts loopback peers on odd
 * numbers and others on even ones, and the translation is used only when the entry's
 * loopback-ness matches the number's, so the loopback decision of the admission hook can never
 * come from another class of peer (a stale entry can only mislabel a log line). With
 * opts.grpc_listener (the TLS seam: add_channel_from_fd takes insecure credentials only in
 * 1.51) the core's own listener is used, with the core's own peer strings. On every listener
 * the engine also caps calls in flight per peer IP at admission (opts.max_calls_per_peer): a
 * table of peer -> count under calls_mu, an entry per peer with calls, a call counted from its
 * admission until free_rpc (refused after admission, cancelled or parked alike); that is the
 * one per-peer limit a TLS port has, with gRPC's channel args (streams per connection,
 * handshake and idle timeouts).
 *
 * Shutdown (DESIGN.md 9.3): draining=1; the accept loop stops (new connections are refused by
 * the kernel); grpc_server_shutdown_and_notify on worker 0's queue; wait up to the grace period
 * for the calls in flight; as soon as none is left, grpc_server_cancel_all_calls, which also
 * drops idle connections (without it the core holds the shutdown for ~5 s per idle connection's
 * GOAWAY); then wait for the shutdown tag and for every context to be freed; then shut the queues
 * down, join the workers (each drains to GRPC_QUEUE_SHUTDOWN), destroy the server, the queues,
 * grpc_shutdown. Contexts are counted (n_ctx) so no queue is shut down while a call could still
 * start a batch on it (gRPC core asserts on that).
 */
#include "lkv_server.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "lkv_err.h"
#include "lkv_listener.h"
#include "lkv_log.h"
#include "lkv_pb.h"
#include "lkv_status.h"
#include "lkv_tls.h"

/* ThreadSanitizer and the completion queue. A tag handed to the core (a batch, a requested
 * call, a wake-up, the shutdown) comes back from grpc_completion_queue_next on a polling thread,
 * often another thread than the one that handed it over (arm() at create runs on the main
 * thread; post_wake on a pool or resuming thread). The core orders the two, but Debian's
 * libgrpc is not instrumented and its locks are absl ones on raw futexes, which TSan cannot
 * see; what TSan does see today is incidental (the eventfd write that kicks a sleeping poller
 * is modelled as a release on that descriptor), and there is no kick when the poller is
 * awake. TSAN_RELEASE(tag) just before each hand-over and TSAN_ACQUIRE(tag) just after the
 * event returns state exactly the edge the queue guarantees, independent of how the core
 * wakes its pollers (the TSan stage runs daemon.server with them). No-ops without TSan. */
#if defined(__SANITIZE_THREAD__)
#define LKV_HAVE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LKV_HAVE_TSAN 1
#endif
#endif
#ifdef LKV_HAVE_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define TSAN_ACQUIRE(p) __tsan_acquire((void *)(p))
#define TSAN_RELEASE(p) __tsan_release((void *)(p))
#else
#define TSAN_ACQUIRE(p) ((void)(p))
#define TSAN_RELEASE(p) ((void)(p))
#endif

#define ARMED         4   /* Outstanding requests per (worker, method). */
#define ARMED_GENERIC 1   /* Outstanding generic requests per worker. */
#define MSG_MAX       512 /* Status message bytes. */
#define PEER_MAX      64  /* "ipv6:[full v6 address]:65535" fits. */
#define PEER_BUCKETS  256 /* Buckets of the calls-per-peer table. */

enum step { STEP_NEW, STEP_RECV, STEP_SEND, STEP_CLOSE, STEP_FINAL, STEP_WAKE, STEP__N };

/* The callback a parked call continues (its resume function has that callback's contract). */
enum cb { CB_UNARY, CB_MSG, CB_END, CB_START, CB_NEXT };

/* Parking (under lkv_server.park_mu). */
enum park_state { PARK_NONE, PARK_PARKED, PARK_RESUMED };
enum park_mode { PARK_DEFER, PARK_HOLD };

typedef struct tag {
    struct lkv_rpc *rpc; /* NULL for the server shutdown tag. */
    int step;            /* enum step. */
} tag;

typedef struct worker {
    lkv_server *srv;           /* Owner. */
    int index;                 /* 0..n_workers-1. */
    grpc_completion_queue *cq; /* Polled only by this worker's thread. */
    pthread_t thread;          /* The polling thread. */
    int started;               /* 1 once the thread runs. */
} worker;

typedef struct method_stats {
    atomic_ullong calls;  /* Calls finished. */
    atomic_ullong errors; /* Of which with a non-OK status. */
    atomic_ullong usec;   /* Total wall time, microseconds. */
} method_stats;

struct lkv_rpc {
    lkv_server *srv;            /* Owner. */
    worker *w;                  /* The worker whose queue the call lives on. */
    int mi;                     /* Method index, -1 for a generic (unknown method) call. */
    grpc_call *call;            /* Our reference; unref at free. */
    gpr_timespec deadline;      /* As reported by the core (converted when compared). */
    grpc_metadata_array md;     /* Request metadata (elements owned by the call). */
    grpc_call_details details;  /* Generic calls only. */
    grpc_byte_buffer *payload;  /* Received message, ours to destroy. */
    grpc_byte_buffer *send_buf; /* In-flight SEND_MESSAGE buffer. */
    grpc_byte_buffer *staged;   /* Packed by reply/send, not yet started. */
    grpc_slice status_slice;    /* Final status details (kept until free). */
    grpc_metadata trail_md[2];  /* Final "lkv-code" (+ "retry-after-ms") trailing metadata. */
    char retry_ms[24];          /* lkv_rpc_set_retry_after's value ("" = none); its slice
                                 * points here (the context outlives the final batch). */
    int status_slice_set;       /* status_slice needs an unref. */
    int cancelled;              /* RECV_CLOSE_ON_SERVER out-param. */
    int pending;                /* Batches in flight. */
    int close_started;          /* RECV_CLOSE_ON_SERVER was started. */
    int close_done;             /* ... and completed. */
    int sent_initial_md;        /* SEND_INITIAL_METADATA was started. */
    int final_started;          /* The final status batch was started (or failed to). */
    int entered;                /* A service callback ran: cleanup is owed. */
    int cleaned;                /* cleanup ran. */
    int msg_set;                /* msg holds a service message. */
    int status;                 /* Final grpc_status_code. */
    char msg[MSG_MAX];          /* Status message. */
    char *peer;                 /* gpr_malloc'd peer string, lazily. */
    void *state;                /* Service state (lkv_rpc_set_state). */
    const void *principal;      /* Set by the admit hook (borrowed). */
    struct peer_calls *pc;      /* The peer's entry while this call counts there, or NULL. */
    struct timespec t0;         /* Start (monotonic), for method stats. */
    tag tags[STEP__N];          /* One tag per step. */
    char generic_path[128];     /* Generic calls: the method asked for. */
    /* Parking. park_state, park_mode, slot, rfn and rarg are guarded by srv->park_mu (the
     * resumer writes them from its thread); the rest is the call thread's. */
    int park_state;      /* enum park_state. */
    int park_mode;       /* enum park_mode (HOLD: a pool job, never abandoned). */
    uint32_t slot;       /* Ticket slot while PARKED in DEFER mode. */
    lkv_resume_fn rfn;   /* The continuation, set by resume or offload. */
    void *rarg;          /* Its argument. */
    int park_cb;         /* enum cb: the callback that parked. */
    int deferred_now;    /* lkv_rpc_defer/offload ran in the current callback. */
    lkv_work_fn work;    /* Pool job: the work function. */
    struct lkv_rpc *job; /* Next in the pool queue. */
};

/* Calls in flight from one peer IP (opts.max_calls_per_peer), in srv->calls_mu's table. */
typedef struct peer_calls {
    struct peer_calls *next; /* Bucket chain. */
    uint32_t n;              /* Calls counted (> 0: an entry is freed when it drops to 0). */
    char ip[PEER_MAX];       /* The peer without its port ("ipv4:127.0.0.1"). */
} peer_calls;

typedef struct park_slot {
    uint32_t gen;        /* Bumped whenever the slot is freed: stale tickets miss. */
    uint32_t next_free;  /* Free list link (index + 1, 0 = end). */
    struct lkv_rpc *rpc; /* The parked call, NULL when free. */
} park_slot;

/* TLS certificate state (see lkv_tls_opts): read by the fetcher on gRPC's handshake threads. */
typedef struct tls_state {
    pthread_mutex_t mu;                          /* Guards everything below. */
    char *paths[3];                              /* cert, key, client CA (NULL: none); owned. */
    struct stat st[3];                           /* What was last loaded (or tried and failed). */
    grpc_ssl_server_certificate_config *pending; /* Loaded, not yet handed to gRPC. */
    atomic_ulong generation;                     /* Certificates loaded. */
    uint64_t failures;                           /* Changed files that could not be used. */
    time_t not_after;                            /* Expiry of the certificate in service. */
    lkv_stat_group *group;                       /* Its stats in the registry, or NULL. */
    char last_why[512]; /* The last problem logged ("" after a good load): logged once. */
} tls_state;

struct lkv_server {
    grpc_server *server; /* The core server. */
    tls_state *tls;      /* TLS of the listener, or NULL (plaintext). */
    worker *workers;     /* n_workers workers. */
    int n_workers;
    const lkv_method *methods; /* Borrowed table. */
    int n_methods;
    void **handles;      /* Registered method handles, one per method. */
    method_stats *stats; /* One per method. */
    uint64_t max_msg;    /* Message limit, bytes. */
    lkv_admit_fn admit;  /* Optional admission hook. */
    void *admit_ctx;     /* Its context. */
    char address[320];   /* Bound "host:port". */
    int port;            /* Bound port. */
    atomic_int draining; /* 1 once shutdown began. */
    atomic_long n_ctx;   /* Live contexts (armed requests + calls). */
    atomic_long n_calls; /* Calls in progress. */
    pthread_mutex_t mu;  /* Guards shutdown_done, and the condition. */
    pthread_cond_t cv;   /* Signalled on shutdown tag and on n_ctx reaching 0. */
    int shutdown_done;   /* The shutdown tag completed. */
    int shut;            /* lkv_server_shutdown finished. */
    tag shutdown_tag;    /* {NULL, 0}. */
    /* Deferred replies. */
    grpc_channel *lame;      /* Wake-up source (see the file comment). */
    pthread_mutex_t park_mu; /* Guards the ticket table and every call's park fields. */
    park_slot *slots;        /* Ticket table, n_slots entries. */
    uint32_t n_slots;
    uint32_t free_slot; /* Free list head (index + 1, 0 = empty). */
    /* Worker pool. */
    int n_pool;              /* Pool threads (0: offloaded work runs inline). */
    pthread_t *pool;         /* The threads. */
    pthread_mutex_t pool_mu; /* Guards the job queue and pool_stop. */
    pthread_cond_t pool_cv;  /* Signalled on a new job and on stop. */
    struct lkv_rpc *jq_head; /* FIFO of calls whose job waits for a thread. */
    struct lkv_rpc *jq_tail;
    int pool_stop;            /* 1: threads exit once the queue is empty. */
    atomic_long pool_backlog; /* Jobs queued or running. */
    int fault_job_delay_ms;   /* Tests: each job sleeps this long first (a slow disk). */

    lkv_stats *registry;         /* opts.stats (borrowed), or NULL. */
    lkv_stat_group *stats_group; /* The per-method counters there, or NULL. */
    lkv_stat_group *conn_group;  /* The accept loop's counters there, or NULL. */

    /* The accept loop (plaintext; NULL with opts.grpc_listener). See "Connections". */
    lkv_listener *listener;
    grpc_server_credentials *fd_creds; /* Insecure: all add_channel_from_fd accepts in 1.51. */
    pthread_mutex_t peer_mu;           /* Guards peers. */
    char (*peers)[PEER_MAX];           /* Peer string by descriptor number ("" unknown). */
    size_t n_peers;                    /* Entries of peers. */
    /* The per-method latency histograms there, or NULL: set once after the threads start
     * (hence atomic), unregistered only after they stopped. */
    _Atomic(lkv_stat_group *) hist_group;

    /* Calls in flight per peer (opts.max_calls_per_peer; see "Connections"). */
    uint32_t max_calls_per_peer;       /* 0: no cap (nothing counted). */
    pthread_mutex_t calls_mu;          /* Guards buckets and every entry's n. */
    peer_calls *buckets[PEER_BUCKETS]; /* Chains of the entries with n > 0. */
    atomic_ulong calls_refused_peer;   /* Calls refused over the cap. */
    lkv_stat_group *peer_group;        /* calls_refused_peer in the registry, or NULL. */
};

static void finish(lkv_rpc *rpc, int rc);
static int peer_admit(lkv_rpc *rpc);
static void peer_release(lkv_rpc *rpc);

/* ---- Status mapping (the one table is proto/lkv_status.c) ---------------------------- */

int lkv_server_status_code(int rc)
{
    return lkv_status_from_err(rc);
}

const char *lkv_server_status_name(int code)
{
    return lkv_status_name(code);
}

/* Server-side failures are logged at warn; the caller's mistakes at info. */
static int status_is_server_fault(int code)
{
    return code == GRPC_STATUS_INTERNAL || code == GRPC_STATUS_UNKNOWN ||
           code == GRPC_STATUS_DATA_LOSS || code == GRPC_STATUS_RESOURCE_EXHAUSTED ||
           code == GRPC_STATUS_UNAVAILABLE;
}

/* ---- Small helpers ------------------------------------------------------------------- */

static void ctx_done(lkv_server *s)
{
    if (atomic_fetch_sub(&s->n_ctx, 1) == 1) {
        pthread_mutex_lock(&s->mu);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
}

static const char *method_path(const lkv_rpc *rpc)
{
    return rpc->mi >= 0 ? rpc->srv->methods[rpc->mi].path : rpc->generic_path;
}

static double elapsed_us(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) * 1e6 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e3;
}

static void free_rpc(lkv_rpc *rpc)
{
    lkv_server *s = rpc->srv;
#ifndef NDEBUG
    pthread_mutex_lock(&s->park_mu);
    assert(rpc->park_state == PARK_NONE); /* No resume can reach a freed call. */
    pthread_mutex_unlock(&s->park_mu);
#endif
    if (rpc->call != NULL) {
        if (rpc->mi >= 0) {
            method_stats *ms = &s->stats[rpc->mi];
            atomic_fetch_add(&ms->calls, 1);
            if (rpc->status != GRPC_STATUS_OK) {
                atomic_fetch_add(&ms->errors, 1);
            }
            double us = elapsed_us(&rpc->t0);
            atomic_fetch_add(&ms->usec, (unsigned long long)us);
            lkv_stat_hist *h = lkv_stat_group_hist(atomic_load(&s->hist_group), rpc->mi);
            if (h != NULL) {
                lkv_stat_hist_observe(h, (uint64_t)us);
            }
        }
        if (atomic_fetch_sub(&s->n_calls, 1) == 1 && atomic_load(&s->draining)) {
            pthread_mutex_lock(&s->mu);
            pthread_cond_broadcast(&s->cv); /* lkv_server_shutdown waits for no call left. */
            pthread_mutex_unlock(&s->mu);
        }
        grpc_call_unref(rpc->call);
    }
    if (rpc->payload != NULL) {
        grpc_byte_buffer_destroy(rpc->payload);
    }
    if (rpc->send_buf != NULL) {
        grpc_byte_buffer_destroy(rpc->send_buf);
    }
    if (rpc->staged != NULL) {
        grpc_byte_buffer_destroy(rpc->staged);
    }
    if (rpc->status_slice_set) {
        grpc_slice_unref(rpc->status_slice);
    }
    peer_release(rpc);
    if (rpc->peer != NULL) {
        gpr_free(rpc->peer);
    }
    grpc_metadata_array_destroy(&rpc->md);
    if (rpc->mi < 0) {
        grpc_call_details_destroy(&rpc->details);
    }
    free(rpc);
    ctx_done(s);
}

static void maybe_free(lkv_rpc *rpc)
{
    if (rpc->final_started && rpc->pending == 0) {
        free_rpc(rpc);
    }
}

/* Starts a batch with tag step; on failure logs and returns LKV_EINTERNAL (nothing pending). */
static int start_batch(lkv_rpc *rpc, const grpc_op *ops, size_t n, int step)
{
    rpc->pending++;
    TSAN_RELEASE(&rpc->tags[step]);
    grpc_call_error e = grpc_call_start_batch(rpc->call, ops, n, &rpc->tags[step], NULL);
    if (e != GRPC_CALL_OK) {
        rpc->pending--;
        LKV_LOGE("%s: grpc_call_start_batch (step %d) failed: %d", method_path(rpc), step, (int)e);
        return LKV_EINTERNAL;
    }
    return 0;
}

/* ---- Arming requests ------------------------------------------------------------------ */

static void arm(lkv_server *s, worker *w, int mi)
{
    lkv_rpc *rpc = lkv_xcalloc(1, sizeof(*rpc));
    rpc->srv = s;
    rpc->w = w;
    rpc->mi = mi;
    for (int i = 0; i < STEP__N; i++) {
        rpc->tags[i].rpc = rpc;
        rpc->tags[i].step = i;
    }
    grpc_metadata_array_init(&rpc->md);
    atomic_fetch_add(&s->n_ctx, 1);
    grpc_call_error e;
    TSAN_RELEASE(&rpc->tags[STEP_NEW]);
    if (mi < 0) {
        grpc_call_details_init(&rpc->details);
        e = grpc_server_request_call(s->server, &rpc->call, &rpc->details, &rpc->md, w->cq, w->cq,
                                     &rpc->tags[STEP_NEW]);
    } else {
        int with_payload = s->methods[mi].kind != LKV_RPC_CLIENT_STREAM;
        e = grpc_server_request_registered_call(
            s->server, s->handles[mi], &rpc->call, &rpc->deadline, &rpc->md,
            with_payload ? &rpc->payload : NULL, w->cq, w->cq, &rpc->tags[STEP_NEW]);
    }
    if (e != GRPC_CALL_OK) {
        LKV_LOGE("cannot request calls of %s: grpc error %d", mi >= 0 ? s->methods[mi].path : "*",
                 (int)e);
        rpc->call = NULL;
        rpc->final_started = 1;
        free_rpc(rpc);
    }
}

/* ---- The per-call state machine ------------------------------------------------------- */

static int deadline_passed(const lkv_rpc *rpc)
{
    gpr_timespec dl = rpc->mi < 0 ? rpc->details.deadline : rpc->deadline;
    dl = gpr_convert_clock_type(dl, GPR_CLOCK_MONOTONIC);
    return gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), dl) > 0;
}

/* Unpacks rpc->payload (consumed) into *out; on failure sets the message and returns rc. */
static int unpack(lkv_rpc *rpc, ProtobufCMessage **out)
{
    const lkv_method *m = &rpc->srv->methods[rpc->mi];
    char err[MSG_MAX];
    uint64_t limit = rpc->srv->max_msg;
    if (m->max_request_bytes != 0 && m->max_request_bytes < limit) {
        limit = m->max_request_bytes; /* The method's own bound (lkv_method.max_request_bytes). */
    }
    int rc = lkv_pb_unpack(m->req_desc, rpc->payload, (size_t)limit, out, err, sizeof(err));
    if (rpc->payload != NULL) {
        grpc_byte_buffer_destroy(rpc->payload);
        rpc->payload = NULL;
    }
    if (rc == LKV_ETOOBIG && limit < rpc->srv->max_msg) {
        return lkv_rpc_errorf(rpc, rc, "%s (the request bound of %s)", err, m->path);
    }
    if (rc != 0) {
        return lkv_rpc_errorf(rpc, rc, "%s", err);
    }
    return 0;
}

/* Hands rpc->payload (consumed) to the method's on_raw as the pieces it arrived in: the slices
 * of an uncompressed raw buffer in place (no readall copy), else one decompressed piece. */
static int recv_raw(lkv_rpc *rpc)
{
    const lkv_method *m = &rpc->srv->methods[rpc->mi];
    uint64_t limit = rpc->srv->max_msg;
    if (m->max_request_bytes != 0 && m->max_request_bytes < limit) {
        limit = m->max_request_bytes;
    }
    grpc_byte_buffer *bb = rpc->payload;
    size_t len = grpc_byte_buffer_length(bb);
    int rc;
    if (len > limit) {
        rc = lkv_rpc_errorf(
            rpc, LKV_ETOOBIG,
            "%s message is %zu bytes, over the %" PRIu64 "-byte message limit%s%s%s",
            m->req_desc->name, len, limit,
            limit < rpc->srv->max_msg ? " (the request bound of " : "",
            limit < rpc->srv->max_msg ? m->path : "", limit < rpc->srv->max_msg ? ")" : "");
        goto out;
    }
    struct iovec one, *iov = &one;
    size_t n = 1;
    grpc_slice flat;
    int have_flat = 0;
    if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE) {
        grpc_slice_buffer *sb = &bb->data.raw.slice_buffer;
        n = sb->count;
        iov = n <= 1 ? &one : lkv_xmalloc(n * sizeof *iov);
        one.iov_base = NULL;
        one.iov_len = 0;
        for (size_t i = 0; i < n; i++) {
            iov[i].iov_base = GRPC_SLICE_START_PTR(sb->slices[i]);
            iov[i].iov_len = GRPC_SLICE_LENGTH(sb->slices[i]);
        }
        n = n == 0 ? 1 : n;
    } else {
        grpc_byte_buffer_reader reader;
        if (!grpc_byte_buffer_reader_init(&reader, bb)) {
            rc = lkv_rpc_errorf(rpc, LKV_EPROTO,
                                "cannot read the %s message (bad compressed "
                                "payload?)",
                                m->req_desc->name);
            goto out;
        }
        flat = grpc_byte_buffer_reader_readall(&reader);
        grpc_byte_buffer_reader_destroy(&reader);
        have_flat = 1;
        one.iov_base = GRPC_SLICE_START_PTR(flat);
        one.iov_len = GRPC_SLICE_LENGTH(flat);
    }
    rc = lkv_rpc_check_deadline(rpc);
    if (rc == 0) {
        rpc->entered = 1;
        rc = m->on_raw(m->svc, rpc, iov, n);
    }
    if (iov != &one) {
        free(iov);
    }
    if (have_flat) {
        grpc_slice_unref(flat);
    }
out:
    grpc_byte_buffer_destroy(rpc->payload);
    rpc->payload = NULL;
    return rc;
}

static void send_next(lkv_rpc *rpc);
static void after_cb(lkv_rpc *rpc, int cb, int rc);
static int start_close(lkv_rpc *rpc);
static int start_recv(lkv_rpc *rpc);

/* The call ended under us: says why (deadline, shutdown or the client) and returns the code. */
static int vanished(lkv_rpc *rpc)
{
    if (deadline_passed(rpc)) {
        return lkv_rpc_errorf(rpc, LKV_ETIMEDOUT, "deadline passed mid-stream");
    }
    if (atomic_load(&rpc->srv->draining)) {
        return lkv_rpc_errorf(rpc, LKV_ECANCELLED, "cancelled by shutdown");
    }
    return lkv_rpc_errorf(rpc, LKV_ECANCELLED, "client went away mid-stream");
}

/* Ends the call with rc (0: OK, sending the staged reply if any). Runs the service cleanup,
 * then starts the one final batch. Safe to call once; later calls do nothing. */
static void finish(lkv_rpc *rpc, int rc)
{
    if (rpc->final_started) {
        return;
    }
    lkv_server *s = rpc->srv;
    const lkv_method *m = rpc->mi >= 0 ? &s->methods[rpc->mi] : NULL;
    if (rpc->entered && !rpc->cleaned) {
        rpc->cleaned = 1;
        if (m->cleanup != NULL) {
            m->cleanup(m->svc, rpc);
        }
    }
    rpc->status = lkv_server_status_code(rc);
    if (rc != 0) {
        if (!rpc->msg_set) {
            snprintf(rpc->msg, sizeof(rpc->msg), "%s", lkv_strerror(rc));
        }
        if (rc == LKV_ECANCELLED) {
            LKV_LOGI("%s from %s: %s", method_path(rpc), lkv_rpc_peer(rpc), rpc->msg);
        } else if (status_is_server_fault(rpc->status)) {
            LKV_LOGW("refused %s from %s: %s: %s", method_path(rpc), lkv_rpc_peer(rpc),
                     lkv_server_status_name(rpc->status), rpc->msg);
        } else {
            LKV_LOGI("refused %s from %s: %s: %s", method_path(rpc), lkv_rpc_peer(rpc),
                     lkv_server_status_name(rpc->status), rpc->msg);
        }
        if (rpc->staged != NULL) {
            grpc_byte_buffer_destroy(rpc->staged);
            rpc->staged = NULL;
        }
    } else {
        rpc->msg[0] = '\0';
    }
    grpc_op ops[4];
    size_t n = 0;
    memset(ops, 0, sizeof(ops));
    if (!rpc->sent_initial_md) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].data.send_initial_metadata.count = 0;
        n++;
        rpc->sent_initial_md = 1;
    }
    if (rpc->staged != NULL) {
        /* Unary / client-stream reply (server streams never finish with a staged message). */
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = rpc->staged;
        rpc->send_buf = rpc->staged;
        rpc->staged = NULL;
        n++;
    }
    rpc->status_slice = grpc_slice_from_copied_string(rpc->msg);
    rpc->status_slice_set = 1;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    if (rc != 0) {
        /* The exact code, so that clients never parse the message (lkv_status.h). */
        rpc->trail_md[0].key = grpc_slice_from_static_string(LKV_STATUS_MD_KEY);
        rpc->trail_md[0].value = grpc_slice_from_static_string(lkv_status_md_value(rc));
        size_t nmd = 1;
        if (rpc->retry_ms[0] != '\0') {
            rpc->trail_md[1].key = grpc_slice_from_static_string(LKV_RETRY_AFTER_MD_KEY);
            rpc->trail_md[1].value =
                grpc_slice_from_static_buffer(rpc->retry_ms, strlen(rpc->retry_ms));
            nmd = 2;
        }
        ops[n].data.send_status_from_server.trailing_metadata_count = nmd;
        ops[n].data.send_status_from_server.trailing_metadata = rpc->trail_md;
    } else {
        ops[n].data.send_status_from_server.trailing_metadata_count = 0;
    }
    ops[n].data.send_status_from_server.status = (grpc_status_code)rpc->status;
    ops[n].data.send_status_from_server.status_details = rc != 0 ? &rpc->status_slice : NULL;
    n++;
    if (!rpc->close_started) {
        ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[n].data.recv_close_on_server.cancelled = &rpc->cancelled;
        n++;
        rpc->close_started = 1;
    }
    rpc->final_started = 1;
    start_batch(rpc, ops, n, STEP_FINAL);
    /* If the batch failed to start nothing is pending for it and the call is freed here. */
}

/* Starts RECV_CLOSE_ON_SERVER on its own (streams), to learn when the client goes away. */
static int start_close(lkv_rpc *rpc)
{
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &rpc->cancelled;
    rpc->close_started = 1;
    return start_batch(rpc, &op, 1, STEP_CLOSE);
}

static int start_recv(lkv_rpc *rpc)
{
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &rpc->payload;
    return start_batch(rpc, &op, 1, STEP_RECV);
}

/* Server streams: puts the staged message on the wire, or asks the service for the next one
 * (its result is handled by after_cb, which comes back here to send what it staged). */
static void send_next(lkv_rpc *rpc)
{
    const lkv_method *m = &rpc->srv->methods[rpc->mi];
    if (rpc->staged != NULL) {
        grpc_op ops[2];
        size_t n = 0;
        memset(ops, 0, sizeof(ops));
        if (!rpc->sent_initial_md) {
            ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
            n++;
            rpc->sent_initial_md = 1;
        }
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = rpc->staged;
        n++;
        rpc->send_buf = rpc->staged;
        rpc->staged = NULL;
        if (start_batch(rpc, ops, n, STEP_SEND) != 0) {
            finish(rpc, lkv_rpc_errorf(rpc, LKV_EINTERNAL, "cannot send a message"));
        }
        return;
    }
    if (rpc->close_done && rpc->cancelled) {
        finish(rpc, vanished(rpc));
        return;
    }
    int rc = lkv_rpc_check_deadline(rpc);
    if (rc == 0) {
        rpc->entered = 1;
        rc = m->next(m->svc, rpc);
    }
    after_cb(rpc, CB_NEXT, rc);
}

/* ---- Parking ------------------------------------------------------------------------ */

/* Where a call's wake-up goes, read under park_mu: once the lock is released in state RESUMED
 * the call thread may run the continuation and free the call, so the poster must not touch
 * the context after that (only these copies). */
typedef struct wake {
    grpc_channel *lame;        /* The server's lame channel. */
    grpc_completion_queue *cq; /* The call's queue. */
    void *tag;                 /* Its STEP_WAKE tag. */
} wake;

static wake wake_of(lkv_rpc *rpc)
{
    wake k = {rpc->srv->lame, rpc->w->cq, &rpc->tags[STEP_WAKE]};
    return k;
}

/* Posts the wake-up tag on the call's own queue, now, from any thread (see the file comment: a
 * connectivity watch on the lame channel with a deadline in the past completes at once). */
static void post_wake(wake k)
{
    TSAN_RELEASE(k.tag);
    grpc_channel_watch_connectivity_state(k.lame, GRPC_CHANNEL_IDLE,
                                          gpr_inf_past(GPR_CLOCK_MONOTONIC), k.cq, k.tag);
}

/* Frees rpc's ticket slot (park_mu held): every ticket naming it goes stale. */
static void slot_free_locked(lkv_server *s, lkv_rpc *rpc)
{
    park_slot *sl = &s->slots[rpc->slot];
    assert(sl->rpc == rpc);
    sl->rpc = NULL;
    sl->gen++;
    sl->next_free = s->free_slot;
    s->free_slot = rpc->slot + 1;
}

/* If the call is parked in DEFER mode (not yet resumed), ends it now because it was cancelled
 * (client, deadline or shutdown): the ticket goes stale under the lock, then finish runs the
 * cleanup. A resumed call, or one in the pool, ends after its continuation (after_cb). */
static void abandon_if_parked(lkv_rpc *rpc)
{
    lkv_server *s = rpc->srv;
    int abandon = 0;
    pthread_mutex_lock(&s->park_mu);
    if (rpc->park_state == PARK_PARKED && rpc->park_mode == PARK_DEFER) {
        slot_free_locked(s, rpc);
        rpc->park_state = PARK_NONE;
        abandon = 1;
    }
    pthread_mutex_unlock(&s->park_mu);
    if (abandon) {
        finish(rpc, vanished(rpc));
    }
}

/* The callback that parked has returned: make sure RECV_CLOSE_ON_SERVER is outstanding (unary
 * calls start it only here), so a cancel or the deadline reaches us while the call waits. */
static void park_commit(lkv_rpc *rpc)
{
    if (!rpc->close_started && start_close(rpc) != 0) {
        LKV_LOGE("%s: cannot watch a parked call for cancellation", method_path(rpc));
    }
    if (rpc->close_done && rpc->cancelled) {
        abandon_if_parked(rpc);
    }
}

/* What to do after a callback (or a continuation standing for it) returned rc. */
static void after_cb(lkv_rpc *rpc, int cb, int rc)
{
    const lkv_method *m = &rpc->srv->methods[rpc->mi];
    if (rpc->deferred_now) {
        rpc->deferred_now = 0;
        if (rc != LKV_EAGAIN) {
            LKV_LOGE("%s: a callback parked its call but returned %d, not LKV_EAGAIN", m->path, rc);
        }
        rpc->park_cb = cb;
        park_commit(rpc);
        return;
    }
    if (rpc->close_done && rpc->cancelled) {
        finish(rpc, vanished(rpc)); /* Also drops a staged reply: the client is gone. */
        return;
    }
    switch (cb) {
    case CB_UNARY:
    case CB_END:
        if (rc == 0 && rpc->staged == NULL) {
            rc = lkv_rpc_errorf(rpc, LKV_EINTERNAL, "%s produced no reply", m->path);
        }
        finish(rpc, rc);
        return;
    case CB_MSG:
        if (rc < 0) {
            finish(rpc, rc);
        } else if (start_recv(rpc) != 0) {
            finish(rpc, LKV_EINTERNAL);
        }
        return;
    case CB_START:
        if (rc < 0) {
            finish(rpc, rc);
        } else {
            send_next(rpc);
        }
        return;
    case CB_NEXT:
        if (rc < 0) {
            finish(rpc, rc);
        } else if (rpc->staged == NULL) {
            finish(rpc, 0);
        } else {
            send_next(rpc);
        }
        return;
    default:
        lkv_panic("bad callback kind %d", cb);
    }
}

/* STEP_WAKE: a resume or a finished pool job. Runs the continuation on this (the call's)
 * thread, then carries on as after the callback that parked. */
static void on_wake(lkv_rpc *rpc)
{
    lkv_server *s = rpc->srv;
    const lkv_method *m = &s->methods[rpc->mi];
    pthread_mutex_lock(&s->park_mu);
    assert(rpc->park_state == PARK_RESUMED);
    lkv_resume_fn fn = rpc->rfn;
    void *arg = rpc->rarg;
    rpc->park_state = PARK_NONE;
    rpc->rfn = NULL;
    rpc->rarg = NULL;
    pthread_mutex_unlock(&s->park_mu);
    int rc = fn(m->svc, rpc, arg);
    after_cb(rpc, rpc->park_cb, rc);
}

static void *pool_main(void *arg)
{
    lkv_server *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->pool_mu);
        while (s->jq_head == NULL && !s->pool_stop) {
            pthread_cond_wait(&s->pool_cv, &s->pool_mu);
        }
        lkv_rpc *rpc = s->jq_head;
        if (rpc == NULL) {
            pthread_mutex_unlock(&s->pool_mu);
            return NULL;
        }
        s->jq_head = rpc->job;
        if (s->jq_head == NULL) {
            s->jq_tail = NULL;
        }
        rpc->job = NULL;
        pthread_mutex_unlock(&s->pool_mu);
        if (s->fault_job_delay_ms > 0) {
            struct timespec d = {s->fault_job_delay_ms / 1000,
                                 (long)(s->fault_job_delay_ms % 1000) * 1000000L};
            nanosleep(&d, NULL);
        }
        /* Only work, svc and rarg are read here: set before the job was queued, unchanged
         * until the continuation runs. */
        rpc->work(s->methods[rpc->mi].svc, rpc->rarg);
        atomic_fetch_sub(&s->pool_backlog, 1);
        pthread_mutex_lock(&s->park_mu);
        assert(rpc->park_state == PARK_PARKED && rpc->park_mode == PARK_HOLD);
        rpc->park_state = PARK_RESUMED;
        wake k = wake_of(rpc);
        pthread_mutex_unlock(&s->park_mu);
        post_wake(k); /* rpc may be gone from here on. */
    }
}

static void on_new(lkv_rpc *rpc, int success)
{
    lkv_server *s = rpc->srv;
    if (!success) {
        /* Shutting down: the request was never matched to a call. */
        rpc->call = NULL;
        rpc->final_started = 1;
        free_rpc(rpc);
        return;
    }
    atomic_fetch_add(&s->n_calls, 1);
    clock_gettime(CLOCK_MONOTONIC, &rpc->t0);
    if (!atomic_load(&s->draining)) {
        arm(s, rpc->w, rpc->mi);
    }
    if (rpc->mi < 0) {
        char *path = rpc->generic_path;
        size_t len = GRPC_SLICE_LENGTH(rpc->details.method);
        if (len >= sizeof(rpc->generic_path)) {
            len = sizeof(rpc->generic_path) - 1;
        }
        memcpy(path, GRPC_SLICE_START_PTR(rpc->details.method), len);
        path[len] = '\0';
        finish(rpc, lkv_rpc_errorf(rpc, LKV_ENOTSUP, "unknown method %s", path));
        return;
    }
    const lkv_method *m = &s->methods[rpc->mi];
    ProtobufCMessage *req = NULL;
    int rc;
    rc = peer_admit(rpc);
    if (rc < 0) {
        finish(rpc, rc);
        return;
    }
    if (s->admit != NULL) {
        rc = s->admit(s->admit_ctx, rpc);
        if (rc < 0) {
            finish(rpc, rc);
            return;
        }
    }
    switch (m->kind) {
    case LKV_RPC_UNARY:
        rc = unpack(rpc, &req);
        if (rc == 0) {
            rc = lkv_rpc_check_deadline(rpc);
        }
        if (rc == 0) {
            rpc->entered = 1;
            rc = m->unary(m->svc, rpc, req);
        }
        lkv_pb_free(req);
        after_cb(rpc, CB_UNARY, rc);
        return;
    case LKV_RPC_SERVER_STREAM:
        if (start_close(rpc) != 0) {
            finish(rpc, LKV_EINTERNAL);
            return;
        }
        rc = unpack(rpc, &req);
        if (rc == 0) {
            rc = lkv_rpc_check_deadline(rpc);
        }
        if (rc == 0) {
            rpc->entered = 1;
            rc = m->start(m->svc, rpc, req);
        }
        lkv_pb_free(req);
        after_cb(rpc, CB_START, rc);
        return;
    case LKV_RPC_CLIENT_STREAM:
        if (start_close(rpc) != 0 || start_recv(rpc) != 0) {
            finish(rpc, LKV_EINTERNAL);
        }
        return;
    default:
        lkv_panic("bad method kind %d", m->kind);
    }
}

static void on_recv(lkv_rpc *rpc, int success)
{
    const lkv_method *m = &rpc->srv->methods[rpc->mi];
    if (rpc->final_started) {
        maybe_free(rpc);
        return;
    }
    if (!success) {
        finish(rpc, vanished(rpc));
        return;
    }
    int rc;
    if (rpc->payload == NULL) {
        /* The client half-closed, or went away: a cancelled call also ends its message stream
         * with a NULL message (success 1); grpc_call_failed_before_recv_message tells the two
         * apart, and RECV_CLOSE may already have said so. Never commit a vanished stream. */
        if ((rpc->close_done && rpc->cancelled) ||
            grpc_call_failed_before_recv_message(rpc->call)) {
            finish(rpc, vanished(rpc));
            return;
        }
        rc = lkv_rpc_check_deadline(rpc);
        if (rc == 0) {
            rpc->entered = 1;
            rc = m->on_end != NULL ? m->on_end(m->svc, rpc) : 0;
        }
        after_cb(rpc, CB_END, rc);
        return;
    }
    if (m->on_raw != NULL) {
        after_cb(rpc, CB_MSG, recv_raw(rpc));
        return;
    }
    ProtobufCMessage *msg = NULL;
    rc = unpack(rpc, &msg);
    if (rc == 0) {
        rc = lkv_rpc_check_deadline(rpc);
    }
    if (rc == 0) {
        rpc->entered = 1;
        rc = m->on_message(m->svc, rpc, msg);
    }
    lkv_pb_free(msg);
    after_cb(rpc, CB_MSG, rc);
}

static void on_event(tag *t, int success)
{
    lkv_rpc *rpc = t->rpc;
    switch (t->step) {
    case STEP_NEW:
        on_new(rpc, success);
        return;
    case STEP_RECV:
        rpc->pending--;
        on_recv(rpc, success);
        return;
    case STEP_SEND:
        rpc->pending--;
        grpc_byte_buffer_destroy(rpc->send_buf);
        rpc->send_buf = NULL;
        if (rpc->final_started) {
            maybe_free(rpc);
        } else if (!success) {
            finish(rpc, vanished(rpc));
        } else {
            send_next(rpc);
        }
        return;
    case STEP_CLOSE:
        rpc->pending--;
        rpc->close_done = 1;
        if (rpc->cancelled && !rpc->final_started) {
            abandon_if_parked(rpc); /* A resumed or pooled call ends in after_cb. */
        }
        maybe_free(rpc);
        return;
    case STEP_WAKE:
        on_wake(rpc);
        return;
    case STEP_FINAL:
        rpc->pending--;
        maybe_free(rpc);
        return;
    default:
        lkv_panic("bad tag step %d", t->step);
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    lkv_server *s = w->srv;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(w->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) {
            break;
        }
        if (ev.type != GRPC_OP_COMPLETE) {
            continue;
        }
        tag *t = ev.tag;
        TSAN_ACQUIRE(t); /* Pairs with the TSAN_RELEASE before the hand-over. */
        if (t->rpc == NULL) {
            pthread_mutex_lock(&s->mu);
            s->shutdown_done = 1;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        on_event(t, ev.success);
    }
    return NULL;
}

/* ---- For callbacks ------------------------------------------------------------------- */

void lkv_rpc_set_principal(lkv_rpc *rpc, const void *principal)
{
    rpc->principal = principal;
}

const void *lkv_rpc_principal(const lkv_rpc *rpc)
{
    return rpc->principal;
}

void lkv_rpc_set_state(lkv_rpc *rpc, void *state)
{
    rpc->state = state;
}

void *lkv_rpc_state(const lkv_rpc *rpc)
{
    return rpc->state;
}

static int stage(lkv_rpc *rpc, const ProtobufCMessage *msg)
{
    char err[MSG_MAX];
    assert(rpc->staged == NULL);
    int rc = lkv_pb_pack(msg, rpc->srv->max_msg, &rpc->staged, err, sizeof(err));
    if (rc != 0) {
        return lkv_rpc_errorf(rpc, rc, "reply too large: %s (raise max_message_bytes)", err);
    }
    return 0;
}

int lkv_rpc_reply(lkv_rpc *rpc, const ProtobufCMessage *msg)
{
    return stage(rpc, msg);
}

int lkv_rpc_send(lkv_rpc *rpc, const ProtobufCMessage *msg)
{
    return stage(rpc, msg);
}

/* The borrowed pieces of one lkv_rpc_send_pieces message: released when gRPC drops the last
 * slice over them (grpc_slice_new_with_user_data's destroy, on any thread). */
typedef struct piece_hold {
    atomic_int refs;         /* Slices alive, plus one while the message is built. */
    void (*release)(void *); /* The caller's release. */
    void *arg;               /* Its argument. */
} piece_hold;

static void piece_unref(void *p)
{
    piece_hold *h = p;
    if (atomic_fetch_sub(&h->refs, 1) == 1) {
        if (h->release != NULL) {
            h->release(h->arg);
        }
        free(h);
    }
}

int lkv_rpc_send_pieces(lkv_rpc *rpc, const lkv_rpc_piece *pieces, int n, void (*release)(void *),
                        void *arg)
{
    piece_hold *h = lkv_xmalloc(sizeof *h);
    atomic_init(&h->refs, 1);
    h->release = release;
    h->arg = arg;
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        total += pieces[i].len;
    }
    assert(rpc->staged == NULL);
    if (total > rpc->srv->max_msg) {
        piece_unref(h);
        return lkv_rpc_errorf(rpc, LKV_ETOOBIG,
                              "reply too large: %" PRIu64 " bytes, over the %" PRIu64
                              "-byte message limit (raise max_message_bytes)",
                              total, rpc->srv->max_msg);
    }
    grpc_slice stack[16];
    grpc_slice *sl = n <= 16 ? stack : lkv_xmalloc(sizeof(grpc_slice) * (size_t)n);
    for (int i = 0; i < n; i++) {
        if (pieces[i].borrow) {
            atomic_fetch_add(&h->refs, 1);
            sl[i] = grpc_slice_new_with_user_data((void *)pieces[i].data, pieces[i].len,
                                                  piece_unref, h);
        } else {
            sl[i] = grpc_slice_from_copied_buffer(pieces[i].data, pieces[i].len);
        }
    }
    rpc->staged = grpc_raw_byte_buffer_create(sl, (size_t)n); /* Takes its own refs. */
    for (int i = 0; i < n; i++) {
        grpc_slice_unref(sl[i]);
    }
    if (sl != stack) {
        free(sl);
    }
    piece_unref(h); /* The build's own reference: now only the slices hold it. */
    return 0;
}

int lkv_rpc_errorf(lkv_rpc *rpc, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rpc->msg, sizeof(rpc->msg), fmt, ap);
    va_end(ap);
    rpc->msg_set = 1;
    return rc;
}

void lkv_rpc_set_retry_after(lkv_rpc *rpc, uint64_t ms)
{
    snprintf(rpc->retry_ms, sizeof(rpc->retry_ms), "%" PRIu64, ms);
}

int lkv_rpc_transport_secure(const lkv_rpc *rpc)
{
    grpc_auth_context *ac = grpc_call_auth_context(rpc->call);
    if (ac == NULL) {
        return 0;
    }
    int secure = 0;
    grpc_auth_property_iterator it =
        grpc_auth_context_find_properties_by_name(ac, GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME);
    const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
    if (p != NULL && p->value != NULL) {
        secure = strncmp(p->value, GRPC_SSL_TRANSPORT_SECURITY_TYPE, p->value_length) == 0 &&
                 p->value_length == strlen(GRPC_SSL_TRANSPORT_SECURITY_TYPE);
    }
    grpc_auth_context_release(ac);
    return secure;
}

int lkv_rpc_check_deadline(lkv_rpc *rpc)
{
    if (deadline_passed(rpc)) {
        return lkv_rpc_errorf(rpc, LKV_ETIMEDOUT, "deadline exceeded before %s was done",
                              method_path(rpc));
    }
    return 0;
}

int64_t lkv_rpc_deadline_left_ms(const lkv_rpc *rpc)
{
    gpr_timespec dl = rpc->mi < 0 ? rpc->details.deadline : rpc->deadline;
    dl = gpr_convert_clock_type(dl, GPR_CLOCK_MONOTONIC);
    if (gpr_time_cmp(dl, gpr_inf_future(GPR_CLOCK_MONOTONIC)) == 0) {
        return INT64_MAX;
    }
    gpr_timespec left = gpr_time_sub(dl, gpr_now(GPR_CLOCK_MONOTONIC));
    int64_t ms = (int64_t)left.tv_sec * 1000 + left.tv_nsec / 1000000;
    return ms > 0 ? ms : 0;
}

const char *lkv_rpc_method(const lkv_rpc *rpc)
{
    return method_path(rpc);
}

/* The peer of a connection the accept loop handed over, for the core's "fd:N" (see
 * "Connections"); NULL if unknown (then "fd:N" stays, which no rule takes for loopback). */
static char *fd_peer(lkv_server *s, const char *core_peer)
{
    char *end;
    long n = strtol(core_peer + 3, &end, 10);
    if (*end != '\0' || n < 0) {
        return NULL;
    }
    char buf[PEER_MAX];
    buf[0] = '\0';
    pthread_mutex_lock(&s->peer_mu);
    if ((size_t)n < s->n_peers) {
        memcpy(buf, s->peers[n], PEER_MAX);
    }
    pthread_mutex_unlock(&s->peer_mu);
    if (buf[0] == '\0') {
        return NULL;
    }
    int lo = strncmp(buf, "ipv4:127.", 9) == 0 || strncmp(buf, "ipv6:[::1]", 10) == 0 ||
             strncmp(buf, "ipv6:[::ffff:127.", 17) == 0;
    if (lo != lkv_listener_fd_is_loopback((int)n)) {
        return NULL; /* Cannot happen (the listener places by class); fail closed anyway. */
    }
    size_t len = strlen(buf) + 1;
    char *p = gpr_malloc(len);
    memcpy(p, buf, len);
    return p;
}

const char *lkv_rpc_peer(lkv_rpc *rpc)
{
    if (rpc->peer == NULL && rpc->call != NULL) {
        rpc->peer = grpc_call_get_peer(rpc->call);
        if (rpc->peer != NULL && rpc->srv->listener != NULL && strncmp(rpc->peer, "fd:", 3) == 0) {
            char *p = fd_peer(rpc->srv, rpc->peer);
            if (p != NULL) {
                gpr_free(rpc->peer);
                rpc->peer = p;
            }
        }
    }
    return rpc->peer != NULL ? rpc->peer : "?";
}

/* The peer string without its port: "ipv4:10.0.0.1:5000" -> "ipv4:10.0.0.1", "ipv6:[::1]:5000"
 * -> "ipv6:[::1]"; a string with no ":port" after its scheme ("fd:7", "unix:/s") stays whole. */
static void peer_ip(const char *peer, char out[PEER_MAX])
{
    snprintf(out, PEER_MAX, "%s", peer);
    char *first = strchr(out, ':');
    char *last = strrchr(out, ':');
    if (first == NULL || last == first || last[1] == '\0') {
        return;
    }
    for (const char *p = last + 1; *p != '\0'; p++) {
        if (*p < '0' || *p > '9') {
            return;
        }
    }
    *last = '\0';
}

static uint32_t peer_hash(const char *k)
{
    uint32_t h = 2166136261u; /* FNV-1a. */
    for (; *k != '\0'; k++) {
        h = (h ^ (uint8_t)*k) * 16777619u;
    }
    return h % PEER_BUCKETS;
}

/* Counts the call against its peer's cap (opts.max_calls_per_peer), or refuses it (LKV_ERATE)
 * when the peer already has that many in flight. Health calls are exempt. */
static int peer_admit(lkv_rpc *rpc)
{
    lkv_server *s = rpc->srv;
    uint32_t max = s->max_calls_per_peer;
    if (max == 0 || strncmp(method_path(rpc), "/grpc.health.v1.Health/", 23) == 0) {
        return 0;
    }
    char ip[PEER_MAX];
    peer_ip(lkv_rpc_peer(rpc), ip);
    uint32_t b = peer_hash(ip);
    pthread_mutex_lock(&s->calls_mu);
    peer_calls *e = s->buckets[b];
    while (e != NULL && strcmp(e->ip, ip) != 0) {
        e = e->next;
    }
    if (e == NULL) {
        e = lkv_xcalloc(1, sizeof(*e));
        memcpy(e->ip, ip, PEER_MAX);
        e->next = s->buckets[b];
        s->buckets[b] = e;
    } else if (e->n >= max) {
        pthread_mutex_unlock(&s->calls_mu);
        atomic_fetch_add(&s->calls_refused_peer, 1);
        return lkv_rpc_errorf(rpc, LKV_ERATE,
                              "too many calls in flight from %s (max_calls_per_peer = %" PRIu32 ")",
                              ip, max);
    }
    e->n++;
    rpc->pc = e;
    pthread_mutex_unlock(&s->calls_mu);
    return 0;
}

/* Uncounts a counted call (once: from free_rpc), freeing its peer's entry at 0. */
static void peer_release(lkv_rpc *rpc)
{
    peer_calls *e = rpc->pc;
    if (e == NULL) {
        return;
    }
    lkv_server *s = rpc->srv;
    rpc->pc = NULL;
    pthread_mutex_lock(&s->calls_mu);
    if (--e->n == 0) {
        peer_calls **pp = &s->buckets[peer_hash(e->ip)];
        while (*pp != e) {
            pp = &(*pp)->next;
        }
        *pp = e->next;
        free(e);
    }
    pthread_mutex_unlock(&s->calls_mu);
}

uint32_t lkv_server_peer_calls(lkv_server *s, const char *ip)
{
    uint32_t n = 0;
    pthread_mutex_lock(&s->calls_mu);
    for (const peer_calls *e = s->buckets[peer_hash(ip)]; e != NULL; e = e->next) {
        if (strcmp(e->ip, ip) == 0) {
            n = e->n;
            break;
        }
    }
    pthread_mutex_unlock(&s->calls_mu);
    return n;
}

int lkv_rpc_metadata(const lkv_rpc *rpc, const char *key, char *buf, size_t len)
{
    for (size_t i = 0; i < rpc->md.count; i++) {
        const grpc_metadata *e = &rpc->md.metadata[i];
        if (grpc_slice_str_cmp(e->key, key) == 0) {
            size_t n = GRPC_SLICE_LENGTH(e->value);
            if (len == 0 || n > len - 1) {
                return -1;
            }
            memcpy(buf, GRPC_SLICE_START_PTR(e->value), n);
            buf[n] = '\0';
            return (int)n;
        }
    }
    return -1;
}

int lkv_rpc_metadata_count(const lkv_rpc *rpc, const char *key)
{
    int n = 0;
    for (size_t i = 0; i < rpc->md.count; i++) {
        if (grpc_slice_str_cmp(rpc->md.metadata[i].key, key) == 0) {
            n++;
        }
    }
    return n;
}

uint64_t lkv_rpc_max_message_bytes(const lkv_rpc *rpc)
{
    return rpc->srv->max_msg;
}

int lkv_rpc_server_draining(const lkv_rpc *rpc)
{
    return lkv_server_draining(rpc->srv);
}

/* ---- Deferred replies and the pool ---------------------------------------------------- */

int lkv_rpc_defer(lkv_rpc *rpc, lkv_rpc_ticket *out)
{
    lkv_server *s = rpc->srv;
    assert(rpc->mi >= 0 && !rpc->deferred_now && !rpc->final_started);
    pthread_mutex_lock(&s->park_mu);
    assert(rpc->park_state == PARK_NONE);
    if (s->free_slot == 0) {
        uint32_t n = s->n_slots ? s->n_slots * 2 : 64;
        s->slots = lkv_xrealloc(s->slots, (size_t)n * sizeof(*s->slots));
        for (uint32_t i = s->n_slots; i < n; i++) {
            s->slots[i].gen = 1;
            s->slots[i].rpc = NULL;
            s->slots[i].next_free = i + 1 < n ? i + 2 : s->free_slot;
        }
        s->free_slot = s->n_slots + 1;
        s->n_slots = n;
    }
    uint32_t i = s->free_slot - 1;
    park_slot *sl = &s->slots[i];
    s->free_slot = sl->next_free;
    sl->rpc = rpc;
    rpc->slot = i;
    rpc->park_state = PARK_PARKED;
    rpc->park_mode = PARK_DEFER;
    out->srv = s;
    out->id = (uint64_t)sl->gen << 32 | (uint64_t)(i + 1);
    pthread_mutex_unlock(&s->park_mu);
    rpc->deferred_now = 1;
    return LKV_EAGAIN;
}

int lkv_rpc_resume(lkv_rpc_ticket t, lkv_resume_fn fn, void *arg)
{
    lkv_server *s = t.srv;
    uint32_t i = (uint32_t)(t.id & 0xffffffffu);
    uint32_t gen = (uint32_t)(t.id >> 32);
    if (s == NULL || fn == NULL || i == 0) {
        return LKV_EINVAL;
    }
    lkv_rpc *rpc = NULL;
    wake k;
    pthread_mutex_lock(&s->park_mu);
    if (i - 1 < s->n_slots && s->slots[i - 1].gen == gen && s->slots[i - 1].rpc != NULL) {
        rpc = s->slots[i - 1].rpc;
        assert(rpc->park_state == PARK_PARKED && rpc->park_mode == PARK_DEFER);
        slot_free_locked(s, rpc);
        rpc->park_state = PARK_RESUMED;
        rpc->rfn = fn;
        rpc->rarg = arg;
        k = wake_of(rpc);
    }
    uint32_t n_slots = s->n_slots;
    pthread_mutex_unlock(&s->park_mu);
    if (rpc == NULL) {
        return i - 1 < n_slots || gen != 0 ? LKV_ECANCELLED : LKV_EINVAL;
    }
    /* RESUMED: the call thread neither frees nor abandons the call before STEP_WAKE, but it
     * may do both as soon as the tag is posted: only the copies in k are used. */
    post_wake(k);
    return 0;
}

/* A reply or failure packed by lkv_rpc_finish_deferred. */
typedef struct deferred_end {
    int rc;               /* 0 or the failure. */
    grpc_byte_buffer *bb; /* The packed reply (rc 0). */
    int msg_set;          /* msg holds a message. */
    char msg[MSG_MAX];    /* Failure message. */
} deferred_end;

static int finish_fn(void *svc, lkv_rpc *rpc, void *arg)
{
    (void)svc;
    deferred_end *e = arg;
    int rc = e->rc;
    if (e->msg_set) {
        lkv_rpc_errorf(rpc, rc, "%s", e->msg);
    }
    if (e->bb != NULL) {
        assert(rpc->staged == NULL);
        rpc->staged = e->bb;
    }
    free(e);
    return rc;
}

int lkv_rpc_finish_deferred(lkv_rpc_ticket t, int rc, const ProtobufCMessage *msg, const char *fmt,
                            ...)
{
    if (t.srv == NULL || (rc == 0 && msg == NULL) || rc > 0) {
        return LKV_EINVAL;
    }
    deferred_end *e = lkv_xcalloc(1, sizeof(*e));
    e->rc = rc;
    if (rc == 0) {
        char err[MSG_MAX / 2];
        int prc = lkv_pb_pack(msg, t.srv->max_msg, &e->bb, err, sizeof(err));
        if (prc != 0) {
            e->rc = prc;
            e->bb = NULL;
            snprintf(e->msg, sizeof(e->msg), "reply too large: %s (raise max_message_bytes)", err);
            e->msg_set = 1;
        }
    } else if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
        va_end(ap);
        e->msg_set = 1;
    }
    int r = lkv_rpc_resume(t, finish_fn, e);
    if (r != 0) {
        if (e->bb != NULL) {
            grpc_byte_buffer_destroy(e->bb);
        }
        free(e);
    }
    return r;
}

int lkv_rpc_offload(lkv_rpc *rpc, lkv_work_fn work, lkv_resume_fn done, void *arg)
{
    lkv_server *s = rpc->srv;
    const lkv_method *m = &s->methods[rpc->mi];
    assert(!rpc->deferred_now && !rpc->final_started);
    if (s->n_pool == 0) {
        work(m->svc, arg);
        return done(m->svc, rpc, arg); /* As if done were the callback itself. */
    }
    pthread_mutex_lock(&s->park_mu);
    assert(rpc->park_state == PARK_NONE);
    rpc->park_state = PARK_PARKED;
    rpc->park_mode = PARK_HOLD;
    rpc->rfn = done;
    rpc->rarg = arg;
    pthread_mutex_unlock(&s->park_mu);
    rpc->work = work;
    rpc->deferred_now = 1;
    atomic_fetch_add(&s->pool_backlog, 1);
    pthread_mutex_lock(&s->pool_mu);
    rpc->job = NULL;
    if (s->jq_tail != NULL) {
        s->jq_tail->job = rpc;
    } else {
        s->jq_head = rpc;
    }
    s->jq_tail = rpc;
    pthread_cond_signal(&s->pool_cv);
    pthread_mutex_unlock(&s->pool_mu);
    return LKV_EAGAIN;
}

long lkv_server_pool_backlog(const lkv_server *s)
{
    return atomic_load(&((lkv_server *)s)->pool_backlog);
}

/* ---- Server lifecycle ----------------------------------------------------------------- */

/* Registry read fn: 4 values per method (see lkv_server_opts.stats). */
static void method_stats_read(void *ctx, double *vals, int n)
{
    const lkv_server *s = ctx;
    for (int i = 0; i < s->n_methods && 4 * i + 3 < n; i++) {
        double calls = (double)atomic_load(&s->stats[i].calls);
        double usec = (double)atomic_load(&s->stats[i].usec);
        vals[4 * i] = calls;
        vals[4 * i + 1] = (double)atomic_load(&s->stats[i].errors);
        vals[4 * i + 2] = calls > 0 ? usec / calls : 0.0;
        vals[4 * i + 3] = usec;
    }
}

/* Section "connections" of Admin Stats: the accept loop's counters (lkv_listener_stats). */
#define CONN_STATS 7

static void conn_stats_read(void *ctx, double *vals, int n)
{
    lkv_server *s = ctx;
    lkv_listener_stats st;
    lkv_listener_stats_get(s->listener, &st);
    double v[CONN_STATS] = {(double)st.open,          (double)st.accepted,
                            (double)st.refused_total, (double)st.refused_peer,
                            (double)st.fd_exhausted,  (double)st.shed_exhausted,
                            (double)st.backoffs};
    for (int i = 0; i < n && i < CONN_STATS; i++) {
        vals[i] = v[i];
    }
}

/* Section "connections", every listener: calls refused over max_calls_per_peer. */
static void peer_stats_read(void *ctx, double *vals, int n)
{
    lkv_server *s = ctx;
    if (n > 0) {
        vals[0] = (double)atomic_load(&s->calls_refused_peer);
    }
}

static int peer_stats_register(lkv_server *s, lkv_stats *r)
{
    static const lkv_stat_desc d = {"calls_refused",
                                    "cap=peer",
                                    LKV_STAT_COUNTER,
                                    "calls",
                                    "Calls refused at admission: max_calls_per_peer reached.",
                                    "connections",
                                    "calls_refused_peer"};
    return lkv_stats_register(r, &d, 1, peer_stats_read, s, &s->peer_group);
}

static int conn_stats_register(lkv_server *s, lkv_stats *r)
{
    static const lkv_stat_desc d[CONN_STATS] = {
        {"conn_open", "", LKV_STAT_GAUGE, "connections",
         "Connections open now (as of the "
         "accept loop's last sweep).",
         "connections", "open"},
        {"conn_accepted", "", LKV_STAT_COUNTER, "connections", "Connections handed to gRPC.",
         "connections", "accepted"},
        {"conn_refused", "cap=total", LKV_STAT_COUNTER, "connections",
         "Connections closed at once: max_connections reached.", "connections",
         "refused_total_cap"},
        {"conn_refused", "cap=peer", LKV_STAT_COUNTER, "connections",
         "Connections closed at once: max_connections_per_peer reached.", "connections",
         "refused_peer_cap"},
        {"conn_fd_exhausted", "", LKV_STAT_COUNTER, "events",
         "Accepts that failed for lack of descriptors (EMFILE, ENFILE).", "connections",
         "fd_exhausted"},
        {"conn_shed", "", LKV_STAT_COUNTER, "connections",
         "Waiting connections closed while out of descriptors.", "connections", "shed"},
        {"conn_backoffs", "", LKV_STAT_COUNTER, "events",
         "Back-off sleeps of the accept loop (EMFILE, ENFILE, ENOBUFS, ENOMEM).", "connections",
         "backoffs"},
    };
    s->registry = r;
    return lkv_stats_register(r, d, CONN_STATS, conn_stats_read, s, &s->conn_group);
}

static int method_stats_register(lkv_server *s, lkv_stats *r)
{
    static const char *const names[4] = {"rpc_calls", "rpc_errors", "rpc_usec_per_call",
                                         "rpc_usec"};
    static const char *const helps[4] = {"Calls finished.", "Calls finished with a non-OK status.",
                                         "Mean wall time of a finished call.",
                                         "Total wall time of finished calls."};
    static const char *const suffix[3] = {"calls", "errors", "usec_per_call"};
    typedef struct texts {
        char labels[192];  /* service=...,method=... */
        char keys[3][160]; /* Cache.Put.calls, .errors, .usec_per_call */
    } texts;
    int n = s->n_methods;
    if (n == 0) {
        return 0;
    }
    lkv_stat_desc *d = lkv_xcalloc((size_t)n * 4, sizeof(*d));
    texts *tx = lkv_xcalloc((size_t)n, sizeof(*tx));
    for (int i = 0; i < n; i++) {
        /* "/lazykv.v1.Cache/Put": service lazykv.v1.Cache, method Put, short name Cache.Put. */
        const char *path = s->methods[i].path;
        const char *svc = path[0] == '/' ? path + 1 : path;
        const char *slash = strrchr(svc, '/');
        slash = slash != NULL ? slash : svc;
        const char *dot = svc;
        for (const char *q = svc; q < slash; q++) {
            dot = *q == '.' ? q + 1 : dot;
        }
        snprintf(tx[i].labels, sizeof(tx[i].labels), "service=%.*s,method=%s", (int)(slash - svc),
                 svc, slash + 1);
        for (int k = 0; k < 4; k++) {
            lkv_stat_desc *e = &d[4 * i + k];
            e->name = names[k];
            e->labels = tx[i].labels;
            e->kind = k == 2 ? LKV_STAT_GAUGE : LKV_STAT_COUNTER;
            e->unit = k < 2 ? "calls" : "us";
            e->help = helps[k];
            if (k < 3) {
                snprintf(tx[i].keys[k], sizeof(tx[i].keys[k]), "%.*s.%s.%s", (int)(slash - dot),
                         dot, slash + 1, suffix[k]);
                e->section = "calls";
                e->key = tx[i].keys[k];
            }
        }
    }
    int rc = lkv_stats_register(r, d, 4 * n, method_stats_read, s, &s->stats_group);
    if (rc == 0) {
        s->registry = r;
        /* Latency histograms, one per method (Prometheus: lazykv_rpc_duration_seconds). */
        static const uint64_t bounds_us[] = {50,     100,     250,     500,     1000,    2500,
                                             5000,   10000,   25000,   50000,   100000,  250000,
                                             500000, 1000000, 2500000, 5000000, 10000000};
        for (int i = 0; i < n; i++) {
            d[i] = (lkv_stat_desc){.name = "rpc_duration",
                                   .labels = tx[i].labels,
                                   .kind = LKV_STAT_HISTOGRAM,
                                   .unit = "us",
                                   .help = "Wall time of finished calls, from arrival to the "
                                           "final status."};
        }
        lkv_stat_group *hg = NULL;
        rc = lkv_stats_register_hist(r, d, n, bounds_us,
                                     (int)(sizeof(bounds_us) / sizeof(bounds_us[0])), &hg);
        atomic_store(&s->hist_group, hg);
    }
    free(tx);
    free(d);
    return rc;
}

/* lkv_listener's hand-off (the accept thread): remember the peer of descriptor fd, then give
 * the connection to the core. */
static int on_conn(void *ctx, int fd, const struct sockaddr *peer, socklen_t len)
{
    (void)len;
    lkv_server *s = ctx;
    if (atomic_load(&s->draining)) {
        return LKV_ESHUTDOWN;
    }
    char host[INET6_ADDRSTRLEN] = "?", str[PEER_MAX];
    int port = 0;
    if (peer->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)peer;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        port = ntohs(a->sin_port);
        snprintf(str, sizeof(str), "ipv4:%s:%d", host, port);
    } else {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)peer;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        port = ntohs(a->sin6_port);
        snprintf(str, sizeof(str), "ipv6:[%s]:%d", host, port);
    }
    pthread_mutex_lock(&s->peer_mu);
    if ((size_t)fd >= s->n_peers) {
        size_t n = s->n_peers != 0 ? s->n_peers : 1024;
        while (n <= (size_t)fd) {
            n *= 2;
        }
        s->peers = lkv_xrealloc(s->peers, n * PEER_MAX);
        memset(s->peers + s->n_peers, 0, (n - s->n_peers) * PEER_MAX);
        s->n_peers = n;
    }
    memcpy(s->peers[fd], str, PEER_MAX);
    pthread_mutex_unlock(&s->peer_mu);
    grpc_server_add_channel_from_fd(s->server, fd, s->fd_creds); /* Takes fd. */
    return 0;
}

/* ---- TLS listener ---------------------------------------------------------------------- */

static int same_stat(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Under t->mu: if any file changed since the last attempt (or force), loads all of them into
 * t->pending. Returns 1 (loaded), 0 (unchanged), LKV_ECONFIG (why; nothing loaded). */
static int tls_load_locked(tls_state *t, int force, char *why, size_t len)
{
    struct stat now[3];
    int changed = force;
    memset(now, 0, sizeof(now));
    for (int i = 0; i < 3; i++) {
        if (t->paths[i] == NULL) {
            continue;
        }
        if (stat(t->paths[i], &now[i]) != 0) {
            snprintf(why, len, "cannot stat %s: %s", t->paths[i], strerror(errno));
            return LKV_ECONFIG;
        }
        changed |= !same_stat(&now[i], &t->st[i]);
    }
    if (!changed) {
        return 0;
    }
    char *pem[3] = {NULL, NULL, NULL};
    int rc = 1;
    for (int i = 0; i < 3 && rc == 1; i++) {
        if (t->paths[i] != NULL && (pem[i] = lkv_tls_read_pem(t->paths[i], why, len)) == NULL) {
            rc = LKV_ECONFIG;
        }
    }
    char subject[256], bad[256];
    time_t not_after = 0;
    if (rc == 1 && lkv_tls_check(pem[0], pem[1], pem[2], subject, sizeof(subject), &not_after, bad,
                                 sizeof(bad)) != 0) {
        snprintf(why, len, "%s / %s%s%s: %s", t->paths[0], t->paths[1],
                 t->paths[2] != NULL ? " / " : "", t->paths[2] != NULL ? t->paths[2] : "", bad);
        rc = LKV_ECONFIG;
    }
    if (rc != 1) {
        t->failures++;
    }
    if (rc == 1) {
        t->not_after = not_after;
        char until[32];
        struct tm tm;
        gmtime_r(&not_after, &tm);
        strftime(until, sizeof(until), "%Y-%m-%dT%H:%M:%SZ", &tm);
        LKV_LOGI("tls: certificate %s valid until %s", subject, until);
        grpc_ssl_pem_key_cert_pair pair = {.private_key = pem[1], .cert_chain = pem[0]};
        /* gRPC 1.51 asserts pem_root_certs != NULL for every config a fetcher returns
         * (ssl_security_connector.cc, try_replace_server_handshaker_factory), also when no
         * client certificate is requested; the roots are then never consulted, so without a
         * client CA the server's own chain stands in. */
        grpc_ssl_server_certificate_config *c =
            grpc_ssl_server_certificate_config_create(pem[2] != NULL ? pem[2] : pem[0], &pair, 1);
        if (t->pending != NULL) {
            grpc_ssl_server_certificate_config_destroy(t->pending);
        }
        t->pending = c;
        atomic_fetch_add(&t->generation, 1);
    }
    memcpy(t->st, now, sizeof(now)); /* A file that failed is retried once it changes again. */
    for (int i = 0; i < 3; i++) {
        if (pem[i] != NULL) {
            explicit_bzero(pem[i], strlen(pem[i])); /* The key: do not leave it in the heap. */
            free(pem[i]);
        }
    }
    return rc;
}

/* Logs the outcome of a load attempt (t->mu held): a problem once until it changes (not at
 * every handshake while a file stays bad or missing), unless always. */
static void tls_report_locked(tls_state *t, int rc, const char *why, int always)
{
    if (rc < 0 && (always || strcmp(why, t->last_why) != 0)) {
        LKV_LOGW("tls: keeping the current certificate: %s", why);
        snprintf(t->last_why, sizeof(t->last_why), "%s", why);
    } else if (rc == 1) {
        LKV_LOGI("tls: loaded certificate %s (generation %lu); new connections use it", t->paths[0],
                 atomic_load(&t->generation));
        t->last_why[0] = '\0';
    }
}

/* gRPC's certificate fetcher: runs at every handshake (and once when the port is added). */
static grpc_ssl_certificate_config_reload_status tls_fetch(void *user_data,
                                                           grpc_ssl_server_certificate_config **c)
{
    tls_state *t = user_data;
    char why[512];
    pthread_mutex_lock(&t->mu);
    int rc = tls_load_locked(t, 0, why, sizeof(why));
    tls_report_locked(t, rc, why, 0);
    grpc_ssl_certificate_config_reload_status st = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
    if (t->pending != NULL) {
        *c = t->pending; /* gRPC owns it now. */
        t->pending = NULL;
        st = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

static void tls_free(tls_state *t)
{
    if (t == NULL) {
        return;
    }
    for (int i = 0; i < 3; i++) {
        free(t->paths[i]);
    }
    if (t->pending != NULL) {
        grpc_ssl_server_certificate_config_destroy(t->pending);
    }
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* Makes the server's TLS credentials over a certificate fetcher (see lkv_tls_opts), once: the
 * state lives in s->tls until destroy. Returns the credentials (the caller releases them), or
 * NULL with err set if the files cannot be used. Whoever adds a TLS listener (a port here, or
 * an accepted descriptor with grpc_server_add_channel_from_fd) uses these. */
static grpc_server_credentials *tls_credentials(lkv_server *s, const lkv_tls_opts *o, char *err,
                                                size_t errlen)
{
    tls_state *t = lkv_xcalloc(1, sizeof(*t));
    pthread_mutex_init(&t->mu, NULL);
    const char *src[3] = {o->cert_file, o->key_file, o->client_ca_file};
    for (int i = 0; i < 3; i++) {
        if (src[i] != NULL && src[i][0] != '\0') {
            t->paths[i] = strdup(src[i]);
            if (t->paths[i] == NULL) {
                lkv_panic("out of memory (tls paths)");
            }
        }
    }
    char why[512];
    if (t->paths[0] == NULL || t->paths[1] == NULL) {
        snprintf(err, errlen, "TLS needs a certificate and a key file");
        tls_free(t);
        return NULL;
    }
    if (tls_load_locked(t, 1, why, sizeof(why)) != 1) {
        snprintf(err, errlen, "TLS: %s", why);
        tls_free(t);
        return NULL;
    }
    s->tls = t;
    grpc_ssl_client_certificate_request_type req =
        t->paths[2] != NULL ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                            : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
    grpc_ssl_server_credentials_options *so =
        grpc_ssl_server_credentials_create_options_using_config_fetcher(req, tls_fetch, t);
    return grpc_ssl_server_credentials_create_with_options(so);
}

/* Binds listen with the TLS credentials (tls_credentials). Returns the port, 0 if the address
 * cannot be bound, or LKV_ECONFIG (err) if the files cannot be used. */
static int add_listener_tls(lkv_server *s, const char *listen, const lkv_tls_opts *o, char *err,
                            size_t errlen)
{
    grpc_server_credentials *creds = tls_credentials(s, o, err, errlen);
    if (creds == NULL) {
        return LKV_ECONFIG;
    }
    tls_state *t = s->tls;
    int port = grpc_server_add_http2_port(s->server, listen, creds);
    grpc_server_credentials_release(creds);
    if (port == 0 && t->pending != NULL) {
        snprintf(err, errlen, "TLS: gRPC refused the certificate or key in %s / %s", t->paths[0],
                 t->paths[1]);
        return LKV_ECONFIG;
    }
    return port;
}

int lkv_server_tls_check(lkv_server *s)
{
    if (s->tls == NULL) {
        return 0;
    }
    char why[512];
    tls_state *t = s->tls;
    pthread_mutex_lock(&t->mu);
    int rc = tls_load_locked(t, 0, why, sizeof(why));
    tls_report_locked(t, rc, why, 1); /* Asked for (SIGHUP): always say. */
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* Registry read fn of the TLS stats (ctx: the tls_state). */
static void tls_stats_read(void *ctx, double *v, int n)
{
    tls_state *t = ctx;
    pthread_mutex_lock(&t->mu);
    if (n >= 3) {
        v[0] = (double)t->not_after;
        v[1] = (double)atomic_load(&t->generation);
        v[2] = (double)t->failures;
    }
    pthread_mutex_unlock(&t->mu);
}

static void tls_stats_register(lkv_server *s, lkv_stats *r)
{
    static const lkv_stat_desc d[3] = {
        {"tls_cert_not_after_timestamp_seconds", NULL, LKV_STAT_GAUGE, NULL,
         "Expiry (Unix time) of the TLS certificate in service.", "tls", "cert_not_after"},
        {"tls_cert_loads", NULL, LKV_STAT_COUNTER, NULL,
         "TLS certificates loaded (1 at start, +1 per renewal taken).", "tls", "cert_loads"},
        {"tls_cert_load_failures", NULL, LKV_STAT_COUNTER, NULL,
         "Changed TLS files that could not be used (the previous certificate stayed).", "tls",
         "cert_load_failures"},
    };
    if (s->tls == NULL) {
        return;
    }
    if (lkv_stats_register(r, d, 3, tls_stats_read, s->tls, &s->tls->group) != 0) {
        LKV_LOGW("tls: statistics not registered");
    }
    s->registry = r;
}

unsigned long lkv_server_tls_generation(const lkv_server *s)
{
    return s->tls != NULL ? atomic_load(&s->tls->generation) : 0;
}

int lkv_server_create(const lkv_server_opts *opts, const lkv_method *methods, int n,
                      lkv_server **out, char *err, size_t errlen)
{
    if (opts == NULL || opts->listen == NULL || opts->threads < 1 || n < 0 ||
        opts->pool_threads < 0 || opts->pool_threads > 1024 || opts->max_message_bytes < 1024 ||
        opts->max_message_bytes > INT32_MAX) {
        snprintf(err, errlen, "bad server options");
        return LKV_EINVAL;
    }
    grpc_init();
    int fail_rc = LKV_EIO;
    lkv_server *s = lkv_xcalloc(1, sizeof(*s));
    s->methods = methods;
    s->n_methods = n;
    s->max_msg = opts->max_message_bytes;
    s->n_workers = opts->threads;
    s->admit = opts->admit;
    s->admit_ctx = opts->admit_ctx;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->park_mu, NULL);
    pthread_mutex_init(&s->peer_mu, NULL);
    pthread_mutex_init(&s->calls_mu, NULL);
    s->max_calls_per_peer = opts->max_calls_per_peer;
    pthread_mutex_init(&s->pool_mu, NULL);
    pthread_cond_init(&s->pool_cv, NULL);
    s->n_pool = opts->pool_threads;
    const char *fd = getenv("LKV_FAULT_POOL_DELAY_MS");
    s->fault_job_delay_ms = fd != NULL ? atoi(fd) : 0;
    if (s->fault_job_delay_ms > 0) {
        LKV_LOGW("fault injection: every pool job sleeps %d ms first (LKV_FAULT_POOL_DELAY_MS)",
                 s->fault_job_delay_ms);
    }

    grpc_arg args[6];
    memset(args, 0, sizeof(args));
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)s->max_msg;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = (int)s->max_msg;
    /* Two daemons must not silently share a port (gRPC sets SO_REUSEPORT by default). */
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = (char *)GRPC_ARG_ALLOW_REUSEPORT;
    args[2].value.integer = 0;
    size_t n_args = 3;
    if (opts->tls != NULL) {
        /* gRPC's own listener serves TLS: the limits it has (see lkv_server_opts). */
        const struct {
            const char *key;
            uint64_t v;
        } lim[] = {{GRPC_ARG_MAX_CONCURRENT_STREAMS, opts->tls_max_streams},
                   {GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, opts->tls_handshake_timeout_ms},
                   {GRPC_ARG_MAX_CONNECTION_IDLE_MS, opts->tls_idle_timeout_ms}};
        for (size_t i = 0; i < sizeof(lim) / sizeof(lim[0]); i++) {
            if (lim[i].v != 0) {
                args[n_args].type = GRPC_ARG_INTEGER;
                args[n_args].key = (char *)lim[i].key;
                args[n_args].value.integer = lim[i].v > INT32_MAX ? INT32_MAX : (int)lim[i].v;
                n_args++;
            }
        }
    }
    grpc_channel_args cargs = {n_args, args};
    s->server = grpc_server_create(&cargs, NULL);

    s->handles = lkv_xcalloc((size_t)(n > 0 ? n : 1), sizeof(void *));
    s->stats = lkv_xcalloc((size_t)(n > 0 ? n : 1), sizeof(method_stats));
    for (int i = 0; i < n; i++) {
        grpc_server_register_method_payload_handling ph =
            methods[i].kind == LKV_RPC_CLIENT_STREAM ? GRPC_SRM_PAYLOAD_NONE
                                                     : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER;
        s->handles[i] = grpc_server_register_method(s->server, methods[i].path, NULL, ph, 0);
        if (s->handles[i] == NULL) {
            snprintf(err, errlen, "cannot register method %s", methods[i].path);
            goto fail_server;
        }
    }
    s->workers = lkv_xcalloc((size_t)s->n_workers, sizeof(worker));
    for (int i = 0; i < s->n_workers; i++) {
        s->workers[i].srv = s;
        s->workers[i].index = i;
        s->workers[i].cq = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(s->server, s->workers[i].cq, NULL);
    }
    if (opts->tls != NULL) {
        /* TLS: gRPC 1.51 serves it only through its own listener (grpc_server_add_channel_from_fd
         * takes insecure credentials only), so a TLS port has gRPC's limits, not ours. */
        s->port = add_listener_tls(s, opts->listen, opts->tls, err, errlen);
        if (s->port < 0) {
            int rc = s->port;
            s->port = 0;
            fail_rc = rc; /* err says why. */
            goto fail_cqs;
        }
    } else if (opts->grpc_listener) {
        /* The core's own plaintext listener (diagnosis: no caps, no EMFILE recovery). */
        grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
        s->port = grpc_server_add_http2_port(s->server, opts->listen, creds);
        grpc_server_credentials_release(creds);
    } else {
        lkv_listener_opts lo = {.listen = opts->listen,
                                .max_conns = opts->max_conns,
                                .max_conns_per_peer = opts->max_conns_per_peer,
                                .loopback_parity = 1,
                                .on_conn = on_conn,
                                .ctx = s};
        if (lkv_listener_create(&lo, &s->listener, err, errlen) != 0) {
            goto fail_cqs;
        }
        s->port = lkv_listener_port(s->listener);
        s->fd_creds = grpc_insecure_server_credentials_create();
    }
    if (s->port == 0) {
        snprintf(err, errlen, "option 'listen': cannot bind %s (address in use or invalid)",
                 opts->listen);
        goto fail_cqs;
    }
    const char *colon = strrchr(opts->listen, ':');
    int hostlen = colon != NULL ? (int)(colon - opts->listen) : (int)strlen(opts->listen);
    snprintf(s->address, sizeof(s->address), "%.*s:%d", hostlen, opts->listen, s->port);
    grpc_server_start(s->server);

    for (int i = 0; i < s->n_workers; i++) {
        worker *w = &s->workers[i];
        for (int mi = 0; mi < n; mi++) {
            for (int k = 0; k < ARMED; k++) {
                arm(s, w, mi);
            }
        }
        for (int k = 0; k < ARMED_GENERIC; k++) {
            arm(s, w, -1);
        }
    }
    /* The wake-up channel and the pool exist before any callback can park a call. */
    s->lame = grpc_lame_client_channel_create(NULL, GRPC_STATUS_UNAVAILABLE, "lazykvd wake-up");
    s->pool = lkv_xcalloc((size_t)(s->n_pool > 0 ? s->n_pool : 1), sizeof(pthread_t));
    for (int i = 0; i < s->n_pool; i++) {
        int e = pthread_create(&s->pool[i], NULL, pool_main, s);
        if (e != 0) {
            lkv_panic("pthread_create: %s", strerror(e));
        }
    }
    for (int i = 0; i < s->n_workers; i++) {
        int e = pthread_create(&s->workers[i].thread, NULL, worker_main, &s->workers[i]);
        if (e != 0) {
            lkv_panic("pthread_create: %s", strerror(e));
        }
        s->workers[i].started = 1;
    }
    if (s->listener != NULL) {
        lkv_listener_start(s->listener); /* Calls can be served now: hand connections over. */
    }
    if (opts->stats != NULL) {
        tls_stats_register(s, opts->stats);
        int rc = method_stats_register(s, opts->stats);
        if (rc == 0 && s->listener != NULL) {
            rc = conn_stats_register(s, opts->stats);
        }
        if (rc == 0) {
            rc = peer_stats_register(s, opts->stats);
        }
        if (rc != 0) {
            snprintf(err, errlen, "cannot register the per-method stats: %s", lkv_strerror(rc));
            lkv_server_destroy(s);
            return rc;
        }
    }
    *out = s;
    return 0;

fail_cqs:
    /* Not started: no calls exist. Shut the server down on worker 0's queue (registered with
     * it; polled here with next, as it was created for next), then drain every queue. */
    grpc_server_shutdown_and_notify(s->server, s->workers[0].cq, &s->shutdown_tag);
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(s->workers[0].cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_OP_COMPLETE && ev.tag == &s->shutdown_tag) {
            break;
        }
    }
    grpc_server_destroy(s->server);
    s->server = NULL;
    for (int i = 0; i < s->n_workers; i++) {
        grpc_completion_queue_shutdown(s->workers[i].cq);
        while (
            grpc_completion_queue_next(s->workers[i].cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
                .type != GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(s->workers[i].cq);
    }
fail_server:
    if (s->server != NULL) {
        grpc_server_destroy(s->server);
    }
    lkv_listener_destroy(s->listener);
    if (s->fd_creds != NULL) {
        grpc_server_credentials_release(s->fd_creds);
    }
    pthread_mutex_destroy(&s->peer_mu);
    pthread_mutex_destroy(&s->calls_mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->park_mu);
    pthread_mutex_destroy(&s->pool_mu);
    pthread_cond_destroy(&s->pool_cv);
    free(s->workers);
    free(s->handles);
    free(s->stats);
    tls_free(s->tls);
    free(s);
    grpc_shutdown();
    return fail_rc;
}

int lkv_server_method_stats(const lkv_server *s, int i, const char **path, uint64_t *calls,
                            uint64_t *errors, uint64_t *usec)
{
    if (i < 0 || i >= s->n_methods) {
        return LKV_EINVAL;
    }
    *path = s->methods[i].path;
    *calls = atomic_load(&s->stats[i].calls);
    *errors = atomic_load(&s->stats[i].errors);
    *usec = atomic_load(&s->stats[i].usec);
    return 0;
}

long lkv_server_calls_in_flight(const lkv_server *s)
{
    return atomic_load(&((lkv_server *)s)->n_calls);
}

const char *lkv_server_address(const lkv_server *s)
{
    return s->address;
}

int lkv_server_port(const lkv_server *s)
{
    return s->port;
}

int lkv_server_draining(const lkv_server *s)
{
    return atomic_load(&((lkv_server *)s)->draining);
}

/* Waits until the shutdown tag arrived and no context is left, or until deadline (monotonic;
 * NULL: forever). Returns 1 if done. Called with s->mu held. */
static int wait_drained(lkv_server *s, const struct timespec *deadline)
{
    while (!(s->shutdown_done && atomic_load(&s->n_ctx) == 0)) {
        if (deadline == NULL) {
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t);
            t.tv_sec += 5;
            if (pthread_cond_timedwait(&s->cv, &s->mu, &t) == ETIMEDOUT) {
                LKV_LOGW("shutdown: still waiting for %ld call(s) to end",
                         atomic_load(&s->n_calls));
            }
        } else if (pthread_cond_timedwait(&s->cv, &s->mu, deadline) == ETIMEDOUT) {
            return s->shutdown_done && atomic_load(&s->n_ctx) == 0;
        }
    }
    return 1;
}

void lkv_server_shutdown(lkv_server *s, uint64_t grace_ms)
{
    if (s == NULL || s->shut) {
        return;
    }
    atomic_store(&s->draining, 1);
    LKV_LOGI("shutdown: refusing new calls; %ld in flight get %.1fs to finish",
             atomic_load(&s->n_calls), (double)grace_ms / 1000.0);
    lkv_listener_stop(s->listener); /* No new connection from here on. */
    TSAN_RELEASE(&s->shutdown_tag);
    grpc_server_shutdown_and_notify(s->server, s->workers[0].cq, &s->shutdown_tag);
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += (time_t)(grace_ms / 1000);
    dl.tv_nsec += (long)(grace_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->mu);
    /* First the calls in flight (up to the grace); once none is left, cancel_all_calls drops
     * the idle connections too, so the shutdown tag need not wait for their GOAWAYs. */
    int calls_done = 1;
    while (atomic_load(&s->n_calls) > 0) {
        if (pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT) {
            calls_done = atomic_load(&s->n_calls) == 0;
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (calls_done) {
        grpc_server_cancel_all_calls(s->server); /* None in flight: closes idle connections. */
    }
    pthread_mutex_lock(&s->mu);
    int done = wait_drained(s, &dl);
    pthread_mutex_unlock(&s->mu);
    if (!done) {
        LKV_LOGW("shutdown: grace period over, cancelling %ld call(s)", atomic_load(&s->n_calls));
        grpc_server_cancel_all_calls(s->server);
        pthread_mutex_lock(&s->mu);
        wait_drained(s, NULL);
        pthread_mutex_unlock(&s->mu);
    }
    /* No call is left, so no job is queued or running: stop the pool. */
    pthread_mutex_lock(&s->pool_mu);
    s->pool_stop = 1;
    pthread_cond_broadcast(&s->pool_cv);
    pthread_mutex_unlock(&s->pool_mu);
    for (int i = 0; i < s->n_pool; i++) {
        pthread_join(s->pool[i], NULL);
    }
    s->n_pool = 0;
    LKV_LOGI("shutdown: all calls ended; stopping %d polling thread(s)", s->n_workers);
    for (int i = 0; i < s->n_workers; i++) {
        grpc_completion_queue_shutdown(s->workers[i].cq);
    }
    for (int i = 0; i < s->n_workers; i++) {
        if (s->workers[i].started) {
            pthread_join(s->workers[i].thread, NULL);
            s->workers[i].started = 0;
        }
    }
    s->shut = 1;
}

void lkv_server_destroy(lkv_server *s)
{
    if (s == NULL) {
        return;
    }
    lkv_stats_unregister(s->registry, s->stats_group); /* No method_stats_read after this. */
    lkv_stats_unregister(s->registry, s->conn_group);  /* Nor conn_stats_read. */
    lkv_stats_unregister(s->registry, s->peer_group);  /* Nor peer_stats_read. */
    if (s->tls != NULL && s->tls->group != NULL) {
        lkv_stats_unregister(s->registry, s->tls->group);
        s->tls->group = NULL;
    }
    lkv_server_shutdown(s, 0);
    lkv_stats_unregister(s->registry, atomic_load(&s->hist_group)); /* No call ends any more. */
    grpc_server_destroy(s->server);
    lkv_listener_destroy(s->listener);
    if (s->fd_creds != NULL) {
        grpc_server_credentials_release(s->fd_creds);
    }
    free(s->peers);
    pthread_mutex_destroy(&s->peer_mu);
    for (int b = 0; b < PEER_BUCKETS; b++) {
        assert(s->buckets[b] == NULL); /* Every context was freed, so every call uncounted. */
    }
    pthread_mutex_destroy(&s->calls_mu);
    grpc_channel_destroy(s->lame);
    for (int i = 0; i < s->n_workers; i++) {
        grpc_completion_queue_destroy(s->workers[i].cq);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->park_mu);
    pthread_mutex_destroy(&s->pool_mu);
    pthread_cond_destroy(&s->pool_cv);
    free(s->slots);
    free(s->pool);
    free(s->workers);
    free(s->handles);
    free(s->stats);
    tls_free(s->tls);
    free(s);
    grpc_shutdown();
}
