/*
 * lkv_worker.h: the co-located decode worker (DESIGN.md section 7): RAG requests end to end
 * against a real lazykvd, reading cached documents in place from the daemon's arena.
 *
 * One request (lkv_worker_run):
 *   1. Lookup every document (by profile + token ids) in one call. The replies carry the
 *      profile's weights identity (model_id), checked against the checkpoint the worker loaded
 *      (its BLAKE2b-256, or the revision given in the options): a mismatch refuses the request,
 *      so KV of one model is never served to (or stored by) another.
 *   2. Attach the present documents under one lease in ATTACH_MODE_PRESENT: what is present is
 *      pinned, the rest is reported, so an eviction between Lookup and Attach costs a miss, not a
 *      failed request. The arena is mapped once (lkv_pagespace.h) and each hit's blocks are
 *      referenced where the daemon keeps them: no document KV is copied on a hit.
 *   3. Each miss is computed alone from position 0 into worker pages (the position-free form the
 *      cache stores) and read from there by this request.
 *   4. The question is prefilled against every segment at its position in this prompt (block
 *      references: document start, block index), then tokens are decoded (greedy, or temperature
 *      and top-p with a seed) until max_tokens or an end token.
 *   5. The misses are stored with Put (after the last token: off the latency path), then the
 *      lease is released. A lease is renewed while a long generation runs.
 * Timing: TTFT is from the call to the first sampled token (lookup, attach, misses and prefill
 * included); TPOT is the mean time per later token.
 *
 * Failure model: every daemon call has the request's remaining deadline. An UNAVAILABLE Lookup
 * is retried every 100 ms for up to retry_ms (a restarting daemon). A daemon that stays
 * unreachable, or hangs, fails the request with a message naming the daemon, or (option
 * local_fallback) computes every document locally and says so in the result. Bad input (empty
 * document or question, a token id outside the vocabulary, a prompt past the model's maximum
 * position) is refused before anything is sent.
 *
 * Modes: LKV_RAG_LAZY is the product (LazyAttention over position-free pages).
 * LKV_RAG_MATERIALISE is the Block-Attention baseline: each document's pages are copied and
 * re-rotated to their position (lkv_materialise) before the question attends to them; it exists
 * to be compared with, in tests and benchmarks.
 *
 * Thread safety: a worker serves one request at a time (one thread).
 */
#ifndef LKV_WORKER_H
#define LKV_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "lkv_backend.h"
#include "lkv_client.h"
#include "lkv_model.h"
#include "lkv_tokenizer.h"

typedef struct lkv_worker lkv_worker; /* Opaque. */

/* Options of lkv_worker_create. Zero-initialise, then set what you need. Strings are copied. */
typedef struct lkv_worker_opts {
    const char *target;         /* lazykvd "host:port"; NULL or "": local only (no cache). */
    const char *profile;        /* Profile name; NULL: "stories260k". */
    const char *model_path;     /* llama2.c checkpoint (required unless synth). */
    const char *synth;          /* "PRESET[:SEED]": a random-weight model (lkv_synth.h) instead
                                   of a checkpoint; NULL: none. */
    const char *tokenizer_path; /* llama2.c tokenizer; NULL: token requests only. */
    const char *model_id;       /* Expected revision when the profile's model_id is not a
                                   "blake2b:" hash; NULL: such profiles are refused. */
    const char *bearer_token;   /* Sent to the daemon; NULL: none. */
    /* TLS to the daemon (lkv_client_options): tls_ca_file set: TLS, the daemon's certificate
     * verified against it; tls_cert_file + tls_key_file: the client certificate for a daemon
     * that requires one; tls_server_name: the name checked instead of the target's host. NULL:
     * plaintext / none. Files are read at each (re)connect. */
    const char *tls_ca_file, *tls_cert_file, *tls_key_file, *tls_server_name;
    int block_tokens;           /* Profile layout: tokens per block; 0: 16. */
    int dtype;                  /* Profile layout: enum lkv_dtype of stored KV (default f32). */
    int deadline_ms;            /* Deadline of the daemon calls before the first token, and
                                   again of those after the last, ms; 0: 10000. */
    int retry_ms;               /* Retry an UNAVAILABLE Lookup (a restarting daemon) this long,
                                   within the deadline; 0: 2000; < 0: never. */
    uint32_t lease_ttl_ms;      /* Lease TTL, ms; 0: 30000 (renewed at half-life). */
    int local_fallback;         /* 1: daemon unavailable -> compute locally, say so. */
    int no_inplace;             /* 1: store misses by Put only (the daemon's region is mapped
                                   read-only). 0: put in place: each miss is reserved before it
                                   is computed, computed straight into the reserved pages and
                                   committed (Put when the daemon refuses the Reserve). */
    uint32_t local_pages;       /* Worker pages (misses, question, copies); 0: 2048. */
    int max_position;           /* Largest prompt + output length; 0: the model's seq_len. */
    int threads;                /* Attention threads (lkv_attn_cpu_set_threads); 0: all. */
    const lkv_backend *backend; /* NULL: the CPU backend. Borrowed. A device backend (not
                                   "cpu") keeps the worker pages in its memory and maps the
                                   daemon's device arena through backend->devmap (without
                                   devmap it runs without a daemon: target must be NULL). */
    int round_weights_bf16;     /* 1: round the loaded fp32 weights to bf16 values (so a CPU
                                   run uses the bf16 weights a GPU run uses). */
    int copy_budget;            /* 1: Block-Attention copies (LKV_RAG_MATERIALISE) take the
                                   daemon's budget: each hit's copy is written into pages
                                   Reserved for a placeholder document of the same size under
                                   the request's lease (so the daemon evicts for it, and frees it
                                   at Release); a copy that finds no room makes its document a
                                   miss, recomputed here (not stored again). 0: copies in
                                   worker pages. */
    int no_put_when_full;       /* 1: a miss whose Reserve found no room (ENOSPC: the budget is
                                   pinned) or was declined by the daemon's hot admission filter
                                   (LKV_EADMIT) is not stored by Put afterwards (as a cache that
                                   cannot admit it would; the hit-rate simulator's rule). 0: it
                                   is Put after the last token (the daemon makes room then). */
    int sync_phases;            /* 1: wait for the backend at the end of each timed phase (miss,
                                   copy, question), so that the phase times of an asynchronous
                                   (GPU) backend are device times. */
    int prefill_chunk;          /* Chunked prefill: a prefill unit (lkv_worker_job_prefill)
                                   computes at most this many tokens of one segment (a missing
                                   document, or the question), its KV written chunk by chunk
                                   into the same pages. Chunks are cut at multiples of
                                   prefill_chunk from the segment's first token (prefix mode:
                                   the first chunk after the cached prefix ends at the next such
                                   multiple), so a document's KV depends on its tokens and this
                                   option only, never on the schedule or the batch. 0: whole
                                   segments (one unit per document, one for the question). */
    int hash_kv;                /* 1: each document's result gets kv_hash, a hash of its KV
                                   bytes read back from the pages the request used (a check
                                   that a hit reads what a miss wrote; copies the KV out). */
    /* Fault injection (tests): called between a request's Lookup and its Attach, e.g. to evict
     * a document there. NULL: none. */
    void (*after_lookup)(void *arg);
    void *hook_arg; /* Passed to after_lookup; borrowed. */
} lkv_worker_opts;

/* One document of a request: token ids (borrowed). */
typedef struct lkv_rag_doc {
    const int *tokens; /* n_tokens ids. */
    int n_tokens;      /* >= 1. */
} lkv_rag_doc;

enum lkv_rag_mode {
    LKV_RAG_LAZY = 0,        /* LazyAttention over the cached pages (the product). */
    LKV_RAG_MATERIALISE = 1, /* Block-Attention baseline: re-rotated copies per prompt. */
    LKV_RAG_PREFIX = 2,      /* Prefix-caching baseline: no daemon; the worker's prefix pool
                                (lkv_worker_prefix_setup, lkv_prefix.h) serves the longest
                                cached prefix of the prompt, the rest is computed. */
};

/* A RAG request. Pointers are borrowed for the call. */
typedef struct lkv_rag_request {
    int n_docs;              /* Documents, in prompt order (0 allowed). */
    const lkv_rag_doc *docs; /* [n_docs]. */
    const int *question;     /* The question's token ids (after the documents). */
    int n_question;          /* >= 1. */
    int max_tokens;          /* Tokens to generate, >= 1. */
    lkv_sampling sampling;   /* Greedy when temperature is 0. */
    int stop_at_eos;         /* 1: stop at BOS/EOS (not included in the output). */
    int mode;                /* enum lkv_rag_mode. */
    int keep_logits;         /* 1: the result keeps the logits of every output token. */
    int no_cache;            /* 1: do not use the daemon for this request (all local). */
} lkv_rag_request;

/* What happened to one document. */
typedef struct lkv_rag_doc_result {
    int hit;             /* 1: attached and read in place from the daemon's arena. */
    int tier;            /* enum lkv_wire_tier at Lookup (HOT, COLD, ABSENT; 0 local). */
    int n_tokens;        /* Tokens. */
    int64_t start;       /* Position of its first token in this prompt. */
    uint32_t n_blocks;   /* Blocks. */
    int stored;          /* Miss: 1 stored (Put or in place), 0 not tried, < 0 the error. */
    int inplace;         /* Miss: 1 computed into reserved pages and committed (no Put). */
    char key_hex[65];    /* Document key (wire form) as hex, "" in local mode. */
    int64_t page0;       /* Page of its block 0 in the daemon's region when it was read in place
                            (hit) or computed in place (reserved), else -1 (worker pages). */
    uint64_t pages_hash; /* FNV-1a of its region page list (0 with page0 -1). */
    uint64_t kv_hash;    /* opts.hash_kv: BLAKE2b-64 of its block bytes (all blocks in order)
                            as read back through the page space (the 8 digest bytes in memory
                            order), else 0. */
} lkv_rag_doc_result;

/* Result of lkv_worker_run. Free with lkv_rag_result_free. */
typedef struct lkv_rag_result {
    int n_out;                   /* Generated tokens. */
    int *tokens;                 /* [n_out]. Owned. */
    char *text;                  /* Their text (needs a tokenizer; else ""). Owned. */
    float *logits;               /* keep_logits: [n_out][vocab], the logits that chose token i. */
    int vocab;                   /* Logit row length. */
    int n_prompt;                /* Documents + question tokens. */
    int stop_eos;                /* 1: stopped at an end token; 0: max_tokens. */
    double ttft_ms, tpot_ms;     /* Time to first token; mean time per later token. */
    double total_ms;             /* Whole call, Put and Release included. */
    double lookup_ms, attach_ms; /* Daemon calls. */
    double miss_ms, put_ms;      /* Computing the misses; storing them. */
    double reserve_ms;           /* Reserve calls (misses in place, Block-Attention copies). */
    double copy_ms;              /* Block-Attention: materialising the re-rotated copies. */
    double question_ms;          /* Question prefill and the first token's sampling. */
    int copies, copies_refused;  /* Block-Attention copies in the daemon's budget / refused
                                    for lack of room (those documents count as misses). */
    uint64_t prefix_hit_blocks;  /* Prefix mode: blocks served from the pool. */
    uint64_t prefix_blocks;      /* Prefix mode: document blocks of the prompt. */
    int n_docs;                  /* Entries of docs. */
    lkv_rag_doc_result *docs;    /* [n_docs] in request order. Owned. */
    int hit_docs, miss_docs;     /* Documents served from the cache / computed. */
    uint64_t hit_tokens, miss_tokens;
    uint64_t zero_copy_blocks; /* Blocks read in place from the daemon's arena. */
    int local_only;            /* 1: the daemon was not used (local mode or fallback). */
    char note[512];            /* Warnings (fallback reason, Put failures, ...), or "". */
    char error[512];           /* Why the call failed, or "". */
} lkv_rag_result;

/* Worker statistics. */
typedef struct lkv_worker_stats {
    uint64_t requests, failed;    /* Requests run / failed. */
    uint64_t hit_docs, miss_docs; /* Over all requests. */
    uint64_t hit_tokens, miss_tokens;
    uint64_t arena_maps;       /* Times the daemon's arena was mapped (once per arena). */
    uint64_t leases, renewals; /* Leases made, renewed. */
    uint64_t reconnects;       /* Fresh channels made after UNAVAILABLE. */
    uint64_t inplace_docs;     /* Misses stored in place (Reserve + Commit). */
    uint64_t put_docs;         /* Misses stored by Put. */
    uint64_t reserve_refused;  /* Reserves refused (budget, lease limits, role): stored by Put. */
    uint64_t reserve_declined; /* Reserves declined by the daemon's hot admission filter
                                  (LKV_EADMIT, hot_admission = door): computed in worker pages,
                                  stored by Put unless no_put_when_full. */
    uint64_t reserve_busy;     /* Reserves answered LKV_EINPROGRESS (another worker computes
                                  the document): computed here too, stored by Put. */
    uint64_t commit_failed;    /* Commits that failed (lease gone, daemon gone): not stored. */
    uint64_t local_restarts;   /* Requests that went on locally (lease lost, arena remapped). */
    int placement;             /* enum lkv_ps_placement of the page space now (lkv_pagespace.h:
                                  host, or where device worker pages sit next to the arena). */
} lkv_worker_stats;

/* Creates a worker: loads and hashes the checkpoint, loads the tokenizer, connects (lazily) to
 * the daemon. On error writes a message to err (errlen bytes) and returns LKV_EINVAL (options),
 * LKV_EIO / LKV_ECORRUPT / LKV_ENOTSUP (model or tokenizer file). *out is owned by the caller
 * (lkv_worker_destroy). */
int lkv_worker_create(const lkv_worker_opts *o, lkv_worker **out, char *err, size_t errlen);

/* Destroys w (unmaps the arena; no lease is held between requests). NULL is fine. */
void lkv_worker_destroy(lkv_worker *w);

/* Runs one request. On 0, *res is filled (free with lkv_rag_result_free). On error res->error
 * says why and the code is: LKV_EINVAL (bad request), LKV_EPROFILE (unknown profile or model
 * identity mismatch), LKV_EUNAVAIL / LKV_ETIMEDOUT (daemon unreachable or the deadline passed,
 * without local_fallback), LKV_ENOSPC (worker pages), or a daemon error. res must be freed in
 * both cases. Nothing stays pinned after the call returns (the lease is released, or expires by
 * itself if the daemon cannot be reached). */
int lkv_worker_run(lkv_worker *w, const lkv_rag_request *req, lkv_rag_result *res);

/* ---- Stepwise requests (the serving engine, lkv_engine.h) --------------------------------
 * lkv_worker_run is these calls in a row for one request; the engine interleaves them across
 * requests on one thread (the worker is still single-threaded):
 *   lkv_worker_job_start      check, Lookup, Attach, Reserve (the blocking daemon calls), pages
 *                             set up
 *   lkv_worker_job_prefill    one unit of prefill per call: one missing document, or the
 *                             question (and, in materialise mode, the copies) plus the first
 *                             sampled token; with opts.prefill_chunk, one chunk of at most
 *                             that many tokens of one of them (the first token is sampled
 *                             after the question's last chunk)
 *   lkv_worker_decode_batch   one decode step of every job given that is decoding, batched
 *   lkv_worker_job_finish     Commit / Put of the misses (only after a generation that
 *                             completed), then Release; frees the job
 * Daemon calls off the compute thread (the engine's client-call thread): lkv_worker_set_async(w,
 * 1), then lkv_worker_job_open instead of _start (the job waits, LKV_JOB_WAIT, for its START
 * call), and after every step the compute thread asks each job lkv_worker_job_take_call for the
 * call it needs (START; RENEW of its lease at half-life; END after lkv_worker_job_end), runs
 * lkv_worker_job_call(job, call) on the call thread (one call per job at a time; it touches only
 * the job's daemon state and the worker's client, which no other thread uses in async mode),
 * and lkv_worker_job_called(job, call) back on the compute thread; a job finishes with
 * lkv_worker_job_end (gathers what a Put needs: its pages can be reused at once), its END call,
 * then lkv_worker_job_free. A job with a call in flight (lkv_worker_job_busy) must not be failed,
 * ended or freed until the call came back.
 * A job whose lease cannot be renewed (expired, daemon gone or too slow) or whose pages were
 * remapped goes on locally: every document computed again in worker pages, the tokens it
 * already produced fed again (its output does not change), nothing stored (counted in
 * local_restarts).
 * A job runs in its own pages: NULL pages is the worker's own bump allocator (one job at a
 * time), else the n_pages worker-page indices given (0 .. lkv_worker_local_pages - 1, distinct
 * from every other live job's), at least lkv_worker_pages_needed of them. */
typedef struct lkv_worker_job lkv_worker_job; /* Opaque. */

enum lkv_job_state {
    LKV_JOB_PREFILL = 0, /* Needs lkv_worker_job_prefill. */
    LKV_JOB_DECODE = 1,  /* Needs a decode step. */
    LKV_JOB_DONE = 2,    /* Generation over or failed: finish it. */
    LKV_JOB_WAIT = 3,    /* Waiting for its START call (async mode). */
};

/* Daemon calls of a job (async mode). */
enum lkv_job_call {
    LKV_CALL_NONE = 0,
    LKV_CALL_START = 1, /* Lookup, Attach, Reserve. */
    LKV_CALL_RENEW = 2, /* Lease renewal. */
    LKV_CALL_END = 3,   /* Commit, Put, Release. */
};

/* 1: daemon calls are made by the caller through take_call / call / called (no step blocks on
 * the daemon); 0 (default): inline. Set before any job starts. */
void lkv_worker_set_async(lkv_worker *w, int on);

/* As lkv_worker_job_start without the daemon calls: a job that uses the daemon is left in
 * LKV_JOB_WAIT for its START call. Returns 0, or the error of a refused request (then DONE). */
int lkv_worker_job_open(lkv_worker *w, const lkv_rag_request *q, lkv_rag_result *res,
                        const uint32_t *pages, uint32_t n_pages, double t_arrive,
                        lkv_worker_job **out);

/* Compute thread: the call j needs now (enum lkv_job_call), marked in flight; LKV_CALL_NONE if
 * none (or one is in flight). */
int lkv_worker_job_take_call(lkv_worker_job *j);

/* Call thread: makes call (the blocking daemon calls, each within the request's deadline). */
void lkv_worker_job_call(lkv_worker_job *j, int call);

/* Compute thread: applies call's outcome (START: maps the arena, points hits at the daemon's
 * pages, then PREFILL or DONE; RENEW: a lost lease restarts the job locally). */
void lkv_worker_job_called(lkv_worker_job *j, int call);

/* 1 while a call of j is in flight. */
int lkv_worker_job_busy(const lkv_worker_job *j);

/* Compute thread: ends j's compute (TPOT; copies out the blocks of misses to Put). Its END call
 * (take_call) then stores and releases; then lkv_worker_job_free. */
void lkv_worker_job_end(lkv_worker_job *j);

/* Counts, times the result and frees j (after its END call, if it had one). */
void lkv_worker_job_free(lkv_worker_job *j);

/* Worker pages a request can need at most: every document a miss (twice in materialise mode),
 * plus the question and max_tokens. */
uint32_t lkv_worker_pages_needed(const lkv_worker *w, const lkv_rag_request *q);

/* The worker's own pages (opts.local_pages) and the bytes of one. */
uint32_t lkv_worker_local_pages(const lkv_worker *w);
uint64_t lkv_worker_page_bytes(const lkv_worker *w);

/* The monotonic clock in ms that results are timed with. */
double lkv_worker_now_ms(void);

/* Starts a job for q (borrowed until finish) writing into res (cleared here; the caller frees
 * it with lkv_rag_result_free after finish). pages: see above (borrowed for the call, copied).
 * t_arrive (lkv_worker_now_ms; 0: now) is when the request arrived: TTFT counts from there.
 * *out is always set (finish it even on error). Returns 0 or the error lkv_worker_run would
 * return (res->error says why; the job is then LKV_JOB_DONE). */
int lkv_worker_job_start(lkv_worker *w, const lkv_rag_request *q, lkv_rag_result *res,
                         const uint32_t *pages, uint32_t n_pages, double t_arrive,
                         lkv_worker_job **out);

/* One unit of prefill (see above). Returns 0 or the job's error (it is then DONE). */
int lkv_worker_job_prefill(lkv_worker_job *j);

/* Tokens j has prefilled so far (documents and question; the serving engine's token budget
 * counts them). */
uint64_t lkv_worker_job_prefilled(const lkv_worker_job *j);

/* One decode step for every job of jobs[0..n) in state DECODE (others are skipped), as one
 * batched pass (lkv_runner_decode_batch), then one token sampled per job (appended to its
 * result; a job that reached max_tokens or an end token becomes DONE). A job that fails (its
 * lease cannot be renewed, its pages are full) becomes DONE with its error; the others go on.
 * *n_run (optional) gets the batch size actually run. Returns 0. */
int lkv_worker_decode_batch(lkv_worker *w, lkv_worker_job **jobs, int n, int *n_run);

/* lkv_worker_job_prefill of j with the decode step of jobs[0..n) riding along in the same
 * forward pass (Sarathi-style piggybacking: the dense ops run once over the prefill chunk's
 * rows and the decoding jobs' rows; lkv_runner.h "Ride"), when the unit runs a prefill pass (a
 * chunk of a missing document or of the question). *n_run: the decode rows that ran with it
 * (their tokens sampled, as lkv_worker_decode_batch does), or -1 if none rode (the unit ran no
 * such pass, or nothing was decoding): then run lkv_worker_decode_batch as usual. Every job's
 * tokens and logits are what the two calls in turn give (bitwise on the CPU backend). Returns
 * what lkv_worker_job_prefill returns. */
int lkv_worker_job_prefill_ride(lkv_worker_job *j, lkv_worker_job **jobs, int n, int *n_run);

/* enum lkv_job_state of j, and its error (0 while none). */
int lkv_worker_job_state(const lkv_worker_job *j);
int lkv_worker_job_rc(const lkv_worker_job *j);

/* Ends j with rc (e.g. LKV_ECANCELLED, LKV_ETIMEDOUT) and message msg unless it already failed;
 * it becomes DONE (its misses are then not stored). Returns its error. */
int lkv_worker_job_fail(lkv_worker_job *j, int rc, const char *msg);

/* lkv_worker_job_end, its END call inline, lkv_worker_job_free: stores the misses (a job that
 * generated to the end), releases the lease, counts, times the result and frees j (NULL is not
 * allowed). */
void lkv_worker_job_finish(lkv_worker_job *j);

/* Sets opts.prefill_chunk (n >= 0; 0: whole segments) for the requests started from now on; call
 * with no request running (a request's chunks are then the same solo and in a batch). Returns 0
 * or LKV_EINVAL. */
int lkv_worker_set_prefill_chunk(lkv_worker *w, int n);

/* Frees what res owns and zeroes it. */
void lkv_rag_result_free(lkv_rag_result *res);

/* The tokenizer (NULL if none was loaded); borrowed until lkv_worker_destroy. */
const lkv_tokenizer *lkv_worker_tokenizer(const lkv_worker *w);

/* The model (borrowed until lkv_worker_destroy). */
const lkv_model *lkv_worker_model(const lkv_worker *w);

/* "blake2b:<64 hex>" of the loaded checkpoint (borrowed until lkv_worker_destroy). */
const char *lkv_worker_model_hash(const lkv_worker *w);

/* Fills *st. */
void lkv_worker_stats_get(const lkv_worker *w, lkv_worker_stats *st);

/* Points the worker at another lazykvd (target "host:port", borrowed; NULL or "": none, local
 * only), e.g. a fresh daemon between benchmark runs: a new client; the new daemon's arena is
 * mapped at its first Attach or Reserve. Call with no request running. Returns 0 or the
 * client's error (the worker then has no daemon). A device backend needs the HBM mapping. */
int lkv_worker_retarget(lkv_worker *w, const char *target);

/* Drops the page space: the mapping of the daemon's arena and the worker pages; the next request
 * maps again (stats' arena_maps keeps counting). A device arena's import (cudaIpcOpenMemHandle)
 * holds the daemon's allocation alive until it is closed, also after that daemon exits: call
 * this before a daemon is replaced by another that needs the same memory (bench/serving does,
 * between points). Call with no request running. Returns 0, or LKV_EBUSY while a prefix pool is
 * set up (its KV lives in the worker pages: remove it first with lkv_worker_prefix_setup). */
int lkv_worker_unmap(lkv_worker *w);

/* (Re)creates the prefix pool of LKV_RAG_PREFIX requests: the LAST n_pages of the worker's
 * pages (opts.local_pages; keep them out of a serving engine's kv_pages), evicting with policy
 * kind (enum lkv_policy_kind), empty. n_pages 0 removes it. Call with no request running.
 * Returns 0 or LKV_EINVAL (n_pages not below local_pages, unknown kind). */
int lkv_worker_prefix_setup(lkv_worker *w, uint32_t n_pages, int policy_kind);

/* Pool statistics (zeros without a pool); st is an lkv_prefix_stats (lkv_prefix.h). */
struct lkv_prefix_stats;
void lkv_worker_prefix_stats(const lkv_worker *w, struct lkv_prefix_stats *st);

/* Writes "blake2b:" and the BLAKE2b-256 of the file at path as hex into out (at least 73
 * bytes). Returns 0 or LKV_EIO. */
int lkv_worker_hash_file(const char *path, char *out, size_t len);

#endif
