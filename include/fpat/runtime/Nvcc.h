// nvcc as a library: generated sources -> cubins (PTX on request), through a content-hash
// cache whose writes are atomic, several compiles at a time.
#pragma once

#include "fpat/codegen/Codegen.h"

#include <string>
#include <vector>

namespace fpat::runtime {

struct NvccOptions {
  int arch = 90;
  std::string nvcc;     // "" -> $FPAT_NVCC, nvcc on PATH, /usr/local/cuda/bin/nvcc
  std::string cacheDir; // "" -> $FPAT_CACHE_DIR, ~/.cache/fpat
  bool ptx = false;     // also keep the PTX next to the cubin
  bool lineInfo = true; // -lineinfo (compute-sanitizer reports source lines)
  int jobs = 0;         // parallel compiles (0: hardware threads)
  /// Passed to nvcc after fpat's own flags (fpatc --nvcc-flag); $FPAT_NVCC_FLAGS follows them.
  std::vector<std::string> extraFlags;
};

struct CompiledKernel {
  std::string name;
  std::string cubinPath;
  std::string ptxPath;    // when requested
  std::string sourcePath; // the .cu nvcc compiled (kept in the cache)
  bool cached = false;    // found in the cache, not compiled now
  std::string warning;    // e.g. a damaged cache entry that was compiled again
  double seconds = 0;     // compile time
  std::string error;      // non-empty: nvcc failed; its output, naming the .cu file and line
};

/// The nvcc to use, or "" when there is none.
std::string findNvcc(const NvccOptions& o);
/// `nvcc --version`'s release line ("" when nvcc is missing); part of every cache key.
std::string nvccVersion(const std::string& nvcc);
std::string defaultCacheDir();
/// $FPAT_NVCC_FLAGS split at whitespace (no quoting: a flag with spaces cannot be passed).
std::vector<std::string> nvccFlagsFromEnvironment();
/// What decides the code nvcc makes besides the source: its version and the extra flags
/// (`extra`, then the environment's). Part of the tuning cache's keys.
std::string nvccIdentity(const std::string& nvcc, const std::vector<std::string>& extra);

/// Compiles every unit (duplicates by name are compiled once). Never throws for compile
/// errors: they are in each result's `error`. Throws std::runtime_error when nvcc is missing or
/// the cache directory is unusable.
std::vector<CompiledKernel> compileAll(const std::vector<codegen::KernelUnit>& units,
                                       const NvccOptions& o);

/// Removes temporary files (`*.tmp.PID.*`) that a process killed mid-write left in `dir`: those
/// of processes that no longer run, and any older than a day. Returns how many it removed.
int removeStaleTemporaries(const std::string& dir);

/// Writes `data` to `path` atomically (temporary file in the same directory, then rename), so
/// concurrent writers and killed processes never leave a partial file behind.
void writeFileAtomic(const std::string& path, const std::string& data);

} // namespace fpat::runtime
