/*
 * lkv_prefill.cu: LazyAttention prefill on CUDA: n_new new tokens attend to cached documents
 * (block references, all visible) and causally to themselves.
 *
 * Tensor-core path (head_dim 64 or 128, template D): flash-attention 2 style with
 * mma.sync.m16n8k16 (bf16 or fp16 in, fp32 accumulate), 4 warps, BM = 128 query rows per CTA
 * (PF_MI = 2 slices of 16 rows per warp, so each K and V fragment loaded by ldmatrix feeds
 * two MMAs), BN = 32 keys per tile (64 spilled registers and was slower; kernels/dev/README.md),
 * K and V tiles double-buffered in shared memory with cp.async (zero-filled where a key slot
 * is invalid), 16-byte chunks XOR-swizzled by row so that ldmatrix is conflict-free. Two CTAs
 * per SM. GQA: the rows of a CTA are "packed" (row = token * group + head-in-group) so one kv
 * head's K/V tile serves all query heads of its group.
 *
 * Key tiles. The CTA walks its split's block references in order; a tile is a run of up to
 * BN / B consecutive references with the SAME document start (a tile never spans two
 * documents), so one query rotation serves the whole tile; a block larger than BN takes
 * several tiles. The last split then walks the new tokens in tiles of BN (only up to the CTA's
 * last query token: causal). References of the split are staged in shared memory in windows
 * of REF_WIN.
 *
 * Lazy RoPE (DESIGN.md 10.4, option B): whenever a tile's document start differs from the last
 * one, the CTA re-reads its raw query rows from global memory (16-byte loads, L2-resident)
 * into the shared Q tile and rotates them there in place by (row position - start), in fp32
 * with exact-angle sincos (one per (token, pair), shared by the token's GQA rows), folding in
 * the softmax scale and log2(e), rounded once to 16 bits; rotations never compound. Warps
 * load their A fragments from that tile with ldmatrix at every K step. The new tokens are a
 * segment starting at new_start. ALiBi adds slope * (key position - row position). Tiles
 * whose keys are all valid and visible (no ALiBi) skip the per-key masking.
 *
 * Split-KV: when the grid of (row tiles x kv heads) is too small to fill the GPU, the
 * references are split over several CTAs and the partials merged by log-sum-exp.
 *
 * Hopper: where lkv__prefill_wgmma_ok allows (compute capability 9.0, blocks of a multiple of 8
 * tokens, aligned tensors), the launcher hands head_dim 64/128 to the warp-specialised wgmma +
 * TMA kernel of lkv_prefill_wgmma.cu instead (same parameters, its own split plan: one CTA per
 * SM); this kernel stays the path everywhere else.
 *
 * Generic path (any other head_dim 8..256): one warp per (token, query head), CUDA cores,
 * fp32 rotated query, keys one by one. Correct everywhere, fast nowhere; it serves small
 * models (the tiny test model has head_dim 8).
 */
#include <limits.h>
#include <stdlib.h>

#include "lkv_cuda_common.cuh"
#include "lkv_prefill_internal.cuh"

extern "C" {
#include "lkv_attn_cuda.h"
}

#define PF_MI 2            /* 16-row slices per warp */
#define PF_BM (64 * PF_MI) /* query rows per CTA: 4 warps x 16 MI */
#ifndef PF_BN
#define PF_BN 32 /* keys per tile (32 or 64; v4 measured 64 slower: register spills) */
#endif
#define PF_THREADS 128
#define PF_TPR     (PF_THREADS / PF_BN) /* threads per key row in the tile loads */
#define PF_REF_WIN 256                  /* references staged in shared memory at a time */
static_assert(PF_BN == 32 || PF_BN == 64, "tile loads: 2 or 4 threads per key row");

/* ---------------------------------------------------------------- PTX wrappers */

#define smem_u32        lkv__smem_u32
#define ldsm_x4         lkv__ldsm_x4
#define ldsm_x4_t       lkv__ldsm_x4_t
#define mma_op          lkv__mma
#define cp_async16      lkv__cp_async16
#define cp_async_commit lkv__cp_async_commit
#define cp_async_wait   lkv__cp_async_wait

/* Swizzled element offset of (row, col) in a [rows][D] 16-bit tile. */
template <int D> static __device__ __forceinline__ int swz(int row, int col)
{
    return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

/* ---------------------------------------------------------------- tiles */

struct tile_desc {
    int kind;  /* 0: cached blocks, 1: new tokens, -1: done. */
    int r, nb; /* Cached: references [r, r + nb). */
    int j0;    /* New: first new key. */
    int start; /* Document start (cached) or new_start (new): the rotation origin. */
    int full;  /* Every key valid and visible to every row, no bias: no per-key masking. */
    int t0;    /* Cached, blocks larger than a tile (B > BN): first token of the block. */
    int vlim;  /* Cached: valid tokens of block r (min(valid, B)). */
};

template <typename T, int D>
__global__ void __launch_bounds__(PF_THREADS, 2)
    prefill_mma_kernel(const prefill_params p, const lkv__dev_pe pe, const lkv__dev_slopes sl)
{
    constexpr int MI = PF_MI;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *qr = (T *)smem_raw;                             /* [BM][D] rotated, scaled query tile */
    T *ks = qr + PF_BM * D;                            /* [2][BN][D] */
    T *vs = ks + 2 * PF_BN * D;                        /* [2][BN][D] */
    uint64_t *rbuf = (uint64_t *)(vs + 2 * PF_BN * D); /* [REF_WIN] */
    int *colpos = (int *)(rbuf + PF_REF_WIN);          /* [2][BN], -1 = invalid */
    float *fhi = (float *)(colpos + 2 * PF_BN);        /* [128] */
    float *flo = fhi + 128;                            /* [128] */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int mt = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int g = p.group;
    const int R = p.n_new * g;
    const int row0 = mt * PF_BM;
    const int wrow0 = warp * 16 * MI; /* First row of this warp in the tile. */
    const int kend = min(p.n_new, (min(R, row0 + PF_BM) - 1) / g + 1);
    const int r_lo = min(p.n_refs, split * p.refs_per_split);
    const int r_hi = split == p.n_splits - 1 ? p.n_refs : min(p.n_refs, r_lo + p.refs_per_split);
    const bool do_new = split == p.n_splits - 1;
    const int nbmax = max(1, PF_BN / p.B);
    const size_t slab_k = ((size_t)(p.layer * 2) * p.n_kv + kvh) * p.slab_bytes;
    const bool alibi = pe.kind == LKV_POSENC_ALIBI;

    for (int j = tid; j < pe.n_pairs; j += PF_THREADS) {
        fhi[j] = pe.freq_hi[j];
        flo[j] = pe.freq_lo[j];
    }
    int w0 = r_lo, wcnt = 0;
    if (r_lo < r_hi) {
        wcnt = min(PF_REF_WIN, r_hi - r_lo);
        for (int i = tid; i < wcnt; i += PF_THREADS) {
            rbuf[i] = p.refs[r_lo + i];
        }
    }
    __syncthreads();

    /* Per-row data of this lane's rows: r = lane/4 (+8) of each of the warp's MI 16-row
     * slices. */
    int rowpos[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int gr = row0 + wrow0 + mi * 16 + (lane >> 2) + hf * 8;
            rowpos[mi][hf] = p.new_start + (gr < R ? gr / g : 0);
        }
    }
    /* ALiBi slope (log2 domain) of one of this lane's rows; only on the masked path. */
    auto rslope = [&](int mi, int hf) -> float {
        const int gr = row0 + wrow0 + mi * 16 + (lane >> 2) + hf * 8;
        return gr < R ? sl.s[kvh * g + gr % g] * LKV__LOG2E : 0.0f;
    };

    /* Tile walk (evaluated identically by every thread). */
    auto first_or_next = [&](const tile_desc &prev, bool first) -> tile_desc {
        tile_desc t;
        t.kind = -1;
        t.r = 0;
        t.nb = 0;
        t.j0 = 0;
        t.start = 0;
        t.full = 0;
        t.t0 = 0;
        t.vlim = 0;
        if (!first && prev.kind == 0 && prev.t0 + PF_BN < prev.vlim) {
            /* B > BN: the next tile of the same block (same window entry, same start). */
            t = prev;
            t.t0 = prev.t0 + PF_BN;
            t.full = t.t0 + PF_BN <= t.vlim && !alibi;
            return t;
        }
        int r = first ? r_lo : (prev.kind == 0 ? prev.r + prev.nb : r_hi);
        if (r < r_hi) {
            if (r >= w0 + wcnt) { /* Slide the reference window. */
                __syncthreads();
                w0 = r;
                wcnt = min(PF_REF_WIN, r_hi - r);
                for (int i = tid; i < wcnt; i += PF_THREADS) {
                    rbuf[i] = p.refs[r + i];
                }
                __syncthreads();
            }
            t.kind = 0;
            t.r = r;
            t.start = (int)lkv_ref_start(rbuf[r - w0]);
            int nb = 1;
            bool all = (int)lkv_ref_valid(rbuf[r - w0]) >= p.B;
            while (nb < nbmax && r + nb < w0 + wcnt &&
                   (int)lkv_ref_start(rbuf[r + nb - w0]) == t.start) {
                all = all && (int)lkv_ref_valid(rbuf[r + nb - w0]) >= p.B;
                nb++;
            }
            t.nb = nb;
            t.vlim = min((int)lkv_ref_valid(rbuf[r - w0]), p.B);
            t.full = (p.B > PF_BN ? PF_BN <= t.vlim : all && nb * p.B == PF_BN) && !alibi;
            return t;
        }
        if (!do_new) {
            return t;
        }
        int j0 = (!first && prev.kind == 1) ? prev.j0 + PF_BN : 0;
        if (j0 < kend) {
            t.kind = 1;
            t.j0 = j0;
            t.start = p.new_start;
            /* Causal: the last key of the tile precedes the CTA's first token. */
            t.full = j0 + PF_BN <= p.n_new && j0 + PF_BN - 1 <= row0 / g && !alibi;
        }
        return t;
    };

    auto issue = [&](const tile_desc &t, int buf) {
        T *kd = ks + buf * PF_BN * D;
        T *vd = vs + buf * PF_BN * D;
        /* PF_TPR threads per key row: the row's source is found once, then the thread
         * copies chunks half + PF_TPR * i of K and V. */
        const int c = tid / PF_TPR, half = tid % PF_TPR;
        const char *ksrc = (const char *)p.k_new;
        const char *vsrc = (const char *)p.v_new;
        bool ok = false;
        int cp = -1; /* Key position of the row, -1 if the slot is invalid. */
        if (t.kind == 0) {
            /* t.t0 > 0 only when B > BN (then nb = 1, bi = 0). */
            const int bi = c / p.B, tt = c - bi * p.B + t.t0;
            if (bi < t.nb) {
                const uint64_t ref = rbuf[t.r + bi - w0];
                ok = tt < min((int)lkv_ref_valid(ref), p.B);
                if (ok) {
                    ksrc = p.arena + (size_t)lkv_ref_page(ref) * p.page_bytes + slab_k +
                           (size_t)tt * D * sizeof(T);
                    vsrc = ksrc + (size_t)p.n_kv * p.slab_bytes;
                    cp = t.start + (int)lkv_ref_block(ref) * p.B + tt;
                }
            }
        } else {
            const int j = t.j0 + c;
            ok = j < p.n_new;
            if (ok) {
                const size_t off = ((size_t)j * p.n_kv + kvh) * D * sizeof(T);
                ksrc += off;
                vsrc += off;
                cp = p.new_start + j;
            }
        }
        if (half == 0) {
            colpos[buf * PF_BN + c] = cp;
        }
#pragma unroll
        for (int i = 0; i < D / 8 / PF_TPR; i++) {
            const int ch = half + PF_TPR * i;
            const size_t off = ok ? (size_t)ch * 16 : 0;
            cp_async16(kd + swz<D>(c, ch * 8), ksrc + off, ok);
            cp_async16(vd + swz<D>(c, ch * 8), vsrc + off, ok);
        }
    };

    /* Rotates the query tile for origin `start` into qr, folding in the softmax scale and
     * log2(e), rounded once: the raw rows are re-read from global memory (16-byte loads; the
     * tile is small and L2-resident after the first time), then rotated in place with one
     * sincos per (token, pair), shared by the token's g rows. Callers synchronise before (qr
     * may be in use) and after. */
    const int tok_lo = row0 / g;
    const int n_tok = (row0 + PF_BM - 1) / g - tok_lo + 1;
    auto rotate = [&](int start) {
        constexpr int NCH = PF_BM * (D / 8) / PF_THREADS; /* 16-byte chunks per thread */
        constexpr int NB = 2;                             /* loads in flight per batch */
        static_assert(NCH % NB == 0, "rotation load batches");
        const T *qg = (const T *)p.q;
#pragma unroll
        for (int b0 = 0; b0 < NCH; b0 += NB) {
            uint4 v[NB];
#pragma unroll
            for (int u = 0; u < NB; u++) {
                const int idx = tid + (b0 + u) * PF_THREADS;
                const int row = idx / (D / 8), ch = idx % (D / 8);
                const int gr = row0 + row;
                v[u] = make_uint4(0u, 0u, 0u, 0u);
                if (gr < R) {
                    const int tok = gr / g, head = kvh * g + gr % g;
                    v[u] = __ldg((const uint4 *)(qg + ((size_t)tok * p.n_q + head) * D + ch * 8));
                }
            }
#pragma unroll
            for (int u = 0; u < NB; u++) {
                const int idx = tid + (b0 + u) * PF_THREADS;
                const int row = idx / (D / 8), ch = idx % (D / 8);
                *(uint4 *)(qr + swz<D>(row, ch * 8)) = v[u];
            }
        }
        __syncthreads();
        const int np = pe.n_pairs;
        const float sc = p.scale_log2;
        for (int idx = tid; idx < n_tok * (D / 2); idx += PF_THREADS) {
            const int tk = idx / (D / 2), k = idx % (D / 2);
            const int tok = tok_lo + tk;
            const int rlo = max(0, tok * g - row0), rhi = min(PF_BM, tok * g + g - row0);
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
                float s, c;
                lkv__turn_sincos(delta, fhi[k], flo[k], &s, &c);
                for (int row = rlo; row < rhi; row++) {
                    const float x0 = lkv__elem<T>::to_f(qr[swz<D>(row, i0)]);
                    const float x1 = lkv__elem<T>::to_f(qr[swz<D>(row, i1)]);
                    qr[swz<D>(row, i0)] = lkv__elem<T>::from_f((x0 * c - x1 * s) * sc);
                    qr[swz<D>(row, i1)] = lkv__elem<T>::from_f(fmaf(x0, s, x1 * c) * sc);
                }
            } else {
                const int i0 = 2 * np + 2 * (k - np);
                for (int row = rlo; row < rhi; row++) {
                    qr[swz<D>(row, i0)] =
                        lkv__elem<T>::from_f(lkv__elem<T>::to_f(qr[swz<D>(row, i0)]) * sc);
                    qr[swz<D>(row, i0 + 1)] =
                        lkv__elem<T>::from_f(lkv__elem<T>::to_f(qr[swz<D>(row, i0 + 1)]) * sc);
                }
            }
        }
    };

    float o[MI][D / 8][4];
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.0f;
        }
    }
    float mrow[MI][2], lrow[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
        mrow[mi][0] = mrow[mi][1] = -INFINITY;
        lrow[mi][0] = lrow[mi][1] = 0.0f;
    }

    tile_desc cur;
    cur.kind = -1;
    cur = first_or_next(cur, true);
    if (cur.kind >= 0) {
        issue(cur, 0);
    }
    cp_async_commit();
    int buf = 0;
    int rot_start = INT_MIN;
    while (cur.kind >= 0) {
        tile_desc nxt = first_or_next(cur, false);
        if (nxt.kind >= 0) {
            issue(nxt, buf ^ 1);
        }
        cp_async_commit();
        if (cur.start != rot_start) {
            /* Every warp is past the previous tile (barrier at the loop end): qr is free. */
            rot_start = cur.start;
            rotate(cur.start);
        }
        cp_async_wait<1>();
        __syncthreads();
        const T *kt = ks + buf * PF_BN * D;
        const T *vt = vs + buf * PF_BN * D;
        const int *cpos = colpos + buf * PF_BN;

        /* S = Q K^T: each K fragment feeds the warp's MI row slices. */
        float sacc[MI][PF_BN / 8][4];
#pragma unroll
        for (int mi = 0; mi < MI; mi++) {
#pragma unroll
            for (int n = 0; n < PF_BN / 8; n++) {
                sacc[mi][n][0] = sacc[mi][n][1] = sacc[mi][n][2] = sacc[mi][n][3] = 0.0f;
            }
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t qa[MI][4];
            const int m = lane >> 3;
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                const int row = wrow0 + mi * 16 + (m & 1) * 8 + (lane & 7);
                const int col = kk * 16 + (m >> 1) * 8;
                ldsm_x4(qa[mi][0], qa[mi][1], qa[mi][2], qa[mi][3], qr + swz<D>(row, col));
            }
#pragma unroll
            for (int np2 = 0; np2 < PF_BN / 16; np2++) {
                const int row = np2 * 16 + (m >> 1) * 8 + (lane & 7);
                const int col = kk * 16 + (m & 1) * 8;
                uint32_t b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, kt + swz<D>(row, col));
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    mma_op<T>::run(sacc[mi][2 * np2], qa[mi], b0, b1);
                    mma_op<T>::run(sacc[mi][2 * np2 + 1], qa[mi], b2, b3);
                }
            }
        }
        /* Mask and bias (scores are already scaled, log2 domain); online softmax per row. */
        const bool causal = cur.kind == 1;
        if (!cur.full) {
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int rp = rowpos[mi][hf];
                    const float slope = alibi ? rslope(mi, hf) : 0.0f;
#pragma unroll
                    for (int n = 0; n < PF_BN / 8; n++) {
                        const int2 kp2 = *(const int2 *)(cpos + n * 8 + (lane & 3) * 2);
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int kp = e ? kp2.y : kp2.x;
                            float sv = sacc[mi][n][hf * 2 + e];
                            if (kp < 0 || (causal && kp > rp)) {
                                sv = -INFINITY;
                            } else if (alibi) {
                                sv = fmaf(slope, (float)(kp - rp), sv);
                            }
                            sacc[mi][n][hf * 2 + e] = sv;
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int mi = 0; mi < MI; mi++) {
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                float red[PF_BN / 8];
#pragma unroll
                for (int n = 0; n < PF_BN / 8; n++) {
                    red[n] = fmaxf(sacc[mi][n][hf * 2], sacc[mi][n][hf * 2 + 1]);
                }
#pragma unroll
                for (int w = PF_BN / 16; w >= 1; w >>= 1) {
#pragma unroll
                    for (int n = 0; n < w; n++) {
                        red[n] = fmaxf(red[n], red[n + w]);
                    }
                }
                float mx = red[0];
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(mrow[mi][hf], mx);
                const float muse = mnew == -INFINITY ? 0.0f : mnew;
                const float alpha = lkv__ex2(mrow[mi][hf] - muse);
                mrow[mi][hf] = mnew;
#pragma unroll
                for (int n = 0; n < PF_BN / 8; n++) {
                    sacc[mi][n][hf * 2] = lkv__ex2(sacc[mi][n][hf * 2] - muse);
                    sacc[mi][n][hf * 2 + 1] = lkv__ex2(sacc[mi][n][hf * 2 + 1] - muse);
                    red[n] = sacc[mi][n][hf * 2] + sacc[mi][n][hf * 2 + 1];
                }
#pragma unroll
                for (int w = PF_BN / 16; w >= 1; w >>= 1) {
#pragma unroll
                    for (int n = 0; n < w; n++) {
                        red[n] += red[n + w];
                    }
                }
                lrow[mi][hf] = lrow[mi][hf] * alpha + red[0];
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    o[mi][n][hf * 2] *= alpha;
                    o[mi][n][hf * 2 + 1] *= alpha;
                }
            }
        }
        /* O += P V: each V fragment feeds the warp's MI row slices. */
#pragma unroll
        for (int kc = 0; kc < PF_BN / 16; kc++) {
            uint32_t pa[MI][4];
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                pa[mi][0] = lkv__elem<T>::pack2(sacc[mi][2 * kc][0], sacc[mi][2 * kc][1]);
                pa[mi][1] = lkv__elem<T>::pack2(sacc[mi][2 * kc][2], sacc[mi][2 * kc][3]);
                pa[mi][2] = lkv__elem<T>::pack2(sacc[mi][2 * kc + 1][0], sacc[mi][2 * kc + 1][1]);
                pa[mi][3] = lkv__elem<T>::pack2(sacc[mi][2 * kc + 1][2], sacc[mi][2 * kc + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                const int m = lane >> 3;
                const int row = kc * 16 + (m & 1) * 8 + (lane & 7);
                const int col = dp * 16 + (m >> 1) * 8;
                uint32_t b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3, vt + swz<D>(row, col));
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    mma_op<T>::run(o[mi][2 * dp], pa[mi], b0, b1);
                    mma_op<T>::run(o[mi][2 * dp + 1], pa[mi], b2, b3);
                }
            }
        }
        __syncthreads();
        cur = nxt;
        buf ^= 1;
    }
    cp_async_wait<0>();

    /* Epilogue. */
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float l = lrow[mi][hf];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int gr = row0 + wrow0 + mi * 16 + (lane >> 2) + hf * 8;
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
                    const int c = n * 8 + (lane & 3) * 2;
                    *(uint32_t *)(out + c) =
                        lkv__elem<T>::pack2(o[mi][n][hf * 2] * inv, o[mi][n][hf * 2 + 1] * inv);
                }
            } else {
                float *po = p.part_o + (orow * p.n_splits + split) * D;
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    const int c = n * 8 + (lane & 3) * 2;
                    *(float2 *)(po + c) =
                        make_float2(o[mi][n][hf * 2] * inv, o[mi][n][hf * 2 + 1] * inv);
                }
                if ((lane & 3) == 0) {
                    p.part_lse[orow * p.n_splits + split] =
                        l > 0.0f ? mrow[mi][hf] + log2f(l) : -INFINITY;
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- generic path */

/* One warp per (token, query head); 4 warps per CTA. Lane k holds dims k, k + 32, ... */
template <typename T>
__global__ void __launch_bounds__(128)
    prefill_generic_kernel(const prefill_params p, const lkv__dev_pe pe, const lkv__dev_slopes sl)
{
    const int lane = threadIdx.x & 31;
    const int rowid = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (rowid >= p.n_new * p.n_q) {
        return;
    }
    const int tok = rowid / p.n_q, head = rowid % p.n_q, kvh = head / p.group;
    const int d = p.d;
    const int rowpos = p.new_start + tok;
    const T *q = (const T *)p.q + (size_t)rowid * d;
    const bool alibi = pe.kind == LKV_POSENC_ALIBI;
    const float slope = alibi ? sl.s[head] * LKV__LOG2E : 0.0f;
    float qraw[8], qrot[8], acc[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int i = lane + 32 * k;
        qraw[k] = i < d ? lkv__elem<T>::to_f(q[i]) : 0.0f;
        acc[k] = 0.0f;
        qrot[k] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    auto rot = [&](int start) {
        const float delta = (float)(rowpos - start);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int i = lane + 32 * k;
            int pair = 0, partner = i;
            const int role = i < d ? lkv__pair_of(i, pe.pairing, pe.n_pairs, &pair, &partner) : 0;
            float s = 0.0f, c = 1.0f;
            if (role != 0) {
                lkv__turn_sincos(delta, pe.freq_hi[pair], pe.freq_lo[pair], &s, &c);
            }
            const float xp = role != 0 ? lkv__elem<T>::to_f(q[partner]) : 0.0f;
            qrot[k] = fmaf(xp, role > 0 ? -s : s, qraw[k] * c) * p.scale_log2;
        }
    };
    auto attend = [&](const T *kr, const T *vr, int kpos, bool masked) {
        float a = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int i = lane + 32 * k;
            if (i < d) {
                a = fmaf(qrot[k], lkv__elem<T>::to_f(kr[i]), a);
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            a += __shfl_xor_sync(0xffffffffu, a, off);
        }
        if (masked) {
            return;
        }
        if (alibi) {
            a = fmaf(slope, (float)(kpos - rowpos), a);
        }
        const float mn = fmaxf(m, a);
        const float alpha = exp2f(m - mn);
        const float pv = exp2f(a - mn);
        l = l * alpha + pv;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int i = lane + 32 * k;
            acc[k] = acc[k] * alpha + (i < d ? pv * lkv__elem<T>::to_f(vr[i]) : 0.0f);
        }
        m = mn;
    };
    const size_t slab_k = ((size_t)(p.layer * 2) * p.n_kv + kvh) * p.slab_bytes;
    const size_t slab_v = ((size_t)(p.layer * 2 + 1) * p.n_kv + kvh) * p.slab_bytes;
    int cur = INT_MIN;
    for (int r = 0; r < p.n_refs; r++) {
        const uint64_t ref = p.refs[r];
        const int start = (int)lkv_ref_start(ref);
        if (start != cur) {
            cur = start;
            rot(start);
        }
        const char *base = p.arena + (size_t)lkv_ref_page(ref) * p.page_bytes;
        const int valid = min((int)lkv_ref_valid(ref), p.B);
        const int kp0 = start + (int)lkv_ref_block(ref) * p.B;
        for (int t = 0; t < valid; t++) {
            attend((const T *)(base + slab_k) + (size_t)t * d,
                   (const T *)(base + slab_v) + (size_t)t * d, kp0 + t, false);
        }
    }
    rot(p.new_start);
    for (int j = 0; j <= tok; j++) {
        const size_t off = ((size_t)j * p.n_kv + kvh) * d;
        attend((const T *)p.k_new + off, (const T *)p.v_new + off, p.new_start + j, false);
    }
    T *out = (T *)p.out + (size_t)rowid * d;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int i = lane + 32 * k;
        if (i < d) {
            out[i] = lkv__elem<T>::from_f(acc[k] * inv);
        }
    }
}

/* ---------------------------------------------------------------- launcher */

static int shape_ok(const lkv_kv_shape *s)
{
    return s->n_layers >= 1 && s->n_q_heads >= 1 && s->n_q_heads <= LKV_MAX_Q_HEADS &&
           s->n_kv_heads >= 1 && s->n_q_heads % s->n_kv_heads == 0 && s->head_dim >= 8 &&
           s->head_dim <= LKV_MAX_HEAD_DIM && s->head_dim % 8 == 0 && s->block_tokens >= 1 &&
           s->block_tokens <= LKV_MAX_BLOCK_TOKENS;
}

static bool use_mma(const lkv_kv_shape *s)
{
    return s->head_dim == 64 || s->head_dim == 128;
}

/* Which tensor-core kernel takes a launch: the wgmma kernel (lkv_prefill_wgmma.cu) where
 * lkv__prefill_wgmma_ok says it can, else the mma.sync kernel. Test and benchmark knob
 * LKV_ATTN_PREFILL_KERNEL: "mma" forces the mma.sync kernel; "wgmma" makes a launch that the
 * wgmma kernel's shape rules admit (head_dim 64/128, block_tokens % 8 == 0) fail with
 * LKV_ENOTSUP when the kernel cannot run (so a GPU check proves which kernel it checked). */
static int kernel_mode(void)
{
    const char *e = getenv("LKV_ATTN_PREFILL_KERNEL");
    if (e != NULL && strcmp(e, "mma") == 0) {
        return 1;
    }
    return e != NULL && strcmp(e, "wgmma") == 0 ? 2 : 0;
}
static bool want_wgmma(const prefill_params *p)
{
    return kernel_mode() != 1 && lkv__prefill_wgmma_ok(p) != 0;
}

/* Split plan for a tensor-core launch with row tiles of bm rows and ctas_per_sm resident CTAs. */
static void plan_prefill(const lkv_prefill_args *a, int bm, int ctas_per_sm, int max_splits,
                         int *n_splits, int *rps)
{
    const lkv_kv_shape *s = &a->shape;
    *n_splits = 1;
    *rps = a->n_refs > 0 ? a->n_refs : 1;
    if (!use_mma(s) || a->n_refs <= 0) {
        return;
    }
    const long rows = (long)a->n_new * (s->n_q_heads / s->n_kv_heads);
    const long base = (rows + bm - 1) / bm * s->n_kv_heads;
    /* Aim at one whole wave of resident CTAs (more splits only add partials to write and
     * merge: 64 new tokens over 8k took 113 us at two waves, 80 at one, mma.sync kernel). */
    const long target = (long)ctas_per_sm * lkv__cuda_sm_count();
    long splits = target / base;
    const int min_refs = 16; /* At least 16 blocks per split. */
    const long cap = (a->n_refs + min_refs - 1) / min_refs;
    if (splits > cap) {
        splits = cap;
    }
    if (splits > max_splits) {
        splits = max_splits;
    }
    if (splits < 1) {
        splits = 1;
    }
    /* Test and benchmark knob: LKV_ATTN_PREFILL_SPLITS=n forces n splits (capped as above). */
    const char *e = getenv("LKV_ATTN_PREFILL_SPLITS");
    const int forced = e != NULL ? atoi(e) : 0;
    if (forced > 0) {
        splits = forced < cap ? forced : cap;
        splits = splits < max_splits ? splits : max_splits;
    }
    *rps = (int)((a->n_refs + splits - 1) / splits);
    *n_splits = (a->n_refs + *rps - 1) / *rps;
}

/* Fills the launch parameters of a (validated) a, except the workspace pointers. */
static void fill_params(prefill_params *p, const lkv_prefill_args *a)
{
    memset(p, 0, sizeof *p);
    p->q = a->q;
    p->k_new = a->k_new;
    p->v_new = a->v_new;
    p->arena = (const char *)a->arena;
    p->page_bytes = a->page_bytes;
    p->refs = a->refs;
    p->n_refs = a->n_refs;
    p->n_new = a->n_new;
    p->new_start = (int)a->new_start;
    p->n_q = a->shape.n_q_heads;
    p->n_kv = a->shape.n_kv_heads;
    p->group = p->n_q / p->n_kv;
    p->d = a->shape.head_dim;
    p->B = a->shape.block_tokens;
    p->layer = a->layer;
    p->n_layers = a->shape.n_layers;
    p->slab_bytes = lkv_slab_bytes(&a->shape);
    p->out = a->out;
    p->scale_log2 = a->sm_scale * LKV__LOG2E;
    p->dtype = a->shape.dtype;
    /* wgmma kernel variants (test and benchmark knobs): LKV_ATTN_WG_BN=64|96|128 keys per tile
     * (128: head_dim 128 only, Q from shared memory), LKV_ATTN_WG_PP=0|1 ping-pong between its
     * consumer warpgroups, LKV_ATTN_WG_QR=0|1 Q as a register operand (default 1),
     * LKV_ATTN_WG_PF=0|1 S a tile ahead (default 0), LKV_ATTN_WG_VB=0|1 one copy per cached
     * block's V (default 1). */
    const char *e = getenv("LKV_ATTN_WG_BN");
    const int bn = e != NULL ? atoi(e) : 64;
    p->wg_bn = bn == 96 || (bn == 128 && p->d == 128) ? bn : 64;
    e = getenv("LKV_ATTN_WG_QR");
    p->wg_qr = e != NULL ? atoi(e) != 0 : 1;
    e = getenv("LKV_ATTN_WG_FOLD"); /* 1: fold the merge into the launch (measured slower) */
    p->wg_fold = e != NULL ? atoi(e) != 0 : 0;
    e = getenv("LKV_ATTN_WG_NST"); /* 5: a deeper ring (BN 64, Q in registers) */
    p->wg_nst = e != NULL && atoi(e) == 5 ? 5 : 4;
    e = getenv("LKV_ATTN_WG_PF"); /* 1: S issued a tile ahead (measured slower, round 8) */
    p->wg_pf = e != NULL ? atoi(e) != 0 : 0;
    e = getenv("LKV_ATTN_WG_VB"); /* 0: V copied per 64-column panel like K (round 4's) */
    p->wg_vb = e != NULL ? atoi(e) != 0 : 1;
    e = getenv("LKV_ATTN_WG_PP");
    p->wg_pp = e != NULL ? atoi(e) != 0 : 0;
}

/* The kernel choice and split plan of a: sets *wg (wgmma kernel), p->n_splits and
 * p->refs_per_split. */
static void plan_launch(const lkv_prefill_args *a, prefill_params *p, bool *wg)
{
    *wg = use_mma(&a->shape) && want_wgmma(p);
    if (*wg) {
        plan_prefill(a, LKV__WG_BM, 1, LKV__WG_MAX_SPLITS, &p->n_splits, &p->refs_per_split);
    } else {
        plan_prefill(a, PF_BM, 2, 65535, &p->n_splits, &p->refs_per_split);
    }
}

/* Workspace layout of a split launch: part_o [rows][ns][d], part_lse [rows][ns], then (wgmma
 * kernel) the merge counters, one int per (kv head, row tile of LKV__WG_BM rows), 16-byte
 * aligned. */
static size_t ws_counters_off(size_t rows, int ns, int d)
{
    return (rows * (size_t)ns * ((size_t)d + 1) * sizeof(float) + 15) & ~(size_t)15;
}
static size_t ws_counters_bytes(const lkv_prefill_args *a)
{
    const size_t rows = (size_t)a->n_new * (a->shape.n_q_heads / a->shape.n_kv_heads);
    return (rows + LKV__WG_BM - 1) / LKV__WG_BM * a->shape.n_kv_heads * sizeof(int) + 16;
}

extern "C" size_t lkv_attn_prefill_cuda_workspace(const lkv_prefill_args *a)
{
    if (a == NULL || !shape_ok(&a->shape) || a->n_new < 1 || a->n_refs < 0) {
        return 0;
    }
    /* The larger of the two tensor-core kernels' plans, so that the size depends only on the
     * shape, n_new and n_refs (not on the device or the pointers' alignment). */
    int ns = 1, rps = 1;
    plan_prefill(a, LKV__WG_BM, 1, LKV__WG_MAX_SPLITS, &ns, &rps);
    int ns2 = 1;
    plan_prefill(a, PF_BM, 2, 65535, &ns2, &rps);
    ns = ns2 > ns ? ns2 : ns;
    if (ns == 1) {
        return 0;
    }
    const size_t rows = (size_t)a->n_new * a->shape.n_q_heads;
    return ws_counters_off(rows, ns, a->shape.head_dim) + ws_counters_bytes(a);
}

template <typename T, int D>
static int launch_mma(dim3 grid, cudaStream_t st, const prefill_params &p, const lkv__dev_pe &pe,
                      const lkv__dev_slopes &sl)
{
    const size_t smem = (size_t)(PF_BM + 4 * PF_BN) * D * sizeof(T) +
                        PF_REF_WIN * sizeof(uint64_t) + 2 * PF_BN * sizeof(int) +
                        256 * sizeof(float);
    static bool attr_set; /* One per instantiation; setting it twice is harmless. */
    if (!attr_set) {
        LKV__CUDA_CHECK(cudaFuncSetAttribute(
            prefill_mma_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set = true;
    }
    prefill_mma_kernel<T, D><<<grid, PF_THREADS, smem, st>>>(p, pe, sl);
    LKV__CUDA_CHECK_LAUNCH();
    return 0;
}

extern "C" int lkv_attn_prefill_cuda(const lkv_prefill_args *a, void *workspace,
                                     size_t workspace_bytes, void *stream)
{
    if (a == NULL || !shape_ok(&a->shape) || a->layer < 0 || a->layer >= a->shape.n_layers ||
        a->n_new < 1 || a->new_start < 0 || a->new_start + a->n_new - 1 > LKV_MAX_POSITION ||
        a->n_refs < 0 || (a->flags & ~LKV_ATTN_NO_ROTATE) || !isfinite(a->sm_scale) ||
        a->page_bytes < lkv_block_bytes(&a->shape) || a->page_bytes % 16 != 0 || a->q == NULL ||
        a->k_new == NULL || a->v_new == NULL || a->out == NULL ||
        (a->n_refs > 0 && (a->refs == NULL || a->arena == NULL))) {
        return LKV_EINVAL;
    }
    if (a->shape.dtype != LKV_DTYPE_BF16 && a->shape.dtype != LKV_DTYPE_F16) {
        return LKV_ENOTSUP;
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
    prefill_params p;
    fill_params(&p, a);
    bool wg = false;
    plan_launch(a, &p, &wg);
    if (!wg && use_mma(&a->shape) && p.B % 8 == 0 && kernel_mode() == 2) {
        return LKV_ENOTSUP;
    }
    cudaStream_t st = (cudaStream_t)stream;
    const bool bf = a->shape.dtype == LKV_DTYPE_BF16;
    if (!use_mma(&a->shape)) {
        const long rows = (long)a->n_new * p.n_q;
        const unsigned blocks = (unsigned)((rows + 3) / 4);
        if (bf) {
            prefill_generic_kernel<__nv_bfloat16><<<blocks, 128, 0, st>>>(p, pe, sl);
        } else {
            prefill_generic_kernel<__half><<<blocks, 128, 0, st>>>(p, pe, sl);
        }
        LKV__CUDA_CHECK_LAUNCH();
        return 0;
    }
    if (p.n_splits > 1) {
        size_t need = lkv_attn_prefill_cuda_workspace(a);
        if (workspace == NULL) {
            workspace = lkv__cuda_ws_get(need);
            if (workspace == NULL) {
                return LKV_ECUDA;
            }
        } else if (workspace_bytes < need) {
            return LKV_EINVAL;
        }
        const size_t rows = (size_t)a->n_new * p.n_q;
        p.part_o = (float *)workspace;
        p.part_lse = p.part_o + rows * p.n_splits * p.d;
        if (wg && p.wg_fold) {
            /* The wgmma kernel merges in its own launch (its last CTA per row tile and kv
             * head): zero its counters first (they are left zero; this one-shot launcher cannot
             * know whether the workspace was used otherwise in between). */
            const size_t cb = ws_counters_bytes(a);
            p.counters = (int *)((char *)workspace + ws_counters_off(rows, p.n_splits, p.d));
            LKV__CUDA_CHECK(cudaMemsetAsync(p.counters, 0, cb, (cudaStream_t)stream));
        }
    }
    if (p.n_splits > 65535) {
        return LKV_EINVAL;
    }
    const long rows = (long)a->n_new * p.group;
    dim3 grid((unsigned)((rows + PF_BM - 1) / PF_BM), p.n_kv, p.n_splits);
    if (wg) {
        rc = lkv__prefill_wgmma_launch(&p, &pe, &sl, st);
    } else if (p.d == 128) {
        rc = bf ? launch_mma<__nv_bfloat16, 128>(grid, st, p, pe, sl)
                : launch_mma<__half, 128>(grid, st, p, pe, sl);
    } else {
        rc = bf ? launch_mma<__nv_bfloat16, 64>(grid, st, p, pe, sl)
                : launch_mma<__half, 64>(grid, st, p, pe, sl);
    }
    if (rc != 0) {
        return rc;
    }
    if (p.n_splits > 1 && p.counters == NULL) {
        return lkv__merge_launch(a->shape.dtype, p.part_o, p.part_lse, a->n_new * p.n_q, p.n_splits,
                                 p.d, a->out, NULL, st);
    }
    return 0;
}
