// The fpatc pipeline as a library: fpatc's main only parses options and calls this.
#pragma once

#include <cstdint>
#include <ostream>
#include <set>
#include <string>
#include <vector>

namespace fpat {

struct FpatcOptions {
  std::string input;                     // .fgraph file
  uint64_t seed = 1;                     // seed of the random inputs
  std::string outDir = "fpat-out";       // where .dot/.svg (and later kernels) go
  std::string emit;                      // print one stage and stop: fgraph, fused, table
  bool reference = true;                 // evaluate on the CPU reference
  bool graphviz = true;                  // write .dot (and .svg when dot is installed)
  bool fuse = true;                      // run the matcher and rewrite
  bool explain = false;                  // say why each pattern did or did not match
  std::vector<std::string> patternFiles; // user .fpat files, compiled in-process
  std::vector<std::string> includeDirs;  // for their includes (the built-in dir is added)
  std::set<std::string> disabled;        // --disable-pattern
  std::set<std::string> only;            // --only-pattern
  bool verifyDiagnostics = false;        // golden mode: check expected-* comments
  int errorLimit = 50;                   // 0 = unlimited
};

/// Directory of the built-in .fpat files: $FPAT_PATTERNS_DIR, else the source tree's.
std::string builtinPatternsDir();

/// Runs the pipeline; returns the process exit code (0 ok, 1 user error or failed check).
int runFpatc(const FpatcOptions& opts, std::ostream& out, std::ostream& err);

} // namespace fpat
