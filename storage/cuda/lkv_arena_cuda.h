/*
 * lkv_arena_cuda.h: the CUDA side of the hot arena (internal to storage/, used by lkv_arena.c).
 *
 * Compiled only with LKV_HAVE_CUDA. Each function maps CUDA errors to LKV_ECUDA and logs the
 * failing call with file:line. No function here keeps state: lkv_arena.c owns the pointers.
 */
#ifndef LKV_ARENA_CUDA_H
#define LKV_ARENA_CUDA_H

#include <stddef.h>
#include <stdint.h>

/* Returns the number of CUDA devices (0 if there is no driver or no device). */
int lkv__cuda_device_count(void);

/* cudaSetDevice(device) + cudaMalloc(bytes) into *out, and the IPC handle into ipc[64] (zeros
 * if export fails; that is logged, not an error). */
int lkv__cuda_alloc(int device, uint64_t bytes, void **out, uint8_t ipc[64]);

/* cudaFree. p may be NULL. */
void lkv__cuda_free(int device, void *p);

/* cudaMemcpy host to device / device to host. */
int lkv__cuda_h2d(int device, void *dst, const void *src, size_t len);
int lkv__cuda_d2h(int device, void *dst, const void *src, size_t len);

#endif
