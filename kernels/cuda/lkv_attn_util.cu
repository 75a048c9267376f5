/*
 * lkv_attn_util.cu: host helpers of the LazyAttention launchers: the cached split-KV workspace
 * (one process-wide grow-only cudaMalloc buffer behind a mutex, used only when the caller
 * passes no workspace), the multiprocessor count, and the log-sum-exp merge of split partials.
 */
#include <pthread.h>

#include "lkv_cuda_common.cuh"

extern "C" {
#include "lkv_attn_cuda.h"
}

static pthread_mutex_t ws_lock = PTHREAD_MUTEX_INITIALIZER;
static void *ws_ptr;
static size_t ws_bytes;

extern "C" void *lkv__cuda_ws_get(size_t bytes)
{
    void *p = NULL;
    pthread_mutex_lock(&ws_lock);
    if (bytes <= ws_bytes) {
        p = ws_ptr;
    } else {
        if (ws_ptr != NULL) {
            cudaFree(ws_ptr); /* Synchronises the device: in-flight users finish first. */
            ws_ptr = NULL;
            ws_bytes = 0;
        }
        size_t want = bytes + bytes / 4;
        cudaError_t ce = cudaMalloc(&ws_ptr, want);
        if (ce != cudaSuccess) {
            LKV_LOGE("cudaMalloc(%zu) for the attention workspace: %s", want,
                     cudaGetErrorString(ce));
            ws_ptr = NULL;
        } else {
            ws_bytes = want;
            p = ws_ptr;
        }
    }
    pthread_mutex_unlock(&ws_lock);
    return p;
}

extern "C" void lkv_attn_cuda_release(void)
{
    pthread_mutex_lock(&ws_lock);
    if (ws_ptr != NULL) {
        cudaFree(ws_ptr);
    }
    ws_ptr = NULL;
    ws_bytes = 0;
    pthread_mutex_unlock(&ws_lock);
}

extern "C" int lkv__cuda_sm_count(void)
{
    static int cached[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) {
        return 1;
    }
    if (dev < 64 && cached[dev] > 0) {
        return cached[dev];
    }
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
        n = 1;
    }
    if (dev < 64) {
        cached[dev] = n;
    }
    return n;
}

/* One CTA per row: the row's split lse values go to shared memory, warp 0 reduces them
 * (max and sum), then every thread accumulates its dims over the splits with independent,
 * unrolled loads. Dynamic shared memory: n_splits floats. */
template <typename T>
__global__ void merge_kernel(const float *__restrict__ part_o, const float *__restrict__ part_lse,
                             int n_splits, int d, T *__restrict__ out, float *__restrict__ lse)
{
    extern __shared__ float w[]; /* [n_splits] */
    __shared__ float stat[2];    /* max, 1 / sum */
    const int row = blockIdx.x;
    const float *pl = part_lse + (size_t)row * n_splits;
    for (int s = threadIdx.x; s < n_splits; s += blockDim.x) {
        w[s] = pl[s];
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        float m = -INFINITY;
        for (int s = threadIdx.x; s < n_splits; s += 32) {
            m = fmaxf(m, w[s]);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        }
        float sum = 0.0f;
        if (m != -INFINITY) {
            for (int s = threadIdx.x; s < n_splits; s += 32) {
                sum += exp2f(w[s] - m);
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            sum += __shfl_xor_sync(0xffffffffu, sum, off);
        }
        if (threadIdx.x == 0) {
            stat[0] = m;
            stat[1] = sum > 0.0f ? 1.0f / sum : 0.0f;
        }
    }
    __syncthreads();
    const float m = stat[0], inv = stat[1];
    for (int s = threadIdx.x; s < n_splits; s += blockDim.x) {
        w[s] = m == -INFINITY ? 0.0f : exp2f(w[s] - m) * inv;
    }
    __syncthreads();
    const float *po = part_o + (size_t)row * n_splits * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int s = 0;
        for (; s + 4 <= n_splits; s += 4) {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                acc[k] = fmaf(w[s + k], po[(size_t)(s + k) * d + i], acc[k]);
            }
        }
        for (; s < n_splits; s++) {
            acc[0] = fmaf(w[s], po[(size_t)s * d + i], acc[0]);
        }
        out[(size_t)row * d + i] = lkv__elem<T>::from_f((acc[0] + acc[1]) + (acc[2] + acc[3]));
    }
    if (lse != NULL && threadIdx.x == 0) {
        lse[row] = (m == -INFINITY || inv == 0.0f) ? -INFINITY : (m - log2f(inv)) * LKV__LN2;
    }
}

int lkv__merge_launch(int dtype, const float *part_o, const float *part_lse, int rows, int n_splits,
                      int d, void *out, float *lse, cudaStream_t stream)
{
    if (rows <= 0) {
        return 0;
    }
    int threads = d >= 128 ? 128 : (d >= 64 ? 64 : 32);
    size_t smem = (size_t)n_splits * sizeof(float);
    if (dtype == LKV_DTYPE_BF16) {
        merge_kernel<__nv_bfloat16><<<rows, threads, smem, stream>>>(part_o, part_lse, n_splits, d,
                                                                     (__nv_bfloat16 *)out, lse);
    } else {
        merge_kernel<__half>
            <<<rows, threads, smem, stream>>>(part_o, part_lse, n_splits, d, (__half *)out, lse);
    }
    LKV__CUDA_CHECK_LAUNCH();
    return 0;
}
