// Rotary embeddings taken into the epilogue of the projection that computes their x: the
// projection's kernel rotates its q and k columns in registers (ir::EpiKind::Rope, on column
// pairs), and the rope kernels, which read and wrote q and k once more, are gone.
#include "fpat/ir/Family.h"
#include "fpat/match/Match.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>

namespace fpat::match {

using ir::Graph;
using ir::Op;
using ir::OpKind;
using ir::Vertex;

namespace {

/// A rope whose x is heads of columns [begin, end) of a GEMM-family op's result (seen through
/// views), or the first d columns of each such head, put back beside the rest of each head by a
/// concat (partial rotary: GPT-NeoX, Phi-2, GPT-J).
struct Candidate {
  Vertex rope = 0, gemm = 0;
  Vertex result = 0; // what its readers read: the rope, or the concat
  Vertex top = 0;    // the view of the columns they read instead once the epilogue rotates them
  Vertex reader = 0; // the op that reads the projection: the slice, or the lowest view
  std::optional<Vertex> slice; // the columns (none: the whole result)
  int64_t begin = 0, end = 0, batch = 0, seq = 0;
  int64_t d = 0;       // columns of a head that rotate (the tables' width)
  int64_t head = 0;    // columns of a head
  bool halves = false; // rotate_half: the columns must become pairs
};

bool isWeightWithValues(const Op& op) {
  return op.kind == OpKind::Input && op.weight && op.data;
}

/// A GEMM-family op whose epilogue can take a rope: a plain gemm, or a fused gemm / norm_gemm
/// (the dual families' epilogue combines two accumulators first).
bool takesRope(const Graph& g, Vertex v) {
  const Op& op = g.op(v);
  const ir::KernelFamily* f = ir::familyOf(op);
  return f && (f->family == ir::Family::Gemm || f->family == ir::Family::NormGemm) &&
         !g.isOutput(v) && op.type.rank() == 2;
}

/// The one reader of `v`, or nullopt (several, none, or an output).
std::optional<Vertex> onlyReader(const Graph& g, Vertex v) {
  if (g.useCount(v) != 1 || g.isOutput(v))
    return std::nullopt;
  return g.users(v).front();
}

/// The candidate rope `r` makes, or nullopt with the reason in `why` (empty where `r` is no
/// rope).
std::optional<Candidate> candidateOf(const Graph& g, Vertex r, std::string& why) {
  const Op& op = g.op(r);
  if (op.kind != OpKind::Rope)
    return std::nullopt;
  auto no = [&](std::string reason) -> std::optional<Candidate> {
    why = std::move(reason);
    return std::nullopt;
  };
  if (g.isOutput(r))
    return no("it is a graph output");
  const std::vector<Vertex> ins = g.operands(r);
  Candidate c;
  c.rope = c.result = r;
  c.top = ins.at(0);
  c.halves = !op.interleaved;
  if (g.op(c.top).kind == OpKind::Slice) {
    // concat(rope(x[..., :d]), x[..., d:]) of a head view x.
    const Vertex part = c.top;
    c.top = g.operands(part).at(0);
    const std::optional<Vertex> cat = onlyReader(g, r);
    if (!cat || g.op(*cat).kind != OpKind::Concat || g.isOutput(*cat) || onlyReader(g, part) != r ||
        g.op(part).begin != 0 || g.useCount(c.top) != 2 || g.isOutput(c.top))
      return no("it rotates part of each head, and its result is not put back beside the rest "
                "of the head by a concat alone");
    const std::vector<Vertex> catIns = g.operands(*cat);
    const Vertex rest = catIns.at(1);
    if (catIns.at(0) != r || g.op(rest).kind != OpKind::Slice || g.operands(rest).at(0) != c.top ||
        onlyReader(g, rest) != *cat || g.op(rest).begin != g.op(part).end ||
        g.op(rest).end != g.op(c.top).type.shape.back() || g.op(*cat).type != g.op(c.top).type)
      return no("its concat %" + g.op(*cat).name +
                " is not the rope's result beside the rest of "
                "each head");
    c.result = *cat;
  } else if (g.useCount(c.top) != 1 || g.isOutput(c.top)) {
    return no("its x %" + g.op(c.top).name + " is read by other ops too");
  }
  const Op& x = g.op(c.top);
  if (!ir::isView(x.kind) || x.type.rank() != 4)
    return no("its x %" + x.name + " is no view of a projection's columns as heads");
  c.batch = x.type.shape[0];
  c.seq = x.type.shape[1];
  c.head = x.type.shape[3];
  c.d = op.type.shape.back();
  // Down the views to the matrix they show, each read by the next alone.
  c.reader = c.top;
  Vertex cols = g.operands(c.top).at(0);
  while (ir::isView(g.op(cols).kind)) {
    if (!onlyReader(g, cols))
      return no("the view %" + g.op(cols).name + " under its x is read by other ops too");
    c.reader = cols;
    cols = g.operands(cols).at(0);
  }
  const std::vector<int64_t>& m = g.op(cols).type.shape;
  if (m.size() != 2 || m[0] != c.batch * c.seq || m[1] != x.type.shape[2] * c.head)
    return no("its x is no view of the token rows of %" + g.op(cols).name);
  if (g.op(cols).kind == OpKind::Slice) {
    if (!onlyReader(g, cols))
      return no("the columns %" + g.op(cols).name + " are read by other ops too");
    c.slice = c.reader = cols;
    c.begin = g.op(cols).begin;
    c.end = g.op(cols).end;
    cols = g.operands(cols).at(0);
  } else {
    c.end = m[1];
  }
  c.gemm = cols;
  if (!takesRope(g, c.gemm)) {
    const Op& p = g.op(cols);
    const std::string what = g.isOutput(cols)          ? "a graph output"
                             : p.kind == OpKind::Input ? std::string("an input")
                             : p.kind == OpKind::Fused ? "a fused " + p.fused.family + " op"
                                                       : "a " + std::string(ir::opKindName(p.kind));
    return no("%" + p.name + ", whose columns it rotates, is " + what +
              ", not a gemm or a fused gemm / norm_gemm op");
  }
  if (c.begin % 2 != 0 || c.d % 2 != 0 || c.head % 2 != 0)
    return no("its columns do not start at an even column or make even heads");
  // Tables: weights with values, the same for every head (the kernel reads them by row and
  // column within the head).
  for (size_t i = 1; i < 3; ++i) {
    const Op& t = g.op(ins[i]);
    if (!isWeightWithValues(t) || t.type.rank() > 4)
      return no("its table %" + t.name + " is no weight with values (computed at run time)");
    std::vector<int64_t> s = t.type.shape;
    s.insert(s.begin(), 4 - s.size(), 1);
    if (s[2] != 1 && x.type.shape[2] != 1)
      return no("its table %" + t.name + " differs between heads");
  }
  return c;
}

/// Table `t` (broadcast over x's [B, S, H, d]; the same for every head) at batch b, position s,
/// column j of a head.
float tableAt(const Op& t, int64_t b, int64_t s, int64_t j) {
  std::vector<int64_t> sh = t.type.shape;
  sh.insert(sh.begin(), 4 - sh.size(), 1);
  const int64_t at[4] = {b, s, 0, j};
  int64_t i = 0;
  for (size_t k = 0; k < 4; ++k)
    i = i * sh[k] + (sh[k] == 1 ? 0 : at[k]);
  return (*t.data)[static_cast<size_t>(i)];
}

/// Whether a table varies with the batch (else one row per position serves every batch).
bool perBatch(const Op& t) {
  return t.type.rank() == 4 && t.type.shape[0] != 1;
}

/// Head column j of the pairs layout holds column from(j) of the halves layout: pair i is
/// (i, i + d / 2).
int64_t fromHalves(int64_t j, int64_t d) {
  return j % 2 == 0 ? j / 2 : j / 2 + d / 2;
}

/// Reorders, in each head of each candidate's columns, its first d columns of a [K, N] weight
/// (rows of an [N, K] one, `rowsOfN`; the elements of an [N] vector) from halves to pairs.
std::shared_ptr<std::vector<float>> toPairs(const Op& w, int64_t n,
                                            const std::vector<const Candidate*>& cs, bool rowsOfN) {
  const std::vector<float>& old = *w.data;
  auto out = std::make_shared<std::vector<float>>(old);
  const int64_t run = rowsOfN ? static_cast<int64_t>(old.size()) / n : 1;
  const int64_t lines = rowsOfN ? 1 : static_cast<int64_t>(old.size()) / n;
  for (int64_t r = 0; r < lines; ++r)
    for (const Candidate* c : cs)
      for (int64_t col = c->begin; col < c->end; ++col) {
        const int64_t j = (col - c->begin) % c->head;
        if (j >= c->d)
          continue;
        const int64_t from = col - j + fromHalves(j, c->d);
        std::copy_n(old.begin() + static_cast<long>((r * n + from) * run), run,
                    out->begin() + static_cast<long>((r * n + col) * run));
      }
  return out;
}

/// The attention ops (or attn_qk) that read `v` through views, with the operand they read it
/// as; nullopt where anything else reads it.
std::optional<std::vector<std::pair<Vertex, size_t>>> attentionReaders(const Graph& g, Vertex v) {
  std::vector<std::pair<Vertex, size_t>> out;
  if (g.isOutput(v))
    return std::nullopt;
  for (Vertex u : g.users(v)) {
    const Op& op = g.op(u);
    if (ir::isView(op.kind)) {
      auto more = attentionReaders(g, u);
      if (!more)
        return std::nullopt;
      out.insert(out.end(), more->begin(), more->end());
      continue;
    }
    if (op.kind != OpKind::Attention && op.kind != OpKind::AttnQk)
      return std::nullopt;
    const std::vector<Vertex> ins = g.operands(u);
    for (size_t i = 0; i < ins.size(); ++i)
      if (ins[i] == v) {
        if (i > 1)
          return std::nullopt; // as v, or a bias
        out.push_back({u, i});
      }
  }
  return out;
}

/// Whether `v` (through views) is appended to a key or value cache.
bool appendedToCache(const Graph& g, Vertex v) {
  for (Vertex u : g.users(v))
    if (g.op(u).kind == OpKind::KvAppend || (ir::isView(g.op(u).kind) && appendedToCache(g, u)))
      return true;
  return false;
}

/// What attention operand `i` of `a` is, through views.
Vertex behindViews(const Graph& g, Vertex a, size_t i) {
  Vertex v = g.operands(a).at(i);
  while (ir::isView(g.op(v).kind))
    v = g.operands(v).at(0);
  return v;
}

/// `mod` (`g` changed in place, new ops added after g's) without its dead ops and the weights
/// that lost their last reader, each new op just before its first reader, the rest in g's
/// order.
Graph rebuild(const Graph& mod, const Graph& g) {
  std::vector<bool> live(mod.size(), false);
  for (Vertex o : mod.outputs())
    live[o] = true;
  const std::optional<std::vector<Vertex>> order = ir::topologicalOrder(mod);
  for (auto it = order->rbegin(); it != order->rend(); ++it) {
    const Vertex v = *it;
    const Op& op = mod.op(v);
    if (op.kind == OpKind::Input && !(v < g.size() && g.useCount(v) > 0 && op.weight))
      live[v] = true; // inputs stay, and weights no one read
    if (live[v])
      for (Vertex u : mod.operands(v))
        live[u] = true;
  }
  Graph out(g.name());
  std::vector<std::optional<Vertex>> map(mod.size());
  std::function<Vertex(Vertex)> emit = [&](Vertex v) {
    if (map[v])
      return *map[v];
    std::vector<Vertex> ins;
    for (Vertex u : mod.operands(v))
      ins.push_back(emit(u));
    return *(map[v] = out.addOp(mod.op(v), ins));
  };
  for (Vertex v = 0; v < g.size(); ++v)
    if (live[v])
      emit(v);
  for (Vertex o : mod.outputs())
    out.addOutput(*map[o]);
  return out;
}

} // namespace

Graph ropeIntoEpilogues(const Graph& g, std::vector<RopeFusion>* done,
                        std::vector<RopeKept>* kept) {
  std::map<Vertex, Candidate> cands; // by rope
  std::map<Vertex, std::string> why; // ropes kept apart, by rope
  for (Vertex v : g.vertices()) {
    std::string reason;
    if (std::optional<Candidate> c = candidateOf(g, v, reason))
      cands[v] = *c;
    else if (!reason.empty())
      why[v] = reason;
  }
  auto report = [&] {
    if (kept)
      for (const auto& [r, reason] : why)
        kept->push_back({g.op(r).name, reason});
  };
  if (cands.empty()) {
    report();
    return g;
  }
  // Per projection: its other readers must not read the rotated columns, and where columns
  // are reordered, its weight, its [N] epilogue operands and nothing [M, N] must go with them.
  auto projectionProblem = [&](Vertex p, const std::vector<const Candidate*>& cs) -> std::string {
    const Op& op = g.op(p);
    const std::vector<Vertex> ins = g.operands(p);
    for (Vertex u : g.users(p)) {
      if (std::any_of(cs.begin(), cs.end(), [&](const Candidate* c) { return c->reader == u; }))
        continue;
      const Op& uo = g.op(u);
      if (uo.kind != OpKind::Slice)
        return "%" + uo.name + " reads all of the projection %" + op.name;
      for (const Candidate* c : cs)
        if (uo.begin < c->end && c->begin < uo.end)
          return "%" + uo.name + " also reads the rotated columns of %" + op.name;
    }
    if (std::none_of(cs.begin(), cs.end(), [](const Candidate* c) { return c->halves; }))
      return "";
    const size_t b = op.kind == OpKind::Fused ? ir::gemmBIndex(op) : 1;
    if (!isWeightWithValues(g.op(ins.at(b))))
      return "rotate_half reorders the weight's columns, and %" + g.op(ins.at(b)).name +
             " has no values (given at run time)";
    for (size_t i = b + 1; i < ins.size(); ++i)
      if (g.op(ins[i]).type.rank() != 1 || !isWeightWithValues(g.op(ins[i])))
        return "rotate_half reorders %" + op.name + "'s columns, and its epilogue reads %" +
               g.op(ins[i]).name + ", no vector with values";
    return "";
  };
  // Reordered columns change q and k alike only where attention reads both from such ropes of
  // one head size: drop the others until none is left to drop.
  for (bool changed = true; changed;) {
    changed = false;
    std::map<Vertex, std::vector<const Candidate*>> byProjection;
    for (const auto& [r, c] : cands)
      byProjection[c.gemm].push_back(&c);
    std::set<Vertex> drop;
    for (const auto& [p, cs] : byProjection)
      if (std::string problem = projectionProblem(p, cs); !problem.empty())
        for (const Candidate* c : cs) {
          drop.insert(c->rope);
          why[c->rope] = problem;
        }
    std::map<Vertex, const Candidate*> byResult;
    for (const auto& [r, c] : cands)
      byResult[c.result] = &c;
    for (const auto& [r, c] : cands) {
      if (!c.halves || drop.count(r))
        continue;
      auto readers = attentionReaders(g, c.result);
      bool ok = readers && !readers->empty();
      for (size_t k = 0; ok && k < readers->size(); ++k) {
        const auto [a, i] = (*readers)[k];
        auto it = byResult.find(behindViews(g, a, 1 - i));
        ok = it != byResult.end() && it->second->halves && it->second->d == c.d &&
             it->second->head == c.head && g.op(a).headDim == c.head;
      }
      if (!ok) {
        drop.insert(r);
        const bool cached =
            appendedToCache(g, c.result) ||
            (readers && std::any_of(readers->begin(), readers->end(), [&](const auto& ai) {
               return g.op(behindViews(g, ai.first, 1 - ai.second)).kind == OpKind::KvAppend;
             }));
        why[r] = cached ? "the keys go to a key/value cache (kv_append), which holds them in the "
                          "model's column order: rotate_half's columns cannot become pairs"
                        : "rotate_half's columns become pairs only where attention reads both q "
                          "and k from such ropes (of one head size), and nothing else reads them";
      }
    }
    for (Vertex r : drop)
      changed = cands.erase(r) > 0 || changed;
  }
  report();
  if (cands.empty())
    return g;

  Graph out = g;
  ir::FreshNames fresh(g);
  std::map<Vertex, std::vector<const Candidate*>> byProjection;
  for (const auto& [r, c] : cands)
    byProjection[c.gemm].push_back(&c);
  // Prepared tables [R, d] (pairs order where `halves`), shared by ropes of the same tables.
  std::map<std::tuple<Vertex, bool, int64_t>, Vertex> tables;
  auto prepared = [&](const Candidate& c, size_t which) {
    const Vertex t = g.operands(c.rope).at(which);
    const Op& to = g.op(t);
    const bool batches = perBatch(to) && c.batch > 1;
    const int64_t rows = batches ? c.batch * c.seq : c.seq;
    const auto key = std::make_tuple(t, c.halves, rows);
    if (auto it = tables.find(key); it != tables.end())
      return it->second;
    Op w = to;
    w.name = fresh(to.name + ".rope");
    w.type = {{rows, c.d}, to.type.dtype};
    w.origin += c.halves ? ", as rows of positions, each head's columns in pairs order"
                         : ", as rows of positions";
    auto data = std::make_shared<std::vector<float>>(static_cast<size_t>(rows * c.d));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < c.d; ++j)
        (*data)[static_cast<size_t>(r * c.d + j)] =
            tableAt(to, r / c.seq, r % c.seq, c.halves ? fromHalves(j, c.d) : j);
    w.data = std::move(data);
    return tables[key] = out.addOp(w, {});
  };
  for (auto& entry : byProjection) {
    const Vertex p = entry.first; // a name of its own: the lambdas below capture it
    std::vector<const Candidate*>& cs = entry.second;
    std::sort(cs.begin(), cs.end(),
              [](const Candidate* a, const Candidate* b) { return a->begin < b->begin; });
    Op& op = out.op(p);
    const int64_t n = op.type.shape.back();
    std::vector<Vertex> ins = g.operands(p);
    RopeFusion record;
    record.projection = op.name;
    // Columns from halves to pairs: the weight's, and the [N] epilogue operands'.
    std::vector<const Candidate*> halves;
    for (const Candidate* c : cs)
      if (c->halves)
        halves.push_back(c);
    auto replaceOperand = [&](size_t i, Vertex to) {
      boost::remove_edge(ins[i], p, out.impl());
      out.connect(to, p, static_cast<unsigned>(i));
      ins[i] = to;
    };
    if (!halves.empty()) {
      const size_t b = op.kind == OpKind::Fused ? ir::gemmBIndex(op) : 1;
      for (size_t i = b; i < ins.size(); ++i) {
        Op w = g.op(ins[i]);
        w.data = toPairs(w, n, halves, i == b && op.transposeB);
        w.name = fresh(w.name + ".pairs");
        w.origin += ", each rotated head's columns in pairs order";
        replaceOperand(i, out.addOp(w, {}));
      }
      record.pairs = true;
    }
    if (op.kind == OpKind::Gemm) { // a plain gemm becomes gemm with the rope epilogue
      op.kind = OpKind::Fused;
      op.fused.family = "gemm";
      op.fused.pattern = "gemm";
    }
    op.fused.pattern += "_rope";
    ir::Epilogue& e = op.fused.epilogue;
    int last = e.identity() ? e.add(ir::EpilogueNode{}) : static_cast<int>(e.nodes.size()) - 1;
    for (size_t k = 0; k < cs.size(); ++k) {
      const Candidate& c = *cs[k];
      const Vertex cosT = prepared(c, 1), sinT = prepared(c, 2);
      ir::EpilogueNode& prev = e.nodes[static_cast<size_t>(last)];
      // q's and k's ropes side by side on the same tables: one range.
      const std::map<std::string, double> params =
          c.head == c.d ? std::map<std::string, double>{}
                        : std::map<std::string, double>{{"head", static_cast<double>(c.head)}};
      auto headOf = [](const ir::EpilogueNode& node) {
        auto it = node.params.find("head");
        return it == node.params.end() ? -1.0 : it->second;
      };
      if (k > 0 && prev.kind == ir::EpiKind::Rope && prev.params["end"] == c.begin &&
          headOf(prev) == (c.head == c.d ? -1.0 : static_cast<double>(c.head)) &&
          ins[static_cast<size_t>(prev.operand)] == cosT &&
          ins[static_cast<size_t>(prev.operand2)] == sinT) {
        prev.params["end"] = static_cast<double>(c.end);
      } else {
        ir::EpilogueNode r;
        r.kind = ir::EpiKind::Rope;
        r.lhs = last;
        for (Vertex t : {cosT, sinT}) {
          out.connect(t, p, static_cast<unsigned>(ins.size()));
          ins.push_back(t);
        }
        r.operand = static_cast<int>(ins.size()) - 2;
        r.operand2 = static_cast<int>(ins.size()) - 1;
        r.params = params;
        r.params["begin"] = static_cast<double>(c.begin);
        r.params["end"] = static_cast<double>(c.end);
        last = e.add(std::move(r));
      }
      // The rope's (or its concat's) readers read the projection's rotated columns, seen as
      // heads.
      for (Vertex u : g.users(c.result)) {
        const std::vector<Vertex> uins = g.operands(u);
        for (size_t i = 0; i < uins.size(); ++i)
          if (uins[i] == c.result) {
            boost::remove_edge(c.result, u, out.impl());
            out.connect(c.top, u, static_cast<unsigned>(i));
          }
      }
      record.ropes.push_back(g.op(c.rope).name);
    }
    if (done)
      done->push_back(std::move(record));
  }
  return rebuild(out, g);
}

} // namespace fpat::match
