/*
 * lkv_test_proc.h: process helpers for tests that stop and resume daemons (SIGSTOP/SIGCONT),
 * header-only like lkv_test.h.
 */
#ifndef LKV_TEST_PROC_H
#define LKV_TEST_PROC_H

#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "lkv_test.h"

/* Waits (up to about 2 s) until the kernel shows pid stopped: state T or t in /proc/PID/stat
 * ("pid (comm) S ...": the state follows the command name, which may hold spaces and ')').
 * kill(SIGSTOP) returns before a busy machine has stopped the process. Fails the test if it
 * never stops. */
static inline void lkv_test_wait_stopped(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    for (int i = 0; i < 200; i++) {
        FILE *f = fopen(path, "r");
        size_t n = f != NULL ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f != NULL) {
            fclose(f);
        }
        buf[n] = '\0';
        const char *rp = strrchr(buf, ')');
        if (rp != NULL && rp[1] == ' ' && (rp[2] == 'T' || rp[2] == 't')) {
            return;
        }
        usleep(5000);
    }
    LKV_FAIL("pid %d did not stop", (int)pid);
}

#endif
