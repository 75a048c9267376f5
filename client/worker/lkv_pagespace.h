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
 * Not thread-safe: one worker thread owns a page space.
 */
#ifndef LKV_PAGESPACE_H
#define LKV_PAGESPACE_H

#include <stdint.h>

#include "lkv_client.h"
#include "lkv_model.h"

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
} lkv_pagespace;

/* Zeroes ps: nothing mapped. n_local worker pages (>= 1) are made by the first map. */
void lkv_pagespace_init(lkv_pagespace *ps, uint32_t n_local);

/* Unmaps everything and zeroes ps (keeps nothing). Safe on an initialised, unmapped ps. */
void lkv_pagespace_free(lkv_pagespace *ps);

/* Maps the region of profile (borrowed) of the daemon arena described by a (borrowed; from an
 * Attach or Reserve reply: backend "host") at the start of the range, and n_local worker pages of
 * the region's page_bytes after it. Does nothing if that region (same shm name, base, page size
 * and page count) is already mapped. Returns 0, LKV_ENOTSUP (a "cuda" arena: the CPU worker
 * cannot read HBM), LKV_EPROFILE (the arena has no region of profile), LKV_EINVAL (sizes: page
 * count above the block reference's 2^24 pages with the worker's, a base not on an OS page
 * boundary), or LKV_EIO (shm_open / mmap failed, or the object is smaller than the region:
 * ps->err says why). On failure ps is left unmapped. */
int lkv_pagespace_map(lkv_pagespace *ps, const lkv_lease_arena *a, const char *profile);

/* Maps worker pages only (no daemon: local mode), of page_bytes each, unless a range is mapped
 * already (then it keeps it: the daemon's page stride works for local pages too). */
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
    return page < ps->n_daemon;
}

#endif
