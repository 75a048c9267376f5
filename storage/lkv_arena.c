/*
 * lkv_arena.c: the hot arena (see lkv_arena.h): one allocation, fixed pages, a free stack.
 *
 * Invariants: free_stack[0..n_free) holds each free page exactly once; used[p] is 1 iff page p
 * is allocated (a byte per page, checked by assert to catch double frees). The host backend's
 * memory is a MAP_SHARED mapping of a POSIX shared memory object created with O_EXCL and mode
 * 0600; its name is unlinked at destroy.
 */
#include "lkv_arena.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lkv_layout.h"
#include "lkv_log.h"

#ifdef LKV_HAVE_CUDA
#include "cuda/lkv_arena_cuda.h"
#endif

#define PAGE_ALIGN 4096u

struct lkv_arena {
    int backend;          /* LKV_ARENA_HOST or LKV_ARENA_CUDA. */
    int device;           /* CUDA device, -1 for host. */
    uint8_t *base;        /* Host mapping or device pointer. */
    uint64_t bytes;       /* n_pages * page_bytes. */
    uint64_t page_bytes;  /* Bytes per page. */
    uint32_t n_pages;     /* Pages. */
    uint32_t n_free;      /* Entries in free_stack. */
    uint32_t *free_stack; /* Free page indices. */
    uint8_t *used;        /* Per page: 1 if allocated. */
    char shm_name[64];    /* Host: shm_open name. */
    uint8_t ipc[64];      /* CUDA: IPC handle bytes. */
};

uint64_t lkv_arena_page_size(uint64_t block_bytes)
{
    return (block_bytes + PAGE_ALIGN - 1) / PAGE_ALIGN * PAGE_ALIGN;
}

int lkv_arena_shm_sweep(void)
{
    static const char prefix[] = "lazykv-";
    int n = 0;
    DIR *dir = opendir("/dev/shm");
    struct dirent *e;
    if (dir == NULL) {
        return 0;
    }
    while ((e = readdir(dir)) != NULL) {
        char *end;
        if (strncmp(e->d_name, prefix, sizeof prefix - 1) != 0) {
            continue;
        }
        long pid = strtol(e->d_name + sizeof prefix - 1, &end, 10);
        if (pid <= 0 || *end != '-' || pid == (long)getpid()) {
            continue;
        }
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) {
            continue; /* Alive (or not ours to judge). */
        }
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        if (shm_unlink(name) == 0) {
            LKV_LOGW("arena: removed %s, left by dead process %ld", name, pid);
            n++;
        }
    }
    closedir(dir);
    return n;
}

static int host_create(lkv_arena *a)
{
    static unsigned seq;
    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
        snprintf(a->shm_name, sizeof a->shm_name, "/lazykv-%ld-%u-%08x", (long)getpid(),
                 __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED), randombytes_random());
        fd = shm_open(a->shm_name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0 && errno != EEXIST) {
            break;
        }
    }
    if (fd < 0) {
        LKV_LOGE("arena: shm_open %s: %s", a->shm_name, strerror(errno));
        a->shm_name[0] = '\0';
        return LKV_EIO;
    }
    /* posix_fallocate, not just ftruncate: reserve the memory now, so that a full /dev/shm is
     * an error here and not a SIGBUS on first touch in the request path. */
    int err = posix_fallocate(fd, 0, (off_t)a->bytes);
    if (err != 0) {
        LKV_LOGE("arena: reserving %llu bytes of shared memory %s: %s",
                 (unsigned long long)a->bytes, a->shm_name, strerror(err));
        goto fail;
    }
    void *p = mmap(NULL, a->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        LKV_LOGE("arena: mmap %s (%llu bytes): %s", a->shm_name, (unsigned long long)a->bytes,
                 strerror(errno));
        goto fail;
    }
    close(fd);
    a->base = p;
    return 0;
fail:
    close(fd);
    shm_unlink(a->shm_name);
    a->shm_name[0] = '\0';
    return LKV_EIO;
}

static int cuda_create(lkv_arena *a, int device)
{
#ifdef LKV_HAVE_CUDA
    void *p = NULL;
    int rc = lkv__cuda_alloc(device, a->bytes, &p, a->ipc);
    if (rc != 0) {
        return rc;
    }
    a->base = p;
    a->device = device;
    return 0;
#else
    (void)a;
    (void)device;
    LKV_LOGE("arena: cuda backend requested but lazykv was built without CUDA");
    return LKV_ENOTSUP;
#endif
}

static int cuda_present(void)
{
#ifdef LKV_HAVE_CUDA
    return lkv__cuda_device_count() > 0;
#else
    return 0;
#endif
}

int lkv_arena_create(int backend, int cuda_device, uint64_t page_bytes, uint32_t n_pages,
                     lkv_arena **out)
{
    lkv_arena *a;
    int rc;

    *out = NULL;
    if (n_pages == 0 || n_pages > LKV_REF_MAX_PAGE + 1u || page_bytes == 0 ||
        page_bytes % PAGE_ALIGN != 0 || page_bytes > UINT64_MAX / n_pages) {
        return LKV_EINVAL;
    }
    if (backend == LKV_ARENA_AUTO) {
        backend = cuda_present() ? LKV_ARENA_CUDA : LKV_ARENA_HOST;
    }
    if (backend != LKV_ARENA_HOST && backend != LKV_ARENA_CUDA) {
        return LKV_EINVAL;
    }
    if (sodium_init() < 0) {
        return LKV_EINTERNAL;
    }
    a = lkv_xcalloc(1, sizeof *a);
    a->backend = backend;
    a->device = -1;
    a->page_bytes = page_bytes;
    a->n_pages = n_pages;
    a->bytes = page_bytes * n_pages;
    if (backend == LKV_ARENA_HOST) {
        lkv_arena_shm_sweep();
    }
    rc = backend == LKV_ARENA_HOST ? host_create(a) : cuda_create(a, cuda_device);
    if (rc != 0) {
        free(a);
        return rc;
    }
    a->free_stack = lkv_xmalloc(sizeof(uint32_t) * n_pages);
    a->used = lkv_xcalloc(n_pages, 1);
    /* Pop order 0, 1, 2, ...: the lowest pages are used first. */
    for (uint32_t i = 0; i < n_pages; i++) {
        a->free_stack[i] = n_pages - 1 - i;
    }
    a->n_free = n_pages;
    LKV_LOGI("arena: %s, %u pages of %llu bytes (%llu MiB)%s%s",
             backend == LKV_ARENA_HOST ? "host shm" : "cuda", n_pages,
             (unsigned long long)page_bytes, (unsigned long long)(a->bytes >> 20),
             a->shm_name[0] ? ", " : "", a->shm_name);
    *out = a;
    return 0;
}

void lkv_arena_destroy(lkv_arena *a)
{
    if (a == NULL) {
        return;
    }
    if (a->backend == LKV_ARENA_HOST) {
        if (a->base != NULL) {
            munmap(a->base, a->bytes);
        }
        if (a->shm_name[0]) {
            shm_unlink(a->shm_name);
        }
    } else {
#ifdef LKV_HAVE_CUDA
        lkv__cuda_free(a->device, a->base);
#endif
    }
    free(a->free_stack);
    free(a->used);
    free(a);
}

int lkv_arena_alloc(lkv_arena *a, uint32_t n, uint32_t *pages)
{
    if (n > a->n_free) {
        return LKV_ENOSPC;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = a->free_stack[--a->n_free];
        assert(!a->used[p]);
        a->used[p] = 1;
        pages[i] = p;
    }
    return 0;
}

void lkv_arena_free(lkv_arena *a, uint32_t n, const uint32_t *pages)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = pages[i];
        assert(p < a->n_pages && a->used[p]);
        a->used[p] = 0;
        a->free_stack[a->n_free++] = p;
    }
}

int lkv_arena_write(lkv_arena *a, uint32_t page, const void *src, size_t len)
{
    if (page >= a->n_pages || len > a->page_bytes) {
        return LKV_EINVAL;
    }
    uint8_t *dst = a->base + (uint64_t)page * a->page_bytes;
    if (a->backend == LKV_ARENA_HOST) {
        memcpy(dst, src, len);
        return 0;
    }
#ifdef LKV_HAVE_CUDA
    return lkv__cuda_h2d(a->device, dst, src, len);
#else
    return LKV_ENOTSUP;
#endif
}

int lkv_arena_read(lkv_arena *a, uint32_t page, void *dst, size_t len)
{
    if (page >= a->n_pages || len > a->page_bytes) {
        return LKV_EINVAL;
    }
    const uint8_t *src = a->base + (uint64_t)page * a->page_bytes;
    if (a->backend == LKV_ARENA_HOST) {
        memcpy(dst, src, len);
        return 0;
    }
#ifdef LKV_HAVE_CUDA
    return lkv__cuda_d2h(a->device, dst, src, len);
#else
    return LKV_ENOTSUP;
#endif
}

void *lkv_arena_host_ptr(lkv_arena *a, uint32_t page)
{
    if (a->backend != LKV_ARENA_HOST || page >= a->n_pages) {
        return NULL;
    }
    return a->base + (uint64_t)page * a->page_bytes;
}

int lkv_arena_backend(const lkv_arena *a)
{
    return a->backend;
}

uint64_t lkv_arena_page_bytes(const lkv_arena *a)
{
    return a->page_bytes;
}

uint32_t lkv_arena_pages_total(const lkv_arena *a)
{
    return a->n_pages;
}

uint32_t lkv_arena_pages_free(const lkv_arena *a)
{
    return a->n_free;
}

int lkv_arena_cuda_device(const lkv_arena *a)
{
    return a->device;
}

const char *lkv_arena_shm_name(const lkv_arena *a)
{
    return a->backend == LKV_ARENA_HOST ? a->shm_name : NULL;
}

int lkv_arena_cuda_ipc_handle(const lkv_arena *a, uint8_t out[64])
{
    if (a->backend != LKV_ARENA_CUDA) {
        memset(out, 0, 64);
        return LKV_ENOTSUP;
    }
    memcpy(out, a->ipc, 64);
    return 0;
}
