// Attention's ops as plain CUDA-core kernels: the column slice, heads (a copy), concat, RoPE,
// the per-head scores Q K^T, P V,
// and the whole softmax(scale * Q K^T + bias) V with one warp per query row and an online
// softmax in f32. These are the correct path for any shape (ragged lengths, GQA, any bias
// broadcast); they are not the flash-attention kernel, and run far below the tensor cores.
//
// D provides the sizes as compile-time constants (the generator writes them):
//   B, Sq, Sk, H, Hkv, Hd   batch, query and key rows per batch, heads, KV heads, head dim
//   bias0..bias3            attention: the element strides of the bias over [B, H, Sq, Sk]
//                           (0 where it broadcasts)
//   qPitch, kPitch, vPitch  attention: elements from one row of q, k, v to the next (wider
//                           than the heads where they are column views of a QKV projection)
//   kKvHeadMajor            k and v are caches [B, Hkv, Sk, Hd] (kv_append's results), not
//                           token-major (their pitch is then Hd)
// Activations are token-major: row b * S + s, head h in columns [h * Hd, (h + 1) * Hd).
#pragma once

#include "fpat_common.cuh"

namespace fpat {

/// out[r, c] = in[r, BEGIN + c] for c < WIDTH, in having N columns.
template <int64_t N, int64_t BEGIN, int64_t WIDTH>
__device__ __forceinline__ void sliceColumns(const FpatKernelArgs& a) {
  const int64_t total = a.M * WIDTH;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  elem* o = static_cast<elem*>(a.out);
  const elem* x = static_cast<const elem*>(a.in[0]);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step)
    o[i] = x[i / WIDTH * N + BEGIN + i % WIDTH];
}

/// Row r of the result is row r of in[0] (WA elements) then row r of in[1] (WB).
template <int64_t WA, int64_t WB>
__device__ __forceinline__ void concatColumns(const FpatKernelArgs& a) {
  const int64_t total = a.M * (WA + WB);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  elem* o = static_cast<elem*>(a.out);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const int64_t r = i / (WA + WB), c = i % (WA + WB);
    o[i] = c < WA ? static_cast<const elem*>(a.in[0])[r * WA + c]
                  : static_cast<const elem*>(a.in[1])[r * WB + c - WA];
  }
}

template <int V> struct RowPiece; // V elements of 2 bytes, moved as one
template <> struct RowPiece<8> { using T = uint4; };
template <> struct RowPiece<4> { using T = uint2; };
template <> struct RowPiece<2> { using T = unsigned; };
template <> struct RowPiece<1> { using T = unsigned short; };

/// Rows of in[0] (W elements each) seen as [A, C] written transposed, [C, A]: result row
/// j A + i is operand row i C + j (batch_first: A = S, C = B; seq_first: A = B, C = S).
template <int64_t A, int64_t C, int64_t W>
__device__ __forceinline__ void transposeRows(const FpatKernelArgs& a) {
  constexpr int V = W % 8 == 0 ? 8 : W % 4 == 0 ? 4 : W % 2 == 0 ? 2 : 1;
  constexpr int64_t P = W / V; // pieces a row
  using T = typename RowPiece<V>::T;
  const T* x = static_cast<const T*>(a.in[0]);
  T* o = static_cast<T*>(a.out);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < A * C * P;
       i += step) {
    const int64_t row = i / P, j = row / A, k = row % A;
    o[i] = x[(k * C + j) * P + i % P];
  }
}

/// kv_append: out [B, HKV, P + S, HD] holds each (batch b, KV head h)'s P rows of the cache
/// in[0] [B, HKV, P, HD], then its S new rows: in[1]'s tokens b * S .. b * S + S - 1, columns
/// h * HD .., tokens PITCH elements apart (token-major; wider where in[1] is a column view).
template <int64_t B, int64_t HKV, int64_t P, int64_t S, int64_t HD, int64_t PITCH>
__device__ __forceinline__ void appendKv(const FpatKernelArgs& a) {
  constexpr int V = HD % 8 == 0 && PITCH % 8 == 0   ? 8
                    : HD % 4 == 0 && PITCH % 4 == 0 ? 4
                    : HD % 2 == 0 && PITCH % 2 == 0 ? 2
                                                    : 1;
  constexpr int64_t R = HD / V, L = P + S; // pieces a row, rows a head
  using T = typename RowPiece<V>::T;
  const T* cache = static_cast<const T*>(a.in[0]);
  const T* fresh = static_cast<const T*>(a.in[1]);
  T* o = static_cast<T*>(a.out);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < B * HKV * L * R;
       i += step) {
    const int64_t e = i % R, j = i / R % L, bh = i / R / L;
    o[i] = j < P ? cache[(bh * P + j) * R + e]
                 : fresh[((bh / HKV * S + j - P) * PITCH + bh % HKV * HD) / V + e];
  }
}

/// Rotary embedding, rotate_half form, over rows of D (even) elements: out = x * cos +
/// (-x2, x1) * sin, with cos and sin read through B::at(1 | 2, i) (their broadcast indices).
/// x's tokens are W elements (its heads) PITCH apart (wider where x is a column view of a
/// QKV projection).
template <int64_t D, int64_t W, int64_t PITCH, class B>
__device__ __forceinline__ void ropeHalves(const FpatKernelArgs& a) {
  const int64_t total = a.M * a.N;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const elem* x = static_cast<const elem*>(a.in[0]);
  elem* o = static_cast<elem*>(a.out);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const int64_t c = i % D, xi = i / W * PITCH + i % W;
    const float rot = c < D / 2 ? -toF(x[xi + D / 2]) : toF(x[xi - D / 2]);
    o[i] = fromF(fmaf(toF(x[xi]), ldh(a.in[1], B::at(1, i)), rot * ldh(a.in[2], B::at(2, i))));
  }
}

/// Rotary embedding, interleaved form (GPT-J's rotate_every_two), over rows of D (even)
/// elements: out = x * cos + rot * sin, rot taking each pair (x[2i], x[2i+1]) to
/// (-x[2i+1], x[2i]). x's tokens as in ropeHalves.
template <int64_t D, int64_t W, int64_t PITCH, class B>
__device__ __forceinline__ void ropePairs(const FpatKernelArgs& a) {
  const int64_t total = a.M * a.N;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const elem* x = static_cast<const elem*>(a.in[0]);
  elem* o = static_cast<elem*>(a.out);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const int64_t xi = i / W * PITCH + i % W;
    const float rot = i % 2 == 0 ? -toF(x[xi + 1]) : toF(x[xi - 1]);
    o[i] = fromF(fmaf(toF(x[xi]), ldh(a.in[1], B::at(1, i)), rot * ldh(a.in[2], B::at(2, i))));
  }
}

/// The first key (value) of batch b and KV head hk: token-major rows PITCH elements apart,
/// or, where D::kKvHeadMajor, a cache [B, Hkv, Sk, Hd] (kv_append's), rows Hd apart.
template <class D> __device__ __forceinline__ int64_t kvBase(int64_t b, int64_t hk, int64_t pitch) {
  if constexpr (D::kKvHeadMajor)
    return (b * D::Hkv + hk) * D::Sk * D::Hd;
  else
    return b * D::Sk * pitch + hk * D::Hd;
}

/// The elements from one dense key (value) row to the next (a variable: device code may not
/// call a constexpr host function).
template <class D> inline constexpr int64_t kvDenseStep = D::kKvHeadMajor ? D::Hd : D::Hkv * D::Hd;

/// scores[b, h, i, j] = sum_c q[b * Sq + i, h * Hd + c] * k[b * Sk + j, h / (H / Hkv) * Hd + c].
template <class D> __device__ __forceinline__ void attnScores(const FpatKernelArgs& a) {
  constexpr int64_t total = D::B * D::H * D::Sq * D::Sk, group = D::H / D::Hkv;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const elem* q = static_cast<const elem*>(a.in[0]);
  const elem* k = static_cast<const elem*>(a.in[1]);
  elem* o = static_cast<elem*>(a.out);
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += step) {
    const int64_t j = e % D::Sk, i = e / D::Sk % D::Sq, h = e / D::Sk / D::Sq % D::H,
                  b = e / D::Sk / D::Sq / D::H;
    const elem* qr = q + (b * D::Sq + i) * D::H * D::Hd + h * D::Hd;
    const elem* kr = k + kvBase<D>(b, h / group, kvDenseStep<D>) + j * kvDenseStep<D>;
    float s = 0.0f;
    for (int64_t c = 0; c < D::Hd; ++c)
      s = fmaf(toF(qr[c]), toF(kr[c]), s);
    o[e] = fromF(s);
  }
}

/// out[b * Sq + i, h * Hd + c] = sum_j p[b, h, i, j] * v[b * Sk + j, h / (H / Hkv) * Hd + c].
template <class D> __device__ __forceinline__ void attnValues(const FpatKernelArgs& a) {
  constexpr int64_t total = D::B * D::Sq * D::H * D::Hd, group = D::H / D::Hkv;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const elem* p = static_cast<const elem*>(a.in[0]);
  const elem* v = static_cast<const elem*>(a.in[1]);
  elem* o = static_cast<elem*>(a.out);
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += step) {
    const int64_t c = e % D::Hd, h = e / D::Hd % D::H, i = e / D::Hd / D::H % D::Sq,
                  b = e / D::Hd / D::H / D::Sq;
    const elem* pr = p + ((b * D::H + h) * D::Sq + i) * D::Sk;
    const elem* vc = v + kvBase<D>(b, h / group, kvDenseStep<D>) + c;
    float s = 0.0f;
    for (int64_t j = 0; j < D::Sk; ++j)
      s = fmaf(toF(pr[j]), toF(vc[j * kvDenseStep<D>]), s);
    o[e] = fromF(s);
  }
}

/// One warp per query row (b, h, i): each lane holds Hd / 32 (rounded up) columns of q and of
/// the output; per key, the dot product is reduced across the warp, then the running maximum,
/// sum and output are rescaled (online softmax, f32). The scale is in[4]; the bias in[3].
/// A row whose scores are all -inf divides 0 by 0 (NaN), as the exact softmax does.
template <class D> __device__ __forceinline__ void attentionRows(const FpatKernelArgs& a) {
  constexpr int kPer = static_cast<int>((D::Hd + 31) / 32);
  constexpr int64_t rows = D::B * D::H * D::Sq, group = D::H / D::Hkv;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows)
    return;
  const int lane = threadIdx.x % 32;
  const int64_t i = r % D::Sq, h = r / D::Sq % D::H, b = r / D::Sq / D::H;
  const elem* q = static_cast<const elem*>(a.in[0]) + (b * D::Sq + i) * D::qPitch + h * D::Hd;
  const elem* k = static_cast<const elem*>(a.in[1]) + kvBase<D>(b, h / group, D::kPitch);
  const elem* v = static_cast<const elem*>(a.in[2]) + kvBase<D>(b, h / group, D::vPitch);
  const float scale = ldh(a.in[4], 0);
  float qv[kPer], acc[kPer];
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int64_t c = lane + 32 * t;
    qv[t] = c < D::Hd ? toF(q[c]) : 0.0f;
    acc[t] = 0.0f;
  }
  const int64_t biasRow = b * D::bias0 + h * D::bias1 + i * D::bias2;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = 0; j < D::Sk; ++j) {
    const elem* kr = k + j * D::kPitch;
    float dot = 0.0f;
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < D::Hd)
        dot = fmaf(qv[t], toF(kr[c]), dot);
    }
    for (int o = 16; o > 0; o /= 2)
      dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float s = scale * dot + ldh(a.in[3], biasRow + j * D::bias3);
    const float mNew = fmaxf(m, s);
    if (mNew == -INFINITY)
      continue; // every score so far is -inf: nothing to add yet
    const float corr = __expf(m - mNew), p = __expf(s - mNew);
    l = l * corr + p;
    const elem* vr = v + j * D::vPitch;
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int64_t c = lane + 32 * t;
      acc[t] = acc[t] * corr + (c < D::Hd ? p * toF(vr[c]) : 0.0f);
    }
    m = mNew;
  }
  elem* o = static_cast<elem*>(a.out) + (b * D::Sq + i) * D::H * D::Hd + h * D::Hd;
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < D::Hd)
      o[c] = fromF(acc[t] / l);
  }
}

} // namespace fpat
