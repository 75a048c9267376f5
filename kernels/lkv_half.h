/*
 * lkv_half.h: scalar conversions between fp32 and the 16-bit KV element types (IEEE binary16
 * "f16" and bfloat16 "bf16"), plus loads/stores of one arena element in any lkv_dtype.
 *
 * Plain C static inline functions on bit patterns (memcpy for type punning), so they compile
 * as C11, as CUDA host code and as CUDA device code alike. Narrowing rounds to nearest, ties to
 * even, exactly as the hardware conversions (__float2half_rn, __float2bfloat16_rn) do:
 *   - f16: overflow gives +-inf, results below the normal range become subnormals or zero,
 *     NaN stays NaN (quiet, sign kept).
 *   - bf16: NaN stays NaN (quiet), everything else is rounded on the top 16 bits.
 * Widening is exact. Elements are little-endian in memory (lkv_layout.h), which is the host
 * byte order on every machine lazykv runs on, so a uint16_t load is the element.
 */
#ifndef LKV_HALF_H
#define LKV_HALF_H

#include <stdint.h>
#include <string.h>

#include "lkv_layout.h"

static inline LKV_HD uint32_t lkv_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline LKV_HD float lkv_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Widens an IEEE binary16 bit pattern to fp32 (exact). */
static inline LKV_HD float lkv_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1fu) { /* inf or NaN */
        return lkv_bits_f32(sign | 0x7f800000u | (man << 13));
    }
    if (exp == 0) {
        if (man == 0) {
            return lkv_bits_f32(sign);
        }
        /* Subnormal: man * 2^-24, exact in fp32. */
        float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    return lkv_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

/* Narrows fp32 to an IEEE binary16 bit pattern, round to nearest even. */
static inline LKV_HD uint16_t lkv_f32_to_f16(float f)
{
    uint32_t u = lkv_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) { /* inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0));
    }
    if (a >= 0x477ff000u) { /* >= 65520: rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (a < 0x38800000u) {     /* below 2^-14: subnormal or zero */
        if (a < 0x33000000u) { /* <= 2^-25: rounds to zero (tie at 2^-25 goes to even 0) */
            return sign;
        }
        uint32_t e = a >> 23;                     /* 102 .. 112 */
        uint32_t m = (a & 0x7fffffu) | 0x800000u; /* 24-bit significand */
        uint32_t shift = 126u - e;                /* value = m * 2^(e-150); unit 2^-24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) {
            q++;
        }
        return (uint16_t)(sign | q);
    }
    /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits. */
    uint32_t r = a - 0x38000000u; /* exponent - 112 */
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) {
        q++; /* may carry into the exponent, which is the right result */
    }
    return (uint16_t)(sign | q);
}

/* Widens a bfloat16 bit pattern to fp32 (exact). */
static inline LKV_HD float lkv_bf16_to_f32(uint16_t b)
{
    return lkv_bits_f32((uint32_t)b << 16);
}

/* Narrows fp32 to a bfloat16 bit pattern, round to nearest even; NaN stays a quiet NaN. */
static inline LKV_HD uint16_t lkv_f32_to_bf16(float f)
{
    uint32_t u = lkv_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Reads element i of an array of dtype (enum lkv_dtype) at p as fp32. p is borrowed. */
static inline LKV_HD float lkv_load_elem(const void *p, int dtype, size_t i)
{
    if (dtype == LKV_DTYPE_F32) {
        float f;
        memcpy(&f, (const char *)p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const char *)p + 2 * i, 2);
    return dtype == LKV_DTYPE_F16 ? lkv_f16_to_f32(h) : lkv_bf16_to_f32(h);
}

/* Writes fp32 x as element i of an array of dtype at p (rounded once, to nearest even). */
static inline LKV_HD void lkv_store_elem(void *p, int dtype, size_t i, float x)
{
    if (dtype == LKV_DTYPE_F32) {
        memcpy((char *)p + 4 * i, &x, 4);
        return;
    }
    uint16_t h = dtype == LKV_DTYPE_F16 ? lkv_f32_to_f16(x) : lkv_f32_to_bf16(x);
    memcpy((char *)p + 2 * i, &h, 2);
}

#endif
