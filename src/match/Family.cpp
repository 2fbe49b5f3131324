// The registry of the families' matcher parts, one per line of fpat/ir/Families.def.
#include "fpat/match/Family.h"

#include <stdexcept>

namespace fpat::match {

const FamilyMatcher& familyMatcher(ir::Family f) {
  switch (f) {
#define FPAT_KERNEL_FAMILY(Id, name, impl)                                                         \
  case ir::Family::Id:                                                                             \
    return families::impl##Matcher(f);
#include "fpat/ir/Families.def"
  }
  throw std::logic_error("no matcher part for kernel family " + std::to_string(int(f)));
}

} // namespace fpat::match
