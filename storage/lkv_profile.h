/*
 * lkv_profile.h: model profiles and their fingerprints (DESIGN.md section 3).
 *
 * A profile names one model's KV geometry and position encoding. Profiles are declared in the
 * daemon's config file; a Put for an unknown profile is refused. The fingerprint is BLAKE2b-256
 * (libsodium) over a canonical little-endian encoding of every field that changes the bytes of
 * the KV (shape, dtype, block tokens, position encoding, vocabulary size), not the name: KV from
 * one model is never served to another, and renaming a profile keeps its documents.
 */
#ifndef LKV_PROFILE_H
#define LKV_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#include "lkv_layout.h"

#define LKV_PROFILE_NAME_MAX  64
#define LKV_FINGERPRINT_BYTES 32

typedef struct lkv_profile {
    char name[LKV_PROFILE_NAME_MAX];            /* NUL-terminated, [A-Za-z0-9._-]+. */
    lkv_kv_shape shape;                         /* Layers, heads, head dim, dtype, block tokens. */
    lkv_posenc_cfg posenc;                      /* RoPE / ALiBi configuration. */
    uint32_t vocab_size;                        /* Token ids must be < vocab_size. */
    uint32_t max_doc_tokens;                    /* Longest document accepted (<= 4096 blocks). */
    uint8_t fingerprint[LKV_FINGERPRINT_BYTES]; /* Set by lkv_profile_finish. */
} lkv_profile;

/* Validates *p and computes p->fingerprint. On error returns LKV_EINVAL and, if err is not
 * NULL, writes a message naming the bad field into err (errlen bytes, NUL-terminated).
 * max_doc_tokens == 0 is replaced by the maximum, 4096 * block_tokens. */
int lkv_profile_finish(lkv_profile *p, char *err, int errlen);

/* Version byte that starts the canonical encoding hashed into the fingerprint. Bump it (and the
 * golden fingerprint in tests/storage/test_profile.c) only on purpose: it orphans stored KV. */
#define LKV_PROFILE_FP_VERSION 1

/* Checks the token ids of a document of profile p (all borrowed): 1..p->max_doc_tokens ids, each
 * < p->vocab_size. Returns 0, or LKV_EINVAL and, if err is not NULL, a message naming the check
 * that failed and the values (e.g. "token_ids[7] = 4294967295 is not below vocab_size 1000 of
 * profile 'itest'") in err (errlen bytes, NUL-terminated). The one token check: the store's put
 * and the daemon's token references both use it. */
int lkv_profile_check_tokens(const lkv_profile *p, const uint32_t *tokens, size_t n, char *err,
                             int errlen);

/* Returns the index of the profile named name in profiles[0..n), or -1. All borrowed. */
int lkv_profile_find(const lkv_profile *profiles, int n, const char *name);

/* Returns the index of the profile whose fingerprint is fp (32 bytes) in profiles[0..n), or -1. */
int lkv_profile_find_fp(const lkv_profile *profiles, int n, const uint8_t *fp);

/* Writes the fingerprint as 64 lowercase hex characters plus a NUL into out (65 bytes). */
void lkv_profile_fp_hex(const lkv_profile *p, char out[2 * LKV_FINGERPRINT_BYTES + 1]);

#endif
