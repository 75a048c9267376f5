/*
 * test_crc32c.c: lazykv's hardware CRC32c (storage/lkv_crc32c.c) against the standard check
 * value, an independent bit-at-a-time reference, and librocksdb's own rocksdb::crc32c::Extend
 * (found past the interposer with dlsym(RTLD_NEXT)), over every alignment, lengths around the
 * three-stream round (3 x 8 KiB), chained calls; that RocksDB's calls really reach it; and a
 * RocksDB round trip under it: values written, flushed and read back with verify_checksums on,
 * then one byte of the SST file flipped and the read refused as corruption.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <fcntl.h>
#include <rocksdb/c.h>
#include <stdio.h>
#include <unistd.h>

#include "lkv_crc32c.h"
#include "lkv_test.h"

typedef uint32_t (*extend_fn)(uint32_t, const char *, size_t);

/* Bit at a time, straight from the definition (reflected 0x82F63B78, inverted in and out). */
static uint32_t ref_crc(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) {
            crc = (crc & 1) ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
        }
    }
    return ~crc;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static uint8_t *random_buf(size_t n)
{
    uint8_t *b = malloc(n);
    ASSERT_TRUE(b != NULL);
    for (size_t i = 0; i < n; i++) {
        b[i] = (uint8_t)next();
    }
    return b;
}

static void test_check_value(void)
{
    const char *s = "123456789";
    ASSERT_EQ(lkv_crc32c_extend(0, s, 9), 0xE3069283u);
    ASSERT_EQ(ref_crc(0, (const uint8_t *)s, 9), 0xE3069283u);
    ASSERT_EQ(lkv_crc32c_extend(0, NULL, 0), 0);
    ASSERT_EQ(lkv_crc32c_extend(0x12345678u, NULL, 0), 0x12345678u);
}

static void test_against_reference(void)
{
    const size_t max = (1u << 20) + 64;
    uint8_t *b = random_buf(max);
    static const size_t lens[] = {
        0,     1,     7,     8,     9,     63,    64,    65,    8191,  8192,     8193,
        24575, 24576, 24577, 49151, 49152, 49160, 73735, 98304, 98311, 1u << 20, (1u << 20) + 5};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        for (size_t off = 0; off < 8; off++) {
            size_t n = lens[li];
            uint32_t want = ref_crc(0, b + off, n);
            uint32_t got = lkv_crc32c_extend(0, b + off, n);
            if (got != want) {
                LKV_FAIL("len %zu off %zu: 0x%08x, reference 0x%08x", n, off, got, want);
            }
        }
    }
    /* Random lengths and seeds; chaining equals one call over the concatenation. */
    for (int i = 0; i < 200; i++) {
        size_t off = next() % 64, n = next() % (max - 64 - off);
        size_t cut = n > 0 ? next() % n : 0;
        uint32_t seed = (uint32_t)next();
        uint32_t want = ref_crc(seed, b + off, n);
        ASSERT_EQ(lkv_crc32c_extend(seed, b + off, n), want);
        uint32_t part = lkv_crc32c_extend(seed, b + off, cut);
        ASSERT_EQ(lkv_crc32c_extend(part, b + off + cut, n - cut), want);
    }
    free(b);
}

static void test_against_rocksdb(void)
{
    extend_fn lib = (extend_fn)dlsym(RTLD_NEXT, "_ZN7rocksdb6crc32c6ExtendEjPKcm");
    if (lib == NULL) {
        LKV_FAIL("librocksdb exports no rocksdb::crc32c::Extend: the interposition has no "
                 "target (lkv_crc32c.h)");
    }
    const size_t max = 3u << 20;
    uint8_t *b = random_buf(max);
    for (int i = 0; i < 60; i++) {
        size_t off = next() % 16, n = i < 4 ? max - 16 : next() % (max - 16);
        uint32_t seed = i % 3 == 0 ? 0 : (uint32_t)next();
        uint32_t want = lib(seed, (const char *)b + off, n);
        uint32_t got = lkv_crc32c_extend(seed, b + off, n);
        if (got != want) {
            LKV_FAIL("len %zu off %zu seed 0x%08x: 0x%08x, librocksdb 0x%08x", n, off, seed, got,
                     want);
        }
    }
    free(b);
    /* RocksDB's own calls land in lazykv's function on a CPU with SSE4.2. */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        if (!lkv_crc32c_active()) {
            LKV_FAIL("not interposed: %s", lkv_crc32c_describe());
        }
    } else {
        fprintf(stderr, "no SSE4.2 here: %s\n", lkv_crc32c_describe());
    }
    fprintf(stderr, "RocksDB's CRC32c: %s\n", lkv_crc32c_describe());
}

static void rdb_check(char *err, const char *what)
{
    if (err != NULL) {
        LKV_FAIL("%s: %s", what, err);
    }
}

static void test_rocksdb_round_trip(void)
{
    char dir[] = "/tmp/lkv-crc32c-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(o, 1);
    rocksdb_options_set_paranoid_checks(o, 1);
    rocksdb_options_set_compression(o, rocksdb_no_compression);
    char *err = NULL;
    rocksdb_t *db = rocksdb_open(o, dir, &err);
    rdb_check(err, "open");
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    char key[16], val[3000];
    for (int i = 0; i < 64; i++) {
        snprintf(key, sizeof key, "k%03d", i);
        memset(val, 'a' + i % 26, sizeof val);
        rocksdb_put(db, wo, key, strlen(key), val, sizeof val, &err);
        rdb_check(err, "put");
    }
    rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
    rocksdb_flush(db, fo, &err);
    rdb_check(err, "flush");
    rocksdb_close(db);
    db = rocksdb_open(o, dir, &err); /* Reads the MANIFEST and the SST footer: checked. */
    rdb_check(err, "reopen");
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(ro, 1);
    rocksdb_readoptions_set_fill_cache(ro, 0);
    for (int i = 0; i < 64; i++) {
        snprintf(key, sizeof key, "k%03d", i);
        size_t n = 0;
        char *v = rocksdb_get(db, ro, key, strlen(key), &n, &err);
        rdb_check(err, "get");
        ASSERT_EQ(n, sizeof val);
        ASSERT_EQ(v[0], 'a' + i % 26);
        rocksdb_free(v);
    }
    rocksdb_close(db);
    /* Flip one byte in the middle of the SST's data blocks: the block CRC must refuse it. */
    DIR *d = opendir(dir);
    ASSERT_TRUE(d != NULL);
    struct dirent *e;
    char sst[512] = "";
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l > 4 && strcmp(e->d_name + l - 4, ".sst") == 0) {
            snprintf(sst, sizeof sst, "%s/%s", dir, e->d_name);
        }
    }
    closedir(d);
    ASSERT_TRUE(sst[0] != '\0');
    int fd = open(sst, O_RDWR);
    ASSERT_TRUE(fd >= 0);
    uint8_t b;
    ASSERT_EQ(pread(fd, &b, 1, 100), 1);
    b ^= 0x40;
    ASSERT_EQ(pwrite(fd, &b, 1, 100), 1);
    close(fd);
    db = rocksdb_open(o, dir, &err);
    rdb_check(err, "open after the flip");
    int refused = 0;
    for (int i = 0; i < 64 && !refused; i++) {
        snprintf(key, sizeof key, "k%03d", i);
        size_t n = 0;
        char *v = rocksdb_get(db, ro, key, strlen(key), &n, &err);
        if (err != NULL) {
            refused = strstr(err, "orrupt") != NULL || strstr(err, "checksum") != NULL;
            if (!refused) {
                LKV_FAIL("unexpected error after the flip: %s", err);
            }
            rocksdb_free(err);
            err = NULL;
        }
        rocksdb_free(v);
    }
    ASSERT_TRUE(refused);
    rocksdb_close(db);
    rocksdb_readoptions_destroy(ro);
    rocksdb_flushoptions_destroy(fo);
    rocksdb_writeoptions_destroy(wo);
    rocksdb_options_destroy(o);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ASSERT_EQ(system(cmd), 0);
}

int main(void)
{
    LKV_RUN(test_check_value);
    LKV_RUN(test_against_reference);
    LKV_RUN(test_against_rocksdb);
    LKV_RUN(test_rocksdb_round_trip);
    return 0;
}
