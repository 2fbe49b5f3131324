// Fusion at scale: matching and rewriting synthetic graphs of stacked transformer MLP blocks,
// to show that fusion time grows linearly with graph size. Prints a markdown table.
//   fpat-bench-fusion [max_blocks]
#include "fpat/cost/Cost.h"
#include "fpat/ir/Builder.h"
#include "fpat/match/Match.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace fpat;
using Clock = std::chrono::steady_clock;

namespace {

/// `blocks` pre-norm MLP blocks: layernorm -> gemm+bias+gelu -> gemm+bias+residual, then an
/// RMSNorm -> gemm -> SiLU tail: 19 ops per block (8 of them inputs).
ir::Graph stackedMlp(int blocks) {
  ir::GraphBuilder b("stacked_mlp");
  const int64_t m = 64, d = 64, h = 256;
  ir::Value x = b.input("x", {m, d});
  for (int i = 0; i < blocks; ++i) {
    std::string s = std::to_string(i);
    ir::Value lg = b.input("ln_g" + s, {d}), lb = b.input("ln_b" + s, {d});
    ir::Value w1 = b.input("w1_" + s, {d, h}), b1 = b.input("b1_" + s, {h});
    ir::Value w2 = b.input("w2_" + s, {h, d}), b2 = b.input("b2_" + s, {d});
    ir::Value n = b.layernorm(x, lg, lb, 1e-5, "n" + s);
    ir::Value a =
        b.activation(b.bias(b.gemm(n, w1, false, "h" + s), b1, "hb" + s), "gelu", "a" + s);
    x = b.add(b.bias(b.gemm(a, w2, false, "d" + s), b2, "db" + s), x, "y" + s);
    ir::Value rg = b.input("rms_g" + s, {d}), w3 = b.input("w3_" + s, {d, d});
    ir::Value r = b.rmsnorm(x, rg, 1e-6, "r" + s);
    ir::Value o = b.gemm(r, w3, false, "o" + s);
    x = b.add(b.activation(o, "silu", "z" + s), x, "t" + s);
  }
  b.output(x);
  return b.build();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  int maxBlocks = argc > 1 ? std::atoi(argv[1]) : 1024;
  std::printf("| blocks | ops | matches | match ms | rewrite ms | total ms | ms per 1000 ops | "
              "by cost: candidates | by cost ms | ms per 1000 ops |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int blocks = 16; blocks <= maxBlocks; blocks *= 4) {
    ir::Graph g = stackedMlp(blocks);
    std::vector<double> tm, tr;
    size_t matches = 0;
    for (int rep = 0; rep < 5; ++rep) {
      auto t0 = Clock::now();
      match::MatchResult r = match::findMatches(g, match::builtinTable());
      auto t1 = Clock::now();
      ir::Graph f = match::rewrite(g, match::builtinTable(), r.matches);
      auto t2 = Clock::now();
      if (!ir::validate(f).empty()) {
        std::fprintf(stderr, "fused graph is invalid\n");
        return 1;
      }
      matches = r.matches.size();
      tm.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      tr.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    double total = median(tm) + median(tr);
    // The choice by cost (fpatc's default): every match a candidate, each estimated.
    std::vector<double> tc;
    size_t candidates = 0;
    match::MatchOptions o;
    o.cost = [&](const match::Match& m) {
      return cost::candidateCost(g, match::builtinTable(), m, cost::calibrationFor(90), 90);
    };
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = Clock::now();
      match::MatchResult r = match::findMatches(g, match::builtinTable(), o);
      tc.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      candidates = r.decisions.size();
    }
    std::printf("| %d | %zu | %zu | %.2f | %.2f | %.2f | %.3f | %zu | %.2f | %.3f |\n", blocks,
                g.size(), matches, median(tm), median(tr), total,
                total / static_cast<double>(g.size()) * 1000.0, candidates, median(tc),
                median(tc) / static_cast<double>(g.size()) * 1000.0);
  }
  return 0;
}
