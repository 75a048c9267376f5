/*
 * lkv_config.c: lazykvd configuration (see lkv_config.h for the format and precedence).
 *
 * Daemon options are one table (opts[]): name, kind, where the value lives, bounds, default
 * text and help. The same table drives parsing, --help and the option list in error messages,
 * so an option cannot exist in one place and not another. Profile fields are a second table
 * (pfields[]). Parsing is strict: trailing junk, out-of-range values and unknown keys are
 * errors naming the option; the struct is only written once a value has fully parsed.
 */
#include "lkv_config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_arena.h"
#include "lkv_policy.h"

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define GIB (1024ull * MIB)
#define TIB (1024ull * GIB)

/* ---- Value parsers: each returns 0 or -1 and writes a reason on failure. ---------------- */

static int parse_u64(const char *s, uint64_t *out)
{
    if (!isdigit((unsigned char)s[0])) {
        return -1;
    }
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0') {
        return -1;
    }
    *out = v;
    return 0;
}

/* Sizes: digits, optional fraction, optional suffix K/KiB/M/MiB/G/GiB/T/TiB/B. */
static int parse_size(const char *s, uint64_t *out)
{
    if (!isdigit((unsigned char)s[0])) {
        return -1;
    }
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || !isfinite(v) || v < 0) {
        return -1;
    }
    while (*end == ' ') {
        end++;
    }
    static const struct {
        const char *suf;
        uint64_t mul;
    } units[] = {{"", 1},      {"b", 1},   {"k", KIB},   {"kib", KIB}, {"m", MIB},
                 {"mib", MIB}, {"g", GIB}, {"gib", GIB}, {"t", TIB},   {"tib", TIB}};
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(end, units[i].suf) == 0) {
            double b = v * (double)units[i].mul;
            if (b > 18e18 || b != floor(b)) {
                return -1;
            }
            *out = (uint64_t)b;
            return 0;
        }
    }
    return -1;
}

/* Durations: a number with suffix ms, s or m (bare numbers are milliseconds). */
static int parse_duration_ms(const char *s, uint64_t *out)
{
    if (!isdigit((unsigned char)s[0])) {
        return -1;
    }
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || !isfinite(v) || v < 0) {
        return -1;
    }
    double mul;
    if (*end == '\0' || strcmp(end, "ms") == 0) {
        mul = 1;
    } else if (strcmp(end, "s") == 0) {
        mul = 1000;
    } else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0) {
        mul = 60000;
    } else {
        return -1;
    }
    double ms = v * mul;
    if (ms > 1e15) {
        return -1;
    }
    *out = (uint64_t)llround(ms);
    return 0;
}

static int parse_double(const char *s, double *out)
{
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v)) {
        return -1;
    }
    *out = v;
    return 0;
}

/* Looks s up in a NULL-terminated list of names; returns the index or -1. */
static int parse_name(const char *s, const char *const *names)
{
    for (int i = 0; names[i] != NULL; i++) {
        if (strcasecmp(s, names[i]) == 0) {
            return i;
        }
    }
    return -1;
}

char *lkv_format_bytes(uint64_t n, char *buf, size_t len)
{
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int i = 0;
    double v = (double)n;
    while (v >= 1024.0 && i < 5) {
        v /= 1024.0;
        i++;
    }
    if (i == 0) {
        snprintf(buf, len, "%" PRIu64 " B", n);
    } else {
        snprintf(buf, len, "%.1f %s", v, u[i]);
    }
    return buf;
}

/* ---- Daemon options ------------------------------------------------------------------ */

enum opt_kind {
    OPT_STRING,   /* char array, size in `size`. */
    OPT_LIST,     /* char array, size in `size`: a comma-separated list, may be empty. */
    OPT_OPTSTR,   /* char array that may be unset: "", "none" or "off" store "". */
    OPT_SIZE,     /* uint64_t bytes. */
    OPT_INT,      /* int in [min, max]. */
    OPT_U32,      /* uint32_t in [min, max]. */
    OPT_DURATION, /* uint64_t milliseconds. */
    OPT_BACKEND,  /* int, enum lkv_hot_backend. */
    OPT_POLICY,   /* int, enum lkv_policy_kind. */
    OPT_COST,     /* int, 0 documents / 1 bytes. */
    OPT_CORRUPT,  /* int, enum lkv_cold_on_corruption (refuse / reset). */
    OPT_DURABLE,  /* int, enum lkv_durability. */
    OPT_ADMIT,    /* int, enum lkv_hot_admission. */
    OPT_STAGING,  /* int, enum lkv_get_staging. */
    OPT_LOGLEVEL, /* int, enum lkv_log_level. */
    OPT_ROLES,    /* uint32_t, enum lkv_role mask. */
    OPT_BOOL,     /* int, 0 or 1. */
    OPT_AUTHKEY,  /* auth_key + have_auth_key: 64 hex digits, or "none". */
};

typedef struct opt {
    const char *name; /* Option key. */
    int kind;         /* enum opt_kind. */
    size_t off;       /* Offset in lkv_config. */
    size_t size;      /* OPT_STRING, OPT_LIST: array size. */
    uint64_t min;     /* Numeric bounds (inclusive); OPT_STRING: 1 = may be empty. */
    uint64_t max;
    const char *def;  /* Default, as text (what lkv_config_defaults sets). */
    const char *help; /* One line, with the unit. */
} opt;

#define OFF(f) offsetof(lkv_config, f)

static const opt opts[] = {
    {"listen", OPT_STRING, OFF(listen), sizeof(((lkv_config *)0)->listen), 0, 0, "127.0.0.1:7070",
     "address to serve gRPC on, host:port (port 0 picks a free port)"},
    {"data_dir", OPT_STRING, OFF(data_dir), sizeof(((lkv_config *)0)->data_dir), 0, 0,
     "./data/lazykvd", "cold tier (RocksDB) directory, created if absent"},
    {"hot_backend", OPT_BACKEND, OFF(hot_backend), 0, 0, 0, "auto",
     "hot tier memory: auto (CUDA if a GPU is present, else host), host, cuda"},
    {"hot_bytes", OPT_SIZE, OFF(hot_bytes), 0, 1, UINT64_MAX, "1GiB",
     "hot tier budget (the arena, allocated at start), bytes"},
    {"cuda_device", OPT_INT, OFF(cuda_device), 0, 0, 1024, "0",
     "CUDA device ordinal of the hot arena"},
    {"cold_bytes", OPT_SIZE, OFF(cold_bytes), 0, 0, UINT64_MAX, "16GiB",
     "cold tier budget, bytes of block payload (0 = unlimited)"},
    {"policy", OPT_POLICY, OFF(policy_kind), 0, 0, 0, "adaptive",
     "eviction policy of both tiers: lru, gdsf, lfuda, tinylfu, tlfu-gdsf, adaptive"},
    {"policy_cost", OPT_COST, OFF(policy_cost_bytes), 0, 0, 0, "documents",
     "what gdsf and adaptive optimise: documents (document hit rate) or bytes (byte hit rate)"},
    {"durability", OPT_DURABLE, OFF(durability), 0, 0, 0, "write-back",
     "write-back (ack when hot, persist in background) or write-through (ack when durable)"},
    {"hot_admission", OPT_ADMIT, OFF(hot_admission), 0, 0, 0, "door",
     "new documents into the hot tier: door (only if the policy's admission filter accepts "
     "them, as bench/hitrate simulates; else cold only or declined), or always (evicting)"},
    {"get_staging", OPT_STAGING, OFF(get_staging), 0, 0, 0, "auto",
     "Get of a CUDA arena: auto (through the pinned staging ring), off (a blocking copy into "
     "a per-call buffer, packed), always (the ring for a host arena too: tests, benchmarks)"},
    {"get_stage_slots", OPT_U32, OFF(get_stage_slots), 0, 1, 65536, "64",
     "slots of the Get staging ring (each one message: max(1MiB, the largest block), pinned)"},
    {"get_stage_wait", OPT_DURATION, OFF(get_stage_wait_ms), 0, 0, 3600000, "200ms",
     "a Get message waiting this long for a staging slot is sent by the copying path (0 = "
     "wait until a slot frees or the deadline), ms"},
    {"get_stage_streams", OPT_INT, OFF(get_stage_streams), 0, 1, 16, "1",
     "CUDA streams the Get staging copies are spread over (each message on one), 1..16"},
    {"threads", OPT_INT, OFF(threads), 0, 1, 256, "2",
     "gRPC polling threads (each with its own completion queue)"},
    {"pool_threads", OPT_INT, OFF(pool_threads), 0, 0, 256, "4",
     "worker threads for blocking RocksDB work of whole documents (0 = on the polling threads)"},
    {"max_message_bytes", OPT_SIZE, OFF(max_message_bytes), 0, 4096, 2047ull * MIB, "64MiB",
     "largest gRPC message received or sent, bytes (clients must allow as much)"},
    {"max_request_bytes", OPT_SIZE, OFF(max_request_bytes), 0, 4096, 2047ull * MIB, "4MiB",
     "largest Lookup or Attach request, bytes (Put: max_message_bytes; Get, Delete: one "
     "document's worth; admin and health calls: 64KiB)"},
    {"max_lookup_docs", OPT_U32, OFF(max_lookup_docs), 0, 1, 1u << 20, "65536",
     "documents one Lookup may name"},
    {"max_connections", OPT_U32, OFF(max_connections), 0, 0, 1u << 24, "0",
     "client connections open at once (0 = the descriptor limit minus 256, at least 16)"},
    {"max_connections_per_peer", OPT_U32, OFF(max_connections_per_peer), 0, 0, 1u << 24, "1024",
     "client connections open at once from one IP address (0 = no cap)"},
    {"max_calls_per_peer", OPT_U32, OFF(max_calls_per_peer), 0, 0, 1u << 24, "4096",
     "calls in flight at once from one IP address, every listener (0 = no cap; Health exempt)"},
    {"tls_max_streams", OPT_U32, OFF(tls_max_streams), 0, 0, 1u << 24, "1024",
     "TLS listeners: HTTP/2 streams (calls) open at once on one connection (0 = gRPC's default)"},
    {"tls_handshake_timeout", OPT_DURATION, OFF(tls_handshake_timeout_ms), 0, 0, 3600000, "10s",
     "TLS listeners: a connection that has not finished its handshake by then is closed (0 = "
     "gRPC's default, 120s)"},
    {"tls_idle_timeout", OPT_DURATION, OFF(tls_idle_timeout_ms), 0, 0, 86400000, "30m",
     "TLS listeners: a connection with no call for this long is closed with GOAWAY (0 = never)"},
    {"grpc_listener", OPT_BOOL, OFF(grpc_listener), 0, 0, 0, "false",
     "accept with gRPC's own listener (no caps, no recovery from descriptor exhaustion)"},
    {"log_level", OPT_LOGLEVEL, OFF(log_level), 0, 0, 0, "info", "debug, info, warn, error"},
    {"shutdown_grace", OPT_DURATION, OFF(shutdown_grace_ms), 0, 0, 3600000, "5s",
     "on SIGTERM/SIGINT, time in-flight calls get to finish before they are cancelled"},
    {"evicted_memory", OPT_U32, OFF(evicted_memory), 0, 0, 1u << 30, "65536",
     "evicted or deleted keys remembered to report miss causes (0 = 65536)"},
    {"cold_min_blob_bytes", OPT_SIZE, OFF(cold_min_blob_bytes), 0, 0, GIB, "64KiB",
     "RocksDB min_blob_size: values at least this big go to blob files, bytes"},
    {"cold_min_free_bytes", OPT_SIZE, OFF(cold_min_free_bytes), 0, 1 * MIB, UINT64_MAX, "256MiB",
     "disk headroom under data_dir: cold writes stop (puts stay hot or get RESOURCE_EXHAUSTED) "
     "before less is free, bytes"},
    {"cold_on_corruption", OPT_CORRUPT, OFF(cold_on_corruption), 0, 0, 0, "refuse",
     "a damaged cold database at start: refuse (log the file and the fix, exit) or reset "
     "(move it aside, start empty; a damaged WAL keeps what precedes the damage)"},
    {"wb_wal", OPT_BOOL, OFF(wb_wal), 0, 0, 0, "true",
     "write-back: the writer writes through RocksDB's WAL (true), or without it (false: each "
     "byte written once; a document counts as persisted only once the writer flushed its "
     "memtable; deletes keep the WAL)"},
    {"wb_max_backlog_bytes", OPT_SIZE, OFF(wb_max_backlog_bytes), 0, 0, UINT64_MAX, "256MiB",
     "write-back: bound of the unpersisted backlog (what a crash can lose); puts beyond it "
     "wait for the writer within their deadline, bytes (0 = unbounded)"},
    {"loopback_roles", OPT_ROLES, OFF(loopback_roles), 0, 0, 0, "data,worker,admin",
     "roles of callers on loopback without a token: data, worker, admin, or none"},
    {"allow_insecure_bind", OPT_BOOL, OFF(allow_insecure_bind), 0, 0, 0, "false",
     "serve a non-loopback listen address even without [tenant NAME] sections"},
    {"auth_key", OPT_AUTHKEY, OFF(auth_key), 0, 0, 0, "none",
     "64 hex digits keying the tenants' token hashes, or none"},
    {"metrics_listen", OPT_OPTSTR, OFF(metrics_listen), sizeof(((lkv_config *)0)->metrics_listen),
     0, 0, "none",
     "Prometheus metrics endpoint host:port (GET /metrics; port 0 picks one), or none"},
    {"metrics_tls", OPT_BOOL, OFF(metrics_tls), 0, 0, 0, "false",
     "serve the metrics over HTTPS with tls_cert_file and tls_key_file"},
    {"tls_cert_file", OPT_OPTSTR, OFF(tls_cert_file), sizeof(((lkv_config *)0)->tls_cert_file), 0,
     0, "none", "server certificate chain (PEM) for gRPC TLS, or none (plaintext)"},
    {"tls_key_file", OPT_OPTSTR, OFF(tls_key_file), sizeof(((lkv_config *)0)->tls_key_file), 0, 0,
     "none", "private key (PEM) of tls_cert_file"},
    {"tls_client_ca_file", OPT_OPTSTR, OFF(tls_client_ca_file),
     sizeof(((lkv_config *)0)->tls_client_ca_file), 0, 0, "none",
     "CA bundle (PEM): when set, clients must present a certificate it signed"},
    {"allow_plaintext_tokens", OPT_BOOL, OFF(allow_plaintext_tokens), 0, 0, 0, "false",
     "accept bearer tokens on plaintext calls from non-loopback peers"},
    {"max_leases", OPT_U32, OFF(max_leases), 0, 1, 1u << 20, "1024",
     "zero-copy leases (Attach) live at once, all tenants"},
    {"max_lease_docs", OPT_U32, OFF(max_lease_docs), 0, 1, 1u << 20, "1024",
     "documents one lease may pin"},
    {"max_lease_ttl", OPT_DURATION, OFF(max_lease_ttl_ms), 0, 1, 86400000, "60s",
     "longest lease an Attach may ask for (renew by attaching again), ms"},
    {"hold_profiles", OPT_LIST, OFF(hold_profiles), sizeof(((lkv_config *)0)->hold_profiles), 0, 0,
     "", "profiles whose documents are held hot (never evicted), comma-separated"},
    {"hold_tenants", OPT_LIST, OFF(hold_tenants), sizeof(((lkv_config *)0)->hold_tenants), 0, 0, "",
     "tenants whose documents are held hot (never evicted), comma-separated"},
    /* Cluster (daemon/cluster/lkv_cluster.h). */
    {"cluster_mode", OPT_STRING, OFF(cluster_mode), sizeof(((lkv_config *)0)->cluster_mode), 0, 0,
     "none", "cluster membership: none, etcd, static (cluster_members) or dns (cluster_dns)"},
    {"cluster_id", OPT_STRING, OFF(cluster_id), sizeof(((lkv_config *)0)->cluster_id), 1, 0, "",
     "this member's unique id (empty: its advertised address)"},
    {"cluster_advertise", OPT_STRING, OFF(cluster_advertise),
     sizeof(((lkv_config *)0)->cluster_advertise), 1, 0, "",
     "host:port other members and clients reach this daemon at (empty: the bound address)"},
    {"cluster_etcd", OPT_STRING, OFF(cluster_etcd), sizeof(((lkv_config *)0)->cluster_etcd), 1, 0,
     "", "etcd v3 gRPC endpoints, host:port[,host:port] (cluster_mode etcd)"},
    {"cluster_prefix", OPT_STRING, OFF(cluster_prefix), sizeof(((lkv_config *)0)->cluster_prefix),
     0, 0, "/lazykv/members/", "etcd key prefix of the member records (ends with /)"},
    {"cluster_lease_ttl", OPT_DURATION, OFF(cluster_lease_ttl_ms), 0, 2000, 3600000, "10s",
     "etcd lease TTL of this member's record (a dead member leaves after it), ms"},
    {"cluster_members", OPT_STRING, OFF(cluster_members),
     sizeof(((lkv_config *)0)->cluster_members), 1, 0, "",
     "static member list host:port[=hot_bytes],... (cluster_mode static)"},
    {"cluster_dns", OPT_STRING, OFF(cluster_dns), sizeof(((lkv_config *)0)->cluster_dns), 1, 0, "",
     "name:port resolved to the members, e.g. a headless Service (cluster_mode dns)"},
    {"cluster_dns_refresh", OPT_DURATION, OFF(cluster_dns_refresh_ms), 0, 100, 3600000, "5s",
     "how often cluster_dns is resolved again, ms"},
    {"cluster_health_interval", OPT_DURATION, OFF(cluster_health_interval_ms), 0, 10, 600000,
     "500ms", "period of the grpc.health.v1 probe of every other member, ms"},
    {"cluster_down_after", OPT_DURATION, OFF(cluster_down_after_ms), 0, 20, 3600000, "2s",
     "a member that has not answered for this long is marked down (its share moves), ms"},
    {"cluster_token_file", OPT_STRING, OFF(cluster_token_file),
     sizeof(((lkv_config *)0)->cluster_token_file), 1, 0, "",
     "file with the bearer token of cluster-internal calls (same on every member; required)"},
    {"wirekey_secret_file", OPT_STRING, OFF(wirekey_secret_file),
     sizeof(((lkv_config *)0)->wirekey_secret_file), 1, 0, "",
     "shared wire-key secret (64 hex digits) used instead of DATA_DIR/wirekey.secret"},
    {"cluster_replica_ttl", OPT_DURATION, OFF(cluster_replica_ttl_ms), 0, 0, 86400000, "60s",
     "an Attach of a document another member owns keeps a local replica this long (0: none)"},
};
#define N_OPTS ((int)(sizeof(opts) / sizeof(opts[0])))

static const char *const backend_names[] = {"auto", "host", "cuda", NULL};
static const char *const cost_names[] = {"documents", "bytes", NULL};
static const char *const durable_names[] = {"write-back", "write-through", NULL};
static const char *const admit_names[] = {"always", "door", NULL}; /* enum lkv_hot_admission. */
static const char *const staging_names[] = {"auto", "off", "always", NULL}; /* lkv_get_staging */
static const char *const corrupt_names[] = {"refuse", "reset", NULL};
static const char *const level_names[] = {"debug", "info", "warn", "error", NULL};

/* Compares option names treating '-' and '_' alike. */
static int key_eq(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        char x = *a == '-' ? '_' : *a, y = *b == '-' ? '_' : *b;
        if (x != y) {
            return 0;
        }
    }
    return *a == *b;
}

static const opt *find_opt(const char *key)
{
    for (int i = 0; i < N_OPTS; i++) {
        if (key_eq(opts[i].name, key)) {
            return &opts[i];
        }
    }
    return NULL;
}

static void list_opts(char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_OPTS && n < len; i++) {
        int w = snprintf(buf + n, len - n, "%s%s", i ? ", " : "", opts[i].name);
        if (w < 0) {
            break;
        }
        n += (size_t)w;
    }
}

static int enum_fail(const char *key, const char *value, const char *const *names, char *err,
                     size_t errlen)
{
    char list[256];
    size_t n = 0;
    list[0] = '\0';
    for (int i = 0; names[i] != NULL && n < sizeof(list); i++) {
        int w = snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "", names[i]);
        n += w > 0 ? (size_t)w : 0;
    }
    return lkv_errf(err, errlen, LKV_ECONFIG, "option '%s': '%s' is not one of: %s", key, value,
                    list);
}

static int set_enum(const opt *o, void *field, const char *value, const char *const *names,
                    char *err, size_t errlen)
{
    int v = parse_name(value, names);
    if (v < 0) {
        return enum_fail(o->name, value, names, err, errlen);
    }
    *(int *)field = v;
    return 0;
}

static int set_opt(lkv_config *c, const opt *o, const char *value, char *err, size_t errlen)
{
    void *field = (char *)c + o->off;
    uint64_t u;
    switch (o->kind) {
    case OPT_OPTSTR:
        if (value[0] == '\0' || strcmp(value, "none") == 0 || strcmp(value, "off") == 0) {
            *(char *)field = '\0';
            return 0;
        }
        /* Fall through. */
    case OPT_STRING:
    case OPT_LIST:
        /* min 1: the option may be empty; a list always may. */
        if (value[0] == '\0' && o->kind == OPT_STRING && o->min == 0) {
            return lkv_errf(err, errlen, LKV_ECONFIG, "option '%s': must not be empty", o->name);
        }
        if (strlen(value) >= o->size) {
            return lkv_errf(err, errlen, LKV_ECONFIG, "option '%s': longer than %zu characters",
                            o->name, o->size - 1);
        }
        memcpy(field, value, strlen(value) + 1);
        return 0;
    case OPT_SIZE:
        if (parse_size(value, &u) != 0) {
            return lkv_errf(err, errlen, LKV_ECONFIG,
                            "option '%s': '%s' is not a size in bytes (a number with an optional "
                            "K/KiB, M/MiB, G/GiB or T/TiB suffix)",
                            o->name, value);
        }
        if (u < o->min || u > o->max) {
            return lkv_errf(err, errlen, LKV_ECONFIG,
                            "option '%s': %" PRIu64 " bytes is outside %" PRIu64 "..%" PRIu64,
                            o->name, u, o->min, o->max);
        }
        *(uint64_t *)field = u;
        return 0;
    case OPT_INT:
    case OPT_U32:
        if (parse_u64(value, &u) != 0) {
            return lkv_errf(err, errlen, LKV_ECONFIG,
                            "option '%s': '%s' is not a non-negative integer", o->name, value);
        }
        if (u < o->min || u > o->max) {
            return lkv_errf(err, errlen, LKV_ECONFIG,
                            "option '%s': %" PRIu64 " is outside %" PRIu64 "..%" PRIu64, o->name, u,
                            o->min, o->max);
        }
        if (o->kind == OPT_INT) {
            *(int *)field = (int)u;
        } else {
            *(uint32_t *)field = (uint32_t)u;
        }
        return 0;
    case OPT_DURATION:
        if (parse_duration_ms(value, &u) != 0) {
            return lkv_errf(err, errlen, LKV_ECONFIG,
                            "option '%s': '%s' is not a duration (a number with suffix ms, s or m)",
                            o->name, value);
        }
        if (u < o->min || u > o->max) {
            return lkv_errf(err, errlen, LKV_ECONFIG,
                            "option '%s': %" PRIu64 " ms is outside %" PRIu64 "..%" PRIu64 " ms",
                            o->name, u, o->min, o->max);
        }
        *(uint64_t *)field = u;
        return 0;
    case OPT_BACKEND:
        return set_enum(o, field, value, backend_names, err, errlen);
    case OPT_POLICY: {
        int kind;
        if (lkv_policy_parse(value, &kind) != 0) {
            const char *names[LKV_POLICY__COUNT + 1];
            for (int k = 0; k < LKV_POLICY__COUNT; k++) {
                names[k] = lkv_policy_name(k);
            }
            names[LKV_POLICY__COUNT] = NULL;
            return enum_fail(o->name, value, names, err, errlen);
        }
        *(int *)field = kind;
        return 0;
    }
    case OPT_COST:
        return set_enum(o, field, value, cost_names, err, errlen);
    case OPT_DURABLE:
        return set_enum(o, field, value, durable_names, err, errlen);
    case OPT_ADMIT:
        return set_enum(o, field, value, admit_names, err, errlen);
    case OPT_STAGING:
        return set_enum(o, field, value, staging_names, err, errlen);
    case OPT_CORRUPT:
        return set_enum(o, field, value, corrupt_names, err, errlen);
    case OPT_LOGLEVEL:
        return set_enum(o, field, value, level_names, err, errlen);
    case OPT_ROLES: {
        char msg[256];
        uint32_t mask;
        if (lkv_auth_roles_parse(value, &mask, msg, (int)sizeof(msg)) != 0) {
            return lkv_errf(err, errlen, LKV_ECONFIG, "option '%s': %s", o->name, msg);
        }
        *(uint32_t *)field = mask;
        return 0;
    }
    case OPT_BOOL: {
        static const char *const bools[] = {"false", "true", "off", "on", "no",
                                            "yes",   "0",    "1",   NULL};
        int v = parse_name(value, bools);
        if (v < 0) {
            return lkv_errf(err, errlen, LKV_ECONFIG, "option '%s': '%s' is not true or false",
                            o->name, value);
        }
        *(int *)field = v & 1;
        return 0;
    }
    case OPT_AUTHKEY: {
        uint8_t key[LKV_AUTH_KEY_BYTES];
        if (strcasecmp(value, "none") == 0 || value[0] == '\0') {
            c->have_auth_key = 0;
            memset(c->auth_key, 0, sizeof(c->auth_key));
            return 0;
        }
        if (strlen(value) != 2 * LKV_AUTH_KEY_BYTES) {
            return lkv_errf(err, errlen, LKV_ECONFIG,
                            "option '%s': expected %d hex digits or none, got %zu "
                            "characters",
                            o->name, 2 * LKV_AUTH_KEY_BYTES, strlen(value));
        }
        for (int i = 0; i < LKV_AUTH_KEY_BYTES; i++) {
            unsigned int b;
            if (!isxdigit((unsigned char)value[2 * i]) ||
                !isxdigit((unsigned char)value[2 * i + 1]) ||
                sscanf(value + 2 * i, "%2x", &b) != 1) {
                return lkv_errf(err, errlen, LKV_ECONFIG, "option '%s': not hex at character %d",
                                o->name, 2 * i + 1);
            }
            key[i] = (uint8_t)b;
        }
        memcpy(c->auth_key, key, sizeof(key));
        c->have_auth_key = 1;
        return 0;
    }
    default:
        break;
    }
    lkv_panic("bad option kind %d", o->kind);
}

/* ---- Profiles ------------------------------------------------------------------------- */

enum pf_kind {
    PF_INT,     /* int field. */
    PF_U32,     /* uint32_t field. */
    PF_DOUBLE,  /* double field. */
    PF_DTYPE,   /* int, enum lkv_dtype. */
    PF_POSENC,  /* int, enum lkv_posenc_kind. */
    PF_PAIRING, /* int, enum lkv_rope_pairing. */
    PF_SCALING, /* int, enum lkv_rope_scaling. */
    PF_SIZE,    /* uint64_t, a size ("64MiB"). */
    PF_STR,     /* char[LKV_MODEL_ID_MAX] (model_id). */
};

typedef struct pfield {
    const char *name; /* Key inside [profile NAME]. */
    int kind;         /* enum pf_kind. */
    size_t off;       /* Offset in lkv_profile. */
    const char *help; /* One line. */
} pfield;

#define POFF(f) offsetof(lkv_profile, f)

static const pfield pfields[] = {
    {"n_layers", PF_INT, POFF(shape.n_layers), "transformer layers"},
    {"n_q_heads", PF_INT, POFF(shape.n_q_heads), "query heads"},
    {"n_kv_heads", PF_INT, POFF(shape.n_kv_heads), "KV heads (divides n_q_heads)"},
    {"head_dim", PF_INT, POFF(shape.head_dim), "head dimension (multiple of 8, <= 256)"},
    {"dtype", PF_DTYPE, POFF(shape.dtype), "stored element type: f32, f16, bf16"},
    {"block_tokens", PF_INT, POFF(shape.block_tokens), "tokens per block, 1..64"},
    {"vocab_size", PF_U32, POFF(vocab_size), "token ids must be below this"},
    {"max_doc_tokens", PF_U32, POFF(max_doc_tokens), "longest document (0 = 4096 blocks)"},
    {"posenc", PF_POSENC, POFF(posenc.kind), "none, rope, alibi"},
    {"rope_theta", PF_DOUBLE, POFF(posenc.rope_theta), "RoPE base"},
    {"rope_pairing", PF_PAIRING, POFF(posenc.rope_pairing), "half (HF Llama) or interleaved"},
    {"rotary_dim", PF_INT, POFF(posenc.rotary_dim), "rotated dims per head (0 = head_dim)"},
    {"rope_scaling", PF_SCALING, POFF(posenc.rope_scaling), "none, linear, llama3"},
    {"scaling_factor", PF_DOUBLE, POFF(posenc.scaling_factor), "linear/llama3 factor"},
    {"low_freq_factor", PF_DOUBLE, POFF(posenc.low_freq_factor), "llama3 low_freq_factor"},
    {"high_freq_factor", PF_DOUBLE, POFF(posenc.high_freq_factor), "llama3 high_freq_factor"},
    {"original_max_pos", PF_DOUBLE, POFF(posenc.original_max_pos), "llama3 original context"},
    {"hot_bytes", PF_SIZE, POFF(hot_bytes),
     "hot arena bytes of this profile's region (0 = an equal-tokens share of the rest)"},
    {"model_id", PF_STR, POFF(model_id),
     "weights identity: blake2b:<hex of the checkpoint> or a revision (\"\" = none)"},
};
#define N_PFIELDS ((int)(sizeof(pfields) / sizeof(pfields[0])))

static const char *const dtype_names[] = {"f32", "f16", "bf16", NULL};
static const char *const posenc_names[] = {"none", "rope", "alibi", NULL};
static const char *const pairing_names[] = {"half", "interleaved", NULL};
static const char *const scaling_names[] = {"none", "linear", "llama3", NULL};

static void profile_template(lkv_profile *p, const char *name)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->shape.dtype = LKV_DTYPE_F16;
    p->shape.block_tokens = 16;
    p->posenc.kind = LKV_POSENC_ROPE;
    p->posenc.rope_theta = 10000.0;
    p->posenc.rope_pairing = LKV_ROPE_HALF;
    p->posenc.rope_scaling = LKV_ROPE_SCALING_NONE;
}

static void builtin_stories260k(lkv_profile *p)
{
    profile_template(p, "stories260k");
    p->shape = (lkv_kv_shape){.n_layers = 5,
                              .n_q_heads = 8,
                              .n_kv_heads = 4,
                              .head_dim = 8,
                              .dtype = LKV_DTYPE_F32,
                              .block_tokens = 16};
    p->posenc.rope_theta = 10000.0;
    p->posenc.rope_pairing = LKV_ROPE_INTERLEAVED;
    p->vocab_size = 512;
    /* The weights: BLAKE2b-256 of tests/data/models/stories260K.bin (the decode worker checks
     * the checkpoint it loads against it). */
    snprintf(p->model_id, sizeof(p->model_id), "%s",
             "blake2b:3e77c0b76962b86e8b60b343f705d70cc9e8573156925a0be325b349930dc37b");
}

static void builtin_llama31_8b(lkv_profile *p)
{
    profile_template(p, "llama-3.1-8b");
    p->shape = (lkv_kv_shape){.n_layers = 32,
                              .n_q_heads = 32,
                              .n_kv_heads = 8,
                              .head_dim = 128,
                              .dtype = LKV_DTYPE_BF16,
                              .block_tokens = 16};
    p->posenc.rope_theta = 500000.0;
    p->posenc.rope_pairing = LKV_ROPE_HALF;
    p->posenc.rope_scaling = LKV_ROPE_SCALING_LLAMA3;
    p->posenc.scaling_factor = 8.0;
    p->posenc.low_freq_factor = 1.0;
    p->posenc.high_freq_factor = 4.0;
    p->posenc.original_max_pos = 8192.0;
    p->vocab_size = 128256;
}

uint64_t lkv_config_docref_bytes(const lkv_config *c)
{
    uint64_t most = 0;
    for (int i = 0; i < c->n_profiles; i++) {
        uint64_t t = c->profiles[i].max_doc_tokens;
        most = t > most ? t : most;
    }
    uint64_t n = most * 5 + 4096; /* A uint32 varint is at most 5 bytes. */
    return n < c->max_request_bytes ? n : c->max_request_bytes;
}

const lkv_profile *lkv_config_profile(const lkv_config *c, const char *name)
{
    for (int i = 0; i < c->n_profiles; i++) {
        if (strcmp(c->profiles[i].name, name) == 0) {
            return &c->profiles[i];
        }
    }
    return NULL;
}

static int profile_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= LKV_PROFILE_NAME_MAX) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        if (!isalnum((unsigned char)ch) && ch != '.' && ch != '_' && ch != '-') {
            return 0;
        }
    }
    return 1;
}

/* model_id: checked here so the message names the option; the fingerprint covers it. */
static int set_model_id(lkv_profile *p, const char *value, char *err, size_t errlen)
{
    char msg[160];
    if (lkv_profile_model_id_check(value, msg, (int)sizeof(msg)) != 0) {
        return lkv_errf(err, errlen, LKV_ECONFIG, "profile '%s' option 'model_id': %s", p->name,
                        msg);
    }
    snprintf(p->model_id, sizeof(p->model_id), "%s", value);
    return 0;
}

static int set_pfield(lkv_profile *p, const char *key, const char *value, char *err, size_t errlen)
{
    const pfield *f = NULL;
    for (int i = 0; i < N_PFIELDS; i++) {
        if (key_eq(pfields[i].name, key)) {
            f = &pfields[i];
        }
    }
    if (f == NULL) {
        char list[512];
        size_t n = 0;
        for (int i = 0; i < N_PFIELDS && n < sizeof(list); i++) {
            int w = snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "", pfields[i].name);
            n += w > 0 ? (size_t)w : 0;
        }
        return lkv_errf(err, errlen, LKV_ECONFIG,
                        "profile '%s': unknown option '%s' (profile options: %s)", p->name, key,
                        list);
    }
    void *field = (char *)p + f->off;
    uint64_t u;
    double d;
    int e;
    switch (f->kind) {
    case PF_INT:
    case PF_U32:
        if (parse_u64(value, &u) != 0 || u > (f->kind == PF_INT ? INT32_MAX : UINT32_MAX)) {
            return lkv_errf(err, errlen, LKV_ECONFIG,
                            "profile '%s' option '%s': '%s' is not a non-negative integer"
                            " in range",
                            p->name, f->name, value);
        }
        if (f->kind == PF_INT) {
            *(int *)field = (int)u;
        } else {
            *(uint32_t *)field = (uint32_t)u;
        }
        return 0;
    case PF_SIZE:
        if (parse_size(value, &u) != 0) {
            return lkv_errf(err, errlen, LKV_ECONFIG,
                            "profile '%s' option '%s': '%s' is not a size (e.g. 64MiB)", p->name,
                            f->name, value);
        }
        *(uint64_t *)field = u;
        return 0;
    case PF_DOUBLE:
        if (parse_double(value, &d) != 0) {
            return lkv_errf(err, errlen, LKV_ECONFIG,
                            "profile '%s' option '%s': '%s' is not a number", p->name, f->name,
                            value);
        }
        *(double *)field = d;
        return 0;
    case PF_STR:
        return set_model_id(p, value, err, errlen);
    default:
        break;
    }
    const char *const *names = f->kind == PF_DTYPE     ? dtype_names
                               : f->kind == PF_POSENC  ? posenc_names
                               : f->kind == PF_PAIRING ? pairing_names
                                                       : scaling_names;
    e = parse_name(value, names);
    if (e < 0) {
        char opt_name[128];
        snprintf(opt_name, sizeof(opt_name), "%s' of profile '%s", f->name, p->name);
        return enum_fail(opt_name, value, names, err, errlen);
    }
    *(int *)field = e;
    return 0;
}

/* Returns the profile named name, creating it from the template if new; NULL if full. */
static lkv_profile *profile_get(lkv_config *c, const char *name, char *err, size_t errlen)
{
    for (int i = 0; i < c->n_profiles; i++) {
        if (strcmp(c->profiles[i].name, name) == 0) {
            return &c->profiles[i];
        }
    }
    if (!profile_name_ok(name)) {
        lkv_errf(err, errlen, LKV_ECONFIG,
                 "profile '%s': a name is 1..%d characters of [A-Za-z0-9._-]", name,
                 LKV_PROFILE_NAME_MAX - 1);
        return NULL;
    }
    if (c->n_profiles == LKV_CONFIG_MAX_PROFILES) {
        lkv_errf(err, errlen, LKV_ECONFIG, "profile '%s': too many profiles (at most %d)", name,
                 LKV_CONFIG_MAX_PROFILES);
        return NULL;
    }
    lkv_profile *p = &c->profiles[c->n_profiles++];
    profile_template(p, name);
    return p;
}

/* ---- Tenants --------------------------------------------------------------------------- */

/* Returns the tenant named name, creating it (lkv_tenant_init) if new; NULL with err if the
 * name is bad or the table is full. */
static lkv_tenant *tenant_get(lkv_config *c, const char *name, char *err, size_t errlen)
{
    for (int i = 0; i < c->n_tenants; i++) {
        if (strcmp(c->tenants[i].name, name) == 0) {
            return &c->tenants[i];
        }
    }
    if (c->n_tenants == LKV_CONFIG_MAX_TENANTS) {
        lkv_errf(err, errlen, LKV_ECONFIG, "tenant '%s': too many tenants (at most %d)", name,
                 LKV_CONFIG_MAX_TENANTS);
        return NULL;
    }
    lkv_tenant *t = &c->tenants[c->n_tenants];
    if (lkv_tenant_init(t, name, err, (int)errlen) != 0) {
        return NULL;
    }
    c->n_tenants++;
    return t;
}

/* Sets one field of tenant name (created if new); *c unchanged on error. */
static int tenant_set(lkv_config *c, const char *name, const char *key, const char *value,
                      char *err, size_t errlen)
{
    int n_before = c->n_tenants;
    lkv_tenant *t = tenant_get(c, name, err, errlen);
    if (t == NULL) {
        return LKV_ECONFIG;
    }
    lkv_tenant saved = *t;
    if (lkv_tenant_set(t, key, value, err, (int)errlen) != 0) {
        *t = saved;
        c->n_tenants = n_before;
        return LKV_ECONFIG;
    }
    return 0;
}

int lkv_config_auth(const lkv_config *c, lkv_auth **out, char *err, size_t errlen)
{
    lkv_auth *a = NULL;
    if (lkv_auth_create(c->have_auth_key ? c->auth_key : NULL, c->loopback_roles, &a) != 0) {
        return lkv_errf(err, errlen, LKV_ECONFIG,
                        "tenants: cannot create the tenant table (libsodium)");
    }
    for (int i = 0; i < c->n_tenants; i++) {
        char msg[LKV_CONFIG_ERR_MAX];
        if (lkv_auth_add(a, &c->tenants[i], msg, (int)sizeof(msg)) != 0) {
            lkv_auth_destroy(a);
            return lkv_errf(err, errlen, LKV_ECONFIG, "%s", msg);
        }
    }
    *out = a;
    return 0;
}

/* ---- Public --------------------------------------------------------------------------- */

void lkv_config_defaults(lkv_config *c)
{
    char err[LKV_CONFIG_ERR_MAX];
    memset(c, 0, sizeof(*c));
    for (int i = 0; i < N_OPTS; i++) {
        if (set_opt(c, &opts[i], opts[i].def, err, sizeof(err)) != 0) {
            lkv_panic("built-in default of %s is invalid: %s", opts[i].name, err);
        }
    }
    builtin_stories260k(&c->profiles[0]);
    builtin_llama31_8b(&c->profiles[1]);
    c->n_profiles = 2;
}

int lkv_config_set(lkv_config *c, const char *profile, const char *key, const char *value,
                   char *err, size_t errlen)
{
    if (profile == NULL) {
        /* "profile.NAME.field" / "tenant.NAME.field": field names have no dots, names may
         * ("llama-3.1-8b"), so NAME runs to the LAST dot. */
        const char *dot;
        if (strncmp(key, "profile.", 8) == 0 && (dot = strrchr(key + 8, '.')) != NULL) {
            char name[LKV_PROFILE_NAME_MAX + 1];
            size_t n = (size_t)(dot - (key + 8));
            if (n == 0 || n >= sizeof(name)) {
                return lkv_errf(err, errlen, LKV_ECONFIG, "option '%s': bad profile name", key);
            }
            memcpy(name, key + 8, n);
            name[n] = '\0';
            return lkv_config_set(c, name, dot + 1, value, err, errlen);
        }
        if (strncmp(key, "tenant.", 7) == 0 && (dot = strrchr(key + 7, '.')) != NULL) {
            char name[LKV_TENANT_NAME_MAX + 1];
            size_t n = (size_t)(dot - (key + 7));
            if (n == 0 || n >= sizeof(name)) {
                return lkv_errf(err, errlen, LKV_ECONFIG, "option '%s': bad tenant name", key);
            }
            memcpy(name, key + 7, n);
            name[n] = '\0';
            return tenant_set(c, name, dot + 1, value, err, errlen);
        }
        const opt *o = find_opt(key);
        if (o == NULL) {
            char list[1024];
            list_opts(list, sizeof(list));
            return lkv_errf(
                err, errlen, LKV_ECONFIG,
                "unknown option '%s' (options: %s; profile fields go in a [profile NAME] "
                "section or as profile.NAME.field, tenant fields in [tenant NAME] or "
                "tenant.NAME.field)",
                key, list);
        }
        lkv_config tmp = *c;
        int rc = set_opt(&tmp, o, value, err, errlen);
        if (rc == 0) {
            *c = tmp;
        }
        return rc;
    }
    int n_before = c->n_profiles;
    lkv_profile *p = profile_get(c, profile, err, errlen);
    if (p == NULL) {
        return LKV_ECONFIG;
    }
    lkv_profile saved = *p;
    int rc = set_pfield(p, key, value, err, errlen);
    if (rc != 0) {
        *p = saved;
        c->n_profiles = n_before;
    }
    return rc;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) {
        s++;
    }
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) {
        *--e = '\0';
    }
    return s;
}

int lkv_config_load_string(lkv_config *c, const char *text, const char *name, char *err,
                           size_t errlen)
{
    char section[LKV_PROFILE_NAME_MAX + 64] = "";
    int in_section = 0; /* 0: daemon options, 1: [profile NAME], 2: [tenant NAME]. */
    int lineno = 0;
    const char *p = text;
    char msg[LKV_CONFIG_ERR_MAX];
    while (*p != '\0') {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        lineno++;
        char *line = lkv_xmalloc(n + 1);
        memcpy(line, p, n);
        line[n] = '\0';
        p += n + (nl ? 1 : 0);
        char *hash = strchr(line, '#');
        if (hash != NULL) {
            *hash = '\0';
        }
        char *s = trim(line);
        int rc = 0;
        if (*s == '\0') {
            /* Blank or comment. */
        } else if (*s == '[') {
            char *close = strchr(s, ']');
            char *sec = s + 1;
            if (close == NULL || trim(close + 1)[0] != '\0') {
                rc = lkv_errf(err, errlen, LKV_ECONFIG,
                              "%s:%d: section header '%s' must be [profile NAME]", name, lineno, s);
            } else {
                *close = '\0';
                sec = trim(sec);
                char *sp = sec;
                while (*sp && !isspace((unsigned char)*sp)) {
                    sp++;
                }
                char *arg = trim(sp);
                *sp = '\0';
                if (strcmp(sec, "tenant") == 0 && arg[0] != '\0') {
                    if (tenant_get(c, arg, msg, sizeof(msg)) == NULL) {
                        rc = lkv_errf(err, errlen, LKV_ECONFIG, "%s:%d: %s", name, lineno, msg);
                    } else {
                        snprintf(section, sizeof(section), "%s", arg);
                        in_section = 2;
                    }
                } else if (strcmp(sec, "profile") != 0 || arg[0] == '\0') {
                    rc = lkv_errf(err, errlen, LKV_ECONFIG,
                                  "%s:%d: unknown section '[%s%s%s]' (sections are [profile NAME] "
                                  "and [tenant NAME])",
                                  name, lineno, sec, arg[0] ? " " : "", arg);
                } else if (!profile_name_ok(arg)) {
                    rc = lkv_errf(err, errlen, LKV_ECONFIG,
                                  "%s:%d: profile name '%s' must be 1..%d characters of "
                                  "[A-Za-z0-9._-]",
                                  name, lineno, arg, LKV_PROFILE_NAME_MAX - 1);
                } else if (profile_get(c, arg, msg, sizeof(msg)) == NULL) {
                    rc = lkv_errf(err, errlen, LKV_ECONFIG, "%s:%d: %s", name, lineno, msg);
                } else {
                    snprintf(section, sizeof(section), "%s", arg);
                    in_section = 1;
                }
            }
        } else {
            char *eq = strchr(s, '=');
            if (eq == NULL) {
                rc = lkv_errf(err, errlen, LKV_ECONFIG, "%s:%d: expected 'key = value', got '%s'",
                              name, lineno, s);
            } else {
                *eq = '\0';
                char *key = trim(s);
                char *value = trim(eq + 1);
                size_t vl = strlen(value);
                if (vl >= 2 && value[0] == '"' && value[vl - 1] == '"') {
                    value[vl - 1] = '\0';
                    value++;
                }
                if (key[0] == '\0') {
                    rc = lkv_errf(err, errlen, LKV_ECONFIG, "%s:%d: missing key before '='", name,
                                  lineno);
                } else if (in_section == 2) {
                    if (tenant_set(c, section, key, value, msg, sizeof(msg)) != 0) {
                        rc = lkv_errf(err, errlen, LKV_ECONFIG, "%s:%d: %s", name, lineno, msg);
                    }
                } else if (lkv_config_set(c, in_section == 1 ? section : NULL, key, value, msg,
                                          sizeof(msg)) != 0) {
                    rc = lkv_errf(err, errlen, LKV_ECONFIG, "%s:%d: %s", name, lineno, msg);
                }
            }
        }
        free(line);
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

int lkv_config_load_file(lkv_config *c, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return lkv_errf(err, errlen, LKV_ECONFIG, "option 'config': cannot open '%s': %s", path,
                        strerror(errno));
    }
    size_t cap = 4096, n = 0;
    char *buf = lkv_xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap) {
            cap *= 2;
            buf = lkv_xrealloc(buf, cap);
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) {
            break;
        }
    }
    int ioerr = ferror(f);
    fclose(f);
    buf[n] = '\0';
    int rc;
    if (ioerr) {
        rc = lkv_errf(err, errlen, LKV_ECONFIG, "option 'config': cannot read '%s'", path);
    } else if (memchr(buf, '\0', n) != NULL) {
        rc = lkv_errf(err, errlen, LKV_ECONFIG,
                      "option 'config': '%s' is not a text file (NUL byte)", path);
    } else {
        rc = lkv_config_load_string(c, buf, path, err, errlen);
    }
    free(buf);
    if (rc == 0) {
        snprintf(c->source, sizeof(c->source), "%s", path);
    }
    return rc;
}

int lkv_config_each_name(const char *list, int (*fn)(void *ctx, const char *name), void *ctx)
{
    char name[LKV_PROFILE_NAME_MAX + 64];
    const char *p = list;
    while (p != NULL && *p != '\0') {
        const char *e = strchr(p, ',');
        size_t n = e != NULL ? (size_t)(e - p) : strlen(p);
        while (n > 0 && (*p == ' ' || *p == '\t')) {
            p++;
            n--;
        }
        while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t')) {
            n--;
        }
        if (n > 0) {
            snprintf(name, sizeof(name), "%.*s", (int)(n < sizeof(name) ? n : sizeof(name) - 1), p);
            int rc = fn(ctx, name);
            if (rc != 0) {
                return rc;
            }
        }
        p = e != NULL ? e + 1 : NULL;
    }
    return 0;
}

/* The cluster_* options: a known mode and what that mode needs. */
static int validate_cluster(const lkv_config *c, char *err, size_t errlen)
{
    static const char *const modes[] = {"none", "etcd", "static", "dns", NULL};
    int mode = parse_name(c->cluster_mode, modes);
    if (mode < 0) {
        return enum_fail("cluster_mode", c->cluster_mode, modes, err, errlen);
    }
    if (mode == 0) {
        return 0;
    }
    if (mode == 1 && c->cluster_etcd[0] == '\0') {
        return lkv_errf(err, errlen, LKV_ECONFIG,
                        "option 'cluster_etcd': required with cluster_mode = etcd");
    }
    if (mode == 2 && c->cluster_members[0] == '\0') {
        return lkv_errf(err, errlen, LKV_ECONFIG,
                        "option 'cluster_members': required with cluster_mode = static");
    }
    if (mode == 3 && strchr(c->cluster_dns, ':') == NULL) {
        return lkv_errf(err, errlen, LKV_ECONFIG,
                        "option 'cluster_dns': name:port required with cluster_mode = dns");
    }
    if (c->cluster_token_file[0] == '\0') {
        return lkv_errf(err, errlen, LKV_ECONFIG,
                        "option 'cluster_token_file': required in a cluster (the credential of "
                        "forwarded and other member-to-member calls)");
    }
    size_t pl = strlen(c->cluster_prefix);
    if (pl < 2 || c->cluster_prefix[pl - 1] != '/') {
        return lkv_errf(err, errlen, LKV_ECONFIG, "option 'cluster_prefix': '%s' must end with '/'",
                        c->cluster_prefix);
    }
    if (c->cluster_advertise[0] != '\0' && strrchr(c->cluster_advertise, ':') == NULL) {
        return lkv_errf(err, errlen, LKV_ECONFIG,
                        "option 'cluster_advertise': '%s' is not host:port", c->cluster_advertise);
    }
    return 0;
}

/* Validation of hold_profiles / hold_tenants: remembers the first bad name. */
typedef struct hold_check {
    const lkv_config *c;
    char *bad;
} hold_check;

static int hold_bad(hold_check *h, const char *name)
{
    static _Thread_local char bad[128];
    snprintf(bad, sizeof(bad), "%s", name);
    h->bad = bad;
    return 1;
}

static int hold_profile_ok(void *ctx, const char *name)
{
    hold_check *h = ctx;
    return lkv_config_profile(h->c, name) != NULL ? 0 : hold_bad(h, name);
}

static int hold_tenant_ok(void *ctx, const char *name)
{
    hold_check *h = ctx;
    if (strcmp(name, LKV_AUTH_DEFAULT_TENANT) == 0) {
        return 0;
    }
    for (int i = 0; i < h->c->n_tenants; i++) {
        if (strcmp(h->c->tenants[i].name, name) == 0) {
            return 0;
        }
    }
    return hold_bad(h, name);
}

int lkv_config_validate(lkv_config *c, char *err, size_t errlen)
{
    if (validate_cluster(c, err, errlen) != 0) {
        return LKV_ECONFIG;
    }
    /* listen: host:port, port 0..65535; IPv6 hosts in brackets. */
    const char *colon = strrchr(c->listen, ':');
    uint64_t port;
    if (colon == NULL || colon == c->listen || parse_u64(colon + 1, &port) != 0 || port > 65535) {
        return lkv_errf(err, errlen, LKV_ECONFIG,
                        "option 'listen': '%s' is not host:port (e.g. 127.0.0.1:7070, [::1]:0, "
                        "0.0.0.0:7070; port 0 picks a free port)",
                        c->listen);
    }
    if (c->n_profiles == 0) {
        return lkv_errf(err, errlen, LKV_ECONFIG, "profiles: no model profile is configured");
    }
    char msg[LKV_CONFIG_ERR_MAX];
    for (int i = 0; i < c->n_tenants; i++) {
        if (lkv_tenant_finish(&c->tenants[i], msg, (int)sizeof(msg)) != 0) {
            return lkv_errf(err, errlen, LKV_ECONFIG, "%s", msg);
        }
    }
    lkv_auth *table = NULL;
    if (lkv_config_auth(c, &table, err, errlen) != 0) {
        return LKV_ECONFIG;
    }
    lkv_auth_destroy(table);
    if (lkv_auth_check_bind(c->listen, c->n_tenants > 0, c->allow_insecure_bind, msg,
                            (int)sizeof(msg)) != 0) {
        return lkv_errf(err, errlen, LKV_ECONFIG, "option 'listen': %s", msg);
    }
    if ((c->tls_cert_file[0] != '\0') != (c->tls_key_file[0] != '\0')) {
        return lkv_errf(err, errlen, LKV_ECONFIG,
                        "option '%s': TLS needs both tls_cert_file and tls_key_file",
                        c->tls_cert_file[0] != '\0' ? "tls_key_file" : "tls_cert_file");
    }
    if (c->tls_client_ca_file[0] != '\0' && c->tls_cert_file[0] == '\0') {
        return lkv_errf(err, errlen, LKV_ECONFIG,
                        "option 'tls_client_ca_file': client certificates need TLS "
                        "(tls_cert_file and tls_key_file)");
    }
    if (c->metrics_listen[0] != '\0') {
        const char *mc = strrchr(c->metrics_listen, ':');
        if (mc == NULL || mc == c->metrics_listen || parse_u64(mc + 1, &port) != 0 ||
            port > 65535) {
            return lkv_errf(err, errlen, LKV_ECONFIG,
                            "option 'metrics_listen': '%s' is not host:port (e.g. 127.0.0.1:9464)",
                            c->metrics_listen);
        }
        if (!lkv_auth_addr_is_loopback(c->metrics_listen) && c->n_tenants == 0 &&
            !c->allow_insecure_bind) {
            return lkv_errf(err, errlen, LKV_ECONFIG,
                            "option 'metrics_listen': %s is not loopback and there are no tenants "
                            "to authorise scrapes (the metrics name tenants): bind loopback, "
                            "configure tenants (scrapes then need an admin-role token), or set "
                            "allow_insecure_bind = true",
                            c->metrics_listen);
        }
    }
    if (c->metrics_tls && (c->metrics_listen[0] == '\0' || c->tls_cert_file[0] == '\0')) {
        return lkv_errf(err, errlen, LKV_ECONFIG,
                        "option 'metrics_tls': needs metrics_listen and the daemon's tls_cert_file "
                        "and tls_key_file (the metrics endpoint uses the same certificate)");
    }
    uint64_t max_block = 0;
    for (int i = 0; i < c->n_profiles; i++) {
        lkv_profile *p = &c->profiles[i];
        if (lkv_profile_finish(p, msg, (int)sizeof(msg)) != 0) {
            return lkv_errf(err, errlen, LKV_ECONFIG, "profile '%s' option %s", p->name, msg);
        }
        uint64_t bb = lkv_block_bytes(&p->shape);
        /* A block travels in one message with a little framing. */
        if (bb + 1024 > c->max_message_bytes) {
            char a[32], b[32];
            return lkv_errf(err, errlen, LKV_ECONFIG,
                            "option 'max_message_bytes': %s cannot carry one block of profile '%s' "
                            "(%s plus framing)",
                            lkv_format_bytes(c->max_message_bytes, a, sizeof(a)), p->name,
                            lkv_format_bytes(bb, b, sizeof(b)));
        }
        if (bb > max_block) {
            max_block = bb;
        }
    }
    hold_check hc = {c, NULL};
    if (lkv_config_each_name(c->hold_profiles, hold_profile_ok, &hc) != 0) {
        return lkv_errf(err, errlen, LKV_ECONFIG,
                        "option 'hold_profiles': no profile '%.64s' is configured", hc.bad);
    }
    if (lkv_config_each_name(c->hold_tenants, hold_tenant_ok, &hc) != 0) {
        return lkv_errf(err, errlen, LKV_ECONFIG,
                        "option 'hold_tenants': no tenant '%.64s' (a [tenant NAME] section, or "
                        "\"" LKV_AUTH_DEFAULT_TENANT "\")",
                        hc.bad);
    }
    if (c->hot_bytes < max_block) {
        char a[32], b[32];
        return lkv_errf(
            err, errlen, LKV_ECONFIG,
            "option 'hot_bytes': %s is smaller than one block of the largest profile (%s)",
            lkv_format_bytes(c->hot_bytes, a, sizeof(a)),
            lkv_format_bytes(max_block, b, sizeof(b)));
    }
    lkv_arena_region_cfg plan[LKV_CONFIG_MAX_PROFILES];
    if (lkv_store_plan_regions(c->profiles, c->n_profiles, c->hot_bytes, plan, msg,
                               (int)sizeof(msg)) != 0) {
        return lkv_errf(err, errlen, LKV_ECONFIG, "option 'hot_bytes': %s", msg);
    }
    return 0;
}

void lkv_config_usage(FILE *f)
{
    fprintf(f, "usage: lazykvd [--config FILE] [--set KEY=VALUE]... [--KEY VALUE]... [--help]\n"
               "\n"
               "Serves the lazykv cache over gRPC (lazykv.v1.Cache, lazykv.v1.Admin,\n"
               "grpc.health.v1.Health). Prints 'lazykvd listening on HOST:PORT' once ready.\n"
               "SIGTERM or SIGINT drains in-flight calls, flushes write-back documents and exits.\n"
               "\n"
               "  --config FILE         read options from FILE (format: daemon/lazykvd.conf)\n"
               "  --set KEY=VALUE       override an option (profile fields: profile.NAME.KEY)\n"
               "  --KEY VALUE, --KEY=VALUE   the same\n"
               "  --check-config        validate the configuration, print it and exit\n"
               "  --version             print the version and exit\n"
               "  --help                print this help and exit\n"
               "\n"
               "Options (default in brackets):\n");
    for (int i = 0; i < N_OPTS; i++) {
        fprintf(f, "  %-20s %s [%s]\n", opts[i].name, opts[i].help, opts[i].def);
    }
    fprintf(f, "\nProfile fields ([profile NAME] sections or --set profile.NAME.FIELD=VALUE):\n");
    for (int i = 0; i < N_PFIELDS; i++) {
        fprintf(f, "  %-20s %s\n", pfields[i].name, pfields[i].help);
    }
    fprintf(f,
            "\nTenant fields ([tenant NAME] sections or --set tenant.NAME.FIELD=VALUE):\n"
            "  token_hash           blake2b:<64 hex> of \"lazykv-token-v1:\" + token (required)\n"
            "  roles                data, worker, admin (comma list; required)\n"
            "  salt                 64 hex digits (optional; default derived from the name)\n");
    fprintf(f, "\nBuilt-in profiles: stories260k, llama-3.1-8b. Exit status: 0 ok, 1 runtime "
               "failure, 2 bad configuration or usage.\n");
}

/* Splits "--key=value" / "--key value" / "--set key=value" handling; see the header. */
int lkv_config_from_args(lkv_config *c, int argc, char **argv, int *action, char *err,
                         size_t errlen)
{
    char msg[LKV_CONFIG_ERR_MAX];
    *action = LKV_CONFIG_RUN;
    lkv_config_defaults(c);
    /* Pass 1: flags and --config. */
    const char *config = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *action = LKV_CONFIG_HELP;
            return 0;
        }
        if (strcmp(a, "--version") == 0) {
            *action = LKV_CONFIG_VERSION;
            return 0;
        }
        if (strcmp(a, "--config") == 0 || strcmp(a, "-c") == 0) {
            if (i + 1 >= argc) {
                return lkv_errf(err, errlen, LKV_ECONFIG,
                                "option 'config': %s needs a FILE argument", a);
            }
            config = argv[++i];
        } else if (strncmp(a, "--config=", 9) == 0) {
            config = a + 9;
        }
    }
    if (config != NULL) {
        int rc = lkv_config_load_file(c, config, err, errlen);
        if (rc != 0) {
            return rc;
        }
    }
    /* Pass 2: overrides in order. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--config") == 0 || strcmp(a, "-c") == 0) {
            i++;
            continue;
        }
        if (strncmp(a, "--config=", 9) == 0) {
            continue;
        }
        if (strcmp(a, "--check-config") == 0) {
            *action = LKV_CONFIG_CHECK;
            continue;
        }
        char kv[2048];
        const char *what = a;
        if (strcmp(a, "--set") == 0) {
            if (i + 1 >= argc) {
                return lkv_errf(err, errlen, LKV_ECONFIG, "argument '--set' needs KEY=VALUE");
            }
            what = argv[++i];
            snprintf(kv, sizeof(kv), "%s", what);
        } else if (strncmp(a, "--set=", 6) == 0) {
            snprintf(kv, sizeof(kv), "%s", a + 6);
        } else if (strncmp(a, "--", 2) == 0 && a[2] != '\0') {
            if (strchr(a, '=') != NULL) {
                snprintf(kv, sizeof(kv), "%s", a + 2);
            } else {
                if (i + 1 >= argc) {
                    return lkv_errf(err, errlen, LKV_ECONFIG, "option '%s': %s needs a value",
                                    a + 2, a);
                }
                snprintf(kv, sizeof(kv), "%s=%s", a + 2, argv[++i]);
            }
        } else {
            return lkv_errf(err, errlen, LKV_ECONFIG,
                            "unexpected argument '%s' (see lazykvd --help)", a);
        }
        char *eq = strchr(kv, '=');
        if (eq == NULL) {
            return lkv_errf(err, errlen, LKV_ECONFIG, "argument '%s': expected KEY=VALUE", what);
        }
        *eq = '\0';
        if (lkv_config_set(c, NULL, kv, eq + 1, msg, sizeof(msg)) != 0) {
            return lkv_errf(err, errlen, LKV_ECONFIG, "command line '%s': %s", what, msg);
        }
    }
    return lkv_config_validate(c, err, errlen);
}

void lkv_config_summary(const lkv_config *c, char *buf, size_t len)
{
    char hot[32], cold[32], msg[32], grace[32];
    size_t n = 0;
    snprintf(grace, sizeof(grace), "%.1fs", (double)c->shutdown_grace_ms / 1000.0);
    int w = snprintf(
        buf, len,
        "config=%s listen=%s data_dir=%s hot=%s:%s cold=%s policy=%s hot_admission=%s "
        "durability=%s "
        "threads=%d pool_threads=%d max_message=%s log_level=%s shutdown_grace=%s profiles=",
        c->source[0] ? c->source : "(defaults)", c->listen, c->data_dir,
        backend_names[c->hot_backend], lkv_format_bytes(c->hot_bytes, hot, sizeof(hot)),
        c->cold_bytes ? lkv_format_bytes(c->cold_bytes, cold, sizeof(cold)) : "unlimited",
        lkv_policy_name(c->policy_kind), admit_names[c->hot_admission & 1],
        durable_names[c->durability], c->threads, c->pool_threads,
        lkv_format_bytes(c->max_message_bytes, msg, sizeof(msg)), level_names[c->log_level & 3],
        grace);
    n = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < c->n_profiles && n < len; i++) {
        w = snprintf(buf + n, len - n, "%s%s", i ? "," : "", c->profiles[i].name);
        n += w > 0 ? (size_t)w : 0;
    }
    if (n < len) {
        char roles[64];
        lkv_auth_roles_format(c->loopback_roles, roles, sizeof(roles));
        snprintf(buf + n, len - n, " tenants=%d loopback_roles=%s tls=%s metrics=%s", c->n_tenants,
                 roles,
                 c->tls_cert_file[0] == '\0'        ? "off"
                 : c->tls_client_ca_file[0] != '\0' ? "on+client-certs"
                                                    : "on",
                 c->metrics_listen[0] != '\0' ? c->metrics_listen : "off");
    }
}

void lkv_config_to_store(const lkv_config *c, lkv_store_config *out)
{
    memset(out, 0, sizeof(*out));
    out->data_dir = c->data_dir;
    out->hot_bytes = c->hot_bytes;
    out->hot_backend = c->hot_backend;
    out->cuda_device = c->cuda_device;
    out->cuda_read_streams = c->get_stage_streams;
    out->cold_bytes = c->cold_bytes;
    out->policy_kind = c->policy_kind;
    out->policy_cost_bytes = c->policy_cost_bytes;
    out->durability = c->durability;
    out->hot_admission = c->hot_admission;
    out->profiles = c->profiles;
    out->n_profiles = c->n_profiles;
    out->evicted_memory = c->evicted_memory;
    out->cold_min_blob_bytes = c->cold_min_blob_bytes;
    out->cold_min_free_bytes = c->cold_min_free_bytes;
    out->cold_on_corruption = c->cold_on_corruption;
    out->wb_max_backlog_bytes = c->wb_max_backlog_bytes;
    out->wb_no_wal = !c->wb_wal;
}
