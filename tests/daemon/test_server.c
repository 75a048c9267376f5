/*
 * test_server.c: the RPC engine (daemon/lkv_server.c) with test services, driven over real gRPC
 * by the C client library (client/lkv_client.c). No store: the services are scripted here, so
 * the engine's own duties are what is tested: the admission hook and principals, unary /
 * client-streaming / server-streaming state machines, replies over the message limit, errors
 * mid-stream, deadlines checked before the next step, cleanup exactly once per call (also when
 * the client walks away), and a clean shutdown.
 *
 * Deferred replies and the pool (lkv_rpc_defer / resume / offload) go through the Delete method:
 * its request's profile says what the handler does ("later:N" parks and a helper thread resumes
 * after N ms, "race:D" likewise D ms after the call's deadline as the server sees it (D < 0:
 * before), "hold" parks until the test resumes the ticket (or never), "pool:N" offloads an
 * N ms sleep to the pool) and token_ids[0] names the call, which is accounted per id too. Cases:
 * resume from another thread, the wake-up latency, a deadline or a client cancel while parked
 * (cleanup once, stale ticket refused), resumes racing deadlines, many parked calls at once, pool
 * jobs holding a cancel until done, shutdown with parked calls, and the acceptance test: Health
 * answers within 100 ms (500 ms under sanitizers; times $LKV_TEST_TIMEOUT_SCALE) while calls are
 * parked and while the pool runs a slow job.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "lazykv/v1/admin.pb-c.h"
#include "lazykv/v1/cache.pb-c.h"
#include "lkv_client.h"
#include "lkv_log.h"
#include "lkv_server.h"
#include "lkv_status.h"
#include "lkv_test.h"

#define MAX_MSG    (64 * 1024)
#define BLOCK      64
#define MAXP       1024 /* Parked calls named by token id. */
#define LOOKUP_MAX 2048 /* Lookup's own request bound (lkv_method.max_request_bytes). */

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LKV_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define LKV_SANITIZED 1
#endif
#endif
#ifdef LKV_SANITIZED
#define HEALTH_BOUND_MS 500.0
#else
#define HEALTH_BOUND_MS 100.0
#endif

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

/* Lookup: profile "big" replies over the message limit; profile "fail" fails with the code
 * -token_ids[0]; profile "retry" fails with LKV_ERATE asking for a retry after token_ids[0] ms;
 * otherwise echoes one status per doc. */
static int lookup(void *svc, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    (void)svc;
    const Lazykv__V1__LookupRequest *req = (const Lazykv__V1__LookupRequest *)m;
    const char *prof = req->n_docs > 0 && req->docs[0]->tokens ? req->docs[0]->tokens->profile : "";
    static char big[2 * MAX_MSG];
    Lazykv__V1__DocStatus st = LAZYKV__V1__DOC_STATUS__INIT, *stp = &st;
    if (strcmp(prof, "fail") == 0 && req->docs[0]->tokens->n_token_ids > 0) {
        /* Fails with the code -ids[0], under a message that names another cause. */
        return lkv_rpc_errorf(rpc, -(int)req->docs[0]->tokens->token_ids[0],
                              "Received message larger than max (budget exhausted, not found)");
    }
    if (strcmp(prof, "retry") == 0 && req->docs[0]->tokens->n_token_ids > 0) {
        lkv_rpc_set_retry_after(rpc, req->docs[0]->tokens->token_ids[0]);
        return lkv_rpc_errorf(rpc, LKV_ERATE, "over the rate: retry in %u ms",
                              (unsigned)req->docs[0]->tokens->token_ids[0]);
    }
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

/* ---- The parking method (Delete) ------------------------------------------------------- */

static atomic_int n_park_enter, n_park_cleanup, n_park_cont, n_stale, n_bad_order, n_pool_done;
/* The same per call id, so a case can account for each call on its own (test_park_many). */
static atomic_int id_enter[MAXP], id_cleanup[MAXP], id_cont[MAXP], id_stale[MAXP];

/* Every Delete call's lkv_rpc_state: its id (for park_cleanup), and its pool job if any. */
typedef struct note {
    uint32_t id;     /* The call's token id. */
    struct job *job; /* "pool:" calls: the job (owned, freed in cleanup); else NULL. */
} note;
static note id_note[MAXP];           /* Notes of the other calls: id_note[i].id == i, job NULL. */
static lkv_rpc_ticket tickets[MAXP]; /* "hold" calls' tickets, by id. */
static atomic_int ticket_set[MAXP];  /* 1 once tickets[id] is written. */
static pthread_mutex_t lat_mu = PTHREAD_MUTEX_INITIALIZER;
static double lat_us[4096]; /* Resume -> continuation latencies. */
static int n_lat;

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

typedef struct later {
    lkv_rpc_ticket t; /* The parked call. */
    int ms;           /* Resume after. */
    uint32_t id;      /* Call name. */
    double t_resume;  /* When resume was called. */
} later;

static int reply_delete(lkv_rpc *rpc, uint32_t id)
{
    uint8_t key[32] = {0};
    memcpy(key, &id, sizeof(id));
    Lazykv__V1__DeleteResponse r = LAZYKV__V1__DELETE_RESPONSE__INIT;
    r.key.data = key;
    r.key.len = 32;
    return lkv_rpc_reply(rpc, &r.base);
}

/* The continuation of a "later" call, on the call's thread. */
static int later_cont(void *svc, lkv_rpc *rpc, void *arg)
{
    (void)svc;
    later *l = arg;
    double d = now_us() - l->t_resume;
    pthread_mutex_lock(&lat_mu);
    if (n_lat < (int)(sizeof(lat_us) / sizeof(lat_us[0]))) {
        lat_us[n_lat++] = d;
    }
    pthread_mutex_unlock(&lat_mu);
    uint32_t id = l->id;
    free(l);
    atomic_fetch_add(&id_cont[id], 1);
    atomic_fetch_add(&n_park_cont, 1);
    return reply_delete(rpc, id);
}

static void *later_main(void *arg)
{
    later *l = arg;
    sleep_ms(l->ms);
    l->t_resume = now_us();
    if (lkv_rpc_resume(l->t, later_cont, l) != 0) {
        atomic_fetch_add(&id_stale[l->id], 1);
        atomic_fetch_add(&n_stale, 1); /* The call ended first: arg is still ours. */
        free(l);
    }
    return NULL;
}

typedef struct job {
    note n;       /* The call's note (lkv_rpc_state points here). */
    int ms;       /* Work: sleep this long. */
    uint32_t id;  /* Call name. */
    int work_ran; /* Set by work (pool thread), read by done (call thread). */
    int done_ran; /* Set by done; cleanup checks it. */
} job;

static void job_work(void *svc, void *arg)
{
    (void)svc;
    job *j = arg;
    sleep_ms(j->ms);
    j->work_ran = 1;
}

static int job_done(void *svc, lkv_rpc *rpc, void *arg)
{
    (void)svc;
    job *j = arg;
    if (!j->work_ran) {
        atomic_fetch_add(&n_bad_order, 1);
    }
    j->done_ran = 1;
    atomic_fetch_add(&n_pool_done, 1);
    return reply_delete(rpc, j->id);
}

static int park_unary(void *svc, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    (void)svc;
    const Lazykv__V1__DeleteRequest *req = (const Lazykv__V1__DeleteRequest *)m;
    const Lazykv__V1__TokenDoc *t = req->doc != NULL ? req->doc->tokens : NULL;
    if (t == NULL || t->n_token_ids != 1 || t->token_ids[0] >= MAXP) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "one token id < %d needed", MAXP);
    }
    uint32_t id = t->token_ids[0];
    atomic_fetch_add(&id_enter[id], 1);
    atomic_fetch_add(&n_park_enter, 1);
    lkv_rpc_set_state(rpc, &id_note[id]);
    int race = strncmp(t->profile, "race:", 5) == 0;
    if (race || strncmp(t->profile, "later:", 6) == 0) {
        later *l = lkv_xcalloc(1, sizeof(*l));
        if (race) {
            /* Resume D ms after the call's deadline as this server sees it (D < 0: before), so
             * the resume and the deadline race however late the call got here. */
            int64_t left = lkv_rpc_deadline_left_ms(rpc);
            int64_t ms = (left < 60000 ? left : 60000) + atoi(t->profile + 5);
            l->ms = ms > 0 ? (int)ms : 0;
        } else {
            l->ms = atoi(t->profile + 6);
        }
        l->id = id;
        int rc = lkv_rpc_defer(rpc, &l->t);
        pthread_t th;
        ASSERT_EQ(pthread_create(&th, NULL, later_main, l), 0);
        pthread_detach(th);
        return rc;
    }
    if (strcmp(t->profile, "hold") == 0) {
        int rc = lkv_rpc_defer(rpc, &tickets[id]);
        atomic_store(&ticket_set[id], 1);
        return rc;
    }
    if (strncmp(t->profile, "pool:", 5) == 0) {
        job *j = lkv_xcalloc(1, sizeof(*j));
        j->ms = atoi(t->profile + 5);
        j->id = id;
        j->n.id = id;
        j->n.job = j;
        lkv_rpc_set_state(rpc, &j->n); /* Freed in cleanup, which must come after done. */
        return lkv_rpc_offload(rpc, job_work, job_done, j);
    }
    return reply_delete(rpc, id);
}

static void park_cleanup(void *svc, lkv_rpc *rpc)
{
    (void)svc;
    note *n = lkv_rpc_state(rpc); /* NULL: refused before it had an id. */
    if (n != NULL) {
        uint32_t id = n->id;
        job *j = n->job;
        if (j != NULL) {
            if (!j->done_ran) {
                atomic_fetch_add(&n_bad_order, 1);
            }
            free(j);
        }
        lkv_rpc_set_state(rpc, NULL);
        atomic_fetch_add(&id_cleanup[id], 1);
    }
    atomic_fetch_add(&n_park_cleanup, 1);
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
    {.path = "/lazykv.v1.Cache/Delete",
     .kind = LKV_RPC_UNARY,
     .req_desc = &lazykv__v1__delete_request__descriptor,
     .unary = park_unary,
     .cleanup = park_cleanup},
};

static lkv_server *srv;
static char addr[64];

/* Waits up to 10 s (20 s under sanitizers) for *v to reach want (cleanups run on server threads;
 * a loaded machine under sanitizers is slow; success returns at once). */
#ifdef LKV_SANITIZED
#define WAIT_TRIES 2000 /* 20 s of 10 ms polls: ThreadSanitizer slows the engine 5-15x. */
#else
#define WAIT_TRIES 1000
#endif

static int wait_for(atomic_int *v, int want)
{
    for (int i = 0; i < WAIT_TRIES && atomic_load(v) != want; i++) {
        sleep_ms(10);
    }
    return atomic_load(v);
}

static lkv_client_t *client_at(const char *address, const char *token)
{
    lkv_client_options o;
    memset(&o, 0, sizeof(o));
    o.max_message_bytes = 4 * MAX_MSG;
    o.default_deadline_ms = 5000;
    o.bearer_token = token;
    lkv_client_t *c = NULL;
    ASSERT_OK(lkv_client_create(address, &o, &c));
    return c;
}

static lkv_client_t *client(const char *token)
{
    return client_at(addr, token);
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

/* Every code a handler fails with reaches the client exactly, through the "lkv-code" trailing
 * metadata, whatever the message says; a code outside lkv_err.h arrives as LKV_EINTERNAL. */
static void test_exact_codes(void)
{
    lkv_client_t *c = client(NULL);
    lkv_doc_status st;
    int n = 0;
#define CHECK_ONE(name, val, msg)                                                                  \
    do {                                                                                           \
        uint32_t tok = (uint32_t)(-(val));                                                         \
        lkv_docref ref = {.profile = "fail", .tokens = &tok, .n_tokens = 1};                       \
        int rc = lkv_client_lookup(c, &ref, 1, 0, &st);                                            \
        if (rc != (val)) {                                                                         \
            LKV_FAIL("handler failed with %s, the client got %s", "LKV_" #name, lkv_err_name(rc)); \
        }                                                                                          \
        ASSERT_EQ(lkv_client_last_status(), lkv_status_from_err(val));                             \
        ASSERT_TRUE(strstr(lkv_client_last_error(), "larger than max") != NULL);                   \
        n++;                                                                                       \
    } while (0);
    LKV_ERR_MAP(CHECK_ONE)
#undef CHECK_ONE
    /* Every code of the table: 23 + ERATE, EQUOTA (quotas), EINPROGRESS (put in place), ENOTOWNER
     * (cluster redirect), EADMIT (the hot admission door). */
    ASSERT_EQ(n, 28);
    uint32_t tok = 5; /* -EIO, an -errno */
    lkv_docref ref = {.profile = "fail", .tokens = &tok, .n_tokens = 1};
    ASSERT_ERR(lkv_client_lookup(c, &ref, 1, 0, &st), LKV_EINTERNAL);
    ASSERT_EQ(lkv_client_last_status(), 13);         /* INTERNAL */
    ASSERT_EQ(lkv_client_last_retry_after_ms(), -1); /* None asked for. */
    /* A refusal with a retry delay: RESOURCE_EXHAUSTED, LKV_ERATE, retry-after-ms on the wire. */
    tok = 1234;
    ref.profile = "retry";
    ASSERT_ERR(lkv_client_lookup(c, &ref, 1, 0, &st), LKV_ERATE);
    ASSERT_EQ(lkv_client_last_status(), 8); /* RESOURCE_EXHAUSTED */
    ASSERT_EQ(lkv_client_last_retry_after_ms(), 1234);
    ASSERT_TRUE(strstr(lkv_client_last_error(), "retry in 1234 ms") != NULL);
    ref.profile = "echo";
    ASSERT_OK(lkv_client_lookup(c, &ref, 1, 0, &st));
    ASSERT_EQ(lkv_client_last_retry_after_ms(), -1); /* Cleared by a success. */
    /* A reply over the limit: LKV_ETOOBIG (not the message-less family guess of another). */
    ref.profile = "big";
    ASSERT_ERR(lkv_client_lookup(c, &ref, 1, 0, &st), LKV_ETOOBIG);
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

/* ---- Raw async calls (gRPC core client), for many calls at once and client cancels ------ */

typedef struct raw_call {
    grpc_call *call;
    grpc_metadata_array md_init, md_trail;
    grpc_byte_buffer *req, *resp;
    grpc_status_code status;
    grpc_slice details;
    int done;
} raw_call;

static grpc_channel *raw_ch;
static grpc_completion_queue *raw_cq;

static void raw_start(raw_call *c, const char *profile, uint32_t id, int deadline_ms)
{
    memset(c, 0, sizeof(*c));
    Lazykv__V1__TokenDoc td = LAZYKV__V1__TOKEN_DOC__INIT;
    td.profile = (char *)profile;
    td.n_token_ids = 1;
    td.token_ids = &id;
    Lazykv__V1__DocRef ref = LAZYKV__V1__DOC_REF__INIT;
    ref.tokens = &td;
    Lazykv__V1__DeleteRequest req = LAZYKV__V1__DELETE_REQUEST__INIT;
    req.doc = &ref;
    size_t n = protobuf_c_message_get_packed_size(&req.base);
    grpc_slice sl = grpc_slice_malloc(n);
    protobuf_c_message_pack(&req.base, GRPC_SLICE_START_PTR(sl));
    c->req = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    gpr_timespec dl = deadline_ms > 0
                          ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                         gpr_time_from_millis(deadline_ms, GPR_TIMESPAN))
                          : gpr_inf_future(GPR_CLOCK_MONOTONIC);
    grpc_slice method = grpc_slice_from_static_string("/lazykv.v1.Cache/Delete");
    c->call = grpc_channel_create_call(raw_ch, NULL, GRPC_PROPAGATE_DEFAULTS, raw_cq, method, NULL,
                                       dl, NULL);
    grpc_metadata_array_init(&c->md_init);
    grpc_metadata_array_init(&c->md_trail);
    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = c->req;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->md_init;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &c->resp;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &c->md_trail;
    ops[5].data.recv_status_on_client.status = &c->status;
    ops[5].data.recv_status_on_client.status_details = &c->details;
    ASSERT_EQ(grpc_call_start_batch(c->call, ops, 6, c, NULL), GRPC_CALL_OK);
}

/* Waits for n raw calls to complete (up to 10 s each). */
static void raw_wait(int n)
{
    for (int i = 0; i < n; i++) {
        grpc_event ev = grpc_completion_queue_next(
            raw_cq,
            gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_seconds(10, GPR_TIMESPAN)),
            NULL);
        ASSERT_EQ(ev.type, GRPC_OP_COMPLETE);
        ((raw_call *)ev.tag)->done = 1;
    }
}

static void raw_free(raw_call *c)
{
    grpc_byte_buffer_destroy(c->req);
    if (c->resp != NULL) {
        grpc_byte_buffer_destroy(c->resp);
    }
    grpc_metadata_array_destroy(&c->md_init);
    grpc_metadata_array_destroy(&c->md_trail);
    grpc_slice_unref(c->details);
    grpc_call_unref(c->call);
}

/* Waits until ticket_set[id] (the handler parked call id). */
static void wait_parked(uint32_t id)
{
    for (int i = 0; i < 500 && !atomic_load(&ticket_set[id]); i++) {
        sleep_ms(2);
    }
    ASSERT_TRUE(atomic_load(&ticket_set[id]));
}

static int never_cont(void *svc, lkv_rpc *rpc, void *arg)
{
    (void)svc;
    (void)rpc;
    (void)arg;
    atomic_fetch_add(&n_bad_order, 1); /* Must never run: the call had ended. */
    return LKV_EINTERNAL;
}

static int hold_cont(void *svc, lkv_rpc *rpc, void *arg)
{
    (void)svc;
    atomic_fetch_add(&n_park_cont, 1);
    return reply_delete(rpc, (uint32_t)(uintptr_t)arg);
}

/* The Health bound, scaled by $LKV_TEST_TIMEOUT_SCALE (as the integration harness does). */
static double health_bound_ms(void)
{
    const char *e = getenv("LKV_TEST_TIMEOUT_SCALE");
    double k = e != NULL ? atof(e) : 1.0;
    return HEALTH_BOUND_MS * (k >= 1.0 ? k : 1.0);
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static lkv_docref park_ref(const char *profile, uint32_t *id)
{
    lkv_docref r = {.profile = profile, .tokens = id, .n_tokens = 1};
    return r;
}

/* A parked call finished from another thread after N ms; the wake-up latency. */
static void test_park_resume(void)
{
    lkv_client_t *c = client(NULL);
    uint32_t id = 7;
    lkv_docref ref = park_ref("later:50", &id);
    uint8_t key[32];
    int cl = atomic_load(&n_park_cleanup);
    double t0 = now_us();
    ASSERT_OK(lkv_client_delete(c, &ref, 0, key));
    double took = (now_us() - t0) / 1000.0;
    ASSERT_TRUE(took >= 50.0);
    ASSERT_EQ(key[0], 7);
    ASSERT_EQ(wait_for(&n_park_cleanup, cl + 1), cl + 1);
    /* Latency of the wake-up: 40 sequential resumes. */
    pthread_mutex_lock(&lat_mu);
    n_lat = 0;
    pthread_mutex_unlock(&lat_mu);
    ref = park_ref("later:1", &id);
    for (int i = 0; i < 40; i++) {
        ASSERT_OK(lkv_client_delete(c, &ref, 0, key));
    }
    pthread_mutex_lock(&lat_mu);
    qsort(lat_us, (size_t)n_lat, sizeof(double), cmp_dbl);
    printf("  wake-up latency (resume -> continuation), %d resumes: median %.0f us, max %.0f us\n",
           n_lat, lat_us[n_lat / 2], lat_us[n_lat - 1]);
    ASSERT_EQ(n_lat, 40);
    ASSERT_TRUE(lat_us[n_lat / 2] < 20000.0);
    pthread_mutex_unlock(&lat_mu);
    lkv_client_destroy(c);
}

/* Deadline while parked: DEADLINE_EXCEEDED, cleanup once, the ticket is stale. */
static void test_park_deadline(void)
{
    lkv_client_t *c = client(NULL);
    uint32_t id = 11;
    lkv_docref ref = park_ref("hold", &id);
    uint8_t key[32];
    int cl = atomic_load(&n_park_cleanup);
    int cont = atomic_load(&n_park_cont);
    double t0 = now_us();
    ASSERT_TRUE(lkv_client_delete(c, &ref, 100, key) != 0);
    ASSERT_EQ(lkv_client_last_status(), 4); /* DEADLINE_EXCEEDED */
    ASSERT_TRUE((now_us() - t0) / 1000.0 < 2000.0);
    ASSERT_EQ(wait_for(&n_park_cleanup, cl + 1), cl + 1);
    ASSERT_TRUE(atomic_load(&ticket_set[id]));
    ASSERT_ERR(lkv_rpc_resume(tickets[id], never_cont, NULL), LKV_ECANCELLED);
    ASSERT_ERR(lkv_rpc_finish_deferred(tickets[id], LKV_EIO, NULL, "late"), LKV_ECANCELLED);
    sleep_ms(50);
    ASSERT_EQ(atomic_load(&n_park_cleanup), cl + 1);
    ASSERT_EQ(atomic_load(&n_park_cont), cont);
    lkv_rpc_ticket bogus = {srv, 0};
    ASSERT_ERR(lkv_rpc_resume(bogus, never_cont, NULL), LKV_EINVAL);
    lkv_client_destroy(c);
}

/* Client cancel while parked: cleanup exactly once, a later resume is refused; a ticket resumes
 * once only; lkv_rpc_finish_deferred with an error from another thread. */
static void test_park_cancel(void)
{
    uint32_t id = 12;
    raw_call rc;
    int cl = atomic_load(&n_park_cleanup);
    raw_start(&rc, "hold", id, 0);
    wait_parked(id);
    sleep_ms(20);
    ASSERT_EQ(atomic_load(&n_park_cleanup), cl); /* Still parked. */
    grpc_call_cancel(rc.call, NULL);
    raw_wait(1);
    ASSERT_EQ(rc.status, GRPC_STATUS_CANCELLED);
    ASSERT_EQ(wait_for(&n_park_cleanup, cl + 1), cl + 1);
    ASSERT_ERR(lkv_rpc_resume(tickets[id], never_cont, NULL), LKV_ECANCELLED);
    sleep_ms(50);
    ASSERT_EQ(atomic_load(&n_park_cleanup), cl + 1);
    raw_free(&rc);

    /* Finish with an error from this thread; the same ticket cannot resume twice. */
    id = 13;
    raw_start(&rc, "hold", id, 0);
    wait_parked(id);
    ASSERT_OK(lkv_rpc_finish_deferred(tickets[id], LKV_EBUSY, NULL, "busy %d", 42));
    ASSERT_ERR(lkv_rpc_resume(tickets[id], never_cont, NULL), LKV_ECANCELLED);
    raw_wait(1);
    ASSERT_EQ(rc.status, GRPC_STATUS_FAILED_PRECONDITION);
    char *d = grpc_slice_to_c_string(rc.details);
    ASSERT_TRUE(strcmp(d, "busy 42") == 0);
    gpr_free(d);
    ASSERT_EQ(wait_for(&n_park_cleanup, cl + 2), cl + 2);
    raw_free(&rc);

    /* And with a reply. */
    id = 14;
    raw_start(&rc, "hold", id, 0);
    wait_parked(id);
    uint8_t key[32] = {14};
    Lazykv__V1__DeleteResponse r = LAZYKV__V1__DELETE_RESPONSE__INIT;
    r.key.data = key;
    r.key.len = 32;
    ASSERT_OK(lkv_rpc_finish_deferred(tickets[id], 0, &r.base, NULL));
    raw_wait(1);
    ASSERT_EQ(rc.status, GRPC_STATUS_OK);
    ASSERT_TRUE(rc.resp != NULL);
    ASSERT_EQ(wait_for(&n_park_cleanup, cl + 3), cl + 3);
    raw_free(&rc);
}

/* Many parked at once, resumed from another thread in reverse order; then resumes racing
 * deadlines: every call ends once, either by its continuation or by the deadline, and every
 * call whose handler ran is cleaned up once. */
static void test_park_many(void)
{
    enum { N = 200 };
    static raw_call rc[N];
    int cl = atomic_load(&n_park_cleanup);
    int cont = atomic_load(&n_park_cont);
    for (uint32_t i = 0; i < N; i++) {
        atomic_store(&ticket_set[100 + i], 0);
        raw_start(&rc[i], "hold", 100 + i, 0);
    }
    for (uint32_t i = 0; i < N; i++) {
        wait_parked(100 + i);
    }
    ASSERT_EQ(atomic_load(&n_park_cleanup), cl);
    ASSERT_EQ(lkv_server_calls_in_flight(srv), N);
    for (int i = N - 1; i >= 0; i--) {
        ASSERT_OK(lkv_rpc_resume(tickets[100 + i], hold_cont, (void *)(uintptr_t)(100 + i)));
    }
    raw_wait(N);
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(rc[i].status, GRPC_STATUS_OK);
        ASSERT_TRUE(rc[i].resp != NULL);
        raw_free(&rc[i]);
    }
    ASSERT_EQ(wait_for(&n_park_cleanup, cl + N), cl + N);
    ASSERT_EQ(atomic_load(&n_park_cont), cont + N);

    /* Races: deadline 300 ms; each call resumed 5 ms before to 25 ms after its deadline as the
     * server sees it (the cancel reaches the call a little after it), so both orders occur.
     * Under load a call can also run out of time before its handler runs (in the client, the
     * transport, or the engine's deadline check): it ends DEADLINE_EXCEEDED and, having reached
     * no callback, is owed no cleanup (lkv_server.h). So each call is accounted for on its own:
     * the handler ran at most once; if it ran, its cleanup ran once and exactly one of
     * continuation and refused resume; if not, nothing ran and the client got
     * DEADLINE_EXCEEDED; a reply only from a continuation. */
    enum { ID = 300 };
    cl = atomic_load(&n_park_cleanup);
    cont = atomic_load(&n_park_cont);
    int stale0 = atomic_load(&n_stale);
    char prof[32];
    for (uint32_t i = 0; i < N; i++) {
        atomic_store(&id_enter[ID + i], 0);
        atomic_store(&id_cleanup[ID + i], 0);
        atomic_store(&id_cont[ID + i], 0);
        atomic_store(&id_stale[ID + i], 0);
    }
    for (uint32_t i = 0; i < N; i++) {
        snprintf(prof, sizeof(prof), "race:%d", (int)(i % 11) * 3 - 5);
        raw_start(&rc[i], prof, ID + i, 300);
    }
    raw_wait(N);
    /* Settled: no call left in the server, and every call that entered has ended both ways
     * (a resume thread still sleeping, or a late call still parked, keeps this false). */
    int settled = 0;
    for (int t = 0; t < 1000 && !settled; t++) {
        settled = lkv_server_calls_in_flight(srv) == 0;
        for (int i = 0; i < N && settled; i++) {
            int e = atomic_load(&id_enter[ID + i]);
            settled = atomic_load(&id_cleanup[ID + i]) == e &&
                      atomic_load(&id_cont[ID + i]) + atomic_load(&id_stale[ID + i]) == e;
        }
        if (!settled) {
            sleep_ms(10);
        }
    }
    sleep_ms(50); /* Nothing may run twice, or late. */
    int ok = 0, dl = 0, entered = 0, conts = 0, stales = 0;
    for (int i = 0; i < N; i++) {
        int e = atomic_load(&id_enter[ID + i]), c = atomic_load(&id_cont[ID + i]);
        int st = atomic_load(&id_stale[ID + i]), clean = atomic_load(&id_cleanup[ID + i]);
        if (e > 1 || clean != e || c + st != e ||
            (rc[i].status != GRPC_STATUS_OK && rc[i].status != GRPC_STATUS_DEADLINE_EXCEEDED) ||
            (rc[i].status == GRPC_STATUS_OK && (c != 1 || rc[i].resp == NULL)) ||
            (e == 0 && rc[i].status != GRPC_STATUS_DEADLINE_EXCEEDED)) {
            LKV_FAIL("race call %d: status %d, handler ran %d, cleanup %d, continuation %d, "
                     "refused resume %d; calls in flight %d",
                     ID + i, (int)rc[i].status, e, clean, c, st,
                     (int)lkv_server_calls_in_flight(srv));
        }
        ok += rc[i].status == GRPC_STATUS_OK;
        dl += rc[i].status == GRPC_STATUS_DEADLINE_EXCEEDED;
        entered += e;
        conts += c;
        stales += st;
        raw_free(&rc[i]);
    }
    ASSERT_TRUE(settled);
    ASSERT_EQ(ok + dl, N);
    /* The totals agree: no cleanup, continuation or refusal came from anywhere else. */
    ASSERT_EQ(atomic_load(&n_park_cleanup) - cl, entered);
    ASSERT_EQ(atomic_load(&n_park_cont) - cont, conts);
    ASSERT_EQ(atomic_load(&n_stale) - stale0, stales);
    printf("  races: %d replied, %d deadline; %d handlers ran (%d out of time before), %d "
           "continuations, %d refused resumes\n",
           ok, dl, entered, N - entered, conts, stales);
    ASSERT_EQ(lkv_server_calls_in_flight(srv), 0);
}

/* Pool: a job's done runs on the call thread; a deadline while the job runs is held until done,
 * cleanup after it. */
static void test_pool(void)
{
    lkv_client_t *c = client(NULL);
    uint32_t id = 20;
    lkv_docref ref = park_ref("pool:20", &id);
    uint8_t key[32];
    int cl = atomic_load(&n_park_cleanup);
    int done = atomic_load(&n_pool_done);
    ASSERT_OK(lkv_client_delete(c, &ref, 0, key));
    ASSERT_EQ(key[0], 20);
    ASSERT_EQ(atomic_load(&n_pool_done), done + 1);
    ASSERT_EQ(wait_for(&n_park_cleanup, cl + 1), cl + 1);

#ifdef LKV_SANITIZED
    ref = park_ref("pool:2000", &id); /* The job must outlast the deadline even under TSan. */
    const double job_ms = 2000.0;
#else
    ref = park_ref("pool:300", &id);
    const double job_ms = 300.0;
#endif
    double t0 = now_us();
    ASSERT_TRUE(lkv_client_delete(c, &ref, 100, key) != 0);
    ASSERT_EQ(lkv_client_last_status(), 4); /* DEADLINE_EXCEEDED, at the client's deadline. */
    ASSERT_TRUE((now_us() - t0) / 1000.0 < job_ms - 10.0);
    ASSERT_EQ(atomic_load(&n_park_cleanup), cl + 1); /* Held: the job still runs. */
    ASSERT_EQ(wait_for(&n_park_cleanup, cl + 2), cl + 2);
    ASSERT_EQ(atomic_load(&n_pool_done), done + 2);
    ASSERT_EQ(atomic_load(&n_bad_order), 0);
    for (int i = 0; i < 100 && lkv_server_pool_backlog(srv) != 0; i++) {
        sleep_ms(10);
    }
    ASSERT_EQ(lkv_server_pool_backlog(srv), 0);
    lkv_client_destroy(c);
}

typedef struct probe {
    atomic_int stop;
    double max_ms; /* Worst Health latency. */
    int n;         /* Health calls. */
    int lookups;   /* Lookups done meanwhile. */
    int failures;  /* Calls that failed. */
} probe;

static void *probe_main(void *arg)
{
    probe *p = arg;
    lkv_client_t *c = client(NULL);
    uint32_t tok = 1;
    lkv_docref ref = {.profile = "echo", .tokens = &tok, .n_tokens = 1};
    lkv_doc_status st;
    while (!atomic_load(&p->stop)) {
        double t0 = now_us();
        if (lkv_client_ping(c, "", 2000) != 0) {
            p->failures++;
        }
        double ms = (now_us() - t0) / 1000.0;
        p->max_ms = ms > p->max_ms ? ms : p->max_ms;
        p->n++;
        if (lkv_client_lookup(c, &ref, 1, 2000, &st) != 0 || strcmp(st.profile, "echo") != 0) {
            p->failures++;
        }
        p->lookups++;
        sleep_ms(5);
    }
    lkv_client_destroy(c);
    return NULL;
}

/* THE acceptance test: Health and other calls proceed while calls are parked on every polling
 * thread and while the pool runs slow jobs (as a slow RocksDB read would). */
typedef struct hist_get {
    int seen;            /* Histograms visited. */
    uint64_t get_count;  /* The Get histogram's +Inf bucket. */
    uint64_t get_sum_us; /* Its sum. */
} hist_get;

static int hist_get_visit(void *ctx, const lkv_stat_desc *d, const uint64_t *bounds,
                          const uint64_t *cum, int nb, uint64_t sum)
{
    hist_get *h = ctx;
    (void)bounds;
    h->seen++;
    for (int i = 1; i <= nb; i++) {
        ASSERT_TRUE(cum[i] >= cum[i - 1]); /* Cumulative. */
    }
    if (strcmp(d->name, "rpc_duration") == 0 && strstr(d->labels, "method=Get") != NULL) {
        h->get_count = cum[nb];
        h->get_sum_us = sum;
    }
    return 0;
}

static void test_health_while_parked(void)
{
    enum { N = 64 };
    static raw_call rc[N];
    int cl = atomic_load(&n_park_cleanup);
    for (uint32_t i = 0; i < N; i++) {
        atomic_store(&ticket_set[600 + i], 0);
        raw_start(&rc[i], "hold", 600 + i, 0);
    }
    for (uint32_t i = 0; i < N; i++) {
        wait_parked(600 + i);
    }
    probe p;
    memset(&p, 0, sizeof(p));
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, probe_main, &p), 0);
    sleep_ms(500);
    atomic_store(&p.stop, 1);
    pthread_join(th, NULL);
    printf("  %d calls parked: %d Health checks, worst %.1f ms (bound %.0f); %d lookups\n", N, p.n,
           p.max_ms, health_bound_ms(), p.lookups);
    ASSERT_EQ(p.failures, 0);
    ASSERT_TRUE(p.n >= 5);
    ASSERT_TRUE(p.max_ms < health_bound_ms());
    for (uint32_t i = 0; i < N; i++) {
        ASSERT_OK(lkv_rpc_resume(tickets[600 + i], hold_cont, (void *)(uintptr_t)(600 + i)));
    }
    raw_wait(N);
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(rc[i].status, GRPC_STATUS_OK);
        raw_free(&rc[i]);
    }
    ASSERT_EQ(wait_for(&n_park_cleanup, cl + N), cl + N);

    /* Slow pool jobs: 4 calls each sleeping 600 ms in the pool (more than its threads). */
    cl = atomic_load(&n_park_cleanup);
    for (uint32_t i = 0; i < 4; i++) {
        raw_start(&rc[i], "pool:600", 700 + i, 0);
    }
    sleep_ms(50);
    ASSERT_TRUE(lkv_server_pool_backlog(srv) > 0);
    memset(&p, 0, sizeof(p));
    ASSERT_EQ(pthread_create(&th, NULL, probe_main, &p), 0);
    sleep_ms(500);
    atomic_store(&p.stop, 1);
    pthread_join(th, NULL);
    printf("  slow pool jobs running: %d Health checks, worst %.1f ms (bound %.0f); %d lookups\n",
           p.n, p.max_ms, health_bound_ms(), p.lookups);
    ASSERT_EQ(p.failures, 0);
    ASSERT_TRUE(p.n >= 5);
    ASSERT_TRUE(p.max_ms < health_bound_ms());
    raw_wait(4);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(rc[i].status, GRPC_STATUS_OK);
        raw_free(&rc[i]);
    }
    ASSERT_EQ(wait_for(&n_park_cleanup, cl + 4), cl + 4);
}

/* Shutdown with parked calls and a running job: the grace period passes, parked calls are
 * cancelled (cleanup once each), the job finishes first, and stale tickets are refused. */
static void test_shutdown_parked(void)
{
    enum { N = 8 };
    static raw_call rc[N + 1];
    int cl = atomic_load(&n_park_cleanup);
    int done = atomic_load(&n_pool_done);
    for (uint32_t i = 0; i < N; i++) {
        atomic_store(&ticket_set[800 + i], 0);
        raw_start(&rc[i], "hold", 800 + i, 0);
    }
    raw_start(&rc[N], "pool:400", 900, 0);
    for (uint32_t i = 0; i < N; i++) {
        wait_parked(800 + i);
    }
    double t0 = now_us();
    lkv_server_shutdown(srv, 200);
    double ms = (now_us() - t0) / 1000.0;
    printf("  shutdown with %d parked calls and a 400 ms job: %.0f ms\n", N, ms);
    ASSERT_TRUE(ms >= 200.0);
    ASSERT_EQ(atomic_load(&n_park_cleanup), cl + N + 1);
    ASSERT_EQ(atomic_load(&n_pool_done), done + 1);
    ASSERT_EQ(atomic_load(&n_bad_order), 0);
    raw_wait(N + 1);
    for (int i = 0; i < N + 1; i++) {
        ASSERT_TRUE(rc[i].status != GRPC_STATUS_OK || i == N);
        raw_free(&rc[i]);
    }
    for (uint32_t i = 0; i < N; i++) {
        ASSERT_ERR(lkv_rpc_resume(tickets[800 + i], never_cont, NULL), LKV_ECANCELLED);
    }
}

/* The value of trailing metadata key (a copy in buf), or "" when absent. */
static const char *trailer(const raw_call *c, const char *key, char *buf, size_t len)
{
    buf[0] = '\0';
    for (size_t i = 0; i < c->md_trail.count; i++) {
        const grpc_metadata *m = &c->md_trail.metadata[i];
        if (grpc_slice_str_cmp(m->key, key) == 0) {
            size_t n =
                GRPC_SLICE_LENGTH(m->value) < len - 1 ? GRPC_SLICE_LENGTH(m->value) : len - 1;
            memcpy(buf, GRPC_SLICE_START_PTR(m->value), n);
            buf[n] = '\0';
        }
    }
    return buf;
}

static int refused_peer_visit(void *ctx, const lkv_stat_desc *d, double v)
{
    if (strcmp(d->key, "calls_refused_peer") == 0) {
        ASSERT_TRUE(strcmp(d->section, "connections") == 0);
        *(double *)ctx = v;
    }
    return 0;
}

/* Waits until peer ip of server s2 counts want calls (a call is uncounted when its context is
 * freed, just after the client saw its status). */
static uint32_t wait_peer_calls(lkv_server *s2, const char *ip, uint32_t want)
{
    for (int i = 0; i < WAIT_TRIES && lkv_server_peer_calls(s2, ip) != want; i++) {
        sleep_ms(10);
    }
    return lkv_server_peer_calls(s2, ip);
}

/* max_calls_per_peer = 2 on a server of its own: two calls parked from this peer, a third is
 * refused RESOURCE_EXHAUSTED / LKV_ERATE before its handler, Health still answers, a cancelled
 * parked call and finished ones are uncounted (back to 0), and the peer is admitted again. */
static void test_peer_call_cap(void)
{
    enum { ID = 1000 };
    const char *ip = "ipv4:127.0.0.1";
    lkv_stats *reg;
    ASSERT_OK(lkv_stats_create(&reg));
    lkv_server_opts o = {.listen = "127.0.0.1:0",
                         .threads = 2,
                         .max_message_bytes = MAX_MSG,
                         .admit = admit,
                         .pool_threads = 1,
                         .stats = reg,
                         .max_calls_per_peer = 2};
    lkv_server *s2 = NULL;
    char err[256];
    ASSERT_OK(lkv_server_create(&o, methods, (int)(sizeof(methods) / sizeof(methods[0])), &s2, err,
                                sizeof(err)));
    grpc_channel *saved = raw_ch;
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    raw_ch = grpc_channel_create(lkv_server_address(s2), cr, NULL);
    grpc_channel_credentials_release(cr);
    lkv_client_t *hc = client_at(lkv_server_address(s2), NULL);

    raw_call a, b, c;
    raw_start(&a, "hold", ID, 0);
    wait_parked(ID);
    raw_start(&b, "hold", ID + 1, 0);
    wait_parked(ID + 1);
    ASSERT_EQ(lkv_server_peer_calls(s2, ip), 2);
    int entered = atomic_load(&n_park_enter);
    raw_start(&c, "hold", ID + 2, 0);
    raw_wait(1);
    ASSERT_TRUE(c.done && !a.done && !b.done);
    ASSERT_EQ(c.status, GRPC_STATUS_RESOURCE_EXHAUSTED);
    char buf[128];
    ASSERT_TRUE(strcmp(trailer(&c, "lkv-code", buf, sizeof(buf)), "LKV_ERATE") == 0);
    char *d = grpc_slice_to_c_string(c.details);
    ASSERT_TRUE(strstr(d, "max_calls_per_peer = 2") != NULL && strstr(d, ip) != NULL);
    gpr_free(d);
    ASSERT_EQ(atomic_load(&n_park_enter), entered); /* Its handler never ran. */
    ASSERT_EQ(atomic_load(&ticket_set[ID + 2]), 0);
    raw_free(&c);
    ASSERT_EQ(wait_peer_calls(s2, ip, 2), 2); /* The refused call was never counted. */
    for (int i = 0; i < 5; i++) {
        ASSERT_OK(lkv_client_ping(hc, "", 2000)); /* Health: exempt, answers at the cap. */
    }
    double refused = -1;
    ASSERT_OK(lkv_stats_foreach(reg, "connections", refused_peer_visit, &refused));
    ASSERT_NEAR(refused, 1, 0);

    /* A parked call cancelled by its client is uncounted too. */
    grpc_call_cancel(a.call, NULL);
    raw_wait(1);
    ASSERT_TRUE(a.done && !b.done);
    ASSERT_EQ(a.status, GRPC_STATUS_CANCELLED);
    ASSERT_EQ(wait_peer_calls(s2, ip, 1), 1);
    raw_free(&a);
    /* Room for one: admitted, parked; then the cap holds again. */
    raw_start(&a, "hold", ID + 3, 0);
    wait_parked(ID + 3);
    ASSERT_EQ(lkv_server_peer_calls(s2, ip), 2);
    raw_start(&c, "hold", ID + 4, 0);
    raw_wait(1);
    ASSERT_TRUE(c.done && !a.done && !b.done);
    ASSERT_EQ(c.status, GRPC_STATUS_RESOURCE_EXHAUSTED);
    raw_free(&c);

    /* Both parked calls finish: the count goes back to 0 (the entry is gone). */
    ASSERT_OK(lkv_rpc_finish_deferred(tickets[ID + 1], LKV_EBUSY, NULL, "busy"));
    uint8_t key[32] = {3};
    Lazykv__V1__DeleteResponse r = LAZYKV__V1__DELETE_RESPONSE__INIT;
    r.key.data = key;
    r.key.len = 32;
    ASSERT_OK(lkv_rpc_finish_deferred(tickets[ID + 3], 0, &r.base, NULL));
    raw_wait(2);
    ASSERT_TRUE(a.done && b.done);
    ASSERT_EQ(a.status, GRPC_STATUS_OK);
    ASSERT_EQ(b.status, GRPC_STATUS_FAILED_PRECONDITION);
    raw_free(&a);
    raw_free(&b);
    ASSERT_EQ(wait_peer_calls(s2, ip, 0), 0);

    /* Admitted again: three calls in a row (each ends before the next), a parked one too. */
    for (int i = 0; i < 3; i++) {
        raw_start(&c, i == 2 ? "later:5" : "now", ID + 5 + (uint32_t)i, 0);
        raw_wait(1);
        ASSERT_EQ(c.status, GRPC_STATUS_OK);
        raw_free(&c);
    }
    ASSERT_EQ(wait_peer_calls(s2, ip, 0), 0);
    ASSERT_OK(lkv_stats_foreach(reg, "connections", refused_peer_visit, &refused));
    ASSERT_NEAR(refused, 2, 0);

    lkv_client_destroy(hc);
    grpc_channel_destroy(raw_ch);
    raw_ch = saved;
    lkv_server_shutdown(s2, 1000);
    lkv_server_destroy(s2);
    lkv_stats_destroy(reg);
}

/* The accept loop's counters (section "connections") as the registry shows them. */
typedef struct conn_seen {
    int n;
    double accepted;
} conn_seen;

static int conn_visit(void *ctx, const lkv_stat_desc *d, double v)
{
    conn_seen *c = ctx;
    ASSERT_TRUE(strcmp(d->section, "connections") == 0);
    c->n++;
    if (strcmp(d->key, "accepted") == 0) {
        c->accepted = v;
    }
    return 0;
}

/* The per-method counters as the registry shows them. */
typedef struct get_stats {
    double calls, errors, usec_per_call, usec;
    int seen;
} get_stats;

static int get_visit(void *ctx, const lkv_stat_desc *d, double v)
{
    get_stats *g = ctx;
    if (strcmp(d->labels, "service=lazykv.v1.Cache,method=Get") != 0) {
        return 0;
    }
    g->seen++;
    if (strcmp(d->name, "rpc_calls") == 0) {
        ASSERT_TRUE(strcmp(d->section, "calls") == 0 && strcmp(d->key, "Cache.Get.calls") == 0);
        g->calls = v;
    } else if (strcmp(d->name, "rpc_errors") == 0) {
        ASSERT_TRUE(strcmp(d->key, "Cache.Get.errors") == 0);
        g->errors = v;
    } else if (strcmp(d->name, "rpc_usec_per_call") == 0) {
        ASSERT_TRUE(strcmp(d->key, "Cache.Get.usec_per_call") == 0 && d->kind == LKV_STAT_GAUGE);
        g->usec_per_call = v;
    } else if (strcmp(d->name, "rpc_usec") == 0) {
        ASSERT_TRUE(d->section == NULL);
        g->usec = v;
    }
    return 0;
}

int main(void)
{
    char err[256];
    lkv_stats *reg;
    ASSERT_OK(lkv_stats_create(&reg));
    for (uint32_t i = 0; i < MAXP; i++) {
        id_note[i].id = i;
    }
    lkv_server_opts o = {.listen = "127.0.0.1:0",
                         .threads = 2,
                         .max_message_bytes = MAX_MSG,
                         .admit = admit,
                         .admit_ctx = NULL,
                         .pool_threads = 2,
                         .stats = reg};
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
    LKV_RUN(test_exact_codes);
    LKV_RUN(test_server_stream);
    LKV_RUN(test_client_stream);
    LKV_RUN(test_concurrency);

    grpc_init(); /* Our own reference for the raw client below. */
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    raw_ch = grpc_channel_create(addr, cr, NULL);
    grpc_channel_credentials_release(cr);
    raw_cq = grpc_completion_queue_create_for_next(NULL);
    LKV_RUN(test_park_resume);
    LKV_RUN(test_park_deadline);
    LKV_RUN(test_park_cancel);
    LKV_RUN(test_park_many);
    LKV_RUN(test_pool);
    LKV_RUN(test_health_while_parked);
    LKV_RUN(test_peer_call_cap);
    ASSERT_EQ(atomic_load(&n_bad_order), 0);

    ASSERT_TRUE(atomic_load(&n_admit) > 0);
    const char *path;
    uint64_t calls, errors, usec;
    for (int i = 0; i < WAIT_TRIES; i++) { /* Counted when a call's last batch completes. */
        ASSERT_OK(lkv_server_method_stats(srv, 3, &path, &calls, &errors, &usec));
        if (calls == 3 + 8 * 20) {
            break;
        }
        sleep_ms(10);
    }
    ASSERT_TRUE(strcmp(path, "/lazykv.v1.Cache/Get") == 0);
    ASSERT_EQ(calls, 3 + 8 * 20);
    ASSERT_EQ(errors, 2);
    for (int i = 0; i < WAIT_TRIES && lkv_server_calls_in_flight(srv) != 0; i++) {
        sleep_ms(10); /* A call is counted out when its last batch completes. */
    }
    ASSERT_EQ(lkv_server_calls_in_flight(srv), 0);
    /* The same counters through the registry (4 stats per method, 3 of them in INFO, plus one
     * latency histogram per method whose total is the method's calls). */
    int n_methods = (int)(sizeof(methods) / sizeof(methods[0]));
    /* + the accept loop's 7 and calls_refused_peer. */
    ASSERT_EQ(lkv_stats_count(reg), 5 * n_methods + 8);
    conn_seen cs = {0};
    ASSERT_OK(lkv_stats_foreach(reg, "connections", conn_visit, &cs));
    ASSERT_EQ(cs.n, 8);
    ASSERT_TRUE(cs.accepted >= 3); /* This test's clients, each with its own handle. */
    hist_get hg = {0};
    ASSERT_OK(lkv_stats_foreach_hist(reg, hist_get_visit, &hg));
    ASSERT_EQ(hg.seen, n_methods);
    ASSERT_EQ(hg.get_count, calls);
    ASSERT_TRUE(hg.get_sum_us > 0 && (double)hg.get_sum_us <= (double)usec + (double)calls);
    get_stats g = {0};
    ASSERT_OK(lkv_stats_foreach(reg, NULL, get_visit, &g));
    ASSERT_EQ(g.seen, 4);
    ASSERT_EQ(g.calls, calls);
    ASSERT_EQ(g.errors, 2);
    ASSERT_TRUE(g.usec >= (double)usec && g.usec > 0);
    ASSERT_NEAR(g.usec_per_call, g.usec / g.calls, 1e-9 * g.usec);
    LKV_RUN(test_shutdown_parked);
    ASSERT_TRUE(lkv_server_draining(srv));
    lkv_server_destroy(srv);
    ASSERT_EQ(lkv_stats_count(reg), 0); /* Unregistered by destroy. */
    lkv_stats_destroy(reg);
    grpc_channel_destroy(raw_ch);
    grpc_completion_queue_shutdown(raw_cq);
    while (grpc_completion_queue_next(raw_cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(raw_cq);
    grpc_shutdown();
    return 0;
}
