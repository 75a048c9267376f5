/*
 * lkv_stage.c: the Get staging ring (see lkv_stage.h).
 *
 * State under mu: the free stack (LIFO: the slot used last is warm in cache and TLB), the
 * per-slot held flag (a double release is caught), the FIFO of waiters, the counters. A release
 * with a waiter queued moves the slot to that waiter without it ever being free, so a stream of
 * new acquirers cannot overtake a waiter. The timer thread (wait_ms > 0) sleeps until the head
 * waiter is due (waiters are queued in due order: one wait_ms for all) and grants it NULL.
 */
#include "lkv_stage.h"

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lkv_err.h"
#include "lkv_log.h"

#ifdef LKV_HAVE_CUDA
#include "cuda/lkv_arena_cuda.h"
#endif

#define STAGE_ALIGN 4096u
#define MAX_SLOTS   65536u

struct lkv_stage_slot {
    lkv_stage *ring;
    void *ptr;
    uint32_t index;
    int held; /* Under ring->mu. */
};

enum {
    ST_SLOTS,
    ST_SLOT_BYTES,
    ST_IN_USE,
    ST_ACQUIRED,
    ST_WAITED,
    ST_TIMED_OUT,
    ST_BYPASSED,
    N_ST
};

struct lkv_stage {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* Timer: a waiter was queued, or stop. */
    uint64_t slot_bytes;
    uint32_t n_slots;
    int mem;
    uint64_t wait_ns;
    void *base;
    lkv_stage_slot *slots;
    uint32_t *free_stack;
    uint32_t n_free;
    lkv_stage_waiter *head, *tail;
    lkv_stage_counts c;
    int starved; /* A wait ran out and no slot came back since: acquires bypass at once. */
    int stop;
    int have_timer;
    pthread_t timer;
    lkv_stats *stats;
    lkv_stat_group *group;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void stats_read(void *ctx, double *v, int n)
{
    lkv_stage *r = ctx;
    lkv_stage_counts c;
    lkv_stage_counts_get(r, &c);
    (void)n;
    v[ST_SLOTS] = (double)r->n_slots;
    v[ST_SLOT_BYTES] = (double)r->slot_bytes;
    v[ST_IN_USE] = (double)c.in_use;
    v[ST_ACQUIRED] = (double)c.acquired;
    v[ST_WAITED] = (double)c.waited;
    v[ST_TIMED_OUT] = (double)c.timed_out;
    v[ST_BYPASSED] = (double)c.bypassed;
}

static int stats_register(lkv_stage *r)
{
    static const lkv_stat_desc d[N_ST] = {
        {"lkv_get_stage_slots", NULL, LKV_STAT_GAUGE, "slots", "Get staging ring: slots",
         "get_stage", "slots"},
        {"lkv_get_stage_slot_bytes", NULL, LKV_STAT_GAUGE, "bytes",
         "Get staging ring: bytes of one slot", "get_stage", "slot_bytes"},
        {"lkv_get_stage_in_use", NULL, LKV_STAT_GAUGE, "slots",
         "Get staging ring: slots held now (being filled or owned by gRPC)", "get_stage", "in_use"},
        {"lkv_get_stage_acquired", NULL, LKV_STAT_COUNTER, "slots",
         "Get staging ring: slots handed out", "get_stage", "acquired"},
        {"lkv_get_stage_waited", NULL, LKV_STAT_COUNTER, "calls",
         "Get staging ring: messages that waited for a slot (ring full)", "get_stage", "waited"},
        {"lkv_get_stage_timed_out", NULL, LKV_STAT_COUNTER, "calls",
         "Get staging ring: waits that ran out (message sent by the copying path)", "get_stage",
         "timed_out"},
        {"lkv_get_stage_bypassed", NULL, LKV_STAT_COUNTER, "calls",
         "Get staging ring: messages sent by the copying path at once (ring starved)", "get_stage",
         "bypassed"},
    };
    return lkv_stats_register(r->stats, d, N_ST, stats_read, r, &r->group);
}

/* Pops the head waiter (mu held). */
static lkv_stage_waiter *pop_head(lkv_stage *r)
{
    lkv_stage_waiter *w = r->head;
    if (w == NULL) {
        return NULL;
    }
    r->head = w->next;
    if (r->head != NULL) {
        r->head->prev = NULL;
    } else {
        r->tail = NULL;
    }
    w->next = w->prev = NULL;
    w->queued = 0;
    r->c.queued--;
    return w;
}

static void *timer_main(void *arg)
{
    lkv_stage *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        if (r->head == NULL) {
            pthread_cond_wait(&r->cv, &r->mu);
            continue;
        }
        uint64_t due = r->head->due_ns;
        uint64_t t = now_ns();
        if (t < due) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t at = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (due - t);
            ts.tv_sec = (time_t)(at / 1000000000ull);
            ts.tv_nsec = (long)(at % 1000000000ull);
            pthread_cond_timedwait(&r->cv, &r->mu, &ts);
            continue;
        }
        /* The head ran out: nothing came back for wait_ms, so the ring is held by readers that
         * do not read. Every waiter behind it is granted NULL now too, and new acquires bypass
         * the ring until a slot comes back (starved). */
        r->starved = 1;
        while (r->head != NULL) {
            lkv_stage_waiter *w = pop_head(r);
            lkv_stage_grant_fn fn = w->fn;
            void *ctx = w->ctx;
            uint64_t tag = w->tag;
            r->c.timed_out++;
            pthread_mutex_unlock(&r->mu); /* w may be freed from here on: only copies count. */
            fn(ctx, tag, NULL);
            pthread_mutex_lock(&r->mu);
        }
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void mem_free(int mem, void *p)
{
    if (p == NULL) {
        return;
    }
#ifdef LKV_HAVE_CUDA
    if (mem == LKV_STAGE_MEM_PINNED) {
        lkv__cuda_host_free(p);
        return;
    }
#endif
    (void)mem;
    free(p);
}

int lkv_stage_create(uint64_t slot_bytes, uint32_t n_slots, int mem, uint64_t wait_ms,
                     lkv_stats *stats, lkv_stage **out)
{
    *out = NULL;
    if (slot_bytes == 0 || slot_bytes > (1ull << 30) || n_slots == 0 || n_slots > MAX_SLOTS ||
        (mem != LKV_STAGE_MEM_HOST && mem != LKV_STAGE_MEM_PINNED) || wait_ms > 86400000ull) {
        return LKV_EINVAL;
    }
    slot_bytes = (slot_bytes + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
    size_t total = (size_t)slot_bytes * n_slots;
    void *base = NULL;
    if (mem == LKV_STAGE_MEM_PINNED) {
#ifdef LKV_HAVE_CUDA
        int rc = lkv__cuda_host_alloc(total, &base);
        if (rc != 0) {
            return rc;
        }
#else
        LKV_LOGE("stage: pinned memory requested but lazykv was built without CUDA");
        return LKV_ENOTSUP;
#endif
    } else {
        base = aligned_alloc(STAGE_ALIGN, total);
        if (base == NULL) {
            return LKV_ENOMEM;
        }
    }
    lkv_stage *r = calloc(1, sizeof(*r));
    lkv_stage_slot *slots = calloc(n_slots, sizeof(*slots));
    uint32_t *fs = calloc(n_slots, sizeof(*fs));
    if (r == NULL || slots == NULL || fs == NULL) {
        free(r);
        free(slots);
        free(fs);
        mem_free(mem, base);
        return LKV_ENOMEM;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    r->slot_bytes = slot_bytes;
    r->n_slots = n_slots;
    r->mem = mem;
    r->wait_ns = wait_ms * 1000000ull;
    r->base = base;
    r->slots = slots;
    r->free_stack = fs;
    for (uint32_t i = 0; i < n_slots; i++) {
        slots[i].ring = r;
        slots[i].ptr = (uint8_t *)base + (size_t)i * slot_bytes;
        slots[i].index = i;
        fs[i] = n_slots - 1 - i; /* Slot 0 on top. */
    }
    r->n_free = n_slots;
    r->stats = stats;
    if (stats != NULL) {
        int rc = stats_register(r);
        if (rc != 0) {
            r->stats = NULL;
            lkv_stage_destroy(r);
            return rc;
        }
    }
    if (wait_ms > 0) {
        if (pthread_create(&r->timer, NULL, timer_main, r) != 0) {
            lkv_stage_destroy(r);
            return LKV_ENOMEM;
        }
        r->have_timer = 1;
    }
    *out = r;
    return 0;
}

void lkv_stage_destroy(lkv_stage *r)
{
    if (r == NULL) {
        return;
    }
    if (r->have_timer) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->timer, NULL);
    }
    if (r->stats != NULL) {
        lkv_stats_unregister(r->stats, r->group);
    }
    assert(r->head == NULL);
    if (r->n_free != r->n_slots) {
        /* A late release still needs the ring: leave all of it. */
        LKV_LOGW("stage: %u of %u slots still held at destroy: the ring is left allocated",
                 r->n_slots - r->n_free, r->n_slots);
        return;
    }
    mem_free(r->mem, r->base);
    free(r->slots);
    free(r->free_stack);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Takes the top free slot (mu held, n_free > 0). */
static lkv_stage_slot *take_locked(lkv_stage *r)
{
    lkv_stage_slot *s = &r->slots[r->free_stack[--r->n_free]];
    assert(!s->held);
    s->held = 1;
    r->c.in_use++;
    if (r->c.in_use > r->c.max_in_use) {
        r->c.max_in_use = r->c.in_use;
    }
    r->c.acquired++;
    return s;
}

lkv_stage_slot *lkv_stage_try_acquire(lkv_stage *r)
{
    lkv_stage_slot *s = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->n_free > 0) {
        s = take_locked(r);
    }
    pthread_mutex_unlock(&r->mu);
    return s;
}

int lkv_stage_acquire(lkv_stage *r, lkv_stage_waiter *w, lkv_stage_grant_fn fn, void *ctx,
                      uint64_t tag, lkv_stage_slot **out)
{
    *out = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->n_free > 0) {
        *out = take_locked(r);
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    if (r->starved) {
        r->c.bypassed++;
        pthread_mutex_unlock(&r->mu);
        return LKV_EBUSY;
    }
    assert(!w->queued);
    w->fn = fn;
    w->ctx = ctx;
    w->tag = tag;
    w->due_ns = r->wait_ns > 0 ? now_ns() + r->wait_ns : 0;
    w->next = NULL;
    w->prev = r->tail;
    if (r->tail != NULL) {
        r->tail->next = w;
    } else {
        r->head = w;
    }
    r->tail = w;
    w->queued = 1;
    r->c.queued++;
    r->c.waited++;
    if (r->have_timer && r->head == w) {
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return LKV_EAGAIN;
}

int lkv_stage_cancel(lkv_stage *r, lkv_stage_waiter *w)
{
    int was = 0;
    pthread_mutex_lock(&r->mu);
    if (w->queued) {
        if (w->prev != NULL) {
            w->prev->next = w->next;
        } else {
            r->head = w->next;
        }
        if (w->next != NULL) {
            w->next->prev = w->prev;
        } else {
            r->tail = w->prev;
        }
        w->next = w->prev = NULL;
        w->queued = 0;
        r->c.queued--;
        was = 1;
    }
    pthread_mutex_unlock(&r->mu);
    return was;
}

void lkv_stage_release(lkv_stage_slot *s)
{
    lkv_stage *r = s->ring;
    pthread_mutex_lock(&r->mu);
    if (!s->held) {
        pthread_mutex_unlock(&r->mu);
        LKV_LOGE("stage: slot %u released twice (a bug)", s->index);
        abort();
    }
    r->starved = 0; /* The ring moves again. */
    lkv_stage_waiter *w = pop_head(r);
    if (w == NULL) {
        s->held = 0;
        r->c.in_use--;
        r->free_stack[r->n_free++] = s->index;
        pthread_mutex_unlock(&r->mu);
        return;
    }
    /* Straight to the waiter: the slot stays held, now by it. */
    lkv_stage_grant_fn fn = w->fn;
    void *ctx = w->ctx;
    uint64_t tag = w->tag;
    r->c.acquired++;
    pthread_mutex_unlock(&r->mu);
    fn(ctx, tag, s);
}

void lkv_stage_release_cb(void *slot)
{
    lkv_stage_release(slot);
}

void *lkv_stage_slot_ptr(const lkv_stage_slot *s)
{
    return s->ptr;
}

uint32_t lkv_stage_slot_index(const lkv_stage_slot *s)
{
    return s->index;
}

uint64_t lkv_stage_slot_bytes(const lkv_stage *r)
{
    return r->slot_bytes;
}

uint32_t lkv_stage_n_slots(const lkv_stage *r)
{
    return r->n_slots;
}

int lkv_stage_mem_kind(const lkv_stage *r)
{
    return r->mem;
}

void lkv_stage_counts_get(lkv_stage *r, lkv_stage_counts *out)
{
    pthread_mutex_lock(&r->mu);
    *out = r->c;
    pthread_mutex_unlock(&r->mu);
}
