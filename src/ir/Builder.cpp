#include "fpat/ir/Builder.h"

namespace fpat::ir {

Value GraphBuilder::append(Op op, const std::vector<Value>& operands, const std::string& name) {
  // (Appending rather than "t" + to_string() dodges a g++ 12 -Wrestrict false positive.)
  op.name = name;
  if (op.name.empty())
    op.name.append("t").append(std::to_string(nextId_++));
  // The builder's own set of names: Graph::find is a scan, and a graph built op by op would
  // be quadratic (78k ops took 40 s).
  if (!names_.insert(op.name).second)
    throw BuildError("value %" + op.name + " is defined more than once");
  std::vector<OperandInfo> ins;
  std::vector<Vertex> vs;
  for (Value v : operands) {
    if (v.v >= g_.size())
      throw BuildError("operand of %" + op.name + " does not belong to this graph");
    ins.push_back({g_.op(v.v).name, g_.op(v.v).type});
    vs.push_back(v.v);
  }
  TypeError err;
  auto t = inferType(op, ins, err, acts_);
  if (!t)
    throw BuildError(err.message);
  op.type = *t;
  return {g_.addOp(std::move(op), vs)};
}

Value GraphBuilder::input(const std::string& name, std::vector<int64_t> shape, DType dtype) {
  // The text form's limits (Parser.cpp): dimensions 1 to 2^40, at most 2^40 elements.
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 1 || d > (int64_t{1} << 40) || n > (int64_t{1} << 40) / d)
      throw BuildError("input %" + name + ": shape out of range (dimensions 1 to " +
                       "2^40, at most 2^40 elements)");
    n *= d;
  }
  Op op;
  op.kind = OpKind::Input;
  op.type = {std::move(shape), dtype};
  return append(std::move(op), {}, name);
}

Value GraphBuilder::weight(const std::string& name, std::vector<int64_t> shape, DType dtype,
                           std::vector<float> values) {
  Value v = input(name, std::move(shape), dtype);
  Op& op = g_.op(v.v);
  op.weight = true;
  if (!values.empty()) {
    if (values.size() != static_cast<size_t>(op.type.numel()))
      throw BuildError("weight %" + name + ": " + std::to_string(values.size()) +
                       " values given for " + op.type.str());
    for (float& x : values)
      x = roundTo(x, dtype);
    op.data = std::make_shared<const std::vector<float>>(std::move(values));
  }
  return v;
}

Value GraphBuilder::constant(double value, std::vector<int64_t> shape, DType dtype,
                             const std::string& name) {
  Op op;
  op.kind = OpKind::Constant;
  op.value = value;
  op.type = {std::move(shape), dtype};
  return append(std::move(op), {}, name);
}

Value GraphBuilder::gemm(Value a, Value b, bool transposeB, const std::string& name) {
  Op op;
  op.kind = OpKind::Gemm;
  op.transposeB = transposeB;
  return append(std::move(op), {a, b}, name);
}

Value GraphBuilder::bias(Value x, Value b, const std::string& name) {
  Op op;
  op.kind = OpKind::BiasAdd;
  return append(std::move(op), {x, b}, name);
}

Value GraphBuilder::activation(Value x, const std::string& fn, const std::string& name) {
  Op op;
  op.kind = OpKind::Activation;
  op.fn = fn;
  return append(std::move(op), {x}, name);
}

Value GraphBuilder::add(Value a, Value b, const std::string& name) {
  Op op;
  op.kind = OpKind::Add;
  return append(std::move(op), {a, b}, name);
}

Value GraphBuilder::mul(Value a, Value b, const std::string& name) {
  Op op;
  op.kind = OpKind::Mul;
  return append(std::move(op), {a, b}, name);
}

Value GraphBuilder::sub(Value a, Value b, const std::string& name) {
  Op op;
  op.kind = OpKind::Sub;
  return append(std::move(op), {a, b}, name);
}

Value GraphBuilder::div(Value a, Value b, const std::string& name) {
  Op op;
  op.kind = OpKind::Div;
  return append(std::move(op), {a, b}, name);
}

Value GraphBuilder::pow(Value a, Value b, const std::string& name) {
  Op op;
  op.kind = OpKind::Pow;
  return append(std::move(op), {a, b}, name);
}

Value GraphBuilder::max(Value a, Value b, const std::string& name) {
  Op op;
  op.kind = OpKind::Max;
  return append(std::move(op), {a, b}, name);
}

Value GraphBuilder::min(Value a, Value b, const std::string& name) {
  Op op;
  op.kind = OpKind::Min;
  return append(std::move(op), {a, b}, name);
}

Value GraphBuilder::reduceMean(Value x, const std::string& name) {
  Op op;
  op.kind = OpKind::ReduceMean;
  return append(std::move(op), {x}, name);
}

Value GraphBuilder::softmax(Value x, const std::string& name) {
  Op op;
  op.kind = OpKind::Softmax;
  return append(std::move(op), {x}, name);
}

Value GraphBuilder::slice(Value x, int64_t begin, int64_t end, const std::string& name) {
  Op op;
  op.kind = OpKind::Slice;
  op.begin = begin;
  op.end = end;
  return append(std::move(op), {x}, name);
}

namespace {
Op attnOp(OpKind k, int64_t batch, int64_t headDim) {
  Op op;
  op.kind = k;
  op.batch = batch;
  op.headDim = headDim;
  return op;
}
} // namespace

Value GraphBuilder::attnQk(Value q, Value k, int64_t batch, int64_t headDim,
                           const std::string& name) {
  return append(attnOp(OpKind::AttnQk, batch, headDim), {q, k}, name);
}

Value GraphBuilder::attnPv(Value p, Value v, int64_t batch, int64_t headDim,
                           const std::string& name) {
  return append(attnOp(OpKind::AttnPv, batch, headDim), {p, v}, name);
}

Value GraphBuilder::heads(Value x, int64_t batch, int64_t headDim, const std::string& name) {
  return append(attnOp(OpKind::Heads, batch, headDim), {x}, name);
}

Value GraphBuilder::mergeHeads(Value x, const std::string& name) {
  Op op;
  op.kind = OpKind::MergeHeads;
  return append(std::move(op), {x}, name);
}

Value GraphBuilder::concat(Value a, Value b, const std::string& name) {
  Op op;
  op.kind = OpKind::Concat;
  return append(std::move(op), {a, b}, name);
}

Value GraphBuilder::batchFirst(Value x, int64_t batch, const std::string& name) {
  return append(attnOp(OpKind::BatchFirst, batch, 0), {x}, name);
}

Value GraphBuilder::seqFirst(Value x, int64_t batch, const std::string& name) {
  return append(attnOp(OpKind::SeqFirst, batch, 0), {x}, name);
}

Value GraphBuilder::kvAppend(Value cache, Value fresh, const std::string& name) {
  Op op;
  op.kind = OpKind::KvAppend;
  return append(std::move(op), {cache, fresh}, name);
}

Value GraphBuilder::kvAppendRows(Value cache, Value fresh, int64_t batch, const std::string& name) {
  Op op;
  op.kind = OpKind::KvAppend;
  op.batch = batch;
  return append(std::move(op), {cache, fresh}, name);
}

Value GraphBuilder::rope(Value x, Value cos, Value sin, const std::string& name, bool interleaved) {
  Op op;
  op.kind = OpKind::Rope;
  op.interleaved = interleaved;
  return append(std::move(op), {x, cos, sin}, name);
}

Value GraphBuilder::attention(Value q, Value k, Value v, Value bias, Value scale, int64_t batch,
                              int64_t headDim, const std::string& name) {
  return append(attnOp(OpKind::Attention, batch, headDim), {q, k, v, bias, scale}, name);
}

Value GraphBuilder::layernorm(Value x, Value gamma, Value beta, double eps,
                              const std::string& name) {
  Op op;
  op.kind = OpKind::LayerNorm;
  op.eps = eps;
  return append(std::move(op), {x, gamma, beta}, name);
}

Value GraphBuilder::rmsnorm(Value x, Value gamma, double eps, const std::string& name) {
  Op op;
  op.kind = OpKind::RmsNorm;
  op.eps = eps;
  return append(std::move(op), {x, gamma}, name);
}

GraphBuilder& GraphBuilder::output(Value v) {
  if (v.v >= g_.size())
    throw BuildError("output value does not belong to this graph");
  g_.addOutput(v.v);
  return *this;
}

Graph GraphBuilder::build() const {
  auto problems = validate(g_, acts_);
  if (!problems.empty()) {
    std::string msg = "invalid graph " + g_.name() + ":";
    for (auto& p : problems)
      msg += "\n  " + p;
    throw BuildError(msg);
  }
  return g_;
}

} // namespace fpat::ir
