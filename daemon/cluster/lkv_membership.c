/*
 * lkv_membership.c: members from etcd, a static list or DNS, and their health (see
 * lkv_membership.h).
 *
 * State: one table of members under m->mu. Each entry has the time it was last seen answering
 * (last_ok_ms), whether a health probe is in flight, and which sources know it (etcd / static /
 * dns). The membership thread ticks every min(health_interval / 2, 100) ms: it re-resolves DNS,
 * starts health probes and marks members DOWN. In mode etcd a second thread keeps the session
 * (registration, keep-alives): registering blocks up to a second per step while etcd is away,
 * which must not delay health. Probe answers and etcd stream messages arrive on the peer
 * engine's thread and update the table under the same lock. on_change runs with no lock held.
 *
 * etcd session: LeaseGrant(ttl) -> Put(prefix+id, record, lease) -> Range(prefix) (replaces the
 * etcd-known members) -> Watch(prefix, start_revision = Range revision + 1) and a
 * LeaseKeepAlive stream. The session is lost when a stream ends, a keep-alive answers TTL 0
 * (the lease expired, e.g. after SIGSTOP) or none answered for ttl: then both streams are
 * cancelled and the thread registers again.
 */
#include "lkv_membership.h"

#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <arpa/inet.h>

#include "etcdserverpb/rpc.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"
#include "lkv_err.h"
#include "lkv_log.h"
#include "mvccpb/kv.pb-c.h"

#define SRC_ETCD   1u
#define SRC_STATIC 2u
#define SRC_DNS    4u
#define MAX_CHANS  512
#define DEFAULT_W  (1ull << 30)

typedef struct entry {
    lkv_member mb;
    unsigned src;
    int64_t known_ms;   /* When it joined the table. */
    int64_t last_ok_ms; /* Last SERVING answer (0: never). */
    int64_t last_probe_ms;
    int probing;
} entry;

typedef struct chan_ent {
    char addr[256]; /* A member's addr (< LKV_MEMBER_ADDR_MAX) or an etcd endpoint (< 256). */
    lkv_peer_chan *ch;
} chan_ent;

struct lkv_membership {
    lkv_membership_config cfg;
    char self_id[LKV_MEMBER_ID_MAX], self_addr[LKV_MEMBER_ADDR_MAX], version[32];
    char prefix[128], etcd[512], members[4096], dns[256];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th, etcd_th; /* Health + DNS; etcd session (mode etcd). */
    int stop;
    entry *tab; /* LKV_MEMBERS_MAX entries. */
    size_t n;
    uint64_t epoch;
    int changed;            /* A change not yet announced through on_change. */
    int hook_running;       /* on_change calls in progress. */
    int64_t last_tick_ms;   /* Last health tick. */
    int64_t judge_after_ms; /* No member is marked down before this (after a stall of ours). */
    chan_ent chans[MAX_CHANS];
    size_t n_chans;
    int probes_in_flight; /* Health probes (engine callbacks still to come). */
    /* etcd session. */
    int session;      /* 1 while up. */
    int session_lost; /* Set by callbacks: the thread tears the session down. */
    int etcd_streams; /* Streams whose on_end has not run. */
    int64_t lease_id;
    int64_t ka_sent_ms, ka_ok_ms;
    int ep_idx; /* Which etcd endpoint is in use. */
    lkv_peer_stream *watch, *ka;
    int64_t last_fail_log_ms;
    int64_t dns_next_ms;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *lkv_member_state_name(int state)
{
    switch (state) {
    case LKV_MEMBER_UP:
        return "up";
    case LKV_MEMBER_DOWN:
        return "down";
    default:
        return "joining";
    }
}

int lkv_member_record_parse(const char *rec, size_t len, lkv_member *out)
{
    char buf[1024];
    if (len >= sizeof(buf)) {
        len = sizeof(buf) - 1;
    }
    memcpy(buf, rec, len);
    buf[len] = '\0';
    int have_addr = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, " \t\n", &save); tok != NULL;
         tok = strtok_r(NULL, " \t\n", &save)) {
        char *eq = strchr(tok, '=');
        if (eq == NULL) {
            continue;
        }
        *eq = '\0';
        const char *v = eq + 1;
        if (strcmp(tok, "addr") == 0 && v[0] != '\0' && strlen(v) < sizeof(out->addr)) {
            snprintf(out->addr, sizeof(out->addr), "%s", v);
            have_addr = 1;
        } else if (strcmp(tok, "version") == 0) {
            snprintf(out->version, sizeof(out->version), "%s", v);
        } else if (strcmp(tok, "hot_bytes") == 0) {
            out->hot_bytes = strtoull(v, NULL, 10);
        }
    }
    return have_addr ? 0 : LKV_EINVAL;
}

void lkv_member_record_format(const lkv_member *mb, char *buf, size_t len)
{
    snprintf(buf, len, "addr=%s version=%s hot_bytes=%" PRIu64, mb->addr, mb->version,
             mb->hot_bytes);
}

/* ---- table (under mu) -------------------------------------------------------------------- */

static entry *find_locked(lkv_membership *m, const char *id)
{
    for (size_t i = 0; i < m->n; i++) {
        if (strcmp(m->tab[i].mb.id, id) == 0) {
            return &m->tab[i];
        }
    }
    return NULL;
}

static void changed_locked(lkv_membership *m)
{
    m->epoch++;
    m->changed = 1;
}

/* Adds or updates a member known from src. */
static void upsert_locked(lkv_membership *m, const lkv_member *mb, unsigned src)
{
    entry *e = find_locked(m, mb->id);
    if (e == NULL) {
        if (m->n >= LKV_MEMBERS_MAX) {
            LKV_LOGW("cluster: member table full (%d): ignoring %s", LKV_MEMBERS_MAX, mb->id);
            return;
        }
        e = &m->tab[m->n++];
        memset(e, 0, sizeof(*e));
        e->mb = *mb;
        e->mb.self = strcmp(mb->id, m->self_id) == 0;
        e->mb.state = e->mb.self ? LKV_MEMBER_UP : LKV_MEMBER_JOINING;
        e->known_ms = now_ms();
        e->src = src;
        if (!e->mb.self) {
            LKV_LOGI("cluster: member %s joined (addr %s, version %s, hot %" PRIu64 " bytes)",
                     mb->id, mb->addr, mb->version[0] ? mb->version : "?", mb->hot_bytes);
        }
        changed_locked(m);
        return;
    }
    e->src |= src;
    if (e->mb.self) {
        return; /* Our own record is ours: a static list or DNS only confirms it. */
    }
    if (strcmp(e->mb.addr, mb->addr) != 0 || strcmp(e->mb.version, mb->version) != 0 ||
        e->mb.hot_bytes != mb->hot_bytes) {
        LKV_LOGI("cluster: member %s record changed (addr %s, version %s, hot %" PRIu64 " bytes)",
                 mb->id, mb->addr, mb->version[0] ? mb->version : "?", mb->hot_bytes);
        snprintf(e->mb.addr, sizeof(e->mb.addr), "%s", mb->addr);
        snprintf(e->mb.version, sizeof(e->mb.version), "%s", mb->version);
        e->mb.hot_bytes = mb->hot_bytes;
        changed_locked(m);
    }
}

/* Drops src from member id; removes it when no source knows it any more (never self). */
static void forget_locked(lkv_membership *m, const char *id, unsigned src, const char *why)
{
    entry *e = find_locked(m, id);
    if (e == NULL) {
        return;
    }
    e->src &= ~src;
    if (e->src != 0 || e->mb.self) {
        return;
    }
    LKV_LOGI("cluster: member %s left (%s)", id, why);
    *e = m->tab[--m->n];
    changed_locked(m);
}

/* Removes every member known only from src and not in keep (ids, n_keep). */
static void forget_others_locked(lkv_membership *m, unsigned src, char (*keep)[LKV_MEMBER_ID_MAX],
                                 size_t n_keep, const char *why)
{
    for (size_t i = m->n; i-- > 0;) {
        entry *e = &m->tab[i];
        if (!(e->src & src)) {
            continue;
        }
        int kept = 0;
        for (size_t k = 0; k < n_keep && !kept; k++) {
            kept = strcmp(keep[k], e->mb.id) == 0;
        }
        if (!kept) {
            char id[LKV_MEMBER_ID_MAX];
            snprintf(id, sizeof(id), "%s", e->mb.id);
            forget_locked(m, id, src, why);
        }
    }
}

static void set_state_locked(lkv_membership *m, entry *e, int st, const char *why)
{
    if (e->mb.state == st) {
        return;
    }
    LKV_LOGI("cluster: member %s %s (%s)", e->mb.id, lkv_member_state_name(st), why);
    e->mb.state = st;
    changed_locked(m);
}

/* Runs on_change if something changed (call with mu held; releases and retakes it). */
static void announce_locked(lkv_membership *m)
{
    if (!m->changed) {
        return;
    }
    m->changed = 0;
    void (*fn)(void *) = m->cfg.on_change;
    void *ctx = m->cfg.ctx;
    if (fn != NULL) {
        m->hook_running++;
        pthread_mutex_unlock(&m->mu);
        fn(ctx);
        pthread_mutex_lock(&m->mu);
        if (--m->hook_running == 0) {
            pthread_cond_broadcast(&m->cv);
        }
    }
}

void lkv_membership_set_hook(lkv_membership *m, void (*fn)(void *ctx), void *ctx)
{
    pthread_mutex_lock(&m->mu);
    m->cfg.on_change = fn;
    m->cfg.ctx = ctx;
    /* Clearing: wait for a hook call in progress, so its ctx may be freed after this. */
    while (fn == NULL && m->hook_running > 0) {
        pthread_cond_wait(&m->cv, &m->mu);
    }
    m->changed = 1;
    pthread_mutex_unlock(&m->mu);
}

lkv_peer_chan *lkv_membership_chan(lkv_membership *m, const char *addr)
{
    lkv_peer_chan *ch = NULL;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n_chans; i++) {
        if (strcmp(m->chans[i].addr, addr) == 0) {
            ch = m->chans[i].ch;
            break;
        }
    }
    if (ch == NULL && m->n_chans < MAX_CHANS) {
        chan_ent *c = &m->chans[m->n_chans++];
        snprintf(c->addr, sizeof(c->addr), "%s", addr);
        c->ch = lkv_peer_chan_create(m->cfg.engine, addr, 0);
        ch = c->ch;
    }
    pthread_mutex_unlock(&m->mu);
    return ch;
}

size_t lkv_membership_snapshot(lkv_membership *m, lkv_member *out, size_t cap, uint64_t *epoch)
{
    pthread_mutex_lock(&m->mu);
    size_t n = m->n;
    for (size_t i = 0; i < n && i < cap; i++) {
        out[i] = m->tab[i].mb;
    }
    if (epoch != NULL) {
        *epoch = m->epoch;
    }
    pthread_mutex_unlock(&m->mu);
    size_t k = n < cap ? n : cap;
    /* Sorted by id (insertion sort: a few hundred at most). */
    for (size_t i = 1; i < k; i++) {
        lkv_member t = out[i];
        size_t j = i;
        while (j > 0 && strcmp(out[j - 1].id, t.id) > 0) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = t;
    }
    return n;
}

int lkv_membership_etcd_up(lkv_membership *m)
{
    pthread_mutex_lock(&m->mu);
    int up = m->session;
    pthread_mutex_unlock(&m->mu);
    return up;
}

/* ---- health ------------------------------------------------------------------------------ */

typedef struct probe {
    lkv_membership *m;
    char id[LKV_MEMBER_ID_MAX];
} probe;

static void probe_done(void *arg, int rc, const char *msg, ProtobufCMessage *resp)
{
    probe *p = arg;
    lkv_membership *m = p->m;
    int serving = 0;
    if (rc == 0) {
        const Grpc__Health__V1__HealthCheckResponse *r =
            (const Grpc__Health__V1__HealthCheckResponse *)resp;
        serving = r->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    (void)msg;
    pthread_mutex_lock(&m->mu);
    entry *e = find_locked(m, p->id);
    if (e != NULL) {
        e->probing = 0;
        if (serving) {
            e->last_ok_ms = now_ms();
            set_state_locked(m, e, LKV_MEMBER_UP, "answers health checks");
        }
    }
    m->probes_in_flight--;
    pthread_cond_broadcast(&m->cv);
    announce_locked(m);
    pthread_mutex_unlock(&m->mu);
    free(p);
}

/* Starts due probes and marks silent members down (mu held). */
static void health_tick_locked(lkv_membership *m, int64_t now)
{
    int64_t iv = (int64_t)m->cfg.health_interval_ms;
    int64_t down = (int64_t)m->cfg.down_after_ms;
    /* A tick far too late means we were not running (SIGSTOP, a stalled machine): the silence
     * was ours, not the peers'. Judge nobody until the probes had a fair chance again. */
    if (m->last_tick_ms != 0 && now - m->last_tick_ms > down / 2) {
        m->judge_after_ms = now + (iv > down / 2 ? iv : down / 2) + 200;
    }
    m->last_tick_ms = now;
    int judge = now >= m->judge_after_ms;
    for (size_t i = 0; i < m->n; i++) {
        entry *e = &m->tab[i];
        if (e->mb.self) {
            continue;
        }
        int64_t since = e->last_ok_ms > 0 ? e->last_ok_ms : e->known_ms;
        if (judge && e->mb.state != LKV_MEMBER_DOWN && now - since > down) {
            char why[96];
            snprintf(why, sizeof(why), "no answer for %" PRId64 " ms", now - since);
            set_state_locked(m, e, LKV_MEMBER_DOWN, why);
        }
        if (e->probing || now - e->last_probe_ms < iv || m->stop) {
            continue;
        }
        char addr[LKV_MEMBER_ADDR_MAX];
        snprintf(addr, sizeof(addr), "%s", e->mb.addr);
        probe *p = lkv_xcalloc(1, sizeof(*p));
        p->m = m;
        snprintf(p->id, sizeof(p->id), "%s", e->mb.id);
        e->probing = 1;
        e->last_probe_ms = now;
        m->probes_in_flight++;
        pthread_mutex_unlock(&m->mu);
        lkv_peer_chan *ch = lkv_membership_chan(m, addr);
        Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        req.service = "";
        /* A probe may take up to half of down_after (a busy peer is slow, not dead); a silent
         * peer is still marked down at down_after, counted from its last good answer. */
        int64_t pdl = down / 2 > iv ? down / 2 : iv;
        int rc = lkv_peer_unary(ch, "/grpc.health.v1.Health/Check", &req.base,
                                &grpc__health__v1__health_check_response__descriptor, NULL, 0,
                                pdl < 200 ? 200 : pdl, probe_done, p);
        pthread_mutex_lock(&m->mu);
        if (rc != 0) {
            m->probes_in_flight--;
            e = find_locked(m, p->id);
            if (e != NULL) {
                e->probing = 0;
            }
            free(p);
        }
        /* The table may have moved while unlocked: restart the scan next tick. */
        break;
    }
}

/* ---- etcd -------------------------------------------------------------------------------- */

/* The endpoint in use (comma list, m->ep_idx). */
static void etcd_endpoint(lkv_membership *m, char *out, size_t len)
{
    int n = 0;
    const char *p = m->etcd;
    const char *pick = m->etcd;
    int count = 1;
    for (const char *q = m->etcd; *q; q++) {
        count += *q == ',';
    }
    int want = m->ep_idx % count;
    while (n < want && (p = strchr(p, ',')) != NULL) {
        p++;
        n++;
        pick = p;
    }
    size_t k = strcspn(pick, ",");
    if (k >= len) {
        k = len - 1;
    }
    memcpy(out, pick, k);
    out[k] = '\0';
}

static lkv_peer_chan *etcd_chan(lkv_membership *m)
{
    char ep[256];
    etcd_endpoint(m, ep, sizeof(ep));
    return lkv_membership_chan(m, ep);
}

/* Applies one key/value from etcd (put) to the table (mu held). */
static void etcd_put_locked(lkv_membership *m, const ProtobufCBinaryData *key,
                            const ProtobufCBinaryData *val)
{
    size_t pl = strlen(m->prefix);
    if (key->len <= pl || key->len - pl >= LKV_MEMBER_ID_MAX) {
        return;
    }
    lkv_member mb;
    memset(&mb, 0, sizeof(mb));
    memcpy(mb.id, key->data + pl, key->len - pl);
    if (lkv_member_record_parse((const char *)val->data, val->len, &mb) != 0) {
        LKV_LOGW("cluster: etcd record of %s has no addr: ignored", mb.id);
        return;
    }
    upsert_locked(m, &mb, SRC_ETCD);
}

static void etcd_del_locked(lkv_membership *m, const ProtobufCBinaryData *key)
{
    size_t pl = strlen(m->prefix);
    if (key->len <= pl || key->len - pl >= LKV_MEMBER_ID_MAX) {
        return;
    }
    char id[LKV_MEMBER_ID_MAX];
    memcpy(id, key->data + pl, key->len - pl);
    id[key->len - pl] = '\0';
    forget_locked(m, id, SRC_ETCD, "its etcd record is gone");
}

static void watch_msg(void *arg, ProtobufCMessage *msg)
{
    lkv_membership *m = arg;
    const Etcdserverpb__WatchResponse *w = (const Etcdserverpb__WatchResponse *)msg;
    pthread_mutex_lock(&m->mu);
    if (w->canceled) {
        LKV_LOGW("cluster: etcd cancelled the watch (%s)",
                 w->cancel_reason ? w->cancel_reason : "");
        m->session_lost = 1;
    }
    for (size_t i = 0; i < w->n_events; i++) {
        const Mvccpb__Event *ev = w->events[i];
        if (ev->kv == NULL) {
            continue;
        }
        if (ev->type == MVCCPB__EVENT__EVENT_TYPE__PUT) {
            etcd_put_locked(m, &ev->kv->key, &ev->kv->value);
        } else {
            etcd_del_locked(m, &ev->kv->key);
        }
    }
    announce_locked(m);
    pthread_mutex_unlock(&m->mu);
    protobuf_c_message_free_unpacked(msg, NULL);
}

static void ka_msg(void *arg, ProtobufCMessage *msg)
{
    lkv_membership *m = arg;
    const Etcdserverpb__LeaseKeepAliveResponse *r =
        (const Etcdserverpb__LeaseKeepAliveResponse *)msg;
    pthread_mutex_lock(&m->mu);
    if (r->ttl <= 0) {
        LKV_LOGW("cluster: etcd lease %" PRIx64 " expired: registering again",
                 (uint64_t)m->lease_id);
        m->session_lost = 1;
    } else {
        m->ka_ok_ms = now_ms();
    }
    pthread_mutex_unlock(&m->mu);
    protobuf_c_message_free_unpacked(msg, NULL);
}

static void etcd_stream_end(void *arg, int rc, const char *msg)
{
    lkv_membership *m = arg;
    pthread_mutex_lock(&m->mu);
    if (m->session && !m->stop) {
        LKV_LOGW("cluster: etcd stream ended: %s (%s)", msg, lkv_err_name(rc));
    }
    m->session_lost = 1;
    m->etcd_streams--;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

/* Tears the session down (thread, mu held: released while waiting for the streams). */
static void etcd_drop_locked(lkv_membership *m)
{
    lkv_peer_stream *w = m->watch, *k = m->ka;
    m->watch = m->ka = NULL;
    int was = m->session;
    m->session = 0;
    pthread_mutex_unlock(&m->mu);
    lkv_peer_stream_release(w);
    lkv_peer_stream_release(k);
    pthread_mutex_lock(&m->mu);
    while (m->etcd_streams > 0) {
        pthread_cond_wait(&m->cv, &m->mu);
    }
    m->session_lost = 0;
    if (was && !m->stop) {
        LKV_LOGW("cluster: etcd session lost; serving local data, registering again");
    }
}

static int etcd_fail(lkv_membership *m, const char *step, int rc, const char *msg)
{
    int64_t now = now_ms();
    if (now - m->last_fail_log_ms >= 10000) {
        char ep[256];
        etcd_endpoint(m, ep, sizeof(ep));
        LKV_LOGW("cluster: etcd %s at %s failed: %s (%s); retrying every second", step, ep, msg,
                 lkv_err_name(rc));
        m->last_fail_log_ms = now;
    }
    m->ep_idx++;
    return rc;
}

/* Registers (thread, no lock held). Returns 0 once the session is up. */
static int etcd_register(lkv_membership *m)
{
    lkv_peer_chan *ch = etcd_chan(m);
    char msg[256];
    ProtobufCMessage *resp = NULL;
    const int64_t dl = 1000;

    Etcdserverpb__LeaseGrantRequest g = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
    g.ttl = m->cfg.lease_ttl_s;
    int rc = lkv_peer_unary_sync(ch, "/etcdserverpb.Lease/LeaseGrant", &g.base,
                                 &etcdserverpb__lease_grant_response__descriptor, NULL, 0, dl,
                                 &resp, msg, sizeof(msg));
    if (rc != 0) {
        return etcd_fail(m, "LeaseGrant", rc, msg);
    }
    const Etcdserverpb__LeaseGrantResponse *gr = (const Etcdserverpb__LeaseGrantResponse *)resp;
    int64_t lease = gr->id;
    int64_t ttl = gr->ttl;
    int bad = gr->error != NULL && gr->error[0] != '\0';
    if (bad) {
        snprintf(msg, sizeof(msg), "%s", gr->error);
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    if (bad || lease == 0) {
        return etcd_fail(m, "LeaseGrant", LKV_EUNAVAIL, bad ? msg : "no lease id");
    }

    char key[LKV_MEMBER_ID_MAX + 128], rec[512];
    snprintf(key, sizeof(key), "%s%s", m->prefix, m->self_id);
    lkv_member self;
    memset(&self, 0, sizeof(self));
    snprintf(self.addr, sizeof(self.addr), "%s", m->self_addr);
    snprintf(self.version, sizeof(self.version), "%s", m->version);
    self.hot_bytes = m->cfg.hot_bytes;
    lkv_member_record_format(&self, rec, sizeof(rec));
    Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
    p.key.data = (uint8_t *)key;
    p.key.len = strlen(key);
    p.value.data = (uint8_t *)rec;
    p.value.len = strlen(rec);
    p.lease = lease;
    rc = lkv_peer_unary_sync(ch, "/etcdserverpb.KV/Put", &p.base,
                             &etcdserverpb__put_response__descriptor, NULL, 0, dl, &resp, msg,
                             sizeof(msg));
    if (rc != 0) {
        return etcd_fail(m, "Put", rc, msg);
    }
    protobuf_c_message_free_unpacked(resp, NULL);

    /* Range over the prefix: [prefix, prefix with its last byte + 1). */
    char end[sizeof(m->prefix)];
    size_t pl = strlen(m->prefix);
    memcpy(end, m->prefix, pl);
    end[pl - 1] = (char)(end[pl - 1] + 1);
    Etcdserverpb__RangeRequest r = ETCDSERVERPB__RANGE_REQUEST__INIT;
    r.key.data = (uint8_t *)m->prefix;
    r.key.len = pl;
    r.range_end.data = (uint8_t *)end;
    r.range_end.len = pl;
    rc = lkv_peer_unary_sync(ch, "/etcdserverpb.KV/Range", &r.base,
                             &etcdserverpb__range_response__descriptor, NULL, 0, dl, &resp, msg,
                             sizeof(msg));
    if (rc != 0) {
        return etcd_fail(m, "Range", rc, msg);
    }
    const Etcdserverpb__RangeResponse *rr = (const Etcdserverpb__RangeResponse *)resp;
    int64_t rev = rr->header != NULL ? rr->header->revision : 0;
    static char ids[LKV_MEMBERS_MAX][LKV_MEMBER_ID_MAX]; /* Membership thread only. */
    size_t n_ids = 0;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < rr->n_kvs; i++) {
        const Mvccpb__KeyValue *kv = rr->kvs[i];
        etcd_put_locked(m, &kv->key, &kv->value);
        if (n_ids < LKV_MEMBERS_MAX && kv->key.len > pl && kv->key.len - pl < LKV_MEMBER_ID_MAX) {
            memcpy(ids[n_ids], kv->key.data + pl, kv->key.len - pl);
            ids[n_ids][kv->key.len - pl] = '\0';
            n_ids++;
        }
    }
    forget_others_locked(m, SRC_ETCD, ids, n_ids, "not in etcd after re-registering");
    pthread_mutex_unlock(&m->mu);
    protobuf_c_message_free_unpacked(resp, NULL);

    pthread_mutex_lock(&m->mu);
    m->etcd_streams += 2;
    pthread_mutex_unlock(&m->mu);
    lkv_peer_stream *w = NULL, *k = NULL;
    rc = lkv_peer_stream_open(ch, "/etcdserverpb.Watch/Watch",
                              &etcdserverpb__watch_response__descriptor, NULL, 0, 0, watch_msg,
                              etcd_stream_end, m, &w);
    if (rc != 0) {
        pthread_mutex_lock(&m->mu);
        m->etcd_streams -= 2;
        pthread_mutex_unlock(&m->mu);
        return etcd_fail(m, "Watch", rc, lkv_strerror(rc));
    }
    rc = lkv_peer_stream_open(ch, "/etcdserverpb.Lease/LeaseKeepAlive",
                              &etcdserverpb__lease_keep_alive_response__descriptor, NULL, 0, 0,
                              ka_msg, etcd_stream_end, m, &k);
    if (rc != 0) {
        pthread_mutex_lock(&m->mu);
        m->etcd_streams--;
        m->watch = w;
        etcd_drop_locked(m);
        pthread_mutex_unlock(&m->mu);
        return etcd_fail(m, "LeaseKeepAlive", rc, lkv_strerror(rc));
    }
    Etcdserverpb__WatchCreateRequest wc = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
    wc.key.data = (uint8_t *)m->prefix;
    wc.key.len = pl;
    wc.range_end.data = (uint8_t *)end;
    wc.range_end.len = pl;
    wc.start_revision = rev + 1;
    Etcdserverpb__WatchRequest wr;
    etcdserverpb__watch_request__init(&wr);
    wr.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
    wr.create_request = &wc;
    lkv_peer_stream_send(w, &wr.base);

    pthread_mutex_lock(&m->mu);
    m->watch = w;
    m->ka = k;
    m->lease_id = lease;
    m->session = 1;
    m->session_lost = 0;
    m->ka_ok_ms = now_ms();
    m->ka_sent_ms = 0;
    LKV_LOGI("cluster: registered in etcd as %s (lease %" PRIx64 ", ttl %" PRId64
             " s, %zu member record(s))",
             m->self_id, (uint64_t)lease, ttl, n_ids);
    m->last_fail_log_ms = 0;
    announce_locked(m);
    pthread_mutex_unlock(&m->mu);
    return 0;
}

/* Keep-alive and session checks (thread, mu held). */
static void etcd_tick_locked(lkv_membership *m, int64_t now)
{
    int64_t ttl_ms = (int64_t)m->cfg.lease_ttl_s * 1000;
    if (m->session && (m->session_lost || now - m->ka_ok_ms > ttl_ms)) {
        etcd_drop_locked(m);
    }
    if (!m->session) {
        return;
    }
    if (now - m->ka_sent_ms >= ttl_ms / 3) {
        Etcdserverpb__LeaseKeepAliveRequest k = ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;
        k.id = m->lease_id;
        m->ka_sent_ms = now;
        lkv_peer_stream_send(m->ka, &k.base);
    }
}

/* ---- static and DNS ---------------------------------------------------------------------- */

/* Parses "host:port[=bytes],..." into the table (start-up). */
static int static_load(lkv_membership *m, char *err, size_t errlen)
{
    char buf[sizeof(m->members)];
    snprintf(buf, sizeof(buf), "%s", m->members);
    char *save = NULL;
    pthread_mutex_lock(&m->mu);
    for (char *tok = strtok_r(buf, ", ", &save); tok != NULL; tok = strtok_r(NULL, ", ", &save)) {
        lkv_member mb;
        memset(&mb, 0, sizeof(mb));
        char *eq = strchr(tok, '=');
        mb.hot_bytes = DEFAULT_W;
        if (eq != NULL) {
            *eq = '\0';
            mb.hot_bytes = strtoull(eq + 1, NULL, 10);
        }
        if (strchr(tok, ':') == NULL || strlen(tok) >= sizeof(mb.addr)) {
            pthread_mutex_unlock(&m->mu);
            snprintf(err, errlen, "option 'cluster_members': '%s' is not host:port", tok);
            return LKV_EINVAL;
        }
        snprintf(mb.addr, sizeof(mb.addr), "%s", tok);
        snprintf(mb.id, sizeof(mb.id), "%s", tok);
        upsert_locked(m, &mb, SRC_STATIC);
    }
    pthread_mutex_unlock(&m->mu);
    return 0;
}

static void dns_refresh(lkv_membership *m)
{
    char host[256];
    snprintf(host, sizeof(host), "%s", m->dns);
    char *colon = strrchr(host, ':');
    if (colon == NULL) {
        return;
    }
    *colon = '\0';
    const char *port = colon + 1;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, port, &hints, &res);
    static char ids[LKV_MEMBERS_MAX][LKV_MEMBER_ID_MAX]; /* Membership thread only. */
    size_t n = 0;
    if (rc != 0) {
        LKV_LOGW("cluster: cannot resolve %s: %s (keeping the last view)", m->dns,
                 gai_strerror(rc));
        return;
    }
    pthread_mutex_lock(&m->mu);
    for (struct addrinfo *a = res; a != NULL && n < LKV_MEMBERS_MAX; a = a->ai_next) {
        char ip[INET6_ADDRSTRLEN];
        lkv_member mb;
        memset(&mb, 0, sizeof(mb));
        if (a->ai_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)a->ai_addr)->sin_addr, ip, sizeof(ip));
            snprintf(mb.addr, sizeof(mb.addr), "%s:%s", ip, port);
        } else if (a->ai_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)a->ai_addr)->sin6_addr, ip, sizeof(ip));
            snprintf(mb.addr, sizeof(mb.addr), "[%s]:%s", ip, port);
        } else {
            continue;
        }
        snprintf(mb.id, sizeof(mb.id), "%s", mb.addr);
        mb.hot_bytes = DEFAULT_W;
        int dup = 0;
        for (size_t k = 0; k < n && !dup; k++) {
            dup = strcmp(ids[k], mb.id) == 0;
        }
        if (dup) {
            continue;
        }
        snprintf(ids[n++], LKV_MEMBER_ID_MAX, "%s", mb.id);
        upsert_locked(m, &mb, SRC_DNS);
    }
    forget_others_locked(m, SRC_DNS, ids, n, "no longer in DNS");
    announce_locked(m);
    pthread_mutex_unlock(&m->mu);
    freeaddrinfo(res);
}

/* ---- thread ------------------------------------------------------------------------------ */

/* Waits on m->cv for ms (mu held). */
static void nap_locked(lkv_membership *m, int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ms * 1000000;
    ts.tv_sec += ts.tv_nsec / 1000000000;
    ts.tv_nsec %= 1000000000;
    pthread_cond_timedwait(&m->cv, &m->mu, &ts);
}

/* The etcd thread: registration blocks (1 s deadlines), so it is not the health thread. */
static void *etcd_main(void *arg)
{
    lkv_membership *m = arg;
    int64_t next_reg = 0;
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        int64_t now = now_ms();
        etcd_tick_locked(m, now);
        if (!m->session && now >= next_reg && !m->stop) {
            pthread_mutex_unlock(&m->mu);
            int rc = etcd_register(m);
            pthread_mutex_lock(&m->mu);
            next_reg = rc == 0 ? 0 : now_ms() + 1000;
        }
        nap_locked(m, 50);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

static void *membership_main(void *arg)
{
    lkv_membership *m = arg;
    int64_t tick = (int64_t)m->cfg.health_interval_ms / 2;
    if (tick > 100) {
        tick = 100;
    }
    if (tick < 10) {
        tick = 10;
    }
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        int64_t now = now_ms();
        if (m->cfg.mode == LKV_CLUSTER_DNS && now >= m->dns_next_ms) {
            m->dns_next_ms = now + (int64_t)m->cfg.dns_refresh_ms;
            pthread_mutex_unlock(&m->mu);
            dns_refresh(m);
            pthread_mutex_lock(&m->mu);
        }
        health_tick_locked(m, now_ms());
        announce_locked(m);
        nap_locked(m, tick);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

int lkv_membership_start(const lkv_membership_config *cfg, lkv_membership **out, char *err,
                         size_t errlen)
{
    *out = NULL;
    if (cfg->self_addr == NULL || cfg->self_addr[0] == '\0' || cfg->engine == NULL) {
        snprintf(err, errlen, "cluster: no advertised address");
        return LKV_EINVAL;
    }
    if (cfg->mode == LKV_CLUSTER_ETCD && (cfg->etcd == NULL || cfg->etcd[0] == '\0')) {
        snprintf(err, errlen, "option 'cluster_etcd': required with cluster_mode = etcd");
        return LKV_EINVAL;
    }
    if (cfg->mode == LKV_CLUSTER_DNS && (cfg->dns == NULL || strchr(cfg->dns, ':') == NULL)) {
        snprintf(err, errlen, "option 'cluster_dns': name:port required with cluster_mode = dns");
        return LKV_EINVAL;
    }
    lkv_membership *m = lkv_xcalloc(1, sizeof(*m));
    m->cfg = *cfg;
    snprintf(m->self_addr, sizeof(m->self_addr), "%s", cfg->self_addr);
    snprintf(m->self_id, sizeof(m->self_id), "%s",
             cfg->self_id && cfg->self_id[0] ? cfg->self_id : cfg->self_addr);
    snprintf(m->version, sizeof(m->version), "%s", cfg->version ? cfg->version : "");
    snprintf(m->prefix, sizeof(m->prefix), "%s",
             cfg->prefix && cfg->prefix[0] ? cfg->prefix : "/lazykv/members/");
    snprintf(m->etcd, sizeof(m->etcd), "%s", cfg->etcd ? cfg->etcd : "");
    snprintf(m->members, sizeof(m->members), "%s", cfg->members ? cfg->members : "");
    snprintf(m->dns, sizeof(m->dns), "%s", cfg->dns ? cfg->dns : "");
    if (m->cfg.lease_ttl_s < 2) {
        m->cfg.lease_ttl_s = 2;
    }
    if (m->cfg.health_interval_ms == 0) {
        m->cfg.health_interval_ms = 500;
    }
    if (m->cfg.down_after_ms == 0) {
        m->cfg.down_after_ms = 3 * m->cfg.health_interval_ms;
    }
    if (m->cfg.dns_refresh_ms == 0) {
        m->cfg.dns_refresh_ms = 5000;
    }
    m->tab = lkv_xcalloc(LKV_MEMBERS_MAX, sizeof(entry));
    pthread_mutex_init(&m->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_cond_init(&m->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* Self first: always a member, always up. */
    lkv_member self;
    memset(&self, 0, sizeof(self));
    snprintf(self.id, sizeof(self.id), "%s", m->self_id);
    snprintf(self.addr, sizeof(self.addr), "%s", m->self_addr);
    snprintf(self.version, sizeof(self.version), "%s", m->version);
    self.hot_bytes = cfg->hot_bytes;
    pthread_mutex_lock(&m->mu);
    upsert_locked(m, &self, SRC_STATIC | SRC_ETCD | SRC_DNS);
    pthread_mutex_unlock(&m->mu);
    if (cfg->mode == LKV_CLUSTER_STATIC) {
        int rc = static_load(m, err, errlen);
        if (rc != 0) {
            free(m->tab);
            free(m);
            return rc;
        }
    }
    m->changed = 0;
    if (pthread_create(&m->th, NULL, membership_main, m) != 0 ||
        (cfg->mode == LKV_CLUSTER_ETCD && pthread_create(&m->etcd_th, NULL, etcd_main, m) != 0)) {
        free(m->tab);
        free(m);
        snprintf(err, errlen, "cluster: cannot start the membership thread");
        return LKV_ENOMEM;
    }
    LKV_LOGI("cluster: member %s at %s, mode %s%s%s", m->self_id, m->self_addr,
             cfg->mode == LKV_CLUSTER_ETCD     ? "etcd "
             : cfg->mode == LKV_CLUSTER_STATIC ? "static"
                                               : "dns ",
             cfg->mode == LKV_CLUSTER_ETCD ? m->etcd : "",
             cfg->mode == LKV_CLUSTER_DNS ? m->dns : "");
    *out = m;
    return 0;
}

void lkv_membership_stop(lkv_membership *m)
{
    if (m == NULL) {
        return;
    }
    pthread_mutex_lock(&m->mu);
    m->stop = 1;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->th, NULL);
    if (m->cfg.mode == LKV_CLUSTER_ETCD) {
        pthread_join(m->etcd_th, NULL);
    }
    pthread_mutex_lock(&m->mu);
    int64_t lease = m->session ? m->lease_id : 0;
    etcd_drop_locked(m);
    while (m->probes_in_flight > 0) {
        pthread_cond_wait(&m->cv, &m->mu);
    }
    pthread_mutex_unlock(&m->mu);
    if (lease != 0) {
        /* Leave at once rather than after the TTL: peers re-home our share now. */
        Etcdserverpb__LeaseRevokeRequest r = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
        r.id = lease;
        ProtobufCMessage *resp = NULL;
        char msg[128];
        if (lkv_peer_unary_sync(etcd_chan(m), "/etcdserverpb.Lease/LeaseRevoke", &r.base,
                                &etcdserverpb__lease_revoke_response__descriptor, NULL, 0, 500,
                                &resp, msg, sizeof(msg)) == 0) {
            protobuf_c_message_free_unpacked(resp, NULL);
            LKV_LOGI("cluster: left etcd (lease %" PRIx64 " revoked)", (uint64_t)lease);
        }
    }
    for (size_t i = 0; i < m->n_chans; i++) {
        lkv_peer_chan_destroy(m->chans[i].ch);
    }
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m->tab);
    free(m);
}
