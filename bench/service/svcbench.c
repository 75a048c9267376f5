/*
 * svcbench.c: the lazykv service benchmark (issue 4 item 7), loopback on one host.
 *
 * Against a running lazykvd (--target), through the C client library (by default one
 * lkv_client handle and one connection per client thread, as independent client processes
 * would have; --handles shared: one handle, hence one HTTP/2 connection, for all), it measures
 * at each concurrency (--clients, default 1,8,64 closed-loop client threads):
 *
 *   put        throughput of Put (GB/s of block payload, 1 GB = 1e9 bytes) of documents of
 *              --min-blocks..--max-blocks blocks of --block-bytes (llama-3.1-8b: 2 MiB), each
 *              document new (unique tokens); ceiling: the same bytes sent over a plain loopback
 *              TCP socket to a receiver thread that acknowledges each document (svc_tcp.h);
 *   put+wb     the same puts counted until the daemon has persisted them (see below);
 *   get        throughput of Get of documents of a hot working set; ceiling: the same bytes
 *              sent by a loopback TCP server thread on request;
 *   lookup1    latency of a one-document Lookup (by key, a hot hit);
 *   lookup16   latency of a 16-document Lookup;
 *   ping       latency of grpc.health.v1 Check (secondary reference: the gRPC floor);
 *              ceiling of the three: round trip of a 64-byte message over loopback TCP;
 *   cold       in-process reads of whole documents from a RocksDB cold tier (storage/
 *              lkv_cold.h, tag-checked) beside pread(2) of the same bytes from plain files in
 *              the same directory, page cache warm for both (svc_cold.h);
 *   pread+tag  pread plus the BLAKE2b-128 tag computation the cold tier does per block, beside
 *              plain pread: the share of the cold gap that is the checksum;
 *   attach1    latency of Attach (zero-copy lease) of 1 document of the hot working set, timed
 *              alone (the Release that follows is not timed); ceiling: 64-byte TCP round trip;
 *   attach16   the same for 16 documents in one lease;
 *   attach+rd  throughput of Attach + reading the document's blocks out of the daemon's hot
 *              arena, mapped read-only from its shared-memory object as a co-located worker does
 *              (a memcpy of each block) + Release; ceiling: memcpy of the same bytes from this
 *              process's memory. Compare with get: the same bytes through the Get stream.
 *
 * Each point runs --reps times for --seconds (latency points: --lat-seconds), alternating the
 * order of the lazykv run and its ceiling run in each repetition so both see the same load;
 * the table shows the median over repetitions of each figure, and the ratio of the medians:
 * lazykv / ceiling for throughput (the fraction of the ceiling reached) and lazykv / ceiling
 * for latency (times slower than the ceiling). Every repetition is kept in the JSON
 * (--json), with the load average before and after each point: on a shared 2-core machine
 * the spread between repetitions is part of the result.
 *
 * Before each Put repetition the benchmark waits for the daemon's write-back queue to drain
 * (Stats wb_pending == 0), so every repetition starts from the same state; the writer then
 * persists concurrently with the puts, as it does in service. The drain after the repetition
 * is timed too: put+wb = bytes / (run time + drain time), the rate the daemon sustains once its
 * hot tier is full and every put must eventually reach RocksDB.
 *
 * Exit status: 0, 1 if anything failed (a row with errors, a setup failure), 2 on bad options.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "lkv_client.h"
#include "lkv_err.h"
#include "lkv_log.h"
#include "svc_cold.h"
#include "svc_run.h"
#include "svc_tcp.h"

#define MAX_CLIENT_LEVELS 8
#define MAX_REPS          15
#define MAX_ROWS          64
#define CALL_DEADLINE_MS  300000
#define LOOKUP_BATCH      16
#define ECHO_BYTES        64

/* ---- Options ------------------------------------------------------------------------------ */

typedef struct options {
    const char *target;                  /* lazykvd address, NULL: ceilings and cold only. */
    const char *profile;                 /* Profile of the documents. */
    size_t block_bytes;                  /* Bytes of one block. */
    uint32_t block_tokens;               /* Tokens of one block. */
    uint32_t vocab;                      /* Token ids are below this. */
    uint32_t min_blocks;                 /* Smallest document, blocks. */
    uint32_t max_blocks;                 /* Largest document, blocks. */
    int clients[MAX_CLIENT_LEVELS];      /* Concurrency levels. */
    int n_clients;                       /* Entries of clients. */
    int cold_clients[MAX_CLIENT_LEVELS]; /* Concurrency levels of the cold comparison. */
    int n_cold_clients;                  /* Entries of cold_clients. */
    double seconds;                      /* Duration of a throughput run. */
    double lat_seconds;                  /* Duration of a latency run. */
    int reps;                            /* Repetitions of every point. */
    int working_set;                     /* Documents put for get and lookup. */
    int cold_docs;                       /* Documents of the cold comparison. */
    const char *work_dir;                /* Directory of the cold comparison (NULL: skip it). */
    const char *json;                    /* JSON output path (NULL: none). */
    const char *phases;                  /* Comma list of phases to run. */
    uint64_t seed;                       /* Seed of document tokens and choices. */
    const char *command;                 /* Command line, for the JSON. */
    int shared_handle;                   /* 1: all clients share one lkv_client handle. */
} options;

/* ---- Results -------------------------------------------------------------------------------- */

typedef struct row {
    char name[32];      /* e.g. "put". */
    char ceil_name[32]; /* e.g. "tcp put". */
    int clients;        /* Concurrency. */
    int throughput;     /* 1: ratio of GB/s; 0: ratio of p50 latencies. */
    int n_reps;         /* Repetitions run. */
    svc_result lkv[MAX_REPS], ceil[MAX_REPS];
    double lkv_gbps, lkv_ops_s, lkv_p50, lkv_p99;     /* Medians over repetitions. */
    double ceil_gbps, ceil_ops_s, ceil_p50, ceil_p99; /* Medians over repetitions. */
    double ratio;                                     /* See the file comment. */
    double load_before[3], load_after[3];
    double wall_s;  /* Wall time of the point, all repetitions. */
    char note[160]; /* Anything odd (errors), "" otherwise. */
    int failed;     /* 1 if an operation failed or the write-back drain could not be awaited. */
} row;

static row g_rows[MAX_ROWS];
static int g_n_rows;

/* ---- Shared benchmark state ----------------------------------------------------------------- */

typedef struct bench {
    const options *opt;
    uint8_t *payload; /* max_blocks * block_bytes random bytes (the document KV). */
    size_t payload_len;
    lkv_client_t **handles; /* One per client thread (max concurrency). */
    int n_handles;
    int tcp_fds[256]; /* Ceiling connections of the current run. */
    int tcp_port;
    uint8_t **scratch;            /* One block-size receive buffer per client. */
    uint8_t **docbuf;             /* One whole-document buffer per client (get into), lazy. */
    atomic_uint_fast64_t doc_seq; /* Next unique document number of the put phase. */
    uint64_t run_nonce;           /* Makes documents unique across benchmark runs. */
    /* Working set (get, lookup). */
    uint8_t (*ws_keys)[LKV_KEY_BYTES];
    uint32_t *ws_blocks;
    int ws_n;
    svc_cold *cold;
    /* Zero-copy attach: the daemon's hot arena mapped read-only (host backend). */
    const uint8_t *arena;
    size_t arena_len;
} bench;

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint32_t doc_blocks_of(const options *o, uint64_t h)
{
    return o->min_blocks + (uint32_t)(mix64(h) % (o->max_blocks - o->min_blocks + 1));
}

/* Tokens of unique document number d (n_tokens entries into tokens). */
static void doc_tokens(const bench *b, uint64_t d, uint32_t *tokens, uint32_t n_tokens)
{
    uint64_t base = mix64(b->run_nonce ^ mix64(d));
    for (uint32_t j = 0; j < n_tokens; j++) {
        tokens[j] = (uint32_t)(mix64(base + j) % b->opt->vocab);
    }
}

static int put_doc(bench *b, lkv_client_t *c, uint64_t d, uint32_t n_blocks, uint8_t *key_out)
{
    const options *o = b->opt;
    uint32_t n_tokens = n_blocks * o->block_tokens;
    uint32_t *tokens = lkv_xmalloc(n_tokens * sizeof(uint32_t));
    doc_tokens(b, d, tokens, n_tokens);
    lkv_put_reply reply;
    int rc = lkv_client_put(c, o->profile, tokens, n_tokens, b->payload, n_blocks, o->block_bytes,
                            CALL_DEADLINE_MS, &reply);
    free(tokens);
    if (rc == 0 && reply.n_blocks != n_blocks) {
        rc = LKV_EPROTO;
    }
    if (rc == 0 && key_out != NULL) {
        memcpy(key_out, reply.key, LKV_KEY_BYTES);
    }
    return rc;
}

/* ---- Operations ----------------------------------------------------------------------------- */

static int op_put(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    (void)lat_us;
    bench *b = ctx;
    (void)iter;
    uint64_t d = atomic_fetch_add(&b->doc_seq, 1);
    uint32_t nb = doc_blocks_of(b->opt, d);
    int rc = put_doc(b, b->handles[tid], d, nb, NULL);
    if (rc != 0) {
        LKV_LOGE("put: client %d: %s (%s)", tid, lkv_strerror(rc), lkv_client_last_error());
        return rc;
    }
    *bytes += (uint64_t)nb * b->opt->block_bytes;
    return 0;
}

static int op_tcp_put(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    (void)lat_us;
    bench *b = ctx;
    uint32_t nb = doc_blocks_of(b->opt, ((uint64_t)tid << 32) ^ iter);
    size_t len = (size_t)nb * b->opt->block_bytes;
    int rc = svc_tcp_put(b->tcp_fds[tid], b->payload, len);
    if (rc == 0) {
        *bytes += len;
    }
    return rc;
}

typedef struct get_ctx {
    uint64_t bytes;       /* Payload bytes received. */
    uint64_t block_bytes; /* Expected block size. */
} get_ctx;

static int get_cb(void *ctx, const lkv_get_header *h, uint32_t index, const void *data, size_t len)
{
    get_ctx *g = ctx;
    (void)index;
    if (data == NULL) {
        return h->block_bytes == g->block_bytes ? 0 : 1;
    }
    g->bytes += len;
    return 0;
}

static uint32_t pick(const bench *b, int tid, uint64_t iter, uint32_t n)
{
    return (uint32_t)(mix64(b->opt->seed ^ ((uint64_t)tid << 40) ^ iter) % n);
}

static int op_get(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    (void)lat_us;
    bench *b = ctx;
    uint32_t i = pick(b, tid, iter, (uint32_t)b->ws_n);
    lkv_docref ref;
    memset(&ref, 0, sizeof(ref));
    ref.key = b->ws_keys[i];
    get_ctx g = {0, b->opt->block_bytes};
    lkv_get_header h;
    int rc = lkv_client_get(b->handles[tid], &ref, CALL_DEADLINE_MS, &h, get_cb, &g);
    if (rc == 0 && g.bytes != (uint64_t)b->ws_blocks[i] * b->opt->block_bytes) {
        rc = LKV_EPROTO;
    }
    if (rc != 0) {
        LKV_LOGE("get: client %d: %s (%s)", tid, lkv_strerror(rc), lkv_client_last_error());
        return rc;
    }
    *bytes += g.bytes;
    return 0;
}

/* Get into the client's own reused buffer (lkv_client_get_into): every block lands in the
 * caller's memory, copied once from gRPC's slices, as the TCP ceiling's bytes land in its. */
static int op_get_into(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    (void)lat_us;
    bench *b = ctx;
    uint32_t i = pick(b, tid, iter, (uint32_t)b->ws_n);
    size_t cap = (size_t)b->opt->max_blocks * b->opt->block_bytes;
    if (b->docbuf[tid] == NULL) {
        b->docbuf[tid] = lkv_xmalloc(cap);
        memset(b->docbuf[tid], 0, cap); /* Faulted in before it is timed. */
    }
    lkv_docref ref;
    memset(&ref, 0, sizeof(ref));
    ref.key = b->ws_keys[i];
    lkv_get_header h;
    size_t len = 0;
    int rc =
        lkv_client_get_into(b->handles[tid], &ref, CALL_DEADLINE_MS, &h, b->docbuf[tid], cap, &len);
    if (rc == 0 && len != (size_t)b->ws_blocks[i] * b->opt->block_bytes) {
        rc = LKV_EPROTO;
    }
    if (rc != 0) {
        LKV_LOGE("get into: client %d: %s (%s)", tid, lkv_strerror(rc), lkv_client_last_error());
        return rc;
    }
    *bytes += len;
    return 0;
}

static int op_tcp_get(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    (void)lat_us;
    bench *b = ctx;
    uint32_t i = pick(b, tid, iter, (uint32_t)b->ws_n);
    size_t len = (size_t)b->ws_blocks[i] * b->opt->block_bytes;
    int rc = svc_tcp_get(b->tcp_fds[tid], len, b->scratch[tid], b->opt->block_bytes);
    if (rc == 0) {
        *bytes += len;
    }
    return rc;
}

static int lookup_n(bench *b, int tid, uint64_t iter, uint32_t n)
{
    lkv_docref refs[LOOKUP_BATCH];
    lkv_doc_status st[LOOKUP_BATCH];
    uint32_t first = pick(b, tid, iter, (uint32_t)b->ws_n);
    memset(refs, 0, sizeof(refs));
    for (uint32_t k = 0; k < n; k++) {
        refs[k].key = b->ws_keys[(first + k) % (uint32_t)b->ws_n];
    }
    int rc = lkv_client_lookup(b->handles[tid], refs, n, CALL_DEADLINE_MS, st);
    for (uint32_t k = 0; rc == 0 && k < n; k++) {
        if (!st[k].present) {
            rc = LKV_ENOTFOUND;
        }
    }
    if (rc != 0) {
        LKV_LOGE("lookup: client %d: %s (%s)", tid, lkv_strerror(rc), lkv_client_last_error());
    }
    return rc;
}

static int op_lookup1(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    (void)lat_us;
    (void)bytes;
    return lookup_n(ctx, tid, iter, 1);
}

static int op_lookup16(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    (void)lat_us;
    (void)bytes;
    return lookup_n(ctx, tid, iter, LOOKUP_BATCH);
}

static int op_ping(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    (void)lat_us;
    bench *b = ctx;
    (void)iter;
    (void)bytes;
    return lkv_client_ping(b->handles[tid], "", CALL_DEADLINE_MS);
}

static int op_tcp_echo(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    (void)lat_us;
    bench *b = ctx;
    uint8_t msg[ECHO_BYTES], reply[ECHO_BYTES];
    (void)bytes;
    memset(msg, (int)(iter & 0xff), sizeof(msg));
    int rc = svc_tcp_echo(b->tcp_fds[tid], msg, sizeof(msg), reply);
    if (rc == 0 && memcmp(msg, reply, sizeof(msg)) != 0) {
        rc = LKV_EPROTO;
    }
    return rc;
}

static int op_cold_rocksdb(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    (void)lat_us;
    bench *b = ctx;
    return svc_cold_read_rocksdb(b->cold, tid, (int)pick(b, tid, iter, (uint32_t)b->opt->cold_docs),
                                 bytes);
}

static int op_cold_pread(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    (void)lat_us;
    bench *b = ctx;
    return svc_cold_read_pread(b->cold, tid, (int)pick(b, tid, iter, (uint32_t)b->opt->cold_docs),
                               bytes);
}

static int op_cold_pread_tag(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    (void)lat_us;
    bench *b = ctx;
    return svc_cold_read_pread_tag(b->cold, tid,
                                   (int)pick(b, tid, iter, (uint32_t)b->opt->cold_docs), bytes);
}

/* Attaches the n documents of the working set from index first under a new lease into *l. */
static int attach_docs(bench *b, int tid, uint32_t first, uint32_t n, lkv_lease *l)
{
    lkv_docref refs[LOOKUP_BATCH];
    memset(refs, 0, sizeof(refs));
    for (uint32_t k = 0; k < n; k++) {
        refs[k].key = b->ws_keys[(first + k) % (uint32_t)b->ws_n];
    }
    int rc = lkv_client_attach(b->handles[tid], refs, n, NULL, 30000, CALL_DEADLINE_MS, l);
    if (rc == 0 && l->n_docs != n) {
        lkv_lease_free(l);
        rc = LKV_EPROTO;
    }
    if (rc != 0) {
        LKV_LOGE("attach: client %d: %s (%s)", tid, lkv_strerror(rc), lkv_client_last_error());
    }
    return rc;
}

static int release(bench *b, int tid, lkv_lease *l)
{
    int rc = lkv_client_release(b->handles[tid], l->id, CALL_DEADLINE_MS, NULL);
    if (rc != 0) {
        LKV_LOGE("release: client %d: %s (%s)", tid, lkv_strerror(rc), lkv_client_last_error());
    }
    lkv_lease_free(l);
    return rc;
}

/* Attach of n documents (timed alone), then Release (not timed). */
static int attach_n(bench *b, int tid, uint64_t iter, uint32_t n, double *lat_us)
{
    lkv_lease l;
    double t0 = svc_now();
    int rc = attach_docs(b, tid, pick(b, tid, iter, (uint32_t)b->ws_n), n, &l);
    *lat_us = (svc_now() - t0) * 1e6;
    if (rc != 0) {
        return rc;
    }
    return release(b, tid, &l);
}

static int op_attach1(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    (void)bytes;
    return attach_n(ctx, tid, iter, 1, lat_us);
}

static int op_attach16(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    (void)bytes;
    return attach_n(ctx, tid, iter, LOOKUP_BATCH, lat_us);
}

/* Zero-copy read of one document: Attach, copy its blocks out of the mapped arena (as a worker
 * would read them), Release. The whole sequence is timed. */
static int op_attach_read(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    bench *b = ctx;
    (void)lat_us;
    lkv_lease l;
    int rc = attach_docs(b, tid, pick(b, tid, iter, (uint32_t)b->ws_n), 1, &l);
    if (rc != 0) {
        return rc;
    }
    const lkv_attached_doc *d = &l.docs[0];
    for (uint32_t i = 0; i < d->n_pages && rc == 0; i++) {
        size_t off = (size_t)d->region_base + (size_t)d->pages[i] * d->page_bytes;
        if (off + d->block_bytes > b->arena_len || d->block_bytes > b->opt->block_bytes) {
            rc = LKV_EPROTO;
            break;
        }
        memcpy(b->scratch[tid], b->arena + off, d->block_bytes);
        *bytes += d->block_bytes;
    }
    int rc2 = release(b, tid, &l);
    return rc != 0 ? rc : rc2;
}

/* The in-memory ceiling of op_attach_read: the same bytes copied from process memory. */
static int op_memcpy(void *ctx, int tid, uint64_t iter, uint64_t *bytes, double *lat_us)
{
    bench *b = ctx;
    (void)lat_us;
    uint32_t i = pick(b, tid, iter, (uint32_t)b->ws_n);
    for (uint32_t k = 0; k < b->ws_blocks[i]; k++) {
        memcpy(b->scratch[tid], b->payload + (size_t)k * b->opt->block_bytes, b->opt->block_bytes);
        *bytes += b->opt->block_bytes;
    }
    return 0;
}

/* Maps the daemon's hot arena read-only (as a co-located worker does, from an Attach reply) and
 * checks one attached document byte for byte. LKV_ENOTSUP if the arena is not host memory. */
static int map_arena(bench *b)
{
    lkv_lease l;
    int rc = attach_docs(b, 0, 0, 1, &l);
    if (rc != 0) {
        return rc;
    }
    if (strcmp(l.arena.backend, "host") != 0 || l.arena.shm_name[0] == 0) {
        LKV_LOGE("attach: arena backend '%s' is not host shared memory", l.arena.backend);
        release(b, 0, &l);
        return LKV_ENOTSUP;
    }
    b->arena_len = (size_t)l.arena.arena_bytes;
    int fd = shm_open(l.arena.shm_name, O_RDONLY, 0);
    void *p = fd >= 0 ? mmap(NULL, b->arena_len, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fd >= 0) {
        close(fd);
    }
    if (p == MAP_FAILED) {
        LKV_LOGE("attach: cannot map %s: %s", l.arena.shm_name, strerror(errno));
        release(b, 0, &l);
        return LKV_EIO;
    }
    b->arena = p;
    const lkv_attached_doc *d = &l.docs[0];
    for (uint32_t i = 0; i < d->n_pages && rc == 0; i++) {
        size_t off = (size_t)d->region_base + (size_t)d->pages[i] * d->page_bytes;
        if (d->block_bytes != b->opt->block_bytes || off + d->block_bytes > b->arena_len ||
            memcmp(b->arena + off, b->payload + (size_t)i * d->block_bytes, d->block_bytes) != 0) {
            LKV_LOGE("attach: block %u of the attached document differs from what was put", i);
            rc = LKV_ECORRUPT;
        }
    }
    int rc2 = release(b, 0, &l);
    return rc != 0 ? rc : rc2;
}

/* ---- Daemon helpers ------------------------------------------------------------------------- */

/* Reads one numeric statistic (section, key) of the daemon into *v. */
static int daemon_stat(bench *b, const char *section, const char *key, double *v)
{
    lkv_stat_entry *e = NULL;
    size_t n = 0;
    int rc = lkv_client_stats_entries(b->handles[0], section, 10000, &e, &n);
    if (rc != 0) {
        return rc;
    }
    rc = LKV_ENOTFOUND;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(e[i].key, key) == 0) {
            *v = e[i].value;
            rc = 0;
            break;
        }
    }
    free(e);
    return rc;
}

/* Waits (up to 300 s) until the daemon's write-back queue is empty. */
static int wait_drained(bench *b)
{
    double t0 = svc_now();
    for (;;) {
        double pending = 0;
        int rc = daemon_stat(b, "persistence", "wb_pending", &pending);
        if (rc != 0 || pending == 0) {
            return rc;
        }
        if (svc_now() - t0 > 300) {
            LKV_LOGE("write-back queue still holds %.0f documents after 300 s", pending);
            return LKV_ETIMEDOUT;
        }
        usleep(50000);
    }
}

/* ---- Points --------------------------------------------------------------------------------- */

static int tcp_open(bench *b, int n)
{
    for (int i = 0; i < n; i++) {
        b->tcp_fds[i] = svc_tcp_connect(b->tcp_port);
        if (b->tcp_fds[i] < 0) {
            return LKV_EIO;
        }
    }
    return 0;
}

static void tcp_close(bench *b, int n)
{
    for (int i = 0; i < n; i++) {
        if (b->tcp_fds[i] >= 0) {
            close(b->tcp_fds[i]);
            b->tcp_fds[i] = -1;
        }
    }
}

enum ceil_kind { CEIL_TCP, CEIL_INPROC };

/* Fills the medians and the ratio of r from its repetitions. */
static void finish_row(row *r)
{
    double v[MAX_REPS];
#define MED(field, dst)                                                                            \
    do {                                                                                           \
        for (int i = 0; i < r->n_reps; i++) {                                                      \
            v[i] = field;                                                                          \
        }                                                                                          \
        dst = svc_median(v, (size_t)r->n_reps);                                                    \
    } while (0)
    MED(r->lkv[i].gbps, r->lkv_gbps);
    MED(r->lkv[i].ops_s, r->lkv_ops_s);
    MED(r->lkv[i].p50_us, r->lkv_p50);
    MED(r->lkv[i].p99_us, r->lkv_p99);
    MED(r->ceil[i].gbps, r->ceil_gbps);
    MED(r->ceil[i].ops_s, r->ceil_ops_s);
    MED(r->ceil[i].p50_us, r->ceil_p50);
    MED(r->ceil[i].p99_us, r->ceil_p99);
#undef MED
    if (r->throughput) {
        r->ratio = r->ceil_gbps > 0 ? r->lkv_gbps / r->ceil_gbps : 0;
    } else {
        r->ratio = r->ceil_p50 > 0 ? r->lkv_p50 / r->ceil_p50 : 0;
    }
    fprintf(stderr,
            "svcbench: %-9s x%-3d %8.3f GB/s %10.1f ops/s p50 %9.1f us | %-10s %8.3f GB/s "
            "p50 %9.1f us | load %.2f | %.1f s\n",
            r->name, r->clients, r->lkv_gbps, r->lkv_ops_s, r->lkv_p50, r->ceil_name, r->ceil_gbps,
            r->ceil_p50, r->load_after[0], r->wall_s);
}

static row *new_row(const char *name, const char *ceil_name, int clients, int throughput)
{
    if (g_n_rows == MAX_ROWS) {
        lkv_panic("too many rows");
    }
    row *r = &g_rows[g_n_rows++];
    memset(r, 0, sizeof(*r));
    snprintf(r->name, sizeof(r->name), "%s", name);
    snprintf(r->ceil_name, sizeof(r->ceil_name), "%s", ceil_name);
    r->clients = clients;
    r->throughput = throughput;
    return r;
}

/* Runs one point: reps x (lazykv run, ceiling run), alternating their order; appends a row.
 * With drain set (puts), the daemon's write-back queue is drained before every lazykvd run and
 * the time to drain it after the run is measured; a second row "<name>+wb" then reports the
 * sustained rate: the run's bytes over (run time + drain time), i.e. until every document put
 * is persisted in RocksDB. */
static void run_point(bench *b, const char *name, const char *ceil_name, int clients,
                      int throughput, svc_op_fn op, svc_op_fn ceil_op, int ceil_kind, int drain)
{
    const options *o = b->opt;
    row *r = new_row(name, ceil_name, clients, throughput);
    double drain_s[MAX_REPS] = {0};
    svc_loadavg(r->load_before);
    double t_start = svc_now();
    double secs = throughput ? o->seconds : o->lat_seconds;
    for (int rep = 0; rep < o->reps; rep++) {
        for (int k = 0; k < 2; k++) {
            int do_ceil = (k == 0) == (rep % 2 == 0);
            if (do_ceil) {
                if (ceil_kind == CEIL_TCP && tcp_open(b, clients) != 0) {
                    lkv_panic("cannot connect to the loopback ceiling server");
                }
                svc_run(clients, secs, ceil_op, b, &r->ceil[rep]);
                if (ceil_kind == CEIL_TCP) {
                    tcp_close(b, clients);
                }
            } else {
                if (drain && wait_drained(b) != 0) {
                    snprintf(r->note, sizeof(r->note), "could not wait for write-back drain");
                    r->failed = 1;
                }
                svc_run(clients, secs, op, b, &r->lkv[rep]);
                if (drain) {
                    double t0 = svc_now();
                    if (wait_drained(b) != 0) {
                        snprintf(r->note, sizeof(r->note), "could not wait for write-back drain");
                        r->failed = 1;
                    }
                    drain_s[rep] = svc_now() - t0;
                }
            }
        }
        r->n_reps++;
        if (r->lkv[rep].errors || r->ceil[rep].errors) {
            r->failed = 1;
            snprintf(r->note, sizeof(r->note), "errors: %s %llu (%s), ceiling %llu (%s)", name,
                     (unsigned long long)r->lkv[rep].errors, lkv_err_name(r->lkv[rep].first_error),
                     (unsigned long long)r->ceil[rep].errors,
                     lkv_err_name(r->ceil[rep].first_error));
        }
    }
    svc_loadavg(r->load_after);
    r->wall_s = svc_now() - t_start;
    finish_row(r);
    if (!drain) {
        return;
    }
    row *w = new_row("", ceil_name, clients, 1);
    *w = *r;
    snprintf(w->name, sizeof(w->name), "%.24s+wb", name);
    for (int rep = 0; rep < r->n_reps; rep++) {
        svc_result *x = &w->lkv[rep];
        x->secs += drain_s[rep];
        x->gbps = x->secs > 0 ? (double)x->bytes / x->secs / 1e9 : 0;
        x->ops_s = x->secs > 0 ? (double)x->ops / x->secs : 0;
        x->p50_us = x->p99_us = x->mean_us = 0; /* Per-op latency: see the put row. */
    }
    if (w->note[0] == 0) {
        snprintf(w->note, sizeof(w->note), "sustained: until persisted (latency: see %s)", name);
    }
    finish_row(w);
}

/* ---- Output --------------------------------------------------------------------------------- */

static void print_table(const options *o, const double la0[3], const double la1[3], int attach)
{
    printf("\nlazykv service benchmark: loopback, CPU host only (no GPU, no network); "
           "1 GB = 1e9 B\n");
    printf("profile %s, blocks of %zu B, documents of %u-%u blocks; %d reps x %.1f s "
           "(latency %.1f s); medians over reps\n",
           o->profile, o->block_bytes, o->min_blocks, o->max_blocks, o->reps, o->seconds,
           o->lat_seconds);
    printf("load average at start %.2f %.2f %.2f, at end %.2f %.2f %.2f (%ld CPUs online)\n\n",
           la0[0], la0[1], la0[2], la1[0], la1[1], la1[2], sysconf(_SC_NPROCESSORS_ONLN));
    printf("%-9s %4s %10s %8s %10s %10s | %-10s %8s %10s %10s | %s\n", "bench", "cli", "ops/s",
           "GB/s", "p50 us", "p99 us", "ceiling", "GB/s", "p50 us", "p99 us", "ratio");
    for (int i = 0; i < g_n_rows; i++) {
        const row *r = &g_rows[i];
        printf("%-9s %4d %10.1f %8.3f %10.1f %10.1f | %-10s %8.3f %10.1f %10.1f | %.3f%s %s\n",
               r->name, r->clients, r->lkv_ops_s, r->lkv_gbps, r->lkv_p50, r->lkv_p99, r->ceil_name,
               r->ceil_gbps, r->ceil_p50, r->ceil_p99, r->ratio,
               r->throughput ? " of ceiling GB/s" : " x ceiling p50", r->note);
    }
    if (!attach) {
        printf("%-9s %4s not measured: Attach not implemented yet\n", "attach", "-");
    }
    printf("\nratio: throughput rows = lazykv GB/s / ceiling GB/s; latency rows = lazykv p50 / "
           "ceiling p50.\n");
}

static void json_res(FILE *f, const svc_result *s)
{
    fprintf(f,
            "{\"ops\": %llu, \"bytes\": %llu, \"secs\": %.4f, \"gbps\": %.4f, \"ops_s\": %.2f, "
            "\"p50_us\": %.2f, \"p99_us\": %.2f, \"mean_us\": %.2f, \"errors\": %llu, "
            "\"first_error\": \"%s\"}",
            (unsigned long long)s->ops, (unsigned long long)s->bytes, s->secs, s->gbps, s->ops_s,
            s->p50_us, s->p99_us, s->mean_us, (unsigned long long)s->errors,
            s->first_error ? lkv_err_name(s->first_error) : "");
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') {
            fprintf(f, "\\%c", *s);
        } else if ((unsigned char)*s < 0x20) {
            fprintf(f, "\\u%04x", *s);
        } else {
            fputc(*s, f);
        }
    }
    fputc('"', f);
}

static int write_json(const options *o, const double la0[3], const double la1[3],
                      const char *daemon_info, int attach)
{
    FILE *f = fopen(o->json, "w");
    if (f == NULL) {
        LKV_LOGE("cannot write %s: %s", o->json, strerror(errno));
        return LKV_EIO;
    }
    char date[64];
    time_t now = time(NULL);
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    fprintf(f, "{\n  \"bench\": \"service\",\n  \"scope\": \"loopback, CPU host only\",\n");
    fprintf(f, "  \"date\": \"%s\",\n  \"command\": ", date);
    json_str(f, o->command);
    fprintf(f, ",\n  \"cpus_online\": %ld,\n", sysconf(_SC_NPROCESSORS_ONLN));
    fprintf(f, "  \"loadavg_start\": [%.2f, %.2f, %.2f],\n  \"loadavg_end\": [%.2f, %.2f, %.2f],\n",
            la0[0], la0[1], la0[2], la1[0], la1[1], la1[2]);
    fprintf(f, "  \"target\": ");
    json_str(f, o->target ? o->target : "");
    fprintf(f, ",\n  \"daemon\": ");
    json_str(f, daemon_info);
    fprintf(f, ",\n  \"handles\": \"%s\"", o->shared_handle ? "shared" : "own");
    fprintf(f, ",\n  \"profile\": ");
    json_str(f, o->profile);
    fprintf(f,
            ",\n  \"block_bytes\": %zu,\n  \"doc_blocks\": [%u, %u],\n  \"reps\": %d,\n"
            "  \"seconds\": %.2f,\n  \"lat_seconds\": %.2f,\n  \"gb\": 1e9,\n",
            o->block_bytes, o->min_blocks, o->max_blocks, o->reps, o->seconds, o->lat_seconds);
    fprintf(f, "  \"ratio\": \"throughput: lazykv_gbps / ceiling_gbps; latency: lazykv_p50 / "
               "ceiling_p50 (medians over reps)\",\n");
    fprintf(f, "  \"attach\": %s,\n",
            attach ? "\"measured\"" : "\"not measured: Attach not implemented yet\"");
    fprintf(f, "  \"rows\": [\n");
    for (int i = 0; i < g_n_rows; i++) {
        const row *r = &g_rows[i];
        fprintf(f,
                "    {\"name\": \"%s\", \"clients\": %d, \"kind\": \"%s\", \"ceiling\": \"%s\",\n",
                r->name, r->clients, r->throughput ? "throughput" : "latency", r->ceil_name);
        fprintf(f,
                "     \"gbps\": %.4f, \"ops_s\": %.2f, \"p50_us\": %.2f, \"p99_us\": %.2f,\n"
                "     \"ceiling_gbps\": %.4f, \"ceiling_ops_s\": %.2f, \"ceiling_p50_us\": %.2f, "
                "\"ceiling_p99_us\": %.2f,\n     \"ratio\": %.4f, \"note\": ",
                r->lkv_gbps, r->lkv_ops_s, r->lkv_p50, r->lkv_p99, r->ceil_gbps, r->ceil_ops_s,
                r->ceil_p50, r->ceil_p99, r->ratio);
        json_str(f, r->note);
        fprintf(f,
                ",\n     \"loadavg_before\": [%.2f, %.2f, %.2f], \"loadavg_after\": [%.2f, %.2f, "
                "%.2f], \"wall_s\": %.2f,\n",
                r->load_before[0], r->load_before[1], r->load_before[2], r->load_after[0],
                r->load_after[1], r->load_after[2], r->wall_s);
        fprintf(f, "     \"reps\": [");
        for (int k = 0; k < r->n_reps; k++) {
            fprintf(f, "%s\n       {\"lazykv\": ", k ? "," : "");
            json_res(f, &r->lkv[k]);
            fprintf(f, ",\n        \"ceiling\": ");
            json_res(f, &r->ceil[k]);
            fprintf(f, "}");
        }
        fprintf(f, "]}%s\n", i + 1 < g_n_rows ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    int rc = fclose(f) == 0 ? 0 : LKV_EIO;
    return rc;
}

/* ---- Main ----------------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: svcbench [--target HOST:PORT] [--json PATH] [--work-dir DIR]\n"
            "  [--clients 1,8,64] [--cold-clients 1,8] [--seconds 2] [--lat-seconds 1] [--reps 3]\n"
            "  [--phases latency,put,get,lookup,attach,cold] [--handles own|shared]\n"
            "  [--profile llama-3.1-8b]\n"
            "  [--block-bytes 2097152] [--block-tokens 16] [--vocab 128256]\n"
            "  [--min-blocks 8] [--max-blocks 16] [--working-set 32] [--cold-docs 16] [--seed N]\n"
            "Without --target only the cold comparison runs; without --work-dir it is skipped.\n");
}

static int has_phase(const options *o, const char *p)
{
    const char *s = o->phases;
    size_t n = strlen(p);
    while (s && *s) {
        if (strncmp(s, p, n) == 0 && (s[n] == ',' || s[n] == 0)) {
            return 1;
        }
        s = strchr(s, ',');
        if (s) {
            s++;
        }
    }
    return 0;
}

/* Parses a comma list of concurrency levels (1..256) into lv[], *n. */
static int parse_clients(const char *s, int *lv, int *n)
{
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 256 || *n == MAX_CLIENT_LEVELS) {
            return LKV_EINVAL;
        }
        lv[(*n)++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            return LKV_EINVAL;
        }
    }
    return *n > 0 ? 0 : LKV_EINVAL;
}

static int parse_args(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof(*o));
    o->profile = "llama-3.1-8b";
    o->block_bytes = 2u << 20;
    o->block_tokens = 16;
    o->vocab = 128256;
    o->min_blocks = 8;
    o->max_blocks = 16;
    o->seconds = 2;
    o->lat_seconds = 1;
    o->reps = 3;
    o->working_set = 32;
    o->cold_docs = 16;
    o->phases = "latency,put,get,lookup,attach,cold";
    o->seed = 42;
    parse_clients("1,8,64", o->clients, &o->n_clients);
    parse_clients("1,8", o->cold_clients, &o->n_cold_clients);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage();
            exit(0);
        }
        if (v == NULL) {
            fprintf(stderr, "svcbench: %s needs a value\n", a);
            return LKV_EINVAL;
        }
        i++;
        if (strcmp(a, "--target") == 0) {
            o->target = v;
        } else if (strcmp(a, "--json") == 0) {
            o->json = v;
        } else if (strcmp(a, "--work-dir") == 0) {
            o->work_dir = v;
        } else if (strcmp(a, "--handles") == 0) {
            if (strcmp(v, "shared") == 0) {
                o->shared_handle = 1;
            } else if (strcmp(v, "own") == 0) {
                o->shared_handle = 0;
            } else {
                fprintf(stderr, "svcbench: --handles is 'own' or 'shared'\n");
                return LKV_EINVAL;
            }
        } else if (strcmp(a, "--phases") == 0) {
            o->phases = v;
        } else if (strcmp(a, "--profile") == 0) {
            o->profile = v;
        } else if (strcmp(a, "--clients") == 0) {
            if (parse_clients(v, o->clients, &o->n_clients) != 0) {
                fprintf(stderr, "svcbench: bad --clients '%s' (1..256, comma list)\n", v);
                return LKV_EINVAL;
            }
        } else if (strcmp(a, "--cold-clients") == 0) {
            if (parse_clients(v, o->cold_clients, &o->n_cold_clients) != 0) {
                fprintf(stderr, "svcbench: bad --cold-clients '%s' (1..256, comma list)\n", v);
                return LKV_EINVAL;
            }
        } else if (strcmp(a, "--seconds") == 0) {
            o->seconds = atof(v);
        } else if (strcmp(a, "--lat-seconds") == 0) {
            o->lat_seconds = atof(v);
        } else if (strcmp(a, "--reps") == 0) {
            o->reps = atoi(v);
        } else if (strcmp(a, "--block-bytes") == 0) {
            o->block_bytes = (size_t)strtoull(v, NULL, 10);
        } else if (strcmp(a, "--block-tokens") == 0) {
            o->block_tokens = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--vocab") == 0) {
            o->vocab = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--min-blocks") == 0) {
            o->min_blocks = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--max-blocks") == 0) {
            o->max_blocks = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--working-set") == 0) {
            o->working_set = atoi(v);
        } else if (strcmp(a, "--cold-docs") == 0) {
            o->cold_docs = atoi(v);
        } else if (strcmp(a, "--seed") == 0) {
            o->seed = strtoull(v, NULL, 10);
        } else {
            fprintf(stderr, "svcbench: unknown option %s\n", a);
            return LKV_EINVAL;
        }
    }
    if (o->seconds <= 0 || o->lat_seconds <= 0 || o->reps < 1 || o->reps > MAX_REPS ||
        o->block_bytes < 64 || o->block_tokens < 1 || o->vocab < 1 || o->min_blocks < 1 ||
        o->max_blocks < o->min_blocks || o->working_set < LOOKUP_BATCH || o->cold_docs < 1) {
        fprintf(stderr, "svcbench: bad option values (see --help)\n");
        return LKV_EINVAL;
    }
    return 0;
}

/* Puts the working set (get and lookup phases) and checks one Get byte for byte. */
static int setup_working_set(bench *b)
{
    const options *o = b->opt;
    b->ws_n = o->working_set;
    b->ws_keys = lkv_xcalloc((size_t)b->ws_n, LKV_KEY_BYTES);
    b->ws_blocks = lkv_xcalloc((size_t)b->ws_n, sizeof(uint32_t));
    for (int i = 0; i < b->ws_n; i++) {
        uint64_t d = (1ull << 62) + (uint64_t)i; /* Apart from the put phase's numbers. */
        b->ws_blocks[i] = doc_blocks_of(o, d);
        int rc = put_doc(b, b->handles[0], d, b->ws_blocks[i], b->ws_keys[i]);
        if (rc != 0) {
            LKV_LOGE("working set put %d: %s (%s)", i, lkv_strerror(rc), lkv_client_last_error());
            return rc;
        }
    }
    lkv_docref ref;
    memset(&ref, 0, sizeof(ref));
    ref.key = b->ws_keys[0];
    lkv_get_header h;
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = lkv_client_get_buf(b->handles[0], &ref, CALL_DEADLINE_MS, &h, &data, &len);
    if (rc == 0 && (len != (size_t)b->ws_blocks[0] * o->block_bytes ||
                    memcmp(data, b->payload, len) != 0 || h.tier != LKV_WIRE_TIER_HOT)) {
        LKV_LOGE("working set: Get returned %zu bytes from tier %d, not the %zu bytes put", len,
                 h.tier, (size_t)b->ws_blocks[0] * o->block_bytes);
        rc = LKV_ECORRUPT;
    }
    free(data);
    if (rc == 0) {
        rc = wait_drained(b);
    }
    return rc;
}

int main(int argc, char **argv)
{
    options o;
    if (parse_args(argc, argv, &o) != 0) {
        usage();
        return 2;
    }
    char command[2048] = "";
    for (int i = 0; i < argc; i++) {
        size_t n = strlen(command);
        snprintf(command + n, sizeof(command) - n, "%s%s", i ? " " : "", argv[i]);
    }
    o.command = command;

    bench b;
    memset(&b, 0, sizeof(b));
    b.opt = &o;
    b.run_nonce = mix64(o.seed ^ (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20));
    b.payload_len = (size_t)o.max_blocks * o.block_bytes;
    b.payload = lkv_xmalloc(b.payload_len);
    for (size_t i = 0; i < b.payload_len; i += 8) {
        uint64_t x = mix64(o.seed + i);
        memcpy(b.payload + i, &x, b.payload_len - i < 8 ? b.payload_len - i : 8);
    }
    int max_cli = 1;
    for (int i = 0; i < o.n_clients; i++) {
        max_cli = o.clients[i] > max_cli ? o.clients[i] : max_cli;
    }
    for (int i = 0; i < o.n_cold_clients; i++) {
        max_cli = o.cold_clients[i] > max_cli ? o.cold_clients[i] : max_cli;
    }
    b.scratch = lkv_xcalloc((size_t)max_cli, sizeof(uint8_t *));
    b.docbuf = lkv_xcalloc((size_t)max_cli, sizeof(uint8_t *));
    for (int i = 0; i < max_cli; i++) {
        b.scratch[i] = lkv_xmalloc(o.block_bytes);
        b.tcp_fds[i] = -1;
    }
    double la0[3], la1[3];
    svc_loadavg(la0);
    fprintf(stderr, "svcbench: load average %.2f %.2f %.2f\n", la0[0], la0[1], la0[2]);

    svc_tcp_server *tcp = NULL;
    if (svc_tcp_server_start(b.payload, b.payload_len, &tcp) != 0) {
        return 1;
    }
    b.tcp_port = svc_tcp_server_port(tcp);

    int rc = 0;
    int attach = 0; /* Set once the attach phase ran. */
    char daemon_info[256] = "";
    if (o.target != NULL) {
        /* gRPC core shares one connection among channels with equal arguments (its global
         * subchannel pool), so handles that differ only by identity would all multiplex one
         * HTTP/2 connection. Each client's handle gets a max message size differing by a few
         * bytes (64 MiB + i), which makes its channel arguments, hence its connection, its own:
         * like independent client processes, and like the ceiling's one socket per client. */
        b.n_handles = o.shared_handle ? 1 : max_cli;
        b.handles = lkv_xcalloc((size_t)max_cli, sizeof(lkv_client_t *));
        for (int i = 0; i < b.n_handles && rc == 0; i++) {
            lkv_client_options copt;
            memset(&copt, 0, sizeof(copt));
            copt.max_message_bytes = LKV_CLIENT_DEFAULT_MAX_MESSAGE + (size_t)i;
            rc = lkv_client_create(o.target, &copt, &b.handles[i]);
        }
        for (int i = b.n_handles; i < max_cli; i++) {
            b.handles[i] = b.handles[0];
        }
        if (rc == 0) {
            rc = lkv_client_ping(b.handles[0], "", 10000);
        }
        if (rc != 0) {
            fprintf(stderr, "svcbench: cannot reach lazykvd at %s: %s (%s)\n", o.target,
                    lkv_strerror(rc), lkv_client_last_error());
            return 1;
        }
        double thr = 0, hot = 0;
        (void)daemon_stat(&b, "server", "threads", &thr);
        (void)daemon_stat(&b, "hot", "bytes_budget", &hot);
        snprintf(daemon_info, sizeof(daemon_info),
                 "lazykvd at %s: %.0f polling threads, hot %.0f B; clients: %s", o.target, thr, hot,
                 o.shared_handle ? "one shared handle (one HTTP/2 connection)"
                                 : "one handle and one connection each");
        fprintf(stderr, "svcbench: %s\n", daemon_info);

        if (has_phase(&o, "latency")) {
            for (int i = 0; i < o.n_clients; i++) {
                run_point(&b, "ping", "tcp echo", o.clients[i], 0, op_ping, op_tcp_echo, CEIL_TCP,
                          0);
            }
        }
        if (has_phase(&o, "put")) {
            for (int i = 0; i < o.n_clients; i++) {
                run_point(&b, "put", "tcp put", o.clients[i], 1, op_put, op_tcp_put, CEIL_TCP, 1);
            }
        }
        if (has_phase(&o, "get") || has_phase(&o, "lookup") || has_phase(&o, "attach")) {
            rc = setup_working_set(&b);
            if (rc != 0) {
                fprintf(stderr, "svcbench: working set setup failed: %s\n", lkv_strerror(rc));
                return 1;
            }
        }
        if (has_phase(&o, "get")) {
            for (int i = 0; i < o.n_clients; i++) {
                run_point(&b, "get", "tcp get", o.clients[i], 1, op_get, op_tcp_get, CEIL_TCP, 0);
                run_point(&b, "get into", "tcp get", o.clients[i], 1, op_get_into, op_tcp_get,
                          CEIL_TCP, 0);
            }
        }
        if (has_phase(&o, "lookup")) {
            for (int i = 0; i < o.n_clients; i++) {
                run_point(&b, "lookup1", "tcp echo", o.clients[i], 0, op_lookup1, op_tcp_echo,
                          CEIL_TCP, 0);
            }
            for (int i = 0; i < o.n_clients; i++) {
                run_point(&b, "lookup16", "tcp echo", o.clients[i], 0, op_lookup16, op_tcp_echo,
                          CEIL_TCP, 0);
            }
        }
    }
    if (o.target != NULL && has_phase(&o, "attach")) {
        rc = map_arena(&b);
        if (rc != 0) {
            fprintf(stderr, "svcbench: attach setup failed: %s (%s)\n", lkv_strerror(rc),
                    lkv_client_last_error());
            return 1;
        }
        attach = 1;
        for (int i = 0; i < o.n_clients; i++) {
            run_point(&b, "attach1", "tcp echo", o.clients[i], 0, op_attach1, op_tcp_echo, CEIL_TCP,
                      0);
        }
        for (int i = 0; i < o.n_clients; i++) {
            run_point(&b, "attach16", "tcp echo", o.clients[i], 0, op_attach16, op_tcp_echo,
                      CEIL_TCP, 0);
        }
        for (int i = 0; i < o.n_clients; i++) {
            run_point(&b, "attach+rd", "memcpy", o.clients[i], 1, op_attach_read, op_memcpy,
                      CEIL_INPROC, 0);
        }
        munmap((void *)b.arena, b.arena_len);
    }
    if (has_phase(&o, "cold") && o.work_dir != NULL) {
        uint32_t *blocks = lkv_xcalloc((size_t)o.cold_docs, sizeof(uint32_t));
        for (int d = 0; d < o.cold_docs; d++) {
            blocks[d] = doc_blocks_of(&o, (1ull << 61) + (uint64_t)d);
        }
        rc = svc_cold_open(o.work_dir, o.cold_docs, blocks, o.block_bytes, b.payload, max_cli,
                           &b.cold);
        free(blocks);
        if (rc != 0) {
            fprintf(stderr, "svcbench: cold setup failed: %s\n", lkv_strerror(rc));
            return 1;
        }
        for (int i = 0; i < o.n_cold_clients; i++) {
            run_point(&b, "cold", "pread", o.cold_clients[i], 1, op_cold_rocksdb, op_cold_pread,
                      CEIL_INPROC, 0);
        }
        for (int i = 0; i < o.n_cold_clients; i++) {
            run_point(&b, "pread+tag", "pread", o.cold_clients[i], 1, op_cold_pread_tag,
                      op_cold_pread, CEIL_INPROC, 0);
        }
        svc_cold_close(b.cold);
    }
    svc_loadavg(la1);
    print_table(&o, la0, la1, attach);
    if (o.json != NULL) {
        rc = write_json(&o, la0, la1, daemon_info, attach);
        if (rc == 0) {
            printf("wrote %s\n", o.json);
        }
    }
    svc_tcp_server_stop(tcp);
    for (int i = 0; i < b.n_handles; i++) {
        lkv_client_destroy(b.handles[i]);
    }
    free(b.handles);
    for (int i = 0; i < max_cli; i++) {
        free(b.scratch[i]);
        free(b.docbuf[i]);
    }
    free(b.scratch);
    free(b.docbuf);
    free(b.ws_keys);
    free(b.ws_blocks);
    free(b.payload);
    int errors = 0;
    for (int i = 0; i < g_n_rows; i++) {
        errors += g_rows[i].failed;
    }
    return rc != 0 || errors ? 1 : 0;
}
