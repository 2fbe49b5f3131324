// Kernel family "rowwise": LayerNorm / RMSNorm / mean over the last dimension, one warp per row,
// and the per-row statistics pass of norm_gemm. Statistics are f32, two passes over the row (mean,
// then the centred second moment), which is exact enough for rows of any length we meet.
#pragma once

#include "fpat_common.cuh"

namespace fpat {

constexpr int kRowWarps = 8; // rows per CTA

/// Mean and 1/sqrt(var + eps) of row `r` (LAYER) or 1/sqrt(mean(x^2) + eps) (!LAYER).
template <bool LAYER>
__device__ __forceinline__ void rowStats(const elem* x, int64_t n, float eps, float& mean,
                                         float& rstd) {
  const int lane = threadIdx.x % 32;
  float s = 0.0f;
  if (LAYER) {
    for (int64_t j = lane; j < n; j += 32)
      s += toF(x[j]);
    for (int o = 16; o > 0; o /= 2)
      s += __shfl_xor_sync(0xffffffffu, s, o);
    mean = s / static_cast<float>(n);
  } else {
    mean = 0.0f;
  }
  float q = 0.0f;
  for (int64_t j = lane; j < n; j += 32) {
    float d = toF(x[j]) - mean;
    q += d * d;
  }
  for (int o = 16; o > 0; o /= 2)
    q += __shfl_xor_sync(0xffffffffu, q, o);
  rstd = rsqrtf(q / static_cast<float>(n) + eps);
}

/// norm_gemm's first pass: scratch[0][r] = mean, scratch[1][r] = rstd, for A = in[0] ([M, K]).
template <bool LAYER> __device__ __forceinline__ void rowStatsPass(const FpatKernelArgs& a) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (r >= a.M)
    return;
  float mean, rstd;
  rowStats<LAYER>(static_cast<const elem*>(a.in[0]) + r * a.K, a.K, a.eps, mean, rstd);
  if (threadIdx.x % 32 == 0) {
    static_cast<float*>(a.scratch[0])[r] = mean;
    static_cast<float*>(a.scratch[1])[r] = rstd;
  }
}

/// LayerNorm (in: x, gamma, beta) or RMSNorm (in: x, gamma) of an [M, N] tensor.
template <bool LAYER> __device__ __forceinline__ void normRows(const FpatKernelArgs& a) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (r >= a.M)
    return;
  const int64_t n = a.N;
  const elem* x = static_cast<const elem*>(a.in[0]) + r * n;
  elem* y = static_cast<elem*>(a.out) + r * n;
  float mean, rstd;
  rowStats<LAYER>(x, n, a.eps, mean, rstd);
  for (int64_t j = threadIdx.x % 32; j < n; j += 32) {
    float v = (toF(x[j]) - mean) * rstd * ldh(a.in[1], j);
    if (LAYER)
      v += ldh(a.in[2], j);
    y[j] = fromF(v);
  }
}

/// reduce_mean over the last dimension: out[r] = mean of row r of in[0] ([M, N]), f32 sum.
__device__ __forceinline__ void meanRows(const FpatKernelArgs& a) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (r >= a.M)
    return;
  const elem* x = static_cast<const elem*>(a.in[0]) + r * a.N;
  float s = 0.0f;
  for (int64_t j = threadIdx.x % 32; j < a.N; j += 32)
    s += toF(x[j]);
  for (int o = 16; o > 0; o /= 2)
    s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0)
    static_cast<elem*>(a.out)[r] = fromF(s / static_cast<float>(a.N));
}

} // namespace fpat
