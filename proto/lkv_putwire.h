/*
 * lkv_putwire.h: the zero-copy decoder of one Put stream message (lazykv.v1.PutRequest), over
 * the received bytes in as many pieces as the transport delivered them.
 *
 * Why. lkv_pb_unpack flattens a received gRPC message into one slice (readall: a copy) and
 * protobuf-c then copies every Block.data into its own allocation; the store copies it a third
 * time into the arena. This decoder finds each block's payload where it lies, in the received
 * slices, so the store copies it once, straight into the arena (lkv_store_put_blockv).
 *
 * What it accepts is exactly what lkv_pb_unpack accepts for PutRequest (tests/fuzz/
 * fuzz_requests.c checks the two against each other on every input, with the message split
 * across pieces): the rules of the wire scanner (lkv_wire.h) for PutRequest and Block, done here
 * record by record across piece boundaries with lkv_wire_varint on at most 10 copied bytes:
 *   - tags: at most 5 bytes, field number 1..2^29-1, wire types 0, 1, 2, 5 only;
 *   - varints at most 10 bytes (the 10th <= 1), LEN lengths within the enclosing message;
 *   - PutRequest.header (1, LEN, once) and PutRequest.blocks (2, LEN, repeated);
 *     Block.index (1, VARINT, once; the low 32 bits, as protobuf-c) and Block.data (2, LEN,
 *     once); unknown fields skipped after their wire format is checked;
 *   - at most LKV_WIRE_FIELDS_DEF records in all (LKV_ETOOBIG beyond).
 * The header (small: profile, token ids, options) is gathered into one buffer and decoded by
 * lkv_pb_unpack_bytes (scanner + protobuf-c), so its own rules (UTF-8 strings, packed ids) are
 * the scanner's.
 *
 * Offsets: a block's payload is reported as (off, len) in the logical message (piece 0's first
 * byte is offset 0); lkv_putwire_iov maps such a range onto the pieces.
 */
#ifndef LKV_PUTWIRE_H
#define LKV_PUTWIRE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "lazykv/v1/cache.pb-c.h"

typedef struct lkv_putwire_block {
    uint32_t index; /* Block.index (0 if absent). */
    size_t off;     /* Block.data: first payload byte, logical offset in the message. */
    size_t len;     /* Payload bytes (0 if absent). */
} lkv_putwire_block;

typedef struct lkv_putwire {
    Lazykv__V1__PutHeader *header; /* Owned (lkv_putwire_free), NULL if the message has none. */
    lkv_putwire_block *blocks;     /* Owned: n_blocks entries, in wire order. */
    size_t n_blocks;
    size_t cap; /* Allocated entries of blocks. */
} lkv_putwire;

/* Decodes one PutRequest given as n_seg pieces (borrowed; read only; pieces of length 0 are
 * fine) into *out (caller-owned, overwritten; free it with lkv_putwire_free on every return).
 * Returns 0; LKV_EPROTO for a malformed or refused message (err names the field and offset);
 * LKV_ETOOBIG over the record bound. Nothing of the input is copied except the header's bytes
 * when they span pieces. */
int lkv_putwire_decode(const struct iovec *seg, size_t n_seg, lkv_putwire *out, char *err,
                       size_t errlen);

/* Frees what lkv_putwire_decode allocated in *w and zeroes it (safe on a zeroed struct). */
void lkv_putwire_free(lkv_putwire *w);

/* Maps the logical range [off, off + len) of the message in seg[0..n_seg) onto the pieces:
 * writes up to cap entries to out (pointers into the pieces: borrowed like seg) and returns
 * how many the range needs (more than cap: call again with a bigger out), 0 for len 0.
 * The range must lie inside the message (as lkv_putwire_decode reports them). */
size_t lkv_putwire_iov(const struct iovec *seg, size_t n_seg, size_t off, size_t len,
                       struct iovec *out, size_t cap);

#endif
