/*
 * test_listener.c: daemon/lkv_listener, the accept loop, over real loopback sockets: hand-off,
 * the per-peer and total caps (refused connections see EOF at once), the sweep that notices
 * connections their owner closed, descriptor exhaustion (EMFILE: a waiting connection is shed,
 * the loop backs off, and accepts again once descriptors are free: the gRPC 1.51 bug it
 * replaces never recovers), binding errors, IPv6, and stop with connections open.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "lkv_listener.h"
#include "lkv_log.h"
#include "lkv_test.h"

#define MAXC 256

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int taken[MAXC];
static int n_taken;
static atomic_int refuse_next;

static int on_conn(void *ctx, int fd, const struct sockaddr *peer, socklen_t len)
{
    (void)ctx;
    (void)len;
    ASSERT_TRUE(peer->sa_family == AF_INET || peer->sa_family == AF_INET6);
    ASSERT_TRUE(fcntl(fd, F_GETFL) & O_NONBLOCK);
    if (atomic_exchange(&refuse_next, 0)) {
        return LKV_EBUSY;
    }
    pthread_mutex_lock(&mu);
    ASSERT_TRUE(n_taken < MAXC);
    taken[n_taken++] = fd;
    pthread_mutex_unlock(&mu);
    return 0;
}

static int taken_count(void)
{
    pthread_mutex_lock(&mu);
    int n = n_taken;
    pthread_mutex_unlock(&mu);
    return n;
}

static void close_taken(void)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_taken; i++) {
        close(taken[i]);
    }
    n_taken = 0;
    pthread_mutex_unlock(&mu);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits up to 3 s for taken_count() to reach want. */
static int wait_taken(int want)
{
    for (int i = 0; i < 300 && taken_count() < want; i++) {
        sleep_ms(10);
    }
    return taken_count();
}

static int dial(int port, int family)
{
    int s = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_TRUE(s >= 0);
    if (family == AF_INET) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ASSERT_OK(connect(s, (struct sockaddr *)&a, sizeof(a)));
    } else {
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
        a.sin6_addr = in6addr_loopback;
        ASSERT_OK(connect(s, (struct sockaddr *)&a, sizeof(a)));
    }
    return s;
}

/* 1 if the server closed s within ms (read sees EOF or a reset). */
static int closed_by_server(int s, int ms)
{
    struct pollfd p = {.fd = s, .events = POLLIN};
    if (poll(&p, 1, ms) != 1) {
        return 0;
    }
    char b;
    ssize_t n = read(s, &b, 1);
    return n == 0 || (n < 0 && errno == ECONNRESET);
}

static lkv_listener *make(const char *addr, uint32_t total, uint32_t per_peer)
{
    lkv_listener_opts o = {.listen = addr,
                           .max_conns = total,
                           .max_conns_per_peer = per_peer,
                           .backoff_min_ms = 5,
                           .backoff_max_ms = 40,
                           .on_conn = on_conn};
    lkv_listener *l = NULL;
    char err[256];
    int rc = lkv_listener_create(&o, &l, err, sizeof(err));
    if (rc != 0) {
        LKV_FAIL("create %s: %s", addr, err);
    }
    ASSERT_TRUE(lkv_listener_port(l) > 0);
    ASSERT_OK(lkv_listener_start(l));
    return l;
}

static void test_handoff_and_caps(void)
{
    lkv_listener *l = make("127.0.0.1:0", 0, 3);
    int port = lkv_listener_port(l);
    int c[5];
    for (int i = 0; i < 5; i++) {
        c[i] = dial(port, AF_INET);
    }
    ASSERT_EQ(wait_taken(3), 3);
    sleep_ms(50);
    ASSERT_EQ(taken_count(), 3); /* The per-peer cap: 2 of 5 refused... */
    int shut = 0;
    for (int i = 0; i < 5; i++) {
        shut += closed_by_server(c[i], i < 3 ? 0 : 1000);
    }
    ASSERT_EQ(shut, 2); /* ...and closed at once, not left hanging. */
    lkv_listener_stats st;
    lkv_listener_stats_get(l, &st);
    ASSERT_EQ(st.accepted, 3);
    ASSERT_EQ(st.refused_peer, 2);
    ASSERT_EQ(st.open, 3);

    /* The owner closes two: the sweep notices (at the cap it sweeps before refusing). */
    pthread_mutex_lock(&mu);
    close(taken[0]);
    close(taken[1]);
    taken[0] = taken[2];
    n_taken = 1;
    pthread_mutex_unlock(&mu);
    int d1 = dial(port, AF_INET), d2 = dial(port, AF_INET);
    ASSERT_EQ(wait_taken(3), 3);
    lkv_listener_stats_get(l, &st);
    ASSERT_EQ(st.accepted, 5);
    ASSERT_EQ(st.refused_peer, 2);
    ASSERT_EQ(st.open, 3);

    /* A refusal by the callee closes the socket and is counted. */
    atomic_store(&refuse_next, 1);
    close_taken();
    int d3 = dial(port, AF_INET);
    ASSERT_TRUE(closed_by_server(d3, 1000));
    lkv_listener_stats_get(l, &st);
    ASSERT_EQ(st.refused_callee, 1);
    for (int i = 0; i < 5; i++) {
        close(c[i]);
    }
    close(d1);
    close(d2);
    close(d3);
    lkv_listener_destroy(l);
    close_taken();
}

static void test_total_cap_and_sweep_timer(void)
{
    lkv_listener *l = make("127.0.0.1:0", 2, 0);
    int port = lkv_listener_port(l);
    int a = dial(port, AF_INET), b = dial(port, AF_INET), c = dial(port, AF_INET);
    ASSERT_EQ(wait_taken(2), 2);
    ASSERT_TRUE(closed_by_server(c, 1000));
    lkv_listener_stats st;
    lkv_listener_stats_get(l, &st);
    ASSERT_EQ(st.refused_total, 1);
    close_taken();
    /* Without any new connection, the once-a-second sweep brings `open` down. */
    for (int i = 0; i < 300; i++) {
        lkv_listener_stats_get(l, &st);
        if (st.open == 0) {
            break;
        }
        sleep_ms(10);
    }
    ASSERT_EQ(st.open, 0);
    close(a);
    close(b);
    close(c);
    lkv_listener_destroy(l);
}

/* Descriptor exhaustion: with every descriptor taken, a connecting client is shed (closed at
 * once, not left in the backlog) and the loop backs off; once descriptors are free again, the
 * next client is accepted and handed over. */
static void test_emfile_recovers(void)
{
    lkv_listener *l = make("127.0.0.1:0", 0, 0);
    int port = lkv_listener_port(l);
    /* Client sockets first: connect() needs no new descriptor. */
    int cli[4];
    for (int i = 0; i < 4; i++) {
        cli[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ASSERT_TRUE(cli[i] >= 0);
    }
    struct rlimit old, low;
    ASSERT_OK(getrlimit(RLIMIT_NOFILE, &old));
    low = old;
    low.rlim_cur = 256;
    ASSERT_OK(setrlimit(RLIMIT_NOFILE, &low));
    int hog[256], n_hog = 0;
    for (;;) {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            ASSERT_EQ(errno, EMFILE);
            break;
        }
        ASSERT_TRUE(n_hog < 256);
        hog[n_hog++] = fd;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_OK(connect(cli[0], (struct sockaddr *)&a, sizeof(a)));
    ASSERT_TRUE(closed_by_server(cli[0], 2000)); /* Shed with the spare descriptor. */
    /* The spare is re-opened after each shed, so the next client is shed too. */
    ASSERT_OK(connect(cli[1], (struct sockaddr *)&a, sizeof(a)));
    ASSERT_TRUE(closed_by_server(cli[1], 2000));
    lkv_listener_stats st;
    for (int i = 0; i < 100; i++) { /* The client sees the close before the loop counts. */
        lkv_listener_stats_get(l, &st);
        if (st.backoffs >= 2) {
            break;
        }
        sleep_ms(10);
    }
    fprintf(stderr, "   exhausted: %llu EMFILE, %llu shed, %llu back-offs\n",
            (unsigned long long)st.fd_exhausted, (unsigned long long)st.shed_exhausted,
            (unsigned long long)st.backoffs);
    ASSERT_TRUE(st.fd_exhausted >= 2);
    ASSERT_TRUE(st.shed_exhausted >= 2);
    ASSERT_TRUE(st.backoffs >= 2);
    ASSERT_EQ(taken_count(), 0);
    for (int i = 0; i < n_hog; i++) {
        close(hog[i]);
    }
    ASSERT_OK(setrlimit(RLIMIT_NOFILE, &old));
    /* Descriptors are back: new clients are accepted and handed over. */
    ASSERT_OK(connect(cli[2], (struct sockaddr *)&a, sizeof(a)));
    ASSERT_OK(connect(cli[3], (struct sockaddr *)&a, sizeof(a)));
    ASSERT_EQ(wait_taken(2), 2);
    lkv_listener_stats_get(l, &st);
    ASSERT_EQ(st.accepted, 2);
    for (int i = 0; i < 4; i++) {
        close(cli[i]);
    }
    lkv_listener_destroy(l);
    close_taken();
}

static void test_bind_errors_and_v6(void)
{
    lkv_listener *l = make("127.0.0.1:0", 0, 0);
    char addr[64], err[256];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", lkv_listener_port(l));
    lkv_listener_opts o = {.listen = addr, .on_conn = on_conn};
    lkv_listener *dup = NULL;
    ASSERT_ERR(lkv_listener_create(&o, &dup, err, sizeof(err)), LKV_EIO);
    ASSERT_TRUE(strstr(err, "'listen'") != NULL && strstr(err, "in use") != NULL);
    o.listen = "no-colon";
    ASSERT_ERR(lkv_listener_create(&o, &dup, err, sizeof(err)), LKV_EINVAL);
    o.listen = "256.1.1.1:80";
    ASSERT_ERR(lkv_listener_create(&o, &dup, err, sizeof(err)), LKV_EIO);
    o.listen = "127.0.0.1:0";
    o.on_conn = NULL;
    ASSERT_ERR(lkv_listener_create(&o, &dup, err, sizeof(err)), LKV_EINVAL);
    ASSERT_EQ(lkv_listener_start(l), LKV_EINVAL); /* Started already. */
    lkv_listener_destroy(l);

    /* IPv6 loopback, where the host has it. */
    int s6 = socket(AF_INET6, SOCK_STREAM, 0);
    if (s6 < 0) {
        fprintf(stderr, "   (no IPv6: skipped)\n");
        return;
    }
    close(s6);
    lkv_listener_opts o6 = {.listen = "[::1]:0", .on_conn = on_conn};
    if (lkv_listener_create(&o6, &l, err, sizeof(err)) != 0) {
        fprintf(stderr, "   (no ::1: %s; skipped)\n", err);
        return;
    }
    ASSERT_OK(lkv_listener_start(l));
    int c = dial(lkv_listener_port(l), AF_INET6);
    ASSERT_EQ(wait_taken(1), 1);
    close(c);
    lkv_listener_destroy(l);
    close_taken();
}

/* loopback_parity: loopback peers always land on odd descriptors, whatever number accept4
 * returned (descriptors are hogged in between to shift the next free number both ways). */
static void test_loopback_parity(void)
{
    lkv_listener_opts o = {.listen = "127.0.0.1:0", .loopback_parity = 1, .on_conn = on_conn};
    lkv_listener *l = NULL;
    char err[256];
    ASSERT_OK(lkv_listener_create(&o, &l, err, sizeof(err)));
    ASSERT_OK(lkv_listener_start(l));
    int hog[8], c[8];
    for (int i = 0; i < 8; i++) {
        hog[i] = i % 2 == 0 ? open("/dev/null", O_RDONLY) : -1; /* Shift the parity. */
        c[i] = dial(lkv_listener_port(l), AF_INET);
        ASSERT_EQ(wait_taken(i + 1), i + 1);
    }
    /* Many in a row: the even holes the moved sockets leave below must not make placing the
     * next one fail (place() searches from a cursor, not from the bottom). */
    int more[64];
    for (int i = 0; i < 64; i++) {
        more[i] = dial(lkv_listener_port(l), AF_INET);
    }
    ASSERT_EQ(wait_taken(72), 72);
    for (int i = 0; i < 72; i++) {
        ASSERT_TRUE(lkv_listener_fd_is_loopback(taken[i]));
        ASSERT_TRUE(fcntl(taken[i], F_GETFL) & O_NONBLOCK);
    }
    for (int i = 0; i < 64; i++) {
        close(more[i]);
    }
    for (int i = 0; i < 8; i++) {
        close(c[i]);
        if (hog[i] >= 0) {
            close(hog[i]);
        }
    }
    struct sockaddr_in a4 = {.sin_family = AF_INET};
    a4.sin_addr.s_addr = htonl(0x7f000005);
    ASSERT_TRUE(lkv_listener_addr_is_loopback((struct sockaddr *)&a4));
    a4.sin_addr.s_addr = htonl(0x0a000001);
    ASSERT_TRUE(!lkv_listener_addr_is_loopback((struct sockaddr *)&a4));
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6};
    a6.sin6_addr = in6addr_loopback;
    ASSERT_TRUE(lkv_listener_addr_is_loopback((struct sockaddr *)&a6));
    inet_pton(AF_INET6, "::ffff:127.0.0.1", &a6.sin6_addr);
    ASSERT_TRUE(lkv_listener_addr_is_loopback((struct sockaddr *)&a6));
    inet_pton(AF_INET6, "::ffff:10.0.0.1", &a6.sin6_addr);
    ASSERT_TRUE(!lkv_listener_addr_is_loopback((struct sockaddr *)&a6));
    lkv_listener_destroy(l);
    close_taken();
}

/* Stop with a client connecting and connections open: prompt; what was handed out stays. */
static void test_stop(void)
{
    lkv_listener *l = make("127.0.0.1:0", 0, 0);
    int port = lkv_listener_port(l);
    int c = dial(port, AF_INET);
    ASSERT_EQ(wait_taken(1), 1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    lkv_listener_stop(l);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    fprintf(stderr, "   stop took %.2f ms\n", ms);
    ASSERT_TRUE(ms < 500);
    ASSERT_TRUE(fcntl(taken[0], F_GETFD) >= 0); /* Still open: its owner closes it. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_TRUE(connect(s, (struct sockaddr *)&a, sizeof(a)) != 0); /* Refused by the kernel. */
    close(s);
    close(c);
    lkv_listener_destroy(l);
    lkv_listener_destroy(NULL);
    close_taken();
}

int main(void)
{
    lkv_log_set_level(LKV_LOG_ERROR);
    LKV_RUN(test_handoff_and_caps);
    LKV_RUN(test_total_cap_and_sweep_timer);
    LKV_RUN(test_emfile_recovers);
    LKV_RUN(test_bind_errors_and_v6);
    LKV_RUN(test_loopback_parity);
    LKV_RUN(test_stop);
    return 0;
}
