/*
 * lkv_transfer.c: the gRPC streaming transport and the store sink (see lkv_transfer.h).
 *
 * gRPC transport: a Get of (profile, tokens) to the peer as a bidirectional lkv_peer stream
 * (one request, then half-close: a server-streaming call), with the cluster credential and the
 * tenant in metadata, so the peer serves it locally (internal calls are never forwarded or
 * redirected) from its store under the tenant's salt. The first message's header gives
 * n_blocks and block_bytes (begin), then blocks follow in order (block); the stream's status
 * ends it (end). A block out of order or of the wrong size stops it (LKV_ECORRUPT).
 */
#include "lkv_transfer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "lazykv/v1/cache.pb-c.h"
#include "lkv_cluster.h"
#include "lkv_err.h"
#include "lkv_log.h"

typedef struct grpc_impl {
    lkv_peer_chan *(*chan_of)(void *ctx, const char *addr);
    void *ctx;
} grpc_impl;

typedef struct xfer {
    const lkv_transfer_sink *sink;
    void *sink_ctx;
    int begun;
    uint32_t next, n_blocks;
    uint64_t block_bytes;
    int rc; /* First failure of a callback. */
    lkv_peer_stream *s;
    _Atomic int refs; /* grpc_fetch's and x_end's: the last one releases the stream. */
} xfer;

static void x_unref(xfer *x)
{
    if (atomic_fetch_sub(&x->refs, 1) == 1) {
        lkv_peer_stream_release(x->s);
        free(x);
    }
}

static void x_msg(void *arg, ProtobufCMessage *m)
{
    xfer *x = arg;
    const Lazykv__V1__GetResponse *r = (const Lazykv__V1__GetResponse *)m;
    if (x->rc == 0 && r->header != NULL && !x->begun) {
        x->begun = 1;
        x->n_blocks = r->header->n_blocks;
        x->block_bytes = r->header->block_bytes;
        x->rc = x->sink->begin(x->sink_ctx, x->n_blocks, x->block_bytes);
    }
    for (size_t i = 0; x->rc == 0 && i < r->n_blocks; i++) {
        const Lazykv__V1__Block *b = r->blocks[i];
        if (!x->begun || b->index != x->next || b->data.len != x->block_bytes) {
            x->rc = LKV_ECORRUPT;
            break;
        }
        x->rc = x->sink->block(x->sink_ctx, b->index, b->data.data, b->data.len);
        x->next++;
    }
    if (x->rc != 0) {
        lkv_peer_stream_cancel(x->s);
    }
    protobuf_c_message_free_unpacked(m, NULL);
}

static void x_end(void *arg, int rc, const char *msg)
{
    xfer *x = arg;
    if (x->rc != 0) {
        rc = x->rc;
    } else if (rc == 0 && (!x->begun || x->next != x->n_blocks)) {
        rc = LKV_ECORRUPT; /* Fewer blocks than announced. */
    }
    if (rc != 0 && rc != LKV_ENOTFOUND) {
        LKV_LOGI("cluster: transfer stopped: %s (%s)", msg, lkv_err_name(rc));
    }
    x->sink->end(x->sink_ctx, rc);
    x_unref(x);
}

static int grpc_fetch(void *impl, const char *peer, const lkv_transfer_doc *doc,
                      const lkv_transfer_sink *sink, void *ctx)
{
    grpc_impl *g = impl;
    lkv_peer_chan *ch = g->chan_of(g->ctx, peer);
    if (ch == NULL) {
        return LKV_EUNAVAIL;
    }
    xfer *x = lkv_xcalloc(1, sizeof(*x));
    x->sink = sink;
    x->sink_ctx = ctx;
    atomic_init(&x->refs, 2);
    lkv_peer_md md[2] = {{"authorization", doc->bearer}, {LKV_CLUSTER_TENANT_MD, doc->tenant}};
    /* No message arrives before the request below is sent, so x_msg always sees x->s set; x_end
     * may run before open returns (a call that fails at once): the two references keep x. */
    int rc = lkv_peer_stream_open(ch, "/lazykv.v1.Cache/Get", &lazykv__v1__get_response__descriptor,
                                  md, 2, doc->deadline_ms, x_msg, x_end, x, &x->s);
    if (rc != 0) {
        free(x);
        return rc;
    }
    Lazykv__V1__TokenDoc td = LAZYKV__V1__TOKEN_DOC__INIT;
    td.profile = (char *)doc->profile;
    td.n_token_ids = doc->n_tokens;
    td.token_ids = (uint32_t *)doc->tokens;
    Lazykv__V1__DocRef ref = LAZYKV__V1__DOC_REF__INIT;
    ref.tokens = &td;
    Lazykv__V1__GetRequest req = LAZYKV__V1__GET_REQUEST__INIT;
    req.doc = &ref;
    if (lkv_peer_stream_send(x->s, &req.base) != 0 || lkv_peer_stream_close_send(x->s) != 0) {
        lkv_peer_stream_cancel(x->s); /* x_end still runs. */
    }
    x_unref(x);
    return 0;
}

void lkv_transfer_grpc(lkv_transport *out, lkv_peer_chan *(*chan_of)(void *ctx, const char *addr),
                       void *ctx)
{
    grpc_impl *g = lkv_xcalloc(1, sizeof(*g));
    g->chan_of = chan_of;
    g->ctx = ctx;
    out->name = "grpc";
    out->fetch = grpc_fetch;
    out->impl = g;
}

void lkv_transport_free(lkv_transport *t)
{
    if (t != NULL) {
        free(t->impl);
        t->impl = NULL;
    }
}

/* ---- store sink -------------------------------------------------------------------------- */

typedef struct store_sink {
    lkv_store *store;
    uint8_t salt[LKV_SALT_BYTES];
    char *profile;
    uint32_t *tokens;
    size_t n_tokens;
    int prio; /* lkv_put_opts.prio of the put. */
    lkv_store_put *tx;
    void (*done)(void *arg, int rc);
    void *arg;
} store_sink;

void *lkv_transfer_store_sink(lkv_store *store, const uint8_t *salt, const char *profile,
                              const uint32_t *tokens, size_t n_tokens, int prio,
                              void (*done)(void *arg, int rc), void *arg)
{
    store_sink *k = lkv_xcalloc(1, sizeof(*k));
    k->store = store;
    memcpy(k->salt, salt, LKV_SALT_BYTES);
    k->profile = lkv_xstrdup(profile);
    k->tokens = lkv_xmalloc((n_tokens + 1) * sizeof(*k->tokens));
    memcpy(k->tokens, tokens, n_tokens * sizeof(*tokens));
    k->n_tokens = n_tokens;
    k->prio = prio;
    k->done = done;
    k->arg = arg;
    return k;
}

static int ss_begin(void *ctx, uint32_t n_blocks, uint64_t block_bytes)
{
    store_sink *k = ctx;
    int exists = 0;
    lkv_put_opts o = {.prio = k->prio};
    int rc = lkv_store_put_begin_ex(k->store, k->salt, k->profile, k->tokens, (uint32_t)k->n_tokens,
                                    &o, &k->tx, NULL, &exists);
    if (rc != 0) {
        k->tx = NULL;
        return rc;
    }
    if (lkv_store_put_n_blocks(k->tx) != n_blocks) {
        (void)block_bytes;
        return LKV_ECORRUPT; /* The peer's document does not fit our profile. */
    }
    return 0;
}

static int ss_block(void *ctx, uint32_t index, const void *data, size_t len)
{
    store_sink *k = ctx;
    return lkv_store_put_block(k->tx, index, data, len);
}

static void ss_end(void *ctx, int rc)
{
    store_sink *k = ctx;
    if (k->tx != NULL) {
        if (rc == 0) {
            rc = lkv_store_put_commit(k->tx);
        } else {
            lkv_store_put_abort(k->tx);
        }
    }
    k->done(k->arg, rc);
    free(k->profile);
    free(k->tokens);
    free(k);
}

const lkv_transfer_sink lkv_transfer_store_sink_ops = {ss_begin, ss_block, ss_end};
