/*
 * lkv_devmap_cuda.h: the CUDA backend's device mapping ops (lkv_pagespace.h, lkv_devmap): the
 * daemon's HBM arena opened with cudaIpcOpenMemHandle, worker pages placed with the driver's VMM
 * API (cuMemAddressReserve at a hinted address, cuMemCreate, cuMemMap, cuMemSetAccess) or a
 * plain cudaMalloc. The driver API is reached through cudaGetDriverEntryPointByVersion, so
 * nothing links libcuda (the build machine has no driver).
 *
 * Thread safety: the ops may be called from the thread that runs the backend only.
 */
#ifndef LKV_DEVMAP_CUDA_H
#define LKV_DEVMAP_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

struct lkv_devmap;

/* The ops (static, never freed), on the device current when they are called. */
const struct lkv_devmap *lkv_devmap_cuda(void);

#ifdef __cplusplus
}
#endif

#endif
