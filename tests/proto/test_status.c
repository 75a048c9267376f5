/*
 * test_status.c: the one LKV_* <-> gRPC status table (proto/lkv_status): the code -> status
 * direction the daemon sends, the round trip of every code through its lkv-code metadata, the
 * status-only fallback (an old daemon, a proxy, gRPC core's own refusals), and the names.
 */
#include <string.h>

#include <grpc/status.h>

#include "lkv_err.h"
#include "lkv_status.h"
#include "lkv_test.h"

static int to_err(int status, const char *md)
{
    return lkv_status_to_err(status, md, md != NULL ? strlen(md) : 0);
}

/* What the daemon sends for each code (the former daemon table, unchanged). */
static void test_from_err(void)
{
    ASSERT_EQ(lkv_status_from_err(LKV_OK), GRPC_STATUS_OK);
    ASSERT_EQ(lkv_status_from_err(LKV_EINVAL), GRPC_STATUS_INVALID_ARGUMENT);
    ASSERT_EQ(lkv_status_from_err(LKV_EPROTO), GRPC_STATUS_INVALID_ARGUMENT);
    ASSERT_EQ(lkv_status_from_err(LKV_EPROFILE), GRPC_STATUS_INVALID_ARGUMENT);
    ASSERT_EQ(lkv_status_from_err(LKV_ECONFIG), GRPC_STATUS_INVALID_ARGUMENT);
    ASSERT_EQ(lkv_status_from_err(LKV_ENOTFOUND), GRPC_STATUS_NOT_FOUND);
    ASSERT_EQ(lkv_status_from_err(LKV_EEXIST), GRPC_STATUS_ALREADY_EXISTS);
    ASSERT_EQ(lkv_status_from_err(LKV_ENOSPC), GRPC_STATUS_RESOURCE_EXHAUSTED);
    ASSERT_EQ(lkv_status_from_err(LKV_ETOOBIG), GRPC_STATUS_RESOURCE_EXHAUSTED);
    ASSERT_EQ(lkv_status_from_err(LKV_ENOMEM), GRPC_STATUS_RESOURCE_EXHAUSTED);
    ASSERT_EQ(lkv_status_from_err(LKV_EBUSY), GRPC_STATUS_FAILED_PRECONDITION);
    ASSERT_EQ(lkv_status_from_err(LKV_ETIMEDOUT), GRPC_STATUS_DEADLINE_EXCEEDED);
    ASSERT_EQ(lkv_status_from_err(LKV_ECANCELLED), GRPC_STATUS_CANCELLED);
    ASSERT_EQ(lkv_status_from_err(LKV_EUNAUTH), GRPC_STATUS_UNAUTHENTICATED);
    ASSERT_EQ(lkv_status_from_err(LKV_EPERM), GRPC_STATUS_PERMISSION_DENIED);
    ASSERT_EQ(lkv_status_from_err(LKV_EUNAVAIL), GRPC_STATUS_UNAVAILABLE);
    ASSERT_EQ(lkv_status_from_err(LKV_ESHUTDOWN), GRPC_STATUS_UNAVAILABLE);
    ASSERT_EQ(lkv_status_from_err(LKV_EAGAIN), GRPC_STATUS_UNAVAILABLE);
    ASSERT_EQ(lkv_status_from_err(LKV_ENOTSUP), GRPC_STATUS_UNIMPLEMENTED);
    ASSERT_EQ(lkv_status_from_err(LKV_ECORRUPT), GRPC_STATUS_DATA_LOSS);
    ASSERT_EQ(lkv_status_from_err(LKV_EIO), GRPC_STATUS_INTERNAL);
    ASSERT_EQ(lkv_status_from_err(LKV_EROCKSDB), GRPC_STATUS_INTERNAL);
    ASSERT_EQ(lkv_status_from_err(LKV_ECUDA), GRPC_STATUS_INTERNAL);
    ASSERT_EQ(lkv_status_from_err(LKV_EINTERNAL), GRPC_STATUS_INTERNAL);
    ASSERT_EQ(lkv_status_from_err(-5), GRPC_STATUS_INTERNAL); /* an -errno */
    ASSERT_EQ(lkv_status_from_err(-99999), GRPC_STATUS_INTERNAL);
    ASSERT_EQ(lkv_status_from_err(1), GRPC_STATUS_INTERNAL);
}

/* Every code of lkv_err.h is an error, goes out under its own name, and comes back as itself
 * through the metadata; the status alone comes back as a code of the same status family. */
static void test_round_trip(void)
{
    int n = 0;
#define CHECK_ONE(name, val, msg)                                                                  \
    do {                                                                                           \
        int st = lkv_status_from_err(val);                                                         \
        ASSERT_TRUE(st != GRPC_STATUS_OK);                                                         \
        const char *md = lkv_status_md_value(val);                                                 \
        ASSERT_TRUE(strcmp(md, "LKV_" #name) == 0);                                                \
        ASSERT_EQ(lkv_status_parse_code(md, strlen(md)), (val));                                   \
        ASSERT_EQ(to_err(st, md), (val));                                                          \
        int fb = to_err(st, NULL);                                                                 \
        ASSERT_TRUE(fb < 0);                                                                       \
        ASSERT_EQ(lkv_status_from_err(fb), st);                                                    \
        n++;                                                                                       \
    } while (0);
    LKV_ERR_MAP(CHECK_ONE)
#undef CHECK_ONE
    /* Every code of the table: 23 + ERATE, EQUOTA (quotas), EINPROGRESS (put in place), ENOTOWNER
     * (cluster redirect), EADMIT (hot admission door). */
    ASSERT_EQ(n, 28);
    /* A code outside the table goes out as LKV_EINTERNAL, consistent with its status. */
    ASSERT_TRUE(strcmp(lkv_status_md_value(-5), "LKV_EINTERNAL") == 0);
    ASSERT_EQ(to_err(lkv_status_from_err(-5), lkv_status_md_value(-5)), LKV_EINTERNAL);
}

/* No metadata (an old daemon, a proxy, gRPC core itself): the family's code. */
static void test_fallback(void)
{
    ASSERT_EQ(to_err(GRPC_STATUS_OK, NULL), 0);
    ASSERT_EQ(to_err(GRPC_STATUS_CANCELLED, NULL), LKV_ECANCELLED);
    ASSERT_EQ(to_err(GRPC_STATUS_UNKNOWN, NULL), LKV_EINTERNAL);
    ASSERT_EQ(to_err(GRPC_STATUS_INVALID_ARGUMENT, NULL), LKV_EINVAL);
    ASSERT_EQ(to_err(GRPC_STATUS_DEADLINE_EXCEEDED, NULL), LKV_ETIMEDOUT);
    ASSERT_EQ(to_err(GRPC_STATUS_NOT_FOUND, NULL), LKV_ENOTFOUND);
    ASSERT_EQ(to_err(GRPC_STATUS_ALREADY_EXISTS, NULL), LKV_EEXIST);
    ASSERT_EQ(to_err(GRPC_STATUS_PERMISSION_DENIED, NULL), LKV_EPERM);
    /* gRPC core's "Received message larger than max": the daemon names budgets LKV_ENOSPC. */
    ASSERT_EQ(to_err(GRPC_STATUS_RESOURCE_EXHAUSTED, NULL), LKV_ETOOBIG);
    ASSERT_EQ(to_err(GRPC_STATUS_FAILED_PRECONDITION, NULL), LKV_EBUSY);
    /* ABORTED is only ever Reserve's "being computed by another worker". */
    ASSERT_EQ(to_err(GRPC_STATUS_ABORTED, NULL), LKV_EINPROGRESS);
    ASSERT_EQ(to_err(GRPC_STATUS_OUT_OF_RANGE, NULL), LKV_EINVAL);
    ASSERT_EQ(to_err(GRPC_STATUS_UNIMPLEMENTED, NULL), LKV_ENOTSUP);
    ASSERT_EQ(to_err(GRPC_STATUS_INTERNAL, NULL), LKV_EINTERNAL);
    ASSERT_EQ(to_err(GRPC_STATUS_UNAVAILABLE, NULL), LKV_EUNAVAIL);
    ASSERT_EQ(to_err(GRPC_STATUS_DATA_LOSS, NULL), LKV_ECORRUPT);
    ASSERT_EQ(to_err(GRPC_STATUS_UNAUTHENTICATED, NULL), LKV_EUNAUTH);
    ASSERT_EQ(to_err(99, NULL), LKV_EINTERNAL);
    ASSERT_EQ(to_err(-1, NULL), LKV_EINTERNAL);
}

/* Metadata that is unusable or contradicts the status never wins over the status. */
static void test_bad_metadata(void)
{
    ASSERT_EQ(to_err(GRPC_STATUS_RESOURCE_EXHAUSTED, "LKV_ENOSPC"), LKV_ENOSPC);
    ASSERT_EQ(to_err(GRPC_STATUS_RESOURCE_EXHAUSTED, "LKV_ENOTFOUND"), LKV_ETOOBIG);
    ASSERT_EQ(to_err(GRPC_STATUS_OK, "LKV_ENOSPC"), 0);
    ASSERT_EQ(to_err(GRPC_STATUS_INVALID_ARGUMENT, "LKV_OK"), LKV_EINVAL);
    ASSERT_EQ(to_err(GRPC_STATUS_INVALID_ARGUMENT, "-1008"), LKV_EINVAL);
    ASSERT_EQ(to_err(GRPC_STATUS_INVALID_ARGUMENT, "lkv_eprofile"), LKV_EINVAL);
    ASSERT_EQ(to_err(GRPC_STATUS_INVALID_ARGUMENT, ""), LKV_EINVAL);
    /* Not NUL-terminated, and prefixes/extensions of a name are not that name. */
    ASSERT_EQ(lkv_status_to_err(GRPC_STATUS_INVALID_ARGUMENT, "LKV_EPROFILExyz", 12), LKV_EPROFILE);
    ASSERT_EQ(to_err(GRPC_STATUS_INVALID_ARGUMENT, "LKV_EPROFILEX"), LKV_EINVAL);
    ASSERT_EQ(to_err(GRPC_STATUS_INVALID_ARGUMENT, "LKV_EPROF"), LKV_EINVAL);
    ASSERT_EQ(lkv_status_parse_code(NULL, 5), 0);
}

static void test_names(void)
{
    ASSERT_TRUE(strcmp(lkv_status_name(GRPC_STATUS_OK), "OK") == 0);
    ASSERT_TRUE(strcmp(lkv_status_name(GRPC_STATUS_INVALID_ARGUMENT), "INVALID_ARGUMENT") == 0);
    ASSERT_TRUE(strcmp(lkv_status_name(GRPC_STATUS_RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED") == 0);
    ASSERT_TRUE(strcmp(lkv_status_name(GRPC_STATUS_UNAUTHENTICATED), "UNAUTHENTICATED") == 0);
    ASSERT_TRUE(strcmp(lkv_status_name(99), "UNKNOWN") == 0);
    ASSERT_TRUE(strcmp(lkv_status_name(-1), "UNKNOWN") == 0);
}

int main(void)
{
    LKV_RUN(test_from_err);
    LKV_RUN(test_round_trip);
    LKV_RUN(test_fallback);
    LKV_RUN(test_bad_metadata);
    LKV_RUN(test_names);
    return 0;
}
