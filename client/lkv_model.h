/*
 * lkv_model.h: a Llama-architecture model runner on the CPU (fp32) whose attention goes through
 * the LazyAttention CPU API (kernels/lkv_attn.h). The start of the reference decode worker: it
 * depends only on common/ and kernels/, so kernels-only builds (the GPU machine) compile it.
 *
 * Model: a llama2.c "legacy" (version 0) checkpoint (tests/data/models/README.md): header of 7
 * int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; vocab_size < 0
 * means an unshared classifier), then fp32 tensors. RoPE theta 10000, interleaved pairs, RMSNorm
 * eps 1e-5, SwiGLU FFN.
 *
 * KV: an arena of pages, each one block in the lkv_layout.h layout (all layers, K and V) in a
 * chosen dtype. A segment is a run of tokens whose keys are stored rotated at segment-local
 * positions 0..n-1: a document prefilled in isolation from position 0, or the question (plus
 * the generated tokens) of one prompt. Its pages are position-free: a prompt places segments at
 * starts of its choosing (seg.start) and attention rotates the query by the offset.
 *
 * QKV dump file (lkv_qkv_dump_write / _read, tool model_dump): everything a GPU
 * kernel check needs to replay the tiny model's attention for one prompt [doc_a][doc_b]
 * [question] (prefill of the question, then decode of one generated token), layer by layer,
 * with the CPU reference's outputs. Little-endian, no padding, in this order:
 *
 *   offset  size              field
 *   0       8                 magic "LKVQKV01"
 *   8       6 x int32         shape: n_layers, n_q_heads, n_kv_heads, head_dim, dtype,
 *                             block_tokens
 *   32      4 x int32         posenc cfg: kind, rope_pairing, rotary_dim, rope_scaling
 *   48      5 x float64       rope_theta, scaling_factor, low_freq_factor, high_freq_factor,
 *                             original_max_pos
 *   88      float32           sm_scale
 *   92      uint32            n_pages
 *   96      uint64            page_bytes
 *   104     int32 n_new, int64 new_start, int32 n_refs        (prefill case; 16 bytes)
 *   120     int64 dec_pos, int32 n_dec_refs                    (decode case; 12 bytes)
 *   132     n_pages * page_bytes   the arena (pages 0..n_pages-1)
 *   then    n_refs x uint64        prefill block references (docs at their starts)
 *   then    n_dec_refs x uint64    decode block references (docs + question + new token)
 *   then    per layer l = 0..n_layers-1, fp32 arrays:
 *             q      [n_new][n_q_heads][head_dim]   prefill queries, unrotated
 *             k_new  [n_new][n_kv_heads][head_dim]  rotated at local positions 0..n_new-1
 *             v_new  [n_new][n_kv_heads][head_dim]
 *             out    [n_new][n_q_heads][head_dim]   lkv_attn_prefill_cpu output
 *             dq     [n_q_heads][head_dim]          decode query (batch 1), unrotated
 *             dout   [n_q_heads][head_dim]          lkv_attn_decode_cpu output
 *             dlse   [n_q_heads]                    its lse
 * The decode token's own K/V are already in the arena (it is the last token of the question
 * segment), as the decode API expects.
 */
#ifndef LKV_MODEL_H
#define LKV_MODEL_H

#include <stdint.h>

#include "lkv_attn.h"
#include "lkv_layout.h"

/* Hyperparameters from the checkpoint header. */
typedef struct lkv_model_cfg {
    int dim;        /* Model width. */
    int hidden_dim; /* FFN width. */
    int n_layers;   /* Transformer layers. */
    int n_heads;    /* Query heads. */
    int n_kv_heads; /* KV heads (GQA when < n_heads). */
    int vocab_size; /* Tokens. */
    int seq_len;    /* Trained context length (not enforced). */
    int head_dim;   /* dim / n_heads. */
} lkv_model_cfg;

/* A loaded model. Weight pointers point into data. */
typedef struct lkv_model {
    lkv_model_cfg cfg;
    lkv_posenc_cfg pe_cfg; /* RoPE theta 10000, interleaved, full rotary dims. */
    lkv_posenc pe;         /* Tables built from pe_cfg. */
    float *data;           /* The fp32 tensors of the file. Owned. */
    const float *tok_emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final;
    const float *wcls; /* Classifier: tok_emb when shared. */
} lkv_model;

/* Loads a llama2.c legacy checkpoint. On success *out is a new model (free with
 * lkv_model_destroy). Returns 0, LKV_EIO (open/read), LKV_ECORRUPT (bad header or size) or
 * LKV_ENOTSUP (head_dim not 8..256 multiple of 8, or heads beyond LKV_MAX_Q_HEADS). */
int lkv_model_load(const char *path, lkv_model **out);

/* Frees a model from lkv_model_load (NULL is fine). */
void lkv_model_destroy(lkv_model *m);

/* KV arena: n_pages pages of one block each, handed out in order (a bump allocator; tests and
 * the tiny-model worker never free single pages), or, when grant is set, from a list of pages
 * someone else allocated (the serving engine gives each request in flight its own pages out of
 * one shared free list, lkv_engine.h): the i-th page taken is grant[i], up to n_grant. */
typedef struct lkv_model_kv {
    lkv_kv_shape shape;    /* The model's KV shape, with the chosen dtype and block size. */
    uint64_t page_bytes;   /* == lkv_block_bytes(&shape). */
    uint32_t n_pages;      /* Capacity. */
    uint32_t n_used;       /* Pages handed out: 0 .. n_used-1. */
    uint8_t *base;         /* n_pages * page_bytes bytes, zeroed. Owned when owned is 1. */
    int owned;             /* 1: base is from lkv_model_kv_init (freed by lkv_model_kv_free); 0:
                              a view over memory someone else owns (the worker's page space). */
    const uint32_t *grant; /* NULL: bump allocation from n_used. Else pages to take, in order
                              (borrowed; they must lie below n_pages). */
    uint32_t n_grant;      /* Entries of grant. */
    uint32_t n_granted;    /* Entries of grant taken so far. */
} lkv_model_kv;

/* Pages kv can still hand out. */
static inline uint32_t lkv_model_kv_room(const lkv_model_kv *kv)
{
    return kv->grant != NULL ? kv->n_grant - kv->n_granted : kv->n_pages - kv->n_used;
}

/* Takes the next page (the caller checked lkv_model_kv_room). */
static inline uint32_t lkv_model_kv_take(lkv_model_kv *kv)
{
    return kv->grant != NULL ? kv->grant[kv->n_granted++] : kv->n_used++;
}

/* Creates an arena for m with block_tokens (1..64) and dtype. Returns 0 or LKV_EINVAL. */
int lkv_model_kv_init(lkv_model_kv *kv, const lkv_model *m, int block_tokens, int dtype,
                      uint32_t n_pages);
void lkv_model_kv_free(lkv_model_kv *kv);

#define LKV_MODEL_SEG_MAX_BLOCKS 1024

/* A segment (see the file comment). Zero-initialise, set start, then append with
 * lkv_model_forward. start may be changed later to place the same cached pages elsewhere. */
typedef struct lkv_model_seg {
    int64_t start;    /* Absolute position of token 0 in the current prompt. */
    int32_t n_tokens; /* Tokens appended so far. */
    int32_t n_blocks; /* Pages used. */
    uint32_t pages[LKV_MODEL_SEG_MAX_BLOCKS]; /* Page of block b. */
} lkv_model_seg;

/* Writes the block references of n segments (in order, each at its start) to refs (caller-owned,
 * room for every block) and their count to *n_refs. Returns 0 or LKV_EINVAL (a start or block
 * index out of the reference's range). */
int lkv_model_refs(const lkv_model_kv *kv, const lkv_model_seg *segs, int n, uint64_t *refs,
                   int32_t *n_refs);

/* Per-layer capture of the attention inputs and outputs of one lkv_model_forward call. Zero it
 * before first use; forward (re)allocates the arrays; free with lkv_model_trace_free. */
typedef struct lkv_model_trace {
    int n_tok;         /* Tokens of the last call. */
    int decode;        /* 1: the call took the decode path (1 token, keys from the arena). */
    int64_t new_start; /* Prefill: absolute position of the first new token. */
    float *q;          /* [n_layers][n_tok][n_heads][head_dim] unrotated queries. */
    float *k;          /* [n_layers][n_tok][n_kv_heads][head_dim] keys as passed to prefill (rotated
                          at positions local to new_start); decode: as stored. */
    float *v;          /* [n_layers][n_tok][n_kv_heads][head_dim]. */
    float *att;        /* [n_layers][n_tok][n_heads][head_dim] attention outputs. */
} lkv_model_trace;

void lkv_model_trace_free(lkv_model_trace *t);

/* Runs n tokens (ids in tokens, borrowed) appended to seg, on the CPU backend of the runner
 * (client/worker/lkv_runner.h, which holds the forward pass; a runner made once is faster for
 * many calls): token i sits at absolute position
 * seg->start + seg->n_tokens + i, its key is stored rotated at local position seg->n_tokens + i
 * in new pages of kv as needed. Attention sees every token of the n_ctx context segments (each
 * at its start; they must end before seg's new tokens) and, causally, seg itself. A single
 * token appended to a non-empty segment takes the decode path (lkv_attn_decode_cpu with the
 * token's K/V written first); otherwise the new tokens are one prefill (lkv_attn_prefill_cpu)
 * over ctx and seg's earlier tokens. logits (optional, caller-owned) receives [n][vocab_size].
 * trace (optional) receives the per-layer attention tensors. Returns 0, LKV_ENOSPC (arena or
 * segment full) or LKV_EINVAL (positions). On error seg and kv may hold partial writes. */
int lkv_model_forward(const lkv_model *m, lkv_model_kv *kv, const lkv_model_seg *ctx, int n_ctx,
                      lkv_model_seg *seg, const int *tokens, int n, float *logits,
                      lkv_model_trace *trace);

/* Index of the largest of n logits (the first on ties). */
int lkv_model_argmax(const float *logits, int n);

/* The QKV dump (file format in the file comment). Arrays are owned by the struct. */
typedef struct lkv_qkv_dump {
    lkv_kv_shape shape;
    lkv_posenc_cfg pe_cfg;
    float sm_scale;
    uint32_t n_pages;
    uint64_t page_bytes;
    uint8_t *arena;    /* [n_pages * page_bytes] */
    int32_t n_new;     /* Prefill: question tokens. */
    int64_t new_start; /* Prefill: position of the first question token. */
    int32_t n_refs;
    uint64_t *refs;  /* [n_refs] */
    int64_t dec_pos; /* Decode: position of the query token. */
    int32_t n_dec_refs;
    uint64_t *dec_refs;             /* [n_dec_refs] */
    float *q, *k_new, *v_new, *out; /* [n_layers][n_new][heads][head_dim] */
    float *dq, *dout;               /* [n_layers][n_q_heads][head_dim] */
    float *dlse;                    /* [n_layers][n_q_heads] */
} lkv_qkv_dump;

/* Builds a dump from m: prefills docs a and b in isolation (block_tokens, dtype), places them at
 * 0 and na, prefills the question at na + nb, then greedily generates one token and decodes it.
 * Token arrays are borrowed. Returns 0 or an error of lkv_model_forward. */
int lkv_qkv_dump_make(const lkv_model *m, const int *doc_a, int na, const int *doc_b, int nb,
                      const int *question, int nq, int block_tokens, int dtype, lkv_qkv_dump *d);

/* Writes / reads a dump file. read fills *d (free with lkv_qkv_dump_free). Return 0, LKV_EIO or
 * (read) LKV_ECORRUPT. */
int lkv_qkv_dump_write(const char *path, const lkv_qkv_dump *d);
int lkv_qkv_dump_read(const char *path, lkv_qkv_dump *d);
void lkv_qkv_dump_free(lkv_qkv_dump *d);

#endif
