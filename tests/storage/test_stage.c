/*
 * test_stage.c: storage/lkv_stage.c, the Get staging ring: slot accounting, FIFO hand-off to
 * waiters, cancel, the wait timer, re-entrant grants, the statistics, and a threaded run in
 * which slots are released on other threads (as gRPC's slice destroy does) while every slot's
 * bytes are checked for exclusive ownership (run under ASan and TSan by tests/run.sh).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "lkv_stage.h"
#include "lkv_stats.h"
#include "lkv_test.h"

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void test_accounting(void)
{
    lkv_stage *r;
    ASSERT_OK(lkv_stage_create(5000, 3, LKV_STAGE_MEM_HOST, 0, NULL, &r));
    ASSERT_EQ(lkv_stage_slot_bytes(r), 8192);
    ASSERT_EQ(lkv_stage_n_slots(r), 3);
    lkv_stage_slot *s[3];
    for (int i = 0; i < 3; i++) {
        s[i] = lkv_stage_try_acquire(r);
        ASSERT_TRUE(s[i] != NULL);
        ASSERT_EQ((uintptr_t)lkv_stage_slot_ptr(s[i]) % 4096, 0);
        memset(lkv_stage_slot_ptr(s[i]), 0xA0 + i, 8192); /* ASan: the whole slot is ours. */
    }
    ASSERT_TRUE(lkv_stage_try_acquire(r) == NULL);
    /* Three distinct, non-overlapping slots with distinct indices. */
    for (int i = 0; i < 3; i++) {
        for (int j = i + 1; j < 3; j++) {
            ASSERT_TRUE(lkv_stage_slot_index(s[i]) != lkv_stage_slot_index(s[j]));
            intptr_t d = (uint8_t *)lkv_stage_slot_ptr(s[i]) - (uint8_t *)lkv_stage_slot_ptr(s[j]);
            ASSERT_TRUE(d >= 8192 || d <= -8192);
        }
        ASSERT_EQ(((uint8_t *)lkv_stage_slot_ptr(s[i]))[8191], 0xA0 + i);
    }
    lkv_stage_counts c;
    lkv_stage_counts_get(r, &c);
    ASSERT_EQ(c.in_use, 3);
    ASSERT_EQ(c.acquired, 3);
    lkv_stage_release(s[1]);
    lkv_stage_slot *again = lkv_stage_try_acquire(r);
    ASSERT_TRUE(again == s[1]); /* LIFO: the slot used last. */
    lkv_stage_release(s[0]);
    lkv_stage_release(again);
    lkv_stage_release_cb(s[2]);
    lkv_stage_counts_get(r, &c);
    ASSERT_EQ(c.in_use, 0);
    ASSERT_EQ(c.max_in_use, 3);
    ASSERT_EQ(c.acquired, 4);
    ASSERT_EQ(c.waited, 0);
    lkv_stage_destroy(r);
}

static void test_bad_args(void)
{
    lkv_stage *r = (lkv_stage *)1;
    ASSERT_ERR(lkv_stage_create(0, 4, LKV_STAGE_MEM_HOST, 0, NULL, &r), LKV_EINVAL);
    ASSERT_TRUE(r == NULL);
    ASSERT_ERR(lkv_stage_create(4096, 0, LKV_STAGE_MEM_HOST, 0, NULL, &r), LKV_EINVAL);
    ASSERT_ERR(lkv_stage_create((1ull << 30) + 1, 1, LKV_STAGE_MEM_HOST, 0, NULL, &r), LKV_EINVAL);
    ASSERT_ERR(lkv_stage_create(4096, 65537, LKV_STAGE_MEM_HOST, 0, NULL, &r), LKV_EINVAL);
    ASSERT_ERR(lkv_stage_create(4096, 1, 7, 0, NULL, &r), LKV_EINVAL);
    /* Pinned: a CUDA build allocates it (even without a GPU the driver may refuse: ECUDA); a
     * build without CUDA says it is not supported. Never a silent heap fallback. */
    int rc = lkv_stage_create(4096, 2, LKV_STAGE_MEM_PINNED, 0, NULL, &r);
    ASSERT_TRUE(rc == 0 || rc == LKV_ENOTSUP || rc == LKV_ECUDA);
    if (rc == 0) {
        ASSERT_EQ(lkv_stage_mem_kind(r), LKV_STAGE_MEM_PINNED);
        lkv_stage_slot *s = lkv_stage_try_acquire(r);
        memset(lkv_stage_slot_ptr(s), 1, 4096);
        lkv_stage_release(s);
        lkv_stage_destroy(r);
    } else {
        ASSERT_TRUE(r == NULL);
    }
    lkv_stage_destroy(NULL);
}

/* A grant recorder: what each waiter got, in order. */
typedef struct grants {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    uint64_t tag[16];
    lkv_stage_slot *slot[16];
    int release_again; /* Release every granted slot at once (re-entrant grant). */
} grants;

static void on_grant(void *ctx, uint64_t tag, lkv_stage_slot *slot)
{
    grants *g = ctx;
    pthread_mutex_lock(&g->mu);
    g->tag[g->n] = tag;
    g->slot[g->n] = slot;
    g->n++;
    pthread_cond_broadcast(&g->cv);
    int again = g->release_again;
    pthread_mutex_unlock(&g->mu);
    if (again && slot != NULL) {
        lkv_stage_release(slot); /* May grant the next waiter from inside this grant. */
    }
}

static void grants_init(grants *g)
{
    memset(g, 0, sizeof(*g));
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
}

static void test_fifo_handoff_and_cancel(void)
{
    lkv_stage *r;
    ASSERT_OK(lkv_stage_create(4096, 2, LKV_STAGE_MEM_HOST, 0, NULL, &r));
    lkv_stage_slot *a, *b, *got;
    ASSERT_OK(lkv_stage_acquire(r, &(lkv_stage_waiter){0}, on_grant, NULL, 0, &a));
    ASSERT_OK(lkv_stage_acquire(r, &(lkv_stage_waiter){0}, on_grant, NULL, 0, &b));
    grants g;
    grants_init(&g);
    lkv_stage_waiter w[3];
    memset(w, 0, sizeof(w));
    for (int i = 0; i < 3; i++) {
        ASSERT_ERR(lkv_stage_acquire(r, &w[i], on_grant, &g, 100 + i, &got), LKV_EAGAIN);
        ASSERT_TRUE(got == NULL);
    }
    lkv_stage_counts c;
    lkv_stage_counts_get(r, &c);
    ASSERT_EQ(c.queued, 3);
    ASSERT_EQ(c.waited, 3);
    /* A new acquirer does not overtake the queue... */
    lkv_stage_release(a);
    ASSERT_EQ(g.n, 1);
    ASSERT_EQ(g.tag[0], 100);
    ASSERT_TRUE(g.slot[0] == a); /* ...the released slot went to the first waiter. */
    ASSERT_TRUE(lkv_stage_try_acquire(r) == NULL);
    ASSERT_EQ(lkv_stage_cancel(r, &w[1]), 1); /* Unqueued: never granted. */
    ASSERT_EQ(lkv_stage_cancel(r, &w[1]), 0);
    lkv_stage_release(b);
    ASSERT_EQ(g.n, 2);
    ASSERT_EQ(g.tag[1], 102);
    ASSERT_TRUE(g.slot[1] == b);
    ASSERT_EQ(lkv_stage_cancel(r, &w[0]), 0); /* Already served. */
    lkv_stage_counts_get(r, &c);
    ASSERT_EQ(c.queued, 0);
    ASSERT_EQ(c.in_use, 2);
    ASSERT_EQ(c.acquired, 4);
    lkv_stage_release(g.slot[0]);
    lkv_stage_release(g.slot[1]);
    lkv_stage_counts_get(r, &c);
    ASSERT_EQ(c.in_use, 0);
    ASSERT_EQ(g.n, 2); /* The cancelled waiter never ran. */
    lkv_stage_destroy(r);
}

static void test_reentrant_grants(void)
{
    lkv_stage *r;
    ASSERT_OK(lkv_stage_create(4096, 1, LKV_STAGE_MEM_HOST, 0, NULL, &r));
    lkv_stage_slot *s = lkv_stage_try_acquire(r), *got;
    grants g;
    grants_init(&g);
    g.release_again = 1;
    lkv_stage_waiter w[4];
    memset(w, 0, sizeof(w));
    for (int i = 0; i < 4; i++) {
        ASSERT_ERR(lkv_stage_acquire(r, &w[i], on_grant, &g, (uint64_t)i, &got), LKV_EAGAIN);
    }
    lkv_stage_release(s); /* Each grant releases, which grants the next, ... */
    ASSERT_EQ(g.n, 4);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(g.tag[i], i);
        ASSERT_TRUE(g.slot[i] == s);
    }
    lkv_stage_counts c;
    lkv_stage_counts_get(r, &c);
    ASSERT_EQ(c.in_use, 0);
    ASSERT_EQ(c.queued, 0);
    ASSERT_TRUE(lkv_stage_try_acquire(r) == s);
    lkv_stage_release(s);
    lkv_stage_destroy(r);
}

static void test_wait_timer(void)
{
    lkv_stage *r;
    ASSERT_OK(lkv_stage_create(4096, 1, LKV_STAGE_MEM_HOST, 40, NULL, &r));
    lkv_stage_slot *s = lkv_stage_try_acquire(r), *got;
    grants g;
    grants_init(&g);
    lkv_stage_waiter w[2];
    memset(w, 0, sizeof(w));
    uint64_t t0 = now_ms();
    ASSERT_ERR(lkv_stage_acquire(r, &w[0], on_grant, &g, 7, &got), LKV_EAGAIN);
    ASSERT_ERR(lkv_stage_acquire(r, &w[1], on_grant, &g, 8, &got), LKV_EAGAIN);
    ASSERT_EQ(lkv_stage_cancel(r, &w[1]), 1); /* The second never times out: it left. */
    pthread_mutex_lock(&g.mu);
    while (g.n < 1 && now_ms() - t0 < 5000) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g.cv, &g.mu, &ts);
    }
    pthread_mutex_unlock(&g.mu);
    uint64_t waited = now_ms() - t0;
    ASSERT_EQ(g.n, 1);
    ASSERT_EQ(g.tag[0], 7);
    ASSERT_TRUE(g.slot[0] == NULL); /* Timed out: no slot. */
    ASSERT_TRUE(waited >= 35);
    usleep(100 * 1000);
    ASSERT_EQ(g.n, 1); /* The cancelled one stays silent. */
    lkv_stage_counts c;
    lkv_stage_counts_get(r, &c);
    ASSERT_EQ(c.timed_out, 1);
    ASSERT_EQ(c.queued, 0);
    ASSERT_EQ(lkv_stage_cancel(r, &w[0]), 0);
    lkv_stage_release(s); /* Nobody waits: back to the free list. */
    lkv_stage_counts_get(r, &c);
    ASSERT_EQ(c.in_use, 0);
    lkv_stage_destroy(r);
}

/* A wait that runs out starves the ring: the waiters behind it are granted NULL with it, new
 * acquires bypass at once (LKV_EBUSY, nothing queued), until a slot comes back. */
static void test_starved(void)
{
    lkv_stage *r;
    ASSERT_OK(lkv_stage_create(4096, 1, LKV_STAGE_MEM_HOST, 30, NULL, &r));
    lkv_stage_slot *s = lkv_stage_try_acquire(r), *got;
    grants g;
    grants_init(&g);
    lkv_stage_waiter w[3];
    memset(w, 0, sizeof(w));
    uint64_t t0 = now_ms();
    for (int i = 0; i < 3; i++) {
        ASSERT_ERR(lkv_stage_acquire(r, &w[i], on_grant, &g, 20 + i, &got), LKV_EAGAIN);
    }
    pthread_mutex_lock(&g.mu);
    while (g.n < 3 && now_ms() - t0 < 5000) {
        pthread_mutex_unlock(&g.mu);
        usleep(2000);
        pthread_mutex_lock(&g.mu);
    }
    pthread_mutex_unlock(&g.mu);
    ASSERT_EQ(g.n, 3);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(g.tag[i], 20 + i); /* In queue order, all at the first timeout. */
        ASSERT_TRUE(g.slot[i] == NULL);
    }
    ASSERT_TRUE(now_ms() - t0 < 1000); /* Not 3 x 30 ms in a row... at least not much more. */
    lkv_stage_waiter w2 = {0};
    ASSERT_ERR(lkv_stage_acquire(r, &w2, on_grant, &g, 99, &got), LKV_EBUSY);
    ASSERT_EQ(w2.queued, 0);
    lkv_stage_counts c;
    lkv_stage_counts_get(r, &c);
    ASSERT_EQ(c.timed_out, 3);
    ASSERT_EQ(c.bypassed, 1);
    ASSERT_EQ(c.queued, 0);
    lkv_stage_release(s); /* A slot came back: no longer starved. */
    ASSERT_OK(lkv_stage_acquire(r, &w2, on_grant, &g, 99, &got));
    ASSERT_TRUE(got == s);
    ASSERT_ERR(lkv_stage_acquire(r, &w2, on_grant, &g, 98, &got), LKV_EAGAIN); /* Queues. */
    lkv_stage_release(s);
    ASSERT_EQ(g.n, 4);
    ASSERT_TRUE(g.slot[3] == s);
    lkv_stage_release(s);
    lkv_stage_destroy(r);
}

typedef struct find_ctx {
    const char *key;
    double v;
    int found;
} find_ctx;

static int find_stat(void *ctx, const lkv_stat_desc *d, double v)
{
    find_ctx *f = ctx;
    if (strcmp(d->key, f->key) == 0) {
        f->v = v;
        f->found = 1;
    }
    return 0;
}

static double stat_of(lkv_stats *reg, const char *key)
{
    find_ctx f = {key, -1, 0};
    lkv_stats_foreach(reg, "get_stage", find_stat, &f);
    ASSERT_TRUE(f.found);
    return f.v;
}

static void test_stats(void)
{
    lkv_stats *reg;
    ASSERT_OK(lkv_stats_create(&reg));
    lkv_stage *r, *r2;
    ASSERT_OK(lkv_stage_create(1 << 20, 4, LKV_STAGE_MEM_HOST, 0, reg, &r));
    ASSERT_ERR(lkv_stage_create(4096, 4, LKV_STAGE_MEM_HOST, 0, reg, &r2), LKV_EEXIST);
    ASSERT_EQ(stat_of(reg, "slots"), 4);
    ASSERT_EQ(stat_of(reg, "slot_bytes"), 1 << 20);
    lkv_stage_slot *s[4], *got;
    for (int i = 0; i < 4; i++) {
        s[i] = lkv_stage_try_acquire(r);
    }
    ASSERT_EQ(stat_of(reg, "in_use"), 4);
    lkv_stage_waiter w = {0};
    grants g;
    grants_init(&g);
    ASSERT_ERR(lkv_stage_acquire(r, &w, on_grant, &g, 1, &got), LKV_EAGAIN);
    ASSERT_EQ(stat_of(reg, "waited"), 1);
    lkv_stage_release(s[0]);
    ASSERT_TRUE(g.slot[0] == s[0]);
    ASSERT_EQ(stat_of(reg, "acquired"), 5);
    ASSERT_EQ(stat_of(reg, "in_use"), 4);
    for (int i = 0; i < 4; i++) {
        lkv_stage_release(s[i]);
    }
    ASSERT_EQ(stat_of(reg, "in_use"), 0);
    ASSERT_EQ(stat_of(reg, "timed_out"), 0);
    ASSERT_EQ(stat_of(reg, "bypassed"), 0);
    lkv_stage_destroy(r);
    /* Unregistered: a new ring may take the names. */
    ASSERT_OK(lkv_stage_create(4096, 1, LKV_STAGE_MEM_HOST, 0, reg, &r2));
    lkv_stage_destroy(r2);
    lkv_stats_destroy(reg);
}

/* ---- Threaded: producers fill slots, a "wire" thread checks and releases them ------------ */

#define N_PROD   6
#define N_ITERS  3000
#define N_SLOTS  3
#define SLOT_SZ  8192
#define WIRE_CAP 64

typedef struct wire {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    lkv_stage_slot *q[WIRE_CAP];
    uint8_t who[WIRE_CAP];
    int head, n;
    int done;
    atomic_long checked, bad;
} wire;

typedef struct prod {
    int id;
    lkv_stage *r;
    wire *w;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int granted;
    lkv_stage_slot *slot;
    long timeouts;
    long bypassed;
} prod;

static void prod_grant(void *ctx, uint64_t tag, lkv_stage_slot *slot)
{
    prod *p = ctx;
    ASSERT_EQ(tag, (uint64_t)p->id);
    pthread_mutex_lock(&p->mu);
    p->granted = 1;
    p->slot = slot;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void *prod_main(void *arg)
{
    prod *p = arg;
    lkv_stage_waiter w;
    memset(&w, 0, sizeof(w));
    for (int it = 0; it < N_ITERS; it++) {
        lkv_stage_slot *s = NULL;
        p->granted = 0;
        int rc = lkv_stage_acquire(p->r, &w, prod_grant, p, (uint64_t)p->id, &s);
        if (rc == LKV_EBUSY) {
            p->bypassed++; /* Starved: the caller's copying path, at once. */
            continue;
        }
        if (rc == LKV_EAGAIN) {
            pthread_mutex_lock(&p->mu);
            while (!p->granted) {
                pthread_cond_wait(&p->cv, &p->mu);
            }
            s = p->slot;
            pthread_mutex_unlock(&p->mu);
            if (s == NULL) {
                p->timeouts++; /* The caller's fallback: no slot, nothing to release. */
                continue;
            }
        }
        uint8_t *m = lkv_stage_slot_ptr(s);
        memset(m, p->id + 1, SLOT_SZ); /* Ours alone until released. */
        if (it % 7 == 0) {
            sched_yield();
        }
        if (it % 2 == 0) {
            /* Checked and released here. */
            for (int i = 0; i < SLOT_SZ; i += 512) {
                if (m[i] != p->id + 1) {
                    atomic_fetch_add(&p->w->bad, 1);
                }
            }
            lkv_stage_release(s);
            continue;
        }
        /* Handed to the wire thread, which releases it later (gRPC's slice destroy). */
        pthread_mutex_lock(&p->w->mu);
        while (p->w->n == WIRE_CAP) {
            pthread_cond_wait(&p->w->cv, &p->w->mu);
        }
        int at = (p->w->head + p->w->n) % WIRE_CAP;
        p->w->q[at] = s;
        p->w->who[at] = (uint8_t)(p->id + 1);
        p->w->n++;
        pthread_cond_broadcast(&p->w->cv);
        pthread_mutex_unlock(&p->w->mu);
    }
    return NULL;
}

static void *wire_main(void *arg)
{
    wire *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->n == 0 && !w->done) {
            pthread_cond_wait(&w->cv, &w->mu);
        }
        if (w->n == 0 && w->done) {
            break;
        }
        lkv_stage_slot *s = w->q[w->head];
        uint8_t who = w->who[w->head];
        w->head = (w->head + 1) % WIRE_CAP;
        w->n--;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        const uint8_t *m = lkv_stage_slot_ptr(s);
        for (int i = 0; i < SLOT_SZ; i += 256) {
            if (m[i] != who) {
                atomic_fetch_add(&w->bad, 1);
            }
        }
        atomic_fetch_add(&w->checked, 1);
        lkv_stage_release(s); /* May grant a waiting producer, from this thread. */
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void run_threaded(uint64_t wait_ms, int expect_timeouts)
{
    lkv_stage *r;
    ASSERT_OK(lkv_stage_create(SLOT_SZ, N_SLOTS, LKV_STAGE_MEM_HOST, wait_ms, NULL, &r));
    wire w;
    memset(&w, 0, sizeof(w));
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    prod p[N_PROD];
    pthread_t tp[N_PROD], tw;
    pthread_create(&tw, NULL, wire_main, &w);
    for (int i = 0; i < N_PROD; i++) {
        memset(&p[i], 0, sizeof(p[i]));
        p[i].id = i;
        p[i].r = r;
        p[i].w = &w;
        pthread_mutex_init(&p[i].mu, NULL);
        pthread_cond_init(&p[i].cv, NULL);
        pthread_create(&tp[i], NULL, prod_main, &p[i]);
    }
    long timeouts = 0, bypassed = 0;
    for (int i = 0; i < N_PROD; i++) {
        pthread_join(tp[i], NULL);
        timeouts += p[i].timeouts;
        bypassed += p[i].bypassed;
    }
    pthread_mutex_lock(&w.mu);
    w.done = 1;
    pthread_cond_broadcast(&w.cv);
    pthread_mutex_unlock(&w.mu);
    pthread_join(tw, NULL);
    ASSERT_EQ(atomic_load(&w.bad), 0);
    lkv_stage_counts c;
    lkv_stage_counts_get(r, &c);
    ASSERT_EQ(c.in_use, 0);
    ASSERT_EQ(c.queued, 0);
    ASSERT_TRUE(c.max_in_use <= N_SLOTS);
    ASSERT_EQ(c.timed_out, (uint64_t)timeouts);
    ASSERT_EQ(c.bypassed, (uint64_t)bypassed);
    ASSERT_EQ(c.acquired + c.timed_out + c.bypassed, (uint64_t)N_PROD * N_ITERS);
    ASSERT_TRUE(c.waited > 0); /* 6 producers over 3 slots: the queue was used. */
    if (!expect_timeouts) {
        ASSERT_EQ(timeouts, 0);
        ASSERT_EQ(bypassed, 0);
    }
    printf("threaded wait_ms=%llu: %llu acquired, %llu waited, %ld timed out, %ld bypassed, "
           "%ld via wire\n",
           (unsigned long long)wait_ms, (unsigned long long)c.acquired,
           (unsigned long long)c.waited, timeouts, bypassed, atomic_load(&w.checked));
    lkv_stage_destroy(r);
}

static void test_threaded(void)
{
    run_threaded(0, 0); /* Every waiter is served by a release. */
    run_threaded(1, 1); /* A 1 ms wait: some run out; the counts still add up. */
}

int main(void)
{
    LKV_RUN(test_accounting);
    LKV_RUN(test_bad_args);
    LKV_RUN(test_fifo_handoff_and_cancel);
    LKV_RUN(test_reentrant_grants);
    LKV_RUN(test_wait_timer);
    LKV_RUN(test_starved);
    LKV_RUN(test_stats);
    LKV_RUN(test_threaded);
    return 0;
}
