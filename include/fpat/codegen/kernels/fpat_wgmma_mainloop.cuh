// The Hopper GEMM's main loop: the producer thread's TMA loads into the ring of stages, and the
// consumer warpgroups' wgmma over them (with the deferred norm's row sums taken from the same
// A tiles). Shared by every kernel built on the ring; what happens to the accumulators after
// the last k-tile is the epilogue's (fpat_wgmma_epilogue.cuh).
#pragma once

#include "fpat_sm90.cuh"
#include "fpat_wgmma_schedule.cuh"

namespace fpat {

/// The kernel's shared memory and barriers. The dynamic part holds the STAGES stages (A box,
/// then B), then the epilogue tile (kTile: [BN / 64][BM][128 bytes], TMA's swizzled boxes of 64
/// columns) and the side box (kSide: [BM][128 bytes]).
///
/// Each stage has a "full" mbarrier (the producer's expected byte count; TMA completes it) and
/// an "empty" one (one arrival per consumer warp when its MMAs no longer read the stage); phase
/// bits flip each time the ring wraps. `order` passes tiles between ping-pong consumers;
/// tileFull / tileEmpty hand the epilogue tile between the producer's operand load and the
/// consumers' stores; sideFull completes a side box.
template <class T> struct WgmmaSmem {
  unsigned char* base; // 1024-byte aligned: swizzled TMA boxes and wgmma descriptors need it
  uint64_t *full, *empty, *order, *tileFull, *tileEmpty, *sideFull;
  __device__ __forceinline__ unsigned char* stageA(int s) const {
    return base + s * T::STAGE_BYTES;
  }
  __device__ __forceinline__ unsigned char* stageB(int s) const {
    return base + s * T::STAGE_BYTES + T::A_BYTES;
  }
  __device__ __forceinline__ unsigned char* tile() const {
    return base + T::STAGES * T::STAGE_BYTES;
  }
  __device__ __forceinline__ unsigned char* side() const { return tile() + T::BM * T::BN * 2; }
};

namespace sm90 {

/// The producer: one thread issues every copy. Each stage's A box and B tile (with clusters,
/// this CTA's half of B, multicast to both CTAs); with PRE, a tile's [M, N] epilogue operand
/// into the epilogue tile during the tile's main loop.
template <class T, bool TRANS_B, bool PRE, bool SIDE, class Sched>
__device__ __forceinline__ void produceStages(const FpatTmaArgs& p, const WgmmaSmem<T>& sm,
                                              const Sched& sched) {
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, S = T::STAGES, CL = T::CLUSTER;
  const int KT = sched.KT, rank = sched.rank;
  int stage = 0, local = 0, tiled = 0, t, k0, k1;
  unsigned phase = 0;
  for (int w = 0; sched.work(w, t, k0, k1); ++w, ++local) {
    // kSide: after a deferred tile the helpers load the operand, once their stores have read
    // the tile (waiting for that here would hold up the ring). Pieces of a split tile but the
    // last have no epilogue.
    const bool preLoad = k1 == KT && PRE && !sched.deferred(t) &&
                         !(SIDE && local > 0 && sched.deferred(t - sched.stride));
    int tm, tn;
    sched.coords(t, tm, tn);
    tm = min(tm, sched.tilesM - 1);
    const int opStart = min(k0 + S + 1, k1 - 1);
    constexpr int kOpStep = BN / 64 >= 4 ? 1 : BN / 64; // operand boxes per k-tile
    for (int kt = k0; kt < k1; ++kt) {
      mbarWait(&sm.empty[stage], phase ^ 1); // a fresh barrier passes parity 1 at once
      mbarExpectTx(&sm.full[stage], T::STAGE_BYTES);
      tmaLoad2d(sm.stageA(stage), &p.a, kt * BK, tm * BM, &sm.full[stage]);
      if constexpr (CL > 1) {
        // This CTA's half of B, to both CTAs; the peer sends the other half.
        if constexpr (TRANS_B) {
          tmaLoad2dMulticast(sm.stageB(stage) + rank * (BN / 2) * 128, &p.b, kt * BK,
                             tn * BN + rank * (BN / 2), &sm.full[stage], 0x3);
        } else {
#pragma unroll
          for (int j = rank * BN / 128; j < (rank + 1) * BN / 128; ++j)
            tmaLoad2dMulticast(sm.stageB(stage) + j * 64 * BK * 2, &p.b, tn * BN + j * 64, kt * BK,
                               &sm.full[stage], 0x3);
        }
      } else if constexpr (TRANS_B) {
        tmaLoad2d(sm.stageB(stage), &p.b, kt * BK, tn * BN, &sm.full[stage]);
      } else {
#pragma unroll
        for (int j = 0; j < BN / 64; ++j)
          tmaLoad2d(sm.stageB(stage) + j * 64 * BK * 2, &p.b, tn * BN + j * 64, kt * BK,
                    &sm.full[stage]);
      }
      if (++stage == S) {
        stage = 0;
        phase ^= 1;
      }
      // The epilogue operand, once the consumers have moved on to this tile (they arrive after
      // its k-tile min(1, k1 - 1), loaded before this one: no deadlock) and the previous tile's
      // stores have read the tile: from k-tile opStart on, k1 - S - 2 k-tiles ahead of its
      // use. Tiles of four or more 64-column boxes load one box per k-tile (gemm_residual and
      // gemm_bias_residual about 1% faster at 128x256 than with 64 KB at once); two-box tiles
      // load both at once (128x128 ran 4% slower with a box per k-tile at 512x4096x4096, 20%
      // with boxes 4 k-tiles apart).
      const int q = kt - opStart;
      if (preLoad && q >= 0 && q * kOpStep < BN / 64) {
        if (q == 0) {
          mbarWait(sm.tileEmpty, (tiled & 1) ^ 1);
          mbarExpectTx(sm.tileFull, BM * BN * 2);
        }
        const int upto = kt == k1 - 1 ? BN / 64 : min(BN / 64, (q + 1) * kOpStep);
        for (int j = q * kOpStep; j < upto; ++j)
          tmaLoad2d(sm.tile() + j * BM * 128, &p.c, tn * BN + j * 64, tm * BM, sm.tileFull);
      }
    }
    tiled += k1 == KT; // items that store through the tile (tileEmpty's phases)
  }
}

} // namespace sm90

/// The deferred norm's row statistics (NORM: 1 layernorm, 2 rmsnorm), summed by a consumer from
/// the A tiles of its main loop. Thread (warp w, lane l) sums its accumulator rows' 16 elements
/// l % 4 of each k-tile (two 16-byte chunks of the 128-byte swizzled row); LayerNorm's sums are
/// of x - x[row][0], a shift near the mean (no cancellation).
template <int MI, int NORM> struct WgmmaRowSums {
  float sx[MI][2], sq[MI][2], shift[MI][2];

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int m = 0; m < MI; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        sx[m][h] = sq[m][h] = shift[m][h] = 0.0f;
  }

  /// Adds k-tile kt's elements of this thread's rows, from the stage's A box.
  __device__ __forceinline__ void add(const unsigned char* stageA, int row0, int warp, int lane,
                                      int kt) {
#pragma unroll
    for (int m = 0; m < MI; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + m * 64 + warp * 16 + lane / 4 + 8 * h;
        const unsigned char* rowA = stageA + r * 128;
        if (NORM == 1 && kt == 0)
          shift[m][h] = toF(*reinterpret_cast<const elem*>(rowA + ((r % 8) * 16)));
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          Half8 v;
          v.u = *reinterpret_cast<const uint4*>(rowA + (((2 * (lane % 4) + q) ^ (r % 8)) * 16));
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float x = toF(v.h[e]) - shift[m][h];
            sx[m][h] += x;
            sq[m][h] = fmaf(x, x, sq[m][h]);
          }
        }
      }
  }

  /// Each row's rstd (rs) and rstd * mean (mr; 0 for rmsnorm) over K columns in KT k-tiles. The
  /// four lanes of a row hold its sums over K rounded up to whole k-tiles, whose columns past K
  /// were TMA's zeros: each added -shift and shift^2.
  __device__ __forceinline__ void finish(int K, int KT, int BK, float eps, float (&rs)[MI][2],
                                         float (&mr)[MI][2]) const {
    const float pad = static_cast<float>(KT * BK - K), n = static_cast<float>(K);
#pragma unroll
    for (int m = 0; m < MI; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float s1 = sx[m][h], s2 = sq[m][h];
#pragma unroll
        for (int o = 1; o < 4; o *= 2) {
          s1 += __shfl_xor_sync(0xffffffffu, s1, o);
          s2 += __shfl_xor_sync(0xffffffffu, s2, o);
        }
        const float c0 = shift[m][h];
        s1 += pad * c0;
        s2 -= pad * c0 * c0;
        const float d = s1 / n;
        const float var = NORM == 1 ? fmaxf(s2 / n - d * d, 0.0f) : s2 / n;
        rs[m][h] = rsqrtf(var + eps);
        mr[m][h] = NORM == 1 ? (c0 + d) * rs[m][h] : 0.0f;
      }
  }
};

/// The deferred norm's row statistics summed by the producer warpgroup's three idle warps
/// (NORM: 1 layernorm, 2 rmsnorm) from each stage's A box, beside the consumers' MMAs: no
/// launch, no second read of x, and nothing in the consumers' loop (their own shared-memory
/// reads there slowed their MMAs, bench/RESULTS.md session 26).
///
/// A stage's A box is NB blocks of 32 rows by 8 16-byte chunks; its 8 NB pieces (a block's rows
/// at one chunk) are dealt evenly to the three warps, warp W taking pieces W, W + 3, ..., lane l
/// reading row 32 b + l (one logical chunk of 32 rows: the 128-byte swizzle spreads it over
/// all banks).
/// Each warp's walk is unrolled for its W: every address is the lane's base plus a constant,
/// and each thread sums into NB registers (its rows), independent chains. Sessions 36-37 gave
/// each thread whole rows (128 rows over 96 threads: one warp did twice the work, on one FMA
/// chain a row) and the GEMM ran at a third to a half of its speed. At the tile's end the
/// three warps' sums of each row meet in `part` (added in a fixed order: deterministic); each
/// row's rstd and rstd * mean go to out[item parity], which `full` publishes to the consumers
/// and `empty` hands back.
/// A_ROWS 0: the placeholder of kernels without these statistics (a few bytes of shared memory).
template <int BM, int A_ROWS> struct WgmmaStats {
  static constexpr int NB = (A_ROWS + 31) / 32; // blocks of 32 rows
  float2 out[2][BM];                            // rstd, rstd * mean (0 for rmsnorm)
  float2 part[NB ? NB : 1][NB ? 96 : 1]; // each thread's block sums: of x - shift, (x - shift)^2
  float shift[NB ? NB * 32 : 1];         // each row's shift (layernorm)
  uint64_t full[2], empty[2];
};

namespace sm90 {

/// Warp W's share of one stage: pieces g = W, W + 3, ... of the 8 NB, piece g being chunk g / NB
/// of row block g % NB.
template <int W, class T, int NORM>
__device__ __forceinline__ void
statsStage(const unsigned char* A, int lane, const float (&c0)[(T::A_ROWS + 31) / 32],
           float (&s1)[(T::A_ROWS + 31) / 32], float (&s2)[(T::A_ROWS + 31) / 32]) {
  constexpr int AR = T::A_ROWS, NB = (AR + 31) / 32;
#pragma unroll
  for (int g = W; g < 8 * NB; g += 3) {
    const int b = g % NB, ch = g / NB;
    if (AR % 32 != 0 && 32 * b + lane >= AR)
      continue;
    // Four words of two elements, unpacked in registers (indexing a union of eight would put
    // it in local memory).
    const uint4 v =
        *reinterpret_cast<const uint4*>(A + (32 * b + lane) * 128 + ((ch ^ (lane & 7)) << 4));
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = bitsPair(e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w);
      const float x0 = f.x - c0[b], x1 = f.y - c0[b];
      if constexpr (NORM == 1)
        s1[b] += x0 + x1;
      s2[b] = fmaf(x1, x1, fmaf(x0, x0, s2[b]));
    }
  }
}

template <class T, int NORM, class Sched>
__device__ __forceinline__ void producerRowStats(const WgmmaSmem<T>& sm, const Sched& sched,
                                                 WgmmaStats<T::BM, T::A_ROWS>& st, float eps) {
  constexpr int S = T::STAGES, BM = T::BM, AR = T::A_ROWS, NB = (AR + 31) / 32;
  const int w = static_cast<int>(threadIdx.x) / 32 - 1, lane = threadIdx.x % 32;
  const float pad = static_cast<float>(sched.KT * T::BK - sched.K), n = static_cast<float>(sched.K);
  int stage = 0, local = 0, t, k0, k1;
  unsigned phase = 0;
  for (int it = 0; sched.work(it, t, k0, k1); ++it, ++local) {
    // LayerNorm sums x - shift, the row's first element: no cancellation when |mean| >> sigma.
    float s1[NB], s2[NB], c0[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b)
      s1[b] = s2[b] = c0[b] = 0.0f;
    for (int kt = k0; kt < k1; ++kt) {
      mbarWait(&sm.full[stage], phase);
      const unsigned char* A = sm.stageA(stage);
      if constexpr (NORM == 1) {
        if (kt == k0) {
#pragma unroll
          for (int b = 0; b < NB; ++b)
            if (AR % 32 == 0 || 32 * b + lane < AR)
              c0[b] =
                  toF(*reinterpret_cast<const elem*>(A + (32 * b + lane) * 128 + (lane & 7) * 16));
        }
      }
      if (w == 0)
        statsStage<0, T, NORM>(A, lane, c0, s1, s2);
      else if (w == 1)
        statsStage<1, T, NORM>(A, lane, c0, s1, s2);
      else
        statsStage<2, T, NORM>(A, lane, c0, s1, s2);
      __syncwarp(); // the warp's reads of the stage are done
      if (lane == 0)
        mbarArrive(&sm.empty[stage]);
      if (++stage == S) {
        stage = 0;
        phase ^= 1;
      }
    }
    // The tile's statistics: each warp's block sums into `part`, then rows 32 b + lane for b =
    // w, w + 3, ... from the three warps', once the consumers have read what out[b] held two
    // items ago. Columns past K were TMA's zeros (each added -shift, shift^2); rows past the A
    // box (a short one) are never stored.
    namedBarrier(3, 96); // the previous tile's reads of `part` are done
    // Warp 0 also adds the padding's terms and gives each row's shift (indexing c0 by a block
    // chosen at run time below would put it in local memory).
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float c = w == 0 ? c0[b] : 0.0f;
      st.part[b][32 * w + lane] = make_float2(s1[b] + pad * c, s2[b] - pad * c * c);
      if (NORM == 1 && w == 0)
        st.shift[32 * b + lane] = c;
    }
    namedBarrier(3, 96);
    const int buf = local & 1;
    mbarWait(&st.empty[buf], ((local >> 1) & 1) ^ 1);
#pragma unroll
    for (int b = 0; b < (BM + 31) / 32; ++b) {
      const int r = 32 * b + lane;
      if (b % 3 != w || r >= BM)
        continue;
      float rs = 0.0f, mr = 0.0f;
      if (r < AR) {
        const float2 p0 = st.part[b][lane], p1 = st.part[b][32 + lane], p2 = st.part[b][64 + lane];
        const float a1 = p0.x + p1.x + p2.x, a2 = p0.y + p1.y + p2.y;
        const float d = a1 / n;
        const float var = NORM == 1 ? fmaxf(a2 / n - d * d, 0.0f) : a2 / n;
        rs = rsqrtf(var + eps);
        mr = NORM == 1 ? (st.shift[r] + d) * rs : 0.0f;
      }
      st.out[buf][r] = make_float2(rs, mr);
    }
    mbarArrive(&st.full[buf]); // every stats thread: its writes are released with it
  }
}

/// The deferred norm's statistics read by the GEMM itself (Epilogue::kNormGrid): the producer
/// warpgroup's three idle warps of every CTA take rows one at a time, in order, from a counter
/// in global memory (so that each row is read once in the whole grid, from L2 or HBM,
/// not from the ring: the ring's shared memory is the MMAs', and reading it beside them slowed
/// them), write each row's mean and rstd to rowStats[0], rowStats[1], and count the rows done
/// per BM-row block, which the consumers wait for before their epilogue (gridStatsWait). A row
/// is only ever claimed by a running warp, so the waits end whatever the residency.
/// Counters (FpatKernelArgs::scratch[0], zero before the launch and left zero by it): [0] the
/// next row, [1] the CTAs that finished, [2 + b] the rows done of block b.
/// One row a claim: with 8 (one warp reading them in turn) the first tiles' epilogues waited
/// at M = 512 (H100: +21% over the plain GEMM against +7% with 1; bench/RESULTS.md session 45).
template <int BM, int NORM>
__device__ __forceinline__ void gridRowStats(const FpatKernelArgs& a, int M, int K) {
  unsigned* const ctr = static_cast<unsigned*>(a.scratch[0]);
  const int lane = threadIdx.x % 32;
  const elem* const x = static_cast<const elem*>(a.in[0]);
  waitPriorGrid(); // x may come from the launch before
  for (;;) {
    unsigned r = 0;
    if (lane == 0)
      r = atomicAdd(ctr, 1u);
    r = __shfl_sync(0xffffffffu, r, 0);
    if (r >= static_cast<unsigned>(M))
      return;
    float mean, rstd;
    deferredRowStats<NORM == 1>(x + static_cast<int64_t>(r) * K, K, a.eps, mean, rstd);
    if (lane == 0) { // the stores are lane 0's own: release them with the count
      static_cast<float*>(a.rowStats[0])[r] = mean;
      static_cast<float*>(a.rowStats[1])[r] = rstd;
      asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(ctr + 2 + r / BM), "r"(1u)
                   : "memory");
    }
  }
}

/// A consumer's wait for block `b`'s statistics (gridRowStats); every lane acquires the count
/// itself, so that its loads of the statistics after it see them.
__device__ __forceinline__ void gridStatsWait(const FpatKernelArgs& a, int b, unsigned rows) {
  const unsigned* const cnt = static_cast<const unsigned*>(a.scratch[0]) + 2 + b;
  for (;;) {
    unsigned seen;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(cnt) : "memory");
    if (seen >= rows)
      return;
    __nanosleep(64);
  }
}

/// The grid's last CTA to finish returns the counters to zero for the next launch (every
/// statistics warp and every wait is over once all CTAs have counted themselves). Called by one
/// thread per CTA after a barrier of the whole CTA.
__device__ __forceinline__ void gridStatsReset(const FpatKernelArgs& a, int blocks) {
  unsigned* const ctr = static_cast<unsigned*>(a.scratch[0]);
  __threadfence();
  if (atomicAdd(ctr + 1, 1u) != gridDim.x - 1)
    return;
  __threadfence();
  for (int i = 0; i < blocks + 2; ++i)
    ctr[i] = 0;
}

/// fenceOperand on every accumulator: no access to them moves across the wgmma issue or wait
/// next to it.
template <int MI, int W> __device__ __forceinline__ void fenceAccumulators(float (&d)[MI][W]) {
#pragma unroll
  for (int m = 0; m < MI; ++m)
#pragma unroll
    for (int i = 0; i < W; ++i)
      fenceOperand(d[m][i]);
}

/// A consumer warpgroup's main loop over k-tiles [k0, k1) of tile t, its item `local` whose
/// k-tiles follow `first` earlier ones in the ring: wgmma m64 MMAs into d (its 64 rows of each
/// tile, cooperative; all BM rows, ping-pong), one group in flight, each stage released once
/// the MMAs reading it are done. STATS: the row sums too. PRE (the epilogue tile's operand):
/// once the previous tile's stores have read the tile, says so to the producer.
template <class T, bool TRANS_B, bool PRE, bool STATS, int NORM, class Sched>
__device__ __forceinline__ void consumeStages(const WgmmaSmem<T>& sm, const Sched& sched,
                                              float (&d)[T::MI][T::BN / 2],
                                              WgmmaRowSums<T::MI, NORM>& sums, int t, int k0,
                                              int k1, long long first, int c, int tiled) {
  constexpr int MI = T::MI, BN = T::BN, BK = T::BK, S = T::STAGES, CL = T::CLUSTER;
  const int KT = sched.KT, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  // Releases a stage (called by lane 0 of each consumer warp once its MMAs are done): to this
  // CTA's producer, and with clusters to the peer's too (its multicast writes the stage here
  // as well). In clusters warp r of the warpgroup arrives on CTA r's barrier: a wgmma is one
  // operation of the whole warpgroup, complete for all its warps once one waited.
  auto release = [&](int s) {
    if constexpr (CL == 1)
      mbarArrive(&sm.empty[s]);
    else if (warp == 0)
      mbarArriveCluster(&sm.empty[s], 0);
    else if (warp == 1)
      mbarArriveCluster(&sm.empty[s], 1);
  };
  int stage = static_cast<int>(first % S);
  unsigned phase = static_cast<unsigned>((first / S) & 1);
  // Rows of the tile this consumer computes: its 64 (cooperative) or all BM (ping-pong).
  const int row0 = T::PINGPONG ? 0 : c * 64 * MI;
  if constexpr (STATS)
    sums.clear();
  int prev = -1;
  for (int kt = k0; kt < k1; ++kt) {
    mbarWait(&sm.full[stage], phase);
    if (T::PINGPONG && kt == KT - 1 && tid == 0 && t + sched.stride < sched.units)
      mbarArrive(&sm.order[1 - c]); // the other consumer's tile may start
    fenceAccumulators(d);
    wgmmaFence();
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      // K-major B: rows of K, step 32 bytes per 16 k. MN-major B: 16 k rows of 128 bytes per
      // step, 64-wide N blocks BK * 128 bytes apart.
      const uint64_t db = TRANS_B ? smemDesc(sm.stageB(stage) + ks * 32, 16, 1024)
                                  : smemDesc(sm.stageB(stage) + ks * 16 * 128, BK * 128, 1024);
#pragma unroll
      for (int m = 0; m < MI; ++m) {
        const uint64_t da = smemDesc(sm.stageA(stage) + (row0 + m * 64) * 128 + ks * 32, 16, 1024);
        wgmma<BN, TRANS_B ? 0 : 1>(d[m], da, db, kt > k0 || ks > 0);
      }
    }
    wgmmaCommit();
    if constexpr (STATS)
      sums.add(sm.stageA(stage), row0, warp, lane, kt);
    // One group stays in flight: the previous k-tile's MMAs are done, release its stage.
    wgmmaWait<1>();
    fenceAccumulators(d);
    if (prev >= 0 && lane == 0)
      release(prev);
    if constexpr (PRE) {
      if (k1 == KT && kt == min(k0 + 1, k1 - 1) && tiled > 0 && tid == 0) {
        bulkWaitRead(); // the previous tile's stores have read the tile
        mbarArrive(sm.tileEmpty);
      }
    }
    prev = stage;
    if (++stage == S) {
      stage = 0;
      phase ^= 1;
    }
  }
  wgmmaWait<0>();
  fenceAccumulators(d);
  if (prev >= 0 && lane == 0)
    release(prev);
}

} // namespace sm90

} // namespace fpat
