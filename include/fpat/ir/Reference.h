// The CPU reference interpreter: the oracle every GPU result is validated against.
#pragma once

#include "fpat/ir/Graph.h"

#include <functional>
#include <map>

namespace fpat::ir {

/// A host tensor. Values are held as float; f16 tensors hold only values representable in
/// binary16 (storage semantics), f32 tensors any float.
struct Tensor {
  TensorDesc desc;
  std::vector<float> data;
};

/// Input values by name.
using InputMap = std::map<std::string, Tensor>;

/// Scalar activation: x and the op's parameters to f(x), evaluated in double.
using ActivationFn = std::function<double(double, const std::map<std::string, double>&)>;

/// The activation functions the reference knows, by name. `.fpat` bodies are added here by the
/// pattern library, so the reference evaluates user-defined activations too.
class ActivationLibrary {
public:
  /// gelu (tanh approximation), gelu_erf, silu, relu.
  static const ActivationLibrary& builtin();
  void add(const std::string& name, ActivationFn fn) { fns_[name] = std::move(fn); }
  const ActivationFn* find(const std::string& name) const;
  ActivationSet names() const;

private:
  std::map<std::string, ActivationFn> fns_;
};

/// The built-in activations as plain functions, for tests and for other oracles.
double geluTanh(double x);
double geluErf(double x);
double silu(double x);
double relu(double x);

/// Deterministic uniform values in [lo, hi), rounded to the tensor's dtype.
Tensor randomTensor(const TensorDesc& desc, uint64_t seed, double lo = -1.0, double hi = 1.0);
/// A padding mask of 0s and 1s: each row along the last axis ones, then a random run of zeros
/// short of the whole row.
Tensor randomMask(const TensorDesc& desc, uint64_t seed);
/// One random tensor per input op, seeded by `seed` and the input's position in the graph
/// (masks: randomMask).
std::map<std::string, Tensor> randomInputs(const Graph& g, uint64_t seed);

class ReferenceError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Evaluates every op of a valid graph; the result is indexed by vertex. Arithmetic is done in
/// double (GEMM accumulation included) and each result is rounded to its dtype. Throws
/// ReferenceError for a missing or mis-shaped input or an unknown activation.
/// `progress`, when given, is called after each op with the seconds it took.
/// `overrides`, when given, holds values that replace those of `inputs` (e.g. the sampled rows
/// of row-carrying inputs); inputs are read where they are, not copied.
using EvalProgress = std::function<void(Vertex, double seconds)>;
std::vector<Tensor> evaluate(const Graph& g, const std::map<std::string, Tensor>& inputs,
                             const ActivationLibrary& acts = ActivationLibrary::builtin(),
                             const EvalProgress& progress = {},
                             const std::map<std::string, Tensor>* overrides = nullptr);

/// Query rows `rows` (b * Sq + i, every head) of attention op `op` with operands `in` (q, k,
/// v, bias, scale): [rows, H d], computed as evaluate() does, for checking a kernel on sampled
/// rows of a real-size attention. Throws ReferenceError for a row out of range.
Tensor attentionRows(const Op& op, const std::vector<const Tensor*>& in,
                     const std::vector<int64_t>& rows);

/// Summary statistics of a tensor, for printing.
struct TensorStats {
  double min = 0, max = 0, mean = 0, rms = 0;
  size_t nonFinite = 0;
};
TensorStats stats(const Tensor& t);

namespace detail {
/// A[m, k] * B in double (B is [k, n], or [n, k] when transB): the kernel families' reference.
std::vector<double> gemmProduct(const Tensor& a, const Tensor& b, bool transB, size_t m, size_t n,
                                size_t k);
/// y = layernorm (or rmsnorm, `rms`) of the rows of x, with gamma (and beta).
void normRows(const Tensor& x, const Tensor& gamma, const Tensor* beta, double eps, bool rms,
              Tensor& y);
} // namespace detail

} // namespace fpat::ir
