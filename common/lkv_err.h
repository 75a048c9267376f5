/*
 * lkv_err.h: the one table of lazykv error codes.
 *
 * Every function that can fail returns int: 0 (LKV_OK) on success or a negative LKV_E* code.
 * The codes live at -1000 and below so that they never collide with -errno values. The table
 * is an X-macro: each row is (NAME, value, message), and generates the enum, lkv_strerror()
 * and lkv_err_name(). Map to gRPC status codes only at the RPC edge (daemon/, client/).
 */
#ifndef LKV_ERR_H
#define LKV_ERR_H

#include <stddef.h>

#define LKV_ERR_MAP(X)                                                                             \
    X(EINVAL, -1001, "invalid argument")                                                           \
    X(ENOMEM, -1002, "out of memory")                                                              \
    X(ENOTFOUND, -1003, "not found")                                                               \
    X(EEXIST, -1004, "already exists")                                                             \
    X(ENOSPC, -1005, "budget or space exhausted")                                                  \
    X(EIO, -1006, "I/O error")                                                                     \
    X(ECORRUPT, -1007, "corrupt data")                                                             \
    X(EPROFILE, -1008, "unknown or mismatched model profile")                                      \
    X(EAGAIN, -1009, "not done, call again")                                                       \
    X(EBUSY, -1010, "resource busy or pinned")                                                     \
    X(ECUDA, -1011, "CUDA error")                                                                  \
    X(EROCKSDB, -1012, "RocksDB error")                                                            \
    X(ETIMEDOUT, -1013, "deadline exceeded")                                                       \
    X(ECANCELLED, -1014, "cancelled")                                                              \
    X(EUNAUTH, -1015, "unauthenticated")                                                           \
    X(EPERM, -1016, "permission denied")                                                           \
    X(EUNAVAIL, -1017, "service unavailable")                                                      \
    X(ETOOBIG, -1018, "message or payload too large")                                              \
    X(ECONFIG, -1019, "bad configuration")                                                         \
    X(EPROTO, -1020, "malformed message")                                                          \
    X(ESHUTDOWN, -1021, "shutting down")                                                           \
    X(ENOTSUP, -1022, "not supported")                                                             \
    X(EINTERNAL, -1023, "internal error")                                                          \
    X(ERATE, -1024, "rate limit exceeded: retry later")                                            \
    X(EQUOTA, -1025, "tenant quota exceeded")                                                      \
    X(EINPROGRESS, -1026, "being computed by another worker")                                      \
    X(EADMIT, -1027, "declined by the hot tier's admission filter")                                \
    X(ENOTOWNER, -1040, "not the owner: route the call to the document's owner")

enum lkv_err {
    LKV_OK = 0,
#define LKV__ERR_ENUM(name, val, msg) LKV_##name = (val),
    LKV_ERR_MAP(LKV__ERR_ENUM)
#undef LKV__ERR_ENUM
};

/* Returns a static, human-readable message for rc (never NULL; "unknown error" if unknown). */
const char *lkv_strerror(int rc);

/* Returns the static symbolic name of rc, e.g. "LKV_EINVAL" (never NULL). */
const char *lkv_err_name(int rc);

/* Formats a reason into err (errlen bytes, NUL-terminated, truncated if longer; nothing is
 * written when err is NULL or errlen is 0) and returns rc, so that a failing path can say
 * `return lkv_errf(err, errlen, LKV_EINVAL, "...", ...);`. */
int lkv_errf(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
