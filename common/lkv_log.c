/* lkv_log.c: see lkv_log.h. */
#define _POSIX_C_SOURCE 200809L
#include "lkv_log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int min_level = LKV_LOG_INFO; /* Atomic: SIGHUP changes it while threads log. */

void lkv_log_set_level(int level)
{
    atomic_store_explicit(&min_level, level, memory_order_relaxed);
}

int lkv_log_parse_level(const char *s, int *out)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return LKV_OK;
        }
    }
    return LKV_EINVAL;
}

static void vlog(int level, const char *file, int line, const char *fmt, va_list ap)
{
    static const char *tags[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    char buf[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    int n = snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s:%d ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, tags[level & 3], base, line);
    if (n < 0) {
        return;
    }
    if ((size_t)n < sizeof(buf)) {
        int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
        if (m > 0) {
            n += m;
        }
    }
    if ((size_t)n >= sizeof(buf) - 1) {
        n = (int)sizeof(buf) - 2;
    }
    buf[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
    (void)w;
}

void lkv_log_line(int level, const char *file, int line, const char *fmt, ...)
{
    if (level < atomic_load_explicit(&min_level, memory_order_relaxed)) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vlog(level, file, line, fmt, ap);
    va_end(ap);
}

void lkv_panic_at(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(LKV_LOG_ERROR, file, line, fmt, ap);
    va_end(ap);
    abort();
}

void *lkv_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        lkv_panic("out of host memory allocating %zu bytes", n);
    }
    return p;
}

void *lkv_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        lkv_panic("out of host memory allocating %zu x %zu bytes", n, size);
    }
    return p;
}

void *lkv_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        lkv_panic("out of host memory reallocating %zu bytes", n);
    }
    return q;
}

char *lkv_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = lkv_xmalloc(n);
    memcpy(p, s, n);
    return p;
}
