// Helpers shared by the kernel families: the element type, vector types, packing, cp.async.
#pragma once

#include "fpat_abi.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// The element type of every tensor: f16, or bf16 where the generated file defines FPAT_BF16
// (sm_80 and newer). Accumulation and epilogues are f32 either way.
#ifndef FPAT_BF16
#define FPAT_BF16 0
#endif
#if FPAT_BF16
#define FPAT_MMA_AB "bf16" // the A/B type of mma.sync and wgmma
#else
#define FPAT_MMA_AB "f16"
#endif

namespace fpat {

#if FPAT_BF16
using elem = __nv_bfloat16;
using elem2 = __nv_bfloat162;
__device__ __forceinline__ float toF(elem x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ elem fromF(float x) {
  return __float2bfloat16(x);
}
__device__ __forceinline__ float2 toF2(elem2 x) {
  return __bfloat1622float2(x);
}
__device__ __forceinline__ elem2 fromF2(float a, float b) {
  return __floats2bfloat162_rn(a, b);
}
#else
using elem = __half;
using elem2 = __half2;
__device__ __forceinline__ float toF(elem x) {
  return __half2float(x);
}
__device__ __forceinline__ elem fromF(float x) {
  return __float2half(x);
}
__device__ __forceinline__ float2 toF2(elem2 x) {
  return __half22float2(x);
}
__device__ __forceinline__ elem2 fromF2(float a, float b) {
  return __floats2half2_rn(a, b);
}
#endif

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

/// Eight elements as one 16-byte word.
union Half8 {
  uint4 u;
  elem h[8];
};

__device__ __forceinline__ float ldh(const void* p, int64_t i) {
  return toF(static_cast<const elem*>(p)[i]);
}

/// Elements i and i + 1 as one 4-byte load; i must be even (and the base 4-byte aligned).
__device__ __forceinline__ float2 ldh2(const void* p, int64_t i) {
  return toF2(*reinterpret_cast<const elem2*>(static_cast<const elem*>(p) + i));
}

/// The element pairs a + b, rounded once (the unfused path's add of two stored tensors).
__device__ __forceinline__ unsigned addPairBits(unsigned a, unsigned b) {
  unsigned r;
#if FPAT_BF16
  asm("add.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
#else
  asm("add.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
#endif
  return r;
}

} // namespace fpat

// Arithmetic of the lowered .fpat bodies (activations, epilogues). Every result is stored as
// f16 or bf16 (11 or 8 significand bits), so the last f32 ulps of expf and of the division buy
// nothing visible, while their instructions run with the tensor cores idle (bench/RESULTS.md,
// session 7: 0.1-1% faster GeLU/SiLU GEMMs than expf and div.full.f32).

/// 2^y (ex2.approx): exp(x) lowers to 2^(x log2 e), the factor log2 e folded into the
/// constants of x where it can (dsl's lowerScaled). Relative error about 2^-22, plus |y| * 2^-24
/// from rounding y; inf, 0 and NaN as expf. Results below 2^-126 flush to 0 (.ftz; the
/// non-ftz form costs extra instructions).
__device__ __forceinline__ float fpat_exp2f(float y) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(y));
  return r;
}

/// a / b as a times the approximate reciprocal (within 2 ulp of f32). Both are scaled first
/// where |b| is beyond 2^125 or below 2^-125, so that 1 / b stays a normal number. No branch:
/// one per element measured 2-12% slower GeLU kernels on the H200. 0, inf and NaN come out
/// as the IEEE division's.
__device__ __forceinline__ float fpat_divf(float a, float b) {
  const float ab = fabsf(b);
  const float s = ab > 0x1p125f ? 0x1p-4f : ab < 0x1p-125f ? 0x1p24f : 1.0f;
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(b * s));
  return (a * s) * r;
}

/// a / b where b >= 1 or NaN, which the lowering proves (1 + exp(y) in GeLU, SiLU, sigmoid).
/// f16 kernels: a times rcp(b), nothing to scale. Where b > 2^126 the reciprocal flushes to 0
/// and so does the quotient, an error below |a| 2^-126 that no f16 result shows unless
/// |a| > 2^101 (an infinite a over such a b gives NaN, not inf). Four operations fewer per
/// element than fpat_divf: gemm_bias_gelu 1024x4096x4096 1.2% faster on the H200. bf16 has
/// f32's exponent range, so its kernels keep fpat_divf.
__device__ __forceinline__ float fpat_divf_ge1(float a, float b) {
#if FPAT_BF16
  return fpat_divf(a, b);
#else
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(b));
  return a * r;
#endif
}
