/*
 * ipc_reader.c: the "second process" of the zero-copy lease check on a GPU host (issue 4,
 * item 2; run by bench/gpu/ipc_check.sh). Built only when CUDA is available (LKV_HAVE_CUDA).
 *
 * It does what a co-located decode worker does with an Attach reply from a daemon whose hot
 * arena is in HBM: opens the arena through its CUDA IPC handle (cudaIpcOpenMemHandle, once),
 * then reads the attached documents' blocks in place at region_base + page * page_bytes (the
 * arena contract, DESIGN.md 4), copying each back to
 * the host and comparing it byte for byte with the bytes that were put (a file of the blocks,
 * concatenated in page-list order).
 *
 *     ipc_reader IPC_HEX DEVICE PAGE_BYTES N_PAGES BLOCK_BYTES PAGES EXPECT_FILE
 *
 * IPC_HEX is the 64-byte cudaIpcMemHandle_t as 128 hex digits; PAGES a comma list. Prints the
 * device, the mapping time and "OK n blocks ..." or the first mismatch. Exit status: 0 all
 * equal, 1 mismatch, 2 usage, CUDA or I/O error (printed with the CUDA error string).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#define CK(expr)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "ipc_reader: %s failed: %s\n", #expr, cudaGetErrorString(e_));         \
            return 2;                                                                              \
        }                                                                                          \
    } while (0)

static int hexval(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc != 9) {
        fprintf(stderr,
                "usage: %s IPC_HEX DEVICE REGION_BASE PAGE_BYTES N_PAGES BLOCK_BYTES PAGES "
                "EXPECT_FILE\n",
                argv[0]);
        return 2;
    }
    cudaIpcMemHandle_t h;
    if (strlen(argv[1]) != 2 * sizeof(h)) {
        fprintf(stderr, "ipc_reader: IPC_HEX must be %zu hex digits\n", 2 * sizeof(h));
        return 2;
    }
    unsigned char *hb = (unsigned char *)&h;
    for (size_t i = 0; i < sizeof(h); i++) {
        int a = hexval(argv[1][2 * i]), b = hexval(argv[1][2 * i + 1]);
        if (a < 0 || b < 0) {
            fprintf(stderr, "ipc_reader: IPC_HEX is not hex\n");
            return 2;
        }
        hb[i] = (unsigned char)(a * 16 + b);
    }
    int dev = atoi(argv[2]);
    uint64_t region_base = strtoull(argv[3], NULL, 10);
    uint64_t page_bytes = strtoull(argv[4], NULL, 10);
    uint64_t n_pages = strtoull(argv[5], NULL, 10);
    uint64_t block_bytes = strtoull(argv[6], NULL, 10);
    if (page_bytes == 0 || n_pages == 0 || block_bytes == 0 || block_bytes > page_bytes) {
        fprintf(stderr, "ipc_reader: bad sizes\n");
        return 2;
    }
    CK(cudaSetDevice(dev));
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    double t0 = now_s();
    void *arena = NULL;
    CK(cudaIpcOpenMemHandle(&arena, h, cudaIpcMemLazyEnablePeerAccess));
    double t1 = now_s();
    printf("device %d (%s): arena mapped at %p in %.3f ms (%" PRIu64 " pages of %" PRIu64
           " bytes)\n",
           dev, prop.name, arena, (t1 - t0) * 1e3, n_pages, page_bytes);
    FILE *f = fopen(argv[8], "rb");
    if (f == NULL) {
        perror(argv[8]);
        return 2;
    }
    unsigned char *want = malloc(block_bytes), *got = malloc(block_bytes);
    if (want == NULL || got == NULL) {
        return 2;
    }
    int rc = 0;
    uint64_t n = 0;
    double copy_s = 0;
    char *list = strdup(argv[7]);
    for (char *tok = strtok(list, ","); tok != NULL; tok = strtok(NULL, ","), n++) {
        uint64_t page = strtoull(tok, NULL, 10);
        if (page >= n_pages || fread(want, 1, block_bytes, f) != block_bytes) {
            fprintf(stderr, "ipc_reader: page %" PRIu64 " out of range or expect file short\n",
                    page);
            rc = 2;
            break;
        }
        double c0 = now_s();
        CK(cudaMemcpy(got, (const unsigned char *)arena + region_base + page * page_bytes,
                      block_bytes, cudaMemcpyDeviceToHost));
        copy_s += now_s() - c0;
        if (memcmp(got, want, block_bytes) != 0) {
            uint64_t off = 0;
            while (got[off] == want[off]) {
                off++;
            }
            printf("MISMATCH block %" PRIu64 " (page %" PRIu64 ") at byte %" PRIu64
                   ": got %02x want %02x\n",
                   n, page, off, got[off], want[off]);
            rc = 1;
            break;
        }
    }
    if (rc == 0) {
        printf("OK %" PRIu64 " blocks of %" PRIu64 " bytes equal in place (D2H copies %.3f ms)\n",
               n, block_bytes, copy_s * 1e3);
    }
    CK(cudaIpcCloseMemHandle(arena));
    free(list);
    free(want);
    free(got);
    fclose(f);
    return rc;
}
