/*
 * lkv_dockey.h: document keys and tenant salts (DESIGN.md section 3).
 *
 * A document key is BLAKE2b-256 (libsodium crypto_generichash, no key) over the concatenation
 *
 *     offset  size       field
 *     0       32         tenant salt
 *     32      32         model profile fingerprint (lkv_profile.fingerprint)
 *     64      4 * n      token ids, each a little-endian uint32
 *
 * It is content addressed and position free: the same tokens of the same model under the same
 * tenant give the same key wherever they appear in a prompt. The salt keeps tenants from probing
 * each other's cache. The default tenant's salt is 32 zero bytes (lkv_tenant_salt_default);
 * named tenants derive theirs with lkv_tenant_salt_derive (or are given a random one).
 *
 * The content hash (lkv_dockey_content_hash) is a 64-bit hash over (salt, tokens) without the
 * fingerprint: the store uses it to tell "these tokens are cached for another model profile"
 * (a profile-mismatch miss) from "never stored".
 */
#ifndef LKV_DOCKEY_H
#define LKV_DOCKEY_H

#include <stdint.h>

#define LKV_SALT_BYTES     32
#define LKV_DOCKEY_BYTES   32
#define LKV_DOCKEY_HEX_LEN 64 /* Hex characters, without the terminating NUL. */

/* A document key: 32 raw bytes. Compare with memcmp. */
typedef struct lkv_dockey {
    uint8_t b[LKV_DOCKEY_BYTES]; /* BLAKE2b-256 digest. */
} lkv_dockey;

/* Writes the default tenant's salt (32 zero bytes) into out (32 bytes, caller-owned). */
void lkv_tenant_salt_default(uint8_t out[LKV_SALT_BYTES]);

/* Derives a tenant salt from a tenant name: BLAKE2b-256("lazykv tenant salt v1\0" || name).
 * name is borrowed (NUL-terminated); out is caller-owned (32 bytes). Deterministic: a tenant
 * keeps its documents across restarts. Deployments that want unguessable salts should keep a
 * secret in the name (or pass random salts directly). */
void lkv_tenant_salt_derive(const char *name, uint8_t out[LKV_SALT_BYTES]);

/* Computes the document key of tokens[0..n) under salt and fingerprint into *out. All pointers
 * are borrowed; tokens may be NULL when n == 0. Never fails. */
void lkv_dockey_compute(const uint8_t salt[LKV_SALT_BYTES], const uint8_t fingerprint[32],
                        const uint32_t *tokens, uint32_t n, lkv_dockey *out);

/* Returns a 64-bit hash over (salt, tokens) only (BLAKE2b-64, domain-separated from keys). */
uint64_t lkv_dockey_content_hash(const uint8_t salt[LKV_SALT_BYTES], const uint32_t *tokens,
                                 uint32_t n);

/* Writes the key as 64 lowercase hex characters plus a NUL into out (65 bytes, caller-owned). */
void lkv_dockey_to_hex(const lkv_dockey *k, char out[LKV_DOCKEY_HEX_LEN + 1]);

/* Parses exactly 64 hex characters (either case; the string must end there) into *out.
 * Returns 0, or LKV_EINVAL (and leaves *out unspecified) on anything else. */
int lkv_dockey_from_hex(const char *hex, lkv_dockey *out);

/* Returns the first 8 bytes of the key as a little-endian uint64 (a well-mixed hash). */
uint64_t lkv_dockey_hash64(const lkv_dockey *k);

#endif
