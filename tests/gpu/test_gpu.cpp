// The GPU suite: each of the nine patterns and each fallback kernel, run on the GPU at aligned
// and ragged shapes and compared with the CPU reference. Without a GPU the whole suite exits
// with 77, which ctest reports as skipped. FPAT_GPU_QUICK=1 keeps to small shapes (for
// compute-sanitizer, which slows kernels down a hundredfold).
#define BOOST_TEST_MODULE gpu
#include "../common/TestGraphs.h"
#include "fpat/ir/Reference.h"
#include "fpat/ir/text/Text.h"
#include "fpat/runtime/Pipeline.h"
#include "fpat/tune/Tuner.h"

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <unistd.h>

using namespace fpat;
using namespace fpat::testing;

namespace {

cuda::Driver* gpu() {
  return cuda::Driver::get(nullptr);
}

bool quick() {
  const char* q = std::getenv("FPAT_GPU_QUICK");
  return q && *q && std::string(q) != "0";
}

/// M, N, K drawn from {1, 17, 64, 100, 1000, 4096}: aligned, ragged and degenerate mixes.
std::vector<Shape> shapes() {
  if (quick())
    return {{64, 64, 64}, {17, 100, 40}, {1, 17, 64}, {100, 64, 17}};
  return {{64, 64, 64},    {1000, 4096, 64}, {4096, 64, 1000}, {17, 100, 1000},
          {100, 1000, 17}, {1, 17, 4096},    {1, 1, 1},        {4096, 1000, 100}};
}

std::string cacheDir() {
  if (const char* d = std::getenv("FPAT_CACHE_DIR"); d && *d)
    return d;
  return (std::filesystem::temp_directory_path() / "fpat-gpu-test-cache").string();
}

runtime::BuildOptions buildOptions() {
  runtime::BuildOptions o;
  o.arch = gpu()->device().arch;
  o.sms = gpu()->device().sms;
  o.cacheDir = cacheDir();
  return o;
}

/// GEMM configurations run by tile_configurations_match_the_reference (sm_80+): both backends,
/// the software-pipelined loop with 2, 3 and 4 stages and 32- and 64-deep k-tiles, the large
/// 64x64-warp tiles the heuristic picks on the H200.
const std::vector<codegen::TileConfig>& configTiles() {
  static const std::vector<codegen::TileConfig> t = {
      {128, 256, 64, 64, 64, 3},
      {256, 128, 64, 64, 64, 4, codegen::Backend::MmaSync},
      {128, 128, 32, 64, 32, 2},
      {128, 128, 32, 64, 32, 3, codegen::Backend::MmaSync},
      {64, 64, 64, 32, 32, 4, codegen::Backend::MmaSync}};
  return t;
}
const char* const kConfigCases[] = {
    "gemm",           "gemm_bt",      "gemm_bias_gelu",          "gemm_bias_residual",
    "layernorm_gemm", "rmsnorm_gemm", "layernorm_gemm_bias_gelu"};
/// The deferred norms' epilogues: none, bias and GeLU, a bias alone (Qwen2's QKV), bias and
/// ReLU (OPT's fc1).
const char* const kDeferredCases[] = {"rmsnorm_gemm", "layernorm_gemm", "layernorm_gemm_bias_gelu",
                                      "rmsnorm_gemm_bias", "layernorm_gemm_bias_relu"};
const Shape kConfigShapes[] = {Shape{64, 64, 64}, Shape{17, 100, 1000}, Shape{1000, 520, 64},
                               Shape{1, 17, 40}, Shape{1000, 1000, 1000}};

/// The wgmma backend (sm_90 only): each tile shape of the template at its deepest ring, every
/// GEMM-family epilogue, both B layouts, at aligned and ragged shapes: M = 1, N = 8 and N not a
/// multiple of the tile, K a multiple of 8 but not of the 64-deep k-tile, K = 8, and shapes
/// where TMA cannot run (K or N not a multiple of 8: the fallback must be right too); N = 1
/// runs on wgmma for B [N, K] and falls back for B [K, N].
std::vector<codegen::TileConfig> wgmmaTiles() {
  std::vector<codegen::TileConfig> t;
  for (const codegen::TileConfig& c : codegen::wgmmaConfigs())
    if (t.empty() || t.back().bm != c.bm || t.back().bn != c.bn || t.back().cluster != c.cluster ||
        t.back().backend != c.backend || t.back().rasterN != c.rasterN ||
        t.back().aRows != c.aRows ||
        codegen::wgmmaEpilogueTile(t.back(), 520) != codegen::wgmmaEpilogueTile(c, 520))
      t.push_back(c); // each shape, with and without the TMA-stored epilogue tile
  return t;
}
const char* const kWgmmaCases[] = {"gemm",           "gemm_bt",       "gemm_bias_gelu",
                                   "gemm_bias_silu", "gemm_bias",     "gemm_bias_residual",
                                   "gemm_silu",      "gemm_residual", "gemm_silu_mul"};
// Aligned, ragged, degenerate (M = 1, N = 1, K = 8) and TMA-incompatible shapes (N % 8 != 0
// with B [K, N]); 1000x1000x40 gives CTAs several tiles of one k-tile each (the epilogue tile's
// hand-over between tiles); K % 8 != 0 runs on padded copies (64x64x100, 130x136x1001, and
// 33x72x7: less than one 16-byte row). 13x264x4104 is a decode shape for the short A boxes
// (13 of a box's 16 rows, 65 k-tiles: the deepest ring wraps three times; few tiles, split in k).
const Shape kWgmmaShapes[] = {Shape{64, 64, 64},     Shape{1, 8, 8},        Shape{1000, 520, 72},
                              Shape{129, 264, 4104}, Shape{1000, 1000, 40}, Shape{17, 100, 1000},
                              Shape{64, 64, 100},    Shape{1, 17, 40},      Shape{100, 1, 64},
                              Shape{130, 136, 1001}, Shape{33, 72, 7},      Shape{13, 264, 4104}};

/// prepared_weights_match_the_reference: weights B that TMA reads badly as given, N % 8 != 0,
/// N % 64 != 0, K % 8 != 0, M = 1; the default configuration, clusters, ping-pong.
const char* const kPreparedCases[] = {"gemm", "gemm_bt", "gemm_residual", "gemm_bias_gelu",
                                      "gemm_silu_mul"};
std::vector<Shape> preparedShapes() {
  std::vector<Shape> s = {{77, 100, 64}, {130, 1000, 136}, {33, 72, 7}, {1, 17, 40}};
  if (!quick())
    s.insert(s.end(), {Shape{65, 4100, 1001}, Shape{600, 4104, 3072}});
  return s;
}
/// The deferred norm's configurations: the heuristic's, clusters, ping-pong (one and two m64
/// MMAs per consumer), a 256-row tile (two per consumer), a short A box (16 rows).
std::vector<std::optional<codegen::TileConfig>> normConfigs() {
  std::vector<std::optional<codegen::TileConfig>> c = {std::nullopt};
  for (const char* t :
       {"128x256x64_w2x1_s3_wgmma_c2", "64x256x64_w1x1_s5_pingpong", "128x128x64_w1x1_s6_pingpong"})
    c.push_back(codegen::TileConfig::parse(t));
  for (const codegen::TileConfig& t : codegen::wgmmaConfigs())
    if ((t.bm == 256 && c.size() == 4) || (t.aRows == 16 && t.bn == 64 && c.size() == 5))
      c.push_back(t);
  return c;
}

std::vector<std::optional<codegen::TileConfig>> preparedConfigs() {
  std::vector<std::optional<codegen::TileConfig>> c = {std::nullopt};
  for (const char* t : {"128x256x64_w2x1_s3_wgmma_c2", "64x256x64_w1x1_s5_pingpong"})
    c.push_back(codegen::TileConfig::parse(t));
  return c;
}

/// Whether this run includes test case NAME (not filtered out by --run_test): a run of one
/// case compiles that case's kernels only, so that the suite can be run in shards.
bool runs(const std::string& name) {
  namespace utf = boost::unit_test;
  const utf::test_unit_id id = utf::framework::master_test_suite().get(name);
  return id != utf::INV_TEST_UNIT_ID && utf::framework::get(id, utf::TUT_ANY).is_enabled();
}

/// Without a GPU the suite ends here with 77 (ctest: skipped). Otherwise every kernel of every
/// case this run includes is compiled up front, in parallel, so the cases find them cached.
struct GpuSetup {
  GpuSetup() {
    std::string why;
    if (!cuda::Driver::get(&why)) {
      std::cout << "GPU suite skipped: " << why << std::endl;
      std::exit(77);
    }
    std::vector<codegen::KernelUnit> units;
    codegen::CodegenOptions c;
    c.arch = gpu()->device().arch;
    c.sms = gpu()->device().sms;
    for (const std::string& name : caseNames())
      for (Shape s : runs(name) ? shapes() : std::vector<Shape>{}) {
        ir::Graph f = fuse(caseGraph(name, s));
        for (ir::Vertex v : f.vertices())
          units.push_back(codegen::generate(f, v, builtinLibrary().activations, c));
      }
    if (c.arch >= 80 && runs("tile_configurations_match_the_reference"))
      for (const char* name : kConfigCases)
        for (Shape s : kConfigShapes)
          for (const codegen::TileConfig& t : configTiles()) {
            if (quick() && s.m * s.n * s.k > 1000000)
              continue;
            ir::Graph f = fuse(caseGraph(name, s));
            codegen::CodegenOptions ct = c;
            ct.tile = &t;
            for (ir::Vertex v : f.vertices())
              units.push_back(codegen::generate(f, v, builtinLibrary().activations, ct));
          }
    if (c.arch == 90 && runs("wgmma_configurations_match_the_reference"))
      for (const char* name : kWgmmaCases)
        for (Shape s : kWgmmaShapes)
          for (const codegen::TileConfig& t : wgmmaTiles()) {
            ir::Graph f = fuse(caseGraph(name, s));
            codegen::CodegenOptions ct = c;
            ct.tile = &t;
            for (ir::Vertex v : f.vertices())
              units.push_back(codegen::generate(f, v, builtinLibrary().activations, ct));
          }
    if (c.arch == 90 && runs("deferred_norms_match_the_reference"))
      for (const char* name : kDeferredCases)
        for (Shape s : {Shape{1, 17, 40}, Shape{7, 100, 64}, Shape{333, 1000, 1003},
                        Shape{130, 1000, 136}, Shape{2047, 5120, 2048}, Shape{600, 4104, 3072}})
          for (const auto& t : normConfigs()) {
            ir::Graph f = fuse(caseGraph(name, s, true));
            codegen::CodegenOptions ct = c;
            ct.tile = t ? &*t : nullptr;
            for (ir::Vertex v : f.vertices())
              units.push_back(codegen::generate(f, v, builtinLibrary().activations, ct));
          }
    if (c.arch == 90 && runs("prepared_weights_match_the_reference"))
      for (const char* name : kPreparedCases)
        for (Shape s : preparedShapes())
          for (const auto& t : preparedConfigs()) {
            ir::Graph f = fuse(caseGraph(name, s, true));
            codegen::CodegenOptions ct = c;
            ct.tile = t ? &*t : nullptr;
            for (ir::Vertex v : f.vertices())
              units.push_back(codegen::generate(f, v, builtinLibrary().activations, ct));
          }
    runtime::NvccOptions n;
    n.arch = c.arch;
    n.cacheDir = cacheDir();
    for (const runtime::CompiledKernel& k : runtime::compileAll(units, n))
      if (!k.error.empty())
        std::cerr << k.error;
  }
};
BOOST_TEST_GLOBAL_FIXTURE(GpuSetup);

void runCase(const std::string& name, Shape s, uint64_t seed) {
  BOOST_TEST_CONTEXT(name << " at M x N x K = " << s.str()) {
    ir::Graph g = caseGraph(name, s);
    ir::Graph f = fuse(g);
    runtime::BuildResult b = runtime::buildKernels(f, builtinLibrary().activations, buildOptions());
    BOOST_TEST_REQUIRE(b.error.empty(), b.error);
    auto inputs = ir::randomInputs(g, seed);
    auto want = ir::evaluate(g, inputs, builtinLibrary().referenceActivations());
    runtime::Executor ex(*gpu(), b.graph);
    runtime::RunResult r = ex.run(inputs, /*poison=*/true);
    BOOST_TEST_REQUIRE(r.outputs.size() == g.outputs().size());
    for (size_t i = 0; i < g.outputs().size(); ++i) {
      runtime::Agreement a = runtime::compareToReference(r.outputs[i], want[g.outputs()[i]]);
      BOOST_TEST(a.pass, "max abs err " << a.maxAbs << ", max rel err " << a.maxRel
                                        << ", non-finite " << a.nonFinite);
    }
  }
}

/// Runs case `name` at `s` with configuration `t` forced and compares its output with the CPU
/// reference; returns the configuration the GEMM op actually ran with (codegen falls back
/// where a backend cannot run the shape).
/// Sets an environment variable for a scope (the Executor reads FPAT_SPLIT_LAST_WAVE when built).
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name))
      old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
  const char* name_;
  std::optional<std::string> old_;
};

codegen::TileConfig runWithTile(const std::string& name, Shape s, const codegen::TileConfig& t,
                                uint64_t seed, int runs = 1) {
  ir::Graph g = caseGraph(name, s);
  ir::Graph f = fuse(g);
  runtime::BuildOptions o = buildOptions();
  o.tile = &t;
  runtime::BuildResult b = runtime::buildKernels(f, builtinLibrary().activations, o);
  BOOST_TEST_REQUIRE(b.error.empty(), b.error);
  auto inputs = ir::randomInputs(g, seed);
  auto want = ir::evaluate(g, inputs, builtinLibrary().referenceActivations());
  runtime::Executor ex(*gpu(), b.graph);
  for (int run = 0; run < runs; ++run) {
    runtime::RunResult r = ex.run(inputs, true);
    runtime::Agreement a = runtime::compareToReference(r.outputs[0], want[g.outputs()[0]]);
    BOOST_TEST(a.pass,
               "run " << run << ": max rel err " << a.maxRel << ", non-finite " << a.nonFinite);
  }
  return b.graph.units[f.outputs()[0]].tile;
}

} // namespace

BOOST_AUTO_TEST_CASE(device_is_described) {
  const cuda::DeviceInfo& d = gpu()->device();
  BOOST_TEST_MESSAGE("device: " << d.name << ", sm_" << d.arch << ", " << d.sms << " SMs, "
                                << d.smemOptin << " bytes of opt-in shared memory");
  BOOST_TEST(d.arch >= 75);
  BOOST_TEST(d.sms > 0);
}

// One test case per pattern and per fallback kernel; each runs every shape.
#define FPAT_GPU_CASE(id)                                                                          \
  BOOST_AUTO_TEST_CASE(id) {                                                                       \
    uint64_t seed = 1;                                                                             \
    for (Shape s : shapes())                                                                       \
      runCase(#id, s, seed++);                                                                     \
  }
FPAT_GPU_CASE(gemm_bias_gelu)
FPAT_GPU_CASE(gemm_bias_silu)
FPAT_GPU_CASE(gemm_bias_relu)
FPAT_GPU_CASE(gemm_bias)
FPAT_GPU_CASE(gemm_bias_residual)
FPAT_GPU_CASE(gemm_gelu)
FPAT_GPU_CASE(gemm_silu)
FPAT_GPU_CASE(gemm_relu)
FPAT_GPU_CASE(gemm_bias_quick_gelu)
FPAT_GPU_CASE(gemm_residual)
FPAT_GPU_CASE(gemm_bias_residual2)
FPAT_GPU_CASE(gemm_residual2)
FPAT_GPU_CASE(gemm_silu_mul)
FPAT_GPU_CASE(layernorm_gemm)
FPAT_GPU_CASE(rmsnorm_gemm)
FPAT_GPU_CASE(layernorm_gemm_bias_gelu)
FPAT_GPU_CASE(layernorm_gemm_bias)
FPAT_GPU_CASE(rmsnorm_gemm_bias)
FPAT_GPU_CASE(layernorm_gemm_bias_relu)
FPAT_GPU_CASE(rmsnorm_gemm_relu)
FPAT_GPU_CASE(gemm_bias_gelu_erf)
FPAT_GPU_CASE(layernorm_gemm_gelu_erf)
FPAT_GPU_CASE(gemm)
FPAT_GPU_CASE(gemm_bt)
FPAT_GPU_CASE(bias_add)
FPAT_GPU_CASE(activation_gelu_erf)
FPAT_GPU_CASE(activation_leaky_relu)
FPAT_GPU_CASE(add)
FPAT_GPU_CASE(mul)
FPAT_GPU_CASE(layernorm)
FPAT_GPU_CASE(rmsnorm)
FPAT_GPU_CASE(softmax)

BOOST_AUTO_TEST_CASE(tile_configurations_match_the_reference) {
  // Each configuration at aligned and ragged shapes (K not a multiple of the k-tile, M and N
  // not multiples of the CTA tile), both B layouts, both norms.
  if (gpu()->device().arch < 80)
    return;
  for (const char* name : kConfigCases)
    for (Shape s : kConfigShapes)
      for (const codegen::TileConfig& t : configTiles())
        if (!(quick() && s.m * s.n * s.k > 1000000))
          BOOST_TEST_CONTEXT(name << " " << s.str() << " " << t.str()) {
            runWithTile(name, s, t, 11);
          }
}

BOOST_AUTO_TEST_CASE(wgmma_configurations_match_the_reference) {
  if (gpu()->device().arch != 90)
    return;
  int onWgmma = 0;
  for (const char* name : kWgmmaCases)
    for (Shape s : kWgmmaShapes)
      for (const codegen::TileConfig& t : wgmmaTiles())
        BOOST_TEST_CONTEXT(name << " " << s.str() << " " << t.str()) {
          const codegen::TileConfig ran = runWithTile(name, s, t, 13);
          const bool tma = codegen::tmaCompatible(s.m, s.n, s.k, std::string(name) == "gemm_bt");
          BOOST_TEST(ran.wgmma() == tma, "ran as " << ran.str());
          // A configuration runs as forced wherever TMA can run the shape and, with a short A
          // box, the box holds its rows (otherwise the code generator falls back).
          if (tma && t.runsRows(s.m))
            BOOST_TEST(ran.str() == t.str());
          onWgmma += ran.wgmma();
        }
  BOOST_TEST(onWgmma > 0);
}

BOOST_AUTO_TEST_CASE(deferred_epilogues_at_ragged_shapes) {
  // 160 tiles of 64x64 with 48 k-tiles, the last row and column of them ragged: CTAs with two
  // tiles hand the first to the helper warps (kDefer), edge tiles included; [M, N] operands
  // come to them through the side buffer (kSide), the last tile's into the tile (kPre).
  if (gpu()->device().arch != 90)
    return;
  // Without the last wave split in k (a deferred epilogue with a side buffer assumes whole
  // tiles throughout, so the split turns it off).
  ScopedEnv noSplit("FPAT_SPLIT_LAST_WAVE", "0");
  const codegen::TileConfig t = *codegen::TileConfig::parse("64x64x64_w1x1_s8_wgmma");
  for (const char* name :
       {"gemm_bias_gelu", "gemm_silu", "gemm_silu_mul", "gemm_residual", "gemm_bias_residual"})
    BOOST_TEST_CONTEXT(name) {
      BOOST_TEST(runWithTile(name, Shape{600, 1000, 3072}, t, 31).wgmma());
    }
}

BOOST_AUTO_TEST_CASE(last_wave_split_at_ragged_shapes) {
  // Tile counts that are not a multiple of the SMs (132 on the H200): the last wave's tiles
  // are cut into k-pieces that the CTAs take round-robin; the last piece of a tile adds the
  // others' partial sums (workspace, flags) and runs the epilogue. 160 and 288 tiles of 64x64
  // with 32 and 48 k-tiles (two pieces; at 288 two waves of whole tiles first, their GeLU
  // epilogues deferred to the helpers); 2 and 1 k-tiles (too short: nothing split); ragged
  // edges; each run twice (the flags must be back at zero); 128x256 with 153 tiles.
  if (gpu()->device().arch != 90)
    return;
  const codegen::TileConfig small = *codegen::TileConfig::parse("64x64x64_w1x1_s8_wgmma");
  const codegen::TileConfig wide = *codegen::TileConfig::parse("128x256x64_w2x1_s3_wgmma");
  for (Shape s : {Shape{600, 1000, 2048}, Shape{600, 1000, 3072}, Shape{1000, 1104, 3072},
                  Shape{600, 1000, 104}, Shape{600, 1000, 40}})
    for (const char* name : {"gemm_bias_gelu", "gemm_residual", "gemm_silu_mul", "gemm_bt"})
      if (!quick() || s.k <= 2048) // the sanitizers: the shorter shapes, one of them split
        BOOST_TEST_CONTEXT(name << " " << s.str()) {
          BOOST_TEST(runWithTile(name, s, small, 41, 2).wgmma());
        }
  if (!quick())
    for (const char* name : {"gemm_residual", "gemm_bias_gelu"})
      BOOST_TEST_CONTEXT(name << " 1100x4200x2560 " << wide.str()) {
        BOOST_TEST(runWithTile(name, Shape{1100, 4200, 2560}, wide, 43, 2).wgmma());
      }
  // Fewer tiles than SMs: the grid takes every SM and all tiles are split (32 tiles of 64x64
  // in two pieces; 12 tiles of 64x128 with 172 k-tiles in three, M below a tile).
  const codegen::TileConfig mid = *codegen::TileConfig::parse("64x128x64_w1x1_s8_wgmma");
  for (const char* name : {"gemm_residual", "gemm_bias_gelu", "gemm_silu_mul", "gemm_bt"}) {
    BOOST_TEST_CONTEXT(name << " 77x1000x4096 " << small.str()) {
      BOOST_TEST(runWithTile(name, Shape{77, 1000, 4096}, small, 47, 2).wgmma());
    }
    if (!quick())
      BOOST_TEST_CONTEXT(name << " 50x1496x11000 " << mid.str()) {
        BOOST_TEST(runWithTile(name, Shape{50, 1496, 11000}, mid, 53, 2).wgmma());
      }
  }
}

BOOST_AUTO_TEST_CASE(short_tiles_in_turn_at_ragged_shapes) {
  // 372 tiles of 128x256 with 3 k-tiles (too short to defer): about three tiles per CTA take
  // turns on the epilogue tile, the last row and column ragged; with clusters of two as well
  // (their odd last M-tile lies below the matrix, computed, not stored).
  if (gpu()->device().arch != 90)
    return;
  for (const codegen::TileConfig& t : wgmmaTiles())
    if (t.bm == 128 && t.bn == 256 && t.backend == codegen::Backend::Wgmma &&
        codegen::wgmmaEpilogueTile(t, 3000))
      for (const char* name : {"gemm_bias_gelu", "gemm_silu"})
        BOOST_TEST_CONTEXT(name << " " << t.str()) {
          BOOST_TEST(runWithTile(name, Shape{3900, 3000, 136}, t, 37).wgmma());
        }
}

/// The kernels of fused graph `f`, with configuration `cfg` forced where it has one.
runtime::BuildResult buildForced(const ir::Graph& f,
                                 const std::optional<codegen::TileConfig>& cfg) {
  runtime::BuildOptions o = buildOptions();
  if (cfg)
    o.tile = &*cfg;
  return runtime::buildKernels(f, builtinLibrary().activations, o);
}

BOOST_AUTO_TEST_CASE(prepared_weights_match_the_reference) {
  // Weights B that TMA reads badly as given (B [K, N] with N % 64 != 0, N % 8 != 0 included;
  // B [N, K] with K % 8 != 0) are copied into [N, K] rows when uploaded. Each case runs, then
  // its timing rotations are checked (their prepared copies are copies of the first), then it
  // runs again with new weight values: the copy must follow the upload.
  if (gpu()->device().arch != 90)
    return;
  for (const char* name : kPreparedCases)
    for (Shape s : preparedShapes())
      for (const auto& cfg : preparedConfigs())
        BOOST_TEST_CONTEXT(name << " " << s.str() << " " << (cfg ? cfg->str() : "default")) {
          ir::Graph g = caseGraph(name, s, /*weights=*/true);
          ir::Graph f = fuse(g);
          runtime::BuildResult b = buildForced(f, cfg);
          BOOST_TEST_REQUIRE(b.error.empty(), b.error);
          const ir::Vertex out = f.outputs()[0];
          const codegen::KernelUnit& u = b.graph.units[out];
          const bool bt = std::string(name) == "gemm_bt";
          BOOST_TEST(u.preparedB == (bt ? s.k % 8 != 0 : s.n % 64 != 0));
          BOOST_TEST(u.tile.wgmma());
          runtime::Executor ex(*gpu(), b.graph);
          for (uint64_t seed : {uint64_t{51}, uint64_t{52}}) {
            auto inputs = ir::randomInputs(g, seed);
            auto want = ir::evaluate(g, inputs, builtinLibrary().referenceActivations());
            runtime::RunResult r = ex.run(inputs, true);
            runtime::Agreement a = runtime::compareToReference(r.outputs[0], want[g.outputs()[0]]);
            BOOST_TEST(a.pass, "seed " << seed << ": max rel err " << a.maxRel << ", non-finite "
                                       << a.nonFinite);
            if (seed != 51)
              continue;
            ex.ensureRotations(2);
            ex.launchAll(false, 1);
            gpu()->synchronize();
            std::vector<uint16_t> bits(static_cast<size_t>(s.m * s.n));
            gpu()->copyToHost(bits.data(), ex.devicePointer(out, 1), bits.size() * 2);
            ir::Tensor rot{r.outputs[0].desc, {}};
            for (uint16_t h : bits)
              rot.data.push_back(ir::fromBits(h, rot.desc.dtype));
            runtime::Agreement ar = runtime::compareToReference(rot, want[g.outputs()[0]]);
            BOOST_TEST(ar.pass,
                       "rotation 1: max rel err " << ar.maxRel << ", non-finite " << ar.nonFinite);
          }
        }
}

BOOST_AUTO_TEST_CASE(deferred_norms_match_the_reference) {
  // norm_gemm with W, gamma and beta weights on the Hopper backend: the GEMM on raw x with
  // gamma folded into B, rstd (and LayerNorm's mean correction) in the epilogue, statistics
  // from a launch the GEMM overlaps. Ragged shapes (M = 1, N odd, K % 8 != 0), each schedule,
  // the last wave split, new weight values after the first run; and rows with a large mean
  // (the mean correction subtracts two large terms), f16 and within the usual tolerance.
  if (gpu()->device().arch != 90)
    return;
  // FPAT_GPU_QUICK (the sanitizers): fewer shapes and configurations, one of them realistic.
  std::vector<Shape> shapes = {{1, 17, 40}, {333, 1000, 1003}, {130, 1000, 136}};
  std::vector<std::optional<codegen::TileConfig>> configs = normConfigs();
  if (quick()) {
    configs.resize(4);
  } else {
    shapes.insert(shapes.end(),
                  {Shape{7, 100, 64}, Shape{2047, 5120, 2048}, Shape{600, 4104, 3072}});
  }
  for (const char* name : kDeferredCases)
    for (Shape s : shapes)
      for (const auto& cfg : configs)
        BOOST_TEST_CONTEXT(name << " " << s.str() << " " << (cfg ? cfg->str() : "default")) {
          ir::Graph g = caseGraph(name, s, /*weights=*/true);
          ir::Graph f = fuse(g);
          runtime::BuildResult b = buildForced(f, cfg);
          BOOST_TEST_REQUIRE(b.error.empty(), b.error);
          const codegen::KernelUnit& u = b.graph.units[f.outputs()[0]];
          BOOST_TEST((u.deferredNorm != ir::NormKind::None));
          BOOST_TEST(u.tile.wgmma());
          runtime::Executor ex(*gpu(), b.graph);
          for (uint64_t seed : {uint64_t{61}, uint64_t{62}, uint64_t{63}}) {
            if (quick() && seed == 62)
              continue;
            auto inputs = ir::randomInputs(g, seed);
            if (seed == 63) // rows of mean 40 +- 8 and spread about 1: |mean| >> sigma
              for (size_t i = 0; i < inputs["x"].data.size(); ++i)
                inputs["x"].data[i] = ir::roundTo(
                    inputs["x"].data[i] + 40.0 + 8.0 * std::sin(double(i / s.k)), ir::DType::F16);
            auto want = ir::evaluate(g, inputs, builtinLibrary().referenceActivations());
            runtime::RunResult r = ex.run(inputs, true);
            runtime::Agreement a = runtime::compareToReference(r.outputs[0], want[g.outputs()[0]]);
            BOOST_TEST(a.pass, "seed " << seed << ": max rel err " << a.maxRel << ", non-finite "
                                       << a.nonFinite);
            std::cout << "deferred norm " << name << " " << s.str() << " "
                      << (cfg ? cfg->str() : u.tile.str()) << " seed " << seed << ": max rel err "
                      << a.maxRel << "\n";
          }
        }
}

/// A gated MLP's first half as a model writes it: act(n Wg) * (n Wu), n = rmsnorm(x) or x; the
/// weights are `weight`s ([H, K] as nn.Linear stores them with `bt`, else [K, H]).
ir::Graph gatedGraph(int64_t m, int64_t k, int64_t h, const char* act, bool norm, bool bt) {
  const std::string w = bt ? "[" + std::to_string(h) + ", " + std::to_string(k) + "]"
                           : "[" + std::to_string(k) + ", " + std::to_string(h) + "]";
  const std::string tb = bt ? " {transpose_b}" : "";
  const std::string a = norm ? "%n" : "%x";
  const std::string text =
      "graph gated {\n  %x = input : f16[" + std::to_string(m) + ", " + std::to_string(k) + "]\n" +
      (norm ? "  %g = weight : f16[" + std::to_string(k) + "]\n" : std::string()) +
      "  %wg = weight : f16" + w + "\n  %wu = weight : f16" + w + "\n" +
      (norm ? "  %n = rmsnorm %x, %g {eps = 1e-06}\n" : "") + "  %gate = gemm " + a + ", %wg" + tb +
      "\n  %up = gemm " + a + ", %wu" + tb + "\n  %act = activation %gate {fn = " + act +
      "}\n  %h = mul %act, %up\n  output %h\n}\n";
  SourceManager sm;
  DiagEngine d(sm);
  auto g = ir::parseGraph(sm.addBuffer("gated.fgraph", text), d, builtinLibrary().activationSet());
  BOOST_TEST_REQUIRE(g.has_value(), text);
  return *g;
}

BOOST_AUTO_TEST_CASE(dual_gemms_match_the_reference) {
  // The dual GEMM of gated MLPs: Wg and Wu interleaved into one prepared copy, the epilogue
  // combining each thread's gate and up columns, with and without the RMSNorm deferred in
  // front. Ragged shapes (M = 1, odd H, K % 8 != 0), both B layouts, each schedule, the last
  // wave split, new weight values after the first run.
  if (gpu()->device().arch != 90)
    return;
  struct Dims {
    int64_t m, k, h;
  };
  std::vector<Dims> dims = {{1, 64, 17}, {333, 1003, 1000}, {130, 136, 2752}, {7, 40, 100}};
  // normConfigs and a tile of 192 columns (the result's tile then 96: not whole slabs of 64).
  std::vector<std::optional<codegen::TileConfig>> configs = normConfigs();
  configs.insert(configs.begin() + 2, codegen::TileConfig::parse("128x192x64_w2x1_s4_wgmma"));
  if (quick())
    configs.resize(3);
  else
    dims.insert(dims.end(), {Dims{2047, 2048, 5504}, Dims{600, 1024, 4099}});
  for (const char* act : {"silu", "gelu"})
    for (bool norm : {true, false})
      for (bool bt : {true, false})
        for (Dims s : dims)
          for (const auto& cfg : configs) {
            if ((!bt || std::string(act) == "gelu") && cfg && cfg != configs[1])
              continue; // the layouts and GeGLU with two configurations only
            BOOST_TEST_CONTEXT(act << (norm ? " rmsnorm" : "") << (bt ? " bt " : " ") << s.m << "x"
                                   << s.k << "x" << s.h << " " << (cfg ? cfg->str() : "default")) {
              ir::Graph g = gatedGraph(s.m, s.k, s.h, act, norm, bt);
              ir::Graph f = fuse(g);
              runtime::BuildResult b = buildForced(f, cfg);
              BOOST_TEST_REQUIRE(b.error.empty(), b.error);
              const codegen::KernelUnit& u = b.graph.units[f.outputs()[0]];
              BOOST_TEST_REQUIRE(u.dual);
              BOOST_TEST((u.deferredNorm != ir::NormKind::None) == norm);
              runtime::Executor ex(*gpu(), b.graph);
              for (uint64_t seed : {uint64_t{71}, uint64_t{72}}) {
                if (quick() && seed == 72)
                  continue;
                auto inputs = ir::randomInputs(g, seed);
                auto want = ir::evaluate(g, inputs, builtinLibrary().referenceActivations());
                runtime::RunResult r = ex.run(inputs, true);
                runtime::Agreement a =
                    runtime::compareToReference(r.outputs[0], want[g.outputs()[0]]);
                BOOST_TEST(a.pass, "seed " << seed << ": max rel err " << a.maxRel
                                           << ", non-finite " << a.nonFinite);
              }
            }
          }
}

BOOST_AUTO_TEST_CASE(wgmma_realistic_shape) {
  // LLM-sized problems with both B layouts, the default configuration and each tile shape of
  // both schedules: the persistent schedule walks many tiles per CTA and the ring wraps many
  // times (ping-pong's hand-over between consumers only shows there). FPAT_GPU_QUICK (the
  // compute-sanitizer run) keeps the default configuration and one with clusters of two (its
  // remote arrivals and multicasts): the sanitizers see them too.
  if (gpu()->device().arch != 90)
    return;
  std::vector<std::optional<codegen::TileConfig>> configs = {std::nullopt};
  for (const codegen::TileConfig& t : wgmmaTiles())
    if (!quick() || (t.cluster > 1 && configs.size() == 1))
      configs.push_back(t);
  for (const char* name : {"gemm_bias_gelu", "gemm_bt", "gemm_silu_mul", "gemm_residual"})
    for (const auto& cfg : configs)
      BOOST_TEST_CONTEXT(name << " " << (cfg ? cfg->str() : std::string("default"))) {
        // 256 tiles of 128x256 with 48 k-tiles: CTAs with two tiles hand the first one's
        // activation epilogue to the helper warps (fpat_wgmma.cuh, kDefer).
        const Shape s{2048, 4096, 3072};
        ir::Graph g = caseGraph(name, s);
        ir::Graph f = fuse(g);
        runtime::BuildOptions o = buildOptions();
        if (cfg)
          o.tile = &*cfg;
        runtime::BuildResult b = runtime::buildKernels(f, builtinLibrary().activations, o);
        BOOST_TEST_REQUIRE(b.error.empty(), b.error);
        BOOST_TEST(b.graph.units[f.outputs()[0]].tile.wgmma());
        auto inputs = ir::randomInputs(g, 29);
        runtime::Executor ex(*gpu(), b.graph);
        runtime::RunResult r = ex.run(inputs, true);
        // The CPU reference on 16 sampled rows (the whole product takes minutes on the CPU).
        std::vector<int64_t> rows;
        for (int64_t i = 0; i < 16; ++i)
          rows.push_back(i * (s.m - 1) / 15);
        ir::Graph small = caseGraph(name, {16, s.n, s.k});
        // Every input with one row per output row (x, a residual, SwiGLU's up) is sliced.
        std::map<std::string, ir::Tensor> in = inputs;
        for (auto& [inputName, t] : in) {
          if (t.desc.shape.size() != 2 || t.desc.shape[0] != s.m)
            continue;
          const int64_t w = t.desc.shape[1];
          ir::Tensor sliced{{{16, w}, t.desc.dtype}, {}};
          for (int64_t row : rows)
            sliced.data.insert(sliced.data.end(), inputs.at(inputName).data.begin() + row * w,
                               inputs.at(inputName).data.begin() + (row + 1) * w);
          t = sliced;
        }
        ir::Tensor want =
            ir::evaluate(small, in, builtinLibrary().referenceActivations())[small.outputs()[0]];
        ir::Tensor got{want.desc, {}};
        for (int64_t row : rows)
          got.data.insert(got.data.end(), r.outputs[0].data.begin() + row * s.n,
                          r.outputs[0].data.begin() + (row + 1) * s.n);
        runtime::Agreement a = runtime::compareToReference(got, want);
        BOOST_TEST(a.pass, "max rel err " << a.maxRel << ", non-finite " << a.nonFinite);
      }
}

BOOST_AUTO_TEST_CASE(activation_math_is_within_one_ulp) {
  // The CUDA lowering of activation bodies (float arithmetic, exp and division through
  // fpat_exp2f and fpat_divf, alternately in their MUFU and FMA-pipe forms: a few float ulps)
  // against the double-precision reference over a dense sweep: every gelu and silu output
  // within one f16 ulp of the exactly rounded value, plus 4 * 2^-24 absolute for outputs of
  // 1e-6 and less (quick_gelu too).
  for (const char* fn : {"gelu", "silu", "quick_gelu"})
    BOOST_TEST_CONTEXT(fn) {
      ir::ActivationSet acts = builtinLibrary().activationSet();
      ir::GraphBuilder b("sweep", acts);
      b.output(b.activation(b.input("h", {64, 1024}), fn, "y"));
      ir::Graph g = b.build();
      auto inputs = ir::randomInputs(g, 5);
      std::vector<float>& h = inputs.at("h").data;
      for (size_t i = 0; i < h.size(); ++i) // -16 .. 16, rounded to f16
        h[i] = ir::halfBitsToFloat(ir::doubleToHalfBits(-16.0 + 32.0 * i / h.size()));
      runtime::BuildResult r =
          runtime::buildKernels(g, builtinLibrary().activations, buildOptions());
      BOOST_TEST_REQUIRE(r.error.empty(), r.error);
      runtime::Executor ex(*gpu(), r.graph);
      auto got = ex.run(inputs, true).outputs[0].data;
      auto want = ir::evaluate(g, inputs, builtinLibrary().referenceActivations())[g.outputs()[0]];
      size_t worse = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double ref = want.data[i];
        const int e = ref == 0 ? -14 : std::max(std::ilogb(std::abs(ref)), -14); // subnormals
        const double ulp = std::ldexp(1.0, e - 10);
        if (!(std::abs(got[i] - ref) <= ulp + std::ldexp(4.0, -24)))
          ++worse;
      }
      BOOST_TEST(worse == 0u, worse << " of " << got.size() << " outputs off by more than an ulp");
    }
}

/// Every value at an even and at an odd index: kernels evaluate exp and division of odd
/// elements in their FMA-pipe forms (fpat_common.cuh), so each value meets both.
static std::vector<double> atBothParities(const std::vector<double>& v) {
  std::vector<double> out = v;
  if (v.size() % 2 == 0)
    out.push_back(0.0);
  out.insert(out.end(), v.begin(), v.end());
  return out;
}

BOOST_AUTO_TEST_CASE(division_and_exp_at_the_edges_of_the_float_range) {
  // bf16 has f32's exponent range, so its inputs reach what fpat_divf scales for (divisors
  // beyond 2^125 or subnormal) and fpat_exp2f's overflow and flush: reciprocal, sigmoid and exp
  // of zeros, infinities, subnormals and the largest values, each output within one bf16 ulp
  // of the exactly rounded value, infinities and zeros exact; exp may flush results below
  // 2^-126 (where its ex2.approx.ftz does) to zero.
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> xs =
      atBothParities({0.0,   -0.0,  inf,   -inf,    1e-39, -1e-39, 3e-40,  1e-38, 2e-38, 3e38,
                      -3e38, 1e38,  5e37,  1.0,     -1.0,  3.0,    -100.0, -87.0, -88.5, 88.0,
                      89.0,  -1e-3, 1e-30, 65504.0, 7e36,  -7e36,  0.5,    -0.5});
  for (const char* fn : {"reciprocal", "sigmoid", "exp"})
    BOOST_TEST_CONTEXT(fn) {
      ir::ActivationSet acts = builtinLibrary().activationSet();
      ir::GraphBuilder b("edges", acts);
      b.output(b.activation(b.input("x", {1, static_cast<int64_t>(xs.size())}, ir::DType::BF16), fn,
                            "y"));
      ir::Graph g = b.build();
      auto inputs = ir::randomInputs(g, 1);
      std::vector<float>& x = inputs.at("x").data;
      for (size_t i = 0; i < xs.size(); ++i)
        x[i] = ir::roundTo(xs[i], ir::DType::BF16);
      runtime::BuildResult r =
          runtime::buildKernels(g, builtinLibrary().activations, buildOptions());
      BOOST_TEST_REQUIRE(r.error.empty(), r.error);
      runtime::Executor ex(*gpu(), r.graph);
      auto got = ex.run(inputs, true).outputs[0].data;
      BOOST_TEST_REQUIRE(got.size() == xs.size());
      for (size_t i = 0; i < xs.size(); ++i) {
        const double v = x[i];
        const double exact = std::string(fn) == "reciprocal" ? 1.0 / v
                             : std::string(fn) == "sigmoid"  ? 1.0 / (1.0 + std::exp(-v))
                                                             : std::exp(v);
        const double want = ir::roundTo(exact, ir::DType::BF16);
        const double ulp = want == 0 || std::isinf(want)
                               ? 0
                               : std::ldexp(1.0, std::max(std::ilogb(want), -126) - 7);
        const bool flushed = std::string(fn) == "exp" && got[i] == 0 && exact < 0x1p-126;
        BOOST_TEST((got[i] == want || std::abs(got[i] - want) <= ulp || flushed),
                   fn << "(" << v << ") = " << got[i] << ", want " << want);
      }
    }
}

BOOST_AUTO_TEST_CASE(quotients_over_one_at_the_edges_of_f16) {
  // f16 kernels divide by 1 + exp(y) without fpat_divf's scaling (fpat_divf_ge1): sigmoid,
  // silu and gelu of f16's extremes, infinities, subnormals and the region where exp overflows
  // f32, each within one f16 ulp of the exactly rounded value; infinities, zeros and NaN as
  // the reference's.
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> xs =
      atBothParities({0.0,    -0.0,    inf,  -inf,  65504.0, -65504.0, 6e-8,  -6e-8, 1e-4,  -1e-4,
                      1.0,    -1.0,    3.0,  -3.0,  -11.0,   -17.0,    -45.0, -87.0, -88.5, -89.0,
                      -100.0, -1000.0, 20.0, 100.0, -5.5,    -7.25,    -9.0,  0.5});
  for (const char* fn : {"sigmoid", "silu", "gelu"})
    BOOST_TEST_CONTEXT(fn) {
      ir::ActivationSet acts = builtinLibrary().activationSet();
      ir::GraphBuilder b("edges16", acts);
      b.output(b.activation(b.input("x", {1, static_cast<int64_t>(xs.size())}), fn, "y"));
      ir::Graph g = b.build();
      auto inputs = ir::randomInputs(g, 1);
      std::vector<float>& x = inputs.at("x").data;
      for (size_t i = 0; i < xs.size(); ++i)
        x[i] = ir::roundTo(xs[i], ir::DType::F16);
      runtime::BuildResult r =
          runtime::buildKernels(g, builtinLibrary().activations, buildOptions());
      BOOST_TEST_REQUIRE(r.error.empty(), r.error);
      runtime::Executor ex(*gpu(), r.graph);
      auto got = ex.run(inputs, true).outputs[0].data;
      auto exact = ir::evaluate(g, inputs, builtinLibrary().referenceActivations());
      const std::vector<float>& ref = exact[g.outputs()[0]].data;
      BOOST_TEST_REQUIRE(got.size() == xs.size());
      for (size_t i = 0; i < xs.size(); ++i) {
        const double want = ir::roundTo(ref[i], ir::DType::F16);
        const double ulp = want == 0 || std::isinf(want)
                               ? 0
                               : std::ldexp(1.0, std::max(std::ilogb(want), -14) - 10);
        const bool same = std::isnan(want) ? std::isnan(got[i])
                                           : got[i] == want || std::abs(got[i] - want) <= ulp;
        BOOST_TEST(same, fn << "(" << x[i] << ") = " << got[i] << ", want " << want);
      }
    }
}

BOOST_AUTO_TEST_CASE(poisoned_outputs_catch_unwritten_elements) {
  // A kernel that leaves elements unwritten must fail validation: tell the GEMM it has only
  // half of its 64 rows, so rows 32..63 keep the poison.
  ir::Graph g = caseGraph("gemm", {64, 64, 64});
  runtime::BuildResult b =
      runtime::buildKernels(fuse(g), builtinLibrary().activations, buildOptions());
  BOOST_TEST_REQUIRE(b.error.empty(), b.error);
  for (codegen::KernelUnit& u : b.graph.units)
    if (!u.launches.empty()) {
      u.M = 32;
      for (codegen::Launch& l : u.launches)
        for (codegen::TmaMap& m : l.tma)
          if (m.operand == codegen::TmaMap::kOutput)
            m.outer = 32; // TMA stores clip at the map's bounds, not at M
    }
  auto inputs = ir::randomInputs(g, 3);
  auto want = ir::evaluate(g, inputs);
  runtime::Executor ex(*gpu(), b.graph);
  runtime::RunResult r = ex.run(inputs, true);
  runtime::Agreement a = runtime::compareToReference(r.outputs[0], want[g.outputs()[0]]);
  BOOST_TEST(!a.pass);
  BOOST_TEST(a.nonFinite == static_cast<size_t>(32 * 64));
}

/// Attention on token-major activations, as one op and as its decomposition (attn_qk, scale,
/// bias, softmax, attn_pv), at ragged lengths (S = 1, not a multiple of any tile), GQA ratios
/// 1, 4 and 8, no mask, a causal one (bottom-right: Sq <= Sk leaves no row fully masked) and
/// a per-key padding bias ([B, 1, 1, Sk]; [1, 1, 1, Sk] decomposed); f16 and bf16.
/// Builds, runs (outputs poisoned first) and checks an attention graph's one output against
/// the reference in double; returns the run's launches.
int runAttention(const ir::Graph& g, uint64_t seed) {
  runtime::BuildResult r = runtime::buildKernels(g, builtinLibrary().activations, buildOptions());
  BOOST_TEST_REQUIRE(r.error.empty(), r.error);
  auto inputs = ir::randomInputs(g, seed);
  auto want = ir::evaluate(g, inputs, builtinLibrary().referenceActivations());
  runtime::Executor ex(*gpu(), r.graph);
  runtime::RunResult got = ex.run(inputs, /*poison=*/true);
  runtime::Agreement a = runtime::compareToReference(got.outputs[0], want[g.outputs()[0]]);
  BOOST_TEST(a.pass, "max abs err " << a.maxAbs << ", max rel err " << a.maxRel << ", non-finite "
                                    << a.nonFinite);
  return got.launches;
}

BOOST_AUTO_TEST_CASE(attention_matches_the_reference) {
  struct Case {
    int64_t b, sq, sk, h, hkv, d;
    int mask; // 0 none, 1 causal (bottom-right), 2 padding bias [B, 1, 1, Sk], 3 causal filled
              // with -3e38 (Hugging Face's finfo.min)
    ir::DType dt;
  };
  const Case cases[] = {
      {1, 1, 1, 1, 1, 64, 0, ir::DType::F16},
      {2, 7, 5, 4, 2, 16, 2, ir::DType::F16},
      {1, 333, 333, 8, 2, 64, 1, ir::DType::F16},
      {2, 65, 130, 4, 4, 128, 2, ir::DType::BF16},
      {1, 1, 4097, 8, 1, 128, 0, ir::DType::F16},
      {1, 4, 1024, 8, 1, 80, 1, ir::DType::BF16},
      {2, 113, 211, 8, 8, 128, 1, ir::DType::F16},
      // Sizes the sm_90 flash kernel takes (d 64 and 128): several query tiles and key
      // blocks, ragged; MQA; a bias read per score; causal with finfo.min's fill (bf16 keeps
      // it finite); Sq < Sk, causal.
      {2, 300, 300, 4, 1, 128, 1, ir::DType::BF16},
      {1, 257, 1000, 16, 4, 64, 2, ir::DType::F16},
      {3, 129, 129, 2, 2, 64, 0, ir::DType::BF16},
      {1, 200, 520, 4, 2, 128, 3, ir::DType::BF16},
      {2, 64, 777, 8, 2, 64, 1, ir::DType::F16},
      // More tiles than SMs (FPAT_FLASH=...r: each resident CTA walks several tiles, its
      // ring and Q buffer going on from one tile to the next): causal and ragged, and plain.
      {1, 600, 600, 32, 8, 64, 1, ir::DType::F16},
      {2, 300, 500, 24, 8, 128, 0, ir::DType::BF16},
      // The decode kernel (at most 8 query rows per KV head, keys split and merged): Llama-3's
      // heads at batch 16 and a ragged cache, Qwen2's 7 heads a KV head, a cache shorter than
      // one tile, two causal query rows of 4 heads each.
      {16, 1, 5000, 32, 8, 128, 0, ir::DType::BF16},
      {3, 1, 65, 28, 4, 128, 0, ir::DType::F16},
      {2, 1, 63, 8, 8, 64, 0, ir::DType::F16},
      {1, 2, 300, 4, 1, 128, 1, ir::DType::F16},
      // The decode kernel with a bias read per score (exporters' decode steps carry their
      // padding mask): batch 16 over a ragged cache, and two query rows of 4 heads each.
      {16, 1, 5000, 32, 8, 128, 2, ir::DType::BF16},
      {2, 2, 300, 8, 2, 64, 2, ir::DType::F16},
  };
  uint64_t seed = 40;
  for (const Case& c : cases)
    for (bool decomposed : {false, true}) {
      BOOST_TEST_CONTEXT("B " << c.b << ", Sq " << c.sq << ", Sk " << c.sk << ", H " << c.h
                              << ", Hkv " << c.hkv << ", d " << c.d << ", mask " << c.mask << ", "
                              << ir::dtypeName(c.dt) << (decomposed ? ", decomposed" : "")) {
        ir::GraphBuilder b("attention");
        auto q = b.input("q", {c.b * c.sq, c.h * c.d}, c.dt);
        auto k = b.input("k", {c.b * c.sk, c.hkv * c.d}, c.dt);
        auto v = b.input("v", {c.b * c.sk, c.hkv * c.d}, c.dt);
        ir::Value bias;
        if (c.mask == 1 || c.mask == 3) {
          const float fill = c.mask == 1 ? -std::numeric_limits<float>::infinity()
                                         : static_cast<float>(ir::roundTo(-3e38, c.dt));
          std::vector<float> m(static_cast<size_t>(c.sq * c.sk));
          for (int64_t i = 0; i < c.sq; ++i)
            for (int64_t j = 0; j < c.sk; ++j)
              m[static_cast<size_t>(i * c.sk + j)] = j > i + (c.sk - c.sq) ? fill : 0.0f;
          bias = b.weight("mask", {1, 1, c.sq, c.sk}, c.dt, m);
        } else if (c.mask == 2) {
          // (The decomposition's elementwise kernel broadcasts trailing blocks only.)
          bias = b.input("pad", {decomposed ? 1 : c.b, 1, 1, c.sk}, c.dt);
        } else {
          bias = b.constant(0.0, {}, c.dt);
        }
        auto scale = b.constant(1.0 / std::sqrt(static_cast<double>(c.d)), {}, c.dt);
        if (decomposed)
          b.output(b.attnPv(b.softmax(b.add(b.mul(b.attnQk(q, k, c.b, c.d), scale), bias)), v, c.b,
                            c.d, "o"));
        else
          b.output(b.attention(q, k, v, bias, scale, c.b, c.d, "o"));
        runAttention(b.build(), seed++);
      }
    }
}

/// q, k and v as column slices of one fused projection (GPT-2, BLOOM, torch's
/// MultiheadAttention), read in place by every attention kernel: the flash kernel's tensor
/// maps, the decode kernel's q loads and maps, the CUDA-core kernel (head dimensions other than
/// 64 and 128); ragged lengths, GQA, a projection with columns before and after q, k and v, and
/// a decode whose keys and values come from a separate cache.
BOOST_AUTO_TEST_CASE(attention_reads_qkv_columns_in_place) {
  struct Case {
    int64_t b, sq, sk, h, hkv, d;
    bool causal;
    ir::DType dt;
  };
  const Case cases[] = {
      {2, 300, 300, 4, 2, 128, true, ir::DType::F16},
      {1, 129, 129, 12, 12, 64, false, ir::DType::BF16},
      {3, 1, 1, 8, 8, 64, false, ir::DType::F16},
      {2, 1, 700, 8, 2, 128, false, ir::DType::BF16},
      {3, 1, 65, 28, 4, 128, false, ir::DType::F16},
      {2, 7, 7, 4, 2, 80, true, ir::DType::F16},
  };
  uint64_t seed = 90;
  for (const Case& c : cases)
    BOOST_TEST_CONTEXT("B " << c.b << ", Sq " << c.sq << ", Sk " << c.sk << ", H " << c.h
                            << ", Hkv " << c.hkv << ", d " << c.d << (c.causal ? ", causal" : "")
                            << ", " << ir::dtypeName(c.dt)) {
      ir::GraphBuilder b("qkv_in_place");
      const int64_t qw = c.h * c.d, kw = c.hkv * c.d;
      ir::Value q, k, v;
      if (c.sq == c.sk) { // one projection [q | k | v], 8 columns either side
        auto x = b.input("qkv", {c.b * c.sq, 16 + qw + 2 * kw}, c.dt);
        q = b.slice(x, 8, 8 + qw, "q");
        k = b.slice(x, 8 + qw, 8 + qw + kw, "k");
        v = b.slice(x, 8 + qw + kw, 8 + qw + 2 * kw, "v");
      } else { // the new token's q from its projection, k and v from a cache [k | v]
        q = b.slice(b.input("x", {c.b * c.sq, qw + 24}, c.dt), 16, 16 + qw, "q");
        auto cache = b.input("kv", {c.b * c.sk, 2 * kw}, c.dt);
        k = b.slice(cache, 0, kw, "k");
        v = b.slice(cache, kw, 2 * kw, "v");
      }
      ir::Value bias = b.constant(0.0, {}, c.dt);
      if (c.causal) {
        std::vector<float> m(static_cast<size_t>(c.sq * c.sk));
        for (int64_t i = 0; i < c.sq; ++i)
          for (int64_t j = 0; j < c.sk; ++j)
            m[static_cast<size_t>(i * c.sk + j)] =
                j > i + (c.sk - c.sq) ? -std::numeric_limits<float>::infinity() : 0.0f;
        bias = b.weight("mask", {1, 1, c.sq, c.sk}, c.dt, m);
      }
      auto scale = b.constant(1.0 / std::sqrt(static_cast<double>(c.d)), {}, c.dt);
      b.output(b.attention(q, k, v, bias, scale, c.b, c.d, "o"));
      ir::Graph g = b.build();
      for (const char* name : {"q", "k", "v"})
        BOOST_TEST_REQUIRE(ir::isColumnView(g, *g.find(name)), name);
      // The attention (and a decode's merge): no slice kernels.
      BOOST_TEST(runAttention(g, seed++) <= 2);
    }
}

namespace {

/// Runs `g` compiled as `r` (outputs poisoned first) on random inputs and checks every output
/// against the reference; outputs from `exactFrom` on (caches: copies) bit for bit.
void expectCachesAgree(const ir::Graph& g, const runtime::BuildResult& r, uint64_t seed,
                       size_t exactFrom) {
  auto inputs = ir::randomInputs(g, seed);
  auto want = ir::evaluate(g, inputs, builtinLibrary().referenceActivations());
  runtime::Executor ex(*gpu(), r.graph);
  runtime::RunResult got = ex.run(inputs, /*poison=*/true);
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    runtime::Agreement a = runtime::compareToReference(got.outputs[i], want[g.outputs()[i]]);
    BOOST_TEST(a.pass, "output " << i << ": max abs err " << a.maxAbs << ", max rel err "
                                 << a.maxRel << ", non-finite " << a.nonFinite);
    if (i >= exactFrom)
      BOOST_TEST(a.maxAbs == 0.0, "output " << i << ": max abs err " << a.maxAbs);
  }
}

} // namespace

/// A decode or prefill step with a KV cache, as exporters write it (past_key [B, Hkv, P, d]
/// given, present_key its concatenation with the new tokens' keys): kv_append writes the
/// caches, the new keys and values read in place from one projection, and every attention
/// kernel reads them head-major: the decode kernel, the flash kernel (more than 8 query rows a
/// KV head), the CUDA-core kernel (d 80) and the decomposed products; both outputs checked.
/// Each case twice: with kv_append's copy kernels, and (FPAT_DECODE_APPEND=1) with the decode
/// kernel writing the caches itself on sm_90 (codegen::decodeAppend): past rows ragged and in
/// whole tiles, one cached row, a bias tensor (a padding mask) as well.
BOOST_AUTO_TEST_CASE(attention_reads_a_kv_cache) {
  struct Case {
    int64_t b, sq, past, h, hkv, d;
    bool decomposed;
    ir::DType dt;
    bool pad = false; // a bias tensor [B, 1, 1, Sk] read per score, not the causal weight
  };
  const Case cases[] = {
      {2, 1, 700, 8, 2, 128, false, ir::DType::F16},
      {3, 2, 65, 4, 1, 64, false, ir::DType::BF16},
      {2, 7, 300, 8, 2, 64, false, ir::DType::F16},
      {1, 130, 77, 4, 4, 128, false, ir::DType::BF16},
      {1, 3, 50, 4, 1, 80, false, ir::DType::F16},
      {2, 5, 33, 4, 2, 16, true, ir::DType::F16},
      {16, 1, 4001, 32, 8, 128, false, ir::DType::BF16},
      {1, 1, 1, 4, 1, 64, false, ir::DType::F16},
      {2, 1, 320, 8, 2, 128, false, ir::DType::BF16, true},
      {3, 2, 129, 8, 4, 64, false, ir::DType::F16, true},
  };
  uint64_t seed = 140;
  for (const char* append : {"0", "1"})
    for (const Case& c : cases)
      BOOST_TEST_CONTEXT("FPAT_DECODE_APPEND="
                         << append << ", B " << c.b << ", Sq " << c.sq << ", past " << c.past
                         << ", H " << c.h << ", Hkv " << c.hkv << ", d " << c.d
                         << (c.decomposed ? ", decomposed" : "") << (c.pad ? ", pad" : "") << ", "
                         << ir::dtypeName(c.dt)) {
        setenv("FPAT_DECODE_APPEND", append, 1);
        ir::GraphBuilder b("kv_cache");
        const int64_t qw = c.h * c.d, kw = c.hkv * c.d, sk = c.past + c.sq;
        auto x = b.input("qkv", {c.b * c.sq, qw + 2 * kw}, c.dt);
        auto q = b.slice(x, 0, qw, "q");
        auto kc = b.kvAppend(b.input("past_k", {c.b, c.hkv, c.past, c.d}, c.dt),
                             b.slice(x, qw, qw + kw, "k"), "present_k");
        auto vc = b.kvAppend(b.input("past_v", {c.b, c.hkv, c.past, c.d}, c.dt),
                             b.slice(x, qw + kw, qw + 2 * kw, "v"), "present_v");
        std::vector<float> m(static_cast<size_t>(c.sq * sk));
        for (int64_t i = 0; i < c.sq; ++i)
          for (int64_t j = 0; j < sk; ++j)
            m[static_cast<size_t>(i * sk + j)] =
                j > i + c.past ? -std::numeric_limits<float>::infinity() : 0.0f;
        auto bias = c.pad ? b.input("pad", {c.b, 1, 1, sk}, c.dt)
                          : b.weight("mask", {1, 1, c.sq, sk}, c.dt, m);
        auto scale = b.constant(1.0 / std::sqrt(static_cast<double>(c.d)), {}, c.dt);
        if (c.decomposed)
          b.output(b.attnPv(b.softmax(b.add(b.mul(b.attnQk(q, kc, c.b, c.d), scale), bias)), vc,
                            c.b, c.d, "o"));
        else
          b.output(b.attention(q, kc, vc, bias, scale, c.b, c.d, "o"));
        b.output(kc).output(vc);
        ir::Graph g = b.build();
        BOOST_TEST_REQUIRE(ir::isColumnView(g, *g.find("k")));
        runtime::BuildResult r =
            runtime::buildKernels(g, builtinLibrary().activations, buildOptions());
        unsetenv("FPAT_DECODE_APPEND");
        BOOST_TEST_REQUIRE(r.error.empty(), r.error);
        // Where the decode kernel appends, kv_append launches nothing.
        const ir::Vertex att = *r.graph.graph.find("o");
        const bool appends = !r.graph.units[att].extraIns.empty();
        BOOST_TEST(appends == (std::string(append) == "1" && gpu()->device().arch == 90 &&
                               !c.decomposed && c.d != 80 && c.h / c.hkv * c.sq <= 8),
                   r.graph.units[att].name);
        BOOST_TEST(r.graph.units[*r.graph.graph.find("present_k")].launches.empty() == appends);
        expectCachesAgree(g, r, seed++, 1); // the caches: copies
      }
}

/// GPTBigCode's one token-major cache [B*P, 2 Hkv d] (kv_append {batch}), K and V its column
/// views (either first), the new rows columns of one projection: with the copy kernel and
/// (FPAT_DECODE_APPEND=1) with the decode kernel writing the cache; both outputs checked.
BOOST_AUTO_TEST_CASE(attention_reads_a_token_major_cache) {
  struct Case {
    int64_t b, sq, past, h, hkv, d;
    bool kFirst;
    ir::DType dt;
  };
  const Case cases[] = {{2, 1, 300, 8, 1, 128, true, ir::DType::F16},
                        {3, 2, 64, 4, 1, 64, false, ir::DType::BF16},
                        {1, 1, 4001, 16, 2, 128, true, ir::DType::BF16}};
  uint64_t seed = 190;
  for (const char* append : {"0", "1"})
    for (const Case& c : cases)
      BOOST_TEST_CONTEXT("FPAT_DECODE_APPEND="
                         << append << ", B " << c.b << ", Sq " << c.sq << ", past " << c.past
                         << ", H " << c.h << ", Hkv " << c.hkv << ", d " << c.d
                         << (c.kFirst ? "" : ", v first") << ", " << ir::dtypeName(c.dt)) {
        const int64_t w = c.hkv * c.d, qw = c.h * c.d;
        ir::GraphBuilder b("token_major_cache");
        auto x = b.input("qkv", {c.b * c.sq, qw + 2 * w}, c.dt);
        auto present = b.kvAppendRows(b.input("past", {c.b * c.past, 2 * w}, c.dt),
                                      b.slice(x, qw, qw + 2 * w, "kv"), c.b, "present");
        auto k = b.slice(present, c.kFirst ? 0 : w, c.kFirst ? w : 2 * w, "k");
        auto v = b.slice(present, c.kFirst ? w : 0, c.kFirst ? 2 * w : w, "v");
        auto scale = b.constant(1.0 / std::sqrt(static_cast<double>(c.d)), {}, c.dt);
        b.output(b.attention(b.slice(x, 0, qw, "q"), k, v, b.constant(0.0, {}, c.dt), scale, c.b,
                             c.d, "o"));
        b.output(present);
        ir::Graph g = b.build();
        setenv("FPAT_DECODE_APPEND", append, 1);
        runtime::BuildResult r =
            runtime::buildKernels(g, builtinLibrary().activations, buildOptions());
        unsetenv("FPAT_DECODE_APPEND");
        BOOST_TEST_REQUIRE(r.error.empty(), r.error);
        const bool appends = !r.graph.units[*r.graph.graph.find("o")].extraIns.empty();
        BOOST_TEST(appends == (std::string(append) == "1" && gpu()->device().arch == 90));
        expectCachesAgree(g, r, seed++, 1); // the cache: a copy
      }
}

/// q's and k's ropes in the epilogue of their projection (match::ropeIntoEpilogues, after the
/// patterns): both forms, a norm_gemm with the norm deferred and a plain gemm on [N, K], ragged
/// rows (not a multiple of any tile), one token, per-batch tables; against the reference.
BOOST_AUTO_TEST_CASE(ropes_in_the_projection_epilogue_match_the_reference) {
  struct Case {
    int64_t b, s, dm, h, hkv, d;
    bool interleaved, norm, transposeB;
    ir::DType dt;
    int64_t rot = 0; // partial rotary: the first `rot` columns of each head (0: all)
  };
  const Case cases[] = {
      {2, 333, 256, 4, 2, 64, false, true, false, ir::DType::F16},
      {1, 1, 512, 8, 2, 128, false, true, false, ir::DType::BF16},
      {3, 7, 96, 2, 1, 48, true, false, true, ir::DType::F16},
      {1, 300, 2048, 16, 4, 128, false, true, false, ir::DType::BF16},
      {2, 129, 128, 4, 4, 32, true, true, false, ir::DType::F16},
      // GPT-NeoX's quarter, GPT-J's 64 of 256 (as 32 of 128 here), Phi-2's 32 of 80.
      {2, 200, 256, 4, 4, 64, false, false, false, ir::DType::F16, 16},
      {1, 77, 512, 4, 4, 128, true, true, false, ir::DType::BF16, 32},
      {3, 5, 160, 2, 2, 80, false, false, true, ir::DType::F16, 32},
  };
  uint64_t seed = 140;
  for (const Case& c : cases)
    BOOST_TEST_CONTEXT("B " << c.b << ", S " << c.s << ", D " << c.dm << ", H " << c.h << ", Hkv "
                            << c.hkv << ", d " << c.d << (c.interleaved ? ", pairs" : ", halves")
                            << (c.norm ? ", rmsnorm" : "") << (c.transposeB ? ", [N, K]" : "")
                            << (c.rot ? ", rotary " + std::to_string(c.rot) : std::string()) << ", "
                            << ir::dtypeName(c.dt)) {
      ir::GraphBuilder b("rope_epilogue");
      std::mt19937 rng(static_cast<unsigned>(seed));
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      auto values = [&](int64_t n, float scale) {
        std::vector<float> v(static_cast<size_t>(n));
        for (float& x : v)
          x = scale * u(rng);
        return v;
      };
      const int64_t cols = (c.h + 2 * c.hkv) * c.d;
      auto x = b.input("x", {c.b * c.s, c.dm}, c.dt);
      if (c.norm)
        x = b.rmsnorm(x, b.weight("g", {c.dm}, c.dt, values(c.dm, 1.0f)), 1e-5, "n");
      const float ws = 1.0f / std::sqrt(static_cast<float>(c.dm));
      auto w = b.weight(
          "w", c.transposeB ? std::vector<int64_t>{cols, c.dm} : std::vector<int64_t>{c.dm, cols},
          c.dt, values(c.dm * cols, ws));
      auto y = b.gemm(x, w, c.transposeB, "qkv");
      // Rotary tables as models compute them (cos, sin of position / 10000^(2i/d)), one
      // set per batch where the case has several rows of them.
      const int64_t tb = c.b > 2 ? c.b : 1, rd = c.rot ? c.rot : c.d;
      std::vector<float> ct(static_cast<size_t>(tb * c.s * rd)), st(ct.size());
      for (int64_t bb = 0; bb < tb; ++bb)
        for (int64_t p = 0; p < c.s; ++p)
          for (int64_t j = 0; j < rd; ++j) {
            const int64_t i = c.interleaved ? j / 2 : j % (rd / 2);
            const double a = static_cast<double>(p + 3 * bb) / std::pow(10000.0, 2.0 * i / rd);
            ct[static_cast<size_t>((bb * c.s + p) * rd + j)] = static_cast<float>(std::cos(a));
            st[static_cast<size_t>((bb * c.s + p) * rd + j)] = static_cast<float>(std::sin(a));
          }
      auto cosT = b.weight("cos", {tb, c.s, 1, rd}, c.dt, ct);
      auto sinT = b.weight("sin", {tb, c.s, 1, rd}, c.dt, st);
      auto roped = [&](ir::Value part, const char* name) {
        auto h = b.heads(part, c.b, c.d);
        if (!c.rot)
          return b.mergeHeads(b.rope(h, cosT, sinT, name, c.interleaved));
        auto r = b.rope(b.slice(h, 0, rd), cosT, sinT, name, c.interleaved);
        return b.mergeHeads(b.concat(r, b.slice(h, rd, c.d)));
      };
      auto q = b.slice(y, 0, c.h * c.d, "q");
      auto k = b.slice(y, c.h * c.d, (c.h + c.hkv) * c.d, "k");
      auto v = b.slice(y, (c.h + c.hkv) * c.d, cols, "v");
      auto qr = roped(q, "qr"), kr = roped(k, "kr");
      auto scale = b.constant(1.0 / std::sqrt(static_cast<double>(c.d)), {}, c.dt);
      b.output(b.attention(qr, kr, v, b.constant(0.0, {}, c.dt), scale, c.b, c.d, "o"));
      std::vector<match::RopeFusion> done;
      const ir::Graph f = match::ropeIntoEpilogues(fuse(b.build()), &done);
      BOOST_TEST_REQUIRE(done.size() == 1u);
      for (ir::Vertex vtx : f.vertices())
        BOOST_TEST_REQUIRE(
            (f.op(vtx).kind != ir::OpKind::Rope && f.op(vtx).kind != ir::OpKind::Concat));
      // The projection (and its statistics launch where deferred) and the attention.
      BOOST_TEST(runAttention(f, seed++) <= (c.norm ? 4 : 3));
    }
}

/// Attention whose scale is an input (its value and sign known only at run time): the flash
/// kernel applies it to the scores before the softmax (no FFMA folding, which needs a positive
/// scale), the decode kernel to q; both against the reference in double.
BOOST_AUTO_TEST_CASE(attention_with_a_scale_given_at_run_time) {
  struct Case {
    int64_t b, sq, sk, h, hkv, d;
  };
  for (const Case& c : {Case{2, 300, 300, 4, 2, 128}, Case{1, 1, 700, 8, 2, 64}})
    BOOST_TEST_CONTEXT("Sq " << c.sq << ", Sk " << c.sk << ", d " << c.d) {
      ir::GraphBuilder b("attention_scale");
      auto q = b.input("q", {c.b * c.sq, c.h * c.d});
      auto k = b.input("k", {c.b * c.sk, c.hkv * c.d});
      auto v = b.input("v", {c.b * c.sk, c.hkv * c.d});
      auto scale = b.input("scale", {1});
      b.output(b.attention(q, k, v, b.constant(0.0, {}), scale, c.b, c.d, "o"));
      ir::Graph g = b.build();
      runtime::BuildResult r =
          runtime::buildKernels(g, builtinLibrary().activations, buildOptions());
      BOOST_TEST_REQUIRE(r.error.empty(), r.error);
      for (double value : {0.125, -0.3}) {
        auto inputs = ir::randomInputs(g, 7);
        inputs.at("scale").data[0] = static_cast<float>(value);
        auto want = ir::evaluate(g, inputs, builtinLibrary().referenceActivations());
        runtime::Executor ex(*gpu(), r.graph);
        runtime::Agreement a =
            runtime::compareToReference(ex.run(inputs, true).outputs[0], want[g.outputs()[0]]);
        BOOST_TEST(a.pass, "scale " << value << ": max abs err " << a.maxAbs << ", max rel err "
                                    << a.maxRel);
      }
    }
}

/// RoPE as Llama's export computes it once its heads are views: heads, the rotary op with
/// [1, S, 1, d] tables, and the unfused decomposition (slices, neg, concat, a general
/// broadcast multiply), merged back; ragged S and two batches. And GPT-J's interleaved form.
BOOST_AUTO_TEST_CASE(rope_matches_the_reference) {
  const int64_t B = 2, S = 37, H = 3, d = 64;
  for (int form : {0, 1, 2}) {
    const bool decomposed = form == 1, interleaved = form == 2;
    BOOST_TEST_CONTEXT((decomposed ? "decomposed" : interleaved ? "interleaved" : "rope op")) {
      ir::GraphBuilder b("rope", builtinLibrary().activationSet());
      auto x = b.input("x", {B * S, H * d});
      auto c = b.input("cos", {1, S, 1, d}), sn = b.input("sin", {1, S, 1, d});
      auto h = b.heads(x, B, d);
      ir::Value r;
      if (decomposed) {
        auto rot = b.concat(b.activation(b.slice(h, d / 2, d), "neg"), b.slice(h, 0, d / 2));
        r = b.add(b.mul(h, c), b.mul(rot, sn));
      } else {
        r = b.rope(h, c, sn, "", interleaved);
      }
      b.output(b.mergeHeads(r, "y"));
      ir::Graph g = b.build();
      runtime::BuildResult rb =
          runtime::buildKernels(g, builtinLibrary().activations, buildOptions());
      BOOST_TEST_REQUIRE(rb.error.empty(), rb.error);
      auto inputs = ir::randomInputs(g, 77);
      auto want = ir::evaluate(g, inputs, builtinLibrary().referenceActivations());
      runtime::Executor ex(*gpu(), rb.graph);
      runtime::RunResult got = ex.run(inputs, /*poison=*/true);
      runtime::Agreement a = runtime::compareToReference(got.outputs[0], want[g.outputs()[0]]);
      BOOST_TEST(a.pass, "max abs err " << a.maxAbs << ", max rel err " << a.maxRel);
    }
  }
}

BOOST_AUTO_TEST_CASE(token_rows_reorder_on_the_gpu) {
  // batch_first and seq_first (sequence-first models' inputs and outputs) at rows of every
  // piece size the kernel moves (8, 4, 2 and 1 elements), f16 and bf16: copies, so exact.
  for (ir::DType t : {ir::DType::F16, ir::DType::BF16})
    for (int64_t w : {64, 36, 6, 7}) {
      BOOST_TEST_CONTEXT(ir::dtypeName(t) << ", rows of " << w) {
        const int64_t S = 37, B = 3;
        ir::GraphBuilder b("rows", builtinLibrary().activationSet());
        auto x = b.input("x", {S * B, w}, t);
        auto bf = b.batchFirst(x, B, "bf");
        b.output(bf).output(b.seqFirst(b.activation(bf, "relu"), B, "sf"));
        ir::Graph g = b.build();
        runtime::BuildResult rb =
            runtime::buildKernels(g, builtinLibrary().activations, buildOptions());
        BOOST_TEST_REQUIRE(rb.error.empty(), rb.error);
        auto inputs = ir::randomInputs(g, 91);
        auto want = ir::evaluate(g, inputs, builtinLibrary().referenceActivations());
        runtime::Executor ex(*gpu(), rb.graph);
        runtime::RunResult got = ex.run(inputs, /*poison=*/true);
        for (size_t i = 0; i < 2; ++i) {
          runtime::Agreement a = runtime::compareToReference(got.outputs[i], want[g.outputs()[i]]);
          BOOST_TEST((a.pass && a.maxAbs == 0.0), "output " << i << ": max abs err " << a.maxAbs);
        }
      }
    }
}

BOOST_AUTO_TEST_CASE(whole_graphs_run) {
  for (const char* file : {"/examples/ffn_swiglu.fgraph", "/examples/transformer_mlp.fgraph"}) {
    BOOST_TEST_CONTEXT(file) {
      SourceManager sm;
      std::string text;
      BOOST_TEST_REQUIRE(readFile(std::string(FPAT_SOURCE_DIR) + file, text));
      DiagEngine d(sm);
      auto g = ir::parseGraph(sm.addBuffer(file, text), d, builtinLibrary().activationSet());
      BOOST_TEST_REQUIRE(g.has_value());
      ir::Graph f = fuse(*g);
      runtime::BuildResult b =
          runtime::buildKernels(f, builtinLibrary().activations, buildOptions());
      BOOST_TEST_REQUIRE(b.error.empty(), b.error);
      auto inputs = ir::randomInputs(*g, 7);
      auto want = ir::evaluate(*g, inputs, builtinLibrary().referenceActivations());
      runtime::Executor ex(*gpu(), b.graph);
      runtime::RunResult r = ex.run(inputs);
      BOOST_TEST(r.deviceBytes <= r.naiveBytes);
      for (size_t i = 0; i < g->outputs().size(); ++i) {
        runtime::Agreement a = runtime::compareToReference(r.outputs[i], want[g->outputs()[i]]);
        BOOST_TEST(a.pass, "output " << i << ": max rel err " << a.maxRel << ", non-finite "
                                     << a.nonFinite);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(values_of_weights_alone_follow_new_weights) {
  // A LoRA adapter merged into its weight by the built-in rewrites: W + (B A) s is computed
  // when the weights are uploaded (Executor::prepareWeights), then each run is one GEMM. Run
  // with two sets of weights: the merged weight must follow each upload.
  const std::string file = "/tests/cli/inputs/lora_merge.fgraph";
  SourceManager sm;
  std::string text;
  BOOST_TEST_REQUIRE(readFile(std::string(FPAT_SOURCE_DIR) + file, text));
  DiagEngine d(sm);
  auto g = ir::parseGraph(sm.addBuffer(file, text), d, builtinLibrary().activationSet());
  BOOST_TEST_REQUIRE(g.has_value());
  ir::Graph r = applyBuiltinRewrites(*g);
  BOOST_TEST_REQUIRE(r.op(*r.find("y")).kind == ir::OpKind::Gemm);
  ir::Graph f = fuse(r);
  runtime::BuildResult b = runtime::buildKernels(f, builtinLibrary().activations, buildOptions());
  BOOST_TEST_REQUIRE(b.error.empty(), b.error);
  runtime::Executor ex(*gpu(), b.graph);
  for (unsigned seed : {7u, 8u}) {
    BOOST_TEST_CONTEXT("weights of seed " << seed) {
      auto inputs = ir::randomInputs(*g, seed);
      auto want = ir::evaluate(*g, inputs, builtinLibrary().referenceActivations());
      runtime::RunResult res = ex.run(inputs);
      runtime::Agreement a = runtime::compareToReference(res.outputs[0], want[g->outputs()[0]]);
      BOOST_TEST(a.pass, "max rel err " << a.maxRel << ", non-finite " << a.nonFinite);
      BOOST_TEST(res.launches == 1); // a run: the GEMM with its GeLU; the merge is not counted
    }
  }
}

BOOST_AUTO_TEST_CASE(tuning_smoke_test) {
  // A few candidates for one ragged fused GEMM: measured, checked, stored, then read back.
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("fpat-gpu-tune-" + std::to_string(::getpid()) + ".json"))
                               .string();
  tune::TuningCache cache(path);
  ir::Graph f = fuse(caseGraph("gemm_bias_gelu", {300, 520, 256}));
  tune::TuneOptions o;
  o.maxCandidates = 4;
  o.cacheDir = cacheDir();
  tune::Choice c = tune::tune(*gpu(), f, f.outputs()[0], builtinLibrary().activations, cache, o);
  BOOST_TEST(c.source == "tuned");
  BOOST_TEST(c.tried == 4);
  BOOST_TEST(c.ms > 0);
  BOOST_TEST(c.ms <= c.heuristicMs); // the heuristic is among the candidates
  tune::Choice again =
      tune::tune(*gpu(), f, f.outputs()[0], builtinLibrary().activations, cache, o);
  BOOST_TEST(again.source == "cache");
  BOOST_TEST((again.config == c.config));
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".lock");
}

BOOST_AUTO_TEST_CASE(attention_tuning_smoke_test) {
  // Every flash-kernel variant the tuner offers for a ragged attention (300 query and key
  // rows, GQA 2; causal at d 64 in f16, none at d 128 in bf16) compiles without serialized
  // wgmma, runs and matches the reference on sampled rows; the fastest is stored, read back,
  // and the graph built with it matches the whole reference.
  for (auto [d, causal, dt] : {std::tuple{int64_t{64}, true, ir::DType::F16},
                               std::tuple{int64_t{128}, false, ir::DType::BF16}})
    BOOST_TEST_CONTEXT("d " << d << (causal ? ", causal" : "") << ", " << dt) {
      const std::string path = (std::filesystem::temp_directory_path() /
                                ("fpat-gpu-tune-attn-" + std::to_string(::getpid()) + ".json"))
                                   .string();
      tune::TuningCache cache(path);
      const int64_t s = 300;
      ir::GraphBuilder b("attention_tuning");
      auto q = b.input("q", {2 * s, 4 * d}, dt);
      auto k = b.input("k", {2 * s, 2 * d}, dt);
      auto v = b.input("v", {2 * s, 2 * d}, dt);
      ir::Value m = b.constant(0.0, {}, dt);
      if (causal) {
        std::vector<float> data(static_cast<size_t>(s * s));
        for (int64_t i = 0; i < s; ++i)
          for (int64_t j = i + 1; j < s; ++j)
            data[static_cast<size_t>(i * s + j)] = -std::numeric_limits<float>::infinity();
        m = b.weight("mask", {1, 1, s, s}, dt, data);
      }
      b.output(b.attention(q, k, v, m, b.constant(1.0 / std::sqrt(double(d)), {}, dt), 2, d, "o"));
      const ir::Graph g = b.build();
      const ir::Vertex op = g.outputs()[0];
      tune::TuneOptions o;
      o.cacheDir = cacheDir();
      tune::Choice c = tune::tune(*gpu(), g, op, builtinLibrary().activations, cache, o);
      BOOST_TEST(c.source == "tuned");
      BOOST_TEST_REQUIRE(c.flash.has_value());
      BOOST_TEST(c.tried == static_cast<int>(codegen::flashTuning(g, op, 90)->candidates.size()));
      BOOST_TEST(c.rejected == 0);
      BOOST_TEST(c.ms > 0);
      BOOST_TEST(c.ms <= c.heuristicMs); // the heuristic is among the candidates
      tune::Choice again = tune::tune(*gpu(), g, op, builtinLibrary().activations, cache, o);
      BOOST_TEST(again.source == "cache");
      BOOST_TEST((again.flash == c.flash));
      runtime::BuildOptions bo = buildOptions();
      bo.flash[op] = *c.flash;
      runtime::BuildResult r = runtime::buildKernels(g, builtinLibrary().activations, bo);
      BOOST_TEST_REQUIRE(r.error.empty(), r.error);
      BOOST_TEST(r.graph.units[op].name.ends_with("_" + c.flash->str()));
      auto inputs = ir::randomInputs(g, 5);
      auto want = ir::evaluate(g, inputs, builtinLibrary().referenceActivations());
      runtime::Executor ex(*gpu(), r.graph);
      runtime::Agreement a =
          runtime::compareToReference(ex.run(inputs, /*poison=*/true).outputs[0], want[op]);
      BOOST_TEST(a.pass, "max rel err " << a.maxRel << ", non-finite " << a.nonFinite);
      std::filesystem::remove(path);
      std::filesystem::remove(path + ".lock");
    }
}

BOOST_AUTO_TEST_CASE(planted_out_of_bounds_write) {
  // Only for gpu.sanitizer.catches_planted_error (FPAT_PLANT_OOB=1): a kernel that writes one
  // element past its output, which compute-sanitizer memcheck must report, so that its clean
  // reports on the real suite mean something. Without the variable this case does nothing.
  const char* plant = std::getenv("FPAT_PLANT_OOB");
  if (!plant || std::string(plant) != "1")
    return;
  ir::Graph g = caseGraph("add", {64, 64, 64});
  ir::Graph f = fuse(g);
  runtime::BuildResult b = runtime::buildKernels(f, builtinLibrary().activations, buildOptions());
  BOOST_TEST_REQUIRE(b.error.empty(), b.error);
  codegen::KernelUnit& u = b.graph.units[f.outputs()[0]];
  u.name += "_planted_oob";
  u.launches.at(0).entry = u.name;
  u.source =
      "#include \"fpat_common.cuh\"\n"
      "extern \"C\" __global__ void " +
      u.name +
      "(const FpatKernelArgs a) {\n"
      "  if (blockIdx.x == 0 && threadIdx.x == 0)\n"
      "    static_cast<__half*>(a.out)[a.M * a.N] = __float2half(1.0f); // one past the end\n"
      "}\n";
  runtime::NvccOptions n;
  n.arch = gpu()->device().arch;
  n.cacheDir = cacheDir();
  auto k = runtime::compileAll({u}, n).at(0);
  BOOST_TEST_REQUIRE(k.error.empty(), k.error);
  b.graph.cubins[u.name] = k.cubinPath;
  runtime::Executor ex(*gpu(), b.graph);
  ex.run(ir::randomInputs(g, 1), false);
}
