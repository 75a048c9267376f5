/*
 * test_status.c: the one LKV_* -> gRPC status mapping of the daemon's RPC edge
 * (lkv_server_status_code) and the status names.
 */
#include <grpc/status.h>

#include "lkv_server.h"
#include "lkv_test.h"

static void test_mapping(void)
{
    ASSERT_EQ(lkv_server_status_code(LKV_OK), GRPC_STATUS_OK);
    ASSERT_EQ(lkv_server_status_code(LKV_EINVAL), GRPC_STATUS_INVALID_ARGUMENT);
    ASSERT_EQ(lkv_server_status_code(LKV_EPROTO), GRPC_STATUS_INVALID_ARGUMENT);
    ASSERT_EQ(lkv_server_status_code(LKV_EPROFILE), GRPC_STATUS_INVALID_ARGUMENT);
    ASSERT_EQ(lkv_server_status_code(LKV_ENOTFOUND), GRPC_STATUS_NOT_FOUND);
    ASSERT_EQ(lkv_server_status_code(LKV_EEXIST), GRPC_STATUS_ALREADY_EXISTS);
    ASSERT_EQ(lkv_server_status_code(LKV_ENOSPC), GRPC_STATUS_RESOURCE_EXHAUSTED);
    ASSERT_EQ(lkv_server_status_code(LKV_ETOOBIG), GRPC_STATUS_RESOURCE_EXHAUSTED);
    ASSERT_EQ(lkv_server_status_code(LKV_ENOMEM), GRPC_STATUS_RESOURCE_EXHAUSTED);
    ASSERT_EQ(lkv_server_status_code(LKV_EBUSY), GRPC_STATUS_FAILED_PRECONDITION);
    ASSERT_EQ(lkv_server_status_code(LKV_ETIMEDOUT), GRPC_STATUS_DEADLINE_EXCEEDED);
    ASSERT_EQ(lkv_server_status_code(LKV_ECANCELLED), GRPC_STATUS_CANCELLED);
    ASSERT_EQ(lkv_server_status_code(LKV_EUNAUTH), GRPC_STATUS_UNAUTHENTICATED);
    ASSERT_EQ(lkv_server_status_code(LKV_EPERM), GRPC_STATUS_PERMISSION_DENIED);
    ASSERT_EQ(lkv_server_status_code(LKV_EUNAVAIL), GRPC_STATUS_UNAVAILABLE);
    ASSERT_EQ(lkv_server_status_code(LKV_ESHUTDOWN), GRPC_STATUS_UNAVAILABLE);
    ASSERT_EQ(lkv_server_status_code(LKV_EAGAIN), GRPC_STATUS_UNAVAILABLE);
    ASSERT_EQ(lkv_server_status_code(LKV_ENOTSUP), GRPC_STATUS_UNIMPLEMENTED);
    ASSERT_EQ(lkv_server_status_code(LKV_ECORRUPT), GRPC_STATUS_DATA_LOSS);
    ASSERT_EQ(lkv_server_status_code(LKV_EIO), GRPC_STATUS_INTERNAL);
    ASSERT_EQ(lkv_server_status_code(LKV_EROCKSDB), GRPC_STATUS_INTERNAL);
    ASSERT_EQ(lkv_server_status_code(LKV_ECUDA), GRPC_STATUS_INTERNAL);
    ASSERT_EQ(lkv_server_status_code(LKV_EINTERNAL), GRPC_STATUS_INTERNAL);
    ASSERT_EQ(lkv_server_status_code(-5), GRPC_STATUS_INTERNAL); /* an -errno */
    ASSERT_EQ(lkv_server_status_code(-99999), GRPC_STATUS_INTERNAL);
}

/* Every code of the table maps to a non-OK status. */
static void test_every_code_is_an_error(void)
{
#define CHECK_ONE(name, val, msg) ASSERT_TRUE(lkv_server_status_code(val) != GRPC_STATUS_OK);
    LKV_ERR_MAP(CHECK_ONE)
#undef CHECK_ONE
}

static void test_names(void)
{
    ASSERT_TRUE(strcmp(lkv_server_status_name(GRPC_STATUS_OK), "OK") == 0);
    ASSERT_TRUE(strcmp(lkv_server_status_name(GRPC_STATUS_INVALID_ARGUMENT), "INVALID_ARGUMENT") ==
                0);
    ASSERT_TRUE(
        strcmp(lkv_server_status_name(GRPC_STATUS_RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED") == 0);
    ASSERT_TRUE(strcmp(lkv_server_status_name(GRPC_STATUS_UNAUTHENTICATED), "UNAUTHENTICATED") ==
                0);
    ASSERT_TRUE(strcmp(lkv_server_status_name(99), "UNKNOWN") == 0);
    ASSERT_TRUE(strcmp(lkv_server_status_name(-1), "UNKNOWN") == 0);
}

int main(void)
{
    LKV_RUN(test_mapping);
    LKV_RUN(test_every_code_is_an_error);
    LKV_RUN(test_names);
    return 0;
}
