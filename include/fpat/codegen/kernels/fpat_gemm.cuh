// Kernel family "gemm": C[M,N] = epilogue(A[M,K] * B) on tensor cores through WMMA
// (f16 in, f32 accumulate), for any M, N, K >= 1.
//
//   B is [K, N] row-major, or [N, K] when TRANS_B (a "B^T" weight layout).
//   NORM != 0 makes this the second half of "norm_gemm": rows of A are normalised while they
//   are loaded (LayerNorm: NORM 1, RMSNorm: NORM 2) with per-row statistics computed by
//   fpat_row_stats (fpat_rowwise.cuh), and gamma/beta from the argument block.
//
// Structure (CUTLASS names): a CTA computes a BM x BN tile of C with (BM/WM) x (BN/WN) warps,
// each warp a WM x WN tile made of 16x16 WMMA fragments. K is walked in BK steps through a
// STAGES-deep ring of shared-memory tiles (sA, sB). On sm_80+ aligned tiles are copied with
// cp.async (zero-filling out-of-range rows/columns); otherwise, and for normalised A, tiles go
// through registers: loaded before the current stage's MMAs, stored after them.
// VEC says that 16-byte chunks of A and B rows are aligned and either fully in or out of range
// (K % 8 == 0, and N % 8 == 0 unless TRANS_B); without it every element is bounds-checked.
// The epilogue stages each accumulator fragment through a per-warp 16x16 f32 scratch, so each
// lane applies the epilogue to 8 consecutive columns and stores them with one 16-byte write.
#pragma once

#include "fpat_common.cuh"

#include <mma.h>
#include <type_traits>

namespace fpat {

/// Whether an Epilogue reads column pairs (Epilogue::kPairs, which only those define: rope):
/// the kernels then call pair() only.
template <class E, class = void> struct PairEpilogue { static constexpr bool value = false; };
template <class E> struct PairEpilogue<E, decltype(void(E::kPairs))> {
  static constexpr bool value = E::kPairs;
};

template <int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_> struct GemmTile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = STAGES_;
  static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static constexpr int FM = WM / 16, FN = WN / 16; // fragments per warp
  static constexpr int PAD = 8;                    // halves of padding per smem row (banks)
  static_assert(BM % WM == 0 && BN % WN == 0, "warp tiles must divide the CTA tile");
  static_assert(WM % 16 == 0 && WN % 16 == 0 && BK % 16 == 0, "WMMA works on 16x16x16");
  static_assert(STAGES >= 2, "the pipeline needs at least two stages");
};

/// Shared memory (bytes) a configuration needs; the host sets it as the dynamic size.
template <class T, bool TRANS_B> constexpr int gemmSmemBytes() {
  int a = T::BM * (T::BK + T::PAD);
  int b = TRANS_B ? T::BN * (T::BK + T::PAD) : T::BK * (T::BN + T::PAD);
  int pipe = T::STAGES * (a + b) * 2;
  int epi = T::WARPS_M * T::WARPS_N * 16 * 20 * 4;
  return pipe > epi ? pipe : epi;
}

namespace detail {

/// Normalises 8 consecutive A values of row `r` starting at column `k` (NORM 1 or 2).
template <int NORM>
__device__ __forceinline__ void normalise8(float* v, int64_t r, int64_t k, int64_t K,
                                           const FpatKernelArgs& a) {
  const float mean = NORM == 1 ? static_cast<const float*>(a.scratch[0])[r] : 0.0f;
  const float rstd = static_cast<const float*>(a.scratch[1])[r];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (k + e >= K) {
      v[e] = 0.0f;
      continue;
    }
    float y = (v[e] - mean) * rstd * ldh(a.in[1], k + e);
    if (NORM == 1)
      y += ldh(a.in[2], k + e);
    v[e] = y;
  }
}

} // namespace detail

/// The shared-memory layout of a configuration: a ring of S stages of A ([BM][LDA]) and then
/// of B ([BK][LDB], or [BN][LDB] with TRANS_B), rows padded by T::PAD halves (banks).
template <class T, bool TRANS_B> struct GemmLayout {
  static constexpr int LDA = T::BK + T::PAD; // sA row stride (halves)
  static constexpr int LDB = TRANS_B ? T::BK + T::PAD : T::BN + T::PAD;
  static constexpr int A_STAGE = T::BM * LDA;
  static constexpr int B_STAGE = TRANS_B ? T::BN * LDB : T::BK * LDB;
};

namespace detail {

/// A CTA's tile loads: k-tile kt of its A rows and B columns into a stage, by cp.async (ASYNC_A,
/// ASYNC_B) or through registers (loaded before the current stage's MMAs, stored after them),
/// with norm_gemm's rows normalised (NORM). Chunk c of a tile is (row c / (cols / 8), 8 columns
/// at (c % (cols / 8)) * 8).
template <class T, bool TRANS_B, bool VEC, int NORM, bool ASYNC_A, bool ASYNC_B> struct GemmLoader {
  using L = GemmLayout<T, TRANS_B>;
  static constexpr int BK = T::BK, BN = T::BN;
  // 16-byte chunks per tile and per thread.
  static constexpr int A_CHUNKS = T::BM * BK / 8, B_CHUNKS = BK * BN / 8;
  static constexpr int A_ITERS = (A_CHUNKS + T::THREADS - 1) / T::THREADS;
  static constexpr int B_ITERS = (B_CHUNKS + T::THREADS - 1) / T::THREADS;
  // The cp.async path: the rows and columns a thread copies are the same in every k-tile
  // (THREADS is a multiple of the chunks per tile row), so addresses and row predicates are
  // computed once here and a k-tile only adds its offset. This keeps 64-bit index arithmetic
  // and branches out of the main loop, where they compete with the MMAs for issue slots.
  static constexpr int A_PER_ROW = BK / 8, A_ROW_STEP = T::THREADS / A_PER_ROW;
  static_assert(T::THREADS % A_PER_ROW == 0, "a thread's A chunks must share a column");
  static constexpr int B_PER_ROW = (TRANS_B ? BK : BN) / 8, B_ROW_STEP = T::THREADS / B_PER_ROW;
  static_assert(T::THREADS % B_PER_ROW == 0, "a thread's B chunks must share a column");

  const FpatKernelArgs& args;
  const elem *A, *B;
  elem *sA, *sB;
  int64_t M, N, K, row0, col0;
  int tid;
  int aRow, aCol;
  const elem* aSrc;  // chunk i adds i * A_ROW_STEP rows
  int64_t aRowsLeft; // chunk i is in range if i * STEP < this
  int bRow, bCol;
  // TRANS_B: rows are n and columns k; otherwise rows are k and columns n.
  const elem* bSrc;
  bool bColIn;
  int64_t bRowsLeft;
  // Register staging for the non-async paths.
  Half8 ra[A_ITERS], rb[B_ITERS];

  __device__ __forceinline__ GemmLoader(const FpatKernelArgs& a, const elem* A_, const elem* B_,
                                        elem* sA_, elem* sB_, int64_t row0_, int64_t col0_)
      : args(a), A(A_), B(B_), sA(sA_), sB(sB_), M(a.M), N(a.N), K(a.K), row0(row0_), col0(col0_),
        tid(threadIdx.x) {
    aRow = tid / A_PER_ROW;
    aCol = (tid % A_PER_ROW) * 8;
    aSrc = A + (row0 + aRow) * K + aCol;
    aRowsLeft = M - row0 - aRow;
    bRow = tid / B_PER_ROW;
    bCol = (tid % B_PER_ROW) * 8;
    bSrc = TRANS_B ? B + (col0 + bRow) * K + bCol : B + bRow * N + col0 + bCol;
    bColIn = TRANS_B || col0 + bCol < N;
    bRowsLeft = TRANS_B ? N - col0 - bRow : 0;
  }

  __device__ __forceinline__ static void aChunk(int c, int& r, int& k) {
    r = c / (BK / 8);
    k = (c % (BK / 8)) * 8;
  }
  __device__ __forceinline__ static void bChunk(int c, int& r, int& x) {
    constexpr int per = (TRANS_B ? BK : BN) / 8;
    r = c / per;
    x = (c % per) * 8;
  }

  __device__ __forceinline__ void loadA(int kt, int stage, bool toRegs) {
    if (ASYNC_A && !toRegs) {
      const bool kIn = static_cast<int64_t>(kt) * BK + aCol < K;
      elem* dst = sA + stage * L::A_STAGE + aRow * L::LDA + aCol;
#pragma unroll
      for (int i = 0; i < A_ITERS; ++i) {
        if (A_CHUNKS % T::THREADS != 0 && tid + i * T::THREADS >= A_CHUNKS)
          break;
        const bool in = kIn && i * A_ROW_STEP < aRowsLeft;
        const elem* src = aSrc + static_cast<int64_t>(i) * A_ROW_STEP * K + kt * BK;
        cp_async_16(dst + i * A_ROW_STEP * L::LDA, in ? src : A, in ? 16 : 0);
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
      int c = tid + i * T::THREADS;
      if (c >= A_CHUNKS)
        break;
      int r, k;
      aChunk(c, r, k);
      const int64_t gr = row0 + r, gk = static_cast<int64_t>(kt) * BK + k;
      elem* dst = sA + stage * L::A_STAGE + r * L::LDA + k;
      Half8 v;
      if (VEC) {
        v.u = gr < M && gk < K ? *reinterpret_cast<const uint4*>(A + gr * K + gk)
                               : make_uint4(0, 0, 0, 0);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          v.h[e] = gr < M && gk + e < K ? A[gr * K + gk + e] : fromF(0.0f);
      }
      if (NORM != 0 && !ASYNC_A && gr < M) {
        float f[8];
#pragma unroll
        for (int e = 0; e < 8; ++e)
          f[e] = toF(v.h[e]);
        normalise8<NORM>(f, gr, gk, K, args);
#pragma unroll
        for (int e = 0; e < 8; ++e)
          v.h[e] = fromF(f[e]);
      }
      if (toRegs)
        ra[i] = v;
      else
        *reinterpret_cast<uint4*>(dst) = v.u;
    }
  }

  __device__ __forceinline__ void storeA(int stage) {
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
      int c = tid + i * T::THREADS;
      if (c >= A_CHUNKS)
        break;
      int r, k;
      aChunk(c, r, k);
      *reinterpret_cast<uint4*>(sA + stage * L::A_STAGE + r * L::LDA + k) = ra[i].u;
    }
  }

  /// norm_gemm with cp.async: a stage's A tile is normalised in place once it has arrived.
  /// Rows past M and columns past K stay zero.
  __device__ __forceinline__ void normaliseStage(int kt, int stage) {
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
      int c = tid + i * T::THREADS;
      if (c >= A_CHUNKS)
        break;
      int r, k;
      aChunk(c, r, k);
      const int64_t gr = row0 + r, gk = static_cast<int64_t>(kt) * BK + k;
      if (gr >= M)
        continue;
      Half8 v;
      uint4* p = reinterpret_cast<uint4*>(sA + stage * L::A_STAGE + r * L::LDA + k);
      v.u = *p;
      float f[8];
#pragma unroll
      for (int e = 0; e < 8; ++e)
        f[e] = toF(v.h[e]);
      normalise8<NORM>(f, gr, gk, K, args);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        v.h[e] = fromF(f[e]);
      *p = v.u;
    }
  }

  __device__ __forceinline__ void loadB(int kt, int stage, bool toRegs) {
    if (ASYNC_B && !toRegs) {
      elem* dst = sB + stage * L::B_STAGE + bRow * L::LDB + bCol;
#pragma unroll
      for (int i = 0; i < B_ITERS; ++i) {
        if (B_CHUNKS % T::THREADS != 0 && tid + i * T::THREADS >= B_CHUNKS)
          break;
        const int64_t k0 = static_cast<int64_t>(kt) * BK;
        const bool in = TRANS_B ? i * B_ROW_STEP < bRowsLeft && k0 + bCol < K
                                : bColIn && k0 + bRow + i * B_ROW_STEP < K;
        const elem* src = TRANS_B ? bSrc + static_cast<int64_t>(i) * B_ROW_STEP * K + k0
                                  : bSrc + (k0 + i * B_ROW_STEP) * N;
        cp_async_16(dst + i * B_ROW_STEP * L::LDB, in ? src : B, in ? 16 : 0);
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < B_ITERS; ++i) {
      int c = tid + i * T::THREADS;
      if (c >= B_CHUNKS)
        break;
      int r, x;
      bChunk(c, r, x);
      // TRANS_B: r indexes N and x indexes K; otherwise r indexes K and x indexes N.
      const int64_t gk = static_cast<int64_t>(kt) * BK + (TRANS_B ? x : r);
      const int64_t gn = col0 + (TRANS_B ? r : x);
      const int64_t ld = TRANS_B ? K : N;
      const elem* src = TRANS_B ? B + gn * ld + gk : B + gk * ld + gn;
      elem* dst = sB + stage * L::B_STAGE + r * L::LDB + x;
      const bool inRow = TRANS_B ? gn < N : gk < K;
      Half8 v;
      if (VEC) {
        bool in = inRow && (TRANS_B ? gk < K : gn < N);
        v.u = in ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          bool in = inRow && (TRANS_B ? gk + e < K : gn + e < N);
          v.h[e] = in ? src[e] : fromF(0.0f);
        }
      }
      if (toRegs)
        rb[i] = v;
      else
        *reinterpret_cast<uint4*>(dst) = v.u;
    }
  }

  __device__ __forceinline__ void storeB(int stage) {
#pragma unroll
    for (int i = 0; i < B_ITERS; ++i) {
      int c = tid + i * T::THREADS;
      if (c >= B_CHUNKS)
        break;
      int r, x;
      bChunk(c, r, x);
      *reinterpret_cast<uint4*>(sB + stage * L::B_STAGE + r * L::LDB + x) = rb[i].u;
    }
  }
};

/// A warp's share of the tile's inner products: its WM x WN tile as 16x16 blocks, in WMMA
/// fragments, or with MMA (mma.sync m16n8k16) in registers loaded by ldmatrix.
template <class T, bool TRANS_B, bool MMA> struct GemmWarpMath {
  using L = GemmLayout<T, TRANS_B>;
  using FragA =
      nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, elem, nvcuda::wmma::row_major>;
  using LayoutB =
      typename std::conditional<TRANS_B, nvcuda::wmma::col_major, nvcuda::wmma::row_major>::type;
  using FragB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, elem, LayoutB>;
  using FragC = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

  /// Fragments of one 16-deep k step: WMMA fragments, or ldmatrix registers for mma.sync.
  struct Frags {
    FragA a[MMA ? 1 : T::FM];
    FragB b[MMA ? 1 : T::FN];
    unsigned ma[MMA ? T::FM : 1][4], mb[MMA ? T::FN : 1][4];
  };

  const elem *sA, *sB;
  int warpM, warpN, lane;
  FragC acc[MMA ? 1 : T::FM][MMA ? 1 : T::FN];
  // mma.sync accumulators: per 16x16 block, two 16x8 tiles of 4 floats each.
  float mc[MMA ? T::FM : 1][MMA ? T::FN : 1][8];

  __device__ __forceinline__ GemmWarpMath(const elem* sA_, const elem* sB_, int warpM_, int warpN_,
                                          int lane_)
      : sA(sA_), sB(sB_), warpM(warpM_), warpN(warpN_), lane(lane_) {
    if constexpr (!MMA) {
#pragma unroll
      for (int i = 0; i < T::FM; ++i)
#pragma unroll
        for (int j = 0; j < T::FN; ++j)
          nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);
    }
    if constexpr (MMA) {
#pragma unroll
      for (int i = 0; i < T::FM; ++i)
#pragma unroll
        for (int j = 0; j < T::FN; ++j)
#pragma unroll
          for (int e = 0; e < 8; ++e)
            mc[i][j][e] = 0.0f;
    }
  }

  __device__ __forceinline__ void loadFrags(Frags& f, int stage, int kk) const {
    constexpr int LDA = L::LDA, LDB = L::LDB;
    const elem* a = sA + stage * L::A_STAGE + warpM * T::WM * LDA;
    const elem* b = sB + stage * L::B_STAGE;
    if constexpr (MMA) {
#pragma unroll
      for (int i = 0; i < T::FM; ++i)
        ldmatrixX4(f.ma[i], a + (i * 16 + lane % 16) * LDA + kk + (lane / 16) * 8);
#pragma unroll
      for (int j = 0; j < T::FN; ++j) {
        const int n0 = warpN * T::WN + j * 16;
        if (TRANS_B) // B^T tile [n][k]: plain ldmatrix gives the column-major fragment
          ldmatrixX4(f.mb[j],
                     b + (n0 + lane % 8 + (lane / 16) * 8) * LDB + kk + ((lane / 8) % 2) * 8);
        else // B tile [k][n]: transposing ldmatrix
          ldmatrixX4Trans(f.mb[j],
                          b + (kk + lane % 8 + ((lane / 8) % 2) * 8) * LDB + n0 + (lane / 16) * 8);
      }
    } else {
#pragma unroll
      for (int i = 0; i < T::FM; ++i)
        nvcuda::wmma::load_matrix_sync(f.a[i], a + i * 16 * LDA + kk, LDA);
#pragma unroll
      for (int j = 0; j < T::FN; ++j) {
        const int n = warpN * T::WN + j * 16;
        nvcuda::wmma::load_matrix_sync(f.b[j], TRANS_B ? b + n * LDB + kk : b + kk * LDB + n, LDB);
      }
    }
  }

  __device__ __forceinline__ void multiply(const Frags& f) {
#pragma unroll
    for (int i = 0; i < T::FM; ++i)
#pragma unroll
      for (int j = 0; j < T::FN; ++j) {
        if constexpr (MMA) {
          mma16816(mc[i][j], f.ma[i], f.mb[j][0], f.mb[j][1]);
          mma16816(mc[i][j] + 4, f.ma[i], f.mb[j][2], f.mb[j][3]);
        } else {
          nvcuda::wmma::mma_sync(acc[i][j], f.a[i], f.b[j], acc[i][j]);
        }
      }
  }

  __device__ __forceinline__ void compute(int stage) {
#pragma unroll
    for (int kk = 0; kk < T::BK; kk += 16) {
      Frags f;
      loadFrags(f, stage, kk);
      multiply(f);
    }
  }

  /// The epilogue: each fragment through the warp's 16 x 16 f32 `scratch` (pitch 20), so that
  /// each lane applies the epilogue to 8 consecutive columns and stores them with one 16-byte
  /// write.
  template <class Epilogue>
  __device__ __forceinline__ void store(const FpatKernelArgs& args, float* scratch, int64_t row0,
                                        int64_t col0) {
    elem* C = static_cast<elem*>(args.out);
    const int64_t M = args.M, N = args.N;
    const bool vecC = (N % 8) == 0;
    const Epilogue epi;
#pragma unroll
    for (int i = 0; i < T::FM; ++i)
#pragma unroll
      for (int j = 0; j < T::FN; ++j) {
        if constexpr (MMA) {
          // m16n8 accumulator layout: c0, c1 at (lane / 4, 2 * (lane % 4) + {0, 1}), c2, c3
          // eight rows further down; two such tiles side by side make the 16x16 block.
          const int rr = lane / 4, cc = (lane % 4) * 2;
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            scratch[rr * 20 + t * 8 + cc] = mc[i][j][4 * t];
            scratch[rr * 20 + t * 8 + cc + 1] = mc[i][j][4 * t + 1];
            scratch[(rr + 8) * 20 + t * 8 + cc] = mc[i][j][4 * t + 2];
            scratch[(rr + 8) * 20 + t * 8 + cc + 1] = mc[i][j][4 * t + 3];
          }
        } else {
          nvcuda::wmma::store_matrix_sync(scratch, acc[i][j], 20, nvcuda::wmma::mem_row_major);
        }
        __syncwarp();
        const int r = lane / 2, c = (lane % 2) * 8;
        const int64_t gr = row0 + warpM * T::WM + i * 16 + r;
        const int64_t gc = col0 + warpN * T::WN + j * 16 + c;
        if (gr < M) {
          Half8 out;
          if constexpr (PairEpilogue<Epilogue>::value) {
            // Column pairs (gc is even, and so is N for such epilogues).
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
              const float2 p =
                  gc + e < N
                      ? epi.pair(make_float2(scratch[r * 20 + c + e], scratch[r * 20 + c + e + 1]),
                                 gr, gc + e, args, make_float2(0.0f, 0.0f))
                      : make_float2(0.0f, 0.0f);
              out.h[e] = fromF(p.x);
              out.h[e + 1] = fromF(p.y);
            }
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e)
              out.h[e] = fromF(gc + e < N ? epi(scratch[r * 20 + c + e], gr, gc + e, args) : 0.0f);
          }
          if (vecC && gc + 8 <= N) {
            *reinterpret_cast<uint4*>(C + gr * N + gc) = out.u;
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e)
              if (gc + e < N)
                C[gr * N + gc + e] = out.h[e];
          }
        }
        __syncwarp();
      }
  }
};

} // namespace detail

/// MMA selects the backend of the inner product: false, WMMA (sm_75+); true, mma.sync m16n8k16
/// with ldmatrix (sm_80+). Loads, pipeline and epilogue are shared.
template <class T, bool TRANS_B, bool VEC, int NORM, class Epilogue, bool MMA = false>
__device__ __forceinline__ void gemm(const FpatKernelArgs& args) {
  using L = GemmLayout<T, TRANS_B>;
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, S = T::STAGES;
#if FPAT_HAS_CP_ASYNC
  // Normalised A also arrives by cp.async; it is normalised in shared memory (see below).
  constexpr bool ASYNC_A = VEC, ASYNC_B = VEC;
#else
  constexpr bool ASYNC_A = false, ASYNC_B = false;
#endif

  extern __shared__ __align__(16) unsigned char smem[];
  elem* sA = reinterpret_cast<elem*>(smem); // [S][BM][LDA]
  elem* sB = sA + S * L::A_STAGE;           // [S][BK][LDB] or [S][BN][LDB]

  // The first input of a plain gemm is A; norm_gemm puts gamma (and beta) before B.
  const elem* A = static_cast<const elem*>(args.in[0]);
  const elem* B = static_cast<const elem*>(args.in[NORM == 0 ? 1 : NORM == 1 ? 3 : 2]);
  const int64_t K = args.K;
  // Grouped tile order: consecutive CTAs walk down a group of 8 M-tiles before moving to the
  // next N-tile, so the B columns and A rows in flight stay in L2.
  int64_t tileM, tileN;
  {
    const int64_t pid = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
    const int64_t tilesN = gridDim.x, tilesM = gridDim.y, group = 8;
    const int64_t perGroup = group * tilesN;
    const int64_t first = (pid / perGroup) * group;
    const int64_t size = tilesM - first < group ? tilesM - first : group;
    tileM = first + (pid % perGroup) % size;
    tileN = (pid % perGroup) / size;
  }
  const int64_t row0 = tileM * BM;
  const int64_t col0 = tileN * BN;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int KT = static_cast<int>((K + BK - 1) / BK);
  detail::GemmLoader<T, TRANS_B, VEC, NORM, ASYNC_A, ASYNC_B> ld(args, A, B, sA, sB, row0, col0);
  detail::GemmWarpMath<T, TRANS_B, MMA> mm(sA, sB, warp / T::WARPS_N, warp % T::WARPS_N, lane);
  using Frags = typename detail::GemmWarpMath<T, TRANS_B, MMA>::Frags;

// --- main loop: S-1 tiles in flight ahead of the one being multiplied ---------------------
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < KT) {
      ld.loadA(s, s, false);
      ld.loadB(s, s, false);
    }
    cp_async_commit();
  }
  if constexpr (ASYNC_A && ASYNC_B && BK >= 32) {
    // Software-pipelined (the CUTLASS multistage scheme): fragments of the next k step are
    // loaded while the current one multiplies, across the k-tile boundary too, so the barrier
    // and the shared-memory latency hide behind MMAs. The barrier sits before the last k step
    // of a tile: the next tile has landed (wait), and every warp has loaded its last fragments
    // of this tile's predecessor, whose stage the next k-tile's copies overwrite. norm_gemm
    // normalises a landed A tile in place between that barrier and a second one.
    constexpr int KSTEPS = BK / 16;
    Frags f[2];
    cp_async_wait<S - 2>();
    __syncthreads();
    if constexpr (NORM != 0) {
      ld.normaliseStage(0, 0);
      __syncthreads();
    }
    mm.loadFrags(f[0], 0, 0);
    for (int kt = 0; kt < KT; ++kt) {
      const int stage = kt % S;
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        if (ks == KSTEPS - 1) {
          cp_async_wait<S - 2>();
          __syncthreads();
          if constexpr (NORM != 0) {
            if (kt + 1 < KT)
              ld.normaliseStage(kt + 1, (kt + 1) % S);
            __syncthreads();
          }
        }
        if (ks + 1 < KSTEPS)
          mm.loadFrags(f[(ks + 1) % 2], stage, (ks + 1) * 16);
        else if (kt + 1 < KT)
          mm.loadFrags(f[(ks + 1) % 2], (kt + 1) % S, 0);
        if (ks == 0) {
          const int next = kt + S - 1;
          if (next < KT) {
            ld.loadA(next, next % S, false);
            ld.loadB(next, next % S, false);
          }
          cp_async_commit();
        }
        mm.multiply(f[ks % 2]);
      }
    }
  } else {
    for (int kt = 0; kt < KT; ++kt) {
      cp_async_wait<S - 2>();
      __syncthreads();
      const int next = kt + S - 1, nextStage = next % S;
      const bool more = next < KT;
      if (more) {
        ld.loadA(next, nextStage, !ASYNC_A);
        ld.loadB(next, nextStage, !ASYNC_B);
      }
      cp_async_commit();
      if (NORM != 0 && ASYNC_A) {
        ld.normaliseStage(kt, kt % S);
        __syncthreads();
      }
      mm.compute(kt % S);
      if (more) {
        if (!ASYNC_A)
          ld.storeA(nextStage);
        if (!ASYNC_B)
          ld.storeB(nextStage);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // --- epilogue: fragment -> per-warp scratch -> 8 columns per lane -> 16-byte store --------
  mm.template store<Epilogue>(args, reinterpret_cast<float*>(smem) + warp * 16 * 20, row0, col0);
}

/// The identity epilogue (plain GEMM).
struct NoEpilogue {
  __device__ __forceinline__ float operator()(float acc, int64_t, int64_t,
                                              const FpatKernelArgs&) const {
    return acc;
  }
};

} // namespace fpat
