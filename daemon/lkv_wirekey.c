/*
 * lkv_wirekey.c: the per-tenant key permutation (see lkv_wirekey.h).
 *
 * Feistel, 4 rounds, halves L (bytes 0..15) and R (bytes 16..31):
 *     encode round i = 0..3:  (L, R) <- (R, L xor F(i, R))
 *     decode round i = 3..0:  (L, R) <- (R xor F(i, L), L)
 * F(i, x) = BLAKE2b-128(key = k, message = i || x).
 */
#include "lkv_wirekey.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "lkv_err.h"
#include "lkv_log.h"

#define HALF   16
#define ROUNDS 4

static void round_f(const uint8_t k[32], uint8_t i, const uint8_t x[HALF], uint8_t out[HALF])
{
    uint8_t msg[1 + HALF];
    msg[0] = i;
    memcpy(msg + 1, x, HALF);
    crypto_generichash(out, HALF, msg, sizeof(msg), k, 32);
}

void lkv_wirekey_init(lkv_wirekey *w, const uint8_t secret[LKV_WIREKEY_SECRET_BYTES],
                      const uint8_t salt[LKV_SALT_BYTES], int identity)
{
    static const char label[] = "lazykv wire key v1";
    uint8_t msg[sizeof(label) + LKV_SALT_BYTES];
    memset(w, 0, sizeof(*w));
    w->identity = identity != 0;
    if (w->identity) {
        return;
    }
    memcpy(msg, label, sizeof(label));
    memcpy(msg + sizeof(label), salt, LKV_SALT_BYTES);
    crypto_generichash(w->k, sizeof(w->k), msg, sizeof(msg), secret, LKV_WIREKEY_SECRET_BYTES);
}

void lkv_wirekey_encode(const lkv_wirekey *w, const lkv_dockey *stored, uint8_t wire[32])
{
    if (w->identity) {
        memcpy(wire, stored->b, 32);
        return;
    }
    uint8_t l[HALF], r[HALF], f[HALF];
    memcpy(l, stored->b, HALF);
    memcpy(r, stored->b + HALF, HALF);
    for (uint8_t i = 0; i < ROUNDS; i++) {
        round_f(w->k, i, r, f);
        for (int j = 0; j < HALF; j++) {
            f[j] ^= l[j];
        }
        memcpy(l, r, HALF);
        memcpy(r, f, HALF);
    }
    memcpy(wire, l, HALF);
    memcpy(wire + HALF, r, HALF);
}

void lkv_wirekey_decode(const lkv_wirekey *w, const uint8_t wire[32], lkv_dockey *stored)
{
    if (w->identity) {
        memcpy(stored->b, wire, 32);
        return;
    }
    uint8_t l[HALF], r[HALF], f[HALF];
    memcpy(l, wire, HALF);
    memcpy(r, wire + HALF, HALF);
    for (int i = ROUNDS - 1; i >= 0; i--) {
        round_f(w->k, (uint8_t)i, l, f);
        for (int j = 0; j < HALF; j++) {
            f[j] ^= r[j];
        }
        memcpy(r, l, HALF);
        memcpy(l, f, HALF);
    }
    memcpy(stored->b, l, HALF);
    memcpy(stored->b + HALF, r, HALF);
}

int lkv_wirekey_secret_load(const char *dir, uint8_t secret[LKV_WIREKEY_SECRET_BYTES])
{
    char path[1200];
    snprintf(path, sizeof(path), "%s/wirekey.secret", dir);
    if (sodium_init() < 0) {
        return LKV_EIO;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        uint8_t fresh[LKV_WIREKEY_SECRET_BYTES];
        randombytes_buf(fresh, sizeof(fresh));
        char tmp[1220];
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        int wfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (wfd < 0 || write(wfd, fresh, sizeof(fresh)) != (ssize_t)sizeof(fresh) ||
            fsync(wfd) != 0 || close(wfd) != 0 || rename(tmp, path) != 0) {
            LKV_LOGE("cannot create %s: %s", path, strerror(errno));
            return LKV_EIO;
        }
        sodium_memzero(fresh, sizeof(fresh));
        LKV_LOGI("created the wire-key secret %s", path);
        fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) {
        LKV_LOGE("cannot read %s: %s", path, strerror(errno));
        return LKV_EIO;
    }
    ssize_t n = read(fd, secret, LKV_WIREKEY_SECRET_BYTES);
    uint8_t extra;
    ssize_t more = read(fd, &extra, 1);
    close(fd);
    if (n != LKV_WIREKEY_SECRET_BYTES || more != 0) {
        LKV_LOGE("%s is not exactly %d bytes (delete it to make a new one; keys clients saved "
                 "then change)",
                 path, LKV_WIREKEY_SECRET_BYTES);
        return LKV_EIO;
    }
    return 0;
}

int lkv_wirekey_secret_load_shared(const char *path, const char *dir,
                                   uint8_t secret[LKV_WIREKEY_SECRET_BYTES])
{
    if (sodium_init() < 0) {
        return LKV_EIO;
    }
    FILE *f = fopen(path, "r");
    char hex[130];
    size_t n = 0;
    if (f != NULL) {
        n = fread(hex, 1, sizeof(hex) - 1, f);
        fclose(f);
    }
    hex[n] = '\0';
    while (n > 0 && (hex[n - 1] == '\n' || hex[n - 1] == '\r' || hex[n - 1] == ' ')) {
        hex[--n] = '\0';
    }
    size_t got = 0;
    if (f == NULL || n != 2 * LKV_WIREKEY_SECRET_BYTES ||
        sodium_hex2bin(secret, LKV_WIREKEY_SECRET_BYTES, hex, n, NULL, &got, NULL) != 0 ||
        got != LKV_WIREKEY_SECRET_BYTES) {
        LKV_LOGE("option 'wirekey_secret_file': %s must hold %d hex digits (e.g. "
                 "python3 -c 'import secrets; print(secrets.token_hex(32))')",
                 path, 2 * LKV_WIREKEY_SECRET_BYTES);
        sodium_memzero(hex, sizeof(hex));
        return LKV_EIO;
    }
    sodium_memzero(hex, sizeof(hex));
    /* A data dir with its own secret: the shared one wins; say what that costs. */
    char own[1200];
    snprintf(own, sizeof(own), "%s/wirekey.secret", dir);
    int fd = open(own, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        uint8_t old[LKV_WIREKEY_SECRET_BYTES];
        ssize_t r = read(fd, old, sizeof(old));
        close(fd);
        if (r == (ssize_t)sizeof(old) && sodium_memcmp(old, secret, sizeof(old)) != 0) {
            LKV_LOGW("%s differs from the shared wire-key secret (%s), which is used: wire keys "
                     "handed out before no longer name their documents (documents named by "
                     "tokens are unaffected); the file is kept",
                     own, path);
        }
        sodium_memzero(old, sizeof(old));
    }
    return 0;
}
