/*
 * lkv_worker_svc.c: the lazykv.v1.Worker service (see lkv_worker_svc.h).
 *
 * Per call: a gen_call with two references (the call's, dropped in cleanup; the engine's,
 * dropped by its last notify). gc->mu orders a park (next found no event) against a notify (an
 * event was pushed): the notify resumes the call only if it is parked, and next looks for an
 * event and parks under the same lock, so no event is missed and no call is resumed twice.
 */
#include "lkv_worker_svc.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lazykv/v1/worker.pb-c.h"
#include "lkv_err.h"
#include "lkv_log.h"

#define DEFAULT_MAX_TOKENS 64

typedef struct gen_call {
    pthread_mutex_t mu;
    int refs;            /* Call + engine. */
    lkv_worker_svc *svc; /* Borrowed. */
    lkv_engine_req *r;   /* The request (NULL if submit failed). */
    int parked;          /* 1 while the call waits for an event. */
    lkv_rpc_ticket ticket;
    int sent_end; /* The Summary went out: the next next() finishes with OK. */
} gen_call;

static void gc_unref(gen_call *gc)
{
    pthread_mutex_lock(&gc->mu);
    int left = --gc->refs;
    pthread_mutex_unlock(&gc->mu);
    if (left == 0) {
        lkv_engine_release(gc->r);
        pthread_mutex_destroy(&gc->mu);
        free(gc);
    }
}

static int step(gen_call *gc, lkv_rpc *rpc);

static int resume_fn(void *svc, lkv_rpc *rpc, void *arg)
{
    (void)svc;
    return step(arg, rpc);
}

/* Engine thread: an event is ready (last: the final call). */
static void on_notify(void *arg, int last)
{
    gen_call *gc = arg;
    pthread_mutex_lock(&gc->mu);
    int resume = gc->parked;
    gc->parked = 0;
    lkv_rpc_ticket t = gc->ticket;
    pthread_mutex_unlock(&gc->mu);
    if (resume) {
        lkv_rpc_resume(t, resume_fn, gc); /* LKV_ECANCELLED: the call ended; nothing to do. */
    }
    if (last) {
        gc_unref(gc);
    }
}

static int send_summary(lkv_rpc *rpc, lkv_engine_req *r)
{
    lkv_engine_result er;
    lkv_engine_result_get(r, &er);
    const lkv_rag_result *res = er.res;
    Lazykv__V1__Summary sm = LAZYKV__V1__SUMMARY__INIT;
    sm.id = (char *)er.id;
    sm.n_out = (uint32_t)res->n_out;
    sm.stop_eos = res->stop_eos;
    sm.n_prompt = (uint32_t)res->n_prompt;
    sm.queue_ms = er.queue_ms;
    sm.ttft_ms = res->ttft_ms;
    sm.tpot_ms = res->tpot_ms;
    sm.total_ms = res->total_ms;
    sm.lookup_ms = res->lookup_ms;
    sm.attach_ms = res->attach_ms;
    sm.miss_ms = res->miss_ms;
    sm.put_ms = res->put_ms;
    sm.hit_docs = (uint32_t)res->hit_docs;
    sm.miss_docs = (uint32_t)res->miss_docs;
    sm.hit_tokens = res->hit_tokens;
    sm.miss_tokens = res->miss_tokens;
    sm.zero_copy_blocks = res->zero_copy_blocks;
    sm.local_only = res->local_only;
    sm.max_batch_seen = (uint32_t)er.max_batch_seen;
    sm.kv_pages = er.kv_pages;
    sm.note = (char *)res->note;
    sm.text = res->text != NULL ? res->text : (char *)"";
    Lazykv__V1__DocResult *dr = lkv_xcalloc((size_t)(res->n_docs ? res->n_docs : 1), sizeof(*dr));
    Lazykv__V1__DocResult **dp = lkv_xcalloc((size_t)(res->n_docs ? res->n_docs : 1), sizeof(*dp));
    for (int i = 0; i < res->n_docs; i++) {
        lazykv__v1__doc_result__init(&dr[i]);
        dr[i].hit = res->docs[i].hit;
        dr[i].tier = (Lazykv__V1__Tier)res->docs[i].tier;
        dr[i].n_tokens = (uint32_t)res->docs[i].n_tokens;
        dr[i].start = res->docs[i].start;
        dr[i].n_blocks = res->docs[i].n_blocks;
        dr[i].stored = res->docs[i].stored;
        dr[i].key_hex = (char *)res->docs[i].key_hex;
        dp[i] = &dr[i];
    }
    sm.n_docs = (size_t)res->n_docs;
    sm.docs = dp;
    Lazykv__V1__GenerateReply rep = LAZYKV__V1__GENERATE_REPLY__INIT;
    rep.kind_case = LAZYKV__V1__GENERATE_REPLY__KIND_SUMMARY;
    rep.summary = &sm;
    int rc = lkv_rpc_send(rpc, &rep.base);
    free(dr);
    free(dp);
    return rc;
}

/* Sends the next event, finishes, or parks (the call's thread). */
static int step(gen_call *gc, lkv_rpc *rpc)
{
    if (gc->sent_end) {
        return 0; /* Nothing sent: the call ends with OK. */
    }
    lkv_engine_event ev;
    pthread_mutex_lock(&gc->mu);
    if (!lkv_engine_next(gc->r, &ev)) {
        int rc = lkv_rpc_defer(rpc, &gc->ticket);
        gc->parked = 1;
        pthread_mutex_unlock(&gc->mu);
        return rc;
    }
    pthread_mutex_unlock(&gc->mu);
    if (ev.kind == LKV_ENGINE_TOKEN) {
        Lazykv__V1__Token t = LAZYKV__V1__TOKEN__INIT;
        t.index = (uint32_t)ev.index;
        t.id = (uint32_t)ev.token;
        t.text = ev.text;
        Lazykv__V1__GenerateReply rep = LAZYKV__V1__GENERATE_REPLY__INIT;
        rep.kind_case = LAZYKV__V1__GENERATE_REPLY__KIND_TOKEN;
        rep.token = &t;
        return lkv_rpc_send(rpc, &rep.base);
    }
    if (ev.rc != 0) {
        lkv_engine_result er;
        lkv_engine_result_get(gc->r, &er);
        return lkv_rpc_errorf(rpc, ev.rc, "%s",
                              er.res->error[0] ? er.res->error : lkv_strerror(ev.rc));
    }
    gc->sent_end = 1;
    return send_summary(rpc, gc->r);
}

/* GenerateRequest -> a new lkv_request (caller owns both on success and error). */
static int to_request(lkv_worker_svc *svc, lkv_rpc *rpc, const Lazykv__V1__GenerateRequest *g,
                      lkv_request *r)
{
    const lkv_tokenizer *tok = lkv_worker_tokenizer(svc->worker);
    const int V = lkv_worker_model(svc->worker)->cfg.vocab_size;
    char err[512];
    snprintf(r->id, sizeof(r->id), "%s", g->id != NULL ? g->id : "");
    int nd = (int)g->n_docs;
    r->docs = lkv_xcalloc((size_t)(nd ? nd : 1), sizeof(*r->docs));
    r->doc_tokens = lkv_xcalloc((size_t)(nd ? nd : 1), sizeof(*r->doc_tokens));
    r->rag.n_docs = nd;
    r->rag.docs = r->docs;
    for (int i = 0; i < nd; i++) {
        const Lazykv__V1__Document *d = g->docs[i];
        int has_text = d->text != NULL && d->text[0] != '\0';
        if (has_text == (d->n_tokens > 0)) {
            return lkv_rpc_errorf(rpc, LKV_EINVAL,
                                  "document %d: set exactly one of text and tokens", i);
        }
        int n = 0;
        if (has_text) {
            char what[32];
            snprintf(what, sizeof(what), "document %d", i);
            if (lkv_request_encode(tok, d->text, !g->no_bos, what, &r->doc_tokens[i], &n, err,
                                   sizeof(err)) != 0) {
                return lkv_rpc_errorf(rpc, LKV_EINVAL, "%s", err);
            }
        } else {
            r->doc_tokens[i] = lkv_xmalloc(d->n_tokens * sizeof(int));
            for (size_t t = 0; t < d->n_tokens; t++) {
                if (d->tokens[t] >= (uint32_t)V) {
                    return lkv_rpc_errorf(rpc, LKV_EINVAL,
                                          "document %d token %zu is %u, outside the vocabulary "
                                          "0..%d",
                                          i, t, d->tokens[t], V - 1);
                }
                r->doc_tokens[i][t] = (int)d->tokens[t];
            }
            n = (int)d->n_tokens;
        }
        r->docs[i].tokens = r->doc_tokens[i];
        r->docs[i].n_tokens = n;
    }
    int has_q = g->question != NULL && g->question[0] != '\0';
    if (has_q == (g->n_question_tokens > 0)) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL,
                              "set exactly one of question and question_tokens (the question is "
                              "required)");
    }
    int nq = 0;
    if (has_q) {
        if (lkv_request_encode(tok, g->question, 0, "the question", &r->question, &nq, err,
                               sizeof(err)) != 0) {
            return lkv_rpc_errorf(rpc, LKV_EINVAL, "%s", err);
        }
    } else {
        r->question = lkv_xmalloc(g->n_question_tokens * sizeof(int));
        for (size_t t = 0; t < g->n_question_tokens; t++) {
            if (g->question_tokens[t] >= (uint32_t)V) {
                return lkv_rpc_errorf(rpc, LKV_EINVAL,
                                      "question token %zu is %u, outside the vocabulary 0..%d", t,
                                      g->question_tokens[t], V - 1);
            }
            r->question[t] = (int)g->question_tokens[t];
        }
        nq = (int)g->n_question_tokens;
    }
    r->rag.question = r->question;
    r->rag.n_question = nq;
    int def = svc->default_max_tokens > 0 ? svc->default_max_tokens : DEFAULT_MAX_TOKENS;
    r->rag.max_tokens = g->max_tokens > 0 ? (int)g->max_tokens : def;
    if (svc->max_tokens_limit > 0 && r->rag.max_tokens > svc->max_tokens_limit) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "max_tokens %d is above this worker's limit %d",
                              r->rag.max_tokens, svc->max_tokens_limit);
    }
    if (g->sampling != NULL) {
        r->rag.sampling.temperature = g->sampling->temperature;
        r->rag.sampling.top_p = g->sampling->top_p;
        r->rag.sampling.seed = g->sampling->seed;
    }
    r->rag.stop_at_eos = !g->ignore_eos;
    if (g->mode != LAZYKV__V1__MODE__MODE_LAZY && g->mode != LAZYKV__V1__MODE__MODE_MATERIALISE) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "unknown mode %d", (int)g->mode);
    }
    r->rag.mode =
        g->mode == LAZYKV__V1__MODE__MODE_MATERIALISE ? LKV_RAG_MATERIALISE : LKV_RAG_LAZY;
    r->rag.no_cache = g->no_cache;
    return 0;
}

static int gen_start(void *svcp, lkv_rpc *rpc, const ProtobufCMessage *msg)
{
    lkv_worker_svc *svc = svcp;
    const Lazykv__V1__GenerateRequest *g = (const Lazykv__V1__GenerateRequest *)msg;
    lkv_request *r = lkv_xcalloc(1, sizeof(*r));
    int rc = to_request(svc, rpc, g, r);
    if (rc != 0) {
        lkv_request_free(r);
        free(r);
        return rc;
    }
    gen_call *gc = lkv_xcalloc(1, sizeof(*gc));
    pthread_mutex_init(&gc->mu, NULL);
    gc->svc = svc;
    gc->refs = 2;
    lkv_rpc_set_state(rpc, gc);
    int64_t left = lkv_rpc_deadline_left_ms(rpc);
    char err[512];
    /* Hold gc->mu so a notify before r is stored cannot look at it half made. */
    pthread_mutex_lock(&gc->mu);
    rc = lkv_engine_submit(svc->engine, r,
                           left == INT64_MAX ? 0 /* No deadline. */
                           : left > 0        ? left
                                             : 1,
                           on_notify, gc, &gc->r, err, sizeof(err));
    if (rc != 0) {
        gc->refs = 1; /* No engine reference: no notify will come. */
        pthread_mutex_unlock(&gc->mu);
        return lkv_rpc_errorf(rpc, rc, "%s", err);
    }
    pthread_mutex_unlock(&gc->mu);
    return step(gc, rpc);
}

static int gen_next(void *svc, lkv_rpc *rpc)
{
    (void)svc;
    return step(lkv_rpc_state(rpc), rpc);
}

static void gen_cleanup(void *svc, lkv_rpc *rpc)
{
    (void)svc;
    gen_call *gc = lkv_rpc_state(rpc);
    if (gc == NULL) {
        return;
    }
    pthread_mutex_lock(&gc->mu);
    gc->parked = 0;
    pthread_mutex_unlock(&gc->mu);
    if (gc->r != NULL) {
        lkv_engine_cancel(gc->r); /* No-op if it ended; else its slot and pages go now. */
    }
    gc_unref(gc);
}

int lkv_worker_svc_methods(lkv_worker_svc *svc, lkv_method *methods)
{
    methods[0] = (lkv_method){.path = "/lazykv.v1.Worker/Generate",
                              .kind = LKV_RPC_SERVER_STREAM,
                              .req_desc = &lazykv__v1__generate_request__descriptor,
                              .svc = svc,
                              .start = gen_start,
                              .next = gen_next,
                              .cleanup = gen_cleanup};
    return LKV_WORKER_SVC_METHODS;
}
