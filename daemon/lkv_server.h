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
 * Request messages passed to callbacks are borrowed: valid until the callback returns.
 *
 * The engine checks the call's deadline before every callback (DEADLINE_EXCEEDED), stops a
 * stream whose client went away (cleanup only), unpacks with the method's size limit (over it:
 * RESOURCE_EXHAUSTED) through lkv_pb_unpack, whose wire scanner keeps decoding linear in the
 * size (malformed, repeated singular fields, bad strings: INVALID_ARGUMENT), answers methods it
 * does not know with UNIMPLEMENTED, maps LKV_* codes to gRPC status codes in one place
 * (lkv_server_status_code), and logs every refused call once (client errors at info, server errors
 * at warn) with the method, the peer and the message.
 *
 * Shutdown is a drain (lkv_server_shutdown): stop accepting calls, let in-flight calls finish
 * for a grace period, cancel the rest, wait for every callback and cleanup, stop the threads.
 */
#ifndef LKV_SERVER_H
#define LKV_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

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
    void *admit_ctx; /* Passed to admit (borrowed until destroy). */
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

/* Per-method counters (Redis commandstats style) of method i (0..n-1, the registration order):
 * *path borrowed (static), calls finished, of which failed, total wall time in microseconds.
 * Returns 0, or LKV_EINVAL for a bad i. Thread-safe. */
int lkv_server_method_stats(const lkv_server *s, int i, const char **path, uint64_t *calls,
                            uint64_t *errors, uint64_t *usec);

/* Calls in progress now. Thread-safe. */
long lkv_server_calls_in_flight(const lkv_server *s);

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

/* Sets the status message of the failure the callback is about to return, printf-style, and
 * returns rc, so callbacks can `return lkv_rpc_errorf(rpc, LKV_EINVAL, "...", ...)`. Without
 * it the message is lkv_strerror(rc). */
int lkv_rpc_errorf(lkv_rpc *rpc, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* 0 if the call's deadline has not passed, else LKV_ETIMEDOUT (with a message set). Services
 * call it before each expensive step (RocksDB, copies). */
int lkv_rpc_check_deadline(lkv_rpc *rpc);

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

/* Maps an LKV_* code to the numeric grpc_status_code the edge returns for it (0 is OK). The one
 * mapping table of the daemon: EINVAL, EPROTO, EPROFILE -> INVALID_ARGUMENT; ENOTFOUND ->
 * NOT_FOUND; EEXIST -> ALREADY_EXISTS; ENOSPC, ETOOBIG, ENOMEM -> RESOURCE_EXHAUSTED; EBUSY ->
 * FAILED_PRECONDITION; ETIMEDOUT -> DEADLINE_EXCEEDED; ECANCELLED -> CANCELLED; EUNAUTH ->
 * UNAUTHENTICATED; EPERM -> PERMISSION_DENIED; EUNAVAIL, ESHUTDOWN, EAGAIN -> UNAVAILABLE;
 * ENOTSUP -> UNIMPLEMENTED; ECORRUPT -> DATA_LOSS; anything else -> INTERNAL. */
int lkv_server_status_code(int rc);

/* Returns the static canonical name of a gRPC status code ("INVALID_ARGUMENT"). */
const char *lkv_server_status_name(int code);

#endif
