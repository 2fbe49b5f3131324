// A fused op's epilogue: the elementwise part of its matched subgraph, kept as an expression
// over the main computation's accumulator and the op's operands. The code generator compiles
// it into the kernel and the CPU reference evaluates it, so both follow the match itself.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace fpat::ir {

enum class EpiKind : uint8_t {
  Acc,        // an accumulator of the main computation: the GEMM's (`acc`), or the dual GEMM's
              // second (`acc2`, operand == 1)
  Operand,    // a fused-op operand: [N] (broadcast over rows) or [M, N]
  BiasAdd,    // lhs [M, N] + rhs [N]
  Add,        // lhs + rhs, same shape
  Mul,        // lhs * rhs, same shape
  Activation, // fn(lhs; params)
  Rope,       // rotary embedding, interleaved form, of lhs's columns [begin, end) (params):
              // the pair (c, c + 1) at row r, j = (c - begin) % head even and j < d, becomes
              // (x c - y s, y c' + x s') with cosines c, c' and sines s, s' of operands
              // `operand` and `operand2` ([R, d]: row r % R, column j); other columns pass
              // unchanged. `head` (param; default d): the columns of a head, whose first d
              // rotate (partial rotary). It reads a column's partner: kernels evaluate it on
              // column pairs only.
};

struct EpilogueNode {
  EpiKind kind = EpiKind::Acc;
  int lhs = -1, rhs = -1;               // child nodes (Activation: lhs only)
  int operand = -1;                     // Operand: index into the fused op's operands; Acc: 1
                                        // for the second GEMM's accumulator, else -1; Rope:
                                        // the cosines' operand
  std::string fn;                       // Activation: its name
  std::map<std::string, double> params; // Activation: parameters given (the rest default);
                                        // Rope: begin, end and head
  int operand2 = -1;                    // Rope: the sines' operand
  bool operator==(const EpilogueNode&) const = default;
};

/// Nodes in evaluation order (children before parents); the last one is the result. No nodes:
/// the result is the accumulator.
struct Epilogue {
  std::vector<EpilogueNode> nodes;
  bool operator==(const Epilogue&) const = default;

  bool identity() const { return nodes.empty(); }
  /// Adds a node and returns its index.
  int add(EpilogueNode n);
  /// Distinct operand indices, in order of first use.
  std::vector<int> operands() const;
  /// Whether a node reads the second GEMM's accumulator (`acc2`, the dual-GEMM families).
  bool readsSecondAcc() const;
  /// Activation names, in order of first use (with repeats removed).
  std::vector<std::string> activations() const;
  /// Whether a node is a rope (its kernels evaluate it on column pairs only).
  bool hasRope() const;
};

/// The same expression in canonical form: the operands of add and mul ordered (the one that
/// reads the accumulator first, else by text), nodes in post-order from the result with shared
/// nodes kept once. Equal expressions written in either operand order become equal.
Epilogue canonicalize(const Epilogue& e);

/// The text form, e.g. `gelu(bias_add(acc, $2))`, `leaky_relu(acc, slope = 0.5)` or
/// `rope(acc, $3, $4, begin = 0, end = 96)` (cosines $3, sines $4). Shared
/// subexpressions are written out at each use.
std::string printEpilogue(const Epilogue& e);

/// Parses the text form. On failure returns false with `error` and `column` (0-based offset
/// into `text`). Activation names are not checked here (inferType does, against the known set).
bool parseEpilogue(std::string_view text, Epilogue& out, std::string& error, size_t& column);

/// Checks the structure: child indices before their parents, every node reachable from the
/// result, and the result depending on the accumulator. Returns "" or the first problem.
std::string checkEpilogueStructure(const Epilogue& e);

} // namespace fpat::ir
