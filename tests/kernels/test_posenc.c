/*
 * test_posenc.c: RoPE frequency tables (plain, partial rotary, linear and Llama-3.1 scaling),
 * exact angles up to LKV_MAX_POSITION, rotations, ALiBi slopes and config validation, each
 * against an independent formula evaluated in long double.
 */
#include "kt_ref.h"
#include "kt_rng.h"
#include "lkv_attn.h"
#include "lkv_posenc.h"
#include "lkv_test.h"

#define PI_L      KT_PI_L
#define ref_theta kt_ref_theta
#define ref_slope kt_ref_slope

static lkv_posenc_cfg rope_cfg(double theta, int pairing, int rot)
{
    lkv_posenc_cfg c = {
        .kind = LKV_POSENC_ROPE, .rope_theta = theta, .rope_pairing = pairing, .rotary_dim = rot};
    return c;
}

static void test_freqs(void)
{
    lkv_posenc pe;
    lkv_posenc_cfg cfgs[5] = {rope_cfg(10000, LKV_ROPE_HALF, 0), rope_cfg(500000, LKV_ROPE_HALF, 0),
                              rope_cfg(10000, LKV_ROPE_INTERLEAVED, 32),
                              rope_cfg(1e6, LKV_ROPE_HALF, 64), rope_cfg(500000, 0, 0)};
    cfgs[3].rope_scaling = LKV_ROPE_SCALING_LINEAR;
    cfgs[3].scaling_factor = 4;
    cfgs[4].rope_scaling = LKV_ROPE_SCALING_LLAMA3;
    cfgs[4].scaling_factor = 8;
    cfgs[4].low_freq_factor = 1;
    cfgs[4].high_freq_factor = 4;
    cfgs[4].original_max_pos = 8192;
    double maxrel = 0;
    for (int c = 0; c < 5; c++) {
        ASSERT_OK(lkv_posenc_init(&pe, &cfgs[c], 128, 32));
        int rot = cfgs[c].rotary_dim ? cfgs[c].rotary_dim : 128;
        ASSERT_EQ(pe.n_pairs, rot / 2);
        ASSERT_EQ(pe.pairing, cfgs[c].rope_pairing);
        for (int j = 0; j < pe.n_pairs; j++) {
            long double want = ref_theta(&cfgs[c], rot, j) / (2 * PI_L);
            double rel = fabs((double)((pe.freq_turns[j] - want) / want));
            maxrel = rel > maxrel ? rel : maxrel;
            ASSERT_TRUE(rel < 1e-14);
            ASSERT_TRUE(pe.freq_hi[j] == (float)pe.freq_turns[j]);
            double split = (double)pe.freq_hi[j] + (double)pe.freq_lo[j];
            ASSERT_TRUE(fabs(split - pe.freq_turns[j]) <= 1e-14 * pe.freq_turns[j]);
        }
    }
    /* Llama-3.1 (theta 500000, d 128): pairs 0..28 unchanged, 29..34 blended, 35..63 / 8. */
    lkv_posenc plain;
    ASSERT_OK(lkv_posenc_init(&plain, &cfgs[1], 128, 32));
    ASSERT_OK(lkv_posenc_init(&pe, &cfgs[4], 128, 32));
    for (int j = 0; j < 64; j++) {
        double r = pe.freq_turns[j] / plain.freq_turns[j];
        if (j <= 28) {
            ASSERT_TRUE(r == 1.0);
        } else if (j >= 35) {
            ASSERT_NEAR(r, 0.125, 1e-15);
        } else {
            ASSERT_TRUE(r < 1.0 && r > 0.125);
        }
    }
    fprintf(stderr, "   max relative frequency error %.3g\n", maxrel);
}

/* Angle error of lkv_rope_cossin against long double, up to LKV_MAX_POSITION. */
static void test_exact_angles(void)
{
    lkv_posenc pe;
    lkv_posenc_cfg c = rope_cfg(1.0, LKV_ROPE_HALF, 0); /* theta_j = 1: the worst case */
    double worst = 0, worst_formula = 0;
    for (int k = 0; k < 3; k++) {
        if (k == 1) {
            c = rope_cfg(10000, LKV_ROPE_INTERLEAVED, 0);
        } else if (k == 2) {
            c = rope_cfg(500000, LKV_ROPE_HALF, 0);
        }
        ASSERT_OK(lkv_posenc_init(&pe, &c, 128, 1));
        for (int i = 0; i < 3000; i++) {
            int64_t off = i < 10 ? LKV_MAX_POSITION - i
                                 : kt_int(-(int64_t)LKV_MAX_POSITION, LKV_MAX_POSITION);
            int j = (int)kt_int(0, pe.n_pairs - 1);
            double cc, ss;
            lkv_rope_cossin(&pe, j, off, &cc, &ss);
            /* Against the table's own fp64 frequency: measures the reduction only. */
            long double t = (long double)off * (long double)pe.freq_turns[j];
            t -= roundl(t);
            long double a = 2 * PI_L * t;
            double err = fabs(atan2(ss, cc) - (double)a);
            err = err > PI_L ? 2 * PI_L - err : err;
            worst = err > worst ? err : worst;
            /* Against the formula (includes the fp64 rounding of the frequency). */
            long double tf = (long double)off * (ref_theta(&c, 128, j) / (2 * PI_L));
            tf -= roundl(tf);
            double errf = fabs(atan2(ss, cc) - (double)(2 * PI_L * tf));
            errf = errf > PI_L ? 2 * PI_L - errf : errf;
            worst_formula = errf > worst_formula ? errf : worst_formula;
            ASSERT_NEAR(cc * cc + ss * ss, 1.0, 1e-15);
        }
    }
    fprintf(stderr, "   max angle error %.3g rad (reduction), %.3g rad (vs formula)\n", worst,
            worst_formula);
    ASSERT_TRUE(worst < 1e-12);
    ASSERT_TRUE(worst_formula < 1e-9);
    /* Exact reductions of simple cases. */
    ASSERT_TRUE(fabs(lkv_rope_turns(1.0 / 3.0, 3) - 0.0) < 1e-15);
    ASSERT_NEAR(lkv_rope_turns(0.25, LKV_MAX_POSITION), -0.25, 1e-15);
}

/* The device recipe (DESIGN.md 10.5) emulated in fp32 with the table's hi/lo split: the angle
 * stays within ~1e-6 rad of exact at every offset up to LKV_MAX_POSITION. */
static void test_hi_lo_device_recipe(void)
{
    lkv_posenc pe;
    lkv_posenc_cfg c = rope_cfg(10000, LKV_ROPE_HALF, 0);
    double worst = 0;
    for (int k = 0; k < 2; k++) {
        c.rope_theta = k == 0 ? 10000 : 1.5;
        ASSERT_OK(lkv_posenc_init(&pe, &c, 128, 1));
        for (int i = 0; i < 20000; i++) {
            int64_t off = i < 64 ? LKV_MAX_POSITION - i : kt_int(0, LKV_MAX_POSITION);
            int j = i < 64 ? i : (int)kt_int(0, pe.n_pairs - 1);
            float x = (float)off; /* exact: off < 2^24 */
            float p = x * pe.freq_hi[j];
            float e = fmaf(x, pe.freq_hi[j], -p) + x * pe.freq_lo[j];
            float r = (p - rintf(p)) + e;
            double exact = lkv_rope_turns(pe.freq_turns[j], off);
            double d = fabs((double)r - exact);
            d = d > 0.5 ? 1.0 - d : d; /* r may sit just past +-1/2 */
            d *= 2 * M_PI;
            worst = d > worst ? d : worst;
        }
    }
    fprintf(stderr, "   fp32 hi/lo device recipe: max angle error %.3g rad\n", worst);
    ASSERT_TRUE(worst < 2e-6);
}

static void test_rotate(void)
{
    float x[256], y[256], z[256], w[256];
    for (int k = 0; k < 200; k++) {
        int D = 8 * (int)kt_int(1, 32);
        int rot = k % 3 == 0 ? 0 : 2 * (int)kt_int(1, D / 2);
        lkv_posenc_cfg c = rope_cfg(kt_int(0, 1) ? 10000 : 1e6, (int)kt_int(0, 1), rot);
        lkv_posenc pe;
        ASSERT_OK(lkv_posenc_init(&pe, &c, D, 4));
        rot = rot ? rot : D;
        for (int d = 0; d < D; d++) {
            x[d] = (float)kt_normal();
        }
        int64_t a = kt_int(-(int64_t)LKV_MAX_POSITION, LKV_MAX_POSITION);
        int64_t b = kt_int(-(int64_t)LKV_MAX_POSITION, LKV_MAX_POSITION);
        lkv_rope_rotate_f32(&pe, x, y, a);
        lkv_rope_rotate_f32(&pe, y, y, b); /* in place */
        lkv_rope_rotate_f32(&pe, x, z, a + b);
        lkv_rope_rotate_f32(&pe, z, w, -(a + b));
        double n0 = 0, n1 = 0;
        for (int d = 0; d < D; d++) {
            ASSERT_NEAR(y[d], z[d], 1e-5);
            ASSERT_NEAR(w[d], x[d], 1e-5);
            n0 += (double)x[d] * x[d];
            n1 += (double)z[d] * z[d];
        }
        ASSERT_NEAR(n0, n1, 1e-4 * n0);
        /* Independent rotation of each pair, and untouched tail dims. */
        for (int j = 0; j < rot / 2; j++) {
            int i0 = c.rope_pairing == LKV_ROPE_INTERLEAVED ? 2 * j : j;
            int i1 = c.rope_pairing == LKV_ROPE_INTERLEAVED ? 2 * j + 1 : j + rot / 2;
            long double t = (long double)a * (ref_theta(&c, rot, j) / (2 * PI_L));
            long double ang = 2 * PI_L * (t - roundl(t));
            long double e0 = x[i0] * cosl(ang) - x[i1] * sinl(ang);
            long double e1 = x[i0] * sinl(ang) + x[i1] * cosl(ang);
            lkv_rope_rotate_f32(&pe, x, y, a);
            ASSERT_NEAR(y[i0], (double)e0, 1e-6 * (1 + fabsl(e0)));
            ASSERT_NEAR(y[i1], (double)e1, 1e-6 * (1 + fabsl(e1)));
        }
        for (int d = rot; d < D; d++) {
            ASSERT_TRUE(z[d] == x[d]);
        }
    }
    /* NONE and ALiBi do not rotate. */
    lkv_posenc_cfg c = {.kind = LKV_POSENC_ALIBI};
    lkv_posenc pe;
    ASSERT_OK(lkv_posenc_init(&pe, &c, 16, 4));
    for (int d = 0; d < 16; d++) {
        x[d] = (float)d;
    }
    lkv_rope_rotate_f32(&pe, x, y, 12345);
    ASSERT_TRUE(memcmp(x, y, 16 * sizeof(float)) == 0);
}

static void test_alibi(void)
{
    lkv_posenc pe;
    lkv_posenc_cfg c = {.kind = LKV_POSENC_ALIBI};
    ASSERT_OK(lkv_posenc_init(&pe, &c, 64, 8));
    for (int h = 0; h < 8; h++) {
        ASSERT_TRUE(pe.alibi_slope[h] == ldexpf(1.0f, -(h + 1)));
    }
    ASSERT_EQ(pe.n_pairs, 0);
    for (int n = 1; n <= LKV_MAX_Q_HEADS; n++) {
        ASSERT_OK(lkv_posenc_init(&pe, &c, 64, n));
        ASSERT_EQ(pe.n_q_heads, n);
        for (int h = 0; h < n; h++) {
            ASSERT_NEAR(pe.alibi_slope[h], ref_slope(n, h), 1e-7 * ref_slope(n, h));
        }
    }
    /* 12 heads (BLOOM-like): 8 from 2^-1..2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5. */
    ASSERT_OK(lkv_posenc_init(&pe, &c, 64, 12));
    ASSERT_NEAR(pe.alibi_slope[8], pow(2, -0.5), 1e-7);
    ASSERT_NEAR(pe.alibi_slope[11], pow(2, -3.5), 1e-7);
}

static void test_invalid(void)
{
    lkv_posenc pe;
    lkv_posenc_cfg c = rope_cfg(10000, LKV_ROPE_HALF, 0);
    ASSERT_ERR(lkv_posenc_init(NULL, &c, 64, 8), LKV_EINVAL);
    ASSERT_ERR(lkv_posenc_init(&pe, NULL, 64, 8), LKV_EINVAL);
    ASSERT_ERR(lkv_posenc_init(&pe, &c, 4, 8), LKV_EINVAL);
    ASSERT_ERR(lkv_posenc_init(&pe, &c, 12, 8), LKV_EINVAL);
    ASSERT_ERR(lkv_posenc_init(&pe, &c, 264, 8), LKV_EINVAL);
    ASSERT_ERR(lkv_posenc_init(&pe, &c, 64, 0), LKV_EINVAL);
    ASSERT_ERR(lkv_posenc_init(&pe, &c, 64, LKV_MAX_Q_HEADS + 1), LKV_EINVAL);
    ASSERT_OK(lkv_posenc_init(&pe, &c, 256, LKV_MAX_Q_HEADS));
    lkv_posenc_cfg bad[] = {
        rope_cfg(10000, LKV_ROPE_HALF, 7),  rope_cfg(10000, LKV_ROPE_HALF, 66),
        rope_cfg(0, LKV_ROPE_HALF, 0),      rope_cfg(-5, LKV_ROPE_HALF, 0),
        rope_cfg(NAN, LKV_ROPE_HALF, 0),    rope_cfg(10000, 2, 0),
        rope_cfg(10000, LKV_ROPE_HALF, -2),
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_ERR(lkv_posenc_init(&pe, &bad[i], 64, 8), LKV_EINVAL);
    }
    c.rope_scaling = LKV_ROPE_SCALING_LINEAR;
    ASSERT_ERR(lkv_posenc_init(&pe, &c, 64, 8), LKV_EINVAL); /* factor 0 */
    c.scaling_factor = 2;
    ASSERT_OK(lkv_posenc_init(&pe, &c, 64, 8));
    c.rope_scaling = LKV_ROPE_SCALING_LLAMA3;
    c.low_freq_factor = 4;
    c.high_freq_factor = 1; /* high <= low */
    c.original_max_pos = 8192;
    ASSERT_ERR(lkv_posenc_init(&pe, &c, 64, 8), LKV_EINVAL);
    c.low_freq_factor = 1;
    c.high_freq_factor = 4;
    c.original_max_pos = 0;
    ASSERT_ERR(lkv_posenc_init(&pe, &c, 64, 8), LKV_EINVAL);
    c.rope_scaling = 7;
    ASSERT_ERR(lkv_posenc_init(&pe, &c, 64, 8), LKV_EINVAL);
    c.kind = 3;
    ASSERT_ERR(lkv_posenc_init(&pe, &c, 64, 8), LKV_EINVAL);
}

int main(void)
{
    kt_seed("test_posenc");
    LKV_RUN(test_freqs);
    LKV_RUN(test_exact_angles);
    LKV_RUN(test_hi_lo_device_recipe);
    LKV_RUN(test_rotate);
    LKV_RUN(test_alibi);
    LKV_RUN(test_invalid);
    return 0;
}
