// libFuzzer target over raising and fusion: the input bytes describe a random valid graph
// (GEMMs, biases, activations, adds, muls, norms, broadcasting sub/div/pow/mul with vectors,
// columns and scalar constants, reduce_mean, and exporter-style decompositions of GeLU, SiLU
// and RMSNorm; values used once or many times, several outputs, small shapes); the built-in
// Raise patterns raise it and the fusion patterns fuse it, and the result evaluated on the CPU
// (fused-op semantics) must agree with the graph as built, as `fpatc` checks for every run.
#include "fpat/cost/Cost.h"
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
#include <set>
#include <string>
#include <vector>

namespace {

// The built-in patterns' sources: the library and the raise table are compiled against them.
fpat::SourceManager sm;
fpat::DiagEngine diags(sm);

const fpat::dsl::PatternLibrary& library() {
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
  static const char* const acts[] = {"gelu",       "gelu_erf", "silu", "relu",
                                     "leaky_relu", "sigmoid",  "tanh", "erf"};
  auto constant = [&](double v) { return b.constant(v, {}, ir::DType::F32); };
  std::vector<std::pair<std::string, double>> slopes;
  std::set<ir::Vertex> centred; // values whose row mean is zero up to rounding
  const unsigned ops = 1 + in.next(12);
  for (unsigned i = 0; i < ops; ++i) {
    // Mostly the latest value (chains that fuse), sometimes an earlier one (multi-use).
    ir::Value x = in.next(4) ? vals.back() : vals[in.next(static_cast<unsigned>(vals.size()))];
    const std::vector<int64_t> s = b.type(x).shape;
    if (s.size() != 2)
      continue;
    const int64_t cols = s[1];
    ir::Value y;
    switch (in.next(12)) {
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
      const char* fn = acts[in.next(8)];
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
    case 6:
      y = b.rmsnorm(x, fresh({cols}), 1e-6);
      break;
    case 7: { // a broadcasting op with a row vector, a column, a scalar or a [1, N] row
      // The row mean of a centred value is rounding noise, which no tolerance can compare
      // (found: mean(mean(x) - x) * ... disagreeing by 200%): centred values are not reduced.
      unsigned form = in.next(4);
      if (form == 1 && centred.count(x.v))
        form = 2;
      ir::Value other = form == 0   ? fresh({cols})
                        : form == 1 ? b.reduceMean(x)
                        : form == 2 ? constant(0.25 * (1 + in.next(8)))
                                    : fresh({1, cols});
      const unsigned op = in.next(4);
      const bool swap = in.next(2);
      ir::Value l = swap ? other : x, r = swap ? x : other;
      // Division only by values both graphs hold exactly (inputs, constants): a computed
      // denominator near zero would turn one rounding more or less into any difference.
      if (op == 3 && form != 1)
        y = b.div(x, other);
      else
        y = op == 0 ? b.sub(l, r) : op == 2 ? b.add(l, r) : b.mul(l, r);
      // Centred: x - mean(x) (either way round), or a centred value scaled per row.
      if ((op == 0 && form == 1) ||
          (centred.count(x.v) && (op == 1 || op == 3) && (form == 1 || form == 2)))
        centred.insert(y.v);
      break;
    }
    case 8: // x * x through pow, and centring (x - mean(x))
      if (in.next(2) || centred.count(x.v)) {
        y = b.pow(x, constant(2.0));
      } else {
        y = b.sub(x, b.reduceMean(x));
        centred.insert(y.v);
      }
      break;
    case 9: { // GeLU as torch.onnx.export writes it, tanh or erf form
      if (in.next(2)) {
        ir::Value cube = b.mul(x, b.mul(x, x));
        ir::Value inner = b.add(x, b.mul(constant(0.044715), cube));
        ir::Value t = b.activation(b.mul(constant(0.7978846), inner), "tanh");
        y = b.mul(constant(0.5), b.mul(x, b.add(constant(1.0), t)));
      } else {
        ir::Value e = b.activation(b.div(x, constant(1.4142135)), "erf");
        y = b.mul(b.mul(x, b.add(e, constant(1.0))), constant(0.5));
      }
      break;
    }
    case 10: // SiLU as x * sigmoid(x)
      y = b.mul(x, b.activation(x, "sigmoid"));
      break;
    default: { // RMSNorm as Hugging Face writes it
      ir::Value ms = b.reduceMean(b.pow(x, constant(2.0)));
      ir::Value inv = b.div(constant(1.0), b.activation(b.add(ms, constant(1e-6)), "sqrt"));
      y = b.mul(fresh({cols}), b.mul(x, inv));
      break;
    }
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

  static const dsl::MatcherTable raises = [] {
    dsl::PatternLibrary r;
    r.patterns = library().raises;
    return dsl::compileMatcherTable(r, sm, diags);
  }();
  std::vector<match::RaiseStep> steps;
  const ir::Graph raised = match::raise(g, raises, library(), &steps);
  if (auto problems = ir::validate(raised, library().activationSet()); !problems.empty()) {
    std::fprintf(stderr, "raising made an invalid graph: %s\n%s", problems[0].c_str(),
                 ir::printGraph(g).c_str());
    std::abort();
  }
  const dsl::MatcherTable& table = match::builtinTable();
  // Greedy, or by cost with the model's estimates shifted by the input so that declines,
  // overlaps lost and exact searches are all reached.
  match::MatchOptions mo;
  const unsigned salt = in.next(8);
  if (salt > 0)
    mo.cost = [&](const match::Match& m) {
      const int arch = salt % 2 ? 90 : 80;
      match::CandidateCost c =
          cost::candidateCost(raised, table, m, cost::calibrationFor(arch), arch);
      c.parts += (static_cast<double>((m.slots[0] * 7 + m.pattern + salt) % 5) - 2.0) * 1e-3;
      return c;
    };
  const match::MatchResult chosen = match::findMatches(raised, table, mo);
  ir::Graph fused = match::rewrite(raised, table, chosen.matches);
  if (auto problems = ir::validate(fused, library().activationSet()); !problems.empty()) {
    std::fprintf(stderr, "fusion made an invalid graph: %s\n%s", problems[0].c_str(),
                 ir::printGraph(raised).c_str());
    std::abort();
  }
  const auto inputsV = ir::randomInputs(g, size);
  const auto want = ir::evaluate(g, inputsV, library().referenceActivations());
  // An intermediate that overflows (x^64 squared, say) makes the graph as built and its raised
  // form legitimately different: a raised rmsnorm computes its mean of squares in double where
  // the decomposition's f32 pow overflowed. Such raised graphs are not compared.
  for (ir::Vertex v : steps.empty() ? std::vector<ir::Vertex>{} : g.vertices())
    for (float e : want[v].data)
      if (!std::isfinite(e))
        return 0;
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
      // Raised graphs: values both below 1e-6 (inputs are O(1)) count as equal. The
      // decomposed tanh GeLU computes 1 + tanh(u) as exactly 0 below u = -9 where the raised
      // x * sigmoid(2u) keeps e.g. -1e-11; an output of nothing but such values has no scale.
      if (!steps.empty() && std::fabs(w.data[e]) < 1e-6 && std::fabs(o.data[e]) < 1e-6)
        continue;
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
