// libFuzzer target over fusion: the input bytes describe a random valid graph (GEMMs, biases,
// activations, adds, muls, norms, values used once or many times, several outputs, small
// shapes); the built-in patterns fuse it, and the fused graph evaluated on the CPU (fused-op
// semantics) must agree with the unfused graph, as `fpatc` checks for every run.
#include "fpat/dsl/Library.h"
#include "fpat/dsl/Matcher.h"
#include "fpat/ir/Builder.h"
#include "fpat/ir/Reference.h"
#include "fpat/ir/text/Text.h"
#include "fpat/match/Match.h"
#include "fpat/runtime/Pipeline.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

const fpat::dsl::PatternLibrary& library() {
  static fpat::SourceManager sm;
  static fpat::DiagEngine diags(sm);
  static const fpat::dsl::PatternLibrary lib = [] {
    const std::string path = std::string(FPAT_FUZZ_PATTERNS_DIR) + "/all.fpat";
    std::string text;
    fpat::readFile(path, text);
    auto c = fpat::dsl::compileFpat(sm.addBuffer(path, text), sm, diags, {});
    if (!c)
      std::abort();
    return c->library;
  }();
  return lib;
}

/// Reads the fuzzer's bytes as small choices; zeros once they run out.
struct Bytes {
  const uint8_t* p;
  size_t n;
  unsigned next(unsigned range) { return n ? (--n, *p++ % range) : 0; }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fpat;
  Bytes in{data, size};
  static const int64_t dims[] = {1, 3, 8, 16};
  const int64_t m = dims[in.next(4)];
  ir::GraphBuilder b("fuzz", library().activationSet());
  // f32 tensors: fusion must preserve the computation, and in f16 chains of ill-conditioned
  // ops (cubes, LayerNorm over 3 columns, GEMMs after it) amplify the one rounding a fused op
  // saves past any fixed tolerance (seen: 1.05e-2). In f32 that difference is 2^13 smaller.
  std::vector<ir::Value> vals = {b.input("x", {m, dims[1 + in.next(3)]}, ir::DType::F32)};
  int inputs = 0;
  auto fresh = [&](std::vector<int64_t> shape) {
    return b.input("i" + std::to_string(inputs++), std::move(shape), ir::DType::F32);
  };
  static const char* const acts[] = {"gelu", "gelu_erf", "silu", "relu", "leaky_relu"};
  std::vector<std::pair<std::string, double>> slopes;
  const unsigned ops = 1 + in.next(12);
  for (unsigned i = 0; i < ops; ++i) {
    // Mostly the latest value (chains that fuse), sometimes an earlier one (multi-use).
    ir::Value x = in.next(4) ? vals.back() : vals[in.next(static_cast<unsigned>(vals.size()))];
    const std::vector<int64_t> s = b.type(x).shape;
    if (s.size() != 2)
      continue;
    const int64_t cols = s[1];
    ir::Value y;
    switch (in.next(7)) {
    case 0: {
      const int64_t n = dims[1 + in.next(3)];
      const bool t = in.next(2);
      y = b.gemm(x, fresh(t ? std::vector<int64_t>{n, cols} : std::vector<int64_t>{cols, n}), t);
      break;
    }
    case 1:
      y = b.bias(x, fresh({cols}));
      break;
    case 2: {
      const char* fn = acts[in.next(5)];
      const std::string name = "a" + std::to_string(i);
      y = b.activation(x, fn, name);
      if (std::string(fn) == "leaky_relu") // a parameter, which fusion must carry along
        slopes.push_back({name, 0.01 * (1 + in.next(50))});
      break;
    }
    case 3:
    case 4: {
      ir::Value other = fresh(s);
      for (ir::Value v : vals)
        if (b.type(v).shape == s && in.next(2))
          other = v;
      y = in.next(2) ? b.add(x, other) : b.add(other, x);
      if (in.next(3) == 0)
        y = b.mul(x, other);
      break;
    }
    case 5:
      y = b.layernorm(x, fresh({cols}), fresh({cols}), 1e-5);
      break;
    default:
      y = b.rmsnorm(x, fresh({cols}), 1e-6);
      break;
    }
    vals.push_back(y);
  }
  b.output(vals.back());
  for (size_t i = 1; i + 1 < vals.size(); ++i)
    if (in.next(5) == 0)
      b.output(vals[i]);
  ir::Graph g = b.build();
  for (const auto& [name, slope] : slopes)
    g.op(*g.find(name)).params["slope"] = slope;

  const dsl::MatcherTable& table = match::builtinTable();
  ir::Graph fused = match::rewrite(g, table, match::findMatches(g, table).matches);
  if (!ir::validate(fused, library().activationSet()).empty())
    std::abort(); // fusion made an invalid graph
  const auto inputsV = ir::randomInputs(g, size);
  const auto want = ir::evaluate(g, inputsV, library().referenceActivations());
  const auto got = ir::evaluate(fused, inputsV, library().referenceActivations());
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    // Random chains may overflow f16 (x^32 after five squarings): where the unfused graph is
    // not finite the fused one must not be either; the finite elements must agree.
    const ir::Tensor& w = want[g.outputs()[i]];
    const ir::Tensor& o = got[fused.outputs()[i]];
    ir::Tensor wf{w.desc, {}}, of{o.desc, {}};
    size_t classMismatch = 0;
    for (size_t e = 0; e < w.data.size(); ++e) {
      if (!std::isfinite(w.data[e])) {
        classMismatch += std::isfinite(o.data[e]) ? 1 : 0;
        continue;
      }
      wf.data.push_back(w.data[e]);
      of.data.push_back(o.data[e]);
    }
    runtime::Agreement a = runtime::compareToReference(of, wf);
    if (!a.pass || classMismatch) {
      std::fprintf(stderr,
                   "fused and unfused graphs disagree on output %zu: max rel err %g, %zu "
                   "non-finite, %zu finite where the unfused graph is not\n%s%s",
                   i, a.maxRel, a.nonFinite, classMismatch, ir::printGraph(g).c_str(),
                   ir::printGraph(fused).c_str());
      std::abort();
    }
  }
  return 0;
}
