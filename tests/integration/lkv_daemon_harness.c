/*
 * lkv_daemon_harness.c: spawn/wait/kill helpers for integration tests (see the header).
 *
 * The daemon's output goes to a log file (not a pipe), so the daemon never blocks on a full
 * pipe and the whole log is there to print when a test fails. The harness polls the file for
 * the listening line every 20 ms.
 */
#include "lkv_daemon_harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef LKV_DAEMON_BIN_DEFAULT
#define LKV_DAEMON_BIN_DEFAULT "lazykvd"
#endif
#ifndef LKV_CLI_BIN_DEFAULT
#define LKV_CLI_BIN_DEFAULT "lazykv"
#endif

#define MAX_DAEMONS 16

static lkv_daemon *registry[MAX_DAEMONS];
static int hook_installed;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int lkv_test_timeout_ms(int ms)
{
    const char *s = getenv("LKV_TEST_TIMEOUT_SCALE");
    double k = s != NULL ? atof(s) : 1.0;
    if (k < 1.0) {
        k = 1.0;
    }
    return (int)(ms * k);
}

/* Removes the host arenas a killed daemon left behind. */
static void remove_shm(pid_t pid)
{
    DIR *dir = opendir("/dev/shm");
    if (dir == NULL) {
        return;
    }
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "lazykv-%ld-", (long)pid);
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            char path[512];
            snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
            unlink(path);
        }
    }
    closedir(dir);
}

static void kill_all_at_exit(void)
{
    for (int i = 0; i < MAX_DAEMONS; i++) {
        lkv_daemon *d = registry[i];
        if (d != NULL && d->pid > 0) {
            fprintf(stderr, "harness: test ended with lazykvd %ld still running; killing it\n",
                    (long)d->pid);
            lkv_daemon_dump_log(d, 6000);
            kill(d->pid, SIGKILL);
            waitpid(d->pid, NULL, 0);
            remove_shm(d->pid);
            d->pid = 0;
        }
        if (d != NULL) {
            lkv_daemon_cleanup(d); /* The log was printed above; remove the folder. */
        }
    }
}

static void reg(lkv_daemon *d)
{
    if (!hook_installed) {
        atexit(kill_all_at_exit);
        hook_installed = 1;
    }
    for (int i = 0; i < MAX_DAEMONS; i++) {
        if (registry[i] == d) {
            return;
        }
    }
    for (int i = 0; i < MAX_DAEMONS; i++) {
        if (registry[i] == NULL) {
            registry[i] = d;
            return;
        }
    }
    fprintf(stderr, "harness: too many daemons\n");
    exit(1);
}

static void unreg(lkv_daemon *d)
{
    for (int i = 0; i < MAX_DAEMONS; i++) {
        if (registry[i] == d) {
            registry[i] = NULL;
        }
    }
}

void lkv_daemon_init(lkv_daemon *d, const char *const *extra)
{
    memset(d, 0, sizeof(*d));
    const char *tmp = getenv("TMPDIR");
    snprintf(d->dir, sizeof(d->dir), "%s/lkv-it-XXXXXX", tmp != NULL && tmp[0] ? tmp : "/tmp");
    if (mkdtemp(d->dir) == NULL) {
        fprintf(stderr, "harness: mkdtemp %s: %s\n", d->dir, strerror(errno));
        exit(1);
    }
    snprintf(d->data_dir, sizeof(d->data_dir), "%s/data", d->dir);
    snprintf(d->log_path, sizeof(d->log_path), "%s/lazykvd.log", d->dir);
    for (int i = 0; extra != NULL && extra[i] != NULL; i++) {
        if (d->n_args == LKV_DAEMON_MAX_ARGS) {
            fprintf(stderr, "harness: too many daemon arguments\n");
            exit(1);
        }
        d->args[d->n_args++] = strdup(extra[i]);
    }
    reg(d);
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

void lkv_daemon_dump_log(const lkv_daemon *d, long max_bytes)
{
    FILE *f = fopen(d->log_path, "rb");
    if (f == NULL) {
        fprintf(stderr, "harness: no daemon log at %s\n", d->log_path);
        return;
    }
    long size = file_size(d->log_path);
    long from = size > max_bytes ? size - max_bytes : 0;
    fseek(f, from, SEEK_SET);
    fprintf(stderr, "---- lazykvd log (%s, last %ld bytes) ----\n", d->log_path, size - from);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
        fwrite(buf, 1, n, stderr);
    }
    fprintf(stderr, "---- end of lazykvd log ----\n");
    fclose(f);
}

/* Searches the log (from d->log_offset) for "listening on ADDR"; 1 and d->addr if found. */
static int find_listen_line(lkv_daemon *d)
{
    FILE *f = fopen(d->log_path, "rb");
    if (f == NULL) {
        return 0;
    }
    fseek(f, d->log_offset, SEEK_SET);
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, "lazykvd listening on ");
        if (p == NULL || line[strlen(line) - 1] != '\n') {
            continue;
        }
        p += strlen("lazykvd listening on ");
        size_t n = strcspn(p, " \t\r\n");
        if (n > 0 && n < sizeof(d->addr)) {
            memcpy(d->addr, p, n);
            d->addr[n] = '\0';
            found = 1;
        }
    }
    fclose(f);
    return found;
}

int lkv_daemon_start_with(lkv_daemon *d, const char *const *more)
{
    if (d->pid > 0) {
        fprintf(stderr, "harness: daemon already running\n");
        return -1;
    }
    const char *bin = getenv("LKV_DAEMON_BIN");
    if (bin == NULL || bin[0] == '\0') {
        bin = LKV_DAEMON_BIN_DEFAULT;
    }
    char set_data[700];
    snprintf(set_data, sizeof(set_data), "data_dir=%s", d->data_dir);
    const char *argv[2 * LKV_DAEMON_MAX_ARGS + 16];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--set";
    argv[n++] = "listen=127.0.0.1:0";
    argv[n++] = "--set";
    argv[n++] = set_data;
    argv[n++] = "--set";
    argv[n++] = "hot_backend=host";
    for (int i = 0; i < d->n_args; i++) {
        argv[n++] = d->args[i];
    }
    for (int i = 0;
         more != NULL && more[i] != NULL && n < (int)(sizeof(argv) / sizeof(argv[0])) - 1; i++) {
        argv[n++] = more[i];
    }
    argv[n] = NULL;
    d->log_offset = file_size(d->log_path);
    d->addr[0] = '\0';
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "harness: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) {
            _exit(127);
        }
        int fd = open(d->log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd < 0) {
            _exit(127);
        }
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) {
            dup2(nul, 0);
            close(nul);
        }
        execv(bin, (char *const *)argv);
        fprintf(stderr, "harness: exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    d->pid = pid;
    reg(d);
    double deadline = now_ms() + lkv_test_timeout_ms(30000);
    while (now_ms() < deadline) {
        if (find_listen_line(d)) {
            return 0;
        }
        int st;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) {
            d->pid = 0;
            fprintf(stderr, "harness: lazykvd exited before listening (status %#x)\n", st);
            lkv_daemon_dump_log(d, 6000);
            return -1;
        }
        usleep(20000);
    }
    fprintf(stderr, "harness: no listening line from lazykvd within the timeout\n");
    lkv_daemon_dump_log(d, 6000);
    lkv_daemon_stop(d, SIGKILL, 5000);
    return -1;
}

int lkv_daemon_start(lkv_daemon *d)
{
    return lkv_daemon_start_with(d, NULL);
}

int lkv_daemon_stop(lkv_daemon *d, int sig, int timeout_ms)
{
    if (d->pid <= 0) {
        return -1;
    }
    pid_t pid = d->pid;
    kill(pid, sig);
    double deadline = now_ms() + lkv_test_timeout_ms(timeout_ms);
    int st = 0;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) {
            break;
        }
        if (now_ms() >= deadline) {
            fprintf(stderr,
                    "harness: lazykvd %ld did not exit within %d ms of signal %d; "
                    "killing it\n",
                    (long)pid, timeout_ms, sig);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            sig = SIGKILL;
            break;
        }
        usleep(10000);
    }
    d->pid = 0;
    if (WIFSIGNALED(st)) {
        remove_shm(pid);
    }
    return st;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void lkv_daemon_cleanup(lkv_daemon *d)
{
    if (d->pid > 0) {
        lkv_daemon_stop(d, SIGKILL, 5000);
    }
    unreg(d);
    if (getenv("LKV_KEEP_TMP") == NULL && d->dir[0] != '\0') {
        nftw(d->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    } else if (d->dir[0] != '\0') {
        fprintf(stderr, "harness: kept %s\n", d->dir);
    }
    for (int i = 0; i < d->n_args; i++) {
        free(d->args[i]);
    }
    d->n_args = 0;
    d->dir[0] = '\0';
}

const char *lkv_cli_bin(void)
{
    const char *s = getenv("LKV_CLI_BIN");
    return s != NULL && s[0] != '\0' ? s : LKV_CLI_BIN_DEFAULT;
}
