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

#include <stdint.h>

#include "lkv_layout.h"

#define LKV_PROFILE_NAME_MAX 64
#define LKV_FINGERPRINT_BYTES 32

typedef struct lkv_profile {
    char name[LKV_PROFILE_NAME_MAX]; /* NUL-terminated, [A-Za-z0-9._-]+. */
    lkv_kv_shape shape;              /* Layers, heads, head dim, dtype, block tokens. */
    lkv_posenc_cfg posenc;           /* RoPE / ALiBi configuration. */
    uint32_t vocab_size;             /* Token ids must be < vocab_size. */
    uint32_t max_doc_tokens;         /* Longest document accepted (<= 4096 blocks). */
    uint8_t fingerprint[LKV_FINGERPRINT_BYTES]; /* Set by lkv_profile_finish. */
} lkv_profile;

/* Validates *p and computes p->fingerprint. On error returns LKV_EINVAL and, if err is not
 * NULL, writes a message naming the bad field into err (errlen bytes, NUL-terminated). */
int lkv_profile_finish(lkv_profile *p, char *err, int errlen);

#endif
