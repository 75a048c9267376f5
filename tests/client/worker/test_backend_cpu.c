/*
 * test_backend_cpu.c: client.worker.backend_cpu. The CPU backend's ops
 * (client/worker/lkv_backend_cpu.c) against independent fp64 references: matmul, rmsnorm, SwiGLU,
 * RoPE of new keys (long double angles, tests/kernels/kt_ref.h), the block layout of kv_write
 * (offsets computed from the formula of kernels/lkv_layout.h, untouched slots checked), and the
 * sampler (greedy and ties, the distribution of temperature sampling, the nucleus cut, seeds, bad
 * input).
 */
#include "kt_ref.h"
#include "lkv_backend_cpu.h"
#include "lkv_half.h"
#include "lkv_log.h"
#include "lkv_test.h"

static uint64_t rng = 88172645463325252ull;

static float frand(void)
{
    return (float)(lkv_sampling_uniform(&rng) * 2.0 - 1.0);
}

static void test_dense(void)
{
    const lkv_backend *be = lkv_backend_cpu();
    enum { N = 3, R = 17, C = 29 };
    float x[N * C], w[R * C], out[N * R], g[C], y[N * C], h1[50], h3[50];
    for (int i = 0; i < N * C; i++) {
        x[i] = frand();
    }
    for (int i = 0; i < R * C; i++) {
        w[i] = frand();
    }
    for (int i = 0; i < C; i++) {
        g[i] = frand();
    }
    be->matmul(be->ctx, out, x, w, N, R, C);
    for (int i = 0; i < N; i++) {
        for (int r = 0; r < R; r++) {
            double s = 0;
            for (int c = 0; c < C; c++) {
                s += (double)w[r * C + c] * x[i * C + c];
            }
            ASSERT_NEAR(out[i * R + r], s, 1e-5);
        }
    }
    be->rmsnorm(be->ctx, y, x, g, N, C);
    for (int i = 0; i < N; i++) {
        double ss = 0;
        for (int c = 0; c < C; c++) {
            ss += (double)x[i * C + c] * x[i * C + c];
        }
        double inv = 1.0 / sqrt(ss / C + 1e-5);
        for (int c = 0; c < C; c++) {
            ASSERT_NEAR(y[i * C + c], g[c] * inv * x[i * C + c], 1e-5);
        }
    }
    be->rmsnorm(be->ctx, x, x, g, N, C); /* in place */
    ASSERT_TRUE(memcmp(x, y, sizeof y) == 0);
    for (int j = 0; j < 50; j++) {
        h1[j] = frand() * 8;
        h3[j] = frand();
    }
    float h1c[50];
    memcpy(h1c, h1, sizeof h1);
    be->swiglu(be->ctx, h1, h3, 50);
    for (int j = 0; j < 50; j++) {
        ASSERT_NEAR(h1[j], h1c[j] / (1 + exp(-(double)h1c[j])) * h3[j], 1e-5);
    }
    float a[4] = {1, 2, 3, 4}, b[4] = {0.5f, -2, 0, 1};
    be->add(be->ctx, a, b, 4);
    ASSERT_TRUE(a[0] == 1.5f && a[1] == 0 && a[2] == 3 && a[3] == 5);
    const float table[3 * 2] = {1, 2, 3, 4, 5, 6};
    const int toks[2] = {2, 0};
    float e[4];
    be->embed(be->ctx, e, table, toks, 2, 2);
    ASSERT_TRUE(e[0] == 5 && e[1] == 6 && e[2] == 1 && e[3] == 2);
}

static void test_rope(void)
{
    const lkv_backend *be = lkv_backend_cpu();
    lkv_posenc_cfg cfg = {
        .kind = LKV_POSENC_ROPE, .rope_theta = 10000, .rope_pairing = LKV_ROPE_INTERLEAVED};
    lkv_posenc pe;
    ASSERT_OK(lkv_posenc_init(&pe, &cfg, 16, 4));
    enum { T = 5, H = 3, D = 16 };
    float x[T * H * D], out[T * H * D];
    for (int i = 0; i < T * H * D; i++) {
        x[i] = frand();
    }
    const int64_t pos0 = 4000000;
    be->rope(be->ctx, &pe, x, out, T, H, pos0);
    for (int t = 0; t < T; t++) {
        double cs[D];
        kt_ref_table(&cfg, D, pos0 + t, cs);
        for (int h = 0; h < H; h++) {
            double r[D];
            for (int d = 0; d < D; d++) {
                r[d] = x[(t * H + h) * D + d];
            }
            kt_ref_rotate(&cfg, D, cs, r);
            for (int d = 0; d < D; d++) {
                ASSERT_NEAR(out[(t * H + h) * D + d], r[d], 1e-6);
            }
        }
    }
    be->rope(be->ctx, &pe, x, x, T, H, pos0); /* in place */
    ASSERT_TRUE(memcmp(x, out, sizeof out) == 0);
}

static void test_kv_write(void)
{
    const lkv_backend *be = lkv_backend_cpu();
    for (int dt = 0; dt < 3; dt += 2) {
        lkv_kv_shape s = {.n_layers = 3,
                          .n_q_heads = 4,
                          .n_kv_heads = 2,
                          .head_dim = 8,
                          .dtype = dt,
                          .block_tokens = 8};
        const size_t es = lkv_dtype_size(dt), bb = lkv_block_bytes(&s), pb = bb + 64;
        uint8_t *arena = lkv_xmalloc(8 * pb);
        memset(arena, 0xAB, 8 * pb);
        const uint32_t pages[3] = {5, 2, 7};
        enum { N = 18, L0 = 3, KVD = 16 };
        float k[N * KVD], v[N * KVD];
        for (int i = 0; i < N * KVD; i++) {
            k[i] = frand();
            v[i] = frand();
        }
        be->kv_write(be->ctx, &s, arena, pb, pages, 1, L0, N, k, v);
        uint8_t *want = lkv_xmalloc(8 * pb);
        memset(want, 0xAB, 8 * pb);
        for (int i = 0; i < N; i++) {
            int local = L0 + i, b = local / 8, t = local % 8;
            for (int kv = 0; kv < 2; kv++) {
                for (int h = 0; h < 2; h++) {
                    for (int d = 0; d < 8; d++) {
                        size_t off = ((((size_t)(1 * 2 + kv) * 2 + h) * 8 + t) * 8 + d) * es;
                        float x = (kv ? v : k)[i * KVD + h * 8 + d];
                        lkv_store_elem(want + pages[b] * pb + off, dt, 0, x);
                    }
                }
            }
        }
        ASSERT_TRUE(memcmp(arena, want, 8 * pb) == 0);
        free(arena);
        free(want);
    }
}

static void test_sample(void)
{
    const lkv_backend *be = lkv_backend_cpu();
    lkv_sampling greedy = {0};
    float l[5] = {0.1f, 3, -1, 3, 2};
    uint64_t r = lkv_sampling_seed(1), r0 = r;
    int tok;
    ASSERT_OK(be->sample(be->ctx, l, 5, &greedy, &r, &tok));
    ASSERT_EQ(tok, 1); /* first of the tied maxima */
    ASSERT_TRUE(r == r0);
    /* Temperature 1 over log-probabilities: frequencies follow the probabilities. */
    const double p[3] = {0.5, 0.3, 0.2};
    float lp[3];
    for (int i = 0; i < 3; i++) {
        lp[i] = (float)log(p[i]) + 7;
    }
    lkv_sampling t1 = {.temperature = 1, .top_p = 1, .seed = 9};
    int count[3] = {0};
    r = lkv_sampling_seed(t1.seed);
    const int n = 40000;
    for (int i = 0; i < n; i++) {
        ASSERT_OK(be->sample(be->ctx, lp, 3, &t1, &r, &tok));
        ASSERT_TRUE(tok >= 0 && tok < 3);
        count[tok]++;
    }
    for (int i = 0; i < 3; i++) {
        double f = (double)count[i] / n, sd = sqrt(p[i] * (1 - p[i]) / n);
        if (fabs(f - p[i]) > 5 * sd) {
            LKV_FAIL("token %d: frequency %.4f, probability %.2f", i, f, p[i]);
        }
    }
    /* Nucleus: top_p 0.7 keeps {0.5, 0.3} (renormalised), never the 0.2 token. */
    lkv_sampling nuc = {.temperature = 1, .top_p = 0.7f};
    memset(count, 0, sizeof count);
    for (int i = 0; i < 20000; i++) {
        ASSERT_OK(be->sample(be->ctx, lp, 3, &nuc, &r, &tok));
        count[tok]++;
    }
    ASSERT_EQ(count[2], 0);
    ASSERT_NEAR((double)count[0] / 20000, 0.625, 0.02);
    /* Low temperature: argmax. Same seed, same draws; another seed, other draws. */
    lkv_sampling cold = {.temperature = 0.01f};
    ASSERT_OK(be->sample(be->ctx, lp, 3, &cold, &r, &tok));
    ASSERT_EQ(tok, 0);
    int seq[2][64];
    for (int s = 0; s < 2; s++) {
        uint64_t rs = lkv_sampling_seed(5); /* twice the same seed */
        for (int i = 0; i < 64; i++) {
            ASSERT_OK(be->sample(be->ctx, lp, 3, &t1, &rs, &seq[s][i]));
        }
    }
    ASSERT_TRUE(memcmp(seq[0], seq[1], sizeof seq[0]) == 0);
    uint64_t r6 = lkv_sampling_seed(6);
    int diff = 0;
    for (int i = 0; i < 64; i++) {
        ASSERT_OK(be->sample(be->ctx, lp, 3, &t1, &r6, &tok));
        diff += tok != seq[0][i];
    }
    ASSERT_TRUE(diff > 0);
    /* Bad input. */
    float bad[2] = {1, NAN};
    ASSERT_ERR(be->sample(be->ctx, bad, 2, &t1, &r, &tok), LKV_EINVAL);
    ASSERT_ERR(be->sample(be->ctx, lp, 0, &t1, &r, &tok), LKV_EINVAL);
}

int main(void)
{
    LKV_RUN(test_dense);
    LKV_RUN(test_rope);
    LKV_RUN(test_kv_write);
    LKV_RUN(test_sample);
    return 0;
}
