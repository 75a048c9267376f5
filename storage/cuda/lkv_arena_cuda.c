/*
 * lkv_arena_cuda.c: CUDA runtime calls of the hot arena (see lkv_arena_cuda.h).
 *
 * Plain C against the CUDA runtime API (cuda_runtime_api.h), linked with CUDA::cudart; no
 * kernels. Every call goes through CUDA_TRY, which logs the expression, function and line with
 * the CUDA error string and returns LKV_ECUDA. Out-parameters of failed calls are not trusted.
 */
#include "lkv_arena_cuda.h"

#include <cuda_runtime_api.h>
#include <string.h>

#include "lkv_log.h"

#define CUDA_TRY(expr)                                                                             \
    do {                                                                                           \
        cudaError_t lkv__e = (expr);                                                               \
        if (lkv__e != cudaSuccess) {                                                               \
            LKV_LOGE("%s failed in %s: %s", #expr, __func__, cudaGetErrorString(lkv__e));          \
            return LKV_ECUDA;                                                                      \
        }                                                                                          \
    } while (0)

int lkv__cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* Clear the sticky-free error of "no driver / no device". */
        return 0;
    }
    return n;
}

int lkv__cuda_alloc(int device, uint64_t bytes, void **out, uint8_t ipc[64])
{
    void *p = NULL;
    cudaIpcMemHandle_t h;

    *out = NULL;
    memset(ipc, 0, 64);
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaMalloc(&p, (size_t)bytes));
    if (cudaMemset(p, 0, (size_t)bytes) != cudaSuccess) {
        LKV_LOGE("cudaMemset of the arena failed: %s", cudaGetErrorString(cudaGetLastError()));
        cudaFree(p);
        return LKV_ECUDA;
    }
    if (cudaIpcGetMemHandle(&h, p) == cudaSuccess) {
        _Static_assert(sizeof h <= 64, "cudaIpcMemHandle_t is 64 bytes");
        memcpy(ipc, &h, sizeof h);
    } else {
        LKV_LOGW("cudaIpcGetMemHandle failed: %s (zero-copy attach unavailable)",
                 cudaGetErrorString(cudaGetLastError()));
    }
    *out = p;
    return 0;
}

void lkv__cuda_free(int device, void *p)
{
    if (p == NULL) {
        return;
    }
    if (cudaSetDevice(device) == cudaSuccess) {
        cudaFree(p);
    }
}

int lkv__cuda_h2d(int device, void *dst, const void *src, size_t len)
{
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaMemcpy(dst, src, len, cudaMemcpyHostToDevice));
    return 0;
}

int lkv__cuda_d2h(int device, void *dst, const void *src, size_t len)
{
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaMemcpy(dst, src, len, cudaMemcpyDeviceToHost));
    return 0;
}
