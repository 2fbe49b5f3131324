// The IR: builder, type inference and its messages, validation, topological order, Graphviz.
#define BOOST_TEST_MODULE ir
#include "fpat/ir/Builder.h"

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <sstream>

using namespace fpat::ir;

namespace {
/// The seed's example: x[1024, 4096] * w[4096, 4096] + bias -> GeLU.
Graph seedExample() {
  GraphBuilder b("example");
  Value x = b.input("x", {1024, 4096});
  Value w = b.input("w", {4096, 4096});
  Value bias = b.input("bias", {4096});
  Value y = b.gemm(x, w, false, "y");
  Value y2 = b.bias(y, bias, "y2");
  Value y3 = b.activation(y2, "gelu", "y3");
  b.output(y3);
  return b.build();
}

bool contains(const std::string& s, const std::string& sub) {
  return s.find(sub) != std::string::npos;
}
} // namespace

BOOST_AUTO_TEST_CASE(builder_builds_the_seed_example) {
  Graph g = seedExample();
  BOOST_TEST(g.size() == 6u);
  BOOST_TEST(g.outputs().size() == 1u);
  Vertex y3 = *g.find("y3");
  BOOST_TEST(g.op(y3).kind == OpKind::Activation);
  BOOST_TEST(g.op(y3).fn == "gelu");
  BOOST_TEST(g.op(y3).type == (TensorDesc{{1024, 4096}, DType::F16}));
  BOOST_TEST(g.op(*g.find("y")).type.str() == "f16[1024, 4096]");
  BOOST_TEST(validate(g).empty());
}

BOOST_AUTO_TEST_CASE(operands_users_and_use_counts) {
  Graph g = seedExample();
  Vertex y = *g.find("y"), y2 = *g.find("y2"), y3 = *g.find("y3");
  auto ops = g.operands(y2);
  BOOST_REQUIRE(ops.size() == 2u);
  BOOST_TEST(g.op(ops[0]).name == "y");
  BOOST_TEST(g.op(ops[1]).name == "bias");
  BOOST_TEST(g.users(y) == std::vector<Vertex>{y2});
  BOOST_TEST(g.useCount(y) == 1u);
  BOOST_TEST(g.useCount(y3) == 1u); // the graph output is a use
  BOOST_TEST(g.isOutput(y3));
}

BOOST_AUTO_TEST_CASE(same_value_twice_is_two_operand_edges) {
  GraphBuilder b("sq");
  Value x = b.input("x", {4, 4});
  Value m = b.mul(x, x, "m");
  b.output(m);
  Graph g = b.build();
  BOOST_TEST(g.operands(m.v).size() == 2u);
  BOOST_TEST(g.users(x.v).size() == 1u);
  BOOST_TEST(g.useCount(x.v) == 2u);
}

BOOST_AUTO_TEST_CASE(kernel_families_are_registered_by_id_and_name) {
  // The registry lists each family once, at its Family's index, found by its name; a plain
  // gemm op belongs to Family::Gemm and its main operands are A and B.
  const std::vector<const KernelFamily*>& all = kernelFamilies();
  BOOST_TEST(all.size() == 4u);
  for (size_t i = 0; i < all.size(); ++i) {
    BOOST_TEST(static_cast<size_t>(all[i]->family) == i);
    BOOST_TEST(findFamily(all[i]->name) == all[i]);
    BOOST_TEST(&kernelFamily(all[i]->family) == all[i]);
  }
  BOOST_TEST(findFamily("gemmm") == nullptr);
  BOOST_TEST(familyDidYouMean("gemmm") == " (did you mean 'gemm'?)");
  Op gemm;
  gemm.kind = OpKind::Gemm;
  BOOST_TEST(familyOf(gemm) == &kernelFamily(Family::Gemm));
  BOOST_TEST(mainOperandCount(gemm) == 2u);
  Op fused;
  fused.kind = OpKind::Fused;
  fused.fused.family = "norm_dual_gemm";
  fused.fused.norm = "rmsnorm";
  BOOST_TEST(gemmBIndex(fused) == 2u); // x, gamma, Bg, Bu
  BOOST_TEST(mainOperandCount(fused) == 4u);
}

BOOST_AUTO_TEST_CASE(gemm_inference_with_and_without_transpose) {
  GraphBuilder b("t");
  Value a = b.input("a", {17, 100});
  Value w = b.input("w", {100, 33});
  Value wt = b.input("wt", {33, 100});
  BOOST_TEST(b.type(b.gemm(a, w)).shapeStr() == "[17, 33]");
  BOOST_TEST(b.type(b.gemm(a, wt, true)).shapeStr() == "[17, 33]");
}

BOOST_AUTO_TEST_CASE(type_errors_name_op_operand_expected_and_actual) {
  GraphBuilder b("t");
  Value a = b.input("a", {64, 128});
  Value w = b.input("w", {256, 32});
  try {
    b.gemm(a, w, false, "h");
    BOOST_FAIL("expected a BuildError");
  } catch (const BuildError& e) {
    std::string m = e.what();
    BOOST_TEST(contains(m, "gemm %h"), m);
    BOOST_TEST(contains(m, "operand 1 (%w: f16[256, 32])"), m);
    BOOST_TEST(contains(m, "K = 256; expected K = 128"), m);
  }
  Value bias = b.input("bias", {31});
  Value h = b.gemm(a, b.input("w2", {128, 32}), false, "h2");
  BOOST_CHECK_EXCEPTION(b.bias(h, bias), BuildError, [](const BuildError& e) {
    return contains(e.what(), "must have shape [32]");
  });
  Value f32 = b.input("f", {64, 32}, DType::F32);
  BOOST_CHECK_EXCEPTION(b.add(h, f32), BuildError, [](const BuildError& e) {
    return contains(e.what(), "has dtype f32; expected f16");
  });
  BOOST_CHECK_EXCEPTION(b.mul(h, a), BuildError, [](const BuildError& e) {
    return contains(e.what(), "does not broadcast with operand 0, [64, 32]");
  });
  BOOST_CHECK_EXCEPTION(b.activation(h, "swish7"), BuildError, [](const BuildError& e) {
    return contains(e.what(), "unknown activation 'swish7'");
  });
  BOOST_CHECK_EXCEPTION(b.layernorm(h, bias, bias), BuildError, [](const BuildError& e) {
    return contains(e.what(), "operand 1 (%bias: f16[31]) must have shape [32]");
  });
  BOOST_CHECK_EXCEPTION(b.rmsnorm(h, b.input("g", {32}), 0.0), BuildError, [](const BuildError& e) {
    return contains(e.what(), "eps must be positive");
  });
  BOOST_CHECK_EXCEPTION(b.input("bad", {4, 0}), BuildError, [](const BuildError& e) {
    return contains(e.what(), "shape out of range (dimensions 1 to 2^40");
  });
  BOOST_CHECK_EXCEPTION(b.input("huge", {int64_t{1} << 32, int64_t{1} << 32}), BuildError,
                        [](const BuildError& e) { return contains(e.what(), "2^40 elements"); });
  BOOST_CHECK_EXCEPTION(b.input("r5", {2, 2, 2, 2, 2}), BuildError,
                        [](const BuildError& e) { return contains(e.what(), "rank 1 to 4"); });
  BOOST_CHECK_EXCEPTION(b.input("a", {2}), BuildError,
                        [](const BuildError& e) { return contains(e.what(), "more than once"); });
}

BOOST_AUTO_TEST_CASE(arity_is_checked) {
  Op op;
  op.kind = OpKind::Gemm;
  op.name = "h";
  TypeError err;
  BOOST_TEST(!inferType(op, {{"a", {{2, 2}, DType::F16}}}, err));
  BOOST_TEST(err.message == "gemm %h takes 2 operands but was given 1");
}

BOOST_AUTO_TEST_CASE(graph_without_outputs_is_invalid) {
  GraphBuilder b("t");
  b.input("x", {4});
  BOOST_CHECK_EXCEPTION(b.build(), BuildError,
                        [](const BuildError& e) { return contains(e.what(), "has no outputs"); });
}

BOOST_AUTO_TEST_CASE(topological_order_puts_operands_first) {
  GraphBuilder b("t");
  Value x = b.input("x", {8, 8});
  Value w1 = b.input("w1", {8, 8});
  Value w2 = b.input("w2", {8, 8});
  Value g1 = b.gemm(x, w1, false, "g1");
  Value g2 = b.gemm(x, w2, false, "g2");
  Value m = b.mul(g1, g2, "m");
  b.output(m);
  Graph g = b.build();
  auto order = topologicalOrder(g);
  BOOST_REQUIRE(order);
  BOOST_TEST(order->size() == g.size());
  std::vector<size_t> pos(g.size());
  for (size_t i = 0; i < order->size(); ++i)
    pos[(*order)[i]] = i;
  for (Vertex v : g.vertices())
    for (Vertex u : g.operands(v))
      BOOST_TEST(pos[u] < pos[v]);
}

BOOST_AUTO_TEST_CASE(cycles_are_reported_not_crashed_on) {
  GraphBuilder b("c");
  Value x = b.input("x", {4, 4});
  Value a = b.add(x, x, "a");
  Value m = b.mul(a, x, "m");
  b.output(m);
  Graph g = b.build();
  // Rewire: a's second operand becomes m, closing a -> m -> a.
  boost::remove_edge(x.v, a.v, g.impl());
  g.connect(x.v, a.v, 0);
  g.connect(m.v, a.v, 1);
  std::vector<Vertex> cycle;
  BOOST_TEST(!topologicalOrder(g, &cycle));
  BOOST_TEST(cycle == (std::vector<Vertex>{a.v, m.v}));
  auto problems = validate(g);
  BOOST_REQUIRE(problems.size() == 1u);
  BOOST_TEST(problems[0] == "graph c has a cycle through %a %m");
}

BOOST_AUTO_TEST_CASE(validator_catches_corrupted_types_and_indices) {
  Graph g = seedExample();
  g.op(*g.find("y2")).type.shape = {1, 1};
  auto problems = validate(g);
  BOOST_REQUIRE(!problems.empty());
  BOOST_TEST(
      contains(problems[0], "recorded type f16[1, 1] differs from inferred type f16[1024, 4096]"));

  Graph h = seedExample();
  h.connect(*h.find("x"), *h.find("y3"), 5);
  problems = validate(h);
  BOOST_REQUIRE(!problems.empty());
  BOOST_TEST(contains(problems[0], "operand indices are not 0..1"), problems[0]);
}

BOOST_AUTO_TEST_CASE(infer_types_updates_after_edits) {
  Graph g = seedExample();
  g.op(*g.find("x")).type.shape = {17, 4096};
  BOOST_TEST(inferTypes(g).empty());
  BOOST_TEST(g.op(*g.find("y3")).type.shapeStr() == "[17, 4096]");
}

BOOST_AUTO_TEST_CASE(graphviz_names_ops_and_shapes) {
  std::ostringstream os;
  writeDot(seedExample(), os);
  std::string dot = os.str();
  BOOST_TEST(contains(dot, "digraph G {"), dot);
  BOOST_TEST(contains(dot, "%y3 = activation\\n{fn = gelu}\\nf16[1024, 4096]"), dot);
  BOOST_TEST(contains(dot, "0->3 [label=\"[1024, 4096] #0\"]"), dot);
  BOOST_TEST(contains(dot, "peripheries=2"), dot);
}

BOOST_AUTO_TEST_CASE(bf16_conversion_rounds_to_nearest_even) {
  BOOST_TEST(doubleToBf16Bits(1.0) == 0x3f80);
  BOOST_TEST(doubleToBf16Bits(-2.0) == 0xc000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even significand (1.0); a hair
  // more goes up. 1 + 3 * 2^-8 ties up to 1 + 2^-6.
  BOOST_TEST(doubleToBf16Bits(1.0 + 0x1p-8) == 0x3f80);
  BOOST_TEST(doubleToBf16Bits(1.0 + 0x1p-8 + 0x1p-30) == 0x3f81);
  BOOST_TEST(doubleToBf16Bits(1.0 + 3 * 0x1p-8) == 0x3f82);
  // f32's range: 3.4e38 rounds to the largest finite value, 1e39 overflows, 1e-39 is subnormal.
  BOOST_TEST(doubleToBf16Bits(3.38e38) == 0x7f7e);
  BOOST_TEST(doubleToBf16Bits(1e39) == 0x7f80);
  BOOST_TEST(doubleToBf16Bits(-1e39) == 0xff80);
  BOOST_TEST(bf16BitsToFloat(doubleToBf16Bits(1e-39)) > 0.0f);
  BOOST_TEST(bf16BitsToFloat(doubleToBf16Bits(1e-39)) < 1.2e-38f);
  BOOST_TEST(std::isnan(bf16BitsToFloat(doubleToBf16Bits(std::nan("")))));
  // Every bf16 value round-trips.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16BitsToFloat(static_cast<uint16_t>(h));
    if (std::isfinite(f) && !(f == 0.0f && (h & 0x8000)))
      BOOST_TEST_REQUIRE(doubleToBf16Bits(f) == h);
  }
  BOOST_TEST(roundTo(1.0 + 0x1p-9, DType::BF16) == 1.0f);
  BOOST_TEST(roundTo(1.0 + 0x1p-9, DType::F16) == static_cast<float>(1.0 + 0x1p-9));
}

BOOST_AUTO_TEST_CASE(half_conversion_rounds_to_nearest_even) {
  BOOST_TEST(doubleToHalfBits(1.0) == 0x3c00);
  BOOST_TEST(doubleToHalfBits(-2.0) == 0xc000);
  BOOST_TEST(doubleToHalfBits(65504.0) == 0x7bff);
  BOOST_TEST(doubleToHalfBits(65520.0) == 0x7c00);          // rounds up to infinity
  BOOST_TEST(doubleToHalfBits(1.0 + 1.0 / 2048) == 0x3c00); // tie -> even
  BOOST_TEST(doubleToHalfBits(1.0 + 3.0 / 2048) == 0x3c02); // tie -> even (up)
  BOOST_TEST(doubleToHalfBits(0x1p-24) == 0x0001);          // smallest subnormal
  BOOST_TEST(doubleToHalfBits(0x1p-25) == 0x0000);          // tie -> even (zero)
  BOOST_TEST(doubleToHalfBits(0x1.8p-25) == 0x0001);
  BOOST_TEST(halfBitsToFloat(0x0001) == 0x1p-24f);
  BOOST_TEST(halfBitsToFloat(0x3555) == 0.333251953125f);
  // Every finite half value survives a round trip.
  for (uint32_t h = 0; h < 0x10000; ++h)
    if ((h & 0x7c00) != 0x7c00)
      BOOST_TEST_REQUIRE(doubleToHalfBits(halfBitsToFloat(static_cast<uint16_t>(h))) == h);
}
