/*
 * auth_edge_server.c: a test server that runs lkv_auth at a real gRPC edge (the daemon's RPC
 * engine, daemon/lkv_server.h) exactly as lazykvd is meant to, so that tests/daemon/
 * test_auth_edge.py can drive it with the Python client over real gRPC: the bearer token in the
 * "authorization" metadata, gRPC core's peer strings for loopback, the status codes and messages
 * clients see.
 *
 * Every call passes the engine's admission hook (admit below), which runs lkv_auth_check and
 * attaches the caller's tenant as the call's principal; the handlers only read it.
 *
 * Tenants: alice (data) and bob (data, admin), tokens EDGE_ALICE / EDGE_BOB below.
 *   Lookup  (role data)   answers one DocStatus per requested document whose profile field is
 *                         the caller's tenant name and whose key is the tenant's salt, so the
 *                         test can see who the server thinks it is talking to.
 *   Stats   (role admin)  answers info "tenant:NAME".
 *   Health  (no role)     the daemon's grpc.health.v1 service.
 *
 * Usage: auth_edge_server [LOOPBACK_ROLES]   (default "data,worker,admin"; "none" needs tokens)
 * Prints "auth_edge_server listening on HOST:PORT" on stdout; exits on SIGTERM or stdin EOF.
 */
#include <assert.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "lazykv/v1/admin.pb-c.h"
#include "lazykv/v1/cache.pb-c.h"
#include "lkv_auth.h"
#include "lkv_health.h"
#include "lkv_log.h"
#include "lkv_server.h"

#define EDGE_ALICE "lkv_edge-alice-token"
#define EDGE_BOB   "lkv_edge-bob-token"

static lkv_auth *auth;

/* The wiring recipe of lkv_auth.h as the engine's admission hook (lkv_server_opts.admit):
 * authenticate and authorise one call, attach its tenant as the call's principal. */
static int admit(void *ctx, lkv_rpc *rpc)
{
    const lkv_tenant *t;
    /* 8 KiB: gRPC's default limit on all metadata, so a present header always fits and is
     * never mistaken for an absent one (lkv_rpc_metadata returns -1 for both). */
    char buf[8192 + 1], msg[256];
    const char *path = lkv_rpc_method(rpc);
    int n = lkv_rpc_metadata(rpc, "authorization", buf, sizeof(buf));
    int rc = lkv_auth_check(ctx, n >= 0 ? buf : NULL, n >= 0 ? (size_t)n : 0,
                            lkv_auth_peer_is_loopback(lkv_rpc_peer(rpc)),
                            lkv_auth_method_roles(path, strlen(path)), &t, msg, sizeof(msg));
    if (rc < 0) {
        return lkv_rpc_errorf(rpc, rc, "%s", msg);
    }
    lkv_rpc_set_principal(rpc, t);
    return 0;
}

static int lookup(void *svc, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    const Lazykv__V1__LookupRequest *req = (const Lazykv__V1__LookupRequest *)m;
    Lazykv__V1__LookupResponse resp = LAZYKV__V1__LOOKUP_RESPONSE__INIT;
    Lazykv__V1__DocStatus st[8], *stp[8];
    const lkv_tenant *t = lkv_rpc_principal(rpc);
    size_t n = req->n_docs < 8 ? req->n_docs : 8;

    (void)svc;
    assert(t != NULL); /* admit ran and attached it. */
    for (size_t i = 0; i < n; i++) {
        lazykv__v1__doc_status__init(&st[i]);
        st[i].profile = (char *)t->name;
        st[i].key.data = (uint8_t *)t->salt;
        st[i].key.len = LKV_AUTH_SALT_BYTES;
        st[i].tier = LAZYKV__V1__TIER__TIER_ABSENT;
        stp[i] = &st[i];
    }
    resp.n_docs = n;
    resp.docs = stp;
    return lkv_rpc_reply(rpc, &resp.base);
}

static int stats(void *svc, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    Lazykv__V1__StatsResponse resp = LAZYKV__V1__STATS_RESPONSE__INIT;
    const lkv_tenant *t = lkv_rpc_principal(rpc);
    char info[128];

    (void)svc;
    (void)m;
    assert(t != NULL);
    snprintf(info, sizeof(info), "tenant:%s\n", t->name);
    resp.info = info;
    return lkv_rpc_reply(rpc, &resp.base);
}

static void add_tenant(const char *name, const char *token, const char *roles)
{
    char line[128], err[256];
    const char *k[2] = {"token_hash", "roles"};
    const char *v[2];
    lkv_tenant t;

    if (lkv_auth_hash_line(NULL, token, line, sizeof(line)) < 0) {
        lkv_panic("hash_line");
    }
    v[0] = strchr(line, '=') + 2;
    v[1] = roles;
    if (lkv_tenant_parse(name, k, v, 2, &t, err, sizeof(err)) < 0 ||
        lkv_auth_add(auth, &t, err, sizeof(err)) < 0) {
        lkv_panic("tenant %s: %s", name, err);
    }
}

int main(int argc, char **argv)
{
    static const char *const services[] = {"lazykv.v1.Cache", NULL};
    lkv_method methods[2 + LKV_HEALTH_METHODS] = {
        {.path = "/lazykv.v1.Cache/Lookup",
         .kind = LKV_RPC_UNARY,
         .req_desc = &lazykv__v1__lookup_request__descriptor,
         .unary = lookup},
        {.path = "/lazykv.v1.Admin/Stats",
         .kind = LKV_RPC_UNARY,
         .req_desc = &lazykv__v1__stats_request__descriptor,
         .unary = stats},
    };
    lkv_server_opts so = {.listen = "127.0.0.1:0", .threads = 2, .max_message_bytes = 1 << 20};
    lkv_health health;
    lkv_server *srv;
    uint32_t loopback_roles = LKV_ROLE_ALL;
    char err[256];
    int n = 2, c;

    if (argc > 1 && lkv_auth_roles_parse(argv[1], &loopback_roles, err, sizeof(err)) < 0) {
        fprintf(stderr, "auth_edge_server: %s\n", err);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (lkv_auth_create(NULL, loopback_roles, &auth) < 0) {
        return 1;
    }
    add_tenant("alice", EDGE_ALICE, "data");
    add_tenant("bob", EDGE_BOB, "data,admin");
    so.admit = admit;
    so.admit_ctx = auth;
    lkv_health_init(&health, services);
    n += lkv_health_methods(&health, methods + n);
    if (lkv_server_create(&so, methods, n, &srv, err, sizeof(err)) < 0) {
        fprintf(stderr, "auth_edge_server: %s\n", err);
        return 1;
    }
    printf("auth_edge_server listening on %s\n", lkv_server_address(srv));
    fflush(stdout);
    while ((c = getchar()) != EOF) { /* The test closes stdin (or sends SIGTERM) to stop us. */
    }
    lkv_server_shutdown(srv, 1000);
    lkv_server_destroy(srv);
    lkv_auth_destroy(auth);
    return 0;
}
