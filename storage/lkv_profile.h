/*
 * lkv_profile.h: model profiles and their fingerprints (DESIGN.md section 3).
 *
 * A profile names one model's KV geometry and position encoding. Profiles are declared in the
 * daemon's config file; a Put for an unknown profile is refused. The fingerprint is BLAKE2b-256
 * (libsodium) over a canonical little-endian encoding of every field that changes the bytes of
 * the KV (shape, dtype, block tokens, position encoding, vocabulary size) and the weights
 * identity (model_id, when declared), not the name: KV from one model is never served to
 * another (a fine-tune with its own model_id never shares KV with its base), and renaming a
 * profile keeps its documents.
 *
 * model_id names the weights: "blake2b:<64 hex>" is the BLAKE2b-256 of the checkpoint file (the
 * decode worker hashes the file it loaded and refuses a mismatch); anything else is a revision
 * string the worker must be told (e.g. "llama-3.1-8b-instruct@rev3"). Empty means undeclared:
 * the fingerprint is then the one of a profile without the field (stored KV stays valid).
 */
#ifndef LKV_PROFILE_H
#define LKV_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#include "lkv_layout.h"

#define LKV_PROFILE_NAME_MAX  64
#define LKV_FINGERPRINT_BYTES 32
#define LKV_MODEL_ID_MAX      128 /* Bytes of model_id including the NUL. */
#define LKV_MODEL_ID_BLAKE2B  "blake2b:"

typedef struct lkv_profile {
    char name[LKV_PROFILE_NAME_MAX];            /* NUL-terminated, [A-Za-z0-9._-]+. */
    lkv_kv_shape shape;                         /* Layers, heads, head dim, dtype, block tokens. */
    lkv_posenc_cfg posenc;                      /* RoPE / ALiBi configuration. */
    uint32_t vocab_size;                        /* Token ids must be < vocab_size. */
    uint32_t max_doc_tokens;                    /* Longest document accepted (<= 4096 blocks). */
    char model_id[LKV_MODEL_ID_MAX];            /* Weights identity ("" = undeclared); see above. */
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

/* Checks a model_id string (see the file comment): 0..127 bytes of [A-Za-z0-9._:/+@-], and for
 * the "blake2b:" form exactly 64 lowercase hex digits after the prefix. Returns 0 or LKV_EINVAL
 * with a message in err (errlen bytes; err may be NULL). */
int lkv_profile_model_id_check(const char *model_id, char *err, int errlen);

/* Returns the index of the profile named name in profiles[0..n), or -1. All borrowed. */
int lkv_profile_find(const lkv_profile *profiles, int n, const char *name);

/* Returns the index of the profile whose fingerprint is fp (32 bytes) in profiles[0..n), or -1. */
int lkv_profile_find_fp(const lkv_profile *profiles, int n, const uint8_t *fp);

/* Writes the fingerprint as 64 lowercase hex characters plus a NUL into out (65 bytes). */
void lkv_profile_fp_hex(const lkv_profile *p, char out[2 * LKV_FINGERPRINT_BYTES + 1]);

#endif
