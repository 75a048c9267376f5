/*
 * test_cold_faults.c (storage.cold_faults): the cold tier's disk going wrong, through the store.
 *
 *   disk full    on a 64 MiB tmpfs this test mounts (root; skipped with exit 77 where mount is
 *                refused): a write-through put is refused with LKV_ENOSPC naming the disk, a
 *                write-back document stays hot and is retried (counted), stored documents are
 *                still read, and puts work again once space is freed; a store opened on a
 *                full disk opens read-only, serves what it has, and reopens read-write (and
 *                persists the waiting backlog) once there is room.
 *   backlog      write-back's backlog bound (lkv_store_put_wait) with the writer stuck on the
 *                full disk: the next put waits, and is called back once space is freed.
 *   read-only    the same tmpfs remounted read-only: a clear refusal at open (LKV_EIO).
 *   damaged      in a plain temp dir: CURRENT missing, MANIFEST missing, a table file corrupt,
 *                a WAL record corrupt before its tail: each refused (LKV_ECORRUPT) by default,
 *                and with cold_on_corruption = reset moved aside (dir/corrupt-*) and started
 *                empty (the WAL case keeps what precedes the damage); a blob file corrupt:
 *                found at read (RocksDB's own blob checksum or ours), LKV_ECORRUPT, the
 *                document dropped, then a miss of cause corrupt, counted in corrupt_blocks.
 *   lost         a write-back document acknowledged but never persisted (the writer failed,
 *                then the process died): a miss of cause lost after restart.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lkv_cold.h"
#include "lkv_test.h"
#include "store_util.h"

#define MIN_FREE (16ull << 20)
#define WT       LKV_DURABILITY_WRITE_THROUGH
#define WB       LKV_DURABILITY_WRITE_BACK

static uint64_t free_bytes(const char *dir)
{
    struct statvfs v;
    ASSERT_OK(statvfs(dir, &v));
    return (uint64_t)v.f_bavail * v.f_frsize;
}

/* Fills dir's disk with a file (dir/filler) until only left bytes are free. */
static void fill_to(const char *dir, uint64_t left)
{
    char p[512];
    snprintf(p, sizeof p, "%s/filler", dir);
    int fd = open(p, O_CREAT | O_WRONLY, 0600);
    ASSERT_TRUE(fd >= 0);
    struct stat st;
    ASSERT_OK(fstat(fd, &st));
    uint64_t f = free_bytes(dir);
    ASSERT_TRUE(f > left);
    ASSERT_OK(posix_fallocate(fd, 0, st.st_size + (off_t)(f - left)));
    close(fd);
}

static void unfill(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/filler", dir);
    unlink(p);
}

static lkv_store *open_cfg(const char *dir, int durability, uint64_t min_free, int on_corruption,
                           int *rc_out)
{
    lkv_store_config c;
    lkv_store *s = NULL;
    su_config(&c, dir, 64, 0, durability);
    c.cold_min_free_bytes = min_free;
    c.cold_on_corruption = on_corruption;
    int rc = lkv_store_open(&c, &s);
    if (rc_out != NULL) {
        *rc_out = rc;
    } else {
        ASSERT_OK(rc);
    }
    return s;
}

/* Waits (up to 10 s) until the writer persisted at least n documents. */
static void wait_persisted(lkv_store *s, uint64_t n)
{
    for (int i = 0; i < 1000 && su_stats(s).wb_persisted < n; i++) {
        usleep(10000);
    }
    ASSERT_TRUE(su_stats(s).wb_persisted >= n);
}

static char *mnt; /* The tmpfs, or NULL. */

static int mount_tmpfs(void)
{
    mnt = su_tmpdir();
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=64m") != 0) {
        fprintf(stderr, "SKIP: cannot mount a tmpfs on %s (%m): the disk-full cases need root\n",
                mnt);
        rmdir(mnt);
        free(mnt);
        mnt = NULL;
        return -1;
    }
    return 0;
}

static void umount_tmpfs(void)
{
    umount2(mnt, MNT_DETACH);
    rmdir(mnt);
    free(mnt);
    mnt = NULL;
}

static void test_disk_full_write_through(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/wt", mnt);
    lkv_dockey k1, k2, k3;
    lkv_store *s = open_cfg(dir, WT, MIN_FREE, 0, NULL);
    ASSERT_OK(su_put(s, 1, 40, &k1));
    fill_to(mnt, MIN_FREE - (1u << 20)); /* Below the headroom. */
    ASSERT_ERR(su_put(s, 2, 40, &k2), LKV_ENOSPC);
    const char *why = lkv_store_why();
    if (strstr(why, "disk") == NULL || strstr(why, dir) == NULL) {
        LKV_FAIL("the refusal does not name the disk: %s", why);
    }
    lkv_doc_info in;
    ASSERT_OK(lkv_store_lookup(s, &k2, 1, &in));
    ASSERT_EQ(in.present, 0);           /* A refused put changes nothing. */
    ASSERT_OK(su_check(s, &k1, 1, 40)); /* Stored data still served. */
    ASSERT_OK(lkv_store_demote(s, &k1));
    ASSERT_OK(su_check(s, &k1, 1, 40)); /* ... also from the cold tier (a promotion). */
    unfill(mnt);
    ASSERT_OK(su_put(s, 3, 40, &k3)); /* Works again at once. */
    ASSERT_OK(lkv_store_close(s));
    s = open_cfg(dir, WT, MIN_FREE, 0, NULL);
    ASSERT_OK(su_check(s, &k3, 3, 40));
    ASSERT_OK(lkv_store_close(s));
}

static void test_disk_full_write_back(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/wb", mnt);
    lkv_dockey k1, k2;
    lkv_store *s = open_cfg(dir, WB, MIN_FREE, 0, NULL);
    ASSERT_OK(su_put(s, 1, 40, &k1));
    ASSERT_OK(lkv_store_flush(s));
    fill_to(mnt, MIN_FREE - (1u << 20));
    ASSERT_OK(su_put(s, 2, 40, &k2)); /* Acknowledged hot. */
    ASSERT_ERR(lkv_store_flush(s), LKV_ENOSPC);
    usleep(500000);
    lkv_store_stats st = su_stats(s);
    ASSERT_TRUE(st.wb_retries >= 1);
    ASSERT_EQ(st.wb_pending, 1);
    ASSERT_EQ(st.wb_failed, 0);
    ASSERT_TRUE(st.wb_backlog_bytes > 0);
    ASSERT_OK(su_check(s, &k2, 2, 40));
    ASSERT_OK(su_check(s, &k1, 1, 40));
    unfill(mnt);
    wait_persisted(s, 2);
    ASSERT_OK(lkv_store_flush(s));
    ASSERT_EQ(su_stats(s).wb_backlog_bytes, 0);
    ASSERT_OK(lkv_store_close(s));
    s = open_cfg(dir, WB, MIN_FREE, 0, NULL);
    ASSERT_EQ(su_stats(s).cold_docs, 2);
    ASSERT_OK(lkv_store_close(s));
}

static atomic_int room_calls;
static void on_room(const void *blob)
{
    ASSERT_EQ(*(const int *)blob, 42);
    atomic_fetch_add(&room_calls, 1);
}

/* The write-back backlog bound: with the writer stuck on a full disk, a second put cannot
 * commit (lkv_store_put_wait says LKV_EAGAIN and registers a waiter); once space is freed the
 * writer drains the backlog and calls the waiter, and the put goes through. */
static void test_backlog_bound(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/backlog", mnt);
    lkv_store_config c;
    lkv_store *s = NULL;
    su_config(&c, dir, 64, 0, WB);
    c.cold_min_free_bytes = MIN_FREE;
    c.wb_max_backlog_bytes = 8 * TINY_BB; /* Less than two 40-token documents (10 KiB). */
    ASSERT_OK(lkv_store_open(&c, &s));
    fill_to(mnt, MIN_FREE - (1u << 20));
    lkv_dockey k1, k2;
    ASSERT_OK(su_put(s, 1, 40, &k1)); /* The backlog was empty: in, then stuck. */
    uint8_t salt[32];
    uint32_t t[40];
    lkv_kv_shape sh = tiny_profile("x").shape;
    uint8_t kv[10 * TINY_BB];
    lkv_tenant_salt_default(salt);
    su_doc_tokens(2, 40, t);
    su_fill_doc(&sh, 40, 2, kv);
    lkv_store_put *tx;
    ASSERT_OK(lkv_store_put_begin(s, salt, "tiny", t, 40, &tx, &k2, NULL));
    for (uint32_t i = 0; i < 10; i++) {
        ASSERT_OK(lkv_store_put_block(tx, i, kv + i * TINY_BB, TINY_BB));
    }
    int tag = 42;
    ASSERT_ERR(lkv_store_put_wait(tx, on_room, &tag, sizeof tag), LKV_EAGAIN);
    usleep(300000);
    ASSERT_EQ(atomic_load(&room_calls), 0); /* Still no room: the disk is full. */
    ASSERT_TRUE(su_stats(s).wb_backlog_bytes >= 10 * TINY_BB);
    unfill(mnt);
    for (int i = 0; i < 1000 && atomic_load(&room_calls) == 0; i++) {
        usleep(10000);
    }
    ASSERT_EQ(atomic_load(&room_calls), 1);
    ASSERT_OK(lkv_store_put_wait(tx, NULL, NULL, 0)); /* Reserved now. */
    ASSERT_OK(lkv_store_put_commit(tx));
    ASSERT_OK(lkv_store_flush(s));
    ASSERT_EQ(su_stats(s).wb_backlog_bytes, 0);
    ASSERT_OK(su_check(s, &k2, 2, 40));
    ASSERT_OK(lkv_store_close(s));
}

static void test_start_on_full_disk(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/start", mnt);
    lkv_dockey k1, k2;
    lkv_store *s = open_cfg(dir, WB, MIN_FREE, 0, NULL);
    ASSERT_OK(su_put(s, 1, 40, &k1));
    ASSERT_OK(lkv_store_close(s));
    fill_to(mnt, 0); /* Completely full: not even RocksDB's LOG can be written. */
    s = open_cfg(dir, WB, MIN_FREE, 0, NULL);
    lkv_store_stats st = su_stats(s);
    ASSERT_EQ(st.cold_readonly, 1);
    ASSERT_EQ(st.cold_docs, 1);
    ASSERT_OK(su_check(s, &k1, 1, 40)); /* Served from the read-only tier. */
    lkv_store_demote(s, &k1);
    ASSERT_ERR(lkv_store_delete(s, &k1), LKV_ENOSPC); /* Cannot be made durable: refused... */
    lkv_doc_info in;
    ASSERT_OK(lkv_store_lookup(s, &k1, 1, &in));
    ASSERT_EQ(in.present, 1);         /* ... and nothing changed. */
    ASSERT_OK(su_put(s, 2, 40, &k2)); /* Hot; waits for room. */
    ASSERT_ERR(lkv_store_flush(s), LKV_ENOSPC);
    unfill(mnt);
    wait_persisted(s, 1);
    st = su_stats(s);
    ASSERT_EQ(st.cold_readonly, 0);
    ASSERT_OK(lkv_store_close(s));
    s = open_cfg(dir, WB, MIN_FREE, 0, NULL);
    ASSERT_OK(su_check(s, &k2, 2, 40));
    ASSERT_EQ(su_stats(s).cold_docs, 2);
    ASSERT_OK(lkv_store_close(s));

    /* A full disk and no database yet: refused with ENOSPC (nothing to serve). */
    snprintf(dir, sizeof dir, "%s/empty", mnt);
    fill_to(mnt, 1u << 20);
    int rc;
    s = open_cfg(dir, WB, MIN_FREE, 0, &rc);
    ASSERT_EQ(rc, LKV_ENOSPC);
    unfill(mnt);
}

static void test_readonly_dir(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ro", mnt);
    lkv_dockey k1;
    lkv_store *s = open_cfg(dir, WT, MIN_FREE, 0, NULL);
    ASSERT_OK(su_put(s, 1, 40, &k1));
    ASSERT_OK(lkv_store_close(s));
    ASSERT_OK(mount(NULL, mnt, NULL, MS_REMOUNT | MS_RDONLY, NULL));
    int rc;
    s = open_cfg(dir, WT, MIN_FREE, 0, &rc);
    ASSERT_EQ(rc, LKV_EIO);
    ASSERT_TRUE(s == NULL);
    ASSERT_OK(mount(NULL, mnt, NULL, MS_REMOUNT, "size=64m"));
}

/* ---- damaged databases (plain temp dirs) ----------------------------------------------- */

/* The first file in dir whose name ends with suffix (or starts with it, prefix = 1). */
static int find_file(const char *dir, const char *pat, int prefix, char *out, size_t len)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    while (d != NULL && (e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name), pl = strlen(pat);
        int m = prefix ? strncmp(e->d_name, pat, pl) == 0
                       : l > pl && strcmp(e->d_name + l - pl, pat) == 0;
        if (m) {
            snprintf(out, len, "%s/%s", dir, e->d_name);
            found = 1;
            break;
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    return found;
}

static int has_aside(const char *dir)
{
    char p[1024];
    return find_file(dir, "corrupt-", 1, p, sizeof p);
}

/* Flips n bytes of path from offset off (negative: from the end). */
static void flip(const char *path, long off, int n)
{
    int fd = open(path, O_RDWR);
    ASSERT_TRUE(fd >= 0);
    struct stat st;
    ASSERT_OK(fstat(fd, &st));
    if (off < 0) {
        off += st.st_size;
    }
    for (int i = 0; i < n; i++) {
        uint8_t b;
        ASSERT_EQ(pread(fd, &b, 1, off + i), 1);
        b ^= 0x5a;
        ASSERT_EQ(pwrite(fd, &b, 1, off + i), 1);
    }
    close(fd);
}

/* A database of docs seeds 1..n (40 tokens), closed cleanly. */
static char *make_db(int n, int durability)
{
    char *dir = su_tmpdir();
    lkv_store *s = open_cfg(dir, durability, 0, 0, NULL);
    for (int i = 1; i <= n; i++) {
        ASSERT_OK(su_put(s, (uint64_t)i, 40, NULL));
    }
    ASSERT_OK(lkv_store_close(s));
    return dir;
}

/* Expects a refusal with rc, then a reset to an empty store with the files aside. */
static void refused_then_reset(char *dir, int rc_want)
{
    int rc;
    lkv_store *s = open_cfg(dir, WT, 0, LKV_COLD_REFUSE, &rc);
    ASSERT_EQ(rc, rc_want);
    ASSERT_TRUE(s == NULL);
    ASSERT_TRUE(!has_aside(dir)); /* Refusing moves nothing. */
    s = open_cfg(dir, WT, 0, LKV_COLD_RESET, NULL);
    ASSERT_EQ(su_stats(s).cold_docs, 0);
    ASSERT_TRUE(has_aside(dir));
    lkv_dockey k;
    ASSERT_OK(su_put(s, 99, 40, &k)); /* And it works. */
    ASSERT_OK(lkv_store_close(s));
    s = open_cfg(dir, WT, 0, LKV_COLD_REFUSE, NULL);
    ASSERT_OK(su_check(s, &k, 99, 40));
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_missing_current(void)
{
    char *dir = make_db(3, WT), p[1024];
    snprintf(p, sizeof p, "%s/CURRENT", dir);
    ASSERT_OK(unlink(p));
    refused_then_reset(dir, LKV_ECORRUPT);
}

static void test_missing_manifest(void)
{
    char *dir = make_db(3, WT), p[1024];
    ASSERT_TRUE(find_file(dir, "MANIFEST-", 1, p, sizeof p));
    ASSERT_OK(unlink(p));
    refused_then_reset(dir, LKV_ECORRUPT);
}

static void test_corrupt_sst(void)
{
    char *dir = make_db(3, WT), p[1024];
    ASSERT_TRUE(find_file(dir, ".sst", 0, p, sizeof p));
    flip(p, 100, 64); /* Inside the first data block (document records and blob indexes). */
    refused_then_reset(dir, LKV_ECORRUPT);
}

/* A blob file's value damaged: RocksDB's blob checksum (or ours) finds it at read; the doc is a
 * miss of cause corrupt and counted, on the promotion path and the streaming path. */
static void test_corrupt_blob(void)
{
    char *dir = su_tmpdir(), p[1024];
    lkv_dockey k1;
    lkv_store *s = open_cfg(dir, WT, 0, 0, NULL);
    ASSERT_OK(su_put(s, 1, 40, &k1)); /* 3 blocks of 1 KiB: blob values (min_blob 512). */
    ASSERT_OK(lkv_store_close(s));
    ASSERT_TRUE(find_file(dir, ".blob", 0, p, sizeof p));
    flip(p, -1500, 8); /* In the last blob record's value. */
    s = open_cfg(dir, WT, 0, 0, NULL);
    lkv_doc_info in;
    ASSERT_OK(lkv_store_lookup(s, &k1, 1, &in));
    ASSERT_EQ(in.present, 1);
    ASSERT_ERR(su_check(s, &k1, 1, 40), LKV_ECORRUPT); /* Promotion met it. */
    ASSERT_OK(lkv_store_lookup(s, &k1, 1, &in));
    ASSERT_EQ(in.present, 0);
    ASSERT_EQ(in.miss_cause, LKV_MISS_CORRUPT);
    ASSERT_EQ(su_stats(s).corrupt_blocks, 1);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

/* A child writes documents through the WAL (write-back: sync=false) and dies without a flush. */
static char *make_wal_db(int n)
{
    char *dir = su_tmpdir();
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        lkv_store *s = open_cfg(dir, WB, 0, 0, NULL);
        for (int i = 1; i <= n; i++) {
            if (su_put(s, (uint64_t)i, 40, NULL) != 0) {
                _exit(2);
            }
        }
        _exit(lkv_store_flush(s) == 0 ? 0 : 3); /* Persisted (in the WAL), never closed. */
    }
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return dir;
}

static void test_corrupt_wal(void)
{
    char *dir = make_wal_db(8), p[1024];
    ASSERT_TRUE(find_file(dir, ".log", 0, p, sizeof p));
    struct stat st;
    ASSERT_OK(stat(p, &st));
    ASSERT_TRUE(st.st_size > 8 * 3 * 1024);
    flip(p, st.st_size / 2, 16); /* Mid-file: not a torn tail. */
    int rc;
    lkv_store *s = open_cfg(dir, WB, 0, LKV_COLD_REFUSE, &rc);
    ASSERT_EQ(rc, LKV_ECORRUPT);
    s = open_cfg(dir, WB, 0, LKV_COLD_RESET, NULL);
    uint64_t n = su_stats(s).cold_docs;
    ASSERT_TRUE(n >= 1 && n < 8); /* What precedes the damage is kept. */
    for (uint64_t i = 1; i <= n; i++) {
        lkv_dockey k;
        su_key(s, i, 40, &k);
        ASSERT_OK(su_check(s, &k, i, 40));
    }
    ASSERT_TRUE(!has_aside(dir));
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);

    /* A torn tail record (a crash mid-write) is not damage. */
    dir = make_wal_db(4);
    ASSERT_TRUE(find_file(dir, ".log", 0, p, sizeof p));
    ASSERT_OK(stat(p, &st));
    ASSERT_OK(truncate(p, st.st_size - 100));
    s = open_cfg(dir, WB, 0, LKV_COLD_REFUSE, NULL);
    ASSERT_EQ(su_stats(s).cold_docs, 3);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

/* Acknowledged write-back documents the writer never persisted, then a crash: misses of cause
 * lost (not never), while a persisted one is a hit. */
static void test_lost(void)
{
    char *dir = su_tmpdir();
    lkv_dockey k1, k2;
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        lkv_store *s = open_cfg(dir, WB, 0, 0, NULL);
        if (su_put(s, 1, 40, NULL) != 0 || lkv_store_flush(s) != 0) {
            _exit(2);
        }
        lkv_store_fault_cold_writes(s, 1000); /* The writer fails from here on. */
        if (su_put(s, 2, 40, NULL) != 0) {
            _exit(3);
        }
        lkv_store_flush(s);
        _exit(0);
    }
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    lkv_store *s = open_cfg(dir, WB, 0, 0, NULL);
    su_key(s, 1, 40, &k1);
    su_key(s, 2, 40, &k2);
    lkv_doc_info in[2];
    lkv_dockey ks[2] = {k1, k2};
    ASSERT_OK(lkv_store_lookup(s, ks, 2, in));
    ASSERT_EQ(in[0].present, 1);
    ASSERT_EQ(in[1].present, 0);
    ASSERT_EQ(in[1].miss_cause, LKV_MISS_LOST);
    ASSERT_EQ(su_stats(s).misses_by_cause[LKV_MISS_LOST], 1);
    ASSERT_OK(lkv_store_close(s));
    /* The marker is consumed: after another restart the key is simply unknown. */
    s = open_cfg(dir, WB, 0, 0, NULL);
    ASSERT_OK(lkv_store_lookup(s, &k2, 1, in));
    ASSERT_EQ(in[0].miss_cause, LKV_MISS_NEVER);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

int main(void)
{
    setenv("LKV_LOG_LEVEL", "warn", 0);
    LKV_RUN(test_missing_current);
    LKV_RUN(test_missing_manifest);
    LKV_RUN(test_corrupt_sst);
    LKV_RUN(test_corrupt_blob);
    LKV_RUN(test_corrupt_wal);
    LKV_RUN(test_lost);
    if (mount_tmpfs() != 0) {
        return 77;
    }
    LKV_RUN(test_disk_full_write_through);
    LKV_RUN(test_disk_full_write_back);
    LKV_RUN(test_backlog_bound);
    LKV_RUN(test_start_on_full_disk);
    LKV_RUN(test_readonly_dir);
    umount_tmpfs();
    return 0;
}
