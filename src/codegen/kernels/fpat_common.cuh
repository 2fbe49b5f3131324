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

// Activation math for epilogues. CUDA's expf and tanhf are accurate to an ulp or two but cost
// tens of instructions; a GEMM epilogue runs them once per output element after the main loop,
// where nothing overlaps them (measured: 4% of gemm_bias_gelu on the H200). These use the
// hardware exp2 and reciprocal approximations instead, within 1e-5 relative of the exact values
// for |x| <= 80 (exp) and 1e-6 everywhere (tanh): far inside what an f16 output can hold.

/// e^x; relative error 2 + 1.2|x| ulp (the __expf bound); overflow to inf, underflow to 0.
__device__ __forceinline__ float fexp(float x) {
  return __expf(x);
}

/// tanh(x): an odd Taylor polynomial for |x| < 1/4 (no cancellation), 1 - 2 / (e^2|x| + 1)
/// above, which reaches exactly 1 once e^2|x| overflows. NaN stays NaN.
__device__ __forceinline__ float ftanh(float x) {
  const float a = fabsf(x), x2 = x * x;
  const float big = 1.0f - __fdividef(2.0f, __expf(2.0f * a) + 1.0f);
  const float small =
      a * (1.0f + x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315 + x2 * (62.0f / 2835)))));
  return copysignf(a < 0.25f ? small : big, x);
}

__device__ __forceinline__ float ldh(const void* p, int64_t i) {
  return __half2float(static_cast<const __half*>(p)[i]);
}

} // namespace fpat
