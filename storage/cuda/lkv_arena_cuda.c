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

#include "lkv_arena.h"
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

int lkv__cuda_host_alloc(size_t bytes, void **out)
{
    void *p = NULL;
    *out = NULL;
    CUDA_TRY(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
    *out = p;
    return 0;
}

void lkv__cuda_host_free(void *p)
{
    if (p != NULL) {
        cudaFreeHost(p);
    }
}

int lkv__cuda_stream_create(int device, void **out)
{
    cudaStream_t st = NULL;
    *out = NULL;
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    *out = st;
    return 0;
}

void lkv__cuda_stream_destroy(int device, void *stream)
{
    if (stream == NULL || cudaSetDevice(device) != cudaSuccess) {
        return;
    }
    cudaStreamSynchronize((cudaStream_t)stream);
    cudaStreamDestroy((cudaStream_t)stream);
}

void lkv__cuda_stream_sync(int device, void *stream)
{
    if (cudaSetDevice(device) != cudaSuccess) {
        return;
    }
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    if (e != cudaSuccess) {
        LKV_LOGE("cudaStreamSynchronize: %s", cudaGetErrorString(e));
    }
}

int lkv__cuda_d2h_async(int device, void *stream, void *dst, const void *src, size_t len)
{
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaMemcpyAsync(dst, src, len, cudaMemcpyDeviceToHost, (cudaStream_t)stream));
    return 0;
}

/* The stream callback: the stream's status becomes the done function's rc. */
static void CUDART_CB stream_cb(cudaStream_t stream, cudaError_t status, void *user)
{
    (void)stream;
    lkv_arena_done *d = user;
    if (status != cudaSuccess) {
        /* No CUDA call may be made here: cudaGetErrorString is a host table lookup. */
        LKV_LOGE("asynchronous arena copy failed: %s", cudaGetErrorString(status));
    }
    d->fn(d, status == cudaSuccess ? 0 : LKV_ECUDA);
}

int lkv__cuda_stream_then(int device, void *stream, void *done)
{
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaStreamAddCallback((cudaStream_t)stream, stream_cb, done, 0));
    return 0;
}
