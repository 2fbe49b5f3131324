// The registry of the families' legality parts, one per line of fpat/ir/Families.def.
#include "fpat/dsl/Family.h"

#include <stdexcept>

namespace fpat::dsl {

std::string matchText(const MatchNode& n) {
  if (n.leaf)
    return "$" + n.binding;
  std::string s = "(" + (n.kind == ir::OpKind::Activation ? n.fn : ir::opKindName(n.kind));
  for (size_t i = 0; i < n.operands.size(); ++i)
    s += (i ? ", " : " ") + matchText(n.operands[i]);
  return s + ")";
}

const FamilyLegality& familyLegality(ir::Family f) {
  switch (f) {
#define FPAT_KERNEL_FAMILY(Id, name, impl)                                                         \
  case ir::Family::Id:                                                                             \
    return families::impl##Legality(f);
#include "fpat/ir/Families.def"
  }
  throw std::logic_error("no legality part for kernel family " + std::to_string(int(f)));
}

} // namespace fpat::dsl
