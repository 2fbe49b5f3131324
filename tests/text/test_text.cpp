// The .fgraph text form: round trips, diagnostics and robustness against hostile input.
#define BOOST_TEST_MODULE text
#include "fpat/ir/Builder.h"
#include "fpat/ir/text/Text.h"

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <random>

using namespace fpat;
using namespace fpat::ir;
namespace fs = std::filesystem;

namespace {

struct Parsed {
  std::optional<Graph> graph;
  std::vector<Diagnostic> diags;
};

Parsed parse(const std::string& text, const std::string& name = "t.fgraph",
             const ActivationSet& acts = ActivationSet::builtin(),
             const std::map<std::string, int64_t>& dims = {}) {
  SourceManager sm;
  int f = sm.addBuffer(name, text);
  DiagEngine d(sm);
  Parsed p;
  p.graph = parseGraph(f, d, acts, dims);
  p.diags = d.diagnostics();
  return p;
}

/// Structural equality: same ops (kind, name, type, attributes) with the same operands.
void requireSameGraph(const Graph& a, const Graph& b) {
  BOOST_TEST_REQUIRE(a.name() == b.name());
  BOOST_TEST_REQUIRE(a.size() == b.size());
  for (Vertex v : a.vertices()) {
    const Op &x = a.op(v), &y = b.op(v);
    BOOST_TEST(x.name == y.name);
    BOOST_TEST(x.kind == y.kind);
    BOOST_TEST(x.type == y.type);
    BOOST_TEST(x.fn == y.fn);
    BOOST_TEST(x.eps == y.eps);
    BOOST_TEST(x.transposeB == y.transposeB);
    BOOST_TEST((x.params == y.params));
    BOOST_TEST((x.fused == y.fused));
    BOOST_TEST(a.operands(v) == b.operands(v));
  }
  BOOST_TEST(a.outputs() == b.outputs());
}

std::string readAll(const fs::path& p) {
  std::string s;
  BOOST_TEST_REQUIRE(readFile(p.string(), s));
  return s;
}

} // namespace

BOOST_AUTO_TEST_CASE(every_example_round_trips) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(FPAT_SOURCE_DIR "/examples")) {
    if (e.path().extension() != ".fgraph")
      continue;
    BOOST_TEST_CONTEXT(e.path()) {
      Parsed p = parse(readAll(e.path()), e.path().string());
      BOOST_TEST_REQUIRE(p.graph.has_value());
      std::string printed = printGraph(*p.graph);
      Parsed again = parse(printed);
      BOOST_TEST_REQUIRE(again.graph.has_value());
      requireSameGraph(*p.graph, *again.graph);
      BOOST_TEST(printGraph(*again.graph) == printed);
      ++n;
    }
  }
  BOOST_TEST(n >= 1);
}

BOOST_AUTO_TEST_CASE(builder_graph_round_trips_with_every_attribute) {
  GraphBuilder b("attrs");
  Value x = b.input("x", {17, 64});
  Value w = b.input("w.t", {48, 64});
  Value g = b.input("gamma", {64});
  Value beta = b.input("beta", {64});
  Value f = b.input("f32", {3}, DType::F32);
  Value n = b.layernorm(x, g, beta, 1e-6, "n");
  Value r = b.rmsnorm(n, g, 0.5, "r");
  Value h = b.gemm(r, w, true, "h");
  Value a = b.activation(h, "gelu_erf", "a");
  Value t = b.seqFirst(b.batchFirst(a, 17, "bf"), 17, "sf");
  b.output(t).output(f);
  Graph orig = b.build();
  std::string text = printGraph(orig);
  BOOST_TEST(text.find("%w.t = input : f16[48, 64]") != std::string::npos, text);
  BOOST_TEST(text.find("%h = gemm %r, %w.t {transpose_b = true} : f16[17, 48]") !=
             std::string::npos);
  BOOST_TEST(text.find("{eps = 1e-06}") != std::string::npos);
  BOOST_TEST(text.find("%bf = batch_first %a {batch = 17} : f16[17, 48]") != std::string::npos);
  BOOST_TEST(text.find("output %sf, %f32") != std::string::npos);
  Parsed p = parse(text);
  BOOST_TEST_REQUIRE(p.graph.has_value());
  requireSameGraph(orig, *p.graph);
}

BOOST_AUTO_TEST_CASE(kv_caches_round_trip_and_are_checked) {
  Parsed p = parse("graph kv {\n"
                   "  %past = input : f16[2, 2, 5, 8]\n"
                   "  %new = input : f16[6, 16]\n"
                   "  %q = input : f16[6, 32]\n"
                   "  %c = kv_append %past, %new\n"
                   "  %z = constant {value = 0.0} : f16[]\n"
                   "  %o = attention %q, %c, %c, %z, %z {batch = 2, head_dim = 8}\n"
                   "  %r = kv_append %new, %new {batch = 2}\n"
                   "  output %o, %c, %r\n"
                   "}\n");
  BOOST_TEST_REQUIRE(p.graph.has_value());
  const std::string text = printGraph(*p.graph);
  BOOST_TEST(text.find("%c = kv_append %past, %new : f16[2, 2, 8, 8]") != std::string::npos, text);
  BOOST_TEST(text.find("%r = kv_append %new, %new {batch = 2} : f16[12, 16]") != std::string::npos,
             text);
  Parsed again = parse(text);
  BOOST_TEST_REQUIRE(again.graph.has_value());
  requireSameGraph(*p.graph, *again.graph);
  // New tokens of another width, and a cache of rank 2: located errors, both reported.
  Parsed bad = parse("graph kv {\n"
                     "  %past = input : f16[2, 2, 5, 8]\n"
                     "  %new = input : f16[6, 24]\n"
                     "  %c = kv_append %past, %new\n"
                     "  %d = kv_append %new, %new\n"
                     "  output %c, %d\n"
                     "}\n");
  BOOST_TEST(!bad.graph);
  BOOST_REQUIRE(bad.diags.size() == 2u);
  BOOST_TEST(bad.diags[0].loc.line == 4);
  BOOST_TEST(bad.diags[0].message.find("must be the new tokens' [B*S, Hkv*d] = [2*S, 16] or "
                                       "[B, S, Hkv, d] = [2, S, 2, 8]") != std::string::npos,
             bad.diags[0].message);
  BOOST_TEST(bad.diags[1].loc.line == 5);
  BOOST_TEST(bad.diags[1].message.find("must be a cache [B, Hkv, P, d]") != std::string::npos,
             bad.diags[1].message);
}

BOOST_AUTO_TEST_CASE(fused_ops_and_activation_params_round_trip) {
  // A parametrised activation (as a .fpat library adds one), standalone and in a fused op's
  // epilogue: printing keeps every parameter, so parsing the print gives the same program.
  ActivationSet acts = ActivationSet::builtin();
  acts.add("leaky_relu", {"slope"});
  std::string text = "graph f {\n"
                     "  %x = input : f16[4, 8]\n"
                     "  %w = input : f16[8, 2]\n"
                     "  %b = input : f16[2]\n"
                     "  %y = fused %x, %w, %b {pattern = gemm_bias_gelu, family = gemm, "
                     "epilogue = \"gelu(bias_add(acc, $2))\"} : f16[4, 2]\n"
                     "  %l = fused %x, %w {pattern = gemm_leaky2, family = gemm, "
                     "epilogue = \"leaky_relu(leaky_relu(acc, slope = 0.5), slope = 0.01)\"} : "
                     "f16[4, 2]\n"
                     "  %z = activation %y {fn = leaky_relu, slope = 0.25} : f16[4, 2]\n"
                     "  %w2 = weight : f16[2, 8]\n"
                     "  %w3 = weight : f16[2, 8]\n"
                     "  %d = fused %x, %w2, %w3 {pattern = gemm_swiglu, family = dual_gemm, "
                     "epilogue = \"mul(acc2, silu(acc))\", transpose_b = true} : f16[4, 2]\n"
                     "  output %z, %l, %d\n"
                     "}\n";
  Parsed p = parse(text, "t.fgraph", acts);
  BOOST_TEST_REQUIRE(p.graph.has_value());
  const Op& y = p.graph->op(*p.graph->find("y"));
  BOOST_TEST(y.fused.pattern == "gemm_bias_gelu");
  BOOST_REQUIRE(y.fused.epilogue.nodes.size() == 4u);
  BOOST_TEST((y.fused.epilogue.nodes[2].kind == EpiKind::BiasAdd));
  BOOST_TEST(y.fused.epilogue.nodes[1].operand == 2);
  BOOST_TEST(y.fused.epilogue.nodes[3].fn == "gelu");
  // Each activation keeps its own parameters.
  const Epilogue& l = p.graph->op(*p.graph->find("l")).fused.epilogue;
  BOOST_REQUIRE(l.nodes.size() == 3u);
  BOOST_TEST(l.nodes[1].params.at("slope") == 0.5);
  BOOST_TEST(l.nodes[2].params.at("slope") == 0.01);
  // The dual GEMM's second accumulator is its own leaf, acc2 (Acc with operand 1).
  const Epilogue& d = p.graph->op(*p.graph->find("d")).fused.epilogue;
  BOOST_TEST(d.readsSecondAcc());
  BOOST_TEST(std::count_if(d.nodes.begin(), d.nodes.end(),
                           [](const EpilogueNode& e) { return e.kind == EpiKind::Acc; }) == 2);
  const std::string printed = printGraph(*p.graph);
  BOOST_TEST(printed == text);
  Parsed again = parse(printed, "t.fgraph", acts); // print -> parse -> print: a fixed point
  BOOST_TEST_REQUIRE(again.graph.has_value());
  requireSameGraph(*p.graph, *again.graph);
  BOOST_TEST(printGraph(*again.graph) == printed);
  // Without the activation's parameter list the parameter is an error, not silently dropped.
  BOOST_TEST(!parse(text).graph.has_value());
}

BOOST_AUTO_TEST_CASE(rope_epilogue_round_trips_and_its_errors_are_located) {
  // A rope in a fused op's epilogue names its tables as operands and its columns as
  // parameters; the print parses back to the same program.
  const std::string text = "graph r {\n"
                           "  %x = input : f16[6, 8]\n"
                           "  %w = weight : f16[8, 12]\n"
                           "  %b = weight : f16[12]\n"
                           "  %c = weight : f16[3, 4]\n"
                           "  %s = weight : f16[3, 4]\n"
                           "  %y = fused %x, %w, %b, %c, %s {pattern = gemm_bias_rope, family = "
                           "gemm, epilogue = \"rope(bias_add(acc, $2), $3, $4, begin = 4, end = "
                           "12)\"} : f16[6, 12]\n"
                           "  output %y\n"
                           "}\n";
  Parsed p = parse(text);
  BOOST_TEST_REQUIRE(p.graph.has_value());
  const Epilogue& e = p.graph->op(*p.graph->find("y")).fused.epilogue;
  BOOST_REQUIRE(e.nodes.size() == 4u); // acc, $2, bias_add, rope: the tables are no nodes
  BOOST_TEST((e.nodes[3].kind == EpiKind::Rope));
  BOOST_TEST(e.nodes[3].operand == 3);
  BOOST_TEST(e.nodes[3].operand2 == 4);
  BOOST_TEST(e.hasRope());
  BOOST_TEST((e.operands() == std::vector<int>{2, 3, 4}));
  BOOST_TEST(printGraph(*p.graph) == text);
  // Each mistake is an error at its place.
  auto firstError = [&](const std::string& epilogue, const std::string& tables = "%c, %s") {
    Parsed q = parse("graph r {\n  %x = input : f16[6, 8]\n  %w = weight : f16[8, 12]\n"
                     "  %c = weight : f16[3, 4]\n  %s = weight : f16[3, 4]\n"
                     "  %o = weight : f16[4, 4]\n"
                     "  %y = fused %x, %w, " +
                     tables + " {pattern = p, family = gemm, epilogue = \"" + epilogue +
                     "\"} : f16[6, 12]\n  output %y\n}\n");
    BOOST_TEST_REQUIRE(!q.graph.has_value());
    BOOST_TEST_REQUIRE(!q.diags.empty());
    BOOST_TEST(q.diags[0].loc.line == 7);
    return q.diags[0].message;
  };
  BOOST_TEST(firstError("rope(acc, $2, $3, begin = 0)").find("rope needs its columns' end") !=
             std::string::npos);
  BOOST_TEST(firstError("rope(acc, acc, $3, begin = 0, end = 8)")
                 .find("rope's cosines and sines are operands") != std::string::npos);
  BOOST_TEST(firstError("rope(acc, $2, $3, begin = 0, end = 8, step = 2)").find("not 'step'") !=
             std::string::npos);
  BOOST_TEST(firstError("rope(acc, $2, $3, begin = 2, end = 8)")
                 .find("rotates columns [2, 8): they must lie in the 12 columns, begin even, and "
                       "make whole heads of 4") != std::string::npos);
  BOOST_TEST(firstError("rope(acc, $2, $3, begin = 0, end = 12, head = 2)")
                 .find("has heads of 2 columns: they must be even, at least the tables' 4") !=
             std::string::npos);
  BOOST_TEST(firstError("rope(acc, $2, $3, begin = 0, end = 8)", "%c, %o")
                 .find("must have the cosines' shape") != std::string::npos);
  BOOST_TEST(firstError("rope(acc, $2, $3, begin = 0, end = 8)", "%o, %o")
                 .find("R dividing the rows (6)") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(errors_carry_locations_and_all_are_reported) {
  Parsed p = parse("graph g {\n"
                   "  %x = input : f16[4, 8]\n"
                   "  %a = gemm %x, %nope\n"
                   "  %b = frobnicate %x\n"
                   "  %x = add %x, %x\n"
                   "  output %a\n"
                   "}\n");
  BOOST_TEST(!p.graph);
  BOOST_REQUIRE(p.diags.size() == 3u);
  BOOST_TEST(p.diags[0].message == "use of undefined value '%nope'");
  BOOST_TEST(p.diags[0].loc.line == 3);
  BOOST_TEST(p.diags[0].loc.col == 17);
  BOOST_TEST(p.diags[0].loc.len == 5);
  BOOST_TEST(p.diags[1].message == "unknown op 'frobnicate'");
  BOOST_TEST(p.diags[2].message == "redefinition of value '%x'");
  BOOST_REQUIRE(p.diags[2].notes.size() == 1u);
  BOOST_TEST(p.diags[2].notes[0].loc.line == 2);
  // %a is poisoned by the undefined operand: 'output %a' adds no second error.
  // Row reorders take batch alone (attention's head_dim is not theirs) and check it.
  Parsed r = parse("graph g {\n"
                   "  %x = input : f16[14, 8]\n"
                   "  %a = batch_first %x {batch = 2, head_dim = 4}\n"
                   "  %b = seq_first %x {batch = 4}\n"
                   "  output %a, %b\n"
                   "}\n");
  BOOST_TEST(!r.graph);
  BOOST_REQUIRE(r.diags.size() == 2u);
  BOOST_TEST(r.diags[0].message == "unknown attribute 'head_dim' for batch_first");
  BOOST_TEST(r.diags[0].loc.line == 3);
  BOOST_TEST(r.diags[1].message == "seq_first %b: batch = 4 does not divide operand 0's 14 rows");
}

BOOST_AUTO_TEST_CASE(named_dimensions_take_their_size_from_the_reader) {
  const std::string text = "graph g {\n"
                           "  %x = input : f16[T, 64]\n"
                           "  %w = weight : f16[64, N]\n"
                           "  %y = gemm %x, %w : f16[T, N]\n"
                           "  output %y\n"
                           "}\n";
  Parsed p = parse(text, "t.fgraph", ActivationSet::builtin(), {{"T", 333}, {"N", 40}, {"B", 2}});
  BOOST_TEST_REQUIRE(p.graph.has_value());
  BOOST_TEST(p.graph->op(p.graph->outputs()[0]).type.str() == "f16[333, 40]");
  // The printed graph states the sizes; it parses without them.
  BOOST_TEST(printGraph(*p.graph).find("f16[333, 64]") != std::string::npos);
  BOOST_TEST(parse(printGraph(*p.graph)).graph.has_value());
  // A name without a size: an error at each use that a type needs, with its location.
  Parsed missing = parse(text, "t.fgraph", ActivationSet::builtin(), {{"N", 40}});
  BOOST_TEST(!missing.graph);
  BOOST_TEST_REQUIRE(missing.diags.size() >= 1u);
  BOOST_TEST(missing.diags[0].message == "dimension 'T' has no size; give it, e.g. --dim T=128");
  BOOST_TEST(missing.diags[0].loc.line == 2);
  BOOST_TEST(missing.diags[0].loc.col == 20);
  BOOST_TEST(missing.diags[0].loc.len == 1);
  // Sizes out of range, and a rank past 4 through names.
  Parsed zero = parse(text, "t.fgraph", ActivationSet::builtin(), {{"T", 0}, {"N", 40}});
  BOOST_TEST_REQUIRE(zero.diags.size() >= 1u);
  BOOST_TEST(zero.diags[0].message == "dimension 'T' is 0, out of range (1 to 2^40)");
  Parsed rank = parse("graph g {\n  %x = input : f16[A, A, A, A, A]\n  output %x\n}\n", "t.fgraph",
                      ActivationSet::builtin(), {{"A", 2}});
  BOOST_TEST_REQUIRE(rank.diags.size() == 1u);
  BOOST_TEST(rank.diags[0].message == "tensors have rank 4 at most; this type has rank 5");
  BOOST_TEST(rank.diags[0].loc.col == 32); // the fifth
}

BOOST_AUTO_TEST_CASE(hostile_inputs_never_crash) {
  std::string example = readAll(FPAT_SOURCE_DIR "/examples/ffn_swiglu.fgraph");
  std::vector<std::string> inputs = {"", " ", "\n\n", "graph", "graph g {", "graph g { output }",
                                     "}}}}", std::string(1, '\0'), "graph g { %x = input : f16[] }",
                                     // A dimension the parser's recovery makes up (fuzzer).
                                     "graph g { %x = input : f16[84 ,]\n output %x }",
                                     "graph g { %x = input : f16[, 4]\n output %x }",
                                     "graph g { %x = input : f16[T,, 4]\n output %x }",
                                     "graph g { %x = input : f16[99999999999999999999] output %x }",
                                     "graph g { %x = input : f16[1,2,3] output %x }"};
  for (size_t cut = 0; cut < example.size(); cut += 7)
    inputs.push_back(example.substr(0, cut)); // every truncation
  std::mt19937 rng(1234);
  for (int i = 0; i < 200; ++i) {
    std::string junk(rng() % 300, '\0');
    for (char& c : junk)
      c = static_cast<char>(rng() % 256);
    inputs.push_back(junk);
    std::string mutated = example;
    for (int k = 0; k < 5; ++k)
      mutated[rng() % mutated.size()] = static_cast<char>(rng() % 128);
    inputs.push_back(mutated);
  }
  for (const std::string& in : inputs) {
    Parsed p;
    BOOST_REQUIRE_NO_THROW(p = parse(in));
    if (!p.graph) {
      BOOST_TEST_REQUIRE(!p.diags.empty());
      for (const Diagnostic& d : p.diags)
        BOOST_TEST(d.loc.valid());
    }
  }
}

BOOST_AUTO_TEST_CASE(huge_graph_parses) {
  // 20,000 chained ops: flat grammar, no recursion depth problems.
  std::string text = "graph big {\n  %v0 = input : f16[2, 2]\n";
  for (int i = 1; i <= 20000; ++i)
    text += "  %v" + std::to_string(i) + " = add %v" + std::to_string(i - 1) + ", %v0\n";
  text += "  output %v20000\n}\n";
  Parsed p = parse(text);
  BOOST_TEST_REQUIRE(p.graph.has_value());
  BOOST_TEST(p.graph->size() == 20001u);
  BOOST_TEST(printGraph(*p.graph) == text.substr(0, 0) + printGraph(*p.graph));
}
