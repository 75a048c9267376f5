/*
 * lkv_status.c: the LKV_* <-> gRPC status table (see lkv_status.h for the contract).
 *
 * One table, read in both directions. Each row pairs an LKV code with a status; a row marked
 * TO is only read from code to status, FROM only from status to code (statuses a lazykv daemon
 * never sends but a proxy or gRPC core may), BOTH both ways. For each status exactly one row
 * read FROM it (BOTH or FROM) exists: that is the family fallback used when the call carried no
 * lkv-code metadata. tests/proto/test_status.c checks the table is total and consistent.
 */
#include "lkv_status.h"

#include <string.h>

#include <grpc/status.h>

#include "lkv_err.h"

enum { TO = 1, FROM = 2, BOTH = 3 };

static const struct row {
    int err;
    int status;
    int dir;
} rows[] = {
    {LKV_OK, GRPC_STATUS_OK, BOTH},
    {LKV_EINVAL, GRPC_STATUS_INVALID_ARGUMENT, BOTH},
    {LKV_EPROTO, GRPC_STATUS_INVALID_ARGUMENT, TO},
    {LKV_EPROFILE, GRPC_STATUS_INVALID_ARGUMENT, TO},
    {LKV_ECONFIG, GRPC_STATUS_INVALID_ARGUMENT, TO},
    {LKV_EINVAL, GRPC_STATUS_OUT_OF_RANGE, FROM},
    {LKV_ENOTFOUND, GRPC_STATUS_NOT_FOUND, BOTH},
    {LKV_EEXIST, GRPC_STATUS_ALREADY_EXISTS, BOTH},
    /* Without metadata, RESOURCE_EXHAUSTED comes from gRPC core's message-size limits. */
    {LKV_ETOOBIG, GRPC_STATUS_RESOURCE_EXHAUSTED, BOTH},
    {LKV_ENOSPC, GRPC_STATUS_RESOURCE_EXHAUSTED, TO},
    {LKV_ENOMEM, GRPC_STATUS_RESOURCE_EXHAUSTED, TO},
    {LKV_ERATE, GRPC_STATUS_RESOURCE_EXHAUSTED, TO},
    {LKV_EQUOTA, GRPC_STATUS_RESOURCE_EXHAUSTED, TO},
    {LKV_EADMIT, GRPC_STATUS_RESOURCE_EXHAUSTED,
     TO}, /* hot_admission = door refused (cache.proto). */
    {LKV_EBUSY, GRPC_STATUS_FAILED_PRECONDITION, BOTH},
    {LKV_ENOTOWNER, GRPC_STATUS_FAILED_PRECONDITION, TO}, /* Cluster redirect (cache.proto). */
    {LKV_ETIMEDOUT, GRPC_STATUS_DEADLINE_EXCEEDED, BOTH},
    {LKV_ECANCELLED, GRPC_STATUS_CANCELLED, BOTH},
    {LKV_EUNAUTH, GRPC_STATUS_UNAUTHENTICATED, BOTH},
    {LKV_EPERM, GRPC_STATUS_PERMISSION_DENIED, BOTH},
    {LKV_EUNAVAIL, GRPC_STATUS_UNAVAILABLE, BOTH},
    {LKV_ESHUTDOWN, GRPC_STATUS_UNAVAILABLE, TO},
    {LKV_EAGAIN, GRPC_STATUS_UNAVAILABLE, TO},
    {LKV_EINPROGRESS, GRPC_STATUS_ABORTED, BOTH}, /* Reserve: being computed by another worker. */
    {LKV_ENOTSUP, GRPC_STATUS_UNIMPLEMENTED, BOTH},
    {LKV_ECORRUPT, GRPC_STATUS_DATA_LOSS, BOTH},
    {LKV_EINTERNAL, GRPC_STATUS_INTERNAL, BOTH},
    {LKV_EIO, GRPC_STATUS_INTERNAL, TO},
    {LKV_EROCKSDB, GRPC_STATUS_INTERNAL, TO},
    {LKV_ECUDA, GRPC_STATUS_INTERNAL, TO},
    {LKV_EINTERNAL, GRPC_STATUS_UNKNOWN, FROM},
};

#define N_ROWS (sizeof(rows) / sizeof(rows[0]))

int lkv_status_from_err(int rc)
{
    for (size_t i = 0; i < N_ROWS; i++) {
        if ((rows[i].dir & TO) && rows[i].err == rc) {
            return rows[i].status;
        }
    }
    return GRPC_STATUS_INTERNAL;
}

/* The family fallback of status (LKV_EINTERNAL for a status outside the table). */
static int family(int status)
{
    for (size_t i = 0; i < N_ROWS; i++) {
        if ((rows[i].dir & FROM) && rows[i].status == status) {
            return rows[i].err;
        }
    }
    return LKV_EINTERNAL;
}

int lkv_status_parse_code(const char *code, size_t len)
{
    if (code == NULL || len == 0) {
        return 0;
    }
#define LKV__ST_PARSE(name, val, msg)                                                              \
    if (len == sizeof("LKV_" #name) - 1 && memcmp(code, "LKV_" #name, len) == 0) {                 \
        return (val);                                                                              \
    }
    LKV_ERR_MAP(LKV__ST_PARSE)
#undef LKV__ST_PARSE
    return 0;
}

int lkv_status_to_err(int status, const char *code, size_t len)
{
    if (status == GRPC_STATUS_OK) {
        return 0;
    }
    int rc = lkv_status_parse_code(code, len);
    if (rc != 0 && lkv_status_from_err(rc) == status) {
        return rc;
    }
    return family(status);
}

const char *lkv_status_md_value(int rc)
{
    if (lkv_status_parse_code(lkv_err_name(rc), strlen(lkv_err_name(rc))) != rc) {
        return lkv_err_name(LKV_EINTERNAL);
    }
    return lkv_err_name(rc);
}

const char *lkv_status_name(int status)
{
    static const char *names[] = {"OK",
                                  "CANCELLED",
                                  "UNKNOWN",
                                  "INVALID_ARGUMENT",
                                  "DEADLINE_EXCEEDED",
                                  "NOT_FOUND",
                                  "ALREADY_EXISTS",
                                  "PERMISSION_DENIED",
                                  "RESOURCE_EXHAUSTED",
                                  "FAILED_PRECONDITION",
                                  "ABORTED",
                                  "OUT_OF_RANGE",
                                  "UNIMPLEMENTED",
                                  "INTERNAL",
                                  "UNAVAILABLE",
                                  "DATA_LOSS",
                                  "UNAUTHENTICATED"};
    if (status >= 0 && status < (int)(sizeof(names) / sizeof(names[0]))) {
        return names[status];
    }
    return "UNKNOWN";
}
