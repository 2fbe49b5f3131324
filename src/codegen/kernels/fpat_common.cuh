// Helpers shared by the kernel families: vector types, f16 packing, cp.async.
#pragma once

#include "fpat_abi.h"

#include <cuda_fp16.h>
#include <stdint.h>

namespace fpat {

// cp.async exists from sm_80 on; older targets take the register path.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FPAT_HAS_CP_ASYNC 1
#else
#define FPAT_HAS_CP_ASYNC 0
#endif

/// 16-byte copy global -> shared that bypasses L1; `bytes` < 16 zero-fills the rest (0: all).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int bytes) {
#if FPAT_HAS_CP_ASYNC
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
#else
  (void)smem;
  (void)gmem;
  (void)bytes;
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if FPAT_HAS_CP_ASYNC
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N> __device__ __forceinline__ void cp_async_wait() {
#if FPAT_HAS_CP_ASYNC
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

/// Eight halves as one 16-byte word.
union Half8 {
  uint4 u;
  __half h[8];
};

__device__ __forceinline__ float ldh(const void* p, int64_t i) {
  return __half2float(static_cast<const __half*>(p)[i]);
}

/// Elements i and i + 1 as one 4-byte load; i must be even (and the base 4-byte aligned).
__device__ __forceinline__ float2 ldh2(const void* p, int64_t i) {
  return __half22float2(*reinterpret_cast<const __half2*>(static_cast<const __half*>(p) + i));
}

} // namespace fpat
