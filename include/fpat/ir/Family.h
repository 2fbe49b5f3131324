// Kernel families: what a fused op's main computation is. Each family is listed in
// fpat/ir/Families.def and implemented in src/families/<impl>/, one part per phase; this is its
// IR part (its main operands, their checks, the accumulators), which type inference and the CPU
// reference ask instead of deciding by name. The other phases' parts are match::FamilyMatcher,
// dsl::FamilyLegality, codegen::FamilyGenerator and cost::FamilyCost, found the same way.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fpat::ir {

struct Op;
struct OperandInfo;
struct Tensor;

enum class Family : uint8_t {
#define FPAT_KERNEL_FAMILY(Id, name, impl) Id,
#include "fpat/ir/Families.def"
};

/// The GEMM problem of a fused op's main operands.
struct MainShape {
  int64_t m = 0, n = 0, k = 0;
};

/// Why a fused op does not fit its family: the offending operand (-1: the op) and the message.
struct FamilyError {
  int operand = -1;
  std::string message;
};

/// A kernel family's meaning in the IR. Every phase asks its own part of the family (found
/// through the registry by `family`); none reads another family's traits or compares names.
class KernelFamily {
public:
  KernelFamily(Family family, const char* name) : family(family), name(name) {}
  KernelFamily(const KernelFamily&) = delete;
  KernelFamily& operator=(const KernelFamily&) = delete;
  virtual ~KernelFamily() = default;

  const Family family;
  const char* const name;

  /// The operand index of the (first) B; the main operands are 0 .. mainOperandCount - 1, then
  /// come those the epilogue reads.
  virtual size_t bIndex(const Op& op) const = 0;
  virtual size_t mainOperandCount(const Op& op) const = 0;
  /// Checks a fused op of this family: its attributes, its main operands (`in`: every
  /// operand's type) and what the family needs of its epilogue. Sets the GEMM's M, N, K.
  virtual std::optional<FamilyError> check(const Op& op, const std::vector<OperandInfo>& in,
                                           MainShape& shape) const = 0;
  /// The main computation in double (no intermediate rounding): acc [M, N] and, where the
  /// epilogue reads a second accumulator, acc2. `operand(i)` is the op's operand i.
  virtual void accumulate(const Op& op, const std::function<const Tensor&(size_t)>& operand,
                          const MainShape& shape, std::vector<double>& acc,
                          std::vector<double>& acc2) const = 0;
};

/// Every registered family, in Family order (Families.def's).
const std::vector<const KernelFamily*>& kernelFamilies();
/// The family named `name`, or null.
const KernelFamily* findFamily(std::string_view name);
const KernelFamily& kernelFamily(Family f);
inline bool isKernelFamily(std::string_view name) {
  return findFamily(name) != nullptr;
}
/// "gemm, norm_gemm, ... or norm_dual_gemm", for messages.
std::string kernelFamilyList();
/// " (did you mean 'gemm'?)" for a misspelt family name, or "".
std::string familyDidYouMean(std::string_view name);
/// The kernel family that computes `op`: Gemm for a plain gemm, the fused op's family, or null
/// (other ops, or a fused op naming no known family).
const KernelFamily* familyOf(const Op& op);

} // namespace fpat::ir

namespace fpat::families {
// Each implementation's IR part (src/families/<impl>/Ir.cpp), which the registry creates.
#define FPAT_KERNEL_FAMILY(Id, name, impl)                                                         \
  std::unique_ptr<ir::KernelFamily> impl##Ir(ir::Family id, const char* familyName);
#include "fpat/ir/Families.def"
} // namespace fpat::families
