// The dataflow IR: ops are vertices of a bidirectional Boost.Graph, edges carry operand indices.
#pragma once

#include "fpat/ir/Epilogue.h"
#include "fpat/ir/Family.h"
#include "fpat/ir/Types.h"
#include "fpat/support/Diagnostics.h"

#include <boost/graph/adjacency_list.hpp>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

namespace fpat::ir {

// Input..Fused are the ops of an MLP block; Constant..ReduceMean are the generic elementwise
// ops and row reduction that imported graphs hold before raising (and run unfused after it);
// Softmax is attention's row-wise op; Slice, AttnQk, AttnPv and Attention are attention's
// layout and head ops (activations stay token-major [B*S, H*d]; head h of a token is its
// column block [h*d, (h+1)*d)).
enum class OpKind {
  Input,
  Gemm,
  BiasAdd,
  Activation,
  Add,
  Mul,
  LayerNorm,
  RmsNorm,
  Fused,
  Constant, // a tensor every element of which is `value`
  Sub,      // add, mul, sub, div, pow broadcast as NumPy does (trailing dimensions)
  Div,
  Pow,
  ReduceMean, // mean over the last dimension, kept as a dimension of size 1
  Softmax,    // exp(x - max) / sum(exp(x - max)) over the last dimension, in f32 or wider
  Slice,      // columns [begin, end) of the last dimension
  AttnQk,     // per batch and head, Q K^T: [B*Sq, H*d], [B*Sk, Hkv*d] -> [B, H, Sq, Sk]
  AttnPv,     // per batch and head, P V: [B, H, Sq, Sk], [B*Sk, Hkv*d] -> [B*Sq, H*d]
  Attention,  // attn_pv(softmax(attn_qk(q, k) * scale + bias), v) in one op; K and V of
              // these three may also be caches [B, Hkv, Sk, d] (kv_append's results)
  Heads,      // [B*S, H*d] seen as [B, S, H, d] (the same elements in the same order)
  MergeHeads, // [B, S, H, d] seen as [B*S, H*d]
  Concat,     // the operands side by side along the last dimension
  Rope,       // x * cos + rotate_half(x) * sin; rotate_half(x) = (-x2, x1) over x's halves,
              // or (interleaved, GPT-J's rotate_every_two) (-x[2i+1], x[2i]) over pairs
  Max,        // the larger and the smaller of two operands, broadcast as add is (ONNX's Max
  Min,        // and Min: OPT's clamp of its scores, T5's bucket arithmetic)
  BatchFirst, // rows of [S*B, E] in sequence-first order, (s, b), reordered to (b, s): [B*S, E]
  SeqFirst,   // the inverse: rows (b, s) of [B*S, E] reordered to (s, b); both take batch = B
  KvAppend,   // a key or value cache [B, Hkv, P, d] (head-major, as exporters give past_key)
              // with the new tokens' [B*S, Hkv*d] (token-major; or [B, S, Hkv, d]) appended
              // along its sequence: [B, Hkv, P+S, d] (present_key); or, with batch = B, a
              // token-major cache [B*P, E] with [B*S, E]: [B*(P+S), E] (GPTBigCode's)
};

/// The sizes an attention op (attn_qk, attn_pv, attention) works on, from its operands'
/// types and its batch and head_dim: query and key rows per batch, query and KV heads.
struct AttnShape {
  int64_t batch = 0, sq = 0, sk = 0, heads = 0, kvHeads = 0, headDim = 0;
  // K and V are caches [B, Hkv, Sk, d] (kv_append's results), not token-major [B*Sk, Hkv*d]:
  // the rows of one KV head are contiguous, d elements apart.
  bool kvHeadMajor = false;
};

/// Whether `k` is one of the broadcasting binary elementwise ops.
bool isBinaryElementwise(OpKind k);
/// `x k y` in double for a binary elementwise op `k` (the reference, and constants folded
/// wherever they are: the importer, raising).
double applyBinary(OpKind k, double x, double y);
/// The NumPy broadcast of two shapes, or nullopt when they do not broadcast.
std::optional<std::vector<int64_t>> broadcastShapes(const std::vector<int64_t>& a,
                                                    const std::vector<int64_t>& b);

/// The op registry: name and operand count of every kind (`maxOperands < 0`: variadic).
struct OpKindInfo {
  OpKind kind;
  const char* name;
  int minOperands;
  int maxOperands;
};
const std::vector<OpKindInfo>& opKinds();
const OpKindInfo& opKindInfo(OpKind k);
const char* opKindName(OpKind k);
/// Ops whose result is their operand's bytes seen with another shape (heads, merge_heads): no
/// kernel computes them; the runtime gives them their operand's buffer.
inline bool isView(OpKind k) {
  return k == OpKind::Heads || k == OpKind::MergeHeads;
}
std::optional<OpKind> parseOpKind(std::string_view name);
inline std::ostream& operator<<(std::ostream& os, OpKind k) {
  return os << opKindName(k);
}

/// Attributes of a fused op, filled in by the rewriter. Operands are in kernel order: the main
/// computation's operands first (gemm: A, B; norm_gemm: x, gamma[, beta], B; the dual
/// families the same with Bg, Bu for B), then those the epilogue reads, in order of first use.
struct FusedAttrs {
  std::string pattern; // fusion pattern name
  std::string family;  // kernel family that implements it
  std::string norm;    // norm_gemm: "layernorm" or "rmsnorm"
  Epilogue epilogue;   // the elementwise part of the match, over the accumulator
  bool operator==(const FusedAttrs&) const = default;
};

struct Op {
  OpKind kind = OpKind::Input;
  std::string name;    // value name, without '%'
  TensorDesc type;     // result type (inferred; given for inputs)
  bool weight = false; // input: a constant of the model (its weights)
  bool mask = false;   // input: 0 or 1 (an integer or bool mask the model casts to float)
  std::shared_ptr<const std::vector<float>> data; // weight: its values (else given at run time)
  double value = 0;                               // constant: the value of every element
  std::string origin;                   // imported ops: the node they came from, for messages
  bool transposeB = false;              // gemm: B is stored [N, K]
  std::string fn;                       // activation name
  std::map<std::string, double> params; // activation parameters (e.g. a leaky-ReLU slope)
  double eps = 1e-5;                    // layernorm / rmsnorm
  int64_t begin = 0, end = 0;           // slice: the columns kept
  bool interleaved = false;             // rope: rotate pairs (x[2i], x[2i+1]), not halves
  int64_t batch = 0, headDim = 0;       // attn_qk, attn_pv, attention: B and d (batch also
                                        // batch_first and seq_first's B)
  FusedAttrs fused;                     // fused ops only
  SourceLoc loc;                        // where it was defined, when it came from text
};

/// The normalisation a norm_gemm op applies to its A (None for every other op).
enum class NormKind : uint8_t { None, LayerNorm, RmsNorm };
NormKind normKindOf(const Op& op);

/// The operand index of a GEMM-family op's B (its main operands are 0 .. that index): gemm
/// A, B; norm_gemm x, gamma, B (rmsnorm) or x, gamma, beta, B (layernorm). The one place that
/// layout is written down; the rewriter, type inference, the reference and codegen use it.
size_t gemmBIndex(const Op& op);
/// The number of main operands: gemmBIndex(op) + 1, or + 2 for the dual families (Bg, Bu).
/// (Both ask the op's family, KernelFamily::bIndex.)
size_t mainOperandCount(const Op& op);

struct Operand {
  unsigned index = 0;
};

using GraphImpl =
    boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, Op, Operand>;
using Vertex = GraphImpl::vertex_descriptor;

/// Thin, value-semantic wrapper around the Boost graph that keeps the graph's name and its
/// ordered list of outputs. Vertices are numbered in creation order, which keeps every
/// traversal deterministic.
class Graph {
public:
  explicit Graph(std::string name = "g") : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  void setName(std::string n) { name_ = std::move(n); }

  /// Adds an op whose operands are `operands[i]` (operand index i). No checks are made here;
  /// `inferTypes`/`validate` do that.
  Vertex addOp(Op op, const std::vector<Vertex>& operands);
  /// Adds a raw edge `producer -> consumer` as operand `index` (used to build broken graphs in
  /// tests, e.g. cycles).
  void connect(Vertex producer, Vertex consumer, unsigned index);

  size_t size() const { return boost::num_vertices(g_); }
  const Op& op(Vertex v) const { return g_[v]; }
  Op& op(Vertex v) { return g_[v]; }
  /// Operands of `v` ordered by operand index.
  std::vector<Vertex> operands(Vertex v) const;
  /// Distinct consumers of `v`, in vertex order.
  std::vector<Vertex> users(Vertex v) const;
  /// Number of uses: operand slots reading `v` plus graph outputs naming it.
  size_t useCount(Vertex v) const;

  void addOutput(Vertex v) { outputs_.push_back(v); }
  const std::vector<Vertex>& outputs() const { return outputs_; }
  bool isOutput(Vertex v) const;
  std::optional<Vertex> find(std::string_view name) const;
  std::vector<Vertex> vertices() const;

  const GraphImpl& impl() const { return g_; }
  GraphImpl& impl() { return g_; }

private:
  std::string name_;
  GraphImpl g_;
  std::vector<Vertex> outputs_;
};

/// Value names a rewrite may give new ops: `base` where the graph has no such name, else base2,
/// base3, ... (each handed out once).
class FreshNames {
public:
  explicit FreshNames(const Graph& g);
  std::string operator()(const std::string& base);

private:
  std::set<std::string> taken_;
};

/// Operand name and type, as type inference sees them.
struct OperandInfo {
  std::string name;
  TensorDesc type;
};

/// "operand i (%name: type)", for messages about operand i.
std::string operandRef(const std::vector<OperandInfo>& ops, size_t i);

/// Why an op's operands do not fit it. `operand` is the offending operand index, or -1.
struct TypeError {
  int operand = -1;
  std::string message;
};

/// Set of activation names the IR accepts (built-ins plus those defined in `.fpat`).
class ActivationSet {
public:
  static const ActivationSet& builtin();
  /// Adds `name` with its parameter names, or replaces the parameters of a known name.
  void add(std::string name, std::vector<std::string> params = {});
  bool contains(std::string_view name) const;
  const std::vector<std::string>& names() const { return names_; }
  /// The parameter names of `name` (empty for unknown names).
  const std::vector<std::string>& params(std::string_view name) const;

private:
  std::vector<std::string> names_;
  std::vector<std::vector<std::string>> params_; // parallel to names_
};

/// Result type of `op` applied to `operands`, or the reason it is ill-typed. Messages name the
/// op, the operand and expected vs actual.
std::optional<TensorDesc> inferType(const Op& op, const std::vector<OperandInfo>& operands,
                                    TypeError& err,
                                    const ActivationSet& acts = ActivationSet::builtin());

/// The sizes of an attention op (attn_qk, attn_pv, attention) over its operands, or nullopt
/// with the reason (`operand`: the offending operand, or -1).
std::optional<AttnShape> attnShape(const Op& op, const std::vector<OperandInfo>& operands,
                                   std::string& why, int& operand);
/// The same for op `v` of `g` (its operands' names and types).
std::optional<AttnShape> attnShape(const Graph& g, Vertex v, std::string& why);

/// kv_append's sizes (valid ops only): its cache [B, Hkv, P, d] and S new tokens a batch; a
/// token-major cache [B*P, E] is one head of E, [B, 1, P, E] (the same elements).
struct KvAppendDims {
  int64_t batch = 0, kvHeads = 0, past = 0, fresh = 0, headDim = 0;
};
KvAppendDims kvAppendDims(const Op& op, const std::vector<int64_t>& cache,
                          const std::vector<int64_t>& out);

/// Whether every reader of `v`, directly or through heads / merge_heads views, takes its rows
/// at a pitch: attention reading it as q, k or v, rope as its x; and no graph output names it.
/// With `rejoinedRopes`, heads read only by a partial rotary and its concat (ropedAndRejoined)
/// count as read in place where the concat's readers read it so (match::ropeIntoEpilogues makes
/// the concat a view).
bool readInPlace(const Graph& g, Vertex v, bool rejoinedRopes = false);
/// The concat that puts heads `h` back together after a rope of their first part,
/// concat(rope(h[..., :d]), h[..., d:]) (partial rotary: GPT-NeoX, GPT-J, Phi-2), or nullopt.
std::optional<Vertex> ropedAndRejoined(const Graph& g, Vertex h);
/// A slice no kernel copies: its readers read the columns where they lie (readInPlace), its
/// start and its operand's width multiples of 8 elements (TMA's 16-byte alignment). GPT-2's,
/// BLOOM's and torch's fused QKV projections: q, k and v are column blocks of it.
bool isColumnView(const Graph& g, Vertex v);
/// The column view whose buffer `v` is (itself, or through heads / merge_heads), or nullopt.
std::optional<Vertex> columnViewOf(const Graph& g, Vertex v);
/// Elements from one token row of `v`'s buffer to the next: the projection's width for (a view
/// of) a column view, else a token's width (the last dimension; H * d of [B, S, H, d]).
int64_t rowPitch(const Graph& g, Vertex v);

/// A projection's weight values (or bias, `rowsOfN` false and one row) with their C = H P d
/// columns reordered from (head, part, d) to (part, head, d): the rows of an [N, K] weight
/// where `rowsOfN`. GPT-NeoX's and BLOOM's q, k and v side by side in each head become blocks
/// of columns (match::reorderHeadParts, and BLOOM's import).
std::vector<float> headPartsToColumns(const std::vector<float>& w, int64_t H, int64_t P, int64_t d,
                                      bool rowsOfN);

/// Values that stay the same from run to run: weights, constants, and ops all of whose operands
/// are such values. fpat computes the ops among them once per set of weights, when the weights
/// are prepared (constant folding over weights), not on every run. By vertex.
std::vector<bool> weightOnly(const Graph& g);
/// The same for one value.
bool isWeightOnly(const Graph& g, Vertex v);

/// Topological order of all ops (operands before users). On a cycle, returns nullopt and
/// fills `cycle` with the ops that lie on one.
std::optional<std::vector<Vertex>> topologicalOrder(const Graph& g,
                                                    std::vector<Vertex>* cycle = nullptr);

/// A topological order that is stable for printing and rewriting: creation order when that
/// is already topological (always, for parsed and built graphs), else `topologicalOrder`.
std::optional<std::vector<Vertex>> stableOrder(const Graph& g);

/// Checks the whole graph: arity, operand indices, acyclicity, inferred vs recorded types,
/// names, outputs. Returns one message per problem; empty means valid.
std::vector<std::string> validate(const Graph& g,
                                  const ActivationSet& acts = ActivationSet::builtin());

/// Re-infers every op's result type in topological order (inputs keep theirs). Returns the
/// problems found, as `validate` does.
std::vector<std::string> inferTypes(Graph& g, const ActivationSet& acts = ActivationSet::builtin());

/// A group of ops drawn inside one labelled box (e.g. the ops one fused op absorbed).
struct DotCluster {
  std::string label;
  std::vector<Vertex> members;
};

/// Graphviz rendering: ops as nodes (kind, name, attributes), tensor shapes on edges, and
/// each cluster as a filled box around its members. Deterministic.
void writeDot(const Graph& g, std::ostream& os, const std::vector<DotCluster>& clusters = {});

/// One-line description of an op's attributes (`{eps = 1e-05}`, `{fn = gelu}`), or "".
std::string attrString(const Op& op);

} // namespace fpat::ir
