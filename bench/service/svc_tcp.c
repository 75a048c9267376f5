/*
 * svc_tcp.c: the loopback TCP ceiling (see svc_tcp.h for the wire format).
 *
 * The server has one accept thread; each accepted connection gets its own thread, which loops
 * reading requests until the peer closes. Connection threads are tracked in a list so that
 * svc_tcp_server_stop can shut their sockets down and join them.
 */
#include "svc_tcp.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lkv_err.h"
#include "lkv_log.h"

#define SCRATCH_BYTES (2u << 20)

typedef struct conn {
    int fd;            /* Accepted socket, owned. */
    pthread_t thread;  /* Its serving thread. */
    struct conn *next; /* Next in the server's list. */
    svc_tcp_server *srv;
} conn;

struct svc_tcp_server {
    int lfd;            /* Listening socket. */
    int port;           /* Its port. */
    const uint8_t *src; /* Source of 'G' replies (borrowed). */
    size_t src_len;     /* Its length. */
    pthread_t acceptor; /* Accept thread. */
    pthread_mutex_t mu; /* Guards conns and stopping. */
    conn *conns;        /* Accepted connections. */
    int stopping;       /* Set by svc_tcp_server_stop. */
};

static int read_full(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return LKV_EIO;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return LKV_EIO;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Receives len bytes into scratch, reusing it cyclically. */
static int sink(int fd, uint64_t len, uint8_t *scratch, size_t scratch_len)
{
    while (len > 0) {
        size_t n = len < scratch_len ? (size_t)len : scratch_len;
        if (read_full(fd, scratch, n) != 0) {
            return LKV_EIO;
        }
        len -= n;
    }
    return 0;
}

static void set_nodelay(int fd)
{
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

static void *conn_main(void *arg)
{
    conn *c = arg;
    svc_tcp_server *s = c->srv;
    uint8_t *scratch = lkv_xmalloc(SCRATCH_BYTES);
    uint8_t hdr[9];
    for (;;) {
        if (read_full(c->fd, hdr, sizeof(hdr)) != 0) {
            break;
        }
        uint64_t n = get_u64(hdr + 1);
        int rc;
        if (hdr[0] == 'P') {
            rc = sink(c->fd, n, scratch, SCRATCH_BYTES);
            uint8_t ack = 0;
            if (rc == 0) {
                rc = write_full(c->fd, &ack, 1);
            }
        } else if (hdr[0] == 'G') {
            rc = 0;
            while (rc == 0 && n > 0) {
                size_t k = n < s->src_len ? (size_t)n : s->src_len;
                rc = write_full(c->fd, s->src, k);
                n -= k;
            }
        } else if (hdr[0] == 'E' && n <= SVC_TCP_ECHO_MAX) {
            rc = read_full(c->fd, scratch, (size_t)n);
            if (rc == 0) {
                rc = write_full(c->fd, scratch, (size_t)n);
            }
        } else {
            rc = LKV_EPROTO;
        }
        if (rc != 0) {
            break;
        }
    }
    free(scratch);
    return NULL;
}

static void *accept_main(void *arg)
{
    svc_tcp_server *s = arg;
    for (;;) {
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) {
                continue;
            }
            break; /* The listener was shut down. */
        }
        set_nodelay(fd);
        conn *c = lkv_xcalloc(1, sizeof(*c));
        c->fd = fd;
        c->srv = s;
        pthread_mutex_lock(&s->mu);
        if (s->stopping || pthread_create(&c->thread, NULL, conn_main, c) != 0) {
            pthread_mutex_unlock(&s->mu);
            close(fd);
            free(c);
            continue;
        }
        c->next = s->conns;
        s->conns = c;
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

int svc_tcp_server_start(const void *src, size_t src_len, svc_tcp_server **out)
{
    svc_tcp_server *s = lkv_xcalloc(1, sizeof(*s));
    s->src = src;
    s->src_len = src_len;
    pthread_mutex_init(&s->mu, NULL);
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (s->lfd < 0) {
        goto fail;
    }
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t alen = sizeof(a);
    if (bind(s->lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(s->lfd, 256) != 0 ||
        getsockname(s->lfd, (struct sockaddr *)&a, &alen) != 0) {
        goto fail;
    }
    s->port = ntohs(a.sin_port);
    if (pthread_create(&s->acceptor, NULL, accept_main, s) != 0) {
        goto fail;
    }
    *out = s;
    return 0;
fail:
    LKV_LOGE("tcp ceiling: cannot start a loopback server: %s", strerror(errno));
    if (s->lfd >= 0) {
        close(s->lfd);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
    return LKV_EIO;
}

int svc_tcp_server_port(const svc_tcp_server *s)
{
    return s->port;
}

void svc_tcp_server_stop(svc_tcp_server *s)
{
    if (s == NULL) {
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_mutex_unlock(&s->mu);
    shutdown(s->lfd, SHUT_RDWR);
    pthread_join(s->acceptor, NULL);
    close(s->lfd);
    conn *c = s->conns;
    while (c != NULL) {
        conn *next = c->next;
        shutdown(c->fd, SHUT_RDWR);
        pthread_join(c->thread, NULL);
        close(c->fd);
        free(c);
        c = next;
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int svc_tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        return LKV_EIO;
    }
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return LKV_EIO;
    }
    set_nodelay(fd);
    return fd;
}

int svc_tcp_put(int fd, const void *data, size_t len)
{
    uint8_t hdr[9];
    hdr[0] = 'P';
    put_u64(hdr + 1, len);
    uint8_t ack;
    if (write_full(fd, hdr, sizeof(hdr)) != 0 || write_full(fd, data, len) != 0 ||
        read_full(fd, &ack, 1) != 0) {
        return LKV_EIO;
    }
    return ack == 0 ? 0 : LKV_EPROTO;
}

int svc_tcp_get(int fd, size_t len, void *scratch, size_t scratch_len)
{
    uint8_t hdr[9];
    hdr[0] = 'G';
    put_u64(hdr + 1, len);
    if (write_full(fd, hdr, sizeof(hdr)) != 0) {
        return LKV_EIO;
    }
    return sink(fd, len, scratch, scratch_len);
}

int svc_tcp_echo(int fd, const void *msg, size_t len, void *reply)
{
    if (len > SVC_TCP_ECHO_MAX) {
        return LKV_EINVAL;
    }
    uint8_t buf[9 + SVC_TCP_ECHO_MAX];
    buf[0] = 'E';
    put_u64(buf + 1, len);
    memcpy(buf + 9, msg, len);
    if (write_full(fd, buf, 9 + len) != 0 || read_full(fd, reply, len) != 0) {
        return LKV_EIO;
    }
    return 0;
}
