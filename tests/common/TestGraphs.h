// Graphs and pattern libraries shared by the codegen and GPU suites and the benchmarks: one graph
// per built-in pattern and per fallback kernel, at a given (M, N, K).
#pragma once

#include "fpat/dsl/Library.h"
#include "fpat/ir/Builder.h"
#include "fpat/match/Match.h"

#include <string>
#include <vector>

namespace fpat::testing {

struct Shape {
  int64_t m, n, k;
  std::string str() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  }
};

/// The built-in library (activation bodies), compiled once from the .fpat sources embedded in
/// the binary, as fpatc does: the benchmark then runs from a build tree copied anywhere (read
/// from the checkout, a missing patterns/ gave an empty library and "no .fpat body" errors).
/// The source manager holds the .fpat buffers that the library's locations point into.
inline SourceManager& builtinSources() {
  static SourceManager sm;
  return sm;
}
inline const dsl::PatternLibrary& builtinLibrary() {
  static DiagEngine diags(builtinSources());
  static const dsl::PatternLibrary lib = [] {
    auto c = dsl::compileBuiltinPatterns(builtinSources(), diags);
    if (!c)
      throw std::runtime_error("the built-in patterns do not compile");
    return c->library;
  }();
  return lib;
}

/// Names of the graphs `caseGraph` builds: the built-in patterns, then the fallback kernels.
inline std::vector<std::string> caseNames() {
  return {"gemm_bias_gelu",
          "gemm_bias_silu",
          "gemm_bias_relu",
          "gemm_bias_quick_gelu",
          "gemm_bias",
          "gemm_bias_residual",
          "gemm_gelu",
          "gemm_silu",
          "gemm_relu",
          "gemm_residual",
          "gemm_bias_residual2",
          "gemm_residual2",
          "gemm_silu_mul",
          "layernorm_gemm",
          "rmsnorm_gemm",
          "layernorm_gemm_bias_gelu",
          "layernorm_gemm_bias",
          "rmsnorm_gemm_bias",
          "layernorm_gemm_bias_relu",
          "rmsnorm_gemm_relu",
          "gemm_bias_gelu_erf",
          "layernorm_gemm_gelu_erf",
          "gemm",
          "gemm_bt",
          "bias_add",
          "activation_gelu_erf",
          "activation_leaky_relu",
          "add",
          "mul",
          "layernorm",
          "rmsnorm",
          "softmax"};
}

/// A graph that the built-in table fuses into exactly the pattern `name` (or, for fallbacks,
/// an unfusable graph whose only op is of that kind). x: [M, K], weights: [K, N] (gemm_bt:
/// [N, K]), declared weights (constant between runs) with `weights`, else plain inputs; so are
/// a norm's gamma and beta (weights: the Hopper backend defers the norm, codegen::defersNorm).
inline ir::Graph caseGraph(const std::string& name, Shape s, bool weights = false) {
  ir::ActivationSet acts = builtinLibrary().activationSet();
  ir::GraphBuilder b(name, acts);
  auto x = b.input("x", {s.m, s.k});
  auto in = [&](const std::string& n, std::vector<int64_t> shape) {
    return weights ? b.weight(n, std::move(shape)) : b.input(n, std::move(shape));
  };
  auto w = [&] { return in("w", {s.k, s.n}); };
  auto bias = [&] { return b.input("b", {s.n}); };
  // [layernorm_ | rmsnorm_] gemm [_bias] [_<activation>]: GemmAct's patterns and the norms'.
  auto chain = [&](std::string rest) {
    auto eat = [&](const std::string& p) {
      const bool ok = rest.compare(0, p.size(), p) == 0;
      if (ok)
        rest.erase(0, p.size());
      return ok;
    };
    const std::string norm = eat("layernorm_") ? "layernorm" : eat("rmsnorm_") ? "rmsnorm" : "";
    if (!eat("gemm"))
      return false;
    const bool hasBias = eat("_bias");
    if (!rest.empty() && (!eat("_") || !acts.contains(rest)))
      return false;
    auto a = norm == "layernorm" ? b.layernorm(x, in("g", {s.k}), in("be", {s.k}), 1e-5)
             : norm == "rmsnorm" ? b.rmsnorm(x, in("g", {s.k}), 1e-6)
                                 : x;
    const std::string last = rest.empty() ? "y" : "";
    auto h = b.gemm(a, w(), false, hasBias ? "" : last);
    if (hasBias)
      h = b.bias(h, bias(), last);
    if (!rest.empty())
      b.output(b.activation(h, rest, "y"));
    else
      b.output(h);
    return true;
  };
  if (name == "gemm_bias_residual") {
    auto r = b.input("r", {s.m, s.n});
    b.output(b.add(r, b.bias(b.gemm(x, w()), bias()), "y")); // residual first: commutativity
  } else if (name == "gemm_residual") {
    b.output(b.add(b.gemm(x, w()), b.input("r", {s.m, s.n}), "y"));
  } else if (name == "gemm_bias_residual2") { // a parallel block: x + mlp + attn, commuted
    auto r = b.input("r", {s.m, s.n});
    b.output(b.add(b.input("r2", {s.m, s.n}), b.add(b.bias(b.gemm(x, w()), bias()), r), "y"));
  } else if (name == "gemm_residual2") {
    auto r = b.add(b.gemm(x, w()), b.input("r", {s.m, s.n}));
    b.output(b.add(r, b.input("r2", {s.m, s.n}), "y"));
  } else if (name == "gemm_silu_mul") {
    auto up = b.input("up", {s.m, s.n});
    b.output(b.mul(up, b.activation(b.gemm(x, w()), "silu"), "y")); // up first: commutativity
  } else if (name == "gemm_bt") {
    b.output(b.gemm(x, in("wt", {s.n, s.k}), true, "y"));
  } else if (name == "gemm_swiglu" || name == "gemm_geglu" || name == "rmsnorm_gemm_swiglu" ||
             name == "rmsnorm_gemm_geglu") {
    // The gated MLPs: one dual GEMM where the weights are weights (else gemm_silu_mul or
    // gemm_gelu and a GEMM: not in caseNames, which fuse into one kernel either way).
    const bool norm = name[0] == 'r';
    auto a = norm ? b.rmsnorm(x, in("g", {s.k}), 1e-6) : x;
    const std::string act = name.find("swiglu") != std::string::npos ? "silu" : "gelu";
    auto up = b.gemm(a, in("wu", {s.k, s.n}));
    b.output(b.mul(b.activation(b.gemm(a, in("wg", {s.k, s.n})), act), up, "y"));
  } else if (name == "bias_add") {
    b.output(b.bias(b.input("h", {s.m, s.n}), bias(), "y"));
  } else if (name == "activation_gelu_erf" || name == "activation_leaky_relu") {
    b.output(b.activation(b.input("h", {s.m, s.n}), name.substr(11), "y"));
  } else if (name == "add" || name == "mul") {
    auto p = b.input("p", {s.m, s.n}), q = b.input("q", {s.m, s.n});
    b.output(name == "add" ? b.add(p, q, "y") : b.mul(p, q, "y"));
  } else if (name == "layernorm") {
    b.output(b.layernorm(b.input("h", {s.m, s.n}), b.input("g", {s.n}), b.input("be", {s.n}), 1e-5,
                         "y"));
  } else if (name == "rmsnorm") {
    b.output(b.rmsnorm(b.input("h", {s.m, s.n}), b.input("g", {s.n}), 1e-6, "y"));
  } else if (name == "softmax") {
    b.output(b.softmax(b.input("h", {s.m, s.n}), "y"));
  } else if (!chain(name)) {
    throw std::invalid_argument("no test graph " + name);
  }
  ir::Graph g = b.build();
  if (name == "activation_leaky_relu")
    g.op(*g.find("y")).params["slope"] = 0.2;
  return g;
}

/// `g` fused with the built-in table.
inline ir::Graph fuse(const ir::Graph& g) {
  return match::rewrite(g, match::builtinTable(),
                        match::findMatches(g, match::builtinTable()).matches);
}

/// The built-in weight rewrites applied to `g`, as fpatc applies them after raising.
inline ir::Graph applyBuiltinRewrites(const ir::Graph& g) {
  // Compiled against the sources of the library's rules (their locations index them).
  static DiagEngine diags(builtinSources());
  static const dsl::MatcherTable table = [] {
    dsl::PatternLibrary rules;
    rules.patterns = builtinLibrary().rewrites;
    return dsl::compileMatcherTable(rules, builtinSources(), diags);
  }();
  return match::applyRewrites(g, table, builtinLibrary());
}

} // namespace fpat::testing
