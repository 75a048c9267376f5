/*
 * test_wire.c: proto/lkv_wire, the wire scanner. Messages are built byte by byte here (not
 * only by protobuf-c, which never emits the hostile forms), then checked three ways: what the
 * scanner says, what lkv_pb_unpack_bytes (the server's decode path) says, and, for refusals
 * that matter, that protobuf-c alone would have taken them (so the scanner is what refuses).
 * The pathological messages of issue 12 are here with their timings printed: a 2.6 MB
 * DeleteRequest repeating `doc` 80,000 times, nesting 100,000 deep, and 200,000 valid repeated
 * documents (accepted, and linear).
 */
#include <stddef.h>
#include <time.h>

#include "lazykv/v1/admin.pb-c.h"
#include "lazykv/v1/cache.pb-c.h"
#include "lkv_pb.h"
#include "lkv_test.h"
#include "lkv_wire.h"

static char err[512];

/* ---- A byte builder --------------------------------------------------------------------- */

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
} wbuf;

static void put(wbuf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        ASSERT_TRUE(b->p != NULL);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_varint(wbuf *b, uint64_t v)
{
    uint8_t t[10];
    size_t n = 0;
    do {
        t[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v != 0) {
            t[n] |= 0x80;
        }
        n++;
    } while (v != 0);
    put(b, t, n);
}

static void put_tag(wbuf *b, uint32_t number, int wt)
{
    put_varint(b, ((uint64_t)number << 3) | (uint64_t)wt);
}

static void put_len(wbuf *b, uint32_t number, const void *data, size_t n)
{
    put_tag(b, number, LKV_WIRE_LEN);
    put_varint(b, n);
    put(b, data, n);
}

static void put_str(wbuf *b, uint32_t number, const char *s)
{
    put_len(b, number, s, strlen(s));
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* This thread's CPU time, ms: immune to preemption on a loaded machine (the linearity check). */
static double cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int scan(const ProtobufCMessageDescriptor *d, const wbuf *b)
{
    err[0] = '\0';
    return lkv_wire_scan(d, b->p, b->n, NULL, NULL, NULL, NULL, err, sizeof(err));
}

/* lkv_pb_unpack_bytes (the server's path): returns its code, frees the message. */
static int decode(const ProtobufCMessageDescriptor *d, const wbuf *b)
{
    ProtobufCMessage *m = NULL;
    int rc = lkv_pb_unpack_bytes(d, b->p, b->n, &m, err, sizeof(err));
    ASSERT_TRUE((rc == 0) == (m != NULL));
    lkv_pb_free(m);
    return rc;
}

/* 1 if protobuf-c alone accepts b as d. */
static int protobufc_accepts(const ProtobufCMessageDescriptor *d, const wbuf *b)
{
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, b->n, b->p);
    if (m != NULL) {
        protobuf_c_message_free_unpacked(m, NULL);
    }
    return m != NULL;
}

/* A DocRef naming (profile, token ids), as bytes. */
static void docref_tokens(wbuf *out, const char *profile, int n_tokens)
{
    wbuf td = {0}, ids = {0};
    put_str(&td, 1, profile);
    for (int i = 0; i < n_tokens; i++) {
        put_varint(&ids, (uint64_t)(i * 37 % 120));
    }
    put_len(&td, 2, ids.p, ids.n); /* Packed token_ids. */
    put_len(out, 2, td.p, td.n);   /* DocRef.tokens. */
    free(td.p);
    free(ids.p);
}

/* DeleteRequest.doc = {tokens = {profile, n ids}}, appended to out. */
static void delete_doc(wbuf *out, const char *profile, int n_tokens)
{
    wbuf d = {0};
    docref_tokens(&d, profile, n_tokens);
    put_len(out, 1, d.p, d.n);
    free(d.p);
}

/* ---- Valid messages --------------------------------------------------------------------- */

/* Every request type as protobuf-c packs it scans clean, and the visitor sees its fields. */
static void test_valid_requests(void)
{
    uint32_t toks[4] = {1, 2, 3, 499};
    uint8_t key[32];
    memset(key, 0xab, sizeof(key));
    Lazykv__V1__TokenDoc td = LAZYKV__V1__TOKEN_DOC__INIT;
    td.profile = "stories260k";
    td.n_token_ids = 4;
    td.token_ids = toks;
    Lazykv__V1__DocRef r1 = LAZYKV__V1__DOC_REF__INIT, r2 = LAZYKV__V1__DOC_REF__INIT;
    r1.tokens = &td;
    r2.key.data = key;
    r2.key.len = 32;
    Lazykv__V1__DocRef *refs[2] = {&r1, &r2};
    Lazykv__V1__LookupRequest lr = LAZYKV__V1__LOOKUP_REQUEST__INIT;
    lr.n_docs = 2;
    lr.docs = refs;
    Lazykv__V1__DeleteRequest dr = LAZYKV__V1__DELETE_REQUEST__INIT;
    dr.doc = &r1;
    Lazykv__V1__GetRequest gr = LAZYKV__V1__GET_REQUEST__INIT;
    gr.doc = &r2;
    Lazykv__V1__AttachRequest ar = LAZYKV__V1__ATTACH_REQUEST__INIT;
    ar.n_docs = 2;
    ar.docs = refs;
    ar.lease_id.data = key;
    ar.lease_id.len = 16;
    ar.ttl_ms = 5000;
    Lazykv__V1__ReleaseRequest rr = LAZYKV__V1__RELEASE_REQUEST__INIT;
    rr.lease_id.data = key;
    rr.lease_id.len = 16;
    char *sections[2] = {"hot", "cold"};
    Lazykv__V1__StatsRequest sr = LAZYKV__V1__STATS_REQUEST__INIT;
    sr.n_sections = 2;
    sr.sections = sections;
    Lazykv__V1__ListRequest li = LAZYKV__V1__LIST_REQUEST__INIT;
    li.limit = 10;
    li.profile = "stories260k";
    li.tier = LAZYKV__V1__TIER__TIER_COLD;
    Lazykv__V1__EvictRequest er = LAZYKV__V1__EVICT_REQUEST__INIT;
    er.key.data = key;
    er.key.len = 32;
    const ProtobufCMessage *msgs[] = {&lr.base, &dr.base, &gr.base, &ar.base,
                                      &rr.base, &sr.base, &li.base, &er.base};
    for (size_t i = 0; i < sizeof(msgs) / sizeof(msgs[0]); i++) {
        wbuf b = {0};
        b.n = protobuf_c_message_get_packed_size(msgs[i]);
        b.p = malloc(b.n + 1);
        protobuf_c_message_pack(msgs[i], b.p);
        uint64_t nf = 0;
        int rc =
            lkv_wire_scan(msgs[i]->descriptor, b.p, b.n, NULL, NULL, NULL, &nf, err, sizeof(err));
        if (rc != 0) {
            LKV_FAIL("%s: %s", msgs[i]->descriptor->name, err);
        }
        ASSERT_TRUE(nf > 0);
        ASSERT_OK(decode(msgs[i]->descriptor, &b));
        free(b.p);
    }
    /* The empty message is valid (all defaults). */
    wbuf e = {0};
    ASSERT_OK(scan(&lazykv__v1__delete_request__descriptor, &e));
    ASSERT_OK(decode(&lazykv__v1__delete_request__descriptor, &e));
}

/* ---- Repeated singular fields ----------------------------------------------------------- */

static void test_duplicate_singular(void)
{
    /* DeleteRequest.doc twice: protobuf-c merges (accepts); the scanner refuses. */
    wbuf b = {0};
    delete_doc(&b, "stories260k", 3);
    delete_doc(&b, "stories260k", 3);
    ASSERT_TRUE(protobufc_accepts(&lazykv__v1__delete_request__descriptor, &b));
    ASSERT_ERR(scan(&lazykv__v1__delete_request__descriptor, &b), LKV_EPROTO);
    ASSERT_TRUE(strstr(err, "lazykv.v1.DeleteRequest") != NULL);
    ASSERT_TRUE(strstr(err, "doc") != NULL && strstr(err, "more than once") != NULL);
    ASSERT_ERR(decode(&lazykv__v1__delete_request__descriptor, &b), LKV_EPROTO);
    free(b.p);

    /* Each singular kind: scalar (Block.index), bytes (Block.data), string (TokenDoc.profile),
     * message (DocRef.tokens, empty body), enum (ListRequest.tier): once is fine, twice is
     * refused where protobuf-c alone takes it. */
    struct {
        const ProtobufCMessageDescriptor *d;
        uint32_t number;
        const char *rec; /* One occurrence. */
        size_t n;
    } cases[] = {
        {&lazykv__v1__block__descriptor, 1, "\x08\x01", 2},
        {&lazykv__v1__block__descriptor, 2, "\x12\x01\x00", 3},
        {&lazykv__v1__token_doc__descriptor, 1, "\x0a\x01\x61", 3},
        {&lazykv__v1__doc_ref__descriptor, 2, "\x12\x00", 2},
        {&lazykv__v1__list_request__descriptor, 4, "\x20\x02", 2},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        wbuf one = {0};
        put(&one, cases[i].rec, cases[i].n);
        ASSERT_OK(scan(cases[i].d, &one));
        ASSERT_OK(decode(cases[i].d, &one));
        put(&one, "\x78\x05", 2); /* An unknown field 15 between the two. */
        put(&one, cases[i].rec, cases[i].n);
        ASSERT_TRUE(protobufc_accepts(cases[i].d, &one));
        ASSERT_ERR(scan(cases[i].d, &one), LKV_EPROTO);
        ASSERT_TRUE(strstr(err, "more than once") != NULL);
        ASSERT_ERR(decode(cases[i].d, &one), LKV_EPROTO);
        free(one.p);
    }
}

/* Issue 12's message: 2.6 MB, DeleteRequest.doc 80,000 times. protobuf-c takes ~40 s on it
 * (merging, quadratic); the scanner refuses it at the second occurrence, and even a scan that
 * had to walk it all is linear. */
static void test_pathological_delete(void)
{
    wbuf b = {0};
    for (int i = 0; i < 80000; i++) {
        delete_doc(&b, "stories260k", 14);
    }
    size_t count = 0, pos = 0;
    lkv_wire_field f;
    while (lkv_wire_next(b.p, b.n, &pos, &f) == 1) {
        count++;
    }
    ASSERT_EQ(count, 80000);
    ASSERT_TRUE(b.n >= 2600000);
    double t0 = now_ms();
    ASSERT_ERR(decode(&lazykv__v1__delete_request__descriptor, &b), LKV_EPROTO);
    double dt = now_ms() - t0;
    fprintf(stderr, "   %zu-byte DeleteRequest, doc x%zu: refused in %.3f ms (%s)\n", b.n, count,
            dt, err);
    ASSERT_TRUE(strstr(err, "more than once") != NULL);
    ASSERT_TRUE(dt < 100.0);
    /* The baseline, measured here: protobuf-c alone on the first 5,000 occurrences (1/16 of
     * them; its cost grows with the square of the count). */
    size_t pos5k = 0;
    for (int i = 0; i < 5000; i++) {
        ASSERT_EQ(lkv_wire_next(b.p, b.n, &pos5k, &f), 1);
    }
    wbuf head = {b.p, pos5k, pos5k};
    t0 = now_ms();
    ASSERT_TRUE(protobufc_accepts(&lazykv__v1__delete_request__descriptor, &head));
    fprintf(stderr, "   baseline: protobuf-c alone on the first 5000 occurrences: %.1f ms\n",
            now_ms() - t0);
    /* The same bytes as a LookupRequest (docs is repeated there) are valid: all 80,000 docs. */
    t0 = now_ms();
    ProtobufCMessage *m = NULL;
    ASSERT_OK(lkv_pb_unpack_bytes(&lazykv__v1__lookup_request__descriptor, b.p, b.n, &m, err,
                                  sizeof(err)));
    dt = now_ms() - t0;
    ASSERT_EQ(((Lazykv__V1__LookupRequest *)m)->n_docs, count);
    ASSERT_EQ(((Lazykv__V1__LookupRequest *)m)->docs[count - 1]->tokens->n_token_ids, 14);
    fprintf(stderr, "   the same bytes as LookupRequest (%zu docs): decoded in %.1f ms\n", count,
            dt);
    lkv_pb_free(m);
    free(b.p);
}

/* Many valid repeated elements stay accepted, and the scan is linear: doubling the count
 * roughly doubles the time (bounded well below the quadratic 4x). */
static void test_huge_repeated_linear(void)
{
    /* 50,000 and 400,000 documents: linear is 8x the time, quadratic 64x. Thread CPU time, runs
     * interleaved, the best of 5 (the CI machine is shared). */
    size_t sizes[2] = {50000, 400000};
    wbuf b[2] = {{0}, {0}};
    for (int r = 0; r < 2; r++) {
        uint8_t key[32];
        for (size_t i = 0; i < sizes[r]; i++) {
            memset(key, (int)(i & 0xff), sizeof(key));
            wbuf d = {0};
            put_len(&d, 1, key, sizeof(key));
            put_len(&b[r], 1, d.p, d.n);
            free(d.p);
        }
    }
    double t[2] = {1e9, 1e9};
    for (int rep = 0; rep < 5; rep++) {
        for (int r = 0; r < 2; r++) {
            double t0 = cpu_ms();
            ASSERT_OK(scan(&lazykv__v1__lookup_request__descriptor, &b[r]));
            double dt = cpu_ms() - t0;
            t[r] = dt < t[r] ? dt : t[r];
        }
    }
    for (int r = 0; r < 2; r++) {
        ASSERT_OK(decode(&lazykv__v1__lookup_request__descriptor, &b[r]));
        fprintf(stderr, "   LookupRequest with %zu docs (%zu bytes): scanned in %.2f ms (CPU)\n",
                sizes[r], b[r].n, t[r]);
        free(b[r].p);
    }
    ASSERT_TRUE(t[1] < 20.0 * t[0] + 1.0);
    /* A long unpacked repeated scalar: TokenDoc.token_ids, one varint record each. */
    wbuf td = {0};
    put_str(&td, 1, "stories260k");
    for (int i = 0; i < 300000; i++) {
        put_tag(&td, 2, LKV_WIRE_VARINT);
        put_varint(&td, (uint64_t)(i % 512));
    }
    ProtobufCMessage *m = NULL;
    ASSERT_OK(
        lkv_pb_unpack_bytes(&lazykv__v1__token_doc__descriptor, td.p, td.n, &m, err, sizeof(err)));
    ASSERT_EQ(((Lazykv__V1__TokenDoc *)m)->n_token_ids, 300000);
    lkv_pb_free(m);
    free(td.p);
}

/* ---- Strings ---------------------------------------------------------------------------- */

static void test_strings(void)
{
    /* Issue 12: "stories260k\0x" was accepted as "stories260k". */
    wbuf b = {0};
    put_len(&b, 1, "stories260k\0x", 13);
    ASSERT_TRUE(protobufc_accepts(&lazykv__v1__token_doc__descriptor, &b));
    ASSERT_ERR(decode(&lazykv__v1__token_doc__descriptor, &b), LKV_EPROTO);
    ASSERT_TRUE(strstr(err, "profile") != NULL && strstr(err, "UTF-8") != NULL);
    ASSERT_TRUE(strstr(err, "byte 11 of 13") != NULL);
    free(b.p);

    static const struct {
        const char *s;
        size_t n;
        int ok;
    } cases[] = {
        {"plain", 5, 1},
        {"h\xc3\xa9llo", 6, 1},             /* U+00E9 */
        {"\xe6\x97\xa5\xe6\x9c\xac", 6, 1}, /* U+65E5 U+672C */
        {"\xf0\x9f\x98\x80", 4, 1},         /* U+1F600 */
        {"\xf4\x8f\xbf\xbf", 4, 1},         /* U+10FFFF */
        {"\xef\xbf\xbf", 3, 1},             /* U+FFFF */
        {"", 0, 1},
        {"\x00", 1, 0},             /* NUL alone */
        {"\xc0\x80", 2, 0},         /* Overlong NUL */
        {"\xc1\xbf", 2, 0},         /* Overlong */
        {"\xe0\x80\x80", 3, 0},     /* Overlong 3-byte */
        {"\xf0\x80\x80\x80", 4, 0}, /* Overlong 4-byte */
        {"\xed\xa0\x80", 3, 0},     /* Surrogate U+D800 */
        {"\xed\xbf\xbf", 3, 0},     /* Surrogate U+DFFF */
        {"\xf4\x90\x80\x80", 4, 0}, /* U+110000 */
        {"\xf5\x80\x80\x80", 4, 0},
        {"\xe2\x82", 2, 0}, /* Truncated */
        {"ab\xc3", 3, 0},   /* Truncated at the end */
        {"\x80", 1, 0},     /* Stray continuation */
        {"\xc3\x28", 2, 0}, /* Bad continuation */
        {"\xff", 1, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        wbuf s = {0};
        put_len(&s, 1, cases[i].s, cases[i].n);
        int rc = scan(&lazykv__v1__token_doc__descriptor, &s);
        if ((rc == 0) != cases[i].ok) {
            LKV_FAIL("string case %zu: rc %d, want ok=%d (%s)", i, rc, cases[i].ok, err);
        }
        /* A bytes field holds anything: the same bytes as Block.data pass. */
        wbuf d = {0};
        put_len(&d, 2, cases[i].s, cases[i].n);
        ASSERT_OK(scan(&lazykv__v1__block__descriptor, &d));
        free(s.p);
        free(d.p);
    }
    /* A repeated string element is checked too (StatsRequest.sections). */
    wbuf st = {0};
    put_str(&st, 1, "hot");
    put_len(&st, 1, "co\0ld", 5);
    ASSERT_ERR(scan(&lazykv__v1__stats_request__descriptor, &st), LKV_EPROTO);
    free(st.p);
}

/* ---- Varints, lengths, tags, wire types -------------------------------------------------- */

static void test_malformed_records(void)
{
    static const struct {
        const char *b;
        size_t n;
        const char *why;
    } bad[] = {
        {"\x08\x80", 2, "truncated or overlong varint"},
        {"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12, "11-byte varint"},
        {"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02", 11, "overlong varint"},     /* bit 64 */
        {"\x08\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x00", 12, "overlong varint"}, /* 11 */
        {"\x80", 1, "truncated tag"},
        {"\x88\x80\x80\x80\x80\x00\x01", 7, "6-byte tag"},
        {"\x00\x01", 2, "field 0"},
        {"\x12\x05\x01\x02", 4, "length past end"},
        {"\x12\xff\xff\xff\xff\xff\xff\xff\xff\x7f", 10, "huge length"},
        {"\x12", 1, "missing length"},
        {"\x0b", 1, "group start"},
        {"\x0c", 1, "group end"},
        {"\x0e\x00", 2, "wire type 6"},
        {"\x0f\x00", 2, "wire type 7"},
        {"\x0d\x01\x02", 3, "I32 past end"},
        {"\x09\x01\x02\x03\x04\x05\x06\x07", 8, "I64 past end"},
        {"\x0a\x01\x00", 3, "Block.index (varint) as LEN"},
        {"\x10\x01", 2, "Block.data (bytes) as varint"},
        {"\x0d\x01\x00\x00\x00", 5, "Block.index as I32"},
        {"\xfa\xff\xff\xff\x0f\x00", 6, "field number 2^32-1 >> 3 ok but wt?"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        wbuf b = {(uint8_t *)bad[i].b, bad[i].n, bad[i].n};
        int rc = scan(&lazykv__v1__block__descriptor, &b);
        if (i == sizeof(bad) / sizeof(bad[0]) - 1) {
            /* Tag 0xfffffffa: field 2^29-1 (the largest), wire type 2: a valid unknown field
             * with an empty payload. */
            ASSERT_OK(rc);
            continue;
        }
        if (rc != LKV_EPROTO) {
            LKV_FAIL("case %zu (%s): rc %d, want LKV_EPROTO", i, bad[i].why, rc);
        }
        ASSERT_TRUE(strstr(err, "lazykv.v1.Block") != NULL);
        ASSERT_ERR(decode(&lazykv__v1__block__descriptor, &b), LKV_EPROTO);
    }
    /* A 10-byte varint (a negative int32's encoding) is valid. */
    wbuf ok = {(uint8_t *)"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11, 11};
    ASSERT_OK(scan(&lazykv__v1__block__descriptor, &ok));
    /* A record inside a sub-message that runs past the sub-message's end (but not past the
     * outer buffer) is refused: the bound is the parent's LEN payload. DocRef.key claims 4
     * bytes of a 3-byte DocRef; more bytes follow in the DeleteRequest. */
    wbuf nest = {(uint8_t *)"\x0a\x03\x0a\x04\x01\x01\x01\x01\x01", 9, 9};
    ASSERT_ERR(scan(&lazykv__v1__delete_request__descriptor, &nest), LKV_EPROTO);
    ASSERT_TRUE(strstr(err, "lazykv.v1.DocRef") != NULL);
    /* Packed token ids: whole varints only. */
    wbuf pk = {(uint8_t *)"\x12\x03\x01\x02\x83", 5, 5};
    ASSERT_ERR(scan(&lazykv__v1__token_doc__descriptor, &pk), LKV_EPROTO);
    ASSERT_TRUE(strstr(err, "packed") != NULL);
    wbuf pk2 = {(uint8_t *)"\x12\x03\x01\x02\x03\x10\x04", 7, 7}; /* Packed, then unpacked. */
    ASSERT_OK(scan(&lazykv__v1__token_doc__descriptor, &pk2));
    ProtobufCMessage *m = NULL;
    ASSERT_OK(lkv_pb_unpack_bytes(&lazykv__v1__token_doc__descriptor, pk2.p, pk2.n, &m, err,
                                  sizeof(err)));
    ASSERT_EQ(((Lazykv__V1__TokenDoc *)m)->n_token_ids, 4);
    ASSERT_EQ(((Lazykv__V1__TokenDoc *)m)->token_ids[3], 4);
    lkv_pb_free(m);
}

/* Unknown fields are skipped after their format is checked, and count towards max_fields. */
static void test_unknown_fields(void)
{
    wbuf b = {0};
    put_tag(&b, 1, LKV_WIRE_VARINT);
    put_varint(&b, 7);
    put_tag(&b, 99, LKV_WIRE_VARINT);
    put_varint(&b, 1);
    put_len(&b, 100, "\x00\xff", 2);
    put_tag(&b, 101, LKV_WIRE_I32);
    put(&b, "abcd", 4);
    put_tag(&b, 102, LKV_WIRE_I64);
    put(&b, "abcdefgh", 8);
    put_tag(&b, 99, LKV_WIRE_VARINT); /* An unknown number twice is fine. */
    put_varint(&b, 2);
    uint64_t nf = 0;
    ASSERT_OK(lkv_wire_scan(&lazykv__v1__block__descriptor, b.p, b.n, NULL, NULL, NULL, &nf, err,
                            sizeof(err)));
    ASSERT_EQ(nf, 6);
    ProtobufCMessage *m = NULL;
    ASSERT_OK(lkv_pb_unpack_bytes(&lazykv__v1__block__descriptor, b.p, b.n, &m, err, sizeof(err)));
    ASSERT_EQ(((Lazykv__V1__Block *)m)->index, 7);
    lkv_pb_free(m);
    lkv_wire_limits lim = {.max_depth = 4, .max_fields = 5};
    ASSERT_ERR(lkv_wire_scan(&lazykv__v1__block__descriptor, b.p, b.n, &lim, NULL, NULL, &nf, err,
                             sizeof(err)),
               LKV_ETOOBIG);
    ASSERT_EQ(nf, 6);
    ASSERT_TRUE(strstr(err, "more than 5 fields") != NULL);
    lim.max_fields = 6;
    ASSERT_OK(lkv_wire_scan(&lazykv__v1__block__descriptor, b.p, b.n, &lim, NULL, NULL, NULL, err,
                            sizeof(err)));
    /* The record bound is tree-wide: fields inside sub-messages count too. */
    wbuf del = {0};
    delete_doc(&del, "p", 2); /* DeleteRequest{doc{tokens{profile, ids}}}: 4 records. */
    lim.max_fields = 3;
    ASSERT_ERR(lkv_wire_scan(&lazykv__v1__delete_request__descriptor, del.p, del.n, &lim, NULL,
                             NULL, NULL, err, sizeof(err)),
               LKV_ETOOBIG);
    lim.max_fields = 4;
    ASSERT_OK(lkv_wire_scan(&lazykv__v1__delete_request__descriptor, del.p, del.n, &lim, NULL, NULL,
                            NULL, err, sizeof(err)));
    /* A 1 MiB message of 2-byte unknown records: counted, refused over the bound, fast. */
    wbuf u = {0};
    while (u.n < (1u << 20)) {
        put_tag(&u, 15, LKV_WIRE_VARINT);
        put_varint(&u, 0);
    }
    lim.max_fields = 1000;
    double t0 = now_ms();
    ASSERT_ERR(lkv_wire_scan(&lazykv__v1__delete_request__descriptor, u.p, u.n, &lim, NULL, NULL,
                             &nf, err, sizeof(err)),
               LKV_ETOOBIG);
    fprintf(stderr, "   1 MiB of unknown records: refused over 1000 in %.3f ms\n", now_ms() - t0);
    ASSERT_EQ(nf, 1001);
    ASSERT_OK(scan(&lazykv__v1__delete_request__descriptor, &u)); /* 512 Ki < the default. */
    free(b.p);
    free(del.p);
    free(u.p);
}

/* ---- Nesting and oneofs, on a hand-made recursive descriptor ------------------------------ */

typedef struct node {
    ProtobufCMessage base;
    struct node *child; /* 1 */
    size_t n_vals;      /* 2: repeated fixed32 */
    uint32_t *vals;
    uint32_t which; /* oneof case */
    union {
        uint32_t a; /* 3 */
        uint32_t b; /* 4 */
    };
} node;

extern const ProtobufCMessageDescriptor node_descriptor;
static const ProtobufCFieldDescriptor node_fields[4] = {
    {"child", 1, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_MESSAGE, 0, offsetof(node, child),
     &node_descriptor, NULL, 0, 0, NULL, NULL},
    {"vals", 2, PROTOBUF_C_LABEL_REPEATED, PROTOBUF_C_TYPE_FIXED32, offsetof(node, n_vals),
     offsetof(node, vals), NULL, NULL, PROTOBUF_C_FIELD_FLAG_PACKED, 0, NULL, NULL},
    {"a", 3, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_UINT32, offsetof(node, which),
     offsetof(node, a), NULL, NULL, PROTOBUF_C_FIELD_FLAG_ONEOF, 0, NULL, NULL},
    {"b", 4, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_UINT32, offsetof(node, which),
     offsetof(node, b), NULL, NULL, PROTOBUF_C_FIELD_FLAG_ONEOF, 0, NULL, NULL},
};
static const unsigned node_by_name[4] = {2, 3, 0, 1};
static const ProtobufCIntRange node_ranges[2] = {{1, 0}, {0, 4}};
const ProtobufCMessageDescriptor node_descriptor = {PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC,
                                                    "test.Node",
                                                    "Node",
                                                    "Node",
                                                    "test",
                                                    sizeof(node),
                                                    4,
                                                    node_fields,
                                                    node_by_name,
                                                    1,
                                                    node_ranges,
                                                    NULL,
                                                    NULL,
                                                    NULL,
                                                    NULL};

/* Node nested `depth` levels below the top (depth 0: an empty top message), built outside-in
 * in linear time: level i's payload is L[i-1] bytes, L[i] = 1 + len(varint L[i-1]) + L[i-1]. */
static void nested(wbuf *out, int depth)
{
    size_t *L = calloc((size_t)depth + 1, sizeof(size_t));
    wbuf t = {0};
    for (int i = 1; i <= depth; i++) {
        t.n = 0;
        put_varint(&t, L[i - 1]);
        L[i] = 1 + t.n + L[i - 1];
    }
    wbuf b = {0};
    for (int i = depth; i >= 1; i--) {
        put_tag(&b, 1, LKV_WIRE_LEN);
        put_varint(&b, L[i - 1]);
    }
    ASSERT_EQ(b.n, L[depth]);
    free(t.p);
    free(L);
    *out = b;
}

static void test_depth(void)
{
    lkv_wire_limits lim = {.max_depth = 8, .max_fields = 0};
    for (int d = 0; d <= 9; d++) {
        wbuf b;
        nested(&b, d);
        int rc =
            lkv_wire_scan(&node_descriptor, b.p, b.n, &lim, NULL, NULL, NULL, err, sizeof(err));
        if (d <= 8) {
            ASSERT_OK(rc);
        } else {
            ASSERT_ERR(rc, LKV_EPROTO);
            ASSERT_TRUE(strstr(err, "deeper than 8") != NULL);
        }
        free(b.p);
    }
    /* 100,000 levels: refused at the default bound, without deep recursion, fast. */
    wbuf deep;
    nested(&deep, 100000);
    double t0 = now_ms();
    ASSERT_ERR(scan(&node_descriptor, &deep), LKV_EPROTO);
    fprintf(stderr, "   %zu-byte message nested 100000 deep: refused in %.3f ms (%s)\n", deep.n,
            now_ms() - t0, err);
    free(deep.p);
    /* Real schema: LookupRequest > DocRef > TokenDoc is depth 2. */
    wbuf lr = {0};
    delete_doc(&lr, "p", 1); /* The same bytes as LookupRequest.docs[0]. */
    lim.max_depth = 1;
    ASSERT_ERR(lkv_wire_scan(&lazykv__v1__lookup_request__descriptor, lr.p, lr.n, &lim, NULL, NULL,
                             NULL, err, sizeof(err)),
               LKV_EPROTO);
    lim.max_depth = 2;
    ASSERT_OK(lkv_wire_scan(&lazykv__v1__lookup_request__descriptor, lr.p, lr.n, &lim, NULL, NULL,
                            NULL, err, sizeof(err)));
    lim.max_depth = 0;
    ASSERT_ERR(lkv_wire_scan(&lazykv__v1__lookup_request__descriptor, lr.p, lr.n, &lim, NULL, NULL,
                             NULL, err, sizeof(err)),
               LKV_EINVAL);
    free(lr.p);
}

static void test_oneof_and_packed_fixed(void)
{
    wbuf b = {0};
    put_tag(&b, 3, LKV_WIRE_VARINT);
    put_varint(&b, 1);
    ASSERT_OK(scan(&node_descriptor, &b));
    put_tag(&b, 4, LKV_WIRE_VARINT); /* Another member of the same oneof. */
    put_varint(&b, 2);
    ASSERT_ERR(scan(&node_descriptor, &b), LKV_EPROTO);
    ASSERT_TRUE(strstr(err, "oneof") != NULL);
    free(b.p);
    wbuf p = {0};
    put_len(&p, 2, "abcdefgh", 8); /* Two packed fixed32. */
    put_tag(&p, 2, LKV_WIRE_I32);  /* And one unpacked. */
    put(&p, "ijkl", 4);
    ASSERT_OK(scan(&node_descriptor, &p));
    put_len(&p, 2, "abcde", 5); /* Not whole fixed32 elements. */
    ASSERT_ERR(scan(&node_descriptor, &p), LKV_EPROTO);
    free(p.p);
}

/* ---- The visitor, lkv_wire_next / lkv_wire_find (the zero-copy Put decoder's base) -------- */

typedef struct seen_blocks {
    size_t n;
    size_t off[8], len[8];
    uint32_t idx[8];
    int header_fields;
} seen_blocks;

static int visit_blocks(void *arg, const lkv_wire_ctx *w, const lkv_wire_field *f)
{
    seen_blocks *s = arg;
    if (w->depth == 1 && w->path[0] == 2 && f->number == 2) { /* PutRequest.blocks[i].data */
        ASSERT_TRUE(w->msg == &lazykv__v1__block__descriptor);
        ASSERT_TRUE(strcmp(w->field->name, "data") == 0);
        s->off[s->n] = f->off;
        s->len[s->n] = f->len;
        s->idx[s->n] = w->index[0];
        s->n++;
    }
    if (w->depth == 1 && w->path[0] == 1) {
        s->header_fields++;
    }
    return 0;
}

static int visit_stop(void *arg, const lkv_wire_ctx *w, const lkv_wire_field *f)
{
    (void)w;
    int *n = arg;
    if (f->number == 2 && ++*n == 2) {
        return LKV_ECANCELLED;
    }
    return 0;
}

static void test_visitor(void)
{
    uint8_t data[3][40];
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 40; j++) {
            data[i][j] = (uint8_t)(i * 50 + j);
        }
    }
    uint32_t toks[3] = {5, 6, 7};
    Lazykv__V1__PutHeader h = LAZYKV__V1__PUT_HEADER__INIT;
    h.profile = "stories260k";
    h.n_token_ids = 3;
    h.token_ids = toks;
    Lazykv__V1__Block b[3];
    Lazykv__V1__Block *bp[3];
    for (int i = 0; i < 3; i++) {
        lazykv__v1__block__init(&b[i]);
        b[i].index = (uint32_t)i;
        b[i].data.data = data[i];
        b[i].data.len = 40;
        bp[i] = &b[i];
    }
    Lazykv__V1__PutRequest req = LAZYKV__V1__PUT_REQUEST__INIT;
    req.header = &h;
    req.n_blocks = 3;
    req.blocks = bp;
    size_t n = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = malloc(n);
    protobuf_c_message_pack(&req.base, buf);

    seen_blocks s;
    memset(&s, 0, sizeof(s));
    ASSERT_OK(lkv_wire_scan(&lazykv__v1__put_request__descriptor, buf, n, NULL, visit_blocks, &s,
                            NULL, err, sizeof(err)));
    ASSERT_EQ(s.n, 3);
    ASSERT_EQ(s.header_fields, 2); /* profile, token_ids (n_blocks 0 is not sent). */
    for (size_t i = 0; i < 3; i++) {
        ASSERT_EQ(s.idx[i], i);
        ASSERT_EQ(s.len[i], 40);
        ASSERT_TRUE(memcmp(buf + s.off[i], data[i], 40) == 0); /* In place: no copy. */
    }
    /* The same ranges by hand, as the header's example does. */
    size_t pos = 0, k = 0;
    lkv_wire_field rb, rd;
    int rc;
    while ((rc = lkv_wire_next(buf, n, &pos, &rb)) == 1) {
        if (rb.number != 2) {
            continue;
        }
        ASSERT_EQ(lkv_wire_find(buf + rb.off, rb.len, 2, &rd), 1);
        ASSERT_EQ(rb.off + rd.off, s.off[k]);
        ASSERT_EQ(rd.len, 40);
        k++;
    }
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(k, 3);
    ASSERT_EQ(lkv_wire_find(buf, n, 9, &rd), 0);
    ASSERT_EQ(lkv_wire_find((const uint8_t *)"\x12\x09", 2, 9, &rd), LKV_EPROTO);
    /* A visitor's code stops the scan and is returned. */
    int calls = 0;
    ASSERT_ERR(lkv_wire_scan(&lazykv__v1__put_request__descriptor, buf, n, NULL, visit_stop, &calls,
                             NULL, err, sizeof(err)),
               LKV_ECANCELLED);
    free(buf);
}

/* ---- Property: whatever the scanner accepts, protobuf-c decodes -------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void test_mutations(void)
{
    const char *seed = getenv("LKV_TEST_SEED");
    if (seed != NULL) {
        rng = strtoull(seed, NULL, 0) | 1;
    }
    fprintf(stderr, "   seed 0x%llx (LKV_TEST_SEED to replay)\n", (unsigned long long)rng);
    const ProtobufCMessageDescriptor *ds[] = {
        &lazykv__v1__put_request__descriptor, &lazykv__v1__lookup_request__descriptor,
        &lazykv__v1__delete_request__descriptor, &lazykv__v1__attach_request__descriptor,
        &lazykv__v1__list_request__descriptor};
    wbuf base = {0};
    delete_doc(&base, "stories260k", 5);
    delete_doc(&base, "x", 2);
    put_tag(&base, 3, LKV_WIRE_VARINT);
    put_varint(&base, 1000);
    int accepted = 0, total = 0;
    for (int it = 0; it < 40000; it++) {
        wbuf b = {malloc(base.n + 8), base.n, base.n + 8};
        memcpy(b.p, base.p, base.n);
        int muts = 1 + (int)(next_rand() % 4);
        for (int k = 0; k < muts; k++) {
            size_t at = next_rand() % b.n;
            switch (next_rand() % 3) {
            case 0:
                b.p[at] = (uint8_t)next_rand();
                break;
            case 1:
                b.p[at] ^= (uint8_t)(1u << (next_rand() % 8));
                break;
            default:
                b.n = at + 1; /* Truncate. */
            }
        }
        for (size_t di = 0; di < sizeof(ds) / sizeof(ds[0]); di++) {
            total++;
            if (scan(ds[di], &b) == 0) {
                accepted++;
                if (!protobufc_accepts(ds[di], &b)) {
                    LKV_FAIL("scanner accepted what protobuf-c refuses (%s, it %d)", ds[di]->name,
                             it);
                }
            }
        }
        free(b.p);
    }
    fprintf(stderr, "   %d of %d mutated messages accepted (all decoded by protobuf-c)\n", accepted,
            total);
    ASSERT_TRUE(accepted > 0 && accepted < total);
    free(base.p);
}

/* The varint writer against this file's own (put_varint) and the reader, at every length. */
static void test_varint_writer(void)
{
    const uint64_t vs[] = {0,
                           1,
                           127,
                           128,
                           300,
                           16383,
                           16384,
                           (1ull << 21) - 1,
                           1ull << 28,
                           (1ull << 35) + 5,
                           (1ull << 56) - 1,
                           1ull << 63,
                           UINT64_MAX};
    for (size_t i = 0; i < sizeof(vs) / sizeof(vs[0]); i++) {
        uint8_t out[10];
        size_t n = lkv_wire_varint_put(out, vs[i]);
        ASSERT_EQ(n, lkv_wire_varint_len(vs[i]));
        wbuf ref = {0};
        put_varint(&ref, vs[i]);
        ASSERT_EQ(ref.n, n);
        ASSERT_TRUE(memcmp(ref.p, out, n) == 0);
        free(ref.p);
        size_t pos = 0;
        uint64_t back = 0;
        ASSERT_OK(lkv_wire_varint(out, n, &pos, &back));
        ASSERT_EQ(pos, n);
        ASSERT_TRUE(back == vs[i]);
    }
    ASSERT_EQ(lkv_wire_varint_len(UINT64_MAX), 10);
}

int main(void)
{
    LKV_RUN(test_varint_writer);
    LKV_RUN(test_valid_requests);
    LKV_RUN(test_duplicate_singular);
    LKV_RUN(test_pathological_delete);
    LKV_RUN(test_huge_repeated_linear);
    LKV_RUN(test_strings);
    LKV_RUN(test_malformed_records);
    LKV_RUN(test_unknown_fields);
    LKV_RUN(test_depth);
    LKV_RUN(test_oneof_and_packed_fixed);
    LKV_RUN(test_visitor);
    LKV_RUN(test_mutations);
    return 0;
}
