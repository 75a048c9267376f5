/*
 * lkv_cuda_common.cuh: everything the LazyAttention CUDA kernels share, by concern:
 *   lkv_cuda_check.cuh      the CUDA error check (LKV__CUDA_CHECK, LKV__CUDA_CHECK_LAUNCH);
 *   lkv_cuda_posenc.cuh     device position encoding: tables, exact-angle sincos, pairing;
 *   lkv_cuda_ptx.cuh        PTX wrappers: cp.async, ldmatrix, movmatrix, mma, ex2, PDL;
 *   lkv_cuda_dtype.cuh      bf16 / fp16 element traits;
 *   lkv_cuda_workspace.cuh  host internals: cached workspace, SM count, the merge kernel.
 * Kernel files include this umbrella (or only the parts they need).
 */
#ifndef LKV_CUDA_COMMON_CUH
#define LKV_CUDA_COMMON_CUH

#include "lkv_cuda_check.cuh"
#include "lkv_cuda_dtype.cuh"
#include "lkv_cuda_posenc.cuh"
#include "lkv_cuda_ptx.cuh"
#include "lkv_cuda_workspace.cuh"

#endif
