/*
 * lkv_test.h: tiny unit-test macros. A test file defines static void test_x(void) functions
 * and a main() that runs them with LKV_RUN(test_x). A failed assertion prints both values with
 * file:line and exits non-zero. Each test file is its own process (one ctest case).
 */
#ifndef LKV_TEST_H
#define LKV_TEST_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_err.h"

#define LKV_FAIL(...)                                                                              \
    do {                                                                                           \
        fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);                                      \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

#define ASSERT_TRUE(c)                                                                             \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            LKV_FAIL("%s", #c);                                                                    \
        }                                                                                          \
    } while (0)

#define ASSERT_EQ(a, b)                                                                            \
    do {                                                                                           \
        long long lkv__a = (long long)(a), lkv__b = (long long)(b);                                \
        if (lkv__a != lkv__b) {                                                                    \
            LKV_FAIL("%s == %s: %lld != %lld", #a, #b, lkv__a, lkv__b);                            \
        }                                                                                          \
    } while (0)

#define ASSERT_OK(expr)                                                                            \
    do {                                                                                           \
        int lkv__rc = (expr);                                                                      \
        if (lkv__rc != 0) {                                                                        \
            LKV_FAIL("%s: %d %s", #expr, lkv__rc, lkv_err_name(lkv__rc));                          \
        }                                                                                          \
    } while (0)

#define ASSERT_ERR(expr, code)                                                                     \
    do {                                                                                           \
        int lkv__rc = (expr);                                                                      \
        if (lkv__rc != (code)) {                                                                   \
            LKV_FAIL("%s: got %s, want %s", #expr, lkv_err_name(lkv__rc), lkv_err_name(code));     \
        }                                                                                          \
    } while (0)

#define ASSERT_NEAR(a, b, tol)                                                                     \
    do {                                                                                           \
        double lkv__a = (double)(a), lkv__b = (double)(b);                                         \
        if (!(fabs(lkv__a - lkv__b) <= (tol))) {                                                   \
            LKV_FAIL("%s ~ %s: %.9g vs %.9g (tol %g)", #a, #b, lkv__a, lkv__b, (double)(tol));     \
        }                                                                                          \
    } while (0)

#define LKV_RUN(fn)                                                                                \
    do {                                                                                           \
        fprintf(stderr, "-- %s\n", #fn);                                                           \
        fn();                                                                                      \
    } while (0)

#endif
