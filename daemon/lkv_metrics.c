/*
 * lkv_metrics.c: the Prometheus endpoint (contract and naming rules in lkv_metrics.h).
 *
 * Rendering takes one pass over the registry (lkv_stats_foreach for counters and gauges,
 * lkv_stats_foreach_hist for histograms), copying each sample with its converted name into an
 * array, then sorts the array by name (ties in registration order), so every metric family is
 * contiguous under one HELP/TYPE header as the format requires. Each scrape allocates its text
 * and libmicrohttpd frees it once sent (MHD_RESPMEM_MUST_FREE); nothing is shared between
 * scrapes, so concurrent scrapes need no lock of their own.
 */
#include "lkv_metrics.h"

#include <arpa/inet.h>
#include <math.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "lkv_auth.h"
#include "lkv_err.h"
#include "lkv_log.h"

#define PROM_NAME_MAX 128
#define MAXW          34 /* Words of a name, with room for two suffixes. */

struct lkv_metrics {
    struct MHD_Daemon *d; /* The HTTP server. */
    lkv_stats *r;         /* Borrowed registry. */
    char address[320];    /* Bound "host:port". */
    atomic_ulong scrapes; /* GET /metrics answered. */
    atomic_ulong refused; /* Requests the authorize hook refused. */
    lkv_metrics_authorize_fn authorize;
    void *auth_ctx;
    int tls; /* Serving HTTPS. */
};

/* ---- Text builder ---------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        b->cap = b->cap * 2 + (n > 0 ? (size_t)n : 0) + 256;
        b->p = lkv_xrealloc(b->p, b->cap);
    }
}

/* A value as Prometheus reads it: integers without a fraction, else 9 significant digits. */
static void sb_value(sbuf *b, double v)
{
    if (isnan(v)) {
        sb_printf(b, "NaN");
    } else if (isinf(v)) {
        sb_printf(b, v > 0 ? "+Inf" : "-Inf");
    } else if (v == floor(v) && fabs(v) < 1e15) {
        sb_printf(b, "%.0f", v);
    } else {
        sb_printf(b, "%.9g", v);
    }
}

/* Labels "k=v,k2=v2" (registry-checked: no quotes, backslashes or control bytes) as
 * k="v",k2="v2" (without braces); extra (may be NULL) appended as one more pair. */
static void sb_labels(sbuf *b, const char *labels, const char *extra_k, const char *extra_v)
{
    int any = 0;
    sb_printf(b, "{");
    for (const char *p = labels; *p != '\0';) {
        const char *eq = strchr(p, '=');
        const char *end = strchr(p, ',');
        if (end == NULL) {
            end = p + strlen(p);
        }
        sb_printf(b, "%s%.*s=\"%.*s\"", any ? "," : "", (int)(eq - p), p, (int)(end - eq - 1),
                  eq + 1);
        any = 1;
        p = *end == ',' ? end + 1 : end;
    }
    if (extra_k != NULL) {
        sb_printf(b, "%s%s=\"%s\"", any ? "," : "", extra_k, extra_v);
        any = 1;
    }
    if (!any) {
        b->len--; /* No labels: drop the brace. */
        b->p[b->len] = '\0';
    } else {
        sb_printf(b, "}");
    }
}

/* ---- Names ------------------------------------------------------------------------------ */

/* Converts a registry name and unit to a Prometheus name (see lkv_metrics.h) into out, and
 * returns the factor that turns a registry value into the base unit. */
static double prom_name(const char *name, const char *unit, int kind, char *out, size_t len)
{
    /* A name of at most 63 bytes has at most 32 words; 2 more for the suffixes. */
    char words[MAXW][LKV_STAT_NAME_MAX + 1];
    int n = 0;
    for (const char *p = name; *p != '\0' && n < MAXW - 2;) {
        const char *us = strchr(p, '_');
        size_t wl = us != NULL ? (size_t)(us - p) : strlen(p);
        if (wl > 0) {
            memcpy(words[n], p, wl);
            words[n++][wl] = '\0';
        }
        p += wl + (us != NULL);
    }
    double scale = 1.0;
    int is_us = strcmp(unit, "us") == 0, is_ms = strcmp(unit, "ms") == 0;
    if (is_us || is_ms) {
        scale = is_us ? 1e-6 : 1e-3;
        int found = 0;
        for (int i = 0; i < n; i++) {
            if ((is_us && (strcmp(words[i], "usec") == 0 || strcmp(words[i], "us") == 0)) ||
                (is_ms && strcmp(words[i], "ms") == 0)) {
                strcpy(words[i], "seconds");
                found = 1;
            }
        }
        if (!found) {
            strcpy(words[n++], "seconds");
        }
    } else if (strcmp(unit, "bytes") == 0) {
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (strcmp(words[i], "bytes") != 0) {
                memmove(words[m++], words[i], sizeof(words[0]));
            }
        }
        n = m;
        strcpy(words[n++], "bytes");
    } else if (strcmp(unit, "ratio") == 0 && (n == 0 || strcmp(words[n - 1], "ratio") != 0)) {
        strcpy(words[n++], "ratio");
    }
    if (kind != LKV_STAT_COUNTER && n > 0 && strcmp(words[n - 1], "total") == 0) {
        strcpy(words[n - 1], "all"); /* Only counters end in _total: pages_total -> pages_all. */
    }
    if (kind == LKV_STAT_COUNTER && (n == 0 || strcmp(words[n - 1], "total") != 0) && n < MAXW) {
        strcpy(words[n++], "total");
    }
    size_t o = (size_t)snprintf(out, len, "lazykv");
    for (int i = 0; i < n && o < len; i++) {
        o += (size_t)snprintf(out + o, len - o, "_%s", words[i]);
    }
    return scale;
}

/* ---- Rendering -------------------------------------------------------------------------- */

typedef struct sample {
    char name[PROM_NAME_MAX];                    /* Converted name. */
    char *labels;                                /* Owned copy. */
    char *help_copy;                             /* Owned copy of help. */
    int kind;                                    /* enum lkv_stat_kind. */
    int order;                                   /* Registration order (stable sort). */
    double value;                                /* Counters and gauges, base unit. */
    double scale;                                /* Registry unit -> base unit. */
    int nb;                                      /* Histograms: bounds. */
    uint64_t bounds[LKV_STAT_HIST_MAX_BUCKETS];  /* Histograms: registry unit. */
    uint64_t cum[LKV_STAT_HIST_MAX_BUCKETS + 1]; /* Histograms: cumulative counts. */
    uint64_t sum;                                /* Histograms: registry unit. */
} sample;

typedef struct collect {
    sample *v;
    int n, cap;
} collect;

static sample *push(collect *c, const lkv_stat_desc *d)
{
    if (c->n == c->cap) {
        c->cap = c->cap * 2 + 64;
        c->v = lkv_xrealloc(c->v, sizeof(*c->v) * (size_t)c->cap);
    }
    sample *s = &c->v[c->n];
    memset(s, 0, sizeof(*s));
    s->order = c->n++;
    s->kind = d->kind;
    s->scale = prom_name(d->name, d->unit, d->kind, s->name, sizeof(s->name));
    s->labels = strdup(d->labels);
    s->help_copy = strdup(d->help);
    if (s->labels == NULL || s->help_copy == NULL) {
        lkv_panic("out of memory (metrics)");
    }
    return s;
}

static int visit(void *ctx, const lkv_stat_desc *d, double value)
{
    sample *s = push(ctx, d);
    s->value = value * s->scale;
    return 0;
}

static int visit_hist(void *ctx, const lkv_stat_desc *d, const uint64_t *bounds,
                      const uint64_t *cum, int nb, uint64_t sum)
{
    sample *s = push(ctx, d);
    s->nb = nb;
    memcpy(s->bounds, bounds, sizeof(*bounds) * (size_t)nb);
    memcpy(s->cum, cum, sizeof(*cum) * (size_t)(nb + 1));
    s->sum = sum;
    return 0;
}

static int by_name(const void *a, const void *b)
{
    const sample *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c != 0 ? c : (x->order > y->order) - (x->order < y->order);
}

static const char *type_name(int kind)
{
    return kind == LKV_STAT_COUNTER ? "counter" : kind == LKV_STAT_GAUGE ? "gauge" : "histogram";
}

int lkv_metrics_render(lkv_stats *r, char **out, size_t *len)
{
    collect c = {0};
    lkv_stats_foreach(r, NULL, visit, &c);
    lkv_stats_foreach_hist(r, visit_hist, &c);
    if (c.n > 0) {
        qsort(c.v, (size_t)c.n, sizeof(*c.v), by_name);
    }
    sbuf b = {lkv_xmalloc(4096), 0, 4096};
    b.p[0] = '\0';
    for (int i = 0; i < c.n; i++) {
        sample *s = &c.v[i];
        if (i == 0 || strcmp(s->name, c.v[i - 1].name) != 0) {
            sb_printf(&b, "# HELP %s ", s->name);
            for (const char *h = s->help_copy; *h != '\0'; h++) {
                sb_printf(&b, *h == '\\' ? "\\\\" : "%c", *h);
            }
            sb_printf(&b, "\n# TYPE %s %s\n", s->name, type_name(s->kind));
        }
        if (s->kind != LKV_STAT_HISTOGRAM) {
            sb_printf(&b, "%s", s->name);
            sb_labels(&b, s->labels, NULL, NULL);
            sb_printf(&b, " ");
            sb_value(&b, s->value);
            sb_printf(&b, "\n");
        } else {
            char le[64];
            for (int k = 0; k <= s->nb; k++) {
                if (k < s->nb) {
                    snprintf(le, sizeof(le), "%.9g", (double)s->bounds[k] * s->scale);
                } else {
                    snprintf(le, sizeof(le), "+Inf");
                }
                sb_printf(&b, "%s_bucket", s->name);
                sb_labels(&b, s->labels, "le", le);
                sb_printf(&b, " %llu\n", (unsigned long long)s->cum[k]);
            }
            sb_printf(&b, "%s_sum", s->name);
            sb_labels(&b, s->labels, NULL, NULL);
            sb_printf(&b, " ");
            sb_value(&b, (double)s->sum * s->scale);
            sb_printf(&b, "\n%s_count", s->name);
            sb_labels(&b, s->labels, NULL, NULL);
            sb_printf(&b, " %llu\n", (unsigned long long)s->cum[s->nb]);
        }
    }
    for (int i = 0; i < c.n; i++) {
        free(c.v[i].labels);
        free(c.v[i].help_copy);
    }
    free(c.v);
    *out = b.p;
    if (len != NULL) {
        *len = b.len;
    }
    return 0;
}

/* ---- HTTP ------------------------------------------------------------------------------- */

static enum MHD_Result answer(struct MHD_Connection *conn, unsigned status, char *body, size_t len,
                              const char *ctype)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", ctype);
    enum MHD_Result rc = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* 1 if the connection's peer is on loopback (by the same rules as the gRPC peers). */
static int peer_loopback(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci == NULL || ci->client_addr == NULL) {
        return 0;
    }
    char host[INET6_ADDRSTRLEN + 8], peer[INET6_ADDRSTRLEN + 32];
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET) {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, host,
                  sizeof(host));
        snprintf(peer, sizeof(peer), "ipv4:%s:0", host);
    } else if (sa->sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, host,
                  sizeof(host));
        snprintf(peer, sizeof(peer), "ipv6:[%s]:0", host);
    } else {
        return 0;
    }
    return lkv_auth_peer_is_loopback(peer);
}

/* Runs the authorize hook; on refusal queues 401 / 403 and returns 0. */
static int authorised(lkv_metrics *m, struct MHD_Connection *conn, enum MHD_Result *rc)
{
    if (m->authorize == NULL) {
        return 1;
    }
    const char *authz = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    char msg[300];
    msg[0] = '\0';
    int arc = m->authorize(m->auth_ctx, authz, peer_loopback(conn), m->tls, msg, sizeof(msg));
    if (arc == 0) {
        return 1;
    }
    atomic_fetch_add(&m->refused, 1);
    const char *why = msg[0] != '\0' ? msg : "not authorised";
    size_t blen = strlen(why) + 2;
    char *body = lkv_xmalloc(blen);
    snprintf(body, blen, "%s\n", why);
    unsigned status = arc == LKV_EPERM ? MHD_HTTP_FORBIDDEN : MHD_HTTP_UNAUTHORIZED;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(body);
        *rc = MHD_NO;
        return 0;
    }
    MHD_add_response_header(resp, "Content-Type", "text/plain");
    if (status == MHD_HTTP_UNAUTHORIZED) {
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer realm=\"lazykvd metrics\"");
    }
    *rc = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    lkv_metrics *m = cls;
    (void)version;
    (void)upload_data;
    (void)con_cls;
    if (*upload_data_size != 0) {
        *upload_data_size = 0; /* Ignore any body. */
        return MHD_YES;
    }
    int get = strcmp(method, "GET") == 0, head = strcmp(method, "HEAD") == 0;
    if (!get && !head) {
        char *msg = strdup("only GET /metrics is served\n");
        return answer(conn, MHD_HTTP_METHOD_NOT_ALLOWED, msg, strlen(msg), "text/plain");
    }
    if (strcmp(url, "/metrics") == 0) {
        enum MHD_Result arc;
        if (!authorised(m, conn, &arc)) {
            return arc;
        }
        char *text;
        size_t len;
        lkv_metrics_render(m->r, &text, &len);
        atomic_fetch_add(&m->scrapes, 1);
        return answer(conn, MHD_HTTP_OK, text, len, "text/plain; version=0.0.4; charset=utf-8");
    }
    if (strcmp(url, "/") == 0) {
        char *msg = strdup("lazykvd: metrics at /metrics\n");
        return answer(conn, MHD_HTTP_OK, msg, strlen(msg), "text/plain");
    }
    char *msg = strdup("not found: metrics are at /metrics\n");
    return answer(conn, MHD_HTTP_NOT_FOUND, msg, strlen(msg), "text/plain");
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char buf[512];
    (void)cls;
    vsnprintf(buf, sizeof(buf), fmt, ap);
    size_t n = strlen(buf);
    while (n > 0 && buf[n - 1] == '\n') {
        buf[--n] = '\0';
    }
    LKV_LOGW("metrics: %s", buf);
}

int lkv_metrics_start(lkv_stats *r, const char *listen, const lkv_metrics_opts *opts,
                      lkv_metrics **out, char *err, size_t errlen)
{
    const lkv_metrics_opts none = {0};
    if (opts == NULL) {
        opts = &none;
    }
    int tls = opts->tls_cert_pem != NULL || opts->tls_key_pem != NULL;
    if (tls && (opts->tls_cert_pem == NULL || opts->tls_key_pem == NULL)) {
        snprintf(err, errlen, "metrics over TLS need both a certificate and a key");
        return LKV_EINVAL;
    }
    if (tls && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        snprintf(err, errlen, "option 'metrics_tls': this libmicrohttpd has no TLS support");
        return LKV_ENOTSUP;
    }
    char host[256], port[16];
    const char *colon = strrchr(listen, ':');
    if (colon == NULL || colon == listen || strlen(colon + 1) == 0 ||
        strlen(colon + 1) >= sizeof(port) || (size_t)(colon - listen) >= sizeof(host)) {
        snprintf(err, errlen, "option 'metrics_listen': '%s' is not host:port", listen);
        return LKV_EINVAL;
    }
    const char *h = listen;
    size_t hl = (size_t)(colon - listen);
    if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    snprintf(port, sizeof(port), "%s", colon + 1);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0 || ai == NULL) {
        snprintf(err, errlen, "option 'metrics_listen': cannot resolve '%s': %s", listen,
                 gai_strerror(gai));
        return LKV_EINVAL;
    }
    lkv_metrics *m = lkv_xcalloc(1, sizeof(*m));
    m->r = r;
    m->authorize = opts->authorize;
    m->auth_ctx = opts->auth_ctx;
    m->tls = tls;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) {
        flags |= MHD_USE_IPv6;
    }
    if (tls) {
        flags |= MHD_USE_TLS;
        m->d = MHD_start_daemon(
            flags, 0, NULL, NULL, on_request, m, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
            MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT, (unsigned)32,
            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_HTTPS_MEM_CERT,
            opts->tls_cert_pem, MHD_OPTION_HTTPS_MEM_KEY, opts->tls_key_pem, MHD_OPTION_END);
    } else {
        m->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, m, MHD_OPTION_EXTERNAL_LOGGER,
                                mhd_log, NULL, /* First, so that MHD logs nothing on its own. */
                                MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
                                (unsigned)32, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                                MHD_OPTION_END);
    }
    int fam = ai->ai_family;
    freeaddrinfo(ai);
    if (m->d == NULL) {
        snprintf(err, errlen,
                 "option 'metrics_listen': cannot bind %s (address in use or invalid%s)", listen,
                 tls ? ", or the certificate and key were refused" : "");
        free(m);
        return LKV_EIO;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_BIND_PORT);
    unsigned bound = info != NULL ? info->port : 0;
    snprintf(m->address, sizeof(m->address), "%s%s%s:%u", fam == AF_INET6 ? "[" : "", host,
             fam == AF_INET6 ? "]" : "", bound);
    *out = m;
    return 0;
}

const char *lkv_metrics_address(const lkv_metrics *m)
{
    return m->address;
}

unsigned long lkv_metrics_scrapes(const lkv_metrics *m)
{
    return atomic_load(&((lkv_metrics *)m)->scrapes);
}

unsigned long lkv_metrics_refused(const lkv_metrics *m)
{
    return atomic_load(&((lkv_metrics *)m)->refused);
}

void lkv_metrics_stop(lkv_metrics *m)
{
    if (m == NULL) {
        return;
    }
    MHD_stop_daemon(m->d);
    free(m);
}
