/*
 * lkv_dockey.c: document keys, content hashes and tenant salts (format in lkv_dockey.h).
 *
 * Token ids are hashed as little-endian uint32 in chunks through a small stack buffer, so the
 * result does not depend on the host byte order and nothing is allocated.
 */
#include "lkv_dockey.h"

#include <sodium.h>
#include <string.h>

#include "lkv_err.h"

#define CHUNK 256

static const char salt_domain[] = "lazykv tenant salt v1";
static const char content_domain[] = "lazykv content v1";

static void hash_tokens(crypto_generichash_state *st, const uint32_t *tokens, uint32_t n)
{
    uint8_t buf[CHUNK * 4];
    uint32_t i = 0;
    while (i < n) {
        uint32_t m = n - i < CHUNK ? n - i : CHUNK;
        for (uint32_t j = 0; j < m; j++) {
            uint32_t t = tokens[i + j];
            buf[4 * j] = (uint8_t)t;
            buf[4 * j + 1] = (uint8_t)(t >> 8);
            buf[4 * j + 2] = (uint8_t)(t >> 16);
            buf[4 * j + 3] = (uint8_t)(t >> 24);
        }
        crypto_generichash_update(st, buf, (unsigned long long)m * 4);
        i += m;
    }
}

void lkv_tenant_salt_default(uint8_t out[LKV_SALT_BYTES])
{
    memset(out, 0, LKV_SALT_BYTES);
}

void lkv_tenant_salt_derive(const char *name, uint8_t out[LKV_SALT_BYTES])
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, LKV_SALT_BYTES);
    crypto_generichash_update(&st, (const uint8_t *)salt_domain, sizeof salt_domain);
    crypto_generichash_update(&st, (const uint8_t *)name, strlen(name));
    crypto_generichash_final(&st, out, LKV_SALT_BYTES);
}

void lkv_dockey_compute(const uint8_t salt[LKV_SALT_BYTES], const uint8_t fingerprint[32],
                        const uint32_t *tokens, uint32_t n, lkv_dockey *out)
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, LKV_DOCKEY_BYTES);
    crypto_generichash_update(&st, salt, LKV_SALT_BYTES);
    crypto_generichash_update(&st, fingerprint, 32);
    hash_tokens(&st, tokens, n);
    crypto_generichash_final(&st, out->b, LKV_DOCKEY_BYTES);
}

uint64_t lkv_dockey_content_hash(const uint8_t salt[LKV_SALT_BYTES], const uint32_t *tokens,
                                 uint32_t n)
{
    crypto_generichash_state st;
    uint8_t h[8];
    uint64_t v = 0;
    crypto_generichash_init(&st, NULL, 0, sizeof h);
    crypto_generichash_update(&st, (const uint8_t *)content_domain, sizeof content_domain);
    crypto_generichash_update(&st, salt, LKV_SALT_BYTES);
    hash_tokens(&st, tokens, n);
    crypto_generichash_final(&st, h, sizeof h);
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | h[i];
    }
    return v;
}

void lkv_dockey_to_hex(const lkv_dockey *k, char out[LKV_DOCKEY_HEX_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < LKV_DOCKEY_BYTES; i++) {
        out[2 * i] = hex[k->b[i] >> 4];
        out[2 * i + 1] = hex[k->b[i] & 15];
    }
    out[LKV_DOCKEY_HEX_LEN] = '\0';
}

static int nibble(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

int lkv_dockey_from_hex(const char *hex, lkv_dockey *out)
{
    if (hex == NULL || out == NULL) {
        return LKV_EINVAL;
    }
    for (int i = 0; i < LKV_DOCKEY_BYTES; i++) {
        int hi, lo;
        if (hex[2 * i] == '\0' || hex[2 * i + 1] == '\0') {
            return LKV_EINVAL;
        }
        hi = nibble(hex[2 * i]);
        lo = nibble(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return LKV_EINVAL;
        }
        out->b[i] = (uint8_t)(hi << 4 | lo);
    }
    return hex[LKV_DOCKEY_HEX_LEN] == '\0' ? 0 : LKV_EINVAL;
}

uint64_t lkv_dockey_hash64(const lkv_dockey *k)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | k->b[i];
    }
    return v;
}
