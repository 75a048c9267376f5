/*
 * lkv_synth.h: Llama-architecture models with random weights from a counter-based generator,
 * so that an 8B-shaped model needs no 16 GB file and a PyTorch script
 * (bench/worker/synth_ref.py) makes bit-identical weights.
 *
 * Weight i (0-based, row-major over all layers, [layer][out][in] as llama2.c and
 * torch.nn.Linear) of tensor t (the llama2.c order: 0 tok_emb, 1 rms_att, 2 wq, 3 wk, 4 wv,
 * 5 wo, 6 rms_ffn, 7 w1, 8 w2, 9 w3, 10 rms_final, 11 wcls) with seed s is, in uint32
 * arithmetic (fmix32 = MurmurHash3's finaliser):
 *     key = fmix32(s ^ fmix32(t * 0x9e3779b9 + 0x7f4a7c15))
 *     h   = fmix32(i ^ key)
 *     w   = scale_t * ((float)(h >> 8) * 2^-23 - 1)        (fp32, one rounding: the product)
 * RMSNorm weights are 1. scale_t (fp32 of the fp64 value): 1 for tok_emb; sqrt(3 / fan_in) for
 * every matrix (uniform with variance 1 / fan_in: activations stay O(1) through the RMSNorms,
 * so 32 layers stay finite). Every tensor index fits in 32 bits for the shapes below.
 *
 * Presets: "llama3-8b" (Llama-3.1-8B shape: 32 layers, width 4096, FFN 14336, 32 / 8 heads,
 * head_dim 128, vocab 128256, RoPE theta 500000 with llama3 scaling 8 / 1 / 4 / 8192,
 * half-split pairs, unshared classifier, max position 131072) and "llama3-mini" (the same
 * structure at 2 layers, width 256, FFN 512, 4 / 2 heads of 64, vocab 512: the CPU test).
 */
#ifndef LKV_SYNTH_H
#define LKV_SYNTH_H

#include <stdint.h>

#include "lkv_model.h"

static inline uint32_t lkv_synth_fmix32(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

/* Weight i of tensor t for seed s at scale (see the file comment). */
static inline float lkv_synth_weight(uint32_t s, uint32_t t, uint32_t i, float scale)
{
    uint32_t key = lkv_synth_fmix32(s ^ lkv_synth_fmix32(t * 0x9e3779b9u + 0x7f4a7c15u));
    uint32_t h = lkv_synth_fmix32(i ^ key);
    return scale * ((float)(h >> 8) * (1.0f / 8388608.0f) - 1.0f);
}

/* Makes the preset's model with seed (threads: host threads generating, 0: all CPUs). Returns
 * 0 and *out (lkv_model_destroy), or LKV_EINVAL (unknown preset). */
int lkv_synth_model(const char *preset, uint32_t seed, int threads, lkv_model **out);

#endif
