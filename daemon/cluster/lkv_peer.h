/*
 * lkv_peer.h: the daemon's client side of gRPC: calls lazykvd makes to etcd and to other
 * lazykvd members. ALL client-side gRPC core calls of the daemon live in lkv_peer.c (the
 * server side is daemon/lkv_server.c; the user-facing C client is client/lkv_client.c).
 *
 * Why its own module and not client/lkv_client.c: the C client is blocking (one pluck queue per
 * call), which suits users but not a daemon whose polling threads must never wait (DESIGN.md
 * 9.5): a forwarded call parks (lkv_rpc_defer) and is finished from the thread that receives
 * the owner's answer. So this module is asynchronous: one engine thread drains one completion
 * queue (grpc_completion_queue_next) and runs each call's completion callback there; etcd's
 * Watch and LeaseKeepAlive are long-lived bidirectional streams, which the C client has no use
 * for. Blocking wrappers (lkv_peer_unary_sync) are for threads that may wait (membership).
 *
 * Callbacks run on the engine thread, one at a time: they must not block (no sync calls from a
 * callback) and must be quick; they may start new calls and send on streams.
 *
 * Errors are LKV_E* codes: a failed call's code comes from the peer's "lkv-code" trailing
 * metadata when it sends one (another lazykvd), else from the gRPC status through
 * proto/lkv_status.c (etcd: UNAVAILABLE -> LKV_EUNAVAIL, DEADLINE_EXCEEDED -> LKV_ETIMEDOUT).
 */
#ifndef LKV_PEER_H
#define LKV_PEER_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

typedef struct lkv_peer_engine lkv_peer_engine; /* Opaque: one thread, one completion queue. */
typedef struct lkv_peer_chan lkv_peer_chan;     /* Opaque: one channel to one target. */
typedef struct lkv_peer_stream lkv_peer_stream; /* Opaque: one bidirectional stream. */

/* One request metadata entry (key lowercase); both strings borrowed for the starting call. */
typedef struct lkv_peer_md {
    const char *key;
    const char *value;
} lkv_peer_md;

/* Starts the engine thread. *out owned by the caller (lkv_peer_engine_destroy). Initialises
 * gRPC core (grpc_init; balanced in destroy). Returns 0 or LKV_ENOMEM. */
int lkv_peer_engine_create(lkv_peer_engine **out);

/* Cancels every call still running (their callbacks run, with LKV_ECANCELLED), waits for all of
 * them, stops the thread and frees e. Every channel must be destroyed first. NULL is allowed.
 * Not from a callback. */
void lkv_peer_engine_destroy(lkv_peer_engine *e);

/* A channel to target ("host:port", any gRPC target), insecure, with max_message_bytes as the
 * send and receive limit (0: 64 MiB). Owned by the caller: lkv_peer_chan_destroy. Connects
 * lazily; never fails except for memory (NULL). */
lkv_peer_chan *lkv_peer_chan_create(lkv_peer_engine *e, const char *target,
                                    uint64_t max_message_bytes);

/* The target given at create (borrowed, valid until destroy). */
const char *lkv_peer_chan_target(const lkv_peer_chan *c);

/* Destroys the channel; calls on it still running are cancelled (their callbacks still run).
 * NULL is allowed. Thread-safe, not from a callback of a call on c. */
void lkv_peer_chan_destroy(lkv_peer_chan *c);

/* Completion of a unary call, on the engine thread: rc 0 and resp (owned by the callback:
 * protobuf_c_message_free_unpacked(resp, NULL)) or rc < 0, resp NULL, msg the status message
 * (borrowed for the callback). */
typedef void (*lkv_peer_done_fn)(void *arg, int rc, const char *msg, ProtobufCMessage *resp);

/* Starts a unary call of method ("/etcdserverpb.KV/Range") with req (packed here: borrowed for
 * this call only), md[0..n_md) as metadata, deadline deadline_ms from now (> 0). done(arg, ...)
 * runs exactly once, on the engine thread (also when the start fails: then before this returns
 * it is NOT called and the code is returned instead). Returns 0 (done will run), LKV_EINVAL,
 * LKV_ETOOBIG (request over the channel's limit) or LKV_ESHUTDOWN (engine stopping). */
int lkv_peer_unary(lkv_peer_chan *c, const char *method, const ProtobufCMessage *req,
                   const ProtobufCMessageDescriptor *resp_desc, const lkv_peer_md *md, size_t n_md,
                   int64_t deadline_ms, lkv_peer_done_fn done, void *arg);

/* Blocking unary call for threads that may wait (never a polling thread or a callback). On 0
 * *resp is the reply (caller frees with protobuf_c_message_free_unpacked). On error msg (may be
 * NULL; msglen bytes) receives the status message. */
int lkv_peer_unary_sync(lkv_peer_chan *c, const char *method, const ProtobufCMessage *req,
                        const ProtobufCMessageDescriptor *resp_desc, const lkv_peer_md *md,
                        size_t n_md, int64_t deadline_ms, ProtobufCMessage **resp, char *msg,
                        size_t msglen);

/* Callbacks of a stream, on the engine thread. on_msg: one received message (owned by the
 * callback). on_end: the stream is over (rc 0 if the server closed it with OK, else the code and
 * status message); nothing more arrives and sends are refused after it. */
typedef void (*lkv_peer_msg_fn)(void *arg, ProtobufCMessage *msg);
typedef void (*lkv_peer_end_fn)(void *arg, int rc, const char *msg);

/* Opens a bidirectional stream of method on c: metadata md, deadline deadline_ms from now (0:
 * none). Messages arrive through on_msg until on_end, which runs exactly once (if this returns
 * 0). *out is the caller's reference: drop it with lkv_peer_stream_release (after which no
 * callback touches arg once on_end has run). Returns 0, LKV_EINVAL, LKV_ESHUTDOWN. */
int lkv_peer_stream_open(lkv_peer_chan *c, const char *method,
                         const ProtobufCMessageDescriptor *resp_desc, const lkv_peer_md *md,
                         size_t n_md, int64_t deadline_ms, lkv_peer_msg_fn on_msg,
                         lkv_peer_end_fn on_end, void *arg, lkv_peer_stream **out);

/* Queues msg (packed now; borrowed) for sending; messages go out in order, one at a time.
 * Returns 0, LKV_ETOOBIG, or LKV_ECANCELLED once the stream ended. Thread-safe. */
int lkv_peer_stream_send(lkv_peer_stream *s, const ProtobufCMessage *msg);

/* Half-closes the stream after the messages queued so far (SEND_CLOSE_FROM_CLIENT): a
 * server-streaming call sends its one request then this. Further sends are refused. Returns 0
 * or LKV_ECANCELLED once the stream ended. Thread-safe. */
int lkv_peer_stream_close_send(lkv_peer_stream *s);

/* Cancels the stream (on_end then runs with LKV_ECANCELLED unless it already ran). Thread-safe.
 * NULL is allowed. */
void lkv_peer_stream_cancel(lkv_peer_stream *s);

/* Cancels the stream and drops the caller's reference. The callbacks may still run once
 * (on_end) on the engine thread until it has ended: an owner that frees arg waits for on_end
 * first. NULL is allowed. */
void lkv_peer_stream_release(lkv_peer_stream *s);

#endif
