// The code generator's part of a kernel family: its kernel for a fused op, and what the tuner
// needs to search its configurations (a key that says what the kernel computes, and the
// problem its tile configurations are scored on).
#pragma once

#include "fpat/codegen/Codegen.h"
#include "fpat/ir/Family.h"

#include <optional>
#include <string>

namespace fpat::codegen {

/// What the tuner keys and searches an op's kernel by.
struct TuningProblem {
  /// What the kernel computes, apart from its sizes (family, pattern, epilogue, layouts):
  /// two ops with equal signatures and problems share a tuned configuration.
  std::string signature;
  int64_t m = 0, n = 0, k = 0; // the key's sizes: the result's rows and columns, the depth
  GemmProblem problem;         // what the search space and the heuristic are scored on
};

class FamilyGenerator {
public:
  virtual ~FamilyGenerator() = default;
  /// The CUDA translation unit computing op `v` (`o.tile`: a configuration to use instead of
  /// the heuristic's).
  virtual KernelUnit generate(const ir::Graph& g, ir::Vertex v, dsl::Activations defs,
                              const CodegenOptions& o) const = 0;
  /// What the tuner searches for op `v`; nullopt: the kernel has no configurations.
  virtual std::optional<TuningProblem> tuning(const ir::Graph& g, ir::Vertex v) const = 0;
};

/// The code generator part of family `f` (src/families/<impl>/Generator.cpp).
const FamilyGenerator& familyGenerator(ir::Family f);
/// The generator for op `v`'s kernel family, or null (ops no family computes: row-wise and
/// elementwise kernels, inputs).
const FamilyGenerator* generatorOf(const ir::Op& op);

} // namespace fpat::codegen

namespace fpat::families {
#define FPAT_KERNEL_FAMILY(Id, name, impl)                                                         \
  const codegen::FamilyGenerator& impl##Generator(ir::Family id);
#include "fpat/ir/Families.def"
} // namespace fpat::families
