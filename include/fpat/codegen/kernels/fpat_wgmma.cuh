// Kernel family "gemm", Hopper backend (sm_90a): C[M,N] = epilogue(A[M,K] * B) with TMA loads,
// wgmma tensor-core MMAs, warp specialization and a persistent grid.
//
//   B is [K, N] row-major, or [N, K] when TRANS_B (nn.Linear's weight layout).
//
// Structure (the published fast Hopper GEMMs, HOPPER-GEMM.md in the project's notes):
//   * One producer warpgroup, of which one thread issues TMA copies of A and B tiles into a
//     STAGES-deep ring of shared-memory stages (128-byte swizzle), and consumer warpgroups that
//     issue wgmma.m64nBNk16 with the accumulators in registers. setmaxnreg moves registers from
//     the producer to the consumers. Two schedules (CUTLASS's names):
//     - cooperative: each of BM / 64 consumers owns 64 rows of every tile (BM = 256: two
//       consumers of 128 rows, two m64 MMAs per k step: each reads a 128-row A half and the
//       shared 128-column B, 20% fewer shared-memory bytes per MMA than 128x256);
//     - ping-pong: two consumers own alternate tiles, all BM rows of each (BM / 64 MMAs per k
//       step). The ring hands out whole tiles in order, so one consumer's MMAs run while the
//       other applies its epilogue: the epilogue's arithmetic costs no tensor-core time.
//   * Each stage has a "full" mbarrier (the producer's expected byte count; TMA completes it)
//     and an "empty" one (one arrival per consumer warp when its MMAs no longer read the stage).
//     Phase bits flip each time the ring wraps.
//   * The grid is persistent: at most one CTA per SM, walking tiles in a grouped order, so the
//     producer loads the next tile while the consumers run the epilogue of the current one.
//   * CLUSTER = 2: two CTAs on neighbouring SMs take the two M-tiles of one B tile; each loads
//     half of B and multicasts it to both, so B comes from L2 once per pair. A stage is then
//     free only when the consumers of both CTAs have released it: they arrive on the "empty"
//     barriers of both.
//   * Ragged M, N, K: TMA zero-fills out-of-range elements of a box (they add nothing to the dot
//     products) and the epilogue's stores are predicated.
//   * The epilogue functor runs on the accumulators in registers, all of a thread's first, then
//     the stores. Cooperative kernels with room for it (Epilogue::kTile) write the results into
//     a BM x BN shared-memory tile that TMA stores (clipping edge tiles), and an [M, N] operand
//     such as a residual arrives in that tile by TMA, loaded by the producer during the main
//     loop; an epilogue that ends by adding it (Epilogue::kAddStaged) rounds the rest first and
//     adds the operand in element pairs, as the unfused add of two stored tensors does.
//     Activation epilogues (Epilogue::kDefer) are applied there by the producer
//     warpgroup's three idle warps while the consumers run the next tile; their [M, N] operand
//     comes to those warps by TMA, a BM x 64 box at a time, into a side buffer behind the
//     tile. Otherwise interior tiles store through a small shared-memory slab per warp, so
//     that each store instruction writes whole 128-byte row segments (a thread's own f16 pairs
//     would write 16 bytes of each of 8 rows); edge tiles store checked pairs from registers.
// Requirements, checked by the host before choosing this backend: A and B 16-byte aligned, K a
// multiple of 8 (and N too unless TRANS_B): TMA's global strides are multiples of 16 bytes.//
// The parts, each a header of its own (CUTLASS 3.x splits the same way):
//   fpat_sm90.cuh              the instructions (mbarrier, TMA, wgmma, stmatrix, ...);
//   fpat_wgmma_schedule.cuh    the tile scheduler: persistent order, last-wave split, deferral;
//   fpat_wgmma_mainloop.cuh    the ring: producer loads, consumers' MMAs, row sums;
//   fpat_wgmma_epilogue.cuh    the epilogue schedules (tile, helpers, registers, dual, norm);
//   fpat_wgmma_prep.cuh        the padded and prepared copies some launches read;
// and gemmWgmma below composes them.
#pragma once

#include "fpat_wgmma_epilogue.cuh"
#include "fpat_wgmma_prep.cuh"

namespace fpat {

/// A wgmma configuration: a BM x BN tile (64-deep k-tiles), cooperative or ping-pong, alone or
/// in clusters of two CTAs sharing B, tiles walked in groups along M or along N.
///
/// A_ROWS < BM (64-row cooperative tiles only, for problems of at most A_ROWS rows: decode):
/// each stage holds an A box of only A_ROWS rows, so that more stages of B fit in shared memory
/// (their loads are bound by latency there). The m64 MMAs still read 64 rows of A: rows A_ROWS
/// and on come from the same stage's B, which the same TMA transaction brought (so nothing is
/// read before it lands), and give accumulator rows below the problem, which no path stores.
template <int BM_, int BN_, int STAGES_, bool PINGPONG_, int CLUSTER_ = 1, bool RASTER_N_ = false,
          int A_ROWS_ = BM_>
struct WgmmaTile {
  static constexpr int BM = BM_, BN = BN_, BK = 64, STAGES = STAGES_, CLUSTER = CLUSTER_;
  static constexpr bool PINGPONG = PINGPONG_, RASTER_N = RASTER_N_;
  static constexpr int CONSUMERS = PINGPONG || BM == 256 ? 2 : BM / 64;
  static constexpr int MI = BM / 64 / (PINGPONG ? 1 : CONSUMERS); // m64 MMAs per consumer, k step
  static constexpr int THREADS = 128 * (CONSUMERS + 1);
  static constexpr int A_ROWS = A_ROWS_;
  static constexpr int A_BYTES = A_ROWS * BK * 2, B_BYTES = BN * BK * 2;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  static_assert(A_ROWS == BM || (BM == 64 && !PINGPONG && CLUSTER == 1 && A_ROWS % 8 == 0 &&
                                 A_ROWS > 0 && A_ROWS < BM),
                "a short A box: whole 1 KB swizzle atoms, 64-row cooperative tiles alone");
  static_assert(BM * BK * 2 <= STAGE_BYTES, "an MMA's 64 rows of A stay inside their stage");
  static_assert(BN == 64 || BN == 128 || BN == 192 || BN == 256,
                "wgmma tiles are 64, 128, 192 or 256 wide");
  static_assert(BM == 64 || BM == 128 || (BM == 256 && !PINGPONG && CLUSTER == 1),
                "64 or 128 rows, or 256 rows of a cooperative tile without clusters");
  static_assert(MI * BN <= 256, "at most 128 accumulators per thread");
  static_assert(CLUSTER == 1 || (CLUSTER == 2 && BN % 128 == 0),
                "clusters of 2 split B in halves of 64-column boxes");
};

/// Dynamic shared memory of a configuration: the stages, the BM x BN epilogue tile where the
/// epilogue goes through one (TILE), one BM x 64 box of a deferred epilogue's [M, N] operand
/// (SIDE), plus 1 KB to align them to the 1024-byte swizzle atom. Mirrors
/// codegen::gemmSmemBytes, codegen::wgmmaEpilogueTile and codegen::wgmmaSideBox.
template <class T, bool TILE = false, bool SIDE = false>
__host__ __device__ constexpr int wgmmaSmemBytes() {
  return T::STAGES * T::STAGE_BYTES + (TILE ? T::BM * T::BN * 2 : 0) + (SIDE ? T::BM * 128 : 0) +
         1024;
}

/// Whether an Epilogue is the dual GEMM's (Epilogue::kDual, which only those define).
template <class E, class = void> struct DualEpilogue { static constexpr bool value = false; };
template <class E> struct DualEpilogue<E, decltype(void(E::kDual))> {
  static constexpr bool value = E::kDual;
};

/// Whether an Epilogue's deferred norm takes its statistics from the grid's own statistics
/// warps (Epilogue::kNormGrid, which only those define; gridRowStats).
template <class E, class = void> struct GridStatsEpilogue { static constexpr bool value = false; };
template <class E> struct GridStatsEpilogue<E, decltype(void(E::kNormGrid))> {
  static constexpr bool value = E::kNormGrid;
};

/// The kernel body; `p` must be the kernel's __grid_constant__ parameter (TMA reads the tensor
/// maps from parameter space). Launch with T::THREADS threads, wgmmaSmemBytes<T>() bytes of
/// dynamic shared memory and at most one CTA per SM (grid: min(tiles, SMs), in whole clusters).
template <class T, bool TRANS_B, class Epilogue>
__device__ __forceinline__ void gemmWgmma(const FpatTmaArgs& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  constexpr int BM = T::BM, S = T::STAGES, CL = T::CLUSTER, MI = T::MI;
  // How the epilogue runs (the code generator's choice, in the Epilogue's flags):
  //   kTile: through the BM x BN shared-memory tile, stored by TMA (cooperative only);
  //   kPre: with its [M, N] operand Epilogue::kStaged loaded into that tile by the producer;
  //   kDefer: by the helper warps where the schedule defers it; kSide: their operand by TMA;
  //   kStagedStore: otherwise through per-warp slabs, where shared memory leaves room (sm_90
  //   allows 227 KB per block; 1 KB each for alignment and barriers);
  //   kDual: the dual GEMM, over the interleaved copy of its two weights (prepareWeightB with
  //   DUAL): N is that copy's columns here, a.N the result's;
  //   kStats: the deferred norm's row sums taken from the main loop's A boxes (else: a launch
  //   before), by the producer's idle warps (kProducerStats) unless they apply deferred
  //   epilogues; then by the consumers;
  //   kGridStats: those statistics read from global memory by the producer's idle warps of
  //   every CTA, each row once in the grid (gridRowStats).
  constexpr bool kTile = Epilogue::kTile;
  constexpr bool kPre = kTile && Epilogue::kStaged >= 0;
  constexpr bool kDefer = kTile && Epilogue::kDefer;
  constexpr bool kSide = kDefer && kPre;
  constexpr bool kStats = Epilogue::kNorm != 0 && Epilogue::kNormStats;
  constexpr bool kGridStats = Epilogue::kNorm != 0 && GridStatsEpilogue<Epilogue>::value;
  static_assert(!(kGridStats && (kStats || kDefer || Epilogue::kSplit)),
                "the grid's statistics warps are the producer's idle warps, and they need whole "
                "tiles (their counters are the split's workspace)");
  constexpr bool kProducerStats =
      kStats && !kDefer &&
      wgmmaSmemBytes<T, kTile, kSide>() + sizeof(WgmmaStats<BM, T::A_ROWS>) + 1024 <=
          FPAT_SM90_SMEM_BYTES;
  constexpr int kStatsBytes = kProducerStats ? sizeof(WgmmaStats<BM, T::A_ROWS>) : 0;
  constexpr int kSlabs = T::CONSUMERS * 4;
  constexpr bool kStagedStore = !kTile && T::STAGES * T::STAGE_BYTES + 1024 +
                                                  kSlabs * kSlabRows * kSlabPitch * 2 + 1024 +
                                                  kStatsBytes <=
                                              FPAT_SM90_SMEM_BYTES;
  constexpr bool kDual = DualEpilogue<Epilogue>::value;
  //   kStageCols: the deferred LayerNorm's column terms of each tile staged in shared memory,
  //   two tiles' per consumer (applyDeferredNorm), where it has room.
  constexpr int kColBytes = T::CONSUMERS * 2 * 2 * T::BN * 4;
  constexpr bool kStageCols =
      Epilogue::kNorm == 1 && wgmmaSmemBytes<T, kTile, kSide>() +
                                      (kStagedStore ? kSlabs * kSlabRows * kSlabPitch * 2 : 0) +
                                      kStatsBytes + 1024 + kColBytes <=
                                  FPAT_SM90_SMEM_BYTES;
  // The last wave split in k: cooperative tiles without clusters, where the code generator
  // planned it.
  constexpr bool kSplitLast = !T::PINGPONG && CL == 1 && Epilogue::kSplit;
  // Names the per-element form, which the tile schedules never call (nvcc warns of an unused
  // function otherwise).
  static_assert(sizeof(&Epilogue::operator()) > 0, "an epilogue's per-element functor");
  static_assert(!kTile || !T::PINGPONG, "the epilogue tile is for the cooperative schedule");
  static_assert(!kDual || !kTile, "the dual GEMM stores from registers");
  static_assert(!(Epilogue::kSplit && Epilogue::kNormStats),
                "row statistics summed in the main loop need whole tiles (no split in k)");

  extern __shared__ __align__(1024) unsigned char smemRaw[];
  __shared__ __align__(8) uint64_t full[S], empty[S], order[2], tileFull, tileEmpty, sideFull;
  __shared__ __align__(16) elem epiSlab[kStagedStore ? kSlabs : 1][kSlabRows * kSlabPitch];
  __shared__ __align__(
      16) float normCols[kStageCols ? T::CONSUMERS * 2 : 1][kStageCols ? 2 * T::BN : 4];
  __shared__ __align__(16) WgmmaStats<kProducerStats ? BM : 1, kProducerStats ? T::A_ROWS : 0>
      stats;
  const WgmmaSmem<T> sm{smemRaw + ((1024 - (smemAddr(smemRaw) & 1023)) & 1023),
                        full,
                        empty,
                        order,
                        &tileFull,
                        &tileEmpty,
                        &sideFull};

  const FpatKernelArgs& a = p.k;
  const int M = static_cast<int>(a.M), K = static_cast<int>(a.K);
  const int N = kDual ? static_cast<int>(2 * ((a.N + 7) / 8 * 8)) : static_cast<int>(a.N);
  // A short A box cannot hold more rows: fail the launch rather than compute wrong rows (the
  // code generator never pairs such a configuration with a larger M).
  if (T::A_ROWS < BM && M > T::A_ROWS)
    __trap();
  const int rank = CL > 1 ? static_cast<int>(clusterRank()) : 0;
  const WgmmaSchedule<T, kSplitLast, kDefer, kSide> sched(a, M, N, K, rank, p.splitTiles,
                                                          p.splitPieces);
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbarInit(&full[s], 1);
      // Every consumer warp that reads a stage releases it: all consumers (cooperative) or the
      // one that owns the tile (ping-pong). In clusters one thread per consumer warpgroup
      // releases it, in every CTA of the cluster (remote arrivals are costly).
      mbarInit(&empty[s], (T::PINGPONG ? 1 : T::CONSUMERS) * (CL == 1 ? 4 : CL) +
                              (kProducerStats ? 3 : 0)); // the statistics warps, this CTA's
    }
    if constexpr (kProducerStats) {
      for (int b = 0; b < 2; ++b) {
        mbarInit(&stats.full[b], 96);
        mbarInit(&stats.empty[b], 128 * (T::PINGPONG ? 1 : T::CONSUMERS));
      }
    }
    mbarInit(&order[0], 1);
    mbarInit(&order[1], 1);
    // kPre: the producer's operand load completes tileFull; each consumer warpgroup's thread 0
    // arrives on tileEmpty once its previous tile's store has read the tile.
    mbarInit(&tileFull, 1);
    mbarInit(&tileEmpty, T::CONSUMERS);
    mbarInit(&sideFull, 1); // kSide: TMA completes it
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if constexpr (CL > 1)
    clusterSync(); // the peer's barriers are initialised before any multicast or remote arrive

  if (wg == 0) {
    // Producer: one thread issues every copy; the other 127 only give their registers away,
    // or, with kDefer, three of their warps apply the deferred epilogues, or with
    // kProducerStats sum the deferred norm's row statistics.
    // The ring's statistics warps keep 56 registers (sums, shifts and unrolled loads); the
    // consumers then take 224, which their accumulators fit. The grid's statistics warps do
    // with 40 (LayerNorm's consumers spilled more at 224: +18% against +11%, session 45).
    if constexpr (T::CONSUMERS == 2 && kProducerStats)
      asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
    else if constexpr (T::CONSUMERS == 2)
      asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 0)
      produceStages<T, TRANS_B, kPre, kSide>(p, sm, sched);
    else if (kDefer && threadIdx.x >= 32)
      helperEpilogues<T, Epilogue, kSide>(p, sm, sched);
    else if constexpr (kProducerStats) {
      if (threadIdx.x >= 32)
        producerRowStats<T, Epilogue::kNorm>(sm, sched, stats, a.eps);
    } else if constexpr (kGridStats) {
      if (threadIdx.x >= 32)
        gridRowStats<BM, Epilogue::kNorm>(a, M, K);
    }
  } else {
    if constexpr (T::CONSUMERS == 2 && kProducerStats)
      asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
    else if constexpr (T::CONSUMERS == 2)
      asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1, warp = threadIdx.x % 128 / 32;
    float d[MI][T::BN / 2];
#pragma unroll
    for (int m = 0; m < MI; ++m)
#pragma unroll
      for (int i = 0; i < T::BN / 2; ++i)
        d[m][i] = 0.0f;
    const Epilogue epi;
    elem* const slab = kStagedStore ? epiSlab[c * 4 + warp] : nullptr;
    WgmmaRowSums<MI, Epilogue::kNorm> sums;
    TileStoreState tileState;
    int local = 0;  // the item's place in this CTA's sequence
    int normed = 0; // tiles this consumer normalised: their column terms alternate buffers
    int tiled = 0;  // items before this one that stored through the tile
    unsigned orderPhase = 0;
    long long ring = 0; // k-tiles of this CTA's earlier items: the ring holds them in turn
    int t, k0, k1;
    for (int w = 0; sched.work(w, t, k0, k1); ++w, ++local, tiled += k1 == sched.KT) {
      const long long first = ring;
      ring += k1 - k0;
      if (T::PINGPONG && (local & 1) != c)
        continue;
      // Ping-pong: a consumer starts a tile's main loop only once the other has seen every
      // k-tile of the tile before it arrive. Its waits on the ring are then at most one phase
      // ahead of each stage, which parity waits need (two phases ahead looks complete).
      if (T::PINGPONG && local > 0) {
        mbarWait(&order[c], orderPhase);
        orderPhase ^= 1;
      }
      int tm, tn;
      sched.coords(t, tm, tn);
      // Rows of the tile this consumer computes: its 64 (cooperative) or all BM (ping-pong).
      const int row0 = T::PINGPONG ? 0 : c * 64 * MI;
      consumeStages<T, TRANS_B, kPre, kStats && !kProducerStats, Epilogue::kNorm>(
          sm, sched, d, sums, t, k0, k1, first, c, tiled);
      if (sched.sk && t >= sched.dpTiles && exchangePartials<T>(a, sched, d, t, w, k1, c))
        continue;
      if constexpr (Epilogue::kNorm != 0)
        applyDeferredNorm<T, Epilogue::kNorm,
                          kGridStats ? 3
                          : kStats   ? (kProducerStats ? 2 : 1)
                                     : 0,
                          kStageCols>(a, sched, sums, stats, local, d, tm, tn, row0,
                                      kStageCols ? normCols[c * 2 + (normed++ & 1)] : nullptr, c);
      if constexpr (kDual)
        storeDual<T>(a, epi, d, slab, M, tm, tn, row0);
      else if constexpr (kTile)
        storeThroughTile<T, Epilogue, kPre, kDefer>(p, sm, sched, epi, d, tileState, t, tm, tn,
                                                    row0, c, local);
      else
        storeFromRegisters<T>(a, epi, d, slab, M, N, tm, tn, row0);
    }
    if constexpr (kTile) {
      if (threadIdx.x % 128 == 0)
        bulkWait(); // the last tile's stores complete before the CTA leaves
    }
  }
  if constexpr (kGridStats) {
    __syncthreads(); // this CTA's statistics warps and waits are over
    if (threadIdx.x == 0)
      gridStatsReset(a, (M + BM - 1) / BM);
  }
  if constexpr (CL > 1)
    clusterSync(); // no CTA leaves while the peer may still write its stages or barriers
#else
  (void)p;
  __trap(); // compiled without sm_90a: the host never launches this
#endif
}

} // namespace fpat
