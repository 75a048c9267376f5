/*
 * lkv_attn_cuda.h: C-callable launchers of the LazyAttention CUDA kernels (kernels/cuda/).
 *
 * The args structs of lkv_attn.h are the contract; here every pointer in them is a DEVICE
 * pointer (q, q_pos, arena, refs, ref_offset, out, lse, k_new, v_new, src/dst pages), except
 * args->pe, which is a HOST pointer to the lkv_posenc tables: the launchers copy what the
 * kernels need into the kernel parameters (by value), so pe may be freed after the call
 * returns. Every tensor is in shape.dtype, which must be LKV_DTYPE_BF16 or LKV_DTYPE_F16
 * (LKV_ENOTSUP for f32). Math is fp32; angles come from exact integer offsets (hi/lo turns,
 * sincospif); the query is rotated in fp32 with the softmax scale folded in, then rounded once
 * to 16 bits where it feeds tensor cores (head_dim 64 and 128) or kept in fp32 (the generic
 * CUDA-core paths for other head dims). Keys and values are read as stored.
 *
 * Kernels: decode (tensor-core path for head_dim 64/128: keys as the M dimension, the GQA
 * group's heads as N = 8; generic path for head_dim 8..256), prefill (head_dim 64/128: on Hopper
 * with blocks of a multiple of 8 tokens a warp-specialised wgmma + TMA kernel built for sm_90a,
 * elsewhere mma.sync flash-attention; generic per-row path otherwise), materialise
 * (memory-bound copy).
 * Requirements checked on the host: page_bytes a multiple of 16 and >= lkv_block_bytes.
 *
 * Launches are asynchronous on `stream` (a cudaStream_t, NULL = legacy default stream). A
 * return of 0 means the launch was accepted; LKV_EINVAL for bad arguments (checked on the host:
 * shapes, counts, flags; device data such as refs is not validated), LKV_ECUDA for a CUDA error
 * (logged with file:line). Kernel faults surface at the next synchronising CUDA call.
 *
 * Split-KV workspace. Decode and prefill split long key ranges over several CTAs and merge the
 * partial results by log-sum-exp: decode inside the same launch (the last CTA of a sequence
 * merges; the decode plan owns or borrows its workspace, see below), prefill in a second
 * kernel (or, with LKV_ATTN_WG_FOLD=1 on Hopper, in the same launch on merge counters that the
 * prefill workspace also holds and that the launcher zeroes with a cudaMemsetAsync). The one-shot
 * launchers need device scratch of lkv_attn_*_cuda_workspace() bytes: pass it (workspace,
 * workspace_bytes) to keep the call allocation-free and stream-safe (one workspace serves one
 * stream at a time; decode and prefill may share it). With workspace == NULL they use one
 * process-wide cached cudaMalloc buffer that grows on demand (a grow frees the old buffer, which
 * synchronises the device); that buffer is shared, so NULL is only for single-stream use (tests,
 * tools). The one-shot decode also plans on every call and zeroes the merge counters with a
 * cudaMemsetAsync: model runners use a decode plan instead.
 */
#ifndef LKV_ATTN_CUDA_H
#define LKV_ATTN_CUDA_H

#include <stddef.h>

#include "lkv_attn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- decode: plan once, run per layer
 *
 * A decode plan is built once per batch composition (shape, batch size, an upper bound of the
 * block references of one sequence, position encoding, scale): it fixes the grid and the
 * split-KV factor for the machine (multiprocessor count and occupancy read at creation), copies
 * the position-encoding tables, sets the kernels' attributes, and owns (or borrows) the device
 * workspace: the split partials and one arrival counter per (sequence, kv head chunk). With
 * several splits, the last CTA of a (sequence, kv head chunk) to finish merges the partials in
 * the same launch (no second kernel) and resets its counter, so the workspace is ready for the
 * next launch without any host work.
 *
 * lkv_decode_plan_run then launches one layer: no allocation, no environment lookup, no
 * locking, no host synchronisation, no CUDA call but the launch and cudaGetLastError, so it can be
 * captured in a CUDA graph (stream capture) and replayed. The per-step data (q_pos, refs,
 * ref_offset, q) are device buffers the caller rewrites between replays; a captured graph keeps
 * the pointers given at capture time. Constraint per run: every sequence has at most the
 * planned max_refs_per_seq references (a longer one is still attended in full, by its last
 * split, only slower). One plan (its workspace) serves one stream at a time: runs on one stream
 * are ordered, runs of one plan on two streams at once race on the workspace. */

typedef struct lkv_decode_plan lkv_decode_plan; /* Opaque; lkv_decode_plan_create/destroy. */

typedef struct lkv_decode_plan_cfg {
    lkv_kv_shape shape;   /* Model KV shape (dtype bf16 or f16). */
    const lkv_posenc *pe; /* HOST tables, copied into the plan (borrowed during create only). */
    int batch;            /* Sequences per run (1 .. 65535). */
    int max_refs_per_seq; /* Upper bound of ref_offset[b+1] - ref_offset[b] over every run. */
    float sm_scale;       /* Softmax scale. */
    unsigned flags;       /* LKV_ATTN_* flags. */
    int splits;           /* 0: the planner's split factor; n > 0 forces n (tests, benchmarks). */
    int pdl;              /* 1: launch with programmatic dependent launch (sm_90): a run's
                             prologue (loads of q_pos, ref_offset and the first references)
                             overlaps the previous kernel of the stream, so those three must be
                             written before that kernel starts (by the host, or two kernels
                             back); everything else waits for it. 0: plain launches. */
    void *workspace;      /* Optional DEVICE scratch of at least lkv_decode_plan_workspace_bytes
                             bytes (borrowed until destroy); NULL: the plan allocates its own. */
    size_t workspace_bytes;
} lkv_decode_plan_cfg;

/* Per-layer (per-run) arguments; every pointer is a DEVICE pointer, borrowed until the launch
 * finishes on the stream (in a graph: as long as the graph is replayed). */
typedef struct lkv_decode_run_args {
    int layer;                 /* Layer whose slabs are read. */
    const void *q;             /* [batch][n_q_heads][head_dim] in shape.dtype, unrotated. */
    const int64_t *q_pos;      /* [batch] absolute position of each query token. */
    const void *arena;         /* Page arena base. */
    uint64_t page_bytes;       /* Page stride (a multiple of 16, >= lkv_block_bytes). */
    const uint64_t *refs;      /* Block references of all sequences, concatenated. */
    const int32_t *ref_offset; /* [batch + 1]. */
    void *out;                 /* [batch][n_q_heads][head_dim] in shape.dtype, written. */
    float *lse;                /* Optional [batch][n_q_heads] natural-log lse, or NULL. */
} lkv_decode_run_args;

/* Workspace bytes a plan of cfg needs (cfg->workspace ignored); 0 when no split is needed.
 * Returns 0 as well for an invalid cfg (lkv_decode_plan_create reports it). Reads the current
 * device's multiprocessor count (the split factor depends on it). */
size_t lkv_decode_plan_workspace_bytes(const lkv_decode_plan_cfg *cfg);

/* Builds a plan into *out (owned by the caller, freed with lkv_decode_plan_destroy). Allocates
 * the workspace when cfg->workspace is NULL and zeroes the counters (synchronously on the
 * legacy default stream). Returns 0, LKV_EINVAL (bad shape, batch, flags, scale, pe, a
 * workspace that is too small), LKV_ENOTSUP (dtype f32), LKV_ENOMEM (host), LKV_ECUDA. */
int lkv_decode_plan_create(const lkv_decode_plan_cfg *cfg, lkv_decode_plan **out);

/* Frees the plan and the workspace it allocated (not a borrowed one). Synchronises nothing:
 * call it when no launch of the plan is pending. NULL is a no-op. */
void lkv_decode_plan_destroy(lkv_decode_plan *plan);

/* The plan's split factor (1 = no split, no merge) and grid size in CTAs, for logs and tests. */
int lkv_decode_plan_splits(const lkv_decode_plan *plan);
int lkv_decode_plan_ctas(const lkv_decode_plan *plan);

/* Launches one layer of decode on stream (a cudaStream_t; NULL = legacy default stream).
 * refs and arena may be NULL only when no sequence has a reference. Returns 0 (launch
 * accepted), LKV_EINVAL (NULL plan/args, q, q_pos, ref_offset or out NULL, q, out or arena not
 * 16-byte aligned, layer out of range, page_bytes not a multiple of 16 or < lkv_block_bytes),
 * LKV_ECUDA (launch error). */
int lkv_decode_plan_run(const lkv_decode_plan *plan, const lkv_decode_run_args *a, void *stream);

/* ---------------------------------------------------------------- one-shot launchers
 *
 * The one-shot decode launcher below plans on every call (tests, tools): it is
 * lkv_decode_plan_create + run on the stack, with the counters zeroed by a cudaMemsetAsync on
 * the stream, the workspace the caller's or the cached internal one. */

/* Bytes of split-KV workspace that lkv_attn_decode_cuda needs for this shape, batch and the
 * largest number of block references of one sequence (0 when no split is needed). */
size_t lkv_attn_decode_cuda_workspace(const lkv_kv_shape *shape, int batch, int max_refs_per_seq);

/* Decode (see lkv_decode_args). max_refs_per_seq: an upper bound of ref_offset[b+1] -
 * ref_offset[b] over the batch, known to the caller that built the references on the host;
 * it picks the split-KV factor. workspace: device scratch of workspace_bytes bytes (borrowed,
 * used until the kernels finish on stream), or NULL for the cached internal buffer. */
int lkv_attn_decode_cuda(const lkv_decode_args *a, int max_refs_per_seq, void *workspace,
                         size_t workspace_bytes, void *stream);

/* Bytes of split-KV workspace that lkv_attn_prefill_cuda needs for these arguments (only the
 * shape, n_new and n_refs matter). */
size_t lkv_attn_prefill_cuda_workspace(const lkv_prefill_args *a);

/* Prefill (see lkv_prefill_args). head_dim 64 and 128 use a tensor-core flash-attention kernel:
 * the Hopper one (wgmma + TMA, kernels/cuda/lkv_prefill_wgmma.cu) when the device is compute
 * capability 9.0, block_tokens is a multiple of 8 and q, k_new, v_new, out and arena are 16-byte
 * aligned, else the mma.sync m16n8k16 one; other head dims use a generic CUDA-core kernel.
 * workspace as for decode (its size, lkv_attn_prefill_cuda_workspace, follows the same choice). */
int lkv_attn_prefill_cuda(const lkv_prefill_args *a, void *workspace, size_t workspace_bytes,
                          void *stream);

/* Materialise (see lkv_materialise_args): src_pages and dst_pages are device arrays of
 * n_blocks page indices. A src page may equal its dst page (in place); distinct pages must
 * not overlap. */
int lkv_materialise_cuda(const lkv_materialise_args *a, void *stream);

/* Frees the cached internal workspace (call at shutdown; not concurrently with launches). */
void lkv_attn_cuda_release(void);

#ifdef __cplusplus
}
#endif

#endif
