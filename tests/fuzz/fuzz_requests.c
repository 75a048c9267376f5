/*
 * fuzz_requests.c: libFuzzer target for every request decoder of lazykvd. The first input
 * byte picks the request type (every request message the daemon and the worker register: Cache
 * Put, Lookup, Get, Delete, Attach, Release, Reserve, Commit, Abort, Cluster; Admin Stats, List,
 * Evict, Hold, EvictClass; Health Check; Worker Generate); the rest is
 * the message, delivered as the server gets it: a grpc_byte_buffer (split into two slices at a
 * point the second byte picks, as the transport fragments big messages) through lkv_pb_unpack,
 * which runs the wire scanner and then protobuf-c.
 *
 * Oracles beyond "no crash, no sanitizer report":
 *   - a decoded message packs again and that packing decodes again (the daemon's replies and
 *     clients rely on canonical round trips), to the same packed bytes;
 *   - the scanner alone agrees with lkv_pb_unpack_bytes about acceptance, and every field
 *     range its visitor reports lies inside the input;
 *   - for PutRequest, the zero-copy decoder lazykvd runs (lkv_putwire), given the message in
 *     three pieces (cut at points the second and third bytes pick), accepts exactly what
 *     lkv_pb_unpack accepts, with the same header and the same block indices and payload bytes,
 *     each payload range mapping into the pieces.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>

#include "grpc/health/v1/health.pb-c.h"
#include "lazykv/v1/admin.pb-c.h"
#include "lazykv/v1/cache.pb-c.h"
#include "lazykv/v1/worker.pb-c.h"
#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_pb.h"
#include "lkv_putwire.h"
#include "lkv_wire.h"

static const ProtobufCMessageDescriptor *const requests[] = {
    &lazykv__v1__put_request__descriptor,      &lazykv__v1__lookup_request__descriptor,
    &lazykv__v1__get_request__descriptor,      &lazykv__v1__delete_request__descriptor,
    &lazykv__v1__attach_request__descriptor,   &lazykv__v1__release_request__descriptor,
    &lazykv__v1__stats_request__descriptor,    &lazykv__v1__list_request__descriptor,
    &lazykv__v1__evict_request__descriptor,    &grpc__health__v1__health_check_request__descriptor,
    &lazykv__v1__reserve_request__descriptor,  &lazykv__v1__commit_request__descriptor,
    &lazykv__v1__abort_request__descriptor,    &lazykv__v1__cluster_request__descriptor,
    &lazykv__v1__hold_request__descriptor,     &lazykv__v1__evict_class_request__descriptor,
    &lazykv__v1__generate_request__descriptor,
};
#define N_REQUESTS (sizeof(requests) / sizeof(requests[0]))

typedef struct bounds {
    size_t len;
} bounds;

static int visit(void *arg, const lkv_wire_ctx *w, const lkv_wire_field *f)
{
    const bounds *b = arg;
    if (f->off > b->len || f->len > b->len - f->off || f->tag_off >= f->off ||
        w->depth > LKV_WIRE_DEPTH_DEF) {
        abort(); /* A range outside the input: a scanner bug. */
    }
    return 0;
}

/* The lkv_putwire oracle (see the top): aborts on any disagreement with m (NULL: refused). */
static void putwire_check(const uint8_t *msg, size_t n, size_t split, size_t split2,
                          const ProtobufCMessage *m)
{
    size_t a = split, b = split2 % (n - a + 1);
    struct iovec seg[3] = {
        {(void *)msg, a}, {(void *)(msg + a), b}, {(void *)(msg + a + b), n - a - b}};
    lkv_putwire w;
    char err[256];
    int rc = lkv_putwire_decode(seg, 3, &w, err, sizeof(err));
    if ((rc == 0) != (m != NULL)) {
        abort(); /* The Put decoder and protobuf-c disagree about acceptance. */
    }
    if (rc != 0) {
        return;
    }
    const Lazykv__V1__PutRequest *req = (const Lazykv__V1__PutRequest *)m;
    if ((w.header != NULL) != (req->header != NULL) || w.n_blocks != req->n_blocks) {
        abort();
    }
    if (w.header != NULL) {
        size_t l1 = protobuf_c_message_get_packed_size(&w.header->base);
        size_t l2 = protobuf_c_message_get_packed_size(&req->header->base);
        uint8_t *p1 = malloc(l1 + 1), *p2 = malloc(l2 + 1);
        protobuf_c_message_pack(&w.header->base, p1);
        protobuf_c_message_pack(&req->header->base, p2);
        if (l1 != l2 || memcmp(p1, p2, l1) != 0) {
            abort();
        }
        free(p1);
        free(p2);
    }
    for (size_t i = 0; i < w.n_blocks; i++) {
        const Lazykv__V1__Block *blk = req->blocks[i];
        if (w.blocks[i].index != blk->index || w.blocks[i].len != blk->data.len ||
            w.blocks[i].off > n || w.blocks[i].len > n - w.blocks[i].off) {
            abort();
        }
        struct iovec parts[3];
        size_t np = lkv_putwire_iov(seg, 3, w.blocks[i].off, w.blocks[i].len, parts, 3);
        size_t off = 0;
        if (np > 3) {
            abort(); /* A range over three pieces needs at most three parts. */
        }
        for (size_t j = 0; j < np; j++) {
            if (memcmp(parts[j].iov_base, blk->data.data + off, parts[j].iov_len) != 0) {
                abort();
            }
            off += parts[j].iov_len;
        }
        if (off != w.blocks[i].len) {
            abort();
        }
    }
    lkv_putwire_free(&w);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    grpc_init();
    lkv_log_set_level(LKV_LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) {
        return 0;
    }
    const ProtobufCMessageDescriptor *desc = requests[data[0] % N_REQUESTS];
    size_t split = data[1];
    const uint8_t *msg = data + 2;
    size_t n = size - 2;
    split = n > 0 ? split % (n + 1) : 0;

    grpc_slice parts[2] = {grpc_slice_from_copied_buffer((const char *)msg, split),
                           grpc_slice_from_copied_buffer((const char *)msg + split, n - split)};
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(parts, 2);
    grpc_slice_unref(parts[0]);
    grpc_slice_unref(parts[1]);
    char err[512];
    ProtobufCMessage *m = NULL;
    int rc = lkv_pb_unpack(desc, bb, 64u << 20, &m, err, sizeof(err));
    grpc_byte_buffer_destroy(bb);

    if (desc == &lazykv__v1__put_request__descriptor) {
        putwire_check(msg, n, split, (size_t)data[1] * 131 + n / 3, rc == 0 ? m : NULL);
    }
    bounds b = {n};
    int scan = lkv_wire_scan(desc, msg, n, NULL, visit, &b, NULL, err, sizeof(err));
    if ((scan == 0) != (rc == 0)) {
        abort(); /* Scanner accepted what protobuf-c refused, or the reverse. */
    }
    if (rc != 0) {
        return 0;
    }
    /* Round trip: pack, decode again, pack again: the same bytes. */
    size_t n1 = protobuf_c_message_get_packed_size(m);
    uint8_t *p1 = malloc(n1 + 1);
    if (protobuf_c_message_pack(m, p1) != n1) {
        abort();
    }
    ProtobufCMessage *m2 = NULL;
    if (lkv_pb_unpack_bytes(desc, p1, n1, &m2, err, sizeof(err)) != 0) {
        abort(); /* Our own packing of an accepted message is refused. */
    }
    size_t n2 = protobuf_c_message_get_packed_size(m2);
    uint8_t *p2 = malloc(n2 + 1);
    if (protobuf_c_message_pack(m2, p2) != n2 || n2 != n1 || memcmp(p1, p2, n1) != 0) {
        abort();
    }
    free(p1);
    free(p2);
    lkv_pb_free(m2);
    lkv_pb_free(m);
    return 0;
}
