/*
 * lkv_transfer.h: moving one document's KV from the member that held it to this one (DESIGN.md
 * section 5). When membership changes, a document's owner can change while its KV still sits
 * on the previous owner: the new owner, asked for it and missing it, fetches it from there
 * (while that member lives; afterwards it is a miss) and stores it as its own.
 *
 * Transports. A transfer is (peer, document) -> a stream of blocks into a sink. The transport
 * here is gRPC streaming: an internal lazykv.v1.Cache/Get to the previous owner with the
 * cluster credential and the caller's tenant (lkv_peer streams, no polling thread held). An
 * NCCL transport (ncclSend/ncclRecv between the two GPUs, the communicator set up from a
 * ncclUniqueId exchanged over gRPC; another issue) implements the same lkv_transport: it gets
 * the same document description and delivers the same header and blocks to the same sink, so
 * the store side does not change. Blocks arrive in index order.
 *
 * Sinks. lkv_transfer_store_sink writes the document into the local store (a put transaction:
 * nothing is visible until every block arrived and the commit succeeded; any failure aborts).
 */
#ifndef LKV_TRANSFER_H
#define LKV_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#include "lkv_peer.h"
#include "lkv_store.h"

/* The document to move (all borrowed for the fetch call; transports copy what they keep). */
typedef struct lkv_transfer_doc {
    const char *profile;
    const uint32_t *tokens;
    size_t n_tokens;
    const char *tenant;  /* Tenant the document belongs to (its salt keys it on both ends). */
    const char *bearer;  /* "Bearer <cluster token>". */
    int64_t deadline_ms; /* From now. */
} lkv_transfer_doc;

/* Where the blocks go; every callback runs on the transport's thread, never blocking long. */
typedef struct lkv_transfer_sink {
    /* The document's shape as the sender has it: n_blocks blocks of block_bytes. 0 to go on. */
    int (*begin)(void *ctx, uint32_t n_blocks, uint64_t block_bytes);
    /* One block (borrowed for the call), in index order. 0 to go on. */
    int (*block)(void *ctx, uint32_t index, const void *data, size_t len);
    /* Always called once at the end: rc 0 when every block arrived, else why it stopped
     * (LKV_ENOTFOUND: the peer does not have it). */
    void (*end)(void *ctx, int rc);
} lkv_transfer_sink;

/* A transport (gRPC streaming here; NCCL later). */
typedef struct lkv_transport {
    const char *name;
    /* Starts fetching doc from peer (host:port) into sink (ctx passed through); returns 0 if
     * sink->end will be called, else an error (then it will not). */
    int (*fetch)(void *impl, const char *peer, const lkv_transfer_doc *doc,
                 const lkv_transfer_sink *sink, void *ctx);
    void *impl;
} lkv_transport;

/* Fills *out with the gRPC streaming transport; channels come from chan_of(ctx, addr) (borrowed
 * until the transport is freed). Free with lkv_transport_free once no fetch runs. */
void lkv_transfer_grpc(lkv_transport *out, lkv_peer_chan *(*chan_of)(void *ctx, const char *addr),
                       void *ctx);

/* Frees what a transport owns (NULL allowed). */
void lkv_transport_free(lkv_transport *t);

/* A sink that stores the document in store under salt (32 bytes, copied) and profile/tokens
 * (copied) with eviction priority prio (-1..1, lkv_put_opts.prio: a local replica is stored
 * with -1, evicted before owned documents; a document moved to us is 0); on end it commits
 * (rc 0) or aborts, then calls done(arg, rc) with the final code. A document already stored
 * keeps its priority. Returns the sink's ctx (freed after done). */
void *lkv_transfer_store_sink(lkv_store *store, const uint8_t *salt, const char *profile,
                              const uint32_t *tokens, size_t n_tokens, int prio,
                              void (*done)(void *arg, int rc), void *arg);
extern const lkv_transfer_sink lkv_transfer_store_sink_ops;

#endif
