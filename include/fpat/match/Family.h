// The matcher's part of a kernel family: how a match becomes the family's fused op (its main
// operands in kernel order, the values its epilogue reads as accumulators), what only the graph
// can reject, and what a GPU without the family's kernel runs instead.
#pragma once

#include "fpat/dsl/Matcher.h"
#include "fpat/ir/Family.h"
#include "fpat/match/Match.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace fpat::match {

class FamilyMatcher {
public:
  virtual ~FamilyMatcher() = default;
  /// The ops of match `m` whose results the epilogue reads as its accumulators, in order (acc,
  /// then acc2).
  virtual std::vector<ir::Vertex> accumulators(const ir::Graph& g, const Match& m,
                                               const dsl::PatternMeta& meta) const = 0;
  /// The main computation's operands in kernel order; sets what of `fused` they decide (the
  /// norm's kind). Empty: the match is not this family's computation.
  virtual std::vector<ir::Vertex> mainOperands(const ir::Graph& g, const Match& m,
                                               const dsl::PatternMeta& meta,
                                               ir::FusedAttrs& fused) const = 0;
  /// Why the family cannot implement this match, or "": what only the graph shows (sema has
  /// checked the pattern's shape).
  virtual std::string rejects(const ir::Graph& g, const Match& m,
                              const dsl::PatternMeta& meta) const = 0;
  /// Where sm_`arch` has no kernel for fused op `op`: adds ops computing it to `out` (its
  /// operands are `ins`, already there; `fresh` makes unused names) and returns the one that
  /// replaces it. nullopt: the op runs as it is.
  virtual std::optional<ir::Vertex>
  lowerFor(int arch, const ir::Op& op, const std::vector<ir::Vertex>& ins, ir::Graph& out,
           const std::function<std::string(const std::string&)>& fresh) const = 0;
};

/// The matcher part of family `f` (src/families/<impl>/Matcher.cpp).
const FamilyMatcher& familyMatcher(ir::Family f);

} // namespace fpat::match

namespace fpat::families {
#define FPAT_KERNEL_FAMILY(Id, name, impl) const match::FamilyMatcher& impl##Matcher(ir::Family id);
#include "fpat/ir/Families.def"
} // namespace fpat::families
