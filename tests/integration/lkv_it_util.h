/*
 * lkv_it_util.h: shared helpers of the C integration tests: the test profile, deterministic
 * documents (token ids and block payloads derived from a seed, so that a test can re-derive what
 * it put from the seed alone), and a client connected to a harness daemon.
 *
 * The test profile "itest" (passed to lazykvd with --set, see LKV_IT_PROFILE_ARGS): 2 layers,
 * 4 query heads, 2 KV heads, head_dim 8, f16, 16 tokens per block, vocab 1000:
 * block_bytes = 2 * 2 * 2 * 16 * 8 * 2 = 2048. The built-in "llama-3.1-8b" has 2 MiB blocks.
 */
#ifndef LKV_IT_UTIL_H
#define LKV_IT_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "lkv_client.h"
#include "lkv_daemon_harness.h"

/* Daemon arguments declaring the itest profile, plus a 128 MiB hot tier. */
#define LKV_IT_PROFILE_ARGS                                                                        \
    "--set", "hot_bytes=128MiB", "--set", "profile.itest.n_layers=2", "--set",                     \
        "profile.itest.n_q_heads=4", "--set", "profile.itest.n_kv_heads=2", "--set",               \
        "profile.itest.head_dim=8", "--set", "profile.itest.dtype=f16", "--set",                   \
        "profile.itest.block_tokens=16", "--set", "profile.itest.vocab_size=1000"

/* A model shape as the tests need it. */
typedef struct it_shape {
    const char *profile; /* Profile name. */
    int n_layers;        /* Layers. */
    int n_kv_heads;      /* KV heads. */
    int head_dim;        /* Head dim. */
    int elem;            /* Bytes per element. */
    int block_tokens;    /* Tokens per block. */
    uint32_t vocab;      /* Vocabulary size. */
} it_shape;

extern const it_shape lkv_it_itest; /* The itest profile. */
extern const it_shape lkv_it_llama; /* Built-in llama-3.1-8b. */

/* A generated document. */
typedef struct it_doc {
    uint32_t *tokens;   /* n_tokens ids (malloc). */
    uint32_t n_tokens;  /* Count. */
    uint32_t n_blocks;  /* ceil(n_tokens / block_tokens). */
    size_t block_bytes; /* Bytes per block. */
    uint8_t *blocks;    /* n_blocks * block_bytes bytes (malloc), wire layout. */
} it_doc;

size_t lkv_it_block_bytes(const it_shape *s);

/* Builds document seed of n_tokens tokens: token ids and payload are a pure function of
 * (seed, n_tokens, shape); unused slots of the last block are zero. Documents of distinct
 * seeds below vocab^3 with at least 3 tokens have distinct token ids (hence keys). Free with
 * lkv_it_doc_free. */
void lkv_it_doc_make(const it_shape *s, uint64_t seed, uint32_t n_tokens, it_doc *d);
void lkv_it_doc_free(it_doc *d);

/* A docref naming d by content. */
lkv_docref lkv_it_ref(const it_shape *s, const it_doc *d);

/* Creates a client for the harness daemon (64 MiB messages, 20 s deadline scaled). Exits the
 * test on failure. */
lkv_client_t *lkv_it_client(const lkv_daemon *dm);

/* Case-insensitive substring test. */
int lkv_it_contains(const char *hay, const char *needle);

/* Starts dm or fails the test (exit 1). */
void lkv_it_start(lkv_daemon *dm);

#endif
