/*
 * lkv_kvfile.c: reading and writing KV files (format in lkv_kvfile.h).
 *
 * Reading is defensive: every length in the header is checked against the file size before
 * anything is allocated, so a corrupt or hostile file yields LKV_ECORRUPT, never a huge
 * allocation or an out-of-bounds read. Writing goes through "<path>.tmp.<pid>" and rename(2).
 */
#include "lkv_kvfile.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lkv_err.h"
#include "lkv_log.h"

#define HDR_BYTES   40u
#define FLAG_TOKENS 1u

static void seterr(char *err, int errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void seterr(char *err, int errlen, const char *fmt, ...)
{
    if (err == NULL || errlen <= 0) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, (size_t)errlen, fmt, ap);
    va_end(ap);
}

static uint64_t pad8(uint64_t n)
{
    return (n + 7u) & ~(uint64_t)7u;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static int name_ok(const char *s, size_t n)
{
    if (n < 1 || n > LKV_KVFILE_NAME_MAX) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-')) {
            return 0;
        }
    }
    return 1;
}

int lkv_kvfile_check(const lkv_kvfile *kf, char *err, int errlen)
{
    if (!name_ok(kf->profile, strnlen(kf->profile, sizeof(kf->profile)))) {
        seterr(err, errlen, "profile name must be 1..%d characters of [A-Za-z0-9._-]",
               LKV_KVFILE_NAME_MAX);
        return LKV_EINVAL;
    }
    if (kf->n_tokens == 0) {
        seterr(err, errlen, "a document needs at least one token");
        return LKV_EINVAL;
    }
    if (kf->n_blocks == 0 || kf->block_bytes == 0 || kf->blocks == NULL) {
        seterr(err, errlen, "a document needs at least one non-empty block");
        return LKV_EINVAL;
    }
    if (kf->block_bytes > (UINT64_MAX / 2) / kf->n_blocks) {
        seterr(err, errlen, "n_blocks * block_bytes overflows");
        return LKV_EINVAL;
    }
    return 0;
}

void lkv_kvfile_free(lkv_kvfile *kf)
{
    if (kf == NULL) {
        return;
    }
    free(kf->tokens);
    free(kf->blocks);
    memset(kf, 0, sizeof(*kf));
}

/* Reads exactly n bytes; returns 0, or -1 on error or short file (errno 0 for EOF). */
static int read_full(FILE *f, void *buf, size_t n)
{
    if (n == 0) {
        return 0;
    }
    errno = 0;
    return fread(buf, 1, n, f) == n ? 0 : -1;
}

/* 1 if p[0..n) are all zero bytes. */
static int zeros(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != 0) {
            return 0;
        }
    }
    return 1;
}

int lkv_kvfile_read(const char *path, lkv_kvfile *out, char *err, int errlen)
{
    int rc = 0;
    memset(out, 0, sizeof(*out));
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        seterr(err, errlen, "%s: %s", path, strerror(errno));
        return LKV_EIO;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        seterr(err, errlen, "%s: %s", path, strerror(errno));
        rc = LKV_EIO;
        goto out;
    }
    uint64_t fsize = (uint64_t)st.st_size;
    uint8_t hdr[HDR_BYTES];
    if (fsize < HDR_BYTES || read_full(f, hdr, HDR_BYTES) != 0) {
        seterr(err, errlen, "%s: too short for a KV file header", path);
        rc = LKV_ECORRUPT;
        goto out;
    }
    if (memcmp(hdr, LKV_KVFILE_MAGIC, 8) != 0) {
        seterr(err, errlen, "%s: not a KV file (bad magic)", path);
        rc = LKV_ECORRUPT;
        goto out;
    }
    uint32_t version = get_u32(hdr + 8);
    if (version != LKV_KVFILE_VERSION) {
        seterr(err, errlen, "%s: KV file version %u, this build reads %u", path, version,
               LKV_KVFILE_VERSION);
        rc = LKV_ECORRUPT;
        goto out;
    }
    uint32_t flags = get_u32(hdr + 12);
    uint32_t name_len = get_u32(hdr + 16);
    uint32_t n_tokens = get_u32(hdr + 20);
    uint32_t n_blocks = get_u32(hdr + 24);
    uint64_t block_bytes = get_u64(hdr + 32);
    int has_tokens = (flags & FLAG_TOKENS) != 0;
    if ((flags & ~FLAG_TOKENS) != 0 || get_u32(hdr + 28) != 0) {
        seterr(err, errlen, "%s: unknown flags %#x in header", path, flags);
        rc = LKV_ECORRUPT;
        goto out;
    }
    if (name_len < 1 || name_len > LKV_KVFILE_NAME_MAX || n_tokens == 0 || n_blocks == 0 ||
        block_bytes == 0 || block_bytes > fsize / n_blocks) {
        seterr(err, errlen,
               "%s: bad header (name length %u, %u tokens, %u blocks, %llu bytes per block)", path,
               name_len, n_tokens, n_blocks, (unsigned long long)block_bytes);
        rc = LKV_ECORRUPT;
        goto out;
    }
    uint64_t tok_off = HDR_BYTES + pad8(name_len);
    uint64_t data_off = tok_off + (has_tokens ? pad8((uint64_t)n_tokens * 4u) : 0);
    uint64_t want = data_off + (uint64_t)n_blocks * block_bytes; /* <= data_off + fsize. */
    if (want != fsize) {
        seterr(err, errlen, "%s: file is %llu bytes, header says %llu", path,
               (unsigned long long)fsize, (unsigned long long)want);
        rc = LKV_ECORRUPT;
        goto out;
    }
    uint8_t name_buf[LKV_KVFILE_NAME_MAX + 1];
    if (read_full(f, name_buf, (size_t)pad8(name_len)) != 0) {
        goto short_read;
    }
    memcpy(out->profile, name_buf, name_len);
    out->profile[name_len] = '\0';
    /* Padding must be zero: a file has one form (found by tests/fuzz/fuzz_kvfile). */
    if (!name_ok(out->profile, name_len) ||
        !zeros(name_buf + name_len, pad8(name_len) - name_len)) {
        seterr(err, errlen, "%s: bad profile name in header (or non-zero padding after it)", path);
        rc = LKV_ECORRUPT;
        goto out;
    }
    if (has_tokens) {
        size_t tok_bytes = (size_t)pad8((uint64_t)n_tokens * 4u);
        uint8_t *tb = lkv_xmalloc(tok_bytes);
        if (read_full(f, tb, tok_bytes) != 0) {
            free(tb);
            goto short_read;
        }
        if (!zeros(tb + 4 * (size_t)n_tokens, tok_bytes - 4 * (size_t)n_tokens)) {
            free(tb);
            seterr(err, errlen, "%s: non-zero padding after the token ids", path);
            rc = LKV_ECORRUPT;
            goto out;
        }
        out->tokens = lkv_xmalloc((size_t)n_tokens * sizeof(uint32_t));
        for (uint32_t i = 0; i < n_tokens; i++) {
            out->tokens[i] = get_u32(tb + 4 * (size_t)i);
        }
        free(tb);
    }
    out->n_tokens = n_tokens;
    out->n_blocks = n_blocks;
    out->block_bytes = block_bytes;
    out->blocks = lkv_xmalloc((size_t)(n_blocks * block_bytes));
    if (read_full(f, out->blocks, (size_t)(n_blocks * block_bytes)) != 0) {
        goto short_read;
    }
    goto out;
short_read:
    seterr(err, errlen, "%s: read failed: %s", path, errno ? strerror(errno) : "short file");
    rc = errno ? LKV_EIO : LKV_ECORRUPT;
out:
    fclose(f);
    if (rc != 0) {
        lkv_kvfile_free(out);
    }
    return rc;
}

int lkv_kvfile_write(const char *path, const lkv_kvfile *kf, char *err, int errlen)
{
    int rc = lkv_kvfile_check(kf, err, errlen);
    if (rc != 0) {
        return rc;
    }
    size_t name_len = strlen(kf->profile);
    /* A regular file is written to a temporary name and renamed over path, so a reader never
     * sees half a file. Anything else that exists (/dev/null, /dev/stdout, a FIFO) is written
     * in place: renaming over it would replace the device with a regular file. */
    struct stat stt;
    int direct = stat(path, &stt) == 0 && !S_ISREG(stt.st_mode);
    size_t tmp_len = strlen(path) + 32;
    char *tmp = lkv_xmalloc(tmp_len);
    snprintf(tmp, tmp_len, direct ? "%s" : "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (f == NULL) {
        seterr(err, errlen, "%s: %s", tmp, strerror(errno));
        free(tmp);
        return LKV_EIO;
    }
    uint8_t hdr[HDR_BYTES];
    memcpy(hdr, LKV_KVFILE_MAGIC, 8);
    put_u32(hdr + 8, LKV_KVFILE_VERSION);
    put_u32(hdr + 12, kf->tokens != NULL ? FLAG_TOKENS : 0);
    put_u32(hdr + 16, (uint32_t)name_len);
    put_u32(hdr + 20, kf->n_tokens);
    put_u32(hdr + 24, kf->n_blocks);
    put_u32(hdr + 28, 0);
    put_u64(hdr + 32, kf->block_bytes);
    uint8_t name_buf[LKV_KVFILE_NAME_MAX + 1];
    memset(name_buf, 0, sizeof(name_buf));
    memcpy(name_buf, kf->profile, name_len);
    size_t tok_bytes = kf->tokens != NULL ? (size_t)pad8((uint64_t)kf->n_tokens * 4u) : 0;
    uint8_t *tb = lkv_xcalloc(tok_bytes + 1, 1);
    for (uint32_t i = 0; kf->tokens != NULL && i < kf->n_tokens; i++) {
        put_u32(tb + 4 * (size_t)i, kf->tokens[i]);
    }
    size_t data_bytes = (size_t)(kf->n_blocks * kf->block_bytes);
    int ok = fwrite(hdr, 1, HDR_BYTES, f) == HDR_BYTES &&
             fwrite(name_buf, 1, (size_t)pad8(name_len), f) == (size_t)pad8(name_len) &&
             fwrite(tb, 1, tok_bytes, f) == tok_bytes &&
             fwrite(kf->blocks, 1, data_bytes, f) == data_bytes;
    free(tb);
    if (fclose(f) != 0) {
        ok = 0;
    }
    if (!ok || (!direct && rename(tmp, path) != 0)) {
        seterr(err, errlen, "%s: write failed: %s", path, strerror(errno));
        if (!direct) {
            unlink(tmp);
        }
        rc = LKV_EIO;
    }
    free(tmp);
    return rc;
}
