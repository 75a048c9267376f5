/*
 * lkv_policy.c: eviction policies and byte budgets as metadata only (see lkv_policy.h).
 *
 * Layout. Entries live in one growable array (ents) and are named by their index; a freed
 * index goes on a free list threaded through next. An open-addressing hash table (linear
 * probing, load <= 1/2, backward-shift deletion) maps id -> index. Each entry sits in exactly
 * one eviction structure while it is unpinned and in none while pinned, so a victim is always
 * the head of that structure and never has to be searched for:
 *   list kinds (lru, tinylfu)      intrusive doubly linked list, most recent at head, victim at
 *                                  tail: O(1) per operation;
 *   heap kinds (gdsf, lfuda,       binary min-heap on (priority, last access), each entry
 *               tlfu-gdsf)         knowing its heap position: O(log n) per operation.
 * Allocation happens only when the entry array, the hash table or the heap grows (doubling).
 *
 * Invariants (checked after every operation by tests/storage/test_policy.c):
 *   used <= budget; pinned <= used; count = entries in the table;
 *   an entry is in the list/heap iff pins == 0;
 *   for heap kinds, clock = priority of the last victim (GDSF aging, monotone).
 *
 * Frequency sketch (tinylfu, tlfu-gdsf): a count-min sketch of 4 rows of saturating 16-bit
 * counters, width a power of two. Every lkv_policy_record increments the smallest of the id's
 * 4 counters (conservative update); after 10 x width records all counters are halved, so the
 * history fades (TinyLFU's reset). The estimate is the minimum of the 4 counters. Counters
 * are 16-bit, not TinyLFU's 4-bit, because tlfu-gdsf divides them by sizes: a saturated
 * counter would rank every popular document by size alone.
 */
#include "lkv_policy.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "lkv_err.h"
#include "lkv_log.h"

#define NIL               UINT32_MAX
#define SKETCH_ROWS       4
#define SKETCH_MAX        65535
#define SKETCH_MIN_WIDTH  4096u
#define ADMIT_MAX_VICTIMS 8

typedef struct entry {
    uint64_t id;       /* Caller's id. */
    uint64_t bytes;    /* Size charged against the budget. */
    uint64_t seq;      /* Last access (policy clock), ties broken oldest first. */
    double cost;       /* Cost given at admit (gdsf kinds). */
    double prio;       /* Priority (heap kinds). */
    uint32_t prev;     /* List neighbour towards the head (more recent), or NIL. */
    uint32_t next;     /* List neighbour towards the tail; free-list link when free. */
    uint32_t heap_pos; /* Index in heap (heap kinds), NIL when not in the heap. */
    uint32_t pins;     /* Pin count; pinned entries are in no eviction structure. */
    uint32_t freq;     /* Accesses while resident (gdsf, lfuda). */
} entry;

struct lkv_policy {
    int kind;           /* enum lkv_policy_kind. */
    int heap_kind;      /* 1 for gdsf, lfuda, tlfu-gdsf. */
    int sketch_kind;    /* 1 for tinylfu, tlfu-gdsf. */
    uint64_t budget;    /* Bytes allowed. */
    uint64_t used;      /* Bytes admitted. */
    uint64_t pinned;    /* Bytes of pinned entries. */
    uint64_t count;     /* Entries present. */
    uint64_t evictions; /* Victims chosen. */
    uint64_t seq;       /* Access counter. */
    double clock;       /* GDSF/LFU-DA inflation value L. */
    entry *ents;        /* Entry array, owned. */
    uint32_t ents_len;  /* Indices ever used. */
    uint32_t ents_cap;  /* Allocated entries. */
    uint32_t free_head; /* Free-list head, or NIL. */
    uint32_t *table;    /* Hash table of entry indices (NIL = empty), owned. */
    uint32_t tmask;     /* Table size - 1 (power of two). */
    uint32_t head;      /* List head (most recent), or NIL. */
    uint32_t tail;      /* List tail (victim), or NIL. */
    uint32_t *heap;     /* Heap of entry indices, owned. */
    uint32_t heap_len;  /* Entries in the heap. */
    uint32_t heap_cap;  /* Allocated heap slots. */
    uint16_t *sketch;   /* SKETCH_ROWS x swidth counters, owned (sketch kinds). */
    uint32_t smask;     /* swidth - 1. */
    uint64_t ssamples;  /* Records since the last halving. */
};

static const char *const kind_names[LKV_POLICY__COUNT] = {"lru", "gdsf", "lfuda", "tinylfu",
                                                          "tlfu-gdsf"};

/* splitmix64 finaliser: a fast, well-mixed 64-bit hash of an id. */
static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int lkv_policy_parse(const char *name, int *kind)
{
    if (name == NULL || kind == NULL) {
        return LKV_EINVAL;
    }
    for (int k = 0; k < LKV_POLICY__COUNT; k++) {
        if (strcmp(name, kind_names[k]) == 0) {
            *kind = k;
            return 0;
        }
    }
    return LKV_EINVAL;
}

const char *lkv_policy_name(int kind)
{
    if (kind < 0 || kind >= LKV_POLICY__COUNT) {
        return "unknown";
    }
    return kind_names[kind];
}

int lkv_policy_names(char *names, int n)
{
    int len = 0;
    for (int k = 0; k < LKV_POLICY__COUNT; k++) {
        int w = snprintf(names != NULL && len < n ? names + len : NULL,
                         names != NULL && len < n ? (size_t)(n - len) : 0, "%s%s",
                         k > 0 ? ", " : "", kind_names[k]);
        len += w;
    }
    return len;
}

/* ---- sketch ---- */

static void sketch_alloc(lkv_policy *p, uint64_t width)
{
    uint32_t w = SKETCH_MIN_WIDTH;
    while (w < width && w < (1u << 28)) {
        w <<= 1;
    }
    free(p->sketch);
    p->sketch = lkv_xcalloc((size_t)SKETCH_ROWS * w, sizeof(uint16_t));
    p->smask = w - 1;
    p->ssamples = 0;
}

static inline uint32_t sketch_slot(const lkv_policy *p, uint64_t h, int row)
{
    uint64_t h2 = (h >> 32) | 1;
    return (uint32_t)(row * (p->smask + 1)) + (uint32_t)((h + (uint64_t)row * h2) & p->smask);
}

static uint32_t sketch_estimate(const lkv_policy *p, uint64_t id)
{
    uint64_t h = mix64(id ^ 0x5bd1e995u);
    uint32_t est = SKETCH_MAX;
    for (int r = 0; r < SKETCH_ROWS; r++) {
        uint32_t c = p->sketch[sketch_slot(p, h, r)];
        est = c < est ? c : est;
    }
    return est;
}

static void sketch_halve(lkv_policy *p)
{
    size_t n = (size_t)SKETCH_ROWS * (p->smask + 1);
    for (size_t i = 0; i < n; i++) {
        p->sketch[i] >>= 1;
    }
    p->ssamples /= 2;
}

void lkv_policy_record(lkv_policy *p, uint64_t id)
{
    if (!p->sketch_kind) {
        return;
    }
    uint64_t h = mix64(id ^ 0x5bd1e995u);
    uint32_t slots[SKETCH_ROWS];
    uint32_t est = SKETCH_MAX;
    for (int r = 0; r < SKETCH_ROWS; r++) {
        slots[r] = sketch_slot(p, h, r);
        uint32_t c = p->sketch[slots[r]];
        est = c < est ? c : est;
    }
    /* Conservative update: only the counters at the minimum grow (less overestimation). */
    for (int r = 0; r < SKETCH_ROWS; r++) {
        if (p->sketch[slots[r]] == est && est < SKETCH_MAX) {
            p->sketch[slots[r]]++;
        }
    }
    if (++p->ssamples >= 10ull * (p->smask + 1)) {
        sketch_halve(p);
    }
}

int lkv_policy_sketch_size(lkv_policy *p, uint64_t ids)
{
    if (p == NULL) {
        return LKV_EINVAL;
    }
    if (p->sketch_kind) {
        sketch_alloc(p, ids);
    }
    return 0;
}

/* ---- hash table ---- */

static uint32_t table_find(const lkv_policy *p, uint64_t id)
{
    uint32_t i = (uint32_t)mix64(id) & p->tmask;
    for (;;) {
        uint32_t e = p->table[i];
        if (e == NIL || p->ents[e].id == id) {
            return e;
        }
        i = (i + 1) & p->tmask;
    }
}

static void table_insert_raw(lkv_policy *p, uint32_t e)
{
    uint32_t i = (uint32_t)mix64(p->ents[e].id) & p->tmask;
    while (p->table[i] != NIL) {
        i = (i + 1) & p->tmask;
    }
    p->table[i] = e;
}

static void table_grow(lkv_policy *p)
{
    uint32_t old_size = p->tmask + 1;
    uint32_t *old = p->table;
    uint32_t size = old_size * 2;
    p->table = lkv_xmalloc((size_t)size * sizeof(uint32_t));
    memset(p->table, 0xff, (size_t)size * sizeof(uint32_t));
    p->tmask = size - 1;
    for (uint32_t i = 0; i < old_size; i++) {
        if (old[i] != NIL) {
            table_insert_raw(p, old[i]);
        }
    }
    free(old);
}

/* Removes id's slot by backward-shift deletion, so probes never need tombstones. */
static void table_delete(lkv_policy *p, uint64_t id)
{
    uint32_t i = (uint32_t)mix64(id) & p->tmask;
    while (p->table[i] == NIL || p->ents[p->table[i]].id != id) {
        assert(p->table[i] != NIL); /* Only called for a present id. */
        i = (i + 1) & p->tmask;
    }
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & p->tmask;
        uint32_t e = p->table[j];
        if (e == NIL) {
            break;
        }
        uint32_t home = (uint32_t)mix64(p->ents[e].id) & p->tmask;
        /* Move e back to the hole at i unless its home lies cyclically in (i, j]. */
        int in_range = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!in_range) {
            p->table[i] = e;
            i = j;
        }
    }
    p->table[i] = NIL;
}

/* ---- list ---- */

static void list_push_head(lkv_policy *p, uint32_t e)
{
    entry *x = &p->ents[e];
    x->prev = NIL;
    x->next = p->head;
    if (p->head != NIL) {
        p->ents[p->head].prev = e;
    } else {
        p->tail = e;
    }
    p->head = e;
}

static void list_unlink(lkv_policy *p, uint32_t e)
{
    entry *x = &p->ents[e];
    if (x->prev != NIL) {
        p->ents[x->prev].next = x->next;
    } else {
        p->head = x->next;
    }
    if (x->next != NIL) {
        p->ents[x->next].prev = x->prev;
    } else {
        p->tail = x->prev;
    }
    x->prev = x->next = NIL;
}

/* ---- heap ---- */

static inline int heap_less(const lkv_policy *p, uint32_t a, uint32_t b)
{
    const entry *x = &p->ents[a], *y = &p->ents[b];
    return x->prio < y->prio || (x->prio == y->prio && x->seq < y->seq);
}

static inline void heap_set(lkv_policy *p, uint32_t pos, uint32_t e)
{
    p->heap[pos] = e;
    p->ents[e].heap_pos = pos;
}

static void heap_up(lkv_policy *p, uint32_t pos)
{
    uint32_t e = p->heap[pos];
    while (pos > 0) {
        uint32_t parent = (pos - 1) / 2;
        if (!heap_less(p, e, p->heap[parent])) {
            break;
        }
        heap_set(p, pos, p->heap[parent]);
        pos = parent;
    }
    heap_set(p, pos, e);
}

static void heap_down(lkv_policy *p, uint32_t pos)
{
    uint32_t e = p->heap[pos];
    for (;;) {
        uint32_t c = 2 * pos + 1;
        if (c >= p->heap_len) {
            break;
        }
        if (c + 1 < p->heap_len && heap_less(p, p->heap[c + 1], p->heap[c])) {
            c++;
        }
        if (!heap_less(p, p->heap[c], e)) {
            break;
        }
        heap_set(p, pos, p->heap[c]);
        pos = c;
    }
    heap_set(p, pos, e);
}

/* Restores heap order around pos after the entry there changed priority either way. */
static void heap_fix(lkv_policy *p, uint32_t pos)
{
    uint32_t e = p->heap[pos];
    heap_down(p, pos);
    if (p->ents[e].heap_pos == pos) {
        heap_up(p, pos);
    }
}

static void heap_push(lkv_policy *p, uint32_t e)
{
    if (p->heap_len == p->heap_cap) {
        p->heap_cap = p->heap_cap ? p->heap_cap * 2 : 64;
        p->heap = lkv_xrealloc(p->heap, (size_t)p->heap_cap * sizeof(uint32_t));
    }
    p->heap[p->heap_len] = e;
    p->ents[e].heap_pos = p->heap_len;
    p->heap_len++;
    heap_up(p, p->heap_len - 1);
}

static void heap_erase(lkv_policy *p, uint32_t e)
{
    uint32_t pos = p->ents[e].heap_pos;
    assert(pos < p->heap_len && p->heap[pos] == e);
    p->ents[e].heap_pos = NIL;
    p->heap_len--;
    if (pos == p->heap_len) {
        return;
    }
    uint32_t moved = p->heap[p->heap_len];
    heap_set(p, pos, moved);
    heap_fix(p, pos);
}

/* ---- priorities ---- */

/* The priority entry e would get now (heap kinds). */
static double prio_of(const lkv_policy *p, const entry *x, uint32_t freq)
{
    double size = x->bytes > 0 ? (double)x->bytes : 1.0;
    switch (p->kind) {
    case LKV_POLICY_LFUDA:
        return p->clock + (double)freq;
    case LKV_POLICY_GDSF:
    case LKV_POLICY_TLFU_GDSF:
    default:
        return p->clock + (double)freq * x->cost / size;
    }
}

static uint32_t freq_now(const lkv_policy *p, const entry *x)
{
    if (p->kind == LKV_POLICY_TLFU_GDSF) {
        uint32_t est = sketch_estimate(p, x->id);
        return est > 0 ? est : 1;
    }
    return x->freq;
}

/* Puts an unpinned entry into its eviction structure. */
static void track(lkv_policy *p, uint32_t e)
{
    if (p->heap_kind) {
        heap_push(p, e);
    } else {
        list_push_head(p, e);
    }
}

static void untrack(lkv_policy *p, uint32_t e)
{
    if (p->heap_kind) {
        heap_erase(p, e);
    } else {
        list_unlink(p, e);
    }
}

/* ---- lifecycle ---- */

int lkv_policy_create(int kind, uint64_t budget, lkv_policy **out)
{
    if (out == NULL || kind < 0 || kind >= LKV_POLICY__COUNT) {
        return LKV_EINVAL;
    }
    lkv_policy *p = lkv_xcalloc(1, sizeof(*p));
    p->kind = kind;
    p->heap_kind =
        kind == LKV_POLICY_GDSF || kind == LKV_POLICY_LFUDA || kind == LKV_POLICY_TLFU_GDSF;
    p->sketch_kind = kind == LKV_POLICY_TINYLFU || kind == LKV_POLICY_TLFU_GDSF;
    p->budget = budget;
    p->free_head = NIL;
    p->head = p->tail = NIL;
    p->tmask = 63;
    p->table = lkv_xmalloc(64 * sizeof(uint32_t));
    memset(p->table, 0xff, 64 * sizeof(uint32_t));
    if (p->sketch_kind) {
        sketch_alloc(p, SKETCH_MIN_WIDTH);
    }
    *out = p;
    return 0;
}

void lkv_policy_destroy(lkv_policy *p)
{
    if (p == NULL) {
        return;
    }
    free(p->ents);
    free(p->table);
    free(p->heap);
    free(p->sketch);
    free(p);
}

/* Drops entry e from the table and frees its index (not from list/heap: caller did). */
static void drop(lkv_policy *p, uint32_t e)
{
    entry *x = &p->ents[e];
    table_delete(p, x->id);
    p->used -= x->bytes;
    p->count--;
    x->next = p->free_head;
    p->free_head = e;
}

static void evict_one(lkv_policy *p, lkv_policy_evict_fn evict, void *ctx)
{
    uint32_t e;
    if (p->heap_kind) {
        assert(p->heap_len > 0);
        e = p->heap[0];
        p->clock = p->ents[e].prio;
        heap_erase(p, e);
    } else {
        assert(p->tail != NIL);
        e = p->tail;
        list_unlink(p, e);
    }
    p->evictions++;
    if (evict != NULL) {
        evict(ctx, p->ents[e].id, p->ents[e].bytes);
    }
    drop(p, e);
}

int lkv_policy_make_room(lkv_policy *p, uint64_t bytes, lkv_policy_evict_fn evict, void *ctx)
{
    if (p == NULL) {
        return LKV_EINVAL;
    }
    if (bytes > p->budget - p->pinned) {
        return LKV_ENOSPC;
    }
    while (p->budget - p->used < bytes) {
        evict_one(p, evict, ctx);
    }
    return 0;
}

int lkv_policy_admit(lkv_policy *p, uint64_t id, uint64_t bytes, double cost,
                     lkv_policy_evict_fn evict, void *ctx)
{
    if (p == NULL || !(cost >= 0)) {
        return LKV_EINVAL;
    }
    if (table_find(p, id) != NIL) {
        return LKV_EEXIST;
    }
    int rc = lkv_policy_make_room(p, bytes, evict, ctx);
    if (rc != 0) {
        return rc;
    }
    if ((uint64_t)(p->count + 1) * 2 > (uint64_t)p->tmask + 1) {
        table_grow(p);
    }
    uint32_t e;
    if (p->free_head != NIL) {
        e = p->free_head;
        p->free_head = p->ents[e].next;
    } else {
        if (p->ents_len == p->ents_cap) {
            p->ents_cap = p->ents_cap ? p->ents_cap * 2 : 64;
            p->ents = lkv_xrealloc(p->ents, (size_t)p->ents_cap * sizeof(entry));
        }
        e = p->ents_len++;
    }
    entry *x = &p->ents[e];
    memset(x, 0, sizeof(*x));
    x->id = id;
    x->bytes = bytes;
    x->cost = cost;
    x->seq = ++p->seq;
    x->freq = 1;
    x->prev = x->next = x->heap_pos = NIL;
    if (p->heap_kind) {
        x->prio = prio_of(p, x, freq_now(p, x));
    }
    table_insert_raw(p, e);
    p->used += bytes;
    p->count++;
    track(p, e);
    return 0;
}

int lkv_policy_touch(lkv_policy *p, uint64_t id)
{
    uint32_t e = table_find(p, id);
    if (e == NIL) {
        return LKV_ENOTFOUND;
    }
    entry *x = &p->ents[e];
    x->seq = ++p->seq;
    if (x->freq < UINT32_MAX) {
        x->freq++;
    }
    if (x->pins > 0) {
        if (p->heap_kind) {
            x->prio = prio_of(p, x, freq_now(p, x));
        }
        return 0;
    }
    if (p->heap_kind) {
        x->prio = prio_of(p, x, freq_now(p, x));
        heap_fix(p, x->heap_pos);
    } else if (p->head != e) {
        list_unlink(p, e);
        list_push_head(p, e);
    }
    return 0;
}

int lkv_policy_remove(lkv_policy *p, uint64_t id)
{
    uint32_t e = table_find(p, id);
    if (e == NIL) {
        return LKV_ENOTFOUND;
    }
    entry *x = &p->ents[e];
    if (x->pins > 0) {
        p->pinned -= x->bytes;
    } else {
        untrack(p, e);
    }
    drop(p, e);
    return 0;
}

int lkv_policy_pin(lkv_policy *p, uint64_t id)
{
    uint32_t e = table_find(p, id);
    if (e == NIL) {
        return LKV_ENOTFOUND;
    }
    entry *x = &p->ents[e];
    if (x->pins == 0) {
        untrack(p, e);
        p->pinned += x->bytes;
    }
    x->pins++;
    return 0;
}

int lkv_policy_unpin(lkv_policy *p, uint64_t id)
{
    uint32_t e = table_find(p, id);
    if (e == NIL) {
        return LKV_ENOTFOUND;
    }
    entry *x = &p->ents[e];
    if (x->pins == 0) {
        return LKV_EINVAL;
    }
    if (--x->pins == 0) {
        p->pinned -= x->bytes;
        track(p, e);
    }
    return 0;
}

int lkv_policy_contains(const lkv_policy *p, uint64_t id)
{
    return table_find(p, id) != NIL;
}

/* Admission weight of a resident victim or of the candidate (sketch kinds). */
static double admit_weight(const lkv_policy *p, uint64_t id, uint64_t bytes, double cost)
{
    uint32_t est = sketch_estimate(p, id);
    if (p->kind == LKV_POLICY_TLFU_GDSF) {
        double size = bytes > 0 ? (double)bytes : 1.0;
        return (double)(est > 0 ? est : 1) * cost / size;
    }
    return (double)est;
}

int lkv_policy_would_admit(const lkv_policy *p, uint64_t id, uint64_t bytes, double cost)
{
    if (bytes > p->budget - p->pinned) {
        return 0;
    }
    if (!p->sketch_kind || p->budget - p->used >= bytes) {
        return 1;
    }
    double cand = admit_weight(p, id, bytes, cost);
    uint64_t freed = p->budget - p->used;
    if (p->heap_kind) {
        /* Best-first walk of the heap's smallest entries: a tiny frontier of positions. */
        uint32_t frontier[2 * ADMIT_MAX_VICTIMS + 1];
        int nf = 0;
        if (p->heap_len > 0) {
            frontier[nf++] = 0;
        }
        for (int v = 0; v < ADMIT_MAX_VICTIMS && nf > 0; v++) {
            int best = 0;
            for (int i = 1; i < nf; i++) {
                if (heap_less(p, p->heap[frontier[i]], p->heap[frontier[best]])) {
                    best = i;
                }
            }
            uint32_t pos = frontier[best];
            frontier[best] = frontier[--nf];
            const entry *x = &p->ents[p->heap[pos]];
            if (admit_weight(p, x->id, x->bytes, x->cost) >= cand) {
                return 0;
            }
            freed += x->bytes;
            if (freed >= bytes) {
                return 1;
            }
            for (uint32_t c = 2 * pos + 1; c <= 2 * pos + 2 && c < p->heap_len; c++) {
                frontier[nf++] = c;
            }
        }
        return 0;
    }
    uint32_t e = p->tail;
    for (int v = 0; v < ADMIT_MAX_VICTIMS && e != NIL; v++) {
        const entry *x = &p->ents[e];
        if (admit_weight(p, x->id, x->bytes, x->cost) >= cand) {
            return 0;
        }
        freed += x->bytes;
        if (freed >= bytes) {
            return 1;
        }
        e = x->prev;
    }
    return 0;
}

uint64_t lkv_policy_bytes_used(const lkv_policy *p)
{
    return p->used;
}

uint64_t lkv_policy_bytes_pinned(const lkv_policy *p)
{
    return p->pinned;
}

uint64_t lkv_policy_budget(const lkv_policy *p)
{
    return p->budget;
}

uint64_t lkv_policy_count(const lkv_policy *p)
{
    return p->count;
}

uint64_t lkv_policy_evictions(const lkv_policy *p)
{
    return p->evictions;
}
