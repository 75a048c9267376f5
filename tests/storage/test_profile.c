/*
 * test_profile.c: profile validation (every field, the error names it) and fingerprint
 * stability. The golden fingerprints were computed independently (Python hashlib.blake2b over
 * the encoding documented in storage/lkv_profile.c): a silent change of the encoding fails here.
 */
#include <string.h>

#include "lkv_profile.h"
#include "storage_util.h"

#define TINY_FP    "a200c8957d79754230033399f916536cee43687a8b5ceee0e19e9705f2968cbd"
#define LLAMA31_FP "8f31becdfef54d67b6c66cc7fd70ac68764e2e29e4f2aba56fd784d046c43676"

static lkv_profile llama31(void)
{
    lkv_profile p;
    memset(&p, 0, sizeof p);
    strcpy(p.name, "llama-3.1-8b");
    p.shape = (lkv_kv_shape){32, 32, 8, 128, LKV_DTYPE_BF16, 16};
    p.posenc.kind = LKV_POSENC_ROPE;
    p.posenc.rope_theta = 500000.0;
    p.posenc.rope_pairing = LKV_ROPE_HALF;
    p.posenc.rope_scaling = LKV_ROPE_SCALING_LLAMA3;
    p.posenc.scaling_factor = 8;
    p.posenc.low_freq_factor = 1;
    p.posenc.high_freq_factor = 4;
    p.posenc.original_max_pos = 8192;
    p.vocab_size = 128256;
    return p;
}

static void test_golden(void)
{
    char hex[65];
    lkv_profile p = tiny_profile("tiny");
    ASSERT_OK(lkv_profile_finish(&p, NULL, 0));
    lkv_profile_fp_hex(&p, hex);
    if (strcmp(hex, TINY_FP) != 0) {
        LKV_FAIL("tiny fingerprint %s, golden %s", hex, TINY_FP);
    }
    lkv_profile q = llama31();
    ASSERT_OK(lkv_profile_finish(&q, NULL, 0));
    lkv_profile_fp_hex(&q, hex);
    if (strcmp(hex, LLAMA31_FP) != 0) {
        LKV_FAIL("llama fingerprint %s, golden %s", hex, LLAMA31_FP);
    }
    ASSERT_EQ(q.max_doc_tokens, 4096 * 16); /* 0 means the maximum. */
}

static void test_fp_invariants(void)
{
    lkv_profile a = tiny_profile("a"), b = tiny_profile("renamed");
    ASSERT_OK(lkv_profile_finish(&a, NULL, 0));
    /* The name, max_doc_tokens and fields that do not apply are not part of the fingerprint. */
    b.max_doc_tokens = 100;
    b.posenc.scaling_factor = 3; /* scaling none: ignored */
    b.posenc.rotary_dim = 8;     /* == head_dim, same as 0 */
    ASSERT_OK(lkv_profile_finish(&b, NULL, 0));
    ASSERT_TRUE(memcmp(a.fingerprint, b.fingerprint, 32) == 0);
    lkv_profile c = tiny_profile("c");
    c.posenc.kind = LKV_POSENC_ALIBI;
    c.posenc.rope_theta = 0; /* irrelevant for ALiBi */
    ASSERT_OK(lkv_profile_finish(&c, NULL, 0));
    lkv_profile d = tiny_profile("d");
    d.posenc.kind = LKV_POSENC_ALIBI;
    d.posenc.rope_theta = 77;
    ASSERT_OK(lkv_profile_finish(&d, NULL, 0));
    ASSERT_TRUE(memcmp(c.fingerprint, d.fingerprint, 32) == 0);
    ASSERT_TRUE(memcmp(a.fingerprint, c.fingerprint, 32) != 0);

    /* Every KV-changing field changes the fingerprint. */
    for (int f = 0; f < 10; f++) {
        lkv_profile x = tiny_profile("x");
        switch (f) {
        case 0:
            x.shape.n_layers = 3;
            break;
        case 1:
            x.shape.n_q_heads = 8;
            break;
        case 2:
            x.shape.n_kv_heads = 1;
            break;
        case 3:
            x.shape.head_dim = 16;
            break;
        case 4:
            x.shape.dtype = LKV_DTYPE_BF16;
            break;
        case 5:
            x.shape.block_tokens = 8;
            break;
        case 6:
            x.vocab_size = 513;
            break;
        case 7:
            x.posenc.rope_theta = 10001;
            break;
        case 8:
            x.posenc.rope_pairing = LKV_ROPE_HALF;
            break;
        case 9:
            x.posenc.rotary_dim = 4;
            break;
        }
        ASSERT_OK(lkv_profile_finish(&x, NULL, 0));
        if (memcmp(a.fingerprint, x.fingerprint, 32) == 0) {
            LKV_FAIL("field %d does not change the fingerprint", f);
        }
    }
}

/* Applies mutation m to a tiny profile; expects LKV_EINVAL with field in the message. */
static void expect_bad(void (*m)(lkv_profile *), const char *field)
{
    char err[200] = "";
    lkv_profile p = tiny_profile("tiny");
    m(&p);
    ASSERT_ERR(lkv_profile_finish(&p, err, sizeof err), LKV_EINVAL);
    if (strstr(err, field) == NULL) {
        LKV_FAIL("error '%s' does not name '%s'", err, field);
    }
}

static void m_name_empty(lkv_profile *p)
{
    p->name[0] = 0;
}
static void m_name_bad(lkv_profile *p)
{
    strcpy(p->name, "a b");
}
static void m_layers0(lkv_profile *p)
{
    p->shape.n_layers = 0;
}
static void m_heads0(lkv_profile *p)
{
    p->shape.n_q_heads = 0;
}
static void m_kv_nodiv(lkv_profile *p)
{
    p->shape.n_kv_heads = 3;
}
static void m_kv0(lkv_profile *p)
{
    p->shape.n_kv_heads = 0;
}
static void m_hd_small(lkv_profile *p)
{
    p->shape.head_dim = 4;
}
static void m_hd_odd(lkv_profile *p)
{
    p->shape.head_dim = 12;
}
static void m_hd_big(lkv_profile *p)
{
    p->shape.head_dim = 264;
}
static void m_dtype(lkv_profile *p)
{
    p->shape.dtype = 7;
}
static void m_bt0(lkv_profile *p)
{
    p->shape.block_tokens = 0;
}
static void m_bt65(lkv_profile *p)
{
    p->shape.block_tokens = 65;
}
static void m_kind(lkv_profile *p)
{
    p->posenc.kind = 9;
}
static void m_theta(lkv_profile *p)
{
    p->posenc.rope_theta = 0;
}
static void m_theta_nan(lkv_profile *p)
{
    p->posenc.rope_theta = NAN;
}
static void m_pairing(lkv_profile *p)
{
    p->posenc.rope_pairing = 2;
}
static void m_rotary(lkv_profile *p)
{
    p->posenc.rotary_dim = 3;
}
static void m_rotary_big(lkv_profile *p)
{
    p->posenc.rotary_dim = 10;
}
static void m_scaling(lkv_profile *p)
{
    p->posenc.rope_scaling = 5;
}
static void m_linear(lkv_profile *p)
{
    p->posenc.rope_scaling = LKV_ROPE_SCALING_LINEAR;
    p->posenc.scaling_factor = -1;
}
static void m_llama3(lkv_profile *p)
{
    p->posenc.rope_scaling = LKV_ROPE_SCALING_LLAMA3;
    p->posenc.scaling_factor = 8;
    p->posenc.low_freq_factor = 4;
    p->posenc.high_freq_factor = 1;
    p->posenc.original_max_pos = 8192;
}
static void m_llama3_pos(lkv_profile *p)
{
    m_llama3(p);
    p->posenc.low_freq_factor = 1;
    p->posenc.high_freq_factor = 4;
    p->posenc.original_max_pos = 0;
}
static void m_vocab(lkv_profile *p)
{
    p->vocab_size = 0;
}
static void m_maxdoc(lkv_profile *p)
{
    p->max_doc_tokens = 4096 * 4 + 1;
}

/* The weights identity: undeclared keeps the old fingerprint (golden above); declared, it is
 * hashed (golden computed with Python hashlib.blake2b over the 85-byte encoding, then the
 * little-endian uint32 length and the bytes), so a fine-tune never shares KV with its base. */
#define LLAMA31_INSTRUCT_FP "bbf0546899b212c72aff17bde7ef3f917418ef015bb3ec3a58092384492ff269"

static void test_model_id(void)
{
    char hex[65], err[256];
    lkv_profile base = llama31(), ft = llama31(), ft2 = llama31();
    ASSERT_OK(lkv_profile_finish(&base, NULL, 0));
    snprintf(ft.model_id, sizeof ft.model_id, "meta-llama/Llama-3.1-8B-Instruct@0e9e39f");
    ASSERT_OK(lkv_profile_finish(&ft, NULL, 0));
    lkv_profile_fp_hex(&ft, hex);
    if (strcmp(hex, LLAMA31_INSTRUCT_FP) != 0) {
        LKV_FAIL("model_id fingerprint %s, golden %s", hex, LLAMA31_INSTRUCT_FP);
    }
    ASSERT_TRUE(memcmp(base.fingerprint, ft.fingerprint, 32) != 0);
    snprintf(ft2.model_id, sizeof ft2.model_id, "meta-llama/Llama-3.1-8B-Instruct@0e9e39g");
    ASSERT_OK(lkv_profile_finish(&ft2, NULL, 0));
    ASSERT_TRUE(memcmp(ft2.fingerprint, ft.fingerprint, 32) != 0);
    /* The checkpoint-hash form is checked. */
    lkv_profile h = llama31();
    snprintf(h.model_id, sizeof h.model_id, "blake2b:%064d", 7);
    ASSERT_OK(lkv_profile_finish(&h, NULL, 0));
    snprintf(h.model_id, sizeof h.model_id, "blake2b:%063d", 7);
    ASSERT_ERR(lkv_profile_finish(&h, err, sizeof err), LKV_EINVAL);
    ASSERT_TRUE(strstr(err, "model_id") != NULL && strstr(err, "64") != NULL);
    snprintf(h.model_id, sizeof h.model_id, "blake2b:%064dAB", 7);
    ASSERT_ERR(lkv_profile_finish(&h, err, sizeof err), LKV_EINVAL);
    snprintf(h.model_id, sizeof h.model_id, "has space");
    ASSERT_ERR(lkv_profile_finish(&h, err, sizeof err), LKV_EINVAL);
    ASSERT_TRUE(strstr(err, "model_id") != NULL && strstr(err, "' '") != NULL);
    memset(h.model_id, 'a', sizeof h.model_id); /* no NUL inside the field */
    ASSERT_ERR(lkv_profile_finish(&h, err, sizeof err), LKV_EINVAL);
    ASSERT_TRUE(strstr(err, "longer") != NULL);
}

static void test_validation(void)
{
    expect_bad(m_name_empty, "name");
    expect_bad(m_name_bad, "name");
    expect_bad(m_layers0, "n_layers");
    expect_bad(m_heads0, "n_q_heads");
    expect_bad(m_kv_nodiv, "n_kv_heads");
    expect_bad(m_kv0, "n_kv_heads");
    expect_bad(m_hd_small, "head_dim");
    expect_bad(m_hd_odd, "head_dim");
    expect_bad(m_hd_big, "head_dim");
    expect_bad(m_dtype, "dtype");
    expect_bad(m_bt0, "block_tokens");
    expect_bad(m_bt65, "block_tokens");
    expect_bad(m_kind, "posenc.kind");
    expect_bad(m_theta, "rope_theta");
    expect_bad(m_theta_nan, "rope_theta");
    expect_bad(m_pairing, "rope_pairing");
    expect_bad(m_rotary, "rotary_dim");
    expect_bad(m_rotary_big, "rotary_dim");
    expect_bad(m_scaling, "rope_scaling");
    expect_bad(m_linear, "scaling_factor");
    expect_bad(m_llama3, "high_freq_factor");
    expect_bad(m_llama3_pos, "original_max_pos");
    expect_bad(m_vocab, "vocab_size");
    expect_bad(m_maxdoc, "max_doc_tokens");
    ASSERT_ERR(lkv_profile_finish(NULL, NULL, 0), LKV_EINVAL);
    /* Boundaries that are fine. */
    lkv_profile p = tiny_profile("edge.name_OK-1");
    p.shape.block_tokens = 64;
    p.shape.head_dim = 256;
    p.max_doc_tokens = 4096 * 64;
    ASSERT_OK(lkv_profile_finish(&p, NULL, 0));
}

static void test_find(void)
{
    lkv_profile ps[2] = {tiny_profile("a"), tiny_profile("b")};
    ps[1].shape.n_layers = 3;
    ASSERT_OK(lkv_profile_finish(&ps[0], NULL, 0));
    ASSERT_OK(lkv_profile_finish(&ps[1], NULL, 0));
    ASSERT_EQ(lkv_profile_find(ps, 2, "b"), 1);
    ASSERT_EQ(lkv_profile_find(ps, 2, "c"), -1);
    ASSERT_EQ(lkv_profile_find_fp(ps, 2, ps[1].fingerprint), 1);
    uint8_t z[32] = {0};
    ASSERT_EQ(lkv_profile_find_fp(ps, 2, z), -1);
}

int main(void)
{
    LKV_RUN(test_golden);
    LKV_RUN(test_fp_invariants);
    LKV_RUN(test_model_id);
    LKV_RUN(test_validation);
    LKV_RUN(test_find);
    return 0;
}
