// Flash attention for Hopper (sm_90a): the `attention` op on token-major activations,
// q [B * Sq, H * d], k and v [B * Sk, Hkv * d] (or caches [B, Hkv, Sk, d]: Dims::kKvHeadMajor),
// out [B * Sq, H * d], head dimension 64 or 128.
//
// One CTA per (query tile of 128 or 192 rows, head, batch), the longest causal tiles first;
// or (FlashTile::RESIDENT) one CTA per SM walking those tiles in that order, so that the next
// tile's loads overlap the end of the one before. Three or four warpgroups (FlashAttention-3's
// structure, ../shared/ATTENTION.md in the project's notes):
//   * a producer, of which one thread issues TMA copies: the Q tile once, then each key block's
//     K and V tiles (BN rows, 128-byte swizzle, boxes of 64 columns) into a two-stage ring, each
//     tile with its own "full" mbarrier (K's product can start before V lands) and "empty" one
//     (one arrival per consumer warp once its MMAs no longer read it);
//   * two (or three) consumers of 64 query rows each: S = Q K^T by wgmma from shared memory, the
//   online
//     softmax on S in registers (scale folded into exp2's argument: one FFMA and one MUFU.EX2
//     per score), P packed to 16-bit pairs in the accumulator's own layout, which is the A
//     fragment of the next wgmma, and O += P V by wgmma with A from registers.
//   * PINGPONG (FA3's inter-warpgroup schedule): the consumers take turns issuing their
//     products (named barriers 1, 2 and 3), so that one's softmax runs while the tensor cores
//     work on the other's products.
//   * OVERLAP (FA3's intra-warpgroup pipeline): the product S of block j is issued before
//     P V of block j - 1, and the softmax of block j runs while P V of block j - 1 is still
//     on the tensor cores; O is rescaled only once that product is done.
// Rows: GQA reads KV head h / (H / Hkv). A tile's rows may run past its batch's rows into the
// next batch's (TMA zero-fills only past the tensor): their keys are masked (columns >= Sk) and
// their query rows are not stored. Masks (Dims::kMask): 0 none; 1 causal, bottom-right aligned
// (key j of query row i is kept iff j <= i + Sk - Sq; blocks past a tile's diagonal are
// skipped, the rest unmasked but for the diagonal and the last block); 2 an additive bias
// read from in[3] with strides bias0..3 over [B, H, Sq, Sk]. The scale is in[4]
// (Dims::kScalePositive: a constant known to be positive, folded into exp2's FFMA).
// A row whose scores are all -inf gives 0 / 0 (NaN), as the exact softmax does.
#pragma once

#include "fpat_sm90.cuh"

namespace fpat {

/// The tensor-map row and column of key (value) 0 of batch b, KV head kvh: token-major rows
/// (b * Sk, columns from kvh * Hd), or where D::kKvHeadMajor a cache [B, Hkv, Sk, Hd] mapped
/// as rows of Hd ((b * Hkv + kvh) * Sk, column 0). A block past Sk reads the next head's (or
/// batch's) keys, masked as any key past Sk is.
template <class D> __device__ __forceinline__ int kvTmaRow(int64_t b, int64_t kvh) {
  return static_cast<int>(D::kKvHeadMajor ? (b * D::Hkv + kvh) * D::Sk : b * D::Sk);
}
template <class D> __device__ __forceinline__ int kvTmaCol(int64_t kvh) {
  return static_cast<int>(D::kKvHeadMajor ? 0 : kvh * D::Hd);
}

/// A flash-attention tile: CONSUMERS warpgroups of 64 query rows each (BM = 64 CONSUMERS), BN
/// keys a block. Three consumers (FlashAttention-3's tile for head dimension 64: 192 rows) need
/// head dimension 64 and blocks of at most 128 keys: each has 160 registers, not 232.
/// RESIDENT: one CTA per SM walks the tiles (t = blockIdx.x, + gridDim.x, ...), so that the
/// producer loads the next tile's Q, K and V while the consumers finish the tile before.
/// DYNAMIC (with RESIDENT): a CTA's first tile is blockIdx.x, each next one the first not yet
/// taken (a counter in a.scratch[0], zero at launch and left zero by the CTA that ends last),
/// so that tiles of unequal lengths (causal) balance as the hardware's scheduling of one CTA a
/// tile does.
template <int HD_, int BN_, bool OVERLAP_, bool PINGPONG_ = false, bool RESIDENT_ = false,
          bool DYNAMIC_ = false, int CONSUMERS_ = 2>
struct FlashTile {
  static constexpr int CONSUMERS = CONSUMERS_, BM = 64 * CONSUMERS, BN = BN_, HD = HD_, STAGES = 2,
                       THREADS = 128 * (CONSUMERS + 1);
  static constexpr bool OVERLAP = OVERLAP_, PINGPONG = PINGPONG_, RESIDENT = RESIDENT_,
                        DYNAMIC = RESIDENT_ && DYNAMIC_;
  // Registers a thread of the producer and of a consumer warpgroup (setmaxnreg; the register
  // file's 64K split over the warpgroups: 40 + 2 x 232, 32 + 3 x 160).
  static constexpr int PRODUCER_REGS = CONSUMERS == 2 ? 40 : 32,
                       CONSUMER_REGS = CONSUMERS == 2 ? 232 : 160;
  static constexpr int Q_BYTES = BM * HD * 2, KV_BYTES = BN * HD * 2;
  static constexpr int SMEM_BYTES = Q_BYTES + STAGES * 2 * KV_BYTES + 1024;
  static_assert(HD == 64 || HD == 128, "head dimension 64 or 128");
  static_assert(BN == 64 || BN == 128 || BN == 176 || BN == 192,
                "key blocks of 64, 128, 176 or 192 (176: whole 1 KB swizzle atoms of 8 rows)");
  static_assert(CONSUMERS == 2 || (CONSUMERS == 3 && HD == 64 && BN <= 128),
                "two consumers, or three at head dimension 64 with blocks of at most 128 keys");
  static_assert(SMEM_BYTES <= FPAT_SM90_SMEM_BYTES, "the ring fits shared memory");
};

namespace sm90 {

__device__ __forceinline__ float exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// A consumer's online-softmax state for its two rows (r and r + 8 of its warp's 16).
struct FlashRows {
  float mx[2], sum[2];
};

/// Masks one key block's scores: sc[i * 4 + 2 h + e] is row rows[h], column n0 + 8 i +
/// 2 (lane % 4) + e. PRESCALE (a bias, or a scale not known to be positive): the scores are
/// turned into the log2 domain here, scale and bias applied; otherwise they stay as the
/// product gave them and the softmax folds the scale into exp2's argument. Masked scores are
/// -inf either way. Only blocks at an edge (`edge`: past Sk or across the causal diagonal)
/// test columns.
template <class D, int BN, bool PRESCALE>
__device__ __forceinline__ void maskScores(const FpatKernelArgs& a, float (&sc)[BN / 2],
                                           float scaleLog2, const int64_t (&rows)[2], int n0,
                                           bool edge, int64_t b, int64_t h, int lane) {
  constexpr float kLog2e = 1.4426950408889634f;
  if constexpr (PRESCALE) {
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int idx = i * 4 + hh * 2 + e;
          float x = sc[idx] * scaleLog2;
          if constexpr (D::kMask == 2) {
            const int64_t col = n0 + 8 * i + 2 * (lane % 4) + e;
            const int64_t r = rows[hh] < D::Sq ? rows[hh] : D::Sq - 1;
            const int64_t cc = col < D::Sk ? col : D::Sk - 1;
            x = fmaf(ldh(a.in[3], b * D::bias0 + h * D::bias1 + r * D::bias2 + cc * D::bias3),
                     kLog2e, x);
          }
          sc[idx] = x;
        }
  }
  if (!edge)
    return;
#pragma unroll
  for (int i = 0; i < BN / 8; ++i)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t col = n0 + 8 * i + 2 * (lane % 4) + e;
        if (col >= D::Sk || (D::kMask == 1 && col > rows[hh] + (D::Sk - D::Sq)))
          sc[i * 4 + hh * 2 + e] = -INFINITY;
      }
}

/// The online softmax of one block: new row maxima (kept in the log2 domain), sc turned into
/// exp2(sc * mult - max) (mult: the scale times log2 e, > 0, or 1 where maskScores applied
/// it: one FFMA and one MUFU.EX2 a score), the row sums (this thread's part) updated; corr
/// gets each row's rescale of the earlier blocks.
template <int BN>
__device__ __forceinline__ void softmaxBlock(float (&sc)[BN / 2], FlashRows& st, float (&corr)[2],
                                             float mult) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
      m = fmaxf(m, fmaxf(sc[i * 4 + hh * 2], sc[i * 4 + hh * 2 + 1]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    m = fmaxf(st.mx[hh], m * mult);
    // Every score so far -inf: subtract 0 instead (no inf - inf); they all give 0.
    const float use = m == -INFINITY ? 0.0f : m;
    corr[hh] = exp2Approx(st.mx[hh] - use);
    st.mx[hh] = m;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = exp2Approx(fmaf(sc[i * 4 + hh * 2 + e], mult, -use));
        sc[i * 4 + hh * 2 + e] = p;
        s += p;
      }
    st.sum[hh] = st.sum[hh] * corr[hh] + s;
  }
}

template <int HD>
__device__ __forceinline__ void rescaleOutput(float (&o)[HD / 2], const float (&corr)[2]) {
#pragma unroll
  for (int i = 0; i < HD / 8; ++i)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        o[i * 4 + hh * 2 + e] *= corr[hh];
}

/// P as the A fragments of P V: k16 slice kk is accumulator columns 16 kk ... 16 kk + 15.
template <int BN>
__device__ __forceinline__ void packP(const float (&sc)[BN / 2], unsigned (&pa)[BN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      pa[kk][r] = pairBits(sc[8 * kk + 2 * r], sc[8 * kk + 2 * r + 1]);
}

/// One tile of the flash kernel: its first query row, head, batch, KV head and key blocks.
struct FlashWork {
  int m0, h, b, kvh, blocks;
};

/// Tile t (T::RESIDENT), else the CTA's own, in the order of the grid without RESIDENT: a
/// head's query tiles together (they read the same keys), the longest causal ones first.
template <class D, class T> __device__ __forceinline__ FlashWork flashWork(int t) {
  constexpr int BM = T::BM;
  const int mTiles = static_cast<int>((D::Sq + BM - 1) / BM);
  FlashWork w;
  const int mi = T::RESIDENT ? t % mTiles : static_cast<int>(blockIdx.x);
  const int hb = T::RESIDENT ? t / mTiles : 0;
  w.m0 = (mTiles - 1 - mi) * BM;
  w.h = T::RESIDENT ? hb % static_cast<int>(D::H) : static_cast<int>(blockIdx.y);
  w.b = T::RESIDENT ? hb / static_cast<int>(D::H) : static_cast<int>(blockIdx.z);
  w.kvh = w.h / static_cast<int>(D::H / D::Hkv);
  // Keys this tile reads: all, or (causal) those up to its last row's diagonal.
  const int kLimit = static_cast<int>(
      D::kMask == 1 ? min(D::Sk, static_cast<int64_t>(w.m0 + BM) + (D::Sk - D::Sq)) : D::Sk);
  w.blocks = (kLimit + T::BN - 1) / T::BN;
  return w;
}

/// The flash kernel's barriers: Q's, and each ring stage's K and V "full" and "empty" ones.
template <int S> struct FlashBarriers {
  uint64_t qFull, qEmpty, kFull[S], vFull[S], kEmpty[S], vEmpty[S];
  int tile; // (T::DYNAMIC) the tile whose Q the producer loads, -1 when none is left
};

/// (T::DYNAMIC) The next tile not yet taken, from the launch's counter (a.scratch[0]: taken,
/// then CTAs done). Past the last tile, the CTA counts itself done; the last one zeroes both
/// for the next launch (kernels on a stream do not overlap this one's end).
__device__ __forceinline__ int flashNextTile(unsigned* counter, int tiles) {
  const int t = static_cast<int>(gridDim.x + atomicAdd(counter, 1u));
  if (t >= tiles) {
    __threadfence();
    if (atomicAdd(counter + 1, 1u) == gridDim.x - 1) {
      atomicExch(counter, 0u);
      atomicExch(counter + 1, 0u);
    }
  }
  return t;
}

/// The producer's thread: for each of its tiles (first, first + step, ... < tiles; T::DYNAMIC:
/// first, then as flashNextTile hands them out), Q once the tile before is done with it, then
/// each key block's K and V tiles into the ring.
template <class D, class T>
__device__ __forceinline__ void flashProduce(const FpatTmaArgs& p, unsigned char* sQ,
                                             unsigned char* sKV, FlashBarriers<T::STAGES>& br,
                                             int first, int tiles, int step) {
  constexpr int BM = T::BM, BN = T::BN, HD = T::HD, S = T::STAGES, KB = HD / 64;
  int s = 0;
  unsigned phase = 0, qPhase = 0;
  for (int t = first, next = 0;; t = T::DYNAMIC ? next : t + step, qPhase ^= 1) {
    if (!T::DYNAMIC && t >= tiles)
      break;
    mbarWait(&br.qEmpty, qPhase ^ 1); // the tile before is done with Q (fresh: passes at once)
    if (T::DYNAMIC && t >= tiles) {   // the consumers wait for a tile: tell them there is none
      br.tile = -1;
      mbarArrive(&br.qFull);
      break;
    }
    const FlashWork w = flashWork<D, T>(t);
    if constexpr (T::DYNAMIC)
      br.tile = t; // published by qFull's arrival, read by the consumers after its wait
    mbarExpectTx(&br.qFull, T::Q_BYTES);
#pragma unroll
    for (int c = 0; c < KB; ++c)
      tmaLoad2d(sQ + c * BM * 128, &p.a, w.h * HD + 64 * c, static_cast<int>(w.b * D::Sq) + w.m0,
                &br.qFull);
    if constexpr (T::DYNAMIC) // asked for now: the answer's latency hides behind the loads
      next = flashNextTile(static_cast<unsigned*>(p.k.scratch[0]), tiles);
    for (int j = 0; j < w.blocks; ++j) {
      const int row = kvTmaRow<D>(w.b, w.kvh) + j * BN;
      unsigned char* const kt = sKV + s * 2 * T::KV_BYTES;
      mbarWait(&br.kEmpty[s], phase ^ 1); // a fresh barrier passes parity 1 at once
      mbarExpectTx(&br.kFull[s], T::KV_BYTES);
#pragma unroll
      for (int c = 0; c < KB; ++c)
        tmaLoad2d(kt + c * BN * 128, &p.b, kvTmaCol<D>(w.kvh) + 64 * c, row, &br.kFull[s]);
      mbarWait(&br.vEmpty[s], phase ^ 1);
      mbarExpectTx(&br.vFull[s], T::KV_BYTES);
#pragma unroll
      for (int c = 0; c < KB; ++c)
        tmaLoad2d(kt + T::KV_BYTES + c * BN * 128, &p.c, kvTmaCol<D>(w.kvh) + 64 * c, row,
                  &br.vFull[s]);
      if (++s == S) {
        s = 0;
        phase ^= 1;
      }
    }
  }
}

/// O / l, this thread's two rows of the tile (rows past Sq are not stored): f16 pairs
/// (columns 8 i + 2 (lane % 4)).
template <class D, int HD>
__device__ __forceinline__ void flashStore(const FpatKernelArgs& a, const float (&o)[HD / 2],
                                           const FlashRows& st, const int64_t (&rows)[2], int b,
                                           int h, int lane) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float l = st.sum[hh];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (rows[hh] >= D::Sq)
      continue;
    elem* out = static_cast<elem*>(a.out) + ((b * D::Sq + rows[hh]) * D::H + h) * HD;
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) {
      const elem2 v = fromF2(o[i * 4 + hh * 2] / l, o[i * 4 + hh * 2 + 1] / l);
      *reinterpret_cast<elem2*>(out + 8 * i + 2 * (lane % 4)) = v;
    }
  }
}

} // namespace sm90

/// The kernel body; `p` must be the kernel's __grid_constant__ parameter. Maps: a = q (box 64 x
/// T::BM), b = k and c = v (boxes 64 x BN). Launch T::THREADS threads, T::SMEM_BYTES of dynamic
/// shared memory, grid (ceil(Sq / T::BM), H, B), or (T::RESIDENT) at most one CTA per SM.
template <class D, class T> __device__ __forceinline__ void flashAttention(const FpatTmaArgs& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  constexpr int BM = T::BM, BN = T::BN, HD = T::HD, S = T::STAGES;
  static_assert(D::Hd == HD, "the tile's head dimension");
  static_assert(D::B >= 1 && (D::kMask == 2 || D::bias0 + D::bias1 + D::bias2 + D::bias3 >= 0),
                "sizes of a real attention"); // (and names every member: nvcc warns otherwise)
  extern __shared__ __align__(1024) unsigned char smemRaw[];
  __shared__ __align__(8) FlashBarriers<S> br;
  uint64_t &qFull = br.qFull, &qEmpty = br.qEmpty, *kFull = br.kFull, *vFull = br.vFull,
           *kEmpty = br.kEmpty, *vEmpty = br.vEmpty;
  unsigned char* const sQ = smemRaw + ((1024 - (smemAddr(smemRaw) & 1023)) & 1023);
  unsigned char* const sKV = sQ + T::Q_BYTES; // stage s: K tile, then V tile

  const int tiles = T::RESIDENT ? static_cast<int>((D::Sq + BM - 1) / BM * D::H * D::B) : 1;
  const int first = T::RESIDENT ? static_cast<int>(blockIdx.x) : 0;
  const int step = T::RESIDENT ? static_cast<int>(gridDim.x) : 1;

  if (threadIdx.x == 0) {
    mbarInit(&qFull, 1);
    // Lane 0 of each consumer warp, once its last Q K^T of a tile is done; with DYNAMIC every
    // consumer thread, whose arrival also orders its read of the tile index before the
    // producer's next write (racecheck sees no order in a __syncwarp and lane 0's arrival).
    mbarInit(&qEmpty, T::DYNAMIC ? 128 * T::CONSUMERS : 4 * T::CONSUMERS);
    for (int s = 0; s < S; ++s) {
      mbarInit(&kFull[s], 1);
      mbarInit(&vFull[s], 1);
      mbarInit(&kEmpty[s], 4 * T::CONSUMERS); // lane 0 of each consumer warp
      mbarInit(&vEmpty[s], 4 * T::CONSUMERS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int wg = static_cast<int>(threadIdx.x) / 128;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(T::PRODUCER_REGS));
    if (threadIdx.x == 0)
      flashProduce<D, T>(p, sQ, sKV, br, first, tiles, step);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(T::CONSUMER_REGS));
  const FpatKernelArgs& a = p.k;
  const int c = wg - 1, tid = static_cast<int>(threadIdx.x) % 128, warp = tid / 32, lane = tid % 32;
  // The tile's: its first query row, head, batch, rows of this thread, key blocks.
  int m0 = 0, h = 0, b = 0, blocks = 0;
  int64_t rows[2] = {0, 0};
  const float scaleLog2 = ldh(a.in[4], 0) * 1.4426950408889634f;
  // A block needs masking where it reaches past Sk, or (causal) past the tile's first row's
  // diagonal.
  auto edge = [&](int n0) {
    return n0 + BN > D::Sk || (D::kMask == 1 && n0 + BN - 1 > m0 + (D::Sk - D::Sq));
  };
  float o[HD / 2];
  FlashRows st;
  float sc[BN / 2], corr[2];
  unsigned pa[BN / 16][4];

  // S = Q K^T of the block in stage s (issued and committed, not waited for).
  auto issueScores = [&](int s) {
    const unsigned char* kt = sKV + s * 2 * T::KV_BYTES;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i)
      fenceOperand(sc[i]);
    wgmmaFence();
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks)
      wgmma<BN, 0>(sc, smemDesc(sQ + (ks / 4) * BM * 128 + c * 64 * 128 + (ks % 4) * 32, 16, 1024),
                   smemDesc(kt + (ks / 4) * BN * 128 + (ks % 4) * 32, 16, 1024), ks > 0);
    wgmmaCommit();
  };
  // O += P V of the block in stage s (issued and committed).
  auto issueValues = [&](int s) {
    const unsigned char* vt = sKV + s * 2 * T::KV_BYTES + T::KV_BYTES;
#pragma unroll
    for (int i = 0; i < HD / 2; ++i)
      fenceOperand(o[i]);
    wgmmaFence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      wgmmaRs<HD, 1>(o, pa[kk], smemDesc(vt + kk * 16 * 128, BN * 128, 1024), 1);
    wgmmaCommit();
  };
  auto fenceScores = [&] {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i)
      fenceOperand(sc[i]);
  };
  auto fenceOut = [&] {
#pragma unroll
    for (int i = 0; i < HD / 2; ++i)
      fenceOperand(o[i]);
  };

  // PINGPONG: wait for this consumer's turn to issue products (named barrier 1 + c); hand the
  // turn to the next one. Consumer 0 goes first. All run the same number of turns (the last
  // hand-off is left unanswered when the CTA ends).
  constexpr int C = T::CONSUMERS;
  auto myTurn = [&] {
    if constexpr (T::PINGPONG)
      namedBarrier(1 + c, 256);
  };
  auto yieldTurn = [&] {
    if constexpr (T::PINGPONG)
      namedBarrierArrive(1 + (c + 1) % C, 256);
  };
  if (T::PINGPONG && c == C - 1)
    namedBarrierArrive(1, 256);

  int s = 0;
  unsigned phase = 0, qPhase = 0;
  // The scale folds into exp2's argument where it is known to be positive.
  constexpr bool kPrescale = D::kMask == 2 || !D::kScalePositive;
  const float mult = kPrescale ? 1.0f : scaleLog2;
  auto softmax = [&](int j) {
    maskScores<D, BN, kPrescale>(a, sc, scaleLog2, rows, j * BN, edge(j * BN), b, h, lane);
    softmaxBlock<BN>(sc, st, corr, mult);
  };
  // After the tile's last Q K^T: the producer may load the next tile's Q.
  auto releaseQ = [&](int j) {
    if (j == blocks - 1 && (T::DYNAMIC || lane == 0))
      mbarArrive(&qEmpty);
  };
  for (int t = first;; t += step, qPhase ^= 1) {
    if constexpr (T::DYNAMIC) {
      mbarWait(&qFull, qPhase);
      t = *static_cast<volatile int*>(&br.tile); // released by this thread's qEmpty arrival
      if (t < 0)
        break;
    } else if (t >= tiles) {
      break;
    }
    const FlashWork w = flashWork<D, T>(t);
    m0 = w.m0;
    h = w.h;
    b = w.b;
    blocks = w.blocks;
    // A count of one or two blocks known at compile time (short keys, no causal mask) lets
    // nvcc merge the block loop into straight code that needs more registers: with three
    // consumers (160 each) ptxas then serializes the wgmma. Hidden, the loop stays a loop.
    if constexpr (D::kMask != 1 && D::Sk <= 2 * T::BN)
      asm volatile("" : "+r"(blocks));
    rows[0] = m0 + c * 64 + warp * 16 + lane / 4;
    rows[1] = rows[0] + 8;
#pragma unroll
    for (int i = 0; i < HD / 2; ++i)
      o[i] = 0.0f;
    st = FlashRows{{-INFINITY, -INFINITY}, {0.0f, 0.0f}};
    if constexpr (!T::DYNAMIC)
      mbarWait(&qFull, qPhase);
    if (blocks == 0 && (T::DYNAMIC || lane == 0))
      mbarArrive(&qEmpty);
    if constexpr (!T::OVERLAP) {
      for (int j = 0; j < blocks; ++j) {
        mbarWait(&kFull[s], phase);
        myTurn();
        issueScores(s);
        yieldTurn();
        wgmmaWait<0>();
        fenceScores();
        if (lane == 0)
          mbarArrive(&kEmpty[s]);
        releaseQ(j);
        softmax(j);
        rescaleOutput<HD>(o, corr);
        packP<BN>(sc, pa);
        mbarWait(&vFull[s], phase);
        myTurn();
        issueValues(s);
        yieldTurn();
        wgmmaWait<0>();
        fenceOut();
        if (lane == 0)
          mbarArrive(&vEmpty[s]);
        if (++s == S) {
          s = 0;
          phase ^= 1;
        }
      }
    } else if (blocks > 0) {
      // Block j's scores are issued, then O is rescaled for block j - 1's softmax (the
      // tensor cores run the scores meanwhile; block j - 2's P V is done), then P V of block
      // j - 1; block j's softmax runs while that product does.
      mbarWait(&kFull[s], phase);
      myTurn();
      issueScores(s);
      yieldTurn();
      wgmmaWait<0>();
      fenceScores();
      if (lane == 0)
        mbarArrive(&kEmpty[s]);
      releaseQ(0);
      softmax(0);
      packP<BN>(sc, pa);
      int prev = s;
      unsigned prevPhase = phase;
      for (int j = 1; j < blocks; ++j) {
        if (++s == S) {
          s = 0;
          phase ^= 1;
        }
        mbarWait(&kFull[s], phase);
        mbarWait(&vFull[prev], prevPhase);
        myTurn();
        issueScores(s);
        rescaleOutput<HD>(o, corr);
        issueValues(prev);
        yieldTurn();
        wgmmaWait<1>(); // the scores are done; P V of the block before may still run
        fenceScores();
        if (lane == 0)
          mbarArrive(&kEmpty[s]);
        releaseQ(j);
        softmax(j);
        wgmmaWait<0>();
        fenceOut();
        if (lane == 0)
          mbarArrive(&vEmpty[prev]);
        packP<BN>(sc, pa);
        prev = s;
        prevPhase = phase;
      }
      mbarWait(&vFull[prev], prevPhase);
      myTurn();
      rescaleOutput<HD>(o, corr);
      issueValues(prev);
      yieldTurn();
      wgmmaWait<0>();
      fenceOut();
      if (lane == 0)
        mbarArrive(&vEmpty[prev]);
      if (++s == S) { // the ring goes on with the next tile
        s = 0;
        phase ^= 1;
      }
    }

    flashStore<D, HD>(a, o, st, rows, b, h, lane);
  } // the tiles
#else
  (void)p;
  __trap(); // compiled without sm_90a: the host never launches this
#endif
}

// ---------------------------------------------------------------------------------------------
// Decode: few query rows against a long KV cache (Flash-Decoding, ../shared/ATTENTION.md §3).
// The G = H / Hkv query heads that share a KV head and their Sq rows, R = G * Sq <= 8 rows,
// are computed together, so each KV head is read once (not G times). The keys of each
// (batch, KV head) are split into Dims::kSplits ranges of kSplitTiles 64-key tiles, one CTA
// each: a producer warp streams K and V tiles by TMA into a three-stage ring, four consumer
// warps take 16 keys of each tile apiece and keep their own online-softmax state, combined
// through shared memory at the end. One split: the CTA writes the output; more: it writes its
// unnormalised f32 O and (max, sum) per row to the workspace (a.scratch[0]), and
// flashDecodeCombine merges the splits (a second launch: merging in the last CTA of each KV
// head, serially, measured 10% slower at batch 1, session 35). The products run on mma.sync with
// the R rows padded to 16: the MMAs are cheap next to streaming the cache, where CUDA-core dot
// products (q read from shared memory for every key) held session 34's kernel to 3.3-3.9 TB/s.
// Masks: none, or causal (bottom-right: row i keeps keys j <= i + Sk - Sq). Q is read by loads
// with rows Dims::qPitch elements apart; K and V by their tensor maps (both may be column views
// of a wider QKV projection).
// Dims::kAppend (codegen::decodeAppend): k and v (in[1], in[2]) are kv_append's caches
// [B, Hkv, Sk, Hd], which this kernel writes instead of reading: the maps read the past caches
// in[5], in[6] [B, Hkv, P, Hd]; each consumer warp stores its 16 rows of every tile it has used
// to in[1] and in[2] before releasing the stage; the split holding the last tile then reads
// the Sk - P new tokens' keys and values (in[7], in[8]: token-major, Dims::kNewPitch and
// vNewPitch elements a row), writes them to the caches and into the ring as a 64-key tile of
// keys P.., and takes them as it takes any tile. The cache is read once and written once.
// Dims::kCacheRows: the caches are token-major instead, [B*Sk, E] (kv_append {batch}: K and V
// column views of them from columns kCol and vCol; the past [B*P, E], the new rows as wide).

template <int HD_> struct DecodeTile {
  static constexpr int BN = 64, HD = HD_, STAGES = 3, THREADS = 160, RMAX = 8;
  static constexpr int KV_BYTES = BN * HD * 2;
  static constexpr int SMEM_BYTES = STAGES * 2 * KV_BYTES + 1024;
};

/// Rows of the decode kernel: r = hh * Sq + i is query head g * G + hh, query row i.
template <class D> struct DecodeRows {
  static constexpr int G = static_cast<int>(D::H / D::Hkv), R = G * static_cast<int>(D::Sq);
};

/// Byte offset of (key, 8 columns from col) in a decode tile: boxes of 64 columns, 128-byte
/// rows, 16-byte chunks swizzled by the row (TMA's 128-byte swizzle).
template <int BN> __device__ __forceinline__ int decodeAt(int key, int col) {
  return (col / 64) * BN * 128 + key * 128 + (((col % 64 / 8) ^ (key % 8)) * 16);
}

/// Dims::kAppend: consumer warp w's 16 rows of a tile of keys key0 .. (those before D::P) into
/// the caches (rows kCachePitch and vCachePitch apart), 16 bytes a lane a row piece, streamed past
/// L2; four pieces at a time (all eight of d 128 at once held 215 registers: one CTA an SM, not
/// two).
template <class D, class T>
__device__ __forceinline__ void decodeStoreRows(const unsigned char* kt, const unsigned char* vt,
                                                int64_t key0, int w, int lane, elem* cacheK,
                                                elem* cacheV) {
  constexpr int HD = T::HD;
#pragma unroll 4
  for (int i = 0; i < HD / 16; ++i) {
    const int c = lane + 32 * i, r = 16 * w + c / (HD / 8), col = c % (HD / 8) * 8;
    const int64_t key = key0 + r;
    if (key < D::P) {
      __stcs(reinterpret_cast<uint4*>(cacheK + key * D::kCachePitch + col),
             *reinterpret_cast<const uint4*>(kt + decodeAt<T::BN>(r, col)));
      __stcs(reinterpret_cast<uint4*>(cacheV + key * D::vCachePitch + col),
             *reinterpret_cast<const uint4*>(vt + decodeAt<T::BN>(r, col)));
    }
  }
}

/// Dims::kAppend: the Sk - P new tokens of batch b, KV head g (in[7], in[8]) into the caches at
/// rows P .. and into the tile at nk, nv (rows past them zero: their scores are masked, and 0
/// times a stale value could be NaN); thread ct of the 128 consumers.
template <class D, class T>
__device__ __forceinline__ void decodeStageNew(const FpatKernelArgs& a, unsigned char* nk,
                                               unsigned char* nv, int b, int g, int ct,
                                               elem* cacheK, elem* cacheV) {
  constexpr int HD = T::HD, BN = T::BN;
  constexpr int64_t NEW = D::Sk - D::P;
  static_assert(NEW >= 1 && NEW <= BN, "the new tokens fill one tile");
  const elem* const fk = static_cast<const elem*>(a.in[7]);
  const elem* const fv = static_cast<const elem*>(a.in[8]);
  for (int c = ct; c < BN * HD / 8; c += 128) {
    const int r = c / (HD / 8), col = c % (HD / 8) * 8;
    uint4 kx = make_uint4(0u, 0u, 0u, 0u), vx = kx;
    if (r < NEW) { // element by element: a column view's rows need not be 16-byte aligned
      const int64_t tok = static_cast<int64_t>(b) * NEW + r;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        reinterpret_cast<elem*>(&kx)[j] = fk[tok * D::kNewPitch + D::kCol + g * HD + col + j];
        reinterpret_cast<elem*>(&vx)[j] = fv[tok * D::vNewPitch + D::vCol + g * HD + col + j];
      }
      *reinterpret_cast<uint4*>(cacheK + (D::P + r) * D::kCachePitch + col) = kx;
      *reinterpret_cast<uint4*>(cacheV + (D::P + r) * D::vCachePitch + col) = vx;
    }
    *reinterpret_cast<uint4*>(nk + decodeAt<BN>(r, col)) = kx;
    *reinterpret_cast<uint4*>(nv + decodeAt<BN>(r, col)) = vx;
  }
}

template <class D, class T> __device__ __forceinline__ void flashDecode(const FpatTmaArgs& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  constexpr int BN = T::BN, HD = T::HD, S = T::STAGES, KB = HD / 64;
  constexpr int G = DecodeRows<D>::G, R = DecodeRows<D>::R;
  static_assert(R <= T::RMAX && (HD == 64 || HD == 128), "decode's sizes");
  static_assert(D::B >= 1 && D::bias0 + D::bias1 + D::bias2 + D::bias3 >= 0 &&
                    (D::kScalePositive || !D::kScalePositive) &&
                    D::kPitch + D::vPitch + D::kNewPitch + D::vNewPitch >= 0 && D::P <= D::Sk &&
                    D::kCachePitch + D::vCachePitch + D::kCol + D::vCol >= 0 &&
                    (D::kCacheRows || !D::kCacheRows),
                "sizes of a real attention"); // (and names every member: nvcc warns otherwise)
  extern __shared__ __align__(1024) unsigned char smemRaw[];
  __shared__ __align__(8) uint64_t full[S], empty[S];
  __shared__ float mw[4][R], lw[4][R]; // each consumer warp's row maxima and sums
  unsigned char* const ring = smemRaw + ((1024 - (smemAddr(smemRaw) & 1023)) & 1023);
  float* const ow = reinterpret_cast<float*>(ring); // after the loop: [4][R][HD] (the ring)

  const FpatKernelArgs& a = p.k;
  const int split = static_cast<int>(blockIdx.x), g = static_cast<int>(blockIdx.y),
            b = static_cast<int>(blockIdx.z);
  if constexpr (D::kSplits > 1)
    allowDependentGrid(); // the merge launch may start; it waits for this grid's results
  constexpr int tiles = static_cast<int>((D::P + BN - 1) / BN); // of the keys the maps hold
  const int t0 = split * D::kSplitTiles, t1 = min(t0 + D::kSplitTiles, tiles);
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbarInit(&full[s], 1);
      mbarInit(&empty[s], 4);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (warp == 0) {
    if (lane != 0)
      return;
    // The cache is read once: evicted first from L2 (session 50, H100: B 1 at 16k-64k +1-2%).
    const uint64_t policy = evictFirstPolicy();
    // Key 0's map row and K's and V's columns: where the kernel appends, the past caches'
    // (head-major [B, Hkv, P, d] as rows of d, or token-major [B*P, E] from columns kCol, vCol).
    const int row0 = D::kAppend
                         ? static_cast<int>(D::kCacheRows ? b * D::P : (b * D::Hkv + g) * D::P)
                         : kvTmaRow<D>(b, g);
    const int kc =
        D::kAppend ? static_cast<int>(D::kCol + (D::kCacheRows ? g * HD : 0)) : kvTmaCol<D>(g);
    const int vc =
        D::kAppend ? static_cast<int>(D::vCol + (D::kCacheRows ? g * HD : 0)) : kvTmaCol<D>(g);
    int s = 0;
    unsigned phase = 0;
    for (int t = t0; t < t1; ++t) {
      unsigned char* const kt = ring + s * 2 * T::KV_BYTES;
      mbarWait(&empty[s], phase ^ 1);
      mbarExpectTx(&full[s], 2 * T::KV_BYTES);
#pragma unroll
      for (int c = 0; c < KB; ++c) {
        tmaLoad2dHint(kt + c * BN * 128, &p.a, kc + 64 * c, row0 + t * BN, &full[s], policy);
        tmaLoad2dHint(kt + T::KV_BYTES + c * BN * 128, &p.b, vc + 64 * c, row0 + t * BN, &full[s],
                      policy);
      }
      if (++s == S) {
        s = 0;
        phase ^= 1;
      }
    }
    return;
  }
  const int w = warp - 1, ct = static_cast<int>(threadIdx.x) - 32; // consumer warp, thread
  // Tensor cores (mma.sync m16n8k16), FlashAttention-2's register layouts. Row r = lane / 4 of
  // the 16-row A operand is query row r (rows R...15 are zero); a warp takes 16 keys of each
  // tile. S = Q K^T: K [keys][d] in shared memory is the column-major B operand as it stands
  // (ldmatrix); P goes from S's accumulators into the A operand of P V in registers, and V
  // [keys][d] is B through a transposing ldmatrix. The scale is applied to S in f32.
  constexpr int KS = HD / 16;
  const int qr = lane / 4, qc = 2 * (lane % 4);
  unsigned qa[KS][2];
  {
    const int hh = qr / static_cast<int>(D::Sq), i = qr % static_cast<int>(D::Sq);
    const unsigned* q = reinterpret_cast<const unsigned*>(
        static_cast<const elem*>(a.in[0]) + (b * D::Sq + i) * D::qPitch + (g * G + hh) * HD + qc);
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      qa[k][0] = qr < R ? q[8 * k] : 0u;     // columns 16 k + qc, + 1
      qa[k][1] = qr < R ? q[8 * k + 4] : 0u; // columns 16 k + 8 + qc, + 1
    }
  }
  const float scaleLog2 = ldh(a.in[4], 0) * 1.4426950408889634f;
  const int64_t row = qr % D::Sq; // the query row of this lane's scores (where qr < R)
  // A bias tensor (a padding mask: exporters' decode steps carry one) is read per score, at
  // this lane's row: query head g G + qr / Sq (rows past R read row 0's; they are dropped).
  const int64_t biasRow =
      b * D::bias0 + (g * G + (qr < R ? qr : 0) / D::Sq) * D::bias1 + (qr < R ? row : 0) * D::bias2;
  auto at = [](int key, int col) { return decodeAt<BN>(key, col); };
  float m = -INFINITY, l = 0.0f, o[HD / 8][4];
#pragma unroll
  for (int e = 0; e < HD / 8; ++e)
    o[e][0] = o[e][1] = o[e][2] = o[e][3] = 0.0f;
  // One 64-key tile in shared memory: keys key0 .., those from `end` on masked.
  auto take = [&](const unsigned char* kt, const unsigned char* vt, int64_t key0, int64_t end) {
    float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      unsigned kf[4];
      ldmatrixX4(kf, kt + at(16 * w + (lane / 16) * 8 + lane % 8, 16 * k + (lane / 8) % 2 * 8));
      const unsigned qk[4] = {qa[k][0], 0u, qa[k][1], 0u};
      mma16816(sc[0], qk, kf[0], kf[1]);
      mma16816(sc[1], qk, kf[2], kf[3]);
    }
    // This lane's scores: row qr, keys 16 w + 8 j + qc (+ 1); a row's 16 are in its lane quad.
    float x[4], mx = -INFINITY;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t key = key0 + 16 * w + 8 * (e / 2) + qc + e % 2;
      x[e] = sc[e / 2][e % 2] * scaleLog2;
      if constexpr (D::kMask == 2)
        if (key < end)
          x[e] = fmaf(ldh(a.in[3], biasRow + key * D::bias3), 1.4426950408889634f, x[e]);
      if (key >= end || (D::kMask == 1 && key > row + (D::Sk - D::Sq)))
        x[e] = -INFINITY;
      mx = fmaxf(mx, x[e]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mNew = fmaxf(m, mx);
    const float use = mNew == -INFINITY ? 0.0f : mNew;
    const float corr = exp2Approx(m - use);
    float sum = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      x[e] = exp2Approx(x[e] - use);
      sum += x[e];
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    l = l * corr + sum;
    m = mNew;
    const unsigned pa[4] = {pairBits(x[0], x[1]), 0u, pairBits(x[2], x[3]), 0u};
#pragma unroll
    for (int e = 0; e < HD / 16; ++e) {
      unsigned vf[4];
      ldmatrixX4Trans(vf,
                      vt + at(16 * w + (lane / 8) % 2 * 8 + lane % 8, 16 * e + (lane / 16) * 8));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        o[2 * e + h][0] *= corr;
        o[2 * e + h][1] *= corr;
        mma16816(o[2 * e + h], pa, vf[2 * h], vf[2 * h + 1]);
      }
    }
  };
  // Key 0 of this head in the caches (k and v: where the kernel appends, its to write),
  // rows kCachePitch and vCachePitch apart.
  const int64_t head0 = D::kCacheRows ? 0 : (static_cast<int64_t>(b) * D::Hkv + g) * D::Sk * HD;
  [[maybe_unused]] elem* const cacheK =
      const_cast<elem*>(static_cast<const elem*>(a.in[1])) +
      (D::kCacheRows ? b * D::Sk * D::kCachePitch + g * HD : head0);
  [[maybe_unused]] elem* const cacheV =
      const_cast<elem*>(static_cast<const elem*>(a.in[2])) +
      (D::kCacheRows ? b * D::Sk * D::vCachePitch + g * HD : head0);
  int s = 0;
  unsigned phase = 0;
  for (int t = t0; t < t1; ++t) {
    mbarWait(&full[s], phase);
    const unsigned char* kt = ring + s * 2 * T::KV_BYTES;
    const unsigned char* vt = kt + T::KV_BYTES;
    take(kt, vt, static_cast<int64_t>(t) * BN, D::P);
    if constexpr (D::kAppend) // the caches are the kernel's to write (codegen::decodeAppend)
      decodeStoreRows<D, T>(kt, vt, static_cast<int64_t>(t) * BN, w, lane, cacheK, cacheV);
    __syncwarp();
    if (lane == 0)
      mbarArrive(&empty[s]);
    if (++s == S) {
      s = 0;
      phase ^= 1;
    }
  }
  if constexpr (D::kAppend) {
    if (t1 == tiles) { // the new tokens: stage 0 is free once every consumer is here
      namedBarrier(1, 128);
      decodeStageNew<D, T>(a, ring, ring + T::KV_BYTES, b, g, ct, cacheK, cacheV);
      namedBarrier(1, 128);
      take(ring, ring + T::KV_BYTES, D::P, D::Sk);
    }
  }
  // Combine the four warps' states: every load has landed and been read (the producer issued
  // only the tiles the consumers waited for), so the ring holds them now.
  namedBarrier(1, 128);
  if (qr < R) {
    if (lane % 4 == 0) {
      mw[w][qr] = m;
      lw[w][qr] = l;
    }
#pragma unroll
    for (int e = 0; e < HD / 8; ++e) {
      ow[(w * R + qr) * HD + 8 * e + qc] = o[e][0];
      ow[(w * R + qr) * HD + 8 * e + qc + 1] = o[e][1];
    }
  }
  namedBarrier(1, 128);
  if (ct >= HD)
    return;
  const int c = ct;
  for (int r = 0; r < R; ++r) {
    float mx = -INFINITY;
    for (int q = 0; q < 4; ++q)
      mx = fmaxf(mx, mw[q][r]);
    const float use = mx == -INFINITY ? 0.0f : mx;
    float sum = 0.0f, acc = 0.0f;
    for (int q = 0; q < 4; ++q) {
      const float f = exp2Approx(mw[q][r] - use);
      sum += lw[q][r] * f;
      acc += ow[(q * R + r) * HD + c] * f;
    }
    const int hh = r / static_cast<int>(D::Sq), i = r % static_cast<int>(D::Sq);
    if constexpr (D::kSplits == 1) {
      static_cast<elem*>(a.out)[((b * D::Sq + i) * D::H + g * G + hh) * HD + c] = fromF(acc / sum);
    } else {
      const int64_t unit = ((static_cast<int64_t>(b) * D::Hkv + g) * D::kSplits + split) * R + r;
      float* const part = static_cast<float*>(a.scratch[0]);
      part[unit * (HD + 2) + c] = acc;
      if (c == 0) {
        part[unit * (HD + 2) + HD] = mx;
        part[unit * (HD + 2) + HD + 1] = sum;
      }
    }
  }
#else
  (void)p;
  __trap(); // compiled without sm_90a: the host never launches this
#endif
}

/// Merges the decode kernel's splits: one block of HD threads per (row r, KV head, batch).
/// Few splits: each thread walks them. Many (batch 1 over a long cache): their maxima and sums
/// are read side by side into shared memory and each column's partial sums are loaded before
/// they are added, where a walk paid an L2 round trip a split or two (session 50, H100: batch
/// 1 at 16k +2.5%, 64k +1.4%; at 2 splits the walk is 1% faster).
template <class D> __device__ __forceinline__ void flashDecodeCombine(const FpatKernelArgs& a) {
  constexpr int HD = static_cast<int>(D::Hd), G = DecodeRows<D>::G, R = DecodeRows<D>::R;
  constexpr int SP = D::kSplits;
  const int r = static_cast<int>(blockIdx.x), g = static_cast<int>(blockIdx.y),
            b = static_cast<int>(blockIdx.z), c = static_cast<int>(threadIdx.x);
  waitPriorGrid(); // launched to overlap the splits (codegen::Launch::overlapsPrevious)
  constexpr int64_t stride = static_cast<int64_t>(R) * (HD + 2); // between splits
  const float* const base = static_cast<const float*>(a.scratch[0]) +
                            ((static_cast<int64_t>(b) * D::Hkv + g) * SP * R + r) * (HD + 2);
  float sum = 0.0f, acc = 0.0f;
  if constexpr (SP <= 8) {
    float mx = -INFINITY;
#pragma unroll
    for (int sp = 0; sp < SP; ++sp)
      mx = fmaxf(mx, base[sp * stride + HD]);
    const float use = mx == -INFINITY ? 0.0f : mx;
#pragma unroll
    for (int sp = 0; sp < SP; ++sp) {
      const float f = exp2f(base[sp * stride + HD] - use);
      sum += base[sp * stride + HD + 1] * f;
      acc += base[sp * stride + c] * f;
    }
  } else {
    static_assert(SP <= 4096, "the merge keeps a weight per split in shared memory");
    __shared__ float wt[SP], ls[SP];
    __shared__ float top;
    for (int sp = c; sp < SP; sp += HD) {
      wt[sp] = base[sp * stride + HD];
      ls[sp] = base[sp * stride + HD + 1];
    }
    __syncthreads();
    if (c < 32) {
      float mx = -INFINITY;
      for (int sp = c; sp < SP; sp += 32)
        mx = fmaxf(mx, wt[sp]);
#pragma unroll
      for (int o = 16; o > 0; o /= 2)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      if (c == 0)
        top = mx == -INFINITY ? 0.0f : mx;
    }
    __syncthreads();
    for (int sp = c; sp < SP; sp += HD)
      wt[sp] = exp2f(wt[sp] - top);
    __syncthreads();
#pragma unroll 16
    for (int sp = 0; sp < SP; ++sp) {
      sum += ls[sp] * wt[sp];
      acc += base[sp * stride + c] * wt[sp];
    }
  }
  const int hh = r / static_cast<int>(D::Sq), i = r % static_cast<int>(D::Sq);
  static_cast<elem*>(a.out)[((b * D::Sq + i) * D::H + g * G + hh) * HD + c] = fromF(acc / sum);
}

} // namespace fpat
