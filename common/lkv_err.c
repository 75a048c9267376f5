/* lkv_err.c: strings for the error table in lkv_err.h. */
#include "lkv_err.h"

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
