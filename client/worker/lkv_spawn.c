/*
 * lkv_spawn.c: a private lazykvd (see lkv_spawn.h). The log is polled every 20 ms for the
 * listening line; a child that exits early is reaped and reported.
 */
#include "lkv_spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ARGS 48

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int lkv_spawn_start(lkv_spawn *s, const char *bin, const char *hot_bytes, const char *const *extra)
{
    memset(s, 0, sizeof(*s));
    const char *tmp = getenv("TMPDIR");
    snprintf(s->dir, sizeof(s->dir), "%s/lazykv-spawn-XXXXXX", tmp != NULL ? tmp : "/tmp");
    if (mkdtemp(s->dir) == NULL) {
        fprintf(stderr, "lkv_spawn: mkdtemp: %s\n", strerror(errno));
        s->dir[0] = '\0';
        return -1;
    }
    snprintf(s->log, sizeof(s->log), "%s/lazykvd.log", s->dir);
    char data[320];
    snprintf(data, sizeof(data), "%s/data", s->dir);
    const char *argv[MAX_ARGS + 16] = {bin,       "--listen",      "127.0.0.1:0", "--data_dir",
                                       data,      "--hot_backend", "host",        "--hot_bytes",
                                       hot_bytes, "--log_level",   "warn"};
    int n = 11;
    for (int i = 0; extra != NULL && extra[i] != NULL && i < MAX_ARGS; i++) {
        argv[n++] = extra[i];
    }
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0) {
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(s->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(bin, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    s->pid = pid;
    double t0 = now_ms();
    while (now_ms() - t0 < 30000) {
        FILE *f = fopen(s->log, "r");
        char line[512];
        while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
            const char *p = strstr(line, "lazykvd listening on ");
            if (p != NULL) {
                snprintf(s->addr, sizeof(s->addr), "%s", p + strlen("lazykvd listening on "));
                s->addr[strcspn(s->addr, "\r\n")] = '\0';
                fclose(f);
                return 0;
            }
        }
        if (f != NULL) {
            fclose(f);
        }
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            s->pid = 0;
            fprintf(stderr, "lkv_spawn: lazykvd exited at start (log: %s)\n", s->log);
            return -1;
        }
        usleep(20000);
    }
    fprintf(stderr, "lkv_spawn: lazykvd did not start within 30 s (log: %s)\n", s->log);
    return -1;
}

int lkv_spawn_stop(lkv_spawn *s, int timeout_ms)
{
    if (s->pid <= 0) {
        return 0;
    }
    kill(s->pid, SIGTERM);
    int ws = 0;
    double t0 = now_ms();
    while (waitpid(s->pid, &ws, WNOHANG) == 0) {
        if (now_ms() - t0 > timeout_ms) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &ws, 0);
            s->pid = 0;
            return 0;
        }
        usleep(20000);
    }
    s->pid = 0;
    return WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
}

void lkv_spawn_cleanup(lkv_spawn *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
        s->pid = 0;
    }
    if (s->dir[0] != '\0' && getenv("LKV_KEEP_TMP") == NULL) {
        nftw(s->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    s->dir[0] = '\0';
}
