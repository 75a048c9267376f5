/*
 * fuzz_util.h: helpers shared by the libFuzzer targets of tests/fuzz (header-only, one target
 * per executable). Parsers that only take a path (the KV file, the trace file) are fed through
 * one memfd per process: fuzz_memfd_path() rewrites it with the input and returns
 * "/proc/self/fd/N", so the real fopen/fread path runs, with no file system traffic.
 */
#ifndef LKV_FUZZ_UTIL_H
#define LKV_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes data[0..n) as the whole content of this process's memfd and returns its path (static
 * buffer, valid until the next call). Aborts if the memfd cannot be made (not a finding). */
static const char *fuzz_memfd_path(const uint8_t *data, size_t n)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("lkv-fuzz", 0);
        if (fd < 0) {
            perror("memfd_create");
            abort();
        }
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || (n > 0 && pwrite(fd, data, n, 0) != (ssize_t)n)) {
        perror("memfd write");
        abort();
    }
    return path;
}

#endif
