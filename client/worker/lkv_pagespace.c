/*
 * lkv_pagespace.c: the worker's page space (see lkv_pagespace.h).
 *
 * Mapping order: reserve the whole range PROT_NONE (private anonymous, MAP_NORESERVE), then map
 * the shm object over its start (MAP_FIXED | MAP_SHARED, PROT_READ) and fresh anonymous memory
 * over the rest (MAP_FIXED | MAP_PRIVATE | MAP_NORESERVE, read-write: with 2 MiB daemon pages,
 * 2048 worker pages are 4 GiB of address space, of which a request touches a few blocks). Worker
 * pages are touched only as far as a block reaches (the runner zeroes block_bytes, not the whole
 * page), so a large daemon page size costs address space, not memory.
 *
 * Device arenas (ps->dev): the arena is opened through the backend's ops and the worker pages
 * are placed after it, below it, or at a whole-page offset from it (lkv_pagespace.h); place_*
 * below do the arithmetic on addresses as integers.
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
#include "lkv_log.h"

void lkv_pagespace_init(lkv_pagespace *ps, uint32_t n_local)
{
    memset(ps, 0, sizeof(*ps));
    ps->n_local = n_local > 0 ? n_local : 1;
}

const char *lkv_ps_placement_name(int placement)
{
    static const char *const names[] = {"none",      "host",      "external",  "dev-local",
                                        "dev-after", "dev-below", "dev-offset"};
    return placement >= 0 && placement <= LKV_PS_DEV_OFFSET ? names[placement] : "none";
}

static void unmap(lkv_pagespace *ps)
{
    if (ps->dev != NULL && (ps->dev_local != NULL || ps->dev_arena != NULL)) {
        if (ps->dev_local != NULL) {
            ps->dev->free(ps->dev->ctx, ps->dev_local, ps->dev_local_bytes, ps->dev_local_placed);
        }
        if (ps->dev_arena != NULL) {
            ps->dev->close(ps->dev->ctx, ps->dev_arena);
        }
    } else if (ps->base != NULL && !ps->external) {
        munmap(ps->base, ps->map_bytes);
    }
    ps->dev_local = NULL;
    ps->dev_arena = NULL;
    ps->dev_local_bytes = 0;
    ps->dev_local_placed = 0;
    ps->daemon0 = 0;
    ps->placement = LKV_PS_NONE;
    memset(ps->ipc, 0, sizeof(ps->ipc));
    ps->base = NULL;
    ps->map_bytes = 0;
    ps->n_daemon = 0;
    ps->first_local = 0;
    ps->region_base = 0;
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
    ps->placement = LKV_PS_EXTERNAL;
}

void lkv_pagespace_free(lkv_pagespace *ps)
{
    unmap(ps);
    memset(ps, 0, sizeof(*ps));
}

/* Reserves the range and maps the worker pages; the daemon part stays PROT_NONE. The worker
 * pages start at the first page (of the stride) past the daemon part rounded up to an OS page,
 * so that the shm mapping (whole OS pages) never covers a worker page. */
static int reserve(lkv_pagespace *ps, uint64_t page_bytes, uint32_t n_daemon)
{
    long osp = sysconf(_SC_PAGESIZE);
    uint64_t os_page = osp > 0 ? (uint64_t)osp : 4096u;
    uint64_t dbytes = ((uint64_t)n_daemon * page_bytes + os_page - 1) / os_page * os_page;
    uint64_t first = page_bytes ? (dbytes + page_bytes - 1) / page_bytes : 0;
    if (page_bytes == 0 || first + ps->n_local > (uint64_t)LKV_REF_MAX_PAGE + 1u) {
        snprintf(ps->err, sizeof(ps->err),
                 "arena of %" PRIu32 " pages plus %" PRIu32
                 " worker pages exceeds the block reference's page range",
                 n_daemon, ps->n_local);
        return LKV_EINVAL;
    }
    uint64_t bytes = ((first + ps->n_local) * page_bytes + os_page - 1) / os_page * os_page;
    void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(ps->err, sizeof(ps->err), "reserving %" PRIu64 " bytes: %s", bytes,
                 strerror(errno));
        return LKV_EIO;
    }
    uint8_t *local = (uint8_t *)p + dbytes;
    if (mmap(local, bytes - dbytes, PROT_READ | PROT_WRITE,
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
    ps->first_local = (uint32_t)first;
    ps->placement = LKV_PS_HOST;
    return 0;
}

static const lkv_arena_region *find_region(lkv_pagespace *ps, const lkv_lease_arena *a,
                                           const char *profile)
{
    for (uint32_t r = 0; r < a->n_regions; r++) {
        if (strcmp(a->regions[r].profile, profile) == 0) {
            return &a->regions[r];
        }
    }
    snprintf(ps->err, sizeof(ps->err), "the daemon's arena has no region of profile '%.64s'",
             profile);
    return NULL;
}

static uint64_t up(uint64_t x, uint64_t g)
{
    return (x + g - 1) / g * g;
}

static uint64_t down(uint64_t x, uint64_t g)
{
    return x / g * g;
}

/* Sets the layout for worker pages at [lo, lo + n_local * page_bytes) (device addresses), the
 * region's page 0 at r: above the region (base = r) or below it (base = lo, daemon0 = pages
 * between). Returns 0, or LKV_EINVAL when an index would pass the reference's 2^24 pages. */
static int set_layout(lkv_pagespace *ps, uintptr_t r, uintptr_t lo, uint64_t pb, uint32_t n)
{
    uint64_t d0 = 0, first = 0;
    uintptr_t base;
    if (lo >= r) {
        first = (lo - r) / pb;
        base = r;
    } else {
        d0 = (r - lo) / pb;
        base = lo;
    }
    uint64_t top = first + ps->n_local > d0 + n ? first + ps->n_local : d0 + n;
    if (top > (uint64_t)LKV_REF_MAX_PAGE + 1u) {
        snprintf(ps->err, sizeof(ps->err),
                 "the worker's device pages lie %" PRIu64 " pages of %" PRIu64
                 " bytes from the daemon's region, past the block reference's 2^24 pages (the "
                 "kernels address both from one base): no placement fits; give the worker fewer "
                 "--local-pages or the daemon a smaller arena",
                 lo >= r ? first : d0, pb);
        return LKV_EINVAL;
    }
    ps->base = (uint8_t *)base;
    ps->daemon0 = (uint32_t)d0;
    ps->first_local = (uint32_t)first;
    ps->n_daemon = n;
    ps->page_bytes = pb;
    ps->map_bytes = top * pb;
    return 0;
}

/* Places the worker pages of a device arena mapped at [b, b + abytes) whose region starts at r
 * (n pages of pb): after it, below it (VMM), else a plain allocation at a page offset. */
static int place_dev(lkv_pagespace *ps, uintptr_t b, uint64_t abytes, uintptr_t r, uint64_t pb,
                     uint32_t n)
{
    const lkv_devmap *d = ps->dev;
    uint64_t lb = (uint64_t)ps->n_local * pb;
    uint64_t g = d->granularity(d->ctx);
    g = g > 0 ? g : 1;
    char why[256] = "";
    void *p = NULL;
    /* 1. Right after the imported mapping. */
    uintptr_t at = (uintptr_t)up((uint64_t)b + abytes, g);
    uint64_t first = (at - r + pb - 1) / pb;
    uint64_t bytes = up(r + first * pb + lb - at, g);
    int rc = first + ps->n_local <= (uint64_t)LKV_REF_MAX_PAGE + 1u
                 ? d->alloc_at(d->ctx, at, bytes, &p, why, sizeof(why))
                 : LKV_EINVAL;
    if (rc == 0) {
        ps->dev_local = p;
        ps->dev_local_bytes = bytes;
        ps->dev_local_placed = 1;
        ps->placement = LKV_PS_DEV_AFTER;
        return set_layout(ps, r, r + first * pb, pb, n);
    }
    if (rc == LKV_ENOTSUP || rc == LKV_EBUSY || rc == LKV_EINVAL) {
        /* 2. Right below it. */
        uintptr_t topb = (uintptr_t)down(b, g);
        if (topb > lb + pb + g) {
            uintptr_t lo = (uintptr_t)down(topb - lb - pb, g);
            bytes = topb - lo;
            rc = rc == LKV_ENOTSUP ? rc : d->alloc_at(d->ctx, lo, bytes, &p, why, sizeof(why));
            if (rc == 0) {
                ps->dev_local = p;
                ps->dev_local_bytes = bytes;
                ps->dev_local_placed = 1;
                ps->placement = LKV_PS_DEV_BELOW;
                uint64_t k = (r - lo) / pb; /* Worker pages from r - k * pb (>= lo). */
                return set_layout(ps, r, r - k * pb, pb, n);
            }
        }
    }
    if (rc != 0 && rc != LKV_ENOTSUP && rc != LKV_EBUSY && rc != LKV_EINVAL) {
        snprintf(ps->err, sizeof(ps->err), "placing the worker's device pages: %s", why);
        return rc;
    }
    /* 3. Anywhere, one page more, at a whole-page offset from the region. */
    LKV_LOGI("page space: worker pages not placed next to the daemon's arena (%s): a plain "
             "allocation at a whole-page offset",
             why[0] ? why : lkv_err_name(rc));
    bytes = lb + pb;
    rc = d->alloc(d->ctx, bytes, &p, why, sizeof(why));
    if (rc != 0) {
        snprintf(ps->err, sizeof(ps->err), "allocating %" PRIu64 " bytes of worker pages: %s",
                 bytes, why);
        return rc;
    }
    ps->dev_local = p;
    ps->dev_local_bytes = bytes;
    ps->dev_local_placed = 0;
    ps->placement = LKV_PS_DEV_OFFSET;
    uintptr_t a = (uintptr_t)p, lo;
    if (a >= r) {
        lo = r + (a - r + pb - 1) / pb * pb; /* < a + pb */
    } else {
        lo = r - (r - a) / pb * pb; /* In [a, a + pb); a + bytes <= b <= r, so lo + lb <= r. */
    }
    return set_layout(ps, r, lo, pb, n);
}

/* lkv_pagespace_map for an arena of ps->dev's backend. */
static int map_dev(lkv_pagespace *ps, const lkv_lease_arena *a, const lkv_arena_region *rg)
{
    if (ps->base != NULL && ps->dev_arena != NULL && ps->n_daemon == rg->n_pages &&
        ps->page_bytes == rg->page_bytes && ps->region_base == rg->base_offset &&
        memcmp(ps->ipc, a->cuda_ipc, sizeof(ps->ipc)) == 0 &&
        strcmp(ps->shm_name, a->shm_name) == 0) {
        return 0; /* Mapped once per daemon arena. */
    }
    unmap(ps);
    if (rg->n_pages == 0 || rg->page_bytes == 0 ||
        rg->base_offset + (uint64_t)rg->n_pages * rg->page_bytes > a->arena_bytes) {
        snprintf(ps->err, sizeof(ps->err),
                 "the reply names no arena region inside the arena's %" PRIu64 " bytes",
                 a->arena_bytes);
        return LKV_EIO;
    }
    char why[256] = "";
    void *b = NULL;
    int rc = ps->dev->open(ps->dev->ctx, a, &b, why, sizeof(why));
    if (rc != 0) {
        snprintf(ps->err, sizeof(ps->err), "opening the daemon's %s arena: %s", a->backend, why);
        return rc;
    }
    ps->dev_arena = b;
    uintptr_t r = (uintptr_t)b + rg->base_offset;
    rc = place_dev(ps, (uintptr_t)b, a->arena_bytes, r, rg->page_bytes, rg->n_pages);
    if (rc != 0) {
        unmap(ps);
        ps->base = NULL;
        return rc;
    }
    memcpy(ps->ipc, a->cuda_ipc, sizeof(ps->ipc));
    snprintf(ps->shm_name, sizeof(ps->shm_name), "%s", a->shm_name);
    ps->region_base = rg->base_offset;
    ps->mapped_writable = 1; /* A device mapping is always read-write (cache.proto, Trust). */
    ps->n_maps++;
    return 0;
}

int lkv_pagespace_map(lkv_pagespace *ps, const lkv_lease_arena *a, const char *profile)
{
    if (ps->dev != NULL) {
        if (strcmp(a->backend, ps->dev->arena_backend) != 0) {
            snprintf(ps->err, sizeof(ps->err),
                     "the daemon's arena is '%s'; this worker's backend reads a '%s' arena in "
                     "place (run lazykvd with hot_backend=%s, or the worker on the CPU backend)",
                     a->backend, ps->dev->arena_backend, ps->dev->arena_backend);
            return LKV_ENOTSUP;
        }
        const lkv_arena_region *rg = find_region(ps, a, profile);
        return rg == NULL ? LKV_EPROFILE : map_dev(ps, a, rg);
    }
    if (strcmp(a->backend, "host") != 0) {
        snprintf(ps->err, sizeof(ps->err),
                 "the daemon's arena is '%s'; the CPU worker maps only a host (shm) arena",
                 a->backend);
        return LKV_ENOTSUP;
    }
    const lkv_arena_region *rg = find_region(ps, a, profile);
    if (rg == NULL) {
        return LKV_EPROFILE;
    }
    if (ps->base != NULL && ps->n_daemon == rg->n_pages && ps->page_bytes == rg->page_bytes &&
        ps->region_base == rg->base_offset && ps->mapped_writable == ps->writable &&
        strcmp(ps->shm_name, a->shm_name) == 0) {
        return 0; /* Mapped once per daemon arena. */
    }
    unmap(ps);
    if (rg->n_pages == 0 || rg->page_bytes == 0 || a->shm_name[0] == '\0') {
        snprintf(ps->err, sizeof(ps->err), "the reply names no arena region");
        return LKV_EIO;
    }
    long os_page = sysconf(_SC_PAGESIZE);
    if (os_page > 0 && rg->base_offset % (uint64_t)os_page != 0) {
        snprintf(ps->err, sizeof(ps->err),
                 "region '%.64s' starts at %" PRIu64 ", not on a %ld-byte page boundary", profile,
                 rg->base_offset, os_page);
        return LKV_EINVAL;
    }
    int fd = shm_open(a->shm_name, ps->writable ? O_RDWR : O_RDONLY, 0);
    if (fd < 0) {
        snprintf(ps->err, sizeof(ps->err), "shm_open(%.200s): %s", a->shm_name, strerror(errno));
        return LKV_EIO;
    }
    struct stat sb;
    uint64_t need = (uint64_t)rg->n_pages * rg->page_bytes;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < rg->base_offset + need) {
        snprintf(ps->err, sizeof(ps->err),
                 "%.200s is smaller than region '%.64s' (%" PRIu32 " pages of %" PRIu64
                 " at %" PRIu64 ")",
                 a->shm_name, profile, rg->n_pages, rg->page_bytes, rg->base_offset);
        close(fd);
        return LKV_EIO;
    }
    int rc = reserve(ps, rg->page_bytes, rg->n_pages);
    int prot = ps->writable ? PROT_READ | PROT_WRITE : PROT_READ;
    if (rc == 0 && mmap(ps->base, need, prot, MAP_SHARED | MAP_FIXED, fd, (off_t)rg->base_offset) ==
                       MAP_FAILED) {
        snprintf(ps->err, sizeof(ps->err), "mmap(%.200s): %s", a->shm_name, strerror(errno));
        unmap(ps);
        rc = LKV_EIO;
    }
    close(fd);
    if (rc == 0) {
        snprintf(ps->shm_name, sizeof(ps->shm_name), "%s", a->shm_name);
        ps->region_base = rg->base_offset;
        ps->mapped_writable = ps->writable;
        ps->n_maps++;
    }
    return rc;
}

int lkv_pagespace_map_local(lkv_pagespace *ps, uint64_t page_bytes)
{
    if (ps->base != NULL) {
        return 0;
    }
    if (ps->dev == NULL) {
        return reserve(ps, page_bytes, 0);
    }
    char why[256] = "";
    void *p = NULL;
    uint64_t bytes = (uint64_t)ps->n_local * page_bytes;
    int rc =
        page_bytes > 0 ? ps->dev->alloc(ps->dev->ctx, bytes, &p, why, sizeof(why)) : LKV_EINVAL;
    if (rc != 0) {
        snprintf(ps->err, sizeof(ps->err), "allocating %" PRIu64 " bytes of worker pages: %s",
                 bytes, why);
        return rc;
    }
    ps->dev_local = p;
    ps->dev_local_bytes = bytes;
    ps->base = p;
    ps->page_bytes = page_bytes;
    ps->map_bytes = bytes;
    ps->first_local = 0;
    ps->n_daemon = 0;
    ps->placement = LKV_PS_DEV_LOCAL;
    return 0;
}

void lkv_pagespace_view(const lkv_pagespace *ps, const lkv_kv_shape *shape, lkv_model_kv *kv)
{
    memset(kv, 0, sizeof(*kv));
    kv->shape = *shape;
    kv->page_bytes = ps->page_bytes;
    kv->n_pages = ps->first_local + ps->n_local;
    kv->n_used = ps->first_local;
    kv->base = ps->base;
    kv->owned = 0;
}
