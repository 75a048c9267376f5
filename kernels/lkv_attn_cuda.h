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
 * group's heads as N = 8; generic path for head_dim 8..256), prefill (mma.sync flash-attention
 * for head_dim 64/128; generic per-row path otherwise), materialise (memory-bound copy).
 * Requirements checked on the host: page_bytes a multiple of 16 and >= lkv_block_bytes.
 *
 * Launches are asynchronous on `stream` (a cudaStream_t, NULL = legacy default stream). A
 * return of 0 means the launch was accepted; LKV_EINVAL for bad arguments (checked on the host:
 * shapes, counts, flags; device data such as refs is not validated), LKV_ECUDA for a CUDA error
 * (logged with file:line). Kernel faults surface at the next synchronising CUDA call.
 *
 * Split-KV workspace. Decode and prefill split long key ranges over several CTAs and merge
 * the partial results by log-sum-exp in a second kernel. The partials need device scratch of
 * lkv_attn_*_cuda_workspace() bytes. Pass it (workspace, workspace_bytes) to keep every call
 * allocation-free and stream-safe (one workspace serves one stream at a time; decode and
 * prefill may share it). With workspace == NULL the launcher uses one process-wide
 * cached cudaMalloc buffer that grows on demand (a grow frees the old buffer, which
 * synchronises the device); that buffer is shared, so NULL is only for single-stream use
 * (tests, tools). Nothing else is allocated per call.
 */
#ifndef LKV_ATTN_CUDA_H
#define LKV_ATTN_CUDA_H

#include <stddef.h>

#include "lkv_attn.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* Prefill (see lkv_prefill_args). head_dim 64 and 128 use the tensor-core (mma.sync m16n8k16)
 * flash-attention kernel; other head dims use a generic CUDA-core kernel. workspace as for
 * decode. */
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
