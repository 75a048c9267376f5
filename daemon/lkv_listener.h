/*
 * lkv_listener.h: lazykvd's own accept loop for plaintext listeners. It binds the listen
 * address, accepts connections on one thread, applies connection caps, survives descriptor
 * exhaustion, and hands each accepted socket to a callback (the RPC engine passes it to gRPC
 * core with grpc_server_add_channel_from_fd). No gRPC call lives here.
 *
 * Why. gRPC core 1.51's own listener can stop accepting for good once accept4 has failed with
 * EMFILE while a client connects (fixed only in later releases); it has no cap on connections
 * per peer either. This loop:
 *   - accepts with accept4(SOCK_NONBLOCK | SOCK_CLOEXEC) and sets TCP_NODELAY, as gRPC would;
 *   - caps connections in total (max_conns) and per peer IP address (max_conns_per_peer): a
 *     connection over a cap is accepted and closed at once (the client sees the connection
 *     reset and retries with its back-off) and counted;
 *   - on EMFILE / ENFILE keeps one spare descriptor (/dev/null) that it closes to accept and
 *     close the waiting connection (so the backlog does not fill with clients left hanging),
 *     then re-opens it, and backs off (backoff_min_ms doubling to backoff_max_ms, reset by
 *     the next successful accept); ENOBUFS / ENOMEM back off the same way; it never gives up;
 *   - notices connections gRPC has closed without being told: it remembers each handed-out
 *     socket's (fd, device, inode) and sweeps them with fstat (a closed or reused descriptor
 *     number no longer matches), every second and whenever a cap is reached.
 *
 * Loopback by descriptor number (opts.loopback_parity). gRPC names a connection handed over
 * by descriptor only as "fd:N", and N is reused once gRPC closes it, so a map from N to the
 * peer address can be stale by the time a call looks it up. With loopback_parity set, the
 * listener moves every loopback peer's socket to an odd descriptor and every other peer's to
 * an even one (F_DUPFD), so lkv_listener_fd_is_loopback(N) is right for any connection that
 * ever held N: a reuse can change which peer a number names, never its loopback-ness.
 *
 * Threads: lkv_listener_start runs the loop on its own thread; the callback runs there, one
 * connection at a time. lkv_listener_stop wakes it (eventfd), joins it and closes the
 * listening sockets; connections already handed out stay open (their owner closes them).
 * lkv_listener_stats is thread-safe.
 *
 * TLS listeners are not handled here: gRPC 1.51 accepts TLS connections only through its own
 * listener (grpc_server_add_channel_from_fd supports insecure credentials only), so a TLS port
 * keeps gRPC's listener with the limits gRPC has (see lkv_server.h).
 */
#ifndef LKV_LISTENER_H
#define LKV_LISTENER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

typedef struct lkv_listener lkv_listener; /* Opaque. */

/* Takes a connected, non-blocking socket fd from peer (borrowed for the call). Return 0 when
 * the callee took ownership of fd (it closes it), or a negative LKV_E* code to refuse: the
 * listener then closes fd and does not count it. */
typedef int (*lkv_listener_conn_fn)(void *ctx, int fd, const struct sockaddr *peer,
                                    socklen_t peer_len);

typedef struct lkv_listener_opts {
    const char *listen;           /* "host:port", "[v6]:port"; port 0 = any free port (borrowed
                                   * during create). Every address the host resolves to is bound,
                                   * on the same port. */
    uint32_t max_conns;           /* Connections handed out at once (0: no cap). */
    uint32_t max_conns_per_peer;  /* ... from one peer IP address (0: no cap). */
    uint32_t backoff_min_ms;      /* First back-off after EMFILE & co. (0: 10 ms). */
    uint32_t backoff_max_ms;      /* Largest back-off (0: 1000 ms). */
    int loopback_parity;          /* 1: loopback peers on odd descriptors (see above). */
    lkv_listener_conn_fn on_conn; /* Required. */
    void *ctx;                    /* Passed to on_conn (borrowed until destroy). */
} lkv_listener_opts;

typedef struct lkv_listener_stats {
    uint64_t accepted;       /* Connections handed to on_conn (and taken). */
    uint64_t refused_total;  /* Closed at once: max_conns reached. */
    uint64_t refused_peer;   /* Closed at once: max_conns_per_peer reached. */
    uint64_t refused_callee; /* on_conn refused them. */
    uint64_t fd_exhausted;   /* accept4 failures with EMFILE / ENFILE. */
    uint64_t shed_exhausted; /* Of those, waiting connections closed with the spare fd. */
    uint64_t backoffs;       /* Back-off sleeps (EMFILE, ENFILE, ENOBUFS, ENOMEM). */
    uint32_t open;           /* Handed-out connections still open (as of the last sweep). */
} lkv_listener_stats;

/* Binds and listens on opts->listen (does not accept yet). *out is owned by the caller:
 * lkv_listener_destroy. Returns 0, LKV_EINVAL (bad options or address; err says which) or
 * LKV_EIO (cannot bind: in use, or no such address). */
int lkv_listener_create(const lkv_listener_opts *opts, lkv_listener **out, char *err,
                        size_t errlen);

/* The bound port (the real one when opts->listen asked for port 0). */
int lkv_listener_port(const lkv_listener *l);

/* Starts the accept thread. Returns 0, or LKV_EINVAL if already started. */
int lkv_listener_start(lkv_listener *l);

/* Stops accepting: wakes and joins the thread, closes the listening sockets (new connections
 * are refused by the kernel from then on). Idempotent; l may be NULL. */
void lkv_listener_stop(lkv_listener *l);

/* lkv_listener_stop, then frees l. NULL is a no-op. */
void lkv_listener_destroy(lkv_listener *l);

/* With opts.loopback_parity: 1 if descriptor fd was handed out for a loopback peer (127/8,
 * ::1, v4-mapped 127/8), else 0. */
int lkv_listener_fd_is_loopback(int fd);

/* 1 if sa is a loopback address (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104), else 0. */
int lkv_listener_addr_is_loopback(const struct sockaddr *sa);

/* Counters (a snapshot). Thread-safe. */
void lkv_listener_stats_get(const lkv_listener *l, lkv_listener_stats *out);

#endif
