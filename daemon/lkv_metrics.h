/*
 * lkv_metrics.h: the Prometheus metrics endpoint (DESIGN.md 6). An HTTP server (libmicrohttpd,
 * its own polling thread) answers GET /metrics with the text exposition format 0.0.4 rendered
 * from the statistics registry (common/lkv_stats.h), and nothing else: every counter, gauge and
 * histogram any module registers appears here without being written again.
 *
 * Names (Prometheus conventions, checked by `promtool check metrics` in CI):
 *   - every name gets the prefix "lazykv_";
 *   - units become base units and a suffix: "us" and "ms" values are divided into seconds and
 *     a "usec"/"ms" word in the name becomes "seconds" (else "_seconds" is appended); "bytes"
 *     moves a "bytes" word to the end ("store_bytes_used" -> "lazykv_store_used_bytes");
 *     "ratio" ends the name in "_ratio"; other units ("docs", "calls") add nothing;
 *   - counters end in "_total", and only they: a gauge named "..._total" ends in "_all"
 *     ("store_pages_total" -> "lazykv_store_pages_all");
 *   - histograms are NAME_bucket{le="..."} (cumulative, le in the base unit, then +Inf),
 *     NAME_sum and NAME_count;
 *   - labels "k=v,k2=v2" become {k="v",k2="v2"}; samples of one name are printed together
 *     under one # HELP and # TYPE line (the registry may interleave them).
 *
 * Exposure: off unless metrics_listen is set. The output names tenants and their hit counts, so
 * every request is authorised by the opts' authorize hook (lazykvd: as an Admin call, by
 * lkv_tenancy_check: an admin-role bearer token in "Authorization: Bearer <token>", or a
 * loopback peer when loopback_roles include admin); a refusal answers 401 (with
 * WWW-Authenticate: Bearer) or 403 and is counted. With a certificate and key the endpoint
 * speaks HTTPS only (libmicrohttpd over GnuTLS); the certificate is read at start. The daemon
 * refuses a non-loopback metrics address without tenants unless allow_insecure_bind is set
 * (lkv_config), as for the gRPC listener.
 *
 * Thread safety: the HTTP thread only iterates the registry (thread-safe); start and stop are
 * called from the main thread.
 */
#ifndef LKV_METRICS_H
#define LKV_METRICS_H

#include <stddef.h>

#include "lkv_stats.h"

typedef struct lkv_metrics lkv_metrics; /* Opaque: one HTTP endpoint. */

/* Renders the whole registry r (borrowed) in the exposition format. *out is malloc'ed and owned
 * by the caller (free), NUL-terminated; *len (may be NULL) gets its length. Returns 0. */
int lkv_metrics_render(lkv_stats *r, char **out, size_t *len);

/* Decides whether a request may read the metrics: authz is its Authorization header
 * (NUL-terminated, borrowed) or NULL, loopback 1 for a loopback peer, secure 1 over HTTPS.
 * Returns 0 to serve, LKV_EUNAUTH (401) or LKV_EPERM (403) with a message in err. Called from
 * the HTTP thread, possibly for several requests at once. */
typedef int (*lkv_metrics_authorize_fn)(void *ctx, const char *authz, int loopback, int secure,
                                        char *err, size_t errlen);

typedef struct lkv_metrics_opts {
    /* PEM of the server certificate (chain) and its private key, NUL-terminated, borrowed for
     * the call to lkv_metrics_start only; both NULL: plain HTTP. */
    const char *tls_cert_pem, *tls_key_pem;
    lkv_metrics_authorize_fn authorize; /* NULL: every request is served. */
    void *auth_ctx;                     /* Passed to authorize (borrowed until stop). */
} lkv_metrics_opts;

/* Starts the endpoint on listen ("127.0.0.1:9464", "[::1]:0", "localhost:0"; port 0 picks a
 * free port) serving r (borrowed until lkv_metrics_stop), with opts (may be NULL: plain HTTP,
 * no authorisation). *out is owned by the caller, released with lkv_metrics_stop. Returns 0,
 * LKV_EINVAL for an address that is not host:port (err says so), LKV_ENOTSUP for TLS when
 * libmicrohttpd was built without it, LKV_EIO if it cannot be bound or the certificate and key
 * are refused (err names the address). */
int lkv_metrics_start(lkv_stats *r, const char *listen, const lkv_metrics_opts *opts,
                      lkv_metrics **out, char *err, size_t errlen);

/* The bound address "host:port" with the real port (borrowed, valid until stop). */
const char *lkv_metrics_address(const lkv_metrics *m);

/* Scrapes answered so far, and requests refused by the authorize hook (for the log and tests). */
unsigned long lkv_metrics_scrapes(const lkv_metrics *m);
unsigned long lkv_metrics_refused(const lkv_metrics *m);

/* Stops the HTTP thread (waits for a scrape in progress) and frees m. m may be NULL. */
void lkv_metrics_stop(lkv_metrics *m);

#endif
