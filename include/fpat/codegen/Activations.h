// The activation bodies of .fpat files lowered to CUDA device functions, for the generated
// kernels and for fpat-tblgen --gen-epilogues.
#pragma once

#include "fpat/dsl/Library.h"

#include <string>
#include <vector>

namespace fpat::codegen {

/// One activation as a CUDA device function `fpat_act_<name>(float x[, float p_<param>...])`,
/// templated on kFma (the pipe of its exp and divisions, fpat_common.cuh).
std::string emitActivationFunction(const dsl::ActivationDef& a);
/// Every activation as such a function: a header generated from `source`.
std::string emitEpilogueFunctions(const std::vector<dsl::ActivationDef>& activations,
                                  const std::string& source);

} // namespace fpat::codegen
