/*
 * lkv_worker_svc.h: the lazykv.v1.Worker gRPC service (proto/lazykv/v1/worker.proto) over the
 * serving engine (lkv_engine.h), served through lazykvd's RPC engine (daemon/lkv_server.h,
 * linked alone as lkv_rpcserver: the one module of server-side gRPC core calls).
 *
 * Generate is a server stream: start() turns the GenerateRequest into an lkv_request (text
 * through the worker's tokenizer) and submits it with the call's deadline; each next() sends
 * the request's next engine event (a Token, then the Summary) or, when none is ready, parks the
 * call (lkv_rpc_defer); the engine's notify resumes it (lkv_rpc_resume) from the engine thread.
 * A client that cancels, or a deadline that passes, ends the call (the RPC engine sees it even
 * while parked) and cleanup cancels the request in the engine, which frees its batch slot and
 * KV pages at its next iteration. Statuses: worker.proto.
 *
 * Ownership: the service borrows the engine and the worker (for the tokenizer and model); both
 * must outlive the server. Each call's state is freed when both the call (cleanup) and the
 * engine (last notify) are done with it.
 */
#ifndef LKV_WORKER_SVC_H
#define LKV_WORKER_SVC_H

#include "lkv_engine.h"
#include "lkv_server.h"

typedef struct lkv_worker_svc {
    lkv_engine *engine;     /* Borrowed. */
    lkv_worker *worker;     /* Borrowed (tokenizer; the engine thread owns the rest). */
    int default_max_tokens; /* max_tokens 0 in a request; 0: 64. */
    int max_tokens_limit;   /* Largest max_tokens accepted; 0: no limit but the model's. */
} lkv_worker_svc;

/* Fills methods[0] (the array has room for LKV_WORKER_SVC_METHODS) for svc (borrowed until the
 * server is destroyed). Returns the number of methods. */
#define LKV_WORKER_SVC_METHODS 1
int lkv_worker_svc_methods(lkv_worker_svc *svc, lkv_method *methods);

#endif
