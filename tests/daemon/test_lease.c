/*
 * test_lease.c: the lease table (daemon/lkv_lease.c) over a real store (host arena of 4 KiB
 * pages, "tiny" profile: 1 KiB blocks of 4 tokens): pins and pages, duplicates pinned once,
 * renewal, owners (another owner's lease is NOT_FOUND), all-or-nothing on an unknown document
 * (new lease and renewal), every limit, a document that cannot be made hot, expiry (treated as
 * gone at once, unpinned by the reaper thread), and destroy unpinning what live leases hold.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "lkv_lease.h"
#include "lkv_test.h"
#include "store_util.h"

#define WB LKV_DURABILITY_WRITE_BACK

static uint32_t pins_of(lkv_store *s, const lkv_dockey *k)
{
    lkv_doc_info in;
    ASSERT_OK(lkv_store_lookup(s, k, 1, &in));
    return in.present ? in.pins : 0;
}

static void free_docs(lkv_lease_doc *d, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        free(d[i].pages);
        d[i].pages = NULL;
    }
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static lkv_lease_stats lstats(lkv_lease_table *t)
{
    lkv_lease_stats st;
    lkv_lease_stats_get(t, &st);
    return st;
}

/* The lease counters as the store's registry shows them ("leases" section), by key. */
#define N_LS 16

typedef struct lease_seen {
    char keys[N_LS][32];
    double vals[N_LS];
    int n;
} lease_seen;

static int lease_visit(void *ctx, const lkv_stat_desc *d, double v)
{
    lease_seen *ls = ctx;
    ASSERT_TRUE(ls->n < N_LS);
    snprintf(ls->keys[ls->n], sizeof(ls->keys[0]), "%s", d->key);
    ls->vals[ls->n++] = v;
    return 0;
}

static void check_registry(lkv_store *s, lkv_lease_table *t)
{
    static const char *const keys[N_LS] = {"live",     "docs_pinned",    "bytes_pinned", "attaches",
                                           "renewals", "releases",       "expired",      "refused",
                                           "reserved", "reserved_bytes", "reserves",     "commits",
                                           "aborts",   "resv_expired",   "resv_busy",    "waiting"};
    lease_seen ls = {0};
    ASSERT_OK(lkv_stats_foreach(lkv_store_stats_registry(s), "leases", lease_visit, &ls));
    lkv_lease_stats st = lstats(t);
    const uint64_t want[N_LS] = {st.live,     st.docs,           st.pinned_bytes, st.attaches,
                                 st.renewals, st.releases,       st.expired,      st.refused,
                                 st.reserved, st.reserved_bytes, st.reserves,     st.commits,
                                 st.aborts,   st.resv_expired,   st.resv_busy,    st.waiting};
    ASSERT_EQ(ls.n, N_LS);
    for (int i = 0; i < N_LS; i++) {
        ASSERT_TRUE(strcmp(ls.keys[i], keys[i]) == 0);
        ASSERT_EQ(ls.vals[i], want[i]);
    }
}

static void test_attach_renew_release(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 32, 0, WB);
    lkv_lease_limits lim = {.max_leases = 4, .max_docs = 3, .max_ttl_ms = 60000};
    lkv_lease_table *t;
    ASSERT_OK(lkv_lease_table_create(s, &lim, &t));
    lkv_dockey k[5], unknown;
    for (int i = 0; i < 5; i++) {
        ASSERT_OK(su_put(s, 10 + (uint64_t)i, 10, &k[i])); /* 3 blocks each */
    }
    su_key(s, 99, 10, &unknown);

    uint8_t id[LKV_LEASE_ID_BYTES], id2[LKV_LEASE_ID_BYTES];
    uint64_t exp = 0;
    uint32_t nd = 0;
    int bad = 7;
    lkv_lease_doc d[4];
    lkv_dockey req[4] = {k[0], k[1], k[0]};
    ASSERT_OK(lkv_lease_attach(t, 0, NULL, 5000, req, 3, id, &exp, &nd, d, &bad));
    ASSERT_EQ(nd, 2);
    ASSERT_EQ(bad, -1);
    ASSERT_EQ(pins_of(s, &k[0]), 1);
    ASSERT_EQ(pins_of(s, &k[1]), 1);
    ASSERT_EQ(d[0].info.n_blocks, 3);
    ASSERT_TRUE(memcmp(d[0].pages, d[2].pages, 3 * sizeof(uint32_t)) == 0);
    /* The pages are the document's: the arena bytes there are what get returns. */
    lkv_store_read *rd;
    ASSERT_OK(lkv_store_get_begin(s, &k[1], &rd, NULL));
    const uint32_t *gp = lkv_store_get_pages(rd);
    ASSERT_TRUE(gp != NULL && memcmp(gp, d[1].pages, 3 * sizeof(uint32_t)) == 0);
    lkv_store_get_end(rd);
    free_docs(d, 3);
    lkv_lease_stats ls = lstats(t);
    ASSERT_EQ(ls.live, 1);
    ASSERT_EQ(ls.docs, 2);
    ASSERT_EQ(ls.pinned_bytes, 6 * TINY_BB); /* Pages of the "tiny" region: its block size. */
    ASSERT_EQ(ls.attaches, 1);

    /* Pinned documents cannot be demoted or deleted. */
    ASSERT_ERR(lkv_store_demote(s, &k[0]), LKV_EBUSY);
    ASSERT_ERR(lkv_store_delete(s, &k[0]), LKV_EBUSY);

    /* Renewal adds k[2]; k[1] keeps one pin. */
    lkv_dockey r1[2] = {k[1], k[2]};
    ASSERT_OK(lkv_lease_attach(t, 0, id, 5000, r1, 2, id2, &exp, &nd, d, &bad));
    ASSERT_TRUE(memcmp(id, id2, sizeof id) == 0);
    ASSERT_EQ(nd, 3);
    ASSERT_EQ(pins_of(s, &k[1]), 1);
    ASSERT_EQ(pins_of(s, &k[2]), 1);
    free_docs(d, 2);
    ASSERT_EQ(lstats(t).renewals, 1);

    /* Over max_docs (3) by renewal, by a new lease; all-or-nothing on an unknown document. */
    lkv_lease_stats before = lstats(t);
    lkv_dockey r2[1] = {k[3]};
    ASSERT_ERR(lkv_lease_attach(t, 0, id, 5000, r2, 1, id2, NULL, NULL, d, &bad), LKV_EINVAL);
    lkv_dockey r3[4] = {k[0], k[1], k[2], k[3]};
    ASSERT_ERR(lkv_lease_attach(t, 0, NULL, 5000, r3, 4, id2, NULL, NULL, d, &bad), LKV_EINVAL);
    lkv_dockey r4[3] = {k[3], k[4], unknown};
    ASSERT_ERR(lkv_lease_attach(t, 0, NULL, 5000, r4, 3, id2, NULL, NULL, d, &bad), LKV_ENOTFOUND);
    ASSERT_EQ(bad, 2);
    ASSERT_EQ(pins_of(s, &k[3]), 0);
    ASSERT_EQ(pins_of(s, &k[4]), 0);
    ASSERT_TRUE(d[0].pages == NULL && d[1].pages == NULL);
    /* TTL bounds, empty new lease, unknown id, another owner. */
    ASSERT_ERR(lkv_lease_attach(t, 0, NULL, 0, r2, 1, id2, NULL, NULL, d, &bad), LKV_EINVAL);
    ASSERT_ERR(lkv_lease_attach(t, 0, NULL, 60001, r2, 1, id2, NULL, NULL, d, &bad), LKV_EINVAL);
    ASSERT_ERR(lkv_lease_attach(t, 0, NULL, 100, r2, 0, id2, NULL, NULL, d, &bad), LKV_EINVAL);
    uint8_t nope[LKV_LEASE_ID_BYTES] = {1, 2, 3};
    ASSERT_ERR(lkv_lease_attach(t, 0, nope, 100, r2, 1, id2, NULL, NULL, d, &bad), LKV_ENOTFOUND);
    ASSERT_EQ(bad, -1);
    ASSERT_ERR(lkv_lease_attach(t, 1, id, 100, NULL, 0, id2, NULL, NULL, d, &bad), LKV_ENOTFOUND);
    ASSERT_ERR(lkv_lease_release(t, 1, id, NULL), LKV_ENOTFOUND);
    ls = lstats(t);
    ASSERT_EQ(ls.live, before.live);
    ASSERT_EQ(ls.docs, before.docs);
    ASSERT_EQ(ls.pinned_bytes, before.pinned_bytes);
    ASSERT_EQ(ls.refused, before.refused + 8);
    ASSERT_EQ(pins_of(s, &k[3]), 0);

    /* Renewal with no documents keeps the set; release unpins all. */
    ASSERT_OK(lkv_lease_attach(t, 0, id, 5000, NULL, 0, id2, NULL, &nd, d, &bad));
    ASSERT_EQ(nd, 3);
    uint32_t rel = 0;
    ASSERT_OK(lkv_lease_release(t, 0, id, &rel));
    ASSERT_EQ(rel, 3);
    ASSERT_ERR(lkv_lease_release(t, 0, id, &rel), LKV_ENOTFOUND);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(pins_of(s, &k[i]), 0);
    }
    ls = lstats(t);
    ASSERT_EQ(ls.live, 0);
    ASSERT_EQ(ls.docs, 0);
    ASSERT_EQ(ls.pinned_bytes, 0);
    ASSERT_OK(lkv_store_flush(s)); /* The write-back writer pins what it persists. */
    ASSERT_EQ(su_stats(s).hot_bytes_pinned, 0);
    ASSERT_OK(lkv_store_demote(s, &k[0]));

    /* max_leases (4): a fifth is ENOSPC; destroy unpins what live leases hold. */
    for (int i = 0; i < 4; i++) {
        ASSERT_OK(lkv_lease_attach(t, i, NULL, 5000, &k[1 + i], 1, id, NULL, NULL, d, NULL));
        free_docs(d, 1);
    }
    ASSERT_ERR(lkv_lease_attach(t, 0, NULL, 5000, &k[1], 1, id, NULL, NULL, d, &bad), LKV_ENOSPC);
    ASSERT_EQ(bad, -1);
    ASSERT_EQ(pins_of(s, &k[1]), 1);
    check_registry(s, t);
    ASSERT_TRUE(lstats(t).refused > 0 && lstats(t).live == 4);
    /* One lease table per registry; its stats leave with it. */
    lkv_lease_table *t2;
    ASSERT_ERR(lkv_lease_table_create(s, &lim, &t2), LKV_EEXIST);
    int n = lkv_stats_count(lkv_store_stats_registry(s));
    lkv_lease_table_destroy(t);
    ASSERT_EQ(lkv_stats_count(lkv_store_stats_registry(s)), n - N_LS);
    for (int i = 0; i < 5; i++) {
        ASSERT_EQ(pins_of(s, &k[i]), 0);
    }
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_expiry(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 32, 0, WB);
    lkv_lease_limits lim = {.max_leases = 1, .max_docs = 8, .max_ttl_ms = 60000};
    lkv_lease_table *t;
    ASSERT_OK(lkv_lease_table_create(s, &lim, &t));
    lkv_dockey a, b;
    ASSERT_OK(su_put(s, 1, 10, &a));
    ASSERT_OK(su_put(s, 2, 10, &b));
    uint8_t id[LKV_LEASE_ID_BYTES], id2[LKV_LEASE_ID_BYTES];
    lkv_lease_doc d[1];
    ASSERT_OK(lkv_lease_attach(t, 0, NULL, 80, &a, 1, id, NULL, NULL, d, NULL));
    free_docs(d, 1);
    ASSERT_EQ(pins_of(s, &a), 1);
    sleep_ms(120);
    /* Past its expiry the lease is gone for every call, reaped or not; with max_leases 1 a new
     * lease still fits (expired ones are reaped to make room). */
    ASSERT_ERR(lkv_lease_attach(t, 0, id, 80, NULL, 0, id2, NULL, NULL, d, NULL), LKV_ENOTFOUND);
    double t0 = now_ms();
    ASSERT_OK(lkv_lease_attach(t, 0, NULL, 150, &b, 1, id2, NULL, NULL, d, NULL));
    free_docs(d, 1);
    ASSERT_EQ(pins_of(s, &a), 0);
    /* The reaper thread frees b's pin by itself after the 150 ms, never before. */
    uint32_t p = pins_of(s, &b);
    if (now_ms() - t0 < 140) {
        ASSERT_EQ(p, 1);
    }
    while (pins_of(s, &b) != 0 && now_ms() - t0 < 5000) {
        sleep_ms(5);
    }
    ASSERT_EQ(pins_of(s, &b), 0);
    ASSERT_TRUE(now_ms() - t0 >= 148); /* The table's clock has 1 ms steps. */
    lkv_lease_stats ls = lstats(t);
    ASSERT_EQ(ls.expired, 2);
    ASSERT_EQ(ls.live, 0);
    ASSERT_EQ(lkv_lease_reap(t), 0);
    ASSERT_ERR(lkv_lease_release(t, 0, id2, NULL), LKV_ENOTFOUND);
    lkv_lease_table_destroy(t);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

static void test_cannot_make_hot(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 6, 0, WB); /* 6 pages */
    lkv_lease_limits lim = {.max_leases = 8, .max_docs = 8, .max_ttl_ms = 60000};
    lkv_lease_table *t;
    ASSERT_OK(lkv_lease_table_create(s, &lim, &t));
    lkv_dockey cold, x, y;
    ASSERT_OK(su_put(s, 1, 10, &cold));
    ASSERT_OK(lkv_store_flush(s));
    ASSERT_OK(lkv_store_demote(s, &cold));
    ASSERT_OK(su_put(s, 2, 10, &x));
    ASSERT_OK(su_put(s, 3, 10, &y));
    uint8_t id[LKV_LEASE_ID_BYTES], id2[LKV_LEASE_ID_BYTES];
    lkv_lease_doc d[2];
    lkv_dockey xy[2] = {x, y};
    ASSERT_OK(lkv_lease_attach(t, 0, NULL, 5000, xy, 2, id, NULL, NULL, d, NULL));
    free_docs(d, 2);
    ASSERT_OK(lkv_store_flush(s)); /* The write-back writer pins what it persists. */
    lkv_store_stats before = su_stats(s);
    int bad = 0;
    lkv_dockey xc[2] = {x, cold};
    ASSERT_ERR(lkv_lease_attach(t, 0, NULL, 5000, xc, 2, id2, NULL, NULL, d, &bad), LKV_ENOSPC);
    ASSERT_EQ(bad, 1);
    ASSERT_EQ(pins_of(s, &x), 1);
    ASSERT_EQ(su_stats(s).hot_bytes_pinned, before.hot_bytes_pinned);
    /* Released: the cold document is promoted by an attach and its pages read back intact. */
    ASSERT_OK(lkv_lease_release(t, 0, id, NULL));
    ASSERT_OK(lkv_lease_attach(t, 0, NULL, 5000, &cold, 1, id2, NULL, NULL, d, NULL));
    free_docs(d, 1);
    lkv_doc_info in;
    ASSERT_OK(lkv_store_lookup(s, &cold, 1, &in));
    ASSERT_EQ(in.tier, LKV_TIER_HOT);
    ASSERT_OK(su_check(s, &cold, 1, 10));
    lkv_lease_table_destroy(t);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

/* Wake-ups counted by the test. */
static int wakes;
static void count_wake(void *arg)
{
    (void)arg;
    __atomic_fetch_add(&wakes, 1, __ATOMIC_SEQ_CST);
}

/* Maps the host arena of s (read-write), as a worker does. */
static uint8_t *map_arena(lkv_store *s, size_t *len)
{
    lkv_store_arena_info ai;
    lkv_store_arena_info_get(s, &ai);
    int fd = shm_open(ai.shm_name, O_RDWR, 0);
    ASSERT_TRUE(fd >= 0);
    uint8_t *m = mmap(NULL, ai.arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    ASSERT_TRUE(m != MAP_FAILED);
    *len = ai.arena_bytes;
    return m;
}

/* Writes document seed (n tokens of "tiny") into the reservation's pages. */
static void write_doc(lkv_store *s, uint8_t *arena, const lkv_lease_doc *d, uint64_t seed,
                      uint32_t n)
{
    lkv_store_region rg;
    ASSERT_OK(lkv_store_region_get(s, d->info.region, &rg));
    ASSERT_EQ(rg.page_bytes, d->info.page_bytes);
    lkv_kv_shape sh = tiny_profile("x").shape;
    uint8_t *kv = malloc((size_t)d->info.n_blocks * TINY_BB);
    su_fill_doc(&sh, n, seed, kv);
    for (uint32_t i = 0; i < d->info.n_blocks; i++) {
        memcpy(arena + rg.base_offset + (uint64_t)d->pages[i] * rg.page_bytes, kv + i * TINY_BB,
               TINY_BB);
    }
    free(kv);
}

/* Reservations: invisible until commit; a second reserver is refused (EINPROGRESS) and its
 * wake-up runs exactly once at the commit; a non-zero tail keeps the reservation open; abort,
 * expiry and destroy give the pages back and wake waiters; reserving a present document
 * attaches it. */
static void test_reservations(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 16, 0, WB);
    lkv_lease_limits lim = {.max_leases = 8, .max_docs = 8, .max_ttl_ms = 60000};
    lkv_lease_table *t;
    ASSERT_OK(lkv_lease_table_create(s, &lim, &t));
    const lkv_profile *p = lkv_store_profile_find(s, "tiny");
    uint8_t salt[32];
    lkv_tenant_salt_default(salt);
    uint32_t tok[10];
    su_doc_tokens(7, 10, tok);
    size_t alen;
    uint8_t *arena = map_arena(s, &alen);
    uint8_t id[LKV_LEASE_ID_BYTES], id2[LKV_LEASE_ID_BYTES];
    lkv_dockey key, key2;
    int present = -1;
    lkv_lease_doc d, d2;
    uint32_t free0 = su_tiny_free(s);
    ASSERT_OK(lkv_lease_reserve(t, 0, NULL, 5000, salt, p, tok, 10, NULL, NULL, id, NULL, NULL,
                                &key, &present, &d));
    ASSERT_EQ(present, 0);
    ASSERT_EQ(d.info.n_blocks, 3);
    ASSERT_EQ(su_tiny_free(s), free0 - 3);
    lkv_doc_info in;
    ASSERT_OK(lkv_store_lookup(s, &key, 1, &in));
    ASSERT_EQ(in.present, 0); /* Invisible. */
    /* Another owner's (tenant's) lease reserving the same key waits for it. */
    wakes = 0;
    ASSERT_ERR(lkv_lease_reserve(t, 1, NULL, 5000, salt, p, tok, 10, count_wake, NULL, id2, NULL,
                                 NULL, &key2, &present, &d2),
               LKV_EINPROGRESS);
    ASSERT_EQ(lstats(t).waiting, 1);
    ASSERT_ERR(lkv_lease_reserve(t, 0, id, 5000, salt, p, tok, 10, NULL, NULL, id2, NULL, NULL,
                                 &key2, &present, &d2),
               LKV_EEXIST);
    write_doc(s, arena, &d, 7, 10);
    /* Token 10 of 12 is past the end: poison one byte of its slot (layer 0, K, head 1). */
    uint64_t base = 0;
    lkv_store_region rg;
    ASSERT_OK(lkv_store_region_get(s, d.info.region, &rg));
    base = rg.base_offset + (uint64_t)d.pages[2] * rg.page_bytes;
    lkv_kv_shape sh = tiny_profile("x").shape;
    size_t row = (size_t)sh.head_dim * lkv_dtype_size(sh.dtype);
    size_t off = lkv_slab_offset(&sh, 0, 0, 1) + 2 * row; /* Token 8 + 2 = 10. */
    arena[base + off] = 1;
    lkv_lease_doc c;
    ASSERT_ERR(lkv_lease_commit(t, 0, id, &key, &c, NULL), LKV_EINVAL);
    ASSERT_EQ(wakes, 0);
    ASSERT_EQ(lstats(t).reserved, 1);
    ASSERT_OK(lkv_store_lookup(s, &key, 1, &in));
    ASSERT_EQ(in.present, 0);
    arena[base + off] = 0;
    int other = -1;
    ASSERT_OK(lkv_lease_commit(t, 0, id, &key, &c, &other));
    ASSERT_EQ(other, 0);
    ASSERT_EQ(wakes, 1);
    ASSERT_EQ(lstats(t).waiting, 0);
    ASSERT_TRUE(memcmp(c.pages, d.pages, 3 * sizeof(uint32_t)) == 0);
    free(c.pages);
    ASSERT_OK(su_check(s, &key, 7, 10));
    ASSERT_EQ(pins_of(s, &key), 1); /* Pinned under the lease. */
    ASSERT_ERR(lkv_lease_commit(t, 0, id, &key, &c, NULL), LKV_ENOTFOUND);
    /* Present now: reserving attaches it. */
    ASSERT_OK(lkv_lease_reserve(t, 1, NULL, 5000, salt, p, tok, 10, NULL, NULL, id2, NULL, NULL,
                                &key2, &present, &d2));
    ASSERT_EQ(present, 1);
    ASSERT_TRUE(memcmp(d2.pages, d.pages, 3 * sizeof(uint32_t)) == 0);
    ASSERT_EQ(pins_of(s, &key), 2);
    free(d2.pages);
    free(d.pages);
    uint32_t rel = 0;
    ASSERT_OK(lkv_lease_release(t, 1, id2, &rel));
    ASSERT_EQ(rel, 1);

    /* Abort, and expiry: pages back, waiters woken, nothing visible. */
    uint32_t tk2[10];
    su_doc_tokens(8, 10, tk2);
    free0 = su_tiny_free(s);
    /* A scratch reservation (it skipped the hot door) is never committed: refused, still open,
     * nothing visible; Abort gives its pages back. */
    ASSERT_OK(lkv_lease_reserve_ex(t, 0, id, 5000, salt, p, tk2, 10, 1, NULL, NULL, id, NULL, NULL,
                                   &key2, &present, &d));
    ASSERT_EQ(present, 0);
    write_doc(s, arena, &d, 8, 10);
    free(d.pages);
    ASSERT_ERR(lkv_lease_commit(t, 0, id, &key2, &c, NULL), LKV_EPERM);
    ASSERT_OK(lkv_store_lookup(s, &key2, 1, &in));
    ASSERT_EQ(in.present, 0);
    ASSERT_EQ(lstats(t).reserved, 1);
    ASSERT_OK(lkv_lease_abort(t, 0, id, &key2));
    ASSERT_EQ(su_tiny_free(s), free0);
    ASSERT_OK(lkv_lease_reserve(t, 0, id, 5000, salt, p, tk2, 10, NULL, NULL, id, NULL, NULL, &key2,
                                &present, &d));
    free(d.pages);
    ASSERT_OK(lkv_lease_abort(t, 0, id, &key2));
    ASSERT_ERR(lkv_lease_abort(t, 0, id, &key2), LKV_ENOTFOUND);
    ASSERT_EQ(su_tiny_free(s), free0);
    ASSERT_OK(lkv_lease_reserve(t, 0, NULL, 50, salt, p, tk2, 10, NULL, NULL, id2, NULL, NULL,
                                &key2, &present, &d));
    free(d.pages);
    wakes = 0;
    uint8_t id3[LKV_LEASE_ID_BYTES];
    ASSERT_ERR(lkv_lease_reserve(t, 0, NULL, 5000, salt, p, tk2, 10, count_wake, NULL, id3, NULL,
                                 NULL, &key2, &present, &d2),
               LKV_EINPROGRESS);
    sleep_ms(120);
    lkv_lease_reap(t);
    ASSERT_EQ(wakes, 1);
    ASSERT_EQ(su_tiny_free(s), free0);
    ASSERT_EQ(lstats(t).resv_expired, 1);
    ASSERT_OK(lkv_store_lookup(s, &key2, 1, &in));
    ASSERT_EQ(in.present, 0);
    check_registry(s, t);

    /* Destroy with a reservation and a waiter: the waiter is woken, the pages go back. */
    ASSERT_OK(lkv_lease_reserve(t, 0, NULL, 5000, salt, p, tk2, 10, NULL, NULL, id2, NULL, NULL,
                                &key2, &present, &d));
    free(d.pages);
    wakes = 0;
    ASSERT_ERR(lkv_lease_reserve(t, 0, NULL, 5000, salt, p, tk2, 10, count_wake, NULL, id3, NULL,
                                 NULL, &key2, &present, &d2),
               LKV_EINPROGRESS);
    lkv_lease_table_destroy(t);
    ASSERT_EQ(wakes, 1);
    ASSERT_EQ(su_tiny_free(s), free0);
    ASSERT_EQ(pins_of(s, &key), 0);
    munmap(arena, alen);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

/* ATTACH_MODE_PRESENT (lkv_lease_attach_present): pins what is present, reports the rest (not
 * cached: LKV_ENOTFOUND; no hot room: LKV_ENOSPC), makes no lease when nothing is present, and
 * still refuses what is not about presence (limits, an unknown lease). */
static void test_attach_present(void)
{
    char *dir = su_tmpdir();
    lkv_store *s = su_open(dir, 9, 0, WB); /* 9 pages */
    lkv_lease_limits lim = {.max_leases = 4, .max_docs = 4, .max_ttl_ms = 60000};
    lkv_lease_table *t;
    ASSERT_OK(lkv_lease_table_create(s, &lim, &t));
    lkv_dockey a, b, cold, gone, absent;
    ASSERT_OK(su_put(s, 1, 10, &a)); /* 3 pages each */
    ASSERT_OK(su_put(s, 2, 10, &b));
    ASSERT_OK(su_put(s, 3, 10, &cold));
    ASSERT_OK(su_put(s, 4, 10, &gone));
    ASSERT_OK(lkv_store_flush(s));
    ASSERT_OK(lkv_store_demote(s, &cold));
    ASSERT_OK(lkv_store_delete(s, &gone)); /* evicted/deleted between Lookup and Attach */
    su_key(s, 99, 10, &absent);
    uint8_t id[LKV_LEASE_ID_BYTES], id2[LKV_LEASE_ID_BYTES];
    uint32_t nd = 0;
    int st[5], bad = 0;
    lkv_lease_doc d[5];
    lkv_dockey req[4] = {a, gone, b, absent};
    ASSERT_OK(lkv_lease_attach_present(t, 0, NULL, 5000, req, 4, id, NULL, &nd, d, st, &bad));
    ASSERT_EQ(nd, 2);
    ASSERT_TRUE(st[0] == 0 && st[1] == LKV_ENOTFOUND && st[2] == 0 && st[3] == LKV_ENOTFOUND);
    ASSERT_TRUE(d[0].pages != NULL && d[1].pages == NULL && d[3].pages == NULL);
    ASSERT_EQ(d[2].info.n_blocks, 3);
    ASSERT_EQ(pins_of(s, &a), 1);
    ASSERT_EQ(pins_of(s, &b), 1);
    free_docs(d, 4);
    /* The cold one cannot be made hot now (6 of 9 pages pinned, 3 needed, the rest held by
     * pinned a and b): reported, not an error; renewing with it keeps the lease as it was. */
    lkv_dockey rq2[2] = {cold, a};
    ASSERT_OK(lkv_lease_attach_present(t, 0, id, 5000, rq2, 2, id2, NULL, &nd, d, st, &bad));
    ASSERT_TRUE(memcmp(id, id2, sizeof id) == 0);
    ASSERT_TRUE(st[1] == 0 && (st[0] == 0 || st[0] == LKV_ENOSPC));
    ASSERT_EQ(nd, st[0] == 0 ? 3 : 2);
    ASSERT_EQ(pins_of(s, &a), 1); /* already in the lease: pinned once */
    free_docs(d, 2);
    /* Nothing present and no lease id: no lease is made. */
    lkv_lease_stats before = lstats(t);
    lkv_dockey none[2] = {absent, gone};
    memset(id2, 0xAA, sizeof id2);
    ASSERT_OK(lkv_lease_attach_present(t, 0, NULL, 5000, none, 2, id2, NULL, &nd, d, st, &bad));
    ASSERT_EQ(nd, 0);
    static const uint8_t zero[LKV_LEASE_ID_BYTES];
    ASSERT_TRUE(memcmp(id2, zero, sizeof zero) == 0);
    ASSERT_EQ(lstats(t).live, before.live);
    ASSERT_EQ(lstats(t).attaches, before.attaches);
    /* Not about presence: still refused. */
    ASSERT_ERR(lkv_lease_attach_present(t, 0, zero, 5000, &a, 1, id2, NULL, &nd, d, st, &bad),
               LKV_ENOTFOUND);
    lkv_dockey five[5] = {a, b, cold, gone, absent};
    ASSERT_ERR(lkv_lease_attach_present(t, 0, NULL, 5000, five, 5, id2, NULL, &nd, d, st, &bad),
               LKV_EINVAL);
    ASSERT_ERR(lkv_lease_attach_present(t, 0, NULL, 5000, &a, 1, id2, NULL, &nd, d, NULL, &bad),
               LKV_EINVAL);
    uint32_t rel = 0;
    ASSERT_OK(lkv_lease_release(t, 0, id, &rel));
    ASSERT_TRUE(rel == 2 || rel == 3);
    ASSERT_EQ(pins_of(s, &a), 0);
    lkv_lease_table_destroy(t);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
}

int main(void)
{
    LKV_RUN(test_reservations);
    LKV_RUN(test_attach_renew_release);
    LKV_RUN(test_expiry);
    LKV_RUN(test_cannot_make_hot);
    LKV_RUN(test_attach_present);
    return 0;
}
