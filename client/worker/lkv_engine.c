/*
 * lkv_engine.c: the serving engine (see lkv_engine.h).
 *
 * Threads and locks. The engine thread alone touches the worker, the jobs and the running list.
 * e->mu guards the queue, the free page list, stop and the statistics; r->mu guards one
 * request's event queue, its cancel flag and its reference count. Lock order: e->mu before
 * r->mu; notify callbacks run with neither held.
 *
 * Pages: the free list holds worker-page indices (0 .. kv_pages-1, relative to the worker's
 * own pages); a request takes exactly lkv_worker_pages_needed of them at admission and gives
 * them back when its compute ends (before its END call: what a Put needs is copied out first),
 * whatever ended it.
 *
 * Daemon calls never run on the engine thread (lkv_worker_set_async): after each step the
 * engine takes the call each job needs (START after admission, RENEW at the lease's half-life,
 * END when it is done) and queues it to the client-call thread, which makes the calls one at a
 * time, in order, and hands each back on a completion list; the engine applies them at the top
 * of its next iteration. A job with a call in flight is skipped by the scheduler (START: it
 * waits; RENEW: it keeps decoding meanwhile) and is not ended until its call is back, so a slow
 * or stopped daemon delays only the requests that wait for it: decode steps of the others go on.
 * e->cmu guards the call queue and the completion list (taken alone, or after e->mu, never
 * before it).
 */
#include "lkv_engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lkv_err.h"
#include "lkv_log.h"

#define DEFAULT_MAX_BATCH 16
#define DEFAULT_MAX_QUEUE 1024
#define IDLE_WAIT_MS      20

struct lkv_engine_req {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;             /* Submitter + engine. */
    lkv_request *req;     /* Owned. */
    lkv_rag_result res;   /* Owned (freed with the request). */
    lkv_worker_job *job;  /* Engine thread only; NULL before admission / after finish. */
    uint32_t *pages;      /* Granted worker pages (owned), n_pages of them. */
    uint32_t need;        /* lkv_worker_pages_needed. */
    double t_arrive;      /* lkv_worker_now_ms at submit. */
    double deadline;      /* Absolute ms, 0: none. */
    int cancel;           /* Asked to cancel. */
    int ended;            /* END queued. */
    lkv_engine_event *ev; /* Event ring: ev[head .. n_ev). */
    int n_ev, cap_ev, head;
    int published;   /* Tokens published. */
    size_t text_pub; /* Bytes of res.text published. */
    void (*notify)(void *arg, int last);
    void *arg;
    double queue_ms;
    int max_batch_seen;
    lkv_engine_req *next;      /* Queue link. */
    int call;                  /* The call queued or in flight (enum lkv_job_call). */
    lkv_engine_req *call_next; /* Call queue / completion list link. */
};

struct lkv_engine {
    lkv_worker *w;
    lkv_engine_opts o;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    lkv_engine_req *q_head, *q_tail; /* Waiting, FIFO. */
    uint32_t *free_pages;
    uint32_t n_free;
    lkv_engine_req **running; /* Engine thread only: [o.max_batch]. */
    int n_running;
    lkv_worker_job **jobs_buf; /* Engine thread only: [o.max_batch] decode batch scratch. */
    lkv_engine_req **reqs_buf; /* Likewise. */
    int n_ending;              /* Engine thread only: requests whose END call is pending. */
    int n_inflight;            /* Engine thread only: calls queued or in flight. */
    pthread_t call_th;         /* The client-call thread. */
    pthread_mutex_t cmu;
    pthread_cond_t ccv;
    lkv_engine_req *calls_head, *calls_tail; /* Queued calls (cmu). */
    lkv_engine_req *done_head, *done_tail;   /* Calls made, to apply (cmu). */
    int call_stop;                           /* cmu. */
    lkv_engine_stats st;
};

static void req_unref(lkv_engine_req *r)
{
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) {
        return;
    }
    lkv_request_free(r->req);
    free(r->req);
    lkv_rag_result_free(&r->res);
    free(r->pages);
    free(r->ev);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* Appends an event (under r->mu). */
static void push_event(lkv_engine_req *r, const lkv_engine_event *ev)
{
    if (r->n_ev == r->cap_ev) {
        if (r->head > 0) {
            memmove(r->ev, r->ev + r->head, (size_t)(r->n_ev - r->head) * sizeof(*r->ev));
            r->n_ev -= r->head;
            r->head = 0;
        }
        if (r->n_ev == r->cap_ev) {
            r->cap_ev = r->cap_ev ? r->cap_ev * 2 : 16;
            r->ev = lkv_xrealloc(r->ev, (size_t)r->cap_ev * sizeof(*r->ev));
        }
    }
    r->ev[r->n_ev++] = *ev;
}

/* Publishes the tokens r's result gained since the last call (engine thread). */
static void publish_tokens(lkv_engine_req *r)
{
    const lkv_rag_result *res = &r->res;
    if (res->tokens == NULL || res->n_out == r->published) {
        return;
    }
    pthread_mutex_lock(&r->mu);
    size_t tlen = res->text != NULL ? strlen(res->text) : 0;
    while (r->published < res->n_out) {
        lkv_engine_event ev = {
            .kind = LKV_ENGINE_TOKEN, .index = r->published, .token = res->tokens[r->published]};
        if (r->published == res->n_out - 1 && tlen > r->text_pub) {
            /* One token per step: the new text is this token's (all of it goes to the last
             * token when several arrive together). */
            snprintf(ev.text, sizeof(ev.text), "%.*s", (int)(tlen - r->text_pub),
                     res->text + r->text_pub);
            r->text_pub = tlen;
        }
        push_event(r, &ev);
        r->published++;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->notify != NULL) {
        r->notify(r->arg, 0);
    }
}

/* Publishes the end (engine thread) and drops the engine's reference. */
static void publish_end(lkv_engine_req *r, int rc)
{
    publish_tokens(r);
    pthread_mutex_lock(&r->mu);
    lkv_engine_event ev = {.kind = LKV_ENGINE_END, .rc = rc};
    push_event(r, &ev);
    r->ended = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->notify != NULL) {
        r->notify(r->arg, 1);
    }
    req_unref(r);
}

static int is_cancelled(lkv_engine_req *r)
{
    pthread_mutex_lock(&r->mu);
    int c = r->cancel;
    pthread_mutex_unlock(&r->mu);
    return c;
}

static int expired(const lkv_engine_req *r, double now)
{
    return r->deadline > 0 && now >= r->deadline;
}

/* Gives r's pages back (under e->mu). */
static void pages_back(lkv_engine *e, lkv_engine_req *r)
{
    for (uint32_t i = 0; i < r->need && r->pages != NULL; i++) {
        e->free_pages[e->n_free++] = r->pages[i];
    }
    free(r->pages);
    r->pages = NULL;
}

/* Ends a request that never started (engine thread). */
static void end_unstarted(lkv_engine *e, lkv_engine_req *r, int rc, const char *why)
{
    snprintf(r->res.error, sizeof(r->res.error), "%s", why);
    r->queue_ms = lkv_worker_now_ms() - r->t_arrive;
    pthread_mutex_lock(&e->mu);
    e->st.queued--;
    e->st.failed++;
    if (rc == LKV_ECANCELLED) {
        e->st.cancelled++;
    } else if (rc == LKV_ETIMEDOUT) {
        e->st.expired++;
    }
    pthread_mutex_unlock(&e->mu);
    publish_end(r, rc);
}

/* Queues r's call c to the client-call thread (engine thread). */
static void queue_call(lkv_engine *e, lkv_engine_req *r, int c)
{
    r->call = c;
    r->call_next = NULL;
    e->n_inflight++;
    pthread_mutex_lock(&e->cmu);
    if (e->calls_tail != NULL) {
        e->calls_tail->call_next = r;
    } else {
        e->calls_head = r;
    }
    e->calls_tail = r;
    pthread_cond_signal(&e->ccv);
    pthread_mutex_unlock(&e->cmu);
}

/* Frees r's job and publishes its end (engine thread; its END call, if any, is back). */
static void finalize(lkv_engine *e, lkv_engine_req *r)
{
    int rc = lkv_worker_job_rc(r->job);
    lkv_worker_job_free(r->job);
    r->job = NULL;
    pthread_mutex_lock(&e->mu);
    e->st.finished++;
    if (rc != 0) {
        e->st.failed++;
        if (rc == LKV_ECANCELLED) {
            e->st.cancelled++;
        } else if (rc == LKV_ETIMEDOUT) {
            e->st.expired++;
        }
    }
    pthread_mutex_unlock(&e->mu);
    publish_end(r, rc);
}

/* Ends a running request whose job is done and has no call in flight (engine thread): its
 * compute ends and its pages go back at once; its END call (Commit, Put, Release) runs on the
 * client-call thread, and the end is published when that is back. */
static void finish_running(lkv_engine *e, int i)
{
    lkv_engine_req *r = e->running[i];
    lkv_worker_job_end(r->job);
    pthread_mutex_lock(&e->mu);
    pages_back(e, r);
    e->st.running--;
    e->st.pages_free = e->n_free;
    pthread_mutex_unlock(&e->mu);
    e->running[i] = e->running[--e->n_running];
    int c = lkv_worker_job_take_call(r->job);
    if (c == LKV_CALL_END) {
        e->n_ending++;
        queue_call(e, r, c);
    } else {
        finalize(e, r);
    }
}

/* Finishes every running request that is done and has no call in flight. */
static void finish_done(lkv_engine *e)
{
    for (int i = e->n_running - 1; i >= 0; i--) {
        lkv_worker_job *j = e->running[i]->job;
        if (lkv_worker_job_state(j) == LKV_JOB_DONE && !lkv_worker_job_busy(j)) {
            finish_running(e, i);
        }
    }
}

/* Applies the calls the client-call thread made (engine thread). */
static void apply_calls(lkv_engine *e)
{
    pthread_mutex_lock(&e->cmu);
    lkv_engine_req *r = e->done_head;
    e->done_head = e->done_tail = NULL;
    pthread_mutex_unlock(&e->cmu);
    while (r != NULL) {
        lkv_engine_req *n = r->call_next;
        int c = r->call;
        e->n_inflight--;
        lkv_worker_job_called(r->job, c);
        if (c == LKV_CALL_END) {
            e->n_ending--;
            finalize(e, r);
        } else {
            publish_tokens(r);
        }
        r = n;
    }
}

/* Queues the calls running jobs need now (engine thread). */
static void take_calls(lkv_engine *e)
{
    for (int i = 0; i < e->n_running; i++) {
        lkv_engine_req *r = e->running[i];
        int c = lkv_worker_job_take_call(r->job);
        if (c != LKV_CALL_NONE) {
            queue_call(e, r, c);
        }
    }
}

static void *call_main(void *arg)
{
    lkv_engine *e = arg;
    pthread_mutex_lock(&e->cmu);
    for (;;) {
        while (!e->call_stop && e->calls_head == NULL) {
            pthread_cond_wait(&e->ccv, &e->cmu);
        }
        lkv_engine_req *r = e->calls_head;
        if (r == NULL) {
            break; /* Stopped with nothing queued. */
        }
        e->calls_head = r->call_next;
        if (e->calls_head == NULL) {
            e->calls_tail = NULL;
        }
        pthread_mutex_unlock(&e->cmu);
        lkv_worker_job_call(r->job, r->call);
        pthread_mutex_lock(&e->cmu);
        r->call_next = NULL;
        if (e->done_tail != NULL) {
            e->done_tail->call_next = r;
        } else {
            e->done_head = r;
        }
        e->done_tail = r;
        pthread_mutex_unlock(&e->cmu);
        pthread_mutex_lock(&e->mu); /* Wake the engine (lock order: e->mu, then cmu). */
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_lock(&e->cmu);
    }
    pthread_mutex_unlock(&e->cmu);
    return NULL;
}

/* Step 1 for running requests: cancellation and deadlines (engine thread). */
static void sweep_running(lkv_engine *e, int shutting_down)
{
    double now = lkv_worker_now_ms();
    for (int i = 0; i < e->n_running; i++) {
        lkv_engine_req *r = e->running[i];
        if (lkv_worker_job_busy(r->job)) {
            continue; /* Its call comes back first (within the request's deadline). */
        }
        if (shutting_down) {
            lkv_worker_job_fail(r->job, LKV_ECANCELLED, "the worker is shutting down");
        } else if (is_cancelled(r)) {
            lkv_worker_job_fail(r->job, LKV_ECANCELLED, "cancelled by the client");
        } else if (expired(r, now)) {
            lkv_worker_job_fail(r->job, LKV_ETIMEDOUT,
                                "the request's deadline passed before it was done");
        }
    }
    finish_done(e);
}

/* Steps 1-2 for the queue: drops cancelled / expired requests, pops what can be admitted
 * (pages taken here). Returns the admitted list (linked by next). */
static lkv_engine_req *take_queue(lkv_engine *e, lkv_engine_req **dropped)
{
    double now = lkv_worker_now_ms();
    lkv_engine_req *adm = NULL, **adm_tail = &adm, *drop = NULL;
    pthread_mutex_lock(&e->mu);
    lkv_engine_req **pp = &e->q_head, *prev = NULL;
    while (*pp != NULL) {
        lkv_engine_req *r = *pp;
        if (is_cancelled(r) || expired(r, now) || e->stop) {
            *pp = r->next;
            if (e->q_tail == r) {
                e->q_tail = prev;
            }
            r->next = drop;
            drop = r;
            continue;
        }
        prev = r;
        pp = &r->next;
    }
    int running = e->n_running;
    while (e->q_head != NULL && !e->stop && running < e->o.max_batch &&
           e->q_head->need <= e->n_free) {
        lkv_engine_req *r = e->q_head;
        e->q_head = r->next;
        if (e->q_head == NULL) {
            e->q_tail = NULL;
        }
        r->next = NULL;
        r->pages = lkv_xmalloc((size_t)(r->need ? r->need : 1) * sizeof(uint32_t));
        for (uint32_t i = 0; i < r->need; i++) {
            r->pages[i] = e->free_pages[--e->n_free];
        }
        uint32_t used = e->st.pages_total - e->n_free;
        if (used > e->st.max_pages_used) {
            e->st.max_pages_used = used;
        }
        e->st.pages_free = e->n_free;
        e->st.queued--;
        e->st.running++;
        running++;
        if (e->st.running > e->st.max_running_seen) {
            e->st.max_running_seen = e->st.running;
        }
        *adm_tail = r;
        adm_tail = &r->next;
    }
    pthread_mutex_unlock(&e->mu);
    *dropped = drop;
    return adm;
}

static void admit(lkv_engine *e, lkv_engine_req *r)
{
    r->queue_ms = lkv_worker_now_ms() - r->t_arrive;
    lkv_worker_job_open(e->w, &r->req->rag, &r->res, r->pages, r->need, r->t_arrive, &r->job);
    e->running[e->n_running++] = r;
    int c = lkv_worker_job_take_call(r->job);
    if (c != LKV_CALL_NONE) {
        queue_call(e, r, c); /* START: its Lookup, Attach and Reserve, off this thread. */
    }
}

/* Index of the running request that arrived first among those prefilling, or -1. */
static int oldest_prefill(const lkv_engine *e)
{
    int best = -1;
    for (int i = 0; i < e->n_running; i++) {
        if (lkv_worker_job_state(e->running[i]->job) == LKV_JOB_PREFILL &&
            (best < 0 || e->running[i]->t_arrive < e->running[best]->t_arrive)) {
            best = i;
        }
    }
    return best;
}

/* 1 if a running request can compute now (prefill or decode). */
static int runnable(const lkv_engine *e)
{
    for (int i = 0; i < e->n_running; i++) {
        int st = lkv_worker_job_state(e->running[i]->job);
        if (st == LKV_JOB_PREFILL || st == LKV_JOB_DECODE) {
            return 1;
        }
    }
    return 0;
}

/* Jobs decoding now (the rows of this iteration's decode step). */
static int n_decoding(const lkv_engine *e)
{
    int n = 0;
    for (int i = 0; i < e->n_running; i++) {
        n += lkv_worker_job_state(e->running[i]->job) == LKV_JOB_DECODE;
    }
    return n;
}

/* Step 3: prefill units of the oldest prefilling requests, prefill_units of them, or while the
 * token budget lasts (at least one). A unit always moves its job on (a chunk, a phase, DONE), so
 * the loop ends; the cap is a guard against a job that would not. */
static void decode_done(lkv_engine *e, lkv_engine_req **reqs, int n, int ran, int fused);

/* The decoding requests now, into reqs and jobs (n_running slots each). Returns their count. */
static int decoding_jobs(lkv_engine *e, lkv_engine_req **reqs, lkv_worker_job **jobs)
{
    int n = 0;
    for (int i = 0; i < e->n_running; i++) {
        if (lkv_worker_job_state(e->running[i]->job) == LKV_JOB_DECODE) {
            reqs[n] = e->running[i];
            jobs[n++] = e->running[i]->job;
        }
    }
    return n;
}

/* Returns 1 if this step's decode rows rode along its first prefill pass (fuse_decode): the
 * decode step is then done. */
static int prefill_step(lkv_engine *e)
{
    const int budget = e->o.prefill_tokens;
    const int decoding = n_decoding(e);
    int rode = 0;
    uint64_t spent = (uint64_t)decoding, units = 0, tokens = 0;
    const uint64_t cap = budget > 0 ? (uint64_t)budget + 64u * (uint64_t)e->o.max_batch
                                    : (uint64_t)e->o.prefill_units;
    while (units < cap && (budget > 0 ? units == 0 || spent < (uint64_t)budget : 1)) {
        int i = oldest_prefill(e);
        if (i < 0) {
            break;
        }
        lkv_worker_job *j = e->running[i]->job;
        uint64_t before = lkv_worker_job_prefilled(j);
        if (!rode && e->o.fuse_decode && decoding > 0) {
            lkv_engine_req **reqs = e->reqs_buf;
            lkv_worker_job **jobs = e->jobs_buf;
            int nd = decoding_jobs(e, reqs, jobs), ran = -1;
            lkv_worker_job_prefill_ride(j, jobs, nd, &ran);
            if (ran >= 0) {
                decode_done(e, reqs, nd, ran, 1);
                rode = 1;
            }
        } else {
            lkv_worker_job_prefill(j);
        }
        uint64_t got = lkv_worker_job_prefilled(j) - before;
        spent += got;
        tokens += got;
        units++;
        publish_tokens(e->running[i]);
    }
    if (units == 0) {
        return rode;
    }
    pthread_mutex_lock(&e->mu);
    e->st.prefill_units += units;
    e->st.prefill_tokens += tokens;
    if (tokens + (uint64_t)decoding > e->st.max_step_tokens) {
        e->st.max_step_tokens = tokens + (uint64_t)decoding;
    }
    pthread_mutex_unlock(&e->mu);
    return rode;
}

/* After a decode step over reqs[0..n) (ran rows run; fused: along a prefill pass). */
static void decode_done(lkv_engine *e, lkv_engine_req **reqs, int n, int ran, int fused)
{
    for (int i = 0; i < n; i++) {
        if (ran > reqs[i]->max_batch_seen) {
            reqs[i]->max_batch_seen = ran;
        }
        publish_tokens(reqs[i]);
    }
    pthread_mutex_lock(&e->mu);
    e->st.decode_steps++;
    e->st.fused_steps += (uint64_t)fused;
    e->st.decode_tokens += (uint64_t)ran;
    if (ran > e->st.max_batch_seen) {
        e->st.max_batch_seen = ran;
    }
    pthread_mutex_unlock(&e->mu);
}

static void decode_step(lkv_engine *e)
{
    lkv_worker_job **jobs = e->jobs_buf;
    lkv_engine_req **reqs = e->reqs_buf;
    int n = decoding_jobs(e, reqs, jobs);
    if (n == 0) {
        return;
    }
    int ran = 0;
    lkv_worker_decode_batch(e->w, jobs, n, &ran);
    decode_done(e, reqs, n, ran, 0);
}

static void *engine_main(void *arg)
{
    lkv_engine *e = arg;
    for (;;) {
        int work = runnable(e);
        pthread_mutex_lock(&e->mu);
        if (!work && (e->stop ? e->n_inflight > 0 : e->q_head == NULL)) {
            /* Nothing to compute: wait for a request, a call coming back, or the next sweep
             * (cancellation, deadlines, lease renewals). */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += IDLE_WAIT_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_mutex_lock(&e->cmu);
            int done = e->done_head != NULL;
            pthread_mutex_unlock(&e->cmu);
            if (!done) {
                pthread_cond_timedwait(&e->cv, &e->mu, &ts);
            }
        }
        int stop = e->stop;
        pthread_mutex_unlock(&e->mu);
        apply_calls(e);
        sweep_running(e, stop);
        lkv_engine_req *drop, *adm = take_queue(e, &drop);
        while (drop != NULL) {
            lkv_engine_req *n = drop->next;
            int c = is_cancelled(drop);
            end_unstarted(e, drop, stop || c ? LKV_ECANCELLED : LKV_ETIMEDOUT,
                          stop ? "the worker is shutting down"
                          : c  ? "cancelled by the client"
                               : "the request's deadline passed while it waited for admission");
            drop = n;
        }
        if (stop) {
            take_calls(e);
            if (e->n_running == 0 && e->n_ending == 0 && e->n_inflight == 0) {
                break;
            }
            continue;
        }
        while (adm != NULL) {
            lkv_engine_req *n = adm->next;
            adm->next = NULL;
            admit(e, adm);
            adm = n;
        }
        if (!prefill_step(e)) {
            decode_step(e);
        }
        finish_done(e);
        take_calls(e);
    }
    return NULL;
}

int lkv_engine_create(lkv_worker *w, const lkv_engine_opts *o, lkv_engine **out)
{
    *out = NULL;
    lkv_engine_opts d = {0};
    if (o != NULL) {
        d = *o;
    }
    if (w == NULL || d.max_batch < 0 || d.max_queue < 0 || d.prefill_units < 0 ||
        d.prefill_tokens < 0) {
        return LKV_EINVAL;
    }
    lkv_engine *e = lkv_xcalloc(1, sizeof(*e));
    e->w = w;
    e->o = d;
    e->o.max_batch = d.max_batch > 0 ? d.max_batch : DEFAULT_MAX_BATCH;
    e->o.max_queue = d.max_queue > 0 ? d.max_queue : DEFAULT_MAX_QUEUE;
    e->o.prefill_units = d.prefill_units > 0 ? d.prefill_units : 1;
    uint32_t all = lkv_worker_local_pages(w);
    e->o.kv_pages = d.kv_pages > 0 && d.kv_pages < all ? d.kv_pages : all;
    e->free_pages = lkv_xmalloc((size_t)e->o.kv_pages * sizeof(uint32_t));
    for (uint32_t i = 0; i < e->o.kv_pages; i++) {
        e->free_pages[i] = e->o.kv_pages - 1 - i; /* Popped from the end: 0, 1, 2, ... */
    }
    e->n_free = e->o.kv_pages;
    e->st.pages_total = e->o.kv_pages;
    e->st.pages_free = e->n_free;
    e->running = lkv_xcalloc((size_t)e->o.max_batch, sizeof(*e->running));
    e->jobs_buf = lkv_xcalloc((size_t)e->o.max_batch, sizeof(*e->jobs_buf));
    e->reqs_buf = lkv_xcalloc((size_t)e->o.max_batch, sizeof(*e->reqs_buf));
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_init(&e->cmu, NULL);
    pthread_cond_init(&e->ccv, NULL);
    lkv_worker_set_async(w, 1);
    if (pthread_create(&e->call_th, NULL, call_main, e) != 0 ||
        pthread_create(&e->th, NULL, engine_main, e) != 0) {
        lkv_panic("engine: cannot start its threads");
    }
    *out = e;
    return 0;
}

void lkv_engine_destroy(lkv_engine *e)
{
    if (e == NULL) {
        return;
    }
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->th, NULL); /* Every call came back before it ended. */
    pthread_mutex_lock(&e->cmu);
    e->call_stop = 1;
    pthread_cond_signal(&e->ccv);
    pthread_mutex_unlock(&e->cmu);
    pthread_join(e->call_th, NULL);
    lkv_worker_set_async(e->w, 0);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->cmu);
    pthread_cond_destroy(&e->ccv);
    free(e->free_pages);
    free(e->running);
    free(e->jobs_buf);
    free(e->reqs_buf);
    free(e);
}

int lkv_engine_submit(lkv_engine *e, lkv_request *req, int64_t deadline_ms,
                      void (*notify)(void *arg, int last), void *arg, lkv_engine_req **out,
                      char *msg, size_t len)
{
    *out = NULL;
    uint32_t need = lkv_worker_pages_needed(e->w, &req->rag);
    int rc = 0;
    pthread_mutex_lock(&e->mu);
    e->st.submitted++;
    if (e->stop) {
        rc = LKV_ESHUTDOWN;
        if (msg != NULL) {
            snprintf(msg, len, "the worker is shutting down");
        }
    } else if (need > e->st.pages_total) {
        rc = LKV_ENOSPC;
        if (msg != NULL) {
            snprintf(msg, len,
                     "the request needs %u KV pages of %llu bytes (its documents, question and "
                     "max_tokens), more than the worker's in-flight KV limit of %u pages",
                     need, (unsigned long long)lkv_worker_page_bytes(e->w), e->st.pages_total);
        }
    } else if (e->st.queued >= e->o.max_queue) {
        rc = LKV_ENOSPC; /* RESOURCE_EXHAUSTED: retry later (the message says which limit). */
        if (msg != NULL) {
            snprintf(msg, len, "the worker's admission queue is full (%d requests); retry later",
                     e->o.max_queue);
        }
    }
    if (rc != 0) {
        e->st.refused++;
        pthread_mutex_unlock(&e->mu);
        lkv_request_free(req);
        free(req);
        return rc;
    }
    lkv_engine_req *r = lkv_xcalloc(1, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 2;
    r->req = req;
    r->need = need;
    r->t_arrive = lkv_worker_now_ms();
    r->deadline = deadline_ms > 0 ? r->t_arrive + (double)deadline_ms : 0;
    r->notify = notify;
    r->arg = arg;
    if (e->q_tail != NULL) {
        e->q_tail->next = r;
    } else {
        e->q_head = r;
    }
    e->q_tail = r;
    e->st.queued++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    *out = r;
    return 0;
}

int lkv_engine_next(lkv_engine_req *r, lkv_engine_event *ev)
{
    pthread_mutex_lock(&r->mu);
    int got = r->head < r->n_ev;
    if (got) {
        *ev = r->ev[r->head++];
    }
    pthread_mutex_unlock(&r->mu);
    return got;
}

int lkv_engine_wait(lkv_engine_req *r, lkv_engine_event *ev, int timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (timeout_ms >= 0) {
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&r->mu);
    while (r->head >= r->n_ev && !r->ended) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&r->cv, &r->mu);
        } else if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) == ETIMEDOUT) {
            break;
        }
    }
    int got = r->head < r->n_ev;
    if (got) {
        *ev = r->ev[r->head++];
    }
    pthread_mutex_unlock(&r->mu);
    return got;
}

void lkv_engine_cancel(lkv_engine_req *r)
{
    pthread_mutex_lock(&r->mu);
    r->cancel = 1;
    pthread_mutex_unlock(&r->mu);
    /* The engine looks at the flag at the top of its next iteration (at most one step away;
     * it polls every IDLE_WAIT_MS when idle). */
}

void lkv_engine_result_get(lkv_engine_req *r, lkv_engine_result *out)
{
    out->res = &r->res;
    out->id = r->req->id;
    out->queue_ms = r->queue_ms;
    out->max_batch_seen = r->max_batch_seen;
    out->kv_pages = r->need;
}

void lkv_engine_release(lkv_engine_req *r)
{
    if (r == NULL) {
        return;
    }
    lkv_engine_cancel(r);
    req_unref(r);
}

void lkv_engine_stats_get(lkv_engine *e, lkv_engine_stats *st)
{
    pthread_mutex_lock(&e->mu);
    *st = e->st;
    pthread_mutex_unlock(&e->mu);
}
