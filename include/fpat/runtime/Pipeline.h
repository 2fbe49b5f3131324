// The GPU half of the pipeline as plain functions: generate and compile every kernel of a fused
// graph, run it, validate outputs. fpatc, the examples and the GPU tests all go through here.
#pragma once

#include "fpat/runtime/Executor.h"

namespace fpat::runtime {

struct BuildOptions {
  int arch = 90;
  int sms = 132;
  std::string cacheDir; // "" : default cache
  int jobs = 0;
  bool ptx = false;
  std::vector<std::string> nvccFlags;                // extra nvcc flags (NvccOptions::extraFlags)
  const codegen::TileConfig* tile = nullptr;         // force one GEMM configuration
  std::map<ir::Vertex, codegen::TileConfig> tiles;   // per-op configurations (tuner, cache)
  std::map<ir::Vertex, codegen::FlashConfig> flash;  // attention ops' (tuner, cache)
  std::map<std::string, std::string> patternSources; // pattern -> "file:line"
  bool appendInDecode = true;                        // codegen::CodegenOptions::appendInDecode
};

struct BuildResult {
  CompiledGraph graph;
  std::vector<CompiledKernel> kernels; // one per distinct unit
  std::string error;                   // codegen or nvcc failure, or ""
  std::vector<std::string> warnings;   // e.g. damaged cache entries, compiled again
  int compiled = 0, cached = 0;
  double seconds = 0;
};

/// Generates and compiles a kernel for every op of `fused`.
BuildResult buildKernels(const ir::Graph& fused, dsl::Activations defs, const BuildOptions& o);

/// Agreement of a GPU result with the CPU reference.
struct Agreement {
  double maxAbs = 0;
  double maxRel = 0;    // relative to max(|ref|, rms(ref))
  size_t nonFinite = 0; // elements where either side is NaN or infinite
  bool pass = false;
};

/// The tolerance fpat validates f16 GPU results with; see Pipeline.cpp for the reasoning.
constexpr double kRelTolerance = 1e-2;
/// The tolerance for results of type `t`: kRelTolerance for f16 and f32; for bf16, whose unit
/// roundoff is 8 times f16's (8 significand bits, not 11), 8 times that.
double relTolerance(ir::DType t);

/// `tolerance` < 0: relTolerance of `want`'s type.
Agreement compareToReference(const ir::Tensor& got, const ir::Tensor& want, double tolerance = -1);

} // namespace fpat::runtime
