/*
 * lkv_store.c: the block store (contract in lkv_store.h).
 *
 * Metadata. Every document the store knows is a `doc` in the slot table (slots[]), allocated
 * with lkv_xmalloc and named by its slot number. A doc is in the key index (chained hash on the
 * key's first 8 bytes) iff its state is COMMITTING or VISIBLE, and in the content index (same,
 * on its content hash) iff VISIBLE. Its id in both policies (pid) is the key's hash64 with the
 * top bit clear while it is committed, and STAGE_BIT | slot while it is staging or dead, so a
 * dead document that readers still hold never clashes with a new one of the same key, and the
 * sketch-based policies see one stable id per document across evictions.
 *
 * States: STAGING (a put transaction owns it) -> COMMITTING (write-through only: being synced,
 * invisible) -> VISIBLE -> DEAD (deleted, evicted from both tiers or corrupt; out of the
 * indexes). A DEAD doc keeps its hot pages while anything holds a hot pin on it and its slot
 * while refs > 0; settle() releases what is no longer held.
 *
 * Flags and counts (all under s->mu):
 *   hot        owns pages[] and is in the hot policy (bytes = n_blocks * page_bytes).
 *   cold       it is in the cold policy (bytes = payload bytes) and its data is in RocksDB,
 *              or being written there (cold_busy).
 *   cold_busy  a write of it to RocksDB is in flight (pinned in the cold policy meanwhile).
 *   promoting  its pages are being filled from RocksDB (pinned in both policies).
 *   hot_pins   pins held in the hot policy: user pins + readers + writer + promoter + stager.
 *   cold_pins  pins held in the cold policy: writer or write-through commit, promoter.
 *   refs       lifetime references: readers, the write-back queue, the writer, promoters.
 *
 * Invariants: arena pages in use = sum over hot docs of n_blocks = hot policy bytes /
 * page_bytes; a policy victim is always VISIBLE with hot_pins == 0 (hot) or cold_pins == 0
 * (cold); a VISIBLE doc is hot or cold (or both).
 *
 * Locking: one mutex. Block copies of puts and gets, RocksDB writes of the writer and of
 * write-through commits, and promotion reads run without it; the doc is pinned meanwhile.
 * Demotion writes (a hot victim not yet persisted) and RocksDB deletes run under it.
 */
#include "lkv_store.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "lkv_arena.h"
#include "lkv_cold.h"
#include "lkv_log.h"
#include "lkv_policy.h"

#define NIL                    UINT32_MAX
#define STAGE_BIT              (1ull << 63)
#define DEFAULT_EVICTED_MEMORY 65536u

/* Broken invariants of the metadata are fatal (never input errors): fail loudly, also with
 * NDEBUG, rather than serve the wrong pages. */
#define MUST_OK(expr)                                                                              \
    do {                                                                                           \
        int must_rc_ = (expr);                                                                     \
        if (must_rc_ != 0) {                                                                       \
            lkv_panic("store invariant: %s: %s", #expr, lkv_strerror(must_rc_));                   \
        }                                                                                          \
    } while (0)

enum doc_state { ST_STAGING, ST_COMMITTING, ST_VISIBLE, ST_DEAD };

typedef struct doc {
    lkv_dockey key;        /* Document key. */
    uint64_t pid;          /* Id in both policies (see the file comment). */
    uint64_t content_hash; /* lkv_dockey_content_hash of (salt, tokens). */
    uint8_t fp[32];        /* Profile fingerprint. */
    int profile;           /* Index in s->profiles, or -1 if not configured. */
    int state;             /* enum doc_state. */
    uint32_t slot;         /* Index in s->slots. */
    uint32_t n_tokens;     /* Tokens. */
    uint32_t n_blocks;     /* Blocks. */
    uint64_t block_bytes;  /* Payload bytes of a block. */
    int64_t created_ms;    /* Creation time (Unix ms). */
    uint32_t *tokens;      /* Owned; present while hot (NULL for cold-only docs). */
    uint32_t *pages;       /* Owned; n_blocks arena pages while hot. */
    unsigned hot : 1;      /* See the file comment. */
    unsigned cold : 1;
    unsigned cold_busy : 1;
    unsigned promoting : 1;
    unsigned queued : 1;   /* In the write-back queue. */
    unsigned indexed : 1;  /* In the key index. */
    unsigned cindexed : 1; /* In the content index. */
    uint32_t hot_pins;     /* Pins held in the hot policy. */
    uint32_t user_pins;    /* Of which lkv_store_pin pins. */
    uint32_t cold_pins;    /* Pins held in the cold policy. */
    uint32_t refs;         /* Lifetime references. */
    uint32_t next;         /* Key index chain (slot), or NIL. */
    uint32_t cnext;        /* Content index chain (slot), or NIL. */
    uint32_t qnext;        /* Write-back queue link (slot), or NIL. */
} doc;

/* A bounded memory of recently evicted or deleted keys, FIFO, with a chained hash on top. */
typedef struct gone_ent {
    uint64_t h;    /* Key hash64. */
    uint32_t next; /* Chain (ring index), or NIL. */
    uint8_t cause; /* LKV_MISS_EVICTED or LKV_MISS_DELETED. */
    uint8_t used;  /* 1 if the entry holds a key. */
} gone_ent;

struct lkv_store {
    pthread_mutex_t mu;    /* Guards everything below except the immutable config. */
    pthread_cond_t cv;     /* Broadcast on commits, promotions, writer progress. */
    pthread_cond_t wcv;    /* Wakes the writer. */
    pthread_t writer;      /* Write-back writer thread. */
    int writer_started;    /* 1 once the thread runs. */
    int stopping;          /* Close began: no new puts; the writer exits when drained. */
    lkv_store_config cfg;  /* Copy; pointers inside are not kept. */
    lkv_profile *profiles; /* Owned copies, finished. */
    int n_profiles;        /* Entries. */
    lkv_arena *arena;      /* Hot tier memory. */
    lkv_cold *cold;        /* Cold tier. */
    lkv_policy *hotp;      /* Hot policy (bytes = pages * page_bytes). */
    lkv_policy *coldp;     /* Cold policy (bytes = payload bytes). */
    uint64_t page_bytes;   /* Arena page size. */
    uint8_t *scratch;      /* One page of host memory for demotions (CUDA arena only). */
    doc **slots;           /* Slot table. */
    uint32_t n_slots, cap_slots;
    uint32_t *free_slots; /* Free slot stack. */
    uint32_t n_free_slots, cap_free_slots;
    uint32_t *kidx;  /* Key index buckets (slots), NIL = empty. */
    uint32_t kmask;  /* Buckets - 1. */
    uint32_t kcount; /* Docs in the key index. */
    uint32_t *cidx;  /* Content index buckets. */
    uint32_t cmask;
    uint32_t ccount;
    gone_ent *gone;   /* Ring of remembered keys. */
    uint32_t *gone_b; /* Buckets of the ring's hash (2 * cap). */
    uint32_t gone_cap, gone_pos, gone_bmask;
    uint32_t q_head, q_tail; /* Write-back queue (slots), NIL = empty. */
    int writer_busy;         /* 1 while the writer holds a doc. */
    uint64_t wb_failed_seen; /* wb_failed already reported by flush/close. */
    lkv_store_stats st;      /* Counters (tier sizes are computed in stats_get). */
};

struct lkv_store_put {
    lkv_store *s;      /* Owner. */
    doc *d;            /* Staging doc, or NULL when the document already existed. */
    uint32_t n_blocks; /* Blocks expected. */
    uint32_t n_tokens; /* Tokens of the document. */
    uint64_t block_bytes;
    uint32_t next; /* Next block index expected. */
    const lkv_profile *profile;
};

struct lkv_store_read {
    lkv_store *s;        /* Owner. */
    doc *d;              /* Referenced doc. */
    lkv_cold_snap *snap; /* Cold streaming: the snapshot; NULL when reading hot pages. */
    uint32_t *pages;     /* Hot: copy of the page list. */
    lkv_doc_info info;   /* Info at begin. */
    int user_pin;        /* Internal: acquire for lkv_store_pin. */
};

/* ---- small helpers ------------------------------------------------------------------------ */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t live_pid(const lkv_dockey *k)
{
    return lkv_dockey_hash64(k) & ~STAGE_BIT;
}

static double cost_of(const lkv_store *s, uint64_t bytes)
{
    return s->cfg.policy_cost_bytes ? (double)bytes : 1.0;
}

static uint64_t hot_bytes_of(const lkv_store *s, const doc *d)
{
    return (uint64_t)d->n_blocks * s->page_bytes;
}

static uint64_t cold_bytes_of(const doc *d)
{
    return (uint64_t)d->n_blocks * d->block_bytes;
}

int lkv_hot_backend_parse(const char *s, int *out)
{
    static const char *const names[] = {"auto", "host", "cuda"};
    for (int i = 0; i < 3; i++) {
        if (s != NULL && strcmp(s, names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return LKV_EINVAL;
}

const char *lkv_hot_backend_name(int b)
{
    return b == LKV_HOT_AUTO   ? "auto"
           : b == LKV_HOT_HOST ? "host"
           : b == LKV_HOT_CUDA ? "cuda"
                               : "unknown";
}

int lkv_durability_parse(const char *s, int *out)
{
    if (s != NULL && strcmp(s, "write-back") == 0) {
        *out = LKV_DURABILITY_WRITE_BACK;
        return 0;
    }
    if (s != NULL && strcmp(s, "write-through") == 0) {
        *out = LKV_DURABILITY_WRITE_THROUGH;
        return 0;
    }
    return LKV_EINVAL;
}

const char *lkv_durability_name(int m)
{
    return m == LKV_DURABILITY_WRITE_BACK      ? "write-back"
           : m == LKV_DURABILITY_WRITE_THROUGH ? "write-through"
                                               : "unknown";
}

const char *lkv_miss_cause_name(int c)
{
    static const char *const names[LKV_MISS__COUNT] = {"none", "never", "evicted", "deleted",
                                                       "profile"};
    return c >= 0 && c < LKV_MISS__COUNT ? names[c] : "unknown";
}

/* ---- slots and indexes -------------------------------------------------------------------- */

static doc *slot_new(lkv_store *s)
{
    uint32_t id;
    if (s->n_free_slots > 0) {
        id = s->free_slots[--s->n_free_slots];
    } else {
        if (s->n_slots == s->cap_slots) {
            s->cap_slots = s->cap_slots ? s->cap_slots * 2 : 256;
            s->slots = lkv_xrealloc(s->slots, sizeof(doc *) * s->cap_slots);
        }
        id = s->n_slots++;
    }
    doc *d = lkv_xcalloc(1, sizeof *d);
    d->slot = id;
    d->next = d->cnext = d->qnext = NIL;
    d->profile = -1;
    s->slots[id] = d;
    return d;
}

static void slot_free(lkv_store *s, doc *d)
{
    assert(!d->hot && !d->cold && !d->indexed && !d->cindexed && d->refs == 0 && !d->queued);
    s->slots[d->slot] = NULL;
    if (s->n_free_slots == s->cap_free_slots) {
        s->cap_free_slots = s->cap_free_slots ? s->cap_free_slots * 2 : 256;
        s->free_slots = lkv_xrealloc(s->free_slots, sizeof(uint32_t) * s->cap_free_slots);
    }
    s->free_slots[s->n_free_slots++] = d->slot;
    free(d->tokens);
    free(d->pages);
    free(d);
}

static void kidx_link(lkv_store *s, doc *d)
{
    uint32_t b = (uint32_t)lkv_dockey_hash64(&d->key) & s->kmask;
    d->next = s->kidx[b];
    s->kidx[b] = d->slot;
}

static void kidx_insert(lkv_store *s, doc *d)
{
    assert(!d->indexed);
    if (s->kcount + 1 > s->kmask + 1) {
        uint32_t nb = (s->kmask + 1) * 2;
        free(s->kidx);
        s->kidx = lkv_xmalloc(sizeof(uint32_t) * nb);
        memset(s->kidx, 0xff, sizeof(uint32_t) * nb);
        s->kmask = nb - 1;
        for (uint32_t i = 0; i < s->n_slots; i++) {
            if (s->slots[i] != NULL && s->slots[i]->indexed) {
                kidx_link(s, s->slots[i]);
            }
        }
    }
    kidx_link(s, d);
    d->indexed = 1;
    s->kcount++;
}

static void kidx_remove(lkv_store *s, doc *d)
{
    assert(d->indexed);
    uint32_t *p = &s->kidx[(uint32_t)lkv_dockey_hash64(&d->key) & s->kmask];
    while (*p != d->slot) {
        assert(*p != NIL);
        p = &s->slots[*p]->next;
    }
    *p = d->next;
    d->next = NIL;
    d->indexed = 0;
    s->kcount--;
}

static doc *kidx_find(lkv_store *s, const lkv_dockey *k)
{
    for (uint32_t i = s->kidx[(uint32_t)lkv_dockey_hash64(k) & s->kmask]; i != NIL;
         i = s->slots[i]->next) {
        if (memcmp(s->slots[i]->key.b, k->b, LKV_DOCKEY_BYTES) == 0) {
            return s->slots[i];
        }
    }
    return NULL;
}

static doc *pid_find(lkv_store *s, uint64_t pid)
{
    if (pid & STAGE_BIT) {
        uint64_t slot = pid & ~STAGE_BIT;
        return slot < s->n_slots ? s->slots[slot] : NULL;
    }
    for (uint32_t i = s->kidx[(uint32_t)pid & s->kmask]; i != NIL; i = s->slots[i]->next) {
        if (s->slots[i]->pid == pid) {
            return s->slots[i];
        }
    }
    return NULL;
}

static void cidx_link(lkv_store *s, doc *d)
{
    uint32_t b = (uint32_t)d->content_hash & s->cmask;
    d->cnext = s->cidx[b];
    s->cidx[b] = d->slot;
}

static void cidx_insert(lkv_store *s, doc *d)
{
    assert(!d->cindexed);
    if (s->ccount + 1 > s->cmask + 1) {
        uint32_t nb = (s->cmask + 1) * 2;
        free(s->cidx);
        s->cidx = lkv_xmalloc(sizeof(uint32_t) * nb);
        memset(s->cidx, 0xff, sizeof(uint32_t) * nb);
        s->cmask = nb - 1;
        for (uint32_t i = 0; i < s->n_slots; i++) {
            if (s->slots[i] != NULL && s->slots[i]->cindexed) {
                cidx_link(s, s->slots[i]);
            }
        }
    }
    cidx_link(s, d);
    d->cindexed = 1;
    s->ccount++;
}

static void cidx_remove(lkv_store *s, doc *d)
{
    assert(d->cindexed);
    uint32_t *p = &s->cidx[(uint32_t)d->content_hash & s->cmask];
    while (*p != d->slot) {
        assert(*p != NIL);
        p = &s->slots[*p]->cnext;
    }
    *p = d->cnext;
    d->cnext = NIL;
    d->cindexed = 0;
    s->ccount--;
}

static int cidx_has(lkv_store *s, uint64_t h)
{
    for (uint32_t i = s->cidx[(uint32_t)h & s->cmask]; i != NIL; i = s->slots[i]->cnext) {
        if (s->slots[i]->content_hash == h) {
            return 1;
        }
    }
    return 0;
}

/* Remembers key k as gone for cause. */
static void gone_add(lkv_store *s, const lkv_dockey *k, int cause)
{
    gone_ent *e = &s->gone[s->gone_pos];
    if (e->used) {
        uint32_t *p = &s->gone_b[(uint32_t)e->h & s->gone_bmask];
        while (*p != s->gone_pos) {
            assert(*p != NIL);
            p = &s->gone[*p].next;
        }
        *p = e->next;
    }
    e->h = lkv_dockey_hash64(k);
    e->cause = (uint8_t)cause;
    e->used = 1;
    uint32_t b = (uint32_t)e->h & s->gone_bmask;
    e->next = s->gone_b[b];
    s->gone_b[b] = s->gone_pos;
    s->gone_pos = (s->gone_pos + 1) % s->gone_cap;
}

/* Returns the remembered cause of k, or LKV_MISS_NEVER. */
static int gone_find(lkv_store *s, const lkv_dockey *k)
{
    uint64_t h = lkv_dockey_hash64(k);
    for (uint32_t i = s->gone_b[(uint32_t)h & s->gone_bmask]; i != NIL; i = s->gone[i].next) {
        if (s->gone[i].h == h) {
            return s->gone[i].cause;
        }
    }
    return LKV_MISS_NEVER;
}

/* ---- tier movement ------------------------------------------------------------------------ */

static void hot_evict_cb(void *ctx, uint64_t id, uint64_t bytes);
static void cold_evict_cb(void *ctx, uint64_t id, uint64_t bytes);
static void settle(lkv_store *s, doc *d);

static void hot_pin(lkv_store *s, doc *d)
{
    MUST_OK(lkv_policy_pin(s->hotp, d->pid));
    d->hot_pins++;
}

static void hot_unpin(lkv_store *s, doc *d)
{
    assert(d->hot_pins > 0);
    MUST_OK(lkv_policy_unpin(s->hotp, d->pid));
    d->hot_pins--;
}

static void cold_pin(lkv_store *s, doc *d)
{
    MUST_OK(lkv_policy_pin(s->coldp, d->pid));
    d->cold_pins++;
}

static void cold_unpin(lkv_store *s, doc *d)
{
    assert(d->cold_pins > 0);
    MUST_OK(lkv_policy_unpin(s->coldp, d->pid));
    d->cold_pins--;
}

/* Changes d's id in the policies it is in (keeping pins) from d->pid to pid. */
static void rekey(lkv_store *s, doc *d, uint64_t pid)
{
    if (d->pid == pid) {
        return;
    }
    if (d->hot) {
        uint64_t b = hot_bytes_of(s, d);
        MUST_OK(lkv_policy_remove(s->hotp, d->pid));
        MUST_OK(lkv_policy_admit(s->hotp, pid, b, cost_of(s, b), NULL, NULL));
        for (uint32_t i = 0; i < d->hot_pins; i++) {
            MUST_OK(lkv_policy_pin(s->hotp, pid));
        }
    }
    if (d->cold) {
        uint64_t b = cold_bytes_of(d);
        MUST_OK(lkv_policy_remove(s->coldp, d->pid));
        MUST_OK(lkv_policy_admit(s->coldp, pid, b, cost_of(s, b), NULL, NULL));
        for (uint32_t i = 0; i < d->cold_pins; i++) {
            MUST_OK(lkv_policy_pin(s->coldp, pid));
        }
    }
    d->pid = pid;
}

/* Admits d (not hot) to the hot tier, evicting victims, and takes its pages. The caller pins. */
static int hot_admit(lkv_store *s, doc *d)
{
    uint64_t b = hot_bytes_of(s, d);
    int rc = lkv_policy_admit(s->hotp, d->pid, b, cost_of(s, b), hot_evict_cb, s);
    if (rc == LKV_EEXIST) {
        LKV_LOGE("store: policy id collision (pid %llx)", (unsigned long long)d->pid);
        return LKV_EINTERNAL;
    }
    if (rc != 0) {
        return rc;
    }
    if (d->pages == NULL) {
        d->pages = lkv_xmalloc(sizeof(uint32_t) * d->n_blocks);
    }
    MUST_OK(lkv_arena_alloc(s->arena, d->n_blocks, d->pages)); /* The budget is the arena. */
    d->hot = 1;
    return 0;
}

/* Drops d from the hot tier (not from inside a hot eviction callback). */
static void hot_release(lkv_store *s, doc *d)
{
    assert(d->hot && d->hot_pins == 0);
    MUST_OK(lkv_policy_remove(s->hotp, d->pid));
    lkv_arena_free(s->arena, d->n_blocks, d->pages);
    d->hot = 0;
    free(d->tokens);
    d->tokens = NULL;
}

/* Builds d's write batch from its hot pages and commits it. d must be hot and pinned (or the
 * lock held). scratch: one page of host memory when the arena is not host-mapped. */
static int write_doc(lkv_store *s, doc *d, int sync, uint8_t *scratch)
{
    lkv_cold_batch *b = lkv_cold_batch_create();
    for (uint32_t i = 0; i < d->n_blocks; i++) {
        const void *p = lkv_arena_host_ptr(s->arena, d->pages[i]);
        if (p == NULL) {
            int rc = lkv_arena_read(s->arena, d->pages[i], scratch, d->block_bytes);
            if (rc != 0) {
                lkv_cold_batch_free(b);
                return rc;
            }
            p = scratch;
        }
        lkv_cold_batch_block(b, &d->key, i, p, d->block_bytes);
    }
    lkv_cold_doc meta;
    memset(&meta, 0, sizeof meta);
    meta.key = d->key;
    memcpy(meta.fingerprint, d->fp, 32);
    meta.content_hash = d->content_hash;
    meta.n_tokens = d->n_tokens;
    meta.n_blocks = d->n_blocks;
    meta.block_bytes = (uint32_t)d->block_bytes;
    meta.created_ms = d->created_ms;
    return lkv_cold_batch_commit(s->cold, b, &meta, d->tokens, sync);
}

/* Admits d to the cold policy (evicting cold victims) and sets d->cold. */
static int cold_admit(lkv_store *s, doc *d)
{
    uint64_t b = cold_bytes_of(d);
    assert(!d->cold);
    int rc = lkv_policy_admit(s->coldp, d->pid, b, cost_of(s, b), cold_evict_cb, s);
    if (rc == LKV_EEXIST) {
        return LKV_EINTERNAL;
    }
    if (rc == 0) {
        d->cold = 1;
    }
    return rc;
}

/* Undoes cold_admit after a failed write (d->cold_pins == 0). */
static void cold_unadmit(lkv_store *s, doc *d)
{
    assert(d->cold && d->cold_pins == 0);
    MUST_OK(lkv_policy_remove(s->coldp, d->pid));
    d->cold = 0;
    /* A dead doc of the same key may have left its data for this one (see cold_drop): with
     * this write failed, nobody owns it. Best effort. */
    doc *owner = kidx_find(s, &d->key);
    if (owner == NULL || !owner->cold) {
        lkv_cold_delete(s->cold, &d->key, 0);
    }
}

/* Removes d from the cold tier: its RocksDB data and (unless called from the cold policy's
 * eviction callback) its cold policy entry. Deletes are synced only for a caller's delete in
 * write-through mode (sync): a lost eviction delete just brings a document back. */
static void cold_drop(lkv_store *s, doc *d, int from_cb, int sync)
{
    assert(d->cold && d->cold_pins == 0);
    /* A dead doc's data may be dropped late (after its last reader or write). If a newer doc
     * of the same key is in the cold tier meanwhile, the RocksDB data under the key is that
     * doc's now (same key, same content): keep it. */
    doc *owner = kidx_find(s, &d->key);
    if (owner == NULL || owner == d || !owner->cold) {
        int rc = lkv_cold_delete(s->cold, &d->key, sync);
        if (rc != 0) {
            LKV_LOGW("store: deleting a document from RocksDB failed: %s", lkv_strerror(rc));
        }
    }
    if (!from_cb) {
        MUST_OK(lkv_policy_remove(s->coldp, d->pid));
    }
    d->cold = 0;
}

/* Makes d invisible (DEAD) and remembers its key with cause. Releases at once what nothing
 * holds (sync: sync the RocksDB delete); the rest goes in settle(). Never called on a hot doc
 * from inside a hot eviction callback (only cold-only docs die there). */
static void kill_doc(lkv_store *s, doc *d, int cause, int sync)
{
    if (d->state == ST_DEAD) {
        return;
    }
    if (d->hot && d->hot_pins == 0 && !d->promoting) {
        hot_release(s, d);
    }
    if (d->cold && d->cold_pins == 0) {
        cold_drop(s, d, 0, sync);
    }
    if (d->indexed) {
        kidx_remove(s, d);
    }
    if (d->cindexed) {
        cidx_remove(s, d);
    }
    if (cause != LKV_MISS_NONE) {
        gone_add(s, &d->key, cause);
    }
    d->state = ST_DEAD;
    /* Entries still held (pinned) in a policy move to a private id, so that a new document of
     * the same key can be admitted meanwhile. */
    rekey(s, d, STAGE_BIT | d->slot);
}

/* Releases what a DEAD doc no longer needs; frees it when nothing holds it. */
static void settle(lkv_store *s, doc *d)
{
    if (d->state != ST_DEAD) {
        return;
    }
    if (d->hot && d->hot_pins == 0 && !d->promoting) {
        hot_release(s, d);
    }
    if (d->cold && d->cold_pins == 0) {
        cold_drop(s, d, 0, 0);
    }
    if (!d->hot && !d->cold && d->refs == 0 && !d->queued) {
        slot_free(s, d);
    }
}

static void unref(lkv_store *s, doc *d)
{
    assert(d->refs > 0);
    d->refs--;
    settle(s, d);
}

/* Hot victim: demote to the cold tier if not there yet, then the policy drops it. */
static void hot_evict_cb(void *ctx, uint64_t id, uint64_t bytes)
{
    lkv_store *s = ctx;
    doc *d = pid_find(s, id);
    (void)bytes;
    assert(d != NULL);
    assert(d->hot && d->hot_pins == 0);
    assert(d->state == ST_VISIBLE);
    s->st.evictions_hot++;
    if (!d->cold) {
        int rc = cold_admit(s, d);
        if (rc == 0) {
            rc = write_doc(s, d, 0, s->scratch);
            if (rc != 0) {
                cold_unadmit(s, d);
            }
        }
        if (rc == 0) {
            s->st.demotions++;
        } else {
            s->st.drops++;
            LKV_LOGD("store: hot victim dropped (cold tier: %s)", lkv_strerror(rc));
        }
    }
    lkv_arena_free(s->arena, d->n_blocks, d->pages);
    d->hot = 0;
    free(d->tokens);
    d->tokens = NULL;
    if (!d->cold) {
        kill_doc(s, d, LKV_MISS_EVICTED, 0);
        settle(s, d);
    }
}

/* Cold victim: delete its RocksDB data; a doc not also hot leaves the store. */
static void cold_evict_cb(void *ctx, uint64_t id, uint64_t bytes)
{
    lkv_store *s = ctx;
    doc *d = pid_find(s, id);
    (void)bytes;
    assert(d != NULL);
    assert(d->cold && d->cold_pins == 0);
    assert(d->state == ST_VISIBLE);
    s->st.evictions_cold++;
    cold_drop(s, d, 1, 0);
    if (!d->hot) {
        kill_doc(s, d, LKV_MISS_EVICTED, 0);
        settle(s, d);
    }
}

/* ---- open / close ------------------------------------------------------------------------- */

static void *writer_main(void *arg);

static int scan_cb(void *ctx, const lkv_cold_doc *m)
{
    lkv_store *s = ctx;
    if (kidx_find(s, &m->key) != NULL) {
        return 0;
    }
    doc *d = slot_new(s);
    d->key = m->key;
    d->pid = live_pid(&m->key);
    d->content_hash = m->content_hash;
    memcpy(d->fp, m->fingerprint, 32);
    d->profile = lkv_profile_find_fp(s->profiles, s->n_profiles, m->fingerprint);
    if (d->profile >= 0 && lkv_block_bytes(&s->profiles[d->profile].shape) != m->block_bytes) {
        d->profile = -1;
    }
    d->n_tokens = m->n_tokens;
    d->n_blocks = m->n_blocks;
    d->block_bytes = m->block_bytes;
    d->created_ms = m->created_ms;
    d->state = ST_VISIBLE;
    kidx_insert(s, d);
    cidx_insert(s, d);
    if (cold_admit(s, d) != 0) {
        /* Larger than the whole cold budget: delete it. */
        s->st.evictions_cold++;
        lkv_cold_delete(s->cold, &d->key, 0);
        kill_doc(s, d, LKV_MISS_EVICTED, 0);
        settle(s, d);
    }
    return 0;
}

static int bad_config(const char *what)
{
    LKV_LOGE("store config: %s", what);
    return LKV_ECONFIG;
}

int lkv_store_open(const lkv_store_config *cfg, lkv_store **out)
{
    lkv_store *s;
    char err[160];
    int rc;
    uint64_t max_block = 0;

    *out = NULL;
    if (cfg == NULL || cfg->data_dir == NULL || cfg->data_dir[0] == '\0') {
        return bad_config("data_dir is not set");
    }
    if (cfg->profiles == NULL || cfg->n_profiles < 1) {
        return bad_config("no model profiles");
    }
    if (cfg->hot_backend < LKV_HOT_AUTO || cfg->hot_backend > LKV_HOT_CUDA) {
        return bad_config("hot_backend is not auto, host or cuda");
    }
    if (cfg->durability != LKV_DURABILITY_WRITE_BACK &&
        cfg->durability != LKV_DURABILITY_WRITE_THROUGH) {
        return bad_config("durability is not write-back or write-through");
    }
    if (cfg->policy_kind < 0 || cfg->policy_kind >= LKV_POLICY__COUNT) {
        return bad_config("policy_kind is unknown");
    }
    s = lkv_xcalloc(1, sizeof *s);
    s->cfg = *cfg;
    s->cfg.data_dir = NULL;
    s->cfg.profiles = NULL;
    s->n_profiles = cfg->n_profiles;
    s->profiles = lkv_xmalloc(sizeof(lkv_profile) * (size_t)cfg->n_profiles);
    memcpy(s->profiles, cfg->profiles, sizeof(lkv_profile) * (size_t)cfg->n_profiles);
    for (int i = 0; i < s->n_profiles; i++) {
        if (lkv_profile_finish(&s->profiles[i], err, sizeof err) != 0) {
            LKV_LOGE("store config: profile %d (%.*s): %s", i, LKV_PROFILE_NAME_MAX,
                     s->profiles[i].name, err);
            rc = LKV_ECONFIG;
            goto fail_early;
        }
        if (lkv_profile_find(s->profiles, i, s->profiles[i].name) >= 0) {
            LKV_LOGE("store config: duplicate profile name %s", s->profiles[i].name);
            rc = LKV_ECONFIG;
            goto fail_early;
        }
        uint64_t bb = lkv_block_bytes(&s->profiles[i].shape);
        max_block = bb > max_block ? bb : max_block;
    }
    s->page_bytes = lkv_arena_page_size(max_block);
    uint64_t n_pages = cfg->hot_bytes / s->page_bytes;
    if (n_pages < 1 || n_pages > LKV_REF_MAX_PAGE + 1ull) {
        LKV_LOGE("store config: hot_bytes %llu gives %llu pages of %llu bytes (1..%u allowed)",
                 (unsigned long long)cfg->hot_bytes, (unsigned long long)n_pages,
                 (unsigned long long)s->page_bytes, LKV_REF_MAX_PAGE + 1u);
        rc = LKV_ECONFIG;
        goto fail_early;
    }
    if (mkdir(cfg->data_dir, 0700) != 0 && errno != EEXIST) {
        LKV_LOGE("store: mkdir %s: %s", cfg->data_dir, strerror(errno));
        rc = LKV_EIO;
        goto fail_early;
    }
    rc = lkv_arena_create(cfg->hot_backend, cfg->cuda_device, s->page_bytes, (uint32_t)n_pages,
                          &s->arena);
    if (rc != 0) {
        goto fail_early;
    }
    rc = lkv_cold_open(cfg->data_dir, cfg->cold_min_blob_bytes, &s->cold);
    if (rc != 0) {
        lkv_arena_destroy(s->arena);
        goto fail_early;
    }
    const char *fault = getenv("LKV_FAULT_COLD_WRITES");
    if (fault != NULL) {
        lkv_cold_fault_writes(s->cold, atoi(fault));
    }
    MUST_OK(lkv_policy_create(cfg->policy_kind, n_pages * s->page_bytes, &s->hotp));
    MUST_OK(lkv_policy_create(cfg->policy_kind, cfg->cold_bytes ? cfg->cold_bytes : UINT64_MAX,
                              &s->coldp));
    if (lkv_arena_backend(s->arena) != LKV_ARENA_HOST) {
        s->scratch = lkv_xmalloc(s->page_bytes);
    }
    s->kmask = 1023;
    s->kidx = lkv_xmalloc(sizeof(uint32_t) * 1024);
    memset(s->kidx, 0xff, sizeof(uint32_t) * 1024);
    s->cmask = 1023;
    s->cidx = lkv_xmalloc(sizeof(uint32_t) * 1024);
    memset(s->cidx, 0xff, sizeof(uint32_t) * 1024);
    s->gone_cap = cfg->evicted_memory ? cfg->evicted_memory : DEFAULT_EVICTED_MEMORY;
    s->gone = lkv_xcalloc(s->gone_cap, sizeof(gone_ent));
    uint32_t nb = 1;
    while (nb < 2 * s->gone_cap) {
        nb *= 2;
    }
    s->gone_bmask = nb - 1;
    s->gone_b = lkv_xmalloc(sizeof(uint32_t) * nb);
    memset(s->gone_b, 0xff, sizeof(uint32_t) * nb);
    s->q_head = s->q_tail = NIL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->wcv, NULL);

    uint64_t n_corrupt = 0;
    pthread_mutex_lock(&s->mu);
    rc = lkv_cold_scan(s->cold, scan_cb, s, &n_corrupt);
    s->st.corrupt_blocks += n_corrupt;
    pthread_mutex_unlock(&s->mu);
    if (rc != 0) {
        lkv_store_close(s);
        return rc;
    }
    if (pthread_create(&s->writer, NULL, writer_main, s) != 0) {
        lkv_panic("store: cannot start the writer thread");
    }
    s->writer_started = 1;
    LKV_LOGI("store: open %s: hot %s %llu pages x %llu B, cold %llu docs (budget %llu B), "
             "%s, %s, %d profiles",
             cfg->data_dir, lkv_arena_backend(s->arena) == LKV_ARENA_HOST ? "host" : "cuda",
             (unsigned long long)n_pages, (unsigned long long)s->page_bytes,
             (unsigned long long)lkv_policy_count(s->coldp), (unsigned long long)cfg->cold_bytes,
             lkv_durability_name(cfg->durability), lkv_policy_name(cfg->policy_kind),
             s->n_profiles);
    *out = s;
    return 0;

fail_early:
    free(s->profiles);
    free(s);
    return rc;
}

int lkv_store_close(lkv_store *s)
{
    int rc = 0;
    if (s == NULL) {
        return 0;
    }
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->wcv);
    pthread_mutex_unlock(&s->mu);
    if (s->writer_started) {
        pthread_join(s->writer, NULL);
    }
    if (s->st.wb_failed != s->wb_failed_seen) {
        rc = LKV_EIO;
    }
    if (s->st.puts_inflight || s->st.reads_inflight) {
        LKV_LOGW("store: closing with %llu puts and %llu reads still open",
                 (unsigned long long)s->st.puts_inflight, (unsigned long long)s->st.reads_inflight);
    }
    for (uint32_t i = 0; i < s->n_slots; i++) {
        doc *d = s->slots[i];
        if (d != NULL) {
            free(d->tokens);
            free(d->pages);
            free(d);
        }
    }
    lkv_cold_close(s->cold);
    lkv_arena_destroy(s->arena);
    lkv_policy_destroy(s->hotp);
    lkv_policy_destroy(s->coldp);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->wcv);
    pthread_mutex_destroy(&s->mu);
    free(s->slots);
    free(s->free_slots);
    free(s->kidx);
    free(s->cidx);
    free(s->gone);
    free(s->gone_b);
    free(s->scratch);
    free(s->profiles);
    free(s);
    return rc;
}

/* ---- write-back writer -------------------------------------------------------------------- */

static void *writer_main(void *arg)
{
    lkv_store *s = arg;
    uint8_t *scratch = s->scratch ? lkv_xmalloc(s->page_bytes) : NULL;

    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->q_head == NIL && !s->stopping) {
            pthread_cond_wait(&s->wcv, &s->mu);
        }
        if (s->q_head == NIL) {
            break;
        }
        doc *d = s->slots[s->q_head];
        s->q_head = d->qnext;
        if (s->q_head == NIL) {
            s->q_tail = NIL;
        }
        d->qnext = NIL;
        d->queued = 0;
        if (d->state != ST_VISIBLE || !d->hot || d->cold || d->cold_busy) {
            s->st.wb_pending--;
            unref(s, d);
            pthread_cond_broadcast(&s->cv);
            continue;
        }
        int rc = cold_admit(s, d);
        if (rc != 0) {
            s->st.wb_pending--;
            s->st.wb_failed++;
            LKV_LOGW("store: write-back skipped a document: cold tier %s", lkv_strerror(rc));
            unref(s, d);
            pthread_cond_broadcast(&s->cv);
            continue;
        }
        cold_pin(s, d);
        d->cold_busy = 1;
        hot_pin(s, d);
        s->writer_busy = 1;
        pthread_mutex_unlock(&s->mu);

        rc = write_doc(s, d, 0, scratch);

        pthread_mutex_lock(&s->mu);
        s->writer_busy = 0;
        cold_unpin(s, d);
        d->cold_busy = 0;
        if (rc != 0) {
            cold_unadmit(s, d);
            s->st.wb_failed++;
            LKV_LOGW("store: write-back of a document failed: %s", lkv_strerror(rc));
        } else {
            s->st.wb_persisted++;
        }
        s->st.wb_pending--;
        hot_unpin(s, d);
        unref(s, d);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    free(scratch);
    return NULL;
}

int lkv_store_flush(lkv_store *s)
{
    pthread_mutex_lock(&s->mu);
    pthread_cond_broadcast(&s->wcv);
    while (s->q_head != NIL || s->writer_busy) {
        pthread_cond_wait(&s->cv, &s->mu);
    }
    int rc = s->st.wb_failed != s->wb_failed_seen ? LKV_EIO : 0;
    s->wb_failed_seen = s->st.wb_failed;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- profiles, info, lookups -------------------------------------------------------------- */

int lkv_store_profile_count(const lkv_store *s)
{
    return s->n_profiles;
}

const lkv_profile *lkv_store_profile_at(const lkv_store *s, int i)
{
    return i >= 0 && i < s->n_profiles ? &s->profiles[i] : NULL;
}

const lkv_profile *lkv_store_profile_find(const lkv_store *s, const char *name)
{
    int i = name ? lkv_profile_find(s->profiles, s->n_profiles, name) : -1;
    return i >= 0 ? &s->profiles[i] : NULL;
}

/* ---- refusal reasons (lkv_store_why) ------------------------------------------------------ */

static _Thread_local char tl_why[512]; /* This thread's last refusal reason ("" if none). */

const char *lkv_store_why(void)
{
    return tl_why;
}

static int why(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Records which check refused the call and why, and returns rc. */
static int why(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_why, sizeof(tl_why), fmt, ap);
    va_end(ap);
    return rc;
}

/* n bytes as "18 MiB" when a whole number of MiB, else "N bytes" (into buf, returned). */
static const char *fmt_bytes(uint64_t n, char *buf, size_t len)
{
    if (n >= (1u << 20) && n % (1u << 20) == 0) {
        snprintf(buf, len, "%" PRIu64 " MiB", n >> 20);
    } else {
        snprintf(buf, len, "%" PRIu64 " bytes", n);
    }
    return buf;
}

int lkv_store_profile_get(const lkv_store *s, const char *name, const lkv_profile **out)
{
    tl_why[0] = '\0';
    *out = NULL;
    if (name == NULL || name[0] == '\0') {
        return why(LKV_EPROFILE, "profile is empty (a model profile name is required)");
    }
    const lkv_profile *p = lkv_store_profile_find(s, name);
    if (p == NULL) {
        char known[384];
        size_t n = 0;
        known[0] = '\0';
        for (int i = 0; i < s->n_profiles && n < sizeof(known); i++) {
            int w =
                snprintf(known + n, sizeof(known) - n, "%s%s", i ? ", " : "", s->profiles[i].name);
            n += w > 0 ? (size_t)w : 0;
        }
        return why(LKV_EPROFILE, "unknown profile '%.64s' (known: %s)", name, known);
    }
    *out = p;
    return 0;
}

static void fill_info(lkv_store *s, const doc *d, lkv_doc_info *o)
{
    memset(o, 0, sizeof *o);
    o->present = 1;
    o->tier = d->hot && !d->promoting ? LKV_TIER_HOT : LKV_TIER_COLD;
    o->miss_cause = LKV_MISS_NONE;
    o->n_tokens = d->n_tokens;
    o->n_blocks = d->n_blocks;
    o->block_bytes = d->block_bytes;
    o->profile = d->profile >= 0 ? &s->profiles[d->profile] : NULL;
    o->persisted = d->cold && !d->cold_busy;
    o->pins = d->user_pins;
}

static void miss_info(lkv_doc_info *o, int cause)
{
    memset(o, 0, sizeof *o);
    o->miss_cause = cause;
}

/* Looks key up, counts, fills *o. mismatch_hash: content hash to test for a profile mismatch,
 * or 0 for none; miss_blocks: blocks to count on a miss. */
static void lookup_locked(lkv_store *s, const lkv_dockey *k, uint64_t content, uint32_t mblocks,
                          lkv_doc_info *o)
{
    doc *d = kidx_find(s, k);
    uint64_t pid = live_pid(k);
    lkv_policy_record(s->hotp, pid);
    lkv_policy_record(s->coldp, pid);
    if (d != NULL && d->state == ST_VISIBLE && d->profile >= 0) {
        fill_info(s, d, o);
        if (o->tier == LKV_TIER_HOT) {
            s->st.hits_hot++;
            s->st.hit_blocks_hot += d->n_blocks;
        } else {
            s->st.hits_cold++;
            s->st.hit_blocks_cold += d->n_blocks;
        }
        return;
    }
    int cause;
    if (d != NULL && d->state == ST_VISIBLE) {
        cause = LKV_MISS_PROFILE;
    } else {
        cause = gone_find(s, k);
        if (cause == LKV_MISS_NEVER && content != 0 && cidx_has(s, content)) {
            cause = LKV_MISS_PROFILE;
        }
    }
    miss_info(o, cause);
    s->st.misses++;
    s->st.miss_blocks += mblocks;
    s->st.misses_by_cause[cause]++;
}

int lkv_store_lookup(lkv_store *s, const lkv_dockey *keys, uint32_t n, lkv_doc_info *out)
{
    if (n > 0 && (keys == NULL || out == NULL)) {
        return LKV_EINVAL;
    }
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < n; i++) {
        lookup_locked(s, &keys[i], 0, 0, &out[i]);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int lkv_store_lookup_tokens(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], const char *profile,
                            const uint32_t *tokens, uint32_t n_tokens, lkv_dockey *key_out,
                            lkv_doc_info *out)
{
    const lkv_profile *p = lkv_store_profile_find(s, profile);
    lkv_dockey k;
    if (p == NULL) {
        return LKV_EPROFILE;
    }
    if (salt == NULL || out == NULL || (tokens == NULL && n_tokens > 0)) {
        return LKV_EINVAL;
    }
    lkv_dockey_compute(salt, p->fingerprint, tokens, n_tokens, &k);
    uint64_t content = lkv_dockey_content_hash(salt, tokens, n_tokens);
    uint32_t blocks = lkv_blocks_for_tokens(&p->shape, n_tokens);
    pthread_mutex_lock(&s->mu);
    lookup_locked(s, &k, content ? content : 1, blocks, out);
    pthread_mutex_unlock(&s->mu);
    if (key_out != NULL) {
        *key_out = k;
    }
    return 0;
}

int lkv_store_tier(lkv_store *s, const lkv_dockey *key)
{
    lkv_doc_info info;
    int tier = LKV_TIER_NONE;
    pthread_mutex_lock(&s->mu);
    doc *d = kidx_find(s, key);
    if (d != NULL && d->state == ST_VISIBLE && d->profile >= 0) {
        fill_info(s, d, &info);
        tier = d->promoting ? LKV_TIER_COLD : info.tier;
    }
    pthread_mutex_unlock(&s->mu);
    return tier;
}

/* ---- puts --------------------------------------------------------------------------------- */

int lkv_store_put_begin(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], const char *profile,
                        const uint32_t *tokens, uint32_t n_tokens, lkv_store_put **out,
                        lkv_dockey *key_out, int *exists)
{
    const lkv_profile *p;
    lkv_dockey k;
    int rc;

    *out = NULL;
    rc = lkv_store_profile_get(s, profile, &p);
    if (rc != 0) {
        return rc;
    }
    if (salt == NULL) {
        return why(LKV_EINVAL, "no tenant salt");
    }
    rc = lkv_profile_check_tokens(p, tokens, n_tokens, tl_why, (int)sizeof(tl_why));
    if (rc != 0) {
        return rc;
    }
    lkv_dockey_compute(salt, p->fingerprint, tokens, n_tokens, &k);
    uint32_t n_blocks = lkv_blocks_for_tokens(&p->shape, n_tokens);
    uint64_t block_bytes = lkv_block_bytes(&p->shape);

    lkv_store_put *tx = lkv_xcalloc(1, sizeof *tx);
    tx->s = s;
    tx->n_blocks = n_blocks;
    tx->n_tokens = n_tokens;
    tx->block_bytes = block_bytes;
    tx->profile = p;

    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        rc = why(LKV_ESHUTDOWN, "the store is closing (the daemon is shutting down)");
        goto fail;
    }
    doc *e = kidx_find(s, &k);
    if (e != NULL && e->state == ST_VISIBLE) {
        s->st.puts_inflight++;
        pthread_mutex_unlock(&s->mu);
        if (exists != NULL) {
            *exists = 1;
        }
        if (key_out != NULL) {
            *key_out = k;
        }
        *out = tx;
        return 0;
    }
    char b1[32], b2[32], b3[32];
    if ((uint64_t)n_blocks * s->page_bytes > lkv_policy_budget(s->hotp)) {
        rc = why(LKV_ENOSPC,
                 "the document needs %" PRIu32 " hot pages of %s (%s), more than the whole hot "
                 "budget of %" PRIu64 " pages (%s): raise hot_bytes",
                 n_blocks, fmt_bytes(s->page_bytes, b1, sizeof(b1)),
                 fmt_bytes((uint64_t)n_blocks * s->page_bytes, b2, sizeof(b2)),
                 lkv_policy_budget(s->hotp) / s->page_bytes,
                 fmt_bytes(lkv_policy_budget(s->hotp), b3, sizeof(b3)));
        goto fail;
    }
    if (s->cfg.durability == LKV_DURABILITY_WRITE_THROUGH &&
        (uint64_t)n_blocks * block_bytes > lkv_policy_budget(s->coldp)) {
        rc = why(LKV_ENOSPC,
                 "the document is %s, more than the whole cold budget of %s (write-through "
                 "puts must fit the cold tier): raise cold_bytes",
                 fmt_bytes((uint64_t)n_blocks * block_bytes, b1, sizeof(b1)),
                 fmt_bytes(lkv_policy_budget(s->coldp), b2, sizeof(b2)));
        goto fail;
    }
    doc *d = slot_new(s);
    d->key = k;
    d->pid = STAGE_BIT | d->slot;
    d->content_hash = lkv_dockey_content_hash(salt, tokens, n_tokens);
    memcpy(d->fp, p->fingerprint, 32);
    d->profile = (int)(p - s->profiles);
    d->state = ST_STAGING;
    d->n_tokens = n_tokens;
    d->n_blocks = n_blocks;
    d->block_bytes = block_bytes;
    d->created_ms = now_ms();
    rc = hot_admit(s, d);
    if (rc != 0) {
        slot_free(s, d);
        if (rc == LKV_ENOSPC) {
            why(rc,
                "no room for the document: it needs %" PRIu32 " hot pages of %s (%s) and what "
                "is not free of the %" PRIu64 " pages (%s) is pinned or being written (retry "
                "later, or raise hot_bytes)",
                n_blocks, fmt_bytes(s->page_bytes, b1, sizeof(b1)),
                fmt_bytes((uint64_t)n_blocks * s->page_bytes, b2, sizeof(b2)),
                lkv_policy_budget(s->hotp) / s->page_bytes,
                fmt_bytes(lkv_policy_budget(s->hotp), b3, sizeof(b3)));
        }
        goto fail;
    }
    hot_pin(s, d);
    d->tokens = lkv_xmalloc(sizeof(uint32_t) * n_tokens);
    memcpy(d->tokens, tokens, sizeof(uint32_t) * n_tokens);
    s->st.puts_inflight++;
    pthread_mutex_unlock(&s->mu);
    tx->d = d;
    if (exists != NULL) {
        *exists = 0;
    }
    if (key_out != NULL) {
        *key_out = k;
    }
    *out = tx;
    return 0;

fail:
    pthread_mutex_unlock(&s->mu);
    free(tx);
    return rc;
}

uint32_t lkv_store_put_n_blocks(const lkv_store_put *tx)
{
    return tx->n_blocks;
}

uint64_t lkv_store_put_block_bytes(const lkv_store_put *tx)
{
    return tx->block_bytes;
}

/* Returns 1 if the token slots past valid in every slab of block data are zero. */
static int tail_is_zero(const lkv_kv_shape *sh, const uint8_t *data, uint32_t valid)
{
    size_t row = (size_t)sh->head_dim * lkv_dtype_size(sh->dtype);
    size_t slab = lkv_slab_bytes(sh);
    size_t n_slabs = (size_t)sh->n_layers * 2u * (size_t)sh->n_kv_heads;
    for (size_t i = 0; i < n_slabs; i++) {
        const uint8_t *p = data + i * slab + (size_t)valid * row;
        size_t len = slab - (size_t)valid * row;
        if (len > 0 && (p[0] != 0 || memcmp(p, p + 1, len - 1) != 0)) {
            return 0;
        }
    }
    return 1;
}

int lkv_store_put_block(lkv_store_put *tx, uint32_t index, const void *data, size_t len)
{
    tl_why[0] = '\0';
    if (tx == NULL) {
        return why(LKV_EINVAL, "block %" PRIu32 ": no put", index);
    }
    if (index >= tx->n_blocks) {
        return why(LKV_EINVAL,
                   "block index %" PRIu32 " out of range: the document has %" PRIu32
                   " blocks (index 0..%" PRIu32 ")",
                   index, tx->n_blocks, tx->n_blocks - 1);
    }
    if (index != tx->next) {
        return why(LKV_EINVAL,
                   "block index %" PRIu32 " out of order: expected index %" PRIu32
                   " (blocks go in order, each once)",
                   index, tx->next);
    }
    if (len != tx->block_bytes) {
        const lkv_kv_shape *sh = &tx->profile->shape;
        return why(LKV_EINVAL,
                   "block %" PRIu32 " is %zu bytes, expected %" PRIu64
                   " (profile '%s': %d layers x 2 x %d kv heads x %d tokens x %d dims x %zu "
                   "bytes)",
                   index, len, tx->block_bytes, tx->profile->name, sh->n_layers, sh->n_kv_heads,
                   sh->block_tokens, sh->head_dim, lkv_dtype_size(sh->dtype));
    }
    if (data == NULL) {
        return why(LKV_EINVAL, "block %" PRIu32 ": no data", index);
    }
    if (index == tx->n_blocks - 1) {
        uint32_t bt = (uint32_t)tx->profile->shape.block_tokens;
        uint32_t valid = tx->n_tokens - index * bt;
        if (valid < bt && !tail_is_zero(&tx->profile->shape, data, valid)) {
            return why(LKV_EINVAL,
                       "block %" PRIu32 ": the token slots past the document's end (token %" PRIu32
                       " on) must be zero",
                       index, tx->n_tokens);
        }
    }
    if (tx->d != NULL) {
        int rc = lkv_arena_write(tx->s->arena, tx->d->pages[index], data, len);
        if (rc != 0) {
            return rc;
        }
    }
    tx->next++;
    return 0;
}

/* Drops a staging (or committing) doc of a put that does not become visible. Lock held. */
static void discard_locked(lkv_store *s, doc *d)
{
    if (d->indexed) {
        kidx_remove(s, d);
    }
    d->state = ST_DEAD;
    hot_unpin(s, d);
    rekey(s, d, STAGE_BIT | d->slot);
    settle(s, d);
    pthread_cond_broadcast(&s->cv);
}

void lkv_store_put_abort(lkv_store_put *tx)
{
    if (tx == NULL) {
        return;
    }
    lkv_store *s = tx->s;
    pthread_mutex_lock(&s->mu);
    if (tx->d != NULL) {
        discard_locked(s, tx->d);
    }
    s->st.puts_aborted++;
    s->st.puts_inflight--;
    pthread_mutex_unlock(&s->mu);
    free(tx);
}

/* Makes the staged doc d visible (lock held). */
static void publish_locked(lkv_store *s, doc *d)
{
    d->state = ST_VISIBLE;
    if (!d->indexed) {
        kidx_insert(s, d);
    }
    cidx_insert(s, d);
    hot_unpin(s, d);
    s->st.puts++;
    pthread_cond_broadcast(&s->cv);
}

int lkv_store_put_commit(lkv_store_put *tx)
{
    lkv_store *s = tx->s;
    doc *d = tx->d;
    int rc = 0;

    tl_why[0] = '\0';
    if (tx->next != tx->n_blocks) {
        why(LKV_EINVAL,
            "Put ended after %" PRIu32 " of %" PRIu32 " blocks (%" PRIu32
            " tokens in blocks of %d)",
            tx->next, tx->n_blocks, tx->n_tokens, tx->profile->shape.block_tokens);
        lkv_store_put_abort(tx);
        return LKV_EINVAL;
    }
    pthread_mutex_lock(&s->mu);
    s->st.puts_inflight--;
    if (d == NULL) {
        s->st.puts_existing++;
        goto out;
    }
    for (;;) {
        doc *e = kidx_find(s, &d->key);
        if (e == NULL) {
            break;
        }
        if (e->state == ST_VISIBLE) {
            /* Committed by someone else meanwhile: keep theirs. */
            discard_locked(s, d);
            s->st.puts_existing++;
            goto out;
        }
        /* Another write-through commit of the same key is syncing: wait for its outcome. */
        pthread_cond_wait(&s->cv, &s->mu);
    }
    rc = lkv_policy_contains(s->hotp, live_pid(&d->key)) ? LKV_EINTERNAL : 0;
    if (rc != 0) {
        LKV_LOGE("store: policy id collision at commit");
        discard_locked(s, d);
        s->st.puts_aborted++;
        goto out;
    }
    rekey(s, d, live_pid(&d->key));
    if (s->cfg.durability == LKV_DURABILITY_WRITE_BACK) {
        publish_locked(s, d);
        d->queued = 1;
        d->refs++;
        if (s->q_tail == NIL) {
            s->q_head = d->slot;
        } else {
            s->slots[s->q_tail]->qnext = d->slot;
        }
        s->q_tail = d->slot;
        s->st.wb_pending++;
        pthread_cond_signal(&s->wcv);
        goto out;
    }
    /* Write-through: reserve the key, sync the batch without the lock, then publish. */
    d->state = ST_COMMITTING;
    kidx_insert(s, d);
    rc = cold_admit(s, d);
    if (rc != 0) {
        discard_locked(s, d);
        s->st.puts_aborted++;
        goto out;
    }
    cold_pin(s, d);
    d->cold_busy = 1;
    pthread_mutex_unlock(&s->mu);
    uint8_t *scratch = s->scratch ? lkv_xmalloc(s->page_bytes) : NULL;
    rc = write_doc(s, d, 1, scratch);
    free(scratch);
    pthread_mutex_lock(&s->mu);
    cold_unpin(s, d);
    d->cold_busy = 0;
    if (rc != 0) {
        cold_unadmit(s, d);
        discard_locked(s, d);
        s->st.puts_aborted++;
        goto out;
    }
    publish_locked(s, d);
out:
    pthread_mutex_unlock(&s->mu);
    free(tx);
    return rc;
}

int lkv_store_put_all(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], const char *profile,
                      const uint32_t *tokens, uint32_t n_tokens, const void *blocks, size_t len,
                      lkv_dockey *key_out)
{
    lkv_store_put *tx;
    int rc = lkv_store_put_begin(s, salt, profile, tokens, n_tokens, &tx, key_out, NULL);
    if (rc != 0) {
        return rc;
    }
    uint64_t bb = tx->block_bytes;
    if (blocks == NULL || len != (uint64_t)tx->n_blocks * bb) {
        lkv_store_put_abort(tx);
        return LKV_EINVAL;
    }
    for (uint32_t i = 0; i < tx->n_blocks; i++) {
        rc = lkv_store_put_block(tx, i, (const uint8_t *)blocks + i * bb, bb);
        if (rc != 0) {
            lkv_store_put_abort(tx);
            return rc;
        }
    }
    return lkv_store_put_commit(tx);
}

/* ---- reads -------------------------------------------------------------------------------- */

/* Deletes a visible doc found corrupt (lock held). */
static void corrupt_locked(lkv_store *s, doc *d)
{
    s->st.corrupt_blocks++;
    if (d->state == ST_VISIBLE) {
        LKV_LOGW("store: dropping a document with a corrupt block");
        kill_doc(s, d, LKV_MISS_DELETED, 0);
        settle(s, d);
    }
}

/* Fills a promoting doc's pages from RocksDB (no lock; d is pinned and referenced). */
static int promote_read(lkv_store *s, doc *d, lkv_cold_snap *snap, uint32_t **tokens)
{
    lkv_cold_doc meta;
    int rc = lkv_cold_get_doc(s->cold, snap, &d->key, &meta, tokens);
    if (rc != 0) {
        return rc;
    }
    if (meta.n_blocks != d->n_blocks || meta.block_bytes != d->block_bytes ||
        meta.n_tokens != d->n_tokens) {
        return LKV_ECORRUPT;
    }
    uint8_t *scratch = NULL;
    for (uint32_t i = 0; i < d->n_blocks && rc == 0; i++) {
        void *p = lkv_arena_host_ptr(s->arena, d->pages[i]);
        if (p == NULL) {
            if (scratch == NULL) {
                scratch = lkv_xmalloc(d->block_bytes);
            }
            rc = lkv_cold_get_block(s->cold, snap, &d->key, i, scratch, d->block_bytes);
            if (rc == 0) {
                rc = lkv_arena_write(s->arena, d->pages[i], scratch, d->block_bytes);
            }
        } else {
            rc = lkv_cold_get_block(s->cold, snap, &d->key, i, p, d->block_bytes);
        }
    }
    free(scratch);
    return rc;
}

/* Finds key and takes a read reference: hot (pinned; promoting a cold doc if the budget
 * allows, or must_hot) or cold (a snapshot). Fills rd. */
static int acquire(lkv_store *s, const lkv_dockey *key, int must_hot, lkv_store_read *rd)
{
    pthread_mutex_lock(&s->mu);
    doc *d;
    for (;;) {
        d = kidx_find(s, key);
        if (d == NULL || d->state != ST_VISIBLE) {
            pthread_mutex_unlock(&s->mu);
            return LKV_ENOTFOUND;
        }
        if (d->profile < 0) {
            pthread_mutex_unlock(&s->mu);
            return LKV_EPROFILE;
        }
        if (!d->promoting) {
            break;
        }
        pthread_cond_wait(&s->cv, &s->mu);
    }
    int promoted = 0;
    rd->s = s;
    rd->d = d;
    d->refs++;
    if (d->hot) {
        lkv_policy_touch(s->hotp, d->pid);
        hot_pin(s, d);
        goto hot;
    }
    assert(d->cold);
    lkv_policy_touch(s->coldp, d->pid);
    uint64_t hb = hot_bytes_of(s, d);
    int rc = LKV_ENOSPC;
    if (hb <= lkv_policy_budget(s->hotp) &&
        (must_hot || lkv_policy_would_admit(s->hotp, d->pid, hb, cost_of(s, hb)))) {
        /* Pinned in the cold tier first, so that demotions making room cannot evict it. */
        cold_pin(s, d);
        rc = hot_admit(s, d);
        if (rc != 0) {
            cold_unpin(s, d);
        }
    }
    if (rc != 0) {
        if (must_hot) {
            unref(s, d);
            pthread_mutex_unlock(&s->mu);
            return rc;
        }
        rd->snap = lkv_cold_snap_create(s->cold);
        fill_info(s, d, &rd->info);
        s->st.reads_inflight++;
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    hot_pin(s, d);
    d->promoting = 1;
    lkv_cold_snap *snap = lkv_cold_snap_create(s->cold);
    pthread_mutex_unlock(&s->mu);

    uint32_t *tokens = NULL;
    rc = promote_read(s, d, snap, &tokens);

    pthread_mutex_lock(&s->mu);
    lkv_cold_snap_release(s->cold, snap);
    d->promoting = 0;
    cold_unpin(s, d);
    settle(s, d); /* If it was deleted meanwhile, its RocksDB data can go now. */
    pthread_cond_broadcast(&s->cv);
    if (rc != 0) {
        free(tokens);
        if (rc == LKV_ECORRUPT || rc == LKV_ENOTFOUND) {
            /* A missing record or block of a visible document is lost data: counted as such. */
            corrupt_locked(s, d);
        } else if (d->state == ST_VISIBLE) {
            LKV_LOGW("store: promotion failed: %s; dropping the document", lkv_strerror(rc));
            kill_doc(s, d, LKV_MISS_DELETED, 0);
        }
        hot_unpin(s, d);
        unref(s, d); /* DEAD now: settle releases its pages, its RocksDB data and the slot. */
        pthread_mutex_unlock(&s->mu);
        return LKV_ENOTFOUND;
    }
    if (d->state == ST_VISIBLE && !d->cold) {
        /* Cannot happen (pinned), kept for clarity: a promoted doc stays persisted. */
        assert(0);
    }
    free(d->tokens);
    d->tokens = tokens;
    s->st.promotions++;
    promoted = 1;
hot:
    rd->pages = lkv_xmalloc(sizeof(uint32_t) * d->n_blocks);
    memcpy(rd->pages, d->pages, sizeof(uint32_t) * d->n_blocks);
    fill_info(s, d, &rd->info);
    if (promoted) {
        rd->info.tier = LKV_TIER_COLD; /* Where it was found. */
        rd->info.promoted = 1;
    }
    s->st.reads_inflight++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static void release(lkv_store_read *rd)
{
    lkv_store *s = rd->s;
    pthread_mutex_lock(&s->mu);
    if (rd->snap != NULL) {
        lkv_cold_snap_release(s->cold, rd->snap);
    } else {
        hot_unpin(s, rd->d);
    }
    s->st.reads_inflight--;
    unref(s, rd->d);
    pthread_mutex_unlock(&s->mu);
    free(rd->pages);
}

int lkv_store_get_begin(lkv_store *s, const lkv_dockey *key, lkv_store_read **out,
                        lkv_doc_info *info)
{
    lkv_store_read *rd = lkv_xcalloc(1, sizeof *rd);
    *out = NULL;
    int rc = acquire(s, key, 0, rd);
    if (rc != 0) {
        free(rd);
        return rc;
    }
    if (info != NULL) {
        *info = rd->info;
    }
    *out = rd;
    return 0;
}

int lkv_store_get_block(lkv_store_read *rd, uint32_t index, void *buf, size_t len)
{
    doc *d = rd->d;
    if (index >= rd->info.n_blocks || buf == NULL || len < rd->info.block_bytes) {
        return LKV_EINVAL;
    }
    if (rd->snap == NULL) {
        return lkv_arena_read(rd->s->arena, rd->pages[index], buf, rd->info.block_bytes);
    }
    int rc = lkv_cold_get_block(rd->s->cold, rd->snap, &d->key, index, buf, rd->info.block_bytes);
    if (rc == LKV_ECORRUPT || rc == LKV_ENOTFOUND) {
        pthread_mutex_lock(&rd->s->mu);
        if (rc == LKV_ENOTFOUND) {
            LKV_LOGW("store: a block of a visible document is missing from RocksDB");
        }
        corrupt_locked(rd->s, d); /* Counted and dropped either way. */
        pthread_mutex_unlock(&rd->s->mu);
        return LKV_ECORRUPT;
    }
    return rc;
}

const lkv_doc_info *lkv_store_get_info(const lkv_store_read *rd)
{
    return &rd->info;
}

const uint32_t *lkv_store_get_pages(const lkv_store_read *rd)
{
    return rd->snap == NULL ? rd->pages : NULL;
}

void lkv_store_get_end(lkv_store_read *rd)
{
    if (rd == NULL) {
        return;
    }
    release(rd);
    free(rd);
}

int lkv_store_get_all(lkv_store *s, const lkv_dockey *key, void *buf, size_t len,
                      lkv_doc_info *info)
{
    lkv_store_read *rd;
    lkv_doc_info in;
    int rc = lkv_store_get_begin(s, key, &rd, &in);
    if (rc != 0) {
        return rc;
    }
    if (info != NULL) {
        *info = in;
    }
    if (buf == NULL || len < (uint64_t)in.n_blocks * in.block_bytes) {
        lkv_store_get_end(rd);
        return LKV_EINVAL;
    }
    for (uint32_t i = 0; i < in.n_blocks && rc == 0; i++) {
        rc = lkv_store_get_block(rd, i, (uint8_t *)buf + (uint64_t)i * in.block_bytes,
                                 in.block_bytes);
    }
    lkv_store_get_end(rd);
    return rc;
}

/* ---- delete, pins, demote, foreach -------------------------------------------------------- */

int lkv_store_delete(lkv_store *s, const lkv_dockey *key)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    doc *d = kidx_find(s, key);
    if (d == NULL || d->state != ST_VISIBLE) {
        rc = LKV_ENOTFOUND;
    } else if (d->user_pins > 0) {
        rc = LKV_EBUSY;
    } else {
        kill_doc(s, d, LKV_MISS_DELETED, s->cfg.durability == LKV_DURABILITY_WRITE_THROUGH);
        settle(s, d);
        s->st.deletes++;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int lkv_store_pin(lkv_store *s, const lkv_dockey *key, uint32_t *pages, uint32_t pages_cap,
                  lkv_doc_info *info)
{
    lkv_store_read rd;
    memset(&rd, 0, sizeof rd);
    int rc = acquire(s, key, 1, &rd);
    if (rc != 0) {
        return rc;
    }
    pthread_mutex_lock(&s->mu);
    if (rd.d->state != ST_VISIBLE) {
        pthread_mutex_unlock(&s->mu);
        release(&rd);
        return LKV_ENOTFOUND;
    }
    rd.d->user_pins++;
    hot_pin(s, rd.d);
    rd.info.pins = rd.d->user_pins;
    pthread_mutex_unlock(&s->mu);
    if (pages != NULL) {
        uint32_t n = rd.info.n_blocks < pages_cap ? rd.info.n_blocks : pages_cap;
        memcpy(pages, rd.pages, sizeof(uint32_t) * n);
    }
    if (info != NULL) {
        *info = rd.info;
    }
    release(&rd);
    return 0;
}

int lkv_store_unpin(lkv_store *s, const lkv_dockey *key)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    doc *d = kidx_find(s, key);
    if (d == NULL || d->state != ST_VISIBLE) {
        rc = LKV_ENOTFOUND;
    } else if (d->user_pins == 0) {
        rc = LKV_EINVAL;
    } else {
        d->user_pins--;
        hot_unpin(s, d);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int lkv_store_demote(lkv_store *s, const lkv_dockey *key)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    doc *d = kidx_find(s, key);
    if (d == NULL || d->state != ST_VISIBLE || !d->hot) {
        rc = LKV_ENOTFOUND;
    } else if (d->hot_pins > 0 || d->promoting) {
        rc = LKV_EBUSY;
    } else {
        /* The eviction callback does the work; then the policy entry goes. */
        uint64_t pid = d->pid;
        hot_evict_cb(s, pid, hot_bytes_of(s, d));
        MUST_OK(lkv_policy_remove(s->hotp, pid));
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int lkv_store_foreach(lkv_store *s, lkv_store_foreach_fn fn, void *ctx)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < s->n_slots && rc == 0; i++) {
        doc *d = s->slots[i];
        if (d != NULL && d->state == ST_VISIBLE) {
            lkv_doc_info in;
            fill_info(s, d, &in);
            rc = fn(ctx, &d->key, &in);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- introspection ------------------------------------------------------------------------ */

void lkv_store_stats_get(lkv_store *s, lkv_store_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->hot_docs = out->hot_blocks = out->cold_docs = out->cold_blocks = out->cold_bytes = 0;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        doc *d = s->slots[i];
        if (d == NULL || d->state != ST_VISIBLE) {
            continue;
        }
        if (d->hot && !d->promoting) {
            out->hot_docs++;
            out->hot_blocks += d->n_blocks;
        }
        if (d->cold && !d->cold_busy) {
            out->cold_docs++;
            out->cold_blocks += d->n_blocks;
            out->cold_bytes += cold_bytes_of(d);
        }
    }
    out->hot_bytes = lkv_policy_bytes_used(s->hotp);
    out->hot_bytes_pinned = lkv_policy_bytes_pinned(s->hotp);
    out->hot_budget = lkv_policy_budget(s->hotp);
    out->hot_page_bytes = s->page_bytes;
    out->hot_pages_total = lkv_arena_pages_total(s->arena);
    out->hot_pages_free = lkv_arena_pages_free(s->arena);
    out->cold_budget = lkv_policy_budget(s->coldp);
    pthread_mutex_unlock(&s->mu);
}

void lkv_store_arena_info_get(lkv_store *s, lkv_store_arena_info *out)
{
    memset(out, 0, sizeof *out);
    out->backend = lkv_arena_backend(s->arena) == LKV_ARENA_HOST ? LKV_HOT_HOST : LKV_HOT_CUDA;
    out->shm_name = lkv_arena_shm_name(s->arena);
    out->page_bytes = s->page_bytes;
    out->n_pages = lkv_arena_pages_total(s->arena);
    out->cuda_device = lkv_arena_cuda_device(s->arena);
    lkv_arena_cuda_ipc_handle(s->arena, out->cuda_ipc);
}

void lkv_store_fault_cold_writes(lkv_store *s, int n)
{
    lkv_cold_fault_writes(s->cold, n);
}
