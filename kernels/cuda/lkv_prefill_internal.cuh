/*
 * lkv_prefill_internal.cuh: what the two tensor-core prefill kernels share: the launch parameters
 * (prefill_params, filled by lkv_attn_prefill_cuda in lkv_prefill.cu) and the entry points of the
 * Hopper kernel (lkv_prefill_wgmma.cu, built for sm_90a only): whether it can take a launch, and
 * the launch itself. Host-side internals; not part of the C API.
 */
#ifndef LKV_PREFILL_INTERNAL_CUH
#define LKV_PREFILL_INTERNAL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "lkv_cuda_posenc.cuh"

struct prefill_params {
    const void *q;
    const void *k_new;
    const void *v_new;
    const char *arena;
    uint64_t page_bytes;
    const uint64_t *refs;
    int n_refs, n_new;
    int new_start;
    int n_q, n_kv, group, d, B, layer, n_layers;
    uint64_t slab_bytes;
    void *out;
    float *part_o;   /* [n_new * n_q][n_splits][d] */
    float *part_lse; /* [n_new * n_q][n_splits] (log2) */
    int *counters;   /* wgmma kernel: [n_kv][row tiles] merge arrivals, zero between launches;
                        NULL: the caller merges with the merge kernel */
    int n_splits, refs_per_split;
    float scale_log2;
    int dtype;   /* enum lkv_dtype (bf16 or f16) */
    int wg_bn;   /* wgmma kernel: keys per tile (64, 96, or 128 at head_dim 128) */
    int wg_qr;   /* wgmma kernel: 1 = Q as a register operand of S = Q K^T (else shared memory) */
    int wg_nst;  /* wgmma kernel: shared-memory stages of the ring (4, or 5 at head_dim 128) */
    int wg_fold; /* wgmma kernel: 1 = merge split partials in the same launch */
    int wg_pp;   /* wgmma kernel: 1 = ping-pong between the consumer warpgroups */
    int wg_pf;   /* wgmma kernel: 1 = S issued one tile ahead of the softmax (BN 64, no pp) */
    int wg_vb;   /* wgmma kernel: 1 = a cached block's V in one tensor copy (the default where
                    it applies: head_dim 128, BN 64, B 8/16/32/64) */
};

/* Query rows per CTA of the wgmma kernel (two consumer warpgroups of 64 rows), and its most
 * splits (the folded merge keeps LKV__WG_BM x splits weights in the free K/V ring). */
#define LKV__WG_BM         128
#define LKV__WG_MAX_SPLITS 128

/* 1 when the wgmma kernel can run this launch on the current device: a Hopper device whose
 * binary has the sm_90a kernel, head_dim 64 or 128, block_tokens a multiple of 8, and the
 * addresses 16-byte aligned (the tensor copies need them). Cheap: the device check is cached. */
int lkv__prefill_wgmma_ok(const prefill_params *p);

/* Launches the wgmma kernel with p's split plan (p->n_splits CTAs per row tile and kv head;
 * with more than one and p->counters set, the last CTA of each merges the partials in the
 * same launch, on p->counters, which must be zero and are left zero; without counters the
 * caller merges). Returns 0, LKV_ECUDA (logged). */
int lkv__prefill_wgmma_launch(const prefill_params *p, const lkv__dev_pe *pe,
                              const lkv__dev_slopes *sl, cudaStream_t st);

#endif
