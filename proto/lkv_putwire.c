/*
 * lkv_putwire.c: the zero-copy PutRequest decoder (see lkv_putwire.h).
 *
 * A cursor walks the logical message over its pieces. Each record's head (its tag, then the
 * varint value or the length prefix: at most 5 + 10 bytes) is copied into a 15-byte window and
 * parsed there with lkv_wire_varint, under the scanner's rules; a value or payload is then
 * skipped piece by piece without being read. So the cost is O(records + pieces) and nothing but
 * record heads (and the header, when it spans pieces) is copied.
 */
#include "lkv_putwire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_wire.h"

#define HEAD_MAX 15 /* Tag (<= 5 bytes) + a varint value (<= 10) or a length (<= 5). */

typedef struct cur {
    const struct iovec *seg; /* The pieces (borrowed). */
    size_t n_seg;
    size_t si;  /* Current piece (n_seg at the end). */
    size_t so;  /* Offset inside it (< its length unless at the end). */
    size_t pos; /* Logical offset. */
} cur;

typedef struct rec {
    uint32_t number; /* Field number. */
    int wire_type;   /* enum lkv_wire_type. */
    size_t head;     /* Bytes of the tag and of the varint value / length prefix. */
    size_t len;      /* LEN payload / fixed value bytes to skip after head (0 for VARINT). */
    uint64_t value;  /* VARINT value; LEN: len. */
} rec;

/* Moves past empty pieces and finished ones. */
static void settle(cur *c)
{
    while (c->si < c->n_seg && c->so >= c->seg[c->si].iov_len) {
        c->si++;
        c->so = 0;
    }
}

/* Advances by n bytes (n must not pass the end of the message). */
static void skip(cur *c, size_t n)
{
    c->pos += n;
    while (n > 0 && c->si < c->n_seg) {
        size_t here = c->seg[c->si].iov_len - c->so;
        size_t k = n < here ? n : here;
        c->so += k;
        n -= k;
        settle(c);
    }
}

/* Copies up to max bytes from the cursor (not past end) into tmp; returns how many. */
static size_t peek(const cur *c, size_t end, uint8_t *tmp, size_t max)
{
    size_t want = end - c->pos < max ? end - c->pos : max, got = 0;
    size_t si = c->si, so = c->so;
    while (got < want && si < c->n_seg) {
        size_t here = c->seg[si].iov_len - so;
        size_t k = want - got < here ? want - got : here;
        memcpy(tmp + got, (const uint8_t *)c->seg[si].iov_base + so, k);
        got += k;
        so += k;
        if (so >= c->seg[si].iov_len) {
            si++;
            so = 0;
        }
    }
    return got;
}

/* Reads the head of the record at the cursor, inside [pos, end), under lkv_wire.c's
 * read_record rules (it does not move the cursor). Returns 0 or LKV_EPROTO with *why. */
static int read_head(const cur *c, size_t end, rec *r, const char **why)
{
    uint8_t t[HEAD_MAX];
    size_t n = peek(c, end, t, sizeof t), p = 0;
    uint64_t tag;
    if (lkv_wire_varint(t, n, &p, &tag) != 0) {
        *why = "truncated or overlong tag varint";
        return LKV_EPROTO;
    }
    if (p > 5 || tag > UINT32_MAX) {
        *why = "tag varint longer than 5 bytes";
        return LKV_EPROTO;
    }
    r->number = (uint32_t)(tag >> 3);
    r->wire_type = (int)(tag & 7);
    if (r->number == 0 || r->number > LKV_WIRE_MAX_FIELD) {
        *why = "field number 0 or above 2^29-1";
        return LKV_EPROTO;
    }
    size_t left = end - c->pos; /* Bytes of the message from the record's start. */
    r->len = 0;
    switch (r->wire_type) {
    case LKV_WIRE_VARINT:
        if (lkv_wire_varint(t, n, &p, &r->value) != 0) {
            *why = "truncated or overlong varint";
            return LKV_EPROTO;
        }
        break;
    case LKV_WIRE_I64:
    case LKV_WIRE_I32:
        r->len = r->wire_type == LKV_WIRE_I64 ? 8 : 4;
        if (left - p < r->len) {
            *why = "fixed-width value past the end";
            return LKV_EPROTO;
        }
        break;
    case LKV_WIRE_LEN: {
        size_t lp = p;
        uint64_t len;
        if (lkv_wire_varint(t, n, &p, &len) != 0) {
            *why = "truncated or overlong length varint";
            return LKV_EPROTO;
        }
        if (p - lp > 5) {
            *why = "length varint longer than 5 bytes";
            return LKV_EPROTO;
        }
        if (len > left - p) {
            *why = "length past the end of the message";
            return LKV_EPROTO;
        }
        r->len = (size_t)len;
        r->value = len;
        break;
    }
    default:
        *why = r->wire_type == 3 || r->wire_type == 4 ? "groups are not supported"
                                                      : "invalid wire type";
        return LKV_EPROTO;
    }
    r->head = p;
    return 0;
}

typedef struct dec {
    cur c;
    uint64_t n_fields; /* Records seen (the scanner's max_fields bound). */
    char *err;
    size_t errlen;
} dec;

/* Counts one record against the bound. */
static int count(dec *d, const char *msg, size_t at)
{
    if (++d->n_fields > LKV_WIRE_FIELDS_DEF) {
        lkv_errf(d->err, d->errlen, 0,
                 "%s: more than %llu fields in one message (at byte %zu): refused", msg,
                 (unsigned long long)LKV_WIRE_FIELDS_DEF, at);
        return LKV_ETOOBIG;
    }
    return 0;
}

/* One Block sub-message at the cursor, ending at end: fills *b. */
static int decode_block(dec *d, size_t end, lkv_putwire_block *b)
{
    static const char *msg = "lazykv.v1.Block";
    int seen_index = 0, seen_data = 0;
    b->index = 0;
    b->off = d->c.pos;
    b->len = 0;
    while (d->c.pos < end) {
        rec r;
        const char *why;
        size_t at = d->c.pos;
        if (read_head(&d->c, end, &r, &why) != 0) {
            lkv_errf(d->err, d->errlen, 0, "malformed %s at byte %zu: %s", msg, at, why);
            return LKV_EPROTO;
        }
        int rc = count(d, msg, at);
        if (rc != 0) {
            return rc;
        }
        if (r.number == 1 || r.number == 2) {
            int want = r.number == 1 ? LKV_WIRE_VARINT : LKV_WIRE_LEN;
            const char *name = r.number == 1 ? "index" : "data";
            if (r.wire_type != want) {
                lkv_errf(d->err, d->errlen, 0,
                         "malformed %s at byte %zu: field %u (%s) has wire type %d, expected %d",
                         msg, at, r.number, name, r.wire_type, want);
                return LKV_EPROTO;
            }
            int *seen = r.number == 1 ? &seen_index : &seen_data;
            if (*seen) {
                lkv_errf(d->err, d->errlen, 0,
                         "%s: field %u (%s) occurs more than once (again at byte %zu): refused",
                         msg, r.number, name, at);
                return LKV_EPROTO;
            }
            *seen = 1;
            if (r.number == 1) {
                b->index = (uint32_t)r.value; /* The low 32 bits, as protobuf-c. */
            } else {
                b->off = at + r.head;
                b->len = r.len;
            }
        }
        skip(&d->c, r.head + r.len);
    }
    return 0;
}

void lkv_putwire_free(lkv_putwire *w)
{
    if (w == NULL) {
        return;
    }
    if (w->header != NULL) {
        protobuf_c_message_free_unpacked(&w->header->base, NULL);
    }
    free(w->blocks);
    memset(w, 0, sizeof *w);
}

/* Decodes the header's bytes [off, off + len): gathered if they span pieces. */
static int decode_header(dec *d, size_t off, size_t len, lkv_putwire *out)
{
    cur c = {d->c.seg, d->c.n_seg, 0, 0, 0};
    settle(&c);
    skip(&c, off);
    const uint8_t *p = NULL;
    uint8_t *copy = NULL;
    if (len > 0 && c.si < c.n_seg && c.seg[c.si].iov_len - c.so >= len) {
        p = (const uint8_t *)c.seg[c.si].iov_base + c.so;
    } else if (len > 0) {
        copy = lkv_xmalloc(len); /* Out of host memory is fatal by policy. */
        size_t got = peek(&c, off + len, copy, len);
        (void)got;
        p = copy;
    }
    /* The scanner with what is left of the record bound (it counts the whole tree) and one
     * nesting level less (the header is a sub-message), then protobuf-c. */
    lkv_wire_limits lim = lkv_wire_limits_default();
    lim.max_depth = LKV_WIRE_DEPTH_DEF - 1;
    lim.max_fields = LKV_WIRE_FIELDS_DEF - d->n_fields;
    uint64_t nf = 0;
    int rc = lkv_wire_scan(&lazykv__v1__put_header__descriptor, p, len, &lim, NULL, NULL, &nf,
                           d->err, d->errlen);
    if (rc == 0) {
        ProtobufCMessage *m =
            protobuf_c_message_unpack(&lazykv__v1__put_header__descriptor, NULL, len, p);
        if (m == NULL) {
            lkv_errf(d->err, d->errlen, 0, "malformed lazykv.v1.PutHeader (%zu bytes at byte %zu)",
                     len, off);
            rc = LKV_EPROTO;
        } else {
            out->header = (Lazykv__V1__PutHeader *)m;
        }
    }
    free(copy);
    return rc;
}

int lkv_putwire_decode(const struct iovec *seg, size_t n_seg, lkv_putwire *out, char *err,
                       size_t errlen)
{
    static const char *msg = "lazykv.v1.PutRequest";
    memset(out, 0, sizeof *out);
    if (seg == NULL && n_seg > 0) {
        lkv_errf(err, errlen, 0, "lkv_putwire_decode: bad arguments");
        return LKV_EINVAL;
    }
    dec d = {{seg, n_seg, 0, 0, 0}, 0, err, errlen};
    size_t total = 0;
    for (size_t i = 0; i < n_seg; i++) {
        total += seg[i].iov_len;
    }
    settle(&d.c);
    int seen_header = 0, rc = 0;
    size_t hoff = 0, hlen = 0;
    while (d.c.pos < total) {
        rec r;
        const char *why;
        size_t at = d.c.pos;
        if (read_head(&d.c, total, &r, &why) != 0) {
            lkv_errf(err, errlen, 0, "malformed %s at byte %zu: %s", msg, at, why);
            rc = LKV_EPROTO;
            goto out;
        }
        if ((rc = count(&d, msg, at)) != 0) {
            goto out;
        }
        if (r.number != 1 && r.number != 2) {
            skip(&d.c, r.head + r.len); /* Unknown: skipped, counted. */
            continue;
        }
        const char *name = r.number == 1 ? "header" : "blocks";
        if (r.wire_type != LKV_WIRE_LEN) {
            lkv_errf(err, errlen, 0,
                     "malformed %s at byte %zu: field %u (%s) has wire type %d, expected %d", msg,
                     at, r.number, name, r.wire_type, LKV_WIRE_LEN);
            rc = LKV_EPROTO;
            goto out;
        }
        if (r.number == 1) {
            if (seen_header) {
                lkv_errf(err, errlen, 0,
                         "%s: field 1 (header) occurs more than once (again at byte %zu): refused",
                         msg, at);
                rc = LKV_EPROTO;
                goto out;
            }
            seen_header = 1;
            hoff = at + r.head;
            hlen = r.len;
            skip(&d.c, r.head + r.len);
            continue;
        }
        if (out->n_blocks == out->cap) {
            size_t cap = out->cap ? 2 * out->cap : 16;
            out->blocks = lkv_xrealloc(out->blocks, cap * sizeof *out->blocks);
            out->cap = cap;
        }
        skip(&d.c, r.head);
        size_t end = d.c.pos + r.len;
        if ((rc = decode_block(&d, end, &out->blocks[out->n_blocks])) != 0) {
            goto out;
        }
        out->n_blocks++;
    }
    if (seen_header) {
        rc = decode_header(&d, hoff, hlen, out);
    }
out:
    if (rc != 0) {
        lkv_putwire_free(out);
    }
    return rc;
}

size_t lkv_putwire_iov(const struct iovec *seg, size_t n_seg, size_t off, size_t len,
                       struct iovec *out, size_t cap)
{
    size_t n = 0, base = 0;
    for (size_t i = 0; i < n_seg && len > 0; i++) {
        size_t sl = seg[i].iov_len;
        if (off >= base + sl) {
            base += sl;
            continue;
        }
        size_t in = off - base;
        size_t k = sl - in < len ? sl - in : len;
        if (n < cap) {
            out[n].iov_base = (uint8_t *)seg[i].iov_base + in;
            out[n].iov_len = k;
        }
        n++;
        off += k;
        len -= k;
        base += sl;
    }
    return n;
}
