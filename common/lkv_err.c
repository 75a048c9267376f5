/* lkv_err.c: strings for the error table in lkv_err.h. */
#include "lkv_err.h"

#include <stdarg.h>
#include <stdio.h>

const char *lkv_strerror(int rc)
{
    switch (rc) {
    case LKV_OK:
        return "ok";
#define LKV__ERR_STR(name, val, msg)                                                               \
    case LKV_##name:                                                                               \
        return msg;
        LKV_ERR_MAP(LKV__ERR_STR)
#undef LKV__ERR_STR
    }
    return "unknown error";
}

const char *lkv_err_name(int rc)
{
    switch (rc) {
    case LKV_OK:
        return "LKV_OK";
#define LKV__ERR_NAME(name, val, msg)                                                              \
    case LKV_##name:                                                                               \
        return "LKV_" #name;
        LKV_ERR_MAP(LKV__ERR_NAME)
#undef LKV__ERR_NAME
    }
    return "LKV_UNKNOWN";
}

int lkv_errf(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}
