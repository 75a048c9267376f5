/*
 * bench_attn.cu: times the LazyAttention CUDA kernels on Llama-3.1-8B head shapes (32 query /
 * 8 kv heads, head_dim 128, bf16, 16-token blocks, one layer per page) and writes one JSON
 * record per measurement to argv[1] (JSON lines). bench/kernels/run_gpu.sh runs it beside the
 * PyTorch baselines (sdpa_bench.py) and merges both into one table.
 *
 * Method: device buffers filled with random values by a hash kernel (never zeros); each timed
 * repetition is preceded by an L2 flush (a 256 MiB memset, outside the timed events); time by
 * cudaEvent around the launch(es); report the median over the repetitions.
 *
 * Measurements:
 *   decode   batch {1,16,64,128} x context {4k,8k,32k} tokens in 5 documents per sequence at
 *            pages permuted over the arena, through a decode plan (lkv_decode_plan_run, plans
 *            built outside the timing); variants lazy (rotation on), lazy_again (same kernel
 *            timed a second time: the spread), norot (LKV_ATTN_NO_ROTATE), lazy_graph (the one
 *            launch captured in a CUDA graph, replays timed), and at batch 1 contig_pages (the
 *            same sequence on consecutive pages: a diagnostic of the page scatter's cost).
 *            Reports median us and TB/s of K+V bytes read. LKV_BENCH_DECODE_SPLITS forces the
 *            plans' split factor.
 *   decode32 batch 1, {4k,8k,32k}: the 32 layers of one decode step of a 32-layer model (real
 *            2 MiB pages holding every layer of a block, scattered) captured in ONE graph;
 *            variants lazy_graph32, norot_graph32, lazy_graph32_again, lazy_graph32_pdl (the
 *            plan's programmatic dependent launch on: a layer's prologue overlaps the previous
 *            layer's tail); the median replay / 32 is the per-layer time.
 *   prefill  n_new {64,512,2048} new tokens against {8k,32k} cached tokens in 5 documents;
 *            variants lazy, norot, block_attn (materialise a re-rotated copy of every document
 *            then the same prefill kernel over the copy, one document at start 0), lazy_again,
 *            mma_sync (LKV_ATTN_PREFILL_KERNEL=mma: the pre-Hopper fallback kernel). Reports
 *            median us and TFLOP/s (4 * n_new * Hq * d * (ctx + (n_new + 1) / 2) useful FLOPs).
 *   copy     device-to-device cudaMemcpy of 4 GiB: the bandwidth ceiling (read + write bytes).
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
}

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

__global__ void fill_kernel(uint16_t *p, size_t n, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + seed) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        float x = (float)((z >> 40) & 0xffff) / 32768.0f - 1.0f; /* [-1, 1) */
        __nv_bfloat16 b = __float2bfloat16_rn(x);
        p[i] = *(uint16_t *)&b;
    }
}

static void fill(void *p, size_t bytes, uint64_t seed)
{
    fill_kernel<<<1024, 256>>>((uint16_t *)p, bytes / 2, seed);
    CK(cudaGetLastError());
}

static void *flush_buf;
static const size_t FLUSH_BYTES = 256u << 20;

static FILE *jout;

/* LKV_BENCH_ONLY="decode:BATCH:CTX" or "prefill:N_NEW:CTX" (or an op name, or a
 * comma-separated list of these) runs only those cases (for ncu);
 * LKV_BENCH_REPS overrides the repetitions. */
static bool want(const char *op, int a, int c)
{
    const char *e = getenv("LKV_BENCH_ONLY");
    if (e == NULL || *e == '\0') {
        return true;
    }
    char buf[64];
    snprintf(buf, sizeof buf, "%s:%d:%d", op, a, c);
    /* A comma-separated list of cases or ops. */
    const size_t nb = strlen(buf), no = strlen(op);
    for (const char *s = e; *s != '\0';) {
        const char *t = strchr(s, ',');
        const size_t n = t != NULL ? (size_t)(t - s) : strlen(s);
        if ((n == nb && strncmp(s, buf, n) == 0) || (n == no && strncmp(s, op, n) == 0)) {
            return true;
        }
        s += n;
        if (*s == ',') {
            s++;
        }
    }
    return false;
}

static int reps_env(int dflt)
{
    const char *e = getenv("LKV_BENCH_REPS");
    return e != NULL && atoi(e) > 0 ? atoi(e) : dflt;
}

static double median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Times fn() reps times with an L2 flush before each; returns the median in microseconds. */
template <typename F> static double time_us(F fn, int reps)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    fn(); /* warm-up (workspace allocation, module load) */
    fn();
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        CK(cudaMemsetAsync(flush_buf, i & 0xff, FLUSH_BYTES, 0));
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
    return median(t);
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

/* Builds refs of one sequence of ctx tokens in n_docs documents using pages perm[p0 ...]. */
static void seq_refs(std::vector<uint64_t> &refs, const std::vector<uint32_t> &perm, size_t p0,
                     int ctx, int n_docs, bool single_doc_at_zero)
{
    int per = (ctx / n_docs + BT - 1) / BT * BT;
    int pos = 0, page = 0;
    for (int d = 0; d < n_docs && pos < ctx; d++) {
        int len = d == n_docs - 1 ? ctx - pos : std::min(per, ctx - pos);
        int nb = (len + BT - 1) / BT;
        for (int b = 0; b < nb; b++) {
            int valid = std::min(BT, len - b * BT);
            uint32_t start = single_doc_at_zero ? 0u : (uint32_t)pos;
            uint32_t blk = single_doc_at_zero ? (uint32_t)((pos + b * BT) / BT) : (uint32_t)b;
            refs.push_back(lkv_ref_pack(perm[p0 + page++], start, blk, (uint32_t)valid));
        }
        pos += len;
    }
}

static void emit_decode(int batch, int ctx, const char *variant, double us, double kv_bytes,
                        int splits)
{
    fprintf(jout,
            "{\"op\":\"decode\",\"batch\":%d,\"ctx\":%d,\"variant\":\"%s\","
            "\"median_us\":%.2f,\"kv_bytes\":%.0f,\"tbps\":%.4f,\"splits\":%d}\n",
            batch, ctx, variant, us, kv_bytes, kv_bytes / (us * 1e-6) / 1e12, splits);
    fflush(jout);
}

static lkv_decode_plan *make_plan(const lkv_kv_shape &s, const lkv_posenc &pe, int batch,
                                  int max_refs, unsigned flags, int pdl = 0)
{
    lkv_decode_plan_cfg c;
    memset(&c, 0, sizeof c);
    c.shape = s;
    c.pe = &pe;
    c.batch = batch;
    c.max_refs_per_seq = max_refs;
    c.sm_scale = 1.0f / sqrtf((float)D);
    c.flags = flags;
    const char *e = getenv("LKV_BENCH_DECODE_SPLITS");
    c.splits = e != NULL ? atoi(e) : 0;
    c.pdl = pdl;
    lkv_decode_plan *p = NULL;
    CKL(lkv_decode_plan_create(&c, &p));
    return p;
}

/* Captures n runs of plan (args ra[0..n-1]) on a capture stream into an instantiated graph. */
static cudaGraphExec_t capture(lkv_decode_plan *plan, const lkv_decode_run_args *ra, int n)
{
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n; i++) {
        CKL(lkv_decode_plan_run(plan, &ra[i], st));
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(st));
    return ge;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "bench_attn.jsonl";
    const bool quick = getenv("LKV_BENCH_QUICK") != NULL;
    jout = fopen(path, "w");
    if (jout == NULL) {
        perror(path);
        return 1;
    }
    CK(cudaMalloc(&flush_buf, FLUSH_BYTES));
    lkv_kv_shape s = {1, HQ, HKV, D, LKV_DTYPE_BF16, BT};
    const uint64_t page_bytes = lkv_block_bytes(&s); /* 64 KiB */
    const int max_batch = 128, max_ctx = 32768;
    const size_t n_pages = (size_t)max_batch * max_ctx / BT + 2 * (max_ctx / BT);
    void *arena;
    CK(cudaMalloc(&arena, n_pages * page_bytes));
    fill(arena, n_pages * page_bytes, 1);
    std::vector<uint32_t> perm(n_pages);
    for (size_t i = 0; i < n_pages; i++) {
        perm[i] = (uint32_t)i;
    }
    uint64_t rs = 12345;
    for (size_t i = n_pages - 1; i > 0; i--) {
        rs = rs * 6364136223846793005ull + 1442695040888963407ull;
        size_t j = (rs >> 33) % (i + 1);
        std::swap(perm[i], perm[j]);
    }
    lkv_posenc pe = make_pe();
    const float scale = 1.0f / sqrtf((float)D);

    /* Ceiling: device copy. */
    if (want("copy", 0, 0)) {
        const size_t bytes = 4ull << 30;
        void *a, *b;
        CK(cudaMalloc(&a, bytes));
        CK(cudaMalloc(&b, bytes));
        fill(a, bytes, 7);
        double us =
            time_us([&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0)); }, 10);
        double tbps = 2.0 * bytes / (us * 1e-6) / 1e12;
        printf("copy 4 GiB: %.1f us, %.2f TB/s (read+write)\n", us, tbps);
        fprintf(jout, "{\"op\":\"copy\",\"bytes\":%zu,\"median_us\":%.2f,\"tbps\":%.4f}\n", bytes,
                us, tbps);
        CK(cudaFree(a));
        CK(cudaFree(b));
    }

    /* Decode. */
    {
        void *q, *out, *qpos_d, *refs_d, *off_d;
        CK(cudaMalloc(&q, (size_t)max_batch * HQ * D * 2));
        CK(cudaMalloc(&out, (size_t)max_batch * HQ * D * 2));
        CK(cudaMalloc(&qpos_d, max_batch * sizeof(int64_t)));
        CK(cudaMalloc(&refs_d, n_pages * sizeof(uint64_t)));
        CK(cudaMalloc(&off_d, (max_batch + 1) * sizeof(int32_t)));
        fill(q, (size_t)max_batch * HQ * D * 2, 3);
        const int batches[] = {1, 16, 64, 128};
        const int ctxs[] = {4096, 8192, 32768};
        for (int bi = 0; bi < 4; bi++) {
            for (int ci = 0; ci < 3; ci++) {
                const int batch = batches[bi], ctx = ctxs[ci];
                if ((quick && batch > 16) || !want("decode", batch, ctx)) {
                    continue;
                }
                std::vector<uint64_t> refs;
                std::vector<int32_t> off(1, 0);
                std::vector<int64_t> qpos;
                for (int b = 0; b < batch; b++) {
                    seq_refs(refs, perm, (size_t)b * (max_ctx / BT), ctx, 5, false);
                    off.push_back((int32_t)refs.size());
                    qpos.push_back(ctx);
                }
                CK(cudaMemcpy(refs_d, refs.data(), refs.size() * 8, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(off_d, off.data(), off.size() * 4, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(qpos_d, qpos.data(), qpos.size() * 8, cudaMemcpyHostToDevice));
                const int max_refs = ctx / BT;
                lkv_decode_run_args ra = {0,
                                          q,
                                          (const int64_t *)qpos_d,
                                          arena,
                                          page_bytes,
                                          (const uint64_t *)refs_d,
                                          (const int32_t *)off_d,
                                          out,
                                          NULL};
                const double kv_bytes = (double)batch * ctx * HKV * D * 2 * 2;
                const int reps = reps_env(kv_bytes > 4e9 ? 15 : 40);
                const char *names[] = {"lazy", "norot", "lazy_again", "lazy_graph"};
                const unsigned flags[] = {0, LKV_ATTN_NO_ROTATE, 0, 0};
                for (int v = 0; v < 4; v++) {
                    lkv_decode_plan *plan = make_plan(s, pe, batch, max_refs, flags[v]);
                    double us;
                    if (v == 3) {
                        cudaGraphExec_t ge = capture(plan, &ra, 1);
                        us = time_us([&] { CK(cudaGraphLaunch(ge, 0)); }, reps);
                        CK(cudaGraphExecDestroy(ge));
                    } else {
                        us = time_us([&] { CKL(lkv_decode_plan_run(plan, &ra, NULL)); }, reps);
                    }
                    double tbps = kv_bytes / (us * 1e-6) / 1e12;
                    printf("decode b=%3d ctx=%5d %-12s %9.1f us %6.2f TB/s (splits %d)\n", batch,
                           ctx, names[v], us, tbps, lkv_decode_plan_splits(plan));
                    emit_decode(batch, ctx, names[v], us, kv_bytes, lkv_decode_plan_splits(plan));
                    lkv_decode_plan_destroy(plan);
                }
                if (batch == 1) {
                    /* Diagnostic: the same sequence on consecutive pages (few TLB entries). */
                    std::vector<uint64_t> crefs;
                    for (size_t i = 0; i < refs.size(); i++) {
                        const uint64_t r = refs[i];
                        crefs.push_back(lkv_ref_pack((uint32_t)(n_pages - refs.size() + i),
                                                     lkv_ref_start(r), lkv_ref_block(r),
                                                     lkv_ref_valid(r)));
                    }
                    CK(cudaMemcpy(refs_d, crefs.data(), crefs.size() * 8, cudaMemcpyHostToDevice));
                    lkv_decode_plan *plan = make_plan(s, pe, batch, max_refs, 0);
                    double us = time_us([&] { CKL(lkv_decode_plan_run(plan, &ra, NULL)); }, reps);
                    printf("decode b=%3d ctx=%5d %-12s %9.1f us %6.2f TB/s\n", batch, ctx,
                           "contig_pages", us, kv_bytes / (us * 1e-6) / 1e12);
                    emit_decode(batch, ctx, "contig_pages", us, kv_bytes,
                                lkv_decode_plan_splits(plan));
                    lkv_decode_plan_destroy(plan);
                }
            }
        }
        CK(cudaFree(q));
        CK(cudaFree(out));
        CK(cudaFree(qpos_d));
        CK(cudaFree(refs_d));
        CK(cudaFree(off_d));
    }

    /* Decode of one step of a 32-layer model at batch 1 in one CUDA graph: real pages (all 32
     * layers of a block in one page, 2 MiB), scattered over an arena of twice the pages needed,
     * one query and output per layer; the replay's median over 32 is the per-layer time. */
    {
        lkv_kv_shape s32 = {32, HQ, HKV, D, LKV_DTYPE_BF16, BT};
        const uint64_t pb32 = lkv_block_bytes(&s32);
        const size_t np32 = 2 * (size_t)(max_ctx / BT);
        void *ar32 = NULL, *q32, *o32, *qpos_d, *refs_d, *off_d;
        bool any = false;
        for (int ci = 0; ci < 3; ci++) {
            any = any || want("decode32", 1, (int[]){4096, 8192, 32768}[ci]);
        }
        if (any) {
            CK(cudaMalloc(&ar32, np32 * pb32));
            fill(ar32, np32 * pb32, 21);
            CK(cudaMalloc(&q32, (size_t)32 * HQ * D * 2));
            CK(cudaMalloc(&o32, (size_t)32 * HQ * D * 2));
            CK(cudaMalloc(&qpos_d, sizeof(int64_t)));
            CK(cudaMalloc(&refs_d, (max_ctx / BT) * sizeof(uint64_t)));
            CK(cudaMalloc(&off_d, 2 * sizeof(int32_t)));
            fill(q32, (size_t)32 * HQ * D * 2, 22);
            std::vector<uint32_t> perm32(np32);
            for (size_t i = 0; i < np32; i++) {
                perm32[i] = (uint32_t)i;
            }
            for (size_t i = np32 - 1; i > 0; i--) {
                rs = rs * 6364136223846793005ull + 1442695040888963407ull;
                std::swap(perm32[i], perm32[(rs >> 33) % (i + 1)]);
            }
            for (int ci = 0; ci < 3; ci++) {
                const int ctx = (int[]){4096, 8192, 32768}[ci];
                if (!want("decode32", 1, ctx)) {
                    continue;
                }
                std::vector<uint64_t> refs;
                seq_refs(refs, perm32, 0, ctx, 5, false);
                const int32_t off[2] = {0, (int32_t)refs.size()};
                const int64_t qp = ctx;
                CK(cudaMemcpy(refs_d, refs.data(), refs.size() * 8, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(off_d, off, sizeof off, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(qpos_d, &qp, sizeof qp, cudaMemcpyHostToDevice));
                const double kv_bytes = (double)ctx * HKV * D * 2 * 2;
                const char *names[] = {"lazy_graph32", "norot_graph32", "lazy_graph32_again",
                                       "lazy_graph32_pdl"};
                const unsigned flags[] = {0, LKV_ATTN_NO_ROTATE, 0, 0};
                for (int v = 0; v < 4; v++) {
                    lkv_decode_plan *plan = make_plan(s32, pe, 1, ctx / BT, flags[v], v == 3);
                    lkv_decode_run_args ra[32];
                    for (int l = 0; l < 32; l++) {
                        lkv_decode_run_args r = {l,
                                                 (const uint16_t *)q32 + (size_t)l * HQ * D,
                                                 (const int64_t *)qpos_d,
                                                 ar32,
                                                 pb32,
                                                 (const uint64_t *)refs_d,
                                                 (const int32_t *)off_d,
                                                 (uint16_t *)o32 + (size_t)l * HQ * D,
                                                 NULL};
                        ra[l] = r;
                    }
                    cudaGraphExec_t ge = capture(plan, ra, 32);
                    double us = time_us([&] { CK(cudaGraphLaunch(ge, 0)); }, reps_env(20)) / 32;
                    printf("decode b=  1 ctx=%5d %-12s %9.1f us/layer %6.2f TB/s (32 layers in "
                           "one graph, splits %d)\n",
                           ctx, names[v], us, kv_bytes / (us * 1e-6) / 1e12,
                           lkv_decode_plan_splits(plan));
                    emit_decode(1, ctx, names[v], us, kv_bytes, lkv_decode_plan_splits(plan));
                    CK(cudaGraphExecDestroy(ge));
                    lkv_decode_plan_destroy(plan);
                }
            }
            CK(cudaFree(ar32));
            CK(cudaFree(q32));
            CK(cudaFree(o32));
            CK(cudaFree(qpos_d));
            CK(cudaFree(refs_d));
            CK(cudaFree(off_d));
        }
    }

    /* Prefill. */
    {
        const int max_new = 2048;
        void *q, *kn, *vn, *out, *refs_d, *refs1_d, *srcp_d, *dstp_d;
        CK(cudaMalloc(&q, (size_t)max_new * HQ * D * 2));
        CK(cudaMalloc(&kn, (size_t)max_new * HKV * D * 2));
        CK(cudaMalloc(&vn, (size_t)max_new * HKV * D * 2));
        CK(cudaMalloc(&out, (size_t)max_new * HQ * D * 2));
        CK(cudaMalloc(&refs_d, (max_ctx / BT) * sizeof(uint64_t)));
        CK(cudaMalloc(&refs1_d, (max_ctx / BT) * sizeof(uint64_t)));
        CK(cudaMalloc(&srcp_d, (max_ctx / BT) * sizeof(uint32_t)));
        CK(cudaMalloc(&dstp_d, (max_ctx / BT) * sizeof(uint32_t)));
        fill(q, (size_t)max_new * HQ * D * 2, 11);
        fill(kn, (size_t)max_new * HKV * D * 2, 12);
        fill(vn, (size_t)max_new * HKV * D * 2, 13);
        const int news[] = {64, 512, 2048};
        const int ctxs[] = {8192, 32768};
        for (int ci = 0; ci < 2; ci++) {
            for (int ni = 0; ni < 3; ni++) {
                const int ctx = ctxs[ci], n_new = news[ni];
                if (!want("prefill", n_new, ctx)) {
                    continue;
                }
                std::vector<uint64_t> refs, refs1;
                seq_refs(refs, perm, 0, ctx, 5, false);
                /* Block-Attention copy: destination pages after the batch region. */
                const size_t dst0 = (size_t)max_batch * (max_ctx / BT);
                std::vector<uint32_t> srcp, dstp;
                for (size_t i = 0; i < refs.size(); i++) {
                    srcp.push_back(lkv_ref_page(refs[i]));
                    dstp.push_back(perm[dst0 + i]);
                }
                seq_refs(refs1, perm, dst0, ctx, 5, true);
                /* Document ranges of the materialisation (delta = document start). */
                std::vector<std::pair<int, int>> docs; /* (first ref, count) */
                std::vector<int> deltas;
                for (size_t i = 0; i < refs.size(); i++) {
                    if (i == 0 || lkv_ref_start(refs[i]) != lkv_ref_start(refs[i - 1])) {
                        docs.push_back({(int)i, 0});
                        deltas.push_back((int)lkv_ref_start(refs[i]));
                    }
                    docs.back().second++;
                }
                CK(cudaMemcpy(refs_d, refs.data(), refs.size() * 8, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(refs1_d, refs1.data(), refs1.size() * 8, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(srcp_d, srcp.data(), srcp.size() * 4, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(dstp_d, dstp.data(), dstp.size() * 4, cudaMemcpyHostToDevice));
                lkv_prefill_args a;
                memset(&a, 0, sizeof a);
                a.shape = s;
                a.pe = &pe;
                a.layer = 0;
                a.n_new = n_new;
                a.new_start = ctx;
                a.q = q;
                a.k_new = kn;
                a.v_new = vn;
                a.arena = arena;
                a.page_bytes = page_bytes;
                a.refs = (const uint64_t *)refs_d;
                a.n_refs = (int32_t)refs.size();
                a.sm_scale = scale;
                a.out = out;
                const double flops = 4.0 * n_new * HQ * D * (ctx + (n_new + 1) / 2.0);
                const int reps = reps_env(20);
                const char *names[] = {"lazy", "norot", "block_attn", "lazy_again", "mma_sync"};
                for (int v = 0; v < 5; v++) {
                    double us;
                    if (v == 2) {
                        lkv_prefill_args b = a;
                        b.refs = (const uint64_t *)refs1_d;
                        us = time_us(
                            [&] {
                                for (size_t dI = 0; dI < docs.size(); dI++) {
                                    lkv_materialise_args m;
                                    memset(&m, 0, sizeof m);
                                    m.shape = s;
                                    m.pe = &pe;
                                    m.src_arena = arena;
                                    m.dst_arena = arena;
                                    m.page_bytes = page_bytes;
                                    m.src_pages = (const uint32_t *)srcp_d + docs[dI].first;
                                    m.dst_pages = (const uint32_t *)dstp_d + docs[dI].first;
                                    m.n_blocks = docs[dI].second;
                                    m.delta = deltas[dI];
                                    CKL(lkv_materialise_cuda(&m, NULL));
                                }
                                CKL(lkv_attn_prefill_cuda(&b, NULL, 0, NULL));
                            },
                            reps);
                    } else {
                        a.flags = v == 1 ? LKV_ATTN_NO_ROTATE : 0;
                        if (v == 4) { /* the mma.sync kernel (the fallback) on the same data */
                            setenv("LKV_ATTN_PREFILL_KERNEL", "mma", 1);
                        }
                        us = time_us([&] { CKL(lkv_attn_prefill_cuda(&a, NULL, 0, NULL)); }, reps);
                        unsetenv("LKV_ATTN_PREFILL_KERNEL");
                    }
                    double tf = flops / (us * 1e-6) / 1e12;
                    printf("prefill new=%4d ctx=%5d %-10s %9.1f us %6.1f TFLOP/s\n", n_new, ctx,
                           names[v], us, tf);
                    fprintf(jout,
                            "{\"op\":\"prefill\",\"n_new\":%d,\"ctx\":%d,\"variant\":\"%s\","
                            "\"median_us\":%.2f,\"flops\":%.0f,\"tflops\":%.3f}\n",
                            n_new, ctx, names[v], us, flops, tf);
                    fflush(jout);
                }
                /* Materialise alone (the Block-Attention copy cost). */
                double us = time_us(
                    [&] {
                        for (size_t dI = 0; dI < docs.size(); dI++) {
                            lkv_materialise_args m;
                            memset(&m, 0, sizeof m);
                            m.shape = s;
                            m.pe = &pe;
                            m.src_arena = arena;
                            m.dst_arena = arena;
                            m.page_bytes = page_bytes;
                            m.src_pages = (const uint32_t *)srcp_d + docs[dI].first;
                            m.dst_pages = (const uint32_t *)dstp_d + docs[dI].first;
                            m.n_blocks = docs[dI].second;
                            m.delta = deltas[dI];
                            CKL(lkv_materialise_cuda(&m, NULL));
                        }
                    },
                    reps);
                if (ni == 0) {
                    double bytes = 2.0 * refs.size() * page_bytes;
                    printf("materialise ctx=%5d %9.1f us %6.2f TB/s (read+write)\n", ctx, us,
                           bytes / (us * 1e-6) / 1e12);
                    fprintf(jout,
                            "{\"op\":\"materialise\",\"ctx\":%d,\"median_us\":%.2f,"
                            "\"tbps\":%.4f}\n",
                            ctx, us, bytes / (us * 1e-6) / 1e12);
                }
            }
        }
    }
    lkv_attn_cuda_release();
    fclose(jout);
    return 0;
}
