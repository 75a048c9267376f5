/*
 * lkv_admin_svc.c: lazykv.v1.Admin/Stats (see lkv_admin_svc.h).
 *
 * One pass over a fixed list of sections; each value is appended to the INFO text ("key:value")
 * and to the entries array at once, so both forms always agree. Per-method call counters come
 * from the engine ("calls" section, keys "<Method>.calls", ".errors", ".usec_per_call").
 */
#include "lkv_admin_svc.h"

#include <inttypes.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "lazykv/v1/admin.pb-c.h"
#include "lkv_err.h"
#include "lkv_log.h"

typedef struct info_buf {
    char *text;                 /* INFO text, NUL-terminated. */
    size_t len, cap;            /* Bytes used / allocated in text. */
    Lazykv__V1__StatEntry *ent; /* Entries. */
    size_t n, ncap;             /* Entries used / allocated. */
    char *strings;              /* Arena for entry keys/texts. */
    size_t slen, scap;
    const char *section; /* Current section name (static). */
    int on;              /* Current section selected. */
    const Lazykv__V1__StatsRequest *req;
} info_buf;

static void text_add(info_buf *b, const char *s)
{
    size_t n = strlen(s);
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->text = lkv_xrealloc(b->text, b->cap);
    }
    memcpy(b->text + b->len, s, n + 1);
    b->len += n;
}

/* Strings are stored as offsets first (the arena may move) and fixed up at the end. */
static size_t str_add(info_buf *b, const char *s)
{
    size_t n = strlen(s) + 1;
    if (b->slen + n > b->scap) {
        b->scap = (b->slen + n) * 2;
        b->strings = lkv_xrealloc(b->strings, b->scap);
    }
    memcpy(b->strings + b->slen, s, n);
    b->slen += n;
    return b->slen - n;
}

static int selected(const info_buf *b, const char *section)
{
    if (b->req->n_sections == 0) {
        return 1;
    }
    for (size_t i = 0; i < b->req->n_sections; i++) {
        if (strcasecmp(b->req->sections[i], section) == 0 ||
            strcasecmp(b->req->sections[i], "all") == 0) {
            return 1;
        }
    }
    return 0;
}

static void section(info_buf *b, const char *name, const char *title)
{
    b->section = name;
    b->on = selected(b, name);
    if (b->on) {
        if (b->len > 0) {
            text_add(b, "\n");
        }
        text_add(b, "# ");
        text_add(b, title);
        text_add(b, "\n");
    }
}

static Lazykv__V1__StatEntry *entry(info_buf *b, const char *key)
{
    if (b->n == b->ncap) {
        b->ncap = b->ncap ? b->ncap * 2 : 64;
        b->ent = lkv_xrealloc(b->ent, b->ncap * sizeof(*b->ent));
    }
    Lazykv__V1__StatEntry init = LAZYKV__V1__STAT_ENTRY__INIT;
    Lazykv__V1__StatEntry *e = &b->ent[b->n++];
    *e = init;
    e->section = (char *)(uintptr_t)str_add(b, b->section);
    e->key = (char *)(uintptr_t)str_add(b, key);
    e->text = (char *)(uintptr_t)str_add(b, "");
    return e;
}

static void num(info_buf *b, const char *key, double v)
{
    if (!b->on) {
        return;
    }
    char line[256];
    if (v == (double)(uint64_t)v && v < 9.007199254740992e15) {
        snprintf(line, sizeof(line), "%s:%" PRIu64 "\n", key, (uint64_t)v);
    } else {
        snprintf(line, sizeof(line), "%s:%.4f\n", key, v);
    }
    text_add(b, line);
    entry(b, key)->value = v;
}

static void txt(info_buf *b, const char *key, const char *v)
{
    if (!b->on) {
        return;
    }
    char line[512];
    snprintf(line, sizeof(line), "%s:%s\n", key, v);
    text_add(b, line);
    Lazykv__V1__StatEntry *e = entry(b, key);
    e->text = (char *)(uintptr_t)str_add(b, v);
}

static int stats(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_admin_svc *a = arg;
    info_buf b;
    memset(&b, 0, sizeof(b));
    b.req = (const Lazykv__V1__StatsRequest *)m;
    text_add(&b, "");
    lkv_store_stats s;
    lkv_store_stats_get(a->store, &s);
    lkv_server *srv = atomic_load(&a->server);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);

    section(&b, "server", "Server");
    txt(&b, "version", "0.1.0");
    num(&b, "pid", (double)getpid());
    num(&b, "uptime_s", (double)(now.tv_sec - a->started.tv_sec));
    txt(&b, "address", srv != NULL ? lkv_server_address(srv) : "");
    num(&b, "threads", a->threads);
    num(&b, "calls_in_flight", srv != NULL ? (double)lkv_server_calls_in_flight(srv) : 0);
    txt(&b, "durability", a->durability);

    section(&b, "hot", "Hot");
    num(&b, "docs", (double)s.hot_docs);
    num(&b, "blocks", (double)s.hot_blocks);
    num(&b, "bytes_used", (double)s.hot_bytes);
    num(&b, "bytes_pinned", (double)s.hot_bytes_pinned);
    num(&b, "bytes_budget", (double)s.hot_budget);
    num(&b, "page_bytes", (double)s.hot_page_bytes);
    num(&b, "pages_total", (double)s.hot_pages_total);
    num(&b, "pages_free", (double)s.hot_pages_free);

    section(&b, "cold", "Cold");
    num(&b, "docs", (double)s.cold_docs);
    num(&b, "blocks", (double)s.cold_blocks);
    num(&b, "bytes_used", (double)s.cold_bytes);
    num(&b, "bytes_budget", s.cold_budget == UINT64_MAX ? 0.0 : (double)s.cold_budget);

    /* Lookups: the store's totals, or the caller's own counters when tenants are isolated. */
    int me = 0;
    const void *who = lkv_rpc_principal(rpc);
    if (a->index_of != NULL && who != NULL) {
        me = a->index_of(a->index_ctx, who);
    }
    if (a->isolate && a->tenant_lookups != NULL && me > 0 && me < a->n_tenants) {
        const lkv_tenant_lookups *t = &a->tenant_lookups[me];
        s.hits_hot = atomic_load(&t->hits_hot);
        s.hits_cold = atomic_load(&t->hits_cold);
        s.hit_blocks_hot = atomic_load(&t->hit_blocks_hot);
        s.hit_blocks_cold = atomic_load(&t->hit_blocks_cold);
        s.misses = atomic_load(&t->misses);
        s.miss_blocks = atomic_load(&t->miss_blocks);
        for (int c = 0; c < LKV_MISS__COUNT; c++) {
            s.misses_by_cause[c] = atomic_load(&t->misses_by_cause[c]);
        }
    }
    section(&b, "lookups", "Lookups");
    uint64_t hits = s.hits_hot + s.hits_cold;
    num(&b, "hits_hot", (double)s.hits_hot);
    num(&b, "hits_cold", (double)s.hits_cold);
    num(&b, "misses", (double)s.misses);
    num(&b, "hit_blocks_hot", (double)s.hit_blocks_hot);
    num(&b, "hit_blocks_cold", (double)s.hit_blocks_cold);
    num(&b, "miss_blocks", (double)s.miss_blocks);
    for (int c = 1; c < LKV_MISS__COUNT; c++) {
        char key[64];
        snprintf(key, sizeof(key), "misses_%s", lkv_miss_cause_name(c));
        num(&b, key, (double)s.misses_by_cause[c]);
    }
    num(&b, "hit_rate_docs", hits + s.misses ? (double)hits / (double)(hits + s.misses) : 0.0);
    uint64_t hb = s.hit_blocks_hot + s.hit_blocks_cold;
    num(&b, "hit_rate_blocks",
        hb + s.miss_blocks ? (double)hb / (double)(hb + s.miss_blocks) : 0.0);

    section(&b, "movement", "Movement");
    num(&b, "evictions_hot", (double)s.evictions_hot);
    num(&b, "evictions_cold", (double)s.evictions_cold);
    num(&b, "demotions", (double)s.demotions);
    num(&b, "drops", (double)s.drops);
    num(&b, "promotions", (double)s.promotions);

    section(&b, "puts", "Puts");
    num(&b, "puts", (double)s.puts);
    num(&b, "puts_existing", (double)s.puts_existing);
    num(&b, "puts_aborted", (double)s.puts_aborted);
    num(&b, "puts_inflight", (double)s.puts_inflight);
    num(&b, "deletes", (double)s.deletes);
    num(&b, "reads_inflight", (double)s.reads_inflight);

    section(&b, "persistence", "Persistence");
    num(&b, "wb_pending", (double)s.wb_pending);
    num(&b, "wb_persisted", (double)s.wb_persisted);
    num(&b, "wb_failed", (double)s.wb_failed);
    num(&b, "corrupt_blocks", (double)s.corrupt_blocks);

    if (a->leases != NULL) {
        lkv_lease_stats ls;
        lkv_lease_stats_get(a->leases, &ls);
        section(&b, "leases", "Leases");
        num(&b, "live", (double)ls.live);
        num(&b, "docs_pinned", (double)ls.docs);
        num(&b, "bytes_pinned", (double)ls.pinned_bytes);
        num(&b, "attaches", (double)ls.attaches);
        num(&b, "renewals", (double)ls.renewals);
        num(&b, "releases", (double)ls.releases);
        num(&b, "expired", (double)ls.expired);
        num(&b, "refused", (double)ls.refused);
    }

    if (a->isolate && me == 0 && a->tenant_names != NULL && a->tenant_lookups != NULL) {
        section(&b, "tenants", "Tenants");
        for (int i = 0; i < a->n_tenants; i++) {
            if (a->tenant_names[i] == NULL) {
                continue;
            }
            const lkv_tenant_lookups *t = &a->tenant_lookups[i];
            char key[128];
            snprintf(key, sizeof(key), "%s.hits", a->tenant_names[i]);
            num(&b, key, (double)(atomic_load(&t->hits_hot) + atomic_load(&t->hits_cold)));
            snprintf(key, sizeof(key), "%s.misses", a->tenant_names[i]);
            num(&b, key, (double)atomic_load(&t->misses));
        }
    }

    section(&b, "calls", "Calls");
    if (srv != NULL) {
        const char *path;
        uint64_t calls, errors, usec;
        for (int i = 0; lkv_server_method_stats(srv, i, &path, &calls, &errors, &usec) == 0; i++) {
            const char *slash = strrchr(path, '/');
            const char *svc_end = slash;
            const char *dot = path;
            for (const char *q = path; q < svc_end; q++) {
                if (*q == '.') {
                    dot = q + 1;
                }
            }
            char name[128], key[192];
            snprintf(name, sizeof(name), "%.*s.%s", (int)(svc_end - dot), dot, slash + 1);
            snprintf(key, sizeof(key), "%s.calls", name);
            num(&b, key, (double)calls);
            snprintf(key, sizeof(key), "%s.errors", name);
            num(&b, key, (double)errors);
            snprintf(key, sizeof(key), "%s.usec_per_call", name);
            num(&b, key, calls ? (double)usec / (double)calls : 0.0);
        }
    }

    /* Fix up string offsets now that the arena no longer moves. */
    Lazykv__V1__StatEntry **ep = lkv_xmalloc((b.n ? b.n : 1) * sizeof(*ep));
    for (size_t i = 0; i < b.n; i++) {
        b.ent[i].section = b.strings + (uintptr_t)b.ent[i].section;
        b.ent[i].key = b.strings + (uintptr_t)b.ent[i].key;
        b.ent[i].text = b.strings + (uintptr_t)b.ent[i].text;
        ep[i] = &b.ent[i];
    }
    Lazykv__V1__StatsResponse resp = LAZYKV__V1__STATS_RESPONSE__INIT;
    resp.info = b.text;
    resp.n_entries = b.n;
    resp.entries = ep;
    int rc = lkv_rpc_reply(rpc, &resp.base);
    free(ep);
    free(b.ent);
    free(b.strings);
    free(b.text);
    return rc;
}

/* ---- List ---------------------------------------------------------------------------- */

#define LIST_DEFAULT 1000u
#define LIST_MAX     10000u

typedef struct list_item {
    lkv_dockey key;    /* Document key. */
    lkv_doc_info info; /* Its info (profile pointer borrowed from the store). */
} list_item;

/* Selection of the `cap` smallest keys above `after`, as a max-heap on the key. */
typedef struct list_ctx {
    list_item *heap;      /* cap entries. */
    uint32_t n, cap;      /* Used / capacity. */
    const uint8_t *after; /* NULL or 32 bytes. */
    const char *profile;  /* "" = any. */
    int tier;             /* enum lkv_tier, or -1 = any. */
    uint64_t matched;     /* Documents above after that match the filters. */
} list_ctx;

static int key_cmp(const lkv_dockey *a, const lkv_dockey *b)
{
    return memcmp(a->b, b->b, LKV_DOCKEY_BYTES);
}

static void heap_sift_down(list_item *h, uint32_t n, uint32_t i)
{
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && key_cmp(&h[l].key, &h[m].key) > 0) {
            m = l;
        }
        if (r < n && key_cmp(&h[r].key, &h[m].key) > 0) {
            m = r;
        }
        if (m == i) {
            return;
        }
        list_item t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static void heap_sift_up(list_item *h, uint32_t i)
{
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (key_cmp(&h[p].key, &h[i].key) >= 0) {
            return;
        }
        list_item t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

/* lkv_store_foreach callback (store lock held: no store calls). */
static int list_visit(void *arg, const lkv_dockey *key, const lkv_doc_info *info)
{
    list_ctx *c = arg;
    if (c->after != NULL && memcmp(key->b, c->after, LKV_DOCKEY_BYTES) <= 0) {
        return 0;
    }
    if (c->profile[0] != '\0' &&
        (info->profile == NULL || strcmp(info->profile->name, c->profile) != 0)) {
        return 0;
    }
    if (c->tier >= 0 && info->tier != c->tier) {
        return 0;
    }
    c->matched++;
    if (c->n < c->cap) {
        c->heap[c->n].key = *key;
        c->heap[c->n].info = *info;
        heap_sift_up(c->heap, c->n);
        c->n++;
    } else if (key_cmp(key, &c->heap[0].key) < 0) {
        c->heap[0].key = *key;
        c->heap[0].info = *info;
        heap_sift_down(c->heap, c->n, 0);
    }
    return 0;
}

static int item_cmp(const void *a, const void *b)
{
    return key_cmp(&((const list_item *)a)->key, &((const list_item *)b)->key);
}

static Lazykv__V1__Tier tier_pb(int tier)
{
    return tier == LKV_TIER_HOT    ? LAZYKV__V1__TIER__TIER_HOT
           : tier == LKV_TIER_COLD ? LAZYKV__V1__TIER__TIER_COLD
                                   : LAZYKV__V1__TIER__TIER_ABSENT;
}

static int list(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_admin_svc *a = arg;
    const Lazykv__V1__ListRequest *req = (const Lazykv__V1__ListRequest *)m;
    if (req->limit > LIST_MAX) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "List: limit %" PRIu32 " is above %u", req->limit,
                              LIST_MAX);
    }
    if (req->after_key.len != 0 && req->after_key.len != LKV_DOCKEY_BYTES) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "List: after_key is %zu bytes, expected %d",
                              req->after_key.len, LKV_DOCKEY_BYTES);
    }
    if (req->profile[0] != '\0' && lkv_store_profile_find(a->store, req->profile) == NULL) {
        return lkv_rpc_errorf(rpc, LKV_EPROFILE, "List: unknown profile '%.64s'", req->profile);
    }
    list_ctx c;
    memset(&c, 0, sizeof(c));
    c.cap = req->limit ? req->limit : LIST_DEFAULT;
    c.heap = lkv_xmalloc(c.cap * sizeof(*c.heap));
    c.after = req->after_key.len ? req->after_key.data : NULL;
    c.profile = req->profile;
    c.tier = req->tier == LAZYKV__V1__TIER__TIER_HOT    ? LKV_TIER_HOT
             : req->tier == LAZYKV__V1__TIER__TIER_COLD ? LKV_TIER_COLD
                                                        : -1;
    int rc = lkv_rpc_check_deadline(rpc);
    if (rc == 0) {
        lkv_store_foreach(a->store, list_visit, &c);
        qsort(c.heap, c.n, sizeof(*c.heap), item_cmp);
        Lazykv__V1__DocStatus *ds = lkv_xcalloc(c.n ? c.n : 1, sizeof(*ds));
        Lazykv__V1__DocStatus **dsp = lkv_xmalloc((c.n ? c.n : 1) * sizeof(*dsp));
        for (uint32_t i = 0; i < c.n; i++) {
            const lkv_doc_info *in = &c.heap[i].info;
            Lazykv__V1__DocStatus init = LAZYKV__V1__DOC_STATUS__INIT;
            ds[i] = init;
            ds[i].present = 1;
            ds[i].tier = tier_pb(in->tier);
            ds[i].n_tokens = in->n_tokens;
            ds[i].n_blocks = in->n_blocks;
            ds[i].key.data = c.heap[i].key.b;
            ds[i].key.len = LKV_DOCKEY_BYTES;
            ds[i].profile =
                in->profile != NULL ? (char *)in->profile->name : (char *)protobuf_c_empty_string;
            ds[i].pins = in->pins;
            ds[i].bytes = (uint64_t)in->n_blocks * in->block_bytes;
            dsp[i] = &ds[i];
        }
        Lazykv__V1__ListResponse resp = LAZYKV__V1__LIST_RESPONSE__INIT;
        resp.n_docs = c.n;
        resp.docs = dsp;
        if (c.matched > c.n && c.n > 0) {
            resp.next_after_key.data = c.heap[c.n - 1].key.b;
            resp.next_after_key.len = LKV_DOCKEY_BYTES;
        }
        rc = lkv_rpc_reply(rpc, &resp.base);
        free(ds);
        free(dsp);
    }
    free(c.heap);
    return rc;
}

/* ---- Evict ---------------------------------------------------------------------------- */

static int evict(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_admin_svc *a = arg;
    const Lazykv__V1__EvictRequest *req = (const Lazykv__V1__EvictRequest *)m;
    if (req->key.len != LKV_DOCKEY_BYTES) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "Evict: key is %zu bytes, expected %d", req->key.len,
                              LKV_DOCKEY_BYTES);
    }
    lkv_dockey key;
    memcpy(key.b, req->key.data, LKV_DOCKEY_BYTES);
    char hex[LKV_DOCKEY_HEX_LEN + 1];
    lkv_dockey_to_hex(&key, hex);
    int rc = lkv_rpc_check_deadline(rpc);
    if (rc != 0) {
        return rc;
    }
    rc = lkv_store_demote(a->store, &key);
    if (rc == LKV_ENOTFOUND) {
        return lkv_rpc_errorf(rpc, rc, "document %s is not in the hot tier", hex);
    }
    if (rc == LKV_EBUSY) {
        return lkv_rpc_errorf(rpc, rc, "document %s is pinned or being read; retry later", hex);
    }
    if (rc != 0) {
        return lkv_rpc_errorf(rpc, rc, "Evict of %s failed: %s", hex, lkv_strerror(rc));
    }
    LKV_LOGI("evicted %s from the hot tier (admin)", hex);
    Lazykv__V1__EvictResponse resp = LAZYKV__V1__EVICT_RESPONSE__INIT;
    resp.key.data = key.b;
    resp.key.len = LKV_DOCKEY_BYTES;
    return lkv_rpc_reply(rpc, &resp.base);
}

void lkv_admin_svc_init(lkv_admin_svc *a, lkv_store *store, const char *durability, int threads)
{
    memset(a, 0, sizeof(*a));
    a->store = store;
    atomic_store(&a->server, NULL);
    a->durability = durability;
    a->threads = threads;
    clock_gettime(CLOCK_MONOTONIC, &a->started);
}

void lkv_admin_svc_set_server(lkv_admin_svc *a, lkv_server *srv)
{
    atomic_store(&a->server, srv);
}

/* Admin requests are a few strings and a key: 64 KiB is ample (lkv_method.max_request_bytes). */
#define ADMIN_REQUEST_BYTES (64u << 10)

int lkv_admin_svc_methods(lkv_admin_svc *a, lkv_method *out)
{
    lkv_method ms[LKV_ADMIN_SVC_METHODS] = {
        {.path = "/lazykv.v1.Admin/Stats",
         .kind = LKV_RPC_UNARY,
         .req_desc = &lazykv__v1__stats_request__descriptor,
         .svc = a,
         .unary = stats,
         .max_request_bytes = ADMIN_REQUEST_BYTES},
        {.path = "/lazykv.v1.Admin/List",
         .kind = LKV_RPC_UNARY,
         .req_desc = &lazykv__v1__list_request__descriptor,
         .svc = a,
         .unary = list,
         .max_request_bytes = ADMIN_REQUEST_BYTES},
        {.path = "/lazykv.v1.Admin/Evict",
         .kind = LKV_RPC_UNARY,
         .req_desc = &lazykv__v1__evict_request__descriptor,
         .svc = a,
         .unary = evict,
         .max_request_bytes = ADMIN_REQUEST_BYTES},
    };
    memcpy(out, ms, sizeof(ms));
    return LKV_ADMIN_SVC_METHODS;
}
