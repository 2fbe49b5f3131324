// Kernel families: what a fused op's main computation is. Each family is one implementation of
// KernelFamily (src/ir/families/), registered in kernelFamilies(); type inference and the CPU
// reference ask it for the family's meaning (its main operands, their checks, the accumulators)
// instead of deciding by name. Names are how .fpat (`let family = ...`) and .fgraph
// (`family = ...`) write them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fpat::ir {

struct Op;
struct OperandInfo;
struct Tensor;

enum class Family : uint8_t {
  Gemm,         // C = epilogue(A B), A and B loaded from memory
  NormGemm,     // C = epilogue(norm(A) B), A normalised (layernorm or rmsnorm) on load
  DualGemm,     // C = epilogue(A Bg, A Bu): two GEMMs on one A (gated MLPs), B weights
  NormDualGemm, // C = epilogue(norm(A) Bg, norm(A) Bu), the norm deferred (rmsnorm)
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

/// A kernel family. The traits are what the matcher, cost model and code generators read of it
/// today; the hooks are its meaning, which type inference and the reference delegate to.
class KernelFamily {
public:
  KernelFamily(Family family, const char* name, bool normalisesA, bool hasWgmmaPath, int gemms)
      : family(family), name(name), normalisesA(normalisesA), hasWgmmaPath(hasWgmmaPath),
        gemms(gemms) {}
  KernelFamily(const KernelFamily&) = delete;
  KernelFamily& operator=(const KernelFamily&) = delete;
  virtual ~KernelFamily() = default;

  const Family family;
  const char* const name;
  const bool normalisesA;  // the GEMM's A is (layernorm ...) or (rmsnorm ...) of inputs
  const bool hasWgmmaPath; // the Hopper backend implements it
  const int gemms;         // GEMMs on the one A (2: the epilogue reads acc and acc2)

  /// The operand index of the (first) B; the main operands are 0 .. bIndex + gemms - 1, then
  /// come those the epilogue reads.
  virtual size_t bIndex(const Op& op) const = 0;
  size_t mainOperandCount(const Op& op) const { return bIndex(op) + static_cast<size_t>(gemms); }
  /// Checks a fused op of this family: its attributes, its main operands (`in`: every
  /// operand's type) and what the family needs of its epilogue. Sets the GEMM's M, N, K.
  virtual std::optional<FamilyError> check(const Op& op, const std::vector<OperandInfo>& in,
                                           MainShape& shape) const = 0;
  /// The main computation in double (no intermediate rounding): acc [M, N] and, for two GEMMs,
  /// acc2. `operand(i)` is the op's operand i.
  virtual void accumulate(const Op& op, const std::function<const Tensor&(size_t)>& operand,
                          const MainShape& shape, std::vector<double>& acc,
                          std::vector<double>& acc2) const = 0;
};

/// Every registered family, in Family order.
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
