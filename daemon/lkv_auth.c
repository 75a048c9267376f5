/*
 * lkv_auth.c: the tenant table, bearer-token checks and the loopback rules (see lkv_auth.h).
 *
 * The table is a flat array of tenants searched linearly: every check touches every entry
 * anyway (constant-time comparison without early exit), and deployments have a handful of
 * tenants. Nothing here depends on gRPC: the RPC edge hands over the raw metadata value, the
 * peer string and the method name, and maps LKV_EUNAUTH / LKV_EPERM to gRPC status codes.
 *
 * Secrets: the presented token is hashed on the stack and that copy is wiped with
 * sodium_memzero before returning; the hashing key is wiped when the table is destroyed.
 * Error messages never echo a token.
 */
#include "lkv_auth.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <sodium.h>

#include "lkv_dockey.h"
#include "lkv_err.h"
#include "lkv_log.h"

_Static_assert(LKV_AUTH_SALT_BYTES == LKV_SALT_BYTES, "tenant salt size must match the store");

#define TOKEN_DOMAIN "lazykv-token-v1:"
#define ADDR_MAX     512 /* Longest listen address or peer string examined. */

struct lkv_auth {
    lkv_tenant *tenants;             /* n configured tenants, owned. */
    int n;                           /* Number of tenants. */
    int cap;                         /* Allocated entries. */
    int have_key;                    /* 1 if key is used for token hashes. */
    uint8_t key[LKV_AUTH_KEY_BYTES]; /* Hashing key (wiped on destroy). */
    lkv_tenant anon;                 /* The default tenant of anonymous loopback callers. */
};

static void seterr(char *err, int errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void seterr(char *err, int errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen <= 0) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(err, (size_t)errlen, fmt, ap);
    va_end(ap);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/* Parses exactly 2*n hex digits from s into out; returns 0 or -1 (out unspecified). */
static int parse_hex(const char *s, uint8_t *out, size_t n)
{
    if (strlen(s) != 2 * n) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        int hi = hexval((unsigned char)s[2 * i]), lo = hexval((unsigned char)s[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return -1;
        }
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* ASCII letters and digits only, whatever the locale. */
static int is_alnum(int c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static int name_ok(const char *name)
{
    size_t len = strlen(name);

    if (len == 0 || len >= LKV_TENANT_NAME_MAX) {
        return 0;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!is_alnum(c) && c != '.' && c != '_' && c != '-') {
            return 0;
        }
    }
    return 1;
}

/* ---- Helpers ------------------------------------------------------------------------------ */

void lkv_auth_tenant_salt(const char *name, uint8_t out[LKV_AUTH_SALT_BYTES])
{
    lkv_tenant_salt_derive(name, out);
}

int lkv_auth_hash_token(const uint8_t *key, const char *token, size_t len,
                        uint8_t out[LKV_AUTH_HASH_BYTES])
{
    crypto_generichash_state st;

    if (token == NULL || len == 0 || len > LKV_AUTH_TOKEN_MAX) {
        return LKV_EINVAL;
    }
    crypto_generichash_init(&st, key, key ? LKV_AUTH_KEY_BYTES : 0, LKV_AUTH_HASH_BYTES);
    crypto_generichash_update(&st, (const unsigned char *)TOKEN_DOMAIN, strlen(TOKEN_DOMAIN));
    crypto_generichash_update(&st, (const unsigned char *)token, len);
    crypto_generichash_final(&st, out, LKV_AUTH_HASH_BYTES);
    sodium_memzero(&st, sizeof(st));
    return 0;
}

int lkv_auth_token_new(char *out, size_t outlen)
{
    uint8_t raw[32];

    if (out == NULL || outlen < LKV_AUTH_TOKEN_NEW_BYTES || sodium_init() < 0) {
        return LKV_EINVAL;
    }
    randombytes_buf(raw, sizeof(raw));
    memcpy(out, "lkv_", 4);
    sodium_bin2base64(out + 4, outlen - 4, raw, sizeof(raw),
                      sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    sodium_memzero(raw, sizeof(raw));
    return 0;
}

int lkv_auth_hash_line(const uint8_t *key, const char *token, char *out, size_t outlen)
{
    uint8_t h[LKV_AUTH_HASH_BYTES];
    char hex[2 * LKV_AUTH_HASH_BYTES + 1];
    int rc;

    if (token == NULL || out == NULL) {
        return LKV_EINVAL;
    }
    rc = lkv_auth_hash_token(key, token, strlen(token), h);
    if (rc < 0) {
        return rc;
    }
    sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
    if ((size_t)snprintf(out, outlen, "token_hash = %s%s", LKV_AUTH_HASH_PREFIX, hex) >= outlen) {
        return LKV_EINVAL;
    }
    return 0;
}

static const struct {
    const char *name;
    uint32_t bit;
} roles[] = {
    {"data", LKV_ROLE_DATA},
    {"worker", LKV_ROLE_WORKER},
    {"admin", LKV_ROLE_ADMIN},
};

int lkv_auth_roles_parse(const char *s, uint32_t *mask, char *err, int errlen)
{
    uint32_t m = 0;
    const char *p = s;

    while (*p == ' ' || *p == '\t') {
        p++;
    }
    if (*p == '\0' || strcmp(p, "none") == 0) {
        *mask = 0;
        return 0;
    }
    for (;;) {
        const char *b, *e, *next;
        size_t i, len;

        while (*p == ' ' || *p == '\t') {
            p++;
        }
        b = p;
        next = strchr(p, ',');
        e = next ? next : p + strlen(p);
        p = e;
        while (e > b && (e[-1] == ' ' || e[-1] == '\t')) {
            e--;
        }
        len = (size_t)(e - b);
        for (i = 0; i < sizeof(roles) / sizeof(roles[0]); i++) {
            if (strlen(roles[i].name) == len && memcmp(roles[i].name, b, len) == 0) {
                m |= roles[i].bit;
                break;
            }
        }
        if (i == sizeof(roles) / sizeof(roles[0])) {
            seterr(err, errlen, "unknown role \"%.*s\" (roles: data, worker, admin)",
                   (int)(len > 32 ? 32 : len), b);
            return LKV_EINVAL;
        }
        if (next == NULL) {
            break;
        }
        p = next + 1;
    }
    *mask = m;
    return 0;
}

void lkv_auth_roles_format(uint32_t mask, char *out, size_t outlen)
{
    size_t used = 0;

    if (outlen == 0) {
        return;
    }
    out[0] = '\0';
    for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++) {
        if (mask & roles[i].bit) {
            int n = snprintf(out + used, outlen - used, "%s%s", used ? "," : "", roles[i].name);
            if (n < 0 || (size_t)n >= outlen - used) {
                return;
            }
            used += (size_t)n;
        }
    }
    if (used == 0) {
        snprintf(out, outlen, "none");
    }
}

/* Copies s into buf (size ADDR_MAX), decoding %XX escapes. Returns 0 or -1 (too long/bad). */
static int unescape(const char *s, char *buf)
{
    size_t j = 0;

    for (size_t i = 0; s[i] != '\0'; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            int hi = hexval((unsigned char)s[i + 1]);
            int lo = hi < 0 ? -1 : hexval((unsigned char)s[i + 2]);
            if (hi < 0 || lo < 0) {
                return -1;
            }
            c = hi << 4 | lo;
            i += 2;
        }
        if (j + 1 >= ADDR_MAX) {
            return -1;
        }
        buf[j++] = (char)c;
    }
    buf[j] = '\0';
    return 0;
}

/* Returns 1 if host (no brackets, no port) is "localhost" or a loopback IPv4/IPv6 address. */
static int host_is_loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;

    if (strcasecmp(host, "localhost") == 0 || strcasecmp(host, "localhost.") == 0) {
        return 1;
    }
    if (inet_pton(AF_INET, host, &a4) == 1) {
        return (ntohl(a4.s_addr) >> 24) == 127;
    }
    if (inet_pton(AF_INET6, host, &a6) == 1) {
        if (IN6_IS_ADDR_LOOPBACK(&a6)) {
            return 1;
        }
        return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
    }
    return 0;
}

/* Shared by peers and listen addresses: "[scheme:]host:port" or "[scheme:][v6]:port". */
static int addr_is_loopback(const char *s)
{
    char buf[ADDR_MAX], host[ADDR_MAX];
    const char *p;
    size_t hl;

    if (s == NULL || unescape(s, buf) < 0) {
        return 0;
    }
    p = buf;
    if (strncmp(p, "unix:", 5) == 0 || strncmp(p, "unix-abstract:", 14) == 0) {
        return 1; /* A local socket: only processes on this host can connect. */
    }
    if (strncmp(p, "ipv4:", 5) == 0 || strncmp(p, "ipv6:", 5) == 0) {
        p += 5;
    } else if (strncmp(p, "dns:///", 7) == 0) {
        p += 7;
    } else if (strncmp(p, "dns:", 4) == 0) {
        p += 4;
    }
    if (*p == '[') {
        const char *close = strchr(p, ']');
        if (close == NULL) {
            return 0;
        }
        hl = (size_t)(close - p - 1);
        memcpy(host, p + 1, hl);
    } else {
        const char *colon = strrchr(p, ':');
        if (colon == NULL || strchr(p, ':') != colon) {
            hl = strlen(p); /* No port, or a bare IPv6 address: all of it is the host. */
        } else {
            hl = (size_t)(colon - p);
        }
        memcpy(host, p, hl);
    }
    host[hl] = '\0';
    return hl > 0 && host_is_loopback(host);
}

int lkv_auth_peer_is_loopback(const char *peer)
{
    return addr_is_loopback(peer);
}

int lkv_auth_addr_is_loopback(const char *addr)
{
    return addr_is_loopback(addr);
}

int lkv_auth_check_bind(const char *addr, int have_tenants, int allow_insecure, char *err,
                        int errlen)
{
    if (addr_is_loopback(addr) || have_tenants || allow_insecure) {
        return 0;
    }
    seterr(err, errlen,
           "refusing to listen on non-loopback address \"%.200s\" without tenants: anyone who "
           "can reach it could read and write the cache; add [tenant NAME] sections with "
           "token_hash and roles, or set allow_insecure_bind = true to accept the risk",
           addr ? addr : "(null)");
    return LKV_ECONFIG;
}

uint32_t lkv_auth_method_roles(const char *method, size_t len)
{
    static const struct {
        const char *m;
        uint32_t need;
    } exact[] = {
        {"/lazykv.v1.Cache/Put", LKV_ROLE_DATA},      {"/lazykv.v1.Cache/Lookup", LKV_ROLE_DATA},
        {"/lazykv.v1.Cache/Get", LKV_ROLE_DATA},      {"/lazykv.v1.Cache/Delete", LKV_ROLE_DATA},
        {"/lazykv.v1.Cache/Attach", LKV_ROLE_WORKER}, {"/lazykv.v1.Cache/Release", LKV_ROLE_WORKER},
        {"/lazykv.v1.Cache/Cluster", LKV_ROLE_DATA},
    };
    static const char health[] = "/grpc.health.v1.Health/";
    static const char admin[] = "/lazykv.v1.Admin/";

    if (method == NULL) {
        return LKV_ROLE_ADMIN;
    }
    for (size_t i = 0; i < sizeof(exact) / sizeof(exact[0]); i++) {
        if (strlen(exact[i].m) == len && memcmp(exact[i].m, method, len) == 0) {
            return exact[i].need;
        }
    }
    if (len > sizeof(health) - 1 && memcmp(method, health, sizeof(health) - 1) == 0) {
        return 0;
    }
    if (len > sizeof(admin) - 1 && memcmp(method, admin, sizeof(admin) - 1) == 0) {
        return LKV_ROLE_ADMIN;
    }
    return LKV_ROLE_ADMIN; /* Unknown: fail closed. */
}

/* ---- Tenant entries ----------------------------------------------------------------------- */

int lkv_tenant_init(lkv_tenant *t, const char *name, char *err, int errlen)
{
    memset(t, 0, sizeof(*t));
    if (name == NULL || !name_ok(name)) {
        seterr(err, errlen, "tenant \"%.80s\": name must be 1..%d characters of [A-Za-z0-9._-]",
               name ? name : "", LKV_TENANT_NAME_MAX - 1);
        return LKV_ECONFIG;
    }
    if (strcmp(name, LKV_AUTH_DEFAULT_TENANT) == 0) {
        seterr(err, errlen,
               "tenant \"%s\": name is reserved for anonymous loopback callers; pick another",
               name);
        return LKV_ECONFIG;
    }
    snprintf(t->name, sizeof(t->name), "%s", name);
    lkv_auth_tenant_salt(name, t->salt);
    return 0;
}

/* A limit: digits with an optional binary suffix, or "unlimited"/"none" (0). 0 or -1. */
static int parse_limit(const char *s, uint64_t *out)
{
    if (strcmp(s, "unlimited") == 0 || strcmp(s, "none") == 0) {
        *out = 0;
        return 0;
    }
    if (*s < '0' || *s > '9') {
        return -1;
    }
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0) {
        return -1;
    }
    while (*end == ' ') {
        end++;
    }
    static const struct {
        const char *suf;
        int shift;
    } units[] = {{"", 0},   {"k", 10},   {"kib", 10}, {"m", 20},  {"mib", 20},
                 {"g", 30}, {"gib", 30}, {"t", 40},   {"tib", 40}};
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(end, units[i].suf) == 0) {
            if (units[i].shift > 0 && v > (UINT64_MAX >> units[i].shift)) {
                return -1;
            }
            *out = (uint64_t)v << units[i].shift;
            return 0;
        }
    }
    return -1;
}

int lkv_tenant_set(lkv_tenant *t, const char *key, const char *value, char *err, int errlen)
{
    char why[160];

    assert(t->name[0] != '\0');
    if (key == NULL || value == NULL) {
        seterr(err, errlen, "tenant \"%s\": missing key or value", t->name);
        return LKV_ECONFIG;
    }
    if (strcmp(key, "token_hash") == 0) {
        const char *hex = value;
        if (t->t_have_hash) {
            seterr(err, errlen, "tenant \"%s\": token_hash: given twice", t->name);
            return LKV_ECONFIG;
        }
        if (value[0] == '$') {
            seterr(err, errlen,
                   "tenant \"%s\": token_hash: crypto_pwhash strings are not supported; use "
                   "\"%s<64 hex digits>\" (python3 -m lazykv.tenant new NAME)",
                   t->name, LKV_AUTH_HASH_PREFIX);
            return LKV_ECONFIG;
        }
        if (strncmp(hex, LKV_AUTH_HASH_PREFIX, strlen(LKV_AUTH_HASH_PREFIX)) == 0) {
            hex += strlen(LKV_AUTH_HASH_PREFIX);
        }
        if (parse_hex(hex, t->token_hash, LKV_AUTH_HASH_BYTES) < 0) {
            seterr(err, errlen,
                   "tenant \"%s\": token_hash: expected \"%s\" and 64 hex digits, got %zu "
                   "characters",
                   t->name, LKV_AUTH_HASH_PREFIX, strlen(value));
            return LKV_ECONFIG;
        }
        t->t_have_hash = 1;
        return 0;
    }
    if (strcmp(key, "roles") == 0) {
        uint32_t m;
        if (t->t_have_roles) {
            seterr(err, errlen, "tenant \"%s\": roles: given twice", t->name);
            return LKV_ECONFIG;
        }
        if (lkv_auth_roles_parse(value, &m, why, sizeof(why)) < 0) {
            seterr(err, errlen, "tenant \"%s\": roles: %s", t->name, why);
            return LKV_ECONFIG;
        }
        if (m == 0) {
            seterr(err, errlen,
                   "tenant \"%s\": roles: a tenant needs at least one of data, worker, admin",
                   t->name);
            return LKV_ECONFIG;
        }
        t->roles = m;
        t->t_have_roles = 1;
        return 0;
    }
    if (strcmp(key, "salt") == 0) {
        if (parse_hex(value, t->salt, LKV_AUTH_SALT_BYTES) < 0) {
            seterr(err, errlen, "tenant \"%s\": salt: expected 64 hex digits, got %zu characters",
                   t->name, strlen(value));
            return LKV_ECONFIG;
        }
        return 0;
    }
    static const struct {
        const char *name;
        size_t off;
    } limits[] = {{"max_hot_bytes", offsetof(lkv_tenant, max_hot_bytes)},
                  {"max_cold_bytes", offsetof(lkv_tenant, max_cold_bytes)},
                  {"max_docs", offsetof(lkv_tenant, max_docs)},
                  {"rate_calls", offsetof(lkv_tenant, rate_calls)},
                  {"rate_bytes", offsetof(lkv_tenant, rate_bytes)}};
    for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
        if (strcmp(key, limits[i].name) == 0) {
            uint64_t v;
            if (parse_limit(value, &v) != 0) {
                seterr(err, errlen,
                       "tenant \"%s\": %s: expected a number with an optional K/KiB, M/MiB, "
                       "G/GiB or T/TiB suffix, or unlimited; got \"%.40s\"",
                       t->name, key, value);
                return LKV_ECONFIG;
            }
            memcpy((char *)t + limits[i].off, &v, sizeof(v));
            return 0;
        }
    }
    seterr(err, errlen,
           "tenant \"%s\": unknown field \"%.40s\" (fields: token_hash, roles, salt, "
           "max_hot_bytes, max_cold_bytes, max_docs, rate_calls, rate_bytes)",
           t->name, key);
    return LKV_ECONFIG;
}

int lkv_tenant_finish(const lkv_tenant *t, char *err, int errlen)
{
    if (!t->t_have_hash) {
        seterr(err, errlen,
               "tenant \"%s\": token_hash: missing (make one: python3 -m lazykv.tenant new %s)",
               t->name, t->name);
        return LKV_ECONFIG;
    }
    if (!t->t_have_roles) {
        seterr(err, errlen, "tenant \"%s\": roles: missing (a comma list of data, worker, admin)",
               t->name);
        return LKV_ECONFIG;
    }
    return 0;
}

int lkv_tenant_parse(const char *name, const char *const *keys, const char *const *values, int n,
                     lkv_tenant *out, char *err, int errlen)
{
    int rc = lkv_tenant_init(out, name, err, errlen);

    for (int i = 0; rc == 0 && i < n; i++) {
        rc = lkv_tenant_set(out, keys[i], values[i], err, errlen);
    }
    return rc == 0 ? lkv_tenant_finish(out, err, errlen) : rc;
}

/* ---- The table ---------------------------------------------------------------------------- */

int lkv_auth_create(const uint8_t *key, uint32_t loopback_roles, lkv_auth **out)
{
    lkv_auth *a;

    if (sodium_init() < 0) {
        return LKV_EINTERNAL;
    }
    a = lkv_xcalloc(1, sizeof(*a));
    if (key != NULL) {
        memcpy(a->key, key, LKV_AUTH_KEY_BYTES);
        a->have_key = 1;
    }
    snprintf(a->anon.name, sizeof(a->anon.name), "%s", LKV_AUTH_DEFAULT_TENANT);
    lkv_tenant_salt_default(a->anon.salt); /* The store's default tenant. */
    a->anon.roles = loopback_roles & LKV_ROLE_ALL;
    *out = a;
    return 0;
}

void lkv_auth_destroy(lkv_auth *a)
{
    if (a == NULL) {
        return;
    }
    if (a->tenants != NULL) {
        sodium_memzero(a->tenants, (size_t)a->cap * sizeof(*a->tenants));
        free(a->tenants);
    }
    sodium_memzero(a, sizeof(*a));
    free(a);
}

int lkv_auth_add(lkv_auth *a, const lkv_tenant *t, char *err, int errlen)
{
    if (lkv_tenant_finish(t, err, errlen) < 0) {
        return LKV_ECONFIG;
    }
    if (strcmp(t->name, LKV_AUTH_DEFAULT_TENANT) == 0) {
        seterr(err, errlen, "tenant \"%s\": name is reserved", t->name);
        return LKV_ECONFIG;
    }
    for (int i = 0; i < a->n; i++) {
        if (strcmp(a->tenants[i].name, t->name) == 0) {
            seterr(err, errlen, "tenant \"%s\": defined twice", t->name);
            return LKV_ECONFIG;
        }
        if (sodium_memcmp(a->tenants[i].token_hash, t->token_hash, LKV_AUTH_HASH_BYTES) == 0) {
            seterr(err, errlen, "tenant \"%s\": token_hash: same token as tenant \"%s\"", t->name,
                   a->tenants[i].name);
            return LKV_ECONFIG;
        }
    }
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 8;
        a->tenants = lkv_xrealloc(a->tenants, (size_t)a->cap * sizeof(*a->tenants));
    }
    a->tenants[a->n++] = *t;
    return 0;
}

int lkv_auth_count(const lkv_auth *a)
{
    return a->n;
}

const lkv_tenant *lkv_auth_default_tenant(const lkv_auth *a)
{
    return &a->anon;
}

int lkv_auth_index(const lkv_auth *a, const lkv_tenant *t)
{
    if (t == &a->anon) {
        return 0;
    }
    assert(t >= a->tenants && t < a->tenants + a->n);
    return (int)(t - a->tenants) + 1;
}

const lkv_tenant *lkv_auth_find(const lkv_auth *a, const char *name)
{
    for (int i = 0; i < a->n; i++) {
        if (strcmp(a->tenants[i].name, name) == 0) {
            return &a->tenants[i];
        }
    }
    return NULL;
}

/* RFC 6750 token68: 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=" */
static int is_token68(const char *s, size_t len)
{
    size_t i = 0;

    while (i < len && s[i] != '\0' &&
           (is_alnum((unsigned char)s[i]) || strchr("-._~+/", s[i]) != NULL)) {
        i++;
    }
    if (i == 0) {
        return 0;
    }
    while (i < len && s[i] == '=') {
        i++;
    }
    return i == len;
}

int lkv_auth_check(const lkv_auth *a, const char *authz, size_t authz_len, int loopback,
                   uint32_t need, const lkv_tenant **out, char *err, int errlen)
{
    static const char scheme[] = "Bearer";
    const size_t sl = sizeof(scheme) - 1;
    uint8_t h[LKV_AUTH_HASH_BYTES];
    const char *tok;
    size_t toklen, found = SIZE_MAX;
    const lkv_tenant *t;

    *out = NULL;
    if (need == 0) {
        /* Health: open to all, no header needed (and a header is not even looked at). */
        *out = &a->anon;
        return 0;
    }
    if (authz == NULL) {
        if (!loopback || a->anon.roles == 0) {
            seterr(err, errlen,
                   "missing credentials: send metadata \"authorization: Bearer <token>\"%s",
                   loopback ? " (this daemon requires tokens on loopback too)" : "");
            return LKV_EUNAUTH;
        }
        t = &a->anon;
        goto authorise;
    }
    if (authz_len <= sl || strncasecmp(authz, scheme, sl) != 0 || authz[sl] != ' ') {
        seterr(err, errlen, "malformed authorization metadata: expected \"Bearer <token>\"");
        return LKV_EUNAUTH;
    }
    tok = authz + sl;
    toklen = authz_len - sl;
    while (toklen > 0 && *tok == ' ') {
        tok++;
        toklen--;
    }
    if (toklen == 0 || toklen > LKV_AUTH_TOKEN_MAX || !is_token68(tok, toklen)) {
        seterr(err, errlen,
               "malformed authorization metadata: the bearer token must be 1..%d characters of "
               "[A-Za-z0-9-._~+/] then optional '='",
               LKV_AUTH_TOKEN_MAX);
        return LKV_EUNAUTH;
    }
    lkv_auth_hash_token(a->have_key ? a->key : NULL, tok, toklen, h);
    /* Compare with every tenant in constant time; no early exit, no data-dependent branch. */
    for (size_t i = 0; i < (size_t)a->n; i++) {
        size_t eq = (size_t)(crypto_verify_32(h, a->tenants[i].token_hash) + 1); /* 1 if equal */
        size_t mask = (size_t)0 - eq;
        found = (found & ~mask) | (i & mask);
    }
    sodium_memzero(h, sizeof(h));
    if (found == SIZE_MAX) {
        seterr(err, errlen, "invalid bearer token");
        return LKV_EUNAUTH;
    }
    t = &a->tenants[found];
authorise:
    *out = t;
    if ((t->roles & need) != need) {
        char have[32], want[32];
        lkv_auth_roles_format(t->roles, have, sizeof(have));
        lkv_auth_roles_format(need & ~t->roles, want, sizeof(want));
        seterr(err, errlen, "tenant \"%s\" lacks role %s (has: %s)", t->name, want, have);
        return LKV_EPERM;
    }
    return 0;
}
