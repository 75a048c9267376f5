/*
 * lkv_prefix.h: the decode worker's prefix cache (the vLLM automatic-prefix-caching baseline of
 * bench/serving): a pool of worker pages holding KV blocks named by a hash CHAIN from position 0,
 * under a byte budget and the daemon's own eviction code (storage/lkv_policy.h).
 *
 * A prompt is cut into blocks (each document padded to whole blocks, as the paged layout stores
 * it); block b's name is h_b = chain(h_{b-1}, its tokens, whether it opens a document), with
 * h_{-1} a constant, so a block's name depends on EVERY token before it: a block is reusable only
 * where the whole prefix up to it is the same (vLLM's rule). A request looks its blocks up in
 * order and stops at the first miss (the longest cached prefix); the rest is computed, and each
 * computed block is admitted (evicting unpinned blocks in the policy's order) until one does not
 * fit, after which nothing more of that request is cached (its later blocks could never be
 * reached by a lookup). Blocks a request uses are pinned until it ends (lkv_prefix_unpin).
 * An admitted block is PENDING until its KV is written (lkv_prefix_ready; with chunked prefill a
 * document's blocks are admitted before its later chunks are computed): a lookup does not find
 * a pending block (a miss), so no request reads a block another one has not written yet.
 *
 * Pages: the pool owns n_pages worker pages first_page .. first_page + n_pages - 1 (indices of
 * the caller's page space; never touched here, the caller reads and writes the KV). The budget is
 * n_pages * page_bytes.
 *
 * Not thread-safe: one worker thread owns a pool.
 */
#ifndef LKV_PREFIX_H
#define LKV_PREFIX_H

#include <stdint.h>

typedef struct lkv_prefix lkv_prefix; /* Opaque. */

/* Pool totals. */
typedef struct lkv_prefix_stats {
    uint64_t lookups;   /* lkv_prefix_get calls. */
    uint64_t hits;      /* Of which found. */
    uint64_t admitted;  /* Blocks admitted. */
    uint64_t refused;   /* lkv_prefix_put calls refused (no unpinned room). */
    uint64_t evictions; /* Blocks evicted. */
    uint64_t blocks;    /* Blocks present now. */
    uint64_t pinned;    /* Blocks pinned now (counted once per pinned block). */
    uint64_t bytes_used;
    uint64_t budget;
} lkv_prefix_stats;

/* The chain value before the first block. */
#define LKV_PREFIX_CHAIN0 0x6c617a796b76ull

/* Name of the block after prev holding tokens[0..n) (n >= 1; borrowed); doc_start: 1 if the
 * block opens a document (so [ab][c] and [a][bc] differ). Never 0. */
uint64_t lkv_prefix_chain(uint64_t prev, const int *tokens, int n, int doc_start);

/* Creates a pool of n_pages pages (>= 1) of page_bytes, pages first_page.. of the caller's page
 * space, evicting with policy kind (enum lkv_policy_kind). Returns 0 or LKV_EINVAL. *out is the
 * caller's (lkv_prefix_destroy). */
int lkv_prefix_create(int kind, uint32_t first_page, uint32_t n_pages, uint64_t page_bytes,
                      lkv_prefix **out);

/* Frees p (NULL is fine). */
void lkv_prefix_destroy(lkv_prefix *p);

/* Looks block h up (recording the access). Found and not pending: pins it (one pin per call),
 * writes its page to *page and returns 1. Absent or pending: returns 0. */
int lkv_prefix_get(lkv_prefix *p, uint64_t h, uint32_t *page);

/* Admits block h (absent; check with lkv_prefix_get first), pinned and pending, on a free page
 * (evicting unpinned blocks as the policy chooses): returns 0 and *page. LKV_ENOSPC: no room (the
 * budget is pinned), nothing changed. LKV_EEXIST: h is present (maybe pending). */
int lkv_prefix_put(lkv_prefix *p, uint64_t h, uint32_t *page);

/* Block h's KV is written: lookups find it from now on. Returns 0 or LKV_ENOTFOUND. */
int lkv_prefix_ready(lkv_prefix *p, uint64_t h);

/* Drops one pin of h (taken by get or put). Returns 0 or LKV_ENOTFOUND / LKV_EINVAL (not
 * pinned). */
int lkv_prefix_unpin(lkv_prefix *p, uint64_t h);

/* Drops block h, which must be unpinned (a block whose KV could not be computed). Returns 0,
 * LKV_ENOTFOUND or LKV_EBUSY (pinned). */
int lkv_prefix_remove(lkv_prefix *p, uint64_t h);

/* Fills *st. */
void lkv_prefix_stats_get(const lkv_prefix *p, lkv_prefix_stats *st);

#endif
