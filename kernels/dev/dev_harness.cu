/*
 * dev_harness.cu: the workshop harness of kernels/dev (llm.c style). Linked with ONE kernel
 * version (a file that defines the one-shot launchers of lkv_attn_cuda.h: a frozen copy in
 * kernels/dev/ or the production library), it makes a standalone program that
 *   1. validates the version against the CPU reference (kernels/lkv_attn_cpu.c, itself tested
 *      against the fp64 definition in tests/kernels/test_attn.c) on random bf16 cases with
 *      NaN-poisoned outputs: Llama-3.1-8B heads (32 q / 8 kv, d = 128), several documents per
 *      sequence at scattered pages, partial blocks, positions near the maximum; exits 1 on a
 *      failure;
 *   2. times it on the benchmark shapes of bench/kernels/bench_attn.cu (5 documents a
 *      sequence, pages permuted over the arena, L2 flushed before each repetition, cudaEvent
 *      median) and prints one line per shape: "<version> decode b=.. ctx=.. us TB/s".
 * Decode only (the prefill versions of round 1-2 were frozen copies without a harness; their
 * lessons are in README.md, their code in git history). The version's name comes from
 * -DDEV_VERSION. kernels/CMakeLists.txt builds one program per version
 * when LKV_KERNELS_DEV=ON (CI leaves it off); bench/kernels/run_gpu.sh runs them on the GPU
 * machine (STEPS=dev).
 */
#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "lkv_attn.h"
#include "lkv_attn_cuda.h"
#include "lkv_err.h"
#include "lkv_half.h"
}

#ifndef DEV_VERSION
#define DEV_VERSION "unnamed"
#endif

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t ce_ = (x);                                                                     \
        if (ce_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(ce_));   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define CKL(x)                                                                                     \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_ != 0) {                                                                            \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, lkv_err_name(rc_));         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static const int HQ = 32, HKV = 8, D = 128, BT = 16;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_u64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static int irand(int lo, int hi)
{
    return lo + (int)(next_u64() % (uint64_t)(hi - lo + 1));
}
static float frand(void)
{
    return (float)((next_u64() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static lkv_posenc make_pe(void)
{
    lkv_posenc_cfg c;
    memset(&c, 0, sizeof c);
    c.kind = LKV_POSENC_ROPE;
    c.rope_theta = 500000.0;
    c.rope_pairing = LKV_ROPE_HALF;
    c.rope_scaling = LKV_ROPE_SCALING_LLAMA3;
    c.scaling_factor = 8.0;
    c.low_freq_factor = 1.0;
    c.high_freq_factor = 4.0;
    c.original_max_pos = 8192.0;
    lkv_posenc pe;
    CKL(lkv_posenc_init(&pe, &c, D, HQ));
    return pe;
}

/* References of one sequence of ctx tokens in n_docs documents (the last block of each
 * document partial when ctx / n_docs is not a multiple of BT), documents starting at base. */
static void seq_refs(std::vector<uint64_t> &refs, const std::vector<uint32_t> &perm, size_t p0,
                     int ctx, int n_docs, uint32_t base)
{
    int per = ctx / n_docs, pos = 0, page = 0;
    for (int d = 0; d < n_docs && pos < ctx; d++) {
        int len = d == n_docs - 1 ? ctx - pos : std::min(per, ctx - pos);
        for (int b = 0; b * BT < len; b++) {
            int valid = std::min(BT, len - b * BT);
            refs.push_back(lkv_ref_pack(perm[p0 + page++], base + (uint32_t)pos, (uint32_t)b,
                                        (uint32_t)valid));
        }
        pos += len;
    }
}

__global__ void fill_kernel(uint16_t *p, size_t n, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + seed) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        __nv_bfloat16 b = __float2bfloat16_rn((float)((z >> 40) & 0xffff) / 32768.0f - 1.0f);
        p[i] = *(uint16_t *)&b;
    }
}

template <typename F> static double time_us(F fn, void *flush, size_t flush_bytes, int reps)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    fn();
    fn();
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        CK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, 0));
        CK(cudaEventRecord(a, 0));
        fn();
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1000.0f);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
}

/* Compares 16-bit GPU output with the fp32 reference: relative L2 error (NaN: infinite). */
static double rel_err(const uint16_t *g, const float *r, size_t n)
{
    double se = 0, sr = 0;
    for (size_t i = 0; i < n; i++) {
        float x = lkv_bf16_to_f32(g[i]);
        if (isnan(x)) {
            return INFINITY;
        }
        se += (double)(x - r[i]) * (x - r[i]);
        sr += (double)r[i] * r[i];
    }
    return sqrt(se / (sr > 0 ? sr : 1));
}

/* One random validation case; returns its relative error. */
static double validate(const lkv_posenc &pe, int batch, int ctx_max, bool near_max)
{
    lkv_kv_shape s = {2, HQ, HKV, D, LKV_DTYPE_BF16, BT};
    const uint64_t pb = lkv_block_bytes(&s);
    const int per_seq = ctx_max / BT + 8;
    const size_t np = (size_t)batch * per_seq;
    std::vector<uint16_t> arena(np * pb / 2);
    for (size_t i = 0; i < arena.size(); i++) {
        arena[i] = lkv_f32_to_bf16(frand());
    }
    std::vector<uint32_t> perm(np);
    for (size_t i = 0; i < np; i++) {
        perm[i] = (uint32_t)i;
    }
    for (size_t i = np - 1; i > 0; i--) {
        std::swap(perm[i], perm[next_u64() % (i + 1)]);
    }
    std::vector<uint64_t> refs;
    std::vector<int32_t> off(1, 0);
    std::vector<int64_t> qpos;
    int max_refs = 0;
    for (int b = 0; b < batch; b++) {
        const int ctx = irand(1, ctx_max);
        const uint32_t base = near_max ? (uint32_t)(LKV_MAX_POSITION - ctx - 4) : irand(0, 70000);
        seq_refs(refs, perm, (size_t)b * per_seq, ctx, irand(1, 5), base);
        off.push_back((int32_t)refs.size());
        max_refs = std::max(max_refs, off[b + 1] - off[b]);
        qpos.push_back(base + ctx + irand(0, 3));
    }
    const size_t nq = (size_t)batch * HQ * D;
    std::vector<float> qf(nq), ref(nq);
    std::vector<uint16_t> qh(nq), out(nq);
    for (size_t i = 0; i < nq; i++) {
        qh[i] = lkv_f32_to_bf16(frand() * 1.5f);
        qf[i] = lkv_bf16_to_f32(qh[i]);
    }
    lkv_decode_args a;
    memset(&a, 0, sizeof a);
    a.shape = s;
    a.pe = &pe;
    a.layer = 1;
    a.batch = batch;
    a.q = qf.data();
    a.q_pos = qpos.data();
    a.arena = arena.data();
    a.page_bytes = pb;
    a.refs = refs.data();
    a.ref_offset = off.data();
    a.sm_scale = 1.0f / sqrtf((float)D);
    a.out = ref.data();
    CKL(lkv_attn_decode_cpu(&a));
    void *d_arena, *d_refs, *d_off, *d_pos, *d_q, *d_out;
    CK(cudaMalloc(&d_arena, arena.size() * 2));
    CK(cudaMalloc(&d_refs, refs.size() * 8));
    CK(cudaMalloc(&d_off, off.size() * 4));
    CK(cudaMalloc(&d_pos, qpos.size() * 8));
    CK(cudaMalloc(&d_q, nq * 2));
    CK(cudaMalloc(&d_out, nq * 2));
    CK(cudaMemcpy(d_arena, arena.data(), arena.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_refs, refs.data(), refs.size() * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_off, off.data(), off.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_pos, qpos.data(), qpos.size() * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_q, qh.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(d_out, 0xff, nq * 2));
    lkv_decode_args g = a;
    g.q = d_q;
    g.q_pos = (const int64_t *)d_pos;
    g.arena = d_arena;
    g.refs = (const uint64_t *)d_refs;
    g.ref_offset = (const int32_t *)d_off;
    g.out = d_out;
    CKL(lkv_attn_decode_cuda(&g, max_refs, NULL, 0, NULL));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(out.data(), d_out, nq * 2, cudaMemcpyDeviceToHost));
    cudaFree(d_arena);
    cudaFree(d_refs);
    cudaFree(d_off);
    cudaFree(d_pos);
    cudaFree(d_q);
    cudaFree(d_out);
    return rel_err(out.data(), ref.data(), nq);
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("%s: skipped: no GPU\n", DEV_VERSION);
        return 0;
    }
    lkv_posenc pe = make_pe();
    /* 1. Validation (bf16 tolerance of the GPU check: relative L2 error 1.5e-2). */
    int fails = 0;
    for (int i = 0; i < 4; i++) {
        const double e = validate(pe, i == 0 ? 1 : 3, i == 0 ? 3000 : 700, i == 3);
        const bool ok = e <= 1.5e-2;
        fails += !ok;
        printf("%s validate #%d rel_l2=%.3e %s\n", DEV_VERSION, i, e, ok ? "PASS" : "FAIL");
    }
    /* 2. Benchmark. */
    lkv_kv_shape s = {1, HQ, HKV, D, LKV_DTYPE_BF16, BT};
    const uint64_t pb = lkv_block_bytes(&s);
    const int max_batch = 128, max_ctx = 32768;
    const int per_seq = max_ctx / BT + 8; /* 5 documents: up to 4 partial blocks more */
    const size_t np = (size_t)max_batch * per_seq;
    void *arena, *flush, *q, *out, *d_refs, *d_off, *d_pos;
    const size_t flush_bytes = 256u << 20;
    CK(cudaMalloc(&arena, np * pb));
    CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaMalloc(&q, (size_t)max_batch * HQ * D * 2));
    CK(cudaMalloc(&out, (size_t)max_batch * HQ * D * 2));
    CK(cudaMalloc(&d_refs, np * 8));
    CK(cudaMalloc(&d_off, (max_batch + 1) * 4));
    CK(cudaMalloc(&d_pos, max_batch * 8));
    fill_kernel<<<1024, 256>>>((uint16_t *)arena, np * pb / 2, 1);
    fill_kernel<<<1024, 256>>>((uint16_t *)q, (size_t)max_batch * HQ * D, 3);
    CK(cudaGetLastError());
    std::vector<uint32_t> perm(np);
    for (size_t i = 0; i < np; i++) {
        perm[i] = (uint32_t)i;
    }
    for (size_t i = np - 1; i > 0; i--) {
        std::swap(perm[i], perm[next_u64() % (i + 1)]);
    }
    const int batches[] = {1, 16, 128};
    const int ctxs[] = {4096, 32768};
    for (int bi = 0; bi < 3; bi++) {
        for (int ci = 0; ci < 2; ci++) {
            const int batch = batches[bi], ctx = ctxs[ci];
            std::vector<uint64_t> refs;
            std::vector<int32_t> off(1, 0);
            std::vector<int64_t> qpos;
            for (int b = 0; b < batch; b++) {
                seq_refs(refs, perm, (size_t)b * per_seq, ctx, 5, 0);
                off.push_back((int32_t)refs.size());
                qpos.push_back(ctx);
            }
            CK(cudaMemcpy(d_refs, refs.data(), refs.size() * 8, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d_off, off.data(), off.size() * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d_pos, qpos.data(), qpos.size() * 8, cudaMemcpyHostToDevice));
            lkv_decode_args a;
            memset(&a, 0, sizeof a);
            a.shape = s;
            a.pe = &pe;
            a.batch = batch;
            a.q = q;
            a.q_pos = (const int64_t *)d_pos;
            a.arena = arena;
            a.page_bytes = pb;
            a.refs = (const uint64_t *)d_refs;
            a.ref_offset = (const int32_t *)d_off;
            a.sm_scale = 1.0f / sqrtf((float)D);
            a.out = out;
            const double kv = (double)batch * ctx * HKV * D * 2 * 2;
            const double us = time_us([&] { CKL(lkv_attn_decode_cuda(&a, ctx / BT, NULL, 0, 0)); },
                                      flush, flush_bytes, kv > 4e9 ? 15 : 30);
            printf("%s decode b=%3d ctx=%5d %9.1f us %6.2f TB/s\n", DEV_VERSION, batch, ctx, us,
                   kv / (us * 1e-6) / 1e12);
        }
    }
    lkv_attn_cuda_release();
    return fails ? 1 : 0;
}
