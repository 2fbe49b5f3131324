// The fpatc pipeline as a library: fpatc's main only parses options and calls this.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

namespace fpat {

struct FpatcOptions {
  std::string input;                     // .fgraph file or ONNX model
  uint64_t seed = 1;                     // seed of the random inputs
  std::string inputsDir;                 // read input NAME from DIR/NAME.f16 when that exists
  std::string outputsDir;                // write each GPU output NAME to DIR/NAME.f16
  std::string expectDir;                 // check each output NAME against DIR/NAME.f32
  std::string outDir = "fpat-out";       // where .dot/.svg (and later kernels) go
  std::string emit;                      // stop after a stage: fgraph, fused, table, cuda
  bool reference = true;                 // evaluate on the CPU reference
  int64_t referenceRows = -1;            // rows of it to compute (row-wise graphs); -1: auto
  bool graphviz = true;                  // write .dot (and .svg when dot is installed)
  bool fuse = true;                      // run the matcher and rewrite
  bool fuseAlways = false;               // --fuse=always: greedy by benefit, not by cost
  bool explain = false;                  // say why each pattern did or did not match
  std::vector<std::string> patternFiles; // user .fpat files, compiled in-process
  std::vector<std::string> includeDirs;  // for their includes (the built-in dir is added)
  std::set<std::string> disabled;        // --disable-pattern
  std::set<std::string> only;            // --only-pattern
  int arch = 0;                          // sm_XX to compile for; 0: the device's, else 90
  bool compile = true;                   // generate and compile kernels (needs nvcc)
  bool run = true;                       // execute on the GPU when there is one
  bool requireGpu = false;               // exit 77 (skipped) when there is no GPU
  bool time = false;                     // --time: fused against unfused, steady state
  int timeRuns = 20;                     // timed runs of each (the median is reported)
  bool tune = false;                     // `fpatc tune`: measure configurations first
  bool retune = false;                   // ignore cached tuning results
  std::string tuneCache;                 // "" : $FPAT_TUNE_CACHE or <cache dir>/tuning.json
  bool ptx = false;                      // keep PTX next to each cubin
  int jobs = 0;                          // parallel nvcc processes (0: one per core)
  std::vector<std::string> nvccFlags;    // passed to nvcc after fpat's flags
  std::string cacheDir;                  // kernel cache ("" : $FPAT_CACHE_DIR or ~/.cache/fpat)
  bool verifyDiagnostics = false;        // golden mode: check expected-* comments
  int errorLimit = 50;                   // 0 = unlimited
  bool noRaise = false;                  // skip the raising patterns
  bool noRewrite = false;                // skip the weight rewrites
  bool noRopeEpilogue = false;           // keep ropes in kernels of their own
  std::string precision;                 // ONNX models: f32, f16 ("" : f16)
  std::map<std::string, int64_t> dims;   // sizes of symbolic (ONNX) and named (.fgraph) dimensions
};

/// Directory of the built-in .fpat files: $FPAT_PATTERNS_DIR, or "" for the embedded ones.
std::string builtinPatternsDir();

/// Runs the pipeline; returns the process exit code (0 ok, 1 user error or failed check).
int runFpatc(const FpatcOptions& opts, std::ostream& out, std::ostream& err);

} // namespace fpat
