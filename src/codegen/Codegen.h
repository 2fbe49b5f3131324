// Code generation: one small CUDA translation unit per op of a fused graph, instantiating a
// kernel-family template (kernels/*.cuh) with an epilogue lowered from the .fpat bodies.
#pragma once

#include "dsl/Library.h"
#include "ir/Graph.h"

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

/// GEMM tile configuration: CTA tile BM x BN x BK, warp tile WM x WN, pipeline depth.
struct TileConfig {
  int bm = 128, bn = 128, bk = 32, wm = 64, wn = 32, stages = 3;
  bool mma = false; // inner product with mma.sync + ldmatrix (sm_80+) instead of WMMA
  int threads() const { return 32 * (bm / wm) * (bn / wn); }
  /// `128x128x32_w2x4_s3` (warps along M x N), `_mma` for the mma.sync backend.
  std::string str() const;
  /// The inverse of str(); nullopt for text that is not a configuration name.
  static std::optional<TileConfig> parse(const std::string& text);
  bool operator==(const TileConfig&) const = default;
};

/// Dynamic shared memory of a GEMM configuration; mirrors fpat::gemmSmemBytes in fpat_gemm.cuh.
int gemmSmemBytes(const TileConfig& t, bool transB);

/// The heuristic default when nothing better is known (no tuning, no GPU): large tiles for
/// large problems, smaller ones when the large tiles would leave most SMs idle.
/// `norm`: for norm_gemm, whose in-place normalisation needs about 50 more registers per thread.
TileConfig defaultTile(int64_t m, int64_t n, int arch, int numSms = 132, bool norm = false);

/// How a kernel entry is launched; the runtime derives the grid from the op's shapes.
struct Launch {
  enum Grid { GemmTiles, Rows, Elements } grid = GemmTiles;
  std::string entry; // extern "C" name
  int threads = 256;
  int smemBytes = 0;
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
  // Argument block values (pointers are bound by the runtime; in[i] = operand i of the op).
  int64_t M = 0, N = 0, K = 0;
  float eps = 0;
  std::vector<float> params;
  bool needsRowStats = false; // norm_gemm: two f32 [M] scratch buffers
};

struct CodegenOptions {
  int arch = 90;                              // sm_XX
  int sms = 132;                              // SMs of the target (tile heuristic)
  const TileConfig* tile = nullptr;           // override the heuristic (tuner)
  std::map<std::string, std::string> sources; // pattern -> ".fpat file:line", for comments
  std::string version = "0.1.0";
};

/// Generates the kernel for op `v` of `g` (fused or not). Inputs need no kernel: returns a
/// unit with no launches. Throws CodegenError for what no kernel family implements (f32
/// tensors, unknown families).
KernelUnit generate(const ir::Graph& g, ir::Vertex v, const dsl::PatternLibrary& lib,
                    const CodegenOptions& opts);

/// Kernel headers embedded in the binary: (file name, contents).
const std::vector<std::pair<std::string_view, std::string_view>>& kernelHeaders();

/// A hash of every kernel header, for cache keys.
std::string kernelHeadersHash();

} // namespace fpat::codegen
