// The cost model: estimates against the H200 measurements they were calibrated on, the
// candidate costs the choice reads, measured times in place of estimates.
#define BOOST_TEST_MODULE cost
#include "fpat/cost/Cost.h"
#include "fpat/ir/text/Text.h"
#include "fpat/match/Match.h"
#include "fpat/tune/Tune.h"

#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <filesystem>
#include <set>

using namespace fpat;

namespace {

ir::Graph parse(const std::string& text) {
  SourceManager sm;
  int f = sm.addBuffer("t.fgraph", text);
  std::ostringstream err;
  DiagEngine d(sm, &err);
  ir::ActivationSet acts = ir::ActivationSet::builtin();
  auto g = ir::parseGraph(f, d, acts);
  BOOST_TEST_REQUIRE(g.has_value(), err.str());
  return *g;
}

// x [4096, 4096] through an RMSNorm into a GEMM: `kind` says whether gamma and W are weights.
std::string normGemm(const char* kind) {
  return std::string("graph g {\n  %x = input : f16[4096, 4096]\n  %g = ") + kind +
         " : f16[4096]\n  %w = " + kind +
         " : f16[4096, 4096]\n  %n = rmsnorm %x, %g\n  %h = gemm %n, %w\n  output %h\n}\n";
}

match::Decision only(const ir::Graph& g, const cost::MeasuredFn& measured = {}) {
  match::MatchOptions o;
  const cost::Calibration& c = cost::calibrationFor(90);
  o.cost = [&](const match::Match& m) {
    return cost::candidateCost(g, match::builtinTable(), m, c, 90, measured);
  };
  match::MatchResult r = match::findMatches(g, match::builtinTable(), o);
  BOOST_TEST_REQUIRE(r.decisions.size() == 1u);
  return r.decisions[0];
}

// The MLP blocks bench/time_graphs.sh times: GPT-2-XL's (LayerNorm, d 1600, ffn 6400) and
// Llama-7B's (RMSNorm, SwiGLU, d 4096, ffn 11008; Mistral's 14336), weights as weights, T rows.
std::string block(bool gpt2, int t, int hidden = 11008) {
  const std::string T = std::to_string(t), H = std::to_string(hidden);
  if (gpt2)
    return "graph g {\n  %x = input : f16[" + T +
           ", 1600]\n  %lg = weight : f16[1600]\n  %lb = weight : f16[1600]\n"
           "  %w1 = weight : f16[1600, 6400]\n  %b1 = weight : f16[6400]\n"
           "  %w2 = weight : f16[6400, 1600]\n  %b2 = weight : f16[1600]\n"
           "  %n = layernorm %x, %lg, %lb {eps = 1e-05}\n  %h = gemm %n, %w1\n"
           "  %hb = bias_add %h, %b1\n  %a = activation %hb {fn = gelu}\n  %d = gemm %a, %w2\n"
           "  %db = bias_add %d, %b2\n  %y = add %db, %x\n  output %y\n}\n";
  return "graph g {\n  %x = input : f16[" + T + ", 4096]\n  %g = weight : f16[4096]\n" +
         "  %wg = weight : f16[4096, " + H + "]\n  %wu = weight : f16[4096, " + H +
         "]\n  %wd = weight : f16[" + H +
         ", 4096]\n"
         "  %n = rmsnorm %x, %g {eps = 1e-06}\n  %gate = gemm %n, %wg\n  %up = gemm %n, %wu\n"
         "  %s = activation %gate {fn = silu}\n  %m = mul %s, %up\n  %d = gemm %m, %wd\n"
         "  %y = add %d, %x\n  output %y\n}\n";
}

std::set<std::string> chosen(const ir::Graph& g) {
  match::MatchOptions o;
  const cost::Calibration& c = cost::calibrationFor(90);
  o.cost = [&](const match::Match& m) {
    return cost::candidateCost(g, match::builtinTable(), m, c, 90, {});
  };
  std::set<std::string> out;
  for (const match::Decision& d : match::findMatches(g, match::builtinTable(), o).decisions)
    if (d.chosen)
      out.insert(match::builtinTable().patterns[d.match.pattern].name);
  return out;
}

} // namespace

BOOST_AUTO_TEST_CASE(estimates_match_the_h200_measurements_they_come_from) {
  const ir::Graph g = parse(normGemm("weight"));
  const double gemm = cost::opMs(g, *g.find("h"), cost::calibrationFor(90));
  BOOST_TEST(gemm > 0.175); // session 26: fpat's GEMM at 4096^3, 0.185 ms
  BOOST_TEST(gemm < 0.195);
  // The deferred norm (weights): 0.200 ms measured; in shared memory (inputs): 0.614.
  const match::Decision deferred = only(g);
  BOOST_TEST(deferred.cost.fused > 0.19);
  BOOST_TEST(deferred.cost.fused < 0.21);
  BOOST_TEST(deferred.chosen);
  const match::Decision smem = only(parse(normGemm("input")));
  BOOST_TEST(smem.cost.fused > 0.58);
  BOOST_TEST(smem.cost.fused < 0.65);
  BOOST_TEST(!smem.chosen); // slower than rmsnorm + gemm unfused
  BOOST_TEST(smem.cost.detail.find("norm in shared memory") != std::string::npos);
  // Below sm_90 the model is a guess, and says so.
  BOOST_TEST(cost::calibrationFor(90).measured);
  BOOST_TEST(!cost::calibrationFor(80).measured);
}

BOOST_AUTO_TEST_CASE(attention_is_priced_by_its_products_or_its_cache) {
  // Session 34's fpat-bench-attn on the H200: d 128, S 4096, B 4, H 16, non-causal, 0.93 ms
  // (589 TFLOP/s; the model takes 430, the low end of S >= 2048); decode, B 1, 32 query
  // heads, 8 KV heads, a 65536-key cache: 0.082 ms (3.3 TB/s of K and V).
  const ir::Graph g = parse(R"(graph a {
  %q  = input : f16[16384, 2048]
  %k  = input : f16[16384, 2048]
  %v  = input : f16[16384, 2048]
  %z  = constant {value = 0.0} : f16[]
  %s  = constant {value = 0.088} : f16[]
  %o  = attention %q, %k, %v, %z, %s {batch = 4, head_dim = 128}
  %qd = input : f16[1, 4096]
  %kd = input : f16[65536, 1024]
  %vd = input : f16[65536, 1024]
  %od = attention %qd, %kd, %vd, %z, %s {batch = 1, head_dim = 128}
  output %o
  output %od
})");
  const cost::Calibration& h200 = cost::calibrationFor(90);
  const double prefill = cost::opMs(g, *g.find("o"), h200);
  BOOST_TEST(prefill > 0.93);
  BOOST_TEST(prefill < 1.4);
  const double decode = cost::opMs(g, *g.find("od"), h200);
  BOOST_TEST(decode > 0.07);
  BOOST_TEST(decode < 0.1);
  BOOST_TEST(cost::kernelNote(g, *g.find("o"), 90) == "flash attention kernel");
  BOOST_TEST(cost::kernelNote(g, *g.find("o"), 80) == "attention's CUDA-core kernel");
}

BOOST_AUTO_TEST_CASE(values_of_weights_alone_cost_nothing_per_run) {
  // A LoRA merge's W + A B and a folded scale run once per set of weights
  // (Executor::prepareWeights): a run pays only the GEMM that reads them.
  const ir::Graph g = parse(R"(graph l {
  %x = input : f16[4096, 4096]
  %w = weight : f16[4096, 4096]
  %a = weight : f16[4096, 16]
  %b = weight : f16[16, 4096]
  %s = constant {value = 0.5} : f16[]
  %ab = gemm %a, %b
  %abs = mul %ab, %s
  %m = add %w, %abs
  %h = gemm %x, %m
  %y = mul %h, %s
  output %y
})");
  const cost::Calibration& h200 = cost::calibrationFor(90);
  for (const char* once : {"ab", "abs", "m"}) {
    BOOST_TEST(cost::opMs(g, *g.find(once), h200) == 0.0, once);
    BOOST_TEST(cost::kernelNote(g, *g.find(once), 90) == "computed once per set of weights");
  }
  BOOST_TEST(cost::opMs(g, *g.find("h"), h200) > 0.175); // reads x, given at run time
  BOOST_TEST(cost::opMs(g, *g.find("y"), h200) > 0.0);
}

// Session 30's fpatc --time on the H200, the cost model's choice against --fuse=always: the
// faster of the two measured is what the model must choose (where they differ by more than
// the runs' spread, ~1%).
BOOST_AUTO_TEST_CASE(choices_match_the_faster_measured_form) {
  // GPT-2-XL: the deferred LayerNorm 0.0321 / 0.0322 / 0.0549 ms against the norm apart 0.0372 /
  // 0.0380 / 0.0586 at T = 1 / 7 / 333; at 4096 the norm apart, 0.2884 against 0.3002.
  for (int t : {1, 7, 333})
    BOOST_TEST(chosen(parse(block(true, t))).count("layernorm_gemm_bias_gelu") == 1u, "T " << t);
  BOOST_TEST(chosen(parse(block(true, 4096))).count("gemm_bias_gelu") == 1u);
  // Llama-7B: the dual GEMM with the norm deferred at T = 333 (0.1576 ms, as --fuse=always).
  // At 4096 (session 46, H100, the statistics read by the GEMM's own warps) the dual GEMM
  // 1.5522 ms against the gated GEMM with up apart 1.5590 at hidden 11008; at Mistral's 14336
  // the gated GEMM with up apart, 2.0038 against 2.0359.
  BOOST_TEST(chosen(parse(block(false, 333))).count("rmsnorm_gemm_swiglu") == 1u);
  BOOST_TEST(chosen(parse(block(false, 4096))).count("rmsnorm_gemm_swiglu") == 1u);
  BOOST_TEST(chosen(parse(block(false, 4096, 14336))).count("gemm_silu_mul") == 1u);
  // BERT-base's MLP (the exact GeLU, d 768, ffn 3072; session 48, H100): at T = 2048 the GeLU
  // apart 0.0573-0.0580 ms against gemm_bias_gelu_erf 0.0713-0.0736 (the epilogue's erf is a
  // long dependent chain on the helper warps); at T = 1 fused 0.0212 against 0.0238.
  auto bert = [](int t) {
    const std::string T = std::to_string(t);
    return "graph g {\n  %x = input : f16[" + T +
           ", 768]\n  %w1 = weight : f16[768, 3072]\n  %b1 = weight : f16[3072]\n"
           "  %w2 = weight : f16[3072, 768]\n  %b2 = weight : f16[768]\n  %h = gemm %x, %w1\n"
           "  %hb = bias_add %h, %b1\n  %a = activation %hb {fn = gelu_erf}\n"
           "  %d = gemm %a, %w2\n  %db = bias_add %d, %b2\n  %y = add %db, %x\n  output %y\n}\n";
  };
  BOOST_TEST(chosen(parse(bert(1))).count("gemm_bias_gelu_erf") == 1u);
  BOOST_TEST(chosen(parse(bert(2048))).count("gemm_bias_gelu_erf") == 0u);
  BOOST_TEST(chosen(parse(bert(2048))).count("gemm_bias") == 1u);
  // examples/transformer_mlp's second block (gamma and W inputs, 100x768x512): normalising in
  // shared memory took 0.0223 ms where rmsnorm apart and gemm_silu took ~0.012 (one form of
  // the model chose it, and the example ran at 0.92x its unfused graph).
  const std::set<std::string> small =
      chosen(parse("graph g {\n  %x = input : f16[100, 512]\n  %g = input : f16[512]\n"
                   "  %w = input : f16[512, 768]\n  %r = rmsnorm %x, %g {eps = 1e-06}\n"
                   "  %o = gemm %r, %w\n  %z = activation %o {fn = silu}\n  output %z\n}\n"));
  BOOST_TEST(small.count("gemm_silu") == 1u);
  BOOST_TEST(small.count("rmsnorm_gemm") == 0u);
}

BOOST_AUTO_TEST_CASE(measured_times_stand_in_for_estimates) {
  const ir::Graph g = parse(normGemm("weight"));
  // A tuner that measured the fused kernel slow: the fusion is declined on its word.
  const match::Decision d = only(g, [](const ir::Graph& graph, ir::Vertex v) {
    return graph.op(v).kind == ir::OpKind::Fused ? std::optional<double>(1.0) : std::nullopt;
  });
  BOOST_TEST(d.cost.fused == 1.0);
  BOOST_TEST(!d.chosen);
  BOOST_TEST(d.cost.detail.find("measured by the tuner") != std::string::npos);
  // And a measured plain GEMM among the parts.
  const match::Decision p = only(g, [](const ir::Graph& graph, ir::Vertex v) {
    return graph.op(v).kind == ir::OpKind::Gemm ? std::optional<double>(0.5) : std::nullopt;
  });
  BOOST_TEST(p.cost.detail.find("gemm 0.5000 tuned") != std::string::npos, p.cost.detail);
}

BOOST_AUTO_TEST_CASE(tuning_cache_times_are_read_once_by_key) {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / "fpat_test_cost_tuning.json";
  std::filesystem::remove(file);
  tune::TuningCache cache(file.string());
  BOOST_TEST(cache.measuredTimes().empty()); // no file yet
  tune::Key k;
  k.signature = "gemm:gemm:vec";
  k.m = k.n = k.k = 64;
  tune::Entry e;
  e.config = codegen::TileConfig{64, 64, 32, 32, 32, 2};
  e.ms = 0.0123;
  cache.store(k, e);
  const auto times = cache.measuredTimes();
  BOOST_TEST(times.size() == 1u);
  BOOST_TEST(times.at(k.str()) == 0.0123);
  std::filesystem::remove(file);
}
