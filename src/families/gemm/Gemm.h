// What the four GEMM families are, for every phase's part of them (src/families/gemm/): one
// implementation parameterized by these, so gemm, norm_gemm, dual_gemm and norm_dual_gemm share
// their code. Private to this folder: other phases ask the registries, not these.
#pragma once

#include "fpat/ir/Family.h"
#include "fpat/ir/Graph.h"

#include <optional>
#include <stdexcept>

namespace fpat::families::gemm {

struct Kind {
  bool normalisesA = false;  // the GEMM's A is (layernorm ...) or (rmsnorm ...) of inputs
  int gemms = 1;             // GEMMs on the one A (2: the epilogue reads acc and acc2)
  bool hasWgmmaPath = false; // the Hopper backend implements it (norm_gemm: only deferred)
};

inline Kind kindOf(ir::Family f) {
  switch (f) {
  case ir::Family::Gemm:
    return {false, 1, true};
  case ir::Family::NormGemm:
    return {true, 1, false};
  case ir::Family::DualGemm:
    return {false, 2, true};
  case ir::Family::NormDualGemm:
    return {true, 2, true};
  default:
    throw std::logic_error("family " + std::string(ir::kernelFamily(f).name) +
                           " is not one of the GEMM families");
  }
}

/// The kind of a GEMM-family op (a plain gemm or a fused op of these families), or null for any
/// other op.
inline std::optional<Kind> kindOf(const ir::Op& op) {
  const ir::KernelFamily* f = ir::familyOf(op);
  if (!f)
    return std::nullopt;
  return kindOf(f->family);
}

/// The one instance of a phase part (`Part(ir::Family)`) for each GEMM family.
template <class Part> const Part& partFor(ir::Family id) {
  static const Part plain(ir::Family::Gemm), norm(ir::Family::NormGemm), dual(ir::Family::DualGemm),
      normDual(ir::Family::NormDualGemm);
  switch (id) {
  case ir::Family::Gemm:
    return plain;
  case ir::Family::NormGemm:
    return norm;
  case ir::Family::DualGemm:
    return dual;
  case ir::Family::NormDualGemm:
    return normDual;
  default:
    kindOf(id); // throws: not a GEMM family
    return plain;
  }
}

} // namespace fpat::families::gemm
