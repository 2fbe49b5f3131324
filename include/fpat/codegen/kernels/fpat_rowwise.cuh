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

/// The deferred norm's statistics (wgmma norm_gemm): rowStats[0][r] = mean, rowStats[1][r] =
/// rstd of row r of A = in[0] ([M, K]), one warp per row (deferredRowStats).
/// The GEMM after it starts while this runs and waits for it only in its epilogue.
template <bool LAYER> __device__ __forceinline__ void deferredNormStats(const FpatKernelArgs& a) {
  allowDependentGrid();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (r >= a.M)
    return;
  float mean, rstd;
  deferredRowStats<LAYER>(static_cast<const elem*>(a.in[0]) + r * a.K, a.K, a.eps, mean, rstd);
  if (threadIdx.x % 32 == 0) {
    static_cast<float*>(a.rowStats[0])[r] = mean;
    static_cast<float*>(a.rowStats[1])[r] = rstd;
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

/// LayerNorm / RMSNorm as normRows, with each row read from memory once and held in registers:
/// V 16-byte words per lane (rows of N <= 256 V elements, N % 8 == 0, 16-byte aligned rows),
/// every load of a row issued before the first sum, so that one warp keeps a whole row in
/// flight (the element-by-element loop above ran at ~0.9 TB/s on the H200, 57 us for 7 rows).
/// The statistics are the same two passes (mean, then the centred second moment), over the
/// registers.
template <bool LAYER, int V> __device__ __forceinline__ void normRowsHeld(const FpatKernelArgs& a) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (r >= a.M)
    return;
  const int lane = threadIdx.x % 32;
  const int64_t n = a.N, words = n / 8;
  const uint4* x8 = reinterpret_cast<const uint4*>(static_cast<const elem*>(a.in[0]) + r * n);
  // Short rows (decode: one row is the whole launch; N <= 1024) load gamma and beta with the row,
  // so that the write does not wait for a second round trip; long rows have no registers to spare.
  constexpr int P = V <= 4 ? V : 1;
  const uint4* g8 = static_cast<const uint4*>(a.in[1]);
  const uint4* b8 = LAYER ? static_cast<const uint4*>(a.in[2]) : nullptr;
  Half8 h[V], gp[P], bp[P];
#pragma unroll
  for (int i = 0; i < V; ++i)
    if (lane + 32 * i < words) {
      h[i].u = __ldg(x8 + lane + 32 * i);
      if (V <= 4) {
        gp[i % P].u = __ldg(g8 + lane + 32 * i);
        if (LAYER)
          bp[i % P].u = __ldg(b8 + lane + 32 * i);
      }
    }
  float mean = 0.0f;
  if (LAYER) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (lane + 32 * i < words)
#pragma unroll
        for (int e = 0; e < 8; ++e)
          s += toF(h[i].h[e]);
    for (int o = 16; o > 0; o /= 2)
      s += __shfl_xor_sync(0xffffffffu, s, o);
    mean = s / static_cast<float>(n);
  }
  float q = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i)
    if (lane + 32 * i < words)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float d = toF(h[i].h[e]) - mean;
        q += d * d;
      }
  for (int o = 16; o > 0; o /= 2)
    q += __shfl_xor_sync(0xffffffffu, q, o);
  const float rstd = rsqrtf(q / static_cast<float>(n) + a.eps);
  uint4* y8 = reinterpret_cast<uint4*>(static_cast<elem*>(a.out) + r * n);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t j = lane + 32 * i;
    if (j >= words)
      continue;
    Half8 g, b, y;
    if (V <= 4) {
      g = gp[i % P];
      b = bp[i % P];
    } else {
      g.u = __ldg(g8 + j);
      if (LAYER)
        b.u = __ldg(b8 + j);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float v = (toF(h[i].h[e]) - mean) * rstd * toF(g.h[e]);
      if (LAYER)
        v += toF(b.h[e]);
      y.h[e] = fromF(v);
    }
    y8[j] = y.u;
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

/// Softmax over each row (its last dimension), one warp per row, in f32: the row's maximum,
/// then the sum of exp(x - max), then the quotients; the passes after the first read the row
/// from L1/L2. A row of -inf gives NaN (exp(-inf - -inf)), as the reference and torch do.
__device__ __forceinline__ void softmaxRows(const FpatKernelArgs& a) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (r >= a.M)
    return;
  const elem* x = static_cast<const elem*>(a.in[0]) + r * a.N;
  elem* y = static_cast<elem*>(a.out) + r * a.N;
  const int lane = threadIdx.x % 32;
  float mx = -INFINITY;
  for (int64_t j = lane; j < a.N; j += 32)
    mx = fmaxf(mx, toF(x[j]));
  for (int o = 16; o > 0; o /= 2)
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float s = 0.0f;
  for (int64_t j = lane; j < a.N; j += 32)
    s += expf(toF(x[j]) - mx);
  for (int o = 16; o > 0; o /= 2)
    s += __shfl_xor_sync(0xffffffffu, s, o);
  const float inv = 1.0f / s;
  for (int64_t j = lane; j < a.N; j += 32)
    y[j] = fromF(expf(toF(x[j]) - mx) * inv);
}

} // namespace fpat
