/*
 * test_engine.c: client.worker.engine: the serving engine's scheduler (lkv_engine.h) on the
 * tiny model, local mode (no daemon: the cache path is integration.worker_serve's).
 *   - a batch of different requests (greedy and sampled, lazy and materialise) gives each
 *     exactly its solo tokens AND bitwise its solo logits (keep_logits), with real batching
 *     (decode steps of more than one request) and never more than max_batch running;
 *   - the KV page limit: a request larger than the limit is refused at submit (ENOSPC), the
 *     pages granted never exceed it, and every page comes back;
 *   - cancellation mid-stream frees the request's pages at once (the engine's next iteration)
 *     and lets a queued request that needed them run; a cancelled queued request never runs;
 *   - deadlines: a request whose deadline passes while running or queued ends ETIMEDOUT;
 *   - FIFO admission under a page shortage (no overtaking);
 *   - a full admission queue refuses (LKV_ENOSPC, the message says so);
 *   - chunked prefill (the worker's prefill_chunk, the engine's prefill_tokens budget): with
 *     chunks of 1, 7 (boundaries inside blocks of 16 and inside documents), 16 and 40 tokens
 *     and budgets from 1 token up, every request gives bitwise its solo tokens and logits, the
 *     chunks really run (prefill units >= the chunks of every segment) and no step exceeds its
 *     budget by more than one chunk; chunked KV is the unchunked KV up to fp32 rounding;
 *   - cancellation mid-prefill (a request held between two chunks of one document, lazy and
 *     prefix mode): it ends CANCELLED with no token, every page comes back, the prefix pool keeps
 *     no block of the unfinished document, and the same request afterwards gives its solo
 *     result.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lkv_engine.h"
#include "lkv_log.h"
#include "lkv_prefix.h"
#include "lkv_test.h"

static lkv_worker *worker_chunk(uint32_t pages, int chunk)
{
    lkv_worker_opts o = {.model_path = LKV_TEST_MODEL_DIR "/stories260K.bin",
                         .local_pages = pages,
                         .threads = 1,
                         .prefill_chunk = chunk};
    lkv_worker *w;
    char err[256];
    ASSERT_OK(lkv_worker_create(&o, &w, err, sizeof(err)));
    return w;
}

static lkv_worker *worker(uint32_t pages)
{
    return worker_chunk(pages, 0);
}

/* A request of nd documents (deterministic token ids from seed), a question, max_tokens. */
static lkv_request *make(int seed, int nd, int nq, int max_tokens, float temp, int mode)
{
    lkv_request *r = lkv_xcalloc(1, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "r%d", seed);
    r->docs = lkv_xcalloc((size_t)(nd ? nd : 1), sizeof(*r->docs));
    r->doc_tokens = lkv_xcalloc((size_t)(nd ? nd : 1), sizeof(int *));
    uint32_t x = (uint32_t)seed * 2654435761u + 1;
    for (int i = 0; i < nd; i++) {
        int n = 5 + (int)(x % 30);
        r->doc_tokens[i] = lkv_xmalloc((size_t)n * sizeof(int));
        for (int t = 0; t < n; t++) {
            x = x * 1664525u + 1013904223u;
            r->doc_tokens[i][t] = t == 0 ? 1 : 3 + (int)((x >> 8) % 500);
        }
        r->docs[i].tokens = r->doc_tokens[i];
        r->docs[i].n_tokens = n;
    }
    r->question = lkv_xmalloc((size_t)nq * sizeof(int));
    for (int t = 0; t < nq; t++) {
        x = x * 1664525u + 1013904223u;
        r->question[t] = 3 + (int)((x >> 8) % 500);
    }
    r->rag = (lkv_rag_request){.n_docs = nd,
                               .docs = r->docs,
                               .question = r->question,
                               .n_question = nq,
                               .max_tokens = max_tokens,
                               .sampling = {.temperature = temp, .top_p = 0.9f, .seed = 11},
                               .mode = mode,
                               .keep_logits = 1};
    return r;
}

/* Waits for r's end; returns its rc and counts its token events (first: already taken). */
static int wait_end_from(lkv_engine_req *r, int *n_tok, int first)
{
    lkv_engine_event ev;
    int n = first;
    while (lkv_engine_wait(r, &ev, 30000)) {
        if (ev.kind == LKV_ENGINE_END) {
            if (ev.rc != 0) {
                lkv_engine_result er;
                lkv_engine_result_get(r, &er);
                fprintf(stderr, "   end %d: %s\n", ev.rc, er.res->error);
            }
            if (n_tok != NULL) {
                *n_tok = n;
            }
            return ev.rc;
        }
        ASSERT_EQ(ev.index, n);
        n++;
    }
    LKV_FAIL("no end event within 30 s");
}

static int wait_end(lkv_engine_req *r, int *n_tok)
{
    return wait_end_from(r, n_tok, 0);
}

/* A gate for the engine thread (see test_pages_cancel_fifo). */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int credits, open, waiting;
} gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};

static void gate_notify(void *arg, int last)
{
    (void)arg;
    (void)last;
    pthread_mutex_lock(&gate.mu);
    while (!gate.open && gate.credits == 0) {
        gate.waiting = 1;
        pthread_cond_broadcast(&gate.cv);
        pthread_cond_wait(&gate.cv, &gate.mu);
    }
    gate.waiting = 0;
    if (!gate.open) {
        gate.credits--;
    }
    pthread_mutex_unlock(&gate.mu);
}

/* Lets the engine pass the gate n more times, then waits until it is held at it again. */
static void gate_give(int n)
{
    pthread_mutex_lock(&gate.mu);
    gate.credits += n;
    pthread_cond_broadcast(&gate.cv);
    while (!(gate.credits == 0 && gate.waiting)) {
        pthread_cond_wait(&gate.cv, &gate.mu);
    }
    pthread_mutex_unlock(&gate.mu);
}

static void gate_close(void)
{
    pthread_mutex_lock(&gate.mu);
    gate.open = 0;
    gate.credits = 0;
    pthread_mutex_unlock(&gate.mu);
}

static void gate_open(void)
{
    pthread_mutex_lock(&gate.mu);
    gate.open = 1;
    pthread_cond_broadcast(&gate.cv);
    pthread_mutex_unlock(&gate.mu);
}

#define NREQ 7

static void test_batch_equals_solo(void)
{
    lkv_worker *w = worker(512);
    struct {
        int nd, nq, max;
        float temp;
        int mode;
    } spec[NREQ] = {{2, 4, 20, 0, 0},    {1, 7, 33, 0, 0}, {3, 2, 12, 0, 1}, {0, 5, 25, 0, 0},
                    {2, 3, 18, 0.8f, 0}, {4, 6, 9, 0, 0},  {1, 1, 30, 0, 1}};
    /* Solo: lkv_worker_run, one request at a time. */
    lkv_rag_result solo[NREQ];
    for (int i = 0; i < NREQ; i++) {
        lkv_request *q = make(i, spec[i].nd, spec[i].nq, spec[i].max, spec[i].temp, spec[i].mode);
        q->rag.stop_at_eos = 0;
        ASSERT_OK(lkv_worker_run(w, &q->rag, &solo[i]));
        ASSERT_EQ(solo[i].n_out, spec[i].max);
        lkv_request_free(q);
        free(q);
    }
    lkv_engine_opts eo = {.max_batch = 4};
    lkv_engine *e;
    ASSERT_OK(lkv_engine_create(w, &eo, &e));
    lkv_engine_req *h[NREQ];
    /* The engine is held at request 0's first token until every request is queued, so the
     * batch forms however the threads are scheduled. */
    for (int i = 0; i < NREQ; i++) {
        lkv_request *q = make(i, spec[i].nd, spec[i].nq, spec[i].max, spec[i].temp, spec[i].mode);
        q->rag.stop_at_eos = 0;
        ASSERT_OK(lkv_engine_submit(e, q, 0, i == 0 ? gate_notify : NULL, NULL, &h[i], NULL, 0));
        if (i == 0) {
            gate_give(0);
        }
    }
    gate_open();
    int batched = 0;
    for (int i = 0; i < NREQ; i++) {
        int nt = 0;
        ASSERT_OK(wait_end(h[i], &nt));
        lkv_engine_result er;
        lkv_engine_result_get(h[i], &er);
        ASSERT_EQ(nt, spec[i].max);
        ASSERT_EQ(er.res->n_out, solo[i].n_out);
        ASSERT_TRUE(memcmp(er.res->tokens, solo[i].tokens, (size_t)solo[i].n_out * sizeof(int)) ==
                    0);
        /* Bitwise: the batch computes each row exactly as the solo pass. */
        ASSERT_TRUE(memcmp(er.res->logits, solo[i].logits,
                           (size_t)solo[i].n_out * solo[i].vocab * sizeof(float)) == 0);
        ASSERT_TRUE(er.max_batch_seen <= 4);
        batched += er.max_batch_seen > 1;
        lkv_engine_release(h[i]);
        lkv_rag_result_free(&solo[i]);
    }
    lkv_engine_stats st;
    lkv_engine_stats_get(e, &st);
    ASSERT_TRUE(batched >= 2);
    ASSERT_TRUE(st.max_batch_seen > 1 && st.max_batch_seen <= 4);
    ASSERT_TRUE(st.max_running_seen <= 4);
    ASSERT_EQ(st.finished, NREQ);
    ASSERT_EQ(st.failed, 0);
    ASSERT_EQ(st.pages_free, st.pages_total);        /* Every page came back. */
    ASSERT_TRUE(st.decode_tokens > st.decode_steps); /* Fewer passes than tokens. */
    lkv_engine_destroy(e);
    lkv_worker_destroy(w);
}

static void test_pages_cancel_fifo(void)
{
    lkv_worker *w = worker(64);
    gate_close();
    lkv_engine_opts eo = {.max_batch = 8, .kv_pages = 20};
    lkv_engine *e;
    ASSERT_OK(lkv_engine_create(w, &eo, &e));
    char msg[256] = "";
    lkv_engine_req *h;
    /* 1 document block + ceil((2 + 400) / 16) = 26 pages > 20: never fits. */
    ASSERT_ERR(lkv_engine_submit(e, make(1, 1, 2, 400, 0, 0), 0, NULL, NULL, &h, msg, sizeof msg),
               LKV_ENOSPC);
    ASSERT_TRUE(h == NULL && strstr(msg, "KV pages") != NULL);
    /* A: long generation of 14-16 pages; B (as many) must wait for A's pages. A's
     * notify is a gate that holds the engine thread after each of A's events until the test
     * gives it a credit, so the engine runs exactly the iterations the test allows. */
    lkv_request *qa = make(2, 1, 2, 200, 0, 0);
    qa->rag.stop_at_eos = 0;
    lkv_request *qb = make(3, 1, 2, 200, 0, 0);
    qb->rag.stop_at_eos = 0;
    lkv_request *qc = make(4, 0, 2, 10, 0, 0); /* 1 page: fits now, but FIFO: after B. */
    lkv_engine_req *a, *b, *c;
    uint32_t need_a = lkv_worker_pages_needed(w, &qa->rag);
    uint32_t need_b = lkv_worker_pages_needed(w, &qb->rag);
    uint32_t need_c = lkv_worker_pages_needed(w, &qc->rag);
    ASSERT_TRUE(need_a + need_b > 20 && need_a + need_c <= 20 && need_c == 1);
    ASSERT_OK(lkv_engine_submit(e, qa, 0, gate_notify, &gate, &a, NULL, 0));
    lkv_engine_event ev;
    ASSERT_TRUE(lkv_engine_wait(a, &ev, 10000) && ev.kind == LKV_ENGINE_TOKEN);
    ASSERT_OK(lkv_engine_submit(e, qb, 0, NULL, NULL, &b, NULL, 0));
    ASSERT_OK(lkv_engine_submit(e, qc, 0, NULL, NULL, &c, NULL, 0));
    gate_give(3); /* Three more engine iterations: admission passes and A's decode steps. */
    lkv_engine_stats st;
    lkv_engine_stats_get(e, &st);
    ASSERT_EQ(st.running, 1); /* B cannot fit; C does not overtake it. */
    ASSERT_EQ(st.queued, 2);
    ASSERT_EQ(st.pages_total - st.pages_free, need_a);
    ASSERT_TRUE(!lkv_engine_next(b, &ev) && !lkv_engine_next(c, &ev));
    /* Cancel A mid-stream: its pages come back at once, B and C run. */
    lkv_engine_cancel(a);
    gate_open();
    int na = 0;
    ASSERT_ERR(wait_end_from(a, &na, 1), LKV_ECANCELLED);
    ASSERT_TRUE(na >= 4 && na < 200);
    lkv_engine_result er;
    lkv_engine_result_get(a, &er);
    ASSERT_TRUE(strstr(er.res->error, "cancelled") != NULL);
    int nb = 0, nc = 0;
    ASSERT_OK(wait_end(b, &nb));
    ASSERT_OK(wait_end(c, &nc));
    ASSERT_EQ(nb, 200);
    ASSERT_EQ(nc, 10);
    lkv_engine_stats_get(e, &st);
    ASSERT_TRUE(st.max_pages_used <= 20);
    ASSERT_EQ(st.pages_free, 20);
    ASSERT_EQ(st.cancelled, 1);
    lkv_engine_release(a);
    lkv_engine_release(b);
    lkv_engine_release(c);
    /* A cancelled queued request never runs: D holds the pages, E waits, E is cancelled. */
    lkv_request *qd = make(5, 1, 2, 200, 0, 0), *qe = make(6, 1, 2, 200, 0, 0);
    qd->rag.stop_at_eos = qe->rag.stop_at_eos = 0;
    lkv_engine_req *d, *f;
    ASSERT_OK(lkv_engine_submit(e, qd, 0, NULL, NULL, &d, NULL, 0));
    ASSERT_OK(lkv_engine_submit(e, qe, 0, NULL, NULL, &f, NULL, 0));
    lkv_engine_cancel(f);
    int nf = -1;
    ASSERT_ERR(wait_end(f, &nf), LKV_ECANCELLED);
    ASSERT_EQ(nf, 0);
    ASSERT_OK(wait_end(d, NULL));
    lkv_engine_release(d);
    lkv_engine_release(f);
    lkv_engine_destroy(e);
    lkv_worker_destroy(w);
}

static void test_deadlines(void)
{
    lkv_worker *w = worker(64);
    lkv_engine_opts eo = {.max_batch = 1};
    lkv_engine *e;
    ASSERT_OK(lkv_engine_create(w, &eo, &e));
    lkv_request *qa = make(7, 2, 3, 480, 0, 0), *qb = make(8, 1, 2, 10, 0, 0);
    qa->rag.stop_at_eos = 0;
    lkv_engine_req *a, *b;
    /* A (480 tokens) runs past its 5 ms deadline; B waits behind it (max_batch 1) past its
     * 2 ms one. A ends at or after ta + 5 ms, and B is admitted only after A ends, so a B
     * submitted before ta + 3 ms has expired when it could be admitted: it must end with no
     * token. A B submitted later (this thread descheduled for milliseconds on a loaded
     * machine) may legitimately start: then it must still end by its deadline. */
    double ta = lkv_worker_now_ms();
    ASSERT_OK(lkv_engine_submit(e, qa, 5, NULL, NULL, &a, NULL, 0));
    ASSERT_OK(lkv_engine_submit(e, qb, 2, NULL, NULL, &b, NULL, 0));
    int b_early = lkv_worker_now_ms() - ta < 3.0;
    int na = 0, nb = -1;
    double t0 = lkv_worker_now_ms();
    ASSERT_ERR(wait_end(a, &na), LKV_ETIMEDOUT);
    ASSERT_TRUE(lkv_worker_now_ms() - t0 < 2000);
    ASSERT_TRUE(na < 480);
    ASSERT_ERR(wait_end(b, &nb), LKV_ETIMEDOUT);
    lkv_engine_result er;
    lkv_engine_result_get(b, &er);
    if (b_early) {
        ASSERT_EQ(nb, 0);
        ASSERT_TRUE(strstr(er.res->error, "admission") != NULL);
    } else {
        fprintf(stderr, "NOTE: B was submitted %.1f ms after A (a loaded machine): it may run\n",
                lkv_worker_now_ms() - ta);
        ASSERT_TRUE(nb < 10 || strstr(er.res->error, "deadline") != NULL);
    }
    lkv_engine_stats st;
    lkv_engine_stats_get(e, &st);
    ASSERT_EQ(st.expired, 2);
    ASSERT_EQ(st.pages_free, st.pages_total);
    lkv_engine_release(a);
    lkv_engine_release(b);
    /* Destroy with work in flight: everything ends CANCELLED, handles stay readable. */
    lkv_request *qc = make(9, 1, 2, 480, 0, 0);
    qc->rag.stop_at_eos = 0;
    lkv_engine_req *c;
    ASSERT_OK(lkv_engine_submit(e, qc, 0, NULL, NULL, &c, NULL, 0));
    lkv_engine_event ev;
    ASSERT_TRUE(lkv_engine_wait(c, &ev, 10000));
    lkv_engine_destroy(e);
    ASSERT_ERR(wait_end_from(c, NULL, 1), LKV_ECANCELLED);
    lkv_engine_release(c);
    lkv_worker_destroy(w);
}

static void test_queue_full(void)
{
    lkv_worker *w = worker(64);
    lkv_engine_opts eo = {.max_batch = 1, .max_queue = 1};
    lkv_engine *e;
    ASSERT_OK(lkv_engine_create(w, &eo, &e));
    lkv_request *qa = make(10, 1, 2, 400, 0, 0);
    qa->rag.stop_at_eos = 0;
    lkv_engine_req *a, *b, *c;
    ASSERT_OK(lkv_engine_submit(e, qa, 0, NULL, NULL, &a, NULL, 0));
    lkv_engine_event ev;
    ASSERT_TRUE(lkv_engine_wait(a, &ev, 10000) && ev.kind == LKV_ENGINE_TOKEN); /* Running. */
    ASSERT_OK(lkv_engine_submit(e, make(11, 1, 2, 5, 0, 0), 0, NULL, NULL, &b, NULL, 0));
    char msg[256] = "";
    ASSERT_ERR(lkv_engine_submit(e, make(12, 1, 2, 5, 0, 0), 0, NULL, NULL, &c, msg, sizeof msg),
               LKV_ENOSPC);
    ASSERT_TRUE(c == NULL && strstr(msg, "queue is full") != NULL);
    lkv_engine_cancel(a);
    ASSERT_ERR(wait_end_from(a, NULL, 1), LKV_ECANCELLED);
    ASSERT_OK(wait_end(b, NULL));
    lkv_engine_stats st;
    lkv_engine_stats_get(e, &st);
    ASSERT_EQ(st.refused, 1);
    lkv_engine_release(a);
    lkv_engine_release(b);
    lkv_engine_destroy(e);
    lkv_worker_destroy(w);
}

/* Chunks of every segment of q with chunk c (documents and question). */
static uint64_t chunks_of(const lkv_request *q, int c)
{
    uint64_t n = (uint64_t)(q->rag.n_question + c - 1) / (uint64_t)c;
    for (int i = 0; i < q->rag.n_docs; i++) {
        n += (uint64_t)(q->rag.docs[i].n_tokens + c - 1) / (uint64_t)c;
    }
    return n;
}

static void test_chunked_equals_solo(void)
{
    const int chunks[] = {1, 7, 16, 40}, budgets[] = {1, 9, 40, 45};
    struct {
        int nd, nq, max;
        float temp;
        int mode;
    } spec[NREQ] = {{2, 4, 12, 0, 0},   {1, 7, 20, 0, 0}, {3, 2, 8, 0, 1},  {0, 5, 10, 0, 0},
                    {2, 3, 9, 0.8f, 0}, {4, 6, 6, 0, 0},  {1, 17, 14, 0, 1}};
    float *whole_logits = NULL; /* Request 1's first-token logits, unchunked. */
    int vocab = 0;
    {
        lkv_worker *w = worker(512);
        lkv_request *q = make(101, spec[1].nd, spec[1].nq, spec[1].max, 0, 0);
        lkv_rag_result r;
        ASSERT_OK(lkv_worker_run(w, &q->rag, &r));
        vocab = r.vocab;
        whole_logits = lkv_xmalloc((size_t)vocab * sizeof(float));
        memcpy(whole_logits, r.logits, (size_t)vocab * sizeof(float));
        lkv_rag_result_free(&r);
        lkv_request_free(q);
        free(q);
        lkv_worker_destroy(w);
    }
    /* Each chunking twice: a decode pass of its own, then the decode rows riding along the
     * step's prefill pass (fuse_decode): the same tokens and logits, bitwise, either way. */
    for (int k = 0; k < 8; k++) {
        const int ci = k % 4, fuse = k / 4;
        const int c = chunks[ci], budget = budgets[ci];
        lkv_worker *w = worker_chunk(512, c);
        lkv_rag_result solo[NREQ];
        uint64_t want_units = 0;
        for (int i = 0; i < NREQ; i++) {
            lkv_request *q =
                make(100 + i, spec[i].nd, spec[i].nq, spec[i].max, spec[i].temp, spec[i].mode);
            q->rag.stop_at_eos = 0;
            want_units += chunks_of(q, c);
            ASSERT_OK(lkv_worker_run(w, &q->rag, &solo[i]));
            ASSERT_EQ(solo[i].n_out, spec[i].max);
            lkv_request_free(q);
            free(q);
        }
        /* Chunked KV is the unchunked KV up to rounding: the first token's logits agree. */
        double num = 0, den = 0;
        for (int v = 0; v < vocab; v++) {
            double d = (double)solo[1].logits[v] - (double)whole_logits[v];
            num += d * d;
            den += (double)whole_logits[v] * whole_logits[v];
        }
        ASSERT_TRUE(sqrt(num / den) < 1e-4);
        if (c < 40) {
            ASSERT_TRUE(num > 0 || c == 16 || c == 1); /* (Rounding may coincide.) */
        }
        gate_close();
        lkv_engine_opts eo = {.max_batch = 4, .prefill_tokens = budget, .fuse_decode = fuse};
        lkv_engine *e;
        ASSERT_OK(lkv_engine_create(w, &eo, &e));
        lkv_engine_req *h[NREQ];
        for (int i = 0; i < NREQ; i++) {
            lkv_request *q =
                make(100 + i, spec[i].nd, spec[i].nq, spec[i].max, spec[i].temp, spec[i].mode);
            q->rag.stop_at_eos = 0;
            ASSERT_OK(
                lkv_engine_submit(e, q, 0, i == 0 ? gate_notify : NULL, NULL, &h[i], NULL, 0));
            if (i == 0) {
                gate_give(0);
            }
        }
        gate_open();
        for (int i = 0; i < NREQ; i++) {
            int nt = 0;
            ASSERT_OK(wait_end(h[i], &nt));
            lkv_engine_result er;
            lkv_engine_result_get(h[i], &er);
            ASSERT_EQ(er.res->n_out, solo[i].n_out);
            ASSERT_TRUE(
                memcmp(er.res->tokens, solo[i].tokens, (size_t)solo[i].n_out * sizeof(int)) == 0);
            ASSERT_TRUE(memcmp(er.res->logits, solo[i].logits,
                               (size_t)solo[i].n_out * solo[i].vocab * sizeof(float)) == 0);
            lkv_engine_release(h[i]);
            lkv_rag_result_free(&solo[i]);
        }
        lkv_engine_stats st;
        lkv_engine_stats_get(e, &st);
        ASSERT_EQ(st.failed, 0);
        ASSERT_EQ(st.pages_free, st.pages_total);
        ASSERT_TRUE(st.prefill_units >= want_units); /* Every chunk was a unit of its own. */
        ASSERT_TRUE(st.max_step_tokens <= (uint64_t)(budget > 4 ? budget : 4) + (uint64_t)c - 1);
        ASSERT_TRUE(st.max_batch_seen > 1);
        if (fuse) {
            /* Decode rows did ride along prefill passes (a decode pass of their own otherwise). */
            ASSERT_TRUE(st.fused_steps > 0 && st.fused_steps <= st.decode_steps);
        } else {
            ASSERT_EQ(st.fused_steps, 0);
        }
        fprintf(stderr, "   chunk %d budget %d fuse %d: %llu decode steps, %llu fused\n", c, budget,
                fuse, (unsigned long long)st.decode_steps, (unsigned long long)st.fused_steps);
        lkv_engine_destroy(e);
        lkv_worker_destroy(w);
    }
    free(whole_logits);
}

/* Holds request B between two chunks of one of its documents (chunk 1, budget 1: one chunk per
 * engine iteration while A decodes; A's notify gates the iterations), cancels it there. */
static void cancel_mid_prefill(int mode)
{
    lkv_worker *w = worker_chunk(256, 1);
    lkv_engine_opts eo = {.max_batch = 4, .prefill_tokens = 1};
    if (mode == LKV_RAG_PREFIX) {
        ASSERT_OK(lkv_worker_prefix_setup(w, 64, 0));
        eo.kv_pages = 256 - 64;
    }
    lkv_request *qb = make(200, 3, 4, 6, 0, mode);
    qb->rag.stop_at_eos = 0;
    const int d0 = qb->rag.docs[0].n_tokens, d1 = qb->rag.docs[1].n_tokens;
    lkv_rag_result solo;
    ASSERT_OK(lkv_worker_run(w, &qb->rag, &solo));
    if (mode == LKV_RAG_PREFIX) {
        ASSERT_OK(lkv_worker_prefix_setup(w, 64, 0)); /* An empty pool again. */
    }
    lkv_engine *e;
    ASSERT_OK(lkv_engine_create(w, &eo, &e));
    lkv_request *qa = make(201, 0, 2, 400, 0, mode == LKV_RAG_PREFIX ? 0 : mode);
    qa->rag.stop_at_eos = 0;
    lkv_engine_req *a, *b;
    gate_close();
    ASSERT_OK(lkv_engine_submit(e, qa, 0, gate_notify, NULL, &a, NULL, 0));
    lkv_engine_event ev;
    ASSERT_TRUE(lkv_engine_wait(a, &ev, 10000) && ev.kind == LKV_ENGINE_TOKEN);
    lkv_engine_stats st0, st;
    lkv_engine_stats_get(e, &st0);
    ASSERT_OK(lkv_engine_submit(e, qb, 0, NULL, NULL, &b, NULL, 0));
    /* B's START (local: none), then d0 + d1 / 2 chunks: in the middle of document 1, which
     * sits inside its first block (d1 < 35). */
    const int k = d0 + d1 / 2;
    gate_give(k + 1);
    lkv_engine_stats_get(e, &st);
    ASSERT_TRUE(st.prefill_units - st0.prefill_units >= (uint64_t)k - 1);
    ASSERT_TRUE(st.prefill_tokens - st0.prefill_tokens < (uint64_t)(d0 + d1));
    const uint64_t done1 = st.prefill_tokens - st0.prefill_tokens - (uint64_t)d0;
    ASSERT_TRUE(st.prefill_tokens - st0.prefill_tokens > (uint64_t)d0);
    /* The pool keeps document 0's blocks and document 1's blocks written whole. */
    const uint64_t kept = (uint64_t)(d0 + 15) / 16 + done1 / 16;
    ASSERT_TRUE(!lkv_engine_next(b, &ev)); /* Still prefilling: no token. */
    lkv_engine_cancel(b);
    gate_open();
    int nb = -1;
    ASSERT_ERR(wait_end(b, &nb), LKV_ECANCELLED);
    ASSERT_EQ(nb, 0);
    lkv_engine_cancel(a);
    ASSERT_ERR(wait_end_from(a, NULL, 1), LKV_ECANCELLED);
    lkv_engine_stats_get(e, &st);
    ASSERT_EQ(st.pages_free, st.pages_total);
    if (mode == LKV_RAG_PREFIX) {
        lkv_prefix_stats ps;
        lkv_worker_prefix_stats(w, &ps);
        ASSERT_EQ(ps.pinned, 0);
        /* Document 1's admitted blocks not written whole (pending) are gone. */
        ASSERT_EQ(ps.blocks, kept);
        ASSERT_TRUE(ps.admitted > kept);
    }
    /* The same request again: its solo result, bitwise. */
    lkv_request *qc = make(200, 3, 4, 6, 0, mode);
    qc->rag.stop_at_eos = 0;
    lkv_engine_req *c;
    ASSERT_OK(lkv_engine_submit(e, qc, 0, NULL, NULL, &c, NULL, 0));
    ASSERT_OK(wait_end(c, NULL));
    lkv_engine_result er;
    lkv_engine_result_get(c, &er);
    ASSERT_EQ(er.res->n_out, solo.n_out);
    ASSERT_TRUE(memcmp(er.res->logits, solo.logits, (size_t)solo.n_out * solo.vocab * 4) == 0);
    if (mode == LKV_RAG_PREFIX) {
        ASSERT_EQ(er.res->prefix_hit_blocks, kept);
    }
    lkv_engine_release(a);
    lkv_engine_release(b);
    lkv_engine_release(c);
    lkv_rag_result_free(&solo);
    lkv_engine_destroy(e);
    lkv_worker_destroy(w);
}

static void test_cancel_mid_prefill(void)
{
    cancel_mid_prefill(LKV_RAG_LAZY);
    cancel_mid_prefill(LKV_RAG_PREFIX);
}

static void test_chunk_option(void)
{
    lkv_worker_opts o = {.model_path = LKV_TEST_MODEL_DIR "/stories260K.bin",
                         .local_pages = 16,
                         .prefill_chunk = -1};
    lkv_worker *w;
    char err[256];
    ASSERT_ERR(lkv_worker_create(&o, &w, err, sizeof(err)), LKV_EINVAL);
    ASSERT_TRUE(strstr(err, "prefill_chunk") != NULL);
    w = worker(16);
    lkv_engine_opts eo = {.prefill_tokens = -1};
    lkv_engine *e;
    ASSERT_ERR(lkv_engine_create(w, &eo, &e), LKV_EINVAL);
    lkv_worker_destroy(w);
}

int main(void)
{
    LKV_RUN(test_batch_equals_solo);
    LKV_RUN(test_pages_cancel_fifo);
    LKV_RUN(test_deadlines);
    LKV_RUN(test_queue_full);
    LKV_RUN(test_chunked_equals_solo);
    LKV_RUN(test_cancel_mid_prefill);
    LKV_RUN(test_chunk_option);
    return 0;
}
