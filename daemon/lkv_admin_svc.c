/*
 * lkv_admin_svc.c: lazykv.v1.Admin/Stats (see lkv_admin_svc.h).
 *
 * Stats writes the daemon's own "server" section, then iterates the statistics registry
 * (common/lkv_stats.h) section by section: whatever the store, the lease table and the RPC
 * engine registered (and anything registered later, in a section of its own after "calls")
 * appears without a line here. Each value is appended to the INFO text ("key:value") and to the
 * entries array at once, so both forms always agree. Two views are the admin's own: a tenant's
 * "lookups" are its own counters (stats without a tenant counterpart are left out), and the
 * operator's "tenants" section lists every tenant.
 */
#include "lkv_admin_svc.h"

#include <inttypes.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "lazykv/v1/admin.pb-c.h"
#include "lkv_auth.h"
#include "lkv_err.h"
#include "lkv_log.h"

typedef struct info_buf {
    char *text;                 /* INFO text, NUL-terminated. */
    size_t len, cap;            /* Bytes used / allocated in text. */
    Lazykv__V1__StatEntry *ent; /* Entries. */
    size_t n, ncap;             /* Entries used / allocated. */
    char *strings;              /* Arena for entry keys/texts. */
    size_t slen, scap;
    const char *section; /* Current section name (borrowed while its entries are added). */
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

/* Registry sections in INFO order, with their titles. Sections the registry holds that are not
 * listed follow "calls", in registration order, titled by their name. */
static const struct {
    const char *name, *title;
} known_sections[] = {{"hot", "Hot"},
                      {"regions", "Regions"},
                      {"cold", "Cold"},
                      {"lookups", "Lookups"},
                      {"movement", "Movement"},
                      {"puts", "Puts"},
                      {"persistence", "Persistence"},
                      {"leases", "Leases"}};
#define N_KNOWN ((int)(sizeof(known_sections) / sizeof(known_sections[0])))

static double ratio(uint64_t a, uint64_t b)
{
    return a + b ? (double)a / (double)(a + b) : 0.0;
}

/* A tenant's own value of "lookups" key: 1 and *v, or 0 if key is none of its counters (the
 * entry is then left out, so no store-wide lookup figure reaches a tenant). */
static int tenant_value(const lkv_tenant_lookups *t, const char *key, double *v)
{
    uint64_t hh = atomic_load(&t->hits_hot), hc = atomic_load(&t->hits_cold);
    uint64_t bh = atomic_load(&t->hit_blocks_hot), bc = atomic_load(&t->hit_blocks_cold);
    uint64_t m = atomic_load(&t->misses), mb = atomic_load(&t->miss_blocks);
    const struct {
        const char *key;
        double v;
    } tab[] = {{"hits_hot", (double)hh},
               {"hits_cold", (double)hc},
               {"misses", (double)m},
               {"hit_blocks_hot", (double)bh},
               {"hit_blocks_cold", (double)bc},
               {"miss_blocks", (double)mb},
               {"hit_rate_docs", ratio(hh + hc, m)},
               {"hit_rate_blocks", ratio(bh + bc, mb)}};
    for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
        if (strcmp(key, tab[i].key) == 0) {
            *v = tab[i].v;
            return 1;
        }
    }
    for (int c = 1; c < LKV_MISS__COUNT; c++) {
        if (strncmp(key, "misses_", 7) == 0 && strcmp(key + 7, lkv_miss_cause_name(c)) == 0) {
            *v = (double)atomic_load(&t->misses_by_cause[c]);
            return 1;
        }
    }
    return 0;
}

typedef struct sec_ctx {
    info_buf *b;
    const char *name, *title;         /* The section being written. */
    int started;                      /* Its header is written. */
    const lkv_tenant_lookups *tenant; /* "lookups" as this tenant sees it, or NULL. */
} sec_ctx;

/* lkv_stats_foreach visitor: one INFO line and entry per registered stat of the section. */
static int sec_visit(void *arg, const lkv_stat_desc *d, double v)
{
    sec_ctx *c = arg;
    if (c->tenant != NULL && !tenant_value(c->tenant, d->key, &v)) {
        return 0;
    }
    if (!c->started) {
        section(c->b, c->name, c->title);
        c->started = 1;
    }
    num(c->b, d->key, v);
    return 0;
}

/* Writes registry section name (if selected and not empty). */
static void reg_section(info_buf *b, lkv_stats *reg, const char *name, const char *title,
                        const lkv_tenant_lookups *tenant)
{
    if (!selected(b, name)) {
        return;
    }
    sec_ctx c = {.b = b, .name = name, .title = title, .tenant = tenant};
    lkv_stats_foreach(reg, name, sec_visit, &c);
}

typedef struct other_secs {
    char names[32][64]; /* Sections not in known_sections (nor calls), in registration order. */
    int n;
} other_secs;

static int other_visit(void *arg, const lkv_stat_desc *d, double v)
{
    other_secs *o = arg;
    (void)v;
    if (d->section == NULL || strcmp(d->section, "calls") == 0 || o->n == 32) {
        return 0;
    }
    for (int i = 0; i < N_KNOWN; i++) {
        if (strcmp(d->section, known_sections[i].name) == 0) {
            return 0;
        }
    }
    for (int i = 0; i < o->n; i++) {
        if (strcmp(o->names[i], d->section) == 0) {
            return 0;
        }
    }
    snprintf(o->names[o->n++], sizeof(o->names[0]), "%s", d->section);
    return 0;
}

static int stats(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_admin_svc *a = arg;
    info_buf b;
    memset(&b, 0, sizeof(b));
    b.req = (const Lazykv__V1__StatsRequest *)m;
    text_add(&b, "");
    lkv_stats *reg = a->stats != NULL ? a->stats : lkv_store_stats_registry(a->store);
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

    /* Lookups: the store's totals, or the caller's own counters when tenants are isolated. */
    int me = 0;
    const void *who = lkv_rpc_principal(rpc);
    if (a->index_of != NULL && who != NULL) {
        me = a->index_of(a->index_ctx, who);
    }
    const lkv_tenant_lookups *mine = NULL;
    if (a->isolate && a->tenant_lookups != NULL && me > 0 && me < a->n_tenants) {
        mine = &a->tenant_lookups[me];
    }
    for (int i = 0; i < N_KNOWN; i++) {
        const char *name = known_sections[i].name;
        reg_section(&b, reg, name, known_sections[i].title,
                    strcmp(name, "lookups") == 0 ? mine : NULL);
    }

    if (a->isolate && me == 0 && a->tenant_names != NULL && a->tenant_lookups != NULL) {
        section(&b, "tenants", "Tenants");
        int named = a->n_named != NULL ? a->n_named(a->index_ctx) : a->n_tenants;
        for (int i = 0; i < named && i < a->n_tenants; i++) {
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

    section(&b, "calls", "Calls"); /* Always titled, as before the registry. */
    if (b.on) {
        sec_ctx c = {.b = &b, .name = "calls", .title = "Calls", .started = 1};
        lkv_stats_foreach(reg, "calls", sec_visit, &c);
    }
    other_secs *o = lkv_xcalloc(1, sizeof(*o));
    lkv_stats_foreach(reg, NULL, other_visit, o);
    for (int i = 0; i < o->n; i++) {
        char title[64];
        snprintf(title, sizeof(title), "%s", o->names[i]);
        if (title[0] >= 'a' && title[0] <= 'z') {
            title[0] = (char)(title[0] - 'a' + 'A');
        }
        reg_section(&b, reg, o->names[i], title, NULL);
    }
    free(o);

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
    const lkv_profile *lp = NULL;
    if (req->profile[0] != '\0' && lkv_store_profile_get(a->store, req->profile, &lp) != 0) {
        return lkv_rpc_errorf(rpc, LKV_EPROFILE, "List: %s", lkv_store_why());
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
        return lkv_rpc_errorf(rpc, rc, "document %s is pinned, held or being read; retry later",
                              hex);
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

/* ---- Residency controls: Hold, EvictClass ----------------------------------------------- */

/* The tenant slot of name (the store's class index: lkv_tenancy_index), or -1 if no tenant has
 * that name. Only the published names are read (n_named: a reload may be adding some). A
 * tenant a reload removed keeps its slot, so its documents can still be held or evicted. */
static int tenant_named(const lkv_admin_svc *a, const char *name)
{
    int n = a->tenant_names != NULL ? a->n_tenants : 0;
    if (n > 0 && a->n_named != NULL && a->n_named(a->index_ctx) < n) {
        n = a->n_named(a->index_ctx);
    }
    for (int i = 0; i < n; i++) {
        if (a->tenant_names[i] != NULL && strcmp(a->tenant_names[i], name) == 0) {
            return i;
        }
    }
    return n == 0 && strcmp(name, LKV_AUTH_DEFAULT_TENANT) == 0 ? 0 : -1;
}

/* Resolves a request's (tenant, profile) class into the store's form; fails the call if bad.
 * *tenant: -1 for any; *profile: NULL for any. */
static int class_arg(const lkv_admin_svc *a, lkv_rpc *rpc, const char *what, const char *tname,
                     const char *pname, int64_t *tenant, const char **profile)
{
    *tenant = -1;
    *profile = NULL;
    if ((tname == NULL || tname[0] == '\0') && (pname == NULL || pname[0] == '\0')) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "%s: name a key, a tenant or a profile", what);
    }
    if (tname != NULL && tname[0] != '\0') {
        int i = tenant_named(a, tname);
        if (i < 0) {
            return lkv_rpc_errorf(rpc, LKV_EINVAL,
                                  "%s: no tenant '%.64s' (\"" LKV_AUTH_DEFAULT_TENANT
                                  "\" or a [tenant NAME] of the config)",
                                  what, tname);
        }
        *tenant = i;
    }
    if (pname != NULL && pname[0] != '\0') {
        const lkv_profile *p;
        if (lkv_store_profile_get(a->store, pname, &p) != 0) {
            return lkv_rpc_errorf(rpc, LKV_EPROFILE, "%s: %s", what, lkv_store_why());
        }
        *profile = pname;
    }
    return 0;
}

/* Hold of one document by its store key. */
static int hold_key(lkv_admin_svc *a, lkv_rpc *rpc, const Lazykv__V1__HoldRequest *req)
{
    if (req->key.len != LKV_DOCKEY_BYTES) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "Hold: key is %zu bytes, expected %d", req->key.len,
                              LKV_DOCKEY_BYTES);
    }
    lkv_dockey key;
    memcpy(key.b, req->key.data, LKV_DOCKEY_BYTES);
    char hex[LKV_DOCKEY_HEX_LEN + 1];
    lkv_dockey_to_hex(&key, hex);
    int rc = lkv_store_hold(a->store, &key, !req->off);
    if (rc == LKV_ENOTFOUND) {
        return lkv_rpc_errorf(rpc, rc, "Hold: document %s is not cached", hex);
    }
    if (rc == LKV_ENOSPC) {
        return lkv_rpc_errorf(rpc, rc,
                              "Hold: document %s cannot be made hot (the hot tier is pinned "
                              "or held full)",
                              hex);
    }
    if (rc != 0) {
        return lkv_rpc_errorf(rpc, rc, "Hold of %s failed: %s", hex, lkv_strerror(rc));
    }
    LKV_LOGI("%s document %s (admin)", req->off ? "released" : "holding", hex);
    Lazykv__V1__HoldResponse resp = LAZYKV__V1__HOLD_RESPONSE__INIT;
    resp.docs = 1;
    return lkv_rpc_reply(rpc, &resp.base);
}

static int hold(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_admin_svc *a = arg;
    const Lazykv__V1__HoldRequest *req = (const Lazykv__V1__HoldRequest *)m;
    int has_class = (req->tenant != NULL && req->tenant[0] != '\0') ||
                    (req->profile != NULL && req->profile[0] != '\0');
    int rc = lkv_rpc_check_deadline(rpc);
    if (rc != 0) {
        return rc;
    }
    if (req->key.len > 0 && has_class) {
        return lkv_rpc_errorf(rpc, LKV_EINVAL, "Hold: give a key or a class, not both");
    }
    if (req->key.len > 0) {
        return hold_key(a, rpc, req);
    }
    int64_t tenant;
    const char *profile;
    rc = class_arg(a, rpc, "Hold", req->tenant, req->profile, &tenant, &profile);
    if (rc != 0) {
        return rc;
    }
    uint64_t n = 0;
    rc = lkv_store_hold_class(a->store, tenant, profile, !req->off, &n);
    if (rc == LKV_ENOTFOUND) {
        return lkv_rpc_errorf(rpc, rc, "Hold: no hold of that class to release");
    }
    if (rc == LKV_ENOSPC) {
        return lkv_rpc_errorf(rpc, rc, "Hold: 16 class holds already; release one first");
    }
    if (rc != 0) {
        return lkv_rpc_errorf(rpc, rc, "Hold failed: %s", lkv_strerror(rc));
    }
    LKV_LOGI("%s tenant '%s' profile '%s' (%llu documents; admin)",
             req->off ? "released" : "holding", tenant >= 0 ? req->tenant : "*",
             profile != NULL ? profile : "*", (unsigned long long)n);
    Lazykv__V1__HoldResponse resp = LAZYKV__V1__HOLD_RESPONSE__INIT;
    resp.docs = n;
    return lkv_rpc_reply(rpc, &resp.base);
}

static int evict_class(void *arg, lkv_rpc *rpc, const ProtobufCMessage *m)
{
    lkv_admin_svc *a = arg;
    const Lazykv__V1__EvictClassRequest *req = (const Lazykv__V1__EvictClassRequest *)m;
    int rc = lkv_rpc_check_deadline(rpc);
    if (rc != 0) {
        return rc;
    }
    int64_t tenant;
    const char *profile;
    rc = class_arg(a, rpc, "EvictClass", req->tenant, req->profile, &tenant, &profile);
    if (rc != 0) {
        return rc;
    }
    uint64_t nh = 0, nc = 0;
    rc = lkv_store_evict_class(a->store, tenant, profile, req->purge, &nh, &nc);
    if (rc != 0) {
        return lkv_rpc_errorf(rpc, rc, "EvictClass failed: %s", lkv_strerror(rc));
    }
    LKV_LOGI("%s tenant '%s' profile '%s': %llu hot, %llu cold (admin)",
             req->purge ? "purged" : "evicted", tenant >= 0 ? req->tenant : "*",
             profile != NULL ? profile : "*", (unsigned long long)nh, (unsigned long long)nc);
    Lazykv__V1__EvictClassResponse resp = LAZYKV__V1__EVICT_CLASS_RESPONSE__INIT;
    resp.evicted_hot = nh;
    resp.dropped_cold = nc;
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
        {.path = "/lazykv.v1.Admin/Hold",
         .kind = LKV_RPC_UNARY,
         .req_desc = &lazykv__v1__hold_request__descriptor,
         .svc = a,
         .unary = hold,
         .max_request_bytes = ADMIN_REQUEST_BYTES},
        {.path = "/lazykv.v1.Admin/EvictClass",
         .kind = LKV_RPC_UNARY,
         .req_desc = &lazykv__v1__evict_class_request__descriptor,
         .svc = a,
         .unary = evict_class,
         .max_request_bytes = ADMIN_REQUEST_BYTES},
    };
    memcpy(out, ms, sizeof(ms));
    return LKV_ADMIN_SVC_METHODS;
}
