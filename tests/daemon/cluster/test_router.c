/*
 * test_router.c: proto/lkv_route (routing hash, weighted rendezvous) and daemon/cluster/
 * lkv_router (owners over the live members of a real lkv_membership). Golden values pin the
 * formulas that clients recompute (the Python package checks the same values in
 * tests/client/python/test_cluster_unit.py); shares follow the weights; a member joining or
 * leaving moves only its own share.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "etcd_harness.h"
#include "lkv_health.h"
#include "lkv_membership.h"
#include "lkv_route.h"
#include "lkv_router.h"
#include "lkv_server.h"
#include "lkv_test.h"

static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x;
}

static void test_golden(void)
{
    uint8_t fp[32];
    for (int i = 0; i < 32; i++) {
        fp[i] = (uint8_t)i;
    }
    const uint32_t toks[3] = {1, 2, 3};
    ASSERT_EQ(lkv_route_hash(fp, toks, 3), 0xa8fd62e5f0e31e0cull);
    ASSERT_EQ(lkv_route_seed("c0"), 0x3460e82b01767fd6ull);
    lkv_route_member m[3] = {{"a", lkv_route_seed("a"), 1},
                             {"b", lkv_route_seed("b"), 1},
                             {"c", lkv_route_seed("c"), 2}};
    ASSERT_EQ(lkv_route_pick(m, 3, 12345), 2);
    ASSERT_EQ(lkv_route_pick(m, 0, 12345), -1);
    /* The hash depends on every token and on the fingerprint. */
    const uint32_t t2[3] = {1, 2, 4};
    ASSERT_TRUE(lkv_route_hash(fp, t2, 3) != lkv_route_hash(fp, toks, 3));
    ASSERT_TRUE(lkv_route_hash(fp, toks, 2) != lkv_route_hash(fp, toks, 3));
    fp[31] ^= 1;
    ASSERT_TRUE(lkv_route_hash(fp, toks, 3) != 0xa8fd62e5f0e31e0cull);
}

static void test_shares_follow_weights(void)
{
    lkv_route_member m[3] = {{"m1", lkv_route_seed("m1"), 1ull << 30},
                             {"m2", lkv_route_seed("m2"), 2ull << 30},
                             {"m3", lkv_route_seed("m3"), 3ull << 30}};
    int cnt[3] = {0};
    uint64_t x = 1;
    const int n = 60000;
    for (int i = 0; i < n; i++) {
        cnt[lkv_route_pick(m, 3, lcg(&x))]++;
    }
    ASSERT_NEAR((double)cnt[0] / n, 1.0 / 6, 0.01);
    ASSERT_NEAR((double)cnt[1] / n, 2.0 / 6, 0.01);
    ASSERT_NEAR((double)cnt[2] / n, 3.0 / 6, 0.01);
}

static void test_join_and_leave_move_one_share(void)
{
    lkv_route_member m[5];
    char ids[5][8];
    for (int i = 0; i < 5; i++) {
        snprintf(ids[i], sizeof(ids[i]), "n%d", i);
        m[i].id = ids[i];
        m[i].seed = lkv_route_seed(ids[i]);
        m[i].weight = 1000;
    }
    uint64_t x = 7;
    const int n = 50000;
    int moved_join = 0, wrong_join = 0, moved_leave = 0, wrong_leave = 0;
    for (int i = 0; i < n; i++) {
        uint64_t r = lcg(&x);
        int a = lkv_route_pick(m, 4, r); /* n0..n3 */
        int b = lkv_route_pick(m, 5, r); /* + n4 */
        if (a != b) {
            moved_join++;
            wrong_join += b != 4; /* Moves only to the newcomer. */
        }
        /* n1 leaves (n0, n2, n3 remain). */
        lkv_route_member rest[3] = {m[0], m[2], m[3]};
        int c = lkv_route_pick(rest, 3, r);
        const char *now = rest[c].id;
        if (strcmp(now, m[a].id) != 0) {
            moved_leave++;
            wrong_leave += a != 1; /* Only n1's documents move. */
        }
    }
    ASSERT_EQ(wrong_join, 0);
    ASSERT_EQ(wrong_leave, 0);
    ASSERT_NEAR((double)moved_join / n, 1.0 / 5, 0.01);
    ASSERT_NEAR((double)moved_leave / n, 1.0 / 4, 0.01);
    fprintf(stderr, "   join moved %.4f (1/5), leave moved %.4f (1/4)\n", (double)moved_join / n,
            (double)moved_leave / n);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void test_router_over_membership(void)
{
    /* Two servers answering health; a static list naming both plus one dead address. */
    static const char *const svcs[] = {NULL};
    static lkv_health h[2];
    static lkv_method ms[2][LKV_HEALTH_METHODS];
    lkv_server *srv[2];
    char addr[3][64], list[256];
    for (int i = 0; i < 2; i++) {
        snprintf(addr[i], sizeof(addr[i]), "127.0.0.1:%d", lkv_free_port());
        lkv_health_init(&h[i], svcs);
        lkv_health_methods(&h[i], ms[i]);
        lkv_server_opts o = {.listen = addr[i], .threads = 1, .max_message_bytes = 1 << 20};
        char err[256];
        ASSERT_OK(lkv_server_create(&o, ms[i], LKV_HEALTH_METHODS, &srv[i], err, sizeof(err)));
    }
    snprintf(addr[2], sizeof(addr[2]), "127.0.0.1:%d", lkv_free_port()); /* Nobody. */
    snprintf(list, sizeof(list), "%s,%s,%s", addr[0], addr[1], addr[2]);
    lkv_peer_engine *eng = NULL;
    ASSERT_OK(lkv_peer_engine_create(&eng));
    lkv_membership_config c = {.mode = LKV_CLUSTER_STATIC,
                               .self_addr = addr[0],
                               .hot_bytes = 1000,
                               .members = list,
                               .health_interval_ms = 50,
                               .down_after_ms = 300,
                               .engine = eng};
    char err[256];
    lkv_membership *m = NULL;
    ASSERT_OK(lkv_membership_start(&c, &m, err, sizeof(err)));
    lkv_router *r = NULL;
    ASSERT_OK(lkv_router_create(m, &r));
    lkv_membership_set_hook(m, lkv_router_refresh, r);
    /* Only self is live at first: every route is ours. */
    char a[128];
    ASSERT_EQ(lkv_router_owner(r, 42, a, sizeof(a), NULL, 0), 1);
    int64_t t0 = now_ms();
    while (lkv_router_live(r, NULL) < 2 && now_ms() - t0 < 3000) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    ASSERT_EQ(lkv_router_live(r, NULL), 2); /* The dead address never becomes live. */
    ASSERT_NEAR(lkv_router_share(r, addr[0]), 1000.0 / (1000.0 + (1ull << 30)), 1e-9);
    /* Owners match lkv_route_pick over the two live members; prev_owner names self for routes
     * that moved to the newcomer. */
    lkv_route_member live[2] = {{addr[0], lkv_route_seed(addr[0]), 1000},
                                {addr[1], lkv_route_seed(addr[1]), 1ull << 30}};
    uint64_t x = 3;
    int moved = 0;
    for (int i = 0; i < 2000; i++) {
        uint64_t route = lcg(&x);
        int want = lkv_route_pick(live, 2, route);
        int got = lkv_router_owner(r, route, a, sizeof(a), NULL, 0);
        ASSERT_EQ(got, want == 0 ? 1 : 0);
        ASSERT_TRUE(strcmp(a, addr[want]) == 0);
        int p = lkv_router_prev_owner(r, route, a, sizeof(a));
        if (want == 1) {
            ASSERT_EQ(p, 1); /* It was ours before the newcomer came up. */
            moved++;
        } else {
            ASSERT_ERR(p, LKV_ENOTFOUND);
        }
    }
    ASSERT_TRUE(moved > 1900); /* The newcomer weighs a million times more. */
    lkv_membership_set_hook(m, NULL, NULL);
    lkv_membership_stop(m);
    lkv_router_destroy(r);
    lkv_peer_engine_destroy(eng);
    for (int i = 0; i < 2; i++) {
        lkv_server_shutdown(srv[i], 0);
        lkv_server_destroy(srv[i]);
    }
}

int main(void)
{
    LKV_RUN(test_golden);
    LKV_RUN(test_shares_follow_weights);
    LKV_RUN(test_join_and_leave_move_one_share);
    LKV_RUN(test_router_over_membership);
    fprintf(stderr, "ok\n");
    return 0;
}
