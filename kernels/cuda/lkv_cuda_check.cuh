/*
 * lkv_cuda_check.cuh: the CUDA error check of the kernel launchers: LKV__CUDA_RC(expr) logs
 * #expr, the CUDA error name and string and file:line (lkv_log.h) and yields LKV_ECUDA (0 on
 * success); LKV__CUDA_CHECK(expr) returns that from the enclosing function;
 * LKV__CUDA_CHECK_LAUNCH() checks the launch just made. It is the one CUDA check of kernels/
 * (tests and benchmarks, which exit on any error, keep their own CK).
 */
#ifndef LKV_CUDA_CHECK_CUH
#define LKV_CUDA_CHECK_CUH

#include <cuda_runtime.h>

extern "C" {
#include "lkv_err.h"
#include "lkv_log.h"
}

/* Returns 0 for cudaSuccess, else logs what failed (at file:line) and returns LKV_ECUDA. */
static inline int lkv__cuda_rc(cudaError_t e, const char *what, const char *file, int line)
{
    if (e == cudaSuccess) {
        return 0;
    }
    lkv_log_line(LKV_LOG_ERROR, file, line, "%s: %s (%s)", what, cudaGetErrorString(e),
                 cudaGetErrorName(e));
    return LKV_ECUDA;
}

/* The status of a CUDA call as an lkv status (for code that cleans up before returning). */
#define LKV__CUDA_RC(expr) lkv__cuda_rc((expr), #expr, __FILE__, __LINE__)

/* Returns LKV_ECUDA from the enclosing function when the CUDA call fails. */
#define LKV__CUDA_CHECK(expr)                                                                      \
    do {                                                                                           \
        if (LKV__CUDA_RC(expr) != 0) {                                                             \
            return LKV_ECUDA;                                                                      \
        }                                                                                          \
    } while (0)

/* Checks the launch just made (configuration errors surface here). */
#define LKV__CUDA_CHECK_LAUNCH() LKV__CUDA_CHECK(cudaGetLastError())

#endif
