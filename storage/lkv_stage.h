/*
 * lkv_stage.h: the Get staging ring, a fixed set of equal host buffers (SLOTS) that blocks of
 * a CUDA arena are copied into on their way to the wire (DESIGN.md 4, "one copy on the wire").
 *
 * A Get of a document in HBM cannot hand gRPC a slice over arena memory; it takes a slot,
 * copies the next message's blocks into it (cudaMemcpyAsync from the arena, lkv_arena.h), and
 * sends a slice over the slot whose destroy callback (lkv_stage_release_cb) returns the slot.
 * The ring is allocated once (n_slots * slot_bytes, page-locked with cudaHostAlloc for a CUDA
 * arena so the copy is a real DMA; plain page-aligned memory otherwise) and never grows: no
 * allocation per Get or per message.
 *
 * Backpressure. When every slot is held, lkv_stage_acquire queues the caller's waiter (FIFO)
 * and returns LKV_EAGAIN; the next release hands its slot straight to the first waiter by
 * calling the waiter's grant function (from the releasing thread, no lock held). A caller that
 * parks a call there holds no thread. Slots held by a client that stopped reading come back
 * when gRPC drops its slices (its call ends: deadline, cancel, connection lost); so that such a
 * client can never stall everyone else for good, a waiter not served within wait_ms is granted
 * NULL by the ring's timer thread (the caller then sends that message by the copying path),
 * and so is every waiter queued behind it; the ring is then STARVED (no slot came back for
 * wait_ms): until the next release, lkv_stage_acquire answers LKV_EBUSY at once instead of
 * queueing, so readers behind stalled ones pay the wait once, not once per message.
 * wait_ms 0: no timer (a waiter waits for a slot or for its caller to cancel it).
 *
 * Ownership: a slot is owned by whoever acquired or was granted it until it is released,
 * exactly once (releasing a free slot is a bug: logged and abort()). A waiter is caller-owned
 * memory; it must stay valid while queued (lkv_stage_cancel unqueues it). The grant function
 * receives copies of ctx and tag, never the waiter, so the waiter may be freed as soon as
 * cancel returns, whichever way it returns.
 *
 * Thread safety: every function may be called from any thread. One mutex guards the free list
 * and the queue; grant functions run without it.
 *
 * Statistics (when created with a registry): section "get_stage": slots, slot_bytes, in_use
 * (gauge), acquired (slots taken, counter), waited (acquires that queued), timed_out (waiters
 * granted NULL), bypassed (acquires refused while starved); metrics lkv_get_stage_*.
 */
#ifndef LKV_STAGE_H
#define LKV_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "lkv_stats.h"

typedef struct lkv_stage lkv_stage;           /* Opaque ring. */
typedef struct lkv_stage_slot lkv_stage_slot; /* Opaque slot; stable address until destroy. */

/* Called once per queued waiter that is served: slot (now the callee's), or NULL if wait_ms
 * passed first. ctx and tag are the values given to lkv_stage_acquire. Runs on the releasing
 * thread or on the ring's timer thread, with no ring lock held; it may call any lkv_stage_*
 * function (e.g. release the slot again). */
typedef void (*lkv_stage_grant_fn)(void *ctx, uint64_t tag, lkv_stage_slot *slot);

/* A waiter: caller-owned, fields private to lkv_stage.c (zero it before first use). */
typedef struct lkv_stage_waiter {
    struct lkv_stage_waiter *next; /* Queue links. */
    struct lkv_stage_waiter *prev;
    lkv_stage_grant_fn fn;
    void *ctx;
    uint64_t tag;
    uint64_t due_ns; /* CLOCK_MONOTONIC time it is granted NULL (wait_ms > 0). */
    int queued;      /* 1 while in the queue. */
} lkv_stage_waiter;

/* Memory of the ring. */
enum lkv_stage_mem {
    LKV_STAGE_MEM_HOST = 0,   /* Page-aligned heap memory (host arena, tests). */
    LKV_STAGE_MEM_PINNED = 1, /* cudaHostAlloc (CUDA builds; LKV_ENOTSUP otherwise). */
};

/* Creates a ring of n_slots (1..65536) slots of slot_bytes (1..1 GiB, rounded up to 4 KiB),
 * memory mem (enum lkv_stage_mem), waiters granted NULL after wait_ms (0: never). stats
 * (borrowed, may be NULL) receives the counters above. Returns 0, LKV_EINVAL (sizes),
 * LKV_ENOMEM (the allocation), LKV_ENOTSUP / LKV_ECUDA (pinned memory), LKV_EEXIST (stats
 * already holds a ring's counters). *out is owned by the caller (lkv_stage_destroy). */
int lkv_stage_create(uint64_t slot_bytes, uint32_t n_slots, int mem, uint64_t wait_ms,
                     lkv_stats *stats, lkv_stage **out);

/* Stops the timer, unregisters the counters and frees the memory. No waiter may be queued
 * (asserted). If slots are still held (gRPC still owns slices over them) the memory is left
 * allocated (leaked, with a warning) rather than freed under a reader. r may be NULL. */
void lkv_stage_destroy(lkv_stage *r);

/* A free slot, or NULL if none (never queues). */
lkv_stage_slot *lkv_stage_try_acquire(lkv_stage *r);

/* A free slot into *out and 0; or, if none is free, queues w with (fn, ctx, tag) and returns
 * LKV_EAGAIN: fn will be called exactly once (a slot or NULL), unless lkv_stage_cancel(w)
 * returns 1 first; or, if none is free and the ring is starved, LKV_EBUSY (nothing queued).
 * w must not be queued already (asserted). */
int lkv_stage_acquire(lkv_stage *r, lkv_stage_waiter *w, lkv_stage_grant_fn fn, void *ctx,
                      uint64_t tag, lkv_stage_slot **out);

/* Unqueues w: 1 if it was queued (fn will not run), 0 if it was not (never queued, or fn has
 * run or is about to run). */
int lkv_stage_cancel(lkv_stage *r, lkv_stage_waiter *w);

/* Returns slot s to its ring (or hands it to the first waiter). */
void lkv_stage_release(lkv_stage_slot *s);

/* lkv_stage_release with the signature of a release callback (lkv_rpc_send_pieces). */
void lkv_stage_release_cb(void *slot);

/* The slot's memory (slot_bytes, 4 KiB aligned) and its index (0..n_slots-1). */
void *lkv_stage_slot_ptr(const lkv_stage_slot *s);
uint32_t lkv_stage_slot_index(const lkv_stage_slot *s);

uint64_t lkv_stage_slot_bytes(const lkv_stage *r); /* After rounding. */
uint32_t lkv_stage_n_slots(const lkv_stage *r);
int lkv_stage_mem_kind(const lkv_stage *r); /* enum lkv_stage_mem. */

/* A consistent snapshot of the counters. */
typedef struct lkv_stage_counts {
    uint32_t in_use;     /* Slots held now. */
    uint32_t max_in_use; /* Most held at once. */
    uint32_t queued;     /* Waiters queued now. */
    uint64_t acquired;   /* Slots handed out (acquire, try_acquire and grants). */
    uint64_t waited;     /* Acquires that queued. */
    uint64_t timed_out;  /* Waiters granted NULL. */
    uint64_t bypassed;   /* Acquires answered LKV_EBUSY (starved). */
} lkv_stage_counts;
void lkv_stage_counts_get(lkv_stage *r, lkv_stage_counts *out);

#endif
