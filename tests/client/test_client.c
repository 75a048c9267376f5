/*
 * test_client.c: client.client. The parts of the client library that need no daemon:
 * key hex helpers, option checks, and calls to an address where nothing listens (LKV_EUNAVAIL /
 * LKV_ETIMEDOUT with a message, within the deadline), and the in-place GetResponse decoder
 * against protobuf-c on random, truncated and damaged encodings. The status table is tested in
 * tests/proto/test_status.c.
 */
#include <string.h>
#include <time.h>

#include <stdlib.h>

#include "lazykv/v1/cache.pb-c.h"
#include "lkv_client.h"
#include "lkv_test.h"

int lkv__get_response_scan(const uint8_t *p, size_t len, uint32_t *idx, const uint8_t **data,
                           size_t *lens, size_t cap, size_t *n, int *has_header);

int lkv__get_into_scan(const uint8_t *const *parts, const size_t *lens, size_t n, uint8_t *buf,
                       size_t bb, uint32_t n_blocks, uint32_t *next);

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Our decode of enc must match protobuf-c's wherever protobuf-c accepts it. */
static void check_same(const uint8_t *enc, size_t len, int must_parse)
{
    uint32_t idx[64];
    const uint8_t *data[64];
    size_t lens[64], n = 0;
    int hh = 0;
    int rc = lkv__get_response_scan(enc, len, idx, data, lens, 64, &n, &hh);
    Lazykv__V1__GetResponse *m = lazykv__v1__get_response__unpack(NULL, len, enc);
    if (must_parse) {
        ASSERT_TRUE(m != NULL);
    }
    if (m == NULL) {
        return; /* Malformed for protobuf-c: ours may refuse or not, but must not crash. */
    }
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(hh, m->header != NULL);
    ASSERT_EQ(n, m->n_blocks);
    for (size_t i = 0; i < n && i < 64; i++) {
        ASSERT_EQ(idx[i], m->blocks[i]->index);
        ASSERT_EQ(lens[i], m->blocks[i]->data.len);
        ASSERT_TRUE(lens[i] == 0 || memcmp(data[i], m->blocks[i]->data.data, lens[i]) == 0);
        ASSERT_TRUE(lens[i] == 0 || (data[i] >= enc && data[i] + lens[i] <= enc + len));
    }
    lazykv__v1__get_response__free_unpacked(m, NULL);
}

static void test_get_decode(void)
{
    for (int iter = 0; iter < 400; iter++) {
        Lazykv__V1__GetResponse r = LAZYKV__V1__GET_RESPONSE__INIT;
        Lazykv__V1__GetHeader h = LAZYKV__V1__GET_HEADER__INIT;
        Lazykv__V1__Block b[8], *bp[8];
        uint8_t payload[8][300];
        uint8_t key[32];
        memset(key, 7, sizeof key);
        if (rnd() % 2) {
            h.key.data = key;
            h.key.len = sizeof key;
            h.profile = "p";
            h.n_blocks = (uint32_t)(rnd() % 100);
            h.block_bytes = rnd() % 5000;
            r.header = &h;
        }
        r.n_blocks = rnd() % 9;
        for (size_t i = 0; i < r.n_blocks; i++) {
            Lazykv__V1__Block init = LAZYKV__V1__BLOCK__INIT;
            b[i] = init;
            b[i].index = (uint32_t)(rnd() % 3 == 0 ? 0 : rnd() % 100000);
            b[i].data.len = rnd() % 300;
            for (size_t j = 0; j < b[i].data.len; j++) {
                payload[i][j] = (uint8_t)rnd();
            }
            b[i].data.data = payload[i];
            bp[i] = &b[i];
        }
        r.blocks = bp;
        size_t len = lazykv__v1__get_response__get_packed_size(&r);
        uint8_t *enc = malloc(len + 1);
        lazykv__v1__get_response__pack(&r, enc);
        check_same(enc, len, 1);
        /* Truncated anywhere, and with damaged bytes: never a crash, never a different answer
         * from a message protobuf-c accepts. */
        for (int t = 0; t < 8; t++) {
            check_same(enc, len ? rnd() % len : 0, 0);
            uint8_t *bad = malloc(len + 1);
            memcpy(bad, enc, len);
            for (int f = 0; f < 3 && len > 0; f++) {
                bad[rnd() % len] ^= (uint8_t)(1u << (rnd() % 8));
            }
            check_same(bad, len, 0);
            free(bad);
        }
        free(enc);
    }
}

/* Splits enc[0..len) into 1..5 parts at random points (empty parts too) and decodes it as the
 * slices of one message with lkv_client_get_into's decoder. */
static int scan_split(const uint8_t *enc, size_t len, uint8_t *buf, size_t bb, uint32_t n_blocks,
                      uint32_t *next)
{
    const uint8_t *parts[5];
    size_t lens[5], cuts[6];
    size_t n = 1 + rnd() % 5;
    cuts[0] = 0;
    cuts[n] = len;
    for (size_t i = 1; i < n; i++) {
        cuts[i] = len ? rnd() % (len + 1) : 0;
    }
    for (size_t i = 1; i < n; i++) { /* Sort the inner cuts. */
        for (size_t j = i + 1; j < n; j++) {
            if (cuts[j] < cuts[i]) {
                size_t t = cuts[i];
                cuts[i] = cuts[j];
                cuts[j] = t;
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        parts[i] = enc + cuts[i];
        lens[i] = cuts[i + 1] - cuts[i];
    }
    return lkv__get_into_scan(parts, lens, n, buf, bb, n_blocks, next);
}

/* The decoder of lkv_client_get_into over messages split into slices anywhere: a valid stream
 * message lands byte for byte at its blocks' places and nowhere else; every fault is refused
 * (out of order, wrong size, more than announced, no data, a second header, truncation,
 * damage) without writing past the buffer (ASan) and without a crash. */
static void test_get_into_decode(void)
{
    enum { BB = 300, NB = 8 };
    static uint8_t payload[NB][BB];
    static uint8_t buf[NB * BB + 16];
    for (int iter = 0; iter < 600; iter++) {
        Lazykv__V1__GetResponse r = LAZYKV__V1__GET_RESPONSE__INIT;
        Lazykv__V1__Block b[NB], *bp[NB];
        uint32_t first = (uint32_t)(rnd() % 3);
        size_t k = 1 + rnd() % (NB - first);
        int fault = (int)(rnd() % 6); /* 0..2: valid; 3: order; 4: size; 5: too many. */
        uint32_t n_blocks = (uint32_t)(first + k);
        for (size_t i = 0; i < k; i++) {
            Lazykv__V1__Block init = LAZYKV__V1__BLOCK__INIT;
            b[i] = init;
            b[i].index = first + (uint32_t)i;
            for (size_t j = 0; j < BB; j++) {
                payload[i][j] = (uint8_t)rnd();
            }
            b[i].data.data = payload[i];
            b[i].data.len = BB;
            bp[i] = &b[i];
        }
        if (fault == 3) {
            b[k - 1].index += 1 + (uint32_t)(rnd() % 5);
        } else if (fault == 4) {
            b[rnd() % k].data.len = BB - 1 - rnd() % 10;
        } else if (fault == 5) {
            n_blocks = first + (uint32_t)k - 1;
        }
        r.n_blocks = k;
        r.blocks = bp;
        size_t len = lazykv__v1__get_response__get_packed_size(&r);
        uint8_t *enc = malloc(len);
        lazykv__v1__get_response__pack(&r, enc);
        memset(buf, 0xEE, sizeof buf);
        uint32_t next = first;
        int rc = scan_split(enc, len, buf, BB, n_blocks, &next);
        if (fault <= 2) {
            ASSERT_EQ(rc, 0);
            ASSERT_EQ(next, first + k);
            for (size_t i = 0; i < k; i++) {
                ASSERT_TRUE(memcmp(buf + (first + i) * BB, payload[i], BB) == 0);
            }
            for (size_t j = 0; j < first * BB; j++) {
                ASSERT_EQ(buf[j], 0xEE); /* Blocks before the first are left alone. */
            }
            for (size_t j = (first + k) * BB; j < sizeof buf; j++) {
                ASSERT_EQ(buf[j], 0xEE);
            }
            /* Each proper prefix: refused or short, never more blocks, never a crash. */
            for (int t = 0; t < 4 && len > 1; t++) {
                size_t cut = rnd() % len;
                uint32_t nx = first;
                int rc2 = scan_split(enc, cut, buf, BB, n_blocks, &nx);
                ASSERT_TRUE(rc2 != 0 || nx < first + k);
            }
            /* Damaged bytes: any answer, no crash, nothing past the announced blocks. */
            for (int t = 0; t < 4; t++) {
                uint8_t *bad = malloc(len);
                memcpy(bad, enc, len);
                for (int f = 0; f < 3; f++) {
                    bad[rnd() % len] ^= (uint8_t)(1u << (rnd() % 8));
                }
                uint32_t nx = first;
                (void)scan_split(bad, len, buf, BB, n_blocks, &nx);
                ASSERT_TRUE(nx <= n_blocks);
                for (size_t j = (size_t)n_blocks * BB; j < sizeof buf; j++) {
                    ASSERT_EQ(buf[j], 0xEE);
                }
                free(bad);
            }
        } else if (fault == 3) {
            ASSERT_EQ(rc, -6);
        } else if (fault == 4) {
            ASSERT_EQ(rc, -3);
        } else {
            ASSERT_EQ(rc, -4);
            ASSERT_EQ(next, n_blocks);
        }
        free(enc);
    }
    /* A second header, and a Block without data. */
    Lazykv__V1__GetResponse r = LAZYKV__V1__GET_RESPONSE__INIT;
    Lazykv__V1__GetHeader h = LAZYKV__V1__GET_HEADER__INIT;
    r.header = &h;
    uint8_t enc[256];
    size_t len = lazykv__v1__get_response__pack(&r, enc);
    uint32_t next = 0;
    ASSERT_EQ(scan_split(enc, len, buf, BB, NB, &next), -2);
    Lazykv__V1__GetResponse r2 = LAZYKV__V1__GET_RESPONSE__INIT;
    Lazykv__V1__Block nb = LAZYKV__V1__BLOCK__INIT, *nbp = &nb;
    r2.n_blocks = 1;
    r2.blocks = &nbp;
    len = lazykv__v1__get_response__pack(&r2, enc);
    next = 0;
    ASSERT_EQ(scan_split(enc, len, buf, BB, NB, &next), -5);
    next = 0;
    ASSERT_EQ(scan_split(enc, 0, buf, BB, NB, &next), 0); /* An empty message: no blocks. */
    ASSERT_EQ(next, 0);
}

static void test_hex(void)
{
    uint8_t k[LKV_KEY_BYTES], k2[LKV_KEY_BYTES];
    for (int i = 0; i < LKV_KEY_BYTES; i++) {
        k[i] = (uint8_t)(i * 37 + 1);
    }
    char hex[65];
    lkv_key_to_hex(k, hex);
    ASSERT_EQ(strlen(hex), 64);
    ASSERT_OK(lkv_key_from_hex(hex, k2));
    ASSERT_TRUE(memcmp(k, k2, sizeof(k)) == 0);
    hex[5] = 'g';
    ASSERT_ERR(lkv_key_from_hex(hex, k2), LKV_EINVAL);
    ASSERT_ERR(lkv_key_from_hex("abcd", k2), LKV_EINVAL);
}

static void test_options(void)
{
    lkv_client_t *c = NULL;
    ASSERT_ERR(lkv_client_create("", NULL, &c), LKV_EINVAL);
    ASSERT_TRUE(lkv_client_last_error()[0] != '\0');
    ASSERT_EQ(lkv_client_last_status(), -1);
    lkv_client_options o = {0};
    o.bearer_token = "a\nb";
    ASSERT_ERR(lkv_client_create("127.0.0.1:1", &o, &c), LKV_EINVAL);
    o.bearer_token = "secret";
    ASSERT_OK(lkv_client_create("127.0.0.1:1", &o, &c));
    ASSERT_ERR(lkv_client_lookup(c, NULL, 0, 0, NULL), LKV_EINVAL);
    lkv_client_destroy(c);
}

static void test_unreachable(void)
{
    lkv_client_options o = {0};
    o.default_deadline_ms = 3000;
    lkv_client_t *c = NULL;
    ASSERT_OK(lkv_client_create("127.0.0.1:1", &o, &c));
    time_t t0 = time(NULL);
    int rc = lkv_client_ping(c, "", 0);
    ASSERT_TRUE(rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT);
    ASSERT_TRUE(lkv_client_last_status() == 14 || lkv_client_last_status() == 4);
    ASSERT_TRUE(lkv_client_last_error()[0] != '\0');
    lkv_put_t *p = NULL;
    uint32_t tok[3] = {1, 2, 3};
    uint8_t blk[64] = {0};
    ASSERT_OK(lkv_client_put_begin(c, "x", tok, 3, 1, 0, &p));
    int r1 = lkv_put_block(p, 0, blk, sizeof(blk));
    int r2 = lkv_put_finish(p, NULL);
    ASSERT_TRUE(r1 == 0 || r1 == LKV_EUNAVAIL || r1 == LKV_ETIMEDOUT);
    ASSERT_TRUE(r2 == LKV_EUNAVAIL || r2 == LKV_ETIMEDOUT);
    ASSERT_TRUE(time(NULL) - t0 < 20);
    lkv_client_destroy(c);
}

/* Admin and lease calls: bad arguments are refused locally (status -1, nothing sent); an
 * unreachable daemon is LKV_EUNAVAIL / LKV_ETIMEDOUT, and out-parameters are left empty. */
static void test_admin_lease_args(void)
{
    lkv_client_options o = {0};
    o.default_deadline_ms = 3000;
    lkv_client_t *c = NULL;
    ASSERT_OK(lkv_client_create("127.0.0.1:1", &o, &c));
    lkv_lease l;
    ASSERT_ERR(lkv_client_attach(c, NULL, 0, NULL, 1000, 0, &l), LKV_EINVAL);
    ASSERT_EQ(lkv_client_last_status(), -1);
    ASSERT_TRUE(l.docs == NULL && l.n_docs == 0);
    lkv_docref bad = {NULL, NULL, NULL, 0}; /* Neither a key nor a profile. */
    ASSERT_ERR(lkv_client_attach(c, &bad, 1, NULL, 1000, 0, &l), LKV_EINVAL);
    ASSERT_ERR(lkv_client_evict(c, NULL, 0), LKV_EINVAL);
    ASSERT_ERR(lkv_client_release(c, NULL, 0, NULL), LKV_EINVAL);
    lkv_lease_free(NULL);
    lkv_lease_free(&l);

    uint8_t key[LKV_KEY_BYTES] = {1}, id[LKV_LEASE_ID_BYTES] = {2}, next[LKV_KEY_BYTES];
    lkv_doc_status *docs = (lkv_doc_status *)&key; /* Must be reset to NULL. */
    size_t n = 7;
    int more = 1;
    lkv_list_filter f = {"itest", LKV_WIRE_TIER_HOT, 5, key};
    int rc = lkv_client_list(c, &f, 0, &docs, &n, next, &more);
    ASSERT_TRUE(rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT);
    ASSERT_TRUE(docs == NULL && n == 0 && more == 0);
    rc = lkv_client_evict(c, key, 0);
    ASSERT_TRUE(rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT);
    lkv_docref ref = {key, NULL, NULL, 0};
    rc = lkv_client_attach(c, &ref, 1, id, 1000, 0, &l);
    ASSERT_TRUE(rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT);
    ASSERT_TRUE(l.docs == NULL);
    rc = lkv_client_release(c, id, 0, NULL);
    ASSERT_TRUE(rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT);
    lkv_client_destroy(c);
}

int main(void)
{
    LKV_RUN(test_hex);
    LKV_RUN(test_get_decode);
    LKV_RUN(test_get_into_decode);
    LKV_RUN(test_options);
    LKV_RUN(test_unreachable);
    LKV_RUN(test_admin_lease_args);
    return 0;
}
