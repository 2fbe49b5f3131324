// Kernel family "elementwise": out[i] = F(inputs at i) over an [M, N] (or [N]) tensor, 8
// elements per thread per step. Full-size inputs and the output move in 16-byte vectors when
// the element count is a multiple of 8 (buffers are 16-byte aligned); broadcast inputs ([N] rows,
// [M, 1] columns, scalars) are read element by element (they stay in cache).
//
// F provides:   static constexpr int kInputs;
//               __host__ __device__ static constexpr int kind(int input); // FPAT_IN_*
//               template <bool kFma> __device__ float operator()(const float* in,
//                                                                const FpatKernelArgs&) const;
//               (kFma: exp and division on the FMA pipe, fpat_common.cuh; odd elements)
#pragma once

#include "fpat_common.cuh"

namespace fpat {

template <class F> __device__ __forceinline__ void elementwise(const FpatKernelArgs& a) {
  const int64_t n = a.M * a.N;
  const bool vec = (n % 8) == 0;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x * 8;
  const F f;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8; base < n;
       base += step) {
    float in[F::kInputs][8];
#pragma unroll
    for (int k = 0; k < F::kInputs; ++k) {
      if (F::kind(k) == FPAT_IN_FULL && vec) {
        Half8 v;
        v.u = *reinterpret_cast<const uint4*>(static_cast<const elem*>(a.in[k]) + base);
#pragma unroll
        for (int e = 0; e < 8; ++e)
          in[k][e] = toF(v.h[e]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int64_t i = base + e;
          const int64_t at = F::kind(k) == FPAT_IN_FULL     ? i
                             : F::kind(k) == FPAT_IN_ROWVEC ? i % a.N
                             : F::kind(k) == FPAT_IN_COLVEC ? i / a.N
                                                            : 0;
          in[k][e] = i < n ? ldh(a.in[k], at) : 0.0f;
        }
      }
    }
    Half8 out;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float x[F::kInputs > 0 ? F::kInputs : 1];
#pragma unroll
      for (int k = 0; k < F::kInputs; ++k)
        x[k] = in[k][e];
      out.h[e] = fromF(e % 2 ? f.template operator()<true>(x, a) : f(x, a));
    }
    elem* o = static_cast<elem*>(a.out);
    if (vec) {
      *reinterpret_cast<uint4*>(o + base) = out.u;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (base + e < n)
          o[base + e] = out.h[e];
    }
  }
}

/// out[i] = F(inputs) where each operand is read through B::at(k, i), its NumPy-broadcast
/// index for element i of the result (any broadcast up to rank 4; one element per thread).
template <class F, class B>
__device__ __forceinline__ void broadcastElementwise(const FpatKernelArgs& a) {
  const int64_t n = a.M * a.N;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const F f;
  elem* o = static_cast<elem*>(a.out);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    float x[F::kInputs > 0 ? F::kInputs : 1];
#pragma unroll
    for (int k = 0; k < F::kInputs; ++k)
      x[k] = ldh(a.in[k], B::at(k, i));
    o[i] = fromF(f(x, a));
  }
}

} // namespace fpat
