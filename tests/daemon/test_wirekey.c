/*
 * test_wirekey.c: the per-tenant key permutation of daemon/lkv_wirekey.c: it is a bijection
 * (decode(encode(k)) == k for many keys), identity mode is the identity, two tenants' wire keys
 * of one store key differ, a tenant decoding another's wire key gets a different store key,
 * the same salt and secret give the same permutation, and the secret file is created (0600),
 * reused, and refused when it has the wrong size. Seed: LKV_TEST_SEED (default 1).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lkv_err.h"
#include "lkv_test.h"
#include "lkv_wirekey.h"

static uint64_t rng = 1;
static uint8_t rnd8(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint8_t)(rng >> 24);
}

static void fill(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = rnd8();
    }
}

static void test_bijection(void)
{
    uint8_t secret[32], sa[32], sb[32];
    fill(secret, 32);
    fill(sa, 32);
    fill(sb, 32);
    lkv_wirekey a, b, a2, id;
    lkv_wirekey_init(&a, secret, sa, 0);
    lkv_wirekey_init(&b, secret, sb, 0);
    lkv_wirekey_init(&a2, secret, sa, 0);
    lkv_wirekey_init(&id, secret, sa, 1);
    for (int i = 0; i < 2000; i++) {
        lkv_dockey k, back, other;
        uint8_t wa[32], wb[32], wa2[32], wid[32];
        fill(k.b, 32);
        lkv_wirekey_encode(&a, &k, wa);
        lkv_wirekey_decode(&a, wa, &back);
        ASSERT_TRUE(memcmp(back.b, k.b, 32) == 0);
        ASSERT_TRUE(memcmp(wa, k.b, 32) != 0);
        lkv_wirekey_encode(&b, &k, wb);
        ASSERT_TRUE(memcmp(wa, wb, 32) != 0);
        lkv_wirekey_decode(&b, wa, &other); /* b presenting a's wire key */
        ASSERT_TRUE(memcmp(other.b, k.b, 32) != 0);
        lkv_wirekey_decode(&b, k.b, &other); /* b presenting the store key */
        ASSERT_TRUE(memcmp(other.b, k.b, 32) != 0);
        lkv_wirekey_encode(&a2, &k, wa2);
        ASSERT_TRUE(memcmp(wa, wa2, 32) == 0);
        lkv_wirekey_encode(&id, &k, wid);
        ASSERT_TRUE(memcmp(wid, k.b, 32) == 0);
        lkv_wirekey_decode(&id, wid, &back);
        ASSERT_TRUE(memcmp(back.b, k.b, 32) == 0);
    }
    /* Another secret gives another permutation. */
    lkv_wirekey c;
    secret[0] ^= 1;
    lkv_wirekey_init(&c, secret, sa, 0);
    lkv_dockey k;
    uint8_t w1[32], w2[32];
    fill(k.b, 32);
    lkv_wirekey_encode(&a, &k, w1);
    lkv_wirekey_encode(&c, &k, w2);
    ASSERT_TRUE(memcmp(w1, w2, 32) != 0);
}

static void test_secret_file(void)
{
    char dir[] = "/tmp/lkv-wirekey-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    uint8_t s1[32], s2[32];
    ASSERT_EQ(lkv_wirekey_secret_load(dir, s1), 0);
    char path[256];
    snprintf(path, sizeof(path), "%s/wirekey.secret", dir);
    struct stat st;
    ASSERT_EQ(stat(path, &st), 0);
    ASSERT_EQ((int)(st.st_mode & 0777), 0600);
    ASSERT_EQ((int)st.st_size, 32);
    ASSERT_EQ(lkv_wirekey_secret_load(dir, s2), 0);
    ASSERT_TRUE(memcmp(s1, s2, 32) == 0);
    int fd = open(path, O_WRONLY | O_APPEND);
    ASSERT_TRUE(fd >= 0);
    ASSERT_EQ((int)write(fd, "x", 1), 1);
    close(fd);
    ASSERT_EQ(lkv_wirekey_secret_load(dir, s2), LKV_EIO);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const char *seed = getenv("LKV_TEST_SEED");
    rng = seed != NULL ? strtoull(seed, NULL, 10) | 1 : 1;
    printf("seed %llu\n", (unsigned long long)rng);
    LKV_RUN(test_bijection);
    LKV_RUN(test_secret_file);
    return 0;
}
