// Fluent C++ construction of IR graphs; every op is type-checked as it is added.
#pragma once

#include "fpat/ir/Graph.h"

#include <stdexcept>
#include <string>
#include <unordered_set>

namespace fpat::ir {

/// Thrown by GraphBuilder for a user mistake (ill-typed op, invalid graph).
class BuildError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// A handle to a value under construction.
struct Value {
  Vertex v;
};

/// Example:
///   GraphBuilder b("example");
///   Value x = b.input("x", {1024, 4096}), w = b.input("w", {4096, 4096});
///   b.output(b.activation(b.bias(b.gemm(x, w), b.input("b", {4096})), "gelu"));
///   Graph g = b.build();
class GraphBuilder {
public:
  explicit GraphBuilder(std::string name, const ActivationSet& acts = ActivationSet::builtin())
      : g_(std::move(name)), acts_(acts) {}

  Value input(const std::string& name, std::vector<int64_t> shape, DType dtype = DType::F16);
  /// A weight: an input whose values are part of the model (`values` empty: given at run
  /// time like an input's). Values are rounded to `dtype` as they are stored.
  Value weight(const std::string& name, std::vector<int64_t> shape, DType dtype = DType::F16,
               std::vector<float> values = {});
  /// A tensor of `shape` (rank 0 for a scalar) every element of which is `value`.
  Value constant(double value, std::vector<int64_t> shape = {}, DType dtype = DType::F16,
                 const std::string& name = "");
  Value gemm(Value a, Value b, bool transposeB = false, const std::string& name = "");
  Value bias(Value x, Value b, const std::string& name = "");
  Value activation(Value x, const std::string& fn, const std::string& name = "");
  Value add(Value a, Value b, const std::string& name = "");
  Value mul(Value a, Value b, const std::string& name = "");
  /// Broadcasting elementwise ops (add and mul above broadcast too).
  Value sub(Value a, Value b, const std::string& name = "");
  Value div(Value a, Value b, const std::string& name = "");
  Value pow(Value a, Value b, const std::string& name = "");
  Value max(Value a, Value b, const std::string& name = "");
  Value min(Value a, Value b, const std::string& name = "");
  /// Mean over the last dimension, kept with size 1.
  Value reduceMean(Value x, const std::string& name = "");
  Value softmax(Value x, const std::string& name = ""); // over the last dimension
  /// Columns [begin, end) of the last dimension.
  Value slice(Value x, int64_t begin, int64_t end, const std::string& name = "");
  /// Attention on token-major activations (q [B*Sq, H*d], k and v [B*Sk, Hkv*d]): the per-head
  /// scores Q K^T [B, H, Sq, Sk], P V back to [B*Sq, H*d], and the whole
  /// softmax(scale * Q K^T + bias) V (bias broadcast to the scores; scale a scalar).
  Value attnQk(Value q, Value k, int64_t batch, int64_t headDim, const std::string& name = "");
  Value attnPv(Value p, Value v, int64_t batch, int64_t headDim, const std::string& name = "");
  Value attention(Value q, Value k, Value v, Value bias, Value scale, int64_t batch,
                  int64_t headDim, const std::string& name = "");
  /// [B*S, H*d] seen as [B, S, H, d], and back (views: the same elements in the same order).
  Value heads(Value x, int64_t batch, int64_t headDim, const std::string& name = "");
  Value mergeHeads(Value x, const std::string& name = "");
  /// a and b side by side along the last dimension.
  Value concat(Value a, Value b, const std::string& name = "");
  /// Token rows of `x` reordered: sequence-first [S*B, E] to batch-first [B*S, E], or back.
  Value batchFirst(Value x, int64_t batch, const std::string& name = "");
  Value seqFirst(Value x, int64_t batch, const std::string& name = "");
  /// A cache [B, Hkv, P, d] with the new tokens' keys or values appended: [B, Hkv, P+S, d].
  Value kvAppend(Value cache, Value fresh, const std::string& name = "");
  /// kv_append of a token-major cache [B*P, E] and the new tokens' [B*S, E].
  Value kvAppendRows(Value cache, Value fresh, int64_t batch, const std::string& name = "");
  /// Rotary embedding, rotate_half form: x * cos + rotate_half(x) * sin.
  Value rope(Value x, Value cos, Value sin, const std::string& name = "", bool interleaved = false);
  Value layernorm(Value x, Value gamma, Value beta, double eps = 1e-5,
                  const std::string& name = "");
  Value rmsnorm(Value x, Value gamma, double eps = 1e-5, const std::string& name = "");
  GraphBuilder& output(Value v);

  const TensorDesc& type(Value v) const { return g_.op(v.v).type; }
  /// Validates and returns the graph; throws BuildError listing every problem.
  Graph build() const;

private:
  Value append(Op op, const std::vector<Value>& operands, const std::string& name);

  Graph g_;
  ActivationSet acts_; // a copy, so a temporary set may be passed
  int nextId_ = 0;
  std::unordered_set<std::string> names_; // of the values so far
};

} // namespace fpat::ir
