// The registry of the families' code generator parts, one per line of fpat/ir/Families.def.
#include "fpat/codegen/Family.h"

#include <stdexcept>

namespace fpat::codegen {

const FamilyGenerator& familyGenerator(ir::Family f) {
  switch (f) {
#define FPAT_KERNEL_FAMILY(Id, name, impl)                                                         \
  case ir::Family::Id:                                                                             \
    return families::impl##Generator(f);
#include "fpat/ir/Families.def"
  }
  throw std::logic_error("no code generator part for kernel family " + std::to_string(int(f)));
}

const FamilyGenerator* generatorOf(const ir::Op& op) {
  const ir::KernelFamily* family = ir::familyOf(op);
  return family ? &familyGenerator(family->family) : nullptr;
}

} // namespace fpat::codegen
