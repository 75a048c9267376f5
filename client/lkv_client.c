/*
 * lkv_client.c: the lazykv C client library: every client-side gRPC core call lives here.
 *
 * Threading: the handle holds one grpc_channel (thread-safe in gRPC core) and immutable
 * settings; each call creates its own pluck completion queue and plucks its own tags, so no
 * lock is needed. A put handle is used by one thread at a time (documented in the header).
 *
 * Batches, per grpc-core notes B4:
 *   unary (Lookup, Delete, Stats, List, Evict, Attach, Release, Health/Check): one batch of
 *     SEND_INITIAL_METADATA,
 *     SEND_MESSAGE, SEND_CLOSE_FROM_CLIENT, RECV_INITIAL_METADATA, RECV_MESSAGE,
 *     RECV_STATUS_ON_CLIENT.
 *   client streaming (Put): SEND_INITIAL_METADATA with the first SEND_MESSAGE, then one
 *     SEND_MESSAGE batch at a time, then SEND_CLOSE_FROM_CLIENT + RECV_INITIAL_METADATA +
 *     RECV_MESSAGE + RECV_STATUS_ON_CLIENT. A send that completes with success == 0 means the
 *     call is over (the daemon refused it or the connection died): the status is then read
 *     at once with a RECV_STATUS_ON_CLIENT batch and kept in the put handle.
 *   server streaming (Get): SEND_* + SEND_CLOSE_FROM_CLIENT + RECV_INITIAL_METADATA, then
 *     RECV_MESSAGE batches until a NULL message, then RECV_STATUS_ON_CLIENT.
 * Each batch is started and plucked before the next one starts, so at most one batch is ever
 * in flight per call and every byte buffer is destroyed after its batch completed.
 *
 * Errors: the gRPC status and its "lkv-code" trailing metadata are mapped to LKV_E* only in
 * call_status_rc, through proto/lkv_status (the one table); the status message is kept per
 * thread (tl_err) for lkv_client_last_error and never parsed.
 */
#include "lkv_client.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "lazykv/v1/admin.pb-c.h"
#include "lazykv/v1/cache.pb-c.h"
#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_pb.h"
#include "lkv_wire.h"
#include "lkv_status.h"

#define ERR_MAX        512
#define GET_MAX_BLOCKS 4096u      /* A document has at most 4096 blocks (lkv_layout.h). */
#define PUT_TARGET_MSG (4u << 20) /* One-shot put: aim for messages of about this size. */

struct lkv_client {
    grpc_channel *channel; /* Shared by every call; thread-safe. */
    size_t max_msg;        /* Max message bytes, both directions. */
    int deadline_ms;       /* Default deadline. */
    int has_auth;          /* 1 if auth_md is set. */
    grpc_metadata auth_md; /* "authorization: Bearer <token>"; slices owned here. */
};

/* One call in progress: its queue, the call and what the status batch fills in. */
typedef struct call {
    lkv_client_t *c;              /* Borrowed. */
    grpc_completion_queue *cq;    /* Pluck queue owned by this call. */
    grpc_call *call;              /* Owned; unref in call_end. */
    grpc_metadata_array init_md;  /* Received initial metadata. */
    grpc_metadata_array trail_md; /* Received trailing metadata. */
    grpc_status_code status;      /* Final status (valid once status_done). */
    grpc_slice details;           /* Status message (valid once status_done). */
    int md_sent;                  /* SEND_INITIAL_METADATA done. */
    int status_done;              /* RECV_STATUS_ON_CLIENT completed. */
    int init_md_asked;            /* RECV_INITIAL_METADATA was started. */
    int msg_eos;                  /* A RECV_MESSAGE returned end of stream. */
} call;

struct lkv_put {
    call cl;              /* The Put call. */
    char *profile;        /* Header: owned copy. */
    uint32_t *tokens;     /* Header: owned copy of n_tokens ids. */
    size_t n_tokens;      /* Header token count. */
    uint32_t n_blocks;    /* Header block count (0: not said). */
    int header_pending;   /* The header has not been sent yet. */
    lkv_put_options opt;  /* Header: residency options (zero: none). */
    int failed;           /* Non-zero: the call is over with this LKV_E* code. */
    char errmsg[ERR_MAX]; /* Message of failed. */
    int errstatus;        /* gRPC status of failed. */
    struct put_refs *zc;  /* Zero-copy sends (lkv_client_put_ex): slices over caller memory
                           * still held by gRPC (owned; waited for in put_free). NULL: the
                           * streaming API, whose messages are packed (copied). */
};

/* Per-thread last error. */
static _Thread_local struct {
    int status;
    char msg[ERR_MAX];
    int64_t retry_after_ms; /* "retry-after-ms" of the last failure, or -1. */
} tl_err = {0, "", -1};

static void err_clear(void)
{
    tl_err.status = 0;
    tl_err.msg[0] = '\0';
    tl_err.retry_after_ms = -1;
}

static int err_local(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Records a local error (nothing reached gRPC) and returns rc. */
static int err_local(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_err.msg, sizeof(tl_err.msg), fmt, ap);
    va_end(ap);
    tl_err.status = -1;
    tl_err.retry_after_ms = -1;
    return rc;
}

const char *lkv_client_last_error(void)
{
    return tl_err.msg;
}

int lkv_client_last_status(void)
{
    return tl_err.status;
}

int64_t lkv_client_last_retry_after_ms(void)
{
    return tl_err.retry_after_ms;
}

/* ---- handle ---- */

/* Reads a whole file as a NUL-terminated string (malloc'ed), or NULL with errno set. */
static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    size_t cap = 8192, n = 0;
    char *buf = lkv_xmalloc(cap);
    for (;;) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1 || cap >= (16u << 20)) {
            break;
        }
        cap *= 2;
        buf = lkv_xrealloc(buf, cap);
    }
    fclose(f);
    buf[n] = '\0';
    return buf;
}

int lkv_client_create(const char *target, const lkv_client_options *opt, lkv_client_t **out)
{
    err_clear();
    *out = NULL;
    lkv_client_options o = {0};
    if (opt != NULL) {
        o = *opt;
    }
    if (target == NULL || target[0] == '\0') {
        return err_local(LKV_EINVAL, "no target address");
    }
    if (o.max_message_bytes == 0) {
        o.max_message_bytes = LKV_CLIENT_DEFAULT_MAX_MESSAGE;
    }
    if (o.max_message_bytes > INT_MAX) {
        return err_local(LKV_EINVAL, "max_message_bytes %zu is over %d", o.max_message_bytes,
                         INT_MAX);
    }
    if (o.default_deadline_ms < 0) {
        return err_local(LKV_EINVAL, "default_deadline_ms must be >= 0");
    }
    if (o.default_deadline_ms == 0) {
        o.default_deadline_ms = LKV_CLIENT_DEFAULT_DEADLINE_MS;
    }
    if (o.bearer_token != NULL && strpbrk(o.bearer_token, "\r\n") != NULL) {
        return err_local(LKV_EINVAL, "bearer token contains a line break");
    }
    int tls = o.tls_ca_file != NULL && o.tls_ca_file[0] != '\0';
    int have_cert = o.tls_cert_file != NULL && o.tls_cert_file[0] != '\0';
    int have_key = o.tls_key_file != NULL && o.tls_key_file[0] != '\0';
    if (have_cert != have_key) {
        return err_local(LKV_EINVAL, "TLS: a client certificate needs both tls_cert_file and "
                                     "tls_key_file");
    }
    if (have_cert && !tls) {
        return err_local(LKV_EINVAL, "TLS: a client certificate needs tls_ca_file (the CA of "
                                     "the daemon's certificate)");
    }
    char *pem[3] = {NULL, NULL, NULL};
    if (tls) {
        const char *paths[3] = {o.tls_ca_file, o.tls_cert_file, o.tls_key_file};
        for (int i = 0; i < (have_cert ? 3 : 1); i++) {
            pem[i] = read_file(paths[i]);
            if (pem[i] == NULL) {
                int e = errno;
                for (int k = 0; k < i; k++) {
                    free(pem[k]);
                }
                return err_local(LKV_EINVAL, "TLS: cannot read %s: %s", paths[i], strerror(e));
            }
        }
    }
    grpc_init();
    lkv_client_t *c = lkv_xcalloc(1, sizeof(*c));
    c->max_msg = o.max_message_bytes;
    c->deadline_ms = o.default_deadline_ms;
    grpc_arg args[3];
    memset(args, 0, sizeof(args));
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)c->max_msg;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = (int)c->max_msg;
    grpc_arg args4[4];
    memcpy(args4, args, sizeof(args));
    size_t nargs = 2;
    if (tls && o.tls_server_name != NULL && o.tls_server_name[0] != '\0') {
        args4[2].type = GRPC_ARG_STRING;
        args4[2].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args4[2].value.string = (char *)o.tls_server_name;
        nargs = 3;
    }
    if (o.own_connection) {
        args4[nargs].type = GRPC_ARG_INTEGER;
        args4[nargs].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL; /* No shared subchannel. */
        args4[nargs].value.integer = 1;
        nargs++;
    }
    grpc_channel_args cargs = {nargs, args4};
    grpc_channel_credentials *creds;
    if (tls) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = pem[2], .cert_chain = pem[1]};
        creds = grpc_ssl_credentials_create(pem[0], have_cert ? &pair : NULL, NULL, NULL);
    } else {
        creds = grpc_insecure_credentials_create();
    }
    c->channel = grpc_channel_create(target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    for (int i = 0; i < 3; i++) {
        if (pem[i] != NULL) {
            explicit_bzero(pem[i], strlen(pem[i]));
            free(pem[i]);
        }
    }
    if (o.bearer_token != NULL && o.bearer_token[0] != '\0') {
        size_t n = strlen(o.bearer_token) + 8;
        char *v = lkv_xmalloc(n);
        snprintf(v, n, "Bearer %s", o.bearer_token);
        c->auth_md.key = grpc_slice_from_static_string("authorization");
        c->auth_md.value = grpc_slice_from_copied_string(v);
        free(v);
        c->has_auth = 1;
    }
    *out = c;
    return 0;
}

void lkv_client_destroy(lkv_client_t *c)
{
    if (c == NULL) {
        return;
    }
    grpc_channel_destroy(c->channel);
    if (c->has_auth) {
        grpc_slice_unref(c->auth_md.value);
    }
    free(c);
    grpc_shutdown();
}

/* ---- one call ---- */

static int effective_deadline(const lkv_client_t *c, int deadline_ms)
{
    return deadline_ms > 0 ? deadline_ms : c->deadline_ms;
}

static void call_start(lkv_client_t *c, call *cl, const char *method, int deadline_ms)
{
    memset(cl, 0, sizeof(*cl));
    cl->c = c;
    cl->cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                     gpr_time_from_millis(effective_deadline(c, deadline_ms), GPR_TIMESPAN));
    grpc_slice m = grpc_slice_from_static_string(method);
    cl->call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cl->cq, m, NULL,
                                        deadline, NULL);
    grpc_metadata_array_init(&cl->init_md);
    grpc_metadata_array_init(&cl->trail_md);
    cl->details = grpc_empty_slice();
}

/* Starts ops as one batch and waits for it. Returns the completion's success flag (1/0), or
 * -1 if the batch could not be started (then nothing changed; the message is in tl_err). */
static int run_batch(call *cl, grpc_op *ops, size_t n)
{
    void *tag = ops;
    grpc_call_error e = grpc_call_start_batch(cl->call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK) {
        err_local(LKV_EINTERNAL, "grpc_call_start_batch failed: %d", (int)e);
        return -1;
    }
    /* The call has a deadline, so the batch completes by then; never wait for ever anyway. */
    grpc_event ev =
        grpc_completion_queue_pluck(cl->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE || ev.tag != tag) {
        lkv_panic("pluck returned event type %d", (int)ev.type);
    }
    return ev.success ? 1 : 0;
}

/* Fills op with SEND_INITIAL_METADATA (carrying the auth header) unless already sent;
 * returns the number of ops written (0 or 1). */
static size_t op_send_md(call *cl, grpc_op *op)
{
    if (cl->md_sent) {
        return 0;
    }
    memset(op, 0, sizeof(*op));
    op->op = GRPC_OP_SEND_INITIAL_METADATA;
    if (cl->c->has_auth) {
        op->data.send_initial_metadata.count = 1;
        op->data.send_initial_metadata.metadata = &cl->c->auth_md;
    }
    cl->md_sent = 1;
    return 1;
}

static void op_recv_status(call *cl, grpc_op *op)
{
    memset(op, 0, sizeof(*op));
    op->op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op->data.recv_status_on_client.trailing_metadata = &cl->trail_md;
    op->data.recv_status_on_client.status = &cl->status;
    op->data.recv_status_on_client.status_details = &cl->details;
}

/* Receives the status after a failed send or recv, or after a cancel. The batch also asks for
 * the initial metadata (unless already asked) and a message (unless the stream ended): gRPC
 * core 1.51 holds trailing metadata back until the application has taken what came before
 * it, so RECV_STATUS_ON_CLIENT alone can wait until the deadline when the daemon refused the
 * call before we asked for its initial metadata (seen with a Put refused mid-stream). */
static void call_recv_status(call *cl)
{
    if (cl->status_done) {
        return;
    }
    grpc_op ops[3];
    memset(ops, 0, sizeof(ops));
    size_t n = 0;
    grpc_byte_buffer *junk = NULL;
    if (!cl->init_md_asked) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n++].data.recv_initial_metadata.recv_initial_metadata = &cl->init_md;
        cl->init_md_asked = 1;
    }
    if (!cl->msg_eos) {
        ops[n].op = GRPC_OP_RECV_MESSAGE;
        ops[n++].data.recv_message.recv_message = &junk;
    }
    op_recv_status(cl, &ops[n++]);
    if (run_batch(cl, ops, n) < 0) {
        cl->status = GRPC_STATUS_INTERNAL;
    }
    cl->status_done = 1;
    cl->msg_eos = 1;
    if (junk != NULL) {
        grpc_byte_buffer_destroy(junk);
    }
}

/* Maps the received status to LKV_E* and records its message for this thread. */
static int call_status_rc(call *cl)
{
    assert(cl->status_done);
    if (cl->status == GRPC_STATUS_OK) {
        err_clear();
        return 0;
    }
    size_t n = GRPC_SLICE_LENGTH(cl->details);
    if (n >= sizeof(tl_err.msg)) {
        n = sizeof(tl_err.msg) - 1;
    }
    memcpy(tl_err.msg, GRPC_SLICE_START_PTR(cl->details), n);
    tl_err.msg[n] = '\0';
    if (n == 0) {
        snprintf(tl_err.msg, sizeof(tl_err.msg), "gRPC status %d", (int)cl->status);
    }
    tl_err.status = (int)cl->status;
    const char *code = NULL;
    size_t code_len = 0;
    tl_err.retry_after_ms = -1;
    for (size_t i = 0; i < cl->trail_md.count; i++) {
        const grpc_metadata *md = &cl->trail_md.metadata[i];
        if (code == NULL && grpc_slice_str_cmp(md->key, LKV_STATUS_MD_KEY) == 0) {
            code = (const char *)GRPC_SLICE_START_PTR(md->value);
            code_len = GRPC_SLICE_LENGTH(md->value);
        } else if (grpc_slice_str_cmp(md->key, "retry-after-ms") == 0) {
            const char *v = (const char *)GRPC_SLICE_START_PTR(md->value);
            size_t len = GRPC_SLICE_LENGTH(md->value);
            int64_t ms = 0;
            size_t k = 0;
            for (; k < len && k < 12 && v[k] >= '0' && v[k] <= '9'; k++) {
                ms = ms * 10 + (v[k] - '0');
            }
            tl_err.retry_after_ms = k == len && len > 0 ? ms : -1;
        }
    }
    return lkv_status_to_err((int)cl->status, code, code_len);
}

static void call_end(call *cl)
{
    if (cl->call != NULL) {
        grpc_call_unref(cl->call);
        cl->call = NULL;
    }
    grpc_metadata_array_destroy(&cl->init_md);
    grpc_metadata_array_destroy(&cl->trail_md);
    grpc_slice_unref(cl->details);
    if (cl->cq != NULL) {
        grpc_completion_queue_shutdown(cl->cq);
        grpc_completion_queue_destroy(cl->cq);
        cl->cq = NULL;
    }
}

/* Records a protocol error in the reply (the call itself succeeded) and returns it. */
static int bad_reply(int rc, const char *what, const char *why)
{
    return err_local(rc, "bad %s from the daemon: %s", what, why);
}

/* A unary call: sends req, receives *resp (owned by the caller, lkv_pb_free). */
static int unary(lkv_client_t *c, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *rdesc, int deadline_ms, ProtobufCMessage **resp)
{
    *resp = NULL;
    char why[256];
    grpc_byte_buffer *send = NULL;
    int rc = lkv_pb_pack(req, c->max_msg, &send, why, sizeof(why));
    if (rc != 0) {
        return err_local(rc, "%s", why);
    }
    call cl;
    call_start(c, &cl, method, deadline_ms);
    grpc_byte_buffer *recv = NULL;
    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    size_t n = op_send_md(&cl, &ops[0]);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = send;
    ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &cl.init_md;
    cl.init_md_asked = 1;
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &recv;
    op_recv_status(&cl, &ops[n++]);
    int ok = run_batch(&cl, ops, n);
    grpc_byte_buffer_destroy(send);
    if (ok < 0) {
        rc = LKV_EINTERNAL;
        goto out;
    }
    cl.status_done = 1;
    rc = call_status_rc(&cl);
    if (rc != 0) {
        goto out;
    }
    rc = lkv_pb_unpack(rdesc, recv, c->max_msg, resp, why, sizeof(why));
    if (rc != 0) {
        rc = bad_reply(LKV_EPROTO, rdesc->name, why);
    }
out:
    if (recv != NULL) {
        grpc_byte_buffer_destroy(recv);
    }
    call_end(&cl);
    return rc;
}

/* ---- health ---- */

int lkv_client_ping(lkv_client_t *c, const char *service, int deadline_ms)
{
    err_clear();
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)(service != NULL ? service : "");
    ProtobufCMessage *m = NULL;
    int rc = unary(c, "/grpc.health.v1.Health/Check", &req.base,
                   &grpc__health__v1__health_check_response__descriptor, deadline_ms, &m);
    if (rc != 0) {
        return rc;
    }
    Grpc__Health__V1__HealthCheckResponse *r = (Grpc__Health__V1__HealthCheckResponse *)m;
    int st = r->status;
    lkv_pb_free(m);
    if (st != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING) {
        return err_local(LKV_EUNAVAIL, "daemon reports serving status %d (not SERVING)", st);
    }
    return 0;
}

/* ---- put ---- */

/* Zero-copy sends (lkv_client_put_ex only, whose caller's blocks stay valid until it returns):
 * the blocks go out as slices over the caller's own memory, not packed into a message. gRPC
 * keeps references to sent slices past the SEND_MESSAGE completion (until later writes on the
 * connection), so the references are counted here and put_free, after the call has ended,
 * waits until gRPC has released every one: lkv_client_put_ex returns only then. The streaming
 * API (lkv_put_blocks), whose callers may reuse their buffer between calls, packs a copy. */
typedef struct put_refs {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int held; /* Slices over caller memory that gRPC has not released yet. */
} put_refs;

static void put_free(lkv_put_t *p)
{
    call_end(&p->cl);
    if (p->zc != NULL) {
        /* Never returns while gRPC may still read the caller's memory; says so if that takes
         * unusually long (the call has ended: the transport drops its references once its
         * last write on the connection is done). */
        pthread_mutex_lock(&p->zc->mu);
        int waited_s = 0;
        while (p->zc->held > 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            if (pthread_cond_timedwait(&p->zc->cv, &p->zc->mu, &ts) == ETIMEDOUT &&
                ++waited_s == 10) {
                LKV_LOGW("put: gRPC still holds %d slice(s) of the caller's blocks 10 s after the "
                         "call ended; waiting",
                         p->zc->held);
            }
        }
        pthread_mutex_unlock(&p->zc->mu);
        pthread_cond_destroy(&p->zc->cv);
        pthread_mutex_destroy(&p->zc->mu);
        free(p->zc);
    }
    free(p->profile);
    free(p->tokens);
    free(p);
}

/* Marks p failed with the call's status (read now if needed) and returns the code. */
static int put_fail_from_status(lkv_put_t *p)
{
    call_recv_status(&p->cl);
    int rc = call_status_rc(&p->cl);
    if (rc == 0) {
        /* The daemon closed with OK before we finished sending: not a valid Put reply. */
        rc = err_local(LKV_EPROTO, "daemon ended the Put early with status OK");
    }
    p->failed = rc;
    p->errstatus = tl_err.status;
    snprintf(p->errmsg, sizeof(p->errmsg), "%s", tl_err.msg);
    return rc;
}

static int put_refail(lkv_put_t *p)
{
    tl_err.status = p->errstatus;
    snprintf(tl_err.msg, sizeof(tl_err.msg), "%s", p->errmsg);
    return p->failed;
}

int lkv_client_put_begin(lkv_client_t *c, const char *profile, const uint32_t *tokens,
                         size_t n_tokens, uint32_t n_blocks, int deadline_ms, lkv_put_t **out)
{
    err_clear();
    *out = NULL;
    if (profile == NULL || (tokens == NULL && n_tokens > 0)) {
        return err_local(LKV_EINVAL, "put: profile and tokens are required");
    }
    lkv_put_t *p = lkv_xcalloc(1, sizeof(*p));
    p->profile = lkv_xstrdup(profile);
    p->tokens = lkv_xmalloc(n_tokens > 0 ? n_tokens * sizeof(uint32_t) : 1);
    if (n_tokens > 0) {
        memcpy(p->tokens, tokens, n_tokens * sizeof(uint32_t));
    }
    p->n_tokens = n_tokens;
    p->n_blocks = n_blocks;
    p->header_pending = 1;
    call_start(c, &p->cl, "/lazykv.v1.Cache/Put", deadline_ms);
    *out = p;
    return 0;
}

/* Copies the put's residency options into its header. */
static void put_header_opts(const lkv_put_t *p, Lazykv__V1__PutHeader *hdr)
{
    hdr->priority = p->opt.priority;
    hdr->ttl_ms = p->opt.ttl_ms;
    hdr->hold = p->opt.hold ? 1 : 0;
}

int lkv_put_set_options(lkv_put_t *p, const lkv_put_options *o)
{
    err_clear();
    if (p == NULL || !p->header_pending) {
        return err_local(LKV_EINVAL, "put: options must be set before the first block");
    }
    if (o != NULL && (o->priority < -1 || o->priority > 1)) {
        return err_local(LKV_EINVAL, "put: priority %d is not -1, 0 or +1", o->priority);
    }
    memset(&p->opt, 0, sizeof(p->opt));
    if (o != NULL) {
        p->opt = *o;
    }
    return 0;
}

static void put_ref_done(void *arg)
{
    put_refs *r = arg;
    pthread_mutex_lock(&r->mu);
    if (--r->held == 0) {
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

/* Sends one PutRequest message bb (taken: destroyed here; gRPC may hold its slices longer,
 * put_free waits for zero-copy ones) with the initial metadata if still pending, and records a
 * failure on p. Returns 0 or the put's error. */
static int put_send_message(lkv_put_t *p, grpc_byte_buffer *bb)
{
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    size_t k = op_send_md(&p->cl, &ops[0]);
    ops[k].op = GRPC_OP_SEND_MESSAGE;
    ops[k++].data.send_message.send_message = bb;
    int ok = run_batch(&p->cl, ops, k);
    grpc_byte_buffer_destroy(bb);
    if (ok < 0) {
        p->failed = LKV_EINTERNAL;
        p->errstatus = -1;
        snprintf(p->errmsg, sizeof(p->errmsg), "%s", tl_err.msg);
        return p->failed;
    }
    p->header_pending = 0;
    if (!ok) {
        return put_fail_from_status(p);
    }
    err_clear();
    return 0;
}

/* Zero-copy: sends one PutRequest carrying the pending header (if any) and n blocks of
 * block_bytes from data (first index first_index; borrowed until put_free). The bytes are those
 * protobuf-c would pack (fields in number order, proto3 defaults omitted), built as: one small
 * slice with the header record and each block's framing (tag, length, index, data tag and length),
 * and one slice per block over the caller's memory. */
static int put_send_zc(lkv_put_t *p, uint32_t first_index, uint32_t n, const uint8_t *data,
                       size_t block_bytes)
{
    if (p->failed) {
        return put_refail(p);
    }
    uint8_t *hdr_bytes = NULL;
    size_t hdr_len = 0;
    if (p->header_pending) {
        Lazykv__V1__PutHeader hdr = LAZYKV__V1__PUT_HEADER__INIT;
        hdr.profile = p->profile;
        hdr.n_token_ids = p->n_tokens;
        hdr.token_ids = p->tokens;
        hdr.n_blocks = p->n_blocks;
        put_header_opts(p, &hdr);
        hdr_len = protobuf_c_message_get_packed_size(&hdr.base);
        hdr_bytes = lkv_xmalloc(hdr_len + 1);
        protobuf_c_message_pack(&hdr.base, hdr_bytes);
    }
    /* Framing: the header record, then per block: blocks tag, Block length, [index], [data tag
     * + length]: at most 1 + 5 + 1 + 5 + 1 + 5 bytes. */
    size_t fcap = (hdr_bytes ? 6 + hdr_len : 0) + (size_t)n * 18, flen = 0, total = 0;
    uint8_t *frame = lkv_xmalloc(fcap + 1);
    size_t *cut = lkv_xmalloc(sizeof(size_t) * ((size_t)n + 1)); /* Framing end per block. */
    if (hdr_bytes != NULL) {
        frame[flen++] = 0x0a; /* header = 1, LEN */
        flen += lkv_wire_varint_put(frame + flen, hdr_len);
        memcpy(frame + flen, hdr_bytes, hdr_len);
        flen += hdr_len;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t index = first_index + i;
        size_t body = (index ? 1 + lkv_wire_varint_len(index) : 0) +
                      (block_bytes ? 1 + lkv_wire_varint_len(block_bytes) + block_bytes : 0);
        frame[flen++] = 0x12; /* blocks = 2, LEN */
        flen += lkv_wire_varint_put(frame + flen, body);
        if (index) {
            frame[flen++] = 0x08; /* index = 1, VARINT */
            flen += lkv_wire_varint_put(frame + flen, index);
        }
        if (block_bytes) {
            frame[flen++] = 0x12; /* data = 2, LEN */
            flen += lkv_wire_varint_put(frame + flen, block_bytes);
        }
        cut[i] = flen;
    }
    total = flen + (size_t)n * block_bytes;
    free(hdr_bytes);
    if (p->cl.c->max_msg != 0 && total > p->cl.c->max_msg) {
        free(frame);
        free(cut);
        /* Refused locally; the call goes on (nothing was sent). */
        return err_local(LKV_ETOOBIG,
                         "put: lazykv.v1.PutRequest message is %zu bytes, over the %zu-byte "
                         "message limit",
                         total, (size_t)p->cl.c->max_msg);
    }
    /* Slices: framing pieces (copied: small) interleaved with the caller's blocks (not). */
    put_refs *refs = p->zc;
    size_t ns = 0;
    grpc_slice *sl = lkv_xmalloc(sizeof(grpc_slice) * (2 * (size_t)n + 1));
    size_t from = 0;
    for (uint32_t i = 0; i < n; i++) {
        sl[ns++] = grpc_slice_from_copied_buffer((const char *)frame + from, cut[i] - from);
        from = cut[i];
        if (block_bytes > 0) {
            pthread_mutex_lock(&refs->mu);
            refs->held++;
            pthread_mutex_unlock(&refs->mu);
            sl[ns++] = grpc_slice_new_with_user_data((void *)(data + (size_t)i * block_bytes),
                                                     block_bytes, put_ref_done, refs);
        }
    }
    if (n == 0 || from < flen) {
        sl[ns++] = grpc_slice_from_copied_buffer((const char *)frame + from, flen - from);
    }
    free(frame);
    free(cut);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(sl, ns); /* Takes its own refs. */
    for (size_t i = 0; i < ns; i++) {
        grpc_slice_unref(sl[i]);
    }
    free(sl);
    return put_send_message(p, bb);
}

/* Sends one PutRequest carrying the pending header (if any) and blocks. */
static int put_send(lkv_put_t *p, Lazykv__V1__Block **blocks, size_t n_blocks)
{
    if (p->failed) {
        return put_refail(p);
    }
    Lazykv__V1__PutHeader hdr = LAZYKV__V1__PUT_HEADER__INIT;
    Lazykv__V1__PutRequest req = LAZYKV__V1__PUT_REQUEST__INIT;
    if (p->header_pending) {
        hdr.profile = p->profile;
        hdr.n_token_ids = p->n_tokens;
        hdr.token_ids = p->tokens;
        hdr.n_blocks = p->n_blocks;
        put_header_opts(p, &hdr);
        req.header = &hdr;
    }
    req.n_blocks = n_blocks;
    req.blocks = blocks;
    char why[256];
    grpc_byte_buffer *bb = NULL;
    int rc = lkv_pb_pack(&req.base, p->cl.c->max_msg, &bb, why, sizeof(why));
    if (rc != 0) {
        /* Refused locally; the call goes on (nothing was sent). */
        return err_local(rc, "put: %s", why);
    }
    return put_send_message(p, bb);
}

int lkv_put_blocks(lkv_put_t *p, uint32_t first_index, uint32_t n, const void *data,
                   size_t block_bytes)
{
    err_clear();
    if (n == 0 || (data == NULL && block_bytes > 0)) {
        return err_local(LKV_EINVAL, "put: no blocks given");
    }
    if (p->zc != NULL) {
        return put_send_zc(p, first_index, n, data, block_bytes);
    }
    Lazykv__V1__Block *bs = lkv_xcalloc(n, sizeof(*bs));
    Lazykv__V1__Block **bp = lkv_xcalloc(n, sizeof(*bp));
    for (uint32_t i = 0; i < n; i++) {
        Lazykv__V1__Block init = LAZYKV__V1__BLOCK__INIT;
        bs[i] = init;
        bs[i].index = first_index + i;
        bs[i].data.len = block_bytes;
        /* protobuf-c only reads .data when packing. */
        bs[i].data.data = (uint8_t *)data + (size_t)i * block_bytes;
        bp[i] = &bs[i];
    }
    int rc = put_send(p, bp, n);
    free(bp);
    free(bs);
    return rc;
}

int lkv_put_block(lkv_put_t *p, uint32_t index, const void *data, size_t len)
{
    return lkv_put_blocks(p, index, 1, data, len);
}

int lkv_put_finish(lkv_put_t *p, lkv_put_reply *reply)
{
    err_clear();
    int rc = 0;
    grpc_byte_buffer *send = NULL, *recv = NULL;
    if (p->failed) {
        rc = put_refail(p);
        goto out;
    }
    char why[256];
    if (p->header_pending) {
        Lazykv__V1__PutHeader hdr = LAZYKV__V1__PUT_HEADER__INIT;
        Lazykv__V1__PutRequest req = LAZYKV__V1__PUT_REQUEST__INIT;
        hdr.profile = p->profile;
        hdr.n_token_ids = p->n_tokens;
        hdr.token_ids = p->tokens;
        hdr.n_blocks = p->n_blocks;
        put_header_opts(p, &hdr);
        req.header = &hdr;
        rc = lkv_pb_pack(&req.base, p->cl.c->max_msg, &send, why, sizeof(why));
        if (rc != 0) {
            rc = err_local(rc, "put: %s", why);
            grpc_call_cancel(p->cl.call, NULL);
            goto out;
        }
    }
    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    size_t n = op_send_md(&p->cl, &ops[0]);
    if (send != NULL) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = send;
    }
    ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &p->cl.init_md;
    p->cl.init_md_asked = 1;
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &recv;
    op_recv_status(&p->cl, &ops[n++]);
    int ok = run_batch(&p->cl, ops, n);
    if (ok < 0) {
        rc = LKV_EINTERNAL;
        goto out;
    }
    p->cl.status_done = 1;
    rc = call_status_rc(&p->cl);
    if (rc != 0) {
        goto out;
    }
    ProtobufCMessage *m = NULL;
    rc = lkv_pb_unpack(&lazykv__v1__put_response__descriptor, recv, p->cl.c->max_msg, &m, why,
                       sizeof(why));
    if (rc != 0) {
        rc = bad_reply(LKV_EPROTO, "PutResponse", why);
        goto out;
    }
    Lazykv__V1__PutResponse *r = (Lazykv__V1__PutResponse *)m;
    if (r->key.len != LKV_KEY_BYTES) {
        rc = bad_reply(LKV_EPROTO, "PutResponse", "key is not 32 bytes");
    } else if (reply != NULL) {
        memcpy(reply->key, r->key.data, LKV_KEY_BYTES);
        reply->n_tokens = r->n_tokens;
        reply->n_blocks = r->n_blocks;
        reply->durability = r->durability;
        reply->already_present = r->already_present ? 1 : 0;
        reply->tier = r->tier;
    }
    lkv_pb_free(m);
out:
    if (send != NULL) {
        grpc_byte_buffer_destroy(send);
    }
    if (recv != NULL) {
        grpc_byte_buffer_destroy(recv);
    }
    put_free(p);
    return rc;
}

void lkv_put_abort(lkv_put_t *p)
{
    if (p == NULL) {
        return;
    }
    if (!p->cl.status_done) {
        grpc_call_cancel(p->cl.call, NULL);
        /* Reading the status makes sure the cancellation has been processed before the
         * call is released. */
        call_recv_status(&p->cl);
    }
    put_free(p);
}

int lkv_client_put(lkv_client_t *c, const char *profile, const uint32_t *tokens, size_t n_tokens,
                   const void *blocks, uint32_t n_blocks, size_t block_bytes, int deadline_ms,
                   lkv_put_reply *reply)
{
    return lkv_client_put_ex(c, profile, tokens, n_tokens, blocks, n_blocks, block_bytes, NULL,
                             deadline_ms, reply);
}

int lkv_client_put_ex(lkv_client_t *c, const char *profile, const uint32_t *tokens, size_t n_tokens,
                      const void *blocks, uint32_t n_blocks, size_t block_bytes,
                      const lkv_put_options *opt, int deadline_ms, lkv_put_reply *reply)
{
    lkv_put_t *p = NULL;
    int rc = lkv_client_put_begin(c, profile, tokens, n_tokens, n_blocks, deadline_ms, &p);
    if (rc != 0) {
        return rc;
    }
    /* blocks stays valid until this returns: send it in place (put_refs). */
    p->zc = lkv_xcalloc(1, sizeof *p->zc);
    pthread_mutex_init(&p->zc->mu, NULL);
    pthread_cond_init(&p->zc->cv, NULL);
    if (opt != NULL && (rc = lkv_put_set_options(p, opt)) != 0) {
        char msg[ERR_MAX];
        snprintf(msg, sizeof(msg), "%s", tl_err.msg);
        lkv_put_abort(p);
        return err_local(rc, "%s", msg);
    }
    /* Room for the header (profile + up to 5 bytes per token id) and per-block framing. */
    size_t overhead = 1024 + strlen(profile) + 5 * n_tokens;
    size_t target = c->max_msg < PUT_TARGET_MSG ? c->max_msg : PUT_TARGET_MSG;
    size_t per = 1;
    if (block_bytes > 0 && target > overhead + block_bytes + 16) {
        per = (target - overhead) / (block_bytes + 16);
    }
    for (uint32_t i = 0; i < n_blocks;) {
        uint32_t k = n_blocks - i < per ? n_blocks - i : (uint32_t)per;
        rc =
            lkv_put_blocks(p, i, k, (const uint8_t *)blocks + (size_t)i * block_bytes, block_bytes);
        if (rc != 0 && !p->failed) {
            /* Refused locally before sending: end the call, keep the message. */
            char msg[ERR_MAX];
            int st = tl_err.status;
            snprintf(msg, sizeof(msg), "%s", tl_err.msg);
            lkv_put_abort(p);
            tl_err.status = st;
            snprintf(tl_err.msg, sizeof(tl_err.msg), "%s", msg);
            return rc;
        }
        if (rc != 0) {
            break;
        }
        i += k;
    }
    return lkv_put_finish(p, reply);
}

/* ---- lookup ---- */

/* Fills a DocRef message from r; td is storage for the token form. */
static int docref_fill(const lkv_docref *r, Lazykv__V1__DocRef *d, Lazykv__V1__TokenDoc *td)
{
    Lazykv__V1__DocRef di = LAZYKV__V1__DOC_REF__INIT;
    Lazykv__V1__TokenDoc ti = LAZYKV__V1__TOKEN_DOC__INIT;
    *d = di;
    *td = ti;
    if (r->key != NULL) {
        d->key.len = LKV_KEY_BYTES;
        d->key.data = (uint8_t *)r->key;
        return 0;
    }
    if (r->profile == NULL || (r->tokens == NULL && r->n_tokens > 0)) {
        return err_local(LKV_EINVAL, "document reference needs a key or a profile and tokens");
    }
    td->profile = (char *)r->profile;
    td->n_token_ids = r->n_tokens;
    td->token_ids = (uint32_t *)r->tokens;
    d->tokens = td;
    return 0;
}

/* The DocRef messages of a Lookup or Attach request: built from the caller's refs, which they
 * borrow (keys and token arrays are not copied); owned by the caller, released with
 * docrefs_free. */
typedef struct docrefs {
    Lazykv__V1__DocRef *ds;
    Lazykv__V1__TokenDoc *ts;
    Lazykv__V1__DocRef **dp;
} docrefs;

static void docrefs_free(docrefs *d)
{
    free(d->dp);
    free(d->ts);
    free(d->ds);
}

/* Fills d from refs[0..n) (n may be 0); on an error the arrays are still allocated and
 * docrefs_free must be called. */
static int docrefs_build(docrefs *d, const lkv_docref *refs, size_t n)
{
    size_t cap = n ? n : 1;
    d->ds = lkv_xcalloc(cap, sizeof(*d->ds));
    d->ts = lkv_xcalloc(cap, sizeof(*d->ts));
    d->dp = lkv_xcalloc(cap, sizeof(*d->dp));
    for (size_t i = 0; i < n; i++) {
        int rc = docref_fill(&refs[i], &d->ds[i], &d->ts[i]);
        if (rc != 0) {
            return rc;
        }
        d->dp[i] = &d->ds[i];
    }
    return 0;
}

static void copy_name(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src != NULL ? src : "");
}

int lkv_client_lookup(lkv_client_t *c, const lkv_docref *refs, size_t n, int deadline_ms,
                      lkv_doc_status *out)
{
    err_clear();
    if (n == 0) {
        return err_local(LKV_EINVAL, "lookup: no documents");
    }
    docrefs d;
    int rc = docrefs_build(&d, refs, n);
    if (rc != 0) {
        goto out;
    }
    Lazykv__V1__LookupRequest req = LAZYKV__V1__LOOKUP_REQUEST__INIT;
    req.n_docs = n;
    req.docs = d.dp;
    ProtobufCMessage *m = NULL;
    rc = unary(c, "/lazykv.v1.Cache/Lookup", &req.base, &lazykv__v1__lookup_response__descriptor,
               deadline_ms, &m);
    if (rc != 0) {
        goto out;
    }
    Lazykv__V1__LookupResponse *r = (Lazykv__V1__LookupResponse *)m;
    if (r->n_docs != n) {
        rc = bad_reply(LKV_EPROTO, "LookupResponse", "wrong number of documents");
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const Lazykv__V1__DocStatus *s = r->docs[i];
        lkv_doc_status *o = &out[i];
        memset(o, 0, sizeof(*o));
        o->present = s->present ? 1 : 0;
        o->tier = s->tier;
        o->n_tokens = s->n_tokens;
        o->n_blocks = s->n_blocks;
        if (s->key.len == LKV_KEY_BYTES) {
            memcpy(o->key, s->key.data, LKV_KEY_BYTES);
        }
        o->miss_cause = s->miss_cause;
        copy_name(o->profile, sizeof(o->profile), s->profile);
        copy_name(o->model_id, sizeof(o->model_id), s->model_id);
    }
    lkv_pb_free(m);
out:
    docrefs_free(&d);
    return rc;
}

/* ---- get ---- */

/* One block of a received GetResponse: its payload is read in place, inside the message. */
typedef struct get_blk {
    uint32_t index;      /* Block.index. */
    const uint8_t *data; /* Block.data, inside lkv_get's msg slice. */
    size_t len;          /* Its bytes. */
} get_blk;

/* A received GetResponse, decoded without copying the payload (protobuf-c would copy every
 * bytes field): the message's bytes stay in msg, the blocks point into them. */
typedef struct get_msg {
    int present;                /* A message is held. */
    grpc_slice msg;             /* Its bytes (one slice: gRPC's own when it came as one). */
    Lazykv__V1__GetHeader *hdr; /* Field 1, unpacked (small), or NULL. */
    get_blk *blk;               /* Field 2, in order (owned array). */
    size_t n_blk, cap_blk;      /* Entries, allocated. */
} get_msg;

struct lkv_get {
    call cl;              /* The Get call. */
    lkv_get_header h;     /* The stream header. */
    get_msg m;            /* Message being consumed. */
    size_t pos;           /* Next block of m. */
    uint32_t next;        /* Next expected block index. */
    int done;             /* Every block delivered and the status was OK. */
    int rc;               /* Non-zero: the Get failed with this code. */
    int errstatus;        /* gRPC status of rc (-1: local). */
    char errmsg[ERR_MAX]; /* Message of rc. */
};

/* Records the thread's current error as g's failure and returns it. */
static int get_fail(lkv_get_t *g, int rc)
{
    g->rc = rc;
    g->errstatus = tl_err.status;
    snprintf(g->errmsg, sizeof(g->errmsg), "%s", tl_err.msg);
    return rc;
}

static int get_refail(const lkv_get_t *g)
{
    tl_err.status = g->errstatus;
    snprintf(tl_err.msg, sizeof(tl_err.msg), "%s", g->errmsg);
    return g->rc;
}

/* A local reason to stop (bad stream, caller's choice): cancel the call, reap its status, keep
 * the local message. */
static int get_stop(lkv_get_t *g, int rc)
{
    char msg[ERR_MAX];
    snprintf(msg, sizeof(msg), "%s", tl_err.msg);
    grpc_call_cancel(g->cl.call, NULL);
    call_recv_status(&g->cl);
    tl_err.status = -1;
    snprintf(tl_err.msg, sizeof(tl_err.msg), "%s", msg);
    return get_fail(g, rc);
}

static void get_msg_clear(get_msg *m)
{
    if (m->present) {
        grpc_slice_unref(m->msg);
    }
    if (m->hdr != NULL) {
        lazykv__v1__get_header__free_unpacked(m->hdr, NULL);
    }
    m->present = 0;
    m->hdr = NULL;
    m->n_blk = 0;
}

/* Reads a varint at *p (< end) into *v. 0, or -1 if truncated or over 64 bits. */
static int rd_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if ((b & 0x80) == 0) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* Skips a field of wire type wt at *p. 0, or -1 if malformed. */
static int skip_field(const uint8_t **p, const uint8_t *end, uint64_t wt)
{
    uint64_t v;
    switch (wt) {
    case 0:
        return rd_varint(p, end, &v);
    case 1:
    case 5:
        v = wt == 1 ? 8 : 4;
        break;
    case 2:
        if (rd_varint(p, end, &v) != 0) {
            return -1;
        }
        break;
    default:
        return -1;
    }
    if (v > (uint64_t)(end - *p)) {
        return -1;
    }
    *p += v;
    return 0;
}

/* Decodes GetResponse {GetHeader header = 1; repeated Block blocks = 2} (Block {uint32 index
 * = 1; bytes data = 2}) from [p, end) into m, pointing the blocks into the bytes. 0 or -1. */
static int get_decode(get_msg *m, const uint8_t *p, const uint8_t *end)
{
    while (p < end) {
        uint64_t tag, len;
        if (rd_varint(&p, end, &tag) != 0) {
            return -1;
        }
        uint64_t field = tag >> 3, wt = tag & 7;
        if ((field != 1 && field != 2) || wt != 2) {
            if (skip_field(&p, end, wt) != 0) {
                return -1;
            }
            continue;
        }
        if (rd_varint(&p, end, &len) != 0 || len > (uint64_t)(end - p)) {
            return -1;
        }
        const uint8_t *q = p, *qe = p + len;
        p = qe;
        if (field == 1) {
            if (m->hdr != NULL) {
                lazykv__v1__get_header__free_unpacked(m->hdr, NULL);
            }
            m->hdr = lazykv__v1__get_header__unpack(NULL, (size_t)len, q);
            if (m->hdr == NULL) {
                return -1;
            }
            continue;
        }
        get_blk b = {0, (const uint8_t *)"", 0};
        while (q < qe) {
            uint64_t t2, v;
            if (rd_varint(&q, qe, &t2) != 0) {
                return -1;
            }
            if ((t2 >> 3) == 1 && (t2 & 7) == 0) {
                if (rd_varint(&q, qe, &v) != 0) {
                    return -1;
                }
                b.index = (uint32_t)v;
            } else if ((t2 >> 3) == 2 && (t2 & 7) == 2) {
                if (rd_varint(&q, qe, &v) != 0 || v > (uint64_t)(qe - q)) {
                    return -1;
                }
                b.data = q;
                b.len = (size_t)v;
                q += v;
            } else if (skip_field(&q, qe, t2 & 7) != 0) {
                return -1;
            }
        }
        if (m->n_blk == m->cap_blk) {
            m->cap_blk = m->cap_blk ? 2 * m->cap_blk : 16;
            m->blk = realloc(m->blk, m->cap_blk * sizeof(*m->blk));
            if (m->blk == NULL) {
                lkv_panic("out of memory");
            }
        }
        m->blk[m->n_blk++] = b;
    }
    return 0;
}

/* For tests (tests/client/test_client.c, declared there): decodes one GetResponse encoding
 * with get_decode and reports what it found: up to cap blocks (index, data pointer into p,
 * length) and whether it had a header. 0, or -1 if malformed. */
int lkv__get_response_scan(const uint8_t *p, size_t len, uint32_t *idx, const uint8_t **data,
                           size_t *lens, size_t cap, size_t *n, int *has_header);
int lkv__get_response_scan(const uint8_t *p, size_t len, uint32_t *idx, const uint8_t **data,
                           size_t *lens, size_t cap, size_t *n, int *has_header)
{
    get_msg m;
    memset(&m, 0, sizeof m);
    int rc = get_decode(&m, p, p + len);
    *n = m.n_blk;
    *has_header = m.hdr != NULL;
    for (size_t i = 0; i < m.n_blk && i < cap; i++) {
        idx[i] = m.blk[i].index;
        data[i] = m.blk[i].data;
        lens[i] = m.blk[i].len;
    }
    if (m.hdr != NULL) {
        lazykv__v1__get_header__free_unpacked(m.hdr, NULL);
    }
    free(m.blk);
    return rc;
}

/* Receives the next GetResponse of g's stream: 1 with *recv (caller destroys it), its reader
 * *rd initialised (caller destroys it) and its length *total; 0 at the end of the stream or if
 * the call failed (the status says which); or a negative code, recorded in g (over the message
 * limit, unreadable), with nothing left to free. */
static int get_recv_raw(lkv_get_t *g, grpc_byte_buffer **recv_out, grpc_byte_buffer_reader *rd,
                        size_t *total)
{
    grpc_byte_buffer *recv = NULL;
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &recv;
    int ok = run_batch(&g->cl, &op, 1);
    if (ok == 1 && recv == NULL) {
        g->cl.msg_eos = 1;
    }
    if (ok != 1 || recv == NULL) {
        return 0; /* End of stream, or the call failed: the status says which. */
    }
    *total = grpc_byte_buffer_length(recv);
    if (g->cl.c->max_msg != 0 && *total > g->cl.c->max_msg) {
        grpc_byte_buffer_destroy(recv);
        return get_stop(g, bad_reply(LKV_EPROTO, "GetResponse", "over the message limit"));
    }
    if (!grpc_byte_buffer_reader_init(rd, recv)) {
        grpc_byte_buffer_destroy(recv);
        return get_stop(g, bad_reply(LKV_EPROTO, "GetResponse", "unreadable (compressed?)"));
    }
    *recv_out = recv;
    return 1;
}

/* Receives the next message into g->m. Returns 1 if one came, 0 at the end of the stream (the
 * status then decides), or a negative code (recorded in g). */
static int get_recv(lkv_get_t *g)
{
    get_msg_clear(&g->m);
    g->pos = 0;
    grpc_byte_buffer *recv = NULL;
    grpc_byte_buffer_reader rd;
    size_t total = 0;
    int got = get_recv_raw(g, &recv, &rd, &total);
    if (got != 1) {
        return got;
    }
    /* One slice as it came (a reference, no copy) when gRPC delivered it whole; else one
     * gathered copy (readall). Then the blocks are read in place, never copied again here. */
    grpc_slice first;
    int n_slices = 0;
    grpc_slice s1 = grpc_empty_slice();
    while (grpc_byte_buffer_reader_next(&rd, &first)) {
        if (n_slices++ == 0) {
            s1 = first;
        } else {
            grpc_slice_unref(first);
        }
    }
    grpc_byte_buffer_reader_destroy(&rd);
    if (n_slices == 1) {
        g->m.msg = s1;
    } else {
        if (n_slices > 1) {
            grpc_slice_unref(s1);
        }
        grpc_byte_buffer_reader r2;
        if (!grpc_byte_buffer_reader_init(&r2, recv)) {
            grpc_byte_buffer_destroy(recv);
            return get_stop(g, bad_reply(LKV_EPROTO, "GetResponse", "unreadable"));
        }
        g->m.msg = grpc_byte_buffer_reader_readall(&r2);
        grpc_byte_buffer_reader_destroy(&r2);
    }
    grpc_byte_buffer_destroy(recv);
    g->m.present = 1;
    const uint8_t *p = GRPC_SLICE_START_PTR(g->m.msg);
    if (get_decode(&g->m, p, p + GRPC_SLICE_LENGTH(g->m.msg)) != 0) {
        return get_stop(g, bad_reply(LKV_EPROTO, "GetResponse", "malformed protobuf encoding"));
    }
    return 1;
}

/* The stream ended: reads the status and checks the block count. */
static int get_finish(lkv_get_t *g)
{
    call_recv_status(&g->cl);
    int rc = call_status_rc(&g->cl);
    if (rc == 0 && g->next != g->h.n_blocks) {
        rc = bad_reply(LKV_ECORRUPT, "Get stream", "fewer blocks than announced");
    }
    if (rc != 0) {
        return get_fail(g, rc);
    }
    g->done = 1;
    return 0;
}

int lkv_client_get_begin(lkv_client_t *c, const lkv_docref *ref, int deadline_ms,
                         lkv_get_header *header, lkv_get_t **out)
{
    err_clear();
    *out = NULL;
    Lazykv__V1__DocRef d;
    Lazykv__V1__TokenDoc td;
    int rc = docref_fill(ref, &d, &td);
    if (rc != 0) {
        return rc;
    }
    Lazykv__V1__GetRequest req = LAZYKV__V1__GET_REQUEST__INIT;
    req.doc = &d;
    char why[256];
    grpc_byte_buffer *send = NULL;
    rc = lkv_pb_pack(&req.base, c->max_msg, &send, why, sizeof(why));
    if (rc != 0) {
        return err_local(rc, "get: %s", why);
    }
    lkv_get_t *g = lkv_xcalloc(1, sizeof(*g));
    call_start(c, &g->cl, "/lazykv.v1.Cache/Get", deadline_ms);
    grpc_op ops[4];
    memset(ops, 0, sizeof(ops));
    size_t n = op_send_md(&g->cl, &ops[0]);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = send;
    ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &g->cl.init_md;
    g->cl.init_md_asked = 1;
    int ok = run_batch(&g->cl, ops, n);
    grpc_byte_buffer_destroy(send);
    if (ok < 0) {
        rc = get_fail(g, LKV_EINTERNAL);
    } else {
        rc = ok == 1 ? get_recv(g) : 0;
        if (rc == 0) { /* No header: an error status, or a broken stream. */
            rc = get_finish(g);
            if (rc == 0) {
                rc = get_fail(g, bad_reply(LKV_ECORRUPT, "Get stream", "no header"));
            }
        } else if (rc == 1) {
            const Lazykv__V1__GetHeader *gh = g->m.hdr;
            if (gh == NULL) {
                rc = get_stop(g,
                              bad_reply(LKV_ECORRUPT, "Get stream", "first message has no header"));
            } else if (gh->key.len != LKV_KEY_BYTES || gh->n_blocks > GET_MAX_BLOCKS ||
                       gh->block_bytes == 0) {
                rc = get_stop(g, bad_reply(LKV_ECORRUPT, "Get stream", "header out of range"));
            } else if (gh->block_bytes > c->max_msg) {
                rc = get_stop(g, err_local(LKV_ETOOBIG,
                                           "get: blocks of %llu bytes do not fit this client's "
                                           "max_message_bytes %zu",
                                           (unsigned long long)gh->block_bytes, c->max_msg));
            } else {
                memcpy(g->h.key, gh->key.data, LKV_KEY_BYTES);
                copy_name(g->h.profile, sizeof(g->h.profile), gh->profile);
                g->h.n_tokens = gh->n_tokens;
                g->h.n_blocks = gh->n_blocks;
                g->h.block_bytes = gh->block_bytes;
                g->h.block_tokens = gh->block_tokens;
                g->h.tier = gh->tier;
                rc = 0;
            }
        }
    }
    if (header != NULL) {
        *header = g->h;
    }
    if (rc != 0) {
        lkv_get_end(g);
        return rc;
    }
    *out = g;
    return 0;
}

int lkv_get_next(lkv_get_t *g, uint32_t *index, const void **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    if (g->rc != 0) {
        return get_refail(g);
    }
    err_clear();
    for (;;) {
        if (g->done) {
            return 0;
        }
        if (g->m.present && g->pos < g->m.n_blk) {
            const get_blk *b = &g->m.blk[g->pos++];
            if (b->index != g->next || g->next >= g->h.n_blocks) {
                return get_stop(g,
                                bad_reply(LKV_ECORRUPT, "Get stream", "block index out of order"));
            }
            if (b->len != g->h.block_bytes) {
                return get_stop(
                    g, bad_reply(LKV_ECORRUPT, "Get stream", "block size is not block_bytes"));
            }
            g->next++;
            *index = b->index;
            *data = b->data; /* In place: valid until the next call on g. */
            *len = b->len;
            return 0;
        }
        int rc = get_recv(g);
        if (rc < 0) {
            return rc;
        }
        if (rc == 0) {
            return get_finish(g);
        }
        if (g->m.hdr != NULL) {
            return get_stop(g, bad_reply(LKV_ECORRUPT, "Get stream", "second header"));
        }
    }
}

void lkv_get_end(lkv_get_t *g)
{
    if (g == NULL) {
        return;
    }
    if (!g->cl.status_done) {
        grpc_call_cancel(g->cl.call, NULL);
        call_recv_status(&g->cl);
    }
    get_msg_clear(&g->m);
    free(g->m.blk);
    call_end(&g->cl);
    free(g);
}

int lkv_client_get(lkv_client_t *c, const lkv_docref *ref, int deadline_ms, lkv_get_header *header,
                   lkv_get_block_fn fn, void *ctx)
{
    lkv_get_t *g = NULL;
    lkv_get_header h;
    int rc = lkv_client_get_begin(c, ref, deadline_ms, &h, &g);
    if (header != NULL) {
        *header = h;
    }
    if (rc != 0) {
        return rc;
    }
    if (fn != NULL && fn(ctx, &h, UINT32_MAX, NULL, 0) != 0) {
        rc = err_local(LKV_ECANCELLED, "get: stopped by the caller");
        goto out;
    }
    for (;;) {
        uint32_t index = 0;
        const void *data = NULL;
        size_t len = 0;
        rc = lkv_get_next(g, &index, &data, &len);
        if (rc != 0 || data == NULL) {
            break;
        }
        if (fn != NULL && fn(ctx, &h, index, data, len) != 0) {
            rc = err_local(LKV_ECANCELLED, "get: stopped by the caller");
            break;
        }
    }
out:
    if (rc == LKV_ECANCELLED && !g->cl.status_done) {
        /* Keep the caller's message across the cancel in lkv_get_end. */
        char msg[ERR_MAX];
        snprintf(msg, sizeof(msg), "%s", tl_err.msg);
        lkv_get_end(g);
        tl_err.status = -1;
        snprintf(tl_err.msg, sizeof(tl_err.msg), "%s", msg);
        return rc;
    }
    lkv_get_end(g);
    return rc;
}

/* Collects a Get into one buffer. */
typedef struct get_buf {
    uint8_t *data; /* n_blocks * block_bytes bytes; owned until handed to the caller. */
    size_t len;    /* Allocated bytes. */
} get_buf;

static int get_buf_cb(void *ctx, const lkv_get_header *h, uint32_t index, const void *data,
                      size_t len)
{
    get_buf *g = ctx;
    if (data == NULL) {
        g->len = (size_t)h->n_blocks * (size_t)h->block_bytes;
        g->data = lkv_xmalloc(g->len > 0 ? g->len : 1);
        return 0;
    }
    memcpy(g->data + (size_t)index * h->block_bytes, data, len);
    return 0;
}

int lkv_client_get_buf(lkv_client_t *c, const lkv_docref *ref, int deadline_ms,
                       lkv_get_header *header, uint8_t **data, size_t *len)
{
    get_buf g = {NULL, 0};
    *data = NULL;
    *len = 0;
    int rc = lkv_client_get(c, ref, deadline_ms, header, get_buf_cb, &g);
    if (rc != 0) {
        free(g.data);
        return rc;
    }
    *data = g.data;
    *len = g.len;
    return 0;
}

/* ---- get into the caller's buffer ----
 *
 * lkv_client_get_into decodes each GetResponse straight from the slices gRPC received it in and
 * copies every block's payload once, into its place in the caller's buffer: no gathered copy of
 * a multi-slice message (get_recv's readall: a fresh allocation per message, whose pages the
 * kernel zeroes), no second copy by a callback. The cursor below reads across slice boundaries. */

typedef struct slice_cur {
    grpc_slice *sl; /* The message's slices (references held). */
    size_t n;       /* Slices. */
    size_t i;       /* Current slice. */
    size_t off;     /* Offset in it. */
    size_t left;    /* Bytes left in the message. */
} slice_cur;

static int cur_byte(slice_cur *c, uint8_t *b)
{
    if (c->left == 0) {
        return -1;
    }
    while (c->off == GRPC_SLICE_LENGTH(c->sl[c->i])) {
        c->i++;
        c->off = 0;
    }
    *b = GRPC_SLICE_START_PTR(c->sl[c->i])[c->off++];
    c->left--;
    return 0;
}

static int cur_varint(slice_cur *c, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        uint8_t b;
        if (cur_byte(c, &b) != 0) {
            return -1;
        }
        x |= (uint64_t)(b & 0x7f) << shift;
        if ((b & 0x80) == 0) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* Copies (dst != NULL) or skips n bytes. */
static int cur_take(slice_cur *c, uint8_t *dst, size_t n)
{
    if (n > c->left) {
        return -1;
    }
    c->left -= n;
    while (n > 0) {
        size_t avail = GRPC_SLICE_LENGTH(c->sl[c->i]) - c->off;
        if (avail == 0) {
            c->i++;
            c->off = 0;
            continue;
        }
        size_t k = n < avail ? n : avail;
        if (dst != NULL) {
            memcpy(dst, GRPC_SLICE_START_PTR(c->sl[c->i]) + c->off, k);
            dst += k;
        }
        c->off += k;
        n -= k;
    }
    return 0;
}

static int cur_skip_field(slice_cur *c, uint64_t wt)
{
    uint64_t v;
    switch (wt) {
    case 0:
        return cur_varint(c, &v);
    case 1:
        return cur_take(c, NULL, 8);
    case 5:
        return cur_take(c, NULL, 4);
    case 2:
        return cur_varint(c, &v) != 0 || v > SIZE_MAX ? -1 : cur_take(c, NULL, (size_t)v);
    default:
        return -1;
    }
}

/* What decode_into found wrong (0: nothing). */
enum {
    GI_MALFORMED = -1, /* Not a protobuf encoding (truncated, bad varint, bad wire type). */
    GI_HEADER = -2,    /* A second header. */
    GI_SIZE = -3,      /* A block whose size is not block_bytes. */
    GI_MORE = -4,      /* More blocks than announced, or two data fields in one Block. */
    GI_NODATA = -5,    /* A Block without data. */
    GI_ORDER = -6,     /* A block index out of order. */
};

/* Decodes one GetResponse (after the header message) from c: each Block's data goes to
 * buf + *next * bb, then its index is checked against *next (so the fields of a Block may come
 * in any order) and *next advances. Stops at the first fault: 0 or a GI_* code. */
static int decode_into(slice_cur *c, uint8_t *buf, size_t bb, uint32_t n_blocks, uint32_t *next)
{
    while (c->left > 0) {
        uint64_t tag, len;
        if (cur_varint(c, &tag) != 0) {
            return GI_MALFORMED;
        }
        uint64_t field = tag >> 3, wt = tag & 7;
        if (field == 1 && wt == 2) {
            return GI_HEADER;
        }
        if (field != 2 || wt != 2) {
            if (cur_skip_field(c, wt) != 0) {
                return GI_MALFORMED;
            }
            continue;
        }
        if (cur_varint(c, &len) != 0 || len > c->left) {
            return GI_MALFORMED;
        }
        size_t end_left = c->left - (size_t)len; /* c->left once this Block is consumed. */
        uint64_t index = 0;
        int have_data = 0;
        while (c->left > end_left) {
            uint64_t t2, v;
            if (cur_varint(c, &t2) != 0) {
                return GI_MALFORMED;
            }
            if ((t2 >> 3) == 1 && (t2 & 7) == 0) {
                if (cur_varint(c, &index) != 0) {
                    return GI_MALFORMED;
                }
            } else if ((t2 >> 3) == 2 && (t2 & 7) == 2) {
                if (cur_varint(c, &v) != 0 || c->left < end_left || v > c->left - end_left) {
                    return GI_MALFORMED;
                }
                if (v != bb) {
                    return GI_SIZE;
                }
                if (*next >= n_blocks || have_data) {
                    return GI_MORE;
                }
                if (cur_take(c, buf + (size_t)*next * bb, bb) != 0) {
                    return GI_MALFORMED;
                }
                have_data = 1;
            } else if (cur_skip_field(c, t2 & 7) != 0) {
                return GI_MALFORMED;
            }
            if (c->left < end_left) {
                return GI_MALFORMED; /* A field ran past its Block. */
            }
        }
        if (!have_data) {
            return GI_NODATA;
        }
        if (index != *next) {
            return GI_ORDER;
        }
        (*next)++;
    }
    return 0;
}

/* For tests (tests/client/test_client.c, declared there): decode_into over n parts (parts[i],
 * lens[i] bytes each; parts may be empty) as the slices of one message. */
int lkv__get_into_scan(const uint8_t *const *parts, const size_t *lens, size_t n, uint8_t *buf,
                       size_t bb, uint32_t n_blocks, uint32_t *next);
int lkv__get_into_scan(const uint8_t *const *parts, const size_t *lens, size_t n, uint8_t *buf,
                       size_t bb, uint32_t n_blocks, uint32_t *next)
{
    grpc_slice *sl = lkv_xmalloc((n > 0 ? n : 1) * sizeof(*sl));
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        sl[i] = grpc_slice_from_static_buffer(parts[i], lens[i]);
        total += lens[i];
    }
    slice_cur c = {sl, n, 0, 0, total};
    int rc = decode_into(&c, buf, bb, n_blocks, next);
    free(sl);
    return rc;
}

/* decode_into for g, its faults recorded as g's failure (get_stop). 0 or a code. */
static int get_decode_into(lkv_get_t *g, slice_cur *c, uint8_t *buf)
{
    static const char *const why[] = {
        NULL,
        "malformed protobuf encoding",
        "second header",
        "block size is not block_bytes",
        "more blocks than announced",
        "block without data",
        "block index out of order",
    };
    int rc = decode_into(c, buf, (size_t)g->h.block_bytes, g->h.n_blocks, &g->next);
    if (rc == 0) {
        return 0;
    }
    int code = rc == GI_MALFORMED ? LKV_EPROTO : LKV_ECORRUPT;
    return get_stop(g,
                    bad_reply(code, rc == GI_MALFORMED ? "GetResponse" : "Get stream", why[-rc]));
}

/* Receives the next message and decodes it into buf. 1 if one came, 0 at the end of the
 * stream, or a negative code (recorded in g). */
static int get_recv_into(lkv_get_t *g, uint8_t *buf)
{
    grpc_byte_buffer *recv = NULL;
    grpc_byte_buffer_reader rd;
    size_t total = 0;
    int got = get_recv_raw(g, &recv, &rd, &total);
    if (got != 1) {
        return got;
    }
    grpc_slice stack[32];
    grpc_slice *sl = stack;
    size_t n = 0, cap = 32;
    grpc_slice one;
    while (grpc_byte_buffer_reader_next(&rd, &one)) {
        if (n == cap) {
            cap *= 2;
            grpc_slice *bigger = lkv_xmalloc(cap * sizeof(*bigger));
            memcpy(bigger, sl, n * sizeof(*sl));
            if (sl != stack) {
                free(sl);
            }
            sl = bigger;
        }
        sl[n++] = one;
    }
    grpc_byte_buffer_reader_destroy(&rd);
    grpc_byte_buffer_destroy(recv);
    slice_cur c = {sl, n, 0, 0, total};
    int rc = get_decode_into(g, &c, buf);
    for (size_t i = 0; i < n; i++) {
        grpc_slice_unref(sl[i]);
    }
    if (sl != stack) {
        free(sl);
    }
    return rc < 0 ? rc : 1;
}

int lkv_client_get_into(lkv_client_t *c, const lkv_docref *ref, int deadline_ms,
                        lkv_get_header *header, void *buf, size_t cap, size_t *len)
{
    lkv_get_t *g = NULL;
    lkv_get_header h;
    *len = 0;
    int rc = lkv_client_get_begin(c, ref, deadline_ms, &h, &g);
    if (header != NULL) {
        *header = h;
    }
    if (rc != 0) {
        return rc;
    }
    size_t need = (size_t)h.n_blocks * (size_t)h.block_bytes;
    if (need > cap || (need > 0 && buf == NULL)) {
        rc = get_stop(
            g, err_local(LKV_ETOOBIG, "get: the document is %zu bytes, the buffer %zu", need, cap));
        lkv_get_end(g);
        tl_err.status = -1;
        return rc;
    }
    /* The header message may already carry blocks (the daemon sends it alone; accept both). */
    for (size_t i = 0; i < g->m.n_blk; i++) {
        const get_blk *b = &g->m.blk[i];
        if (b->index != g->next || g->next >= h.n_blocks || b->len != h.block_bytes) {
            rc = get_stop(g, bad_reply(LKV_ECORRUPT, "Get stream", "bad block in the header"));
            break;
        }
        memcpy((uint8_t *)buf + (size_t)g->next * h.block_bytes, b->data, b->len);
        g->next++;
    }
    get_msg_clear(&g->m);
    while (rc == 0) {
        rc = get_recv_into(g, buf);
        if (rc == 0) {
            rc = get_finish(g);
            break;
        }
        rc = rc < 0 ? rc : 0;
    }
    if (rc == 0) {
        *len = need;
    }
    lkv_get_end(g); /* Any failure above reaped the status first: its message stays. */
    return rc;
}

/* ---- delete, stats ---- */

int lkv_client_delete(lkv_client_t *c, const lkv_docref *ref, int deadline_ms, uint8_t *key_out)
{
    err_clear();
    Lazykv__V1__DocRef d;
    Lazykv__V1__TokenDoc td;
    int rc = docref_fill(ref, &d, &td);
    if (rc != 0) {
        return rc;
    }
    Lazykv__V1__DeleteRequest req = LAZYKV__V1__DELETE_REQUEST__INIT;
    req.doc = &d;
    ProtobufCMessage *m = NULL;
    rc = unary(c, "/lazykv.v1.Cache/Delete", &req.base, &lazykv__v1__delete_response__descriptor,
               deadline_ms, &m);
    if (rc != 0) {
        return rc;
    }
    Lazykv__V1__DeleteResponse *r = (Lazykv__V1__DeleteResponse *)m;
    if (key_out != NULL && r->key.len == LKV_KEY_BYTES) {
        memcpy(key_out, r->key.data, LKV_KEY_BYTES);
    }
    lkv_pb_free(m);
    return 0;
}

/* One Admin/Stats call for section (NULL or "" for all); *m is the reply, freed by the caller
 * with lkv_pb_free. */
static int stats_call(lkv_client_t *c, const char *section, int deadline_ms, ProtobufCMessage **m)
{
    Lazykv__V1__StatsRequest req = LAZYKV__V1__STATS_REQUEST__INIT;
    char *sec = (char *)section;
    if (section != NULL && section[0] != '\0') {
        req.n_sections = 1;
        req.sections = &sec;
    }
    return unary(c, "/lazykv.v1.Admin/Stats", &req.base, &lazykv__v1__stats_response__descriptor,
                 deadline_ms, m);
}

int lkv_client_stats(lkv_client_t *c, const char *section, int deadline_ms, char **info)
{
    err_clear();
    *info = NULL;
    ProtobufCMessage *m = NULL;
    int rc = stats_call(c, section, deadline_ms, &m);
    if (rc != 0) {
        return rc;
    }
    *info = lkv_xstrdup(((Lazykv__V1__StatsResponse *)m)->info);
    lkv_pb_free(m);
    return 0;
}

int lkv_client_stats_entries(lkv_client_t *c, const char *section, int deadline_ms,
                             lkv_stat_entry **entries, size_t *n)
{
    err_clear();
    *entries = NULL;
    *n = 0;
    ProtobufCMessage *m = NULL;
    int rc = stats_call(c, section, deadline_ms, &m);
    if (rc != 0) {
        return rc;
    }
    const Lazykv__V1__StatsResponse *r = (const Lazykv__V1__StatsResponse *)m;
    lkv_stat_entry *e = lkv_xcalloc(r->n_entries + 1, sizeof(*e));
    for (size_t i = 0; i < r->n_entries; i++) {
        const Lazykv__V1__StatEntry *x = r->entries[i];
        copy_name(e[i].section, sizeof(e[i].section), x->section);
        copy_name(e[i].key, sizeof(e[i].key), x->key);
        e[i].value = x->value;
        copy_name(e[i].text, sizeof(e[i].text), x->text);
    }
    *entries = e;
    *n = r->n_entries;
    lkv_pb_free(m);
    return 0;
}

/* ---- list, evict ---- */

/* Copies a DocStatus message into *o. */
static void doc_status_copy(const Lazykv__V1__DocStatus *s, lkv_doc_status *o)
{
    memset(o, 0, sizeof(*o));
    o->present = s->present ? 1 : 0;
    o->tier = s->tier;
    o->n_tokens = s->n_tokens;
    o->n_blocks = s->n_blocks;
    if (s->key.len == LKV_KEY_BYTES) {
        memcpy(o->key, s->key.data, LKV_KEY_BYTES);
    }
    o->miss_cause = s->miss_cause;
    copy_name(o->profile, sizeof(o->profile), s->profile);
    o->pins = s->pins;
    o->bytes = s->bytes;
}

int lkv_client_list(lkv_client_t *c, const lkv_list_filter *f, int deadline_ms,
                    lkv_doc_status **docs, size_t *n, uint8_t *next_key, int *more)
{
    err_clear();
    *docs = NULL;
    *n = 0;
    *more = 0;
    Lazykv__V1__ListRequest req = LAZYKV__V1__LIST_REQUEST__INIT;
    if (f != NULL) {
        req.limit = f->limit;
        if (f->after_key != NULL) {
            req.after_key.data = (uint8_t *)f->after_key;
            req.after_key.len = LKV_KEY_BYTES;
        }
        if (f->profile != NULL) {
            req.profile = (char *)f->profile;
        }
        req.tier = (Lazykv__V1__Tier)f->tier;
    }
    ProtobufCMessage *m = NULL;
    int rc = unary(c, "/lazykv.v1.Admin/List", &req.base, &lazykv__v1__list_response__descriptor,
                   deadline_ms, &m);
    if (rc != 0) {
        return rc;
    }
    const Lazykv__V1__ListResponse *r = (const Lazykv__V1__ListResponse *)m;
    if (r->next_after_key.len != 0 && r->next_after_key.len != LKV_KEY_BYTES) {
        lkv_pb_free(m);
        return bad_reply(LKV_EPROTO, "ListResponse", "next_after_key is not 32 bytes");
    }
    if (r->n_docs > 0) {
        lkv_doc_status *d = lkv_xcalloc(r->n_docs, sizeof(*d));
        for (size_t i = 0; i < r->n_docs; i++) {
            doc_status_copy(r->docs[i], &d[i]);
        }
        *docs = d;
        *n = r->n_docs;
    }
    if (r->next_after_key.len == LKV_KEY_BYTES) {
        *more = 1;
        if (next_key != NULL) {
            memcpy(next_key, r->next_after_key.data, LKV_KEY_BYTES);
        }
    }
    lkv_pb_free(m);
    return 0;
}

int lkv_client_evict(lkv_client_t *c, const uint8_t *key, int deadline_ms)
{
    err_clear();
    if (key == NULL) {
        return err_local(LKV_EINVAL, "evict: no key");
    }
    Lazykv__V1__EvictRequest req = LAZYKV__V1__EVICT_REQUEST__INIT;
    req.key.data = (uint8_t *)key;
    req.key.len = LKV_KEY_BYTES;
    ProtobufCMessage *m = NULL;
    int rc = unary(c, "/lazykv.v1.Admin/Evict", &req.base, &lazykv__v1__evict_response__descriptor,
                   deadline_ms, &m);
    if (rc != 0) {
        return rc;
    }
    lkv_pb_free(m);
    return 0;
}

/* ---- residency controls: hold, evict by class ---- */

int lkv_client_hold(lkv_client_t *c, const uint8_t *key, const char *tenant, const char *profile,
                    int on, int deadline_ms, uint64_t *docs)
{
    err_clear();
    int has_class = (tenant != NULL && tenant[0]) || (profile != NULL && profile[0]);
    if ((key == NULL) == !has_class) {
        return err_local(LKV_EINVAL, "hold: give a key, or a tenant and/or a profile");
    }
    Lazykv__V1__HoldRequest req = LAZYKV__V1__HOLD_REQUEST__INIT;
    if (key != NULL) {
        req.key.data = (uint8_t *)key;
        req.key.len = LKV_KEY_BYTES;
    }
    req.tenant = (char *)(tenant != NULL ? tenant : "");
    req.profile = (char *)(profile != NULL ? profile : "");
    req.off = on ? 0 : 1;
    ProtobufCMessage *m = NULL;
    int rc = unary(c, "/lazykv.v1.Admin/Hold", &req.base, &lazykv__v1__hold_response__descriptor,
                   deadline_ms, &m);
    if (rc != 0) {
        return rc;
    }
    if (docs != NULL) {
        *docs = ((const Lazykv__V1__HoldResponse *)m)->docs;
    }
    lkv_pb_free(m);
    return 0;
}

int lkv_client_evict_class(lkv_client_t *c, const char *tenant, const char *profile, int purge,
                           int deadline_ms, uint64_t *evicted_hot, uint64_t *dropped_cold)
{
    err_clear();
    if ((tenant == NULL || !tenant[0]) && (profile == NULL || !profile[0])) {
        return err_local(LKV_EINVAL, "evict: give a tenant and/or a profile");
    }
    Lazykv__V1__EvictClassRequest req = LAZYKV__V1__EVICT_CLASS_REQUEST__INIT;
    req.tenant = (char *)(tenant != NULL ? tenant : "");
    req.profile = (char *)(profile != NULL ? profile : "");
    req.purge = purge ? 1 : 0;
    ProtobufCMessage *m = NULL;
    int rc = unary(c, "/lazykv.v1.Admin/EvictClass", &req.base,
                   &lazykv__v1__evict_class_response__descriptor, deadline_ms, &m);
    if (rc != 0) {
        return rc;
    }
    const Lazykv__V1__EvictClassResponse *r = (const Lazykv__V1__EvictClassResponse *)m;
    if (evicted_hot != NULL) {
        *evicted_hot = r->evicted_hot;
    }
    if (dropped_cold != NULL) {
        *dropped_cold = r->dropped_cold;
    }
    lkv_pb_free(m);
    return 0;
}

/* ---- attach, release ---- */

void lkv_lease_free(lkv_lease *l)
{
    if (l == NULL) {
        return;
    }
    for (size_t i = 0; i < l->n_docs; i++) {
        free(l->docs[i].pages);
    }
    free(l->docs);
    memset(l, 0, sizeof(*l));
}

/* Copies the proto's ArenaInfo into *o. */
static void arena_from_pb(const Lazykv__V1__ArenaInfo *a, lkv_lease_arena *o)
{
    memset(o, 0, sizeof(*o));
    o->cuda_device = -1;
    if (a == NULL) {
        return;
    }
    copy_name(o->backend, sizeof(o->backend), a->backend);
    copy_name(o->shm_name, sizeof(o->shm_name), a->shm_name);
    o->arena_bytes = a->arena_bytes;
    o->cuda_device = a->cuda_device;
    if (a->cuda_ipc_handle.len == sizeof(o->cuda_ipc)) {
        memcpy(o->cuda_ipc, a->cuda_ipc_handle.data, sizeof(o->cuda_ipc));
        o->has_cuda_ipc = 1;
    }
    for (size_t i = 0; i < a->n_regions && i < LKV_CLIENT_MAX_REGIONS; i++) {
        lkv_arena_region *r = &o->regions[o->n_regions++];
        copy_name(r->profile, sizeof(r->profile), a->regions[i]->profile);
        r->base_offset = a->regions[i]->base_offset;
        r->page_bytes = a->regions[i]->page_bytes;
        r->n_pages = a->regions[i]->n_pages;
    }
}

/* Copies the proto's AttachedDoc into *o (o->pages malloc'ed). Returns 0, or LKV_EPROTO if its
 * pages do not fit its region (a broken reply must not become an address). */
static int doc_from_pb(const Lazykv__V1__AttachedDoc *a, lkv_attached_doc *o)
{
    memset(o, 0, sizeof(*o));
    if (a->key.len == LKV_KEY_BYTES) {
        memcpy(o->key, a->key.data, LKV_KEY_BYTES);
    }
    copy_name(o->profile, sizeof(o->profile), a->profile);
    copy_name(o->model_id, sizeof(o->model_id), a->model_id);
    o->n_tokens = a->n_tokens;
    o->attached = 1;
    o->present = 1;
    o->tier = LKV_WIRE_TIER_HOT;
    if (a->layout != NULL) {
        o->n_layers = a->layout->n_layers;
        o->n_kv_heads = a->layout->n_kv_heads;
        o->head_dim = a->layout->head_dim;
        copy_name(o->dtype, sizeof(o->dtype), a->layout->dtype);
        o->block_tokens = a->layout->block_tokens;
        o->block_bytes = a->layout->block_bytes;
    }
    o->n_pages = (uint32_t)a->n_pages;
    o->pages = lkv_xmalloc((a->n_pages ? a->n_pages : 1) * sizeof(uint32_t));
    if (a->n_pages > 0) {
        memcpy(o->pages, a->pages, a->n_pages * sizeof(uint32_t));
    }
    if (a->region == NULL) {
        return a->n_pages > 0 ? LKV_EPROTO : 0;
    }
    o->region = a->region->index;
    o->region_base = a->region->base_offset;
    o->page_bytes = a->region->page_bytes;
    if (o->page_bytes < o->block_bytes) {
        return LKV_EPROTO;
    }
    for (uint32_t i = 0; i < o->n_pages; i++) {
        if (o->pages[i] >= a->region->n_pages) {
            return LKV_EPROTO;
        }
    }
    return 0;
}

void *lkv_block_addr(void *arena_base, const lkv_attached_doc *d, uint32_t i)
{
    if (arena_base == NULL || d == NULL || i >= d->n_pages) {
        return NULL;
    }
    return (uint8_t *)arena_base + d->region_base + (uint64_t)d->pages[i] * d->page_bytes;
}

/* Attach in mode (the proto's AttachMode: 0 all-or-nothing, 1 pin what is present). */
static int attach_call(lkv_client_t *c, const lkv_docref *refs, size_t n, const uint8_t *lease_id,
                       uint32_t ttl_ms, int deadline_ms, int mode, lkv_lease *out)
{
    err_clear();
    memset(out, 0, sizeof(*out));
    if (n == 0 && lease_id == NULL) {
        return err_local(LKV_EINVAL, "attach: no documents");
    }
    ProtobufCMessage *m = NULL;
    docrefs d;
    int rc = docrefs_build(&d, refs, n);
    if (rc != 0) {
        goto out;
    }
    Lazykv__V1__AttachRequest req = LAZYKV__V1__ATTACH_REQUEST__INIT;
    req.n_docs = n;
    req.docs = d.dp;
    req.ttl_ms = ttl_ms;
    req.mode = mode == 1 ? LAZYKV__V1__ATTACH_MODE__ATTACH_MODE_PRESENT
                         : LAZYKV__V1__ATTACH_MODE__ATTACH_MODE_ALL;
    if (lease_id != NULL) {
        req.lease_id.data = (uint8_t *)lease_id;
        req.lease_id.len = LKV_LEASE_ID_BYTES;
    }
    rc = unary(c, "/lazykv.v1.Cache/Attach", &req.base, &lazykv__v1__attach_response__descriptor,
               deadline_ms, &m);
    if (rc != 0) {
        goto out;
    }
    const Lazykv__V1__AttachResponse *r = (const Lazykv__V1__AttachResponse *)m;
    int no_lease = mode == 1 && lease_id == NULL && r->lease_id.len == 0 && r->lease_docs == 0;
    if (r->lease_id.len != LKV_LEASE_ID_BYTES && !no_lease) {
        rc = bad_reply(LKV_EPROTO, "AttachResponse", "lease_id is not 16 bytes");
        goto out;
    }
    if (r->n_attached != n || (mode == 1 && r->n_docs != n)) {
        rc = bad_reply(LKV_EPROTO, "AttachResponse", "wrong number of attached documents");
        goto out;
    }
    out->live = !no_lease;
    if (out->live) {
        memcpy(out->id, r->lease_id.data, LKV_LEASE_ID_BYTES);
    }
    out->expires_unix_ms = r->expires_unix_ms;
    out->ttl_ms = r->ttl_ms;
    out->lease_docs = r->lease_docs;
    arena_from_pb(r->arena, &out->arena);
    out->n_docs = n;
    out->docs = lkv_xcalloc(n ? n : 1, sizeof(*out->docs));
    for (size_t i = 0; i < n && rc == 0; i++) {
        const Lazykv__V1__AttachedDoc *a = r->attached[i];
        lkv_attached_doc *o = &out->docs[i];
        if (doc_from_pb(a, o) != 0) {
            rc = bad_reply(LKV_EPROTO, "AttachResponse", "pages outside their arena region");
            break;
        }
        o->attached = mode != 1 || a->n_pages > 0;
        if (mode == 1 && r->docs[i] != NULL && !o->attached) {
            o->present = r->docs[i]->present ? 1 : 0;
            o->tier = r->docs[i]->tier;
        }
    }
out:
    if (m != NULL) {
        lkv_pb_free(m);
    }
    if (rc != 0) {
        lkv_lease_free(out);
    }
    docrefs_free(&d);
    return rc;
}

int lkv_client_attach(lkv_client_t *c, const lkv_docref *refs, size_t n, const uint8_t *lease_id,
                      uint32_t ttl_ms, int deadline_ms, lkv_lease *out)
{
    return attach_call(c, refs, n, lease_id, ttl_ms, deadline_ms, 0, out);
}

int lkv_client_attach_present(lkv_client_t *c, const lkv_docref *refs, size_t n,
                              const uint8_t *lease_id, uint32_t ttl_ms, int deadline_ms,
                              lkv_lease *out)
{
    return attach_call(c, refs, n, lease_id, ttl_ms, deadline_ms, 1, out);
}

int lkv_client_release(lkv_client_t *c, const uint8_t *lease_id, int deadline_ms,
                       uint32_t *released)
{
    err_clear();
    if (lease_id == NULL) {
        return err_local(LKV_EINVAL, "release: no lease id");
    }
    Lazykv__V1__ReleaseRequest req = LAZYKV__V1__RELEASE_REQUEST__INIT;
    req.lease_id.data = (uint8_t *)lease_id;
    req.lease_id.len = LKV_LEASE_ID_BYTES;
    ProtobufCMessage *m = NULL;
    int rc = unary(c, "/lazykv.v1.Cache/Release", &req.base,
                   &lazykv__v1__release_response__descriptor, deadline_ms, &m);
    if (rc != 0) {
        return rc;
    }
    if (released != NULL) {
        *released = ((const Lazykv__V1__ReleaseResponse *)m)->released_docs;
    }
    lkv_pb_free(m);
    return 0;
}

/* ---- put in place ---- */

int lkv_arena_map_open(const lkv_lease_arena *a, lkv_arena_map *m)
{
    if (strcmp(a->backend, "host") != 0) {
        return err_local(LKV_ENOTSUP,
                         "the arena is %s: map it with cudaIpcOpenMemHandle(arena.cuda_ipc)",
                         a->backend);
    }
    if (m->base != NULL && strcmp(m->name, a->shm_name) == 0 && m->bytes == a->arena_bytes) {
        return 0;
    }
    lkv_arena_map_close(m);
    int fd = shm_open(a->shm_name, O_RDWR, 0);
    if (fd < 0) {
        return err_local(LKV_EIO, "shm_open %s: %s", a->shm_name, strerror(errno));
    }
    void *p = mmap(NULL, a->arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        return err_local(LKV_EIO, "mmap %s (%llu bytes): %s", a->shm_name,
                         (unsigned long long)a->arena_bytes, strerror(e));
    }
    m->base = p;
    m->bytes = a->arena_bytes;
    snprintf(m->name, sizeof(m->name), "%s", a->shm_name);
    return 0;
}

void lkv_arena_map_close(lkv_arena_map *m)
{
    if (m != NULL && m->base != NULL) {
        munmap(m->base, m->bytes);
        memset(m, 0, sizeof(*m));
    }
}

void lkv_reservation_free(lkv_reservation *r)
{
    if (r == NULL) {
        return;
    }
    free(r->doc.pages);
    free(r->addrs);
    memset(r, 0, sizeof(*r));
}

int lkv_client_reserve(lkv_client_t *c, const char *profile, const uint32_t *tokens, size_t n,
                       const uint8_t *lease_id, uint32_t ttl_ms, int wait, lkv_arena_map *map,
                       int deadline_ms, lkv_reservation *out)
{
    return lkv_client_reserve_ex(c, profile, tokens, n, lease_id, ttl_ms,
                                 wait ? LKV_RESERVE_WAIT : 0, map, deadline_ms, out);
}

int lkv_client_reserve_ex(lkv_client_t *c, const char *profile, const uint32_t *tokens, size_t n,
                          const uint8_t *lease_id, uint32_t ttl_ms, int flags, lkv_arena_map *map,
                          int deadline_ms, lkv_reservation *out)
{
    err_clear();
    memset(out, 0, sizeof(*out));
    if (profile == NULL || tokens == NULL || n == 0) {
        return err_local(LKV_EINVAL, "reserve: no profile or tokens");
    }
    Lazykv__V1__PutHeader h = LAZYKV__V1__PUT_HEADER__INIT;
    h.profile = (char *)profile;
    h.token_ids = (uint32_t *)tokens;
    h.n_token_ids = n;
    Lazykv__V1__ReserveRequest req = LAZYKV__V1__RESERVE_REQUEST__INIT;
    req.header = &h;
    req.ttl_ms = ttl_ms;
    req.wait = (flags & LKV_RESERVE_WAIT) != 0;
    req.scratch = (flags & LKV_RESERVE_SCRATCH) != 0;
    if (lease_id != NULL) {
        req.lease_id.data = (uint8_t *)lease_id;
        req.lease_id.len = LKV_LEASE_ID_BYTES;
    }
    ProtobufCMessage *m = NULL;
    int rc = unary(c, "/lazykv.v1.Cache/Reserve", &req.base,
                   &lazykv__v1__reserve_response__descriptor, deadline_ms, &m);
    if (rc != 0) {
        return rc;
    }
    const Lazykv__V1__ReserveResponse *r = (const Lazykv__V1__ReserveResponse *)m;
    if (r->lease_id.len != LKV_LEASE_ID_BYTES || r->doc == NULL) {
        rc = bad_reply(LKV_EPROTO, "ReserveResponse", "no lease_id or doc");
        goto out;
    }
    memcpy(out->lease_id, r->lease_id.data, LKV_LEASE_ID_BYTES);
    out->expires_unix_ms = r->expires_unix_ms;
    out->ttl_ms = r->ttl_ms;
    out->lease_docs = r->lease_docs;
    out->already_present = r->already_present;
    out->waited = r->waited;
    arena_from_pb(r->arena, &out->arena);
    if (doc_from_pb(r->doc, &out->doc) != 0 || out->doc.n_pages != r->n_blocks) {
        rc = bad_reply(LKV_EPROTO, "ReserveResponse", "pages outside their arena region");
        goto out;
    }
    if (map != NULL) {
        rc = lkv_arena_map_open(&out->arena, map);
        if (rc != 0) {
            goto out;
        }
        out->addrs = lkv_xcalloc(out->doc.n_pages ? out->doc.n_pages : 1, sizeof(void *));
        for (uint32_t i = 0; i < out->doc.n_pages; i++) {
            out->addrs[i] = lkv_block_addr(map->base, &out->doc, i);
            if ((uint8_t *)out->addrs[i] + out->doc.block_bytes >
                (uint8_t *)map->base + map->bytes) {
                rc = bad_reply(LKV_EPROTO, "ReserveResponse", "a page past the arena's end");
                goto out;
            }
        }
    }
out:
    lkv_pb_free(m);
    if (rc != 0) {
        lkv_reservation_free(out);
    }
    return rc;
}

int lkv_client_commit(lkv_client_t *c, const uint8_t *lease_id, const uint8_t *key, int deadline_ms,
                      lkv_attached_doc *out, int *already_present)
{
    err_clear();
    if (out != NULL) {
        memset(out, 0, sizeof(*out));
    }
    if (lease_id == NULL || key == NULL) {
        return err_local(LKV_EINVAL, "commit: no lease id or key");
    }
    Lazykv__V1__CommitRequest req = LAZYKV__V1__COMMIT_REQUEST__INIT;
    req.lease_id.data = (uint8_t *)lease_id;
    req.lease_id.len = LKV_LEASE_ID_BYTES;
    req.key.data = (uint8_t *)key;
    req.key.len = LKV_KEY_BYTES;
    ProtobufCMessage *m = NULL;
    int rc = unary(c, "/lazykv.v1.Cache/Commit", &req.base,
                   &lazykv__v1__commit_response__descriptor, deadline_ms, &m);
    if (rc != 0) {
        return rc;
    }
    const Lazykv__V1__CommitResponse *r = (const Lazykv__V1__CommitResponse *)m;
    if (already_present != NULL) {
        *already_present = r->already_present;
    }
    if (out != NULL && r->doc != NULL && doc_from_pb(r->doc, out) != 0) {
        free(out->pages);
        memset(out, 0, sizeof(*out));
        rc = bad_reply(LKV_EPROTO, "CommitResponse", "pages outside their arena region");
    }
    lkv_pb_free(m);
    return rc;
}

int lkv_client_abort(lkv_client_t *c, const uint8_t *lease_id, const uint8_t *key, int deadline_ms)
{
    err_clear();
    if (lease_id == NULL || key == NULL) {
        return err_local(LKV_EINVAL, "abort: no lease id or key");
    }
    Lazykv__V1__AbortRequest req = LAZYKV__V1__ABORT_REQUEST__INIT;
    req.lease_id.data = (uint8_t *)lease_id;
    req.lease_id.len = LKV_LEASE_ID_BYTES;
    req.key.data = (uint8_t *)key;
    req.key.len = LKV_KEY_BYTES;
    ProtobufCMessage *m = NULL;
    int rc = unary(c, "/lazykv.v1.Cache/Abort", &req.base, &lazykv__v1__abort_response__descriptor,
                   deadline_ms, &m);
    if (rc == 0) {
        lkv_pb_free(m);
    }
    return rc;
}

/* ---- keys ---- */

/* ---- cluster ---- */

void lkv_cluster_info_free(lkv_cluster_info *i)
{
    if (i == NULL) {
        return;
    }
    free(i->members);
    free(i->profiles);
    memset(i, 0, sizeof(*i));
}

int lkv_client_cluster(lkv_client_t *c, int deadline_ms, lkv_cluster_info *out)
{
    err_clear();
    memset(out, 0, sizeof(*out));
    Lazykv__V1__ClusterRequest req = LAZYKV__V1__CLUSTER_REQUEST__INIT;
    ProtobufCMessage *m = NULL;
    int rc = unary(c, "/lazykv.v1.Cache/Cluster", &req.base,
                   &lazykv__v1__cluster_response__descriptor, deadline_ms, &m);
    if (rc != 0) {
        return rc;
    }
    const Lazykv__V1__ClusterResponse *r = (const Lazykv__V1__ClusterResponse *)m;
    copy_name(out->mode, sizeof(out->mode), r->mode);
    out->epoch = r->epoch;
    out->etcd_up = r->etcd_up;
    out->n_members = r->n_members;
    out->members = lkv_xcalloc(r->n_members + 1, sizeof(*out->members));
    for (size_t i = 0; i < r->n_members; i++) {
        const Lazykv__V1__ClusterMember *s = r->members[i];
        lkv_cluster_member *o = &out->members[i];
        copy_name(o->id, sizeof(o->id), s->id);
        copy_name(o->addr, sizeof(o->addr), s->addr);
        copy_name(o->version, sizeof(o->version), s->version);
        copy_name(o->state, sizeof(o->state), s->state);
        o->hot_bytes = s->hot_bytes;
        o->self = s->self;
        o->share = s->share;
        o->hot_used_bytes = s->hot_used_bytes;
        o->cold_used_bytes = s->cold_used_bytes;
        o->hot_docs = s->hot_docs;
        o->cold_docs = s->cold_docs;
    }
    out->profiles = lkv_xcalloc(r->n_profiles + 1, sizeof(*out->profiles));
    for (size_t i = 0; i < r->n_profiles; i++) {
        const Lazykv__V1__ClusterProfile *s = r->profiles[i];
        if (s->fingerprint.len != 32) {
            continue;
        }
        lkv_cluster_profile *o = &out->profiles[out->n_profiles++];
        copy_name(o->name, sizeof(o->name), s->name);
        memcpy(o->fingerprint, s->fingerprint.data, 32);
    }
    lkv_pb_free(m);
    return 0;
}

void lkv_key_to_hex(const uint8_t *key, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < LKV_KEY_BYTES; i++) {
        out[2 * i] = hx[key[i] >> 4];
        out[2 * i + 1] = hx[key[i] & 15];
    }
    out[2 * LKV_KEY_BYTES] = '\0';
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') {
        return ch - '0';
    }
    if (ch >= 'a' && ch <= 'f') {
        return ch - 'a' + 10;
    }
    if (ch >= 'A' && ch <= 'F') {
        return ch - 'A' + 10;
    }
    return -1;
}

int lkv_key_from_hex(const char *hex, uint8_t *key)
{
    if (hex == NULL || strlen(hex) != 2 * LKV_KEY_BYTES) {
        return LKV_EINVAL;
    }
    for (int i = 0; i < LKV_KEY_BYTES; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return LKV_EINVAL;
        }
        key[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}
