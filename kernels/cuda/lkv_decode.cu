/*
 * lkv_decode.cu: LazyAttention decode on CUDA (one query token per sequence, paged KV).
 *
 * Plan, then run (lkv_attn_cuda.h). lkv_decode_plan_create fixes everything that depends only
 * on the batch composition: kernel, grid, split factor (from the SM count and the kernel's
 * occupancy), tables, workspace; lkv_decode_plan_run fills the per-layer pointers and launches
 * one kernel, nothing else, so a model's decode step can be captured in a CUDA graph.
 *
 * Work split. One CTA of W warps per (split, kv head x head chunk, sequence). A head chunk
 * is up to G query heads of one GQA group (so each K/V slab is read once per chunk and shared
 * by its heads; bigger groups, e.g. MQA with 32 heads, take several chunks). A split is a
 * contiguous range of the sequence's block references; inside a CTA, warp w takes references
 * w, w + W, ... of that range, or (tensor-core kernel at 4 warps) the w-th contiguous run of
 * it (dec_walk, the one reference walk of both kernels). When the grid of (kv heads x chunks x
 * sequences) is too small to fill the GPU (batch 1, long context), the references are split
 * over several CTAs (about one wave of resident CTAs, at least DEC_MIN_REFS references per
 * warp) and merged in the same launch: every CTA writes its fp32 partial and counts its
 * arrival on the (sequence, chunk) counter; the last one merges the partials by log-sum-exp
 * and resets the counter (dec_merge_last). The tensor-core kernel's shape is fixed by the
 * plan (kernels/dev/README.md round 7): 8 warps at one CTA per SM when the pairs alone fill
 * half the SMs or more (batch 16 and up), else 4 warps at two CTAs per SM, or at three with
 * a 2-stage ring when a warp has at most DEC_MIN_REFS steps (batch 1 over 4k / 8k).
 *
 * Memory pipeline. Each warp streams its steps (up to 16 tokens of one block for the
 * tensor-core path, U * 32/L for the generic one) through its own ring of cp.async stages
 * (DEC_NST = 3, or 2) in shared memory: the other stages' steps are in flight while one is
 * computed, so the warp never waits on a cold load once the ring is primed (the first version,
 * which loaded K/V straight into registers, reached 2.65 TB/s; kernels/dev/README.md has the
 * history).
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
 * with a new document start. The tensor-core path computes one sincos per pair per warp and
 * shares it through shared memory; its rotation path (none, full-width half-split, full-width
 * interleaved, partial) is a template constant chosen by the plan; it rotates the first
 * document in the prologue, under the first loads, and the next document ahead (a second set
 * of B fragments) as soon as the producer has issued a step of it. Angles use the exact
 * integer offset (hi/lo turns, sincospif) and fp32 math; the softmax scale and log2(e) are folded
 * in. The raw query is kept (fp32 in shared memory in the generic path, 16-bit in registers in
 * the tensor-core one) so rotations never compound. ALiBi adds slope * ((start + block * B + t)
 * - q_pos), exact integers converted once.
 *
 * Softmax: log2 domain, online per step; the running max is uniform over the lanes that share
 * a head, so partial sums are on one scale and are reduced once at the end.
 *
 * Batch-1 latency (ncu on the H200, kernels/dev/README.md rounds 3 and 5): at batch 1 a warp
 * is alone on its scheduler and runs at 7-8 cycles per instruction, so the instruction count
 * of its path is its time: the tensor-core kernel forms every cp.async and ldmatrix address
 * from per-lane constants plus immediates, loads the raw query before the reference chain,
 * accumulates S in two independent MMA chains and stores 4 dims per thread; the kernels declare no
 * static shared memory (it moved the swizzled ring off 128-byte alignment and doubled the L2
 * sector requests of every cp.async); the merge's arrival is one acq_rel atomic per CTA after a
 * barrier, not a fence per thread; in the 4-warp grids each warp walks a contiguous run of
 * references, so only the warps whose run crosses a document start rotate twice. Optional
 * programmatic dependent launch (plan option) lets a run's metadata loads overlap the previous
 * kernel.
 */
#include <stdlib.h>

#include "lkv_cuda_common.cuh"

extern "C" {
#include "lkv_attn_cuda.h"
}

#define GEN_WARPS      4  /* Warps per CTA of the generic kernel. */
#define MMA_WARPS      4  /* Warps per CTA of the tensor-core kernel (8 for large grids). */
#define DEC_NST        3  /* cp.async stages per warp (2 in flight while one is computed) */
#define MERGE_INFLIGHT 16 /* partial loads in flight per thread in the folded merge */
/* At least this many references per warp in a split. 2 gave 32 splits at batch 1 over 4k; 4
 * gives 16, measured faster on the H200 (2026-12-01: 16.3 against 19.0 us single launch, 12.7
 * against 15.8 us per layer in a 32-layer graph), the same at 32k (51.3 us, 32 splits). */
#define DEC_MIN_REFS   4
#define DEC_MAX_SPLITS 1024 /* Splits per sequence at most (the merge weights live in smem). */

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
    int *counters;   /* [batch][n_kv * head_chunks] arrivals (n_splits > 1), zero between runs. */
    int n_q, n_kv, group, head_chunks, d, L, B, layer;
    uint64_t slab_bytes;
    int n_splits, refs_per_split;
    int pdl;          /* Launched with programmatic dependent launch (plan option). */
    int contig;       /* Tensor-core kernel: contiguous reference runs per warp (else strided). */
    float scale_log2; /* sm_scale * log2(e). */
};

template <int G> struct dec_unroll {
    static const int U = G >= 8 ? 4 : 8; /* Loads of K (and V) per lane per step. */
};

/* The reference walk of one warp, shared by both decode kernels: warp w of a CTA takes the
 * references r_first, r_first + W, ... below r_end, each in steps of `step` tokens (the last
 * step of a partial block is masked by the consumer). Each reference is loaded from global
 * memory exactly once, one reference ahead of its use (the load is off the critical path), and
 * travels with its step through the cp.async ring (dec_queue): the consumer never reloads it. */
struct dec_walk {
    const uint64_t *refs;
    int r, r1, stride, t0;
    uint64_t cur, nxt;
    __device__ __forceinline__ void init(const uint64_t *rf, int first, int end, int w)
    {
        refs = rf;
        r = first;
        r1 = end;
        stride = w;
        t0 = 0;
        cur = r < r1 ? __ldg(refs + r) : 0;
        nxt = r + w < r1 ? __ldg(refs + r + w) : 0;
    }
    /* Takes the next step: returns its first token and sets *ref, or returns -1 at the end. */
    __device__ __forceinline__ int take(int step, int B, uint64_t *ref)
    {
        if (r >= r1) {
            return -1;
        }
        const int tt = t0;
        *ref = cur;
        t0 += step;
        if (t0 >= min((int)lkv_ref_valid(cur), B)) {
            t0 = 0;
            r += stride;
            cur = nxt;
            if (r + stride < r1) {
                nxt = __ldg(refs + r + stride);
            }
        }
        return tt;
    }
};

/* The steps in flight in a warp's ring, oldest first (NST - 1 of them between the
 * producer's issue and the consumer's wait): reference and first token (-1: no step). Plain
 * registers shifted at each step, so no run-time indexed array. */
template <int NST> struct dec_queue {
    uint64_t ref[NST - 1];
    int t0[NST - 1];
    __device__ __forceinline__ void push_pop(uint64_t r_in, int t_in, uint64_t *r_out, int *t_out)
    {
        *r_out = ref[0];
        *t_out = t0[0];
#pragma unroll
        for (int i = 0; i + 1 < NST - 1; i++) {
            ref[i] = ref[i + 1];
            t0[i] = t0[i + 1];
        }
        ref[NST - 2] = r_in;
        t0[NST - 2] = t_in;
    }
};

/* Epilogue shared by both decode kernels (call after __syncthreads): merges the W warps'
 * partial softmax states (mw: running max, lw: sum, accw: output, log2 domain) of the nh heads
 * of this CTA and writes the result: out (+ lse) when the CTA owns the whole sequence, else
 * this split's partial output and log2 sum (dec_merge_last merges them). */
template <typename T, int G, int W>
static __device__ __forceinline__ void dec_store(const decode_params &p, const float *mw,
                                                 const float *lw, const float *accw, float *scr,
                                                 int nh, int d, int b, int h0, int split)
{
    /* Per head, once: the common max, each warp's scale, the reciprocal of the total sum and
     * the log2 sum (scr: [W][G] scales, then [G][2] reciprocal and lse2; shared memory not
     * otherwise in use here), so the loop over the elements is a few FMAs and a store. */
    for (int h = threadIdx.x; h < nh; h += blockDim.x) {
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; w++) {
            M = fmaxf(M, mw[w * G + h]);
        }
        float ls = 0.0f;
#pragma unroll
        for (int w = 0; w < W; w++) {
            const float sc = M == -INFINITY ? 0.0f : exp2f(mw[w * G + h] - M);
            scr[w * G + h] = sc;
            ls += lw[w * G + h] * sc;
        }
        scr[W * G + 2 * h] = ls > 0.0f ? 1.0f / ls : 0.0f;
        scr[W * G + 2 * h + 1] = ls > 0.0f ? M + log2f(ls) : -INFINITY;
    }
    __syncthreads();
    /* Four consecutive dims per thread and item (d % 8 == 0): 16-byte loads of the warps'
     * partials, one 8- or 16-byte store. */
    const int d4 = d / 4;
    for (int i = threadIdx.x; i < nh * d4; i += blockDim.x) {
        const int h = i / d4, dim = 4 * (i - h * d4);
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < W; w++) {
            const float4 a = *(const float4 *)(accw + (w * G + h) * d + dim);
            const float sc = scr[w * G + h];
            o = make_float4(fmaf(a.x, sc, o.x), fmaf(a.y, sc, o.y), fmaf(a.z, sc, o.z),
                            fmaf(a.w, sc, o.w));
        }
        const float inv = scr[W * G + 2 * h], lse2 = scr[W * G + 2 * h + 1];
        o = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
        const size_t row = (size_t)b * p.n_q + h0 + h;
        if (p.n_splits == 1) {
            *(uint2 *)((T *)p.out + row * d + dim) =
                make_uint2(lkv__elem<T>::pack2(o.x, o.y), lkv__elem<T>::pack2(o.z, o.w));
            if (dim == 0 && p.lse != NULL) {
                p.lse[row] = lse2 * LKV__LN2;
            }
        } else {
            *(float4 *)(p.part_o + (row * p.n_splits + split) * d + dim) = o;
            if (dim == 0) {
                p.part_lse[row * p.n_splits + split] = lse2;
            }
        }
    }
}

/* Stages the chunk's query rows (n valid elements, 16-byte aligned, n % 8 == 0) into q_raw as
 * fp32, zero up to n_all: one 16-byte load per 8 elements, all in flight at once (a scalar loop
 * here was the longest wait of the batch-1 kernel: ncu, 29% of the stall samples). */
template <typename T>
static __device__ __forceinline__ void dec_stage_q(const T *q, float *q_raw, int n, int n_all)
{
    for (int i = 8 * (int)threadIdx.x; i < n_all; i += 8 * (int)blockDim.x) {
        float f[8];
        if (i < n) {
            const uint4 u = __ldg((const uint4 *)(q + i));
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float2 x = lkv__elem<T>::to_f2(w[k]);
                f[2 * k] = x.x;
                f[2 * k + 1] = x.y;
            }
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) {
                f[k] = 0.0f;
            }
        }
        *(float4 *)(q_raw + i) = make_float4(f[0], f[1], f[2], f[3]);
        *(float4 *)(q_raw + i + 4) = make_float4(f[4], f[5], f[6], f[7]);
    }
}

/* Split-KV merge folded into the decode launch. Every CTA of a split sequence has written its
 * partial (dec_store); each then counts its arrival on the (sequence, kv head chunk) counter,
 * and the last to arrive merges the n_splits partials of its nh rows by log-sum-exp, writes
 * out (+ lse) and resets the counter to 0 for the next launch. The partials are read through
 * L2 (ld.global.cg): they were written by other SMs in this launch. sm: the CTA's dynamic
 * shared memory, free again (the caller synchronised after its last use), at least
 * (4 + G * n_splits + 2 * G + 4 * NT) floats (the plan checks it). */
template <typename T, int G, int NT>
static __device__ __forceinline__ void dec_merge_last(const decode_params &p, float *sm, int nh,
                                                      int d, int b, int h0)
{
    /* No static __shared__ here: it would shift the dynamic shared memory off its 128-byte
     * alignment, and the swizzled cp.async ring then split every 32-byte sector into two L2
     * requests (ncu: L2 hit rate 50%, 2x sectors, -15% bandwidth). The flag lives at sm[0]. */
    int &is_last = *(int *)sm;
    /* The barrier orders every thread's partial stores before thread 0's arrival, whose
     * acq_rel atomic releases them device-wide (cumulativity, as CUTLASS's semaphore) and, in
     * the last CTA, acquires the other CTAs' partials; the second barrier passes that on. */
    __syncthreads();
    int *ctr = p.counters + (size_t)b * gridDim.y + blockIdx.y;
    if (threadIdx.x == 0) {
        int prev;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n"
                     : "=r"(prev)
                     : "l"(ctr)
                     : "memory");
        is_last = prev == p.n_splits - 1;
    }
    __syncthreads();
    if (!is_last) {
        return;
    }
    const int S = p.n_splits;
    const size_t row0 = (size_t)b * p.n_q + h0;
    float *w = sm + 4;                                        /* [nh][S] weights */
    float *stat = w + G * S;                                  /* [G][2]: max, sum */
    float4 *red = (float4 *)(w + ((G * S + 2 * G + 3) & ~3)); /* [NT] group sums */
    for (int i = threadIdx.x; i < nh * S; i += NT) {
        w[i] = __ldcg(p.part_lse + row0 * S + i);
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int h = warp; h < nh; h += NT / 32) {
        float m = -INFINITY;
        for (int s = lane; s < S; s += 32) {
            m = fmaxf(m, w[h * S + s]);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        }
        float sum = 0.0f;
        if (m != -INFINITY) {
            for (int s = lane; s < S; s += 32) {
                sum += exp2f(w[h * S + s] - m);
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            sum += __shfl_xor_sync(0xffffffffu, sum, off);
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        __syncwarp();
        for (int s = lane; s < S; s += 32) {
            w[h * S + s] = m == -INFINITY ? 0.0f : exp2f(w[h * S + s] - m) * inv;
        }
        if (lane == 0) {
            stat[2 * h] = m;
            stat[2 * h + 1] = sum;
        }
    }
    __syncthreads();
    /* Items are (head, float4 of dims); when there are fewer items than threads, ng groups of
     * threads take interleaved splits of each item and their sums are added through smem. */
    const int q4 = d / 4, items = nh * q4;
    const int ng = items < NT ? NT / items : 1;
    for (int t = threadIdx.x; t < items * ng; t += NT) {
        const int it = t % items, g = t / items;
        const int h = it / q4, c = it - h * q4;
        const float4 *po = (const float4 *)(p.part_o + (row0 + h) * S * d) + c;
        const float *wh = w + h * S;
        float4 a0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int s0 = g; s0 < S; s0 += MERGE_INFLIGHT * ng) {
            float4 v[MERGE_INFLIGHT]; /* independent L2 loads in flight */
            float ws[MERGE_INFLIGHT];
#pragma unroll
            for (int u = 0; u < MERGE_INFLIGHT; u++) {
                const int s = s0 + u * ng;
                v[u] = s < S ? __ldcg(po + (size_t)s * q4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                ws[u] = s < S ? wh[s] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < MERGE_INFLIGHT; u++) {
                a0.x = fmaf(ws[u], v[u].x, a0.x);
                a0.y = fmaf(ws[u], v[u].y, a0.y);
                a0.z = fmaf(ws[u], v[u].z, a0.z);
                a0.w = fmaf(ws[u], v[u].w, a0.w);
            }
        }
        if (ng == 1) {
            uint2 o2 = make_uint2(lkv__elem<T>::pack2(a0.x, a0.y), lkv__elem<T>::pack2(a0.z, a0.w));
            *(uint2 *)((T *)p.out + (row0 + h) * d + 4 * c) = o2;
        } else {
            red[t] = a0;
        }
    }
    if (ng > 1) {
        __syncthreads();
        for (int it = threadIdx.x; it < items; it += NT) {
            const int h = it / q4, c = it - h * q4;
            float4 a = red[it];
            for (int g = 1; g < ng; g++) {
                const float4 v = red[g * items + it];
                a = make_float4(a.x + v.x, a.y + v.y, a.z + v.z, a.w + v.w);
            }
            uint2 o2 = make_uint2(lkv__elem<T>::pack2(a.x, a.y), lkv__elem<T>::pack2(a.z, a.w));
            *(uint2 *)((T *)p.out + (row0 + h) * d + 4 * c) = o2;
        }
    }
    if (p.lse != NULL && (int)threadIdx.x < nh) {
        const float m = stat[2 * threadIdx.x], sum = stat[2 * threadIdx.x + 1];
        p.lse[row0 + threadIdx.x] =
            (m == -INFINITY || !(sum > 0.0f)) ? -INFINITY : (m + log2f(sum)) * LKV__LN2;
    }
    if (threadIdx.x == 0) {
        *ctr = 0; /* Ready for the next launch (kernel boundaries order it). */
    }
}

/* Common tail of both kernels: store (out or partial), then the folded merge when split. */
template <typename T, int G, int W>
static __device__ __forceinline__ void
dec_finish(const decode_params &p, float *smem, const float *mw, const float *lw, const float *accw,
           float *scr, int nh, int d, int b, int h0, int split)
{
    dec_store<T, G, W>(p, mw, lw, accw, scr, nh, d, b, h0, split);
    if (p.n_splits > 1) {
        dec_merge_last<T, G, W * 32>(p, smem, nh, d, b, h0);
    }
}

template <typename T, int G, int LT>
__global__ void __launch_bounds__(GEN_WARPS * 32)
    decode_kernel(const decode_params p, const lkv__dev_pe pe, const lkv__dev_slopes sl)
{
    constexpr int W = GEN_WARPS;
    /* Programmatic dependent launch (plan option): let the next kernel of the stream start its
     * prologue now; wait for the previous one before reading anything it may have written. */
    lkv__pdl_trigger();
    lkv__pdl_wait();
    constexpr int U = dec_unroll<G>::U;
    extern __shared__ __align__(128) float smem[];
    const int L = LT ? LT : p.L;
    const int TPI = 32 / L;
    const int d = p.d;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rg = lane / L, cl = lane % L;
    const int split = blockIdx.x, b = blockIdx.z;
    const int kvh = blockIdx.y / p.head_chunks, hchunk = blockIdx.y % p.head_chunks;
    const int h0 = kvh * p.group + hchunk * G;
    const int nh = min(G, p.group - hchunk * G);

    float *q_raw = smem;        /* [G][d] */
    float *fhi = q_raw + G * d; /* [128] */
    float *flo = fhi + 128;     /* [128] */
    float *mw = flo + 128;      /* [W][G] */
    float *lw = mw + W * G;     /* [W][G] */
    float *accw = lw + W * G;   /* [W][G][d] */

    dec_stage_q<T>((const T *)p.q + ((size_t)b * p.n_q + h0) * d, q_raw, nh * d, G * d);
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
    uint4 *ring = (uint4 *)(accw + W * G * d) + (size_t)warp * DEC_NST * 2 * U * 32;
    const int step = U * TPI;

    /* Producer: the warp's reference walk; each issued step travels through the queue. */
    dec_walk wk;
    wk.init(p.refs, r0 + warp, r1, W);
    dec_queue<DEC_NST> qu;
    int pslot = 0;
    auto issue = [&](uint64_t *ref_out, int *t_out) {
        uint64_t pref = 0;
        const int pt0 = wk.take(step, p.B, &pref);
        if (pt0 >= 0) {
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
        }
        lkv__cp_async_commit();
        pslot = pslot + 1 == DEC_NST ? 0 : pslot + 1;
        *ref_out = pref;
        *t_out = pt0;
    };
#pragma unroll
    for (int s = 0; s < DEC_NST - 1; s++) {
        issue(&qu.ref[s], &qu.t0[s]);
    }

    int64_t cur_start = -1;
    int cslot = 0;
    for (;;) {
        uint64_t nref, ref;
        int nt0, t0;
        issue(&nref, &nt0);
        qu.push_pop(nref, nt0, &ref, &t0);
        if (t0 < 0) {
            break;
        }
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
        {
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
    dec_finish<T, G, W>(p, smem, mw, lw, accw, q_raw, nh, d, b, h0, split);
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

/* Loads this lane's raw query values (head gq of the chunk when hv, else zeros): the pairs of
 * dims kk*16 + 2tq (+8) of every block kk, exactly the B-fragment elements it rotates and, for
 * full-width RoPE, their partners. */
template <typename T, int D>
static __device__ __forceinline__ void dec_load_q(const T *qg, bool hv, int tq,
                                                  uint32_t (&qraw)[D / 16][2])
{
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            qraw[kk][e2] = hv ? __ldg((const unsigned int *)(qg + kk * 16 + 2 * tq + e2 * 8)) : 0u;
        }
    }
}

/* How the tensor-core kernel rotates its query, fixed by the plan (a template constant: each
 * kernel carries one rotation path; four inlined paths per call site made the batch-1 kernel
 * 15k instructions long, and its warps waited on instruction fetch, ncu 2026-12-01). */
enum {
    DEC_RM_NONE = 0,  /* no RoPE (none, ALiBi, LKV_ATTN_NO_ROTATE): scale only */
    DEC_RM_HALF = 1,  /* half-split pairs over the whole head (Llama) */
    DEC_RM_INTER = 2, /* interleaved pairs over the whole head (GPT-J) */
    DEC_RM_PART = 3,  /* partial rotary, either pairing */
};

/* Rotates the chunk's raw query by q_pos - start, scales it by sc and rounds it once to 16 bits
 * into this lane's Q^T B fragments qb (head gq; dims kk*16 + 2tq + {0,1} and +8). The warp's
 * lanes share the angles: one sincos per pair, scaled by sc, through the warp's csw ([D/2][2]
 * cos, sin). Call with the whole warp. */
template <typename T, int D, int RM>
static __device__ __forceinline__ void
dec_rotate_q(const lkv__dev_pe &pe, float *csw, const uint32_t (&qraw)[D / 16][2], const T *qg,
             bool hv, int lane, int tq, int64_t pos, int64_t start, float sc,
             uint32_t (&qb)[D / 16][2])
{
    if (RM == DEC_RM_NONE) {
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) {
                const float2 x = lkv__elem<T>::to_f2(qraw[kk][e2]);
                qb[kk][e2] = lkv__elem<T>::pack2(x.x * sc, x.y * sc);
            }
        }
        return;
    }
    const float delta = (float)(pos - start);
    for (int j = lane; j < pe.n_pairs; j += 32) {
        float s, c;
        lkv__turn_sincos_fast(delta, pe.freq_hi[j], pe.freq_lo[j], &s, &c);
        *(float2 *)(csw + 2 * j) = make_float2(c * sc, s * sc);
    }
    __syncwarp();
    if (RM == DEC_RM_HALF) {
        /* Dims i < D/2 pair with i + D/2: the fragments of blocks kk and kk + D/32 rotate
         * together. */
#pragma unroll
        for (int kk = 0; kk < D / 32; kk++) {
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) {
                const int i = kk * 16 + 2 * tq + e2 * 8;
                const float2 x = lkv__elem<T>::to_f2(qraw[kk][e2]);
                const float2 xp = lkv__elem<T>::to_f2(qraw[kk + D / 32][e2]);
                const float4 cs = *(const float4 *)(csw + 2 * i); /* c0 s0 c1 s1 */
                qb[kk][e2] = lkv__elem<T>::pack2(fmaf(-xp.x, cs.y, x.x * cs.x),
                                                 fmaf(-xp.y, cs.w, x.y * cs.z));
                qb[kk + D / 32][e2] =
                    lkv__elem<T>::pack2(fmaf(x.x, cs.y, xp.x * cs.x), fmaf(x.y, cs.w, xp.y * cs.z));
            }
        }
    } else if (RM == DEC_RM_INTER) {
        /* A lane's two adjacent dims (2tq, 2tq + 1) of a fragment are one pair. */
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) {
                const int i = kk * 16 + 2 * tq + e2 * 8;
                const float2 x = lkv__elem<T>::to_f2(qraw[kk][e2]);
                const float2 cs = *(const float2 *)(csw + i); /* pair i / 2: c, s */
                qb[kk][e2] =
                    lkv__elem<T>::pack2(fmaf(-x.y, cs.y, x.x * cs.x), fmaf(x.x, cs.y, x.y * cs.x));
            }
        }
    } else {
        /* Partial rotary: a partner may sit outside this lane's values; read it from the
         * query in global memory (L1/L2 resident; rare configurations). */
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) {
                const float2 x = lkv__elem<T>::to_f2(qraw[kk][e2]);
                float v[2];
#pragma unroll
                for (int e1 = 0; e1 < 2; e1++) {
                    const int i = kk * 16 + 2 * tq + e2 * 8 + e1;
                    int pair = 0, partner = i;
                    const int role = lkv__pair_of(i, pe.pairing, pe.n_pairs, &pair, &partner);
                    float sn = 0.0f, cs = sc, xp = 0.0f;
                    if (role != 0) {
                        cs = csw[2 * pair];
                        sn = csw[2 * pair + 1];
                        xp = hv ? lkv__elem<T>::to_f(qg[partner]) : 0.0f;
                    }
                    const float xi = e1 ? x.y : x.x;
                    v[e1] = fmaf(xp, role > 0 ? -sn : sn, xi * cs);
                }
                qb[kk][e2] = lkv__elem<T>::pack2(v[0], v[1]);
            }
        }
    }
    __syncwarp(); /* csw is rewritten at the next rotation. */
}

template <typename T, int D, int NST, int RM, int W>
__global__ void __launch_bounds__(W * 32)
    decode_mma_kernel(const decode_params p, const lkv__dev_pe pe, const lkv__dev_slopes sl)
{
    static_assert(8 * D <= 8 * W * 32, "one 16-byte query load per thread");
    lkv__pdl_trigger(); /* The next kernel of the stream may start its prologue (plan option). */
    constexpr int G = 8;
    constexpr int STAGE = 2 * 16 * D; /* elements of K then V rows of one step */
    constexpr int RB = D * 2;         /* bytes of one K (V) row */
    constexpr int CPR = D / 8;        /* 16-byte chunks per row */
    constexpr int RPI = 32 / CPR;     /* rows per warp-wide copy instruction */
    constexpr int XP = 8 / RPI;       /* period of the row swizzle over those instructions */
    extern __shared__ __align__(128) float smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gq = lane >> 2, tq = lane & 3; /* mma fragment coordinates */
    const int split = blockIdx.x, b = blockIdx.z;
    const int kvh = blockIdx.y / p.head_chunks, hchunk = blockIdx.y % p.head_chunks;
    const int h0 = kvh * p.group + hchunk * G;
    const int nh = min(G, p.group - hchunk * G);

    float *q_raw = smem;                        /* [G][D] */
    float *fhi = q_raw + G * D;                 /* [128] */
    float *flo = fhi + 128;                     /* [128] */
    float *mw = flo + 128;                      /* [W][G] */
    float *lw = mw + W * G;                     /* [W][G] */
    float *csw = lw + W * G + (size_t)warp * D; /* [W][D/2][2] cos, sin per pair */
    T *ring0 = (T *)(lw + W * G + W * D);       /* [W][NST][STAGE] */
    float *accw = (float *)ring0;               /* [W][G][D], reuses the ring after the loop */
    const uint32_t ring_s = lkv__smem_u32(ring0 + (size_t)warp * NST * STAGE);

    /* The raw query first (this lane's B-fragment values, straight into registers, no shared
     * staging and no barrier): it does not depend on the latency chain of batch 1 (q_pos,
     * ref_offset -> refs -> the first K/V loads), so it lands while that chain is in flight
     * and the first rotation below is done before the first K/V step arrives. Under
     * programmatic dependent launch the previous kernel may write it: loaded after the wait. */
    const bool hv = gq < nh;
    const T *qg = (const T *)p.q + ((size_t)b * p.n_q + h0 + (hv ? gq : 0)) * D;
    uint32_t qraw[D / 16][2];
    if (!p.pdl) {
        dec_load_q<T, D>(qg, hv, tq, qraw);
    }
    const int64_t pos = p.q_pos[b];
    const int rend = p.ref_offset[b + 1];
    const int r0 = p.ref_offset[b] + split * p.refs_per_split;
    const int r1 = split == p.n_splits - 1 ? rend : min(rend, r0 + p.refs_per_split);
    const size_t slab_k = ((size_t)(p.layer * 2) * p.n_kv + kvh) * p.slab_bytes;
    const size_t slab_kv = (size_t)p.n_kv * p.slab_bytes; /* from a K slab to its V slab */
    const bool alibi = pe.kind == LKV_POSENC_ALIBI;

    /* Producer: the warp's reference walk; cp.async of step (reference, tokens pt0 .. pt0 +
     * 15) into the ring; each issued step travels through the queue to the consumer. Copy
     * instruction i moves rows RPI*i + cq, chunk cc: the global address is one per-lane base
     * plus a constant, the shared one (XOR swizzle, dswz) one of XP per-lane values plus a
     * constant, so a full step is 2 * 16 * D / 256 copies and a handful of adds. */
    const int cq = lane / CPR, cc = lane % CPR;
    uint32_t sx[XP];
#pragma unroll
    for (int j = 0; j < XP; j++) {
        sx[j] = (uint32_t)(cq * RB) + ((uint32_t)(cc ^ cq ^ (RPI * j)) << 4);
    }
    dec_walk wk;
    if (!p.contig) {
        wk.init(p.refs, r0 + warp, r1, W);
    } else {
        /* Contiguous: warp w takes the w-th run of ceil(n / W) references of the split, so it
         * meets one document start per document it touches; striding by W made every warp of
         * the CTA meet (and rotate for) every document of the split. The plan takes it for the
         * 4-warp batch-1 grids (H200, round 7: 10.9 against 11.5 us per layer in the 32-layer
         * graph at 4k, rotation +0.2 us instead of +0.5), not for the 8-warp grids, where the
         * strided walk was 1-3% faster (batch 16 at 8k / 32k, batch 64 and 128 at 4k). */
        const int pw = (max(r1 - r0, 0) + W - 1) / W, f = r0 + warp * pw;
        wk.init(p.refs, f, min(r1, f + pw), 1);
    }
    dec_queue<NST> qu;
    int pslot = 0;
    auto issue = [&](uint64_t *ref_out, int *t_out) {
        uint64_t pref = 0;
        const int pt0 = wk.take(16, p.B, &pref);
        if (pt0 >= 0) {
            const int lim = min((int)lkv_ref_valid(pref), p.B) - pt0; /* valid rows, >= 1 */
            const char *gk = p.arena + (size_t)lkv_ref_page(pref) * p.page_bytes + slab_k +
                             (size_t)(pt0 + cq) * RB + cc * 16;
            const char *gv = gk + slab_kv;
            const uint32_t st = ring_s + (uint32_t)(pslot * STAGE * 2);
            if (lim >= 16) {
#pragma unroll
                for (int i = 0; i < 16 / RPI; i++) {
                    const uint32_t d = st + sx[i % XP] + RPI * i * RB;
                    lkv__cp_async16_s(d, gk + RPI * i * RB, true);
                    lkv__cp_async16_s(d + 16 * RB, gv + RPI * i * RB, true);
                }
            } else { /* Partial block: rows >= lim are zero-filled (their source not read). */
#pragma unroll
                for (int i = 0; i < 16 / RPI; i++) {
                    const bool ok = RPI * i + cq < lim;
                    const int off = ok ? RPI * i * RB : -cq * RB; /* row pt0 when not read */
                    const uint32_t d = st + sx[i % XP] + RPI * i * RB;
                    lkv__cp_async16_s(d, gk + off, ok);
                    lkv__cp_async16_s(d + 16 * RB, gv + off, ok);
                }
            }
        }
        lkv__cp_async_commit();
        pslot = pslot + 1 == NST ? 0 : pslot + 1;
        *ref_out = pref;
        *t_out = pt0;
    };
    /* Under programmatic dependent launch the metadata loads above (q_pos, ref_offset, the
     * first references) overlap the previous kernel's tail; everything below (K/V, q, the
     * workspace, out) waits for it to complete. Without the launch attribute: a no-op. */
    lkv__pdl_wait();
    if (p.pdl) {
        dec_load_q<T, D>(qg, hv, tq, qraw);
    }
#pragma unroll
    for (int s = 0; s < NST - 1; s++) {
        issue(&qu.ref[s], &qu.t0[s]);
    }

    /* Two rotated queries: qb for the document being consumed (cur_start), qb2 for the next
     * one the producer has seen (start2, -1 when none), rotated when its first step is issued,
     * i.e. while earlier steps are in flight, so that a document change does not put the
     * sincos and the fragment build between a landed step and its first MMA. In the prologue
     * (under the first loads) the warp rotates its first document and the next one if it is
     * already in sight: the queued steps and the walk's next reference. One rotation call
     * site there and one in the loop (each inlines the rotation). */
    const float sc = p.scale_log2;
    uint32_t qb[D / 16][2];  /* Q^T B fragments: head gq, dims kk*16 + 2tq + {0,1} and +8 */
    uint32_t qb2[D / 16][2]; /* The same for start2. */
    float o[D / 16][4];      /* O^T accumulators: dims mt*16 + gq (+8), heads 2tq + {0,1} */
#pragma unroll
    for (int mt = 0; mt < D / 16; mt++) {
        o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
        qb[mt][0] = qb[mt][1] = qb2[mt][0] = qb2[mt][1] = 0u;
    }
    int64_t cur_start = -1, start2 = -1;
    if (qu.t0[0] >= 0) {
        cur_start = lkv_ref_start(qu.ref[0]);
        dec_rotate_q<T, D, RM>(pe, csw, qraw, qg, hv, lane, tq, pos, cur_start, sc, qb);
        int64_t nx = wk.r < wk.r1 ? (int64_t)lkv_ref_start(wk.cur) : -1;
#pragma unroll
        for (int s = NST - 2; s >= 1; s--) { /* the earliest other start in sight wins */
            const int64_t st = qu.t0[s] >= 0 ? (int64_t)lkv_ref_start(qu.ref[s]) : -1;
            nx = st >= 0 && st != cur_start ? st : nx;
        }
        if (nx >= 0 && nx != cur_start) {
            dec_rotate_q<T, D, RM>(pe, csw, qraw, qg, hv, lane, tq, pos, nx, sc, qb2);
            start2 = nx;
        }
    }

    /* This lane's two head columns of S^T / O^T. */
    float slope[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int h = 2 * tq + e;
        slope[e] = (alibi && h < nh) ? sl.s[h0 + h] * LKV__LOG2E : 0.0f;
    }
    /* ldmatrix row addresses of this lane (dswz): K block kk at st + ka + (kx ^ 32 kk), V
     * block mt at st + va + (vx ^ 32 mt). */
    const int mm = lane >> 3, r7 = lane & 7;
    const uint32_t ka = (uint32_t)(((mm & 1) * 8 + r7) * RB);
    const uint32_t kx = (uint32_t)(((mm >> 1) ^ r7) << 4);
    const uint32_t va = (uint32_t)(16 * RB + ((mm >> 1) * 8 + r7) * RB);
    const uint32_t vx = (uint32_t)(((mm & 1) ^ r7) << 4);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int cslot = 0;
    for (;;) {
        uint64_t nref, ref;
        int nt0, t0;
        issue(&nref, &nt0);
        qu.push_pop(nref, nt0, &ref, &t0);
        if (t0 < 0) {
            break;
        }
        const int64_t start = lkv_ref_start(ref);
        const int blk = (int)lkv_ref_block(ref);
        const int valid = min((int)lkv_ref_valid(ref), p.B);
        /* A new document: take qb2 when it was rotated ahead, else rotate now. Otherwise
         * rotate the next document ahead once the producer has issued a step of it. */
        bool now = false;
        int64_t rs = -1;
        if (start != cur_start) {
            cur_start = start;
            if (start == start2) {
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++) {
                    qb[kk][0] = qb2[kk][0];
                    qb[kk][1] = qb2[kk][1];
                }
                start2 = -1;
            } else {
                now = true;
                rs = start;
            }
        }
        if (!now && start2 < 0 && nt0 >= 0 && (int64_t)lkv_ref_start(nref) != cur_start) {
            rs = lkv_ref_start(nref);
        }
        if (rs >= 0) {
            dec_rotate_q<T, D, RM>(pe, csw, qraw, qg, hv, lane, tq, pos, rs, sc, qb2);
            if (now) { /* qb2 is taken: whatever was rotated ahead into it is gone */
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++) {
                    qb[kk][0] = qb2[kk][0];
                    qb[kk][1] = qb2[kk][1];
                }
                start2 = -1;
            } else {
                start2 = rs;
            }
        }
        const float kbias = alibi ? (float)(start + (int64_t)blk * p.B - pos) : 0.0f;
        {
            lkv__cp_async_wait<NST - 1>();
            __syncwarp();
            const uint32_t st = ring_s + (uint32_t)(cslot * STAGE * 2);
            cslot = cslot + 1 == NST ? 0 : cslot + 1;
            /* S^T = K Q^T, as two independent accumulation chains (even and odd k blocks):
             * half the dependent MMA latency before the softmax. */
            float sacc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sacc2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t a[4];
                lkv__ldsm_x4_s(a[0], a[1], a[2], a[3], st + ka + (kx ^ (uint32_t)(32 * kk)));
                lkv__mma<T>::run((kk & 1) ? sacc2 : sacc, a, qb[kk][0], qb[kk][1]);
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                sacc[e] += sacc2[e];
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
            /* O^T = alpha O^T + V^T P^T; the rescale only when a running max moved in the
             * warp (alpha == 1 everywhere otherwise: a vote instead of 2 D / 4 multiplies). */
            if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
                for (int mt = 0; mt < D / 16; mt++) {
                    o[mt][0] *= alpha[0];
                    o[mt][1] *= alpha[1];
                    o[mt][2] *= alpha[0];
                    o[mt][3] *= alpha[1];
                }
            }
#pragma unroll
            for (int mt = 0; mt < D / 16; mt++) {
                uint32_t a[4];
                lkv__ldsm_x4_t_s(a[0], a[1], a[2], a[3], st + va + (vx ^ (uint32_t)(32 * mt)));
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
    dec_finish<T, G, W>(p, smem, mw, lw, accw, q_raw, nh, D, b, h0, split);
}

/* ------------------------------------------------------------------------------------------
 * Host side: the plan (kernel choice, grid, split factor, tables, workspace layout) and the
 * launchers. plan_fill does all host work and no CUDA call except device queries and the
 * kernel attributes; lkv_decode_plan_run only fills the per-run pointers and launches.
 * ---------------------------------------------------------------------------------------- */

typedef void (*dec_launch_fn)(dim3 grid, size_t smem, cudaStream_t st, int pdl,
                              const decode_params &p, const lkv__dev_pe &pe,
                              const lkv__dev_slopes &sl);

/* Launches kernel k, with the programmatic-stream-serialization attribute when pdl (errors
 * surface through cudaGetLastError, as for <<< >>>). */
template <typename K>
static void launch_ex(K k, dim3 grid, int threads, size_t smem, cudaStream_t st, int pdl,
                      const decode_params &p, const lkv__dev_pe &pe, const lkv__dev_slopes &sl)
{
    if (!pdl) {
        k<<<grid, threads, smem, st>>>(p, pe, sl);
        return;
    }
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = dim3(threads);
    c.dynamicSmemBytes = smem;
    c.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at;
    c.numAttrs = 1;
    (void)cudaLaunchKernelEx(&c, k, p, pe, sl);
}

template <typename T, int G, int LT>
static void launch_gen(dim3 grid, size_t smem, cudaStream_t st, int pdl, const decode_params &p,
                       const lkv__dev_pe &pe, const lkv__dev_slopes &sl)
{
    launch_ex(decode_kernel<T, G, LT>, grid, GEN_WARPS * 32, smem, st, pdl, p, pe, sl);
}

template <typename T, int D, int NST, int RM, int W>
static void launch_mma(dim3 grid, size_t smem, cudaStream_t st, int pdl, const decode_params &p,
                       const lkv__dev_pe &pe, const lkv__dev_slopes &sl)
{
    launch_ex(decode_mma_kernel<T, D, NST, RM, W>, grid, W * 32, smem, st, pdl, p, pe, sl);
}

struct lkv_decode_plan {
    lkv_kv_shape shape;
    int batch, max_refs;
    int mma, G, head_chunks, L, n_splits, refs_per_split, threads;
    int nst;                 /* cp.async stages per warp of the tensor-core kernel: 3 or 2. */
    int warps;               /* Warps per CTA of the tensor-core kernel: 4 or 8. */
    int pdl;                 /* Launch with programmatic dependent launch (cfg->pdl). */
    size_t smem;             /* Dynamic shared memory per CTA. */
    size_t off_lse, off_ctr; /* Workspace layout: part_o at 0, part_lse, counters. */
    size_t ws_need;          /* Workspace bytes (0 when n_splits == 1). */
    size_t n_ctr;            /* Counters: batch * n_kv * head_chunks. */
    const void *kernel;      /* The kernel function (attributes, occupancy). */
    dec_launch_fn launch;
    decode_params base; /* Everything but the per-run pointers. */
    lkv__dev_pe pe;
    lkv__dev_slopes sl;
    void *ws;     /* Workspace (device). */
    int ws_owned; /* The plan allocated ws. */
};

static int pow2_at_least(int x)
{
    int p = 1;
    while (p < x) {
        p <<= 1;
    }
    return p;
}

static int shape_ok(const lkv_kv_shape *s)
{
    return s->n_layers >= 1 && s->n_q_heads >= 1 && s->n_q_heads <= LKV_MAX_Q_HEADS &&
           s->n_kv_heads >= 1 && s->n_q_heads % s->n_kv_heads == 0 && s->head_dim >= 8 &&
           s->head_dim <= LKV_MAX_HEAD_DIM && s->head_dim % 8 == 0 && s->block_tokens >= 1 &&
           s->block_tokens <= LKV_MAX_BLOCK_TOKENS;
}

/* The tensor-core kernel configurations (warps per CTA x ring stages; kernels/dev/README.md
 * round 7): 4 x 3 (two CTAs per SM), 8 x 3 (one CTA per SM: the large grids), 4 x 2 (three CTAs
 * per SM: the batch-1 grids of at most DEC_MIN_REFS steps per warp). */
template <typename T, int D, int NST, int RM, int W> static void set_mma(lkv_decode_plan *pl)
{
    pl->kernel = (const void *)decode_mma_kernel<T, D, NST, RM, W>;
    pl->launch = launch_mma<T, D, NST, RM, W>;
}

template <typename T, int D, int RM> static void pick_mma_d(lkv_decode_plan *pl)
{
    if (pl->warps == 8) {
        set_mma<T, D, 3, RM, 8>(pl);
    } else if (pl->nst == 2) {
        set_mma<T, D, 2, RM, 4>(pl);
    } else {
        set_mma<T, D, 3, RM, 4>(pl);
    }
}

template <typename T, int RM> static void pick_mma_rm(lkv_decode_plan *pl)
{
    if (pl->shape.head_dim == 128) {
        pick_mma_d<T, 128, RM>(pl);
    } else {
        pick_mma_d<T, 64, RM>(pl);
    }
}

/* The RoPE path (DEC_RM_*) of the tensor-core kernel for the plan's encoding. */
template <typename T> static void pick_mma(lkv_decode_plan *pl)
{
    const lkv__dev_pe *pe = &pl->pe;
    const int full = 2 * pe->n_pairs == pl->shape.head_dim;
    if (pe->n_pairs == 0) {
        pick_mma_rm<T, DEC_RM_NONE>(pl);
    } else if (full && pe->pairing == LKV_ROPE_HALF) {
        pick_mma_rm<T, DEC_RM_HALF>(pl);
    } else if (full && pe->pairing == LKV_ROPE_INTERLEAVED) {
        pick_mma_rm<T, DEC_RM_INTER>(pl);
    } else {
        pick_mma_rm<T, DEC_RM_PART>(pl);
    }
}

/* An integer knob of the environment (benchmarks and the GPU check only, read at plan
 * creation): -1 when unset. */
static int env_knob(const char *name)
{
    const char *e = getenv(name);
    return e != NULL && *e != '\0' ? atoi(e) : -1;
}

template <typename T> static void pick_kernel(lkv_decode_plan *pl)
{
    if (pl->mma) {
        pick_mma<T>(pl);
        return;
    }
    switch (pl->G) {
    case 1:
        pl->kernel = (const void *)decode_kernel<T, 1, 0>;
        pl->launch = launch_gen<T, 1, 0>;
        break;
    case 2:
        pl->kernel = (const void *)decode_kernel<T, 2, 0>;
        pl->launch = launch_gen<T, 2, 0>;
        break;
    case 4:
        pl->kernel = (const void *)decode_kernel<T, 4, 0>;
        pl->launch = launch_gen<T, 4, 0>;
        break;
    default:
        pl->kernel = (const void *)decode_kernel<T, 8, 0>;
        pl->launch = launch_gen<T, 8, 0>;
        break;
    }
}

/* Dynamic shared memory of the tensor-core kernel: q_raw [8][d] (the store's scratch), the
 * frequency table's old slots [256], mw and lw [W][8], csw [W][d], the rings [W][nst][2][16][d]
 * 16-bit (the warp partials [W][8][d] fp32 reuse them). */
static size_t mma_smem(int d, int W, int nst)
{
    return (size_t)(8 * d + 256 + 2 * W * 8 + W * d) * sizeof(float) +
           (size_t)W * nst * 2 * 16 * d * 2;
}

/* Fills *pl from cfg: validation, kernel choice and attributes, occupancy, split factor and
 * workspace layout. No allocation. */
static int plan_fill(const lkv_decode_plan_cfg *cfg, lkv_decode_plan *pl)
{
    if (cfg == NULL || !shape_ok(&cfg->shape) || cfg->batch < 1 || cfg->batch > 65535 ||
        cfg->max_refs_per_seq < 0 || (cfg->flags & ~LKV_ATTN_NO_ROTATE) ||
        !isfinite(cfg->sm_scale) || cfg->splits < 0) {
        return LKV_EINVAL;
    }
    const lkv_kv_shape *s = &cfg->shape;
    if (s->dtype != LKV_DTYPE_BF16 && s->dtype != LKV_DTYPE_F16) {
        return LKV_ENOTSUP;
    }
    memset(pl, 0, sizeof *pl);
    pl->shape = *s;
    pl->batch = cfg->batch;
    pl->max_refs = cfg->max_refs_per_seq > 0 ? cfg->max_refs_per_seq : 1;
    int rc = lkv__dev_pe_fill(&pl->pe, cfg->pe, s->head_dim, cfg->flags);
    if (rc != 0) {
        return rc;
    }
    if (pl->pe.kind == LKV_POSENC_ALIBI) {
        if (cfg->pe->n_q_heads < s->n_q_heads) {
            return LKV_EINVAL;
        }
        for (int h = 0; h < s->n_q_heads; h++) {
            pl->sl.s[h] = cfg->pe->alibi_slope[h];
        }
    }
    const int group = s->n_q_heads / s->n_kv_heads;
    const int d = s->head_dim;
    pl->mma = d == 64 || d == 128;
    pl->G = (group >= 8 || pl->mma) ? 8 : pow2_at_least(group);
    pl->head_chunks = (group + pl->G - 1) / pl->G;
    pl->L = pow2_at_least(d / 8);
    pl->pdl = cfg->pdl != 0;
    const long base = (long)cfg->batch * s->n_kv_heads * pl->head_chunks;
    int dev = 0, sms = 1;
    LKV__CUDA_CHECK(cudaGetDevice(&dev));
    LKV__CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    /* Tensor-core kernel shape (kernels/dev/README.md round 7, H200): 8 warps per CTA at one
     * CTA per SM when the (sequence, kv head chunk) pairs alone fill half the SMs or more
     * (batch 16 and up with 8 kv heads: 2-3% faster than 4 warps at two CTAs per SM, and one
     * CTA per pair at batch 16 needs no split), else 4 warps; the ring is 3 stages (a 6-stage
     * ring at one CTA per SM lost at every batch, round 3), 2 for the batch-1 grids below.
     * LKV_ATTN_DECODE_W=4|8 and LKV_ATTN_DECODE_NST=2|3 force them (benchmarks, the check). */
    pl->warps = pl->mma ? (2 * base >= sms ? 8 : MMA_WARPS) : GEN_WARPS;
    pl->nst = DEC_NST;
    const int kw = env_knob("LKV_ATTN_DECODE_W"), kn = env_knob("LKV_ATTN_DECODE_NST");
    if (pl->mma && (kw == 4 || kw == 8)) {
        pl->warps = kw;
    }
    if (pl->mma && pl->warps == 4 && kn == 2) {
        pl->nst = 2;
    }
    const int W = pl->warps;
    pl->threads = W * 32;
    if (pl->mma) {
        pl->smem = mma_smem(d, W, pl->nst);
    } else {
        const int U = pl->G >= 8 ? dec_unroll<8>::U : dec_unroll<1>::U;
        pl->smem =
            ((size_t)pl->G * d + 256 + 2 * W * pl->G + (size_t)W * pl->G * d) * sizeof(float) +
            (size_t)W * DEC_NST * 2 * U * 32 * 16;
    }
    if (s->dtype == LKV_DTYPE_BF16) {
        pick_kernel<__nv_bfloat16>(pl);
    } else {
        pick_kernel<__half>(pl);
    }

    /* Split factor: the grid of (kv heads x chunks x sequences) CTAs, times splits, aims at one
     * full wave of resident CTAs (two waves were slower: more partials, a ragged second wave;
     * kernels/dev/README.md), with at least DEC_MIN_REFS references per warp per split. */
    const int max_refs = pl->max_refs;
    long splits;
    if (cfg->splits > 0) {
        const long cap1 = (max_refs + W - 1) / W; /* at most one reference per warp per split */
        splits = cfg->splits < cap1 ? cfg->splits : cap1;
    } else {
        int per_sm = 1;
        LKV__CUDA_CHECK(cudaFuncSetAttribute(
            pl->kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pl->smem));
        LKV__CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pl->kernel,
                                                                      pl->threads, pl->smem));
        if (per_sm < 1) {
            per_sm = 1;
        }
        const long target = (long)per_sm * sms;
        splits = target / base;
        const long cap = (max_refs + DEC_MIN_REFS * W - 1) / (DEC_MIN_REFS * W);
        if (splits > cap) {
            splits = cap;
        }
    }
    if (splits > DEC_MAX_SPLITS) {
        splits = DEC_MAX_SPLITS;
    }
    if (splits < 1) {
        splits = 1;
    }
    int rps = (int)((max_refs + splits - 1) / splits);
    rps = (rps + W - 1) / W * W;
    pl->refs_per_split = rps;
    pl->n_splits = (max_refs + rps - 1) / rps;
    if (pl->n_splits < 1) {
        pl->n_splits = 1;
    }
    /* At most DEC_MIN_REFS steps per warp (batch 1 over 4k / 8k): a 2-stage ring, the same
     * split (H200, round 7: 11.5 against 11.8 us per layer in the 32-layer graph at 4k, and
     * half the rotation overhead; the first step lands sooner when each warp asks for one). */
    if (pl->mma && W == 4 && pl->nst == 3 && kn != 3 && rps / W <= DEC_MIN_REFS && max_refs > rps) {
        pl->nst = 2;
        pl->smem = mma_smem(d, W, 2);
        if (s->dtype == LKV_DTYPE_BF16) {
            pick_kernel<__nv_bfloat16>(pl);
        } else {
            pick_kernel<__half>(pl);
        }
    }
    /* The folded merge reuses the CTA's shared memory. */
    const size_t merge_smem =
        (4 + (size_t)((pl->G * pl->n_splits + 2 * pl->G + 3) & ~3) + 4 * (size_t)pl->threads) *
        sizeof(float);
    if (pl->n_splits > 1 && merge_smem > pl->smem) {
        pl->smem = merge_smem;
    }
    LKV__CUDA_CHECK(cudaFuncSetAttribute(pl->kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)pl->smem));
    const size_t rows = (size_t)cfg->batch * s->n_q_heads;
    pl->n_ctr = (size_t)base;
    if (pl->n_splits > 1) {
        pl->off_lse = rows * pl->n_splits * d * sizeof(float);
        pl->off_ctr = (pl->off_lse + rows * pl->n_splits * sizeof(float) + 255) & ~(size_t)255;
        pl->ws_need = pl->off_ctr + pl->n_ctr * sizeof(int);
    }

    decode_params *p = &pl->base;
    p->n_q = s->n_q_heads;
    p->n_kv = s->n_kv_heads;
    p->group = group;
    p->head_chunks = pl->head_chunks;
    p->d = d;
    p->L = pl->L;
    p->B = s->block_tokens;
    p->slab_bytes = lkv_slab_bytes(s);
    p->n_splits = pl->n_splits;
    p->refs_per_split = pl->refs_per_split;
    p->pdl = pl->pdl;
    /* Contiguous reference runs per warp for the 4-warp grids (decode_mma_kernel);
     * LKV_ATTN_DECODE_CW=0|1 forces strided / contiguous (benchmarks, the check). */
    {
        const int cw = env_knob("LKV_ATTN_DECODE_CW");
        p->contig = pl->mma && (cw == 1 || (cw != 0 && pl->warps == 4));
    }
    p->scale_log2 = cfg->sm_scale * LKV__LOG2E;
    return 0;
}

/* Points the plan's parameters at workspace ws (ws_need bytes at least). */
static void plan_bind(lkv_decode_plan *pl, void *ws)
{
    pl->ws = ws;
    if (pl->n_splits > 1) {
        pl->base.part_o = (float *)ws;
        pl->base.part_lse = (float *)((char *)ws + pl->off_lse);
        pl->base.counters = (int *)((char *)ws + pl->off_ctr);
    }
}

extern "C" size_t lkv_decode_plan_workspace_bytes(const lkv_decode_plan_cfg *cfg)
{
    lkv_decode_plan pl;
    return plan_fill(cfg, &pl) == 0 ? pl.ws_need : 0;
}

extern "C" int lkv_decode_plan_create(const lkv_decode_plan_cfg *cfg, lkv_decode_plan **out)
{
    if (out == NULL) {
        return LKV_EINVAL;
    }
    *out = NULL;
    lkv_decode_plan *pl = (lkv_decode_plan *)malloc(sizeof *pl);
    if (pl == NULL) {
        return LKV_ENOMEM;
    }
    int rc = plan_fill(cfg, pl);
    if (rc != 0) {
        free(pl);
        return rc;
    }
    void *ws = cfg->workspace;
    if (pl->ws_need > 0) {
        if (ws == NULL) {
            rc = LKV__CUDA_RC(cudaMalloc(&ws, pl->ws_need));
            if (rc != 0) {
                goto fail;
            }
            pl->ws_owned = 1;
        } else if (cfg->workspace_bytes < pl->ws_need) {
            rc = LKV_EINVAL;
            goto fail;
        }
        rc = LKV__CUDA_RC(cudaMemset((char *)ws + pl->off_ctr, 0, pl->n_ctr * sizeof(int)));
        if (rc == 0) {
            rc = LKV__CUDA_RC(cudaDeviceSynchronize());
        }
        if (rc != 0) {
            goto fail;
        }
    }
    plan_bind(pl, ws);
    *out = pl;
    return 0;
fail:
    if (pl->ws_owned) {
        cudaFree(ws);
    }
    free(pl);
    return rc;
}

extern "C" void lkv_decode_plan_destroy(lkv_decode_plan *plan)
{
    if (plan == NULL) {
        return;
    }
    if (plan->ws_owned) {
        cudaFree(plan->ws);
    }
    free(plan);
}

extern "C" int lkv_decode_plan_splits(const lkv_decode_plan *plan)
{
    return plan != NULL ? plan->n_splits : 0;
}

extern "C" int lkv_decode_plan_ctas(const lkv_decode_plan *plan)
{
    return plan != NULL ? (int)(plan->n_ctr * (size_t)plan->n_splits) : 0;
}

extern "C" int lkv_decode_plan_run(const lkv_decode_plan *plan, const lkv_decode_run_args *a,
                                   void *stream)
{
    if (plan == NULL || a == NULL || a->layer < 0 || a->layer >= plan->shape.n_layers ||
        a->page_bytes % 16 != 0 || a->page_bytes < lkv_block_bytes(&plan->shape) || a->q == NULL ||
        a->q_pos == NULL || a->out == NULL || a->ref_offset == NULL ||
        ((uintptr_t)a->q & 15) != 0 || ((uintptr_t)a->out & 15) != 0 ||
        ((uintptr_t)a->arena & 15) != 0) {
        return LKV_EINVAL;
    }
    decode_params p = plan->base;
    p.q = a->q;
    p.q_pos = a->q_pos;
    p.arena = (const char *)a->arena;
    p.page_bytes = a->page_bytes;
    p.refs = a->refs;
    p.ref_offset = a->ref_offset;
    p.out = a->out;
    p.lse = a->lse;
    p.layer = a->layer;
    const dim3 grid(plan->n_splits, plan->shape.n_kv_heads * plan->head_chunks, plan->batch);
    plan->launch(grid, plan->smem, (cudaStream_t)stream, plan->pdl, p, plan->pe, plan->sl);
    LKV__CUDA_CHECK_LAUNCH();
    return 0;
}

/* ---------------------------------------------------------------- one-shot launcher */

extern "C" size_t lkv_attn_decode_cuda_workspace(const lkv_kv_shape *shape, int batch,
                                                 int max_refs_per_seq)
{
    if (shape == NULL) {
        return 0;
    }
    lkv_posenc pe; /* The split factor does not depend on the encoding. */
    memset(&pe, 0, sizeof pe);
    pe.kind = LKV_POSENC_NONE;
    pe.head_dim = shape->head_dim;
    lkv_decode_plan_cfg c;
    memset(&c, 0, sizeof c);
    c.shape = *shape;
    c.pe = &pe;
    c.batch = batch;
    c.max_refs_per_seq = max_refs_per_seq;
    c.sm_scale = 1.0f;
    return lkv_decode_plan_workspace_bytes(&c);
}

extern "C" int lkv_attn_decode_cuda(const lkv_decode_args *a, int max_refs_per_seq, void *workspace,
                                    size_t workspace_bytes, void *stream)
{
    if (a == NULL || a->batch < 0 || max_refs_per_seq < 0) {
        return LKV_EINVAL;
    }
    if (a->batch == 0) {
        return shape_ok(&a->shape) ? 0 : LKV_EINVAL;
    }
    lkv_decode_plan_cfg c;
    memset(&c, 0, sizeof c);
    c.shape = a->shape;
    c.pe = a->pe;
    c.batch = a->batch;
    c.max_refs_per_seq = max_refs_per_seq;
    c.sm_scale = a->sm_scale;
    c.flags = a->flags;
    lkv_decode_plan pl;
    int rc = plan_fill(&c, &pl);
    if (rc != 0) {
        return rc;
    }
    if (a->layer < 0 || a->layer >= a->shape.n_layers ||
        a->page_bytes < lkv_block_bytes(&a->shape) || a->page_bytes % 16 != 0 || a->q == NULL ||
        a->q_pos == NULL || a->out == NULL || a->ref_offset == NULL ||
        (max_refs_per_seq > 0 && (a->refs == NULL || a->arena == NULL))) {
        return LKV_EINVAL;
    }
    cudaStream_t st = (cudaStream_t)stream;
    if (pl.ws_need > 0) {
        if (workspace == NULL) {
            workspace = lkv__cuda_ws_get(pl.ws_need);
            if (workspace == NULL) {
                return LKV_ECUDA;
            }
        } else if (workspace_bytes < pl.ws_need) {
            return LKV_EINVAL;
        }
        LKV__CUDA_CHECK(
            cudaMemsetAsync((char *)workspace + pl.off_ctr, 0, pl.n_ctr * sizeof(int), st));
    }
    plan_bind(&pl, workspace);
    lkv_decode_run_args r;
    r.layer = a->layer;
    r.q = a->q;
    r.q_pos = a->q_pos;
    r.arena = a->arena;
    r.page_bytes = a->page_bytes;
    r.refs = a->refs;
    r.ref_offset = a->ref_offset;
    r.out = a->out;
    r.lse = a->lse;
    return lkv_decode_plan_run(&pl, &r, stream);
}
