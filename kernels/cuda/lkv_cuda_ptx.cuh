/*
 * lkv_cuda_ptx.cuh: PTX wrappers of the kernels: cp.async (16 bytes, L2 only, zero-fill), ldmatrix,
 * movmatrix, mma.sync m16n8k16 (bf16/fp16 in, fp32 accumulate), ex2.approx, and programmatic
 * dependent launch (griddepcontrol). sm_80+ except griddepcontrol (sm_90).
 */
#ifndef LKV_CUDA_PTX_CUH
#define LKV_CUDA_PTX_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* cp.async (16 bytes, L2 only; zero-fills the destination when !valid, src is not read). */
static __device__ __forceinline__ void lkv__cp_async16(void *dst, const void *src, bool valid)
{
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
}
/* The same with the destination as a shared-memory address (lkv__smem_u32), so that callers
 * can form it with adds and XORs of per-lane constants. */
static __device__ __forceinline__ void lkv__cp_async16_s(uint32_t dst, const void *src, bool valid)
{
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
static __device__ __forceinline__ void lkv__cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> static __device__ __forceinline__ void lkv__cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

static __device__ __forceinline__ uint32_t lkv__smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* ldmatrix x4 (optionally transposed): four 8x8 16-bit matrices, row addresses from lanes
 * 8m..8m+7 for matrix m. */
static __device__ __forceinline__ void lkv__ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                                    uint32_t &r3, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(lkv__smem_u32(p)));
}
static __device__ __forceinline__ void lkv__ldsm_x4_t(uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                                      uint32_t &r3, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(lkv__smem_u32(p)));
}

/* The same from a shared-memory address (lkv__smem_u32). */
static __device__ __forceinline__ void lkv__ldsm_x4_s(uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                                      uint32_t &r3, uint32_t a)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a));
}
static __device__ __forceinline__ void lkv__ldsm_x4_t_s(uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                                        uint32_t &r3, uint32_t a)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a));
}

/* Transposes an 8x8 16-bit matrix held in the standard fragment layout. */
static __device__ __forceinline__ uint32_t lkv__movmatrix_t(uint32_t a)
{
    uint32_t d;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
    return d;
}

/* Programmatic dependent launch (sm_90): trigger lets the next kernel of the stream launch
 * early; wait blocks until the previous kernel has completed and its writes are visible. Both
 * are no-ops for a kernel launched without the programmatic-serialization attribute. */
static __device__ __forceinline__ void lkv__pdl_trigger()
{
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
static __device__ __forceinline__ void lkv__pdl_wait()
{
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

/* 2^x on the special-function unit (flushes denormals; 2^-inf = 0). */
static __device__ __forceinline__ float lkv__ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* mma.sync m16n8k16, fp32 accumulate: c += a * b (a row-major 16x16, b col-major 16x8). */
template <typename T> struct lkv__mma;
template <> struct lkv__mma<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct lkv__mma<__half> {
    static __device__ __forceinline__ void run(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

#endif
