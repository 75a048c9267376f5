/*
 * test_pagespace.c: client.worker.pagespace. The worker's page space
 * (client/worker/lkv_pagespace.c) over a real shared-memory object made here the way the daemon
 * makes its arena: daemon pages are read in place (the bytes of the shm object, also when the
 * object changes after mapping: a mapping, not a copy), are read-only (a write kills the writer),
 * the object is mapped once per arena and remapped for a new one, worker pages follow it with the
 * same stride and are writable, the request view starts allocating at the first worker page, and
 * every failure (CUDA arena, missing object, object smaller than announced) is refused with a
 * message.
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lkv_pagespace.h"
#include "lkv_test.h"

#define PAGE  8192u
#define PAGES 6u

static char names[2][64];

/* Creates shm object i of n pages, page p filled with byte (i * 16 + p). */
static uint8_t *make_shm(int i, uint32_t n)
{
    snprintf(names[i], sizeof names[i], "/lkv-test-ps-%d-%d", (int)getpid(), i);
    int fd = shm_open(names[i], O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_TRUE(fd >= 0);
    ASSERT_EQ(ftruncate(fd, (off_t)n * PAGE), 0);
    uint8_t *m = mmap(NULL, (size_t)n * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_TRUE(m != MAP_FAILED);
    close(fd);
    for (uint32_t p = 0; p < n; p++) {
        memset(m + p * PAGE, i * 16 + (int)p, PAGE);
    }
    return m;
}

static lkv_lease_arena arena_of(int i, uint32_t n)
{
    lkv_lease_arena a = {.page_bytes = PAGE, .n_pages = n, .cuda_device = -1};
    snprintf(a.backend, sizeof a.backend, "host");
    snprintf(a.shm_name, sizeof a.shm_name, "%s", names[i]);
    return a;
}

static void test_map(void)
{
    uint8_t *daemon = make_shm(0, PAGES);
    lkv_pagespace ps;
    lkv_pagespace_init(&ps, 4);
    lkv_lease_arena a = arena_of(0, PAGES);
    ASSERT_OK(lkv_pagespace_map(&ps, &a));
    ASSERT_EQ(ps.n_maps, 1);
    ASSERT_EQ(ps.n_daemon, PAGES);
    for (uint32_t p = 0; p < PAGES; p++) {
        ASSERT_EQ(ps.base[p * PAGE + 100], p);
        ASSERT_TRUE(lkv_pagespace_is_daemon(&ps, p));
    }
    ASSERT_TRUE(!lkv_pagespace_is_daemon(&ps, PAGES));
    /* In place: the daemon writes a page after the mapping, the worker sees it. */
    daemon[3 * PAGE + 7] = 0xEE;
    ASSERT_EQ(ps.base[3 * PAGE + 7], 0xEE);
    /* Worker pages: after the daemon's, zeroed, writable. */
    uint8_t *local = ps.base + (uint64_t)PAGES * PAGE;
    ASSERT_EQ(local[0], 0);
    memset(local, 0x55, 4 * PAGE);
    ASSERT_EQ(daemon[0], 0); /* the daemon's object is untouched */
    lkv_kv_shape s = {.n_layers = 1,
                      .n_q_heads = 1,
                      .n_kv_heads = 1,
                      .head_dim = 8,
                      .dtype = LKV_DTYPE_F32,
                      .block_tokens = 16};
    lkv_model_kv kv;
    lkv_pagespace_view(&ps, &s, &kv);
    ASSERT_EQ(kv.n_used, PAGES);
    ASSERT_EQ(kv.n_pages, PAGES + 4);
    ASSERT_EQ(kv.page_bytes, PAGE);
    ASSERT_TRUE(kv.base == ps.base && kv.owned == 0);
    lkv_model_kv_free(&kv); /* a view: frees nothing */
    /* The same arena again: nothing is remapped. */
    uint8_t *base = ps.base;
    ASSERT_OK(lkv_pagespace_map(&ps, &a));
    ASSERT_EQ(ps.n_maps, 1);
    ASSERT_TRUE(ps.base == base);
    /* Read-only: a write to a daemon page kills the writer. */
    pid_t pid = fork();
    if (pid == 0) {
        ps.base[PAGE] = 1;
        _exit(0);
    }
    ASSERT_TRUE(pid > 0);
    int st;
    waitpid(pid, &st, 0);
    /* SIGSEGV (under ASan its handler reports it, then exits 1 or aborts with SIGABRT when
     * abort_on_error is set, as in CI): never the write's _exit(0). */
    ASSERT_TRUE(WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0));
    /* A restarted daemon (a new object): remapped once. */
    make_shm(1, PAGES + 2);
    lkv_lease_arena b = arena_of(1, PAGES + 2);
    ASSERT_OK(lkv_pagespace_map(&ps, &b));
    ASSERT_EQ(ps.n_maps, 2);
    ASSERT_EQ(ps.n_daemon, PAGES + 2);
    ASSERT_EQ(ps.base[(PAGES + 1) * PAGE], 16 + PAGES + 1);
    lkv_pagespace_free(&ps);
    shm_unlink(names[0]);
    shm_unlink(names[1]);
}

static void test_refused(void)
{
    lkv_pagespace ps;
    lkv_pagespace_init(&ps, 4);
    lkv_lease_arena a = arena_of(0, PAGES);
    snprintf(a.backend, sizeof a.backend, "cuda");
    ASSERT_ERR(lkv_pagespace_map(&ps, &a), LKV_ENOTSUP);
    ASSERT_TRUE(strstr(ps.err, "cuda") != NULL);
    a = arena_of(0, PAGES);
    snprintf(a.shm_name, sizeof a.shm_name, "/lkv-test-ps-missing-%d", (int)getpid());
    ASSERT_ERR(lkv_pagespace_map(&ps, &a), LKV_EIO);
    ASSERT_TRUE(strstr(ps.err, "lkv-test-ps-missing") != NULL);
    ASSERT_TRUE(ps.base == NULL);
    make_shm(0, 2);
    a = arena_of(0, PAGES); /* claims more pages than the object has */
    ASSERT_ERR(lkv_pagespace_map(&ps, &a), LKV_EIO);
    ASSERT_TRUE(strstr(ps.err, "smaller") != NULL);
    lkv_pagespace_free(&ps);
    shm_unlink(names[0]);
    /* Local only: worker pages of the given stride, no daemon pages. */
    lkv_pagespace_init(&ps, 3);
    ASSERT_OK(lkv_pagespace_map_local(&ps, 4096));
    ASSERT_EQ(ps.n_daemon, 0);
    ASSERT_EQ(ps.page_bytes, 4096);
    ps.base[3 * 4096 - 1] = 1;
    lkv_pagespace_free(&ps);
}

int main(void)
{
    LKV_RUN(test_map);
    LKV_RUN(test_refused);
    return 0;
}
