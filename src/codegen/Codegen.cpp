#include "fpat/codegen/Codegen.h"

#include "fpat/codegen/Family.h"
#include "fpat/codegen/Lowering.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>

namespace fpat::codegen {

std::string TileConfig::str() const {
  return std::to_string(bm) + "x" + std::to_string(bn) + "x" + std::to_string(bk) + "_w" +
         std::to_string(bm / wm) + "x" + std::to_string(bn / wn) + "_s" + std::to_string(stages) +
         (aRows > 0 ? "_a" + std::to_string(aRows) : "") +
         (backend == Backend::MmaSync         ? "_mma"
          : backend == Backend::Wgmma         ? "_wgmma"
          : backend == Backend::WgmmaPingPong ? "_pingpong"
                                              : "") +
         (cluster > 1 ? "_c" + std::to_string(cluster) : "") + (rasterN ? "_rn" : "");
}

std::optional<TileConfig> TileConfig::parse(const std::string& text) {
  TileConfig t;
  int warpsM = 0, warpsN = 0, used = 0;
  if (std::sscanf(text.c_str(), "%dx%dx%d_w%dx%d_s%d%n", &t.bm, &t.bn, &t.bk, &warpsM, &warpsN,
                  &t.stages, &used) != 6)
    return std::nullopt;
  std::string rest = text.substr(static_cast<size_t>(used));
  if (int rows = 0, n = 0; std::sscanf(rest.c_str(), "_a%d%n", &rows, &n) == 1) {
    if (rows <= 0)
      return std::nullopt;
    t.aRows = rows;
    rest.erase(0, static_cast<size_t>(n));
  }
  auto strip = [&](const char* suffix) {
    const size_t n = std::char_traits<char>::length(suffix);
    if (rest.size() <= n || rest.compare(rest.size() - n, n, suffix) != 0)
      return false;
    rest.resize(rest.size() - n);
    return true;
  };
  t.rasterN = strip("_rn");
  if (rest.size() > 3 && rest.compare(rest.size() - 3, 3, "_c2") == 0) {
    t.cluster = 2;
    rest.resize(rest.size() - 3);
  }
  if (rest == "_mma")
    t.backend = Backend::MmaSync;
  else if (rest == "_wgmma")
    t.backend = Backend::Wgmma;
  else if (rest == "_pingpong")
    t.backend = Backend::WgmmaPingPong;
  else if (!rest.empty())
    return std::nullopt;
  if (t.bm <= 0 || t.bn <= 0 || t.bk <= 0 || warpsM <= 0 || warpsN <= 0 || t.stages <= 0 ||
      t.bm % warpsM || t.bn % warpsN)
    return std::nullopt;
  t.wm = t.bm / warpsM;
  t.wn = t.bn / warpsN;
  if (t.wgmma()) { // only what fpat_wgmma.cuh implements
    auto known = wgmmaConfigs();
    bool shapeKnown = std::any_of(known.begin(), known.end(), [&](const TileConfig& k) {
      return k.bm == t.bm && k.bn == t.bn && k.bk == t.bk && k.wm == t.wm && k.wn == t.wn &&
             k.backend == t.backend && k.cluster == t.cluster && k.rasterN == t.rasterN &&
             k.aRows == t.aRows;
    });
    if (!shapeKnown || t.stages < 2)
      return std::nullopt;
  } else if (t.cluster != 1 || t.rasterN || t.aRows != 0) {
    return std::nullopt;
  }
  return t;
}

std::string FlashConfig::str() const {
  return std::to_string(bn) + (overlap ? "o" : "s") + (pingpong ? "p" : "") +
         (resident ? "r" : "") + (dynamic ? "d" : "") + (consumers == 3 ? "t" : "");
}

std::optional<FlashConfig> FlashConfig::parse(const std::string& text) {
  FlashConfig f;
  size_t i = 0;
  while (i < text.size() && i < 4 && text[i] >= '0' && text[i] <= '9')
    ++i;
  if (i == 0 || i == 4)
    return std::nullopt;
  f.bn = std::stoi(text.substr(0, i));
  if (f.bn != 64 && f.bn != 128 && f.bn != 176 && f.bn != 192)
    return std::nullopt;
  f.overlap = f.pingpong = f.resident = f.dynamic = false;
  bool seen[128] = {};
  for (; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 128 || seen[c] ||
        std::string_view("osprdt").find(static_cast<char>(c)) == std::string_view::npos)
      return std::nullopt;
    seen[c] = true;
  }
  if (seen['o'] && seen['s'])
    return std::nullopt;
  if (seen['d'] && !seen['r']) // the counter hands out tiles to resident CTAs
    return std::nullopt;
  if (seen['t'] && f.bn > 128) // three consumers have registers for blocks of 128 keys
    return std::nullopt;
  f.overlap = !seen['s'];
  f.pingpong = seen['p'];
  f.resident = seen['r'];
  f.dynamic = seen['d'];
  f.consumers = seen['t'] ? 3 : 2;
  return f;
}

int gemmSmemBytes(const TileConfig& t, bool transB) {
  if (t.wgmma()) // the ring of A and B stages, 1 KB for aligning it to the swizzle atom
    return t.stages * (t.stageRowsA() + t.bn) * t.bk * 2 + 1024;
  const int pad = 8;
  int a = t.bm * (t.bk + pad);
  int b = transB ? t.bn * (t.bk + pad) : t.bk * (t.bn + pad);
  int pipe = t.stages * (a + b) * 2;
  int epi = (t.bm / t.wm) * (t.bn / t.wn) * 16 * 20 * 4;
  return std::max(pipe, epi);
}

bool wgmmaEpilogueTile(const TileConfig& t, int64_t n) {
  // Static shared memory of such a kernel: its barriers only (1 KB with alignment).
  return t.wgmma() && t.backend == Backend::Wgmma && n % 8 == 0 &&
         gemmSmemBytes(t, false) + t.bm * t.bn * 2 + 1024 <= FPAT_SM90_SMEM_BYTES;
}

bool wgmmaSideBox(const TileConfig& t, int64_t n) {
  return wgmmaEpilogueTile(t, n) &&
         gemmSmemBytes(t, false) + t.bm * t.bn * 2 + t.bm * 128 + 1024 <= FPAT_SM90_SMEM_BYTES;
}

bool tmaCompatible(int64_t m, int64_t n, int64_t k, bool transB) {
  const int64_t limit = int64_t{1} << 31;
  return m >= 1 && n >= 1 && k >= 1 && m < limit && n < limit && k < limit &&
         (transB || n % 8 == 0);
}

namespace {
// Static shared memory of a wgmma kernel: its barriers (1 KB with alignment) and the epilogue's
// store slabs, 16 x 72 halves per consumer warp, for two consumer warpgroups
// (fpat_wgmma.cuh; without room for them it stores straight from registers, measured up to
// 12% slower on the H200: bench/RESULTS.md, session 5).
constexpr int kWgmmaStaticSmem = 1024 + 8 * 16 * 72 * 2;
} // namespace

std::vector<TileConfig> wgmmaConfigs() {
  std::vector<TileConfig> out;
  auto add = [&](int bm, int bn, Backend b, int cluster, bool rasterN = false, int aRows = 0) {
    const int stage = ((aRows > 0 ? aRows : bm) + bn) * 64 * 2;
    // As deep as shared memory allows (only 64x64 goes past 8 stages): at decode shapes its
    // loads of B are bound by their latency, and 12 stages measured 4-16% faster than 8 at
    // 1-16 x 1024-8192 x 4096, within 2% at 64x8192x4096 (bench/RESULTS.md, session 24).
    const int deepest = (FPAT_SM90_SMEM_BYTES - 1024 - kWgmmaStaticSmem) / stage;
    // Cooperative consumers own 64 rows each, or 128 (two m64 MMAs) of a 256-row tile.
    const int wm = b == Backend::WgmmaPingPong ? bm : bm == 256 ? 128 : 64;
    for (int stages = deepest; stages >= std::max(2, deepest - 1); --stages)
      out.push_back(TileConfig{bm, bn, 64, wm, bn, stages, b, cluster, rasterN, aRows});
  };
  for (int bm : {128, 64})
    for (int bn : {256, 128, 64})
      add(bm, bn, Backend::Wgmma, 1);
  // 192 wide: a tile count closer to whole waves where 128 and 256 are far from it (cuBLAS ran
  // 128x192 at 1500x4104x1000 and 256x160 at 2047x5120x1024: bench/RESULTS.md, session 14).
  add(128, 192, Backend::Wgmma, 1);
  // cuBLAS's shape on the H200 (per MMA 20% fewer shared-memory reads than 128x256, but
  // measured slower here: kept for the tuner).
  add(256, 128, Backend::Wgmma, 1);
  for (auto [bm, bn] : {std::pair{128, 128}, {64, 256}, {128, 64}, {64, 128}})
    add(bm, bn, Backend::WgmmaPingPong, 1);
  // Clusters of two split B in halves of at least 64 columns.
  for (auto [bm, bn] : {std::pair{128, 256}, {128, 128}})
    add(bm, bn, Backend::Wgmma, 2);
  for (auto [bm, bn] : {std::pair{128, 128}, {64, 256}})
    add(bm, bn, Backend::WgmmaPingPong, 2);
  // The raster along N, for the tiles the heuristic uses most.
  for (auto [bm, bn] : {std::pair{128, 256}, {128, 128}})
    add(bm, bn, Backend::Wgmma, 1, true);
  // Decode (at most 16 or 32 rows): A boxes of only those rows, so that the ring holds more
  // stages of B, whose loads are bound by their latency there (bench/RESULTS.md, sessions 24
  // and 25).
  for (int bn : {64, 128, 256})
    for (int rows : {16, 32})
      add(64, bn, Backend::Wgmma, 1, false, rows);
  return out;
}

LastWaveSplit lastWaveSplit(int64_t units, int sms, int64_t kTiles) {
  // The plan fpat_wgmma.cuh runs (the Executor passes it for the launch's grid): the remainder
  // of the last wave, or it and the full wave before, in 2-4 pieces per tile, at most one
  // partial-sum slot per CTA; the least rounds / pieces plus the partial sums' cost per extra
  // piece, where that saves a tenth of a tile. Measured on the H200 (bench/RESULTS.md, session
  // 13), a 128x256 tile takes about 2.95 + 0.647 KT us and each extra piece about 7.5 + 0.05 KT
  // us more (writing, waiting for and adding 128 KB of f32 partial sums): costs are counted in
  // 1 / (12 (59 + 13 KT)) of a tile, the piece's as 12 (150 + KT). A split then pays from about
  // K = 2048 on (2047x5120: 10% faster at K = 5120, 5-28% slower at K = 1024 down to 256).
  // A grid of fewer tiles than SMs is one partial wave: its tiles may be cut the same way, the
  // grid then launched on every SM (decode shapes: 64 tiles at 77x4096x11008).
  LastWaveSplit best;
  const int64_t g = sms;
  if (g <= 0 || units <= 0 || units % g == 0)
    return best;
  const int64_t den = 59 + 13 * kTiles, piece = 150 + kTiles;
  int64_t cost = 108 * den / 10; // 0.9 of a tile
  for (int extra = 0; extra <= 1; ++extra)
    for (int pieces = 2; pieces <= 4 && pieces <= kTiles; ++pieces) {
      const int64_t tiles = units % g + extra * g, rounds = (tiles * pieces + g - 1) / g;
      if (tiles > units || tiles * (pieces - 1) > g)
        continue;
      const int64_t c = 12 / pieces * rounds * den + 12 * (pieces - 1) * piece - 12 * extra * den;
      if (c < cost) {
        cost = c;
        best = {tiles, pieces, static_cast<double>(c + 12 * extra * den) / (12.0 * den)};
      }
    }
  return best;
}

GemmProblem gemmProblem(int64_t m, int64_t n, int64_t k, bool transB) {
  GemmProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.tma = tmaCompatible(m, n, k, transB);
  p.vec = vectorLoads(m, n, k, transB);
  p.bRows128 = transB || n % 64 == 0;
  return p;
}

namespace {

/// The wgmma heuristic's measured constants, in one table: speeds relative to the cooperative
/// 128x256 tile on a full H200, and factors, each with the measurement it comes from
/// (bench/RESULTS.md and docs/perf-log/HISTORY.md, by session). wgmmaScore combines them.
struct WgmmaMeasurements {
  // Cooperative tiles by shape. 256x128 measured 2-5% slower than 128x256 with four stages
  // (no epilogue tile), 8-9% with three (session 11). 64x64 at decode shapes (M <= 77): 1.56x
  // as long as 64x128 at 77x4096x11008 and 1.24x at 1x11008x4096, 0.9-0.95x at 1-128 x 4096 x
  // 4096; 128x64 1.06-1.4x as long as 64x128 at the same shapes (session 17).
  double rows256 = 0.95;
  double tile128x256 = 1.0, tile128x192 = 0.96, tile128x128 = 0.9, tile128x64 = 0.7;
  double tile64x256 = 0.85, tile64x128 = 0.75, tile64x64 = 0.52;
  // Short A boxes (decode: M <= aRows) hold more stages of B, whose loads are bound by their
  // latency there: 64x64 with 16 or 32 rows ran 1.05-1.5x as fast as with 64 rows, 64x128 and
  // 64x256 1.0-1.1x (1-32 x 2048-128256 x 4096-14336, session 25). The shorter box first: its
  // ring is deeper (minus `aRowsPer16` per 16 rows).
  double shortBox64 = 1.2, shortBox = 1.05, aRowsPer16 = 0.01;
  // Ping-pong relative to 128x256 at 4096^3 with the staged stores: 0.91-0.96, and with
  // epilogue inputs too (the tuner chose 128x256 for bias and residual at 1024-4096 rows,
  // session 5; before the staged stores ping-pong won those by hiding slow stores). It needs
  // two tiles per CTA (else `pingPongFew`); tiles under 128x128 `pingPongSmall`, 64 rows
  // `pingPong64Rows`.
  double pingPong = 0.92, pingPongReads = 0.95, pingPongFew = 0.5;
  double pingPongSmall = 0.85, pingPong64Rows = 0.97;
  // One consumer's epilogue hides behind the other's main loop only where that is long: at
  // K = 512-1024 ping-pong measured 10% slower than the cooperative tiles for plain GEMMs and
  // 1.7-2.4x slower with a residual (session 13), still 1.2-1.25x slower once its edge tiles
  // stopped serializing their loads (session 14): ranked last below K = `pingPongMinK`.
  int64_t pingPongMinK = 2048;
  double pingPongShortK = 0.85, pingPongShortKReads = 0.5;
  // A ring one stage short of the deepest, stores not through the epilogue tile.
  double shallowRing = 0.98;
  // An epilogue reading inputs wants L1, which shares the SM's 256 KB with shared memory: its
  // bias/residual loads measured 10-18% slower with a 226 KB ring than with 194 KB
  // (gemm_bias_residual), and the tuner chose 145 KB over 193 KB at 4 of 5 shapes once the
  // stores were staged (session 5). Not for 256-row tiles from K = 2048 on: 256x128 with four
  // stages (211 KB) measured 1-8% faster than three and the epilogue tile with a residual or
  // bias + GELU at 1000-4096 x 4100-4104 x 4096, but 22-29% slower at 1500x4104x1000
  // (session 16).
  int lowL1Bytes = 160 * 1024;
  double lowL1 = 0.9;
  // Stores through the epilogue tile (TMA) measured 1.8-2.6% faster than the deepest ring
  // with slab stores for plain GEMMs at 4096 rows, 0.7% slower at 1024 (session 8); 256x128
  // through it (three stages) 5% slower than with four (`tileStore256`).
  double tileStore = 1.02, tileStore256 = 0.93;
  // Clusters of two measured 1-2% slower than single CTAs of the same tile on the H200 (the
  // multicast saves L2 traffic that did not limit these tiles; session 7): the tuner may still
  // find them faster elsewhere.
  double cluster = 0.97;
  // The raster along N: not measured better in general; ranked just below the one along M.
  double rasterN = 0.995;
  // B [K, N] rows not 128-byte aligned (N = 4104): its TMA loads are slow (128x192 at
  // 1536x4104x4096 0.094 ms against 0.072 at 1536x4224), so tiles that load each B tile once
  // per 128 rows of M lose where there are several waves of them; 256-row tiles and clusters
  // (B multicast to two M-tiles) load it half as often (4096x4104x4096: 256x128 0.197 ms,
  // 128x128 in clusters 0.213, 128x192 0.247; session 14). Not at K < 2048, where the 256-row
  // tiles' split credit overrates them (1500x4104x1000: 256x128 0.043 ms, 128x192 0.035).
  double unalignedB = 0.8;
  // The last wave's split is ranked with the op's K from this K on (and for grids under one
  // wave), as if free below it: ranked with the op's K, short-K problems got tiles that
  // measured 10-40% slower (1111x2056x1000: 64x64 over 128x128; session 13); ranked as free
  // from 2048 on, 128x192 (5.3 waves, its last split) came before 256x128 (4.0 waves) at
  // 4096x4104x4096 and measured 3% slower (session 16).
  int64_t splitRankedK = 2048;
};
constexpr WgmmaMeasurements kWgmma{};

} // namespace

double wgmmaScore(const TileConfig& t, const GemmProblem& p, int sms) {
  const WgmmaMeasurements& w = kWgmma;
  const int64_t m = p.m, n = p.n;
  if (!t.runsRows(m))
    return 0;
  const bool epilogueReads = p.epilogueReads;
  const bool pp = t.backend == Backend::WgmmaPingPong;
  // A cluster of two computes two M-tiles, the second one below the matrix where their number
  // is odd.
  const int64_t tilesM = (m + t.bm - 1) / t.bm;
  const double tiles = static_cast<double>((tilesM + t.cluster - 1) / t.cluster * t.cluster) *
                       static_cast<double>((n + t.bn - 1) / t.bn);
  // Cooperative tiles without clusters split the last wave's tiles in k where that saves a
  // tenth of a tile or more (the code generator splits only where K pays).
  double waves = std::ceil(tiles / (sms / t.cluster * t.cluster));
  if (!pp && t.cluster == 1) {
    const int64_t whole = static_cast<int64_t>(tiles);
    const int64_t kTiles =
        p.k >= w.splitRankedK || whole < sms ? (p.k + t.bk - 1) / t.bk : int64_t{1} << 20;
    const LastWaveSplit s = lastWaveSplit(whole, sms, kTiles);
    if (s.tiles > 0)
      waves = static_cast<double>((whole - s.tiles) / sms) + s.waves;
  }
  const double useful = static_cast<double>(m) * static_cast<double>(n) / (tiles * t.bm * t.bn);
  double speed = t.bm == 256   ? w.rows256
                 : t.bm == 128 ? (t.bn == 256   ? w.tile128x256
                                  : t.bn == 192 ? w.tile128x192
                                  : t.bn == 128 ? w.tile128x128
                                                : w.tile128x64)
                               : (t.bn == 256   ? w.tile64x256
                                  : t.bn == 128 ? w.tile64x128
                                                : w.tile64x64);
  if (t.aRows > 0)
    speed *= (t.bn == 64 ? w.shortBox64 : w.shortBox) - w.aRowsPer16 * t.aRows / 16;
  if (pp) {
    const double big = t.bm * t.bn >= 128 * 128 ? 1.0 : w.pingPongSmall;
    speed = (tiles >= 2.0 * sms ? (epilogueReads ? w.pingPongReads : w.pingPong) : w.pingPongFew) *
            big * (t.bm == 64 ? w.pingPong64Rows : 1.0);
    if (p.k > 0 && p.k < w.pingPongMinK)
      speed *= epilogueReads ? w.pingPongShortKReads : w.pingPongShortK;
  }
  // The deepest ring of a shape first (shared memory or 8 stages), except where lowL1.
  const int stage = (t.stageRowsA() + t.bn) * t.bk * 2;
  const bool deepest =
      (t.stages + 1) * stage + 1024 + kWgmmaStaticSmem > FPAT_SM90_SMEM_BYTES || t.stages >= 8;
  const bool lowL1 =
      epilogueReads && (t.bm < 256 || p.k < 2048) && gemmSmemBytes(t, false) > w.lowL1Bytes;
  const bool tileStore = wgmmaEpilogueTile(t, n);
  const double clustered = t.cluster > 1 ? w.cluster : 1.0;
  const double raster = t.rasterN ? w.rasterN : 1.0;
  if (t.bm == 256 && tileStore)
    speed *= w.tileStore256;
  if (!p.bRows128 && p.k >= 2048 && t.bm < 256 && t.cluster == 1 && tiles >= 2.0 * sms)
    speed *= w.unalignedB;
  return tiles / (waves * sms) * useful * speed * (deepest || tileStore ? 1.0 : w.shallowRing) *
         (tileStore ? w.tileStore : 1.0) * (lowL1 ? w.lowL1 : 1.0) * clustered * raster;
}

namespace {

/// Hopper default: the wgmma configuration with the best wgmmaScore.
TileConfig hopperTile(const GemmProblem& p, int numSms) {
  TileConfig best;
  double bestScore = -1;
  for (const TileConfig& t : wgmmaConfigs()) {
    const double score = wgmmaScore(t, p, numSms);
    if (score > bestScore + 1e-9) {
      best = t;
      bestScore = score;
    }
  }
  return best;
}

} // namespace

TileConfig defaultTile(const GemmProblem& p, int arch, int numSms) {
  const int64_t m = p.m, n = p.n;
  const bool norm = p.norm;
  if (arch == 90 && !norm && p.tma)
    return hopperTile(p, numSms);
  auto tiles = [&](int bm, int bn) { return ((m + bm - 1) / bm) * ((n + bn - 1) / bn); };
  if (arch < 80) { // no cp.async: the register path, two stages
    if (tiles(128, 128) >= numSms)
      return TileConfig{128, 128, 32, 64, 32, 2};
    return TileConfig{64, 64, 32, 32, 32, 2};
  }
  // sm_80+: the software-pipelined cp.async loop with 64x64 warp tiles and 64-deep k-tiles,
  // the fastest family measured on the H200 (bench/RESULTS.md), where the device's opt-in
  // shared memory holds three stages of it (sm_80/sm_90: yes; sm_86/sm_89, 99 KB: no).
  const int smemOptin = arch == 80 || arch == 87 ? 166912
                        : arch >= 90             ? FPAT_SM90_SMEM_BYTES
                                                 : 101376;
  auto fits = [&](const TileConfig& t) {
    return std::max(gemmSmemBytes(t, false), gemmSmemBytes(t, true)) <= smemOptin;
  };
  auto fills = [&](int bm, int bn) { return tiles(bm, bn) * 10 >= numSms * 9; }; // one wave, 90%
  const TileConfig wide{128, 256, 64, 64, 64, 3}, tall{256, 128, 64, 64, 64, 3};
  if (!p.vec) {
    // Bounds-checked element loads (K, or N of B [K, N], not a multiple of 8): with 64x64 warp
    // tiles every pattern spilled 430-720 bytes on sm_90 (rejected by the tuner); 64x32 warp
    // tiles spill nothing, norm_gemm's included (bench/RESULTS.md, session 13).
    const TileConfig narrow{128, 128, 64, 64, 32, 3};
    if (fits(narrow) && fills(128, 128))
      return narrow;
    return TileConfig{64, 64, 32, 32, 32, 3};
  }
  if (norm) {
    // The in-place normalisation wants many threads per tile: the wide tile (8 warps; it
    // spills 108 bytes there, which measured harmless) or 64x32 warp tiles; the 4-warp and
    // tall 64x64 tiles measured 30-180% slower (bench/RESULTS.md, 8ef7d43).
    if (n >= m && fits(wide) && fills(wide.bm, wide.bn))
      return wide;
    if (fills(128, 128))
      return TileConfig{128, 128, 64, 64, 32, 3};
    return TileConfig{64, 64, 32, 32, 32, 3};
  }
  const TileConfig& big = n >= m ? wide : tall;
  if (fits(big) && fills(big.bm, big.bn))
    return big;
  const TileConfig mid{128, 128, 64, 64, 64, 3};
  if (fits(mid) && fills(128, 128))
    return mid;
  if (tiles(128, 128) >= numSms)
    return TileConfig{128, 128, 32, 64, 64, 3};
  // Fewer tiles than SMs: 64x64 tiles give four times as many CTAs.
  return TileConfig{64, 64, 32, 32, 32, 3};
}

KernelUnit generate(const ir::Graph& g, ir::Vertex v, dsl::Activations defs,
                    const CodegenOptions& o) {
  using namespace detail;
  const ir::Op& op = g.op(v);
  if (op.kind == ir::OpKind::Input || op.kind == ir::OpKind::Constant || ir::isView(op.kind) ||
      ir::isColumnView(g, v))
    return {}; // uploaded, not computed, or a view of its operand's buffer (no kernel)
  requireHalfPrecision(g, v, o.arch);
  KernelUnit u;
  if (const FamilyGenerator* family = generatorOf(op))
    u = family->generate(g, v, defs, o);
  else if (op.kind == ir::OpKind::Fused)
    throw CodegenError(ref(g, v) + ": no kernel family '" + op.fused.family +
                       "' implements pattern " + op.fused.pattern);
  else if (op.kind == ir::OpKind::LayerNorm || op.kind == ir::OpKind::RmsNorm ||
           op.kind == ir::OpKind::ReduceMean || op.kind == ir::OpKind::Softmax)
    u = generateRowwise(g, v, o);
  else if (op.kind == ir::OpKind::Slice || op.kind == ir::OpKind::AttnQk ||
           op.kind == ir::OpKind::AttnPv || op.kind == ir::OpKind::Attention ||
           op.kind == ir::OpKind::Concat || op.kind == ir::OpKind::Rope ||
           op.kind == ir::OpKind::BatchFirst || op.kind == ir::OpKind::SeqFirst ||
           op.kind == ir::OpKind::KvAppend)
    u = generateAttentionOp(g, v, o);
  else
    u = generateElementwise(g, v, defs, o);
  if (op.type.dtype == ir::DType::BF16 && !u.source.empty()) {
    // The kernel headers' element type (fpat_common.cuh), set before they are included.
    const size_t at = u.source.find("\n#include");
    u.source.insert(at == std::string::npos ? 0 : at + 1,
                    "#define FPAT_BF16 1 // tensors are bf16 (fpat_common.cuh)\n");
  }
  return u;
}

} // namespace fpat::codegen
