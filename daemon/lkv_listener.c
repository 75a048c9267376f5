/*
 * lkv_listener.c: the accept loop (see lkv_listener.h for what it guarantees).
 *
 * State. Up to MAX_SOCKS listening sockets (one per resolved address) and a wake-up eventfd,
 * polled by the one accept thread. `conns` is the table of handed-out connections: (fd, st_dev,
 * st_ino, peer address). It is touched only by the accept thread; `n_open` mirrors its size for
 * lkv_listener_stats. The spare descriptor (/dev/null) is open whenever the loop is not in the
 * middle of shedding a connection under EMFILE.
 *
 * The loop, per wake-up: sweep the table if a second has passed; for each readable listening
 * socket accept until EAGAIN: on success check the caps (sweeping first when at one), hand the
 * socket over or close it; on EMFILE/ENFILE shed one waiting connection with the spare and back
 * off; on ENOBUFS/ENOMEM back off; on anything else (ECONNABORTED, EPROTO, EPERM...) go on.
 */
#include "lkv_listener.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lkv_err.h"
#include "lkv_log.h"

#define MAX_SOCKS   8
#define SWEEP_MS    1000
#define PLACE_TRIES 16 /* Wrong-parity descriptors place() may step over per connection. */

typedef struct conn {
    int fd;    /* The descriptor handed out. */
    dev_t dev; /* Its socket's identity when handed out. */
    ino_t ino;
    struct sockaddr_storage peer; /* Peer address (port ignored for the per-peer cap). */
} conn;

struct lkv_listener {
    lkv_listener_opts o;  /* Copy (listen is not kept). */
    int socks[MAX_SOCKS]; /* Listening sockets. */
    int n_socks;
    int port;      /* Bound port. */
    int wake;      /* eventfd: written by stop. */
    int spare;     /* /dev/null, closed to shed a connection under EMFILE; -1 if not. */
    int cursor[2]; /* place(): where to look for the next even / odd descriptor. */
    pthread_t thread;
    int started;         /* The thread runs (until stop joins it). */
    atomic_int stopping; /* Set by stop. */
    conn *conns;         /* Handed-out connections (accept thread only). */
    uint32_t n_conns, cap_conns;
    uint64_t last_sweep_ms; /* Monotonic. */
    uint32_t backoff_ms;    /* Current back-off (0: none). */
    int exhausted_logged;   /* The current EMFILE episode was logged. */
    atomic_ullong accepted, refused_total, refused_peer, refused_callee;
    atomic_ullong fd_exhausted, shed_exhausted, backoffs;
    atomic_uint n_open;
};

static uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

/* ---- Peers and the connection table ---------------------------------------------------- */

/* 1 if a and b are the same IP address (ports ignored; v4-mapped v6 equals its v4). */
static int same_peer(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    uint8_t ka[16], kb[16];
    const struct sockaddr_storage *s[2] = {a, b};
    uint8_t *k[2] = {ka, kb};
    for (int i = 0; i < 2; i++) {
        memset(k[i], 0, 16);
        if (s[i]->ss_family == AF_INET) {
            const struct sockaddr_in *v4 = (const struct sockaddr_in *)s[i];
            k[i][10] = k[i][11] = 0xff;
            memcpy(k[i] + 12, &v4->sin_addr, 4);
        } else if (s[i]->ss_family == AF_INET6) {
            memcpy(k[i], &((const struct sockaddr_in6 *)s[i])->sin6_addr, 16);
        } else {
            return 0;
        }
    }
    return memcmp(ka, kb, 16) == 0;
}

/* Drops table entries whose descriptor gRPC has closed (EBADF, or reused for another file). */
static void sweep(lkv_listener *l)
{
    uint32_t j = 0;
    for (uint32_t i = 0; i < l->n_conns; i++) {
        struct stat st;
        conn *c = &l->conns[i];
        if (fstat(c->fd, &st) == 0 && st.st_dev == c->dev && st.st_ino == c->ino) {
            l->conns[j++] = *c;
        }
    }
    l->n_conns = j;
    atomic_store(&l->n_open, j);
    l->last_sweep_ms = now_ms();
}

static uint32_t peer_count(const lkv_listener *l, const struct sockaddr_storage *peer)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < l->n_conns; i++) {
        n += (uint32_t)same_peer(&l->conns[i].peer, peer);
    }
    return n;
}

/* 0 if a connection from peer fits both caps (sweeping first if it would not), else the
 * counter to bump. */
static atomic_ullong *over_cap(lkv_listener *l, const struct sockaddr_storage *peer)
{
    for (int pass = 0; pass < 2; pass++) {
        int total = l->o.max_conns != 0 && l->n_conns >= l->o.max_conns;
        int per = l->o.max_conns_per_peer != 0 && peer_count(l, peer) >= l->o.max_conns_per_peer;
        if (!total && !per) {
            return NULL;
        }
        if (pass == 1) {
            return total ? &l->refused_total : &l->refused_peer;
        }
        sweep(l); /* Perhaps gRPC closed some since the last sweep. */
    }
    return NULL;
}

static void remember(lkv_listener *l, int fd, const struct sockaddr_storage *peer)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        return; /* Cannot happen for a socket we just accepted; then it is simply not capped. */
    }
    if (l->n_conns == l->cap_conns) {
        l->cap_conns = l->cap_conns != 0 ? l->cap_conns * 2 : 64;
        l->conns = lkv_xrealloc(l->conns, l->cap_conns * sizeof(conn));
    }
    conn *c = &l->conns[l->n_conns++];
    c->fd = fd;
    c->dev = st.st_dev;
    c->ino = st.st_ino;
    c->peer = *peer;
    atomic_store(&l->n_open, l->n_conns);
}

int lkv_listener_addr_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) {
            return 1;
        }
        return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
    }
    return 0;
}

int lkv_listener_fd_is_loopback(int fd)
{
    return fd >= 0 && (fd & 1) == 1;
}

/* Moves fd to a descriptor number of parity want (1 odd, 0 even), closing the old one. Returns
 * the new number, or -1 (fd closed) if none can be had. The kernel hands out the lowest free
 * number, and the holes below are mostly of one parity (the other class's connections fill the
 * rest), so the search starts at a per-parity cursor that moves up past each number it hands out
 * and wraps to the bottom at RLIMIT_NOFILE (F_DUPFD's EINVAL): a bump allocator, usually one
 * F_DUPFD per connection. Wrong-parity numbers met on the way are held (so the next try lands
 * elsewhere) and released; after PLACE_TRIES the connection is given up. */
static int place(lkv_listener *l, int fd, int want)
{
    if ((fd & 1) == want) {
        return fd;
    }
    int held[PLACE_TRIES], n_held = 0, got = -1, wrapped = 0;
    int from = l->cursor[want] > fd ? l->cursor[want] : fd + 1;
    while (n_held < PLACE_TRIES) {
        int d = fcntl(fd, F_DUPFD_CLOEXEC, from);
        if (d < 0) {
            if (errno == EINVAL && !wrapped) { /* Past RLIMIT_NOFILE: wrap to the bottom. */
                wrapped = 1;
                from = 0;
                continue;
            }
            break;
        }
        if ((d & 1) == want) {
            got = d;
            break;
        }
        held[n_held++] = d;
        from = d + 1;
    }
    for (int i = 0; i < n_held; i++) {
        close(held[i]);
    }
    close(fd);
    if (got >= 0) {
        l->cursor[want] = got + 2;
    }
    return got;
}

/* ---- The loop --------------------------------------------------------------------------- */

static void open_spare(lkv_listener *l)
{
    if (l->spare < 0) {
        l->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
}

/* Sleeps for the back-off (or until stop), doubling it for next time. */
static void back_off(lkv_listener *l)
{
    uint32_t lo = l->o.backoff_min_ms != 0 ? l->o.backoff_min_ms : 10;
    uint32_t hi = l->o.backoff_max_ms != 0 ? l->o.backoff_max_ms : 1000;
    l->backoff_ms = l->backoff_ms == 0 ? lo : (l->backoff_ms * 2 > hi ? hi : l->backoff_ms * 2);
    atomic_fetch_add(&l->backoffs, 1);
    struct pollfd p = {.fd = l->wake, .events = POLLIN};
    (void)poll(&p, 1, (int)l->backoff_ms);
}

/* Counts (and logs once per episode) running out of descriptors. */
static void exhausted(lkv_listener *l, int e)
{
    atomic_fetch_add(&l->fd_exhausted, 1);
    if (!l->exhausted_logged) {
        LKV_LOGW("accept: out of descriptors (%s) with %u connection(s) open: closing waiting "
                 "connections and backing off until some are free",
                 strerror(e), l->n_conns);
        l->exhausted_logged = 1;
    }
}

/* Accepts from listening socket s until it would block. Returns 0, or 1 to leave the socket
 * for the next poll round (after a back-off). */
static int accept_some(lkv_listener *l, int s)
{
    for (;;) {
        if (atomic_load(&l->stopping)) {
            return 1;
        }
        struct sockaddr_storage peer;
        socklen_t plen = sizeof(peer);
        int fd = accept4(s, (struct sockaddr *)&peer, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK) {
                return 0;
            }
            if (e == EMFILE || e == ENFILE) {
                exhausted(l, e);
                if (l->spare >= 0) {
                    close(l->spare);
                    l->spare = -1;
                    int shed = accept4(s, NULL, NULL, SOCK_CLOEXEC);
                    if (shed >= 0) {
                        close(shed);
                        atomic_fetch_add(&l->shed_exhausted, 1);
                    }
                    open_spare(l);
                }
                sweep(l);
                back_off(l);
                return 1;
            }
            if (e == ENOBUFS || e == ENOMEM) {
                LKV_LOGW("accept: %s: backing off", strerror(e));
                back_off(l);
                return 1;
            }
            continue; /* ECONNABORTED, EPROTO, EPERM, EINTR...: that connection only. */
        }
        l->backoff_ms = 0;
        open_spare(l);
        atomic_ullong *refuse = over_cap(l, &peer);
        if (refuse != NULL) {
            atomic_fetch_add(refuse, 1);
            close(fd);
            continue;
        }
        if (peer.ss_family == AF_INET || peer.ss_family == AF_INET6) {
            int one = 1;
            (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        if (l->o.loopback_parity) {
            fd = place(l, fd, lkv_listener_addr_is_loopback((const struct sockaddr *)&peer));
            if (fd < 0) {
                exhausted(l, EMFILE); /* No second descriptor: the connection is closed. */
                atomic_fetch_add(&l->shed_exhausted, 1);
                continue;
            }
        }
        if (l->o.on_conn(l->o.ctx, fd, (const struct sockaddr *)&peer, plen) != 0) {
            atomic_fetch_add(&l->refused_callee, 1);
            close(fd);
            continue;
        }
        atomic_fetch_add(&l->accepted, 1);
        remember(l, fd, &peer);
        if (l->exhausted_logged) {
            LKV_LOGI("accept: descriptors available again (%llu connection(s) shed meanwhile)",
                     (unsigned long long)atomic_load(&l->shed_exhausted));
            l->exhausted_logged = 0;
        }
    }
}

static void *loop(void *arg)
{
    lkv_listener *l = arg;
    struct pollfd p[MAX_SOCKS + 1];
    while (!atomic_load(&l->stopping)) {
        p[0].fd = l->wake;
        p[0].events = POLLIN;
        for (int i = 0; i < l->n_socks; i++) {
            p[i + 1].fd = l->socks[i];
            p[i + 1].events = POLLIN;
        }
        int n = poll(p, (nfds_t)l->n_socks + 1, SWEEP_MS);
        if (now_ms() - l->last_sweep_ms >= SWEEP_MS) {
            sweep(l);
        }
        if (n <= 0 || atomic_load(&l->stopping)) {
            continue;
        }
        for (int i = 0; i < l->n_socks; i++) {
            if (p[i + 1].revents & (POLLIN | POLLERR)) {
                accept_some(l, l->socks[i]);
            }
        }
    }
    return NULL;
}

/* ---- Lifecycle -------------------------------------------------------------------------- */

static int bind_one(const struct addrinfo *ai, int port, int v6only, int *out, int *bound_port)
{
    int s = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (s < 0) {
        return -errno;
    }
    int one = 1;
    (void)setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6 && v6only) {
        (void)setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    }
    struct sockaddr_storage a;
    memcpy(&a, ai->ai_addr, ai->ai_addrlen);
    if (port >= 0) {
        if (a.ss_family == AF_INET) {
            ((struct sockaddr_in *)&a)->sin_port = htons((uint16_t)port);
        } else {
            ((struct sockaddr_in6 *)&a)->sin6_port = htons((uint16_t)port);
        }
    }
    if (bind(s, (struct sockaddr *)&a, ai->ai_addrlen) != 0 || listen(s, SOMAXCONN) != 0) {
        int e = errno;
        close(s);
        return -e;
    }
    socklen_t alen = sizeof(a);
    if (getsockname(s, (struct sockaddr *)&a, &alen) != 0) {
        int e = errno;
        close(s);
        return -e;
    }
    *bound_port = ntohs(a.ss_family == AF_INET ? ((struct sockaddr_in *)&a)->sin_port
                                               : ((struct sockaddr_in6 *)&a)->sin6_port);
    *out = s;
    return 0;
}

int lkv_listener_create(const lkv_listener_opts *opts, lkv_listener **out, char *err, size_t errlen)
{
    if (opts == NULL || opts->listen == NULL || opts->on_conn == NULL || out == NULL) {
        return lkv_errf(err, errlen, LKV_EINVAL, "listener: bad options");
    }
    const char *colon = strrchr(opts->listen, ':');
    if (colon == NULL || colon[1] == '\0') {
        return lkv_errf(err, errlen, LKV_EINVAL, "option 'listen': '%s' is not host:port",
                        opts->listen);
    }
    char host[256];
    size_t hl = (size_t)(colon - opts->listen);
    if (hl >= sizeof(host)) {
        return lkv_errf(err, errlen, LKV_EINVAL, "option 'listen': host too long");
    }
    memcpy(host, opts->listen, hl);
    host[hl] = '\0';
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int g = getaddrinfo(host[0] != '\0' ? host : NULL, colon + 1, &hints, &res);
    if (g != 0) {
        return lkv_errf(err, errlen, LKV_EIO, "option 'listen': cannot resolve '%s': %s",
                        opts->listen, gai_strerror(g));
    }
    lkv_listener *l = lkv_xcalloc(1, sizeof(*l));
    l->o = *opts;
    l->o.listen = NULL;
    l->wake = -1;
    l->spare = -1;
    int n_ai = 0;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        n_ai++;
    }
    int port = -1; /* -1: as asked (the first bind); then the first bound port for the rest. */
    int rc = 0;
    for (struct addrinfo *ai = res; ai != NULL && l->n_socks < MAX_SOCKS; ai = ai->ai_next) {
        if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) {
            continue;
        }
        int s = -1, bp = 0;
        int e = bind_one(ai, port, n_ai > 1, &s, &bp);
        if (e != 0) {
            rc = lkv_errf(err, errlen, LKV_EIO, "option 'listen': cannot bind %s: %s", opts->listen,
                          strerror(-e));
            break;
        }
        l->socks[l->n_socks++] = s;
        port = bp;
    }
    freeaddrinfo(res);
    if (rc == 0 && l->n_socks == 0) {
        rc = lkv_errf(err, errlen, LKV_EIO, "option 'listen': no IPv4/IPv6 address for %s",
                      opts->listen);
    }
    if (rc == 0) {
        l->port = port;
        l->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (l->wake < 0) {
            rc = lkv_errf(err, errlen, LKV_EIO, "listener: eventfd: %s", strerror(errno));
        }
    }
    if (rc != 0) {
        lkv_listener_destroy(l);
        return rc;
    }
    open_spare(l);
    l->last_sweep_ms = now_ms();
    *out = l;
    return 0;
}

int lkv_listener_port(const lkv_listener *l)
{
    return l->port;
}

int lkv_listener_start(lkv_listener *l)
{
    if (l->started || atomic_load(&l->stopping)) {
        return LKV_EINVAL;
    }
    int e = pthread_create(&l->thread, NULL, loop, l);
    if (e != 0) {
        lkv_panic("pthread_create: %s", strerror(e));
    }
    l->started = 1;
    return 0;
}

void lkv_listener_stop(lkv_listener *l)
{
    if (l == NULL) {
        return;
    }
    atomic_store(&l->stopping, 1);
    if (l->started) {
        uint64_t one = 1;
        ssize_t w = write(l->wake, &one, sizeof(one));
        (void)w;
        pthread_join(l->thread, NULL);
        l->started = 0;
    }
    for (int i = 0; i < l->n_socks; i++) {
        close(l->socks[i]);
    }
    l->n_socks = 0;
}

void lkv_listener_destroy(lkv_listener *l)
{
    if (l == NULL) {
        return;
    }
    lkv_listener_stop(l);
    if (l->wake >= 0) {
        close(l->wake);
    }
    if (l->spare >= 0) {
        close(l->spare);
    }
    free(l->conns);
    free(l);
}

void lkv_listener_stats_get(const lkv_listener *l, lkv_listener_stats *out)
{
    lkv_listener *m = (lkv_listener *)l;
    out->accepted = atomic_load(&m->accepted);
    out->refused_total = atomic_load(&m->refused_total);
    out->refused_peer = atomic_load(&m->refused_peer);
    out->refused_callee = atomic_load(&m->refused_callee);
    out->fd_exhausted = atomic_load(&m->fd_exhausted);
    out->shed_exhausted = atomic_load(&m->shed_exhausted);
    out->backoffs = atomic_load(&m->backoffs);
    out->open = atomic_load(&m->n_open);
}
