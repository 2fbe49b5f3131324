// The registry of the families' cost parts, one per line of fpat/ir/Families.def.
#include "fpat/cost/Family.h"

#include <stdexcept>

namespace fpat::cost {

const FamilyCost& familyCost(ir::Family f) {
  switch (f) {
#define FPAT_KERNEL_FAMILY(Id, name, impl)                                                         \
  case ir::Family::Id:                                                                             \
    return families::impl##Cost(f);
#include "fpat/ir/Families.def"
  }
  throw std::logic_error("no cost part for kernel family " + std::to_string(int(f)));
}

double tensorBytes(const ir::TensorDesc& t) {
  return static_cast<double>(t.numel()) * static_cast<double>(ir::dtypeSize(t.dtype));
}

} // namespace fpat::cost
