/*
 * test_putwire.c: proto/lkv_putwire, the zero-copy PutRequest decoder, against the decode path
 * it replaces (lkv_pb_unpack_bytes: wire scanner + protobuf-c) on the same bytes:
 *   - real messages packed by protobuf-c (header with options, several blocks, and unknown
 *     fields spliced in), cut into random pieces (empty, 1-byte, and block-straddling ones):
 *     the same header, the same block indices, and payload ranges that map onto exactly the
 *     bytes protobuf-c decoded, in place (pointers into the pieces);
 *   - hand-built hostile forms (header twice, index or data twice, wrong wire types, a 6-byte
 *     tag, groups, a length past the end, an 11-byte varint): refused, as the scanner does;
 *   - 20,000 random mutations (byte flips, truncations, insertions) of a valid message, each
 *     in random pieces: accepted exactly when lkv_pb_unpack_bytes accepts, with equal contents.
 */
#include <stdlib.h>
#include <string.h>

#include "lazykv/v1/cache.pb-c.h"
#include "lkv_pb.h"
#include "lkv_putwire.h"
#include "lkv_test.h"
#include "lkv_wire.h"

static char err[512];
static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Cuts buf[0..n) into random pieces (some empty) in *seg (malloc'd); returns the count. */
static size_t cut(const uint8_t *buf, size_t n, struct iovec **seg)
{
    size_t cap = 64, k = 0, off = 0;
    *seg = malloc(cap * sizeof **seg);
    while (off < n || k == 0) {
        if (k + 1 >= cap) {
            cap *= 2;
            *seg = realloc(*seg, cap * sizeof **seg);
        }
        size_t left = n - off, len;
        switch (next() % 5) {
        case 0:
            len = 0;
            break;
        case 1:
            len = 1;
            break;
        case 2:
            len = left;
            break;
        default:
            len = next() % (left / 2 + 2);
        }
        len = len > left ? left : len;
        (*seg)[k].iov_base = (void *)(buf + off);
        (*seg)[k].iov_len = len;
        k++;
        off += len;
        if (off >= n && k > 0) {
            break;
        }
    }
    return k;
}

/* Decodes buf both ways and checks they agree; returns 1 if accepted. */
static int agree(const uint8_t *buf, size_t n)
{
    ProtobufCMessage *m = NULL;
    int rc_pb =
        lkv_pb_unpack_bytes(&lazykv__v1__put_request__descriptor, buf, n, &m, err, sizeof err);
    struct iovec *seg;
    size_t ns = cut(buf, n, &seg);
    lkv_putwire w;
    int rc = lkv_putwire_decode(seg, ns, &w, err, sizeof err);
    if ((rc == 0) != (rc_pb == 0)) {
        LKV_FAIL("putwire %s, lkv_pb_unpack_bytes %s on %zu bytes in %zu pieces (%s)",
                 lkv_err_name(rc), lkv_err_name(rc_pb), n, ns, err);
    }
    if (rc != 0) {
        ASSERT_TRUE(w.blocks == NULL && w.header == NULL && w.n_blocks == 0);
        free(seg);
        return 0;
    }
    const Lazykv__V1__PutRequest *req = (const Lazykv__V1__PutRequest *)m;
    ASSERT_EQ(w.header != NULL, req->header != NULL);
    if (req->header != NULL) {
        /* Same header: the two pack to the same bytes. */
        size_t a = protobuf_c_message_get_packed_size(&req->header->base);
        size_t b = protobuf_c_message_get_packed_size(&w.header->base);
        ASSERT_EQ(a, b);
        uint8_t *pa = malloc(a + 1), *pb = malloc(b + 1);
        protobuf_c_message_pack(&req->header->base, pa);
        protobuf_c_message_pack(&w.header->base, pb);
        ASSERT_TRUE(memcmp(pa, pb, a) == 0);
        free(pa);
        free(pb);
    }
    ASSERT_EQ(w.n_blocks, req->n_blocks);
    for (size_t i = 0; i < w.n_blocks; i++) {
        ASSERT_EQ(w.blocks[i].index, req->blocks[i]->index);
        ASSERT_EQ(w.blocks[i].len, req->blocks[i]->data.len);
        ASSERT_TRUE(w.blocks[i].off + w.blocks[i].len <= n);
        struct iovec parts[64];
        size_t np = lkv_putwire_iov(seg, ns, w.blocks[i].off, w.blocks[i].len, parts, 64);
        struct iovec *pp = parts;
        if (np > 64) {
            pp = malloc(np * sizeof *pp);
            ASSERT_EQ(lkv_putwire_iov(seg, ns, w.blocks[i].off, w.blocks[i].len, pp, np), np);
        }
        size_t off = 0;
        for (size_t j = 0; j < np; j++) {
            /* In place: every part points into the input, not into a copy. */
            ASSERT_TRUE((const uint8_t *)pp[j].iov_base >= buf &&
                        (const uint8_t *)pp[j].iov_base + pp[j].iov_len <= buf + n);
            ASSERT_TRUE(memcmp(pp[j].iov_base, req->blocks[i]->data.data + off, pp[j].iov_len) ==
                        0);
            off += pp[j].iov_len;
        }
        ASSERT_EQ(off, w.blocks[i].len);
        if (pp != parts) {
            free(pp);
        }
    }
    lkv_putwire_free(&w);
    lkv_pb_free(m);
    free(seg);
    return 1;
}

/* A real PutRequest: header (when with_header) and n_blocks blocks of bb bytes. */
static uint8_t *packed_put(int with_header, size_t n_blocks, size_t bb, size_t *len)
{
    static uint32_t toks[37];
    Lazykv__V1__PutHeader h = LAZYKV__V1__PUT_HEADER__INIT;
    Lazykv__V1__PutRequest r = LAZYKV__V1__PUT_REQUEST__INIT;
    for (int i = 0; i < 37; i++) {
        toks[i] = (uint32_t)(next() % 200000);
    }
    h.profile = "llama-3.1-8b";
    h.n_token_ids = 37;
    h.token_ids = toks;
    h.n_blocks = (uint32_t)n_blocks;
    if (with_header) {
        r.header = &h;
    }
    Lazykv__V1__Block *bs = calloc(n_blocks + 1, sizeof *bs);
    Lazykv__V1__Block **bp = calloc(n_blocks + 1, sizeof *bp);
    uint8_t *data = malloc(n_blocks * bb + 1);
    for (size_t i = 0; i < n_blocks * bb; i++) {
        data[i] = (uint8_t)next();
    }
    for (size_t i = 0; i < n_blocks; i++) {
        Lazykv__V1__Block init = LAZYKV__V1__BLOCK__INIT;
        bs[i] = init;
        bs[i].index = (uint32_t)(i + 3);
        bs[i].data.data = data + i * bb;
        bs[i].data.len = bb;
        bp[i] = &bs[i];
    }
    r.n_blocks = n_blocks;
    r.blocks = bp;
    *len = protobuf_c_message_get_packed_size(&r.base);
    uint8_t *out = malloc(*len + 1);
    ASSERT_EQ(protobuf_c_message_pack(&r.base, out), *len);
    free(bs);
    free(bp);
    free(data);
    return out;
}

static void test_real_messages(void)
{
    static const size_t sizes[][3] = {{1, 0, 0},     {1, 1, 1024}, {1, 3, 20480},
                                      {0, 2, 65536}, {0, 0, 0},    {1, 4, 2u << 20}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n;
        uint8_t *b = packed_put((int)sizes[s][0], sizes[s][1], sizes[s][2], &n);
        for (int rep = 0; rep < (sizes[s][2] > 100000 ? 3 : 30); rep++) {
            ASSERT_TRUE(agree(b, n));
        }
        free(b);
    }
}

/* Appends a varint. */
static size_t vput(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    do {
        p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v != 0);
    return n;
}

static void test_hostile_forms(void)
{
    uint8_t m[256];
    size_t n;
    /* A valid block with unknown fields of every wire type around its fields: accepted. */
    n = 0;
    uint8_t blk[64];
    size_t k = 0;
    k += vput(blk + k, (7 << 3) | 0); /* unknown varint */
    k += vput(blk + k, 300);
    k += vput(blk + k, (1 << 3) | 0); /* index = 5 */
    k += vput(blk + k, 5);
    k += vput(blk + k, (9 << 3) | 1); /* unknown I64 */
    memset(blk + k, 0xab, 8);
    k += 8;
    k += vput(blk + k, (2 << 3) | 2); /* data = "abcd" */
    k += vput(blk + k, 4);
    memcpy(blk + k, "abcd", 4);
    k += 4;
    k += vput(blk + k, (10 << 3) | 5); /* unknown I32 */
    memset(blk + k, 1, 4);
    k += 4;
    n += vput(m + n, (2 << 3) | 2);
    n += vput(m + n, k);
    memcpy(m + n, blk, k);
    n += k;
    n += vput(m + n, (99 << 3) | 2); /* unknown LEN at the top */
    n += vput(m + n, 3);
    memcpy(m + n, "xyz", 3);
    n += 3;
    ASSERT_TRUE(agree(m, n));

    /* Two headers. */
    n = 0;
    for (int i = 0; i < 2; i++) {
        n += vput(m + n, (1 << 3) | 2);
        n += vput(m + n, 0);
    }
    ASSERT_TRUE(!agree(m, n));
    /* Index twice / data twice in one block. */
    uint8_t twice[][12] = {{0x08, 1, 0x08, 2}, {0x12, 1, 'a', 0x12, 1, 'b'}};
    size_t tl[] = {4, 6};
    for (int t = 0; t < 2; t++) {
        n = 0;
        n += vput(m + n, (2 << 3) | 2);
        n += vput(m + n, tl[t]);
        memcpy(m + n, twice[t], tl[t]);
        n += tl[t];
        ASSERT_TRUE(!agree(m, n));
    }
    /* blocks as a varint; index as LEN; a group; wire type 7; a 6-byte tag; a length past the
     * end; an 11-byte varint. */
    static const uint8_t bad[][16] = {
        {0x10, 0x01},
        {0x12, 0x03, 0x0a, 0x01, 0x05},
        {0x1b, 0x1c},
        {0x1f, 0x00},
        {0x80, 0x80, 0x80, 0x80, 0x80, 0x00, 0x00},
        {0x12, 0x05, 0x12, 0x10, 'a'},
        {0x38, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01},
    };
    static const size_t bl[] = {2, 5, 2, 2, 7, 5, 12};
    for (size_t i = 0; i < sizeof bl / sizeof bl[0]; i++) {
        if (agree(bad[i], bl[i])) {
            LKV_FAIL("hostile form %zu accepted", i);
        }
    }
    /* A uint32 index given as a 10-byte varint: the low 32 bits, as protobuf-c. */
    n = 0;
    uint8_t b2[16];
    k = 0;
    k += vput(b2 + k, (1 << 3) | 0);
    k += vput(b2 + k, 0xffffffff00000007ull);
    n += vput(m + n, (2 << 3) | 2);
    n += vput(m + n, k);
    memcpy(m + n, b2, k);
    n += k;
    ASSERT_TRUE(agree(m, n));
}

static void test_mutations(void)
{
    size_t n0;
    uint8_t *base = packed_put(1, 3, 40, &n0);
    uint8_t *m = malloc(n0 + 64);
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        size_t n = n0;
        memcpy(m, base, n0);
        int edits = 1 + (int)(next() % 4);
        for (int e = 0; e < edits; e++) {
            switch (next() % 4) {
            case 0:
            case 1: /* Flip a byte (often a tag or a length: the first bytes matter most). */
                if (n > 0) {
                    size_t at = next() % 3 == 0 ? next() % (n < 24 ? n : 24) : next() % n;
                    m[at] ^= (uint8_t)(1u << (next() % 8));
                }
                break;
            case 2: /* Truncate. */
                n = n > 0 ? next() % n : 0;
                break;
            default: /* Insert a random byte. */
                if (n < n0 + 60) {
                    size_t at = next() % (n + 1);
                    memmove(m + at + 1, m + at, n - at);
                    m[at] = (uint8_t)next();
                    n++;
                }
            }
        }
        accepted += agree(m, n);
    }
    fprintf(stderr, "mutations: %d of 20000 accepted by both, the rest refused by both\n",
            accepted);
    free(m);
    free(base);
}

int main(void)
{
    LKV_RUN(test_real_messages);
    LKV_RUN(test_hostile_forms);
    LKV_RUN(test_mutations);
    return 0;
}
