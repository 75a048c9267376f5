/*
 * main.c: lazykvd, the lazykv daemon (DESIGN.md sections 2 and 6; README in daemon/README.md).
 *
 * Start-up: configuration (defaults < --config FILE < overrides; a bad one exits 2 with a
 * message naming the option), logging, the store (hot arena + RocksDB cold tier), the services
 * (Cache, Admin, Health) on the RPC engine, then one line on stdout that tests and scripts wait
 * for:
 *
 *     lazykvd listening on 127.0.0.1:PORT
 *
 * Signals: SIGTERM and SIGINT are blocked in every thread and taken by the main thread with
 * sigwait, so no handler runs in signal context. On either: drain (no new calls, in-flight calls
 * get shutdown_grace to finish, the rest are cancelled), then lkv_store_close (persists queued
 * write-back documents, closes RocksDB cleanly), then exit 0. SIGPIPE is ignored.
 *
 * Privacy: the umask is 077 from the start, so everything the daemon and RocksDB create (WAL,
 * SST and blob files, LOG, the wire-key secret) is 0600 / 0700. The data dir must belong to the
 * daemon's user (else exit 2); a looser existing mode (e.g. 0755) is tightened to 0700 with a
 * warning, which also hides any older 0644 files inside it from other users.
 *
 * Descriptors: the soft RLIMIT_NOFILE is raised to the hard limit at start (both logged), so
 * the descriptor cap is the one the operator set, not the shell's default of 1024.
 *
 * Readiness: before the store opens (the cold index loads, which can take long), a starting
 * server binds the listen address and answers Health NOT_SERVING and every other Cache/Admin
 * call UNAVAILABLE ("starting"); once the store, tenancy, leases and cluster are ready it is
 * shut down and the real server binds the same address (a gap of milliseconds in which
 * connections are refused). Health is SERVING from then on, NOT_SERVING again while draining.
 *
 * Exit status: 0 clean shutdown (or --help/--version/--check-config), 1 runtime failure (store
 * cannot open, address cannot be bound, flush failed), 2 bad configuration or usage.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "lkv_admin_svc.h"
#include "lkv_auth.h"
#include "lkv_cache_svc.h"
#include "lkv_cluster.h"
#include "lkv_config.h"
#include "lkv_err.h"
#include "lkv_health.h"
#include "lkv_lease.h"
#include "lkv_log.h"
#include "lkv_metrics.h"
#include "lkv_layout.h"
#include "lkv_server.h"
#include "lkv_stage.h"
#include "lkv_store.h"
#include "lkv_tenancy.h"
#include "lkv_tls.h"
#include "lkv_wirekey.h"

#define LAZYKVD_VERSION "0.1.0"

static lkv_cluster *g_cluster; /* The cluster (daemon/cluster/lkv_cluster.h), set before serving. */

/* Admission (lkv_server_opts.admit; ctx is the tenancy): a cluster-internal call (the cluster
 * token, daemon/cluster/lkv_cluster.h) is admitted as the tenant it names; every other call is
 * authenticated by the tenancy (lkv_tenancy_admit: bearer token, role, TLS rule, rate). */
static int admit(void *ctx, lkv_rpc *rpc)
{
    /* gRPC's default metadata limit is 8 KiB, so a header that is present always fits. */
    char buf[8192 + 1];
    if (g_cluster != NULL && lkv_rpc_metadata_count(rpc, "authorization") == 1 &&
        lkv_rpc_metadata(rpc, "authorization", buf, sizeof(buf)) >= 0) {
        const lkv_tenant *t = NULL;
        int rc = lkv_cluster_admit(g_cluster, rpc, buf, &t);
        if (rc == 1) {
            lkv_rpc_set_principal(rpc, t);
            return 0;
        }
        if (rc < 0) {
            return rc;
        }
    }
    return lkv_tenancy_admit(ctx, rpc);
}

/* The metrics endpoint's authorisation (lkv_metrics_authorize_fn; ctx is the tenancy): a scrape
 * is an Admin call: an admin-role bearer token, or a loopback peer if loopback_roles include
 * admin; the plain-text token rule applies as on gRPC. */
static int metrics_authorize(void *ctx, const char *authz, int loopback, int secure, char *err,
                             size_t errlen)
{
    return lkv_tenancy_check(ctx, authz, loopback, secure, LKV_ROLE_ADMIN, NULL, err, errlen);
}

/* Residency holds from the config (hold_profiles, hold_tenants), applied at every start. */
typedef struct hold_ctx {
    lkv_store *store;
    const lkv_tenancy *ten; /* Tenant names to slots (the residency class of a tenant). */
} hold_ctx;

static int hold_profile(void *ctx, const char *name)
{
    hold_ctx *h = ctx;
    uint64_t n = 0;
    int rc = lkv_store_hold_class(h->store, -1, name, 1, &n);
    if (rc != 0) {
        LKV_LOGE("hold_profiles: profile '%s': %s", name, lkv_strerror(rc));
        return rc;
    }
    LKV_LOGI("holding profile '%s' (%llu documents now)", name, (unsigned long long)n);
    return 0;
}

static int hold_tenant(void *ctx, const char *name)
{
    hold_ctx *h = ctx;
    const lkv_auth *auth = lkv_tenancy_auth(h->ten);
    const lkv_tenant *t = strcmp(name, LKV_AUTH_DEFAULT_TENANT) == 0 ? lkv_auth_default_tenant(auth)
                                                                     : lkv_auth_find(auth, name);
    uint64_t n = 0;
    int rc = t != NULL ? lkv_store_hold_class(h->store, lkv_tenancy_index(h->ten, t), NULL, 1, &n)
                       : LKV_ENOTFOUND;
    if (rc != 0) {
        LKV_LOGE("hold_tenants: tenant '%s': %s", name, lkv_strerror(rc));
        return rc;
    }
    LKV_LOGI("holding tenant '%s' (%llu documents now)", name, (unsigned long long)n);
    return 0;
}

/* mkdir -p path (mode 0700 for created components). Returns 0 or -errno. */
static int mkdirs(const char *path)
{
    char buf[1024];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(buf)) {
        return -ENAMETOOLONG;
    }
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0700) != 0 && errno != EEXIST) {
                return -errno;
            }
            buf[i] = c;
        }
    }
    return 0;
}

/* Makes the data dir private to the daemon's user (see the file comment). Returns 0, or 2 (bad
 * configuration: not a directory, another user's) or 1 (chmod failed) after logging why. */
static int secure_data_dir(const char *dir)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        LKV_LOGE("option 'data_dir': cannot stat %s: %s", dir, strerror(errno));
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
        LKV_LOGE("option 'data_dir': %s is not a directory", dir);
        return 2;
    }
    if (st.st_uid != geteuid()) {
        LKV_LOGE("option 'data_dir': %s belongs to uid %u, not to lazykvd's uid %u: refusing to "
                 "keep cached data there (chown it to this user, or choose another data_dir)",
                 dir, (unsigned)st.st_uid, (unsigned)geteuid());
        return 2;
    }
    if ((st.st_mode & 077) != 0) {
        if (chmod(dir, 0700) != 0) {
            LKV_LOGE("option 'data_dir': %s is mode 0%03o and cannot be made 0700: %s", dir,
                     (unsigned)(st.st_mode & 0777), strerror(errno));
            return 1;
        }
        LKV_LOGW("data_dir %s was mode 0%03o (readable by other users): tightened to 0700", dir,
                 (unsigned)(st.st_mode & 0777));
    }
    return 0;
}

/* Raises the soft descriptor limit to the hard one and logs both. Returns the soft limit. */
static uint64_t raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        LKV_LOGW("getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
        return 1024;
    }
    rlim_t soft = rl.rlim_cur;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            LKV_LOGW("setrlimit(RLIMIT_NOFILE, %llu): %s; keeping %llu",
                     (unsigned long long)rl.rlim_max, strerror(errno), (unsigned long long)soft);
            rl.rlim_cur = soft;
        }
    }
    LKV_LOGI("descriptors: soft limit %llu (was %llu), hard limit %llu",
             (unsigned long long)rl.rlim_cur, (unsigned long long)soft,
             (unsigned long long)rl.rlim_max);
    return (uint64_t)rl.rlim_cur;
}

/* ---- The starting server (readiness; see the file comment) ------------------------------ */

static atomic_int g_ready; /* 0 until the real server takes calls (lkv_health.ready). */

static int starting_refuse(lkv_rpc *rpc)
{
    return lkv_rpc_errorf(rpc, LKV_EUNAVAIL,
                          "lazykvd is starting: the cold index is still loading; retry");
}

static int starting_unary(void *svc, lkv_rpc *rpc, const ProtobufCMessage *req)
{
    (void)svc;
    (void)req;
    return starting_refuse(rpc);
}

static int starting_next(void *svc, lkv_rpc *rpc)
{
    (void)svc;
    return starting_refuse(rpc);
}

/* The starting server's table: Health (NOT_SERVING: g_ready is 0) and every Cache and Admin
 * method refused with UNAVAILABLE, as the same kinds and request types as the real ones (the
 * request is read, bounded, and dropped; a Put is refused at its first message). */
static int starting_methods(lkv_health *health, lkv_method *out)
{
    lkv_cache_svc c;
    lkv_admin_svc a;
    lkv_cache_svc_init(&c, NULL, 0);
    lkv_admin_svc_init(&a, NULL, "", 0);
    int n = lkv_cache_svc_methods(&c, out);
    n += lkv_admin_svc_methods(&a, out + n);
    for (int i = 0; i < n; i++) {
        lkv_method m = {.path = out[i].path,
                        .kind = out[i].kind,
                        .req_desc = out[i].req_desc,
                        .max_request_bytes = 4096};
        if (m.kind == LKV_RPC_UNARY) {
            m.unary = starting_unary;
        } else if (m.kind == LKV_RPC_SERVER_STREAM) {
            m.start = starting_unary;
            m.next = starting_next;
        } else {
            m.on_message = starting_unary;
            m.on_end = starting_next;
        }
        out[i] = m;
    }
    n += lkv_health_methods(health, out + n);
    return n;
}

/* SIGHUP: re-reads the config (the same --config file and command-line overrides), applies
 * what can change live (tenants, tokens, quotas and rates, log level; certificates are re-read
 * whenever their files change) and logs what cannot. A config that does not parse or validate
 * changes nothing. */
static void reload(int argc, char **argv, lkv_config *cur, lkv_tenancy *ten, lkv_server *srv)
{
    static lkv_config next; /* Large: off the stack. */
    char err[LKV_CONFIG_ERR_MAX];
    int action;
    LKV_LOGI("received SIGHUP: reloading %s", cur->source[0] ? cur->source : "(no config file)");
    if (lkv_config_from_args(&next, argc, argv, &action, err, sizeof(err)) != 0) {
        LKV_LOGE("reload refused, nothing changed: %s", err);
        lkv_tenancy_reload_refused(ten);
        return;
    }
    if (strcmp(next.tls_cert_file, cur->tls_cert_file) != 0 ||
        strcmp(next.tls_key_file, cur->tls_key_file) != 0 ||
        strcmp(next.tls_client_ca_file, cur->tls_client_ca_file) != 0) {
        LKV_LOGW("reload: TLS file paths cannot change while the daemon runs (restart lazykvd); "
                 "replace the files in place instead: they are re-read when they change");
    }
    if (lkv_tenancy_reload(ten, &next, err, sizeof(err)) != 0) {
        LKV_LOGE("reload refused, nothing changed: %s", err);
        return;
    }
    if (next.log_level != cur->log_level) {
        lkv_log_set_level(next.log_level);
        LKV_LOGI("reload: log_level changed");
    }
    lkv_cluster_set_auth(g_cluster, lkv_tenancy_auth(ten)); /* Tenants added live: also here. */
    int tls = lkv_server_tls_check(srv);
    LKV_LOGI("reload done%s", tls == 1 ? " (new TLS certificate loaded)" : "");
    /* Keep what was applied; the rest stays as started (logged by lkv_tenancy_reload). */
    cur->log_level = next.log_level;
    cur->allow_plaintext_tokens = next.allow_plaintext_tokens;
}

/* Per-tier hit ratios from the store's counters (Prometheus: lazykv_store_tier_hit_ratio): hot =
 * hot hits / lookups; cold = cold hits / lookups that missed the hot tier (what the cold tier
 * was asked). */
static void tier_ratio_read(void *ctx, double *v, int n)
{
    lkv_store_stats st;
    lkv_store_stats_get(ctx, &st);
    double lookups = (double)(st.hits_hot + st.hits_cold + st.misses);
    double cold_asked = (double)(st.hits_cold + st.misses);
    if (n >= 4) {
        v[0] = lookups > 0 ? (double)st.hits_hot / lookups : 0.0;
        v[1] = cold_asked > 0 ? (double)st.hits_cold / cold_asked : 0.0;
        v[2] = lookups > 0 ? 1.0 - v[0] : 0.0;
        v[3] = cold_asked > 0 ? 1.0 - v[1] : 0.0;
    }
}

/* The Get staging ring (storage/lkv_stage.h) the cache service sends hot blocks of a CUDA
 * arena through (get_staging auto), or of any arena (always); none for off, or for a host
 * arena under auto (sent from its pages). A slot holds one Get message: max(the message
 * target, the largest block of a profile). Pinned memory for a CUDA arena. */
static int make_stage(const lkv_config *cfg, lkv_store *store, lkv_stats *stats,
                      lkv_cache_svc *cache, lkv_stage **out)
{
    lkv_store_arena_info ai;
    lkv_store_arena_info_get(store, &ai);
    *out = NULL;
    if (cfg->get_staging == LKV_GET_STAGING_OFF ||
        (cfg->get_staging == LKV_GET_STAGING_AUTO && ai.backend != LKV_HOT_CUDA)) {
        if (ai.backend == LKV_HOT_CUDA) {
            LKV_LOGI("get staging off: Get copies CUDA blocks into a per-call buffer");
        }
        return 0;
    }
    uint64_t slot = cache->get_target_bytes;
    for (int i = 0; i < lkv_store_profile_count(store); i++) {
        uint64_t bb = lkv_block_bytes(&lkv_store_profile_at(store, i)->shape);
        slot = bb > slot ? bb : slot;
    }
    int mem = ai.backend == LKV_HOT_CUDA ? LKV_STAGE_MEM_PINNED : LKV_STAGE_MEM_HOST;
    int rc = lkv_stage_create(slot, cfg->get_stage_slots, mem, cfg->get_stage_wait_ms, stats, out);
    if (rc != 0) {
        LKV_LOGE("cannot create the Get staging ring (%u x %" PRIu64 " bytes): %s",
                 cfg->get_stage_slots, slot, lkv_strerror(rc));
        return rc;
    }
    cache->stage_always = cfg->get_staging == LKV_GET_STAGING_ALWAYS;
    char b[32];
    LKV_LOGI("get staging ring: %u slots x %s%s, wait %" PRIu64 " ms", cfg->get_stage_slots,
             lkv_format_bytes(lkv_stage_slot_bytes(*out), b, sizeof(b)),
             mem == LKV_STAGE_MEM_PINNED ? " pinned" : " (host memory)", cfg->get_stage_wait_ms);
    return 0;
}

static void register_tier_ratios(lkv_stats *stats, lkv_store *store)
{
    static const lkv_stat_desc d[4] = {
        {"store_tier_hit_ratio", "tier=hot", LKV_STAT_GAUGE, "ratio",
         "Lookups the tier answered / lookups that reached it, since start.", "lookups",
         "hit_rate_hot"},
        {"store_tier_hit_ratio", "tier=cold", LKV_STAT_GAUGE, "ratio",
         "Lookups the tier answered / lookups that reached it, since start.", "lookups",
         "hit_rate_cold"},
        {"store_tier_miss_ratio", "tier=hot", LKV_STAT_GAUGE, "ratio",
         "Lookups the tier missed / lookups that reached it, since start.", NULL, NULL},
        {"store_tier_miss_ratio", "tier=cold", LKV_STAT_GAUGE, "ratio",
         "Lookups the tier missed / lookups that reached it, since start.", NULL, NULL},
    };
    if (lkv_stats_register(stats, d, 4, tier_ratio_read, store, NULL) != 0) {
        LKV_LOGW("stats: per-tier hit ratios not registered");
    }
}

int main(int argc, char **argv)
{
    static lkv_config cfg; /* Large (profiles): keep it off the stack. */
    char err[LKV_CONFIG_ERR_MAX];
    int action;
    if (lkv_config_from_args(&cfg, argc, argv, &action, err, sizeof(err)) != 0) {
        fprintf(stderr, "lazykvd: %s\n", err);
        return 2;
    }
    if (action == LKV_CONFIG_HELP) {
        lkv_config_usage(stdout);
        return 0;
    }
    if (action == LKV_CONFIG_VERSION) {
        printf("lazykvd %s\n", LAZYKVD_VERSION);
        return 0;
    }
    char summary[2048];
    lkv_config_summary(&cfg, summary, sizeof(summary));
    if (action == LKV_CONFIG_CHECK) {
        printf("configuration ok: %s\n", summary);
        return 0;
    }
    lkv_log_set_level(cfg.log_level);

    /* Block the shutdown signals before any thread exists: every thread inherits the mask and
     * only the main thread's sigwait takes them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    umask(077); /* Before any file exists: RocksDB, the secret, logs are private. */
    LKV_LOGI("lazykvd %s starting (pid %d)", LAZYKVD_VERSION, (int)getpid());
    LKV_LOGI("config: %s", summary);
    uint64_t nofile = raise_nofile();
    /* max_connections 0: what the descriptors allow, keeping 256 for RocksDB, the arena, logs. */
    uint32_t max_conns = cfg.max_connections;
    if (max_conns == 0) {
        uint64_t m = nofile > 256 + 16 ? nofile - 256 : 16;
        max_conns = m > (1u << 24) ? (1u << 24) : (uint32_t)m;
    }
    if (cfg.tls_cert_file[0] != '\0') {
        LKV_LOGI("connections: TLS, gRPC's accept loop: no connection caps; %u streams per "
                 "connection, handshake timeout %" PRIu64 " ms, idle timeout %" PRIu64
                 " ms (0: gRPC's defaults); %u calls in flight per peer",
                 cfg.tls_max_streams, cfg.tls_handshake_timeout_ms, cfg.tls_idle_timeout_ms,
                 cfg.max_calls_per_peer);
    } else {
        LKV_LOGI("connections: at most %u open, %u per peer (%s accept loop); %u calls in flight "
                 "per peer",
                 max_conns, cfg.max_connections_per_peer,
                 cfg.grpc_listener ? "gRPC's" : "lazykvd's", cfg.max_calls_per_peer);
    }

    int rc = mkdirs(cfg.data_dir);
    if (rc != 0) {
        LKV_LOGE("option 'data_dir': cannot create %s: %s", cfg.data_dir, strerror(-rc));
        return 1;
    }
    rc = secure_data_dir(cfg.data_dir);
    if (rc != 0) {
        return rc;
    }
    lkv_tls_opts tls = {.cert_file = cfg.tls_cert_file,
                        .key_file = cfg.tls_key_file,
                        .client_ca_file = cfg.tls_client_ca_file};
    /* The starting server (readiness): Health NOT_SERVING while the store opens. */
    static const char *const services[] = {"lazykv.v1.Cache", "lazykv.v1.Admin", NULL};
    lkv_health start_health;
    lkv_health_init(&start_health, services);
    start_health.ready = &g_ready;
    lkv_method start_m[LKV_CACHE_SVC_METHODS + LKV_ADMIN_SVC_METHODS + LKV_HEALTH_METHODS];
    int start_n = starting_methods(&start_health, start_m);
    lkv_server_opts sso = {.listen = cfg.listen,
                           .threads = 1,
                           .max_message_bytes = cfg.max_message_bytes,
                           .max_conns = max_conns,
                           .max_conns_per_peer = cfg.max_connections_per_peer,
                           .max_calls_per_peer = cfg.max_calls_per_peer,
                           .tls_max_streams = cfg.tls_max_streams,
                           .tls_handshake_timeout_ms = cfg.tls_handshake_timeout_ms,
                           .tls_idle_timeout_ms = cfg.tls_idle_timeout_ms,
                           .grpc_listener = cfg.grpc_listener,
                           .tls = cfg.tls_cert_file[0] != '\0' ? &tls : NULL};
    lkv_server *start_srv = NULL;
    rc = lkv_server_create(&sso, start_m, start_n, &start_srv, err, sizeof(err));
    if (rc != 0) {
        LKV_LOGE("%s", err);
        return rc == LKV_ECONFIG ? 2 : 1;
    }
    char listen_addr[sizeof(cfg.listen) + 16];
    snprintf(listen_addr, sizeof(listen_addr), "%s", lkv_server_address(start_srv));
    LKV_LOGI("health: NOT_SERVING on %s until the store is open (other calls: UNAVAILABLE)",
             listen_addr);
    /* Fault injection (tests): a slow cold-index load. */
    const char *delay = getenv("LKV_FAULT_OPEN_DELAY_MS");
    if (delay != NULL && atoi(delay) > 0) {
        LKV_LOGW("fault injection: the store opens %d ms late (LKV_FAULT_OPEN_DELAY_MS)",
                 atoi(delay));
        struct timespec ts = {atoi(delay) / 1000, (long)(atoi(delay) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    /* One statistics registry for the process: the store, the lease table and the RPC engine
     * register in it; Admin Stats reads it. */
    lkv_stats *stats = NULL;
    lkv_stats_create(&stats);
    lkv_store_config scfg;
    lkv_config_to_store(&cfg, &scfg);
    scfg.stats = stats;
    lkv_store *store = NULL;
    rc = lkv_store_open(&scfg, &store);
    if (rc != 0) {
        LKV_LOGE("cannot open the store in %s: %s (%s)", cfg.data_dir, lkv_strerror(rc),
                 lkv_err_name(rc));
        lkv_server_destroy(start_srv);
        lkv_stats_destroy(stats);
        return rc == LKV_ECONFIG ? 2 : 1;
    }
    lkv_store_stats st;
    lkv_store_stats_get(store, &st);
    char hb[32];
    LKV_LOGI("store open: hot %s in %" PRIu64 " pages, %" PRIu64 " cold documents",
             lkv_format_bytes(st.hot_budget, hb, sizeof(hb)), st.hot_pages_total, st.cold_docs);

    lkv_tenancy *ten = NULL;
    rc = lkv_tenancy_create(&cfg, stats, store, &ten, err, sizeof(err));
    if (rc != 0) {
        LKV_LOGE("%s", err);
        lkv_store_close(store);
        lkv_stats_destroy(stats);
        return rc == LKV_ECONFIG ? 2 : 1;
    }
    char roles[64];
    lkv_auth_roles_format(cfg.loopback_roles, roles, sizeof(roles));
    LKV_LOGI("auth: %d tenant(s); callers on loopback without a token get roles: %s%s",
             lkv_tenancy_count(ten), roles,
             cfg.allow_insecure_bind && cfg.n_tenants == 0 && !lkv_auth_addr_is_loopback(cfg.listen)
                 ? " (WARNING: non-loopback listen without tenants: allow_insecure_bind)"
                 : "");
    if (cfg.tls_cert_file[0] == '\0' && !lkv_auth_addr_is_loopback(cfg.listen)) {
        LKV_LOGW("listen %s is not loopback and TLS is off: traffic is in clear text%s", cfg.listen,
                 cfg.allow_plaintext_tokens ? " and bearer tokens are accepted over it "
                                              "(allow_plaintext_tokens)"
                                            : "; bearer tokens from remote peers are refused");
    }
    register_tier_ratios(stats, store);

    lkv_cache_svc cache;
    lkv_admin_svc admin;
    lkv_health health;
    lkv_cache_svc_init(&cache, store, cfg.durability);
    lkv_tenancy_wire_cache(ten, &cache);
    cache.max_lookup_docs = cfg.max_lookup_docs;
    cache.max_request_bytes = cfg.max_request_bytes;
    cache.max_docref_bytes = lkv_config_docref_bytes(&cfg);

    lkv_lease_limits lim = {.max_leases = cfg.max_leases,
                            .max_docs = cfg.max_lease_docs,
                            .max_ttl_ms = (uint32_t)cfg.max_lease_ttl_ms};
    lkv_lease_table *leases = NULL;
    rc = lkv_lease_table_create(store, &lim, &leases);
    if (rc != 0) {
        LKV_LOGE("cannot create the lease table: %s", lkv_strerror(rc));
        lkv_tenancy_destroy(ten);
        lkv_store_close(store);
        lkv_stats_destroy(stats);
        return 1;
    }
    cache.leases = leases;

    hold_ctx hc = {store, ten};
    if (lkv_config_each_name(cfg.hold_profiles, hold_profile, &hc) != 0 ||
        lkv_config_each_name(cfg.hold_tenants, hold_tenant, &hc) != 0) {
        lkv_lease_table_destroy(leases);
        lkv_tenancy_destroy(ten);
        lkv_store_close(store);
        lkv_stats_destroy(stats);
        return 1;
    }
    lkv_admin_svc_init(&admin, store, lkv_durability_name(cfg.durability), cfg.threads);
    admin.n_tenants = LKV_TENANCY_SLOTS;
    admin.isolate = lkv_tenancy_isolated(ten);
    admin.index_of = lkv_tenancy_index;
    admin.index_ctx = ten;
    admin.tenant_names = lkv_tenancy_names(ten);
    admin.tenant_lookups = lkv_tenancy_lookups(ten);
    admin.n_named = lkv_tenancy_named;
    lkv_health_init(&health, services);
    /* Cluster-internal calls name their tenant in the current table (reload passes the new one
     * on: lkv_cluster_set_auth; replaced tables stay allocated, tenant slots are stable). */
    rc = lkv_cluster_create(&cfg, store, lkv_tenancy_auth(ten), LAZYKVD_VERSION, &g_cluster, err,
                            sizeof(err));
    if (rc != 0) {
        LKV_LOGE("%s", err);
        lkv_lease_table_destroy(leases);
        lkv_tenancy_destroy(ten);
        lkv_store_close(store);
        lkv_stats_destroy(stats);
        return 2;
    }
    cache.route = lkv_cluster_route;
    cache.route_ctx = g_cluster;
    lkv_stage *stage = NULL;
    if (make_stage(&cfg, store, stats, &cache, &stage) != 0) {
        lkv_cluster_destroy(g_cluster);
        lkv_lease_table_destroy(leases);
        lkv_tenancy_destroy(ten);
        lkv_store_close(store);
        lkv_stats_destroy(stats);
        return 1;
    }
    cache.stage = stage;
    lkv_method methods[LKV_CACHE_SVC_METHODS + LKV_CLUSTER_METHODS + LKV_ADMIN_SVC_METHODS +
                       LKV_HEALTH_METHODS];
    int n = 0;
    n += lkv_cache_svc_methods(&cache, methods + n);
    for (int i = 0; i < n; i++) {
        if (strcmp(methods[i].path, "/lazykv.v1.Cache/Get") == 0) {
            lkv_cluster_set_get(g_cluster, &methods[i]); /* Moved documents: lkv_transfer.h. */
        }
        if (strcmp(methods[i].path, "/lazykv.v1.Cache/Attach") == 0) {
            lkv_cluster_set_attach(g_cluster, &methods[i]); /* Local replicas. */
        }
    }
    n += lkv_cluster_methods(g_cluster, methods + n);
    n += lkv_admin_svc_methods(&admin, methods + n);
    n += lkv_health_methods(&health, methods + n);

    lkv_server_opts so = {.listen = listen_addr, /* The starting server's (real port). */
                          .threads = cfg.threads,
                          .pool_threads = cfg.pool_threads,
                          .max_message_bytes = cfg.max_message_bytes,
                          .max_conns = max_conns,
                          .max_conns_per_peer = cfg.max_connections_per_peer,
                          .max_calls_per_peer = cfg.max_calls_per_peer,
                          .tls_max_streams = cfg.tls_max_streams,
                          .tls_handshake_timeout_ms = cfg.tls_handshake_timeout_ms,
                          .tls_idle_timeout_ms = cfg.tls_idle_timeout_ms,
                          .grpc_listener = cfg.grpc_listener,
                          .admit = admit,
                          .admit_ctx = ten,
                          .stats = stats};
    if (cfg.tls_cert_file[0] != '\0') {
        so.tls = &tls;
    }
    /* Hand the address over: the starting server goes (its connections are dropped, clients
     * reconnect), the real one binds the same port; Health is SERVING from here. */
    lkv_server_shutdown(start_srv, 0);
    lkv_server_destroy(start_srv);
    atomic_store(&g_ready, 1);
    lkv_server *srv = NULL;
    rc = lkv_server_create(&so, methods, n, &srv, err, sizeof(err));
    if (rc != 0) {
        LKV_LOGE("%s", err);
        lkv_cluster_destroy(g_cluster);
        lkv_lease_table_destroy(leases);
        lkv_stage_destroy(stage);
        lkv_tenancy_destroy(ten);
        lkv_store_close(store);
        lkv_stats_destroy(stats);
        return rc == LKV_ECONFIG ? 2 : 1;
    }
    lkv_admin_svc_set_server(&admin, srv);
    LKV_LOGI("listening on %s (%s, %d polling threads, %d pool threads, max message %s)",
             lkv_server_address(srv),
             so.tls == NULL                      ? "plaintext"
             : cfg.tls_client_ca_file[0] != '\0' ? "TLS, client certificates required"
                                                 : "TLS",
             cfg.threads, cfg.pool_threads,
             lkv_format_bytes(cfg.max_message_bytes, hb, sizeof(hb)));
    rc = lkv_cluster_start(g_cluster, lkv_server_address(srv), err, sizeof(err));
    if (rc != 0) {
        LKV_LOGE("%s", err);
        lkv_server_shutdown(srv, 0);
        lkv_cluster_destroy(g_cluster);
        lkv_lease_table_destroy(leases); /* Before the server: see the shutdown below. */
        lkv_server_destroy(srv);
        lkv_stage_destroy(stage);
        lkv_tenancy_destroy(ten);
        lkv_store_close(store);
        lkv_stats_destroy(stats);
        return 2;
    }
    lkv_metrics *metrics = NULL;
    if (cfg.metrics_listen[0] != '\0') {
        /* Without tenants there are no tokens: the address rule alone guards it (loopback, or
         * allow_insecure_bind), as before tenants existed. */
        lkv_metrics_opts mo = {.authorize = cfg.n_tenants > 0 ? metrics_authorize : NULL,
                               .auth_ctx = ten};
        char *pem[2] = {NULL, NULL};
        rc = 0;
        if (cfg.metrics_tls) {
            const char *paths[2] = {cfg.tls_cert_file, cfg.tls_key_file};
            for (int i = 0; i < 2 && rc == 0; i++) {
                char why[400];
                if ((pem[i] = lkv_tls_read_pem(paths[i], why, sizeof(why))) == NULL) {
                    snprintf(err, sizeof(err), "option 'metrics_tls': %s", why);
                    rc = LKV_ECONFIG;
                }
            }
            mo.tls_cert_pem = pem[0];
            mo.tls_key_pem = pem[1];
        }
        if (rc == 0) {
            rc = lkv_metrics_start(stats, cfg.metrics_listen, &mo, &metrics, err, sizeof(err));
        }
        for (int i = 0; i < 2; i++) {
            if (pem[i] != NULL) {
                sodium_memzero(pem[i], strlen(pem[i])); /* The key, at least. */
                free(pem[i]);
            }
        }
        if (rc != 0) {
            LKV_LOGE("%s", err);
            lkv_server_shutdown(srv, 0);
            lkv_cluster_destroy(g_cluster);
            lkv_lease_table_destroy(leases); /* Before the server: see the shutdown below. */
            lkv_server_destroy(srv);
            lkv_stage_destroy(stage);
            lkv_tenancy_destroy(ten);
            lkv_store_close(store);
            lkv_stats_destroy(stats);
            return 1;
        }
        LKV_LOGI("metrics on %s://%s/metrics (%s)", cfg.metrics_tls ? "https" : "http",
                 lkv_metrics_address(metrics),
                 cfg.n_tenants > 0 ? "scrapes are authorised as Admin calls"
                                   : "no tenants: no authorisation");
    }
    if (metrics != NULL) {
        printf("lazykvd metrics on %s\n", lkv_metrics_address(metrics)); /* Before "listening". */
    }
    printf("lazykvd listening on %s\n", lkv_server_address(srv));
    fflush(stdout);

    int sig = 0;
    for (;;) {
        if (sigwait(&sigs, &sig) != 0) {
            continue;
        }
        if (sig != SIGHUP) {
            break;
        }
        reload(argc, argv, &cfg, ten, srv);
    }
    LKV_LOGI("received %s: shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    lkv_cluster_leave(g_cluster); /* Peers re-home our share now, not after the lease TTL. */
    lkv_metrics_stop(metrics);
    lkv_server_shutdown(srv, cfg.shutdown_grace_ms);
    lkv_cluster_destroy(g_cluster); /* Forwarded calls still out: cancelled, waited for. */
    /* Before the server is destroyed: waking a Reserve that waits for a reservation resumes
     * its (ended) call through the server's ticket table, which must still exist. */
    lkv_lease_table_destroy(leases); /* Unpins what live leases hold, aborts reservations. */
    lkv_server_destroy(srv);
    lkv_stage_destroy(stage); /* After the server: gRPC has dropped every slice over it. */
    lkv_tenancy_destroy(ten);
    LKV_LOGI("shutdown: server stopped; flushing write-back documents and closing the store");
    lkv_store_stats_get(store, &st);
    uint64_t pending = st.wb_pending;
    rc = lkv_store_close(store);
    if (rc != 0) {
        LKV_LOGE("shutdown: store close failed: %s; some write-back documents may not be durable",
                 lkv_strerror(rc));
        return 1;
    }
    lkv_stats_destroy(stats);
    LKV_LOGI("shutdown: store closed (%" PRIu64 " queued document(s) flushed); bye", pending);
    return 0;
}
