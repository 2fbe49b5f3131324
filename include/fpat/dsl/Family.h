// The pattern language's part of a kernel family: which patterns its kernel can implement. Sema
// asks it for every pattern naming the family (`let family = ...`); a pattern whose match the
// kernel would compute only in part is a located error, never a kernel that silently computes
// less.
#pragma once

#include "fpat/dsl/Library.h"
#include "fpat/ir/Family.h"

#include <string>

namespace fpat::dsl {

/// What sema lends a family's legality check: its errors and notes, located in the .fpat file.
class PatternChecker {
public:
  virtual ~PatternChecker() = default;
  virtual void error(SourceLoc at, const std::string& message) = 0;
  virtual void note(SourceLoc at, const std::string& message) = 0;
};

/// A match node as written: "$x" or "(gemm (rmsnorm $x, $g), $w)".
std::string matchText(const MatchNode& n);

class FamilyLegality {
public:
  virtual ~FamilyLegality() = default;
  /// Whether the family's kernel computes all that `p`'s match computes; where not, reports
  /// why (and what would) to `check` and returns false.
  virtual bool canImplement(const PatternDef& p, PatternChecker& check) const = 0;
};

/// The legality part of family `f` (src/families/<impl>/Legality.cpp).
const FamilyLegality& familyLegality(ir::Family f);

} // namespace fpat::dsl

namespace fpat::families {
#define FPAT_KERNEL_FAMILY(Id, name, impl) const dsl::FamilyLegality& impl##Legality(ir::Family id);
#include "fpat/ir/Families.def"
} // namespace fpat::families
