/*
 * lkv_crc32c.c: hardware CRC32c, interposed over librocksdb's software one (see lkv_crc32c.h).
 *
 * Arithmetic. CRC32c works on a 32-bit register in the reflected representation of GF(2)[x]
 * modulo P = 0x82F63B78 (reflected). Extend(crc, d) = R(crc ^ ~0, d) ^ ~0, where R(s, d) is the
 * raw register after feeding d starting from state s (what the crc32 instruction computes).
 * R is linear: R(s, A || B) = shift(R(s, A), |B|) ^ R(0, B), where shift(r, n) multiplies r by
 * x^(8n) modulo P. So a long buffer is cut into rounds of three STREAM-byte pieces whose raw
 * CRCs run as three independent instruction chains (the crc32 instruction has a latency of 3
 * cycles and a throughput of 1: one chain uses a third of it), then
 *     state = shift(c0, 2 * STREAM) ^ shift(c1, STREAM) ^ c2.
 * shift by a fixed amount is linear in r, so it is four table look-ups, one per byte of r
 * (tables built once from the zlib-style multmodp, below). The tail (< 3 * STREAM bytes) runs
 * on one chain.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "lkv_crc32c.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

#define POLY           0x82f63b78u /* CRC32c (Castagnoli), reflected. */
#define STREAM         8192u       /* Bytes per chain per round (3 chains: 24 KiB a round). */
#define ROCKSDB_EXTEND "_ZN7rocksdb6crc32c6ExtendEjPKcm" /* rocksdb::crc32c::Extend. */

typedef uint32_t (*extend_fn)(uint32_t, const char *, size_t);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static uint32_t sw_table[256];   /* Byte-at-a-time table (portable path). */
static uint32_t shift1[4][256];  /* r -> shift(r, STREAM), byte by byte. */
static uint32_t shift2[4][256];  /* r -> shift(r, 2 * STREAM). */
static int have_sse42;           /* The CPU has the crc32 instruction. */
static extend_fn library_extend; /* librocksdb's own Extend (RTLD_NEXT), or NULL. */

/* a(x) * b(x) modulo P, reflected; a must not be 0 (zlib's multmodp). */
static uint32_t multmodp(uint32_t a, uint32_t b)
{
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) {
                break;
            }
        }
        m >>= 1;
        b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

/* x^(8 * n) modulo P. */
static uint32_t xpow8n(size_t n)
{
    uint32_t sq = 1u << 30; /* x^1; squared below to x^2, x^4, ... */
    uint32_t p = 1u << 31;  /* x^0 */
    size_t e = n * 8;
    while (e != 0) {
        if (e & 1) {
            p = multmodp(sq, p);
        }
        sq = multmodp(sq, sq);
        e >>= 1;
    }
    return p;
}

static void init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        }
        sw_table[i] = c;
    }
    uint32_t x1 = xpow8n(STREAM), x2 = xpow8n(2 * (size_t)STREAM);
    for (int k = 0; k < 4; k++) {
        for (uint32_t b = 0; b < 256; b++) {
            shift1[k][b] = multmodp(x1, b << (8 * k));
            shift2[k][b] = multmodp(x2, b << (8 * k));
        }
    }
#if HAVE_X86
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2") != 0;
#endif
    library_extend = (extend_fn)dlsym(RTLD_NEXT, ROCKSDB_EXTEND);
}

static uint32_t shift(const uint32_t t[4][256], uint32_t r)
{
    return t[0][r & 0xff] ^ t[1][(r >> 8) & 0xff] ^ t[2][(r >> 16) & 0xff] ^ t[3][r >> 24];
}

static uint32_t raw_sw(uint32_t s, const uint8_t *p, size_t n)
{
    while (n-- > 0) {
        s = sw_table[(s ^ *p++) & 0xff] ^ (s >> 8);
    }
    return s;
}

#if HAVE_X86
static inline __attribute__((target("sse4.2"))) uint64_t load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static __attribute__((target("sse4.2"))) uint32_t raw_hw(uint32_t s, const uint8_t *p, size_t n)
{
    while (n > 0 && ((uintptr_t)p & 7) != 0) {
        s = _mm_crc32_u8(s, *p++);
        n--;
    }
    uint64_t c0 = s;
    while (n >= 3 * (size_t)STREAM) {
        uint64_t c1 = 0, c2 = 0;
        const uint8_t *q1 = p + STREAM, *q2 = p + 2 * STREAM;
        for (size_t i = 0; i < STREAM; i += 8) {
            c0 = _mm_crc32_u64(c0, load64(p + i));
            c1 = _mm_crc32_u64(c1, load64(q1 + i));
            c2 = _mm_crc32_u64(c2, load64(q2 + i));
        }
        c0 = shift(shift2, (uint32_t)c0) ^ shift(shift1, (uint32_t)c1) ^ (uint32_t)c2;
        p += 3 * (size_t)STREAM;
        n -= 3 * (size_t)STREAM;
    }
    while (n >= 8) {
        c0 = _mm_crc32_u64(c0, load64(p));
        p += 8;
        n -= 8;
    }
    s = (uint32_t)c0;
    while (n-- > 0) {
        s = _mm_crc32_u8(s, *p++);
    }
    return s;
}
#endif

uint32_t lkv_crc32c_extend(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&once, init);
    uint32_t s = ~crc;
#if HAVE_X86
    if (have_sse42) {
        return ~raw_hw(s, data, n);
    }
#endif
    return ~raw_sw(s, data, n);
}

/* The interposer: librocksdb's calls to rocksdb::crc32c::Extend land here. Without the
 * instruction it hands over to the library's own (the same function it would have called). */
uint32_t lkv__rocksdb_crc32c_extend(uint32_t crc, const char *buf,
                                    size_t n) __asm__(ROCKSDB_EXTEND);

uint32_t lkv__rocksdb_crc32c_extend(uint32_t crc, const char *buf, size_t n)
{
    pthread_once(&once, init);
    if (!have_sse42 && library_extend != NULL) {
        return library_extend(crc, buf, n);
    }
    return lkv_crc32c_extend(crc, buf, n);
}

int lkv_crc32c_active(void)
{
    pthread_once(&once, init);
    void *bound = dlsym(RTLD_DEFAULT, ROCKSDB_EXTEND);
    return have_sse42 && bound == (void *)lkv__rocksdb_crc32c_extend;
}

const char *lkv_crc32c_describe(void)
{
    if (lkv_crc32c_active()) {
        return "hardware (SSE4.2, 3 streams; interposed over librocksdb's own)";
    }
    if (!have_sse42) {
        return "librocksdb's own (this CPU has no SSE4.2)";
    }
    return "librocksdb's own (rocksdb::crc32c::Extend is not interposed: the executable does "
           "not export lazykv's definition)";
}
