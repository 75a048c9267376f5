/*
 * lkv_backend.h: the compute seam of the decode worker's model runner (lkv_runner.h). The runner
 * has ONE code path (a Llama-architecture forward pass over paged, position-free KV); every
 * numeric operation it does goes through this table of function pointers, so that the CPU
 * backend (lkv_backend_cpu.h: fp32 loops and the LazyAttention CPU reference) and a CUDA backend
 * (part 3: cuBLAS and the kernels of kernels/cuda/) run the same runner.
 *
 * Memory model. "Backend memory" is memory the backend's ops can read and write: host memory
 * for the CPU backend, device memory for a CUDA one. Activations are allocated with alloc; the
 * weights are made backend-resident once with map_weights; the KV arena (kernels/lkv_layout.h
 * pages) is backend memory that the caller provides (a daemon's mapped arena plus the worker's
 * own pages). Token ids, block references, positions and sampling parameters are always host
 * memory (a CUDA backend copies them). Results come back to the host with to_host.
 *
 * Shapes are row-major, innermost last. Every op is synchronous from the caller's point of view
 * (a CUDA backend may queue on one stream and synchronise in to_host and sample).
 *
 * Ownership: a backend table and its ctx are owned by whoever made them (static for the CPU
 * backend); the runner borrows them for its lifetime.
 */
#ifndef LKV_BACKEND_H
#define LKV_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "lkv_attn.h"
#include "lkv_layout.h"

/* Sampling parameters of one generation. temperature <= 0 is greedy (argmax, the first index on
 * ties, the rng is not touched). Otherwise softmax(logits / temperature) restricted to the
 * smallest set of most likely tokens whose mass reaches top_p (top_p outside (0, 1): 1), drawn
 * with the caller's rng state (lkv_sampling_seed). */
typedef struct lkv_sampling {
    float temperature; /* 0: greedy. */
    float top_p;       /* Nucleus mass, (0, 1]; 0 or >= 1 means no nucleus cut. */
    uint64_t seed;     /* Seed of the generation's rng (lkv_sampling_seed). */
} lkv_sampling;

struct lkv_devmap; /* lkv_pagespace.h */

/* The operation table. Every pointer is set by a backend constructor (devmap may be NULL). */
typedef struct lkv_backend {
    const char *name; /* "cpu", "cuda". */
    void *ctx;        /* Passed to every op; owned by the backend's maker. */

    /* Backend memory: alloc returns bytes of zeroed memory (never NULL: running out of memory
     * is fatal by policy), release frees it (NULL is fine). */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*release)(void *ctx, void *p);
    /* Makes bytes of host weights (borrowed, must outlive the runner) readable by the ops and
     * returns the backend pointer; release_weights undoes it. The CPU backend returns host. */
    const void *(*map_weights)(void *ctx, const void *host, size_t bytes);
    void (*release_weights)(void *ctx, const void *mapped);
    /* Copies bytes from backend memory src to host memory dst. */
    void (*to_host)(void *ctx, void *dst, const void *src, size_t bytes);
    /* Sets bytes of backend memory p to zero. */
    void (*fill_zero)(void *ctx, void *p, size_t bytes);

    /* x[i][0..dim) = table[tokens[i]][0..dim) for i < n (tokens: host, already checked). */
    void (*embed)(void *ctx, float *x, const float *table, const int *tokens, int n, int dim);
    /* out[i] = w * x[i] / sqrt(mean(x[i]^2) + 1e-5), rows of dim, for i < n; out may be x. */
    void (*rmsnorm)(void *ctx, float *out, const float *x, const float *w, int n, int dim);
    /* out[i][r] = sum_c w[r][c] x[i][c]: n rows of x[cols] times w[rows][cols] transposed. out
     * must not alias x. */
    void (*matmul)(void *ctx, float *out, const float *x, const float *w, int n, int rows,
                   int cols);
    /* x[j] += y[j] for j < n (the residual). */
    void (*add)(void *ctx, float *x, const float *y, size_t n);
    /* h1[j] = silu(h1[j]) * h3[j] for j < n (SwiGLU). */
    void (*swiglu)(void *ctx, float *h1, const float *h3, size_t n);
    /* Rotates n_tok token rows of n_heads head vectors (pe->head_dim each): row i by the integer
     * offset pos0 + i (RoPE of new keys; exact integer angles, lkv_posenc.h). out may be x. */
    void (*rope)(void *ctx, const lkv_posenc *pe, const float *x, float *out, int n_tok,
                 int n_heads, int64_t pos0);
    /* Writes K (rotated) and V rows [n][n_kv_heads][head_dim] of layer into the block slots of
     * segment-local tokens local0 .. local0 + n - 1, whose block b lives at arena page pages[b]
     * (host array), converting to shape->dtype. */
    void (*kv_write)(void *ctx, const lkv_kv_shape *shape, void *arena, uint64_t page_bytes,
                     const uint32_t *pages, int layer, int local0, int n, const float *k,
                     const float *v);
    /* LazyAttention (kernels/lkv_attn.h): q, k_new, v_new, out in backend memory as fp32. Return
     * 0 or the kernels' LKV_EINVAL. */
    int (*attn_prefill)(void *ctx, const lkv_prefill_args *a);
    int (*attn_decode)(void *ctx, const lkv_decode_args *a);
    /* The Block-Attention baseline: a re-rotated copy of cached blocks (lkv_attn.h). */
    int (*materialise)(void *ctx, const lkv_materialise_args *a);
    /* Picks the next token from logits[0..vocab) (host memory) as s says, advancing *rng.
     * Writes *token; returns 0 or LKV_EINVAL (vocab < 1, a NaN logit). */
    int (*sample)(void *ctx, const float *logits, int vocab, const lkv_sampling *s, uint64_t *rng,
                  int *token);
    /* How a backend whose memory is not host memory maps the daemon's arena and places its
     * worker pages (lkv_pagespace.h, "Device arenas"), or NULL (host memory: the page space
     * maps shm arenas itself). Borrowed; lives as long as the backend. */
    const struct lkv_devmap *devmap;
} lkv_backend;

/* The initial rng state of a generation with seed (splitmix64 of the seed; never 0). Host
 * code, shared by every backend so that a seed means the same draws everywhere. */
static inline uint64_t lkv_sampling_seed(uint64_t seed)
{
    uint64_t z = seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return z != 0 ? z : 0x9e3779b97f4a7c15ull;
}

/* Next uniform double in [0, 1) from *rng (xorshift64*), advancing it. */
static inline double lkv_sampling_uniform(uint64_t *rng)
{
    uint64_t x = *rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *rng = x;
    return (double)((x * 0x2545f4914f6cdd1dull) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
