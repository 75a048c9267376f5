/*
 * lkv_cuda_workspace.cuh: host-side internals shared by the launchers (lkv_attn_util.cu): the
 * cached split-KV workspace of the one-shot launchers, the multiprocessor count, and the separate
 * log-sum-exp merge kernel of prefill's split partials (decode folds its merge into the launch).
 */
#ifndef LKV_CUDA_WORKSPACE_CUH
#define LKV_CUDA_WORKSPACE_CUH

#include <cuda_runtime.h>
#include <stddef.h>

/* Host-side internal helpers (lkv_attn_util.cu). */
extern "C" {
/* Returns a cached device buffer of at least bytes (grow-only), or NULL with a log line. */
void *lkv__cuda_ws_get(size_t bytes);
/* Multiprocessor count of the current device (cached), at least 1. */
int lkv__cuda_sm_count(void);
}

/* Merges split partials: part_o [rows][n_splits][d] fp32 (each normalised), part_lse
 * [rows][n_splits] (log2 domain, -inf = empty) into out [rows][d] in dtype and the optional lse
 * [rows] (natural log; -inf and out = 0 for a row with no keys). Asynchronous on stream. */
int lkv__merge_launch(int dtype, const float *part_o, const float *part_lse, int rows, int n_splits,
                      int d, void *out, float *lse, cudaStream_t stream);

#endif
