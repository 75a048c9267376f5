/*
 * lkv_log.h: one-line logging and the check/panic macros every folder shares.
 *
 * Log lines go to stderr as "2026-11-30T10:00:00.123Z LEVEL file:line message". The level is
 * set at start-up (lkv_log_set_level; a SIGHUP reload may change it while threads log, so it
 * is a relaxed atomic); lines below it cost one comparison. Logging is
 * thread-safe: each line is formatted into a local buffer and written with one write(2).
 *
 * lkv_panic() logs file:line and aborts: for broken invariants and host out-of-memory only,
 * never for user input. LKV_CHECK_RC() returns a status from the enclosing function instead.
 */
#ifndef LKV_LOG_H
#define LKV_LOG_H

#include <stdarg.h>
#include <stdlib.h>

#include "lkv_err.h"

enum lkv_log_level {
    LKV_LOG_DEBUG = 0,
    LKV_LOG_INFO = 1,
    LKV_LOG_WARN = 2,
    LKV_LOG_ERROR = 3,
};

/* Sets the minimum level that is printed (default LKV_LOG_INFO). */
void lkv_log_set_level(int level);

/* Parses "debug", "info", "warn" or "error" into *out; returns LKV_EINVAL otherwise. */
int lkv_log_parse_level(const char *s, int *out);

/* Prints one log line. Use the LKV_LOG* macros instead of calling this directly. */
void lkv_log_line(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Logs at error level with file:line and aborts the process. Never returns. */
void lkv_panic_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

#define LKV_LOGD(...)  lkv_log_line(LKV_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define LKV_LOGI(...)  lkv_log_line(LKV_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define LKV_LOGW(...)  lkv_log_line(LKV_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define LKV_LOGE(...)  lkv_log_line(LKV_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
#define lkv_panic(...) lkv_panic_at(__FILE__, __LINE__, __VA_ARGS__)

/* Evaluates expr (an int status); on a negative value logs #expr and returns it. */
#define LKV_CHECK_RC(expr)                                                                         \
    do {                                                                                           \
        int lkv__rc = (expr);                                                                      \
        if (lkv__rc < 0) {                                                                         \
            LKV_LOGE("%s failed in %s: %s", #expr, __func__, lkv_strerror(lkv__rc));               \
            return lkv__rc;                                                                        \
        }                                                                                          \
    } while (0)

/* Host allocation that never returns NULL: out of host memory is fatal by policy. */
void *lkv_xmalloc(size_t n);
void *lkv_xcalloc(size_t n, size_t size);
void *lkv_xrealloc(void *p, size_t n);
char *lkv_xstrdup(const char *s);

#endif
