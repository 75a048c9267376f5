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

/* Page-locked host memory (cudaHostAlloc, portable: usable from every device) of bytes into
 * *out; lkv__cuda_host_free releases it (p may be NULL). */
int lkv__cuda_host_alloc(size_t bytes, void **out);
void lkv__cuda_host_free(void *p);

/* A non-blocking stream on device (cudaStreamCreateWithFlags) into *out; destroy waits for
 * the work queued on it first. */
int lkv__cuda_stream_create(int device, void **out);
void lkv__cuda_stream_destroy(int device, void *stream);

/* cudaStreamSynchronize (errors logged, not returned: a best-effort wait). */
void lkv__cuda_stream_sync(int device, void *stream);

/* cudaMemcpyAsync device to host on stream (dst should be pinned: lkv__cuda_host_alloc). */
int lkv__cuda_d2h_async(int device, void *stream, void *dst, const void *src, size_t len);

/* Calls done->fn(done, rc) (done: an lkv_arena_done, lkv_arena.h) once the work queued on
 * stream so far is done (rc 0) or failed (rc LKV_ECUDA), from a CUDA callback thread (fn must
 * not call CUDA). Returns 0 if it will be called, else LKV_ECUDA (it will not). */
int lkv__cuda_stream_then(int device, void *stream, void *done);

#endif
