/*
 * lkv_store_resid.c: the block store's residency controls (lkv_store.h, "Residency controls";
 * internals and locking in lkv_store_int.h).
 *
 * The policies (lkv_policy.h) implement holds, classes, priorities and expiry over their
 * entries; this file maps documents onto them:
 *   class     tenant << 32 | profile index of the doc (LKV__CLS_DEAD for a DEAD doc's entry,
 *             which no hold may select, so a dead doc's pages never stay held).
 *   hold      a doc hold is d->held plus lkv_policy_hold in every policy the doc is in (applied
 *             again after each admit and rekey: lkv__hold_apply); a class hold is an entry of
 *             s->holds plus lkv_policy_hold_class on both policies (which holds future
 *             admits itself).
 *   evict     by class, purge, expire: one sweep of the slot table (sweep_run) that demotes
 *             or drops (kill: both tiers, cause LKV_MISS_DELETED or LKV_MISS_EXPIRED) what it
 *             selects and nothing pins or holds, in batches, letting the lock go between them;
 *             lkv_store_expire runs the expiry sweep, and the maintenance thread calls it every
 *             maint_ms (a thread of its own, not the write-back writer, so a slow RocksDB write
 *             never delays expiry and the writer's loop stays as it was). The policies' own
 *             lkv_policy_evict_class / lkv_policy_expire (the simulator's) are not used: they
 *             would do every victim in one lock hold.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lkv_store_int.h"

#define MASK_TENANT      0xffffffff00000000ull
#define MASK_PROFILE     0x00000000ffffffffull
#define DEFAULT_MAINT_MS 1000u
#define SWEEP_BATCH      64u     /* Default of cfg.sweep_batch. */
#define SWEEP_PAUSE_NS   100000L /* Time off the lock between batches. */

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t cls_of(const doc *d)
{
    return (uint64_t)d->tenant << 32 | (uint32_t)d->profile;
}

lkv_policy_attrs lkv__attrs(const lkv_store *s, const doc *d)
{
    (void)s;
    lkv_policy_attrs a;
    a.cls = d->state == ST_DEAD ? LKV__CLS_DEAD : cls_of(d);
    a.prio = d->prio;
    a.expires = d->expires_ms > 0 ? (uint64_t)d->expires_ms : 0;
    return a;
}

void lkv__hold_apply(lkv_store *s, lkv_policy *p, doc *d)
{
    (void)s;
    if (d->held && d->state != ST_DEAD) {
        MUST_OK(lkv_policy_hold(p, d->pid, 1));
    }
}

int lkv__held(const lkv_store *s, const doc *d)
{
    if (d->state == ST_DEAD) {
        return 0;
    }
    if (d->held) {
        return 1;
    }
    uint64_t c = cls_of(d);
    for (int i = 0; i < s->nholds; i++) {
        if ((c & s->holds[i].mask) == s->holds[i].value) {
            return 1;
        }
    }
    return 0;
}

void lkv__doc_opts(doc *d, const lkv_put_opts *o, int64_t now_ms)
{
    if (o == NULL) {
        return;
    }
    d->tenant = o->tenant;
    d->prio = (int8_t)o->prio;
    d->expires_ms = o->ttl_ms > 0 ? now_ms + (int64_t)o->ttl_ms : 0;
    d->held = o->hold ? 1 : 0;
}

/* Sets or clears d's id hold in the policies it is in. */
static void hold_set(lkv_store *s, doc *d, int on)
{
    d->held = on ? 1 : 0;
    if (d->hot) {
        MUST_OK(lkv_policy_hold(lkv__hotp(s, d), d->pid, on));
    }
    if (d->cold) {
        MUST_OK(lkv_policy_hold(s->coldp, d->pid, on));
    }
    lkv__sizes_sync(s, d); /* hot_bytes_held. */
}

void lkv__hold_doc(lkv_store *s, doc *d)
{
    if (d->state == ST_VISIBLE) {
        hold_set(s, d, 1);
    }
}

int lkv_store_hold(lkv_store *s, const lkv_dockey *key, int on)
{
    if (s == NULL || key == NULL) {
        return LKV_EINVAL;
    }
    if (on) {
        /* A pin promotes a cold-only document (must be hot) and keeps it from going while the
         * hold is set; the pin is dropped at once after. */
        int rc = lkv_store_pin(s, key, NULL, 0, NULL);
        if (rc != 0) {
            return rc;
        }
    }
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    doc *d = lkv__kidx_find(s, key);
    if (d == NULL || d->state != ST_VISIBLE) {
        rc = LKV_ENOTFOUND; /* Only possible when on = 0: our pin keeps it visible. */
    } else {
        hold_set(s, d, on);
        if (on) {
            d->user_pins--;
            lkv__hot_unpin(s, d);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Fills the class (value, mask) of tenant and/or profile. */
static int class_of(lkv_store *s, int64_t tenant, const char *profile, uint64_t *value,
                    uint64_t *mask)
{
    *value = *mask = 0;
    if (tenant < 0 && profile == NULL) {
        return LKV_EINVAL;
    }
    if (tenant >= (int64_t)UINT32_MAX) {
        return LKV_EINVAL; /* 0xffffffff is LKV__CLS_DEAD's half. */
    }
    if (tenant >= 0) {
        *value |= (uint64_t)tenant << 32;
        *mask |= MASK_TENANT;
    }
    if (profile != NULL) {
        const lkv_profile *p;
        int rc = lkv_store_profile_get(s, profile, &p);
        if (rc != 0) {
            return rc;
        }
        *value |= (uint32_t)(p - lkv_store_profile_at(s, 0));
        *mask |= MASK_PROFILE;
    }
    return 0;
}

/* Visible docs of class (value, mask); brings every doc's hot_bytes_held share up to date (a
 * class hold just changed). */
static uint64_t class_count(lkv_store *s, uint64_t value, uint64_t mask)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        doc *d = s->slots[i];
        if (d != NULL) {
            lkv__sizes_sync(s, d);
            n += d->state == ST_VISIBLE && (cls_of(d) & mask) == value;
        }
    }
    return n;
}

int lkv_store_hold_class(lkv_store *s, int64_t tenant, const char *profile, int on, uint64_t *n)
{
    uint64_t value, mask;
    int rc = class_of(s, tenant, profile, &value, &mask);
    if (rc != 0) {
        return rc;
    }
    pthread_mutex_lock(&s->mu);
    int i = 0;
    while (i < s->nholds && !(s->holds[i].value == value && s->holds[i].mask == mask)) {
        i++;
    }
    if (on && i == s->nholds && s->nholds == LKV__MAX_CLASS_HOLDS) {
        rc = LKV_ENOSPC;
    } else if (!on && i == s->nholds) {
        rc = LKV_ENOTFOUND;
    } else if (on && i == s->nholds) {
        s->holds[s->nholds++] = (lkv__class_hold){value, mask};
    } else if (!on) {
        s->holds[i] = s->holds[--s->nholds];
    }
    if (rc == 0) {
        /* The policies mirror the store's table (same limit): these cannot fail now. */
        for (int r = 0; r < s->n_profiles; r++) { /* Every region's hot policy. */
            int h = lkv_policy_hold_class(s->reg[r].hotp, value, mask, on);
            MUST_OK(h == LKV_ENOTFOUND && !on ? 0 : h);
        }
        int c = lkv_policy_hold_class(s->coldp, value, mask, on);
        MUST_OK(c == LKV_ENOTFOUND && !on ? 0 : c);
        uint64_t count = class_count(s, value, mask);
        if (n != NULL) {
            *n = count;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- bulk operations: class eviction, purge, expiry ------------------------------------- */

/* What a bulk sweep does to each doc it selects. */
enum sweep_op { SWEEP_DEMOTE, SWEEP_PURGE, SWEEP_EXPIRE };

typedef struct sweep {
    int op;             /* enum sweep_op. */
    uint64_t value;     /* Class (DEMOTE, PURGE). */
    uint64_t mask;      /* Class mask. */
    int64_t now;        /* Clock (EXPIRE). */
    uint64_t hot, cold; /* Docs that left the hot tier; docs dropped that were cold only. */
} sweep;

/* 1 if the sweep takes d now: visible, selected, and nothing pins or holds it. */
static int sweep_takes(const lkv_store *s, const sweep *w, const doc *d)
{
    if (d == NULL || d->state != ST_VISIBLE || d->hot_pins > 0 || d->cold_pins > 0 ||
        d->promoting) {
        return 0;
    }
    if (w->op == SWEEP_EXPIRE ? d->expires_ms <= 0 || d->expires_ms > w->now
                              : (cls_of(d) & w->mask) != w->value) {
        return 0;
    }
    if (w->op == SWEEP_DEMOTE && !d->hot) {
        return 0;
    }
    return !lkv__held(s, d);
}

/* The one bulk sweep (lock held): walks the slot table (not the policies, which would do each
 * victim through a callback, all in one lock hold) and demotes (lkv__demote, as the budget
 * does) or drops (lkv__kill, as a delete does, from both tiers) each doc it takes. Dropping is
 * a RocksDB delete a doc, so after every cfg.sweep_batch docs it lets the lock go for a moment: a
 * mass expiry or a purge of a big tenant never stalls the store's callers for long. Docs that
 * appear in slots already passed meanwhile wait for the next sweep. */
static void sweep_run(lkv_store *s, sweep *w)
{
    uint32_t batch = 0, every = s->cfg.sweep_batch ? s->cfg.sweep_batch : SWEEP_BATCH;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        doc *d = s->slots[i];
        if (!sweep_takes(s, w, d)) {
            continue;
        }
        if (d->hot) {
            w->hot++;
        } else {
            w->cold++;
        }
        if (w->op == SWEEP_DEMOTE) {
            lkv__demote(s, d); /* May free d. */
        } else {
            lkv__kill(s, d, w->op == SWEEP_EXPIRE ? LKV_MISS_EXPIRED : LKV_MISS_DELETED, 0);
            lkv__settle(s, d);
        }
        if (++batch == every && every != UINT32_MAX) {
            batch = 0;
            lkv__demote_flush(s); /* Demotions built so far, written off the lock. */
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            /* A moment off the lock: long enough for a woken waiter to take it (a mutex is
             * not fair, and a bare yield lets this thread take it back first). */
            struct timespec pause = {0, SWEEP_PAUSE_NS};
            nanosleep(&pause, NULL);
            pthread_mutex_lock(&s->mu);
        }
    }
    lkv__demote_flush(s); /* s->demotions is empty whenever the lock is free. */
    pthread_cond_broadcast(&s->cv);
}

int lkv_store_evict_class(lkv_store *s, int64_t tenant, const char *profile, int purge,
                          uint64_t *n_hot, uint64_t *n_cold)
{
    sweep w = {.op = purge ? SWEEP_PURGE : SWEEP_DEMOTE};
    int rc = class_of(s, tenant, profile, &w.value, &w.mask);
    if (rc != 0) {
        return rc;
    }
    pthread_mutex_lock(&s->mu);
    sweep_run(s, &w);
    s->st.class_evictions += w.hot + w.cold;
    pthread_mutex_unlock(&s->mu);
    if (n_hot != NULL) {
        *n_hot = w.hot;
    }
    if (n_cold != NULL) {
        *n_cold = w.cold;
    }
    return 0;
}

/* The expiry sweep (lock held). Returns the documents dropped. */
static uint64_t expire_locked(lkv_store *s, int64_t now)
{
    sweep w = {.op = SWEEP_EXPIRE, .now = now};
    sweep_run(s, &w);
    s->st.expired += w.hot + w.cold;
    return w.hot + w.cold;
}

int lkv_store_expire(lkv_store *s, int64_t now_ms, uint64_t *n)
{
    if (now_ms <= 0) {
        now_ms = wall_ms();
    }
    pthread_mutex_lock(&s->mu);
    uint64_t k = expire_locked(s, now_ms);
    pthread_mutex_unlock(&s->mu);
    if (n != NULL) {
        *n = k;
    }
    return 0;
}

/* ---- maintenance thread --------------------------------------------------------------------- */

static void *maint_main(void *arg)
{
    lkv_store *s = arg;
    uint32_t period = s->cfg.maint_ms ? s->cfg.maint_ms : DEFAULT_MAINT_MS;
    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)period * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&s->mcv, &s->mu, &ts);
        if (!s->stopping) {
            expire_locked(s, wall_ms());
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

void lkv__maint_start(lkv_store *s)
{
    pthread_cond_init(&s->mcv, NULL);
    if (pthread_create(&s->maint, NULL, maint_main, s) != 0) {
        lkv_panic("store: cannot start the maintenance thread");
    }
    s->maint_started = 1;
}

void lkv__maint_stop(lkv_store *s)
{
    if (!s->maint_started) {
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->mcv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->maint, NULL);
    pthread_cond_destroy(&s->mcv);
    s->maint_started = 0;
}
