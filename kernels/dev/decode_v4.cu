/* FROZEN: decode v4, the production decode of commit 61c1a0f (2026-11-30): separate merge kernel,
 * per-warp reference walk with a reload in the consumer, scalar query staging. Kept as a
 * workshop version (kernels/dev/README.md); built only with LKV_KERNELS_DEV=ON. */
/*
 * lkv_decode.cu: LazyAttention decode on CUDA (one query token per sequence, paged KV).
 *
 * Work split. One CTA of DEC_WARPS warps per (split, kv head x head chunk, sequence). A head
 * chunk is up to G query heads of one GQA group (so each K/V slab is read once per chunk and
 * shared by its heads; bigger groups, e.g. MQA with 32 heads, take several chunks). A split is
 * a contiguous range of the sequence's block references; inside a CTA, warp w takes
 * references w, w + W, ... of that range. When the grid of (kv heads x chunks x sequences) is
 * too small to fill the GPU (batch 1, long context), the references are split over several
 * CTAs (about one wave of two CTAs per SM) and the fp32 partials merged by log-sum-exp in a
 * second kernel (lkv__merge_launch).
 *
 * Memory pipeline. Each warp streams its steps (up to 16 tokens of one block for the
 * tensor-core path, U * 32/L for the generic one) through its own ring of DEC_NST cp.async
 * stages in shared memory: two steps are in flight while one is computed, so the warp never
 * waits on a cold load once the ring is primed (the first version, which loaded K/V straight
 * into registers, reached 2.65 TB/s; kernels/dev/README.md has the history).
 *
 * Tensor-core path (head_dim 64 or 128, decode_mma_kernel): keys are the M dimension of
 * mma.m16n8k16 and the (up to 8) query heads of the chunk the N = 8 dimension:
 *   S^T = K Q^T, then O^T += V^T P^T   (DESIGN.md 10.3),
 * with ldmatrix from an XOR-swizzled ring and two movmatrix transposes to turn the S^T
 * accumulator into the P^T operand. The rotated, scaled query is rounded once to 16 bits.
 *
 * Generic path (any head_dim 8..256, decode_kernel): a K/V row is read by L lanes, 8 elements
 * (16 bytes) each, L = the next power of two >= head_dim / 8; scores are reduced over the L
 * lanes with xor shuffles; the rotated query stays fp32. G (1, 2, 4 or 8) is a template
 * constant, L a runtime value: 8 instantiations per element type.
 *
 * Lazy RoPE (option B of DESIGN.md 10.2): keys are stored rotated at document-local positions,
 * so only the query is rotated, by q_pos - start, whenever the warp's walk enters a reference
 * with a new document start (the tensor-core path computes one sincos per pair per warp and
 * shares it through shared memory). Angles use the exact integer offset (hi/lo turns,
 * sincospif) and fp32 math; the softmax scale and log2(e) are folded in. The raw query is kept
 * in shared memory as fp32 so rotations never compound. ALiBi adds
 * slope * ((start + block * B + t) - q_pos), exact integers converted once.
 *
 * Softmax: log2 domain, online per step; the running max is uniform over the lanes that share
 * a head, so partial sums are on one scale and are reduced once at the end.
 */
#include <stdlib.h>

#include "lkv_cuda_common.cuh"

extern "C" {
#include "lkv_attn_cuda.h"
}

#define DEC_WARPS 4
#define DEC_NST   3 /* cp.async stages per warp (2 in flight while one is computed) */

struct decode_params {
    const void *q;
    const int64_t *q_pos;
    const char *arena;
    uint64_t page_bytes;
    const uint64_t *refs;
    const int32_t *ref_offset;
    void *out;
    float *lse;
    float *part_o;   /* [batch * n_q][n_splits][d] when n_splits > 1. */
    float *part_lse; /* [batch * n_q][n_splits], log2 domain. */
    int n_q, n_kv, group, head_chunks, d, L, B, layer;
    uint64_t slab_bytes;
    int n_splits, refs_per_split;
    float scale_log2; /* sm_scale * log2(e). */
};

template <int G> struct dec_unroll {
    static const int U = G >= 8 ? 4 : 8; /* Loads of K (and V) per lane per step. */
};

/* Epilogue shared by both decode kernels (call after __syncthreads): merges the DEC_WARPS
 * warps' partial softmax states (mw: running max, lw: sum, accw: output, log2 domain) of the
 * nh heads of this CTA and writes the result: out (+ lse) when the CTA owns the whole sequence,
 * else this split's partial output and log2 sum for the merge kernel. */
template <typename T, int G>
static __device__ __forceinline__ void dec_store(const decode_params &p, const float *mw,
                                                 const float *lw, const float *accw, int nh, int d,
                                                 int b, int h0, int split)
{
    for (int i = threadIdx.x; i < nh * d; i += blockDim.x) {
        const int h = i / d, dim = i - h * d;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) {
            M = fmaxf(M, mw[w * G + h]);
        }
        float ls = 0.0f, o = 0.0f;
        if (M != -INFINITY) {
#pragma unroll
            for (int w = 0; w < DEC_WARPS; w++) {
                const float sc = exp2f(mw[w * G + h] - M);
                ls += lw[w * G + h] * sc;
                o += accw[(w * G + h) * d + dim] * sc;
            }
        }
        const size_t row = (size_t)b * p.n_q + h0 + h;
        const float res = ls > 0.0f ? o / ls : 0.0f;
        const float lse2 = ls > 0.0f ? M + log2f(ls) : -INFINITY;
        if (p.n_splits == 1) {
            ((T *)p.out)[row * d + dim] = lkv__elem<T>::from_f(res);
            if (dim == 0 && p.lse != NULL) {
                p.lse[row] = ls > 0.0f ? lse2 * LKV__LN2 : -INFINITY;
            }
        } else {
            p.part_o[(row * p.n_splits + split) * d + dim] = res;
            if (dim == 0) {
                p.part_lse[row * p.n_splits + split] = lse2;
            }
        }
    }
}

template <typename T, int G, int LT>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    decode_kernel(const decode_params p, const lkv__dev_pe pe, const lkv__dev_slopes sl)
{
    constexpr int U = dec_unroll<G>::U;
    extern __shared__ __align__(16) float smem[];
    const int L = LT ? LT : p.L;
    const int TPI = 32 / L;
    const int d = p.d;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rg = lane / L, cl = lane % L;
    const int split = blockIdx.x, b = blockIdx.z;
    const int kvh = blockIdx.y / p.head_chunks, hchunk = blockIdx.y % p.head_chunks;
    const int h0 = kvh * p.group + hchunk * G;
    const int nh = min(G, p.group - hchunk * G);

    float *q_raw = smem;              /* [G][d] */
    float *fhi = q_raw + G * d;       /* [128] */
    float *flo = fhi + 128;           /* [128] */
    float *mw = flo + 128;            /* [W][G] */
    float *lw = mw + DEC_WARPS * G;   /* [W][G] */
    float *accw = lw + DEC_WARPS * G; /* [W][G][d] */

    const T *q = (const T *)p.q + ((size_t)b * p.n_q + h0) * d;
    for (int i = threadIdx.x; i < G * d; i += blockDim.x) {
        q_raw[i] = i < nh * d ? lkv__elem<T>::to_f(q[i]) : 0.0f;
    }
    for (int j = threadIdx.x; j < pe.n_pairs; j += blockDim.x) {
        fhi[j] = pe.freq_hi[j];
        flo[j] = pe.freq_lo[j];
    }
    __syncthreads();

    const int64_t pos = p.q_pos[b];
    const int rend = p.ref_offset[b + 1];
    const int r0 = p.ref_offset[b] + split * p.refs_per_split;
    /* The last split takes any tail beyond the planned bound (a too small max_refs hint). */
    const int r1 = split == p.n_splits - 1 ? rend : min(rend, r0 + p.refs_per_split);
    const bool dim_on = cl * 8 < d;
    const size_t slab_k = ((size_t)(p.layer * 2) * p.n_kv + kvh) * p.slab_bytes;
    const size_t slab_v = ((size_t)(p.layer * 2 + 1) * p.n_kv + kvh) * p.slab_bytes;
    const bool alibi = pe.kind == LKV_POSENC_ALIBI;
    float slope[G];
#pragma unroll
    for (int h = 0; h < G; h++) {
        slope[h] = (alibi && h < nh) ? sl.s[h0 + h] * LKV__LOG2E : 0.0f;
    }

    float qr[G][8], acc[G][8], m[G], l[G];
#pragma unroll
    for (int h = 0; h < G; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            acc[h][e] = 0.0f;
            qr[h][e] = 0.0f;
        }
    }
    /* Per-warp cp.async ring: stage s holds, per lane, U chunks of K then U chunks of V
     * (16 bytes each, [U][32 lanes]). Every lane writes and reads only its own slots. */
    uint4 *ring = (uint4 *)(accw + DEC_WARPS * G * d) + (size_t)warp * DEC_NST * 2 * U * 32;
    const int step = U * TPI;

    /* Producer: the next step (block pr, first token pt0) to fetch. */
    int pr = r0 + warp, pt0 = 0;
    uint64_t pref = pr < r1 ? __ldg(p.refs + pr) : 0;
    uint64_t pref_next = pr + DEC_WARPS < r1 ? __ldg(p.refs + pr + DEC_WARPS) : 0;
    int pslot = 0;
    auto issue = [&]() {
        if (pr < r1) {
            const int valid = min((int)lkv_ref_valid(pref), p.B);
            const char *base = p.arena + (size_t)lkv_ref_page(pref) * p.page_bytes;
            uint4 *st = ring + (size_t)pslot * 2 * U * 32;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int t = pt0 + u * TPI + rg;
                const bool ok = dim_on && t < valid;
                const size_t off = ok ? ((size_t)t * d + cl * 8) * 2 : 0;
                lkv__cp_async16(st + u * 32 + lane, base + slab_k + off, ok);
                lkv__cp_async16(st + (U + u) * 32 + lane, base + slab_v + off, ok);
            }
            pt0 += step;
            if (pt0 >= valid) {
                pt0 = 0;
                pr += DEC_WARPS;
                pref = pref_next;
                if (pr + DEC_WARPS < r1) {
                    pref_next = __ldg(p.refs + pr + DEC_WARPS);
                }
            }
        }
        lkv__cp_async_commit();
        pslot = pslot + 1 == DEC_NST ? 0 : pslot + 1;
    };
#pragma unroll
    for (int s = 0; s < DEC_NST - 1; s++) {
        issue();
    }

    int64_t cur_start = -1;
    int cslot = 0;
    for (int r = r0 + warp; r < r1; r += DEC_WARPS) {
        const uint64_t ref = __ldg(p.refs + r);
        const int64_t start = lkv_ref_start(ref);
        const int blk = (int)lkv_ref_block(ref);
        const int valid = min((int)lkv_ref_valid(ref), p.B);
        if (start != cur_start) {
            cur_start = start;
            const float delta = (float)(pos - start);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int i = cl * 8 + e;
                float c = 1.0f, s = 0.0f;
                int pair = 0, partner = i;
                int role = i < d ? lkv__pair_of(i, pe.pairing, pe.n_pairs, &pair, &partner) : 0;
                if (role != 0) {
                    lkv__turn_sincos(delta, fhi[pair], flo[pair], &s, &c);
                }
                const float sg = role > 0 ? -s : s;
#pragma unroll
                for (int h = 0; h < G; h++) {
                    float x = i < d ? q_raw[h * d + i] : 0.0f;
                    float xp = role != 0 ? q_raw[h * d + partner] : 0.0f;
                    qr[h][e] = fmaf(xp, sg, x * c) * p.scale_log2;
                }
            }
        }
        const float kbias = alibi ? (float)(start + (int64_t)blk * p.B - pos) : 0.0f;
        for (int t0 = 0; t0 < valid; t0 += step) {
            issue();
            lkv__cp_async_wait<DEC_NST - 1>();
            const uint4 *st = ring + (size_t)cslot * 2 * U * 32;
            cslot = cslot + 1 == DEC_NST ? 0 : cslot + 1;
            uint4 kr[U], vr[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                kr[u] = st[u * 32 + lane];
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                vr[u] = st[(U + u) * 32 + lane];
            }
            float s[G][U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                float kf[8];
                const uint32_t *kw = (const uint32_t *)&kr[u];
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    float2 f = lkv__elem<T>::to_f2(kw[w]);
                    kf[2 * w] = f.x;
                    kf[2 * w + 1] = f.y;
                }
#pragma unroll
                for (int h = 0; h < G; h++) {
                    float a = 0.0f;
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        a = fmaf(qr[h][e], kf[e], a);
                    }
                    s[h][u] = a;
                }
            }
            for (int off = 1; off < L; off <<= 1) {
#pragma unroll
                for (int h = 0; h < G; h++) {
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        s[h][u] += __shfl_xor_sync(0xffffffffu, s[h][u], off);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int t = t0 + u * TPI + rg;
#pragma unroll
                for (int h = 0; h < G; h++) {
                    if (t >= valid) {
                        s[h][u] = -INFINITY;
                    } else if (alibi) {
                        s[h][u] = fmaf(slope[h], kbias + (float)t, s[h][u]);
                    }
                }
            }
#pragma unroll
            for (int h = 0; h < G; h++) {
                float cm = s[h][0];
#pragma unroll
                for (int u = 1; u < U; u++) {
                    cm = fmaxf(cm, s[h][u]);
                }
                for (int off = L; off < 32; off <<= 1) {
                    cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, off));
                }
                const float mn = fmaxf(m[h], cm); /* finite: slot 0 of row group 0 is valid */
                const float alpha = exp2f(m[h] - mn);
                m[h] = mn;
                l[h] *= alpha;
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    acc[h][e] *= alpha;
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    s[h][u] = exp2f(s[h][u] - mn);
                    l[h] += s[h][u];
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                float vf[8];
                const uint32_t *vw = (const uint32_t *)&vr[u];
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    float2 f = lkv__elem<T>::to_f2(vw[w]);
                    vf[2 * w] = f.x;
                    vf[2 * w + 1] = f.y;
                }
#pragma unroll
                for (int h = 0; h < G; h++) {
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        acc[h][e] = fmaf(s[h][u], vf[e], acc[h][e]);
                    }
                }
            }
        }
    }

    /* Sum the row groups of the warp (same running max everywhere in the warp). */
    for (int off = L; off < 32; off <<= 1) {
#pragma unroll
        for (int h = 0; h < G; h++) {
            l[h] += __shfl_xor_sync(0xffffffffu, l[h], off);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                acc[h][e] += __shfl_xor_sync(0xffffffffu, acc[h][e], off);
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int h = 0; h < G; h++) {
            mw[warp * G + h] = m[h];
            lw[warp * G + h] = l[h];
        }
    }
    if (rg == 0 && dim_on) {
#pragma unroll
        for (int h = 0; h < G; h++) {
#pragma unroll
            for (int e = 0; e < 8; e++) {
                accw[(warp * G + h) * d + cl * 8 + e] = acc[h][e];
            }
        }
    }
    __syncthreads();
    dec_store<T, G>(p, mw, lw, accw, nh, d, b, h0, split);
}

/* ------------------------------------------------------------------------------------------
 * Tensor-core decode (head_dim 64 or 128): per warp, 16 keys at a time,
 *   S^T[16 keys x 8 heads] = K[16 x D] . Q^T[D x 8]          (mma m16n8k16, keys as M)
 *   O^T[D x 8 heads]     += V^T[D x 16] . P^T[16 keys x 8]     (dims as M)
 * so the GQA group (up to 8 query heads of one kv head) fills the N = 8 slot (DESIGN.md 10.3).
 * K and V rows of the step land in a per-warp cp.async ring (DEC_NST stages, 16-byte chunks
 * XOR-swizzled by row for conflict-free ldmatrix); P goes from the S^T accumulator layout to the
 * B-operand layout with two movmatrix transposes. The rotated, scaled query is rounded once to
 * 16 bits (the MMA input), as in prefill.
 * ---------------------------------------------------------------------------------------- */
template <int D> static __device__ __forceinline__ int dswz(int row, int col)
{
    return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

template <typename T, int D>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    decode_mma_kernel(const decode_params p, const lkv__dev_pe pe, const lkv__dev_slopes sl)
{
    constexpr int G = 8;
    constexpr int STAGE = 2 * 16 * D; /* elements of K then V rows of one step */
    extern __shared__ __align__(16) float smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gq = lane >> 2, tq = lane & 3; /* mma fragment coordinates */
    const int split = blockIdx.x, b = blockIdx.z;
    const int kvh = blockIdx.y / p.head_chunks, hchunk = blockIdx.y % p.head_chunks;
    const int h0 = kvh * p.group + hchunk * G;
    const int nh = min(G, p.group - hchunk * G);

    float *q_raw = smem;                                  /* [G][D] */
    float *fhi = q_raw + G * D;                           /* [128] */
    float *flo = fhi + 128;                               /* [128] */
    float *mw = flo + 128;                                /* [W][G] */
    float *lw = mw + DEC_WARPS * G;                       /* [W][G] */
    float *csw = lw + DEC_WARPS * G + (size_t)warp * D;   /* [W][D/2][2] cos, sin per pair */
    T *ring0 = (T *)(lw + DEC_WARPS * G + DEC_WARPS * D); /* [W][NST][STAGE] */
    float *accw = (float *)ring0; /* [W][G][D], reuses the ring after the loop */
    T *ring = ring0 + (size_t)warp * DEC_NST * STAGE;

    /* Latency chain at small batch: ref_offset -> refs -> the first K/V loads. The first
     * steps are issued before the query is staged, so the query loads overlap them. */
    const int64_t pos = p.q_pos[b];
    const int rend = p.ref_offset[b + 1];
    const int r0 = p.ref_offset[b] + split * p.refs_per_split;
    const int r1 = split == p.n_splits - 1 ? rend : min(rend, r0 + p.refs_per_split);
    const size_t slab_k = ((size_t)(p.layer * 2) * p.n_kv + kvh) * p.slab_bytes;
    const size_t slab_v = ((size_t)(p.layer * 2 + 1) * p.n_kv + kvh) * p.slab_bytes;
    const bool alibi = pe.kind == LKV_POSENC_ALIBI;

    /* Producer: cp.async of step (block pr, tokens pt0 .. pt0 + 15) into the ring. */
    int pr = r0 + warp, pt0 = 0, pslot = 0;
    uint64_t pref = pr < r1 ? __ldg(p.refs + pr) : 0;
    uint64_t pref_next = pr + DEC_WARPS < r1 ? __ldg(p.refs + pr + DEC_WARPS) : 0;
    auto issue = [&]() {
        if (pr < r1) {
            const int valid = min((int)lkv_ref_valid(pref), p.B);
            const char *base = p.arena + (size_t)lkv_ref_page(pref) * p.page_bytes;
            T *st = ring + (size_t)pslot * STAGE;
#pragma unroll
            for (int i = 0; i < 16 * (D / 8) / 32; i++) {
                const int idx = lane + 32 * i;
                const int row = idx / (D / 8), c = idx % (D / 8);
                const int t = pt0 + row;
                const bool ok = t < valid;
                const size_t off = ok ? ((size_t)t * D + c * 8) * sizeof(T) : 0;
                lkv__cp_async16(st + dswz<D>(row, c * 8), base + slab_k + off, ok);
                lkv__cp_async16(st + 16 * D + dswz<D>(row, c * 8), base + slab_v + off, ok);
            }
            pt0 += 16;
            if (pt0 >= valid) {
                pt0 = 0;
                pr += DEC_WARPS;
                pref = pref_next;
                if (pr + DEC_WARPS < r1) {
                    pref_next = __ldg(p.refs + pr + DEC_WARPS);
                }
            }
        }
        lkv__cp_async_commit();
        pslot = pslot + 1 == DEC_NST ? 0 : pslot + 1;
    };
#pragma unroll
    for (int s = 0; s < DEC_NST - 1; s++) {
        issue();
    }

    const T *q = (const T *)p.q + ((size_t)b * p.n_q + h0) * D;
    for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
        q_raw[i] = i < nh * D ? lkv__elem<T>::to_f(q[i]) : 0.0f;
    }
    for (int j = threadIdx.x; j < pe.n_pairs; j += blockDim.x) {
        fhi[j] = pe.freq_hi[j];
        flo[j] = pe.freq_lo[j];
    }
    __syncthreads(); /* q_raw, fhi, flo */
    /* This lane's two head columns of S^T / O^T. */
    float slope[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int h = 2 * tq + e;
        slope[e] = (alibi && h < nh) ? sl.s[h0 + h] * LKV__LOG2E : 0.0f;
    }

    uint32_t qb[D / 16][2]; /* Q^T B fragments: head gq, dims kk*16 + 2tq + {0,1} and +8 */
    float o[D / 16][4];     /* O^T accumulators: dims mt*16 + gq (+8), heads 2tq + {0,1} */
#pragma unroll
    for (int mt = 0; mt < D / 16; mt++) {
        o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
        qb[mt][0] = qb[mt][1] = 0u;
    }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int64_t cur_start = -1;
    int cslot = 0;
    for (int r = r0 + warp; r < r1; r += DEC_WARPS) {
        const uint64_t ref = __ldg(p.refs + r);
        const int64_t start = lkv_ref_start(ref);
        const int blk = (int)lkv_ref_block(ref);
        const int valid = min((int)lkv_ref_valid(ref), p.B);
        if (start != cur_start) {
            cur_start = start;
            const float delta = (float)(pos - start);
            const float *xq = q_raw + gq * D;
            /* The warp's lanes share the pairs' angles: one sincos per pair, via smem. */
            for (int j = lane; j < pe.n_pairs; j += 32) {
                lkv__turn_sincos(delta, fhi[j], flo[j], &csw[2 * j + 1], &csw[2 * j]);
            }
            __syncwarp();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                float v[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = kk * 16 + 2 * tq + (e & 1) + (e >> 1) * 8;
                    int pair = 0, partner = i;
                    const int role = lkv__pair_of(i, pe.pairing, pe.n_pairs, &pair, &partner);
                    float sn = 0.0f, cs = 1.0f;
                    if (role != 0) {
                        cs = csw[2 * pair];
                        sn = csw[2 * pair + 1];
                    }
                    const float xp = role != 0 ? xq[partner] : 0.0f;
                    v[e] = fmaf(xp, role > 0 ? -sn : sn, xq[i] * cs) * p.scale_log2;
                }
                qb[kk][0] = lkv__elem<T>::pack2(v[0], v[1]);
                qb[kk][1] = lkv__elem<T>::pack2(v[2], v[3]);
            }
            __syncwarp(); /* csw is rewritten at the next document. */
        }
        const float kbias = alibi ? (float)(start + (int64_t)blk * p.B - pos) : 0.0f;
        for (int t0 = 0; t0 < valid; t0 += 16) {
            issue();
            lkv__cp_async_wait<DEC_NST - 1>();
            __syncwarp();
            const T *st = ring + (size_t)cslot * STAGE;
            cslot = cslot + 1 == DEC_NST ? 0 : cslot + 1;
            /* S^T = K Q^T. */
            float sacc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t a[4];
                const int mm = lane >> 3;
                lkv__ldsm_x4(a[0], a[1], a[2], a[3],
                             st + dswz<D>((mm & 1) * 8 + (lane & 7), kk * 16 + (mm >> 1) * 8));
                lkv__mma<T>::run(sacc, a, qb[kk][0], qb[kk][1]);
            }
            /* Mask, bias, online softmax per head column (keys gq and gq + 8). */
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int t = t0 + gq + (e >> 1) * 8;
                if (t >= valid) {
                    sacc[e] = -INFINITY;
                } else if (alibi) {
                    sacc[e] = fmaf(slope[e & 1], kbias + (float)t, sacc[e]);
                }
            }
            float alpha[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float mx = fmaxf(sacc[e], sacc[e + 2]);
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
                const float mn = fmaxf(m[e], mx); /* finite: key t0 is valid */
                alpha[e] = lkv__ex2(m[e] - mn);
                m[e] = mn;
                sacc[e] = lkv__ex2(sacc[e] - mn);
                sacc[e + 2] = lkv__ex2(sacc[e + 2] - mn);
                l[e] = l[e] * alpha[e] + (sacc[e] + sacc[e + 2]);
            }
            /* P^T as the B operand: transpose the two 8x8 (keys x heads) halves. */
            const uint32_t pb0 = lkv__movmatrix_t(lkv__elem<T>::pack2(sacc[0], sacc[1]));
            const uint32_t pb1 = lkv__movmatrix_t(lkv__elem<T>::pack2(sacc[2], sacc[3]));
            /* O^T = alpha O^T + V^T P^T. */
#pragma unroll
            for (int mt = 0; mt < D / 16; mt++) {
                uint32_t a[4];
                const int mm = lane >> 3;
                lkv__ldsm_x4_t(a[0], a[1], a[2], a[3],
                               st + 16 * D +
                                   dswz<D>((mm >> 1) * 8 + (lane & 7), mt * 16 + (mm & 1) * 8));
                o[mt][0] *= alpha[0];
                o[mt][1] *= alpha[1];
                o[mt][2] *= alpha[0];
                o[mt][3] *= alpha[1];
                lkv__mma<T>::run(o[mt], a, pb0, pb1);
            }
            __syncwarp();
        }
    }
    lkv__cp_async_wait<0>();

    /* Per-warp totals: l summed over the 8 lanes of each head column. */
#pragma unroll
    for (int e = 0; e < 2; e++) {
        l[e] += __shfl_xor_sync(0xffffffffu, l[e], 4);
        l[e] += __shfl_xor_sync(0xffffffffu, l[e], 8);
        l[e] += __shfl_xor_sync(0xffffffffu, l[e], 16);
    }
    __syncthreads(); /* Every warp is done with its ring: accw may overwrite it. */
    if (gq == 0) {
        mw[warp * G + 2 * tq] = m[0];
        mw[warp * G + 2 * tq + 1] = m[1];
        lw[warp * G + 2 * tq] = l[0];
        lw[warp * G + 2 * tq + 1] = l[1];
    }
#pragma unroll
    for (int mt = 0; mt < D / 16; mt++) {
        float *aw = accw + (size_t)warp * G * D;
        aw[(2 * tq) * D + mt * 16 + gq] = o[mt][0];
        aw[(2 * tq + 1) * D + mt * 16 + gq] = o[mt][1];
        aw[(2 * tq) * D + mt * 16 + gq + 8] = o[mt][2];
        aw[(2 * tq + 1) * D + mt * 16 + gq + 8] = o[mt][3];
    }
    __syncthreads();
    dec_store<T, G>(p, mw, lw, accw, nh, D, b, h0, split);
}

/* Launch plan shared by the workspace query and the launcher. */
struct decode_plan {
    int mma; /* Tensor-core kernel (head_dim 64 or 128). */
    int G, head_chunks, L, n_splits, refs_per_split;
};

static int pow2_at_least(int x)
{
    int p = 1;
    while (p < x) {
        p <<= 1;
    }
    return p;
}

static void plan_decode(const lkv_kv_shape *s, int batch, int max_refs, decode_plan *pl)
{
    const int group = s->n_q_heads / s->n_kv_heads;
    pl->mma = s->head_dim == 64 || s->head_dim == 128;
    pl->G = (group >= 8 || pl->mma) ? 8 : pow2_at_least(group);
    pl->head_chunks = (group + pl->G - 1) / pl->G;
    pl->L = pow2_at_least(s->head_dim / 8);
    if (max_refs < 1) {
        max_refs = 1;
    }
    const long base = (long)batch * s->n_kv_heads * pl->head_chunks;
    /* Two resident CTAs per SM: aim at one whole wave (two waves were slower at batch 1 and
     * 16: more partials to merge, a ragged second wave; kernels/dev/README.md). */
    const long target = 2L * lkv__cuda_sm_count();
    /* At least 2 references per warp per split, so a split is worth its merge. */
    const int min_refs = 2 * DEC_WARPS;
    long splits = target / base;
    long cap = (max_refs + min_refs - 1) / min_refs;
    if (splits > cap) {
        splits = cap;
    }
    /* Test and benchmark knob: LKV_ATTN_DECODE_SPLITS=n forces n splits (at most one
     * reference per warp per split). */
    const char *e = getenv("LKV_ATTN_DECODE_SPLITS");
    const int forced = e != NULL ? atoi(e) : 0;
    if (forced > 0) {
        const long cap1 = (max_refs + DEC_WARPS - 1) / DEC_WARPS;
        splits = forced < cap1 ? forced : cap1;
    }
    if (splits < 1) {
        splits = 1;
    }
    int rps = (int)((max_refs + splits - 1) / splits);
    rps = (rps + DEC_WARPS - 1) / DEC_WARPS * DEC_WARPS;
    pl->refs_per_split = rps;
    pl->n_splits = (max_refs + rps - 1) / rps;
    if (pl->n_splits < 1) {
        pl->n_splits = 1;
    }
}

static int shape_ok(const lkv_kv_shape *s)
{
    return s->n_layers >= 1 && s->n_q_heads >= 1 && s->n_q_heads <= LKV_MAX_Q_HEADS &&
           s->n_kv_heads >= 1 && s->n_q_heads % s->n_kv_heads == 0 && s->head_dim >= 8 &&
           s->head_dim <= LKV_MAX_HEAD_DIM && s->head_dim % 8 == 0 && s->block_tokens >= 1 &&
           s->block_tokens <= LKV_MAX_BLOCK_TOKENS;
}

extern "C" size_t lkv_attn_decode_cuda_workspace(const lkv_kv_shape *shape, int batch,
                                                 int max_refs_per_seq)
{
    if (shape == NULL || !shape_ok(shape) || batch < 1) {
        return 0;
    }
    decode_plan pl;
    plan_decode(shape, batch, max_refs_per_seq, &pl);
    if (pl.n_splits == 1) {
        return 0;
    }
    size_t rows = (size_t)batch * shape->n_q_heads;
    return rows * pl.n_splits * ((size_t)shape->head_dim + 1) * sizeof(float) + 256;
}

template <typename T, int G, int LT>
static void launch_one(dim3 grid, size_t smem, cudaStream_t st, const decode_params &p,
                       const lkv__dev_pe &pe, const lkv__dev_slopes &sl)
{
    smem += (size_t)DEC_WARPS * DEC_NST * 2 * dec_unroll<G>::U * 32 * 16;
    static bool attr_set; /* One per instantiation; setting it twice is harmless. */
    if (!attr_set) {
        if (cudaFuncSetAttribute(
                decode_kernel<T, G, LT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                (int)(48 * 1024 + DEC_WARPS * DEC_NST * 2 * 8 * 32 * 16 + 32768)) != cudaSuccess) {
            return; /* The launch below reports the error. */
        }
        attr_set = true;
    }
    decode_kernel<T, G, LT><<<grid, DEC_WARPS * 32, smem, st>>>(p, pe, sl);
}

template <typename T, int D>
static void launch_mma(dim3 grid, cudaStream_t st, const decode_params &p, const lkv__dev_pe &pe,
                       const lkv__dev_slopes &sl)
{
    const size_t smem = (size_t)(8 * D + 256 + 2 * DEC_WARPS * 8 + DEC_WARPS * D) * sizeof(float) +
                        (size_t)DEC_WARPS * DEC_NST * 2 * 16 * D * sizeof(T);
    static bool attr_set; /* One per instantiation; setting it twice is harmless. */
    if (!attr_set) {
        if (cudaFuncSetAttribute(decode_mma_kernel<T, D>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem) != cudaSuccess) {
            return; /* The launch below reports the error. */
        }
        attr_set = true;
    }
    decode_mma_kernel<T, D><<<grid, DEC_WARPS * 32, smem, st>>>(p, pe, sl);
}

template <typename T>
static void launch_typed(const decode_plan &pl, dim3 grid, size_t smem, cudaStream_t st,
                         const decode_params &p, const lkv__dev_pe &pe, const lkv__dev_slopes &sl)
{
    if (pl.mma) {
        p.d == 128 ? launch_mma<T, 128>(grid, st, p, pe, sl)
                   : launch_mma<T, 64>(grid, st, p, pe, sl);
        return;
    }
    switch (pl.G) {
    case 1:
        launch_one<T, 1, 0>(grid, smem, st, p, pe, sl);
        break;
    case 2:
        launch_one<T, 2, 0>(grid, smem, st, p, pe, sl);
        break;
    case 4:
        launch_one<T, 4, 0>(grid, smem, st, p, pe, sl);
        break;
    default:
        launch_one<T, 8, 0>(grid, smem, st, p, pe, sl);
        break;
    }
}

extern "C" int lkv_attn_decode_cuda(const lkv_decode_args *a, int max_refs_per_seq, void *workspace,
                                    size_t workspace_bytes, void *stream)
{
    if (a == NULL || !shape_ok(&a->shape) || a->layer < 0 || a->layer >= a->shape.n_layers ||
        a->batch < 0 || (a->flags & ~LKV_ATTN_NO_ROTATE) || !isfinite(a->sm_scale) ||
        a->page_bytes < lkv_block_bytes(&a->shape) || a->page_bytes % 16 != 0 ||
        max_refs_per_seq < 0) {
        return LKV_EINVAL;
    }
    if (a->shape.dtype != LKV_DTYPE_BF16 && a->shape.dtype != LKV_DTYPE_F16) {
        return LKV_ENOTSUP;
    }
    if (a->batch == 0) {
        return 0;
    }
    if (a->q == NULL || a->q_pos == NULL || a->out == NULL || a->ref_offset == NULL ||
        (max_refs_per_seq > 0 && (a->refs == NULL || a->arena == NULL))) {
        return LKV_EINVAL;
    }
    lkv__dev_pe pe;
    int rc = lkv__dev_pe_fill(&pe, a->pe, a->shape.head_dim, a->flags);
    if (rc != 0) {
        return rc;
    }
    lkv__dev_slopes sl;
    memset(&sl, 0, sizeof sl);
    if (pe.kind == LKV_POSENC_ALIBI) {
        if (a->pe->n_q_heads < a->shape.n_q_heads) {
            return LKV_EINVAL;
        }
        for (int h = 0; h < a->shape.n_q_heads; h++) {
            sl.s[h] = a->pe->alibi_slope[h];
        }
    }
    decode_plan pl;
    plan_decode(&a->shape, a->batch, max_refs_per_seq, &pl);
    decode_params p;
    memset(&p, 0, sizeof p);
    p.q = a->q;
    p.q_pos = a->q_pos;
    p.arena = (const char *)a->arena;
    p.page_bytes = a->page_bytes;
    p.refs = a->refs;
    p.ref_offset = a->ref_offset;
    p.out = a->out;
    p.lse = a->lse;
    p.n_q = a->shape.n_q_heads;
    p.n_kv = a->shape.n_kv_heads;
    p.group = p.n_q / p.n_kv;
    p.head_chunks = pl.head_chunks;
    p.d = a->shape.head_dim;
    p.L = pl.L;
    p.B = a->shape.block_tokens;
    p.layer = a->layer;
    p.slab_bytes = lkv_slab_bytes(&a->shape);
    p.n_splits = pl.n_splits;
    p.refs_per_split = pl.refs_per_split;
    p.scale_log2 = a->sm_scale * LKV__LOG2E;
    cudaStream_t st = (cudaStream_t)stream;
    if (pl.n_splits > 1) {
        size_t need = lkv_attn_decode_cuda_workspace(&a->shape, a->batch, max_refs_per_seq);
        if (workspace == NULL) {
            workspace = lkv__cuda_ws_get(need);
            if (workspace == NULL) {
                return LKV_ECUDA;
            }
        } else if (workspace_bytes < need) {
            return LKV_EINVAL;
        }
        size_t rows = (size_t)a->batch * p.n_q;
        p.part_o = (float *)workspace;
        p.part_lse = p.part_o + rows * pl.n_splits * p.d;
    }
    if (a->batch > 65535 || pl.n_splits > (1 << 30)) {
        return LKV_EINVAL;
    }
    dim3 grid(pl.n_splits, p.n_kv * pl.head_chunks, a->batch);
    size_t smem =
        ((size_t)pl.G * p.d + 256 + 2 * DEC_WARPS * pl.G + (size_t)DEC_WARPS * pl.G * p.d) *
        sizeof(float);
    if (a->shape.dtype == LKV_DTYPE_BF16) {
        launch_typed<__nv_bfloat16>(pl, grid, smem, st, p, pe, sl);
    } else {
        launch_typed<__half>(pl, grid, smem, st, p, pe, sl);
    }
    LKV__CUDA_CHECK_LAUNCH();
    if (pl.n_splits > 1) {
        return lkv__merge_launch(a->shape.dtype, p.part_o, p.part_lse, a->batch * p.n_q,
                                 pl.n_splits, p.d, a->out, a->lse, st);
    }
    return 0;
}
