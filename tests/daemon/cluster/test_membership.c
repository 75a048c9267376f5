/*
 * test_membership.c: daemon/cluster/lkv_membership against a real etcd 3.4: three members in
 * one process, each with its own RPC engine serving grpc.health.v1 on a loopback port. Checks
 * registration (records in etcd, read back with etcdctl), the watch (every member sees every
 * other), health (a member whose server stops is marked down within down_after, and up again
 * when it answers), leaving (lease revoked on stop), a lease revoked behind the member's back
 * (re-registers), etcd killed and restarted (the view is kept, the member re-registers), the
 * static list and DNS. Skips (77) without etcd.
 */
#include <signal.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "etcd_harness.h"
#include "lkv_health.h"
#include "lkv_membership.h"
#include "lkv_server.h"
#include "lkv_test.h"

#define N 3

static lkv_etcd etcd;
static lkv_peer_engine *eng;

typedef struct node {
    int port;
    char addr[64], id[16];
    lkv_server *srv;
    lkv_health health;
    lkv_membership *m;
    int changes;
} node;

static node nodes[N];
static const char *const services[] = {"lazykv.v1.Cache", NULL};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void serve(node *n)
{
    lkv_health_init(&n->health, services);
    lkv_method m[LKV_HEALTH_METHODS];
    static lkv_method keep[N][LKV_HEALTH_METHODS]; /* Borrowed by the server. */
    int i = (int)(n - nodes);
    lkv_health_methods(&n->health, m);
    memcpy(keep[i], m, sizeof(m));
    lkv_server_opts o = {.listen = n->addr, .threads = 1, .max_message_bytes = 1 << 20};
    char err[256];
    ASSERT_OK(lkv_server_create(&o, keep[i], LKV_HEALTH_METHODS, &n->srv, err, sizeof(err)));
}

static void unserve(node *n)
{
    lkv_server_shutdown(n->srv, 0);
    lkv_server_destroy(n->srv);
    n->srv = NULL;
}

static void on_change(void *ctx)
{
    ((node *)ctx)->changes++;
}

static void join(node *n, int mode, const char *list)
{
    lkv_membership_config c = {.mode = mode,
                               .self_id = n->id,
                               .self_addr = n->addr,
                               .version = "9.9.9-test",
                               .hot_bytes = (uint64_t)(n - nodes + 1) << 30,
                               .etcd = etcd.endpoint,
                               .prefix = "/lkvtest/members/",
                               .lease_ttl_s = 2,
                               .members = list,
                               .dns = list,
                               .dns_refresh_ms = 300,
                               .health_interval_ms = 100,
                               .down_after_ms = 600,
                               .engine = eng,
                               .on_change = on_change,
                               .ctx = n};
    char err[256];
    ASSERT_OK(lkv_membership_start(&c, &n->m, err, sizeof(err)));
}

/* State of member id as seen by n (-1: absent). */
static int state_of(node *n, const char *id, lkv_member *out)
{
    lkv_member mb[16];
    size_t k = lkv_membership_snapshot(n->m, mb, 16, NULL);
    for (size_t i = 0; i < k && i < 16; i++) {
        if (strcmp(mb[i].id, id) == 0) {
            if (out != NULL) {
                *out = mb[i];
            }
            return mb[i].state;
        }
    }
    return -1;
}

/* Waits until n sees id in state st (-1: absent); returns ms waited or -1 on timeout. */
static int wait_state(node *n, const char *id, int st, int ms)
{
    int64_t t0 = now_ms();
    while (now_ms() - t0 < ms) {
        if (state_of(n, id, NULL) == st) {
            return (int)(now_ms() - t0);
        }
        sleep_ms(20);
    }
    return -1;
}

static void test_register_and_watch(void)
{
    for (int i = 0; i < N; i++) {
        join(&nodes[i], LKV_CLUSTER_ETCD, NULL);
    }
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < N; j++) {
            ASSERT_TRUE(wait_state(&nodes[i], nodes[j].id, LKV_MEMBER_UP, 5000) >= 0);
        }
    }
    lkv_member mb;
    ASSERT_EQ(state_of(&nodes[0], nodes[2].id, &mb), LKV_MEMBER_UP);
    ASSERT_TRUE(strcmp(mb.addr, nodes[2].addr) == 0);
    ASSERT_TRUE(strcmp(mb.version, "9.9.9-test") == 0);
    ASSERT_EQ(mb.hot_bytes, 3ull << 30);
    ASSERT_EQ(mb.self, 0);
    ASSERT_EQ(state_of(&nodes[2], nodes[2].id, &mb), LKV_MEMBER_UP);
    ASSERT_EQ(mb.self, 1);
    ASSERT_TRUE(lkv_membership_etcd_up(nodes[0].m));
    /* The records, as etcd holds them. */
    char out[2048], want[256];
    ASSERT_EQ(lkv_etcdctl(&etcd, "get /lkvtest/members/ --prefix", out, sizeof(out)), 0);
    for (int i = 0; i < N; i++) {
        snprintf(want, sizeof(want),
                 "/lkvtest/members/%s\naddr=%s version=9.9.9-test hot_bytes=%llu", nodes[i].id,
                 nodes[i].addr, (unsigned long long)(i + 1) << 30);
        ASSERT_TRUE(strstr(out, want) != NULL);
    }
    ASSERT_TRUE(nodes[0].changes > 0);
}

static void test_down_and_up(void)
{
    node *c = &nodes[2];
    unserve(c); /* Its etcd record stays: only health says it is gone. */
    int t = wait_state(&nodes[0], c->id, LKV_MEMBER_DOWN, 3000);
    ASSERT_TRUE(t >= 0);
    fprintf(stderr, "   marked down after %d ms (down_after 600 ms)\n", t);
    ASSERT_TRUE(t <= 600 + 100 + 400);
    ASSERT_TRUE(wait_state(&nodes[1], c->id, LKV_MEMBER_DOWN, 2000) >= 0);
    serve(c);
    t = wait_state(&nodes[0], c->id, LKV_MEMBER_UP, 3000);
    ASSERT_TRUE(t >= 0);
    fprintf(stderr, "   up again after %d ms\n", t);
}

static void test_revoked_lease_reregisters(void)
{
    char out[1024], args[128];
    ASSERT_EQ(lkv_etcdctl(&etcd, "get /lkvtest/members/n0 -w fields", out, sizeof(out)), 0);
    const char *p = strstr(out, "\"Lease\" : ");
    ASSERT_TRUE(p != NULL);
    long long lease = atoll(p + 10);
    ASSERT_TRUE(lease != 0);
    snprintf(args, sizeof(args), "lease revoke %llx", lease);
    ASSERT_EQ(lkv_etcdctl(&etcd, args, out, sizeof(out)), 0);
    /* n0 notices (keep-alive TTL 0, or its own DELETE) and registers under a new lease. */
    int64_t t0 = now_ms();
    long long now_lease = lease;
    while (now_ms() - t0 < 5000) {
        if (lkv_etcdctl(&etcd, "get /lkvtest/members/n0 -w fields", out, sizeof(out)) == 0 &&
            (p = strstr(out, "\"Lease\" : ")) != NULL && atoll(p + 10) != lease) {
            now_lease = atoll(p + 10);
            break;
        }
        sleep_ms(50);
    }
    ASSERT_TRUE(now_lease != lease);
    ASSERT_TRUE(wait_state(&nodes[1], nodes[0].id, LKV_MEMBER_UP, 3000) >= 0);
}

static void test_etcd_restart(void)
{
    lkv_etcd_stop(&etcd, SIGKILL);
    sleep_ms(3000); /* Longer than the lease TTL: the sessions are lost. */
    ASSERT_TRUE(!lkv_membership_etcd_up(nodes[0].m));
    /* The view stays (local data keeps being served, peers keep being probed). */
    for (int j = 0; j < N; j++) {
        ASSERT_EQ(state_of(&nodes[0], nodes[j].id, NULL), LKV_MEMBER_UP);
    }
    ASSERT_TRUE(lkv_etcd_restart(&etcd) == 0);
    int64_t t0 = now_ms();
    while (now_ms() - t0 < 8000 &&
           !(lkv_membership_etcd_up(nodes[0].m) && lkv_membership_etcd_up(nodes[1].m) &&
             lkv_membership_etcd_up(nodes[2].m))) {
        sleep_ms(50);
    }
    for (int i = 0; i < N; i++) {
        ASSERT_TRUE(lkv_membership_etcd_up(nodes[i].m));
    }
    fprintf(stderr, "   all re-registered %lld ms after etcd came back\n",
            (long long)(now_ms() - t0));
    char out[2048];
    ASSERT_EQ(lkv_etcdctl(&etcd, "get /lkvtest/members/ --prefix --keys-only", out, sizeof(out)),
              0);
    for (int i = 0; i < N; i++) {
        char want[64];
        snprintf(want, sizeof(want), "/lkvtest/members/%s\n", nodes[i].id);
        ASSERT_TRUE(strstr(out, want) != NULL);
    }
    for (int j = 0; j < N; j++) {
        ASSERT_EQ(state_of(&nodes[1], nodes[j].id, NULL), LKV_MEMBER_UP);
    }
}

static void test_leave(void)
{
    lkv_membership_stop(nodes[2].m);
    nodes[2].m = NULL;
    int t = wait_state(&nodes[0], nodes[2].id, -1, 2000);
    ASSERT_TRUE(t >= 0);
    fprintf(stderr, "   left after %d ms (lease revoked on stop)\n", t);
    char out[512];
    ASSERT_EQ(lkv_etcdctl(&etcd, "get /lkvtest/members/n2 --print-value-only", out, sizeof(out)),
              0);
    ASSERT_TRUE(out[0] == '\0');
    lkv_membership_stop(nodes[0].m);
    lkv_membership_stop(nodes[1].m);
    nodes[0].m = nodes[1].m = NULL;
}

static void test_static_list(void)
{
    char list[256];
    snprintf(list, sizeof(list), "%s,%s=5000", nodes[0].addr, nodes[1].addr);
    /* Static ids are addresses. */
    lkv_membership_config c = {.mode = LKV_CLUSTER_STATIC,
                               .self_addr = nodes[0].addr,
                               .version = "v",
                               .hot_bytes = 1000,
                               .members = list,
                               .health_interval_ms = 100,
                               .down_after_ms = 500,
                               .engine = eng};
    char err[256];
    lkv_membership *m = NULL;
    ASSERT_OK(lkv_membership_start(&c, &m, err, sizeof(err)));
    nodes[0].m = m;
    ASSERT_TRUE(wait_state(&nodes[0], nodes[1].addr, LKV_MEMBER_UP, 3000) >= 0);
    lkv_member mb;
    ASSERT_EQ(state_of(&nodes[0], nodes[1].addr, &mb), LKV_MEMBER_UP);
    ASSERT_EQ(mb.hot_bytes, 5000);
    ASSERT_EQ(state_of(&nodes[0], nodes[0].addr, &mb), LKV_MEMBER_UP);
    ASSERT_EQ(mb.self, 1);
    ASSERT_EQ(mb.hot_bytes, 1000); /* Self's own weight, not the list's default. */
    /* nodes[2]'s server still runs but is not in the list. */
    ASSERT_EQ(state_of(&nodes[0], nodes[2].addr, NULL), -1);
    lkv_membership_stop(m);
    nodes[0].m = NULL;
    /* A bad list is a config error naming the option. */
    c.members = "nocolon";
    ASSERT_ERR(lkv_membership_start(&c, &m, err, sizeof(err)), LKV_EINVAL);
    ASSERT_TRUE(strstr(err, "cluster_members") != NULL);
}

static void test_dns(void)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo("localhost", NULL, &hints, &ai) != 0) {
        /* A bare chroot may lack /etc/hosts: nothing to resolve the name with. */
        printf("  skipped: \"localhost\" does not resolve on this machine (no /etc/hosts?)\n");
        return;
    }
    freeaddrinfo(ai);
    char name[64];
    snprintf(name, sizeof(name), "localhost:%d", nodes[1].port);
    lkv_membership_config c = {.mode = LKV_CLUSTER_DNS,
                               .self_addr = nodes[0].addr,
                               .version = "v",
                               .hot_bytes = 1000,
                               .dns = name,
                               .dns_refresh_ms = 200,
                               .health_interval_ms = 100,
                               .down_after_ms = 500,
                               .engine = eng};
    char err[256];
    lkv_membership *m = NULL;
    ASSERT_OK(lkv_membership_start(&c, &m, err, sizeof(err)));
    nodes[0].m = m;
    ASSERT_TRUE(wait_state(&nodes[0], nodes[1].addr, LKV_MEMBER_UP, 3000) >= 0);
    lkv_membership_stop(m);
    nodes[0].m = NULL;
}

int main(void)
{
    if (!lkv_etcd_available()) {
        fprintf(stderr, "etcd not installed: skip\n");
        return 77;
    }
    if (lkv_etcd_start(&etcd) != 0) {
        return 1;
    }
    ASSERT_OK(lkv_peer_engine_create(&eng));
    for (int i = 0; i < N; i++) {
        nodes[i].port = lkv_free_port();
        snprintf(nodes[i].addr, sizeof(nodes[i].addr), "127.0.0.1:%d", nodes[i].port);
        snprintf(nodes[i].id, sizeof(nodes[i].id), "n%d", i);
        serve(&nodes[i]);
    }
    LKV_RUN(test_register_and_watch);
    LKV_RUN(test_down_and_up);
    LKV_RUN(test_revoked_lease_reregisters);
    LKV_RUN(test_etcd_restart);
    LKV_RUN(test_leave);
    LKV_RUN(test_static_list);
    LKV_RUN(test_dns);
    for (int i = 0; i < N; i++) {
        unserve(&nodes[i]);
    }
    lkv_peer_engine_destroy(eng);
    lkv_etcd_destroy(&etcd);
    fprintf(stderr, "ok\n");
    return 0;
}
