// GEMMs that read one activation, each with its own weight, merged into one GEMM whose
// results are column views (ir::isColumnView): Llama's, Mistral's and Qwen2's q, k and v
// projections become one projection, as GPT-2's c_attn is.
#include "fpat/match/Match.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>

namespace fpat::match {

using ir::Graph;
using ir::Op;
using ir::OpKind;
using ir::Vertex;

namespace {

bool isWeight(const Op& op) {
  return op.kind == OpKind::Input && op.weight;
}

/// One GEMM of a group: the GEMM, the bias_add after it (if any) and what it computes.
struct Member {
  Vertex gemm = 0, result = 0;
  std::optional<Vertex> biasAdd;
  Vertex b = 0;               // the weight
  std::optional<Vertex> bias; // the bias_add's bias
  int64_t n = 0;              // result columns
};

/// The member `u` (a user of `a`) makes, or nullopt: a GEMM on `a` and a weight of its own,
/// perhaps followed by a bias_add of a bias weight that only it reads, whose result attention
/// and rope alone read, in place (ir::readInPlace), in columns of a multiple of 8.
std::optional<Member> memberOf(const Graph& g, Vertex a, Vertex u, bool ropeEpilogues) {
  const Op& op = g.op(u);
  const std::vector<Vertex> ins = g.operands(u);
  if (op.kind != OpKind::Gemm || ins.size() != 2 || ins[0] != a || ins[1] == a ||
      !isWeight(g.op(ins[1])) || g.op(ins[1]).type.rank() != 2)
    return std::nullopt;
  Member m{u, u, std::nullopt, ins[1], std::nullopt, op.type.shape.back()};
  const std::vector<Vertex> users = g.users(u);
  if (g.useCount(u) == 1 && !g.isOutput(u) && g.op(users[0]).kind == OpKind::BiasAdd) {
    const std::vector<Vertex> bin = g.operands(users[0]);
    if (bin.size() == 2 && bin[0] == u && isWeight(g.op(bin[1])) && g.op(bin[1]).type.rank() == 1) {
      m.biasAdd = users[0];
      m.bias = bin[1];
      m.result = users[0];
    }
  }
  if (m.n % 8 != 0 || g.op(m.result).type.rank() != 2 ||
      !ir::readInPlace(g, m.result, ropeEpilogues))
    return std::nullopt;
  return m;
}

/// A group's weights (or biases) side by side: one weight holding their values where every
/// one has values, else concat ops (computed once, with the weights) where they are [K, N]
/// or biases; nullopt where neither can be made ([N, K] weights given at run time).
struct Joined {
  std::optional<Op> weight; // values joined here
  bool byConcat = false;
};

Joined canJoin(const Graph& g, const std::vector<Vertex>& parts, bool rowsOfN) {
  Joined j;
  bool values = true;
  for (Vertex p : parts)
    values = values && g.op(p).data != nullptr;
  if (!values) {
    j.byConcat = !rowsOfN;
    return j;
  }
  const Op& first = g.op(parts[0]);
  Op w = first;
  auto data = std::make_shared<std::vector<float>>();
  const int64_t rank = first.type.rank();
  int64_t total = 0;
  for (Vertex p : parts)
    total += rowsOfN ? g.op(p).type.shape[0] : g.op(p).type.shape.back();
  if (rank == 1 || rowsOfN) { // biases, and [N, K] weights: one after the other
    for (Vertex p : parts)
      data->insert(data->end(), g.op(p).data->begin(), g.op(p).data->end());
    w.type.shape[0] = total;
  } else { // [K, N] weights: row k of each in turn
    const int64_t k = first.type.shape[0];
    data->reserve(static_cast<size_t>(k * total));
    for (int64_t r = 0; r < k; ++r)
      for (Vertex p : parts) {
        const int64_t n = g.op(p).type.shape[1];
        const auto row = g.op(p).data->begin() + r * n;
        data->insert(data->end(), row, row + n);
      }
    w.type.shape[1] = total;
  }
  w.data = std::move(data);
  w.origin.clear();
  j.weight = std::move(w);
  return j;
}

} // namespace

Graph mergeSharedGemms(const Graph& g, std::vector<GemmMerge>* merged, bool ropeEpilogues) {
  auto order = ir::stableOrder(g);
  if (!order)
    throw std::invalid_argument("mergeSharedGemms: graph " + g.name() + " has a cycle");
  // Groups: per activation, its members of one layout (B [K, N] or [N, K]) and one form (with
  // a bias or without), in vertex order; two or more make a group.
  std::vector<std::vector<Member>> groups;
  for (Vertex a : *order) {
    std::map<std::pair<bool, bool>, std::vector<Member>> byForm;
    for (Vertex u : g.users(a))
      if (std::optional<Member> m = memberOf(g, a, u, ropeEpilogues))
        byForm[{g.op(u).transposeB, m->bias.has_value()}].push_back(*m);
    for (auto& [form, members] : byForm)
      if (members.size() >= 2)
        groups.push_back(std::move(members));
  }
  if (groups.empty())
    return g;

  ir::FreshNames fresh(g);

  struct Plan {
    std::vector<Member> members;
    std::vector<Vertex> bs, biases; // the members' weights and biases, in order
    Joined weight, bias;
  };
  std::vector<Plan> plans;
  std::map<Vertex, size_t> groupOfResult; // member results (and GEMMs) -> plan
  std::set<Vertex> absorbed;              // member GEMMs and bias_adds: not copied
  for (std::vector<Member>& members : groups) {
    Plan p{members, {}, {}, {}, {}};
    const bool rowsOfN = g.op(members[0].gemm).transposeB;
    for (const Member& m : members) {
      p.bs.push_back(m.b);
      if (m.bias)
        p.biases.push_back(*m.bias);
    }
    p.weight = canJoin(g, p.bs, rowsOfN);
    if (!p.weight.weight && !p.weight.byConcat)
      continue;
    if (!p.biases.empty()) {
      p.bias = canJoin(g, p.biases, false);
      if (!p.bias.weight && !p.bias.byConcat)
        continue;
    }
    for (const Member& m : members) {
      groupOfResult[m.result] = plans.size();
      absorbed.insert(m.gemm);
      if (m.biasAdd)
        absorbed.insert(*m.biasAdd);
    }
    plans.push_back(std::move(p));
  }
  if (plans.empty())
    return g;
  // Weights whose values went into a joined weight and that nothing else reads are dropped.
  std::set<Vertex> dropped;
  for (const Plan& p : plans)
    for (const Joined* j : {&p.weight, &p.bias})
      if (j->weight)
        for (const Member& m : p.members) {
          const Vertex w = j == &p.weight ? m.b : *m.bias;
          bool other = g.isOutput(w);
          for (Vertex u : g.users(w))
            other = other || !absorbed.count(u);
          if (!other)
            dropped.insert(w);
        }

  Graph out(g.name());
  std::vector<std::optional<Vertex>> map(g.size());
  std::vector<bool> planDone(plans.size(), false);
  // An operand's copy; a weight read first by a merged op is added where it is read.
  auto operand = [&](Vertex u) {
    if (!map[u]) {
      if (g.op(u).kind != OpKind::Input)
        throw std::logic_error("mergeSharedGemms: %" + g.op(u).name + " read before it is made");
      map[u] = out.addOp(g.op(u), {});
    }
    return *map[u];
  };
  auto copy = [&](Vertex v) {
    std::vector<Vertex> ins;
    for (Vertex u : g.operands(v))
      ins.push_back(operand(u));
    return out.addOp(g.op(v), ins);
  };
  // Weights (or biases) side by side in `out`: the joined weight, or a chain of concat ops.
  auto join = [&](const Joined& j, const std::vector<Vertex>& parts) -> Vertex {
    if (j.weight) {
      Op w = *j.weight;
      w.name = fresh(g.op(parts[0]).name + ".merged");
      return out.addOp(w, {});
    }
    Vertex acc = operand(parts[0]);
    for (size_t i = 1; i < parts.size(); ++i) {
      Op c;
      c.kind = OpKind::Concat;
      c.name = fresh(g.op(parts[0]).name + ".merged");
      c.type = out.op(acc).type;
      c.type.shape.back() += g.op(parts[i]).type.shape.back();
      acc = out.addOp(c, {acc, operand(parts[i])});
    }
    return acc;
  };
  auto emitPlan = [&](size_t i) {
    const Plan& p = plans[i];
    const Member& first = p.members[0];
    int64_t total = 0;
    for (const Member& m : p.members)
      total += m.n;
    const Vertex a = g.operands(first.gemm)[0];
    Op gemm = g.op(first.gemm);
    gemm.name = fresh(g.op(first.result).name + ".merged");
    gemm.type.shape.back() = total;
    Vertex r = out.addOp(gemm, {operand(a), join(p.weight, p.bs)});
    if (!p.biases.empty()) {
      Op add = g.op(*first.biasAdd);
      add.name = fresh(g.op(first.result).name + ".merged_bias");
      add.type.shape.back() = total;
      r = out.addOp(add, {r, join(p.bias, p.biases)});
    }
    int64_t at = 0;
    GemmMerge record;
    record.input = g.op(a).name;
    for (const Member& m : p.members) {
      Op s = g.op(m.result); // keeps the result's name, type and origin
      s.kind = OpKind::Slice;
      s.begin = at;
      s.end = at + m.n;
      s.fn.clear();
      s.transposeB = false;
      at += m.n;
      map[m.result] = out.addOp(s, {r});
      record.results.push_back(g.op(m.result).name);
    }
    if (merged)
      merged->push_back(std::move(record));
    planDone[i] = true;
  };
  for (Vertex v : *order) {
    if (absorbed.count(v) || dropped.count(v) || map[v])
      continue;
    for (Vertex u : g.operands(v))
      if (auto it = groupOfResult.find(u); it != groupOfResult.end() && !planDone[it->second])
        emitPlan(it->second);
    map[v] = copy(v);
  }
  for (size_t i = 0; i < plans.size(); ++i) // results only outputs read (none: readInPlace)
    if (!planDone[i])
      emitPlan(i);
  for (Vertex o : g.outputs())
    out.addOutput(*map[o]);
  return out;
}

namespace {

/// The weight vertex feeding `v` (a gemm, or a bias_add of one) if it holds values and only that
/// op reads it.
std::optional<Vertex> ownWeight(const Graph& g, Vertex v, size_t operand) {
  const Vertex w = g.operands(v).at(operand);
  const Op& op = g.op(w);
  if (!isWeight(op) || !op.data || g.useCount(w) != 1)
    return std::nullopt;
  return w;
}

} // namespace

Graph reorderHeadParts(const Graph& g, std::vector<PartsReorder>* done, bool ropeEpilogues) {
  Graph out = g;
  ir::FreshNames fresh(g);
  bool any = false;
  for (Vertex h : g.vertices()) {
    const Op& hop = g.op(h);
    if (hop.kind != OpKind::Heads || g.isOutput(h) || hop.type.rank() != 4 ||
        (ropeEpilogues && ir::ropedAndRejoined(g, h).has_value()))
      continue;
    const Vertex x = g.operands(h).at(0);
    const int64_t B = hop.batch, H = hop.type.shape[2], D = hop.type.shape[3];
    // Every reader a slice of one part, all parts of one width d.
    const std::vector<Vertex> slices = g.users(h);
    int64_t d = 0;
    bool ok =
        !slices.empty() && g.useCount(h) == slices.size() && g.useCount(x) == 1 && !g.isOutput(x);
    for (Vertex s : slices) {
      const Op& so = g.op(s);
      const int64_t w = so.end - so.begin;
      ok = ok && so.kind == OpKind::Slice && (d == 0 || w == d) && so.begin % w == 0;
      d = w;
    }
    if (!ok || d <= 0 || D % d != 0 || D / d < 2)
      continue;
    const int64_t P = D / d;
    // x = gemm(a, W) or bias_add(gemm(a, W), b), each weight with values and read only there.
    std::vector<std::pair<Vertex, bool>> weights; // weight, [N, K]
    Vertex gemm = x;
    if (g.op(x).kind == OpKind::BiasAdd) {
      const std::optional<Vertex> b = ownWeight(g, x, 1);
      gemm = g.operands(x).at(0);
      if (!b || g.useCount(gemm) != 1)
        continue;
      weights.push_back({*b, false});
    }
    if (g.op(gemm).kind != OpKind::Gemm)
      continue;
    const std::optional<Vertex> w = ownWeight(g, gemm, 1);
    if (!w)
      continue;
    weights.push_back({*w, g.op(gemm).transposeB});
    for (auto [wv, rowsOfN] : weights) {
      Op& op = out.op(wv);
      op.data =
          std::make_shared<std::vector<float>>(ir::headPartsToColumns(*op.data, H, P, d, rowsOfN));
      // No longer the model's tensor: a file of --inputs named after it must not replace it.
      op.name = fresh(op.name + ".parts");
      op.origin += ", columns reordered to (part, head, d)";
    }
    // Part p's slice of the heads becomes the heads of columns p H d .. (p + 1) H d.
    for (Vertex s : slices) {
      const int64_t p = g.op(s).begin / d;
      Op cols;
      cols.kind = OpKind::Slice;
      cols.name = fresh(g.op(s).name + ".columns");
      cols.begin = p * H * d;
      cols.end = (p + 1) * H * d;
      cols.type = {{g.op(x).type.shape[0], H * d}, g.op(x).type.dtype};
      cols.origin = g.op(s).origin;
      const Vertex c = out.addOp(cols, {x});
      Op& view = out.op(s);
      view.kind = OpKind::Heads;
      view.batch = B;
      view.headDim = d;
      view.begin = view.end = 0;
      boost::remove_edge(h, s, out.impl());
      out.connect(c, s, 0);
    }
    any = true;
    if (done)
      done->push_back({g.op(x).name, P});
  }
  return any ? removeDeadOps(out) : g;
}

} // namespace fpat::match
