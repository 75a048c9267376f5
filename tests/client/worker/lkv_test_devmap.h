/*
 * lkv_test_devmap.h: a host-memory stand-in for a device backend's mapping ops (lkv_devmap,
 * lkv_pagespace.h), so that the page space's placement of worker pages next to an imported
 * arena (after it, below it, at a page offset, too far) runs on the CPU with real memory: the
 * "imported" arena is the daemon's shm object mapped whole (as cudaIpcOpenMemHandle maps the
 * whole allocation), placed allocations are mmap(MAP_FIXED_NOREPLACE) at the hint (as
 * cuMemAddressReserve with a hint: taken -> LKV_EBUSY), plain ones mmap anywhere or at a chosen
 * address. The memory is host memory, so the CPU backend computes on it unchanged.
 *
 * Test helper (static functions, one includer per test binary).
 */
#ifndef LKV_TEST_DEVMAP_H
#define LKV_TEST_DEVMAP_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "lkv_err.h"
#include "lkv_pagespace.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define TDM_GRAN  (64u << 10) /* Placement granularity (the driver's is 2 MiB). */
#define TDM_SLACK (64u << 20) /* Free address space kept on each side of the opened arena. */

typedef struct tdm {
    lkv_devmap ops;
    int no_vmm;          /* alloc_at answers LKV_ENOTSUP (no VMM API). */
    int refuse_after;    /* alloc_at refuses the range after the arena (taken). */
    int64_t plain_at;    /* != 0: alloc places at region start + plain_at (an exact address). */
    uint8_t *region;     /* Set by the test: where the worker's region starts once opened. */
    uint64_t region_off; /* The region's base_offset (to find region from the opened base). */
    const char *profile; /* != NULL: region_off is taken from that profile's region at open. */
    uint8_t *opened;     /* The last opened arena. */
    size_t opened_bytes;
    int n_open, n_close, n_alloc, n_free;
} tdm;

static int tdm_open(void *ctx, const lkv_lease_arena *a, void **base, char *err, size_t len)
{
    tdm *t = ctx;
    int fd = shm_open(a->shm_name, O_RDWR, 0);
    if (fd < 0) {
        snprintf(err, len, "shm_open(%s): %s", a->shm_name, strerror(errno));
        return LKV_EIO;
    }
    size_t bytes = (a->arena_bytes + 4095) / 4096 * 4096;
    /* A hole with free space on both sides, the arena in the middle. */
    uint8_t *hole = mmap(NULL, bytes + 2 * (size_t)TDM_SLACK, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (hole == MAP_FAILED) {
        close(fd);
        return LKV_EIO;
    }
    uint8_t *mid = (uint8_t *)(((uintptr_t)hole + TDM_SLACK) / TDM_GRAN * TDM_GRAN);
    munmap(hole, bytes + 2 * (size_t)TDM_SLACK);
    void *p = mmap(mid, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
    close(fd);
    if (p == MAP_FAILED || p != mid) {
        snprintf(err, len, "mapping the arena: %s", strerror(errno));
        return LKV_EIO;
    }
    for (uint32_t r = 0; t->profile != NULL && r < a->n_regions; r++) {
        if (strcmp(a->regions[r].profile, t->profile) == 0) {
            t->region_off = a->regions[r].base_offset;
        }
    }
    t->opened = p;
    t->opened_bytes = bytes;
    t->region = (uint8_t *)p + t->region_off;
    t->n_open++;
    *base = p;
    return 0;
}

static void tdm_close(void *ctx, void *base)
{
    tdm *t = ctx;
    munmap(base, t->opened_bytes);
    t->n_close++;
}

static uint64_t tdm_granularity(void *ctx)
{
    (void)ctx;
    return TDM_GRAN;
}

static int tdm_map_at(uintptr_t at, uint64_t bytes, void **out)
{
    void *p = mmap((void *)at, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED) {
        return LKV_EBUSY;
    }
    if ((uintptr_t)p != at) { /* A kernel without MAP_FIXED_NOREPLACE took it as a hint. */
        munmap(p, bytes);
        return LKV_EBUSY;
    }
    *out = p;
    return 0;
}

static int tdm_alloc_at(void *ctx, uintptr_t at, uint64_t bytes, void **out, char *err, size_t len)
{
    tdm *t = ctx;
    if (t->no_vmm) {
        snprintf(err, len, "no VMM here");
        return LKV_ENOTSUP;
    }
    if (at % TDM_GRAN != 0 || bytes % TDM_GRAN != 0) {
        snprintf(err, len, "placement off the granularity");
        return LKV_EINVAL;
    }
    if (t->refuse_after && at >= (uintptr_t)t->opened) {
        snprintf(err, len, "taken");
        return LKV_EBUSY;
    }
    int rc = tdm_map_at(at, bytes, out);
    if (rc == 0) {
        t->n_alloc++;
    } else {
        snprintf(err, len, "taken");
    }
    return rc;
}

static int tdm_alloc(void *ctx, uint64_t bytes, void **out, char *err, size_t len)
{
    tdm *t = ctx;
    bytes = (bytes + 4095) / 4096 * 4096;
    int rc;
    if (t->plain_at != 0 && t->region != NULL) {
        rc = tdm_map_at((uintptr_t)((int64_t)(uintptr_t)t->region + t->plain_at) / 4096 * 4096,
                        bytes, out);
    } else {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        rc = p == MAP_FAILED ? LKV_ENOMEM : 0;
        *out = p;
    }
    if (rc != 0) {
        snprintf(err, len, "mmap of %llu bytes failed", (unsigned long long)bytes);
        return rc;
    }
    t->n_alloc++;
    return 0;
}

static void tdm_free(void *ctx, void *p, uint64_t bytes, int placed)
{
    tdm *t = ctx;
    (void)placed;
    munmap(p, (bytes + 4095) / 4096 * 4096);
    t->n_free++;
}

/* Initialises t: ops mapping "host" arenas (the daemon's shm object) as a device backend
 * would map its own; region_off is the worker's region's base_offset. */
static void tdm_init(tdm *t, uint64_t region_off)
{
    memset(t, 0, sizeof(*t));
    t->ops = (lkv_devmap){.arena_backend = "host",
                          .ctx = t,
                          .open = tdm_open,
                          .close = tdm_close,
                          .granularity = tdm_granularity,
                          .alloc_at = tdm_alloc_at,
                          .alloc = tdm_alloc,
                          .free = tdm_free};
    t->region_off = region_off;
}

#endif
