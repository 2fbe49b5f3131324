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

/// Programmatic dependent launch (sm_90+). A kernel the runtime launches to overlap the launch
/// before it (codegen::Launch::overlapsPrevious) calls waitPriorGrid() before it reads what that
/// launch writes: it returns once the earlier grid has finished and its writes are visible (at
/// once where the launch did not overlap). The earlier kernel calls allowDependentGrid() as it
/// starts, so that the next one's CTAs may start while its own still run.
__device__ __forceinline__ void waitPriorGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allowDependentGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
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

/// The deferred norm's statistics of one row x[0, K) (a warp's, every lane the same result):
/// the mean (LAYER; else 0) and rstd, in one pass of 16-byte loads where the row is 16-byte
/// aligned (K % 8 == 0), summing the row less its first element (a shift close to the mean, so
/// that the variance's difference does not cancel). The statistics launch and the GEMM's own
/// statistics warps (fpat_wgmma_mainloop.cuh) share it, so that both give the same bits.
template <bool LAYER>
__device__ __forceinline__ void deferredRowStats(const elem* x, int64_t K, float eps, float& mean,
                                                 float& rstd) {
  const int lane = threadIdx.x % 32;
  const float c = LAYER ? toF(x[0]) : 0.0f;
  float s = 0.0f, q = 0.0f;
  auto add = [&](float v) {
    const float d = v - c;
    s += d;
    q += d * d;
  };
  if (K % 8 == 0) {
    const uint4* x8 = reinterpret_cast<const uint4*>(x);
#pragma unroll 4
    for (int64_t j = lane; j < K / 8; j += 32) {
      Half8 h;
      h.u = __ldcg(x8 + j);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        add(toF(h.h[e]));
    }
  } else {
    for (int64_t j = lane; j < K; j += 32)
      add(toF(x[j]));
  }
  for (int o = 16; o > 0; o /= 2) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
    q += __shfl_xor_sync(0xffffffffu, q, o);
  }
  const float n = static_cast<float>(K), ms = s / n;
  const float var = LAYER ? fmaxf(q / n - ms * ms, 0.0f) : q / n;
  mean = LAYER ? c + ms : 0.0f;
  rstd = rsqrtf(var + eps);
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

// mma.sync (sm_80+): ldmatrix fragments and m16n8k16 MMAs (the sm_80 GEMM, flash decode).
__device__ __forceinline__ void ldmatrixX4(unsigned* r, const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#else
  (void)r;
  (void)p;
  __trap();
#endif
}

__device__ __forceinline__ void ldmatrixX4Trans(unsigned* r, const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#else
  (void)r;
  (void)p;
  __trap();
#endif
}

/// c (16x8, f32) += a (16x16, f16, row) * b (16x8, f16, col).
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." FPAT_MMA_AB "." FPAT_MMA_AB
               ".f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  (void)c;
  (void)a;
  (void)b0;
  (void)b1;
  __trap();
#endif
}

} // namespace fpat

// Arithmetic of the lowered .fpat bodies (activations, epilogues). Every result is stored as
// f16 or bf16 (11 or 8 significand bits), so the last f32 ulps of expf and of the division buy
// nothing visible, while their instructions run with the tensor cores idle (bench/RESULTS.md,
// session 7: 0.1-1% faster GeLU/SiLU GEMMs than expf and div.full.f32).
//
// kFma (a template argument of every generated activation): whether exp and the division take
// their FMA-pipe forms. ex2 and rcp run on the MUFU, 16 lanes per clock per SM against 128 for
// the FMA pipe, so a GeLU or SiLU epilogue (two MUFU operations per element) waits on the MUFU
// while the FMA pipe idles. Kernels pass kFma = true for the second element of each pair, whose
// division then runs as Newton steps on the FMA pipe: a quarter of the MUFU work moved, +0.5-0.8
// points at M = 1024 (sm_90 only, where it was measured; bench/RESULTS.md, session 20). The
// switches below are the measured alternatives, for header variants: FPAT_FMA_EXP2 (2^y by a
// polynomial; 12 instructions for one, issue-bound, slower), FPAT_RCP_STEPS 3 (no faster), and
// FPAT_FMA_RCP 0 (MUFU only, as before session 20).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FPAT_FMA_FORMS 1
#else
#define FPAT_FMA_FORMS 0
#endif
#ifndef FPAT_FMA_EXP2
#define FPAT_FMA_EXP2 0
#endif
#ifndef FPAT_FMA_RCP
#define FPAT_FMA_RCP 1
#endif
#ifndef FPAT_RCP_STEPS
#define FPAT_RCP_STEPS 2
#endif

#if FPAT_FMA_FORMS
namespace fpat {

__device__ __forceinline__ float minNaN(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float maxNaN(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

/// 2^y on the FMA pipe. y = j + f with j = floor(y) (the 1.5 * 2^23 shift rounding down, which
/// also leaves j + 127 in the low bits) and 0 <= f < 1; 2^f by a degree-5 polynomial with
/// p(0) = 1 (relative error 2^-22.6 in f32, as ex2.approx's), times 2^j built from those bits.
/// y is clamped to [-127, 128] first (NaN passes): 2^128 is inf, j = -127 gives 0 (the flush of
/// ex2.approx.ftz for every y < -126).
__device__ __forceinline__ float exp2Fma(float y) {
  const float yc = minNaN(maxNaN(y, -127.0f), 128.0f);
  const float shift = 0x1.8p23f + 127.0f;
  const float t = __fadd_rd(yc, shift);
  const float f = __fsub_rn(yc, __fsub_rn(t, shift));
  float p = 0x1.e974bap-10f;
  p = __fmaf_rn(p, f, 0x1.277866p-7f);
  p = __fmaf_rn(p, f, 0x1.c91ce4p-5f);
  p = __fmaf_rn(p, f, 0x1.ebdb58p-3f);
  p = __fmaf_rn(p, f, 0x1.62e4bap-1f);
  p = __fmaf_rn(p, f, 1.0f);
  return p * __int_as_float(__float_as_int(t) << 23);
}

/// 1 / b for b >= 1 (or NaN) on the FMA pipe: the integer estimate 0x7ef31000 - bits(b)
/// (relative error 5%), then FPAT_RCP_STEPS Newton steps (2^-17.2 after two, 2^-23.4 after
/// three). Beyond 2^125 the estimate leaves the normal range; the reciprocal is then 0, as
/// rcp.approx.ftz's is beyond 2^126. NaN stays NaN.
__device__ __forceinline__ float rcpGe1Fma(float b) {
  float r = __int_as_float(0x7ef31000 - __float_as_int(b));
#pragma unroll
  for (int i = 0; i < FPAT_RCP_STEPS; ++i)
    r = __fmaf_rn(r, __fmaf_rn(-b, r, 1.0f), r);
  return b > 0x1p125f ? 0.0f : r;
}

} // namespace fpat
#endif

/// 2^y (ex2.approx): exp(x) lowers to 2^(x log2 e), the factor log2 e folded into the
/// constants of x where it can (dsl's lowerScaled). Relative error about 2^-22, plus |y| * 2^-24
/// from rounding y; inf, 0 and NaN as expf. Results below 2^-126 flush to 0 (.ftz; the
/// non-ftz form costs extra instructions).
template <bool kFma = false> __device__ __forceinline__ float fpat_exp2f(float y) {
#if FPAT_FMA_FORMS && FPAT_FMA_EXP2
  if constexpr (kFma)
    return fpat::exp2Fma(y);
  else
#endif
  {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(y));
    return r;
  }
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
/// f16 kernels: a times rcp(b), nothing to scale. Where b > 2^126 (2^125 for kFma) the
/// reciprocal flushes to 0 and so does the quotient, an error below |a| 2^-125 that no f16
/// result shows unless |a| > 2^100 (an infinite a over such a b gives NaN, not inf). Four
/// operations fewer per element than fpat_divf: gemm_bias_gelu 1024x4096x4096 1.2% faster on
/// the H200. bf16 has f32's exponent range, so its kernels keep fpat_divf.
template <bool kFma = false> __device__ __forceinline__ float fpat_divf_ge1(float a, float b) {
#if FPAT_BF16
  return fpat_divf(a, b);
#else
#if FPAT_FMA_FORMS && FPAT_FMA_RCP
  if constexpr (kFma)
    return a * fpat::rcpGe1Fma(b);
  else
#endif
  {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(b));
    return a * r;
  }
#endif
}
