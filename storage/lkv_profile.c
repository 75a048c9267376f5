/*
 * lkv_profile.c: model profile validation and fingerprint.
 *
 * Canonical encoding hashed by BLAKE2b-256 (libsodium crypto_generichash, no key) into the
 * fingerprint. Every integer is a little-endian uint32, every real an IEEE-754 binary64 as a
 * little-endian uint64. Fields that do not apply are encoded as 0 so that stale values in an
 * unused field never change the fingerprint. The name and max_doc_tokens are not hashed: they
 * do not change the bytes of the KV.
 *
 *     offset  size  field
 *     0       1     LKV_PROFILE_FP_VERSION (1)
 *     1       4     n_layers
 *     5       4     n_q_heads
 *     9       4     n_kv_heads
 *     13      4     head_dim
 *     17      4     dtype
 *     21      4     block_tokens
 *     25      4     vocab_size
 *     29      4     posenc kind
 *     33      8     rope_theta            (RoPE only)
 *     41      4     rope_pairing          (RoPE only)
 *     45      4     rotary_dim, resolved  (RoPE only; 0 in the struct means head_dim)
 *     49      4     rope_scaling          (RoPE only)
 *     53      8     scaling_factor        (RoPE linear or llama3)
 *     61      8     low_freq_factor       (RoPE llama3)
 *     69      8     high_freq_factor      (RoPE llama3)
 *     77      8     original_max_pos      (RoPE llama3)
 *     85            end, when model_id is empty (the encoding of every profile before model_id)
 *     85      4     strlen(model_id)      (only when model_id is not empty)
 *     89      n     model_id bytes, no NUL
 */
#include "lkv_profile.h"

#include <inttypes.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "lkv_err.h"

#define MAX_LAYERS      1024
#define MAX_HEADS       4096
#define MAX_BLOCK_BYTES (1ull << 30)
#define ENC_BYTES       85

/* A refused profile: the reason into err (errlen bytes; this module's API counts them in an
 * int), LKV_EINVAL returned. */
#define fail(err, errlen, ...)                                                                     \
    lkv_errf((err), (errlen) > 0 ? (size_t)(errlen) : 0, LKV_EINVAL, __VA_ARGS__)

static int name_ok(const char *name)
{
    size_t n = strnlen(name, LKV_PROFILE_NAME_MAX);
    if (n == 0 || n == LKV_PROFILE_NAME_MAX) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        if (!ok) {
            return 0;
        }
    }
    return 1;
}

static int pos_finite(double x)
{
    return isfinite(x) && x > 0.0;
}

static int check_posenc(const lkv_profile *p, char *err, int errlen)
{
    const lkv_posenc_cfg *e = &p->posenc;
    switch (e->kind) {
    case LKV_POSENC_NONE:
    case LKV_POSENC_ALIBI:
        return 0;
    case LKV_POSENC_ROPE:
        break;
    default:
        return fail(err, errlen, "posenc.kind: %d is not none(0), rope(1) or alibi(2)", e->kind);
    }
    if (!pos_finite(e->rope_theta)) {
        return fail(err, errlen, "posenc.rope_theta: %g must be finite and > 0", e->rope_theta);
    }
    if (e->rope_pairing != LKV_ROPE_HALF && e->rope_pairing != LKV_ROPE_INTERLEAVED) {
        return fail(err, errlen, "posenc.rope_pairing: %d is not half(0) or interleaved(1)",
                    e->rope_pairing);
    }
    if (e->rotary_dim != 0 &&
        (e->rotary_dim < 2 || e->rotary_dim % 2 != 0 || e->rotary_dim > p->shape.head_dim)) {
        return fail(err, errlen, "posenc.rotary_dim: %d must be 0 (all) or even in 2..%d",
                    e->rotary_dim, p->shape.head_dim);
    }
    switch (e->rope_scaling) {
    case LKV_ROPE_SCALING_NONE:
        return 0;
    case LKV_ROPE_SCALING_LINEAR:
        if (!pos_finite(e->scaling_factor)) {
            return fail(err, errlen, "posenc.scaling_factor: %g must be finite and > 0",
                        e->scaling_factor);
        }
        return 0;
    case LKV_ROPE_SCALING_LLAMA3:
        if (!pos_finite(e->scaling_factor)) {
            return fail(err, errlen, "posenc.scaling_factor: %g must be finite and > 0",
                        e->scaling_factor);
        }
        if (!pos_finite(e->low_freq_factor)) {
            return fail(err, errlen, "posenc.low_freq_factor: %g must be finite and > 0",
                        e->low_freq_factor);
        }
        if (!pos_finite(e->high_freq_factor) || !(e->high_freq_factor > e->low_freq_factor)) {
            return fail(err, errlen,
                        "posenc.high_freq_factor: %g must be finite and > low_freq_factor (%g)",
                        e->high_freq_factor, e->low_freq_factor);
        }
        if (!pos_finite(e->original_max_pos)) {
            return fail(err, errlen, "posenc.original_max_pos: %g must be finite and > 0",
                        e->original_max_pos);
        }
        return 0;
    default:
        return fail(err, errlen, "posenc.rope_scaling: %d is not none(0), linear(1) or llama3(2)",
                    e->rope_scaling);
    }
}

static uint8_t *put_u32(uint8_t *o, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        o[i] = (uint8_t)(v >> (8 * i));
    }
    return o + 4;
}

static uint8_t *put_f64(uint8_t *o, double d)
{
    uint64_t v;
    memcpy(&v, &d, sizeof v);
    for (int i = 0; i < 8; i++) {
        o[i] = (uint8_t)(v >> (8 * i));
    }
    return o + 8;
}

static void fingerprint(lkv_profile *p)
{
    uint8_t buf[ENC_BYTES + 4 + LKV_MODEL_ID_MAX];
    uint8_t *o = buf;
    const lkv_kv_shape *s = &p->shape;
    const lkv_posenc_cfg *e = &p->posenc;
    int rope = e->kind == LKV_POSENC_ROPE;
    int sc = rope ? e->rope_scaling : LKV_ROPE_SCALING_NONE;
    int llama3 = sc == LKV_ROPE_SCALING_LLAMA3;

    *o++ = LKV_PROFILE_FP_VERSION;
    o = put_u32(o, (uint32_t)s->n_layers);
    o = put_u32(o, (uint32_t)s->n_q_heads);
    o = put_u32(o, (uint32_t)s->n_kv_heads);
    o = put_u32(o, (uint32_t)s->head_dim);
    o = put_u32(o, (uint32_t)s->dtype);
    o = put_u32(o, (uint32_t)s->block_tokens);
    o = put_u32(o, p->vocab_size);
    o = put_u32(o, (uint32_t)e->kind);
    o = put_f64(o, rope ? e->rope_theta : 0.0);
    o = put_u32(o, rope ? (uint32_t)e->rope_pairing : 0u);
    o = put_u32(o, rope ? (uint32_t)(e->rotary_dim ? e->rotary_dim : s->head_dim) : 0u);
    o = put_u32(o, (uint32_t)sc);
    o = put_f64(o, sc != LKV_ROPE_SCALING_NONE ? e->scaling_factor : 0.0);
    o = put_f64(o, llama3 ? e->low_freq_factor : 0.0);
    o = put_f64(o, llama3 ? e->high_freq_factor : 0.0);
    o = put_f64(o, llama3 ? e->original_max_pos : 0.0);
    size_t id_len = strnlen(p->model_id, LKV_MODEL_ID_MAX - 1);
    if (id_len > 0) {
        o = put_u32(o, (uint32_t)id_len);
        memcpy(o, p->model_id, id_len);
        o += id_len;
    }
    crypto_generichash(p->fingerprint, LKV_FINGERPRINT_BYTES, buf, (size_t)(o - buf), NULL, 0);
}

int lkv_profile_finish(lkv_profile *p, char *err, int errlen)
{
    const lkv_kv_shape *s;

    if (p == NULL) {
        return fail(err, errlen, "profile: NULL");
    }
    s = &p->shape;
    if (!name_ok(p->name)) {
        return fail(err, errlen, "name: must be 1..%d characters of [A-Za-z0-9._-]",
                    LKV_PROFILE_NAME_MAX - 1);
    }
    if (s->n_layers < 1 || s->n_layers > MAX_LAYERS) {
        return fail(err, errlen, "n_layers: %d must be in 1..%d", s->n_layers, MAX_LAYERS);
    }
    if (s->n_q_heads < 1 || s->n_q_heads > MAX_HEADS) {
        return fail(err, errlen, "n_q_heads: %d must be in 1..%d", s->n_q_heads, MAX_HEADS);
    }
    if (s->n_kv_heads < 1 || s->n_kv_heads > s->n_q_heads || s->n_q_heads % s->n_kv_heads != 0) {
        return fail(err, errlen, "n_kv_heads: %d must be >= 1 and divide n_q_heads (%d)",
                    s->n_kv_heads, s->n_q_heads);
    }
    if (s->head_dim < 8 || s->head_dim > LKV_MAX_HEAD_DIM || s->head_dim % 8 != 0) {
        return fail(err, errlen, "head_dim: %d must be a multiple of 8 in 8..%d", s->head_dim,
                    LKV_MAX_HEAD_DIM);
    }
    if (lkv_dtype_size(s->dtype) == 0) {
        return fail(err, errlen, "dtype: %d is not f32(0), f16(1) or bf16(2)", s->dtype);
    }
    if (s->block_tokens < 1 || s->block_tokens > LKV_MAX_BLOCK_TOKENS) {
        return fail(err, errlen, "block_tokens: %d must be in 1..%d", s->block_tokens,
                    LKV_MAX_BLOCK_TOKENS);
    }
    if (lkv_block_bytes(s) > MAX_BLOCK_BYTES) {
        return fail(err, errlen, "shape: a block would be %zu bytes (more than 1 GiB)",
                    lkv_block_bytes(s));
    }
    if (check_posenc(p, err, errlen) != 0) {
        return LKV_EINVAL;
    }
    if (p->vocab_size == 0) {
        return fail(err, errlen, "vocab_size: must be > 0");
    }
    uint32_t max_tokens = (uint32_t)(LKV_REF_MAX_BLOCK + 1) * (uint32_t)s->block_tokens;
    if (p->max_doc_tokens == 0) {
        p->max_doc_tokens = max_tokens;
    }
    if (p->max_doc_tokens > max_tokens) {
        return fail(err, errlen, "max_doc_tokens: %u must be <= %u (4096 blocks of %d tokens)",
                    p->max_doc_tokens, max_tokens, s->block_tokens);
    }
    char idmsg[160];
    if (lkv_profile_model_id_check(p->model_id, idmsg, (int)sizeof(idmsg)) != 0) {
        return fail(err, errlen, "model_id: %s", idmsg);
    }
    if (sodium_init() < 0) {
        return fail(err, errlen, "libsodium: sodium_init failed");
    }
    fingerprint(p);
    return 0;
}

int lkv_profile_check_tokens(const lkv_profile *p, const uint32_t *tokens, size_t n, char *err,
                             int errlen)
{
    if (n == 0 || tokens == NULL) {
        return fail(err, errlen, "token_ids is empty (a document has at least one token)");
    }
    if (n > p->max_doc_tokens) {
        return fail(err, errlen,
                    "%zu tokens, more than the %" PRIu32 " a document of profile '%s' may have", n,
                    p->max_doc_tokens, p->name);
    }
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] >= p->vocab_size) {
            return fail(err, errlen,
                        "token_ids[%zu] = %" PRIu32 " is not below vocab_size %" PRIu32
                        " of profile '%s'",
                        i, tokens[i], p->vocab_size, p->name);
        }
    }
    return 0;
}

int lkv_profile_model_id_check(const char *model_id, char *err, int errlen)
{
    size_t n = strnlen(model_id, LKV_MODEL_ID_MAX);
    if (n == LKV_MODEL_ID_MAX) {
        return fail(err, errlen, "longer than %d characters", LKV_MODEL_ID_MAX - 1);
    }
    for (size_t i = 0; i < n; i++) {
        char c = model_id[i];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 strchr("._:/+@-", c) != NULL;
        if (!ok) {
            return fail(err, errlen, "character %zu ('%c') is not one of [A-Za-z0-9._:/+@-]", i,
                        c >= 32 && c < 127 ? c : '?');
        }
    }
    size_t pre = strlen(LKV_MODEL_ID_BLAKE2B);
    if (strncmp(model_id, LKV_MODEL_ID_BLAKE2B, pre) == 0) {
        const char *h = model_id + pre;
        int hex_ok = strlen(h) == 2 * LKV_FINGERPRINT_BYTES;
        for (size_t i = 0; hex_ok && h[i] != '\0'; i++) {
            hex_ok = (h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'f');
        }
        if (!hex_ok) {
            return fail(err, errlen,
                        "'%s' must be blake2b: and 64 lowercase hex digits (the BLAKE2b-256 of "
                        "the checkpoint file)",
                        model_id);
        }
    }
    return 0;
}

int lkv_profile_find(const lkv_profile *profiles, int n, const char *name)
{
    for (int i = 0; i < n; i++) {
        if (strncmp(profiles[i].name, name, LKV_PROFILE_NAME_MAX) == 0) {
            return i;
        }
    }
    return -1;
}

int lkv_profile_find_fp(const lkv_profile *profiles, int n, const uint8_t *fp)
{
    for (int i = 0; i < n; i++) {
        if (memcmp(profiles[i].fingerprint, fp, LKV_FINGERPRINT_BYTES) == 0) {
            return i;
        }
    }
    return -1;
}

void lkv_profile_fp_hex(const lkv_profile *p, char out[2 * LKV_FINGERPRINT_BYTES + 1])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < LKV_FINGERPRINT_BYTES; i++) {
        out[2 * i] = hex[p->fingerprint[i] >> 4];
        out[2 * i + 1] = hex[p->fingerprint[i] & 15];
    }
    out[2 * LKV_FINGERPRINT_BYTES] = '\0';
}
