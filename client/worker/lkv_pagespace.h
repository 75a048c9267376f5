/*
 * lkv_pagespace.h: the decode worker's view of KV pages: the daemon's hot arena mapped in place
 * (zero copy) and the worker's own pages, in ONE address range with one page stride, so that one
 * list of block references (kernels/lkv_layout.h) can name both and the attention kernels take
 * one arena base:
 *
 *     base                                    base + n_daemon * page_bytes
 *     | daemon pages 0 .. n_daemon-1 (PROT_READ, | worker pages n_daemon .. n_daemon+n_local-1 |
 *     |  MAP_SHARED of the daemon's shm object)  |  (private, read-write: misses, the question, |
 *     |                                          |  generated tokens, materialised copies)      |
 *
 * A document attached under a lease is read where the daemon keeps it: its block b is daemon page
 * pages[b], so its reference names that page and nothing is copied. The daemon's pages are mapped
 * read-only: the worker cannot corrupt the cache.
 *
 * The range is reserved once (PROT_NONE) and the two parts are mapped over it with MAP_FIXED. The
 * shm object is mapped once per daemon arena: lkv_pagespace_map does nothing when the arena is
 * the one already mapped, and remaps (counted in n_maps) when the daemon restarted with a new
 * arena. Without a daemon (local mode) there are no daemon pages.
 *
 * Not thread-safe: one worker thread owns a page space.
 */
#ifndef LKV_PAGESPACE_H
#define LKV_PAGESPACE_H

#include <stdint.h>

#include "lkv_client.h"
#include "lkv_model.h"

typedef struct lkv_pagespace {
    uint8_t *base;       /* Start of the range, or NULL before the first map. */
    uint64_t page_bytes; /* Stride of every page. */
    uint32_t n_daemon;   /* Daemon pages mapped at the start (0 in local mode). */
    uint32_t n_local;    /* Worker pages after them. */
    char shm_name[256];  /* The daemon's shm object mapped, "" if none. */
    uint64_t map_bytes;  /* Bytes reserved (n_daemon + n_local) * page_bytes. */
    uint64_t n_maps;     /* Times a daemon arena was mapped (1 per daemon lifetime). */
    char err[512];       /* Message of the last failure. */
    int external;        /* 1: base is n_local pages someone else owns (lkv_pagespace_use). */
} lkv_pagespace;

/* Zeroes ps: nothing mapped. n_local worker pages (>= 1) are made by the first map. */
void lkv_pagespace_init(lkv_pagespace *ps, uint32_t n_local);

/* Unmaps everything and zeroes ps (keeps nothing). Safe on an initialised, unmapped ps. */
void lkv_pagespace_free(lkv_pagespace *ps);

/* Maps the daemon arena described by a (borrowed; from an Attach reply: backend "host") at the
 * start of the range, and n_local worker pages of a->page_bytes after it. Does nothing if that
 * arena (same shm name, page size and page count) is already mapped. Returns 0, LKV_ENOTSUP (a
 * "cuda" arena: the CPU worker cannot read HBM), LKV_EINVAL (sizes: page count above the block
 * reference's 2^24 pages with the worker's), or LKV_EIO (shm_open / mmap failed: ps->err says
 * why). On failure ps is left unmapped. */
int lkv_pagespace_map(lkv_pagespace *ps, const lkv_lease_arena *a);

/* Maps worker pages only (no daemon: local mode), of page_bytes each, unless a range is mapped
 * already (then it keeps it: the daemon's page stride works for local pages too). */
int lkv_pagespace_map_local(lkv_pagespace *ps, uint64_t page_bytes);

/* Uses n_local pages of page_bytes at pages (borrowed, e.g. device memory of a CUDA backend:
 * never dereferenced here) as the worker pages, with no daemon pages (local mode). */
void lkv_pagespace_use(lkv_pagespace *ps, void *pages, uint64_t page_bytes);

/* Fills *kv with a view (not owned: kv->owned 0) of the range for shape: pages 0 ..
 * n_daemon + n_local - 1, with the bump allocator at the first worker page, so that pages the
 * runner takes are worker pages. Call once per request (the worker pages are reused). ps must be
 * mapped. */
void lkv_pagespace_view(const lkv_pagespace *ps, const lkv_kv_shape *shape, lkv_model_kv *kv);

/* 1 if page lies in the daemon's part (a zero-copy read), else 0. */
static inline int lkv_pagespace_is_daemon(const lkv_pagespace *ps, uint32_t page)
{
    return page < ps->n_daemon;
}

#endif
