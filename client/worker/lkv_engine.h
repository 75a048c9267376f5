/*
 * lkv_engine.h: the decode worker's serving engine: many RAG requests in flight on one worker
 * (lkv_worker.h), scheduled by one engine thread with continuous batching.
 *
 * Each loop iteration of the engine thread:
 *   1. ends every request that was cancelled or whose deadline passed: its job is failed
 *      (LKV_ECANCELLED / LKV_ETIMEDOUT), its lease released and its worker pages returned to
 *      the free list at once, before any more compute;
 *   2. admits queued requests in arrival order (FIFO, no overtaking, so none starves) while
 *      fewer than max_batch are running and the head's worst-case pages
 *      (lkv_worker_pages_needed) fit in the free list: the pages are granted to that request
 *      alone (its KV lives there: misses, question, generated tokens), and its Lookup, Attach
 *      and Reserve are queued to the client-call thread (the request waits for them; nothing
 *      else does);
 *   3. runs prefill of the running requests that are prefilling, oldest first: prefill_units
 *      units (one missing document, or one question; with the worker's prefill_chunk, one
 *      chunk of at most that many tokens of one of them), or, with prefill_tokens set, units
 *      while the step's token budget lasts (chunked prefill, as vLLM and Sarathi-Serve
 *      schedule it: the step's decode rows plus the tokens prefilled stay within
 *      prefill_tokens, going on to the next prefilling request when one's prefill is done; at
 *      least one unit runs per step, so prefill always advances);
 *   4. runs ONE decode step batched across every running request that is decoding
 *      (lkv_worker_decode_batch: one pass of every dense op over the batch's rows);
 *   5. publishes the new tokens, and finishes the requests that are done: their pages go
 *      back at once, their Commit / Put and Release run on the client-call thread, and their
 *      end is published when those are back.
 * Every daemon call (also lease renewals, at half the TTL) runs on that one client-call thread,
 * never on the engine thread: a slow or stopped daemon delays the requests that wait for a
 * call, while decode steps of the others go on (integration.worker_fallbacks).
 * So decode never waits for a whole prefill queue, and a long prefill is split into documents,
 * or, with the worker's prefill_chunk, into chunks (a decoding request then waits at most one
 * budget's worth of prefill between two of its tokens, not a whole document's).
 * On the CPU backend every row is computed independently, so a request's tokens do not depend
 * on what it was batched with (greedy: exactly its solo tokens; sampling: its own rng); chunk
 * boundaries are the worker's (fixed multiples of prefill_chunk in each segment), not the
 * budget's, so they do not depend on the schedule either.
 *
 * Limits: max_batch requests running (prefilling or decoding) at once, hence at most max_batch
 * in a decode step; kv_pages worker pages for the KV of running requests; max_queue requests
 * waiting. A request that could never fit (needs more than kv_pages) is refused at submit with
 * LKV_ENOSPC; a full queue refuses with LKV_ENOSPC too (its message says so: retry later).
 *
 * Output: each request has an event queue (tokens, then one end event) read by its submitter
 * with lkv_engine_next from any thread; notify(arg, last) is called on the engine thread, with
 * no engine lock held, whenever events were added (it must not block: the gRPC service resumes
 * its parked call there); last is 1 on the call after the END event, and notify is never called
 * again for that request, so arg must live until then (and may be freed by it).
 *
 * Ownership: the engine borrows the worker (only the engine thread uses it while the engine
 * runs). A request handle is shared by the submitter and the engine: lkv_engine_release drops
 * the submitter's part (cancelling the request if it has not ended); the engine drops its own
 * at the end event. The result (lkv_engine_result) is readable after the end event until
 * release.
 */
#ifndef LKV_ENGINE_H
#define LKV_ENGINE_H

#include <stdint.h>

#include "lkv_request.h"
#include "lkv_worker.h"

typedef struct lkv_engine lkv_engine;         /* Opaque. */
typedef struct lkv_engine_req lkv_engine_req; /* Opaque: one request in the engine. */

typedef struct lkv_engine_opts {
    int max_batch;      /* Requests running at once (and so per decode step); 0: 16. */
    uint32_t kv_pages;  /* Worker pages for in-flight KV; 0 or more than the worker has: all. */
    int max_queue;      /* Requests waiting for admission at most; 0: 1024. */
    int prefill_units;  /* Prefill units between two decode steps; 0: 1 (prefill_tokens 0). */
    int prefill_tokens; /* Token budget of a step (decode rows + prefilled tokens), > 0: used
                           instead of prefill_units; 0: prefill_units. */
    int fuse_decode;    /* 1: the step's decode rows ride along its first prefill pass (one
                           forward over the chunk's and the decoding requests' rows,
                           lkv_worker_job_prefill_ride) instead of a decode pass of their own;
                           tokens unchanged. 0: a decode pass after the prefill units. */
} lkv_engine_opts;

/* Engine totals. */
typedef struct lkv_engine_stats {
    uint64_t submitted, finished, failed, cancelled, expired, refused;
    uint64_t decode_steps;    /* Batched decode steps (fused ones included). */
    uint64_t fused_steps;     /* Decode steps that rode along a prefill pass (fuse_decode). */
    uint64_t decode_tokens;   /* Sum of their batch sizes. */
    uint64_t prefill_units;   /* Prefill units run (chunks with the worker's prefill_chunk). */
    uint64_t prefill_tokens;  /* Tokens they prefilled. */
    uint64_t max_step_tokens; /* Largest step: its decode rows + prefilled tokens. */
    int max_batch_seen;       /* Largest decode batch run. */
    int running, queued;      /* Now. */
    uint32_t pages_free;      /* Now. */
    uint32_t pages_total;     /* The in-flight KV limit, pages. */
    uint32_t max_pages_used;  /* High-water mark of pages granted. */
    int max_running_seen;     /* High-water mark of running requests. */
} lkv_engine_stats;

enum lkv_engine_event_kind {
    LKV_ENGINE_TOKEN = 1, /* One generated token. */
    LKV_ENGINE_END = 2,   /* The end: rc and (rc 0 or not) the result. */
};

typedef struct lkv_engine_event {
    int kind;      /* enum lkv_engine_event_kind. */
    int index;     /* TOKEN: 0, 1, ... */
    int token;     /* TOKEN: id. */
    char text[64]; /* TOKEN: its text (truncated to 63 bytes), "" without a tokenizer. */
    int rc;        /* END: 0 or the LKV_E* error. */
} lkv_engine_event;

/* What the engine adds to a request's lkv_rag_result. */
typedef struct lkv_engine_result {
    const lkv_rag_result *res; /* Borrowed until release. res->error says why on failure. */
    const char *id;            /* The request's id (borrowed). */
    double queue_ms;           /* Waiting for admission. */
    int max_batch_seen;        /* Largest decode batch it took part in. */
    uint32_t kv_pages;         /* Pages it was granted. */
} lkv_engine_result;

/* Starts the engine thread over w (borrowed: no one else may use w until destroy). Returns 0 or
 * LKV_EINVAL (bad options). *out is the caller's (lkv_engine_destroy). */
int lkv_engine_create(lkv_worker *w, const lkv_engine_opts *o, lkv_engine **out);

/* Stops the thread: every request still queued or running ends with LKV_ECANCELLED ("worker
 * shutting down"), then frees the engine. Handles not yet released stay valid until released.
 * NULL is fine. */
void lkv_engine_destroy(lkv_engine *e);

/* Submits req (taken: the engine frees it; the caller must not touch it again, also on error).
 * deadline_ms: milliseconds from now (<= 0: none). notify (may be NULL) and arg: see above;
 * not called at all when submit fails.
 * Returns 0 and *out, or LKV_ENOSPC (it can never fit, or the queue is full), LKV_ESHUTDOWN;
 * on error *out is NULL and msg (len bytes, may be NULL) says why. */
int lkv_engine_submit(lkv_engine *e, lkv_request *req, int64_t deadline_ms,
                      void (*notify)(void *arg, int last), void *arg, lkv_engine_req **out,
                      char *msg, size_t len);

/* Takes the next event of r into *ev: returns 1, or 0 if none is ready yet. After the END event
 * it returns 0 forever. Thread-safe. */
int lkv_engine_next(lkv_engine_req *r, lkv_engine_event *ev);

/* Blocks until the next event is ready (or timeout_ms passes, < 0: forever): returns as next. */
int lkv_engine_wait(lkv_engine_req *r, lkv_engine_event *ev, int timeout_ms);

/* Asks the engine to end r with LKV_ECANCELLED (its slot and pages are freed at the engine's
 * next iteration, before more compute). No-op once ended. Thread-safe. */
void lkv_engine_cancel(lkv_engine_req *r);

/* The result, valid after the END event was taken, until release. */
void lkv_engine_result_get(lkv_engine_req *r, lkv_engine_result *out);

/* Drops the submitter's reference (cancels r unless it ended). NULL is fine. */
void lkv_engine_release(lkv_engine_req *r);

/* Fills *st. Thread-safe. */
void lkv_engine_stats_get(lkv_engine *e, lkv_engine_stats *st);

#endif
