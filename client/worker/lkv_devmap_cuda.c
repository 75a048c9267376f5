/*
 * lkv_devmap_cuda.c: the CUDA device mapping ops (see lkv_devmap_cuda.h).
 *
 * Placed allocations: the range is reserved at the hint and kept only if the driver returned
 * exactly that address (cuMemAddressReserve treats the address as a hint); the physical
 * allocation is released right after mapping it, so unmapping frees it. Memory is zeroed with
 * cudaMemset and the device synchronised before an op returns (the backend's stream does not
 * order against the legacy stream) and before anything is freed.
 */
#include "lkv_devmap_cuda.h"

#include <stdio.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "lkv_err.h"
#include "lkv_pagespace.h"

typedef CUresult (*pfn_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*pfn_addr_free)(CUdeviceptr, size_t);
typedef CUresult (*pfn_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                               unsigned long long);
typedef CUresult (*pfn_release)(CUmemGenericAllocationHandle);
typedef CUresult (*pfn_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                            unsigned long long);
typedef CUresult (*pfn_unmap)(CUdeviceptr, size_t);
typedef CUresult (*pfn_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*pfn_gran)(size_t *, const CUmemAllocationProp *,
                             CUmemAllocationGranularity_flags);

static struct {
    int tried, ok;
    pfn_reserve reserve;
    pfn_addr_free addr_free;
    pfn_create create;
    pfn_release release;
    pfn_map map;
    pfn_unmap unmap;
    pfn_access access;
    pfn_gran gran;
} drv;

static void *entry(const char *sym)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(sym, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
        return NULL;
    }
    return fn;
}

/* 1 if the VMM entry points are there. */
static int have_vmm(void)
{
    if (!drv.tried) {
        drv.tried = 1;
        drv.reserve = (pfn_reserve)entry("cuMemAddressReserve");
        drv.addr_free = (pfn_addr_free)entry("cuMemAddressFree");
        drv.create = (pfn_create)entry("cuMemCreate");
        drv.release = (pfn_release)entry("cuMemRelease");
        drv.map = (pfn_map)entry("cuMemMap");
        drv.unmap = (pfn_unmap)entry("cuMemUnmap");
        drv.access = (pfn_access)entry("cuMemSetAccess");
        drv.gran = (pfn_gran)entry("cuMemGetAllocationGranularity");
        drv.ok = drv.reserve && drv.addr_free && drv.create && drv.release && drv.map &&
                 drv.unmap && drv.access && drv.gran;
    }
    return drv.ok;
}

static CUmemAllocationProp prop_of(int dev)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof(p));
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}

static int cuda_err(char *err, size_t len, const char *what, cudaError_t e)
{
    snprintf(err, len, "%s: %s", what, cudaGetErrorString(e));
    return LKV_ECUDA;
}

static int op_open(void *ctx, const lkv_lease_arena *a, void **base, char *err, size_t len)
{
    (void)ctx;
    int dev = -1;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) {
        return cuda_err(err, len, "cudaGetDevice", e);
    }
    if (!a->has_cuda_ipc) {
        snprintf(err, len, "the reply carries no CUDA IPC handle");
        return LKV_EPROTO;
    }
    if (a->cuda_device != dev) {
        snprintf(err, len, "the arena is on CUDA device %d, the worker runs on device %d",
                 a->cuda_device, dev);
        return LKV_ENOTSUP;
    }
    cudaIpcMemHandle_t h;
    memcpy(&h, a->cuda_ipc, sizeof(h) < sizeof(a->cuda_ipc) ? sizeof(h) : sizeof(a->cuda_ipc));
    e = cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        *base = NULL;
        return cuda_err(err, len, "cudaIpcOpenMemHandle", e);
    }
    return 0;
}

static void op_close(void *ctx, void *base)
{
    (void)ctx;
    cudaDeviceSynchronize();
    cudaIpcCloseMemHandle(base);
}

static uint64_t op_granularity(void *ctx)
{
    (void)ctx;
    int dev = 0;
    size_t g = 0;
    if (!have_vmm() || cudaGetDevice(&dev) != cudaSuccess) {
        return 2u << 20;
    }
    CUmemAllocationProp p = prop_of(dev);
    if (drv.gran(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || g == 0) {
        return 2u << 20;
    }
    return g;
}

static int op_alloc_at(void *ctx, uintptr_t at, uint64_t bytes, void **out, char *err, size_t len)
{
    (void)ctx;
    *out = NULL;
    int dev = 0;
    if (!have_vmm() || cudaGetDevice(&dev) != cudaSuccess) {
        snprintf(err, len, "the driver's VMM API is not available");
        return LKV_ENOTSUP;
    }
    CUdeviceptr p = 0;
    if (drv.reserve(&p, bytes, 0, (CUdeviceptr)at, 0) != CUDA_SUCCESS) {
        snprintf(err, len, "cuMemAddressReserve of %llu bytes failed", (unsigned long long)bytes);
        return LKV_EBUSY;
    }
    if (p != (CUdeviceptr)at) {
        drv.addr_free(p, bytes);
        snprintf(err, len, "the range at %#llx is taken", (unsigned long long)at);
        return LKV_EBUSY;
    }
    CUmemAllocationProp pr = prop_of(dev);
    CUmemGenericAllocationHandle h;
    if (drv.create(&h, bytes, &pr, 0) != CUDA_SUCCESS) {
        drv.addr_free(p, bytes);
        snprintf(err, len, "cuMemCreate of %llu bytes failed (out of device memory?)",
                 (unsigned long long)bytes);
        return LKV_ENOMEM;
    }
    CUmemAccessDesc ad;
    memset(&ad, 0, sizeof(ad));
    ad.location = pr.location;
    ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    int ok = drv.map(p, bytes, 0, h, 0) == CUDA_SUCCESS;
    drv.release(h); /* Freed when unmapped. */
    if (!ok || drv.access(p, bytes, &ad, 1) != CUDA_SUCCESS) {
        if (ok) {
            drv.unmap(p, bytes);
        }
        drv.addr_free(p, bytes);
        snprintf(err, len, "cuMemMap / cuMemSetAccess failed");
        return LKV_ECUDA;
    }
    cudaError_t e = cudaMemset((void *)p, 0, bytes);
    if (e == cudaSuccess) {
        e = cudaDeviceSynchronize();
    }
    if (e != cudaSuccess) {
        drv.unmap(p, bytes);
        drv.addr_free(p, bytes);
        return cuda_err(err, len, "zeroing the worker pages", e);
    }
    *out = (void *)p;
    return 0;
}

static int op_alloc(void *ctx, uint64_t bytes, void **out, char *err, size_t len)
{
    (void)ctx;
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *out = NULL;
        return cuda_err(err, len, "cudaMalloc", e);
    }
    e = cudaMemset(*out, 0, bytes);
    if (e == cudaSuccess) {
        e = cudaDeviceSynchronize();
    }
    if (e != cudaSuccess) {
        cudaFree(*out);
        *out = NULL;
        return cuda_err(err, len, "zeroing the worker pages", e);
    }
    return 0;
}

static void op_free(void *ctx, void *p, uint64_t bytes, int placed)
{
    (void)ctx;
    cudaDeviceSynchronize();
    if (placed && have_vmm()) {
        drv.unmap((CUdeviceptr)p, bytes);
        drv.addr_free((CUdeviceptr)p, bytes);
    } else if (!placed) {
        cudaFree(p);
    }
}

static const lkv_devmap ops = {
    .arena_backend = "cuda",
    .ctx = NULL,
    .open = op_open,
    .close = op_close,
    .granularity = op_granularity,
    .alloc_at = op_alloc_at,
    .alloc = op_alloc,
    .free = op_free,
};

const struct lkv_devmap *lkv_devmap_cuda(void)
{
    return &ops;
}
