/*
 * lkv_arena.c: the hot arena (see lkv_arena.h): one allocation, regions of fixed pages, a free
 * stack per region.
 *
 * Invariants, per region: free_stack[0..n_free) holds each free page exactly once; used[p] is 1
 * iff page p is allocated (a byte per page, checked by assert to catch double frees); the
 * region's bytes [base, base + n_pages * page_bytes) lie inside the allocation and overlap no
 * other region's. The host backend's
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
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lkv_layout.h"
#include "lkv_log.h"

#ifdef LKV_HAVE_CUDA
#include "cuda/lkv_arena_cuda.h"
#endif

#define PAGE_ALIGN LKV_ARENA_PAGE_ALIGN

typedef struct region {
    uint64_t base;        /* Byte offset of page 0. */
    uint64_t page_bytes;  /* Bytes per page. */
    uint32_t n_pages;     /* Pages. */
    uint32_t n_free;      /* Entries in free_stack. */
    uint32_t *free_stack; /* Free page indices. */
    uint8_t *used;        /* Per page: 1 if allocated. */
} region;

struct lkv_arena {
    int backend;                         /* LKV_ARENA_HOST or LKV_ARENA_CUDA. */
    int device;                          /* CUDA device, -1 for host. */
    uint8_t *base;                       /* Host mapping or device pointer. */
    uint64_t bytes;                      /* Bytes of the allocation (end of the last region). */
    int n_regions;                       /* Entries of reg. */
    region *reg;                         /* Regions (owned). */
    char shm_name[64];                   /* Host: shm_open name. */
    uint8_t ipc[64];                     /* CUDA: IPC handle bytes. */
    void *stream[LKV_ARENA_MAX_STREAMS]; /* CUDA: streams of asynchronous reads. */
    int n_streams;                       /* CUDA: streams created (>= 1). */
    atomic_uint next_stream;             /* Round robin over them, one read per stream. */
};

uint64_t lkv_arena_page_size(uint64_t block_bytes)
{
    return (block_bytes + PAGE_ALIGN - 1) / PAGE_ALIGN * PAGE_ALIGN;
}

static region *reg_of(const lkv_arena *a, int r)
{
    return r >= 0 && r < a->n_regions ? &a->reg[r] : NULL;
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
    /* MAP_POPULATE: the page tables are filled now, not by one minor fault per 4 KiB page in
     * the request path (a Put of a 2 MiB block took 512 of them: ~7% of lazykvd's samples
     * in a put run, bench/RESULTS.md). */
    void *p = mmap(NULL, a->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
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
    rc = lkv__cuda_stream_create(device, &a->stream[0]);
    a->n_streams = 1;
    if (rc != 0) {
        lkv__cuda_free(device, p);
        a->base = NULL;
        return rc;
    }
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

int lkv_arena_create_regions(int backend, int cuda_device, const lkv_arena_region_cfg *regions,
                             int n_regions, lkv_arena **out)
{
    lkv_arena *a;
    int rc;
    uint64_t end = 0;

    *out = NULL;
    if (regions == NULL || n_regions < 1 || n_regions > LKV_ARENA_MAX_REGIONS) {
        return LKV_EINVAL;
    }
    for (int r = 0; r < n_regions; r++) {
        uint64_t pb = regions[r].page_bytes;
        uint32_t np = regions[r].n_pages;
        if (np == 0 || np > LKV_REF_MAX_PAGE + 1u || pb == 0 || pb % PAGE_ALIGN != 0 ||
            pb > (UINT64_MAX / 4) / np) {
            return LKV_EINVAL;
        }
        uint64_t base =
            (end + LKV_ARENA_REGION_ALIGN - 1) / LKV_ARENA_REGION_ALIGN * LKV_ARENA_REGION_ALIGN;
        if (base > UINT64_MAX / 4 - pb * np) {
            return LKV_EINVAL;
        }
        end = base + pb * np;
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
    a->bytes = end;
    if (backend == LKV_ARENA_HOST) {
        lkv_arena_shm_sweep();
    }
    rc = backend == LKV_ARENA_HOST ? host_create(a) : cuda_create(a, cuda_device);
    if (rc != 0) {
        free(a);
        return rc;
    }
    a->n_regions = n_regions;
    a->reg = lkv_xcalloc((size_t)n_regions, sizeof *a->reg);
    end = 0;
    for (int r = 0; r < n_regions; r++) {
        region *g = &a->reg[r];
        g->base =
            (end + LKV_ARENA_REGION_ALIGN - 1) / LKV_ARENA_REGION_ALIGN * LKV_ARENA_REGION_ALIGN;
        g->page_bytes = regions[r].page_bytes;
        g->n_pages = regions[r].n_pages;
        end = g->base + g->page_bytes * g->n_pages;
        g->free_stack = lkv_xmalloc(sizeof(uint32_t) * g->n_pages);
        g->used = lkv_xcalloc(g->n_pages, 1);
        /* Pop order 0, 1, 2, ...: the lowest pages are used first. */
        for (uint32_t i = 0; i < g->n_pages; i++) {
            g->free_stack[i] = g->n_pages - 1 - i;
        }
        g->n_free = g->n_pages;
        LKV_LOGI("arena: region %d at offset %llu: %u pages of %llu bytes (%llu KiB)", r,
                 (unsigned long long)g->base, g->n_pages, (unsigned long long)g->page_bytes,
                 (unsigned long long)((g->page_bytes * g->n_pages) >> 10));
    }
    LKV_LOGI("arena: %s, %d region(s), %llu MiB%s%s",
             backend == LKV_ARENA_HOST ? "host shm" : "cuda", n_regions,
             (unsigned long long)(a->bytes >> 20), a->shm_name[0] ? ", " : "", a->shm_name);
    *out = a;
    return 0;
}

int lkv_arena_create(int backend, int cuda_device, uint64_t page_bytes, uint32_t n_pages,
                     lkv_arena **out)
{
    lkv_arena_region_cfg r = {.page_bytes = page_bytes, .n_pages = n_pages};
    return lkv_arena_create_regions(backend, cuda_device, &r, 1, out);
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
        for (int i = 0; i < a->n_streams; i++) {
            lkv__cuda_stream_destroy(a->device, a->stream[i]); /* Waits for reads in flight. */
        }
        lkv__cuda_free(a->device, a->base);
#endif
    }
    for (int r = 0; r < a->n_regions; r++) {
        free(a->reg[r].free_stack);
        free(a->reg[r].used);
    }
    free(a->reg);
    free(a);
}

int lkv_arena_alloc(lkv_arena *a, int r, uint32_t n, uint32_t *pages)
{
    region *g = reg_of(a, r);
    if (g == NULL) {
        return LKV_EINVAL;
    }
    if (n > g->n_free) {
        return LKV_ENOSPC;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = g->free_stack[--g->n_free];
        assert(!g->used[p]);
        g->used[p] = 1;
        pages[i] = p;
    }
    return 0;
}

void lkv_arena_free(lkv_arena *a, int r, uint32_t n, const uint32_t *pages)
{
    region *g = reg_of(a, r);
    assert(g != NULL);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = pages[i];
        assert(p < g->n_pages && g->used[p]);
        g->used[p] = 0;
        g->free_stack[g->n_free++] = p;
    }
}

/* The address of page of region r, or NULL if either is out of range or len > page_bytes. */
static uint8_t *page_addr(lkv_arena *a, int r, uint32_t page, size_t len)
{
    region *g = reg_of(a, r);
    if (g == NULL || page >= g->n_pages || len > g->page_bytes) {
        return NULL;
    }
    return a->base + g->base + (uint64_t)page * g->page_bytes;
}

int lkv_arena_write(lkv_arena *a, int r, uint32_t page, const void *src, size_t len)
{
    uint8_t *dst = page_addr(a, r, page, len);
    if (dst == NULL) {
        return LKV_EINVAL;
    }
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

int lkv_arena_writev(lkv_arena *a, int r, uint32_t page, const struct iovec *iov, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        total += iov[i].iov_len;
    }
    uint8_t *dst = page_addr(a, r, page, total);
    if (dst == NULL) {
        return LKV_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if (iov[i].iov_len == 0) {
            continue;
        }
        if (a->backend == LKV_ARENA_HOST) {
            memcpy(dst, iov[i].iov_base, iov[i].iov_len);
        } else {
#ifdef LKV_HAVE_CUDA
            int rc = lkv__cuda_h2d(a->device, dst, iov[i].iov_base, iov[i].iov_len);
            if (rc != 0) {
                return rc;
            }
#else
            return LKV_ENOTSUP;
#endif
        }
        dst += iov[i].iov_len;
    }
    return 0;
}

int lkv_arena_read(lkv_arena *a, int r, uint32_t page, void *dst, size_t len)
{
    const uint8_t *src = page_addr(a, r, page, len);
    if (src == NULL) {
        return LKV_EINVAL;
    }
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

int lkv_arena_read_async(lkv_arena *a, int r, const uint32_t *pages, uint32_t n, size_t len,
                         void *dst, lkv_arena_done *done)
{
    for (uint32_t i = 0; i < n; i++) {
        if (page_addr(a, r, pages[i], len) == NULL) {
            return LKV_EINVAL;
        }
    }
    if (a->backend == LKV_ARENA_HOST) {
        for (uint32_t i = 0; i < n; i++) {
            memcpy((uint8_t *)dst + (size_t)i * len, page_addr(a, r, pages[i], len), len);
        }
        return 0;
    }
#ifdef LKV_HAVE_CUDA
    int rc = 0;
    uint32_t queued = 0;
    void *st = a->stream[atomic_fetch_add_explicit(&a->next_stream, 1, memory_order_relaxed) %
                         (unsigned)a->n_streams];
    for (; queued < n && rc == 0; queued++) {
        rc = lkv__cuda_d2h_async(a->device, st, (uint8_t *)dst + (size_t)queued * len,
                                 page_addr(a, r, pages[queued], len), len);
    }
    if (rc == 0) {
        rc = lkv__cuda_stream_then(a->device, st, done);
        if (rc == 0) {
            return LKV_EAGAIN;
        }
    }
    /* Copies already queued may still be writing dst: wait for them before saying no. */
    lkv__cuda_stream_sync(a->device, st);
    return rc;
#else
    (void)done;
    return LKV_ENOTSUP;
#endif
}

int lkv_arena_set_read_streams(lkv_arena *a, int n)
{
    if (n < 1 || n > LKV_ARENA_MAX_STREAMS) {
        return LKV_EINVAL;
    }
    if (a->backend != LKV_ARENA_CUDA) {
        return 0;
    }
#ifdef LKV_HAVE_CUDA
    while (a->n_streams < n) {
        int rc = lkv__cuda_stream_create(a->device, &a->stream[a->n_streams]);
        if (rc != 0) {
            return rc;
        }
        a->n_streams++;
    }
#endif
    return 0;
}

void *lkv_arena_host_ptr(lkv_arena *a, int r, uint32_t page)
{
    if (a->backend != LKV_ARENA_HOST) {
        return NULL;
    }
    return page_addr(a, r, page, 0);
}

int lkv_arena_backend(const lkv_arena *a)
{
    return a->backend;
}

int lkv_arena_n_regions(const lkv_arena *a)
{
    return a->n_regions;
}

uint64_t lkv_arena_bytes(const lkv_arena *a)
{
    return a->bytes;
}

int lkv_arena_region(const lkv_arena *a, int r, lkv_arena_region_info *out)
{
    const region *g = reg_of(a, r);
    if (g == NULL) {
        return LKV_EINVAL;
    }
    out->base_offset = g->base;
    out->page_bytes = g->page_bytes;
    out->n_pages = g->n_pages;
    out->n_free = g->n_free;
    return 0;
}

uint64_t lkv_arena_page_bytes(const lkv_arena *a)
{
    return a->reg[0].page_bytes;
}

uint32_t lkv_arena_pages_total(const lkv_arena *a)
{
    uint64_t n = 0;
    for (int r = 0; r < a->n_regions; r++) {
        n += a->reg[r].n_pages;
    }
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

uint32_t lkv_arena_pages_free(const lkv_arena *a)
{
    uint64_t n = 0;
    for (int r = 0; r < a->n_regions; r++) {
        n += a->reg[r].n_free;
    }
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
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
