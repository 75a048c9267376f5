/*
 * lkv_backend_cuda.cu: the CUDA backend (see lkv_backend_cuda.h).
 *
 * Kernels are one thread per element (or one block per row for RMSNorm); they are not where
 * the time goes (the matrix products and attention are). Weight pointers are translated from
 * the reserved host range (fake base) to the device copy by offset.
 */
#include "lkv_backend_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "lkv_attn_cuda.h"
#include "lkv_devmap_cuda.h"
#include "lkv_half.h"
extern "C" {
#include "lkv_err.h"
#include "lkv_log.h"
}

extern "C" const lkv_backend *lkv_backend_cpu(void);

#define MAX_MAPS 8

struct wmap {
    const float *fake; /* Reserved host range, n floats. */
    void *dev;         /* Device copy (bf16 or fp32). */
    size_t n;
};

struct cuda_ctx {
    int weights;
    cudaStream_t stream;
    cublasHandle_t blas;
    wmap maps[MAX_MAPS];
    int n_maps;
    void *scratch; /* Device scratch (conversions, host arrays). */
    size_t scratch_cap;
    lkv_backend table;
};

#define CK(expr)                                                                                   \
    do {                                                                                           \
        cudaError_t e__ = (expr);                                                                  \
        if (e__ != cudaSuccess) {                                                                  \
            lkv_panic("%s: %s", #expr, cudaGetErrorString(e__));                                   \
        }                                                                                          \
    } while (0)

static cuda_ctx *C(void *ctx)
{
    return (cuda_ctx *)ctx;
}

/* Device scratch of at least bytes (grows; a grow synchronises the stream). */
static uint8_t *scratch(cuda_ctx *c, size_t bytes)
{
    if (bytes > c->scratch_cap) {
        CK(cudaStreamSynchronize(c->stream));
        CK(cudaFree(c->scratch));
        size_t cap = bytes * 2 > (1u << 20) ? bytes * 2 : (1u << 20);
        CK(cudaMalloc(&c->scratch, cap));
        c->scratch_cap = cap;
    }
    return (uint8_t *)c->scratch;
}

static size_t align16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Copies host arrays to consecutive device scratch; returns their device addresses. */
static void upload(cuda_ctx *c, int n, const void *const *src, const size_t *bytes, void **dst,
                   size_t extra, void **extra_dst)
{
    size_t total = extra;
    for (int i = 0; i < n; i++) {
        total += align16(bytes[i]);
    }
    uint8_t *s = scratch(c, total + 16);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        dst[i] = s + off;
        if (bytes[i] > 0) {
            CK(cudaMemcpyAsync(dst[i], src[i], bytes[i], cudaMemcpyHostToDevice, c->stream));
        }
        off += align16(bytes[i]);
    }
    if (extra_dst != NULL) {
        *extra_dst = s + off;
    }
    /* Host arrays may be freed after the call: the copies above are pageable (staged). */
}

/* The device copy of a weight pointer (and its element size), or NULL if not a weight. */
static const void *wdev(cuda_ctx *c, const float *p, int *is_bf16)
{
    for (int i = 0; i < c->n_maps; i++) {
        const wmap *m = &c->maps[i];
        if (p >= m->fake && p < m->fake + m->n) {
            size_t off = (size_t)(p - m->fake);
            *is_bf16 = c->weights == LKV_CUDA_WEIGHTS_BF16;
            return *is_bf16 ? (const void *)((const uint16_t *)m->dev + off)
                            : (const void *)((const float *)m->dev + off);
        }
    }
    lkv_panic("cuda backend: %p is not a mapped weight", (const void *)p);
}

static void *be_alloc(void *ctx, size_t bytes)
{
    cuda_ctx *c = C(ctx);
    void *p;
    CK(cudaMalloc(&p, bytes ? bytes : 1));
    CK(cudaMemsetAsync(p, 0, bytes ? bytes : 1, c->stream));
    return p;
}

static void be_release(void *ctx, void *p)
{
    if (p != NULL) {
        CK(cudaStreamSynchronize(C(ctx)->stream));
        CK(cudaFree(p));
    }
}

__global__ void k_f32_to_bf16(uint16_t *out, const float *in, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = lkv_f32_to_bf16(in[i]);
    }
}

__global__ void k_f32_to_dtype(void *out, const float *in, size_t n, int dtype)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) {
        lkv_store_elem(out, dtype, i, in[i]);
    }
}

__global__ void k_dtype_to_f32(float *out, const void *in, size_t n, int dtype)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = lkv_load_elem(in, dtype, i);
    }
}

static unsigned grid(size_t n)
{
    return (unsigned)((n + 255) / 256);
}

static const void *be_map_weights(void *ctx, const void *host, size_t bytes)
{
    cuda_ctx *c = C(ctx);
    if (c->n_maps == MAX_MAPS) {
        lkv_panic("cuda backend: more than %d weight maps", MAX_MAPS);
    }
    size_t n = bytes / sizeof(float);
    void *fake = mmap(NULL, bytes ? bytes : 4096, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (fake == MAP_FAILED) {
        lkv_panic("cuda backend: cannot reserve %zu bytes of address space", bytes);
    }
    wmap *m = &c->maps[c->n_maps++];
    m->fake = (const float *)fake;
    m->n = n;
    if (c->weights == LKV_CUDA_WEIGHTS_F32) {
        CK(cudaMalloc(&m->dev, bytes ? bytes : 4));
        CK(cudaMemcpy(m->dev, host, bytes, cudaMemcpyHostToDevice));
    } else {
        CK(cudaMalloc(&m->dev, n * 2 + 2));
        const size_t chunk = (size_t)64 << 20; /* floats per staging copy */
        float *stage;
        CK(cudaMalloc(&stage, (n < chunk ? n : chunk) * sizeof(float) + 4));
        for (size_t o = 0; o < n; o += chunk) {
            size_t k = n - o < chunk ? n - o : chunk;
            CK(cudaMemcpy(stage, (const float *)host + o, k * sizeof(float),
                          cudaMemcpyHostToDevice));
            k_f32_to_bf16<<<grid(k), 256, 0, c->stream>>>((uint16_t *)m->dev + o, stage, k);
            CK(cudaGetLastError());
            CK(cudaStreamSynchronize(c->stream));
        }
        CK(cudaFree(stage));
    }
    return fake;
}

static void be_release_weights(void *ctx, const void *mapped)
{
    cuda_ctx *c = C(ctx);
    for (int i = 0; i < c->n_maps; i++) {
        if (c->maps[i].fake == mapped) {
            CK(cudaStreamSynchronize(c->stream));
            CK(cudaFree(c->maps[i].dev));
            munmap((void *)c->maps[i].fake, c->maps[i].n > 0 ? c->maps[i].n * sizeof(float) : 4096);
            c->maps[i] = c->maps[--c->n_maps];
            return;
        }
    }
}

static void be_to_host(void *ctx, void *dst, const void *src, size_t bytes)
{
    cuda_ctx *c = C(ctx);
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CK(cudaStreamSynchronize(c->stream));
}

static void be_fill_zero(void *ctx, void *p, size_t bytes)
{
    CK(cudaMemsetAsync(p, 0, bytes, C(ctx)->stream));
}

__global__ void k_embed(float *x, const void *table, int bf16, const int *tokens, int n, int dim)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < (size_t)n * dim) {
        size_t r = i / dim, d = i % dim, src = (size_t)tokens[r] * dim + d;
        x[i] = bf16 ? lkv_bf16_to_f32(((const uint16_t *)table)[src]) : ((const float *)table)[src];
    }
}

static void be_embed(void *ctx, float *x, const float *table, const int *tokens, int n, int dim)
{
    cuda_ctx *c = C(ctx);
    int bf;
    const void *t = wdev(c, table, &bf);
    const void *src[1] = {tokens};
    size_t bytes[1] = {(size_t)n * sizeof(int)};
    void *dst[1];
    upload(c, 1, src, bytes, dst, 0, NULL);
    k_embed<<<grid((size_t)n * dim), 256, 0, c->stream>>>(x, t, bf, (const int *)dst[0], n, dim);
    CK(cudaGetLastError());
}

/* One block of 256 threads per row: the sum of squares in fp32 (a tree, not left to right). */
__global__ void k_rmsnorm(float *out, const float *x, const void *w, int bf16, int dim)
{
    __shared__ float part[256];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float s = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        s += xr[i] * xr[i];
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) {
            part[threadIdx.x] += part[threadIdx.x + k];
        }
        __syncthreads();
    }
    float inv = 1.0f / sqrtf(part[0] / (float)dim + 1e-5f);
    float *o = out + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float wi = bf16 ? lkv_bf16_to_f32(((const uint16_t *)w)[i]) : ((const float *)w)[i];
        o[i] = wi * (inv * xr[i]);
    }
}

static void be_rmsnorm(void *ctx, float *out, const float *x, const float *w, int n, int dim)
{
    cuda_ctx *c = C(ctx);
    int bf;
    const void *wd = wdev(c, w, &bf);
    k_rmsnorm<<<n, 256, 0, c->stream>>>(out, x, wd, bf, dim);
    CK(cudaGetLastError());
}

static void be_matmul(void *ctx, float *out, const float *x, const float *w, int n, int rows,
                      int cols)
{
    cuda_ctx *c = C(ctx);
    int bf;
    const void *wd = wdev(c, w, &bf);
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st;
    if (bf) {
        size_t nx = (size_t)n * cols;
        uint16_t *xb = (uint16_t *)scratch(c, nx * 2);
        k_f32_to_bf16<<<grid(nx), 256, 0, c->stream>>>(xb, x, nx);
        CK(cudaGetLastError());
        /* Column-major: out' [rows x n] = W'^T [rows x cols] * x' [cols x n]. */
        st = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, wd, CUDA_R_16BF,
                          cols, xb, CUDA_R_16BF, cols, &zero, out, CUDA_R_32F, rows,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else {
        st = cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, (const float *)wd,
                         cols, x, cols, &zero, out, rows);
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        lkv_panic("cuBLAS gemm %dx%dx%d failed: %d", rows, n, cols, (int)st);
    }
}

__global__ void k_add(float *x, const float *y, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] += y[i];
    }
}

static void be_add(void *ctx, float *x, const float *y, size_t n)
{
    k_add<<<grid(n), 256, 0, C(ctx)->stream>>>(x, y, n);
    CK(cudaGetLastError());
}

__global__ void k_swiglu(float *h1, const float *h3, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) {
        float a = h1[i];
        h1[i] = a / (1.0f + expf(-a)) * h3[i];
    }
}

static void be_swiglu(void *ctx, float *h1, const float *h3, size_t n)
{
    k_swiglu<<<grid(n), 256, 0, C(ctx)->stream>>>(h1, h3, n);
    CK(cudaGetLastError());
}

/* Exact-angle rotation as lkv_posenc.c: turns reduced in fp64, cos/sin in fp64, fp32 math. */
struct rope_params {
    int pairing, head_dim, n_pairs, rope;
    double freq[LKV_MAX_HEAD_DIM / 2];
};

__global__ void k_rope(rope_params p, const float *x, float *out, int n_tok, int n_heads,
                       int64_t pos0)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t total = (size_t)n_tok * n_heads * (p.head_dim / 2);
    if (i >= total) {
        return;
    }
    int half = p.head_dim / 2;
    int j = (int)(i % half);
    size_t row = i / half; /* token * n_heads + head */
    int tok = (int)(row / n_heads);
    const float *xv = x + row * p.head_dim;
    float *ov = out + row * p.head_dim;
    int i0, i1;
    if (p.pairing == LKV_ROPE_INTERLEAVED) {
        i0 = 2 * j;
        i1 = 2 * j + 1;
    } else {
        i0 = j;
        i1 = j + half;
    }
    float a = xv[i0], b = xv[i1];
    if (!p.rope || j >= p.n_pairs) {
        ov[i0] = a;
        ov[i1] = b;
        return;
    }
    double off = (double)(pos0 + tok);
    double q = off * p.freq[j];
    double e = fma(off, p.freq[j], -q);
    double r = q - rint(q);
    r += e;
    r -= rint(r);
    double s, c;
    sincospi(2.0 * r, &s, &c);
    float cf = (float)c, sf = (float)s;
    ov[i0] = a * cf - b * sf;
    ov[i1] = a * sf + b * cf;
}

static void be_rope(void *ctx, const lkv_posenc *pe, const float *x, float *out, int n_tok,
                    int n_heads, int64_t pos0)
{
    rope_params p;
    memset(&p, 0, sizeof(p));
    p.pairing = pe->pairing;
    p.head_dim = pe->head_dim;
    p.n_pairs = pe->n_pairs;
    p.rope = pe->kind == LKV_POSENC_ROPE;
    for (int j = 0; j < pe->n_pairs; j++) {
        p.freq[j] = pe->freq_turns[j];
    }
    size_t total = (size_t)n_tok * n_heads * (pe->head_dim / 2);
    if (total == 0) {
        return;
    }
    k_rope<<<grid(total), 256, 0, C(ctx)->stream>>>(p, x, out, n_tok, n_heads, pos0);
    CK(cudaGetLastError());
}

__global__ void k_kv_write(lkv_kv_shape s, uint8_t *arena, uint64_t page_bytes,
                           const uint32_t *pages, int layer, int local0, int n, const float *k,
                           const float *v)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const int D = s.head_dim, KVD = s.n_kv_heads * s.head_dim, B = s.block_tokens;
    if (i >= (size_t)n * KVD) {
        return;
    }
    int t = (int)(i / KVD), h = (int)((i % KVD) / D), d = (int)(i % D);
    int local = local0 + t;
    uint8_t *blk = arena + (uint64_t)pages[local / B] * page_bytes;
    size_t e = (size_t)(local % B) * D + d;
    lkv_store_elem(blk + lkv_slab_offset(&s, layer, 0, h), s.dtype, e, k[i]);
    lkv_store_elem(blk + lkv_slab_offset(&s, layer, 1, h), s.dtype, e, v[i]);
}

static void be_kv_write(void *ctx, const lkv_kv_shape *s, void *arena, uint64_t page_bytes,
                        const uint32_t *pages, int layer, int local0, int n, const float *k,
                        const float *v)
{
    cuda_ctx *c = C(ctx);
    int nb = (local0 + n - 1) / s->block_tokens + 1;
    const void *src[1] = {pages};
    size_t bytes[1] = {(size_t)nb * sizeof(uint32_t)};
    void *dst[1];
    upload(c, 1, src, bytes, dst, 0, NULL);
    size_t total = (size_t)n * s->n_kv_heads * s->head_dim;
    k_kv_write<<<grid(total), 256, 0, c->stream>>>(
        *s, (uint8_t *)arena, page_bytes, (const uint32_t *)dst[0], layer, local0, n, k, v);
    CK(cudaGetLastError());
}

static void conv_to(cuda_ctx *c, void *out, const float *in, size_t n, int dtype)
{
    k_f32_to_dtype<<<grid(n), 256, 0, c->stream>>>(out, in, n, dtype);
    CK(cudaGetLastError());
}

static void conv_from(cuda_ctx *c, float *out, const void *in, size_t n, int dtype)
{
    k_dtype_to_f32<<<grid(n), 256, 0, c->stream>>>(out, in, n, dtype);
    CK(cudaGetLastError());
}

/* The LazyAttention calls: the only place this backend touches the kernels' API (the plan/run
 * API of the kernels branch replaces these two functions' bodies). */
static int be_attn_prefill(void *ctx, const lkv_prefill_args *a)
{
    cuda_ctx *c = C(ctx);
    const lkv_kv_shape *s = &a->shape;
    size_t es = lkv_dtype_size(s->dtype);
    size_t nq = (size_t)a->n_new * s->n_q_heads * s->head_dim;
    size_t nk = (size_t)a->n_new * s->n_kv_heads * s->head_dim;
    size_t ws = lkv_attn_prefill_cuda_workspace(a);
    const void *src[1] = {a->refs};
    size_t bytes[1] = {(size_t)a->n_refs * sizeof(uint64_t)};
    void *dst[1], *rest;
    upload(c, 1, src, bytes, dst, align16(nq * es) * 2 + align16(nk * es) * 2 + ws + 64, &rest);
    uint8_t *p = (uint8_t *)rest;
    void *qb = p, *ob = p + align16(nq * es), *kb = p + 2 * align16(nq * es);
    void *vb = (uint8_t *)kb + align16(nk * es), *wsp = (uint8_t *)vb + align16(nk * es);
    conv_to(c, qb, (const float *)a->q, nq, s->dtype);
    conv_to(c, kb, (const float *)a->k_new, nk, s->dtype);
    conv_to(c, vb, (const float *)a->v_new, nk, s->dtype);
    lkv_prefill_args d = *a;
    d.q = qb;
    d.k_new = kb;
    d.v_new = vb;
    d.refs = (const uint64_t *)dst[0];
    d.out = ob;
    int rc = lkv_attn_prefill_cuda(&d, ws ? wsp : NULL, ws, c->stream);
    if (rc == 0) {
        conv_from(c, (float *)a->out, ob, nq, s->dtype);
    }
    return rc;
}

static int be_attn_decode(void *ctx, const lkv_decode_args *a)
{
    cuda_ctx *c = C(ctx);
    const lkv_kv_shape *s = &a->shape;
    size_t es = lkv_dtype_size(s->dtype);
    size_t nq = (size_t)a->batch * s->n_q_heads * s->head_dim;
    int max_refs = 0;
    for (int b = 0; b < a->batch; b++) {
        int k = a->ref_offset[b + 1] - a->ref_offset[b];
        max_refs = k > max_refs ? k : max_refs;
    }
    size_t ws = lkv_attn_decode_cuda_workspace(s, a->batch, max_refs);
    const void *src[3] = {a->refs, a->q_pos, a->ref_offset};
    size_t bytes[3] = {(size_t)a->ref_offset[a->batch] * sizeof(uint64_t),
                       (size_t)a->batch * sizeof(int64_t),
                       (size_t)(a->batch + 1) * sizeof(int32_t)};
    void *dst[3], *rest;
    upload(c, 3, src, bytes, dst, align16(nq * es) * 2 + ws + 64, &rest);
    uint8_t *p = (uint8_t *)rest;
    void *qb = p, *ob = p + align16(nq * es), *wsp = p + 2 * align16(nq * es);
    conv_to(c, qb, (const float *)a->q, nq, s->dtype);
    lkv_decode_args d = *a;
    d.q = qb;
    d.refs = (const uint64_t *)dst[0];
    d.q_pos = (const int64_t *)dst[1];
    d.ref_offset = (const int32_t *)dst[2];
    d.out = ob;
    d.lse = NULL;
    int rc = lkv_attn_decode_cuda(&d, max_refs, ws ? wsp : NULL, ws, c->stream);
    if (rc == 0) {
        conv_from(c, (float *)a->out, ob, nq, s->dtype);
    }
    return rc;
}

static int be_materialise(void *ctx, const lkv_materialise_args *a)
{
    cuda_ctx *c = C(ctx);
    const void *src[2] = {a->src_pages, a->dst_pages};
    size_t bytes[2] = {(size_t)a->n_blocks * sizeof(uint32_t),
                       (size_t)a->n_blocks * sizeof(uint32_t)};
    void *dst[2];
    upload(c, 2, src, bytes, dst, 0, NULL);
    lkv_materialise_args d = *a;
    d.src_pages = (const uint32_t *)dst[0];
    d.dst_pages = (const uint32_t *)dst[1];
    return lkv_materialise_cuda(&d, c->stream);
}

static int be_sample(void *ctx, const float *logits, int vocab, const lkv_sampling *s,
                     uint64_t *rng, int *token)
{
    (void)ctx;
    const lkv_backend *cpu = lkv_backend_cpu();
    return cpu->sample(cpu->ctx, logits, vocab, s, rng, token);
}

extern "C" int lkv_backend_cuda_create(int weights, const lkv_backend **out)
{
    *out = NULL;
    if (weights != LKV_CUDA_WEIGHTS_BF16 && weights != LKV_CUDA_WEIGHTS_F32) {
        return LKV_EINVAL;
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        LKV_LOGE("cuda backend: no usable GPU (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return LKV_ECUDA;
    }
    cuda_ctx *c = (cuda_ctx *)lkv_xcalloc(1, sizeof(*c));
    c->weights = weights;
    CK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        LKV_LOGE("cuda backend: cublasCreate failed");
        cudaStreamDestroy(c->stream);
        free(c);
        return LKV_ECUDA;
    }
    cublasSetStream(c->blas, c->stream);
    cublasSetMathMode(c->blas, CUBLAS_PEDANTIC_MATH); /* No TF32 in the fp32 path. */
    lkv_backend *t = &c->table;
    t->name = "cuda";
    t->ctx = c;
    t->alloc = be_alloc;
    t->release = be_release;
    t->map_weights = be_map_weights;
    t->release_weights = be_release_weights;
    t->to_host = be_to_host;
    t->fill_zero = be_fill_zero;
    t->embed = be_embed;
    t->rmsnorm = be_rmsnorm;
    t->matmul = be_matmul;
    t->add = be_add;
    t->swiglu = be_swiglu;
    t->rope = be_rope;
    t->kv_write = be_kv_write;
    t->attn_prefill = be_attn_prefill;
    t->attn_decode = be_attn_decode;
    t->materialise = be_materialise;
    t->sample = be_sample;
    t->devmap = lkv_devmap_cuda(); /* The daemon's HBM arena, read and written in place. */
    *out = t;
    return 0;
}

extern "C" void lkv_backend_cuda_destroy(const lkv_backend *be)
{
    if (be == NULL) {
        return;
    }
    cuda_ctx *c = C(be->ctx);
    cudaStreamSynchronize(c->stream);
    cudaFree(c->scratch);
    cublasDestroy(c->blas);
    cudaStreamDestroy(c->stream);
    free(c);
}
