/*
 * inplace_bench.c: a computed miss stored in place (Reserve -> write the arena -> Commit)
 * beside Put of the same document, against a running lazykvd on this host (issue 10 item 5).
 *
 * The document's KV is in the worker's memory in both cases (on a CPU host the worker computes
 * into its own buffer; on a GPU host the K/V projections could write the reserved pages
 * directly, saving even the copy measured here). Per document, each a new miss (unique tokens):
 *
 *   put       lkv_client_put of the blocks: gRPC over loopback, one copy into the arena;
 *   inplace   lkv_client_reserve (with the mapped host arena: the reply gives the block
 *             addresses), memcpy of each block into its reserved page, lkv_client_commit;
 *             the lease is released after the timer stops (a worker keeps it while it uses the
 *             document for its prompt);
 *   memcpy    the same bytes copied between two buffers of this process: the floor of any
 *             store that must copy once.
 * --device (CUDA builds, a hot_backend=cuda daemon on this GPU): the KV is in device memory, as
 * a GPU worker computes it: put copies it to the host (cudaMemcpy) and sends it; inplace writes
 * it device-to-device into the reserved HBM pages through the arena's CUDA IPC mapping (opened
 * once) and commits; memcpy is one device-to-device copy. The first in-place document is read
 * back through the mapping and compared.
 * Each repetition runs the three in rotated order over --docs documents; after each document
 * the benchmark deletes it (untimed) so the hot tier never evicts, and waits for the write-back
 * queue to drain between rows so the writer's work does not leak into the next row. The table
 * shows the median over repetitions of the per-document median latency, GB/s of block payload
 * (1 GB = 1e9 B), and put / inplace; --json keeps every repetition.
 *
 *   inplace_bench --target HOST:PORT [--profile NAME] [--tokens N] [--docs N] [--reps N]
 *                 [--json PATH] [--device]
 * Exit status: 0, 1 on a failure, 2 on bad options.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lkv_client.h"
#include "lkv_err.h"

#ifdef LKV_INPLACE_CUDA
#include <cuda_runtime_api.h>
#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "inplace_bench: %s: %s\n", #x, cudaGetErrorString(e_));                \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#endif

#define MAX_REPS 64
#define MAX_DOCS 256

enum { M_PUT, M_INPLACE, M_MEMCPY, N_MODES };
static const char *const mode_name[N_MODES] = {"put", "inplace", "memcpy"};

typedef struct opts {
    const char *target;
    const char *profile;
    uint32_t tokens;
    int docs;
    int reps;
    const char *json;
    int device;
} opts;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "inplace_bench: %s: %s (%s): %s\n", what, lkv_strerror(rc), lkv_err_name(rc),
            lkv_client_last_error());
    exit(1);
}

/* Token ids of document (rep, doc, mode): unique per call, so every store is a new miss. */
static void make_tokens(uint32_t *t, uint32_t n, uint32_t vocab, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint32_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        t[i] = (uint32_t)(x % vocab);
    }
}

/* Waits until the daemon's write-back queue is empty. */
static void drain(lkv_client_t *c)
{
    for (int i = 0; i < 600; i++) {
        lkv_stat_entry *e = NULL;
        size_t n = 0;
        double pending = 0;
        if (lkv_client_stats_entries(c, "persistence", 0, &e, &n) == 0) {
            for (size_t k = 0; k < n; k++) {
                if (strcmp(e[k].key, "wb_pending") == 0) {
                    pending = e[k].value;
                }
            }
            free(e);
        }
        if (pending == 0) {
            return;
        }
        usleep(50 * 1000);
    }
}

int main(int argc, char **argv)
{
    opts o = {.profile = "llama-3.1-8b", .tokens = 512, .docs = 8, .reps = 5};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--device") == 0) {
#ifdef LKV_INPLACE_CUDA
            o.device = 1;
            continue;
#else
            fprintf(stderr, "inplace_bench: --device needs a CUDA build\n");
            return 2;
#endif
        }
        if (v == NULL) {
            fprintf(stderr, "inplace_bench: %s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "--target") == 0) {
            o.target = v;
        } else if (strcmp(a, "--profile") == 0) {
            o.profile = v;
        } else if (strcmp(a, "--tokens") == 0) {
            o.tokens = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--docs") == 0) {
            o.docs = atoi(v);
        } else if (strcmp(a, "--reps") == 0) {
            o.reps = atoi(v);
        } else if (strcmp(a, "--json") == 0) {
            o.json = v;
        } else {
            fprintf(stderr, "inplace_bench: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (o.target == NULL || o.tokens == 0 || o.docs < 1 || o.docs > MAX_DOCS || o.reps < 1 ||
        o.reps > MAX_REPS) {
        fprintf(stderr, "usage: inplace_bench --target HOST:PORT [--profile NAME] [--tokens N] "
                        "[--docs 1..256] [--reps 1..64] [--json PATH]\n");
        return 2;
    }
    lkv_client_options co = {.max_message_bytes = 64u << 20, .default_deadline_ms = 120000};
    lkv_client_t *c = NULL;
    int rc = lkv_client_create(o.target, &co, &c);
    if (rc != 0) {
        die("connect", rc);
    }
    /* Learn the layout from a first reservation (aborted, untimed). */
    uint32_t *tok = malloc(sizeof(uint32_t) * o.tokens);
    make_tokens(tok, o.tokens, 500, 999999);
    lkv_arena_map map;
    memset(&map, 0, sizeof map);
    lkv_reservation r;
    lkv_arena_map *mp = o.device ? NULL : &map;
    rc = lkv_client_reserve(c, o.profile, tok, o.tokens, NULL, 60000, 0, mp, 0, &r);
    if (rc != 0) {
        die("reserve (layout probe)", rc);
    }
    uint8_t *dev_arena = NULL; /* --device: the daemon's HBM arena, opened once. */
    uint8_t *dkv = NULL, *ddst = NULL;
#ifdef LKV_INPLACE_CUDA
    if (o.device) {
        if (strcmp(r.arena.backend, "cuda") != 0 || !r.arena.has_cuda_ipc) {
            fprintf(stderr, "inplace_bench: --device needs a hot_backend=cuda daemon (got %s)\n",
                    r.arena.backend);
            return 1;
        }
        CK(cudaSetDevice(r.arena.cuda_device));
        cudaIpcMemHandle_t h;
        memcpy(&h, r.arena.cuda_ipc, sizeof(h));
        CK(cudaIpcOpenMemHandle((void **)&dev_arena, h, cudaIpcMemLazyEnablePeerAccess));
    }
#endif
    size_t bb = (size_t)r.doc.block_bytes;
    uint32_t nb = r.doc.n_pages;
    uint32_t bt = r.doc.block_tokens;
    uint64_t page_bytes = r.doc.page_bytes;
    lkv_client_abort(c, r.lease_id, r.doc.key, 0);
    lkv_client_release(c, r.lease_id, 0, NULL);
    lkv_reservation_free(&r);
    size_t bytes = (size_t)nb * bb;
    uint8_t *kv = malloc(bytes), *dst = malloc(bytes);
    if (kv == NULL || dst == NULL) {
        fprintf(stderr, "inplace_bench: out of memory\n");
        return 1;
    }
    /* Deterministic KV with the zero tail the layout asks for. */
    for (size_t i = 0; i < bytes; i++) {
        kv[i] = (uint8_t)(i * 131 + 7);
    }
    uint32_t valid = o.tokens - (nb - 1) * bt;
    if (valid < bt) {
        /* A partial last block: its tail slots must be zero; zeroing the whole block is the
         * simplest valid content. */
        memset(kv + (size_t)(nb - 1) * bb, 0, bb);
    }
    memset(dst, 1, bytes);
#ifdef LKV_INPLACE_CUDA
    if (o.device) {
        CK(cudaMalloc((void **)&dkv, bytes));
        CK(cudaMalloc((void **)&ddst, bytes));
        CK(cudaMemcpy(dkv, kv, bytes, cudaMemcpyHostToDevice));
    }
    int checked = 0;
#endif
    static double lat[N_MODES][MAX_REPS][MAX_DOCS];
    static double rep_med[N_MODES][MAX_REPS];
    uint32_t vocab = strcmp(o.profile, "stories260k") == 0 ? 512 : 128000;
    uint64_t seq = (uint64_t)time(NULL) << 20;
    for (int rep = 0; rep < o.reps; rep++) {
        for (int k = 0; k < N_MODES; k++) {
            int m = (k + rep) % N_MODES;
            drain(c);
            for (int d = 0; d < o.docs; d++) {
                make_tokens(tok, o.tokens, vocab, ++seq);
                double t0 = now_s(), t1;
                if (m == M_PUT) {
                    lkv_put_reply pr;
#ifdef LKV_INPLACE_CUDA
                    if (o.device) {
                        CK(cudaMemcpy(dst, dkv, bytes, cudaMemcpyDeviceToHost));
                    }
#endif
                    rc = lkv_client_put(c, o.profile, tok, o.tokens, o.device ? dst : kv, nb, bb, 0,
                                        &pr);
                    t1 = now_s();
                    if (rc != 0) {
                        die("put", rc);
                    }
                } else if (m == M_INPLACE) {
                    rc = lkv_client_reserve(c, o.profile, tok, o.tokens, NULL, 60000, 0, mp, 0, &r);
                    if (rc != 0) {
                        die("reserve", rc);
                    }
                    for (uint32_t i = 0; i < nb && !o.device; i++) {
                        memcpy(r.addrs[i], kv + (size_t)i * bb, bb);
                    }
#ifdef LKV_INPLACE_CUDA
                    for (uint32_t i = 0; i < nb && o.device; i++) {
                        uint8_t *pg = dev_arena + r.doc.region_base +
                                      (uint64_t)r.doc.pages[i] * r.doc.page_bytes;
                        CK(cudaMemcpyAsync(pg, dkv + (size_t)i * bb, bb, cudaMemcpyDeviceToDevice,
                                           0));
                    }
                    if (o.device) {
                        CK(cudaStreamSynchronize(0));
                    }
#endif
                    rc = lkv_client_commit(c, r.lease_id, r.doc.key, 0, NULL, NULL);
                    t1 = now_s();
                    if (rc != 0) {
                        die("commit", rc);
                    }
#ifdef LKV_INPLACE_CUDA
                    if (o.device && !checked) {
                        /* Read back through the IPC mapping: the committed pages hold the KV. */
                        for (uint32_t i = 0; i < nb; i++) {
                            CK(cudaMemcpy(dst + (size_t)i * bb,
                                          dev_arena + r.doc.region_base +
                                              (uint64_t)r.doc.pages[i] * r.doc.page_bytes,
                                          bb, cudaMemcpyDeviceToHost));
                        }
                        if (memcmp(dst, kv, bytes) != 0) {
                            fprintf(stderr, "inplace_bench: HBM pages differ from the KV\n");
                            return 1;
                        }
                        printf("inplace_bench: read back %u HBM pages (first %u) through the IPC "
                               "mapping: identical\n",
                               nb, r.doc.pages[0]);
                        checked = 1;
                    }
#endif
                    lkv_client_release(c, r.lease_id, 0, NULL);
                    lkv_reservation_free(&r);
                } else if (!o.device) {
                    for (uint32_t i = 0; i < nb; i++) {
                        memcpy(dst + (size_t)i * bb, kv + (size_t)i * bb, bb);
                    }
                    t1 = now_s();
                    if (dst[bytes / 2] != kv[bytes / 2]) {
                        return 1;
                    }
                } else {
#ifdef LKV_INPLACE_CUDA
                    CK(cudaMemcpyAsync(ddst, dkv, bytes, cudaMemcpyDeviceToDevice, 0));
                    CK(cudaStreamSynchronize(0));
#endif
                    t1 = now_s();
                }
                lat[m][rep][d] = t1 - t0;
                if (m != M_MEMCPY) {
                    lkv_docref ref = {.profile = o.profile, .tokens = tok, .n_tokens = o.tokens};
                    lkv_client_delete(c, &ref, 0, NULL);
                }
            }
            double tmp[MAX_DOCS];
            memcpy(tmp, lat[m][rep], sizeof(double) * (size_t)o.docs);
            rep_med[m][rep] = median(tmp, o.docs);
        }
    }
    double med[N_MODES];
    for (int m = 0; m < N_MODES; m++) {
        double tmp[MAX_REPS];
        memcpy(tmp, rep_med[m], sizeof(double) * (size_t)o.reps);
        med[m] = median(tmp, o.reps);
    }
    printf("inplace_bench: profile %s, %u tokens = %u blocks of %zu bytes (pages of %" PRIu64
           "), %.1f MiB per document, %d docs x %d reps, KV in %s memory\n",
           o.profile, o.tokens, nb, bb, page_bytes, (double)bytes / (1 << 20), o.docs, o.reps,
           o.device ? "device (HBM arena via CUDA IPC)" : "host");
    printf("%-10s %14s %12s %16s\n", "mode", "ms/document", "GB/s", "put / this");
    for (int m = 0; m < N_MODES; m++) {
        printf("%-10s %14.3f %12.2f %16.2f\n", mode_name[m], med[m] * 1e3,
               (double)bytes / med[m] / 1e9, med[M_PUT] / med[m]);
    }
    if (o.json != NULL) {
        FILE *f = fopen(o.json, "w");
        if (f == NULL) {
            perror(o.json);
            return 1;
        }
        fprintf(f,
                "{\"bench\": \"inplace\", \"profile\": \"%s\", \"tokens\": %u, \"blocks\": %u, "
                "\"block_bytes\": %zu, \"page_bytes\": %" PRIu64 ", \"doc_bytes\": %zu, "
                "\"docs\": %d, \"reps\": %d, \"device\": %d, \"modes\": {",
                o.profile, o.tokens, nb, bb, page_bytes, bytes, o.docs, o.reps, o.device);
        for (int m = 0; m < N_MODES; m++) {
            fprintf(f, "%s\"%s\": {\"median_s\": %.9f, \"gbps\": %.4f, \"reps_median_s\": [",
                    m ? ", " : "", mode_name[m], med[m], (double)bytes / med[m] / 1e9);
            for (int rep = 0; rep < o.reps; rep++) {
                fprintf(f, "%s%.9f", rep ? ", " : "", rep_med[m][rep]);
            }
            fprintf(f, "]}");
        }
        fprintf(f, "}, \"put_over_inplace\": %.4f}\n", med[M_PUT] / med[M_INPLACE]);
        fclose(f);
    }
    lkv_arena_map_close(&map);
#ifdef LKV_INPLACE_CUDA
    if (o.device) {
        cudaFree(dkv);
        cudaFree(ddst);
        cudaIpcCloseMemHandle(dev_arena);
    }
#endif
    (void)dev_arena;
    (void)dkv;
    (void)ddst;
    free(kv);
    free(dst);
    free(tok);
    lkv_client_destroy(c);
    return 0;
}
