/*
 * lkv_it_util.c: shared helpers of the C integration tests (see the header).
 *
 * Payload: byte j of block b of document seed is the low byte of a 64-bit mix of
 * (seed, b, j / 8) shifted by (j % 8) bytes: cheap, deterministic, and different for every
 * document, block and offset, so a swapped, shifted or torn block is always detected.
 */
#include "lkv_it_util.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lkv_log.h"
#include "lkv_test.h"

const it_shape lkv_it_itest = {"itest", 2, 2, 8, 2, 16, 1000};
const it_shape lkv_it_llama = {"llama-3.1-8b", 32, 8, 128, 2, 16, 128256};

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

size_t lkv_it_block_bytes(const it_shape *s)
{
    return (size_t)s->n_layers * 2 * (size_t)s->n_kv_heads * (size_t)s->block_tokens *
           (size_t)s->head_dim * (size_t)s->elem;
}

void lkv_it_doc_make(const it_shape *s, uint64_t seed, uint32_t n_tokens, it_doc *d)
{
    memset(d, 0, sizeof(*d));
    d->n_tokens = n_tokens;
    d->tokens = lkv_xmalloc((size_t)n_tokens * sizeof(uint32_t) + 1);
    /* The first tokens spell the seed in base vocab (so documents of different seeds differ
     * whenever they have enough tokens); the rest are pseudo-random. */
    uint64_t rest = seed;
    for (uint32_t i = 0; i < n_tokens; i++) {
        if (i < 3) {
            d->tokens[i] = (uint32_t)(rest % s->vocab);
            rest /= s->vocab;
        } else {
            d->tokens[i] = (uint32_t)(mix(seed * 1000003u + i) % s->vocab);
        }
    }
    d->n_blocks = (n_tokens + (uint32_t)s->block_tokens - 1) / (uint32_t)s->block_tokens;
    d->block_bytes = lkv_it_block_bytes(s);
    d->blocks = lkv_xmalloc(d->n_blocks * d->block_bytes + 1);
    size_t row = (size_t)s->head_dim * (size_t)s->elem; /* One token's row in a slab. */
    size_t slab = row * (size_t)s->block_tokens;
    for (uint32_t b = 0; b < d->n_blocks; b++) {
        uint8_t *blk = d->blocks + b * d->block_bytes;
        uint64_t w = 0;
        for (size_t j = 0; j < d->block_bytes; j++) {
            if (j % 8 == 0) {
                w = mix(seed ^ mix(((uint64_t)b << 40) | (j / 8)));
            }
            blk[j] = (uint8_t)(w >> (8 * (j % 8)));
        }
        uint32_t valid = n_tokens - b * (uint32_t)s->block_tokens;
        if (valid < (uint32_t)s->block_tokens) {
            for (size_t off = 0; off < d->block_bytes; off += slab) {
                memset(blk + off + valid * row, 0, slab - valid * row);
            }
        }
    }
}

void lkv_it_doc_free(it_doc *d)
{
    free(d->tokens);
    free(d->blocks);
    memset(d, 0, sizeof(*d));
}

lkv_docref lkv_it_ref(const it_shape *s, const it_doc *d)
{
    lkv_docref r = {NULL, s->profile, d->tokens, d->n_tokens};
    return r;
}

lkv_client_t *lkv_it_client(const lkv_daemon *dm)
{
    lkv_client_options o = {0};
    o.max_message_bytes = 64u << 20;
    o.default_deadline_ms = lkv_test_timeout_ms(20000);
    lkv_client_t *c = NULL;
    if (lkv_client_create(dm->addr, &o, &c) != 0) {
        LKV_FAIL("lkv_client_create(%s): %s", dm->addr, lkv_client_last_error());
    }
    return c;
}

int lkv_it_contains(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (const char *p = hay; *p; p++) {
        if (strncasecmp(p, needle, n) == 0) {
            return 1;
        }
    }
    return n == 0;
}

void lkv_it_start(lkv_daemon *dm)
{
    if (lkv_daemon_start(dm) != 0) {
        LKV_FAIL("lazykvd did not start");
    }
    fprintf(stderr, "lazykvd pid %ld at %s (dir %s)\n", (long)dm->pid, dm->addr, dm->dir);
}
