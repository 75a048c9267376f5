/*
 * test_crash.c: crash consistency. A forked child opens a store and puts documents in a loop,
 * reporting each acknowledged document's number through a pipe; the parent SIGKILLs it
 * mid-stream, reopens the store and checks:
 *   write-through  every acknowledged document is present and intact;
 *   write-back     no document is torn: every present document reads back intact, and
 *                  nothing is present that the child did not put; the child also calls
 *                  lkv_store_flush every 8 puts and reports it: every document put before
 *                  a flush that returned 0 (persisted) must be present and intact.
 *   write-back without the WAL (wb_no_wal): the same, where a flush is a memtable flush.
 * Each mode runs at several kill points. The child's leaked shared memory object is unlinked.
 */
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "store_util.h"

static uint32_t doc_tokens(uint64_t i)
{
    return 1 + (uint32_t)((i * 7) % 60); /* 1..60 tokens: 1..15 blocks. */
}

static void child(const char *dir, int durability, int fd)
{
    lkv_store *s = su_open(dir, 48, 0, durability);
    for (uint64_t i = 0;; i++) {
        int rc = su_put(s, i, doc_tokens(i), NULL);
        if (rc != 0) {
            fprintf(stderr, "child: put %llu: %s\n", (unsigned long long)i, lkv_err_name(rc));
            _exit(3);
        }
        if (write(fd, &i, sizeof i) != sizeof i) {
            _exit(4);
        }
        if (durability == LKV_DURABILITY_WRITE_BACK && i % 8 == 7) {
            rc = lkv_store_flush(s);
            if (rc != 0) {
                fprintf(stderr, "child: flush: %s\n", lkv_err_name(rc));
                _exit(5);
            }
            uint64_t mark = (1ull << 63) | i; /* 0..i are persisted. */
            if (write(fd, &mark, sizeof mark) != sizeof mark) {
                _exit(4);
            }
        }
    }
}

static void unlink_shm_of(pid_t pid)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "lazykv-%ld-", (long)pid);
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    if (d == NULL) {
        return;
    }
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            char name[300];
            snprintf(name, sizeof name, "/%s", e->d_name);
            shm_unlink(name);
        }
    }
    closedir(d);
}

typedef struct seen {
    lkv_store *s;
    uint64_t limit; /* Documents 0..limit-1 may exist. */
    int present;
} seen;

static int check_cb(void *ctx, const lkv_dockey *k, const lkv_doc_info *in)
{
    seen *sn = ctx;
    for (uint64_t i = 0; i < sn->limit; i++) {
        lkv_dockey ki;
        su_key(sn->s, i, doc_tokens(i), &ki);
        if (memcmp(&ki, k, sizeof ki) == 0) {
            ASSERT_EQ(in->n_tokens, doc_tokens(i));
            sn->present++;
            return 0;
        }
    }
    LKV_FAIL("a document that was never put is present");
    return 1;
}

static void verify(const char *dir, int durability, uint64_t acked, uint64_t persisted);

static void run(int durability, uint64_t kill_after)
{
    char *dir = su_tmpdir();
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        child(dir, durability, p[1]);
        _exit(0);
    }
    close(p[1]);
    uint64_t acked = 0, persisted = 0, i;
    while (acked < kill_after && read(p[0], &i, sizeof i) == sizeof i) {
        if (i >> 63) {
            persisted = (i & ~(1ull << 63)) + 1;
            continue;
        }
        ASSERT_EQ(i, acked);
        acked++;
    }
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));
    /* Acks written before the kill but not yet read also count. */
    while (read(p[0], &i, sizeof i) == sizeof i) {
        if (i >> 63) {
            persisted = (i & ~(1ull << 63)) + 1;
            continue;
        }
        ASSERT_EQ(i, acked);
        acked++;
    }
    close(p[0]);
    unlink_shm_of(pid);
    ASSERT_TRUE(acked >= kill_after);

    /* Check in another child, so that this process never starts threads (RocksDB's) and can
     * keep forking (required under ThreadSanitizer). */
    pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        verify(dir, durability, acked, persisted);
        _exit(0);
    }
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    su_rmdir(dir);
}

static void verify(const char *dir, int durability, uint64_t acked, uint64_t persisted)
{
    lkv_store *s = su_open(dir, 48, 0, durability);
    uint64_t must = durability == LKV_DURABILITY_WRITE_THROUGH ? acked : persisted;
    {
        for (uint64_t d = 0; d < must; d++) {
            lkv_dockey k;
            su_key(s, d, doc_tokens(d), &k);
            int rc = su_check(s, &k, d, doc_tokens(d));
            if (rc != 0) {
                LKV_FAIL("acknowledged document %llu of %llu: %s", (unsigned long long)d,
                         (unsigned long long)acked, lkv_err_name(rc));
            }
        }
    }
    /* Both modes: whatever is present is a document the child put, and reads back intact. */
    seen sn = {s, acked + 1, 0};
    ASSERT_OK(lkv_store_foreach(s, check_cb, &sn));
    int intact = 0;
    for (uint64_t d = 0; d <= acked; d++) {
        lkv_dockey k;
        su_key(s, d, doc_tokens(d), &k);
        int rc = su_check(s, &k, d, doc_tokens(d));
        ASSERT_TRUE(rc == 0 || rc == LKV_ENOTFOUND);
        intact += rc == 0;
    }
    ASSERT_EQ(intact, sn.present);
    ASSERT_EQ(su_stats(s).corrupt_blocks, 0);
    fprintf(stderr,
            "   %s%s: killed after %llu acks (%llu flushed), %d documents present after "
            "restart\n",
            lkv_durability_name(durability), su_no_wal ? " without the WAL" : "",
            (unsigned long long)acked, (unsigned long long)persisted, sn.present);
    ASSERT_TRUE((uint64_t)sn.present >= must);
    ASSERT_OK(lkv_store_close(s));
}

static void test_write_through(void)
{
    run(LKV_DURABILITY_WRITE_THROUGH, 5);
    run(LKV_DURABILITY_WRITE_THROUGH, 30);
}

static void test_write_back(void)
{
    run(LKV_DURABILITY_WRITE_BACK, 5);
    run(LKV_DURABILITY_WRITE_BACK, 60);
    run(LKV_DURABILITY_WRITE_BACK, 200);
}

static void test_write_back_no_wal(void)
{
    su_no_wal = 1;
    run(LKV_DURABILITY_WRITE_BACK, 5);
    run(LKV_DURABILITY_WRITE_BACK, 60);
    run(LKV_DURABILITY_WRITE_BACK, 200);
    su_no_wal = 0;
}

int main(void)
{
    LKV_RUN(test_write_through);
    LKV_RUN(test_write_back);
    LKV_RUN(test_write_back_no_wal);
    return 0;
}
