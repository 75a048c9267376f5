/*
 * lkv_pb.c: protobuf-c <-> grpc_byte_buffer (see lkv_pb.h).
 *
 * Ownership rules of gRPC core 1.51 honoured here (DESIGN.md 9.2, 9.3):
 *   - grpc_raw_byte_buffer_create takes its own reference on the slice, so ours is dropped.
 *   - grpc_byte_buffer_reader_init returns 0 on failure (bad compressed payload); the reader is
 *     destroyed on every path after a successful init; readall returns a slice we must unref.
 * Every message taken off the wire goes through lkv_pb_unpack_bytes, which runs the wire
 * scanner (lkv_wire.h) before protobuf-c: that is what keeps decoding linear in the size.
 */
#include "lkv_pb.h"

#include <stdio.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

#include "lkv_err.h"
#include "lkv_wire.h"

int lkv_pb_pack(const ProtobufCMessage *msg, size_t max_bytes, grpc_byte_buffer **out, char *err,
                size_t errlen)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    if (max_bytes != 0 && n > max_bytes) {
        lkv_errf(err, errlen, 0, "%s message is %zu bytes, over the %zu-byte message limit",
                 msg->descriptor->name, n, max_bytes);
        return LKV_ETOOBIG;
    }
    grpc_slice s = grpc_slice_malloc(n);
    size_t packed = protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    (void)packed;
    /* protobuf-c packs exactly get_packed_size bytes; a mismatch is a protobuf-c bug. */
    if (packed != n) {
        grpc_slice_unref(s);
        lkv_errf(err, errlen, 0, "%s: packed %zu bytes, expected %zu", msg->descriptor->name,
                 packed, n);
        return LKV_EINTERNAL;
    }
    *out = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return 0;
}

int lkv_pb_unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb, size_t max_bytes,
                  ProtobufCMessage **out, char *err, size_t errlen)
{
    if (bb == NULL) {
        lkv_errf(err, errlen, 0, "no %s message", desc->name);
        return LKV_EPROTO;
    }
    size_t len = grpc_byte_buffer_length(bb);
    if (max_bytes != 0 && len > max_bytes) {
        lkv_errf(err, errlen, 0, "%s message is %zu bytes, over the %zu-byte message limit",
                 desc->name, len, max_bytes);
        return LKV_ETOOBIG;
    }
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb)) {
        lkv_errf(err, errlen, 0, "cannot read the %s message (bad compressed payload?)",
                 desc->name);
        return LKV_EPROTO;
    }
    grpc_slice s = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    int rc =
        lkv_pb_unpack_bytes(desc, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), out, err, errlen);
    grpc_slice_unref(s);
    return rc;
}

int lkv_pb_unpack_bytes(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                        ProtobufCMessage **out, char *err, size_t errlen)
{
    /* The scanner first: protobuf-c then only ever sees messages it decodes in linear time. */
    lkv_wire_limits lim = lkv_wire_limits_default();
    int rc = lkv_wire_scan(desc, buf, len, &lim, NULL, NULL, NULL, err, errlen);
    if (rc != 0) {
        return rc;
    }
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, buf);
    if (m == NULL) {
        lkv_errf(err, errlen, 0, "malformed %s message (%zu bytes): not a valid protobuf encoding",
                 desc->name, len);
        return LKV_EPROTO;
    }
    *out = m;
    return 0;
}

void lkv_pb_free(ProtobufCMessage *msg)
{
    if (msg != NULL) {
        protobuf_c_message_free_unpacked(msg, NULL);
    }
}
