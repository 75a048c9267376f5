/*
 * test_dockey.c: document keys (determinism, every input matters, golden value computed
 * independently with Python hashlib), hex round trip and tenant salts.
 */
#include <string.h>

#include "lkv_dockey.h"
#include "storage_util.h"

/* blake2b(salt=0^32 || fp=0x01..0x20 || LE u32 1,2,3, digest_size=32), by Python. */
#define GOLDEN_KEY "d709a3c043a3a68daad34c381f00e6d030ab4f3adaf51c7bd85ece7f4e135e30"

static void test_key(void)
{
    uint8_t salt[32], fp[32];
    uint32_t t[3] = {1, 2, 3};
    lkv_dockey k1, k2;
    char hex[65];

    lkv_tenant_salt_default(salt);
    for (int i = 0; i < 32; i++) {
        ASSERT_EQ(salt[i], 0);
        fp[i] = (uint8_t)(i + 1);
    }
    lkv_dockey_compute(salt, fp, t, 3, &k1);
    lkv_dockey_to_hex(&k1, hex);
    if (strcmp(hex, GOLDEN_KEY) != 0) {
        LKV_FAIL("key %s, golden %s", hex, GOLDEN_KEY);
    }
    lkv_dockey_compute(salt, fp, t, 3, &k2);
    ASSERT_TRUE(memcmp(&k1, &k2, sizeof k1) == 0);
    /* Salt, fingerprint, every token and the length change the key. */
    salt[5] = 1;
    lkv_dockey_compute(salt, fp, t, 3, &k2);
    ASSERT_TRUE(memcmp(&k1, &k2, sizeof k1) != 0);
    salt[5] = 0;
    fp[31] ^= 1;
    lkv_dockey_compute(salt, fp, t, 3, &k2);
    ASSERT_TRUE(memcmp(&k1, &k2, sizeof k1) != 0);
    fp[31] ^= 1;
    t[2] = 4;
    lkv_dockey_compute(salt, fp, t, 3, &k2);
    ASSERT_TRUE(memcmp(&k1, &k2, sizeof k1) != 0);
    t[2] = 3;
    lkv_dockey_compute(salt, fp, t, 2, &k2);
    ASSERT_TRUE(memcmp(&k1, &k2, sizeof k1) != 0);

    /* Content hash ignores the fingerprint but not the salt or tokens. */
    uint64_t c1 = lkv_dockey_content_hash(salt, t, 3);
    ASSERT_TRUE(c1 == lkv_dockey_content_hash(salt, t, 3));
    t[0] = 9;
    ASSERT_TRUE(c1 != lkv_dockey_content_hash(salt, t, 3));
}

static void test_long_tokens(void)
{
    /* More tokens than the internal chunk: chunking must not change the result. */
    static uint32_t t[1000];
    uint8_t salt[32] = {0}, fp[32] = {0};
    lkv_dockey a, b;
    su_tokens(t, 1000, 7, 1u << 30);
    lkv_dockey_compute(salt, fp, t, 1000, &a);
    lkv_dockey_compute(salt, fp, t, 1000, &b);
    ASSERT_TRUE(memcmp(&a, &b, sizeof a) == 0);
    t[999]++;
    lkv_dockey_compute(salt, fp, t, 1000, &b);
    ASSERT_TRUE(memcmp(&a, &b, sizeof a) != 0);
}

static void test_hex(void)
{
    lkv_dockey k, k2;
    char hex[65];
    for (int i = 0; i < 32; i++) {
        k.b[i] = (uint8_t)(i * 37 + 5);
    }
    lkv_dockey_to_hex(&k, hex);
    ASSERT_EQ(strlen(hex), 64);
    ASSERT_OK(lkv_dockey_from_hex(hex, &k2));
    ASSERT_TRUE(memcmp(&k, &k2, sizeof k) == 0);
    hex[3] = 'A';
    hex[4] = 'f';
    ASSERT_OK(lkv_dockey_from_hex(hex, &k2));
    hex[10] = 'g';
    ASSERT_ERR(lkv_dockey_from_hex(hex, &k2), LKV_EINVAL);
    ASSERT_ERR(lkv_dockey_from_hex("abcd", &k2), LKV_EINVAL);
    lkv_dockey_to_hex(&k, hex);
    char longer[70];
    snprintf(longer, sizeof longer, "%s00", hex);
    ASSERT_ERR(lkv_dockey_from_hex(longer, &k2), LKV_EINVAL);
    ASSERT_ERR(lkv_dockey_from_hex(NULL, &k2), LKV_EINVAL);
}

static void test_salt(void)
{
    uint8_t a[32], b[32], c[32];
    lkv_tenant_salt_derive("acme", a);
    lkv_tenant_salt_derive("acme", b);
    lkv_tenant_salt_derive("acme2", c);
    ASSERT_TRUE(memcmp(a, b, 32) == 0);
    ASSERT_TRUE(memcmp(a, c, 32) != 0);
}

int main(void)
{
    LKV_RUN(test_key);
    LKV_RUN(test_long_tokens);
    LKV_RUN(test_hex);
    LKV_RUN(test_salt);
    return 0;
}
