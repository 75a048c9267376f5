/*
 * lkv_store_tier.c: the block store's tier engine and write-back writer (internals and locking
 * in lkv_store_int.h).
 *
 * The engine keeps the two tiers' policies, the arena and RocksDB in step:
 *   admit      hot: policy admit (evicting victims through hot_evict_cb), then arena pages;
 *              cold: policy admit (evicting through cold_evict_cb); the data is written after.
 *   evict      a hot victim is demoted: if it is not cold yet, its blocks are copied into a
 *              batch under the lock and the batch is written by lkv__demote_flush once the
 *              evicting caller has pinned what it holds, without the lock (the victim is cold
 *              and cold_busy meanwhile: readers wait); it is dropped (LKV_MISS_EVICTED) if the
 *              cold tier cannot take it; a cold victim loses its RocksDB data and leaves the
 *              store unless hot.
 *   promote    a cold-only doc is pinned in the cold tier, admitted hot, and its pages filled
 *              from a RocksDB snapshot without the lock.
 *   kill       a doc becomes DEAD, leaves the indexes, and gives back at once what nothing
 *              holds; lkv__settle gives back the rest when the last pin or reference goes.
 *   writer     one thread takes committed write-back docs off the FIFO queue, admits them to
 *              the cold policy, copies them into a batch (pinned hot for the copy only) and
 *              writes it without the lock; a full disk puts the doc back in the queue (retried
 *              every 200 ms, counted); the backlog's bytes and the puts waiting for room
 *              (lkv_store_put_wait) are settled as each doc is done.
 * Policy callbacks run inside lkv_policy_admit, under the lock: they may kill cold-only docs
 * but never release a hot doc's policy entry themselves (the policy drops its victim).
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lkv_store_int.h"

static void hot_evict_cb(void *ctx, uint64_t id, uint64_t bytes);
static void cold_meta(const doc *d, lkv_cold_doc *meta);
static void cold_evict_cb(void *ctx, uint64_t id, uint64_t bytes);

/* ---- pins (counted here only; the policy sees pinned / not pinned) ------------------------ */

void lkv__hot_pin(lkv_store *s, doc *d)
{
    if (d->hot_pins++ == 0) {
        MUST_OK(lkv_policy_pin(lkv__hotp(s, d), d->pid));
    }
}

void lkv__hot_unpin(lkv_store *s, doc *d)
{
    assert(d->hot_pins > 0);
    if (--d->hot_pins == 0) {
        MUST_OK(lkv_policy_unpin(lkv__hotp(s, d), d->pid));
    }
}

void lkv__cold_pin(lkv_store *s, doc *d)
{
    if (d->cold_pins++ == 0) {
        MUST_OK(lkv_policy_pin(s->coldp, d->pid));
    }
}

void lkv__cold_unpin(lkv_store *s, doc *d)
{
    assert(d->cold_pins > 0);
    if (--d->cold_pins == 0) {
        MUST_OK(lkv_policy_unpin(s->coldp, d->pid));
    }
}

/* Moves d's policy entry from id from to id to, keeping its size, cost, pinned state and
 * residency attributes (the entry's recency and frequency restart, as for a new admit). */
static void policy_move(lkv_store *s, lkv_policy *p, doc *d, uint64_t from, uint64_t to,
                        uint64_t bytes, int pinned)
{
    lkv_policy_attrs a = lkv__attrs(s, d);
    MUST_OK(lkv_policy_remove(p, from));
    MUST_OK(lkv_policy_admit_ex(p, to, bytes, lkv__cost(s, bytes), &a, NULL, NULL));
    if (pinned) {
        MUST_OK(lkv_policy_pin(p, to));
    }
}

void lkv__rekey(lkv_store *s, doc *d, uint64_t pid)
{
    if (d->pid == pid) {
        return;
    }
    if (d->hot) {
        policy_move(s, lkv__hotp(s, d), d, d->pid, pid, lkv__hot_bytes(s, d), d->hot_pins > 0);
    }
    if (d->cold) {
        policy_move(s, s->coldp, d, d->pid, pid, lkv__cold_bytes(d), d->cold_pins > 0);
    }
    d->pid = pid;
    if (d->hot) {
        lkv__hold_apply(s, lkv__hotp(s, d), d);
    }
    if (d->cold) {
        lkv__hold_apply(s, s->coldp, d);
    }
}

/* Admits d (not hot) to the hot tier, evicting victims, and takes its pages. The caller pins. */
int lkv__hot_admit(lkv_store *s, doc *d)
{
    uint64_t b = lkv__hot_bytes(s, d);
    lkv_policy_attrs a = lkv__attrs(s, d);
    int rc = lkv_policy_admit_ex(lkv__hotp(s, d), d->pid, b, lkv__cost(s, b), &a, hot_evict_cb, s);
    if (rc == LKV_EEXIST) {
        LKV_LOGE("store: policy id collision (pid %llx)", (unsigned long long)d->pid);
        return LKV_EINTERNAL;
    }
    if (rc != 0) {
        return rc;
    }
    if (d->pages == NULL) {
        d->pages = lkv_xmalloc(sizeof(uint32_t) * d->n_blocks);
    }
    MUST_OK(lkv_arena_alloc(s->arena, d->profile, d->n_blocks, d->pages)); /* Budget = region. */
    d->hot = 1;
    lkv__hold_apply(s, lkv__hotp(s, d), d);
    lkv__acct_sync(s, d);
    lkv__sizes_sync(s, d);
    return 0;
}

/* Drops d from the hot tier (not from inside a hot eviction callback). */
static void hot_release(lkv_store *s, doc *d)
{
    assert(d->hot && d->hot_pins == 0);
    MUST_OK(lkv_policy_remove(lkv__hotp(s, d), d->pid));
    lkv_arena_free(s->arena, d->profile, d->n_blocks, d->pages);
    d->hot = 0;
    lkv__acct_sync(s, d);
    lkv__sizes_sync(s, d);
    free(d->tokens);
    d->tokens = NULL;
}

/* Builds d's finished write batch from its hot pages into *out. d must be hot and pinned (or
 * the lock held). scratch: one page of host memory when the arena is not host-mapped. */
static int build_doc(lkv_store *s, doc *d, uint8_t *scratch, lkv_cold_batch **out)
{
    lkv_cold_batch *b = lkv_cold_batch_create();
    *out = NULL;
    for (uint32_t i = 0; i < d->n_blocks; i++) {
        const void *p = lkv_arena_host_ptr(s->arena, d->profile, d->pages[i]);
        if (p == NULL) {
            int rc = lkv_arena_read(s->arena, d->profile, d->pages[i], scratch, d->block_bytes);
            if (rc != 0) {
                lkv_cold_batch_free(b);
                return rc;
            }
            p = scratch;
        }
        lkv_cold_batch_block(b, &d->key, i, p, d->block_bytes);
    }
    lkv_cold_doc meta;
    cold_meta(d, &meta);
    lkv_cold_batch_finish(b, &meta, d->tokens);
    *out = b;
    return 0;
}

/* Builds d's write batch and writes it (d hot and pinned; no lock). */
static int write_doc(lkv_store *s, doc *d, int sync, uint8_t *scratch)
{
    lkv_cold_batch *b;
    int rc = build_doc(s, d, scratch, &b);
    return rc != 0 ? rc : lkv_cold_batch_write(s->cold, b, sync);
}

/* Admits d to the cold policy (evicting cold victims) and sets d->cold. */
int lkv__cold_admit(lkv_store *s, doc *d)
{
    uint64_t b = lkv__cold_bytes(d);
    assert(!d->cold);
    lkv_policy_attrs a = lkv__attrs(s, d);
    int rc = lkv_policy_admit_ex(s->coldp, d->pid, b, lkv__cost(s, b), &a, cold_evict_cb, s);
    if (rc == LKV_EEXIST) {
        return LKV_EINTERNAL;
    }
    if (rc == 0) {
        d->cold = 1;
        lkv__hold_apply(s, s->coldp, d);
        lkv__acct_sync(s, d);
        lkv__sizes_sync(s, d);
    }
    return rc;
}

/* Undoes lkv__cold_admit after a failed write (d->cold_pins == 0). */
static void cold_unadmit(lkv_store *s, doc *d)
{
    assert(d->cold && d->cold_pins == 0);
    MUST_OK(lkv_policy_remove(s->coldp, d->pid));
    d->cold = 0;
    lkv__acct_sync(s, d);
    lkv__sizes_sync(s, d);
    /* A dead doc of the same key may have left its data for this one (see cold_drop): with
     * this write failed, nobody owns it. Best effort. */
    doc *owner = lkv__kidx_find(s, &d->key);
    if (owner == NULL || !owner->cold) {
        lkv_cold_delete(s->cold, &d->key, 0);
    }
}

/* Removes d from the cold tier: its RocksDB data and (unless called from the cold policy's
 * eviction callback) its cold policy entry. Deletes are synced only for a caller's delete in
 * write-through mode (sync): a lost eviction delete just brings a document back. */
static void cold_drop(lkv_store *s, doc *d, int from_cb, int sync)
{
    assert(d->cold && d->cold_pins == 0);
    /* A dead doc's data may be dropped late (after its last reader or write). If a newer doc
     * of the same key is in the cold tier meanwhile, the RocksDB data under the key is that
     * doc's now (same key, same content): keep it. */
    doc *owner = lkv__kidx_find(s, &d->key);
    if (owner == NULL || owner == d || !owner->cold) {
        int rc = lkv_cold_delete(s->cold, &d->key, sync);
        if (rc != 0) {
            LKV_LOGW("store: deleting a document from RocksDB failed: %s", lkv_strerror(rc));
        }
    }
    if (!from_cb) {
        MUST_OK(lkv_policy_remove(s->coldp, d->pid));
    }
    d->cold = 0;
    lkv__acct_sync(s, d);
    lkv__sizes_sync(s, d);
}

/* Makes d invisible (DEAD) and remembers its key with cause. Releases at once what nothing
 * holds (sync: sync the RocksDB delete); the rest goes in lkv__settle(). Never called on a hot doc
 * from inside a hot eviction callback (only cold-only docs die there). */
void lkv__kill(lkv_store *s, doc *d, int cause, int sync)
{
    if (d->state == ST_DEAD) {
        return;
    }
    if (d->hot && d->hot_pins == 0 && !d->promoting) {
        hot_release(s, d);
    }
    if (d->cold && d->cold_pins == 0) {
        cold_drop(s, d, 0, sync);
    }
    if (d->indexed) {
        lkv__kidx_remove(s, d);
    }
    if (d->cindexed) {
        lkv__cidx_remove(s, d);
    }
    if (cause != LKV_MISS_NONE) {
        lkv__gone_add(s, &d->key, cause);
    }
    if (d->state == ST_VISIBLE && !d->cold && s->cfg.durability == LKV_DURABILITY_WRITE_BACK) {
        lkv_cold_unmark_pending(s->cold, &d->key); /* Never persisted, and not lost either. */
    }
    d->state = ST_DEAD;
    lkv__acct_sync(s, d);
    lkv__sizes_sync(s, d);
    /* Entries still held (pinned) in a policy move to a private id, so that a new document of
     * the same key can be admitted meanwhile. */
    lkv__rekey(s, d, STAGE_BIT | d->slot);
}

/* Releases what a DEAD doc no longer needs; frees it when nothing holds it. */
void lkv__settle(lkv_store *s, doc *d)
{
    if (d->state != ST_DEAD) {
        return;
    }
    if (d->hot && d->hot_pins == 0 && !d->promoting) {
        hot_release(s, d);
    }
    if (d->cold && d->cold_pins == 0) {
        cold_drop(s, d, 0, 0);
    }
    if (!d->hot && !d->cold && d->refs == 0 && !d->queued) {
        lkv__slot_free(s, d);
    }
}

void lkv__unref(lkv_store *s, doc *d)
{
    assert(d->refs > 0);
    d->refs--;
    lkv__settle(s, d);
}

/* Hot victim: demote to the cold tier if not there yet, then the policy drops it. The
 * demotion's batch is built here (a copy of the pages, under the lock, since the pages go at
 * once) and written by lkv__demote_flush after the lock is dropped; meanwhile the doc is cold
 * and cold_busy (readers wait, the cold policy cannot evict it: pinned). */
static void hot_evict_cb(void *ctx, uint64_t id, uint64_t bytes)
{
    lkv_store *s = ctx;
    doc *d = lkv__pid_find(s, id);
    (void)bytes;
    assert(d != NULL);
    assert(d->hot && d->hot_pins == 0);
    assert(d->state == ST_VISIBLE);
    s->st.evictions_hot++;
    if (!d->cold) {
        lkv_cold_batch *b = NULL;
        /* (Read-only after a full disk at open: no reopen attempt here, under the store lock;
         * the writer thread makes it.) */
        int rc = lkv_cold_readonly(s->cold) ? LKV_ENOSPC
                                            : lkv_cold_can_write(s->cold, lkv__cold_bytes(d));
        if (rc == 0) {
            rc = lkv__cold_admit(s, d);
        }
        if (rc == 0) {
            rc = build_doc(s, d, s->scratch, &b);
            if (rc != 0) {
                cold_unadmit(s, d);
            }
        }
        if (rc == 0) {
            demotion *m = lkv_xmalloc(sizeof *m);
            m->d = d;
            m->b = b;
            m->next = s->demotions;
            s->demotions = m;
            lkv__cold_pin(s, d);
            d->cold_busy = 1;
            lkv__sizes_sync(s, d);
            d->refs++;
        } else {
            s->st.drops++;
            LKV_LOGD("store: hot victim dropped (cold tier: %s)", lkv_strerror(rc));
        }
    }
    lkv_arena_free(s->arena, d->profile, d->n_blocks, d->pages);
    d->hot = 0;
    lkv__acct_sync(s, d);
    lkv__sizes_sync(s, d);
    free(d->tokens);
    d->tokens = NULL;
    if (!d->cold) {
        lkv__kill(s, d, LKV_MISS_EVICTED, 0);
        lkv__settle(s, d);
    }
}

/* Cold victim: delete its RocksDB data; a doc not also hot leaves the store. */
static void cold_evict_cb(void *ctx, uint64_t id, uint64_t bytes)
{
    lkv_store *s = ctx;
    doc *d = lkv__pid_find(s, id);
    (void)bytes;
    assert(d != NULL);
    assert(d->cold && d->cold_pins == 0);
    assert(d->state == ST_VISIBLE);
    s->st.evictions_cold++;
    cold_drop(s, d, 1, 0);
    if (!d->hot) {
        lkv__kill(s, d, LKV_MISS_EVICTED, 0);
        lkv__settle(s, d);
    }
}

/* ---- promotion and demotion ----------------------------------------------------------------- */

void lkv__corrupt(lkv_store *s, doc *d)
{
    s->st.corrupt_blocks++;
    if (d->state == ST_VISIBLE) {
        LKV_LOGW("store: dropping a document with a corrupt block");
        lkv__kill(s, d, LKV_MISS_CORRUPT, 0);
        lkv__settle(s, d);
    }
}

/* Fills a promoting doc's pages from RocksDB (no lock; d is pinned and referenced). */
static int promote_read(lkv_store *s, doc *d, lkv_cold_snap *snap, uint32_t **tokens)
{
    lkv_cold_doc meta;
    int rc = lkv_cold_get_doc(s->cold, snap, &d->key, &meta, tokens);
    if (rc != 0) {
        return rc;
    }
    if (meta.n_blocks != d->n_blocks || meta.block_bytes != d->block_bytes ||
        meta.n_tokens != d->n_tokens) {
        return LKV_ECORRUPT;
    }
    uint8_t *scratch = NULL;
    for (uint32_t i = 0; i < d->n_blocks && rc == 0; i++) {
        void *p = lkv_arena_host_ptr(s->arena, d->profile, d->pages[i]);
        if (p == NULL) {
            if (scratch == NULL) {
                scratch = lkv_xmalloc(d->block_bytes);
            }
            rc = lkv_cold_get_block(s->cold, snap, &d->key, i, scratch, d->block_bytes);
            if (rc == 0) {
                rc = lkv_arena_write(s->arena, d->profile, d->pages[i], scratch, d->block_bytes);
            }
        } else {
            rc = lkv_cold_get_block(s->cold, snap, &d->key, i, p, d->block_bytes);
        }
    }
    free(scratch);
    return rc;
}

/* Finds key and takes a read reference: hot (pinned; promoting a cold doc if the budget
 * allows, or must_hot) or cold (a snapshot). Fills rd. */

/* Promotion: see lkv_store_int.h. */
int lkv__promote(lkv_store *s, doc *d, int must_hot)
{
    uint64_t hb = lkv__hot_bytes(s, d);
    int rc = LKV_ENOSPC;
    assert(d->cold && !d->hot && !d->promoting && d->state == ST_VISIBLE);
    if (hb <= lkv_policy_budget(lkv__hotp(s, d)) &&
        (must_hot || lkv_policy_would_admit(lkv__hotp(s, d), d->pid, hb, lkv__cost(s, hb)))) {
        /* Pinned in the cold tier first, so that demotions making room cannot evict it. */
        lkv__cold_pin(s, d);
        rc = lkv__hot_admit(s, d);
        if (rc != 0) {
            lkv__cold_unpin(s, d);
        }
    }
    if (rc != 0) {
        assert(rc != LKV_ENOTFOUND);
        lkv__demote_flush(s);
        return rc;
    }
    lkv__hot_pin(s, d);
    d->promoting = 1;
    lkv__sizes_sync(s, d);
    /* The snapshot first, while d is certainly visible with its data (once the lock drops, a
     * delete and a new document of the same key may come and go). */
    lkv_cold_snap *snap = lkv_cold_snap_create(s->cold);
    lkv__demote_flush(s); /* The victims that made room, written without the lock. */
    pthread_mutex_unlock(&s->mu);

    uint32_t *tokens = NULL;
    rc = promote_read(s, d, snap, &tokens);

    pthread_mutex_lock(&s->mu);
    lkv_cold_snap_release(s->cold, snap);
    d->promoting = 0;
    lkv__sizes_sync(s, d);
    lkv__cold_unpin(s, d);
    lkv__settle(s, d); /* If it was deleted meanwhile, its RocksDB data can go now. */
    pthread_cond_broadcast(&s->cv);
    if (rc != 0) {
        free(tokens);
        int corrupt = rc == LKV_ECORRUPT || rc == LKV_ENOTFOUND;
        if (corrupt) {
            /* A missing record or block of a visible document is lost data: counted as such. */
            lkv__corrupt(s, d);
        } else if (d->state == ST_VISIBLE) {
            LKV_LOGW("store: promotion failed: %s; dropping the document", lkv_strerror(rc));
            lkv__kill(s, d, LKV_MISS_DELETED, 0);
        }
        lkv__hot_unpin(s, d); /* The caller's unref then releases pages, data and slot. */
        return corrupt ? LKV_ECORRUPT : LKV_ENOTFOUND;
    }
    /* A promoted doc stays persisted (it was pinned cold), unless it died meanwhile. */
    assert(d->state != ST_VISIBLE || d->cold);
    free(d->tokens);
    d->tokens = tokens;
    s->st.promotions++;
    return 0;
}

void lkv__demote_flush(lkv_store *s)
{
    while (s->demotions != NULL) {
        demotion *list = s->demotions;
        s->demotions = NULL;
        pthread_mutex_unlock(&s->mu);
        for (demotion *m = list; m != NULL; m = m->next) {
            m->rc = lkv_cold_batch_write(s->cold, m->b, 0);
        }
        pthread_mutex_lock(&s->mu);
        while (list != NULL) {
            demotion *m = list;
            doc *d = m->d;
            list = m->next;
            lkv__cold_unpin(s, d);
            d->cold_busy = 0;
            lkv__sizes_sync(s, d);
            if (m->rc == 0) {
                s->st.demotions++;
            } else {
                s->st.drops++;
                LKV_LOGD("store: hot victim dropped (cold tier: %s)", lkv_strerror(m->rc));
                cold_unadmit(s, d);
                if (!d->hot) {
                    lkv__kill(s, d, LKV_MISS_EVICTED, 0);
                }
            }
            lkv__unref(s, d);
            free(m);
        }
        pthread_cond_broadcast(&s->cv);
    }
}

void lkv__demote(lkv_store *s, doc *d)
{
    assert(d->hot && d->hot_pins == 0 && !d->promoting && d->state == ST_VISIBLE);
    /* The eviction callback does the work (it may free d); then the policy entry goes. */
    uint64_t pid = d->pid;
    lkv_policy *hotp = lkv__hotp(s, d);
    hot_evict_cb(s, pid, lkv__hot_bytes(s, d));
    MUST_OK(lkv_policy_remove(hotp, pid));
}

/* ---- cold writes ---------------------------------------------------------------------------- */

/* Around a caller's synchronous cold write of d (admitted cold, lock held): pins it cold and
 * marks it busy, then drops the lock for the I/O; cold_io_end retakes it, unpins, and undoes
 * the admission if the write failed (rc), returning rc. */
static void cold_io_begin(lkv_store *s, doc *d)
{
    lkv__cold_pin(s, d);
    d->cold_busy = 1;
    lkv__sizes_sync(s, d);
    pthread_mutex_unlock(&s->mu);
}

static int cold_io_end(lkv_store *s, doc *d, int rc)
{
    pthread_mutex_lock(&s->mu);
    lkv__cold_unpin(s, d);
    d->cold_busy = 0;
    lkv__sizes_sync(s, d);
    if (rc != 0) {
        cold_unadmit(s, d);
    }
    return rc;
}

int lkv__write_through(lkv_store *s, doc *d)
{
    int rc = lkv__cold_admit(s, d);
    if (rc != 0) {
        return rc;
    }
    cold_io_begin(s, d);
    uint8_t *scratch = s->scratch ? lkv_xmalloc(s->page_bytes) : NULL;
    rc = write_doc(s, d, 1, scratch);
    free(scratch);
    return cold_io_end(s, d, rc);
}

/* d's cold record (the document's metadata). */
static void cold_meta(const doc *d, lkv_cold_doc *meta)
{
    memset(meta, 0, sizeof *meta);
    meta->key = d->key;
    memcpy(meta->fingerprint, d->fp, 32);
    meta->content_hash = d->content_hash;
    meta->n_tokens = d->n_tokens;
    meta->n_blocks = d->n_blocks;
    meta->block_bytes = (uint32_t)d->block_bytes;
    meta->created_ms = d->created_ms;
    meta->tenant = d->tenant;
    meta->prio = d->prio;
    meta->expires_ms = d->expires_ms;
}

int lkv__cold_write_staged(lkv_store *s, doc *d, lkv_cold_batch *b, int sync)
{
    assert(!d->hot && !d->cold);
    lkv_cold_doc meta;
    cold_meta(d, &meta);
    lkv_cold_batch_finish(b, &meta, d->tokens);
    int rc = lkv_cold_readonly(s->cold) ? LKV_ENOSPC : lkv__cold_admit(s, d);
    if (rc != 0) {
        lkv_cold_batch_free(b);
        return rc;
    }
    cold_io_begin(s, d);
    rc = lkv_cold_batch_write(s->cold, b, sync);
    return cold_io_end(s, d, rc);
}

void lkv__wb_enqueue(lkv_store *s, doc *d)
{
    assert(!d->queued);
    d->queued = 1;
    d->refs++;
    if (s->q_tail == NIL) {
        s->q_head = d->slot;
    } else {
        s->slots[s->q_tail]->qnext = d->slot;
    }
    s->q_tail = d->slot;
    s->st.wb_pending++;
    s->wb_backlog += lkv__cold_bytes(d);
    pthread_cond_signal(&s->wcv);
}

/* Puts d (dequeued, still referenced) back at the queue's tail. */
static void wb_requeue(lkv_store *s, doc *d)
{
    d->queued = 1;
    d->qnext = NIL;
    if (s->q_tail == NIL) {
        s->q_head = d->slot;
    } else {
        s->slots[s->q_tail]->qnext = d->slot;
    }
    s->q_tail = d->slot;
}

wb_waiter *lkv__wb_take_waiters(lkv_store *s)
{
    uint64_t bound = s->cfg.wb_max_backlog_bytes;
    if (s->waiters == NULL || (bound != 0 && s->wb_backlog >= bound)) {
        return NULL;
    }
    wb_waiter *w = s->waiters;
    s->waiters = s->waiters_tail = NULL;
    return w;
}

void lkv__wb_call(wb_waiter *w)
{
    while (w != NULL) {
        wb_waiter *n = w->next;
        w->fn(w->blob);
        free(w);
        w = n;
    }
}

/* One write-back document is done (persisted, failed or skipped): its bytes leave the backlog
 * and waiting puts get room (called with the lock, which this drops and retakes). */
static void wb_done(lkv_store *s, doc *d)
{
    uint64_t b = lkv__cold_bytes(d);
    s->wb_backlog -= b <= s->wb_backlog ? b : s->wb_backlog;
    s->st.wb_pending--;
    wb_waiter *w = lkv__wb_take_waiters(s);
    if (w != NULL) {
        pthread_mutex_unlock(&s->mu);
        lkv__wb_call(w);
        pthread_mutex_lock(&s->mu);
    }
}

/* ---- write-back writer ---------------------------------------------------------------------- */

/* wb_no_wal: documents written without the WAL, waiting for the writer's flush (writer-owned;
 * each keeps its cold pin, cold_busy, its backlog bytes and its queue reference meanwhile). */
typedef struct unflushed {
    doc **d;
    size_t n, cap;
    uint64_t bytes;
} unflushed;

/* The disk is full: counts a write-back retry, marks the writer stalled (the backlog bound holds
 * new puts back), wakes the waiters, and sleeps 200 ms on wcv (s->mu held; dropped meanwhile). */
static void disk_full_pause(lkv_store *s)
{
    s->st.wb_retries++;
    s->wb_stalled = 1;
    pthread_cond_broadcast(&s->cv);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->wcv, &s->mu, &ts);
}

/* Flushes the memtables (lock dropped meanwhile) and settles every unflushed document: persisted
 * (rc 0) or failed like a failed write. A full disk keeps them for a retry after a pause. */
static void flush_unflushed(lkv_store *s, unflushed *u)
{
    s->writer_busy = 1;
    pthread_mutex_unlock(&s->mu);
    int rc = lkv_cold_flush(s->cold);
    pthread_mutex_lock(&s->mu);
    s->writer_busy = 0;
    if (rc == LKV_ENOSPC && !s->stopping) {
        disk_full_pause(s);
        return;
    }
    if (rc != 0) {
        LKV_LOGW("store: write-back flush failed: %s", lkv_strerror(rc));
    } else {
        s->wb_stalled = 0;
    }
    size_t n = u->n;
    u->n = 0;
    u->bytes = 0;
    s->n_unflushed = 0;
    s->flush_now = 0;
    for (size_t i = 0; i < n; i++) {
        doc *d = u->d[i];
        lkv__cold_unpin(s, d);
        d->cold_busy = 0;
        lkv__sizes_sync(s, d);
        if (rc == 0) {
            s->st.wb_persisted++;
        } else {
            cold_unadmit(s, d);
            s->st.wb_failed++;
            if (!d->hot && d->state == ST_VISIBLE) {
                s->st.drops++;
                lkv__kill(s, d, LKV_MISS_EVICTED, 0);
            }
        }
        wb_done(s, d);
        lkv__unref(s, d);
    }
    pthread_cond_broadcast(&s->cv);
}

/* The writer thread: see the file comment. */
static void *writer_main(void *arg)
{
    lkv_store *s = arg;
    uint8_t *scratch = s->scratch ? lkv_xmalloc(s->page_bytes) : NULL;
    unflushed u = {NULL, 0, 0, 0};
    uint64_t flush_at = s->cfg.wb_max_backlog_bytes ? s->cfg.wb_max_backlog_bytes / 2 : 64u << 20;

    pthread_mutex_lock(&s->mu);
    for (;;) {
        int lingered = 0;
        while (s->q_head == NIL && !s->stopping) {
            if (u.n == 0) {
                pthread_cond_wait(&s->wcv, &s->mu);
                continue;
            }
            if (!lingered && !s->flush_now) {
                /* Nothing queued: flush soon, but let a burst of puts share the flush. */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 20 * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                    ts.tv_sec++;
                    ts.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&s->wcv, &s->mu, &ts);
                lingered = 1;
                continue;
            }
            flush_unflushed(s, &u);
            lingered = 0;
        }
        if (s->q_head == NIL) {
            if (u.n > 0) {
                flush_unflushed(s, &u); /* Closing: settles all (a full disk fails them). */
            }
            break;
        }
        doc *d = s->slots[s->q_head];
        s->q_head = d->qnext;
        if (s->q_head == NIL) {
            s->q_tail = NIL;
        }
        d->qnext = NIL;
        d->queued = 0;
        if (d->state != ST_VISIBLE || !d->hot || d->cold || d->cold_busy) {
            wb_done(s, d);
            lkv__unref(s, d);
            pthread_cond_broadcast(&s->cv);
            continue;
        }
        int rc = lkv__cold_admit(s, d);
        if (rc != 0) {
            s->st.wb_failed++;
            s->st.wb_cold_declined += rc == LKV_ENOSPC; /* The cold policy's decision. */
            LKV_LOGW("store: write-back skipped a document: cold tier %s", lkv_strerror(rc));
            wb_done(s, d);
            lkv__unref(s, d);
            pthread_cond_broadcast(&s->cv);
            continue;
        }
        /* Pinned hot only while its pages are copied into the batch (s->wbuild: callers
         * that need the room or the doc wait for that copy, never for the write); pinned cold
         * and cold_busy until the write is done. */
        lkv__cold_pin(s, d);
        d->cold_busy = 1;
        lkv__sizes_sync(s, d);
        lkv__hot_pin(s, d);
        s->writer_busy = 1;
        s->wbuild = d;
        pthread_mutex_unlock(&s->mu);

        lkv_cold_batch *b = NULL;
        rc = lkv_cold_can_write(s->cold, lkv__cold_bytes(d));
        if (rc == 0) {
            rc = build_doc(s, d, scratch, &b);
        }

        pthread_mutex_lock(&s->mu);
        s->wbuild = NULL;
        lkv__hot_unpin(s, d);
        lkv__settle(s, d); /* Deleted meanwhile: its pages go now (the queue's ref keeps d). */
        pthread_cond_broadcast(&s->cv);
        int skipped = 0;
        if (rc == 0 && d->state != ST_VISIBLE) {
            lkv_cold_batch_free(b); /* Deleted while copied: nothing to persist. */
            skipped = 1;
        } else if (rc == 0) {
            pthread_mutex_unlock(&s->mu);
            rc = lkv_cold_batch_write(s->cold, b, s->cfg.wb_no_wal ? LKV_COLD_NO_WAL : 0);
            pthread_mutex_lock(&s->mu);
            if (rc == 0 && s->cfg.wb_no_wal) {
                /* In the memtable only: persisted once flushed. Keeps its pins until then. */
                s->writer_busy = 0;
                if (u.n == u.cap) {
                    u.cap = u.cap ? 2 * u.cap : 64;
                    u.d = lkv_xrealloc(u.d, u.cap * sizeof(*u.d));
                }
                u.d[u.n++] = d;
                u.bytes += lkv__cold_bytes(d);
                s->n_unflushed++;
                if (u.bytes >= flush_at || s->flush_now) {
                    flush_unflushed(s, &u);
                }
                pthread_cond_broadcast(&s->cv);
                continue;
            }
        }
        s->writer_busy = 0;
        lkv__cold_unpin(s, d);
        d->cold_busy = 0;
        lkv__sizes_sync(s, d);
        if (skipped) {
            cold_unadmit(s, d);
            wb_done(s, d);
            lkv__unref(s, d);
            pthread_cond_broadcast(&s->cv);
            continue;
        }
        if (rc == LKV_ENOSPC && !s->stopping && d->hot && d->state == ST_VISIBLE) {
            /* The disk is full: the document stays hot and queued, and is tried again after a
             * pause (the backlog bound holds new puts back meanwhile). */
            cold_unadmit(s, d);
            wb_requeue(s, d);
            disk_full_pause(s);
            continue;
        }
        if (rc != 0) {
            cold_unadmit(s, d);
            s->st.wb_failed++;
            LKV_LOGW("store: write-back of a document failed: %s", lkv_strerror(rc));
            if (!d->hot && d->state == ST_VISIBLE) {
                /* Evicted from the hot tier while being written: nothing holds it now. */
                s->st.drops++;
                lkv__kill(s, d, LKV_MISS_EVICTED, 0);
            }
        } else {
            s->st.wb_persisted++;
            s->wb_stalled = 0;
        }
        wb_done(s, d);
        lkv__unref(s, d);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    free(u.d);
    free(scratch);
    return NULL;
}

void lkv__writer_start(lkv_store *s)
{
    if (pthread_create(&s->writer, NULL, writer_main, s) != 0) {
        lkv_panic("store: cannot start the writer thread");
    }
    s->writer_started = 1;
}

void lkv__writer_stop(lkv_store *s)
{
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->wcv);
    pthread_mutex_unlock(&s->mu);
    if (s->writer_started) {
        pthread_join(s->writer, NULL);
        s->writer_started = 0;
    }
}
