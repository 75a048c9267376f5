/*
 * lkv_wire.c: the linear-time protobuf wire scanner (see lkv_wire.h for the rules it enforces
 * and the wire-format table).
 *
 * Structure. read_record() reads one record (tag and value bounds) at an absolute offset of the
 * top buffer; it knows nothing of descriptors and backs both lkv_wire_next and the scanner.
 * scan_msg() walks one message level between two absolute offsets with its descriptor: per
 * record it checks the record against the field's descriptor, keeps a bitmap of the singular
 * fields already seen (the duplicate check) and a per-field occurrence counter (the visitor's
 * repeated index), and recurses into sub-messages with depth + 1. Invariants: start <= pos <=
 * end <= the top length at every step; a record is accepted only once its value lies wholly
 * inside [pos, end), so a recursive call never reads past its parent's LEN payload.
 */
#include "lkv_wire.h"

#include <stdio.h>
#include <string.h>

#include "lkv_err.h"

typedef struct scan {
    const lkv_wire_limits *lim; /* Borrowed. */
    lkv_wire_visit_fn visit;    /* Optional visitor. */
    void *arg;                  /* Its argument. */
    const uint8_t *base;        /* The top buffer; offsets count from here. */
    uint64_t n_fields;          /* Records seen so far, tree-wide. */
    lkv_wire_ctx ctx;           /* The visitor's view, updated in place. */
    char *err;                  /* Optional reason buffer. */
    size_t errlen;
} scan;

lkv_wire_limits lkv_wire_limits_default(void)
{
    lkv_wire_limits l = {.max_depth = LKV_WIRE_DEPTH_DEF, .max_fields = LKV_WIRE_FIELDS_DEF};
    return l;
}

size_t lkv_wire_varint_put(uint8_t *out, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

size_t lkv_wire_varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

int lkv_wire_varint(const uint8_t *buf, size_t len, size_t *pos, uint64_t *v)
{
    uint64_t x = 0;
    size_t p = *pos;
    for (unsigned i = 0; i < 10; i++) {
        if (p >= len) {
            return LKV_EPROTO; /* Truncated. */
        }
        uint8_t b = buf[p++];
        if (i == 9 && b > 1) {
            return LKV_EPROTO; /* Bits past 64, or an 11th byte announced. */
        }
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if ((b & 0x80) == 0) {
            *v = x;
            *pos = p;
            return 0;
        }
    }
    return LKV_EPROTO; /* Unreachable: the 10th byte is <= 1, so it ends the varint. */
}

/* Reads the record at *pos in base[0..end); on success fills *f and advances *pos. On failure
 * returns LKV_EPROTO with a static reason in *why and leaves *pos as it was. */
static int read_record(const uint8_t *base, size_t end, size_t *pos, lkv_wire_field *f,
                       const char **why)
{
    size_t p = *pos;
    uint64_t tag;
    if (lkv_wire_varint(base, end, &p, &tag) != 0) {
        *why = "truncated or overlong tag varint";
        return LKV_EPROTO;
    }
    if (p - *pos > 5 || tag > UINT32_MAX) {
        *why = "tag varint longer than 5 bytes";
        return LKV_EPROTO;
    }
    f->tag_off = *pos;
    f->number = (uint32_t)(tag >> 3);
    f->wire_type = (int)(tag & 7);
    if (f->number == 0 || f->number > LKV_WIRE_MAX_FIELD) {
        *why = "field number 0 or above 2^29-1";
        return LKV_EPROTO;
    }
    switch (f->wire_type) {
    case LKV_WIRE_VARINT: {
        size_t q = p;
        if (lkv_wire_varint(base, end, &q, &f->value) != 0) {
            *why = "truncated or overlong varint";
            return LKV_EPROTO;
        }
        f->off = p;
        f->len = q - p;
        p = q;
        break;
    }
    case LKV_WIRE_I64:
    case LKV_WIRE_I32: {
        size_t n = f->wire_type == LKV_WIRE_I64 ? 8 : 4;
        if (end - p < n) {
            *why = "fixed-width value past the end";
            return LKV_EPROTO;
        }
        uint64_t v = 0;
        for (size_t i = 0; i < n; i++) {
            v |= (uint64_t)base[p + i] << (8 * i);
        }
        f->value = v;
        f->off = p;
        f->len = n;
        p += n;
        break;
    }
    case LKV_WIRE_LEN: {
        uint64_t n;
        size_t lp = p;
        if (lkv_wire_varint(base, end, &p, &n) != 0) {
            *why = "truncated or overlong length varint";
            return LKV_EPROTO;
        }
        if (p - lp > 5) { /* protobuf-c reads at most 5 bytes of a length prefix. */
            *why = "length varint longer than 5 bytes";
            return LKV_EPROTO;
        }
        if (n > end - p) {
            *why = "length past the end of the message";
            return LKV_EPROTO;
        }
        f->value = n;
        f->off = p;
        f->len = (size_t)n;
        p += (size_t)n;
        break;
    }
    case 3:
    case 4:
        *why = "group wire type (3/4; not in proto3)";
        return LKV_EPROTO;
    default:
        *why = "invalid wire type (6/7)";
        return LKV_EPROTO;
    }
    *pos = p;
    return 0;
}

int lkv_wire_next(const uint8_t *buf, size_t len, size_t *pos, lkv_wire_field *f)
{
    if (*pos >= len) {
        return 0;
    }
    const char *why;
    if (read_record(buf, len, pos, f, &why) != 0) {
        return LKV_EPROTO;
    }
    return 1;
}

int lkv_wire_find(const uint8_t *buf, size_t len, uint32_t number, lkv_wire_field *f)
{
    size_t pos = 0;
    int rc;
    while ((rc = lkv_wire_next(buf, len, &pos, f)) == 1) {
        if (f->number == number) {
            return 1;
        }
    }
    return rc;
}

int lkv_wire_utf8_ok(const uint8_t *s, size_t n, size_t *bad)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c >= 0x01 && c < 0x80) {
            i++;
            continue;
        }
        size_t k;          /* Continuation bytes. */
        uint8_t lo = 0x80; /* Allowed range of the first continuation byte. */
        uint8_t hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) {
            k = 1;
        } else if (c >= 0xe0 && c <= 0xef) {
            k = 2;
            if (c == 0xe0) {
                lo = 0xa0; /* Overlong below U+0800. */
            } else if (c == 0xed) {
                hi = 0x9f; /* Surrogates U+D800..U+DFFF. */
            }
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3;
            if (c == 0xf0) {
                lo = 0x90; /* Overlong below U+10000. */
            } else if (c == 0xf4) {
                hi = 0x8f; /* Above U+10FFFF. */
            }
        } else {
            goto fail; /* NUL, a stray continuation byte, C0/C1, F5..FF. */
        }
        if (n - i - 1 < k) {
            goto fail;
        }
        for (size_t j = 1; j <= k; j++) {
            uint8_t b = s[i + j];
            if (b < (j == 1 ? lo : 0x80) || b > (j == 1 ? hi : 0xbf)) {
                goto fail;
            }
        }
        i += k + 1;
    }
    return 1;
fail:
    if (bad != NULL) {
        *bad = i;
    }
    return 0;
}

/* The wire type a non-packed value of type t uses. */
static int expected_wire_type(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
        return LKV_WIRE_I32;
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return LKV_WIRE_I64;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_BYTES:
    case PROTOBUF_C_TYPE_MESSAGE:
        return LKV_WIRE_LEN;
    default:
        return LKV_WIRE_VARINT;
    }
}

/* Checks the contents of a packed repeated field of element wire type ewt at [off, off+len). */
static int packed_ok(const uint8_t *base, size_t off, size_t len, int ewt)
{
    if (ewt == LKV_WIRE_I32) {
        return len % 4 == 0;
    }
    if (ewt == LKV_WIRE_I64) {
        return len % 8 == 0;
    }
    size_t p = off;
    while (p < off + len) {
        uint64_t v;
        if (lkv_wire_varint(base, off + len, &p, &v) != 0) {
            return 0;
        }
    }
    return 1;
}

static int bit_get(const uint64_t *bits, size_t i)
{
    return (int)((bits[i / 64] >> (i % 64)) & 1);
}

static void bit_set(uint64_t *bits, size_t i)
{
    bits[i / 64] |= (uint64_t)1 << (i % 64);
}

/* Scans the message of type desc at [start, end) of sc->base, at nesting depth `depth`. */
static int scan_msg(scan *sc, const ProtobufCMessageDescriptor *desc, size_t start, size_t end,
                    uint32_t depth)
{
    if (desc->n_fields > LKV_WIRE_MSG_FIELDS) {
        lkv_errf(sc->err, sc->errlen, 0, "%s declares %u fields, more than the scanner's %u",
                 desc->name, desc->n_fields, LKV_WIRE_MSG_FIELDS);
        return LKV_EINVAL;
    }
    uint64_t seen[LKV_WIRE_MSG_FIELDS / 64];
    uint32_t count[LKV_WIRE_MSG_FIELDS];
    memset(seen, 0, sizeof(seen));
    memset(count, 0, desc->n_fields * sizeof(count[0]));
    size_t pos = start;
    while (pos < end) {
        lkv_wire_field f;
        const char *why;
        size_t at = pos;
        if (read_record(sc->base, end, &pos, &f, &why) != 0) {
            lkv_errf(sc->err, sc->errlen, 0, "malformed %s at byte %zu: %s", desc->name, at, why);
            return LKV_EPROTO;
        }
        sc->n_fields++;
        if (sc->lim->max_fields != 0 && sc->n_fields > sc->lim->max_fields) {
            lkv_errf(sc->err, sc->errlen, 0,
                     "%s: more than %llu fields in one message (at byte %zu): refused", desc->name,
                     (unsigned long long)sc->lim->max_fields, at);
            return LKV_ETOOBIG;
        }
        const ProtobufCFieldDescriptor *fd =
            protobuf_c_message_descriptor_get_field(desc, f.number);
        if (fd == NULL) {
            continue; /* Unknown: skipped (proto3), but counted above. */
        }
        size_t idx = (size_t)(fd - desc->fields);
        int ewt = expected_wire_type(fd->type);
        int repeated = fd->label == PROTOBUF_C_LABEL_REPEATED;
        if (f.wire_type != ewt) {
            if (!(repeated && ewt != LKV_WIRE_LEN && f.wire_type == LKV_WIRE_LEN)) {
                lkv_errf(sc->err, sc->errlen, 0,
                         "malformed %s at byte %zu: field %u (%s) has wire type %d, expected %d",
                         desc->name, at, f.number, fd->name, f.wire_type, ewt);
                return LKV_EPROTO;
            }
            if (!packed_ok(sc->base, f.off, f.len, ewt)) {
                lkv_errf(sc->err, sc->errlen, 0,
                         "malformed %s at byte %zu: packed field %u (%s) does not hold whole "
                         "elements",
                         desc->name, at, f.number, fd->name);
                return LKV_EPROTO;
            }
        }
        if (!repeated) {
            if (bit_get(seen, idx)) {
                lkv_errf(sc->err, sc->errlen, 0,
                         "%s: field %u (%s) occurs more than once (again at byte %zu): refused",
                         desc->name, f.number, fd->name, at);
                return LKV_EPROTO;
            }
            if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
                for (unsigned j = 0; j < desc->n_fields; j++) {
                    const ProtobufCFieldDescriptor *o = &desc->fields[j];
                    if (j != idx && (o->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                        o->quantifier_offset == fd->quantifier_offset && bit_get(seen, j)) {
                        lkv_errf(sc->err, sc->errlen, 0,
                                 "%s: fields %s and %s of one oneof both set (at byte %zu): "
                                 "refused",
                                 desc->name, o->name, fd->name, at);
                        return LKV_EPROTO;
                    }
                }
            }
            bit_set(seen, idx);
        }
        if (fd->type == PROTOBUF_C_TYPE_STRING) {
            size_t bad;
            if (!lkv_wire_utf8_ok(sc->base + f.off, f.len, &bad)) {
                lkv_errf(sc->err, sc->errlen, 0,
                         "%s: string field %u (%s) is not NUL-free UTF-8 (byte %zu of %zu): "
                         "refused",
                         desc->name, f.number, fd->name, bad, f.len);
                return LKV_EPROTO;
            }
        }
        uint32_t occ = count[idx]++;
        if (sc->visit != NULL) {
            sc->ctx.msg = desc;
            sc->ctx.field = fd;
            sc->ctx.depth = depth;
            sc->ctx.occurrence = occ;
            int rc = sc->visit(sc->arg, &sc->ctx, &f);
            if (rc != 0) {
                return rc;
            }
        }
        if (fd->type == PROTOBUF_C_TYPE_MESSAGE) {
            if (depth + 1 > sc->lim->max_depth) {
                lkv_errf(sc->err, sc->errlen, 0,
                         "%s: sub-messages nested deeper than %u levels (field %s at byte %zu): "
                         "refused",
                         desc->name, sc->lim->max_depth, fd->name, at);
                return LKV_EPROTO;
            }
            sc->ctx.path[depth] = f.number;
            sc->ctx.index[depth] = occ;
            int rc = scan_msg(sc, fd->descriptor, f.off, f.off + f.len, depth + 1);
            if (rc != 0) {
                return rc;
            }
        }
    }
    return 0;
}

int lkv_wire_scan(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                  const lkv_wire_limits *lim, lkv_wire_visit_fn visit, void *arg,
                  uint64_t *n_fields, char *err, size_t errlen)
{
    lkv_wire_limits def = lkv_wire_limits_default();
    if (lim == NULL) {
        lim = &def;
    }
    if (desc == NULL || (buf == NULL && len > 0) || lim->max_depth == 0 ||
        lim->max_depth > LKV_WIRE_MAX_DEPTH) {
        lkv_errf(err, errlen, 0, "lkv_wire_scan: bad arguments");
        return LKV_EINVAL;
    }
    scan sc;
    memset(&sc, 0, sizeof(sc));
    sc.lim = lim;
    sc.visit = visit;
    sc.arg = arg;
    sc.base = buf;
    sc.err = err;
    sc.errlen = errlen;
    int rc = scan_msg(&sc, desc, 0, len, 0);
    if (n_fields != NULL) {
        *n_fields = sc.n_fields;
    }
    return rc;
}
