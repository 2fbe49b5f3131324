// The cost model's part of a kernel family: its kernel's estimated time, from a calibration's
// measured throughputs, and what it assumed (for --explain).
#pragma once

#include "fpat/cost/Cost.h"
#include "fpat/ir/Family.h"

#include <string>

namespace fpat::cost {

class FamilyCost {
public:
  virtual ~FamilyCost() = default;
  /// Op `v`'s kernel time in milliseconds, launch included.
  virtual double ms(const ir::Graph& g, ir::Vertex v, const Calibration& c) const = 0;
  /// What `ms` assumed about the kernel on sm_`arch`: "wgmma GEMM", "norm in shared memory".
  virtual std::string note(const ir::Graph& g, ir::Vertex v, int arch) const = 0;
};

/// The cost part of family `f` (src/families/<impl>/Cost.cpp).
const FamilyCost& familyCost(ir::Family f);

/// A tensor's bytes in memory.
double tensorBytes(const ir::TensorDesc& t);

} // namespace fpat::cost

namespace fpat::families {
#define FPAT_KERNEL_FAMILY(Id, name, impl) const cost::FamilyCost& impl##Cost(ir::Family id);
#include "fpat/ir/Families.def"
} // namespace fpat::families
