/*
 * lkv_decode.cu: LazyAttention decode on CUDA (one query token per sequence, paged KV).
 *
 * Work split. One CTA of DEC_WARPS warps per (split, kv head x head chunk, sequence). A head
 * chunk is up to G query heads of one GQA group (G = 1, 2, 4 or 8, the next power of two of
 * the group size, capped at 8; bigger groups, e.g. MQA, take several chunks), so each K/V
 * slab is read once per chunk and shared by its heads. A split is a contiguous range of the
 * sequence's block references; inside a CTA, warp w takes references w, w + W, ... of that
 * range. Partials of a split are merged by log-sum-exp (lkv__merge_launch) when there are
 * several splits, so batch 1 at long context still fills the GPU.
 *
 * Lanes. A K/V row (head_dim elements, 16-bit) is read by L lanes, 8 elements (16 bytes) each,
 * L = the next power of two >= head_dim / 8; a warp covers 32/L rows per load and each lane
 * issues U loads of K and U of V per step (all in flight before the first use). Scores are
 * reduced over the L lanes of a row with xor shuffles. L is a template constant for head_dim
 * 128 (the tuned path) and a runtime value otherwise (generic path, any head_dim 8..256).
 *
 * Lazy RoPE (option B of DESIGN.md 10.2): keys are stored rotated at document-local positions,
 * so only the query is rotated, by q_pos - start, whenever the warp's walk enters a reference
 * with a new document start. Angles use the exact integer offset (hi/lo turns, sincospif);
 * the rotation is fp32 and the rotated query stays fp32 (the softmax scale and log2(e) folded
 * in). The raw query is kept in shared memory as fp32 so rotations never compound. ALiBi adds
 * slope * ((start + block * B + t) - q_pos), exact integers converted once.
 *
 * Softmax: log2 domain with exp2f, online per step (running max is warp-uniform, so every
 * lane's partial accumulator is on the same scale and the row groups are summed at the end).
 */
#include "lkv_cuda_common.cuh"

extern "C" {
#include "lkv_attn_cuda.h"
}

#define DEC_WARPS 4

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

template <typename T, int G, int LT>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    decode_kernel(const decode_params p, const lkv__dev_pe pe, const lkv__dev_slopes sl)
{
    constexpr int U = dec_unroll<G>::U;
    extern __shared__ float smem[];
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
    int64_t cur_start = -1;
    uint64_t ref_next = (r0 + warp < r1) ? p.refs[r0 + warp] : 0;
    for (int r = r0 + warp; r < r1; r += DEC_WARPS) {
        const uint64_t ref = ref_next;
        if (r + DEC_WARPS < r1) {
            ref_next = p.refs[r + DEC_WARPS];
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
        const char *kp = p.arena + (size_t)lkv_ref_page(ref) * p.page_bytes + slab_k;
        const char *vp = p.arena + (size_t)lkv_ref_page(ref) * p.page_bytes + slab_v;
        for (int t0 = 0; t0 < valid; t0 += U * TPI) {
            uint4 kr[U], vr[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int t = t0 + u * TPI + rg;
                kr[u] = make_uint4(0, 0, 0, 0);
                if (dim_on && t < valid) {
                    kr[u] = __ldg((const uint4 *)(kp + ((size_t)t * d + cl * 8) * 2));
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int t = t0 + u * TPI + rg;
                vr[u] = make_uint4(0, 0, 0, 0);
                if (dim_on && t < valid) {
                    vr[u] = __ldg((const uint4 *)(vp + ((size_t)t * d + cl * 8) * 2));
                }
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

/* Launch plan shared by the workspace query and the launcher. */
struct decode_plan {
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
    pl->G = group >= 8 ? 8 : pow2_at_least(group);
    pl->head_chunks = (group + pl->G - 1) / pl->G;
    pl->L = pow2_at_least(s->head_dim / 8);
    if (max_refs < 1) {
        max_refs = 1;
    }
    const long base = (long)batch * s->n_kv_heads * pl->head_chunks;
    const long target = 4L * lkv__cuda_sm_count();
    /* At least 2 references per warp per split, so a split is worth its merge. */
    const int min_refs = 2 * DEC_WARPS;
    long splits = (target + base - 1) / base;
    long cap = (max_refs + min_refs - 1) / min_refs;
    if (splits > cap) {
        splits = cap;
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
    decode_kernel<T, G, LT><<<grid, DEC_WARPS * 32, smem, st>>>(p, pe, sl);
}

template <typename T>
static void launch_typed(const decode_plan &pl, dim3 grid, size_t smem, cudaStream_t st,
                         const decode_params &p, const lkv__dev_pe &pe, const lkv__dev_slopes &sl)
{
    const bool tuned = p.d == 128;
    switch (pl.G) {
    case 1:
        tuned ? launch_one<T, 1, 16>(grid, smem, st, p, pe, sl)
              : launch_one<T, 1, 0>(grid, smem, st, p, pe, sl);
        break;
    case 2:
        tuned ? launch_one<T, 2, 16>(grid, smem, st, p, pe, sl)
              : launch_one<T, 2, 0>(grid, smem, st, p, pe, sl);
        break;
    case 4:
        tuned ? launch_one<T, 4, 16>(grid, smem, st, p, pe, sl)
              : launch_one<T, 4, 0>(grid, smem, st, p, pe, sl);
        break;
    default:
        tuned ? launch_one<T, 8, 16>(grid, smem, st, p, pe, sl)
              : launch_one<T, 8, 0>(grid, smem, st, p, pe, sl);
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
