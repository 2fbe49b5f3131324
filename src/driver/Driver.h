// The fpatc pipeline as a library: fpatc's main only parses options and calls this.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace fpat {

struct FpatcOptions {
  std::string input;               // .fgraph file
  uint64_t seed = 1;               // seed of the random inputs
  std::string outDir = "fpat-out"; // where .dot/.svg (and later kernels) go
  std::string emit;                // "", "fgraph", "dot": print that stage and stop
  bool reference = true;           // evaluate on the CPU reference
  bool graphviz = true;            // write .dot (and .svg when dot is installed)
  bool verifyDiagnostics = false;  // golden mode: check expected-* comments, exit 0 on match
  int errorLimit = 50;             // 0 = unlimited
};

/// Runs the pipeline; returns the process exit code (0 ok, 1 user error).
int runFpatc(const FpatcOptions& opts, std::ostream& out, std::ostream& err);

} // namespace fpat
