/*
 * lkv_cuda_dtype.cuh: 16-bit element traits (lkv__elem<__nv_bfloat16> and lkv__elem<__half>): to
 * and from fp32, one packed pair to two fp32 and back.
 */
#ifndef LKV_CUDA_DTYPE_CUH
#define LKV_CUDA_DTYPE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* 16-bit element traits. */
template <typename T> struct lkv__elem;
template <> struct lkv__elem<__nv_bfloat16> {
    static __device__ __forceinline__ float to_f(__nv_bfloat16 x)
    {
        return __bfloat162float(x);
    }
    static __device__ __forceinline__ __nv_bfloat16 from_f(float x)
    {
        return __float2bfloat16_rn(x);
    }
    /* Two fp32 from one packed pair (low half first). */
    static __device__ __forceinline__ float2 to_f2(uint32_t u)
    {
        return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
    }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
};
template <> struct lkv__elem<__half> {
    static __device__ __forceinline__ float to_f(__half x)
    {
        return __half2float(x);
    }
    static __device__ __forceinline__ __half from_f(float x)
    {
        return __float2half_rn(x);
    }
    static __device__ __forceinline__ float2 to_f2(uint32_t u)
    {
        __half2 h = *reinterpret_cast<__half2 *>(&u);
        return __half22float2(h);
    }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
    {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
};

#endif
