/*
 * test_arena.c: the hot arena: page allocation all-or-nothing, exhaustion, free and reuse,
 * page copies, the shared memory object (mode 0600, mappable by name, unlinked at destroy),
 * backend selection without a GPU.
 */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lkv_arena.h"
#include "storage_util.h"

static void test_alloc(void)
{
    lkv_arena *a;
    uint32_t pages[16];
    ASSERT_EQ(lkv_arena_page_size(1), 256);
    ASSERT_EQ(lkv_arena_page_size(4096), 4096);
    ASSERT_EQ(lkv_arena_page_size(4097), 4352);
    ASSERT_EQ(lkv_arena_page_size(20480), 20480); /* stories260k: a 20 KiB block, a 20 KiB page. */
    ASSERT_OK(lkv_arena_create(LKV_ARENA_HOST, 0, 4096, 8, &a));
    ASSERT_EQ(lkv_arena_pages_total(a), 8);
    ASSERT_EQ(lkv_arena_pages_free(a), 8);
    ASSERT_OK(lkv_arena_alloc(a, 0, 5, pages));
    ASSERT_EQ(lkv_arena_pages_free(a), 3);
    /* All or nothing. */
    ASSERT_ERR(lkv_arena_alloc(a, 0, 4, pages + 5), LKV_ENOSPC);
    ASSERT_EQ(lkv_arena_pages_free(a), 3);
    ASSERT_OK(lkv_arena_alloc(a, 0, 3, pages + 5));
    ASSERT_ERR(lkv_arena_alloc(a, 0, 1, pages + 8), LKV_ENOSPC);
    /* Every page distinct and in range. */
    int seen[8] = {0};
    for (int i = 0; i < 8; i++) {
        ASSERT_TRUE(pages[i] < 8);
        ASSERT_EQ(seen[pages[i]]++, 0);
    }
    lkv_arena_free(a, 0, 2, pages + 3);
    ASSERT_EQ(lkv_arena_pages_free(a), 2);
    uint32_t again[2];
    ASSERT_OK(lkv_arena_alloc(a, 0, 2, again));
    ASSERT_TRUE((again[0] == pages[3] || again[0] == pages[4]) &&
                (again[1] == pages[3] || again[1] == pages[4]));
    lkv_arena_destroy(a);
}

static void test_copy_and_shm(void)
{
    lkv_arena *a;
    uint8_t buf[4096], out[4096];
    ASSERT_OK(lkv_arena_create(LKV_ARENA_AUTO, 0, 8192, 4, &a));
    int auto_backend = lkv_arena_backend(a);
    lkv_arena_destroy(a);
    ASSERT_TRUE(auto_backend == LKV_ARENA_HOST || auto_backend == LKV_ARENA_CUDA);
    ASSERT_OK(lkv_arena_create(LKV_ARENA_HOST, 0, 8192, 4, &a));
    ASSERT_EQ(lkv_arena_backend(a), LKV_ARENA_HOST);
    ASSERT_EQ(lkv_arena_cuda_device(a), -1);
    uint8_t ipc[64];
    ASSERT_ERR(lkv_arena_cuda_ipc_handle(a, ipc), LKV_ENOTSUP);
    for (int i = 0; i < 4096; i++) {
        buf[i] = (uint8_t)(i * 7);
    }
    ASSERT_OK(lkv_arena_write(a, 0, 2, buf, sizeof buf));
    ASSERT_OK(lkv_arena_read(a, 0, 2, out, sizeof out));
    ASSERT_TRUE(memcmp(buf, out, sizeof buf) == 0);
    ASSERT_ERR(lkv_arena_write(a, 0, 4, buf, 10), LKV_EINVAL);
    ASSERT_ERR(lkv_arena_read(a, 0, 0, out, 8193), LKV_EINVAL);
    ASSERT_TRUE(lkv_arena_host_ptr(a, 0, 2) != NULL);
    ASSERT_TRUE(memcmp(lkv_arena_host_ptr(a, 0, 2), buf, sizeof buf) == 0);

    /* Another mapping of the object by name sees the same bytes. */
    const char *name = lkv_arena_shm_name(a);
    ASSERT_TRUE(name != NULL && name[0] == '/');
    char saved[64];
    snprintf(saved, sizeof saved, "%s", name);
    int fd = shm_open(name, O_RDONLY, 0);
    ASSERT_TRUE(fd >= 0);
    struct stat st;
    ASSERT_EQ(fstat(fd, &st), 0);
    ASSERT_EQ(st.st_mode & 0777, 0600);
    ASSERT_EQ(st.st_size, 4 * 8192);
    uint8_t *m = mmap(NULL, 4 * 8192, PROT_READ, MAP_SHARED, fd, 0);
    ASSERT_TRUE(m != MAP_FAILED);
    ASSERT_TRUE(memcmp(m + 2 * 8192, buf, sizeof buf) == 0);
    munmap(m, 4 * 8192);
    close(fd);
    lkv_arena_destroy(a);
    /* Unlinked at destroy. */
    ASSERT_TRUE(shm_open(saved, O_RDONLY, 0) < 0);
}

static void never_called(lkv_arena_done *d, int rc)
{
    (void)d;
    LKV_FAIL("a host arena's read_async completed through done (rc %d)", rc);
}

/* lkv_arena_read_async on a host arena: copies at once (0, done unused), page i at dst + i *
 * len, in the order of the page list; a bad page anywhere refuses before anything is copied. */
static void test_read_async_host(void)
{
    lkv_arena *a;
    ASSERT_OK(lkv_arena_create(LKV_ARENA_HOST, 0, 4096, 8, &a));
    uint8_t page[4096];
    for (uint32_t p = 0; p < 8; p++) {
        memset(page, 0x10 + (int)p, sizeof page);
        ASSERT_OK(lkv_arena_write(a, 0, p, page, sizeof page));
    }
    uint32_t pages[3] = {5, 1, 7};
    uint8_t dst[3 * 1000 + 1];
    memset(dst, 0xEE, sizeof dst);
    lkv_arena_done d = {never_called};
    ASSERT_OK(lkv_arena_read_async(a, 0, pages, 3, 1000, dst, &d));
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(dst[i * 1000], 0x10 + pages[i]);
        ASSERT_EQ(dst[i * 1000 + 999], 0x10 + pages[i]);
    }
    ASSERT_EQ(dst[3000], 0xEE);
    uint32_t bad[2] = {2, 8};
    memset(dst, 0xEE, sizeof dst);
    ASSERT_ERR(lkv_arena_read_async(a, 0, bad, 2, 1000, dst, &d), LKV_EINVAL);
    ASSERT_EQ(dst[0], 0xEE);
    ASSERT_ERR(lkv_arena_read_async(a, 0, pages, 3, 4097, dst, &d), LKV_EINVAL);
    ASSERT_ERR(lkv_arena_read_async(a, 1, pages, 3, 1000, dst, &d), LKV_EINVAL);
    ASSERT_ERR(lkv_arena_set_read_streams(a, 0), LKV_EINVAL);
    ASSERT_ERR(lkv_arena_set_read_streams(a, LKV_ARENA_MAX_STREAMS + 1), LKV_EINVAL);
    ASSERT_OK(lkv_arena_set_read_streams(a, 4)); /* Host: nothing to create. */
    lkv_arena_destroy(a);
}

static void test_bad_args(void)
{
    lkv_arena *a;
    ASSERT_ERR(lkv_arena_create(LKV_ARENA_HOST, 0, 4096, 0, &a), LKV_EINVAL);
    ASSERT_ERR(lkv_arena_create(LKV_ARENA_HOST, 0, 1000, 4, &a), LKV_EINVAL);
    ASSERT_ERR(lkv_arena_create(LKV_ARENA_HOST, 0, 4096 + 128, 4, &a), LKV_EINVAL);
    ASSERT_ERR(lkv_arena_create_regions(LKV_ARENA_HOST, 0, NULL, 1, &a), LKV_EINVAL);
    lkv_arena_region_cfg none[1] = {{.page_bytes = 256, .n_pages = 0}};
    ASSERT_ERR(lkv_arena_create_regions(LKV_ARENA_HOST, 0, none, 1, &a), LKV_EINVAL);
    ASSERT_ERR(lkv_arena_create(LKV_ARENA_HOST, 0, 4096, LKV_REF_MAX_PAGE + 2u, &a), LKV_EINVAL);
    ASSERT_ERR(lkv_arena_create(7, 0, 4096, 4, &a), LKV_EINVAL);
    /* Explicit cuda without a usable GPU (or without CUDA support) fails cleanly. */
    int rc = lkv_arena_create(LKV_ARENA_CUDA, 0, 4096, 4, &a);
    if (rc == 0) {
        fprintf(stderr, "   (a CUDA device is present: cuda arena created)\n");
        ASSERT_EQ(lkv_arena_backend(a), LKV_ARENA_CUDA);
        ASSERT_EQ(lkv_arena_cuda_device(a), 0);
        ASSERT_TRUE(lkv_arena_shm_name(a) == NULL);
        uint8_t ipc[64], zero[64] = {0};
        ASSERT_OK(lkv_arena_cuda_ipc_handle(a, ipc));
        ASSERT_TRUE(memcmp(ipc, zero, 64) != 0);
        uint8_t buf[4096], out[4096];
        memset(buf, 0x5a, sizeof buf);
        ASSERT_OK(lkv_arena_write(a, 0, 3, buf, sizeof buf));
        ASSERT_OK(lkv_arena_read(a, 0, 3, out, sizeof out));
        ASSERT_TRUE(memcmp(buf, out, sizeof buf) == 0);
        ASSERT_TRUE(lkv_arena_host_ptr(a, 0, 3) == NULL);
        lkv_arena_destroy(a);
    } else {
        ASSERT_TRUE(rc == LKV_ECUDA || rc == LKV_ENOTSUP);
    }
}

static void test_sweep(void)
{
    /* A child that exits leaves a dead pid; an object named after it is swept, ours is not. */
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        _exit(0);
    }
    waitpid(pid, NULL, 0);
    char dead[64], mine[64];
    snprintf(dead, sizeof dead, "/lazykv-%ld-0-deadbeef", (long)pid);
    snprintf(mine, sizeof mine, "/lazykv-%ld-99-deadbeef", (long)getpid());
    int fd = shm_open(dead, O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_TRUE(fd >= 0);
    close(fd);
    fd = shm_open(mine, O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_TRUE(fd >= 0);
    close(fd);
    lkv_arena *a;
    ASSERT_OK(lkv_arena_create(LKV_ARENA_HOST, 0, 4096, 1, &a)); /* Sweeps. */
    ASSERT_TRUE(shm_open(dead, O_RDONLY, 0) < 0);
    fd = shm_open(mine, O_RDONLY, 0);
    ASSERT_TRUE(fd >= 0);
    close(fd);
    shm_unlink(mine);
    lkv_arena_destroy(a);
}

/* Regions: each at a 2 MiB boundary with its own page size and free list; pages of one region
 * never alias another's; page i of region r is at base + base_offset(r) + i * page_bytes(r) in
 * a second mapping of the shared memory (what a worker computes). */
static void test_regions(void)
{
    lkv_arena *a;
    lkv_arena_region_cfg cfg[3] = {{.page_bytes = 20480, .n_pages = 200},
                                   {.page_bytes = 2u << 20, .n_pages = 2},
                                   {.page_bytes = 256, .n_pages = 5}};
    ASSERT_OK(lkv_arena_create_regions(LKV_ARENA_HOST, 0, cfg, 3, &a));
    ASSERT_EQ(lkv_arena_n_regions(a), 3);
    lkv_arena_region_info ri[3];
    for (int r = 0; r < 3; r++) {
        ASSERT_OK(lkv_arena_region(a, r, &ri[r]));
        ASSERT_EQ(ri[r].page_bytes, cfg[r].page_bytes);
        ASSERT_EQ(ri[r].n_pages, cfg[r].n_pages);
        ASSERT_EQ(ri[r].n_free, cfg[r].n_pages);
        ASSERT_EQ(ri[r].base_offset % LKV_ARENA_REGION_ALIGN, 0);
    }
    ASSERT_ERR(lkv_arena_region(a, 3, &ri[0]), LKV_EINVAL);
    ASSERT_EQ(ri[0].base_offset, 0);
    /* 200 * 20 KiB = 4000 KiB: region 1 starts at 4 MiB, region 2 after its 4 MiB at 8 MiB. */
    ASSERT_EQ(ri[1].base_offset, 4u << 20);
    ASSERT_EQ(ri[2].base_offset, 8u << 20);
    ASSERT_EQ(lkv_arena_bytes(a), (8u << 20) + 5 * 256);
    ASSERT_EQ(lkv_arena_pages_total(a), 207);
    /* Exhaust region 2; the others are untouched. */
    uint32_t p2[6], p0[1], p1[2];
    ASSERT_OK(lkv_arena_alloc(a, 2, 5, p2));
    ASSERT_ERR(lkv_arena_alloc(a, 2, 1, p2 + 5), LKV_ENOSPC);
    ASSERT_ERR(lkv_arena_alloc(a, 3, 1, p0), LKV_EINVAL);
    ASSERT_OK(lkv_arena_alloc(a, 0, 1, p0));
    ASSERT_OK(lkv_arena_alloc(a, 1, 2, p1));
    ASSERT_EQ(lkv_arena_pages_free(a), 199);
    /* Write a distinct byte pattern into every allocated page at full page size. */
    static uint8_t buf[2u << 20], out[2u << 20];
    memset(buf, 0xA0, cfg[0].page_bytes);
    ASSERT_OK(lkv_arena_write(a, 0, p0[0], buf, cfg[0].page_bytes));
    ASSERT_ERR(lkv_arena_write(a, 0, p0[0], buf, cfg[0].page_bytes + 1), LKV_EINVAL);
    for (int i = 0; i < 2; i++) {
        memset(buf, 0xB0 + i, cfg[1].page_bytes);
        ASSERT_OK(lkv_arena_write(a, 1, p1[i], buf, cfg[1].page_bytes));
    }
    for (int i = 0; i < 5; i++) {
        memset(buf, 0xC0 + i, 256);
        ASSERT_OK(lkv_arena_write(a, 2, p2[i], buf, 256));
    }
    /* Read back through a second mapping by the worker's formula. */
    int fd = shm_open(lkv_arena_shm_name(a), O_RDONLY, 0);
    ASSERT_TRUE(fd >= 0);
    uint8_t *m = mmap(NULL, lkv_arena_bytes(a), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    ASSERT_TRUE(m != MAP_FAILED);
    const uint8_t *q = m + ri[0].base_offset + (uint64_t)p0[0] * ri[0].page_bytes;
    for (uint64_t k = 0; k < ri[0].page_bytes; k++) {
        ASSERT_EQ(q[k], 0xA0);
    }
    for (int i = 0; i < 2; i++) {
        q = m + ri[1].base_offset + (uint64_t)p1[i] * ri[1].page_bytes;
        ASSERT_EQ(q[0], 0xB0 + i);
        ASSERT_EQ(q[ri[1].page_bytes - 1], 0xB0 + i);
    }
    for (int i = 0; i < 5; i++) {
        q = m + ri[2].base_offset + (uint64_t)p2[i] * 256;
        ASSERT_EQ(q[0], 0xC0 + i);
        ASSERT_EQ(q[255], 0xC0 + i);
        ASSERT_TRUE(lkv_arena_host_ptr(a, 2, p2[i]) ==
                    lkv_arena_host_ptr(a, 0, 0) + ri[2].base_offset + p2[i] * 256u);
    }
    ASSERT_OK(lkv_arena_read(a, 1, p1[1], out, cfg[1].page_bytes));
    ASSERT_EQ(out[12345], 0xB1);
    munmap(m, lkv_arena_bytes(a));
    ASSERT_TRUE(lkv_arena_host_ptr(a, 2, 5) == NULL);
    lkv_arena_free(a, 2, 5, p2);
    ASSERT_EQ(lkv_arena_pages_free(a), 204);
    lkv_arena_destroy(a);
}

int main(void)
{
    LKV_RUN(test_regions);
    LKV_RUN(test_alloc);
    LKV_RUN(test_copy_and_shm);
    LKV_RUN(test_bad_args);
    LKV_RUN(test_read_async_host);
    LKV_RUN(test_sweep);
    return 0;
}
