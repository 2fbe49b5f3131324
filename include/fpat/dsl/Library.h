// What the backends understand: ops, activations and fusion patterns, extracted from records
// and checked against the IR.
#pragma once

#include "fpat/dsl/Records.h"
#include "fpat/ir/Graph.h"
#include "fpat/ir/Reference.h"

#include <map>
#include <span>
#include <string_view>

namespace fpat::dsl {

/// An activation body compiled to a small stack program, for fast evaluation on the CPU.
struct CompiledExpr {
  enum Op : uint8_t {
    Const,
    X,
    Param,
    Local,
    Store,
    Neg,
    Add,
    Sub,
    Mul,
    Div,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    Select,
    Exp,
    Log,
    Tanh,
    Erf,
    Sqrt,
    Rsqrt,
    Abs,
    Min,
    Max,
    Pow
  };
  struct Instr {
    Op op;
    int index = 0;    // Param / Local / Store slot
    double value = 0; // Const
  };
  std::vector<Instr> code;
  int numLocals = 0;
  double eval(double x, const double* params) const;
};

struct ActivationDef {
  std::string name;
  std::vector<std::string> paramNames;
  std::vector<double> paramDefaults;
  std::shared_ptr<const Expr> body;
  CompiledExpr compiled;
  SourceLoc loc;
  std::string where; // "file:line" of the def, for generated comments
};

/// A node of a match tree: an op (with operands) or a leaf binding.
struct MatchNode {
  bool leaf = false;
  ir::OpKind kind = ir::OpKind::Input;
  std::string fn; // activation name when kind == Activation
  bool commutative = false;
  std::string binding;   // leaf: its $name; op: optional `(...):$name`
  bool constant = false; // leaf: a numeric literal, matching a constant of that value (raising)
  double value = 0;
  std::vector<MatchNode> operands;
  std::vector<MatchNode> attrs; // raise results: attribute values (eps; activation params)
  SourceLoc loc;
};

struct Constraint {
  enum Kind { Dtype, Divisible, Rank, Half, Weight, Layout, Pairs } kind;
  std::string binding;
  ir::DType dtype = ir::DType::F16;
  int dim = 0; // Rank: the rank; Half: which half; Layout: 1 when B is [N, K]; Pairs: 1 pairs
  int64_t divisor = 1;
  SourceLoc loc;
  bool operator==(const Constraint& o) const {
    return kind == o.kind && binding == o.binding && dtype == o.dtype && dim == o.dim &&
           divisor == o.divisor;
  }
};

struct EpilogueStepDef {
  std::string kind;    // bias, activation, residual, scale
  std::string fn;      // activation
  std::string binding; // the leaf it reads
  SourceLoc loc;
};

struct PatternDef {
  std::string name;
  MatchNode root;
  std::vector<std::string> inputs; // leaf bindings in first-occurrence order: fused operands
  std::vector<EpilogueStepDef> epilogue;
  std::vector<Constraint> constraints;
  std::string family;
  int benefit = 0;
  bool singleUse = true;
  int numOps = 0;
  int order = 0; // source order
  SourceLoc loc;
  MatchNode result; // Raise and Rewrite patterns: the IR ops the match becomes
};

struct OpDef {
  std::string name;
  ir::OpKind kind;
  int operands = 0;
  bool commutative = false;
  SourceLoc loc;
};

struct PatternLibrary {
  std::vector<OpDef> ops;
  std::vector<ActivationDef> activations;
  std::vector<PatternDef> patterns; // source order
  std::vector<PatternDef> raises;   // Raise patterns, source order: run before fusion
  std::vector<PatternDef> rewrites; // Rewrite patterns, source order: run after raising
  const ActivationDef* findActivation(const std::string& n) const;
  /// Names the IR accepts in `activation {fn = ...}`: the built-ins plus these.
  ir::ActivationSet activationSet() const;
  /// The reference's activation functions extended with these bodies.
  ir::ActivationLibrary referenceActivations() const;
};

/// The activation definitions: all that code generation, the runtime and the tuner read of a
/// library (the patterns and ops are the matcher's).
using Activations = std::span<const ActivationDef>;
/// The definition named `name`, or null.
const ActivationDef* findActivation(Activations defs, std::string_view name);
/// The reference's activation functions extended with these bodies (each replaces a built-in
/// of its name).
ir::ActivationLibrary referenceActivations(Activations defs);

/// Extracts and checks the vocabulary. Errors (unknown op, arity mismatch, unbound binding,
/// unknown intrinsic, ...) go to `diags`.
bool buildLibrary(const RecordKeeper& rk, DiagEngine& diags, PatternLibrary& out,
                  bool anyFamily = false);

/// The named constants the bodies may use (pi, e) and their values.
const std::map<std::string, double>& namedConstants();
/// The functions expression bodies may call (exp, tanh, ...), e.g. for editor grammars.
std::vector<std::string> intrinsicNames();

/// A whole .fpat compilation: records plus library, as fpat-tblgen and fpatc use it.
struct Compilation {
  std::unique_ptr<RecordKeeper> records;
  PatternLibrary library;
  std::vector<std::string> dependencies;
};
std::optional<Compilation> compileFpat(int fileId, SourceManager& sm, DiagEngine& diags,
                                       const CompileOptions& opts);
/// The built-in patterns embedded in the binary ("patterns/all.fpat" and what it includes),
/// compiled into `sm`/`diags`: no source tree needed.
std::optional<Compilation> compileBuiltinPatterns(SourceManager& sm, DiagEngine& diags);

} // namespace fpat::dsl
