// Choosing kernel configurations per op (GEMM tiles, flash-attention variants): from the
// tuning cache, by measurement on the GPU, or by the heuristic when neither is possible.
#pragma once

#include "fpat/dsl/Library.h"
#include "fpat/ir/Graph.h"
#include "fpat/tune/Tune.h"

#include <ostream>

namespace fpat::tune {

struct TuneOptions {
  size_t maxCandidates = 24;
  /// Candidates to time instead of the search space (experiments); each is still checked
  /// against the device limits.
  std::vector<codegen::TileConfig> configs;
  int warmup = 3;
  int reps = 20;        // timed runs per candidate; the median is kept
  bool retune = false;  // ignore cached results (FPAT_RETUNE=1 does the same)
  std::string cacheDir; // kernel cache for the candidates' cubins
  int jobs = 0;
  std::vector<std::string> nvccFlags; // extra nvcc flags for the candidates (and the key)
  std::ostream* log = nullptr; // one line per candidate: time and best so far, or why rejected
};

struct Choice {
  codegen::TileConfig config;
  std::optional<codegen::FlashConfig> flash; // an attention op's (flash kernel), not config
  std::string configName() const { return flash ? flash->str() : config.str(); }
  std::string source; // "cache", "tuned" or "heuristic"
  double ms = 0;      // measured (tuned) or remembered (cache) time
  double heuristicMs = 0;
  int tried = 0, rejected = 0;
};

/// Ops whose kernels have a configuration to choose on sm_`arch`: a GEMM family's tile, or the
/// flash-attention kernel's (codegen::flashTuning).
bool tunable(const ir::Graph& g, ir::Vertex v, int arch = 90);

/// The cache key of op `v`'s kernel.
Key keyFor(const ir::Graph& g, ir::Vertex v, dsl::Activations defs, int arch,
           const std::string& nvccVersion);

/// The cached configuration, else the heuristic. Needs no GPU.
Choice choose(const ir::Graph& g, ir::Vertex v, dsl::Activations defs, TuningCache& cache, int arch,
              int sms, const std::string& nvccVersion, bool retune);

/// Times every candidate configuration of op `v` (alone, on random inputs) and stores the
/// fastest one whose output matches the CPU reference on sampled rows.
Choice tune(cuda::Driver& drv, const ir::Graph& g, ir::Vertex v, dsl::Activations defs,
            TuningCache& cache, const TuneOptions& o);

} // namespace fpat::tune
