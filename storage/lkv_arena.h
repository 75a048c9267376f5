/*
 * lkv_arena.h: the hot tier's memory, one allocation carved into regions of fixed-size pages.
 *
 * The arena is allocated once, at start-up, and never grows: nothing is allocated in the request
 * path. It is carved into n_regions REGIONS (the store makes one per model profile, DESIGN.md 4
 * "The arena contract"), each with its own page size: region r starts at byte base_offset(r) of
 * the allocation (a multiple of LKV_ARENA_REGION_ALIGN, 2 MiB) and page i of region r occupies
 * bytes [base_offset(r) + i * page_bytes(r), ... + page_bytes(r)). A page holds one block
 * (DESIGN.md 3) and its index WITHIN ITS REGION is what a block reference carries (bits 0..23),
 * so a region has at most LKV_REF_MAX_PAGE + 1 pages. Page sizes are multiples of
 * LKV_ARENA_PAGE_ALIGN (256 B). Free pages are kept on one stack per region (LIFO).
 *
 * Backends:
 *   host  POSIX shared memory: shm_open("/lazykv-<pid>-<n>-<random>", O_CREAT|O_EXCL, 0600),
 *         ftruncate, mmap(MAP_SHARED). The object is unlinked at destroy; while the arena lives
 *         a co-located process may map it by name (lkv_arena_shm_name).
 *   cuda  one cudaMalloc on a device; pages are copied in and out with cudaMemcpy, and the
 *         allocation is exported with cudaIpcGetMemHandle for co-located workers. Compiled only
 *         with LKV_HAVE_CUDA (storage/cuda/); otherwise LKV_ENOTSUP.
 *   auto  cuda if a device is present, else host.
 *
 * Thread safety: alloc/free (the free list) must be serialised by the caller; page reads and
 * writes may run concurrently from any threads as long as they touch pages the caller owns.
 */
#ifndef LKV_ARENA_H
#define LKV_ARENA_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

enum lkv_arena_backend {
    LKV_ARENA_AUTO = 0,
    LKV_ARENA_HOST = 1,
    LKV_ARENA_CUDA = 2,
};

typedef struct lkv_arena lkv_arena; /* Opaque. */

/* Every page size is a multiple of this: 256 B is cudaMalloc's alignment and more than any
 * vector load, TMA copy or cache line needs; a 20 KiB block takes a 20 KiB page. */
#define LKV_ARENA_PAGE_ALIGN 256u
/* Every region starts at a multiple of this (a huge page / large GPU page). */
#define LKV_ARENA_REGION_ALIGN (2u << 20)
/* Regions in one arena, at most. */
#define LKV_ARENA_MAX_REGIONS 64

/* One region as configured at create. */
typedef struct lkv_arena_region_cfg {
    uint64_t page_bytes; /* A multiple of LKV_ARENA_PAGE_ALIGN, > 0. */
    uint32_t n_pages;    /* 1..LKV_REF_MAX_PAGE + 1. */
} lkv_arena_region_cfg;

/* One region as laid out (lkv_arena_region). */
typedef struct lkv_arena_region_info {
    uint64_t base_offset; /* Byte offset of page 0 in the allocation (2 MiB aligned). */
    uint64_t page_bytes;  /* Bytes of one page. */
    uint32_t n_pages;     /* Pages. */
    uint32_t n_free;      /* Pages free now. */
} lkv_arena_region_info;

/* Page size for blocks of block_bytes: rounded up to a multiple of LKV_ARENA_PAGE_ALIGN. */
uint64_t lkv_arena_page_size(uint64_t block_bytes);

/* Creates an arena of n_regions (1..LKV_ARENA_MAX_REGIONS) regions regions[0..n) (borrowed) on
 * backend, on CUDA device cuda_device where that applies. Region r is placed at the first
 * LKV_ARENA_REGION_ALIGN boundary after region r - 1 (region 0 at offset 0); the allocation is
 * the end of the last region (lkv_arena_bytes). Returns
 * LKV_EINVAL for bad sizes (0 pages, more than LKV_REF_MAX_PAGE + 1, a page size not a positive
 * multiple of LKV_ARENA_PAGE_ALIGN, overflow), LKV_EIO if shared memory fails, LKV_ENOTSUP for
 * cuda without CUDA support, LKV_ECUDA if the device or the allocation fails. *out is owned by
 * the caller and freed with lkv_arena_destroy. */
int lkv_arena_create_regions(int backend, int cuda_device, const lkv_arena_region_cfg *regions,
                             int n_regions, lkv_arena **out);

/* One region of n_pages pages of page_bytes: lkv_arena_create_regions with one region. */
int lkv_arena_create(int backend, int cuda_device, uint64_t page_bytes, uint32_t n_pages,
                     lkv_arena **out);

/* Unlinks shared memory objects left by arenas of processes that died without destroying them
 * (/dev/shm/lazykv-<pid>-* whose pid no longer exists): a crashed lazykvd must not hold host
 * memory until reboot. Called by lkv_arena_create for the host backend; returns the number of
 * objects removed. Assumes one pid namespace per /dev/shm (true for a container or pod). */
int lkv_arena_shm_sweep(void);

/* Frees the memory (unlinks the shared memory object). a may be NULL. */
void lkv_arena_destroy(lkv_arena *a);

/* In every call below, region is 0..n_regions-1 and page an index within that region. */

/* Takes n pages of region off its free list into pages[0..n) (caller-owned array). All or
 * nothing: LKV_ENOSPC if fewer than n are free (LKV_EINVAL for a bad region). */
int lkv_arena_alloc(lkv_arena *a, int region, uint32_t n, uint32_t *pages);

/* Returns n pages (borrowed array) to region's free list. Freeing a page twice is a bug
 * (asserted). */
void lkv_arena_free(lkv_arena *a, int region, uint32_t n, const uint32_t *pages);

/* Copies len (<= the region's page_bytes) bytes of host memory src into page, at its start. */
int lkv_arena_write(lkv_arena *a, int region, uint32_t page, const void *src, size_t len);

/* Copies n pieces of host memory (borrowed iovecs, in order, as one run of bytes whose total is
 * <= the region's page_bytes) into page, from its start: one copy of each byte, the gather
 * lkv_arena_write would need a staging buffer for. */
int lkv_arena_writev(lkv_arena *a, int region, uint32_t page, const struct iovec *iov, size_t n);

/* Copies len (<= the region's page_bytes) bytes from the start of page into host memory dst. */
int lkv_arena_read(lkv_arena *a, int region, uint32_t page, void *dst, size_t len);

/* Completion of an asynchronous read (lkv_arena_read_async): caller-owned, usually embedded in
 * the reader's state; fn(self, rc) is called once, rc 0 (the bytes are there) or LKV_ECUDA. */
typedef struct lkv_arena_done {
    void (*fn)(struct lkv_arena_done *self, int rc);
} lkv_arena_done;

/* Copies the first len (<= the region's page_bytes) bytes of each of pages[0..n) (borrowed)
 * into dst + i * len (caller-owned, n * len bytes). Host arena: at once, returns 0 and done is
 * not used. CUDA arena: queues cudaMemcpyAsync copies on one of the arena's streams (so dst should
 * be page-locked, lkv_stage.h, for a real DMA) and returns LKV_EAGAIN: done->fn(done, rc) is
 * then called exactly once from a CUDA callback thread, which must not call CUDA; until then
 * the pages must stay owned and dst and done valid. Errors (< 0, done not called, no copy left
 * in flight): LKV_EINVAL (a bad region, page or len), LKV_ECUDA, LKV_ENOTSUP. */
int lkv_arena_read_async(lkv_arena *a, int region, const uint32_t *pages, uint32_t n, size_t len,
                         void *dst, lkv_arena_done *done);

/* Most CUDA streams of asynchronous reads (lkv_arena_set_read_streams). */
#define LKV_ARENA_MAX_STREAMS 16

/* Gives a CUDA arena n (1..LKV_ARENA_MAX_STREAMS) streams for lkv_arena_read_async, taken in
 * turn by successive reads (each read's copies and completion on one stream); call before any
 * read (not thread-safe). A host arena ignores it (0). LKV_EINVAL, LKV_ECUDA. Default 1. */
int lkv_arena_set_read_streams(lkv_arena *a, int n);

/* Host pointer to the start of page (host backend), or NULL (cuda backend, bad region or
 * page). Borrowed, valid until destroy. */
void *lkv_arena_host_ptr(lkv_arena *a, int region, uint32_t page);

int lkv_arena_backend(const lkv_arena *a);    /* LKV_ARENA_HOST or LKV_ARENA_CUDA. */
int lkv_arena_n_regions(const lkv_arena *a);  /* Regions (>= 1). */
uint64_t lkv_arena_bytes(const lkv_arena *a); /* Bytes of the whole allocation. */
/* Writes region r's layout and free count into *out; LKV_EINVAL for a bad r. */
int lkv_arena_region(const lkv_arena *a, int r, lkv_arena_region_info *out);
/* Shorthands for region 0 (page_bytes) and for all regions together (pages). */
uint64_t lkv_arena_page_bytes(const lkv_arena *a);
uint32_t lkv_arena_pages_total(const lkv_arena *a);
uint32_t lkv_arena_pages_free(const lkv_arena *a);
int lkv_arena_cuda_device(const lkv_arena *a); /* -1 for host. */

/* The shared memory object's name (host), or NULL (cuda). Borrowed, valid until destroy. */
const char *lkv_arena_shm_name(const lkv_arena *a);

/* Copies the cudaIpcMemHandle_t of the allocation (64 bytes) into out (cuda), or writes zeros
 * and returns LKV_ENOTSUP (host). */
int lkv_arena_cuda_ipc_handle(const lkv_arena *a, uint8_t out[64]);

#endif
