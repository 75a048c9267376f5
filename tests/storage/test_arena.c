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
    ASSERT_EQ(lkv_arena_page_size(1), 4096);
    ASSERT_EQ(lkv_arena_page_size(4096), 4096);
    ASSERT_EQ(lkv_arena_page_size(4097), 8192);
    ASSERT_OK(lkv_arena_create(LKV_ARENA_HOST, 0, 4096, 8, &a));
    ASSERT_EQ(lkv_arena_pages_total(a), 8);
    ASSERT_EQ(lkv_arena_pages_free(a), 8);
    ASSERT_OK(lkv_arena_alloc(a, 5, pages));
    ASSERT_EQ(lkv_arena_pages_free(a), 3);
    /* All or nothing. */
    ASSERT_ERR(lkv_arena_alloc(a, 4, pages + 5), LKV_ENOSPC);
    ASSERT_EQ(lkv_arena_pages_free(a), 3);
    ASSERT_OK(lkv_arena_alloc(a, 3, pages + 5));
    ASSERT_ERR(lkv_arena_alloc(a, 1, pages + 8), LKV_ENOSPC);
    /* Every page distinct and in range. */
    int seen[8] = {0};
    for (int i = 0; i < 8; i++) {
        ASSERT_TRUE(pages[i] < 8);
        ASSERT_EQ(seen[pages[i]]++, 0);
    }
    lkv_arena_free(a, 2, pages + 3);
    ASSERT_EQ(lkv_arena_pages_free(a), 2);
    uint32_t again[2];
    ASSERT_OK(lkv_arena_alloc(a, 2, again));
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
    ASSERT_OK(lkv_arena_write(a, 2, buf, sizeof buf));
    ASSERT_OK(lkv_arena_read(a, 2, out, sizeof out));
    ASSERT_TRUE(memcmp(buf, out, sizeof buf) == 0);
    ASSERT_ERR(lkv_arena_write(a, 4, buf, 10), LKV_EINVAL);
    ASSERT_ERR(lkv_arena_read(a, 0, out, 8193), LKV_EINVAL);
    ASSERT_TRUE(lkv_arena_host_ptr(a, 2) != NULL);
    ASSERT_TRUE(memcmp(lkv_arena_host_ptr(a, 2), buf, sizeof buf) == 0);

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

static void test_bad_args(void)
{
    lkv_arena *a;
    ASSERT_ERR(lkv_arena_create(LKV_ARENA_HOST, 0, 4096, 0, &a), LKV_EINVAL);
    ASSERT_ERR(lkv_arena_create(LKV_ARENA_HOST, 0, 1000, 4, &a), LKV_EINVAL);
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
        ASSERT_OK(lkv_arena_write(a, 3, buf, sizeof buf));
        ASSERT_OK(lkv_arena_read(a, 3, out, sizeof out));
        ASSERT_TRUE(memcmp(buf, out, sizeof buf) == 0);
        ASSERT_TRUE(lkv_arena_host_ptr(a, 3) == NULL);
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

int main(void)
{
    LKV_RUN(test_alloc);
    LKV_RUN(test_copy_and_shm);
    LKV_RUN(test_bad_args);
    LKV_RUN(test_sweep);
    return 0;
}
