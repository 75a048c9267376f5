/*
 * lkv_pagespace.c: the worker's page space (see lkv_pagespace.h).
 *
 * Mapping order: reserve the whole range PROT_NONE (private anonymous, MAP_NORESERVE), then map
 * the shm object over its start (MAP_FIXED | MAP_SHARED, PROT_READ) and fresh anonymous memory
 * over the rest (MAP_FIXED | MAP_PRIVATE | MAP_NORESERVE, read-write: with 2 MiB daemon pages,
 * 2048 worker pages are 4 GiB of address space, of which a request touches a few blocks). Worker
 * pages are touched only as far as a block reaches (the runner zeroes block_bytes, not the whole
 * page), so a large daemon page size costs address space, not memory.
 */
#include "lkv_pagespace.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lkv_err.h"

void lkv_pagespace_init(lkv_pagespace *ps, uint32_t n_local)
{
    memset(ps, 0, sizeof(*ps));
    ps->n_local = n_local > 0 ? n_local : 1;
}

static void unmap(lkv_pagespace *ps)
{
    if (ps->base != NULL && !ps->external) {
        munmap(ps->base, ps->map_bytes);
    }
    ps->base = NULL;
    ps->map_bytes = 0;
    ps->n_daemon = 0;
    ps->shm_name[0] = '\0';
    ps->external = 0;
}

void lkv_pagespace_use(lkv_pagespace *ps, void *pages, uint64_t page_bytes)
{
    unmap(ps);
    ps->base = pages;
    ps->page_bytes = page_bytes;
    ps->map_bytes = (uint64_t)ps->n_local * page_bytes;
    ps->external = 1;
}

void lkv_pagespace_free(lkv_pagespace *ps)
{
    unmap(ps);
    memset(ps, 0, sizeof(*ps));
}

/* Reserves the range and maps the worker pages; the daemon part stays PROT_NONE. */
static int reserve(lkv_pagespace *ps, uint64_t page_bytes, uint32_t n_daemon)
{
    if (page_bytes == 0 || (uint64_t)n_daemon + ps->n_local > (uint64_t)LKV_REF_MAX_PAGE + 1u) {
        snprintf(ps->err, sizeof(ps->err),
                 "arena of %" PRIu32 " pages plus %" PRIu32
                 " worker pages exceeds the block reference's page range",
                 n_daemon, ps->n_local);
        return LKV_EINVAL;
    }
    uint64_t bytes = ((uint64_t)n_daemon + ps->n_local) * page_bytes;
    void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(ps->err, sizeof(ps->err), "reserving %" PRIu64 " bytes: %s", bytes,
                 strerror(errno));
        return LKV_EIO;
    }
    uint8_t *local = (uint8_t *)p + (uint64_t)n_daemon * page_bytes;
    uint64_t lbytes = (uint64_t)ps->n_local * page_bytes;
    if (mmap(local, lbytes, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED) {
        snprintf(ps->err, sizeof(ps->err), "mapping %" PRIu32 " worker pages: %s", ps->n_local,
                 strerror(errno));
        munmap(p, bytes);
        return LKV_EIO;
    }
    ps->base = p;
    ps->map_bytes = bytes;
    ps->page_bytes = page_bytes;
    ps->n_daemon = n_daemon;
    return 0;
}

int lkv_pagespace_map(lkv_pagespace *ps, const lkv_lease_arena *a)
{
    if (strcmp(a->backend, "host") != 0) {
        snprintf(ps->err, sizeof(ps->err),
                 "the daemon's arena is '%s'; the CPU worker maps only a host (shm) arena",
                 a->backend);
        return LKV_ENOTSUP;
    }
    if (ps->base != NULL && ps->n_daemon == a->n_pages && ps->page_bytes == a->page_bytes &&
        strcmp(ps->shm_name, a->shm_name) == 0) {
        return 0; /* Mapped once per daemon arena. */
    }
    unmap(ps);
    if (a->n_pages == 0 || a->shm_name[0] == '\0') {
        snprintf(ps->err, sizeof(ps->err), "the Attach reply names no arena");
        return LKV_EIO;
    }
    int fd = shm_open(a->shm_name, O_RDONLY, 0);
    if (fd < 0) {
        snprintf(ps->err, sizeof(ps->err), "shm_open(%.200s): %s", a->shm_name, strerror(errno));
        return LKV_EIO;
    }
    struct stat sb;
    uint64_t need = (uint64_t)a->n_pages * a->page_bytes;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < need) {
        snprintf(ps->err, sizeof(ps->err), "%.200s is smaller than %" PRIu32 " pages of %" PRIu64,
                 a->shm_name, a->n_pages, a->page_bytes);
        close(fd);
        return LKV_EIO;
    }
    int rc = reserve(ps, a->page_bytes, a->n_pages);
    if (rc == 0 && mmap(ps->base, need, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        snprintf(ps->err, sizeof(ps->err), "mmap(%.200s): %s", a->shm_name, strerror(errno));
        unmap(ps);
        rc = LKV_EIO;
    }
    close(fd);
    if (rc == 0) {
        snprintf(ps->shm_name, sizeof(ps->shm_name), "%s", a->shm_name);
        ps->n_maps++;
    }
    return rc;
}

int lkv_pagespace_map_local(lkv_pagespace *ps, uint64_t page_bytes)
{
    if (ps->base != NULL) {
        return 0;
    }
    return reserve(ps, page_bytes, 0);
}

void lkv_pagespace_view(const lkv_pagespace *ps, const lkv_kv_shape *shape, lkv_model_kv *kv)
{
    memset(kv, 0, sizeof(*kv));
    kv->shape = *shape;
    kv->page_bytes = ps->page_bytes;
    kv->n_pages = ps->n_daemon + ps->n_local;
    kv->n_used = ps->n_daemon;
    kv->base = ps->base;
    kv->owned = 0;
}
