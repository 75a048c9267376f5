/*
 * lkv_backend_cuda.h: the CUDA backend of the model runner (lkv_backend.h): cuBLAS for the
 * matrix products, the LazyAttention CUDA kernels (kernels/lkv_attn_cuda.h) for attention and
 * materialise, and small kernels of its own for embedding, RMSNorm, SwiGLU, the residual add,
 * rotating new keys (exact integer angles, fp64 as lkv_posenc.c) and writing K/V into pages.
 *
 * Memory: backend memory is device memory (cudaMalloc); activations are fp32; the KV arena is
 * device memory in the profile's dtype (bf16 or f16: the kernels' requirement). Weights:
 * map_weights copies the fp32 host tensors to the device once, as bf16 (LKV_CUDA_WEIGHTS_BF16,
 * matrix products bf16 x bf16 -> fp32 on tensor cores, activations rounded to bf16 at each
 * product's input) or fp32 (LKV_CUDA_WEIGHTS_F32, cublasSgemm without TF32: the CPU backend's
 * numbers up to summation order, for the GPU-versus-CPU check). The runner addresses weights by
 * pointer arithmetic from the mapped base, so map_weights returns the base of a reserved,
 * never-touched host address range of the fp32 size and each op translates a pointer in it to
 * its device copy.
 *
 * Attention: the runner's fp32 q / k_new / v_new are converted to the arena dtype in device
 * scratch and the kernels' output back to fp32; the host arrays of the args (references,
 * positions, offsets, pages) are copied to device scratch. All ops are queued on the backend's
 * one stream; to_host synchronises. Sampling: the CPU backend's sampler on the host logits the
 * runner already copied back (one code path, the same draws for a seed).
 *
 * Thread safety: one thread at a time (one stream, one scratch).
 */
#ifndef LKV_BACKEND_CUDA_H
#define LKV_BACKEND_CUDA_H

#include "lkv_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

enum lkv_cuda_weights {
    LKV_CUDA_WEIGHTS_BF16 = 0, /* Default. */
    LKV_CUDA_WEIGHTS_F32 = 1,
};

/* Creates a CUDA backend on the current device. Returns 0 and *out (free with
 * lkv_backend_cuda_destroy), LKV_ECUDA (no usable device: the message is logged) or
 * LKV_EINVAL. */
int lkv_backend_cuda_create(int weights, const lkv_backend **out);

/* Frees a backend from lkv_backend_cuda_create (its mapped weights must be released). NULL is
 * fine. */
void lkv_backend_cuda_destroy(const lkv_backend *be);

#ifdef __cplusplus
}
#endif

#endif
