/*
 * test_pb.c: proto/lkv_pb (protobuf-c <-> grpc_byte_buffer): round trips through single- and
 * multi-slice buffers, the size limits on both sides, malformed and missing messages.
 */
#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>

#include "lazykv/v1/cache.pb-c.h"
#include "lkv_pb.h"
#include "lkv_test.h"

static char err[256];

static void test_round_trip(void)
{
    uint32_t toks[5] = {1, 2, 3, 511, 0};
    uint8_t data[100];
    for (int i = 0; i < 100; i++) {
        data[i] = (uint8_t)(i * 7);
    }
    Lazykv__V1__PutHeader h = LAZYKV__V1__PUT_HEADER__INIT;
    h.profile = "stories260k";
    h.n_token_ids = 5;
    h.token_ids = toks;
    h.n_blocks = 1;
    Lazykv__V1__Block b = LAZYKV__V1__BLOCK__INIT;
    b.index = 7;
    b.data.data = data;
    b.data.len = sizeof(data);
    Lazykv__V1__Block *bp = &b;
    Lazykv__V1__PutRequest req = LAZYKV__V1__PUT_REQUEST__INIT;
    req.header = &h;
    req.n_blocks = 1;
    req.blocks = &bp;

    grpc_byte_buffer *bb = NULL;
    ASSERT_OK(lkv_pb_pack(&req.base, 0, &bb, err, sizeof(err)));
    ASSERT_TRUE(bb != NULL);
    ProtobufCMessage *m = NULL;
    ASSERT_OK(
        lkv_pb_unpack(&lazykv__v1__put_request__descriptor, bb, 1 << 20, &m, err, sizeof(err)));
    grpc_byte_buffer_destroy(bb); /* The message does not borrow from the buffer. */
    Lazykv__V1__PutRequest *r = (Lazykv__V1__PutRequest *)m;
    ASSERT_TRUE(r->header != NULL);
    ASSERT_TRUE(strcmp(r->header->profile, "stories260k") == 0);
    ASSERT_EQ(r->header->n_token_ids, 5);
    ASSERT_EQ(r->header->token_ids[3], 511);
    ASSERT_EQ(r->header->n_blocks, 1);
    ASSERT_EQ(r->n_blocks, 1);
    ASSERT_EQ(r->blocks[0]->index, 7);
    ASSERT_EQ(r->blocks[0]->data.len, 100);
    ASSERT_TRUE(memcmp(r->blocks[0]->data.data, data, 100) == 0);
    lkv_pb_free(m);
    lkv_pb_free(NULL);
}

/* A message split over several slices (as the transport delivers big ones) unpacks the same. */
static void test_fragmented_buffer(void)
{
    uint8_t data[5000];
    for (int i = 0; i < 5000; i++) {
        data[i] = (uint8_t)(i ^ (i >> 8));
    }
    Lazykv__V1__Block b = LAZYKV__V1__BLOCK__INIT;
    b.index = 3;
    b.data.data = data;
    b.data.len = sizeof(data);
    size_t n = protobuf_c_message_get_packed_size(&b.base);
    uint8_t *buf = malloc(n);
    protobuf_c_message_pack(&b.base, buf);
    grpc_slice parts[3];
    size_t cut1 = 3, cut2 = n / 2;
    parts[0] = grpc_slice_from_copied_buffer((const char *)buf, cut1);
    parts[1] = grpc_slice_from_copied_buffer((const char *)buf + cut1, cut2 - cut1);
    parts[2] = grpc_slice_from_copied_buffer((const char *)buf + cut2, n - cut2);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(parts, 3);
    for (int i = 0; i < 3; i++) {
        grpc_slice_unref(parts[i]);
    }
    ProtobufCMessage *m = NULL;
    ASSERT_OK(lkv_pb_unpack(&lazykv__v1__block__descriptor, bb, 0, &m, err, sizeof(err)));
    Lazykv__V1__Block *r = (Lazykv__V1__Block *)m;
    ASSERT_EQ(r->index, 3);
    ASSERT_EQ(r->data.len, 5000);
    ASSERT_TRUE(memcmp(r->data.data, data, 5000) == 0);
    lkv_pb_free(m);
    grpc_byte_buffer_destroy(bb);
    free(buf);
}

static void test_limits(void)
{
    uint8_t data[2000] = {0};
    Lazykv__V1__Block b = LAZYKV__V1__BLOCK__INIT;
    b.data.data = data;
    b.data.len = sizeof(data);
    grpc_byte_buffer *bb = NULL;
    ASSERT_ERR(lkv_pb_pack(&b.base, 1000, &bb, err, sizeof(err)), LKV_ETOOBIG);
    ASSERT_TRUE(bb == NULL);
    ASSERT_TRUE(strstr(err, "lazykv.v1.Block") != NULL);
    ASSERT_TRUE(strstr(err, "1000") != NULL);
    ASSERT_OK(lkv_pb_pack(&b.base, 4000, &bb, err, sizeof(err)));
    ProtobufCMessage *m = NULL;
    ASSERT_ERR(lkv_pb_unpack(&lazykv__v1__block__descriptor, bb, 1000, &m, err, sizeof(err)),
               LKV_ETOOBIG);
    ASSERT_TRUE(m == NULL);
    ASSERT_TRUE(strstr(err, "limit") != NULL);
    ASSERT_OK(lkv_pb_unpack(&lazykv__v1__block__descriptor, bb, 4000, &m, err, sizeof(err)));
    lkv_pb_free(m);
    grpc_byte_buffer_destroy(bb);
}

static void test_malformed(void)
{
    /* Field 2 (bytes) claims 100 bytes but 2 follow; then a bad wire type 7. */
    static const char *bad[] = {"\x12\x64\x01\x02", "\x0f", "\xff\xff\xff\xff\xff\xff"};
    static const size_t len[] = {4, 1, 6};
    for (int i = 0; i < 3; i++) {
        grpc_slice s = grpc_slice_from_copied_buffer(bad[i], len[i]);
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        ProtobufCMessage *m = NULL;
        ASSERT_ERR(lkv_pb_unpack(&lazykv__v1__block__descriptor, bb, 0, &m, err, sizeof(err)),
                   LKV_EPROTO);
        ASSERT_TRUE(m == NULL);
        ASSERT_TRUE(strstr(err, "malformed lazykv.v1.Block") != NULL);
        grpc_byte_buffer_destroy(bb);
    }
    ProtobufCMessage *m = NULL;
    ASSERT_ERR(lkv_pb_unpack(&lazykv__v1__block__descriptor, NULL, 0, &m, err, sizeof(err)),
               LKV_EPROTO);
    ASSERT_TRUE(strstr(err, "no lazykv.v1.Block message") != NULL);
    /* An empty buffer is a valid, all-default message. */
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(NULL, 0);
    ASSERT_OK(lkv_pb_unpack(&lazykv__v1__block__descriptor, bb, 0, &m, NULL, 0));
    ASSERT_EQ(((Lazykv__V1__Block *)m)->data.len, 0);
    lkv_pb_free(m);
    grpc_byte_buffer_destroy(bb);
}

int main(void)
{
    grpc_init();
    LKV_RUN(test_round_trip);
    LKV_RUN(test_fragmented_buffer);
    LKV_RUN(test_limits);
    LKV_RUN(test_malformed);
    grpc_shutdown();
    return 0;
}
