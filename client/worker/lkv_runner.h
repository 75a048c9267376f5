/*
 * lkv_runner.h: the decode worker's model runner: one forward pass of a Llama-architecture
 * model (llama2.c checkpoint, client/lkv_model.h) over paged, position-free KV, with every
 * numeric operation behind a backend (lkv_backend.h). The CPU backend runs it today; a CUDA
 * backend runs the same code path.
 *
 * Forward pass (llama2.c run.c semantics, batched over the new tokens of one call):
 *   x = tok_emb[token]
 *   per layer: xb = rmsnorm(x) * rms_att; q, k, v = Wq xb, Wk xb, Wv xb; K rotated at its
 *   segment-local position and written to the segment's block; att = LazyAttention(q, ...);
 *   x += Wo att; xb = rmsnorm(x) * rms_ffn; x += W2 (silu(W1 xb) * W3 xb)
 *   logits = Wcls (rmsnorm(x) * rms_final)
 * One new token appended to a non-empty segment takes the decode path (the token's K/V are
 * written to its block first, then lkv_attn_decode reads every key from the arena); anything
 * else is one prefill (keys of the new tokens passed in, rotated local to the first of them).
 *
 * KV: an lkv_model_kv (pages in the lkv_layout.h layout) and segments (lkv_model_seg): see
 * lkv_model.h. The runner takes new pages from the arena's bump allocator (kv->n_used) and
 * zeroes them before use, so a reused page holds no stale tokens in its unused slots.
 *
 * Thread safety: a runner is used by one thread at a time; several runners may share a model
 * and a backend.
 */
#ifndef LKV_RUNNER_H
#define LKV_RUNNER_H

#include "lkv_backend.h"
#include "lkv_model.h"

struct lkv_runner_seq;

/* Decode rows riding along a prefill pass (Sarathi-style piggybacking): set r->ride before a
 * lkv_runner_forward; see there. */
typedef struct lkv_runner_ride {
    struct lkv_runner_seq *seqs; /* Borrowed: as lkv_runner_decode_batch's. */
    int n;                       /* >= 1. */
    float *logits;               /* [n][vocab] host, caller-owned: their logits. */
    int done;                    /* Set to 1 by the forward that ran them. */
} lkv_runner_ride;

/* A runner: the model's weights made backend-resident and scratch buffers. Initialise with
 * lkv_runner_init, free with lkv_runner_free. */
typedef struct lkv_runner {
    const lkv_model *m;    /* Borrowed: must outlive the runner. */
    const lkv_backend *be; /* Borrowed: must outlive the runner. */
    const float *w;        /* Backend copy of m->data (map_weights). */
    const float *tok_emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final;
    const float *wcls;     /* Classifier (tok_emb when shared). */
    int cap;               /* Tokens the scratch buffers hold. */
    float *x, *xb, *q;     /* [cap][dim] backend scratch. */
    float *k, *ks, *v;     /* [cap][n_kv_heads * head_dim]. */
    float *att, *tmp;      /* [cap][dim]. */
    float *h1, *h3;        /* [cap][hidden_dim]. */
    float *logits;         /* [cap][vocab] backend logits. */
    uint64_t n_forward;    /* Calls made (statistics). */
    int last_logits;       /* 1: lkv_runner_forward computes and returns the logits of its LAST
                              token only ([1][vocab]; what sampling needs), 0: of every token. */
    lkv_runner_ride *ride; /* Borrowed, or NULL: consumed (cleared) by the next forward. */
    uint64_t n_rides;      /* Forwards that carried ridden decode rows (statistics). */
} lkv_runner;

/* Prepares r for model m (borrowed) on backend be (borrowed). Returns 0 or LKV_EINVAL. */
int lkv_runner_init(lkv_runner *r, const lkv_model *m, const lkv_backend *be);

/* Frees r's backend memory. Safe on a zeroed struct. */
void lkv_runner_free(lkv_runner *r);

/* Runs n tokens (ids borrowed, host) appended to seg, exactly as lkv_model_forward documents:
 * token i sits at absolute position seg->start + seg->n_tokens + i and its key is stored rotated
 * at segment-local position seg->n_tokens + i; attention sees the n_ctx context segments (each
 * at its start, all ending before seg's new tokens) and, causally, seg. logits (optional, host,
 * caller-owned) receives [n][vocab_size]; trace (optional) the per-layer attention tensors.
 * Returns 0, LKV_ENOSPC (arena or segment full), or LKV_EINVAL (a token id out of range, n < 1,
 * positions past LKV_MAX_POSITION or overlapping). On error seg and kv may hold partial
 * writes. With r->last_logits set, logits receives the last token's row only ([1][vocab]).
 * Ride: if r->ride is set, this call clears it and, when it is a prefill (not the one-token
 * decode path), has no trace, and the ride's sequences pass lkv_runner_decode_batch's checks
 * over the same arena, runs their decode step in the SAME pass: every dense op over the n
 * prefill rows and the ride's rows together, attention as the two calls it would be alone;
 * ride->logits gets their rows, each sequence gets its token appended, ride->done is set. Each
 * row is what the two calls alone give on a backend whose ops compute rows independently (the
 * CPU backend: bitwise). Otherwise the ride is left undone and nothing of it is touched (but
 * pages a sequence would need may have been taken, as decode_batch does). */
int lkv_runner_forward(lkv_runner *r, lkv_model_kv *kv, const lkv_model_seg *ctx, int n_ctx,
                       lkv_model_seg *seg, const int *tokens, int n, float *logits,
                       lkv_model_trace *trace);

/* One sequence of a batched decode step (lkv_runner_decode_batch). */
typedef struct lkv_runner_seq {
    lkv_model_kv *kv;         /* Its pages (borrowed; one arena base for the whole batch). */
    const lkv_model_seg *ctx; /* Its n_ctx context segments (borrowed). */
    int n_ctx;                /* >= 0. */
    lkv_model_seg *seg;       /* Its question segment, non-empty; one token is appended. */
    int token;                /* The token appended. */
} lkv_runner_seq;

/* One decode step of n independent sequences in one pass (continuous batching): every dense op
 * runs once over the n rows, attention is one lkv_attn_decode call of batch n (each sequence
 * with its own references and position). Row b of logits ([n][vocab], host, caller-owned) is
 * exactly what lkv_runner_forward of seqs[b].token alone gives on a backend whose ops compute
 * rows independently (the CPU backend: bitwise). All sequences' kv must share base, page_bytes,
 * block size and dtype. Returns 0, LKV_EINVAL (an empty segment, a token out of range, mixed
 * arenas, a position past LKV_MAX_POSITION) or LKV_ENOSPC (a sequence's pages or segment full),
 * both before anything is written. */
int lkv_runner_decode_batch(lkv_runner *r, lkv_runner_seq *seqs, int n, float *logits);

#endif
