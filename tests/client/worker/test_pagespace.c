/*
 * test_pagespace.c: client.worker.pagespace. The worker's page space
 * (client/worker/lkv_pagespace.c) over a real shared-memory object made here the way the daemon
 * makes its arena (two regions: another profile's first, the worker's after it): the daemon
 * pages are the worker's profile's region (its base and page size), read in place (the bytes of
 * the shm object, also when the object changes after mapping: a mapping, not a copy), are
 * read-only (a write kills the writer), the region is mapped once per arena and remapped for a
 * new one, worker pages follow it with the same stride and are writable (also when the region's
 * page size is not a multiple of the OS page: they start past its last OS page), the request view
 * starts allocating at the first worker page, and every failure (CUDA arena, no region of the
 * profile, a base off an OS page, missing object, object smaller than announced) is refused with
 * a message. Device arenas (test_dev_*): the placement of worker pages next to an imported arena
 * through device ops (lkv_test_devmap.h: host memory standing in for HBM): after it, below it,
 * at a whole-page offset of a plain allocation above or below (the fallback, with 2560-byte
 * pages that are not a multiple of the OS page), refused with a message when that lies past
 * the reference's 2^24 pages (and nothing left allocated), mapped once per arena, remapped for a
 * new IPC handle; every daemon page read in place and every worker page writable without
 * touching the arena.
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lkv_pagespace.h"
#include "lkv_test.h"
#include "lkv_test_devmap.h"

#define PAGE  8192u
#define PAGES 6u
#define RBASE (2u * PAGE) /* The worker's region, after 2 pages of another profile's. */

static char names[2][64];

/* Creates shm object i: RBASE bytes of another region (0xA5), then n pages of the worker's
 * region, page p filled with byte (i * 16 + p). Returns the mapping of the worker's region. */
static uint8_t *make_shm(int i, uint32_t n)
{
    snprintf(names[i], sizeof names[i], "/lkv-test-ps-%d-%d", (int)getpid(), i);
    int fd = shm_open(names[i], O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_TRUE(fd >= 0);
    size_t len = RBASE + (size_t)n * PAGE;
    ASSERT_EQ(ftruncate(fd, (off_t)len), 0);
    uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_TRUE(m != MAP_FAILED);
    close(fd);
    memset(m, 0xA5, RBASE);
    for (uint32_t p = 0; p < n; p++) {
        memset(m + RBASE + p * PAGE, i * 16 + (int)p, PAGE);
    }
    return m + RBASE;
}

/* The arena of object i as an Attach reply describes it: regions "other" and "tiny". */
static lkv_lease_arena arena_of(int i, uint32_t n)
{
    lkv_lease_arena a = {.cuda_device = -1, .n_regions = 2, .arena_bytes = RBASE + n * PAGE};
    snprintf(a.backend, sizeof a.backend, "host");
    snprintf(a.shm_name, sizeof a.shm_name, "%s", names[i]);
    a.regions[0] = (lkv_arena_region){.profile = "other", .page_bytes = 4096, .n_pages = 4};
    a.regions[1] = (lkv_arena_region){
        .profile = "tiny", .base_offset = RBASE, .page_bytes = PAGE, .n_pages = n};
    return a;
}

static void test_map(void)
{
    uint8_t *daemon = make_shm(0, PAGES);
    lkv_pagespace ps;
    lkv_pagespace_init(&ps, 4);
    lkv_lease_arena a = arena_of(0, PAGES);
    ASSERT_OK(lkv_pagespace_map(&ps, &a, "tiny"));
    ASSERT_EQ(ps.n_maps, 1);
    ASSERT_EQ(ps.n_daemon, PAGES);
    ASSERT_EQ(ps.region_base, RBASE);
    ASSERT_EQ(ps.first_local, PAGES);
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
    ASSERT_OK(lkv_pagespace_map(&ps, &a, "tiny"));
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
    ASSERT_OK(lkv_pagespace_map(&ps, &b, "tiny"));
    ASSERT_EQ(ps.n_maps, 2);
    ASSERT_EQ(ps.n_daemon, PAGES + 2);
    ASSERT_EQ(ps.base[(PAGES + 1) * PAGE], 16 + PAGES + 1);
    /* The other profile's region is a different mapping: remapped, at its own base. */
    ASSERT_OK(lkv_pagespace_map(&ps, &b, "other"));
    ASSERT_EQ(ps.n_maps, 3);
    ASSERT_TRUE(ps.region_base == 0 && ps.page_bytes == 4096 && ps.n_daemon == 4);
    ASSERT_EQ(ps.base[4 * 4096 - 1], 0xA5);
    lkv_pagespace_free(&ps);
    shm_unlink(names[0]);
    shm_unlink(names[1]);
}

/* A region page size that is not a multiple of the OS page (2560 = 10 x 256): the worker pages
 * start at the first page past the region's last OS page, and writing them leaves the daemon's
 * object untouched. */
static void test_odd_page(void)
{
    uint8_t *daemon = make_shm(0, 1);
    lkv_lease_arena a = arena_of(0, 1);
    a.regions[1].page_bytes = 2560;
    a.regions[1].n_pages = 3; /* 7680 bytes: within the object's 8192 */
    lkv_pagespace ps;
    lkv_pagespace_init(&ps, 4);
    ASSERT_OK(lkv_pagespace_map(&ps, &a, "tiny"));
    ASSERT_EQ(ps.n_daemon, 3);
    ASSERT_EQ(ps.first_local, 4); /* 4 x 2560 = 10240 >= 8192: past the shm mapping */
    ASSERT_EQ(ps.base[3 * 2560 - 1], 0);
    lkv_kv_shape s = {.n_layers = 1,
                      .n_q_heads = 1,
                      .n_kv_heads = 1,
                      .head_dim = 8,
                      .dtype = LKV_DTYPE_F32,
                      .block_tokens = 16};
    lkv_model_kv kv;
    lkv_pagespace_view(&ps, &s, &kv);
    ASSERT_EQ(kv.n_used, 4);
    ASSERT_EQ(kv.n_pages, 8);
    memset(ps.base + 4 * 2560, 0x33, 4 * 2560); /* every worker page */
    for (uint32_t i = 0; i < PAGE; i++) {
        ASSERT_EQ(daemon[i], 0);
    }
    lkv_pagespace_free(&ps);
    /* Writable (put in place): the worker's writes land in the daemon's object. */
    lkv_pagespace_init(&ps, 4);
    ps.writable = 1;
    a = arena_of(0, 1);
    ASSERT_OK(lkv_pagespace_map(&ps, &a, "tiny"));
    ps.base[100] = 0x42;
    ASSERT_EQ(daemon[100], 0x42);
    ASSERT_EQ(daemon[-1], 0xA5); /* the other region: not part of the mapping */
    lkv_pagespace_free(&ps);
    shm_unlink(names[0]);
}

static void test_refused(void)
{
    lkv_pagespace ps;
    lkv_pagespace_init(&ps, 4);
    lkv_lease_arena a = arena_of(0, PAGES);
    snprintf(a.backend, sizeof a.backend, "cuda");
    ASSERT_ERR(lkv_pagespace_map(&ps, &a, "tiny"), LKV_ENOTSUP);
    ASSERT_TRUE(strstr(ps.err, "cuda") != NULL);
    a = arena_of(0, PAGES);
    ASSERT_ERR(lkv_pagespace_map(&ps, &a, "llama"), LKV_EPROFILE);
    ASSERT_TRUE(strstr(ps.err, "llama") != NULL);
    a.regions[1].base_offset = RBASE + 256;
    ASSERT_ERR(lkv_pagespace_map(&ps, &a, "tiny"), LKV_EINVAL);
    ASSERT_TRUE(strstr(ps.err, "boundary") != NULL);
    a = arena_of(0, PAGES);
    snprintf(a.shm_name, sizeof a.shm_name, "/lkv-test-ps-missing-%d", (int)getpid());
    ASSERT_ERR(lkv_pagespace_map(&ps, &a, "tiny"), LKV_EIO);
    ASSERT_TRUE(strstr(ps.err, "lkv-test-ps-missing") != NULL);
    ASSERT_TRUE(ps.base == NULL);
    make_shm(0, 2);
    a = arena_of(0, PAGES); /* claims more pages than the object has */
    ASSERT_ERR(lkv_pagespace_map(&ps, &a, "tiny"), LKV_EIO);
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

#define DPB 2560u /* Device tests: a page size that is not a multiple of the OS page. */

/* Maps object 0 (PAGES pages of PAGE: DPB pages of region "tiny") through t with 5 worker pages
 * and checks the layout: the region's pages where the kernels will read them, in place, and
 * worker pages that do not overlap the arena, are writable and zeroed. */
static void dev_check(tdm *t, lkv_pagespace *ps, int placement, int below)
{
    uint8_t *daemon = make_shm(0, PAGES);
    lkv_lease_arena a = arena_of(0, PAGES);
    a.regions[1].page_bytes = DPB;
    a.regions[1].n_pages = PAGES * PAGE / DPB;
    a.cuda_ipc[0] = 7;
    lkv_pagespace_init(ps, 5);
    ps->dev = &t->ops;
    ASSERT_OK(lkv_pagespace_map(ps, &a, "tiny"));
    ASSERT_EQ(ps->placement, placement);
    ASSERT_EQ(ps->n_daemon, PAGES * PAGE / DPB);
    ASSERT_EQ(ps->page_bytes, DPB);
    ASSERT_EQ(t->n_open, 1);
    /* Below the region: worker pages first (from base), the region from daemon0 on. */
    ASSERT_EQ(ps->daemon0 >= 5, below);
    ASSERT_EQ(ps->first_local == 0, below);
    /* The region's page p is at base + daemon_page(p) * stride, in place. */
    ASSERT_TRUE(ps->base + (uint64_t)lkv_pagespace_daemon_page(ps, 0) * DPB == t->region);
    for (uint32_t p = 0; p < ps->n_daemon; p++) {
        uint32_t ix = lkv_pagespace_daemon_page(ps, p);
        ASSERT_TRUE(lkv_pagespace_is_daemon(ps, ix));
        ASSERT_EQ(ps->base[(uint64_t)ix * DPB + 1], (uint8_t)(((uint64_t)p * DPB + 1) / PAGE));
    }
    daemon[5 * DPB + 3] = 0xEE; /* The daemon writes after the mapping: seen in place. */
    ASSERT_EQ(ps->base[(uint64_t)lkv_pagespace_daemon_page(ps, 5) * DPB + 3], 0xEE);
    ps->base[(uint64_t)lkv_pagespace_daemon_page(ps, 2) * DPB] = 0x42; /* Writes in place. */
    ASSERT_EQ(daemon[2 * DPB], 0x42);
    /* Worker pages: outside the arena, zeroed, writable, stride DPB from the same base. */
    for (uint32_t k = 0; k < 5; k++) {
        uint8_t *w = ps->base + (uint64_t)(ps->first_local + k) * DPB;
        ASSERT_TRUE(!lkv_pagespace_is_daemon(ps, ps->first_local + k));
        ASSERT_TRUE(w + DPB <= t->opened || w >= t->opened + t->opened_bytes);
        ASSERT_EQ(w[0], 0);
        ASSERT_EQ(w[DPB - 1], 0);
        memset(w, 0x5A, DPB);
    }
    for (uint32_t i = 0; i < PAGES * PAGE; i++) {
        if (i != 2 * DPB && i != 5 * DPB + 3) {
            ASSERT_EQ(daemon[i], i / PAGE);
        }
    }
    lkv_kv_shape s = {.n_layers = 1,
                      .n_q_heads = 1,
                      .n_kv_heads = 1,
                      .head_dim = 8,
                      .dtype = LKV_DTYPE_F32,
                      .block_tokens = 16};
    lkv_model_kv kv;
    lkv_pagespace_view(ps, &s, &kv);
    ASSERT_EQ(kv.n_used, ps->first_local);
    ASSERT_EQ(kv.n_pages, ps->first_local + 5);
    ASSERT_TRUE(kv.base == ps->base);
    /* The same arena: nothing remapped; a new IPC handle (a restarted daemon): remapped. */
    ASSERT_OK(lkv_pagespace_map(ps, &a, "tiny"));
    ASSERT_EQ(ps->n_maps, 1);
    ASSERT_EQ(t->n_open, 1);
    a.cuda_ipc[0] = 8;
    ASSERT_OK(lkv_pagespace_map(ps, &a, "tiny"));
    ASSERT_EQ(ps->n_maps, 2);
    ASSERT_EQ(t->n_open, 2);
    ASSERT_EQ(t->n_close, 1);
    ASSERT_EQ(ps->placement, placement);
    lkv_pagespace_free(ps);
    ASSERT_EQ(t->n_close, 2);
    ASSERT_EQ(t->n_free, t->n_alloc);
    shm_unlink(names[0]);
}

static void test_dev_after(void)
{
    tdm t;
    tdm_init(&t, RBASE);
    lkv_pagespace ps;
    dev_check(&t, &ps, LKV_PS_DEV_AFTER, 0);
}

static void test_dev_below(void)
{
    tdm t;
    tdm_init(&t, RBASE);
    t.refuse_after = 1;
    lkv_pagespace ps;
    dev_check(&t, &ps, LKV_PS_DEV_BELOW, 1);
}

static void test_dev_offset(void)
{
    /* No VMM: a plain allocation above the arena at an address that is not a whole number of
     * pages from the region, then one below it. */
    tdm t;
    tdm_init(&t, RBASE);
    t.no_vmm = 1;
    t.plain_at = (int64_t)(PAGES * PAGE) + 3 * (int64_t)TDM_GRAN + 4096;
    lkv_pagespace ps;
    dev_check(&t, &ps, LKV_PS_DEV_OFFSET, 0);
    tdm_init(&t, RBASE);
    t.no_vmm = 1;
    t.plain_at = -(int64_t)(RBASE + 9 * DPB + 2 * 4096 + TDM_GRAN);
    dev_check(&t, &ps, LKV_PS_DEV_OFFSET, 1);
}

static void test_dev_refused(void)
{
    /* The plain allocation lies past 2^24 pages of the region: refused, nothing kept. */
    tdm t;
    tdm_init(&t, RBASE);
    t.no_vmm = 1;
    t.plain_at = -(int64_t)(LKV_REF_MAX_PAGE + 64) * DPB; /* 43 GB below */
    make_shm(0, PAGES);
    lkv_lease_arena a = arena_of(0, PAGES);
    a.regions[1].page_bytes = DPB;
    a.regions[1].n_pages = 10;
    lkv_pagespace ps;
    lkv_pagespace_init(&ps, 5);
    ps.dev = &t.ops;
    ASSERT_ERR(lkv_pagespace_map(&ps, &a, "tiny"), LKV_EINVAL);
    ASSERT_TRUE(strstr(ps.err, "2^24") != NULL);
    ASSERT_TRUE(ps.base == NULL && ps.n_maps == 0);
    ASSERT_EQ(t.n_open, 1);
    ASSERT_EQ(t.n_close, 1);
    ASSERT_EQ(t.n_free, t.n_alloc);
    /* An arena of another backend than the ops map, and a region past the arena's end. */
    snprintf(a.backend, sizeof a.backend, "cuda");
    ASSERT_ERR(lkv_pagespace_map(&ps, &a, "tiny"), LKV_ENOTSUP);
    ASSERT_TRUE(strstr(ps.err, "hot_backend=host") != NULL);
    a = arena_of(0, PAGES);
    a.regions[1].n_pages = PAGES + 1;
    ASSERT_ERR(lkv_pagespace_map(&ps, &a, "tiny"), LKV_EIO);
    ASSERT_EQ(t.n_open, 1);
    /* Local only, on the device: the ops' memory, no daemon pages. */
    ASSERT_OK(lkv_pagespace_map_local(&ps, DPB));
    ASSERT_EQ(ps.placement, LKV_PS_DEV_LOCAL);
    ASSERT_TRUE(ps.n_daemon == 0 && ps.first_local == 0 && ps.daemon0 == 0);
    ps.base[5 * DPB - 1] = 1;
    lkv_pagespace_free(&ps);
    ASSERT_EQ(t.n_free, t.n_alloc);
    shm_unlink(names[0]);
}

int main(void)
{
    LKV_RUN(test_dev_after);
    LKV_RUN(test_dev_below);
    LKV_RUN(test_dev_offset);
    LKV_RUN(test_dev_refused);
    LKV_RUN(test_map);
    LKV_RUN(test_odd_page);
    LKV_RUN(test_refused);
    return 0;
}
