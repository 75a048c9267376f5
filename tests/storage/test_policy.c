/*
 * test_policy.c: unit tests of storage/lkv_policy.c.
 *
 * Fixed scenarios check each kind's victim order, pins, errors and the admission filter; a
 * randomized run (seed printed, LKV_TEST_SEED overrides) drives lru, gdsf and lfuda with
 * admits, touches, pins, unpins, removes and make_room against a naive O(n) reference model
 * and requires the very same victims in the same order, plus the byte invariants after every
 * operation.
 */
#include <stdint.h>

#include "lkv_policy.h"
#include "lkv_test.h"

#define MAXV 4096

typedef struct victims {
    uint64_t id[MAXV]; /* Victim ids in eviction order. */
    uint64_t bytes[MAXV];
    int n;
} victims;

static void on_evict(void *ctx, uint64_t id, uint64_t bytes)
{
    victims *v = ctx;
    if (v->n < MAXV) {
        v->id[v->n] = id;
        v->bytes[v->n] = bytes;
        v->n++;
    }
}

static void test_names(void)
{
    int k = -1;
    ASSERT_OK(lkv_policy_parse("lru", &k));
    ASSERT_EQ(k, LKV_POLICY_LRU);
    ASSERT_OK(lkv_policy_parse("tlfu-gdsf", &k));
    ASSERT_EQ(k, LKV_POLICY_TLFU_GDSF);
    ASSERT_ERR(lkv_policy_parse("fifo", &k), LKV_EINVAL);
    for (int i = 0; i < LKV_POLICY__COUNT; i++) {
        ASSERT_OK(lkv_policy_parse(lkv_policy_name(i), &k));
        ASSERT_EQ(k, i);
    }
    ASSERT_TRUE(strcmp(lkv_policy_name(99), "unknown") == 0);
    char buf[128];
    int need = lkv_policy_names(buf, sizeof(buf));
    ASSERT_EQ(need, (int)strlen(buf));
    ASSERT_TRUE(strcmp(buf, "lru, gdsf, lfuda, tinylfu, tlfu-gdsf, adaptive") == 0);
    char small[8];
    ASSERT_EQ(lkv_policy_names(small, sizeof(small)), need);
    ASSERT_EQ((int)strlen(small), 7);
    lkv_policy *p;
    ASSERT_ERR(lkv_policy_create(LKV_POLICY__COUNT, 10, &p), LKV_EINVAL);
}

static void test_lru_order(void)
{
    lkv_policy *p;
    victims v = {0};
    ASSERT_OK(lkv_policy_create(LKV_POLICY_LRU, 30, &p));
    for (uint64_t id = 1; id <= 3; id++) {
        ASSERT_OK(lkv_policy_admit(p, id, 10, 1, on_evict, &v));
    }
    ASSERT_EQ(lkv_policy_bytes_used(p), 30);
    ASSERT_OK(lkv_policy_touch(p, 1));
    ASSERT_OK(lkv_policy_admit(p, 4, 10, 1, on_evict, &v)); /* Evicts 2. */
    ASSERT_EQ(v.n, 1);
    ASSERT_EQ(v.id[0], 2);
    ASSERT_EQ(v.bytes[0], 10);
    ASSERT_OK(lkv_policy_admit(p, 5, 20, 1, on_evict, &v)); /* Evicts 3 then 1. */
    ASSERT_EQ(v.n, 3);
    ASSERT_EQ(v.id[1], 3);
    ASSERT_EQ(v.id[2], 1);
    ASSERT_TRUE(lkv_policy_contains(p, 4) && lkv_policy_contains(p, 5));
    ASSERT_TRUE(!lkv_policy_contains(p, 1));
    ASSERT_EQ(lkv_policy_count(p), 2);
    ASSERT_EQ(lkv_policy_evictions(p), 3);
    ASSERT_ERR(lkv_policy_admit(p, 4, 1, 1, NULL, NULL), LKV_EEXIST);
    ASSERT_ERR(lkv_policy_touch(p, 1), LKV_ENOTFOUND);
    ASSERT_ERR(lkv_policy_remove(p, 1), LKV_ENOTFOUND);
    ASSERT_OK(lkv_policy_remove(p, 4)); /* Not an eviction. */
    ASSERT_EQ(lkv_policy_evictions(p), 3);
    ASSERT_EQ(lkv_policy_bytes_used(p), 20);
    ASSERT_EQ(lkv_policy_budget(p), 30);
    lkv_policy_destroy(p);
}

static void test_pins_and_room(void)
{
    for (int kind = 0; kind < LKV_POLICY__COUNT; kind++) {
        lkv_policy *p;
        victims v = {0};
        ASSERT_OK(lkv_policy_create(kind, 100, &p));
        ASSERT_ERR(lkv_policy_admit(p, 1, 101, 1, on_evict, &v), LKV_ENOSPC);
        ASSERT_OK(lkv_policy_admit(p, 1, 40, 1, on_evict, &v));
        ASSERT_OK(lkv_policy_admit(p, 2, 40, 1, on_evict, &v));
        ASSERT_ERR(lkv_policy_pin(p, 9), LKV_ENOTFOUND);
        ASSERT_ERR(lkv_policy_unpin(p, 1), LKV_EINVAL);
        ASSERT_OK(lkv_policy_pin(p, 1));
        ASSERT_OK(lkv_policy_pin(p, 1)); /* Counted. */
        ASSERT_EQ(lkv_policy_bytes_pinned(p), 40);
        ASSERT_OK(lkv_policy_touch(p, 1)); /* Touch of a pinned entry is fine. */
        /* 61 bytes cannot be freed (40 pinned): nothing evicted. */
        ASSERT_ERR(lkv_policy_make_room(p, 61, on_evict, &v), LKV_ENOSPC);
        ASSERT_ERR(lkv_policy_admit(p, 3, 61, 1, on_evict, &v), LKV_ENOSPC);
        ASSERT_EQ(v.n, 0);
        ASSERT_EQ(lkv_policy_count(p), 2);
        ASSERT_OK(lkv_policy_admit(p, 3, 60, 1, on_evict, &v)); /* Evicts 2, never 1. */
        ASSERT_EQ(v.n, 1);
        ASSERT_EQ(v.id[0], 2);
        ASSERT_OK(lkv_policy_unpin(p, 1));
        ASSERT_EQ(lkv_policy_bytes_pinned(p), 40);
        ASSERT_OK(lkv_policy_unpin(p, 1));
        ASSERT_EQ(lkv_policy_bytes_pinned(p), 0);
        ASSERT_OK(lkv_policy_make_room(p, 100, on_evict, &v)); /* Now everything goes. */
        ASSERT_EQ(lkv_policy_count(p), 0);
        ASSERT_EQ(lkv_policy_bytes_used(p), 0);
        ASSERT_EQ(v.n, 3);
        /* Removing a pinned entry releases its pinned bytes. */
        ASSERT_OK(lkv_policy_admit(p, 7, 10, 1, NULL, NULL));
        ASSERT_OK(lkv_policy_pin(p, 7));
        ASSERT_OK(lkv_policy_remove(p, 7));
        ASSERT_EQ(lkv_policy_bytes_pinned(p), 0);
        ASSERT_EQ(lkv_policy_bytes_used(p), 0);
        lkv_policy_destroy(p);
    }
}

static void test_unlimited(void)
{
    lkv_policy *p;
    ASSERT_OK(lkv_policy_create(LKV_POLICY_GDSF, UINT64_MAX, &p));
    for (uint64_t id = 0; id < 100000; id++) { /* Also grows the table many times. */
        ASSERT_OK(lkv_policy_admit(p, id * 7919, 1ull << 40, 1, NULL, NULL));
    }
    ASSERT_EQ(lkv_policy_count(p), 100000);
    ASSERT_EQ(lkv_policy_evictions(p), 0);
    for (uint64_t id = 0; id < 100000; id += 2) {
        ASSERT_OK(lkv_policy_remove(p, id * 7919));
    }
    for (uint64_t id = 0; id < 100000; id++) {
        ASSERT_EQ(lkv_policy_contains(p, id * 7919), id % 2);
    }
    lkv_policy_destroy(p);
}

static void test_gdsf_size_and_frequency(void)
{
    lkv_policy *p;
    victims v = {0};
    ASSERT_OK(lkv_policy_create(LKV_POLICY_GDSF, 100, &p));
    ASSERT_OK(lkv_policy_admit(p, 1, 50, 1, on_evict, &v)); /* Large: priority 1/50. */
    ASSERT_OK(lkv_policy_admit(p, 2, 10, 1, on_evict, &v)); /* Small: priority 1/10. */
    ASSERT_OK(lkv_policy_admit(p, 3, 40, 1, on_evict, &v));
    ASSERT_OK(lkv_policy_touch(p, 3));                      /* 2/40 = 0.05 > 1/50. */
    ASSERT_OK(lkv_policy_admit(p, 4, 10, 1, on_evict, &v)); /* Evicts the large cold one. */
    ASSERT_EQ(v.n, 1);
    ASSERT_EQ(v.id[0], 1);
    /* Aging: the clock is now 1/50, so 4 got 0.02 + 1/10 and outranks 3 (2/40 = 0.05). */
    ASSERT_OK(lkv_policy_admit(p, 5, 50, 1, on_evict, &v)); /* Needs 10 more: evicts 3. */
    ASSERT_EQ(v.n, 2);
    ASSERT_EQ(v.id[1], 3);
    lkv_policy_destroy(p);

    /* lfuda ignores size: the least frequent goes first whatever its size. */
    v.n = 0;
    ASSERT_OK(lkv_policy_create(LKV_POLICY_LFUDA, 100, &p));
    ASSERT_OK(lkv_policy_admit(p, 1, 80, 1, on_evict, &v));
    ASSERT_OK(lkv_policy_admit(p, 2, 10, 1, on_evict, &v));
    ASSERT_OK(lkv_policy_touch(p, 1));
    ASSERT_OK(lkv_policy_admit(p, 3, 20, 1, on_evict, &v));
    ASSERT_EQ(v.n, 1);
    ASSERT_EQ(v.id[0], 2);
    lkv_policy_destroy(p);
}

static void test_tinylfu_admission(void)
{
    for (int kind = LKV_POLICY_TINYLFU; kind <= LKV_POLICY_TLFU_GDSF; kind++) {
        lkv_policy *p;
        ASSERT_OK(lkv_policy_create(kind, 30, &p));
        ASSERT_OK(lkv_policy_sketch_size(p, 1000));
        for (uint64_t id = 1; id <= 3; id++) {
            for (int i = 0; i < 5; i++) {
                lkv_policy_record(p, id);
            }
            ASSERT_EQ(lkv_policy_would_admit(p, id, 10, 1), 1); /* Fits: always. */
            ASSERT_OK(lkv_policy_admit(p, id, 10, 1, NULL, NULL));
        }
        lkv_policy_record(p, 100);
        ASSERT_EQ(lkv_policy_would_admit(p, 100, 10, 1), 0); /* Cold vs warm victims. */
        ASSERT_EQ(lkv_policy_would_admit(p, 100, 31, 1), 0); /* Cannot fit at all. */
        for (int i = 0; i < 10; i++) {
            lkv_policy_record(p, 100);
        }
        ASSERT_EQ(lkv_policy_would_admit(p, 100, 10, 1), 1); /* Now hotter than a victim. */
        /* Needing all three victims: 100 is hotter than each (tinylfu), but per byte it is
         * colder than each (tlfu-gdsf: 11/30 < 5/10). */
        ASSERT_EQ(lkv_policy_would_admit(p, 100, 30, 1), kind == LKV_POLICY_TINYLFU);
        lkv_policy_destroy(p);
    }
    /* Kinds without a filter always admit what can fit. */
    lkv_policy *p;
    ASSERT_OK(lkv_policy_create(LKV_POLICY_LRU, 10, &p));
    ASSERT_OK(lkv_policy_admit(p, 1, 10, 1, NULL, NULL));
    lkv_policy_record(p, 1);
    ASSERT_EQ(lkv_policy_would_admit(p, 2, 10, 1), 1);
    ASSERT_EQ(lkv_policy_would_admit(p, 2, 11, 1), 0);
    lkv_policy_destroy(p);
}

static void test_sketch_ages(void)
{
    lkv_policy *p;
    ASSERT_OK(lkv_policy_create(LKV_POLICY_TINYLFU, 20, &p));
    ASSERT_OK(lkv_policy_admit(p, 1, 10, 1, NULL, NULL));
    ASSERT_OK(lkv_policy_admit(p, 2, 10, 1, NULL, NULL));
    for (int i = 0; i < 15; i++) {
        lkv_policy_record(p, 1);
        lkv_policy_record(p, 2);
    }
    lkv_policy_record(p, 3);
    ASSERT_EQ(lkv_policy_would_admit(p, 3, 10, 1), 0);
    /* 10 x width records of other ids halve the counters several times: 1 and 2 fade. */
    for (uint64_t i = 0; i < 10ull * 4096 * 4; i++) {
        lkv_policy_record(p, 1000000 + (i % 4));
    }
    for (int i = 0; i < 3; i++) {
        lkv_policy_record(p, 3);
    }
    ASSERT_EQ(lkv_policy_would_admit(p, 3, 10, 1), 1);
    lkv_policy_destroy(p);
}

/* ---- randomized comparison with a naive reference ---- */

#define REF_N 64

typedef struct ref_ent {
    int present;
    uint64_t bytes;
    uint64_t seq;
    uint32_t freq;
    uint32_t pins;
    double cost;
    double prio;
} ref_ent;

typedef struct ref {
    int kind;
    uint64_t budget, used, pinned, seq;
    double clock;
    ref_ent e[REF_N];
} ref;

static double ref_prio(const ref *r, const ref_ent *x)
{
    double size = x->bytes > 0 ? (double)x->bytes : 1.0;
    if (r->kind == LKV_POLICY_LFUDA) {
        return r->clock + (double)x->freq;
    }
    return r->clock + (double)x->freq * x->cost / size;
}

/* Index of the victim (unpinned, lowest (prio, seq); LRU: lowest seq), or -1. */
static int ref_victim(const ref *r)
{
    int best = -1;
    for (int i = 0; i < REF_N; i++) {
        const ref_ent *x = &r->e[i];
        if (!x->present || x->pins > 0) {
            continue;
        }
        if (best < 0) {
            best = i;
            continue;
        }
        const ref_ent *b = &r->e[best];
        int less = r->kind == LKV_POLICY_LRU
                       ? x->seq < b->seq
                       : (x->prio < b->prio || (x->prio == b->prio && x->seq < b->seq));
        if (less) {
            best = i;
        }
    }
    return best;
}

static int ref_make_room(ref *r, uint64_t bytes, victims *v)
{
    if (bytes > r->budget - r->pinned) {
        return LKV_ENOSPC;
    }
    while (r->budget - r->used < bytes) {
        int i = ref_victim(r);
        ASSERT_TRUE(i >= 0);
        if (r->kind != LKV_POLICY_LRU) {
            r->clock = r->e[i].prio;
        }
        on_evict(v, (uint64_t)i, r->e[i].bytes);
        r->used -= r->e[i].bytes;
        r->e[i].present = 0;
    }
    return 0;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void run_random(int kind, uint64_t seed)
{
    lkv_policy *p;
    ref r = {.kind = kind, .budget = 1000};
    victims vp = {0}, vr = {0};
    ASSERT_OK(lkv_policy_create(kind, r.budget, &p));
    uint64_t s = seed | 1;
    for (int step = 0; step < 20000; step++) {
        int id = (int)(rnd(&s) % REF_N);
        ref_ent *x = &r.e[id];
        int op = (int)(rnd(&s) % 100);
        int rc_p, rc_r;
        if (op < 40) { /* admit */
            uint64_t bytes = 1 + rnd(&s) % 150;
            double cost = (rnd(&s) % 2) ? 1.0 : (double)bytes;
            rc_p = lkv_policy_admit(p, (uint64_t)id, bytes, cost, on_evict, &vp);
            if (x->present) {
                rc_r = LKV_EEXIST;
            } else {
                rc_r = ref_make_room(&r, bytes, &vr);
                if (rc_r == 0) {
                    *x = (ref_ent){1, bytes, ++r.seq, 1, 0, cost, 0};
                    x->prio = ref_prio(&r, x);
                    r.used += bytes;
                }
            }
        } else if (op < 75) { /* touch */
            rc_p = lkv_policy_touch(p, (uint64_t)id);
            rc_r = x->present ? 0 : LKV_ENOTFOUND;
            if (x->present) {
                x->seq = ++r.seq;
                x->freq++;
                x->prio = ref_prio(&r, x);
            }
        } else if (op < 83) { /* pin */
            rc_p = lkv_policy_pin(p, (uint64_t)id);
            rc_r = x->present ? 0 : LKV_ENOTFOUND;
            if (x->present && x->pins++ == 0) {
                r.pinned += x->bytes;
            }
        } else if (op < 93) { /* unpin */
            rc_p = lkv_policy_unpin(p, (uint64_t)id);
            rc_r = !x->present ? LKV_ENOTFOUND : x->pins == 0 ? LKV_EINVAL : 0;
            if (rc_r == 0 && --x->pins == 0) {
                r.pinned -= x->bytes;
                if (kind == LKV_POLICY_LRU) {
                    x->seq = ++r.seq; /* Back in the list at the head. */
                }
            }
        } else if (op < 97) { /* remove */
            rc_p = lkv_policy_remove(p, (uint64_t)id);
            rc_r = x->present ? 0 : LKV_ENOTFOUND;
            if (x->present) {
                r.used -= x->bytes;
                r.pinned -= x->pins > 0 ? x->bytes : 0;
                x->present = 0;
            }
        } else { /* make_room */
            uint64_t bytes = rnd(&s) % 600;
            rc_p = lkv_policy_make_room(p, bytes, on_evict, &vp);
            rc_r = ref_make_room(&r, bytes, &vr);
        }
        if (rc_p != rc_r) {
            LKV_FAIL("kind %s seed %llu step %d op %d id %d: rc %d vs reference %d",
                     lkv_policy_name(kind), (unsigned long long)seed, step, op, id, rc_p, rc_r);
        }
        ASSERT_EQ(vp.n, vr.n);
        for (int i = 0; i < vp.n; i++) {
            if (vp.id[i] != vr.id[i]) {
                LKV_FAIL("kind %s seed %llu step %d: victim %d is %llu, reference %llu",
                         lkv_policy_name(kind), (unsigned long long)seed, step, i,
                         (unsigned long long)vp.id[i], (unsigned long long)vr.id[i]);
            }
        }
        vp.n = vr.n = 0;
        ASSERT_EQ(lkv_policy_bytes_used(p), r.used);
        ASSERT_EQ(lkv_policy_bytes_pinned(p), r.pinned);
        ASSERT_TRUE(lkv_policy_bytes_used(p) <= lkv_policy_budget(p));
        ASSERT_TRUE(lkv_policy_bytes_pinned(p) <= lkv_policy_bytes_used(p));
        ASSERT_EQ(lkv_policy_contains(p, (uint64_t)id), x->present);
    }
    uint64_t n = 0;
    for (int i = 0; i < REF_N; i++) {
        ASSERT_EQ(lkv_policy_contains(p, (uint64_t)i), r.e[i].present);
        n += (uint64_t)r.e[i].present;
    }
    ASSERT_EQ(lkv_policy_count(p), n);
    lkv_policy_destroy(p);
}

static uint64_t g_seed;

static void test_random_vs_reference(void)
{
    for (uint64_t k = 0; k < 8; k++) {
        run_random(LKV_POLICY_LRU, g_seed + k);
        run_random(LKV_POLICY_GDSF, g_seed + k);
        run_random(LKV_POLICY_LFUDA, g_seed + k);
    }
}

/* The sketch kinds have no exact reference: check invariants under the same random ops. */
static void test_random_sketch_invariants(void)
{
    for (int kind = LKV_POLICY_TINYLFU; kind <= LKV_POLICY_TLFU_GDSF; kind++) {
        lkv_policy *p;
        ASSERT_OK(lkv_policy_create(kind, 5000, &p));
        uint64_t s = g_seed * 3 + 1, used = 0;
        for (int step = 0; step < 200000; step++) {
            uint64_t id = rnd(&s) % 2000;
            lkv_policy_record(p, id);
            if (lkv_policy_touch(p, id) == 0) {
                continue;
            }
            uint64_t bytes = 1 + id % 97;
            if (lkv_policy_would_admit(p, id, bytes, 1)) {
                ASSERT_OK(lkv_policy_admit(p, id, bytes, 1, NULL, NULL));
            }
            used = lkv_policy_bytes_used(p);
            ASSERT_TRUE(used <= 5000);
        }
        ASSERT_TRUE(lkv_policy_count(p) > 10);
        ASSERT_EQ(lkv_policy_bytes_pinned(p), 0);
        lkv_policy_destroy(p);
    }
}

int main(void)
{
    const char *env = getenv("LKV_TEST_SEED");
    g_seed = env != NULL ? strtoull(env, NULL, 10) : 20261130;
    fprintf(stderr, "seed %llu (LKV_TEST_SEED overrides)\n", (unsigned long long)g_seed);
    LKV_RUN(test_names);
    LKV_RUN(test_lru_order);
    LKV_RUN(test_pins_and_room);
    LKV_RUN(test_unlimited);
    LKV_RUN(test_gdsf_size_and_frequency);
    LKV_RUN(test_tinylfu_admission);
    LKV_RUN(test_sketch_ages);
    LKV_RUN(test_random_vs_reference);
    LKV_RUN(test_random_sketch_invariants);
    return 0;
}
