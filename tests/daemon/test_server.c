/*
 * test_server.c: the RPC engine (daemon/lkv_server.c) with test services, driven over real gRPC
 * by the C client library (client/lkv_client.c). No store: the services are scripted here, so
 * the engine's own duties are what is tested: the admission hook and principals, unary /
 * client-streaming / server-streaming state machines, replies over the message limit, errors
 * mid-stream, deadlines checked before the next step, cleanup exactly once per call (also when
 * the client walks away), and a clean shutdown.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "grpc/health/v1/health.pb-c.h"
#include "lazykv/v1/admin.pb-c.h"
#include "lazykv/v1/cache.pb-c.h"
#include "lkv_client.h"
#include "lkv_log.h"
#include "lkv_server.h"
#include "lkv_test.h"

#define MAX_MSG    (64 * 1024)
#define BLOCK      64
#define LOOKUP_MAX 2048 /* Lookup's own request bound (lkv_method.max_request_bytes). */

static atomic_int n_admit, n_stats, n_cleanup_get, n_cleanup_put, n_next, n_put_end;
static const char *const admin_principal = "admin-principal";

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Admission: Stats needs "authorization: Bearer ok-admin"; everything else is admitted. */
static int admit(void *ctx, lkv_rpc *rpc)
{
    (void)ctx;
    char buf[256];
    atomic_fetch_add(&n_admit, 1);
    int n = lkv_rpc_metadata(rpc, "authorization", buf, sizeof(buf));
    if (n >= 0 && strcmp(buf, "Bearer ok-admin") == 0) {
        lkv_rpc_set_principal(rpc, admin_principal);
    }
    if (strcmp(lkv_rpc_method(rpc), "/lazykv.v1.Admin/Stats") == 0 &&
        lkv_rpc_principal(rpc) == NULL) {
        return lkv_rpc_errorf(rpc, LKV_EPERM, "admin role needed for %s", lkv_rpc_method(rpc));
    }
    return 0;
}

static int health(void *svc, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    (void)svc;
    (void)m;
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    return lkv_rpc_reply(rpc, &r.base);
}

static int stats(void *svc, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    (void)svc;
    (void)m;
    char info[128];
    atomic_fetch_add(&n_stats, 1);
    snprintf(info, sizeof(info), "principal=%s\n", (const char *)lkv_rpc_principal(rpc));
    Lazykv__V1__StatsResponse r = LAZYKV__V1__STATS_RESPONSE__INIT;
    r.info = info;
    return lkv_rpc_reply(rpc, &r.base);
}

/* Lookup: profile "big" replies over the message limit; otherwise echoes one status per doc. */
static int lookup(void *svc, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    (void)svc;
    const Lazykv__V1__LookupRequest *req = (const Lazykv__V1__LookupRequest *)m;
    const char *prof = req->n_docs > 0 && req->docs[0]->tokens ? req->docs[0]->tokens->profile : "";
    static char big[2 * MAX_MSG];
    Lazykv__V1__DocStatus st = LAZYKV__V1__DOC_STATUS__INIT, *stp = &st;
    if (strcmp(prof, "big") == 0) {
        memset(big, 'x', sizeof(big) - 1);
        st.profile = big;
    } else {
        st.profile = "echo";
    }
    Lazykv__V1__LookupResponse r = LAZYKV__V1__LOOKUP_RESPONSE__INIT;
    r.n_docs = 1;
    r.docs = &stp;
    return lkv_rpc_reply(rpc, &r.base);
}

/* Get: n_blocks = number of tokens; profile "fail" fails after 3 blocks with LKV_ECORRUPT;
 * profile "slow" sleeps 300 ms in start (past a 100 ms deadline). */
typedef struct get_st {
    uint32_t n, next;
    int fail;
} get_st;

static int get_start(void *svc, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    (void)svc;
    const Lazykv__V1__GetRequest *req = (const Lazykv__V1__GetRequest *)m;
    get_st *st = lkv_xcalloc(1, sizeof(*st));
    lkv_rpc_set_state(rpc, st);
    const Lazykv__V1__TokenDoc *t = req->doc ? req->doc->tokens : NULL;
    if (t == NULL) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "tokens needed");
    }
    st->n = (uint32_t)t->n_token_ids;
    st->fail = strcmp(t->profile, "fail") == 0;
    if (strcmp(t->profile, "slow") == 0) {
        sleep_ms(300);
    }
    uint8_t key[32] = {0};
    Lazykv__V1__GetHeader h = LAZYKV__V1__GET_HEADER__INIT;
    h.key.data = key;
    h.key.len = 32;
    h.profile = "test";
    h.n_tokens = st->n;
    h.n_blocks = st->n;
    h.block_bytes = BLOCK;
    h.block_tokens = 1;
    h.tier = LAZYKV__V1__TIER__TIER_HOT;
    Lazykv__V1__GetResponse r = LAZYKV__V1__GET_RESPONSE__INIT;
    r.header = &h;
    return lkv_rpc_send(rpc, &r.base);
}

static int get_next(void *svc, lkv_rpc *rpc)
{
    (void)svc;
    get_st *st = lkv_rpc_state(rpc);
    atomic_fetch_add(&n_next, 1);
    if (st->next == st->n) {
        return 0;
    }
    if (st->fail && st->next == 3) {
        return lkv_rpc_errorf(rpc, LKV_ECORRUPT, "block 3 is rotten");
    }
    uint8_t data[BLOCK];
    memset(data, (int)st->next, sizeof(data));
    Lazykv__V1__Block b = LAZYKV__V1__BLOCK__INIT, *bp = &b;
    b.index = st->next;
    b.data.data = data;
    b.data.len = BLOCK;
    Lazykv__V1__GetResponse r = LAZYKV__V1__GET_RESPONSE__INIT;
    r.n_blocks = 1;
    r.blocks = &bp;
    int rc = lkv_rpc_send(rpc, &r.base);
    st->next++;
    return rc;
}

static void get_cleanup(void *svc, lkv_rpc *rpc)
{
    (void)svc;
    free(lkv_rpc_state(rpc));
    lkv_rpc_set_state(rpc, NULL);
    atomic_fetch_add(&n_cleanup_get, 1);
}

/* Put: counts blocks; a block with index 5 is refused. */
static int put_msg(void *svc, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    (void)svc;
    const Lazykv__V1__PutRequest *req = (const Lazykv__V1__PutRequest *)m;
    uintptr_t n = (uintptr_t)lkv_rpc_state(rpc);
    for (size_t i = 0; i < req->n_blocks; i++) {
        if (req->blocks[i]->index == 5) {
            return lkv_rpc_errorf(rpc, LKV_EINVAL, "no block 5 here");
        }
        n++;
    }
    lkv_rpc_set_state(rpc, (void *)n);
    return 0;
}

static int put_end(void *svc, lkv_rpc *rpc)
{
    (void)svc;
    uint8_t key[32] = {1};
    atomic_fetch_add(&n_put_end, 1);
    Lazykv__V1__PutResponse r = LAZYKV__V1__PUT_RESPONSE__INIT;
    r.key.data = key;
    r.key.len = 32;
    r.n_blocks = (uint32_t)(uintptr_t)lkv_rpc_state(rpc);
    r.durability = LAZYKV__V1__DURABILITY__DURABILITY_HOT;
    return lkv_rpc_reply(rpc, &r.base);
}

static void put_cleanup(void *svc, lkv_rpc *rpc)
{
    (void)svc;
    (void)rpc;
    atomic_fetch_add(&n_cleanup_put, 1);
}

static const lkv_method methods[] = {
    {.path = "/grpc.health.v1.Health/Check",
     .kind = LKV_RPC_UNARY,
     .req_desc = &grpc__health__v1__health_check_request__descriptor,
     .unary = health},
    {.path = "/lazykv.v1.Admin/Stats",
     .kind = LKV_RPC_UNARY,
     .req_desc = &lazykv__v1__stats_request__descriptor,
     .unary = stats},
    {.path = "/lazykv.v1.Cache/Lookup",
     .kind = LKV_RPC_UNARY,
     .req_desc = &lazykv__v1__lookup_request__descriptor,
     .unary = lookup,
     .max_request_bytes = LOOKUP_MAX},
    {.path = "/lazykv.v1.Cache/Get",
     .kind = LKV_RPC_SERVER_STREAM,
     .req_desc = &lazykv__v1__get_request__descriptor,
     .start = get_start,
     .next = get_next,
     .cleanup = get_cleanup},
    {.path = "/lazykv.v1.Cache/Put",
     .kind = LKV_RPC_CLIENT_STREAM,
     .req_desc = &lazykv__v1__put_request__descriptor,
     .on_message = put_msg,
     .on_end = put_end,
     .cleanup = put_cleanup},
};

static lkv_server *srv;
static char addr[64];

/* Waits up to 2 s for *v to reach want (cleanups run on server threads). */
static int wait_for(atomic_int *v, int want)
{
    for (int i = 0; i < 200 && atomic_load(v) != want; i++) {
        sleep_ms(10);
    }
    return atomic_load(v);
}

static lkv_client_t *client(const char *token)
{
    lkv_client_options o;
    memset(&o, 0, sizeof(o));
    o.max_message_bytes = 4 * MAX_MSG;
    o.default_deadline_ms = 5000;
    o.bearer_token = token;
    lkv_client_t *c = NULL;
    ASSERT_OK(lkv_client_create(addr, &o, &c));
    return c;
}

static void test_admission(void)
{
    lkv_client_t *c = client(NULL);
    ASSERT_OK(lkv_client_ping(c, "", 0));
    char *info = NULL;
    int before = atomic_load(&n_stats);
    int rc = lkv_client_stats(c, NULL, 0, &info);
    ASSERT_TRUE(rc != 0);
    ASSERT_EQ(lkv_client_last_status(), 7); /* PERMISSION_DENIED */
    ASSERT_TRUE(strstr(lkv_client_last_error(), "admin role needed") != NULL);
    ASSERT_EQ(atomic_load(&n_stats), before); /* The handler never ran. */
    lkv_client_destroy(c);

    c = client("ok-admin");
    ASSERT_OK(lkv_client_stats(c, NULL, 0, &info));
    ASSERT_TRUE(strstr(info, "principal=admin-principal") != NULL);
    free(info);
    lkv_client_destroy(c);
}

static void test_unary_reply_limits(void)
{
    lkv_client_t *c = client(NULL);
    uint32_t tok = 1;
    lkv_docref ref = {.profile = "echo", .tokens = &tok, .n_tokens = 1};
    lkv_doc_status st;
    ASSERT_OK(lkv_client_lookup(c, &ref, 1, 0, &st));
    ASSERT_TRUE(strcmp(st.profile, "echo") == 0);
    ref.profile = "big";
    ASSERT_TRUE(lkv_client_lookup(c, &ref, 1, 0, &st) != 0);
    ASSERT_EQ(lkv_client_last_status(), 8); /* RESOURCE_EXHAUSTED */
    ASSERT_TRUE(strstr(lkv_client_last_error(), "reply too large") != NULL);
    lkv_client_destroy(c);
}

/* A method's own request bound refuses a message the server-wide limit would take, before any
 * callback runs; at the bound it is taken. Put (bound 0) still takes messages up to MAX_MSG. */
static void test_request_bound(void)
{
    lkv_client_t *c = client(NULL);
    static uint32_t toks[2000];
    for (int i = 0; i < 2000; i++) {
        toks[i] = 100000; /* 3-byte varints: 2000 ids are ~6 KB, under MAX_MSG, over 2048. */
    }
    lkv_docref ref = {.profile = "echo", .tokens = toks, .n_tokens = 2000};
    lkv_doc_status st;
    ASSERT_TRUE(lkv_client_lookup(c, &ref, 1, 0, &st) != 0);
    ASSERT_EQ(lkv_client_last_status(), 8); /* RESOURCE_EXHAUSTED */
    ASSERT_TRUE(strstr(lkv_client_last_error(), "request bound of /lazykv.v1.Cache/Lookup") !=
                NULL);
    ASSERT_TRUE(strstr(lkv_client_last_error(), "2048") != NULL);
    /* 600 ids: 1800 bytes of ids plus framing stays under 2048. */
    ref.n_tokens = 600;
    ASSERT_OK(lkv_client_lookup(c, &ref, 1, 0, &st));
    ASSERT_TRUE(strcmp(st.profile, "echo") == 0);
    /* Strings are checked by the wire scanner before the service sees them: valid UTF-8 passes,
     * an overlong NUL does not (raw hostile messages: integration.edge_decode). */
    ref.profile = "\xc3\xa9"
                  "cho";
    ref.n_tokens = 1;
    ASSERT_OK(lkv_client_lookup(c, &ref, 1, 0, &st));
    ref.profile = "\xc0\x80";
    ASSERT_TRUE(lkv_client_lookup(c, &ref, 1, 0, &st) != 0);
    ASSERT_EQ(lkv_client_last_status(), 3); /* INVALID_ARGUMENT */
    ASSERT_TRUE(strstr(lkv_client_last_error(), "UTF-8") != NULL);
    lkv_client_destroy(c);
}

static int on_block(void *ctx, const lkv_get_header *h, uint32_t index, const void *data,
                    size_t len)
{
    int *bad = ctx;
    if (data == NULL) {
        return 0; /* header */
    }
    const uint8_t *p = data;
    if (len != BLOCK || h->block_bytes != BLOCK || p[0] != (uint8_t)index ||
        p[BLOCK - 1] != (uint8_t)index) {
        (*bad)++;
    }
    return 0;
}

static void test_server_stream(void)
{
    lkv_client_t *c = client(NULL);
    uint32_t toks[10] = {0};
    lkv_docref ref = {.profile = "ok", .tokens = toks, .n_tokens = 10};
    lkv_get_header h;
    int bad = 0;
    int cl = atomic_load(&n_cleanup_get);
    ASSERT_OK(lkv_client_get(c, &ref, 0, &h, on_block, &bad));
    ASSERT_EQ(bad, 0);
    ASSERT_EQ(h.n_blocks, 10);
    ASSERT_EQ(wait_for(&n_cleanup_get, cl + 1), cl + 1);

    /* An error mid-stream reaches the client with its status and message. */
    ref.profile = "fail";
    ASSERT_TRUE(lkv_client_get(c, &ref, 0, &h, on_block, &bad) != 0);
    ASSERT_EQ(lkv_client_last_status(), 15); /* DATA_LOSS */
    ASSERT_TRUE(strstr(lkv_client_last_error(), "block 3 is rotten") != NULL);
    ASSERT_EQ(wait_for(&n_cleanup_get, cl + 2), cl + 2);

    /* The deadline passes during start(): next() is never called, cleanup still runs. */
    int nx = atomic_load(&n_next);
    ref.profile = "slow";
    ASSERT_TRUE(lkv_client_get(c, &ref, 100, &h, on_block, &bad) != 0);
    ASSERT_EQ(lkv_client_last_status(), 4); /* DEADLINE_EXCEEDED */
    ASSERT_EQ(wait_for(&n_cleanup_get, cl + 3), cl + 3);
    ASSERT_EQ(atomic_load(&n_next), nx);
    lkv_client_destroy(c);
}

static void test_client_stream(void)
{
    lkv_client_t *c = client(NULL);
    uint8_t blocks[4 * BLOCK] = {0};
    uint32_t toks[4] = {0};
    lkv_put_reply r;
    int cl = atomic_load(&n_cleanup_put);
    ASSERT_OK(lkv_client_put(c, "p", toks, 4, blocks, 4, BLOCK, 0, &r));
    ASSERT_EQ(r.n_blocks, 4);
    ASSERT_EQ(wait_for(&n_cleanup_put, cl + 1), cl + 1);

    /* A refused message ends the stream with the handler's status. */
    lkv_put_t *p = NULL;
    ASSERT_OK(lkv_client_put_begin(c, "p", toks, 4, 0, 0, &p));
    ASSERT_OK(lkv_put_block(p, 0, blocks, BLOCK));
    lkv_put_block(p, 5, blocks, BLOCK);
    ASSERT_TRUE(lkv_put_finish(p, &r) != 0);
    ASSERT_EQ(lkv_client_last_status(), 3); /* INVALID_ARGUMENT */
    ASSERT_TRUE(strstr(lkv_client_last_error(), "no block 5 here") != NULL);
    ASSERT_EQ(wait_for(&n_cleanup_put, cl + 2), cl + 2);

    /* The client walks away mid-stream: cleanup runs, on_end never does. */
    int ends = atomic_load(&n_put_end);
    ASSERT_OK(lkv_client_put_begin(c, "p", toks, 4, 0, 0, &p));
    ASSERT_OK(lkv_put_block(p, 0, blocks, BLOCK));
    sleep_ms(100);
    lkv_put_abort(p);
    ASSERT_EQ(wait_for(&n_cleanup_put, cl + 3), cl + 3);
    ASSERT_EQ(atomic_load(&n_put_end), ends);
    lkv_client_destroy(c);
}

/* Many concurrent calls over both polling threads. */
static void *hammer(void *arg)
{
    (void)arg;
    lkv_client_t *c = client(NULL);
    uint32_t toks[20] = {0};
    lkv_docref ref = {.profile = "ok", .tokens = toks, .n_tokens = 20};
    lkv_get_header h;
    int bad = 0;
    for (int i = 0; i < 20; i++) {
        if (lkv_client_get(c, &ref, 0, &h, on_block, &bad) != 0 || bad != 0) {
            lkv_client_destroy(c);
            return (void *)1;
        }
    }
    lkv_client_destroy(c);
    return NULL;
}

static void test_concurrency(void)
{
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        ASSERT_EQ(pthread_create(&th[i], NULL, hammer, NULL), 0);
    }
    for (int i = 0; i < 8; i++) {
        void *r;
        pthread_join(th[i], &r);
        ASSERT_TRUE(r == NULL);
    }
}

int main(void)
{
    char err[256];
    lkv_server_opts o = {.listen = "127.0.0.1:0",
                         .threads = 2,
                         .max_message_bytes = MAX_MSG,
                         .admit = admit,
                         .admit_ctx = NULL};
    lkv_log_set_level(LKV_LOG_WARN);
    ASSERT_OK(lkv_server_create(&o, methods, (int)(sizeof(methods) / sizeof(methods[0])), &srv, err,
                                sizeof(err)));
    ASSERT_TRUE(lkv_server_port(srv) > 0);
    snprintf(addr, sizeof(addr), "%s", lkv_server_address(srv));
    ASSERT_TRUE(strncmp(addr, "127.0.0.1:", 10) == 0);

    /* A second server on the same port must fail (no silent SO_REUSEPORT sharing). */
    lkv_server *dup = NULL;
    lkv_server_opts o2 = o;
    o2.listen = addr;
    ASSERT_ERR(lkv_server_create(&o2, methods, 1, &dup, err, sizeof(err)), LKV_EIO);
    ASSERT_TRUE(strstr(err, "'listen'") != NULL);

    LKV_RUN(test_admission);
    LKV_RUN(test_unary_reply_limits);
    LKV_RUN(test_request_bound);
    LKV_RUN(test_server_stream);
    LKV_RUN(test_client_stream);
    LKV_RUN(test_concurrency);

    ASSERT_TRUE(atomic_load(&n_admit) > 0);
    const char *path;
    uint64_t calls, errors, usec;
    for (int i = 0; i < 200; i++) { /* Counted when a call's last batch completes. */
        ASSERT_OK(lkv_server_method_stats(srv, 3, &path, &calls, &errors, &usec));
        if (calls == 3 + 8 * 20) {
            break;
        }
        sleep_ms(10);
    }
    ASSERT_TRUE(strcmp(path, "/lazykv.v1.Cache/Get") == 0);
    ASSERT_EQ(calls, 3 + 8 * 20);
    ASSERT_EQ(errors, 2);
    ASSERT_EQ(lkv_server_calls_in_flight(srv), 0);
    lkv_server_shutdown(srv, 1000);
    ASSERT_TRUE(lkv_server_draining(srv));
    lkv_server_destroy(srv);
    return 0;
}
