/*
 * test_inplace.c: put in place (issue 10) against the real lazykvd through the C client.
 *
 *   - reserve -> write the blocks through the shm mapping -> invisible (Lookup, Get, another
 *     tenant's view is the same store) -> commit -> visible, Get returns exactly the written
 *     bytes, pinned under the lease (Release unpins);
 *   - abort: pages back (region pages_free), nothing visible; commit after abort: NOT_FOUND;
 *   - a commit whose last block has a non-zero tail is refused (INVALID_ARGUMENT), nothing
 *     visible, the reservation still open: fixing the tail and committing again works;
 *   - a writer killed with kill -9 after writing: its lease expires, the pages come back, the
 *     document never becomes visible;
 *   - two reservers of one document: the second gets ABORTED / LKV_EINPROGRESS at once; with
 *     wait it is parked (a Health check and a Lookup still answer meanwhile) and attaches the
 *     document once the first commits (already_present, the first's pages);
 *   - budgets: a document larger than its profile's region is RESOURCE_EXHAUSTED; a Reserve
 *     evicts unpinned documents as Put does;
 *   - per-profile pages: a stories260k 20 KiB block takes a 20 KiB page (the region's page
 *     size in the reply and in Stats, and the bytes held after the commit);
 *   - persistence like Put: write-back across a SIGTERM restart, write-through (Commit on the
 *     pool) across kill -9 of the daemon.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lkv_it_util.h"
#include "lkv_kvfile.h"
#include "test_cli_run.h"
#include "lkv_test.h"

static lkv_daemon dm;

#define RUN(fn, ...)                                                                               \
    do {                                                                                           \
        fprintf(stderr, "-- %s\n", #fn);                                                           \
        fn(__VA_ARGS__);                                                                           \
    } while (0)

/* stories260k: 5 layers x 2 x 4 kv heads x 16 tokens x 8 dims x 4 bytes = 20 KiB blocks. */
static const it_shape stories = {"stories260k", 5, 4, 8, 4, 16, 512};

static double stat_of(lkv_client_t *c, const char *section, const char *key)
{
    lkv_stat_entry *e = NULL;
    size_t n = 0;
    ASSERT_OK(lkv_client_stats_entries(c, section, 0, &e, &n));
    for (size_t i = 0; i < n; i++) {
        if (strcmp(e[i].key, key) == 0) {
            double v = e[i].value;
            free(e);
            return v;
        }
    }
    free(e);
    LKV_FAIL("stat %s.%s not found", section, key);
}

static int present(lkv_client_t *c, const it_shape *s, const it_doc *d)
{
    lkv_docref r = lkv_it_ref(s, d);
    lkv_doc_status st;
    ASSERT_OK(lkv_client_lookup(c, &r, 1, 0, &st));
    return st.present;
}

/* Writes d's blocks into the reservation's addresses. */
static void write_blocks(const lkv_reservation *r, const it_doc *d)
{
    ASSERT_EQ(r->doc.n_pages, d->n_blocks);
    ASSERT_EQ(r->doc.block_bytes, d->block_bytes);
    for (uint32_t i = 0; i < d->n_blocks; i++) {
        memcpy(r->addrs[i], d->blocks + (size_t)i * d->block_bytes, d->block_bytes);
    }
}

static void check_get(lkv_client_t *c, const it_shape *s, const it_doc *d)
{
    lkv_docref ref = lkv_it_ref(s, d);
    lkv_get_header h;
    uint8_t *buf = NULL;
    size_t len = 0;
    ASSERT_OK(lkv_client_get_buf(c, &ref, 0, &h, &buf, &len));
    ASSERT_EQ(len, (size_t)d->n_blocks * d->block_bytes);
    ASSERT_TRUE(memcmp(buf, d->blocks, len) == 0);
    free(buf);
}

static void test_reserve_commit(lkv_client_t *c, lkv_arena_map *map)
{
    it_doc d;
    lkv_it_doc_make(&lkv_it_itest, 1001, 37, &d); /* 3 blocks, the last partial. */
    double free0 = stat_of(c, "regions", "itest.pages_free");
    lkv_reservation r;
    ASSERT_OK(lkv_client_reserve(c, "itest", d.tokens, d.n_tokens, NULL, 20000, 0, map, 0, &r));
    ASSERT_EQ(r.already_present, 0);
    ASSERT_EQ(stat_of(c, "regions", "itest.pages_free"), free0 - 3);
    ASSERT_EQ(stat_of(c, "leases", "reserved"), 1);
    /* The region the reply names is the one the arena lists for the profile. */
    ASSERT_TRUE(strcmp(r.arena.regions[r.doc.region].profile, "itest") == 0);
    ASSERT_EQ(r.arena.regions[r.doc.region].base_offset, r.doc.region_base);
    ASSERT_EQ(r.doc.page_bytes, 2048); /* itest: 2 x 2 x 2 x 16 x 8 x 2 B, no rounding. */
    ASSERT_EQ(r.doc.region_base % (2u << 20), 0);
    write_blocks(&r, &d);
    /* Invisible until the commit: Lookup misses, Get is NOT_FOUND, a Put of the same document
     * is its own (stored, not already_present). */
    ASSERT_EQ(present(c, &lkv_it_itest, &d), 0);
    lkv_docref ref = lkv_it_ref(&lkv_it_itest, &d);
    lkv_get_header h;
    uint8_t *buf = NULL;
    size_t len;
    ASSERT_ERR(lkv_client_get_buf(c, &ref, 0, &h, &buf, &len), LKV_ENOTFOUND);
    lkv_attached_doc out;
    int already = -1;
    ASSERT_OK(lkv_client_commit(c, r.lease_id, r.doc.key, 0, &out, &already));
    ASSERT_EQ(already, 0);
    ASSERT_EQ(out.n_pages, 3);
    ASSERT_TRUE(memcmp(out.pages, r.doc.pages, 3 * sizeof(uint32_t)) == 0);
    free(out.pages);
    ASSERT_EQ(present(c, &lkv_it_itest, &d), 1);
    check_get(c, &lkv_it_itest, &d);
    /* Committed twice: the reservation is gone. */
    ASSERT_ERR(lkv_client_commit(c, r.lease_id, r.doc.key, 0, NULL, NULL), LKV_ENOTFOUND);
    ASSERT_EQ(stat_of(c, "leases", "reserved"), 0);
    ASSERT_EQ(stat_of(c, "leases", "docs_pinned"), 1); /* Pinned under the lease now. */
    /* Reserving it again: cached, so it is attached (same pages), not reserved. */
    lkv_reservation r2;
    ASSERT_OK(lkv_client_reserve(c, "itest", d.tokens, d.n_tokens, NULL, 20000, 0, NULL, 0, &r2));
    ASSERT_EQ(r2.already_present, 1);
    ASSERT_TRUE(memcmp(r2.doc.pages, r.doc.pages, 3 * sizeof(uint32_t)) == 0);
    uint32_t rel = 0;
    ASSERT_OK(lkv_client_release(c, r2.lease_id, 0, &rel));
    ASSERT_EQ(rel, 1);
    ASSERT_OK(lkv_client_release(c, r.lease_id, 0, &rel));
    ASSERT_EQ(rel, 1);
    ASSERT_EQ(stat_of(c, "leases", "docs_pinned"), 0);
    /* Cold now (Admin Evict): a Reserve promotes it (on the pool) and attaches it. */
    ASSERT_OK(lkv_client_evict(c, r.doc.key, 0));
    lkv_doc_status ds;
    lkv_docref kref = {.key = r.doc.key};
    ASSERT_OK(lkv_client_lookup(c, &kref, 1, 0, &ds));
    ASSERT_EQ(ds.tier, LKV_WIRE_TIER_COLD);
    lkv_reservation r3;
    ASSERT_OK(lkv_client_reserve(c, "itest", d.tokens, d.n_tokens, NULL, 20000, 0, map, 0, &r3));
    ASSERT_EQ(r3.already_present, 1);
    for (uint32_t i = 0; i < 3; i++) {
        ASSERT_TRUE(memcmp(r3.addrs[i], d.blocks + (size_t)i * d.block_bytes, d.block_bytes) == 0);
    }
    ASSERT_OK(lkv_client_release(c, r3.lease_id, 0, NULL));
    lkv_reservation_free(&r3);
    lkv_reservation_free(&r);
    lkv_reservation_free(&r2);
    lkv_it_doc_free(&d);
}

static void test_abort_and_tail(lkv_client_t *c, lkv_arena_map *map)
{
    it_doc d;
    lkv_it_doc_make(&lkv_it_itest, 1002, 20, &d); /* 2 blocks: 4 valid tokens in the last. */
    double free0 = stat_of(c, "regions", "itest.pages_free");
    lkv_reservation r;
    ASSERT_OK(lkv_client_reserve(c, "itest", d.tokens, d.n_tokens, NULL, 20000, 0, map, 0, &r));
    write_blocks(&r, &d);
    ASSERT_OK(lkv_client_abort(c, r.lease_id, r.doc.key, 0));
    ASSERT_EQ(stat_of(c, "regions", "itest.pages_free"), free0);
    ASSERT_EQ(present(c, &lkv_it_itest, &d), 0);
    ASSERT_ERR(lkv_client_commit(c, r.lease_id, r.doc.key, 0, NULL, NULL), LKV_ENOTFOUND);
    ASSERT_ERR(lkv_client_abort(c, r.lease_id, r.doc.key, 0), LKV_ENOTFOUND);
    uint8_t lease[LKV_LEASE_ID_BYTES];
    memcpy(lease, r.lease_id, sizeof lease);
    lkv_reservation_free(&r);

    /* In the same lease: a non-zero byte past the end (token 4 of block 1, layer 1, V, head
     * 1) is refused, nothing visible, the reservation stays open. */
    ASSERT_OK(lkv_client_reserve(c, "itest", d.tokens, d.n_tokens, lease, 20000, 0, map, 0, &r));
    write_blocks(&r, &d);
    size_t slab = 16 * 8 * 2;
    uint8_t *last = r.addrs[1];
    size_t off = ((size_t)(1 * 2 + 1) * 2 + 1) * slab + 4 * 8 * 2 + 3;
    last[off] = 0x5a;
    ASSERT_ERR(lkv_client_commit(c, r.lease_id, r.doc.key, 0, NULL, NULL), LKV_EINVAL);
    ASSERT_TRUE(lkv_it_contains(lkv_client_last_error(), "must be zero"));
    ASSERT_EQ(present(c, &lkv_it_itest, &d), 0);
    ASSERT_EQ(stat_of(c, "leases", "reserved"), 1);
    last[off] = 0;
    ASSERT_OK(lkv_client_commit(c, r.lease_id, r.doc.key, 0, NULL, NULL));
    ASSERT_EQ(present(c, &lkv_it_itest, &d), 1);
    check_get(c, &lkv_it_itest, &d);
    ASSERT_OK(lkv_client_release(c, lease, 0, NULL));
    lkv_reservation_free(&r);
    lkv_it_doc_free(&d);
}

/* A worker process (the CLI with --hold: reserve, write the blocks through its own mapping,
 * then wait) is killed with SIGKILL before committing. */
static void test_writer_killed(lkv_client_t *c)
{
    it_doc d;
    lkv_it_doc_make(&lkv_it_itest, 1003, 64, &d);
    char path[600];
    snprintf(path, sizeof path, "%s/killed.kv", dm.dir);
    lkv_kvfile kf = {.n_tokens = d.n_tokens,
                     .tokens = d.tokens,
                     .n_blocks = d.n_blocks,
                     .block_bytes = d.block_bytes,
                     .blocks = d.blocks};
    snprintf(kf.profile, sizeof kf.profile, "itest");
    char err[256];
    ASSERT_OK(lkv_kvfile_write(path, &kf, err, sizeof err));
    double free0 = stat_of(c, "regions", "itest.pages_free");
    double expired0 = stat_of(c, "leases", "resv_expired");
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        execl(lkv_cli_bin(), lkv_cli_bin(), "--addr", dm.addr, "reserve", "--ttl", "1500", "--hold",
              path, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char line[512];
    ssize_t got = 0, k;
    while (got < (ssize_t)sizeof line - 1 && (k = read(fds[0], line + got, 1)) == 1 &&
           line[got] != '\n') {
        got++;
    }
    line[got] = '\0';
    close(fds[0]);
    ASSERT_TRUE(lkv_it_contains(line, " reserved"));
    ASSERT_EQ(stat_of(c, "regions", "itest.pages_free"), free0 - 4);
    ASSERT_EQ(stat_of(c, "leases", "reserved"), 1);
    ASSERT_EQ(present(c, &lkv_it_itest, &d), 0); /* Written, held, not visible. */
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));
    int back = 0;
    for (int i = 0; i < 100 && !back; i++) {
        usleep(100 * 1000);
        back = stat_of(c, "regions", "itest.pages_free") == free0;
    }
    ASSERT_TRUE(back);
    ASSERT_EQ(stat_of(c, "leases", "resv_expired"), expired0 + 1);
    ASSERT_EQ(stat_of(c, "leases", "reserved"), 0);
    ASSERT_EQ(present(c, &lkv_it_itest, &d), 0);
    lkv_it_doc_free(&d);
}

typedef struct waiter_arg {
    const it_doc *d;
    int rc;
    lkv_reservation r;
} waiter_arg;

static void *waiter_main(void *p)
{
    waiter_arg *a = p;
    lkv_client_t *c = lkv_it_client(&dm);
    a->rc = lkv_client_reserve(c, "itest", a->d->tokens, a->d->n_tokens, NULL, 20000, 1, NULL,
                               lkv_test_timeout_ms(20000), &a->r);
    lkv_client_destroy(c);
    return NULL;
}

static void test_two_reservers(lkv_client_t *c, lkv_arena_map *map)
{
    it_doc d;
    lkv_it_doc_make(&lkv_it_itest, 1004, 50, &d);
    lkv_reservation r, r2;
    ASSERT_OK(lkv_client_reserve(c, "itest", d.tokens, d.n_tokens, NULL, 20000, 0, map, 0, &r));
    /* The second reserver, not waiting: ABORTED / LKV_EINPROGRESS at once. */
    ASSERT_ERR(lkv_client_reserve(c, "itest", d.tokens, d.n_tokens, NULL, 20000, 0, NULL, 0, &r2),
               LKV_EINPROGRESS);
    ASSERT_TRUE(lkv_it_contains(lkv_client_last_error(), "another worker"));
    /* The same lease again: ALREADY_EXISTS. */
    ASSERT_ERR(
        lkv_client_reserve(c, "itest", d.tokens, d.n_tokens, r.lease_id, 20000, 0, NULL, 0, &r2),
        LKV_EEXIST);
    /* Waiting reservers (more than polling threads) park; the daemon still answers. */
    enum { NW = 6 };
    waiter_arg wa[NW];
    pthread_t th[NW];
    for (int i = 0; i < NW; i++) {
        memset(&wa[i], 0, sizeof wa[i]);
        wa[i].d = &d;
        pthread_create(&th[i], NULL, waiter_main, &wa[i]);
    }
    int parked = 0;
    for (int i = 0; i < 200 && !parked; i++) {
        usleep(20 * 1000);
        parked = stat_of(c, "leases", "waiting") == NW;
    }
    ASSERT_TRUE(parked);
    ASSERT_OK(lkv_client_ping(c, "", 0));
    ASSERT_EQ(present(c, &lkv_it_itest, &d), 0);
    write_blocks(&r, &d);
    ASSERT_OK(lkv_client_commit(c, r.lease_id, r.doc.key, 0, NULL, NULL));
    for (int i = 0; i < NW; i++) {
        pthread_join(th[i], NULL);
        ASSERT_OK(wa[i].rc);
        ASSERT_EQ(wa[i].r.already_present, 1);
        ASSERT_EQ(wa[i].r.waited, 1);
        ASSERT_TRUE(memcmp(wa[i].r.doc.pages, r.doc.pages, d.n_blocks * sizeof(uint32_t)) == 0);
        ASSERT_OK(lkv_client_release(c, wa[i].r.lease_id, 0, NULL));
        lkv_reservation_free(&wa[i].r);
    }
    ASSERT_EQ(stat_of(c, "leases", "waiting"), 0);
    check_get(c, &lkv_it_itest, &d);
    ASSERT_OK(lkv_client_release(c, r.lease_id, 0, NULL));
    lkv_reservation_free(&r);

    /* A waiter whose holder aborts reserves the document itself. */
    it_doc e;
    lkv_it_doc_make(&lkv_it_itest, 1005, 50, &e);
    ASSERT_OK(lkv_client_reserve(c, "itest", e.tokens, e.n_tokens, NULL, 20000, 0, map, 0, &r));
    waiter_arg w1 = {.d = &e};
    pthread_create(&th[0], NULL, waiter_main, &w1);
    parked = 0;
    for (int i = 0; i < 200 && !parked; i++) {
        usleep(20 * 1000);
        parked = stat_of(c, "leases", "waiting") == 1;
    }
    ASSERT_TRUE(parked);
    ASSERT_OK(lkv_client_abort(c, r.lease_id, r.doc.key, 0));
    pthread_join(th[0], NULL);
    ASSERT_OK(w1.rc);
    ASSERT_EQ(w1.r.already_present, 0); /* Its own reservation now. */
    ASSERT_EQ(w1.r.waited, 1);
    ASSERT_OK(lkv_client_abort(c, w1.r.lease_id, w1.r.doc.key, 0));
    ASSERT_EQ(present(c, &lkv_it_itest, &e), 0);
    ASSERT_OK(lkv_client_release(c, w1.r.lease_id, 0, NULL));
    ASSERT_OK(lkv_client_release(c, r.lease_id, 0, NULL));
    lkv_reservation_free(&w1.r);
    lkv_reservation_free(&r);
    lkv_it_doc_free(&e);
    lkv_it_doc_free(&d);
}

static void test_budgets_and_pages(lkv_client_t *c, lkv_arena_map *map)
{
    /* stories260k's region: 20 KiB pages (not 2 MiB). */
    it_doc d;
    lkv_it_doc_make(&stories, 2001, 40, &d); /* 3 blocks. */
    ASSERT_EQ(d.block_bytes, 20480);
    ASSERT_EQ(stat_of(c, "regions", "stories260k.bytes_used"), 0);
    lkv_reservation r;
    ASSERT_OK(
        lkv_client_reserve(c, "stories260k", d.tokens, d.n_tokens, NULL, 20000, 0, map, 0, &r));
    ASSERT_EQ(r.doc.page_bytes, 20480);
    ASSERT_EQ(r.arena.regions[r.doc.region].page_bytes, 20480);
    ASSERT_EQ(stat_of(c, "regions", "stories260k.bytes_used"), 3 * 20480);
    ASSERT_EQ(stat_of(c, "leases", "reserved_bytes"), 3 * 20480);
    write_blocks(&r, &d);
    ASSERT_OK(lkv_client_commit(c, r.lease_id, r.doc.key, 0, NULL, NULL));
    check_get(c, &stories, &d);
    ASSERT_EQ(stat_of(c, "regions", "stories260k.bytes_used"), 3 * 20480);
    ASSERT_EQ(stat_of(c, "leases", "bytes_pinned"), 3 * 20480);
    ASSERT_OK(lkv_client_release(c, r.lease_id, 0, NULL));
    lkv_reservation_free(&r);
    lkv_it_doc_free(&d);

    /* The itest region has 64 pages (profile.itest.hot_bytes = 128 KiB): a 65-block document
     * never fits; a 40-block one fits by evicting unpinned documents, as Put would. */
    double budget = stat_of(c, "regions", "itest.bytes_budget");
    ASSERT_EQ(budget, 64 * 2048);
    lkv_it_doc_make(&lkv_it_itest, 2002, 65 * 16, &d);
    ASSERT_ERR(lkv_client_reserve(c, "itest", d.tokens, d.n_tokens, NULL, 20000, 0, NULL, 0, &r),
               LKV_ENOSPC);
    ASSERT_TRUE(lkv_it_contains(lkv_client_last_error(), "itest"));
    lkv_it_doc_free(&d);
    it_doc small[3];
    for (int i = 0; i < 3; i++) {
        lkv_it_doc_make(&lkv_it_itest, 2100 + i, 16 * 16, &small[i]);
        lkv_put_reply pr;
        ASSERT_OK(lkv_client_put(c, "itest", small[i].tokens, small[i].n_tokens, small[i].blocks,
                                 small[i].n_blocks, small[i].block_bytes, 0, &pr));
    }
    double ev0 = stat_of(c, "movement", "evictions_hot");
    lkv_it_doc_make(&lkv_it_itest, 2003, 40 * 16, &d);
    ASSERT_OK(lkv_client_reserve(c, "itest", d.tokens, d.n_tokens, NULL, 20000, 0, map, 0, &r));
    ASSERT_TRUE(stat_of(c, "movement", "evictions_hot") > ev0);
    /* Held by the reservation: a second big one cannot make room (RESOURCE_EXHAUSTED). */
    it_doc d2;
    lkv_reservation r2;
    lkv_it_doc_make(&lkv_it_itest, 2004, 40 * 16, &d2);
    ASSERT_ERR(lkv_client_reserve(c, "itest", d2.tokens, d2.n_tokens, NULL, 20000, 0, NULL, 0, &r2),
               LKV_ENOSPC);
    write_blocks(&r, &d);
    ASSERT_OK(lkv_client_commit(c, r.lease_id, r.doc.key, 0, NULL, NULL));
    ASSERT_OK(lkv_client_release(c, r.lease_id, 0, NULL));
    check_get(c, &lkv_it_itest, &d);
    lkv_reservation_free(&r);
    lkv_it_doc_free(&d);
    lkv_it_doc_free(&d2);
    for (int i = 0; i < 3; i++) {
        lkv_it_doc_free(&small[i]);
    }
}

/* Writes document d of itest as a KV file at path. */
static void write_kvfile(const char *path, const it_doc *d)
{
    lkv_kvfile kf = {.n_tokens = d->n_tokens,
                     .tokens = d->tokens,
                     .n_blocks = d->n_blocks,
                     .block_bytes = d->block_bytes,
                     .blocks = d->blocks};
    snprintf(kf.profile, sizeof kf.profile, "itest");
    char err[256];
    ASSERT_OK(lkv_kvfile_write(path, &kf, err, sizeof err));
}

/* `lazykv reserve` (write the file's blocks in place), `commit`, `abort`, exit codes. */
static void test_cli(lkv_client_t *c)
{
    it_doc d[3];
    char path[3][600];
    for (int i = 0; i < 3; i++) {
        lkv_it_doc_make(&lkv_it_itest, 5001 + (uint64_t)i, 30, &d[i]);
        snprintf(path[i], sizeof path[i], "%s/cli%d.kv", dm.dir, i);
        write_kvfile(path[i], &d[i]);
    }
    cli_dir = dm.dir;
    ASSERT_EQ(cli_run("--addr", dm.addr, "reserve", path[0], NULL), 0);
    char key[65], lease[33];
    ASSERT_EQ(sscanf(cli_out, "%64s lease=%32s", key, lease), 2);
    ASSERT_TRUE(lkv_it_contains(cli_out, " reserved"));
    ASSERT_EQ(present(c, &lkv_it_itest, &d[0]), 0);
    /* Another worker: ABORTED (exit 3, LKV_EINPROGRESS), at once. */
    ASSERT_EQ(cli_run("--addr", dm.addr, "reserve", path[0], NULL), 3);
    ASSERT_TRUE(lkv_it_contains(cli_err, "LKV_EINPROGRESS"));
    ASSERT_EQ(cli_run("--addr", dm.addr, "commit", lease, key, NULL), 0);
    ASSERT_TRUE(lkv_it_contains(cli_out, "committed"));
    check_get(c, &lkv_it_itest, &d[0]);
    ASSERT_EQ(cli_run("--addr", dm.addr, "commit", lease, key, NULL), 1); /* NOT_FOUND */
    ASSERT_EQ(cli_run("--addr", dm.addr, "release", lease, NULL), 0);
    /* --commit in one go. */
    ASSERT_EQ(cli_run("--addr", dm.addr, "reserve", "--commit", path[1], NULL), 0);
    ASSERT_TRUE(lkv_it_contains(cli_out, " committed"));
    check_get(c, &lkv_it_itest, &d[1]);
    /* Reserve, abort: nothing visible. */
    ASSERT_EQ(cli_run("--addr", dm.addr, "reserve", "--ttl", "5000", path[2], NULL), 0);
    ASSERT_EQ(sscanf(cli_out, "%64s lease=%32s", key, lease), 2);
    ASSERT_EQ(cli_run("--addr", dm.addr, "abort", lease, key, NULL), 0);
    ASSERT_EQ(present(c, &lkv_it_itest, &d[2]), 0);
    ASSERT_EQ(cli_run("--addr", dm.addr, "abort", lease, key, NULL), 1);
    ASSERT_EQ(cli_run("--addr", dm.addr, "commit", "nothex", key, NULL), 2);
    ASSERT_EQ(cli_run("--addr", dm.addr, "reserve", NULL), 2);
    for (int i = 0; i < 3; i++) {
        lkv_it_doc_free(&d[i]);
    }
}

/* Documents stored in place persist like Puts: write-back (the writer, flushed at SIGTERM)
 * survives a restart; write-through (the Commit runs on the pool and replies once synced)
 * survives kill -9 of the daemon. *c is replaced by a client of the restarted daemon. */
static void test_persisted(lkv_client_t **c, lkv_arena_map *map)
{
    it_doc d1, d2;
    lkv_it_doc_make(&lkv_it_itest, 1001, 37, &d1); /* Committed by test_reserve_commit. */
    lkv_it_doc_make(&lkv_it_itest, 3001, 45, &d2);
    lkv_arena_map_close(map);
    lkv_client_destroy(*c);
    ASSERT_EQ(lkv_daemon_stop(&dm, SIGTERM, lkv_test_timeout_ms(20000)), 0);
    const char *wt[] = {"--set", "durability=write-through", NULL};
    ASSERT_OK(lkv_daemon_start_with(&dm, wt));
    *c = lkv_it_client(&dm);
    ASSERT_EQ(present(*c, &lkv_it_itest, &d1), 1);
    check_get(*c, &lkv_it_itest, &d1);
    lkv_reservation r;
    ASSERT_OK(lkv_client_reserve(*c, "itest", d2.tokens, d2.n_tokens, NULL, 20000, 0, map, 0, &r));
    write_blocks(&r, &d2);
    ASSERT_OK(lkv_client_commit(*c, r.lease_id, r.doc.key, 0, NULL, NULL));
    lkv_reservation_free(&r);
    lkv_arena_map_close(map);
    lkv_client_destroy(*c);
    lkv_daemon_stop(&dm, SIGKILL, lkv_test_timeout_ms(20000)); /* A crash: only disk counts. */
    ASSERT_OK(lkv_daemon_start(&dm));
    *c = lkv_it_client(&dm);
    ASSERT_EQ(present(*c, &lkv_it_itest, &d2), 1);
    check_get(*c, &lkv_it_itest, &d2);
    lkv_it_doc_free(&d1);
    lkv_it_doc_free(&d2);
}

int main(void)
{
    /* hot_admission=always: test_budgets_and_pages checks that a Reserve makes room by evicting
     * as a Put does, whatever the admission door would say of a new document. */
    const char *args[] = {
        LKV_IT_PROFILE_ARGS,    "--set", "profile.itest.hot_bytes=128KiB", "--set",
        "hot_admission=always", NULL};
    lkv_daemon_init(&dm, args);
    lkv_it_start(&dm);
    lkv_client_t *c = lkv_it_client(&dm);
    lkv_arena_map map;
    memset(&map, 0, sizeof map);
    RUN(test_reserve_commit, c, &map);
    RUN(test_abort_and_tail, c, &map);
    RUN(test_writer_killed, c);
    RUN(test_two_reservers, c, &map);
    RUN(test_budgets_and_pages, c, &map);
    RUN(test_cli, c);
    RUN(test_persisted, &c, &map);
    lkv_arena_map_close(&map);
    lkv_client_destroy(c);
    ASSERT_OK(lkv_daemon_stop(&dm, SIGTERM, lkv_test_timeout_ms(20000)));
    return 0;
}
