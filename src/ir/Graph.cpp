#include "fpat/ir/Graph.h"

#include <algorithm>
#include <boost/graph/graphviz.hpp>
#include <boost/graph/topological_sort.hpp>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <set>
#include <sstream>
#include <stdexcept>

namespace fpat::ir {

const std::vector<OpKindInfo>& opKinds() {
  static const std::vector<OpKindInfo> kinds = {
      {OpKind::Input, "input", 0, 0},
      {OpKind::Gemm, "gemm", 2, 2},
      {OpKind::BiasAdd, "bias_add", 2, 2},
      {OpKind::Activation, "activation", 1, 1},
      {OpKind::Add, "add", 2, 2},
      {OpKind::Mul, "mul", 2, 2},
      {OpKind::LayerNorm, "layernorm", 3, 3},
      {OpKind::RmsNorm, "rmsnorm", 2, 2},
      {OpKind::Fused, "fused", 1, -1},
      {OpKind::Constant, "constant", 0, 0},
      {OpKind::Sub, "sub", 2, 2},
      {OpKind::Div, "div", 2, 2},
      {OpKind::Pow, "pow", 2, 2},
      {OpKind::ReduceMean, "reduce_mean", 1, 1},
      {OpKind::Softmax, "softmax", 1, 1},
      {OpKind::Slice, "slice", 1, 1},
      {OpKind::AttnQk, "attn_qk", 2, 2},
      {OpKind::AttnPv, "attn_pv", 2, 2},
      {OpKind::Attention, "attention", 5, 5},
      {OpKind::Heads, "heads", 1, 1},
      {OpKind::MergeHeads, "merge_heads", 1, 1},
      {OpKind::Concat, "concat", 2, 2},
      {OpKind::Rope, "rope", 3, 3},
      {OpKind::Max, "max", 2, 2},
      {OpKind::Min, "min", 2, 2},
      {OpKind::BatchFirst, "batch_first", 1, 1},
      {OpKind::SeqFirst, "seq_first", 1, 1},
      {OpKind::KvAppend, "kv_append", 2, 2},
  };
  return kinds;
}

const OpKindInfo& opKindInfo(OpKind k) {
  return opKinds()[static_cast<size_t>(k)];
}
const char* opKindName(OpKind k) {
  return opKindInfo(k).name;
}

std::optional<OpKind> parseOpKind(std::string_view name) {
  for (const OpKindInfo& i : opKinds())
    if (name == i.name)
      return i.kind;
  return std::nullopt;
}

bool isBinaryElementwise(OpKind k) {
  return k == OpKind::Add || k == OpKind::Mul || k == OpKind::Sub || k == OpKind::Div ||
         k == OpKind::Pow || k == OpKind::Max || k == OpKind::Min;
}

double applyBinary(OpKind k, double x, double y) {
  switch (k) {
  case OpKind::Add:
    return x + y;
  case OpKind::Mul:
    return x * y;
  case OpKind::Sub:
    return x - y;
  case OpKind::Div:
    return x / y;
  case OpKind::Pow:
    return std::pow(x, y);
  case OpKind::Max: // NaN wins, as in torch.maximum (std::fmax would drop it)
    return std::isnan(x) || std::isnan(y) ? std::nan("") : std::max(x, y);
  case OpKind::Min:
    return std::isnan(x) || std::isnan(y) ? std::nan("") : std::min(x, y);
  default:
    throw std::logic_error(std::string("applyBinary: ") + opKindName(k) +
                           " is not a binary elementwise op");
  }
}

std::optional<std::vector<int64_t>> broadcastShapes(const std::vector<int64_t>& a,
                                                    const std::vector<int64_t>& b) {
  std::vector<int64_t> out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t y = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (x != y && x != 1 && y != 1)
      return std::nullopt;
    out[out.size() - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

Vertex Graph::addOp(Op op, const std::vector<Vertex>& operands) {
  Vertex v = boost::add_vertex(std::move(op), g_);
  for (size_t i = 0; i < operands.size(); ++i)
    boost::add_edge(operands[i], v, Operand{static_cast<unsigned>(i)}, g_);
  return v;
}

void Graph::connect(Vertex producer, Vertex consumer, unsigned index) {
  boost::add_edge(producer, consumer, Operand{index}, g_);
}

std::vector<Vertex> Graph::operands(Vertex v) const {
  std::vector<std::pair<unsigned, Vertex>> ins;
  for (auto [it, end] = boost::in_edges(v, g_); it != end; ++it)
    ins.emplace_back(g_[*it].index, boost::source(*it, g_));
  std::sort(ins.begin(), ins.end());
  std::vector<Vertex> out;
  for (auto& p : ins)
    out.push_back(p.second);
  return out;
}

std::vector<Vertex> Graph::users(Vertex v) const {
  std::set<Vertex> us;
  for (auto [it, end] = boost::out_edges(v, g_); it != end; ++it)
    us.insert(boost::target(*it, g_));
  return {us.begin(), us.end()};
}

size_t Graph::useCount(Vertex v) const {
  return boost::out_degree(v, g_) +
         static_cast<size_t>(std::count(outputs_.begin(), outputs_.end(), v));
}

bool Graph::isOutput(Vertex v) const {
  return std::find(outputs_.begin(), outputs_.end(), v) != outputs_.end();
}

std::optional<Vertex> Graph::find(std::string_view name) const {
  for (auto [it, end] = boost::vertices(g_); it != end; ++it)
    if (g_[*it].name == name)
      return *it;
  return std::nullopt;
}

std::vector<Vertex> Graph::vertices() const {
  std::vector<Vertex> vs;
  for (auto [it, end] = boost::vertices(g_); it != end; ++it)
    vs.push_back(*it);
  return vs;
}

const ActivationSet& ActivationSet::builtin() {
  static const ActivationSet set = [] {
    ActivationSet s;
    for (const char* n : {"gelu", "gelu_erf", "silu", "relu"})
      s.add(n);
    return s;
  }();
  return set;
}

NormKind normKindOf(const Op& op) {
  if (op.kind != OpKind::Fused)
    return NormKind::None;
  return op.fused.norm == "layernorm" ? NormKind::LayerNorm
         : op.fused.norm == "rmsnorm" ? NormKind::RmsNorm
                                      : NormKind::None;
}

size_t gemmBIndex(const Op& op) {
  const KernelFamily* f = familyOf(op);
  return f ? f->bIndex(op) : 1;
}

size_t mainOperandCount(const Op& op) {
  const KernelFamily* f = familyOf(op);
  return f ? f->mainOperandCount(op) : 2;
}

bool ActivationSet::contains(std::string_view name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

void ActivationSet::add(std::string name, std::vector<std::string> params) {
  auto it = std::find(names_.begin(), names_.end(), name);
  if (it != names_.end()) {
    params_[static_cast<size_t>(it - names_.begin())] = std::move(params);
    return;
  }
  names_.push_back(std::move(name));
  params_.push_back(std::move(params));
}

const std::vector<std::string>& ActivationSet::params(std::string_view name) const {
  static const std::vector<std::string> none;
  auto it = std::find(names_.begin(), names_.end(), name);
  return it == names_.end() ? none : params_[static_cast<size_t>(it - names_.begin())];
}

namespace {

std::string opRef(const Op& op) {
  return std::string(opKindName(op.kind)) + " %" + op.name;
}

} // namespace

std::string operandRef(const std::vector<OperandInfo>& ops, size_t i) {
  return "operand " + std::to_string(i) + " (%" + ops[i].name + ": " + ops[i].type.str() + ")";
}

std::optional<AttnShape> attnShape(const Graph& g, Vertex v, std::string& why) {
  std::vector<OperandInfo> infos;
  for (Vertex w : g.operands(v))
    infos.push_back({g.op(w).name, g.op(w).type});
  int bad = -1;
  return attnShape(g.op(v), infos, why, bad);
}

std::optional<AttnShape> attnShape(const Op& op, const std::vector<OperandInfo>& in,
                                   std::string& why, int& operand) {
  auto fail = [&](int i, std::string msg) -> std::optional<AttnShape> {
    operand = i;
    why = opRef(op) + ": " + std::move(msg);
    return std::nullopt;
  };
  if (op.batch < 1 || op.headDim < 1)
    return fail(-1, "batch and head_dim must be given, and at least 1");
  // Operand 0 is Q (attn_qk, attention) or P (attn_pv); operand 1 is K, or V for attn_pv.
  const bool pv = op.kind == OpKind::AttnPv;
  AttnShape s;
  s.batch = op.batch;
  s.headDim = op.headDim;
  // K and V: token-major rows, or a cache [B, Hkv, Sk, d] (kv_append's, head-major).
  for (size_t i = pv ? 1 : 0; i < in.size() && i < 3; ++i)
    if (in[i].type.rank() != 2 && (i == 0 || in[i].type.rank() != 4))
      return fail(static_cast<int>(i),
                  operandRef(in, i) + (i == 0 ? " must be 2-D, token-major [B*S, H*d]"
                                              : " must be 2-D, token-major [B*S, Hkv*d], or a "
                                                "cache [B, Hkv, S, d]"));
  if (pv) {
    const std::vector<int64_t>& p = in[0].type.shape;
    if (p.size() != 4 || p[0] != op.batch)
      return fail(0, operandRef(in, 0) +
                         " must be [B, H, Sq, Sk] with B = batch = " + std::to_string(op.batch));
    s.heads = p[1];
    s.sq = p[2];
    s.sk = p[3];
  } else {
    const std::vector<int64_t>& q = in[0].type.shape;
    if (q[0] % op.batch || q[1] % op.headDim)
      return fail(0, operandRef(in, 0) + " must be [B*Sq, H*d] with B = " +
                         std::to_string(op.batch) + " and d = " + std::to_string(op.headDim));
    s.sq = q[0] / op.batch;
    s.heads = q[1] / op.headDim;
  }
  const std::vector<int64_t>& k = in[1].type.shape;
  if (k.size() == 4) {
    if (k[0] != op.batch || k[3] != op.headDim || k[1] == 0 || s.heads % k[1] ||
        (pv && k[2] != s.sk))
      return fail(1, operandRef(in, 1) + " must be a cache [B, Hkv, Sk, d] with B = " +
                         std::to_string(op.batch) + ", d = " + std::to_string(op.headDim) +
                         (pv ? ", Sk = " + std::to_string(s.sk) : std::string()) +
                         " and Hkv dividing the " + std::to_string(s.heads) + " query heads");
    s.kvHeads = k[1];
    s.sk = k[2];
    s.kvHeadMajor = true;
  } else {
    if (k[1] % op.headDim || k[1] == 0 || s.heads % (k[1] / op.headDim))
      return fail(1, operandRef(in, 1) +
                         " must be [B*Sk, Hkv*d] with d = " + std::to_string(op.headDim) +
                         " and Hkv dividing the " + std::to_string(s.heads) + " query heads");
    s.kvHeads = k[1] / op.headDim;
    if (pv ? k[0] != op.batch * s.sk : k[0] % op.batch)
      return fail(1, operandRef(in, 1) + " must have B*Sk = " +
                         (pv ? std::to_string(op.batch * s.sk)
                             : "a multiple of " + std::to_string(op.batch)) +
                         " rows");
    if (!pv)
      s.sk = k[0] / op.batch;
  }
  if (op.kind == OpKind::Attention && in[2].type.shape != k)
    return fail(2, operandRef(in, 2) + " (V) must have K's shape " + in[1].type.shapeStr());
  return s;
}

/// The result of heads, merge_heads, concat, rope, batch_first or seq_first (layout ops), or
/// nullopt with the reason and the offending operand.
static std::optional<TensorDesc> inferLayoutOp(const Op& op, const std::vector<OperandInfo>& in,
                                               std::string& why, int& operand) {
  auto failWith = [&](int i, std::string msg) -> std::optional<TensorDesc> {
    operand = i;
    why = std::move(msg);
    return std::nullopt;
  };
  switch (op.kind) {
  case OpKind::Heads: {
    const std::vector<int64_t>& x = in[0].type.shape;
    if (op.batch < 1 || op.headDim < 1)
      return failWith(-1, "batch and head_dim must be given, and at least 1");
    if (x.size() != 2 || x[0] % op.batch || x[1] % op.headDim)
      return failWith(0, operandRef(in, 0) + " must be [B*S, H*d] with B = " +
                             std::to_string(op.batch) + " and d = " + std::to_string(op.headDim));
    return TensorDesc{{op.batch, x[0] / op.batch, x[1] / op.headDim, op.headDim}, in[0].type.dtype};
  }
  case OpKind::MergeHeads: {
    const std::vector<int64_t>& x = in[0].type.shape;
    if (x.size() != 4)
      return failWith(0, operandRef(in, 0) + " must be [B, S, H, d]");
    return TensorDesc{{x[0] * x[1], x[2] * x[3]}, in[0].type.dtype};
  }
  case OpKind::Concat: {
    const TensorDesc& a = in[0].type;
    const TensorDesc& b = in[1].type;
    if (a.rank() < 1 || a.rank() != b.rank() ||
        !std::equal(a.shape.begin(), a.shape.end() - 1, b.shape.begin()))
      return failWith(1, operandRef(in, 1) + " must have operand 0's shape " + a.shapeStr() +
                             " but for the last dimension");
    TensorDesc t = a;
    t.shape.back() += b.shape.back();
    return t;
  }
  case OpKind::BatchFirst:
  case OpKind::SeqFirst: {
    const TensorDesc& x = in[0].type;
    if (x.rank() != 2)
      return failWith(0, operandRef(in, 0) + " must be a matrix of token rows");
    if (op.batch < 1)
      return failWith(-1, "needs batch = B, the batch size (at least 1)");
    if (x.shape[0] % op.batch)
      return failWith(-1, "batch = " + std::to_string(op.batch) + " does not divide operand 0's " +
                              std::to_string(x.shape[0]) + " rows");
    return x;
  }
  case OpKind::KvAppend: {
    const std::vector<int64_t>& c = in[0].type.shape;
    const std::vector<int64_t>& x = in[1].type.shape;
    if (c.size() == 2 && op.batch > 0) { // token-major: [B*P, E] and [B*S, E]
      if (c[0] % op.batch)
        return failWith(0, "batch = " + std::to_string(op.batch) + " does not divide " +
                               operandRef(in, 0) + "'s " + std::to_string(c[0]) + " rows");
      if (x.size() != 2 || x[1] != c[1] || x[0] % op.batch)
        return failWith(1, operandRef(in, 1) + " must be the new tokens' [B*S, E] = [" +
                               std::to_string(op.batch) + "*S, " + std::to_string(c[1]) + "]");
      return TensorDesc{{c[0] + x[0], c[1]}, in[0].type.dtype};
    }
    if (c.size() != 4)
      return failWith(0, operandRef(in, 0) +
                             " must be a cache [B, Hkv, P, d] (or, with batch = B, [B*P, E])");
    if (op.batch > 0)
      return failWith(-1, "batch is for a token-major cache [B*P, E]; this one is [B, Hkv, P, d]");
    const int64_t rowWidth = c[1] * c[3];
    const bool rows = x.size() == 2 && x[1] == rowWidth && x[0] % c[0] == 0;
    const bool dense = x.size() == 4 && x[0] == c[0] && x[2] == c[1] && x[3] == c[3];
    if (!rows && !dense)
      return failWith(1, operandRef(in, 1) + " must be the new tokens' [B*S, Hkv*d] = [" +
                             std::to_string(c[0]) + "*S, " + std::to_string(rowWidth) +
                             "] or [B, S, Hkv, d] = [" + std::to_string(c[0]) + ", S, " +
                             std::to_string(c[1]) + ", " + std::to_string(c[3]) + "]");
    const int64_t s = rows ? x[0] / c[0] : x[1];
    return TensorDesc{{c[0], c[1], c[2] + s, c[3]}, in[0].type.dtype};
  }
  case OpKind::Rope: {
    const TensorDesc& x = in[0].type;
    if (x.rank() < 1 || x.shape.back() % 2)
      return failWith(0, operandRef(in, 0) + " must have an even last dimension (its two halves "
                                             "rotate)");
    for (size_t i = 1; i < 3; ++i)
      if (broadcastShapes(in[i].type.shape, x.shape) != x.shape)
        return failWith(static_cast<int>(i),
                        operandRef(in, i) + " (the " + (i == 1 ? "cosines" : "sines") +
                            ") does not broadcast to operand 0, " + x.shapeStr());
    return x;
  }
  default:
    return failWith(-1, "not a layout op");
  }
}

/// A rope node of a fused op's epilogue against the op's operands (`mains` main ones, result
/// [m, cols]): its tables, columns and heads; the problem, or nullopt.
static std::optional<TypeError> checkRopeNode(const EpilogueNode& e,
                                              const std::vector<OperandInfo>& in, size_t mains,
                                              int64_t m, int64_t cols) {
  const int n = static_cast<int>(in.size());
  for (int t : {e.operand, e.operand2})
    if (t < static_cast<int>(mains) || t >= n)
      return TypeError{-1, "rope in the epilogue reads $" + std::to_string(t) +
                               ", which is not an operand after the main ones"};
  const std::vector<int64_t>& c = in[static_cast<size_t>(e.operand)].type.shape;
  if (c.size() != 2 || c[1] % 2 || c[1] <= 0 || c[0] <= 0 || m % c[0])
    return TypeError{e.operand, "rope's cosines " + operandRef(in, static_cast<size_t>(e.operand)) +
                                    " must be [R, d]: d even, R dividing the rows (" +
                                    std::to_string(m) + "), row r reading table row r % R"};
  if (in[static_cast<size_t>(e.operand2)].type.shape != c)
    return TypeError{e.operand2, "rope's sines " + operandRef(in, static_cast<size_t>(e.operand2)) +
                                     " must have the cosines' shape"};
  const double b = e.params.at("begin"), end = e.params.at("end");
  auto columns = [](double x) {
    return x == std::floor(x) ? std::to_string(static_cast<int64_t>(x)) : formatDouble(x);
  };
  if (b != std::floor(b) || end != std::floor(end) || b < 0 || end <= b ||
      end > static_cast<double>(cols) || std::fmod(b, 2) != 0 ||
      (!e.params.count("head") && std::fmod(end - b, static_cast<double>(c[1])) != 0))
    return TypeError{-1, "rope in the epilogue rotates columns [" + columns(b) + ", " +
                             columns(end) + "): they must lie in the " + std::to_string(cols) +
                             " columns, begin even, and make whole "
                             "heads of " +
                             std::to_string(c[1])};
  if (e.params.count("head")) {
    const double h = e.params.at("head");
    if (h != std::floor(h) || h < static_cast<double>(c[1]) || std::fmod(h, 2) != 0 ||
        std::fmod(end - b, h) != 0)
      return TypeError{-1, "rope in the epilogue has heads of " + columns(h) +
                               " columns: they must be even, at least the tables' " +
                               std::to_string(c[1]) + ", and divide columns [" + columns(b) + ", " +
                               columns(end) + ")"};
  }
  if (cols % 2)
    return TypeError{-1, "rope in the epilogue needs an even number of columns (its kernels "
                         "read column pairs), not " +
                             std::to_string(cols)};
  return std::nullopt;
}

/// The shapes of a fused op's epilogue nodes against its operands (`mains` main ones, result
/// [m, cols]): each node is [M, N] (full) or [N] (a vector broadcast over rows); the result is
/// full. The problem, or nullopt.
static std::optional<TypeError> checkEpilogueShapes(const Epilogue& epi,
                                                    const std::vector<OperandInfo>& in,
                                                    size_t mains, int64_t m, int64_t cols,
                                                    const ActivationSet& acts) {
  const int n = static_cast<int>(in.size());
  // Each node is [M, N] (full) or [N] (a vector broadcast over rows); the result is full.
  std::vector<bool> full(epi.nodes.size());
  for (size_t i = 0; i < epi.nodes.size(); ++i) {
    const EpilogueNode& e = epi.nodes[i];
    const auto lhs = static_cast<size_t>(e.lhs), rhs = static_cast<size_t>(e.rhs);
    switch (e.kind) {
    case EpiKind::Acc:
      full[i] = true;
      break;
    case EpiKind::Operand: {
      if (e.operand < static_cast<int>(mains) || e.operand >= n)
        return TypeError{-1, "the epilogue reads $" + std::to_string(e.operand) +
                                 ", which is not an operand after the main ones (" +
                                 (static_cast<int>(mains) < n ? "$" + std::to_string(mains) +
                                                                    " to $" + std::to_string(n - 1)
                                                              : std::string("this op has none")) +
                                 ")"};
      const size_t o = static_cast<size_t>(e.operand);
      const std::vector<int64_t>& s = in[o].type.shape;
      full[i] = s == std::vector<int64_t>{m, cols};
      if (!full[i] && s != std::vector<int64_t>{cols})
        return TypeError{e.operand, "the epilogue's " + operandRef(in, o) + " must have shape [" +
                                        std::to_string(m) + ", " + std::to_string(cols) + "] or [" +
                                        std::to_string(cols) + "]"};
      break;
    }
    case EpiKind::BiasAdd:
      if (!full[lhs] || full[rhs])
        return TypeError{-1, "bias_add in the epilogue needs an [M, N] value and an [N] vector"};
      full[i] = true;
      break;
    case EpiKind::Add:
    case EpiKind::Mul:
      if (full[lhs] != full[rhs])
        return TypeError{-1, std::string(e.kind == EpiKind::Add ? "add" : "mul") +
                                 " in the epilogue needs operands of one shape (use bias_add to "
                                 "add an [N] vector)"};
      full[i] = full[lhs];
      break;
    case EpiKind::Activation: {
      if (!acts.contains(e.fn))
        return TypeError{-1, "unknown activation '" + e.fn + "' in the epilogue" +
                                 didYouMean(e.fn, acts.names())};
      const std::vector<std::string>& ps = acts.params(e.fn);
      for (const auto& [key, value] : e.params)
        if (std::find(ps.begin(), ps.end(), key) == ps.end())
          return TypeError{-1, "activation '" + e.fn + "' in the epilogue has no parameter '" +
                                   key + "'"};
      full[i] = full[lhs];
      break;
    }
    case EpiKind::Rope: {
      if (std::optional<TypeError> why = checkRopeNode(e, in, mains, m, cols))
        return TypeError{why->operand, std::move(why->message)};
      if (!full[lhs])
        return TypeError{-1, "rope in the epilogue needs an [M, N] value"};
      full[i] = true;
      break;
    }
    }
  }
  if (!epi.identity() && !full.back())
    return TypeError{-1, "the epilogue's result must be [M, N], not an [N] vector"};
  return std::nullopt;
}

std::optional<TensorDesc> inferType(const Op& op, const std::vector<OperandInfo>& in,
                                    TypeError& err, const ActivationSet& acts) {
  const OpKindInfo& info = opKindInfo(op.kind);
  const int n = static_cast<int>(in.size());
  if (n < info.minOperands || (info.maxOperands >= 0 && n > info.maxOperands)) {
    err = {-1, opRef(op) + " takes " +
                   (info.minOperands == info.maxOperands
                        ? std::to_string(info.minOperands)
                        : "at least " + std::to_string(info.minOperands)) +
                   " operand" + (info.minOperands == 1 ? "" : "s") + " but was given " +
                   std::to_string(n)};
    return std::nullopt;
  }
  auto fail = [&](int operand, std::string msg) -> std::optional<TensorDesc> {
    err = {operand, opRef(op) + ": " + std::move(msg)};
    return std::nullopt;
  };
  // Every operand of an op shares the dtype of operand 0.
  for (int i = 1; i < n; ++i)
    if (in[static_cast<size_t>(i)].type.dtype != in[0].type.dtype)
      return fail(i, operandRef(in, static_cast<size_t>(i)) + " has dtype " +
                         dtypeName(in[static_cast<size_t>(i)].type.dtype) + "; expected " +
                         dtypeName(in[0].type.dtype) + " like operand 0");
  auto requireRank = [&](size_t i, int rank) { return in[i].type.rank() == rank; };
  switch (op.kind) {
  case OpKind::Input:
  case OpKind::Constant: {
    if (op.type.rank() < (op.kind == OpKind::Constant ? 0 : 1) || op.type.rank() > kMaxRank)
      return fail(-1, std::string(op.kind == OpKind::Constant ? "constants must have rank 0 to 4"
                                                              : "tensors must have rank 1 to 4") +
                          ", got rank " + std::to_string(op.type.rank()));
    if (op.kind == OpKind::Constant && !std::isfinite(op.value))
      return fail(-1, "the value of a constant must be finite");
    // A constant of a half type is rounded to it: one beyond its range would be inf.
    if (op.kind == OpKind::Constant && !std::isfinite(roundTo(op.value, op.type.dtype))) {
      std::ostringstream os;
      os << std::setprecision(10) << "the value " << op.value << " does not fit "
         << dtypeName(op.type.dtype) << " (its largest finite value is "
         << largestFinite(op.type.dtype) << ")";
      return fail(-1, os.str());
    }
    if (op.data && op.data->size() != static_cast<size_t>(op.type.numel()))
      return fail(-1, "the weight holds " + std::to_string(op.data->size()) +
                          " values; its type needs " + std::to_string(op.type.numel()));
    for (int64_t d : op.type.shape)
      if (d < 1)
        return fail(-1, "dimension " + std::to_string(d) + " must be at least 1");
    return op.type;
  }
  case OpKind::Gemm: {
    if (!requireRank(0, 2))
      return fail(0, operandRef(in, 0) + " must be 2-D [M, K]");
    if (!requireRank(1, 2))
      return fail(1, operandRef(in, 1) + " must be 2-D " +
                         std::string(op.transposeB ? "[N, K]" : "[K, N]"));
    int64_t m = in[0].type.shape[0], k = in[0].type.shape[1];
    int64_t kb = in[1].type.shape[op.transposeB ? 1 : 0];
    int64_t nn = in[1].type.shape[op.transposeB ? 0 : 1];
    if (k != kb)
      return fail(1, operandRef(in, 1) + " has K = " + std::to_string(kb) +
                         "; expected K = " + std::to_string(k) + " to match operand 0" +
                         (op.transposeB ? " (B is transposed: [N, K])" : ""));
    return TensorDesc{{m, nn}, in[0].type.dtype};
  }
  case OpKind::BiasAdd: {
    if (!requireRank(0, 2))
      return fail(0, operandRef(in, 0) + " must be 2-D [M, N]");
    int64_t cols = in[0].type.shape[1];
    if (in[1].type.shape != std::vector<int64_t>{cols})
      return fail(1, operandRef(in, 1) + " must have shape [" + std::to_string(cols) +
                         "] to match the columns of operand 0");
    return in[0].type;
  }
  case OpKind::Activation:
    if (op.fn.empty())
      return fail(-1, "missing activation function name (fn)");
    if (!acts.contains(op.fn))
      return fail(-1, "unknown activation '" + op.fn + "'" + didYouMean(op.fn, acts.names()));
    for (const auto& [key, value] : op.params) {
      const std::vector<std::string>& known = acts.params(op.fn);
      if (std::find(known.begin(), known.end(), key) == known.end())
        return fail(-1, "activation '" + op.fn + "' has no parameter '" + key + "'");
    }
    return in[0].type;
  case OpKind::Add:
  case OpKind::Mul:
  case OpKind::Sub:
  case OpKind::Div:
  case OpKind::Pow:
  case OpKind::Max:
  case OpKind::Min: {
    auto shape = broadcastShapes(in[0].type.shape, in[1].type.shape);
    if (!shape)
      return fail(1, operandRef(in, 1) + " does not broadcast with operand 0, " +
                         in[0].type.shapeStr() + " (trailing dimensions must be equal or 1)");
    return TensorDesc{*shape, in[0].type.dtype};
  }
  case OpKind::Softmax:
    if (in[0].type.rank() < 1)
      return fail(0, operandRef(in, 0) + " must have rank 1 to 4");
    return in[0].type;
  case OpKind::Slice: {
    if (in[0].type.rank() < 1)
      return fail(0, operandRef(in, 0) + " must have rank 1 to 4");
    const int64_t cols = in[0].type.shape.back();
    if (op.begin < 0 || op.end <= op.begin || op.end > cols)
      return fail(-1, "columns [" + std::to_string(op.begin) + ", " + std::to_string(op.end) +
                          ") are not a non-empty range of operand 0's " + std::to_string(cols));
    TensorDesc t = in[0].type;
    t.shape.back() = op.end - op.begin;
    return t;
  }
  case OpKind::Heads:
  case OpKind::MergeHeads:
  case OpKind::Concat:
  case OpKind::Rope:
  case OpKind::BatchFirst:
  case OpKind::SeqFirst:
  case OpKind::KvAppend: {
    std::string why;
    int bad = -1;
    auto t = inferLayoutOp(op, in, why, bad);
    if (!t)
      return fail(bad, why);
    return t;
  }
  case OpKind::AttnQk:
  case OpKind::AttnPv:
  case OpKind::Attention: {
    std::string why;
    int bad = -1;
    auto s = attnShape(op, in, why, bad);
    if (!s)
      return fail(bad, why);
    if (op.kind == OpKind::AttnQk)
      return TensorDesc{{s->batch, s->heads, s->sq, s->sk}, in[0].type.dtype};
    if (op.kind == OpKind::Attention) {
      const std::vector<int64_t> scores = {s->batch, s->heads, s->sq, s->sk};
      if (in[3].type.rank() > 4 || broadcastShapes(in[3].type.shape, scores) != scores)
        return fail(3, operandRef(in, 3) +
                           " (the bias added to the scores) does not broadcast "
                           "to the scores' [B, H, Sq, Sk] = " +
                           TensorDesc{scores, in[0].type.dtype}.shapeStr());
      if (in[4].type.numel() != 1)
        return fail(4, operandRef(in, 4) + " (the scale) must be a scalar");
    }
    return TensorDesc{{s->batch * s->sq, s->heads * s->headDim}, in[0].type.dtype};
  }
  case OpKind::ReduceMean: {
    if (in[0].type.rank() < 1)
      return fail(0, operandRef(in, 0) + " must have rank 1 to 4");
    TensorDesc t = in[0].type;
    t.shape.back() = 1;
    return t;
  }
  case OpKind::LayerNorm:
  case OpKind::RmsNorm: {
    if (!requireRank(0, 2))
      return fail(0, operandRef(in, 0) + " must be 2-D [M, N]");
    if (!(op.eps > 0))
      return fail(-1, "eps must be positive");
    int64_t cols = in[0].type.shape[1];
    for (size_t i = 1; i < in.size(); ++i)
      if (in[i].type.shape != std::vector<int64_t>{cols})
        return fail(static_cast<int>(i), operandRef(in, i) + " must have shape [" +
                                             std::to_string(cols) +
                                             "] to match the rows of operand 0");
    return in[0].type;
  }
  case OpKind::Fused: {
    if (op.fused.pattern.empty())
      return fail(-1, "fused op without a pattern");
    // The structure every kernel family and the reference rely on, checked here so that a
    // hand-written fused op is a located error, not an internal one later.
    const FusedAttrs& f = op.fused;
    if (!isKernelFamily(f.family))
      return fail(-1, "unknown kernel family '" + f.family + "' (fpat has " + kernelFamilyList() +
                          ")" + familyDidYouMean(f.family));
    MainShape shape;
    if (std::optional<FamilyError> e = findFamily(f.family)->check(op, in, shape))
      return fail(e->operand, std::move(e->message));
    const size_t mains = mainOperandCount(op);
    const int64_t m = shape.m, cols = shape.n;
    if (!op.params.empty())
      return fail(-1, "parameter '" + op.params.begin()->first +
                          "' belongs to an activation inside the epilogue, e.g. "
                          "epilogue = \"leaky_relu(acc, slope = 0.5)\"");
    if (std::string why = checkEpilogueStructure(f.epilogue); !why.empty())
      return fail(-1, why);
    if (std::optional<TypeError> why = checkEpilogueShapes(f.epilogue, in, mains, m, cols, acts))
      return fail(why->operand, std::move(why->message));
    return TensorDesc{{m, cols}, in[0].type.dtype};
  }
  }
  return fail(-1, "unhandled op kind");
}

std::optional<std::vector<Vertex>> topologicalOrder(const Graph& g, std::vector<Vertex>* cycle) {
  std::vector<Vertex> rev;
  try {
    boost::topological_sort(g.impl(), std::back_inserter(rev));
  } catch (const boost::not_a_dag&) {
    if (cycle) {
      // Kahn's algorithm: what is never freed lies on or behind a cycle.
      cycle->clear();
      std::vector<size_t> indeg(g.size());
      for (Vertex v : g.vertices())
        indeg[v] = boost::in_degree(v, g.impl());
      std::vector<Vertex> ready;
      for (Vertex v : g.vertices())
        if (!indeg[v])
          ready.push_back(v);
      while (!ready.empty()) {
        Vertex v = ready.back();
        ready.pop_back();
        for (auto [it, end] = boost::out_edges(v, g.impl()); it != end; ++it)
          if (--indeg[boost::target(*it, g.impl())] == 0)
            ready.push_back(boost::target(*it, g.impl()));
      }
      for (Vertex v : g.vertices())
        if (indeg[v])
          cycle->push_back(v);
    }
    return std::nullopt;
  }
  std::reverse(rev.begin(), rev.end());
  return rev;
}

FreshNames::FreshNames(const Graph& g) {
  for (Vertex v : g.vertices())
    taken_.insert(g.op(v).name);
}

std::string FreshNames::operator()(const std::string& base) {
  std::string n = base;
  for (int i = 2; taken_.count(n); ++i)
    n = base + std::to_string(i);
  taken_.insert(n);
  return n;
}

std::optional<Vertex> ropedAndRejoined(const Graph& g, Vertex h) {
  for (Vertex s : g.users(h))
    for (Vertex r : g.users(s)) {
      if (g.op(r).kind != OpKind::Rope || g.useCount(r) != 1 || g.isOutput(r))
        continue;
      const Vertex cat = g.users(r).front();
      if (g.op(cat).kind != OpKind::Concat)
        continue;
      const std::vector<Vertex> ins = g.operands(cat);
      if (ins.size() == 2 && ins[0] == r && g.op(ins[1]).kind == OpKind::Slice &&
          g.operands(ins[1]).at(0) == h)
        return cat;
    }
  return std::nullopt;
}

bool readInPlace(const Graph& g, Vertex v, bool rejoinedRopes) {
  if (g.isOutput(v) || g.useCount(v) == 0)
    return false;
  if (rejoinedRopes && g.op(v).type.rank() == 4 && g.useCount(v) == 2)
    if (std::optional<Vertex> cat = ropedAndRejoined(g, v))
      return readInPlace(g, *cat, true);
  for (Vertex u : g.users(v)) {
    const Op& op = g.op(u);
    if (isView(op.kind)) { // heads, merge_heads: their readers read v
      if (!readInPlace(g, u, rejoinedRopes))
        return false;
      continue;
    }
    // attention's q, k, v (not its bias or scale); rope's x (not its tables); kv_append's
    // new tokens (not its cache)
    auto inPlace = [&](size_t i) {
      return op.kind == OpKind::Attention  ? i < 3
             : op.kind == OpKind::Rope     ? i == 0
             : op.kind == OpKind::KvAppend ? i == 1
                                           : false;
    };
    const std::vector<Vertex> ins = g.operands(u);
    for (size_t i = 0; i < ins.size(); ++i)
      if (ins[i] == v && !inPlace(i))
        return false;
  }
  return true;
}

bool isColumnView(const Graph& g, Vertex v) {
  // FPAT_COLUMN_VIEWS=0 copies every slice (an experiment's knob: the A/B of the views).
  static const bool off = [] {
    const char* env = std::getenv("FPAT_COLUMN_VIEWS");
    return env && std::string(env) == "0";
  }();
  const Op& op = g.op(v);
  if (off || op.kind != OpKind::Slice)
    return false;
  const std::vector<int64_t>& from = g.op(g.operands(v).at(0)).type.shape;
  // Token-major operands only: a slice of heads ([B, S, H, d], GPT-NeoX's q, k, v interleaved
  // per head) is no matrix of tokens a pitch apart.
  return from.size() == 2 && op.begin % 8 == 0 && from.back() % 8 == 0 && readInPlace(g, v);
}

std::optional<Vertex> columnViewOf(const Graph& g, Vertex v) {
  if (isColumnView(g, v))
    return v;
  if (isView(g.op(v).kind))
    return columnViewOf(g, g.operands(v).at(0));
  return std::nullopt;
}

int64_t rowPitch(const Graph& g, Vertex v) {
  if (std::optional<Vertex> c = columnViewOf(g, v))
    return g.op(g.operands(*c).at(0)).type.shape.back();
  const std::vector<int64_t>& shape = g.op(v).type.shape;
  if (shape.size() == 4) // [B, S, H, d]: a token's heads side by side
    return shape[2] * shape[3];
  return shape.empty() ? 1 : shape.back();
}

std::vector<float> headPartsToColumns(const std::vector<float>& w, int64_t H, int64_t P, int64_t d,
                                      bool rowsOfN) {
  std::vector<float> out(w.size());
  const int64_t C = H * P * d, n = static_cast<int64_t>(w.size());
  const int64_t lines = rowsOfN ? 1 : n / C; // K rows, or 1
  const int64_t run = rowsOfN ? n / C : 1;   // a column's values
  for (int64_t r = 0; r < lines; ++r)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t e = 0; e < d; ++e)
          std::copy_n(w.begin() + (r * C + (h * P + p) * d + e) * run, run,
                      out.begin() + (r * C + (p * H + h) * d + e) * run);
  return out;
}

std::vector<bool> weightOnly(const Graph& g) {
  std::vector<bool> w(g.size(), false);
  auto order = stableOrder(g);
  if (!order)
    return w;
  for (Vertex v : *order) {
    const Op& op = g.op(v);
    const std::vector<Vertex> ins = g.operands(v);
    w[v] = op.kind == OpKind::Input
               ? op.weight
               : op.kind == OpKind::Constant ||
                     (!ins.empty() &&
                      std::all_of(ins.begin(), ins.end(), [&](Vertex u) { return bool(w[u]); }));
  }
  return w;
}

bool isWeightOnly(const Graph& g, Vertex v) {
  // One definition, in graph order (a recursion over operands would revisit shared ones).
  return weightOnly(g)[v];
}

std::optional<std::vector<Vertex>> stableOrder(const Graph& g) {
  std::vector<Vertex> order = g.vertices();
  for (Vertex v : order)
    for (Vertex u : g.operands(v))
      if (u >= v)
        return topologicalOrder(g);
  return order;
}

static std::vector<std::string> checkGraph(Graph& g, const ActivationSet& acts, bool update) {
  std::vector<std::string> problems;
  std::set<std::string> names;
  for (Vertex v : g.vertices()) {
    const Op& op = g.op(v);
    if (op.name.empty())
      problems.push_back("op #" + std::to_string(v) + " (" + opKindName(op.kind) + ") has no name");
    else if (!names.insert(op.name).second)
      problems.push_back("value %" + op.name + " is defined more than once");
    // Operand indices must be exactly 0..n-1.
    std::vector<unsigned> idx;
    for (auto [it, end] = boost::in_edges(v, g.impl()); it != end; ++it)
      idx.push_back(g.impl()[*it].index);
    std::sort(idx.begin(), idx.end());
    for (size_t i = 0; i < idx.size(); ++i)
      if (idx[i] != i) {
        problems.push_back(opRef(op) + ": operand indices are not 0.." +
                           std::to_string(idx.size() - 1));
        break;
      }
  }
  if (g.outputs().empty())
    problems.push_back("graph " + g.name() + " has no outputs");
  std::vector<Vertex> cycle;
  auto order = topologicalOrder(g, &cycle);
  if (!order) {
    std::string s = "graph " + g.name() + " has a cycle through";
    for (Vertex v : cycle)
      s += " %" + g.op(v).name;
    problems.push_back(s);
    return problems;
  }
  std::vector<bool> bad(g.size(), false);
  for (Vertex v : *order) {
    std::vector<OperandInfo> ins;
    bool skip = false;
    for (Vertex u : g.operands(v)) {
      ins.push_back({g.op(u).name, g.op(u).type});
      skip = skip || bad[u];
    }
    if (skip) { // an earlier problem already explains this one
      bad[v] = true;
      continue;
    }
    TypeError err;
    auto t = inferType(g.op(v), ins, err, acts);
    if (!t) {
      problems.push_back(err.message);
      bad[v] = true;
    } else if (update) {
      g.op(v).type = *t;
    } else if (*t != g.op(v).type) {
      problems.push_back(opRef(g.op(v)) + ": recorded type " + g.op(v).type.str() +
                         " differs from inferred type " + t->str());
    }
  }
  return problems;
}

std::vector<std::string> validate(const Graph& g, const ActivationSet& acts) {
  return checkGraph(const_cast<Graph&>(g), acts, /*update=*/false);
}

std::vector<std::string> inferTypes(Graph& g, const ActivationSet& acts) {
  return checkGraph(g, acts, /*update=*/true);
}

KvAppendDims kvAppendDims(const Op& op, const std::vector<int64_t>& cache,
                          const std::vector<int64_t>& out) {
  if (cache.size() == 2) // token-major: one head of E
    return {op.batch, 1, cache[0] / op.batch, (out[0] - cache[0]) / op.batch, cache[1]};
  return {cache[0], cache[1], cache[2], out[2] - cache[2], cache[3]};
}

std::string attrString(const Op& op) {
  std::vector<std::string> attrs;
  switch (op.kind) {
  case OpKind::Input:
    if (op.mask)
      attrs.push_back("mask");
    break;
  case OpKind::Gemm:
    if (op.transposeB)
      attrs.push_back("transpose_b = true");
    break;
  case OpKind::Rope:
    if (op.interleaved)
      attrs.push_back("interleaved = true");
    break;
  case OpKind::Activation:
    attrs.push_back("fn = " + op.fn);
    for (auto& [k, v] : op.params)
      attrs.push_back(k + " = " + formatDouble(v));
    break;
  case OpKind::LayerNorm:
  case OpKind::RmsNorm:
    attrs.push_back("eps = " + formatDouble(op.eps));
    break;
  case OpKind::Constant:
    attrs.push_back("value = " + formatDouble(op.value));
    break;
  case OpKind::KvAppend:
    if (op.batch > 0)
      attrs.push_back("batch = " + std::to_string(op.batch));
    break;
  case OpKind::Slice:
    attrs.push_back("begin = " + std::to_string(op.begin));
    attrs.push_back("end = " + std::to_string(op.end));
    break;
  case OpKind::BatchFirst:
  case OpKind::SeqFirst:
    attrs.push_back("batch = " + std::to_string(op.batch));
    break;
  case OpKind::AttnQk:
  case OpKind::AttnPv:
  case OpKind::Attention:
  case OpKind::Heads:
    attrs.push_back("batch = " + std::to_string(op.batch));
    attrs.push_back("head_dim = " + std::to_string(op.headDim));
    break;
  case OpKind::Fused: {
    attrs.push_back("pattern = " + op.fused.pattern);
    if (!op.fused.family.empty())
      attrs.push_back("family = " + op.fused.family);
    if (!op.fused.norm.empty())
      attrs.push_back("norm = " + op.fused.norm);
    if (!op.fused.epilogue.identity())
      attrs.push_back("epilogue = \"" + printEpilogue(op.fused.epilogue) + "\"");
    if (op.transposeB)
      attrs.push_back("transpose_b = true");
    if (op.eps != 1e-5)
      attrs.push_back("eps = " + formatDouble(op.eps));
    break;
  }
  default:
    break;
  }
  if (attrs.empty())
    return "";
  std::string s = "{";
  for (size_t i = 0; i < attrs.size(); ++i)
    s += (i ? ", " : "") + attrs[i];
  return s + "}";
}

namespace {

std::string dotEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\')
      o += '\\';
    o += c;
  }
  return o;
}

} // namespace

void writeDot(const Graph& g, std::ostream& os, const std::vector<DotCluster>& clusters) {
  os << "digraph G {\nlabel=\"" << dotEscape(g.name())
     << "\";\nrankdir=TB;\nnode [fontname=\"monospace\"];\n";
  for (size_t c = 0; c < clusters.size(); ++c) {
    os << "subgraph cluster_" << c << " {\nlabel=\"" << dotEscape(clusters[c].label)
       << "\";\nstyle=filled;\nfillcolor=\"#dbe9f6\";\nfontname=\"monospace\";\n";
    for (Vertex v : clusters[c].members)
      os << v << ";\n";
    os << "}\n";
  }
  for (Vertex v : g.vertices()) {
    const Op& op = g.op(v);
    std::string label = "%" + op.name + " = " + opKindName(op.kind);
    if (std::string attrs = attrString(op); !attrs.empty())
      label += "\\n" + dotEscape(attrs);
    label += "\\n" + op.type.str();
    const char* fill = op.kind == OpKind::Fused   ? "lightblue"
                       : op.kind == OpKind::Input ? "lightgray"
                                                  : "white";
    os << v << " [label=\"" << label
       << "\", shape=" << (op.kind == OpKind::Input ? "ellipse" : "box")
       << ", style=filled, fillcolor=" << fill << (g.isOutput(v) ? ", peripheries=2" : "")
       << "];\n";
  }
  for (Vertex v : g.vertices()) {
    const std::vector<Vertex> ops = g.operands(v);
    for (size_t i = 0; i < ops.size(); ++i)
      os << ops[i] << "->" << v << " [label=\"" << g.op(ops[i]).type.shapeStr() << " #" << i
         << "\"];\n";
  }
  os << "}\n";
}

} // namespace fpat::ir
