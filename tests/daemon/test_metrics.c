/*
 * test_metrics.c: the Prometheus endpoint (daemon/lkv_metrics.c): exact exposition text of a
 * registry holding every kind and unit (name conversions, labels, families printed together
 * though registered apart, histograms with le in seconds and +Inf equal to _count), values of
 * owned cells and read fns at render time, and the HTTP side over a real socket (GET /metrics
 * is the rendered text, HEAD works, 404, 405, concurrent scrapes, a bad address, a port in use).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lkv_err.h"
#include "lkv_metrics.h"
#include "lkv_stats.h"
#include "lkv_test.h"

static void read3(void *ctx, double *v, int n)
{
    (void)ctx;
    for (int i = 0; i < n; i++) {
        v[i] = 0.25 * (i + 1);
    }
}

static lkv_stats *world(lkv_stat_group **cells, lkv_stat_group **hist)
{
    lkv_stats *r;
    ASSERT_OK(lkv_stats_create(&r));
    lkv_stat_desc a[3] = {
        {"store_docs", "tier=hot", LKV_STAT_GAUGE, "docs", "Docs.", NULL, NULL},
        {"rpc_usec", "method=Put", LKV_STAT_COUNTER, "us", "Time.", NULL, NULL},
        {"store_bytes_used", "tier=hot", LKV_STAT_GAUGE, "bytes", "Bytes \\ used.", NULL, NULL},
    };
    ASSERT_OK(lkv_stats_register(r, a, 3, NULL, NULL, cells));
    lkv_stat_desc b[3] = {
        {"store_hit_ratio", NULL, LKV_STAT_GAUGE, "ratio", "Ratio.", NULL, NULL},
        {"store_pages_total", NULL, LKV_STAT_GAUGE, "pages", "Pages.", NULL, NULL},
        {"store_docs", "tier=cold", LKV_STAT_GAUGE, "docs", "Docs.", NULL, NULL},
    };
    ASSERT_OK(lkv_stats_register(r, b, 3, read3, NULL, NULL));
    lkv_stat_desc h = {
        "rpc_duration", "service=s,method=Get", LKV_STAT_HISTOGRAM, "us", "Latency.", NULL, NULL};
    static const uint64_t bounds[2] = {500, 250000};
    ASSERT_OK(lkv_stats_register_hist(r, &h, 1, bounds, 2, hist));
    return r;
}

static const char *const want_text =
    "# HELP lazykv_rpc_duration_seconds Latency.\n"
    "# TYPE lazykv_rpc_duration_seconds histogram\n"
    "lazykv_rpc_duration_seconds_bucket{service=\"s\",method=\"Get\",le=\"0.0005\"} 1\n"
    "lazykv_rpc_duration_seconds_bucket{service=\"s\",method=\"Get\",le=\"0.25\"} 2\n"
    "lazykv_rpc_duration_seconds_bucket{service=\"s\",method=\"Get\",le=\"+Inf\"} 3\n"
    "lazykv_rpc_duration_seconds_sum{service=\"s\",method=\"Get\"} 1.2005\n"
    "lazykv_rpc_duration_seconds_count{service=\"s\",method=\"Get\"} 3\n"
    "# HELP lazykv_rpc_seconds_total Time.\n"
    "# TYPE lazykv_rpc_seconds_total counter\n"
    "lazykv_rpc_seconds_total{method=\"Put\"} 1.5\n"
    "# HELP lazykv_store_docs Docs.\n"
    "# TYPE lazykv_store_docs gauge\n"
    "lazykv_store_docs{tier=\"hot\"} 7\n"
    "lazykv_store_docs{tier=\"cold\"} 0.75\n"
    "# HELP lazykv_store_hit_ratio Ratio.\n"
    "# TYPE lazykv_store_hit_ratio gauge\n"
    "lazykv_store_hit_ratio 0.25\n"
    "# HELP lazykv_store_pages_all Pages.\n"
    "# TYPE lazykv_store_pages_all gauge\n"
    "lazykv_store_pages_all 0.5\n"
    "# HELP lazykv_store_used_bytes Bytes \\\\ used.\n"
    "# TYPE lazykv_store_used_bytes gauge\n"
    "lazykv_store_used_bytes{tier=\"hot\"} 4096\n";

static void test_render(void)
{
    lkv_stat_group *cells, *hist;
    lkv_stats *r = world(&cells, &hist);
    lkv_stat_set(lkv_stat_group_cell(cells, 0), 7);
    lkv_stat_add(lkv_stat_group_cell(cells, 1), 1500000); /* us -> 1.5 s */
    lkv_stat_set(lkv_stat_group_cell(cells, 2), 4096);
    lkv_stat_hist *h = lkv_stat_group_hist(hist, 0);
    lkv_stat_hist_observe(h, 500);     /* le 0.0005 (inclusive) */
    lkv_stat_hist_observe(h, 200000);  /* le 0.25 */
    lkv_stat_hist_observe(h, 1000000); /* +Inf */
    char *text;
    size_t len;
    ASSERT_OK(lkv_metrics_render(r, &text, &len));
    ASSERT_EQ(len, strlen(text));
    if (strcmp(text, want_text) != 0) {
        LKV_FAIL("rendered:\n%s\nwanted:\n%s", text, want_text);
    }
    free(text);
    /* Values are read at render time. */
    lkv_stat_set(lkv_stat_group_cell(cells, 0), 9);
    ASSERT_OK(lkv_metrics_render(r, &text, NULL));
    ASSERT_TRUE(strstr(text, "lazykv_store_docs{tier=\"hot\"} 9\n") != NULL);
    free(text);
    lkv_stats_destroy(r);
    /* The longest name (63 bytes, 32 one-letter words) keeps every word and gets both
     * suffixes. */
    ASSERT_OK(lkv_stats_create(&r));
    char longname[64] = "a", want[160] = "lazykv";
    for (int i = 1; i < 32; i++) {
        strcat(longname, "_a"); /* "a_a_..._a": 63 bytes. */
    }
    for (int i = 0; i < 32; i++) {
        strcat(want, "_a");
    }
    strcat(want, "_bytes_total 0\n");
    lkv_stat_desc ld = {longname, NULL, LKV_STAT_COUNTER, "bytes", "Long.", NULL, NULL};
    ASSERT_OK(lkv_stats_register(r, &ld, 1, NULL, NULL, NULL));
    ASSERT_OK(lkv_metrics_render(r, &text, NULL));
    ASSERT_TRUE(strstr(text, want) != NULL);
    free(text);
    lkv_stats_destroy(r);
    /* An empty registry renders as empty text. */
    ASSERT_OK(lkv_stats_create(&r));
    ASSERT_OK(lkv_metrics_render(r, &text, &len));
    ASSERT_EQ(len, 0);
    free(text);
    lkv_stats_destroy(r);
}

/* One HTTP/1.0 request over a fresh socket; returns the whole response (malloc'ed). */
static char *http(int port, const char *req)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_OK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)));
    ASSERT_EQ(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while ((got = read(fd, buf + n, cap - n - 1)) > 0) {
        n += (size_t)got;
    }
    buf[n] = '\0';
    close(fd);
    return buf;
}

typedef struct scraper {
    int port;
    int ok;
} scraper;

static void *scrape_many(void *p)
{
    scraper *s = p;
    for (int i = 0; i < 50; i++) {
        char *resp = http(s->port, "GET /metrics HTTP/1.0\r\n\r\n");
        s->ok += strstr(resp, "200 OK") != NULL && strstr(resp, want_text) != NULL;
        free(resp);
    }
    return NULL;
}

static void test_http(void)
{
    lkv_stat_group *cells, *hist;
    lkv_stats *r = world(&cells, &hist);
    lkv_stat_set(lkv_stat_group_cell(cells, 0), 7);
    lkv_stat_add(lkv_stat_group_cell(cells, 1), 1500000);
    lkv_stat_set(lkv_stat_group_cell(cells, 2), 4096);
    lkv_stat_hist *h = lkv_stat_group_hist(hist, 0);
    lkv_stat_hist_observe(h, 500);
    lkv_stat_hist_observe(h, 200000);
    lkv_stat_hist_observe(h, 1000000);
    lkv_metrics *m;
    char err[256];
    ASSERT_OK(lkv_metrics_start(r, "127.0.0.1:0", NULL, &m, err, sizeof(err)));
    const char *addr = lkv_metrics_address(m);
    ASSERT_TRUE(strncmp(addr, "127.0.0.1:", 10) == 0);
    int port = atoi(addr + 10);
    ASSERT_TRUE(port > 0);
    char *resp = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
    ASSERT_TRUE(strstr(resp, "HTTP/1.0 200 OK\r\n") == resp || strstr(resp, " 200 OK") != NULL);
    ASSERT_TRUE(strstr(resp, "Content-Type: text/plain; version=0.0.4; charset=utf-8") != NULL);
    const char *body = strstr(resp, "\r\n\r\n");
    ASSERT_TRUE(body != NULL && strcmp(body + 4, want_text) == 0);
    free(resp);
    resp = http(port, "HEAD /metrics HTTP/1.0\r\n\r\n");
    ASSERT_TRUE(strstr(resp, " 200 OK") != NULL);
    ASSERT_TRUE(strstr(resp, "lazykv_") == NULL); /* No body. */
    free(resp);
    resp = http(port, "GET /nope HTTP/1.0\r\n\r\n");
    ASSERT_TRUE(strstr(resp, " 404 ") != NULL);
    free(resp);
    resp = http(port, "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc");
    ASSERT_TRUE(strstr(resp, " 405 ") != NULL);
    free(resp);
    pthread_t t[4];
    scraper s[4];
    for (int i = 0; i < 4; i++) {
        s[i] = (scraper){port, 0};
        pthread_create(&t[i], NULL, scrape_many, &s[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        ASSERT_EQ(s[i].ok, 50);
    }
    ASSERT_EQ(lkv_metrics_scrapes(m), 1 + 1 + 200); /* GETs and HEADs of /metrics. */
    /* The same port again: refused. */
    char busy[64];
    snprintf(busy, sizeof(busy), "127.0.0.1:%d", port);
    lkv_metrics *m2 = NULL;
    ASSERT_ERR(lkv_metrics_start(r, busy, NULL, &m2, err, sizeof(err)), LKV_EIO);
    ASSERT_TRUE(strstr(err, "metrics_listen") != NULL);
    lkv_metrics_stop(m);
    ASSERT_ERR(lkv_metrics_start(r, "no-port", NULL, &m2, err, sizeof(err)), LKV_EINVAL);
    ASSERT_ERR(lkv_metrics_start(r, "host.invalid.:80", NULL, &m2, err, sizeof(err)), LKV_EINVAL);
    ASSERT_OK(lkv_metrics_start(r, "[::1]:0", NULL, &m2, err, sizeof(err)));
    ASSERT_TRUE(strncmp(lkv_metrics_address(m2), "[::1]:", 6) == 0);
    lkv_metrics_stop(m2);
    lkv_metrics_stop(NULL);
    lkv_stats_destroy(r);
}

/* An authorize hook that serves "Bearer good", refuses "Bearer data" as EPERM and anything
 * else as EUNAUTH, and records what it saw. */
typedef struct authlog {
    int calls, loopback, secure;
    char last[64];
} authlog;

static int fake_authorize(void *ctx, const char *authz, int loopback, int secure, char *err,
                          size_t errlen)
{
    authlog *a = ctx;
    a->calls++;
    a->loopback = loopback;
    a->secure = secure;
    snprintf(a->last, sizeof(a->last), "%s", authz != NULL ? authz : "(none)");
    if (authz != NULL && strcmp(authz, "Bearer good") == 0) {
        return 0;
    }
    if (authz != NULL && strcmp(authz, "Bearer data") == 0) {
        snprintf(err, errlen, "tenant lacks role admin");
        return LKV_EPERM;
    }
    snprintf(err, errlen, "missing credentials");
    return LKV_EUNAUTH;
}

static void test_authorize(void)
{
    lkv_stat_group *cells, *hist;
    lkv_stats *r = world(&cells, &hist);
    authlog al = {0};
    lkv_metrics_opts o = {.authorize = fake_authorize, .auth_ctx = &al};
    lkv_metrics *m;
    char err[256];
    ASSERT_OK(lkv_metrics_start(r, "127.0.0.1:0", &o, &m, err, sizeof(err)));
    int port = atoi(lkv_metrics_address(m) + 10);
    char *resp = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
    ASSERT_TRUE(strstr(resp, " 401 ") != NULL);
    ASSERT_TRUE(strstr(resp, "WWW-Authenticate: Bearer") != NULL);
    ASSERT_TRUE(strstr(resp, "missing credentials") != NULL);
    ASSERT_TRUE(strstr(resp, "lazykv_") == NULL);
    ASSERT_TRUE(al.calls == 1 && al.loopback == 1 && al.secure == 0);
    ASSERT_TRUE(strcmp(al.last, "(none)") == 0);
    free(resp);
    resp = http(port, "GET /metrics HTTP/1.0\r\nAuthorization: Bearer data\r\n\r\n");
    ASSERT_TRUE(strstr(resp, " 403 ") != NULL && strstr(resp, "role admin") != NULL);
    ASSERT_TRUE(strstr(resp, "WWW-Authenticate") == NULL);
    free(resp);
    resp = http(port, "GET /metrics HTTP/1.0\r\nAuthorization: Bearer good\r\n\r\n");
    const char *body = strstr(resp, "\r\n\r\n");
    ASSERT_TRUE(strstr(resp, " 200 ") != NULL && body != NULL && strstr(body, "lazykv_") != NULL);
    free(resp);
    resp = http(port, "GET / HTTP/1.0\r\n\r\n"); /* Only /metrics is guarded. */
    ASSERT_TRUE(strstr(resp, " 200 ") != NULL);
    free(resp);
    ASSERT_EQ(al.calls, 3);
    ASSERT_EQ(lkv_metrics_refused(m), 2);
    ASSERT_EQ(lkv_metrics_scrapes(m), 1);
    lkv_metrics_stop(m);
    /* TLS needs both halves. */
    lkv_metrics_opts half = {.tls_cert_pem = "-----BEGIN CERTIFICATE-----\n"};
    ASSERT_ERR(lkv_metrics_start(r, "127.0.0.1:0", &half, &m, err, sizeof(err)), LKV_EINVAL);
    lkv_stats_destroy(r);
}

int main(void)
{
    LKV_RUN(test_render);
    LKV_RUN(test_http);
    LKV_RUN(test_authorize);
    return 0;
}
