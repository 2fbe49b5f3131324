#include "fpat/ir/Rows.h"

namespace fpat::ir {
namespace {

enum class Role { Same, Whole }; // an operand carries the op's rows, or is read whole

/// The role of each operand of `op` (see Rows.h): the main operand and anything of the
/// output's shape carry the rows, weights and vectors are read whole.
std::vector<Role> operandRoles(const Graph& g, Vertex v) {
  const Op& op = g.op(v);
  const std::vector<Vertex> ops = g.operands(v);
  std::vector<Role> roles(ops.size(), Role::Whole);
  switch (op.kind) {
  case OpKind::Gemm:
  case OpKind::BiasAdd:
  case OpKind::LayerNorm:
  case OpKind::RmsNorm:
    roles.at(0) = Role::Same;
    break;
  case OpKind::Input:
  case OpKind::Constant:
    break;
  case OpKind::Activation:
  case OpKind::ReduceMean:
  case OpKind::Softmax:
  case OpKind::Slice:
  case OpKind::Concat:
    std::fill(roles.begin(), roles.end(), Role::Same);
    break;
  case OpKind::Heads:
  case OpKind::MergeHeads:
  case OpKind::Rope:
    // Rank 4 [B, S, H, d]: rows are not the operand's rows (sampleRows needs matrices).
    break;
  case OpKind::BatchFirst:
  case OpKind::SeqFirst:
  case OpKind::KvAppend:
    // Rows reordered: a result row is another operand row (sampleRows declines them).
    break;
  case OpKind::AttnQk:
  case OpKind::AttnPv:
  case OpKind::Attention:
    // A query row needs every key row of its batch, and the results' rows are not the
    // operands' rows: sampleRows declines graphs where rows reach these.
    break;
  case OpKind::Add:
  case OpKind::Mul:
  case OpKind::Sub:
  case OpKind::Div:
  case OpKind::Pow:
  case OpKind::Max:
  case OpKind::Min:
    // A matrix operand with the result's rows carries them ([M, N] or [M, 1]); vectors,
    // scalars and [1, N] rows broadcast over all rows are read whole.
    for (size_t i = 0; i < ops.size(); ++i) {
      const TensorDesc& t = g.op(ops[i]).type;
      if (op.type.rank() == 2 && t.rank() == 2 && t.shape[0] == op.type.shape[0])
        roles[i] = Role::Same;
    }
    break;
  case OpKind::Fused: {
    roles.at(0) = Role::Same;                  // A (norm_gemm: x)
    const size_t first = mainOperandCount(op); // the epilogue's operands
    for (size_t i = first; i < ops.size(); ++i)
      if (g.op(ops[i]).type.rank() == 2)
        roles[i] = Role::Same;
    break;
  }
  }
  return roles;
}

} // namespace

std::optional<RowSample> sampleRows(const Graph& g, size_t count, std::string* why) {
  auto fail = [&](const std::string& reason) -> std::optional<RowSample> {
    if (why)
      *why = reason;
    return std::nullopt;
  };
  auto order = topologicalOrder(g);
  if (!order || count == 0)
    return fail("no order");
  // Backwards from the outputs, which carry rows: each value's state follows from its users.
  enum State : uint8_t { Unused, Rows, Whole };
  std::vector<State> state(g.size(), Unused);
  for (Vertex o : g.outputs())
    state[o] = Rows;
  for (auto it = order->rbegin(); it != order->rend(); ++it) {
    const Vertex v = *it;
    if (state[v] == Unused)
      continue;
    const OpKind k = g.op(v).kind;
    if (k == OpKind::AttnQk || k == OpKind::AttnPv || k == OpKind::Attention ||
        k == OpKind::Heads || k == OpKind::MergeHeads || k == OpKind::Rope)
      return fail("%" + g.op(v).name + " is attention's, whose rows are not its operands' rows");
    if (k == OpKind::Fused && g.op(v).fused.epilogue.hasRope())
      return fail("%" + g.op(v).name + "'s rope reads its tables at each row's position");
    const std::vector<Vertex> ops = g.operands(v);
    const std::vector<Role> roles = operandRoles(g, v);
    for (size_t i = 0; i < ops.size(); ++i) {
      const State want = roles[i] == Role::Whole ? Whole : state[v];
      if (state[ops[i]] != Unused && state[ops[i]] != want)
        return fail("%" + g.op(ops[i]).name + " is used both row by row and whole");
      state[ops[i]] = want;
    }
  }
  RowSample s;
  s.graph = g;
  for (Vertex v : *order) {
    if (state[v] != Rows)
      continue;
    const TensorDesc& t = g.op(v).type;
    if (t.rank() != 2)
      return fail("%" + g.op(v).name + " is not a matrix");
    if (s.rows == 0)
      s.rows = t.shape[0];
    else if (t.shape[0] != s.rows)
      return fail("%" + g.op(v).name + " has " + std::to_string(t.shape[0]) + " rows, not " +
                  std::to_string(s.rows));
    s.carrying.insert(v);
  }
  if (s.rows == 0)
    return fail("no row-carrying values");
  const size_t m = static_cast<size_t>(s.rows);
  const size_t n = std::min(count, m);
  for (size_t i = 0; i < n; ++i)
    s.picked.push_back(static_cast<int64_t>(n == 1 ? 0 : i * (m - 1) / (n - 1)));
  for (Vertex v : s.carrying)
    s.graph.op(v).type.shape[0] = static_cast<int64_t>(n);
  return s;
}

Tensor sliceRows(const Tensor& t, const std::vector<int64_t>& rows) {
  const size_t width = t.desc.shape.empty() || t.desc.shape[0] == 0
                           ? 0
                           : t.data.size() / static_cast<size_t>(t.desc.shape[0]);
  Tensor out{t.desc, {}};
  out.desc.shape[0] = static_cast<int64_t>(rows.size());
  out.data.reserve(rows.size() * width);
  for (int64_t r : rows)
    out.data.insert(out.data.end(), t.data.begin() + static_cast<long>(r * width),
                    t.data.begin() + static_cast<long>((r + 1) * width));
  return out;
}

std::map<std::string, Tensor> sliceInputs(const Graph& g, const RowSample& s,
                                          const std::map<std::string, Tensor>& inputs) {
  std::map<std::string, Tensor> out;
  for (Vertex v : s.carrying)
    if (g.op(v).kind == OpKind::Input)
      if (auto it = inputs.find(g.op(v).name); it != inputs.end())
        out[it->first] = sliceRows(it->second, s.picked);
  return out;
}

} // namespace fpat::ir
