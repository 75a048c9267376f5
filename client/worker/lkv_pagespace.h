/*
 * lkv_pagespace.h: the decode worker's view of KV pages: the daemon's hot arena mapped in place
 * (zero copy) and the worker's own pages, in ONE address range with one page stride, so that one
 * list of block references (kernels/lkv_layout.h) can name both and the attention kernels take
 * one arena base:
 *
 *     base                                    base + first_local * page_bytes
 *     | daemon pages 0 .. n_daemon-1 (PROT_READ, | worker pages first_local .. +n_local-1     |
 *     |  MAP_SHARED of the daemon's shm object)  |  (private, read-write: misses, the question, |
 *     |                                          |  generated tokens, materialised copies)      |
 *
 * The daemon's part is the REGION of the worker's profile in the daemon's arena (the arena
 * contract, cache.proto: one region per profile, each with its own page size, at a 2 MiB-aligned
 * base_offset): the shm object's bytes [base_offset, base_offset + n_pages * page_bytes), so
 * daemon page p here is page p of that region and the stride is the region's page_bytes. A
 * document attached under a lease is read where the daemon keeps it: its block b is region page
 * pages[b], so its reference names that page and nothing is copied. The daemon's pages are mapped
 * read-only (the worker cannot corrupt the cache) unless writable is set: then read-write, so
 * that a miss is computed straight into the pages the daemon reserved for it (put in place; a
 * worker allowed to Reserve is trusted with the whole arena anyway, cache.proto "Trust").
 *
 * The range is reserved once (PROT_NONE) and the two parts are mapped over it with MAP_FIXED. The
 * region is mapped once per daemon arena: lkv_pagespace_map does nothing when the region is the
 * one already mapped, and remaps (counted in n_maps) when the daemon restarted with a new arena.
 * Without a daemon (local mode) there are no daemon pages.
 *
 * DEVICE ARENAS (a "cuda" arena in HBM, read by a CUDA backend; DESIGN.md 7.1). The kernels take
 * one base pointer and one page stride per launch and a reference names at most 2^24 pages, but
 * the daemon's allocation (opened once with cudaIpcOpenMemHandle, which picks its address) and
 * the worker's own pages are two device allocations. The worker pages are therefore PLACED so
 * that both sit at whole-page offsets from one base, in this order of preference:
 *   1. AFTER: the driver's VMM API reserves the address range right after the imported mapping
 *      (cuMemAddressReserve with that address as the hint, cuMemCreate + cuMemMap +
 *      cuMemSetAccess); base = the region's page 0, worker pages from first_local on, exactly as
 *      for a host arena (daemon0 = 0).
 *   2. BELOW: the same, right below the imported mapping; base = the first worker page, worker
 *      pages 0 .. n_local-1, the region's page p is page daemon0 + p.
 *   3. OFFSET (the fallback when the VMM API or both ranges are unavailable): a plain allocation
 *      of one page more than the worker pages, which always holds n_local pages at a whole-page
 *      offset from the region, above it (daemon0 = 0) or below it (daemon0 > 0).
 * Whatever the placement, every page index used (daemon0 + n_daemon, first_local + n_local) must
 * be below 2^24: if the plain allocation lies farther from the region than that, mapping fails
 * with LKV_EINVAL and a message saying so (nothing stays mapped; the request fails clearly rather
 * than read a wrong page). Hits are read in place from the daemon's HBM pages and misses are
 * computed straight into reserved HBM pages (put in place); nothing is copied either way. The
 * device operations come from the backend (lkv_devmap, lkv_backend.devmap); this module does the
 * placement arithmetic only and never dereferences a device pointer, so the placement is tested
 * on the CPU with host operations (tests/client/worker/lkv_test_devmap.h).
 *
 * Not thread-safe: one worker thread owns a page space.
 */
#ifndef LKV_PAGESPACE_H
#define LKV_PAGESPACE_H

#include <stdint.h>

#include "lkv_client.h"
#include "lkv_model.h"

/* Device memory operations of a backend that maps the daemon's arena itself (the CUDA backend:
 * cudaIpcOpenMemHandle and the VMM API). Pointers are device addresses, never dereferenced by
 * the page space. Every function returns 0 or an LKV_E* code with a message in err. */
typedef struct lkv_devmap {
    const char *arena_backend; /* The arena backend it maps ("cuda"; the CPU tests' "host"). */
    void *ctx;                 /* Passed to every op; owned by the backend. */
    /* Opens the whole allocation of arena a (borrowed): *base, arena_bytes long. */
    int (*open)(void *ctx, const lkv_lease_arena *a, void **base, char *err, size_t len);
    void (*close)(void *ctx, void *base);
    /* Placement granularity of alloc_at (a power of two, e.g. 2 MiB). */
    uint64_t (*granularity)(void *ctx);
    /* Allocates bytes (a multiple of granularity) of zeroed device memory at exactly at (a
     * multiple of granularity): 0, or LKV_EBUSY (the range is taken: nothing allocated), or
     * LKV_ENOTSUP (no placed allocations here). */
    int (*alloc_at)(void *ctx, uintptr_t at, uint64_t bytes, void **out, char *err, size_t len);
    /* Allocates bytes of zeroed device memory anywhere. */
    int (*alloc)(void *ctx, uint64_t bytes, void **out, char *err, size_t len);
    /* Frees an allocation of alloc_at or alloc (bytes as allocated; placed: 1 from alloc_at). */
    void (*free)(void *ctx, void *p, uint64_t bytes, int placed);
} lkv_devmap;

/* Where the worker pages were put (lkv_pagespace.placement). */
enum lkv_ps_placement {
    LKV_PS_NONE = 0,       /* Nothing mapped. */
    LKV_PS_HOST = 1,       /* Host memory (shm arena or local only, CPU backend). */
    LKV_PS_EXTERNAL = 2,   /* lkv_pagespace_use: someone else's pages, no daemon. */
    LKV_PS_DEV_LOCAL = 3,  /* Device pages only (no daemon arena mapped). */
    LKV_PS_DEV_AFTER = 4,  /* Device: VMM right after the imported arena. */
    LKV_PS_DEV_BELOW = 5,  /* Device: VMM right below it. */
    LKV_PS_DEV_OFFSET = 6, /* Device: a plain allocation at a whole-page offset (fallback). */
};

/* "host", "external", "dev-local", "dev-after", "dev-below", "dev-offset" or "none". */
const char *lkv_ps_placement_name(int placement);

typedef struct lkv_pagespace {
    uint8_t *base;        /* Start of the range, or NULL before the first map. */
    uint64_t page_bytes;  /* Stride of every page (the region's page_bytes). */
    uint64_t region_base; /* The region's base_offset in the daemon's arena. */
    uint32_t n_daemon;    /* Daemon pages mapped at the start (0 in local mode). */
    uint32_t first_local; /* First worker page: n_daemon, or a little more when the daemon
                           * part does not end on an OS page (pages between are never used). */
    uint32_t n_local;     /* Worker pages from first_local on. */
    char shm_name[256];   /* The daemon's shm object mapped, "" if none. */
    uint64_t map_bytes;   /* Bytes reserved (first_local + n_local) * page_bytes, rounded up. */
    uint64_t n_maps;      /* Times a daemon arena was mapped (1 per daemon lifetime). */
    int writable;         /* Set before the first map: 1 maps the daemon region read-write
                           * (the worker computes misses into reserved pages: put in place),
                           * 0 read-only (the default: the worker cannot write the cache). */
    int mapped_writable;  /* How the mapped region was mapped. */
    char err[512];        /* Message of the last failure. */
    int external;         /* 1: base is n_local pages someone else owns (lkv_pagespace_use). */
    /* Device arenas (dev set): */
    const lkv_devmap *dev;    /* Set before the first map: the backend's device ops (borrowed), or
                               * NULL (host memory: shm arenas only). */
    uint32_t daemon0;         /* Index of the region's page 0 from base: 0, or n_local or more
                               * when the worker pages lie below the region (LKV_PS_DEV_BELOW,
                               * LKV_PS_DEV_OFFSET). Always 0 for a host arena. */
    int placement;            /* enum lkv_ps_placement. */
    void *dev_arena;          /* The opened daemon allocation (dev->open), or NULL. */
    void *dev_local;          /* The worker pages' allocation, or NULL. */
    uint64_t dev_local_bytes; /* Its size. */
    int dev_local_placed;     /* 1: from alloc_at. */
    uint8_t ipc[64];          /* The mapped arena's IPC handle (a new one: a restarted daemon). */
} lkv_pagespace;

/* Zeroes ps: nothing mapped. n_local worker pages (>= 1) are made by the first map. */
void lkv_pagespace_init(lkv_pagespace *ps, uint32_t n_local);

/* Unmaps everything and zeroes ps (keeps nothing). Safe on an initialised, unmapped ps. */
void lkv_pagespace_free(lkv_pagespace *ps);

/* Maps the region of profile (borrowed) of the daemon arena described by a (borrowed; from an
 * Attach or Reserve reply) and n_local worker pages of the region's page_bytes with it: a "host"
 * arena (ps->dev NULL) at the start of the range with the worker pages after it; an arena of
 * ps->dev's backend through ps->dev, the worker pages placed as described above. Does nothing if
 * that region (same shm name or IPC handle, base, page size and page count) is already mapped.
 * Returns 0, LKV_ENOTSUP (an arena backend this page space cannot read: a "cuda" arena without
 * device ops, a "host" arena with them), LKV_EPROFILE (the arena has no region of profile),
 * LKV_EINVAL (sizes: page indices past the block reference's 2^24 pages, a base not on an OS
 * page boundary, device allocations too far apart), LKV_EIO (shm_open / mmap failed, or the
 * object is smaller than the region), or the device ops' error (ps->err says why). On failure
 * ps is left unmapped. */
int lkv_pagespace_map(lkv_pagespace *ps, const lkv_lease_arena *a, const char *profile);

/* Maps worker pages only (no daemon: local mode), of page_bytes each (device memory from
 * ps->dev when set), unless a range is mapped already (then it keeps it: the daemon's page
 * stride works for local pages too). */
int lkv_pagespace_map_local(lkv_pagespace *ps, uint64_t page_bytes);

/* Uses n_local pages of page_bytes at pages (borrowed, e.g. device memory of a CUDA backend:
 * never dereferenced here) as the worker pages, with no daemon pages (local mode). */
void lkv_pagespace_use(lkv_pagespace *ps, void *pages, uint64_t page_bytes);

/* Fills *kv with a view (not owned: kv->owned 0) of the range for shape: pages 0 ..
 * first_local + n_local - 1, with the bump allocator at the first worker page, so that pages the
 * runner takes are worker pages. Call once per request (the worker pages are reused). ps must be
 * mapped. */
void lkv_pagespace_view(const lkv_pagespace *ps, const lkv_kv_shape *shape, lkv_model_kv *kv);

/* 1 if page lies in the daemon's part (a zero-copy read), else 0. */
static inline int lkv_pagespace_is_daemon(const lkv_pagespace *ps, uint32_t page)
{
    return page >= ps->daemon0 && page - ps->daemon0 < ps->n_daemon;
}

/* The index (from base) of page p of the daemon's region (p < n_daemon): what a block reference
 * of an attached or reserved page carries. */
static inline uint32_t lkv_pagespace_daemon_page(const lkv_pagespace *ps, uint32_t p)
{
    return ps->daemon0 + p;
}

#endif
