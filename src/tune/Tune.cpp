#include "fpat/tune/Tune.h"

#include "fpat/runtime/Nvcc.h"
#include "fpat/support/Diagnostics.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fcntl.h>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sys/file.h>
#include <unistd.h>

namespace fpat::tune {
namespace fs = std::filesystem;
using codegen::TileConfig;

DeviceLimits DeviceLimits::from(const cuda::DeviceInfo& d) {
  DeviceLimits l;
  l.arch = d.arch;
  l.sms = d.sms;
  l.smemOptin = d.smemOptin;
  l.maxThreadsPerBlock = d.maxThreadsPerBlock;
  l.regsPerBlock = d.regsPerBlock;
  l.l2Bytes = d.l2Bytes;
  return l;
}

DeviceLimits DeviceLimits::fromJson(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text); // throws on bad JSON
  DeviceLimits l;
  l.arch = j.at("arch").get<int>();
  l.sms = j.at("sms").get<int>();
  l.smemOptin = j.at("smem_optin").get<int>();
  l.maxThreadsPerBlock = j.at("max_threads_per_block").get<int>();
  l.regsPerBlock = j.at("regs_per_block").get<int>();
  l.l2Bytes = j.at("l2_bytes").get<int>();
  return l;
}

std::string staticReject(const TileConfig& t, bool transB, const DeviceLimits& d) {
  if (t.wgmma()) {
    if (d.arch != 90)
      return "the wgmma backend needs compute capability 9.0 (sm_90a), not sm_" +
             std::to_string(d.arch);
    const auto known = codegen::wgmmaConfigs();
    if (std::none_of(known.begin(), known.end(), [&](const TileConfig& k) {
          return k.bm == t.bm && k.bn == t.bn && k.bk == t.bk && k.wm == t.wm && k.wn == t.wn &&
                 k.backend == t.backend && k.cluster == t.cluster && k.rasterN == t.rasterN &&
                 k.aRows == t.aRows;
        }))
      return "not a tile shape of the wgmma kernel";
    if (t.threads() > d.maxThreadsPerBlock)
      return std::to_string(t.threads()) + " threads per block";
    const int smem = codegen::gemmSmemBytes(t, transB);
    if (smem > d.smemOptin)
      return std::to_string(smem) + " bytes of shared memory (the device allows " +
             std::to_string(d.smemOptin) + ")";
    return "";
  }
  if (t.bm % t.wm || t.bn % t.wn || t.wm % 16 || t.wn % 16 || t.bk % 16)
    return "tiles do not divide into 16x16 WMMA fragments";
  const int threads = t.threads();
  if (threads < 64 || threads > std::min(512, d.maxThreadsPerBlock))
    return std::to_string(threads) + " threads per block (64 to 512 allowed)";
  if ((t.wm / 16) * (t.wn / 16) > 16)
    return "warp tile of " + std::to_string((t.wm / 16) * (t.wn / 16)) +
           " accumulator fragments (16 at most: more cannot stay in registers)";
  if (d.arch < 80 && t.stages > 2)
    return "more than 2 stages needs cp.async (sm_80)";
  if (d.arch < 80 && t.backend == codegen::Backend::MmaSync)
    return "the mma.sync backend needs sm_80";
  const int smem = codegen::gemmSmemBytes(t, transB);
  if (smem > d.smemOptin)
    return std::to_string(smem) + " bytes of shared memory (the device allows " +
           std::to_string(d.smemOptin) + ")";
  return "";
}

std::string compiledReject(const TileConfig& t, int regsPerThread, int localBytes,
                           const DeviceLimits& d) {
  // A few spilled words (loop invariants) can cost nothing: norm_gemm with 64x64 warp tiles
  // spills 108 bytes and ran 5-16% faster on the H200 than the best candidate without spills
  // at 12 of 16 shapes (bench/RESULTS.md). Heavier spilling is not worth timing.
  if (localBytes > kMaxSpillBytes)
    return "spills (" + std::to_string(localBytes) +
           " bytes of local memory per thread, more than " + std::to_string(kMaxSpillBytes) + ")";
  if (regsPerThread * t.threads() > d.regsPerBlock)
    return std::to_string(regsPerThread * t.threads()) + " registers per block (the device has " +
           std::to_string(d.regsPerBlock) + ")";
  return "";
}

std::vector<TileConfig> fullSpace() {
  std::vector<TileConfig> out;
  for (int bm : {64, 128, 256})
    for (int bn : {64, 128, 256})
      for (int bk : {32, 64})
        for (int wm : {32, 64})
          for (int wn : {32, 64})
            for (int stages : {2, 3, 4})
              for (codegen::Backend b : {codegen::Backend::Wmma, codegen::Backend::MmaSync})
                out.push_back({bm, bn, bk, wm, wn, stages, b});
  for (const TileConfig& t : codegen::wgmmaConfigs())
    out.push_back(t);
  return out;
}

std::vector<TileConfig> searchSpace(const DeviceLimits& d, bool transB,
                                    const codegen::GemmProblem& p, size_t limit) {
  const int64_t m = p.m, n = p.n;
  const bool norm = p.norm;
  auto fitsProblem = [&](const TileConfig& t) {
    // A tile more than twice the problem in a dimension only computes padding.
    return t.bm <= std::max<int64_t>(64, 2 * m) && t.bn <= std::max<int64_t>(64, 2 * n) &&
           t.runsRows(m);
  };
  const bool wgmmaOk = d.arch == 90 && p.tma && !norm;
  const TileConfig heuristic = codegen::defaultTile(p, d.arch, d.sms);
  std::vector<TileConfig> ok;
  for (const TileConfig& t : fullSpace())
    if (staticReject(t, transB, d).empty() && fitsProblem(t) && !(t == heuristic) &&
        (wgmmaOk || !t.wgmma()))
      ok.push_back(t);
  // Rank by how well the grid fills the GPU (fewest idle CTA slots in the last wave, with the
  // CTAs per SM that shared memory and an estimate of the registers allow), then by larger
  // warp tiles (fewer fragment loads per MMA: the main loop's limit), larger CTA tiles (more
  // reuse per byte loaded) and deeper k-tiles. The estimate: accumulators, two k steps of
  // fragments and about 40 registers of addresses and indices per thread (about 50 more for
  // norm_gemm's in-place normalisation), at most 255.
  auto ctasPerSm = [&](const TileConfig& t) {
    if (t.wgmma()) // persistent: one CTA per SM by construction
      return 1;
    const int frags = (t.wm / 16) * (t.wn / 16);
    // Above 255 the kernel spills a little (tolerated, see compiledReject) at 255 registers.
    const int regs =
        std::min(255, 40 + (norm ? 50 : 0) + 8 * frags + 2 * 4 * (t.wm / 16 + t.wn / 16));
    const int byRegs = d.regsPerBlock / (regs * t.threads());
    const int bySmem = d.smemOptin / std::max(1, codegen::gemmSmemBytes(t, transB));
    return std::max(0, std::min({byRegs, bySmem, 2}));
  };
  auto score = [&](const TileConfig& t) {
    const int per = ctasPerSm(t);
    if (per == 0) // would spill or not launch: last
      return -1.0;
    if (!p.vec && t.wm * t.wn >= 64 * 64) // spills with bounds-checked loads: after all else
      return -2.0;
    const double tiles =
        static_cast<double>((m + t.bm - 1) / t.bm) * static_cast<double>((n + t.bn - 1) / t.bn);
    const double slots = static_cast<double>(per) * d.sms;
    const double waves = std::ceil(tiles / slots);
    const double fill = tiles / (waves * slots);
    // The wgmma kernels run about twice as fast as the others on sm_90 (bench/RESULTS.md):
    // all of them rank first, wider tiles first (more reuse of each loaded byte).
    if (t.wgmma())
      return 10 + codegen::wgmmaScore(t, p, d.sms);
    return fill + 0.05 * std::log2(static_cast<double>(t.wm) * t.wn) +
           0.03 * std::log2(static_cast<double>(t.bm) * t.bn) + 0.02 * (t.bk / 32) +
           0.01 * t.stages;
  };
  std::stable_sort(ok.begin(), ok.end(),
                   [&](const TileConfig& a, const TileConfig& b) { return score(a) > score(b); });
  std::vector<TileConfig> out = {heuristic};
  for (const TileConfig& t : ok)
    if (out.size() < limit)
      out.push_back(t);
  return out;
}

std::vector<TileConfig> nextCandidates(const std::vector<TileConfig>& space,
                                       const std::vector<TileConfig>& tried, size_t batch) {
  std::vector<TileConfig> out;
  for (const TileConfig& t : space)
    if (out.size() < std::max<size_t>(1, batch) &&
        std::find(tried.begin(), tried.end(), t) == tried.end() &&
        std::find(out.begin(), out.end(), t) == out.end())
      out.push_back(t);
  return out;
}

std::string Key::str() const {
  return signature + "|" + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
         "|" + dtype + "|sm_" + std::to_string(arch) + "|tpl " + templateVersion + "|" +
         nvccVersion;
}

bool retuneFromEnvironment() {
  const char* e = std::getenv("FPAT_RETUNE");
  return e && *e && std::string(e) != "0";
}

namespace {

/// An flock()ed lock file next to the cache: shared for reading, exclusive for writing.
class FileLock {
public:
  FileLock(const std::string& path, bool exclusive) {
    fd_ = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ >= 0)
      while (::flock(fd_, exclusive ? LOCK_EX : LOCK_SH) != 0 && errno == EINTR) {
      }
  }
  ~FileLock() {
    if (fd_ >= 0) {
      ::flock(fd_, LOCK_UN);
      ::close(fd_);
    }
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

private:
  int fd_ = -1;
};

nlohmann::json emptyCache() {
  return nlohmann::json{{"schema", TuningCache::kSchema}, {"entries", nlohmann::json::object()}};
}

/// What is wrong with the cache file's contents, or "" (and `j` holds them). Messages never
/// quote the file's bytes: they may be anything.
std::string inspect(const std::string& path, nlohmann::json& j, int& schema) {
  std::error_code ec;
  schema = TuningCache::kSchema;
  if (fs::is_directory(path, ec))
    return "it is a directory, not a file";
  std::string text;
  if (!readFile(path, text))
    return "it cannot be read";
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return "not valid JSON (at byte " + std::to_string(e.byte) + ")";
  } catch (const nlohmann::json::exception&) {
    return "not valid JSON";
  }
  if (!j.is_object() || !j.contains("schema") || !j.contains("entries") ||
      !j["entries"].is_object() || !j["schema"].is_number_integer())
    return "not an fpat tuning cache";
  schema = j["schema"].get<int>();
  if (schema != TuningCache::kSchema)
    return "schema " + std::to_string(schema) + " (this fpat reads and writes " +
           std::to_string(TuningCache::kSchema) + ")";
  return "";
}

/// Reads the cache file; a missing file is empty. A reader (`repair` false) never changes the
/// file: it ignores a bad one with a warning. A writer (holding the exclusive lock) moves a bad
/// one aside and starts afresh, except one written by a newer fpat (higher schema), which it
/// leaves alone: `writable` is then false.
nlohmann::json readCache(const std::string& path, bool repair, std::vector<std::string>& warnings,
                         bool* writable = nullptr) {
  std::error_code ec;
  if (writable)
    *writable = true;
  if (!fs::exists(path, ec))
    return emptyCache();
  nlohmann::json j;
  int schema = 0;
  const std::string problem = inspect(path, j, schema);
  if (problem.empty())
    return j;
  const bool newer = schema > TuningCache::kSchema;
  const bool directory = fs::is_directory(path, ec);
  std::string what = "; ignored";
  if (repair && (newer || directory)) {
    what = newer ? "; left as it is (a newer fpat wrote it), results of this run are not saved"
                 : "; results of this run are not saved";
    if (writable)
      *writable = false;
  } else if (repair) {
    const std::string aside =
        path + ".bad-" + std::to_string(::getpid()) + "-" +
        std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
    fs::rename(path, aside, ec);
    what = ec ? "; cannot move it aside (" + ec.message() + "), results are not saved"
              : "; moved to '" + aside + "' and rebuilt";
    if (ec && writable)
      *writable = false;
  }
  warnings.push_back("tuning cache '" + path + "' is unusable: " + problem + what);
  return emptyCache();
}

const char* backendName(codegen::Backend b) {
  return b == codegen::Backend::MmaSync         ? "mma"
         : b == codegen::Backend::Wgmma         ? "wgmma"
         : b == codegen::Backend::WgmmaPingPong ? "pingpong"
                                                : "wmma";
}

nlohmann::json configJson(const TileConfig& t) {
  return {{"bm", t.bm},
          {"bn", t.bn},
          {"bk", t.bk},
          {"wm", t.wm},
          {"wn", t.wn},
          {"stages", t.stages},
          {"backend", backendName(t.backend)},
          {"cluster", t.cluster},
          {"raster", t.rasterN ? "n" : "m"},
          {"a_rows", t.aRows}};
}

nlohmann::json flashJson(const codegen::FlashConfig& f) {
  return {{"kernel", "flash_attention"},
          {"bn", f.bn},
          {"consumers", f.consumers},
          {"overlap", f.overlap},
          {"turns", f.pingpong},
          {"walk", !f.resident ? "grid" : f.dynamic ? "counter" : "stride"}};
}

/// The flash kernel's configuration an entry's "config" describes; throws (as the library
/// does) for one the kernel does not implement.
codegen::FlashConfig flashFromJson(const nlohmann::json& c) {
  codegen::FlashConfig f;
  f.bn = c.at("bn").get<int>();
  f.consumers = c.at("consumers").get<int>();
  f.overlap = c.at("overlap").get<bool>();
  f.pingpong = c.at("turns").get<bool>();
  const std::string walk = c.at("walk").get<std::string>();
  if (walk != "grid" && walk != "stride" && walk != "counter")
    throw nlohmann::json::other_error::create(501, "unknown walk " + walk, &c);
  f.resident = walk != "grid";
  f.dynamic = walk == "counter";
  if (f.consumers != 2 && f.consumers != 3)
    throw nlohmann::json::other_error::create(501, "bad consumer count", &c);
  if (codegen::FlashConfig::parse(f.str()) != f) // block size, three consumers' blocks
    throw nlohmann::json::other_error::create(501, "the kernel implements no such configuration",
                                              &c);
  return f;
}

} // namespace

TuningCache::TuningCache(std::string path) : path_(std::move(path)) {
  if (path_.empty()) {
    const char* e = std::getenv("FPAT_TUNE_CACHE");
    path_ = e && *e ? e : (fs::path(runtime::defaultCacheDir()) / "tuning.json").string();
  }
  std::error_code ec;
  fs::create_directories(fs::path(path_).parent_path(), ec);
}

std::optional<Entry> TuningCache::lookup(const Key& k) {
  // No lock: writers replace the file atomically, so a reader sees a whole old or new file.
  // Nor any repair: a run that only reads leaves the file (and creates no lock file).
  nlohmann::json j = readCache(path_, false, warnings_);
  auto it = j["entries"].find(k.str());
  if (it == j["entries"].end())
    return std::nullopt;
  try {
    const auto& c = (*it)["config"];
    Entry e;
    if (c.is_object() && c.contains("kernel")) {
      if (c["kernel"] != "flash_attention")
        throw nlohmann::json::other_error::create(501, "unknown kernel", &c);
      e.flash = flashFromJson(c);
      e.ms = it->value("ms", 0.0);
      e.heuristicMs = it->value("heuristic_ms", 0.0);
      e.candidates = it->value("candidates", 0);
      return e;
    }
    e.config = {c.at("bm"), c.at("bn"), c.at("bk"), c.at("wm"), c.at("wn"), c.at("stages")};
    const std::string backend = c.value("backend", c.value("mma", false) ? "mma" : "wmma");
    if (backend == "mma")
      e.config.backend = codegen::Backend::MmaSync;
    else if (backend == "wgmma")
      e.config.backend = codegen::Backend::Wgmma;
    else if (backend == "pingpong")
      e.config.backend = codegen::Backend::WgmmaPingPong;
    else if (backend != "wmma")
      throw nlohmann::json::other_error::create(501, "unknown backend " + backend, &c);
    e.config.cluster = c.value("cluster", 1);
    if (e.config.cluster != 1 && !(e.config.cluster == 2 && e.config.wgmma()))
      throw nlohmann::json::other_error::create(501, "bad cluster size", &c);
    const std::string raster = c.value("raster", "m");
    if (raster != "m" && !(raster == "n" && e.config.wgmma()))
      throw nlohmann::json::other_error::create(501, "bad raster order " + raster, &c);
    e.config.rasterN = raster == "n";
    e.config.aRows = c.value("a_rows", 0);
    if (e.config.aRows != 0 && !TileConfig::parse(e.config.str())) // not the template's
      throw nlohmann::json::other_error::create(501, "bad A box rows", &c);
    // Only what the kernel templates implement: any other sizes (a zero tile, a negative one,
    // stages the ring cannot hold) would divide by zero or fail in nvcc later.
    const std::vector<TileConfig> space = fullSpace();
    const TileConfig& t = e.config;
    const bool implemented = std::any_of(space.begin(), space.end(), [&](const TileConfig& o) {
      // wgmma: the tile of one the template lists, in a ring of 2 up to that one's stages;
      // its cluster and raster (checked above) combine freely.
      return t.wgmma() ? o.backend == t.backend && o.bm == t.bm && o.bn == t.bn && o.bk == t.bk &&
                             o.wm == t.wm && o.wn == t.wn && o.aRows == t.aRows && t.stages >= 2 &&
                             t.stages <= o.stages
                       : o == t;
    });
    if (!implemented) // (no str(): it divides by the warp tile)
      throw nlohmann::json::other_error::create(501, "the kernels implement no such configuration",
                                                &c);
    e.ms = it->value("ms", 0.0);
    e.heuristicMs = it->value("heuristic_ms", 0.0);
    e.candidates = it->value("candidates", 0);
    return e;
  } catch (const nlohmann::json::exception& ex) {
    // The library's message less its "[json.exception...] " prefix says which field.
    std::string why = ex.what();
    if (const size_t end = why.find("] "); end != std::string::npos)
      why = why.substr(end + 2);
    warnings_.push_back("tuning cache entry '" + k.str() + "' is malformed (" + why + "); ignored");
    return std::nullopt;
  }
}

void TuningCache::store(const Key& k, const Entry& e) {
  FileLock lock(path_, true);
  bool writable = true;
  nlohmann::json j = readCache(path_, true, warnings_, &writable);
  if (!writable)
    return;
  j["entries"][k.str()] = {{"config", e.flash ? flashJson(*e.flash) : configJson(e.config)},
                           {"config_name", e.flash ? e.flash->str() : e.config.str()},
                           {"ms", e.ms},
                           {"heuristic_ms", e.heuristicMs},
                           {"candidates", e.candidates}};
  runtime::writeFileAtomic(path_, j.dump(1) + "\n");
}

std::map<std::string, double> TuningCache::measuredTimes() {
  std::map<std::string, double> out;
  const nlohmann::json j = readCache(path_, false, warnings_);
  if (auto it = j.find("entries"); it != j.end() && it->is_object())
    for (const auto& [key, e] : it->items())
      if (e.is_object() && e.contains("ms") && e["ms"].is_number() && e["ms"].get<double>() > 0)
        out[key] = e["ms"].get<double>();
  return out;
}

size_t TuningCache::size() {
  return readCache(path_, false, warnings_)["entries"].size();
}

std::vector<std::string> TuningCache::takeWarnings() {
  std::vector<std::string> w;
  w.swap(warnings_);
  return w;
}

} // namespace fpat::tune
