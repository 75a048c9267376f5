/*
 * test_layout.c: the block layout and block references of kernels/lkv_layout.h, and the
 * fp32 <-> f16/bf16 conversions of kernels/lkv_half.h.
 */
#include "kt_rng.h"
#include "lkv_half.h"
#include "lkv_layout.h"
#include "lkv_test.h"

static void test_ref_pack_roundtrip(void)
{
    for (int i = 0; i < 100000; i++) {
        uint32_t page = (uint32_t)kt_int(0, LKV_REF_MAX_PAGE);
        uint32_t start = (uint32_t)kt_int(0, LKV_REF_MAX_START);
        uint32_t block = (uint32_t)kt_int(0, LKV_REF_MAX_BLOCK);
        uint32_t valid = (uint32_t)kt_int(1, 64);
        if (i < 4) { /* the corners */
            page = i & 1 ? LKV_REF_MAX_PAGE : 0;
            start = i & 2 ? LKV_REF_MAX_START : 0;
            block = i & 1 ? LKV_REF_MAX_BLOCK : 0;
            valid = i & 2 ? 64 : 1;
        }
        uint64_t r = lkv_ref_pack(page, start, block, valid), r2 = 0;
        ASSERT_EQ(lkv_ref_page(r), page);
        ASSERT_EQ(lkv_ref_start(r), start);
        ASSERT_EQ(lkv_ref_block(r), block);
        ASSERT_EQ(lkv_ref_valid(r), valid);
        /* Bit positions as documented. */
        ASSERT_EQ(r & 0xffffffu, page);
        ASSERT_EQ((r >> 24) & 0x3fffffu, start);
        ASSERT_EQ((r >> 46) & 0xfffu, block);
        ASSERT_EQ(r >> 58, valid - 1);
        ASSERT_EQ(lkv_ref_pack_checked(page, start, block, valid, &r2), 0);
        ASSERT_EQ(r2, r);
    }
    uint64_t r = 0;
    ASSERT_EQ(lkv_ref_pack_checked(LKV_REF_MAX_PAGE + 1u, 0, 0, 1, &r), -1);
    ASSERT_EQ(lkv_ref_pack_checked(0, LKV_REF_MAX_START + 1ull, 0, 1, &r), -1);
    ASSERT_EQ(lkv_ref_pack_checked(0, 1ull << 40, 0, 1, &r), -1);
    ASSERT_EQ(lkv_ref_pack_checked(0, 0, LKV_REF_MAX_BLOCK + 1u, 1, &r), -1);
    ASSERT_EQ(lkv_ref_pack_checked(0, 0, 0, 0, &r), -1);
    ASSERT_EQ(lkv_ref_pack_checked(0, 0, 0, 65, &r), -1);
    ASSERT_EQ(r, 0);
    ASSERT_EQ(LKV_MAX_POSITION, 4194303);
}

static void test_offsets(void)
{
    for (int i = 0; i < 2000; i++) {
        lkv_kv_shape s = {
            .n_layers = (int)kt_int(1, 80),
            .n_q_heads = 0,
            .n_kv_heads = (int)kt_int(1, 16),
            .head_dim = 8 * (int)kt_int(1, 32),
            .dtype = (int)kt_int(0, 2),
            .block_tokens = (int)kt_int(1, 64),
        };
        s.n_q_heads = s.n_kv_heads * (int)kt_int(1, 8);
        size_t es = s.dtype == LKV_DTYPE_F32 ? 4 : 2;
        ASSERT_EQ(lkv_dtype_size(s.dtype), es);
        ASSERT_EQ(lkv_slab_bytes(&s), (size_t)s.block_tokens * s.head_dim * es);
        ASSERT_EQ(lkv_block_bytes(&s),
                  (size_t)s.n_layers * 2 * s.n_kv_heads * s.block_tokens * s.head_dim * es);
        int l = (int)kt_int(0, s.n_layers - 1), kv = (int)kt_int(0, 1);
        int h = (int)kt_int(0, s.n_kv_heads - 1), t = (int)kt_int(0, s.block_tokens - 1);
        int d = (int)kt_int(0, s.head_dim - 1);
        size_t want =
            (((((size_t)l * 2 + kv) * s.n_kv_heads + h) * s.block_tokens + t) * s.head_dim + d) *
            es;
        ASSERT_EQ(lkv_slab_offset(&s, l, kv, h) + ((size_t)t * s.head_dim + d) * es, want);
        /* The last slab ends exactly at the end of the block. */
        ASSERT_EQ(lkv_slab_offset(&s, s.n_layers - 1, 1, s.n_kv_heads - 1) + lkv_slab_bytes(&s),
                  lkv_block_bytes(&s));
        uint64_t n = (uint64_t)kt_int(0, 100000);
        ASSERT_EQ(lkv_blocks_for_tokens(&s, n), (n + s.block_tokens - 1) / s.block_tokens);
    }
    ASSERT_EQ(lkv_dtype_size(3), 0);
    ASSERT_EQ(lkv_dtype_size(-1), 0);
}

static void test_half_known(void)
{
    struct {
        float f;
        uint16_t h;
    } f16[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {65504.0f, 0x7bff},
        {65519.0f, 0x7bff},
        {65520.0f, 0x7c00},
        {1e10f, 0x7c00},
        {-1e10f, 0xfc00},
        {INFINITY, 0x7c00},
        {0x1p-14f, 0x0400},
        {0x1p-24f, 0x0001},
        {0x1p-25f, 0x0000},
        {0x1.8p-25f, 0x0001},
        {0x1.8p-24f, 0x0002},
        {0x1p-26f, 0x0000},
        {1.0f + 0x1p-11f, 0x3c00},
        {1.0f + 0x1.8p-11f, 0x3c01},
        {1.0f + 0x3p-11f, 0x3c02},
        {0x1.ffcp-15f, 0x0400},
        {0.1f, 0x2e66},
    };
    for (size_t i = 0; i < sizeof f16 / sizeof f16[0]; i++) {
        ASSERT_EQ(lkv_f32_to_f16(f16[i].f), f16[i].h);
    }
    ASSERT_TRUE(isnan(lkv_f16_to_f32(lkv_f32_to_f16(NAN))));
    ASSERT_TRUE(isnan(lkv_bf16_to_f32(lkv_f32_to_bf16(NAN))));
    ASSERT_EQ(lkv_f32_to_bf16(1.0f), 0x3f80);
    ASSERT_EQ(lkv_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);   /* tie to even */
    ASSERT_EQ(lkv_f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);   /* tie to even, up */
    ASSERT_EQ(lkv_f32_to_bf16(1.0f + 0x1.2p-8f), 0x3f81); /* above the tie */
    ASSERT_EQ(lkv_f32_to_bf16(-INFINITY), 0xff80);
    /* Every non-NaN 16-bit pattern survives widen + narrow. */
    for (uint32_t u = 0; u < 65536; u++) {
        uint16_t h = (uint16_t)u;
        if ((h & 0x7c00u) != 0x7c00u || (h & 0x3ffu) == 0) {
            ASSERT_EQ(lkv_f32_to_f16(lkv_f16_to_f32(h)), h);
        }
        if ((h & 0x7f80u) != 0x7f80u || (h & 0x7fu) == 0) {
            ASSERT_EQ(lkv_f32_to_bf16(lkv_bf16_to_f32(h)), h);
        }
    }
}

static void test_half_random(void)
{
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = (uint32_t)kt_next();
        float f = lkv_bits_f32(u);
        if (isnan(f)) {
            continue;
        }
#ifdef __FLT16_MAX__
        /* The compiler's own conversion (round to nearest even) is the reference. */
        _Float16 r = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &r, 2);
        ASSERT_EQ(lkv_f32_to_f16(f), rb);
#endif
        /* f16: the result is a nearest representable value (bracketing check). */
        float back = lkv_f16_to_f32(lkv_f32_to_f16(f));
        if (fabsf(f) < 65504.0f) {
            uint16_t h = lkv_f32_to_f16(f);
            float up = lkv_f16_to_f32((uint16_t)(h + 1)),
                  dn = h & 0x7fffu ? lkv_f16_to_f32((uint16_t)(h - 1)) : back;
            ASSERT_TRUE(fabsf(back - f) <= fabsf(up - f) && fabsf(back - f) <= fabsf(dn - f));
        }
        /* bf16: relative error at most 2^-8 (unit roundoff) for normal numbers. */
        float bb = lkv_bf16_to_f32(lkv_f32_to_bf16(f));
        if (isfinite(bb) && fabsf(f) > 0x1p-126f) {
            ASSERT_TRUE(fabs((double)bb - f) <= ldexp(fabs(f), -8));
        }
        uint8_t buf[8];
        for (int dt = 0; dt < 3; dt++) {
            lkv_store_elem(buf, dt, 1, f);
            float g = lkv_load_elem(buf, dt, 1);
            float want = dt == 0 ? f : dt == 1 ? back : bb;
            ASSERT_TRUE(g == want || (isnan(g) && isnan(want)));
        }
    }
}

/* The arena contract: a reference's page is an index within its region, and the block starts
 * at region_base + page * page_bytes, whatever the other fields hold. */
static void test_ref_block_addr(void)
{
    static uint8_t arena[(4u << 20) + 8 * 20480];
    const uint8_t *region = arena + (4u << 20); /* A second region at 4 MiB, 20 KiB pages. */
    uint64_t r = lkv_ref_pack(7, 4000000, 4095, 64);
    ASSERT_TRUE(lkv_ref_block_addr(region, 20480, r) == region + 7 * 20480);
    ASSERT_TRUE(lkv_ref_block_addr(region, 20480, lkv_ref_pack(0, 0, 0, 1)) == region);
    /* Region 0 at the arena base, 2 MiB pages: page 1 is the second region's start. */
    ASSERT_TRUE(lkv_ref_block_addr(arena, 2u << 20, lkv_ref_pack(2, 9, 9, 9)) == region);
}

int main(void)
{
    LKV_RUN(test_ref_block_addr);
    kt_seed("test_layout");
    LKV_RUN(test_ref_pack_roundtrip);
    LKV_RUN(test_offsets);
    LKV_RUN(test_half_known);
    LKV_RUN(test_half_random);
    return 0;
}
