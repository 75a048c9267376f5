/*
 * test_peer.c: daemon/cluster/lkv_peer (the daemon's asynchronous gRPC client) against a real
 * etcd 3.4, which also checks proto/etcd/ (our subset of etcd's rpc.proto and kv.proto: package
 * names, method paths, field numbers) against the real server: every value written through our
 * stubs is read back with etcdctl and the other way round. Skips (77) without etcd.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "etcd_harness.h"
#include "etcdserverpb/rpc.pb-c.h"
#include "lkv_peer.h"
#include "lkv_test.h"
#include "lkv_test_proc.h"
#include "mvccpb/kv.pb-c.h"

static lkv_etcd etcd;
static lkv_peer_engine *eng;
static lkv_peer_chan *ch;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void bin(ProtobufCBinaryData *b, const char *s)
{
    b->data = (uint8_t *)s;
    b->len = strlen(s);
}

static void etcd_put(const char *k, const char *v, int64_t lease)
{
    Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
    bin(&p.key, k);
    bin(&p.value, v);
    p.lease = lease;
    ProtobufCMessage *resp = NULL;
    char msg[256];
    ASSERT_OK(lkv_peer_unary_sync(ch, "/etcdserverpb.KV/Put", &p.base,
                                  &etcdserverpb__put_response__descriptor, NULL, 0, 2000, &resp,
                                  msg, sizeof(msg)));
    const Etcdserverpb__PutResponse *r = (const Etcdserverpb__PutResponse *)resp;
    ASSERT_TRUE(r->header != NULL && r->header->revision > 0 && r->header->cluster_id != 0);
    protobuf_c_message_free_unpacked(resp, NULL);
}

static void test_put_then_etcdctl_reads(void)
{
    etcd_put("/lkvt/a", "hello", 0);
    char out[256];
    ASSERT_EQ(lkv_etcdctl(&etcd, "get /lkvt/a --print-value-only", out, sizeof(out)), 0);
    ASSERT_TRUE(strcmp(out, "hello\n") == 0);
}

static void test_etcdctl_put_then_range(void)
{
    char out[256];
    ASSERT_EQ(lkv_etcdctl(&etcd, "put /lkvt/b world", out, sizeof(out)), 0);
    ASSERT_EQ(lkv_etcdctl(&etcd, "put /lkvu/x outside", out, sizeof(out)), 0);
    Etcdserverpb__RangeRequest r = ETCDSERVERPB__RANGE_REQUEST__INIT;
    bin(&r.key, "/lkvt/");
    bin(&r.range_end, "/lkvt0"); /* '/' + 1 = '0': the prefix range. */
    ProtobufCMessage *resp = NULL;
    char msg[256];
    ASSERT_OK(lkv_peer_unary_sync(ch, "/etcdserverpb.KV/Range", &r.base,
                                  &etcdserverpb__range_response__descriptor, NULL, 0, 2000, &resp,
                                  msg, sizeof(msg)));
    const Etcdserverpb__RangeResponse *rr = (const Etcdserverpb__RangeResponse *)resp;
    ASSERT_EQ(rr->n_kvs, 2);
    ASSERT_EQ(rr->count, 2);
    ASSERT_TRUE(rr->kvs[1]->key.len == 7 && memcmp(rr->kvs[1]->key.data, "/lkvt/b", 7) == 0);
    ASSERT_TRUE(rr->kvs[1]->value.len == 5 && memcmp(rr->kvs[1]->value.data, "world", 5) == 0);
    ASSERT_EQ(rr->kvs[1]->version, 1);
    ASSERT_TRUE(rr->kvs[1]->create_revision > rr->kvs[0]->create_revision);
    ASSERT_TRUE(rr->header->revision >= rr->kvs[1]->mod_revision);
    protobuf_c_message_free_unpacked(resp, NULL);
    /* count_only (field 9) and limit (field 3) */
    r.count_only = 1;
    ASSERT_OK(lkv_peer_unary_sync(ch, "/etcdserverpb.KV/Range", &r.base,
                                  &etcdserverpb__range_response__descriptor, NULL, 0, 2000, &resp,
                                  msg, sizeof(msg)));
    rr = (const Etcdserverpb__RangeResponse *)resp;
    ASSERT_EQ(rr->n_kvs, 0);
    ASSERT_EQ(rr->count, 2);
    protobuf_c_message_free_unpacked(resp, NULL);
}

typedef struct ka_ctx {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int msgs, ended;
    int64_t id, ttl;
    int end_rc;
    /* watch */
    int created;
    int n_events;
    int types[16];
    char keys[16][32], vals[16][32];
} ka_ctx;

static void ka_on_msg(void *arg, ProtobufCMessage *m)
{
    ka_ctx *c = arg;
    const Etcdserverpb__LeaseKeepAliveResponse *r = (const Etcdserverpb__LeaseKeepAliveResponse *)m;
    pthread_mutex_lock(&c->mu);
    c->msgs++;
    c->id = r->id;
    c->ttl = r->ttl;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    protobuf_c_message_free_unpacked(m, NULL);
}

static void on_end(void *arg, int rc, const char *msg)
{
    ka_ctx *c = arg;
    (void)msg;
    pthread_mutex_lock(&c->mu);
    c->ended = 1;
    c->end_rc = rc;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static int wait_for(ka_ctx *c, const int *field, int want, int ms)
{
    int64_t end = now_ms() + ms;
    pthread_mutex_lock(&c->mu);
    while (*field < want && now_ms() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000;
        ts.tv_sec += ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    int ok = *field >= want;
    pthread_mutex_unlock(&c->mu);
    return ok;
}

static void test_lease_grant_keepalive_revoke(void)
{
    Etcdserverpb__LeaseGrantRequest g = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
    g.ttl = 30;
    ProtobufCMessage *resp = NULL;
    char msg[256];
    ASSERT_OK(lkv_peer_unary_sync(ch, "/etcdserverpb.Lease/LeaseGrant", &g.base,
                                  &etcdserverpb__lease_grant_response__descriptor, NULL, 0, 2000,
                                  &resp, msg, sizeof(msg)));
    const Etcdserverpb__LeaseGrantResponse *gr = (const Etcdserverpb__LeaseGrantResponse *)resp;
    int64_t id = gr->id;
    ASSERT_TRUE(id != 0);
    ASSERT_EQ(gr->ttl, 30);
    protobuf_c_message_free_unpacked(resp, NULL);
    char args[128], out[512];
    snprintf(args, sizeof(args), "lease timetolive %llx", (unsigned long long)id);
    ASSERT_EQ(lkv_etcdctl(&etcd, args, out, sizeof(out)), 0);
    ASSERT_TRUE(strstr(out, "granted with TTL(30s)") != NULL);
    etcd_put("/lkvt/leased", "v", id);
    ASSERT_EQ(lkv_etcdctl(&etcd, "get /lkvt/leased -w fields", out, sizeof(out)), 0);
    char want[64];
    snprintf(want, sizeof(want), "\"Lease\" : %lld", (long long)id);
    ASSERT_TRUE(strstr(out, want) != NULL);

    ka_ctx c;
    memset(&c, 0, sizeof(c));
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    lkv_peer_stream *s = NULL;
    ASSERT_OK(lkv_peer_stream_open(ch, "/etcdserverpb.Lease/LeaseKeepAlive",
                                   &etcdserverpb__lease_keep_alive_response__descriptor, NULL, 0, 0,
                                   ka_on_msg, on_end, &c, &s));
    Etcdserverpb__LeaseKeepAliveRequest k = ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;
    k.id = id;
    ASSERT_OK(lkv_peer_stream_send(s, &k.base));
    ASSERT_OK(lkv_peer_stream_send(s, &k.base));
    ASSERT_TRUE(wait_for(&c, &c.msgs, 2, 5000));
    ASSERT_EQ(c.id, id);
    ASSERT_EQ(c.ttl, 30);

    Etcdserverpb__LeaseRevokeRequest rv = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
    rv.id = id;
    ASSERT_OK(lkv_peer_unary_sync(ch, "/etcdserverpb.Lease/LeaseRevoke", &rv.base,
                                  &etcdserverpb__lease_revoke_response__descriptor, NULL, 0, 2000,
                                  &resp, msg, sizeof(msg)));
    protobuf_c_message_free_unpacked(resp, NULL);
    ASSERT_EQ(lkv_etcdctl(&etcd, "get /lkvt/leased --print-value-only", out, sizeof(out)), 0);
    ASSERT_TRUE(out[0] == '\0'); /* The key went with its lease. */
    /* A keep-alive of a revoked lease answers TTL 0 (what membership takes as "expired"). */
    ASSERT_OK(lkv_peer_stream_send(s, &k.base));
    ASSERT_TRUE(wait_for(&c, &c.msgs, 3, 5000));
    ASSERT_TRUE(c.ttl <= 0);
    lkv_peer_stream_cancel(s);
    ASSERT_TRUE(wait_for(&c, &c.ended, 1, 5000));
    ASSERT_EQ(c.end_rc, LKV_ECANCELLED);
    ASSERT_EQ(lkv_peer_stream_send(s, &k.base), LKV_ECANCELLED);
    lkv_peer_stream_release(s);
}

static void watch_on_msg(void *arg, ProtobufCMessage *m)
{
    ka_ctx *c = arg;
    const Etcdserverpb__WatchResponse *w = (const Etcdserverpb__WatchResponse *)m;
    pthread_mutex_lock(&c->mu);
    c->created += w->created;
    for (size_t i = 0; i < w->n_events && c->n_events < 16; i++) {
        const Mvccpb__Event *ev = w->events[i];
        int j = c->n_events++;
        c->types[j] = (int)ev->type;
        snprintf(c->keys[j], sizeof(c->keys[j]), "%.*s", (int)ev->kv->key.len, ev->kv->key.data);
        snprintf(c->vals[j], sizeof(c->vals[j]), "%.*s", (int)ev->kv->value.len,
                 ev->kv->value.data);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    protobuf_c_message_free_unpacked(m, NULL);
}

static void test_watch_sees_etcdctl(void)
{
    ka_ctx c;
    memset(&c, 0, sizeof(c));
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    lkv_peer_stream *s = NULL;
    ASSERT_OK(lkv_peer_stream_open(ch, "/etcdserverpb.Watch/Watch",
                                   &etcdserverpb__watch_response__descriptor, NULL, 0, 0,
                                   watch_on_msg, on_end, &c, &s));
    Etcdserverpb__WatchCreateRequest wc = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
    bin(&wc.key, "/lkvw/");
    bin(&wc.range_end, "/lkvw0");
    Etcdserverpb__WatchRequest wr;
    etcdserverpb__watch_request__init(&wr);
    wr.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
    wr.create_request = &wc;
    ASSERT_OK(lkv_peer_stream_send(s, &wr.base));
    ASSERT_TRUE(wait_for(&c, &c.created, 1, 5000));
    char out[256];
    ASSERT_EQ(lkv_etcdctl(&etcd, "put /lkvw/c one", out, sizeof(out)), 0);
    ASSERT_EQ(lkv_etcdctl(&etcd, "put /lkvx/c outside", out, sizeof(out)), 0);
    ASSERT_EQ(lkv_etcdctl(&etcd, "del /lkvw/c", out, sizeof(out)), 0);
    ASSERT_TRUE(wait_for(&c, &c.n_events, 2, 5000));
    ASSERT_EQ(c.types[0], MVCCPB__EVENT__EVENT_TYPE__PUT);
    ASSERT_TRUE(strcmp(c.keys[0], "/lkvw/c") == 0 && strcmp(c.vals[0], "one") == 0);
    ASSERT_EQ(c.types[1], MVCCPB__EVENT__EVENT_TYPE__DELETE);
    ASSERT_TRUE(strcmp(c.keys[1], "/lkvw/c") == 0);
    lkv_peer_stream_release(s); /* Cancels; on_end still runs. */
    ASSERT_TRUE(wait_for(&c, &c.ended, 1, 5000));
    ASSERT_EQ(c.n_events, 2); /* The put outside the prefix was not delivered. */
}

static void test_delete_range(void)
{
    Etcdserverpb__DeleteRangeRequest d = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
    bin(&d.key, "/lkvt/a");
    d.prev_kv = 1;
    ProtobufCMessage *resp = NULL;
    char msg[256], out[256];
    ASSERT_OK(lkv_peer_unary_sync(ch, "/etcdserverpb.KV/DeleteRange", &d.base,
                                  &etcdserverpb__delete_range_response__descriptor, NULL, 0, 2000,
                                  &resp, msg, sizeof(msg)));
    const Etcdserverpb__DeleteRangeResponse *r = (const Etcdserverpb__DeleteRangeResponse *)resp;
    ASSERT_EQ(r->deleted, 1);
    ASSERT_EQ(r->n_prev_kvs, 1);
    ASSERT_TRUE(r->prev_kvs[0]->value.len == 5 &&
                memcmp(r->prev_kvs[0]->value.data, "hello", 5) == 0);
    protobuf_c_message_free_unpacked(resp, NULL);
    ASSERT_EQ(lkv_etcdctl(&etcd, "get /lkvt/a --print-value-only", out, sizeof(out)), 0);
    ASSERT_TRUE(out[0] == '\0');
}

static void test_errors_within_deadline(void)
{
    /* Nobody listens: UNAVAILABLE, quickly. */
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", lkv_free_port());
    lkv_peer_chan *dead = lkv_peer_chan_create(eng, addr, 0);
    Etcdserverpb__RangeRequest r = ETCDSERVERPB__RANGE_REQUEST__INIT;
    bin(&r.key, "/x");
    ProtobufCMessage *resp = NULL;
    char msg[256];
    int64_t t0 = now_ms();
    int rc = lkv_peer_unary_sync(dead, "/etcdserverpb.KV/Range", &r.base,
                                 &etcdserverpb__range_response__descriptor, NULL, 0, 3000, &resp,
                                 msg, sizeof(msg));
    ASSERT_TRUE(rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT);
    ASSERT_TRUE(now_ms() - t0 <= 3500);
    lkv_peer_chan_destroy(dead);
    /* A stopped etcd: the deadline, not longer. */
    kill(etcd.pid, SIGSTOP);
    lkv_test_wait_stopped(etcd.pid); /* SIGSTOP of a multi-threaded process lands asynchronously. */
    t0 = now_ms();
    rc = lkv_peer_unary_sync(ch, "/etcdserverpb.KV/Range", &r.base,
                             &etcdserverpb__range_response__descriptor, NULL, 0, 300, &resp, msg,
                             sizeof(msg));
    int64_t took = now_ms() - t0;
    kill(etcd.pid, SIGCONT);
    ASSERT_ERR(rc, LKV_ETIMEDOUT);
    ASSERT_TRUE(took >= 250 && took < 1500);
    /* An unknown method of a real server: UNIMPLEMENTED -> LKV_ENOTSUP. */
    rc = lkv_peer_unary_sync(ch, "/etcdserverpb.KV/NoSuch", &r.base,
                             &etcdserverpb__range_response__descriptor, NULL, 0, 2000, &resp, msg,
                             sizeof(msg));
    ASSERT_ERR(rc, LKV_ENOTSUP);
}

static void test_destroy_cancels_open_streams(void)
{
    ka_ctx c;
    memset(&c, 0, sizeof(c));
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    lkv_peer_stream *s = NULL;
    ASSERT_OK(lkv_peer_stream_open(ch, "/etcdserverpb.Watch/Watch",
                                   &etcdserverpb__watch_response__descriptor, NULL, 0, 0,
                                   watch_on_msg, on_end, &c, &s));
    lkv_peer_chan_destroy(ch);
    lkv_peer_engine_destroy(eng); /* Must not hang on the open stream. */
    ASSERT_EQ(c.ended, 1);
    ASSERT_EQ(c.end_rc, LKV_ECANCELLED);
    lkv_peer_stream_release(s);
}

int main(void)
{
    if (!lkv_etcd_available()) {
        fprintf(stderr, "etcd not installed (apt-get install etcd-server etcd-client): skip\n");
        return 77;
    }
    if (lkv_etcd_start(&etcd) != 0) {
        return 1;
    }
    ASSERT_OK(lkv_peer_engine_create(&eng));
    ch = lkv_peer_chan_create(eng, etcd.endpoint, 0);
    LKV_RUN(test_put_then_etcdctl_reads);
    LKV_RUN(test_etcdctl_put_then_range);
    LKV_RUN(test_lease_grant_keepalive_revoke);
    LKV_RUN(test_watch_sees_etcdctl);
    LKV_RUN(test_delete_range);
    LKV_RUN(test_errors_within_deadline);
    LKV_RUN(test_destroy_cancels_open_streams);
    lkv_etcd_destroy(&etcd);
    fprintf(stderr, "ok\n");
    return 0;
}
