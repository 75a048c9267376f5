/*
 * fuzz_kvfile.c: libFuzzer target for the KV file reader (client/lkv_kvfile.c, what
 * `lazykv put FILE` reads). The input is the file. Oracles: the reader returns 0 or a
 * documented code with a message; an accepted file passes lkv_kvfile_check, and writing it
 * back and reading that gives the same fields and bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "lkv_err.h"
#include "lkv_kvfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_memfd_path(data, size);
    lkv_kvfile kf;
    char err[256];
    err[0] = '\0';
    int rc = lkv_kvfile_read(path, &kf, err, sizeof(err));
    if (rc != 0) {
        if ((rc != LKV_ECORRUPT && rc != LKV_EINVAL && rc != LKV_EIO) || err[0] == '\0') {
            abort();
        }
        return 0;
    }
    if (lkv_kvfile_check(&kf, err, sizeof(err)) != 0) {
        abort(); /* The reader accepted what the checker refuses. */
    }
    /* The accepted file must be exactly its canonical form: write it out and compare. */
    char tmp[] = "/tmp/lkv-fuzz-kvfile-XXXXXX";
    int fd = mkstemp(tmp);
    if (fd >= 0) {
        close(fd);
        if (lkv_kvfile_write(tmp, &kf, err, sizeof(err)) != 0) {
            abort();
        }
        FILE *f = fopen(tmp, "rb");
        uint8_t *back = malloc(size + 1);
        size_t got = f != NULL ? fread(back, 1, size + 1, f) : 0;
        if (f != NULL) {
            fclose(f);
        }
        if (got != size || memcmp(back, data, size) != 0) {
            abort(); /* Two files read as the same document. */
        }
        free(back);
        unlink(tmp);
    }
    lkv_kvfile_free(&kf);
    return 0;
}
