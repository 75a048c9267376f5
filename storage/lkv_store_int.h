/*
 * lkv_store_int.h: the block store's internals, shared by its three files (SQLite btreeInt.h
 * style). Nothing outside storage/lkv_store*.c includes it; the contract is lkv_store.h.
 *
 *   lkv_store_index.c  the document index: the slot table, the key index, the content index
 *                      and the bounded "gone" set of evicted/deleted keys. Pure metadata.
 *   lkv_store_tier.c   the tier engine: pins, admit/evict/demote/promote between the hot arena
 *                      and the cold RocksDB tier, cold writes, the death and settling of docs,
 *                      and the write-back writer thread.
 *   lkv_store.c        the public API of lkv_store.h: open/close, lookups, put transactions,
 *                      reads, delete, pin, demote, foreach, stats.
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
 * while refs > 0; lkv__settle() releases what is no longer held.
 *
 * Flags and counts of a doc:
 *   hot        owns pages[] (in the arena region of its profile) and is in that region's hot
 *              policy (bytes = n_blocks * the region's page_bytes).
 *   cold       it is in the cold policy (bytes = payload bytes) and its data is in RocksDB,
 *              or being written there (cold_busy).
 *   cold_busy  a write of it to RocksDB is in flight (pinned in the cold policy meanwhile).
 *   promoting  its pages are being filled from RocksDB (pinned in both policies).
 *   hot_pins   pins held in the hot tier: user pins + readers + writer + promoter + stager.
 *   cold_pins  pins held in the cold tier: writer or write-through commit, promoter.
 *   refs       lifetime references: readers, the write-back queue, the writer, promoters.
 *
 * Pins are counted in ONE place: here, in the store (hot_pins, cold_pins, user_pins). The
 * policy only holds a doc's entry pinned (not a victim) while the store's count is above zero:
 * lkv__hot_pin / lkv__cold_pin call lkv_policy_pin on the 0 -> 1 transition and
 * lkv_policy_unpin on 1 -> 0, so the policy's own counter of a store entry is 0 or 1. Why the
 * store: it must know the counts by holder anyway (user pins make delete EBUSY and are
 * reported; any hot pin makes demote EBUSY and keeps a dead doc's pages), so a second counter
 * in the policy could only drift from it; and changing a doc's policy id (lkv__rekey) becomes
 * remove + admit + at most one pin, with no loop replaying the count. The policy's counted
 * pins stay as they are for its other user (the hit-rate simulator); lkv_policy.c is unchanged.
 *
 * Regions (DESIGN.md 4, the arena contract): the arena has one region per profile (region index
 * == profile index), each with its own page size and its own hot policy and budget, so a hot
 * doc's pages, policy entry and bytes are all its profile's region's. Only docs of configured
 * profiles (profile >= 0) are ever hot.
 *
 * Holds (lkv_store_resid.c) are the one exception: an operator hold is a pin of the policy
 * entry that no store count mirrors (the policy keeps it apart from the counted pins, so
 * lkv__hot_unpin / lkv__cold_unpin work unchanged); d->held and s->holds say what is held.
 *
 * Invariants: per region, arena pages in use = sum over its hot docs of n_blocks = its hot
 * policy bytes / its page_bytes; a policy victim is always VISIBLE with hot_pins == 0 (hot) or
 * cold_pins == 0 (cold); a VISIBLE doc is hot or cold (or both); policy entry pinned iff the
 * matching count is above zero.
 *
 * Locking: one mutex, s->mu, guards every field of lkv_store below `mu` except the immutable
 * config (cfg, profiles, n_profiles, page_bytes, arena and cold handles), every field of every
 * doc, both policies (lkv_policy is not thread-safe) and the write-back queue. Block copies of
 * puts and gets, RocksDB writes of the writer and of write-through commits, and promotion reads
 * run without it; the doc is pinned (and referenced) meanwhile, so its pages and fields that
 * the copy reads (key, n_blocks, block_bytes, pages[], tokens) do not change. The writer pins
 * hot only while it copies (s->wbuild), then writes its batch unpinned (the doc is cold_busy:
 * if it is evicted meanwhile, readers wait for the write). A hot victim not yet persisted is
 * copied into a batch under the lock (its pages go at once) and written by lkv__demote_flush
 * without it. RocksDB deletes and pending-marker deletes (small) run under it. A put handle is
 * owned by one thread; its fields need no lock. A read handle's fields are immutable after acquire.
 * The counters in st are only written under mu (lkv_store_stats_get copies them under mu).
 */
#ifndef LKV_STORE_INT_H
#define LKV_STORE_INT_H

#include <pthread.h>
#include <stdint.h>

#include "lkv_arena.h"
#include "lkv_cold.h"
#include "lkv_log.h"
#include "lkv_policy.h"
#include "lkv_store.h"

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
    lkv_dockey key;         /* Document key. */
    uint64_t pid;           /* Id in both policies (see the file comment). */
    uint64_t content_hash;  /* lkv_dockey_content_hash of (salt, tokens). */
    uint8_t fp[32];         /* Profile fingerprint. */
    int profile;            /* Index in s->profiles, or -1 if not configured. */
    int state;              /* enum doc_state. */
    uint32_t slot;          /* Index in s->slots. */
    uint32_t n_tokens;      /* Tokens. */
    uint32_t n_blocks;      /* Blocks. */
    uint64_t block_bytes;   /* Payload bytes of a block. */
    int64_t created_ms;     /* Creation time (Unix ms). */
    uint32_t *tokens;       /* Owned; present while hot (NULL for cold-only docs). */
    uint32_t *pages;        /* Owned; n_blocks arena pages while hot. */
    unsigned hot : 1;       /* See the file comment. */
    unsigned cold : 1;      /* See the file comment. */
    unsigned cold_busy : 1; /* See the file comment. */
    unsigned promoting : 1; /* See the file comment. */
    unsigned queued : 1;    /* In the write-back queue. */
    unsigned indexed : 1;   /* In the key index. */
    unsigned cindexed : 1;  /* In the content index. */
    unsigned sz_hot : 1;    /* Counted in the store's hot_docs/hot_blocks (lkv__sizes_sync). */
    unsigned sz_cold : 1;   /* Counted in the store's cold_docs/blocks/bytes (lkv__sizes_sync). */
    unsigned sz_held : 1;   /* Counted in the store's hot_bytes_held (lkv__sizes_sync). */
    uint32_t hot_pins;      /* Pins held in the hot tier (the one count; see the file comment). */
    uint32_t user_pins;     /* Of which lkv_store_pin pins. */
    uint32_t cold_pins;     /* Pins held in the cold tier. */
    uint32_t refs;          /* Lifetime references. */
    uint32_t next;          /* Key index chain (slot), or NIL. */
    uint32_t cnext;         /* Content index chain (slot), or NIL. */
    uint32_t qnext;         /* Write-back queue link (slot), or NIL. */
    /* The tenant, twice, set together by lkv_store_put_begin_ex from the same caller: tenant
     * is the residency class (the daemon's tenant slot, given in lkv_put_opts; persisted in
     * the cold record, so recovered docs keep it), acct the usage account of the caller's salt
     * (lkv_store_acct.c; runtime only: 0 for docs recovered at open). */
    uint32_t tenant; /* Tenant index (class id = tenant << 32 | profile). */
    uint16_t acct;   /* Tenant account (lkv_store_acct.c), 0 = none. */
    uint8_t acct_on; /* What that account holds of this doc (lkv_store_acct.c). */
    /* Residency (lkv_store_resid.c): the policy attributes of the doc (lkv__attrs). */
    int8_t prio;        /* -1, 0, +1. */
    unsigned held : 1;  /* An operator hold of this doc (lkv_store_hold; not persisted). */
    int64_t expires_ms; /* TTL expiry, Unix ms; 0 = none. */
    int64_t used_ms;    /* Last read (Get/Attach/pin; Unix ms), 0 = never: quota victims. */
} doc;

/* A class hold of the store (value/mask over class ids), mirrored in both policies. */
typedef struct lkv__class_hold {
    uint64_t value, mask;
} lkv__class_hold;

#define LKV__MAX_CLASS_HOLDS 16
#define LKV__CLS_DEAD        UINT64_MAX /* Class of DEAD docs' entries: no hold may match it. */

/* A bounded memory of recently evicted or deleted keys, FIFO, with a chained hash on top. */
typedef struct gone_ent {
    uint64_t h;    /* Key hash64. */
    uint32_t next; /* Chain (ring index), or NIL. */
    uint8_t cause; /* LKV_MISS_EVICTED or LKV_MISS_DELETED. */
    uint8_t used;  /* 1 if the entry holds a key. */
} gone_ent;

struct lkv_store {
    /* Immutable after open. */
    lkv_store_config cfg;         /* Copy; pointers inside are not kept. */
    lkv_profile *profiles;        /* Owned copies, finished. */
    int n_profiles;               /* Entries. */
    lkv_arena *arena;             /* Hot tier memory (thread-safe copies; alloc/free under mu). */
    lkv_cold *cold;               /* Cold tier (thread-safe). */
    uint64_t page_bytes;          /* The largest region's page size (scratch buffers). */
    struct hot_region *reg;       /* n_profiles regions, one per profile (owned). */
    lkv_stats *stats;             /* Registry of the store's stats (cfg.stats or own_stats). */
    lkv_stats *own_stats;         /* Owned registry when cfg.stats was NULL, else NULL. */
    lkv_stat_group *stats_group;  /* The store's registration (NULL until registered). */
    lkv_stat_group *region_group; /* The regions' registration (NULL until registered). */
    /* Guarded by mu. */
    pthread_mutex_t mu; /* Guards everything below. */
    pthread_cond_t cv;  /* Broadcast on commits, promotions, writer progress. */
    pthread_cond_t wcv; /* Wakes the writer. */
    pthread_t writer;   /* Write-back writer thread. */
    int writer_started; /* 1 once the thread runs (set before any other thread). */
    int stopping;       /* Close began: no new puts; the writer exits when drained. */
    /* Each region's hot policy is in reg[r].hotp (guarded by mu like everything here). */
    lkv_policy *coldp;              /* Cold policy (bytes = payload bytes). */
    uint8_t *scratch;               /* One page of host memory for demotions (CUDA arena only). */
    doc **slots;                    /* Slot table (owned, and every doc in it). */
    uint32_t n_slots;               /* Slots used (some may be NULL: free). */
    uint32_t cap_slots;             /* Slots allocated. */
    uint32_t *free_slots;           /* Free slot stack. */
    uint32_t n_free_slots;          /* Entries on the stack. */
    uint32_t cap_free_slots;        /* Entries allocated. */
    uint32_t *kidx;                 /* Key index buckets (slots), NIL = empty. */
    uint32_t kmask;                 /* Buckets - 1. */
    uint32_t kcount;                /* Docs in the key index. */
    uint32_t *cidx;                 /* Content index buckets. */
    uint32_t cmask;                 /* Buckets - 1. */
    uint32_t ccount;                /* Docs in the content index. */
    gone_ent *gone;                 /* Ring of remembered keys. */
    uint32_t *gone_b;               /* Buckets of the ring's hash (>= 2 * cap). */
    uint32_t gone_cap;              /* Ring entries. */
    uint32_t gone_pos;              /* Next ring entry to overwrite. */
    uint32_t gone_bmask;            /* Buckets - 1. */
    uint32_t q_head;                /* Write-back queue head (slot), NIL = empty. */
    uint32_t q_tail;                /* Write-back queue tail (slot), NIL = empty. */
    int writer_busy;                /* 1 while the writer holds a doc. */
    uint32_t n_unflushed;           /* wb_no_wal: docs written, waiting for the writer's flush. */
    int flush_now;                  /* lkv_store_flush asks the writer to flush at once. */
    int wb_stalled;                 /* 1 while the writer backs off a full disk (flush returns). */
    uint64_t wb_backlog;            /* Unpersisted write-back bytes (queued, written, reserved). */
    struct wb_waiter *waiters;      /* Puts waiting for backlog room (owned list, FIFO order). */
    struct demotion *demotions;     /* Built, not yet written (owned; empty whenever mu is free). */
    struct doc *wbuild;             /* The doc the writer is copying into its batch (hot-pinned). */
    struct wb_waiter *waiters_tail; /* Last waiter, or NULL. */
    uint64_t wb_failed_seen;        /* wb_failed already reported by flush/close. */
    lkv_store_stats st; /* Counters, tier sizes included (kept by lkv__sizes_sync: O(1) stats). */
    /* Residency (lkv_store_resid.c), guarded by mu. */
    lkv__class_hold holds[LKV__MAX_CLASS_HOLDS]; /* Class holds (not persisted). */
    int nholds;                                  /* Entries in holds. */
    pthread_cond_t mcv;                          /* Wakes the maintenance thread. */
    pthread_t maint;                             /* Maintenance (TTL expiry) thread. */
    int maint_started;                           /* 1 once it runs. */
    struct lkv__acct *accts; /* Per-tenant accounts (lkv_store_acct.c), NULL until the first. */
    uint32_t n_accts;        /* Accounts in use. */
};

/* A demotion whose batch is built (under the lock) and not yet written (lkv__demote_flush). */
typedef struct demotion {
    struct demotion *next; /* Next, or NULL. */
    struct doc *d;         /* The victim: cold, cold_busy, cold-pinned, referenced. */
    lkv_cold_batch *b;     /* Its finished batch (owned until written). */
    int rc;                /* The write's result. */
} demotion;

/* A put waiting for write-back backlog room (lkv_store_put_wait). */
typedef struct wb_waiter {
    struct wb_waiter *next;   /* Next waiter, or NULL. */
    void (*fn)(const void *); /* Called once with blob when there is room. */
    unsigned char blob[32];   /* The caller's copy. */
} wb_waiter;

struct lkv_store_put {
    lkv_store *s;               /* Owner. */
    uint64_t wb_reserved;       /* Backlog bytes reserved by lkv_store_put_wait (under mu). */
    lkv_dockey key;             /* The document's key. */
    doc *d;                     /* Staging doc, or NULL when the document already existed. */
    uint32_t n_blocks;          /* Blocks expected. */
    uint32_t n_tokens;          /* Tokens of the document. */
    uint64_t block_bytes;       /* Bytes of each block. */
    uint32_t next;              /* Next block index expected. */
    const lkv_profile *profile; /* Borrowed from the store. */
    /* Cold only (hot_admission = door refused it hot; lkv_store.h): d is in no tier while
     * staging, its blocks go into cbatch (owned), committed by lkv__cold_write_staged. */
    int cold_only;          /* 1: a cold-only put. */
    lkv_cold_batch *cbatch; /* Its batch (owned until commit or abort). */
    uint8_t *cbuf;          /* One block, to gather a block given in pieces (owned), or NULL. */
};

struct lkv_store_read {
    lkv_store *s;        /* Owner. */
    doc *d;              /* Referenced doc. */
    lkv_cold_snap *snap; /* Cold streaming: the snapshot; NULL when reading hot pages. */
    uint32_t *pages;     /* Hot: owned copy of the page list. */
    lkv_doc_info info;   /* Info at begin. */
};

/* One arena region: the hot tier of one profile. Fields other than hotp are immutable. */
typedef struct hot_region {
    lkv_policy *hotp;     /* Its hot policy (bytes = pages * page_bytes); guarded by mu. */
    uint64_t page_bytes;  /* Bytes of one page (the profile's block rounded up to 256 B). */
    uint64_t base_offset; /* Offset of its page 0 in the arena. */
    uint32_t n_pages;     /* Its pages. */
} hot_region;

/* ---- Per-tenant accounts (lkv_store_acct.c) ------------------------------------------------- */

#define LKV_STORE_ACCOUNTS 1024
typedef struct lkv__acct lkv__acct;
uint16_t lkv__acct_of(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES]);
void lkv__acct_sync(lkv_store *s, doc *d); /* After any change of d->hot, d->cold, d->state. */
void lkv__acct_free(lkv_store *s);

/* ---- small helpers ------------------------------------------------------------------------ */

/* The hot policy of d's region (d->profile >= 0). */
static inline lkv_policy *lkv__hotp(const lkv_store *s, const doc *d)
{
    return s->reg[d->profile].hotp;
}

/* The policy id of a committed doc of key k. */
static inline uint64_t lkv__live_pid(const lkv_dockey *k)
{
    return lkv_dockey_hash64(k) & ~STAGE_BIT;
}

/* The policy cost of an entry of bytes (config: per document or per byte). */
static inline double lkv__cost(const lkv_store *s, uint64_t bytes)
{
    return s->cfg.policy_cost_bytes ? (double)bytes : 1.0;
}

/* Bytes d takes in the hot tier (whole pages) and in the cold tier (payload). */
static inline uint64_t lkv__hot_bytes(const lkv_store *s, const doc *d)
{
    return (uint64_t)d->n_blocks * s->reg[d->profile].page_bytes;
}

static inline uint64_t lkv__cold_bytes(const doc *d)
{
    return (uint64_t)d->n_blocks * d->block_bytes;
}

int lkv__held(const lkv_store *s, const doc *d); /* lkv_store_resid.c (declared again below). */

/* Brings d's share of the tier sizes in s->st up to date after any change of its state, hot,
 * cold, cold_busy or promoting (lock held): a doc counts in hot_docs/hot_blocks while VISIBLE,
 * hot and not promoting, and in cold_docs/cold_blocks/cold_bytes while VISIBLE, cold and not
 * cold_busy (what lookups report as hot and persisted); its hot bytes count in hot_bytes_held
 * while it counts as hot and is held (so hold changes call it too: lkv_store_resid.c). So
 * lkv_store_stats_get is O(1). */
static inline void lkv__sizes_sync(lkv_store *s, doc *d)
{
    unsigned h = d->state == ST_VISIBLE && d->hot && !d->promoting;
    unsigned c = d->state == ST_VISIBLE && d->cold && !d->cold_busy;
    unsigned hh = h && lkv__held(s, d);
    if (hh != d->sz_held) {
        if (hh) {
            s->st.hot_bytes_held += lkv__hot_bytes(s, d);
        } else {
            s->st.hot_bytes_held -= lkv__hot_bytes(s, d);
        }
        d->sz_held = hh;
    }
    if (h != d->sz_hot) {
        if (h) {
            s->st.hot_docs++;
            s->st.hot_blocks += d->n_blocks;
        } else {
            s->st.hot_docs--;
            s->st.hot_blocks -= d->n_blocks;
        }
        d->sz_hot = h;
    }
    if (c != d->sz_cold) {
        if (c) {
            s->st.cold_docs++;
            s->st.cold_blocks += d->n_blocks;
            s->st.cold_bytes += lkv__cold_bytes(d);
        } else {
            s->st.cold_docs--;
            s->st.cold_blocks -= d->n_blocks;
            s->st.cold_bytes -= lkv__cold_bytes(d);
        }
        d->sz_cold = c;
    }
}

/* ---- lkv_store_index.c: every function requires s->mu (or a store no other thread sees) --- */

/* Allocates the empty indexes and the gone ring of gone_cap entries (>= 1). */
void lkv__index_init(lkv_store *s, uint32_t gone_cap);
/* Frees every doc and the indexes (at close; nothing else runs). */
void lkv__index_free(lkv_store *s);
/* A new zeroed doc in a free slot (next links NIL, profile -1). Owned by the slot table. */
doc *lkv__slot_new(lkv_store *s);
/* Frees d and its slot; d must be in no tier, no index, no queue, with refs == 0. */
void lkv__slot_free(lkv_store *s, doc *d);
/* Key index: d must not be / must be indexed. find returns the indexed doc of k, or NULL. */
void lkv__kidx_insert(lkv_store *s, doc *d);
void lkv__kidx_remove(lkv_store *s, doc *d);
doc *lkv__kidx_find(lkv_store *s, const lkv_dockey *k);
/* The doc whose policy id is pid (staging/dead ids by slot, live ids by the key index). */
doc *lkv__pid_find(lkv_store *s, uint64_t pid);
/* Content index of VISIBLE docs: insert/remove, and 1 if a doc of content hash h is in it. */
void lkv__cidx_insert(lkv_store *s, doc *d);
void lkv__cidx_remove(lkv_store *s, doc *d);
int lkv__cidx_has(lkv_store *s, uint64_t h);
/* Remembers key k as gone for cause (overwriting the oldest), and looks a cause up
 * (LKV_MISS_NEVER if not remembered). */
void lkv__gone_add(lkv_store *s, const lkv_dockey *k, int cause);
int lkv__gone_find(lkv_store *s, const lkv_dockey *k);

/* ---- lkv_store_tier.c: every function requires s->mu unless it says otherwise ------------- */

/* Takes / drops one pin of d in the hot (cold) tier; d must be in that tier's policy. */
void lkv__hot_pin(lkv_store *s, doc *d);
void lkv__hot_unpin(lkv_store *s, doc *d);
void lkv__cold_pin(lkv_store *s, doc *d);
void lkv__cold_unpin(lkv_store *s, doc *d);
/* Changes d's id in the policies it is in (keeping its pin state) from d->pid to pid. */
void lkv__rekey(lkv_store *s, doc *d, uint64_t pid);
/* Admits d (not hot) to the hot tier, evicting (demoting) victims, and takes its pages. The
 * caller pins. LKV_ENOSPC if it cannot fit, LKV_EINTERNAL on a policy id collision. */
int lkv__hot_admit(lkv_store *s, doc *d);
/* Admits d (not cold) to the cold policy, evicting cold victims, and sets d->cold. */
int lkv__cold_admit(lkv_store *s, doc *d);
/* Makes d invisible (DEAD) and remembers its key with cause (LKV_MISS_NONE: not remembered);
 * releases at once what nothing holds (sync: sync the RocksDB delete). Call lkv__settle after. */
void lkv__kill(lkv_store *s, doc *d, int cause, int sync);
/* Releases what a DEAD doc no longer needs; frees it when nothing holds it. No-op otherwise. */
void lkv__settle(lkv_store *s, doc *d);
/* Drops one lifetime reference of d, then settles it. */
void lkv__unref(lkv_store *s, doc *d);
/* Counts a corrupt block of d and drops d if it is still VISIBLE (cause LKV_MISS_CORRUPT). */
void lkv__corrupt(lkv_store *s, doc *d);
/* Takes the waiters off the list if the backlog has room (lock held); the caller calls them
 * with lkv__wb_call after unlocking. */
wb_waiter *lkv__wb_take_waiters(lkv_store *s);
void lkv__wb_call(wb_waiter *w);
/* Promotes cold-only d (VISIBLE, referenced by the caller, not promoting) to the hot tier.
 * must_hot: try even if the admission filter says no. Returns 0 with d hot and one hot pin
 * taken for the caller; LKV_ENOSPC if it cannot or should not be made hot (nothing changed);
 * LKV_ECORRUPT if its data proved corrupt or missing (counted; d is DEAD now, the caller still
 * holds its reference), LKV_ENOTFOUND if reading failed otherwise (d is DEAD too). Drops s->mu
 * while reading RocksDB. */
int lkv__promote(lkv_store *s, doc *d, int must_hot);
/* Demotes hot, unpinned, VISIBLE d out of the hot tier now (persisting it first if needed).
 * Call lkv__demote_flush after (d may be gone then). */
void lkv__demote(lkv_store *s, doc *d);
/* Writes the demotion batches hot evictions built (dropping s->mu meanwhile) and settles their
 * docs. Every caller of something that may evict from the hot tier (lkv__hot_admit,
 * lkv__demote) calls it before it lets go of s->mu for good, once what it holds is pinned. */
void lkv__demote_flush(lkv_store *s);
/* Write-back: queues committed d for the writer (takes a reference) and wakes it. */
void lkv__wb_enqueue(lkv_store *s, doc *d);
/* Write-through: persists COMMITTING d synchronously (drops s->mu during the write). Returns 0
 * with d cold, or the admit/write error with d not cold. */
int lkv__write_through(lkv_store *s, doc *d);
/* A cold-only put's commit: finishes b (owned; always consumed) with d's record and tokens,
 * admits COMMITTING d (not hot, not cold) to the cold policy and writes b (sync: fsync the WAL;
 * drops s->mu during the write). Returns 0 with d cold, or the admit/write error with d not
 * cold. */
int lkv__cold_write_staged(lkv_store *s, doc *d, lkv_cold_batch *b, int sync);
/* ---- lkv_store_resid.c: residency controls; s->mu required unless said otherwise --------- */

/* The policy attributes of d: class (LKV__CLS_DEAD when DEAD), priority, expiry. */
lkv_policy_attrs lkv__attrs(const lkv_store *s, const doc *d);
/* Applies d's id hold (if d->held and VISIBLE or STAGING) in the policy p it was just admitted
 * to. */
void lkv__hold_apply(lkv_store *s, lkv_policy *p, doc *d);
/* 1 if d is held (by an id hold or a class hold of the store). */
int lkv__held(const lkv_store *s, const doc *d);
/* Sets the residency fields of a new doc from put options (may be NULL). */
void lkv__doc_opts(doc *d, const lkv_put_opts *o, int64_t now_ms);
/* Holds existing VISIBLE d (a put with the hold option of a document already stored). */
void lkv__hold_doc(lkv_store *s, doc *d);
/* Starts / stops (after lkv__writer_stop) the maintenance thread (s->mu not held). */
void lkv__maint_start(lkv_store *s);
void lkv__maint_stop(lkv_store *s);

/* Starts the writer thread (s->mu not held; before the store is shared). */
void lkv__writer_start(lkv_store *s);
/* Tells the writer to drain the queue and exit, and joins it (s->mu not held). */
void lkv__writer_stop(lkv_store *s);

#endif
