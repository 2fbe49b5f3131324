// Code generation: one small CUDA translation unit per op of a fused graph, instantiating a
// kernel-family template (kernels/*.cuh) with an epilogue lowered from the .fpat bodies.
#pragma once

#include "fpat/codegen/kernels/fpat_abi.h"
#include "fpat/dsl/Library.h"
#include "fpat/ir/Graph.h"

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace fpat::codegen {

class CodegenError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// The instruction family of a GEMM kernel's inner product.
enum class Backend {
  Wmma,          // WMMA fragments (sm_75+)
  MmaSync,       // mma.sync m16n8k16 + ldmatrix (sm_80+)
  Wgmma,         // TMA + wgmma, warp-specialized, persistent (sm_90a: compute capability 9.0 only),
                 // cooperative: BM / 64 consumer warpgroups share each tile
  WgmmaPingPong, // the same, with two consumer warpgroups taking alternate whole tiles
};

/// GEMM tile configuration: CTA tile BM x BN x BK, warp tile WM x WN, pipeline depth.
/// For the wgmma backends a "warp tile" is a consumer warpgroup's: WM = 64 rows (cooperative)
/// or BM (ping-pong), WN = BN; one producer warpgroup comes on top.
struct TileConfig {
  int bm = 128, bn = 128, bk = 32, wm = 64, wn = 32, stages = 3;
  Backend backend = Backend::Wmma;
  /// CTAs per cluster (wgmma backends): 2 pairs CTAs on M-tiles that share a B tile, which
  /// each loads half of and multicasts to both.
  int cluster = 1;
  /// wgmma backends: the persistent schedule walks groups of tiles along N instead of M.
  bool rasterN = false;
  /// wgmma 64-row cooperative tiles: each stage holds an A box of only this many rows (0: bm),
  /// leaving room for more stages of B; such a configuration runs problems of at most aRows
  /// rows (decode), see runsRows.
  int aRows = 0;
  /// The rows of A one stage holds.
  int stageRowsA() const { return aRows > 0 ? aRows : bm; }
  /// Whether the configuration can compute an M-row problem (a short A box holds them all).
  bool runsRows(int64_t m) const { return aRows == 0 || m <= aRows; }
  bool wgmma() const { return backend == Backend::Wgmma || backend == Backend::WgmmaPingPong; }
  int threads() const {
    return backend == Backend::WgmmaPingPong ? 384
           : wgmma()                         ? 128 * (bm / wm + 1)
                                             : 32 * (bm / wm) * (bn / wn);
  }
  /// `128x128x32_w2x4_s3` (warps along M x N), `_mma` for the mma.sync backend;
  /// `128x256x64_w2x1_s4_wgmma` (consumer warpgroups along M x N) for the wgmma backend,
  /// `128x128x64_w1x1_s6_pingpong` for its ping-pong schedule; `_c2` after either for
  /// clusters of two, then `_rn` for the raster along N; `64x64x64_w1x1_s20_a16_wgmma` for an
  /// A box of 16 rows.
  std::string str() const;
  /// The inverse of str(); nullopt for text that is not a configuration name.
  static std::optional<TileConfig> parse(const std::string& text);
  bool operator==(const TileConfig&) const = default;
};

/// A configuration of the sm_90 flash-attention kernel (fpat::FlashTile in fpat_flash.cuh):
/// key blocks of `bn` (64, 128, 176 or 192), `consumers` warpgroups of 64 query rows (three
/// only at head dimension 64 with blocks of at most 128 keys), the softmax overlapped with
/// P V or not, the consumers taking turns or not, one CTA a tile or one resident CTA per SM
/// walking the tiles in a fixed stride or (`dynamic`) from a counter.
struct FlashConfig {
  int bn = 128, consumers = 2;
  bool overlap = true, pingpong = true, resident = true, dynamic = false;
  /// `128oprd`, `128oprdt`: FPAT_FLASH's letters (`o` or `s` for the overlap, `t` for three
  /// consumers), the kernel name's suffix.
  std::string str() const;
  /// The inverse of str(); the letters in any order, `o` optional. nullopt for text that is
  /// not a configuration the kernel implements.
  static std::optional<FlashConfig> parse(const std::string& text);
  bool operator==(const FlashConfig&) const = default;
};

/// Dynamic shared memory of a GEMM configuration; mirrors fpat::gemmSmemBytes in fpat_gemm.cuh
/// and fpat::wgmmaSmemBytes in fpat_wgmma.cuh.
int gemmSmemBytes(const TileConfig& t, bool transB);

/// Whether a wgmma configuration runs its epilogue through a BM x BN shared-memory tile that
/// TMA stores (Epilogue::kTile in fpat_wgmma.cuh): cooperative tiles whose stages leave room
/// for it in 227 KB, and N % 8 == 0 (TMA's 16-byte row strides). Its dynamic shared memory is
/// gemmSmemBytes + BM * BN * 2.
bool wgmmaEpilogueTile(const TileConfig& t, int64_t n);

/// Whether such a tile also leaves room for the side buffer of a deferred epilogue's [M, N]
/// operand, one BM x 64 box (fpat_wgmma.cuh, kSide): BM * 128 more bytes.
bool wgmmaSideBox(const TileConfig& t, int64_t n);

/// Whether the wgmma backend can run an M x N x K GEMM: TMA needs row strides that are
/// multiples of 16 bytes and 32-bit coordinates. B [K, N] needs N % 8 == 0; where K % 8 != 0,
/// A (and B [N, K]) are first copied into rows of paddedK(K) elements (wgmmaPadsK).
bool tmaCompatible(int64_t m, int64_t n, int64_t k, bool transB);

/// K rounded up to a multiple of 8: the row length of the padded copies of A and B [N, K].
inline int64_t paddedK(int64_t k) {
  return (k + 7) / 8 * 8;
}

/// Whether a wgmma kernel for inner dimension K reads padded copies of A (and B [N, K]).
inline bool wgmmaPadsK(int64_t k) {
  return k % 8 != 0;
}

/// Whether the wgmma kernel for GEMM-family op `v` reads its B from a prepared copy: B is a
/// weight (a graph input that stays the same between runs) that TMA reads slowly or not at all
/// as given, so it is copied once, when its value is uploaded, into [N, paddedK(K)] rows
/// (K-major, as nn.Linear stores it): B [K, N] with N % 64 != 0 (rows off 128 bytes load 1.3x
/// slower, and N % 8 != 0 cannot be read at all; bench/RESULTS.md, session 14), and B [N, K]
/// with K % 8 != 0 (padded once instead of on every run).
bool preparesWeightB(const ir::Graph& g, ir::Vertex v);

/// Where a deferred norm's row statistics come from (fpat_wgmma.cuh). Launch and Grid write
/// them to two f32 [M] buffers (FpatKernelArgs::rowStats).
enum class NormStats {
  None,   // no deferred norm
  Launch, // a launch of their own before the GEMM, which the GEMM overlaps
  Loop,   // summed from the A tiles of the main loop (FPAT_NORM_STATS=loop)
  Grid,   // read by the GEMM's own statistics warps, each row once in the grid (counters in
          // scratchBytes)
};

/// The form FPAT_NORM_STATS asks for (launch, loop or grid); nullopt when it is unset or names
/// none of them (the driver rejects such a value before any code is generated).
std::optional<NormStats> normStatsFromEnv();

/// The form the generator will pick for deferred-norm op `v` (None if its norm is not
/// deferred), for the cost model, which knows no tile: Grid unless FPAT_NORM_STATS asks for
/// launch or loop, or the epilogue holds an activation, which the statistics warps would apply
/// instead (the generator then picks Launch, even if grid is asked for, for the tiles that
/// stage the epilogue, which are the heuristic's at every shape that matters).
NormStats expectedNormStats(const ir::Graph& g, ir::Vertex v);

/// Whether the wgmma kernel for norm_gemm op `v` defers its normalisation: it runs on the raw
/// rows of x with gamma folded into B (x (diag(gamma) W)), scales each row by rstd in its
/// epilogue and, for LayerNorm, subtracts mean rstd colsum(diag(gamma) W) and adds beta W;
/// a statistics launch computes mean and rstd first. Needs W, gamma (and beta) to be weights:
/// their folded forms are computed once, when they are uploaded.
bool defersNorm(const ir::Graph& g, ir::Vertex v);

/// The wgmma configurations the kernel template implements (cooperative and ping-pong tiles,
/// the two deepest rings that fit in 227 KB; 64-row tiles also with short A boxes).
std::vector<TileConfig> wgmmaConfigs();

/// Whether the cp.async GEMM kernels can use 16-byte loads of A and B (K, and N for B [K, N],
/// multiples of 8).
inline bool vectorLoads(int64_t m, int64_t n, int64_t k, bool transB) {
  (void)m;
  return k % 8 == 0 && (transB || n % 8 == 0);
}

/// The last wave split in k of fpat_wgmma.cuh's cooperative schedule without clusters (the
/// Executor passes it to the kernel, FpatTmaArgs::splitTiles): the last `tiles` of `units` tiles,
/// each cut into `pieces` ranges of k-tiles, on a grid of `sms` CTAs; tiles == 0 where the tiles
/// stay whole. `kTiles`: k-tiles per tile. `waves`: the split tiles' time in whole-tile times, the
/// partial sums' cost included (the tiles' own wave count where nothing is split).
struct LastWaveSplit {
  int64_t tiles = 0;
  int pieces = 1;
  double waves = 0;
};
LastWaveSplit lastWaveSplit(int64_t units, int sms, int64_t kTiles);

/// What the tile heuristics know of a GEMM-family problem.
struct GemmProblem {
  int64_t m = 0, n = 0;
  int64_t k = 0;              ///< 0: not known
  bool norm = false;          ///< norm_gemm: its in-place normalisation needs ~50 more registers
  bool tma = true;            ///< the wgmma backend can run it (tmaCompatible, not norm_gemm)
  bool epilogueReads = false; ///< the epilogue loads other tensors (bias, residual)
  bool vec = true;            ///< the cp.async kernels' 16-byte loads (vectorLoads)
  /// B [K, N] rows start at multiples of 128 bytes (N % 64 == 0), or B is [N, K]. TMA loads of
  /// B [K, N] at another pitch measured 1.3x as long (wgmmaScore).
  bool bRows128 = true;
};

/// An M x N x K problem (B as [N, K] with `transB`) with `tma` and `vec` from its alignment.
GemmProblem gemmProblem(int64_t m, int64_t n, int64_t k, bool transB);
/// The problem of GEMM-family op `v` (a kernel family's op: ir::familyOf), as the code generator
/// and the tuner both see it.
GemmProblem gemmProblemOf(const ir::Graph& g, ir::Vertex v);

/// How well a wgmma configuration should do on a problem with `sms` SMs (higher is better): the
/// share of SM time spent on useful tiles, times each schedule's and tile shape's speed on a
/// full GPU as measured on the H200 (bench/RESULTS.md). An epilogue that reads inputs is
/// hidden behind MMAs by ping-pong.
double wgmmaScore(const TileConfig& t, const GemmProblem& p, int sms);

/// The heuristic default when nothing better is known (no tuning, no GPU): large tiles for
/// large problems, smaller ones when the large tiles would leave most SMs idle. On sm_90 the
/// best wgmma configuration by wgmmaScore unless norm_gemm or !tma. Without 16-byte loads
/// (!vec) the cp.async kernels' bounds-checked loads need more registers: 64x64 warp tiles
/// spill there.
TileConfig defaultTile(const GemmProblem& p, int arch, int numSms = 132);

/// A TMA tensor map the runtime encodes for a launch: operand `operand` of the op seen as
/// `outer` rows of `inner` f16 elements (dense rows), read in boxes of boxInner x boxOuter,
/// 128-byte swizzle. The kernel template reads the boxes with the same shape.
struct TmaMap {
  static constexpr int kOutput = -1; // the op's output instead of an operand
  static constexpr int kUnused = -2; // a map the kernel does not read (left zero)
  int operand = 0;
  int64_t inner = 0, outer = 0;
  int boxInner = 64, boxOuter = 64;
  /// >= 0: the map reads the operand's padded copy, FpatKernelArgs::padded[copy], rows of
  /// paddedK(inner) elements (the Launch::PaddedRows launch wrote it); -1: the operand itself.
  int copy = -1;
  /// Elements from one row to the next where the operand is read in place (ir::rowPitch: a
  /// column view's operand is wider than the view); 0: `inner`.
  int64_t pitch = 0;
};

/// How a kernel entry is launched; the runtime derives the grid from the op's shapes.
struct Launch {
  // Persistent: min(GEMM tiles, SMs) CTAs, each walking tiles (the wgmma backend; one per SM
  // where the kernel may split tiles in k and gets its workspace, splitLastWave); in whole
  // clusters, no more than can be resident at once. PaddedRows: a block-stride loop over the
  // rows of A (and of B [N, K]) copied into padded rows (wgmmaPadsK). PreparedWeight: a
  // block-stride loop over 64 x 64 tiles of a weight B copied into [N, paddedK(K)] rows
  // (preparesWeightB); the runtime runs it when the weight is uploaded, not on every run.
  // PreparedColumns: a warp per column of the weight (the deferred LayerNorm's column terms),
  // also run when the weight is uploaded. Fixed: the grid in `blocks` (flash attention: query
  // tiles, heads, batch).
  enum Grid {
    GemmTiles,
    Rows,
    Elements,
    Persistent,
    PaddedRows,
    PreparedWeight,
    PreparedColumns,
    Fixed
  } grid = GemmTiles;
  std::string entry; // extern "C" name
  int threads = 256;
  int smemBytes = 0;
  // Non-empty: the kernel takes FpatTmaArgs with these maps, in its order (a, b, c, d).
  std::vector<TmaMap> tma;
  // The kernel may start before the launch ahead of it has finished (programmatic dependent
  // launch): it waits for that launch's results where it reads them (fpat::waitPriorGrid).
  bool overlapsPrevious = false;
  int64_t blocks[3] = {1, 1, 1}; // Fixed: the grid
  /// Whether the runtime runs it when weights are uploaded rather than on every run.
  bool preparesWeights() const { return grid == PreparedWeight || grid == PreparedColumns; }
};

/// One generated translation unit and how to run it for one op.
struct KernelUnit {
  std::string name;   // unique per source; also the .cu stem
  std::string source; // the .cu text
  std::string family; // gemm, norm_gemm, elementwise, rowwise
  std::string what;   // one line for logs: "%y = gemm_bias_residual [patterns/gemm.fpat:22]"
  std::vector<Launch> launches;
  TileConfig tile;  // gemm families
  bool vec = false; // gemm: aligned 16-byte path
  bool transB = false;
  // wgmma: B (a weight) is read from FpatKernelArgs::padded[1], [N, paddedK(K)] rows that the
  // PreparedWeight launch writes when the weight is uploaded (preparesWeightB).
  bool preparedB = false;
  bool sm90a = false;         // uses sm_90a-only instructions: compiled for compute_90a / sm_90a
  bool epilogueReads = false; // gemm families: the epilogue loads bias, residual or scale inputs
  // Argument block values (pointers are bound by the runtime; in[i] = operand i of the op).
  int64_t M = 0, N = 0, K = 0;
  float eps = 0;
  std::vector<float> params;
  bool needsRowStats = false; // norm_gemm: two f32 [M] scratch buffers
  // wgmma norm_gemm: the norm deferred to the epilogue (codegen::defersNorm), its statistics
  // from normStats; the prepared B carries LayerNorm's column terms behind it (preparedBBytes).
  ir::NormKind deferredNorm = ir::NormKind::None;
  NormStats normStats = NormStats::None;
  // The dual families: the GEMM runs on a prepared copy of Bg and Bu interleaved in 8-column
  // blocks, dualColumns(N) columns, and its epilogue combines each gate block with its up
  // block into the N columns of the result.
  bool dual = false;
  int64_t gemmColumns() const;
  // wgmma cooperative: compiled with the last wave split in k (lastWaveSplit planned one for
  // CodegenOptions::sms); the Executor passes such kernels a partial-sum workspace.
  bool splitLastWave = false;
  // A private workspace of this many bytes, zeroed once, in FpatKernelArgs::scratch[0] (flash
  // decode's partial results, merged by its second launch; the flash kernel's tile counter).
  size_t scratchBytes = 0;
  // Values the kernel reads beyond its op's operands, bound to FpatKernelArgs::in[] after them
  // (the buffer plan keeps them live until this op): the flash decode kernel that writes
  // kv_append's caches itself reads their past rows and new tokens.
  std::vector<ir::Vertex> extraIns;
  // Operands the kernel writes (the decode kernel: its k and v, kv_append's results or column
  // views of them, whose own units launch nothing): the runtime poisons their buffers before
  // the launch, as it does `out`.
  std::vector<int> writesOperands;
};

/// Columns of a dual GEMM's interleaved weight copy for a result of N columns: blocks of 8 gate
/// columns and 8 up columns (fpat::prepareWeightB with DUAL, which must match).
inline int64_t dualColumns(int64_t n) {
  return 2 * ((n + 7) / 8 * 8);
}
inline int64_t KernelUnit::gemmColumns() const {
  return dual ? dualColumns(N) : N;
}

/// Entries of each of a deferred LayerNorm's column vectors: N padded to whole 256-column tiles
/// (fpat::normColumnsPitch in fpat_wgmma_prep.cuh, which must match).
inline int64_t normColumnsPitch(int64_t n) {
  return (n + 255) / 256 * 256;
}

/// Bytes of the prepared copy of B for a wgmma kernel: gemmColumns() rows of paddedK(K) elements,
/// and for a deferred LayerNorm its two f32 column vectors of normColumnsPitch(N) entries
/// (fpat_wgmma.cuh).
size_t preparedBBytes(const KernelUnit& u);

struct CodegenOptions {
  int arch = 90;                              // sm_XX
  int sms = 132;                              // SMs of the target (tile heuristic)
  const TileConfig* tile = nullptr;           // override the heuristic (tuner)
  const FlashConfig* flash = nullptr;         // the flash-attention kernel's, likewise
  std::map<std::string, std::string> sources; // pattern -> ".fpat file:line", for comments
  std::string version = "0.1.0";
  // The decode kernel writes kv_append's caches itself (decodeAppend); false: every op its own
  // kernel (fpatc --time's unfused graph).
  bool appendInDecode = true;
};

/// What the tuner searches for an attention op that runs on the flash kernel: a key (what the
/// kernel computes; sizes m = B Sq, n = H d, k = Sk) and the configurations worth timing, the
/// heuristic's (or FPAT_FLASH's) first.
struct FlashTuning {
  std::string signature;
  int64_t m = 0, n = 0, k = 0;
  std::vector<FlashConfig> candidates;
  bool forced = false; // FPAT_FLASH names the first: it wins over a cached choice
};
/// nullopt where op `v` runs on no flash-attention kernel on sm_`arch` (other ops, the decode
/// kernel, other head dimensions and targets).
std::optional<FlashTuning> flashTuning(const ir::Graph& g, ir::Vertex v, int arch);

/// Generates the kernel for op `v` of `g` (fused or not). Inputs need no kernel: returns a
/// unit with no launches. Throws CodegenError for what no kernel family implements (f32
/// tensors, unknown families).
KernelUnit generate(const ir::Graph& g, ir::Vertex v, dsl::Activations defs,
                    const CodegenOptions& opts);

/// Kernel headers embedded in the binary: (file name, contents).
const std::vector<std::pair<std::string_view, std::string_view>>& kernelHeaders();

/// A hash of every kernel header, for cache keys.
std::string kernelHeadersHash();

} // namespace fpat::codegen
