// The autotuner: a search space from the GEMM template's tunables, pruned by the device's
// limits; candidates compiled in parallel, timed with CUDA events, checked for correctness;
// results kept in a persistent JSON cache.
#pragma once

#include "fpat/codegen/Codegen.h"
#include "fpat/runtime/Cuda.h"

#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace fpat::tune {

/// What limits a configuration, read from the device or from a recorded description (tests).
struct DeviceLimits {
  int arch = 90;
  int sms = 132;
  int smemOptin = FPAT_SM90_SMEM_BYTES;
  int maxThreadsPerBlock = 1024;
  int regsPerBlock = 65536;
  int l2Bytes = 60 * 1024 * 1024;
  static DeviceLimits from(const cuda::DeviceInfo& d);
  /// Reads `{"arch": 90, "sms": 132, ...}`; throws std::runtime_error on bad input.
  static DeviceLimits fromJson(const std::string& text);
};

/// Why a configuration is not tried, or "" when it fits the device.
std::string staticReject(const codegen::TileConfig& t, bool transB, const DeviceLimits& d);
/// Local memory per thread up to which a spilling kernel is still timed.
constexpr int kMaxSpillBytes = 256;
/// After compiling: registers and spills (local memory beyond kMaxSpillBytes) of the kernel.
std::string compiledReject(const codegen::TileConfig& t, int regsPerThread, int localBytes,
                           const DeviceLimits& d);

/// Every configuration the template declares (CTA tile, warp tile, BK, stages), before pruning.
std::vector<codegen::TileConfig> fullSpace();
/// The configurations worth timing for a problem on this device: those that fit, with tiles no
/// larger than the problem needs, at most `limit` of them, codegen::defaultTile's first. The
/// wgmma backend's lead on sm_90 where it can run (GemmProblem::tma); without 16-byte loads
/// (GemmProblem::vec) 64x64 warp tiles, which spill there, rank last.
std::vector<codegen::TileConfig> searchSpace(const DeviceLimits& d, bool transB,
                                             const codegen::GemmProblem& p, size_t limit = 24);

/// The tuner's next batch where every candidate so far was rejected: the first `batch` (at
/// least one) configurations of the ranked `space` not in `tried`, in its order.
std::vector<codegen::TileConfig> nextCandidates(const std::vector<codegen::TileConfig>& space,
                                                const std::vector<codegen::TileConfig>& tried,
                                                size_t batch);

/// Identifies one tuning problem.
struct Key {
  std::string signature; // the kernel without its configuration (pattern, epilogue, ...)
  int64_t m = 0, n = 0, k = 0;
  std::string dtype = "f16";
  int arch = 90;
  std::string templateVersion; // hash of the kernel headers
  std::string nvccVersion;
  std::string str() const;
};

struct Entry {
  codegen::TileConfig config;
  double ms = 0;          // median time of the winner
  double heuristicMs = 0; // median time of the heuristic default, measured alongside
  int candidates = 0;
  std::optional<codegen::FlashConfig> flash; // the flash-attention kernel's, instead of config
};

/// The persistent cache: one JSON file, read and written under an exclusive lock, replaced
/// atomically. A corrupt or truncated file is reported, moved aside and rebuilt.
class TuningCache {
public:
  static constexpr int kSchema = 1;
  /// `path` "" -> $FPAT_TUNE_CACHE, else <kernel cache dir>/tuning.json.
  explicit TuningCache(std::string path = "");
  const std::string& path() const { return path_; }
  std::optional<Entry> lookup(const Key& k);
  /// Every entry's measured time (ms) by its key's text, read once: the cost model asks for
  /// many kernels and lookup() reads the file each time.
  std::map<std::string, double> measuredTimes();
  void store(const Key& k, const Entry& e);
  size_t size();
  /// Problems met while reading (a corrupt file moved aside), for the user to see.
  std::vector<std::string> takeWarnings();

private:
  std::string path_;
  std::vector<std::string> warnings_;
};

/// True when $FPAT_RETUNE asks to ignore cached results.
bool retuneFromEnvironment();

} // namespace fpat::tune
