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
 *
 * Adaptive (W-TinyLFU). Every entry of the kind carries a segment (window, probation,
 * protected) and sits, while unpinned, in its segment's intrusive LRU list; seg_bytes counts
 * each segment's bytes, pinned or not. A new id larger than the window's share (window x
 * budget) bypasses the window: lkv_policy_would_admit ran its contest against the entries
 * make_room then evicts (probation's LRU first, then protected, then the window: the bypass
 * flag makes adaptive_evict skip the window's candidate), and it joins probation. Otherwise
 * room is made one victim group at a time: if the window holds more than its share its LRU
 * entry is the candidate; if the main region is within its share the candidate joins
 * probation unopposed, otherwise the main region's LRU entries (probation first, then
 * protected) that would free as many bytes are its rivals (at most ADMIT_MAX_VICTIMS): the
 * candidate moves to the head of probation and the rivals are evicted if the candidate's
 * density (sketch estimate x cost / bytes) exceeds every rival's, otherwise the candidate is
 * evicted (cost = bytes: a TinyLFU frequency contest; cost = 1: a size-aware one, as GDSF
 * ranks). With the window within its share, the main region's LRU entry goes (then the
 * window's). While the budget is not full, window overflow moves to probation unopposed. A hit
 * in probation promotes to protected; protected over 90% of the main region demotes its LRU
 * entry to the head of probation. The hill climber (record counts requests, touch hits) moves
 * one position that sets the sketch's halving period, then the window's share
 * (set_position; see lkv_policy.h). Before the bypass, an id larger than the window entered it
 * anyway and the room it needed beyond the candidate's contest came from probation's LRU
 * unopposed: on stationary Zipf with short documents two thirds of the victims were chosen
 * that way, which cost 1 to 1.4 points against TinyLFU.
 *
 * Residency. Priority tiers -1 and +1 have their own LRU lists (low, high), outside the
 * kind's structures: a victim comes from low, else from the kind, else from high. Holds are
 * one pin each (held bit set; lease pins are counted apart). Class holds are a short table of
 * (value, mask) pairs checked at admit. Bulk operations (class holds, class eviction, expiry)
 * walk the hash table: O(n), for operators and periodic sweeps, never per request.
 */
#include "lkv_policy.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lkv_err.h"
#include "lkv_log.h"

#define NIL               UINT32_MAX
#define SKETCH_ROWS       4
#define SKETCH_MAX        65535
#define SKETCH_MIN_WIDTH  4096u
#define ADMIT_MAX_VICTIMS 8
#define SEG_WINDOW        0     /* Adaptive: admission window. */
#define SEG_PROBATION     1     /* Adaptive: main region, seen once there. */
#define SEG_PROTECTED     2     /* Adaptive: main region, hit in probation. */
#define SEG_NONE          3     /* Other kinds, and priority tiers -1 / +1. */
#define PROTECTED_SHARE   0.9   /* Protected share of the main region. */
#define HC_X0             0.0   /* Initial climber position (pure TinyLFU until it climbs). */
#define HC_SPAN           0.05  /* Positions [0, HC_SPAN] shorten the history, beyond widen... */
#define HC_STEP0          0.05  /* ... the window; initial (and restart) step of the position. */
#define HC_STEP_MIN       0.005 /* Step floor: keeps following a drifting workload. */
#define HC_DECAY          0.98  /* Step decay per sample. */
#define HC_RESTART        0.05  /* Hit-rate jump that restarts the step. */
#define HC_Z_UP           1.0   /* Keep climbing towards recency on a gain above 1 s.e.; ... */
#define HC_Z_DOWN         -1.0  /* ... towards TinyLFU unless the rate fell more than 1 s.e. */
#define HC_MIN_SAMPLE     16384 /* Requests per sample, at least (and one short history). */
#define HC_AGE            4     /* Shortest history: halving every 10 x HC_AGE x entries... */
#define HC_MIN_AGE        1024  /* ... records, at least this many. */
#define HOLD_ID           1u    /* held: operator hold of the id. */
#define HOLD_CLASS        2u    /* held: covered by a class hold. */
#define MAX_CLASS_HOLDS   16

/* An intrusive doubly linked list of entry indices: most recent at head, victim at tail. */
typedef struct dlist {
    uint32_t head; /* Most recent, or NIL. */
    uint32_t tail; /* Least recent (victim), or NIL. */
} dlist;

typedef struct class_hold {
    uint64_t value; /* Entries with (cls & mask) == value are held. */
    uint64_t mask;
} class_hold;

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
    uint64_t cls;      /* Class id (residency controls). */
    uint64_t expires;  /* Expiry in the caller's clock, 0 = never. */
    uint8_t seg;       /* SEG_* (adaptive), else SEG_NONE. */
    int8_t tier;       /* Priority -1, 0, +1. */
    uint8_t held;      /* HOLD_* bits; nonzero = one pin of the pins is the hold's. */
} entry;

struct lkv_policy {
    int kind;              /* enum lkv_policy_kind. */
    int heap_kind;         /* 1 for gdsf, lfuda, tlfu-gdsf. */
    int sketch_kind;       /* 1 for tinylfu, tlfu-gdsf. */
    uint64_t budget;       /* Bytes allowed. */
    uint64_t used;         /* Bytes admitted. */
    uint64_t pinned;       /* Bytes of pinned entries. */
    uint64_t count;        /* Entries present. */
    uint64_t evictions;    /* Victims chosen. */
    uint64_t seq;          /* Access counter. */
    double clock;          /* GDSF/LFU-DA inflation value L. */
    entry *ents;           /* Entry array, owned. */
    uint32_t ents_len;     /* Indices ever used. */
    uint32_t ents_cap;     /* Allocated entries. */
    uint32_t free_head;    /* Free-list head, or NIL. */
    uint32_t *table;       /* Hash table of entry indices (NIL = empty), owned. */
    uint32_t tmask;        /* Table size - 1 (power of two). */
    uint32_t head;         /* List head (most recent), or NIL. */
    uint32_t tail;         /* List tail (victim), or NIL. */
    uint32_t *heap;        /* Heap of entry indices, owned. */
    uint32_t heap_len;     /* Entries in the heap. */
    uint32_t heap_cap;     /* Allocated heap slots. */
    uint16_t *sketch;      /* SKETCH_ROWS x swidth counters, owned (sketch kinds). */
    uint32_t smask;        /* swidth - 1. */
    uint64_t ssamples;     /* Records since the last halving. */
    dlist low;             /* Priority -1 entries (evicted first), unpinned. */
    dlist high;            /* Priority +1 entries (evicted last), unpinned. */
    dlist seg[3];          /* Adaptive: window, probation, protected lists (unpinned). */
    uint64_t seg_bytes[3]; /* Adaptive: bytes per segment, pinned included. */
    double window;         /* Adaptive: window share of the budget, [0, 1]. */
    double hc_x;           /* Hill climber: position in [0, 1] (history, then window). */
    uint64_t hc_period;    /* Adaptive: records between sketch halvings (set by the climber). */
    int bypass;            /* Adaptive: the admit in progress skips the window. */
    double hc_step;        /* Hill climber: current step of the position. */
    double hc_dir;         /* Hill climber: +1 or -1. */
    double hc_prev;        /* Hill climber: hit rate of the previous sample, < 0 before one. */
    uint64_t hc_req;       /* Hill climber: requests (records) in this sample. */
    uint64_t hc_hits;      /* Hill climber: hits (touches) in this sample. */
    class_hold holds[MAX_CLASS_HOLDS]; /* Class holds. */
    int nholds;                        /* Entries in holds. */
};

static const char *const kind_names[LKV_POLICY__COUNT] = {"lru",     "gdsf",      "lfuda",
                                                          "tinylfu", "tlfu-gdsf", "adaptive"};

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

static void set_position(lkv_policy *p, double x);

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
    if (p->kind == LKV_POLICY_ADAPTIVE) {
        set_position(p, p->hc_x); /* The long history is 10 x the new width. */
    }
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

static void climb(lkv_policy *p);

/* Records between two halvings of the sketch: 10 x width (TinyLFU's W); for adaptive, the
 * climber's choice (hc_period, see set_position). */
static uint64_t halving_period(const lkv_policy *p)
{
    return p->kind == LKV_POLICY_ADAPTIVE ? p->hc_period : 10ull * (p->smask + 1);
}

/* Sets the adaptive climber's position x and what it controls. On [0, HC_SPAN] the window is
 * empty and the sketch's history shrinks geometrically from TinyLFU's (10 x width records
 * between halvings) at 0 to the cache's own turnover (10 x HC_AGE x entries present, at least
 * HC_MIN_AGE) at HC_SPAN; beyond, the history stays short and the window's share grows
 * linearly to 1 (LRU) at x = 1. The period is computed here, at each step, not per record. */
static void set_position(lkv_policy *p, double x)
{
    x = x < 0 ? 0 : x > 1 ? 1 : x;
    p->hc_x = x;
    p->window = x <= HC_SPAN ? 0 : (x - HC_SPAN) / (1 - HC_SPAN);
    double lng = 10.0 * (double)(p->smask + 1);
    double shrt = 10.0 * HC_AGE * (double)p->count;
    shrt = shrt < HC_MIN_AGE ? HC_MIN_AGE : shrt > lng ? lng : shrt;
    double f = x >= HC_SPAN ? 1 : x / HC_SPAN;
    p->hc_period = (uint64_t)(lng * pow(shrt / lng, f));
}

void lkv_policy_record(lkv_policy *p, uint64_t id)
{
    if (!p->sketch_kind) {
        return;
    }
    if (p->kind == LKV_POLICY_ADAPTIVE) {
        uint64_t sample = 10ull * HC_AGE * p->count; /* A move shows within the sample. */
        if (++p->hc_req >= (sample > HC_MIN_SAMPLE ? sample : HC_MIN_SAMPLE)) {
            climb(p);
        }
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
    if (++p->ssamples >= halving_period(p)) {
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

static void dl_push_head(lkv_policy *p, uint32_t *head, uint32_t *tail, uint32_t e)
{
    entry *x = &p->ents[e];
    x->prev = NIL;
    x->next = *head;
    if (*head != NIL) {
        p->ents[*head].prev = e;
    } else {
        *tail = e;
    }
    *head = e;
}

static void dl_unlink(lkv_policy *p, uint32_t *head, uint32_t *tail, uint32_t e)
{
    entry *x = &p->ents[e];
    if (x->prev != NIL) {
        p->ents[x->prev].next = x->next;
    } else {
        *head = x->next;
    }
    if (x->next != NIL) {
        p->ents[x->next].prev = x->prev;
    } else {
        *tail = x->prev;
    }
    x->prev = x->next = NIL;
}

static void list_push_head(lkv_policy *p, uint32_t e)
{
    dl_push_head(p, &p->head, &p->tail, e);
}

static void list_unlink(lkv_policy *p, uint32_t e)
{
    dl_unlink(p, &p->head, &p->tail, e);
}

static void dlist_push(lkv_policy *p, dlist *l, uint32_t e)
{
    dl_push_head(p, &l->head, &l->tail, e);
}

static void dlist_unlink(lkv_policy *p, dlist *l, uint32_t e)
{
    dl_unlink(p, &l->head, &l->tail, e);
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

/* The list of a priority tier, or NULL for tier 0 (the kind's own structure). */
static dlist *tier_list(lkv_policy *p, const entry *x)
{
    return x->tier < 0 ? &p->low : x->tier > 0 ? &p->high : NULL;
}

/* Puts an unpinned entry into its eviction structure. */
static void track(lkv_policy *p, uint32_t e)
{
    dlist *t = tier_list(p, &p->ents[e]);
    if (t != NULL) {
        dlist_push(p, t, e);
    } else if (p->heap_kind) {
        heap_push(p, e);
    } else if (p->kind == LKV_POLICY_ADAPTIVE) {
        dlist_push(p, &p->seg[p->ents[e].seg], e);
    } else {
        list_push_head(p, e);
    }
}

static void untrack(lkv_policy *p, uint32_t e)
{
    dlist *t = tier_list(p, &p->ents[e]);
    if (t != NULL) {
        dlist_unlink(p, t, e);
    } else if (p->heap_kind) {
        heap_erase(p, e);
    } else if (p->kind == LKV_POLICY_ADAPTIVE) {
        dlist_unlink(p, &p->seg[p->ents[e].seg], e);
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
    p->sketch_kind =
        kind == LKV_POLICY_TINYLFU || kind == LKV_POLICY_TLFU_GDSF || kind == LKV_POLICY_ADAPTIVE;
    p->budget = budget;
    p->free_head = NIL;
    p->head = p->tail = NIL;
    p->low.head = p->low.tail = p->high.head = p->high.tail = NIL;
    for (int i = 0; i < 3; i++) {
        p->seg[i].head = p->seg[i].tail = NIL;
    }
    p->hc_x = HC_X0;
    p->hc_step = HC_STEP0;
    p->hc_dir = 1;
    p->hc_prev = -1;
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
    if (x->seg != SEG_NONE) {
        p->seg_bytes[x->seg] -= x->bytes;
    }
    p->used -= x->bytes;
    p->count--;
    x->next = p->free_head;
    p->free_head = e;
}

/* Counts, reports and drops e, already out of its eviction structure. */
static void victim(lkv_policy *p, uint32_t e, lkv_policy_evict_fn evict, void *ctx)
{
    p->evictions++;
    if (evict != NULL) {
        evict(ctx, p->ents[e].id, p->ents[e].bytes);
    }
    drop(p, e);
}

/* ---- adaptive (W-TinyLFU) ---- */

static double window_target(const lkv_policy *p)
{
    return p->window * (double)p->budget;
}

/* Moves an entry between segments (in their lists too when it is unpinned). */
static void seg_move(lkv_policy *p, uint32_t e, uint8_t to)
{
    entry *x = &p->ents[e];
    int linked = x->pins == 0;
    if (linked) {
        dlist_unlink(p, &p->seg[x->seg], e);
    }
    p->seg_bytes[x->seg] -= x->bytes;
    x->seg = to;
    p->seg_bytes[to] += x->bytes;
    if (linked) {
        dlist_push(p, &p->seg[to], e);
    }
}

/* One step of the hill climber at the end of a sample. The direction is kept if the hit rate
 * changed by more than z standard errors of a difference of two samples, else reversed: z =
 * HC_Z_UP (+1) while climbing towards recency, which must show a clear gain, HC_Z_DOWN (-1)
 * while going back towards TinyLFU, which goes on unless it clearly loses. TinyLFU is the
 * prior: noise alone walks the position back to it. */
static void climb(lkv_policy *p)
{
    double rate = (double)p->hc_hits / (double)p->hc_req;
    if (p->hc_prev >= 0) {
        double d = rate - p->hc_prev;
        double se = sqrt(2 * rate * (1 - rate) / (double)p->hc_req);
        if (d <= (p->hc_dir > 0 ? HC_Z_UP : HC_Z_DOWN) * se) {
            p->hc_dir = -p->hc_dir;
        }
        p->hc_step = fabs(d) >= HC_RESTART ? HC_STEP0 : p->hc_step * HC_DECAY;
        p->hc_step = p->hc_step < HC_STEP_MIN ? HC_STEP_MIN : p->hc_step;
    }
    p->hc_prev = rate;
    set_position(p, p->hc_x + p->hc_dir * p->hc_step);
    p->hc_req = p->hc_hits = 0;
}

/* Admission score of an entry: sketch estimate x cost. */
static double adaptive_score(const lkv_policy *p, const entry *x)
{
    return (double)sketch_estimate(p, x->id) * x->cost;
}

/* Folds rival x into acc, the contest's running value: the largest rival density. */
static double rival_add(const lkv_policy *p, double acc, const entry *x)
{
    double d = adaptive_score(p, x) / (double)(x->bytes ? x->bytes : 1);
    return d > acc ? d : acc;
}

/* 1 if a candidate of estimate est, cost and bytes beats every rival folded into acc. */
static int wins(double est, double cost, uint64_t bytes, double acc)
{
    return est * cost / (double)(bytes ? bytes : 1) > acc;
}

/* Evicts one victim group (see the design comment). The kind has an unpinned tier-0 entry. */
static void adaptive_evict(lkv_policy *p, lkv_policy_evict_fn evict, void *ctx)
{
    uint32_t cand = p->seg[SEG_WINDOW].tail;
    if (!p->bypass && cand != NIL && (double)p->seg_bytes[SEG_WINDOW] > window_target(p)) {
        double main_share = (double)p->budget - window_target(p);
        if ((double)(p->seg_bytes[SEG_PROBATION] + p->seg_bytes[SEG_PROTECTED] +
                     p->ents[cand].bytes) <= main_share) {
            seg_move(p, cand, SEG_PROBATION); /* Main under its share: unopposed. */
            return;
        }
        uint32_t v[ADMIT_MAX_VICTIMS];
        int nv = 0;
        uint64_t freed = 0, need = p->ents[cand].bytes;
        double rivals = 0;
        for (int s = SEG_PROBATION; s <= SEG_PROTECTED && freed < need; s++) {
            for (uint32_t e = p->seg[s].tail; e != NIL && nv < ADMIT_MAX_VICTIMS && freed < need;
                 e = p->ents[e].prev) {
                v[nv++] = e;
                freed += p->ents[e].bytes;
                rivals = rival_add(p, rivals, &p->ents[e]);
            }
        }
        const entry *c = &p->ents[cand];
        if (nv > 0 && freed >= need &&
            wins((double)sketch_estimate(p, c->id), c->cost, c->bytes, rivals)) {
            seg_move(p, cand, SEG_PROBATION);
            for (int i = 0; i < nv; i++) {
                dlist_unlink(p, &p->seg[p->ents[v[i]].seg], v[i]);
                victim(p, v[i], evict, ctx);
            }
        } else {
            dlist_unlink(p, &p->seg[SEG_WINDOW], cand);
            victim(p, cand, evict, ctx);
        }
        return;
    }
    for (int s = SEG_PROBATION;; s = s == SEG_PROTECTED ? SEG_WINDOW : s + 1) {
        uint32_t e = p->seg[s].tail;
        if (e != NIL) {
            dlist_unlink(p, &p->seg[s], e);
            victim(p, e, evict, ctx);
            return;
        }
        assert(s != SEG_WINDOW); /* The caller saw an unpinned entry. */
    }
}

/* Window overflow moves to probation unopposed (the budget has room). */
static void adaptive_spill(lkv_policy *p)
{
    while ((double)p->seg_bytes[SEG_WINDOW] > window_target(p) && p->seg[SEG_WINDOW].tail != NIL) {
        seg_move(p, p->seg[SEG_WINDOW].tail, SEG_PROBATION);
    }
}

/* A hit: window and protected entries move to their head; probation is promoted. */
static void adaptive_touch(lkv_policy *p, uint32_t e)
{
    entry *x = &p->ents[e];
    if (x->seg == SEG_PROBATION) {
        seg_move(p, e, SEG_PROTECTED);
        double share = PROTECTED_SHARE * ((double)p->budget - window_target(p));
        while ((double)p->seg_bytes[SEG_PROTECTED] > share && p->seg[SEG_PROTECTED].tail != NIL) {
            seg_move(p, p->seg[SEG_PROTECTED].tail, SEG_PROBATION);
        }
    } else if (x->seg != SEG_NONE && x->pins == 0) {
        dlist_unlink(p, &p->seg[x->seg], e);
        dlist_push(p, &p->seg[x->seg], e);
    }
}

/* 1 if the kind's own structure (tier 0) has an unpinned entry. */
static int kind_has_victim(const lkv_policy *p)
{
    if (p->heap_kind) {
        return p->heap_len > 0;
    }
    if (p->kind == LKV_POLICY_ADAPTIVE) {
        return p->seg[0].tail != NIL || p->seg[1].tail != NIL || p->seg[2].tail != NIL;
    }
    return p->tail != NIL;
}

static void evict_one(lkv_policy *p, lkv_policy_evict_fn evict, void *ctx)
{
    uint32_t e;
    if (p->low.tail != NIL) {
        e = p->low.tail;
        dlist_unlink(p, &p->low, e);
    } else if (!kind_has_victim(p)) {
        assert(p->high.tail != NIL);
        e = p->high.tail;
        dlist_unlink(p, &p->high, e);
    } else if (p->kind == LKV_POLICY_ADAPTIVE) {
        adaptive_evict(p, evict, ctx);
        return;
    } else if (p->heap_kind) {
        e = p->heap[0];
        p->clock = p->ents[e].prio;
        heap_erase(p, e);
    } else {
        e = p->tail;
        list_unlink(p, e);
    }
    victim(p, e, evict, ctx);
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
    return lkv_policy_admit_ex(p, id, bytes, cost, NULL, evict, ctx);
}

static int class_held(const lkv_policy *p, uint64_t cls)
{
    for (int i = 0; i < p->nholds; i++) {
        if ((cls & p->holds[i].mask) == p->holds[i].value) {
            return 1;
        }
    }
    return 0;
}

int lkv_policy_admit_ex(lkv_policy *p, uint64_t id, uint64_t bytes, double cost,
                        const lkv_policy_attrs *a, lkv_policy_evict_fn evict, void *ctx)
{
    if (p == NULL || !(cost >= 0)) {
        return LKV_EINVAL;
    }
    if (table_find(p, id) != NIL) {
        return LKV_EEXIST;
    }
    if (p->kind == LKV_POLICY_ADAPTIVE && bytes <= p->budget - p->used) {
        adaptive_spill(p); /* Not full: no contest for the window's overflow. */
    }
    /* Adaptive: a normal-tier id larger than the window's share skips it (it won the contest
     * at the door against what make_room now evicts: probation, protected, then window LRU). */
    int bypass = p->kind == LKV_POLICY_ADAPTIVE && (a == NULL || a->prio == 0) &&
                 (double)bytes > window_target(p);
    p->bypass = bypass;
    int rc = lkv_policy_make_room(p, bytes, evict, ctx);
    p->bypass = 0;
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
    if (a != NULL) {
        x->cls = a->cls;
        x->tier = (int8_t)(a->prio < 0 ? -1 : a->prio > 0 ? 1 : 0);
        x->expires = a->expires;
    }
    x->seg = p->kind != LKV_POLICY_ADAPTIVE || x->tier != 0 ? SEG_NONE
             : bypass                                       ? SEG_PROBATION
                                                            : SEG_WINDOW;
    if (x->seg != SEG_NONE) {
        p->seg_bytes[x->seg] += bytes;
    }
    if (p->heap_kind) {
        x->prio = prio_of(p, x, freq_now(p, x));
    }
    table_insert_raw(p, e);
    p->used += bytes;
    p->count++;
    track(p, e);
    if (p->nholds > 0 && class_held(p, x->cls)) {
        x->held = HOLD_CLASS;
        rc = lkv_policy_pin(p, id);
        assert(rc == 0);
    }
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
    if (p->kind == LKV_POLICY_ADAPTIVE) {
        p->hc_hits++;
        if (x->tier == 0) {
            adaptive_touch(p, e);
            return 0;
        }
    }
    if (x->pins > 0) {
        if (p->heap_kind) {
            x->prio = prio_of(p, x, freq_now(p, x));
        }
        return 0;
    }
    dlist *t = tier_list(p, x);
    if (t != NULL) {
        dlist_unlink(p, t, e);
        dlist_push(p, t, e);
    } else if (p->heap_kind) {
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
    if (x->pins == (x->held != 0 ? 1u : 0u)) {
        return LKV_EINVAL; /* Not pinned, or only by a hold (released by lkv_policy_hold). */
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

/* Bytes the first ADMIT_MAX_VICTIMS unpinned priority -1 entries would free (they go first). */
static uint64_t low_room(const lkv_policy *p)
{
    uint64_t b = 0;
    uint32_t e = p->low.tail;
    for (int v = 0; v < ADMIT_MAX_VICTIMS && e != NIL; v++, e = p->ents[e].prev) {
        b += p->ents[e].bytes;
    }
    return b;
}

/* A new id enters the window unopposed if it fits in the window's share (the contest comes
 * when it leaves the window); a larger one bypasses the window, so it must win, as TinyLFU's
 * filter would, against the entries its admission evicts (probation LRU first, then
 * protected, then the window): density above each of theirs. */
static int adaptive_would_admit(const lkv_policy *p, uint64_t id, uint64_t need, uint64_t bytes,
                                double cost)
{
    if ((double)bytes <= window_target(p)) {
        return 1;
    }
    static const uint8_t order[3] = {SEG_PROBATION, SEG_PROTECTED, SEG_WINDOW};
    double rivals = 0;
    int v = 0;
    for (int k = 0; k < 3; k++) {
        int s = order[k];
        for (uint32_t e = p->seg[s].tail; e != NIL && v < ADMIT_MAX_VICTIMS;
             e = p->ents[e].prev, v++) {
            rivals = rival_add(p, rivals, &p->ents[e]);
            if (p->ents[e].bytes >= need) {
                return wins((double)sketch_estimate(p, id), cost, bytes, rivals);
            }
            need -= p->ents[e].bytes;
        }
    }
    return 0;
}

int lkv_policy_would_admit(const lkv_policy *p, uint64_t id, uint64_t bytes, double cost)
{
    if (bytes > p->budget - p->pinned) {
        return 0;
    }
    uint64_t freed = p->budget - p->used + low_room(p);
    if (!p->sketch_kind || freed >= bytes) {
        return 1; /* Free bytes and priority -1 entries give room unopposed. */
    }
    if (p->kind == LKV_POLICY_ADAPTIVE) {
        return adaptive_would_admit(p, id, bytes - freed, bytes, cost);
    }
    double cand = admit_weight(p, id, bytes, cost);
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

/* ---- residency controls ---- */

int lkv_policy_hold(lkv_policy *p, uint64_t id, int on)
{
    uint32_t e = p != NULL ? table_find(p, id) : NIL;
    if (e == NIL) {
        return p == NULL ? LKV_EINVAL : LKV_ENOTFOUND;
    }
    entry *x = &p->ents[e];
    int rc = 0;
    if (on && !(x->held & HOLD_ID)) {
        rc = x->held == 0 ? lkv_policy_pin(p, id) : 0;
        x->held |= HOLD_ID;
    } else if (!on && (x->held & HOLD_ID)) {
        x->held &= (uint8_t)~HOLD_ID;
        rc = x->held == 0 ? lkv_policy_unpin(p, id) : 0;
    }
    return rc;
}

/* Indices of the entries present (hash table order) into a new array; *n set. Owned by the
 * caller (free). */
static uint32_t *present(const lkv_policy *p, uint64_t *n)
{
    uint32_t *v = lkv_xmalloc((size_t)(p->count + 1) * sizeof(uint32_t));
    uint64_t k = 0;
    for (uint32_t i = 0; i <= p->tmask; i++) {
        if (p->table[i] != NIL) {
            v[k++] = p->table[i];
        }
    }
    *n = k;
    return v;
}

int lkv_policy_hold_class(lkv_policy *p, uint64_t value, uint64_t mask, int on)
{
    if (p == NULL || (value & ~mask) != 0) {
        return LKV_EINVAL;
    }
    int i = 0;
    while (i < p->nholds && !(p->holds[i].value == value && p->holds[i].mask == mask)) {
        i++;
    }
    if (on) {
        if (i < p->nholds) {
            return 0;
        }
        if (p->nholds == MAX_CLASS_HOLDS) {
            return LKV_ENOSPC;
        }
        p->holds[p->nholds++] = (class_hold){value, mask};
    } else {
        if (i == p->nholds) {
            return LKV_ENOTFOUND;
        }
        p->holds[i] = p->holds[--p->nholds];
    }
    uint64_t n;
    uint32_t *v = present(p, &n);
    for (uint64_t k = 0; k < n; k++) {
        entry *x = &p->ents[v[k]];
        if ((x->cls & mask) != value) {
            continue;
        }
        int rc = 0;
        if (on && !(x->held & HOLD_CLASS)) {
            rc = x->held == 0 ? lkv_policy_pin(p, x->id) : 0;
            x->held |= HOLD_CLASS;
        } else if (!on && (x->held & HOLD_CLASS) && !class_held(p, x->cls)) {
            x->held &= (uint8_t)~HOLD_CLASS;
            rc = x->held == 0 ? lkv_policy_unpin(p, x->id) : 0;
        }
        assert(rc == 0);
        (void)rc;
    }
    free(v);
    return 0;
}

/* Evicts the unpinned present entries for which want(x) holds; returns how many. */
static uint64_t evict_where(lkv_policy *p, int (*want)(const entry *, uint64_t, uint64_t),
                            uint64_t a, uint64_t b, lkv_policy_evict_fn evict, void *ctx)
{
    uint64_t n, gone = 0;
    uint32_t *v = present(p, &n);
    for (uint64_t k = 0; k < n; k++) {
        const entry *x = &p->ents[v[k]];
        if (x->pins == 0 && want(x, a, b)) {
            untrack(p, v[k]);
            victim(p, v[k], evict, ctx);
            gone++;
        }
    }
    free(v);
    return gone;
}

static int in_class(const entry *x, uint64_t value, uint64_t mask)
{
    return (x->cls & mask) == value;
}

static int expired(const entry *x, uint64_t now, uint64_t unused)
{
    (void)unused;
    return x->expires != 0 && x->expires <= now;
}

int lkv_policy_evict_class(lkv_policy *p, uint64_t value, uint64_t mask, lkv_policy_evict_fn evict,
                           void *ctx, uint64_t *n)
{
    if (p == NULL) {
        return LKV_EINVAL;
    }
    uint64_t k = evict_where(p, in_class, value, mask, evict, ctx);
    if (n != NULL) {
        *n = k;
    }
    return 0;
}

int lkv_policy_expire(lkv_policy *p, uint64_t now, lkv_policy_evict_fn evict, void *ctx,
                      uint64_t *n)
{
    if (p == NULL) {
        return LKV_EINVAL;
    }
    uint64_t k = evict_where(p, expired, now, 0, evict, ctx);
    if (n != NULL) {
        *n = k;
    }
    return 0;
}

double lkv_policy_window(const lkv_policy *p)
{
    return p->window;
}

uint64_t lkv_policy_entry_bytes(void)
{
    /* The table keeps load <= 1/2: 2 to 4 slots an entry; count the worst case. */
    return sizeof(entry) + 4 * sizeof(uint32_t);
}

uint64_t lkv_policy_sketch_bytes(const lkv_policy *p)
{
    return p->sketch != NULL ? (uint64_t)SKETCH_ROWS * (p->smask + 1) * sizeof(uint16_t) : 0;
}
