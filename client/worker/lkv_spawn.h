/*
 * lkv_spawn.h: runs a private lazykvd for the demo and the worker benchmark: a temporary folder
 * (mkdtemp under $TMPDIR or /tmp) holding the data dir and the log, the daemon on 127.0.0.1
 * port 0 with a host (shm) arena, the address read from its "lazykvd listening on HOST:PORT"
 * line. The child dies with its parent (PR_SET_PDEATHSIG). lkv_spawn_stop sends SIGTERM (the
 * daemon flushes and exits) and reports how it ended; lkv_spawn_cleanup kills what is still
 * running and removes the folder (kept when $LKV_KEEP_TMP is set).
 */
#ifndef LKV_SPAWN_H
#define LKV_SPAWN_H

#include <sys/types.h>

typedef struct lkv_spawn {
    pid_t pid;      /* Running daemon, or 0. */
    char dir[256];  /* Temporary folder, "" once removed. */
    char addr[128]; /* "127.0.0.1:PORT" once started. */
    char log[320];  /* dir + "/lazykvd.log". */
} lkv_spawn;

/* Makes the folder and starts bin (borrowed path) with hot_bytes (e.g. "64MiB", borrowed) and
 * the NULL-terminated extra arguments (may be NULL); waits up to 30 s for the listening line.
 * Returns 0, or -1 with a message on stderr (the folder is kept for the log until cleanup). */
int lkv_spawn_start(lkv_spawn *s, const char *bin, const char *hot_bytes, const char *const *extra);

/* SIGTERM, then waits up to timeout_ms (SIGKILL after that). Returns 1 if the daemon exited
 * with status 0, else 0. */
int lkv_spawn_stop(lkv_spawn *s, int timeout_ms);

/* Kills a running daemon and removes the folder. Safe to call twice. */
void lkv_spawn_cleanup(lkv_spawn *s);

#endif
