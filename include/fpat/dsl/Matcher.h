// Matcher tables: the byte code every pattern compiles to, and the compiler that builds it.
//
// A pattern becomes a small program run at a candidate root node:
//   CheckKind k / CheckActivation s   the current node is op k (activation fn strings[s])
//   Record                            remember the current node in the next slot
//   MoveChild i / MoveParent          walk to operand i and back
//   CheckSame s                       the current node is the one in slot s (DAG patterns)
//   CheckOneUse                       the current node has no users outside the match
//   CheckDtype s t / CheckDivisible s dim k   predicates on a slot's inferred type
//   CheckConstant f64                 the current node is a constant equal to f64 (raising)
//   CheckRank s r                     the value in slot s has rank r
//   Complete p                        pattern p matched (its slots are laid out in metadata)
// Programs are ordered by benefit (then source order); shared prefixes of adjacent programs are
// factored into Scope nodes, tried in order with backtracking:
//   Scope, {size16, child...}*, 0x0000
#pragma once

#include "fpat/dsl/Library.h"

#include <cstdint>
#include <string>
#include <vector>

namespace fpat::dsl {

/// The size of a Scope's alternative at `at`: 32 bits, little-endian (0 ends the scope).
inline size_t scopeSize(const std::vector<uint8_t>& b, size_t at) {
  return size_t{b[at]} | size_t{b[at + 1]} << 8 | size_t{b[at + 2]} << 16 | size_t{b[at + 3]} << 24;
}

enum MatcherOpcode : uint8_t {
  OPC_Scope = 1,
  OPC_CheckKind,
  OPC_CheckActivation,
  OPC_Record,
  OPC_MoveChild,
  OPC_MoveParent,
  OPC_CheckSame,
  OPC_CheckOneUse,
  OPC_CheckDtype,
  OPC_CheckDivisible,
  OPC_Complete,
  OPC_CheckConstant,
  OPC_CheckRank,
  OPC_CheckHalf,
  OPC_CheckWeight, // the slot's value is the same on every run (ir::isWeightOnly)
  OPC_CheckLayout, // the slot is a gemm reading B as [K, N] (0) or [N, K] (1)
  OPC_CheckPairs,  // the slot is a rope rotating halves (0) or pairs (1, interleaved)
};

/// How close a constant of the graph must be to a pattern's literal: relative 1e-6 (exporters
/// write f32 constants; 0.7978845608 is 0.797884583 in f32).
bool constantMatches(double graphValue, double literal);

const char* opcodeName(uint8_t opc);

/// What a slot of a completed match holds.
struct SlotInfo {
  enum Role : uint8_t { Root, Internal, Input } role;
  std::string binding; // leaf binding, or `(...):$name`; may be empty for op nodes
};

/// Per-pattern metadata shared by every variant of its program.
struct PatternMeta {
  std::string name;
  std::string file;
  int line = 0;
  int benefit = 0;
  std::string family;
  bool singleUse = true;
  std::vector<SlotInfo> slots;
  std::vector<std::string> inputs; // fused op operands, by binding name
  int numVariants = 1;
};

struct MatcherTable {
  std::vector<uint8_t> bytes;
  std::vector<std::string> strings;  // activation names used by CheckActivation
  std::vector<PatternMeta> patterns; // table order (benefit, then source order)
};

/// Orders patterns, builds each program (one per commutative variant), factors prefixes and
/// returns the table. Warnings for unreachable and duplicate patterns go to `diags`.
MatcherTable compileMatcherTable(const PatternLibrary& lib, const SourceManager& sm,
                                 DiagEngine& diags);

/// Warns about each pattern of `later` that can never be selected because a pattern of
/// `earlier` (tried first at equal benefit, as merged tables do) matches all it matches.
void warnShadowedBy(const PatternLibrary& earlier, const PatternLibrary& later, DiagEngine& diags);

/// The table as a C++ `.inc` defining `fpat::dsl::MatcherTable <function>()`, every entry
/// commented with its pattern, .fpat file:line and benefit. Deterministic.
std::string emitMatcherTableInc(const MatcherTable& t, const std::string& source,
                                const std::string& function);

/// Length in bytes of the instruction at `pos` (Scope: 1, its children follow).
size_t instructionLength(const std::vector<uint8_t>& bytes, size_t pos);

/// The linear programs of a table, in table order: the inverse of prefix factoring.
std::vector<std::vector<uint8_t>> flattenPrograms(const MatcherTable& t);

/// Merges two tables into one, re-ordered by benefit (ties: `a` before `b`) and re-factored.
/// Returns false when a pattern name appears in both, naming it in `clash`.
bool mergeMatcherTables(const MatcherTable& a, const MatcherTable& b, MatcherTable& out,
                        std::string& clash);

/// Human-readable listing of the byte code (for --explain and debugging).
std::string disassemble(const MatcherTable& t);

} // namespace fpat::dsl
