/*
 * storage_util.h: helpers shared by the storage tests (header-only, static functions).
 *
 * A tiny profile ("tiny": 2 layers, 4 query / 2 KV heads, head_dim 8, f32, 4 tokens per block:
 * 1024-byte blocks, one 4 KiB arena page each), deterministic block contents derived from a
 * seed (with the unused token slots of a last partial block zeroed, as the layout requires),
 * and temporary data directories under /tmp removed recursively at the end.
 */
#ifndef STORAGE_UTIL_H
#define STORAGE_UTIL_H

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lkv_layout.h"
#include "lkv_profile.h"
#include "lkv_test.h"

static inline lkv_profile tiny_profile(const char *name)
{
    lkv_profile p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "%s", name);
    p.shape.n_layers = 2;
    p.shape.n_q_heads = 4;
    p.shape.n_kv_heads = 2;
    p.shape.head_dim = 8;
    p.shape.dtype = LKV_DTYPE_F32;
    p.shape.block_tokens = 4;
    p.posenc.kind = LKV_POSENC_ROPE;
    p.posenc.rope_theta = 10000.0;
    p.posenc.rope_pairing = LKV_ROPE_INTERLEAVED;
    p.vocab_size = 512;
    p.max_doc_tokens = 256;
    return p;
}

static inline uint64_t su_mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Fills tokens[0..n) from seed (ids < vocab). */
static inline void su_tokens(uint32_t *t, uint32_t n, uint64_t seed, uint32_t vocab)
{
    for (uint32_t i = 0; i < n; i++) {
        t[i] = (uint32_t)(su_mix(seed * 1000003u + i) % vocab);
    }
}

/* Fills the whole KV of a document of n_tokens (n_blocks * block_bytes bytes at buf). */
static inline void su_fill_doc(const lkv_kv_shape *sh, uint32_t n_tokens, uint64_t seed,
                               uint8_t *buf)
{
    size_t bb = lkv_block_bytes(sh);
    uint32_t nb = lkv_blocks_for_tokens(sh, n_tokens);
    size_t row = (size_t)sh->head_dim * lkv_dtype_size(sh->dtype);
    size_t slab = lkv_slab_bytes(sh);
    for (uint32_t b = 0; b < nb; b++) {
        uint8_t *blk = buf + (size_t)b * bb;
        for (size_t i = 0; i < bb; i++) {
            blk[i] = (uint8_t)(su_mix(seed ^ ((uint64_t)b << 32) ^ i) | 1);
        }
        uint32_t valid = n_tokens - b * (uint32_t)sh->block_tokens;
        if (valid < (uint32_t)sh->block_tokens) {
            for (size_t s = 0; s < bb / slab; s++) {
                memset(blk + s * slab + valid * row, 0, slab - valid * row);
            }
        }
    }
}

static inline char *su_tmpdir(void)
{
    char *d = strdup("/tmp/lkv-storage-test-XXXXXX");
    if (mkdtemp(d) == NULL) {
        LKV_FAIL("mkdtemp failed");
    }
    return d;
}

static int su_rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static inline void su_rmdir(char *d)
{
    nftw(d, su_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    free(d);
}

#endif
