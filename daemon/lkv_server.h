/*
 * lkv_server.h: lazykvd's RPC engine. ALL server-side gRPC core calls live in lkv_server.c; the
 * services (lkv_cache_svc.c, lkv_admin_svc.c, the health service) see only this header and
 * protobuf-c messages, so a gRPC core upgrade touches one file.
 *
 * Model. A service is a table of methods (lkv_method). Each method has a kind (unary, client
 * streaming, server streaming), a request message type and callbacks. The engine runs `threads`
 * polling threads, each with its own completion queue; every call lives on one queue, so all
 * callbacks of one call run on one thread, one at a time (no locking inside a call). Different
 * calls run concurrently on different threads: services must be thread-safe across calls.
 * Polling threads only move bytes: a callback must not block. A callback that has to wait parks
 * its call instead (lkv_rpc_defer, then return LKV_EAGAIN) and any thread later resumes it
 * (lkv_rpc_resume / lkv_rpc_finish_deferred): the resume function then runs on the call's own
 * thread, as the parked callback's continuation, so the one-thread rule above still holds.
 * Blocking work (RocksDB reads and writes of whole documents) goes to the engine's worker pool
 * (`pool_threads`, lkv_rpc_offload): the work function runs on a pool thread, its done function
 * back on the call's thread. While a call is parked, its deadline and cancellation still count:
 * see lkv_rpc_defer and lkv_rpc_offload for exactly what happens.
 *
 * Callbacks (svc is lkv_method.svc; rpc is the call, valid until cleanup returns):
 *   unary:          unary(svc, rpc, req) -> lkv_rpc_reply(rpc, resp) and return 0, or return
 *                   a negative LKV_E* code (optionally after lkv_rpc_errorf for the message).
 *   client stream:  on_message(svc, rpc, msg) per received message (return <0 to refuse the
 *                   call: it ends with that status at once); on_end(svc, rpc) after the
 *                   client half-closes: reply as for unary.
 *   server stream:  start(svc, rpc, req) once, then next(svc, rpc) each time the previous
 *                   message is on the wire: lkv_rpc_send(rpc, msg) one message and return 0
 *                   to continue, return 0 without sending to finish with OK, or <0 to fail.
 *   cleanup(svc, rpc): always called exactly once at the end of every call that reached a
 *                   callback (success, error, cancellation, shutdown): release lkv_rpc_state
 *                   (e.g. abort an unfinished put). May be NULL.
 *   Any of unary, on_message, on_end, start and next may instead park the call and return
 *   LKV_EAGAIN (lkv_rpc_defer, lkv_rpc_offload); the resume or done function then stands for
 *   the callback and returns what it would have.
 * Request messages passed to callbacks are borrowed: valid until the callback returns (a
 * callback that parks copies what its continuation needs).
 *
 * The engine checks the call's deadline before every callback (DEADLINE_EXCEEDED), stops a
 * stream whose client went away (cleanup only), unpacks with the method's size limit (over it:
 * RESOURCE_EXHAUSTED) through lkv_pb_unpack, whose wire scanner keeps decoding linear in the
 * size (malformed, repeated singular fields, bad strings: INVALID_ARGUMENT), answers methods it
 * does not know with UNIMPLEMENTED, maps LKV_* codes to gRPC status codes in one place
 * (proto/lkv_status.h), sends the exact LKV_* code of every failed call as "lkv-code" trailing
 * metadata (its name, e.g. "LKV_ENOSPC"), and logs every refused call once (client errors at
 * info, server errors at warn) with the method, the peer and the message.
 *
 * Shutdown is a drain (lkv_server_shutdown): stop accepting calls, let in-flight calls finish
 * for a grace period, cancel the rest, wait for every callback and cleanup, stop the threads.
 */
#ifndef LKV_SERVER_H
#define LKV_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <protobuf-c/protobuf-c.h>

#include "lkv_stats.h"

typedef struct lkv_server lkv_server; /* Opaque. */
typedef struct lkv_rpc lkv_rpc;       /* Opaque: one call. */

enum lkv_rpc_kind {
    LKV_RPC_UNARY = 0,
    LKV_RPC_CLIENT_STREAM = 1,
    LKV_RPC_SERVER_STREAM = 2,
};

typedef struct lkv_method {
    const char *path;                           /* "/lazykv.v1.Cache/Put" (static). */
    int kind;                                   /* enum lkv_rpc_kind. */
    const ProtobufCMessageDescriptor *req_desc; /* Request message type. */
    void *svc;                                  /* Passed to every callback (borrowed). */
    int (*unary)(void *svc, lkv_rpc *rpc, const ProtobufCMessage *req);
    int (*on_message)(void *svc, lkv_rpc *rpc, const ProtobufCMessage *msg);
    int (*on_end)(void *svc, lkv_rpc *rpc);
    /* Optional, client streams: when set it replaces on_message, and each message reaches the
     * service undecoded, as the n pieces it arrived in (iov: borrowed for the call, read only;
     * pieces of an uncompressed message point into the received gRPC slices, so a decoder can
     * take fields in place: Put, lkv_putwire.h; a compressed one is decompressed into one
     * piece first). max_request_bytes is checked before. Same return convention as
     * on_message. */
    int (*on_raw)(void *svc, lkv_rpc *rpc, const struct iovec *iov, size_t n);
    int (*start)(void *svc, lkv_rpc *rpc, const ProtobufCMessage *req);
    int (*next)(void *svc, lkv_rpc *rpc);
    void (*cleanup)(void *svc, lkv_rpc *rpc);
    /* Largest request message of this method, bytes (each message of a client stream); 0 means
     * the server's max_message_bytes, and a larger value is capped by it. Only Put carries block
     * payloads; the small calls set a small bound so no caller makes the daemon buffer and scan
     * megabytes for a Lookup. A bigger message fails with RESOURCE_EXHAUSTED, unread. */
    uint64_t max_request_bytes;
} lkv_method;

/* Admission hook (authentication / authorisation), see lkv_server_opts.admit. */
typedef int (*lkv_admit_fn)(void *ctx, lkv_rpc *rpc);

/* TLS of the listener (lkv_server_opts.tls). Paths are copied at create. The files are read
 * at create (an unreadable or malformed one fails create with LKV_ECONFIG naming it) and again
 * whenever one of them changes (mtime, size or inode): gRPC consults the engine at every
 * handshake (grpc_ssl_server_certificate_config_fetcher), so a renewed certificate written in
 * place (or renamed over the old one) serves new connections without a restart, and
 * connections already open keep theirs. A file that cannot be read or parsed at that moment
 * (half-written) is logged and the previous certificate stays in use. */
typedef struct lkv_tls_opts {
    const char *cert_file;      /* Server certificate chain, PEM. */
    const char *key_file;       /* Its private key, PEM. */
    const char *client_ca_file; /* CA bundle for client certificates, PEM; NULL or "": clients
                                 * are not asked for one. Set: every client must present a
                                 * certificate this CA signed (the handshake fails otherwise). */
} lkv_tls_opts;

typedef struct lkv_server_opts {
    const char *listen;         /* host:port (borrowed during create); port 0 = any free. */
    int threads;                /* Polling threads, >= 1. */
    uint64_t max_message_bytes; /* Receive and send limit, bytes (also set on gRPC core). */
    /* Optional (NULL: admit every call). Called once per call of a registered method, on the
     * call's thread, before its request is read and before any service callback. Returns 0 to
     * admit (it may attach the caller's identity with lkv_rpc_set_principal), or a negative
     * code (LKV_EUNAUTH, LKV_EPERM; message via lkv_rpc_errorf) to refuse: the call then ends
     * with that status and no service callback (not even cleanup) runs. Must be thread-safe. */
    lkv_admit_fn admit;
    void *admit_ctx;  /* Passed to admit (borrowed until destroy). */
    int pool_threads; /* Worker pool for lkv_rpc_offload, >= 0 (0: work runs inline on the
                       * polling thread, as if it did not block). Fault injection (tests): with
                       * the environment variable LKV_FAULT_POOL_DELAY_MS=n at create, every
                       * pool job sleeps n ms before its work, as on a slow disk. */
    /* Optional (NULL: none). Registry the per-method counters are registered in (borrowed until
     * destroy), section "calls": rpc_calls, rpc_errors, rpc_usec_per_call (keys
     * "<Service>.<Method>.calls", ".errors", ".usec_per_call") and rpc_usec (not in INFO),
     * labelled service=lazykv.v1.Cache,method=Put. */
    lkv_stats *stats;
    /* Connections (plaintext listeners: the engine's own accept loop, lkv_listener.h). Caps on
     * connections open at once, in total and from one peer IP (0: none); a connection over a
     * cap is closed at once. */
    uint32_t max_conns;
    uint32_t max_conns_per_peer;
    /* 1: a plaintext listener uses gRPC core's own accept loop instead (no caps, no EMFILE
     * recovery: gRPC 1.51 may stop accepting after one); for diagnosis. */
    int grpc_listener;
    /* Optional (NULL: plaintext). TLS of the listener, see lkv_tls_opts. gRPC 1.51 serves TLS
     * only through its own listener (grpc_server_add_channel_from_fd takes insecure
     * credentials only), so a TLS port has gRPC's limits (concurrent streams, handshake and
     * idle timeouts) and the per-call admission hook, not max_conns / max_conns_per_peer or
     * the EMFILE recovery. */
    const lkv_tls_opts *tls;
    /* Calls in flight at once from one peer IP address (the peer without its port), on every
     * listener, checked at admission before opts.admit (0: no cap). A call over it fails with
     * RESOURCE_EXHAUSTED (LKV_ERATE, the message names the cap), counted in the registry
     * (section "connections", key calls_refused_peer). Health (/grpc.health.v1.Health/...)
     * calls are neither counted nor refused, so probes always answer. A call counts from its
     * admission until its context is freed (a parked call counts while parked). */
    uint32_t max_calls_per_peer;
    /* TLS listeners only (gRPC core's channel args; 0: gRPC's default): HTTP/2 streams open at
     * once per connection (GRPC_ARG_MAX_CONCURRENT_STREAMS), the handshake deadline, ms
     * (GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS) and the idle time after which a connection without
     * calls is closed, ms (GRPC_ARG_MAX_CONNECTION_IDLE_MS). */
    uint32_t tls_max_streams;
    uint64_t tls_handshake_timeout_ms;
    uint64_t tls_idle_timeout_ms;
} lkv_server_opts;

/* Creates the server, registers methods[0..n) (the array and what it points to are borrowed
 * until lkv_server_destroy), binds opts->listen and starts the polling threads. Writes the bound
 * address ("127.0.0.1:40123") into the server (lkv_server_address). Returns 0, LKV_EIO if the
 * address cannot be bound (err says which), LKV_EINVAL for bad arguments. *out is owned by the
 * caller: lkv_server_shutdown then lkv_server_destroy. gRPC core is initialised here. */
int lkv_server_create(const lkv_server_opts *opts, const lkv_method *methods, int n,
                      lkv_server **out, char *err, size_t errlen);

/* The bound address, "host:port" with the real port (borrowed, valid until destroy). */
const char *lkv_server_address(const lkv_server *s);
int lkv_server_port(const lkv_server *s);

/* Checks the TLS files now (as a handshake would) and reports: 1 if a new certificate was
 * loaded, 0 if nothing changed, LKV_ECONFIG (logged) if a file cannot be used (the old
 * certificate stays). SIGHUP calls it so the log says at once whether a renewal took. 0 for a
 * plaintext server. Thread-safe. */
int lkv_server_tls_check(lkv_server *s);

/* Certificates loaded since create (1 after create with TLS; +1 per reload). Thread-safe. */
unsigned long lkv_server_tls_generation(const lkv_server *s);

/* Per-method counters (Redis commandstats style; also in opts.stats) of method i (0..n-1, the
 * registration order):
 * *path borrowed (static), calls finished, of which failed, total wall time in microseconds.
 * Returns 0, or LKV_EINVAL for a bad i. Thread-safe. */
int lkv_server_method_stats(const lkv_server *s, int i, const char **path, uint64_t *calls,
                            uint64_t *errors, uint64_t *usec);

/* Calls in progress now. Thread-safe. */
long lkv_server_calls_in_flight(const lkv_server *s);

/* Calls counted against max_calls_per_peer for peer ip (the peer string without its port:
 * "ipv4:127.0.0.1", "ipv6:[::1]"); 0 for a peer with none (or with no cap). Thread-safe. */
uint32_t lkv_server_peer_calls(lkv_server *s, const char *ip);

/* 1 once lkv_server_shutdown has begun (services report NOT_SERVING then). Thread-safe. */
int lkv_server_draining(const lkv_server *s);

/* Drains: refuses new calls, waits up to grace_ms for in-flight calls, cancels the rest
 * (clients see CANCELLED / UNAVAILABLE), waits for every cleanup, joins the threads. Logs each
 * step. Idempotent. Call from the main thread, not from a callback. */
void lkv_server_shutdown(lkv_server *s, uint64_t grace_ms);

/* Frees the server (after lkv_server_shutdown; calls it with grace 0 if not done) and shuts
 * gRPC core down. s may be NULL. */
void lkv_server_destroy(lkv_server *s);

/* ---- For callbacks ------------------------------------------------------------------- */

/* The caller's identity attached by the admit hook (borrowed: it must outlive the call, e.g. a
 * tenant of a table that lives as long as the server), or NULL if none was attached. */
void lkv_rpc_set_principal(lkv_rpc *rpc, const void *principal);
const void *lkv_rpc_principal(const lkv_rpc *rpc);

/* Per-call service state: a pointer the service owns and frees in its cleanup callback. */
void lkv_rpc_set_state(lkv_rpc *rpc, void *state);
void *lkv_rpc_state(const lkv_rpc *rpc);

/* Packs msg (borrowed; may be freed when this returns) as the reply of a unary or
 * client-streaming call. Returns 0, or LKV_ETOOBIG if it exceeds max_message_bytes (the call
 * then fails with RESOURCE_EXHAUSTED and a message saying so; return the code). Call once. */
int lkv_rpc_reply(lkv_rpc *rpc, const ProtobufCMessage *msg);

/* Packs msg (borrowed) as the next message of a server stream; call at most once per next()
 * (and optionally once in start()). Returns 0 or LKV_ETOOBIG as for lkv_rpc_reply. */
int lkv_rpc_send(lkv_rpc *rpc, const ProtobufCMessage *msg);

/* One piece of an already encoded message (lkv_rpc_send_pieces). */
typedef struct lkv_rpc_piece {
    const void *data; /* len bytes. */
    size_t len;       /* Bytes. */
    int borrow;       /* 0: copied now; 1: sent from data itself, without a copy (see below). */
} lkv_rpc_piece;

/* Like lkv_rpc_send (or lkv_rpc_reply), but the message is given already encoded, as the
 * concatenation of pieces[0..n) (the caller writes the protobuf framing). Borrowed pieces go on
 * the wire from their own memory (gRPC slices over it): that memory must stay valid and
 * unchanged until release(arg) is called, exactly once, from any thread, when gRPC has dropped
 * the last of them (after the send, or when the call ends first; also when this fails: then
 * before it returns). release may be NULL if no piece is borrowed. LKV_ETOOBIG (the call fails
 * as lkv_rpc_send would) if the total is over max_message_bytes. */
int lkv_rpc_send_pieces(lkv_rpc *rpc, const lkv_rpc_piece *pieces, int n, void (*release)(void *),
                        void *arg);

/* Sets the status message of the failure the callback is about to return, printf-style, and
 * returns rc, so callbacks can `return lkv_rpc_errorf(rpc, LKV_EINVAL, "...", ...)`. Without
 * it the message is lkv_strerror(rc). */
int lkv_rpc_errorf(lkv_rpc *rpc, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Trailing-metadata key of a retry delay (milliseconds, decimal) sent with a refusal. */
#define LKV_RETRY_AFTER_MD_KEY "retry-after-ms"

/* Asks the client to retry after ms milliseconds: the failure the callback (or admit hook) is
 * about to return carries "retry-after-ms: ms" in its trailing metadata, next to lkv-code. */
void lkv_rpc_set_retry_after(lkv_rpc *rpc, uint64_t ms);

/* 1 if the call arrived over TLS (the transport security type of its auth context is "ssl"),
 * 0 for plaintext. */
int lkv_rpc_transport_secure(const lkv_rpc *rpc);

/* 0 if the call's deadline has not passed, else LKV_ETIMEDOUT (with a message set). Services
 * call it before each expensive step (RocksDB, copies). */
int lkv_rpc_check_deadline(lkv_rpc *rpc);

/* Milliseconds left before the call's deadline (0 once it passed; INT64_MAX without one): a
 * call forwarded to another daemon carries what is left (daemon/cluster/), and a service that
 * hands the call's work to a thread of its own (the worker's serving engine) passes it on. */
int64_t lkv_rpc_deadline_left_ms(const lkv_rpc *rpc);

/* The method path (static) and the peer ("ipv4:127.0.0.1:5555"; borrowed, valid for the call). */
const char *lkv_rpc_method(const lkv_rpc *rpc);
const char *lkv_rpc_peer(lkv_rpc *rpc);

/* The first value of request metadata key (lowercase), copied NUL-terminated into buf (len
 * bytes). Returns its length, or -1 if absent (or longer than len - 1). */
int lkv_rpc_metadata(const lkv_rpc *rpc, const char *key, char *buf, size_t len);

/* Number of request metadata entries named key (lowercase): 0 if absent. With lkv_rpc_metadata
 * it tells "absent" from "present but too long" and catches duplicated headers. */
int lkv_rpc_metadata_count(const lkv_rpc *rpc, const char *key);

/* The largest message the server sends or receives (bytes). */
uint64_t lkv_rpc_max_message_bytes(const lkv_rpc *rpc);

/* 1 if the server is draining (see lkv_server_draining). */
int lkv_rpc_server_draining(const lkv_rpc *rpc);

/* ---- Deferred replies and blocking work ------------------------------------------------ */

/* A parked call's ticket: a handle, not a pointer, so a ticket that outlived its call is
 * harmless (resume then says LKV_ECANCELLED). Copy it freely; valid until lkv_server_destroy. */
typedef struct lkv_rpc_ticket {
    lkv_server *srv; /* The call's server (borrowed). */
    uint64_t id;     /* Slot and generation; 0 is never a live ticket. */
} lkv_rpc_ticket;

/* A resume (or done) function: runs on the call's thread as the continuation of the callback
 * that parked the call, with that callback's contract (unary/on_end: reply and return 0, or
 * return <0; on_message: return 0 to read on; start/next: send or not and return 0; any of
 * them may park again and return LKV_EAGAIN). arg is the one given to resume/offload. */
typedef int (*lkv_resume_fn)(void *svc, lkv_rpc *rpc, void *arg);

/* Work for the pool: runs on a pool thread, may block; must not touch the lkv_rpc (only arg and
 * svc, the method's service). */
typedef void (*lkv_work_fn)(void *svc, void *arg);

/* Parks the call from inside one of its callbacks (unary, on_message, on_end, start, next, or
 * a resume function): the callback must then return LKV_EAGAIN (what it returns is the return
 * value of this function), and the engine does nothing more with the call until it is resumed.
 * Writes the call's ticket into *out (caller-owned); hand it to whichever thread will resume.
 * While parked: a client cancel, the deadline passing or a shutdown cancel ends the call at once
 * (DEADLINE_EXCEEDED / CANCELLED), on its thread: the method's cleanup runs (once, as always),
 * the ticket goes stale, and a later resume returns LKV_ECANCELLED without running anything.
 * Invariant: a ticket resumes at most one continuation, and only of a call that has not ended;
 * the engine frees a call only once no resume can reach it (the ticket table, under one lock,
 * decides each race: resume first = the continuation runs, then the call may end; end first =
 * the resume is refused). Returns LKV_EAGAIN. */
int lkv_rpc_defer(lkv_rpc *rpc, lkv_rpc_ticket *out);

/* Resumes a parked call from any thread: fn(svc, rpc, arg) will run on the call's thread (fn
 * and arg borrowed until then; arg is then fn's). Returns 0 if it will run, LKV_ECANCELLED if
 * the call already ended or the ticket was already used (fn will not run: arg stays the
 * caller's), LKV_EINVAL for a ticket that never was one. Never blocks on the call. */
int lkv_rpc_resume(lkv_rpc_ticket t, lkv_resume_fn fn, void *arg);

/* Resumes a parked unary or client-stream call to finish it from any thread: with rc < 0 it
 * fails with that code (and message: printf-style fmt may be NULL), with rc == 0 it replies
 * with msg (borrowed: packed here, before this returns; LKV_ETOOBIG packs fail the call with
 * RESOURCE_EXHAUSTED). Returns as lkv_rpc_resume. */
int lkv_rpc_finish_deferred(lkv_rpc_ticket t, int rc, const ProtobufCMessage *msg, const char *fmt,
                            ...) __attribute__((format(printf, 4, 5)));

/* Runs work(svc, arg) on a pool thread, then done(svc, rpc, arg) on the call's thread, from
 * inside a callback (as lkv_rpc_defer; the callback returns what this returns, LKV_EAGAIN).
 * arg is borrowed by both (the caller owns it; done usually frees it or keeps it in the call's
 * state). Work cannot be interrupted, so a cancel or deadline while it runs is held: done
 * always runs, and then the call ends with the cancellation (DEADLINE_EXCEEDED / CANCELLED,
 * whatever done replied) and its cleanup runs after done, never while work runs. Jobs run in
 * FIFO order; with pool_threads 0 work runs at once on the calling thread. */
int lkv_rpc_offload(lkv_rpc *rpc, lkv_work_fn work, lkv_resume_fn done, void *arg);

/* Jobs queued or running in the pool now. Thread-safe. */
long lkv_server_pool_backlog(const lkv_server *s);

/* Maps an LKV_* code to the numeric grpc_status_code the edge returns for it (0 is OK): the
 * table is proto/lkv_status.c (lkv_status_from_err); this is that call. */
int lkv_server_status_code(int rc);

/* Returns the static canonical name of a gRPC status code ("INVALID_ARGUMENT"): lkv_status_name. */
const char *lkv_server_status_name(int code);

#endif
