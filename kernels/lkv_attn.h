/*
 * lkv_attn.h: LazyAttention, the C API shared by the CPU reference (lkv_attn_cpu.c) and the
 * CUDA kernels (lkv_attn_cuda.h). Read DESIGN.md sections 1 and 10.
 *
 * Cached documents are stored with keys rotated at document-local positions (lkv_layout.h).
 * A document placed at start s of a prompt is attended by a query at absolute position p by
 * rotating the (unrotated) query by p - s: score = <R(p - s) q, R(j) k_j>. ALiBi adds
 * slope_h * ((s + j) - p). Angles come from exact integer offsets (lkv_posenc: frequencies in
 * turns, fp64 on the host, an fp32 hi/lo pair on the device).
 *
 * Shapes (row-major, innermost last):
 *   q        [n_tokens][n_q_heads][head_dim]   unrotated (pre-RoPE) queries
 *   k_new    [n_tokens][n_kv_heads][head_dim]  new keys rotated at segment-local positions
 *   v_new    [n_tokens][n_kv_heads][head_dim]
 *   out      [n_tokens][n_q_heads][head_dim]
 * GQA head mapping: kv_head = q_head / (n_q_heads / n_kv_heads).
 *
 * Element types: the CPU reference takes q, k_new, v_new, out as fp32 and reads the arena in
 * shape.dtype (f32, f16 or bf16); the CUDA kernels take every tensor in shape.dtype.
 */
#ifndef LKV_ATTN_H
#define LKV_ATTN_H

#include <stdint.h>

#include "lkv_layout.h"

#define LKV_MAX_Q_HEADS 256

/* Position-encoding tables of a model, built once on the host by lkv_posenc_init. Plain data:
 * copy it by value (kernels take it as a kernel parameter or in constant memory). */
typedef struct lkv_posenc {
    int kind;                                /* enum lkv_posenc_kind. */
    int pairing;                             /* enum lkv_rope_pairing. */
    int head_dim;                            /* Head dimension the table was built for. */
    int n_pairs;                             /* Rotated pairs: rotary_dim / 2. */
    double freq_turns[LKV_MAX_HEAD_DIM / 2]; /* theta_j / (2 pi), scaling applied (fp64). */
    float freq_hi[LKV_MAX_HEAD_DIM / 2];     /* fp32 part of freq_turns. */
    float freq_lo[LKV_MAX_HEAD_DIM / 2];     /* freq_turns - freq_hi, as fp32. */
    int n_q_heads;                           /* Heads with an ALiBi slope. */
    float alibi_slope[LKV_MAX_Q_HEADS];      /* ALiBi slope per query head (kind ALIBI). */
} lkv_posenc;

/* Builds the tables for cfg, head_dim and n_q_heads into *pe (caller-owned storage). Returns
 * LKV_EINVAL naming nothing else on a bad config (rotary_dim odd or > head_dim, theta <= 0,
 * bad scaling parameters, head_dim outside 8..256 or not a multiple of 8). */
int lkv_posenc_init(lkv_posenc *pe, const lkv_posenc_cfg *cfg, int head_dim, int n_q_heads);

/* Flags of the attention calls. */
#define LKV_ATTN_NO_ROTATE 1u /* Benchmark only: skip the query rotation (wrong results). */

/* Decode: a batch of sequences, one new query token each, walking paged KV. */
typedef struct lkv_decode_args {
    lkv_kv_shape shape;        /* Model KV shape; blocks in the arena use it. */
    const lkv_posenc *pe;      /* Borrowed; device copy is the launcher's business. */
    int layer;                 /* Layer whose slabs are read. */
    int batch;                 /* Sequences. */
    const void *q;             /* [batch][n_q_heads][head_dim], unrotated. Borrowed. */
    const int64_t *q_pos;      /* [batch] absolute position of each query token. Borrowed. */
    const void *arena;         /* Base of the page arena. Borrowed. */
    uint64_t page_bytes;       /* Stride between pages (>= lkv_block_bytes(&shape)). */
    const uint64_t *refs;      /* Block references of all sequences, concatenated. Borrowed. */
    const int32_t *ref_offset; /* [batch + 1]: sequence b uses refs[ref_offset[b] ..
                                  ref_offset[b+1]). Borrowed. */
    float sm_scale;            /* Softmax scale, usually 1/sqrt(head_dim). */
    unsigned flags;            /* LKV_ATTN_* flags. */
    void *out;                 /* [batch][n_q_heads][head_dim]. Borrowed, written. */
    float *lse;                /* Optional [batch][n_q_heads]: natural-log sum of exp of the
                                  scaled scores, for merging partial results (NULL: none). A
                                  sequence with no keys gets out = 0 and lse = -inf. */
} lkv_decode_args;

/* Prefill: n_new new tokens of one sequence at absolute positions new_start .. new_start +
 * n_new - 1, attending to cached documents (block references, every key before new_start)
 * and causally to themselves. The new tokens form a segment that starts at new_start: k_new is
 * rotated at local positions 0..n_new-1, exactly as the cache would store it. */
typedef struct lkv_prefill_args {
    lkv_kv_shape shape;
    const lkv_posenc *pe;
    int layer;
    int n_new;            /* New tokens (>= 1). */
    int64_t new_start;    /* Absolute position of the first new token. */
    const void *q;        /* [n_new][n_q_heads][head_dim], unrotated. Borrowed. */
    const void *k_new;    /* [n_new][n_kv_heads][head_dim], rotated at local positions. */
    const void *v_new;    /* [n_new][n_kv_heads][head_dim]. */
    const void *arena;    /* Page arena base. Borrowed. */
    uint64_t page_bytes;  /* Page stride. */
    const uint64_t *refs; /* Cached blocks attended by every new token. Borrowed. */
    int32_t n_refs;
    float sm_scale;
    unsigned flags;
    void *out; /* [n_new][n_q_heads][head_dim]. Borrowed, written. */
} lkv_prefill_args;

/* Materialise (the Block-Attention baseline): copy the K slabs of n_blocks source pages into
 * dst pages, re-rotated from document-local positions by delta (keys then sit at absolute
 * positions delta + j), and copy V slabs unchanged, for every layer. src and dst pages are
 * in the same arena layout. Every token slot is copied (zero slots stay zero); K is widened
 * to fp32, rotated with fp64 angles and rounded once back to shape.dtype. A src page may equal
 * its dst page (in place). For ALiBi and NONE there is nothing to rotate: it is a plain copy,
 * and materialised blocks must keep their document start in their references (the ALiBi bias
 * comes from it). Materialised RoPE blocks are attended with start 0 and their original block
 * index (key at position start + block * B + t = block * B + t, query rotated by p). */
typedef struct lkv_materialise_args {
    lkv_kv_shape shape;
    const lkv_posenc *pe;
    const void *src_arena;
    void *dst_arena;
    uint64_t page_bytes;
    const uint32_t *src_pages; /* [n_blocks] */
    const uint32_t *dst_pages; /* [n_blocks] */
    int32_t n_blocks;
    int64_t delta; /* Rotation offset in positions (0 .. LKV_MAX_POSITION). */
} lkv_materialise_args;

/* CPU reference implementations (fp32 math, fp64 angles). Return 0 or LKV_EINVAL on a bad
 * shape, bad reference (page out of arena is not checked here: callers own the arena) or a
 * position past LKV_MAX_POSITION. In detail, LKV_EINVAL (nothing written) for: a NULL args or
 * pe, pe built for another head_dim (or ALiBi slopes for fewer heads), layer out of range,
 * page_bytes < lkv_block_bytes, unknown flags, a non-finite sm_scale, a reference whose valid
 * count exceeds block_tokens, a decode query position outside 0..LKV_MAX_POSITION or before the
 * last key of one of its references, ref_offset negative or decreasing, a prefill whose last
 * new token is past LKV_MAX_POSITION or whose references are not all before new_start, and a
 * materialise delta outside 0..LKV_MAX_POSITION. batch 0 / n_blocks 0 do nothing. Only the
 * valid tokens of each block are read (unused slots may hold anything). lkv_posenc.h has the
 * angle and rotation helpers these use. */
int lkv_attn_decode_cpu(const lkv_decode_args *a);
int lkv_attn_prefill_cpu(const lkv_prefill_args *a);
int lkv_materialise_cpu(const lkv_materialise_args *a);

/* Sets how many threads lkv_attn_decode_cpu / lkv_attn_prefill_cpu may use per call (the caller
 * included): n >= 1, or 0 (the default) for all online CPUs, at most 64. Small calls use fewer.
 * Results are bitwise identical for every thread count. The calls are reentrant. */
void lkv_attn_cpu_set_threads(int n);

/* Merges two partial attention results over disjoint key sets (e.g. two halves of a split-KV
 * decode, each with its lse): out = (e^lse_a out_a + e^lse_b out_b) / (e^lse_a + e^lse_b) and
 * lse = log(e^lse_a + e^lse_b), per row. out_* are [n_rows][head_dim], lse_* [n_rows] (a row is
 * one (token, query head)); a side with lse = -inf contributes nothing, and two empty sides give
 * out = 0, lse = -inf. All pointers are borrowed; out may equal out_a or out_b and lse may equal
 * lse_a or lse_b (element-wise in place). */
void lkv_attn_merge_cpu(int n_rows, int head_dim, const float *out_a, const float *lse_a,
                        const float *out_b, const float *lse_b, float *out, float *lse);

#endif
