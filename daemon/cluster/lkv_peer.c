/*
 * lkv_peer.c: the daemon's asynchronous gRPC client (see lkv_peer.h).
 *
 * One completion queue, one thread draining it with grpc_completion_queue_next. Every batch's
 * tag is a `tag` whose fn advances its call. Calls are counted in engine->live (a unary call
 * until its done callback returned, a stream until on_end ran and its last batch completed);
 * destroy cancels the calls on the engine's list and waits for live to reach 0 before shutting
 * the queue down (grpc_completion_queue_shutdown needs no batch outstanding).
 *
 * Unary: one batch of the six client ops (DESIGN.md 9.4). Stream: batch "init" (SEND_INITIAL_
 * METADATA + RECV_INITIAL_METADATA), batch "status" (RECV_STATUS_ON_CLIENT, outstanding for the
 * whole stream), a RECV_MESSAGE batch re-armed after each message, and at most one SEND_MESSAGE
 * batch at a time from a queue (a second one in flight is GRPC_CALL_ERROR_TOO_MANY_OPERATIONS).
 * A stream's batches are started under its mutex (grpc.h: start_batch must be synchronised per
 * call). on_end runs once the status arrived and the receive loop stopped, so no message is
 * delivered after it.
 */
#include "lkv_peer.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_pb.h"
#include "lkv_status.h"

#define MAX_MD  8
#define MSG_MAX 256

typedef struct tag {
    void (*fn)(struct tag *t, int ok);
} tag;

/* What every call has: its place on the engine's list (for cancel-all) and its gRPC call. */
typedef struct pcall {
    struct pcall *prev, *next;
    lkv_peer_engine *e;
    grpc_call *call;
} pcall;

struct lkv_peer_engine {
    grpc_completion_queue *cq;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long live;
    int stopping;
    pcall head; /* Sentinel of the list of live calls. */
};

struct lkv_peer_chan {
    lkv_peer_engine *e;
    grpc_channel *ch;
    char *target;
    size_t max;
};

/* ---- engine ------------------------------------------------------------------------------ */

static void *engine_main(void *arg)
{
    lkv_peer_engine *e = arg;
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(e->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) {
            break;
        }
        if (ev.type == GRPC_OP_COMPLETE) {
            tag *t = ev.tag;
            t->fn(t, ev.success);
        }
    }
    return NULL;
}

int lkv_peer_engine_create(lkv_peer_engine **out)
{
    *out = NULL;
    grpc_init();
    lkv_peer_engine *e = lkv_xcalloc(1, sizeof(*e));
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->head.prev = e->head.next = &e->head;
    e->cq = grpc_completion_queue_create_for_next(NULL);
    if (pthread_create(&e->th, NULL, engine_main, e) != 0) {
        grpc_completion_queue_shutdown(e->cq);
        grpc_completion_queue_destroy(e->cq);
        free(e);
        grpc_shutdown();
        return LKV_ENOMEM;
    }
    *out = e;
    return 0;
}

void lkv_peer_engine_destroy(lkv_peer_engine *e)
{
    if (e == NULL) {
        return;
    }
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    for (pcall *p = e->head.next; p != &e->head; p = p->next) {
        if (p->call != NULL) {
            grpc_call_cancel(p->call, NULL);
        }
    }
    while (e->live > 0) {
        pthread_cond_wait(&e->cv, &e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    grpc_completion_queue_shutdown(e->cq);
    pthread_join(e->th, NULL);
    grpc_completion_queue_destroy(e->cq);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
    grpc_shutdown();
}

/* Registers a new call; LKV_ESHUTDOWN if the engine is stopping. */
static int call_enter(lkv_peer_engine *e, pcall *p)
{
    pthread_mutex_lock(&e->mu);
    if (e->stopping) {
        pthread_mutex_unlock(&e->mu);
        return LKV_ESHUTDOWN;
    }
    p->e = e;
    p->next = e->head.next;
    p->prev = &e->head;
    e->head.next->prev = p;
    e->head.next = p;
    e->live++;
    pthread_mutex_unlock(&e->mu);
    return 0;
}

static void call_leave(pcall *p)
{
    lkv_peer_engine *e = p->e;
    pthread_mutex_lock(&e->mu);
    p->prev->next = p->next;
    p->next->prev = p->prev;
    if (--e->live == 0) {
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
}

/* ---- channels ---------------------------------------------------------------------------- */

lkv_peer_chan *lkv_peer_chan_create(lkv_peer_engine *e, const char *target,
                                    uint64_t max_message_bytes)
{
    lkv_peer_chan *c = lkv_xcalloc(1, sizeof(*c));
    c->e = e;
    c->target = lkv_xstrdup(target);
    c->max = max_message_bytes == 0 ? (64u << 20) : (size_t)max_message_bytes;
    if (c->max > INT_MAX) {
        c->max = INT_MAX;
    }
    grpc_arg args[3];
    memset(args, 0, sizeof(args));
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)c->max;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = (int)c->max;
    /* A member that comes back must be reachable again soon: cap gRPC's reconnect backoff
     * (default up to 120 s) so a health check after a restart finds it within a second. */
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
    args[2].value.integer = 1000;
    grpc_channel_args cargs = {3, args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    c->ch = grpc_channel_create(target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    return c;
}

const char *lkv_peer_chan_target(const lkv_peer_chan *c)
{
    return c->target;
}

void lkv_peer_chan_destroy(lkv_peer_chan *c)
{
    if (c == NULL) {
        return;
    }
    grpc_channel_destroy(c->ch); /* Calls on it hold their own reference and run to the end. */
    free(c->target);
    free(c);
}

static grpc_call *new_call(lkv_peer_chan *c, const char *method, int64_t deadline_ms)
{
    gpr_timespec dl = deadline_ms > 0
                          ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                         gpr_time_from_millis(deadline_ms, GPR_TIMESPAN))
                          : gpr_inf_future(GPR_CLOCK_MONOTONIC);
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *call =
        grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->e->cq, m, NULL, dl, NULL);
    grpc_slice_unref(m);
    return call;
}

static size_t md_fill(grpc_metadata *out, const lkv_peer_md *md, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k < MAX_MD; i++) {
        if (md[i].key == NULL || md[i].value == NULL) {
            continue;
        }
        memset(&out[k], 0, sizeof(out[k]));
        out[k].key = grpc_slice_from_copied_string(md[i].key);
        out[k].value = grpc_slice_from_copied_string(md[i].value);
        k++;
    }
    return k;
}

static void md_free(grpc_metadata *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        grpc_slice_unref(m[i].key);
        grpc_slice_unref(m[i].value);
    }
}

/* Maps a finished call's status (with the peer's lkv-code if any) to LKV_E*, message in msg. */
static int status_rc(grpc_status_code st, grpc_slice details, const grpc_metadata_array *trail,
                     char *msg, size_t msglen)
{
    if (st == GRPC_STATUS_OK) {
        msg[0] = '\0';
        return 0;
    }
    size_t n = GRPC_SLICE_LENGTH(details);
    if (n >= msglen) {
        n = msglen - 1;
    }
    memcpy(msg, GRPC_SLICE_START_PTR(details), n);
    msg[n] = '\0';
    if (n == 0) {
        snprintf(msg, msglen, "gRPC status %s", lkv_status_name((int)st));
    }
    const char *code = NULL;
    size_t code_len = 0;
    for (size_t i = 0; trail != NULL && i < trail->count; i++) {
        if (grpc_slice_str_cmp(trail->metadata[i].key, LKV_STATUS_MD_KEY) == 0) {
            code = (const char *)GRPC_SLICE_START_PTR(trail->metadata[i].value);
            code_len = GRPC_SLICE_LENGTH(trail->metadata[i].value);
            break;
        }
    }
    return lkv_status_to_err((int)st, code, code_len);
}

/* ---- unary ------------------------------------------------------------------------------- */

typedef struct ucall {
    pcall base;
    tag t;
    grpc_metadata md[MAX_MD];
    size_t n_md;
    grpc_byte_buffer *send, *recv;
    grpc_metadata_array init_md, trail_md;
    grpc_status_code status;
    grpc_slice details;
    const ProtobufCMessageDescriptor *desc;
    size_t max;
    lkv_peer_done_fn done;
    void *arg;
} ucall;

static void unary_done(tag *t, int ok)
{
    ucall *u = (ucall *)((char *)t - offsetof(ucall, t));
    char msg[MSG_MAX];
    ProtobufCMessage *resp = NULL;
    int rc;
    if (!ok) {
        rc = LKV_EINTERNAL;
        snprintf(msg, sizeof(msg), "peer call batch failed");
    } else {
        rc = status_rc(u->status, u->details, &u->trail_md, msg, sizeof(msg));
    }
    if (rc == 0) {
        if (u->recv == NULL) {
            rc = LKV_EPROTO;
            snprintf(msg, sizeof(msg), "the peer replied OK without a message");
        } else {
            rc = lkv_pb_unpack(u->desc, u->recv, u->max, &resp, msg, sizeof(msg));
        }
    }
    u->done(u->arg, rc, msg, rc == 0 ? resp : NULL);
    if (u->recv != NULL) {
        grpc_byte_buffer_destroy(u->recv);
    }
    grpc_byte_buffer_destroy(u->send);
    grpc_metadata_array_destroy(&u->init_md);
    grpc_metadata_array_destroy(&u->trail_md);
    grpc_slice_unref(u->details);
    md_free(u->md, u->n_md);
    call_leave(&u->base); /* Before the unref: destroy may cancel calls on the list. */
    grpc_call_unref(u->base.call);
    free(u);
}

int lkv_peer_unary(lkv_peer_chan *c, const char *method, const ProtobufCMessage *req,
                   const ProtobufCMessageDescriptor *resp_desc, const lkv_peer_md *md, size_t n_md,
                   int64_t deadline_ms, lkv_peer_done_fn done, void *arg)
{
    if (c == NULL || method == NULL || req == NULL || resp_desc == NULL || done == NULL ||
        deadline_ms <= 0) {
        return LKV_EINVAL;
    }
    ucall *u = lkv_xcalloc(1, sizeof(*u));
    int rc = lkv_pb_pack(req, c->max, &u->send, NULL, 0);
    if (rc != 0) {
        free(u);
        return rc;
    }
    rc = call_enter(c->e, &u->base);
    if (rc != 0) {
        grpc_byte_buffer_destroy(u->send);
        free(u);
        return rc;
    }
    u->t.fn = unary_done;
    u->desc = resp_desc;
    u->max = c->max;
    u->done = done;
    u->arg = arg;
    u->n_md = md_fill(u->md, md, n_md);
    grpc_metadata_array_init(&u->init_md);
    grpc_metadata_array_init(&u->trail_md);
    u->details = grpc_empty_slice();
    pthread_mutex_lock(&c->e->mu);
    u->base.call = new_call(c, method, deadline_ms);
    pthread_mutex_unlock(&c->e->mu);
    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = u->n_md;
    ops[0].data.send_initial_metadata.metadata = u->n_md ? u->md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = u->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &u->init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &u->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &u->trail_md;
    ops[5].data.recv_status_on_client.status = &u->status;
    ops[5].data.recv_status_on_client.status_details = &u->details;
    grpc_call_error ge = grpc_call_start_batch(u->base.call, ops, 6, &u->t, NULL);
    if (ge != GRPC_CALL_OK) {
        LKV_LOGW("peer: start_batch of %s to %s failed: %d", method, c->target, (int)ge);
        grpc_byte_buffer_destroy(u->send);
        grpc_metadata_array_destroy(&u->init_md);
        grpc_metadata_array_destroy(&u->trail_md);
        md_free(u->md, u->n_md);
        call_leave(&u->base);
        grpc_call_unref(u->base.call);
        free(u);
        return LKV_EINTERNAL;
    }
    return 0;
}

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int finished;
    int rc;
    ProtobufCMessage *resp;
    char msg[MSG_MAX];
} waiter;

static void sync_done(void *arg, int rc, const char *msg, ProtobufCMessage *resp)
{
    waiter *w = arg;
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    w->resp = resp;
    snprintf(w->msg, sizeof(w->msg), "%s", msg != NULL ? msg : "");
    w->finished = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int lkv_peer_unary_sync(lkv_peer_chan *c, const char *method, const ProtobufCMessage *req,
                        const ProtobufCMessageDescriptor *resp_desc, const lkv_peer_md *md,
                        size_t n_md, int64_t deadline_ms, ProtobufCMessage **resp, char *msg,
                        size_t msglen)
{
    waiter w;
    memset(&w, 0, sizeof(w));
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    *resp = NULL;
    int rc = lkv_peer_unary(c, method, req, resp_desc, md, n_md, deadline_ms, sync_done, &w);
    if (rc == 0) {
        pthread_mutex_lock(&w.mu);
        while (!w.finished) {
            pthread_cond_wait(&w.cv, &w.mu);
        }
        pthread_mutex_unlock(&w.mu);
        rc = w.rc;
        *resp = w.resp;
    } else {
        snprintf(w.msg, sizeof(w.msg), "%s", lkv_strerror(rc));
    }
    if (msg != NULL && msglen > 0) {
        snprintf(msg, msglen, "%s", w.msg);
    }
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return rc;
}

/* ---- streams ----------------------------------------------------------------------------- */

typedef struct sendq {
    struct sendq *next;
    grpc_byte_buffer *bb;
} sendq;

struct lkv_peer_stream {
    pcall base;
    pthread_mutex_t mu;
    int refs;    /* Caller's reference + 1 while the stream runs. */
    int pending; /* Batches outstanding. */
    tag t_init, t_recv, t_status, t_send, t_close;
    grpc_metadata md[MAX_MD];
    size_t n_md;
    grpc_metadata_array init_md, trail_md;
    grpc_status_code status;
    grpc_slice details;
    grpc_byte_buffer *rbuf;
    sendq *sq_head, *sq_tail;
    grpc_byte_buffer *sending; /* In flight, NULL if none. */
    int recv_over;             /* The receive loop stopped. */
    int status_done;
    int ended; /* on_end ran (or is running). */
    int sends_off;
    int close_pending; /* Half-close once the queue is empty. */
    size_t max;
    const ProtobufCMessageDescriptor *desc;
    lkv_peer_msg_fn on_msg;
    lkv_peer_end_fn on_end;
    void *arg;
};

static void stream_free(lkv_peer_stream *s)
{
    for (sendq *q = s->sq_head; q != NULL;) {
        sendq *n = q->next;
        grpc_byte_buffer_destroy(q->bb);
        free(q);
        q = n;
    }
    grpc_metadata_array_destroy(&s->init_md);
    grpc_metadata_array_destroy(&s->trail_md);
    grpc_slice_unref(s->details);
    md_free(s->md, s->n_md);
    if (s->base.call != NULL) {
        grpc_call_unref(s->base.call);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Drops one reference (under s->mu, which this releases); frees at zero. */
static void stream_unref_locked(lkv_peer_stream *s)
{
    int left = --s->refs;
    pthread_mutex_unlock(&s->mu);
    if (left == 0) {
        stream_free(s);
    }
}

/* After any batch completed (under s->mu): runs on_end when due, and ends the engine's hold
 * once nothing is outstanding. Releases s->mu. */
static void stream_settle_locked(lkv_peer_stream *s)
{
    if (!s->ended && s->status_done && s->recv_over) {
        s->ended = 1;
        s->sends_off = 1;
        char msg[MSG_MAX];
        int rc = status_rc(s->status, s->details, &s->trail_md, msg, sizeof(msg));
        pthread_mutex_unlock(&s->mu);
        s->on_end(s->arg, rc, msg);
        pthread_mutex_lock(&s->mu);
    }
    if (s->ended && s->pending == 0) {
        s->pending = -1; /* Hold dropped once. */
        call_leave(&s->base);
        stream_unref_locked(s);
        return;
    }
    pthread_mutex_unlock(&s->mu);
}

static int start_recv_locked(lkv_peer_stream *s)
{
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->rbuf;
    s->rbuf = NULL;
    if (grpc_call_start_batch(s->base.call, &op, 1, &s->t_recv, NULL) != GRPC_CALL_OK) {
        return -1;
    }
    s->pending++;
    return 0;
}

static void start_send_locked(lkv_peer_stream *s)
{
    if (s->sending == NULL && s->sq_head == NULL && s->close_pending && !s->sends_off) {
        /* Everything queued went out: half-close now (the same one-send-at-a-time slot). */
        grpc_op op;
        memset(&op, 0, sizeof(op));
        op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        s->close_pending = 0;
        s->sends_off = 1;
        if (grpc_call_start_batch(s->base.call, &op, 1, &s->t_close, NULL) == GRPC_CALL_OK) {
            s->pending++;
        }
        return;
    }
    if (s->sending != NULL || s->sq_head == NULL || s->sends_off) {
        return;
    }
    sendq *q = s->sq_head;
    s->sq_head = q->next;
    if (s->sq_head == NULL) {
        s->sq_tail = NULL;
    }
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = q->bb;
    if (grpc_call_start_batch(s->base.call, &op, 1, &s->t_send, NULL) != GRPC_CALL_OK) {
        grpc_byte_buffer_destroy(q->bb);
        free(q);
        s->sends_off = 1;
        return;
    }
    s->sending = q->bb;
    s->pending++;
    free(q);
}

static void on_init(tag *t, int ok)
{
    lkv_peer_stream *s = (lkv_peer_stream *)((char *)t - offsetof(lkv_peer_stream, t_init));
    (void)ok;
    pthread_mutex_lock(&s->mu);
    s->pending--;
    stream_settle_locked(s);
}

static void on_status(tag *t, int ok)
{
    lkv_peer_stream *s = (lkv_peer_stream *)((char *)t - offsetof(lkv_peer_stream, t_status));
    pthread_mutex_lock(&s->mu);
    s->pending--;
    if (!ok) {
        s->status = GRPC_STATUS_INTERNAL;
    }
    s->status_done = 1;
    stream_settle_locked(s);
}

static void on_send(tag *t, int ok)
{
    lkv_peer_stream *s = (lkv_peer_stream *)((char *)t - offsetof(lkv_peer_stream, t_send));
    pthread_mutex_lock(&s->mu);
    s->pending--;
    grpc_byte_buffer_destroy(s->sending);
    s->sending = NULL;
    if (!ok) {
        s->sends_off = 1;
    }
    start_send_locked(s);
    stream_settle_locked(s);
}

static void on_close(tag *t, int ok)
{
    lkv_peer_stream *s = (lkv_peer_stream *)((char *)t - offsetof(lkv_peer_stream, t_close));
    (void)ok;
    pthread_mutex_lock(&s->mu);
    s->pending--;
    stream_settle_locked(s);
}

int lkv_peer_stream_close_send(lkv_peer_stream *s)
{
    pthread_mutex_lock(&s->mu);
    if (s->sends_off || s->ended) {
        pthread_mutex_unlock(&s->mu);
        return LKV_ECANCELLED;
    }
    s->close_pending = 1;
    start_send_locked(s);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static void on_recv(tag *t, int ok)
{
    lkv_peer_stream *s = (lkv_peer_stream *)((char *)t - offsetof(lkv_peer_stream, t_recv));
    pthread_mutex_lock(&s->mu);
    s->pending--;
    grpc_byte_buffer *bb = s->rbuf;
    s->rbuf = NULL;
    if (!ok || bb == NULL || s->ended) {
        if (bb != NULL) {
            grpc_byte_buffer_destroy(bb);
        }
        s->recv_over = 1;
        stream_settle_locked(s);
        return;
    }
    pthread_mutex_unlock(&s->mu);
    ProtobufCMessage *m = NULL;
    char err[MSG_MAX];
    int rc = lkv_pb_unpack(s->desc, bb, s->max, &m, err, sizeof(err));
    grpc_byte_buffer_destroy(bb);
    if (rc == 0) {
        s->on_msg(s->arg, m);
    } else {
        LKV_LOGW("peer: malformed stream message: %s", err);
        grpc_call_cancel(s->base.call, NULL);
    }
    pthread_mutex_lock(&s->mu);
    if (start_recv_locked(s) != 0) {
        s->recv_over = 1;
    }
    stream_settle_locked(s);
}

int lkv_peer_stream_open(lkv_peer_chan *c, const char *method,
                         const ProtobufCMessageDescriptor *resp_desc, const lkv_peer_md *md,
                         size_t n_md, int64_t deadline_ms, lkv_peer_msg_fn on_msg,
                         lkv_peer_end_fn on_end, void *arg, lkv_peer_stream **out)
{
    *out = NULL;
    if (c == NULL || method == NULL || resp_desc == NULL || on_msg == NULL || on_end == NULL) {
        return LKV_EINVAL;
    }
    lkv_peer_stream *s = lkv_xcalloc(1, sizeof(*s));
    int rc = call_enter(c->e, &s->base);
    if (rc != 0) {
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->refs = 2;
    s->t_init.fn = on_init;
    s->t_recv.fn = on_recv;
    s->t_status.fn = on_status;
    s->t_send.fn = on_send;
    s->t_close.fn = on_close;
    s->max = c->max;
    s->desc = resp_desc;
    s->on_msg = on_msg;
    s->on_end = on_end;
    s->arg = arg;
    s->n_md = md_fill(s->md, md, n_md);
    grpc_metadata_array_init(&s->init_md);
    grpc_metadata_array_init(&s->trail_md);
    s->details = grpc_empty_slice();
    pthread_mutex_lock(&c->e->mu);
    s->base.call = new_call(c, method, deadline_ms);
    pthread_mutex_unlock(&c->e->mu);

    pthread_mutex_lock(&s->mu);
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = s->n_md;
    ops[0].data.send_initial_metadata.metadata = s->n_md ? s->md : NULL;
    ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[1].data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
    int bad = grpc_call_start_batch(s->base.call, ops, 2, &s->t_init, NULL) != GRPC_CALL_OK;
    if (!bad) {
        s->pending++;
        memset(ops, 0, sizeof(ops));
        ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        ops[0].data.recv_status_on_client.trailing_metadata = &s->trail_md;
        ops[0].data.recv_status_on_client.status = &s->status;
        ops[0].data.recv_status_on_client.status_details = &s->details;
        bad = grpc_call_start_batch(s->base.call, ops, 1, &s->t_status, NULL) != GRPC_CALL_OK;
        if (!bad) {
            s->pending++;
            bad = start_recv_locked(s) != 0;
        }
    }
    if (bad) {
        /* Cannot happen with a fresh call; fail the stream through the normal path. */
        LKV_LOGW("peer: cannot start stream %s to %s", method, c->target);
        grpc_call_cancel(s->base.call, NULL);
        s->recv_over = 1;
        if (s->pending == 0) {
            s->status_done = 1;
            s->status = GRPC_STATUS_INTERNAL;
        }
    }
    pthread_mutex_unlock(&s->mu);
    *out = s;
    return 0;
}

int lkv_peer_stream_send(lkv_peer_stream *s, const ProtobufCMessage *msg)
{
    grpc_byte_buffer *bb = NULL;
    int rc = lkv_pb_pack(msg, s->max, &bb, NULL, 0);
    if (rc != 0) {
        return rc;
    }
    pthread_mutex_lock(&s->mu);
    if (s->sends_off || s->ended || s->close_pending) {
        pthread_mutex_unlock(&s->mu);
        grpc_byte_buffer_destroy(bb);
        return LKV_ECANCELLED;
    }
    sendq *q = lkv_xcalloc(1, sizeof(*q));
    q->bb = bb;
    if (s->sq_tail != NULL) {
        s->sq_tail->next = q;
    } else {
        s->sq_head = q;
    }
    s->sq_tail = q;
    start_send_locked(s);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void lkv_peer_stream_cancel(lkv_peer_stream *s)
{
    if (s == NULL) {
        return;
    }
    pthread_mutex_lock(&s->mu);
    if (!s->ended && s->base.call != NULL) {
        grpc_call_cancel(s->base.call, NULL);
    }
    pthread_mutex_unlock(&s->mu);
}

void lkv_peer_stream_release(lkv_peer_stream *s)
{
    if (s == NULL) {
        return;
    }
    lkv_peer_stream_cancel(s);
    pthread_mutex_lock(&s->mu);
    stream_unref_locked(s);
}
