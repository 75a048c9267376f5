/*
 * lkv_cold.c: the cold tier on RocksDB (key/value format, integrity, disk faults and damage
 * handling in lkv_cold.h).
 *
 * RocksDB options: create_if_missing, paranoid checks, blob files on (min_blob_size, 256 MiB
 * blob files, blob GC off but turned on while garbage is over half the blob bytes:
 * lkv_cold_gc_check), no compression (KV is incompressible noise to a general-purpose
 * compressor), memtables sized from the disk headroom. Writes go through rocksdb_write with a
 * WriteBatch after a free-space check; reads use rocksdb_get_pinned (no extra copy inside
 * RocksDB; an iterator when opened read-only) and verify the XXH3-128 tag before copying the
 * payload out. One rwlock: every use of the database takes its read side; the reopen after a
 * read-only start takes the write side (trylock: it never waits behind readers).
 */
#include "lkv_cold.h"

#define XXH_INLINE_ALL /* Debian's libxxhash-dev header, inlined (no library at run time). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <rocksdb/c.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "lkv_crc32c.h"
#include "lkv_log.h"

#define BLOCK_VERSION    2  /* Format of blocks written now (XXH3-128 tags). */
#define RECORD_VERSION   3  /* Records written now: XXH3-128 tags and the residency fields. */
#define RECORD_V2        2  /* XXH3-128 tags, no residency fields (fixed part 61): still read. */
#define RECORD_V1        1  /* The first format (BLAKE2b-128 tags): dropped at open. */
#define RECORD_FIXED     74 /* Version 3; version 2 (and 1): 61. */
#define RECORD_FIXED_V2  61
#define OLD_FORMAT       1 /* parse_record: a valid record of the first format. */
#define DEFAULT_MIN_BLOB (64u << 10)

struct lkv_cold {
    rocksdb_t *db;                  /* The database (swapped by a reopen under lk's write side). */
    rocksdb_options_t *opts;        /* Open options (kept until close). */
    rocksdb_writeoptions_t *wsync;  /* sync = true. */
    rocksdb_writeoptions_t *wasync; /* sync = false. */
    rocksdb_writeoptions_t *wnowal; /* No WAL (LKV_COLD_NO_WAL). */
    rocksdb_readoptions_t *ropts;   /* Default read options (verify_checksums on). */
    rocksdb_readoptions_t *bropts;  /* Block reads: verify_checksums off (our XXH3 tag). */
    int fault_writes;               /* Injected failures left (atomic). */
    int ledger_fd;                  /* The write ledger (pending markers), or -1. */
    char *dir;                      /* The database directory (owned). */
    lkv_cold_options o;             /* Options (copy). */
    pthread_rwlock_t lk;            /* Read side: every use of db; write side: a reopen. */
    int readonly;                   /* Opened read-only (disk full at open): atomic. */
    int n_snaps;                    /* Snapshots out (atomic): a reopen waits for none. */
    int64_t last_full_log_ms;       /* Rate limit of the "disk full" warning (atomic). */
    int gc_on;                      /* Blob garbage collection turned on (atomic). */
    int64_t gc_check_ms;            /* Last lkv_cold_gc_check from a write (atomic). */
};

struct lkv_cold_batch {
    rocksdb_writebatch_t *wb; /* Blocks added so far; the record is added at commit. */
};

struct lkv_cold_snap {
    const rocksdb_snapshot_t *snap; /* RocksDB snapshot. */
    rocksdb_readoptions_t *ropts;   /* Read options pointing at it (records: checksums on). */
    rocksdb_readoptions_t *bropts;  /* The same for blocks (RocksDB checksums off: ours). */
};

static void ledger_open(lkv_cold *c);

static void put_le32(uint8_t *o, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        o[i] = (uint8_t)(v >> (8 * i));
    }
}

static void put_le64(uint8_t *o, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        o[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_le64(const uint8_t *p)
{
    return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

void lkv_cold_block_key(const lkv_dockey *key, uint32_t index, uint8_t out[37])
{
    out[0] = 'B';
    memcpy(out + 1, key->b, LKV_DOCKEY_BYTES);
    out[33] = (uint8_t)(index >> 24);
    out[34] = (uint8_t)(index >> 16);
    out[35] = (uint8_t)(index >> 8);
    out[36] = (uint8_t)index;
}

static void doc_key(const lkv_dockey *key, uint8_t out[33])
{
    out[0] = 'D';
    memcpy(out + 1, key->b, LKV_DOCKEY_BYTES);
}

/* The tag of the current format: XXH3-128 of v seeded by XXH3-64 of the key (so a value
 * read under another key fails), little-endian low then high 64 bits. */
static void tag(const uint8_t *k, size_t klen, const void *v, size_t vlen, uint8_t out[16])
{
    XXH128_hash_t h = XXH3_128bits_withSeed(v, vlen, XXH3_64bits(k, klen));
    put_le64(out, h.low64);
    put_le64(out + 8, h.high64);
}

void lkv_cold_block_tag(const uint8_t key[LKV_COLD_BLOCK_KEY_BYTES], const void *data, size_t len,
                        uint8_t out[LKV_COLD_TAG_BYTES])
{
    tag(key, LKV_COLD_BLOCK_KEY_BYTES, data, len, out);
}

/* The previous format's tag (BLAKE2b-128 over key | value): only to recognise old records. */
static void tag_v1(const uint8_t *k, size_t klen, const void *v, size_t vlen, uint8_t out[16])
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, LKV_COLD_TAG_BYTES);
    crypto_generichash_update(&st, k, klen);
    crypto_generichash_update(&st, v, vlen);
    crypto_generichash_final(&st, out, LKV_COLD_TAG_BYTES);
}

/* The project code of a RocksDB status string: Corruption (a block, blob or table checksum, a
 * bad record) is LKV_ECORRUPT, "No space" LKV_ENOSPC, other I/O errors LKV_EIO. */
static int rcode(const char *err)
{
    if (strncmp(err, "Corruption", 10) == 0) {
        return LKV_ECORRUPT;
    }
    if (strstr(err, "No space") != NULL || strstr(err, "NoSpace") != NULL) {
        return LKV_ENOSPC;
    }
    if (strncmp(err, "IO error", 8) == 0) {
        return LKV_EIO;
    }
    return LKV_EROCKSDB;
}

static int rerr(const char *what, char *err)
{
    int rc = rcode(err);
    LKV_LOGE("rocksdb %s: %s", what, err);
    rocksdb_free(err);
    return rc;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int take_fault(lkv_cold *c)
{
    int n = __atomic_load_n(&c->fault_writes, __ATOMIC_ACQUIRE);
    while (n > 0) {
        if (__atomic_compare_exchange_n(&c->fault_writes, &n, n - 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            LKV_LOGW("cold: injected write failure");
            return 1;
        }
    }
    return 0;
}

void lkv_cold_fault_writes(lkv_cold *c, int n)
{
    __atomic_store_n(&c->fault_writes, n < 0 ? 0 : n, __ATOMIC_RELEASE);
}

/* ---- opening: free space, damage, read-only mode ------------------------------------------- */

/* Bytes free to us on the file system of c->dir (UINT64_MAX if it cannot be told). */
static uint64_t avail_bytes(const char *dir)
{
    struct statvfs v;
    if (statvfs(dir, &v) != 0) {
        return UINT64_MAX;
    }
    return (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
}

uint64_t lkv_cold_free_bytes(const lkv_cold *c)
{
    return avail_bytes(c->dir);
}

uint64_t lkv_cold_min_free(const lkv_cold *c)
{
    return c->o.min_free_bytes;
}

const char *lkv_cold_dir(const lkv_cold *c)
{
    return c->dir;
}

int lkv_cold_readonly(const lkv_cold *c)
{
    return __atomic_load_n(&c->readonly, __ATOMIC_ACQUIRE);
}

/* 0 if a write of about bytes leaves the headroom free, else LKV_ENOSPC (warned once every 10
 * seconds at most). A write costs its bytes twice before a flush settles it (WAL + blob). */
static int room_for(lkv_cold *c, uint64_t bytes)
{
    uint64_t a = avail_bytes(c->dir);
    if (a == UINT64_MAX || a >= c->o.min_free_bytes + 2 * bytes) {
        return 0;
    }
    int64_t now = mono_ms(), last = __atomic_load_n(&c->last_full_log_ms, __ATOMIC_RELAXED);
    if (now - last >= 10000 && __atomic_compare_exchange_n(&c->last_full_log_ms, &last, now, 0,
                                                           __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        LKV_LOGW("cold: the disk of %s is full: %" PRIu64 " bytes free, a write of %" PRIu64
                 " bytes needs %" PRIu64 " (cold_min_free_bytes headroom): refusing writes until "
                 "space is freed",
                 c->dir, a, bytes, c->o.min_free_bytes + 2 * bytes);
    }
    return LKV_ENOSPC;
}

static void set_options(lkv_cold *c, int wal_mode)
{
    if (c->opts != NULL) {
        rocksdb_options_destroy(c->opts);
    }
    c->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(c->opts, 1);
    rocksdb_options_set_paranoid_checks(c->opts, 1);
    rocksdb_options_set_enable_blob_files(c->opts, 1);
    rocksdb_options_set_min_blob_size(c->opts, c->o.min_blob_bytes);
    rocksdb_options_set_blob_file_size(c->opts, 256ull << 20);
    rocksdb_options_set_enable_blob_gc(c->opts, 0); /* On demand: lkv_cold_gc_check. */
    rocksdb_options_set_compression(c->opts, rocksdb_no_compression);
    rocksdb_options_set_blob_compression_type(c->opts, rocksdb_no_compression);
    /* A memtable (and its WAL, and the blob file its flush writes) must fit the headroom
     * three times over, so that a flush never meets a full disk. */
    uint64_t wb = c->o.min_free_bytes / 4;
    wb = wb < (1u << 20) ? (1u << 20) : wb > (64u << 20) ? (64u << 20) : wb;
    rocksdb_options_set_write_buffer_size(c->opts, (size_t)wb);
    rocksdb_options_set_max_total_wal_size(c->opts, 2 * wb);
    rocksdb_options_set_keep_log_file_num(c->opts, 4);
    rocksdb_options_set_max_log_file_size(c->opts, 4u << 20);
    rocksdb_options_set_wal_recovery_mode(c->opts, wal_mode);
}

/* Opens c->db (read-only or not) with WAL recovery mode wal_mode. NULL *err on success. */
static void open_db(lkv_cold *c, int readonly, int wal_mode, char **err)
{
    static int logged; /* The CRC32c line once per process (atomic). */
    if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED)) {
        LKV_LOGI("cold: RocksDB's CRC32c: %s", lkv_crc32c_describe());
    }
    set_options(c, wal_mode);
    *err = NULL;
    c->db = readonly ? rocksdb_open_for_read_only(c->opts, c->dir, 0, err)
                     : rocksdb_open(c->opts, c->dir, err);
    __atomic_store_n(&c->gc_on, 0, __ATOMIC_RELAXED); /* The options say off. */
    __atomic_store_n(&c->readonly, readonly && *err == NULL, __ATOMIC_RELEASE);
}

/* Documents ('D' records) visible in db (for counting what a WAL recovery dropped). */
static uint64_t count_docs(rocksdb_t *db)
{
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    const char lo[1] = {'D'}, hi[1] = {'E'};
    uint64_t n = 0;
    rocksdb_readoptions_set_iterate_upper_bound(ro, hi, 1);
    rocksdb_iterator_t *it = rocksdb_create_iterator(db, ro);
    for (rocksdb_iter_seek(it, lo, 1); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        n++;
    }
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return n;
}

/* Documents a read-only open of dir sees under WAL recovery mode mode (UINT64_MAX: it fails). */
static uint64_t docs_under_mode(lkv_cold *c, int mode)
{
    char *err = NULL;
    set_options(c, mode);
    rocksdb_t *db = rocksdb_open_for_read_only(c->opts, c->dir, 0, &err);
    if (err != NULL) {
        rocksdb_free(err);
        return UINT64_MAX;
    }
    uint64_t n = count_docs(db);
    rocksdb_close(db);
    return n;
}

/* What the files of dir say before RocksDB reads them. */
typedef struct dir_facts {
    int current;  /* CURRENT exists. */
    int manifest; /* A MANIFEST-* exists. */
    int tables;   /* A *.sst or *.blob exists. */
    char wal[64]; /* The newest *.log (WAL) name, "" if none. */
} dir_facts;

static void read_dir(const char *dir, dir_facts *f)
{
    memset(f, 0, sizeof *f);
    DIR *d = opendir(dir);
    if (d == NULL) {
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        size_t l = strlen(n);
        if (strcmp(n, "CURRENT") == 0) {
            f->current = 1;
        } else if (strncmp(n, "MANIFEST-", 9) == 0) {
            f->manifest = 1;
        } else if ((l > 4 && strcmp(n + l - 4, ".sst") == 0) ||
                   (l > 5 && strcmp(n + l - 5, ".blob") == 0)) {
            f->tables = 1;
        } else if (l > 4 && strcmp(n + l - 4, ".log") == 0 && l < sizeof f->wal &&
                   strcmp(n, f->wal) > 0) {
            memcpy(f->wal, n, l + 1); /* l < sizeof f->wal */
        }
    }
    closedir(d);
}

/* Moves every entry of dir (except earlier corrupt-* folders) into dir/corrupt-<time>/, so a
 * data_dir that is a mount point can be reset too. Writes the folder into aside. */
static int move_aside(const char *dir, char *aside, size_t len)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
    snprintf(aside, len, "%s/corrupt-%s", dir, stamp);
    if (mkdir(aside, 0700) != 0 && errno != EEXIST) {
        LKV_LOGE("cold: mkdir %s: %s", aside, strerror(errno));
        return LKV_EIO;
    }
    DIR *d = opendir(dir);
    if (d == NULL) {
        return LKV_EIO;
    }
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0 || strncmp(n, "corrupt-", 8) == 0) {
            continue;
        }
        char from[4096], to[4096];
        if (snprintf(from, sizeof from, "%s/%s", dir, n) >= (int)sizeof from ||
            snprintf(to, sizeof to, "%s/%s", aside, n) >= (int)sizeof to) {
            rc = LKV_EIO;
            continue;
        }
        if (rename(from, to) != 0) {
            LKV_LOGE("cold: moving %s aside: %s", from, strerror(errno));
            rc = LKV_EIO;
        }
    }
    closedir(d);
    return rc;
}

/* Damage found at open (what: the file and the problem). Refuses (LKV_ECORRUPT) or, with
 * on_corruption = reset, moves the database aside and opens an empty one. */
static int damaged(lkv_cold *c, const char *what)
{
    if (c->o.on_corruption != LKV_COLD_RESET) {
        LKV_LOGE("cold: the database in %s is damaged: %s. lazykvd will not start on it. Fix: "
                 "restore %s from a backup, or remove it (the cache is recomputable), or set "
                 "cold_on_corruption = reset to move a damaged database aside and start empty",
                 c->dir, what, c->dir);
        return LKV_ECORRUPT;
    }
    char aside[4096], *err = NULL;
    int rc = move_aside(c->dir, aside, sizeof aside);
    if (rc != 0) {
        return rc;
    }
    LKV_LOGE("cold: DATABASE RESET: %s was damaged (%s); moved it aside to %s and starting with "
             "an empty cold tier",
             c->dir, what, aside);
    open_db(c, 0, 0, &err);
    return err != NULL ? rerr("open after reset", err) : 0;
}

int lkv_cold_reset(lkv_cold *c, const char *why)
{
    if (c->o.on_corruption != LKV_COLD_RESET) {
        return damaged(c, why); /* Logs the refusal; the handle stays as it was. */
    }
    pthread_rwlock_wrlock(&c->lk);
    rocksdb_close(c->db);
    c->db = NULL;
    int rc = damaged(c, why);
    if (c->ledger_fd >= 0) {
        close(c->ledger_fd); /* Moved aside with the rest. */
        ledger_open(c);
    }
    pthread_rwlock_unlock(&c->lk);
    return rc;
}

/* Opens with the damage checks of lkv_cold.h; c->dir and c->o are set. */
static int open_checked(lkv_cold *c)
{
    char probe[4096], *err = NULL, what[1024];
    dir_facts f;

    snprintf(probe, sizeof probe, "%s/.lkv-write-probe", c->dir);
    int fd = open(probe, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    if (fd < 0 && errno != ENOSPC && errno != EDQUOT) {
        LKV_LOGE("cold: data_dir %s is not writable (%s): lazykvd keeps its cold tier there and "
                 "will not start. Fix: make it writable by this user (and the mount read-write), "
                 "or set data_dir to a writable directory",
                 c->dir, strerror(errno));
        return LKV_EIO;
    }
    if (fd >= 0) {
        close(fd);
        unlink(probe);
    }
    read_dir(c->dir, &f);
    if (!f.current && (f.manifest || f.tables)) {
        snprintf(what, sizeof what, "%s/CURRENT is missing (but %s exist)", c->dir,
                 f.manifest ? "MANIFEST files" : "table or blob files");
        return damaged(c, what);
    }
    uint64_t a = avail_bytes(c->dir);
    if (a != UINT64_MAX && a < c->o.min_free_bytes) {
        if (!f.current) {
            LKV_LOGE("cold: the disk of %s is full (%" PRIu64 " bytes free, cold_min_free_bytes "
                     "%" PRIu64 ") and it holds no database yet: free space there or lower "
                     "cold_min_free_bytes",
                     c->dir, a, c->o.min_free_bytes);
            return LKV_ENOSPC;
        }
        open_db(c, 1, 0, &err);
        if (err == NULL) {
            LKV_LOGW("cold: the disk of %s is full (%" PRIu64 " bytes free, cold_min_free_bytes "
                     "%" PRIu64 "): opened the cold tier read-only; stored documents are served, "
                     "new ones stay hot until space is freed (then it reopens read-write)",
                     c->dir, a, c->o.min_free_bytes);
            return 0;
        }
        /* Fall through to the checks of a read-write open's error. */
    } else {
        open_db(c, 0, 0, &err); /* Mode 0: a torn tail record (a crash) is not damage. */
    }
    if (err == NULL) {
        return 0;
    }
    int code = rcode(err);
    /* RocksDB's WAL errors seldom name the file ("bad record length"): the damage is in the
     * WAL if a point-in-time recovery (which stops at the first bad record) opens. */
    int wal = code == LKV_ECORRUPT &&
              (strstr(err, ".log") != NULL || docs_under_mode(c, 2) != UINT64_MAX);
    int missing = strstr(err, "No such file") != NULL;
    snprintf(what, sizeof what, "%s", err);
    rocksdb_free(err);
    err = NULL;
    if (!wal && !missing && code != LKV_ECORRUPT) {
        LKV_LOGE("cold: cannot open the database in %s: %s", c->dir, what);
        return code == LKV_ECORRUPT ? LKV_EROCKSDB : code;
    }
    if (wal && c->o.on_corruption == LKV_COLD_RESET) {
        /* A damaged WAL: keep what precedes the damage (point-in-time recovery), and say how
         * many documents the records after it held. */
        uint64_t all = docs_under_mode(c, 3); /* kSkipAnyCorruptedRecords */
        uint64_t kept = docs_under_mode(c, 2);
        open_db(c, 0, 2, &err); /* kPointInTimeRecovery */
        if (err == NULL) {
            uint64_t lost = all != UINT64_MAX && kept != UINT64_MAX && all > kept ? all - kept : 0;
            LKV_LOGE("cold: WAL RECOVERY DROPPED RECORDS in %s (%s): recovered to the last good "
                     "record; %" PRIu64 " intact documents after the damage were dropped (plus "
                     "the damaged record)",
                     c->dir, what, lost);
            return 0;
        }
        rocksdb_free(err);
        err = NULL;
    }
    if (wal) {
        char w[1100];
        if (snprintf(w, sizeof w,
                     "a WAL file is corrupt (%s; the newest WAL is %s/%s; with cold_on_corruption "
                     "= reset the documents before the damage are kept)",
                     what, c->dir, f.wal[0] ? f.wal : "?") < 0) {
            w[0] = '\0';
        }
        return damaged(c, w);
    }
    return damaged(c, what);
}

int lkv_cold_open_ex(const char *dir, const lkv_cold_options *o, lkv_cold **out)
{
    lkv_cold *c;

    *out = NULL;
    if (sodium_init() < 0) {
        return LKV_EINTERNAL;
    }
    c = lkv_xcalloc(1, sizeof *c);
    c->ledger_fd = -1;
    c->dir = lkv_xmalloc(strlen(dir) + 1);
    strcpy(c->dir, dir);
    if (o != NULL) {
        c->o = *o;
    }
    if (c->o.min_blob_bytes == 0) {
        c->o.min_blob_bytes = DEFAULT_MIN_BLOB;
    }
    if (c->o.min_free_bytes == 0) {
        c->o.min_free_bytes = LKV_COLD_DEFAULT_MIN_FREE;
    }
    if (c->o.gc_min_bytes == 0) {
        c->o.gc_min_bytes = 256ull << 20;
    }
    pthread_rwlock_init(&c->lk, NULL);
    int rc = open_checked(c);
    if (rc != 0) {
        pthread_rwlock_destroy(&c->lk);
        if (c->opts != NULL) {
            rocksdb_options_destroy(c->opts);
        }
        free(c->dir);
        free(c);
        return rc;
    }
    c->wsync = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(c->wsync, 1);
    c->wasync = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(c->wasync, 0);
    c->wnowal = rocksdb_writeoptions_create();
    rocksdb_writeoptions_disable_WAL(c->wnowal, 1);
    c->ropts = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(c->ropts, 1);
    c->bropts = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(c->bropts, 0);
    ledger_open(c);
    *out = c;
    return 0;
}

int lkv_cold_open(const char *dir, uint64_t min_blob_bytes, lkv_cold **out)
{
    lkv_cold_options o;
    memset(&o, 0, sizeof o);
    o.min_blob_bytes = min_blob_bytes;
    return lkv_cold_open_ex(dir, &o, out);
}

int lkv_cold_try_reopen(lkv_cold *c)
{
    if (!lkv_cold_readonly(c)) {
        return 0;
    }
    uint64_t a = avail_bytes(c->dir);
    if (a != UINT64_MAX && a < c->o.min_free_bytes) {
        return LKV_ENOSPC;
    }
    if (pthread_rwlock_trywrlock(&c->lk) != 0) {
        return LKV_EAGAIN;
    }
    int rc = 0;
    if (!c->readonly) {
        goto out;
    }
    if (__atomic_load_n(&c->n_snaps, __ATOMIC_ACQUIRE) > 0) {
        rc = LKV_EAGAIN;
        goto out;
    }
    char *err = NULL;
    rocksdb_close(c->db);
    open_db(c, 0, 0, &err);
    if (err != NULL) {
        rc = rerr("reopen read-write", err);
        err = NULL;
        open_db(c, 1, 0, &err);
        if (err != NULL) {
            lkv_panic("cold: %s: cannot reopen the database even read-only: %s", c->dir, err);
        }
        goto out;
    }
    LKV_LOGI("cold: space is back on the disk of %s (%" PRIu64 " bytes free): the cold tier is "
             "read-write again",
             c->dir, a);
out:
    pthread_rwlock_unlock(&c->lk);
    return rc;
}

/* Before a write of about bytes: 0 if it may go ahead (reopening read-write first if the disk
 * has room again), else LKV_ENOSPC. */
static int write_gate(lkv_cold *c, uint64_t bytes)
{
    if (lkv_cold_readonly(c)) {
        int rc = lkv_cold_try_reopen(c);
        if (rc != 0 || lkv_cold_readonly(c)) {
            return LKV_ENOSPC;
        }
    }
    return room_for(c, bytes);
}

int lkv_cold_can_write(lkv_cold *c, uint64_t bytes)
{
    return write_gate(c, bytes);
}

int lkv_cold_flush(lkv_cold *c)
{
    if (lkv_cold_readonly(c) || avail_bytes(c->dir) < c->o.min_free_bytes / 2) {
        return LKV_ENOSPC;
    }
    if (take_fault(c)) {
        return LKV_EIO;
    }
    char *err = NULL;
    rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
    rocksdb_flushoptions_set_wait(fo, 1);
    pthread_rwlock_rdlock(&c->lk);
    rocksdb_flush(c->db, fo, &err);
    pthread_rwlock_unlock(&c->lk);
    rocksdb_flushoptions_destroy(fo);
    return err != NULL ? rerr("flush", err) : 0;
}

void lkv_cold_close(lkv_cold *c)
{
    char *err = NULL;
    if (c == NULL) {
        return;
    }
    if (c->db != NULL && !c->readonly && avail_bytes(c->dir) >= c->o.min_free_bytes / 2) {
        /* No flush on a full disk: the WAL replays at the next open instead. */
        rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
        rocksdb_flushoptions_set_wait(fo, 1);
        rocksdb_flush(c->db, fo, &err);
        if (err != NULL) {
            rerr("flush at close", err);
        }
        rocksdb_flushoptions_destroy(fo);
    }
    if (c->db != NULL) {
        rocksdb_close(c->db);
    }
    rocksdb_writeoptions_destroy(c->wsync);
    rocksdb_writeoptions_destroy(c->wasync);
    rocksdb_writeoptions_destroy(c->wnowal);
    rocksdb_readoptions_destroy(c->ropts);
    rocksdb_readoptions_destroy(c->bropts);
    rocksdb_options_destroy(c->opts);
    if (c->ledger_fd >= 0) {
        close(c->ledger_fd);
    }
    pthread_rwlock_destroy(&c->lk);
    free(c->dir);
    free(c);
}

static uint64_t prop_u64(rocksdb_t *db, const char *name)
{
    uint64_t v = 0;
    return rocksdb_property_int(db, name, &v) == 0 ? v : 0;
}

void lkv_cold_blob_bytes(lkv_cold *c, uint64_t *total, uint64_t *garbage)
{
    pthread_rwlock_rdlock(&c->lk);
    *total = prop_u64(c->db, "rocksdb.live-blob-file-size");
    *garbage = prop_u64(c->db, "rocksdb.live-blob-file-garbage-size");
    pthread_rwlock_unlock(&c->lk);
}

int lkv_cold_gc_check(lkv_cold *c)
{
    int on = __atomic_load_n(&c->gc_on, __ATOMIC_RELAXED);
    if (lkv_cold_readonly(c)) {
        return 0;
    }
    uint64_t total, garbage;
    lkv_cold_blob_bytes(c, &total, &garbage);
    int want =
        on ? garbage * 4 >= total && total > 0 : total >= c->o.gc_min_bytes && garbage * 2 >= total;
    if (want == on) {
        return on;
    }
    /* While on, every blob file is eligible (age cutoff 1.0): one pass rewrites the live blobs
     * once and drops all the garbage, which is then at least as large. */
    static const char *keys[] = {"enable_blob_garbage_collection",
                                 "blob_garbage_collection_age_cutoff",
                                 "blob_garbage_collection_force_threshold"};
    const char *vals[] = {want ? "true" : "false", want ? "1.0" : "0.25", "0.5"};
    char *err = NULL;
    pthread_rwlock_rdlock(&c->lk);
    rocksdb_set_options(c->db, 3, keys, vals, &err);
    pthread_rwlock_unlock(&c->lk);
    if (err != NULL) {
        LKV_LOGW("cold: cannot turn blob garbage collection %s: %s", want ? "on" : "off", err);
        rocksdb_free(err);
        return on;
    }
    __atomic_store_n(&c->gc_on, want, __ATOMIC_RELAXED);
    LKV_LOGI("cold: blob garbage collection %s: %" PRIu64 " of %" PRIu64
             " blob-file bytes are garbage (%.0f%%)",
             want ? "ON" : "off", garbage, total,
             total ? 100.0 * (double)garbage / (double)total : 0.0);
    return want;
}

/* lkv_cold_gc_check at most once a second (from the write paths). */
static void gc_tick(lkv_cold *c)
{
    int64_t now = mono_ms(), last = __atomic_load_n(&c->gc_check_ms, __ATOMIC_RELAXED);
    if (now - last >= 1000 && __atomic_compare_exchange_n(&c->gc_check_ms, &last, now, 0,
                                                          __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        (void)lkv_cold_gc_check(c);
    }
}

int lkv_cold_compact(lkv_cold *c)
{
    rocksdb_compactoptions_t *co = rocksdb_compactoptions_create();
    rocksdb_compactoptions_set_bottommost_level_compaction(co, 2); /* kForce */
    pthread_rwlock_rdlock(&c->lk);
    rocksdb_compact_range_opt(c->db, co, NULL, 0, NULL, 0);
    pthread_rwlock_unlock(&c->lk);
    rocksdb_compactoptions_destroy(co);
    return 0;
}

/* Each thread keeps one spare WriteBatch, cleared, with its buffer (a std::string: clear keeps
 * the capacity), for its next batch: a document's batch of 16-32 MiB otherwise grew by doubling
 * (copying its contents each time) into freshly mapped memory (page faults), and was unmapped
 * at free, for every document the writer persisted. Buffers over BATCH_KEEP_MAX are not kept. */
#define BATCH_KEEP_MAX (80u << 20)

static pthread_once_t batch_once = PTHREAD_ONCE_INIT;
static pthread_key_t batch_key; /* This thread's spare batch (destroyed at thread exit). */

static void batch_spare_destroy(void *wb)
{
    rocksdb_writebatch_destroy(wb);
}

static void batch_key_init(void)
{
    if (pthread_key_create(&batch_key, batch_spare_destroy) != 0) {
        lkv_panic("pthread_key_create failed");
    }
}

lkv_cold_batch *lkv_cold_batch_create(void)
{
    lkv_cold_batch *b = lkv_xmalloc(sizeof *b);
    pthread_once(&batch_once, batch_key_init);
    b->wb = pthread_getspecific(batch_key);
    if (b->wb != NULL) {
        pthread_setspecific(batch_key, NULL);
    } else {
        b->wb = rocksdb_writebatch_create();
    }
    return b;
}

void lkv_cold_batch_free(lkv_cold_batch *b)
{
    if (b == NULL) {
        return;
    }
    size_t n = 0;
    rocksdb_writebatch_data(b->wb, &n);
    if (n <= BATCH_KEEP_MAX && pthread_getspecific(batch_key) == NULL) {
        rocksdb_writebatch_clear(b->wb);
        pthread_setspecific(batch_key, b->wb);
    } else {
        rocksdb_writebatch_destroy(b->wb);
    }
    free(b);
}

void lkv_cold_batch_block(lkv_cold_batch *b, const lkv_dockey *key, uint32_t index,
                          const void *data, size_t len)
{
    uint8_t k[LKV_COLD_BLOCK_KEY_BYTES];
    uint8_t h[LKV_COLD_BLOCK_HDR_BYTES];
    const char *parts[2];
    size_t sizes[2];

    lkv_cold_block_key(key, index, k);
    memset(h, 0, sizeof h);
    h[0] = BLOCK_VERSION;
    tag(k, sizeof k, data, len, h + LKV_COLD_BLOCK_HDR_BYTES - LKV_COLD_TAG_BYTES);
    parts[0] = (const char *)h;
    sizes[0] = sizeof h;
    parts[1] = data;
    sizes[1] = len;
    const char *kp = (const char *)k;
    size_t ks = sizeof k;
    rocksdb_writebatch_putv(b->wb, 1, &kp, &ks, 2, parts, sizes);
}

void lkv_cold_batch_finish(lkv_cold_batch *b, const lkv_cold_doc *meta, const uint32_t *tokens)
{
    uint8_t k[LKV_COLD_DOC_KEY_BYTES];
    size_t rlen = RECORD_FIXED + 4ull * meta->n_tokens;
    uint8_t *rec = lkv_xmalloc(rlen + LKV_COLD_TAG_BYTES);

    doc_key(&meta->key, k);
    rec[0] = RECORD_VERSION;
    memcpy(rec + 1, meta->fingerprint, 32);
    put_le64(rec + 33, meta->content_hash);
    put_le32(rec + 41, meta->n_tokens);
    put_le32(rec + 45, meta->n_blocks);
    put_le32(rec + 49, meta->block_bytes);
    put_le64(rec + 53, (uint64_t)meta->created_ms);
    put_le32(rec + 61, meta->tenant);
    rec[65] = (uint8_t)(int8_t)meta->prio;
    put_le64(rec + 66, (uint64_t)meta->expires_ms);
    for (uint32_t i = 0; i < meta->n_tokens; i++) {
        put_le32(rec + RECORD_FIXED + 4ull * i, tokens[i]);
    }
    tag(k, sizeof k, rec, rlen, rec + rlen);
    rocksdb_writebatch_put(b->wb, (const char *)k, sizeof k, (const char *)rec,
                           rlen + LKV_COLD_TAG_BYTES);
    free(rec);
}

int lkv_cold_batch_commit(lkv_cold *c, lkv_cold_batch *b, const lkv_cold_doc *meta,
                          const uint32_t *tokens, int sync)
{
    lkv_cold_batch_finish(b, meta, tokens);
    return lkv_cold_batch_write(c, b, sync);
}

int lkv_cold_batch_write(lkv_cold *c, lkv_cold_batch *b, int sync)
{
    char *err = NULL;
    int rc = 0;
    if (take_fault(c)) {
        rc = LKV_EIO;
        goto out;
    }
    size_t bytes = 0;
    rocksdb_writebatch_data(b->wb, &bytes);
    rc = write_gate(c, bytes);
    if (rc != 0) {
        goto out;
    }
    pthread_rwlock_rdlock(&c->lk);
    rocksdb_write(c->db,
                  sync == LKV_COLD_NO_WAL ? c->wnowal
                  : sync                  ? c->wsync
                                          : c->wasync,
                  b->wb, &err);
    pthread_rwlock_unlock(&c->lk);
    if (err != NULL) {
        rc = rerr("write", err);
    } else {
        gc_tick(c);
    }
out:
    lkv_cold_batch_free(b);
    return rc;
}

int lkv_cold_delete(lkv_cold *c, const lkv_dockey *key, int sync)
{
    uint8_t dk[LKV_COLD_DOC_KEY_BYTES];
    uint8_t lo[LKV_COLD_BLOCK_KEY_BYTES], hi[LKV_COLD_BLOCK_KEY_BYTES + 1];
    char *err = NULL;
    int rc = 0;

    doc_key(key, dk);
    lkv_cold_block_key(key, 0, lo);
    /* Upper bound: 'B' | key | 0xffffffff | 0x00 sorts after every block of key. */
    lkv_cold_block_key(key, UINT32_MAX, hi);
    hi[LKV_COLD_BLOCK_KEY_BYTES] = 0;
    if (take_fault(c)) {
        return LKV_EIO;
    }
    /* A delete is a few bytes: it may use the headroom down to a quarter of it. */
    uint64_t a = avail_bytes(c->dir);
    if (lkv_cold_readonly(c) || (a != UINT64_MAX && a < c->o.min_free_bytes / 4)) {
        return LKV_ENOSPC;
    }
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    rocksdb_writebatch_delete(wb, (const char *)dk, sizeof dk);
    rocksdb_writebatch_delete_range(wb, (const char *)lo, sizeof lo, (const char *)hi, sizeof hi);
    pthread_rwlock_rdlock(&c->lk);
    rocksdb_write(c->db, sync ? c->wsync : c->wasync, wb, &err);
    pthread_rwlock_unlock(&c->lk);
    if (err != NULL) {
        rc = rerr("delete", err);
    } else {
        gc_tick(c);
    }
    rocksdb_writebatch_destroy(wb);
    return rc;
}

/* A value read: pinned by a PinnableSlice, or (read-only database) by an iterator. */
typedef struct fetched {
    rocksdb_pinnableslice_t *ps; /* Or NULL. */
    rocksdb_iterator_t *it;      /* Or NULL. */
    const uint8_t *v;            /* The value (valid until fetched_free). */
    size_t vlen;                 /* Its bytes. */
} fetched;

/* Reads the value of k (lk held): 0, LKV_ENOTFOUND, or a RocksDB error. A read-only open's Get
 * misses blob values in RocksDB 7.8 (its iterator sees them), so that case seeks instead. */
static int fetch(lkv_cold *c, rocksdb_readoptions_t *ro, const uint8_t *k, size_t klen, fetched *f,
                 const char *what)
{
    char *err = NULL;
    memset(f, 0, sizeof *f);
    if (c->readonly) {
        f->it = rocksdb_create_iterator(c->db, ro);
        rocksdb_iter_seek(f->it, (const char *)k, klen);
        size_t kl = 0;
        if (rocksdb_iter_valid(f->it)) {
            const char *ik = rocksdb_iter_key(f->it, &kl);
            if (kl == klen && memcmp(ik, k, klen) == 0) {
                f->v = (const uint8_t *)rocksdb_iter_value(f->it, &f->vlen);
                return 0;
            }
        }
        rocksdb_iter_get_error(f->it, &err);
        rocksdb_iter_destroy(f->it);
        f->it = NULL;
        return err != NULL ? rerr(what, err) : LKV_ENOTFOUND;
    }
    f->ps = rocksdb_get_pinned(c->db, ro, (const char *)k, klen, &err);
    if (err != NULL) {
        return rerr(what, err);
    }
    if (f->ps == NULL) {
        return LKV_ENOTFOUND;
    }
    f->v = (const uint8_t *)rocksdb_pinnableslice_value(f->ps, &f->vlen);
    return 0;
}

static void fetched_free(fetched *f)
{
    if (f->ps != NULL) {
        rocksdb_pinnableslice_destroy(f->ps);
    }
    if (f->it != NULL) {
        rocksdb_iter_destroy(f->it);
    }
}

/* Parses and verifies a record value. tokens may be NULL. */
static int parse_record(const uint8_t *k, const uint8_t *v, size_t vlen, lkv_cold_doc *meta,
                        uint32_t **tokens)
{
    uint8_t t[LKV_COLD_TAG_BYTES];
    if (vlen < RECORD_FIXED_V2 + LKV_COLD_TAG_BYTES) {
        return LKV_ECORRUPT;
    }
    size_t rlen = vlen - LKV_COLD_TAG_BYTES;
    if (v[0] == RECORD_V1) {
        tag_v1(k, LKV_COLD_DOC_KEY_BYTES, v, rlen, t);
        return memcmp(t, v + rlen, sizeof t) == 0 ? OLD_FORMAT : LKV_ECORRUPT;
    }
    tag(k, LKV_COLD_DOC_KEY_BYTES, v, rlen, t);
    if (memcmp(t, v + rlen, sizeof t) != 0 || (v[0] != RECORD_V2 && v[0] != RECORD_VERSION)) {
        return LKV_ECORRUPT;
    }
    size_t fixed = v[0] == RECORD_V2 ? RECORD_FIXED_V2 : RECORD_FIXED;
    if (rlen < fixed) {
        return LKV_ECORRUPT;
    }
    memset(meta, 0, sizeof *meta);
    memcpy(meta->key.b, k + 1, LKV_DOCKEY_BYTES);
    memcpy(meta->fingerprint, v + 1, 32);
    meta->content_hash = get_le64(v + 33);
    meta->n_tokens = get_le32(v + 41);
    meta->n_blocks = get_le32(v + 45);
    meta->block_bytes = get_le32(v + 49);
    meta->created_ms = (int64_t)get_le64(v + 53);
    if (v[0] == RECORD_VERSION) {
        meta->tenant = get_le32(v + 61);
        meta->prio = (int8_t)v[65];
        meta->expires_ms = (int64_t)get_le64(v + 66);
        if (meta->prio < -1 || meta->prio > 1) {
            return LKV_ECORRUPT;
        }
    }
    if (rlen != fixed + 4ull * meta->n_tokens || meta->n_blocks == 0 || meta->n_tokens == 0) {
        return LKV_ECORRUPT;
    }
    if (tokens != NULL) {
        uint32_t *tk = lkv_xmalloc(4ull * meta->n_tokens);
        for (uint32_t i = 0; i < meta->n_tokens; i++) {
            tk[i] = get_le32(v + fixed + 4ull * i);
        }
        *tokens = tk;
    }
    return 0;
}

int lkv_cold_get_doc(lkv_cold *c, lkv_cold_snap *snap, const lkv_dockey *key, lkv_cold_doc *meta,
                     uint32_t **tokens)
{
    uint8_t k[LKV_COLD_DOC_KEY_BYTES];
    char *err = NULL;
    size_t vlen = 0;
    int rc;

    fetched f;
    (void)err;
    (void)vlen;
    doc_key(key, k);
    pthread_rwlock_rdlock(&c->lk);
    rc = fetch(c, snap ? snap->ropts : c->ropts, k, sizeof k, &f, "get record");
    if (rc == 0) {
        rc = parse_record(k, f.v, f.vlen, meta, tokens);
        rc = rc == OLD_FORMAT ? LKV_ENOTFOUND : rc; /* Dropped by the scan at open. */
        fetched_free(&f);
    }
    pthread_rwlock_unlock(&c->lk);
    return rc;
}

int lkv_cold_get_block(lkv_cold *c, lkv_cold_snap *snap, const lkv_dockey *key, uint32_t index,
                       void *buf, size_t len)
{
    uint8_t k[LKV_COLD_BLOCK_KEY_BYTES];
    uint8_t t[LKV_COLD_TAG_BYTES];
    char *err = NULL;
    size_t vlen = 0;
    int rc = 0;

    fetched f;
    (void)err;
    lkv_cold_block_key(key, index, k);
    pthread_rwlock_rdlock(&c->lk);
    rc = fetch(c, snap ? snap->bropts : c->bropts, k, sizeof k, &f, "get block");
    if (rc != 0) {
        pthread_rwlock_unlock(&c->lk);
        return rc;
    }
    const uint8_t *v = f.v;
    vlen = f.vlen;
    if (vlen != len + LKV_COLD_BLOCK_HDR_BYTES || v[0] != BLOCK_VERSION) {
        rc = LKV_ECORRUPT;
        goto out;
    }
    /* Copy and check in one pass, 32 KiB at a time, so the tag reads what the copy just put
     * in the cache (the tag is the same as one-shot XXH3; a failure leaves buf undefined). */
    XXH3_state_t st;
    XXH3_128bits_reset_withSeed(&st, XXH3_64bits(k, sizeof k));
    const uint8_t *src = v + LKV_COLD_BLOCK_HDR_BYTES;
    for (size_t off = 0; off < len; off += 32768) {
        size_t n = len - off < 32768 ? len - off : 32768;
        memcpy((uint8_t *)buf + off, src + off, n);
        XXH3_128bits_update(&st, (const uint8_t *)buf + off, n);
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    put_le64(t, h.low64);
    put_le64(t + 8, h.high64);
    if (memcmp(t, v + LKV_COLD_BLOCK_HDR_BYTES - LKV_COLD_TAG_BYTES, sizeof t) != 0) {
        rc = LKV_ECORRUPT;
        goto out;
    }
out:
    fetched_free(&f);
    pthread_rwlock_unlock(&c->lk);
    return rc;
}

lkv_cold_snap *lkv_cold_snap_create(lkv_cold *c)
{
    lkv_cold_snap *s = lkv_xmalloc(sizeof *s);
    pthread_rwlock_rdlock(&c->lk);
    __atomic_add_fetch(&c->n_snaps, 1, __ATOMIC_ACQ_REL); /* No reopen while it is out. */
    /* A read-only database does not change (and its snapshots see nothing): no snapshot. */
    s->snap = c->readonly ? NULL : rocksdb_create_snapshot(c->db);
    pthread_rwlock_unlock(&c->lk);
    s->ropts = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(s->ropts, 1);
    s->bropts = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(s->bropts, 0);
    if (s->snap != NULL) {
        rocksdb_readoptions_set_snapshot(s->ropts, s->snap);
        rocksdb_readoptions_set_snapshot(s->bropts, s->snap);
    }
    return s;
}

void lkv_cold_snap_release(lkv_cold *c, lkv_cold_snap *s)
{
    if (s == NULL) {
        return;
    }
    rocksdb_readoptions_destroy(s->ropts);
    rocksdb_readoptions_destroy(s->bropts);
    pthread_rwlock_rdlock(&c->lk);
    if (s->snap != NULL) {
        rocksdb_release_snapshot(c->db, s->snap);
    }
    __atomic_sub_fetch(&c->n_snaps, 1, __ATOMIC_ACQ_REL);
    pthread_rwlock_unlock(&c->lk);
    free(s);
}

int lkv_cold_scan(lkv_cold *c, lkv_cold_scan_fn fn, void *ctx, uint64_t *n_corrupt)
{
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    const uint8_t lo[1] = {'D'}, hi[1] = {'E'};
    char *err = NULL;
    int rc = 0;
    uint64_t n_old = 0;

    if (n_corrupt != NULL) {
        *n_corrupt = 0;
    }
    rocksdb_readoptions_set_iterate_upper_bound(ro, (const char *)hi, 1);
    rocksdb_readoptions_set_verify_checksums(ro, 1);
    pthread_rwlock_rdlock(&c->lk);
    rocksdb_iterator_t *it = rocksdb_create_iterator(c->db, ro);
    for (rocksdb_iter_seek(it, (const char *)lo, 1); rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        lkv_cold_doc meta;
        int prc = klen == LKV_COLD_DOC_KEY_BYTES ? parse_record(k, v, vlen, &meta, NULL) : 0;
        if (prc == OLD_FORMAT) {
            /* Written by the previous format: dropped cleanly (a miss), never "corrupt". */
            lkv_dockey dk;
            memcpy(dk.b, k + 1, LKV_DOCKEY_BYTES);
            lkv_cold_delete(c, &dk, 0);
            n_old++;
            continue;
        }
        if (klen != LKV_COLD_DOC_KEY_BYTES || prc != 0) {
            LKV_LOGW("cold: dropping a corrupt document record (%zu-byte key)", klen);
            if (klen == LKV_COLD_DOC_KEY_BYTES) {
                lkv_dockey dk;
                memcpy(dk.b, k + 1, LKV_DOCKEY_BYTES);
                lkv_cold_delete(c, &dk, 0);
            } else {
                rocksdb_delete(c->db, c->wasync, (const char *)k, klen, &err); /* lk held. */
                if (err != NULL) {
                    rerr("delete bad record", err);
                    err = NULL;
                }
            }
            if (n_corrupt != NULL) {
                (*n_corrupt)++;
            }
            continue;
        }
        rc = fn(ctx, &meta);
        if (rc != 0) {
            break;
        }
    }
    if (n_old > 0) {
        LKV_LOGW("cold: dropped %" PRIu64 " documents written in the previous on-disk format "
                 "(v1, BLAKE2b-128 tags); they are misses now and come back when put again",
                 n_old);
    }
    if (rc == 0) {
        rocksdb_iter_get_error(it, &err);
        if (err != NULL) {
            rc = rerr("scan", err);
        }
    }
    rocksdb_iter_destroy(it);
    pthread_rwlock_unlock(&c->lk);
    rocksdb_readoptions_destroy(ro);
    return rc;
}

/* ---- pending markers: the write ledger ----------------------------------------------------- */

#define LEDGER_NAME "lkv-pending.ledger"
#define LEDGER_REC  33 /* op ('P' pending, 'U' no longer) | doc key (32). */

static int ledger_append(lkv_cold *c, uint8_t op, const lkv_dockey *key)
{
    uint8_t r[LEDGER_REC];
    if (c->ledger_fd < 0) {
        return LKV_EIO;
    }
    r[0] = op;
    memcpy(r + 1, key->b, LKV_DOCKEY_BYTES);
    /* O_APPEND: one small write lands whole and in order; no fsync (a process crash keeps it,
     * as it keeps the WAL the writer uses). */
    return write(c->ledger_fd, r, sizeof r) == (ssize_t)sizeof r ? 0 : LKV_EIO;
}

int lkv_cold_mark_pending(lkv_cold *c, const lkv_dockey *key)
{
    return ledger_append(c, 'P', key);
}

void lkv_cold_unmark_pending(lkv_cold *c, const lkv_dockey *key)
{
    (void)ledger_append(c, 'U', key);
}

/* Opens the ledger (lock-free appends from any thread). */
static void ledger_open(lkv_cold *c)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", c->dir, LEDGER_NAME);
    c->ledger_fd = open(p, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (c->ledger_fd < 0) {
        LKV_LOGW("cold: cannot open the write ledger %s (%s): write-back documents lost in a "
                 "crash will be misses of cause never instead of lost",
                 p, strerror(errno));
    }
}

typedef struct ledger_ent {
    lkv_dockey key; /* The document. */
    uint8_t op;     /* 'P' or 'U'. */
    size_t pos;     /* Record number in the ledger. */
} ledger_ent;

/* By key, then by position: the last entry of a key's run is its latest op. */
static int ent_cmp(const void *a, const void *b)
{
    const ledger_ent *x = a, *y = b;
    int c = memcmp(x->key.b, y->key.b, LKV_DOCKEY_BYTES);
    return c != 0 ? c : x->pos < y->pos ? -1 : x->pos > y->pos;
}

int lkv_cold_scan_pending(lkv_cold *c, lkv_cold_pending_fn fn, void *ctx)
{
    if (c->ledger_fd < 0) {
        return 0;
    }
    struct stat st;
    if (fstat(c->ledger_fd, &st) != 0) {
        return 0;
    }
    size_t n = (size_t)st.st_size / LEDGER_REC, m = 0;
    ledger_ent *e = lkv_xmalloc((n ? n : 1) * sizeof *e);
    uint8_t r[LEDGER_REC];
    for (size_t i = 0; i < n; i++) {
        if (pread(c->ledger_fd, r, sizeof r, (off_t)(i * LEDGER_REC)) != (ssize_t)sizeof r) {
            break;
        }
        memcpy(e[m].key.b, r + 1, LKV_DOCKEY_BYTES);
        e[m].op = r[0];
        e[m].pos = i;
        m++;
    }
    qsort(e, m, sizeof *e, ent_cmp);
    ledger_ent *last = lkv_xmalloc((m ? m : 1) * sizeof *last);
    size_t nl = 0;
    for (size_t i = 0; i < m; i++) {
        if (i + 1 == m || memcmp(e[i].key.b, e[i + 1].key.b, LKV_DOCKEY_BYTES) != 0) {
            last[nl++] = e[i];
        }
    }
    pthread_rwlock_rdlock(&c->lk);
    for (size_t i = 0; i < nl; i++) {
        if (last[i].op != 'P') {
            continue;
        }
        uint8_t d[LKV_COLD_DOC_KEY_BYTES];
        char *err = NULL;
        size_t vlen = 0;
        doc_key(&last[i].key, d);
        char *v = rocksdb_get(c->db, c->ropts, (const char *)d, sizeof d, &vlen, &err);
        if (err != NULL) {
            rocksdb_free(err);
        }
        int has_doc = v != NULL;
        rocksdb_free(v);
        fn(ctx, &last[i].key, has_doc);
    }
    pthread_rwlock_unlock(&c->lk);
    if (!c->readonly && ftruncate(c->ledger_fd, 0) != 0) {
        LKV_LOGW("cold: cannot reset the write ledger: %s", strerror(errno));
    }
    free(e);
    free(last);
    return 0;
}
