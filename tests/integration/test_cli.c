/*
 * test_cli.c: integration.cli. The lazykv CLI against a real lazykvd: ping, put/get of a KV
 * file (byte-identical round trip through the file format), lookup, rm, stats, --help of every
 * command, and the exit codes scripts rely on (0 ok, 1 not found/miss, 2 usage or bad local
 * input, 3 server refused, 4 unavailable).
 */
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lkv_daemon_harness.h"
#include "lkv_it_util.h"
#include "lkv_kvfile.h"
#include "lkv_test.h"

static lkv_daemon dm;
static char out[1 << 16]; /* stdout + stderr of the last run. */

/* Runs lazykv with the given arguments (NULL-terminated); captures output into out. Returns
 * the exit code. */
static int run(const char *first, ...)
{
    const char *argv[32];
    int n = 0;
    argv[n++] = lkv_cli_bin();
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a != NULL && n < 31; a = va_arg(ap, const char *)) {
        argv[n++] = a;
    }
    va_end(ap);
    argv[n] = NULL;
    char path[700];
    snprintf(path, sizeof(path), "%s/cli.out", dm.dir);
    fflush(NULL);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        unsetenv("LAZYKV_ADDR");
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(out, 1, sizeof(out) - 1, f) : 0;
    out[got] = '\0';
    if (f) {
        fclose(f);
    }
    ASSERT_TRUE(WIFEXITED(st));
    fprintf(stderr, "   lazykv %s ... -> %d: %.200s", first, WEXITSTATUS(st), out);
    if (got == 0 || out[got - 1] != '\n') {
        fprintf(stderr, "\n");
    }
    return WEXITSTATUS(st);
}

static int read_file(const char *p, uint8_t **data, long *len)
{
    FILE *f = fopen(p, "rb");
    if (!f) {
        return -1;
    }
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    *data = malloc((size_t)*len + 1);
    size_t got = fread(*data, 1, (size_t)*len, f);
    fclose(f);
    return got == (size_t)*len ? 0 : -1;
}

static void write_doc(const char *path, const it_shape *s, const it_doc *d)
{
    lkv_kvfile kf;
    memset(&kf, 0, sizeof(kf));
    snprintf(kf.profile, sizeof(kf.profile), "%s", s->profile);
    kf.n_tokens = d->n_tokens;
    kf.tokens = d->tokens;
    kf.n_blocks = d->n_blocks;
    kf.block_bytes = d->block_bytes;
    kf.blocks = d->blocks;
    char err[256];
    ASSERT_OK(lkv_kvfile_write(path, &kf, err, sizeof(err)));
}

static void test_cli(void)
{
    char addr[200], in[700], o1[700], o2[700], bad[700], toks[8192], key[65];
    snprintf(addr, sizeof(addr), "--addr=%s", dm.addr);
    snprintf(in, sizeof(in), "%s/doc.kv", dm.dir);
    snprintf(o1, sizeof(o1), "%s/out1.kv", dm.dir);
    snprintf(o2, sizeof(o2), "%s/out2.kv", dm.dir);
    snprintf(bad, sizeof(bad), "%s/bad.kv", dm.dir);

    /* help and usage */
    ASSERT_EQ(run("--help", NULL), 0);
    ASSERT_TRUE(strstr(out, "Exit codes") != NULL);
    static const char *cmds[] = {"ping", "put", "get", "lookup", "rm", "stats"};
    for (int i = 0; i < 6; i++) {
        ASSERT_EQ(run(cmds[i], "--help", NULL), 0);
        ASSERT_TRUE(strstr(out, "usage: lazykv") != NULL && strstr(out, "Exit codes") != NULL);
    }
    ASSERT_EQ(run(NULL), 2);
    ASSERT_EQ(run("frobnicate", NULL), 2);
    ASSERT_EQ(run(addr, "put", NULL), 2);
    ASSERT_EQ(run(addr, "get", "nothex", NULL), 2);
    ASSERT_EQ(run(addr, "lookup", "--profile", "itest", NULL), 2);
    ASSERT_EQ(run("--timeout", "-5", "ping", NULL), 2);

    /* ping */
    ASSERT_EQ(run(addr, "ping", NULL), 0);
    ASSERT_TRUE(strstr(out, "SERVING") != NULL);
    ASSERT_EQ(run("--addr", "127.0.0.1:1", "--timeout", "3000", "ping", NULL), 4);

    /* put a KV file, get it back by tokens: identical file */
    it_doc d;
    lkv_it_doc_make(&lkv_it_itest, 77, 45, &d);
    write_doc(in, &lkv_it_itest, &d);
    ASSERT_EQ(run(addr, "put", in, NULL), 0);
    ASSERT_TRUE(strlen(out) > 64 && out[64] == ' ');
    memcpy(key, out, 64);
    key[64] = '\0';
    ASSERT_TRUE(strstr(out, "tokens=45 blocks=3") != NULL);
    ASSERT_EQ(run(addr, "put", in, NULL), 0);
    ASSERT_TRUE(strstr(out, "already-present") != NULL);
    int k = 0;
    for (uint32_t i = 0; i < d.n_tokens; i++) {
        k += snprintf(toks + k, sizeof(toks) - (size_t)k, "%s%u", i ? "," : "", d.tokens[i]);
    }
    ASSERT_EQ(run(addr, "get", "--profile", "itest", "--tokens", toks, "-o", o1, NULL), 0);
    ASSERT_TRUE(strncmp(out, key, 64) == 0);
    uint8_t *a = NULL, *b = NULL;
    long la = 0, lb = 0;
    ASSERT_OK(read_file(in, &a, &la));
    ASSERT_OK(read_file(o1, &b, &lb));
    ASSERT_EQ(la, lb);
    ASSERT_TRUE(memcmp(a, b, (size_t)la) == 0);
    free(a);
    free(b);

    /* get by key: same blocks, no token ids (so it cannot be put again: exit 2) */
    ASSERT_EQ(run(addr, "get", key, "-o", o2, NULL), 0);
    lkv_kvfile kf;
    char err[256];
    ASSERT_OK(lkv_kvfile_read(o2, &kf, err, sizeof(err)));
    ASSERT_TRUE(kf.tokens == NULL);
    ASSERT_EQ(kf.n_tokens, 45);
    ASSERT_EQ(kf.n_blocks, 3);
    ASSERT_TRUE(memcmp(kf.blocks, d.blocks, 3 * d.block_bytes) == 0);
    lkv_kvfile_free(&kf);
    ASSERT_EQ(run(addr, "put", o2, NULL), 2);

    /* lookup: present -> 0; with one absent -> 1 */
    ASSERT_EQ(run(addr, "lookup", key, NULL), 0);
    ASSERT_TRUE(strstr(out, "present") != NULL);
    const char *zero = "0000000000000000000000000000000000000000000000000000000000000000";
    ASSERT_EQ(run(addr, "lookup", key, zero, NULL), 1);
    ASSERT_TRUE(strstr(out, "absent") != NULL);

    /* stats prints INFO-style text */
    ASSERT_EQ(run(addr, "stats", NULL), 0);
    ASSERT_TRUE(strstr(out, "# ") != NULL);
    ASSERT_EQ(run(addr, "stats", "--json", NULL), 0);
    ASSERT_TRUE(out[0] == '{' && strstr(out, "\"hot\": {") != NULL);
    if (access("/usr/bin/python3", X_OK) == 0) { /* The output is valid JSON. */
        char cmd[1024];
        snprintf(cmd, sizeof(cmd),
                 "/usr/bin/python3 -c 'import json,sys; json.load(open(sys.argv[1]))' %s/cli.out",
                 dm.dir);
        ASSERT_EQ(system(cmd), 0);
    }
    ASSERT_EQ(run(addr, "stats", "--json", "hot", NULL), 0);
    ASSERT_TRUE(strncmp(out, "{\"hot\": {", 9) == 0);
    ASSERT_EQ(run(addr, "stats", "--bogus", NULL), 2);
    ASSERT_EQ(run(addr, "stats", "--count", "2", NULL), 2);
    ASSERT_EQ(run(addr, "stats", "--json", "--watch", "0.1", "--count", "3", "hot", NULL), 0);
    {
        int lines = 0;
        for (const char *p = out; *p; p++) {
            lines += *p == '\n';
        }
        ASSERT_EQ(lines, 3);
    }

    /* rm: 0, then 1 (not found); get of the removed doc: 1 */
    ASSERT_EQ(run(addr, "rm", key, NULL), 0);
    ASSERT_EQ(run(addr, "rm", key, NULL), 1);
    ASSERT_EQ(run(addr, "get", key, NULL), 1);

    /* server refusals: 3 (unknown profile; wrong block size) */
    lkv_it_doc_free(&d);
    lkv_it_doc_make(&lkv_it_itest, 78, 20, &d);
    it_shape other = lkv_it_itest;
    other.profile = "nosuch-model";
    write_doc(bad, &other, &d);
    ASSERT_EQ(run(addr, "put", bad, NULL), 3);
    ASSERT_TRUE(strstr(out, "nosuch-model") != NULL);
    d.block_bytes -= 8;
    write_doc(bad, &lkv_it_itest, &d);
    ASSERT_EQ(run(addr, "put", bad, NULL), 3);

    ASSERT_EQ(run(addr, "lookup", "--profile", "nosuch-model", "--tokens", "1,2,3", NULL), 3);
    ASSERT_EQ(run(addr, "get", "--profile", "itest", "--tokens", "5,5000", NULL), 3);
    ASSERT_TRUE(strstr(out, "5000") != NULL);

    /* bad local input: 2 */
    FILE *f = fopen(bad, "wb");
    fputs("not a kv file", f);
    fclose(f);
    ASSERT_EQ(run(addr, "put", bad, NULL), 2);
    ASSERT_EQ(run(addr, "put", "/nonexistent.kv", NULL), 2);
    lkv_it_doc_free(&d);
}

int main(void)
{
    const char *args[] = {LKV_IT_PROFILE_ARGS, NULL};
    lkv_daemon_init(&dm, args);
    lkv_it_start(&dm);
    LKV_RUN(test_cli);
    lkv_daemon_stop(&dm, SIGTERM, 15000);
    lkv_daemon_cleanup(&dm);
    return 0;
}
