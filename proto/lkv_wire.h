/*
 * lkv_wire.h: a linear-time protobuf wire-format scanner, driven by protobuf-c's message
 * descriptors. It runs before protobuf-c sees a request (lkv_pb_unpack) so that decoding cost
 * is linear in the message size, and it is the base of zero-copy decoders that want the byte
 * range of a field without copying it (a Put decoder that finds each block's payload in place).
 *
 * Why. protobuf-c 1.4 merges repeated occurrences of a singular message field, at a cost that
 * grows with the square of their count (a 2.6 MB DeleteRequest repeating its `doc` field 80,000
 * times holds a thread for about 40 s). It also accepts strings with embedded NULs (C users then
 * see a truncated string) and never checks UTF-8. The scanner refuses all of these up front.
 *
 * Wire format (https://protobuf.dev/programming-guides/encoding/): a message is a sequence of
 * records, each a tag varint (field_number << 3 | wire_type) then a value:
 *
 *     wire type  name     value                                 lkv_wire_scan checks
 *     0          VARINT   1..10 bytes, 7 bits each, LSB first   <= 10 bytes, 10th byte <= 1
 *     1          I64      8 bytes little-endian                 8 bytes remain
 *     2          LEN      length varint, then that many bytes   length <= bytes remaining
 *     3, 4       groups   (proto2 only)                         refused
 *     5          I32      4 bytes little-endian                 4 bytes remain
 *     6, 7       -        invalid                               refused
 *
 * What lkv_wire_scan refuses (each a one-line reason in err), besides the table above:
 *   - field number 0 or above 2^29 - 1, or a tag varint longer than 5 bytes;
 *   - a known field whose wire type disagrees with its descriptor (a repeated scalar numeric
 *     field may also come packed, as LEN, whose contents must be whole elements);
 *   - a singular field (scalar, string, bytes or message; LABEL_NONE, OPTIONAL or REQUIRED) that
 *     occurs more than once in one message, or two members of one oneof (proto3 says "last one
 *     wins" / "merge"; lazykv's clients never send either, and protobuf-c's merge is quadratic);
 *   - a string field with an embedded NUL or invalid UTF-8 (overlong forms, surrogates, code
 *     points above U+10FFFF, truncated sequences); bytes fields may hold anything;
 *   - sub-messages nested deeper than limits.max_depth;
 *   - more than limits.max_fields records in the whole message tree, unknown fields included.
 * Unknown fields (numbers the descriptor lacks) are skipped, as proto3 says, after their wire
 * format is checked, and they count towards max_fields.
 *
 * Cost: every byte is read once by the message that directly contains it (a sub-message's
 * bytes are skipped by its parent and walked by the recursive call), so a scan is O(len) time
 * plus O(log n_fields) per record for the descriptor look-up; memory is one stack frame of
 * about 1.1 KiB per nesting level (at most max_depth + 1), and no allocation at all. Message
 * types with more than LKV_WIRE_MSG_FIELDS fields are refused with LKV_EINVAL (lazykv's
 * largest has 9).
 *
 * Offsets. Every offset this module reports counts from the start of the buffer passed to
 * lkv_wire_scan (or to lkv_wire_next / lkv_wire_find: from their `buf`), so a caller holding the
 * whole request slice can point into it without copying.
 */
#ifndef LKV_WIRE_H
#define LKV_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

enum lkv_wire_type {
    LKV_WIRE_VARINT = 0,
    LKV_WIRE_I64 = 1,
    LKV_WIRE_LEN = 2,
    LKV_WIRE_I32 = 5,
};

#define LKV_WIRE_MAX_FIELD  536870911u /* 2^29 - 1, the largest field number. */
#define LKV_WIRE_MAX_DEPTH  64         /* Upper bound on limits.max_depth. */
#define LKV_WIRE_PATH_MAX   LKV_WIRE_MAX_DEPTH
#define LKV_WIRE_DEPTH_DEF  16         /* lkv_pb_unpack's nesting bound (lazykv's is 3). */
#define LKV_WIRE_FIELDS_DEF (1u << 22) /* lkv_pb_unpack's record bound: 4 Mi records. */
#define LKV_WIRE_MSG_FIELDS 256        /* Most fields one message type may declare. */

typedef struct lkv_wire_limits {
    uint32_t max_depth;  /* Sub-message nesting allowed below the top message (1..64). */
    uint64_t max_fields; /* Records in the whole tree, unknown ones included (0: no limit). */
} lkv_wire_limits;

/* One record, as lkv_wire_next and the lkv_wire_scan visitor see it. */
typedef struct lkv_wire_field {
    uint32_t number; /* Field number (1..2^29-1). */
    int wire_type;   /* enum lkv_wire_type. */
    size_t tag_off;  /* Offset of the record's first (tag) byte. */
    size_t off;      /* Offset of the value: the payload after the length for LEN, the first
                      * byte of the varint / fixed value otherwise. */
    size_t len;      /* Bytes of the value (payload bytes for LEN). */
    uint64_t value;  /* VARINT: the decoded value; I32/I64: the little-endian value; LEN: len. */
} lkv_wire_field;

/* Where a record sits in the message tree, for the lkv_wire_scan visitor. */
typedef struct lkv_wire_ctx {
    const ProtobufCMessageDescriptor *msg; /* The message type holding the record (borrowed). */
    const ProtobufCFieldDescriptor *field; /* The record's field (borrowed; NULL: unknown). */
    uint32_t depth;                        /* 0 for a field of the top message. */
    /* path[0..depth) are the field numbers of the enclosing sub-messages from the top, and
     * index[0..depth) the occurrence of each among its parent's records of that number (0 for
     * singular fields; the element index for repeated ones: blocks[3] has index 3). */
    uint32_t path[LKV_WIRE_PATH_MAX];
    uint32_t index[LKV_WIRE_PATH_MAX];
    uint32_t occurrence; /* This record's occurrence index among its message's records of the
                          * same number (the repeated element index; 0 for singular fields). */
} lkv_wire_ctx;

/* Called by lkv_wire_scan for every KNOWN field record, in wire order, parents before their
 * sub-messages' records (pre-order). A LEN message field is reported, then its contents. A
 * packed repeated field is one record (its elements are not reported one by one). Both
 * pointers are borrowed for the call. Return 0 to go on, or a negative LKV_E* code to stop the
 * scan: lkv_wire_scan then returns that code (err untouched). */
typedef int (*lkv_wire_visit_fn)(void *arg, const lkv_wire_ctx *where, const lkv_wire_field *f);

/* The limits lkv_pb_unpack applies: max_depth LKV_WIRE_DEPTH_DEF, max_fields
 * LKV_WIRE_FIELDS_DEF. */
lkv_wire_limits lkv_wire_limits_default(void);

/* Checks that buf[0..len) is a valid encoding of message type desc under the rules above.
 * @param[in] desc   the top message's descriptor (borrowed), e.g.
 *                   &lazykv__v1__delete_request__descriptor.
 * @param[in] buf    borrowed; not modified; may be NULL when len is 0.
 * @param[in] lim    borrowed; NULL means lkv_wire_limits_default().
 * @param[in] visit  optional (NULL: validate only); see lkv_wire_visit_fn.
 * @param[in] arg    passed to visit (borrowed).
 * @param[out] n_fields optional: records seen (also when refused: those seen until then).
 * @param[out] err   optional: the reason on error, NUL-terminated, errlen bytes: names the
 *                   message type, the field and the byte offset.
 * Returns 0; LKV_EPROTO for a malformed or refused message; LKV_ETOOBIG when max_fields is
 * exceeded; LKV_EINVAL for bad arguments (max_depth 0 or above LKV_WIRE_MAX_DEPTH); or the
 * visitor's code. */
int lkv_wire_scan(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                  const lkv_wire_limits *lim, lkv_wire_visit_fn visit, void *arg,
                  uint64_t *n_fields, char *err, size_t errlen);

/* Low-level iterator over the records of ONE message level, without a descriptor: reads the
 * record at *pos in buf[0..len), fills *f (offsets from buf) and advances *pos past it.
 * For a message already checked by lkv_wire_scan this cannot fail; use it to walk a message's
 * fields, and then a LEN field's payload buf + f.off, f.len as a sub-message (add f.off to the
 * sub-message's offsets to count from the outer buffer).
 * Returns 1 with a record, 0 at the end (*pos == len), LKV_EPROTO for a malformed record
 * (*pos then unchanged). */
int lkv_wire_next(const uint8_t *buf, size_t len, size_t *pos, lkv_wire_field *f);

/* The first record of field `number` at the top level of buf[0..len) (a singular field of a
 * scanned message occurs at most once). Returns 1 and fills *f, 0 if absent, LKV_EPROTO if a
 * record before it is malformed. Example, the payload of PutRequest.blocks[i].data in place:
 *
 *     size_t pos = 0; lkv_wire_field b, d;
 *     while (lkv_wire_next(buf, len, &pos, &b) == 1) {       // PutRequest records
 *         if (b.number != 2) continue;                        // blocks = 2
 *         if (lkv_wire_find(buf + b.off, b.len, 2, &d) == 1)  // Block.data = 2
 *             use(buf + b.off + d.off, d.len);                // no copy
 *     }
 */
int lkv_wire_find(const uint8_t *buf, size_t len, uint32_t number, lkv_wire_field *f);

/* Reads one varint at buf[*pos..len) (at most 10 bytes, the 10th <= 1) into *v and advances
 * *pos. Returns 0, or LKV_EPROTO if truncated or overlong (*pos unchanged). */
int lkv_wire_varint(const uint8_t *buf, size_t len, size_t *pos, uint64_t *v);

/* Writes v as a varint at out (room for 10 bytes) and returns its length (1..10), the bytes
 * protobuf-c writes; lkv_wire_varint_len says that length without writing. For code that frames
 * messages by hand (zero-copy Put and Get). */
size_t lkv_wire_varint_put(uint8_t *out, uint64_t v);
size_t lkv_wire_varint_len(uint64_t v);

/* 1 if s[0..n) is valid UTF-8 (RFC 3629: no overlong forms, no surrogates, <= U+10FFFF) with
 * no NUL byte; else 0, with the offset of the first bad byte in *bad (optional). */
int lkv_wire_utf8_ok(const uint8_t *s, size_t n, size_t *bad);

#endif
