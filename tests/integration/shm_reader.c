/*
 * shm_reader.c: the "second process" of the zero-copy lease test on a CPU host.
 *
 * It does what a co-located decode worker does with an Attach reply: shm_open()s the daemon's
 * hot arena by name (read-only), mmap()s all of it (ArenaInfo.arena_bytes) once, and reads the
 * attached documents' blocks in place at region_base + page * page_bytes (the arena contract,
 * DESIGN.md 4: the document's region's base offset and page size, from AttachedDoc.region). It
 * compares each block byte for byte with the bytes the test put (a file of the documents'
 * blocks, concatenated in the order of the page list).
 *
 *     shm_reader SHM_NAME ARENA_BYTES REGION_BASE PAGE_BYTES REGION_PAGES BLOCK_BYTES PAGES
 *                EXPECT_FILE
 *
 * PAGES is a comma list of pages of that region ("7,8,12"); EXPECT_FILE holds len(PAGES) *
 * BLOCK_BYTES bytes. Exit status: 0 every block matches, 1 a mismatch (the first one is printed), 2
 * usage or system errors (e.g. the shm object cannot be opened: printed with errno text).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 9) {
        fprintf(stderr,
                "usage: %s SHM_NAME ARENA_BYTES REGION_BASE PAGE_BYTES REGION_PAGES BLOCK_BYTES "
                "PAGES EXPECT_FILE\n",
                argv[0]);
        return 2;
    }
    const char *name = argv[1];
    uint64_t arena_bytes = strtoull(argv[2], NULL, 10);
    uint64_t region_base = strtoull(argv[3], NULL, 10);
    uint64_t page_bytes = strtoull(argv[4], NULL, 10);
    uint64_t n_pages = strtoull(argv[5], NULL, 10);
    uint64_t block_bytes = strtoull(argv[6], NULL, 10);
    const char *pages_arg = argv[7], *expect = argv[8];
    if (page_bytes == 0 || n_pages == 0 || block_bytes == 0 || block_bytes > page_bytes ||
        region_base % (2u << 20) != 0 || region_base + page_bytes * n_pages > arena_bytes) {
        fprintf(stderr, "shm_reader: bad sizes (the region must lie inside the arena)\n");
        return 2;
    }
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0) {
        fprintf(stderr, "shm_reader: shm_open(%s): %s\n", name, strerror(errno));
        return 2;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < arena_bytes) {
        fprintf(stderr, "shm_reader: %s is smaller than %" PRIu64 " bytes\n", name, arena_bytes);
        return 2;
    }
    printf("shm %s mode %o size %" PRIu64 "\n", name, (unsigned)(sb.st_mode & 0777),
           (uint64_t)sb.st_size);
    const uint8_t *arena = mmap(NULL, arena_bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (arena == MAP_FAILED) {
        fprintf(stderr, "shm_reader: mmap: %s\n", strerror(errno));
        return 2;
    }
    FILE *f = fopen(expect, "rb");
    if (f == NULL) {
        fprintf(stderr, "shm_reader: %s: %s\n", expect, strerror(errno));
        return 2;
    }
    uint8_t *want = malloc(block_bytes);
    if (want == NULL) {
        return 2;
    }
    int rc = 0;
    uint64_t n = 0;
    char *list = strdup(pages_arg);
    for (char *tok = strtok(list, ","); tok != NULL; tok = strtok(NULL, ","), n++) {
        uint64_t page = strtoull(tok, NULL, 10);
        if (page >= n_pages) {
            fprintf(stderr, "shm_reader: page %" PRIu64 " out of range\n", page);
            rc = 2;
            break;
        }
        if (fread(want, 1, block_bytes, f) != block_bytes) {
            fprintf(stderr, "shm_reader: %s is short\n", expect);
            rc = 2;
            break;
        }
        const uint8_t *got = arena + region_base + page * page_bytes;
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
        printf("OK %" PRIu64 " blocks of %" PRIu64 " bytes equal in place\n", n, block_bytes);
    }
    free(list);
    free(want);
    fclose(f);
    munmap((void *)arena, arena_bytes);
    return rc;
}
