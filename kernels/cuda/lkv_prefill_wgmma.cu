/*
 * lkv_prefill_wgmma.cu: LazyAttention prefill on Hopper (sm_90a): a warp-specialised
 * flash-attention forward on wgmma, K/V tiles brought in by the tensor copy engine (TMA).
 * Head dims 64 and 128, bf16 or fp16, block_tokens a multiple of 8. lkv_prefill.cu dispatches
 * here when lkv__prefill_wgmma_ok says so and keeps the mma.sync kernel for everything else.
 *
 * CTA: 3 warpgroups (384 threads), one CTA per SM. Warpgroup 0 is the producer: its first warp
 * walks the split's block references (staged in shared memory in windows), forms key tiles of
 * BN keys (template: 64, the default, or 96; a run of up to BN / B references with the same
 * document start; then the new tokens in tiles of BN, causally only up to the CTA's last
 * token), writes each tile's key positions into the stage's metadata and issues the tensor
 * copies from its lanes in parallel (K: one box of B rows x 64 columns per block and 64-column
 * panel; V: one box per block of all its panels (VB, the default at head_dim 128 with B 8, 16,
 * 32 or 64), else as K; new tokens: one box of BN rows per panel, from lane 0) into a ring of NST
 * shared-memory stages (4; 3 at BN 96 and head_dim 128; 5 and 2 as variants), completing on the
 * stage's "full" mbarrier. Its other warps exit. setmaxnreg 56 / 224 (24 / 240 at BN 128):
 * ptxas reports the launch bound's 168 and uses each side's count for part of its allocation,
 * but its wgmma pipeline must fit far fewer (round 8: two S accumulators, O and P in registers
 * made it serialise every wgmma, C7512, at 224 or 240 alike; a 256-thread bound did not).
 * Warpgroups 1 and 2 are consumers, 64 query rows each (BM = 128 per CTA, GQA rows packed as in
 * the mma.sync kernel: row = token * group + head-in-group). Consumer pipeline, FlashAttention-3's
 * intra-warpgroup overlap: iteration j issues S(j) = Q K(j) (wgmma m64nBNk16, Q from registers:
 * the rotated tile's A fragments, loaded by ldmatrix after each rotation (QR; else from shared
 * memory), K from shared memory) and O += P(j-1) V(j-1) (wgmma m64nDk16, P from registers in the
 * accumulator layout, V from shared memory MN-major) as two groups, waits for the first, runs the
 * mask + online softmax of tile j (log2 domain: the scale and log2(e) are folded into Q) while P V
 * runs, waits for the second, hands stage j-1 back (one arrival per warp on its "empty"
 * mbarrier) and rescales O (only when a row maximum moved). Tile 0 is peeled and the last P V
 * issued after the loop, so no wgmma sits under a data-dependent branch (ptxas serialises
 * every wgmma of the function otherwise, C7520). Optional ping-pong (p.wg_pp): the two
 * consumers take turns issuing their products through named barriers. Split launches write
 * fp32 partials; with p.counters set the last CTA of each (row tile, kv head) merges them
 * (merge_last), else the caller's merge kernel does.
 *
 * PF (p.wg_pf, off: measured 3-21% slower, round 8): S issued one tile ahead of the softmax
 * (two S accumulators, the loop body written twice), P through shared memory (pw; SS P V) to
 * keep the wgmma pipeline in registers, Q from shared memory; the producer pads the tile count
 * to an odd number with an empty tile so that the loop leaves from one place only.
 *
 * Shared memory layouts: every tile is stored as 64-column panels of [rows][64] 16-bit
 * elements, 128 bytes a row, with the 128-byte swizzle (16-byte chunk c of row r at chunk
 * c ^ (r & 7)); panels start 1024-byte aligned. That is what TMA's SWIZZLE_128B writes and what
 * the wgmma descriptors below describe (K-major: stride between 8-row groups 1024 B; V as
 * MN-major: 1024 B between 8-key groups, BN x 128 B between 64-column panels; a VB stage of
 * cached blocks is [block][panel][B][64] instead: panels B x 128 B apart, see issue_pv). A block's
 * rows start at a multiple of 8 rows (B % 8 == 0), so every box lands on the swizzle's 1024-byte
 * period.
 *
 * Tensor maps (encoded per launch on the host, passed as __grid_constant__ parameters): the
 * page arena as a 3D tensor [pages][rows of a page][head_dim] with the page stride as the
 * outer stride (row index within a page = ((layer * 2 + kv) * n_kv + kv_head) * B + token),
 * and k_new / v_new as [n_new][n_kv][head_dim] (rows past n_new are zero-filled by the copy);
 * with VB also the arena as a 4D tensor [pages][panels][rows of a page][64] (panel stride 128
 * bytes, inside a row), whose box of B rows x all panels lands as [panel][B][64].
 *
 * Lazy RoPE, exactly as the mma.sync kernel: when a tile's document start differs from the
 * last one, each consumer warpgroup re-reads its raw query rows (16-byte loads, L2-resident),
 * rotates them in shared memory by (row position - start) with the exact-angle sincos, folding
 * in the softmax scale and log2(e), rounded once to 16 bits; rotations never compound.
 *
 * Invalid key slots (the unused tail of a partial block: garbage, NaN in the tests; rows past
 * the tile's blocks: stale) get -inf scores; since 0 * NaN is NaN in the product with V, a
 * consumer zeroes the V rows of invalid cached slots before its P V product (only for tiles
 * the producer flags; both warpgroups write the same zeros).
 */
#include <cuda.h>
#include <limits.h>
#include <stdio.h>

#include "lkv_cuda_common.cuh"
#include "lkv_cuda_wgmma.cuh"
#include "lkv_prefill_internal.cuh"

extern "C" {
#include "lkv_attn_cuda.h"
}

#define WG_BM      LKV__WG_BM
#define WG_THREADS 384
#define WG_REF_WIN 256
/* Registers per thread after setmaxnreg: producer and consumer warpgroups (128 x 56 + 256 x 224
 * = 64512 of the 65536). At 40 the producer's loop spilled (ptxas -v: 8 bytes, the only spill
 * of the BN 64 kernels); the consumers' code is allocated against their own count. BN 128 (a
 * variant) takes 24 / 240 instead, as FlashAttention-3: its consumers spill 240 bytes at 224
 * (its producer spills a little at 24). */
#define WG_REG_PRODUCER_S "56"
#define WG_REG_CONSUMER_S "224"

/* Per-stage tile metadata, written by the producer before it arms the stage's barrier. */
template <int BN> struct wg_meta {
    int kind;       /* 0 cached blocks, 1 new tokens, -1 done */
    int start;      /* rotation origin */
    int full;       /* every key valid and visible to every row, no bias: no masking */
    int zero;       /* cached tile with invalid slots: zero their V rows */
    int colpos[BN]; /* key position, -1 = invalid slot */
};

template <int D, int BN, int NST, bool PF> struct wg_smem {
    static constexpr int Q_BYTES = WG_BM * D * 2;
    static constexpr int KV_BYTES = BN * D * 2; /* one K or V stage */
    static constexpr int OFF_K = Q_BYTES;
    static constexpr int OFF_V = OFF_K + NST * KV_BYTES;
    static constexpr int OFF_P = OFF_V + NST * KV_BYTES; /* PF: P of each consumer, 64 x 64 */
    static constexpr int OFF_META = OFF_P + (PF ? 2 * 64 * 64 * 2 : 0);
    static constexpr int OFF_REFS = OFF_META + NST * (int)sizeof(wg_meta<BN>);
    static constexpr int OFF_FREQ = OFF_REFS + WG_REF_WIN * 8;
    static constexpr int OFF_BAR = OFF_FREQ + 2 * 128 * 4;
    static constexpr int OFF_FLAG = OFF_BAR + 2 * NST * 8; /* the folded merge's "last" flag */
    static constexpr int TOTAL = OFF_FLAG + 16;
    static constexpr int ALLOC = TOTAL + 1024; /* base aligned up to 1024 in the kernel */
};

/* Element offset of (row, col) in a paneled, 128-byte-swizzled [rows][D] tile. */
template <int ROWS> static __device__ __forceinline__ int pswz(int row, int col)
{
    return (col >> 6) * (ROWS * 64) + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

/* Element offset of (row, col) in a V stage whose rows come in blocks of bt rows, each block
 * [D / 64 panels][bt][64] (VB: one tensor copy per cached block; bt = BN is the plain layout). */
template <int D> static __device__ __forceinline__ int vboff(int row, int col, int bt)
{
    const int bi = row / bt, rr = row - bi * bt;
    return bi * bt * D + (col >> 6) * (bt * 64) + rr * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) +
           (col & 7);
}

/* ---------------------------------------------------------------- PTX: mbarrier, TMA, misc */

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ARCH_OK 1
#else
#define WG_ARCH_OK 0
#endif

static __device__ __forceinline__ void mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ uint32_t mbar_try(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    asm volatile("{\n.reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return done;
}
/* Waits for the phase of `parity` to complete. A wait of more than about 4e9 cycles (2 s) is a
 * defect (a lost arrival or transaction byte): trap, so it surfaces as a launch error instead
 * of a hang. */
static __device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    if (mbar_try(bar, parity)) {
        return;
    }
    const long long t0 = clock64();
    while (!mbar_try(bar, parity)) {
        if (clock64() - t0 > 4000000000ll) {
            __trap();
        }
    }
}
static __device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap *map,
                                                   uint32_t bar, int c0, int c1, int c2)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}
static __device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap *map,
                                                   uint32_t bar, int c0, int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}
static __device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
static __device__ __forceinline__ void named_bar(int id, int n)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
static __device__ __forceinline__ void named_arrive(int id, int n)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* wgmma shared-memory descriptor: 128-byte swizzle, start address, leading / stride byte
 * offsets (both multiples of 16). */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr & 0x3ffffu) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
           ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}

/* Split-KV merge folded into the launch (as the decode kernel's dec_merge_last): every CTA of
 * a (row tile, kv head) has written its partial; the 256 consumer threads pass a named barrier,
 * one of them counts the CTA's arrival on the tile's counter (acq_rel at gpu scope: it releases
 * the barrier-ordered partial stores and, in the last CTA, acquires the others'), and the last
 * CTA merges the n_splits partials of its rows by log-sum-exp (partials read through L2),
 * writes out and resets the counter to 0 for the next launch. A row with no keys gets zeros.
 * flag: a free int of shared memory; w: free shared memory for LKV__WG_BM x n_splits floats
 * (the K/V ring: the plan keeps n_splits <= LKV__WG_MAX_SPLITS); t: 0..255. */
template <typename T, int D>
static __device__ __forceinline__ void merge_last(const prefill_params &p, int *flag, float *w,
                                                  int t, int row0, int kvh)
{
    named_bar(3, 256);
    int *ctr = p.counters + (size_t)kvh * gridDim.x + blockIdx.x;
    if (t == 0) {
        int prev;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n"
                     : "=r"(prev)
                     : "l"(ctr)
                     : "memory");
        *flag = prev == p.n_splits - 1;
    }
    named_bar(3, 256);
    if (!*flag) {
        return;
    }
    const int S = p.n_splits, g = p.group, R = p.n_new * g;
    const int nrow = min(WG_BM, R - row0);
    /* Weights w[r][s] = 2^(lse - max) / sum per row, in the (free) K/V ring; then every
     * thread sums 4 columns of one row over the splits, loads unrolled for memory-level
     * parallelism (a warp walking the rows one split at a time was latency-bound: +23 us at 64
     * new tokens over 8k). */
    if (t < nrow) {
        const size_t orow = (size_t)((row0 + t) / g) * p.n_q + kvh * g + (row0 + t) % g;
        const float *lse = p.part_lse + orow * S;
        float *wr = w + t * S;
        float m = -INFINITY;
#pragma unroll 4
        for (int s = 0; s < S; s++) {
            wr[s] = __ldcg(lse + s);
            m = fmaxf(m, wr[s]);
        }
        float sum = 0.0f;
        if (m != -INFINITY) {
            for (int s = 0; s < S; s++) {
                wr[s] = exp2f(wr[s] - m);
                sum += wr[s];
            }
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int s = 0; s < S; s++) {
            wr[s] = m != -INFINITY ? wr[s] * inv : 0.0f;
        }
    }
    named_bar(3, 256);
    constexpr int NC = D / 4;
    for (int it = t; it < nrow * NC; it += 256) {
        const int r = it / NC, c4 = (it % NC) * 4;
        const int gr = row0 + r;
        const size_t orow = (size_t)(gr / g) * p.n_q + kvh * g + gr % g;
        const float *po = p.part_o + orow * S * D + c4;
        const float *wr = w + r * S;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
        for (int s = 0; s < S; s++) {
            const float4 v = __ldcg((const float4 *)(po + (size_t)s * D));
            const float ws = wr[s]; /* 0 for a split without keys (its partial is zeros) */
            acc.x = fmaf(ws, v.x, acc.x);
            acc.y = fmaf(ws, v.y, acc.y);
            acc.z = fmaf(ws, v.z, acc.z);
            acc.w = fmaf(ws, v.w, acc.w);
        }
        uint2 pk;
        pk.x = lkv__elem<T>::pack2(acc.x, acc.y);
        pk.y = lkv__elem<T>::pack2(acc.z, acc.w);
        *(uint2 *)((T *)p.out + orow * D + c4) = pk;
    }
    if (t == 0) {
        *ctr = 0;
    }
}

/* ---------------------------------------------------------------- the kernel */

template <typename T, int D, int BN, int NST, bool QR, bool PF>
__global__ void __launch_bounds__(WG_THREADS, 1)
    prefill_wgmma_kernel(const prefill_params p, const lkv__dev_pe pe, const lkv__dev_slopes sl,
                         const __grid_constant__ CUtensorMap tm_arena,
                         const __grid_constant__ CUtensorMap tm_knew,
                         const __grid_constant__ CUtensorMap tm_vnew,
                         const __grid_constant__ CUtensorMap tm_arena_v)
{
#if WG_ARCH_OK
    using L = wg_smem<D, BN, NST, PF>;
    static_assert(2 * NST * L::KV_BYTES >= WG_BM * LKV__WG_MAX_SPLITS * 4, "merge weights");
    extern __shared__ __align__(1024) unsigned char smem_dyn[];
    unsigned char *sm =
        (unsigned char *)(((uintptr_t)smem_dyn + 1023) & ~(uintptr_t)1023); /* 1024-aligned */
    T *qs = (T *)sm;
    T *ks = (T *)(sm + L::OFF_K);
    T *vs = (T *)(sm + L::OFF_V);
    wg_meta<BN> *meta = (wg_meta<BN> *)(sm + L::OFF_META);
    uint64_t *rbuf = (uint64_t *)(sm + L::OFF_REFS);
    float *fhi = (float *)(sm + L::OFF_FREQ);
    float *flo = fhi + 128;
    const uint32_t bar0 = lkv__smem_u32(sm + L::OFF_BAR);
    auto full_bar = [&](int s) { return bar0 + 8u * (uint32_t)s; };
    auto empty_bar = [&](int s) { return bar0 + 8u * (uint32_t)(NST + s); };

    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7;
    const int mt = gridDim.x - 1 - blockIdx.x; /* heaviest (last) row tiles first */
    const int kvh = blockIdx.y, split = blockIdx.z;
    const int g = p.group;
    const int R = p.n_new * g;
    const int row0 = mt * WG_BM;
    const bool alibi = pe.kind == LKV_POSENC_ALIBI;

    for (int j = tid; j < 128; j += WG_THREADS) {
        fhi[j] = j < pe.n_pairs ? pe.freq_hi[j] : 0.0f;
        flo[j] = j < pe.n_pairs ? pe.freq_lo[j] : 0.0f;
    }
    if (tid == 0) {
        for (int s = 0; s < NST; s++) {
            mbar_init(full_bar(s), 1);
            mbar_init(empty_bar(s), 8); /* one arrival per consumer warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        /* ------------------------------------------------------------ producer */
        if constexpr (BN == 128) {
            asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        } else {
            asm volatile("setmaxnreg.dec.sync.aligned.u32 " WG_REG_PRODUCER_S ";\n");
        }
        if (tid >= 32) {
            return;
        }
        const int r_lo = min(p.n_refs, split * p.refs_per_split);
        const int r_hi =
            split == p.n_splits - 1 ? p.n_refs : min(p.n_refs, r_lo + p.refs_per_split);
        const bool do_new = split == p.n_splits - 1;
        const int kend = min(p.n_new, (min(R, row0 + WG_BM) - 1) / g + 1);
        const int B = p.B;
        const int nbmax = BN / B;
        const int row_k = (p.layer * 2 * p.n_kv + kvh) * B; /* K slab's first row in a page */
        const int row_v = row_k + p.n_kv * B;
        int w0 = r_lo, wcnt = min(WG_REF_WIN, r_hi - r_lo);
        for (int i = lane; i < wcnt; i += 32) {
            rbuf[i] = p.refs[r_lo + i];
        }
        __syncwarp();
        int r = r_lo, j0 = 0, last_start = 0;
        for (int it = 0;; it++) {
            int kind = -1, start = 0, nb = 0, full = 0, zero = 0;
            if (r < r_hi) {
                if (r >= w0 + wcnt) {
                    __syncwarp();
                    w0 = r;
                    wcnt = min(WG_REF_WIN, r_hi - r);
                    for (int i = lane; i < wcnt; i += 32) {
                        rbuf[i] = p.refs[r + i];
                    }
                    __syncwarp();
                }
                kind = 0;
                start = (int)lkv_ref_start(rbuf[r - w0]);
                nb = 1;
                bool all = (int)lkv_ref_valid(rbuf[r - w0]) >= B;
                while (nb < nbmax && r + nb < w0 + wcnt &&
                       (int)lkv_ref_start(rbuf[r + nb - w0]) == start) {
                    all = all && (int)lkv_ref_valid(rbuf[r + nb - w0]) >= B;
                    nb++;
                }
                const bool dense = all && nb * B == BN;
                full = dense && !alibi;
                zero = !dense;
            } else if (do_new && j0 < kend) {
                kind = 1;
                start = p.new_start;
                full = j0 + BN <= p.n_new && j0 + BN - 1 <= row0 / g && !alibi;
            } else if (PF && it > 0 && (it & 1) == 0) {
                /* PF consumers take an odd number of tiles (their loop leaves only from its
                 * second half): one empty tile, every slot invalid, its V rows zeroed by the
                 * consumers, no copies; the last start, so no rotation. */
                kind = 2;
                start = last_start;
                zero = 1;
            }
            last_start = start;
            const int s = it % NST;
            mbar_wait(empty_bar(s), (uint32_t)(((it / NST) & 1) ^ 1));
            wg_meta<BN> *m = meta + s;
            if (lane == 0) {
                m->kind = kind;
                m->start = start;
                m->full = full;
                m->zero = zero;
            }
            for (int c = lane; c < BN; c += 32) {
                int cp = -1;
                if (kind == 0) {
                    const int bi = c / B, t = c - bi * B;
                    if (bi < nb) {
                        const uint64_t ref = rbuf[r + bi - w0];
                        if (t < min((int)lkv_ref_valid(ref), B)) {
                            cp = start + (int)lkv_ref_block(ref) * B + t;
                        }
                    }
                } else if (kind == 1) {
                    cp = j0 + c < p.n_new ? p.new_start + j0 + c : -1;
                }
                m->colpos[c] = cp;
            }
            __syncwarp();
            if (kind < 0 || kind == 2) {
                if (lane == 0) {
                    mbar_arrive(full_bar(s));
                }
                if (kind < 0) {
                    break;
                }
                continue;
            }
            const uint32_t kdst = lkv__smem_u32(ks) + (uint32_t)(s * L::KV_BYTES);
            const uint32_t vdst = lkv__smem_u32(vs) + (uint32_t)(s * L::KV_BYTES);
            if (kind == 0) {
                /* One tensor copy per (block, 64-column panel, K or V), spread over the lanes
                 * (a single issuing lane serialised the 16 copies of a tile of 16-token
                 * blocks); the transaction bytes are expected before any copy is issued. */
                constexpr int NP = D / 64;
                if (lane == 0) {
                    mbar_expect_tx(full_bar(s), (uint32_t)(nb * B * D * 2 * 2));
                }
                __syncwarp();
                if (p.wg_vb) {
                    /* VB: K as above (the S product needs every 8-key group 1024 bytes on), V
                     * one copy per block into [block][panel][B][64] (tm_arena_v: rows inside
                     * the panels), as the P V descriptors of such a tile expect. */
                    for (int l = lane; l < nb * (NP + 1); l += 32) {
                        const int bi = l < nb * NP ? l / NP : l - nb * NP;
                        const int page = (int)lkv_ref_page(rbuf[r + bi - w0]);
                        if (l < nb * NP) {
                            const int pn = l % NP;
                            tma_load_3d(kdst + (uint32_t)((pn * BN + bi * B) * 128), &tm_arena,
                                        full_bar(s), pn * 64, row_k, page);
                        } else {
                            tma_load_4d(vdst + (uint32_t)(bi * B * D * 2), &tm_arena_v, full_bar(s),
                                        0, row_v, 0, page);
                        }
                    }
                } else {
                    for (int l = lane; l < nb * NP * 2; l += 32) {
                        const int bi = l / (2 * NP), pn = (l >> 1) % NP, isv = l & 1;
                        const int page = (int)lkv_ref_page(rbuf[r + bi - w0]);
                        const uint32_t off = (uint32_t)((pn * BN + bi * B) * 128);
                        tma_load_3d((isv ? vdst : kdst) + off, &tm_arena, full_bar(s), pn * 64,
                                    isv ? row_v : row_k, page);
                    }
                }
            } else if (lane == 0) {
                mbar_expect_tx(full_bar(s), (uint32_t)(BN * D * 2 * 2));
#pragma unroll
                for (int pn = 0; pn < D / 64; pn++) {
                    const uint32_t off = (uint32_t)(pn * BN * 128);
                    tma_load_3d(kdst + off, &tm_knew, full_bar(s), pn * 64, kvh, j0);
                    tma_load_3d(vdst + off, &tm_vnew, full_bar(s), pn * 64, kvh, j0);
                }
            }
            __syncwarp();
            if (kind == 0) {
                r += nb;
            } else {
                j0 += BN;
            }
        }
    } else {
        /* ---------------------------------------------------------------- consumers */
        if constexpr (BN == 128) {
            asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
        } else {
            asm volatile("setmaxnreg.inc.sync.aligned.u32 " WG_REG_CONSUMER_S ";\n");
        }
        const int c = wg - 1;                       /* consumer index 0 / 1 */
        const int ct = tid - 128 * wg;              /* thread within the warpgroup */
        const int cw = ct >> 5;                     /* warp within the warpgroup */
        const int wrow0 = row0 + c * 64;            /* first row of this warpgroup */
        T *qw = qs + c * 64 * D;                    /* this warpgroup's Q tile: [D / 64][64][64] */
        T *pw = (T *)(sm + L::OFF_P) + c * 64 * 64; /* PF: this warpgroup's P tile [64][64] */
        const uint32_t qw_addr = lkv__smem_u32(qw);
        const int bar_id = 1 + c;

        int rowpos[2];
        float slope[2];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int gr = wrow0 + cw * 16 + (lane >> 2) + hf * 8;
            rowpos[hf] = p.new_start + (gr < R ? gr / g : 0);
            slope[hf] = alibi && gr < R ? sl.s[kvh * g + gr % g] * LKV__LOG2E : 0.0f;
        }

        /* Rotates this warpgroup's 64 query rows for origin `start` into qw (see the file
         * comment). The previous products that read qw have completed (each tile waits for its
         * wgmma groups). */
        const int tok_lo = wrow0 / g;
        const int n_tok = (wrow0 + 63) / g - tok_lo + 1;
        auto rotate = [&](int start) {
            constexpr int NCH = 64 * (D / 8) / 128; /* 16-byte chunks per thread */
            const T *qg = (const T *)p.q;
            if (QR) {
                named_bar(bar_id, 128); /* every warp has its fragments of the last rotation */
            }
#pragma unroll
            for (int b0 = 0; b0 < NCH; b0 += 4) {
                uint4 v[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int idx = ct + (b0 + u) * 128;
                    const int row = idx / (D / 8), ch = idx % (D / 8);
                    const int gr = wrow0 + row;
                    v[u] = make_uint4(0u, 0u, 0u, 0u);
                    if (gr < R) {
                        const int tok = gr / g, head = kvh * g + gr % g;
                        v[u] =
                            __ldg((const uint4 *)(qg + ((size_t)tok * p.n_q + head) * D + ch * 8));
                    }
                }
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int idx = ct + (b0 + u) * 128;
                    const int row = idx / (D / 8), ch = idx % (D / 8);
                    *(uint4 *)(qw + pswz<64>(row, ch * 8)) = v[u];
                }
            }
            named_bar(bar_id, 128);
            const int np = pe.n_pairs;
            const float sc = p.scale_log2;
            for (int idx = ct; idx < n_tok * (D / 2); idx += 128) {
                const int tk = idx / (D / 2), k = idx % (D / 2);
                const int tok = tok_lo + tk;
                const int rlo = max(0, tok * g - wrow0), rhi = min(64, tok * g + g - wrow0);
                if (k < np) {
                    int i0, i1;
                    if (pe.pairing == LKV_ROPE_HALF) {
                        i0 = k;
                        i1 = k + np;
                    } else {
                        i0 = 2 * k;
                        i1 = 2 * k + 1;
                    }
                    const float delta = (float)(p.new_start + min(tok, p.n_new - 1) - start);
                    float s, cc;
                    lkv__turn_sincos(delta, fhi[k], flo[k], &s, &cc);
                    for (int row = rlo; row < rhi; row++) {
                        const float x0 = lkv__elem<T>::to_f(qw[pswz<64>(row, i0)]);
                        const float x1 = lkv__elem<T>::to_f(qw[pswz<64>(row, i1)]);
                        qw[pswz<64>(row, i0)] = lkv__elem<T>::from_f((x0 * cc - x1 * s) * sc);
                        qw[pswz<64>(row, i1)] = lkv__elem<T>::from_f(fmaf(x0, s, x1 * cc) * sc);
                    }
                } else {
                    const int i0 = 2 * np + 2 * (k - np);
                    for (int row = rlo; row < rhi; row++) {
                        qw[pswz<64>(row, i0)] =
                            lkv__elem<T>::from_f(lkv__elem<T>::to_f(qw[pswz<64>(row, i0)]) * sc);
                        qw[pswz<64>(row, i0 + 1)] = lkv__elem<T>::from_f(
                            lkv__elem<T>::to_f(qw[pswz<64>(row, i0 + 1)]) * sc);
                    }
                }
            }
        };

        /* Rows per V block in a stage of this tile kind (VB: cached tiles as B-row blocks). */
        auto vbt = [&](int knd) { return p.wg_vb && knd == 0 ? p.B : BN; };
        float o[D / 2];
#pragma unroll
        for (int i = 0; i < D / 2; i++) {
            o[i] = 0.0f;
        }
        float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
        int rot_start = INT_MIN;

        /* Pipeline (FlashAttention-3's intra-warpgroup overlap): iteration it issues S(it) = Q
         * K(it) and O += P(it - 1) V(it - 1) as two wgmma groups, waits for the first, runs the
         * softmax of tile it while the tensor cores still work on P V, then waits for the second,
         * releases tile it - 1's stage and rescales O. */
        float sacc[BN / 2];
        uint32_t pa[PF ? 1 : BN / 16][4]; /* PF keeps P in shared memory (pw) instead */
        /* QR: this warp's 16 rows of the rotated Q as wgmma A fragments (the mma.sync A layout),
         * D / 16 k steps, loaded by ldmatrix after each rotation: S = Q K^T then reads only K
         * from shared memory (at BN 64 an SS product needs as many shared-memory cycles as
         * tensor cycles). */
        uint32_t qf[QR ? D / 16 : 1][4];
        /* Ping-pong (p.wg_pp): the two consumer warpgroups take turns issuing their products
         * (named barriers 5 and 6), so one's softmax runs under the other's matrix work.
         * Consumer 1 opens with one free turn for consumer 0; both walk the same tiles, so
         * the turns match (consumer 1 skips its arrival after its last issue). */
        const bool pp = p.wg_pp != 0;
        if (pp && c == 1) {
            named_arrive(5, 256);
        }
        /* Waits for tile it, rotates Q for its document if needed, zeroes its invalid V rows;
         * returns its stage and metadata. No wgmma in here: ptxas serialises every wgmma
         * (C7520) when one sits in a branch it cannot prove uniform, so the products below are
         * issued only on straight-line paths (the loops exit before them). */
        int s = 0, kind = -1;
        bool tfull = false, sync_q = false;
        const wg_meta<BN> *m = meta;
        auto prep = [&](int it) {
            s = it % NST;
            mbar_wait(full_bar(s), (uint32_t)((it / NST) & 1));
            m = meta + s;
            kind = m->kind;
            tfull = m->full != 0;
            if (kind < 0) {
                return;
            }
            const int tstart = m->start;
            T *vt = vs + s * (BN * D);
            bool sync = false;
            if (tstart != rot_start) {
                /* Q is free: S of the last tile completed; a pending P V reads V and pa. */
                rot_start = tstart;
                rotate(tstart);
                sync = true;
                sync_q = true;
            }
            if (m->zero) {
                /* Zero the V rows of invalid slots (16 bytes per thread per step). */
                const int bt = vbt(kind);
                for (int idx = ct; idx < BN * (D / 8); idx += 128) {
                    const int row = idx / (D / 8), ch = idx % (D / 8);
                    if (m->colpos[row] < 0) {
                        *(uint4 *)(vt + vboff<D>(row, ch * 8, bt)) = make_uint4(0u, 0u, 0u, 0u);
                    }
                }
                sync = true;
            }
            if (sync) {
                fence_proxy_async();
                named_bar(bar_id, 128);
            }
            if (QR && sync_q) {
                const int lr = cw * 16 + (lane & 15);
#pragma unroll
                for (int kk = 0; kk < (QR ? D / 16 : 0); kk++) {
                    lkv__ldsm_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3],
                                 qw + pswz<64>(lr, kk * 16 + (lane >> 4) * 8));
                }
                sync_q = false;
            }
        };
        auto fence_o = [&]() {
#pragma unroll
            for (int i = 0; i < D / 2; i++) {
                lkv__reg_fence(o[i]);
            }
        };
        /* S = Q K^T of the tile in stage st: 64 x BN per warpgroup, D / 16 steps of k16;
         * descriptors built once, a k step adds its byte offset / 16 to the start-address
         * field (no carry: shared addresses stay below 2^18). */
        auto issue_s = [&](int st, float(&sc)[BN / 2]) {
            const uint64_t da0 = wg_desc(qw_addr, 16, 1024);
            const uint64_t db0 = wg_desc(lkv__smem_u32(ks + st * (BN * D)), 16, 1024);
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const uint32_t pn = (uint32_t)(kk >> 2), kb = (uint32_t)((kk & 3) * 32);
                const uint64_t db = db0 + ((pn * (BN * 128) + kb) >> 4);
                if constexpr (QR) {
                    lkv__wgmma_rs<T, BN>::run(sc, qf[kk], db, kk > 0 ? 1 : 0);
                } else {
                    const uint64_t da = da0 + ((pn * (64 * 128) + kb) >> 4);
                    lkv__wgmma_ss<T, BN>::run(sc, da, db, kk > 0 ? 1 : 0);
                }
            }
            lkv__wgmma_commit();
        };
        /* O += P V of the tile in stage st, P in the A register layout (pa). */
        auto issue_pv = [&](int st) {
            /* V in blocks of bt rows ([block][panel][bt][64]; bt = BN: one block): a k16 step
             * starts at its first key's row; 8-key groups 1024 bytes apart (bt >= 16, a
             * multiple of 16) or one block apart (bt = 8); panels bt x 128 bytes apart. */
            const int bt = vbt(meta[st].kind);
            const uint32_t blk = (uint32_t)(bt * D * 2);
            uint32_t voff[BN / 16];
            {
                uint32_t off = 0;
                int rr = 0;
#pragma unroll
                for (int kc = 0; kc < BN / 16; kc++) {
                    voff[kc] = off;
                    rr += 16;
                    const bool wrap = rr >= bt;
                    off = bt == 8 ? off + 2 * blk
                                  : (wrap ? off + 2048 + blk - (uint32_t)bt * 128 : off + 2048);
                    rr = wrap ? 0 : rr;
                }
            }
            const uint64_t dv0 = wg_desc(lkv__smem_u32(vs + st * (BN * D)), (uint32_t)bt * 128,
                                         bt == 8 ? blk : 1024u);
#pragma unroll
            for (int kc = 0; kc < BN / 16; kc++) {
                const uint64_t db = dv0 + (uint64_t)(voff[kc] >> 4);
                if constexpr (PF) {
                    /* P K-major in pw (128-byte swizzle, as Q): a k16 step is 32 bytes. */
                    const uint64_t da = wg_desc(lkv__smem_u32(pw), 16, 1024) + (uint64_t)(kc * 2);
                    lkv__wgmma_ss_t<T, D>::run(o, da, db);
                } else {
                    lkv__wgmma_rs_t<T, D>::run(o, pa[kc], db);
                }
            }
            lkv__wgmma_commit();
        };
        auto fence_s = [&](float(&sc)[BN / 2]) {
#pragma unroll
            for (int i = 0; i < BN / 2; i++) {
                lkv__reg_fence(sc[i]);
            }
        };
        /* Mask, bias and online softmax of sacc (scaled, log2 domain); sets alpha. sacc[4 n +
         * e]: n8 block n, e = 0,1 row lane/4 (cols 8n + 2 (lane % 4) + e), e = 2,3 row + 8. */
        float alpha[2];
        auto softmax = [&](float(&sc)[BN / 2], const wg_meta<BN> *mm, bool ff) {
            if (!ff) {
#pragma unroll
                for (int n = 0; n < BN / 8; n++) {
                    const int2 kp2 = *(const int2 *)(mm->colpos + n * 8 + (lane & 3) * 2);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int kp = (e & 1) ? kp2.y : kp2.x;
                        const int hf = e >> 1;
                        float sv = sc[4 * n + e];
                        if (kp < 0 || kp > rowpos[hf]) {
                            sv = -INFINITY;
                        } else if (alibi) {
                            sv = fmaf(slope[hf], (float)(kp - rowpos[hf]), sv);
                        }
                        sc[4 * n + e] = sv;
                    }
                }
            }
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                float red[BN / 8];
#pragma unroll
                for (int n = 0; n < BN / 8; n++) {
                    red[n] = fmaxf(sc[4 * n + 2 * hf], sc[4 * n + 2 * hf + 1]);
                }
#pragma unroll
                for (int w = 1; w < BN / 8; w *= 2) {
#pragma unroll
                    for (int n = 0; n + w < BN / 8; n += 2 * w) {
                        red[n] = fmaxf(red[n], red[n + w]);
                    }
                }
                float mx = red[0];
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(mrow[hf], mx);
                const float muse = mnew == -INFINITY ? 0.0f : mnew;
                alpha[hf] = lkv__ex2(mrow[hf] - muse);
                mrow[hf] = mnew;
#pragma unroll
                for (int n = 0; n < BN / 8; n++) {
                    sc[4 * n + 2 * hf] = lkv__ex2(sc[4 * n + 2 * hf] - muse);
                    sc[4 * n + 2 * hf + 1] = lkv__ex2(sc[4 * n + 2 * hf + 1] - muse);
                    red[n] = sc[4 * n + 2 * hf] + sc[4 * n + 2 * hf + 1];
                }
#pragma unroll
                for (int w = 1; w < BN / 8; w *= 2) {
#pragma unroll
                    for (int n = 0; n + w < BN / 8; n += 2 * w) {
                        red[n] += red[n + w];
                    }
                }
                lrow[hf] = lrow[hf] * alpha[hf] + red[0];
            }
        };
        /* After the pending P V completed: hand its stage back. */
        auto release = [&](int st) {
            __syncwarp();
            if (lane == 0) {
                mbar_arrive(empty_bar(st));
            }
        };
        /* Rescale O by alpha (exactly 1 when no row maximum moved: then skipped) and pack P. */
        auto rescale_pack = [&](float(&sc)[BN / 2]) {
            if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    o[4 * n] *= alpha[0];
                    o[4 * n + 1] *= alpha[0];
                    o[4 * n + 2] *= alpha[1];
                    o[4 * n + 3] *= alpha[1];
                }
            }
            if constexpr (PF) {
                /* P into pw (the pending P V of the last tile has completed), made visible
                 * to the tensor cores; the warpgroup's barrier comes before the next P V. */
#pragma unroll
                for (int n = 0; n < BN / 8; n++) {
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        const int row = cw * 16 + (lane >> 2) + hf * 8;
                        *(uint32_t *)(pw + pswz<64>(row, n * 8 + (lane & 3) * 2)) =
                            lkv__elem<T>::pack2(sc[4 * n + 2 * hf], sc[4 * n + 2 * hf + 1]);
                    }
                }
                fence_proxy_async();
            } else {
#pragma unroll
                for (int kc = 0; kc < BN / 16; kc++) {
                    pa[kc][0] = lkv__elem<T>::pack2(sc[8 * kc + 0], sc[8 * kc + 1]);
                    pa[kc][1] = lkv__elem<T>::pack2(sc[8 * kc + 2], sc[8 * kc + 3]);
                    pa[kc][2] = lkv__elem<T>::pack2(sc[8 * kc + 4], sc[8 * kc + 5]);
                    pa[kc][3] = lkv__elem<T>::pack2(sc[8 * kc + 6], sc[8 * kc + 7]);
                }
            }
        };

        if constexpr (!PF) {
            for (int once = 0; once < 1; once++) {
                prep(0);
                if (kind < 0) {
                    if (pp && c == 0) {
                        named_bar(5, 256); /* consume consumer 1's free turn */
                    }
                    break;
                }
                /* Tile 0: S only. */
                fence_o();
                if (pp) {
                    named_bar(5 + c, 256);
                }
                lkv__wgmma_fence();
                issue_s(s, sacc);
                if (pp) {
                    named_arrive(6 - c, 256);
                }
                lkv__wgmma_wait<0>();
                fence_s(sacc);
                softmax(sacc, m, tfull);
                rescale_pack(sacc);
                int prev_s = s;
                for (int it = 1;; it++) {
                    prep(it);
                    if (kind < 0) {
                        break;
                    }
                    /* S(it) and P V(it - 1) in flight together; softmax(it) under P V. */
                    fence_o();
                    if (pp) {
                        named_bar(5 + c, 256);
                    }
                    lkv__wgmma_fence();
                    issue_s(s, sacc);
                    issue_pv(prev_s);
                    if (pp) {
                        named_arrive(6 - c, 256);
                    }
                    lkv__wgmma_wait<1>();
                    fence_s(sacc);
                    softmax(sacc, m, tfull);
                    lkv__wgmma_wait<0>();
                    fence_o();
                    release(prev_s);
                    rescale_pack(sacc);
                    prev_s = s;
                }
                /* The last tile's P V. */
                fence_o();
                if (pp) {
                    named_bar(5 + c, 256);
                }
                lkv__wgmma_fence();
                issue_pv(prev_s);
                if (pp && c == 0) {
                    named_arrive(6, 256);
                }
                lkv__wgmma_wait<0>();
                fence_o();
                release(prev_s);
            }

        } else {
            /* S one tile ahead (PF): S(it + 1) is issued before the softmax of tile it, so
             * the softmax never waits for its own product, and P V(it - 1) with S(it + 1) keep
             * the tensor cores busy under it. Two S accumulators (sacc, sb), alternating: the
             * loop body is written twice with the roles swapped (registers need constant
             * indices). Per half (X = the accumulator of tile it, Y = the other):
             *   issue P V(it - 1); wait S(it) (issued one half earlier); prep(it + 1) (waits for
             *   its stage; a rotation is safe: no product that reads Q is pending); issue
             *   S(it + 1) into Y; softmax(it) on X; wait P V(it - 1); release its stage;
             *   rescale O, pack P(it).
             * A stage is held from S(it) to P V(it) (three halves), so the producer runs
             * NST - 3 tiles ahead. The exits leave the last tile's S complete in sacc (the odd
             * half copies it over) and its predecessor's P V pending; no wgmma sits under a
             * branch. Ping-pong (pp) is not combined with PF (the host never asks for both). */
            float sb[BN / 2];
            for (int once = 0; once < 1; once++) {
                prep(0);
                if (kind < 0) {
                    break;
                }
                int s_c = s, s_p = s;
                const wg_meta<BN> *m_c = m;
                bool f_c = tfull, have_prev = false;
                lkv__wgmma_fence();
                issue_s(s_c, sacc);
                lkv__wgmma_wait<0>();
                fence_s(sacc);
                for (int once2 = 0; once2 < 1; once2++) {
                    prep(1);
                    if (kind < 0) {
                        break;
                    }
                    lkv__wgmma_fence();
                    issue_s(s, sb);
                    softmax(sacc, m_c, f_c);
                    rescale_pack(sacc);
                    s_p = s_c;
                    s_c = s;
                    m_c = m;
                    f_c = tfull;
                    have_prev = true;
                    for (int it = 2;; it += 2) {
                        /* X = sb (tile it - 1), Y = sacc. */
                        fence_o();
                        named_bar(bar_id, 128); /* every warp's part of P is in pw */
                        lkv__wgmma_fence();
                        issue_pv(s_p);
                        lkv__wgmma_wait<1>();
                        fence_s(sb);
                        prep(it);
                        if (kind < 0) {
                            __trap(); /* the producer pads to an odd count */
                        }
                        lkv__wgmma_fence();
                        issue_s(s, sacc);
                        softmax(sb, m_c, f_c);
                        lkv__wgmma_wait<1>();
                        fence_o();
                        release(s_p);
                        rescale_pack(sb);
                        s_p = s_c;
                        s_c = s;
                        m_c = m;
                        f_c = tfull;
                        /* X = sacc (tile it), Y = sb. */
                        fence_o();
                        named_bar(bar_id, 128); /* every warp's part of P is in pw */
                        lkv__wgmma_fence();
                        issue_pv(s_p);
                        lkv__wgmma_wait<1>();
                        fence_s(sacc);
                        prep(it + 1);
                        if (kind < 0) {
                            break;
                        }
                        lkv__wgmma_fence();
                        issue_s(s, sb);
                        softmax(sacc, m_c, f_c);
                        lkv__wgmma_wait<1>();
                        fence_o();
                        release(s_p);
                        rescale_pack(sacc);
                        s_p = s_c;
                        s_c = s;
                        m_c = m;
                        f_c = tfull;
                    }
                }
                /* The last tile (S complete in sacc; its predecessor's P V pending when
                 * have_prev), then its P V. */
                softmax(sacc, m_c, f_c);
                lkv__wgmma_wait<0>();
                fence_o();
                if (have_prev) {
                    release(s_p);
                }
                rescale_pack(sacc);
                named_bar(bar_id, 128);
                lkv__wgmma_fence();
                issue_pv(s_c);
                lkv__wgmma_wait<0>();
                fence_o();
                release(s_c);
            }
        }

        /* Epilogue. */
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float l = lrow[hf];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int gr = wrow0 + cw * 16 + (lane >> 2) + hf * 8;
            if (gr >= R) {
                continue;
            }
            const int tok = gr / g, head = kvh * g + gr % g;
            const size_t orow = (size_t)tok * p.n_q + head;
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            if (p.n_splits == 1) {
                T *out = (T *)p.out + orow * D;
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    const int col = n * 8 + (lane & 3) * 2;
                    *(uint32_t *)(out + col) =
                        lkv__elem<T>::pack2(o[4 * n + 2 * hf] * inv, o[4 * n + 2 * hf + 1] * inv);
                }
            } else {
                float *po = p.part_o + (orow * p.n_splits + split) * D;
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    const int col = n * 8 + (lane & 3) * 2;
                    *(float2 *)(po + col) =
                        make_float2(o[4 * n + 2 * hf] * inv, o[4 * n + 2 * hf + 1] * inv);
                }
                if ((lane & 3) == 0) {
                    p.part_lse[orow * p.n_splits + split] =
                        l > 0.0f ? mrow[hf] + log2f(l) : -INFINITY;
                }
            }
        }
        if (p.n_splits > 1 && p.counters != NULL) {
            merge_last<T, D>(p, (int *)(sm + L::OFF_FLAG), (float *)(sm + L::OFF_K), ct + 128 * c,
                             row0, kvh);
        }
    }
#endif
}

/* ---------------------------------------------------------------- host */

typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                              const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                              const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* The driver's cuTensorMapEncodeTiled through the runtime (no link against libcuda), once. */
static encode_fn get_encode(void)
{
    static encode_fn fn;
    static int tried;
    if (!tried) {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess) {
            fn = (encode_fn)f;
        }
        cudaGetLastError();
        tried = 1;
    }
    return fn;
}

/* Per device: 1 when it is compute capability 9.0 and the sm_90a kernel loads on it. */
static int device_ok(void)
{
    static int cached[64]; /* 0 unknown, 1 yes, 2 no */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        cudaGetLastError();
        return 0;
    }
    if (cached[dev] == 0) {
        int major = 0, minor = 0;
        cudaFuncAttributes fa;
        const bool ok =
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
            major == 9 && minor == 0 &&
            cudaFuncGetAttributes(
                &fa, prefill_wgmma_kernel<__nv_bfloat16, 128, 64, 4, false, true>) == cudaSuccess &&
            fa.binaryVersion == 90 && get_encode() != NULL;
        cudaGetLastError();
        cached[dev] = ok ? 1 : 2;
    }
    return cached[dev] == 1;
}

int lkv__prefill_wgmma_ok(const prefill_params *p)
{
    const uintptr_t al = (uintptr_t)p->q | (uintptr_t)p->k_new | (uintptr_t)p->v_new |
                         (uintptr_t)p->out | (uintptr_t)p->arena;
    return (p->d == 64 || p->d == 128) && p->B % 8 == 0 && p->page_bytes % 16 == 0 &&
           al % 16 == 0 && (p->dtype == LKV_DTYPE_BF16 || p->dtype == LKV_DTYPE_F16) && device_ok();
}

/* One tiled tensor map of rank 3 or 4 (128-byte swizzle, element strides 1); what names it in
 * the error line. */
static int encode_map(CUtensorMap *m, int dtype, const void *base, cuuint32_t rank,
                      const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                      const char *what)
{
    const cuuint32_t es[4] = {1, 1, 1, 1};
    const CUresult r =
        get_encode()(m,
                     dtype == LKV_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                             : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                     rank, (void *)base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "lkv_prefill_wgmma: cuTensorMapEncodeTiled%s failed (%d)\n", what, (int)r);
        return LKV_ECUDA;
    }
    return 0;
}

static int encode(CUtensorMap *m, int dtype, const void *base, cuuint64_t d1, cuuint64_t d2,
                  cuuint64_t s1, cuuint64_t s2, cuuint32_t b1, cuuint32_t b2, int D)
{
    const cuuint64_t dims[3] = {(cuuint64_t)D, d1, d2};
    const cuuint64_t strides[2] = {s1, s2};
    const cuuint32_t box[3] = {64, b1, b2};
    return encode_map(m, dtype, base, 3, dims, strides, box, "");
}

/* VB's map of the arena's V rows: [pages][panels of 64 columns][rows of a page][64] (the panel
 * stride 128 bytes, inside a row), so one box of 64 x B x D / 64 lands as [panel][B][64]. */
static int encode_vb(CUtensorMap *m, int dtype, const void *base, cuuint64_t rows_pp,
                     cuuint64_t pages, cuuint64_t page_bytes, cuuint32_t B, int D)
{
    const cuuint64_t dims[4] = {64, rows_pp, (cuuint64_t)D / 64, pages};
    const cuuint64_t strides[3] = {(cuuint64_t)D * 2, 128, page_bytes};
    const cuuint32_t box[4] = {64, B, (cuuint32_t)D / 64, 1};
    return encode_map(m, dtype, base, 4, dims, strides, box, " (VB)");
}

template <typename T, int D, int BN, int NST, bool QR, bool PF = false>
static int launch(const prefill_params &p, const lkv__dev_pe &pe, const lkv__dev_slopes &sl,
                  cudaStream_t st)
{
    CUtensorMap ta, tk, tv, tav;
    memset(&ta, 0, sizeof ta);
    memset(&tav, 0, sizeof tav);
    const uint64_t row = (uint64_t)D * 2;
    /* Arena: [pages][rows of a page][D]; the page count is the reference format's limit (the
     * copies only touch pages that references name). */
    const uint64_t rows_pp = (uint64_t)p.n_layers * 2u * (uint64_t)p.n_kv * (uint64_t)p.B;
    if (p.n_refs > 0 && encode(&ta, p.dtype, p.arena, rows_pp, (uint64_t)LKV_REF_MAX_PAGE + 1u, row,
                               p.page_bytes, (cuuint32_t)p.B, 1, D) != 0) {
        return LKV_ECUDA;
    }
    if (p.n_refs > 0 && p.wg_vb &&
        encode_vb(&tav, p.dtype, p.arena, rows_pp, (uint64_t)LKV_REF_MAX_PAGE + 1u, p.page_bytes,
                  (cuuint32_t)p.B, D) != 0) {
        return LKV_ECUDA;
    }
    /* New tokens: [n_new][n_kv][D]. */
    if (encode(&tk, p.dtype, p.k_new, (uint64_t)p.n_kv, (uint64_t)p.n_new, row,
               row * (uint64_t)p.n_kv, 1, BN, D) != 0 ||
        encode(&tv, p.dtype, p.v_new, (uint64_t)p.n_kv, (uint64_t)p.n_new, row,
               row * (uint64_t)p.n_kv, 1, BN, D) != 0) {
        return LKV_ECUDA;
    }
    const int smem = wg_smem<D, BN, NST, PF>::ALLOC;
    static bool attr_set;
    if (!attr_set) {
        LKV__CUDA_CHECK(cudaFuncSetAttribute(prefill_wgmma_kernel<T, D, BN, NST, QR, PF>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr_set = true;
    }
    const long rows = (long)p.n_new * p.group;
    dim3 grid((unsigned)((rows + WG_BM - 1) / WG_BM), (unsigned)p.n_kv, (unsigned)p.n_splits);
    prefill_wgmma_kernel<T, D, BN, NST, QR, PF>
        <<<grid, WG_THREADS, smem, st>>>(p, pe, sl, ta, tk, tv, tav);
    LKV__CUDA_CHECK_LAUNCH();
    return 0;
}

template <typename T>
static int launch_t(const prefill_params *p, const lkv__dev_pe *pe, const lkv__dev_slopes *sl,
                    cudaStream_t st)
{
    const bool qr = p->wg_qr != 0;
    /* S one tile ahead (PF, the default): BN 64, Q from shared memory (two S accumulators
     * and Q's fragments do not fit the consumers' registers), no ping-pong. */
    if (p->wg_pf && p->wg_bn == 64 && !p->wg_pp) {
        if (p->d == 128) {
            return p->wg_nst == 5 ? launch<T, 128, 64, 5, false, true>(*p, *pe, *sl, st)
                                  : launch<T, 128, 64, 4, false, true>(*p, *pe, *sl, st);
        }
        return p->wg_nst == 5 ? launch<T, 64, 64, 5, false, true>(*p, *pe, *sl, st)
                              : launch<T, 64, 64, 4, false, true>(*p, *pe, *sl, st);
    }
    if (p->d == 128) {
        if (p->wg_bn == 128) {
            return launch<T, 128, 128, 2, false>(*p, *pe, *sl, st);
        }
        if (p->wg_bn == 96) {
            return qr ? launch<T, 128, 96, 3, true>(*p, *pe, *sl, st)
                      : launch<T, 128, 96, 3, false>(*p, *pe, *sl, st);
        }
        if (p->wg_nst == 5 && qr) {
            return launch<T, 128, 64, 5, true>(*p, *pe, *sl, st);
        }
        return qr ? launch<T, 128, 64, 4, true>(*p, *pe, *sl, st)
                  : launch<T, 128, 64, 4, false>(*p, *pe, *sl, st);
    }
    if (p->wg_bn == 96) {
        return qr ? launch<T, 64, 96, 4, true>(*p, *pe, *sl, st)
                  : launch<T, 64, 96, 4, false>(*p, *pe, *sl, st);
    }
    return qr ? launch<T, 64, 64, 4, true>(*p, *pe, *sl, st)
              : launch<T, 64, 64, 4, false>(*p, *pe, *sl, st);
}

int lkv__prefill_wgmma_launch(const prefill_params *p, const lkv__dev_pe *pe,
                              const lkv__dev_slopes *sl, cudaStream_t st)
{
    /* VB only where a 16-key step of P V never straddles two blocks unevenly and the blocks
     * tile the stage: head_dim 128 (at 64 the layouts are the same), BN 64, B 8, 16, 32, 64. */
    if (p->wg_vb && !(p->d == 128 && (p->wg_bn == 64 || p->wg_bn == 0) &&
                      (p->B == 8 || p->B == 16 || p->B == 32 || p->B == 64))) {
        prefill_params q = *p;
        q.wg_vb = 0;
        return lkv__prefill_wgmma_launch(&q, pe, sl, st);
    }
    return p->dtype == LKV_DTYPE_BF16 ? launch_t<__nv_bfloat16>(p, pe, sl, st)
                                      : launch_t<__half>(p, pe, sl, st);
}
