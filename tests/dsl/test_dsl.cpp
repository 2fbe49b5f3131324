// The .fpat front end, the pattern library, the matcher table compiler and fpat-tblgen.
#define BOOST_TEST_MODULE dsl
#include "../common/FpatCompile.h"
#include "fpat/dsl/Matcher.h"
#include "fpat/dsl/Tblgen.h"

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

using namespace fpat;
using namespace fpat::dsl;
using namespace fpat::testing;
namespace fs = std::filesystem;

namespace {

double evalBody(const std::string& body, double x, std::vector<double> params = {}) {
  auto r = compile("include \"fpat.fpat\"\ndef f : Activation { " + body + " }\n");
  BOOST_TEST_REQUIRE(r->c.has_value(), r->errors());
  const ActivationDef* a = r->c->library.findActivation("f");
  BOOST_TEST_REQUIRE(a != nullptr);
  if (params.empty())
    params = a->paramDefaults;
  return a->compiled.eval(x, params.data());
}

} // namespace

BOOST_AUTO_TEST_CASE(builtin_patterns_are_the_seeds_nine_and_the_llm_blocks) {
  auto r = compileBuiltin();
  BOOST_TEST_REQUIRE(r->c.has_value(), r->errors());
  std::vector<std::string> names;
  for (const PatternDef& p : r->c->library.patterns)
    names.push_back(p.name);
  // GemmAct's six per activation, in defm order, then the rest in source order.
  std::vector<std::string> want;
  for (const char* act : {"gelu", "gelu_erf", "silu", "quick_gelu", "relu"})
    for (const char* form : {"gemm_bias_", "gemm_", "layernorm_gemm_bias_", "layernorm_gemm_",
                             "rmsnorm_gemm_bias_", "rmsnorm_gemm_"})
      want.push_back(std::string(form) + act);
  for (const char* name :
       {"gemm_bias", "gemm_bias_residual", "gemm_residual", "gemm_bias_residual2", "gemm_residual2",
        "gemm_silu_mul", "gemm_swiglu", "rmsnorm_gemm_swiglu", "gemm_geglu", "rmsnorm_gemm_geglu",
        "layernorm_gemm_bias", "rmsnorm_gemm_bias", "layernorm_gemm", "rmsnorm_gemm"})
    want.push_back(name);
  BOOST_TEST(names == want, boost::test_tools::per_element());
  BOOST_TEST(r->diags->diagnostics().empty(), r->errors());
}

BOOST_AUTO_TEST_CASE(fpat_activation_bodies_agree_with_the_cpp_reference) {
  auto r = compileBuiltin();
  BOOST_TEST_REQUIRE(r->c.has_value());
  const std::map<std::string, double (*)(double)> cpp = {
      {"gelu", ir::geluTanh}, {"gelu_erf", ir::geluErf}, {"silu", ir::silu}, {"relu", ir::relu}};
  for (auto& [name, fn] : cpp) {
    const ActivationDef* a = r->c->library.findActivation(name);
    BOOST_TEST_REQUIRE(a != nullptr, name);
    double worst = 0;
    for (double x = -8; x <= 8; x += 1.0 / 256)
      worst = std::max(worst, std::abs(a->compiled.eval(x, nullptr) - fn(x)));
    BOOST_TEST(worst <= 1e-6, name << ": worst difference " << worst);
  }
  // And the reference library built from the bodies evaluates them with parameters.
  ir::ActivationLibrary lib = r->c->library.referenceActivations();
  const ir::ActivationFn* leaky = lib.find("leaky_relu");
  BOOST_TEST_REQUIRE(leaky != nullptr);
  BOOST_TEST((*leaky)(-2.0, {}) == -0.02);
  BOOST_TEST((*leaky)(-2.0, {{"slope", 0.5}}) == -1.0);
  BOOST_TEST((*leaky)(3.0, {}) == 3.0);
}

BOOST_AUTO_TEST_CASE(expression_semantics) {
  BOOST_TEST(evalBody("let body = expr { 2 + 3 * 4 };", 0) == 14);
  BOOST_TEST(evalBody("let body = expr { (2 + 3) * 4 };", 0) == 20);
  BOOST_TEST(evalBody("let body = expr { 10 - 4 - 3 };", 0) == 3);
  BOOST_TEST(evalBody("let body = expr { 8 / 4 / 2 };", 0) == 1);
  BOOST_TEST(evalBody("let body = expr { -x * 2 };", 3) == -6);
  BOOST_TEST(evalBody("let body = expr { x > 1 ? 10 : 20 };", 2) == 10);
  BOOST_TEST(evalBody("let body = expr { x > 1 ? 10 : x < 0 ? 30 : 20 };", -1) == 30);
  BOOST_TEST(evalBody("let body = expr { (x <= 2) + (x >= 2) + (x == 2) + (x != 2) };", 2) == 3);
  BOOST_TEST(evalBody("let body = expr { let a = x * 2; let b = a + 1; a * b };", 3) == 42);
  BOOST_TEST(evalBody("let body = expr { min(x, 1) + max(x, 1) + abs(-x) + pow(x, 2) };", 3) ==
             1 + 3 + 3 + 9);
  BOOST_TEST(std::abs(evalBody("let body = expr { rsqrt(x) + sqrt(x) + log(exp(x)) };", 4) -
                      (0.5 + 2 + 4)) < 1e-12);
  BOOST_TEST(std::abs(evalBody("let body = expr { pi + e };", 0) - (M_PI + M_E)) < 1e-12);
  BOOST_TEST(evalBody("let params = [Param<\"k\", 3>]; let body = expr { k * x };", 2) == 6);
  BOOST_TEST(evalBody("let params = [Param<\"k\", 3>]; let body = expr { k * x };", 2, {5}) == 10);
}

BOOST_AUTO_TEST_CASE(template_arguments_reach_expression_bodies) {
  auto r = compile("include \"fpat.fpat\"\n"
                   "class Scaled<float s> : Activation { let body = expr { s * x }; }\n"
                   "defvar two = 2;\n"
                   "def double : Scaled<two>;\n"
                   "def half : Scaled<0.5>;\n");
  BOOST_TEST_REQUIRE(r->c.has_value(), r->errors());
  BOOST_TEST(r->c->library.findActivation("double")->compiled.eval(3, nullptr) == 6);
  BOOST_TEST(r->c->library.findActivation("half")->compiled.eval(3, nullptr) == 1.5);
}

BOOST_AUTO_TEST_CASE(printed_bodies_parse_back_identically) {
  auto r = compileBuiltin();
  BOOST_TEST_REQUIRE(r->c.has_value());
  for (const ActivationDef& a : r->c->library.activations) {
    std::string printed = printExpr(*a.body);
    std::string params;
    for (size_t i = 0; i < a.paramNames.size(); ++i)
      params += std::string(i ? ", " : "") + "Param<\"" + a.paramNames[i] + "\", 1.0>";
    auto again = compile("include \"fpat.fpat\"\ndef f : Activation { let params = [" + params +
                         "]; let body = " + printed + "; }\n");
    BOOST_TEST_REQUIRE(again->c.has_value(), again->errors());
    BOOST_TEST(printExpr(*again->c->library.findActivation("f")->body) == printed);
  }
}

BOOST_AUTO_TEST_CASE(pattern_library_fields) {
  auto r = compileBuiltin();
  BOOST_TEST_REQUIRE(r->c.has_value());
  const auto& ps = r->c->library.patterns;
  auto find = [&](const std::string& n) -> const PatternDef& {
    for (const PatternDef& p : ps)
      if (p.name == n)
        return p;
    BOOST_FAIL("no pattern " + n);
    return ps[0];
  };
  const PatternDef& gbg = find("gemm_bias_gelu");
  BOOST_TEST(gbg.benefit == 3);
  BOOST_TEST(gbg.numOps == 3);
  BOOST_TEST(gbg.inputs == (std::vector<std::string>{"a", "w", "b"}));
  BOOST_TEST(gbg.epilogue.empty()); // derived from the match, not written out
  BOOST_TEST(find("layernorm_gemm").family == "norm_gemm");
  BOOST_TEST(find("layernorm_gemm").inputs ==
             (std::vector<std::string>{"x", "gamma", "beta", "w"}));
  BOOST_TEST(find("gemm_bias_residual").root.commutative);
}

BOOST_AUTO_TEST_CASE(table_order_variants_and_round_trip) {
  auto r = compileBuiltin();
  BOOST_TEST_REQUIRE(r->c.has_value());
  MatcherTable t = compileMatcherTable(r->c->library, r->sm, *r->diags);
  BOOST_TEST(r->diags->warningCount() == 0);
  BOOST_REQUIRE(t.patterns.size() == 44u);
  // Benefit first, then source order.
  for (size_t i = 1; i < t.patterns.size(); ++i)
    BOOST_TEST(t.patterns[i - 1].benefit >= t.patterns[i].benefit);
  auto at = [&](const std::string& name) {
    for (size_t i = 0; i < t.patterns.size(); ++i)
      if (t.patterns[i].name == name)
        return i;
    return t.patterns.size();
  };
  BOOST_TEST(t.patterns[0].name == "rmsnorm_gemm_swiglu"); // benefit 6
  BOOST_TEST(t.patterns[1].name == "rmsnorm_gemm_geglu");
  // Benefit 4: the norms with a bias and an activation, before the dual GEMMs without a norm.
  BOOST_TEST(t.patterns[2].name == "layernorm_gemm_bias_gelu");
  BOOST_TEST(at("rmsnorm_gemm_bias_relu") < at("gemm_swiglu"));
  BOOST_TEST(at("gemm_swiglu") < at("gemm_bias_gelu"));
  BOOST_TEST(at("layernorm_gemm_bias") < at("gemm_bias"));
  BOOST_TEST(t.patterns[at("gemm_bias_residual")].numVariants == 2); // add is commutative
  // Flattening the factored table gives one program per variant, in pattern order: the four
  // gated MLPs, gemm_bias_residual, gemm_silu_mul and gemm_residual have two each, the two
  // residual2 patterns (two adds) four each.
  auto progs = flattenPrograms(t);
  BOOST_TEST(progs.size() == 57u);
  // Merging with an empty table changes nothing.
  MatcherTable merged;
  std::string clash;
  BOOST_TEST(mergeMatcherTables(t, MatcherTable{}, merged, clash));
  BOOST_TEST(merged.bytes == t.bytes);
  BOOST_TEST(!mergeMatcherTables(t, t, merged, clash));
  BOOST_TEST(clash == "rmsnorm_gemm_swiglu");
}

BOOST_AUTO_TEST_CASE(tables_larger_than_64k_keep_every_program) {
  // Patterns of 8 commutative ops have 256 operand orders each; a few of them with a common
  // prefix make one scope larger than 64 KB (whose 16-bit sizes once wrapped: matching read
  // garbage and crashed). A ninth commutative op is matched as written, with a warning.
  std::string text = "include \"activations.fpat\"\n";
  int k = 0;
  for (const char* c : {"0.25", "0.5", "0.75", "1.25"})
    text += "def p" + std::to_string(k++) + " : Raise<(mul (mul " + std::string(c) +
            ", $x), (add 1.0, (tanh (mul 0.5, (add $x, (mul 0.25, (mul (mul $x, $x), $x))))))), "
            "(gelu $x)>;\n";
  text += "def nine : Pattern<(add (add (add (add (add (add (add (add (add (gemm $a, $w), $r), "
          "$r), $r), $r), $r), $r), $r), $r), $r)>;\n";
  auto r = compile(text);
  BOOST_TEST_REQUIRE(r->c.has_value(), r->errors());
  PatternLibrary raises;
  raises.patterns = r->c->library.raises;
  MatcherTable t = compileMatcherTable(raises, r->sm, *r->diags);
  BOOST_TEST(t.bytes.size() > 65536u);
  size_t variants = 0;
  for (const PatternMeta& m : t.patterns)
    variants += static_cast<size_t>(m.numVariants);
  BOOST_TEST(variants == 4u * 256u);
  BOOST_TEST(flattenPrograms(t).size() == variants);
  PatternLibrary nine;
  for (const PatternDef& p : r->c->library.patterns)
    if (p.name == "nine")
      nine.patterns.push_back(p);
  MatcherTable n = compileMatcherTable(nine, r->sm, *r->diags);
  BOOST_TEST(n.patterns.at(0).numVariants == 256);
  BOOST_TEST(r->errors().find("'nine' has 9 commutative ops (add, mul); the first 8 in pre-order "
                              "match either operand order, the rest only as written") !=
                 std::string::npos,
             r->errors());
}

BOOST_AUTO_TEST_CASE(merged_tables_order_user_patterns_by_benefit) {
  auto b = compileBuiltin();
  BOOST_TEST_REQUIRE(b->c.has_value());
  MatcherTable builtin = compileMatcherTable(b->c->library, b->sm, *b->diags);
  auto u = compile("include \"activations.fpat\"\n"
                   "def top : Pattern<(gelu (gemm $a, $w))> { let benefit = 9; }\n"
                   "def tie : Pattern<(relu (gemm $a, $w))> { let benefit = 2; }\n");
  BOOST_TEST_REQUIRE(u->c.has_value(), u->errors());
  PatternLibrary mine;
  for (const PatternDef& p : u->c->library.patterns)
    if (p.name == "top" || p.name == "tie")
      mine.patterns.push_back(p);
  MatcherTable user = compileMatcherTable(mine, u->sm, *u->diags);
  MatcherTable merged;
  std::string clash;
  BOOST_TEST_REQUIRE(mergeMatcherTables(builtin, user, merged, clash));
  std::vector<std::string> order;
  for (const PatternMeta& p : merged.patterns)
    order.push_back(p.name);
  BOOST_TEST(order.front() == "top");
  // Ties keep built-ins first: "tie" (benefit 2) comes after every built-in of benefit 2.
  BOOST_TEST(order.back() == "tie");
  BOOST_TEST(flattenPrograms(merged).size() == 59u);
}

BOOST_AUTO_TEST_CASE(hostile_inputs_are_diagnosed_not_crashed_on) {
  std::vector<std::string> inputs = {
      "",
      "def",
      "class C<",
      std::string(100000, '('),
      std::string(5000, '['),
      "def a : Activation { let body = expr { " + std::string(3000, '-') + "x }; }",
      "def a { int x = " + std::string(20000, '1') + "; }",
      "\xff\xfe\x01",
      "include \"fpat.fpat\"\nclass A : A;",
      "class A; class B : A; " + [] {
        std::string s;
        for (int i = 0; i < 300; ++i)
          s +=
              "class C" + std::to_string(i + 1) + " : " + (i ? "C" + std::to_string(i) : "B") + ";";
        return s + "def d : C300;";
      }()};
  std::string longSum = "include \"fpat.fpat\"\ndef a : Activation { let body = expr { x";
  for (int i = 0; i < 3000; ++i)
    longSum += " + x";
  inputs.push_back(longSum + " }; }\n");
  for (const std::string& in : inputs) {
    std::unique_ptr<Compiled> r;
    BOOST_REQUIRE_NO_THROW(r = compile(in));
    if (!r->c)
      BOOST_TEST(r->diags->hasErrors());
  }
  // The long sum is legal and evaluates correctly.
  auto r = compile(longSum + " }; }\n");
  BOOST_TEST_REQUIRE(r->c.has_value(), r->errors());
  BOOST_TEST(r->c->library.findActivation("a")->compiled.eval(1.0, nullptr) == 3001.0);
}

BOOST_AUTO_TEST_CASE(tblgen_depfile_and_write_if_changed) {
  fs::path dir = fs::temp_directory_path() / ("fpat-tblgen-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  TblgenOptions o;
  o.input = kPatterns + "/all.fpat";
  o.action = TblgenOptions::GenMatcherTable;
  o.output = (dir / "t.inc").string();
  o.depfile = (dir / "t.inc.d").string();
  o.writeIfChanged = true;
  std::ostringstream out, err;
  BOOST_TEST_REQUIRE(runTblgen(o, out, err) == 0, err.str());
  std::string dep;
  BOOST_TEST_REQUIRE(readFile(o.depfile, dep));
  for (const char* f : {"all.fpat", "gemm.fpat", "activations.fpat", "fpat.fpat"})
    BOOST_TEST(dep.find(f) != std::string::npos, dep);
  BOOST_TEST(dep.rfind(o.output + ":", 0) == 0u);
  auto before = fs::last_write_time(o.output);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  BOOST_TEST_REQUIRE(runTblgen(o, out, err) == 0);
  BOOST_TEST((fs::last_write_time(o.output) == before)); // unchanged output left alone
  o.writeIfChanged = false;
  BOOST_TEST_REQUIRE(runTblgen(o, out, err) == 0);
  BOOST_TEST((fs::last_write_time(o.output) != before));
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(tblgen_reports_errors_with_exit_code_1) {
  fs::path f = fs::temp_directory_path() / ("fpat-bad-" + std::to_string(::getpid()) + ".fpat");
  std::ofstream(f) << "def x : Nope;\ndef y : AlsoNope;\n";
  TblgenOptions o;
  o.input = f.string();
  std::ostringstream out, err;
  BOOST_TEST(runTblgen(o, out, err) == 1);
  BOOST_TEST(err.str().find(":1:9: error: unknown class 'Nope'") != std::string::npos, err.str());
  BOOST_TEST(err.str().find(":2:9: error: unknown class 'AlsoNope'") != std::string::npos);
  BOOST_TEST(err.str().find("2 errors generated.") != std::string::npos);
  fs::remove(f);
}
