/*
 * lkv_pb.h: the thin glue between protobuf-c messages and gRPC core byte buffers, shared by the
 * daemon (daemon/lkv_server.c) and the client library (client/). No other gRPC or protobuf-c
 * plumbing is needed to put a message on the wire or take one off it.
 *
 * Sending: lkv_pb_pack packs a message into one freshly allocated slice wrapped in a new raw
 * grpc_byte_buffer. Receiving: lkv_pb_unpack reads a (possibly fragmented or compressed) byte
 * buffer into one contiguous slice, checks it with the wire scanner (lkv_wire.h: linear time,
 * refuses repeated singular fields and non-UTF-8 strings) and unpacks it with protobuf-c, which
 * copies bytes fields, so the result does not borrow from the buffer.
 *
 * Both enforce a byte limit (the same max_message_bytes the channel/server was created with), so
 * an oversize message is a clear LKV_ETOOBIG, never an allocation of attacker-chosen size.
 * Errors carry a one-line, human-readable reason in err (naming the message type and sizes),
 * suitable for a gRPC status message.
 */
#ifndef LKV_PB_H
#define LKV_PB_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/byte_buffer.h>
#include <protobuf-c/protobuf-c.h>

/* Packs msg into a new byte buffer.
 * @param[in]  msg        borrowed; not modified.
 * @param[in]  max_bytes  refuse a packed size above this (0: no limit).
 * @param[out] out        on success a new buffer, owned by the caller: pass it to a SEND_MESSAGE
 *                        op and grpc_byte_buffer_destroy it after that batch completes (or
 *                        right away if it is never sent). Untouched on error.
 * @param[out] err        optional (may be NULL): reason on error, NUL-terminated, errlen bytes.
 * Returns 0, or LKV_ETOOBIG if the packed size exceeds max_bytes. */
int lkv_pb_pack(const ProtobufCMessage *msg, size_t max_bytes, grpc_byte_buffer **out, char *err,
                size_t errlen);

/* Unpacks bb as a message of type desc.
 * @param[in]  desc       the generated descriptor, e.g. &lazykv__v1__put_request__descriptor.
 * @param[in]  bb         borrowed; not modified or destroyed (the caller still owns it).
 *                        NULL is refused with LKV_EPROTO ("no message").
 * @param[in]  max_bytes  refuse a buffer longer than this (0: no limit).
 * @param[out] out        on success a new message owned by the caller, freed with
 *                        lkv_pb_free(). Untouched on error.
 * @param[out] err        optional: reason on error, NUL-terminated, errlen bytes.
 * Returns 0; LKV_ETOOBIG if bb is longer than max_bytes; LKV_EPROTO if the buffer cannot be
 * read (e.g. a bad compressed payload) or is not a valid encoding of desc's message. */
int lkv_pb_unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb, size_t max_bytes,
                  ProtobufCMessage **out, char *err, size_t errlen);

/* The decode step of lkv_pb_unpack on a contiguous buffer (the one path every received message
 * takes; the fuzzers call it too): lkv_wire_scan with lkv_wire_limits_default() (refuses
 * repeated singular fields, bad UTF-8 or NULs in strings, deep nesting, malformed records;
 * lkv_wire.h), then protobuf_c_message_unpack.
 * @param[in]  buf  borrowed; not modified; the message does not borrow from it.
 * @param[out] out  on success a new message owned by the caller (lkv_pb_free). Untouched on
 *                  error.
 * Returns 0, LKV_EPROTO (malformed or refused; err says where and why), or LKV_ETOOBIG (over
 * the scanner's record bound). */
int lkv_pb_unpack_bytes(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                        ProtobufCMessage **out, char *err, size_t errlen);

/* Frees a message returned by lkv_pb_unpack (NULL is a no-op). */
void lkv_pb_free(ProtobufCMessage *msg);

#endif
