// The Hopper GEMM's tile scheduler: which tiles (and k-ranges of tiles) a persistent CTA
// computes, in which order, and which of their epilogues the producer warpgroup's idle warps
// take over. Every role of the kernel asks the same schedule, so producer, consumers and helpers
// agree without talking.
#pragma once

#include "fpat_common.cuh"

namespace fpat {

/// Tile `t` of the persistent schedule in grouped order: consecutive tiles walk down a group
/// of `group` M-tiles before moving to the next N-tile (along N with `alongN`: across a group
/// of N-tiles before the next M-tile), so the A rows and B columns in use stay in L2.
__device__ __forceinline__ void tileCoords(int t, int tilesM, int tilesN, int group, bool alongN,
                                           int& tm, int& tn) {
  if (alongN) {
    tileCoords(t, tilesN, tilesM, group, false, tn, tm);
    return;
  }
  const int perGroup = group * tilesN;
  const int first = (t / perGroup) * group;
  const int size = tilesM - first < group ? tilesM - first : group;
  tm = first + (t % perGroup) % size;
  tn = (t % perGroup) / size;
}

/// The schedule of one CTA of a T configuration over an M x N x K problem (N: the GEMM's
/// columns). SPLIT: the last wave may be split in k; DEFER, SIDE: as the epilogue's kDefer and
/// kSide (fpat_wgmma.cuh).
///
/// The schedule hands out units of CLUSTER M-tiles sharing one B tile, one per cluster; this
/// CTA computes M-tile CLUSTER * um + rank of unit (um, tn). With an odd number of M-tiles the
/// last unit's second tile lies below the matrix: its CTA loads the last real A tile (so that
/// the multicast and barriers run as everywhere) and stores nothing.
///
/// The last wave split in k (cooperative tiles without clusters, compiled in where the code
/// generator planned it, Epilogue::kSplit, and where the host passed a workspace): when the
/// tiles are not a whole number of waves, the last skTiles tiles are cut into skPieces equal
/// ranges of k-tiles, and the CTAs take those pieces round-robin, piece by piece (all CTAs then
/// walk the same k-tiles at once, so that L2 serves each slice of A and B to several of them:
/// CTAs at as many k offsets as there are CTAs ran 10-35% slower). The last piece of a tile
/// runs its epilogue after adding the others' partial sums, which they left in a workspace slot
/// each (f32, one per consumer warpgroup) with a flag raised; it comes at least a round after
/// them. The plan (codegen::lastWaveSplit, made on the host for the launch's grid) minimises
/// rounds / pieces plus the partial sums' cost over the remainder of the last wave, or that
/// remainder and the full wave before it; without a plan under 0.9 of a tile the tiles stay
/// whole. Every CTA is resident.
template <class T, bool SPLIT, bool DEFER, bool SIDE> struct WgmmaSchedule {
  static constexpr int CL = T::CLUSTER;
  int M, N, K, tilesM, tilesN, KT, rank, unitsM, units, unit0, stride, G;
  int skTiles = 0, skPieces = 1;
  bool sk;
  int dpTiles; // whole tiles, a multiple of G
  int dpCount;
  // Whether this CTA runs the last piece of some split tile (its last item then has an
  // epilogue, which waits for the helpers to finish a deferred tile before it).
  bool hasLastPiece;

  __device__ __forceinline__ WgmmaSchedule(const FpatKernelArgs& a, int m, int n, int k, int r,
                                           int splitTiles, int splitPieces)
      : M(m), N(n), K(k), tilesM((m + T::BM - 1) / T::BM), tilesN((n + T::BN - 1) / T::BN),
        KT((k + T::BK - 1) / T::BK), rank(r) {
    unitsM = (tilesM + CL - 1) / CL;
    units = unitsM * tilesN;
    unit0 = blockIdx.x / CL;
    stride = gridDim.x / CL;
    G = gridDim.x;
    // The host's plan (codegen::lastWaveSplit), made for this grid where it passed the
    // workspace. (A grid of fewer tiles than SMs, launched on every SM, splits all of them.)
    if (SPLIT && a.scratch[0] != nullptr && splitTiles > 0) {
      skTiles = splitTiles;
      skPieces = splitPieces;
    }
    sk = skTiles > 0;
    dpTiles = units - skTiles;
    dpCount = unit0 < dpTiles ? (dpTiles - 1 - unit0) / stride + 1 : 0;
    const int items = skTiles * skPieces, b = static_cast<int>(blockIdx.x);
    hasLastPiece = b < items && b + (items - 1 - b) / G * G >= items - skTiles;
  }

  /// Item w of this CTA's sequence: tile t, k-tiles [k0, k1); false past the last one. Piece
  /// p of split tile i is item p * skTiles + i of the round-robin.
  __device__ __forceinline__ bool work(int w, int& t, int& k0, int& k1) const {
    if (w < dpCount) {
      t = unit0 + w * stride;
      k0 = 0;
      k1 = KT;
      return true;
    }
    const int q = blockIdx.x + (w - dpCount) * G;
    if (q >= skTiles * skPieces) // also every CTA without a plan
      return false;
    const int piece = q / skTiles;
    t = dpTiles + q % skTiles;
    k0 = piece * KT / skPieces;
    k1 = (piece + 1) * KT / skPieces;
    return true;
  }

  /// The piece of split tile t >= dpTiles that item w is.
  __device__ __forceinline__ int piece(int w) const {
    return (static_cast<int>(blockIdx.x) + (w - dpCount) * G) / skTiles;
  }

  /// Whether the epilogue of unit t is deferred to the helper warps (the same answer in every
  /// role): tiles the CTA computes whole with another item after them. 48 k-tiles: their three
  /// warps then take well under a main loop per tile; at 32 (K = 2048) they fall behind (GeLU
  /// tiles at 77% of cuBLAS's speed, 90% undeferred). With the last wave split, the whole tiles
  /// before the pieces when an epilogue follows them (the last piece of a tile), except where
  /// the helpers would also load the next tile's operand (SIDE), which assumes whole tiles.
  __device__ __forceinline__ bool deferred(int t) const {
    return DEFER && KT >= 48 &&
           (sk ? !SIDE && t < dpTiles && (t + stride < dpTiles || hasLastPiece)
               : t + stride < units);
  }

  /// The M- and N-tile of unit t for this CTA (tm == tilesM: a tile below the matrix, computed
  /// and not stored).
  __device__ __forceinline__ void coords(int t, int& tm, int& tn) const {
    tileCoords(t, unitsM, tilesN, 8 / CL, T::RASTER_N, tm, tn);
    tm = tm * CL + rank;
  }
};

} // namespace fpat
