/*
 * lkv_prefix.c: the prefix cache's pool (see lkv_prefix.h).
 *
 * State: the policy (ids = block names, every block page_bytes), a free list of pages and an
 * open-addressing table name -> (page, pins) with linear probing and backward-shift deletion
 * (no tombstones), at most half full. Eviction runs inside lkv_policy_admit through evict_cb,
 * which frees the victim's page and table entry.
 */
#include "lkv_prefix.h"

#include <stdlib.h>
#include <string.h>

#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_policy.h"

typedef struct slot {
    uint64_t h;    /* Block name; 0 = empty. */
    uint32_t page; /* Its page. */
    uint32_t pins; /* Pins held by requests. */
    int pending;   /* 1 from put until ready: its KV is not written yet. */
} slot;

struct lkv_prefix {
    lkv_policy *pol; /* Owned. */
    uint64_t page_bytes;
    uint32_t first_page;
    uint32_t n_pages;
    uint32_t *free; /* [n_pages] free pages (a stack). */
    uint32_t n_free;
    slot *tab;     /* [cap] */
    uint64_t mask; /* cap - 1. */
    lkv_prefix_stats st;
};

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t lkv_prefix_chain(uint64_t prev, const int *tokens, int n, int doc_start)
{
    uint64_t h = mix64(prev ^ (doc_start ? 0x9e3779b97f4a7c15ull : 0x632be59bd9b4e019ull));
    for (int i = 0; i < n; i++) {
        h = mix64(h ^ ((uint64_t)(uint32_t)tokens[i] + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)));
    }
    h = mix64(h ^ (uint64_t)n);
    return h != 0 ? h : 1;
}

static slot *find(const lkv_prefix *p, uint64_t h)
{
    for (uint64_t i = mix64(h) & p->mask;; i = (i + 1) & p->mask) {
        if (p->tab[i].h == h) {
            return &p->tab[i];
        }
        if (p->tab[i].h == 0) {
            return NULL;
        }
    }
}

static void insert(lkv_prefix *p, uint64_t h, uint32_t page)
{
    uint64_t i = mix64(h) & p->mask;
    while (p->tab[i].h != 0) {
        i = (i + 1) & p->mask;
    }
    p->tab[i] = (slot){.h = h, .page = page, .pins = 0, .pending = 1};
}

/* Removes the entry at s (backward-shift deletion keeps every probe chain unbroken). */
static void erase(lkv_prefix *p, slot *s)
{
    uint64_t i = (uint64_t)(s - p->tab);
    for (;;) {
        p->tab[i].h = 0;
        uint64_t j = i;
        for (;;) {
            j = (j + 1) & p->mask;
            if (p->tab[j].h == 0) {
                return;
            }
            uint64_t home = mix64(p->tab[j].h) & p->mask;
            /* Entry j may move to i if its home is not in (i, j] cyclically. */
            int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
            if (!between) {
                break;
            }
        }
        p->tab[i] = p->tab[j];
        i = j;
    }
}

static void evict_cb(void *ctx, uint64_t id, uint64_t bytes)
{
    (void)bytes;
    lkv_prefix *p = ctx;
    slot *s = find(p, id);
    if (s == NULL) {
        lkv_panic("prefix pool: the policy evicted an unknown block %llx", (unsigned long long)id);
    }
    p->free[p->n_free++] = s->page;
    erase(p, s);
    p->st.evictions++;
    p->st.blocks--;
}

int lkv_prefix_create(int kind, uint32_t first_page, uint32_t n_pages, uint64_t page_bytes,
                      lkv_prefix **out)
{
    *out = NULL;
    if (n_pages < 1 || page_bytes < 1) {
        return LKV_EINVAL;
    }
    lkv_prefix *p = lkv_xcalloc(1, sizeof(*p));
    int rc = lkv_policy_create(kind, (uint64_t)n_pages * page_bytes, &p->pol);
    if (rc != 0) {
        free(p);
        return LKV_EINVAL;
    }
    lkv_policy_sketch_size(p->pol, (uint64_t)n_pages * 4);
    p->page_bytes = page_bytes;
    p->first_page = first_page;
    p->n_pages = n_pages;
    p->free = lkv_xmalloc((size_t)n_pages * sizeof(uint32_t));
    for (uint32_t i = 0; i < n_pages; i++) {
        p->free[i] = first_page + n_pages - 1 - i; /* Popped from the end: first_page first. */
    }
    p->n_free = n_pages;
    uint64_t cap = 16;
    while (cap < (uint64_t)n_pages * 2) {
        cap *= 2;
    }
    p->tab = lkv_xcalloc((size_t)cap, sizeof(slot));
    p->mask = cap - 1;
    p->st.budget = (uint64_t)n_pages * page_bytes;
    *out = p;
    return 0;
}

void lkv_prefix_destroy(lkv_prefix *p)
{
    if (p == NULL) {
        return;
    }
    lkv_policy_destroy(p->pol);
    free(p->free);
    free(p->tab);
    free(p);
}

int lkv_prefix_get(lkv_prefix *p, uint64_t h, uint32_t *page)
{
    p->st.lookups++;
    lkv_policy_record(p->pol, h);
    slot *s = find(p, h);
    if (s == NULL || s->pending) {
        return 0;
    }
    (void)lkv_policy_touch(p->pol, h);
    if (lkv_policy_pin(p->pol, h) != 0) {
        lkv_panic("prefix pool: block %llx in the table but not in the policy",
                  (unsigned long long)h);
    }
    p->st.pinned += s->pins++ == 0;
    p->st.hits++;
    *page = s->page;
    return 1;
}

int lkv_prefix_put(lkv_prefix *p, uint64_t h, uint32_t *page)
{
    if (find(p, h) != NULL) {
        return LKV_EEXIST;
    }
    int rc = lkv_policy_admit(p->pol, h, p->page_bytes, 1.0, evict_cb, p);
    if (rc != 0) {
        p->st.refused++;
        return rc == LKV_EEXIST ? LKV_EEXIST : LKV_ENOSPC;
    }
    if (p->n_free == 0) {
        lkv_panic("prefix pool: the policy admitted a block with no free page");
    }
    uint32_t pg = p->free[--p->n_free];
    insert(p, h, pg);
    if (lkv_policy_pin(p->pol, h) != 0) {
        lkv_panic("prefix pool: cannot pin the block just admitted");
    }
    find(p, h)->pins = 1;
    p->st.pinned++;
    p->st.admitted++;
    p->st.blocks++;
    *page = pg;
    return 0;
}

int lkv_prefix_ready(lkv_prefix *p, uint64_t h)
{
    slot *s = find(p, h);
    if (s == NULL) {
        return LKV_ENOTFOUND;
    }
    s->pending = 0;
    return 0;
}

int lkv_prefix_unpin(lkv_prefix *p, uint64_t h)
{
    slot *s = find(p, h);
    if (s == NULL) {
        return LKV_ENOTFOUND;
    }
    if (s->pins == 0) {
        return LKV_EINVAL;
    }
    if (lkv_policy_unpin(p->pol, h) != 0) {
        lkv_panic("prefix pool: block %llx pinned here but not in the policy",
                  (unsigned long long)h);
    }
    p->st.pinned -= --s->pins == 0;
    return 0;
}

int lkv_prefix_remove(lkv_prefix *p, uint64_t h)
{
    slot *s = find(p, h);
    if (s == NULL) {
        return LKV_ENOTFOUND;
    }
    if (s->pins != 0) {
        return LKV_EBUSY;
    }
    if (lkv_policy_remove(p->pol, h) != 0) {
        lkv_panic("prefix pool: block %llx in the table but not in the policy",
                  (unsigned long long)h);
    }
    p->free[p->n_free++] = s->page;
    erase(p, s);
    p->st.blocks--;
    return 0;
}

void lkv_prefix_stats_get(const lkv_prefix *p, lkv_prefix_stats *st)
{
    *st = p->st;
    st->bytes_used = lkv_policy_bytes_used(p->pol);
}
