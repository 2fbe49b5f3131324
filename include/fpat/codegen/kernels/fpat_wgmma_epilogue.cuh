// The Hopper GEMM's epilogue schedules: what becomes of a consumer's accumulators after the
// main loop. The arithmetic is the generated Epilogue functor's (pair, head, dual); these
// functions decide where it runs and how its results reach memory:
//   * split tiles' partial sums exchanged through the workspace (the last piece adds them);
//   * the deferred norm applied to the accumulators;
//   * the dual GEMM's gate and up columns combined and stored;
//   * through the epilogue tile: an [M, N] operand staged there by TMA, results stored by TMA,
//     or left to the producer warpgroup's idle warps (helperEpilogues) while the consumers go
//     on to the next tile;
//   * from registers: interior tiles through a per-warp slab as whole 128-byte row segments,
//     edge tiles as checked pairs.
// Accumulator layout of m64nN: thread (warp w, lane l) holds rows 16w + l/4 (+8) and columns
// 8j + 2(l%4) (+1), register 4j + 2*(row half) + column.
#pragma once

#include "fpat_wgmma_mainloop.cuh"
#include "fpat_wgmma_prep.cuh"

namespace fpat::sm90 {

/// Interior tiles store through one 16 x 64 slab of shared memory per consumer warp (padded
/// rows: the pair writes are free of bank conflicts), where the configuration leaves room.
constexpr int kSlabRows = 16, kSlabPitch = 72;

/// The hand-offs between consumers and helpers are named barriers (racecheck follows those, not
/// mbarrier phases, for ordinary shared-memory accesses): kReady, the consumers' rows are in
/// the tile (consumers arrive, helpers wait); kFree, the helpers' stores have read it (helpers
/// arrive, consumers wait). Strict alternation keeps each barrier's phases in step. Barriers
/// 1 and 2 are the consumer warpgroups' own, 3 the helpers'.
template <class T> struct HandOff {
  static constexpr int kReady = 4, kFree = 5, kThreads = 128 * T::CONSUMERS + 96;
};

/// This warp's 16 rows of one m64 accumulator block, COLS columns from `col0`, through its slab
/// W columns at a time: each thread writes its pairs, then the warp stores whole rows.
template <int COLS, int W, class Ld>
__device__ __forceinline__ void storeThroughSlab(const float* acc, elem* slab, elem* C, Ld ld,
                                                 int64_t row0g, int col0, int lane) {
  static_assert(COLS % W == 0, "the slab passes cover the tile");
#pragma unroll
  for (int q = 0; q < COLS / W; ++q) {
#pragma unroll
    for (int jj = 0; jj < W / 8; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = (W / 8) * q + jj;
        *reinterpret_cast<elem2*>(slab + (lane / 4 + 8 * h) * kSlabPitch + 8 * jj +
                                  2 * (lane % 4)) =
            fromF2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      }
    __syncwarp();
#pragma unroll
    for (int pass = 0; pass < 16 * (W / 8) / 32; ++pass) {
      const int i = 32 * pass + lane, r = i / (W / 8), chunk = i % (W / 8);
      *reinterpret_cast<uint4*>(C + (row0g + r) * ld + col0 + W * q + 8 * chunk) =
          *reinterpret_cast<const uint4*>(slab + r * kSlabPitch + 8 * chunk);
    }
    __syncwarp();
  }
}

/// This thread's pairs of one m64 accumulator block, COLS columns, stored without checks.
template <int COLS, class Ld>
__device__ __forceinline__ void storePairs(const float* acc, elem* C, Ld ld, int64_t rowBase,
                                           int64_t colBase) {
#pragma unroll
  for (int j = 0; j < COLS / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<elem2*>(C + (rowBase + 8 * h) * ld + colBase + 8 * j) =
          fromF2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
}

/// The same for edge tiles: only elements inside M x N, as pairs where N is even.
template <int COLS>
__device__ __forceinline__ void storeChecked(const float* acc, elem* C, int64_t M, int64_t N,
                                             int64_t rowBase, int64_t colBase, bool pairs) {
#pragma unroll
  for (int j = 0; j < COLS / 8; ++j) {
    const int64_t col = colBase + 8 * j;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = rowBase + 8 * h;
      if (row < M && col < N) {
        elem* out = C + row * N + col;
        if (pairs) {
          *reinterpret_cast<elem2*>(out) = fromF2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        } else {
          out[0] = fromF(acc[4 * j + 2 * h]);
          if (col + 1 < N)
            out[1] = fromF(acc[4 * j + 2 * h + 1]);
        }
      }
    }
  }
}

/// A split tile's pieces (the schedule's item w, tile t >= dpTiles). Slot (split tile i, piece
/// p < last), one part per consumer warpgroup, register-major so that a warp's accesses are
/// whole 128-byte lines; flags are 0 between launches (the last piece resets them). Returns
/// true where the item is done (a piece but the last: its partial sums are out); the last
/// piece returns with the others' partial sums added to d.
template <class T, class Sched>
__device__ __forceinline__ bool exchangePartials(const FpatKernelArgs& a, const Sched& sched,
                                                 float (&d)[T::MI][T::BN / 2], int t, int w, int k1,
                                                 int c) {
  constexpr int MI = T::MI, BN = T::BN;
  const int tid = threadIdx.x % 128;
  const int slotSize = MI * (BN / 2) * 128, i = t - sched.dpTiles;
  const int piece = sched.piece(w);
  auto part = [&](int p) { return ((i * (sched.skPieces - 1) + p) * T::CONSUMERS + c); };
  unsigned* const flags = static_cast<unsigned*>(a.scratch[1]);
  if (k1 < sched.KT) { // not the last piece: partial sums out, then the flag
    float* const slot = static_cast<float*>(a.scratch[0]) + part(piece) * slotSize;
#pragma unroll
    for (int m = 0; m < MI; ++m)
#pragma unroll
      for (int r = 0; r < BN / 2; ++r)
        __stcg(slot + (m * (BN / 2) + r) * 128 + tid, d[m][r]);
    __threadfence();
    namedBarrier(1 + c, 128);
    if (tid == 0)
      asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(flags + part(piece)), "r"(1u)
                   : "memory");
    return true;
  }
  // The last piece: the others' partial sums in.
  for (int p = 0; p < sched.skPieces - 1; ++p) {
    if (tid == 0) {
      unsigned* const flag = flags + part(p);
      unsigned seen = 0;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(flag) : "memory");
      } while (seen == 0);
      *flag = 0; // for the next launch
    }
    namedBarrier(1 + c, 128);
    const float* const slot = static_cast<const float*>(a.scratch[0]) + part(p) * slotSize;
#pragma unroll
    for (int m = 0; m < MI; ++m)
#pragma unroll
      for (int r = 0; r < BN / 2; ++r)
        d[m][r] += __ldcg(slot + (m * (BN / 2) + r) * 128 + tid);
  }
  return false;
}

/// The deferred norm (Epilogue::kNorm: 1 layernorm, 2 rmsnorm): the main loop ran on the raw
/// rows of x with gamma folded into B, so each accumulator becomes rstd[row] * (acc -
/// mean[row] colsum[col]) + (beta W)[col], or rstd[row] * acc, before any epilogue (the helpers
/// of a deferred tile then see the normalised GEMM, as rounded as the unfused one's). The
/// statistics come from the launch before, which this kernel overlaps (FROM 0), from the
/// consumer's own row sums (1), from the producer's statistics warps (2: `stats`, item
/// `local`'s buffer) or from the statistics warps of the whole grid (3: gridRowStats).
/// STAGE_COLS (LayerNorm, where shared memory has room; `colTile`: 2 BN floats of the consumer's,
/// not read by it since its barrier of the tile before): the tile's column terms staged there, one
/// 16-byte load per thread issued before the statistics wait, where each thread would
/// otherwise load 2 BN / 4 float2 of them from L2 after it.
template <class T, int NORM, int FROM, bool STAGE_COLS, class Sched, class Stats>
__device__ __forceinline__ void
applyDeferredNorm(const FpatKernelArgs& a, const Sched& sched,
                  const WgmmaRowSums<T::MI, NORM>& sums, Stats& stats, int local,
                  float (&d)[T::MI][T::BN / 2], int tm, int tn, int row0, float* colTile, int c) {
  constexpr int MI = T::MI, BN = T::BN;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, M = sched.M;
  const int64_t pitch = normColumnsPitch(sched.N);
  // The staged column terms: colsum in colTile[0, BN), beta W in [BN, 2 BN).
  constexpr int kColLoads = (BN / 2 + 127) / 128;
  [[maybe_unused]] float4 colv[kColLoads];
  if constexpr (NORM == 1 && STAGE_COLS) {
    const float* const src = normColumns(a) + tn * BN;
#pragma unroll
    for (int n = 0; n < kColLoads; ++n) {
      const int i = tid + 128 * n;
      if (i < BN / 2)
        colv[n] = __ldg(reinterpret_cast<const float4*>(
            i < BN / 4 ? src + 4 * i : src + pitch + 4 * (i - BN / 4)));
    }
  }
  float rs[MI][2], mr[MI][2];
  if constexpr (FROM == 1) {
    sums.finish(sched.K, sched.KT, T::BK, a.eps, rs, mr);
  } else if constexpr (FROM == 2) {
    const int b = local & 1;
    sm90::mbarWait(&stats.full[b], (local >> 1) & 1);
#pragma unroll
    for (int m = 0; m < MI; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 s = stats.out[b][row0 + m * 64 + warp * 16 + lane / 4 + 8 * h];
        rs[m][h] = s.x;
        mr[m][h] = s.y;
      }
    sm90::mbarArrive(&stats.empty[b]);
  } else {
    if constexpr (FROM == 3) {
      // The tile's block (a tile below the matrix reads the last one's rows, unused).
      const int b = min(tm, (M - 1) / T::BM);
      gridStatsWait(a, b, static_cast<unsigned>(min(T::BM, M - b * T::BM)));
    } else {
      waitPriorGrid();
    }
#pragma unroll
    for (int m = 0; m < MI; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = min(tm * T::BM + row0 + m * 64 + warp * 16 + lane / 4 + 8 * h, M - 1);
        // __ldcg: written during this kernel where FROM == 3 (not through the read-only path)
        rs[m][h] = __ldcg(static_cast<const float*>(a.rowStats[1]) + row);
        mr[m][h] =
            NORM == 1 ? __ldcg(static_cast<const float*>(a.rowStats[0]) + row) * rs[m][h] : 0.0f;
      }
  }
  if constexpr (NORM == 1 && STAGE_COLS) {
#pragma unroll
    for (int n = 0; n < kColLoads; ++n)
      if (tid + 128 * n < BN / 2)
        reinterpret_cast<float4*>(colTile)[tid + 128 * n] = colv[n];
    namedBarrier(1 + c, 128);
  }
  // This thread's columns of the tile: pairs 8 apart (their offsets fold into immediates).
  const float* const cols =
      NORM != 1 ? nullptr : (STAGE_COLS ? colTile : normColumns(a) + tn * BN) + 2 * (lane % 4);
  const int64_t colPitch = STAGE_COLS ? BN : pitch;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    float2 cs = make_float2(0.0f, 0.0f), bw = cs;
    if constexpr (NORM == 1) {
      cs = *reinterpret_cast<const float2*>(cols + 8 * j);
      bw = *reinterpret_cast<const float2*>(cols + colPitch + 8 * j);
    }
#pragma unroll
    for (int m = 0; m < MI; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float& x0 = d[m][4 * j + 2 * h];
        float& x1 = d[m][4 * j + 2 * h + 1];
        x0 = fmaf(x0, rs[m][h], fmaf(-mr[m][h], cs.x, bw.x));
        x1 = fmaf(x1, rs[m][h], fmaf(-mr[m][h], cs.y, bw.y));
      }
  }
}

/// The dual GEMM's epilogue: the tile's 8-column blocks 2j and 2j + 1 are acc's and acc2's
/// columns 8j .. 8j + 7 of the result's tile of BN / 2 columns, held by the same thread in
/// registers 8j + 2h (+1) and 8j + 4 + 2h (+1). The results go to registers 4j + 2h (+1), which
/// earlier steps have read: the rest of the store is a GEMM's of BN / 2 columns. `slab`: this
/// warp's, where the configuration has them (else null).
template <class T, class Epilogue>
__device__ __forceinline__ void storeDual(const FpatKernelArgs& a, const Epilogue& epi,
                                          float (&d)[T::MI][T::BN / 2], elem* slab, int M, int tm,
                                          int tn, int row0) {
  constexpr int MI = T::MI, BM = T::BM, OW = T::BN / 2;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  elem* C = static_cast<elem*>(a.out);
  const int64_t NO = a.N;
  const bool pairsO = NO % 2 == 0;
  const bool inside = (tm + 1) * BM <= M && (tn + 1) * OW <= NO && pairsO;
#pragma unroll
  for (int m = 0; m < MI; ++m) {
    const int64_t rowBase = static_cast<int64_t>(tm) * BM + row0 + m * 64 + warp * 16 + lane / 4;
    const int64_t colBase = static_cast<int64_t>(tn) * OW + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < OW / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 gv = make_float2(d[m][8 * j + 2 * h], d[m][8 * j + 2 * h + 1]);
        const float2 uv = make_float2(d[m][8 * j + 4 + 2 * h], d[m][8 * j + 5 + 2 * h]);
        float2 r;
        if (inside) {
          r = epi.dual(gv, uv, rowBase + 8 * h, colBase + 8 * j, a);
        } else {
          // Edge tiles: coordinates clamped into the result (loads in bounds, results outside
          // dropped by the checked stores below).
          const int64_t row = min(rowBase + 8 * h, static_cast<int64_t>(M - 1));
          const int64_t col = min(colBase + 8 * j, pairsO ? NO - 2 : NO - 1);
          if (pairsO) {
            r = epi.dual(gv, uv, row, col, a);
          } else {
            r.x = epi.dual1(gv.x, uv.x, row, col, a);
            r.y = epi.dual1(gv.y, uv.y, row, min(col + 1, NO - 1), a);
          }
        }
        d[m][4 * j + 2 * h] = r.x;
        d[m][4 * j + 2 * h + 1] = r.y;
      }
    if (inside) {
      if (slab != nullptr && NO % 8 == 0 && reinterpret_cast<uintptr_t>(C) % 16 == 0) {
        // 64 columns at a time (32 where the result's tile is not a multiple of 64: BN = 192,
        // 64).
        const int64_t row0g = static_cast<int64_t>(tm) * BM + row0 + m * 64 + warp * 16;
        storeThroughSlab<OW, OW % 64 == 0 ? 64 : 32>(d[m], slab, C, NO, row0g, tn * OW, lane);
        continue;
      }
      storePairs<OW>(d[m], C, NO, rowBase, colBase);
      continue;
    }
    storeChecked<OW>(d[m], C, M, NO, rowBase, colBase, pairsO);
  }
}

/// The epilogue from registers (no epilogue tile). Tiles inside the problem (all of them but
/// the last row and column of tiles) run the epilogue on column pairs (its operands load as
/// 4-byte pairs) and store without bounds checks; edge tiles check every element. `slab`: this
/// warp's, where the configuration has them (else null).
template <class T, class Epilogue>
__device__ __forceinline__ void storeFromRegisters(const FpatKernelArgs& a, const Epilogue& epi,
                                                   float (&d)[T::MI][T::BN / 2], elem* slab, int M,
                                                   int N, int tm, int tn, int row0) {
  constexpr int MI = T::MI, BM = T::BM, BN = T::BN;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  elem* C = static_cast<elem*>(a.out);
  const bool pairs = (N % 2) == 0; // f16 pairs are 4-byte aligned
  // Rows start 16-byte aligned: the slab stores write 16 bytes at a time.
  const bool rows16B = N % 8 == 0 && reinterpret_cast<uintptr_t>(C) % 16 == 0;
  const bool inside = (tm + 1) * BM <= M && (tn + 1) * BN <= N && pairs;
#pragma unroll
  for (int m = 0; m < MI; ++m) {
    const int64_t rowBase = static_cast<int64_t>(tm) * BM + row0 + m * 64 + warp * 16 + lane / 4;
    const int64_t colBase = static_cast<int64_t>(tn) * BN + 2 * (lane % 4);
    if (inside) {
      // First the epilogue of every accumulator pair, then the stores: C may alias an operand
      // as far as the compiler knows, so interleaving them would order each operand load after
      // the previous store and expose its latency 2 * BN / 8 times.
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float2 r = epi.pair(make_float2(d[m][4 * j + 2 * h], d[m][4 * j + 2 * h + 1]),
                                    rowBase + 8 * h, colBase + 8 * j, a, make_float2(0.0f, 0.0f));
          d[m][4 * j + 2 * h] = r.x;
          d[m][4 * j + 2 * h + 1] = r.y;
        }
      if (slab != nullptr && rows16B) {
        const int64_t row0g = tm * BM + row0 + m * 64 + warp * 16;
        storeThroughSlab<BN, 64>(d[m], slab, C, N, row0g, tn * BN, lane);
        continue;
      }
      storePairs<BN>(d[m], C, N, rowBase, colBase);
      continue;
    }
    // Edge tiles: the epilogue of every element first, at coordinates clamped into the problem
    // (their loads are in bounds and branch-free, so they are all in flight at once; results
    // outside are dropped), then the checked stores. A check around each element's epilogue
    // ordered its operand loads after the previous element's store: ping-pong gemm_residual
    // ran 2x as long at 2047x5120x1024.
    const int64_t lastRow = M - 1, lastPair = pairs ? N - 2 : N - 1;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = min(rowBase + 8 * h, lastRow);
        const int64_t col = min(colBase + 8 * j, lastPair);
        float2 v = make_float2(d[m][4 * j + 2 * h], d[m][4 * j + 2 * h + 1]);
        if (pairs) {
          v = epi.pair(v, row, col, a, make_float2(0.0f, 0.0f));
        } else {
          v.x = epi(v.x, row, col, a);
          v.y = epi(v.y, row, min(col + 1, static_cast<int64_t>(N - 1)), a);
        }
        d[m][4 * j + 2 * h] = v.x;
        d[m][4 * j + 2 * h + 1] = v.y;
      }
    storeChecked<BN>(d[m], C, M, N, rowBase, colBase, pairs);
  }
}

/// The consumers' state between the tiles they store through the epilogue tile.
struct TileStoreState {
  bool handedOff = false; // kDefer: the previous tile was left to the helpers
  int preloaded = 0;      // kPre: tiles (not deferred) whose operand was loaded into the tile
};

/// The epilogue through the BM x BN shared-memory tile (Epilogue::kTile, cooperative only): the
/// epilogue writes its results into the tile, laid out as TMA's 128-byte-swizzled boxes of 64
/// columns, and one thread per consumer warpgroup stores its 64 rows with TMA. PRE: operand
/// Epilogue::kStaged ([M, N], e.g. a residual) arrived in the same tile by TMA, loaded by the
/// producer during the tile's main loop, and each result overwrites its operand in place.
/// DEFER: where the schedule defers tile t, the consumers only write their accumulators into
/// the tile, rounded to the element type as an unfused GEMM would store them, and go on to the
/// next tile; the helper warps apply the epilogue there and store it.
template <class T, class Epilogue, bool PRE, bool DEFER, class Sched>
__device__ __forceinline__ void
storeThroughTile(const FpatTmaArgs& p, const WgmmaSmem<T>& sm, const Sched& sched,
                 const Epilogue& epi, float (&d)[T::MI][T::BN / 2], TileStoreState& st, int t,
                 int tm, int tn, int row0, int c, int local) {
  constexpr int MI = T::MI, BM = T::BM, BN = T::BN;
  using H = HandOff<T>;
  const FpatKernelArgs& a = p.k;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, M = sched.M, N = sched.N;
  unsigned char* const tileC = sm.tile();
  // The helpers' stores of the previous tile have read the tile.
  const bool prevHanded = st.handedOff;
  if (DEFER && prevHanded)
    namedBarrier(H::kFree, H::kThreads);
  const bool handOff = sched.deferred(t);
  st.handedOff = handOff;
  // (Deferred tiles come first in a CTA's sequence: a consumer-stored tile before one handed
  // off happens only if that changes, and then its stores must have read the tile.)
  if (handOff && !prevHanded && local > 0) {
    if (tid == 0)
      bulkWaitRead();
    namedBarrier(1 + c, 128);
  }
  // Pair (j, h) of a thread: 64-column box j / 8, tile row r + 8h, 16-byte chunk j % 8 swizzled
  // with the row's low three bits. Matrices j, j + 1 (h = 0, 1) go by one stmatrix / ldmatrix:
  // lane 8i + q gives row q of pair column j + i / 2, half i % 2, in chunk ((j % 8) + i / 2) ^ q
  // = (j % 8) ^ (i / 2 ^ q) (j even), one of four addresses per lane plus an immediate.
  const int mrow = row0 + warp * 16 + (lane / 8 % 2) * 8 + lane % 8;
  const int chunk = (lane / 16) ^ (lane % 8);
  unsigned quad[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    quad[k] = smemAddr(tileC) + mrow * 128 + (((2 * k) ^ chunk) * 16);
  auto quadAt = [&](int m, int j) {
    return quad[(j % 8) / 2] + (j / 8) * (BM * 128) + m * 64 * 128;
  };
  // Each quad is stored as soon as it is computed: its accumulators die there (storing after
  // all the loads left the operands' registers live alongside the 128 accumulators, and
  // gemm_silu_mul spilled).
  auto store = [&](int m, int j) {
    stsm4(quadAt(m, j), pairBits(d[m][4 * j], d[m][4 * j + 1]),
          pairBits(d[m][4 * j + 2], d[m][4 * j + 3]), pairBits(d[m][4 * j + 4], d[m][4 * j + 5]),
          pairBits(d[m][4 * j + 6], d[m][4 * j + 7]));
  };
  if (handOff) {
#pragma unroll
    for (int m = 0; m < MI; ++m)
#pragma unroll
      for (int j = 0; j < BN / 8; j += 2)
        store(m, j);
    namedBarrierArrive(H::kReady, H::kThreads);
    return;
  }
  // The operand is in the tile (PRE), or the tile is free once this warpgroup's previous
  // stores have read it.
  if constexpr (PRE) {
    mbarWait(sm.tileFull, st.preloaded & 1);
    ++st.preloaded;
  } else {
    if (tid == 0)
      bulkWaitRead();
    namedBarrier(1 + c, 128);
  }
  // The operand's reads may be scheduled freely, but only after the wait above.
  const unsigned after = orderedZero();
  // 64-bit bases: operand addresses then fold the pair offsets into immediates.
  const int r = row0 + warp * 16 + lane / 4;
  const int64_t rowBase = static_cast<int64_t>(tm) * BM + r,
                colBase = static_cast<int64_t>(tn) * BN + 2 * (lane % 4);
  auto apply = [&](int m, int j, int h, float2 s) {
    const float2 v = epi.pair(make_float2(d[m][4 * j + 2 * h], d[m][4 * j + 2 * h + 1]),
                              rowBase + m * 64 + 8 * h, colBase + 8 * j, a, s);
    d[m][4 * j + 2 * h] = v.x;
    d[m][4 * j + 2 * h + 1] = v.y;
  };
  // Tiles inside the problem run without bounds checks, in one branch-free block (a check per
  // pair measured 3-11% slower: each pair's loads and math became a block of its own); TMA
  // clips the stores of edge tiles (N is even here, so a pair is inside or outside as a whole).
  // The operand's out-of-bounds pairs are TMA's zeros.
  auto applyAll = [&](auto checked) {
#pragma unroll
    for (int m = 0; m < MI; ++m)
#pragma unroll
      for (int j = 0; j < BN / 8; j += 2) {
        unsigned s[4] = {0, 0, 0, 0};
        if constexpr (PRE)
          ldsm4(quadAt(m, j) + after, s);
        if constexpr (PRE && Epilogue::kAddStaged) {
          // The rest of the epilogue in f32, rounded, then the operand added in pairs (0.3-0.6%
          // faster gemm_residual than adding it in f32, session 19). Pairs outside the problem
          // keep their accumulators (TMA clips their stores).
          unsigned o[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int jj = j + i / 2, h = i % 2;
            const float2 acc = make_float2(d[m][4 * jj + 2 * h], d[m][4 * jj + 2 * h + 1]);
            o[i] = pairBits(acc.x, acc.y);
            if (!decltype(checked)::value ||
                (rowBase + m * 64 + 8 * h < M && colBase + 8 * jj < N)) {
              const float2 r =
                  epi.head(acc, rowBase + m * 64 + 8 * h, colBase + 8 * jj, a, bitsPair(s[i]));
              o[i] = addPairBits(pairBits(r.x, r.y), s[i]);
            }
          }
          stsm4(quadAt(m, j), o[0], o[1], o[2], o[3]);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int jj = j + i / 2, h = i % 2;
            if (!decltype(checked)::value || (rowBase + m * 64 + 8 * h < M && colBase + 8 * jj < N))
              apply(m, jj, h, PRE ? bitsPair(s[i]) : make_float2(0.0f, 0.0f));
          }
          store(m, j);
        }
      }
  };
  if ((tm + 1) * BM <= M && (tn + 1) * BN <= N)
    applyAll(Flag<false>{});
  else
    applyAll(Flag<true>{});
  fenceProxyAsync();
  namedBarrier(1 + c, 128);
  if (tid == 0 && tm < sched.tilesM) {
    // 64 x 64 boxes: each consumer's rows of each 64-column box.
#pragma unroll
    for (int q = 0; q < BN / 64; ++q)
#pragma unroll
      for (int m = 0; m < MI; ++m)
        tmaStore2d(&p.d, tileC + q * (BM * 128) + (row0 + 64 * m) * 128, tn * BN + 64 * q,
                   tm * BM + row0 + 64 * m);
    bulkCommit();
  }
}

/// The helpers: the producer warpgroup's warps 1..3 apply the epilogues the schedule defers,
/// in the epilogue tile, while the consumers compute the next tile, and store it by TMA. Warp h
/// takes tile rows h - 1, h + 2, ... of each 64-column box, a row per warp instruction (lane:
/// columns 2 lane, 2 lane + 1), so that operand loads from global memory are whole 128-byte
/// rows. SIDE: the epilogue's [M, N] operand comes to them by TMA, one BM x 64 box at a time,
/// into the side buffer behind the tile (their own row loads from global memory fell behind
/// the main loop: gemm_silu_mul took 1.7x as long); PRE: a CTA's last tile, which the
/// consumers finish, gets its operand loaded into the tile here.
template <class T, class Epilogue, bool SIDE, class Sched>
__device__ __forceinline__ void helperEpilogues(const FpatTmaArgs& p, const WgmmaSmem<T>& sm,
                                                const Sched& sched) {
  constexpr int BM = T::BM, BN = T::BN;
  using H = HandOff<T>;
  const FpatKernelArgs& a = p.k;
  const Epilogue epi;
  const int hw = threadIdx.x / 32 - 1, lane = threadIdx.x % 32, M = sched.M, N = sched.N;
  unsigned char* const tileC = sm.tile();
  unsigned char* const side = sm.side();
  // SIDE: the operand's box q of tile t into the side buffer (thread 32 issues it once the
  // helpers have read the previous box). The next box is loaded while the current one's
  // stores drain, box 0 of a tile while the consumers still compute it.
  unsigned sidePhase = 0;
  // Box q of tile t's operand into `dst`, completing `bar` (q < 0: every box).
  auto loadOperand = [&](int t, int q, unsigned char* dst, uint64_t* bar) {
    int tm, tn;
    sched.coords(t, tm, tn);
    tm = min(tm, sched.tilesM - 1);
    mbarExpectTx(bar, q < 0 ? BM * BN * 2 : BM * 128);
    for (int j = q < 0 ? 0 : q; j < (q < 0 ? BN / 64 : q + 1); ++j)
      tmaLoad2d(dst + (q < 0 ? j * BM * 128 : 0), &p.c, tn * BN + 64 * j, tm * BM, bar);
  };
  if (SIDE && threadIdx.x == 32 && sched.deferred(sched.unit0))
    loadOperand(sched.unit0, 0, side, sm.sideFull);
  for (int t = sched.unit0; t < sched.units; t += sched.stride) {
    if (!sched.deferred(t))
      continue;
    int tm, tn;
    sched.coords(t, tm, tn);
    namedBarrier(H::kReady, H::kThreads);
    const bool inside = (tm + 1) * BM <= M && (tn + 1) * BN <= N;
#pragma unroll 1
    for (int q = 0; q < BN / 64; ++q) {
      const int col = tn * BN + 64 * q + 2 * lane;
      unsigned char* const box = tileC + q * (BM * 128) + (lane % 4) * 4;
      if constexpr (SIDE) {
        mbarWait(sm.sideFull, sidePhase);
        sidePhase ^= 1;
      }
      // kRows rows at a time: all their loads, then the arithmetic, then the stores (the
      // compiler cannot tell the tile from the operands in memory, so a row's store would
      // order the next row's loads after it; one warp per scheduler then waits out every load
      // and MUFU latency in turn). Measured: 4 rows made deferred GeLU tiles at K = 2048 10%
      // faster, 8 rows slower than 1.
      constexpr int kRows = 4;
#pragma unroll 1
      for (int r0 = hw; r0 < BM; r0 += 3 * kRows) {
        float2 v[kRows], s[kRows];
        bool ok[kRows];
#pragma unroll
        for (int u = 0; u < kRows; ++u) {
          const int r = r0 + 3 * u, at = r * 128 + (((lane / 4) ^ (r % 8)) * 16);
          ok[u] = r < BM && (inside || (tm * BM + r < M && col < N));
          v[u] = s[u] = make_float2(0.0f, 0.0f);
          if (ok[u]) {
            v[u] = toF2(*reinterpret_cast<const elem2*>(box + at));
            if constexpr (SIDE)
              s[u] = toF2(*reinterpret_cast<const elem2*>(side + (lane % 4) * 4 + at));
          }
        }
#pragma unroll
        for (int u = 0; u < kRows; ++u)
          if (ok[u]) {
            if constexpr (SIDE && Epilogue::kAddStaged) {
              // As the consumers do: the operand added to head's rounded pair (the element
              // type's pairs convert to f32 and back exactly). The helpers keep exp and
              // division on the MUFU (kFma = false): one warp per scheduler is bound by its own
              // latency, and the FMA forms' extra instructions cost gemm_bias_gelu 4096^3 1
              // point (bench/RESULTS.md, session 20).
              const float2 h = epi.template head<false>(v[u], tm * BM + r0 + 3 * u, col, a, s[u]);
              v[u] = bitsPair(addPairBits(pairBits(h.x, h.y), pairBits(s[u].x, s[u].y)));
            } else {
              v[u] = epi.template pair<false>(v[u], tm * BM + r0 + 3 * u, col, a, s[u]);
            }
          }
#pragma unroll
        for (int u = 0; u < kRows; ++u) {
          const int r = r0 + 3 * u;
          if (ok[u])
            *reinterpret_cast<elem2*>(box + r * 128 + (((lane / 4) ^ (r % 8)) * 16)) =
                fromF2(v[u].x, v[u].y);
        }
      }
      if constexpr (SIDE) {
        namedBarrier(3, 96); // the side buffer is read
        if (threadIdx.x == 32) {
          if (q + 1 < BN / 64)
            loadOperand(t, q + 1, side, sm.sideFull);
          else if (sched.deferred(t + sched.stride))
            loadOperand(t + sched.stride, 0, side, sm.sideFull);
        }
      }
    }
    fenceProxyAsync();
    namedBarrier(3, 96);
    if (threadIdx.x == 32) {
      if (tm < sched.tilesM) {
#pragma unroll
        for (int q = 0; q < BN / 64; ++q)
#pragma unroll
          for (int h = 0; h < BM / 64; ++h)
            tmaStore2d(&p.d, tileC + q * (BM * 128) + h * 64 * 128, tn * BN + 64 * q,
                       tm * BM + 64 * h);
        bulkCommit();
      }
      bulkWaitRead();
      // A CTA's last tile, which the consumers finish: its operand into the tile (PRE).
      if (SIDE && t + sched.stride < sched.units && !sched.deferred(t + sched.stride))
        loadOperand(t + sched.stride, -1, tileC, sm.tileFull);
    }
    namedBarrier(3, 96); // the stores have read the tile
    namedBarrierArrive(H::kFree, H::kThreads);
  }
  if (threadIdx.x == 32)
    bulkWait();
}

} // namespace fpat::sm90
