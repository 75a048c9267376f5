/*
 * test_cli_run.h: helpers of the CLI integration tests (test_cli_*.c): run the real `lazykv`
 * binary as a child process, capture its stdout and stderr separately, return its exit code.
 *
 * Header-only (static inline functions): each test is one process and includes it once. The child
 * runs with LAZYKV_ADDR and LAZYKV_TOKEN removed from its environment, then with cli_env_token
 * and cli_env_addr set as LAZYKV_TOKEN and LAZYKV_ADDR when not NULL, so a test controls both.
 */
#ifndef TEST_CLI_RUN_H
#define TEST_CLI_RUN_H

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lkv_daemon_harness.h"
#include "lkv_test.h"

#define CLI_OUT_MAX (1 << 18)

static char cli_out[CLI_OUT_MAX]; /* stdout of the last run, NUL-terminated. */
static char cli_err[CLI_OUT_MAX]; /* stderr of the last run, NUL-terminated. */
static const char *cli_dir;       /* Folder for the capture files (the daemon's temp dir). */
static const char *cli_env_token; /* LAZYKV_TOKEN of the child, or NULL for none. */
static const char *cli_env_addr;  /* LAZYKV_ADDR of the child, or NULL for none. */

static inline void cli_slurp(const char *path, char *buf)
{
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(buf, 1, CLI_OUT_MAX - 1, f) : 0;
    buf[got] = '\0';
    if (f) {
        fclose(f);
    }
}

/* Runs lazykv with argv (n words, borrowed). Returns its exit code; fails the test if it did not
 * exit normally (a crash). */
static inline int cli_runv(int n, const char *const *words)
{
    const char *argv[64];
    int k = 0;
    argv[k++] = lkv_cli_bin();
    for (int i = 0; i < n && k < 63; i++) {
        argv[k++] = words[i];
    }
    argv[k] = NULL;
    char po[700], pe[700];
    snprintf(po, sizeof(po), "%s/cli.out", cli_dir);
    snprintf(pe, sizeof(pe), "%s/cli.err", cli_dir);
    fflush(NULL);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        int fo = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(pe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        close(fo);
        close(fe);
        unsetenv("LAZYKV_ADDR");
        unsetenv("LAZYKV_TOKEN");
        if (cli_env_token != NULL) {
            setenv("LAZYKV_TOKEN", cli_env_token, 1);
        }
        if (cli_env_addr != NULL) {
            setenv("LAZYKV_ADDR", cli_env_addr, 1);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    cli_slurp(po, cli_out);
    cli_slurp(pe, cli_err);
    ASSERT_TRUE(WIFEXITED(st));
    fprintf(stderr, "   $ lazykv");
    for (int i = 1; i < k; i++) {
        fprintf(stderr, " %.80s", argv[i]);
    }
    fprintf(stderr, "  -> %d\n", WEXITSTATUS(st));
    if (cli_err[0] != '\0') {
        fprintf(stderr, "     stderr: %.300s%s", cli_err,
                cli_err[strlen(cli_err) - 1] == '\n' ? "" : "\n");
    }
    return WEXITSTATUS(st);
}

/* Runs lazykv with the given words (NULL-terminated). */
static inline int cli_run(const char *first, ...)
{
    const char *w[64];
    int n = 0;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a != NULL && n < 63; a = va_arg(ap, const char *)) {
        w[n++] = a;
    }
    va_end(ap);
    return cli_runv(n, w);
}

/* Number of occurrences of needle in hay. */
static inline int cli_count(const char *hay, const char *needle)
{
    int n = 0;
    size_t len = strlen(needle);
    for (const char *p = strstr(hay, needle); p != NULL; p = strstr(p + len, needle)) {
        n++;
    }
    return n;
}

/* Checks that the captured stdout is valid JSON (one document per line) and that the Python
 * expression expr holds for every line's value `d` (e.g. "d['hot']['docs'] == 2"), with
 * /usr/bin/python3; returns 1 if it holds or Python is absent (then the check is skipped, as
 * said on stderr), else 0. */
static inline int cli_json_check(const char *expr)
{
    if (access("/usr/bin/python3", X_OK) != 0) {
        fprintf(stderr, "   (no /usr/bin/python3: JSON check skipped)\n");
        return 1;
    }
    char out[700], py[700], cmd[1600];
    snprintf(out, sizeof(out), "%s/cli.out", cli_dir);
    snprintf(py, sizeof(py), "%s/check.py", cli_dir);
    FILE *f = fopen(py, "w");
    ASSERT_TRUE(f != NULL);
    fprintf(f,
            "import json, sys\n"
            "lines = [l for l in open(sys.argv[1]) if l.strip()]\n"
            "assert lines, 'no output'\n"
            "for l in lines:\n"
            "    d = json.loads(l)\n"
            "    assert (%s), l[:3000]\n",
            expr);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s %s", py, out);
    int st = system(cmd);
    if (st != 0) {
        fprintf(stderr, "   JSON check failed: %s\n", expr);
    }
    return st == 0;
}

#endif
