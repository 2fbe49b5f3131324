// The tuner without a GPU: search space and constraints from recorded device descriptions,
// the persistent cache (round trip, corruption, concurrent writers), the heuristic fallback.
#define BOOST_TEST_MODULE tune
#include "../common/TestGraphs.h"
#include "fpat/tune/Tuner.h"

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sys/wait.h>
#include <tuple>
#include <unistd.h>

using namespace fpat;
using namespace fpat::tune;
using codegen::TileConfig;
namespace fs = std::filesystem;

namespace {

DeviceLimits recorded(const std::string& name) {
  std::string text;
  BOOST_TEST_REQUIRE(readFile(std::string(FPAT_SOURCE_DIR) + "/tests/tune/" + name, text));
  return DeviceLimits::fromJson(text);
}

struct TempCache {
  static inline int made = 0; // several per test: distinct directories
  fs::path dir = fs::temp_directory_path() /
                 ("fpat-tune-test-" + std::to_string(::getpid()) + "-" + std::to_string(made++));
  std::string path = (dir / "tuning.json").string();
  TempCache() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempCache() { fs::remove_all(dir); }
};

Key key(const std::string& sig, int64_t m = 1024) {
  Key k;
  k.signature = sig;
  k.m = m;
  k.n = 4096;
  k.k = 4096;
  k.arch = 90;
  k.templateVersion = "t1";
  k.nvccVersion = "Build cuda_13.0";
  return k;
}

/// An M x N x 4096 problem, B as [K, N] (or [N, K] with transB): aligned, plain epilogue.
codegen::GemmProblem problem(int64_t m, int64_t n, bool transB = false) {
  return codegen::gemmProblem(m, n, 4096, transB);
}
codegen::GemmProblem normProblem(int64_t m, int64_t n) {
  codegen::GemmProblem p = problem(m, n);
  p.norm = true;
  p.tma = false;
  return p;
}
codegen::GemmProblem readingProblem(int64_t m, int64_t n) { // a bias or residual to load
  codegen::GemmProblem p = problem(m, n);
  p.epilogueReads = true;
  return p;
}
codegen::GemmProblem noTmaProblem(int64_t m, int64_t n) {
  codegen::GemmProblem p = problem(m, n);
  p.tma = false;
  return p;
}

} // namespace

BOOST_AUTO_TEST_CASE(search_space_respects_the_h200) {
  DeviceLimits d = recorded("h200.json");
  BOOST_TEST(d.smemOptin == 232448);
  auto space = searchSpace(d, false, problem(4096, 4096), 24);
  BOOST_REQUIRE(!space.empty());
  BOOST_TEST(space.size() <= 24u);
  BOOST_TEST((space[0] == codegen::defaultTile(problem(4096, 4096), 90, 132))); // heuristic first
  for (const TileConfig& t : space) {
    BOOST_TEST(staticReject(t, false, d).empty(), t.str());
    BOOST_TEST(codegen::gemmSmemBytes(t, false) <= d.smemOptin, t.str());
    BOOST_TEST(t.threads() <= 512);
  }
  // More than the old 48 KB: the H200's opt-in shared memory admits deep pipelines.
  bool big = false;
  for (const TileConfig& t : fullSpace())
    big = big || (staticReject(t, false, d).empty() && codegen::gemmSmemBytes(t, false) > 49152);
  BOOST_TEST(big);
  // Small problems get small tiles, and short A boxes only where they hold every row.
  bool shortBox = false;
  for (const TileConfig& t : searchSpace(d, false, problem(17, 128), 1000)) {
    BOOST_TEST(t.bm <= 64, t.str());
    BOOST_TEST(t.bn <= 256, t.str());
    BOOST_TEST(t.runsRows(17), t.str());
    shortBox = shortBox || t.aRows > 0;
  }
  BOOST_TEST(shortBox); // 32-row boxes
  for (const TileConfig& t : searchSpace(d, false, problem(33, 4096), 100))
    BOOST_TEST(t.aRows == 0, t.str());
}

BOOST_AUTO_TEST_CASE(norm_gemm_keeps_eight_warps_per_tile) {
  // norm_gemm's heuristic: the wide 8-warp tile where it fills the GPU, else 64x32 warp tiles
  // (never the 4-warp or tall 64x64-warp tiles, measured far slower there); heuristic first.
  using codegen::defaultTile;
  BOOST_TEST(
      (defaultTile(normProblem(2048, 4096), 90, 132) == TileConfig{128, 256, 64, 64, 64, 3}));
  BOOST_TEST((defaultTile(normProblem(512, 4096), 90, 132) == TileConfig{128, 128, 64, 64, 32, 3}));
  BOOST_TEST(
      (defaultTile(normProblem(8192, 4096), 90, 132) == TileConfig{128, 128, 64, 64, 32, 3}));
  BOOST_TEST((defaultTile(problem(8192, 4096), 80, 108) == TileConfig{256, 128, 64, 64, 64, 3}));
  DeviceLimits d = recorded("h200.json");
  auto space = searchSpace(d, false, normProblem(512, 4096), 8);
  BOOST_TEST((space[0] == defaultTile(normProblem(512, 4096), 90, 132)));
}

BOOST_AUTO_TEST_CASE(hopper_defaults_to_the_wgmma_backend) {
  using codegen::Backend;
  using codegen::defaultTile;
  // Large problems: the cooperative 128x256 tile, 3 stages and the epilogue tile stored by TMA
  // (4 stages leave no room for it); where TMA cannot store (N % 8 != 0, B [N, K]) 4 stages,
  // and with a bias to load still 3 (4 would leave too little L1 for the bias loads).
  BOOST_TEST((defaultTile(problem(8192, 4096), 90, 132) ==
              TileConfig{128, 256, 64, 64, 256, 3, Backend::Wgmma}));
  BOOST_TEST((defaultTile(problem(8192, 4092, /*transB=*/true), 90, 132) ==
              TileConfig{128, 256, 64, 64, 256, 4, Backend::Wgmma}));
  BOOST_TEST((defaultTile(readingProblem(8192, 4096), 90, 132) ==
              TileConfig{128, 256, 64, 64, 256, 3, Backend::Wgmma}));
  // M = 512: 128x256 tiles would leave half the SMs idle, and ping-pong needs two tiles per
  // CTA: the cooperative 128x128 tile.
  BOOST_TEST((defaultTile(readingProblem(512, 4096), 90, 132) ==
              TileConfig{128, 128, 64, 64, 128, 6, Backend::Wgmma}));
  // N = 4104, B read from a weight copy in [N, K] rows: 256x128 tiles (528, four whole waves)
  // with four stages, with or without inputs to load, measured 1-8% faster than 128x256 (544
  // tiles, its last wave split) and 128x192; at K = 1000 128x192 (the stores weigh more there:
  // 256x128 with four stages measured 35% slower; bench/RESULTS.md, session 16).
  auto prepared = [](int64_t m, int64_t n, int64_t k, bool reads) {
    codegen::GemmProblem p = codegen::gemmProblem(m, n, k, /*transB=*/true);
    p.epilogueReads = reads;
    return p;
  };
  const TileConfig tall4{256, 128, 64, 128, 128, 4, Backend::Wgmma};
  BOOST_TEST((defaultTile(prepared(4096, 4104, 4096, false), 90, 132) == tall4));
  BOOST_TEST((defaultTile(prepared(4096, 4104, 4096, true), 90, 132) == tall4));
  BOOST_TEST((defaultTile(prepared(1024, 4100, 4096, true), 90, 132) == tall4));
  BOOST_TEST((defaultTile(prepared(1500, 4104, 1000, true), 90, 132) ==
              TileConfig{128, 192, 64, 64, 192, 4, Backend::Wgmma}));
  // 8192x768x3072 with a residual: 128x192 (256 tiles, 1.94 waves) measured 10-20% faster than
  // 128x256 (192 tiles, 1.45 waves, the last split in k); M = 77: 128x128, not 64x128 (10-17%).
  BOOST_TEST((defaultTile(prepared(8192, 768, 3072, true), 90, 132) ==
              TileConfig{128, 192, 64, 64, 192, 4, Backend::Wgmma}));
  BOOST_TEST((defaultTile(prepared(77, 11008, 4096, false), 90, 132) ==
              TileConfig{128, 128, 64, 64, 128, 6, Backend::Wgmma}));
  // Fewer tiles than SMs are split in k (session 17): 77x4096x11008 on 64x128 in two pieces
  // (0.034 ms) rather than 128 tiles of 64x64 (0.053), also with a residual; 1x11008x4096 with
  // a residual 64x128 (0.035) rather than 64x64 (0.043); 64x64 still at 16x4096x4096, with
  // 12 stages (0.0185 ms against 0.0193 with 8, session 24). At most 16 or 32 rows: the same
  // tiles with A boxes of 16 or 32 rows and deeper rings (session 25: 1x14336x4096 64x128 0.034
  // ms against 0.037 with 64-row boxes; 16x4096x4096 64x64 0.0175 against 0.0183; 8x5120x5120
  // 64x64 0.019 against 64x128's 0.025; 32x8192x4096 0.023 against 0.024).
  const TileConfig mid8{64, 128, 64, 64, 128, 8, Backend::Wgmma};
  BOOST_TEST((defaultTile(prepared(77, 4096, 11008, false), 90, 132) == mid8));
  BOOST_TEST((defaultTile(prepared(77, 4096, 11008, true), 90, 132) == mid8));
  for (auto [m, n, k, transB, name] : {std::tuple<int64_t, int64_t, int64_t, bool, const char*>{
                                           1, 11008, 4096, true, "64x128x64_w1x1_s11_a16_wgmma"},
                                       {1, 14336, 4096, true, "64x128x64_w1x1_s11_a16_wgmma"},
                                       {16, 4096, 4096, false, "64x64x64_w1x1_s20_a16_wgmma"},
                                       {8, 5120, 5120, true, "64x64x64_w1x1_s20_a16_wgmma"},
                                       {32, 8192, 4096, true, "64x64x64_w1x1_s17_a32_wgmma"},
                                       {24, 14336, 4096, true, "64x128x64_w1x1_s10_a32_wgmma"}})
    BOOST_TEST(defaultTile(prepared(m, n, k, transB), 90, 132).str() == name);
  BOOST_TEST(defaultTile(prepared(33, 4096, 4096, true), 90, 132).aRows == 0);
  // Not where TMA cannot run, not for norm_gemm.
  BOOST_TEST(!defaultTile(noTmaProblem(4096, 4096), 90, 132).wgmma());
  BOOST_TEST(!defaultTile(normProblem(4096, 4096), 90, 132).wgmma());
  DeviceLimits d = recorded("h200.json");
  auto space = searchSpace(d, false, problem(4096, 4096), 8);
  BOOST_TEST(space.size() == 8u);
  for (const TileConfig& t : space)
    BOOST_TEST(t.wgmma(), t.str()); // the wgmma kernels lead the ranking on sm_90
  for (const TileConfig& t : searchSpace(d, false, noTmaProblem(4096, 4096), 100))
    BOOST_TEST(!t.wgmma(), t.str());
  for (const TileConfig& t : searchSpace(d, false, normProblem(4096, 4096), 100))
    BOOST_TEST(!t.wgmma(), t.str());
  // Other GPUs never get it.
  for (const TileConfig& t : searchSpace(recorded("t4.json"), false, problem(4096, 4096), 100))
    BOOST_TEST(!t.wgmma(), t.str());
}

BOOST_AUTO_TEST_CASE(unaligned_problems_get_narrow_warp_tiles) {
  // N of B [K, N] (or K, before sm_90) not a multiple of 8: bounds-checked loads, no TMA. 64x64
  // warp tiles spilled 430-720 bytes there on sm_90 with every pattern (the tuner rejected the
  // heuristic's choice: no configuration at all with one candidate); 64x32 warp tiles spill
  // nothing.
  using codegen::defaultTile;
  const codegen::GemmProblem wide = codegen::gemmProblem(640, 4100, 4097, false);
  BOOST_TEST(!wide.vec);
  BOOST_TEST(!wide.tma);
  BOOST_TEST((defaultTile(wide, 90, 132) == TileConfig{128, 128, 64, 64, 32, 3}));
  BOOST_TEST((defaultTile(wide, 80, 108) == TileConfig{128, 128, 64, 64, 32, 3}));
  BOOST_TEST((defaultTile(codegen::gemmProblem(640, 4100, 4096, false), 90, 132) ==
              TileConfig{128, 128, 64, 64, 32, 3})); // K aligned
  BOOST_TEST((defaultTile(codegen::gemmProblem(100, 300, 1001, true), 80, 108) ==
              TileConfig{64, 64, 32, 32, 32, 3}));
  // K % 8 != 0 alone: the wgmma backend on padded copies of A (and B [N, K]).
  for (bool transB : {false, true}) {
    const codegen::GemmProblem padded = codegen::gemmProblem(640, 4104, 4097, transB);
    BOOST_TEST(!padded.vec);
    BOOST_TEST(padded.tma);
    BOOST_TEST(defaultTile(padded, 90, 132).wgmma());
  }
  // Aligned but without TMA (a dimension beyond 2^31 aside, norm_gemm): the wide tiles as before.
  BOOST_TEST(
      (defaultTile(noTmaProblem(8192, 4096), 90, 132) == TileConfig{256, 128, 64, 64, 64, 3}));
  // The search space: the heuristic first, then every 64x64 warp tile after all narrower ones.
  const std::vector<TileConfig> space = searchSpace(recorded("h200.json"), false, wide, 1000);
  BOOST_TEST((space[0] == defaultTile(wide, 90, 132)));
  bool wideSeen = false;
  for (size_t i = 1; i < space.size(); ++i) {
    BOOST_TEST(!space[i].wgmma(), space[i].str());
    const bool w = space[i].wm * space[i].wn >= 64 * 64;
    BOOST_TEST((!wideSeen || w), space[i].str() << " after a 64x64 warp tile");
    wideSeen = wideSeen || w;
  }
  BOOST_TEST(wideSeen);
}

BOOST_AUTO_TEST_CASE(a_rejected_batch_is_followed_by_the_next_configurations) {
  // Where every candidate is rejected the tuner goes on down the ranked space, never timing a
  // configuration twice, until the space runs out.
  const std::vector<TileConfig> space =
      searchSpace(recorded("h200.json"), false, codegen::gemmProblem(640, 4100, 4097, false), 1000);
  BOOST_REQUIRE(space.size() > 20u);
  std::vector<TileConfig> tried(space.begin(), space.begin() + 8);
  std::vector<TileConfig> next = nextCandidates(space, tried, 8);
  BOOST_TEST(next.size() == 8u);
  for (size_t i = 0; i < next.size(); ++i)
    BOOST_TEST((next[i] == space[8 + i]), next[i].str()); // in ranked order, after the tried
  // Tried out of order, a batch of zero (as one), the space's end.
  tried = {space[1], space[3]};
  next = nextCandidates(space, tried, 0);
  BOOST_REQUIRE(next.size() == 1u);
  BOOST_TEST((next[0] == space[0]));
  next = nextCandidates(space, tried, 3);
  BOOST_REQUIRE(next.size() == 3u);
  BOOST_TEST((next[1] == space[2] && next[2] == space[4]));
  BOOST_TEST(nextCandidates(space, space, 8).empty());
  std::vector<TileConfig> allButLast(space.begin(), space.end() - 1);
  next = nextCandidates(space, allButLast, 8);
  BOOST_REQUIRE(next.size() == 1u);
  BOOST_TEST((next[0] == space.back()));
}

BOOST_AUTO_TEST_CASE(search_space_respects_an_sm75_device) {
  DeviceLimits d = recorded("t4.json");
  for (const TileConfig& t : searchSpace(d, true, problem(4096, 4096, true), 100)) {
    BOOST_TEST(t.stages == 2, t.str());
    BOOST_TEST(codegen::gemmSmemBytes(t, true) <= 65536, t.str());
  }
  TileConfig huge{256, 128, 64, 64, 32, 2}; // 106 KB of shared memory
  BOOST_TEST(staticReject(huge, false, d).find("bytes of shared memory") != std::string::npos);
  TileConfig deep{128, 128, 32, 64, 32, 3};
  BOOST_TEST(staticReject(deep, false, d) == "more than 2 stages needs cp.async (sm_80)");
  TileConfig tooManyFrags{256, 256, 32, 128, 64, 2}; // 32 fragments per warp
  BOOST_TEST(!staticReject(tooManyFrags, false, d).empty());
}

BOOST_AUTO_TEST_CASE(compiled_kernels_are_checked_for_registers_and_spills) {
  DeviceLimits d = recorded("h200.json");
  TileConfig t{128, 128, 32, 64, 32, 3}; // 256 threads
  BOOST_TEST(compiledReject(t, 128, 0, d).empty());
  TileConfig wide{128, 128, 32, 32, 32, 3}; // 512 threads
  BOOST_TEST(compiledReject(wide, 255, 0, d).find("registers per block") != std::string::npos);
  BOOST_TEST(compiledReject(t, 96, 64, d).empty()); // a few spilled words are timed
  BOOST_TEST(compiledReject(t, 96, kMaxSpillBytes + 4, d).find("spills") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(bad_device_descriptions_are_errors) {
  BOOST_CHECK_THROW(DeviceLimits::fromJson("{\"arch\": 90"), std::exception);
  BOOST_CHECK_THROW(DeviceLimits::fromJson("{\"arch\": 90}"), std::exception);
}

BOOST_AUTO_TEST_CASE(cache_round_trip) {
  TempCache tc;
  {
    TuningCache c(tc.path);
    BOOST_TEST(!c.lookup(key("a")).has_value());
    c.store(key("a"), Entry{{64, 128, 32, 32, 64, 4}, 0.25, 0.5, 16, {}});
  }
  TuningCache again(tc.path);
  auto e = again.lookup(key("a"));
  BOOST_REQUIRE(e.has_value());
  BOOST_TEST((e->config == TileConfig{64, 128, 32, 32, 64, 4}));
  BOOST_TEST(e->ms == 0.25);
  BOOST_TEST(e->heuristicMs == 0.5);
  // Every part of the key matters: shape, toolkit and template versions.
  BOOST_TEST(!again.lookup(key("a", 2048)).has_value());
  Key other = key("a");
  other.nvccVersion = "Build cuda_13.1";
  BOOST_TEST(!again.lookup(other).has_value());
  other = key("a");
  other.templateVersion = "t2";
  BOOST_TEST(!again.lookup(other).has_value());
  BOOST_TEST(again.takeWarnings().empty());
  // A cluster size survives the round trip.
  const TileConfig clustered{128, 256, 64, 64, 256, 3, codegen::Backend::Wgmma, 2, true};
  again.store(key("b"), Entry{clustered, 0.1, 0.2, 4, {}});
  auto b = TuningCache(tc.path).lookup(key("b"));
  BOOST_REQUIRE(b.has_value());
  BOOST_TEST((b->config == clustered));
  // So does a short A box.
  const TileConfig decode = *TileConfig::parse("64x128x64_w1x1_s11_a16_wgmma");
  again.store(key("d"), Entry{decode, 0.02, 0.03, 2, {}});
  auto d = TuningCache(tc.path).lookup(key("d"));
  BOOST_REQUIRE(d.has_value());
  BOOST_TEST(d->config.str() == decode.str());
  // A cluster size or raster the kernels do not have makes the entry malformed: ignored with a
  // warning, never a configuration codegen would reject later.
  std::string text;
  {
    std::ifstream in(tc.path);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (auto [from, to, which] :
       {std::tuple<std::string, std::string, std::string>{"\"cluster\": 2", "\"cluster\": 3", "b"},
        {"\"raster\": \"n\"", "\"raster\": \"z\"", "b"},
        {"\"backend\": \"wgmma\"", "\"backend\": \"wmma\"", "b"},
        {"\"a_rows\": 16", "\"a_rows\": 24", "d"},
        // Sizes no template implements (a zero tile divided by zero in fpatc; others reached
        // nvcc as static_assert failures): rejected like any malformed entry.
        {"\"bm\": 128", "\"bm\": 0", "b"},
        {"\"wm\": 64", "\"wm\": 0", "b"},
        {"\"bm\": 128", "\"bm\": -64", "b"},
        {"\"stages\": 11", "\"stages\": 0", "d"},
        {"\"bk\": 64", "\"bk\": 7", "d"}})
    BOOST_TEST_CONTEXT(to) {
      const size_t at = text.find(from, text.find(key(which).str()));
      BOOST_REQUIRE(at != std::string::npos);
      std::string bad = text;
      bad.replace(at, from.size(), to);
      std::ofstream(tc.path, std::ios::trunc) << bad;
      TuningCache c(tc.path);
      BOOST_TEST(!c.lookup(key(which)).has_value());
      auto w = c.takeWarnings();
      BOOST_REQUIRE(w.size() == 1u);
      BOOST_TEST(w[0].find("malformed") != std::string::npos, w[0]);
    }
}

BOOST_AUTO_TEST_CASE(corrupt_caches_are_moved_aside_and_rebuilt) {
  // A reader ignores a bad file with a warning and changes nothing; the next writer moves it
  // aside and starts afresh. Warnings never quote the file's bytes.
  for (const char* junk : {"{\"schema\": 1, \"entries\": {\"x\": ", "not json at all \x01\x02",
                           "{\"schema\": 0, \"entries\": {}}", "[1, 2, 3]", ""}) {
    BOOST_TEST_CONTEXT("junk " << junk) {
      TempCache tc;
      std::ofstream(tc.path) << junk;
      TuningCache c(tc.path);
      auto count = [&](const char* part) {
        int n = 0;
        for (const auto& f : fs::directory_iterator(tc.dir))
          n += f.path().filename().string().find(part) != std::string::npos;
        return n;
      };
      BOOST_TEST(!c.lookup(key("a")).has_value());
      auto w = c.takeWarnings();
      BOOST_REQUIRE(w.size() == 1u); // an empty file is corrupt too
      BOOST_TEST(w[0].find("ignored") != std::string::npos, w[0]);
      BOOST_TEST(w[0].find("json at all") == std::string::npos, w[0]);
      BOOST_TEST(w[0].find('\x01') == std::string::npos);
      BOOST_TEST(count(".bad-") == 0); // reading changes nothing
      BOOST_TEST(count(".lock") == 0); // and takes no lock
      c.store(key("b"), Entry{{64, 64, 32, 32, 32, 3}, 1, 1, 1, {}});
      w = c.takeWarnings();
      BOOST_REQUIRE(w.size() == 1u);
      BOOST_TEST(w[0].find("moved to") != std::string::npos, w[0]);
      BOOST_TEST(count(".bad-") == 1);
      BOOST_TEST(TuningCache(tc.path).lookup(key("b")).has_value());
    }
  }
}

BOOST_AUTO_TEST_CASE(a_newer_or_misplaced_cache_is_left_alone) {
  // A file a newer fpat wrote (higher schema) is not moved aside by an older one, not even by
  // a writer: its entries stay for the newer binary. A directory in its place is reported as
  // such.
  TempCache tc;
  const std::string newer = "{\"schema\": 999, \"entries\": {\"k\": 1}}";
  std::ofstream(tc.path) << newer;
  TuningCache c(tc.path);
  BOOST_TEST(!c.lookup(key("a")).has_value());
  c.store(key("b"), Entry{{64, 64, 32, 32, 32, 3}, 1, 1, 1, {}});
  auto w = c.takeWarnings();
  BOOST_REQUIRE(w.size() == 2u);
  BOOST_TEST(w[0].find("schema 999") != std::string::npos, w[0]);
  BOOST_TEST(w[1].find("left as it is") != std::string::npos, w[1]);
  std::string text;
  BOOST_REQUIRE(readFile(tc.path, text));
  BOOST_TEST(text == newer);

  TempCache dir;
  fs::create_directories(dir.path);
  TuningCache d(dir.path);
  BOOST_TEST(!d.lookup(key("a")).has_value());
  d.store(key("b"), Entry{{64, 64, 32, 32, 32, 3}, 1, 1, 1, {}});
  w = d.takeWarnings();
  BOOST_REQUIRE(w.size() == 2u);
  BOOST_TEST(w[0].find("is a directory") != std::string::npos, w[0]);
  BOOST_TEST(w[0].find("JSON") == std::string::npos, w[0]);
  BOOST_TEST(fs::is_directory(dir.path));
}

BOOST_AUTO_TEST_CASE(concurrent_writers_lose_no_entries) {
  TempCache tc;
  const int procs = 6, perProc = 15;
  std::vector<pid_t> pids;
  for (int p = 0; p < procs; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      TuningCache c(tc.path);
      for (int i = 0; i < perProc; ++i)
        c.store(key("p" + std::to_string(p) + "_" + std::to_string(i)),
                Entry{{64, 64, 32, 32, 32, 2 + i % 3}, double(i), double(p), i, {}});
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  TuningCache c(tc.path);
  BOOST_TEST(c.size() == static_cast<size_t>(procs * perProc));
  for (int p = 0; p < procs; ++p)
    for (int i = 0; i < perProc; ++i) {
      auto e = c.lookup(key("p" + std::to_string(p) + "_" + std::to_string(i)));
      BOOST_REQUIRE(e.has_value());
      BOOST_TEST(e->config.stages == 2 + i % 3);
    }
  BOOST_TEST(c.takeWarnings().empty());
}

BOOST_AUTO_TEST_CASE(the_192_wide_tile_where_its_waves_are_whole) {
  // 1500x4104: 264 tiles of 128x192 fill two waves of 132 SMs, 128x256 leaves the second 55%
  // full (measured on the H200: 128x192 0.0355 ms, 128x256 0.0372, 128x128 0.0411; bench/RESULTS.md
  // session 14). Where 128x256 fills its waves as well, it stays the choice (192 is 3-5% slower
  // per tile).
  using codegen::defaultTile;
  const TileConfig t192 = *TileConfig::parse("128x192x64_w2x1_s4_wgmma");
  BOOST_TEST((defaultTile(codegen::gemmProblem(1500, 4104, 1000, false), 90, 132) == t192));
  BOOST_TEST((defaultTile(codegen::gemmProblem(1500, 4104, 1000, true), 90, 132) == t192));
  for (auto [m, n] : {std::pair<int64_t, int64_t>{4096, 4096}, {4096, 14336}, {1024, 4096}})
    BOOST_TEST(defaultTile(codegen::gemmProblem(m, n, 4096, false), 90, 132).bn != 192,
               m << "x" << n);
  // A tile of the kernel, in the tuner's space; clusters cannot split it in 64-column halves.
  BOOST_TEST(staticReject(t192, false, recorded("h200.json")).empty());
  BOOST_TEST(!TileConfig::parse("128x192x64_w2x1_s4_wgmma_c2"));
}

BOOST_AUTO_TEST_CASE(b_rows_off_128_bytes_prefer_tiles_that_share_b) {
  // N = 4104 with B [K, N]: each B tile load is slow, so tiles loading B once per 256 rows (or
  // per two clustered M-tiles) win where there are several waves (measured on the H200,
  // bench/RESULTS.md session 14: 4096x4104x4096 256x128 0.197 ms, 128x192 0.247; 1536x4104x4096
  // 128x128 in clusters 0.083, 128x192 0.094). B [N, K], or N = 4224, keeps the usual choice.
  using codegen::defaultTile;
  BOOST_TEST(!codegen::gemmProblem(4096, 4104, 4096, false).bRows128);
  BOOST_TEST(codegen::gemmProblem(4096, 4104, 4096, true).bRows128);
  BOOST_TEST((defaultTile(codegen::gemmProblem(4096, 4104, 4096, false), 90, 132) ==
              *TileConfig::parse("256x128x64_w2x1_s4_wgmma")));
  BOOST_TEST(defaultTile(codegen::gemmProblem(1536, 4104, 4096, false), 90, 132).bn != 192);
  BOOST_TEST(defaultTile(codegen::gemmProblem(1536, 4104, 4096, true), 90, 132).cluster == 1);
  BOOST_TEST(defaultTile(codegen::gemmProblem(1536, 4224, 4096, false), 90, 132).cluster == 1);
}

BOOST_AUTO_TEST_CASE(prepared_weights_are_their_own_problem) {
  // A weight B that is read from a prepared [N, K] copy is a K-major problem to the heuristics
  // (TMA can run it, its rows are 128-byte aligned) and its own cache entry; the cp.async
  // kernels still read it as given (16-byte loads need N % 8 == 0).
  for (testing::Shape s : {testing::Shape{1536, 4104, 4096}, testing::Shape{600, 4100, 1000}}) {
    ir::Graph plain = testing::fuse(testing::caseGraph("gemm_residual", s));
    ir::Graph weights = testing::fuse(testing::caseGraph("gemm_residual", s, true));
    const ir::Vertex v = plain.outputs()[0], w = weights.outputs()[0];
    BOOST_TEST(!codegen::preparesWeightB(plain, v));
    BOOST_TEST(codegen::preparesWeightB(weights, w));
    const codegen::GemmProblem p = codegen::gemmProblemOf(plain, v),
                               q = codegen::gemmProblemOf(weights, w);
    BOOST_TEST(p.tma == (s.n % 8 == 0));
    BOOST_TEST(q.tma);
    BOOST_TEST(!p.bRows128);
    BOOST_TEST(q.bRows128);
    BOOST_TEST(q.vec == p.vec);
    const Key kp = keyFor(plain, v, testing::builtinLibrary().activations, 90, "nvcc-x"),
              kw = keyFor(weights, w, testing::builtinLibrary().activations, 90, "nvcc-x");
    BOOST_TEST(kw.signature == kp.signature + ":bprep");
    TempCache tc;
    TuningCache c(tc.path);
    codegen::CodegenOptions o;
    o.arch = 90;
    o.sms = 132;
    BOOST_TEST(
        (choose(weights, w, testing::builtinLibrary().activations, c, 90, 132, "nvcc-x", false)
             .config ==
         codegen::generate(weights, w, testing::builtinLibrary().activations, o).tile));
  }
}

BOOST_AUTO_TEST_CASE(without_a_cache_entry_the_heuristic_picks) {
  TempCache tc;
  TuningCache c(tc.path);
  ir::Graph f = testing::fuse(testing::caseGraph("gemm_bias_gelu", {2048, 4096, 4096}));
  ir::Vertex v = f.outputs()[0];
  BOOST_TEST(tunable(f, v));
  Choice ch = choose(f, v, testing::builtinLibrary().activations, c, 90, 132, "nvcc-x", false);
  BOOST_TEST(ch.source == "heuristic");
  BOOST_TEST((ch.config == codegen::defaultTile(codegen::gemmProblemOf(f, v), 90, 132)));
  // Once tuned (here: stored by hand), the cache answers, unless retuning is asked for.
  Key k = keyFor(f, v, testing::builtinLibrary().activations, 90, "nvcc-x");
  BOOST_TEST(k.signature == "gemm:gemm_bias_gelu,gelu(bias_add(acc, $2)):vec");
  c.store(k, Entry{{128, 256, 32, 64, 64, 3}, 0.3, 0.4, 10, {}});
  ch = choose(f, v, testing::builtinLibrary().activations, c, 90, 132, "nvcc-x", false);
  BOOST_TEST(ch.source == "cache");
  BOOST_TEST(ch.config.str() == "128x256x32_w2x4_s3");
  BOOST_TEST(
      choose(f, v, testing::builtinLibrary().activations, c, 90, 132, "nvcc-x", true).source ==
      "heuristic");
}

BOOST_AUTO_TEST_CASE(the_heuristic_is_the_code_generators_default) {
  // choose() answers what the code generator would pick by itself: an epilogue that reads an
  // [M, N] operand changes the choice (at 1000x4104 it ranks the deep rings lower), and where
  // TMA cannot run (N % 8 != 0 with B [K, N]) the default is not a wgmma configuration.
  TempCache tc;
  TuningCache c(tc.path);
  for (auto [name, shape] : {std::pair{"gemm_residual", testing::Shape{1000, 4104, 4096}},
                             {"gemm_bias_gelu", testing::Shape{1000, 4104, 4096}},
                             {"gemm_residual", testing::Shape{512, 500, 100}},
                             {"gemm_residual", testing::Shape{512, 512, 100}},
                             {"gemm", testing::Shape{2048, 4096, 4096}}}) {
    ir::Graph f = testing::fuse(testing::caseGraph(name, shape));
    const ir::Vertex v = f.outputs()[0];
    codegen::CodegenOptions o;
    o.arch = 90;
    o.sms = 132;
    const codegen::KernelUnit u = codegen::generate(f, v, testing::builtinLibrary().activations, o);
    const Choice ch =
        choose(f, v, testing::builtinLibrary().activations, c, 90, 132, "nvcc-x", false);
    BOOST_TEST((ch.config == u.tile), name << " " << shape.str() << ": " << ch.config.str()
                                           << " against " << u.tile.str());
  }
}

namespace {

/// One attention op (q [B Sq, 4 d], k and v [B Sk, 2 d]: GQA 2), batch 2; `causal`: a causal
/// weight (bottom-right, -inf), else a zero bias.
ir::Graph attentionOp(int64_t sq, int64_t sk, int64_t d, bool causal,
                      ir::DType dt = ir::DType::F16) {
  ir::GraphBuilder b("attention");
  auto q = b.input("q", {2 * sq, 4 * d}, dt);
  auto k = b.input("k", {2 * sk, 2 * d}, dt);
  auto v = b.input("v", {2 * sk, 2 * d}, dt);
  ir::Value m;
  if (causal) {
    std::vector<float> data(static_cast<size_t>(sq * sk));
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t j = 0; j < sk; ++j)
        data[static_cast<size_t>(i * sk + j)] =
            j > i + sk - sq ? -std::numeric_limits<float>::infinity() : 0.0f;
    m = b.weight("mask", {1, 1, sq, sk}, dt, data);
  } else {
    m = b.constant(0.0, {}, dt);
  }
  b.output(b.attention(q, k, v, m, b.constant(0.125, {}, dt), 2, d, "o"));
  return b.build();
}

} // namespace

BOOST_AUTO_TEST_CASE(flash_configurations_round_trip_their_names) {
  using codegen::FlashConfig;
  for (const char* name : {"128oprd", "128oprdt", "176opr", "64sp", "192o", "128oprt"}) {
    auto f = FlashConfig::parse(name);
    BOOST_TEST_REQUIRE(f.has_value(), name);
    BOOST_TEST(f->str() == name);
  }
  // FPAT_FLASH's spelling: "o" optional, letters in any order.
  BOOST_TEST(FlashConfig::parse("128prdt")->str() == "128oprdt");
  BOOST_TEST(FlashConfig::parse("128tdrp")->str() == "128oprdt");
  // Not a configuration: other block sizes, unknown or repeated letters, "o" with "s", the
  // counter without resident CTAs, three consumers with blocks of more than 128 keys.
  for (const char* bad : {"", "p", "96p", "128x", "128pp", "128os", "128pd", "176prt", "1280",
                          "128prd\xff", "00128p"})
    BOOST_TEST(!FlashConfig::parse(bad).has_value(), bad);
}

BOOST_AUTO_TEST_CASE(attention_ops_on_the_flash_kernel_are_tunable) {
  // The heuristic's configuration first, then each variant once, each one the kernel
  // implements at these sizes: at d 128 no three consumers, at d 64 none with 176-key blocks.
  for (auto [d, causal] : {std::pair{int64_t{64}, true},
                           {int64_t{64}, false},
                           {int64_t{128}, true},
                           {int64_t{128}, false}})
    BOOST_TEST_CONTEXT("d " << d << (causal ? ", causal" : "")) {
      const ir::Graph g = attentionOp(600, 600, d, causal);
      const ir::Vertex v = g.outputs()[0];
      BOOST_TEST(tunable(g, v, 90));
      BOOST_TEST(!tunable(g, v, 80)); // the CUDA-core kernel has nothing to choose
      auto t = codegen::flashTuning(g, v, 90);
      BOOST_TEST_REQUIRE(t.has_value());
      BOOST_TEST(t->m == 1200);
      BOOST_TEST(t->n == 4 * d);
      BOOST_TEST(t->k == 600);
      codegen::CodegenOptions o;
      const std::string heuristic =
          codegen::generate(g, v, testing::builtinLibrary().activations, o).name;
      BOOST_TEST(heuristic.ends_with("_" + t->candidates.at(0).str()), heuristic);
      std::set<std::string> names;
      for (const codegen::FlashConfig& f : t->candidates) {
        BOOST_TEST(names.insert(f.str()).second, f.str() << " twice");
        BOOST_TEST((f.consumers == 2 || (d == 64 && f.bn <= 128)), f.str());
        BOOST_TEST((f.resident || causal), f.str()); // one CTA a tile: only for causal tiles
        // The configuration reaches the kernel.
        o.flash = &f;
        BOOST_TEST(codegen::generate(g, v, testing::builtinLibrary().activations, o)
                       .name.ends_with("_" + f.str()));
      }
      BOOST_TEST(names.size() == (d == 64 ? 6u : 4u) + (causal ? 1u : 0u));
    }
  // The decode kernel (one query row) and other head dimensions: nothing to tune.
  const ir::Graph decode = attentionOp(1, 600, 128, false);
  BOOST_TEST(!tunable(decode, decode.outputs()[0], 90));
  const ir::Graph d80 = attentionOp(600, 600, 80, false);
  BOOST_TEST(!tunable(d80, d80.outputs()[0], 90));
}

BOOST_AUTO_TEST_CASE(flash_configurations_are_cached_and_chosen) {
  TempCache tc;
  TuningCache c(tc.path);
  const ir::Graph g = attentionOp(600, 600, 64, true);
  const ir::Vertex v = g.outputs()[0];
  const auto& acts = testing::builtinLibrary().activations;
  Choice ch = choose(g, v, acts, c, 90, 132, "nvcc-x", false);
  BOOST_TEST(ch.source == "heuristic");
  BOOST_TEST_REQUIRE(ch.flash.has_value());
  BOOST_TEST(ch.configName() == codegen::flashTuning(g, v, 90)->candidates.at(0).str());
  // The key says what the kernel computes: sizes, mask, element type, scale.
  const Key k = keyFor(g, v, acts, 90, "nvcc-x");
  BOOST_TEST(k.signature == "flash_attention_b2_h4_kv2_q600_k600_d64_causal_f16");
  BOOST_TEST((k.m == 1200 && k.n == 256 && k.k == 600));
  const ir::Graph bf = attentionOp(600, 600, 64, true, ir::DType::BF16);
  BOOST_TEST(keyFor(bf, bf.outputs()[0], acts, 90, "nvcc-x").signature ==
             "flash_attention_b2_h4_kv2_q600_k600_d64_causal_bf16");
  const ir::Graph none = attentionOp(600, 600, 64, false);
  BOOST_TEST(keyFor(none, none.outputs()[0], acts, 90, "nvcc-x").signature ==
             "flash_attention_b2_h4_kv2_q600_k600_d64_none_f16");
  // Stored (here by hand), read back from the file, chosen; --retune ignores it.
  Entry e;
  e.flash = codegen::FlashConfig::parse("128opd");
  BOOST_TEST(!e.flash.has_value()); // (the counter needs resident CTAs)
  e.flash = codegen::FlashConfig::parse("176oprd");
  e.ms = 0.2;
  e.heuristicMs = 0.25;
  e.candidates = 7;
  c.store(k, e);
  TuningCache again(tc.path);
  ch = choose(g, v, acts, again, 90, 132, "nvcc-x", false);
  BOOST_TEST(ch.source == "cache");
  BOOST_TEST(ch.configName() == "176oprd");
  BOOST_TEST(ch.ms == 0.2);
  BOOST_TEST(choose(g, v, acts, again, 90, 132, "nvcc-x", true).source == "heuristic");
  // FPAT_FLASH (an experiment's knob) wins over the cache.
  setenv("FPAT_FLASH", "64prd", 1);
  ch = choose(g, v, acts, again, 90, 132, "nvcc-x", false);
  unsetenv("FPAT_FLASH");
  BOOST_TEST(ch.source == "heuristic");
  BOOST_TEST(ch.configName() == "64oprd");
  std::string text;
  BOOST_TEST_REQUIRE(readFile(tc.path, text));
  BOOST_TEST(text.find("\"walk\": \"counter\"") != std::string::npos);
  BOOST_TEST(text.find("\"config_name\": \"176oprd\"") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(malformed_flash_entries_are_ignored_with_a_warning) {
  // A flash entry the kernel does not implement, or with fields missing, is reported and
  // left out; the heuristic picks instead.
  const ir::Graph g = attentionOp(600, 600, 128, false);
  const ir::Vertex v = g.outputs()[0];
  const auto& acts = testing::builtinLibrary().activations;
  const Key k = keyFor(g, v, acts, 90, "nvcc-x");
  for (
      const char* config :
      {R"({"kernel": "flash_attention", "bn": 96, "consumers": 2, "overlap": true, "turns": true, "walk": "stride"})",
       R"({"kernel": "flash_attention", "bn": 176, "consumers": 3, "overlap": true, "turns": true, "walk": "stride"})",
       R"({"kernel": "flash_attention", "bn": 128, "consumers": 2, "overlap": true, "turns": true, "walk": "sideways"})",
       R"({"kernel": "flash_attention", "bn": 128, "consumers": 4, "overlap": true, "turns": true, "walk": "grid"})",
       R"({"kernel": "flash_attention", "bn": 128})", R"({"kernel": "conv", "bn": 128})"})
    BOOST_TEST_CONTEXT(config) {
      TempCache tc;
      {
        std::ofstream f(tc.path);
        f << R"({"schema": 1, "entries": {")" << k.str() << R"(": {"config": )" << config
          << R"(, "ms": 0.1}}})";
      }
      TuningCache c(tc.path);
      BOOST_TEST(!c.lookup(k).has_value());
      const std::vector<std::string> w = c.takeWarnings();
      BOOST_TEST_REQUIRE(w.size() == 1u);
      BOOST_TEST(w[0].find("is malformed") != std::string::npos, w[0]);
      BOOST_TEST(choose(g, v, acts, c, 90, 132, "nvcc-x", false).source == "heuristic");
    }
}
