// Code generation and nvcc: generated sources, kernel names, and compilation of every kernel
// family for sm_75, sm_80 and sm_90 (no GPU needed; skipped without nvcc).
#define BOOST_TEST_MODULE codegen
#include "../common/TestGraphs.h"
#include "fpat/codegen/Codegen.h"
#include "fpat/codegen/Lowering.h"
#include "fpat/runtime/Executor.h"
#include "fpat/runtime/Nvcc.h"
#include "fpat/runtime/Pipeline.h"

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <filesystem>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace fpat;
using namespace fpat::testing;
namespace fs = std::filesystem;

namespace {

std::vector<codegen::KernelUnit> unitsFor(const std::string& name, Shape s, int arch,
                                          const codegen::TileConfig* tile = nullptr,
                                          bool weights = false) {
  ir::Graph f = fuse(caseGraph(name, s, weights));
  codegen::CodegenOptions o;
  o.arch = arch;
  o.tile = tile;
  std::vector<codegen::KernelUnit> out;
  for (ir::Vertex v : f.vertices()) {
    codegen::KernelUnit u = codegen::generate(f, v, builtinLibrary().activations, o);
    if (!u.launches.empty())
      out.push_back(std::move(u));
  }
  return out;
}

struct TempDir {
  fs::path path =
      fs::temp_directory_path() /
      ("fpat-codegen-" + std::to_string(::getpid()) + "-" +
       std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()) % 100000));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

bool haveNvcc() {
  return !runtime::findNvcc({}).empty();
}

/// Cases that need nvcc are reported as skipped (not passed) without it.
boost::test_tools::assertion_result nvccPresent(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r(haveNvcc());
  r.message() << "nvcc not found";
  return r;
}

/// Compiles `units` with nvcc for sm_`arch` (a fresh cache): each without an error. Without nvcc
/// it says so (the units were generated, not compiled).
void expectCompiles(const std::vector<codegen::KernelUnit>& units, int arch = 90) {
  if (!haveNvcc()) {
    BOOST_TEST_MESSAGE("nvcc not found: the kernels were generated but not compiled");
    return;
  }
  TempDir cache;
  runtime::NvccOptions n;
  n.arch = arch;
  n.cacheDir = cache.path.string();
  for (const runtime::CompiledKernel& k : runtime::compileAll(units, n))
    BOOST_TEST(k.error.empty(), k.name << ": " << k.error);
}

} // namespace

BOOST_AUTO_TEST_CASE(every_case_fuses_into_one_kernel) {
  for (const std::string& name : caseNames()) {
    auto units = unitsFor(name, {100, 64, 48}, 90);
    BOOST_TEST(units.size() == 1u, name);
  }
}

BOOST_AUTO_TEST_CASE(configuration_names_parse_back) {
  for (const codegen::TileConfig& t :
       {codegen::TileConfig{128, 256, 64, 64, 64, 3}, codegen::TileConfig{64, 64, 32, 32, 32, 2},
        codegen::TileConfig{256, 128, 64, 64, 64, 4, codegen::Backend::MmaSync},
        codegen::TileConfig{128, 256, 64, 64, 256, 4, codegen::Backend::Wgmma},
        codegen::TileConfig{64, 128, 64, 64, 128, 8, codegen::Backend::Wgmma},
        codegen::TileConfig{256, 128, 64, 128, 128, 3, codegen::Backend::Wgmma},
        codegen::TileConfig{128, 256, 64, 64, 256, 3, codegen::Backend::Wgmma, 2},
        codegen::TileConfig{128, 128, 64, 128, 128, 6, codegen::Backend::WgmmaPingPong, 2},
        codegen::TileConfig{128, 256, 64, 64, 256, 4, codegen::Backend::Wgmma, 1, true},
        codegen::TileConfig{64, 64, 64, 64, 64, 20, codegen::Backend::Wgmma, 1, false, 16}}) {
    auto back = codegen::TileConfig::parse(t.str());
    BOOST_REQUIRE(back.has_value());
    BOOST_TEST((*back == t), t.str());
  }
  for (const char* bad :
       {"", "128x128x32", "128x128x32_w2x4_s3_", "128x128x32_w2x4_s3_mmax", "128x128x32_w3x4_s3",
        "128x128x32_w0x4_s3", "-128x128x32_w2x4_s3", "128x256x32_w2x1_s4_wgmma",
        "256x256x64_w4x1_s4_wgmma", "128x256x64_w2x2_s4_wgmma", "256x128x64_w4x1_s3_wgmma",
        "256x128x64_w2x1_s3_pingpong", "256x128x64_w2x1_s3_wgmma_c2",
        // clusters: wgmma only, of two, and B tiles of at least 128 columns
        "128x128x32_w2x4_s3_c2", "128x256x64_w2x1_s3_wgmma_c3", "128x64x64_w2x1_s6_wgmma_c2",
        "128x256x64_w2x1_s3_c2_wgmma", "128x128x32_w2x4_s3_rn", "128x256x64_w2x1_s3_wgmma_rn_c2",
        "64x256x64_w1x1_s5_pingpong_rn",
        // short A boxes: the template's (64-row cooperative tiles, 16 or 32 rows), wgmma only
        "64x64x64_w2x2_s3_a16", "64x64x64_w1x1_s20_a24_wgmma", "128x128x64_w2x1_s6_a16_wgmma",
        "64x64x64_w1x1_s20_a0_wgmma", "64x64x64_w1x1_s20_a-16_wgmma", "64x64x64_w1x1_s20_wgmma_a16",
        "64x256x64_w1x1_s5_a16_pingpong"})
    BOOST_TEST(!codegen::TileConfig::parse(bad).has_value(), bad);
}

BOOST_AUTO_TEST_CASE(names_encode_the_configuration) {
  auto u = unitsFor("gemm_bias_gelu", {1024, 4096, 4096}, 80).at(0);
  BOOST_TEST(u.name == "fpat_gemm_bias_gelu_sm80_128x256x64_w2x4_s3_vec");
  BOOST_TEST(u.launches.at(0).entry == u.name);
  BOOST_TEST(u.launches.at(0).threads == 256);
  // sm_90: the wgmma backend, 2 consumer warpgroups + 1 producer, persistent, TMA maps for A,
  // B and (the epilogue tile) the output.
  auto h = unitsFor("gemm_bias_gelu", {1024, 4096, 4096}, 90).at(0);
  BOOST_TEST(h.name == "fpat_gemm_bias_gelu_sm90a_128x256x64_w2x1_s3_wgmma_tilestore");
  BOOST_TEST(h.sm90a);
  BOOST_TEST(h.launches.at(0).threads == 384);
  BOOST_TEST(h.launches.at(0).grid == codegen::Launch::Persistent);
  BOOST_TEST(h.launches.at(0).tma.size() == 4u);
  BOOST_TEST(h.source.find("128x256x64, 2 consumer warpgroups + 1 producer, 3 stages") !=
             std::string::npos);
  BOOST_TEST(h.source.find("store:    through a 128x256 shared-memory tile, by TMA") !=
             std::string::npos);
  // 256x128: two consumers of 128 rows (two m64 MMAs each); A in 256-row boxes, the operand
  // tile's boxes 256 rows deep, the output stored in 64 x 64 boxes as for other tiles.
  const codegen::TileConfig wide = *codegen::TileConfig::parse("256x128x64_w2x1_s3_wgmma");
  auto w = unitsFor("gemm_residual", {1024, 4096, 4096}, 90, &wide).at(0);
  BOOST_TEST(w.source.find("using Tile = fpat::WgmmaTile<256, 128, 3, false>;") !=
             std::string::npos);
  BOOST_TEST(w.launches.at(0).threads == 384);
  BOOST_REQUIRE(w.launches.at(0).tma.size() == 4u);
  BOOST_TEST(w.launches.at(0).tma[0].boxOuter == 256);
  BOOST_TEST(w.launches.at(0).tma[2].boxOuter == 256);
  BOOST_TEST(w.launches.at(0).tma[3].boxOuter == 64);
  // M = 512: 128x256 tiles would fill half the SMs; 128x128 fills them.
  BOOST_TEST(unitsFor("gemm_bias_gelu", {512, 4096, 4096}, 90).at(0).tile.bn == 128);
  // sm_86 cannot hold three stages of that tile (99 KB of shared memory).
  auto small = unitsFor("gemm_bias_gelu", {1024, 4096, 4096}, 86).at(0);
  BOOST_TEST(small.name == "fpat_gemm_bias_gelu_sm86_128x128x32_w2x2_s3_vec");
  auto ragged = unitsFor("gemm_bias_gelu", {17, 100, 1000}, 80).at(0);
  BOOST_TEST(ragged.name == "fpat_gemm_bias_gelu_sm80_64x64x32_w2x2_s3_any");
  BOOST_TEST(!ragged.vec);
  auto bt = unitsFor("gemm_bt", {64, 64, 64}, 75).at(0);
  BOOST_TEST(bt.name == "fpat_gemm_sm75_64x64x32_w2x2_s2_bt_vec");
  auto ln = unitsFor("layernorm_gemm", {64, 64, 64}, 90).at(0);
  BOOST_REQUIRE(ln.launches.size() == 2u);
  BOOST_TEST(ln.launches[0].entry == ln.name + "_rowstats");
  BOOST_TEST(ln.needsRowStats);
  // Norms hold their rows in registers where rows are 16-byte words, at most 32 a lane.
  BOOST_TEST(unitsFor("rmsnorm", {8, 8, 8}, 90).at(0).name == "fpat_rmsnorm_held1_sm90");
  BOOST_TEST(unitsFor("rmsnorm", {7, 4096, 8}, 90).at(0).name == "fpat_rmsnorm_held16_sm90");
  BOOST_TEST(unitsFor("layernorm", {7, 8192, 8}, 90).at(0).name == "fpat_layernorm_held32_sm90");
  BOOST_TEST(unitsFor("layernorm", {7, 1000, 8}, 90).at(0).name == "fpat_layernorm_held4_sm90");
  BOOST_TEST(unitsFor("rmsnorm", {7, 8200, 8}, 90).at(0).name == "fpat_rmsnorm_sm90");
  BOOST_TEST(unitsFor("rmsnorm", {7, 100, 8}, 90).at(0).name == "fpat_rmsnorm_sm90");
  BOOST_TEST(unitsFor("bias_add", {8, 8, 8}, 90).at(0).name == "fpat_ew_bias_add_sm90");
}

// The GEMM plan: every decision of the code generator as data, checked without any source
// text (the source and the launches are emitted from it).
BOOST_AUTO_TEST_CASE(gemm_plans_are_data) {
  auto plan = [](const std::string& name, Shape s, int arch, bool weights = false) {
    ir::Graph f = fuse(caseGraph(name, s, weights));
    const ir::Vertex v = *f.find("y");
    codegen::CodegenOptions o;
    o.arch = arch;
    return codegen::detail::planGemm(f, v, o);
  };
  // A deferred RMSNorm (weights) on Hopper: the statistics from the grid's own warps, gamma
  // folded into B.
  const codegen::detail::GemmPlan norm = plan("rmsnorm_gemm", {4096, 4096, 4096}, 90, true);
  BOOST_TEST(norm.deferNorm);
  BOOST_TEST(norm.normKind == 2);
  BOOST_TEST((norm.unit.normStats == codegen::NormStats::Grid));
  BOOST_TEST(norm.unit.preparedB);
  BOOST_TEST(norm.unit.tile.wgmma());
  BOOST_TEST(norm.smemBytes > 0);
  // The same with gamma and W given at run time: normalised in shared memory, no deferral.
  const codegen::detail::GemmPlan smem = plan("rmsnorm_gemm", {4096, 4096, 4096}, 90);
  BOOST_TEST(!smem.deferNorm);
  BOOST_TEST(smem.unit.needsRowStats);
  BOOST_TEST(!smem.unit.tile.wgmma());
  // An activation epilogue through the tile, deferred to the producer's idle warps.
  const codegen::detail::GemmPlan gelu = plan("gemm_bias_gelu", {4096, 4096, 4096}, 90);
  BOOST_TEST(gelu.epiTile);
  BOOST_TEST(gelu.defer);
  BOOST_TEST(gelu.staged == -1);
  // A residual staged into the tile; K % 8 != 0 pads A; sm_80 has no wgmma.
  const codegen::detail::GemmPlan res = plan("gemm_residual", {4096, 4096, 1003}, 90);
  BOOST_TEST(res.staged == 2);
  BOOST_TEST(res.padK);
  BOOST_TEST(res.unit.name.find("_padk") != std::string::npos);
  BOOST_TEST(!plan("gemm_residual", {4096, 4096, 4096}, 80).unit.tile.wgmma());
  BOOST_TEST(res.unit.source.empty()); // a plan holds no text
}

BOOST_AUTO_TEST_CASE(sources_say_where_they_came_from_and_are_deterministic) {
  ir::Graph f = fuse(caseGraph("gemm_bias_residual", {64, 64, 64}));
  codegen::CodegenOptions o;
  o.arch = 80; // the cp.async kernels; the wgmma ones below
  o.sources["gemm_bias_residual"] = "patterns/gemm.fpat:22";
  codegen::KernelUnit a = codegen::generate(f, *f.find("y"), builtinLibrary().activations, o);
  codegen::KernelUnit b = codegen::generate(f, *f.find("y"), builtinLibrary().activations, o);
  BOOST_TEST(a.source == b.source);
  for (const char* s :
       {"// Generated by fpat", "// kernel:   pattern gemm_bias_residual [patterns/gemm.fpat:22]",
        "// epilogue: add(bias_add(acc, $2), $3)", "#include \"fpat_gemm.cuh\"",
        "const float t1 = fpat::ldh(a.in[2], col); // $2 [N]",
        "const float t2 = t0 + t1; // bias_add",
        "const float t3 = fpat::ldh(a.in[3], row * a.N + col); // $3 [M, N]",
        "const float t4 = t2 + t3; // add", "return t4;",
        "extern \"C\" __global__ void __launch_bounds__(128) "
        "fpat_gemm_bias_residual_sm80_64x64x32_w2x2_s3_vec"})
    BOOST_TEST(a.source.find(s) != std::string::npos, s << "\n" << a.source);
  o.arch = 90;
  codegen::KernelUnit h = codegen::generate(f, *f.find("y"), builtinLibrary().activations, o);
  for (const char* s : {"#include \"fpat_wgmma.cuh\"", "// epilogue: add(bias_add(acc, $2), $3)",
                        "using Tile = fpat::WgmmaTile<64, 64, 12, false>;",
                        "__launch_bounds__(256, 1) fpat_gemm_bias_residual_sm90a_64x64x64_w1x1_s12_"
                        "wgmma_tilestore(const __grid_constant__ FpatTmaArgs p)"})
    BOOST_TEST(h.source.find(s) != std::string::npos, s << "\n" << h.source);
  // A cluster configuration says so in its comment, template arguments and launch attributes.
  const codegen::TileConfig c2 = *codegen::TileConfig::parse("128x256x64_w2x1_s3_wgmma_c2");
  o.tile = &c2;
  codegen::KernelUnit hc = codegen::generate(f, *f.find("y"), builtinLibrary().activations, o);
  for (const char* s : {"3 stages, clusters of 2 CTAs multicasting B",
                        "using Tile = fpat::WgmmaTile<128, 256, 3, false, 2>;",
                        "__cluster_dims__(2, 1, 1) __launch_bounds__(384, 1) "
                        "fpat_gemm_bias_residual_sm90a_128x256x64_w2x1_s3_wgmma_c2_tilestore("})
    BOOST_TEST(hc.source.find(s) != std::string::npos, s << "\n" << hc.source);
  // Activation bodies come from the .fpat sources, with their location.
  auto act = unitsFor("activation_leaky_relu", {8, 8, 8}, 90).at(0);
  BOOST_TEST(act.source.find("// from ") != std::string::npos);
  BOOST_TEST(act.source.find("activations.fpat:") != std::string::npos, act.source);
  BOOST_TEST(act.source.find("fpat_act_leaky_relu<kFma>(in[0], a.params[0])") != std::string::npos);
  BOOST_REQUIRE(act.params.size() == 1u);
  BOOST_TEST(act.params[0] == 0.2f);
}

BOOST_AUTO_TEST_CASE(unsupported_ops_are_clear_errors) {
  ir::GraphBuilder b("f32");
  auto x = b.input("x", {4, 4}, ir::DType::F32);
  b.output(b.add(x, x, "y"));
  ir::Graph g = b.build();
  BOOST_CHECK_EXCEPTION(codegen::generate(g, *g.find("y"), builtinLibrary().activations, {}),
                        codegen::CodegenError, [](const codegen::CodegenError& e) {
                          return std::string(e.what()).find(
                                     "GPU kernels take f16 or bf16 tensors") != std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(every_family_compiles_for_sm75_sm80_sm90,
                     *boost::unit_test::precondition(nvccPresent)) {
  TempDir cache;
  // Aligned and ragged shapes select the 16-byte and the bounds-checked paths.
  for (int arch : {75, 80, 90}) {
    std::vector<codegen::KernelUnit> units;
    for (const std::string& name : caseNames())
      for (Shape s : {Shape{1024, 4096, 4096}, Shape{17, 100, 1000}})
        for (auto& u : unitsFor(name, s, arch))
          units.push_back(std::move(u));
    runtime::NvccOptions o;
    o.arch = arch;
    o.cacheDir = cache.path.string();
    auto results = runtime::compileAll(units, o);
    BOOST_TEST(results.size() == units.size());
    for (const runtime::CompiledKernel& k : results) {
      BOOST_TEST(k.error.empty(), k.name << ": " << k.error);
      BOOST_TEST(fs::file_size(k.cubinPath) > 1000u, k.name);
    }
    // A second round finds everything in the cache.
    for (const runtime::CompiledKernel& k : runtime::compileAll(units, o))
      BOOST_TEST(k.cached, k.name);
  }
  // Nothing half-written is left behind.
  for (const auto& e : fs::recursive_directory_iterator(cache.path))
    BOOST_TEST(e.path().string().find(".tmp.") == std::string::npos, e.path());
}

BOOST_AUTO_TEST_CASE(nvcc_errors_name_the_generated_file_and_line,
                     *boost::unit_test::precondition(nvccPresent)) {
  TempDir cache;
  codegen::KernelUnit u = unitsFor("mul", {8, 8, 8}, 90).at(0);
  u.name = "fpat_broken";
  u.source += "\nthis is not CUDA;\n";
  runtime::NvccOptions o;
  o.cacheDir = cache.path.string();
  auto r = runtime::compileAll({u}, o);
  BOOST_REQUIRE(r.size() == 1u);
  BOOST_TEST(!r[0].error.empty());
  BOOST_TEST(r[0].error.find(r[0].sourcePath) != std::string::npos, r[0].error);
  BOOST_TEST(r[0].error.find(".cu(") != std::string::npos, r[0].error); // file(line)
  BOOST_TEST(!fs::exists(r[0].cubinPath));
}

BOOST_AUTO_TEST_CASE(concurrent_compiles_share_the_cache_safely,
                     *boost::unit_test::precondition(nvccPresent)) {
  TempDir cache;
  auto units = unitsFor("gemm_silu", {64, 64, 64}, 80);
  runtime::NvccOptions o;
  o.arch = 80;
  o.cacheDir = cache.path.string();
  std::vector<std::vector<runtime::CompiledKernel>> results(3);
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; ++i)
    ts.emplace_back([&, i] { results[i] = runtime::compileAll(units, o); });
  for (auto& t : ts)
    t.join();
  for (auto& r : results) {
    BOOST_REQUIRE(r.size() == 1u);
    BOOST_TEST(r[0].error.empty());
    BOOST_TEST(fs::file_size(r[0].cubinPath) == fs::file_size(results[0][0].cubinPath));
  }
}

BOOST_AUTO_TEST_CASE(buffer_plan_reuses_dead_values_only) {
  // A chain of elementwise ops: each intermediate dies at its only user, so buffers are reused,
  // but no two values that are live at the same time share one.
  ir::GraphBuilder b("chain");
  auto x = b.input("x", {64, 64});
  auto y = x;
  for (int i = 0; i < 6; ++i)
    y = b.add(y, x, "t" + std::to_string(i));
  b.output(y);
  ir::Graph g = b.build();
  runtime::BufferPlan p = runtime::planBuffers(g);
  BOOST_TEST(p.plannedBytes < p.naiveBytes);
  auto order = *ir::stableOrder(g);
  std::vector<size_t> pos(g.size()), last(g.size(), 0);
  for (size_t i = 0; i < order.size(); ++i)
    pos[order[i]] = i;
  for (ir::Vertex v : g.vertices()) {
    last[v] = g.isOutput(v) || g.op(v).kind == ir::OpKind::Input ? order.size() : pos[v];
    for (ir::Vertex u : g.users(v))
      last[v] = std::max(last[v], pos[u]);
  }
  for (ir::Vertex a : g.vertices())
    for (ir::Vertex c : g.vertices())
      if (a < c && p.slotOf[a] == p.slotOf[c]) {
        // Sharing is fine only when one value is dead before the other is written.
        bool disjoint = last[a] < pos[c] || last[c] < pos[a];
        BOOST_TEST(disjoint, g.op(a).name << " and " << g.op(c).name << " share a buffer");
      }
  BOOST_TEST(p.slotOf[*g.find("x")] != p.slotOf[*g.find("t5")]);
}

BOOST_AUTO_TEST_CASE(values_of_weights_alone_keep_their_buffers) {
  // %ws and %wt are computed once per set of weights (Executor::prepareWeights) and read by
  // every run after: no value computed on a run may take their buffers, even after their
  // last reader in the graph's order.
  ir::GraphBuilder b("fixed");
  auto x = b.input("x", {64, 64});
  auto w = b.weight("w", {64, 64});
  auto ws = b.add(w, w, "ws");
  auto wt = b.add(ws, w, "wt");
  auto h = b.gemm(x, wt, false, "h");
  auto t = h;
  for (int i = 0; i < 4; ++i)
    t = b.add(t, x, "t" + std::to_string(i));
  b.output(t);
  ir::Graph g = b.build();
  runtime::BufferPlan p = runtime::planBuffers(g);
  for (const char* fixed : {"ws", "wt"})
    for (ir::Vertex v : g.vertices())
      if (g.op(v).name != fixed)
        BOOST_TEST(p.slotOf[v] != p.slotOf[*g.find(fixed)],
                   g.op(v).name << " shares %" << fixed << "'s buffer");
}

BOOST_AUTO_TEST_CASE(the_suites_apply_the_builtin_rewrites_as_fpatc_does) {
  // applyBuiltinRewrites, which the GPU suite's LoRA case runs: its matcher table is compiled
  // against the sources of the library's rules (another source manager failed there, out of
  // range). nn.Linear's layout with the adapter's scale: one GEMM over W + (B A) s.
  ir::GraphBuilder b("lora");
  auto x = b.input("x", {37, 96});
  auto w = b.weight("w", {96, 96});
  auto a = b.weight("a", {8, 96});
  auto up = b.weight("b", {96, 8});
  auto l = b.gemm(b.gemm(x, a, true), up, true);
  auto y = b.add(b.gemm(x, w, true), b.mul(l, b.constant(0.5)), "y");
  b.output(y);
  const ir::Graph g = b.build();
  const ir::Graph r = applyBuiltinRewrites(g);
  BOOST_TEST_REQUIRE(r.find("y").has_value());
  BOOST_TEST((r.op(*r.find("y")).kind == ir::OpKind::Gemm));
  const auto inputs = ir::randomInputs(g, 3);
  auto want = ir::evaluate(g, inputs, builtinLibrary().referenceActivations());
  auto got = ir::evaluate(r, inputs, builtinLibrary().referenceActivations());
  runtime::Agreement same = runtime::compareToReference(got[*r.find("y")], want[*g.find("y")]);
  BOOST_TEST(same.pass, "max rel err " << same.maxRel);
}

BOOST_AUTO_TEST_CASE(views_share_their_operands_buffer_while_any_of_them_lives) {
  // RoPE as the importer writes it: heads of a GEMM's result, rope, merge_heads into
  // attention; heads and merge_heads are views (no kernel, their operand's buffer), and the
  // buffer they share is not reused while any of them is read.
  ir::GraphBuilder b("views");
  auto x = b.input("x", {2 * 7, 4 * 16});
  auto w = b.input("w", {64, 64});
  auto q = b.gemm(x, w, false, "q");
  auto h = b.heads(q, 2, 16, "h");
  auto c = b.input("cos", {1, 7, 1, 16});
  auto s = b.input("sin", {1, 7, 1, 16});
  auto r = b.rope(h, c, s, "r");
  auto m = b.mergeHeads(r, "m");
  auto y = b.add(m, b.gemm(m, w, false, "p"), "y");
  b.output(y);
  ir::Graph g = b.build();
  runtime::BufferPlan p = runtime::planBuffers(g);
  BOOST_TEST(p.slotOf[*g.find("h")] == p.slotOf[*g.find("q")]);
  BOOST_TEST(p.slotOf[*g.find("m")] == p.slotOf[*g.find("r")]);
  // m is read by p and y: r's buffer lives until y; nothing written before then reuses it.
  BOOST_TEST(p.slotOf[*g.find("p")] != p.slotOf[*g.find("r")]);
  BOOST_TEST(p.slotOf[*g.find("r")] != p.slotOf[*g.find("q")]); // rope reads q's while writing
  codegen::CodegenOptions o;
  o.arch = 90;
  for (const char* name : {"h", "m"})
    BOOST_TEST(
        codegen::generate(g, *g.find(name), builtinLibrary().activations, o).launches.empty());
}

BOOST_AUTO_TEST_CASE(attention_reads_qkv_columns_in_place) {
  // GPT-2's fused QKV projection split into q, k and v by column slices: attention reads them
  // where they lie (no kernel, the projection's buffer at the slice's offset, TMA rows as wide
  // as the projection). A slice something else reads too, a slice that is an output, one not
  // starting at a multiple of 8 columns and attention's bias are copied as before.
  ir::GraphBuilder b("qkv");
  const int64_t B = 2, S = 9, H = 2, d = 64, W = 8 + 3 * H * d;
  auto x = b.input("x", {B * S, W});
  auto q = b.slice(x, 8, 8 + H * d, "q");
  auto k = b.slice(x, 8 + H * d, 8 + 2 * H * d, "k");
  auto v = b.slice(x, 8 + 2 * H * d, W, "v");
  auto scale = b.constant(0.125, {});
  auto o = b.attention(q, k, v, b.constant(0.0, {}), scale, B, d, "o");
  auto v2 = b.slice(x, 8 + 2 * H * d, W, "v2"); // read by attention and by an add
  auto o2 = b.attention(q, k, v2, b.constant(0.0, {}), scale, B, d, "o2");
  auto odd = b.slice(x, 4, 4 + H * d, "odd");
  auto o3 = b.attention(odd, k, v, b.constant(0.0, {}), scale, B, d, "o3");
  auto out = b.slice(x, 8, 8 + H * d, "out");
  auto o4 = b.attention(out, k, v, b.constant(0.0, {}), scale, B, d, "o4");
  b.output(b.add(b.add(b.add(o, o2), b.add(o3, o4)), v2));
  b.output(out);
  ir::Graph g = b.build();
  for (const char* name : {"q", "k", "v"})
    BOOST_TEST(ir::isColumnView(g, *g.find(name)), name);
  for (const char* name : {"v2", "odd", "out"})
    BOOST_TEST(!ir::isColumnView(g, *g.find(name)), name);
  BOOST_TEST(ir::rowPitch(g, *g.find("q")) == W);
  BOOST_TEST(ir::rowPitch(g, *g.find("odd")) == H * d);
  runtime::BufferPlan p = runtime::planBuffers(g);
  for (const char* name : {"q", "k", "v"})
    BOOST_TEST(p.slotOf[*g.find(name)] == p.slotOf[*g.find("x")], name);
  BOOST_TEST(p.offsetOf[*g.find("q")] == 8u * 2);
  BOOST_TEST(p.offsetOf[*g.find("v")] == (8u + 2 * H * d) * 2);
  BOOST_TEST(p.offsetOf[*g.find("v2")] == 0u);
  codegen::CodegenOptions opts;
  opts.arch = 90;
  auto unit = [&](const char* name) {
    return codegen::generate(g, *g.find(name), builtinLibrary().activations, opts);
  };
  for (const char* name : {"q", "k", "v"})
    BOOST_TEST(unit(name).launches.empty(), name);
  for (const char* name : {"v2", "odd", "out"})
    BOOST_TEST(!unit(name).launches.empty(), name);
  // The flash kernel's maps step by the projection's rows where its operand is a view.
  const codegen::KernelUnit flash = unit("o");
  BOOST_TEST_REQUIRE(flash.launches.at(0).tma.size() == 3u);
  for (const codegen::TmaMap& m : flash.launches[0].tma)
    BOOST_TEST(m.pitch == W);
  const codegen::KernelUnit mixed = unit("o3"); // q copied, k and v in place
  BOOST_TEST(mixed.launches.at(0).tma.at(0).pitch == H * d);
  BOOST_TEST(mixed.launches.at(0).tma.at(1).pitch == W);
  // The CUDA-core kernel (sm_80) holds the pitches in its source, and in its name.
  opts.arch = 80;
  const codegen::KernelUnit rows = unit("o");
  BOOST_TEST(rows.source.find("qPitch = " + std::to_string(W)) != std::string::npos);
  BOOST_TEST(rows.name.find("_p" + std::to_string(W)) != std::string::npos, rows.name);
  BOOST_TEST(unit("o2").name != rows.name);
  // Slices of heads (GPT-NeoX's q, k, v side by side in each head, [B, S, H, 3 d]) are no
  // rows of tokens a pitch apart: copied, though aligned and read by attention alone.
  ir::GraphBuilder n("neox");
  auto hx = n.heads(n.input("x", {B * S, 3 * H * d}), B, 3 * d);
  auto part = [&](int i, const char* name) {
    return n.mergeHeads(n.slice(hx, i * d, (i + 1) * d, name));
  };
  n.output(n.attention(part(0, "hq"), part(1, "hk"), part(2, "hv"), n.constant(0.0, {}),
                       n.constant(0.125, {}), B, d, "o"));
  ir::Graph ng = n.build();
  for (const char* name : {"hq", "hk", "hv"})
    BOOST_TEST(!ir::isColumnView(ng, *ng.find(name)), name);
}

BOOST_AUTO_TEST_CASE(mma_backend_compiles_for_sm80_sm90,
                     *boost::unit_test::precondition(nvccPresent)) {
  TempDir cache;
  const codegen::TileConfig tiles[] = {{128, 128, 32, 64, 32, 3, codegen::Backend::MmaSync},
                                       {64, 64, 32, 32, 32, 3, codegen::Backend::MmaSync}};
  for (int arch : {80, 90}) {
    std::vector<codegen::KernelUnit> units;
    for (const char* name : {"gemm", "gemm_bt", "gemm_bias_gelu", "gemm_bias_residual",
                             "layernorm_gemm", "rmsnorm_gemm"})
      for (Shape s : {Shape{1024, 4096, 4096}, Shape{17, 100, 1000}})
        for (const codegen::TileConfig& t : tiles) {
          ir::Graph f = fuse(caseGraph(name, s));
          codegen::CodegenOptions o;
          o.arch = arch;
          o.tile = &t;
          codegen::KernelUnit u =
              codegen::generate(f, f.outputs()[0], builtinLibrary().activations, o);
          BOOST_TEST(u.name.find("_mma_") != std::string::npos, u.name);
          BOOST_TEST(u.source.find("Epilogue, true>(a)") != std::string::npos);
          units.push_back(std::move(u));
        }
    runtime::NvccOptions o;
    o.arch = arch;
    o.cacheDir = cache.path.string();
    for (const runtime::CompiledKernel& k : runtime::compileAll(units, o))
      BOOST_TEST(k.error.empty(), k.name << ": " << k.error);
  }
}

BOOST_AUTO_TEST_CASE(wgmma_falls_back_where_tma_cannot_run) {
  // TMA needs 16-byte row strides: N % 8 for B [K, N] (K % 8 is padded: below).
  for (auto [name, s] : {std::pair<const char*, Shape>{"gemm_bias_gelu", {64, 100, 64}},
                         {"gemm", {64, 100, 64}},
                         {"gemm_residual", {1, 17, 40}}}) {
    auto u = unitsFor(name, s, 90).at(0);
    BOOST_TEST(!u.tile.wgmma(), name);
    BOOST_TEST(!u.sm90a, name);
  }
  // B^T does not need N % 8: N = 100 still runs on wgmma.
  BOOST_TEST(unitsFor("gemm_bt", {64, 100, 64}, 90).at(0).tile.wgmma());
  // A forced wgmma configuration where it cannot run says so in the op's log line.
  ir::Graph f = fuse(caseGraph("gemm_bias", {64, 100, 64}));
  const codegen::TileConfig forced{128, 256, 64, 64, 256, 4, codegen::Backend::Wgmma};
  codegen::CodegenOptions o;
  o.tile = &forced;
  codegen::KernelUnit u = codegen::generate(f, f.outputs()[0], builtinLibrary().activations, o);
  BOOST_TEST(!u.tile.wgmma());
  BOOST_TEST(u.what.find("fallback: 128x256x64_w2x1_s4_wgmma cannot run here (TMA needs N % 8 "
                         "== 0 for a B [K, N] that is not a weight, N is 100)") !=
                 std::string::npos,
             u.what);
  // Not on other GPUs, not for norm_gemm.
  BOOST_TEST(!unitsFor("gemm_bias", {1024, 4096, 4096}, 80).at(0).tile.wgmma());
  BOOST_TEST(!unitsFor("rmsnorm_gemm", {1024, 4096, 4096}, 90).at(0).tile.wgmma());
}

BOOST_AUTO_TEST_CASE(short_a_boxes_hold_decode_rows_only) {
  // A box of 16 rows per stage: the ring's stages are (16 + 64) x 64 elements, the A map's
  // boxes 16 rows deep, and the template says so.
  const codegen::TileConfig a16 = *codegen::TileConfig::parse("64x64x64_w1x1_s20_a16_wgmma");
  BOOST_TEST(a16.aRows == 16);
  BOOST_TEST(codegen::gemmSmemBytes(a16, true) == 20 * (16 + 64) * 64 * 2 + 1024);
  BOOST_TEST(a16.runsRows(16));
  BOOST_TEST(!a16.runsRows(17));
  auto u = unitsFor("gemm_residual", {13, 4096, 4096}, 90, &a16).at(0);
  BOOST_TEST(u.tile.str() == a16.str());
  BOOST_TEST(u.name.find("_64x64x64_w1x1_s20_a16_wgmma") != std::string::npos, u.name);
  BOOST_TEST(u.source.find("using Tile = fpat::WgmmaTile<64, 64, 20, false, 1, false, 16>;") !=
                 std::string::npos,
             u.source);
  BOOST_TEST(u.source.find("20 stages holding A boxes of 16 rows") != std::string::npos);
  BOOST_REQUIRE(!u.launches.empty());
  BOOST_TEST(u.launches.back().tma.at(0).boxOuter == 16);
  BOOST_TEST(u.launches.back().tma.at(2).boxOuter == 64); // the operand tile's boxes: BM rows
  // More rows than the box holds: the heuristic's configuration instead, and the log line says
  // why.
  ir::Graph f = fuse(caseGraph("gemm_residual", {17, 4096, 4096}));
  codegen::CodegenOptions o;
  o.tile = &a16;
  codegen::KernelUnit fb = codegen::generate(f, f.outputs()[0], builtinLibrary().activations, o);
  BOOST_TEST(fb.tile.wgmma());
  BOOST_TEST(fb.tile.str() == "64x64x64_w1x1_s17_a32_wgmma"); // the heuristic's: 32 rows hold 17
  BOOST_TEST(fb.what.find("fallback: 64x64x64_w1x1_s20_a16_wgmma cannot run here (its A box of "
                          "16 rows cannot hold M = 17)") != std::string::npos,
             fb.what);
  // The heuristic never picks a box too short for the problem.
  for (int64_t m : {17, 33, 64, 1024})
    BOOST_TEST(unitsFor("gemm_bt", {m, 4096, 4096}, 90).at(0).tile.runsRows(m), m);
}

BOOST_AUTO_TEST_CASE(wgmma_pads_k_that_tma_cannot_read) {
  // K % 8 != 0: a first launch copies A (and B [N, K]) into rows of K rounded up to 8, and the
  // tensor maps read K columns of those copies. The source names no K: every K of one
  // configuration shares one kernel.
  for (const char* name : {"gemm_bias_gelu", "gemm_bt", "gemm_residual"}) {
    const bool bt = std::string(name) == "gemm_bt";
    const codegen::KernelUnit u = unitsFor(name, {130, 136, 1001}, 90).at(0);
    BOOST_TEST_REQUIRE(u.tile.wgmma(), name);
    BOOST_TEST(u.name.find("_padk") != std::string::npos, u.name);
    BOOST_REQUIRE(u.launches.size() == 2u);
    BOOST_TEST(u.launches[0].grid == codegen::Launch::PaddedRows);
    BOOST_TEST(u.launches[0].entry == u.name + "_pad");
    BOOST_TEST(u.launches[0].tma.empty());
    const codegen::Launch& l = u.launches[1];
    BOOST_TEST(l.grid == codegen::Launch::Persistent);
    BOOST_TEST(l.tma[0].copy == 0);
    BOOST_TEST(l.tma[0].inner == 1001);
    BOOST_TEST(l.tma[1].copy == (bt ? 1 : -1)); // B [K, N]: rows past K are TMA's zeros
    BOOST_TEST(u.source.find("void __launch_bounds__(256) " + u.name + "_pad(") !=
                   std::string::npos,
               name);
    BOOST_TEST(u.source.find(std::string("fpat::padRows<") + (bt ? "true" : "false")) !=
                   std::string::npos,
               name);
    BOOST_TEST(u.source.find("// pad:      K % 8 != 0: A") != std::string::npos, name);
    const codegen::KernelUnit other = unitsFor(name, {130, 136, 1003}, 90).at(0);
    BOOST_TEST(other.name == u.name);
    BOOST_TEST((other.source == u.source), name);
    // Aligned K: no copy.
    const codegen::KernelUnit aligned = unitsFor(name, {130, 136, 1000}, 90).at(0);
    BOOST_TEST(aligned.launches.size() == 1u);
    BOOST_TEST(aligned.name.find("_padk") == std::string::npos);
    BOOST_TEST(aligned.launches[0].tma[0].copy == -1);
  }
}

BOOST_AUTO_TEST_CASE(weights_that_tma_reads_badly_are_prepared_once) {
  // A weight B [K, N] whose rows are not 128-byte multiples (N % 64 != 0, N % 8 != 0 included)
  // and a weight B [N, K] with K % 8 != 0 are read from a copy in [N, paddedK(K)] rows that a
  // PreparedWeight launch writes when the weight is uploaded; the kernel reads B K-major.
  struct Case {
    const char* name;
    Shape s;
    bool srcKN; // the weight is [K, N]
    bool padA;  // K % 8 != 0: A is still padded on every run
  };
  for (const Case& c :
       {Case{"gemm_residual", {1536, 4104, 4096}, true, false},
        Case{"gemm_bias_gelu", {77, 100, 64}, true, false},
        Case{"gemm", {65, 4100, 1001}, true, true}, Case{"gemm_bt", {130, 136, 1001}, false, true}})
    BOOST_TEST_CONTEXT(c.name << " " << c.s.str()) {
      const codegen::KernelUnit u = unitsFor(c.name, c.s, 90, nullptr, true).at(0);
      BOOST_TEST_REQUIRE(u.tile.wgmma());
      BOOST_TEST(u.preparedB);
      BOOST_TEST(u.name.find("_bprep") != std::string::npos, u.name);
      BOOST_REQUIRE(u.launches.size() == (c.padA ? 3u : 2u));
      BOOST_TEST(u.launches[0].grid == codegen::Launch::PreparedWeight);
      BOOST_TEST(u.launches[0].entry == u.name + "_prep");
      BOOST_TEST(u.source.find(std::string("fpat::prepareWeightB<") + (c.srcKN ? "true" : "false") +
                               ", 1>(a)") != std::string::npos);
      if (c.padA) { // A only: B comes prepared
        BOOST_TEST(u.launches[1].grid == codegen::Launch::PaddedRows);
        BOOST_TEST(u.source.find("fpat::padRows<false, 1>(a)") != std::string::npos);
      }
      const codegen::Launch& l = u.launches.back();
      BOOST_TEST(l.grid == codegen::Launch::Persistent);
      BOOST_TEST(l.tma[1].copy == 1); // B from padded[1], K-major
      BOOST_TEST(l.tma[1].inner == c.s.k);
      BOOST_TEST(l.tma[1].outer == c.s.n);
      BOOST_TEST(u.source.find("fpat::gemmWgmma<Tile, true, Epilogue>(p)") != std::string::npos);
      BOOST_TEST(u.source.find("// weight:   B is a weight") != std::string::npos);
      // The same shapes with B a plain input: read as given (or the cp.async fallback where TMA
      // cannot read it), nothing prepared.
      const codegen::KernelUnit plain = unitsFor(c.name, c.s, 90).at(0);
      BOOST_TEST(!plain.preparedB);
      BOOST_TEST(plain.tile.wgmma() == (c.s.n % 8 == 0 || !c.srcKN));
      for (const codegen::Launch& pl : plain.launches)
        BOOST_TEST(pl.grid != codegen::Launch::PreparedWeight);
    }
  // Weights TMA reads well stay as they are (norm_gemm's: norm_gemm_defers_its_norm_...).
  for (const char* name : {"gemm_bias_gelu", "gemm_bt"})
    BOOST_TEST_CONTEXT(name) {
      BOOST_TEST(!unitsFor(name, {1024, 4096, 4096}, 90, nullptr, true).back().preparedB);
    }
  // A forced cp.async configuration reads the weight as given.
  const codegen::TileConfig mma{128, 128, 32, 64, 32, 3, codegen::Backend::MmaSync};
  BOOST_TEST(!unitsFor("gemm", {1536, 4104, 4096}, 90, &mma, true).at(0).preparedB);
  // Off sm_90 nothing is prepared either.
  BOOST_TEST(!unitsFor("gemm", {1536, 4104, 4096}, 80, nullptr, true).at(0).preparedB);
}

// The cost model prices a deferred norm's statistics by the form codegen::expectedNormStats
// predicts without a tile; the generator decides with the heuristic's tile. They must agree.
BOOST_AUTO_TEST_CASE(the_cost_models_statistics_form_is_the_generators) {
  for (const char* form : {"", "grid", "launch", "loop"})
    for (const char* name : {"rmsnorm_gemm", "layernorm_gemm", "layernorm_gemm_bias_gelu",
                             "rmsnorm_gemm_swiglu", "rmsnorm_gemm_geglu"})
      for (Shape s : {Shape{1, 4096, 4096}, Shape{333, 1000, 1003}, Shape{512, 11008, 4096},
                      Shape{4096, 4096, 1600}, Shape{77, 36, 64}})
        BOOST_TEST_CONTEXT(form << " " << name << " " << s.m << "x" << s.n << "x" << s.k) {
          setenv("FPAT_NORM_STATS", form, 1);
          const ir::Graph f = fuse(caseGraph(name, s, true));
          codegen::CodegenOptions o;
          o.arch = 90;
          size_t fused = 0;
          for (ir::Vertex v : f.vertices()) {
            if (f.op(v).kind != ir::OpKind::Fused)
              continue;
            ++fused;
            const codegen::KernelUnit u = codegen::generate(f, v, builtinLibrary().activations, o);
            BOOST_TEST((u.normStats == codegen::expectedNormStats(f, v)));
            BOOST_TEST((u.normStats != codegen::NormStats::None)); // the norm deferred
          }
          unsetenv("FPAT_NORM_STATS");
          BOOST_TEST(fused == 1u);
        }
}

BOOST_AUTO_TEST_CASE(norm_gemm_defers_its_norm_where_its_weights_are_known) {
  auto entries = [](const codegen::KernelUnit& u) {
    std::vector<std::string> e;
    for (const codegen::Launch& l : u.launches)
      e.push_back(l.entry.substr(u.name.size()));
    return e;
  };
  // RMSNorm with FPAT_NORM_STATS=launch: gamma folded into the prepared B, a statistics
  // launch, the GEMM overlapping it.
  for (Shape s : {Shape{1024, 4096, 4096}, Shape{333, 1000, 1032}, Shape{1, 4104, 4096}})
    BOOST_TEST_CONTEXT(s.m << "x" << s.n << "x" << s.k) {
      setenv("FPAT_NORM_STATS", "launch", 1);
      const codegen::KernelUnit u = unitsFor("rmsnorm_gemm", s, 90, nullptr, true).at(0);
      unsetenv("FPAT_NORM_STATS");
      BOOST_TEST(u.tile.wgmma());
      BOOST_TEST((u.deferredNorm == ir::NormKind::RmsNorm));
      BOOST_TEST(!u.needsRowStats);
      BOOST_TEST((u.normStats == codegen::NormStats::Launch));
      BOOST_TEST(u.preparedB);
      BOOST_TEST((entries(u) == std::vector<std::string>{"_prep", "_rowstats", ""}));
      BOOST_TEST((u.launches[1].grid == codegen::Launch::Rows));
      BOOST_TEST(u.launches.back().overlapsPrevious);
      BOOST_TEST(!u.launches[1].overlapsPrevious);
      BOOST_TEST(u.launches.back().tma[0].operand == 0); // the raw x
      BOOST_TEST(u.launches.back().tma[1].copy == 1);    // the folded B
      BOOST_TEST(u.source.find("fpat::prepareWeightB<true, 2, true>(a)") != std::string::npos);
      BOOST_TEST(u.source.find("fpat::deferredNormStats<false>(a)") != std::string::npos);
      BOOST_TEST(u.source.find("kNorm = 2;") != std::string::npos);
      BOOST_TEST(u.source.find("kNormStats = false;") != std::string::npos);
      BOOST_TEST(u.source.find("// norm:     deferred") != std::string::npos);
      BOOST_TEST(codegen::preparedBBytes(u) ==
                 static_cast<size_t>(s.n) * static_cast<size_t>(codegen::paddedK(s.k)) * 2);
    }
  // FPAT_NORM_STATS=loop: the statistics summed in the main loop (no launch of their own,
  // every tile whole, also where the last wave would be split).
  for (Shape s : {Shape{1024, 4096, 4096}, Shape{2047, 5120, 2048}}) {
    setenv("FPAT_NORM_STATS", "loop", 1);
    const codegen::KernelUnit u = unitsFor("rmsnorm_gemm", s, 90, nullptr, true).at(0);
    unsetenv("FPAT_NORM_STATS");
    BOOST_TEST((u.normStats == codegen::NormStats::Loop));
    BOOST_TEST(!u.splitLastWave);
    BOOST_TEST((entries(u) == std::vector<std::string>{"_prep", ""}));
    BOOST_TEST(!u.launches.back().overlapsPrevious);
    BOOST_TEST(u.source.find("kNormStats = true;") != std::string::npos);
    BOOST_TEST(u.source.find("kSplit = false;") != std::string::npos);
    BOOST_TEST(u.name.find("_statsloop") != std::string::npos, u.name);
  }
  // By default (and FPAT_NORM_STATS=grid): read by the GEMM's own statistics warps (no launch,
  // whole tiles, a zeroed block of counters sized by the tiles' rows), except where those warps
  // apply a deferred epilogue (layernorm_gemm_bias_gelu keeps the launch).
  for (const char* form : {"", "grid"})
    for (Shape s : {Shape{1024, 4096, 4096}, Shape{2047, 5120, 2048}, Shape{1, 4104, 4096}}) {
      setenv("FPAT_NORM_STATS", form, 1);
      const codegen::KernelUnit u = unitsFor("rmsnorm_gemm", s, 90, nullptr, true).at(0);
      const codegen::KernelUnit gelu =
          unitsFor("layernorm_gemm_bias_gelu", s, 90, nullptr, true).at(0);
      unsetenv("FPAT_NORM_STATS");
      BOOST_TEST((u.normStats == codegen::NormStats::Grid));
      BOOST_TEST(!u.splitLastWave);
      BOOST_TEST((entries(u) == std::vector<std::string>{"_prep", ""}));
      BOOST_TEST(!u.launches.back().overlapsPrevious);
      BOOST_TEST(u.scratchBytes ==
                 (2 + static_cast<size_t>((s.m + u.tile.bm - 1) / u.tile.bm)) * sizeof(unsigned));
      BOOST_TEST(u.source.find("kNormGrid = true;") != std::string::npos);
      BOOST_TEST(u.name.find("_statsgrid") != std::string::npos, u.name);
      if (gelu.source.find("kDefer = true;") != std::string::npos) {
        BOOST_TEST((gelu.normStats == codegen::NormStats::Launch));
        BOOST_TEST(gelu.source.find("kNormGrid") == std::string::npos);
      } else {
        BOOST_TEST((gelu.normStats == codegen::NormStats::Grid));
      }
    }
  // LayerNorm: the column terms prepared too; K % 8 != 0 pads A before the statistics.
  {
    const codegen::KernelUnit u =
        unitsFor("layernorm_gemm_bias_gelu", {777, 1000, 1003}, 90, nullptr, true).at(0);
    BOOST_TEST((u.deferredNorm == ir::NormKind::LayerNorm));
    BOOST_TEST(
        (entries(u) == std::vector<std::string>{"_prep", "_prepcols", "_pad", "_rowstats", ""}));
    BOOST_TEST((u.launches[1].grid == codegen::Launch::PreparedColumns));
    BOOST_TEST(u.launches[1].preparesWeights());
    BOOST_TEST(!u.launches[2].preparesWeights());
    BOOST_TEST(u.source.find("fpat::prepareNormColumns<true, 3>(a)") != std::string::npos);
    BOOST_TEST(u.source.find("fpat::deferredNormStats<true>(a)") != std::string::npos);
    BOOST_TEST(u.source.find("kNorm = 1;") != std::string::npos);
    // Two f32 column vectors, padded to whole 256-column tiles, behind the [N, K] copy.
    BOOST_TEST(codegen::preparedBBytes(u) == 1000u * 1008u * 2u + 2u * 1024u * 4u);
  }
  // gamma a plain input (it may change between runs): the cp.async kernel normalising A on
  // load, and a forced wgmma configuration says why it falls back.
  {
    const codegen::KernelUnit u = unitsFor("rmsnorm_gemm", {1024, 4096, 4096}, 90).at(0);
    BOOST_TEST(!u.tile.wgmma());
    BOOST_TEST(u.needsRowStats);
    BOOST_TEST((u.deferredNorm == ir::NormKind::None));
    const codegen::TileConfig w = *codegen::TileConfig::parse("128x256x64_w2x1_s3_wgmma");
    const codegen::KernelUnit f = unitsFor("layernorm_gemm", {1024, 4096, 4096}, 90, &w).at(0);
    BOOST_TEST(!f.tile.wgmma());
    BOOST_TEST(f.what.find("only where W, gamma and beta are weights") != std::string::npos,
               f.what);
  }
  // Off sm_90 the cp.async kernels as before, weights or not.
  const codegen::KernelUnit old =
      unitsFor("layernorm_gemm", {1024, 4096, 4096}, 80, nullptr, true).at(0);
  BOOST_TEST(!old.tile.wgmma());
  BOOST_TEST(old.needsRowStats);
  BOOST_TEST(!old.preparedB);
}

BOOST_AUTO_TEST_CASE(dual_gemms_are_one_wgmma_kernel_over_interleaved_weights) {
  auto entries = [](const codegen::KernelUnit& u) {
    std::vector<std::string> e;
    for (const codegen::Launch& l : u.launches)
      e.push_back(l.entry.substr(u.name.size()));
    return e;
  };
  for (Shape s : {Shape{333, 1000, 1003}, Shape{1, 11008, 4096}, Shape{4096, 17, 64}})
    BOOST_TEST_CONTEXT(s.str()) {
      const codegen::KernelUnit u = unitsFor("gemm_swiglu", s, 90, nullptr, true).at(0);
      BOOST_TEST(u.dual);
      BOOST_TEST(u.tile.wgmma());
      BOOST_TEST(u.preparedB);
      BOOST_TEST(u.N == s.n); // the result's columns; the GEMM computes twice as many
      BOOST_TEST(u.gemmColumns() == codegen::dualColumns(s.n));
      BOOST_TEST(codegen::dualColumns(s.n) == 2 * ((s.n + 7) / 8 * 8));
      // K % 8 != 0: A padded by a launch of its own first.
      BOOST_TEST((entries(u) == (s.k % 8 ? std::vector<std::string>{"_prep", "_pad", ""}
                                         : std::vector<std::string>{"_prep", ""})));
      // Bg and Bu ($1, $2) interleaved into one copy, B [K, N] read transposed.
      BOOST_TEST(u.source.find("fpat::prepareWeightB<true, 1, false, true>(a)") !=
                     std::string::npos,
                 u.source.substr(0, 2000));
      BOOST_TEST(u.source.find("// dual:") != std::string::npos);
      BOOST_TEST(u.source.find("kDual = true") != std::string::npos);
      BOOST_TEST(codegen::preparedBBytes(u) == static_cast<size_t>(codegen::dualColumns(s.n)) *
                                                   static_cast<size_t>(codegen::paddedK(s.k)) * 2);
    }
  // Kernels are shape-free: one name, one source (a shape in the comment once made two dual
  // ops of one configuration an internal error).
  const codegen::TileConfig t64 = *codegen::TileConfig::parse("64x64x64_w1x1_s12_wgmma");
  const codegen::KernelUnit big = unitsFor("gemm_swiglu", {2047, 5504, 2048}, 90, &t64, true).at(0);
  const codegen::KernelUnit small = unitsFor("gemm_swiglu", {16, 4099, 1024}, 90, &t64, true).at(0);
  BOOST_TEST(big.name == small.name);
  BOOST_TEST(big.source == small.source);
  // With the RMSNorm in front: gamma folded into both halves, one statistics read for both.
  const codegen::KernelUnit n =
      unitsFor("rmsnorm_gemm_geglu", {200, 2752, 2048}, 90, nullptr, true).at(0);
  BOOST_TEST(n.dual);
  BOOST_TEST((n.deferredNorm == ir::NormKind::RmsNorm));
  BOOST_TEST((n.normStats == codegen::NormStats::Grid));
  BOOST_TEST((entries(n) == std::vector<std::string>{"_prep", ""}));
  // Rows shorter than 2048: the statistics in a launch of their own (the grid's waits cost more).
  const codegen::KernelUnit shortRows =
      unitsFor("rmsnorm_gemm_geglu", {200, 2752, 1024}, 90, nullptr, true).at(0);
  BOOST_TEST((shortRows.normStats == codegen::NormStats::Launch));
  BOOST_TEST(n.source.find("fpat::prepareWeightB<true, 2, true, true>(a)") != std::string::npos);
  // A forced configuration of another backend falls back to a wgmma one and says why.
  const codegen::TileConfig mma = *codegen::TileConfig::parse("128x128x32_w2x4_s3");
  const codegen::KernelUnit f = unitsFor("gemm_geglu", {512, 1024, 512}, 90, &mma, true).at(0);
  BOOST_TEST(f.tile.wgmma());
  BOOST_TEST(f.what.find("the dual GEMM has a wgmma kernel only") != std::string::npos, f.what);
  // Off sm_90, or over plain inputs, the kernel cannot be generated: a clear error (fpatc
  // splits such ops first, and never fuses plain inputs so).
  ir::Graph g = fuse(caseGraph("gemm_swiglu", {64, 64, 64}, true));
  codegen::CodegenOptions o;
  o.arch = 80;
  BOOST_CHECK_EXCEPTION(codegen::generate(g, g.outputs()[0], builtinLibrary().activations, o),
                        codegen::CodegenError, [](const codegen::CodegenError& e) {
                          return std::string(e.what()).find("sm_90) only, not sm_80") !=
                                 std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(wgmma_epilogue_goes_through_a_tma_stored_tile_where_it_fits) {
  using codegen::Backend;
  using codegen::TileConfig;
  const TileConfig s3{128, 256, 64, 64, 256, 3, Backend::Wgmma},
      s4{128, 256, 64, 64, 256, 4, Backend::Wgmma},
      pingpong{128, 128, 64, 128, 128, 5, Backend::WgmmaPingPong};
  BOOST_TEST(codegen::wgmmaEpilogueTile(s3, 4096));
  BOOST_TEST(!codegen::wgmmaEpilogueTile(s4, 4096)); // 4 stages and 64 KB: beyond 227 KB
  BOOST_TEST(!codegen::wgmmaEpilogueTile(s3, 4100)); // TMA needs N % 8 == 0
  BOOST_TEST(!codegen::wgmmaEpilogueTile(pingpong, 4096));
  auto unit = [&](const char* name, Shape sh, const TileConfig& t) {
    ir::Graph f = fuse(caseGraph(name, sh));
    codegen::CodegenOptions o;
    o.arch = 90;
    o.tile = &t;
    return codegen::generate(f, f.outputs()[0], builtinLibrary().activations, o);
  };
  // The residual comes into the tile by TMA (map c), the output leaves it by TMA (map d).
  codegen::KernelUnit u = unit("gemm_bias_residual", {300, 520, 64}, s3);
  BOOST_REQUIRE(u.launches.size() == 1u);
  const codegen::Launch& l = u.launches[0];
  BOOST_REQUIRE(l.tma.size() == 4u);
  BOOST_TEST(l.tma[2].operand >= 0);
  BOOST_TEST(l.tma[2].inner == 520);
  BOOST_TEST(l.tma[2].outer == 300);
  BOOST_TEST(l.tma[2].boxOuter == 128);
  BOOST_TEST(l.tma[3].operand == codegen::TmaMap::kOutput);
  BOOST_TEST(l.smemBytes == codegen::gemmSmemBytes(s3, false) + 128 * 256 * 2);
  const std::string staged = "kStaged = " + std::to_string(l.tma[2].operand) + ";";
  BOOST_TEST(u.source.find(staged) != std::string::npos, u.source);
  BOOST_TEST(u.source.find("kTile = true;") != std::string::npos);
  BOOST_TEST(u.source.find("staged in shared memory by TMA") != std::string::npos);
  BOOST_TEST(u.source.find("wgmmaSmemBytes<Tile, true>()") != std::string::npos);
  BOOST_TEST(u.source.find("kDefer = false;") != std::string::npos);
  // The bias stays a global load; nothing is staged without an [M, N] operand. The activation
  // is deferred to the producer's idle warps.
  u = unit("gemm_bias_gelu", {300, 520, 64}, s3);
  BOOST_TEST(u.source.find("kStaged = -1;") != std::string::npos);
  BOOST_TEST(u.source.find("kDefer = true;") != std::string::npos);
  BOOST_TEST(u.source.find("the epilogue deferred to the producer's idle warps") !=
             std::string::npos);
  BOOST_TEST(u.launches[0].tma.size() == 4u);
  BOOST_TEST(u.launches[0].tma[2].operand == codegen::TmaMap::kUnused);
  // An activation with an [M, N] operand: deferred, the operand coming to the helpers through
  // the side buffer (one BM x 64 box), where the stages leave room for it.
  u = unit("gemm_silu_mul", {300, 520, 64}, s3);
  BOOST_TEST(u.source.find("kDefer = true;") != std::string::npos);
  BOOST_TEST(u.source.find("kStaged = -1;") == std::string::npos);
  BOOST_TEST(u.source.find("wgmmaSmemBytes<Tile, true, true>()") != std::string::npos);
  BOOST_TEST(u.launches[0].smemBytes ==
             codegen::gemmSmemBytes(s3, false) + 128 * 256 * 2 + 128 * 128);
  BOOST_TEST(u.source.find("defer:    the epilogue deferred to the producer's idle warps, $" +
                           std::to_string(u.launches[0].tma[2].operand) +
                           " coming to them in 128x64 boxes by TMA") != std::string::npos,
             u.source);
  BOOST_TEST(codegen::wgmmaSideBox(s3, 520));
  // Without room for the side buffer the operand goes through the tile, not deferred.
  const codegen::TileConfig deep{128, 128, 64, 64, 128, 6, codegen::Backend::Wgmma};
  BOOST_TEST(codegen::wgmmaEpilogueTile(deep, 520));
  BOOST_TEST(!codegen::wgmmaSideBox(deep, 520));
  u = unit("gemm_silu_mul", {300, 520, 64}, deep);
  BOOST_TEST(u.source.find("kDefer = false;") != std::string::npos);
  BOOST_TEST(u.launches[0].smemBytes == codegen::gemmSmemBytes(deep, false) + 128 * 128 * 2);
  // Without room or with odd N: the shared-memory slabs as before, two maps.
  u = unit("gemm_residual", {300, 520, 64}, s4);
  BOOST_TEST(u.source.find("kTile = false;") != std::string::npos);
  BOOST_TEST(u.launches[0].tma.size() == 2u);
  u = unit("gemm_bt", {300, 517, 64}, s3);
  BOOST_TEST(u.sm90a);
  BOOST_TEST(u.source.find("kTile = false;") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(wgmma_epilogue_adds_a_staged_operand_last_in_element_pairs) {
  // An epilogue ending in an add of the staged [M, N] operand: head() computes the rest (the
  // bias add here), which the kernel rounds before adding the operand in f16 pairs.
  const codegen::TileConfig s3{128, 256, 64, 64, 256, 3, codegen::Backend::Wgmma};
  auto unit = [&](const char* name) {
    ir::Graph f = fuse(caseGraph(name, {300, 520, 64}));
    codegen::CodegenOptions o;
    o.arch = 90;
    o.tile = &s3;
    return codegen::generate(f, f.outputs()[0], builtinLibrary().activations, o);
  };
  auto between = [](const std::string& src, const std::string& from, const std::string& to) {
    const size_t a = src.find(from);
    return a == std::string::npos ? std::string() : src.substr(a, src.find(to, a) - a);
  };
  codegen::KernelUnit u = unit("gemm_bias_residual");
  BOOST_TEST(u.source.find("kAddStaged = true;") != std::string::npos, u.source);
  const std::string head = between(u.source, "float2 head(", "\n  }\n");
  BOOST_TEST(head.find("fpat::ldh2(a.in[2], col)") != std::string::npos, head);
  BOOST_TEST(head.find("staged in shared memory") == std::string::npos, head); // no operand
  BOOST_TEST(head.find("return t2;") != std::string::npos, head);
  u = unit("gemm_residual");
  BOOST_TEST(u.source.find("kAddStaged = true;") != std::string::npos);
  BOOST_TEST(between(u.source, "float2 head(", "\n  }\n").find("return t0;") != std::string::npos);
  // A product with the operand, or no operand: the whole epilogue in f32, no head().
  for (const char* name : {"gemm_silu_mul", "gemm_bias_gelu", "gemm"}) {
    u = unit(name);
    BOOST_TEST(u.source.find("kAddStaged = false;") != std::string::npos, name);
    BOOST_TEST(u.source.find("float2 head(") == std::string::npos, name);
  }
}

BOOST_AUTO_TEST_CASE(the_second_element_of_a_pair_takes_the_fma_pipe_forms) {
  // exp and division of every second element run on the FMA pipe (kFma, fpat_common.cuh), so
  // that GeLU and SiLU epilogues do not wait on the MUFU alone: pair() takes kFma (the wgmma
  // header's helpers pass false); the scalar path (edge elements) and unfused elementwise
  // kernels' even elements keep the MUFU forms.
  const codegen::TileConfig s3{128, 256, 64, 64, 256, 3, codegen::Backend::Wgmma};
  for (const char* name : {"gemm_bias_gelu", "gemm_silu_mul"})
    BOOST_TEST_CONTEXT(name) {
      ir::Graph f = fuse(caseGraph(name, {300, 520, 64}));
      codegen::CodegenOptions o;
      o.arch = 90;
      o.tile = &s3;
      const std::string src =
          codegen::generate(f, f.outputs()[0], builtinLibrary().activations, o).source;
      const std::string act = std::string(name) == "gemm_silu_mul" ? "silu" : "gelu";
      const std::string t = std::string(name) == "gemm_silu_mul" ? "t0" : "t2";
      BOOST_TEST(src.find("template <bool kFma = false>\n__device__ __forceinline__ float "
                          "fpat_act_" +
                          act + "(float x)") != std::string::npos,
                 src);
      BOOST_TEST(src.find("make_float2(fpat_act_" + act + "(" + t + ".x), fpat_act_" + act +
                          "<kFma>(" + t + ".y))") != std::string::npos,
                 src);
      BOOST_TEST(src.find("= fpat_act_" + act + "(" + t + ");") != std::string::npos, src);
      BOOST_TEST(src.find("template <bool kFma = true>\n  __device__ __forceinline__ float2 "
                          "pair(") != std::string::npos,
                 src);
    }
  auto ew = unitsFor("activation_leaky_relu", {8, 8, 8}, 90).at(0);
  BOOST_TEST(ew.source.find("template <bool kFma = false>\n  __device__ __forceinline__ float "
                            "operator()(const float* in,") != std::string::npos,
             ew.source);
}

BOOST_AUTO_TEST_CASE(the_last_wave_split_is_compiled_in_where_it_is_planned) {
  using codegen::Backend;
  using codegen::TileConfig;
  // 320 tiles of 128x256 on 132 SMs: the last 56 in two k-pieces; 512 tiles (4096^3): 116 in
  // the last wave, which no plan improves by a tenth of a tile; too few k-tiles for pieces.
  BOOST_TEST(codegen::lastWaveSplit(320, 132, 80).tiles == 56);
  BOOST_TEST(codegen::lastWaveSplit(320, 132, 80).pieces == 2);
  BOOST_TEST(codegen::lastWaveSplit(512, 132, 64).tiles == 0);
  BOOST_TEST(codegen::lastWaveSplit(320, 132, 1).tiles == 0);
  BOOST_TEST(codegen::lastWaveSplit(128, 132, 64).tiles == 0); // two rounds of halves: none
  // Fewer tiles than SMs (decode shapes): all of them in pieces where K pays, one round.
  BOOST_TEST(codegen::lastWaveSplit(64, 132, 172).tiles == 64); // 77x4096x11008, 64x128
  BOOST_TEST(codegen::lastWaveSplit(64, 132, 172).pieces == 2);
  BOOST_TEST(codegen::lastWaveSplit(32, 132, 172).pieces == 3); // slots: 64 of 132
  BOOST_TEST(codegen::lastWaveSplit(86, 132, 64).tiles == 0);   // 172 pieces: two rounds
  BOOST_TEST(codegen::lastWaveSplit(64, 132, 30).tiles == 0);   // too short
  BOOST_TEST(codegen::lastWaveSplit(132, 132, 172).tiles == 0); // one whole wave
  BOOST_TEST(codegen::lastWaveSplit(264, 132, 64).tiles == 0);  // whole waves
  // The partial sums cost about as much as 12-16 k-tiles: short tiles stay whole (2047x5120
  // measured 5% slower split at K = 1024), from about 31 k-tiles on the split pays.
  BOOST_TEST(codegen::lastWaveSplit(320, 132, 16).tiles == 0);
  BOOST_TEST(codegen::lastWaveSplit(320, 132, 30).tiles == 0);
  BOOST_TEST(codegen::lastWaveSplit(320, 132, 32).tiles == 56);
  BOOST_TEST(codegen::lastWaveSplit(320, 132, 80).waves < 0.9);
  BOOST_TEST(codegen::lastWaveSplit(320, 132, 80).waves > 0.5);
  // 160 tiles of 64x64 with 48 k-tiles: the last 28 in two pieces (four would cost more in
  // partial sums than they save).
  BOOST_TEST(codegen::lastWaveSplit(160, 132, 48).pieces == 2);
  BOOST_TEST(codegen::lastWaveSplit(160, 132, 48).tiles == 28);
  const TileConfig s3{128, 256, 64, 64, 256, 3, Backend::Wgmma},
      c2{128, 256, 64, 64, 256, 3, Backend::Wgmma, 2},
      pingpong{128, 128, 64, 128, 128, 5, Backend::WgmmaPingPong},
      small = *TileConfig::parse("64x64x64_w1x1_s8_wgmma");
  auto unit = [&](const char* name, Shape sh, const TileConfig& t) {
    ir::Graph f = fuse(caseGraph(name, sh));
    codegen::CodegenOptions o;
    o.arch = 90;
    o.sms = 132;
    o.tile = &t;
    return codegen::generate(f, f.outputs()[0], builtinLibrary().activations, o);
  };
  codegen::KernelUnit u = unit("gemm_residual", {2047, 5120, 5120}, s3);
  BOOST_TEST(u.splitLastWave);
  BOOST_TEST(u.name.size() > 7);
  BOOST_TEST(u.name.substr(u.name.size() - 7) == "_splitk", u.name);
  BOOST_TEST(u.source.find("kSplit = true;") != std::string::npos);
  BOOST_TEST(u.source.find("split:    the last wave's tiles in k-pieces") != std::string::npos,
             u.source);
  BOOST_TEST(u.what.find("(the last 56 tiles in 2 k-pieces on 132 SMs)") != std::string::npos,
             u.what);
  // One name, one source: ops of other shapes with other plans share the kernel (a graph with
  // two of them stopped with an internal error when the plan was written into the source).
  BOOST_TEST(unit("gemm_residual", {2047, 4352, 5120}, s3).name == u.name);
  BOOST_TEST(unit("gemm_residual", {2047, 4352, 5120}, s3).what.find("(the last 8 tiles") !=
             std::string::npos);
  BOOST_TEST(unit("gemm_residual", {2047, 4352, 5120}, s3).source == u.source);
  for (Shape sh : {Shape{4096, 4096, 4096}, Shape{2047, 5120, 40}}) {
    u = unit("gemm_residual", sh, s3);
    BOOST_TEST(!u.splitLastWave, sh.str());
    BOOST_TEST(u.source.find("kSplit = false;") != std::string::npos);
    BOOST_TEST(u.name.find("_splitk") == std::string::npos);
  }
  // Clusters and ping-pong never split.
  BOOST_TEST(!unit("gemm", {2047, 5120, 5120}, c2).splitLastWave);
  BOOST_TEST(!unit("gemm", {2047, 5120, 5120}, pingpong).splitLastWave);
  // The GPU test's shapes (last_wave_split_at_ragged_shapes, 132 SMs) are split, but the two
  // with 2 and 1 k-tiles.
  for (Shape sh : {Shape{600, 1000, 2048}, Shape{600, 1000, 3072}, Shape{1000, 1104, 3072}})
    BOOST_TEST(unit("gemm_bias_gelu", sh, small).splitLastWave, sh.str());
  for (Shape sh : {Shape{600, 1000, 104}, Shape{600, 1000, 40}})
    BOOST_TEST(!unit("gemm_bias_gelu", sh, small).splitLastWave, sh.str());
  BOOST_TEST(unit("gemm_residual", {1100, 4200, 2560}, s3).splitLastWave);
  BOOST_TEST(!unit("gemm_residual", {1100, 4200, 200}, s3).splitLastWave);
  // Under one wave: 32 tiles of 64x64 at 77x1000x4096, all split (the GPU test's shape).
  u = unit("gemm_residual", {77, 1000, 4096}, small);
  BOOST_TEST(u.splitLastWave);
  BOOST_TEST(u.what.find("(all 32 tiles in 2 k-pieces on 132 SMs)") != std::string::npos, u.what);
  u = unit("gemm_bias_gelu", {50, 1496, 11000}, *TileConfig::parse("64x128x64_w1x1_s8_wgmma"));
  BOOST_TEST(u.what.find("(all 12 tiles in 3 k-pieces on 132 SMs)") != std::string::npos, u.what);
}

BOOST_AUTO_TEST_CASE(wgmma_backend_compiles_for_sm90a_without_serialization,
                     *boost::unit_test::precondition(nvccPresent)) {
  // Every GEMM-family pattern, both B layouts, every tile shape of the template: nvcc accepts
  // them and ptxas keeps the wgmma asynchronous (a serialization warning fails the compile).
  TempDir cache;
  std::vector<codegen::KernelUnit> units;
  std::vector<codegen::TileConfig> tiles;
  for (const codegen::TileConfig& t : codegen::wgmmaConfigs())
    if (tiles.empty() || tiles.back().bm != t.bm || tiles.back().bn != t.bn ||
        tiles.back().cluster != t.cluster || tiles.back().backend != t.backend ||
        tiles.back().rasterN != t.rasterN || tiles.back().aRows != t.aRows ||
        codegen::wgmmaEpilogueTile(tiles.back(), 512) != codegen::wgmmaEpilogueTile(t, 512))
      tiles.push_back(t); // each shape once, with and without the epilogue tile
  for (const char* name :
       {"gemm", "gemm_bt", "gemm_bias_gelu", "gemm_bias_silu", "gemm_bias_relu", "gemm_bias",
        "gemm_bias_residual", "gemm_gelu", "gemm_silu", "gemm_residual", "gemm_silu_mul",
        "layernorm_gemm_bias_gelu", "layernorm_gemm", "rmsnorm_gemm"})
    for (const codegen::TileConfig& t : tiles) {
      const std::string n = name;
      if (n != "gemm" && n != "gemm_bias_gelu" && n != "layernorm_gemm_bias_gelu" &&
          !(t.bm == 128 && t.bn == 256))
        continue; // all shapes for three patterns, the default shape for the rest
      // norm_gemm with its weights known: the deferred norm.
      const bool norm = n.find("norm") != std::string::npos;
      // With the last wave split compiled in as well (320 tiles of 128x256 on 132 SMs) for
      // the epilogues' kinds: plain, deferred, staged operand, side buffer, B [N, K].
      const bool split =
          t.bm == 128 && t.bn == 256 && t.backend == codegen::Backend::Wgmma && t.cluster == 1 &&
          !t.rasterN &&
          (n == "gemm" || n == "gemm_bt" || n == "gemm_bias_gelu" || n == "gemm_residual" ||
           n == "gemm_silu_mul" || n == "layernorm_gemm_bias_gelu");
      // Short A boxes at a decode shape (16 rows; the others would fall back).
      for (Shape sh : {Shape{t.aRows > 0 ? 16 : 256, 512, 128}, Shape{2047, 5120, 2048}}) {
        if (sh.m == 2047 && !split)
          continue;
        ir::Graph f = fuse(caseGraph(name, sh, norm));
        codegen::CodegenOptions o;
        o.arch = 90;
        o.sms = 132;
        o.tile = &t;
        codegen::KernelUnit u =
            codegen::generate(f, f.outputs()[0], builtinLibrary().activations, o);
        BOOST_TEST(u.sm90a, name << " " << t.str());
        BOOST_TEST((u.deferredNorm != ir::NormKind::None) == norm, name << " " << t.str());
        BOOST_TEST(u.tile.str() == t.str());
        // (A deferred norm whose statistics the grid's warps read keeps every tile whole.)
        BOOST_TEST(u.splitLastWave == (sh.m == 2047 && u.normStats != codegen::NormStats::Grid),
                   name << " " << t.str() << " " << sh.str());
        units.push_back(std::move(u));
      }
    }
  // The deferred norm's statistics summed in the main loop (FPAT_NORM_STATS=loop): by the
  // producer's idle warps (rmsnorm_gemm, layernorm_gemm) or by the consumers (where those warps
  // apply the deferred GeLU), on the cooperative, two-m64, ping-pong, cluster, 256-row and
  // short-A-box configurations (test_gpu's normConfigs).
  setenv("FPAT_NORM_STATS", "loop", 1);
  std::vector<codegen::TileConfig> statsTiles;
  for (const char* cfg : {"128x256x64_w2x1_s3_wgmma", "128x128x64_w1x1_s6_pingpong",
                          "64x256x64_w1x1_s5_pingpong", "128x256x64_w2x1_s3_wgmma_c2"})
    statsTiles.push_back(*codegen::TileConfig::parse(cfg));
  for (const codegen::TileConfig& t : codegen::wgmmaConfigs())
    if ((t.bm == 256 && statsTiles.size() == 4) ||
        (t.aRows == 16 && t.bn == 64 && statsTiles.size() == 5))
      statsTiles.push_back(t);
  BOOST_TEST_REQUIRE(statsTiles.size() == 6u);
  // Then FPAT_NORM_STATS=grid (the default) on the same configurations, with the dual GEMM.
  const std::pair<const char*, std::vector<const char*>> forms[] = {
      {"loop", {"rmsnorm_gemm", "layernorm_gemm", "layernorm_gemm_bias_gelu"}},
      {"grid", {"rmsnorm_gemm", "layernorm_gemm", "rmsnorm_gemm_swiglu"}}};
  for (const auto& [form, names] : forms) {
    setenv("FPAT_NORM_STATS", form, 1);
    for (const char* name : names)
      for (const codegen::TileConfig& tile : statsTiles) {
        ir::Graph f = fuse(caseGraph(name, {tile.aRows > 0 ? 16 : 2047, 5120, 2048}, true));
        codegen::CodegenOptions o;
        o.arch = 90;
        o.tile = &tile;
        units.push_back(codegen::generate(f, f.outputs()[0], builtinLibrary().activations, o));
        const codegen::NormStats want =
            std::string(form) == "grid" ? codegen::NormStats::Grid : codegen::NormStats::Loop;
        BOOST_TEST((units.back().normStats == want), form << " " << name << " " << tile.str());
      }
  }
  unsetenv("FPAT_NORM_STATS");
  // The dual GEMMs: both B layouts, tiles whose result is whole slabs of 64 columns and not
  // (128x192: 96), ping-pong, and the last wave split.
  for (const char* name : {"gemm_swiglu", "rmsnorm_gemm_geglu"})
    for (const char* cfg : {"128x256x64_w2x1_s3_wgmma", "128x192x64_w2x1_s4_wgmma",
                            "64x64x64_w1x1_s12_wgmma", "128x128x64_w1x1_s6_pingpong"})
      for (Shape sh : {Shape{2047, 5504, 2048}, Shape{16, 4099, 1024}}) {
        if (sh.m == 16 && std::string(cfg) != "64x64x64_w1x1_s12_wgmma")
          continue; // a ragged N at a decode shape once
        const codegen::TileConfig tile = *codegen::TileConfig::parse(cfg);
        ir::Graph f = fuse(caseGraph(name, sh, true));
        codegen::CodegenOptions o;
        o.arch = 90;
        o.sms = 132;
        o.tile = &tile;
        units.push_back(codegen::generate(f, f.outputs()[0], builtinLibrary().activations, o));
        BOOST_TEST(units.back().dual, name << " " << cfg);
      }
  runtime::NvccOptions o;
  o.arch = 90;
  o.cacheDir = cache.path.string();
  for (const runtime::CompiledKernel& k : runtime::compileAll(units, o))
    BOOST_TEST(k.error.empty(), k.name << ": " << k.error);
}

BOOST_AUTO_TEST_CASE(damaged_cache_entries_are_compiled_again,
                     *boost::unit_test::precondition(nvccPresent)) {
  TempDir cache;
  runtime::NvccOptions o;
  o.arch = 80;
  o.cacheDir = cache.path.string();
  std::vector<codegen::KernelUnit> units = unitsFor("add", {8, 8, 8}, 80);
  BOOST_REQUIRE(units.size() == 1u);
  auto first = runtime::compileAll(units, o).at(0);
  BOOST_REQUIRE(first.error.empty());
  BOOST_TEST(!first.cached);
  std::string good;
  BOOST_REQUIRE(readFile(first.cubinPath, good));
  BOOST_TEST(runtime::compileAll(units, o).at(0).cached); // intact: served from the cache
  // Emptied, truncated, or without its size/hash record: compiled again, with a warning.
  for (int damage = 0; damage < 3; ++damage)
    BOOST_TEST_CONTEXT("damage " << damage) {
      if (damage == 2)
        fs::remove(first.cubinPath + ".sha256");
      else
        runtime::writeFileAtomic(first.cubinPath,
                                 damage == 0 ? "" : good.substr(0, good.size() / 2));
      auto again = runtime::compileAll(units, o).at(0);
      BOOST_TEST(again.error.empty(), again.error);
      BOOST_TEST(!again.cached);
      BOOST_TEST(again.warning.find("is damaged") != std::string::npos, again.warning);
      std::string now; // nvcc's output is not byte-for-byte reproducible: whole, not equal
      BOOST_TEST(readFile(again.cubinPath, now));
      BOOST_TEST(now.size() > good.size() / 2);
      BOOST_TEST(runtime::compileAll(units, o).at(0).cached);
    }
  // A kernel header in the cache emptied: restored before the next compile (every compile
  // once failed from then on).
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(cache.path / "include"))
    if (e.path().extension() == ".cuh")
      runtime::writeFileAtomic(e.path().string(), "");
  auto other = runtime::compileAll(unitsFor("mul", {8, 8, 8}, 80), o).at(0);
  BOOST_TEST(other.error.empty(), other.error);
  BOOST_TEST(!other.cached);
}

BOOST_AUTO_TEST_CASE(temporaries_of_dead_processes_are_removed) {
  // What a process killed mid-write leaves (its PID is gone) is removed by the next run; a live
  // writer's file stays.
  TempDir dir;
  pid_t dead = fork();
  if (dead == 0)
    _exit(0);
  BOOST_REQUIRE(dead > 0);
  waitpid(dead, nullptr, 0);
  const fs::path stale = dir.path / ("k.cubin.tmp." + std::to_string(dead) + ".1");
  const fs::path live = dir.path / ("k.cubin.tmp." + std::to_string(::getpid()) + ".1");
  const fs::path entry = dir.path / "k.cubin";
  for (const fs::path& p : {stale, live, entry})
    runtime::writeFileAtomic(p.string(), "x");
  BOOST_TEST(runtime::removeStaleTemporaries(dir.path.string()) == 1);
  BOOST_TEST(!fs::exists(stale));
  BOOST_TEST(fs::exists(live));
  BOOST_TEST(fs::exists(entry));
}

BOOST_AUTO_TEST_CASE(validation_scale_has_a_floor_at_the_smallest_normal_f16) {
  // One subnormal step (2^-24) between outputs of about 1e-7 is rounding, not a wrong kernel;
  // a difference of the values' own size at a normal scale still fails.
  const ir::TensorDesc d{{1, 4}, ir::DType::F16};
  const float s = 0x1p-24f;
  ir::Tensor want{d, {2 * s, 3 * s, -2 * s, 1 * s}}, got{d, {3 * s, 3 * s, -2 * s, 2 * s}};
  BOOST_TEST(runtime::compareToReference(got, want).pass);
  ir::Tensor bigWant{d, {0.5f, 1.0f, -0.25f, 2.0f}}, bigGot{d, {0.5f, 1.0f, -0.25f, 2.1f}};
  BOOST_TEST(!runtime::compareToReference(bigGot, bigWant).pass);
  ir::Tensor off{d, {20 * s, 3 * s, -2 * s, 1 * s}}; // 18 steps: more than the 1e-2 * 2^-14
  BOOST_TEST(!runtime::compareToReference(off, want).pass);
}

namespace {

/// One attention op; bias 0: a zero constant, 1: a causal weight (bottom-right, fill -inf),
/// 2: a plain input [1, 1, Sq, Sk], 3: a weight of 0 and -inf that is not causal.
ir::Graph attentionGraph(int64_t sq, int64_t sk, int64_t d, int bias) {
  ir::GraphBuilder b("attention");
  auto q = b.input("q", {2 * sq, 4 * d});
  auto k = b.input("k", {2 * sk, 2 * d});
  auto v = b.input("v", {2 * sk, 2 * d});
  ir::Value m;
  if (bias == 0) {
    m = b.constant(0.0, {});
  } else if (bias == 2) {
    m = b.input("bias", {1, 1, sq, sk});
  } else {
    std::vector<float> data(static_cast<size_t>(sq * sk));
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t j = 0; j < sk; ++j)
        data[static_cast<size_t>(i * sk + j)] =
            (bias == 1 ? j > i + sk - sq : j == 0) ? -std::numeric_limits<float>::infinity() : 0.0f;
    m = b.weight("mask", {1, 1, sq, sk}, ir::DType::F16, data);
  }
  b.output(b.attention(q, k, v, m, b.constant(0.125, {}), 2, d, "o"));
  return b.build();
}

} // namespace

BOOST_AUTO_TEST_CASE(flash_attention_with_three_consumers) {
  // FPAT_FLASH's "t": three consumer warpgroups of 64 query rows (192-row tiles, 512 threads)
  // at head dimension 64; at 128 (too few registers for three) the knob keeps two. Tiles of
  // 192 rows: the grid, Q's TMA box and shared memory follow; the sources compile for sm_90a
  // without serialized wgmma, also where the keys fit one or two blocks (nvcc then knew the
  // block count and merged the loop, and ptxas serialized the wgmma: too few registers).
  std::vector<codegen::KernelUnit> units;
  for (const char* knob : {"128prt", "128prdt"})
    for (int64_t d : {int64_t{64}, int64_t{128}})
      BOOST_TEST_CONTEXT("FPAT_FLASH=" << knob << ", d " << d) {
        setenv("FPAT_FLASH", knob, 1);
        const ir::Graph g = attentionGraph(400, 400, d, 1);
        if (d == 64 && std::string(knob) == "128prdt") {
          const ir::Graph short_ = attentionGraph(129, 129, d, 0);
          codegen::CodegenOptions o;
          units.push_back(
              codegen::generate(short_, short_.outputs()[0], builtinLibrary().activations, o));
          BOOST_TEST(units.back().launches.at(0).threads == 512);
        }
        codegen::CodegenOptions o;
        o.arch = 90;
        o.sms = 132;
        codegen::KernelUnit u =
            codegen::generate(g, g.outputs()[0], builtinLibrary().activations, o);
        unsetenv("FPAT_FLASH");
        const bool three = d == 64;
        const std::string suffix = std::string(knob + 3) == "prt" ? "_128oprt" : "_128oprdt";
        BOOST_TEST(u.name.ends_with(three ? suffix : suffix.substr(0, suffix.size() - 1)), u.name);
        const codegen::Launch& l = u.launches.at(0);
        BOOST_TEST(l.threads == (three ? 512 : 384));
        // 400 rows in 3 tiles of 192 or 4 of 128, 4 heads, batch 2; one resident CTA each.
        BOOST_TEST(l.blocks[0] == (three ? 3 : 4) * 4 * 2);
        BOOST_TEST(l.tma.at(0).boxOuter == (three ? 192 : 128));
        BOOST_TEST(l.smemBytes == (three ? 192 : 128) * d * 2 + 2 * 2 * 128 * d * 2 + 1024);
        BOOST_TEST((u.source.find(", 3>;") != std::string::npos) == three);
        units.push_back(std::move(u));
      }
  expectCompiles(units);
}

BOOST_AUTO_TEST_CASE(cuda_core_attention_kernels_compile) {
  // The CUDA-core kernels (attn_qk, attn_pv, attention at head dimensions the flash kernels do
  // not take, and on sm_80) with K and V token-major and as caches kv_append wrote: their
  // sources compile. (Session 53's GPU run found the cache form's did not: a constexpr host
  // function called from device code.)
  for (int arch : {80, 90}) {
    std::vector<codegen::KernelUnit> units;
    for (bool cache : {false, true}) {
      ir::GraphBuilder b("attention");
      auto q = b.input("q", {6, 64});
      ir::Value k = b.input("k", {16, 32}), v = k;
      if (cache)
        k = v = b.kvAppend(b.input("past", {2, 2, 5, 16}), b.input("new", {6, 32}), "kv");
      b.output(b.attnPv(b.softmax(b.attnQk(q, k, 2, 16, "s")), v, 2, 16, "o"));
      b.output(b.attention(q, k, v, b.constant(0.0, {}), b.constant(0.25, {}), 2, 16, "a"));
      const ir::Graph g = b.build();
      codegen::CodegenOptions o;
      o.arch = arch;
      for (ir::Vertex x : g.vertices()) {
        const ir::OpKind kind = g.op(x).kind;
        if (kind == ir::OpKind::AttnQk || kind == ir::OpKind::AttnPv ||
            kind == ir::OpKind::Attention || kind == ir::OpKind::KvAppend)
          units.push_back(codegen::generate(g, x, builtinLibrary().activations, o));
      }
    }
    BOOST_TEST(units.size() == 7u);
    if (!haveNvcc()) {
      BOOST_TEST_MESSAGE("nvcc not found: the kernels were generated but not compiled");
      return;
    }
    TempDir dir;
    runtime::NvccOptions n;
    n.arch = arch;
    n.cacheDir = dir.path.string();
    for (const runtime::CompiledKernel& k : runtime::compileAll(units, n))
      BOOST_TEST(k.error.empty(), k.name << ": " << k.error);
  }
}

namespace {

/// A decode step over caches: q [B * sq, 4 d] (4 query heads, 2 KV heads, B = 2), the caches
/// [2, 2, past, d] with sq new tokens appended (their keys and values computed),
/// both caches outputs. `bias` as attentionGraph's (0 none, 1 causal weight, 2 a tensor);
/// `extraReader`: the key cache also read by another op.
ir::Graph appendGraph(int64_t sq, int64_t past, int64_t d, int bias, bool extraReader = false) {
  ir::GraphBuilder b("decode");
  const int64_t sk = past + sq;
  auto q = b.input("q", {2 * sq, 4 * d});
  auto nk = b.add(b.input("x", {2 * sq, 2 * d}), b.input("y", {2 * sq, 2 * d}), "nk");
  auto pk = b.kvAppend(b.input("past_k", {2, 2, past, d}), nk, "present_k");
  auto nv = b.mul(b.input("xv", {2 * sq, 2 * d}), b.input("yv", {2 * sq, 2 * d}), "nv");
  auto pv = b.kvAppend(b.input("past_v", {2, 2, past, d}), nv, "present_v");
  ir::Value m;
  if (bias == 0) {
    m = b.constant(0.0, {});
  } else if (bias == 2) {
    m = b.input("bias", {2, 1, 1, sk});
  } else {
    std::vector<float> data(static_cast<size_t>(sq * sk));
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t j = 0; j < sk; ++j)
        data[static_cast<size_t>(i * sk + j)] =
            j > i + past ? -std::numeric_limits<float>::infinity() : 0.0f;
    m = b.weight("mask", {1, 1, sq, sk}, ir::DType::F16, data);
  }
  b.output(b.attention(q, pk, pv, m, b.constant(0.125, {}), 2, d, "o"));
  b.output(pk);
  b.output(pv);
  if (extraReader)
    b.output(b.mul(pk, pk, "twice"));
  return b.build();
}

ir::Vertex named(const ir::Graph& g, const std::string& name) {
  for (ir::Vertex v : g.vertices())
    if (g.op(v).name == name)
      return v;
  throw std::runtime_error("no op " + name);
}

} // namespace

BOOST_AUTO_TEST_CASE(decode_writes_the_caches_it_appends_to) {
  // A decode step whose k and v are kv_append's caches, read by nothing else but the graph's
  // outputs: the decode kernel reads the past caches and new tokens (extraIns, in[5..8]) and
  // writes the caches (its operands 1 and 2); kv_append launches nothing. Ragged and whole
  // tiles of past rows, one and three new tokens, d 64 and 128, each mask; the sources compile
  // for sm_90a. Not where the cache has another reader, on sm_80, in --time's unfused graph, or
  // with FPAT_DECODE_APPEND=0 (for now also not where it is unset: not yet run on a GPU).
  setenv("FPAT_DECODE_APPEND", "1", 1);
  struct Case {
    int64_t sq, past, d;
    int bias;
  };
  const Case cases[] = {{1, 4095, 128, 0}, {1, 100, 128, 2}, {2, 64, 64, 1},
                        {1, 1, 64, 0},     {2, 700, 128, 2}, {1, 64 * 40 - 1, 64, 1}};
  std::vector<codegen::KernelUnit> units;
  codegen::CodegenOptions o;
  o.arch = 90;
  for (const Case& c : cases)
    BOOST_TEST_CONTEXT("Sq " << c.sq << ", past " << c.past << ", d " << c.d << ", bias "
                             << c.bias) {
      const ir::Graph g = appendGraph(c.sq, c.past, c.d, c.bias);
      const ir::Vertex att = named(g, "o");
      codegen::KernelUnit u = codegen::generate(g, att, builtinLibrary().activations, o);
      BOOST_TEST(u.name.find("flash_decode_") != std::string::npos, u.name);
      BOOST_TEST(u.name.find("_append" + std::to_string(c.past) + "_") != std::string::npos,
                 u.name);
      const std::vector<ir::Vertex> want = {named(g, "past_k"), named(g, "past_v"), named(g, "nk"),
                                            named(g, "nv")};
      BOOST_TEST(u.extraIns == want, boost::test_tools::per_element());
      BOOST_TEST(u.writesOperands == std::vector<int>({1, 2}), boost::test_tools::per_element());
      BOOST_REQUIRE(!u.launches.empty());
      BOOST_TEST(u.launches[0].tma.at(0).operand == 5);
      BOOST_TEST(u.launches[0].tma.at(0).outer == 4 * c.past); // B Hkv P rows of d
      BOOST_TEST(u.source.find("kAppend = true") != std::string::npos);
      for (const char* cache : {"present_k", "present_v"}) {
        const codegen::KernelUnit a =
            codegen::generate(g, named(g, cache), builtinLibrary().activations, o);
        BOOST_TEST(a.launches.empty(), cache);
        BOOST_TEST(a.what.find("%o's decode kernel writes it") != std::string::npos, a.what);
      }
      units.push_back(std::move(u));
    }
  // Kept apart: a cache another op reads; the sm_80 target; the knob.
  {
    const ir::Graph g = appendGraph(1, 100, 128, 0, true);
    const codegen::KernelUnit u =
        codegen::generate(g, named(g, "o"), builtinLibrary().activations, o);
    BOOST_TEST(u.name.find("_append") == std::string::npos, u.name);
    BOOST_TEST(u.extraIns.empty());
    const codegen::KernelUnit a =
        codegen::generate(g, named(g, "present_v"), builtinLibrary().activations, o);
    BOOST_TEST(!a.launches.empty());
    // The listing says why it is a copy.
    BOOST_TEST(a.what.find("(a copy: %present_k is also read by %twice)") != std::string::npos,
               a.what);
  }
  {
    const ir::Graph g = appendGraph(1, 100, 128, 0);
    codegen::CodegenOptions o80;
    o80.arch = 80;
    BOOST_TEST(!codegen::generate(g, named(g, "present_k"), builtinLibrary().activations, o80)
                    .launches.empty());
    codegen::CodegenOptions apart = o; // fpatc --time's unfused graph
    apart.appendInDecode = false;
    BOOST_TEST(!codegen::generate(g, named(g, "present_k"), builtinLibrary().activations, apart)
                    .launches.empty());
    BOOST_TEST(
        codegen::generate(g, named(g, "o"), builtinLibrary().activations, apart).extraIns.empty());
    setenv("FPAT_DECODE_APPEND", "0", 1);
    const codegen::KernelUnit u =
        codegen::generate(g, named(g, "o"), builtinLibrary().activations, o);
    const codegen::KernelUnit a =
        codegen::generate(g, named(g, "present_k"), builtinLibrary().activations, o);
    BOOST_TEST(u.name.find("_append") == std::string::npos, u.name);
    BOOST_TEST(!a.launches.empty());
    unsetenv("FPAT_DECODE_APPEND");
    const codegen::KernelUnit unset =
        codegen::generate(g, named(g, "present_k"), builtinLibrary().activations, o);
    BOOST_TEST(unset.what.find("only with FPAT_DECODE_APPEND=1") != std::string::npos, unset.what);
    setenv("FPAT_DECODE_APPEND", "1", 1);
  }
  unsetenv("FPAT_DECODE_APPEND");
  expectCompiles(units);
}

BOOST_AUTO_TEST_CASE(decode_writes_a_token_major_cache) {
  // GPTBigCode's one cache [B*P, E] of K and V side by side (kv_append {batch}), K and V its
  // column views: the decode kernel reads the past rows from their columns and writes every
  // column of the result; also with K second. Columns of the cache nobody reads: a copy.
  setenv("FPAT_DECODE_APPEND", "1", 1);
  std::vector<codegen::KernelUnit> units;
  codegen::CodegenOptions o;
  o.arch = 90;
  for (int64_t width : {int64_t{256}, int64_t{384}})
    for (bool kFirst : {true, false}) {
      const int64_t d = 128, past = 300;
      ir::GraphBuilder b("bigcode");
      auto q = b.input("q", {2, 4 * d});
      auto present = b.kvAppendRows(b.input("past", {2 * past, width}), b.input("new", {2, width}),
                                    2, "present");
      auto k = b.slice(present, kFirst ? 0 : d, kFirst ? d : 2 * d, "k");
      auto v = b.slice(present, kFirst ? d : 0, kFirst ? 2 * d : d, "v");
      b.output(b.attention(q, k, v, b.constant(0.0, {}), b.constant(0.125, {}), 2, d, "o"));
      b.output(present);
      const ir::Graph g = b.build();
      BOOST_TEST_CONTEXT("width " << width << (kFirst ? ", k first" : ", v first")) {
        codegen::KernelUnit u =
            codegen::generate(g, named(g, "o"), builtinLibrary().activations, o);
        const codegen::KernelUnit a =
            codegen::generate(g, named(g, "present"), builtinLibrary().activations, o);
        if (width == 384) { // a third of the columns no one reads: copied
          BOOST_TEST(u.extraIns.empty());
          BOOST_TEST(a.what.find("do not cover every column of %present") != std::string::npos,
                     a.what);
          continue;
        }
        const std::string rows = kFirst ? "_rows0_128_256_256_" : "_rows128_0_256_256_";
        BOOST_TEST(u.name.find("_append300" + rows) != std::string::npos, u.name);
        const std::vector<ir::Vertex> want = {named(g, "past"), named(g, "past"), named(g, "new"),
                                              named(g, "new")};
        BOOST_TEST(u.extraIns == want, boost::test_tools::per_element());
        BOOST_TEST(a.launches.empty(), a.what);
        BOOST_TEST(u.launches.at(0).tma.at(0).inner == 256);        // the past's whole rows
        BOOST_TEST(u.what.ends_with(", writing %present"), u.what); // one cache, named once
        units.push_back(std::move(u));
      }
    }
  unsetenv("FPAT_DECODE_APPEND");
  expectCompiles(units);
}

BOOST_AUTO_TEST_CASE(buffers_read_beyond_the_operands_stay_live) {
  // The decode kernel that writes kv_append's caches reads the new keys at the attention, not
  // at kv_append: planned with its extraIns, their buffer is no one else's until then.
  const ir::Graph g = appendGraph(1, 100, 128, 0);
  codegen::CodegenOptions o;
  o.arch = 90;
  std::vector<std::vector<ir::Vertex>> extra(g.size());
  setenv("FPAT_DECODE_APPEND", "1", 1);
  for (ir::Vertex v : g.vertices())
    extra[v] = codegen::generate(g, v, builtinLibrary().activations, o).extraIns;
  unsetenv("FPAT_DECODE_APPEND");
  const ir::Vertex nk = named(g, "nk"), att = named(g, "o");
  BOOST_REQUIRE(!extra[att].empty());
  const runtime::BufferPlan p = runtime::planBuffers(g, extra);
  const std::vector<ir::Vertex> order = *ir::stableOrder(g);
  const auto at = [&](ir::Vertex v) { return std::find(order.begin(), order.end(), v); };
  for (ir::Vertex v : g.vertices())
    if (v != nk && at(v) > at(nk) && at(v) <= at(att) && p.slotOf[v] >= 0)
      BOOST_TEST(p.slotOf[v] != p.slotOf[nk], "%" << g.op(v).name << " takes %nk's buffer");
  // Without them %nk's buffer is free once kv_append has read it (a value after takes it).
  const runtime::BufferPlan plain = runtime::planBuffers(g);
  bool reused = false;
  for (ir::Vertex v : g.vertices())
    reused = reused || (v != nk && at(v) > at(nk) && plain.slotOf[v] == plain.slotOf[nk]);
  BOOST_TEST(reused);
}

BOOST_AUTO_TEST_CASE(attention_takes_the_flash_kernel_on_sm90) {
  // sm_90 with head dimension 64 or 128: the flash kernel, its mask recognised from the bias
  // (none, causal from a weight's values, a tensor read per score), or with at most 8 query
  // rows per KV head the decode kernel (split keys: a merge launch and its workspace; a bias
  // tensor, exporters' padding mask, read per score there too); other head dimensions and
  // targets: the CUDA-core kernel. The sources compile for sm_90a without serialized wgmma.
  struct Case {
    int64_t sq, sk, d;
    int bias, arch;
    const char* name; // what the kernel's name holds
  };
  const Case cases[] = {
      {333, 333, 128, 0, 90, "flash_attention_b2_h4_kv2_q333_k333_d128_none"},
      {100, 300, 64, 1, 90, "flash_attention_b2_h4_kv2_q100_k300_d64_causal"},
      {300, 100, 64, 1, 90, "flash_attention_b2_h4_kv2_q300_k100_d64_bias_"},
      {129, 129, 64, 0, 90, "flash_attention_b2_h4_kv2_q129_k129_d64_none"},
      {600, 600, 64, 0, 90, "flash_attention_b2_h4_kv2_q600_k600_d64_none"},
      {65, 65, 128, 2, 90, "flash_attention_b2_h4_kv2_q65_k65_d128_bias_0_0_65_1"},
      {1, 700, 128, 2, 90, "flash_decode_b2_h4_kv2_q1_k700_d128_bias_0_0_0_1_s"},
      {3, 64, 64, 2, 90, "flash_decode_b2_h4_kv2_q3_k64_d64_bias_0_0_64_1_s"},
      {65, 65, 128, 3, 90, "flash_attention_b2_h4_kv2_q65_k65_d128_bias_"},
      {65, 65, 80, 0, 90, "fpat_attention_b2"},
      {65, 65, 128, 0, 80, "fpat_attention_b2"}};
  std::vector<codegen::KernelUnit> units;
  for (const Case& c : cases)
    BOOST_TEST_CONTEXT("Sq " << c.sq << ", Sk " << c.sk << ", d " << c.d << ", bias " << c.bias
                             << ", sm_" << c.arch) {
      ir::Graph g = attentionGraph(c.sq, c.sk, c.d, c.bias);
      codegen::CodegenOptions o;
      o.arch = c.arch;
      codegen::KernelUnit u = codegen::generate(g, g.outputs()[0], builtinLibrary().activations, o);
      BOOST_TEST(u.name.find(c.name) != std::string::npos, u.name);
      BOOST_TEST(u.sm90a == (c.arch == 90 && c.d != 80));
      const bool decode = u.name.find("flash_decode") != std::string::npos;
      BOOST_TEST((u.launches.size() == 2) == (decode && u.scratchBytes > 0), u.name);
      if (u.name.find("flash_attention") != std::string::npos) {
        // One CTA per SM (at most one a tile) walks the tiles; causal tiles differ in length,
        // so there each CTA takes the next from a counter (the "d" tile, two counters of
        // scratch, zeroed once). At d 64 three consumers (192-row tiles, "t") take tiles from
        // the counter too, from 512 keys (4096 with a causal mask).
        const codegen::Launch& l = u.launches[0];
        const bool causal = u.name.find("_causal") != std::string::npos;
        const bool three = c.d == 64 && c.sk >= (causal ? 4096 : 512);
        const int64_t tiles = (c.sq + (three ? 191 : 127)) / (three ? 192 : 128) * 4 * 2;
        BOOST_TEST((l.blocks[0] == std::min<int64_t>(tiles, o.sms) && l.blocks[1] == 1 &&
                    l.blocks[2] == 1));
        BOOST_TEST(l.threads == (three ? 512 : 384));
        BOOST_TEST((u.name.find("oprd") != std::string::npos) == (causal || three), u.name);
        BOOST_TEST(u.name.ends_with("t") == three, u.name);
        BOOST_TEST((u.scratchBytes > 0) == (causal || three), u.name);
      }
      if (u.sm90a)
        units.push_back(std::move(u));
    }
  expectCompiles(units);
}
