/*
 * test_kvfile.c: client.kvfile. KV files round-trip (with and without token ids), and every
 * kind of damage (bad magic, version, flags, lengths, truncation, trailing bytes) is refused
 * with LKV_ECORRUPT and a message, never a crash or a huge allocation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lkv_kvfile.h"
#include "lkv_test.h"

static char path[256];

static void make(lkv_kvfile *kf, int with_tokens)
{
    memset(kf, 0, sizeof(*kf));
    snprintf(kf->profile, sizeof(kf->profile), "llama-3.1-8b");
    kf->n_tokens = 37;
    kf->tokens = with_tokens ? malloc(37 * sizeof(uint32_t)) : NULL;
    for (uint32_t i = 0; with_tokens && i < 37; i++) {
        kf->tokens[i] = i * 7919u;
    }
    kf->n_blocks = 3;
    kf->block_bytes = 1000;
    kf->blocks = malloc(3000);
    for (int i = 0; i < 3000; i++) {
        kf->blocks[i] = (uint8_t)(i * 31 + 7);
    }
}

static long fsize(void)
{
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

static void test_roundtrip(void)
{
    for (int with = 0; with < 2; with++) {
        lkv_kvfile a, b;
        make(&a, with);
        char err[256];
        ASSERT_OK(lkv_kvfile_write(path, &a, err, sizeof(err)));
        /* 40 header + 16 name + (37*4 -> 152 tokens) + 3000 blocks */
        ASSERT_EQ(fsize(), 40 + 16 + (with ? 152 : 0) + 3000);
        ASSERT_OK(lkv_kvfile_read(path, &b, err, sizeof(err)));
        ASSERT_TRUE(strcmp(a.profile, b.profile) == 0);
        ASSERT_EQ(a.n_tokens, b.n_tokens);
        ASSERT_EQ(a.n_blocks, b.n_blocks);
        ASSERT_EQ(a.block_bytes, b.block_bytes);
        ASSERT_EQ(b.tokens != NULL, with);
        if (with) {
            ASSERT_TRUE(memcmp(a.tokens, b.tokens, 37 * 4) == 0);
        }
        ASSERT_TRUE(memcmp(a.blocks, b.blocks, 3000) == 0);
        lkv_kvfile_free(&a);
        lkv_kvfile_free(&b);
    }
}

/* Overwrites len bytes at off with val, expects the read to fail with code and a message. */
static void damage(long off, const void *val, size_t len, long truncate_to, int code)
{
    lkv_kvfile a, b;
    make(&a, 1);
    char err[256] = "";
    ASSERT_OK(lkv_kvfile_write(path, &a, err, sizeof(err)));
    lkv_kvfile_free(&a);
    if (val != NULL) {
        FILE *f = fopen(path, "r+b");
        fseek(f, off, SEEK_SET);
        fwrite(val, 1, len, f);
        fclose(f);
    }
    if (truncate_to >= 0) {
        ASSERT_EQ(truncate(path, truncate_to), 0);
    }
    err[0] = '\0';
    ASSERT_ERR(lkv_kvfile_read(path, &b, err, sizeof(err)), code);
    ASSERT_TRUE(err[0] != '\0');
    ASSERT_TRUE(b.blocks == NULL && b.tokens == NULL);
    fprintf(stderr, "   refused: %s\n", err);
}

static void test_damage(void)
{
    uint32_t big = 0xffffffffu, zero = 0, two = 2, badflag = 6;
    uint64_t huge = 1ull << 40;
    damage(0, "LKVKV2", 6, -1, LKV_ECORRUPT);               /* magic */
    damage(8, &two, 4, -1, LKV_ECORRUPT);                   /* version */
    damage(12, &badflag, 4, -1, LKV_ECORRUPT);              /* flags */
    damage(16, &big, 4, -1, LKV_ECORRUPT);                  /* name length */
    damage(16, &zero, 4, -1, LKV_ECORRUPT);                 /* empty name */
    damage(20, &big, 4, -1, LKV_ECORRUPT);                  /* token count */
    damage(24, &big, 4, -1, LKV_ECORRUPT);                  /* block count */
    damage(32, &huge, 8, -1, LKV_ECORRUPT);                 /* block bytes */
    damage(40, "ll/ma", 5, -1, LKV_ECORRUPT);               /* name charset */
    damage(0, NULL, 0, 3000, LKV_ECORRUPT);                 /* truncated */
    damage(0, NULL, 0, 20, LKV_ECORRUPT);                   /* truncated header */
    damage(0, NULL, 0, 40 + 16 + 152 + 3001, LKV_ECORRUPT); /* trailing byte */
    /* Non-zero padding: one file, one form (tests/fuzz/fuzz_kvfile found these accepted). */
    damage(40 + 12, "\x40", 1, -1, LKV_ECORRUPT);       /* after the 12-byte name */
    damage(40 + 16 + 148, "\x01", 1, -1, LKV_ECORRUPT); /* after the 37 token ids */
    lkv_kvfile b;
    char err[256];
    ASSERT_ERR(lkv_kvfile_read("/nonexistent/x.kv", &b, err, sizeof(err)), LKV_EIO);
}

static void test_check(void)
{
    lkv_kvfile a;
    make(&a, 1);
    char err[256];
    snprintf(a.profile, sizeof(a.profile), "bad name");
    ASSERT_ERR(lkv_kvfile_write(path, &a, err, sizeof(err)), LKV_EINVAL);
    snprintf(a.profile, sizeof(a.profile), "ok");
    a.n_blocks = 0;
    ASSERT_ERR(lkv_kvfile_write(path, &a, err, sizeof(err)), LKV_EINVAL);
    lkv_kvfile_free(&a);
}

/* A path that is not a regular file (a FIFO here; /dev/null in real use) is written in place:
 * the temporary-file-and-rename path would replace it with a regular file. */
static void test_special_path(void)
{
    char fifo[sizeof(path) + 8];
    snprintf(fifo, sizeof(fifo), "%s.fifo", path);
    unlink(fifo);
    ASSERT_OK(mkfifo(fifo, 0600));
    pid_t pid = fork();
    if (pid == 0) { /* The reader: drains the FIFO, exits 0 if it got the whole file. */
        FILE *f = fopen(fifo, "rb");
        long n = 0;
        while (f != NULL && fgetc(f) != EOF) {
            n++;
        }
        _exit(f != NULL && n == 40 + 16 + 3000 ? 0 : 1);
    }
    lkv_kvfile a;
    make(&a, 0);
    char err[256];
    ASSERT_OK(lkv_kvfile_write(fifo, &a, err, sizeof(err)));
    int st = 0;
    waitpid(pid, &st, 0);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    struct stat sb;
    ASSERT_OK(stat(fifo, &sb));
    ASSERT_TRUE(S_ISFIFO(sb.st_mode)); /* Still the FIFO, not a renamed regular file. */
    unlink(fifo);
    lkv_kvfile_free(&a);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof(path), "%s/lkv-kvfile-%ld.kv", tmp ? tmp : "/tmp", (long)getpid());
    LKV_RUN(test_roundtrip);
    LKV_RUN(test_damage);
    LKV_RUN(test_check);
    LKV_RUN(test_special_path);
    unlink(path);
    return 0;
}
