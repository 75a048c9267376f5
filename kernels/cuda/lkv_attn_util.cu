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
        if (LKV__CUDA_RC(cudaMalloc(&ws_ptr, want)) != 0) {
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

/* One CTA of MERGE_THREADS per row. The row's split lse values go to shared memory and warp 0
 * reduces them (max and sum) into per-split weights. Then the threads form groups of d / 4
 * (one float4 of dims each): group gi accumulates splits gi, gi + ng, ..., with up to four
 * independent 16-byte loads in flight, so a row costs about one L2 round trip instead of one
 * per few splits (merge v1 looped over the splits per dim). The groups' sums are added in
 * shared memory. Dynamic shared memory: n_splits + ng * d floats. */
#define MERGE_THREADS 256
template <typename T>
__global__ void __launch_bounds__(MERGE_THREADS)
    merge_kernel(const float *__restrict__ part_o, const float *__restrict__ part_lse, int n_splits,
                 int d, T *__restrict__ out, float *__restrict__ lse)
{
    extern __shared__ __align__(16) float w[]; /* [n_splits] weights, then [ng][d] sums */
    __shared__ float stat[2];                  /* max, 1 / sum */
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
    const int q4 = d / 4;                /* float4 per partial row (d % 8 == 0) */
    const int ng = (int)blockDim.x / q4; /* groups of splits (>= 1) */
    const int gi = (int)threadIdx.x / q4, c = (int)threadIdx.x - gi * q4;
    float *red = w + ((n_splits + 3) & ~3); /* [ng][d], 16-byte aligned */
    if (gi < ng) {
        const float4 *po = (const float4 *)(part_o + (size_t)row * n_splits * d) + c;
        float4 a0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), a1 = a0;
        int s = gi;
        for (; s + 3 * ng < n_splits; s += 4 * ng) {
            const float4 v0 = po[(size_t)s * q4];
            const float4 v1 = po[(size_t)(s + ng) * q4];
            const float4 v2 = po[(size_t)(s + 2 * ng) * q4];
            const float4 v3 = po[(size_t)(s + 3 * ng) * q4];
            const float w0 = w[s], w1 = w[s + ng], w2 = w[s + 2 * ng], w3 = w[s + 3 * ng];
            a0.x = fmaf(w0, v0.x, fmaf(w2, v2.x, a0.x));
            a0.y = fmaf(w0, v0.y, fmaf(w2, v2.y, a0.y));
            a0.z = fmaf(w0, v0.z, fmaf(w2, v2.z, a0.z));
            a0.w = fmaf(w0, v0.w, fmaf(w2, v2.w, a0.w));
            a1.x = fmaf(w1, v1.x, fmaf(w3, v3.x, a1.x));
            a1.y = fmaf(w1, v1.y, fmaf(w3, v3.y, a1.y));
            a1.z = fmaf(w1, v1.z, fmaf(w3, v3.z, a1.z));
            a1.w = fmaf(w1, v1.w, fmaf(w3, v3.w, a1.w));
        }
        for (; s < n_splits; s += ng) {
            const float4 v = po[(size_t)s * q4];
            const float ws = w[s];
            a0.x = fmaf(ws, v.x, a0.x);
            a0.y = fmaf(ws, v.y, a0.y);
            a0.z = fmaf(ws, v.z, a0.z);
            a0.w = fmaf(ws, v.w, a0.w);
        }
        *(float4 *)(red + gi * d + 4 * c) =
            make_float4(a0.x + a1.x, a0.y + a1.y, a0.z + a1.z, a0.w + a1.w);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = 0.0f;
        for (int g = 0; g < ng; g++) {
            v += red[g * d + i];
        }
        out[(size_t)row * d + i] = lkv__elem<T>::from_f(v);
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
    if (d % 8 != 0 || d > 4 * MERGE_THREADS) {
        return LKV_EINVAL;
    }
    /* Enough groups for the splits, at most MERGE_THREADS threads (few splits: fewer idle
     * threads and a shorter reduction). */
    int threads = n_splits * (d / 4) < MERGE_THREADS ? n_splits * (d / 4) : MERGE_THREADS;
    threads = (threads + 31) / 32 * 32;
    const int ng = threads / (d / 4);
    const size_t smem = ((size_t)((n_splits + 3) & ~3) + (size_t)ng * d) * sizeof(float);
    if (smem > 48 * 1024) {
        return LKV_EINVAL; /* Over 11k splits: the planners never get near this. */
    }
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
