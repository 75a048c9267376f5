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
#include <time.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lkv_admin_svc.h"
#include "lkv_auth.h"
#include "lkv_cache_svc.h"
#include "lkv_config.h"
#include "lkv_err.h"
#include "lkv_health.h"
#include "lkv_lease.h"
#include "lkv_log.h"
#include "lkv_server.h"
#include "lkv_store.h"
#include "lkv_wirekey.h"

#define LAZYKVD_VERSION "0.1.0"

/* 0 while the store opens (the cold index loads), 1 once lazykvd takes calls; read by admit
 * and Health (lkv_health.ready). Written once, by main, with release order. */
static atomic_int g_ready;

/* Admission (lkv_server_opts.admit): authenticates the bearer token of every call and checks
 * the method's role (daemon/lkv_auth.h), then attaches the caller's tenant as the principal.
 * ctx is the tenant table. */
static int admit(void *ctx, lkv_rpc *rpc)
{
    const lkv_auth *auth = ctx;
    /* gRPC's default metadata limit is 8 KiB, so a header that is present always fits and is
     * never mistaken for an absent one. */
    char buf[8192 + 1], msg[256];
    const char *path = lkv_rpc_method(rpc);
    const lkv_tenant *t = NULL;
    int count = lkv_rpc_metadata_count(rpc, "authorization");
    int n = lkv_rpc_metadata(rpc, "authorization", buf, sizeof(buf));
    if (count > 1 || (count == 1 && n < 0)) {
        /* Never fall back to anonymous for a header that is present but unusable. */
        return lkv_rpc_errorf(rpc, LKV_EUNAUTH, "malformed credentials: %s",
                              count > 1 ? "the authorization header was sent more than once"
                                        : "the authorization header is too long");
    }
    int rc = lkv_auth_check(auth, n >= 0 ? buf : NULL, n >= 0 ? (size_t)n : 0,
                            lkv_auth_peer_is_loopback(lkv_rpc_peer(rpc)),
                            lkv_auth_method_roles(path, strlen(path)), &t, msg, (int)sizeof(msg));
    if (rc < 0) {
        return lkv_rpc_errorf(rpc, rc, "%s", msg);
    }
    lkv_rpc_set_principal(rpc, t);
    /* Readiness: until the store is open only Health is served (it says NOT_SERVING). */
    if (!atomic_load_explicit(&g_ready, memory_order_acquire) &&
        strncmp(path, "/grpc.health.v1.Health/", 23) != 0) {
        return lkv_rpc_errorf(rpc, LKV_EUNAVAIL,
                              "lazykvd is starting: the cold index is still loading; retry");
    }
    return 0;
}

/* lkv_cache_svc.salt_of: a call's documents are keyed with its tenant's salt. */
static const uint8_t *tenant_salt(const void *principal)
{
    return ((const lkv_tenant *)principal)->salt;
}

/* lkv_cache_svc.index_of: the tenant's dense index (ctx is the tenant table). */
static int tenant_index(const void *ctx, const void *principal)
{
    return lkv_auth_index(ctx, principal);
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
    LKV_LOGI("connections: at most %u open, %u per peer (%s accept loop)", max_conns,
             cfg.max_connections_per_peer, cfg.grpc_listener ? "gRPC's" : "lazykvd's");

    int rc = mkdirs(cfg.data_dir);
    if (rc != 0) {
        LKV_LOGE("option 'data_dir': cannot create %s: %s", cfg.data_dir, strerror(-rc));
        return 1;
    }
    rc = secure_data_dir(cfg.data_dir);
    if (rc != 0) {
        return rc;
    }
    /* One statistics registry for the process: the store, the lease table and the RPC engine
     * register in it; Admin Stats reads it. */
    lkv_stats *stats = NULL;
    lkv_stats_create(&stats);
    lkv_auth *auth = NULL;
    rc = lkv_config_auth(&cfg, &auth, err, sizeof(err));
    if (rc != 0) {
        LKV_LOGE("%s", err);
        return 2;
    }
    char roles[64];
    lkv_auth_roles_format(cfg.loopback_roles, roles, sizeof(roles));
    LKV_LOGI("auth: %d tenant(s); callers on loopback without a token get roles: %s%s",
             lkv_auth_count(auth), roles,
             cfg.allow_insecure_bind && cfg.n_tenants == 0 && !lkv_auth_addr_is_loopback(cfg.listen)
                 ? " (WARNING: non-loopback listen without tenants: allow_insecure_bind)"
                 : "");

    /* The services exist before the store: the server starts first and answers Health
     * NOT_SERVING (every other call UNAVAILABLE, in admit) while the cold index loads. Their
     * store and lease fields are filled in below, before g_ready is published. */
    static const char *const services[] = {"lazykv.v1.Cache", "lazykv.v1.Admin", NULL};
    lkv_cache_svc cache;
    lkv_admin_svc admin;
    lkv_health health;
    lkv_cache_svc_init(&cache, NULL, cfg.durability);
    cache.salt_of = tenant_salt;
    cache.max_lookup_docs = cfg.max_lookup_docs;
    cache.max_request_bytes = cfg.max_request_bytes;
    cache.max_docref_bytes = lkv_config_docref_bytes(&cfg);

    /* Per-tenant state, by lkv_auth_index: wire keys (lkv_wirekey.h), lookup counters, names. */
    int n_idx = lkv_auth_count(auth) + 1;
    lkv_wirekey *wire = lkv_xcalloc((size_t)n_idx, sizeof(*wire));
    lkv_tenant_lookups *t_lookups = lkv_xcalloc((size_t)n_idx, sizeof(*t_lookups));
    const char **t_names = lkv_xcalloc((size_t)n_idx, sizeof(*t_names));
    uint8_t secret[LKV_WIREKEY_SECRET_BYTES] = {0};
    int isolate = lkv_auth_count(auth) > 0;
    if (isolate && lkv_wirekey_secret_load(cfg.data_dir, secret) != 0) {
        lkv_auth_destroy(auth);
        return 1;
    }
    for (int i = -1; i < cfg.n_tenants; i++) {
        const lkv_tenant *t =
            i < 0 ? lkv_auth_default_tenant(auth) : lkv_auth_find(auth, cfg.tenants[i].name);
        int idx = t != NULL ? lkv_auth_index(auth, t) : -1;
        if (idx >= 0 && idx < n_idx) {
            lkv_wirekey_init(&wire[idx], secret, t->salt, !isolate);
            t_names[idx] = t->name;
        }
    }
    memset(secret, 0, sizeof(secret));
    cache.index_of = tenant_index;
    cache.index_ctx = auth;
    cache.n_tenants = n_idx;
    cache.wire = wire;
    cache.lookups = t_lookups;

    lkv_admin_svc_init(&admin, NULL, lkv_durability_name(cfg.durability), cfg.threads);
    admin.n_tenants = n_idx;
    admin.isolate = isolate;
    admin.index_of = tenant_index;
    admin.index_ctx = auth;
    admin.tenant_names = t_names;
    admin.tenant_lookups = t_lookups;
    lkv_health_init(&health, services);
    health.ready = &g_ready;
    lkv_method methods[LKV_CACHE_SVC_METHODS + LKV_ADMIN_SVC_METHODS + LKV_HEALTH_METHODS];
    int n = 0;
    n += lkv_cache_svc_methods(&cache, methods + n);
    n += lkv_admin_svc_methods(&admin, methods + n);
    n += lkv_health_methods(&health, methods + n);

    lkv_server_opts so = {.listen = cfg.listen,
                          .threads = cfg.threads,
                          .pool_threads = cfg.pool_threads,
                          .max_conns = max_conns,
                          .max_conns_per_peer = cfg.max_connections_per_peer,
                          .grpc_listener = cfg.grpc_listener,
                          .max_message_bytes = cfg.max_message_bytes,
                          .admit = admit,
                          .admit_ctx = auth,
                          .stats = stats};
    lkv_server *srv = NULL;
    rc = lkv_server_create(&so, methods, n, &srv, err, sizeof(err));
    if (rc != 0) {
        LKV_LOGE("%s", err);
        lkv_auth_destroy(auth);
        return 1;
    }
    lkv_admin_svc_set_server(&admin, srv);
    LKV_LOGI("health: NOT_SERVING on %s until the store is open (other calls: UNAVAILABLE)",
             lkv_server_address(srv));

    /* Fault injection (tests): a slow cold-index load. */
    const char *delay = getenv("LKV_FAULT_OPEN_DELAY_MS");
    if (delay != NULL && atoi(delay) > 0) {
        LKV_LOGW("fault injection: the store opens %d ms late (LKV_FAULT_OPEN_DELAY_MS)",
                 atoi(delay));
        struct timespec ts = {atoi(delay) / 1000, (long)(atoi(delay) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    lkv_store_config scfg;
    lkv_config_to_store(&cfg, &scfg);
    scfg.stats = stats;
    lkv_store *store = NULL;
    rc = lkv_store_open(&scfg, &store);
    if (rc != 0) {
        LKV_LOGE("cannot open the store in %s: %s (%s)", cfg.data_dir, lkv_strerror(rc),
                 lkv_err_name(rc));
        lkv_server_shutdown(srv, 0);
        lkv_server_destroy(srv);
        lkv_auth_destroy(auth);
        return rc == LKV_ECONFIG ? 2 : 1;
    }
    lkv_store_stats st;
    lkv_store_stats_get(store, &st);
    char hb[32];
    LKV_LOGI("store open: hot %s in %" PRIu64 " pages, %" PRIu64 " cold documents",
             lkv_format_bytes(st.hot_budget, hb, sizeof(hb)), st.hot_pages_total, st.cold_docs);

    lkv_lease_limits lim = {.max_leases = cfg.max_leases,
                            .max_docs = cfg.max_lease_docs,
                            .max_ttl_ms = (uint32_t)cfg.max_lease_ttl_ms};
    lkv_lease_table *leases = NULL;
    rc = lkv_lease_table_create(store, &lim, &leases);
    if (rc != 0) {
        LKV_LOGE("cannot create the lease table: %s", lkv_strerror(rc));
        lkv_server_shutdown(srv, 0);
        lkv_server_destroy(srv);
        lkv_auth_destroy(auth);
        lkv_store_close(store);
        return 1;
    }
    cache.store = store;
    cache.leases = leases;
    admin.store = store;
    /* Publishes the fields above to every polling thread (admit reads g_ready with acquire). */
    atomic_store_explicit(&g_ready, 1, memory_order_release);
    LKV_LOGI("listening on %s (%d polling threads, %d pool threads, max message %s): SERVING",
             lkv_server_address(srv), cfg.threads, cfg.pool_threads,
             lkv_format_bytes(cfg.max_message_bytes, hb, sizeof(hb)));
    printf("lazykvd listening on %s\n", lkv_server_address(srv));
    fflush(stdout);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    LKV_LOGI("received %s: shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    lkv_server_shutdown(srv, cfg.shutdown_grace_ms);
    lkv_server_destroy(srv);
    lkv_lease_table_destroy(leases); /* Unpins what live leases hold. */
    lkv_auth_destroy(auth);
    free(wire);
    free(t_lookups);
    free(t_names);
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
