/*
 * lkv_daemon_harness.h: start, stop and kill a real lazykvd from a C integration test.
 *
 * Each daemon runs in its own temporary folder (mkdtemp under $TMPDIR or /tmp):
 *     DIR/data        the data dir (cold tier), reusable across restarts
 *     DIR/lazykvd.log the daemon's stdout and stderr (appended across restarts)
 * It listens on 127.0.0.1 port 0; the harness waits (with a timeout) for the log line
 * "lazykvd listening on HOST:PORT" and records the address. The binary is $LKV_DAEMON_BIN if
 * set, else the path compiled in (LKV_DAEMON_BIN_DEFAULT).
 *
 * Robustness: the child gets PR_SET_PDEATHSIG(SIGKILL), so it dies with the test process; an
 * atexit hook SIGKILLs every daemon still running (e.g. after a failed assertion, which calls
 * exit) and prints the tail of its log; after a SIGKILL the harness removes the daemon's host
 * arena (/dev/shm/lazykv-<pid>-*), which a killed daemon cannot remove itself. The folder is
 * removed by lkv_daemon_cleanup (or by the exit hook) unless $LKV_KEEP_TMP is set.
 *
 * Timeouts scale with $LKV_TEST_TIMEOUT_SCALE (default 1) for slow machines.
 */
#ifndef LKV_DAEMON_HARNESS_H
#define LKV_DAEMON_HARNESS_H

#include <sys/types.h>

#define LKV_DAEMON_MAX_ARGS 64

typedef struct lkv_daemon {
    pid_t pid;                       /* Running daemon, or 0. */
    char dir[512];                   /* Temporary folder owned by this struct. */
    char data_dir[600];              /* dir + "/data". */
    char log_path[600];              /* dir + "/lazykvd.log". */
    char addr[128];                  /* "127.0.0.1:PORT" once started. */
    int n_args;                      /* Extra arguments kept for restarts. */
    char *args[LKV_DAEMON_MAX_ARGS]; /* Owned copies. */
    long log_offset;                 /* Log size when the current process started. */
} lkv_daemon;

/* Scales a timeout in ms by $LKV_TEST_TIMEOUT_SCALE. */
int lkv_test_timeout_ms(int ms);

/* Creates the temporary folder and records extra daemon arguments (NULL-terminated array of
 * borrowed strings, e.g. {"--set", "durability=write-through", NULL}; may be NULL). Does not
 * start anything. Aborts the test (exit 1) if the folder cannot be made. */
void lkv_daemon_init(lkv_daemon *d, const char *const *extra);

/* Starts the daemon (again) on d->data_dir with listen=127.0.0.1:0, hot_backend=host and the
 * extra arguments, and waits up to 30 s (scaled) for the listening line. Returns 0, or -1 if
 * it exited or timed out (log tail printed; the process is killed). */
int lkv_daemon_start(lkv_daemon *d);

/* Like lkv_daemon_start, with more arguments for this start only (NULL-terminated). */
int lkv_daemon_start_with(lkv_daemon *d, const char *const *more);

/* Sends sig (SIGTERM for a clean stop, SIGKILL for a crash) and waits up to timeout_ms for the
 * exit; SIGKILLs it after that. Returns the wait status (as waitpid) or -1 if none running. */
int lkv_daemon_stop(lkv_daemon *d, int sig, int timeout_ms);

/* Prints the last max_bytes of the daemon's log to stderr. */
void lkv_daemon_dump_log(const lkv_daemon *d, long max_bytes);

/* Kills the daemon if running, removes the folder (unless $LKV_KEEP_TMP), frees the args. */
void lkv_daemon_cleanup(lkv_daemon *d);

/* Path of the lazykv CLI binary ($LKV_CLI_BIN, else compiled in LKV_CLI_BIN_DEFAULT). */
const char *lkv_cli_bin(void);

#endif
