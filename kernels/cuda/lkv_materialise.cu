/*
 * lkv_materialise.cu: the Block-Attention baseline on CUDA: copy n_blocks source pages to
 * destination pages with every K slab re-rotated by delta positions (R(delta) applied to keys
 * stored at document-local positions) and every V slab copied unchanged, for all layers.
 *
 * A persistent grid strides over slabs ((block, layer, K|V, kv head), B x head_dim contiguous
 * elements). Each CTA first builds the cos/sin table of the constant offset delta in shared
 * memory (exact-angle sincos, one per pair), then streams slabs with 16-byte loads and stores.
 * A K chunk of 8 elements needs its partner elements: in the same chunk for interleaved
 * pairing; for half pairing with n_pairs a multiple of 8 (the usual case) the thread of a
 * first-half chunk also reads the partner chunk n_pairs/8 away and writes both; otherwise one
 * thread per row rotates the row's pairs element by element (slow path, small models). Every
 * element is read and written by the same thread, so src page == dst page (in place) is safe.
 * The rotated keys are rounded once to the element type.
 */
#include "lkv_cuda_common.cuh"

extern "C" {
#include "lkv_attn_cuda.h"
}

struct mat_params {
    const char *src;
    char *dst;
    uint64_t page_bytes;
    const uint32_t *src_pages;
    const uint32_t *dst_pages;
    long n_slabs;
    int slabs_per_block; /* n_layers * 2 * n_kv_heads */
    int n_kv, d, B;
    uint64_t slab_bytes;
    float delta;
};

#define MAT_UNROLL 4

/* Work modes of one 16-byte chunk of a slab. */
#define M_SKIP  -1 /* nothing (handled by another thread) */
#define M_COPY  0  /* plain copy */
#define M_INTER 1  /* interleaved pairs, partners inside the chunk */
#define M_HALF  2  /* half pairing: this chunk (first half) and its partner chunk, both written */
#define M_ROW   3  /* half pairing with n_pairs % 8 != 0: the whole rotated part of the row */

template <typename T>
__global__ void __launch_bounds__(256) materialise_kernel(const mat_params p, const lkv__dev_pe pe)
{
    __shared__ float cs[LKV_MAX_HEAD_DIM / 2], sn[LKV_MAX_HEAD_DIM / 2];
    const int np = pe.n_pairs;
    for (int j = threadIdx.x; j < np; j += blockDim.x) {
        lkv__turn_sincos(p.delta, pe.freq_hi[j], pe.freq_lo[j], &sn[j], &cs[j]);
    }
    __syncthreads();
    const int d = p.d;
    const int chunks = p.B * d / 8; /* 16-byte chunks per slab */
    const int cpr = d / 8;          /* chunks per row */
    const bool half = pe.pairing == LKV_ROPE_HALF;
    const bool vec_ok = !half || (np % 8 == 0);
    const int rot_end8 = (2 * np + 7) / 8 * 8; /* elements [0, rot_end8) belong to rotating work */
    const long total = p.n_slabs * chunks;
    const long stride = (long)gridDim.x * blockDim.x;
    for (long g0 = (long)blockIdx.x * blockDim.x + threadIdx.x; g0 < total;
         g0 += MAT_UNROLL * stride) {
        uint4 x[MAT_UNROLL], y[MAT_UNROLL];
        char *dstp[MAT_UNROLL];
        const char *srcp[MAT_UNROLL];
        int cidx[MAT_UNROLL], mode[MAT_UNROLL];
#pragma unroll
        for (int u = 0; u < MAT_UNROLL; u++) {
            const long gi = g0 + u * stride;
            mode[u] = M_SKIP;
            x[u] = y[u] = make_uint4(0, 0, 0, 0);
            dstp[u] = NULL;
            srcp[u] = NULL;
            cidx[u] = 0;
            if (gi >= total) {
                continue;
            }
            const long s = gi / chunks;
            const int c = (int)(gi - s * chunks);
            const long blk = s / p.slabs_per_block;
            const int rest = (int)(s - blk * p.slabs_per_block);
            const bool is_k = ((rest / p.n_kv) & 1) == 0;
            const char *src = p.src + (size_t)p.src_pages[blk] * p.page_bytes + rest * p.slab_bytes;
            dstp[u] = p.dst + (size_t)p.dst_pages[blk] * p.page_bytes + rest * p.slab_bytes;
            srcp[u] = src;
            cidx[u] = c;
            const int i0 = (c % cpr) * 8;
            if (!is_k || np == 0 || i0 >= rot_end8) {
                mode[u] = M_COPY;
            } else if (!half) {
                mode[u] = M_INTER;
            } else if (vec_ok) {
                mode[u] = i0 < np ? M_HALF : M_SKIP;
            } else {
                mode[u] = i0 == 0 ? M_ROW : M_SKIP;
            }
            if (mode[u] == M_COPY || mode[u] == M_INTER || mode[u] == M_HALF) {
                x[u] = __ldg((const uint4 *)src + c);
            }
            if (mode[u] == M_HALF) {
                y[u] = __ldg((const uint4 *)src + c + np / 8);
            }
        }
#pragma unroll
        for (int u = 0; u < MAT_UNROLL; u++) {
            if (mode[u] == M_SKIP) {
                continue;
            }
            uint4 *d4 = (uint4 *)dstp[u];
            const int c = cidx[u];
            if (mode[u] == M_COPY) {
                d4[c] = x[u];
                continue;
            }
            const int row = c / cpr, i0 = (c - row * cpr) * 8;
            if (mode[u] == M_ROW) {
                /* One thread owns the rotated part of this row: safe in place. */
                const T *srow = (const T *)srcp[u] + (size_t)row * d;
                T *drow = (T *)dstp[u] + (size_t)row * d;
                for (int j = 0; j < np; j++) {
                    const float x0 = lkv__elem<T>::to_f(srow[j]);
                    const float x1 = lkv__elem<T>::to_f(srow[j + np]);
                    drow[j] = lkv__elem<T>::from_f(x0 * cs[j] - x1 * sn[j]);
                    drow[j + np] = lkv__elem<T>::from_f(fmaf(x0, sn[j], x1 * cs[j]));
                }
                for (int i = 2 * np; i < rot_end8; i++) {
                    drow[i] = srow[i];
                }
                continue;
            }
            float xf[8], yf[8], of[8], og[8];
            const uint32_t *xw = (const uint32_t *)&x[u];
            const uint32_t *yw = (const uint32_t *)&y[u];
#pragma unroll
            for (int w = 0; w < 4; w++) {
                float2 f = lkv__elem<T>::to_f2(xw[w]);
                xf[2 * w] = f.x;
                xf[2 * w + 1] = f.y;
                f = lkv__elem<T>::to_f2(yw[w]);
                yf[2 * w] = f.x;
                yf[2 * w + 1] = f.y;
            }
            if (mode[u] == M_INTER) {
#pragma unroll
                for (int e = 0; e < 8; e += 2) {
                    const int j = (i0 + e) >> 1;
                    if (i0 + e < 2 * np) {
                        of[e] = xf[e] * cs[j] - xf[e + 1] * sn[j];
                        of[e + 1] = fmaf(xf[e], sn[j], xf[e + 1] * cs[j]);
                    } else {
                        of[e] = xf[e];
                        of[e + 1] = xf[e + 1];
                    }
                }
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const int j = i0 + e;
                    of[e] = xf[e] * cs[j] - yf[e] * sn[j];
                    og[e] = fmaf(xf[e], sn[j], yf[e] * cs[j]);
                }
            }
            uint4 z;
            uint32_t *zw = (uint32_t *)&z;
#pragma unroll
            for (int w = 0; w < 4; w++) {
                zw[w] = lkv__elem<T>::pack2(of[2 * w], of[2 * w + 1]);
            }
            d4[c] = z;
            if (mode[u] == M_HALF) {
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    zw[w] = lkv__elem<T>::pack2(og[2 * w], og[2 * w + 1]);
                }
                d4[c + np / 8] = z;
            }
        }
    }
}

extern "C" int lkv_materialise_cuda(const lkv_materialise_args *a, void *stream)
{
    if (a == NULL || a->n_blocks < 0 || a->delta < 0 || a->delta > LKV_MAX_POSITION) {
        return LKV_EINVAL;
    }
    const lkv_kv_shape *s = &a->shape;
    if (s->n_layers < 1 || s->n_kv_heads < 1 || s->n_q_heads < 1 ||
        s->n_q_heads % s->n_kv_heads != 0 || s->head_dim < 8 || s->head_dim > LKV_MAX_HEAD_DIM ||
        s->head_dim % 8 != 0 || s->block_tokens < 1 || s->block_tokens > LKV_MAX_BLOCK_TOKENS ||
        a->page_bytes < lkv_block_bytes(s) || a->page_bytes % 16 != 0) {
        return LKV_EINVAL;
    }
    if (s->dtype != LKV_DTYPE_BF16 && s->dtype != LKV_DTYPE_F16) {
        return LKV_ENOTSUP;
    }
    if (a->n_blocks == 0) {
        return 0;
    }
    if (a->src_arena == NULL || a->dst_arena == NULL || a->src_pages == NULL ||
        a->dst_pages == NULL) {
        return LKV_EINVAL;
    }
    lkv__dev_pe pe;
    int rc = lkv__dev_pe_fill(&pe, a->pe, s->head_dim, 0);
    if (rc != 0) {
        return rc;
    }
    mat_params p;
    p.src = (const char *)a->src_arena;
    p.dst = (char *)a->dst_arena;
    p.page_bytes = a->page_bytes;
    p.src_pages = a->src_pages;
    p.dst_pages = a->dst_pages;
    p.slabs_per_block = s->n_layers * 2 * s->n_kv_heads;
    p.n_slabs = (long)a->n_blocks * p.slabs_per_block;
    p.n_kv = s->n_kv_heads;
    p.d = s->head_dim;
    p.B = s->block_tokens;
    p.slab_bytes = lkv_slab_bytes(s);
    p.delta = (float)a->delta;
    const long chunks = p.n_slabs * (p.B * p.d / 8);
    long grid = 16L * lkv__cuda_sm_count();
    if (grid > (chunks + 255) / 256) {
        grid = (chunks + 255) / 256;
    }
    cudaStream_t st = (cudaStream_t)stream;
    if (s->dtype == LKV_DTYPE_BF16) {
        materialise_kernel<__nv_bfloat16><<<(unsigned)grid, 256, 0, st>>>(p, pe);
    } else {
        materialise_kernel<__half><<<(unsigned)grid, 256, 0, st>>>(p, pe);
    }
    LKV__CUDA_CHECK_LAUNCH();
    return 0;
}
