/*
 * lkv_worker.c: the decode worker (see lkv_worker.h).
 *
 * Per request, everything lives in one req_state (segments, references, the lease), freed at the
 * end whatever happened. Worker pages are reused across requests: the page space's bump
 * allocator restarts at the first worker page for each request (lkv_pagespace_view).
 *
 * Segments: one per document (a hit points at the daemon's pages, a miss at worker pages), one
 * for the question and the generated tokens. A document repeated in one prompt (the same key) is
 * computed once and placed twice. In materialise mode every document segment is replaced by a
 * re-rotated copy in worker pages, placed at start 0 (lkv_attn.h, materialise).
 *
 * Deadline: opts.deadline_ms covers the daemon calls before the first token (from the start of
 * the call: Lookup, Attach), and again those after the last one (Put, Release); each call gets
 * what is left of its window, so none can hang past it. A lease renewal gets a full window. A
 * generation itself is not bounded by it (its length is max_tokens).
 */
#include "lkv_worker.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "lkv_backend_cpu.h"
#include "lkv_err.h"
#include "lkv_half.h"
#include "lkv_log.h"
#include "lkv_pagespace.h"
#include "lkv_policy.h"
#include "lkv_prefix.h"
#include "lkv_runner.h"
#include "lkv_synth.h"

#define DEFAULT_PROFILE     "stories260k"
#define DEFAULT_DEADLINE_MS 10000
#define DEFAULT_TTL_MS      30000u
#define DEFAULT_LOCAL_PAGES 2048u
#define DEFAULT_RETRY_MS    2000
#define RETRY_STEP_MS       100

struct lkv_worker {
    lkv_worker_opts o;     /* Options (defaults filled in; strings point at the copies). */
    char *target;          /* Daemon address (owned), NULL in local mode. */
    char *profile;         /* Profile name (owned). */
    char *model_path;      /* Checkpoint path (owned). */
    char *model_id;        /* Revision to confirm (owned), or NULL. */
    char *token;           /* Bearer token (owned), or NULL. */
    char *tls[4];          /* TLS CA, cert, key, server name (owned), or NULL. */
    lkv_model *m;          /* The model (owned). */
    lkv_tokenizer tok;     /* The tokenizer, when have_tok. */
    int have_tok;          /* 1 if a tokenizer was loaded. */
    lkv_runner run;        /* The model on the backend. */
    const lkv_backend *be; /* Borrowed. */
    lkv_client_t *cl;      /* NULL in local mode. */
    lkv_pagespace ps;      /* Daemon arena + worker pages. */
    lkv_kv_shape shape;    /* The profile's layout for this model. */
    char hash[80];         /* "blake2b:<hex>" of the checkpoint. */
    lkv_worker_stats st;   /* Totals (arena_maps read from ps). */
    int inplace_off;       /* 1: the daemon refused Reserve (role, leases off): Put only. */
    int async;             /* 1: daemon calls are taken by the caller (lkv_worker_set_async). */
    lkv_prefix *prefix;    /* Prefix pool (LKV_RAG_PREFIX), or NULL. Owned. */
    uint32_t prefix_pages; /* Its pages: the last prefix_pages worker pages. */
    uint64_t copy_next;    /* Placeholder documents made for Block-Attention copies. */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static char *dup_or_null(const char *s)
{
    return s != NULL && s[0] != '\0' ? lkv_xstrdup(s) : NULL;
}

int lkv_worker_hash_file(const char *path, char *out, size_t len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL || len < 8 + 2 * crypto_generichash_BYTES + 1 || sodium_init() < 0) {
        if (f != NULL) {
            fclose(f);
        }
        return LKV_EIO;
    }
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, crypto_generichash_BYTES);
    uint8_t buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
        crypto_generichash_update(&st, buf, n);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        return LKV_EIO;
    }
    uint8_t h[crypto_generichash_BYTES];
    crypto_generichash_final(&st, h, sizeof(h));
    memcpy(out, "blake2b:", 8);
    sodium_bin2hex(out + 8, len - 8, h, sizeof(h));
    return 0;
}

/* The client options of every connection to the daemon (deadline, token, TLS). */
static lkv_client_options client_opts(const lkv_worker *w)
{
    return (lkv_client_options){.default_deadline_ms = w->o.deadline_ms,
                                .bearer_token = w->token,
                                .tls_ca_file = w->tls[0],
                                .tls_cert_file = w->tls[1],
                                .tls_key_file = w->tls[2],
                                .tls_server_name = w->tls[3]};
}

int lkv_worker_create(const lkv_worker_opts *o, lkv_worker **out, char *err, size_t errlen)
{
    *out = NULL;
    if (o == NULL || (o->model_path == NULL && o->synth == NULL)) {
        return lkv_errf(err, errlen, LKV_EINVAL, "worker: a model checkpoint path is required");
    }
    if (o->prefill_chunk < 0) {
        return lkv_errf(err, errlen, LKV_EINVAL, "worker: prefill_chunk must be >= 0 (0: whole)");
    }
    lkv_worker *w = lkv_xcalloc(1, sizeof(*w));
    w->o = *o;
    w->target = dup_or_null(o->target);
    w->profile = lkv_xstrdup(o->profile != NULL && o->profile[0] ? o->profile : DEFAULT_PROFILE);
    w->model_path = lkv_xstrdup(o->model_path != NULL ? o->model_path : o->synth);
    w->model_id = dup_or_null(o->model_id);
    w->token = dup_or_null(o->bearer_token);
    w->tls[0] = dup_or_null(o->tls_ca_file);
    w->tls[1] = dup_or_null(o->tls_cert_file);
    w->tls[2] = dup_or_null(o->tls_key_file);
    w->tls[3] = dup_or_null(o->tls_server_name);
    w->o.target = w->target; /* The copies, not the caller's strings. */
    w->o.profile = w->profile;
    w->o.model_path = w->model_path;
    w->o.model_id = w->model_id;
    w->o.bearer_token = w->token;
    w->o.tls_ca_file = w->tls[0];
    w->o.tls_cert_file = w->tls[1];
    w->o.tls_key_file = w->tls[2];
    w->o.tls_server_name = w->tls[3];
    w->o.tokenizer_path = NULL;
    w->o.deadline_ms = o->deadline_ms > 0 ? o->deadline_ms : DEFAULT_DEADLINE_MS;
    w->o.lease_ttl_ms = o->lease_ttl_ms > 0 ? o->lease_ttl_ms : DEFAULT_TTL_MS;
    w->o.local_pages = o->local_pages > 0 ? o->local_pages : DEFAULT_LOCAL_PAGES;
    w->o.retry_ms = o->retry_ms > 0 ? o->retry_ms : o->retry_ms < 0 ? 0 : DEFAULT_RETRY_MS;
    w->be = o->backend != NULL ? o->backend : lkv_backend_cpu();
    int rc;
    if (o->synth != NULL) {
        /* "PRESET[:SEED]": random weights (lkv_synth.h); identity "synth:PRESET:SEED". */
        char preset[64];
        unsigned long seed = 0;
        const char *colon = strchr(o->synth, ':');
        size_t pl = colon != NULL ? (size_t)(colon - o->synth) : strlen(o->synth);
        snprintf(preset, sizeof(preset), "%.*s", (int)(pl < 63 ? pl : 63), o->synth);
        if (colon != NULL) {
            seed = strtoul(colon + 1, NULL, 10);
        }
        rc = lkv_synth_model(preset, (uint32_t)seed, 0, &w->m);
        if (rc != 0) {
            lkv_errf(err, errlen, rc,
                     "worker: unknown synthetic model '%s' (llama3-8b, llama3-mini)", o->synth);
            goto fail;
        }
        snprintf(w->hash, sizeof(w->hash), "synth:%s:%lu", preset, seed);
        rc = 0;
    } else {
        rc = lkv_model_load(w->model_path, &w->m);
    }
    if (rc != 0) {
        lkv_errf(err, errlen, rc, "worker: cannot load the checkpoint %s: %s", w->model_path,
                 lkv_strerror(rc));
        goto fail;
    }
    if (o->round_weights_bf16) {
        size_t nw = 0;
        const lkv_model_cfg *mc = &w->m->cfg;
        const float *end = w->m->wcls != w->m->tok_emb
                               ? w->m->wcls + (size_t)mc->vocab_size * mc->dim
                               : w->m->rms_final + mc->dim;
        nw = (size_t)(end - w->m->data);
        for (size_t i = 0; i < nw; i++) {
            w->m->data[i] = lkv_bf16_to_f32(lkv_f32_to_bf16(w->m->data[i]));
        }
    }
    rc = o->synth != NULL ? 0 : lkv_worker_hash_file(w->model_path, w->hash, sizeof(w->hash));
    if (rc != 0) {
        lkv_errf(err, errlen, rc, "worker: cannot hash %s", w->model_path);
        goto fail;
    }
    if (o->tokenizer_path != NULL) {
        rc = lkv_tokenizer_load(&w->tok, o->tokenizer_path, w->m->cfg.vocab_size);
        if (rc != 0) {
            lkv_errf(err, errlen, rc, "worker: cannot load the tokenizer %s: %s", o->tokenizer_path,
                     lkv_strerror(rc));
            goto fail;
        }
        w->have_tok = 1;
    }
    const lkv_model_cfg *c = &w->m->cfg;
    w->shape = (lkv_kv_shape){.n_layers = c->n_layers,
                              .n_q_heads = c->n_heads,
                              .n_kv_heads = c->n_kv_heads,
                              .head_dim = c->head_dim,
                              .dtype = o->dtype,
                              .block_tokens = o->block_tokens > 0 ? o->block_tokens : 16};
    if (w->shape.block_tokens > LKV_MAX_BLOCK_TOKENS || lkv_dtype_size(w->shape.dtype) == 0) {
        rc = lkv_errf(err, errlen, LKV_EINVAL, "worker: bad block_tokens %d or dtype %d",
                      w->shape.block_tokens, w->shape.dtype);
        goto fail;
    }
    if (w->o.max_position <= 0 || w->o.max_position > c->seq_len) {
        w->o.max_position = c->seq_len;
    }
    rc = lkv_runner_init(&w->run, w->m, w->be);
    if (rc != 0) {
        lkv_errf(err, errlen, rc, "worker: runner: %s", lkv_strerror(rc));
        goto fail;
    }
    w->run.last_logits = 1; /* Sampling reads the question's last row only. */
    if (o->threads > 0) {
        lkv_attn_cpu_set_threads(o->threads);
    }
    lkv_pagespace_init(&w->ps, w->o.local_pages);
    w->ps.writable = w->target != NULL && !w->o.no_inplace; /* Misses computed in place. */
    if (strcmp(w->be->name, "cpu") != 0) {
        /* A device backend keeps the worker pages in its own memory and maps the daemon's
         * device arena through its devmap ops (lkv_pagespace.h, "Device arenas"). */
        if (w->be->devmap == NULL && w->target != NULL) {
            rc = lkv_errf(err, errlen, LKV_ENOTSUP,
                          "worker: the %s backend cannot map lazykvd's arena (no device mapping "
                          "ops): run it without a daemon",
                          w->be->name);
            goto fail;
        }
    }
    w->ps.dev = w->be->devmap; /* NULL for the CPU backend: host (shm) arenas. */
    if (w->target != NULL) {
        lkv_client_options co = client_opts(w);
        rc = lkv_client_create(w->target, &co, &w->cl);
        if (rc != 0) {
            lkv_errf(err, errlen, rc, "worker: client for %s: %s", w->target,
                     lkv_client_last_error());
            goto fail;
        }
    }
    *out = w;
    return 0;
fail:
    lkv_worker_destroy(w);
    return rc;
}

void lkv_worker_destroy(lkv_worker *w)
{
    if (w == NULL) {
        return;
    }
    lkv_client_destroy(w->cl);
    lkv_prefix_destroy(w->prefix);
    lkv_pagespace_free(&w->ps);
    lkv_runner_free(&w->run);
    if (w->have_tok) {
        lkv_tokenizer_free(&w->tok);
    }
    lkv_model_destroy(w->m);
    free(w->target);
    free(w->profile);
    free(w->model_path);
    free(w->model_id);
    free(w->token);
    for (int i = 0; i < 4; i++) {
        free(w->tls[i]);
    }
    free(w);
}

const lkv_tokenizer *lkv_worker_tokenizer(const lkv_worker *w)
{
    return w->have_tok ? &w->tok : NULL;
}

const lkv_model *lkv_worker_model(const lkv_worker *w)
{
    return w->m;
}

const char *lkv_worker_model_hash(const lkv_worker *w)
{
    return w->hash;
}

void lkv_worker_stats_get(const lkv_worker *w, lkv_worker_stats *st)
{
    *st = w->st;
    st->arena_maps = w->ps.n_maps;
    st->placement = w->ps.placement;
}

void lkv_rag_result_free(lkv_rag_result *res)
{
    free(res->tokens);
    free(res->text);
    free(res->logits);
    free(res->docs);
    memset(res, 0, sizeof(*res));
}

/* ---- One request ------------------------------------------------------------------------ */

typedef struct lkv_worker_job {
    lkv_worker *w;
    const lkv_rag_request *req;
    lkv_rag_result *res;
    double t0;              /* Start of the call (ms, monotonic). */
    double t_phase;         /* Start of the current deadline window: the call (Lookup, Attach),
                               then the end of generation (Put, Release). */
    int use_daemon;         /* 1: talk to lazykvd for this request. */
    lkv_doc_status *status; /* [n_docs] Lookup replies. */
    lkv_lease lease;        /* The request's lease (live when lease.live). */
    double lease_t;         /* When the lease was made or last renewed. */
    lkv_model_kv kv;        /* View of the page space for this request. */
    lkv_model_seg *segs;    /* [n_docs + 1]: documents, then the question. */
    int *miss_src;          /* [n_docs]: -1 computed here, else the earlier doc reused. */
    /* Stepwise state (lkv_worker_job_*): */
    lkv_docref *refs;       /* [n_docs] the documents by token ids (Lookup, Put). Owned. */
    uint32_t *ids;          /* Their ids as uint32 (refs point in). Owned. */
    int phase;              /* enum job_phase. */
    int next_doc;           /* PH_MISSES: the next document to look at. */
    uint32_t *grant;        /* Absolute worker pages granted (engine), or NULL (bump). Owned. */
    uint64_t maps_at_start; /* ps.n_maps when the request's pages were set up. */
    float *logits;          /* [n_question][vocab] host logits of the last pass. Owned. */
    const float *row;       /* The row the next token is sampled from. */
    uint64_t rng;           /* Sampling state. */
    int prev;               /* Previous token (text decoding). */
    int next_tok;           /* The token the next decode step appends. */
    double t_first;         /* When the first token was sampled. */
    size_t tcap, tlen;      /* res->text capacity and length. */
    int rc;                 /* First failure, or 0. */
    lkv_reservation *resv;  /* [n_docs] put in place: the reservation of a miss. */
    int *resv_state;        /* [n_docs]: 0 none, 1 reserved (compute, commit), 2 cached
                               meanwhile (attached by the Reserve: read in place), -1 no room
                               (no_put_when_full: not stored). */
    int *att_idx;           /* [n_docs]: request index of the j-th attached document. */
    int n_att;              /* Documents asked for in the Attach. */
    uint8_t **put_buf;      /* [n_docs]: gathered blocks of a miss to Put (owned), or NULL. */
    uint32_t *put_blocks;   /* [n_docs]: their blocks. */
    uint32_t *grant_rel;    /* Granted pages relative to the first worker page (owned). */
    uint32_t n_grant;       /* Entries of grant and grant_rel. */
    int replay, replay_to;  /* After restart_local: tokens of res fed again so far, and how many
                               are to be (replay < replay_to: replaying, nothing sampled). */
    /* Daemon calls (lkv_worker_job_take_call / _call / _called): */
    int inflight;        /* enum lkv_job_call in flight, or LKV_CALL_NONE. */
    int call_rc;         /* Outcome of the last START or RENEW call. */
    double renew_sent;   /* When the last renewal was sent. */
    char renew_msg[320]; /* Why it failed. */
    int ending;          /* lkv_worker_job_end was called. */
    int store;           /* The END call commits and puts the misses. */
    int end_called;      /* The END call ran. */
    /* Baselines (bench/serving; DESIGN.md 7.2): */
    lkv_reservation *copy; /* [n_docs] copy_budget: the placeholder reserved for a copy. */
    int *copy_state;       /* [n_docs]: 0 none, 1 copy reserved, -1 refused (recomputed, not
                              stored again). */
    uint64_t *pfx;         /* Prefix mode: pool blocks pinned by this request. Owned. */
    int n_pfx, cap_pfx;
    uint64_t pfx_chain; /* Chain value after the last block looked at. */
    int pfx_hitting;    /* 1 while every block so far was found. */
    int pfx_caching;    /* 1 while every computed block so far was admitted. */
    int pfx_ready;      /* Entries of pfx whose KV is written (the rest are pending). */
    int pfx_doc0;       /* Entry of pfx of the document in progress's first admitted block. */
    int pfx_blk0;       /* That block's index in the document. */
    /* Chunked prefill (opts.prefill_chunk): */
    int seg_open;       /* 1 while the segment in progress (document next_doc, or the question)
                           has chunks done and more to do. */
    uint64_t prefilled; /* Tokens prefilled (lkv_worker_job_prefilled). */
} req_state;

enum job_phase {
    PH_WAIT = -1,  /* Waiting for the START call (Lookup, Attach, Reserve). */
    PH_MISSES = 0, /* Computing misses, one document (or one chunk of one) per step. */
    PH_QUESTION,   /* Materialise (that mode) and the question prefill, in one step (or one
                      chunk per step, the copies with the first). */
    PH_DECODE,     /* One token per step. */
    PH_DONE,       /* Generation over (finish, or failed). */
};

static void note(lkv_rag_result *res, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void note(lkv_rag_result *res, const char *fmt, ...)
{
    size_t n = strlen(res->note);
    if (n + 3 >= sizeof(res->note)) {
        return;
    }
    if (n > 0) {
        memcpy(res->note + n, "; ", 3);
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->note + n, sizeof(res->note) - n, fmt, ap);
    va_end(ap);
}

/* Milliseconds left of the current phase's deadline (at least 1 while not passed), or 0. */
static int left_ms(const req_state *s)
{
    double left = (double)s->w->o.deadline_ms - (now_ms() - s->t_phase);
    return left >= 1.0 ? (int)left : 0;
}

/* 1 if rc from a daemon call means the daemon is unreachable, restarting or too slow. */
static int daemon_down(int rc)
{
    return rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT || rc == LKV_ECANCELLED || rc == LKV_ESHUTDOWN;
}

/* Handles a failed daemon call of step what: with local_fallback and a down daemon, switches
 * the request to local mode and returns 0; else fills res->error and returns rc. */
static int daemon_failed(req_state *s, const char *what, int rc)
{
    const char *msg = lkv_client_last_error();
    if (daemon_down(rc) && s->w->o.local_fallback) {
        note(s->res,
             "lazykvd at %s unavailable during %s (%s: %s): computed every document "
             "locally (local fallback)",
             s->w->target, what, lkv_err_name(rc), msg);
        s->use_daemon = 0;
        s->res->local_only = 1;
        return 0;
    }
    if (daemon_down(rc)) {
        return lkv_errf(s->res->error, sizeof(s->res->error), rc,
                        "lazykvd at %s is unavailable during %s (%s: %s); the request was not "
                        "served (start the daemon, or run with --local-fallback to compute "
                        "locally%s)",
                        s->w->target, what, lkv_err_name(rc), msg,
                        s->w->tls[0] == NULL ? "; a daemon with TLS on needs --tls-ca" : "");
    }
    return lkv_errf(s->res->error, sizeof(s->res->error), rc,
                    "%s refused by lazykvd at %s: %s (%s)", what, s->w->target,
                    msg[0] ? msg : lkv_strerror(rc), lkv_err_name(rc));
}

/* Checks the profile's declared weights identity against the loaded checkpoint. */
static int check_model_id(req_state *s, const char *declared)
{
    lkv_worker *w = s->w;
    if (declared[0] == '\0') {
        note(s->res, "profile '%s' declares no model_id: the weights are not verified", w->profile);
        return 0;
    }
    if (strncmp(declared, "blake2b:", 8) == 0) {
        if (strcmp(declared, w->hash) == 0) {
            return 0;
        }
        return lkv_errf(
            s->res->error, sizeof(s->res->error), LKV_EPROFILE,
            "model identity mismatch: profile '%s' on lazykvd declares model_id %s, but "
            "the loaded checkpoint %s is %s; KV of another model is never used (load "
            "the right checkpoint, or give this model its own profile)",
            w->profile, declared, w->model_path, w->hash);
    }
    if (w->model_id == NULL) {
        return lkv_errf(
            s->res->error, sizeof(s->res->error), LKV_EPROFILE,
            "model identity not confirmed: profile '%s' declares the revision '%s'; run "
            "the worker with --model-id '%s' if %s is that model",
            w->profile, declared, declared, w->model_path);
    }
    if (strcmp(declared, w->model_id) != 0) {
        return lkv_errf(s->res->error, sizeof(s->res->error), LKV_EPROFILE,
                        "model identity mismatch: profile '%s' declares model_id '%s', the worker "
                        "runs '%s'; KV of another model is never used",
                        w->profile, declared, w->model_id);
    }
    return 0;
}

/* The request's token docrefs (ids copied to uint32). *ids owned by the caller. */
static lkv_docref *make_refs(const req_state *s, uint32_t **ids)
{
    const lkv_rag_request *q = s->req;
    size_t total = 0;
    for (int i = 0; i < q->n_docs; i++) {
        total += (size_t)q->docs[i].n_tokens;
    }
    *ids = lkv_xmalloc((total ? total : 1) * sizeof(uint32_t));
    lkv_docref *refs = lkv_xcalloc((size_t)(q->n_docs ? q->n_docs : 1), sizeof(*refs));
    size_t off = 0;
    for (int i = 0; i < q->n_docs; i++) {
        for (int t = 0; t < q->docs[i].n_tokens; t++) {
            (*ids)[off + (size_t)t] = (uint32_t)q->docs[i].tokens[t];
        }
        refs[i].profile = s->w->profile;
        refs[i].tokens = *ids + off;
        refs[i].n_tokens = (size_t)q->docs[i].n_tokens;
        off += (size_t)q->docs[i].n_tokens;
    }
    return refs;
}

static int layout_matches(const lkv_worker *w, const lkv_attached_doc *d, char *why, size_t len)
{
    const lkv_kv_shape *s = &w->shape;
    static const char *const dt[] = {"f32", "f16", "bf16"};
    if (d->n_layers != (uint32_t)s->n_layers || d->n_kv_heads != (uint32_t)s->n_kv_heads ||
        d->head_dim != (uint32_t)s->head_dim || d->block_tokens != (uint32_t)s->block_tokens ||
        strcmp(d->dtype, dt[s->dtype]) != 0 || d->block_bytes != lkv_block_bytes(s)) {
        snprintf(why, len,
                 "profile '%s' stores %u layers x %u kv heads x %u dims, %s, %u-token blocks; "
                 "the worker's model needs %d x %d x %d, %s, %d-token blocks",
                 w->profile, d->n_layers, d->n_kv_heads, d->head_dim, d->dtype, d->block_tokens,
                 s->n_layers, s->n_kv_heads, s->head_dim, dt[s->dtype], s->block_tokens);
        return 0;
    }
    return 1;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ b[i]) * 0x100000001b3ull;
    }
    return h;
}

/* Records where document i's pages are (region pages: page0, pages_hash) and, with hash_kv,
 * the hash of its block bytes read back through the page space (backend to_host). */
static void note_pages(req_state *s, int i)
{
    lkv_worker *w = s->w;
    const lkv_model_seg *g = &s->segs[i];
    lkv_rag_doc_result *d = &s->res->docs[i];
    d->page0 = -1;
    d->pages_hash = 0;
    if (g->n_blocks > 0 && lkv_pagespace_is_daemon(&w->ps, g->pages[0])) {
        d->page0 = (int64_t)(g->pages[0] - w->ps.daemon0);
        uint64_t h = 0xcbf29ce484222325ull;
        for (int b = 0; b < g->n_blocks; b++) {
            uint32_t p = g->pages[b] - w->ps.daemon0;
            h = fnv(h, &p, sizeof(p));
        }
        d->pages_hash = h;
    }
    if (!w->o.hash_kv || g->n_blocks <= 0) {
        return;
    }
    size_t bb = lkv_block_bytes(&w->shape);
    uint8_t *buf = lkv_xmalloc(bb);
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof(d->kv_hash));
    for (int b = 0; b < g->n_blocks; b++) {
        w->be->to_host(w->be->ctx, buf, s->kv.base + (uint64_t)g->pages[b] * s->kv.page_bytes, bb);
        crypto_generichash_update(&st, buf, bb);
    }
    free(buf);
    uint8_t h[sizeof(d->kv_hash)];
    crypto_generichash_final(&st, h, sizeof(h));
    memcpy(&d->kv_hash, h, sizeof(h));
}

/* Replaces the client by a fresh one (a new channel, connecting at once). */
static int reconnect(lkv_worker *w)
{
    lkv_client_t *c;
    lkv_client_options co = client_opts(w);
    int rc = lkv_client_create(w->target, &co, &c);
    if (rc == 0) {
        lkv_client_destroy(w->cl);
        w->cl = c;
        w->st.reconnects++;
    }
    return rc;
}

/* Steps 1-2, the daemon part (the client-call thread in the engine): Lookup, identity check,
 * Attach (present mode) under one lease. Touches the job's daemon fields and the client only. */
static int call_cache(req_state *s, const lkv_docref *refs)
{
    lkv_worker *w = s->w;
    const lkv_rag_request *q = s->req;
    lkv_rag_result *res = s->res;
    double t = now_ms();
    int dl = left_ms(s);
    int rc =
        dl > 0 ? lkv_client_lookup(w->cl, refs, (size_t)q->n_docs, dl, s->status) : LKV_ETIMEDOUT;
    /* A daemon restarting answers UNAVAILABLE at once: retry for up to retry_ms of the
     * deadline before giving up, each time on a fresh channel (an old one may sit in gRPC's
     * reconnect backoff, up to minutes, long after the daemon is back). */
    while (rc == LKV_EUNAVAIL && now_ms() - t < (double)w->o.retry_ms && left_ms(s) > 100) {
        usleep(RETRY_STEP_MS * 1000);
        if (reconnect(w) != 0) {
            break;
        }
        dl = left_ms(s);
        rc = dl > 0 ? lkv_client_lookup(w->cl, refs, (size_t)q->n_docs, dl, s->status)
                    : LKV_ETIMEDOUT;
    }
    res->lookup_ms = now_ms() - t;
    if (rc != 0) {
        if (rc == LKV_EPROFILE || rc == LKV_EINVAL) {
            return lkv_errf(res->error, sizeof(res->error), rc == LKV_EINVAL ? LKV_EPROFILE : rc,
                            "Lookup refused by lazykvd at %s: %s", w->target,
                            lkv_client_last_error());
        }
        return daemon_failed(s, "Lookup", rc);
    }
    rc = check_model_id(s, s->status[0].model_id);
    if (rc != 0) {
        return rc;
    }
    for (int i = 0; i < q->n_docs; i++) {
        res->docs[i].tier = s->status[i].tier;
        lkv_key_to_hex(s->status[i].key, res->docs[i].key_hex);
    }
    if (w->o.after_lookup != NULL) {
        w->o.after_lookup(w->o.hook_arg);
    }
    /* Attach the present ones under one lease. */
    lkv_docref *present = lkv_xcalloc((size_t)q->n_docs, sizeof(*present));
    s->n_att = 0;
    for (int i = 0; i < q->n_docs; i++) {
        if (s->status[i].present) {
            present[s->n_att] = refs[i];
            s->att_idx[s->n_att++] = i;
        }
    }
    if (s->n_att > 0) {
        t = now_ms();
        dl = left_ms(s);
        rc = dl > 0 ? lkv_client_attach_present(w->cl, present, (size_t)s->n_att, NULL,
                                                w->o.lease_ttl_ms, dl, &s->lease)
                    : LKV_ETIMEDOUT;
        res->attach_ms = now_ms() - t;
        s->lease_t = now_ms();
        if (rc != 0) {
            s->n_att = 0;
            rc = daemon_failed(s, "Attach", rc);
        } else if (s->lease.live) {
            w->st.leases++;
        }
    }
    free(present);
    return rc;
}

/* Maps the daemon's arena a (engine thread). */
static int map_arena(req_state *s, const lkv_lease_arena *a)
{
    lkv_worker *w = s->w;
    int rc = lkv_pagespace_map(&w->ps, a, w->profile);
    if (rc != 0) {
        return lkv_errf(s->res->error, sizeof(s->res->error), rc,
                        "cannot map the arena of lazykvd at %s: %s", w->target, w->ps.err);
    }
    return 0;
}

/* Steps 1-2, the worker part (engine thread): maps the arena once and points every attached
 * document's segment at the daemon's pages (read in place), after checking the reply. */
static int apply_cache(req_state *s)
{
    lkv_worker *w = s->w;
    const lkv_rag_request *q = s->req;
    lkv_rag_result *res = s->res;
    if (s->n_att == 0 || !s->lease.live) {
        return 0;
    }
    int rc = map_arena(s, &s->lease.arena);
    if (rc != 0) {
        return rc;
    }
    for (int j = 0; j < s->n_att; j++) {
        const lkv_attached_doc *d = &s->lease.docs[j];
        int i = s->att_idx[j];
        if (!d->attached) {
            continue; /* Evicted (or no hot room) since the Lookup: a miss. */
        }
        char why[256];
        if (!layout_matches(w, d, why, sizeof(why))) {
            return lkv_errf(res->error, sizeof(res->error), LKV_EPROFILE, "%s", why);
        }
        if (d->n_tokens != (uint64_t)q->docs[i].n_tokens ||
            d->n_pages != lkv_blocks_for_tokens(&w->shape, d->n_tokens) ||
            d->n_pages > LKV_MODEL_SEG_MAX_BLOCKS) {
            return lkv_errf(res->error, sizeof(res->error), LKV_EPROTO,
                            "Attach reply for document %d: %" PRIu64 " tokens in %u pages, "
                            "expected %d tokens",
                            i, d->n_tokens, d->n_pages, q->docs[i].n_tokens);
        }
        if (d->region_base != w->ps.region_base || d->page_bytes != w->ps.page_bytes) {
            return lkv_errf(res->error, sizeof(res->error), LKV_EPROTO,
                            "Attach reply for document %d: pages in a region at %" PRIu64
                            " of %" PRIu64 "-byte pages, the mapped region of profile '%s' is at "
                            "%" PRIu64 " of %" PRIu64,
                            i, d->region_base, d->page_bytes, w->profile, w->ps.region_base,
                            w->ps.page_bytes);
        }
        lkv_model_seg *g = &s->segs[i];
        for (uint32_t b = 0; b < d->n_pages; b++) {
            if (d->pages[b] >= w->ps.n_daemon) {
                return lkv_errf(res->error, sizeof(res->error), LKV_EPROTO,
                                "Attach reply: page %u outside the arena of %u pages", d->pages[b],
                                w->ps.n_daemon);
            }
            /* The daemon's page: read in place. */
            g->pages[b] = lkv_pagespace_daemon_page(&w->ps, d->pages[b]);
        }
        g->n_blocks = (int32_t)d->n_pages;
        g->n_tokens = (int32_t)d->n_tokens;
        res->docs[i].hit = 1;
        res->zero_copy_blocks += d->n_pages;
    }
    return 0;
}

/* Checks a document the daemon placed in its arena (attached or reserved) against the worker's
 * model and the mapped region; fills why and returns 0 if it does not fit. */
static int doc_fits(const lkv_worker *w, const lkv_attached_doc *d, uint64_t n_tokens, char *why,
                    size_t len)
{
    if (!layout_matches(w, d, why, len)) {
        return 0;
    }
    if (d->n_tokens != n_tokens || d->n_pages != lkv_blocks_for_tokens(&w->shape, n_tokens) ||
        d->n_pages > LKV_MODEL_SEG_MAX_BLOCKS) {
        snprintf(why, len, "%" PRIu64 " tokens in %u pages, expected %" PRIu64 " tokens",
                 d->n_tokens, d->n_pages, n_tokens);
        return 0;
    }
    if (d->region_base != w->ps.region_base || d->page_bytes != w->ps.page_bytes) {
        snprintf(why, len,
                 "pages in a region at %" PRIu64 " of %" PRIu64 "-byte pages, the mapped region "
                 "of profile '%s' is at %" PRIu64 " of %" PRIu64,
                 d->region_base, d->page_bytes, w->profile, w->ps.region_base, w->ps.page_bytes);
        return 0;
    }
    for (uint32_t b = 0; b < d->n_pages; b++) {
        if (d->pages[b] >= w->ps.n_daemon) {
            snprintf(why, len, "page %u outside the region of %u pages", d->pages[b],
                     w->ps.n_daemon);
            return 0;
        }
    }
    return 1;
}

/* Step 2b, put in place, the daemon part: reserves each miss (a repeat once) under the
 * request's lease (made by the Reserve when nothing was attached) before it is computed, so
 * that step 3 computes it straight into the daemon's pages and step 5 commits it: its KV never
 * crosses gRPC. A refused Reserve leaves that miss to worker pages and Put (a daemon without
 * Reserve for this worker: every later one too; another worker computing it: LKV_EINPROGRESS,
 * computed here as well, never waited for); a document another worker stored meanwhile comes
 * back attached and is read in place like a hit. */
static int call_reserve(req_state *s, const lkv_docref *refs)
{
    lkv_worker *w = s->w;
    const lkv_rag_request *q = s->req;
    lkv_rag_result *res = s->res;
    if (w->o.no_inplace || w->inplace_off) {
        return 0;
    }
    for (int i = 0; i < q->n_docs && s->use_daemon; i++) {
        int dup = s->status[i].present;
        for (int j = 0; j < s->n_att && dup; j++) {
            if (s->att_idx[j] == i) {
                dup = s->lease.docs[j].attached; /* Present but not pinned: reserve it. */
            }
        }
        for (int j = 0; j < i && !dup; j++) {
            dup = s->resv_state[j] != 0 && strcmp(res->docs[j].key_hex, res->docs[i].key_hex) == 0;
        }
        if (dup) {
            continue;
        }
        lkv_reservation *r = &s->resv[i];
        int dl = left_ms(s);
        int rc = dl > 0 ? lkv_client_reserve(w->cl, w->profile, refs[i].tokens, refs[i].n_tokens,
                                             s->lease.live ? s->lease.id : NULL, w->o.lease_ttl_ms,
                                             0, NULL, dl, r)
                        : LKV_ETIMEDOUT;
        if (rc == LKV_ENOTSUP || rc == LKV_EPERM) {
            w->inplace_off = 1;
            w->st.reserve_refused++;
            note(res, "Reserve refused (%s: %s): misses are stored by Put", lkv_err_name(rc),
                 lkv_client_last_error());
            return 0;
        }
        if (rc != 0) {
            if (daemon_down(rc)) {
                return daemon_failed(s, "Reserve", rc);
            }
            if (rc == LKV_EINPROGRESS) {
                w->st.reserve_busy++;
                note(res, "document %d is being computed by another worker: computed here too", i);
            } else if (rc == LKV_EADMIT) {
                /* The daemon's hot door (hot_admission = door) declined it: its pages would be
                 * hot. Computed in worker pages; Put afterwards (the daemon stores it cold if
                 * it can) unless no_put_when_full (the simulator's rule: not cached). */
                w->st.reserve_declined++;
                s->resv_state[i] = w->o.no_put_when_full ? -1 : 0;
                note(res,
                     "document %d declined by the daemon's hot admission filter: computed "
                     "here, %s",
                     i, w->o.no_put_when_full ? "not stored" : "stored by Put");
            } else if (rc == LKV_ENOSPC && w->o.no_put_when_full) {
                w->st.reserve_refused++;
                s->resv_state[i] = -1; /* No room now: not cached (no Put either). */
                note(res, "no room to cache document %d (Reserve: ENOSPC): not stored", i);
            } else {
                w->st.reserve_refused++;
                note(res, "Reserve of document %d refused (%s): it is stored by Put", i,
                     lkv_err_name(rc));
            }
            continue;
        }
        if (!s->lease.live) {
            memcpy(s->lease.id, r->lease_id, LKV_LEASE_ID_BYTES);
            s->lease.live = 1;
            s->lease.ttl_ms = r->ttl_ms;
            s->lease.expires_unix_ms = r->expires_unix_ms;
            s->lease_t = now_ms();
            w->st.leases++;
        }
        s->resv_state[i] = r->already_present ? 2 : 1; /* Released (aborted) with the lease. */
    }
    return 0;
}

/* Step 2b, the worker part (engine thread): maps the arena a reservation names, checks each
 * reserved document against the model and the region, and reads the ones another worker stored
 * meanwhile in place. */
static int apply_reserve(req_state *s)
{
    lkv_worker *w = s->w;
    const lkv_rag_request *q = s->req;
    lkv_rag_result *res = s->res;
    for (int i = 0; i < q->n_docs; i++) {
        if (s->resv_state[i] <= 0) {
            continue;
        }
        lkv_reservation *r = &s->resv[i];
        int rc = map_arena(s, &r->arena);
        if (rc != 0) {
            return rc;
        }
        char why[320];
        if (!doc_fits(w, &r->doc, (uint64_t)q->docs[i].n_tokens, why, sizeof(why))) {
            return lkv_errf(res->error, sizeof(res->error), LKV_EPROTO,
                            "Reserve reply for document %d: %s", i, why);
        }
        if (r->already_present) {
            lkv_model_seg *g = &s->segs[i];
            for (uint32_t b = 0; b < r->doc.n_pages; b++) {
                g->pages[b] = lkv_pagespace_daemon_page(&w->ps, r->doc.pages[b]);
            }
            g->n_blocks = (int32_t)r->doc.n_pages;
            g->n_tokens = (int32_t)r->doc.n_tokens;
            res->docs[i].hit = 1;
            res->zero_copy_blocks += r->doc.n_pages;
        }
    }
    return 0;
}

/* Releases the lease (if any): errors are notes, the lease expires by itself anyway. */
static void release_lease(req_state *s)
{
    if (!s->lease.live) {
        lkv_lease_free(&s->lease);
        return;
    }
    int dl = left_ms(s);
    int rc = lkv_client_release(s->w->cl, s->lease.id, dl > 0 ? dl : 1000, NULL);
    if (rc != 0) {
        note(s->res, "Release failed (%s: %s): the lease expires by itself within %u ms",
             lkv_err_name(rc), lkv_client_last_error(), s->lease.ttl_ms);
    }
    lkv_lease_free(&s->lease);
}

/* 1 if the lease is due for renewal (half its TTL has passed since it was made or renewed). */
static int renew_due(const req_state *s)
{
    return s->lease.live && s->use_daemon && now_ms() - s->lease_t >= (double)s->lease.ttl_ms / 2;
}

/* Renews the lease (the daemon part): 0, or the error (s->renew_msg says why). */
static int call_renew(req_state *s)
{
    lkv_lease r;
    s->renew_sent = now_ms();
    int rc = lkv_client_attach_present(s->w->cl, NULL, 0, s->lease.id, s->w->o.lease_ttl_ms,
                                       s->w->o.deadline_ms, &r);
    if (rc == 0) {
        lkv_lease_free(&r);
        s->w->st.renewals++;
    } else {
        snprintf(s->renew_msg, sizeof(s->renew_msg), "%s: %s", lkv_err_name(rc),
                 lkv_client_last_error());
    }
    return rc;
}

static void restart_local(req_state *s, const char *why);

/* Applies a renewal's outcome rc (engine thread): a live lease counts from when the renewal was
 * sent; a lost one (expired, or the daemon gone or too slow to say) means the daemon's pages may
 * be reused: the request goes on locally (restart_local). */
static void renewed(req_state *s, int rc)
{
    if (rc == 0) {
        s->lease_t = s->renew_sent;
        return;
    }
    if (rc == LKV_ENOTFOUND) {
        s->lease.live = 0; /* Expired: nothing to release. */
    }
    char why[400];
    snprintf(why, sizeof(why), "the lease could not be renewed (%s)", s->renew_msg);
    restart_local(s, why);
}

/* Renews the lease inline when it is due (the single-threaded path). */
static void renew_lease(req_state *s)
{
    if (renew_due(s)) {
        renewed(s, call_renew(s));
    }
}

/* With opts.sync_phases, waits until the backend has done everything queued (a 4-byte read
 * back synchronises the CUDA backend's stream), so the phase just timed is timed whole. */
static void phase_sync(const lkv_worker *w)
{
    if (w->o.sync_phases && w->run.x != NULL) { /* (Scratch exists after the first pass.) */
        float x;
        w->be->to_host(w->be->ctx, &x, w->run.x, sizeof(x));
    }
}

/* Step 2c, Block-Attention with copy_budget, the daemon part: for every attached document,
 * Reserves a placeholder document of the same length (token ids from a per-worker counter, so
 * its key is new) under the request's lease; its pages will hold that hit's re-rotated copy, so
 * the copy takes the daemon's budget (evicting as a Put would) until the lease is released (the
 * reservation is never committed: Release frees it). A copy the daemon has no room for (ENOSPC
 * or any refusal but a down daemon) makes its document a miss (apply_copies), recomputed in
 * worker pages and not stored again (it is cached). Runs before the misses' Reserves. */
static int call_copy_reserve(req_state *s)
{
    lkv_worker *w = s->w;
    const uint32_t V = (uint32_t)w->m->cfg.vocab_size;
    double t0 = now_ms();
    int rc = 0;
    for (int j = 0; j < s->n_att && s->lease.live && rc == 0; j++) {
        if (!s->lease.docs[j].attached) {
            continue;
        }
        int i = s->att_idx[j];
        uint32_t n = (uint32_t)s->req->docs[i].n_tokens;
        uint32_t *ph = lkv_xmalloc((size_t)n * sizeof(uint32_t));
        uint64_t c = ++w->copy_next ^ ((uint64_t)getpid() << 32);
        for (uint32_t k = 0; k < n; k++) {
            uint64_t z = c * 0x9e3779b97f4a7c15ull + (uint64_t)k * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
            ph[k] = 1 + (uint32_t)((z ^ (z >> 29)) % (V - 1));
        }
        lkv_reservation *r = &s->copy[i];
        int dl = left_ms(s);
        int r1 = dl > 0 ? lkv_client_reserve_ex(w->cl, w->profile, ph, n, s->lease.id,
                                                w->o.lease_ttl_ms, LKV_RESERVE_SCRATCH, NULL, dl, r)
                        : LKV_ETIMEDOUT;
        free(ph);
        if (r1 == 0 && !r->already_present) {
            s->copy_state[i] = 1;
        } else if (r1 != 0 && daemon_down(r1)) {
            rc = daemon_failed(s, "Reserve (copy)", r1);
        } else {
            lkv_reservation_free(r);
            s->copy_state[i] = -1; /* No room for the copy: recompute (a miss). */
        }
    }
    s->res->reserve_ms += now_ms() - t0;
    return rc;
}

/* Step 2c, the worker part (engine thread, after apply_cache): maps and checks each copy's
 * pages; a refused copy turns its hit into a miss. */
static int apply_copies(req_state *s)
{
    lkv_worker *w = s->w;
    lkv_rag_result *res = s->res;
    for (int i = 0; i < s->req->n_docs; i++) {
        if (s->copy_state[i] == 1) {
            int rc = map_arena(s, &s->copy[i].arena);
            if (rc != 0) {
                return rc;
            }
            char why[320];
            if (!doc_fits(w, &s->copy[i].doc, (uint64_t)s->req->docs[i].n_tokens, why,
                          sizeof(why))) {
                return lkv_errf(res->error, sizeof(res->error), LKV_EPROTO,
                                "Reserve reply for the copy of document %d: %s", i, why);
            }
            res->copies++;
        } else if (s->copy_state[i] < 0 && res->docs[i].hit) {
            res->docs[i].hit = 0;
            res->zero_copy_blocks -= (uint64_t)s->segs[i].n_blocks;
            memset(&s->segs[i], 0, sizeof(s->segs[i]));
            res->copies_refused++;
        }
    }
    return 0;
}

/* Tokens of the next prefill chunk of a segment holding done of its n tokens: up to the next
 * multiple of opts.prefill_chunk (0: all that is left). */
static int chunk_len(const lkv_worker *w, int done, int n)
{
    const int c = w->o.prefill_chunk, left = n - done;
    if (c <= 0) {
        return left;
    }
    const int to = c - done % c;
    return to < left ? to : left;
}

static void pfx_push(req_state *s, uint64_t h)
{
    if (s->n_pfx == s->cap_pfx) {
        s->cap_pfx = s->cap_pfx ? s->cap_pfx * 2 : 256;
        s->pfx = lkv_xrealloc(s->pfx, (size_t)s->cap_pfx * sizeof(uint64_t));
    }
    s->pfx[s->n_pfx++] = h;
}

/* Step 3, prefix mode, document i: its blocks are named by the chain (lkv_prefix.h); while the
 * prompt's prefix is cached they come from the pool (pinned, read in place); from the first
 * absent block on, the rest of the document is computed (appended after its cached part), into
 * pool pages admitted for those blocks while the pool has room, then into the request's pages.
 * One call computes one chunk (opts.prefill_chunk; *more: 1 while the document has more): the
 * first call looks the blocks up and admits the computed ones (pending in the pool until their
 * chunk is written, so another request cannot read them before). */
static int step_prefix_one(req_state *s, int i, int *more)
{
    lkv_worker *w = s->w;
    const lkv_rag_request *q = s->req;
    lkv_rag_result *res = s->res;
    const int B = w->shape.block_tokens, n = q->docs[i].n_tokens, nb = (n + B - 1) / B;
    const int *tok = q->docs[i].tokens;
    const uint64_t bb = lkv_block_bytes(&w->shape);
    lkv_model_seg *g = &s->segs[i];
    *more = 0;
    if (!s->seg_open) {
        uint64_t h[LKV_MODEL_SEG_MAX_BLOCKS];
        memset(g, 0, sizeof(*g));
        s->miss_src[i] = -1;
        int m = 0;
        for (int b = 0; b < nb; b++) {
            int len = n - b * B < B ? n - b * B : B;
            s->pfx_chain = lkv_prefix_chain(s->pfx_chain, tok + (size_t)b * B, len, b == 0);
            h[b] = s->pfx_chain;
            uint32_t pg;
            if (s->pfx_hitting && lkv_prefix_get(w->prefix, h[b], &pg)) {
                pfx_push(s, h[b]);
                g->pages[b] = w->ps.first_local + pg;
                m++;
            } else {
                s->pfx_hitting = 0;
            }
        }
        s->pfx_ready = s->n_pfx; /* Hits are written. */
        res->prefix_hit_blocks += (uint64_t)m;
        res->prefix_blocks += (uint64_t)nb;
        res->docs[i].hit = m == nb;
        if (m == nb) {
            g->n_tokens = n;
            g->n_blocks = nb;
            res->hit_docs++;
            res->hit_tokens += (uint64_t)n;
            return 0;
        }
        res->miss_docs++;
        res->hit_tokens += (uint64_t)m * B;
        res->miss_tokens += (uint64_t)(n - m * B);
        int k = m;
        s->pfx_doc0 = s->n_pfx;
        s->pfx_blk0 = m;
        while (s->pfx_caching && k < nb) {
            uint32_t pg;
            if (lkv_prefix_put(w->prefix, h[k], &pg) != 0) {
                s->pfx_caching = 0; /* Later blocks could never be reached by a lookup. */
                break;
            }
            pfx_push(s, h[k]);
            g->pages[k] = w->ps.first_local + pg;
            w->be->fill_zero(w->be->ctx, s->kv.base + (uint64_t)g->pages[k] * s->kv.page_bytes, bb);
            k++;
        }
        g->n_blocks = k;
        g->n_tokens = m * B;
    }
    const int done = g->n_tokens, len = chunk_len(w, done, n);
    double t = now_ms();
    int rc = lkv_runner_forward(&w->run, &s->kv, NULL, 0, g, tok + done, len, NULL, NULL);
    phase_sync(w);
    res->miss_ms += now_ms() - t;
    if (rc != 0) {
        /* The blocks admitted for this document hold no valid KV: take them out. */
        for (int j = s->pfx_doc0; j < s->n_pfx; j++) {
            lkv_prefix_unpin(w->prefix, s->pfx[j]);
            lkv_prefix_remove(w->prefix, s->pfx[j]);
        }
        s->n_pfx = s->pfx_ready = s->pfx_doc0;
        s->seg_open = 0;
        return lkv_errf(res->error, sizeof(res->error), rc,
                        "computing document %d (%d tokens): %s%s", i, n, lkv_strerror(rc),
                        rc == LKV_ENOSPC ? " (worker pages exhausted: raise --local-pages)" : "");
    }
    s->prefilled += (uint64_t)len;
    /* The admitted blocks this chunk completed (all of them at the document's end) are ready. */
    const int full = g->n_tokens == n ? nb : g->n_tokens / B;
    while (s->pfx_ready < s->n_pfx && s->pfx_blk0 + (s->pfx_ready - s->pfx_doc0) < full) {
        lkv_prefix_ready(w->prefix, s->pfx[s->pfx_ready++]);
    }
    s->seg_open = *more = g->n_tokens < n;
    return 0;
}

int lkv_worker_retarget(lkv_worker *w, const char *target)
{
    lkv_client_destroy(w->cl);
    w->cl = NULL;
    free(w->target);
    w->target = dup_or_null(target);
    w->o.target = w->target;
    w->inplace_off = 0;
    if (w->target != NULL && !w->o.no_inplace) {
        w->ps.writable = 1; /* Used at the next map. */
    }
    if (w->target == NULL) {
        return 0;
    }
    lkv_client_options co = {.default_deadline_ms = w->o.deadline_ms, .bearer_token = w->token};
    int rc = lkv_client_create(w->target, &co, &w->cl);
    if (rc != 0) {
        w->cl = NULL;
    }
    return rc;
}

int lkv_worker_unmap(lkv_worker *w)
{
    if (w->prefix != NULL) {
        return LKV_EBUSY;
    }
    const lkv_devmap *dev = w->ps.dev;
    const int writable = w->ps.writable;
    const uint64_t n_maps = w->ps.n_maps;
    lkv_pagespace_free(&w->ps);
    lkv_pagespace_init(&w->ps, w->o.local_pages);
    w->ps.dev = dev;
    w->ps.writable = writable;
    w->ps.n_maps = n_maps;
    return 0;
}

int lkv_worker_prefix_setup(lkv_worker *w, uint32_t n_pages, int policy_kind)
{
    if (n_pages >= w->o.local_pages || policy_kind < 0 || policy_kind >= LKV_POLICY__COUNT) {
        return LKV_EINVAL;
    }
    lkv_prefix_destroy(w->prefix);
    w->prefix = NULL;
    w->prefix_pages = 0;
    if (n_pages == 0) {
        return 0;
    }
    int rc = lkv_prefix_create(policy_kind, w->o.local_pages - n_pages, n_pages,
                               lkv_block_bytes(&w->shape), &w->prefix);
    if (rc == 0) {
        w->prefix_pages = n_pages;
    }
    return rc;
}

void lkv_worker_prefix_stats(const lkv_worker *w, struct lkv_prefix_stats *st)
{
    if (w->prefix == NULL) {
        memset(st, 0, sizeof(*st));
        return;
    }
    lkv_prefix_stats_get(w->prefix, st);
}

/* Step 3, one document: document i alone from position 0 into worker pages unless it is a hit
 * or a repeat (which reuses the first computation). */
/* Step 3, document i: a hit needs nothing; a miss is computed from position 0 into its reserved
 * pages (in place) or worker pages, one chunk per call (opts.prefill_chunk; *more: 1 while the
 * document has more). A document repeated in the prompt is computed once. */
static int step_miss_one(req_state *s, int i, int *more)
{
    const lkv_rag_request *q = s->req;
    lkv_rag_result *res = s->res;
    lkv_model_seg *g = &s->segs[i];
    double t = now_ms();
    *more = 0;
    if (!s->seg_open) {
        s->miss_src[i] = -1;
        if (res->docs[i].hit) {
            return 0;
        }
        for (int j = 0; j < i && s->use_daemon; j++) {
            if (!res->docs[j].hit && strcmp(res->docs[j].key_hex, res->docs[i].key_hex) == 0) {
                s->miss_src[i] = j;
            }
        }
        if (!s->use_daemon) {
            for (int j = 0; j < i && s->miss_src[i] < 0; j++) {
                if (q->docs[j].n_tokens == q->docs[i].n_tokens &&
                    memcmp(q->docs[j].tokens, q->docs[i].tokens,
                           (size_t)q->docs[i].n_tokens * sizeof(int)) == 0) {
                    s->miss_src[i] = j;
                }
            }
        }
        if (s->miss_src[i] >= 0) {
            *g = s->segs[s->miss_src[i]];
            res->docs[i].page0 = res->docs[s->miss_src[i]].page0;
            res->docs[i].pages_hash = res->docs[s->miss_src[i]].pages_hash;
            res->docs[i].kv_hash = res->docs[s->miss_src[i]].kv_hash;
            return 0;
        }
        memset(g, 0, sizeof(*g));
        if (s->resv_state[i] == 1) {
            /* In place: the reserved pages (not zeroed by the daemon) take the KV; the runner
             * allocates no page for a segment that has its pages. */
            const lkv_attached_doc *d = &s->resv[i].doc;
            for (uint32_t b = 0; b < d->n_pages; b++) {
                g->pages[b] = lkv_pagespace_daemon_page(&s->w->ps, d->pages[b]);
                s->w->be->fill_zero(s->w->be->ctx,
                                    s->kv.base + (uint64_t)g->pages[b] * s->kv.page_bytes,
                                    lkv_block_bytes(&s->w->shape));
            }
            g->n_blocks = (int32_t)d->n_pages;
        }
    }
    const int n = q->docs[i].n_tokens, done = g->n_tokens, len = chunk_len(s->w, done, n);
    int rc = lkv_runner_forward(&s->w->run, &s->kv, NULL, 0, g, q->docs[i].tokens + done, len, NULL,
                                NULL);
    phase_sync(s->w);
    res->miss_ms += now_ms() - t;
    if (rc != 0) {
        s->seg_open = 0;
        return lkv_errf(res->error, sizeof(res->error), rc,
                        "computing document %d (%d tokens): %s%s", i, n, lkv_strerror(rc),
                        rc == LKV_ENOSPC ? " (worker pages exhausted: raise --local-pages)" : "");
    }
    s->prefilled += (uint64_t)len;
    s->seg_open = *more = g->n_tokens < n;
    if (!*more) {
        note_pages(s, i);
    }
    return 0;
}

/* Step 5a (engine thread): copies the blocks of every computed miss that is not in place out
 * of the worker pages (backend to_host) for its Put, so that the pages can be given back before
 * the daemon is called. A miss computed in place needs nothing: its KV is in the daemon's
 * pages. */
static void gather_puts(req_state *s)
{
    const lkv_rag_request *q = s->req;
    const size_t bb = lkv_block_bytes(&s->w->shape);
    for (int i = 0; i < q->n_docs; i++) {
        if (s->res->docs[i].hit || s->miss_src[i] >= 0 || s->resv_state[i] == 1 ||
            s->resv_state[i] < 0 || s->copy_state[i] < 0) {
            continue; /* In place; no room (not stored); a refused copy's (cached) document. */
        }
        const lkv_model_seg *g = &s->segs[i];
        s->put_buf[i] = lkv_xmalloc((size_t)(g->n_blocks ? g->n_blocks : 1) * bb);
        s->put_blocks[i] = (uint32_t)g->n_blocks;
        for (int b = 0; b < g->n_blocks; b++) {
            /* Worker pages are backend memory: copied out through the backend. */
            s->w->be->to_host(s->w->be->ctx, s->put_buf[i] + (size_t)b * bb,
                              s->kv.base + (uint64_t)g->pages[b] * s->kv.page_bytes, bb);
        }
    }
}

/* Step 5b (the daemon part): Commit each miss computed in place, Put each other computed miss
 * from its gathered blocks. A Commit that fails leaves that document a miss (its reservation,
 * and so what its pages hold, is no longer the worker's to read once the lease is gone: nothing
 * is Put from them). */
static void call_store(req_state *s, const lkv_docref *refs)
{
    const lkv_rag_request *q = s->req;
    lkv_rag_result *res = s->res;
    const size_t bb = lkv_block_bytes(&s->w->shape);
    double t = now_ms();
    for (int i = 0; i < q->n_docs && s->use_daemon; i++) {
        int dl = left_ms(s);
        if (s->resv_state[i] == 1) {
            const uint8_t *key = s->resv[i].doc.key;
            int rc = dl > 0 ? lkv_client_commit(s->w->cl, s->lease.id, key, dl, NULL, NULL)
                            : LKV_ETIMEDOUT;
            if (rc == 0) {
                res->docs[i].stored = 1;
                res->docs[i].inplace = 1;
                s->w->st.inplace_docs++;
                continue;
            }
            s->w->st.commit_failed++;
            res->docs[i].stored = rc;
            note(res, "Commit of document %d failed (%s: %s): it stays a miss", i, lkv_err_name(rc),
                 lkv_client_last_error());
            if (daemon_down(rc)) {
                break;
            }
            lkv_client_abort(s->w->cl, s->lease.id, key, dl);
            continue;
        }
        if (s->put_buf[i] == NULL) {
            continue;
        }
        int rc = dl > 0 ? lkv_client_put(s->w->cl, s->w->profile, refs[i].tokens, refs[i].n_tokens,
                                         s->put_buf[i], s->put_blocks[i], bb, dl, NULL)
                        : LKV_ETIMEDOUT;
        res->docs[i].stored = rc == 0 ? 1 : rc;
        s->w->st.put_docs += rc == 0;
        if (rc != 0) {
            note(res, "Put of document %d failed (%s: %s): it stays a miss", i, lkv_err_name(rc),
                 lkv_client_last_error());
            if (daemon_down(rc)) {
                break;
            }
        }
    }
    res->put_ms = now_ms() - t;
}

/* Materialise mode: replace every document segment by a re-rotated copy placed at 0. */
static int step_materialise(req_state *s)
{
    const lkv_rag_request *q = s->req;
    const lkv_backend *be = s->w->be;
    for (int i = 0; i < q->n_docs; i++) {
        lkv_model_seg *g = &s->segs[i];
        uint32_t dst[LKV_MODEL_SEG_MAX_BLOCKS];
        if (s->copy_state[i] == 1) {
            /* Into the pages reserved for it in the daemon's budget. */
            for (int b = 0; b < g->n_blocks; b++) {
                dst[b] = lkv_pagespace_daemon_page(&s->w->ps, s->copy[i].doc.pages[b]);
            }
        } else {
            if ((uint32_t)g->n_blocks > lkv_model_kv_room(&s->kv)) {
                return lkv_errf(s->res->error, sizeof(s->res->error), LKV_ENOSPC,
                                "materialise: worker pages exhausted (raise --local-pages)");
            }
            for (int b = 0; b < g->n_blocks; b++) {
                dst[b] = lkv_model_kv_take(&s->kv);
            }
        }
        lkv_materialise_args a = {.shape = s->kv.shape,
                                  .pe = &s->w->m->pe,
                                  .src_arena = s->kv.base,
                                  .dst_arena = s->kv.base,
                                  .page_bytes = s->kv.page_bytes,
                                  .src_pages = g->pages,
                                  .dst_pages = dst,
                                  .n_blocks = g->n_blocks,
                                  .delta = g->start};
        int rc = be->materialise(be->ctx, &a);
        if (rc != 0) {
            return lkv_errf(s->res->error, sizeof(s->res->error), rc, "materialise: %s",
                            lkv_strerror(rc));
        }
        memcpy(g->pages, dst, (size_t)g->n_blocks * sizeof(uint32_t));
        g->start = 0; /* Keys now sit at their absolute positions. */
    }
    return 0;
}

static int check_request(const lkv_worker *w, const lkv_rag_request *q, lkv_rag_result *res)
{
    const int V = w->m->cfg.vocab_size;
    if (q->n_docs < 0 || (q->n_docs > 0 && q->docs == NULL)) {
        return lkv_errf(res->error, sizeof(res->error), LKV_EINVAL, "bad document list");
    }
    int64_t total = 0;
    for (int i = 0; i < q->n_docs; i++) {
        if (q->docs[i].n_tokens < 1 || q->docs[i].tokens == NULL) {
            return lkv_errf(res->error, sizeof(res->error), LKV_EINVAL,
                            "document %d is empty (a document needs at least one token)", i);
        }
        if (q->docs[i].n_tokens > LKV_MODEL_SEG_MAX_BLOCKS * w->shape.block_tokens) {
            return lkv_errf(res->error, sizeof(res->error), LKV_EINVAL,
                            "document %d has %d tokens, more than a segment holds (%d)", i,
                            q->docs[i].n_tokens, LKV_MODEL_SEG_MAX_BLOCKS * w->shape.block_tokens);
        }
        for (int t = 0; t < q->docs[i].n_tokens; t++) {
            if (q->docs[i].tokens[t] < 0 || q->docs[i].tokens[t] >= V) {
                return lkv_errf(res->error, sizeof(res->error), LKV_EINVAL,
                                "document %d token %d is %d, outside the vocabulary 0..%d", i, t,
                                q->docs[i].tokens[t], V - 1);
            }
        }
        total += q->docs[i].n_tokens;
    }
    if (q->n_question < 1 || q->question == NULL) {
        return lkv_errf(res->error, sizeof(res->error), LKV_EINVAL,
                        "the question is empty (it needs at least one token)");
    }
    for (int t = 0; t < q->n_question; t++) {
        if (q->question[t] < 0 || q->question[t] >= V) {
            return lkv_errf(res->error, sizeof(res->error), LKV_EINVAL,
                            "question token %d is %d, outside the vocabulary 0..%d", t,
                            q->question[t], V - 1);
        }
    }
    if (q->max_tokens < 1) {
        return lkv_errf(res->error, sizeof(res->error), LKV_EINVAL,
                        "max_tokens must be >= 1 (got %d)", q->max_tokens);
    }
    total += q->n_question;
    if (total + q->max_tokens > w->o.max_position) {
        return lkv_errf(
            res->error, sizeof(res->error), LKV_EINVAL,
            "the prompt (%" PRId64 " tokens: %d documents and the question) plus "
            "max_tokens %d reaches position %" PRId64 ", past the model's maximum position %d",
            total, q->n_docs, q->max_tokens, total + q->max_tokens - 1, w->o.max_position - 1);
    }
    if (q->mode != LKV_RAG_LAZY && q->mode != LKV_RAG_MATERIALISE && q->mode != LKV_RAG_PREFIX) {
        return lkv_errf(res->error, sizeof(res->error), LKV_EINVAL, "unknown mode %d", q->mode);
    }
    return 0;
}

/* Appends the sampled token tok to the result (or ends generation at an end token / max). */
static void take_token(req_state *s, int tok)
{
    lkv_worker *w = s->w;
    const lkv_rag_request *q = s->req;
    lkv_rag_result *res = s->res;
    const int V = w->m->cfg.vocab_size;
    if (res->n_out == 0) {
        s->t_first = now_ms();
        res->ttft_ms = s->t_first - s->t0;
    }
    if (q->stop_at_eos && (tok == LKV_TOK_EOS || tok == LKV_TOK_BOS)) {
        res->stop_eos = 1;
        s->phase = PH_DONE;
        return;
    }
    if (q->keep_logits) {
        memcpy(res->logits + (size_t)res->n_out * V, s->row, (size_t)V * sizeof(float));
    }
    res->tokens[res->n_out++] = tok;
    if (w->have_tok) {
        const char *piece = lkv_tokenizer_decode(&w->tok, s->prev, tok);
        size_t pl = strlen(piece);
        if (s->tlen + pl + 1 > s->tcap) {
            s->tcap = (s->tlen + pl + 1) * 2;
            res->text = lkv_xrealloc(res->text, s->tcap);
        }
        memcpy(res->text + s->tlen, piece, pl + 1);
        s->tlen += pl;
    }
    s->prev = tok;
    s->next_tok = tok;
    s->phase = res->n_out == q->max_tokens ? PH_DONE : PH_DECODE;
}

/* Samples from s->row and takes the token. */
static int sample_row(req_state *s)
{
    lkv_worker *w = s->w;
    if (s->replay < s->replay_to) {
        /* Restarted locally (restart_local): the tokens already generated are fed again, not
         * sampled again (greedy or not, the request keeps the tokens it streamed). */
        s->next_tok = s->res->tokens[s->replay++];
        s->row = NULL;
        s->phase = PH_DECODE;
        return 0;
    }
    int tok;
    int rc =
        w->be->sample(w->be->ctx, s->row, w->m->cfg.vocab_size, &s->req->sampling, &s->rng, &tok);
    if (rc != 0) {
        return lkv_errf(s->res->error, sizeof(s->res->error), rc,
                        "sampling failed (non-finite logits)");
    }
    take_token(s, tok);
    return 0;
}

/* Step 4a: (materialise mode: the copies, then) the question prefill and the first token; one
 * chunk per call (opts.prefill_chunk: the copies with the first, the first token after the
 * last). */
static int step_question(req_state *s)
{
    lkv_worker *w = s->w;
    const lkv_rag_request *q = s->req;
    lkv_rag_result *res = s->res;
    const int nd = q->n_docs;
    lkv_model_seg *qs = &s->segs[nd];
    if (!s->seg_open) {
        for (int i = 0; i < nd; i++) {
            s->segs[i].start = res->docs[i].start;
        }
        if (q->mode == LKV_RAG_MATERIALISE) {
            double t = now_ms();
            int rc = step_materialise(s);
            phase_sync(w);
            res->copy_ms += now_ms() - t;
            if (rc != 0) {
                return rc;
            }
        }
        memset(qs, 0, sizeof(*qs));
        qs->start = res->n_prompt - q->n_question;
    }
    double t = now_ms();
    const int done = qs->n_tokens, len = chunk_len(w, done, q->n_question);
    const int last = done + len == q->n_question;
    int rc = lkv_runner_forward(&w->run, &s->kv, s->segs, nd, qs, q->question + done, len,
                                last ? s->logits : NULL, NULL);
    if (rc != 0) {
        s->seg_open = 0;
        return lkv_errf(res->error, sizeof(res->error), rc, "question prefill: %s%s",
                        lkv_strerror(rc),
                        rc == LKV_ENOSPC ? " (worker pages exhausted: raise --local-pages)" : "");
    }
    s->prefilled += (uint64_t)len;
    s->seg_open = !last;
    if (!last) {
        phase_sync(w);
        res->question_ms += now_ms() - t;
        return 0;
    }
    s->row = s->logits; /* The last question token's row (the runner's last_logits). */
    rc = sample_row(s);
    res->question_ms += now_ms() - t;
    return rc;
}

uint32_t lkv_worker_pages_needed(const lkv_worker *w, const lkv_rag_request *q)
{
    const int B = w->shape.block_tokens;
    uint64_t docs = 0;
    for (int i = 0; i < q->n_docs && q->docs != NULL; i++) {
        docs += (uint64_t)(q->docs[i].n_tokens > 0 ? q->docs[i].n_tokens + B - 1 : 0) / B;
    }
    uint64_t n = docs * (q->mode == LKV_RAG_MATERIALISE ? 2 : 1);
    int64_t tail =
        (int64_t)(q->n_question > 0 ? q->n_question : 0) + (q->max_tokens > 0 ? q->max_tokens : 0);
    n += (uint64_t)(tail + B - 1) / B;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

uint32_t lkv_worker_local_pages(const lkv_worker *w)
{
    return w->o.local_pages;
}

uint64_t lkv_worker_page_bytes(const lkv_worker *w)
{
    return lkv_block_bytes(&w->shape);
}

double lkv_worker_now_ms(void)
{
    return now_ms();
}

/* Frees what the job owns (not res). */
static void job_free(req_state *s)
{
    free(s->ids);
    free(s->refs);
    free(s->segs);
    free(s->miss_src);
    free(s->status);
    for (int i = 0; s->resv != NULL && i < s->req->n_docs; i++) {
        lkv_reservation_free(&s->resv[i]);
    }
    for (int i = 0; s->put_buf != NULL && i < s->req->n_docs; i++) {
        free(s->put_buf[i]);
    }
    free(s->put_buf);
    free(s->put_blocks);
    free(s->resv);
    free(s->resv_state);
    free(s->att_idx);
    for (int i = 0; s->copy != NULL && i < s->req->n_docs; i++) {
        lkv_reservation_free(&s->copy[i]);
    }
    free(s->copy);
    free(s->copy_state);
    free(s->pfx);
    free(s->grant);
    free(s->grant_rel);
    free(s->logits);
    lkv_lease_free(&s->lease);
    free(s);
}

/* Sets the request's pages up (engine thread): worker pages mapped if nothing is, the request's
 * view of the page space, its granted pages (absolute indices from the relative ones). */
static int setup_pages(req_state *s)
{
    lkv_worker *w = s->w;
    if (w->ps.base == NULL) {
        int rc = lkv_pagespace_map_local(&w->ps, lkv_block_bytes(&w->shape));
        if (rc != 0) {
            return lkv_errf(s->res->error, sizeof(s->res->error), rc, "worker pages: %s",
                            w->ps.err);
        }
    }
    lkv_pagespace_view(&w->ps, &w->shape, &s->kv);
    s->maps_at_start = w->ps.n_maps;
    if (s->grant_rel != NULL) {
        for (uint32_t k = 0; k < s->n_grant; k++) {
            s->grant[k] = w->ps.first_local + s->grant_rel[k];
        }
        s->kv.grant = s->grant;
        s->kv.n_grant = s->n_grant;
    }
    return 0;
}

/* Counts hits and misses into the result and notes where each hit's pages are. */
static void count_docs(req_state *s)
{
    const lkv_rag_request *q = s->req;
    lkv_rag_result *res = s->res;
    res->hit_docs = res->miss_docs = 0;
    res->hit_tokens = res->miss_tokens = 0;
    for (int i = 0; i < q->n_docs && q->mode != LKV_RAG_PREFIX; i++) {
        res->docs[i].page0 = -1;
        if (res->docs[i].hit) {
            note_pages(s, i);
            res->hit_docs++;
            res->hit_tokens += (uint64_t)q->docs[i].n_tokens;
        } else {
            res->miss_docs++;
            res->miss_tokens += (uint64_t)q->docs[i].n_tokens;
        }
    }
}

/* The daemon part is over (or there was none): pages set up, prefill next. */
static int opened(req_state *s)
{
    int rc = setup_pages(s);
    if (rc != 0) {
        s->phase = PH_DONE;
        return s->rc = rc;
    }
    count_docs(s);
    s->phase = PH_MISSES;
    return 0;
}

/* Goes on with the request locally (engine thread) after its daemon pages can no longer be
 * trusted: the lease was lost (not renewed: expired, or the daemon gone or too slow to answer)
 * or the page space was remapped (a restarted daemon's arena) under it. Every document is
 * computed again in worker pages, the question prefilled again, the tokens already generated
 * fed again (not sampled: the output is the same tokens, then more), and nothing is stored. A
 * job whose generation is over is only kept from storing. */
static void restart_local(req_state *s, const char *why)
{
    lkv_worker *w = s->w;
    const lkv_rag_request *q = s->req;
    lkv_rag_result *res = s->res;
    int was_daemon = s->use_daemon;
    s->use_daemon = 0; /* No Commit, no Put (the lease is still released if it lives). */
    res->local_only = 1;
    for (int i = 0; i < q->n_docs; i++) {
        s->resv_state[i] = 0;
    }
    if (s->phase == PH_DONE || s->rc != 0) {
        note(res, "%s: nothing is stored", why);
        return;
    }
    note(res,
         "%s: the request went on locally (every document computed in worker pages, %d "
         "tokens fed again, nothing stored)",
         why, res->n_out);
    w->st.local_restarts++;
    (void)was_daemon;
    for (int i = 0; i < q->n_docs; i++) {
        res->docs[i].hit = 0;
        res->docs[i].inplace = 0;
        res->docs[i].page0 = -1;
        res->docs[i].pages_hash = 0;
        res->docs[i].kv_hash = 0;
    }
    res->zero_copy_blocks = 0;
    memset(s->segs, 0, (size_t)(q->n_docs + 1) * sizeof(*s->segs));
    s->next_doc = 0;
    s->seg_open = 0;
    s->replay = 0;
    s->replay_to = res->n_out;
    opened(s);
}

int lkv_worker_job_open(lkv_worker *w, const lkv_rag_request *q, lkv_rag_result *res,
                        const uint32_t *pages, uint32_t n_pages, double t_arrive,
                        lkv_worker_job **out)
{
    memset(res, 0, sizeof(*res));
    req_state *s = lkv_xcalloc(1, sizeof(*s));
    *out = s;
    s->w = w;
    s->req = q;
    s->res = res;
    s->t0 = t_arrive > 0 ? t_arrive : now_ms();
    s->t_phase = now_ms();
    w->st.requests++;
    int rc = check_request(w, q, res);
    if (rc != 0) {
        s->phase = PH_DONE;
        return s->rc = rc;
    }
    const int nd = q->n_docs, V = w->m->cfg.vocab_size;
    const size_t nd1 = (size_t)(nd ? nd : 1);
    res->n_docs = nd;
    res->docs = lkv_xcalloc(nd1, sizeof(*res->docs));
    s->segs = lkv_xcalloc((size_t)nd + 1, sizeof(*s->segs));
    s->miss_src = lkv_xcalloc(nd1, sizeof(int));
    s->status = lkv_xcalloc(nd1, sizeof(*s->status));
    s->resv = lkv_xcalloc(nd1, sizeof(*s->resv));
    s->resv_state = lkv_xcalloc(nd1, sizeof(int));
    s->att_idx = lkv_xcalloc(nd1, sizeof(int));
    s->put_buf = lkv_xcalloc(nd1, sizeof(*s->put_buf));
    s->put_blocks = lkv_xcalloc(nd1, sizeof(*s->put_blocks));
    s->copy = lkv_xcalloc(nd1, sizeof(*s->copy));
    s->copy_state = lkv_xcalloc(nd1, sizeof(int));
    s->pfx_chain = LKV_PREFIX_CHAIN0;
    s->pfx_hitting = s->pfx_caching = 1;
    s->logits = lkv_xmalloc((size_t)q->n_question * V * sizeof(float));
    res->tokens = lkv_xmalloc((size_t)q->max_tokens * sizeof(int));
    res->vocab = V;
    if (q->keep_logits) {
        res->logits = lkv_xmalloc((size_t)q->max_tokens * V * sizeof(float));
    }
    s->tcap = 256;
    res->text = lkv_xmalloc(s->tcap);
    res->text[0] = '\0';
    s->rng = lkv_sampling_seed(q->sampling.seed);
    s->prev = q->question[q->n_question - 1];
    s->use_daemon = w->cl != NULL && !q->no_cache && nd > 0 && q->mode != LKV_RAG_PREFIX;
    res->local_only = !s->use_daemon;
    if (q->mode == LKV_RAG_PREFIX && w->prefix == NULL) {
        s->phase = PH_DONE;
        return s->rc =
                   lkv_errf(res->error, sizeof(res->error), LKV_EINVAL,
                            "prefix mode needs the worker's prefix pool (lkv_worker_prefix_setup)");
    }
    s->refs = make_refs(s, &s->ids);
    int64_t pos = 0;
    for (int i = 0; i < nd; i++) {
        res->docs[i].n_tokens = q->docs[i].n_tokens;
        res->docs[i].start = pos;
        res->docs[i].n_blocks = lkv_blocks_for_tokens(&w->shape, (uint64_t)q->docs[i].n_tokens);
        res->docs[i].page0 = -1;
        pos += q->docs[i].n_tokens;
    }
    res->n_prompt = (int)pos + q->n_question;
    if (pages != NULL) {
        s->n_grant = n_pages;
        s->grant_rel = lkv_xmalloc((size_t)(n_pages ? n_pages : 1) * sizeof(uint32_t));
        s->grant = lkv_xmalloc((size_t)(n_pages ? n_pages : 1) * sizeof(uint32_t));
        memcpy(s->grant_rel, pages, (size_t)n_pages * sizeof(uint32_t));
    }
    if (s->use_daemon) {
        s->phase = PH_WAIT; /* The START call: Lookup, Attach, Reserve. */
        return 0;
    }
    return opened(s);
}

int lkv_worker_job_take_call(lkv_worker_job *s)
{
    if (s->inflight != LKV_CALL_NONE) {
        return LKV_CALL_NONE;
    }
    int c = LKV_CALL_NONE;
    if (s->phase == PH_WAIT) {
        c = LKV_CALL_START;
    } else if (s->ending) {
        c = s->end_called || (!s->store && !s->lease.live) ? LKV_CALL_NONE : LKV_CALL_END;
    } else if (s->phase != PH_DONE && renew_due(s)) {
        c = LKV_CALL_RENEW;
    }
    s->inflight = c;
    return c;
}

int lkv_worker_job_busy(const lkv_worker_job *s)
{
    return s->inflight != LKV_CALL_NONE;
}

void lkv_worker_job_call(lkv_worker_job *s, int call)
{
    switch (call) {
    case LKV_CALL_START: {
        int rc = call_cache(s, s->refs);
        /* Copies first: serving the hits comes before caching the misses. */
        if (rc == 0 && s->use_daemon && s->req->mode == LKV_RAG_MATERIALISE &&
            s->w->o.copy_budget) {
            rc = call_copy_reserve(s);
        }
        if (rc == 0 && s->use_daemon) {
            double t0 = now_ms();
            rc = call_reserve(s, s->refs);
            s->res->reserve_ms += now_ms() - t0;
        }
        s->call_rc = rc;
        break;
    }
    case LKV_CALL_RENEW:
        s->call_rc = call_renew(s);
        break;
    case LKV_CALL_END:
        if (s->store) {
            s->t_phase = now_ms(); /* Commit, Put and Release get a deadline of their own. */
            call_store(s, s->refs);
        }
        s->t_phase = now_ms();
        release_lease(s);
        s->end_called = 1;
        break;
    default:
        break;
    }
}

void lkv_worker_job_called(lkv_worker_job *s, int call)
{
    s->inflight = LKV_CALL_NONE;
    if (call == LKV_CALL_START) {
        int rc = s->call_rc;
        if (rc == 0 && s->use_daemon) {
            rc = apply_cache(s);
            if (rc == 0) {
                rc = apply_copies(s);
            }
            if (rc == 0) {
                rc = apply_reserve(s);
            }
        }
        if (rc != 0) {
            s->phase = PH_DONE;
            s->rc = rc;
            return;
        }
        opened(s);
    } else if (call == LKV_CALL_RENEW) {
        renewed(s, s->call_rc);
    }
}

/* Runs the call the job needs now, if any, in this thread (the single-threaded path). */
static void call_inline(req_state *s)
{
    int c = lkv_worker_job_take_call(s);
    if (c != LKV_CALL_NONE) {
        lkv_worker_job_call(s, c);
        lkv_worker_job_called(s, c);
    }
}

int lkv_worker_job_start(lkv_worker *w, const lkv_rag_request *q, lkv_rag_result *res,
                         const uint32_t *pages, uint32_t n_pages, double t_arrive,
                         lkv_worker_job **out)
{
    int rc = lkv_worker_job_open(w, q, res, pages, n_pages, t_arrive, out);
    if (rc == 0 && (*out)->phase == PH_WAIT) {
        call_inline(*out);
    }
    return (*out)->rc;
}

/* A remapped page space (a restarted daemon's new arena, or the first daemon arena after
 * local-only requests) moved the pages the job's references name: it goes on locally. Returns
 * the job's error (0 unless restarting failed). */
static int check_pages(req_state *s)
{
    if (s->w->ps.n_maps != s->maps_at_start) {
        restart_local(s, "lazykvd's arena was remapped during the request (a daemon restart)");
    }
    return s->rc;
}

int lkv_worker_job_prefill(lkv_worker_job *s)
{
    if (s->rc != 0 || s->phase == PH_DONE || s->phase == PH_WAIT) {
        return s->rc;
    }
    if (!s->w->async) {
        renew_lease(s);
    }
    int rc = check_pages(s), more = 0;
    if (rc == 0 && s->phase == PH_MISSES && s->req->mode == LKV_RAG_PREFIX) {
        /* Documents the pool serves whole cost nothing: go on to the next computed one. */
        while (rc == 0 && s->next_doc < s->req->n_docs) {
            uint64_t before = s->prefilled;
            rc = step_prefix_one(s, s->next_doc, &more);
            if (!more) {
                s->next_doc++;
            }
            if (s->prefilled != before) {
                break;
            }
        }
        if (rc == 0 && s->next_doc >= s->req->n_docs) {
            s->phase = PH_QUESTION;
        }
        if (rc == 0) {
            return 0;
        }
    } else if (rc == 0 && s->phase == PH_MISSES) {
        while (!s->seg_open && s->next_doc < s->req->n_docs && s->res->docs[s->next_doc].hit) {
            s->miss_src[s->next_doc++] = -1;
        }
        if (s->next_doc < s->req->n_docs) {
            rc = step_miss_one(s, s->next_doc, &more);
            if (!more) {
                s->next_doc++;
            }
            if (rc == 0 && s->next_doc < s->req->n_docs) {
                return 0; /* More documents (or chunks): another step. */
            }
        }
        if (rc == 0) {
            s->phase = PH_QUESTION;
            return 0;
        }
    } else if (rc == 0 && s->phase == PH_QUESTION) {
        rc = step_question(s);
    }
    if (rc != 0) {
        s->rc = rc;
        s->phase = PH_DONE;
    }
    return rc;
}

uint64_t lkv_worker_job_prefilled(const lkv_worker_job *s)
{
    return s->prefilled;
}

int lkv_worker_job_state(const lkv_worker_job *s)
{
    switch (s->phase) {
    case PH_WAIT:
        return LKV_JOB_WAIT;
    case PH_MISSES:
    case PH_QUESTION:
        return LKV_JOB_PREFILL;
    case PH_DECODE:
        return LKV_JOB_DECODE;
    default:
        return LKV_JOB_DONE;
    }
}

int lkv_worker_job_rc(const lkv_worker_job *s)
{
    return s->rc;
}

int lkv_worker_job_fail(lkv_worker_job *s, int rc, const char *msg)
{
    if (s->rc == 0) {
        s->rc = rc;
        lkv_errf(s->res->error, sizeof(s->res->error), rc, "%s", msg);
    }
    s->phase = PH_DONE;
    return s->rc;
}

int lkv_worker_set_prefill_chunk(lkv_worker *w, int n)
{
    if (n < 0) {
        return LKV_EINVAL;
    }
    w->o.prefill_chunk = n;
    return 0;
}

void lkv_worker_set_async(lkv_worker *w, int on)
{
    w->async = on;
}

/* The jobs of jobs[0..n) that decode now, as runner sequences (seqs, run: n slots each); a job
 * whose lease or pages fail here becomes DONE. Returns their count. */
static int decode_collect(lkv_worker *w, lkv_worker_job **jobs, int n, lkv_runner_seq *seqs,
                          lkv_worker_job **run)
{
    int m = 0;
    for (int b = 0; b < n; b++) {
        req_state *s = jobs[b];
        if (s->phase != PH_DECODE || s->rc != 0) {
            continue;
        }
        if (!w->async) {
            renew_lease(s);
        }
        int rc = check_pages(s);
        if (rc != 0) {
            s->rc = rc;
            s->phase = PH_DONE;
            continue;
        }
        if (s->phase != PH_DECODE) {
            continue; /* Restarted locally: prefill again first. */
        }
        seqs[m] = (lkv_runner_seq){.kv = &s->kv,
                                   .ctx = s->segs,
                                   .n_ctx = s->req->n_docs,
                                   .seg = &s->segs[s->req->n_docs],
                                   .token = s->next_tok};
        run[m++] = s;
    }
    return m;
}

/* One token sampled for each of the m jobs run from its row of logits ([m][vocab]), or, when
 * the batch was refused (rc != 0: nothing written), each run alone. */
static void decode_finish(lkv_worker *w, lkv_worker_job **run, lkv_runner_seq *seqs, int m,
                          const float *logits, int rc)
{
    const int V = w->m->cfg.vocab_size;
    for (int b = 0; b < m; b++) {
        req_state *s = run[b];
        if (rc != 0) {
            /* A batch is refused before anything is written: fail its members alone. */
            int r1 = lkv_runner_decode_batch(&w->run, &seqs[b], 1, s->logits);
            if (r1 != 0) {
                s->rc = lkv_errf(s->res->error, sizeof(s->res->error), r1, "decode step %d: %s",
                                 s->res->n_out, lkv_strerror(r1));
                s->phase = PH_DONE;
                continue;
            }
        } else {
            memcpy(s->logits, logits + (size_t)b * V, (size_t)V * sizeof(float));
        }
        s->row = s->logits;
        int r2 = sample_row(s);
        if (r2 != 0) {
            s->rc = r2;
            s->phase = PH_DONE;
        }
    }
}

int lkv_worker_decode_batch(lkv_worker *w, lkv_worker_job **jobs, int n, int *n_run)
{
    lkv_runner_seq *seqs = lkv_xmalloc((size_t)(n ? n : 1) * sizeof(*seqs));
    lkv_worker_job **run = lkv_xmalloc((size_t)(n ? n : 1) * sizeof(*run));
    int m = decode_collect(w, jobs, n, seqs, run);
    if (n_run != NULL) {
        *n_run = m;
    }
    if (m > 0) {
        float *logits = lkv_xmalloc((size_t)m * w->m->cfg.vocab_size * sizeof(float));
        int rc = lkv_runner_decode_batch(&w->run, seqs, m, logits);
        decode_finish(w, run, seqs, m, logits, rc);
        free(logits);
    }
    free(seqs);
    free(run);
    return 0;
}

int lkv_worker_job_prefill_ride(lkv_worker_job *j, lkv_worker_job **jobs, int n, int *n_run)
{
    lkv_worker *w = j->w;
    *n_run = -1;
    lkv_runner_seq *seqs = lkv_xmalloc((size_t)(n ? n : 1) * sizeof(*seqs));
    lkv_worker_job **run = lkv_xmalloc((size_t)(n ? n : 1) * sizeof(*run));
    int m = 0; /* j itself is not decoding: decode_collect skips it. */
    if (j->phase != PH_DONE && j->phase != PH_WAIT && j->rc == 0) {
        m = decode_collect(w, jobs, n, seqs, run);
    }
    float *logits = m > 0 ? lkv_xmalloc((size_t)m * w->m->cfg.vocab_size * sizeof(float)) : NULL;
    lkv_runner_ride ride = {.seqs = seqs, .n = m, .logits = logits};
    w->run.ride = m > 0 ? &ride : NULL;
    int rc = lkv_worker_job_prefill(j);
    w->run.ride = NULL;
    if (ride.done) {
        decode_finish(w, run, seqs, m, logits, 0);
        *n_run = m;
    }
    free(logits);
    free(seqs);
    free(run);
    return rc;
}

void lkv_worker_job_end(lkv_worker_job *s)
{
    lkv_rag_result *res = s->res;
    if (s->ending) {
        return;
    }
    s->ending = 1;
    if (res->n_out > 1) {
        res->tpot_ms = (now_ms() - s->t_first) / (res->n_out - 1);
    }
    if (s->rc == 0 && s->phase == PH_DONE && s->use_daemon && s->next_doc >= s->req->n_docs &&
        s->w->ps.n_maps == s->maps_at_start) {
        gather_puts(s);
        s->store = 1;
    }
}

void lkv_worker_job_free(lkv_worker_job *s)
{
    lkv_worker *w = s->w;
    lkv_rag_result *res = s->res;
    for (int j = 0; j < s->n_pfx; j++) {
        lkv_prefix_unpin(w->prefix, s->pfx[j]);
        if (j >= s->pfx_ready) {
            /* Admitted, never written (the request ended mid-document): out of the pool. */
            lkv_prefix_remove(w->prefix, s->pfx[j]);
        }
    }
    w->st.hit_docs += (uint64_t)res->hit_docs;
    w->st.miss_docs += (uint64_t)res->miss_docs;
    w->st.hit_tokens += res->hit_tokens;
    w->st.miss_tokens += res->miss_tokens;
    if (s->rc != 0) {
        w->st.failed++;
    }
    res->total_ms = now_ms() - s->t0;
    job_free(s);
}

void lkv_worker_job_finish(lkv_worker_job *s)
{
    lkv_worker_job_end(s);
    call_inline(s);
    lkv_worker_job_free(s);
}

int lkv_worker_run(lkv_worker *w, const lkv_rag_request *q, lkv_rag_result *res)
{
    lkv_worker_job *j;
    int rc = lkv_worker_job_start(w, q, res, NULL, 0, 0, &j);
    while (rc == 0 && lkv_worker_job_state(j) != LKV_JOB_DONE) {
        if (lkv_worker_job_state(j) == LKV_JOB_PREFILL) {
            rc = lkv_worker_job_prefill(j);
        } else {
            lkv_worker_decode_batch(w, &j, 1, NULL);
            rc = lkv_worker_job_rc(j);
        }
    }
    lkv_worker_job_finish(j);
    return rc;
}
