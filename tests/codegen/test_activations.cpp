// The CUDA lowering of .fpat activation bodies (fpat/codegen/Activations.h).
#define BOOST_TEST_MODULE activations
#include "../common/FpatCompile.h"
#include "fpat/codegen/Activations.h"
#include "fpat/codegen/Codegen.h"

#include <boost/test/unit_test.hpp>

using namespace fpat;
using namespace fpat::codegen;
using namespace fpat::testing;

BOOST_AUTO_TEST_CASE(cuda_lowering_is_readable_and_complete) {
  auto r = compileBuiltin();
  BOOST_TEST_REQUIRE(r->c.has_value());
  std::string relu = emitActivationFunction(*r->c->library.findActivation("relu"));
  BOOST_TEST(relu.find("template <bool kFma = false>\n"
                       "__device__ __forceinline__ float fpat_act_relu(float x) {\n"
                       "  return fmaxf(x, 0.0f);\n}") != std::string::npos,
             relu);
  std::string leaky = emitActivationFunction(*r->c->library.findActivation("leaky_relu"));
  BOOST_TEST(leaky.find("fpat_act_leaky_relu(float x, float p_slope)") != std::string::npos);
  BOOST_TEST(leaky.find("return x > 0.0f ? x : p_slope * x;") != std::string::npos, leaky);
  BOOST_TEST(leaky.find("activations.fpat:") != std::string::npos);
  auto neg =
      compile("include \"fpat.fpat\"\ndef f : Activation { let body = expr { let t = x - -1.5; "
              "t * - -2 }; }\n");
  BOOST_TEST_REQUIRE(neg->c.has_value(), neg->errors());
  std::string f = emitActivationFunction(*neg->c->library.findActivation("f"));
  BOOST_TEST(f.find("const float l_t = x - -1.5f;") != std::string::npos, f);
  BOOST_TEST(f.find("return l_t * -(-2.0f);") != std::string::npos, f);
  BOOST_TEST(neg->c->library.findActivation("f")->compiled.eval(1.0, nullptr) == 5.0);
  // Division and exp lower to fpat_divf(_ge1) / fpat_exp2f calls, whatever surrounds them;
  // the caller picks their pipe (kFma).
  auto div = compile("include \"fpat.fpat\"\ndef g : Activation { let body = expr { "
                     "-x / 2.0 * x + 1.0 / (x - 3.0) / exp(-x) }; }\n");
  BOOST_TEST_REQUIRE(div->c.has_value(), div->errors());
  std::string g = emitActivationFunction(*div->c->library.findActivation("g"));
  BOOST_TEST(
      g.find("return fpat_divf_ge1<kFma>(-x, 2.0f) * x + fpat_divf(fpat_divf(1.0f, x - 3.0f), "
             "fpat_exp2f<kFma>((-1.4426950408889634f) * x));") != std::string::npos,
      g);
}

BOOST_AUTO_TEST_CASE(quotients_over_one_skip_the_range_handling) {
  // A division whose denominator interval arithmetic puts at 1 or more lowers to
  // fpat_divf_ge1 (no scaling of tiny or huge divisors); any other to fpat_divf.
  struct Case {
    const char* body;
    bool ge1;
  };
  const Case cases[] = {
      {"x / (1.0 + exp(-x))", true},
      {"1.0 / (1.0 + abs(x))", true},
      {"x / max(x, 1.0)", true},
      {"let d = 2.0 + exp(x); x / d", true},
      {"x / (0.5 + tanh(x) + 1.0)", false},
      {"x / (0.5 + exp(x))", false},
      {"1.0 / x", false},
      {"x / (1.0 + x * x)", false},
      {"x / (slope + exp(x))", false},
      {"x / (x > 0.0 ? 2.0 : 1.5)", true},
      {"2.0 * (x / (3.0 + exp(x)))", true},
  };
  for (const Case& c : cases)
    BOOST_TEST_CONTEXT(c.body) {
      auto r = compile(std::string("include \"fpat.fpat\"\ndef h : Activation { let params = "
                                   "[Param<\"slope\", 2.0>]; let body = expr { ") +
                       c.body + " }; }\n");
      BOOST_TEST_REQUIRE(r->c.has_value(), r->errors());
      std::string h = emitActivationFunction(*r->c->library.findActivation("h"));
      BOOST_TEST((h.find("fpat_divf_ge1<kFma>(") != std::string::npos) == c.ge1, h);
      BOOST_TEST((h.find("fpat_divf(") != std::string::npos) == !c.ge1, h);
    }
}

BOOST_AUTO_TEST_CASE(exp_arguments_take_log2e_into_their_constants) {
  // exp(y) is ex2(y log2 e): the factor goes into y's constant factors, through negation,
  // products, constant quotients and sums with a term that takes it, never into a variable
  // term (that would cost an operation) and never by reordering terms.
  struct Case {
    const char* body;
    const char* lowered;
  };
  const Case cases[] = {
      {"exp(x)", "fpat_exp2f<kFma>(1.4426950408889634f * x)"},
      {"exp(-2.0 * pi * (x + 0.5 * x * x))",
       "fpat_exp2f<kFma>((-9.064720283654387f) * x + (-4.532360141827193f) * x * x)"},
      {"exp(x / 4.0 - 1.0)", "fpat_exp2f<kFma>(0.36067376022224085f * x - 1.4426950408889634f)"},
      {"exp(x * x)", "fpat_exp2f<kFma>(1.4426950408889634f * (x * x))"},
      {"exp(tanh(x) + x)", "fpat_exp2f<kFma>(1.4426950408889634f * (tanhf(x) + x))"},
      {"exp(slope * x * 3.0)", "fpat_exp2f<kFma>(4.32808512266689f * (p_slope * x))"},
      {"exp(1.0 - x * x) * 2.0",
       "fpat_exp2f<kFma>(1.4426950408889634f - 1.4426950408889634f * (x * x)) * 2.0f"},
  };
  for (const Case& c : cases)
    BOOST_TEST_CONTEXT(c.body) {
      auto r = compile(std::string("include \"fpat.fpat\"\ndef h : Activation { let params = "
                                   "[Param<\"slope\", 0.5>]; let body = expr { ") +
                       c.body + " }; }\n");
      BOOST_TEST_REQUIRE(r->c.has_value(), r->errors());
      std::string h = emitActivationFunction(*r->c->library.findActivation("h"));
      BOOST_TEST(h.find(std::string("return ") + c.lowered + ";") != std::string::npos, h);
    }
}

BOOST_AUTO_TEST_CASE(every_body_function_lowers) {
  // The language's functions (dsl::intrinsicNames) each have a CUDA spelling here: a function
  // added to the language without one would be a codegen error at the first kernel using it.
  for (const std::string& fn : dsl::intrinsicNames())
    BOOST_TEST_CONTEXT(fn) {
      const std::string args = fn == "min" || fn == "max" || fn == "pow" ? "x, 2.0" : "x";
      auto r = compile("include \"fpat.fpat\"\ndef h : Activation { let body = expr { " + fn + "(" +
                       args + ") }; }\n");
      BOOST_TEST_REQUIRE(r->c.has_value(), r->errors());
      std::string h;
      BOOST_CHECK_NO_THROW(h = emitActivationFunction(*r->c->library.findActivation("h")));
      BOOST_TEST(h.find("return ") != std::string::npos, h);
    }
}
