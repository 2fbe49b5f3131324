#include "fpat/match/Match.h"

#include "fpat/match/Family.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

namespace fpat::match {

using namespace fpat::dsl;
using ir::Graph;
using ir::Vertex;

bool mergeTables(const MatcherTable& a, const MatcherTable& b, MatcherTable& out,
                 std::string& clash) {
  return mergeMatcherTables(a, b, out, clash);
}

namespace {

unsigned u16(const std::vector<uint8_t>& b, size_t at) {
  return unsigned(b[at]) | unsigned(b[at + 1]) << 8;
}

std::string familyRejects(const Graph& g, const Match& m, const PatternMeta& meta);

/// Interprets matcher byte code at one root. With `why`, the first failing check is described.
class Interpreter {
public:
  Interpreter(const Graph& g, const MatcherTable& t, const MatchOptions& opts,
              const std::vector<int>& claimedBy)
      : g_(g), t_(t), opts_(opts), claimedBy_(claimedBy) {}

  /// Runs bytes [pos, end) from `root`; on success fills `m`.
  bool run(const std::vector<uint8_t>& bytes, Vertex root, Match& m, std::string* why) {
    State s;
    s.cur = root_ = root;
    failPos_ = 0;
    failSpecific_ = specific_ = false;
    rootNeeds_.clear();
    return exec(bytes, 0, bytes.size(), s, m, why);
  }

  /// Where in the program the check that `why` describes stands: of a pattern's variants
  /// (one flat program each), the one that failed furthest in says why the pattern failed.
  size_t failPos() const { return failPos_; }
  /// Whether that failure was a near one (a constant of another value): between variants that
  /// failed at the same check, it says more.
  bool failSpecific() const { return failSpecific_; }
  /// Where the described failure was the root's own op: the op the pattern's root needs
  /// ("mul", "activation gelu"); else empty.
  const std::string& rootNeeds() const { return rootNeeds_; }

private:
  struct State {
    Vertex cur;
    std::vector<Vertex> stack;
    std::vector<Vertex> slots;
    std::vector<Vertex> oneUse; // checked once the whole match is known
  };

  std::string ref(Vertex v) const { return "%" + g_.op(v).name; }
  std::string what(Vertex v) const {
    const ir::Op& op = g_.op(v);
    return op.kind == ir::OpKind::Activation ? "activation " + op.fn : ir::opKindName(op.kind);
  }

  bool fail(std::string* why, std::string msg, std::string rootNeeds = "") {
    if (why && why->empty()) {
      rootNeeds_ = std::move(rootNeeds);
      *why = std::move(msg);
      failPos_ = pos_;
      failSpecific_ = specific_;
    }
    specific_ = false;
    return false;
  }

  bool exec(const std::vector<uint8_t>& b, size_t pos, size_t end, State s, Match& m,
            std::string* why) {
    while (pos < end) {
      pos_ = pos;
      const uint8_t opc = b[pos];
      switch (opc) {
      case OPC_Scope: {
        ++pos;
        while (size_t size = dsl::scopeSize(b, pos)) {
          pos += 4;
          if (exec(b, pos, pos + size, s, m, why))
            return true;
          pos += size;
        }
        return false;
      }
      case OPC_CheckKind: {
        auto k = static_cast<ir::OpKind>(b[pos + 1]);
        if (g_.op(s.cur).kind != k)
          return fail(
              why, ref(s.cur) + " is " + what(s.cur) + "; the pattern needs " + ir::opKindName(k),
              s.cur == root_ ? std::string(ir::opKindName(k)) : "");
        break;
      }
      case OPC_CheckActivation: {
        const std::string& fn = t_.strings.at(u16(b, pos + 1));
        const ir::Op& op = g_.op(s.cur);
        if (op.kind != ir::OpKind::Activation || op.fn != fn)
          return fail(why,
                      ref(s.cur) + " is " + what(s.cur) + "; the pattern needs activation " + fn,
                      s.cur == root_ ? "activation " + fn : "");
        break;
      }
      case OPC_Record:
        s.slots.push_back(s.cur);
        break;
      case OPC_MoveChild: {
        std::vector<Vertex> ops = g_.operands(s.cur);
        if (b[pos + 1] >= ops.size())
          return fail(why, ref(s.cur) + " has no operand " + std::to_string(b[pos + 1]));
        s.stack.push_back(s.cur);
        s.cur = ops[b[pos + 1]];
        break;
      }
      case OPC_MoveParent:
        s.cur = s.stack.back();
        s.stack.pop_back();
        break;
      case OPC_CheckSame: {
        Vertex other = s.slots.at(b[pos + 1]);
        if (other != s.cur)
          return fail(why, ref(s.cur) + " and " + ref(other) +
                               " are different values; the pattern needs the same one twice");
        break;
      }
      case OPC_CheckOneUse:
        s.oneUse.push_back(s.cur);
        break;
      case OPC_CheckDtype: {
        Vertex v = s.slots.at(b[pos + 1]);
        auto dt = static_cast<ir::DType>(b[pos + 2]);
        if (g_.op(v).type.dtype != dt)
          return fail(why, ref(v) + " is " + ir::dtypeName(g_.op(v).type.dtype) +
                               "; the pattern requires " + ir::dtypeName(dt));
        break;
      }
      case OPC_CheckDivisible: {
        Vertex v = s.slots.at(b[pos + 1]);
        int dim = b[pos + 2];
        int64_t k = 0;
        for (int i = 0; i < 4; ++i)
          k |= int64_t{b[pos + 3 + static_cast<size_t>(i)]} << (8 * i);
        const ir::TensorDesc& t = g_.op(v).type;
        if (dim >= t.rank() || t.shape[static_cast<size_t>(dim)] % k != 0)
          return fail(why, ref(v) + " has shape " + t.shapeStr() + "; the pattern requires dim " +
                               std::to_string(dim) + " divisible by " + std::to_string(k));
        break;
      }
      case OPC_CheckConstant: {
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k)
          bits |= uint64_t{b[pos + 1 + static_cast<size_t>(k)]} << (8 * k);
        double want;
        std::memcpy(&want, &bits, sizeof want);
        const ir::Op& op = g_.op(s.cur);
        // A constant of another value is a closer miss than an op that is no constant.
        specific_ = op.kind == ir::OpKind::Constant;
        if (op.kind != ir::OpKind::Constant || !constantMatches(op.value, want))
          return fail(why, ref(s.cur) + " is " +
                               (op.kind == ir::OpKind::Constant
                                    ? "the constant " + formatDouble(op.value)
                                    : what(s.cur)) +
                               "; the pattern needs the constant " + formatDouble(want));
        break;
      }
      case OPC_CheckRank: {
        Vertex v = s.slots.at(b[pos + 1]);
        const int rank = b[pos + 2];
        if (g_.op(v).type.rank() != rank)
          return fail(why, ref(v) + " has rank " + std::to_string(g_.op(v).type.rank()) +
                               "; the pattern requires rank " + std::to_string(rank));
        break;
      }
      case OPC_CheckWeight: {
        Vertex v = s.slots.at(b[pos + 1]);
        if (weights_.empty())
          weights_ = ir::weightOnly(g_);
        if (!weights_[v])
          return fail(why, ref(v) + " is " +
                               (g_.op(v).kind == ir::OpKind::Input
                                    ? std::string("an input given at run time")
                                    : "computed from values given at run time") +
                               "; the pattern needs a weight, or a value of weights alone");
        break;
      }
      case OPC_CheckLayout: {
        Vertex v = s.slots.at(b[pos + 1]);
        const bool nk = b[pos + 2] != 0;
        const ir::Op& op = g_.op(v);
        if (op.kind != ir::OpKind::Gemm || op.transposeB != nk)
          return fail(
              why, ref(v) +
                       (op.kind != ir::OpKind::Gemm
                            ? " is " + what(v) + ", not a gemm"
                            : std::string(" reads B as ") + (op.transposeB ? "[N, K]" : "[K, N]")) +
                       "; the pattern needs a gemm reading B as " + (nk ? "[N, K]" : "[K, N]"));
        break;
      }
      case OPC_CheckPairs: {
        Vertex v = s.slots.at(b[pos + 1]);
        const bool pairs = b[pos + 2] != 0;
        const ir::Op& op = g_.op(v);
        if (op.kind != ir::OpKind::Rope || op.interleaved != pairs)
          return fail(why,
                      ref(v) +
                          (op.kind != ir::OpKind::Rope
                               ? " is " + what(v) + ", not a rope"
                               : std::string(" rotates ") + (op.interleaved ? "pairs" : "halves")) +
                          "; the pattern needs a rope rotating " + (pairs ? "pairs" : "halves"));
        break;
      }
      case OPC_CheckHalf: {
        Vertex v = s.slots.at(b[pos + 1]);
        const int second = b[pos + 2];
        const ir::Op& op = g_.op(v);
        const std::vector<Vertex> ins = g_.operands(v);
        const int64_t n = ins.size() == 1 ? g_.op(ins[0]).type.shape.back() : 0;
        const bool ok = op.kind == ir::OpKind::Slice && n % 2 == 0 &&
                        op.begin == (second ? n / 2 : 0) && op.end == (second ? n : n / 2);
        if (!ok)
          return fail(why, ref(v) + " is " +
                               (op.kind == ir::OpKind::Slice
                                    ? "columns " + std::to_string(op.begin) + " to " +
                                          std::to_string(op.end) + " of " + std::to_string(n)
                                    : what(v)) +
                               "; the pattern needs the " + (second ? "second" : "first") +
                               " half of its operand's last dimension");
        break;
      }
      case OPC_Complete: {
        size_t p = u16(b, pos + 1);
        const PatternMeta& meta = t_.patterns.at(p);
        if (opts_.disabled.count(meta.name))
          return fail(why, "disabled by --disable-pattern");
        if (!opts_.only.empty() && !opts_.only.count(meta.name))
          return fail(why, "not selected by --only-pattern");
        // single_use: intermediates may be read several times, but only inside the match
        // (a DAG pattern such as (mul (relu $t), (relu $t)) reads one value twice).
        std::vector<Vertex> inside;
        for (size_t k = 0; k < s.slots.size(); ++k)
          if (meta.slots[k].role != SlotInfo::Input)
            inside.push_back(s.slots[k]);
        for (Vertex v : s.oneUse) {
          if (g_.isOutput(v))
            return fail(why, ref(v) + " is a graph output; the pattern requires that "
                                      "intermediates have no users outside the match");
          for (Vertex u : g_.users(v))
            if (std::find(inside.begin(), inside.end(), u) == inside.end())
              return fail(why, ref(v) + " is also used by " + ref(u) +
                                   ", outside the match; the pattern requires that "
                                   "intermediates have no users outside it");
        }
        for (size_t k = 0; k < s.slots.size(); ++k) {
          if (meta.slots[k].role == SlotInfo::Input)
            continue;
          if (int c = claimedBy_[s.slots[k]]; c >= 0)
            return fail(why, ref(s.slots[k]) + " is already fused (into the op at %" +
                                 g_.op(static_cast<Vertex>(c)).name + ")");
        }
        // What only the graph shows (see familyRejects): the next pattern is tried instead.
        const Match candidate{p, s.slots};
        if (std::string w = familyRejects(g_, candidate, meta); !w.empty())
          return fail(why, w + "; not fused");
        m.pattern = p;
        m.slots = s.slots;
        return true;
      }
      default:
        return fail(why, "corrupt matcher table (opcode " + std::to_string(opc) + ")");
      }
      pos += instructionLength(b, pos);
    }
    return false;
  }

  const Graph& g_;
  const MatcherTable& t_;
  const MatchOptions& opts_;
  const std::vector<int>& claimedBy_;
  std::vector<bool> weights_; // ir::weightOnly, once a pattern asks
  size_t pos_ = 0;            // the check being run (for failPos)
  size_t failPos_ = 0;        // where the first described failure stood
  bool specific_ = false, failSpecific_ = false;
  Vertex root_ = 0;
  std::string rootNeeds_;
};

/// Per-pattern programs, for --explain (the factored table answers only "which first").
std::vector<std::vector<std::vector<uint8_t>>> programsByPattern(const MatcherTable& t) {
  std::vector<std::vector<std::vector<uint8_t>>> out(t.patterns.size());
  for (auto& p : flattenPrograms(t))
    out[u16(p, p.size() - 2)].push_back(std::move(p));
  return out;
}

/// The kernel family's matcher part for a pattern's family (null: a pattern of no family).
const FamilyMatcher* matcherFor(const PatternMeta& meta) {
  const ir::KernelFamily* family = ir::findFamily(meta.family);
  return family ? &familyMatcher(family->family) : nullptr;
}

/// Why the pattern's kernel family cannot implement this match, or "": the family's own
/// conditions, then the epilogue's, which are every family's.
std::string familyRejects(const Graph& g, const Match& m, const PatternMeta& meta) {
  const FamilyMatcher* family = matcherFor(meta);
  if (!family)
    return "";
  if (std::string why = family->rejects(g, m, meta); !why.empty())
    return why;

  // The epilogue computes on [M, N] values and reads [M, N] or [N] operands; add and mul
  // broadcast more than that (scalars, [M, 1] columns, a result larger than the GEMM's).
  const ir::TensorDesc& out = g.op(m.slots[0]).type;
  const std::vector<int64_t> row{out.shape.back()};
  std::vector<Vertex> inside;
  for (size_t k = 0; k < m.slots.size(); ++k)
    if (meta.slots[k].role != SlotInfo::Input)
      inside.push_back(m.slots[k]);
  for (Vertex v : inside) {
    const ir::Op& op = g.op(v);
    const bool epilogue = op.kind == ir::OpKind::BiasAdd || op.kind == ir::OpKind::Add ||
                          op.kind == ir::OpKind::Mul || op.kind == ir::OpKind::Activation;
    if (!epilogue)
      continue;
    if (op.type != out)
      return "%" + op.name + " is " + op.type.str() + ", not the fused result's " + out.str();
    for (Vertex u : g.operands(v)) {
      if (std::find(inside.begin(), inside.end(), u) != inside.end())
        continue;
      // bias_add reads an [N] vector; add and mul read [M, N] tensors.
      const ir::TensorDesc& t = g.op(u).type;
      if (t.shape != out.shape && !(op.kind == ir::OpKind::BiasAdd && t.shape == row))
        return "the epilogue would read %" + g.op(u).name + " (" + t.str() + ") in " +
               ir::opKindName(op.kind) + ", a broadcast the fused kernels do not implement " +
               "(add and mul read " + out.shapeStr() + " operands, bias_add [" +
               std::to_string(row[0]) + "])";
    }
  }
  return "";
}

/// The fused op's epilogue: the matched subgraph above the GEMM, with the GEMM as the
/// accumulator and every value from outside the match as an operand.
struct EpilogueBuilder {
  const Graph& g;
  std::vector<Vertex> inside; // non-input slots of the match
  std::vector<Vertex> gemms;  // acc, and for the dual families acc2
  std::vector<Vertex> values; // what Operand nodes read, before numbering
  ir::Epilogue out;
  std::map<Vertex, int> done;

  /// The canonical epilogue, its operands numbered from `first` in order of first use and
  /// appended to `operands` (a value may be both a main operand and an epilogue one).
  ir::Epilogue finish(std::vector<Vertex>& operands) {
    ir::Epilogue e = ir::canonicalize(out);
    std::map<int, int> number;
    for (ir::EpilogueNode& n : e.nodes)
      if (n.kind == ir::EpiKind::Operand) {
        auto [it, fresh] = number.emplace(n.operand, static_cast<int>(operands.size()));
        if (fresh)
          operands.push_back(values[static_cast<size_t>(n.operand)]);
        n.operand = it->second;
      }
    return e;
  }

  int build(Vertex u) {
    if (auto it = done.find(u); it != done.end())
      return it->second;
    ir::EpilogueNode n;
    if (auto acc = std::find(gemms.begin(), gemms.end(), u); acc != gemms.end()) {
      n.kind = ir::EpiKind::Acc;
      n.operand = acc == gemms.begin() ? -1 : 1;
    } else if (std::find(inside.begin(), inside.end(), u) == inside.end()) {
      n.kind = ir::EpiKind::Operand;
      auto at = std::find(values.begin(), values.end(), u);
      n.operand = static_cast<int>(at - values.begin());
      if (at == values.end())
        values.push_back(u);
    } else {
      const ir::Op& op = g.op(u);
      const std::vector<Vertex> ins = g.operands(u);
      switch (op.kind) {
      case ir::OpKind::BiasAdd:
      case ir::OpKind::Add:
      case ir::OpKind::Mul:
        n.kind = op.kind == ir::OpKind::BiasAdd ? ir::EpiKind::BiasAdd
                 : op.kind == ir::OpKind::Add   ? ir::EpiKind::Add
                                                : ir::EpiKind::Mul;
        n.lhs = build(ins[0]);
        n.rhs = build(ins[1]);
        break;
      case ir::OpKind::Activation:
        n.kind = ir::EpiKind::Activation;
        n.fn = op.fn;
        n.params = op.params;
        n.lhs = build(ins[0]);
        break;
      default:
        throw std::logic_error("pattern matched " + std::string(ir::opKindName(op.kind)) + " %" +
                               op.name + " into an epilogue");
      }
    }
    return done[u] = out.add(std::move(n));
  }
};

} // namespace

MatchResult findMatches(const Graph& g, const MatcherTable& table, const MatchOptions& opts) {
  MatchResult r;
  auto order = ir::stableOrder(g);
  if (!order || table.bytes.empty())
    return r;
  // claimedBy[v]: root of the match that fused v, or -1.
  std::vector<int> claimedBy(g.size(), -1);
  Interpreter interp(g, table, opts, claimedBy);
  const bool byCost = static_cast<bool>(opts.cost);
  auto perPattern = opts.explain || byCost ? programsByPattern(table)
                                           : std::vector<std::vector<std::vector<uint8_t>>>{};
  for (auto it = order->rbegin(); it != order->rend(); ++it) {
    const Vertex root = *it;
    if (claimedBy[root] >= 0 || g.op(root).kind == ir::OpKind::Input)
      continue;
    Match m;
    bool found = interp.run(table.bytes, root, m, nullptr);
    if (opts.explain) {
      // Every pattern up to the chosen one, with the first check it failed.
      for (size_t p = 0; p < table.patterns.size(); ++p) {
        std::string why, rootNeeds;
        size_t furthest = 0;
        bool specific = false;
        double progress = 0;
        Match dummy;
        bool ok = false;
        for (const auto& prog : perPattern[p]) {
          std::string w;
          if (interp.run(prog, root, dummy, &w)) {
            ok = true;
            break;
          }
          if (why.empty() || interp.failPos() > furthest ||
              (interp.failPos() == furthest && interp.failSpecific() && !specific)) {
            why = w;
            furthest = interp.failPos();
            specific = interp.failSpecific();
            rootNeeds = interp.rootNeeds();
            progress = static_cast<double>(furthest) / static_cast<double>(prog.size());
          }
        }
        r.attempts.push_back({root, table.patterns[p].name, ok ? "" : why, ok ? 1.0 : progress,
                              ok ? "" : rootNeeds});
        if (found && p == m.pattern)
          break;
      }
    }
    if (!found)
      continue;
    if (byCost) { // every pattern that matches here is a candidate; nothing is claimed yet
      for (size_t p = 0; p < table.patterns.size(); ++p)
        for (const auto& prog : perPattern[p]) {
          Match c;
          if (interp.run(prog, root, c, nullptr)) {
            r.decisions.push_back({c, opts.cost(c), false, -1});
            break;
          }
        }
      continue;
    }
    const PatternMeta& meta = table.patterns[m.pattern];
    for (size_t k = 0; k < m.slots.size(); ++k)
      if (meta.slots[k].role != SlotInfo::Input)
        claimedBy[m.slots[k]] = static_cast<int>(root);
    r.matches.push_back(std::move(m));
  }
  if (byCost)
    for (size_t i : chooseByCost(table, r.decisions, &r.components, &r.largestComponent, &r.exact))
      r.matches.push_back(r.decisions[i].match);
  return r;
}

std::vector<size_t> chooseByCost(const MatcherTable& table, std::vector<Decision>& decisions,
                                 size_t* components, size_t* largest, bool* exact) {
  const size_t n = decisions.size();
  // The nodes each candidate fuses; candidates sharing one are in one group.
  std::vector<std::vector<Vertex>> nodes(n);
  std::vector<size_t> parent(n);
  std::map<Vertex, size_t> owner;
  auto find = [&](size_t i) {
    while (parent[i] != i)
      i = parent[i] = parent[parent[i]];
    return i;
  };
  for (size_t i = 0; i < n; ++i) {
    parent[i] = i;
    const Match& m = decisions[i].match;
    const PatternMeta& meta = table.patterns[m.pattern];
    for (size_t k = 0; k < m.slots.size(); ++k)
      if (meta.slots[k].role != SlotInfo::Input) {
        nodes[i].push_back(m.slots[k]);
        auto [it, fresh] = owner.emplace(m.slots[k], i);
        if (!fresh)
          parent[find(i)] = find(it->second);
      }
    std::sort(nodes[i].begin(), nodes[i].end());
    nodes[i].erase(std::unique(nodes[i].begin(), nodes[i].end()), nodes[i].end());
  }
  auto overlap = [&](size_t a, size_t b) {
    for (Vertex v : nodes[a])
      if (std::binary_search(nodes[b].begin(), nodes[b].end(), v))
        return true;
    return false;
  };
  std::map<size_t, std::vector<size_t>> groups; // by root of the union-find, in first order
  for (size_t i = 0; i < n; ++i)
    if (decisions[i].cost.saving() > 0) // one that saves nothing is never chosen
      groups[find(i)].push_back(i);
  std::vector<size_t> chosen;
  bool allExact = true;
  size_t big = 0;
  constexpr size_t kMaxSteps = 100000;
  constexpr size_t kMaxExactGroup = 64; // larger groups: greedy by saving (not seen in models)
  for (auto& entry : groups) {
    std::vector<size_t>& group = entry.second; // (not a structured binding: clang's lambdas)
    big = std::max(big, group.size());
    // Largest saving first (ties: the earlier candidate), so the first leaf is the greedy set.
    std::stable_sort(group.begin(), group.end(), [&](size_t a, size_t b) {
      return decisions[a].cost.saving() > decisions[b].cost.saving();
    });
    std::vector<double> rest(group.size() + 1, 0); // savings of group[i..]
    for (size_t i = group.size(); i-- > 0;)
      rest[i] = rest[i + 1] + decisions[group[i]].cost.saving();
    std::vector<size_t> pick, best;
    double bestSaving = -1;
    size_t steps = 0;
    std::function<void(size_t, double)> search = [&](size_t i, double saved) {
      if (++steps > kMaxSteps)
        return;
      if (saved + rest[i] <= bestSaving)
        return; // cannot beat the best found (ties keep the earlier, greedier set)
      if (i == group.size()) {
        bestSaving = saved;
        best = pick;
        return;
      }
      const size_t c = group[i];
      if (std::none_of(pick.begin(), pick.end(), [&](size_t p) { return overlap(p, c); })) {
        pick.push_back(c);
        search(i + 1, saved + decisions[c].cost.saving());
        pick.pop_back();
      }
      search(i + 1, saved);
    };
    if (group.size() <= kMaxExactGroup) {
      search(0, 0);
    } else { // greedy: each in order of saving that overlaps none taken
      for (size_t c : group)
        if (std::none_of(best.begin(), best.end(), [&](size_t p) { return overlap(p, c); }))
          best.push_back(c);
      steps = kMaxSteps + 1;
    }
    allExact = allExact && steps <= kMaxSteps;
    for (size_t c : best)
      decisions[c].chosen = true;
    for (size_t c : group)
      if (!decisions[c].chosen)
        for (size_t b : best)
          if (overlap(b, c)) {
            decisions[c].lostTo = static_cast<int>(b);
            break;
          }
    chosen.insert(chosen.end(), best.begin(), best.end());
  }
  std::sort(chosen.begin(), chosen.end());
  if (components)
    *components = groups.size();
  if (largest)
    *largest = big;
  if (exact)
    *exact = allExact;
  return chosen;
}

std::vector<Vertex> replacedNodes(const Graph& g, const MatcherTable& table, const Match& m) {
  const PatternMeta& meta = table.patterns[m.pattern];
  // Internal nodes whose every user is inside the match disappear; others stay (their value is
  // recomputed inside the fused op and still needed outside it).
  std::vector<Vertex> inside;
  for (size_t k = 0; k < m.slots.size(); ++k)
    if (meta.slots[k].role != SlotInfo::Input)
      inside.push_back(m.slots[k]);
  std::vector<Vertex> out{m.slots[0]};
  for (size_t k = 1; k < m.slots.size(); ++k) {
    const Vertex v = m.slots[k];
    if (meta.slots[k].role != SlotInfo::Internal || std::count(out.begin(), out.end(), v))
      continue;
    bool allInside = !g.isOutput(v);
    for (Vertex u : g.users(v))
      allInside = allInside && std::count(inside.begin(), inside.end(), u);
    if (allInside)
      out.push_back(v);
  }
  return out;
}

Graph fuseAlone(const Graph& g, const MatcherTable& table, const Match& m, Vertex& fused) {
  const PatternMeta& meta = table.patterns[m.pattern];
  std::set<Vertex> inside, inputs;
  for (size_t k = 0; k < m.slots.size(); ++k)
    (meta.slots[k].role == SlotInfo::Input ? inputs : inside).insert(m.slots[k]);
  Graph sub(g.name());
  std::map<Vertex, Vertex> map;
  // Operands before users: a depth-first walk from the root, stopping at the match's inputs.
  std::function<Vertex(Vertex)> copy = [&](Vertex v) -> Vertex {
    if (auto it = map.find(v); it != map.end())
      return it->second;
    Vertex out;
    if (!inside.count(v)) {
      ir::Op in;
      const ir::Op& op = g.op(v);
      in.name = op.name;
      in.type = op.type;
      in.loc = op.loc;
      if (op.kind == ir::OpKind::Input) { // weights stay weights (the kernel differs)
        in.weight = op.weight;
        in.data = op.data;
      }
      out = sub.addOp(std::move(in), {});
    } else {
      std::vector<Vertex> ops;
      for (Vertex u : g.operands(v))
        ops.push_back(copy(u));
      out = sub.addOp(g.op(v), ops);
    }
    map[v] = out;
    return out;
  };
  copy(m.slots[0]);
  sub.addOutput(map[m.slots[0]]);
  Match local{m.pattern, {}};
  for (Vertex v : m.slots)
    local.slots.push_back(map.at(v));
  Graph out = rewrite(sub, table, {local});
  fused = 0;
  for (Vertex v : out.vertices())
    if (out.op(v).kind == ir::OpKind::Fused)
      fused = v;
  return out;
}

Graph rewrite(const Graph& g, const MatcherTable& table, const std::vector<Match>& matches) {
  std::map<Vertex, const Match*> byRoot;
  std::vector<bool> removed(g.size(), false);
  for (const Match& m : matches) {
    byRoot[m.slots[0]] = &m;
    for (Vertex v : replacedNodes(g, table, m))
      removed[v] = v != m.slots[0];
  }
  Graph out(g.name());
  std::vector<Vertex> map(g.size());
  auto order = ir::stableOrder(g);
  if (!order)
    throw std::invalid_argument("rewrite: graph " + g.name() + " has a cycle");
  for (Vertex v : *order) {
    if (removed[v])
      continue;
    auto it = byRoot.find(v);
    if (it == byRoot.end()) {
      std::vector<Vertex> ops;
      for (Vertex u : g.operands(v))
        ops.push_back(map[u]);
      map[v] = out.addOp(g.op(v), ops);
      continue;
    }
    const Match& m = *it->second;
    const PatternMeta& meta = table.patterns[m.pattern];
    ir::Op f;
    f.kind = ir::OpKind::Fused;
    f.name = g.op(v).name;
    f.type = g.op(v).type;
    f.loc = g.op(v).loc;
    f.fused.pattern = meta.name;
    f.fused.family = meta.family;
    // Attributes of the matched GEMM and norm travel with the fused op; those of the
    // activations stay on their epilogue nodes.
    std::vector<Vertex> inside;
    for (size_t k = 0; k < m.slots.size(); ++k) {
      if (meta.slots[k].role == SlotInfo::Input)
        continue;
      inside.push_back(m.slots[k]);
      const ir::Op& op = g.op(m.slots[k]);
      if (op.kind == ir::OpKind::Gemm)
        f.transposeB = op.transposeB;
      if (op.kind == ir::OpKind::LayerNorm || op.kind == ir::OpKind::RmsNorm)
        f.eps = op.eps;
    }
    auto bound = [&](const std::string& binding) {
      for (size_t k = 0; k < m.slots.size(); ++k)
        if (meta.slots[k].role == SlotInfo::Input && meta.slots[k].binding == binding)
          return m.slots[k];
      throw std::logic_error("pattern " + meta.name + " has no input $" + binding);
    };
    // Operands in kernel order (see ir::FusedAttrs): the main computation's, then those the
    // epilogue reads, then any other input of the pattern.
    const FamilyMatcher* family = matcherFor(meta);
    std::vector<Vertex> kernelOrder;
    if (family)
      kernelOrder = family->mainOperands(g, m, meta, f.fused);
    if (!kernelOrder.empty()) {
      EpilogueBuilder eb{g, inside, family->accumulators(g, m, meta), {}, {}, {}};
      eb.build(v);
      f.fused.epilogue = eb.finish(kernelOrder);
      if (f.fused.epilogue.nodes.size() == 1) // the GEMM itself
        f.fused.epilogue.nodes.clear();
    }
    for (const std::string& input : meta.inputs) {
      Vertex u = bound(input);
      if (std::find(kernelOrder.begin(), kernelOrder.end(), u) == kernelOrder.end())
        kernelOrder.push_back(u);
    }
    std::vector<Vertex> ops;
    for (Vertex u : kernelOrder)
      ops.push_back(map[u]);
    map[v] = out.addOp(std::move(f), ops);
  }
  for (Vertex o : g.outputs())
    out.addOutput(map[o]);
  return out;
}

Graph lowerForArch(const Graph& g, int arch, size_t* count) {
  auto order = ir::stableOrder(g);
  if (!order)
    throw std::invalid_argument("lowerForArch: graph " + g.name() + " has a cycle");
  ir::FreshNames fresh(g);
  Graph out(g.name());
  std::vector<Vertex> map(g.size());
  size_t lowered = 0;
  for (Vertex v : *order) {
    const ir::Op& op = g.op(v);
    std::vector<Vertex> ins;
    for (Vertex u : g.operands(v))
      ins.push_back(map[u]);
    const ir::KernelFamily* family = op.kind == ir::OpKind::Fused ? ir::familyOf(op) : nullptr;
    std::optional<Vertex> replaced;
    if (family)
      replaced = familyMatcher(family->family).lowerFor(arch, op, ins, out, std::ref(fresh));
    lowered += replaced.has_value();
    map[v] = replaced ? *replaced : out.addOp(op, ins);
  }
  for (Vertex o : g.outputs())
    out.addOutput(map[o]);
  if (count)
    *count = lowered;
  return out;
}

Graph removeDeadOps(const Graph& g) {
  auto order = ir::stableOrder(g);
  if (!order)
    throw std::invalid_argument("removeDeadOps: graph " + g.name() + " has a cycle");
  std::vector<bool> live(g.size(), false);
  for (Vertex o : g.outputs())
    live[o] = true;
  for (auto it = order->rbegin(); it != order->rend(); ++it) {
    if (g.op(*it).kind == ir::OpKind::Input)
      live[*it] = true;
    if (live[*it])
      for (Vertex u : g.operands(*it))
        live[u] = true;
  }
  Graph out(g.name());
  std::vector<Vertex> map(g.size());
  for (Vertex v : *order) {
    if (!live[v])
      continue;
    std::vector<Vertex> ops;
    for (Vertex u : g.operands(v))
      ops.push_back(map[u]);
    map[v] = out.addOp(g.op(v), ops);
  }
  for (Vertex o : g.outputs())
    out.addOutput(map[o]);
  return out;
}

namespace {

/// A raise's result, checked against the graph before anything is rewritten.
struct RaisePlan {
  const Match* match;
  const PatternDef* def;
  std::map<std::string, Vertex> bound; // binding -> node of the graph
};

/// The value of a result attribute: a literal, or a bound scalar (rank 0 or one element)
/// constant. Empty when the bound value is no such constant.
std::optional<double> attrValue(const Graph& g, const MatchNode& a, const RaisePlan& p) {
  if (a.constant)
    return a.value;
  const ir::Op& op = g.op(p.bound.at(a.binding));
  if (op.kind != ir::OpKind::Constant || op.type.numel() != 1)
    return std::nullopt;
  return op.value;
}

/// Builds the ops of `n` (types inferred) into `out`, reading bound values through `map`.
/// Returns nullopt, with the reason, when the result does not type-check.
std::optional<Vertex> buildResult(const Graph& g, Graph& out, const std::vector<Vertex>& map,
                                  const MatchNode& n, const RaisePlan& p, const PatternLibrary& lib,
                                  const std::string& name, const ir::Op& root, int& counter,
                                  std::string& why) {
  if (n.leaf && n.constant) { // a number as an operand: a scalar constant
    ir::Op c;
    c.kind = ir::OpKind::Constant;
    c.value = n.value;
    c.type = ir::TensorDesc{{}, root.type.dtype};
    c.loc = root.loc;
    c.origin = root.origin;
    c.name = name;
    return out.addOp(std::move(c), {});
  }
  if (n.leaf)
    return map[p.bound.at(n.binding)];
  ir::Op op;
  op.kind = n.kind;
  op.fn = n.fn;
  op.loc = root.loc;
  op.origin = root.origin;
  op.name = name;
  std::vector<Vertex> ins;
  std::vector<ir::OperandInfo> infos;
  for (const MatchNode& c : n.operands) {
    auto v = buildResult(g, out, map, c, p, lib, name + ".r" + std::to_string(counter++), root,
                         counter, why);
    if (!v)
      return std::nullopt;
    ins.push_back(*v);
    infos.push_back({out.op(*v).name, out.op(*v).type});
  }
  std::vector<std::string> attrNames;
  if (n.kind == ir::OpKind::LayerNorm || n.kind == ir::OpKind::RmsNorm)
    attrNames = {"eps"};
  else if (n.kind == ir::OpKind::Gemm)
    attrNames = {"transpose_b"};
  else if (n.kind == ir::OpKind::Rope)
    attrNames = {"interleaved"};
  else if (const ActivationDef* a = lib.findActivation(n.fn))
    attrNames = a->paramNames;
  for (size_t i = 0; i < n.attrs.size() && i < attrNames.size(); ++i) {
    auto v = attrValue(g, n.attrs[i], p);
    if (!v) {
      why = "$" + n.attrs[i].binding + " (%" + g.op(p.bound.at(n.attrs[i].binding)).name +
            ") is not a scalar constant, so it cannot be the " + attrNames[i] + " of " +
            (n.kind == ir::OpKind::Activation ? n.fn : ir::opKindName(n.kind));
      return std::nullopt;
    }
    if (n.kind == ir::OpKind::Activation)
      op.params[attrNames[i]] = *v;
    else if (n.kind == ir::OpKind::Gemm)
      op.transposeB = *v != 0;
    else if (n.kind == ir::OpKind::Rope)
      op.interleaved = *v != 0;
    else
      op.eps = *v;
  }
  // Attention's ops take their layout (batch, head dim) from the matched root, which has it:
  // a template cannot spell it, and it is the same layout.
  if (n.kind == ir::OpKind::AttnQk || n.kind == ir::OpKind::AttnPv ||
      n.kind == ir::OpKind::Attention) {
    op.batch = root.batch;
    op.headDim = root.headDim;
  }
  ir::TypeError err;
  auto t = ir::inferType(op, infos, err, lib.activationSet());
  if (!t) {
    why = "the result does not type-check: " + err.message;
    return std::nullopt;
  }
  op.type = *t;
  // A binary op of scalar constants (a scale written (div 1.0, $s)) is folded: what the
  // result's consumers see is one constant, as the raised op's attribute would be.
  if (ir::isBinaryElementwise(op.kind) && op.type.numel() == 1 &&
      std::all_of(ins.begin(), ins.end(), [&](Vertex u) {
        return out.op(u).kind == ir::OpKind::Constant && out.op(u).type.numel() == 1;
      })) {
    const double x = out.op(ins[0]).value, y = out.op(ins[1]).value;
    ir::Op c;
    c.kind = ir::OpKind::Constant;
    c.value = ir::applyBinary(op.kind, x, y);
    c.type = op.type;
    c.loc = op.loc;
    c.origin = op.origin;
    c.name = op.name;
    if (std::isfinite(c.value))
      return out.addOp(std::move(c), {});
  }
  return out.addOp(std::move(op), ins);
}

/// One pass of raising (or of rewriting: `rules` are the library's raises or its rewrites);
/// false when nothing was rewritten.
bool raiseOnce(Graph& g, const MatcherTable& table, const std::vector<PatternDef>& rules,
               const PatternLibrary& lib, std::vector<RaiseStep>* steps) {
  MatchResult mr = findMatches(g, table);
  if (mr.matches.empty())
    return false;
  // Dry run: each match's result must type-check on its own (in a scratch graph holding the
  // bound values as inputs of their types).
  std::vector<RaisePlan> plans;
  for (const Match& m : mr.matches) {
    const PatternMeta& meta = table.patterns[m.pattern];
    auto def = std::find_if(rules.begin(), rules.end(),
                            [&](const PatternDef& d) { return d.name == meta.name; });
    if (def == rules.end())
      throw std::logic_error("raise table names '" + meta.name + "', which the library lacks");
    RaisePlan p{&m, &*def, {}};
    for (size_t k = 0; k < m.slots.size(); ++k)
      if (!meta.slots[k].binding.empty())
        p.bound[meta.slots[k].binding] = m.slots[k];
    Graph scratch;
    std::vector<Vertex> map(g.size());
    for (auto& [b, v] : p.bound) {
      ir::Op in;
      in.kind = ir::OpKind::Input;
      in.name = g.op(v).name;
      in.type = g.op(v).type;
      map[v] = scratch.addOp(in, {});
    }
    int counter = 0;
    std::string why;
    auto r = buildResult(g, scratch, map, def->result, p, lib, g.op(m.slots[0]).name,
                         g.op(m.slots[0]), counter, why);
    if (r && scratch.op(*r).type == g.op(m.slots[0]).type)
      plans.push_back(std::move(p));
  }
  if (plans.empty())
    return false;
  std::map<Vertex, const RaisePlan*> byRoot;
  std::vector<bool> removed(g.size(), false);
  for (const RaisePlan& p : plans) {
    byRoot[p.match->slots[0]] = &p;
    const PatternMeta& meta = table.patterns[p.match->pattern];
    for (size_t k = 1; k < p.match->slots.size(); ++k)
      if (meta.slots[k].role == SlotInfo::Internal)
        removed[p.match->slots[k]] = true; // single-use: nothing outside reads them
  }
  Graph out(g.name());
  std::vector<Vertex> map(g.size());
  const std::vector<Vertex> order = *ir::stableOrder(g); // (a temporary would dangle)
  for (Vertex v : order) {
    if (removed[v])
      continue;
    auto it = byRoot.find(v);
    if (it == byRoot.end()) {
      std::vector<Vertex> ops;
      for (Vertex u : g.operands(v))
        ops.push_back(map[u]);
      map[v] = out.addOp(g.op(v), ops);
      continue;
    }
    const RaisePlan& p = *it->second;
    int counter = 0;
    std::string why;
    auto r = buildResult(g, out, map, p.def->result, p, lib, g.op(v).name, g.op(v), counter, why);
    if (!r)
      throw std::logic_error("raise " + p.def->name + " at %" + g.op(v).name + ": " + why);
    map[v] = *r;
    if (steps) {
      size_t ops = 0;
      const PatternMeta& meta = table.patterns[p.match->pattern];
      std::set<Vertex> distinct;
      for (size_t k = 0; k < p.match->slots.size(); ++k)
        if (meta.slots[k].role != SlotInfo::Input)
          distinct.insert(p.match->slots[k]);
      ops = distinct.size();
      steps->push_back({p.def->name, g.op(v).name, ops});
    }
  }
  for (Vertex o : g.outputs())
    out.addOutput(map[o]);
  g = removeDeadOps(out);
  return true;
}

Graph raiseWith(const Graph& g, const MatcherTable& table, const std::vector<PatternDef>& rules,
                const PatternLibrary& lib, std::vector<RaiseStep>* steps, const char* kind,
                const char* doing) {
  Graph cur = g;
  // Each pass rewrites every match it selects; a result may complete a larger decomposition
  // above it, hence the passes. Rules that shrink what they match end in a few; rules that
  // rewrite their own results (relu -> neg(neg(relu))) never would, and a run must not go on
  // with a graph half raised: that is an error naming the rules still rewriting.
  constexpr int kPasses = 16;
  for (int pass = 0; pass < kPasses; ++pass)
    if (!raiseOnce(cur, table, rules, lib, steps))
      return cur;
  std::vector<RaiseStep> more;
  Graph probe = cur;
  if (!raiseOnce(probe, table, rules, lib, &more))
    return cur;
  std::map<std::string, std::string> still; // rule -> where it rewrote
  for (const RaiseStep& st : more)
    still.emplace(st.pattern, st.root);
  std::string msg = std::string(doing) + " did not finish in " + std::to_string(kPasses) +
                    " passes; still rewriting:";
  for (const auto& rule : still) {
    const std::string& name = rule.first; // (clang: no structured binding in the lambda)
    auto meta = std::find_if(table.patterns.begin(), table.patterns.end(),
                             [&](const PatternMeta& m) { return m.name == name; });
    msg += " '" + name + "' (" + meta->file + ":" + std::to_string(meta->line) + ", at %" +
           rule.second + ")";
  }
  throw RaiseError(msg + "; a " + kind + " rule's result must not be matched again by it, or by " +
                   "rules that lead back to it");
}

} // namespace

Graph raise(const Graph& g, const MatcherTable& table, const PatternLibrary& lib,
            std::vector<RaiseStep>* steps) {
  return raiseWith(g, table, lib.raises, lib, steps, "Raise", "raising");
}

Graph applyRewrites(const Graph& g, const MatcherTable& table, const PatternLibrary& lib,
                    std::vector<RaiseStep>* steps) {
  return raiseWith(g, table, lib.rewrites, lib, steps, "Rewrite", "rewriting");
}

std::vector<Attempt> raiseNearMisses(const Graph& raised, const MatcherTable& table) {
  MatchOptions o;
  o.explain = true;
  // Each rule's closest attempt anywhere in the graph, where it got past the root's kind:
  // at most one line per rule, the closest first.
  std::map<std::string, Attempt> best;
  for (Attempt& a : findMatches(raised, table, o).attempts) {
    if (a.failure.empty() || a.progress <= 0)
      continue;
    auto it = best.find(a.pattern);
    if (it == best.end() || a.progress > it->second.progress)
      best[a.pattern] = std::move(a);
  }
  std::vector<Attempt> near;
  for (auto& [name, a] : best)
    near.push_back(std::move(a));
  std::stable_sort(near.begin(), near.end(),
                   [](const Attempt& x, const Attempt& y) { return x.progress > y.progress; });
  return near;
}

std::string explain(const Graph& g, const MatcherTable& table, const MatchResult& r) {
  std::ostringstream os;
  // Per root, the patterns that got past its op one per line; those whose root is another op
  // in one line, counted by the op they need (with dozens of patterns, most are these).
  for (size_t i = 0; i < r.attempts.size();) {
    const Vertex root = r.attempts[i].root;
    os << "  at %" << g.op(root).name << " (" << ir::opKindName(g.op(root).kind)
       << (g.op(root).kind == ir::OpKind::Activation ? " " + g.op(root).fn : "") << "):\n";
    std::vector<std::pair<std::string, int>> others;
    size_t otherCount = 0;
    for (; i < r.attempts.size() && r.attempts[i].root == root; ++i) {
      const Attempt& a = r.attempts[i];
      if (a.rootNeeds.empty()) {
        os << "    " << a.pattern << ": " << (a.failure.empty() ? "matched" : a.failure) << "\n";
        continue;
      }
      auto it = std::find_if(others.begin(), others.end(),
                             [&](const auto& o) { return o.first == a.rootNeeds; });
      if (it == others.end())
        others.emplace_back(a.rootNeeds, 1);
      else
        ++it->second;
      ++otherCount;
    }
    if (otherCount > 0) {
      os << "    " << otherCount << " pattern" << (otherCount == 1 ? " needs" : "s need")
         << " another op at the root:";
      for (size_t k = 0; k < others.size(); ++k)
        os << (k ? "," : "") << " " << others[k].first << " (" << others[k].second << ")";
      os << "\n";
    }
  }
  if (!r.decisions.empty() || r.components > 0) {
    auto ms = [](double t) { // three significant digits or more
      std::ostringstream o;
      o.setf(std::ios::fixed);
      o.precision(std::abs(t) < 0.01 ? 5 : std::abs(t) < 1 ? 4 : 3);
      o << t << " ms";
      return o.str();
    };
    os << "cost-based choice" << (r.costModel.empty() ? "" : " (" + r.costModel + ")") << ": "
       << r.decisions.size() << " candidate" << (r.decisions.size() == 1 ? "" : "s") << " in "
       << r.components << " group" << (r.components == 1 ? "" : "s")
       << " of overlapping ones (largest " << r.largestComponent << "), "
       << (r.exact ? "each chosen exactly" : "some chosen greedily (too many to search)") << "\n";
    for (const Decision& d : r.decisions) {
      const PatternMeta& meta = table.patterns[d.match.pattern];
      const double saving = d.cost.saving();
      os << "  " << meta.name << " at %" << g.op(d.match.slots[0]).name << ": fused "
         << ms(d.cost.fused) << (saving > 0 ? " < " : " >= ") << "unfused " << ms(d.cost.parts)
         << " (" << d.cost.detail << "): ";
      if (d.chosen)
        os << "chosen, saves " << ms(saving);
      else if (saving <= 0)
        os << "not fused, it would cost " << ms(-saving) << " more";
      else if (d.lostTo >= 0) {
        const Decision& w = r.decisions[static_cast<size_t>(d.lostTo)];
        os << "saves " << ms(saving) << ", but overlaps " << table.patterns[w.match.pattern].name
           << " at %" << g.op(w.match.slots[0]).name << ", which was chosen";
      } else
        os << "saves " << ms(saving) << ", not chosen: the set chosen saves more";
      os << "\n";
    }
  }
  os << "chosen fusions (" << r.matches.size() << "):\n";
  for (const Match& m : r.matches) {
    const PatternMeta& meta = table.patterns[m.pattern];
    os << "  " << meta.name << " at %" << g.op(m.slots[0]).name << " (" << meta.file << ":"
       << meta.line << ", benefit " << meta.benefit << "): fuses";
    for (size_t k = 0; k < m.slots.size(); ++k)
      if (meta.slots[k].role != SlotInfo::Input &&
          std::find(m.slots.begin(), m.slots.begin() + k, m.slots[k]) == m.slots.begin() + k)
        os << " %" << g.op(m.slots[k]).name; // a shared node (a DAG pattern's) once
    os << "; inputs";
    for (size_t k = 0; k < m.slots.size(); ++k)
      if (meta.slots[k].role == SlotInfo::Input)
        os << " $" << meta.slots[k].binding << "=%" << g.op(m.slots[k]).name;
    os << "\n";
  }
  return os.str();
}

} // namespace fpat::match
