// Weight and operand copies the Hopper GEMM reads in place of the graph's tensors, made by
// launches of their own before the GEMM (codegen::Launch's PaddedRows, PreparedWeight and
// PreparedColumns): rows padded for TMA, weights transposed, gamma folded in, two weights
// interleaved for the dual GEMM, and the deferred LayerNorm's column terms.
#pragma once

#include "fpat_common.cuh"

namespace fpat {

/// K % 8 != 0 (TMA's row strides must be multiples of 16 bytes): copies the rows of A (operand
/// 0, M x K) and, with TRANS_B, of B (operand B_INDEX, N x K) into a.padded[0] and a.padded[1]
/// as rows of K rounded up to 8 elements, the pad zeroed (the tensor maps read only K columns;
/// TMA fills the rest of a box). A block copies a row at a time, each thread 8 elements of it
/// per step: the source rows are only 2-byte aligned, the padded ones 16-byte.
template <bool TRANS_B, int B_INDEX>
__device__ __forceinline__ void padRows(const FpatKernelArgs& a) {
  const int64_t K = a.K, P = (K + 7) / 8 * 8, rows = a.M + (TRANS_B ? a.N : 0);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const bool isA = r < a.M;
    const int64_t row = isA ? r : r - a.M;
    const elem* src = static_cast<const elem*>(a.in[isA ? 0 : B_INDEX]) + row * K;
    Half8* dst = reinterpret_cast<Half8*>(static_cast<elem*>(a.padded[isA ? 0 : 1]) + row * P);
    for (int64_t c = threadIdx.x; c < P / 8; c += blockDim.x) {
      Half8 v;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        v.h[e] = 8 * c + e < K ? src[8 * c + e] : fromF(0.0f);
      dst[c] = v;
    }
  }
}

/// A weight B (operand B_INDEX) copied into a.padded[1] as N rows of K rounded up to 8
/// elements, the pad zeroed: transposed from [K, N] (SRC_KN) or re-pitched from [N, K]. The
/// runtime runs it once when the weight is uploaded; one 64 x 64 tile per step of a
/// block-stride loop, through shared memory so that reads and writes both go along rows.
/// FOLD_GAMMA (the deferred norm of norm_gemm): each element times gamma[k] (operand 1) in f32,
/// rounded once, so that the GEMM on raw rows computes x (diag(gamma) W).
/// DUAL (the dual GEMM): operands B_INDEX (Bg) and B_INDEX + 1 (Bu) interleaved into
/// codegen::dualColumns(N) rows: row 16 j + i is Bg's column 8 j + i, row 16 j + 8 + i Bu's.
template <bool SRC_KN, int B_INDEX, bool FOLD_GAMMA = false, bool DUAL = false>
__device__ __forceinline__ void prepareWeightB(const FpatKernelArgs& a) {
  __shared__ elem t[64][65]; // [n][k]; the odd pitch keeps the transposing writes conflict-free
  const int64_t N = a.N, K = a.K, P = (K + 7) / 8 * 8;
  const int64_t rows = DUAL ? 2 * ((N + 7) / 8 * 8) : N; // of the copy
  const int64_t tilesN = (rows + 63) / 64, tiles = tilesN * ((P + 63) / 64);
  elem* dst = static_cast<elem*>(a.padded[1]);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t n0 = tile % tilesN * 64, k0 = tile / tilesN * 64;
    for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) {
      const int r = i / 64, c = i % 64; // r along the source's rows, c along them
      const int64_t n = SRC_KN ? n0 + c : n0 + r, k = SRC_KN ? k0 + r : k0 + c;
      const int64_t col = DUAL ? n / 16 * 8 + n % 8 : n; // of the source
      const elem* src = static_cast<const elem*>(a.in[DUAL ? B_INDEX + n / 8 % 2 : B_INDEX]);
      elem v = n < rows && col < N && k < K ? src[SRC_KN ? k * N + col : col * K + k] : fromF(0.0f);
      if (FOLD_GAMMA && k < K)
        v = fromF(toF(v) * ldh(a.in[1], k));
      if (SRC_KN)
        t[c][r] = v;
      else
        t[r][c] = v;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) {
      const int r = i / 64, c = i % 64;
      if (n0 + r < rows && k0 + c < P)
        dst[(n0 + r) * P + k0 + c] = t[r][c];
    }
    __syncthreads();
  }
}

/// The deferred LayerNorm's column terms, behind the prepared B in a.padded[1]: colsum[n] =
/// sum over k of the prepared (gamma-folded, rounded) B[k][n], and (beta W)[n] = sum over k of
/// beta[k] W[k][n], f32, each padded with zeros to normColumnsPitch(N) entries, a multiple of
/// every tile's width: the epilogue reads a tile's columns without bounds checks.
__device__ __forceinline__ int64_t normColumnsPitch(int64_t n) {
  return (n + 255) / 256 * 256;
}
__device__ __forceinline__ float* normColumns(const FpatKernelArgs& a) {
  return reinterpret_cast<float*>(static_cast<char*>(a.padded[1]) + a.N * ((a.K + 7) / 8 * 8) * 2);
}

/// Writes those column terms from the weight W (operand B_INDEX, [K, N] where SRC_KN, else
/// [N, K]), gamma (operand 1) and beta (operand 2); run once, when the weight is uploaded. One
/// warp per column: its lanes stride k.
template <bool SRC_KN, int B_INDEX>
__device__ __forceinline__ void prepareNormColumns(const FpatKernelArgs& a) {
  const int64_t N = a.N, K = a.K, pitch = normColumnsPitch(N);
  const elem* w = static_cast<const elem*>(a.in[B_INDEX]);
  float* const cols = normColumns(a);
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / 32; n < pitch;
       n += static_cast<int64_t>(gridDim.x) * warps) {
    float cs = 0.0f, bw = 0.0f;
    if (n < N)
      for (int64_t k = lane; k < K; k += 32) {
        const float v = toF(w[SRC_KN ? k * N + n : n * K + k]);
        cs += toF(fromF(v * ldh(a.in[1], k))); // the element prepareWeightB stored
        bw += ldh(a.in[2], k) * v;
      }
    for (int o = 16; o > 0; o /= 2) {
      cs += __shfl_xor_sync(0xffffffffu, cs, o);
      bw += __shfl_xor_sync(0xffffffffu, bw, o);
    }
    if (lane == 0) {
      cols[n] = cs;
      cols[pitch + n] = bw;
    }
  }
}

} // namespace fpat
