/*
 * lkv_arena.h: the hot tier's memory, one allocation carved into fixed-size pages.
 *
 * The arena is allocated once, at start-up, and never grows: nothing is allocated in the request
 * path. Page i occupies bytes [i * page_bytes, (i + 1) * page_bytes) of the allocation; a page
 * holds one block (DESIGN.md 3) and its index is what a block reference carries (bits 0..23), so
 * an arena has at most LKV_REF_MAX_PAGE + 1 pages. Free pages are kept on a stack (LIFO).
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

enum lkv_arena_backend {
    LKV_ARENA_AUTO = 0,
    LKV_ARENA_HOST = 1,
    LKV_ARENA_CUDA = 2,
};

typedef struct lkv_arena lkv_arena; /* Opaque. */

/* Page size for blocks of block_bytes: rounded up to a multiple of 4096. */
uint64_t lkv_arena_page_size(uint64_t block_bytes);

/* Creates an arena of n_pages pages of page_bytes (a multiple of 4096) on backend, on CUDA
 * device cuda_device where that applies. Returns LKV_EINVAL for bad sizes (0 pages, more than
 * LKV_REF_MAX_PAGE + 1, page_bytes not a multiple of 4096), LKV_EIO if shared memory fails,
 * LKV_ENOTSUP for cuda without CUDA support, LKV_ECUDA if the device or the allocation fails.
 * *out is owned by the caller and freed with lkv_arena_destroy. */
int lkv_arena_create(int backend, int cuda_device, uint64_t page_bytes, uint32_t n_pages,
                     lkv_arena **out);

/* Unlinks shared memory objects left by arenas of processes that died without destroying them
 * (/dev/shm/lazykv-<pid>-* whose pid no longer exists): a crashed lazykvd must not hold host
 * memory until reboot. Called by lkv_arena_create for the host backend; returns the number of
 * objects removed. Assumes one pid namespace per /dev/shm (true for a container or pod). */
int lkv_arena_shm_sweep(void);

/* Frees the memory (unlinks the shared memory object). a may be NULL. */
void lkv_arena_destroy(lkv_arena *a);

/* Takes n pages off the free list into pages[0..n) (caller-owned array). All or nothing:
 * LKV_ENOSPC if fewer than n are free. */
int lkv_arena_alloc(lkv_arena *a, uint32_t n, uint32_t *pages);

/* Returns n pages (borrowed array) to the free list. Freeing a page twice is a bug (asserted). */
void lkv_arena_free(lkv_arena *a, uint32_t n, const uint32_t *pages);

/* Copies len (<= page_bytes) bytes of host memory src into page, at its start. */
int lkv_arena_write(lkv_arena *a, uint32_t page, const void *src, size_t len);

/* Copies len (<= page_bytes) bytes from the start of page into host memory dst. */
int lkv_arena_read(lkv_arena *a, uint32_t page, void *dst, size_t len);

/* Host pointer to the start of page (host backend), or NULL (cuda backend). Borrowed, valid
 * until destroy. */
void *lkv_arena_host_ptr(lkv_arena *a, uint32_t page);

int lkv_arena_backend(const lkv_arena *a); /* LKV_ARENA_HOST or LKV_ARENA_CUDA. */
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
